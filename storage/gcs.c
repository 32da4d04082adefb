/* gcs.c — the gs:// backend. With HMAC keys it is the S3 protocol against
 * storage.googleapis.com's XML API (s3.c does the work); with a service
 * account key it is the JSON API with an OAuth2 bearer token.
 *
 * JSON API uploads are resumable sessions: one POST opens a session (its
 * metadata carries the file's MD5, which the service checks when the last
 * byte lands), then the file goes up in chunks (multiples of 256 KiB) with
 * Content-Range. After a failed chunk the session is asked how much it
 * holds (Content-Range: bytes * /SIZE) and the upload continues from there,
 * so a failure costs one chunk, not the file. Downloads are checked
 * against the MD5 in x-goog-hash. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcs_oauth.h"
#include "store_int.h"
#include "tyutil.h"

typedef struct gcs_impl {
    char *base; /* scheme://host[:port], no trailing slash */
    gcs_oauth *oauth;
} gcs_impl;

static void gcs_close(store *s)
{
    gcs_impl *m = s->impl;
    if (!m) return;
    free(m->base);
    store_gcs_oauth_free(m->oauth);
    free(m);
    s->impl = NULL;
}

typedef struct gcs_req {
    http_req io;         /* method, URL, body and download target; the call adds headers */
    const char *hdrs[4]; /* extra headers, "Name: value" */
    size_t n_hdrs;
    int ok_308; /* 308 is a normal answer (resumable uploads) */
} gcs_req;

static void gcs_req_init(gcs_req *r, const char *method, const char *url)
{
    memset(r, 0, sizeof *r);
    store_http_req_init(&r->io, method, url);
}

/* One request with a bearer token. A 401 refreshes the token once. */
static int gcs_attempt(store *s, const gcs_req *r, int refresh, http_resp *rs, int *retryable,
                       ty_err *err)
{
    gcs_impl *m = s->impl;
    struct curl_slist *h = NULL;
    int rc = store_gcs_oauth_header(s, m->oauth, refresh, &h, err);
    for (size_t i = 0; rc == 0 && i < r->n_hdrs; i++)
        rc = store_http_header(&h, err, "%s", r->hdrs[i]);
    if (rc == 0) {
        http_req rq = r->io;
        rq.headers = h;
        rc = store_http_do(s, &rq, rs, retryable, err);
    } else if (rc == TY_EIO) {
        *retryable = 1; /* token endpoint unreachable: worth another try */
    }
    curl_slist_free_all(h);
    return rc;
}

static int gcs_call(store *s, const gcs_req *r, const char *what, http_resp *rs, ty_err *err)
{
    int rc = TY_EIO, refreshed = 0;
    for (int attempt = 1; attempt <= s->tune.max_attempts; attempt++) {
        if (attempt > 1 && (rc = store_retry_sleep(s, attempt - 1, err)) != 0) return rc;
        if (r->io.resp_fd >= 0 && (rc = store_fd_reset(r->io.resp_fd, err)) != 0) return rc;
        int retryable = 0;
        rc = gcs_attempt(s, r, 0, rs, &retryable, err);
        if (rc == 0 && rs->status == 401 && !refreshed) {
            refreshed = 1;
            rc = gcs_attempt(s, r, 1, rs, &retryable, err);
        }
        if (rc != 0) {
            if (retryable) continue;
            return rc;
        }
        if ((rs->status >= 200 && rs->status < 300) || (r->ok_308 && rs->status == 308)) return 0;
        const char *msg = NULL;
        json_t *ej = rs->body ? json_loads(rs->body, 0, NULL) : NULL;
        if (ej) msg = json_string_value(json_object_get(json_object_get(ej, "error"), "message"));
        int ty = rs->status == 404                          ? TY_ENOENT
                 : (rs->status == 401 || rs->status == 403) ? TY_EAUTH
                                                            : TY_EIO;
        rc = ty_err_set(err, ty, "storage: %s gs://%s/%s: HTTP %ld%s%s", r->io.method, s->bucket,
                        what, rs->status, msg ? ": " : "", msg ? msg : "");
        json_decref(ej);
        if (!store_http_status_retryable(rs->status)) return rc;
    }
    return rc;
}

