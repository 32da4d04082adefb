/* evwriter.c — batches engine events into few SQLite transactions.
 *
 * A chatty engine can emit tens of thousands of lines a second; one
 * transaction per line would stall the supervisor behind the database.
 * Events are queued here and one thread commits whatever is pending (up to
 * EVW_MAX_BATCH per transaction), then publishes them under the shared lock,
 * in id order. Batches form naturally: what arrives during one commit goes
 * into the next. */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

/* Pending events beyond this make evw_push wait: the supervisor then stops
 * draining the engine's pipe and the engine blocks on write. */
#define EVW_QUEUE_CAP (8 * EVW_MAX_BATCH)

struct evw {
    db *d;                    /* its own handle, or NULL: handle(ctx) */
    db *(*handle)(void *ctx); /* the calling thread's handle (evw_new_with) */
    pthread_mutex_t *lock;    /* shared write lock: commit + publish */
    evw_publish_fn publish;
    void *ctx;
    pthread_mutex_t qmu; /* guards the queue only */
    pthread_cond_t qcond, qspace;
    db_event_in *q;
    int n;
    bool stop;
    pthread_t thread;
    int64_t events, batches;
};

/* Commits and publishes at most `limit` pending events, EVW_MAX_BATCH per
 * transaction. Bounded so a flooding engine cannot keep the write lock. */
static int flush_queue_locked(struct evw *w, int limit, ty_err *err)
{
    int rc = 0;
    while (limit > 0) {
        pthread_mutex_lock(&w->qmu);
        int n = w->n < EVW_MAX_BATCH ? w->n : EVW_MAX_BATCH;
        if (n > limit) n = limit;
        if (n == 0) {
            pthread_mutex_unlock(&w->qmu);
            return rc;
        }
        db_event_in batch[EVW_MAX_BATCH];
        memcpy(batch, w->q, (size_t)n * sizeof *batch);
        memmove(w->q, w->q + n, (size_t)(w->n - n) * sizeof *w->q);
        w->n -= n;
        pthread_cond_broadcast(&w->qspace);
        pthread_mutex_unlock(&w->qmu);
        limit -= n;

        db_event *out = calloc((size_t)n, sizeof *out);
        db *d = w->d ? w->d : w->handle(w->ctx);
        int brc = !out ? ty_err_set(err, TY_ENOMEM, "out of memory")
                  : d  ? db_events_append(d, batch, n, out, err)
                       : ty_err_set(err, TY_EIO, "no database handle");
        if (brc == 0) {
            w->events += n;
            w->batches++;
            for (int i = 0; i < n; i++)
                if (w->publish && out[i].id > 0) w->publish(w->ctx, &out[i]);
        } else {
            rc = brc;
            /* Said where an operator looks (a full disk, a locked file). */
            fprintf(stderr, "trainyard: %d event(s) could not be written and are dropped: %s\n", n,
                    err ? err->msg : "database error");
        }
        /* A failed batch is dropped, not retried forever: the job's state
         * transitions still go through, and the error is returned. */
        if (out) db_events_free(out, brc == 0 ? n : 0);
        for (int i = 0; i < n; i++)
            free(batch[i].data);
    }
    return rc;
}

int evw_flush_locked(struct evw *w, ty_err *err)
{
    /* Everything pending now, not what arrives meanwhile. */
    pthread_mutex_lock(&w->qmu);
    int pending = w->n;
    pthread_mutex_unlock(&w->qmu);
    return flush_queue_locked(w, pending, err);
}

static void *writer_main(void *arg)
{
    struct evw *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->qmu);
        while (w->n == 0 && !w->stop)
            pthread_cond_wait(&w->qcond, &w->qmu);
        /* No fixed coalescing window: a lone event after a quiet spell is
         * committed at once (its latency is what SSE clients see), and under
         * load batches form by themselves from whatever arrives while the
         * previous transaction commits. */
        bool stop = w->stop;
        pthread_mutex_unlock(&w->qmu);
        ty_err err = {0};
        /* One batch per turn of the lock, so HTTP handlers and transitions
         * get it between batches even while an engine floods. */
        pthread_mutex_lock(w->lock);
        flush_queue_locked(w, stop ? EVW_QUEUE_CAP : EVW_MAX_BATCH, &err);
        pthread_mutex_unlock(w->lock);
        if (stop) {
            pthread_mutex_lock(&w->qmu);
            bool more = w->n > 0;
            pthread_mutex_unlock(&w->qmu);
            if (more) continue;
        }
        if (stop) break;
    }
    return NULL;
}

struct evw *evw_new(const char *db_path, pthread_mutex_t *lock, evw_publish_fn publish, void *ctx,
                    ty_err *err)
{
    return evw_new_with(db_path, NULL, lock, publish, ctx, err);
}

struct evw *evw_new_with(const char *db_path, db *(*handle)(void *ctx), pthread_mutex_t *lock,
                         evw_publish_fn publish, void *ctx, ty_err *err)
{
    struct evw *w = calloc(1, sizeof *w);
    if (!w) {
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    w->q = calloc(EVW_QUEUE_CAP, sizeof *w->q);
    if (!w->q) {
        free(w);
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    if (!handle && db_open(db_path, &w->d, err)) {
        free(w->q);
        free(w);
        return NULL;
    }
    w->handle = handle;
    w->lock = lock;
    w->publish = publish;
    w->ctx = ctx;
    pthread_mutex_init(&w->qmu, NULL);
    pthread_cond_init(&w->qcond, NULL);
    pthread_cond_init(&w->qspace, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        db_close(w->d);
        free(w->q);
        free(w);
        ty_err_set(err, TY_EINTERNAL, "cannot start the event writer thread");
        return NULL;
    }
    return w;
}

void evw_push(struct evw *w, int64_t job_id, const char *type, char *data)
{
    pthread_mutex_lock(&w->qmu);
    while (w->n >= EVW_QUEUE_CAP && !w->stop)
        pthread_cond_wait(&w->qspace, &w->qmu);
    if (w->n >= EVW_QUEUE_CAP) { /* stopping and still full: drop */
        pthread_mutex_unlock(&w->qmu);
        free(data);
        return;
    }
    w->q[w->n++] =
        (db_event_in){.job_id = job_id, .ts_ms = ty_now_ms(), .type = type, .data = data};
    if (w->n == 1 || w->n >= EVW_MAX_BATCH) pthread_cond_signal(&w->qcond);
    pthread_mutex_unlock(&w->qmu);
}

void evw_stats(struct evw *w, int64_t *events, int64_t *batches)
{
    pthread_mutex_lock(w->lock);
    if (events) *events = w->events;
    if (batches) *batches = w->batches;
    pthread_mutex_unlock(w->lock);
}

void evw_free(struct evw *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->qmu);
    w->stop = true;
    pthread_cond_broadcast(&w->qcond);
    pthread_cond_broadcast(&w->qspace);
    pthread_mutex_unlock(&w->qmu);
    pthread_join(w->thread, NULL);
    for (int i = 0; i < w->n; i++)
        free(w->q[i].data);
    pthread_mutex_destroy(&w->qmu);
    pthread_cond_destroy(&w->qcond);
    pthread_cond_destroy(&w->qspace);
    db_close(w->d);
    free(w->q);
    free(w);
}
