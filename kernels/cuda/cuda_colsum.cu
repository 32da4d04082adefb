/* cuda_colsum.cu — column sums over rows, the parameter gradients' reduction.
 *
 * A gradient of a per-column parameter (a bias, a norm's weight and bias)
 * sums an [N, C] tensor over its N rows. One thread per column walking
 * every row leaves the GPU idle at C = 768 (24 warps for 132 SMs), so the
 * sum runs in two stages (kn_cuda.cuh: the plan, the tile's end):
 *   1. a grid of tiles, KN_COLSUM_COLS columns x one slice of rows each,
 *      threads along the columns (a warp reads 128 contiguous bytes of a
 *      row) and KN_COLSUM_LANES row lanes, each lane summing its rows in
 *      order, the lanes added in lane order, one fp32 partial per (slice,
 *      column) into the context's scratch (KN_SCRATCH_COLSUM, sized once
 *      for the most slices);
 *   2. k_colsum_final: a thread per column adds its partials in slice
 *      order and adds the total into the gradient (the accumulate
 *      convention).
 * The slices are a function of N alone, so every run adds the same
 * numbers in the same order: deterministic without atomics. With a
 * single slice (N at most KN_COLSUM_MIN_ROWS) stage 1 adds into the
 * gradient itself and stage 2 is skipped. The norms' dw / db tile
 * (cuda_norm.cu) shares the plan, the scratch and stage 2; the bias
 * gradient (kn_cuda_colsum_acc, for cuda_matmul.cu, cuda_convert.cu and
 * cuda_matmul_gelu.cu) is here. */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"

namespace KN_NS {

kn_colsum_plan kn_cuda_colsum_plan(int N)
{
    int want = (N + KN_COLSUM_MIN_ROWS - 1) / KN_COLSUM_MIN_ROWS;
    int blocks = want < KN_COLSUM_BLOCKS ? (want > 0 ? want : 1) : KN_COLSUM_BLOCKS;
    int rows = (N + blocks - 1) / blocks;
    rows = rows > 0 ? rows : 1;
    kn_colsum_plan p = {(N + rows - 1) / rows, rows}; /* no empty last slice */
    p.blocks = p.blocks > 0 ? p.blocks : 1;
    return p;
}

float *kn_cuda_colsum_partials(kn_ctx *c, int sets, int C)
{
    return (float *)kn_cuda_scratch(c, KN_SCRATCH_COLSUM,
                                    (size_t)KN_COLSUM_BLOCKS * sets * C * sizeof(float));
}

/* The sum of column col's partials part[b * C + col], b in order. */
__device__ __forceinline__ float colsum_slices(const float *part, int blocks, int C, int col)
{
    float s = 0;
    for (int b = 0; b < blocks; b++)
        s += part[(size_t)b * C + col];
    return s;
}

__global__ void k_colsum_final(float *g0, float *g1, const float *part, int blocks, int C)
{
    for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < C; col += gridDim.x * blockDim.x) {
        if (g0) g0[col] += colsum_slices(part, blocks, C, col);
        if (g1) g1[col] += colsum_slices(part + (size_t)blocks * C, blocks, C, col);
    }
}

void kn_cuda_colsum_finish(kn_ctx *c, float *g0, float *g1, const float *part, int blocks, int C)
{
    KN_IO(k_colsum_final, 4 * (size_t)C * (!!g0 + !!g1) * (blocks + 1),
        4 * (size_t)C * (!!g0 + !!g1), 0);
    KN_LAUNCH(k_colsum_final, kn_blocks((size_t)C, 128), 128, 0, c, g0, g1, part, blocks, C);
}

/* Stage 1 of dbias: dout[N, M] is fp32 or 16-bit (dt). */
__global__ void k_colsum_partial(float *dst, const void *dout, int dt, int N, int M, int rows)
{
    __shared__ float sh[KN_COLSUM_THREADS];
    int col = kn_colsum_col();
    long long end = (long long)(blockIdx.y + 1) * rows;
    float s = 0;
    if (col < M)
        for (int n = kn_colsum_row0(rows); n < N && n < end; n += KN_COLSUM_LANES)
            s += load_as_f32(dout, dt, (size_t)n * M + col);
    kn_colsum_store(s, sh, dst, M);
}

void kn_cuda_colsum_acc(kn_ctx *c, float *dbias, const void *dout, int dt, int N, int M)
{
    if (N <= 0 || M <= 0)
        return;
    kn_colsum_plan p = kn_cuda_colsum_plan(N);
    float *dst = p.blocks > 1 ? kn_cuda_colsum_partials(c, 1, M) : dbias;
    if (!dst)
        return;
    KN_IO(k_colsum_partial,
        (size_t)N * M * kn_dtype_size((kn_dtype)dt) + (p.blocks > 1 ? 0 : 4 * (size_t)M),
        4 * (size_t)M * p.blocks, 0);
    KN_LAUNCH(k_colsum_partial, kn_colsum_grid(p, M), KN_COLSUM_THREADS, 0, c, dst, dout, dt, N, M,
              p.rows);
    if (p.blocks > 1)
        kn_cuda_colsum_finish(c, dbias, nullptr, dst, p.blocks, M);
}

} // namespace KN_NS
