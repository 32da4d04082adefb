/* cuda_emu.h — just enough of CUDA for the host compiler to run kernels/cuda.
 *
 * Test-only. The .cu sources of kernels/cuda are compiled by g++ as C++ with
 * this header in place of cuda_runtime.h (kn_cuda.cuh picks it when
 * KN_CUDA_EMU is defined), so the kernels the GPU runs are the kernels the
 * CPU tests. A launch (KN_LAUNCH) runs the grid's blocks on OpenMP threads,
 * each block's threads as cooperative fibers (ucontext) of one OS thread:
 *  - __syncthreads() parks the fiber until every live thread of the block
 *    has arrived, so shared memory keeps its meaning;
 *  - between two such releases the runnable threads run one after another
 *    in the order TY_EMU_ORDER picks (forward, reverse, or a seeded
 *    shuffle), so a read of another thread's write that lacks a barrier
 *    gives a wrong value under some order instead of passing by luck;
 *  - __shared__ is `static thread_local`: one copy per OS thread, which runs
 *    one block at a time, so every thread of a block sees the same array;
 *  - warp operations (shuffles, __syncwarp, __ballot_sync) honour their
 *    mask: they park the fiber until every lane the mask names has posted,
 *    and abort, naming the kernel and the lanes, when the caller is not in
 *    its own mask, a shuffle reads a lane outside the mask, or the mask
 *    names a lane that has exited (a GPU returns garbage or hangs there);
 *  - warp matrix operations (nvcuda::wmma, emu_wmma.h, and PTX's
 *    mma.sync m16n8k16 with its documented register layout, emu_mma.h)
 *    are warp collectives on the same rules, with fp32 accumulation.
 * The runtime calls (cudaMalloc, copies, streams, device properties,
 * cudaFuncSetAttribute) are host versions in emu_runtime.cpp, which also
 * holds the launch rules a GPU enforces (dynamic shared memory limits);
 * cuBLASLt is emu_cublaslt.h, a CPU reference. Divergent barriers, which
 * hang a GPU, abort here with a message. */
#ifndef TY_CUDA_EMU_H
#define TY_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

/* ---- execution model ---------------------------------------------------- */

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* What a kernel reads (CUDA's uint3): a trivial type, so the thread-locals
 * need no dynamic initialisation wrapper. */
struct emu_uint3 {
    unsigned x, y, z;
};
emu_uint3 emu_thread_idx(void);
emu_uint3 emu_block_idx(void);
emu_uint3 emu_block_dim(void);
emu_uint3 emu_grid_dim(void);
void *emu_dyn_shared(void);

#define threadIdx (emu_thread_idx())
#define blockIdx (emu_block_idx())
#define blockDim (emu_block_dim())
#define gridDim (emu_grid_dim())
#define warpSize 32

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__
#define __align__(n) alignas(n)

void __syncthreads(void);

/* cp.async (kn_async.cuh): a 16-byte copy taken now and, in the forward
 * thread order, held back until this thread's emu_cp_wait(n) releases its
 * group (commit closes the group, wait lands every committed group but the
 * newest n), so a read before its wait sees stale bytes; in the other
 * orders it lands at once, so a refill of a tile other warps still read
 * (a missing barrier) shows. */
void emu_cp_async16(void *dst, const void *src);
void emu_cp_commit(void);
void emu_cp_wait(int n);

/* Runs body once per thread of every block of `kernel` (its name and
 * address, for messages and for its cudaFuncSetAttribute limit); returns
 * 0, or -1 after a launch the GPU would refuse (empty grid, more than 1024
 * threads). Dynamic shared memory above the kernel's limit aborts. */
int emu_launch(const char *kernel, const void *fn, dim3 grid, dim3 block, size_t dyn_smem,
               const std::function<void()> &body);
/* TY_EMU_GRID: `small` (default) picks small, `real` the GPU's value, for
 * the grid shapes of kn_cuda.cuh (KN_MAX_BLOCKS, KN_RED_BLOCKS). */
unsigned emu_grid_pick(unsigned small, unsigned real);
/* The emulated device is working (TY_EMU_GUARD: device blocks readable)
 * between enter and leave; nests. emu_device_guard scopes it. */
void emu_device_enter(void);
void emu_device_leave(void);
struct emu_device_guard {
    emu_device_guard()
    {
        emu_device_enter();
    }
    ~emu_device_guard()
    {
        emu_device_leave();
    }
    emu_device_guard(const emu_device_guard &) = delete;
    emu_device_guard &operator=(const emu_device_guard &) = delete;
};

/* The warp operations: each posts 8 bytes for this lane, waits until
 * every lane `mask` names has posted in the same operation with the same
 * mask, and returns what the operation gives this lane (a shuffle: lane
 * src's posted value; a ballot: the mask of lanes that posted non-zero). */
enum { EMU_WARP_SHFL, EMU_WARP_SYNC, EMU_WARP_BALLOT };
uint64_t emu_warp_op(int kind, const char *what, unsigned mask, uint64_t mine, int src_lane);
int emu_lane(void);

template <typename T> static inline uint64_t emu_to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T> static inline T emu_from_bits(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}
/* Lanes are grouped in segments of `width` (a power of two <= 32) as on
 * the GPU; a source outside the segment returns the caller's own value. */
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int width = 32)
{
    int lane = emu_lane(), src = lane ^ x;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu_from_bits<T>(emu_warp_op(EMU_WARP_SHFL, "__shfl_xor_sync", m, emu_to_bits(v), src));
}
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int width = 32)
{
    int lane = emu_lane(), src = lane + (int)d;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu_from_bits<T>(emu_warp_op(EMU_WARP_SHFL, "__shfl_down_sync", m, emu_to_bits(v), src));
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int src, int width = 32)
{
    int lane = emu_lane();
    src = (lane & ~(width - 1)) + (src & (width - 1));
    return emu_from_bits<T>(emu_warp_op(EMU_WARP_SHFL, "__shfl_sync", m, emu_to_bits(v), src));
}
static inline void __syncwarp(unsigned m = 0xffffffffu)
{
    emu_warp_op(EMU_WARP_SYNC, "__syncwarp", m, 0, emu_lane());
}
static inline unsigned __ballot_sync(unsigned m, int pred)
{
    return (unsigned)emu_warp_op(EMU_WARP_BALLOT, "__ballot_sync", m, pred != 0, emu_lane());
}

