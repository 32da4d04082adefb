/* probe.c — store_probe: can this store be written and cleaned up with
 * these credentials? And store_put_dir: a plain directory's files up as
 * they are (a job's export, which has no manifest).
 *
 * The probe is what the server runs before it accepts a job with a
 * checkpoint.store: it does exactly what the upload queue will do later (a
 * PUT, then a DELETE as retention does) on a small object with a unique
 * name under the store's prefix, so a missing bucket, a refused key or a
 * read-only credential is found before any training time is spent. The
 * object's body lives in an anonymous memory file, so a full local disk is
 * never reported as a store fault. */
#include "store_int.h"

#include <dirent.h>
#include <errno.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROBE_BODY "trainyard store probe: written and deleted before a job runs\n"

int store_probe(store *s, char *key_out, size_t key_cap, ty_err *err)
{
    unsigned char raw[8];
    char key[64];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return ty_err_set(err, TY_EINTERNAL, "storage: no randomness for the probe name");
    int k = snprintf(key, sizeof key, ".trainyard-probe-");
    for (size_t i = 0; i < sizeof raw; i++)
        k += snprintf(key + k, sizeof key - (size_t)k, "%02x", raw[i]);
    if (key_out && key_cap) snprintf(key_out, key_cap, "%s", key);

    int fd = memfd_create("trainyard-probe", MFD_CLOEXEC);
    if (fd < 0) return ty_err_set(err, TY_EIO, "storage: memfd_create: %s", strerror(errno));
    size_t len = strlen(PROBE_BODY);
    if (write(fd, PROBE_BODY, len) != (ssize_t)len) {
        close(fd);
        return ty_err_set(err, TY_EIO, "storage: cannot fill the probe body");
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rc = store_put_file(s, key, path, err);
    close(fd);
    if (rc) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        return ty_err_set(err, rc, "cannot write probe object %s: %s", key, m);
    }
    /* Retention and purge delete; a credential that may write but not
     * delete would leave every old checkpoint behind. An object already
     * gone (eventually consistent listings) counts as deleted. */
    rc = store_delete(s, key, err);
    if (rc == TY_ENOENT) rc = 0;
    if (rc) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        return ty_err_set(err, rc, "wrote probe object %s but cannot delete it: %s", key, m);
    }
    return 0;
}

/* One directory level of store_put_dir; depth bounds a symlink-free but
 * absurdly deep tree. */
static int put_tree(store *s, const char *dir, const char *prefix, int depth, uint64_t *bytes,
                    int *files, ty_err *err)
{
    if (depth > 16) return ty_err_set(err, TY_EINVAL, "storage: %s is nested too deep", dir);
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0)
        return ty_err_set(err, errno == ENOENT ? TY_ENOENT : TY_EIO,
                          "storage: cannot read directory %s: %s", dir, strerror(errno));
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        if (rc || !strcmp(name, ".") || !strcmp(name, "..")) continue;
        size_t lp = strlen(dir) + strlen(name) + 2, lk = strlen(prefix) + strlen(name) + 2;
        char *path = malloc(lp), *key = malloc(lk);
        if (!path || !key) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        struct stat st;
        if (!rc) {
            snprintf(path, lp, "%s/%s", dir, name);
            snprintf(key, lk, "%s/%s", prefix, name);
            if (lstat(path, &st) != 0)
                rc = ty_err_set(err, TY_EIO, "storage: %s: %s", path, strerror(errno));
        }
        if (!rc && S_ISDIR(st.st_mode)) {
            rc = put_tree(s, path, key, depth + 1, bytes, files, err);
        } else if (!rc && S_ISREG(st.st_mode)) {
            rc = store_put_file(s, key, path, err);
            /* Each file is checked where it landed, as checkpoints are. */
            store_object o;
            if (!rc && (rc = store_stat(s, key, &o, err)) == 0) {
                if (o.size != (uint64_t)st.st_size)
                    rc =
                        ty_err_set(err, TY_ECORRUPT,
                                   "storage: %s landed with %llu bytes, "
                                   "expected %llu",
                                   key, (unsigned long long)o.size, (unsigned long long)st.st_size);
                store_object_clear(&o);
            }
            if (!rc) {
                *bytes += (uint64_t)st.st_size;
                (*files)++;
            }
        } else if (!rc) {
            rc = ty_err_set(err, TY_EINVAL, "storage: %s is neither a file nor a directory", path);
        }
        free(path);
        free(key);
    }
    for (int i = 0; i < n; i++)
        free(ents[i]);
    free(ents);
    return rc;
}

int store_put_dir(store *s, const char *local_dir, const char *remote_prefix, uint64_t *bytes_out,
                  int *files_out, ty_err *err)
{
    uint64_t bytes = 0;
    int files = 0;
    if (bytes_out) *bytes_out = 0;
    if (files_out) *files_out = 0;
    if (!remote_prefix || !*remote_prefix)
        return ty_err_set(err, TY_EINVAL, "storage: no remote prefix");
    char *p = strdup(remote_prefix);
    if (!p) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    size_t n = strlen(p);
    while (n && p[n - 1] == '/')
        p[--n] = '\0';
    int rc = put_tree(s, local_dir, p, 0, &bytes, &files, err);
    if (rc == 0 && files == 0)
        rc = ty_err_set(err, TY_ENOENT, "storage: %s holds no files", local_dir);
    free(p);
    if (rc == 0 && bytes_out) *bytes_out = bytes;
    if (rc == 0 && files_out) *files_out = files;
    return rc;
}
