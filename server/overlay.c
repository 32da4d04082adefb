/* overlay.c — a job whose engine is gone is never shown running.
 *
 * A run's final transition is written by the scheduler, and on a full disk
 * or a locked database that write is retried until it lands (settle.c).
 * Meanwhile the row still says `running`. The overlay holds, in memory,
 * the state such a job is settling to, with what the write carries besides
 * (resume point, restarts, error); it is set once the ended run's
 * checkpoints are reconciled, just before the first try, so a reader never
 * sees the state without its resume point, and cleared once the write
 * lands. GET /jobs/{id}, GET /jobs, /metrics and the answers of cancel and
 * pause read rows through it. It is not durable: a server restarted meanwhile recovers
 * the job from its row as after any crash. Few entries ever exist (one
 * per job whose write is pending), so a small array under a mutex does. */
#include "overlay.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

typedef struct ov_entry {
    int64_t id;
    job_state state;
    int64_t since_ms;
    char *reason;
    bool has_resume; /* resume_from is known (NULL: none) */
    char *resume_from;
    int restarts; /* -1: the row's */
} ov_entry;

struct overlay {
    pthread_mutex_t mu;
    ov_entry *e;
    int n, cap;
};

struct overlay *overlay_new(void)
{
    struct overlay *o = calloc(1, sizeof *o);
    if (o) pthread_mutex_init(&o->mu, NULL);
    return o;
}

void overlay_free(struct overlay *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->e[i].reason);
        free(o->e[i].resume_from);
    }
    free(o->e);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

static ov_entry *find(struct overlay *o, int64_t id)
{
    for (int i = 0; i < o->n; i++)
        if (o->e[i].id == id) return &o->e[i];
    return NULL;
}

void overlay_set(srv *s, int64_t id, job_state state, const char *reason)
{
    struct overlay *o = s->overlay;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    ov_entry *e = find(o, id);
    if (!e && o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 8;
        ov_entry *g = realloc(o->e, (size_t)cap * sizeof *g);
        if (g) {
            o->e = g;
            o->cap = cap;
        }
    }
    if (!e && o->n < o->cap) {
        e = &o->e[o->n++];
        *e = (ov_entry){.id = id, .since_ms = ty_now_ms(), .restarts = -1};
    }
    if (e) {
        e->state = state;
        free(e->reason);
        e->reason = reason ? strdup(reason) : NULL;
    }
    pthread_mutex_unlock(&o->mu);
}

void overlay_clear(srv *s, int64_t id)
{
    struct overlay *o = s->overlay;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    ov_entry *e = find(o, id);
    if (e) {
        free(e->reason);
        free(e->resume_from);
        *e = o->e[--o->n];
    }
    pthread_mutex_unlock(&o->mu);
}

void overlay_set_detail(srv *s, int64_t id, bool has_resume, const char *resume_from, int restarts)
{
    struct overlay *o = s->overlay;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    ov_entry *e = find(o, id);
    if (e) {
        free(e->resume_from);
        e->resume_from = has_resume && resume_from ? strdup(resume_from) : NULL;
        e->has_resume = has_resume;
        e->restarts = restarts;
    }
    pthread_mutex_unlock(&o->mu);
}

bool overlay_state(srv *s, int64_t id, job_state *state)
{
    struct overlay *o = s->overlay;
    if (!o) return false;
    pthread_mutex_lock(&o->mu);
    ov_entry *e = find(o, id);
    if (e) *state = e->state;
    pthread_mutex_unlock(&o->mu);
    return e != NULL;
}

void overlay_apply(srv *s, db_job *j)
{
    struct overlay *o = s->overlay;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    ov_entry *e = o->n ? find(o, j->id) : NULL;
    if (e) {
        j->state = e->state;
        if (e->state == JOB_FAILED && e->reason) {
            free(j->error);
            j->error = strdup(e->reason);
        }
        if (e->has_resume) {
            free(j->resume_from);
            j->resume_from = e->resume_from ? strdup(e->resume_from) : NULL;
        }
        if (e->restarts >= 0) j->restarts = e->restarts;
        if (db_state_terminal(e->state)) j->finished_ms = e->since_ms;
        if (j->gpus) j->gpus[0] = 0;
    }
    pthread_mutex_unlock(&o->mu);
}

unsigned overlay_widen(srv *s, unsigned mask)
{
    struct overlay *o = s->overlay;
    if (!o || !mask) return mask;
    pthread_mutex_lock(&o->mu);
    bool any = o->n > 0;
    pthread_mutex_unlock(&o->mu);
    /* A settling job's row is starting, running or stopping. */
    return any ? mask | JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_RUNNING) | JOB_BIT(JOB_STOPPING) : mask;
}

bool overlay_keep(const db_job *j, unsigned mask)
{
    return !mask || (mask & JOB_BIT(j->state));
}

void overlay_counts(srv *s, db *d, int64_t counts[JOB_NSTATES])
{
    struct overlay *o = s->overlay;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    int n = o->n;
    int64_t *ids = n ? malloc((size_t)n * sizeof *ids) : NULL;
    job_state *shown = n ? malloc((size_t)n * sizeof *shown) : NULL;
    for (int i = 0; ids && shown && i < n; i++) {
        ids[i] = o->e[i].id;
        shown[i] = o->e[i].state;
    }
    pthread_mutex_unlock(&o->mu);
    for (int i = 0; ids && shown && i < n; i++) {
        db_job j;
        ty_err err = {0};
        if (db_job_get(d, ids[i], &j, &err)) continue; /* the rows are read unlocked */
        if (counts[j.state] > 0 && j.state != shown[i]) {
            counts[j.state]--;
            counts[shown[i]]++;
        }
        db_job_free(&j);
    }
    free(ids);
    free(shown);
}
