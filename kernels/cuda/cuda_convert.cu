/* cuda_convert.cu — fp32 <-> bf16 / fp16 storage, and matmul16.
 *
 * The conversions are written on the bits (no cuda_fp16.h intrinsics), so
 * the GPU and the emulation run the same arithmetic and both match the CPU
 * backend bit for bit: bf16 narrowing adds 0x7fff plus the lowest kept bit
 * (round-to-nearest-even, carrying into the exponent up to inf), NaNs made
 * quiet; fp16 narrowing is IEEE binary16 round-to-nearest-even with
 * overflow to inf and subnormals kept, NaN quiet with its top payload bits
 * (what x86's F16C conversion gives the CPU backend).
 * matmul16 converts the 16-bit weight to fp32 in a scratch buffer owned by
 * the context (grown to the largest weight on first use, then reused: no
 * allocation in the steady state) and runs the fp32 cuBLASLt product —
 * the CPU backend's fallback scheme. Native bf16/fp16 cuBLASLt with the
 * activations in 16 bits is the next step with the mixed-precision storage
 * of activations. */
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

__global__ void k_convert(void *dst, int ddt, const void *src, int sdt, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = load_as_f32(src, sdt, i);
        if (ddt == KN_F32)
            ((float *)dst)[i] = v;
        else
            ((uint16_t *)dst)[i] = ddt == KN_BF16 ? to_bf16(v) : to_f16(v);
    }
}

__global__ void k_round(float *x, size_t n, int dt)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = dt == KN_BF16 ? from_bf16(to_bf16(x[i])) : from_f16(to_f16(x[i]));
}

static int dtype_ok(kn_ctx *c, kn_dtype dt, const char *op)
{
    if (dt == KN_F32 || dt == KN_BF16 || dt == KN_F16)
        return 1;
    kn_fail(c, TY_EINVAL, "%s: unknown dtype %d", op, (int)dt);
    return 0;
}

void cuda_convert(kn_ctx *c, void *dst, kn_dtype dst_dt, const void *src, kn_dtype src_dt,
                  size_t n)
{
    if (!n || !dtype_ok(c, dst_dt, "convert") || !dtype_ok(c, src_dt, "convert"))
        return;
    if (dst_dt == src_dt) {
        if (dst != src)
            kn_cuda_ok(c, cudaMemcpyAsync(dst, src, n * kn_dtype_size(dst_dt),
                                          cudaMemcpyDeviceToDevice, kn_cuda_st(c)->stream),
                       "convert");
        return;
    }
    KN_LAUNCH(k_convert, kn_blocks(n, 256), 256, 0, c, dst, (int)dst_dt, src, (int)src_dt, n);
}

void cuda_round(kn_ctx *c, float *x, size_t n, kn_dtype dt)
{
    if (!n || dt == KN_F32 || !dtype_ok(c, dt, "round"))
        return;
    KN_LAUNCH(k_round, kn_blocks(n, 256), 256, 0, c, x, n, (int)dt);
}

/* The context's fp32 copy of a 16-bit weight (grown, never shrunk). */
static float *weight_f32(kn_ctx *c, kn_dtype dt, const void *w, size_t n)
{
    cuda_state *st = kn_cuda_st(c);
    if (st->scratch_bytes < n * sizeof(float)) {
        if (st->scratch)
            cudaFree(st->scratch);
        c->bytes_in_use -= st->scratch_bytes; /* device memory in use (kn_bytes_in_use) */
        st->scratch = nullptr;
        st->scratch_bytes = 0;
        void *p = nullptr;
        if (kn_cuda_ok(c, cudaMalloc(&p, n * sizeof(float)), "matmul16 scratch"))
            return nullptr;
        st->scratch = p;
        st->scratch_bytes = n * sizeof(float);
        c->bytes_in_use += st->scratch_bytes;
        if (c->bytes_in_use > c->peak_bytes)
            c->peak_bytes = c->bytes_in_use;
    }
    cuda_convert(c, st->scratch, KN_F32, w, dt, n);
    return (float *)st->scratch;
}

/* ---- fp32 masters as bf16 hi + 16-bit lo (kn_master_split / join) ---- */

/* The CPU backend's rule bit for bit (cpu.h): hi = RNE bf16, lo = the rest
 * as int16, a tie kept at an even hi moved one ulp towards it. */
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

__global__ void k_master_split(uint16_t *hi, uint16_t *lo, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        split1(x[i], hi + i, lo + i);
}

