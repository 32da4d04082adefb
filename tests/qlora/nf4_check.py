"""qlora.nf4 — the engine's NF4 quantiser against bitsandbytes' algorithm.

1. The code books: kernels/nf4_tables.h (via nf4_tool) bit-identical to the
   numpy reference (nf4_ref.py, which recomputes the dynamic map) and to
   bitsandbytes' own get_4bit_type / create_dynamic_map.
2. Random tensors (odd counts, partial blocks, more than 256 blocks, tiny
   and huge scales, an all-zero block, values exactly on midpoints):
   codes, absmax, and with double quantisation qabsmax, absmax2 and offset
   byte-identical to the reference; dequantised values (fp32 and bf16)
   bit-identical to the reference's dequant.
3. bitsandbytes itself (on the CPU): quantize_4bit without double quant
   gives byte-identical codes and absmax; with it, the same 4-bit codes, an
   offset within 1 ulp (torch.mean sums in fp32), and 8-bit absmax codes
   identical except where bitsandbytes' x86 binary search picked a code
   that is not the nearest (each such case is checked: ours is strictly
   nearer); dequantize_4bit of bitsandbytes' own quantisation equals the
   reference dequantisation given bitsandbytes' state.
Usage: nf4_check.py NF4_TOOL WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref as R  # noqa: E402

tool, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
fails = 0


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails += 1


def run(*args):
    subprocess.run([tool, *map(str, args)], check=True)


def rd(path, dt):
    return np.fromfile(path, dtype=dt)


# 1. code books
run("tables", f"{work}/t")
c_nf4, c_dyn = rd(f"{work}/t.nf4", np.float32), rd(f"{work}/t.dyn8", np.float32)
check(np.array_equal(c_nf4.view(np.uint32), R.NF4.view(np.uint32)), "NF4 levels == reference")
check(np.array_equal(c_dyn.view(np.uint32), R.dynamic_map().view(np.uint32)), "dynamic 8-bit map == reference")

# 2. random tensors against the reference
rng = np.random.default_rng(13)
cases = []
for n in [64, 1, 63, 65, 127, 4096, 64 * 300 + 17, 64 * 256 * 2 + 64 * 5]:
    cases.append((f"normal n={n}", (rng.standard_normal(n) * 0.02).astype(np.float32)))
cases.append(("scales", (rng.standard_normal(64 * 40) * np.repeat(10.0 ** rng.uniform(-30, 30, 40), 64)).astype(np.float32)))
z = rng.standard_normal(64 * 6).astype(np.float32)
z[64:128] = 0
cases.append(("zero block", z))
mid = ((R.NF4[:-1] + R.NF4[1:]) / np.float32(2)).astype(np.float32)
tie = np.concatenate([np.array([1.0], np.float32), mid, -mid, np.zeros(64 - 31, np.float32)])
cases.append(("midpoint ties", np.tile(tie, 3).astype(np.float32)))

for name, x in cases:
    path = f"{work}/x.f32"
    x.tofile(path)
    for dq in (0, 1):
        run("quant", path, dq, f"{work}/q")
        ref = R.quantize_nf4(x, bool(dq))
        tag = f"{name} dq={dq}"
        check(np.array_equal(rd(f"{work}/q.codes", np.uint8), ref["codes"]), f"{tag}: codes")
        check(np.array_equal(rd(f"{work}/q.absmax", np.float32).view(np.uint32), ref["absmax"].view(np.uint32)),
              f"{tag}: absmax")
        if dq:
            check(np.array_equal(rd(f"{work}/q.qabsmax", np.uint8), ref["qabsmax"]), f"{tag}: qabsmax")
            check(np.array_equal(rd(f"{work}/q.absmax2", np.float32).view(np.uint32),
                                 ref["absmax2"].view(np.uint32)), f"{tag}: absmax2")
            check(rd(f"{work}/q.offset", np.float32)[0].view(np.uint32) == np.float32(ref["offset"]).view(np.uint32),
                  f"{tag}: offset")
        want = R.dequantize_nf4(ref, x.size)
        run("dequant", path, dq, "fp32", f"{work}/d")
        check(np.array_equal(rd(f"{work}/d", np.float32).view(np.uint32), want.view(np.uint32)),
              f"{tag}: kn_nf4_dequant fp32")
        run("dequant", path, dq, "bf16", f"{work}/d")
        got = (rd(f"{work}/d", np.uint16).astype(np.uint32) << 16).view(np.float32)
        check(np.array_equal(got.view(np.uint32), R.to_bf16_f32(want).view(np.uint32)),
              f"{tag}: kn_nf4_dequant bf16")

# 3. bitsandbytes itself
try:
    import torch
    import bitsandbytes.functional as F
except Exception as e:  # noqa: BLE001
    print(f"bitsandbytes unavailable here ({e}); the reference checks above stand alone")
    torch = None
if torch is not None:
    check(np.array_equal(F.get_4bit_type("nf4", device="cpu").numpy().view(np.uint32), R.NF4.view(np.uint32)),
          "bitsandbytes NF4 levels == reference")
    check(np.array_equal(F.create_dynamic_map(signed=True).numpy().view(np.uint32),
                         R.dynamic_map().view(np.uint32)), "bitsandbytes dynamic map == reference")
    off_by_search = total8 = 0
    for name, x in cases:
        if x.size < 2:
            continue  # bitsandbytes wants at least a pair
        path = f"{work}/x.f32"
        x.tofile(path)
        t = torch.from_numpy(x.copy())
        qb, st = F.quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=False)
        run("quant", path, 0, f"{work}/q")
        check(np.array_equal(qb.numpy().reshape(-1), rd(f"{work}/q.codes", np.uint8)), f"bnb {name}: codes")
        check(np.array_equal(st.absmax.numpy().view(np.uint32), rd(f"{work}/q.absmax", np.uint32)),
              f"bnb {name}: absmax")
        qb2, st2 = F.quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=True)
        run("quant", path, 1, f"{work}/q")
        check(np.array_equal(qb2.numpy().reshape(-1), rd(f"{work}/q.codes", np.uint8)), f"bnb {name} dq: codes")
        ours_off = rd(f"{work}/q.offset", np.float32)[0]
        bnb_off = np.float32(st2.offset.item())
        ulps = abs(int(ours_off.view(np.int32)) - int(bnb_off.view(np.int32)))
        check(ulps <= 1, f"bnb {name} dq: offset {ours_off!r} vs {bnb_off!r} ({ulps} ulp)")
        ref = R.quantize_nf4(x, True, offset=bnb_off)
        b8 = st2.absmax.numpy()
        # A 256-block whose absmax values all equal the offset (a tensor of
        # one block) is 0/0 in bitsandbytes' library, (0 / 1e-38) here:
        # both dequantise to the offset itself, so only there it may differ.
        d = (R.quantize_nf4(x, False)["absmax"] - bnb_off).astype(np.float32)
        zero = np.array([not np.any(d[i:i + 256]) for i in range(0, d.size, 256)])
        a2 = st2.state2.absmax.numpy()
        check(np.array_equal(a2[~zero].view(np.uint32), ref["absmax2"][~zero].view(np.uint32)),
              f"bnb {name} dq: absmax2 (with bnb's offset; {zero.sum()} all-equal block(s) aside)")
        diff = np.nonzero(b8 != ref["qabsmax"])[0]
        dm = R.dynamic_map()
        s = (d / np.repeat(ref["absmax2"], 256)[: b8.size]).astype(np.float32)
        total8 += b8.size
        diff = np.array([i for i in diff if not zero[i // 256]], dtype=np.int64)
        off_by_search += diff.size
        nearer = all(abs(s[i] - dm[ref["qabsmax"][i]]) <= abs(s[i] - dm[b8[i]]) for i in diff)
        check(nearer, f"bnb {name} dq: qabsmax identical but {diff.size}/{b8.size}, where ours is nearer")
        # bitsandbytes' dequantisation of its own state == the reference formula
        deq = F.dequantize_4bit(qb2, st2).numpy().reshape(-1)
        bref = {"codes": qb2.numpy().reshape(-1), "qabsmax": b8, "absmax2": st2.state2.absmax.numpy(),
                "offset": bnb_off}
        check(np.array_equal(deq.view(np.uint32), R.dequantize_nf4(bref, x.size).view(np.uint32)),
              f"bnb {name} dq: dequantize_4bit == reference dequant")
    print(f"bitsandbytes' CPU 8-bit search differed from nearest on {off_by_search} of {total8} absmax codes")

print(f"{fails} failure(s)")
sys.exit(1 if fails else 0)
