/* cuda_elementwise.cu — the elementwise ops, the reductions to the host
 * (kn_sum, kn_sumsq, kn_nonfinite), GELU, SwiGLU and dropout.
 *
 * Elementwise kernels are grid-stride loops (any n with a bounded grid).
 * Reductions run in two passes with a fixed shape (KN_RED_BLOCKS x
 * KN_RED_THREADS, double accumulators): each thread sums a strided slice,
 * each block sums its threads by shuffles, and one block sums the block
 * partials in order — the same bits every run, no atomics. The result is
 * the one host read-back these ops need.
 * add, GELU, SwiGLU, GeGLU and dropout read and write activations of the
 * op's dtype; gradients are fp32. fill, scale, axpy, add and the
 * activations are templates on the storage type with 16-byte packs
 * (kn_vec.cuh); dropout reads through load_as_f32 / store_from_f32
 * (kn_cuda16.cuh). */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "kn_gelu.cuh"
#include "kn_vec.cuh"

namespace KN_NS {

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                         \
         i += (size_t)gridDim.x * blockDim.x)

/* fp32-only kernels: packs of 4 floats (kn_vec.cuh). */
__global__ void k_fill(float *x, size_t n, float v, int vec)
{
    kn_for_packs<4>(n, [&](auto w, size_t i) {
        float o[KN_PACK_N(w)];
        for (int k = 0; k < KN_PACK_N(w); k++)
            o[k] = v;
        kn_store(x + i, o, vec);
    });
}
__global__ void k_scale(float *x, size_t n, float s, int vec)
{
    kn_for_packs<4>(n, [&](auto w, size_t i) {
        float v[KN_PACK_N(w)];
        kn_load(v, x + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            v[k] *= s;
        kn_store(x + i, v, vec);
    });
}
__global__ void k_axpy(float *y, const float *x, size_t n, float a, int vec)
{
    kn_for_packs<4>(n, [&](auto w, size_t i) {
        float u[KN_PACK_N(w)], v[KN_PACK_N(w)];
        kn_load(u, y + i, vec);
        kn_load(v, x + i, vec);
        /* rounded product then rounded sum, as the CPU computes it: nvcc
         * would otherwise fuse them into one FMA, one rounding fewer */
        for (int k = 0; k < KN_PACK_N(w); k++)
            u[k] = __fadd_rn(u[k], __fmul_rn(a, v[k]));
        kn_store(y + i, u, vec);
    });
}
template <typename T> __global__ void k_add(T *out, const T *a, const T *b, size_t n, int vec)
{
    kn_for_packs<KN_VEC_W(T)>(n, [&](auto w, size_t i) {
        float u[KN_PACK_N(w)], v[KN_PACK_N(w)];
        kn_load(u, a + i, vec);
        kn_load(v, b + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            u[k] += v[k];
        kn_store(out + i, u, vec);
    });
}
template <typename T>
static void launch_add(kn_ctx *c, void *out, const void *a, const void *b, size_t n)
{
    KN_IO(k_add<T>, 2 * n * sizeof(T), n * sizeof(T), 0);
    KN_LAUNCH(k_add<T>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)out, (const T *)a,
              (const T *)b, n, kn_aligned16(out, a, b));
}

void cuda_zero(kn_ctx *c, float *x, size_t n)
{
    if (n)
        kn_cuda_ok(c, cudaMemsetAsync(x, 0, n * sizeof *x, kn_cuda_st(c)->stream), "zero");
}
void cuda_copy(kn_ctx *c, float *dst, const float *src, size_t n)
{
    if (n && dst != src)
        kn_cuda_ok(c, cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDeviceToDevice,
                                      kn_cuda_st(c)->stream), "copy");
}
void cuda_scale(kn_ctx *c, float *x, size_t n, float s)
{
    KN_IO(k_scale, 4 * n, 4 * n, 0);
    if (n)
        KN_LAUNCH(k_scale, kn_pack_blocks(n, 4, 256), 256, 0, c, x, n, s, kn_aligned16(x));
}
void cuda_axpy(kn_ctx *c, float *y, const float *x, size_t n, float a)
{
    KN_IO(k_axpy, 8 * n, 4 * n, 0);
    if (n)
        KN_LAUNCH(k_axpy, kn_pack_blocks(n, 4, 256), 256, 0, c, y, x, n, a, kn_aligned16(y, x));
}
void cuda_add(kn_ctx *c, kn_dtype dt, void *out, const void *a, const void *b, size_t n)
{
    if (n)
        KN_BY_DTYPE(dt, launch_add, c, out, a, b, n);
}

