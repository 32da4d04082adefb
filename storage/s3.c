/* s3.c — the s3:// backend (and gs:// with HMAC keys, which speaks the same
 * XML protocol to storage.googleapis.com).
 *
 * Path-style URLs (endpoint/bucket/key) so any S3-compatible endpoint works
 * without DNS tricks. Every request is signed with SigV4 and carries
 * x-amz-content-sha256; bodies are hashed (SHA-256 for the signature, MD5
 * for Content-MD5) in a streaming pass before they are sent. Files above the
 * multipart threshold go up as parallel parts from a small thread pool, each
 * part retried on its own; the upload is completed only when every part
 * landed, and aborted otherwise so no half object ever appears. */
#include <errno.h>
#include <openssl/evp.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sigv4.h"
#include "store_int.h"
#include "tyutil.h"

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

typedef struct s3_impl {
    char *endpoint; /* scheme://host[:port][/base], no trailing slash */
    char *host;     /* host[:port] for the Host header */
    char *access_key, *secret_key, *token, *region;
    const char *service;
    int gcs;
} s3_impl;

/* One signed request. */
typedef struct s3_op {
    const char *method;
    const char *key; /* full object name or NULL for the bucket */
    sigv4_param query[4];
    size_t n_query;
    sigv4_param headers[4]; /* extra headers to sign and send */
    size_t n_headers;
    http_req io;              /* body and download target; the call sets method, URL, headers */
    const char *payload_hash; /* hex; computed by the caller */
    const char *content_md5;  /* base64, or NULL */
} s3_op;

static void s3_op_init(s3_op *op, const char *method, const char *key)
{
    memset(op, 0, sizeof *op);
    op->method = method;
    op->key = key;
    store_http_req_init(&op->io, method, NULL);
    op->payload_hash = EMPTY_SHA256;
}

static void s3_close(store *s)
{
    s3_impl *m = s->impl;
    if (!m) return;
    free(m->endpoint);
    free(m->host);
    free(m->access_key);
    store_free_secret(m->secret_key);
    free(m->token);
    free(m->region);
    free(m);
    s->impl = NULL;
}

/* Reads <Code> and <Message> from an error document for the message. */
static void s3_error_detail(const http_resp *rs, char *out, size_t n)
{
    char code[128] = "", msg[256] = "";
    size_t pos = 0;
    if (rs->body) {
        store_xml_field(rs->body, "Code", &pos, code, sizeof code);
        pos = 0;
        store_xml_field(rs->body, "Message", &pos, msg, sizeof msg);
    }
    if (code[0])
        snprintf(out, n, "HTTP %ld %s%s%s", rs->status, code, msg[0] ? ": " : "", msg);
    else
        snprintf(out, n, "HTTP %ld", rs->status);
}

static int s3_status_code(long st, const http_resp *rs)
{
    if (st == 404) return TY_ENOENT;
    if (st == 401 || st == 403) return TY_EAUTH;
    if (st == 400 && rs->body &&
        (strstr(rs->body, "BadDigest") || strstr(rs->body, "InvalidDigest")))
        return TY_ECORRUPT;
    return TY_EIO;
}

