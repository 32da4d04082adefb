/* test_ops.c — the pure parts of the operations features and
 * their SQL: the webhook signature against a vector computed by Python's
 * hmac, prices per GPU model, limits at submit (defaults, caps, a price
 * required for max_cost, webhook hosts), and db_ops.h: PATCH only while
 * waiting, the usage ledger written by the final transition and kept after
 * a delete, the webhook cursor and outbox. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db_ops.h"
#include "jobspec.h"
#include "ops.h"
#include "tyassert.h"
#include "tyutil.h"

static void test_sign(void)
{
    char sig[65];
    /* python3: hmac.new(b"s3cret", b'1796220000.{"a":1}', hashlib.sha256).hexdigest() */
    webhook_sign("s3cret", 1796220000LL, "{\"a\":1}", sig);
    CHECK(!strcmp(sig, "24706040a59b74e39b554abba7994d54749bb7a3f8ba5894c2a115a157eeaafa"), "%s",
          sig);
}

static void test_prices(void)
{
    srv_config c;
    ty_err err = {0};
    REQUIRE(srv_config_defaults(&c, &err) == 0, "%s", err.msg);
    CHECK(ops_unit_price(&c, "NVIDIA H100 80GB HBM3") < 0 && ops_unit_price(&c, NULL) < 0);
    CHECK(srv_config_set(&c, "gpu-hour-prices", "h100=4.5,A100=2", &err) == 0, "%s", err.msg);
    CHECK(srv_config_set(&c, "gpu-hour-price", "1", &err) == 0);
    CHECK(ops_unit_price(&c, "NVIDIA H100 80GB HBM3") == 4.5);
    CHECK(ops_unit_price(&c, "NVIDIA A100-SXM4-40GB") == 2.0);
    CHECK(ops_unit_price(&c, "Tesla T4") == 1.0);
    const char *bad[] = {"H100", "=3", "H100=-1", "H100=x", "H100=1,", "H100=inf"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ty_err e = {0};
        CHECK(srv_config_set(&c, "gpu-hour-prices", bad[i], &e) == TY_EINVAL &&
                  !strcmp(e.field, "gpu-hour-prices"),
              "%s accepted", bad[i]);
    }
    ty_err e = {0};
    CHECK(srv_config_set(&c, "webhook-urls", "http://a/x,ftp://b", &e) == TY_EINVAL);
    CHECK(srv_config_is_secret("webhook-secret"));
    /* The cost of a job at its run's price. */
    db_job j = {.gpus_wanted = 2, .run_ms = 1800000, .hour_price = 3.0};
    double amount, gh, ch;
    CHECK(ops_job_cost(&c, &j, 0, &amount, &gh, &ch) && gh == 1.0 && ch == 0 && amount == 3.0);
    j.hour_price = -1; /* not started: the GPU-hour price */
    CHECK(ops_job_cost(&c, &j, 0, &amount, &gh, &ch) && amount == 1.0);
    j.gpus_wanted = 0; /* a CPU job without a CPU price: unknown */
    CHECK(!ops_job_cost(&c, &j, 0, &amount, &gh, &ch));
}

static int check_spec(srv_config *c, const char *json, jobspec *s, ty_err *err)
{
    ty_err perr = {0};
    REQUIRE(jobspec_parse_text(json, strlen(json), s, &perr) == 0, "%s", perr.msg);
    ops_spec_defaults(c, s);
    return ops_check_limits(c, s, err);
}

#define SPEC(extra)                                                                                \
    "{\"model\":{\"path\":\"/m\"},\"dataset\":{\"train\":\"/"                                      \
    "t\"},\"hyperparameters\":{\"max_steps\":"                                                     \
    "5}" extra "}"

