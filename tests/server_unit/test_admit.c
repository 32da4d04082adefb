/* test_admit.c — admission of a job spec (server/admit.c) without a
 * running server: the refusal's status, code, field and message for each
 * kind of check (roots, budgets, GPUs, the executor's abilities through
 * its ops table, the batch over the ranks), the same spec admitted where
 * the executor can run it, and a ty_err's mapping to a status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "executor.h"
#include "jobspec.h"
#include "ops.h"
#include "tyassert.h"

#define SPEC(res, extra)                                                                           \
    "{\"model\":{\"path\":\"/nonexistent/m\"},\"dataset\":{\"train\":\"/nonexistent/t\"},"         \
    "\"hyperparameters\":{\"max_steps\":5,\"batch_size\":8},\"resources\":" res extra "}"

static srv S;
static executor local_ex;
static const exec_ops cluster_ops = {.name = "cluster", .cluster = true};

/* Parses json as POST /jobs does (defaults filled in) and admits it. */
static unsigned admit(const char *json, const exec_ops *ex, int gpus, admit_result *r)
{
    jobspec spec;
    ty_err err = {0};
    REQUIRE(jobspec_parse_text(json, strlen(json), &spec, &err) == 0, "%s: %s", json, err.msg);
    ops_spec_defaults(&S.cfg, &spec);
    admit_ctx ctx = {.gpu_limit = gpus, .exec = ex};
    memset(r, 0, sizeof *r);
    unsigned st = admit_job(&S, &spec, &ctx, r);
    jobspec_free(&spec);
    return st;
}

static bool refused(const admit_result *r, unsigned status, const char *code, const char *field,
                    const char *msg)
{
    bool ok = r->status == status && r->code && !strcmp(r->code, code) &&
              !strcmp(r->field, field) && (!msg || !strcmp(r->msg, msg));
    if (!ok) fprintf(stderr, "got %u %s %s: %s\n", r->status, r->code, r->field, r->msg);
    return ok;
}

static void test_executor_abilities(void)
{
    admit_result r;
    const exec_ops *local = local_ex.ops;
    CHECK(admit(SPEC("{\"cpu_ranks\":2}", ""), local, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "resources.cpu_ranks",
                  "the job asks for 2 CPU ranks; this server has 1 CPU slots (--cpu-slots)"));
    CHECK(admit(SPEC("{\"nodes\":2}", ""), local, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "resources.nodes",
                  "the job asks for 2 nodes; this server runs engines on its own machine "
                  "(--executor local), only --executor slurm spans nodes"));
    /* A cluster places the ranks itself: both are admitted there. */
    CHECK(admit(SPEC("{\"cpu_ranks\":2}", ""), &cluster_ops, 0, &r) == 0, "%s", r.msg);
    CHECK(admit(SPEC("{\"nodes\":2}", ""), &cluster_ops, 0, &r) == 0, "%s", r.msg);
    CHECK(admit(SPEC("{\"cpu_ranks\":1}", ""), local, 0, &r) == 0 && r.status == 0, "%s", r.msg);
}

static void test_resources(void)
{
    admit_result r;
    CHECK(admit(SPEC("{\"gpus\":2}", ""), &cluster_ops, 1, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "resources.gpus",
                  "the job asks for 2 GPU(s); this server has 1"));
    /* 3 ranks x 2 nodes do not divide 8 rows. */
    CHECK(admit(SPEC("{\"cpu_ranks\":3,\"nodes\":2}", ""), &cluster_ops, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "resources.cpu_ranks",
                  "6 ranks do not divide the global batch of hyperparameters.batch_size x "
                  "grad_accum = 8 rows"));
    CHECK(admit(SPEC("{\"cpu_ranks\":4,\"nodes\":2}", ""), &cluster_ops, 0, &r) == 0, "%s", r.msg);
}

static void test_roots_and_budget(void)
{
    admit_result r;
    ty_err err = {0};
    CHECK(srv_config_set(&S.cfg, "allowed-roots", "/srv/in", &err) == 0, "%s", err.msg);
    CHECK(admit(SPEC("{}", ""), &cluster_ops, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "model.path", NULL));
    CHECK(srv_config_set(&S.cfg, "allowed-roots", "/", &err) == 0, "%s", err.msg);
    CHECK(admit(SPEC("{}", ",\"limits\":{\"max_cost\":1}"), &cluster_ops, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "limits.max_cost", NULL));
    /* The roots come before the executor: the first refusal is the answer. */
    CHECK(srv_config_set(&S.cfg, "allowed-roots", "/srv/in", &err) == 0, "%s", err.msg);
    CHECK(admit(SPEC("{\"nodes\":2}", ""), local_ex.ops, 0, &r) == 400 &&
          refused(&r, 400, "invalid_spec", "model.path", NULL));
    CHECK(srv_config_set(&S.cfg, "allowed-roots", "/", &err) == 0, "%s", err.msg);
}

static void test_err_mapping(void)
{
    admit_result r = {0};
    ty_err e = {.code = TY_ENOENT, .field = "", .msg = "no job 9"};
    CHECK(admit_refuse_err(&r, &e) == 404 && refused(&r, 404, "not_found", "", "no job 9"));
    e = (ty_err){.code = TY_ESTATE, .field = "priority", .msg = "job 9 is running"};
    CHECK(admit_refuse_err(&r, &e) == 409 && refused(&r, 409, "conflict", "priority", NULL));
    e = (ty_err){.code = TY_ENOSPC, .field = "x", .msg = "full"};
    CHECK(admit_refuse_err(&r, &e) == 503 && refused(&r, 503, "disk_full", "", "full"));
    e = (ty_err){.code = TY_EIO, .field = "x", .msg = "io"};
    CHECK(admit_refuse_err(&r, &e) == 500 && refused(&r, 500, "internal", "", "io"));
}

int main(void)
{
    ty_err err = {0};
    REQUIRE(srv_config_defaults(&S.cfg, &err) == 0, "%s", err.msg);
    /* statvfs of a missing data directory cannot tell: the disk check passes. */
    snprintf(S.cfg.data_dir, sizeof S.cfg.data_dir, "/nonexistent/trainyard-data");
    REQUIRE(srv_config_set(&S.cfg, "allowed-roots", "/", &err) == 0, "%s", err.msg);
    REQUIRE(exec_local_open(&S, &local_ex, &err) == 0, "%s", err.msg);
    test_executor_abilities();
    test_resources();
    test_roots_and_budget();
    test_err_mapping();
    return ty_summary("server_unit.admit");
}