__global__ void k_master_join(float *x, const uint16_t *hi, const uint16_t *lo, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = join1(hi[i], lo[i]);
}

void cuda_master_split(kn_ctx *c, uint16_t *hi, uint16_t *lo, const float *x, size_t n)
{
    if (n)
        KN_LAUNCH(k_master_split, kn_blocks(n, 256), 256, 0, c, hi, lo, x, n);
}

void cuda_master_join(kn_ctx *c, float *x, const uint16_t *hi, const uint16_t *lo, size_t n)
{
    if (n)
        KN_LAUNCH(k_master_join, kn_blocks(n, 256), 256, 0, c, x, hi, lo, n);
}

/* AdamW on split masters: the fp32 k_adamw arithmetic on the joined value. */
__global__ void k_adamw_split(uint16_t *hi, uint16_t *lo, const float *g, float *m, float *v, size_t n,
                              float decay, int do_decay, float b1, float b2, float omb1, float omb2,
                              float step, float bc2_sqrt, float eps)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pi = join1(hi[i], lo[i]), gi = g[i];
        if (do_decay)
            pi *= decay;
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        split1(pi - step * (mi / (sqrtf(vi) / bc2_sqrt + eps)), hi + i, lo + i);
    }
}

void cuda_adamw_split(kn_ctx *c, uint16_t *hi, uint16_t *lo, const float *g, float *m, float *v,
                      size_t n, float decay, int do_decay, float b1, float b2, float omb1,
                      float omb2, float step, float bc2_sqrt, float eps)
{
    KN_LAUNCH(k_adamw_split, kn_blocks(n, 256), 256, 0, c, hi, lo, g, m, v, n, decay, do_decay, b1, b2,
              omb1, omb2, step, bc2_sqrt, eps);
}

/* 16-bit activations (out_dt / dout_dt, issue 10's typed ops): the
 * baseline goes through a temporary fp32 tensor (allocated per call and
 * freed, which synchronises); native 16-bit cuBLASLt outputs are the
 * tuning step. */
void cuda_matmul16_fwd(kn_ctx *c, kn_dtype dt, kn_dtype out_dt, void *out, const float *x,
                       const void *w, const float *bias, int N, int K, int M)
{
    if (N <= 0 || M <= 0 || !dtype_ok(c, dt, "matmul16") || !dtype_ok(c, out_dt, "matmul16 out"))
        return;
    const float *wf = dt == KN_F32 ? (const float *)w : weight_f32(c, dt, w, (size_t)M * K);
    if (!wf)
        return;
    if (out_dt == KN_F32) {
        cuda_matmul_fwd(c, (float *)out, x, wf, bias, N, K, M);
        return;
    }
    float *o32 = nullptr;
    if (kn_cuda_ok(c, cudaMalloc((void **)&o32, (size_t)N * M * sizeof(float)), "matmul16 fp32 out"))
        return;
    cuda_matmul_fwd(c, o32, x, wf, bias, N, K, M);
    cuda_convert(c, out, out_dt, o32, KN_F32, (size_t)N * M);
    kn_cuda_ok(c, cudaFree(o32), "matmul16 fp32 out");
}

void cuda_matmul16_bwd(kn_ctx *c, kn_dtype dt, kn_dtype dout_dt, float *dx, float *dw, float *dbias,
                       const void *dout, const float *x, const void *w, int N, int K, int M)
{
    if (N <= 0 || M <= 0 || K <= 0 || !dtype_ok(c, dt, "matmul16") || !dtype_ok(c, dout_dt, "matmul16 dout"))
        return;
    const float *wf = dt == KN_F32 || !dx ? (const float *)w
                                          : weight_f32(c, dt, w, (size_t)M * K);
    if (!wf)
        return;
    if (dout_dt == KN_F32) {
        cuda_matmul_bwd(c, dx, dw, dbias, (const float *)dout, x, wf, N, K, M);
        return;
    }
    float *g32 = nullptr;
    if (kn_cuda_ok(c, cudaMalloc((void **)&g32, (size_t)N * M * sizeof(float)), "matmul16 fp32 dout"))
        return;
    cuda_convert(c, g32, KN_F32, dout, dout_dt, (size_t)N * M);
    cuda_matmul_bwd(c, dx, dw, dbias, g32, x, wf, N, K, M);
    kn_cuda_ok(c, cudaFree(g32), "matmul16 fp32 dout");
}

} // namespace KN_NS
