/* fetch.c — before an engine starts: the resume checkpoint made local
 * (downloaded from checkpoint.store when its directory is gone) and remote
 * model / dataset URIs fetched into <data>/cache (see fetch.h).
 *
 * The cache is keyed by the URI and the object's ETag (a directory by every
 * object's key, size and ETag), and filled beside its final name and renamed
 * into place, so a present entry is a complete one and a changed object is
 * fetched again. A start's transfers register with its fetch_handle, which
 * another thread may cancel (pause, cancel, shutdown). */
#include "fetch.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"
#include "storage.h"
#include "tyutil.h"
#include "upload.h"
#include "tyjson.h"

static bool is_remote(const char *p)
{
    return p && (!strncmp(p, "s3://", 5) || !strncmp(p, "gs://", 5) || !strncmp(p, "az://", 5));
}

static bool local_checkpoint_ok(const char *jobdir, const char *dir)
{
    char m[PATH_MAX + 600];
    struct stat sb;
    snprintf(m, sizeof m, "%s/%s/MANIFEST.json", jobdir, dir);
    return stat(m, &sb) == 0;
}

/* ---- fetch handles: one start's downloads, cancellable from another thread ---- */

struct fetch_handle {
    pthread_mutex_t mu;
    store *st;      /* the store of the transfer running now, or NULL */
    bool cancelled; /* set once; every later open is cancelled at once */
};

fetch_handle *fetch_handle_new(void)
{
    fetch_handle *f = calloc(1, sizeof *f);
    if (f) pthread_mutex_init(&f->mu, NULL);
    return f;
}

void fetch_handle_cancel(fetch_handle *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->cancelled = true;
    if (f->st) store_cancel(f->st);
    pthread_mutex_unlock(&f->mu);
}