static char *obj_url(store *s, const char *full, const char *suffix)
{
    gcs_impl *m = s->impl;
    char *eb = store_urlencode(s->bucket, 0), *eo = store_urlencode(full, 0);
    char *u = NULL;
    if (eb && eo) {
        size_t n = strlen(m->base) + strlen(eb) + strlen(eo) + strlen(suffix) + 40;
        u = malloc(n);
        if (u) snprintf(u, n, "%s/storage/v1/b/%s/o/%s%s", m->base, eb, eo, suffix);
    }
    free(eb);
    free(eo);
    return u;
}

/* Bytes the session holds, from a 308's "Range: bytes=0-N" (none: 0). */
static uint64_t persisted(const http_resp *rs)
{
    const char *d = strchr(rs->range, '-');
    return d ? strtoull(d + 1, NULL, 10) + 1 : 0;
}

/* The final reply's md5Hash must be the one we computed. */
static int check_final(const http_resp *rs, const char *md5_b64, const char *full, ty_err *err)
{
    json_t *j = rs->body ? json_loads(rs->body, 0, NULL) : NULL;
    const char *got = j ? json_string_value(json_object_get(j, "md5Hash")) : NULL;
    int rc = 0;
    if (got && strcmp(got, md5_b64))
        rc = ty_err_set(err, TY_ECORRUPT,
                        "storage: gs:// %s: stored MD5 differs from the uploaded file", full);
    json_decref(j);
    return rc;
}

static int gcs_upload_session(store *s, const char *full, int fd, uint64_t size,
                              const char *md5_b64, ty_err *err)
{
    gcs_impl *m = s->impl;
    char *eb = store_urlencode(s->bucket, 0), *eo = store_urlencode(full, 0);
    size_t ul = strlen(m->base) + (eb ? strlen(eb) : 0) + (eo ? strlen(eo) : 0) + 80;
    char *url = malloc(ul);
    json_t *meta = json_pack("{s:s, s:s}", "name", full, "md5Hash", md5_b64);
    char *mbody = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
    json_decref(meta);
    int rc = 0;
    char *session = NULL;
    http_resp rs = {0};
    if (!eb || !eo || !url || !mbody) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto out;
    }
    snprintf(url, ul, "%s/upload/storage/v1/b/%s/o?uploadType=resumable&name=%s", m->base, eb, eo);
    char lenh[64];
    snprintf(lenh, sizeof lenh, "X-Upload-Content-Length: %llu", (unsigned long long)size);
    gcs_req r;
    gcs_req_init(&r, "POST", url);
    r.hdrs[r.n_hdrs++] = "Content-Type: application/json; charset=UTF-8";
    r.hdrs[r.n_hdrs++] = "X-Upload-Content-Type: application/octet-stream";
    r.hdrs[r.n_hdrs++] = lenh;
    r.io.body = mbody;
    r.io.body_len = strlen(mbody);
    rc = gcs_call(s, &r, full, &rs, err);
    if (rc == 0 && !rs.location[0])
        rc = ty_err_set(err, TY_EIO, "storage: gs:// %s: no upload session URL", full);
    if (rc) goto out;
    session = strdup(rs.location);
    if (!session) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto out;
    }

    uint64_t chunk = s->tune.part_size & ~((256ull << 10) - 1);
    if (chunk == 0) chunk = 256ull << 10;
    uint64_t off = 0;
    int failures = 0;
    for (;;) {
        uint64_t len = size - off < chunk ? size - off : chunk;
        char cr[96];
        if (size == 0)
            snprintf(cr, sizeof cr, "Content-Range: bytes */0");
        else
            snprintf(cr, sizeof cr, "Content-Range: bytes %llu-%llu/%llu", (unsigned long long)off,
                     (unsigned long long)(off + len - 1), (unsigned long long)size);
        gcs_req_init(&r, "PUT", session);
        r.hdrs[r.n_hdrs++] = cr;
        r.io.body_fd = fd;
        r.io.body_off = off;
        r.io.body_size = len;
        r.ok_308 = 1;
        int retryable = 0;
        rc = gcs_attempt(s, &r, 0, &rs, &retryable, err);
        if (rc == 0 && rs.status == 401) /* token revoked mid-upload: refresh once */
            rc = gcs_attempt(s, &r, 1, &rs, &retryable, err);
        if (rc == 0 && (rs.status == 200 || rs.status == 201)) {
            rc = check_final(&rs, md5_b64, full, err);
            break;
        }
        if (rc == 0 && rs.status == 308) {
            off = persisted(&rs);
            failures = 0;
            continue;
        }
        if (rc == 0) {
            retryable = store_http_status_retryable(rs.status);
            rc = ty_err_set(err, rs.status == 404 || rs.status == 410 ? TY_ESTATE : TY_EIO,
                            "storage: gs:// %s: chunk at %llu: HTTP %ld", full,
                            (unsigned long long)off, rs.status);
        }
        if (!retryable || ++failures >= s->tune.max_attempts) break;
        /* Ask the session where it stands, then go on from there. */
        if ((rc = store_retry_sleep(s, failures, err)) != 0) break;
        snprintf(cr, sizeof cr, "Content-Range: bytes */%llu", (unsigned long long)size);
        gcs_req q;
        gcs_req_init(&q, "PUT", session);
        q.hdrs[q.n_hdrs++] = cr;
        q.ok_308 = 1;
        ty_err qe;
        int qrc = gcs_call(s, &q, full, &rs, &qe);
        if (qrc == 0 && (rs.status == 200 || rs.status == 201)) {
            rc = check_final(&rs, md5_b64, full, err);
            break;
        }
        if (qrc == 0 && rs.status == 308) off = persisted(&rs);
        rc = 0;
    }
