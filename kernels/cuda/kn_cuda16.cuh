/* kn_cuda16.cuh — bf16 / fp16 storage on the bits, for every kernel that
 * reads or writes 16-bit tensors (cuda_convert.cu, cuda_loss.cu,
 * cuda_matmul.cu, cuda_optim.cu). Written without cuda_fp16.h intrinsics so the GPU and
 * the emulation run the same arithmetic and both match the CPU backend bit
 * for bit (cuda_convert.cu says how each rounds). Include inside KN_NS. */
#ifndef TY_KN_CUDA16_CUH
#define TY_KN_CUDA16_CUH

#include "kn_cuda.cuh"

namespace KN_NS {

__device__ __forceinline__ uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
__device__ __forceinline__ float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__device__ __forceinline__ uint16_t to_bf16(float f)
{
    uint32_t u = f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float from_bf16(uint16_t h) { return bits_f((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t to_f16(float f)
{
    uint32_t u = f_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal: rebias the exponent, round to even */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) /* at most 2^-25: ties to even, i.e. to 0 */
        return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)e; /* 14..24: units of 2^-24 */
    uint32_t res = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1u)))
        res++;
    return (uint16_t)(sign | res);
}
__device__ __forceinline__ float from_f16(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f(s | 0x7f800000u | (m << 13));
    if (e)
        return bits_f(s | ((e + 112) << 23) | (m << 13));
    float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
    return s ? -f : f;
}

__device__ __forceinline__ float load_as_f32(const void *p, int dt, size_t i)
{
    if (dt == KN_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == KN_BF16 ? from_bf16(h) : from_f16(h);
}

/* v rounded to what dt holds, as fp32 (v itself for fp32). */
__device__ __forceinline__ float round_as(int dt, float v)
{
    if (dt == KN_F32)
        return v;
    return dt == KN_BF16 ? from_bf16(to_bf16(v)) : from_f16(to_f16(v));
}

/* Element i of a tensor of type dt, stored from fp32 (rounded to nearest
 * even when dt is 16-bit). */
__device__ __forceinline__ void store_from_f32(void *p, int dt, size_t i, float v)
{
    if (dt == KN_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == KN_BF16 ? to_bf16(v) : to_f16(v);
}

/* An fp32 master as kn_master_split keeps it, the CPU backend's rule bit
 * for bit (cpu.h): hi = RNE bf16, lo = the rest as int16, a tie kept at an
 * even hi moved one ulp towards it. join1 is the inverse. */
__device__ __forceinline__ void split1(float x, uint16_t *hi, uint16_t *lo)
{
    uint32_t u = f_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        *hi = (uint16_t)((u >> 16) | 0x40u);
        *lo = 0;
        return;
    }
    uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    int32_t d = (int32_t)(u - ((uint32_t)h << 16));
    if (d == 0x8000)
        d = 0x7fff;
    *hi = h;
    *lo = (uint16_t)(int16_t)d;
}
__device__ __forceinline__ float join1(uint16_t hi, uint16_t lo)
{
    return bits_f(((uint32_t)hi << 16) + (uint32_t)(int32_t)(int16_t)lo);
}

} // namespace KN_NS

#endif
