/* cuda_convert.cu — fp32 <-> bf16 / fp16 storage, and matmul16.
 *
 * The conversions are written on the bits (no cuda_fp16.h intrinsics), so
 * the GPU and the emulation run the same arithmetic and both match the CPU
 * backend bit for bit: bf16 narrowing adds 0x7fff plus the lowest kept bit
 * (round-to-nearest-even, carrying into the exponent up to inf), NaNs made
 * quiet; fp16 narrowing is IEEE binary16 round-to-nearest-even with
 * overflow to inf and subnormals kept, NaN quiet with its top payload bits
 * (what x86's F16C conversion gives the CPU backend). k_convert and
 * k_round are templates on the storage types, in 16-byte packs
 * (kn_vec.cuh).
 * matmul16 with a 16-bit weight is a native bf16 / fp16 cuBLASLt product
 * (tensor cores, fp32 accumulation; see the functions below); its scratch
 * (the 16-bit copy of the activations, fp32 copies for the mixed cases) is
 * the context's, grown on first use and then reused: no allocation after
 * the first step. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "kn_multi.cuh"
#include "kn_vec.cuh"

namespace KN_NS {

/* dst = src converted, P a kn_pair<dst type, src type> (distinct types:
 * one of them 16-bit, so a pack is 8 elements). */
template <typename P>
__global__ void k_convert(typename P::first *dst, const typename P::second *src, size_t n, int vec)
{
    kn_for_packs<8>(n, [&](auto w, size_t i) {
        float v[KN_PACK_N(w)];
        kn_load(v, src + i, vec);
        kn_store(dst + i, v, vec);
    });
}

