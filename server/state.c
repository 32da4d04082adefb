/* state.c — the daemon state every part shares (state.h): the per-thread
 * database handle, publishing, transitions, job directories. Kept below
 * everything else so the scheduler, the HTTP side and the workers depend
 * on it and never on serve.c, which only starts and stops them.
 *
 * A thread's handle is opened in the server's current mode (s->db_mode,
 * disk.c: read-only while the disk is full at start). When the mode changes its
 * generation moves and the thread opens a new handle at its next use; the
 * old one stays open until the thread ends, since a caller may still hold
 * it further up the stack. */
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "overlay.h"
#include "sse.h"

typedef struct db_slot {
    db *d;
    int gen;
    struct db_slot *old; /* handles of earlier generations */
} db_slot;

static void db_key_free(void *p)
{
    for (db_slot *h = p, *next; h; h = next) {
        next = h->old;
        db_close(h->d);
        free(h);
    }
}

void srv_state_init(srv *s)
{
    pthread_key_create(&s->db_key, db_key_free);
    pthread_mutex_init(&s->write_lock, NULL);
    s->overlay = overlay_new();
}

db *srv_db(srv *s)
{
    db_slot *h = pthread_getspecific(s->db_key);
    int gen = atomic_load(&s->db_gen);
    if (h && h->gen == gen) return h->d;
    db *d;
    ty_err err = {0};
    if (db_open_mode(s->db_path, (db_mode)atomic_load(&s->db_mode), &d, &err)) {
        fprintf(stderr, "trainyard: %s\n", err.msg);
        return NULL;
    }
    db_slot *n = malloc(sizeof *n);
    if (!n) {
        db_close(d);
        return NULL;
    }
    *n = (db_slot){.d = d, .gen = gen, .old = h};
    pthread_setspecific(s->db_key, n);
    return d;
}

int srv_job_spec(const db_job *j, jobspec *out, ty_err *err)
{
    const char *text = j->spec ? j->spec : "";
    int rc = jobspec_parse_text(text, strlen(text), out, err);
    if (rc == 0) return 0;
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return ty_err_set(err, TY_ECORRUPT, "the stored spec of job %lld does not parse: %s",
                      (long long)j->id, why);
}

db *srv_db_of(void *s)
{
    return srv_db(s);
}

void srv_db_release(srv *s)
{
    db_key_free(pthread_getspecific(s->db_key));
    pthread_setspecific(s->db_key, NULL);
}

void srv_publish(srv *s, const db_event *ev)
{
    sse_hub_publish(s->hub, ev);
}

void srv_publish_ingested(void *ctx, const db_event *ev)
{
    srv *s = ctx;
    atomic_fetch_add(&s->events_ingested, 1);
    sse_hub_publish(s->hub, ev);
}

int srv_transition(srv *s, int64_t id, unsigned from_mask, job_state to, const char *reason,
                   const db_job_update *upd, job_state *from_out, ty_err *err)
{
    db *d = srv_db(s);
    if (!d) return ty_err_set(err, TY_EIO, "database unavailable");
    db_event ev;
    pthread_mutex_lock(&s->write_lock);
    /* The job's engine events queued so far come before its state change. */
    ty_err ferr = {0};
    evw_flush_locked(s->evw, &ferr);
    int rc = db_job_transition(d, id, from_mask, to, reason, upd, from_out, &ev, err);
    if (rc == 0) {
        overlay_clear(s, id); /* the row is the truth again */
        srv_publish(s, &ev);
        db_event_clear(&ev);
    }
    pthread_mutex_unlock(&s->write_lock);
    return rc;
}

void srv_job_dir(const srv *s, int64_t id, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%lld", s->jobs_dir, (long long)id);
}