/* One attempt: sign and send. */
static int s3_attempt(store *s, const s3_op *op, http_resp *rs, int *retryable, ty_err *err)
{
    s3_impl *m = s->impl;
    char amz_date[17];
    store_sigv4_amz_date(time(NULL), amz_date);
    sigv4_param hdrs[12];
    size_t nh = 0;
    hdrs[nh++] = (sigv4_param){"host", m->host};
    hdrs[nh++] = (sigv4_param){"x-amz-date", amz_date};
    hdrs[nh++] = (sigv4_param){"x-amz-content-sha256", op->payload_hash};
    if (m->token) hdrs[nh++] = (sigv4_param){"x-amz-security-token", m->token};
    if (op->content_md5) hdrs[nh++] = (sigv4_param){"content-md5", op->content_md5};
    for (size_t i = 0; i < op->n_headers; i++)
        hdrs[nh++] = op->headers[i];

    /* Path: /bucket/key with each segment percent-encoded once ('/' kept). */
    char *ekey = op->key ? store_urlencode(op->key, 1) : strdup("");
    const char *base = strchr(strstr(m->endpoint, "://") + 3, '/');
    size_t plen = (base ? strlen(base) : 0) + strlen(s->bucket) + strlen(ekey ? ekey : "") + 4;
    char *path = malloc(plen);
    if (!ekey || !path) {
        free(ekey);
        free(path);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    snprintf(path, plen, "%s/%s%s%s", base ? base : "", s->bucket, op->key ? "/" : "", ekey);
    free(ekey);

    sigv4_input in = {.access_key = m->access_key,
                      .secret_key = m->secret_key,
                      .region = m->region,
                      .service = m->service,
                      .method = op->method,
                      .path = path,
                      .query = op->query,
                      .n_query = op->n_query,
                      .headers = hdrs,
                      .n_headers = nh,
                      .payload_hash = op->payload_hash,
                      .amz_date = amz_date};
    sigv4_output so;
    int rc = store_sigv4_sign(&in, &so, err);
    if (rc) {
        free(path);
        return rc;
    }
    size_t hostlen = (size_t)(strstr(m->endpoint, "://") + 3 - m->endpoint) + strlen(m->host);
    size_t ulen = hostlen + strlen(path) + strlen(so.query_string) + 2;
    char *url = malloc(ulen);
    struct curl_slist *h = NULL;
    if (!url) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto out;
    }
    snprintf(url, ulen, "%.*s%s%s%s", (int)hostlen, m->endpoint, path,
             so.query_string[0] ? "?" : "", so.query_string);
    for (size_t i = 1; i < nh && rc == 0; i++) /* host is set by curl from the URL */
        rc = store_http_header(&h, err, "%s: %s", hdrs[i].name, hdrs[i].value);
    if (rc == 0) rc = store_http_header(&h, err, "Authorization: %s", so.authorization);
    if (rc == 0) {
        http_req rq = op->io;
        rq.method = op->method;
        rq.url = url;
        rq.headers = h;
        if (rq.body && !rq.body_len) rq.body = NULL;
        rc = store_http_do(s, &rq, rs, retryable, err);
    }
out:
    curl_slist_free_all(h);
    free(url);
    free(path);
    store_sigv4_output_free(&so);
    return rc;
}

/* Sends op with retries. 0 on a 2xx reply; otherwise a TY_E* code with a
 * message that names the object but never a credential. */
static int s3_call(store *s, const s3_op *op, http_resp *rs, ty_err *err)
{
    int rc = TY_EIO;
    for (int attempt = 1; attempt <= s->tune.max_attempts; attempt++) {
        if (attempt > 1 && (rc = store_retry_sleep(s, attempt - 1, err)) != 0) return rc;
        if (op->io.resp_fd >= 0 && (rc = store_fd_reset(op->io.resp_fd, err)) != 0) return rc;
        int retryable = 0;
        rc = s3_attempt(s, op, rs, &retryable, err);
        if (rc != 0) {
            if (retryable) continue;
            return rc;
        }
        if (rs->status >= 200 && rs->status < 300) return 0;
        char detail[400];
        s3_error_detail(rs, detail, sizeof detail);
        rc = ty_err_set(err, s3_status_code(rs->status, rs), "storage: %s %s/%s: %s", op->method,
                        s->bucket, op->key ? op->key : "", detail);
        if (!store_http_status_retryable(rs->status)) return rc;
    }
    return rc;
}

/* ETag of a single PUT or a part is the hex MD5 of what the service stored
 * (S3, GCS and s3rver agree); a mismatch means the bytes changed on the way.
 * Services that return something else (encrypted objects) are not checked. */
static int etag_matches(const char *etag, const unsigned char md5[16])
{
    char hex[33], e[80];
    ty_hex(md5, 16, hex);
    store_etag_unquote(etag, e, sizeof e);
    size_t l = strlen(e);
    if (l != 32) return 1;
    for (size_t i = 0; i < l; i++)
        if (e[i] >= 'A' && e[i] <= 'F') e[i] = (char)(e[i] - 'A' + 'a');
    return strcmp(e, hex) == 0;
}

/* Hashes [off, off+len) and PUTs it, retrying the whole range on failure
 * or on an ETag that does not match what was sent. */
