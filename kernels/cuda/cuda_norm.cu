/* cuda_norm.cu — layernorm, rmsnorm and the embedding lookup.
 *
 * Row statistics: one block per row, the row's threads striding over C,
 * fp32 sums combined by shuffles in a fixed tree. Parameter gradients
 * are reductions over rows, with no float atomics: dw and db in two
 * stages over fixed slices of rows (cuda_colsum.cu), dtable by giving
 * each token's rows to one block, in row order (k_embedding_bwd).
 * Activations (x, out, the embedding table and its output) are of the op's
 * dtype, rounded to nearest even once per store, as the CPU backend. The
 * row kernels (the norms' forwards and dx) are templates on the storage
 * type with 16-byte packs (kn_vec.cuh); the column reductions and the
 * embedding read through load_as_f32 / store_from_f32 (kn_cuda16.cuh). */
#include "kn_cuda.cuh"
#include "kn_cuda16.cuh"
#include "kn_vec.cuh"

namespace KN_NS
{

#define ROW_THREADS 128

/* The rest of a layernorm row once each thread holds s, the sum of the
 * elements of src it visits: mean, variance (a second pass over src), the
 * normalised store and the saved statistics. Shared by k_layernorm_fwd and
 * k_add_layernorm_fwd, whose first passes differ (read x / add and store
 * res). Each thread reads back only the src elements it visited (the
 * same packs, kn_for_row). */
template <typename T>
__device__ __forceinline__ void layernorm_finish(T *out, float *mean, float *rstd, const T *src,
                                                 float s, const float *w, const float *b, int C,
                                                 float eps, int vec, float *sh)
{
    size_t off = (size_t)blockIdx.x * C;
    float mu = kn_block_sum(s, sh) / C;
    float q = 0;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        float x[KN_PACK_N(pw)];
        kn_load(x, src + off + i, vec);
        for (int k = 0; k < KN_PACK_N(pw); k++) {
            float d = x[k] - mu;
            q += d * d;
        }
    });
    float rs = rsqrtf(kn_block_sum(q, sh) / C + eps);
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        constexpr int V = KN_PACK_N(pw);
        float x[V], g[V], bb[V] = {};
        kn_load(x, src + off + i, vec);
        kn_load(g, w + i, vec);
        if (b)
            kn_load(bb, b + i, vec);
        for (int k = 0; k < V; k++)
            x[k] = (x[k] - mu) * rs * g[k] + bb[k];
        kn_store(out + off + i, x, vec);
    });
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = rs;
    }
}

/* The rest of an rmsnorm row once each thread holds q, the sum of squares
 * of the src elements it visits (k_rmsnorm_fwd, k_add_rmsnorm_fwd). */
template <typename T>
__device__ __forceinline__ void rmsnorm_finish(T *out, float *rstd, const T *src, float q,
                                               const float *w, int C, float eps, int vec,
                                               float *sh)
{
    size_t off = (size_t)blockIdx.x * C;
    float rs = rsqrtf(kn_block_sum(q, sh) / C + eps);
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        float x[KN_PACK_N(pw)], g[KN_PACK_N(pw)];
        kn_load(x, src + off + i, vec);
        kn_load(g, w + i, vec);
        for (int k = 0; k < KN_PACK_N(pw); k++)
            x[k] = g[k] * (x[k] * rs);
        kn_store(out + off + i, x, vec);
    });
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

/* Row kernels take 16-byte packs when every row starts on 16 bytes and
 * every pointer is aligned (kn_vec.cuh); the packs, and so the sums, are
 * the same either way. */
template <typename T, typename... P> static inline int row_vec(int C, const P *...p)
{
    return C % KN_VEC_W(T) == 0 && kn_aligned16(p...);
}

template <typename T>
__global__ void k_layernorm_fwd(T *out, float *mean, float *rstd, const T *x, const float *w,
                                const float *b, int C, float eps, int vec)
{
    __shared__ float sh[33];
    size_t off = (size_t)blockIdx.x * C;
    float s = 0;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        float v[KN_PACK_N(pw)];
        kn_load(v, x + off + i, vec);
        for (int k = 0; k < KN_PACK_N(pw); k++)
            s += v[k];
    });
    layernorm_finish(out, mean, rstd, x, s, w, b, C, eps, vec, sh);
}

