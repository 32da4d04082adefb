/* db.h — trainyard's durable state: the only module that speaks SQL.
 *
 * One SQLite file (WAL, foreign keys, busy timeout) holds jobs, their events
 * (a per-job sequence and a global id), checkpoints, API token hashes and
 * idempotency keys. Every state change of a job is one transaction that also
 * appends its `state` event, so the event log and the jobs table never
 * disagree. A db handle is used by one thread at a time; each thread that
 * needs the database opens its own handle (WAL lets readers run alongside
 * the single writer). */
#ifndef TY_DB_H
#define TY_DB_H

#include <stdbool.h>
#include <stdint.h>
#include "tyerr.h"

typedef struct db db;

/* Newest schema version this build knows; migrations run on open. */
#define DB_SCHEMA_VERSION 7

typedef enum {
    JOB_QUEUED = 0,
    JOB_STARTING,
    JOB_RUNNING,
    JOB_STOPPING,
    JOB_PAUSED,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_CANCELLED,
    JOB_NSTATES
} job_state;

#define JOB_BIT(s) (1u << (s))

const char *db_state_name(job_state s);
/* Returns the state, or -1 for an unknown name. */
int db_state_parse(const char *name);
bool db_state_terminal(job_state s);
/* The state machine of DESIGN §2: is from → to a legal transition? */
bool db_transition_legal(job_state from, job_state to);

/* Opens (creating if needed) and migrates to DB_SCHEMA_VERSION. */
int db_open(const char *path, db **out, ty_err *err);
/* Opens without migrating, then migrates only up to `version` (tests build
 * old-version databases with it). */
int db_open_at_version(const char *path, int version, db **out, ty_err *err);
void db_close(db *d);
/* How a handle is opened: read-write (created and migrated as db_open), or,
 * where the disk is too full for SQLite to set up its -shm file, read-only
 * through its WAL (DB_RO) or, with no WAL content to read, the main file
 * alone (DB_IMMUTABLE). Read-only handles need the current schema; their
 * writes fail with TY_ENOSPC. */
typedef enum { DB_RW, DB_RO, DB_IMMUTABLE } db_mode;
int db_open_mode(const char *path, db_mode mode, db **out, ty_err *err);
/* fn(ctx, full) is called, from whichever thread met it, each time SQLite
 * reports a full disk (full true) or an I/O error (which a full disk also
 * causes: SQLite cannot grow its -shm file); NULL: none. Set once, before
 * the handles that report are used. */
void db_set_full_hook(void (*fn)(void *ctx, bool full), void *ctx);
int db_user_version(db *d);

/* ---- jobs ---------------------------------------------------------------- */

typedef struct db_job {
    int64_t id;
    char *name;
    job_state state;
    char *spec; /* JSON text as stored */
    int priority;
    int gpus_wanted;
    int64_t max_steps;
    int64_t created_ms, started_ms, finished_ms, updated_ms; /* 0 = null */
    int restarts, max_restarts;
    char *resume_from; /* relative checkpoint dir, or NULL */
    char *error;       /* NULL unless failed */
    char *backend;     /* "cpu" | "cuda" | NULL before start */
    char *gpus;        /* comma-separated indices held, "" for none */
    char *last_metric; /* JSON text or NULL */
    char *last_eval;
    char *engine;                     /* the engine's started event */
    int64_t metric0_ms, metric0_step; /* first metric of the current run */
    int64_t metric_last_ms;
    int64_t pgid;           /* engine process group, 0 when none */
    char *stop_intent;      /* "pause" | "cancel" | NULL */
    int64_t run_ms;         /* running time of the finished runs */
    int64_t run_since_ms;   /* start of the current run, 0 when not running */
    char *checkpoint_error; /* newest upload to the store that failed for good, or NULL */
    char *tags;             /* JSON array of strings, "[]" for none */
    char *stop_reason;      /* "budget" | "stall" when stopped early, else NULL */
    char *token_name;       /* the API token that submitted it, NULL without one */
    double hour_price;      /* per GPU (or CPU slot) hour of its current price; < 0 unknown */
} db_job;

void db_job_free(db_job *j);
/* Time the job's engine has been alive (starting, running or stopping)
 * up to now_ms, summed over runs; paused and queued time is not counted. */
int64_t db_job_run_ms(const db_job *j, int64_t now_ms);

typedef struct db_new_job {
    const char *name;
    const char *spec;
    int priority;
    int gpus_wanted;
    int64_t max_steps;
    int max_restarts;
    const char *idem_key;    /* NULL when none */
    const char *body_sha256; /* of the request body, with idem_key */
    const char *tags;        /* JSON array text; NULL = "[]" */
    const char *token_name;  /* submitting token's name, or NULL */
} db_new_job;