static int s3_put_range(store *s, const char *full, int fd, uint64_t off, uint64_t len,
                        const char *upload_id, int part_no, char *etag_out, size_t etag_sz,
                        ty_err *err)
{
    unsigned char md5[16], sha[32];
    int rc = store_hash_range(fd, off, len, md5, sha, err);
    if (rc) return rc;
    char sha_hex[65], md5_b64[32], pn[16];
    ty_hex(sha, 32, sha_hex);
    store_b64(md5, 16, md5_b64, sizeof md5_b64);
    snprintf(pn, sizeof pn, "%d", part_no);
    s3_op op;
    s3_op_init(&op, "PUT", full);
    if (upload_id) {
        op.query[op.n_query++] = (sigv4_param){"partNumber", pn};
        op.query[op.n_query++] = (sigv4_param){"uploadId", upload_id};
    }
    op.io.body_fd = fd;
    op.io.body_off = off;
    op.io.body_size = len;
    op.payload_hash = sha_hex;
    op.content_md5 = md5_b64;
    http_resp rs = {0};
    for (int tries = 0; tries < 3; tries++) {
        rc = s3_call(s, &op, &rs, err);
        if (rc) break;
        if (etag_matches(rs.etag, md5)) {
            store_strlcpy(etag_out, rs.etag, etag_sz);
            break;
        }
        rc = ty_err_set(err, TY_ECORRUPT,
                        "storage: %s (part %d): stored checksum differs from the sent data", full,
                        part_no);
    }
    store_http_resp_clear(&rs);
    return rc;
}

typedef struct mp_job {
    store *s;
    const char *full;
    const char *upload_id;
    int fd;
    uint64_t size, part_size;
    char (*etags)[80];
} mp_job;

static int mp_part(void *ctx, int i, ty_err *err)
{
    mp_job *j = ctx;
    uint64_t off = (uint64_t)i * j->part_size;
    uint64_t len = j->size - off < j->part_size ? j->size - off : j->part_size;
    return s3_put_range(j->s, j->full, j->fd, off, len, j->upload_id, i + 1, j->etags[i],
                        sizeof j->etags[i], err);
}

static void s3_abort(store *s, const char *full, const char *upload_id)
{
    s3_op op;
    s3_op_init(&op, "DELETE", full);
    op.query[op.n_query++] = (sigv4_param){"uploadId", upload_id};
    http_resp rs = {0};
    ty_err ignored;
    s3_call(s, &op, &rs, &ignored); /* best effort: lifecycle rules clean up the rest */
    store_http_resp_clear(&rs);
}

static int s3_multipart(store *s, const char *full, int fd, uint64_t size, ty_err *err)
{
    uint64_t part = s->tune.part_size;
    if (part < (5u << 20) && size > part) part = 5u << 20; /* S3's minimum for all but the last */
    while ((size + part - 1) / part > 10000)
        part *= 2; /* S3's maximum part count */
    int nparts = (int)((size + part - 1) / part);

    s3_op op;
    s3_op_init(&op, "POST", full);
    op.query[op.n_query++] = (sigv4_param){"uploads", ""};
    http_resp rs = {0};
    int rc = s3_call(s, &op, &rs, err);
    char upload_id[512] = "";
    size_t pos = 0;
    if (rc == 0 &&
        (!rs.body || !store_xml_field(rs.body, "UploadId", &pos, upload_id, sizeof upload_id) ||
         !upload_id[0]))
        rc = ty_err_set(err, TY_EIO, "storage: %s: CreateMultipartUpload reply has no UploadId",
                        full);
    store_http_resp_clear(&rs);
    if (rc) return rc;

    mp_job j = {
        .s = s, .full = full, .upload_id = upload_id, .fd = fd, .size = size, .part_size = part};
    j.etags = calloc((size_t)nparts, sizeof *j.etags);
    if (!j.etags) {
        s3_abort(s, full, upload_id);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    rc = store_run_parts(s, nparts, mp_part, &j, err);
    if (rc) goto fail;

    /* CompleteMultipartUpload body: small (a line per part). */
    size_t cap = 128 + (size_t)nparts * 140;
    char *xml = malloc(cap);
    if (!xml) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto fail;
    }
    size_t n = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
    for (int i = 0; i < nparts; i++)
        n += (size_t)snprintf(xml + n, cap - n,
                              "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", i + 1,
                              j.etags[i]);
    n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
    unsigned char md5[16], sha[32];
    char sha_hex[65], md5_b64[32];
    EVP_Digest(xml, n, md5, NULL, EVP_md5(), NULL);
    EVP_Digest(xml, n, sha, NULL, EVP_sha256(), NULL);
    ty_hex(sha, 32, sha_hex);
    store_b64(md5, 16, md5_b64, sizeof md5_b64);
    s3_op_init(&op, "POST", full);
    op.query[op.n_query++] = (sigv4_param){"uploadId", upload_id};
    op.headers[op.n_headers++] = (sigv4_param){"content-type", "application/xml"};
    op.io.body = xml;
    op.io.body_len = n;
    op.payload_hash = sha_hex;
    op.content_md5 = md5_b64;
    rc = s3_call(s, &op, &rs, err);
    /* S3 may answer 200 and still report an error in the body. */
    if (rc == 0 && rs.body && strstr(rs.body, "<Error>")) {
        char detail[400];
        s3_error_detail(&rs, detail, sizeof detail);
        rc = ty_err_set(err, TY_EIO, "storage: %s: CompleteMultipartUpload failed: %s", full,
                        detail);
    }
    store_http_resp_clear(&rs);
    free(xml);
    if (rc) goto fail;
    free(j.etags);
    return 0;
fail:
    s3_abort(s, full, upload_id);
    free(j.etags);
    return rc;
}

