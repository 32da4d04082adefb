/* admit.h — whether the server takes a request, with one result type for
 * every refusal.
 *
 * The handlers that start work (POST /jobs, PATCH /jobs/{id}, POST
 * /jobs/{id}/generate) run parse → admit → act. Parsing reads the request
 * into the handler's own struct; admission decides against this server
 * whether the request may go on (a job: admit_job here; a generation:
 * genq.c's, which needs the job's started spec and checkpoint); acting
 * stores or runs it. A refusal from any of the three steps is an
 * admit_result: the HTTP status, the error code, the field and the
 * message, which admit_reply turns into the JSON error of docs/api.md in
 * one place. */
#ifndef TY_ADMIT_H
#define TY_ADMIT_H

#include "http.h"

struct jobspec;
struct exec_ops;

typedef struct admit_result {
    unsigned status;  /* 0: admitted; else the HTTP status of the refusal */
    const char *code; /* "invalid_spec", "conflict", ...: a static string */
    char field[128];  /* the offending input; "" for none */
    char msg[768];
} admit_result;

/* What a job is admitted against besides the server's configuration:
 * admit_ctx_of fills it from the running scheduler, tests by hand. */
typedef struct admit_ctx {
    int gpu_limit;               /* the most GPUs one job may ask for */
    const struct exec_ops *exec; /* the executor's abilities (executor.h) */
} admit_ctx;

/* Sets a refusal; returns its status. */
unsigned admit_refuse(admit_result *r, unsigned status, const char *code, const char *field,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A ty_err from the db or scheduler as a refusal, mapped as http_ty_error
 * maps it: TY_ENOENT 404 not_found, TY_ESTATE 409 conflict, TY_EINVAL and
 * TY_ESPEC 400 invalid_spec, TY_ENOSPC 503 unavailable, else 500 internal. */
unsigned admit_refuse_err(admit_result *r, const ty_err *err);
/* err (any code) as 400 invalid_spec naming err's field. */
unsigned admit_refuse_spec(admit_result *r, const ty_err *err);

admit_ctx admit_ctx_of(srv *s);

/* POST /jobs: a parsed spec, the server's default limits filled in
 * (ops_spec_defaults), against the allowed roots and store roots, the
 * model files (srv_spec_check_*), the budget caps (ops_check_limits), the
 * GPUs and the executor's abilities, the batch's split over the ranks,
 * the precision the backend can run, the disk (503 while full) and a
 * checkpoint store's credentials (a write and a delete). 0 when admitted,
 * else the refusal's status with r filled. */
unsigned admit_job(srv *s, const struct jobspec *spec, const admit_ctx *ctx, admit_result *r);

/* PATCH /jobs/{id}: the database is there. Whether the job's state takes
 * the change is decided in the write's own transaction (db_job_patch_apply),
 * where no other write can come between. */
unsigned admit_patch(srv *s, admit_result *r);

/* The refusal r (r->status set) as the JSON error. */
enum MHD_Result admit_reply(http_req *q, const admit_result *r);

#endif
