#!/usr/bin/python3
# device_test.py — the engine's device selection (ctest engine.device.*):
# backend auto / cuda / cpu, the CPU fallback and its reason, and the whole
# engine on the emulated CUDA backend (trainyard-engine-emu with the test
# hook TY_KERNELS=cuda-emu: the engine's device path -- device buffers,
# pinned batches, copies, one read-back per step -- run by the kernels/cuda
# sources on the CPU), compared with the CPU backend.
#
# Usage: device_test.py ENGINE ENGINE_EMU CASE. Reuses cli_test.py's tiny
# models and helpers (standard library only).
import os
import shutil
import sys

ENGINE, ENGINE_EMU, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
sys.argv = [sys.argv[0], ENGINE, "device-" + CASE]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_test as ct  # noqa: E402  (reads sys.argv at import)

fail = ct.fail
EMU = {"TY_KERNELS": "cuda-emu", "TY_EMU_GUARD": "1"}  # device memory unreadable from the host
SLACK = 64 * 4096  # device_used_bytes over mem_bytes on cuda-emu: page rounding of its blocks
LLAMA = {"model_type": "llama", "vocab_size": ct.VOCAB, "hidden_size": ct.DIM, "intermediate_size": 24,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
         "max_position_embeddings": ct.POS}


def run(engine, spec, workdir, env=None, resume=None):
    ct.ENGINE = engine
    return ct.run(spec, workdir=workdir, env=env, resume=resume)


def started(events):
    return [e for e in events if e.get("ev") == "started"][0]


def metrics(events):
    return {e["step"]: e for e in events if e.get("ev") == "metric"}


def case_fallback():
    """The real engine on this machine (no GPU, no driver, or no CUDA build):
    auto with a GPU asked for runs on the CPU and says why; cuda is an error."""
    res = run(ENGINE, ct.write_spec(extra={"resources": {"gpus": 1, "backend": "auto"}}), "auto")
    st = started(ct.expect_success(res))
    why = st.get("fallback", "")
    reasons = ("no CUDA backend", "no NVIDIA driver", "no CUDA device", "cuBLASLt not found")
    if st.get("backend") != "cpu" or not why.startswith("cuda unavailable (") or \
            not any(r in why for r in reasons):
        fail(f"started event does not give the fallback's reason: {st}")
    if "gpu" in st:
        fail(f"a CPU run describes a gpu: {st}")
    print(f"ok: auto -> cpu, {why}")
    res = run(ENGINE, ct.write_spec(extra={"resources": {"gpus": 1, "backend": "cuda"}}), "cuda")
    ct.expect_error(res, "cuda")
    # The hook needs the emulation linked in: the shipped engine refuses it
    # rather than quietly running on the CPU.
    res = run(ENGINE, ct.write_spec(extra={"resources": {"gpus": 1, "backend": "cuda"}}), "hook", env=EMU)
    ct.expect_error(res, "no emulated CUDA backend")


def emu_spec(fam, init, precision, backend, steps):
    res = {"backend": backend} if backend == "cpu" else {"gpus": 1, "backend": backend}
    return ct.write_spec(model={"init": init}, name=f"{fam}-{precision}-{backend}.json", max_steps=steps,
                         grad_accum=2, extra={"precision": precision, "resources": res})


def cpu_losses(fam, init, precision, steps=3):
    """The CPU backend's metric events for the spec compare() runs."""
    spec = emu_spec(fam, init, precision, "cpu", steps)
    return metrics(ct.expect_success(run(ENGINE, spec, f"{fam}-{precision}-cpu")))


