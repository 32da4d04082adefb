/* backend.h — the function table a device implements, and the context.
 *
 * Internal to kernels/: engine code only sees kernels.h. kernels.c keeps
 * the device-independent parts (argument routing, byte accounting) and
 * forwards every operation to ctx->be, so adding a device means filling one
 * kn_backend and listing it in kn_open; no caller changes. The op entries
 * are generated from kn_ops.h, so they cannot drift from kernels.h. */
#ifndef TY_KERNELS_BACKEND_H
#define TY_KERNELS_BACKEND_H

#include "kernels.h"

/* KN_OP_<name>: each op's index in the list; KN_OP_COUNT of them. */
enum {
#define KN_INDEX(ret, name, params, args) KN_OP_##name,
    KN_OPS(KN_INDEX)
#undef KN_INDEX
        KN_OP_COUNT
};

typedef struct kn_backend {
    const char *name; /* "cpu" | "cuda" */

    /* Device setup on an already zeroed ctx (ctx->n_threads is set);
     * may store private state in ctx->impl and fills ctx->desc (see
     * kn_describe). Returns 0 or TY_E*. */
    int (*open)(kn_ctx *c, int device_index, ty_err *err);
    void (*close)(kn_ctx *c);

    /* Raw device memory: zeroed, 64-byte aligned. Accounting is done by
     * kernels.c, not here. */
    void *(*alloc)(kn_ctx *c, size_t bytes);
    void (*free)(kn_ctx *c, void *p);
    void (*to_device)(kn_ctx *c, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(kn_ctx *c, void *host_dst, const void *src, size_t bytes);
    void (*sync)(kn_ctx *c);
    /* Page-locked host memory (kn_host_alloc); NULL entries mean malloc/free. */
    void *(*host_alloc)(kn_ctx *c, size_t bytes);
    void (*host_free)(kn_ctx *c, void *p);
    /* kn_device_used_bytes; NULL means 0 (the CPU). */
    size_t (*device_used)(kn_ctx *c);
    /* kn_logit_rows; NULL means the CPU's rule (kernels.c). */
    int (*logit_rows)(kn_ctx *c, size_t N, size_t V, size_t es);
    /* kn_logit_ld; NULL means V (no padding). */
    int (*logit_ld)(kn_ctx *c, int V);

    /* One entry per op of kn_ops.h, with exactly its kn_* signature. */
#define KN_ENTRY(ret, name, params, args) ret(*name) params;
    KN_OPS(KN_ENTRY)
#undef KN_ENTRY
} kn_backend;

/* One live allocation, for byte accounting (a side table rather than a
 * header before the block, because device memory is not host-readable). */
typedef struct kn_alloc_slot {
    void *p;
    size_t bytes;
} kn_alloc_slot;

struct kn_ctx {
    kn_device dev;
    const kn_backend *be;
    int n_threads;       /* resolved: always >= 1 */
    void *impl;          /* backend-private state */
    char desc[160];      /* kn_describe's line */
    kn_device_info info; /* kn_info; filled by open (kernels.c names the CPU) */
    size_t bytes_in_use;
    size_t peak_bytes;
    kn_alloc_slot *slots; /* open-addressing table keyed by pointer */
    size_t slot_cap;      /* power of two, 0 before the first alloc */
    size_t slot_used;
    /* The error channel (kn_fail / kn_check): the first failure since the
     * last check; 0 = none. While set, ops are skipped. */
    int err_code;
    char err_msg[sizeof(((ty_err *)0)->msg)];
    int fail_op; /* KN_OP_* that TY_KN_FAIL_OP makes fail; -1 = none */
};

/* The backends this build contains. */
extern const kn_backend kn_cpu_backend;
#ifdef TY_KN_HAVE_CUDA
extern const kn_backend kn_cuda_backend;
#endif
/* The test-only emulated CUDA backend (kernels/cuda/emu): the CUDA sources
 * compiled by the host compiler. Linked into test programs only. */
extern const kn_backend kn_cuda_emu_backend;

/* Whether g_dt is a type a backward op may store its written gradients
 * in (kernels.h: fp32, or the activations' dt); otherwise records the
 * error (kn_fail, naming op) and returns 0. Both backends' check. */
int kn_grad_dtype_ok(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, const char *op);

/* Whether b_dt is a type a product's bias may come in (fp32, or the
 * weights' 16-bit dt: kernels.h); otherwise records the error, naming op,
 * and returns 0. */
int kn_bias_dtype_ok(kn_ctx *c, kn_dtype dt, kn_dtype b_dt, const char *op);

/* AdamW, shared by both backends so that they compute one update: the
 * per-update constants of torch 1.13's AdamW (bias corrections in double,
 * then fp32) with the gradient's two factors (kn_adamw_hp.gscale), and a
 * tensor's decay factor 1 - lr * wd. */
typedef struct kn_adamw_k {
    float b1, b2, omb1, omb2, step, bc2_sqrt, eps, gs0, gs1;
} kn_adamw_k;
kn_adamw_k kn_adamw_consts(const kn_adamw_hp *hp);
float kn_adamw_decay(float lr, float wd);
/* Whether every block's master type is one AdamW updates (fp32, or bf16
 * split with its plo); otherwise records the error and returns 0. */
int kn_adamw_blocks_ok(kn_ctx *c, const kn_adamw_block *b, int nb);

/* kn_open with an explicit table: how tests open `cuda-emu` (as device
 * KN_CUDA), and what kn_open does after choosing the table. */
int kn_open_backend(kn_ctx **out, const kn_backend *be, kn_device dev, int device_index,
                    int n_threads, ty_err *err);

#endif
