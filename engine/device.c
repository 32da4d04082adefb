/* device.c — device selection and description for the training run.
 *
 * Kept apart from train.c so the loop stays about training: this file
 * knows the spec's backend choice, the ranks' GPU assignment and what a
 * card can do. The server picks the GPUs (CUDA_VISIBLE_DEVICES holds the
 * job's, in PCI order) and numbers the ranks (TY_LOCAL_RANK); rank r uses
 * the r-th visible GPU. Nothing here guesses: a fallback to the CPU is
 * reported with its reason, and a device that cannot do what the spec
 * asks is an error. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int device_cuda_built(void)
{
#ifdef TY_KN_HAVE_CUDA
    return 1;
#else
    /* The test hook (kernels.c): only meaningful in a program that has the
     * emulated backend; kn_open reports it when it does not. */
    const char *hook = getenv("TY_KERNELS");
    return hook && !strcmp(hook, "cuda-emu");
#endif
}

int device_open(kn_ctx **kn, const jobspec *s, int local_rank, int threads, char *fallback,
                size_t fallback_cap, ty_err *err)
{
    fallback[0] = 0;
    if (s->backend == BACKEND_CUDA) {
        ty_err cerr = {0};
        if (kn_open(kn, KN_CUDA, local_rank, threads, &cerr) == 0) return 0;
        return ty_err_set(err, cerr.code, "cuda: %s", cerr.msg);
    }
    if (s->backend == BACKEND_AUTO && s->gpus > 0) {
        ty_err cerr = {0};
        if (kn_open(kn, KN_CUDA, local_rank, threads, &cerr) == 0) return 0;
        snprintf(fallback, fallback_cap, "cuda unavailable (%s); running on the cpu", cerr.msg);
    }
    return kn_open(kn, KN_CPU, 0, threads, err);
}

kn_dtype device_auto_precision(const kn_ctx *kn)
{
    return kn_device_of(kn) == KN_CUDA && kn_info(kn)->cc_major < 8 ? KN_F16 : KN_BF16;
}

int device_check_precision(const kn_ctx *kn, kn_dtype dt, ty_err *err)
{
    const kn_device_info *in = kn_info(kn);
    if (kn_device_of(kn) == KN_CUDA && dt == KN_BF16 && in->cc_major < 8) {
        ty_err_set(
            err, TY_EINVAL,
            "precision bf16 needs a GPU of compute capability 8.0 or newer; %s is %d.%d (use fp16, "
            "which scales the loss, or fp32)",
            in->name, in->cc_major, in->cc_minor);
        snprintf(err->field, sizeof err->field, "precision");
        return TY_EINVAL;
    }
    return 0;
}

/* CUDA's version encoding (1000 * major + 10 * minor) as "major.minor";
 * NULL when unknown (0). */
static json_t *version(int v)
{
    if (v <= 0) return json_null();
    char s[24];
    snprintf(s, sizeof s, "%d.%d", v / 1000, v % 1000 / 10);
    return json_string(s);
}

void device_describe(const kn_ctx *kn, json_t *started)
{
    if (!started || kn_device_of(kn) != KN_CUDA) return;
    const kn_device_info *in = kn_info(kn);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", in->cc_major, in->cc_minor);
    json_object_set_new(started, "gpu",
                        json_pack("{s:s, s:I, s:s, s:o, s:o}", "name", in->name, "memory_bytes",
                                  (json_int_t)in->total_mem, "compute_capability", cc, "driver",
                                  version(in->driver_version), "cuda_runtime",
                                  version(in->runtime_version)));
}

uint64_t device_used_bytes(kn_ctx *kn)
{
    return kn_device_of(kn) == KN_CUDA ? (uint64_t)kn_device_used_bytes(kn) : 0;
}

uint64_t device_mem_bytes(const kn_ctx *kn)
{
    if (kn_device_of(kn) == KN_CUDA) return (uint64_t)kn_peak_bytes(kn);
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024u : 0;
}
