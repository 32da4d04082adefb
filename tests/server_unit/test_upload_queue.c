/* test_upload_queue.c — the durable checkpoint upload queue of db/ (the
 * `uploads` table) through every state transition the server's workers use:
 * a checkpoint with a store queues its put in the same transaction; claim
 * moves it to running and the checkpoint to uploading; a retry is not due
 * before its time; done commits with the remote URI; skipped and retired
 * checkpoints become deleted; a restart puts running rows back; and each
 * checkpoint step leaves a `checkpoint` event with the new state. Also
 * retention's choice (upload_retention_pick): keep_last, keep_best, and
 * never the newest committed checkpoint. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <math.h>

#include "tyassert.h"
#include "db.h"
#include "tyutil.h"
#include "upload.h"

static const char *STORE = "s3://bucket/runs";

/* The checkpoint row of step, looked up in the list (state, error, uri). */
static db_checkpoint *find_step(db_checkpoint *c, int n, int64_t step)
{
    for (int i = 0; i < n; i++)
        if (c[i].step == step) return &c[i];
    return NULL;
}

static void expect_state(db *d, int64_t job, int64_t step, const char *state)
{
    db_checkpoint *c;
    int n;
    ty_err err = {0};
    CHECK(db_checkpoint_list(d, job, &c, &n, &err) == 0);
    db_checkpoint *k = find_step(c, n, step);
    CHECK(k != NULL);
    if (strcmp(k->state, state)) {
        fprintf(stderr, "step %lld: state %s, want %s\n", (long long)step, k->state, state);
        exit(1);
    }
    db_checkpoints_free(c, n);
}

/* The event of a claim/finish carries the new state. */
static void expect_event(db_event *ev, const char *state)
{
    CHECK(ev->id > 0 && !strcmp(ev->type, "checkpoint"));
    char want[64];
    snprintf(want, sizeof want, "\"state\":\"%s\"", state);
    CHECK(strstr(ev->data, want) != NULL);
    db_event_clear(ev);
}

static int count(db *d, const char *state)
{
    int n = -1;
    ty_err err = {0};
    CHECK(db_upload_count(d, state, &n, &err) == 0);
    return n;
}

/* Retention over rows given as a state string, one letter per step
 * (l local, u uploading, c committed, f failed, d deleted); returns the
 * kept ones as a string of 'K' and '.'. */
static void pick(const char *states, int keep_last, int keep_best, const double *loss,
                 const char *want)
{
    int n = (int)strlen(states);
    db_checkpoint c[16] = {0};
    bool keep[16] = {0};
    double none[16] = {0};
    static const char *const names[] = {"local", "uploading", "committed", "failed", "deleted"};
    for (int i = 0; i < n; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].step = (i + 1) * 10;
        c[i].state = (char *)names[strchr("lucfd", states[i]) - "lucfd"];
        none[i] = NAN;
    }
    upload_retention_pick(c, n, keep_last, keep_best, loss ? loss : none, keep);
    char got[17];
    for (int i = 0; i < n; i++)
        got[i] = keep[i] ? 'K' : '.';
    got[n] = 0;
    if (strcmp(got, want)) {
        fprintf(stderr, "retention of %s (last %d, best %d): kept %s, want %s\n", states, keep_last,
                keep_best, got, want);
        exit(1);
    }
}

static void test_retention_pick(void)
{
    pick("ccccc", 2, 0, NULL, "...KK");
    pick("ccdcc", 3, 0, NULL, ".K.KK"); /* deleted rows do not count */
    /* The newest committed stays even when newer ones are still local. */
    pick("cclll", 2, 0, NULL, ".K.KK");
    pick("cfll", 1, 0, NULL, "K..K");
    pick("lll", 1, 0, NULL, "..K");
    pick("ccc", 0, 0, NULL, "KKK"); /* keep all */
    /* keep_best: lowest losses, plus the newest (not ranked yet), plus the
     * newest committed. */
    double loss[] = {3.0, 1.0, 2.0, 0.5, NAN};
    pick("ccccl", 0, 2, loss, ".K.KK");
    pick("ccccl", 1, 1, loss, "...KK");
    pick("ccccc", 0, 1, loss, "...KK");
}

