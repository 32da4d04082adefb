/* test_overlay.c — the pieces behind a full disk that need no full disk:
 * the overlay of settling jobs (set, apply to a row, list filter, clear)
 * and the database's read-only modes (reads work, a write is TY_ENOSPC,
 * the server's answer for it) and the largest job id given out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "db.h"
#include "overlay.h"

static void check_overlay(void)
{
    srv s = {0};
    s.overlay = overlay_new();
    db_job j = {.id = 7, .state = JOB_RUNNING, .gpus = strdup("0,1"), .error = NULL};
    job_state st;
    CHECK(!overlay_state(&s, 7, &st));
    CHECK(overlay_widen(&s, JOB_BIT(JOB_FAILED)) == JOB_BIT(JOB_FAILED), "no entry: mask as given");
    overlay_set(&s, 7, JOB_FAILED, "engine died");
    overlay_set(&s, 8, JOB_QUEUED, "restart 1 of 3");
    CHECK(overlay_state(&s, 7, &st) && st == JOB_FAILED);
    unsigned m = overlay_widen(&s, JOB_BIT(JOB_FAILED));
    CHECK(m & JOB_BIT(JOB_RUNNING), "a settling job's row is read for a failed filter");
    overlay_set_detail(&s, 7, false, NULL, -1);
    j.resume_from = strdup("checkpoints/step-000002");
    overlay_apply(&s, &j);
    CHECK(j.state == JOB_FAILED && j.error && !strcmp(j.error, "engine died"));
    CHECK(j.resume_from && j.restarts == 0, "a failure keeps the row's resume point and restarts");
    CHECK(j.finished_ms > 0 && j.gpus[0] == 0, "finished, holding no GPUs");
    CHECK(overlay_keep(&j, JOB_BIT(JOB_FAILED)) && !overlay_keep(&j, JOB_BIT(JOB_RUNNING)));
    CHECK(overlay_keep(&j, 0), "no filter keeps every row");
    overlay_set(&s, 7, JOB_CANCELLED, "cancelled");
    CHECK(overlay_state(&s, 7, &st) && st == JOB_CANCELLED, "a later request replaces the entry");
    overlay_set_detail(&s, 8, true, "checkpoints/step-000004", 2);
    db_job q = {.id = 8, .state = JOB_RUNNING, .resume_from = NULL, .restarts = 1};
    overlay_apply(&s, &q);
    CHECK(q.state == JOB_QUEUED && q.resume_from &&
              !strcmp(q.resume_from, "checkpoints/step-000004"),
          "a requeue shows where it resumes from");
    CHECK(q.restarts == 2, "and the restart it counts");
    free(q.resume_from);
    overlay_clear(&s, 7);
    CHECK(!overlay_state(&s, 7, &st) && overlay_state(&s, 8, &st) && st == JOB_QUEUED);
    db_job k = {.id = 9, .state = JOB_RUNNING};
    overlay_apply(&s, &k);
    CHECK(k.state == JOB_RUNNING, "a job without an entry is as its row says");
    free(j.gpus);
    free(j.error);
    free(j.resume_from);
    overlay_free(s.overlay);
}

static void check_modes(const char *path)
{
    db *d;
    ty_err err = {0};
    REQUIRE(db_open(path, &d, &err) == 0, "%s", err.msg);
    int64_t max = -1;
    CHECK(db_job_max_id(d, &max, &err) == 0 && max == 0, "no job yet: %lld", (long long)max);
    db_new_job in = {.spec = "{}", .max_steps = 1};
    int64_t id = 0, gone = 0;
    bool existing;
    REQUIRE(db_job_insert(d, &in, &gone, &existing, NULL, &err) == 0, "%s", err.msg);
    REQUIRE(db_job_insert(d, &in, &id, &existing, NULL, &err) == 0, "%s", err.msg);
    db_event ev;
    db_job_update up = {.set_finished = true};
    REQUIRE(db_job_transition(d, gone, JOB_BIT(JOB_QUEUED), JOB_CANCELLED, "x", &up, NULL, &ev,
                              &err) == 0,
            "%s", err.msg);
    db_event_clear(&ev);
    REQUIRE(db_job_delete(d, gone, &err) == 0, "%s", err.msg);
    CHECK(db_job_max_id(d, &max, &err) == 0 && max == id, "max id %lld after %lld", (long long)max,
          (long long)id);
    /* The newest job deleted: its id stays given out. */
    db_close(d);
    for (int m = DB_RO; m <= DB_IMMUTABLE; m++) {
        REQUIRE(db_open_mode(path, (db_mode)m, &d, &err) == 0, "mode %d: %s", m, err.msg);
        db_job j;
        CHECK(db_job_get(d, id, &j, &err) == 0, "mode %d reads: %s", m, err.msg);
        if (!err.code) db_job_free(&j);
        ty_err_clear(&err);
        int64_t nid;
        int rc = db_job_insert(d, &in, &nid, &existing, NULL, &err);
        CHECK(rc != 0 && err.code == TY_ENOSPC, "mode %d: a write is TY_ENOSPC (%d: %s)", m,
              err.code, err.msg);
        ty_err_clear(&err);
        db_close(d);
    }
}

int main(void)
{
    check_overlay();
    char dir[] = "/tmp/ty-ov-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char path[256], cmd[300];
    snprintf(path, sizeof path, "%s/t.db", dir);
    check_modes(path);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return ty_summary("overlay");
}