/* One row of job_events as written; filled for the caller to publish. */
typedef struct db_event {
    int64_t id;     /* global */
    int64_t job_id; /* 0 for none */
    int64_t seq;    /* per job */
    int64_t ts_ms;
    char type[16];
    char *data; /* JSON text, owned */
} db_event;

void db_event_clear(db_event *e);

/* Inserts a queued job and its first `state` event in one transaction.
 * With an idempotency key already used: same body → *existing = true and
 * *id the first job; different body → TY_ESTATE. */
int db_job_insert(db *d, const db_new_job *nj, int64_t *id, bool *existing, db_event *ev,
                  ty_err *err);
int db_job_get(db *d, int64_t id, db_job *out, ty_err *err);
/* The largest job id ever given (ids are never reused), 0 before the first. */
int db_job_max_id(db *d, int64_t *out, ty_err *err);

/* Lists newest first: ids below `before_id` (0 = from the top), states in
 * `state_mask` (0 = all), at most `limit`. *out is an array the caller frees
 * with db_jobs_free. */
int db_job_list(db *d, unsigned state_mask, int64_t before_id, int limit, db_job **out, int *n,
                ty_err *err);
/* The same, only jobs carrying `tag` among their tags (NULL = any). */
int db_job_list_tag(db *d, unsigned state_mask, const char *tag, int64_t before_id, int limit,
                    db_job **out, int *n, ty_err *err);
void db_jobs_free(db_job *jobs, int n);

/* 1-based position among queued jobs in scheduling order; 0 if not queued. */
int db_job_queue_position(db *d, int64_t id, ty_err *err);
/* Queued jobs in scheduling order (priority desc, then id). */
int db_job_queued_ids(db *d, int64_t **ids, int *n, ty_err *err);
/* Counts per state (array of JOB_NSTATES). */
int db_job_counts(db *d, int64_t counts[JOB_NSTATES], ty_err *err);
/* Jobs in any state of mask (used by recovery at start). */
int db_job_ids_in(db *d, unsigned state_mask, int64_t **ids, int *n, ty_err *err);
int db_job_delete(db *d, int64_t id, ty_err *err);

/* Fields a transition may change besides the state; set the has_* flag of
 * what to write. Strings may be NULL to store NULL. */
typedef struct db_job_update {
    bool has_error;
    const char *error;
    bool has_resume_from;
    const char *resume_from;
    bool has_restarts;
    int restarts;
    bool has_backend;
    const char *backend;
    bool has_gpus;
    const char *gpus;
    bool has_pgid;
    int64_t pgid;
    bool has_stop_intent;
    const char *stop_intent;
    bool has_checkpoint_error;
    const char *checkpoint_error;
    bool has_stop_reason;
    const char *stop_reason;
    bool has_hour_price;
    double hour_price; /* < 0 stores NULL */
    bool set_started;  /* started_at = now, resets metric timing */
    bool set_finished; /* finished_at = now */
} db_job_update;

/* Moves job `id` from any state in `from_mask` to `to` in one transaction
 * that also appends the `state` event {"from","to","reason"}. An unknown job
 * is TY_ENOENT; a state outside from_mask, or an illegal move, is TY_ESTATE
 * with a message naming both states. *from_out gets the state found. */
int db_job_transition(db *d, int64_t id, unsigned from_mask, job_state to, const char *reason,
                      const db_job_update *upd, job_state *from_out, db_event *ev, ty_err *err);
/* Updates non-state fields (pgid while running, etc.). */
int db_job_update_fields(db *d, int64_t id, const db_job_update *upd, ty_err *err);

/* ---- events -------------------------------------------------------------- */

typedef struct db_event_in {
    int64_t job_id;
    int64_t ts_ms;
    const char *type;
    char *data; /* JSON text; ownership stays with the caller */
} db_event_in;

/* Appends n events in one transaction, assigning per-job seq and global id
 * into out[i] (which may be NULL). metric/eval/started events also update
 * the job's last_metric / last_eval / engine columns. An event naming a job
 * that no longer exists is skipped (out[i].id stays 0). */
int db_events_append(db *d, const db_event_in *in, int n, db_event *out, ty_err *err);

/* Events of one job with seq > after_seq, in order, at most limit. */
int db_events_job(db *d, int64_t job_id, int64_t after_seq, int limit, db_event **out, int *n,
                  ty_err *err);
/* Events for the global feed (state, started, gpu) with id > after_id. */
int db_events_global(db *d, int64_t after_id, int limit, db_event **out, int *n, ty_err *err);
/* Every metric event of a job, in order. */
int db_events_metrics(db *d, int64_t job_id, db_event **out, int *n, ty_err *err);
void db_events_free(db_event *evs, int n);
int64_t db_events_max_id(db *d);
/* The seq of a job's newest event; 0 when it has none (or on error). */
int64_t db_events_last_seq(db *d, int64_t job_id);

/* ---- checkpoints --------------------------------------------------------- */

