/* upload.h — the server's side of object storage: the durable checkpoint
 * upload queue and its workers, retention, the export and the final verdict
 * (bringing checkpoints and remote inputs back before a start: fetch.h).
 *
 * The queue lives in SQLite (db.h, `uploads`): a checkpoint event of a job
 * with checkpoint.store queues a put in the same transaction that records
 * the checkpoint, so a crash never loses one. --upload-workers threads claim
 * rows, upload with store_put_checkpoint (MANIFEST.json last) and move the
 * checkpoint row local → uploading → committed | failed, publishing a
 * `checkpoint` event at each step. Every upload opens its own store, so one
 * job's upload can be cancelled (store_cancel) without touching others. */
#ifndef TY_UPLOAD_H
#define TY_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

typedef struct uploader uploader;

/* Called after each finished upload or export, from a worker thread: a
 * job may be waiting for it (the scheduler's wake-up). */
typedef void (*uploader_done_fn)(void *ctx);
/* Puts rows a killed server left running back in the queue, then starts
 * the workers; done (may be NULL) is called with ctx as above. */
uploader *uploader_new(srv *s, uploader_done_fn done, void *ctx, ty_err *err);
/* A row was queued: claim it now rather than at the next poll. */
void uploader_wake(uploader *u);
/* Is an upload of this job running, or queued and not yet tried (what
 * pause and cancel wait for)? With final, also a checkpoint waiting for a
 * retry after a failed try, and the job's export (what success waits for:
 * the final checkpoint and the export land or fail for good). */
bool uploader_job_busy(uploader *u, int64_t job_id, bool final);
/* A job with checkpoint.store finished: queue the upload of its export/
 * (if the engine wrote one) to STORE/job-<id>/export/. Tried once (each
 * request retried by storage/); success leaves <job dir>/export.uploaded,
 * failure sets the job's checkpoint_error. */
void uploader_export(uploader *u, int64_t job_id);
/* Aborts the job's running uploads (store_cancel); they go back to the
 * queue and are tried again later. */
void uploader_cancel_job(uploader *u, int64_t job_id);
/* Cancels running transfers (they stay queued for the next start) and
 * joins the workers. */
void uploader_stop(uploader *u);
void uploader_free(uploader *u);

/* keep_last / keep_best of the job's spec: marks older checkpoints deleted,
 * removes their local directories and queues their remote deletes. Never
 * the newest committed checkpoint; a checkpoint being uploaded waits for
 * the next pass. Failures are logged, never fatal. */
void upload_retention(srv *s, int64_t job_id);

/* Retention's choice, a pure function over a job's checkpoints in step
 * order: keep[i] for the keep_last newest not yet deleted (0 = all), the
 * keep_best lowest loss[i] (NAN = no eval at that step; the newest is then
 * kept too), and always the newest committed one. */
void upload_retention_pick(const db_checkpoint *c, int n, int keep_last, int keep_best,
                           const double *loss, bool *keep);

/* DELETE ?purge=1: deletes every remote checkpoint of a finished job now
 * (not-found counts as done). TY_EIO with the first failure. */
int upload_purge_job(srv *s, int64_t job_id, ty_err *err);

/* Before a job with a store may end `succeeded`: is its result in the
 * store? False, with why (one sentence naming the store and the reason),
 * when the newest checkpoint is not committed or the export was not
 * uploaded; true for a job without a store. */
bool upload_job_verdict(srv *s, int64_t job_id, char *why, size_t cap);

/* POST /jobs: writes and deletes a probe object in checkpoint.store with
 * the server's credentials (store_probe), each request bounded by a few
 * seconds so a dead endpoint cannot hold the HTTP thread for long. On
 * failure err->field is "checkpoint.store" and err->msg names the URI and
 * the service's reason. */
int upload_probe_store(srv *s, const char *uri, ty_err *err);

/* "job-<id>/<dir>": where a checkpoint lives under its store root. */
void upload_remote_prefix(int64_t job_id, const char *dir, char *out, size_t cap);

#endif
