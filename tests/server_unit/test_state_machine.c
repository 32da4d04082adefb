/* test_state_machine.c — every (from, to) pair of job states, against the
 * table of DESIGN §2, both in db_transition_legal and through
 * db_job_transition on a real database: legal moves change the state and
 * append exactly one `state` event; illegal ones are TY_ESTATE and change
 * nothing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "db.h"

/* The expected legal moves, written out independently of db.c's table. */
static const char *const legal[] = {
    "queued>starting",    "queued>paused",      "queued>cancelled", "starting>running",
    "starting>stopping",  "starting>queued",    "starting>failed",  "running>succeeded",
    "running>failed",     "running>stopping",   "running>queued",   "stopping>paused",
    "stopping>cancelled", "stopping>succeeded", "stopping>failed",  "stopping>queued",
    "paused>queued",      "paused>cancelled",
};

static bool expected_legal(job_state a, job_state b)
{
    char k[40];
    snprintf(k, sizeof k, "%s>%s", db_state_name(a), db_state_name(b));
    for (size_t i = 0; i < sizeof legal / sizeof *legal; i++)
        if (!strcmp(legal[i], k)) return true;
    return false;
}

/* A legal path from queued to each state. */
static const job_state paths[JOB_NSTATES][4] = {
    [JOB_QUEUED] = {JOB_QUEUED},
    [JOB_STARTING] = {JOB_STARTING},
    [JOB_RUNNING] = {JOB_STARTING, JOB_RUNNING},
    [JOB_STOPPING] = {JOB_STARTING, JOB_RUNNING, JOB_STOPPING},
    [JOB_PAUSED] = {JOB_PAUSED},
    [JOB_SUCCEEDED] = {JOB_STARTING, JOB_RUNNING, JOB_SUCCEEDED},
    [JOB_FAILED] = {JOB_STARTING, JOB_FAILED},
    [JOB_CANCELLED] = {JOB_CANCELLED},
};
static const int path_len[JOB_NSTATES] = {0, 1, 2, 3, 1, 3, 2, 1};

static int64_t count_events(db *d, int64_t id)
{
    db_event *e;
    int n;
    ty_err err = {0};
    CHECK(db_events_job(d, id, 0, 100000, &e, &n, &err) == 0);
    db_events_free(e, n);
    return n;
}

int main(void)
{
    /* Names round-trip; terminal states are exactly the three. */
    for (int s = 0; s < JOB_NSTATES; s++) {
        CHECK(db_state_parse(db_state_name((job_state)s)) == s);
        CHECK(db_state_terminal((job_state)s) ==
              (s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED));
    }
    CHECK(db_state_parse("running ") == -1);
    CHECK(db_state_parse(NULL) == -1);

    char dir[] = "/tmp/ty-sm-XXXXXX";
    CHECK(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/t.db", dir);
    db *d;
    ty_err err = {0};
    CHECK(db_open(path, &d, &err) == 0);

    int checked = 0;
    for (int a = 0; a < JOB_NSTATES; a++) {
        for (int b = 0; b < JOB_NSTATES; b++) {
            bool want = expected_legal((job_state)a, (job_state)b);
            CHECK(db_transition_legal((job_state)a, (job_state)b) == want);

            db_new_job nj = {.spec = "{}", .max_restarts = 3, .max_steps = 10};
            int64_t id;
            bool existing;
            db_event ev;
            CHECK(db_job_insert(d, &nj, &id, &existing, &ev, &err) == 0);
            CHECK(!existing && ev.seq == 1 && !strcmp(ev.type, "state"));
            db_event_clear(&ev);
            for (int k = 0; k < path_len[a]; k++) {
                CHECK(db_job_transition(d, id, ~0u, paths[a][k], "walk", NULL, NULL, NULL, &err) ==
                      0);
            }
            int64_t before = count_events(d, id);
            job_state from;
            int rc = db_job_transition(d, id, ~0u, (job_state)b, "test", NULL, &from, &ev, &err);
            CHECK(from == (job_state)a);
            db_job j;
            CHECK(db_job_get(d, id, &j, &err) == 0);
            if (want) {
                CHECK(rc == 0);
                CHECK(j.state == (job_state)b);
                CHECK(count_events(d, id) == before + 1);
                CHECK(ev.seq == before + 1);
                json_t *o = json_loads(ev.data, 0, NULL);
                CHECK(!strcmp(json_string_value(json_object_get(o, "from")), db_state_name(a)));
                CHECK(!strcmp(json_string_value(json_object_get(o, "to")), db_state_name(b)));
                CHECK(!strcmp(json_string_value(json_object_get(o, "reason")), "test"));
                json_decref(o);
                db_event_clear(&ev);
            } else {
                CHECK(rc == TY_ESTATE);
                CHECK(strstr(err.msg, db_state_name(a)) && strstr(err.msg, db_state_name(b)));
                CHECK(j.state == (job_state)a);
                CHECK(count_events(d, id) == before);
            }
            db_job_free(&j);
            checked++;
        }
    }
    CHECK(checked == JOB_NSTATES * JOB_NSTATES);

    /* from_mask narrows a legal move: running → stopping refused when only
     * queued is accepted (a cancel racing the scheduler). */
    db_new_job nj = {.spec = "{}", .max_restarts = 3};
    int64_t id;
    bool existing;
    CHECK(db_job_insert(d, &nj, &id, &existing, NULL, &err) == 0);
    CHECK(db_job_transition(d, id, JOB_BIT(JOB_PAUSED), JOB_CANCELLED, "x", NULL, NULL, NULL,
                            &err) == TY_ESTATE);
    /* Unknown job. */
    CHECK(db_job_transition(d, 999999, ~0u, JOB_CANCELLED, "x", NULL, NULL, NULL, &err) ==
          TY_ENOENT);

    /* Fields written with a transition. */
    db_job_update up = {.has_error = true,
                        .error = "boom",
                        .set_finished = true,
                        .has_restarts = true,
                        .restarts = 2};
    CHECK(db_job_transition(d, id, ~0u, JOB_STARTING, "s", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_transition(d, id, ~0u, JOB_FAILED, "f", &up, NULL, NULL, &err) == 0);
    db_job j;
    CHECK(db_job_get(d, id, &j, &err) == 0);
    CHECK(j.error && !strcmp(j.error, "boom") && j.finished_ms > 0 && j.restarts == 2);
    db_job_free(&j);

    /* Only terminal jobs can be deleted. */
    int64_t id2;
    CHECK(db_job_insert(d, &nj, &id2, &existing, NULL, &err) == 0);
    CHECK(db_job_delete(d, id2, &err) == TY_ESTATE);
    CHECK(db_job_delete(d, id, &err) == 0);
    CHECK(db_job_get(d, id, &j, &err) == TY_ENOENT);
    CHECK(count_events(d, id) == 0);

    db_close(d);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("state machine: %d transitions checked\n", checked);
    return ty_summary("state machine");
}
