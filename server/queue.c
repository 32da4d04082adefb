/* queue.c — GET /queue and PATCH /jobs/{id}.
 *
 * The queue view replays the scheduler's rule (priority, then submission;
 * a job that does not fit is skipped, no reservation) against the free
 * GPUs and CPU slots now and the running jobs' ETAs, to say why each job
 * waits and when it may start. The estimate assumes jobs ahead start as
 * soon as they fit and keep their slots (their own end is not known yet);
 * it is null when the slots a job needs are held by runs without an ETA.
 *
 * PATCH runs parse → admit → apply (admit.h); the state the job must be in
 * is checked by the write's own transaction. */
#include "ops.h"

#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "db_ops.h"
#include "scheduler.h"
#include "jobspec.h"
#include "jobview.h"
#include "routes.h"
#include "state.h"
#include "tyutil.h"
#include "tyjson.h"

/* Slots of one kind (GPUs, or CPU slots) over time: free now, released at
 * the running jobs' ETAs, taken by the queued jobs ahead. */
typedef struct pool {
    int free_now, taken;
    int64_t first_unknown; /* a queued job ahead that took slots for a time not known, or 0 */
    int nrel;
    struct rel {
        double t;
        int n;
    } rel[256];
} pool;

static int cmp_rel(const void *a, const void *b)
{
    double x = ((const struct rel *)a)->t, y = ((const struct rel *)b)->t;
    return (x > y) - (x < y);
}

/* The earliest time (seconds from now) at which want slots are free after
 * what the jobs ahead took; -1 if never known. Takes them. */
static double pool_take(pool *p, int want)
{
    int have = p->free_now - p->taken;
    double t = 0;
    for (int k = 0; have < want && k < p->nrel; k++) {
        have += p->rel[k].n;
        t = p->rel[k].t;
    }
    if (have < want) return -1;
    p->taken += want;
    return t;
}

static json_t *est_json(double t)
{
    if (t < 0) return json_null();
    char ts[32];
    srv_time_fmt(ty_now_ms() + (int64_t)(t * 1000), ts);
    return json_string(ts);
}

enum MHD_Result ops_get_queue(http_req *q)
{
    srv *s = q->s;
    db *d = srv_db(s);
    ty_err err = {0};
    int64_t *ids = NULL, *live = NULL, *paused = NULL;
    int n = 0, nlive = 0, npaused = 0;
    if (!d || db_job_queued_ids(d, &ids, &n, &err) ||
        db_job_ids_in(d, JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING) | JOB_BIT(JOB_STOPPING),
                      &live, &nlive, &err) ||
        db_job_ids_in(d, JOB_BIT(JOB_PAUSED), &paused, &npaused, &err)) {
        free(ids);
        free(live);
        return http_error(q, 500, "internal", NULL, "%s", err.msg);
    }
    int gfree, cfree, gtotal = sched_gpu_count(s->sched);
    sched_capacity(s->sched, &gfree, &cfree);
    pool gp = {.free_now = gfree}, cp = {.free_now = cfree};
    for (int i = 0; i < nlive; i++) {
        db_job j;
        if (db_job_get(d, live[i], &j, &err)) continue;
        json_t *m = j.last_metric ? json_loads(j.last_metric, 0, NULL) : NULL;
        double eta = jobview_eta(&j, json_integer_value(json_object_get(m, "step")));
        json_decref(m);
        pool *p = j.gpus_wanted > 0 ? &gp : &cp;
        if (eta >= 0 && p->nrel < 256)
            p->rel[p->nrel++] = (struct rel){eta, j.gpus_wanted > 0 ? j.gpus_wanted : 1};
        db_job_free(&j);
    }
    qsort(gp.rel, (size_t)gp.nrel, sizeof *gp.rel, cmp_rel);
    qsort(cp.rel, (size_t)cp.nrel, sizeof *cp.rel, cmp_rel);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        db_job j;
        if (db_job_get(d, ids[i], &j, &err)) continue;
        bool gpu = j.gpus_wanted > 0;
        pool *p = gpu ? &gp : &cp;
        int want = gpu ? j.gpus_wanted : 1, free_before = p->free_now - p->taken;
        char reason[160];
        double t = pool_take(p, want);
        if (gpu && want > gtotal)
            snprintf(reason, sizeof reason, "asks for %d GPUs; this server has %d", want, gtotal);
        else if (t == 0)
            snprintf(reason, sizeof reason, "starting: its %s free",
                     gpu ? "GPUs are" : "CPU slot is");
        else if (want <= p->free_now && want > free_before)
            snprintf(reason, sizeof reason, "priority: jobs ahead of it take the free %s",
                     gpu ? "GPUs" : "CPU slots");
        else if (gpu)
            snprintf(reason, sizeof reason, "waiting for %d GPU%s, %d free", want,
                     want == 1 ? "" : "s", free_before > 0 ? free_before : 0);
        else
            snprintf(reason, sizeof reason, "waiting for a CPU slot, %d of %d free",
                     free_before > 0 ? free_before : 0, s->cfg.cpu_slots);
        if (t < 0 && !(gpu && want > gtotal)) {
            /* Why no estimate: a queued job ahead holds the slots for a time
             * nobody knows before it runs, or the running jobs have not
             * reported twice yet (no ETA). */
            size_t len = strlen(reason);
            if (p->first_unknown)
                snprintf(reason + len, sizeof reason - len,
                         "; start unknown: job %lld ahead has not run yet",
                         (long long)p->first_unknown);
            else
                snprintf(reason + len, sizeof reason - len,
                         "; start unknown: the running jobs have no ETA yet");
        }
        /* A queued job's run time is known only once it runs: what it
         * takes is not released in this estimate. */
        if (t >= 0 && !p->first_unknown) p->first_unknown = j.id;
        json_t *o =
            json_pack("{sI so ss si si ss so so}", "id", (json_int_t)j.id, "name",
                      j.name ? json_string(j.name) : json_null(), "state", "queued", "priority",
                      j.priority, "gpus", j.gpus_wanted, "reason", reason, "estimated_start",
                      est_json(t), "estimated_start_s", t >= 0 ? json_real(t) : json_null());
        json_object_set_new(o, "position", json_integer(i + 1));
        json_object_set_new(o, "tags", json_loads(j.tags ? j.tags : "[]", 0, NULL));
        json_array_append_new(arr, o);
        db_job_free(&j);
    }
    for (int i = 0; i < npaused; i++) {
        db_job j;
        if (db_job_get(d, paused[i], &j, &err)) continue;
        json_t *o =
            json_pack("{sI so ss si si ss so so so}", "id", (json_int_t)j.id, "name",
                      j.name ? json_string(j.name) : json_null(), "state", "paused", "priority",
                      j.priority, "gpus", j.gpus_wanted, "reason", "paused", "estimated_start",
                      json_null(), "estimated_start_s", json_null(), "position", json_null());
        json_object_set_new(o, "tags", json_loads(j.tags ? j.tags : "[]", 0, NULL));
        json_array_append_new(arr, o);
        db_job_free(&j);
    }
    free(ids);
    free(live);
    free(paused);
    return http_json(q, 200,
                     json_pack("{so si si si si}", "queue", arr, "gpus_total", gtotal, "gpus_free",
                               gfree, "cpu_slots", s->cfg.cpu_slots, "cpu_slots_free", cfree));
}

