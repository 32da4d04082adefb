/* kn_cuda.cuh — what every kernels/cuda source shares.
 *
 * One source, two compilers: nvcc builds it for the GPU (the `cuda`
 * backend); the host compiler builds it with KN_CUDA_EMU defined against
 * emu/cuda_emu.h (the test-only `cuda-emu` backend). The few places where
 * the two differ are the macros here:
 *   KN_LAUNCH(kernel, grid, block, smem, ctx, args...)  every launch; a
 *     refused launch becomes kn_fail on the context (sticky error).
 *   KN_DYN_SHARED(type, name)  the block's dynamic shared memory.
 *   KN_IO(kernel, read, write, flops)  before a KN_LAUNCH of kernel (the
 *     next launch of that name on the thread takes it): the bytes the
 *     launch reads and writes in global memory, each byte once, and its
 *     fp32 FLOPs (0 for elementwise work); the emulation records them under
 *     TY_EMU_COUNT and checks them against what the launch touched
 *     (kernels.cuda_emu.count), nvcc drops them. bench/engine-gpu/model.py
 *     turns a step's records into a modelled GPU time.
 *   KN_CUDA_BACKEND / KN_CUDA_NAME  the table symbol and its name.
 * Kernels are written as plain CUDA C otherwise: blockIdx/threadIdx,
 * __shared__, __syncthreads, warp shuffles, fp32 accumulation.
 *
 * Conventions (as the CPU backend): no float atomics anywhere, every output
 * element written by one thread, reductions in a fixed order, so results
 * are the same run to run; every *_bwd accumulates. */
#ifndef TY_KN_CUDA_CUH
#define TY_KN_CUDA_CUH

#ifdef KN_CUDA_EMU
#include "emu/cuda_emu.h"
#include "emu/emu_cublaslt.h"
#define KN_CUDA_BACKEND kn_cuda_emu_backend
#define KN_CUDA_NAME "cuda-emu"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
#define KN_CUDA_BACKEND kn_cuda_backend
#define KN_CUDA_NAME "cuda"
#include "cuda_lt.cuh" /* cuBLASLt through dlopen: calls go via kn_lt */
#endif

extern "C" {
#include "backend.h"
}

/* The two builds can meet in one program (a test binary of a CUDA build
 * links both tables), so each keeps its C++ symbols in its own namespace. */
