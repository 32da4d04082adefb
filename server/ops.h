/* ops.h — running trainyard as a team: budgets, stalls and idle
 * GPUs, the queue view and PATCH, usage, webhooks.
 *
 * Each concern is its own file (budget.c, watch.c, queue.c, usage.c,
 * webhook.c); the settings are rows of config.c's table; the scheduler calls in at a few points (a
 * metric arrived, a tick, a GPU sweep, a run ended) and acts on the answer, so sched.c keeps only
 * the hooks. docs/server.md "Operations" is the behaviour, docs/api.md the shapes. */
#ifndef TY_OPS_H
#define TY_OPS_H

#include <jansson.h>

#include "http.h"

struct jobspec;

/* ---- settings (config.c's table calls these checks) ------------------------ */

/* gpu-hour-prices: "MODEL=PRICE,..." (budget.c). */
int ops_check_prices(const char *key, const char *v, ty_err *err);
/* webhook-urls: http:// or https:// URLs separated by commas (webhook.c). */
int ops_check_urls(const char *key, const char *v, ty_err *err);

/* ---- budgets and cost (budget.c) --------------------------------------------- */

/* The hourly price of one GPU named `name` (the first gpu-hour-prices entry
 * whose model text it contains, case-insensitive, else gpu-hour-price), or
 * the CPU-hour price for name NULL; < 0 when none is configured. */
double ops_unit_price(const srv_config *c, const char *gpu_name);
/* The job's cost so far; false (all zero) when no price applies. */
bool ops_job_cost(const srv_config *c, const db_job *j, int64_t now_ms, double *amount,
                  double *gpu_hours, double *cpu_hours);
/* At parse: the server's default limits filled in where the spec has
 * none (a cap stands in for a missing default). */
void ops_spec_defaults(const srv_config *c, struct jobspec *spec);
/* At admission (admit.c): a limit over the server's cap refused (TY_EINVAL
 * naming limits.<field>), max_cost refused where no price applies, job
 * webhooks outside webhook-allowed-hosts refused (webhooks[i]). */
int ops_check_limits(const srv_config *c, const struct jobspec *spec, ty_err *err);

/* ---- watching runs (watch.c) ----------------------------------------------------- */

typedef enum {
    OPS_GO_ON = 0,
    OPS_STOP_BUDGET, /* a limit was reached: checkpoint, stop, succeeded (stop_reason budget) */
    OPS_RESTART,     /* stalled, on_stall restart: requeue from the newest checkpoint */
    OPS_FAIL         /* stalled, on_stall fail */
} ops_action;

/* A metric event of the job's current run arrived (scheduler thread). */
void ops_note_metric(srv *s, int64_t job_id, int64_t step);
/* Checks a running job's limits and silence (scheduler thread, each tick;
 * rate-limited inside). Pushes the `budget` / `stall` event itself; the
 * caller carries out the action, why says it in words. */
ops_action ops_check_run(srv *s, int64_t job_id, char *why, size_t cap);
/* The run ended: forget its silence and idleness. */
void ops_run_ended(int64_t job_id);
/* One sweep of GPU samples (sampler thread): `idle_gpu` events. */
void ops_gpu_sweep(srv *s, const srv_gpu_sample *g, int n);
/* When the job's current run was found stalled (ms), 0 if it is not. */
int64_t ops_stalled_since(int64_t job_id);

/* ---- routes (queue.c, usage.c, webhook.c) ---------------------------------------- */

enum MHD_Result ops_get_queue(http_req *q);
enum MHD_Result ops_patch_job(http_req *q);
enum MHD_Result ops_get_usage(http_req *q);
/* text (malloc'd Prometheus exposition) with the usage ledger's totals
 * appended; returns the new buffer (text is consumed). */
char *ops_prom_usage(srv *s, char *text);

/* ---- webhooks (webhook.c) -------------------------------------------------------- */

typedef struct webhooks webhooks;
/* Starts the delivery thread (nothing to do without any URL configured or
 * allowed); NULL with err on failure. */
webhooks *webhooks_start(srv *s, ty_err *err);
void webhooks_wake(webhooks *w);
void webhooks_stop(webhooks *w);
/* HMAC-SHA256 of "<ts>.<body>" with secret, as 64 hex characters. */
void webhook_sign(const char *secret, long long ts, const char *body, char out[65]);

#endif
