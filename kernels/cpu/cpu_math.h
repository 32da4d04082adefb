/* cpu_math.h — vectorisable exp, bf16 conversions, and the multi-ISA
 * attribute for hot loops.
 *
 * glibc's expf is a scalar call, so loops over it (softmax, cross-entropy,
 * gelu's tanh, silu) run one element at a time. cpu_expf is the classic
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial
 * for e^r (max error about 2 ulp), and 2^n built in the exponent bits; it
 * inlines into `omp simd` loops and vectorises. NaN stays NaN, so
 * non-finite checks still see bad inputs.
 *
 * CPU_HOT compiles a function for AVX-512, AVX2 and baseline x86-64 and
 * picks one at load time, so the library stays portable while hot loops
 * use the widest vectors the machine has. */
#ifndef TY_KERNELS_CPU_MATH_H
#define TY_KERNELS_CPU_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_HOT
#endif

/* fp32 -> bf16, round to nearest even (adding 0x7fff plus the lowest kept
 * bit carries into the exponent correctly up to inf); NaNs stay quiet
 * NaNs. And bf16 -> fp32, exact: the top half of an fp32. */
static inline uint16_t cpu_bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cpu_bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float cpu_expf(float x)
{
    /* Clamp to the finite range (comparisons keep NaN: both are false). */
    x = x > 88.3762626647949f ? 88.3762626647949f : x;
    x = x < -87.3365478515625f ? -87.3365478515625f : x;
    /* n = round(x / ln2) with the 1.5*2^23 trick: exact, branch-free. */
    const float shifter = 12582912.0f;
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = x - n * 0.693359375f; /* ln2 split in a short hi part... */
    r = r - n * -2.12194440e-4f;    /* ...and the rest */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n: n is in [-126, 127] after the clamp, so the biased exponent fits. */
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    int32_t ni = ti - 0x4B400000; /* integer n from the shifted float's bits */
    int32_t bits = (int32_t)((uint32_t)(ni + 127) << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
