/* ckpt.c — writing, verifying and pruning checkpoint directories (see ckpt.h).
 *
 * Sums are computed by streaming each file back from disk after it is
 * written and fsynced, so the manifest describes what is actually stored. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "retention.h"
#include "tyutil.h"

void ckpt_rel_name(char *out, size_t n, int64_t step)
{
    snprintf(out, n, "checkpoints/step-%06lld", (long long)step);
}

void ckpt_dir_name(char *out, size_t n, const char *workdir, int64_t step)
{
    snprintf(out, n, "%s/checkpoints/step-%06lld", workdir, (long long)step);
}

int ckpt_begin(const char *dir, ty_err *err)
{
    int rc = ty_rm_rf(dir, err);
    return rc ? rc : ty_mkdir_p(dir, err);
}

int ckpt_commit(const char *dir, int64_t step, const char *const *files, int n,
                uint64_t *total_bytes, ty_err *err)
{
    json_t *arr = json_array();
    uint64_t total = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        char path[4096], hex[65];
        uint64_t bytes = 0;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        rc = ty_sha256_file(path, hex, &bytes, err);
        if (rc) break;
        total += bytes;
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "path", files[i], "bytes",
                                             (json_int_t)bytes, "sha256", hex));
    }
    if (rc) {
        json_decref(arr);
        return rc;
    }
    json_t *m =
        json_pack("{s:s, s:I, s:o}", "format", CKPT_FORMAT, "step", (json_int_t)step, "files", arr);
    char *text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(m);
    if (!text) return ty_err_set(err, TY_ENOMEM, "manifest for %s", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/MANIFEST.json", dir);
    size_t len = strlen(text);
    rc = ty_write_file_atomic(path, text, len, err);
    free(text);
    if (!rc && total_bytes) *total_bytes = total + len;
    return rc;
}

int ckpt_verify(const char *dir, int64_t *step, ty_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/MANIFEST.json", dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ty_err_set(err, TY_ENOENT, "checkpoint %s: no such directory", dir);
    /* Unparsable JSON is reported below, with a manifest of the wrong shape. */
    json_t *m;
    int rc = ty_read_json(path, TY_ECORRUPT, &m, NULL);
    if (rc && rc != TY_ECORRUPT)
        return ty_err_set(err, TY_ENOENT,
                          "checkpoint %s has no MANIFEST.json (incomplete checkpoint)", dir);
    json_t *files = json_object_get(m, "files"), *js = json_object_get(m, "step"),
           *fmt = json_object_get(m, "format");
    if (!m || !json_is_array(files) || !json_is_integer(js) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), CKPT_FORMAT)) {
        json_decref(m);
        return ty_err_set(err, TY_ECORRUPT,
                          "checkpoint corrupt: %s/MANIFEST.json is not a %s manifest", dir,
                          CKPT_FORMAT);
    }
    *step = json_integer_value(js);
    size_t i;
    json_t *f;
    rc = 0;
    json_array_foreach(files, i, f)
    {
        json_t *jp = json_object_get(f, "path"), *jb = json_object_get(f, "bytes"),
               *jh = json_object_get(f, "sha256");
        if (!json_is_string(jp) || !json_is_integer(jb) || !json_is_string(jh) ||
            strchr(json_string_value(jp), '/') || !strcmp(json_string_value(jp), "..")) {
            rc = ty_err_set(err, TY_ECORRUPT,
                            "checkpoint corrupt: bad file entry %zu in MANIFEST.json", i);
            break;
        }
        const char *name = json_string_value(jp);
        char fp[4096], hex[65];
        uint64_t bytes = 0;
        snprintf(fp, sizeof fp, "%s/%s", dir, name);
        if (ty_sha256_file(fp, hex, &bytes, NULL) != 0) {
            rc = ty_err_set(err, TY_ECORRUPT, "checkpoint corrupt: %s is missing", name);
            break;
        }
        if (bytes != (uint64_t)json_integer_value(jb) || strcmp(hex, json_string_value(jh))) {
            rc = ty_err_set(err, TY_ECORRUPT, "checkpoint corrupt: %s sha256 mismatch", name);
            break;
        }
    }
    json_decref(m);
    return rc;
}

typedef struct {
    int64_t step;
    ty_ret_item r; /* committed or partial, and its eval loss */
} ckpt_entry;

static double ckpt_eval_loss(const char *dir)
{
    char path[4500];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    json_t *v = json_object_get(o, "eval_loss");
    double loss = json_is_number(v) ? json_number_value(v) : NAN;
    json_decref(o);
    return loss;
}

static int ckpt_cmp(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step ? 1 : 0;
}

/* Lists checkpoints/step-* in step order; the choice is ty_retention_select's,
 * the same the server makes for its copies (common/retention.h). */
int ckpt_prune(const char *workdir, int keep_last, int keep_best, ty_err *err)
{
    char root[4096];
    snprintf(root, sizeof root, "%s/checkpoints", workdir);
    DIR *d = opendir(root);
    if (!d) return 0;
    ckpt_entry *e = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long step;
        char tail;
        if (sscanf(de->d_name, "step-%lld%c", &step, &tail) != 1 || strlen(de->d_name) < 11)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ckpt_entry *ne = realloc(e, (size_t)cap * sizeof *e);
            if (!ne) break;
            e = ne;
        }
        char mp[4400];
        struct stat st;
        snprintf(mp, sizeof mp, "%s/%s/MANIFEST.json", root, de->d_name);
        bool committed = stat(mp, &st) == 0;
        snprintf(mp, sizeof mp, "%s/%s", root, de->d_name);
        e[n].step = step;
        e[n].r.kind = committed ? TY_RET_COMMITTED : TY_RET_PARTIAL;
        e[n].r.loss = committed && keep_best > 0 ? ckpt_eval_loss(mp) : NAN;
        n++;
    }
    closedir(d);
    qsort(e, (size_t)n, sizeof *e, ckpt_cmp);
    ty_ret_item *items = malloc(((size_t)n + 1) * sizeof *items);
    bool *keep = malloc((size_t)n + 1);
    int rc = 0;
    if (items && keep) {
        for (int i = 0; i < n; i++)
            items[i] = e[i].r;
        ty_retention_select(items, n, keep_last, keep_best, keep);
        for (int i = 0; i < n && !rc; i++) {
            if (keep[i]) continue;
            char dir[4096];
            ckpt_dir_name(dir, sizeof dir, workdir, e[i].step);
            rc = ty_rm_rf(dir, err);
        }
    }
    free(items);
    free(keep);
    free(e);
    return rc;
}
