/* db_ops.c — SQL of the operations features (db_ops.h): PATCH of a waiting
 * job, the usage ledger, the webhook outbox, token names.
 *
 * Same rules and helpers as db.c (db_int.h): BEGIN IMMEDIATE for writes,
 * one transaction per logical change ended by end_tx, a full disk is
 * TY_ENOSPC, one exit per function. */
#include "db_ops.h"

#include <stdio.h>

#include "db_int.h"
#include "tyutil.h"

/* ---- PATCH --------------------------------------------------------------------- */

int db_job_patch_apply(db *d, int64_t id, const db_job_patch *p, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    int state = -1, rc = begin_job_state(d, id, &state, err);
    if (rc) return rc; /* the transaction is already over */
    if (state != JOB_QUEUED && state != JOB_PAUSED)
        rc = ty_err_set(err, TY_ESTATE, "job %lld is %s; only queued or paused jobs can be changed",
                        (long long)id, db_state_name(state));
    /* The stored spec says the same as the columns (GET shows both). */
    if (!rc)
        rc = prep(d,
                  "UPDATE jobs SET updated_ms = ?2,"
                  " name = CASE WHEN ?3 THEN ?4 ELSE name END,"
                  " priority = CASE WHEN ?5 THEN ?6 ELSE priority END,"
                  " tags = CASE WHEN ?7 THEN json(?8) ELSE tags END,"
                  " spec = json_set(CASE WHEN ?3 AND ?4 IS NULL THEN json_remove(spec, '$.name')"
                  "   WHEN ?3 THEN json_set(spec, '$.name', ?4) ELSE spec END,"
                  "   '$.priority', CASE WHEN ?5 THEN ?6 ELSE priority END,"
                  "   '$.tags', json(CASE WHEN ?7 THEN ?8 ELSE tags END))"
                  " WHERE id = ?1",
                  &st, err);
    if (!rc) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, ty_now_ms());
        sqlite3_bind_int(st, 3, p->has_name);
        bind_str(st, 4, p->name);
        sqlite3_bind_int(st, 5, p->has_priority);
        sqlite3_bind_int(st, 6, p->priority);
        sqlite3_bind_int(st, 7, p->has_tags);
        sqlite3_bind_text(st, 8, p->tags ? p->tags : "[]", -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sql_err(d, err, "patch job");
    }
    sqlite3_finalize(st);
    return end_tx(d, rc, NULL, err);
}

/* ---- usage ------------------------------------------------------------------------ */

