/* azure.c — the az:// backend: Azure Blob Storage block blobs.
 *
 * Authentication is SharedKey (HMAC-SHA256 over the canonical string:
 * verb, the standard headers, sorted x-ms-* headers, and the canonical
 * resource /account/path plus sorted query parameters) or a SAS token
 * appended to every URL. Small files go up with one Put Blob; larger ones
 * as parallel Put Block calls (each retried alone, each with Content-MD5
 * so the service rejects a corrupted block) and one Put Block List that
 * commits them. The endpoint comes from a connection string's BlobEndpoint
 * (Azurite) or defaults to https://ACCOUNT.blob.core.windows.net. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store_int.h"
#include "tyutil.h"

#define AZ_VERSION "2021-08-06"

typedef struct az_impl {
    char *endpoint; /* scheme://host[:port][/path], no trailing slash */
    char *account;
    unsigned char key[128];
    size_t keylen; /* 0: SAS */
    char *sas;     /* without leading '?' */
} az_impl;

typedef struct az_param {
    const char *name, *value;
} az_param;

typedef struct az_op {
    const char *method;
    const char *blob; /* full blob name or NULL for the container */
    az_param query[4];
    size_t n_query;
    const char *xms[4][2]; /* extra x-ms-* headers (lowercase names) */
    size_t n_xms;
    const char *content_type;
    const char *content_md5;
    http_req io; /* body and download target; the call sets method, URL, headers */
} az_op;

static void az_op_init(az_op *op, const char *method, const char *blob)
{
    memset(op, 0, sizeof *op);
    op->method = method;
    op->blob = blob;
    store_http_req_init(&op->io, method, NULL);
}

static void az_close(store *s)
{
    az_impl *m = s->impl;
    if (!m) return;
    free(m->endpoint);
    free(m->account);
    OPENSSL_cleanse(m->key, sizeof m->key);
    store_free_secret(m->sas);
    free(m);
    s->impl = NULL;
}

static int qcmp(const void *a, const void *b)
{
    return strcasecmp(((const az_param *)a)->name, ((const az_param *)b)->name);
}

static int hcmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Builds the SharedKey string to sign (exposed for the unit test). */
char *store_azure_string_to_sign(const char *method, const char *content_length,
                                 const char *content_md5, const char *content_type,
                                 const char *(*xms)[2], size_t n_xms, const char *account,
                                 const char *path, const az_param *query, size_t n_query);

