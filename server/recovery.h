/* recovery.h — the disk is the truth about checkpoints (recovery.c):
 * reconciling a job's checkpoint rows with its directory after a crash or
 * restart, manifest checks, and the free-space check before a submit. */
#ifndef TY_RECOVERY_H
#define TY_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

#include "server.h"

/* Makes the job's checkpoint rows agree with its directory (see recovery.c):
 * removes partial directories, adopts complete unknown ones (upload queued
 * with store), marks rows whose directory is gone deleted. *newest gets the
 * newest complete checkpoint's dir (malloc'd; local or committed remote) and
 * *newest_step its step, or NULL / -1. No engine of the job may be alive. */
int rec_reconcile(srv *s, int64_t job_id, const char *store, char **newest, int64_t *newest_step,
                  ty_err *err);
/* Reads dir/MANIFEST.json (its sha256 into sha, the step, the total bytes)
 * and with sums checks every listed file's size and sha256. */
int rec_manifest_check(const char *dir, bool sums, int64_t *step, char sha[65], uint64_t *bytes,
                       ty_err *err);
/* The step of "checkpoints/step-000123", or -1. */
int64_t rec_dir_step(const char *dir);

/* Below this much free space on the data directory's disk, submits are
 * refused with TY_ENOSPC (503): a job could not checkpoint anyway. */
#define SRV_MIN_FREE_BYTES (1024 * 1024)
int srv_disk_check(srv *s, ty_err *err);

#endif