/* x rounded to T's precision, in place (fp32). */
template <typename T> __global__ void k_round(float *x, size_t n, int vec)
{
    kn_for_packs<4>(n, [&](auto w, size_t i) {
        float v[KN_PACK_N(w)];
        kn_load(v, x + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            v[k] = kn_round_to<T>(v[k]);
        kn_store(x + i, v, vec);
    });
}

template <typename D, typename S>
static void launch_convert(kn_ctx *c, void *dst, const void *src, size_t n)
{
    typedef kn_pair<D, S> P;
    KN_IO(k_convert<P>, n * sizeof(S), n * sizeof(D), 0);
    KN_LAUNCH(k_convert<P>, kn_pack_blocks(n, 8, 256), 256, 0, c, (D *)dst, (const S *)src, n,
              kn_aligned16(dst, src));
}
/* The 16-bit type that is not T. */
template <typename T> struct other16;
template <> struct other16<kn_bf16> {
    typedef kn_f16 type;
};
template <> struct other16<kn_f16> {
    typedef kn_bf16 type;
};

/* The source type picked, then the destination's: one of the two others
 * (equal types are a copy, cuda_convert), so only those pairs compile. */
template <typename S>
static void launch_convert_from(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, size_t n)
{
    if constexpr (sizeof(S) == 4) {
        if (dst_dt == KN_BF16)
            launch_convert<kn_bf16, S>(c, dst, src, n);
        else
            launch_convert<kn_f16, S>(c, dst, src, n);
    } else {
        if (dst_dt == KN_F32)
            launch_convert<float, S>(c, dst, src, n);
        else
            launch_convert<typename other16<S>::type, S>(c, dst, src, n);
    }
}

template <typename T> static void launch_round(kn_ctx *c, float *x, size_t n)
{
    KN_IO(k_round<T>, 4 * n, 4 * n, 0);
    KN_LAUNCH(k_round<T>, kn_pack_blocks(n, 4, 256), 256, 0, c, x, n, kn_aligned16(x));
}

static int dtype_ok(kn_ctx *c, kn_dtype dt, const char *op)
{
    if (dt == KN_F32 || dt == KN_BF16 || dt == KN_F16)
        return 1;
    kn_fail(c, TY_EINVAL, "%s: unknown dtype %d", op, (int)dt);
    return 0;
}

void cuda_convert(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt,
                  size_t n)
{
    if (!n || !dtype_ok(c, dst_dt, "convert") || !dtype_ok(c, src_dt, "convert"))
        return;
    if (dst_dt == src_dt) {
        if (dst != src)
            kn_cuda_ok(c, cudaMemcpyAsync(dst, src, n * kn_dtype_size(dst_dt),
                                          cudaMemcpyDeviceToDevice, kn_cuda_st(c)->stream),
                       "convert");
        return;
    }
    KN_BY_DTYPE(src_dt, launch_convert_from, c, dst, dst_dt, src, n);
}

/* ---- many spans in one launch (kn_convert_spans, kn_multi.cuh) -------- */

struct span_table {
    kn_multi_chunks ch;
    size_t dst[KN_MULTI_MAX], src[KN_MULTI_MAX], n[KN_MULTI_MAX];
};

template <typename P>
__global__ void k_convert_spans(typename P::first *dst, const typename P::second *src,
                                span_table t)
{
    kn_multi_for(
        t.ch, [&](int p) { return t.n[p]; },
        [&](int p, size_t i) {
            dst[t.dst[p] + i] = kn_as<typename P::first>(kn_f32(src[t.src[p] + i]));
        });
}

template <typename D, typename S>
static void launch_spans(kn_ctx *c, void *dst, const void *src, const kn_span *s, int ns)
{
    typedef kn_pair<D, S> P;
    span_table t;
    kn_multi_launches(
        &t.ch, ns, [&](int i) { return s[i].n; },
        [&](int p, int i) {
            t.dst[p] = s[i].dst;
            t.src[p] = s[i].src;
            t.n[p] = s[i].n;
        },
        [&]([[maybe_unused]] size_t total) {
            KN_IO(k_convert_spans<P>, total * sizeof(S), total * sizeof(D), 0);
            KN_LAUNCH(k_convert_spans<P>, kn_multi_grid(&t.ch), KN_MULTI_THREADS, 0, c, (D *)dst,
                      (const S *)src, t);
        });
}

template <typename S>
static void launch_spans_from(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src,
                              const kn_span *s, int ns)
{
    if constexpr (sizeof(S) == 4) {
        if (dst_dt == KN_BF16)
            launch_spans<kn_bf16, S>(c, dst, src, s, ns);
        else
            launch_spans<kn_f16, S>(c, dst, src, s, ns);
    } else {
        if (dst_dt == KN_F32)
            launch_spans<float, S>(c, dst, src, s, ns);
        else
            launch_spans<typename other16<S>::type, S>(c, dst, src, s, ns);
    }
}

void cuda_convert_spans(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt,
                        const kn_span *s, int ns)
{
    if (!dtype_ok(c, dst_dt, "convert_spans") || !dtype_ok(c, src_dt, "convert_spans"))
        return;
    if (dst_dt == src_dt) { /* copies */
        size_t es = kn_dtype_size(dst_dt);
        for (int i = 0; i < ns; i++)
            cuda_convert(c, (char *)dst + s[i].dst * es, dst_dt, (const char *)src + s[i].src * es,
                         src_dt, s[i].n);
        return;
    }
    KN_BY_DTYPE(src_dt, launch_spans_from, c, dst, dst_dt, src, s, ns);
}

void cuda_round(kn_ctx *c, float *x, size_t n, kn_dtype dt)
{
    if (!n || dt == KN_F32 || !dtype_ok(c, dt, "round"))
        return;
    KN_BY_DTYPE(dt, launch_round, c, x, n);
}

/* The context's fp32 copy of a 16-bit weight (scratch slot W32). */
static float *weight_f32(kn_ctx *c, kn_dtype dt, const void *w, size_t n)
{
    float *p = (float *)kn_cuda_scratch(c, KN_SCRATCH_W32, n * sizeof(float));
    if (p)
        cuda_convert(c, p, KN_F32, w, dt, n);
    return p;
}

/* ---- fp32 masters as bf16 hi + 16-bit lo (kn_master_split / join) ---- */

__global__ void k_master_split(uint16_t *hi, uint16_t *lo, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        split1(x[i], hi + i, lo + i);
}

__global__ void k_master_join(float *x, const uint16_t *hi, const uint16_t *lo, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = join1(hi[i], lo[i]);
}

void cuda_master_split(kn_ctx *c, uint16_t *hi, uint16_t *lo, const float *x, size_t n)
{
    KN_IO(k_master_split, 4 * n, 4 * n, 0);
    if (n)
        KN_LAUNCH(k_master_split, kn_blocks(n, 256), 256, 0, c, hi, lo, x, n);
}

void cuda_master_join(kn_ctx *c, float *x, const uint16_t *hi, const uint16_t *lo, size_t n)
{
    KN_IO(k_master_join, 4 * n, 4 * n, 0);
    if (n)
        KN_LAUNCH(k_master_join, kn_blocks(n, 256), 256, 0, c, x, hi, lo, n);
}

/* x[n] (fp32 holding values dt represents, as the engine guarantees) as dt
 * in scratch slot X16: exact, so the 16-bit product is the fp32 one up to
 * summation order. */
static const void *acts_16(kn_ctx *c, kn_dtype dt, const void *x, kn_dtype x_dt, size_t n)
{
    if (x_dt == dt)
        return x; /* already 16-bit (the op's x dtype) */
    void *p = kn_cuda_scratch(c, KN_SCRATCH_X16, n * 2);
    if (p)
        cuda_convert(c, p, dt, x, KN_F32, n);
    return p;
}

/* x (x_dt) as fp32 for the fp32 products of the mixed cases: x itself, or
 * widened into scratch slot X16 (then N x K floats). */
static const float *acts_32(kn_ctx *c, const void *x, kn_dtype x_dt, size_t n)
{
    if (x_dt == KN_F32)
        return (const float *)x;
    float *p = (float *)kn_cuda_scratch(c, KN_SCRATCH_X16, n * sizeof(float));
    if (p)
        cuda_convert(c, p, KN_F32, x, x_dt, n);
    return p;
}

/* x's dtype must be fp32 or the weights' (kn_ops.h). */
static int x_dtype_ok(kn_ctx *c, kn_dtype dt, kn_dtype x_dt)
{
    if (x_dt == KN_F32 || x_dt == dt)
        return 1;
    kn_fail(c, TY_EINVAL, "matmul16: x is %s but the weights are %s", kn_dtype_name(x_dt),
            kn_dtype_name(dt));
    return 0;
}

const void *kn_cuda_acts16(kn_ctx *c, kn_dtype dt, const float *x, size_t n)
{
    return acts_16(c, dt, x, KN_F32, n);
}

/* matmul16 with a 16-bit weight runs on the tensor cores: A = w and B = x
 * (converted to dt) in dt, fp32 accumulation, the result written directly
 * in out_dt (fp32, or rounded to dt by cuBLASLt's epilogue) with the bias
 * fused in the epilogue (in D's type: a 16-bit bias goes in as it is, an
 * fp32 one is converted). The one mixed case -- an fp32 weight with a
 * 16-bit result -- computes in fp32 scratch and converts. */
void cuda_matmul16_fwd(kn_ctx *c, kn_dtype dt, kn_dtype out_dt, kn_dtype x_dt, void *out,
                       const void *x_, const void *w, const void *bias_in, kn_dtype b_dt, int N,
                       int K, int M)
{
    if (N <= 0 || M <= 0 || !dtype_ok(c, dt, "matmul16") || !dtype_ok(c, out_dt, "matmul16 out") ||
        !x_dtype_ok(c, dt, x_dt) || !kn_bias_dtype_ok(c, dt, b_dt, "matmul16"))
        return;
    if (dt != KN_F32 && (out_dt == KN_F32 || out_dt == dt)) {
        const void *x16 = acts_16(c, dt, x_, x_dt, (size_t)N * K);
        if (x16)
            kn_cuda_gemm(c, out, out_dt, w, x16, dt, bias_in, b_dt, M, N, K, 1, 0, K, K, M, 0.0f);
        return;
    }
    const float *bias = kn_cuda_bias_f32(c, bias_in, b_dt, M);
    if (bias_in && !bias)
        return;
    const float *wf = dt == KN_F32 ? (const float *)w : weight_f32(c, dt, w, (size_t)M * K);
    const float *x = acts_32(c, x_, x_dt, (size_t)N * K);
    if (!wf || !x)
        return;
    if (out_dt == KN_F32) {
        cuda_matmul_fwd(c, (float *)out, x, wf, bias, N, K, M);
        return;
    }
    float *o32 = (float *)kn_cuda_scratch(c, KN_SCRATCH_O32, (size_t)N * M * sizeof(float));
    if (!o32)
        return;
    cuda_matmul_fwd(c, o32, x, wf, bias, N, K, M);
    cuda_convert(c, out, out_dt, o32, KN_F32, (size_t)N * M);
}

/* Backward with a 16-bit weight and a gradient of the same type: both
 * products on the tensor cores into the fp32 gradients (beta = 1, the
 * accumulate convention): dx^T += w^T dout^T, dw^T += x16^T dout; dbias is
 * a column sum read in dt. Other combinations widen what is 16-bit into
 * fp32 scratch and run the fp32 products. */
void cuda_matmul16_bwd(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype x_dt, float *dx,
                       float *dw, float *dbias, const void *dout, const void *x_, const void *w,
                       int N, int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0 || !dtype_ok(c, dt, "matmul16") ||
        !dtype_ok(c, dout_dt, "matmul16 dout") || !x_dtype_ok(c, dt, x_dt))
        return;
    if (dt != KN_F32 && dout_dt == dt) {
        if (dx)
            kn_cuda_gemm(c, dx, KN_F32, w, dout, dt, nullptr, KN_F32, K, N, M, 0, 0, K, M, K, 1.0f);
        const void *x16 = dw ? acts_16(c, dt, x_, x_dt, (size_t)N * K) : nullptr;
        if (dw && !x16)
            return;
        kn_cuda_gemm_dw(c, dw, dbias, x16, dout, dt, N, K, M);
        return;
    }
    const float *wf = dt == KN_F32 || !dx ? (const float *)w : weight_f32(c, dt, w, (size_t)M * K);
    const float *x = dw ? acts_32(c, x_, x_dt, (size_t)N * K) : nullptr;
    if (!wf || (dw && !x))
        return;
    const float *g = (const float *)dout;
    if (dout_dt != KN_F32) {
        float *g32 = (float *)kn_cuda_scratch(c, KN_SCRATCH_O32, (size_t)N * M * sizeof(float));
        if (!g32)
            return;
        cuda_convert(c, g32, KN_F32, dout, dout_dt, (size_t)N * M);
        g = g32;
    }
    cuda_matmul_bwd(c, dx, dw, dbias, g, x, wf, N, K, M);
}

