#!/usr/bin/env python3
# counts.py — the counted training step that model.py turns into a
# modelled GPU time, made here on the emulated CUDA backend.
#
#   counts.py ENGINE_EMU [--shapes gpt2-124M,llama-1B] [--out profile.json]
#              [--keep DIR]
#   (--out: an existing file keeps the shapes not run; --keep: each run's
#   counts are kept in DIR and reused by a later call)
#
# ENGINE_EMU is trainyard-engine-emu. Full shapes are far too slow (and
# too large) to emulate, so each shape of bench.py's SHAPES runs with the
# same per-token sizes (width, heads, MLP) at a few reduced batch sizes B,
# lengths T, layer counts L and, for Llama, vocabularies V, one bf16 step
# each with TY_EMU_COUNT on. The step is what a 2-step run launches more
# than a 1-step run (both end the same way), so set-up and teardown drop
# out. Every quantity of every launch (FLOPs per path, declared bytes
# read and written) is then fitted exactly, as a polynomial in the shape:
#   q = a + b BT + c BT^2 + d V + e V BT      (runs at L = 1)
# BT^2 is attention's causal T(T+1)/2 pairs per sequence; V BT the output
# head and the loss; V alone the embedding's gradient and optimizer state.
# Five runs give the five coefficients (three for GPT-2, whose vocabulary
# is emulated whole: no d, e). GEMM FLOPs (2 m n k, one of m, n, k being BT
# or V) and every elementwise byte count are such polynomials, so the fit
# is exact for them; a count with a ceiling in it (the two-stage column
# sums' partial buffers, ceil(BT / rows a block) of them) is
# approximate. One more run at a larger B and T than any fitted is
# predicted and compared, and the worst relative error is stored.
# Layers: a run at L = 2 is aligned launch by launch with the L = 1 run
# (difflib on names and counts, then on names where only counts differ):
# the launches it adds are one more layer's, each a copy of one at L = 1
# (the same name and counts) whose fit it takes; launches present in both
# whose counts differ (a launch over every parameter, a gradient norm)
# grow by that difference per layer.
# Standard library only.
import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (SHAPES, the data files, the flops formula)

QUANT = ("tc16", "tf32", "simt", "mma", "read", "write")
# T = 64, 128 and the check's 192: whole multiples of the flash kernels'
# tiles (16 query rows a warp, 32 keys a tile at head dim 64, pairs of
# warps per tile), so the tiles a causal walk visits, and so its counted
# warp-matrix FLOPs, are an exact quadratic in T; and no GEMM dimension of
# either model equals a BT used (64, 128, 384), so names can say "BT".
BASE_T = 64
V_RUNS = (1000, 2000)  # the emulated vocabularies where V is fitted


def layer_key(s):
    return "n_layer" if "n_layer" in s else "num_hidden_layers"


def run_spec(s, B, T, L, V, steps):
    cfg = {k: v for k, v in s.items() if k not in ("T", "batches", "steps")}
    cfg[layer_key(s)] = L
    if V:
        cfg["vocab_size"] = V
    return cfg