/* dx for one row: dnorm = dout w, dx += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)).
 * has_mean 0 is rmsnorm (no centring, no mean(dnorm) term). dout is G:
 * fp32, or T itself. With a 16-bit
 * T, dout is read rounded to T and dx stored rounded to T (kernels.h);
 * dx_dt, when given, gets the stored values again in T, or, with no dx,
 * is dx itself, held in T. */
template <typename P> /* kn_pair<T, G> */
__global__ void k_norm_bwd_dx(float *dx, typename P::first *dx_dt, const typename P::second *dout,
                              const typename P::first *x, const float *w, const float *mean,
                              const float *rstd, int C, int has_mean, int vec)
{
    typedef typename P::first T;
    __shared__ float sh[33];
    size_t off = (size_t)blockIdx.x * C;
    float mu = has_mean ? mean[blockIdx.x] : 0.0f, rs = rstd[blockIdx.x];
    float s1 = 0, s2 = 0;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        constexpr int V = KN_PACK_N(pw);
        float d[V], g[V], v[V];
        kn_load(d, dout + off + i, vec);
        kn_load(g, w + i, vec);
        kn_load(v, x + off + i, vec);
        for (int k = 0; k < V; k++) {
            float dn = kn_round_to<T>(d[k]) * g[k];
            s1 += dn;
            s2 += dn * (v[k] - mu) * rs;
        }
    });
    float m1 = has_mean ? kn_block_sum(s1, sh) / C : 0.0f;
    float m2 = kn_block_sum(s2, sh) / C;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        constexpr int V = KN_PACK_N(pw);
        float d[V], g[V], v[V], o[V];
        kn_load(d, dout + off + i, vec);
        kn_load(g, w + i, vec);
        kn_load(v, x + off + i, vec);
        if (dx)
            kn_load(o, dx + off + i, vec);
        else
            kn_load(o, dx_dt + off + i, vec);
        for (int k = 0; k < V; k++) {
            float dn = kn_round_to<T>(d[k]) * g[k], xh = (v[k] - mu) * rs;
            o[k] = kn_round_to<T>(o[k] + rs * (dn - m1 - xh * m2));
        }
        if (dx)
            kn_store(dx + off + i, o, vec);
        if (dx_dt)
            kn_store(dx_dt + off + i, o, vec);
    });
}

/* Stage 1 of dw[c] += sum_n dout xhat, db[c] += sum_n dout (cuda_colsum.cu):
 * one tile of columns x a slice of rows; dw_dst / db_dst are the partials,
 * or the gradients themselves for a single slice (either may be NULL). */
__global__ void k_norm_bwd_dw(int dt, float *dw_dst, float *db_dst, const void *dout, int dout_dt,
                              const void *x, const float *mean, const float *rstd, int N, int C,
                              int rows)
{
    __shared__ float sh[KN_COLSUM_THREADS];
    int col = kn_colsum_col();
    long long end = (long long)(blockIdx.y + 1) * rows;
    float sw = 0, sb = 0;
    if (col < C)
        for (int n = kn_colsum_row0(rows); n < N && n < end; n += KN_COLSUM_LANES) {
            size_t i = (size_t)n * C + col;
            float d = round_as(dt, load_as_f32(dout, dout_dt, i));
            sw += d * ((load_as_f32(x, dt, i) - (mean ? mean[n] : 0.0f)) * rstd[n]);
            sb += d;
        }
    kn_colsum_store(sw, sh, dw_dst, C);
    kn_colsum_store(sb, sh, db_dst, C);
}