def compare(fam, init, precision, steps=3, ref=None, refuse=None, falls=True, env=None):
    """The same spec on cpu (real engine) and on cuda-emu (test engine);
    refuse: TY_EMU_LT_REFUSE for the emulated cuBLASLt (its fallbacks);
    falls: the loss must fall over the steps (a 2-step run of a random
    model need not); env: more of the emulated run's environment."""
    ma = ref or cpu_losses(fam, init, precision, steps)
    env = dict(EMU, **(env or {}), **({"TY_EMU_LT_REFUSE": refuse} if refuse else {}))
    tag = f"{fam}-{precision}-emu" + (f"-no-{refuse}" if refuse else "")
    b = ct.expect_success(run(ENGINE_EMU, emu_spec(fam, init, precision, "cuda", steps), tag, env=env))
    st = started(b)
    gpu = st.get("gpu") or {}
    if st.get("backend") != "cuda-emu" or "fallback" in st or not gpu.get("name", "").startswith("cuda-emu") or \
            gpu.get("compute_capability") != "9.0" or not gpu.get("memory_bytes", 0) > 0 or \
            "driver" not in gpu or "cuda_runtime" not in gpu:
        fail(f"{fam}: started event on cuda-emu: {st}")
    mb = metrics(b)
    if sorted(ma) != list(range(1, steps + 1)) or sorted(mb) != sorted(ma):
        fail(f"{fam}: steps {sorted(ma)} vs {sorted(mb)}")
    tol = 2e-4 if precision == "fp32" else 2e-3
    for k in ma:
        la, lb = ma[k]["loss"], mb[k]["loss"]
        if abs(la - lb) > tol * abs(la):
            fail(f"{tag} step {k}: loss cpu {la} vs cuda-emu {lb}")
    if falls and not ma[steps]["loss"] < ma[1]["loss"]:
        fail(f"{fam}: loss does not fall: {[ma[k]['loss'] for k in sorted(ma)]}")
    # mem_bytes on a GPU is the context's device memory at its peak: at
    # least parameters, gradients and both moments (fp32), and it stops
    # growing after the first step (nothing is allocated in the loop).
    mem = [mb[k]["mem_bytes"] for k in sorted(mb)]
    params = st["params"]
    if mem[0] < 16 * params or len(set(mem[1:])) != 1:
        fail(f"{fam}: mem_bytes {mem} for {params} parameters")
    # device_used_bytes is the whole device's use (cudaMemGetInfo's total -
    # free). Under TY_EMU_GUARD the emulation counts its live cudaMalloc
    # blocks, page-rounded, and has no CUDA context or cuBLASLt of its own:
    # so at least mem_bytes (every block the context holds is live after a
    # step), at most a page per block more, flat like mem_bytes; a CPU run
    # has no such field.
    used = [mb[k].get("device_used_bytes") for k in sorted(mb)]
    if not all(isinstance(u, int) for u in used) or len(set(used[1:])) != 1 or \
            not mem[-1] <= used[-1] <= min(mem[-1] + SLACK, gpu["memory_bytes"]):
        fail(f"{fam}: device_used_bytes {used} against mem_bytes {mem} (slack {SLACK}, "
             f"device {gpu['memory_bytes']})")
    if any("device_used_bytes" in m for m in ma.values()):
        fail(f"{fam}: a CPU run reports device_used_bytes: {ma}")
    print(f"ok: {tag}: losses match the cpu within {tol} "
          f"({[round(ma[k]['loss'], 6) for k in sorted(ma)]}), mem_bytes {mem[-1]}, "
          f"device_used_bytes {used[-1]}")
    return ma


def case_emu_train():
    # GPT-2 (layernorm, GELU, fused qkv, biases, tied head) in fp32, bf16
    # and fp16 (the 16-bit bias and GELU epilogues), and the GQA Llama
    # (rmsnorm, RoPE, SwiGLU) in bf16: every op on the device path, both
    # storage types, in a CI-sized run.
    compare("gpt2", ct.gpt2_config(), "fp32")
    compare("gpt2", ct.gpt2_config(), "bf16")
    compare("gpt2", ct.gpt2_config(), "fp16")
    compare("llama", LLAMA, "bf16")


