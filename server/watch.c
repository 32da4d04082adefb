/* watch.c — budgets, stalls and idle GPUs of running jobs.
 *
 * One small table, one entry per running job, fed by the scheduler thread
 * (every metric of the current run; a check each tick) and the GPU sampler
 * (one sweep per sample period). The checks only decide and say so in an
 * event (`budget`, `stall`, `idle_gpu`); the scheduler carries out the
 * stop, restart or failure, so every engine is still signalled from the
 * one thread that owns it.
 *
 * A run is stalled when no metric arrived for stall_after_s: the spec's
 * limits.stall_after_s, else 10x the silence a healthy run keeps before
 * its next metric, at least --stall-floor (300 s). That silence is the
 * steps to the next metric (the engine reports every log_every_steps
 * steps and at the last) times the median time per step so far; before
 * a second metric, the time the first step took, load included (an
 * overestimate, so never a false stall). The silence counts from the
 * engine's `started` event, so an engine that never reports also stalls.
 * An entry lives from the run's first check to its end (ops_run_ended); a
 * requeued run starts afresh. */
#include "ops.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"
#include "state.h"
#include "tyutil.h"
#include "tyjson.h"

#define STEP_RING 64       /* step intervals kept for the median */
#define CHECK_EVERY_MS 250 /* limits and silence, per job */

typedef struct watched {
    int64_t job_id;
    /* from the spec, read once per run */
    double max_cost;
    int64_t max_runtime_s, max_tokens, stall_after_s;
    int64_t log_every, max_steps;
    jobspec_on_stall on_stall;
    /* silence */
    int64_t last_ms, last_step; /* monotonic ms of the last metric (or the start) */
    bool have_metric;
    int64_t ring[STEP_RING]; /* ms per step */
    int nring, ring_pos;
    int64_t first_step_ms; /* from started to the first metric */
    int64_t stalled_at;    /* wall-clock ms, 0 while not stalled */
    bool budget_hit;
    int64_t next_check_ms;
    /* GPUs */
    int64_t idle_since; /* monotonic ms, 0 while busy */
    bool idle_said;
} watched;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static watched *tab;
static int ntab, captab;

static watched *find(int64_t id)
{
    for (int i = 0; i < ntab; i++)
        if (tab[i].job_id == id) return &tab[i];
    return NULL;
}

/* The job's entry, made on the first call of its run (mu held). */
static watched *find_or_add(srv *s, int64_t id)
{
    watched *w = find(id);
    if (w) return w;
    if (ntab == captab) {
        int nc = captab ? captab * 2 : 16;
        watched *g = realloc(tab, (size_t)nc * sizeof *g);
        if (!g) return NULL;
        tab = g;
        captab = nc;
    }
    w = &tab[ntab++];
    memset(w, 0, sizeof *w);
    w->job_id = id;
    w->max_cost = -1;
    w->last_ms = ty_mono_ms();
    db_job j;
    ty_err err = {0};
    db *d = srv_db(s);
    if (d && db_job_get(d, id, &j, &err) == 0) {
        jobspec spec;
        if (j.spec && jobspec_parse_text(j.spec, strlen(j.spec), &spec, &err) == 0) {
            w->max_cost = spec.max_cost;
            w->max_runtime_s = spec.max_runtime_s;
            w->max_tokens = spec.max_tokens;
            w->stall_after_s = spec.stall_after_s;
            w->log_every = spec.log_every_steps;
            w->max_steps = spec.max_steps;
            w->on_stall = spec.on_stall;
            jobspec_free(&spec);
        }
        db_job_free(&j);
    }
    return w;
}