out:
    store_http_resp_clear(&rs);
    free(session);
    free(url);
    free(mbody);
    free(eb);
    free(eo);
    return rc;
}

static int gcs_put_file(store *s, const char *key, const char *path, ty_err *err)
{
    char *full;
    int fd;
    uint64_t size;
    int rc = store_put_open(s, key, path, &full, &fd, &size, err);
    if (rc) return rc;
    unsigned char md5[16];
    char md5_b64[32];
    rc = store_hash_range(fd, 0, size, md5, NULL, err);
    if (rc == 0) {
        store_b64(md5, 16, md5_b64, sizeof md5_b64);
        rc = gcs_upload_session(s, full, fd, size, md5_b64, err);
        /* A session that expired or a corrupted result: one fresh session. */
        if (rc == TY_ESTATE || rc == TY_ECORRUPT)
            rc = gcs_upload_session(s, full, fd, size, md5_b64, err);
    }
    close(fd);
    free(full);
    return rc;
}

static int gcs_get_once(store *s, const char *full, int fd, http_resp *rs, ty_err *err)
{
    char *url = obj_url(s, full, "?alt=media");
    if (!url) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    gcs_req r;
    gcs_req_init(&r, "GET", url);
    r.io.resp_fd = fd;
    int rc = gcs_call(s, &r, full, rs, err);
    free(url);
    return rc;
}

/* x-goog-hash carries "crc32c=...,md5=..."; composite objects have no md5. */
static int gcs_md5_ok(const http_resp *rs)
{
    const char *m = strstr(rs->goog_hash, "md5=");
    if (!m) return 1;
    char want[32];
    store_strlcpy(want, m + 4, sizeof want);
    want[strcspn(want, ",")] = '\0';
    char got[32];
    store_b64(rs->md5, 16, got, sizeof got);
    return !strcmp(got, want);
}

static int gcs_get_file(store *s, const char *key, const char *path, ty_err *err)
{
    return store_get_verified(s, key, path, gcs_get_once, gcs_md5_ok, "x-goog-hash", err);
}

static int gcs_stat(store *s, const char *key, store_object *out, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    char *url = obj_url(s, full, "");
    http_resp rs = {0};
    if (!url) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        gcs_req r;
        gcs_req_init(&r, "GET", url);
        rc = gcs_call(s, &r, full, &rs, err);
    }
    if (rc == 0) {
        json_t *j = rs.body ? json_loads(rs.body, 0, NULL) : NULL;
        const char *size = j ? json_string_value(json_object_get(j, "size")) : NULL;
        const char *et = j ? json_string_value(json_object_get(j, "etag")) : NULL;
        const char *up = j ? json_string_value(json_object_get(j, "updated")) : NULL;
        if (!size) {
            rc = ty_err_set(err, TY_EIO, "storage: gs://%s/%s: metadata reply has no size",
                            s->bucket, full);
        } else {
            out->key = strdup(key);
            out->size = strtoull(size, NULL, 10);
            store_strlcpy(out->etag, et ? et : "", sizeof out->etag);
            out->mtime = store_parse_time(up);
            if (!out->key) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        }
        json_decref(j);
    }
    store_http_resp_clear(&rs);
    free(url);
    free(full);
    return rc;
}