static int s3_put_file(store *s, const char *key, const char *path, ty_err *err)
{
    char *full;
    int fd;
    uint64_t size;
    int rc = store_put_open(s, key, path, &full, &fd, &size, err);
    if (rc) return rc;
    if (size > s->tune.multipart_threshold && size > (5u << 20)) {
        rc = s3_multipart(s, full, fd, size, err);
    } else {
        char etag[80];
        rc = s3_put_range(s, full, fd, 0, size, NULL, 0, etag, sizeof etag, err);
    }
    close(fd);
    free(full);
    return rc;
}

static int s3_get_once(store *s, const char *full, int fd, http_resp *rs, ty_err *err)
{
    s3_op op;
    s3_op_init(&op, "GET", full);
    op.io.resp_fd = fd;
    return s3_call(s, &op, rs, err);
}

/* A plain ETag is the MD5 of the object; multipart ETags ("...-N") are
 * not, and those objects rely on the manifest's sha256. */
static int s3_md5_ok(const http_resp *rs)
{
    return etag_matches(rs->etag, rs->md5);
}

static int s3_get_file(store *s, const char *key, const char *path, ty_err *err)
{
    return store_get_verified(s, key, path, s3_get_once, s3_md5_ok, "the object's MD5", err);
}

static int s3_stat(store *s, const char *key, store_object *out, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    s3_op op;
    s3_op_init(&op, "HEAD", full);
    op.io.no_body = 1;
    http_resp rs = {0};
    rc = s3_call(s, &op, &rs, err);
    if (rc == 0) {
        rc = store_object_from_head(key, &rs, out, err);
    } else if (rc == TY_ENOENT) {
        rc = ty_err_set(err, TY_ENOENT, "storage: %s/%s: no such object", s->bucket, full);
    }
    store_http_resp_clear(&rs);
    free(full);
    return rc;
}

static int s3_list(store *s, const char *prefix, store_listing *out, ty_err *err)
{
    static const store_xml_list_tags tags = {"Contents", "Key", "Size", "ETag", "LastModified"};
    char *full = store_list_prefix(s, prefix);
    if (!full) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    char token[1024] = "";
    int rc = 0;
    for (;;) {
        s3_op op;
        s3_op_init(&op, "GET", NULL);
        op.query[op.n_query++] = (sigv4_param){"list-type", "2"};
        op.query[op.n_query++] = (sigv4_param){"prefix", full};
        if (token[0]) op.query[op.n_query++] = (sigv4_param){"continuation-token", token};
        http_resp rs = {0};
        rc = s3_call(s, &op, &rs, err);
        if (rc == 0 && !rs.body)
            rc = ty_err_set(err, TY_EIO, "storage: list %s: empty reply", s->bucket);
        if (rc) {
            store_http_resp_clear(&rs);
            break;
        }
        rc = store_xml_list_page(s, rs.body, &tags, out, err);
        char trunc[16] = "";
        size_t pos = 0;
        store_xml_field(rs.body, "IsTruncated", &pos, trunc, sizeof trunc);
        token[0] = '\0';
        pos = 0;
        if (!strcmp(trunc, "true"))
            store_xml_field(rs.body, "NextContinuationToken", &pos, token, sizeof token);
        store_http_resp_clear(&rs);
        if (rc || !token[0]) break;
    }
    free(full);
    return rc;
}

