/* checkpoint.c — moving whole checkpoints (DESIGN §6) through a store.
 *
 * The manifest is the commit record: uploads send every file first and
 * MANIFEST.json last, so a remote checkpoint without a manifest is by
 * definition not there; downloads fetch the manifest first, verify every
 * file's size and sha256 against it, and write the local manifest last so
 * a half-downloaded directory is never mistaken for a checkpoint. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_int.h"
#include "tyutil.h"

#define MANIFEST "MANIFEST.json"
#define FORMAT "trainyard-checkpoint/1"

typedef struct ck_file {
    const char *path; /* borrowed from the json */
    uint64_t bytes;
    const char *sha256;
} ck_file;

typedef struct ck_manifest {
    json_t *root;
    ck_file *files;
    size_t n;
} ck_manifest;

static void manifest_free(ck_manifest *m)
{
    json_decref(m->root);
    free(m->files);
    memset(m, 0, sizeof *m);
}

static int path_ok(const char *p)
{
    if (!p || !*p || p[0] == '/' || !strcmp(p, MANIFEST)) return 0;
    const char *seg = p;
    for (;;) {
        const char *e = strchr(seg, '/');
        size_t l = e ? (size_t)(e - seg) : strlen(seg);
        if (l == 0 || (l == 1 && seg[0] == '.') || (l == 2 && !strncmp(seg, "..", 2))) return 0;
        if (!e) return 1;
        seg = e + 1;
    }
}

static int manifest_load(const char *file, const char *what, ck_manifest *m, ty_err *err)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    m->root = json_load_file(file, 0, &je);
    if (!m->root)
        return ty_err_field(err, TY_ECORRUPT, MANIFEST, "storage: %s: not valid JSON (line %d: %s)",
                            what, je.line, ty_json_error(&je));
    const char *fmt = json_string_value(json_object_get(m->root, "format"));
    json_t *files = json_object_get(m->root, "files");
    int rc = 0;
    if (!fmt || strcmp(fmt, FORMAT))
        rc = ty_err_field(err, TY_ECORRUPT, "format", "storage: %s: format is not \"%s\"", what,
                          FORMAT);
    else if (!json_is_array(files) || json_array_size(files) == 0)
        rc = ty_err_field(err, TY_ECORRUPT, "files", "storage: %s: no files listed", what);
    if (rc) {
        manifest_free(m);
        return rc;
    }
    m->n = json_array_size(files);
    m->files = calloc(m->n, sizeof *m->files);
    if (!m->files) {
        manifest_free(m);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    for (size_t i = 0; i < m->n; i++) {
        json_t *f = json_array_get(files, i);
        ck_file *c = &m->files[i];
        c->path = json_string_value(json_object_get(f, "path"));
        json_t *b = json_object_get(f, "bytes");
        c->sha256 = json_string_value(json_object_get(f, "sha256"));
        if (!path_ok(c->path) || !json_is_integer(b) || json_integer_value(b) < 0 || !c->sha256 ||
            strlen(c->sha256) != 64) {
            rc = ty_err_field(err, TY_ECORRUPT, "files",
                              "storage: %s: entry %zu needs a relative path, bytes and a sha256",
                              what, i);
            manifest_free(m);
            return rc;
        }
        c->bytes = (uint64_t)json_integer_value(b);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(m->files[k].path, c->path)) {
                rc = ty_err_field(err, TY_ECORRUPT, "files", "storage: %s: '%s' listed twice", what,
                                  c->path);
                manifest_free(m);
                return rc;
            }
    }
    return 0;
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *o = malloc(n);
    if (o) snprintf(o, n, "%s/%s", a, b);
    return o;
}

/* Remote prefix without trailing slashes; validated as a key. */
static int clean_prefix(store *s, const char *remote_prefix, char **out, ty_err *err)
{
    *out = NULL;
    if (!remote_prefix) return ty_err_set(err, TY_EINVAL, "storage: no remote prefix");
    char *p = strdup(remote_prefix);
    if (!p) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    size_t n = strlen(p);
    while (n && p[n - 1] == '/')
        p[--n] = '\0';
    char *full;
    int rc = store_full_key(s, p, &full, err);
    if (rc) {
        free(p);
        return rc;
    }
    free(full);
    *out = p;
    return 0;
}

static int verify_local(const char *path, const ck_file *f, ty_err *err)
{
    char hex[65];
    uint64_t bytes;
    int rc = ty_sha256_file(path, hex, &bytes, err);
    if (rc) return rc;
    if (bytes != f->bytes)
        return ty_err_field(err, TY_ECORRUPT, f->path,
                            "storage: %s: %llu bytes, manifest says %llu", f->path,
                            (unsigned long long)bytes, (unsigned long long)f->bytes);
    if (strcmp(hex, f->sha256))
        return ty_err_field(err, TY_ECORRUPT, f->path,
                            "storage: %s: sha256 does not match the manifest", f->path);
    return 0;
}