char *store_azure_string_to_sign(const char *method, const char *content_length,
                                 const char *content_md5, const char *content_type,
                                 const char *(*xms)[2], size_t n_xms, const char *account,
                                 const char *path, const az_param *query, size_t n_query)
{
    size_t cap = 1024 + strlen(path) + strlen(account);
    for (size_t i = 0; i < n_xms; i++)
        cap += strlen(xms[i][0]) + strlen(xms[i][1]) + 2;
    for (size_t i = 0; i < n_query; i++)
        cap += strlen(query[i].name) + strlen(query[i].value) + 2;
    char *out = malloc(cap);
    az_param *q = calloc(n_query + 1, sizeof *q);
    if (!out || !q) {
        free(out);
        free(q);
        return NULL;
    }
    /* Content-Length is empty for a zero-length body (version 2015-02-21+). */
    const char *cl = content_length && strcmp(content_length, "0") ? content_length : "";
    size_t n = (size_t)snprintf(out, cap, "%s\n\n\n%s\n%s\n%s\n\n\n\n\n\n\n", method, cl,
                                content_md5 ? content_md5 : "", content_type ? content_type : "");
    /* x-ms-* headers: "name:value\n" sorted by name (names are lowercase). */
    const char *names[16][2];
    size_t nn = n_xms < 16 ? n_xms : 16;
    for (size_t i = 0; i < nn; i++)
        names[i][0] = xms[i][0], names[i][1] = xms[i][1];
    qsort(names, nn, sizeof names[0], hcmp);
    for (size_t i = 0; i < nn; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s:%s\n", names[i][0], names[i][1]);
    n += (size_t)snprintf(out + n, cap - n, "/%s%s", account, path);
    memcpy(q, query, n_query * sizeof *q);
    qsort(q, n_query, sizeof *q, qcmp);
    for (size_t i = 0; i < n_query; i++) {
        char lname[64];
        store_strlcpy(lname, q[i].name, sizeof lname);
        for (char *c = lname; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
        n += (size_t)snprintf(out + n, cap - n, "\n%s:%s", lname, q[i].value);
    }
    free(q);
    return out;
}

static int az_attempt(store *s, const az_op *op, http_resp *rs, int *retryable, ty_err *err)
{
    az_impl *m = s->impl;
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);

    /* URL path: [endpoint path]/container[/blob] */
    const char *after = strstr(m->endpoint, "://") + 3;
    const char *epath = strchr(after, '/');
    char *eblob = op->blob ? store_urlencode(op->blob, 1) : strdup("");
    size_t pl = (epath ? strlen(epath) : 0) + strlen(s->bucket) + strlen(eblob ? eblob : "") + 4;
    char *path = malloc(pl);
    /* Query string: encoded params, then the SAS token. */
    size_t ql = 16 + (m->sas ? strlen(m->sas) : 0);
    for (size_t i = 0; i < op->n_query; i++)
        ql += 3 * (strlen(op->query[i].name) + strlen(op->query[i].value)) + 2;
    char *qs = malloc(ql);
    char *url = NULL;
    char *sts = NULL;
    struct curl_slist *h = NULL;
    int rc = 0;
    if (!eblob || !path || !qs) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto out;
    }
    snprintf(path, pl, "%s/%s%s%s", epath ? epath : "", s->bucket, op->blob ? "/" : "", eblob);
    size_t qn = 0;
    qs[0] = '\0';
    for (size_t i = 0; i < op->n_query; i++) {
        char *en = store_urlencode(op->query[i].name, 0),
             *ev = store_urlencode(op->query[i].value, 0);
        if (en && ev) qn += (size_t)snprintf(qs + qn, ql - qn, "%s%s=%s", qn ? "&" : "", en, ev);
        free(en);
        free(ev);
    }
    if (m->sas) snprintf(qs + qn, ql - qn, "%s%s", qn ? "&" : "", m->sas);
    size_t ul = strlen(m->endpoint) + strlen(path) + strlen(qs) + 4;
    url = malloc(ul);
    if (!url) {
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        goto out;
    }
    snprintf(url, ul, "%.*s%s%s%s",
             (int)(epath ? (size_t)(epath - m->endpoint) : strlen(m->endpoint)), m->endpoint, path,
             qs[0] ? "?" : "", qs);

    const char *xms[8][2];
    size_t nx = 0;
    xms[nx][0] = "x-ms-date", xms[nx++][1] = date;
    xms[nx][0] = "x-ms-version", xms[nx++][1] = AZ_VERSION;
    for (size_t i = 0; i < op->n_xms; i++)
        xms[nx][0] = op->xms[i][0], xms[nx++][1] = op->xms[i][1];
    uint64_t blen = op->io.body_fd >= 0 ? op->io.body_size : op->io.body_len;
    int has_body = op->io.body_fd >= 0 || op->io.body || !strcmp(op->method, "PUT");
    char clen[32];
    snprintf(clen, sizeof clen, "%llu", (unsigned long long)blen);
    for (size_t i = 0; i < nx && rc == 0; i++)
        rc = store_http_header(&h, err, "%s: %s", xms[i][0], xms[i][1]);
    if (rc == 0 && op->content_md5)
        rc = store_http_header(&h, err, "Content-MD5: %s", op->content_md5);
    /* curl would otherwise add its own form Content-Type to a PUT body,
     * which then would not match the signature. */
    if (rc == 0)
        rc = store_http_header(&h, err, "Content-Type: %s",
                               op->content_type ? op->content_type : "");
    if (rc == 0 && m->keylen) {
        sts = store_azure_string_to_sign(op->method, has_body ? clen : "", op->content_md5,
                                         op->content_type, xms, nx, m->account, path,
                                         (const az_param *)op->query, op->n_query);
        if (!sts) {
            rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
            goto out;
        }
        unsigned char mac[32];
        unsigned int ml = 32;
        HMAC(EVP_sha256(), m->key, (int)m->keylen, (const unsigned char *)sts, strlen(sts), mac,
             &ml);
        char b64[64];
        store_b64(mac, 32, b64, sizeof b64);
        rc = store_http_header(&h, err, "Authorization: SharedKey %s:%s", m->account, b64);
    }
    if (rc == 0) {
        http_req rq = op->io;
        rq.method = op->method;
        rq.url = url;
        rq.headers = h;
        rc = store_http_do(s, &rq, rs, retryable, err);
    }
out:
    curl_slist_free_all(h);
    free(sts);
    free(url);
    free(qs);
    free(path);
    free(eblob);
    return rc;
}

