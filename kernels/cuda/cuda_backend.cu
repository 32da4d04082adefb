/* cuda_backend.cu — the CUDA device: context, memory, copies, the table.
 *
 * Opening a context selects the GPU, creates one stream (every op and copy
 * is queued on it, in order), a cuBLASLt handle with its workspace and the
 * small reduction buffer, all allocated here once so no op allocates.
 * Copies are asynchronous on the stream; to_host waits for its copy, since
 * the caller reads the host buffer next. A runtime error in any call is
 * recorded on the context (kn_fail), never handled by computing something
 * else. Built twice: by nvcc as `cuda` and by the host compiler as the
 * test-only `cuda-emu` (kn_cuda.cuh). */
#include "kn_cuda.cuh"

#include <stdio.h>
#include <stdlib.h>
#ifndef KN_CUDA_EMU
#include <dlfcn.h>
#endif

namespace KN_NS {

#define LT_WORKSPACE (32u << 20) /* cuBLASLt's recommendation for Hopper */

static void st_free(cuda_state *st)
{
    if (!st)
        return;
    kn_prof_close(st->prof);
    kn_cuda_gemm_plans_free(st);
    if (st->lt)
        cublasLtDestroy(st->lt);
    if (st->lt_ws)
        cudaFree(st->lt_ws);
    if (st->red)
        cudaFree(st->red);
    for (int i = 0; i < KN_SCRATCH_SLOTS; i++)
        if (st->scratch[i])
            cudaFree(st->scratch[i]);
    if (st->stream)
        cudaStreamDestroy(st->stream);
    free(st);
}

/* The runtime is linked statically and loads the driver (libcuda.so.1)
 * itself; without one it answers "driver version is insufficient", which
 * misleads on a machine that has no driver at all. So that case is named
 * first. The emulation has no driver to look for. */
static int driver_present(ty_err *err)
{
#ifdef KN_CUDA_EMU
    (void)err;
    return 1;
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        ty_err_set(err, TY_EINVAL, "no NVIDIA driver for CUDA (%s)", why ? why : "libcuda.so.1 not found");
        return 0;
    }
    return 1; /* kept loaded: the runtime uses it next */
#endif
}

static int cuda_open(kn_ctx *c, int device_index, ty_err *err)
{
    if (!driver_present(err))
        return err->code;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return ty_err_set(err, TY_EINVAL, "no CUDA device: %s",
                          e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    /* The server gives a job its GPUs in CUDA_VISIBLE_DEVICES and each rank
     * its TY_LOCAL_RANK, the ordinal among them (engine/device.c). */
    if (device_index < 0 || device_index >= n) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return ty_err_set(err, TY_EINVAL,
                          "CUDA device %d (local rank) does not exist: %d visible (CUDA_VISIBLE_DEVICES=%s)",
                          device_index, n, vis ? vis : "unset");
    }
#ifndef KN_CUDA_EMU
    if (kn_lt_load(err))
        return err->code;
#endif
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device_index)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device_index)) != cudaSuccess)
        return ty_err_set(err, TY_EIO, "CUDA device %d: %s", device_index, cudaGetErrorString(e));
    cuda_state *st = (cuda_state *)calloc(1, sizeof *st);
    if (!st)
        return ty_err_set(err, TY_ENOMEM, "out of memory opening a CUDA kernel context");
    st->cc_major = prop.major;
    st->cc_minor = prop.minor;
    st->lt_ws_bytes = LT_WORKSPACE;
    void *red = nullptr;
    if ((e = cudaStreamCreate(&st->stream)) != cudaSuccess ||
        (e = cudaMalloc(&st->lt_ws, st->lt_ws_bytes)) != cudaSuccess ||
        (e = cudaMalloc(&red, (KN_RED_BLOCKS_MAX + 1) * sizeof(double))) != cudaSuccess) {
        st_free(st);
        return ty_err_set(err, TY_EIO, "CUDA device %d setup: %s", device_index,
                          cudaGetErrorString(e));
    }
    st->red = (double *)red;
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS) {
        st->lt = nullptr;
        st_free(st);
        return ty_err_set(err, TY_EIO, "cuBLASLt could not be initialised on device %d",
                          device_index);
    }
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    st->prof = kn_prof_open(device_index);
    c->impl = st;
    /* What the context holds on the device from the start counts as used
     * device memory (kn_bytes_in_use / kn_peak_bytes, the engine's mem_bytes). */
    c->bytes_in_use += st->lt_ws_bytes + (KN_RED_BLOCKS_MAX + 1) * sizeof(double);
    c->peak_bytes = c->bytes_in_use;
    kn_device_info *in = &c->info;
    snprintf(in->name, sizeof in->name, "%.127s", prop.name);
    in->total_mem = prop.totalGlobalMem;
    in->cc_major = prop.major;
    in->cc_minor = prop.minor;
    in->driver_version = drv;
    in->runtime_version = rt;
    snprintf(c->desc, sizeof c->desc, "%s: %.80s, sm_%d%d, %.1f GiB, driver %d.%d, runtime %d.%d",
             KN_CUDA_NAME, prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1u << 30), drv / 1000, drv % 1000 / 10, rt / 1000,
             rt % 1000 / 10);
    return 0;
}