static int gcs_list(store *s, const char *prefix, store_listing *out, ty_err *err)
{
    gcs_impl *m = s->impl;
    char *full = store_list_prefix(s, prefix);
    if (!full) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    char *ep = store_urlencode(full, 0), *eb = store_urlencode(s->bucket, 0);
    char *token = NULL;
    int rc = (ep && eb) ? 0 : ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    while (rc == 0) {
        char *et = token ? store_urlencode(token, 0) : NULL;
        size_t ul = strlen(m->base) + strlen(eb) + strlen(ep) + (et ? strlen(et) : 0) + 64;
        char *url = malloc(ul);
        if (!url) {
            free(et);
            rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
            break;
        }
        snprintf(url, ul, "%s/storage/v1/b/%s/o?prefix=%s%s%s", m->base, eb, ep,
                 et ? "&pageToken=" : "", et ? et : "");
        free(et);
        gcs_req r;
        gcs_req_init(&r, "GET", url);
        http_resp rs = {0};
        rc = gcs_call(s, &r, full, &rs, err);
        json_t *j = (rc == 0 && rs.body) ? json_loads(rs.body, 0, NULL) : NULL;
        if (rc == 0 && !j)
            rc = ty_err_set(err, TY_EIO, "storage: list gs://%s: reply is not JSON", s->bucket);
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(j, "items"), i, it)
        {
            if (rc) break;
            const char *name = json_string_value(json_object_get(it, "name"));
            const char *size = json_string_value(json_object_get(it, "size"));
            const char *rel = name ? store_rel_key(s, name) : NULL;
            if (rel && *rel)
                rc = store_listing_add(
                    out, rel, size ? strtoull(size, NULL, 10) : 0,
                    json_string_value(json_object_get(it, "etag")),
                    store_parse_time(json_string_value(json_object_get(it, "updated"))), err);
        }
        free(token);
        token = NULL;
        const char *nt = j ? json_string_value(json_object_get(j, "nextPageToken")) : NULL;
        if (nt && *nt) token = strdup(nt);
        json_decref(j);
        store_http_resp_clear(&rs);
        free(url);
        if (!token) break;
    }
    free(token);
    free(ep);
    free(eb);
    free(full);
    return rc;
}

static int gcs_del(store *s, const char *key, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    char *url = obj_url(s, full, "");
    if (!url) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        gcs_req r;
        gcs_req_init(&r, "DELETE", url);
        http_resp rs = {0};
        rc = gcs_call(s, &r, full, &rs, err);
        store_http_resp_clear(&rs);
    }
    free(url);
    free(full);
    return rc;
}

static const store_backend gcs_backend = {"gs",     gcs_put_file, gcs_get_file, gcs_stat,
                                          gcs_list, gcs_del,      gcs_close};

int store_gcs_open(store *s, const store_config *cfg, ty_err *err)
{
    /* HMAC keys select the XML API. */
    if (store_cfg_str(cfg, cfg->gcs_hmac_access_id, "GCS_HMAC_ACCESS_ID"))
        return store_s3_open(s, cfg, 1, err);
    const char *cred =
        store_cfg_str(cfg, cfg->gcs_credentials_file, "GOOGLE_APPLICATION_CREDENTIALS");
    if (!cred)
        return ty_err_set(err, TY_EAUTH,
                          "storage: %s needs GOOGLE_APPLICATION_CREDENTIALS (a service account "
                          "key) or GCS HMAC keys",
                          s->uri);
    gcs_impl *m = calloc(1, sizeof *m);
    if (!m) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    s->impl = m;
    s->be = &gcs_backend;
    const char *ep = store_cfg_str(cfg, cfg->gcs_json_endpoint, "STORAGE_EMULATOR_HOST");
    if (!ep) ep = "https://storage.googleapis.com";
    /* STORAGE_EMULATOR_HOST may be a bare host:port. */
    int bare = strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8);
    size_t n = strlen(ep) + 8;
    m->base = malloc(n);
    if (!m->base) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    snprintf(m->base, n, "%s%s", bare ? "http://" : "", ep);
    size_t bl = strlen(m->base);
    while (bl && m->base[bl - 1] == '/')
        m->base[--bl] = '\0';
    return store_gcs_oauth_load(cred, NULL, &m->oauth, err);
}