/* ---- reductions ---------------------------------------------------------- */

/* mode 0: sum, 1: sum of squares, 2: count of non-finite values, of
 * x[i] * s (an fp32 product; s = 1 is x). */
__global__ void k_reduce_partial(double *part, const float *x, size_t n, int mode, float s)
{
    __shared__ double sh[33];
    double acc = 0;
    GRID_STRIDE(i, n)
    {
        float v = x[i] * s;
        acc += mode == 0 ? (double)v : mode == 1 ? (double)v * v : (double)!isfinite(v);
    }
    acc = kn_block_sum(acc, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc;
}
__global__ void k_reduce_final(double *out, const double *part, int n)
{
    __shared__ double sh[33];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += part[i];
    acc = kn_block_sum(acc, sh);
    if (threadIdx.x == 0)
        *out = acc;
}

static double reduce(kn_ctx *c, const float *x, size_t n, int mode, float s)
{
    if (!n)
        return 0.0;
    cuda_state *st = kn_cuda_st(c);
    KN_IO(k_reduce_partial, 4 * n, 8 * KN_RED_BLOCKS, 0);
    KN_LAUNCH(k_reduce_partial, KN_RED_BLOCKS, KN_RED_THREADS, 0, c, st->red, x, n, mode, s);
    KN_IO(k_reduce_final, 8 * KN_RED_BLOCKS, 8, 0);
    KN_LAUNCH(k_reduce_final, 1, KN_RED_THREADS, 0, c, st->red + KN_RED_BLOCKS, st->red,
              KN_RED_BLOCKS);
    double r = 0;
    if (kn_cuda_ok(c, cudaMemcpyAsync(&r, st->red + KN_RED_BLOCKS, sizeof r,
                                      cudaMemcpyDeviceToHost, st->stream), "reduce read-back") ||
        kn_cuda_ok(c, cudaStreamSynchronize(st->stream), "reduce"))
        return 0.0;
    return r;
}
double cuda_sum(kn_ctx *c, const float *x, size_t n) { return reduce(c, x, n, 0, 1.0f); }
double cuda_sumsq(kn_ctx *c, const float *x, size_t n) { return reduce(c, x, n, 1, 1.0f); }
/* Inf / NaN propagates through the squares and the double sums. */
double cuda_sumsq_scaled(kn_ctx *c, const float *x, size_t n, float s)
{
    return reduce(c, x, n, 1, s);
}
int cuda_nonfinite(kn_ctx *c, const float *x, size_t n) { return reduce(c, x, n, 2, 1.0f) > 0; }

/* ---- activations ----------------------------------------------------------- */

template <typename T> __global__ void k_gelu_fwd(T *out, const T *x, size_t n, int vec)
{
    kn_for_packs<KN_VEC_W(T)>(n, [&](auto w, size_t i) {
        float v[KN_PACK_N(w)];
        kn_load(v, x + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            v[k] = kn_gelu(v[k]);
        kn_store(out + i, v, vec);
    });
}
template <typename T>
__global__ void k_gelu_bwd(float *dx, const float *dout, const T *x, size_t n, int vec)
{
    kn_for_packs<KN_VEC_W(T)>(n, [&](auto w, size_t i) {
        float d[KN_PACK_N(w)], v[KN_PACK_N(w)], g[KN_PACK_N(w)];
        kn_load(d, dout + i, vec);
        kn_load(v, x + i, vec);
        kn_load(g, dx + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            g[k] += kn_round_to<T>(d[k]) * kn_gelu_grad(v[k]);
        kn_store(dx + i, g, vec);
    });
}
template <typename T> static void launch_gelu_fwd(kn_ctx *c, void *out, const void *x, size_t n)
{
    KN_IO(k_gelu_fwd<T>, n * sizeof(T), n * sizeof(T), 0);
    KN_LAUNCH(k_gelu_fwd<T>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)out,
              (const T *)x, n, kn_aligned16(out, x));
}
template <typename T>
static void launch_gelu_bwd(kn_ctx *c, float *dx, const float *dout, const void *x, size_t n)
{
    KN_IO(k_gelu_bwd<T>, n * (8 + sizeof(T)), 4 * n, 0);
    KN_LAUNCH(k_gelu_bwd<T>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, dx, dout,
              (const T *)x, n, kn_aligned16(dx, dout, x));
}
void cuda_gelu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *x, size_t n)
{
    if (n)
        KN_BY_DTYPE(dt, launch_gelu_fwd, c, out, x, n);
}
void cuda_gelu_bwd(kn_ctx *c, kn_dtype dt, float *dx, const float *dout, const void *x, size_t n)
{
    if (n && dx)
        KN_BY_DTYPE(dt, launch_gelu_bwd, c, dx, dout, x, n);
}

/* The gated MLPs, one kernel pair for both: SwiGLU (Llama's MLP),
 * silu(gate) * up, and GeGLU (Gemma's), gelu_tanh(gate) * up. Each
 * gradient is written only where its pointer is set; a 16-bit T reads
 * dout rounded to T. */
enum { GATE_SILU, GATE_GELU };

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
template <int gate> __device__ __forceinline__ float gate_act(float g)
{
    return gate == GATE_SILU ? g * sigmoid(g) : kn_gelu(g);
}
/* The increments of dgate and dup for one element (dout d, gate g, up u). */
template <int gate>
__device__ __forceinline__ void gate_grads(float d, float g, float u, float *dg, float *du)
{
    if constexpr (gate == GATE_GELU) {
        *dg = d * u * kn_gelu_grad(g);
        *du = d * kn_gelu(g);
        return;
    }
    float s = sigmoid(g);
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}

template <typename T, int gate>
__device__ __forceinline__ void glu_fwd(T *out, const T *g, const T *u, size_t n, int vec)
{
    kn_for_packs<KN_VEC_W(T)>(n, [&](auto w, size_t i) {
        float a[KN_PACK_N(w)], b[KN_PACK_N(w)];
        kn_load(a, g + i, vec);
        kn_load(b, u + i, vec);
        for (int k = 0; k < KN_PACK_N(w); k++)
            a[k] = gate_act<gate>(a[k]) * b[k];
        kn_store(out + i, a, vec);
    });
}

/* The gradients stored as O: fp32, or T (each rounded once); dout read
 * as D: fp32, or T. */
template <typename T, typename O, typename D, int gate>
__device__ __forceinline__ void glu_bwd(O *dgate, O *dup, const D *dout, const T *g, const T *u,
                                        size_t n, int vec)
{
    kn_for_packs<KN_VEC_W(T)>(n, [&](auto w, size_t i) {
        constexpr int V = KN_PACK_N(w);
        float d[V], a[V], b[V], fg[V], fu[V];
        kn_load(d, dout + i, vec);
        kn_load(a, g + i, vec);
        kn_load(b, u + i, vec);
        for (int k = 0; k < V; k++)
            gate_grads<gate>(kn_round_to<T>(d[k]), a[k], b[k], &fg[k], &fu[k]);
        if (dgate)
            kn_store(dgate + i, fg, vec);
        if (dup)
            kn_store(dup + i, fu, vec);
    });
}

template <typename T>
__global__ void k_swiglu_fwd(T *out, const T *gate, const T *up, size_t n, int vec)
{
    glu_fwd<T, GATE_SILU>(out, gate, up, n, vec);
}
/* P: glu_io<gradient type, activation type, dout type>. */
template <typename O_, typename T_, typename D_> struct glu_io {
    typedef O_ O;
    typedef T_ T;
    typedef D_ D;
};
template <typename P>
__global__ void k_swiglu_bwd(typename P::O *dgate, typename P::O *dup, const typename P::D *dout,
                             const typename P::T *gate, const typename P::T *up, size_t n, int vec)
{
    glu_bwd<typename P::T, typename P::O, typename P::D, GATE_SILU>(dgate, dup, dout, gate, up, n,
                                                                    vec);
}
template <typename T>
__global__ void k_geglu_fwd(T *out, const T *gate, const T *up, size_t n, int vec)
{
    glu_fwd<T, GATE_GELU>(out, gate, up, n, vec);
}
template <typename P>
__global__ void k_geglu_bwd(typename P::O *dgate, typename P::O *dup, const typename P::D *dout,
                            const typename P::T *gate, const typename P::T *up, size_t n, int vec)
{
    glu_bwd<typename P::T, typename P::O, typename P::D, GATE_GELU>(dgate, dup, dout, gate, up, n,
                                                                    vec);
}

/* The bytes of a gated backward: dout (ds bytes an element), gate and up
 * read, each gradient that is set written (gs bytes an element). */
#define GLU_BWD_READ(n, ds, es) ((n) * ((ds) + 2 * (es)))
#define GLU_BWD_WRITTEN(n, gs, dg, du) ((n) * (gs) * (!!(dg) + !!(du)))

template <typename T>
static void launch_swiglu_fwd(kn_ctx *c, void *out, const void *gate, const void *up, size_t n)
{
    KN_IO(k_swiglu_fwd<T>, 2 * n * sizeof(T), n * sizeof(T), 0);
    KN_LAUNCH(k_swiglu_fwd<T>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)out,
              (const T *)gate, (const T *)up, n, kn_aligned16(out, gate, up));
}
template <typename T>
static void launch_geglu_fwd(kn_ctx *c, void *out, const void *gate, const void *up, size_t n)
{
    KN_IO(k_geglu_fwd<T>, 2 * n * sizeof(T), n * sizeof(T), 0);
    KN_LAUNCH(k_geglu_fwd<T>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (T *)out,
              (const T *)gate, (const T *)up, n, kn_aligned16(out, gate, up));
}
/* A gated backward, kernel K<P> for P = glu_io<O, T, D>: O the gradients'
 * type (fp32 or T), T the activations', D dout's (fp32 or T). */
