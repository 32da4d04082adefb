/* store.c — the public store_* entry points: config and environment
 * resolution, opening a store (uri.c parses the URI), argument checks,
 * dispatch to a backend, and the small helpers every backend shares
 * (hashing a file range, base64, reading one field out of an XML reply,
 * dates, one page of an XML listing, a HEAD reply as a stat result, and
 * the "download to .part, verify, rename" sequence).
 *
 * Keeping these here means each backend file only speaks its service's
 * protocol. */
#include "store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tyutil.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void store_config_init(store_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->use_env = 1;
}

const char *store_cfg_str(const store_config *cfg, const char *field, const char *var)
{
    if (field && *field) return field;
    if (cfg->use_env && var) {
        const char *v = getenv(var);
        if (v && *v) return v;
    }
    return NULL;
}

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *u)
{
    (void)h;
    (void)a;
    store *s = u;
    pthread_mutex_lock(&s->share_locks[d]);
}

static void share_unlock(CURL *h, curl_lock_data d, void *u)
{
    (void)h;
    store *s = u;
    pthread_mutex_unlock(&s->share_locks[d]);
}

static void tuning_from(store_tuning *t, const store_config *c)
{
    t->multipart_threshold = c->multipart_threshold ? c->multipart_threshold : 64ull << 20;
    t->part_size = c->part_size ? c->part_size : 16ull << 20;
    t->parallel = c->parallel > 0 ? c->parallel : 4;
    if (t->parallel > 32) t->parallel = 32;
    t->max_attempts = c->max_attempts > 0 ? c->max_attempts : 6;
    t->retry_base_ms = c->retry_base_ms > 0 ? c->retry_base_ms : 200;
    t->retry_max_ms = c->retry_max_ms > 0 ? c->retry_max_ms : 10000;
    t->connect_timeout_s = c->connect_timeout_s > 0 ? c->connect_timeout_s : 10;
    t->stall_timeout_s = c->stall_timeout_s > 0 ? c->stall_timeout_s : 30;
    t->request_timeout_s = c->request_timeout_s > 0 ? c->request_timeout_s : 0;
}

