/* file.c — the file:// backend: a directory tree as an object store.
 *
 * Useful on its own (a shared filesystem, an NFS mount) and as the
 * reference the remote backends are tested against. Puts copy into a
 * hidden temporary file beside the target, fsync and rename, so an object
 * appears whole or not at all, like a remote PUT.
 *
 * A server confines file:// stores to its store roots (store_config's
 * file_roots, kept in s->impl): checked when the store is opened and on
 * every object path before it is used, with symlinks resolved, so a link
 * swapped into the tree later cannot redirect a write or a delete. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_int.h"
#include "tyopen.h"
#include "tyutil.h"

#define TMP_MARK ".ty-part-"

static int file_path(store *s, const char *key, char **out, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    size_t n = strlen(s->bucket) + strlen(full) + 2;
    *out = malloc(n);
    if (!*out) {
        free(full);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    snprintf(*out, n, "%s/%s", s->bucket, full);
    free(full);
    if (s->impl && !ty_path_within_roots(*out, s->impl)) {
        free(*out);
        *out = NULL;
        return ty_err_set(err, TY_EAUTH, "storage: %s leads outside the store roots", s->uri);
    }
    return 0;
}

/* Streams src into dst (both open). */
static int copy_fd(int in, int out, const char *what, ty_err *err)
{
    enum { BUF = 1 << 20 };
    char *buf = malloc(BUF);
    if (!buf) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    int rc = 0;
    for (;;) {
        ssize_t r = read(in, buf, BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = ty_err_set(err, TY_EIO, "storage: reading %s: %s", what, strerror(errno));
            break;
        }
        if (r == 0) break;
        for (ssize_t done = 0; done < r;) {
            ssize_t w = write(out, buf + done, (size_t)(r - done));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                rc = ty_err_set(err, TY_EIO, "storage: writing %s: %s", what, strerror(errno));
                goto out;
            }
            done += w;
        }
    }
out:
    free(buf);
    return rc;
}