/* dw and db (either NULL) of a norm over x[N, C]: both stages. */
static void norm_bwd_dw(kn_ctx *c, kn_dtype dt, float *dw, float *db, const void *dout,
                        kn_dtype dout_dt, const void *x, const float *mean, const float *rstd,
                        int N, int C)
{
    kn_colsum_plan p = kn_cuda_colsum_plan(N);
    float *part = p.blocks > 1 ? kn_cuda_colsum_partials(c, db ? 2 : 1, C) : nullptr;
    if (p.blocks > 1 && !part)
        return;
    float *dw_dst = p.blocks > 1 && dw ? part : dw;
    float *db_dst = p.blocks > 1 && db ? part + (size_t)p.blocks * C : db;
    KN_IO(k_norm_bwd_dw, (size_t)N * C * (kn_dtype_size(dout_dt) + kn_dtype_size(dt)) +
        4 * (size_t)N * (mean ? 2 : 1) +
        (p.blocks > 1 ? 0 : 4 * (size_t)C * (!!dw + !!db)),
        4 * (size_t)C * (!!dw + !!db) * p.blocks, 0);
    KN_LAUNCH(k_norm_bwd_dw, kn_colsum_grid(p, C), KN_COLSUM_THREADS, 0, c, (int)dt, dw_dst, db_dst,
              dout, (int)dout_dt, x, mean, rstd, N, C, p.rows);
    if (p.blocks > 1)
        kn_cuda_colsum_finish(c, dw, db, part, p.blocks, C);
}

template <typename T>
static void launch_layernorm_fwd(kn_ctx *c, void *out, float *mean, float *rstd, const void *x,
                                 const float *w, const float *b, int N, int C, float eps)
{
    KN_IO(k_layernorm_fwd<T>, (size_t)N * C * sizeof(T) + 8 * (size_t)C,
        (size_t)N * C * sizeof(T) + 8 * (size_t)N, 0);
    KN_LAUNCH(k_layernorm_fwd<T>, N, ROW_THREADS, 0, c, (T *)out, mean, rstd, (const T *)x, w, b,
              C, eps, row_vec<T>(C, out, x, w, b));
}
void cuda_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *mean, float *rstd, const void *x,
                        const float *w, const float *b, int N, int C, float eps)
{
    if (N > 0 && C > 0)
        KN_BY_DTYPE(dt, launch_layernorm_fwd, c, out, mean, rstd, x, w, b, N, C, eps);
}

/* dx of either norm (mean null: rmsnorm); dx null: dx_dt holds it; dout
 * of type G. */
template <typename T, typename G>
static void launch_norm_bwd_dx_g(kn_ctx *c, float *dx, void *dx_dt, const void *dout,
                                 const void *x, const float *w, const float *mean,
                                 const float *rstd, int N, int C)
{
    typedef kn_pair<T, G> P;
    KN_IO(k_norm_bwd_dx<P>,
        (size_t)N * C * (sizeof(G) + sizeof(T) + (dx ? 4 : sizeof(T))) + 4 * (size_t)C +
            4 * (size_t)N * (mean ? 2 : 1),
        (size_t)N * C * ((dx ? 4 : 0) + (dx_dt ? sizeof(T) : 0)), 0);
    KN_LAUNCH(k_norm_bwd_dx<P>, N, ROW_THREADS, 0, c, dx, (T *)dx_dt, (const G *)dout,
              (const T *)x, w, mean, rstd, C, mean != nullptr,
              row_vec<T>(C, dx, dx_dt, dout, x, w));
}
template <typename T>
static void launch_norm_bwd_dx(kn_ctx *c, float *dx, void *dx_dt, const void *dout,
                               kn_dtype dout_dt, const void *x, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    if (dout_dt == KN_F32)
        launch_norm_bwd_dx_g<T, float>(c, dx, dx_dt, dout, x, w, mean, rstd, N, C);
    else
        launch_norm_bwd_dx_g<T, T>(c, dx, dx_dt, dout, x, w, mean, rstd, N, C);
}

void cuda_layernorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw, float *db,
                        const void *dout, kn_dtype dout_dt, const void *x, const float *w,
                        const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || !kn_grad_dtype_ok(c, dt, dout_dt, "norm backward")) return;
    if (dx || dx_dt)
        KN_BY_DTYPE(dt, launch_norm_bwd_dx, c, dx, dx_dt, dout, dout_dt, x, w, mean, rstd, N, C);
    if (dw || db)
        norm_bwd_dw(c, dt, dw, db, dout, dout_dt, x, mean, rstd, N, C);
}