static int az_call(store *s, const az_op *op, http_resp *rs, ty_err *err)
{
    int rc = TY_EIO;
    for (int attempt = 1; attempt <= s->tune.max_attempts; attempt++) {
        if (attempt > 1 && (rc = store_retry_sleep(s, attempt - 1, err)) != 0) return rc;
        if (op->io.resp_fd >= 0 && (rc = store_fd_reset(op->io.resp_fd, err)) != 0) return rc;
        int retryable = 0;
        rc = az_attempt(s, op, rs, &retryable, err);
        if (rc != 0) {
            if (retryable) continue;
            return rc;
        }
        if (rs->status >= 200 && rs->status < 300) return 0;
        char code[128] = "";
        size_t pos = 0;
        if (rs->err_code[0])
            store_strlcpy(code, rs->err_code, sizeof code);
        else if (rs->body)
            store_xml_field(rs->body, "Code", &pos, code, sizeof code);
        int ty = rs->status == 404                                               ? TY_ENOENT
                 : rs->status == 403 || rs->status == 401                        ? TY_EAUTH
                 : (!strcmp(code, "Md5Mismatch") || !strcmp(code, "InvalidMd5")) ? TY_ECORRUPT
                                                                                 : TY_EIO;
        rc = ty_err_set(err, ty, "storage: %s az://%s/%s: HTTP %ld%s%s", op->method, s->bucket,
                        op->blob ? op->blob : "", rs->status, code[0] ? " " : "", code);
        if (!store_http_status_retryable(rs->status)) return rc;
    }
    return rc;
}

static void md5_b64_of(int fd, uint64_t off, uint64_t len, char out[32], unsigned char raw[16],
                       int *rc, ty_err *err)
{
    *rc = store_hash_range(fd, off, len, raw, NULL, err);
    if (*rc == 0) store_b64(raw, 16, out, 32);
}

typedef struct az_blocks {
    store *s;
    const char *blob;
    int fd;
    uint64_t size, bsize;
} az_blocks;

static void block_id(int i, char out[32])
{
    char raw[16];
    snprintf(raw, sizeof raw, "ty-block-%06d", i);
    store_b64((const unsigned char *)raw, strlen(raw), out, 32);
}

static int az_put_block(void *ctx, int i, ty_err *err)
{
    az_blocks *b = ctx;
    uint64_t off = (uint64_t)i * b->bsize;
    uint64_t len = b->size - off < b->bsize ? b->size - off : b->bsize;
    char md5[32], id[32];
    unsigned char raw[16];
    int rc;
    md5_b64_of(b->fd, off, len, md5, raw, &rc, err);
    if (rc) return rc;
    block_id(i, id);
    az_op op;
    az_op_init(&op, "PUT", b->blob);
    op.query[op.n_query++] = (az_param){"comp", "block"};
    op.query[op.n_query++] = (az_param){"blockid", id};
    op.content_md5 = md5;
    op.io.body_fd = b->fd;
    op.io.body_off = off;
    op.io.body_size = len;
    http_resp rs = {0};
    rc = az_call(b->s, &op, &rs, err);
    store_http_resp_clear(&rs);
    return rc;
}

