/* usage.c — GET /usage and the usage counters on /metrics.
 *
 * Both read the usage ledger (db_ops.h): one row per finished job, written
 * in its final transition, kept when the job is deleted. So a window's
 * usage never changes once the window is over, and the Prometheus totals
 * only grow. A job counts once it has finished, in the window its end
 * falls in; a running job's spending so far is its own `cost`. */
#include "ops.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "db_ops.h"
#include "state.h"
#include "tyutil.h"

typedef struct group {
    char key[72];
    bool null_key;
    double gpu_s, cpu_s, cost;
    bool has_cost;
    int64_t tokens, jobs[3]; /* succeeded, failed, cancelled */
} group;

typedef struct groups {
    group *g;
    int n, cap;
} groups;

static group *group_get(groups *gs, const char *key)
{
    for (int i = 0; i < gs->n; i++)
        if ((!key && gs->g[i].null_key) ||
            (key && !gs->g[i].null_key && !strcmp(gs->g[i].key, key)))
            return &gs->g[i];
    if (gs->n == gs->cap) {
        int nc = gs->cap ? gs->cap * 2 : 16;
        group *ng = realloc(gs->g, (size_t)nc * sizeof *ng);
        if (!ng) return NULL;
        gs->g = ng;
        gs->cap = nc;
    }
    group *g = &gs->g[gs->n++];
    memset(g, 0, sizeof *g);
    g->null_key = !key;
    if (key) snprintf(g->key, sizeof g->key, "%s", key);
    return g;
}

static void add_row(group *g, const db_usage_row *r)
{
    if (!g) return;
    double s = (double)r->run_ms / 1000.0;
    if (r->gpus > 0)
        g->gpu_s += s * r->gpus;
    else
        g->cpu_s += s;
    if (r->has_cost) {
        g->cost += r->cost;
        g->has_cost = true;
    }
    g->tokens += r->tokens;
    int k = !strcmp(r->state, "succeeded") ? 0 : !strcmp(r->state, "failed") ? 1 : 2;
    g->jobs[k]++;
}

/* RFC 3339 ("2026-12-02T14:32:22Z", fractions and offsets "Z" only) or a
 * date ("2026-12-02", midnight UTC) to ms. */