/* ---- PATCH /jobs/{id} ---------------------------------------------------------------- */

/* A PATCH body as parsed: the changes borrow from body. */
typedef struct patch_req {
    json_t *body;
    db_job_patch p;
    char *tags; /* JSON array text */
} patch_req;

static unsigned parse_priority(json_t *v, patch_req *pr, admit_result *r)
{
    json_int_t x = json_integer_value(v);
    if (!json_is_integer(v) || x < -1000 || x > 1000)
        return admit_refuse(r, 400, "invalid_spec", "priority",
                            "priority: must be an integer in [-1000, 1000]");
    pr->p.has_priority = true;
    pr->p.priority = (int)x;
    return 0;
}

static unsigned parse_name(json_t *v, patch_req *pr, admit_result *r)
{
    const char *nm = json_string_value(v);
    bool ok = json_is_null(v) || (nm && *nm && strlen(nm) <= 128);
    for (const char *c = nm; ok && c && *c; c++)
        ok = (unsigned char)*c >= 0x20 && *c != 0x7f;
    if (!ok)
        return admit_refuse(r, 400, "invalid_spec", "name",
                            "name: must be null or 1-128 bytes without control characters");
    pr->p.has_name = true;
    pr->p.name = nm;
    return 0;
}

static unsigned parse_tags(json_t *v, patch_req *pr, admit_result *r)
{
    ty_err err = {0};
    if (jobspec_check_tags(v, "tags", &err)) return admit_refuse_spec(r, &err);
    pr->p.has_tags = true;
    pr->p.tags = pr->tags = ty_json_dumps(v, JSON_COMPACT);
    return 0;
}

/* The body: an object of at least one of priority, name, tags. */
static unsigned parse_patch(http_req *q, patch_req *pr, admit_result *r)
{
    json_error_t jerr;
    pr->body = q->len ? json_loadb(q->body, q->len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!pr->body)
        return admit_refuse(r, 400, "invalid_json", NULL, "the body must be a JSON object: %s",
                            q->len ? jerr.text : "empty body");
    if (!json_is_object(pr->body) || json_object_size(pr->body) == 0)
        return admit_refuse(r, 400, "invalid_spec", NULL,
                            "send an object with at least one of priority, name, tags");
    const char *key;
    json_t *v;
    json_object_foreach(pr->body, key, v)
    {
        unsigned st;
        if (!strcmp(key, "priority"))
            st = parse_priority(v, pr, r);
        else if (!strcmp(key, "name"))
            st = parse_name(v, pr, r);
        else if (!strcmp(key, "tags"))
            st = parse_tags(v, pr, r);
        else
            st = admit_refuse(r, 400, "invalid_spec", key,
                              "%s: unknown field (a job's priority, name and tags can be changed)",
                              key);
        if (st) return st;
    }
    return 0;
}

/* One transaction: the job's state must still take the change. */
static unsigned apply_patch(http_req *q, const patch_req *pr, admit_result *r)
{
    ty_err err = {0};
    if (db_job_patch_apply(srv_db(q->s), q->id, &pr->p, &err)) return admit_refuse_err(r, &err);
    sched_wake(q->s->sched); /* a new priority may change what starts next */
    return 0;
}

static enum MHD_Result reply_patched(http_req *q)
{
    db *d = srv_db(q->s);
    db_job j;
    ty_err err = {0};
    if (db_job_get(d, q->id, &j, &err)) return http_ty_error(q, &err);
    enum MHD_Result res = http_json(q, 200, jobview_json(&q->s->cfg, d, &j));
    db_job_free(&j);
    return res;
}

/* Parse, admit (admit.c), apply: a refusal of any step is answered in one
 * place. */
enum MHD_Result ops_patch_job(http_req *q)
{
    patch_req pr = {0};
    admit_result r = {0};
    enum MHD_Result res;
    if (parse_patch(q, &pr, &r) || admit_patch(q->s, &r) || apply_patch(q, &pr, &r))
        res = admit_reply(q, &r);
    else
        res = reply_patched(q);
    free(pr.tags);
    json_decref(pr.body);
    return res;
}
