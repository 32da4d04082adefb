/* kn_async.cuh — copies from global to shared memory that run while the
 * block computes: PTX's cp.async (sm_80 and later), for kernels that stage
 * the next tile while they work on this one (the flash forward and dq).
 *
 * A thread issues 16-byte copies (kn_cp_async16), closes them into a
 * group (kn_cp_commit), and later waits until at most N of its newest
 * groups are still in flight (kn_cp_wait<N>); the copied bytes may be
 * read only after that wait, and by other threads only after a barrier
 * that follows it. Before sm_80 a copy is a plain load and store, and
 * commit and wait do nothing. The emulation (emu_cp_*, emu_runtime.cpp)
 * takes both ends of the window a GPU has: in its forward thread order a
 * copy lands only at the issuing thread's wait, so a read before the wait
 * sees stale shared memory; in the other orders it lands at once, so a
 * refill of a buffer other warps still read shows. */
#ifndef TY_KN_ASYNC_CUH
#define TY_KN_ASYNC_CUH

namespace KN_NS
{

/* 16 bytes, both ends 16-byte aligned; dst in shared memory. */
__device__ __forceinline__ void kn_cp_async16(void *dst, const void *src)
{
#ifdef KN_CUDA_EMU
    emu_cp_async16(dst, src);
#elif __CUDA_ARCH__ >= 800
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}

__device__ __forceinline__ void kn_cp_commit(void)
{
#ifdef KN_CUDA_EMU
    emu_cp_commit();
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void kn_cp_wait(void)
{
#ifdef KN_CUDA_EMU
    emu_cp_wait(N);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

} // namespace KN_NS

#endif
