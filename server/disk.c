/* disk.c — a full disk never misreports and never locks the operator out.
 *
 * The reserve: DATA_DIR/disk-reserve, SRV_RESERVE_BYTES allocated while
 * the disk has room. When SQLite meets a full disk (the db hook), the
 * reserve is deleted, so the write retried next (a job's final state, a
 * DELETE's row) has room for its WAL pages; it is taken back once the disk
 * has room for it again and for submits (srv_disk_tick, after a DELETE).
 *
 * Read-only mode: at start a reserve left by the previous run is released
 * first, so the database can usually be opened as always. When even then
 * SQLite cannot set up its -shm file, the server opens every handle
 * read-only (through the WAL, or the main file alone when the WAL is
 * empty), answers reads, refuses writes with 503 `disk_full`, and says so
 * in /healthz. Once the disk has room the mode is lifted: the generation
 * s->db_gen moves and each thread opens a read-write handle at its next
 * use (state.c), so writes work again without a restart.
 *
 * Deleting a job removes its row first, then its directory (which needs no
 * space); a directory whose job has no row (a crash between the two) is
 * removed at the next start. When even the reserve cannot make room for
 * the row, the directory goes first: the delete asks for it anyway, and
 * its space lets the row be written (a retry finishes a delete whose row
 * still could not be). */
#include "disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "recovery.h"
#include "state.h"
#include "tyutil.h"

static const char *const mode_names[] = {"read-write", "read-only", "read-only (main file)"};

static void reserve_path(const srv *s, char *out, size_t cap)
{
    snprintf(out, cap, "%.4000s/disk-reserve", s->cfg.data_dir);
}

int64_t srv_disk_free(const srv *s)
{
    struct statvfs v;
    if (statvfs(s->cfg.data_dir, &v) != 0) return INT64_MAX;
    return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}

bool srv_disk_writable(const srv *s)
{
    return atomic_load(&s->db_mode) == DB_RW;
}

bool srv_disk_can_start(const srv *s)
{
    return srv_disk_writable(s) && srv_disk_free(s) >= SRV_MIN_FREE_BYTES;
}

bool srv_disk_release_reserve(srv *s)
{
    char p[PATH_MAX];
    reserve_path(s, p, sizeof p);
    atomic_store(&s->reserve_held, false);
    if (unlink(p) != 0) return false;
    fprintf(stderr,
            "trainyard: the data directory's disk is full: released the %lld MiB reserve "
            "so the database can write\n",
            SRV_RESERVE_BYTES >> 20);
    return true;
}

/* Takes the reserve back when the disk has room for it and for submits. */
static void reserve_take(srv *s)
{
    if (atomic_load(&s->reserve_held) || !srv_disk_writable(s)) return;
    if (srv_disk_free(s) < SRV_RESERVE_BYTES + 2 * SRV_MIN_FREE_BYTES) return;
    char p[PATH_MAX];
    reserve_path(s, p, sizeof p);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    int rc = posix_fallocate(fd, 0, (off_t)SRV_RESERVE_BYTES);
    if (rc == 0 && fsync(fd) != 0) rc = errno;
    close(fd);
    if (rc) {
        unlink(p);
        return;
    }
    atomic_store(&s->reserve_held, true);
}

/* SQLite met a full disk (or an I/O error while little space is left). */
static void on_full(void *ctx, bool full)
{
    srv *s = ctx;
    if (atomic_load(&s->reserve_held) && (full || srv_disk_free(s) < SRV_MIN_FREE_BYTES))
        srv_disk_release_reserve(s);
}

