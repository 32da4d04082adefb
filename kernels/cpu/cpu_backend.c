/* cpu_backend.c — the CPU device: memory, copies and the kn_backend table.
 *
 * "Device" memory is ordinary 64-byte-aligned host memory, so copies are
 * memcpy and sync is a no-op. Opening a context puts OpenBLAS in
 * single-threaded mode (cpu_blas.c) and allocates the small per-context
 * state (cpu_state); its thread pool starts with the first parallel job
 * and stops when the context closes. */
#include "cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cpu_open(kn_ctx *c, int device_index, ty_err *err)
{
    (void)device_index;
    int rc = cpu_blas_init(err);
    if (rc) return rc;
    c->impl = calloc(1, sizeof(cpu_state));
    if (!c->impl) return ty_err_set(err, TY_ENOMEM, "out of memory opening a CPU kernel context");
#ifdef TY_KN_HAVE_DNNL
    const char *bf16 = ", bf16 matmul: onednn";
#else
    const char *bf16 = "";
#endif
    snprintf(c->desc, sizeof c->desc, "cpu: %s, %d thread%s%s", cpu_blas_desc(), c->n_threads,
             c->n_threads == 1 ? "" : "s", bf16);
    return 0;
}

static void cpu_close(kn_ctx *c)
{
    cpu_state *st = c->impl;
    if (st) {
        cpu_pool_free(st->pool);
        cpu_dnnl_free(c);
        free(st->rope_tab);
        free(st->nf4_buf);
        for (int i = 0; i < CPU_MM_SLOTS; i++)
            free(st->mm_buf[i]);
    }
    free(st);
    c->impl = NULL;
}

/* Zeroed, 64-byte aligned. calloc, not aligned_alloc + memset: a large
 * block comes from fresh mmap pages that calloc knows are zero and does
 * not touch, so a buffer takes resident memory only once it is written.
 * That matters for peak RSS (docs/benchmarks.md): the gradients and AdamW
 * moments (12 bytes a parameter) are allocated with the model but first
 * written by the first step, after the bf16 masters were split and their
 * fp32 buffer freed; with memset all three were resident next to it. The
 * block is over-allocated by 64 bytes and aligned up; calloc's own pointer
 * sits in the 8 bytes below the one returned (calloc aligns to 16, so
 * there are at least 16). 0 bytes still gets a unique pointer so the
 * accounting table can key on it. */
static void *cpu_alloc(kn_ctx *c, size_t bytes)
{
    (void)c;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes || rounded + 64 < rounded) return NULL;
    char *raw = calloc(1, rounded + 64);
    if (!raw) return NULL;
    char *p = (char *)(((uintptr_t)raw + 64) & ~(uintptr_t)63);
    ((void **)p)[-1] = raw;
    return p;
}

static void cpu_free(kn_ctx *c, void *p)
{
    (void)c;
    if (p) free(((void **)p)[-1]);
}

static void cpu_to_device(kn_ctx *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(kn_ctx *c)
{
    (void)c;
}

const kn_backend kn_cpu_backend = {.name = "cpu",
                                   .open = cpu_open,
                                   .close = cpu_close,
                                   .alloc = cpu_alloc,
                                   .free = cpu_free,
                                   .to_device = cpu_to_device,
                                   .to_host = cpu_to_device,
                                   .sync = cpu_sync,
#define KN_CPU_ENTRY(ret, name, params, args) .name = cpu_##name,
                                   KN_OPS(KN_CPU_ENTRY)
#undef KN_CPU_ENTRY
};
