/* budget.c — what a job costs and what it may spend.
 *
 * Cost is running time (db_job_run_ms: starting, running, stopping; never
 * queued or paused) times the job's GPUs at its GPU-hour price, or times
 * one slot at the CPU-hour price. The price is fixed when a run starts
 * (jobs.hour_price, from the models of the GPUs it got), so a finished
 * job's cost does not move when the operator changes prices later. The
 * limits themselves are checked by watch.c while the job runs. */
#include "ops.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "jobspec.h"

/* Case-insensitive: does hay contain needle (n bytes)? */
static bool contains(const char *hay, const char *needle, size_t n)
{
    for (; *hay; hay++)
        if (!strncasecmp(hay, needle, n)) return true;
    return false;
}

/* "MODEL=PRICE,MODEL=PRICE": each model text non-empty, each price >= 0. */
int ops_check_prices(const char *key, const char *v, ty_err *err)
{
    for (const char *p = v; *p;) {
        const char *e = strchrnul(p, ','), *eq = memchr(p, '=', (size_t)(e - p));
        char price[64];
        size_t pl = eq ? (size_t)(e - eq - 1) : 0;
        char *end = NULL;
        double x = -1;
        if (eq && eq > p && pl > 0 && pl < sizeof price) {
            memcpy(price, eq + 1, pl);
            price[pl] = 0;
            x = strtod(price, &end);
        }
        if (x < 0 || !end || *end || !isfinite(x) || (*e && !e[1]))
            return ty_err_field(
                err, TY_EINVAL, key,
                "%s must be MODEL=PRICE pairs separated by commas (H100=4.1,A100=2.2), "
                "got '%.*s'",
                key, (int)(e - p), p);
        p = *e ? e + 1 : e;
    }
    return 0;
}

double ops_unit_price(const srv_config *c, const char *gpu_name)
{
    if (!gpu_name) return c->cpu_hour_price;
    for (const char *p = c->ops.gpu_hour_prices; *p;) {
        const char *e = strchrnul(p, ','), *eq = memchr(p, '=', (size_t)(e - p));
        if (eq && contains(gpu_name, p, (size_t)(eq - p))) return strtod(eq + 1, NULL);
        p = *e ? e + 1 : e;
    }
    return c->gpu_hour_price;
}

bool ops_job_cost(const srv_config *c, const db_job *j, int64_t now_ms, double *amount,
                  double *gpu_hours, double *cpu_hours)
{
    bool gpu = j->gpus_wanted > 0;
    double price = j->hour_price >= 0 ? j->hour_price : gpu ? c->gpu_hour_price : c->cpu_hour_price;
    *amount = *gpu_hours = *cpu_hours = 0;
    if (price < 0) return false;
    double hours = (double)db_job_run_ms(j, now_ms) / 3600000.0;
    *gpu_hours = gpu ? hours * j->gpus_wanted : 0.0;
    *cpu_hours = gpu ? 0.0 : hours;
    *amount = (gpu ? *gpu_hours : *cpu_hours) * price;
    return true;
}

/* Is the URL's host (and port) among the allowed "host" / "host:port"
 * entries? A bare host allows any port. */
static bool host_allowed(const char *allowed, const char *url)
{
    const char *h = strstr(url, "://");
    if (!h) return false;
    h += 3;
    size_t hn = strcspn(h, "/?#");
    const char *at = memchr(h, '@', hn);
    if (at) return false; /* no credentials in a job's webhook */
    char hostport[300];
    if (hn >= sizeof hostport) return false;
    memcpy(hostport, h, hn);
    hostport[hn] = 0;
    char *colon = hostport[0] == '[' ? strstr(hostport, "]:") : strrchr(hostport, ':');
    if (colon && hostport[0] == '[') colon++;
    size_t host_len = colon ? (size_t)(colon - hostport) : hn;
    for (const char *p = allowed; *p;) {
        const char *e = strchrnul(p, ',');
        size_t n = (size_t)(e - p);
        while (n && isspace((unsigned char)*p))
            p++, n--;
        while (n && isspace((unsigned char)p[n - 1]))
            n--;
        if (n && ((n == hn && !strncasecmp(p, hostport, n)) ||
                  (n == host_len && !strncasecmp(p, hostport, n))))
            return true;
        p = *e ? e + 1 : e;
    }
    return false;
}

static bool priced(const srv_config *c, const jobspec *s)
{
    return s->gpus > 0 ? (c->gpu_hour_price >= 0 || c->ops.gpu_hour_prices[0])
                       : c->cpu_hour_price >= 0;
}

void ops_spec_defaults(const srv_config *c, jobspec *s)
{
    /* A cap is the default when no default is set, so every job is
     * bounded once a cap exists. */
    if (s->max_cost < 0 && priced(c, s))
        s->max_cost = c->ops.max_cost_default >= 0 ? c->ops.max_cost_default : c->ops.max_cost_cap;
    if (s->max_runtime_s == 0)
        s->max_runtime_s =
            c->ops.max_runtime_default ? c->ops.max_runtime_default : c->ops.max_runtime_cap;
    if (s->max_tokens == 0)
        s->max_tokens =
            c->ops.max_tokens_default ? c->ops.max_tokens_default : c->ops.max_tokens_cap;
}

/* Each of the spec's webhooks must go to an allowed host. */
static int check_webhooks(const srv_config *c, const jobspec *s, ty_err *err)
{
    for (int i = 0; i < s->n_webhooks; i++)
        if (!host_allowed(c->ops.webhook_allowed_hosts, s->webhooks[i])) {
            char f[32];
            snprintf(f, sizeof f, "webhooks[%d]", i);
            return ty_err_field(err, TY_EINVAL, f,
                                "%s: the host of %s is not in this server's webhook-allowed-hosts "
                                "(%s)",
                                f, s->webhooks[i],
                                c->ops.webhook_allowed_hosts[0] ? c->ops.webhook_allowed_hosts
                                                                : "none");
        }
    return 0;
}

int ops_check_limits(const srv_config *c, const jobspec *s, ty_err *err)
{
    bool gpu = s->gpus > 0;
    if (c->ops.max_cost_cap >= 0 && s->max_cost > c->ops.max_cost_cap)
        return ty_err_field(err, TY_EINVAL, "limits.max_cost",
                            "limits.max_cost: %g is over this server's cap of %g %s", s->max_cost,
                            c->ops.max_cost_cap, c->currency);
    if (c->ops.max_runtime_cap && s->max_runtime_s > c->ops.max_runtime_cap)
        return ty_err_field(err, TY_EINVAL, "limits.max_runtime_s",
                            "limits.max_runtime_s: %lld is over this server's cap of %lld s",
                            (long long)s->max_runtime_s, (long long)c->ops.max_runtime_cap);
    if (c->ops.max_tokens_cap && s->max_tokens > c->ops.max_tokens_cap)
        return ty_err_field(err, TY_EINVAL, "limits.max_tokens",
                            "limits.max_tokens: %lld is over this server's cap of %lld",
                            (long long)s->max_tokens, (long long)c->ops.max_tokens_cap);
    if (s->max_cost >= 0 && !priced(c, s))
        return ty_err_field(err, TY_EINVAL, "limits.max_cost",
                            "limits.max_cost: this server has no %s price, so a cost cannot be "
                            "measured (set --%s-hour-price)",
                            gpu ? "GPU-hour" : "CPU-hour", gpu ? "gpu" : "cpu");
    return check_webhooks(c, s, err);
}
