/* db.c — SQLite schema, migrations and every query trainyard runs.
 *
 * Migrations are numbered; PRAGMA user_version records how many have run, so
 * an old database is brought forward step by step on open, each step in its
 * own transaction. Job transitions and event appends are single transactions
 * (BEGIN IMMEDIATE, so two writers never deadlock on a lock upgrade). Every
 * function that begins one ends it through end_tx (commit, or roll back and
 * clear the event), and those that check a job's state first open with
 * begin_job_state. */
#include "db.h"

#include <fcntl.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db_int.h"
#include "tyutil.h"
#include "tyjson.h"

/* ---- states ---------------------------------------------------------------- */

static const char *const state_names[JOB_NSTATES] = {
    "queued", "starting", "running", "stopping", "paused", "succeeded", "failed", "cancelled",
};

const char *db_state_name(job_state s)
{
    return (unsigned)s < JOB_NSTATES ? state_names[s] : "unknown";
}

int db_state_parse(const char *name)
{
    for (int i = 0; i < JOB_NSTATES; i++)
        if (name && strcmp(name, state_names[i]) == 0) return i;
    return -1;
}

bool db_state_terminal(job_state s)
{
    return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED;
}

/* Legal moves, one mask of destinations per source state (DESIGN §2):
 * queued    → starting (scheduled), paused (held), cancelled
 * starting  → running, stopping (cancel/pause), queued (died, restart), failed
 * running   → succeeded, failed, stopping, queued (died or server restart)
 * stopping  → paused, cancelled, succeeded (finished first), failed, queued
 * paused    → queued (resume), cancelled
 * terminal states go nowhere. */
static const unsigned legal_to[JOB_NSTATES] = {
    [JOB_QUEUED] = JOB_BIT(JOB_STARTING) | JOB_BIT(JOB_PAUSED) | JOB_BIT(JOB_CANCELLED),
    [JOB_STARTING] =
        JOB_BIT(JOB_RUNNING) | JOB_BIT(JOB_STOPPING) | JOB_BIT(JOB_QUEUED) | JOB_BIT(JOB_FAILED),
    [JOB_RUNNING] =
        JOB_BIT(JOB_SUCCEEDED) | JOB_BIT(JOB_FAILED) | JOB_BIT(JOB_STOPPING) | JOB_BIT(JOB_QUEUED),
    [JOB_STOPPING] = JOB_BIT(JOB_PAUSED) | JOB_BIT(JOB_CANCELLED) | JOB_BIT(JOB_SUCCEEDED) |
                     JOB_BIT(JOB_FAILED) | JOB_BIT(JOB_QUEUED),
    [JOB_PAUSED] = JOB_BIT(JOB_QUEUED) | JOB_BIT(JOB_CANCELLED),
};

bool db_transition_legal(job_state from, job_state to)
{
    if ((unsigned)from >= JOB_NSTATES || (unsigned)to >= JOB_NSTATES) return false;
    return (legal_to[from] & JOB_BIT(to)) != 0;
}

/* ---- migrations ---------------------------------------------------------------- */

/* migrations[i] takes a database from user_version i to i+1. Never edit a
 * released entry: append a new one. */
static const char *const migrations[DB_SCHEMA_VERSION] = {
    /* 1: the core tables. Times are integer milliseconds since the epoch. */
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  name TEXT,"
    "  state TEXT NOT NULL,"
    "  spec TEXT NOT NULL,"
    "  priority INTEGER NOT NULL DEFAULT 0,"
    "  gpus_wanted INTEGER NOT NULL DEFAULT 0,"
    "  max_steps INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  started_ms INTEGER, finished_ms INTEGER, updated_ms INTEGER NOT NULL,"
    "  restarts INTEGER NOT NULL DEFAULT 0,"
    "  max_restarts INTEGER NOT NULL DEFAULT 3,"
    "  resume_from TEXT, error TEXT, backend TEXT, gpus TEXT NOT NULL DEFAULT '',"
    "  last_metric TEXT, last_eval TEXT, engine TEXT,"
    "  metric0_ms INTEGER, metric0_step INTEGER, metric_last_ms INTEGER,"
    "  pgid INTEGER NOT NULL DEFAULT 0,"
    "  stop_intent TEXT);"
    "CREATE INDEX jobs_sched ON jobs(state, priority DESC, id);"
    "CREATE TABLE job_events ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  job_id INTEGER REFERENCES jobs(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  type TEXT NOT NULL,"
    "  data TEXT NOT NULL,"
    "  ts_ms INTEGER NOT NULL,"
    "  UNIQUE(job_id, seq));"
    "CREATE TABLE checkpoints ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  step INTEGER NOT NULL, dir TEXT NOT NULL, bytes INTEGER NOT NULL DEFAULT 0,"
    "  sha256 TEXT, local_path TEXT, remote_uri TEXT,"
    "  state TEXT NOT NULL DEFAULT 'local'"
    "    CHECK (state IN ('local','uploading','committed','failed','deleted')),"
    "  error TEXT, attempts INTEGER NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  UNIQUE(job_id, step));"
    "CREATE TABLE tokens ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  name TEXT NOT NULL UNIQUE,"
    "  sha256 TEXT NOT NULL UNIQUE,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE TABLE idempotency_keys ("
    "  key TEXT PRIMARY KEY,"
    "  body_sha256 TEXT NOT NULL,"
    "  job_id INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL);",
    /* 2: the durable upload queue the object-store uploader works from, and
     * an index for the global event feed's type filter. */
    "CREATE TABLE uploads ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,"
    "  file TEXT NOT NULL,"
    "  uri TEXT NOT NULL,"
    "  state TEXT NOT NULL DEFAULT 'pending'"
    "    CHECK (state IN ('pending','running','done','failed')),"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  next_attempt_ms INTEGER NOT NULL DEFAULT 0,"
    "  error TEXT);"
    "CREATE INDEX uploads_due ON uploads(state, next_attempt_ms);"
    "CREATE INDEX job_events_type ON job_events(type, id);",
    /* 3: the queue carries remote deletes (retention) beside uploads. */
    "ALTER TABLE uploads ADD COLUMN op TEXT NOT NULL DEFAULT 'put'"
    "  CHECK (op IN ('put','delete'));",
    /* 4: running time for cost: run_ms sums the finished runs (engine
     * alive: starting, running, stopping), run_since_ms is when the current
     * run began (NULL while not running), so paused time never counts. Rows
     * from before keep what can be known: a live job's run began when it
     * started, a finished one ran from started to finished. */
    "ALTER TABLE jobs ADD COLUMN run_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN run_since_ms INTEGER;"
    "UPDATE jobs SET run_since_ms = started_ms"
    "  WHERE state IN ('starting','running','stopping') AND started_ms IS NOT NULL;"
    "UPDATE jobs SET run_ms = MAX(0, finished_ms - started_ms)"
    "  WHERE state IN ('succeeded','failed','cancelled')"
    "  AND started_ms IS NOT NULL AND finished_ms IS NOT NULL;",
    /* 5: token scopes (read, submit, admin; comma-separated). Tokens made
     * before scopes existed keep every right. */
    "ALTER TABLE tokens ADD COLUMN scopes TEXT NOT NULL DEFAULT 'read,submit,admin';",
    /* 6: checkpoint_error: the newest upload of the job's checkpoints or
     * export to its store that failed for good (NULL while none did). */
    "ALTER TABLE jobs ADD COLUMN checkpoint_error TEXT;",
    /* 7: operations: tags (a JSON array), why a job stopped
     * early (stop_reason: budget, stall), who submitted it (token_name) and
     * the hourly price it runs at (hour_price, per GPU or per CPU slot, set
     * at each start); a usage ledger written in the final transition (kept
     * when the job is deleted, so totals never go down); the webhook outbox
     * and the id of the last event fanned out into it. */
    "ALTER TABLE jobs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';"
    "ALTER TABLE jobs ADD COLUMN stop_reason TEXT;"
    "ALTER TABLE jobs ADD COLUMN token_name TEXT;"
    "ALTER TABLE jobs ADD COLUMN hour_price REAL;"
    "CREATE TABLE usage ("
    "  job_id INTEGER PRIMARY KEY, name TEXT, token_name TEXT, tags TEXT NOT NULL,"
    "  state TEXT NOT NULL, finished_ms INTEGER NOT NULL, gpus INTEGER NOT NULL,"
    "  run_ms INTEGER NOT NULL, cost REAL, tokens INTEGER NOT NULL);"
    "CREATE INDEX usage_finished ON usage(finished_ms);"
    "CREATE TABLE webhook_outbox ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL, url TEXT NOT NULL,"
    "  body TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending'"
    "    CHECK (state IN ('pending','delivered','failed')),"
    "  attempts INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL DEFAULT 0,"
    "  last_error TEXT, created_ms INTEGER NOT NULL);"
    "CREATE INDEX webhook_due ON webhook_outbox(state, next_ms);"
    "CREATE TABLE webhook_cursor (one INTEGER PRIMARY KEY CHECK (one = 1),"
    "  event_id INTEGER NOT NULL);",
};

