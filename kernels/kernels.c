/* kernels.c — device dispatch and memory accounting for kernels.h.
 *
 * Every kn_* call forwards to the context's kn_backend table, so model code
 * never knows which device runs it. The one device-independent service here
 * is byte accounting: a pointer -> size side table (open addressing, linear
 * probing) gives kn_bytes_in_use and kn_peak_bytes for any device, since a
 * header in front of a GPU block could not be read from the host. */
#include "backend.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocation table ------------------------------------------------- */

static size_t slot_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void slot_put_raw(kn_alloc_slot *slots, size_t cap, void *p, size_t bytes)
{
    size_t i = slot_hash(p, cap);
    while (slots[i].p)
        i = (i + 1) & (cap - 1);
    slots[i].p = p;
    slots[i].bytes = bytes;
}

/* Keeps the load factor under 1/2 so probes stay short. */
static int slot_reserve(kn_ctx *c)
{
    if ((c->slot_used + 1) * 2 <= c->slot_cap) return 0;
    size_t cap = c->slot_cap ? c->slot_cap * 2 : 64;
    kn_alloc_slot *ns = calloc(cap, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < c->slot_cap; i++)
        if (c->slots[i].p) slot_put_raw(ns, cap, c->slots[i].p, c->slots[i].bytes);
    free(c->slots);
    c->slots = ns;
    c->slot_cap = cap;
    return 0;
}

/* Removes p and returns its size (*known = 0 when p is not in the table).
 * Backward-shift deletion keeps every remaining key reachable without
 * tombstones. */
