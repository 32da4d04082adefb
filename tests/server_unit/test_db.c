/* test_db.c — schema migrations (a fresh database, and an upgrade from the
 * previous version keeping its rows), plus the db queries the API leans on:
 * idempotency keys, queue positions, event sequences, summaries, tokens. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "db.h"
#include "tyutil.h"

static bool has_table(const char *path, const char *name)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(h, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", -1,
                             &st, NULL) == SQLITE_OK);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    bool found = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    sqlite3_close(h);
    return found;
}

/* Does table have a column named col? (pragma_table_info, read-only.) */
static bool has_column(const char *path, const char *table, const char *col)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(h, "SELECT 1 FROM pragma_table_info(?) WHERE name = ?", -1, &st,
                             NULL) == SQLITE_OK);
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, col, -1, SQLITE_STATIC);
    bool found = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    sqlite3_close(h);
    return found;
}

static void set_user_version(const char *path, int v)
{
    sqlite3 *h;
    char sql[64];
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v);
    CHECK(sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
}

int main(void)
{
    char dir[] = "/tmp/ty-db-XXXXXX";
    CHECK(mkdtemp(dir));
    char fresh[256], old[256], newer[256];
    snprintf(fresh, sizeof fresh, "%s/fresh.db", dir);
    snprintf(old, sizeof old, "%s/old.db", dir);
    snprintf(newer, sizeof newer, "%s/newer.db", dir);
    ty_err err = {0};
    db *d;

    /* Fresh: every table, newest version. */
    CHECK(db_open(fresh, &d, &err) == 0);
    CHECK(db_user_version(d) == DB_SCHEMA_VERSION);
    db_close(d);
    const char *tables[] = {"jobs",   "job_events",       "checkpoints",
                            "tokens", "idempotency_keys", "uploads"};
    for (size_t i = 0; i < 6; i++)
        CHECK(has_table(fresh, tables[i]));
    /* Opening again is a no-op. */
    CHECK(db_open(fresh, &d, &err) == 0);
    CHECK(db_user_version(d) == DB_SCHEMA_VERSION);
    db_close(d);

    /* Upgrade from version 4 (before token scopes, 5, and checkpoint_error,
     * 6) runs every later migration and keeps the data written at 4. */
    CHECK(db_open_at_version(old, 4, &d, &err) == 0);
    CHECK(db_user_version(d) == 4);
    CHECK(has_column(old, "jobs", "run_ms") && !has_column(old, "tokens", "scopes") &&
          !has_column(old, "jobs", "checkpoint_error"));
    {
        /* A token from before scopes (migration 5) keeps every right. */
        sqlite3 *h;
        CHECK(sqlite3_open(old, &h) == SQLITE_OK);
        CHECK(sqlite3_exec(h,
                           "INSERT INTO tokens(name, sha256, created_ms) VALUES ('old', "
                           "'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 1)",
                           NULL, NULL, NULL) == SQLITE_OK);
        sqlite3_close(h);
    }
    db_new_job nj = {.name = "kept", .spec = "{\"a\":1}", .max_restarts = 3, .max_steps = 7};
    int64_t id;
    bool existing;
    CHECK(db_job_insert(d, &nj, &id, &existing, NULL, &err) == 0);
    db_close(d);
    CHECK(db_open(old, &d, &err) == 0);
    CHECK(db_user_version(d) == DB_SCHEMA_VERSION);
    CHECK(has_column(old, "jobs", "run_ms") && has_column(old, "jobs", "run_since_ms"));
    CHECK(has_column(old, "tokens", "scopes") && has_column(old, "jobs", "checkpoint_error"));
    {
        db_token *toks;
        int nt;
        CHECK(db_token_list(d, &toks, &nt, &err) == 0 && nt == 1);
        CHECK(!strcmp(toks[0].scopes, "read,submit,admin") && toks[0].sha256[0] == 'b');
        free(toks);
    }
    db_job j;
    CHECK(db_job_get(d, id, &j, &err) == 0);
    CHECK(!strcmp(j.name, "kept") && j.max_steps == 7 && j.state == JOB_QUEUED);
    CHECK(j.run_ms == 0 && j.run_since_ms == 0 && j.checkpoint_error == NULL);
    db_job_free(&j);
    /* checkpoint_error is set and cleared like any other field. */
    db_job_update ce = {.has_checkpoint_error = true,
                        .checkpoint_error = "step-000001 not uploaded"};
    CHECK(db_job_update_fields(d, id, &ce, &err) == 0 && db_job_get(d, id, &j, &err) == 0);
    CHECK(j.checkpoint_error && !strcmp(j.checkpoint_error, "step-000001 not uploaded"));
    db_job_free(&j);
    ce.checkpoint_error = NULL;
    CHECK(db_job_update_fields(d, id, &ce, &err) == 0 && db_job_get(d, id, &j, &err) == 0);
    CHECK(j.checkpoint_error == NULL);
    db_job_free(&j);

    /* Running time: counted from starting until paused, not while paused,
     * again after resuming. */
    CHECK(db_job_transition(d, id, ~0u, JOB_STARTING, "s", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_get(d, id, &j, &err) == 0);
    CHECK(j.run_since_ms > 0 && j.run_ms == 0);
    CHECK(db_job_run_ms(&j, j.run_since_ms + 5000) == 5000);
    db_job_free(&j);
    CHECK(db_job_transition(d, id, ~0u, JOB_RUNNING, "r", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_transition(d, id, ~0u, JOB_STOPPING, "p", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_transition(d, id, ~0u, JOB_PAUSED, "p", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_get(d, id, &j, &err) == 0);
    int64_t ran = j.run_ms;
    CHECK(j.run_since_ms == 0 && ran >= 0);
    CHECK(db_job_run_ms(&j, ty_now_ms() + 60000) == ran);
    db_job_free(&j);
    CHECK(db_job_transition(d, id, ~0u, JOB_QUEUED, "resume", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_get(d, id, &j, &err) == 0);
    CHECK(j.run_ms == ran && j.run_since_ms == 0);
    db_job_free(&j);
    db_close(d);

    /* A database from a newer build is refused, not damaged. */
    CHECK(db_open(newer, &d, &err) == 0);
    db_close(d);
    set_user_version(newer, DB_SCHEMA_VERSION + 1);
    CHECK(db_open(newer, &d, &err) == TY_EINVAL);
    CHECK(strstr(err.msg, "newer"));

    /* Idempotency: same key + same body → the first job; other body → conflict. */
    CHECK(db_open(fresh, &d, &err) == 0);
    db_new_job a = {.spec = "{}", .max_restarts = 3, .idem_key = "k1", .body_sha256 = "aaa"};
    int64_t id1, id2;
    CHECK(db_job_insert(d, &a, &id1, &existing, NULL, &err) == 0 && !existing);
    CHECK(db_job_insert(d, &a, &id2, &existing, NULL, &err) == 0 && existing && id2 == id1);
    a.body_sha256 = "bbb";
    CHECK(db_job_insert(d, &a, &id2, &existing, NULL, &err) == TY_ESTATE);
    CHECK(!strcmp(err.field, "Idempotency-Key"));

    /* Queue order: priority desc, then submission. */
    db_new_job lo = {.spec = "{}", .priority = 0, .max_restarts = 3};
    db_new_job hi = {.spec = "{}", .priority = 5, .max_restarts = 3};
    int64_t l1, h1, l2;
    CHECK(db_job_insert(d, &lo, &l1, &existing, NULL, &err) == 0);
    CHECK(db_job_insert(d, &hi, &h1, &existing, NULL, &err) == 0);
    CHECK(db_job_insert(d, &lo, &l2, &existing, NULL, &err) == 0);
    CHECK(db_job_queue_position(d, h1, &err) == 1);
    CHECK(db_job_queue_position(d, id1, &err) == 2);
    CHECK(db_job_queue_position(d, l1, &err) == 3);
    CHECK(db_job_queue_position(d, l2, &err) == 4);
    int64_t *ids;
    int n;
    CHECK(db_job_queued_ids(d, &ids, &n, &err) == 0);
    CHECK(n == 4 && ids[0] == h1 && ids[1] == id1 && ids[2] == l1 && ids[3] == l2);
    free(ids);
    CHECK(db_job_transition(d, h1, ~0u, JOB_STARTING, "s", NULL, NULL, NULL, &err) == 0);
    CHECK(db_job_queue_position(d, h1, &err) == 0);
    CHECK(db_job_queue_position(d, l2, &err) == 3);

    /* Listing with a cursor: newest first, no overlap. */
    db_job *page;
    CHECK(db_job_list(d, 0, 0, 2, &page, &n, &err) == 0 && n == 2 && page[0].id == l2);
    int64_t last = page[1].id;
    db_jobs_free(page, n);
    CHECK(db_job_list(d, 0, last, 10, &page, &n, &err) == 0 && n == 2 && page[0].id < last);
    db_jobs_free(page, n);
    CHECK(db_job_list(d, JOB_BIT(JOB_STARTING), 0, 10, &page, &n, &err) == 0 && n == 1 &&
          page[0].id == h1);
    db_jobs_free(page, n);

    /* Events: per-job seq continues after the state events; summaries. */
    db_event_in in[3] = {
        {.job_id = l1, .ts_ms = 1000, .type = "metric", .data = "{\"step\":1,\"loss\":2.5}"},
        {.job_id = l1, .ts_ms = 2000, .type = "metric", .data = "{\"step\":3,\"loss\":2.0}"},
        {.job_id = l1, .ts_ms = 2000, .type = "eval", .data = "{\"step\":3,\"loss\":2.2}"},
    };
    db_event out[3];
    CHECK(db_events_append(d, in, 3, out, &err) == 0);
    CHECK(out[0].seq == 2 && out[1].seq == 3 && out[2].seq == 4);
    CHECK(out[0].id < out[1].id && out[1].id < out[2].id);
    for (int i = 0; i < 3; i++)
        db_event_clear(&out[i]);
    CHECK(db_job_get(d, l1, &j, &err) == 0);
    CHECK(j.last_metric && strstr(j.last_metric, "\"step\":3"));
    CHECK(j.last_eval && strstr(j.last_eval, "2.2"));
    CHECK(j.metric0_step == 1 && j.metric0_ms == 1000 && j.metric_last_ms == 2000);
    db_job_free(&j);
    /* An event of a job that does not exist is skipped, the rest kept. */
    db_event_in mixed[2] = {
        {.job_id = 424242, .ts_ms = 1, .type = "gpu", .data = "{}"},
        {.job_id = l2, .ts_ms = 1, .type = "log", .data = "{\"line\":\"x\"}"},
    };
    CHECK(db_events_append(d, mixed, 2, out, &err) == 0);
    CHECK(out[0].id == 0 && out[1].id > 0 && out[1].seq == 2);
    db_event_clear(&out[0]);
    db_event_clear(&out[1]);
    db_event *evs;
    CHECK(db_events_metrics(d, l1, &evs, &n, &err) == 0 && n == 2);
    db_events_free(evs, n);
    CHECK(db_events_global(d, 0, 1000, &evs, &n, &err) == 0);
    for (int i = 0; i < n; i++)
        CHECK(strcmp(evs[i].type, "metric") && strcmp(evs[i].type, "eval"));
    db_events_free(evs, n);

    /* Checkpoints: newest not failed/deleted. */
    db_event ev;
    CHECK(db_checkpoint_add(d, l1, 5, "checkpoints/step-000005", 10, "ab", "/x", NULL, &ev, &err) ==
          0);
    CHECK(!strcmp(ev.type, "checkpoint"));
    db_event_clear(&ev);
    CHECK(db_checkpoint_add(d, l1, 10, "checkpoints/step-000010", 10, "cd", "/y", NULL, NULL,
                            &err) == 0);
    char *newest;
    CHECK(db_checkpoint_newest(d, l1, &newest, &err) == 0);
    CHECK(newest && !strcmp(newest, "checkpoints/step-000010"));
    free(newest);

    /* Tokens: hash stored once per name. */
    char hash[65];
    memset(hash, 'a', 64);
    hash[64] = 0;
    CHECK(db_token_add(d, "ci", hash, &err) == 0);
    CHECK(db_token_add(d, "ci", hash, &err) == TY_ESTATE);
    char(*hs)[65];
    CHECK(db_token_hashes(d, &hs, &n, &err) == 0 && n == 1 && !strcmp(hs[0], hash));
    free(hs);
    hash[0] = 'c';
    CHECK(db_token_add_scoped(d, "reader", hash, "read", &err) == 0);
    db_token *toks;
    CHECK(db_token_list(d, &toks, &n, &err) == 0 && n == 2);
    CHECK(!strcmp(toks[0].scopes, "read,submit,admin") && !strcmp(toks[1].scopes, "read") &&
          toks[1].sha256[0] == 'c' && toks[1].id > toks[0].id);
    free(toks);
    db_close(d);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("db: migrations and queries ok\n");
    return ty_summary("db");
}
