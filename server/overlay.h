/* overlay.h — what the API shows of a job whose engine is gone while its
 * final state is still being written (overlay.c). */
#ifndef TY_OVERLAY_H
#define TY_OVERLAY_H

#include <stdbool.h>
#include <stdint.h>

#include "server.h"

struct overlay *overlay_new(void);
void overlay_free(struct overlay *o);
/* The job is settling to `state` (reason: its error when failed); set
 * once its engine is known gone and its checkpoints reconciled, just
 * before the write is tried. */
void overlay_set(srv *s, int64_t id, job_state state, const char *reason);
/* What a settling job is written with besides its state, shown with it:
 * with has_resume the checkpoint it resumes from (NULL: none), and its
 * restarts (-1: as the row says). */
void overlay_set_detail(srv *s, int64_t id, bool has_resume, const char *resume_from, int restarts);
/* The write landed (or can never land): the row is the truth again. */
void overlay_clear(srv *s, int64_t id);
/* The state a job is settling to, if it is. */
bool overlay_state(srv *s, int64_t id, job_state *state);
/* Rewrites a row read from the database with the job's overlay, if any:
 * state, error, resume point, restarts, finished time, no GPUs held. */
void overlay_apply(srv *s, db_job *j);
/* A list filter (JOB_BIT mask) widened so a row whose overlay state is in
 * it is read too; overlay_keep() then says which rows to show. */
unsigned overlay_widen(srv *s, unsigned mask);
bool overlay_keep(const db_job *j, unsigned mask);
/* Moves settling jobs in per-state counts (db_job_counts) from their row's
 * state to the one shown. */
void overlay_counts(srv *s, db *d, int64_t counts[JOB_NSTATES]);

#endif