/* ---- vector types -------------------------------------------------------- */

/* CUDA's uint4, the 16-byte word of the vectorised kernels (kn_vec.cuh):
 * 16-byte aligned as on the GPU, and may_alias, since the kernels load
 * and store tensors of float or 16-bit values through it. */
struct __attribute__((may_alias, aligned(16))) uint4 {
    unsigned x, y, z, w;
};

/* ---- device math ---------------------------------------------------------- */

static inline float rsqrtf(float x)
{
    return 1.0f / std::sqrt(x);
}
/* Round-to-nearest operations that nvcc never fuses (the host build does
 * not fuse either: ISO C++ mode, -ffp-contract=off). */
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
using std::isfinite;
using std::isnan;

/* ---- runtime API subset ---------------------------------------------------- */

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100
};
typedef struct emu_stream *cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
};
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlockOptin;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t st);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetLastError(void);
/* Events for timing (cuda_profile.cu): launches run when they are issued,
 * so an event records the host's clock when it is recorded. */
typedef struct emu_event *cudaEvent_t;
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
/* Only cudaFuncAttributeMaxDynamicSharedMemorySize: the kernel's limit on
 * dynamic shared memory (48 KiB until raised, at most 227 KiB), which
 * emu_launch enforces. The template takes a kernel as nvcc's does. */
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
cudaError_t cudaFuncSetAttribute(const void *f, int attr, int value);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *f, int attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(f), attr, value);
}
const char *cudaGetErrorString(cudaError_t e);
/* emu_launch records a refused launch here, for cudaGetLastError. */
void emu_set_last_error(cudaError_t e);

#define KN_EMU_LAUNCH(kernel, grid, block, smem, stream, ...)                                      \
    do {                                                                                           \
        (void)(stream);                                                                            \
        if (emu_launch(#kernel, reinterpret_cast<const void *>(&kernel), (grid), (block), (smem),  \
                       [&]() { kernel(__VA_ARGS__); }))                                            \
            emu_set_last_error(cudaErrorInvalidConfiguration);                                     \
    } while (0)

/* ---- counting (TY_EMU_COUNT, emu_count.cpp) -------------------------------- */

#include "emu_count.h"

bool emu_count_on(void);
bool emu_count_mem_on(void);
/* The bytes the next launch of `kernel` on this thread reads and writes in
 * global memory, and its fp32 FLOPs outside cuBLASLt (KN_IO). A launch of
 * another name drops it. */
void emu_declare(const char *kernel, uint64_t read_bytes, uint64_t write_bytes,
                 uint64_t simt_flops);
/* Warp matrix (wmma) FLOPs of the running launch: emu_wmma.h's mma_sync. */
void emu_count_mma(uint64_t flops);
void emu_count_region_add(void *p, size_t mapped, size_t bytes);
void emu_count_region_remove(void *p);
/* One record: opened before a launch (or matmul, memset, copy) runs,
 * written when it ends. Does nothing unless TY_EMU_COUNT is set. */
struct emu_count_scope {
    bool active;
    emu_count_rec rec;
    emu_count_scope(const char *name, dim3 grid, dim3 block);
    ~emu_count_scope();
    emu_count_scope(const emu_count_scope &) = delete;
    emu_count_scope &operator=(const emu_count_scope &) = delete;
};

/* Free and total bytes of the emulated device (emu_runtime.cpp says how). */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

/* ---- warp matrix operations (mma.h) ------------------------------------------ */

#include "emu_wmma.h"
#include "emu_mma.h"

#endif