template <typename T>
__global__ void k_rmsnorm_fwd(T *out, float *rstd, const T *x, const float *w, int C, float eps,
                              int vec)
{
    __shared__ float sh[33];
    size_t off = (size_t)blockIdx.x * C;
    float q = 0;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        float v[KN_PACK_N(pw)];
        kn_load(v, x + off + i, vec);
        for (int k = 0; k < KN_PACK_N(pw); k++)
            q += v[k] * v[k];
    });
    rmsnorm_finish(out, rstd, x, q, w, C, eps, vec, sh);
}

template <typename T>
static void launch_rmsnorm_fwd(kn_ctx *c, void *out, float *rstd, const void *x, const float *w,
                               int N, int C, float eps)
{
    KN_IO(k_rmsnorm_fwd<T>, (size_t)N * C * sizeof(T) + 4 * (size_t)C,
        (size_t)N * C * sizeof(T) + 4 * (size_t)N, 0);
    KN_LAUNCH(k_rmsnorm_fwd<T>, N, ROW_THREADS, 0, c, (T *)out, rstd, (const T *)x, w, C, eps,
              row_vec<T>(C, out, x, w));
}
void cuda_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *out, float *rstd, const void *x, const float *w,
                      int N, int C, float eps)
{
    if (N > 0 && C > 0)
        KN_BY_DTYPE(dt, launch_rmsnorm_fwd, c, out, rstd, x, w, N, C, eps);
}

void cuda_rmsnorm_bwd(kn_ctx *c, kn_dtype dt, float *dx, void *dx_dt, float *dw,
                      const void *dout, kn_dtype dout_dt, const void *x, const float *w,
                      const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || !kn_grad_dtype_ok(c, dt, dout_dt, "norm backward")) return;
    const float *no_mean = nullptr;
    float *no_db = nullptr;
    if (dx || dx_dt)
        KN_BY_DTYPE(dt, launch_norm_bwd_dx, c, dx, dx_dt, dout, dout_dt, x, w, no_mean, rstd, N,
                    C);
    if (dw)
        norm_bwd_dw(c, dt, dw, no_db, dout, dout_dt, x, no_mean, rstd, N, C);
}

/* ---- the residual add fused with the norm ------------------------------------

 * res = a + b (stored in dt), out = norm(res): one block per row, as the
 * norms above. Each thread keeps the sum it stored, rounded as stored, for
 * the statistics' first pass, and later passes read back only the res
 * elements it wrote itself (the same packs: no barrier needed, and the
 * same values and order of operations as k_add followed by
 * k_layernorm_fwd / k_rmsnorm_fwd: the same bits). What is saved against
 * the two kernels is one launch and one full read of res (the norm's
 * first pass). */

/* res = a + b over the thread's packs of the row, stored and rounded as
 * stored; each value also goes to fold(v). */
template <typename T, typename F>
__device__ __forceinline__ void add_row(T *res, const T *a, const T *b, int C, int vec, F &&fold)
{
    size_t off = (size_t)blockIdx.x * C;
    kn_for_row<KN_VEC_W(T)>(C, [&](auto pw, size_t i) {
        float u[KN_PACK_N(pw)], v[KN_PACK_N(pw)];
        kn_load(u, a + off + i, vec);
        kn_load(v, b + off + i, vec);
        for (int k = 0; k < KN_PACK_N(pw); k++) {
            u[k] = kn_round_to<T>(u[k] + v[k]);
            fold(u[k]);
        }
        kn_store(res + off + i, u, vec);
    });
}

template <typename T>
__global__ void k_add_layernorm_fwd(T *res, T *out, float *mean, float *rstd, const T *a,
                                    const T *b, const float *w, const float *bias, int C,
                                    float eps, int vec)
{
    __shared__ float sh[33];
    float s = 0;
    add_row(res, a, b, C, vec, [&](float v) { s += v; });
    layernorm_finish(out, mean, rstd, (const T *)res, s, w, bias, C, eps, vec, sh);
}

