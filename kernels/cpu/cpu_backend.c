/* cpu_backend.c — the CPU device: memory, copies and the kn_backend table.
 *
 * "Device" memory is ordinary 64-byte-aligned host memory, so copies are
 * memcpy and sync is a no-op. Opening a context puts OpenBLAS in
 * single-threaded mode (cpu_blas.c) and allocates the small per-context
 * state (cpu_state). */
#include "cpu.h"

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
        cpu_dnnl_free(c);
        free(st->rope_tab);
        free(st->nf4_buf);
        for (int i = 0; i < 4; i++)
            free(st->mm_buf[i]);
    }
    free(st);
    c->impl = NULL;
}

static void *cpu_alloc(kn_ctx *c, size_t bytes)
{
    (void)c;
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still gets a
     * unique pointer so the accounting table can key on it. */
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes) return NULL;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

static void cpu_free(kn_ctx *c, void *p)
{
    (void)c;
    free(p);
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