static size_t slot_take(kn_ctx *c, const void *p, int *known)
{
    *known = 0;
    if (!c->slot_cap) return 0;
    size_t mask = c->slot_cap - 1, i = slot_hash(p, c->slot_cap);
    while (c->slots[i].p != p) {
        if (!c->slots[i].p) return 0;
        i = (i + 1) & mask;
    }
    *known = 1;
    size_t bytes = c->slots[i].bytes;
    size_t hole = i;
    for (size_t j = (i + 1) & mask; c->slots[j].p; j = (j + 1) & mask) {
        size_t home = slot_hash(c->slots[j].p, c->slot_cap);
        /* Move j into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            c->slots[hole] = c->slots[j];
            hole = j;
        }
    }
    c->slots[hole].p = NULL;
    c->slots[hole].bytes = 0;
    c->slot_used--;
    return bytes;
}

/* Op names in list order, for TY_KN_FAIL_OP. */
static const char *const op_names[] = {
#define KN_NAME(ret, name, params, args) #name,
    KN_OPS(KN_NAME)
#undef KN_NAME
};

/* TY_KN_FAIL_OP=<op> makes every call of that op fail as a device error
 * would: the way tests reach the error path of the engine without a broken
 * device. Unknown names are ignored (-1). */
static int fail_op_from_env(void)
{
    const char *want = getenv("TY_KN_FAIL_OP");
    for (int i = 0; want && i < KN_OP_COUNT; i++)
        if (!strcmp(want, op_names[i])) return i;
    return -1;
}

/* ---- context and memory ----------------------------------------------- */

/* The test hook of docs/kernels.md: TY_KERNELS=cuda-emu makes KN_CUDA
 * open the emulated CUDA backend, so the engine's whole device path runs
 * in CI without a GPU. Only programs linked with kernels/cuda/emu (the
 * test build trainyard-engine-emu) have it; the weak reference is NULL in
 * every other, and the hook then refuses rather than running on the CPU. */
extern const kn_backend kn_cuda_emu_backend __attribute__((weak));

int kn_open(kn_ctx **out, kn_device dev, int device_index, int n_threads, ty_err *err)
{
    *out = NULL;
    const kn_backend *be = NULL;
    const char *hook = getenv("TY_KERNELS");
    if (dev == KN_CPU)
        be = &kn_cpu_backend;
    else if (dev == KN_CUDA && hook && !strcmp(hook, "cuda-emu")) {
        if (!&kn_cuda_emu_backend)
            return ty_err_set(err, TY_EINVAL,
                              "TY_KERNELS=cuda-emu: this program has no emulated CUDA "
                              "backend (test builds only)");
        be = &kn_cuda_emu_backend;
    } else if (dev == KN_CUDA) {
#ifdef TY_KN_HAVE_CUDA
        be = &kn_cuda_backend;
#else
        return ty_err_set(err, TY_EINVAL, "this build has no CUDA backend");
#endif
    } else
        return ty_err_set(err, TY_EINVAL, "unknown kernel device %d", (int)dev);
    return kn_open_backend(out, be, dev, device_index, n_threads, err);
}

int kn_open_backend(kn_ctx **out, const kn_backend *be, kn_device dev, int device_index,
                    int n_threads, ty_err *err)
{
    *out = NULL;
    if (n_threads < 0)
        return ty_err_set(err, TY_EINVAL, "n_threads must be >= 0, got %d", n_threads);
    /* A backend that left an op out of its table is refused here, by name,
     * rather than crashing on the first call. */
    const char *be_label = be->name;
#define KN_HAS(ret, op, params, args)                                                              \
    if (!be->op) return ty_err_set(err, TY_EINVAL, "%s backend lacks op %s", be_label, #op);
    KN_OPS(KN_HAS)
#undef KN_HAS

    kn_ctx *c = calloc(1, sizeof *c);
    if (!c) return ty_err_set(err, TY_ENOMEM, "out of memory opening a kernel context");
    c->dev = dev;
    c->be = be;
    c->fail_op = fail_op_from_env();
    snprintf(c->info.name, sizeof c->info.name, "%s", be->name);
    c->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (c->n_threads < 1) c->n_threads = 1;
    int rc = be->open(c, device_index, err);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kn_close(kn_ctx *c)
{
    if (!c) return;
    /* Anything still allocated is released here, so a context owns its memory. */
    for (size_t i = 0; i < c->slot_cap; i++)
        if (c->slots[i].p) c->be->free(c, c->slots[i].p);
    free(c->slots);
    c->be->close(c);
    free(c);
}

kn_device kn_device_of(const kn_ctx *c)
{
    return c->dev;
}
const kn_device_info *kn_info(const kn_ctx *c)
{
    return &c->info;
}

void *kn_host_alloc(kn_ctx *c, size_t bytes)
{
    return c->be->host_alloc ? c->be->host_alloc(c, bytes) : malloc(bytes ? bytes : 1);
}
void kn_host_free(kn_ctx *c, void *p)
{
    if (!p) return;
    if (c && c->be->host_free)
        c->be->host_free(c, p);
    else
        free(p);
}
const char *kn_device_name(const kn_ctx *c)
{
    return c->be->name;
}
const char *kn_describe(const kn_ctx *c)
{
    return c->desc;
}

void *kn_alloc(kn_ctx *c, size_t bytes)
{
    if (slot_reserve(c)) return NULL;
    void *p = c->be->alloc(c, bytes);
    if (!p) return NULL;
    slot_put_raw(c->slots, c->slot_cap, p, bytes);
    c->slot_used++;
    c->bytes_in_use += bytes;
    if (c->bytes_in_use > c->peak_bytes) c->peak_bytes = c->bytes_in_use;
    return p;
}

/* A pointer this context did not hand out is left alone: freeing it here
 * could only turn a caller's bug into heap corruption. */
void kn_free(kn_ctx *c, void *p)
{
    if (!p) return;
    int known = 0;
    size_t bytes = slot_take(c, p, &known);
    if (!known) return;
    c->bytes_in_use -= bytes;
    c->be->free(c, p);
}

size_t kn_dtype_size(kn_dtype dt)
{
    return dt == KN_F32 ? 4 : 2;
}
const char *kn_dtype_name(kn_dtype dt)
{
    return dt == KN_BF16 ? "bf16" : dt == KN_F16 ? "fp16" : "fp32";
}

size_t kn_bytes_in_use(const kn_ctx *c)
{
    return c->bytes_in_use;
}
size_t kn_peak_bytes(const kn_ctx *c)
{
    return c->peak_bytes;
}
size_t kn_device_used_bytes(kn_ctx *c)
{
    return c->be->device_used ? c->be->device_used(c) : 0;
}

/* The CPU's logit chunk (kernels.h): 32 MiB, at least 128 rows. */
#define KN_CPU_LOGIT_BYTES ((size_t)32 << 20)
#define KN_CPU_LOGIT_MIN_ROWS 128

int kn_logit_ld(kn_ctx *c, int V)
{
    return c->be->logit_ld ? c->be->logit_ld(c, V) : V;
}

int kn_logit_rows(kn_ctx *c, size_t N, size_t V, size_t es)
{
    if (c->be->logit_rows) return c->be->logit_rows(c, N, V, es);
    size_t r = KN_CPU_LOGIT_BYTES / (V * es > 0 ? V * es : 1);
    if (r < KN_CPU_LOGIT_MIN_ROWS) r = KN_CPU_LOGIT_MIN_ROWS;
    return (int)(r < N ? r : N);
}

void kn_to_device(kn_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    c->be->to_device(c, dst, host_src, bytes);
}
void kn_to_host(kn_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    c->be->to_host(c, host_dst, src, bytes);
}
void kn_sync(kn_ctx *c)
{
    c->be->sync(c);
}

/* ---- error channel ----------------------------------------------------- */

void kn_fail(kn_ctx *c, int code, const char *fmt, ...)
{
    if (c->err_code) return; /* the first failure is the one worth reporting */
    c->err_code = code ? code : TY_EINTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
}

int kn_grad_dtype_ok(kn_ctx *c, kn_dtype dt, kn_dtype g_dt, const char *op)
{
    if (g_dt == KN_F32 || g_dt == dt) return 1;
    kn_fail(c, TY_EINVAL, "%s: gradients in %s for %s activations", op, kn_dtype_name(g_dt),
            kn_dtype_name(dt));
    return 0;
}

int kn_bias_dtype_ok(kn_ctx *c, kn_dtype dt, kn_dtype b_dt, const char *op)
{
    if (b_dt == KN_F32 || b_dt == dt) return 1;
    kn_fail(c, TY_EINVAL, "%s: a %s bias for %s weights", op, kn_dtype_name(b_dt),
            kn_dtype_name(dt));
    return 0;
}

kn_adamw_k kn_adamw_consts(const kn_adamw_hp *hp)
{
    int64_t t = hp->t < 1 ? 1 : hp->t;
    double bc1 = 1.0 - pow((double)hp->b1, (double)t);
    double bc2 = 1.0 - pow((double)hp->b2, (double)t);
    kn_adamw_k k = {hp->b1,
                    hp->b2,
                    (float)(1.0 - (double)hp->b1),
                    (float)(1.0 - (double)hp->b2),
                    (float)((double)hp->lr / bc1),
                    (float)sqrt(bc2),
                    hp->eps,
                    hp->gscale[0],
                    hp->gscale[1]};
    return k;
}

float kn_adamw_decay(float lr, float wd)
{
    return (float)(1.0 - (double)lr * (double)wd);
}

int kn_adamw_blocks_ok(kn_ctx *c, const kn_adamw_block *b, int nb)
{
    for (int i = 0; i < nb; i++) {
        kn_dtype pdt = b[i].pdt;
        if (pdt != KN_F32 && (pdt != KN_BF16 || !b[i].plo)) {
            kn_fail(c, TY_EINVAL, "adamw: parameters in %s%s", kn_dtype_name(pdt),
                    pdt == KN_BF16 ? " need their low halves (plo)" : " are not supported");
            return 0;
        }
    }
    return 1;
}

int kn_check(kn_ctx *c, ty_err *err)
{
    int code = c->err_code;
    if (!code) return 0;
    c->err_code = 0;
    return ty_err_set(err, code, "%s kernel: %s", c->be->name, c->err_msg);
}

/* ---- operations, generated from kn_ops.h -------------------------------- */

/* Each kn_<op> forwards to ctx->be-><op>, unless an earlier op failed: then
 * it does nothing (value ops return 0) until kn_check collects the error,
 * the way a device's sticky error state behaves. */
#define KN_RET_void
#define KN_RET_int return
#define KN_RET_double return
#define KN_SKIP_void
#define KN_SKIP_int 0
#define KN_SKIP_double 0.0
#define KN_DISPATCH(ret, name, params, args)                                                       \
    ret kn_##name params                                                                           \
    {                                                                                              \
        if (c->fail_op == KN_OP_##name)                                                            \
            kn_fail(c, TY_EIO, "%s failed (injected by TY_KN_FAIL_OP)", #name);                    \
        if (c->err_code) return KN_SKIP_##ret;                                                     \
        KN_RET_##ret c->be->name args;                                                             \
    }
KN_OPS(KN_DISPATCH)
#undef KN_DISPATCH