int store_open(const char *uri, const store_config *cfg_in, store **out, ty_err *err)
{
    *out = NULL;
    store_config defcfg;
    if (!cfg_in) {
        store_config_init(&defcfg);
        cfg_in = &defcfg;
    }
    store_scheme scheme;
    char *bucket = NULL, *prefix = NULL;
    int rc = store_uri_parse(uri, &scheme, &bucket, &prefix, err);
    if (rc) return rc;

    pthread_once(&curl_once, curl_init_once);
    store *s = calloc(1, sizeof *s);
    if (!s) {
        free(bucket);
        free(prefix);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    s->uri = strdup(uri);
    s->bucket = bucket;
    s->prefix = prefix;
    tuning_from(&s->tune, cfg_in);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&s->share_locks[i], NULL);
    switch (scheme) {
    case STORE_FILE:
        rc = store_file_open(s, cfg_in, err);
        break;
    case STORE_S3:
        rc = store_s3_open(s, cfg_in, 0, err);
        break;
    case STORE_GS:
        rc = store_gcs_open(s, cfg_in, err);
        break;
    case STORE_AZ:
        rc = store_azure_open(s, cfg_in, err);
        break;
    }
    if (rc == 0 && (!s->uri || !s->bucket || !s->prefix))
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        s->share = curl_share_init();
        if (s->share) {
            curl_share_setopt(s->share, CURLSHOPT_LOCKFUNC, share_lock);
            curl_share_setopt(s->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
            curl_share_setopt(s->share, CURLSHOPT_USERDATA, s);
            curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
            curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
        }
    }
    if (rc != 0) {
        store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void store_close(store *s)
{
    if (!s) return;
    if (s->be && s->be->close) s->be->close(s);
    if (s->share) curl_share_cleanup(s->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&s->share_locks[i]);
    free(s->uri);
    free(s->bucket);
    free(s->prefix);
    free(s);
}

const char *store_uri(const store *s)
{
    return s->uri;
}

void store_cancel(store *s)
{
    if (s) atomic_store(&s->cancelled, 1);
}

/* --- public operations: validate, then dispatch --- */

/* Rejects a bad key here, before any backend sees it, so every backend
 * answers the same invalid keys with the same error. */
static int check_key(store *s, const char *key, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc == 0) free(full);
    return rc;
}

int store_put_file(store *s, const char *key, const char *local_path, ty_err *err)
{
    struct stat st;
    if (!local_path || stat(local_path, &st) != 0)
        return ty_err_set(err, TY_ENOENT, "storage: cannot read '%s': %s",
                          local_path ? local_path : "(null)", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ty_err_set(err, TY_EINVAL, "storage: '%s' is not a regular file", local_path);
    int rc = store_check_cancel(s, err);
    if (rc == 0) rc = check_key(s, key, err);
    return rc ? rc : s->be->put_file(s, key, local_path, err);
}

int store_get_file(store *s, const char *key, const char *local_path, ty_err *err)
{
    int rc = store_check_cancel(s, err);
    if (rc == 0) rc = check_key(s, key, err);
    if (rc) return rc;
    if (!local_path || !*local_path) return ty_err_set(err, TY_EINVAL, "storage: empty local path");
    return s->be->get_file(s, key, local_path, err);
}

int store_stat(store *s, const char *key, store_object *out, ty_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_key(s, key, err);
    return rc ? rc : s->be->stat(s, key, out, err);
}

void store_object_clear(store_object *o)
{
    if (!o) return;
    free(o->key);
    memset(o, 0, sizeof *o);
}

int store_list(store *s, const char *prefix, store_listing *out, ty_err *err)
{
    memset(out, 0, sizeof *out);
    if (!prefix) prefix = "";
    if (prefix[0] == '/')
        return ty_err_set(err, TY_EINVAL, "storage: list prefix must be relative");
    int rc = s->be->list(s, prefix, out, err);
    if (rc) {
        store_listing_free(out);
        return rc;
    }
    store_listing_sort(out);
    return 0;
}

void store_listing_free(store_listing *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i].key);
    free(l->items);
    memset(l, 0, sizeof *l);
}

int store_listing_add(store_listing *l, const char *key, uint64_t size, const char *etag,
                      int64_t mtime, ty_err *err)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        store_object *ni = realloc(l->items, nc * sizeof *ni);
        if (!ni) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        l->items = ni;
        l->cap = nc;
    }
    store_object *o = &l->items[l->n];
    memset(o, 0, sizeof *o);
    o->key = strdup(key);
    if (!o->key) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    o->size = size;
    o->mtime = mtime;
    if (etag) store_etag_unquote(etag, o->etag, sizeof o->etag);
    l->n++;
    return 0;
}

static int obj_cmp(const void *a, const void *b)
{
    return strcmp(((const store_object *)a)->key, ((const store_object *)b)->key);
}

void store_listing_sort(store_listing *l)
{
    if (l->n > 1) qsort(l->items, l->n, sizeof *l->items, obj_cmp);
}

int store_delete(store *s, const char *key, ty_err *err)
{
    int rc = check_key(s, key, err);
    return rc ? rc : s->be->del(s, key, err);
}

/* --- shared helpers --- */

int store_hash_range(int fd, uint64_t off, uint64_t len, unsigned char md5[16],
                     unsigned char sha256[32], ty_err *err)
{
    EVP_MD_CTX *cm = md5 ? EVP_MD_CTX_new() : NULL;
    EVP_MD_CTX *cs = sha256 ? EVP_MD_CTX_new() : NULL;
    int rc = 0;
    if ((md5 && !cm) || (sha256 && !cs)) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto done;
    }
    if (cm) EVP_DigestInit_ex(cm, EVP_md5(), NULL);
    if (cs) EVP_DigestInit_ex(cs, EVP_sha256(), NULL);
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF);
    if (!buf) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto done;
    }
    while (len > 0) {
        size_t want = len < BUF ? (size_t)len : BUF;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = ty_err_set(err, TY_EIO, "storage: reading local file: %s",
                            r < 0 ? strerror(errno) : "file shrank while uploading");
            break;
        }
        if (cm) EVP_DigestUpdate(cm, buf, (size_t)r);
        if (cs) EVP_DigestUpdate(cs, buf, (size_t)r);
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    free(buf);
    if (rc == 0) {
        if (cm) EVP_DigestFinal_ex(cm, md5, NULL);
        if (cs) EVP_DigestFinal_ex(cs, sha256, NULL);
    }