template <typename T>
__global__ void k_add_rmsnorm_fwd(T *res, T *out, float *rstd, const T *a, const T *b,
                                  const float *w, int C, float eps, int vec)
{
    __shared__ float sh[33];
    float q = 0;
    add_row(res, a, b, C, vec, [&](float v) { q += v * v; });
    rmsnorm_finish(out, rstd, (const T *)res, q, w, C, eps, vec, sh);
}

template <typename T>
static void launch_add_layernorm_fwd(kn_ctx *c, void *res, void *out, float *mean, float *rstd,
                                     const void *a, const void *b, const float *w,
                                     const float *bias, int N, int C, float eps)
{
    KN_IO(k_add_layernorm_fwd<T>, 2 * (size_t)N * C * sizeof(T) + 8 * (size_t)C,
        2 * (size_t)N * C * sizeof(T) + 8 * (size_t)N, 0);
    KN_LAUNCH(k_add_layernorm_fwd<T>, N, ROW_THREADS, 0, c, (T *)res, (T *)out, mean, rstd,
              (const T *)a, (const T *)b, w, bias, C, eps, row_vec<T>(C, res, out, a, b, w, bias));
}
void cuda_add_layernorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *mean, float *rstd,
                            const void *a, const void *b, const float *w, const float *bias, int N,
                            int C, float eps)
{
    if (N > 0 && C > 0)
        KN_BY_DTYPE(dt, launch_add_layernorm_fwd, c, res, out, mean, rstd, a, b, w, bias, N, C,
                    eps);
}

template <typename T>
static void launch_add_rmsnorm_fwd(kn_ctx *c, void *res, void *out, float *rstd, const void *a,
                                   const void *b, const float *w, int N, int C, float eps)
{
    KN_IO(k_add_rmsnorm_fwd<T>, 2 * (size_t)N * C * sizeof(T) + 4 * (size_t)C,
        2 * (size_t)N * C * sizeof(T) + 4 * (size_t)N, 0);
    KN_LAUNCH(k_add_rmsnorm_fwd<T>, N, ROW_THREADS, 0, c, (T *)res, (T *)out, rstd, (const T *)a,
              (const T *)b, w, C, eps, row_vec<T>(C, res, out, a, b, w));
}
void cuda_add_rmsnorm_fwd(kn_ctx *c, kn_dtype dt, void *res, void *out, float *rstd, const void *a,
                          const void *b, const float *w, int N, int C, float eps)
{
    if (N > 0 && C > 0)
        KN_BY_DTYPE(dt, launch_add_rmsnorm_fwd, c, res, out, rstd, a, b, w, N, C, eps);
}

/* ---- embedding ------------------------------------------------------------- */

__global__ void k_embedding_fwd(int dt, void *out, const int32_t *ids, const void *table, int N,
                                int C, int accumulate)
{
    size_t n_all = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, col = i % C;
        float v = load_as_f32(table, dt, (size_t)ids[n] * C + col);
        store_from_f32(out, dt, i, accumulate ? load_as_f32(out, dt, i) + v : v);
    }
}

/* dtable[ids[n], :] += dout[n, :]. Rows repeat ids, so the scatter is
 * made deterministic by giving each id's rows to one block, in row order
 * (the CPU backend's order: the same bits). k_embedding_links links every
 * row to the next row of its id (next[n], N at the end of the chain) and
 * marks the first row of each id (first[n]); it compares every pair of
 * ids through shared-memory tiles: N^2 comparisons, about 2.7e8 at
 * N = 16384, estimated at tens of microseconds on an H200, not measured
 * (a sort by id is the step for N in the 1e5s). k_embedding_bwd gives each first row's chain to a block: thread 0
 * gathers up to EMB_CHUNK of its rows into shared memory, then every
 * thread adds those rows of its columns into the token's row, in order. */