static bool parse_time(const char *v, int64_t *ms)
{
    struct tm tm = {0};
    int n = 0;
    double sec = 0;
    if (sscanf(v, "%4d-%2d-%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &n) != 3 || n != 10)
        return false;
    if (v[10] == 'T') {
        int m = 0;
        if (sscanf(v + 11, "%2d:%2d:%lf%n", &tm.tm_hour, &tm.tm_min, &sec, &m) != 3 ||
            strcmp(v + 11 + m, "Z") || sec < 0 || sec >= 61)
            return false;
    } else if (v[10]) {
        return false;
    }
    if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59)
        return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    *ms = (int64_t)t * 1000 + (int64_t)(sec * 1000);
    return true;
}

static json_t *group_json(const group *g, const char *currency, bool with_key)
{
    json_t *o =
        json_pack("{sf sf so ss sI s{sI sI sI}}", "gpu_seconds", g->gpu_s, "cpu_seconds", g->cpu_s,
                  "cost", g->has_cost ? json_real(g->cost) : json_null(), "currency", currency,
                  "tokens", (json_int_t)g->tokens, "jobs", "succeeded", (json_int_t)g->jobs[0],
                  "failed", (json_int_t)g->jobs[1], "cancelled", (json_int_t)g->jobs[2]);
    if (with_key) json_object_set_new(o, "key", g->null_key ? json_null() : json_string(g->key));
    return o;
}

/* CSV cells: keys are tags, token names or dates; a token name may hold a
 * comma or a quote, so every key is quoted. */
static void csv_key(char *out, size_t cap, const group *g)
{
    size_t o = 0;
    if (g->null_key) {
        out[0] = 0;
        return;
    }
    out[o++] = '"';
    for (const char *c = g->key; *c && o + 3 < cap; c++) {
        if (*c == '"') out[o++] = '"';
        out[o++] = *c;
    }
    out[o++] = '"';
    out[o] = 0;
}

enum MHD_Result ops_get_usage(http_req *q)
{
    srv *s = q->s;
    int64_t from = 0, to = INT64_MAX;
    const char *f = http_arg(q, "from"), *t = http_arg(q, "to"), *by = http_arg(q, "group_by"),
               *fmt = http_arg(q, "format");
    if (f && !parse_time(f, &from))
        return http_error(q, 400, "invalid_spec", "from",
                          "from must be an RFC 3339 UTC time (2026-12-02T00:00:00Z) or a date "
                          "(2026-12-02)");
    if (t && !parse_time(t, &to))
        return http_error(q, 400, "invalid_spec", "to",
                          "to must be an RFC 3339 UTC time (2026-12-02T00:00:00Z) or a date "
                          "(2026-12-02)");
    if (from > to) return http_error(q, 400, "invalid_spec", "to", "to is before from");
    if (by && strcmp(by, "token") && strcmp(by, "tag") && strcmp(by, "day"))
        return http_error(q, 400, "invalid_spec", "group_by", "group_by must be token, tag or day");
    if (fmt && strcmp(fmt, "json") && strcmp(fmt, "csv"))
        return http_error(q, 400, "invalid_spec", "format", "format must be json or csv");
    const char *acc = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Accept");
    bool csv = fmt ? !strcmp(fmt, "csv") : (acc && strstr(acc, "text/csv") != NULL);
    db *d = srv_db(s);
    db_usage_row *rows;
    int n;
    ty_err err = {0};
    if (!d || db_usage_list(d, from, to, &rows, &n, &err))
        return http_error(q, 500, "internal", NULL, "%s", err.msg);
    groups gs = {0};
    group total = {0};
    for (int i = 0; i < n; i++) {
        const db_usage_row *r = &rows[i];
        add_row(&total, r);
        if (!by) continue;
        if (by[1] == 'o') { /* token */
            add_row(group_get(&gs, r->token_name), r);
        } else if (by[0] == 'd') { /* day (UTC) */
            char day[16];
            time_t sec = (time_t)(r->finished_ms / 1000);
            struct tm tm;
            gmtime_r(&sec, &tm);
            strftime(day, sizeof day, "%Y-%m-%d", &tm);
            add_row(group_get(&gs, day), r);
        } else { /* tag: a job counts under each of its tags */
            json_t *tags = json_loads(r->tags ? r->tags : "[]", 0, NULL);
            if (json_array_size(tags) == 0) add_row(group_get(&gs, NULL), r);
            for (size_t k = 0; k < json_array_size(tags); k++)
                add_row(group_get(&gs, json_string_value(json_array_get(tags, k))), r);
            json_decref(tags);
        }
    }
    db_usage_free(rows, n);
    if (!by) { /* one group: the total */
        total.null_key = true;
        group *g = group_get(&gs, NULL);
        if (g) *g = total;
    }
    enum MHD_Result res;
    if (csv) {
        size_t cap = 256 + (size_t)gs.n * 400, len = 0;
        char *out = malloc(cap);
        if (!out) {
            free(gs.g);
            return MHD_NO;
        }
        len = (size_t)snprintf(out, cap,
                               "key,gpu_seconds,cpu_seconds,cost,currency,tokens,"
                               "jobs_succeeded,jobs_failed,jobs_cancelled\n");
        for (int i = 0; i < gs.n; i++) {
            const group *g = &gs.g[i];
            char key[160], cost[48] = "";
            csv_key(key, sizeof key, g);
            if (g->has_cost) snprintf(cost, sizeof cost, "%.6f", g->cost);
            len += (size_t)snprintf(
                out + len, cap - len, "%s,%.3f,%.3f,%s,%s,%lld,%lld,%lld,%lld\n", key, g->gpu_s,
                g->cpu_s, cost, s->cfg.currency, (long long)g->tokens, (long long)g->jobs[0],
                (long long)g->jobs[1], (long long)g->jobs[2]);
        }
        res = http_bytes(q, 200, "text/csv; charset=utf-8", out, len, true);
        free(out);
    } else {
        json_t *arr = json_array();
        for (int i = 0; i < gs.n; i++)
            json_array_append_new(arr, group_json(&gs.g[i], s->cfg.currency, true));
        char tf[32], tt[32];
        srv_time_fmt(from, tf);
        srv_time_fmt(to == INT64_MAX ? 0 : to, tt);
        res = http_json(q, 200,
                        json_pack("{so so so so so}", "from",
                                  from > 0 ? json_string(tf) : json_null(), "to",
                                  to != INT64_MAX ? json_string(tt) : json_null(), "group_by",
                                  by ? json_string(by) : json_null(), "groups", arr, "total",
                                  group_json(&total, s->cfg.currency, false)));
    }
    free(gs.g);
    return res;
}

char *ops_prom_usage(srv *s, char *text)
{
    if (!text) return NULL;
    db *d = srv_db(s);
    db_usage_row *rows;
    int n;
    ty_err err = {0};
    if (!d || db_usage_list(d, 0, INT64_MAX, &rows, &n, &err)) return text;
    group t = {0};
    for (int i = 0; i < n; i++)
        add_row(&t, &rows[i]);
    db_usage_free(rows, n);
    char *more = NULL;
    int k = asprintf(
        &more,
        "# HELP trainyard_gpu_seconds_total GPU-seconds of running time of finished jobs.\n"
        "# TYPE trainyard_gpu_seconds_total counter\n"
        "trainyard_gpu_seconds_total %.3f\n"
        "# HELP trainyard_cpu_seconds_total CPU-slot-seconds of running time of finished jobs.\n"
        "# TYPE trainyard_cpu_seconds_total counter\n"
        "trainyard_cpu_seconds_total %.3f\n"
        "# HELP trainyard_cost_total Cost of finished jobs whose price was known.\n"
        "# TYPE trainyard_cost_total counter\n"
        "trainyard_cost_total{currency=\"%s\"} %.6f\n"
        "# HELP trainyard_tokens_trained_total Tokens trained by finished jobs.\n"
        "# TYPE trainyard_tokens_trained_total counter\n"
        "trainyard_tokens_trained_total %lld\n"
        "# HELP trainyard_jobs_finished_total Jobs finished, by final state.\n"
        "# TYPE trainyard_jobs_finished_total counter\n"
        "trainyard_jobs_finished_total{state=\"succeeded\"} %lld\n"
        "trainyard_jobs_finished_total{state=\"failed\"} %lld\n"
        "trainyard_jobs_finished_total{state=\"cancelled\"} %lld\n",
        t.gpu_s, t.cpu_s, s->cfg.currency, t.cost, (long long)t.tokens, (long long)t.jobs[0],
        (long long)t.jobs[1], (long long)t.jobs[2]);
    if (k < 0) return text;
    size_t a = strlen(text), b = strlen(more);
    char *out = realloc(text, a + b + 1);
    if (!out) {
        free(more);
        return text;
    }
    memcpy(out + a, more, b + 1);
    free(more);
    return out;
}