void fetch_handle_free(fetch_handle *f)
{
    if (!f) return;
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* store_open with the server's credentials, registered with f (may be NULL) so fetch_handle_cancel can
 * abort its transfers; a cancel that came first aborts it at once. */
static int fetch_open(srv *s, fetch_handle *f, const char *uri, store **out, ty_err *err)
{
    store_config cfg;
    srv_store_config(&s->cfg, &cfg);
    int rc = store_open(uri, &cfg, out, err);
    if (rc || !f) return rc;
    pthread_mutex_lock(&f->mu);
    f->st = *out;
    if (f->cancelled) store_cancel(*out);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static void fetch_close(fetch_handle *f, store *st)
{
    if (f) {
        pthread_mutex_lock(&f->mu);
        if (f->st == st) f->st = NULL;
        pthread_mutex_unlock(&f->mu);
    }
    store_close(st);
}

/* Makes the checkpoint to resume from local; see fetch_prepare_start. */
static int prepare_resume(srv *s, fetch_handle *f, int64_t job_id, const char *store_root,
                          char **resume, ty_err *err)
{
    char jobdir[PATH_MAX];
    srv_job_dir(s, job_id, jobdir, sizeof jobdir);
    /* Only a resume needs a checkpoint; one on disk is used as it is, and
     * without a store the engine reports a missing one itself. */
    if (!*resume || !store_root || local_checkpoint_ok(jobdir, *resume)) return 0;
    db *d = srv_db(s);
    db_checkpoint *c = NULL;
    int n = 0, rc;
    if (!d || (rc = db_checkpoint_list(d, job_id, &c, &n, err))) return d ? rc : TY_EIO;
    /* The newest committed copy, unless a local one is newer still. */
    int pick = -1;
    for (int i = n - 1; i >= 0 && pick < 0; i--)
        if (!strcmp(c[i].state, "committed") && c[i].remote_uri) pick = i;
    if (pick < 0) {
        rc = ty_err_set(err, TY_ENOENT,
                        "cannot resume: checkpoint %s is not on disk and the job "
                        "has no committed remote checkpoint",
                        *resume);
        db_checkpoints_free(c, n);
        return rc;
    }
    char local[PATH_MAX + 600], prefix[600];
    snprintf(local, sizeof local, "%s/%s", jobdir, c[pick].dir);
    upload_remote_prefix(job_id, c[pick].dir, prefix, sizeof prefix);
    store *st = NULL;
    if ((rc = ty_mkdir_p(local, err)) == 0 && (rc = fetch_open(s, f, store_root, &st, err)) == 0) {
        rc = store_get_checkpoint(st, prefix, local, err);
        fetch_close(f, st);
    }
    if (rc) {
        /* Its manifest is written last, so what is there is no checkpoint:
         * a failed or cancelled download leaves nothing behind. */
        ty_err e2 = {0};
        ty_rm_rf(local, &e2);
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        ty_err_set(err, rc, "cannot resume: download of checkpoint %s failed: %s", c[pick].dir, m);
    } else {
        fprintf(stderr,
                "trainyard: job %lld: checkpoint %s downloaded from the store and verified\n",
                (long long)job_id, c[pick].dir);
        free(*resume);
        *resume = strdup(c[pick].dir);
        if (!*resume) rc = ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    db_checkpoints_free(c, n);
    return rc;
}

/* Splits "s3://bucket/a/b.jsonl" into the parent URI and the last segment. */
static int split_uri(const char *uri, char *parent, size_t cap, const char **base, ty_err *err)
{
    const char *slash = strrchr(uri, '/');
    const char *bucket = strstr(uri, "://") + 3;
    if (!slash || slash < bucket || !slash[1])
        return ty_err_set(err, TY_EINVAL, "%s names no object (bucket/key expected)", uri);
    snprintf(parent, cap, "%.*s", (int)(slash - uri), uri);
    *base = slash + 1;
    return 0;
}

/* Keeps only characters safe in a directory name (ETags carry quotes and dashes). */
static void safe_tag(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    for (; *in && k + 1 < cap; in++)
        if ((*in >= 'a' && *in <= 'z') || (*in >= 'A' && *in <= 'Z') ||
            (*in >= '0' && *in <= '9') || *in == '-')
            out[k++] = *in;
    out[k] = 0;
}

/* A remote file into <data>/cache/<sha256(URI)>-<etag>/<name>. */
static int cache_file(srv *s, fetch_handle *f, const char *uri, char *out, size_t cap, ty_err *err)
{
    char parent[2048], key_hash[65], tag[96], dir[PATH_MAX];
    const char *base = NULL;
    int rc = split_uri(uri, parent, sizeof parent, &base, err);
    if (rc) return rc;
    store *st = NULL;
    if ((rc = fetch_open(s, f, parent, &st, err))) return rc;
    store_object o = {0};
    if ((rc = store_stat(st, base, &o, err)) == 0) {
        ty_sha256_hex(uri, strlen(uri), key_hash);
        safe_tag(o.etag, tag, sizeof tag);
        if (!tag[0])
            snprintf(tag, sizeof tag, "%llu-%lld", (unsigned long long)o.size, (long long)o.mtime);
        snprintf(dir, sizeof dir, "%.3900s/cache/%.32s-%s", s->cfg.data_dir, key_hash, tag);
        snprintf(out, cap, "%s/%s", dir, base);
        struct stat sb;
        if (stat(out, &sb) != 0) {
            /* store_get_file writes .part and renames after verification,
             * so a present file is a complete one. */
            if ((rc = ty_mkdir_p(dir, err)) == 0) rc = store_get_file(st, base, out, err);
            if (rc) rmdir(dir); /* only if empty: a failed get removed its .part */
        }
        store_object_clear(&o);
    }
    fetch_close(f, st);
    return rc;
}

/* A remote directory (every object under the URI) into the cache, keyed by
 * the URI and a hash of every object's key and ETag. */
static int cache_dir(srv *s, fetch_handle *f, const char *uri, char *out, size_t cap, ty_err *err)
{
    store *st = NULL;
    int rc = fetch_open(s, f, uri, &st, err);
    if (rc) return rc;
    store_listing l = {0};
    if ((rc = store_list(st, "", &l, err)) == 0 && l.n == 0)
        rc = ty_err_set(err, TY_ENOENT, "%s holds no objects", uri);
    if (rc == 0) {
        /* Content key: the keys, sizes and ETags of the listing. */
        size_t len = 0;
        for (size_t i = 0; i < l.n; i++)
            len += strlen(l.items[i].key) + strlen(l.items[i].etag) + 24;
        char *buf = malloc(len + 1), *p = buf;
        if (!buf) rc = ty_err_set(err, TY_ENOMEM, "out of memory");
        for (size_t i = 0; buf && i < l.n; i++)
            p += sprintf(p, "%s\n%llu\n%s\n", l.items[i].key, (unsigned long long)l.items[i].size,
                         l.items[i].etag);
        char key_hash[65], content[65], dir[PATH_MAX], part[PATH_MAX + 8];
        if (buf) {
            ty_sha256_hex(uri, strlen(uri), key_hash);
            ty_sha256_hex(buf, (size_t)(p - buf), content);
            free(buf);
            snprintf(dir, sizeof dir, "%.3900s/cache/%.32s-%.16s", s->cfg.data_dir, key_hash,
                     content);
            snprintf(out, cap, "%s", dir);
            struct stat sb;
            if (stat(dir, &sb) != 0) {
                /* Downloaded beside, renamed into place whole. */
                snprintf(part, sizeof part, "%s.part", dir);
                ty_err e2 = {0};
                ty_rm_rf(part, &e2);
                for (size_t i = 0; i < l.n && rc == 0; i++) {
                    char path[PATH_MAX * 2], *slash;
                    snprintf(path, sizeof path, "%s/%s", part, l.items[i].key);
                    if ((slash = strrchr(path, '/'))) {
                        *slash = 0;
                        rc = ty_mkdir_p(path, err);
                        *slash = '/';
                    }
                    if (rc == 0) rc = store_get_file(st, l.items[i].key, path, err);
                }
                if (rc == 0 && rename(part, dir) != 0)
                    rc = ty_err_set(err, TY_EIO, "cannot rename %s: %s", part, strerror(errno));
                if (rc) ty_rm_rf(part, &e2);
            }
        }
    }
    store_listing_free(&l);
    fetch_close(f, st);
    return rc;
}

/* A remote input (field names it: "dataset.train") fetched into the
 * cache: *uri then points at the local copy in local[]. A local or absent
 * one stays as it is. */
static int localize(srv *s, fetch_handle *f, const char *field, const char **uri, bool dir,
                    char *local, size_t cap, ty_err *err)
{
    if (!is_remote(*uri)) return 0;
    int rc = dir ? cache_dir(s, f, *uri, local, cap, err) : cache_file(s, f, *uri, local, cap, err);
    if (rc) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        return ty_err_field(err, rc, field, "cannot fetch %s (%s): %s", field, *uri, m);
    }
    *uri = local;
    return 0;
}

bool fetch_needed(srv *s, int64_t job_id, const jobspec *spec, const char *resume)
{
    char jobdir[PATH_MAX];
    srv_job_dir(s, job_id, jobdir, sizeof jobdir);
    return (resume && spec->store && !local_checkpoint_ok(jobdir, resume)) ||
           is_remote(spec->model_path) || is_remote(spec->train) || is_remote(spec->eval);
}

/* The engine's spec: the job's with its remote inputs fetched and named by
 * their cached copies (a shallow copy of the struct: the strings stay the
 * job's or the buffers'). */
static int engine_spec(srv *s, fetch_handle *f, const jobspec *spec, char **spec_text, ty_err *err)
{
    char model[PATH_MAX * 2], train[PATH_MAX * 2], eval[PATH_MAX * 2];
    const char *mp = spec->model_path, *tp = spec->train, *ep = spec->eval;
    int rc = localize(s, f, "model.path", &mp, true, model, sizeof model, err);
    if (!rc) rc = localize(s, f, "dataset.train", &tp, false, train, sizeof train, err);
    if (!rc) rc = localize(s, f, "dataset.eval", &ep, false, eval, sizeof eval, err);
    if (rc) return rc;
    jobspec eng = *spec;
    eng.model_path = (char *)mp;
    eng.train = (char *)tp;
    eng.eval = (char *)ep;
    json_t *j = jobspec_to_json(&eng);
    *spec_text = j ? ty_json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    return *spec_text ? 0 : ty_err_set(err, TY_ENOMEM, "out of memory");
}

int fetch_prepare_start(srv *s, int64_t job_id, const jobspec *spec, char **resume,
                        char **spec_text, fetch_handle *f, ty_err *err)
{
    *spec_text = NULL;
    int rc = prepare_resume(s, f, job_id, spec->store, resume, err);
    return rc ? rc : engine_spec(s, f, spec, spec_text, err);
}
