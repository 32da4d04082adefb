/* disk.h — the data directory's disk (disk.c): its free space, the reserve
 * file that lets the database write on a full disk, the read-only mode a
 * server started on a full disk runs in until space returns, and job
 * directories a delete left behind. */
#ifndef TY_DISK_H
#define TY_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "server.h"

/* Size of DATA_DIR/disk-reserve: room for SQLite's WAL when the disk is
 * full, so final states and deletes are still written. */
#define SRV_RESERVE_BYTES (4LL * 1024 * 1024)

/* Free bytes on the data directory's disk for this user; INT64_MAX when
 * statvfs cannot tell. */
int64_t srv_disk_free(const srv *s);
/* Start: releases a reserve left by the previous run (so the database can
 * set up its files), opens the main handle read-write or, on a full disk,
 * read-only (s->db_mode, logged), removes the directories of deleted jobs,
 * and takes the reserve back when there is room. Installs the db hook that
 * releases the reserve whenever SQLite meets a full disk. */
int srv_disk_start(srv *s, ty_err *err);
/* Gives the reserve's space back to the disk (true when it was held). */
bool srv_disk_release_reserve(srv *s);
/* Deletes a finished job's row, then its directory (which needs no space).
 * On a full disk the reserve is released for the row's WAL; failing that,
 * the directory goes first (the delete asks for it anyway, and its space
 * lets the row be written; a read-only server becomes writable if it now
 * can). Errors as db_job_delete's (TY_ENOSPC when the row still cannot be
 * written: its files are gone, a retry removes the row). */
int srv_disk_delete_job(srv *s, int64_t id, ty_err *err);
/* About once a second (the scheduler's loop): a read-only server becomes
 * writable once the disk has room again (every thread's handle is then
 * reopened read-write), and a released reserve is taken back. */
void srv_disk_tick(srv *s);
/* Can the database be written (not the read-only mode)? */
bool srv_disk_writable(const srv *s);
/* May a job start: writable, and the disk has SRV_MIN_FREE_BYTES (a start
 * writes the spec, the engine's log and checkpoints; on a full disk it
 * would fail the job)? */
bool srv_disk_can_start(const srv *s);

#endif
