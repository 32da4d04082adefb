/* state.h — the daemon state every part shares (state.c): the per-thread
 * database handle, publishing committed events, job transitions and job
 * directories. The bottom of server/: it calls only the SSE hub and the
 * event writer, and everything above (scheduler, HTTP, uploads, serve.c)
 * calls it. */
#ifndef TY_STATE_H
#define TY_STATE_H

#include "jobspec.h"
#include "server.h"

/* Prepares s for the helpers below: the per-thread handle key and the
 * write lock. Once, before any thread starts. */
void srv_state_init(srv *s);
/* The calling thread's database handle, opened on first use. */
db *srv_db(srv *s);
/* srv_db for a callback's void * (the event writer's). */
db *srv_db_of(void *s);
/* Closes the calling thread's handle (a thread that ends, or shutdown). */
void srv_db_release(srv *s);
/* Publishes committed events; call with write_lock held. */
void srv_publish(srv *s, const db_event *ev);
/* The event writer's publish callback (evw_publish_fn; ctx is the srv):
 * counts the event as ingested and publishes it. */
void srv_publish_ingested(void *ctx, const db_event *ev);
/* A job transition with its state event, ordered after any pending engine
 * events of the writer (they are flushed first, in the same lock). */
int srv_transition(srv *s, int64_t id, unsigned from_mask, job_state to, const char *reason,
                   const db_job_update *upd, job_state *from_out, ty_err *err);
/* A job row's stored spec, parsed. Server code reads a job's spec only
 * through this, never its JSON by field name (tests/style/spec_reads.sh),
 * so common/jobspec.c is the one place that knows the spec's layout. Each
 * reader parses where it loads the row (the scheduler at a start, the
 * uploader, the webhook sender) rather than a struct riding along with the
 * run: those threads load the row anyway, and the row, not memory, is the
 * record. The row holds jobspec_to_json's output, so it parses unless it
 * was damaged: TY_ECORRUPT naming the job then. jobspec_free afterwards. */
int srv_job_spec(const db_job *j, jobspec *out, ty_err *err);
/* <jobs_dir>/<id> */
void srv_job_dir(const srv *s, int64_t id, char *out, size_t cap);

#endif
