/* db_ops.c — SQL of the operations features (db_ops.h): PATCH of a waiting
 * job, the usage ledger, the webhook outbox, token names.
 *
 * Same rules as db.c: BEGIN IMMEDIATE for writes, one transaction per
 * logical change, a full disk is TY_ENOSPC. */
#include "db_ops.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

static int ops_err(db *d, ty_err *err, const char *what)
{
    sqlite3 *h = db_sqlite(d);
    int code = (sqlite3_extended_errcode(h) & 0xff) == SQLITE_FULL ? TY_ENOSPC : TY_EIO;
    return ty_err_set(err, code, "database: %s: %s", what, sqlite3_errmsg(h));
}

static int prep(db *d, const char *sql, sqlite3_stmt **st, ty_err *err)
{
    if (sqlite3_prepare_v2(db_sqlite(d), sql, -1, st, NULL) != SQLITE_OK) {
        *st = NULL;
        return ops_err(d, err, "prepare");
    }
    return 0;
}

static int exec(db *d, const char *sql, ty_err *err)
{
    if (sqlite3_exec(db_sqlite(d), sql, NULL, NULL, NULL) != SQLITE_OK) return ops_err(d, err, sql);
    return 0;
}

static char *col_str(sqlite3_stmt *st, int i)
{
    const unsigned char *s = sqlite3_column_text(st, i);
    return s ? strdup((const char *)s) : NULL;
}

/* Grows *arr (elements of size sz) to hold index n. */
static void *grow(void *arr, int n, int *cap, size_t sz)
{
    if (n < *cap) return arr;
    int nc = *cap ? *cap * 2 : 16;
    void *g = realloc(arr, (size_t)nc * sz);
    if (g) *cap = nc;
    return g;
}

/* ---- PATCH --------------------------------------------------------------------- */