#define GLU_BWD_LAUNCH(K)                                                                          \
    do {                                                                                           \
        KN_IO(K<P>, GLU_BWD_READ(n, sizeof(D), sizeof(T)),                                         \
              GLU_BWD_WRITTEN(n, sizeof(O), dgate, dup), 0);                                       \
        KN_LAUNCH(K<P>, kn_pack_blocks(n, KN_VEC_W(T), 256), 256, 0, c, (O *)dgate, (O *)dup,      \
                  (const D *)dout, (const T *)gate, (const T *)up, n,                              \
                  kn_aligned16(dgate, dup, dout, gate, up));                                       \
    } while (0)
template <int G, typename O, typename T, typename D>
static void launch_glu_bwd_as(kn_ctx *c, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n)
{
    typedef glu_io<O, T, D> P;
    if constexpr (G == GATE_SILU)
        GLU_BWD_LAUNCH(k_swiglu_bwd);
    else
        GLU_BWD_LAUNCH(k_geglu_bwd);
}
template <int G, typename T, typename D>
static void launch_glu_bwd_d(kn_ctx *c, kn_dtype g_dt, void *dgate, void *dup, const void *dout,
                             const void *gate, const void *up, size_t n)
{
    if (g_dt == KN_F32)
        launch_glu_bwd_as<G, float, T, D>(c, dgate, dup, dout, gate, up, n);
    else
        launch_glu_bwd_as<G, T, T, D>(c, dgate, dup, dout, gate, up, n);
}
template <int G, typename T>
static void launch_glu_bwd(kn_ctx *c, kn_dtype g_dt, void *dgate, void *dup, const void *dout,
                           kn_dtype dout_dt, const void *gate, const void *up, size_t n)
{
    if (dout_dt == KN_F32)
        launch_glu_bwd_d<G, T, float>(c, g_dt, dgate, dup, dout, gate, up, n);
    else
        launch_glu_bwd_d<G, T, T>(c, g_dt, dgate, dup, dout, gate, up, n);
}
template <typename T> static void launch_swiglu_bwd(kn_ctx *c, kn_dtype g_dt, void *dgate,
                                                    void *dup, const void *dout, kn_dtype dout_dt,
                                                    const void *gate, const void *up, size_t n)
{
    launch_glu_bwd<GATE_SILU, T>(c, g_dt, dgate, dup, dout, dout_dt, gate, up, n);
}
template <typename T> static void launch_geglu_bwd(kn_ctx *c, kn_dtype g_dt, void *dgate,
                                                   void *dup, const void *dout, kn_dtype dout_dt,
                                                   const void *gate, const void *up, size_t n)
{
    launch_glu_bwd<GATE_GELU, T>(c, g_dt, dgate, dup, dout, dout_dt, gate, up, n);
}