# One small model of each family the engine runs (hfconfig.c), random
# weights: what a 16-bit step asks of cuBLASLt differs by family (GPT-2's
# biases and GELU epilogue, Qwen2's qkv biases, Gemma's soft-caps and
# sliding windows, Phi-3's fused rows).
SMALL = {"vocab_size": ct.VOCAB, "hidden_size": ct.DIM, "intermediate_size": 24, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": ct.POS}
FAMILIES = {
    "gpt2": ct.gpt2_config(),
    "llama": dict(SMALL, model_type="llama"),
    "mistral": dict(SMALL, model_type="mistral", sliding_window=16),
    "qwen2": dict(SMALL, model_type="qwen2"),
    "qwen3": dict(SMALL, model_type="qwen3", head_dim=8),
    "phi3": dict(SMALL, model_type="phi3", num_key_value_heads=4),
    "gemma2": dict(SMALL, model_type="gemma2", head_dim=8, sliding_window=8),
    "gemma3_text": dict(SMALL, model_type="gemma3_text", head_dim=8, sliding_window=8),
}
# Each case TY_EMU_LT_REFUSE knows (emu_cublaslt.h): the fused bias and
# GELU epilogues, the bias gradient's, 16-bit operands, everything.
REFUSALS = ("bias", "gelu", "dgelu", "bgrad", "16bit", "all")


def lt_cases(path):
    """TY_EMU_LT_CASES's file: {case: queries of it, ..., "refused": n}."""
    with open(path) as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def emu_family(fam):
    """One family in bf16 on cuda-emu against the CPU backend, with the
    emulated cuBLASLt answering as the real one does; then again with each
    case the step asks cuBLASLt for refused in turn (every fallback of
    cuda_matmul.cu this family's step can take, never an error). The
    emulation counts the cases asked for and the queries refused, so a
    refusal that was never met fails."""
    init = FAMILIES[fam]
    census = os.path.join(ct.TMP, f"{fam}.cases")
    ref = compare(fam, init, "bf16", steps=2, falls=False, env={"TY_EMU_LT_CASES": census})
    asked = lt_cases(census)
    if set(asked) != set(REFUSALS) | {"refused"} or asked["all"] < 1 or asked["refused"]:
        fail(f"{fam}: the emulated cuBLASLt's census: {asked}")
    if asked["16bit"] < 1:
        fail(f"{fam}: a bf16 step asked for no 16-bit product: {asked}")
    for r in (r for r in REFUSALS if asked[r]):
        seen = os.path.join(ct.TMP, f"{fam}-no-{r}.cases")
        compare(fam, init, "bf16", steps=2, ref=ref, refuse=r, falls=False, env={"TY_EMU_LT_CASES": seen})
        if lt_cases(seen)["refused"] < 1:
            fail(f"{fam}: TY_EMU_LT_REFUSE={r} refused no query")
    print(f"ok: {fam}: cases asked {asked}; refused in turn: "
          f"{[r for r in REFUSALS if asked[r]]}")


def case_emu_resume():
    """Resume on the device path: a step-2 checkpoint of a 4-step cuda-emu
    run continues bit for bit."""
    spec = ct.write_spec(model={"init": LLAMA}, name="resume.json", max_steps=4, batch_size=3,
                         train=ct.write_dataset("train7.jsonl", ct.random_rows(7)),
                         extra={"checkpoint": {"every_steps": 2}, "resources": {"gpus": 1, "backend": "cuda"}})
    a = ct.expect_success(run(ENGINE_EMU, spec, "ra", env=EMU))
    ck = os.path.join(ct.TMP, "ra", "checkpoints", "step-000002")
    b = ct.expect_success(run(ENGINE_EMU, spec, "rb", env=EMU, resume=ck))
    ma, mb = metrics(a), metrics(b)
    keys = ("loss", "lr", "grad_norm", "tokens")
    if sorted(mb) != [3, 4] or any(ma[k][f] != mb[k][f] for k in mb for f in keys):
        fail(f"resume on cuda-emu: {ma} vs {mb}")
    print("ok: cuda-emu resumed steps 3..4 identical")


def case_emu_devices():
    """What a card can do, and which card a rank takes."""
    def spec(name, precision="fp32"):
        return ct.write_spec(name=name + ".json", max_steps=2,
                             extra={"precision": precision, "resources": {"gpus": 1, "backend": "cuda"}})
    # bf16 before sm_80 is a clear error; fp16 (loss scaling) runs there.
    t4 = dict(EMU, TY_EMU_CC="7.5")
    ct.expect_error(run(ENGINE_EMU, spec("bf16", precision="bf16"), "bf16", env=t4), "bf16",
                    "compute capability 8.0", "7.5", code=2)
    st = started(ct.expect_success(run(ENGINE_EMU, spec("fp16", precision="fp16"), "fp16", env=t4)))
    if st["gpu"]["compute_capability"] != "7.5":
        fail(f"TY_EMU_CC not reported: {st}")
    # precision auto: fp16 with loss scaling on 7.5, bf16 on 9.0
    ev = ct.expect_success(run(ENGINE_EMU, spec("auto75", precision="auto"), "auto75", env=t4))
    st, m = started(ev), metrics(ev)
    if st.get("precision") != "fp16" or not all(m[k].get("loss_scale", 0) > 1 for k in m):
        fail(f"precision auto on 7.5: {st.get('precision')}, metrics {m}")
    st = started(ct.expect_success(run(ENGINE_EMU, spec("auto90", precision="auto"), "auto90", env=EMU)))
    if st.get("precision") != "bf16":
        fail(f"precision auto on 9.0: {st}")
    # TY_LOCAL_RANK picks among the visible devices; one that is not there
    # is named with what is visible.
    env = dict(EMU, TY_LOCAL_RANK="1", CUDA_VISIBLE_DEVICES="3")
    ct.expect_error(run(ENGINE_EMU, spec("rank"), "rank1", env=env), "CUDA device 1",
                    "1 visible", "CUDA_VISIBLE_DEVICES=3")
    env = dict(env, TY_EMU_DEVICES="2", CUDA_VISIBLE_DEVICES="3,5")
    ct.expect_success(run(ENGINE_EMU, spec("rank"), "rank1of2", env=env))
    # auto with no device visible falls back and says so.
    env = dict(EMU, TY_EMU_DEVICES="0")
    auto = ct.write_spec(name="auto.json", max_steps=1, extra={"resources": {"gpus": 1, "backend": "auto"}})
    st = started(ct.expect_success(run(ENGINE_EMU, auto, "auto0", env=env)))
    if st["backend"] != "cpu" or "no CUDA device" not in st.get("fallback", ""):
        fail(f"auto with no device: {st}")
    print("ok: bf16 refused on 7.5, fp16 runs there (and auto picks it), local rank picks among visible devices, auto falls back")


def case_emu_stats():
    """The device path's memory rules, counted by the emulated runtime (TY_EMU_STATS):
    device memory is allocated per buffer kind (as many cudaMalloc calls for
    1 layer as for 2) and never in the step loop (as many for 3 steps as for
    1); the batches are copied from pinned host memory (no pageable
    host-to-device copy in the loop); the loss comes back once per step, not
    once per micro-batch (as many device-to-host copies with grad_accum 3 as
    with 1)."""
    train = ct.write_dataset("train16.jsonl", ct.random_rows(16))

    def stats(name, steps=1, accum=1, layers=1):
        path = os.path.join(ct.TMP, name + ".stats")
        spec = ct.write_spec(model={"init": ct.gpt2_config(n_layer=layers)}, train=train,
                             name=name + ".json", max_steps=steps, grad_accum=accum, batch_size=1,
                             seq_len=8, extra={"resources": {"gpus": 1, "backend": "cuda"}})
        ct.expect_success(run(ENGINE_EMU, spec, name, env=dict(EMU, TY_EMU_STATS=path)))
        with open(path) as f:
            return {k: int(v) for k, v in (line.split() for line in f)}
    base, longer, accum, deeper = stats("base"), stats("steps3", steps=3), stats("accum3", accum=3), \
        stats("layers2", layers=2)
    print(f"stats: 1 step {base}, 3 steps {longer}, grad_accum 3 {accum}, 2 layers {deeper}")
    if longer["malloc"] != base["malloc"] or accum["malloc"] != base["malloc"]:
        fail(f"device allocations in the step loop: {base['malloc']} for 1 step, "
             f"{longer['malloc']} for 3, {accum['malloc']} with grad_accum 3")
    if deeper["malloc"] != base["malloc"]:
        fail(f"device allocations grow with the layers: {base['malloc']} vs {deeper['malloc']}")
    if base["host_alloc"] < 2 or longer["h2d_pageable"] != base["h2d_pageable"] or \
            accum["h2d_pageable"] != base["h2d_pageable"]:
        fail(f"batches not copied from pinned memory: {base} / {longer} / {accum}")
    if accum["d2h"] != base["d2h"]:
        fail(f"device-to-host copies grow with grad_accum: {base['d2h']} vs {accum['d2h']}")
    if not longer["d2h"] > base["d2h"]:
        fail(f"no read-back per step counted: {base['d2h']} vs {longer['d2h']}")
    print("ok: allocations per buffer kind, none in the loop; pinned batches; one read-back per step")


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}
CASES.update({f"emu_family.{fam}": (lambda fam=fam: emu_family(fam)) for fam in FAMILIES})

if __name__ == "__main__":
    try:
        if CASE not in CASES:
            fail(f"unknown case; known: {sorted(CASES)}")
        CASES[CASE]()
    finally:
        shutil.rmtree(ct.TMP, ignore_errors=True)