int db_user_version(db *d)
{
    sqlite3_stmt *st;
    int v = -1;
    if (sqlite3_prepare_v2(d->h, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int migrate(db *d, int target, ty_err *err)
{
    int v = db_user_version(d);
    if (v < 0) return sql_err(d, err, "read user_version");
    if (v > DB_SCHEMA_VERSION)
        return ty_err_set(err, TY_EINVAL,
                          "database schema version %d is newer than this build (%d)", v,
                          DB_SCHEMA_VERSION);
    int rc = 0;
    for (; v < target && !rc; v++) {
        char pragma[64];
        if (begin(d, err)) return TY_EIO;
        snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", v + 1);
        rc = exec_sql(d, migrations[v], err) || exec_sql(d, pragma, err) ? TY_EIO : 0;
        rc = end_tx(d, rc, NULL, err);
    }
    return rc;
}

int db_open_at_version(const char *path, int version, db **out, ty_err *err)
{
    *out = NULL;
    if (version < 0 || version > DB_SCHEMA_VERSION)
        return ty_err_set(err, TY_EINVAL, "no schema version %d", version);
    /* The database holds token hashes and every spec: the owner's alone.
     * Created 0600 before SQLite opens it (its -wal and -shm copy the
     * mode), and files made by an older version are tightened. Never by
     * opening and closing an existing file: closing any descriptor of a
     * file drops every POSIX lock this process holds on it, the locks other
     * connections of ours rely on. O_EXCL opens only a file nobody uses yet;
     * chmod works by name. */
    if (path[0] && strcmp(path, ":memory:")) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
        static const char *const sfx[] = {"", "-wal", "-shm"};
        for (int i = 0; i < 3; i++) {
            char p[4200];
            struct stat st;
            snprintf(p, sizeof p, "%s%s", path, sfx[i]);
            if (stat(p, &st) == 0 && (st.st_mode & 077)) chmod(p, st.st_mode & 0700);
        }
    }
    db *d = calloc(1, sizeof *d);
    if (!d) return ty_err_set(err, TY_ENOMEM, "out of memory");
    if (sqlite3_open_v2(path, &d->h,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        int rc = ty_err_set(err, TY_EIO, "open %s: %s", path,
                            d->h ? sqlite3_errmsg(d->h) : "out of memory");
        sqlite3_close(d->h);
        free(d);
        return rc;
    }
    /* busy_timeout: the writer thread, HTTP threads and the CLI share the
     * file; waiting a few seconds for a lock beats failing a request. */
    sqlite3_busy_timeout(d->h, 5000);
    if (exec_sql(d,
                 "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                 "PRAGMA foreign_keys=ON;",
                 err) ||
        migrate(d, version, err)) {
        sqlite3_close(d->h);
        free(d);
        return err ? err->code : TY_EIO;
    }
    *out = d;
    return 0;
}

int db_open(const char *path, db **out, ty_err *err)
{
    return db_open_at_version(path, DB_SCHEMA_VERSION, out, err);
}

/* ---- a full disk ---------------------------------------------------------------- */

static void (*full_hook)(void *ctx, bool full);
static void *full_ctx;

void db_set_full_hook(void (*fn)(void *ctx, bool full), void *ctx)
{
    full_ctx = ctx;
    full_hook = fn;
}

int db_errcode(db *d)
{
    int prim = sqlite3_extended_errcode(d->h) & 0xff;
    if ((prim == SQLITE_FULL || prim == SQLITE_IOERR) && full_hook)
        full_hook(full_ctx, prim == SQLITE_FULL);
    return prim == SQLITE_FULL || prim == SQLITE_READONLY ? TY_ENOSPC : TY_EIO;
}

/* "file:" URI of a path: the characters a URI gives meaning to escaped. */
static void file_uri(const char *path, const char *query, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "file:");
    for (const char *p = path; *p && o + 4 < cap; p++) {
        if (*p == '?' || *p == '#' || *p == '%')
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", (unsigned char)*p);
        else
            out[o++] = *p;
    }
    snprintf(out + o, cap - o, "?%s", query);
}

int db_open_mode(const char *path, db_mode mode, db **out, ty_err *err)
{
    if (mode == DB_RW) return db_open(path, out, err);
    *out = NULL;
    char uri[8400];
    file_uri(path, mode == DB_RO ? "mode=ro" : "immutable=1", uri, sizeof uri);
    db *d = calloc(1, sizeof *d);
    if (!d) return ty_err_set(err, TY_ENOMEM, "out of memory");
    int rc = 0;
    if (sqlite3_open_v2(uri, &d->h, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK)
        rc = ty_err_set(err, TY_EIO, "open %s read-only: %s", path,
                        d->h ? sqlite3_errmsg(d->h) : "out of memory");
    if (!rc) {
        sqlite3_busy_timeout(d->h, 5000);
        int v = db_user_version(d);
        if (v != DB_SCHEMA_VERSION)
            rc = v < 0 ? sql_err(d, err, "open read-only")
                       : ty_err_set(err, TY_EINVAL,
                                    "database schema version %d needs version %d, which cannot "
                                    "be written read-only",
                                    v, DB_SCHEMA_VERSION);
    }
    if (rc) {
        sqlite3_close(d->h);
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void db_close(db *d)
{
    if (!d) return;
    sqlite3_finalize(d->ins_event);
    sqlite3_finalize(d->max_seq);
    for (int i = 0; i < DB_CACHED; i++)
        sqlite3_finalize(d->cached[i].st);
    sqlite3_close(d->h);
    free(d);
}

/* ---- events (shared by transitions and appends) ---------------------------------- */

void db_event_clear(db_event *e)
{
    if (!e) return;
    free(e->data);
    memset(e, 0, sizeof *e);
}

void db_events_free(db_event *evs, int n)
{
    for (int i = 0; i < n; i++)
        free(evs[i].data);
    free(evs);
}

/* The next per-job sequence number: max+1 through the UNIQUE(job_id, seq)
 * index, one B-tree probe (`=`, so the index is used). No job: seq 1. */
static int next_seq(db *d, int64_t job_id, int64_t *seq, ty_err *err)
{
    *seq = 1;
    if (job_id <= 0) return 0;
    if (!d->max_seq && prep(d, "SELECT COALESCE(MAX(seq), 0) + 1 FROM job_events WHERE job_id = ?",
                            &d->max_seq, err))
        return TY_EIO;
    sqlite3_reset(d->max_seq);
    sqlite3_bind_int64(d->max_seq, 1, job_id);
    if (sqlite3_step(d->max_seq) != SQLITE_ROW) {
        sqlite3_reset(d->max_seq);
        return sql_err(d, err, "next event seq");
    }
    *seq = sqlite3_column_int64(d->max_seq, 0);
    sqlite3_reset(d->max_seq);
    return 0;
}

/* Inserts one event with a known seq inside the caller's transaction. */
static int insert_event_seq(db *d, int64_t job_id, int64_t seq, int64_t ts, const char *type,
                            const char *data, db_event *out, ty_err *err)
{
    if (!d->ins_event &&
        prep(d, "INSERT INTO job_events(job_id, seq, type, data, ts_ms) VALUES (?,?,?,?,?)",
             &d->ins_event, err))
        return TY_EIO;
    sqlite3_stmt *st = d->ins_event;
    sqlite3_reset(st);
    if (job_id > 0)
        sqlite3_bind_int64(st, 1, job_id);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_int64(st, 2, seq);
    sqlite3_bind_text(st, 3, type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, data, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, ts);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return sql_err(d, err, "insert event");
    if (out) {
        memset(out, 0, sizeof *out);
        out->id = sqlite3_last_insert_rowid(d->h);
        out->seq = seq;
        out->job_id = job_id;
        out->ts_ms = ts;
        snprintf(out->type, sizeof out->type, "%s", type);
        out->data = strdup(data);
    }
    return 0;
}

static int insert_event(db *d, int64_t job_id, int64_t ts, const char *type, const char *data,
                        db_event *out, ty_err *err)
{
    int64_t seq;
    if (next_seq(d, job_id, &seq, err)) return TY_EIO;
    return insert_event_seq(d, job_id, seq, ts, type, data, out, err);
}

/* ---- jobs ---------------------------------------------------------------------- */

#define JOB_COLS                                                                                   \
    "id, name, state, spec, priority, gpus_wanted, max_steps, created_ms, "                        \
    "started_ms, finished_ms, updated_ms, restarts, max_restarts, resume_from, "                   \
    "error, backend, gpus, last_metric, last_eval, engine, metric0_ms, "                           \
    "metric0_step, metric_last_ms, pgid, stop_intent, run_ms, run_since_ms, "                      \
    "checkpoint_error, tags, stop_reason, token_name, hour_price"

static void read_job(sqlite3_stmt *st, db_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    j->name = col_str(st, 1);
    int s = db_state_parse((const char *)sqlite3_column_text(st, 2));
    j->state = s < 0 ? JOB_FAILED : (job_state)s;
    j->spec = col_str(st, 3);
    j->priority = sqlite3_column_int(st, 4);
    j->gpus_wanted = sqlite3_column_int(st, 5);
    j->max_steps = sqlite3_column_int64(st, 6);
    j->created_ms = sqlite3_column_int64(st, 7);
    j->started_ms = sqlite3_column_int64(st, 8);
    j->finished_ms = sqlite3_column_int64(st, 9);
    j->updated_ms = sqlite3_column_int64(st, 10);
    j->restarts = sqlite3_column_int(st, 11);
    j->max_restarts = sqlite3_column_int(st, 12);
    j->resume_from = col_str(st, 13);
    j->error = col_str(st, 14);
    j->backend = col_str(st, 15);
    j->gpus = col_str(st, 16);
    j->last_metric = col_str(st, 17);
    j->last_eval = col_str(st, 18);
    j->engine = col_str(st, 19);
    j->metric0_ms = sqlite3_column_int64(st, 20);
    j->metric0_step = sqlite3_column_int64(st, 21);
    j->metric_last_ms = sqlite3_column_int64(st, 22);
    j->pgid = sqlite3_column_int64(st, 23);
    j->stop_intent = col_str(st, 24);
    j->run_ms = sqlite3_column_int64(st, 25);
    j->run_since_ms = sqlite3_column_int64(st, 26);
    j->checkpoint_error = col_str(st, 27);
    j->tags = col_str(st, 28);
    j->stop_reason = col_str(st, 29);
    j->token_name = col_str(st, 30);
    j->hour_price = sqlite3_column_type(st, 31) == SQLITE_NULL ? -1 : sqlite3_column_double(st, 31);
}

void db_job_free(db_job *j)
{
    if (!j) return;
    free(j->name);
    free(j->spec);
    free(j->resume_from);
    free(j->error);
    free(j->backend);
    free(j->gpus);
    free(j->last_metric);
    free(j->last_eval);
    free(j->engine);
    free(j->stop_intent);
    free(j->checkpoint_error);
    free(j->tags);
    free(j->stop_reason);
    free(j->token_name);
    memset(j, 0, sizeof *j);
}

void db_jobs_free(db_job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        db_job_free(&jobs[i]);
    free(jobs);
}

static char *state_event_json(job_state from, job_state to, const char *reason)
{
    json_t *o = json_object();
    if (from == (job_state)-1)
        json_object_set_new(o, "from", json_null());
    else
        json_object_set_new(o, "from", json_string(db_state_name(from)));
    json_object_set_new(o, "to", json_string(db_state_name(to)));
    json_object_set_new(o, "reason", reason ? json_string(reason) : json_null());
    char *s = ty_json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

int db_job_insert(db *d, const db_new_job *nj, int64_t *id, bool *existing, db_event *ev,
                  ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *existing = false;
    if (ev) memset(ev, 0, sizeof *ev);
    if (begin(d, err)) return TY_EIO;
    int rc = 0;
    char *data = NULL;
    if (nj->idem_key) {
        if (prep(d, "SELECT body_sha256, job_id FROM idempotency_keys WHERE key = ?", &st, err))
            goto fail;
        sqlite3_bind_text(st, 1, nj->idem_key, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW) {
            /* A retry: the job it made, and nothing written. */
            bool same = strcmp((const char *)sqlite3_column_text(st, 0), nj->body_sha256) == 0;
            *id = sqlite3_column_int64(st, 1);
            if (same)
                *existing = true;
            else
                rc = ty_err_field(err, TY_ESTATE, "Idempotency-Key",
                                  "this Idempotency-Key was used with a different body");
            goto out;
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    int64_t now = ty_now_ms();
    if (prep(d,
             "INSERT INTO jobs(name, state, spec, priority, gpus_wanted, max_steps,"
             " created_ms, updated_ms, max_restarts) VALUES (?,?,?,?,?,?,?,?,?)",
             &st, err))
        goto fail;
    bind_str(st, 1, nj->name);
    sqlite3_bind_text(st, 2, "queued", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, nj->spec, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, nj->priority);
    sqlite3_bind_int(st, 5, nj->gpus_wanted);
    sqlite3_bind_int64(st, 6, nj->max_steps);
    sqlite3_bind_int64(st, 7, now);
    sqlite3_bind_int64(st, 8, now);
    sqlite3_bind_int(st, 9, nj->max_restarts);
    if (sqlite3_step(st) != SQLITE_DONE) {
        sql_err(d, err, "insert job");
        goto fail;
    }
    sqlite3_finalize(st);
    st = NULL;
    *id = sqlite3_last_insert_rowid(d->h);
    /* Tags and the submitting token (schema 7), written only when given. */
    if (nj->tags || nj->token_name) {
        if (prep(d, "UPDATE jobs SET tags = COALESCE(?, tags), token_name = ? WHERE id = ?", &st,
                 err))
            goto fail;
        bind_str(st, 1, nj->tags);
        bind_str(st, 2, nj->token_name);
        sqlite3_bind_int64(st, 3, *id);
        if (sqlite3_step(st) != SQLITE_DONE) {
            sql_err(d, err, "tag job");
            goto fail;
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    if (nj->idem_key) {
        if (prep(d,
                 "INSERT INTO idempotency_keys(key, body_sha256, job_id, created_ms)"
                 " VALUES (?,?,?,?)",
                 &st, err))
            goto fail;
        sqlite3_bind_text(st, 1, nj->idem_key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, nj->body_sha256, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, *id);
        sqlite3_bind_int64(st, 4, now);
        if (sqlite3_step(st) != SQLITE_DONE) {
            sql_err(d, err, "insert idempotency key");
            goto fail;
        }
    }
    data = state_event_json((job_state)-1, JOB_QUEUED, "submitted");
    if (insert_event(d, *id, now, "state", data, ev, err)) goto fail;
    goto out;
fail:
    rc = err && err->code ? err->code : TY_EIO;
out:
    sqlite3_finalize(st);
    free(data);
    rc = end_tx(d, rc, ev, err);
    return rc && err && err->code ? err->code : rc;
}

int db_job_max_id(db *d, int64_t *out, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    *out = 0;
    if (prep(d, "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", &st, err)) return TY_EIO;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sql_err(d, err, "max job id");
    sqlite3_finalize(st);
    return rc;
}

int db_job_get(db *d, int64_t id, db_job *out, ty_err *err)
{
    sqlite3_stmt *st;
    memset(out, 0, sizeof *out);
    static const char sql[] = "SELECT " JOB_COLS " FROM jobs WHERE id = ?";
    if (prep_cached(d, sql, &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_job(st, out);
        unprep(d, st);
        return 0;
    }
    unprep(d, st);
    if (rc == SQLITE_DONE) return ty_err_set(err, TY_ENOENT, "no job %lld", (long long)id);
    return sql_err(d, err, "get job");
}

/* Builds "state IN ('a','b')" from a mask; names are our own constants. */
static void state_in_clause(unsigned mask, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "state IN (");
    bool first = true;
    for (int i = 0; i < JOB_NSTATES; i++) {
        if (!(mask & JOB_BIT(i))) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s'%s'", first ? "" : ",", state_names[i]);
        first = false;
    }
    snprintf(buf + n, cap - n, ")");
}

int db_job_list(db *d, unsigned state_mask, int64_t before_id, int limit, db_job **out, int *n,
                ty_err *err)
{
    return db_job_list_tag(d, state_mask, NULL, before_id, limit, out, n, err);
}

int db_job_list_tag(db *d, unsigned state_mask, const char *tag, int64_t before_id, int limit,
                    db_job **out, int *n, ty_err *err)
{
    char sql[768], where[200] = "1";
    if (state_mask) state_in_clause(state_mask, where, sizeof where);
    snprintf(sql, sizeof sql,
             "SELECT " JOB_COLS " FROM jobs WHERE %s AND id < ?1 AND (?3 IS NULL OR EXISTS"
             " (SELECT 1 FROM json_each(jobs.tags) WHERE json_each.value = ?3))"
             " ORDER BY id DESC LIMIT ?2",
             where);
    sqlite3_stmt *st;
    *out = NULL;
    *n = 0;
    if (prep(d, sql, &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, before_id > 0 ? before_id : INT64_MAX);
    sqlite3_bind_int(st, 2, limit);
    bind_str(st, 3, tag);
    db_job *arr = calloc((size_t)(limit > 0 ? limit : 1), sizeof *arr);
    if (!arr) {
        sqlite3_finalize(st);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    int rc, k = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && k < limit)
        read_job(st, &arr[k++]);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        db_jobs_free(arr, k);
        return sql_err(d, err, "list jobs");
    }
    *out = arr;
    *n = k;
    return 0;
}

int db_job_queue_position(db *d, int64_t id, ty_err *err)
{
    sqlite3_stmt *st;
    static const char *sql =
        "SELECT COUNT(*) + 1 FROM jobs q, jobs me WHERE me.id = ?1 AND me.state = 'queued'"
        " AND q.state = 'queued' AND (q.priority > me.priority OR"
        " (q.priority = me.priority AND q.id < me.id))";
    if (prep(d, "SELECT state FROM jobs WHERE id = ?", &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, id);
    bool queued = sqlite3_step(st) == SQLITE_ROW &&
                  strcmp((const char *)sqlite3_column_text(st, 0), "queued") == 0;
    sqlite3_finalize(st);
    if (!queued) return 0;
    if (prep(d, sql, &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, id);
    int pos = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    return pos;
}

static int id_query(db *d, const char *sql, int64_t **ids, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *ids = NULL;
    *n = 0;
    if (prep(d, sql, &st, err)) return TY_EIO;
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t *g = grow_rows(*ids, *n, &cap, sizeof *g);
        if (!g) {
            sqlite3_finalize(st);
            free(*ids);
            *ids = NULL;
            *n = 0;
            return ty_err_set(err, TY_ENOMEM, "out of memory");
        }
        *ids = g;
        (*ids)[(*n)++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        free(*ids);
        *ids = NULL;
        *n = 0;
        return sql_err(d, err, "query ids");
    }
    return 0;
}

int db_job_queued_ids(db *d, int64_t **ids, int *n, ty_err *err)
{
    return id_query(d, "SELECT id FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id", ids,
                    n, err);
}

int db_job_ids_in(db *d, unsigned state_mask, int64_t **ids, int *n, ty_err *err)
{
    char where[200], sql[300];
    state_in_clause(state_mask, where, sizeof where);
    snprintf(sql, sizeof sql, "SELECT id FROM jobs WHERE %s ORDER BY id", where);
    return id_query(d, sql, ids, n, err);
}

int db_job_counts(db *d, int64_t counts[JOB_NSTATES], ty_err *err)
{
    sqlite3_stmt *st;
    memset(counts, 0, sizeof(int64_t) * JOB_NSTATES);
    if (prep(d, "SELECT state, COUNT(*) FROM jobs GROUP BY state", &st, err)) return TY_EIO;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int s = db_state_parse((const char *)sqlite3_column_text(st, 0));
        if (s >= 0) counts[s] = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    return 0;
}

int db_job_delete(db *d, int64_t id, ty_err *err)
{
    int s = -1, rc = begin_job_state(d, id, &s, err);
    if (rc) return rc;
    if (s < 0 || !db_state_terminal((job_state)s)) {
        rc = ty_err_set(err, TY_ESTATE, "job %lld is %s; only finished jobs can be deleted",
                        (long long)id, db_state_name((job_state)s));
        goto out;
    }
    sqlite3_stmt *st;
    if (prep(d, "DELETE FROM jobs WHERE id = ?", &st, err)) {
        rc = TY_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_DONE) rc = (sql_err(d, err, "delete job"), TY_EIO);
    sqlite3_finalize(st);
    if (rc) goto out;
    /* Forget idempotency keys pointing at it, so a retry creates a new job. */
    if (prep(d, "DELETE FROM idempotency_keys WHERE job_id = ?", &st, err)) {
        rc = TY_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    sqlite3_step(st);
    sqlite3_finalize(st);
out:
    return end_tx(d, rc, NULL, err);
}

/* Appends "col = ?" pieces for the fields set in upd; binds them in order. */
static int update_job_fields(db *d, int64_t id, const char *state, const db_job_update *upd,
                             int64_t now, ty_err *err)
{
    char sql[1024];
    size_t n = (size_t)snprintf(sql, sizeof sql, "UPDATE jobs SET updated_ms = ?");
#define ADD(flag, col)                                                                             \
    if (upd && upd->flag) n += (size_t)snprintf(sql + n, sizeof sql - n, ", " col " = ?")
    if (state) n += (size_t)snprintf(sql + n, sizeof sql - n, ", state = ?");
    ADD(has_error, "error");
    ADD(has_resume_from, "resume_from");
    ADD(has_restarts, "restarts");
    ADD(has_backend, "backend");
    ADD(has_gpus, "gpus");
    ADD(has_pgid, "pgid");
    ADD(has_stop_intent, "stop_intent");
    ADD(has_checkpoint_error, "checkpoint_error");
    ADD(has_stop_reason, "stop_reason");
    ADD(has_hour_price, "hour_price");
    /* The first start's time is kept: a resume or a restart is not a new
     * start of the job (only the ETA's metric timing restarts). */
    if (upd && upd->set_started)
        n += (size_t)snprintf(sql + n, sizeof sql - n, ", started_ms = COALESCE(started_ms, ?)");
    ADD(set_finished, "finished_ms");
#undef ADD
    if (upd && upd->set_started)
        n += (size_t)snprintf(sql + n, sizeof sql - n,
                              ", metric0_ms = NULL, metric0_step = NULL, metric_last_ms = NULL");
    snprintf(sql + n, sizeof sql - n, " WHERE id = ?");
    sqlite3_stmt *st;
    if (prep(d, sql, &st, err)) return TY_EIO;
    int i = 1;
    sqlite3_bind_int64(st, i++, now);
    if (state) sqlite3_bind_text(st, i++, state, -1, SQLITE_STATIC);
    if (upd) {
        if (upd->has_error) bind_str(st, i++, upd->error);
        if (upd->has_resume_from) bind_str(st, i++, upd->resume_from);
        if (upd->has_restarts) sqlite3_bind_int(st, i++, upd->restarts);
        if (upd->has_backend) bind_str(st, i++, upd->backend);
        if (upd->has_gpus) bind_str(st, i++, upd->gpus ? upd->gpus : "");
        if (upd->has_pgid) sqlite3_bind_int64(st, i++, upd->pgid);
        if (upd->has_stop_intent) bind_str(st, i++, upd->stop_intent);
        if (upd->has_checkpoint_error) bind_str(st, i++, upd->checkpoint_error);
        if (upd->has_stop_reason) bind_str(st, i++, upd->stop_reason);
        if (upd->has_hour_price) {
            if (upd->hour_price < 0)
                sqlite3_bind_null(st, i++);
            else
                sqlite3_bind_double(st, i++, upd->hour_price);
        }
        if (upd->set_started) sqlite3_bind_int64(st, i++, now);
        if (upd->set_finished) sqlite3_bind_int64(st, i++, now);
    }
    sqlite3_bind_int64(st, i, id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sql_err(d, err, "update job");
    return 0;
}

/* States in which the engine's processes are alive and hold their slots:
 * the time spent in them is what a job's cost is charged for. */
static bool state_runs(job_state s)
{
    return s == JOB_STARTING || s == JOB_RUNNING || s == JOB_STOPPING;
}

/* Opens a run on entering a running state and folds it into run_ms on
 * leaving, inside the transition's transaction. */
static int account_run_time(db *d, int64_t id, job_state from, job_state to, int64_t now,
                            ty_err *err)
{
    const char *sql;
    if (!state_runs(from) && state_runs(to))
        sql = "UPDATE jobs SET run_since_ms = ?1 WHERE id = ?2";
    else if (state_runs(from) && !state_runs(to))
        sql = "UPDATE jobs SET run_ms = run_ms + MAX(0, ?1 - COALESCE(run_since_ms, ?1)),"
              " run_since_ms = NULL WHERE id = ?2";
    else
        return 0;
    sqlite3_stmt *st;
    if (prep(d, sql, &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : sql_err(d, err, "account run time");
}

/* The usage ledger's row of a job that just ended (GET /usage):
 * in the final transition's transaction, after its running time is
 * folded in, so the ledger and the job never disagree. */
static int record_usage(db *d, int64_t id, ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d,
             "INSERT OR REPLACE INTO usage(job_id, name, token_name, tags, state, finished_ms,"
             " gpus, run_ms, cost, tokens) SELECT id, name, token_name, tags, state,"
             " COALESCE(finished_ms, updated_ms), gpus_wanted, run_ms,"
             " run_ms / 3600000.0 * hour_price * MAX(gpus_wanted, 1),"
             " COALESCE(CAST(json_extract(last_metric, '$.tokens') AS INTEGER), 0)"
             " FROM jobs WHERE id = ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : sql_err(d, err, "record usage");
}

int64_t db_job_run_ms(const db_job *j, int64_t now_ms)
{
    int64_t ms = j->run_ms;
    if (j->run_since_ms > 0 && now_ms > j->run_since_ms) ms += now_ms - j->run_since_ms;
    return ms;
}

int db_job_transition(db *d, int64_t id, unsigned from_mask, job_state to, const char *reason,
                      const db_job_update *upd, job_state *from_out, db_event *ev, ty_err *err)
{
    if (ev) memset(ev, 0, sizeof *ev);
    int from = -1, rc = begin_job_state(d, id, &from, err);
    if (rc) return rc;
    if (from_out) *from_out = (job_state)from;
    if (from < 0 || !(from_mask & JOB_BIT(from)) || !db_transition_legal((job_state)from, to)) {
        rc = ty_err_set(err, TY_ESTATE, "job %lld is %s; it cannot become %s", (long long)id,
                        db_state_name((job_state)from), db_state_name(to));
    } else {
        int64_t now = ty_now_ms();
        char *data = state_event_json((job_state)from, to, reason);
        if (update_job_fields(d, id, db_state_name(to), upd, now, err) ||
            account_run_time(d, id, (job_state)from, to, now, err) ||
            (db_state_terminal(to) && record_usage(d, id, err)) ||
            insert_event(d, id, now, "state", data, ev, err))
            rc = TY_EIO;
        free(data);
    }
    return end_tx(d, rc, ev, err);
}

int db_job_update_fields(db *d, int64_t id, const db_job_update *upd, ty_err *err)
{
    return update_job_fields(d, id, NULL, upd, ty_now_ms(), err);
}

/* ---- event appends and reads --------------------------------------------------------- */

/* Keeps the job row's summary columns in step with the newest metric, eval
 * and started events of a batch: one UPDATE per job and kind per batch (the
 * first metric of a run also seeds metric0 for the ETA, so a job's first
 * metric of the batch is written too). Walking the batch backwards finds
 * the newest of each kind with a small list of keys already seen. */
typedef struct summary_key {
    int64_t job_id;
    const char *type;
} summary_key;

static int update_summaries(db *d, const db_event_in *in, int n, ty_err *err)
{
    sqlite3_stmt *m = NULL, *o = NULL;
    summary_key seen[64];
    int nseen = 0, rc = 0;
    if (prep(d,
             "UPDATE jobs SET last_metric = ?2, metric_last_ms = ?3,"
             " metric0_ms = COALESCE(metric0_ms, ?3),"
             " metric0_step = COALESCE(metric0_step, ?4) WHERE id = ?1",
             &m, err) ||
        prep(d,
             "UPDATE jobs SET last_eval = CASE WHEN ?2 = 'eval' THEN ?3 ELSE last_eval END,"
             " engine = CASE WHEN ?2 = 'started' THEN ?3 ELSE engine END WHERE id = ?1",
             &o, err)) {
        rc = TY_EIO;
        goto out;
    }
    /* First metric per job, in batch order, so metric0 is the earliest. */
    for (int pass = 0; pass < 2; pass++) {
        nseen = 0;
        for (int k = 0; k < n; k++) {
            int i = pass == 0 ? k : n - 1 - k; /* pass 0: first; pass 1: newest */
            const char *t = in[i].type;
            bool metric = strcmp(t, "metric") == 0;
            if (in[i].job_id <= 0) continue;
            if (pass == 0 ? !metric : (!metric && strcmp(t, "eval") && strcmp(t, "started")))
                continue;
            bool dup = false;
            for (int s = 0; s < nseen && !dup; s++)
                dup = seen[s].job_id == in[i].job_id && !strcmp(seen[s].type, t);
            if (dup) continue;
            if (nseen < 64) seen[nseen++] = (summary_key){in[i].job_id, t};
            sqlite3_stmt *st = metric ? m : o;
            sqlite3_reset(st);
            sqlite3_bind_int64(st, 1, in[i].job_id);
            if (metric) {
                json_t *js = json_loads(in[i].data, 0, NULL);
                int64_t step = js ? json_integer_value(json_object_get(js, "step")) : 0;
                json_decref(js);
                sqlite3_bind_text(st, 2, in[i].data, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, in[i].ts_ms);
                sqlite3_bind_int64(st, 4, step);
            } else {
                sqlite3_bind_text(st, 2, t, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, in[i].data, -1, SQLITE_STATIC);
            }
            if (sqlite3_step(st) != SQLITE_DONE) {
                rc = sql_err(d, err, "update job summary");
                goto out;
            }
        }
    }
out:
    sqlite3_finalize(m);
    sqlite3_finalize(o);
    return rc;
}

static void clear_events(db_event *out, int n)
{
    if (out)
        for (int i = 0; i < n; i++)
            db_event_clear(&out[i]);
}

int db_events_append(db *d, const db_event_in *in, int n, db_event *out, ty_err *err)
{
    if (n <= 0) return 0;
    if (out) memset(out, 0, sizeof *out * (size_t)n);
    if (begin(d, err)) return TY_EIO;
    /* Per-job next seq, looked up once per job per batch. */
    struct {
        int64_t job_id, next;
    } seqs[64];
    int nseqs = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int64_t seq = 1;
        int k = 0;
        while (k < nseqs && seqs[k].job_id != in[i].job_id)
            k++;
        if (k < nseqs) {
            seq = seqs[k].next;
        } else {
            if (next_seq(d, in[i].job_id, &seq, err)) {
                rc = TY_EIO;
                break;
            }
            if (nseqs < 64) {
                seqs[nseqs].job_id = in[i].job_id;
                k = nseqs++;
            } else {
                k = -1; /* more jobs than slots: look up each time */
            }
        }
        if (insert_event_seq(d, in[i].job_id, seq, in[i].ts_ms, in[i].type, in[i].data,
                             out ? &out[i] : NULL, err)) {
            /* An event of a job deleted meanwhile (a late GPU sample) is
             * skipped, not allowed to sink the whole batch. */
            if (sqlite3_extended_errcode(d->h) != SQLITE_CONSTRAINT_FOREIGNKEY) {
                rc = TY_EIO;
                break;
            }
            ty_err_clear(err);
            if (k >= 0) seqs[k].next = seq;
            continue;
        }
        if (k >= 0) seqs[k].next = seq + 1;
    }
    if (!rc && update_summaries(d, in, n, err)) rc = TY_EIO;
    if ((rc = end_tx(d, rc, NULL, err))) clear_events(out, n);
    return rc;
}

static int read_events(db *d, sqlite3_stmt *st, db_event **out, int *n, ty_err *err)
{
    int cap = 0, rc;
    *out = NULL;
    *n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        db_event *g = grow_rows(*out, *n, &cap, sizeof *g);
        if (!g) {
            rc = SQLITE_NOMEM;
            break;
        }
        *out = g;
        db_event *e = &(*out)[(*n)++];
        memset(e, 0, sizeof *e);
        e->id = sqlite3_column_int64(st, 0);
        e->job_id = sqlite3_column_int64(st, 1);
        e->seq = sqlite3_column_int64(st, 2);
        snprintf(e->type, sizeof e->type, "%s", (const char *)sqlite3_column_text(st, 3));
        e->data = col_str(st, 4);
        e->ts_ms = sqlite3_column_int64(st, 5);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        db_events_free(*out, *n);
        *out = NULL;
        *n = 0;
        return sql_err(d, err, "read events");
    }
    return 0;
}

int db_events_job(db *d, int64_t job_id, int64_t after_seq, int limit, db_event **out, int *n,
                  ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d,
             "SELECT id, job_id, seq, type, data, ts_ms FROM job_events"
             " WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, limit);
    return read_events(d, st, out, n, err);
}

int db_events_global(db *d, int64_t after_id, int limit, db_event **out, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d,
             "SELECT id, job_id, seq, type, data, ts_ms FROM job_events"
             " WHERE id > ? AND type IN ('state', 'started', 'gpu') ORDER BY id LIMIT ?",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, after_id);
    sqlite3_bind_int(st, 2, limit);
    return read_events(d, st, out, n, err);
}

int db_events_metrics(db *d, int64_t job_id, db_event **out, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    /* A metric followed (later id) by one of the same or a lower step was
     * replayed: the job resumed from an earlier checkpoint and redid that
     * step, so only the newest run's row of each step is kept. */
    if (prep(d,
             "SELECT id, job_id, seq, type, data, ts_ms FROM"
             " (SELECT id, job_id, seq, type, data, ts_ms, json_extract(data, '$.step') AS step,"
             "  MIN(json_extract(data, '$.step')) OVER (ORDER BY id DESC ROWS BETWEEN"
             "  UNBOUNDED PRECEDING AND 1 PRECEDING) AS later"
             "  FROM job_events WHERE job_id = ? AND type = 'metric')"
             " WHERE later IS NULL OR later > step ORDER BY seq",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    return read_events(d, st, out, n, err);
}

int64_t db_events_max_id(db *d)
{
    sqlite3_stmt *st;
    int64_t v = 0;
    if (sqlite3_prepare_v2(d->h, "SELECT COALESCE(MAX(id), 0) FROM job_events", -1, &st, NULL) !=
        SQLITE_OK)
        return 0;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

int64_t db_events_last_seq(db *d, int64_t job_id)
{
    int64_t next;
    ty_err err = {0};
    if (next_seq(d, job_id, &next, &err)) return 0;
    return next - 1;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

int db_checkpoint_add(db *d, int64_t job_id, int64_t step, const char *dir, int64_t bytes,
                      const char *sha256, const char *local_path, const char *store_uri,
                      db_event *ev, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    int64_t now = ty_now_ms();
    if (ev) memset(ev, 0, sizeof *ev);
    if (begin(d, err)) return TY_EIO;
    int rc = TY_EIO;
    if (prep(d,
             "INSERT INTO checkpoints(job_id, step, dir, bytes, sha256, local_path,"
             " state, created_ms) VALUES (?,?,?,?,?,?,'local',?)"
             " ON CONFLICT(job_id, step) DO UPDATE SET dir = excluded.dir,"
             " bytes = excluded.bytes, sha256 = excluded.sha256,"
             " local_path = excluded.local_path, state = 'local', error = NULL,"
             " created_ms = excluded.created_ms",
             &st, err))
        goto out;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_text(st, 3, dir, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, bytes);
    bind_str(st, 5, sha256);
    bind_str(st, 6, local_path);
    sqlite3_bind_int64(st, 7, now);
    if (sqlite3_step(st) != SQLITE_DONE) {
        sql_err(d, err, "insert checkpoint");
        goto out;
    }
    /* The upload is queued in the same transaction: a checkpoint of a job
     * with a store is never recorded without its upload. A re-reported step
     * replaces its queued upload. */
    if (store_uri) {
        sqlite3_finalize(st);
        st = NULL;
        if (prep(d,
                 "DELETE FROM uploads WHERE checkpoint_id = (SELECT id FROM checkpoints"
                 " WHERE job_id = ? AND step = ?) AND op = 'put'",
                 &st, err))
            goto out;
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int64(st, 2, step);
        if (sqlite3_step(st) != SQLITE_DONE) {
            sql_err(d, err, "replace upload");
            goto out;
        }
        sqlite3_finalize(st);
        st = NULL;
        if (prep(d,
                 "INSERT INTO uploads(checkpoint_id, file, uri, op) SELECT id, ?, ?, 'put'"
                 " FROM checkpoints WHERE job_id = ? AND step = ?",
                 &st, err))
            goto out;
        bind_str(st, 1, local_path ? local_path : dir);
        bind_str(st, 2, store_uri);
        sqlite3_bind_int64(st, 3, job_id);
        sqlite3_bind_int64(st, 4, step);
        if (sqlite3_step(st) != SQLITE_DONE) {
            sql_err(d, err, "queue upload");
            goto out;
        }
    }
    json_t *o = json_pack("{sI ss sI ss}", "step", (json_int_t)step, "dir", dir, "bytes",
                          (json_int_t)bytes, "state", "local");
    char *data = ty_json_dumps(o, JSON_COMPACT);
    json_decref(o);
    rc = insert_event(d, job_id, now, "checkpoint", data, ev, err) ? TY_EIO : 0;
    free(data);
out:
    sqlite3_finalize(st);
    return end_tx(d, rc, ev, err);
}

int db_checkpoint_list(db *d, int64_t job_id, db_checkpoint **out, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *out = NULL;
    *n = 0;
    if (prep(d,
             "SELECT id, job_id, step, bytes, dir, sha256, local_path, remote_uri, state,"
             " error, attempts, created_ms FROM checkpoints WHERE job_id = ? ORDER BY step",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        db_checkpoint *g = grow_rows(*out, *n, &cap, sizeof *g);
        if (!g) {
            rc = SQLITE_NOMEM;
            break;
        }
        *out = g;
        db_checkpoint *c = &(*out)[(*n)++];
        c->id = sqlite3_column_int64(st, 0);
        c->job_id = sqlite3_column_int64(st, 1);
        c->step = sqlite3_column_int64(st, 2);
        c->bytes = sqlite3_column_int64(st, 3);
        c->dir = col_str(st, 4);
        c->sha256 = col_str(st, 5);
        c->local_path = col_str(st, 6);
        c->remote_uri = col_str(st, 7);
        c->state = col_str(st, 8);
        c->error = col_str(st, 9);
        c->attempts = sqlite3_column_int(st, 10);
        c->created_ms = sqlite3_column_int64(st, 11);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        db_checkpoints_free(*out, *n);
        *out = NULL;
        *n = 0;
        return sql_err(d, err, "list checkpoints");
    }
    return 0;
}

void db_checkpoints_free(db_checkpoint *c, int n)
{
    for (int i = 0; i < n; i++) {
        free(c[i].dir);
        free(c[i].sha256);
        free(c[i].local_path);
        free(c[i].remote_uri);
        free(c[i].state);
        free(c[i].error);
    }
    free(c);
}

int db_checkpoint_newest(db *d, int64_t job_id, char **dir, ty_err *err)
{
    sqlite3_stmt *st;
    *dir = NULL;
    static const char sql[] = "SELECT dir FROM checkpoints WHERE job_id = ? AND state NOT IN"
                              " ('failed', 'deleted') ORDER BY step DESC LIMIT 1";
    if (prep_cached(d, sql, &st, err)) return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    if (sqlite3_step(st) == SQLITE_ROW) *dir = col_str(st, 0);
    unprep(d, st);
    return 0;
}

/* ---- upload queue ------------------------------------------------------------------------ */

void db_upload_clear(db_upload *u)
{
    free(u->dir);
    free(u->local_path);
    free(u->uri);
    memset(u, 0, sizeof *u);
}

/* Appends a `checkpoint` event {step, dir, state[, error][, remote_uri]}
 * inside the caller's transaction. */
static int checkpoint_event(db *d, int64_t job_id, int64_t step, const char *dir, const char *state,
                            const char *error, const char *remote_uri, db_event *ev, ty_err *err)
{
    json_t *o = json_pack("{sI ss ss}", "step", (json_int_t)step, "dir", dir, "state", state);
    if (error) json_object_set_new(o, "error", json_string(error));
    if (remote_uri) json_object_set_new(o, "remote_uri", json_string(remote_uri));
    char *data = ty_json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!data) return ty_err_set(err, TY_ENOMEM, "out of memory");
    int rc = insert_event(d, job_id, ty_now_ms(), "checkpoint", data, ev, err);
    free(data);
    return rc;
}

/* Runs one statement with int64 parameters (a NULL-terminated format of
 * 'i' for int64 and 's' for text), inside the caller's transaction. */
static int exec_bound(db *d, const char *sql, ty_err *err, const char *fmt, ...)
{
    sqlite3_stmt *st;
    if (prep(d, sql, &st, err)) return TY_EIO;
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt[i]; i++) {
        if (fmt[i] == 'i')
            sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        else
            bind_str(st, i + 1, va_arg(ap, const char *));
    }
    va_end(ap);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sql_err(d, err, "update upload queue");
    return 0;
}

int db_upload_claim(db *d, int64_t now_ms, db_upload *out, db_event *ev, ty_err *err)
{
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    if (ev) memset(ev, 0, sizeof *ev);
    if (begin(d, err)) return TY_EIO;
    int rc = TY_EIO;
    if (prep(d,
             "SELECT u.id, u.checkpoint_id, u.op, u.uri, u.attempts, c.job_id, c.step, c.dir,"
             " c.local_path FROM uploads u JOIN checkpoints c ON c.id = u.checkpoint_id"
             " WHERE u.state = 'pending' AND u.next_attempt_ms <= ? ORDER BY u.id LIMIT 1",
             &st, err))
        goto out;
    sqlite3_bind_int64(st, 1, now_ms);
    int step = sqlite3_step(st);
    if (step != SQLITE_ROW) { /* nothing due (TY_ENOENT), or a failed read */
        rc = step == SQLITE_DONE ? TY_ENOENT : sql_err(d, err, "claim upload");
        goto out;
    }
    out->id = sqlite3_column_int64(st, 0);
    out->checkpoint_id = sqlite3_column_int64(st, 1);
    snprintf(out->op, sizeof out->op, "%s", (const char *)sqlite3_column_text(st, 2));
    out->uri = col_str(st, 3);
    out->attempts = sqlite3_column_int(st, 4) + 1;
    out->job_id = sqlite3_column_int64(st, 5);
    out->step = sqlite3_column_int64(st, 6);
    out->dir = col_str(st, 7);
    out->local_path = col_str(st, 8);
    bool put = !strcmp(out->op, "put");
    if (exec_bound(d, "UPDATE uploads SET state = 'running', attempts = attempts + 1 WHERE id = ?",
                   err, "i", out->id) ||
        (put &&
         (exec_bound(d,
                     "UPDATE checkpoints SET state = 'uploading', attempts = attempts"
                     " + 1 WHERE id = ?",
                     err, "i", out->checkpoint_id) ||
          checkpoint_event(d, out->job_id, out->step, out->dir, "uploading", NULL, NULL, ev, err))))
        goto out;
    rc = 0;
out:
    sqlite3_finalize(st);
    if ((rc = end_tx(d, rc, ev, err))) db_upload_clear(out);
    return rc;
}

int db_upload_finish(db *d, const db_upload *u, db_upload_outcome o, const char *remote_uri,
                     const char *error, int64_t retry_at_ms, db_event *ev, ty_err *err)
{
    if (ev) memset(ev, 0, sizeof *ev);
    if (begin(d, err)) return TY_EIO;
    int rc = 0;
    bool put = !strcmp(u->op, "put");
    /* The queue row: gone when done or skipped, pending again for a retry,
     * failed for good otherwise (kept, with its reason, for inspection). */
    if (o == DB_UP_DONE || o == DB_UP_SKIPPED)
        rc = exec_bound(d, "DELETE FROM uploads WHERE id = ?", err, "i", u->id);
    else if (o == DB_UP_RETRY)
        rc = exec_bound(d,
                        "UPDATE uploads SET state = 'pending', next_attempt_ms = ?, error = ?"
                        " WHERE id = ?",
                        err, "isi", retry_at_ms, error, u->id);
    else
        rc = exec_bound(d, "UPDATE uploads SET state = 'failed', error = ? WHERE id = ?", err, "si",
                        error, u->id);
    /* The checkpoint row and its event (uploads only: a remote delete
     * concerns a checkpoint already shown as deleted). */
    if (!rc && put) {
        const char *state = o == DB_UP_DONE      ? "committed"
                            : o == DB_UP_SKIPPED ? "deleted"
                                                 : "failed";
        if (o == DB_UP_DONE)
            rc = exec_bound(d,
                            "UPDATE checkpoints SET state = 'committed', remote_uri = ?,"
                            " error = NULL WHERE id = ? AND state = 'uploading'",
                            err, "si", remote_uri, u->checkpoint_id);
        else
            rc = exec_bound(d,
                            "UPDATE checkpoints SET state = ?, error = ? WHERE id = ? AND"
                            " state = 'uploading'",
                            err, "ssi", state, error, u->checkpoint_id);
        if (!rc && sqlite3_changes(d->h) > 0)
            rc = checkpoint_event(d, u->job_id, u->step, u->dir, state,
                                  o == DB_UP_DONE ? NULL : error,
                                  o == DB_UP_DONE ? remote_uri : NULL, ev, err);
    }
    return end_tx(d, rc ? TY_EIO : 0, ev, err);
}

int db_upload_recover(db *d, int *requeued, ty_err *err)
{
    *requeued = 0;
    if (begin(d, err)) return TY_EIO;
    int rc = exec_bound(d,
                        "UPDATE uploads SET state = 'pending', next_attempt_ms = 0"
                        " WHERE state = 'running'",
                        err, "");
    if (!rc) *requeued = sqlite3_changes(d->h);
    if (!rc)
        rc = exec_bound(d, "UPDATE checkpoints SET state = 'local' WHERE state = 'uploading'", err,
                        "");
    return end_tx(d, rc ? TY_EIO : 0, NULL, err);
}

int db_upload_busy(db *d, int64_t job_id, bool retries, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *n = 0;
    if (prep(d,
             "SELECT COUNT(*) FROM uploads u JOIN checkpoints c ON c.id = u.checkpoint_id"
             " WHERE c.job_id = ? AND u.op = 'put' AND (u.state = 'running' OR"
             " (u.state = 'pending' AND (u.attempts = 0 OR ?)))",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int(st, 2, retries ? 1 : 0);
    if (sqlite3_step(st) == SQLITE_ROW) *n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return 0;
}

int db_upload_drop_job(db *d, int64_t job_id, int *running, ty_err *err)
{
    sqlite3_stmt *st;
    *running = 0;
    if (begin(d, err)) return TY_EIO;
    int rc = exec_bound(d,
                        "DELETE FROM uploads WHERE state <> 'running' AND checkpoint_id IN"
                        " (SELECT id FROM checkpoints WHERE job_id = ?)",
                        err, "i", job_id);
    if (!rc && prep(d,
                    "SELECT COUNT(*) FROM uploads WHERE checkpoint_id IN"
                    " (SELECT id FROM checkpoints WHERE job_id = ?)",
                    &st, err) == 0) {
        sqlite3_bind_int64(st, 1, job_id);
        if (sqlite3_step(st) == SQLITE_ROW) *running = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    } else if (!rc) {
        rc = TY_EIO;
    }
    return end_tx(d, rc ? TY_EIO : 0, NULL, err);
}

int db_upload_count(db *d, const char *state, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *n = 0;
    if (prep(d, "SELECT COUNT(*) FROM uploads WHERE state = ?", &st, err)) return TY_EIO;
    sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) *n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return 0;
}

int db_checkpoint_retire(db *d, const db_checkpoint *c, const char *store_uri, db_event *ev,
                         ty_err *err)
{
    if (ev) memset(ev, 0, sizeof *ev);
    if (begin(d, err)) return TY_EIO;
    /* Only a checkpoint no upload is working on: a running one finishes
     * first and the next retention pass sees it. */
    sqlite3_stmt *st;
    int busy = 0, rc = 0;
    if (prep(d,
             "SELECT COUNT(*) FROM uploads WHERE checkpoint_id = ? AND op = 'put' AND"
             " state = 'running'",
             &st, err)) {
        rc = TY_EIO;
        goto out;
    }
    sqlite3_bind_int64(st, 1, c->id);
    if (sqlite3_step(st) == SQLITE_ROW) busy = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (busy) {
        rc = ty_err_set(err, TY_ESTATE, "checkpoint %s is being uploaded", c->dir);
        goto out;
    }
    rc = exec_bound(d, "DELETE FROM uploads WHERE checkpoint_id = ? AND op = 'put'", err, "i",
                    c->id);
    if (!rc)
        rc = exec_bound(d,
                        "UPDATE checkpoints SET state = 'deleted', error = NULL"
                        " WHERE id = ? AND state <> 'deleted'",
                        err, "i", c->id);
    bool changed = !rc && sqlite3_changes(d->h) > 0;
    if (!rc && changed && store_uri)
        rc = exec_bound(d,
                        "INSERT INTO uploads(checkpoint_id, file, uri, op)"
                        " VALUES (?, ?, ?, 'delete')",
                        err, "iss", c->id, c->dir, store_uri);
    if (!rc && changed)
        rc = checkpoint_event(d, c->job_id, c->step, c->dir, "deleted", NULL, NULL, ev, err);
    if (rc) rc = TY_EIO;
out:
    return end_tx(d, rc, ev, err);
}

int db_checkpoint_eval_loss(db *d, int64_t job_id, int64_t step, double *loss, ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d,
             "SELECT json_extract(data, '$.loss') FROM job_events WHERE job_id = ? AND"
             " type = 'eval' AND json_extract(data, '$.step') = ? ORDER BY seq DESC LIMIT 1",
             &st, err))
        return TY_EIO;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, step);
    int rc = TY_ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        *loss = sqlite3_column_double(st, 0);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* ---- tokens ---------------------------------------------------------------------------- */

int db_token_add_scoped(db *d, const char *name, const char sha256_hex[65], const char *scopes,
                        ty_err *err)
{
    sqlite3_stmt *st;
    if (prep(d, "INSERT INTO tokens(name, sha256, created_ms, scopes) VALUES (?,?,?,?)", &st, err))
        return TY_EIO;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, sha256_hex, 64, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, ty_now_ms());
    sqlite3_bind_text(st, 4, scopes, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc == SQLITE_CONSTRAINT)
        return ty_err_field(err, TY_ESTATE, "name", "a token named '%s' already exists", name);
    if (rc != SQLITE_DONE) return sql_err(d, err, "insert token");
    return 0;
}

int db_token_add(db *d, const char *name, const char sha256_hex[65], ty_err *err)
{
    return db_token_add_scoped(d, name, sha256_hex, "read,submit,admin", err);
}

int db_token_list(db *d, db_token **rows, int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *rows = NULL;
    *n = 0;
    if (prep(d, "SELECT id, sha256, scopes FROM tokens ORDER BY id", &st, err)) return TY_EIO;
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *h = (const char *)sqlite3_column_text(st, 1);
        const char *sc = (const char *)sqlite3_column_text(st, 2);
        if (!h || strlen(h) != 64) continue;
        db_token *g = grow_rows(*rows, *n, &cap, sizeof *g);
        if (!g) {
            rc = SQLITE_NOMEM;
            break;
        }
        *rows = g;
        db_token *t = &(*rows)[(*n)++];
        t->id = sqlite3_column_int64(st, 0);
        memcpy(t->sha256, h, 65);
        snprintf(t->scopes, sizeof t->scopes, "%s", sc ? sc : "");
    }
    sqlite3_finalize(st);
    /* A partial list would silently refuse valid tokens: report it. */
    if (rc != SQLITE_DONE) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return sql_err(d, err, "read tokens");
    }
    return 0;
}

int db_token_hashes(db *d, char (**hashes)[65], int *n, ty_err *err)
{
    sqlite3_stmt *st;
    *hashes = NULL;
    *n = 0;
    if (prep(d, "SELECT sha256 FROM tokens", &st, err)) return TY_EIO;
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *h = (const char *)sqlite3_column_text(st, 0);
        if (!h || strlen(h) != 64) continue;
        char(*g)[65] = grow_rows(*hashes, *n, &cap, sizeof *g);
        if (!g) {
            rc = SQLITE_NOMEM;
            break;
        }
        *hashes = g;
        memcpy((*hashes)[(*n)++], h, 65);
    }
    sqlite3_finalize(st);
    /* A partial list would silently refuse valid tokens: report it. */
    if (rc != SQLITE_DONE) {
        free(*hashes);
        *hashes = NULL;
        *n = 0;
        return sql_err(d, err, "read tokens");
    }
    return 0;
}
