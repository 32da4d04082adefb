/* admit.c — admission (admit.h): one function per kind of request that
 * starts work, each returning its refusal as an admit_result, and the one
 * place a refusal becomes the JSON error.
 *
 * admit_job runs the checks in the order a client meets them: the spec's
 * paths and model files (speccheck.c) and budgets (budget.c) first, then what
 * this machine and executor can run, then the disk and the checkpoint
 * store, whose probe costs a network round trip and so comes last. What
 * the executor cannot run it says itself through its ops table
 * (exec_ops.check_job), so no check here depends on which executor runs. */
#include "admit.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "executor.h"
#include "jobspec.h"
#include "ops.h"
#include "recovery.h"
#include "scheduler.h"
#include "state.h"
#include "upload.h"

unsigned admit_refuse(admit_result *r, unsigned status, const char *code, const char *field,
                      const char *fmt, ...)
{
    va_list ap;
    r->status = status;
    r->code = code;
    snprintf(r->field, sizeof r->field, "%s", field ? field : "");
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return status;
}

unsigned admit_refuse_err(admit_result *r, const ty_err *err)
{
    const char *code;
    unsigned status = http_ty_status(err, &code);
    return admit_refuse(r, status, code, status < 500 ? err->field : NULL, "%s", err->msg);
}

unsigned admit_refuse_spec(admit_result *r, const ty_err *err)
{
    return admit_refuse(r, 400, "invalid_spec", err->field, "%s", err->msg);
}

admit_ctx admit_ctx_of(srv *s)
{
    return (admit_ctx){.gpu_limit = sched_job_gpu_limit(s->sched),
                       .exec = sched_exec_ops(s->sched)};
}

/* GPUs, what the executor can run, and the ranks: data-parallel ranks
 * take one GPU or one CPU slot each, and the global batch must split
 * evenly over them (docs/engine.md, Ranks). */
static unsigned admit_resources(const srv_config *c, const jobspec *spec, const admit_ctx *ctx,
                                admit_result *r)
{
    ty_err err = {0};
    if (spec->gpus > ctx->gpu_limit)
        return admit_refuse(r, 400, "invalid_spec", "resources.gpus",
                            "the job asks for %d GPU(s); this server has %d", spec->gpus,
                            ctx->gpu_limit);
    if (ctx->exec && ctx->exec->check_job && ctx->exec->check_job(c, spec, &err))
        return admit_refuse_spec(r, &err);
    int world = (spec->gpus > 0 ? spec->gpus : spec->cpu_ranks) * spec->nodes;
    long long rows = (long long)spec->batch_size * spec->grad_accum;
    if (world > 0 && rows % world)
        return admit_refuse(r, 400, "invalid_spec",
                            spec->gpus > 0 ? "resources.gpus" : "resources.cpu_ranks",
                            "%d ranks do not divide the global batch of "
                            "hyperparameters.batch_size x grad_accum = %lld rows",
                            world, rows);
    return 0;
}

unsigned admit_job(srv *s, const jobspec *spec, const admit_ctx *ctx, admit_result *r)
{
    ty_err err = {0};
    if (srv_spec_check_paths(&s->cfg, spec, &err) || srv_spec_check_model(&s->cfg, spec, &err) ||
        ops_check_limits(&s->cfg, spec, &err))
        return admit_refuse_spec(r, &err);
    if (admit_resources(&s->cfg, spec, ctx, r)) return r->status;
    /* The precision against what the chosen backend can run here. */
    jobspec_caps caps = jobspec_default_caps(ctx->gpu_limit);
    if (jobspec_check_precision(spec, &caps, &err)) return admit_refuse_spec(r, &err);
    if (srv_disk_check(s, &err)) return admit_refuse_err(r, &err); /* 503 while full */
    /* The store must take a write and a delete with our credentials before
     * any training time is spent on the job (docs/storage.md). */
    if (spec->store && upload_probe_store(s, spec->store, &err)) return admit_refuse_spec(r, &err);
    return 0;
}

unsigned admit_patch(srv *s, admit_result *r)
{
    if (!srv_db(s)) return admit_refuse(r, 500, "internal", NULL, "database unavailable");
    return 0;
}

enum MHD_Result admit_reply(http_req *q, const admit_result *r)
{
    return http_error(q, r->status ? r->status : 500, r->code ? r->code : "internal",
                      r->field[0] ? r->field : NULL, "%s", r->msg);
}