static int file_put(store *s, const char *key, const char *path, ty_err *err)
{
    char *dst;
    int rc = file_path(s, key, &dst, err);
    if (rc) return rc;
    char *slash = strrchr(dst, '/');
    *slash = '\0';
    rc = ty_mkdir_p(dst, err);
    if (rc == 0 && s->impl && !ty_path_within_roots(dst, s->impl))
        rc = ty_err_set(err, TY_EAUTH, "storage: %s leads outside the store roots", s->uri);
    size_t tl = strlen(dst) + strlen(TMP_MARK) + 32;
    char *tmp = malloc(tl);
    if (rc == 0 && !tmp) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0)
        snprintf(tmp, tl, "%s/" TMP_MARK "%ld-%lx", dst, (long)getpid(),
                 (unsigned long)pthread_self());
    *slash = '/';
    int in = -1, out = -1;
    if (rc == 0 && (in = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        rc = ty_err_set(err, TY_ENOENT, "storage: cannot read '%s': %s", path, strerror(errno));
    if (rc == 0 && (out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = ty_err_set(err, TY_EIO, "storage: cannot create '%s': %s", tmp, strerror(errno));
    if (rc == 0) rc = copy_fd(in, out, path, err);
    if (rc == 0 && fsync(out) != 0)
        rc = ty_err_set(err, TY_EIO, "storage: fsync: %s", strerror(errno));
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = ty_err_set(err, TY_EIO, "storage: close: %s", strerror(errno));
    if (in >= 0) close(in);
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = ty_err_set(err, TY_EIO, "storage: rename to '%s': %s", dst, strerror(errno));
    if (rc == 0) {
        *slash = '\0';
        rc = ty_fsync_dir(dst, err);
    } else if (tmp) {
        unlink(tmp);
    }
    free(tmp);
    free(dst);
    return rc;
}

typedef struct file_get_ctx {
    const char *src;
} file_get_ctx;

static int file_fetch(void *vctx, int fd, ty_err *err)
{
    file_get_ctx *c = vctx;
    int in = open(c->src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return ty_err_set(err, errno == ENOENT ? TY_ENOENT : TY_EIO, "storage: %s: %s", c->src,
                          strerror(errno));
    int rc = copy_fd(in, fd, c->src, err);
    close(in);
    return rc;
}

static int file_get(store *s, const char *key, const char *path, ty_err *err)
{
    char *src;
    int rc = file_path(s, key, &src, err);
    if (rc) return rc;
    struct stat st;
    if (stat(src, &st) != 0 || !S_ISREG(st.st_mode))
        rc = ty_err_set(err, TY_ENOENT, "storage: %s: no such object", src);
    file_get_ctx c = {src};
    if (rc == 0) rc = store_download_to(path, file_fetch, &c, err);
    free(src);
    return rc;
}

static int file_stat(store *s, const char *key, store_object *out, ty_err *err)
{
    char *p;
    int rc = file_path(s, key, &p, err);
    if (rc) return rc;
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = ty_err_set(err, TY_ENOENT, "storage: %s: no such object", p);
    } else {
        out->key = strdup(key);
        out->size = (uint64_t)st.st_size;
        out->mtime = (int64_t)st.st_mtime;
        snprintf(out->etag, sizeof out->etag, "%llx-%llx", (unsigned long long)st.st_mtim.tv_sec,
                 (unsigned long long)st.st_size);
        if (!out->key) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    free(p);
    return rc;
}

/* Depth-first walk of dir (whose object name is rel) adding files whose
 * names start with prefix. */
static int walk(store *s, const char *dir, const char *rel, const char *prefix, store_listing *out,
                int depth, ty_err *err)
{
    if (depth > 64) return 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT
                   ? 0
                   : ty_err_set(err, TY_EIO, "storage: list %s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            !strncmp(e->d_name, TMP_MARK, strlen(TMP_MARK)))
            continue;
        size_t pl = strlen(dir) + strlen(e->d_name) + 2, rl = strlen(rel) + strlen(e->d_name) + 2;
        char *p = malloc(pl), *r = malloc(rl);
        if (!p || !r) {
            free(p);
            free(r);
            rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
            break;
        }
        snprintf(p, pl, "%s/%s", dir, e->d_name);
        snprintf(r, rl, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                /* Descend only where the prefix can still match. */
                size_t n = strlen(r);
                if (!strncmp(r, prefix, n < strlen(prefix) ? n : strlen(prefix)))
                    rc = walk(s, p, r, prefix, out, depth + 1, err);
            } else if (S_ISREG(st.st_mode) && !strncmp(r, prefix, strlen(prefix))) {
                char et[80];
                snprintf(et, sizeof et, "%llx-%llx", (unsigned long long)st.st_mtim.tv_sec,
                         (unsigned long long)st.st_size);
                rc = store_listing_add(out, r, (uint64_t)st.st_size, et, (int64_t)st.st_mtime, err);
            }
        }
        free(p);
        free(r);
    }
    closedir(d);
    return rc;
}

static int file_list(store *s, const char *prefix, store_listing *out, ty_err *err)
{
    size_t n = strlen(s->bucket) + strlen(s->prefix) + 2;
    char *root = malloc(n);
    if (!root) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    snprintf(root, n, "%s/%s", s->bucket, s->prefix);
    int rc = walk(s, root, "", prefix, out, 0, err);
    free(root);
    return rc;
}

static int file_del(store *s, const char *key, ty_err *err)
{
    char *p;
    int rc = file_path(s, key, &p, err);
    if (rc) return rc;
    if (unlink(p) != 0) {
        rc = errno == ENOENT
                 ? ty_err_set(err, TY_ENOENT, "storage: %s: no such object", p)
                 : ty_err_set(err, TY_EIO, "storage: delete %s: %s", p, strerror(errno));
    } else {
        /* Remove directories left empty, up to the store root, so deleted
         * checkpoints do not leave a tree of empty folders behind. */
        size_t rootlen = strlen(s->bucket);
        char *sl;
        while ((sl = strrchr(p, '/')) && (size_t)(sl - p) > rootlen) {
            *sl = '\0';
            if (rmdir(p) != 0) break;
        }
    }
    free(p);
    return rc;
}

static void file_close(store *s)
{
    free(s->impl);
    s->impl = NULL;
}

static const store_backend file_backend = {"file",    file_put, file_get,  file_stat,
                                           file_list, file_del, file_close};

int store_file_open(store *s, const store_config *cfg, ty_err *err)
{
    s->be = &file_backend;
    size_t n = strlen(s->bucket);
    while (n > 1 && s->bucket[n - 1] == '/')
        s->bucket[--n] = '\0';
    if (!cfg || !cfg->file_roots) return 0;
    if (!cfg->file_roots[0])
        return ty_err_set(err, TY_EAUTH,
                          "storage: file:// stores are not allowed here (no store roots)");
    if (!ty_path_within_roots(s->bucket, cfg->file_roots))
        return ty_err_set(err, TY_EAUTH, "storage: %s is outside the store roots (%s)", s->uri,
                          cfg->file_roots);
    if (!(s->impl = strdup(cfg->file_roots)))
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    return 0;
}