static int az_put_file(store *s, const char *key, const char *path, ty_err *err)
{
    char *full;
    int fd;
    uint64_t size;
    int rc = store_put_open(s, key, path, &full, &fd, &size, err);
    if (rc) return rc;
    http_resp rs = {0};
    if (size <= s->tune.multipart_threshold) {
        char md5[32];
        unsigned char raw[16];
        md5_b64_of(fd, 0, size, md5, raw, &rc, err);
        az_op op;
        az_op_init(&op, "PUT", full);
        op.xms[op.n_xms][0] = "x-ms-blob-type", op.xms[op.n_xms++][1] = "BlockBlob";
        op.content_md5 = md5;
        op.io.body_fd = fd;
        op.io.body_size = size;
        if (rc == 0) rc = az_call(s, &op, &rs, err);
    } else {
        uint64_t bsize = s->tune.part_size;
        while ((size + bsize - 1) / bsize > 50000)
            bsize *= 2; /* the service's block count limit */
        int nblocks = (int)((size + bsize - 1) / bsize);
        az_blocks b = {s, full, fd, size, bsize};
        rc = store_run_parts(s, nblocks, az_put_block, &b, err);
        char *xml = NULL;
        if (rc == 0) {
            size_t cap = 128 + (size_t)nblocks * 48;
            xml = malloc(cap);
            if (!xml)
                rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
            else {
                size_t n = (size_t)snprintf(
                    xml, cap, "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
                for (int i = 0; i < nblocks; i++) {
                    char id[32];
                    block_id(i, id);
                    n += (size_t)snprintf(xml + n, cap - n, "<Latest>%s</Latest>", id);
                }
                n += (size_t)snprintf(xml + n, cap - n, "</BlockList>");
                unsigned char raw[16];
                char md5[32];
                EVP_Digest(xml, n, raw, NULL, EVP_md5(), NULL);
                store_b64(raw, 16, md5, sizeof md5);
                az_op op;
                az_op_init(&op, "PUT", full);
                op.query[op.n_query++] = (az_param){"comp", "blocklist"};
                op.content_type = "application/xml";
                op.content_md5 = md5;
                op.io.body = xml;
                op.io.body_len = n;
                rc = az_call(s, &op, &rs, err);
            }
        }
        /* Uncommitted blocks are discarded by the service after a week; no
         * abort call exists. */
        free(xml);
    }
    store_http_resp_clear(&rs);
    close(fd);
    free(full);
    return rc;
}

static int az_get_once(store *s, const char *blob, int fd, http_resp *rs, ty_err *err)
{
    az_op op;
    az_op_init(&op, "GET", blob);
    op.io.resp_fd = fd;
    return az_call(s, &op, rs, err);
}

/* Content-MD5 is returned when the blob has one (Put Blob stores it). */
static int az_md5_ok(const http_resp *rs)
{
    if (!rs->content_md5[0]) return 1;
    char got[32];
    store_b64(rs->md5, 16, got, sizeof got);
    return !strcmp(got, rs->content_md5);
}

static int az_get_file(store *s, const char *key, const char *path, ty_err *err)
{
    return store_get_verified(s, key, path, az_get_once, az_md5_ok, "Content-MD5", err);
}

static int az_stat(store *s, const char *key, store_object *out, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    az_op op;
    az_op_init(&op, "HEAD", full);
    op.io.no_body = 1;
    http_resp rs = {0};
    rc = az_call(s, &op, &rs, err);
    if (rc == 0) rc = store_object_from_head(key, &rs, out, err);
    store_http_resp_clear(&rs);
    free(full);
    return rc;
}

static int az_list(store *s, const char *prefix, store_listing *out, ty_err *err)
{
    static const store_xml_list_tags tags = {"Blob", "Name", "Content-Length", "Etag",
                                             "Last-Modified"};
    char *full = store_list_prefix(s, prefix);
    if (!full) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    char marker[1024] = "";
    int rc = 0;
    for (;;) {
        az_op op;
        az_op_init(&op, "GET", NULL);
        op.query[op.n_query++] = (az_param){"restype", "container"};
        op.query[op.n_query++] = (az_param){"comp", "list"};
        op.query[op.n_query++] = (az_param){"prefix", full};
        if (marker[0]) op.query[op.n_query++] = (az_param){"marker", marker};
        http_resp rs = {0};
        rc = az_call(s, &op, &rs, err);
        if (rc == 0 && !rs.body)
            rc = ty_err_set(err, TY_EIO, "storage: list az://%s: empty reply", s->bucket);
        if (rc) {
            store_http_resp_clear(&rs);
            break;
        }
        rc = store_xml_list_page(s, rs.body, &tags, out, err);
        marker[0] = '\0';
        size_t pos = 0;
        store_xml_field(rs.body, "NextMarker", &pos, marker, sizeof marker);
        store_http_resp_clear(&rs);
        if (rc || !marker[0]) break;
    }
    free(full);
    return rc;
}

static int az_del(store *s, const char *key, ty_err *err)
{
    char *full;
    int rc = store_full_key(s, key, &full, err);
    if (rc) return rc;
    az_op op;
    az_op_init(&op, "DELETE", full);
    http_resp rs = {0};
    rc = az_call(s, &op, &rs, err);
    store_http_resp_clear(&rs);
    free(full);
    return rc;
}

static const store_backend az_backend = {"az",    az_put_file, az_get_file, az_stat,
                                         az_list, az_del,      az_close};

/* Value of Name= in a ';'-separated connection string, copied; NULL if absent. */
static char *conn_field(const char *cs, const char *name)
{
    size_t nl = strlen(name);
    const char *p = cs;
    while (p && *p) {
        while (*p == ';' || *p == ' ')
            p++;
        const char *end = strchr(p, ';');
        size_t l = end ? (size_t)(end - p) : strlen(p);
        if (l > nl && !strncasecmp(p, name, nl) && p[nl] == '=')
            return strndup(p + nl + 1, l - nl - 1);
        p = end;
    }
    return NULL;
}

int store_azure_open(store *s, const store_config *cfg, ty_err *err)
{
    az_impl *m = calloc(1, sizeof *m);
    if (!m) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    s->impl = m;
    s->be = &az_backend;
    char *key = NULL;
    const char *cs =
        store_cfg_str(cfg, cfg->azure_connection_string, "AZURE_STORAGE_CONNECTION_STRING");
    int rc = 0;
    if (cs) {
        m->account = conn_field(cs, "AccountName");
        key = conn_field(cs, "AccountKey");
        m->sas = conn_field(cs, "SharedAccessSignature");
        m->endpoint = conn_field(cs, "BlobEndpoint");
        if (!m->endpoint) {
            char *proto = conn_field(cs, "DefaultEndpointsProtocol"),
                 *suffix = conn_field(cs, "EndpointSuffix");
            if (m->account) {
                size_t n = strlen(m->account) + 64 + (suffix ? strlen(suffix) : 0);
                m->endpoint = malloc(n);
                if (m->endpoint)
                    snprintf(m->endpoint, n, "%s://%s.blob.%s", proto ? proto : "https", m->account,
                             suffix ? suffix : "core.windows.net");
            }
            free(proto);
            free(suffix);
        }
        if (!m->account && m->endpoint) {
            /* SAS-only strings name no account; take it from the host. */
            const char *h = strstr(m->endpoint, "://");
            if (h) m->account = strndup(h + 3, strcspn(h + 3, ".:/"));
        }
    } else {
        m->account = store_strdup0(store_cfg_str(cfg, cfg->azure_account, "AZURE_STORAGE_ACCOUNT"));
        key = store_strdup0(store_cfg_str(cfg, cfg->azure_key, "AZURE_STORAGE_KEY"));
        m->sas = store_strdup0(store_cfg_str(cfg, cfg->azure_sas_token, "AZURE_STORAGE_SAS_TOKEN"));
        m->endpoint =
            store_strdup0(store_cfg_str(cfg, cfg->azure_endpoint, "AZURE_STORAGE_BLOB_ENDPOINT"));
        if (!m->endpoint && m->account) {
            size_t n = strlen(m->account) + 40;
            m->endpoint = malloc(n);
            if (m->endpoint)
                snprintf(m->endpoint, n, "https://%s.blob.core.windows.net", m->account);
        }
    }
    if (!m->account || (!key && !m->sas)) {
        rc = ty_err_set(
            err, TY_EAUTH,
            "storage: %s needs AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with "
            "AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN",
            s->uri);
    } else if (!m->endpoint ||
               (strncmp(m->endpoint, "http://", 7) && strncmp(m->endpoint, "https://", 8))) {
        rc = ty_err_set(err, TY_EINVAL,
                        "storage: Azure blob endpoint must start with http:// or https://");
    }
    if (rc == 0 && key) {
        long kl = store_b64_decode(key, m->key, sizeof m->key);
        if (kl <= 0)
            rc = ty_err_set(err, TY_EAUTH, "storage: the Azure account key is not valid base64");
        else
            m->keylen = (size_t)kl;
    }
    if (rc == 0 && m->sas && m->sas[0] == '?') memmove(m->sas, m->sas + 1, strlen(m->sas));
    if (rc == 0) {
        size_t el = strlen(m->endpoint);
        while (el && m->endpoint[el - 1] == '/')
            m->endpoint[--el] = '\0';
    }
    store_free_secret(key);
    return rc;
}
