#!/usr/bin/python3
"""torch_ops.py — the same ops and shapes as bench_kernels.c, in PyTorch.

Times forward+backward pieces of a GPT-2 (4 x 256, seq 256, batch 8,
vocab 50257) step op by op, so bench_kernels' numbers have a peer.
Usage: /usr/bin/python3 torch_ops.py [threads] [reps]"""
import sys
import time

import torch
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.set_num_threads(threads)
torch.manual_seed(0)
B, T, C, H, V = 8, 256, 256, 4, 50257
N, D = B * T, C // H
total = 0.0


def timeit(label, fn):
    global total
    fn()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    ms = (time.perf_counter() - t0) / reps * 1e3
    cms = (time.process_time() - c0) / reps * 1e3
    total += ms
    print(f"{label:34s} {ms:9.3f} ms {cms:9.3f} cpu-ms")


print(f"torch {torch.__version__}, threads {threads}")
for name, (K, M) in [("qkv", (C, 3 * C)), ("attn.proj", (C, C)), ("fc", (C, 4 * C)),
                     ("mlp.proj", (4 * C, C))]:
    x = torch.randn(N, K, requires_grad=True)
    lin = torch.nn.Linear(K, M)
    y = lin(x)
    g = torch.randn_like(y)
    timeit(f"matmul_fwd {name} {K}x{M}", lambda: lin(x))
    timeit(f"matmul_bwd {name}",
           lambda: torch.autograd.grad(lin(x), [x, lin.weight, lin.bias], g))

qkv = torch.randn(B, T, 3 * C, requires_grad=True)
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))


def attn():
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
    a = (q @ k.transpose(-2, -1)) * (1.0 / D ** 0.5)
    a = a.masked_fill(~mask, float("-inf")).softmax(-1)
    return (a @ v).transpose(1, 2).reshape(B, T, C)


timeit("attention_fwd", attn)
go = torch.randn(B, T, C)
timeit("attention_fwd+bwd", lambda: torch.autograd.grad(attn(), [qkv], go))
x = torch.randn(N, C, requires_grad=True)
ln = torch.nn.LayerNorm(C)
timeit("layernorm_fwd", lambda: ln(x))
timeit("layernorm_fwd+bwd", lambda: torch.autograd.grad(ln(x), [x, ln.weight, ln.bias],
                                                        torch.ones(N, C)))
h = torch.randn(N, 4 * C, requires_grad=True)
timeit("gelu_fwd", lambda: F.gelu(h, approximate="tanh"))
timeit("gelu_fwd+bwd", lambda: torch.autograd.grad(F.gelu(h, approximate="tanh"), [h],
                                                   torch.ones(N, 4 * C)))
head = torch.nn.Linear(C, V, bias=False)
xs = torch.randn(N, C, requires_grad=True)
tg = torch.randint(0, V, (N,))
timeit("matmul_fwd lm_head 256x50257", lambda: head(xs))
logits = head(xs).detach().requires_grad_(True)
timeit("crossentropy_fwd", lambda: F.cross_entropy(logits, tg))
timeit("crossentropy_fwd+bwd", lambda: torch.autograd.grad(F.cross_entropy(logits, tg), [logits]))
gl = torch.randn(N, V)
timeit("matmul_bwd lm_head", lambda: torch.autograd.grad(head(xs), [xs, head.weight], gl))
p = torch.nn.Parameter(torch.randn(V, C))
p.grad = torch.randn(V, C)
opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1)
timeit("adamw (lm_head size)", opt.step)
print(f"{'sum of the above':34s} {total:9.3f} ms")
