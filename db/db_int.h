/* db_int.h — what db.c and db_ops.c share inside the db module: the
 * handle's layout and the SQL helpers (prepare, bind, read a column, grow
 * a result array, begin / end a write transaction, the "begin, read the
 * job's state" opening). Static inline so the module exports nothing new;
 * nothing outside db/ includes this file. */
#ifndef TY_DB_INT_H
#define TY_DB_INT_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "tyerr.h"

/* Statements of the hottest reads (GET /jobs/{id}), prepared once per
 * handle and reset after each use: preparing is most of such a read. A
 * handle belongs to one thread (server/state.c), so no lock is needed. */
#define DB_CACHED 4

struct db {
    sqlite3 *h;
    sqlite3_stmt *ins_event; /* prepared once: the hot path of event ingestion */
    sqlite3_stmt *max_seq;
    struct {
        const char *sql; /* a string literal: compared by address */
        sqlite3_stmt *st;
        bool busy; /* handed out and not yet given back */
    } cached[DB_CACHED];
};

/* The TY_E* code of the handle's last error. A full disk is TY_ENOSPC
 * (the API answers 503 and the scheduler retries) rather than a generic
 * I/O error, and so is a write to a handle opened read-only: the server
 * opens one only while the disk is full (db_open_mode). A full disk, or an
 * I/O error that may be one (SQLite cannot grow its -shm), is also
 * reported to the full-disk hook (db_set_full_hook). */
int db_errcode(db *d);

static inline int sql_err(db *d, ty_err *err, const char *what)
{
    int code = db_errcode(d);
    return ty_err_set(err, code, "database: %s: %s", what, sqlite3_errmsg(d->h));
}

static inline int exec_sql(db *d, const char *sql, ty_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(d->h, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int code = db_errcode(d);
        int rc = ty_err_set(err, code, "database: %s", msg ? msg : "exec failed");
        sqlite3_free(msg);
        return rc;
    }
    return 0;
}

static inline int prep(db *d, const char *sql, sqlite3_stmt **st, ty_err *err)
{
    if (sqlite3_prepare_v2(d->h, sql, -1, st, NULL) != SQLITE_OK) return sql_err(d, err, "prepare");
    return 0;
}

/* prep for a statement of the cache: the prepared one when it is free,
 * else (the cache full, or the statement already in use further up the
 * stack) a fresh one. Give it back with unprep, never sqlite3_finalize. */
static inline int prep_cached(db *d, const char *sql, sqlite3_stmt **st, ty_err *err)
{
    int slot = -1;
    for (int i = 0; i < DB_CACHED; i++) {
        if (d->cached[i].sql == sql && !d->cached[i].busy) {
            d->cached[i].busy = true;
            *st = d->cached[i].st;
            return 0;
        }
        if (!d->cached[i].sql && slot < 0) slot = i;
    }
    if (prep(d, sql, st, err)) return TY_EIO;
    if (slot >= 0) d->cached[slot].sql = sql, d->cached[slot].st = *st, d->cached[slot].busy = true;
    return 0;
}

static inline void unprep(db *d, sqlite3_stmt *st)
{
    for (int i = 0; i < DB_CACHED; i++)
        if (d->cached[i].st == st) {
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            d->cached[i].busy = false;
            return;
        }
    sqlite3_finalize(st);
}

static inline char *col_str(sqlite3_stmt *st, int i)
{
    const unsigned char *s = sqlite3_column_text(st, i);
    return s ? strdup((const char *)s) : NULL;
}

/* Makes room for row n of a result array that grows by doubling. Returns
 * the array (moved or not), or NULL when out of memory with the old array
 * left as it was, so the caller can free the rows it already read. */
static inline void *grow_rows(void *rows, int n, int *cap, size_t row_size)
{
    if (n < *cap) return rows;
    int ncap = *cap ? *cap * 2 : 16;
    void *g = realloc(rows, (size_t)ncap * row_size);
    if (g) *cap = ncap;
    return g;
}

static inline void bind_str(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

static inline int begin(db *d, ty_err *err)
{
    return exec_sql(d, "BEGIN IMMEDIATE", err);
}
static inline int commit(db *d, ty_err *err)
{
    return exec_sql(d, "COMMIT", err);
}
static inline void rollback(db *d)
{
    sqlite3_exec(d->h, "ROLLBACK", NULL, NULL, NULL);
}

/* The one way a write transaction ends: committed when rc is 0; rolled back
 * when rc is not, or when the commit fails (then rc is TY_EIO), with the
 * event it would have published cleared. Every function that begins a
 * transaction returns through here, so none can leave one open. */
static inline int end_tx(db *d, int rc, db_event *ev, ty_err *err)
{
    if (rc == 0 && commit(d, err)) rc = TY_EIO;
    if (rc) {
        rollback(d);
        if (ev) db_event_clear(ev);
    }
    return rc;
}

/* The opening of a transaction that checks a job's state before changing
 * it: BEGIN IMMEDIATE (so the state cannot change under us), then the
 * job's state into *state (-1 when the name is unknown). TY_ENOENT "no job
 * N" when there is none; on any failure the transaction is already over. */
static inline int begin_job_state(db *d, int64_t id, int *state, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    if (begin(d, err)) return TY_EIO;
    int rc = prep(d, "SELECT state FROM jobs WHERE id = ?", &st, err) ? TY_EIO : 0;
    if (!rc) {
        sqlite3_bind_int64(st, 1, id);
        if (sqlite3_step(st) == SQLITE_ROW)
            *state = db_state_parse((const char *)sqlite3_column_text(st, 0));
        else
            rc = ty_err_set(err, TY_ENOENT, "no job %lld", (long long)id);
    }
    sqlite3_finalize(st);
    if (rc) rollback(d);
    return rc;
}

#endif
