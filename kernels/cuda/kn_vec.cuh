/* kn_vec.cuh — dtype-templated elementwise and row kernels with 16-byte
 * loads and stores.
 *
 * A kernel that reads or writes activations of the op's dtype is a
 * template on the storage type T (float, kn_bf16, kn_f16), picked once per
 * launch on the host (KN_BY_DTYPE), so no element access branches on the
 * dtype. Its elements go in packs of KN_VEC_W(T) = 16 / sizeof(T) (4
 * floats, 8 halves): a pack of every tensor the kernel touches is one or
 * two 16-byte loads or stores (uint4) when `vec` is set, one element at a
 * time otherwise. The host sets `vec` when every pointer is 16-byte
 * aligned (and, for row kernels, when each row starts on 16 bytes:
 * C % KN_VEC_W(T) == 0); the n % W elements past the last whole pack go
 * one by one. Which thread visits which elements, and in which order it
 * accumulates them, does not depend on `vec`: a row's statistics have the
 * same bits on either path, so an aligned and an offset view of one
 * tensor give the same results, and a fused add + norm stays bit-equal to
 * the two ops whatever their alignments (kernels.table_add_norm).
 * The 16-bit types are the bits (kn_cuda16.cuh's conversions), not
 * cuda_fp16.h's, for the same reason as there: GPU, emulation and CPU
 * backend round alike. Include inside KN_NS after kn_cuda16.cuh. */
#ifndef TY_KN_VEC_CUH
#define TY_KN_VEC_CUH

#include "kn_cuda16.cuh"

namespace KN_NS {

/* 16-bit storage, one value's bits. */
struct kn_bf16 {
    uint16_t bits;
};
struct kn_f16 {
    uint16_t bits;
};

__device__ __forceinline__ float kn_f32(float v) { return v; }
__device__ __forceinline__ float kn_f32(kn_bf16 v) { return from_bf16(v.bits); }
__device__ __forceinline__ float kn_f32(kn_f16 v) { return from_f16(v.bits); }

/* fp32 to storage type T, rounded to nearest even. */
template <typename T> __device__ __forceinline__ T kn_as(float v);
template <> __device__ __forceinline__ float kn_as<float>(float v) { return v; }
template <> __device__ __forceinline__ kn_bf16 kn_as<kn_bf16>(float v) { return {to_bf16(v)}; }
template <> __device__ __forceinline__ kn_f16 kn_as<kn_f16>(float v) { return {to_f16(v)}; }

/* v rounded to T's precision, as fp32. */
template <typename T> __device__ __forceinline__ float kn_round_to(float v)
{
    return kn_f32(kn_as<T>(v));
}

/* Two storage types as one template argument (a kernel has one, so that
 * KN_LAUNCH / KN_IO name it as written). */
template <typename A, typename B> struct kn_pair {
    typedef A first;
    typedef B second;
};

/* Elements per pack: one 16-byte access of T. */
#define KN_VEC_W(T) ((int)(16 / sizeof(T)))

/* A pack width as a type, so one generic lambda body serves the packs and
 * the one-element tail (kn_for_packs, kn_for_row). */
template <int W> struct kn_w {
    static constexpr int n = W;
};

/* W elements at p as fp32: 16-byte loads when vec (p then 16-byte
 * aligned, and W elements a whole number of 16-byte words). */
template <int W, typename T>
__device__ __forceinline__ void kn_load(float (&v)[W], const T *p, int vec)
{
    if constexpr (W * sizeof(T) % 16 == 0) {
        if (vec) {
            T raw[W];
            for (int k = 0; k < (int)(W * sizeof(T) / 16); k++) {
                uint4 u = ((const uint4 *)p)[k];
                memcpy((char *)raw + 16 * k, &u, 16);
            }
            for (int k = 0; k < W; k++)
                v[k] = kn_f32(raw[k]);
            return;
        }
    }
    for (int k = 0; k < W; k++)
        v[k] = kn_f32(p[k]);
}

/* W fp32 values stored at p as T (kn_load's rule for vec). */
template <int W, typename T>
__device__ __forceinline__ void kn_store(T *p, const float (&v)[W], int vec)
{
    T raw[W];
    for (int k = 0; k < W; k++)
        raw[k] = kn_as<T>(v[k]);
    if constexpr (W * sizeof(T) % 16 == 0) {
        if (vec) {
            for (int k = 0; k < (int)(W * sizeof(T) / 16); k++) {
                uint4 u;
                memcpy(&u, (const char *)raw + 16 * k, 16);
                ((uint4 *)p)[k] = u;
            }
            return;
        }
    }
    for (int k = 0; k < W; k++)
        p[k] = raw[k];
}

/* body(kn_w<W>(), i) for the packs i = 0, W, 2W, ... of [0, n), grid-stride,
 * then body(kn_w<1>(), i) for the n % W elements after them. */
template <int W, typename F> __device__ __forceinline__ void kn_for_packs(size_t n, F &&body)
{
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, whole = n / W;
    for (size_t p = first; p < whole; p += stride)
        body(kn_w<W>(), p * W);
    for (size_t i = whole * W + first; i < n; i += stride)
        body(kn_w<1>(), i);
}

/* The same over one row of C elements by the block's threads (one block
 * per row): thread t takes packs t, t + blockDim.x, ..., then at most one
 * tail element (C % W < W <= blockDim.x). */
template <int W, typename F> __device__ __forceinline__ void kn_for_row(int C, F &&body)
{
    int whole = C / W;
    for (int p = threadIdx.x; p < whole; p += blockDim.x)
        body(kn_w<W>(), (size_t)p * W);
    for (int i = whole * W + threadIdx.x; i < C; i += blockDim.x)
        body(kn_w<1>(), (size_t)i);
}

/* The elements of one pack as a constant: inside a kn_for_* body. */
#define KN_PACK_N(w) decltype(w)::n

/* Host side: every pointer 16-byte aligned (null ones count as aligned). */
template <typename... P> static inline int kn_aligned16(const P *...p)
{
    return ((((uintptr_t)p) % 16 == 0) && ...);
}

/* Blocks of `threads` for n elements in packs of W (grid-stride beyond). */
static inline unsigned kn_pack_blocks(size_t n, int W, unsigned threads)
{
    return kn_blocks((n + W - 1) / W, threads);
}

/* fn<T>(args...) for the storage type of dt (fp32 for anything not 16-bit). */
#define KN_BY_DTYPE(dt, fn, ...)                                                                   \
    ((dt) == KN_BF16 ? fn<kn_bf16>(__VA_ARGS__)                                                    \
                     : (dt) == KN_F16 ? fn<kn_f16>(__VA_ARGS__) : fn<float>(__VA_ARGS__))

} // namespace KN_NS

#endif