void ops_note_metric(srv *s, int64_t job_id, int64_t step)
{
    pthread_mutex_lock(&mu);
    watched *w = find_or_add(s, job_id);
    if (w) {
        int64_t now = ty_mono_ms();
        if (w->have_metric && step > w->last_step) {
            w->ring[w->ring_pos] = (now - w->last_ms) / (step - w->last_step);
            w->ring_pos = (w->ring_pos + 1) % STEP_RING;
            if (w->nring < STEP_RING) w->nring++;
        }
        if (!w->have_metric) w->first_step_ms = now - w->last_ms;
        w->have_metric = true;
        w->last_ms = now;
        w->last_step = step;
        w->stalled_at = 0;
    }
    pthread_mutex_unlock(&mu);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Steps from the last metric to the next one the engine sends: at every
 * multiple of log_every_steps and at max_steps. */
static int64_t steps_to_next_metric(const watched *w)
{
    int64_t every = w->log_every > 0 ? w->log_every : 1;
    int64_t next = (w->last_step / every + 1) * every;
    if (w->max_steps > 0 && next > w->max_steps) next = w->max_steps;
    return next > w->last_step ? next - w->last_step : 1;
}

/* stall_after_s of the run (mu held). */
static int64_t stall_after(const srv *s, const watched *w)
{
    if (w->stall_after_s > 0) return w->stall_after_s;
    int64_t floor_s = s->cfg.ops.stall_floor_s;
    if (!w->have_metric) return floor_s;
    int64_t step_ms = w->first_step_ms;
    if (w->nring) {
        int64_t v[STEP_RING];
        memcpy(v, w->ring, (size_t)w->nring * sizeof *v);
        qsort(v, (size_t)w->nring, sizeof *v, cmp_i64);
        step_ms = v[w->nring / 2];
    }
    int64_t ten = 10 * step_ms * steps_to_next_metric(w) / 1000;
    return ten > floor_s ? ten : floor_s;
}

static void push_event(srv *s, int64_t job_id, const char *type, json_t *o)
{
    char *data = o ? ty_json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (data) evw_push(s->evw, job_id, type, data);
}

/* Which limit the job has reached, if any (mu held): the budget event is
 * pushed and why filled. */
static bool budget_reached(srv *s, watched *w, char *why, size_t cap)
{
    if (w->max_cost < 0 && !w->max_runtime_s && !w->max_tokens) return false;
    db_job j;
    ty_err err = {0};
    db *d = srv_db(s);
    if (!d || db_job_get(d, w->job_id, &j, &err)) return false;
    int64_t now = ty_now_ms();
    const char *limit = NULL;
    double value = 0, used = 0;
    double runtime_s = (double)db_job_run_ms(&j, now) / 1000.0;
    json_t *m = j.last_metric ? json_loads(j.last_metric, 0, NULL) : NULL;
    int64_t tokens = json_integer_value(json_object_get(m, "tokens"));
    json_decref(m);
    double amount, gh, ch;
    bool priced = ops_job_cost(&s->cfg, &j, now, &amount, &gh, &ch);
    if (w->max_runtime_s && runtime_s >= (double)w->max_runtime_s) {
        limit = "max_runtime_s";
        value = (double)w->max_runtime_s;
        used = runtime_s;
        snprintf(why, cap, "budget reached: limits.max_runtime_s %lld (ran %.1f s)",
                 (long long)w->max_runtime_s, runtime_s);
    } else if (w->max_tokens && tokens >= w->max_tokens) {
        limit = "max_tokens";
        value = (double)w->max_tokens;
        used = (double)tokens;
        snprintf(why, cap, "budget reached: limits.max_tokens %lld (trained %lld)",
                 (long long)w->max_tokens, (long long)tokens);
    } else if (w->max_cost >= 0 && priced && amount >= w->max_cost) {
        limit = "max_cost";
        value = w->max_cost;
        used = amount;
        snprintf(why, cap, "budget reached: limits.max_cost %g %s (spent %.6g)", w->max_cost,
                 s->cfg.currency, amount);
    }
    db_job_free(&j);
    if (!limit) return false;
    push_event(s, w->job_id, "budget",
               json_pack("{ss sf sf ss ss}", "limit", limit, "value", value, "used", used, "action",
                         "stop", "reason", why));
    return true;
}

ops_action ops_check_run(srv *s, int64_t job_id, char *why, size_t cap)
{
    ops_action act = OPS_GO_ON;
    pthread_mutex_lock(&mu);
    watched *w = find_or_add(s, job_id);
    int64_t now = ty_mono_ms();
    if (!w || now < w->next_check_ms) {
        pthread_mutex_unlock(&mu);
        return OPS_GO_ON;
    }
    w->next_check_ms = now + CHECK_EVERY_MS;
    if (!w->budget_hit && budget_reached(s, w, why, cap)) {
        w->budget_hit = true;
        act = OPS_STOP_BUDGET;
    } else if (!w->stalled_at) {
        int64_t after = stall_after(s, w), silent_ms = now - w->last_ms;
        if (silent_ms >= after * 1000) {
            w->stalled_at = ty_now_ms();
            const char *policy = jobspec_on_stall_name(w->on_stall);
            snprintf(why, cap,
                     "stalled: no metric for %lld s (stall_after_s %lld, step %lld); "
                     "on_stall %s",
                     (long long)(silent_ms / 1000), (long long)after, (long long)w->last_step,
                     policy);
            push_event(s, job_id, "stall",
                       json_pack("{sI sI sI ss ss}", "silent_s", (json_int_t)(silent_ms / 1000),
                                 "stall_after_s", (json_int_t)after, "step",
                                 (json_int_t)w->last_step, "action", policy, "reason", why));
            act = w->on_stall == ON_STALL_RESTART ? OPS_RESTART
                  : w->on_stall == ON_STALL_FAIL  ? OPS_FAIL
                                                  : OPS_GO_ON;
        }
    }
    pthread_mutex_unlock(&mu);
    return act;
}

void ops_run_ended(int64_t job_id)
{
    pthread_mutex_lock(&mu);
    watched *w = find(job_id);
    if (w) *w = tab[--ntab];
    pthread_mutex_unlock(&mu);
}

int64_t ops_stalled_since(int64_t job_id)
{
    pthread_mutex_lock(&mu);
    watched *w = find(job_id);
    int64_t t = w ? w->stalled_at : 0;
    pthread_mutex_unlock(&mu);
    return t;
}

void ops_gpu_sweep(srv *s, const srv_gpu_sample *g, int n)
{
    int after = s->cfg.ops.idle_gpu_after_s, thr = s->cfg.ops.idle_gpu_util;
    if (after <= 0) return;
    int64_t now = ty_mono_ms();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ntab; i++) {
        watched *w = &tab[i];
        int held = 0, top = 0;
        json_t *gpus = json_array();
        for (int k = 0; k < n; k++)
            if (g[k].job_id == w->job_id) {
                held++;
                if (g[k].util > top) top = g[k].util;
                json_array_append_new(gpus, json_integer(g[k].index));
            }
        if (!held || top >= thr) { /* a CPU job, or busy: the idle clock restarts */
            if (held) w->idle_since = 0, w->idle_said = false;
            json_decref(gpus);
            continue;
        }
        if (!w->idle_since) w->idle_since = now;
        if (!w->idle_said && now - w->idle_since >= (int64_t)after * 1000) {
            w->idle_said = true;
            push_event(s, w->job_id, "idle_gpu",
                       json_pack("{sO si si sI}", "gpus", gpus, "util", top, "threshold", thr,
                                 "idle_s", (json_int_t)((now - w->idle_since) / 1000)));
        }
        json_decref(gpus);
    }
    pthread_mutex_unlock(&mu);
}