int store_put_checkpoint(store *s, const char *local_dir, const char *remote_prefix,
                         uint64_t *bytes_out, ty_err *err)
{
    if (bytes_out) *bytes_out = 0;
    char *prefix = NULL, *mpath = join(local_dir, MANIFEST);
    if (!mpath) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    ck_manifest m;
    int rc = clean_prefix(s, remote_prefix, &prefix, err);
    if (rc == 0) rc = manifest_load(mpath, mpath, &m, err);
    if (rc) {
        free(prefix);
        free(mpath);
        return rc;
    }
    uint64_t total = 0;
    /* Check the local files first: uploading a torn checkpoint would commit
     * garbage under a valid manifest. */
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        char *lp = join(local_dir, m.files[i].path);
        rc = lp ? verify_local(lp, &m.files[i], err)
                : ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        free(lp);
    }
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        char *lp = join(local_dir, m.files[i].path), *key = join(prefix, m.files[i].path);
        if (!lp || !key) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        if (rc == 0) rc = store_put_file(s, key, lp, err);
        if (rc == 0) total += m.files[i].bytes;
        free(lp);
        free(key);
    }
    /* Every file is there with its size before the manifest goes up. */
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        char *key = join(prefix, m.files[i].path);
        store_object o;
        rc = key ? store_stat(s, key, &o, err)
                 : ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        if (rc == 0 && o.size != m.files[i].bytes)
            rc = ty_err_field(err, TY_ECORRUPT, m.files[i].path,
                              "storage: %s landed with %llu bytes, expected %llu", m.files[i].path,
                              (unsigned long long)o.size, (unsigned long long)m.files[i].bytes);
        store_object_clear(&o);
        free(key);
    }
    if (rc == 0) {
        char *key = join(prefix, MANIFEST);
        rc = key ? store_put_file(s, key, mpath, err)
                 : ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        free(key);
    }
    if (rc == 0 && bytes_out) *bytes_out = total;
    manifest_free(&m);
    free(prefix);
    free(mpath);
    return rc;
}

/* mkdir -p of the directory part of path. */
static int mkparent(const char *path, ty_err *err)
{
    char *d = strdup(path);
    if (!d) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    char *sl = strrchr(d, '/');
    int rc = 0;
    if (sl && sl != d) {
        *sl = '\0';
        rc = ty_mkdir_p(d, err);
    }
    free(d);
    return rc;
}

int store_get_checkpoint(store *s, const char *remote_prefix, const char *local_dir, ty_err *err)
{
    char *prefix = NULL;
    int rc = clean_prefix(s, remote_prefix, &prefix, err);
    if (rc) return rc;
    if ((rc = ty_mkdir_p(local_dir, err)) != 0) {
        free(prefix);
        return rc;
    }
    char *mkey = join(prefix, MANIFEST), *mfinal = join(local_dir, MANIFEST),
         *mtmp = join(local_dir, ".MANIFEST.json.dl");
    ck_manifest m = {0};
    if (!mkey || !mfinal || !mtmp) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        rc = store_get_file(s, mkey, mtmp, err);
        if (rc == TY_ENOENT)
            rc = ty_err_set(err, TY_ENOENT, "storage: %s/%s: no committed checkpoint (no manifest)",
                            store_uri(s), prefix);
    }
    if (rc == 0) rc = manifest_load(mtmp, mkey, &m, err);
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        char *lp = join(local_dir, m.files[i].path), *key = join(prefix, m.files[i].path);
        if (!lp || !key) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        if (rc == 0) rc = mkparent(lp, err);
        /* A multipart object has no whole-object MD5 to check on the way
         * in, so the manifest's sha256 is the check; a mismatch gets one
         * more download before it is reported. */
        for (int attempt = 0; rc == 0 && attempt < 2; attempt++) {
            rc = store_get_file(s, key, lp, err);
            if (rc) break;
            rc = verify_local(lp, &m.files[i], err);
            if (rc == 0) break;
            unlink(lp);
            if (rc != TY_ECORRUPT || attempt == 1) break;
            rc = 0;
        }
        free(lp);
        free(key);
    }
    if (rc == 0 && rename(mtmp, mfinal) != 0)
        rc = ty_err_set(err, TY_EIO, "storage: rename %s: %s", mfinal, strerror(errno));
    if (rc == 0) rc = ty_fsync_dir(local_dir, err);
    if (rc != 0 && mtmp) unlink(mtmp);
    manifest_free(&m);
    free(mkey);
    free(mfinal);
    free(mtmp);
    free(prefix);
    return rc;
}

int store_delete_checkpoint(store *s, const char *remote_prefix, ty_err *err)
{
    char *prefix = NULL;
    int rc = clean_prefix(s, remote_prefix, &prefix, err);
    if (rc) return rc;
    char *mkey = join(prefix, MANIFEST);
    if (!mkey) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        rc = store_delete(s, mkey, err);
        if (rc == TY_ENOENT) rc = 0;
    }
    store_listing l = {0};
    if (rc == 0) {
        char *lp = join(prefix, "");
        rc = lp ? store_list(s, lp, &l, err) : ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        free(lp);
    }
    for (size_t i = 0; i < l.n && rc == 0; i++) {
        rc = store_delete(s, l.items[i].key, err);
        if (rc == TY_ENOENT) rc = 0;
    }
    store_listing_free(&l);
    free(mkey);
    free(prefix);
    return rc;
}