void cuda_swiglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
    if (n)
        KN_BY_DTYPE(dt, launch_swiglu_fwd, c, out, gate, up, n);
}
void cuda_swiglu_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup,
                     const void *dout, kn_dtype dout_dt, const void *gate, const void *up, size_t n)
{
    if (n && (dgate || dup) && kn_grad_dtype_ok(c, dt, g_dt, "swiglu backward") &&
        kn_grad_dtype_ok(c, dt, dout_dt, "swiglu backward"))
        KN_BY_DTYPE(dt, launch_swiglu_bwd, c, g_dt, dgate, dup, dout, dout_dt, gate, up, n);
}
void cuda_geglu_fwd(kn_ctx *c, kn_dtype dt, void *out, const void *gate, const void *up, size_t n)
{
    if (n)
        KN_BY_DTYPE(dt, launch_geglu_fwd, c, out, gate, up, n);
}
void cuda_geglu_bwd(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, void *dgate, void *dup,
                    const void *dout, kn_dtype dout_dt, const void *gate, const void *up, size_t n)
{
    if (n && (dgate || dup) && kn_grad_dtype_ok(c, dt, g_dt, "geglu backward") &&
        kn_grad_dtype_ok(c, dt, dout_dt, "geglu backward"))
        KN_BY_DTYPE(dt, launch_geglu_bwd, c, g_dt, dgate, dup, dout, dout_dt, gate, up, n);
}