done:
    EVP_MD_CTX_free(cm);
    EVP_MD_CTX_free(cs);
    return rc;
}

void store_b64(const unsigned char *in, size_t n, char *out, size_t outsz)
{
    if (outsz < 4 * ((n + 2) / 3) + 1) {
        if (outsz) out[0] = '\0';
        return;
    }
    EVP_EncodeBlock((unsigned char *)out, in, (int)n);
}

long store_b64_decode(const char *in, unsigned char *out, size_t outsz)
{
    static const char *std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        char c = *p;
        if (c == '=') break;
        if (c == '-') c = '+';
        if (c == '_') c = '/';
        if (c == '\n' || c == '\r' || c == ' ') continue;
        const char *q = strchr(std, c);
        if (!q || !c) return -1;
        acc = (acc << 6) | (uint32_t)(q - std);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= outsz) return -1;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)n;
}

int store_xml_field(const char *xml, const char *tag, size_t *pos, char *out, size_t outsz)
{
    char open[96], close[96];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(xml + *pos, open);
    if (!a) return 0;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b) return 0;
    *pos = (size_t)(b - xml) + strlen(close);
    size_t o = 0;
    for (const char *p = a; p < b && o + 1 < outsz;) {
        if (*p == '&') {
            static const struct {
                const char *ent;
                char c;
            } ents[] = {
                {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
            int done = 0;
            for (size_t i = 0; i < sizeof ents / sizeof ents[0]; i++) {
                size_t l = strlen(ents[i].ent);
                if (!strncmp(p, ents[i].ent, l)) {
                    out[o++] = ents[i].c;
                    p += l;
                    done = 1;
                    break;
                }
            }
            if (done) continue;
            if (p[1] == '#') { /* numeric reference, ASCII only */
                char *end;
                long v = p[2] == 'x' ? strtol(p + 3, &end, 16) : strtol(p + 2, &end, 10);
                if (*end == ';' && v > 0 && v < 128) {
                    out[o++] = (char)v;
                    p = end + 1;
                    continue;
                }
            }
        }
        out[o++] = *p++;
    }
    out[o] = '\0';
    return 1;
}

int64_t store_parse_time(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    if (!s || !*s) return 0;
    const char *e = strptime(s, "%a, %d %b %Y %H:%M:%S", &tm);
    if (!e) {
        memset(&tm, 0, sizeof tm);
        e = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    }
    if (!e) return 0;
    return (int64_t)timegm(&tm);
}

int store_fd_reset(int fd, ty_err *err)
{
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) < 0)
        return ty_err_set(err, TY_EIO, "storage: truncating download file: %s", strerror(errno));
    return 0;
}

int store_download_to(const char *path, int (*fetch)(void *ctx, int fd, ty_err *err), void *ctx,
                      ty_err *err)
{
    size_t n = strlen(path);
    char *part = malloc(n + 6);
    if (!part) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    memcpy(part, path, n);
    memcpy(part + n, ".part", 6);
    int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = ty_err_set(err, TY_EIO, "storage: cannot create '%s': %s", part, strerror(errno));
        free(part);
        return rc;
    }
    int rc = fetch(ctx, fd, err);
    if (rc == 0 && fsync(fd) != 0)
        rc = ty_err_set(err, TY_EIO, "storage: fsync '%s': %s", part, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = ty_err_set(err, TY_EIO, "storage: close '%s': %s", part, strerror(errno));
    if (rc == 0 && rename(part, path) != 0)
        rc = ty_err_set(err, TY_EIO, "storage: rename to '%s': %s", path, strerror(errno));
    if (rc != 0) unlink(part);
    free(part);
    return rc;
}

