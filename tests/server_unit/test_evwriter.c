/* test_evwriter.c — the batched event writer: pending events are committed
 * EVW_MAX_BATCH per transaction, all of them, with contiguous per-job
 * sequence numbers, and published in global id order; the writer's thread
 * commits a lone event by itself; pending events are flushed on free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "server.h"

typedef struct pubs {
    int64_t n, last_id, last_seq[3];
    bool ordered;
} pubs;

static void on_publish(void *ctx, const db_event *ev)
{
    pubs *p = ctx;
    if (ev->id <= p->last_id) p->ordered = false;
    if (ev->seq != p->last_seq[ev->job_id] + 1) p->ordered = false;
    p->last_seq[ev->job_id] = ev->seq;
    p->last_id = ev->id;
    p->n++;
}

int main(void)
{
    char dir[] = "/tmp/ty-evw-XXXXXX";
    CHECK(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/t.db", dir);
    ty_err err = {0};
    db *d;
    CHECK(db_open(path, &d, &err) == 0);
    db_new_job nj = {.spec = "{}", .max_restarts = 3};
    int64_t j1, j2;
    bool existing;
    CHECK(db_job_insert(d, &nj, &j1, &existing, NULL, &err) == 0 && j1 == 1);
    CHECK(db_job_insert(d, &nj, &j2, &existing, NULL, &err) == 0 && j2 == 2);

    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pubs p = {.ordered = true, .last_seq = {0, 1, 1}}; /* seq 1 = the submit event */
    p.last_id = 2;
    struct evw *w = evw_new(path, &lock, on_publish, &p, &err);
    CHECK(w);
    const int N = 5000;
    /* Pushed while the lock is held, so the writer cannot commit yet; the
     * flush then takes EVW_MAX_BATCH events per transaction. */
    pthread_mutex_lock(&lock);
    for (int i = 0; i < N; i++) {
        char *data;
        CHECK(asprintf(&data, "{\"step\":%d,\"loss\":1.5}", i + 1) > 0);
        evw_push(w, i % 2 ? j2 : j1, "metric", data);
    }
    CHECK(evw_flush_locked(w, &err) == 0);
    pthread_mutex_unlock(&lock);
    int64_t events, batches;
    evw_stats(w, &events, &batches);
    CHECK(events == N);
    CHECK(batches == (N + EVW_MAX_BATCH - 1) / EVW_MAX_BATCH);
    CHECK(p.n == N && p.ordered);

    /* All committed, per-job sequences contiguous after the submit event. */
    db_event *evs;
    int n;
    CHECK(db_events_job(d, j1, 0, N + 10, &evs, &n, &err) == 0);
    CHECK(n == N / 2 + 1);
    for (int i = 0; i < n; i++)
        CHECK(evs[i].seq == i + 1);
    db_events_free(evs, n);
    db_job j;
    CHECK(db_job_get(d, j2, &j, &err) == 0);
    char want[64];
    snprintf(want, sizeof want, "\"step\":%d", N);
    CHECK(j.last_metric && strstr(j.last_metric, want));
    db_job_free(&j);

    /* The writer's own thread flushes a small batch within its period. */
    evw_push(w, j1, "log", strdup("{\"line\":\"hello\",\"level\":\"info\"}"));
    for (int i = 0; i < 100 && p.n == N; i++)
        usleep(20000);
    CHECK(p.n == N + 1);
    /* Pending events are flushed on free. */
    evw_push(w, j1, "log", strdup("{\"line\":\"bye\",\"level\":\"info\"}"));
    evw_free(w);
    CHECK(p.n == N + 2);
    db_close(d);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("evwriter: %d events in %lld batches\n", N, (long long)batches);
    return ty_summary("evwriter");
}