/* Is the WAL empty or absent (the main file then holds every commit)? */
static bool wal_empty(const srv *s)
{
    char p[PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s-wal", s->db_path);
    return stat(p, &st) != 0 || st.st_size == 0;
}

/* Read-write, else read-only on a full disk; the mode goes to s->db_mode. */
static int open_main(srv *s, ty_err *err)
{
    db *d = NULL;
    int rc = db_open_mode(s->db_path, DB_RW, &d, err);
    if (rc == 0 || srv_disk_free(s) >= SRV_MIN_FREE_BYTES) {
        db_close(d);
        return rc;
    }
    ty_err why = *err;
    db_mode m = DB_RO;
    rc = db_open_mode(s->db_path, m, &d, err);
    if (rc && wal_empty(s)) rc = db_open_mode(s->db_path, (m = DB_IMMUTABLE), &d, err);
    if (rc) return ty_err_set(err, why.code, "%s (the disk is full)", why.msg);
    db_close(d);
    atomic_store(&s->db_mode, (int)m);
    fprintf(stderr,
            "trainyard: the data directory's disk is full (%lld bytes free): serving %s; writes "
            "answer 503 disk_full until space is freed\n",
            (long long)srv_disk_free(s), mode_names[m]);
    return 0;
}

/* Directories of jobs without a row: a delete stopped between the two.
 * Only ids this database gave out (a directory beyond them belongs to
 * some other database, and is left alone). */
static void sweep_jobs(srv *s)
{
    db *d = srv_db(s);
    int64_t max_id = 0;
    ty_err merr = {0};
    if (!d || db_job_max_id(d, &max_id, &merr)) return;
    DIR *dh = opendir(s->jobs_dir);
    struct dirent *de;
    while (dh && (de = readdir(dh))) {
        char *end;
        long long id = strtoll(de->d_name, &end, 10);
        if (id <= 0 || id > max_id || *end || de->d_name[0] == '0') continue;
        db_job j;
        ty_err err = {0};
        if (db_job_get(d, id, &j, &err) == 0) {
            db_job_free(&j);
            continue;
        }
        if (err.code != TY_ENOENT) continue;
        char dir[PATH_MAX];
        srv_job_dir(s, id, dir, sizeof dir);
        if (ty_rm_rf(dir, &err) == 0)
            fprintf(stderr, "trainyard: removed %s: its job was deleted\n", dir);
    }
    if (dh) closedir(dh);
}

int srv_disk_start(srv *s, ty_err *err)
{
    char p[PATH_MAX];
    reserve_path(s, p, sizeof p);
    atomic_store(&s->reserve_held, false);
    unlink(p); /* the previous run's: its space lets the database open */
    db_set_full_hook(on_full, s);
    int rc = open_main(s, err);
    if (rc) return rc;
    if (!srv_db(s)) return ty_err_set(err, TY_EIO, "cannot open %s", s->db_path);
    if (srv_disk_writable(s)) sweep_jobs(s);
    reserve_take(s);
    return 0;
}

/* A read-only server whose database opens read-write again becomes
 * writable: every thread reopens its handle at its next use. */
static void try_writable(srv *s)
{
    db *d = NULL;
    ty_err err = {0};
    if (srv_disk_writable(s) || db_open_mode(s->db_path, DB_RW, &d, &err)) return;
    db_close(d);
    atomic_store(&s->db_mode, DB_RW);
    atomic_fetch_add(&s->db_gen, 1);
    fprintf(stderr,
            "trainyard: the data directory's disk has room again (%lld bytes free): the "
            "database is writable\n",
            (long long)srv_disk_free(s));
}

void srv_disk_tick(srv *s)
{
    int64_t now = ty_mono_ms();
    if (now < atomic_load(&s->disk_tick_ms)) return;
    atomic_store(&s->disk_tick_ms, now + 1000);
    if (!srv_disk_writable(s) && srv_disk_free(s) >= SRV_MIN_FREE_BYTES) try_writable(s);
    reserve_take(s);
}

int srv_disk_delete_job(srv *s, int64_t id, ty_err *err)
{
    char dir[PATH_MAX];
    srv_job_dir(s, id, dir, sizeof dir);
    db *d = srv_db(s);
    bool reserve = atomic_load(&s->reserve_held); /* the failure below releases it */
    int rc = d ? db_job_delete(d, id, err) : ty_err_set(err, TY_EIO, "database unavailable");
    if (rc && err->code == TY_ENOSPC && (srv_disk_release_reserve(s) || reserve)) {
        ty_err_clear(err);
        rc = db_job_delete(d, id, err);
    }
    bool files_first = false;
    if (rc && err->code == TY_ENOSPC) {
        ty_err rm = {0};
        files_first = ty_rm_rf(dir, &rm) == 0;
        try_writable(s);
        ty_err_clear(err);
        d = srv_db(s);
        rc = d ? db_job_delete(d, id, err) : ty_err_set(err, TY_EIO, "database unavailable");
    }
    if (rc && files_first)
        return ty_err_set(err, err->code,
                          "%s; the job's files were removed to make room, and a retry removes "
                          "its row once the database can be written",
                          err->msg);
    if (rc) return rc;
    ty_err rm = {0};
    ty_rm_rf(dir, &rm);
    return 0;
}