static void test_limits(void)
{
    srv_config c;
    ty_err err = {0};
    jobspec s;
    REQUIRE(srv_config_defaults(&c, &err) == 0);
    /* max_cost needs a price for the job's kind. */
    CHECK(check_spec(&c, SPEC(",\"limits\":{\"max_cost\":2}"), &s, &err) == TY_EINVAL &&
          !strcmp(err.field, "limits.max_cost"));
    jobspec_free(&s);
    CHECK(srv_config_set(&c, "cpu-hour-price", "2", &err) == 0);
    /* A cost limit the server would fill into specs is one a spec may carry. */
    const char *bad_cost[] = {"0", "1e13", "-1"};
    for (int i = 0; i < 3; i++) {
        ty_err e = {0};
        CHECK(srv_config_set(&c, i % 2 ? "max-cost-cap" : "max-cost-default", bad_cost[i], &e) ==
                      TY_EINVAL &&
                  strstr(e.msg, bad_cost[i]),
              "cost limit %s taken: %s", bad_cost[i], e.msg);
    }
    CHECK(srv_config_set(&c, "max-cost-cap", "1e12", &err) == 0, "%s", err.msg);
    CHECK(srv_config_set(&c, "max-runtime-cap", "60", &err) == 0);
    CHECK(srv_config_set(&c, "max-tokens-default", "1000", &err) == 0);
    CHECK(srv_config_set(&c, "max-tokens-cap", "5000", &err) == 0);
    CHECK(check_spec(&c, SPEC(",\"limits\":{\"max_cost\":2}"), &s, &err) == 0, "%s", err.msg);
    /* Defaults filled in: the tokens default, the runtime cap (no default). */
    CHECK(s.max_cost == 2 && s.max_tokens == 1000 && s.max_runtime_s == 60);
    jobspec_free(&s);
    ty_err_clear(&err);
    CHECK(check_spec(&c, SPEC(",\"limits\":{\"max_runtime_s\":61}"), &s, &err) == TY_EINVAL &&
          !strcmp(err.field, "limits.max_runtime_s"));
    jobspec_free(&s);
    ty_err_clear(&err);
    CHECK(check_spec(&c, SPEC(",\"limits\":{\"max_tokens\":5001}"), &s, &err) == TY_EINVAL &&
          !strcmp(err.field, "limits.max_tokens"));
    jobspec_free(&s);
    /* Webhook hosts: host (any port) or host:port; no credentials. */
    CHECK(srv_config_set(&c, "webhook-allowed-hosts", "hooks.example.com, 10.0.0.1:9000", &err) ==
          0);
    struct {
        const char *url;
        bool ok;
    } hooks[] = {
        {"https://hooks.example.com/a", true},     {"http://hooks.example.com:8080/a", true},
        {"http://10.0.0.1:9000/x", true},          {"http://10.0.0.1/x", false},
        {"http://10.0.0.1:9001/x", false},         {"https://evil.example.com/a", false},
        {"https://u:p@hooks.example.com/", false}, {"https://hooks.example.com.evil.org/", false},
    };
    for (size_t i = 0; i < sizeof hooks / sizeof *hooks; i++) {
        char json[512];
        snprintf(json, sizeof json, SPEC(",\"webhooks\":[\"%s\"]"), hooks[i].url);
        ty_err_clear(&err);
        int rc = check_spec(&c, json, &s, &err);
        CHECK((rc == 0) == hooks[i].ok && (rc == 0 || !strcmp(err.field, "webhooks[0]")), "%s: %s",
              hooks[i].url, err.msg);
        jobspec_free(&s);
    }
}