int db_job_patch_apply(db *d, int64_t id, const db_job_patch *p, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    if (exec(d, "BEGIN IMMEDIATE", err)) return TY_EIO;
    int rc = prep(d, "SELECT state FROM jobs WHERE id = ?", &st, err);
    if (rc) goto out;
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = ty_err_set(err, TY_ENOENT, "no job %lld", (long long)id);
        goto out;
    }
    char state[16];
    snprintf(state, sizeof state, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    st = NULL;
    if (strcmp(state, "queued") && strcmp(state, "paused")) {
        rc = ty_err_set(err, TY_ESTATE, "job %lld is %s; only queued or paused jobs can be changed",
                        (long long)id, state);
        goto out;
    }
    /* The stored spec says the same as the columns (GET shows both). */
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
    if (rc) goto out;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, ty_now_ms());
    sqlite3_bind_int(st, 3, p->has_name);
    if (p->name)
        sqlite3_bind_text(st, 4, p->name, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 4);
    sqlite3_bind_int(st, 5, p->has_priority);
    sqlite3_bind_int(st, 6, p->priority);
    sqlite3_bind_int(st, 7, p->has_tags);
    sqlite3_bind_text(st, 8, p->tags ? p->tags : "[]", -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = ops_err(d, err, "patch job");
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    rc = exec(d, "COMMIT", err);
out:
    sqlite3_finalize(st);
    if (rc) sqlite3_exec(db_sqlite(d), "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* ---- usage ------------------------------------------------------------------------ */

int db_usage_list(db *d, int64_t from_ms, int64_t to_ms, db_usage_row **rows, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *rows = NULL;
    *n = 0;
    if (prep(d,
             "SELECT job_id, token_name, tags, state, finished_ms, gpus, run_ms, cost, tokens"
             " FROM usage WHERE finished_ms >= ? AND finished_ms < ? ORDER BY finished_ms, job_id",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, from_ms);
    sqlite3_bind_int64(st, 2, to_ms);
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        db_usage_row *g = grow(*rows, *n, &cap, sizeof *g);
        if (!g) {
            sqlite3_finalize(st);
            db_usage_free(*rows, *n);
            *rows = NULL;
            *n = 0;
            return ty_err_set(err, TY_ENOMEM, "out of memory");
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
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        db_usage_free(*rows, *n);
        *rows = NULL;
        *n = 0;
        return ops_err(d, err, "list usage");
    }
    return 0;
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
    for (int pass = 0; pass < 2; pass++) {
        sqlite3_stmt *st;
        if (prep(d, "SELECT event_id FROM webhook_cursor WHERE one = 1", &st, err)) return TY_EIO;
        bool found = sqlite3_step(st) == SQLITE_ROW;
        *event_id = found ? sqlite3_column_int64(st, 0) : 0;
        sqlite3_finalize(st);
        if (found) return 0;
        if (exec(d,
                 "INSERT OR IGNORE INTO webhook_cursor(one, event_id)"
                 " SELECT 1, COALESCE(MAX(id), 0) FROM job_events",
                 err))
            return TY_EIO;
    }
    return 0;
}

int db_webhook_events(db *d, int64_t after_id, int limit, db_event **out, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *out = NULL;
    *n = 0;
    if (prep(d,
             "SELECT id, job_id, seq, ts_ms, type, data FROM job_events WHERE id > ? AND type IN"
             " ('state','budget','stall','idle_gpu') ORDER BY id LIMIT ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, after_id);
    sqlite3_bind_int(st, 2, limit);
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        db_event *g = grow(*out, *n, &cap, sizeof *g);
        if (!g) break;
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
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        db_events_free(*out, *n);
        *out = NULL;
        *n = 0;
        return rc == SQLITE_ROW ? ty_err_set(err, TY_ENOMEM, "out of memory")
                                : ops_err(d, err, "webhook events");
    }
    return 0;
}

int db_webhook_fanout(db *d, int64_t event_id, const char *const *urls, char *const *bodies, int n,
                      ty_err *err)
{
    sqlite3_stmt *st = NULL;
    if (exec(d, "BEGIN IMMEDIATE", err)) return TY_EIO;
    int rc = 0;
    int64_t now = ty_now_ms();
    for (int i = 0; i < n && !rc; i++) {
        rc = prep(d, "INSERT INTO webhook_outbox(event_id, url, body, created_ms) VALUES (?,?,?,?)",
                  &st, err);
        if (rc) break;
        sqlite3_bind_int64(st, 1, event_id);
        sqlite3_bind_text(st, 2, urls[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, bodies[i], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, now);
        if (sqlite3_step(st) != SQLITE_DONE) rc = ops_err(d, err, "queue webhook");
        sqlite3_finalize(st);
        st = NULL;
    }
    if (!rc && !(rc = prep(d, "UPDATE webhook_cursor SET event_id = ? WHERE one = 1", &st, err))) {
        sqlite3_bind_int64(st, 1, event_id);
        if (sqlite3_step(st) != SQLITE_DONE) rc = ops_err(d, err, "webhook cursor");
        sqlite3_finalize(st);
    }
    if (!rc) rc = exec(d, "COMMIT", err);
    if (rc) sqlite3_exec(db_sqlite(d), "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

int db_webhook_due(db *d, int64_t now_ms, int limit, db_webhook **out, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *out = NULL;
    *n = 0;
    if (prep(d,
             "SELECT id, event_id, url, body, attempts FROM webhook_outbox"
             " WHERE state = 'pending' AND next_ms <= ? ORDER BY id LIMIT ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, now_ms);
    sqlite3_bind_int(st, 2, limit);
    int cap = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        db_webhook *g = grow(*out, *n, &cap, sizeof *g);
        if (!g) break;
        *out = g;
        db_webhook *w = &g[(*n)++];
        w->id = sqlite3_column_int64(st, 0);
        w->event_id = sqlite3_column_int64(st, 1);
        w->url = col_str(st, 2);
        w->body = col_str(st, 3);
        w->attempts = sqlite3_column_int(st, 4);
    }
    sqlite3_finalize(st);
    return 0;
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
    sqlite3_stmt *st;
    if (prep(d,
             "UPDATE webhook_outbox SET state = ?, attempts = attempts + 1, next_ms = ?,"
             " last_error = ? WHERE id = ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, next_ms);
    if (error)
        sqlite3_bind_text(st, 3, error, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_int64(st, 4, id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : ops_err(d, err, "webhook result");
}

int db_webhook_count(db *d, const char *state, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d, "SELECT COUNT(*) FROM webhook_outbox WHERE state = ?", &st, err)) return TY_EIO;
    sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
    *n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    return 0;
}

/* ---- tokens ---------------------------------------------------------------------------- */

int db_token_name(db *d, int64_t id, char *out, size_t cap, ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d, "SELECT name FROM tokens WHERE id = ?", &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, id);
    int rc = 0;
    if (sqlite3_step(st) == SQLITE_ROW)
        snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    else
        rc = ty_err_set(err, TY_ENOENT, "no token %lld", (long long)id);
    sqlite3_finalize(st);
    return rc;
}
