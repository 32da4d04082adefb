/* test_emu_count.cpp — kernels.cuda_emu.count: the bytes each kernels/cuda
 * launch declares (KN_IO next to its KN_LAUNCH; cuBLASLt's from the
 * matmul's layouts) against the bytes it really touched, and the FLOPs
 * the emulated cuBLASLt counts per path.
 *
 * TY_EMU_COUNT and TY_EMU_COUNT_MEM=1 are set before the first device
 * call, so every device block is its own mapping and each launch's reads
 * and writes are counted page by page, clipped to the block (emu_count.cpp).
 * Every tensor is its own block and every op here touches its tensors
 * whole (embedding ids a permutation of all table rows, attention's q, k,
 * v in separate blocks), so a right declaration matches to the byte up to
 * the fixed scratch: the reduction partials (one 2 KiB block of which a
 * launch touches a few bytes). Tolerance, for reads and writes apart:
 * 1% of the declaration + 4 KiB. Every family's tensors are 128 KiB and
 * more, so a missing or doubled operand is far outside it.
 * The comparison itself is checked first on a probe kernel declared right,
 * declared wrong (must be flagged) and not declared (must be flagged). */
#include "kn_cuda.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tyassert.h"

namespace
{

const double REL = 0.01;
const uint64_t ABS = 4096;

uint64_t absdiff(uint64_t a, uint64_t b)
{
    return a > b ? a - b : b - a;
}

/* Whether a record's declaration holds (why not in `why`). */
bool rec_ok(const emu_count_rec &r, char *why, size_t n)
{
    if (!r.declared) {
        snprintf(why, n, "declares no bytes");
        return false;
    }
    if (!r.seen) {
        snprintf(why, n, "no counted bytes (TY_EMU_COUNT_MEM off?)");
        return false;
    }
    if (absdiff(r.seen_rd, r.decl_rd) > REL * (double)r.decl_rd + ABS ||
        absdiff(r.seen_wr, r.decl_wr) > REL * (double)r.decl_wr + ABS) {
        snprintf(why, n, "declared read %llu write %llu, touched read %llu write %llu",
                 (unsigned long long)r.decl_rd, (unsigned long long)r.decl_wr,
                 (unsigned long long)r.seen_rd, (unsigned long long)r.seen_wr);
        return false;
    }
    return true;
}

std::vector<emu_count_rec> take(void)
{
    std::vector<emu_count_rec> v(4096);
    v.resize((size_t)emu_count_take(v.data(), (int)v.size()));
    return v;
}

/* Every launch since the last call declares its bytes right; the kernel
 * names `want` (comma-separated) each launched. */
void check(const char *family, const char *want)
{
    std::vector<emu_count_rec> rs = take();
    for (const emu_count_rec &r : rs) {
        char why[256];
        bool ok = rec_ok(r, why, sizeof why);
        printf("%-14s %-44.44s read %10llu / %10llu write %10llu / %10llu%s\n", family, r.name,
               (unsigned long long)r.decl_rd, (unsigned long long)r.seen_rd,
               (unsigned long long)r.decl_wr, (unsigned long long)r.seen_wr,
               ok ? "" : "  MISMATCH");
        CHECK(ok, "%s: %s: %s", family, r.name, why);
    }
    char list[256];
    snprintf(list, sizeof list, "%s", want);
    for (char *t = strtok(list, ","); t; t = strtok(nullptr, ",")) {
        bool found = false;
        for (const emu_count_rec &r : rs)
            found |= !strncmp(r.name, t, strlen(t));
        CHECK(found, "%s: no launch of %s was recorded", family, t);
    }
}

/* ---- the probe: the comparison can fail ---------------------------------- */

__global__ void k_probe(float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1.0f;
}

void probe(kn_ctx *c)
{
    const size_t n = 1 << 16;
    float *x = (float *)kn_alloc(c, n * 4);
    take();
    uint64_t rd[3] = {4 * n, 2 * n, 0};
    for (int k = 0; k < 3; k++) {
        if (k < 2) emu_declare("k_probe", rd[k], 4 * n, 0);
        KN_EMU_LAUNCH(k_probe, 4, 256, 0, nullptr, x, n);
        std::vector<emu_count_rec> rs = take();
        CHECK(rs.size() == 1, "probe: %zu records for one launch", rs.size());
        if (rs.size() != 1) continue;
        char why[256];
        bool ok = rec_ok(rs[0], why, sizeof why);
        CHECK(ok == (k == 0), "probe %d: %s", k, ok ? "a wrong declaration passed" : why);
    }
    kn_free(c, x);
}

/* ---- the op families -------------------------------------------------------- */

struct bufs {
    kn_ctx *c;
    std::vector<void *> all;
    void *f32(size_t n, float scale = 1.0f)
    {
        std::vector<float> h(n);
        for (size_t i = 0; i < n; i++)
            h[i] = scale * (float)((i * 37 % 101) + 1) / 128.0f;
        void *p = kn_alloc(c, n * 4);
        kn_to_device(c, p, h.data(), n * 4);
        all.push_back(p);
        return p;
    }
    void *bf16(size_t n, float scale = 1.0f)
    {
        void *p32 = f32(n, scale), *p = kn_alloc(c, n * 2);
        kn_convert(c, p, KN_BF16, p32, KN_F32, n);
        all.push_back(p);
        return p;
    }
    void *ids(int n, int mult)
    {
        std::vector<int32_t> h((size_t)n);
        for (int i = 0; i < n; i++)
            h[(size_t)i] = (int32_t)((i * mult) % n);
        void *p = kn_alloc(c, (size_t)n * 4);
        kn_to_device(c, p, h.data(), (size_t)n * 4);
        all.push_back(p);
        return p;
    }
    ~bufs()
    {
        for (void *p : all)
            kn_free(c, p);
    }
};

void elementwise(kn_ctx *c)
{
    const size_t n = 1 << 16;
    bufs b{c, {}};
    void *x = b.bf16(n), *y = b.bf16(n), *o = b.bf16(n), *o2 = b.bf16(n), *d16 = b.bf16(n),
         *g = b.f32(n), *d = b.f32(n);
    float *u = (float *)b.f32(n);
    take();
    kn_add(c, KN_BF16, o, x, y, n);
    kn_axpy(c, (float *)g, (const float *)d, n, 0.5f);
    kn_scale(c, u, n, 0.5f);
    kn_gelu_fwd(c, KN_BF16, o, x, n);
    kn_gelu_bwd(c, KN_BF16, (float *)g, (const float *)d, x, n);
    kn_swiglu_fwd(c, KN_BF16, o, x, y, n);
    kn_swiglu_bwd(c, KN_BF16, KN_F32, (float *)g, u, (const float *)d, KN_F32, x, y, n);
    kn_swiglu_bwd(c, KN_BF16, KN_BF16, o, o2, (const float *)d, KN_F32, x, y, n); /* 16-bit gradients */
    kn_swiglu_bwd(c, KN_BF16, KN_BF16, o, o2, d16, KN_BF16, x, y, n); /* and a 16-bit dout */
    check("elementwise", "k_add,k_axpy,k_scale,k_gelu_fwd,k_gelu_bwd,k_swiglu_fwd,k_swiglu_bwd");
    CHECK(kn_sumsq(c, (const float *)d, n) > 0, "sumsq");
    check("reduce", "k_reduce_partial,k_reduce_final,cudaMemcpyAsync.d2h");
    kn_convert(c, g, KN_F32, x, KN_BF16, n);
    /* 40 spans with whole pages between them (the emulator sees pages):
     * two launches (32 spans a launch) */
    const size_t slot = 4096, part = 2048;
    void *sx = b.bf16(40 * slot), *sd = b.f32(40 * slot);
    kn_span sp[40];
    for (int i = 0; i < 40; i++)
        sp[i] = kn_span{(size_t)i * slot, (size_t)i * slot, part};
    kn_convert_spans(c, sd, KN_F32, sx, KN_BF16, sp, 40);
    check("convert", "k_convert,k_convert_spans");
}

void norms(kn_ctx *c)
{
    const int N = 64, C = 1024;
    size_t n = (size_t)N * C;
    bufs b{c, {}};
    void *x = b.bf16(n), *a = b.bf16(n), *o = b.bf16(n), *res = b.bf16(n);
    float *w = (float *)b.f32(C), *bias = (float *)b.f32(C), *mean = (float *)b.f32(N),
          *rstd = (float *)b.f32(N), *dx = (float *)b.f32(n), *dout = (float *)b.f32(n),
          *dw = (float *)b.f32(C), *db = (float *)b.f32(C);
    take();
    kn_layernorm_fwd(c, KN_BF16, o, mean, rstd, x, w, bias, N, C, 1e-5f);
    kn_layernorm_bwd(c, KN_BF16, dx, NULL, dw, db, dout, KN_F32, x, w, mean, rstd, N, C);
    kn_rmsnorm_fwd(c, KN_BF16, o, rstd, x, w, N, C, 1e-5f);
    kn_rmsnorm_bwd(c, KN_BF16, dx, o, dw, dout, KN_F32, x, w, rstd, N, C); /* dx_dt too */
    kn_layernorm_bwd(c, KN_BF16, NULL, o, NULL, NULL, dout, KN_F32, x, w, mean, rstd, N, C); /* dx in bf16 */
    kn_rmsnorm_bwd(c, KN_BF16, dx, NULL, dw, a, KN_BF16, x, w, rstd, N, C); /* dout in bf16 */
    kn_add_rmsnorm_fwd(c, KN_BF16, res, o, rstd, x, a, w, N, C, 1e-5f);
    kn_add_layernorm_fwd(c, KN_BF16, res, o, mean, rstd, x, a, w, bias, N, C, 1e-5f);
    check("norm", "k_layernorm_fwd,k_norm_bwd_dx,k_norm_bwd_dw,k_colsum_final,k_rmsnorm_fwd,"
                  "k_add_rmsnorm_fwd,k_add_layernorm_fwd");
}

void embedding_loss(kn_ctx *c)
{
    const int N = 128, C = 512, V = 1024;
    bufs b{c, {}};
    void *table = b.bf16((size_t)N * C), *out = b.bf16((size_t)N * C);
    int32_t *ids = (int32_t *)b.ids(N, 37);
    float *dtable = (float *)b.f32((size_t)N * C), *dout = (float *)b.f32((size_t)N * C);
    take();
    kn_embedding_fwd(c, KN_BF16, out, ids, table, N, C, 0);
    kn_embedding_bwd(c, dtable, ids, dout, N, C);
    check("embedding", "k_embedding_fwd,k_embedding_links,k_embedding_bwd");
    void *logits = b.bf16((size_t)N * V, 0.05f);
    int32_t *targets = (int32_t *)b.ids(N, 5);
    float *losses = (float *)b.f32(N);
    take();
    kn_crossentropy_fwd_bwd(c, KN_BF16, losses, logits, logits, targets, N, V, V, 1.0f / N, 0.0f);
    check("crossentropy", "k_crossentropy");
}

void attention(kn_ctx *c)
{
    const int B = 1, T = 128, Hq = 4, Hkv = 2, D = 64;
    size_t nq = (size_t)B * T * Hq * D, nkv = (size_t)B * T * Hkv * D;
    bufs b{c, {}};
    void *q = b.bf16(nq, 0.1f), *k = b.bf16(nkv, 0.1f), *v = b.bf16(nkv), *out = b.bf16(nq);
    float *lse = (float *)b.f32((size_t)B * Hq * T), *dq = (float *)b.f32(nq),
          *dk = (float *)b.f32(nkv), *dv = (float *)b.f32(nkv);
    /* k / 384: not exact in bf16; the backward reads it rounded */
    float *dout = (float *)b.f32(nq, 1.0f / 3.0f);
    take();
    kn_rope_fwd(c, KN_BF16, q, B, T, Hq, D, Hq * D, 10000.0f, 0);
    check("rope", "k_rope");
    kn_attention_fwd(c, KN_BF16, out, lse, q, k, v, B, T, Hq, Hkv, D, Hq * D, Hkv * D, 0.0f, 0.0f,
                     0);
    kn_attention_bwd(c, KN_BF16, KN_F32, dq, dk, dv, dout, KN_F32, out, lse, q, k, v, B, T, Hq, Hkv, D,
                     Hq * D, Hkv * D, 0.0f, 0.0f, 0);
    std::vector<emu_count_rec> rs = take();
    /* bf16 at head dim 64 runs on the tensor-core kernels: their FLOPs are
     * counted on the mma path as the emulated wmma products run them, at
     * least the causal pairs' T(T+1)/2 per head at 4 / 6 / 8 D each (more:
     * whole 16-row tiles on the diagonal, hi + lo halves of P and dS),
     * at most 4x that; none declared on the fp32 cores. */
    /* Launches: the forward, the backward's row dots (no products), dq,
     * dk/dv. */
    uint64_t pairs = (uint64_t)T * (T + 1) / 2, per[3] = {4, 6, 8};
    CHECK(rs.size() == 4, "attention: %zu launches, expected 4", rs.size());
    const std::vector<emu_count_rec> all = rs;
    if (rs.size() == 4) {
        CHECK(!strcmp(rs[1].name, "k_fl_rowdot") && rs[1].flops[EMU_PATH_MMA] == 0 &&
                  rs[1].flops[EMU_PATH_SIMT] == 0,
              "attention: the second launch is k_fl_rowdot, with no counted FLOPs: %s", rs[1].name);
        rs.erase(rs.begin() + 1);
    }
    for (size_t i = 0; i < rs.size() && i < 3; i++) {
        uint64_t least = per[i] * B * Hq * D * pairs, mma = rs[i].flops[EMU_PATH_MMA];
        CHECK(mma >= least && mma <= 4 * least, "attention %s: %llu mma FLOPs, expected %llu..%llu",
              rs[i].name, (unsigned long long)mma, (unsigned long long)least,
              (unsigned long long)(4 * least));
        CHECK(rs[i].flops[EMU_PATH_SIMT] == 0, "attention %s: fp32 FLOPs declared", rs[i].name);
    }
    for (const emu_count_rec &r : all) { /* and their bytes, as check() does */
        char why[256];
        CHECK(rec_ok(r, why, sizeof why), "attention: %s: %s", r.name, why);
        printf("%-14s %-44.44s read %10llu / %10llu write %10llu / %10llu\n", "attention", r.name,
               (unsigned long long)r.decl_rd, (unsigned long long)r.seen_rd,
               (unsigned long long)r.decl_wr, (unsigned long long)r.seen_wr);
    }
    /* The backward again from a dout given as (g, g_dt): the same dk bit
     * for bit, from the same three launches, each declaring what it
     * touches; returns the launches. */
    std::vector<float> g1(nkv), g2(nkv);
    kn_to_host(c, g1.data(), dk, nkv * 4);
    auto again = [&](const char *how, const void *g, kn_dtype g_dt) {
        take();
        kn_attention_bwd(c, KN_BF16, KN_F32, dq, dk, dv, g, g_dt, out, lse, q, k, v, B, T, Hq, Hkv,
                         D, Hq * D, Hkv * D, 0.0f, 0.0f, 0);
        std::vector<emu_count_rec> got = take();
        kn_to_host(c, g2.data(), dk, nkv * 4);
        CHECK(!memcmp(g1.data(), g2.data(), nkv * 4), "attention: dO %s changed dk", how);
        CHECK(got.size() == 3, "attention, dO %s: %zu launches, expected 3", how, got.size());
        for (const emu_count_rec &r : got) {
            char why[256];
            CHECK(rec_ok(r, why, sizeof why), "attention, dO %s: %s: %s", how, r.name, why);
        }
        return got;
    };
    /* dO rounded to bf16 first (the op reads dO as bf16 holds it) */
    kn_round(c, dout, nq, KN_BF16);
    again("rounded first", dout, KN_F32);
    /* dO stored in bf16 (dout_dt): the row dots read it at 2 bytes an
     * element and write only D_i, the kernels take it as their dO */
    void *dout16 = b.bf16(nq);
    kn_convert(c, dout16, KN_BF16, dout, KN_F32, nq);
    for (const emu_count_rec &r : again("in bf16", dout16, KN_BF16))
        if (!strcmp(r.name, "k_fl_rowdot"))
            CHECK(r.decl_rd == nq * 4 && r.decl_wr == (uint64_t)B * Hq * T * 4,
                  "attention, dO in bf16: the row dots declare %llu read, %llu written",
                  (unsigned long long)r.decl_rd, (unsigned long long)r.decl_wr);
}

void optimizer_misc(kn_ctx *c)
{
    const size_t n = 1 << 16;
    bufs b{c, {}};
    float *p = (float *)b.f32(n), *g = (float *)b.f32(n), *m = (float *)b.f32(n),
          *v = (float *)b.f32(n), *x = (float *)b.f32(n);
    uint16_t *hi = (uint16_t *)b.bf16(n), *lo = (uint16_t *)b.bf16(n);
    void *x16 = b.bf16(n), *o16 = b.bf16(n), *up = b.bf16(n);
    uint8_t *mask = (uint8_t *)kn_alloc(c, n);
    take();
    kn_adamw(c, KN_F32, p, nullptr, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
    kn_master_split(c, hi, lo, x, n);
    kn_adamw(c, KN_BF16, hi, lo, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2);
    kn_master_join(c, x, hi, lo, n);
    check("optimizer", "k_adamw,k_master_split,k_master_join");
    /* The fused step: gradient factors in register, gradients cleared. */
    float *m2 = (float *)b.f32(n), *v2 = (float *)b.f32(n);
    const size_t slot = 4096, part = 2048, all = 40 * slot;
    float *p3 = (float *)b.f32(all), *g3 = (float *)b.f32(all), *m3 = (float *)b.f32(all),
          *v3 = (float *)b.f32(all);
    uint16_t *hi3 = (uint16_t *)b.bf16(all), *lo3 = (uint16_t *)b.bf16(all);
    take();
    kn_adamw_block blk[2] = {{p, nullptr, g, m, v, n, 0.1f, KN_F32},
                             {hi, lo, x, m2, v2, n, 0.0f, KN_BF16}};
    kn_adamw_hp hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 3, {0.5f, 0.25f}, 1};
    kn_adamw_blocks(c, blk, 2, hp);
    /* 40 tensors, pages apart: two launches, both master types */
    kn_adamw_block many[40];
    for (int i = 0; i < 40; i++) {
        size_t o = (size_t)i * slot;
        many[i] =
            i % 2 ? kn_adamw_block{p3 + o, nullptr, g3 + o, m3 + o, v3 + o, part, 0.1f, KN_F32}
                  : kn_adamw_block{hi3 + o, lo3 + o, g3 + o, m3 + o, v3 + o, part, 0.0f, KN_BF16};
    }
    kn_adamw_blocks(c, many, 40, hp);
    check("optimizer blocks", "k_adamw");
    kn_dropout_fwd(c, KN_BF16, o16, mask, x16, n, 0.1f, 7, 0);
    kn_dropout_bwd(c, g, x, mask, n, 0.1f);
    kn_geglu_fwd(c, KN_BF16, o16, x16, up, n);
    kn_geglu_bwd(c, KN_BF16, KN_F32, g, m, x, KN_F32, x16, up, n);
    kn_softcap(c, x, n, 30.0f);
    kn_round(c, x, n, KN_BF16);
    check("misc", "k_dropout_fwd,k_dropout_bwd,k_geglu_fwd,k_geglu_bwd,k_softcap,k_round");
    kn_free(c, mask);
}

/* A GEMM's FLOPs land on the path its types choose. */
void lt_flops(const char *what, int path, uint64_t want)
{
    std::vector<emu_count_rec> rs = take();
    uint64_t got = 0, other = 0;
    for (const emu_count_rec &r : rs) {
        char why[256];
        CHECK(rec_ok(r, why, sizeof why), "%s: %s: %s", what, r.name, why);
        printf("%-14s %-44.44s read %10llu / %10llu write %10llu / %10llu\n", what, r.name,
               (unsigned long long)r.decl_rd, (unsigned long long)r.seen_rd,
               (unsigned long long)r.decl_wr, (unsigned long long)r.seen_wr);
        if (strncmp(r.name, "cublasLtMatmul", 14)) continue;
        for (int p = 0; p < EMU_PATHS; p++)
            (p == path ? got : other) += r.flops[p];
    }
    CHECK(got == want && other == 0, "%s: %llu FLOPs on its path (expected %llu), %llu elsewhere",
          what, (unsigned long long)got, (unsigned long long)want, (unsigned long long)other);
}

void matmuls(kn_ctx *c)
{
    const int N = 64, K = 256, M = 512;
    bufs b{c, {}};
    void *x = b.bf16((size_t)N * K), *w = b.bf16((size_t)M * K), *o = b.bf16((size_t)N * M),
         *dout = b.bf16((size_t)N * M), *pre = b.bf16((size_t)N * M);
    float *bias = (float *)b.f32(M), *dx = (float *)b.f32((size_t)N * K),
          *dw = (float *)b.f32((size_t)M * K), *x32 = (float *)b.f32((size_t)N * K),
          *w32 = (float *)b.f32((size_t)M * K), *o32 = (float *)b.f32((size_t)N * M);
    take();
    kn_matmul16_fwd(c, KN_BF16, KN_BF16, KN_BF16, o, x, w, bias, KN_F32, N, K, M);
    lt_flops("matmul16_fwd", EMU_PATH_TC16, 2ull * N * K * M);
    kn_matmul16_bwd(c, KN_BF16, KN_BF16, KN_BF16, dx, dw, nullptr, dout, x, w, N, K, M);
    lt_flops("matmul16_bwd", EMU_PATH_TC16, 4ull * N * K * M);
    kn_matmul_gelu_fwd(c, KN_BF16, KN_BF16, KN_BF16, o, pre, x, w, bias, KN_F32, N, K, M);
    lt_flops("matmul_gelu", EMU_PATH_TC16, 2ull * N * K * M);
    kn_matmul_fwd(c, o32, x32, w32, nullptr, N, K, M);
    lt_flops("matmul_fwd32", EMU_PATH_SIMT, 2ull * N * K * M);
}

/* The bias gradients' column sums: over several slices of rows (partials,
 * then k_colsum_final), over one (added in place), and the 16-bit dout of
 * matmul16's backward with its GEMMs. */
void bias_grads(kn_ctx *c)
{
    const int N = 64, K = 256, M = 512;
    bufs b{c, {}};
    void *x = b.bf16((size_t)N * K), *w = b.bf16((size_t)M * K), *dout = b.bf16((size_t)N * M);
    float *dbias = (float *)b.f32(M), *dx = (float *)b.f32((size_t)N * K),
          *dw = (float *)b.f32((size_t)M * K), *x32 = (float *)b.f32((size_t)N * K),
          *w32 = (float *)b.f32((size_t)M * K), *d32 = (float *)b.f32((size_t)N * M);
    take();
    kn_matmul_bwd(c, nullptr, nullptr, dbias, d32, x32, w32, N, K, M);
    check("bias grad", "k_colsum_partial,k_colsum_final");
    kn_matmul_bwd(c, nullptr, nullptr, dbias, d32, x32, w32, KN_COLSUM_MIN_ROWS, K, M);
    check("bias grad", "k_colsum_partial");
    kn_matmul16_bwd(c, KN_BF16, KN_BF16, KN_BF16, dx, dw, dbias, dout, x, w, N, K, M);
    lt_flops("matmul16 dbias", EMU_PATH_TC16, 4ull * N * K * M);
}

/* cuBLASLt's path for each compute type and A/B type. */
void paths(void)
{
    struct {
        int ct, ab, path;
    } t[] = {{CUBLAS_COMPUTE_32F, CUDA_R_16BF, EMU_PATH_TC16},
             {CUBLAS_COMPUTE_32F, CUDA_R_16F, EMU_PATH_TC16},
             {CUBLAS_COMPUTE_32F, CUDA_R_32F, EMU_PATH_SIMT},
             {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, EMU_PATH_SIMT},
             {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, EMU_PATH_TF32},
             {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_16BF, EMU_PATH_TC16},
             {CUBLAS_COMPUTE_32F_FAST_16BF, CUDA_R_32F, EMU_PATH_TC16},
             {CUBLAS_COMPUTE_32F_FAST_16F, CUDA_R_32F, EMU_PATH_TC16}};
    for (auto &e : t)
        CHECK(emu_lt_path(e.ct, e.ab) == e.path,
              "compute type %d, A/B type %d: path %d, expected %d", e.ct, e.ab,
              emu_lt_path(e.ct, e.ab), e.path);
}

} // namespace

int main(int argc, char **argv)
{
    char path[256];
    snprintf(path, sizeof path, "%s", argc > 1 ? argv[1] : "/dev/null");
    setenv("TY_EMU_COUNT", path, 1);
    setenv("TY_EMU_COUNT_MEM", "1", 1);
    paths();
    kn_ctx *c = nullptr;
    ty_err err = {};
    CHECK(kn_open_backend(&c, &kn_cuda_emu_backend, KN_CUDA, 0, 1, &err) == 0, "open: %s", err.msg);
    if (!c) return 1;
    probe(c);
    elementwise(c);
    norms(c);
    embedding_loss(c);
    attention(c);
    optimizer_misc(c);
    matmuls(c);
    bias_grads(c);
    ty_err kerr = {};
    CHECK(kn_check(c, &kerr) == 0, "context error: %s", kerr.msg);
    kn_close(c);
    return ty_summary("cuda_emu.count");
}