#define EMB_TILE 256
#define EMB_CHUNK 128

__global__ void k_embedding_links(int32_t *next, int32_t *first, const int32_t *ids, int N)
{
    __shared__ int32_t tile[EMB_TILE];
    for (int base = blockIdx.x * EMB_TILE; base < N; base += gridDim.x * EMB_TILE) {
        int tx = (int)threadIdx.x, n = base + tx;
        int32_t id = n < N ? ids[n] : 0;
        int nx = N, fst = 1;
        for (int t0 = 0; t0 < N; t0 += EMB_TILE) {
            if (t0 + tx < N) tile[tx] = ids[t0 + tx];
            __syncthreads();
            int len = N - t0 < EMB_TILE ? N - t0 : EMB_TILE;
            for (int j = 0; j < len; j++)
                if (tile[j] == id) {
                    fst &= t0 + j >= n;
                    nx = t0 + j > n && nx == N ? t0 + j : nx;
                }
            __syncthreads();
        }
        if (n < N) {
            next[n] = nx;
            first[n] = fst;
        }
    }
}

/* One chunk of a chain: row[] holds k rows of one id, in order. */
__device__ __forceinline__ void embedding_add_rows(float *trow, const float *dout, const int *row,
                                                   int k, int C)
{
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = trow[i];
        for (int j = 0; j < k; j++)
            v += dout[(size_t)row[j] * C + i];
        trow[i] = v;
    }
}

__global__ void k_embedding_bwd(float *dtable, const int32_t *next, const int32_t *first,
                                const int32_t *ids, const float *dout, int N, int C)
{
    __shared__ int row[EMB_CHUNK];
    __shared__ int chunk[2]; /* its rows, the chain's next row */
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        if (!first[n]) continue;
        float *trow = dtable + (size_t)ids[n] * C;
        for (int m = n; m < N;) {
            if (threadIdx.x == 0) {
                int k = 0;
                for (; k < EMB_CHUNK && m < N; m = next[m]) row[k++] = m;
                chunk[0] = k, chunk[1] = m;
            }
            __syncthreads();
            embedding_add_rows(trow, dout, row, chunk[0], C);
            m = chunk[1];
            __syncthreads(); /* row and chunk are refilled next */
        }
    }
}

void cuda_embedding_fwd(kn_ctx *c, kn_dtype dt, void *out, const int32_t *ids, const void *table,
                        int N, int C, int accumulate)
{
    KN_IO(k_embedding_fwd, 4 * (size_t)N + (size_t)N * C * kn_dtype_size(dt) * (accumulate ? 2 : 1),
        (size_t)N * C * kn_dtype_size(dt), 0);
    if (N > 0 && C > 0)
        KN_LAUNCH(k_embedding_fwd, kn_blocks((size_t)N * C, 256), 256, 0, c, (int)dt, out, ids,
                  table, N, C, accumulate);
}

void cuda_embedding_bwd(kn_ctx *c, float *dtable, const int32_t *ids, const float *dout, int N,
                        int C)
{
    if (N <= 0 || C <= 0 || !dtable) return;
    int32_t *next = (int32_t *)kn_cuda_scratch(c, KN_SCRATCH_LINKS, 8 * (size_t)N);
    if (!next) return;
    int32_t *first = next + N;
    KN_IO(k_embedding_links, 4 * (size_t)N, 8 * (size_t)N, 0);
    KN_LAUNCH(k_embedding_links, kn_blocks((size_t)N, EMB_TILE), EMB_TILE, 0, c, next, first, ids,
              N);
    /* dtable's rows counted once per row of ids: exact for distinct ids */
    KN_IO(k_embedding_bwd, 12 * (size_t)N + 8 * (size_t)N * C, 4 * (size_t)N * C, 0);
    unsigned threads = C < 128 ? (unsigned)(C + 31) / 32 * 32 : 128;
    KN_LAUNCH(k_embedding_bwd, kn_blocks((size_t)N, 1), threads, 0, c, dtable, next, first, ids,
              dout, N, C);
}

} // namespace KN_NS