int main(void)
{
    test_retention_pick();
    char dir[] = "/tmp/ty-upq-XXXXXX", path[256];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/q.db", dir);
    ty_err err = {0};
    db *d;
    CHECK(db_open(path, &d, &err) == 0);
    db_new_job nj = {.name = "j", .spec = "{}", .max_restarts = 3, .max_steps = 10};
    int64_t job, other;
    bool existing;
    CHECK(db_job_insert(d, &nj, &job, &existing, NULL, &err) == 0);
    CHECK(db_job_insert(d, &nj, &other, &existing, NULL, &err) == 0);
    db_event ev;
    db_upload u;
    int64_t now = ty_now_ms();

    /* Without a store nothing is queued. */
    CHECK(db_checkpoint_add(d, other, 1, "checkpoints/step-000001", 5, "aa", "/l/1", NULL, NULL,
                            &err) == 0);
    CHECK(count(d, "pending") == 0);
    CHECK(db_upload_claim(d, now, &u, &ev, &err) == TY_ENOENT);

    /* local → (queued) → uploading. */
    CHECK(db_checkpoint_add(d, job, 5, "checkpoints/step-000005", 10, "ab", "/l/5", STORE, &ev,
                            &err) == 0);
    expect_event(&ev, "local");
    CHECK(count(d, "pending") == 1);
    int busy = 0;
    CHECK(db_upload_busy(d, job, false, &busy, &err) == 0 && busy == 1);
    CHECK(db_upload_claim(d, now, &u, &ev, &err) == 0);
    expect_event(&ev, "uploading");
    CHECK(!strcmp(u.op, "put") && u.job_id == job && u.step == 5 && u.attempts == 1);
    CHECK(!strcmp(u.uri, STORE) && !strcmp(u.local_path, "/l/5") &&
          !strcmp(u.dir, "checkpoints/step-000005"));
    expect_state(d, job, 5, "uploading");
    CHECK(count(d, "running") == 1);
    /* Two workers never take the same row. */
    db_upload u2;
    CHECK(db_upload_claim(d, now, &u2, NULL, &err) == TY_ENOENT);

    /* A failure to retry: failed with the reason, pending again later. */
    CHECK(db_upload_finish(d, &u, DB_UP_RETRY, NULL, "connection refused", now + 60000, &ev,
                           &err) == 0);
    expect_event(&ev, "failed");
    expect_state(d, job, 5, "failed");
    CHECK(db_upload_busy(d, job, false, &busy, &err) == 0 &&
          busy == 0); /* tried: a pause does not wait */
    CHECK(db_upload_busy(d, job, true, &busy, &err) == 0 &&
          busy == 1);                                             /* success waits for the retry */
    CHECK(db_upload_claim(d, now, &u2, NULL, &err) == TY_ENOENT); /* not due yet */
    db_upload_clear(&u);
    CHECK(db_upload_claim(d, now + 60000, &u, &ev, &err) == 0);
    expect_event(&ev, "uploading");
    CHECK(u.attempts == 2);

    /* uploading → committed, with the remote URI; the row is gone. */
    CHECK(db_upload_finish(d, &u, DB_UP_DONE, "s3://bucket/runs/job-1/checkpoints/step-000005",
                           NULL, 0, &ev, &err) == 0);
    CHECK(strstr(ev.data, "\"remote_uri\":\"s3://bucket/runs/job-1/") != NULL);
    expect_event(&ev, "committed");
    db_upload_clear(&u);
    db_checkpoint *c;
    int n;
    CHECK(db_checkpoint_list(d, job, &c, &n, &err) == 0);
    CHECK(n == 1 && !strcmp(c[0].state, "committed") && c[0].error == NULL &&
          !strcmp(c[0].remote_uri, "s3://bucket/runs/job-1/checkpoints/step-000005") &&
          c[0].attempts == 2);
    db_checkpoints_free(c, n);
    CHECK(count(d, "pending") + count(d, "running") + count(d, "failed") == 0);

    /* A restart mid-upload: running → pending, uploading → local. */
    CHECK(db_checkpoint_add(d, job, 10, "checkpoints/step-000010", 10, "cd", "/l/10", STORE, NULL,
                            &err) == 0);
    CHECK(db_upload_claim(d, now, &u, NULL, &err) == 0);
    expect_state(d, job, 10, "uploading");
    int requeued = 0;
    CHECK(db_upload_recover(d, &requeued, &err) == 0 && requeued == 1);
    expect_state(d, job, 10, "local");
    CHECK(count(d, "pending") == 1 && count(d, "running") == 0);
    db_upload_clear(&u);

    /* Retention cannot take a checkpoint while it is being uploaded. */
    CHECK(db_upload_claim(d, now, &u, NULL, &err) == 0);
    CHECK(db_checkpoint_list(d, job, &c, &n, &err) == 0);
    CHECK(db_checkpoint_retire(d, find_step(c, n, 10), STORE, NULL, &err) == TY_ESTATE);
    /* ... but retires a committed one: deleted, its remote delete queued. */
    CHECK(db_checkpoint_retire(d, find_step(c, n, 5), STORE, &ev, &err) == 0);
    expect_event(&ev, "deleted");
    /* Retiring twice queues nothing more. */
    CHECK(db_checkpoint_retire(d, find_step(c, n, 5), STORE, NULL, &err) == 0);
    db_checkpoints_free(c, n);
    expect_state(d, job, 5, "deleted");
    CHECK(count(d, "pending") == 1);

    /* The vanished local dir: skipped → deleted, not failed. */
    CHECK(db_upload_finish(d, &u, DB_UP_SKIPPED, NULL, "removed locally", 0, &ev, &err) == 0);
    expect_event(&ev, "deleted");
    db_upload_clear(&u);
    expect_state(d, job, 10, "deleted");

    /* The remote delete: claimed like an upload, no checkpoint event. */
    CHECK(db_upload_claim(d, now, &u, &ev, &err) == 0);
    CHECK(!strcmp(u.op, "delete") && u.step == 5 && ev.id == 0);
    CHECK(db_upload_finish(d, &u, DB_UP_RETRY, NULL, "503", now + 1000, &ev, &err) == 0);
    CHECK(ev.id == 0);
    expect_state(d, job, 5, "deleted");
    db_upload_clear(&u);
    CHECK(db_upload_claim(d, now + 1000, &u, NULL, &err) == 0);
    CHECK(db_upload_finish(d, &u, DB_UP_DONE, NULL, NULL, 0, NULL, &err) == 0);
    db_upload_clear(&u);
    CHECK(count(d, "pending") == 0);

    /* Failed for good: the row stays failed with its reason. */
    CHECK(db_checkpoint_add(d, job, 15, "checkpoints/step-000015", 10, "ef", "/l/15", STORE, NULL,
                            &err) == 0);
    CHECK(db_upload_claim(d, now, &u, NULL, &err) == 0);
    CHECK(db_upload_finish(d, &u, DB_UP_FAILED, NULL, "AccessDenied", 0, &ev, &err) == 0);
    expect_event(&ev, "failed");
    db_upload_clear(&u);
    CHECK(count(d, "failed") == 1);
    /* A second report of the step replaces the checkpoint and its upload. */
    CHECK(db_checkpoint_add(d, job, 15, "checkpoints/step-000015", 11, "ef", "/l/15", STORE, NULL,
                            &err) == 0);
    CHECK(count(d, "failed") == 0 && count(d, "pending") == 1);
    expect_state(d, job, 15, "local");

    /* Purge drops the job's rows but the running one, which the caller
     * cancels; once it is back in the queue the next call drops it too. */
    CHECK(db_upload_claim(d, now, &u, NULL, &err) == 0 && u.step == 15);
    CHECK(db_checkpoint_add(d, job, 20, "checkpoints/step-000020", 10, "gh", "/l/20", STORE, NULL,
                            &err) == 0);
    int running = -1;
    CHECK(db_upload_drop_job(d, job, &running, &err) == 0 && running == 1);
    CHECK(count(d, "pending") == 0 && count(d, "running") == 1);
    CHECK(db_upload_finish(d, &u, DB_UP_RETRY, NULL, "cancelled", now, NULL, &err) == 0);
    db_upload_clear(&u);
    CHECK(db_upload_drop_job(d, job, &running, &err) == 0 && running == 0);
    CHECK(count(d, "pending") + count(d, "running") == 0);

    /* keep_best reads the eval loss at the checkpoint's step. */
    db_event_in in = {
        .job_id = job, .ts_ms = now, .type = "eval", .data = "{\"step\":15,\"loss\":1.25}"};
    CHECK(db_events_append(d, &in, 1, NULL, &err) == 0);
    double loss = 0;
    CHECK(db_checkpoint_eval_loss(d, job, 15, &loss, &err) == 0 && loss == 1.25);
    CHECK(db_checkpoint_eval_loss(d, job, 10, &loss, &err) == TY_ENOENT);

    db_close(d);
    unlink(path);
    char wal[300];
    snprintf(wal, sizeof wal, "%s-wal", path);
    unlink(wal);
    snprintf(wal, sizeof wal, "%s-shm", path);
    unlink(wal);
    rmdir(dir);
    printf("upload queue: state transitions ok\n");
    return ty_summary("upload queue");
}