typedef struct db_checkpoint {
    int64_t id, job_id, step, bytes;
    char *dir, *sha256, *local_path, *remote_uri, *state, *error;
    int attempts;
    int64_t created_ms;
} db_checkpoint;

/* Records a checkpoint (state "local") and its `checkpoint` event in one
 * transaction; with store_uri (the job's checkpoint.store, no credentials)
 * its upload is queued in the same transaction. A second report of the same
 * step replaces the row and its queued upload. */
int db_checkpoint_add(db *d, int64_t job_id, int64_t step, const char *dir, int64_t bytes,
                      const char *sha256, const char *local_path, const char *store_uri,
                      db_event *ev, ty_err *err);
int db_checkpoint_list(db *d, int64_t job_id, db_checkpoint **out, int *n, ty_err *err);
void db_checkpoints_free(db_checkpoint *c, int n);
/* dir of the newest checkpoint not failed or deleted; *dir NULL if none. */
int db_checkpoint_newest(db *d, int64_t job_id, char **dir, ty_err *err);

/* Retention: marks a checkpoint deleted (with its `checkpoint` event),
 * drops its queued upload, and with store_uri queues the remote delete.
 * TY_ESTATE while an upload of it is running. No-op if already deleted. */
int db_checkpoint_retire(db *d, const db_checkpoint *c, const char *store_uri, db_event *ev,
                         ty_err *err);
/* The loss of the job's eval event at exactly this step; TY_ENOENT if none. */
int db_checkpoint_eval_loss(db *d, int64_t job_id, int64_t step, double *loss, ty_err *err);

/* ---- upload queue (uploads table) ----------------------------------------
 * One row per remote operation on a checkpoint: "put" (upload it) or
 * "delete" (retention). Rows go pending → running → removed when done;
 * a retry puts them back to pending with a due time; "failed" is final.
 * Every put step also moves the checkpoint row (local → uploading →
 * committed | failed | deleted) and appends its `checkpoint` event, in the
 * same transaction, for the caller to publish. */
typedef struct db_upload {
    int64_t id, checkpoint_id, job_id, step;
    char op[8];       /* "put" | "delete" */
    char *dir;        /* checkpoint dir relative to the job dir */
    char *local_path; /* absolute path of the local checkpoint */
    char *uri;        /* store root URI (never credentials) */
    int attempts;     /* including this one */
} db_upload;

typedef enum {
    DB_UP_DONE,   /* put: committed (remote_uri); delete: gone */
    DB_UP_RETRY,  /* failed this time (error); pending again at retry_at_ms */
    DB_UP_FAILED, /* failed for good (error) */
    DB_UP_SKIPPED /* put: the local checkpoint vanished (engine's keep_last); deleted */
} db_upload_outcome;

void db_upload_clear(db_upload *u);
/* Claims the oldest due pending row (→ running, attempts + 1); a put moves
 * its checkpoint to uploading with an event in *ev (ev->id 0 for none).
 * TY_ENOENT when nothing is due. Safe across threads and handles. */
int db_upload_claim(db *d, int64_t now_ms, db_upload *out, db_event *ev, ty_err *err);
int db_upload_finish(db *d, const db_upload *u, db_upload_outcome o, const char *remote_uri,
                     const char *error, int64_t retry_at_ms, db_event *ev, ty_err *err);
/* At start: rows a killed server left running are pending again and their
 * checkpoints local (uploads are idempotent; the manifest goes last). */
int db_upload_recover(db *d, int *requeued, ty_err *err);
/* Puts of the job that are running or not yet tried (what a pause waits
 * for); with retries also those waiting for a retry after a failed try
 * (what success waits for: the final checkpoint must land or fail for good). */
int db_upload_busy(db *d, int64_t job_id, bool retries, int *n, ty_err *err);
/* Purge: drops the job's queue rows that are not running; *running gets
 * how many are (the caller cancels them and calls again). */
int db_upload_drop_job(db *d, int64_t job_id, int *running, ty_err *err);
/* Rows in a queue state (pending, running, failed). */
int db_upload_count(db *d, const char *state, int *n, ty_err *err);

/* ---- tokens -------------------------------------------------------------- */

int db_token_add(db *d, const char *name, const char sha256_hex[65], ty_err *err);
/* All stored hashes (64 hex chars each, NUL-terminated). */
int db_token_hashes(db *d, char (**hashes)[65], int *n, ty_err *err);
/* With scopes ("read,submit,admin" or a part of it; db_token_add gives all). */
int db_token_add_scoped(db *d, const char *name, const char sha256_hex[65], const char *scopes,
                        ty_err *err);
typedef struct db_token {
    int64_t id;
    char sha256[65];
    char scopes[64];
} db_token;
/* Every token's id, hash and scopes; one malloc'd array. */
int db_token_list(db *d, db_token **rows, int *n, ty_err *err);

#endif
