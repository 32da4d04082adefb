/* db_ops.h — the queries of the operations features: changing a
 * waiting job (PATCH), the usage ledger, the webhook outbox and token
 * names. Kept apart from db.h's core so each concern stays small; they
 * share the handle and the SQL helpers of db_int.h. */
#ifndef TY_DB_OPS_H
#define TY_DB_OPS_H

#include <stddef.h>
#include "db.h"

/* ---- PATCH /jobs/{id} ---------------------------------------------------- */

typedef struct db_job_patch {
    bool has_name;
    const char *name; /* NULL clears */
    bool has_priority;
    int priority;
    bool has_tags;
    const char *tags; /* JSON array text */
} db_job_patch;

/* Changes a queued or paused job (its columns and its stored spec) in one
 * transaction; TY_ESTATE naming the state otherwise, TY_ENOENT. */
int db_job_patch_apply(db *d, int64_t id, const db_job_patch *p, ty_err *err);

/* ---- usage ledger (written by db_job_transition at a job's end) ---------- */

typedef struct db_usage_row {
    int64_t job_id;
    char *token_name; /* NULL: submitted without a token */
    char *tags;       /* JSON array text */
    char state[16];   /* final state */
    int64_t finished_ms;
    int gpus;
    int64_t run_ms;
    bool has_cost;
    double cost;
    int64_t tokens;
} db_usage_row;

/* Rows of jobs that ended in [from_ms, to_ms), oldest first. */
int db_usage_list(db *d, int64_t from_ms, int64_t to_ms, db_usage_row **rows, int *n, ty_err *err);
void db_usage_free(db_usage_row *rows, int n);

/* ---- webhook outbox ------------------------------------------------------- */

/* The last event id fanned out; at the very first call the newest event
 * (history is not sent). */
int db_webhook_cursor(db *d, int64_t *event_id, ty_err *err);
/* Events webhooks announce (state, budget, stall, idle_gpu) after after_id. */
int db_webhook_events(db *d, int64_t after_id, int limit, db_event **out, int *n, ty_err *err);
/* One transaction: the deliveries of one event (n urls, each with its
 * body) and the cursor moved to event_id. */
int db_webhook_fanout(db *d, int64_t event_id, const char *const *urls, char *const *bodies, int n,
                      ty_err *err);

typedef struct db_webhook {
    int64_t id, event_id;
    char *url, *body;
    int attempts;
} db_webhook;

/* Pending deliveries due at now_ms, oldest first, at most limit. */
int db_webhook_due(db *d, int64_t now_ms, int limit, db_webhook **out, int *n, ty_err *err);
void db_webhooks_free(db_webhook *w, int n);
/* Records a try: delivered, failed for good, or pending again at next_ms. */
int db_webhook_result(db *d, int64_t id, const char *state, int64_t next_ms, const char *error,
                      ty_err *err);
/* Rows in a state (pending, delivered, failed). */
int db_webhook_count(db *d, const char *state, int *n, ty_err *err);

/* ---- tokens ----------------------------------------------------------------- */

/* The name of token row id into out; TY_ENOENT if there is none. */
int db_token_name(db *d, int64_t id, char *out, size_t cap, ty_err *err);

#endif