int store_put_open(store *s, const char *key, const char *path, char **full, int *fd,
                   uint64_t *size, ty_err *err)
{
    int rc = store_full_key(s, key, full, err);
    if (rc) return rc;
    struct stat st;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0 || fstat(*fd, &st) != 0) {
        rc = ty_err_set(err, TY_ENOENT, "storage: cannot read '%s': %s", path, strerror(errno));
        if (*fd >= 0) close(*fd);
        free(*full);
        *full = NULL;
        *fd = -1;
        return rc;
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

typedef struct verified_get {
    store *s;
    const char *full;
    store_get_fn get;
    store_verify_fn verified;
    const char *checksum;
} verified_get;

static int fetch_verified(void *vctx, int fd, ty_err *err)
{
    verified_get *c = vctx;
    http_resp rs = {0};
    int rc = 0;
    /* A mismatch means bytes were damaged on the way; a fresh GET (the
     * backend's call truncates fd first) usually fixes it. */
    for (int tries = 0; tries < 3; tries++) {
        rc = c->get(c->s, c->full, fd, &rs, err);
        if (rc) break;
        if (c->verified(&rs)) break;
        rc = ty_err_set(err, TY_ECORRUPT, "storage: %s://%s/%s: downloaded bytes do not match %s",
                        c->s->be->scheme, c->s->bucket, c->full, c->checksum);
    }
    store_http_resp_clear(&rs);
    return rc;
}

int store_get_verified(store *s, const char *key, const char *path, store_get_fn get,
                       store_verify_fn verified, const char *checksum, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    verified_get c = {s, full, get, verified, checksum};
    rc = store_download_to(path, fetch_verified, &c, err);
    free(full);
    return rc;
}

int store_object_from_head(const char *key, const http_resp *rs, store_object *out, ty_err *err)
{
    out->key = strdup(key);
    if (!out->key) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    out->size = rs->content_length > 0 ? (uint64_t)rs->content_length : 0;
    store_etag_unquote(rs->etag, out->etag, sizeof out->etag);
    out->mtime = store_parse_time(rs->last_modified);
    return 0;
}

char *store_list_prefix(const store *s, const char *prefix)
{
    size_t n = strlen(s->prefix) + strlen(prefix) + 1;
    char *full = malloc(n);
    if (full) snprintf(full, n, "%s%s", s->prefix, prefix);
    return full;
}

int store_xml_list_page(const store *s, const char *xml, const store_xml_list_tags *t,
                        store_listing *out, ty_err *err)
{
    enum { ITEM_CAP = 64 * 1024 };
    char *item = malloc(ITEM_CAP);
    if (!item) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    int rc = 0;
    size_t pos = 0;
    while (rc == 0 && store_xml_field(xml, t->item, &pos, item, ITEM_CAP)) {
        char k[1024] = "", sz[32] = "", et[128] = "", lm[64] = "";
        size_t q = 0;
        store_xml_field(item, t->key, &q, k, sizeof k);
        q = 0;
        store_xml_field(item, t->size, &q, sz, sizeof sz);
        q = 0;
        store_xml_field(item, t->etag, &q, et, sizeof et);
        q = 0;
        store_xml_field(item, t->mtime, &q, lm, sizeof lm);
        const char *rel = store_rel_key(s, k);
        if (rel && *rel)
            rc = store_listing_add(out, rel, strtoull(sz, NULL, 10), et, store_parse_time(lm), err);
    }
    free(item);
    return rc;
}

void store_free_secret(char *p)
{
    if (!p) return;
    OPENSSL_cleanse(p, strlen(p));
    free(p);
}

char *store_strdup0(const char *p)
{
    return p ? strdup(p) : NULL;
}

void store_etag_unquote(const char *etag, char *out, size_t n)
{
    store_strlcpy(out, etag[0] == '"' ? etag + 1 : etag, n);
    size_t l = strlen(out);
    if (l && out[l - 1] == '"') out[l - 1] = '\0';
}

void store_strlcpy(char *dst, const char *src, size_t n)
{
    if (!n) return;
    size_t l = strlen(src);
    if (l >= n) l = n - 1;
    memcpy(dst, src, l);
    dst[l] = '\0';
}