static void test_db_ops(void)
{
    char dir[] = "/tmp/ty-ops-XXXXXX", path[64];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t.db", dir);
    ty_err err = {0};
    db *d;
    REQUIRE(db_open(path, &d, &err) == 0, "%s", err.msg);
    int64_t cursor = -1;
    CHECK(db_webhook_cursor(d, &cursor, &err) == 0 && cursor == 0);
    db_new_job nj = {.name = "a",
                     .spec = "{\"priority\":0}",
                     .max_restarts = 3,
                     .max_steps = 5,
                     .tags = "[\"x\"]",
                     .token_name = "alice"};
    int64_t id;
    bool existing;
    REQUIRE(db_job_insert(d, &nj, &id, &existing, NULL, &err) == 0, "%s", err.msg);
    /* PATCH while queued: columns and spec. */
    db_job_patch p = {.has_priority = true,
                      .priority = 7,
                      .has_tags = true,
                      .tags = "[\"y\",\"z\"]",
                      .has_name = true,
                      .name = NULL};
    CHECK(db_job_patch_apply(d, id, &p, &err) == 0, "%s", err.msg);
    db_job j;
    REQUIRE(db_job_get(d, id, &j, &err) == 0);
    CHECK(j.priority == 7 && !strcmp(j.tags, "[\"y\",\"z\"]") && j.name == NULL &&
              strstr(j.spec, "\"priority\":7") && strstr(j.spec, "\"tags\":[\"y\",\"z\"]") &&
              !strstr(j.spec, "\"name\"") && !strcmp(j.token_name, "alice"),
          "%s", j.spec);
    db_job_free(&j);
    db_job *list;
    int n;
    CHECK(db_job_list_tag(d, 0, "z", 0, 10, &list, &n, &err) == 0 && n == 1);
    db_jobs_free(list, n);
    CHECK(db_job_list_tag(d, 0, "x", 0, 10, &list, &n, &err) == 0 && n == 0);
    db_jobs_free(list, n);
    /* Running: refused, naming the state. */
    CHECK(db_job_transition(d, id, ~0u, JOB_STARTING, "s", NULL, NULL, NULL, &err) == 0);
    ty_err_clear(&err);
    CHECK_ERR(db_job_patch_apply(d, id, &p, &err), err, "starting; only queued or paused");
    CHECK(db_job_patch_apply(d, 9999, &p, &err) == TY_ENOENT);
    /* The final transition writes the usage row, kept after a delete. */
    db_job_update hp = {.has_hour_price = true, .hour_price = 3600};
    CHECK(db_job_update_fields(d, id, &hp, &err) == 0);
    CHECK(db_job_transition(d, id, ~0u, JOB_RUNNING, "r", NULL, NULL, NULL, &err) == 0);
    db_event_in ev = {.job_id = id,
                      .ts_ms = ty_now_ms(),
                      .type = "metric",
                      .data = "{\"step\":5,\"loss\":1.0,\"tokens\":640}"};
    CHECK(db_events_append(d, &ev, 1, NULL, &err) == 0);
    db_usage_row *rows;
    CHECK(db_usage_list(d, 0, INT64_MAX, &rows, &n, &err) == 0 && n == 0);
    db_usage_free(rows, n);
    usleep(20000);
    db_job_update fin = {.set_finished = true};
    CHECK(db_job_transition(d, id, ~0u, JOB_SUCCEEDED, "done", &fin, NULL, NULL, &err) == 0);
    REQUIRE(db_usage_list(d, 0, INT64_MAX, &rows, &n, &err) == 0 && n == 1);
    CHECK(rows[0].job_id == id && !strcmp(rows[0].state, "succeeded") && rows[0].tokens == 640 &&
          rows[0].run_ms >= 20 && rows[0].has_cost &&
          rows[0].cost > rows[0].run_ms / 1000.0 - 1e-9 &&
          rows[0].cost < rows[0].run_ms / 1000.0 + 1e-9 && !strcmp(rows[0].token_name, "alice") &&
          !strcmp(rows[0].tags, "[\"y\",\"z\"]"));
    int64_t fin_ms = rows[0].finished_ms;
    db_usage_free(rows, n);
    CHECK(db_usage_list(d, fin_ms + 1, INT64_MAX, &rows, &n, &err) == 0 && n == 0);
    db_usage_free(rows, n);
    /* Webhooks: the job's state events, fanned out, claimed, retried. */
    db_event *evs;
    CHECK(db_webhook_events(d, 0, 100, &evs, &n, &err) == 0 && n >= 4 &&
          !strcmp(evs[0].type, "state"));
    const char *urls[] = {"http://a/1", "http://b/2"};
    char *bodies[] = {"{\"x\":1}", "{\"x\":1}"};
    CHECK(db_webhook_fanout(d, evs[0].id, urls, bodies, 2, &err) == 0);
    CHECK(db_webhook_cursor(d, &cursor, &err) == 0 && cursor == evs[0].id);
    db_events_free(evs, n);
    db_webhook *due;
    CHECK(db_webhook_due(d, ty_now_ms(), 10, &due, &n, &err) == 0 && n == 2 &&
          !strcmp(due[0].url, "http://a/1"));
    CHECK(db_webhook_result(d, due[0].id, "delivered", 0, NULL, &err) == 0);
    CHECK(db_webhook_result(d, due[1].id, "pending", ty_now_ms() + 60000, "HTTP 500", &err) == 0);
    db_webhooks_free(due, n);
    CHECK(db_webhook_due(d, ty_now_ms(), 10, &due, &n, &err) == 0 && n == 0); /* not due yet */
    db_webhooks_free(due, n);
    int count = 0;
    CHECK(db_webhook_count(d, "delivered", &count, &err) == 0 && count == 1);
    CHECK(db_webhook_count(d, "pending", &count, &err) == 0 && count == 1);
    /* The ledger outlives the job (the Prometheus totals never go down). */
    CHECK(db_job_delete(d, id, &err) == 0);
    CHECK(db_usage_list(d, 0, INT64_MAX, &rows, &n, &err) == 0 && n == 1);
    db_usage_free(rows, n);
    db_close(d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_sign();
    test_prices();
    test_limits();
    test_db_ops();
    return ty_summary("server_unit.ops");
}