/* ---- dropout: the CPU backend's counter-based mask, bit for bit ---------- */

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
__global__ void k_dropout_fwd(int xt, void *out, uint8_t *mask, const void *x, size_t n, float p,
                              uint64_t seed, uint64_t offset, float keep_scale)
{
    uint64_t key = mix64(seed);
    GRID_STRIDE(i, n)
    {
        uint64_t z = mix64(key + (offset + i + 1) * 0x9e3779b97f4a7c15ULL);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        uint8_t keep = u >= p;
        if (mask)
            mask[i] = keep;
        store_from_f32(out, xt, i, keep ? load_as_f32(x, xt, i) * keep_scale : 0.0f);
    }
}
__global__ void k_dropout_bwd(float *dx, const float *dout, const uint8_t *mask, size_t n,
                              float keep_scale)
{
    GRID_STRIDE(i, n) dx[i] += mask[i] ? dout[i] * keep_scale : 0.0f;
}
void cuda_dropout_fwd(kn_ctx *c, kn_dtype dt, void *out, uint8_t *mask, const void *x, size_t n,
                      float p, uint64_t seed, uint64_t offset)
{
    if (!n)
        return;
    if (p <= 0.0f) {
        if (out != x)
            kn_cuda_ok(c, cudaMemcpyAsync(out, x, n * kn_dtype_size(dt), cudaMemcpyDeviceToDevice,
                                          kn_cuda_st(c)->stream),
                       "dropout copy");
        if (mask)
            kn_cuda_ok(c, cudaMemsetAsync(mask, 1, n, kn_cuda_st(c)->stream), "dropout mask");
        return;
    }
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    KN_IO(k_dropout_fwd, n * kn_dtype_size(dt), n * kn_dtype_size(dt) + (mask ? n : 0), 0);
    KN_LAUNCH(k_dropout_fwd, kn_blocks(n, 256), 256, 0, c, (int)dt, out, mask, x, n, p, seed,
              offset, keep_scale);
}
void cuda_dropout_bwd(kn_ctx *c, float *dx, const float *dout, const uint8_t *mask, size_t n,
                      float p)
{
    if (!n || !dx)
        return;
    if (p <= 0.0f) {
        cuda_axpy(c, dx, dout, n, 1.0f);
        return;
    }
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    KN_IO(k_dropout_bwd, 9 * n, 4 * n, 0);
    KN_LAUNCH(k_dropout_bwd, kn_blocks(n, 256), 256, 0, c, dx, dout, mask, n, keep_scale);
}

