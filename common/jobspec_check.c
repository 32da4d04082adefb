/* jobspec_check.c — the checks of a parsed spec against the installation
 * (see jobspec.h): its local paths under the allowed roots, a file://
 * checkpoint store under the store roots, and its precision against what
 * the backend it will run on can run. The parser (jobspec.c) checks the
 * spec on its own; these need the server's settings or the machine, and
 * the server (at submit) and the engine (at start) both run them. */
#include "jobspec.h"

#include <string.h>

#include "tyopen.h"

/* Returns the local filesystem path a spec path denotes ("/x" or
 * "file:///x" → "/x"), or NULL for a remote object-store URI. */
static const char *local_part(const char *p)
{
    if (strncmp(p, "file://", 7) == 0) return p + 7;
    if (p[0] == '/') return p;
    return NULL;
}

/* ---- allowed roots ---- */

static int check_one_root(const char *field, const char *p, const char *roots, ty_err *err)
{
    if (!p) return 0;
    const char *local = local_part(p);
    if (!local) return 0; /* object-store URIs: credentials, not roots, guard them */
    if (!ty_path_under_roots(local, roots))
        return ty_err_field(err, TY_EINVAL, field, "%s: %s is outside the allowed roots (%s)",
                            field, local, roots);
    /* A symlink inside a root may point outside it: check where it leads.
     * The engine checks again when it opens the file. */
    if (!ty_path_within_roots(local, roots))
        return ty_err_field(err, TY_EINVAL, field,
                            "%s: %s resolves to a place outside the allowed roots (%s)", field,
                            local, roots);
    return 0;
}

int jobspec_check_roots(const jobspec *s, const char *allowed_roots, ty_err *err)
{
    ty_err_clear(err);
    if (!allowed_roots || !*allowed_roots) return 0; /* no restriction configured */
    int rc;
    if ((rc = check_one_root("model.path", s->model_path, allowed_roots, err))) return rc;
    if ((rc = check_one_root("dataset.train", s->train, allowed_roots, err))) return rc;
    if ((rc = check_one_root("dataset.eval", s->eval, allowed_roots, err))) return rc;
    if ((rc = check_one_root("lora.adapter", s->lora_adapter, allowed_roots, err))) return rc;
    return 0;
}

int jobspec_check_store_roots(const jobspec *s, const char *store_roots, ty_err *err)
{
    ty_err_clear(err);
    if (!s->store || strncmp(s->store, "file://", 7)) return 0;
    const char *local = s->store + 7;
    if (!store_roots || !*store_roots)
        return ty_err_field(
            err, TY_EINVAL, "checkpoint.store",
            "checkpoint.store: file:// stores are off on this server (no store roots)");
    if (!ty_path_within_roots(local, store_roots))
        return ty_err_field(err, TY_EINVAL, "checkpoint.store",
                            "checkpoint.store: %s is outside the store roots (%s)", local,
                            store_roots);
    return 0;
}

jobspec_caps jobspec_default_caps(int cuda_gpus)
{
    unsigned all = 1u << PREC_FP32 | 1u << PREC_BF16 | 1u << PREC_FP16;
    return (jobspec_caps){.cpu = all, .cuda = cuda_gpus > 0 ? all : 0};
}

int jobspec_check_precision(const jobspec *s, const jobspec_caps *caps, ty_err *err)
{
    /* auto runs on CUDA when it can and falls back to the CPU otherwise
     * (logged by the engine), so either backend will do for it. */
    int cuda = s->backend == BACKEND_CUDA;
    unsigned can = cuda                                        ? caps->cuda
                   : s->backend == BACKEND_AUTO && s->gpus > 0 ? caps->cuda | caps->cpu
                                                               : caps->cpu;
    /* auto: the engine picks a precision the device runs, if it runs any */
    if (s->precision == PREC_AUTO ? can != 0 : (can & (1u << s->precision)) != 0) return 0;
    if (cuda && !caps->cuda)
        return ty_err_field(
            err, TY_EINVAL, "precision",
            "precision: %s cannot run on resources.backend %s: this installation has no CUDA GPUs "
            "(use backend \"cpu\", which runs fp32, bf16 and fp16)",
            jobspec_precision_name(s->precision), jobspec_backend_name(s->backend));
    return ty_err_field(err, TY_EINVAL, "precision", "precision: backend %s cannot run %s",
                        cuda ? "cuda" : "cpu", jobspec_precision_name(s->precision));
}