/* The written dx: one GEMM with beta 0 where dout is in w's type (a
 * 16-bit run's tensor-core product, or fp32 with fp32), so dx is neither
 * cleared first nor read back, D in dx_dt (a 16-bit D rounded once from
 * the fp32 accumulator); other type pairs clear an fp32 dx (dx itself,
 * or scratch rounded into a 16-bit one) and accumulate. */
void cuda_matmul16_dx(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, kn_dtype dx_dt, void *dx,
                      const void *dout, const void *w, int N, int K, int M)
{
    if (N <= 0 || K <= 0 || !dtype_ok(c, dt, "matmul16") || !dtype_ok(c, dout_dt, "matmul16 dout") ||
        !kn_grad_dtype_ok(c, dt, dx_dt, "matmul16_dx"))
        return;
    if (M > 0 && dout_dt == dt) { /* dx^T[K,N] = w^T[K,M] dout^T[M,N] */
        kn_cuda_gemm(c, dx, dx_dt, w, dout, dt, nullptr, KN_F32, K, N, M, 0, 0, K, M, K, 0.0f);
        return;
    }
    size_t nk = (size_t)N * K;
    float *d = dx_dt == KN_F32 ? (float *)dx
                               : (float *)kn_cuda_scratch(c, KN_SCRATCH_DX32, nk * sizeof(float));
    if (!d)
        return;
    cuda_zero(c, d, nk);
    cuda_matmul16_bwd(c, dt, dout_dt, dt, d, nullptr, nullptr, dout, nullptr, w, N, K, M);
    if (d != dx)
        cuda_convert(c, dx, dx_dt, d, KN_F32, nk);
}

} // namespace KN_NS