int db_usage_list(db *d, int64_t from_ms, int64_t to_ms, db_usage_row **rows, int *n, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *rows = NULL;
    *n = 0;
    int rc = prep(d,
                  "SELECT job_id, token_name, tags, state, finished_ms, gpus, run_ms, cost, tokens"
                  " FROM usage WHERE finished_ms >= ? AND finished_ms < ?"
                  " ORDER BY finished_ms, job_id",
                  &st, err)
                 ? TY_EIO
                 : 0;
    if (!rc) {
        sqlite3_bind_int64(st, 1, from_ms);
        sqlite3_bind_int64(st, 2, to_ms);
        int cap = 0, s;
        while ((s = sqlite3_step(st)) == SQLITE_ROW) {
            db_usage_row *g = grow_rows(*rows, *n, &cap, sizeof *g);
            if (!g) {
                rc = ty_err_set(err, TY_ENOMEM, "out of memory");
                break;
            }
            *rows = g;
            db_usage_row *r = &g[(*n)++];
            memset(r, 0, sizeof *r);
            r->job_id = sqlite3_column_int64(st, 0);
            r->token_name = col_str(st, 1);
            r->tags = col_str(st, 2);
            snprintf(r->state, sizeof r->state, "%s", (const char *)sqlite3_column_text(st, 3));
            r->finished_ms = sqlite3_column_int64(st, 4);
            r->gpus = sqlite3_column_int(st, 5);
            r->run_ms = sqlite3_column_int64(st, 6);
            r->has_cost = sqlite3_column_type(st, 7) != SQLITE_NULL;
            r->cost = sqlite3_column_double(st, 7);
            r->tokens = sqlite3_column_int64(st, 8);
        }
        if (!rc && s != SQLITE_DONE) rc = sql_err(d, err, "list usage");
    }
    sqlite3_finalize(st);
    if (rc) {
        db_usage_free(*rows, *n);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

void db_usage_free(db_usage_row *rows, int n)
{
    for (int i = 0; rows && i < n; i++) {
        free(rows[i].token_name);
        free(rows[i].tags);
    }
    free(rows);
}

/* ---- webhooks ------------------------------------------------------------------------ */

int db_webhook_cursor(db *d, int64_t *event_id, ty_err *err)
{
    /* A read while the cursor exists (the delivery thread asks five times
     * a second); the first time ever, it starts after the newest event, so
     * history is not sent. */
    int rc = 0, found = 0;
    *event_id = 0;
    for (int pass = 0; pass < 2 && !rc && !found; pass++) {
        sqlite3_stmt *st = NULL;
        rc = prep(d, "SELECT event_id FROM webhook_cursor WHERE one = 1", &st, err) ? TY_EIO : 0;
        if (!rc && (found = sqlite3_step(st) == SQLITE_ROW))
            *event_id = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (!rc && !found && !pass)
            rc = exec_sql(d,
                          "INSERT OR IGNORE INTO webhook_cursor(one, event_id)"
                          " SELECT 1, COALESCE(MAX(id), 0) FROM job_events",
                          err)
                     ? TY_EIO
                     : 0;
    }
    return rc;
}

int db_webhook_events(db *d, int64_t after_id, int limit, db_event **out, int *n, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    int rc = prep(d,
                  "SELECT id, job_id, seq, ts_ms, type, data FROM job_events WHERE id > ? AND"
                  " type IN ('state','budget','stall','idle_gpu') ORDER BY id LIMIT ?",
                  &st, err)
                 ? TY_EIO
                 : 0;
    if (!rc) {
        sqlite3_bind_int64(st, 1, after_id);
        sqlite3_bind_int(st, 2, limit);
        int cap = 0, s;
        while ((s = sqlite3_step(st)) == SQLITE_ROW) {
            db_event *g = grow_rows(*out, *n, &cap, sizeof *g);
            if (!g) {
                rc = ty_err_set(err, TY_ENOMEM, "out of memory");
                break;
            }
            *out = g;
            db_event *e = &g[(*n)++];
            memset(e, 0, sizeof *e);
            e->id = sqlite3_column_int64(st, 0);
            e->job_id = sqlite3_column_int64(st, 1);
            e->seq = sqlite3_column_int64(st, 2);
            e->ts_ms = sqlite3_column_int64(st, 3);
            snprintf(e->type, sizeof e->type, "%s", (const char *)sqlite3_column_text(st, 4));
            e->data = col_str(st, 5);
        }
        if (!rc && s != SQLITE_DONE) rc = sql_err(d, err, "webhook events");
    }
    sqlite3_finalize(st);
    if (rc) {
        db_events_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int db_webhook_fanout(db *d, int64_t event_id, const char *const *urls, char *const *bodies, int n,
                      ty_err *err)
{
    if (begin(d, err)) return TY_EIO;
    int rc = 0;
    int64_t now = ty_now_ms();
    for (int i = 0; i < n && !rc; i++) {
        sqlite3_stmt *st = NULL;
        rc = prep(d, "INSERT INTO webhook_outbox(event_id, url, body, created_ms) VALUES (?,?,?,?)",
                  &st, err)
                 ? TY_EIO
                 : 0;
        if (!rc) {
            sqlite3_bind_int64(st, 1, event_id);
            sqlite3_bind_text(st, 2, urls[i], -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, bodies[i], -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 4, now);
            if (sqlite3_step(st) != SQLITE_DONE) rc = sql_err(d, err, "queue webhook");
        }
        sqlite3_finalize(st);
    }
    sqlite3_stmt *st = NULL;
    if (!rc && !(rc = prep(d, "UPDATE webhook_cursor SET event_id = ? WHERE one = 1", &st, err))) {
        sqlite3_bind_int64(st, 1, event_id);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sql_err(d, err, "webhook cursor");
    }
    sqlite3_finalize(st);
    return end_tx(d, rc, NULL, err);
}

int db_webhook_due(db *d, int64_t now_ms, int limit, db_webhook **out, int *n, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    int rc = prep(d,
                  "SELECT id, event_id, url, body, attempts FROM webhook_outbox"
                  " WHERE state = 'pending' AND next_ms <= ? ORDER BY id LIMIT ?",
                  &st, err)
                 ? TY_EIO
                 : 0;
    if (!rc) {
        sqlite3_bind_int64(st, 1, now_ms);
        sqlite3_bind_int(st, 2, limit);
        int cap = 0;
        /* Out of memory part way: the rows read so far (the rest next time). */
        while (sqlite3_step(st) == SQLITE_ROW) {
            db_webhook *g = grow_rows(*out, *n, &cap, sizeof *g);
            if (!g) break;
            *out = g;
            db_webhook *w = &g[(*n)++];
            w->id = sqlite3_column_int64(st, 0);
            w->event_id = sqlite3_column_int64(st, 1);
            w->url = col_str(st, 2);
            w->body = col_str(st, 3);
            w->attempts = sqlite3_column_int(st, 4);
        }
    }
    sqlite3_finalize(st);
    return rc;
}

void db_webhooks_free(db_webhook *w, int n)
{
    for (int i = 0; w && i < n; i++) {
        free(w[i].url);
        free(w[i].body);
    }
    free(w);
}

int db_webhook_result(db *d, int64_t id, const char *state, int64_t next_ms, const char *error,
                      ty_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = prep(d,
                  "UPDATE webhook_outbox SET state = ?, attempts = attempts + 1, next_ms = ?,"
                  " last_error = ? WHERE id = ?",
                  &st, err)
                 ? TY_EIO
                 : 0;
    if (!rc) {
        sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, next_ms);
        bind_str(st, 3, error);
        sqlite3_bind_int64(st, 4, id);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sql_err(d, err, "webhook result");
    }
    sqlite3_finalize(st);
    return rc;
}

int db_webhook_count(db *d, const char *state, int *n, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *n = 0;
    int rc = prep(d, "SELECT COUNT(*) FROM webhook_outbox WHERE state = ?", &st, err) ? TY_EIO : 0;
    if (!rc) {
        sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW) *n = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    return rc;
}

/* ---- tokens ---------------------------------------------------------------------------- */

int db_token_name(db *d, int64_t id, char *out, size_t cap, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    int rc = prep(d, "SELECT name FROM tokens WHERE id = ?", &st, err) ? TY_EIO : 0;
    if (!rc) {
        sqlite3_bind_int64(st, 1, id);
        if (sqlite3_step(st) == SQLITE_ROW)
            snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
        else
            rc = ty_err_set(err, TY_ENOENT, "no token %lld", (long long)id);
    }
    sqlite3_finalize(st);
    return rc;
}
