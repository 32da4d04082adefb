/* cuda_optim.cu — AdamW over a model's tensors (kn_adamw_blocks).
 *
 * The update is torch.optim.AdamW's single-tensor arithmetic in fp32,
 * element for element the CPU backend's (cpu_loss.c): on an fp32
 * parameter, or on a bf16 master kept split (kn_master_split's hi and lo,
 * joined, updated and split again). A model's step updates about 150
 * tensors, most of them norm weights and biases of a few thousand
 * elements, so the blocks go KN_MULTI_MAX to a launch (kn_multi.cuh):
 * five launches for GPT-2 124M instead of one per tensor. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "kn_multi.cuh"

namespace KN_NS {

/* One tensor of a launch: p is fp32, or the split master's hi with plo. */
struct adamw_piece {
    void *p;
    uint16_t *plo;
    float *g, *m, *v;
    size_t n;
    float decay;
    int do_decay;
};

struct adamw_table {
    kn_multi_chunks ch;
    adamw_piece b[KN_MULTI_MAX];
};

__global__ void k_adamw(adamw_table t, kn_adamw_k k, int zero_grad)
{
    kn_multi_for(
        t.ch, [&](int p) { return t.b[p].n; },
        [&](int p, size_t i) {
            const adamw_piece &b = t.b[p];
            uint16_t *hi = (uint16_t *)b.p;
            float pi = b.plo ? join1(hi[i], b.plo[i]) : ((float *)b.p)[i];
            float gi = b.g[i] * k.gs0 * k.gs1;
            if (b.do_decay)
                pi *= b.decay;
            float mi = k.b1 * b.m[i] + k.omb1 * gi;
            float vi = k.b2 * b.v[i] + k.omb2 * gi * gi;
            b.m[i] = mi;
            b.v[i] = vi;
            float out = pi - k.step * (mi / (sqrtf(vi) / k.bc2_sqrt + k.eps));
            if (b.plo)
                split1(out, hi + i, b.plo + i);
            else
                ((float *)b.p)[i] = out;
            if (zero_grad)
                b.g[i] = 0.0f;
        });
}

/* Either master type reads and writes 16 bytes an element and writes 12
 * (p or hi + lo, m, v), 16 with the gradient cleared. */
void cuda_adamw_blocks(kn_ctx *c, const kn_adamw_block *b, int nb, kn_adamw_hp hp)
{
    if (!kn_adamw_blocks_ok(c, b, nb))
        return;
    kn_adamw_k k = kn_adamw_consts(&hp);
    adamw_table t;
    kn_multi_launches(
        &t.ch, nb, [&](int i) { return b[i].n; },
        [&](int p, int i) {
            t.b[p] = {b[i].p,
                      b[i].pdt == KN_BF16 ? b[i].plo : NULL,
                      b[i].g,
                      b[i].m,
                      b[i].v,
                      b[i].n,
                      kn_adamw_decay(hp.lr, b[i].wd),
                      b[i].wd != 0.0f};
        },
        [&]([[maybe_unused]] size_t total) {
            KN_IO(k_adamw, 16 * total, (hp.zero_grad ? 16 : 12) * total, 0);
            KN_LAUNCH(k_adamw, kn_multi_grid(&t.ch), KN_MULTI_THREADS, 0, c, t, k, hp.zero_grad);
        });
}

void cuda_adamw(kn_ctx *c, kn_dtype pdt, void *p, uint16_t *plo, const float *g, float *m, float *v,
                size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    kn_adamw_block b = {p, plo, (float *)g, m, v, n, wd, pdt};
    kn_adamw_hp hp = {lr, b1, b2, eps, t, {1.0f, 1.0f}, 0};
    cuda_adamw_blocks(c, &b, 1, hp);
}

} // namespace KN_NS
