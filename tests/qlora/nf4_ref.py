"""nf4_ref.py — bitsandbytes' NF4 quantisation written out in numpy.

An independent statement of the algorithm (bitsandbytes' quantize_4bit with
blocksize 64, quant_type "nf4", and compress_statistics), step by step in
float32 as torch computes it, for nf4_check.py to hold the engine's C
quantiser (engine/nf4.c) and the kernels' dequantiser against. Also the
tests' QLoRA reference (qlora_check.py) uses dequant(quant(w)).
"""
import numpy as np

f32 = np.float32

# The 16 NormalFloat levels, as bitsandbytes publishes them (get_4bit_type).
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float64).astype(f32)


def linspace_f32(start, end, steps):
    """torch.linspace in float32: a float32 step, then start + step * i from
    the front and end - step * (steps - 1 - i) from the back, each a fused
    multiply-add (one rounding; step * i is exact in float64)."""
    start, end = f32(start), f32(end)
    step = f32((end - start) / f32(steps - 1))
    out = np.empty(steps, f32)
    half = steps // 2
    for i in range(steps):
        if i < half:
            out[i] = f32(np.float64(start) + np.float64(step) * i)
        else:
            out[i] = f32(np.float64(end) - np.float64(step) * (steps - i - 1))
    return out


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), sorted."""
    data = []
    for i in range(7):
        items = 2 ** i + 1
        b = linspace_f32(0.1, 1.0, items)
        means = ((b[:-1] + b[1:]) / f32(2)).astype(f32)
        scale = f32(10.0 ** (-6 + i))
        data += list((scale * means).astype(f32))
        data += list((-scale * means).astype(f32))
    data += [f32(0), f32(1)]
    return np.sort(np.array(data, dtype=f32))


def _mid(code):
    return ((code[:-1] + code[1:]) / f32(2)).astype(f32)


def quantize_blocks(x, bs, code):
    """Blockwise absmax quantisation to the nearest code (torch.bucketize on
    the midpoints: a tie takes the lower code). Returns (codes, absmax)."""
    x = np.asarray(x, f32)
    n = x.size
    full = n - n % bs
    mid = _mid(code)
    out = np.empty(n, np.uint8)
    am = []
    if full:
        blk = x[:full].reshape(-1, bs)
        a = np.abs(blk).max(axis=1).astype(f32)
        inv = (f32(1.0) / np.maximum(a, f32(1e-38))).astype(f32)
        s = np.clip((blk * inv[:, None]).astype(f32), f32(-1), f32(1)).reshape(-1)
        out[:full] = np.searchsorted(mid, s, side="left")
        am += list(a)
    if n % bs:
        a = max(f32(np.abs(x[full:]).max()), f32(1e-38))
        s = np.clip((x[full:] / a).astype(f32), f32(-1), f32(1))
        out[full:] = np.searchsorted(mid, s, side="left")
        am.append(a)
    return out, np.array(am, dtype=f32)


def quantize_nf4(x, double_quant, offset=None):
    """Returns dict(codes, absmax[, qabsmax, absmax2, offset]); `offset`
    replaces the computed mean (to compare with another implementation's)."""
    x = np.asarray(x, f32).reshape(-1)
    q, am = quantize_blocks(x, 64, NF4)
    if q.size % 2:
        q = np.concatenate([q, np.searchsorted(_mid(NF4), np.zeros(1, f32), side="left").astype(np.uint8)])
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    r = {"codes": packed, "absmax": am}
    if double_quant:
        off = f32(np.mean(am.astype(np.float64))) if offset is None else f32(offset)
        qa, am2 = quantize_blocks((am - off).astype(f32), 256, dynamic_map())
        r.update(qabsmax=qa, absmax2=am2, offset=off)
    return r


def absmax_of(r):
    if "qabsmax" not in r:
        return r["absmax"]
    dm = dynamic_map()
    a = (dm[r["qabsmax"]] * np.repeat(r["absmax2"], 256)[: r["qabsmax"].size]).astype(f32)
    return (a + r["offset"]).astype(f32)


def dequantize_nf4(r, n):
    """fp32 values: NF4[code] * absmax, every product rounded to float32."""
    codes = np.empty(r["codes"].size * 2, np.uint8)
    codes[0::2] = r["codes"] >> 4
    codes[1::2] = r["codes"] & 15
    a = np.repeat(absmax_of(r), 64)[:n]
    return (NF4[codes[:n]] * a).astype(f32)


def to_bf16_f32(x):
    """float32 -> bfloat16 (round to nearest even) -> float32."""
    u = np.asarray(x, f32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(f32)