#ifdef KN_CUDA_EMU
#define KN_NS kn_cuda_emu_ns
#else
#define KN_NS kn_cuda_ns
#endif
namespace KN_NS {

/* Context scratch slots (kn_cuda_scratch). */
enum { KN_SCRATCH_W32 = 0, /* fp32 copy of a 16-bit weight (matmul16, fp32 dout) */
       KN_SCRATCH_X16,     /* 16-bit copy of fp32 activations (native matmul16) */
       KN_SCRATCH_O32,     /* fp32 result / gradient of the mixed cases of matmul16 */
       KN_SCRATCH_NF4,     /* one dequantised NF4 weight, fp32 (cuda_nf4.cu) */
       KN_SCRATCH_BIAS16,  /* a bias in a 16-bit D's type (cuda_matmul.cu) */
       KN_SCRATCH_BIAS32,  /* a 16-bit bias widened for the fp32 routes (cuda_matmul.cu) */
       KN_SCRATCH_GEMM32,  /* the fp32 product of an unfused GEMM fallback (cuda_matmul.cu) */
       KN_SCRATCH_COLSUM,  /* per-slice column sums of the parameter gradients (cuda_colsum.cu) */
       KN_SCRATCH_LINKS,   /* the embedding backward's row chains (cuda_norm.cu) */
       KN_SCRATCH_ATTN_D,  /* the flash backward's row dots rowsum(dO * O) (cuda_attention.cu) */
       KN_SCRATCH_ATTN_DO, /* the flash backward's dO in 16 bits (cuda_attention.cu) */
       KN_SCRATCH_BGRAD,   /* a product's bias gradient from its epilogue (cuda_matmul.cu) */
       KN_SCRATCH_DX32,    /* the fp32 dx of a mixed-type 16-bit written dx (cuda_convert.cu) */
       KN_SCRATCH_SLOTS };

/* TY_CUDA_PROFILE: GPU time by launch name (cuda_profile.cu). open gives
 * NULL without the variable; begin / end bracket one launch on s. */
struct kn_prof;
kn_prof *kn_prof_open(int device);
void kn_prof_begin(kn_prof *p, cudaStream_t s);
void kn_prof_end(kn_prof *p, cudaStream_t s, const char *name);
void kn_prof_close(kn_prof *p);

/* Per-context state (ctx->impl). */
typedef struct cuda_state {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;                  /* cuBLASLt workspace, allocated once */
    size_t lt_ws_bytes;
    double *red;                  /* reduction partials + result, allocated once */
    struct cuda_gemm_plan *plans; /* cuda_matmul.cu: algorithms cached per shape */
    int n_plans, cap_plans;
    void *scratch[KN_SCRATCH_SLOTS]; /* kn_cuda_scratch: grown, never shrunk */
    size_t scratch_bytes[KN_SCRATCH_SLOTS];
    int cc_major, cc_minor;
    kn_prof *prof; /* NULL unless TY_CUDA_PROFILE is set */
} cuda_state;

static inline cuda_state *kn_cuda_st(kn_ctx *c) { return (cuda_state *)c->impl; }

/* Blocks of the two-pass reductions (kn_sum, kn_sumsq, kn_nonfinite), and
 * the most blocks a grid-stride launch uses. The emulation runs every
 * thread as a fiber, so by default it uses fewer, longer-lived threads:
 * the kernels are grid-stride, so any grid gives the same elements (the
 * reductions' last bits differ between the two builds, as their block
 * counts do). TY_EMU_GRID=real gives it the GPU's shapes (emu_grid_pick,
 * read once per process), so the grids the GPU launches run too. The
 * reduction partials (cuda_state.red) are sized for the largest. */
#define KN_RED_BLOCKS_MAX 256
#define KN_MAX_BLOCKS_GPU (65535u * 16)
#ifdef KN_CUDA_EMU
#define KN_RED_BLOCKS ((int)emu_grid_pick(8, KN_RED_BLOCKS_MAX))
#define KN_MAX_BLOCKS emu_grid_pick(16, KN_MAX_BLOCKS_GPU)
#else
#define KN_RED_BLOCKS KN_RED_BLOCKS_MAX
#define KN_MAX_BLOCKS KN_MAX_BLOCKS_GPU
#endif
#define KN_RED_THREADS 256

/* Records a runtime error on the context; returns 1 when there was one. */
static inline int kn_cuda_ok(kn_ctx *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    kn_fail(c, TY_EIO, "%s: %s", what, cudaGetErrorString(e));
    return 1;
}

#ifdef KN_CUDA_EMU
#define KN_LAUNCH(kernel, grid, block, smem, ctx, ...)                                             \
    do {                                                                                           \
        cuda_state *kn_st_ = kn_cuda_st(ctx);                                                      \
        if (kn_st_->prof)                                                                          \
            kn_prof_begin(kn_st_->prof, kn_st_->stream);                                           \
        KN_EMU_LAUNCH(kernel, grid, block, smem, kn_st_->stream, __VA_ARGS__);                     \
        kn_cuda_ok((ctx), cudaGetLastError(), "launch of " #kernel);                               \
        if (kn_st_->prof)                                                                          \
            kn_prof_end(kn_st_->prof, kn_st_->stream, #kernel);                                    \
    } while (0)
#define KN_DYN_SHARED(type, name) type *name = (type *)emu_dyn_shared()
#define KN_IO(kernel, read_bytes, write_bytes, simt_flops)                                         \
    emu_declare(#kernel, (uint64_t)(read_bytes), (uint64_t)(write_bytes), (uint64_t)(simt_flops))
#else
#define KN_LAUNCH(kernel, grid, block, smem, ctx, ...)                                             \
    do {                                                                                           \
        cuda_state *kn_st_ = kn_cuda_st(ctx);                                                      \
        if (kn_st_->prof)                                                                          \
            kn_prof_begin(kn_st_->prof, kn_st_->stream);                                           \
        kernel<<<(grid), (block), (smem), kn_st_->stream>>>(__VA_ARGS__);                          \
        kn_cuda_ok((ctx), cudaGetLastError(), "launch of " #kernel);                               \
        if (kn_st_->prof)                                                                          \
            kn_prof_end(kn_st_->prof, kn_st_->stream, #kernel);                                    \
    } while (0)
#define KN_DYN_SHARED(type, name)                                                                  \
    extern __shared__ __align__(16) unsigned char kn_dyn_smem_[];                                  \
    type *name = (type *)kn_dyn_smem_
#define KN_IO(kernel, read_bytes, write_bytes, simt_flops) ((void)0)
#endif

/* `#pragma unroll N` for nvcc; the host compiler of the emulation has no
 * such pragma. */
#ifdef KN_CUDA_EMU
#define KN_UNROLL(n)
#else
#define KN_PRAGMA_(x) _Pragma(#x)
#define KN_UNROLL(n) KN_PRAGMA_(unroll n)
#endif

static inline unsigned kn_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < KN_MAX_BLOCKS ? (b ? b : 1) : KN_MAX_BLOCKS);
}

/* Sum over a warp, every lane gets the total (fixed butterfly order). */
template <typename T> __device__ __forceinline__ T kn_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T kn_warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
 * every thread gets the total. Uses 33 slots of shared scratch `sh`. */
template <typename T> __device__ __forceinline__ T kn_block_sum(T v, T *sh)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = kn_warp_sum(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T t = lane < nw ? sh[lane] : (T)0;
    t = kn_warp_sum(t);
    __syncthreads(); /* sh may be reused by the caller's next reduction */
    return t;
}
template <typename T> __device__ __forceinline__ T kn_block_max(T v, T *sh)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = kn_warp_max(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T t = lane < nw ? sh[lane] : sh[0];
    t = kn_warp_max(t);
    __syncthreads();
    return t;
}

/* Column sums over rows (parameter gradients: dbias, the norms' dw / db),
 * in two stages with no float atomics (cuda_colsum.cu). The N rows are cut
 * into `blocks` slices of `rows` rows, a function of N alone
 * (kn_cuda_colsum_plan); a grid of KN_COLSUM_COLS-column x slice tiles
 * (threads along the columns, so a warp reads one row's 128 bytes, and
 * KN_COLSUM_LANES row lanes) writes one fp32 partial per (slice, column),
 * and k_colsum_final adds each column's partials in slice order into the
 * gradient. The partition never depends on timing, so a run repeats bit
 * for bit. One slice skips the second stage: the tile adds into the
 * gradient itself. The emulation uses fewer slices by default, as with
 * KN_RED_BLOCKS; TY_EMU_GRID=real gives it the GPU's. */
#define KN_COLSUM_COLS 32
#define KN_COLSUM_LANES 8
#define KN_COLSUM_THREADS (KN_COLSUM_COLS * KN_COLSUM_LANES)
#define KN_COLSUM_MIN_ROWS 32 /* the fewest rows given a slice of their own */
#define KN_COLSUM_BLOCKS_MAX 64
#ifdef KN_CUDA_EMU
#define KN_COLSUM_BLOCKS ((int)emu_grid_pick(8, KN_COLSUM_BLOCKS_MAX))
#else
#define KN_COLSUM_BLOCKS KN_COLSUM_BLOCKS_MAX
#endif

typedef struct kn_colsum_plan {
    int blocks; /* slices, at most KN_COLSUM_BLOCKS, none empty */
    int rows;   /* rows per slice (the last may have fewer) */
} kn_colsum_plan;

static inline dim3 kn_colsum_grid(kn_colsum_plan p, int C)
{
    return dim3((unsigned)((C + KN_COLSUM_COLS - 1) / KN_COLSUM_COLS), (unsigned)p.blocks);
}

/* The calling thread's column in its tile and its first row (lane). */
__device__ __forceinline__ int kn_colsum_col(void)
{
    return (int)(blockIdx.x * KN_COLSUM_COLS + threadIdx.x % KN_COLSUM_COLS);
}
__device__ __forceinline__ int kn_colsum_row0(int rows)
{
    return (int)(blockIdx.y * rows + threadIdx.x / KN_COLSUM_COLS);
}

/* The end of a tile: each thread holds s, the sum of its column over its
 * lane's rows (rows row0, row0 + KN_COLSUM_LANES, ... of the slice); the
 * lanes' sums are added in lane order and the tile's total stored: into
 * dst[blockIdx.y * C + col] (the partials) when the grid has several
 * slices, else added into dst[col] (the gradient). dst NULL stores
 * nothing. sh: KN_COLSUM_THREADS floats of shared memory. Every thread of
 * the block calls it (it holds barriers). */
__device__ __forceinline__ void kn_colsum_store(float s, float *sh, float *dst, int C)
{
    int tx = threadIdx.x % KN_COLSUM_COLS, col = kn_colsum_col();
    sh[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < KN_COLSUM_COLS && col < C && dst) {
        float t = sh[tx];
        for (int l = 1; l < KN_COLSUM_LANES; l++)
            t += sh[l * KN_COLSUM_COLS + tx];
        if (gridDim.y > 1)
            dst[(size_t)blockIdx.y * C + col] = t;
        else
            dst[col] += t;
    }
    __syncthreads(); /* sh may be reused by the caller's next column sum */
}

/* cuda_colsum.cu: the slices of an N-row column sum. */
kn_colsum_plan kn_cuda_colsum_plan(int N);
/* cuda_colsum.cu: the partials' scratch for `sets` column sums of C
 * columns (set s at s * blocks * C), sized for KN_COLSUM_BLOCKS slices;
 * NULL after a context error. */
float *kn_cuda_colsum_partials(kn_ctx *c, int sets, int C);
/* cuda_colsum.cu: the second stage: g0[col] += the sum over slices of
 * part[b * C + col], g1 likewise from part + blocks * C (either NULL). */
void kn_cuda_colsum_finish(kn_ctx *c, float *g0, float *g1, const float *part, int blocks, int C);

/* The ops, one per kn_ops.h entry, each with its kn_* signature. */
#define KN_CUDA_PROTO(ret, name, params, args) ret cuda_##name params;
KN_OPS(KN_CUDA_PROTO)
#undef KN_CUDA_PROTO

/* cuda_matmul.cu: releases the cached plans (cuda_backend.cu's close). */
void kn_cuda_gemm_plans_free(cuda_state *st);

/* cuda_backend.cu: the context's scratch slot, at least `bytes` long. It
 * grows on the first call that needs more (the first step, for the
 * engine) and is never shrunk, so a training loop allocates nothing after
 * its first step; its bytes count as device memory in use. NULL (and a
 * context error) when the device is out of memory. */
void *kn_cuda_scratch(kn_ctx *c, int slot, size_t bytes);

/* cuda_matmul.cu: D[m,n] (ld ldd, type dt_d, C = D) = op(A) op(B) + beta D
 * (+ bias[m], fp32, holding values dt_d represents), column-major, A and B
 * of type dt_ab; fp32 compute. Never refused: where cuBLASLt has no
 * algorithm, an unfused path computes the same (cuda_matmul.cu). */
void kn_cuda_gemm(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab,
                  const void *bias, int bias_dt, int m, int n, int k, int ta, int tb, int lda,
                  int ldb, int ldd, float beta);
/* cuda_matmul.cu: kn_cuda_gemm with cuBLASLt epilogue epi (a
 * cublasLtEpilogue_t: DEFAULT, BIAS, a GELU one or BGRADB) and, for the
 * GELU ones, the aux matrix (D's type, leading dimension ldaux). BGRADB
 * writes op(B)'s column sums into bias (D's type, n of them). 1: done; 0:
 * a GELU or BGRADB epilogue cuBLASLt has no algorithm for here (nothing
 * was run, no error: the caller runs its unfused path); -1: failed
 * (context error set). */
int kn_cuda_gemm_epi(kn_ctx *c, void *D, int dt_d, const void *A, const void *B, int dt_ab, int epi,
                     const void *bias, int bias_dt, const void *aux, int64_t ldaux, int m, int n,
                     int k, int ta, int tb, int lda, int ldb, int ldd, float beta);
/* cuda_matmul.cu: a bias of type bias_dt as fp32: itself, or widened into
 * scratch slot BIAS32; NULL for none, and after a context error. */
const float *kn_cuda_bias_f32(kn_ctx *c, const void *bias, int bias_dt, int m);
/* cuda_convert.cu: x[n] (fp32 holding dt values) as dt in scratch slot X16. */
const void *kn_cuda_acts16(kn_ctx *c, kn_dtype dt, const float *x, size_t n);
/* cuda_matmul.cu: a linear layer's dw[M,K] += dout[N,M]^T x[N,K] and
 * dbias[M] += column sums of dout (either NULL), x and dout of type dt_ab:
 * the sums from the product's BGRADB epilogue where cuBLASLt has one,
 * else kn_cuda_colsum_acc. */
void kn_cuda_gemm_dw(kn_ctx *c, float *dw, float *dbias, const void *x, const void *dout,
                     int dt_ab, int N, int K, int M);
/* cuda_colsum.cu: dbias[M] += column sums of dout[N,M] of type dt. */
void kn_cuda_colsum_acc(kn_ctx *c, float *dbias, const void *dout, int dt, int N, int M);

} // namespace KN_NS

#endif
