/* kn_multi.cuh — many tensors in one launch.
 *
 * A step runs some elementwise ops over every tensor of the model (AdamW,
 * the 1-D weights' conversion to fp32): about 150 tensors, most of them a
 * few thousand elements, for which a launch of their own costs more than
 * their work. These ops launch one grid over up to KN_MULTI_MAX tensors
 * ("pieces") at a time, the way PyTorch's fused optimizers do: the table
 * of pieces travels by value as a kernel parameter (under the 4 KiB every
 * architecture takes), each piece is cut into chunks of KN_MULTI_CHUNK
 * elements, first[p] is piece p's first chunk and first[np] the launch's
 * total. A block takes chunk after chunk (grid-stride over chunks, so the
 * emulation's small grids cover them too), finds a chunk's piece by a
 * binary search over first[] and visits its elements a thread at a time.
 * Which thread touches which element changes nothing: every op here is
 * elementwise, so a piece gets the same bits as a launch of its own.
 * Include inside KN_NS. */
#ifndef TY_KN_MULTI_CUH
#define TY_KN_MULTI_CUH

#include "kn_cuda.cuh"

namespace KN_NS {

#define KN_MULTI_MAX 32
#define KN_MULTI_CHUNK 4096 /* 16 elements a thread at 256 threads */
#define KN_MULTI_THREADS 256

/* The chunks of a launch: first[p] <= chunk < first[p + 1] is in piece p. */
struct kn_multi_chunks {
    unsigned first[KN_MULTI_MAX + 1];
    int np;
};

__device__ __forceinline__ int kn_multi_piece(const kn_multi_chunks &t, unsigned chunk)
{
    int lo = 0, hi = t.np - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (t.first[mid] <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Calls f(p, i) for every element i of every piece p of the launch, n(p)
 * giving piece p's length. */
template <typename N, typename F>
__device__ __forceinline__ void kn_multi_for(const kn_multi_chunks &t, N n, F f)
{
    for (unsigned ch = blockIdx.x; ch < t.first[t.np]; ch += gridDim.x) {
        int p = kn_multi_piece(t, ch);
        size_t lo = (size_t)(ch - t.first[p]) * KN_MULTI_CHUNK, end = n(p);
        size_t hi = end - lo < KN_MULTI_CHUNK ? end : lo + KN_MULTI_CHUNK;
        for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
            f(p, i);
    }
}

/* Host side: items [0, count) in launches of up to KN_MULTI_MAX pieces,
 * those of no elements skipped. For each launch the chunk table t is
 * filled while put(p, i) fills the caller's slot p of its table with item
 * i, then launch(total) runs it (total: its elements). n(i) is item i's
 * element count. */
template <typename N, typename Put, typename Launch>
static inline void kn_multi_launches(kn_multi_chunks *t, int count, N n, Put put, Launch launch)
{
    int i = 0;
    while (i < count) {
        t->np = 0;
        t->first[0] = 0;
        size_t total = 0;
        for (; i < count && t->np < KN_MULTI_MAX; i++) {
            size_t k = n(i);
            if (!k)
                continue;
            put(t->np, i);
            t->first[t->np + 1] =
                t->first[t->np] + (unsigned)((k + KN_MULTI_CHUNK - 1) / KN_MULTI_CHUNK);
            t->np++;
            total += k;
        }
        if (t->np)
            launch(total);
    }
}

/* The grid for a table: a block a chunk, at most KN_MAX_BLOCKS. */
static inline unsigned kn_multi_grid(const kn_multi_chunks *t)
{
    unsigned n = t->first[t->np];
    return n < KN_MAX_BLOCKS ? (n ? n : 1) : KN_MAX_BLOCKS;
}

} // namespace KN_NS

#endif