/* ---- DoRA: the CPU's loops, one thread per row / column ------------------ */

__global__ void k_dora_norm(float *g, float *norm, const float *w, const float *d, const float *mag,
                            float s, int M, int K)
{
    GRID_STRIDE(o, (size_t)M)
    {
        const float *wr = w + o * K, *dr = d + o * K;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float v = wr[k] + s * dr[k];
            acc += v * v;
        }
        norm[o] = sqrtf(acc);
        if (g)
            g[o] = mag[o] / norm[o];
    }
}
__global__ void k_dora_fwd(float *out, float *z, const float *y, const float *b, const float *lr,
                           const float *g, float s, int N, int M)
{
    GRID_STRIDE(i, (size_t)N * M)
    {
        size_t o = i % (size_t)M;
        float yb = y ? y[i] : b ? out[i] - b[o] : out[i], l = lr[i];
        z[i] = yb + l * s;
        out[i] = out[i] + ((g[o] - 1.0f) * yb + (g[o] * l) * s);
    }
}
__global__ void k_dora_bwd(float *dlr, float *dy, float *dmag, const float *dout, const float *z,
                           const float *g, const float *norm, float s, int N, int M)
{
    GRID_STRIDE(o, (size_t)M)
    {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * M + o;
            if (dlr)
                dlr[i] = (dout[i] * g[o]) * s;
            if (dy)
                dy[i] = dout[i] * (g[o] - 1.0f);
            acc += dout[i] * z[i];
        }
        if (dmag)
            dmag[o] += acc / norm[o];
    }
}
void cuda_dora_norm(kn_ctx *c, float *g, float *norm, const float *w, const float *d,
                    const float *mag, float s, int M, int K)
{
    KN_IO(k_dora_norm, 8 * (size_t)M * K + (g ? 4 * (size_t)M : 0),
        4 * (size_t)M * (g ? 2 : 1), 0);
    if (M > 0)
        KN_LAUNCH(k_dora_norm, kn_blocks((size_t)M, 128), 128, 0, c, g, norm, w, d, mag, s, M, K);
}
void cuda_dora_fwd(kn_ctx *c, float *out, float *z, const float *y, const float *b, const float *lr,
                   const float *g, float s, int N, int M)
{
    size_t n = (size_t)N * M;
    KN_IO(k_dora_fwd, n * (y ? 12 : 8) + 4 * (size_t)M * (b && !y ? 2 : 1), 8 * n, 0);
    if (n)
        KN_LAUNCH(k_dora_fwd, kn_blocks(n, 256), 256, 0, c, out, z, y, b, lr, g, s, N, M);
}
void cuda_dora_bwd(kn_ctx *c, float *dlr, float *dy, float *dmag, const float *dout, const float *z,
                   const float *g, const float *norm, float s, int N, int M)
{
    KN_IO(k_dora_bwd, 8 * (size_t)N * M + 8 * (size_t)M + (dmag ? 4 * (size_t)M : 0),
        4 * (size_t)N * M * (!!dlr + !!dy) + (dmag ? 4 * (size_t)M : 0), 0);
    if (M > 0 && N > 0)
        KN_LAUNCH(k_dora_bwd, kn_blocks((size_t)M, 128), 128, 0, c, dlr, dy, dmag, dout, z, g, norm,
                  s, N, M);
}

} // namespace KN_NS