def count_run(engine, tmp, s, B, T, L, V, steps):
    """The launch records of one emulated run and its parameter count."""
    cfg = run_spec(s, B, T, L, V, steps)
    vocab = cfg["vocab_size"]
    tag = f"b{B}-t{T}-l{L}-v{vocab}-s{steps}"
    spec = {"model": {"init": cfg},
            "dataset": {"train": bench.write_data(tmp, vocab, T, B * (steps + 1)), "format": "tokens"},
            "hyperparameters": {"max_steps": steps, "batch_size": B, "seq_len": T, "lr": 1e-4,
                                "log_every_steps": 1},
            "precision": "bf16", "resources": {"gpus": 1, "backend": "cuda"},
            "checkpoint": {"every_steps": 0}}
    counts = os.path.join(tmp, f"{tag}.jsonl")
    if os.path.exists(counts + ".params"):  # a kept run (--keep)
        with open(counts) as f, open(counts + ".params") as g:
            return [json.loads(line) for line in f], int(g.read())
    sp = os.path.join(tmp, f"{tag}.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, TY_KERNELS="cuda-emu", TY_EMU_COUNT=counts, OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    env.pop("TY_EMU_COUNT_MEM", None)
    wd = os.path.join(tmp, "w-" + tag)
    p = subprocess.run([engine, "--spec", sp, "--workdir", wd],
                       capture_output=True, text=True, env=env, timeout=1800)
    shutil.rmtree(wd, ignore_errors=True)  # its final checkpoint: up to GBs a Llama-width run
    events = bench.read_events(p.stdout)
    started = [e for e in events if e.get("ev") == "started"]
    if p.returncode != 0 or not started:
        err = [e for e in events if e.get("ev") == "error"]
        raise SystemExit(f"counts.py: {tag}: the engine failed: "
                         f"{err[0]['message'] if err else p.stderr.strip()[-400:]}")
    with open(counts) as f:
        recs = [json.loads(line) for line in f]
    with open(counts + ".params", "w") as f:
        f.write(str(started[0]["params"]))
    return recs, started[0]["params"]


def key(r):
    d = r["decl"] or {}
    return (r["name"], tuple(r["grid"]), tuple(r["block"]), d.get("read"), d.get("write"),
            tuple(sorted(r["flops"].items())))


def one_step(r1, r2):
    """The launches a 2-step run makes more than a 1-step run: the step.
    Both runs are S A1 [A2] E: after their common prefix (S A1, and any
    part of A2 that E repeats: then a rotation of A2, the same launches)."""
    k1, k2 = [key(r) for r in r1], [key(r) for r in r2]
    n = len(r2) - len(r1)
    if n <= 0:
        raise SystemExit("counts.py: a 2-step run launched no more than a 1-step run")
    p = 0
    while p < len(k1) and k1[p] == k2[p]:
        p += 1
    if k2[p + n:] != k1[p:]:
        raise SystemExit("counts.py: the 2-step run is not the 1-step run with a step inserted")
    return r2[p:p + n]


def quantities(r):
    d = r["decl"]
    return [r["flops"][q] for q in QUANT[:4]] + ([d["read"], d["write"]] if d else [0, 0])


def solve(rows, rhs):
    """Exact Gaussian elimination over the rationals."""
    n = len(rows)
    m = [[Fraction(x) for x in row] + [Fraction(y)] for row, y in zip(rows, rhs)]
    for c in range(n):
        piv = next(i for i in range(c, n) if m[i][c] != 0)
        m[c], m[piv] = m[piv], m[c]
        for i in range(n):
            if i != c and m[i][c] != 0:
                f = m[i][c] / m[c][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def basis(B, T, V, with_v):
    x, y = B * T, B * T * T
    return [1, x, y, V, V * x] if with_v else [1, x, y]


def fit(runs, with_v):
    """Per launch position and quantity, the polynomial's coefficients."""
    (shape0, recs0) = runs[0]

    def names(shape, recs):
        return [generic_name(r["name"], shape[0], shape[1], shape[2]) for r in recs]

    for shape, recs in runs[1:]:
        if names(shape, recs) != names(shape0, recs0):
            raise SystemExit(f"counts.py: the step at {shape} launches other kernels than at {shape0}")
    rows = [basis(*shape, with_v) for shape, _ in runs]
    coefs = []
    for i in range(len(recs0)):
        qs = [quantities(recs[i]) for _, recs in runs]
        coefs.append([solve(rows, [q[j] for q in qs]) for j in range(len(QUANT))])
    return coefs


def evaluate(c, B, T, V, with_v):
    b = basis(B, T, V, with_v)
    return [float(sum(ci * bi for ci, bi in zip(cq, b))) for cq in c]


def generic_name(name, B, T, V):
    """cuBLASLt names carry the matmul's dims: the token count and the
    vocabulary of the emulated run become BT and V."""
    if not name.startswith("cublasLtMatmul"):
        return name
    out = []
    for tok in name.split(" "):
        if "x" in tok and all(p.isdigit() for p in tok.split("x")):
            tok = "x".join("BT" if int(p) == B * T else "V" if V and int(p) == V else p
                           for p in tok.split("x"))
        out.append(tok)
    return " ".join(out)


def join_head_tiles(recs, V):
    """The loss head's GEMMs run as a bulk of whole 128-row vocabulary tiles
    plus the tail (cuda_loss.cu, head_bulk), so an emulated vocabulary that
    is not a multiple of 128 launches two GEMMs where the full one (128 256
    for the Llama shape) launches one. Each such pair (the same name but
    for the vocabulary dimension, the bulk then the tail) becomes one
    launch of the whole vocabulary, its counts summed: what V is fitted
    over."""
    bulk, tail = V // 128 * 128, V % 128
    if not tail or V <= 128:
        return recs
    out, i = [], 0
    while i < len(recs):
        a = recs[i]
        b = recs[i + 1] if i + 1 < len(recs) else None
        ta, tb = a["name"].split(" "), b["name"].split(" ") if b else []
        if b and a["name"].startswith("cublasLtMatmul") and len(ta) == len(tb):
            joined = []
            for x, y in zip(ta, tb):
                px, py = x.split("x"), y.split("x")
                if x != y and len(px) == len(py) and all(p.isdigit() for p in px + py):
                    dims = [str(V) if (p, q) == (str(bulk), str(tail)) else p if p == q else None
                            for p, q in zip(px, py)]
                    joined.append(None if None in dims else "x".join(dims))
                else:
                    joined.append(x if x == y else None)
            if None not in joined and joined != ta:
                m = dict(a, name=" ".join(joined),
                         flops={k: a["flops"][k] + b["flops"][k] for k in a["flops"]})
                if a["decl"] and b["decl"]:
                    m["decl"] = {k: a["decl"][k] + b["decl"][k] for k in a["decl"]}
                out.append(m)
                i += 2
                continue
        out.append(a)
        i += 1
    return out


def align_layer(name, base, two):
    """The L = 2 step launch by launch against the L = 1 step: (index in
    base, 1, per-layer growth) for a launch both make, (index, 0, None)
    for one the second layer adds, a copy of base's launch with the same
    name and counts. Aligned on name and counts first, so that launches
    sharing a name (one optimizer launch per tensor) pair with their own
    tensor's; what differs in counts only (a launch over every parameter)
    is then aligned on names and grows by the difference."""
    keys = [[(r["name"], tuple(quantities(r))) for r in rs] for rs in (base, two)]
    out = []

    def copy(j):
        q = quantities(two[j])
        same = [i for i, r in enumerate(base) if r["name"] == two[j]["name"] and quantities(r) == q]
        if not same:
            raise SystemExit(f"counts.py: {name}: the second layer's {two[j]['name']} matches "
                             "no launch of the first")
        out.append((same[0], 0, None))

    def grow(i, j):
        out.append((i, 1, [b - a for a, b in zip(quantities(base[i]), quantities(two[j]))]))

    sm = difflib.SequenceMatcher(None, keys[0], keys[1], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                grow(i, j)
        elif tag == "insert":
            for j in range(j1, j2):
                copy(j)
        elif tag == "replace":
            sub = difflib.SequenceMatcher(None, [k[0] for k in keys[0][i1:i2]],
                                          [k[0] for k in keys[1][j1:j2]], autojunk=False)
            for t, a1, a2, b1, b2 in sub.get_opcodes():
                if t == "equal":
                    for i, j in zip(range(i1 + a1, i1 + a2), range(j1 + b1, j1 + b2)):
                        grow(i, j)
                elif t == "insert":
                    for j in range(j1 + b1, j1 + b2):
                        copy(j)
                else:
                    raise SystemExit(f"counts.py: {name}: L = 2 is not L = 1 plus launches "
                                     f"({t} at {i1 + a1})")
        else:
            raise SystemExit(f"counts.py: {name}: L = 2 is not L = 1 plus launches ({tag} at {i1})")
    return out


def profile_shape(engine, tmp, name, s, log):
    with_v = s["model_type"] == "llama"
    vs = V_RUNS if with_v else (None,)
    V0 = vs[0] or s["vocab_size"]
    shapes = [(1, BASE_T, vs[0]), (2, BASE_T, vs[0]), (1, 2 * BASE_T, vs[0])]
    if with_v:
        shapes += [(1, BASE_T, vs[1]), (2, BASE_T, vs[1])]
    runs, params = [], {}

    def step(B, T, L, V):
        log(f"  {name}: B {B} T {T} L {L} V {V or s['vocab_size']}")
        r1, p = count_run(engine, tmp, s, B, T, L, V, 1)
        r2, _ = count_run(engine, tmp, s, B, T, L, V, 2)
        params[(L, V or s["vocab_size"])] = p
        recs = one_step(r1, r2)
        return join_head_tiles(recs, V) if with_v else recs

    for B, T, V in shapes:
        runs.append(((B, T, V or s["vocab_size"]), step(B, T, 1, V)))
    coefs = fit(runs, with_v)
    # the check: a larger B and T than any fitted, predicted from the fit
    Bc, Tc = 2, 3 * BASE_T
    check = step(Bc, Tc, 1, vs[0])
    if [generic_name(r["name"], Bc, Tc, V0) for r in check] != \
            [generic_name(r["name"], 1, BASE_T, V0) for r in runs[0][1]]:
        raise SystemExit(f"counts.py: {name}: the step at B {Bc} T {Tc} launches other kernels")
    # per launch and quantity the worst relative error, and the whole
    # step's FLOPs and bytes (the per-launch worst is a ceiling's count of
    # partial sums, kilobytes; the step's totals are what the model prices)
    worst, worst_at = 0.0, None
    tot = {"flops": [0, 0], "bytes": [0, 0]}
    for c, r in zip(coefs, check):
        for q, want, got in zip(QUANT, quantities(r), evaluate(c, Bc, Tc, V0, with_v)):
            t = tot["bytes" if q in ("read", "write") else "flops"]
            t[0], t[1] = t[0] + want, t[1] + got
            if (want or got) and abs(got - want) / max(abs(want), 1) > worst:
                worst, worst_at = abs(got - want) / max(abs(want), 1), f"{r['name']} {q}"
    step_err = {k: float(abs(g - w) / max(w, 1)) for k, (w, g) in tot.items()}
    # one more layer
    base = runs[0][1]
    two = step(1, BASE_T, 2, vs[0])
    entries = align_layer(name, base, two)
    launches = {}
    for i, base_count, slope in entries:
        c = [[float(x) for x in cq] for cq in coefs[i]]
        k = json.dumps([generic_name(base[i]["name"], 1, BASE_T, V0), c, base_count, slope])
        if k in launches:
            launches[k]["n"] += 1
        else:
            launches[k] = {"name": generic_name(base[i]["name"], 1, BASE_T, V0), "coef": c,
                           "fixed": base_count, "per_layer_slope": slope, "n": 1}
    p1, p2 = params[(1, V0)], params[(2, V0)]
    pv = (params[(1, vs[1])] - p1) / (vs[1] - vs[0]) if with_v else 0
    return {"config": {k: v for k, v in s.items() if k not in ("batches", "steps")},
            "fit_vocab": with_v, "counted_at": {"B": [1, 2], "T": [BASE_T, 2 * BASE_T], "L": [1, 2],
                                                "V": [v or s["vocab_size"] for v in vs]},
            "check": {"B": Bc, "T": Tc, "worst_relative_error": worst, "worst_at": worst_at,
                      "step_flops_error": step_err["flops"], "step_bytes_error": step_err["bytes"]},
            "params": {"at_L1_V0": p1, "V0": V0, "per_V": pv, "per_layer": p2 - p1},
            "launches": list(launches.values())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--shapes", default="gpt2-124M,llama-1B")
    ap.add_argument("--keep", help="keep each run's counts in this folder, and reuse them")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "profile.json"))
    a = ap.parse_args()
    doc = {"about": "counted bf16 training step on cuda-emu, fitted per launch (bench/engine-gpu/"
                    "counts.py); model.py turns it into a modelled GPU time",
           "quantities": list(QUANT), "basis": "1, BT, BT^2, V, V BT", "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="ty-profile-") as scratch:
        tmp = a.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        for name in a.shapes.split(","):
            doc["shapes"][name] = profile_shape(a.engine, tmp, name, bench.SHAPES[name],
                                                lambda m: print(m, file=sys.stderr, flush=True))
            chk = doc["shapes"][name]["check"]
            print(f"{name}: {len(doc['shapes'][name]['launches'])} distinct launches; the fit "
                  f"predicts B {chk['B']} T {chk['T']} within {100 * chk['worst_relative_error']:.2g}%")
    if os.path.exists(a.out):  # the shapes not run this time are kept
        with open(a.out) as f:
            old = json.load(f)["shapes"]
        doc["shapes"] = {**old, **doc["shapes"]}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
