/* fetch.h — what a start must download first: the resume checkpoint when
 * its directory is gone (from checkpoint.store) and remote model / dataset
 * URIs (into the data directory's cache). The scheduler runs it on a fetch
 * thread so a slow download never holds up other jobs (sched.c). */
#ifndef TY_FETCH_H
#define TY_FETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "jobspec.h"
#include "server.h"
#include "tyerr.h"

/* One start's downloads, cancellable from another thread: the fetch
 * registers the store of each transfer here and fetch_handle_cancel
 * aborts it (store_cancel) and every later one. */
typedef struct fetch_handle fetch_handle;
fetch_handle *fetch_handle_new(void);
void fetch_handle_cancel(fetch_handle *f);
void fetch_handle_free(fetch_handle *f);

/* Will fetch_prepare_start download anything (a resume checkpoint whose
 * files are gone, or a remote model/dataset URI)? Then the scheduler runs
 * it on a fetch thread rather than its own. */
bool fetch_needed(srv *s, int64_t job_id, const jobspec *spec, const char *resume);

/* Before an engine starts: makes the resume checkpoint local (downloading
 * the newest committed one, verified file by file, when the local files
 * are gone) and fetches remote model/dataset URIs into
 * <data-dir>/cache/<sha256(URI)>-<etag>. *resume (in/out, malloc'd
 * relative dir or NULL) may change to the checkpoint actually used;
 * *spec_text (malloc'd) is the job's spec (jobspec_to_json) for the
 * engine with remote paths rewritten to the cache. f (may be NULL) lets
 * another thread cancel the downloads (they then fail with TY_ESTATE); a
 * failed or cancelled download leaves no partial file or checkpoint
 * directory. A failure is a clear reason to fail the start, its field the
 * input's dotted path ("dataset.train"). */
int fetch_prepare_start(srv *s, int64_t job_id, const jobspec *spec, char **resume,
                        char **spec_text, fetch_handle *f, ty_err *err);

#endif