static int s3_del(store *s, const char *key, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    s3_op op;
    s3_op_init(&op, "DELETE", full);
    http_resp rs = {0};
    rc = s3_call(s, &op, &rs, err);
    store_http_resp_clear(&rs);
    free(full);
    return rc;
}

static const store_backend s3_backend = {"s3",    s3_put_file, s3_get_file, s3_stat,
                                         s3_list, s3_del,      s3_close};
static const store_backend gs_xml_backend = {"gs",    s3_put_file, s3_get_file, s3_stat,
                                             s3_list, s3_del,      s3_close};

int store_s3_open(store *s, const store_config *cfg, int gcs, ty_err *err)
{
    s3_impl *m = calloc(1, sizeof *m);
    if (!m) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    s->impl = m;
    s->be = gcs ? &gs_xml_backend : &s3_backend;
    m->gcs = gcs;
    m->service = "s3";
    const char *ak, *sk, *tok = NULL, *region, *ep;
    if (gcs) {
        ak = store_cfg_str(cfg, cfg->gcs_hmac_access_id, "GCS_HMAC_ACCESS_ID");
        sk = store_cfg_str(cfg, cfg->gcs_hmac_secret, "GCS_HMAC_SECRET");
        region = "auto";
        ep = store_cfg_str(cfg, cfg->gcs_xml_endpoint, "GCS_ENDPOINT_URL");
        if (!ep) ep = "https://storage.googleapis.com";
    } else {
        ak = store_cfg_str(cfg, cfg->aws_access_key_id, "AWS_ACCESS_KEY_ID");
        sk = store_cfg_str(cfg, cfg->aws_secret_access_key, "AWS_SECRET_ACCESS_KEY");
        tok = store_cfg_str(cfg, cfg->aws_session_token, "AWS_SESSION_TOKEN");
        region = store_cfg_str(cfg, cfg->aws_region, "AWS_REGION");
        if (!region) region = store_cfg_str(cfg, NULL, "AWS_DEFAULT_REGION");
        if (!region) region = "us-east-1";
        ep = store_cfg_str(cfg, cfg->s3_endpoint, "AWS_ENDPOINT_URL_S3");
        if (!ep) ep = store_cfg_str(cfg, NULL, "AWS_ENDPOINT_URL");
    }
    if (!ak || !sk)
        return ty_err_set(err, TY_EAUTH,
                          gcs ? "storage: %s needs GCS HMAC keys (GCS_HMAC_ACCESS_ID, "
                                "GCS_HMAC_SECRET) or a service account"
                              : "storage: %s needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                "(environment or config)",
                          s->uri);
    char defep[128];
    if (!ep) {
        snprintf(defep, sizeof defep, "https://s3.%s.amazonaws.com", region);
        ep = defep;
    }
    if (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8))
        return ty_err_set(err, TY_EINVAL,
                          "storage: endpoint '%s' must start with http:// or https://", ep);
    m->endpoint = strdup(ep);
    if (!m->endpoint) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    size_t el = strlen(m->endpoint);
    while (el && m->endpoint[el - 1] == '/')
        m->endpoint[--el] = '\0';
    const char *h = strstr(m->endpoint, "://") + 3;
    m->host = strndup(h, strcspn(h, "/"));
    m->access_key = strdup(ak);
    m->secret_key = strdup(sk);
    m->token = store_strdup0(tok);
    m->region = strdup(region);
    if (!m->host || !m->access_key || !m->secret_key || (tok && !m->token) || !m->region)
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (!m->host[0]) return ty_err_set(err, TY_EINVAL, "storage: endpoint '%s' has no host", ep);
    return 0;
}