static void cuda_close(kn_ctx *c)
{
    cuda_state *st = kn_cuda_st(c);
    if (st)
        cudaStreamSynchronize(st->stream);
    st_free(st);
    c->impl = nullptr;
}

static void *cuda_alloc(kn_ctx *c, size_t bytes)
{
    void *p = nullptr;
    /* cudaMalloc aligns to 256 bytes; a 0-byte block still gets a unique
     * pointer for the accounting table. */
    if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess)
        return nullptr;
    if (cudaMemsetAsync(p, 0, bytes ? bytes : 64, kn_cuda_st(c)->stream) != cudaSuccess) {
        cudaFree(p);
        return nullptr;
    }
    return p;
}

static void cuda_free(kn_ctx *c, void *p)
{
    /* cudaFree synchronises the device, so queued work on p finishes first. */
    (void)c;
    cudaFree(p);
}

static void cuda_to_device(kn_ctx *c, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        kn_cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                      kn_cuda_st(c)->stream), "copy to device");
}

static void cuda_to_host(kn_ctx *c, void *dst, const void *src, size_t bytes)
{
    cuda_state *st = kn_cuda_st(c);
    if (bytes &&
        !kn_cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream),
                    "copy to host"))
        kn_cuda_ok(c, cudaStreamSynchronize(st->stream), "copy to host");
}

void *kn_cuda_scratch(kn_ctx *c, int slot, size_t bytes)
{
    cuda_state *st = kn_cuda_st(c);
    if (st->scratch_bytes[slot] >= bytes)
        return st->scratch[slot];
    if (st->scratch[slot])
        cudaFree(st->scratch[slot]); /* synchronises: queued work on it is done */
    c->bytes_in_use -= st->scratch_bytes[slot];
    st->scratch[slot] = nullptr;
    st->scratch_bytes[slot] = 0;
    void *p = nullptr;
    if (kn_cuda_ok(c, cudaMalloc(&p, bytes), "scratch"))
        return nullptr;
    st->scratch[slot] = p;
    st->scratch_bytes[slot] = bytes;
    c->bytes_in_use += bytes;
    if (c->bytes_in_use > c->peak_bytes)
        c->peak_bytes = c->bytes_in_use;
    return p;
}

static void *cuda_host_alloc(kn_ctx *c, size_t bytes)
{
    (void)c;
    void *p = nullptr;
    return cudaMallocHost(&p, bytes ? bytes : 64) == cudaSuccess ? p : nullptr;
}

static void cuda_host_free(kn_ctx *c, void *p)
{
    (void)c;
    cudaFreeHost(p);
}

/* The whole device's use: the driver's total - free. A failed query is
 * not a failed op: it returns 0 and clears the runtime's last error, so
 * the next launch check does not report it. */
static size_t cuda_device_used(kn_ctx *c)
{
    (void)c;
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return total > free_b ? total - free_b : 0;
}

/* kn_logit_rows: the whole batch's logits when they fit the budget, else
 * whole 128-row tiles of it (kernels.h says why). */
#define CUDA_LOGIT_CAP ((size_t)1 << 30)
#define CUDA_LOGIT_TILE 128

static int cuda_logit_rows(kn_ctx *c, size_t N, size_t V, size_t es)
{
    size_t budget = c->info.total_mem / 64, row = V * es > 0 ? V * es : 1;
    if (budget == 0 || budget > CUDA_LOGIT_CAP)
        budget = CUDA_LOGIT_CAP;
    size_t r = budget / row / CUDA_LOGIT_TILE * CUDA_LOGIT_TILE;
    if (r < CUDA_LOGIT_TILE)
        r = CUDA_LOGIT_TILE;
    return (int)(N <= budget / row || r > N ? N : r);
}

/* kn_logit_ld: logits rows padded to whole 128-column tiles. */
static int cuda_logit_ld(kn_ctx *c, int V)
{
    (void)c;
    return (V + CUDA_LOGIT_TILE - 1) / CUDA_LOGIT_TILE * CUDA_LOGIT_TILE;
}

static void cuda_sync(kn_ctx *c) { kn_cuda_ok(c, cudaStreamSynchronize(kn_cuda_st(c)->stream), "sync"); }

} // namespace KN_NS

extern "C" const kn_backend KN_CUDA_BACKEND = {
    .name = KN_CUDA_NAME,
    .open = KN_NS::cuda_open,
    .close = KN_NS::cuda_close,
    .alloc = KN_NS::cuda_alloc,
    .free = KN_NS::cuda_free,
    .to_device = KN_NS::cuda_to_device,
    .to_host = KN_NS::cuda_to_host,
    .sync = KN_NS::cuda_sync,
    .host_alloc = KN_NS::cuda_host_alloc,
    .host_free = KN_NS::cuda_host_free,
    .device_used = KN_NS::cuda_device_used,
    .logit_rows = KN_NS::cuda_logit_rows,
    .logit_ld = KN_NS::cuda_logit_ld,
#define KN_CUDA_ENTRY(ret, name, params, args) .name = KN_NS::cuda_##name,
    KN_OPS(KN_CUDA_ENTRY)
#undef KN_CUDA_ENTRY
};
