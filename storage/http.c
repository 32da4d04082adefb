/* http.c — one HTTP exchange over libcurl for the storage backends.
 *
 * Request bodies stream from a file range through a read callback (pread at
 * an offset, so parallel parts share one descriptor) and response bodies
 * stream into a file through a write callback that also hashes them, so a
 * multi-gigabyte checkpoint never sits in memory. Small bodies (XML/JSON
 * replies, error documents) are captured with a cap. The caller decides
 * about retries: this file only classifies failures as retryable or not.
 *
 * Headers are never logged (they carry signatures and tokens), and error
 * messages name the method, host and path but never the query string,
 * which may hold a SAS token. */
#include "store_int.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum { HTTP_BODY_CAP = 4 << 20 };

typedef struct xfer {
    const http_req *rq;
    http_resp *rs;
    uint64_t sent; /* of the request body */
    size_t mem_off;
    int io_error; /* errno of a failed local read/write */
    int over_cap;
    EVP_MD_CTX *md5;
} xfer;

void store_http_req_init(http_req *rq, const char *method, const char *url)
{
    memset(rq, 0, sizeof *rq);
    rq->method = method;
    rq->url = url;
    rq->body_fd = -1;
    rq->resp_fd = -1;
}

void store_http_resp_clear(http_resp *rs)
{
    free(rs->body);
    memset(rs, 0, sizeof *rs);
    rs->content_length = -1;
}

int store_http_header(struct curl_slist **h, ty_err *err, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf)
        return ty_err_set(err, TY_EINVAL, "storage: header too long");
    struct curl_slist *nh = curl_slist_append(*h, buf);
    if (!nh) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    *h = nh;
    return 0;
}

int store_http_status_retryable(long status)
{
    return status >= 500 || status == 429 || status == 408;
}

static size_t read_cb(char *buf, size_t size, size_t nmemb, void *u)
{
    xfer *x = u;
    size_t want = size * nmemb;
    const http_req *rq = x->rq;
    if (rq->body_fd >= 0) {
        uint64_t left = rq->body_size - x->sent;
        if (want > left) want = (size_t)left;
        if (want == 0) return 0;
        for (;;) {
            ssize_t r = pread(rq->body_fd, buf, want, (off_t)(rq->body_off + x->sent));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                x->io_error = r < 0 ? errno : EIO;
                return CURL_READFUNC_ABORT;
            }
            x->sent += (uint64_t)r;
            return (size_t)r;
        }
    }
    size_t left = rq->body_len - x->mem_off;
    if (want > left) want = left;
    memcpy(buf, rq->body + x->mem_off, want);
    x->mem_off += want;
    return want;
}

/* Rewinds the request body when curl must resend it (a redirect or a
 * connection that died before the response started). */
static int seek_cb(void *u, curl_off_t offset, int origin)
{
    xfer *x = u;
    if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
    if (x->rq->body_fd >= 0) {
        if ((uint64_t)offset > x->rq->body_size) return CURL_SEEKFUNC_FAIL;
        x->sent = (uint64_t)offset;
    } else {
        if ((size_t)offset > x->rq->body_len) return CURL_SEEKFUNC_FAIL;
        x->mem_off = (size_t)offset;
    }
    return CURL_SEEKFUNC_OK;
}

static int capture(xfer *x, const char *p, size_t n)
{
    http_resp *rs = x->rs;
    if (rs->body_len + n > HTTP_BODY_CAP) {
        x->over_cap = 1;
        return -1;
    }
    char *nb = realloc(rs->body, rs->body_len + n + 1);
    if (!nb) return -1;
    memcpy(nb + rs->body_len, p, n);
    rs->body = nb;
    rs->body_len += n;
    rs->body[rs->body_len] = '\0';
    return 0;
}

static size_t write_cb(char *p, size_t size, size_t nmemb, void *u)
{
    xfer *x = u;
    size_t n = size * nmemb;
    http_resp *rs = x->rs;
    int ok2xx = rs->status >= 200 && rs->status < 300;
    if (x->rq->resp_fd >= 0 && ok2xx) {
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(x->rq->resp_fd, p + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                x->io_error = w < 0 ? errno : EIO;
                return 0;
            }
            done += (size_t)w;
        }
        if (x->md5) EVP_DigestUpdate(x->md5, p, n);
        rs->bytes_written += n;
        return n;
    }
    if (capture(x, p, n) != 0) return 0;
    return n;
}

/* Aborts a transfer once store_cancel was called. */
static int progress_cb(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    store *s = u;
    return atomic_load(&s->cancelled) ? 1 : 0;
}

static void copy_hval(char *dst, size_t dsz, const char *v, size_t vl)
{
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
        vl--;
    while (vl && *v == ' ')
        v++, vl--;
    if (vl >= dsz) vl = dsz - 1;
    memcpy(dst, v, vl);
    dst[vl] = '\0';
}

static size_t header_cb(char *p, size_t size, size_t nmemb, void *u)
{
    xfer *x = u;
    http_resp *rs = x->rs;
    size_t n = size * nmemb;
    if (n > 5 && !strncmp(p, "HTTP/", 5)) {
        /* A new status line (after 100-continue or a redirect): start over. */
        const char *sp = memchr(p, ' ', n);
        rs->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        rs->etag[0] = rs->content_md5[0] = rs->goog_hash[0] = rs->location[0] = '\0';
        rs->range[0] = rs->last_modified[0] = rs->err_code[0] = '\0';
        rs->content_length = -1;
        return n;
    }
    const char *colon = memchr(p, ':', n);
    if (!colon) return n;
    size_t nl = (size_t)(colon - p);
    const char *v = colon + 1;
    size_t vl = n - nl - 1;
#define HDR(name) (nl == sizeof(name) - 1 && !strncasecmp(p, name, nl))
    if (HDR("etag"))
        copy_hval(rs->etag, sizeof rs->etag, v, vl);
    else if (HDR("content-md5") || HDR("x-ms-blob-content-md5"))
        copy_hval(rs->content_md5, sizeof rs->content_md5, v, vl);
    else if (HDR("x-goog-hash")) {
        char tmp[200];
        copy_hval(tmp, sizeof tmp, v, vl);
        size_t cur = strlen(rs->goog_hash);
        snprintf(rs->goog_hash + cur, sizeof rs->goog_hash - cur, "%s%s", cur ? "," : "", tmp);
    } else if (HDR("location"))
        copy_hval(rs->location, sizeof rs->location, v, vl);
    else if (HDR("range"))
        copy_hval(rs->range, sizeof rs->range, v, vl);
    else if (HDR("last-modified"))
        copy_hval(rs->last_modified, sizeof rs->last_modified, v, vl);
    else if (HDR("x-ms-error-code"))
        copy_hval(rs->err_code, sizeof rs->err_code, v, vl);
    else if (HDR("content-length")) {
        char tmp[32];
        copy_hval(tmp, sizeof tmp, v, vl);
        rs->content_length = strtoll(tmp, NULL, 10);
    }
#undef HDR
    return n;
}

/* "GET host/path" without the query string (it may carry a SAS token). */
static void describe(const http_req *rq, char *out, size_t n)
{
    const char *u = rq->url;
    const char *s = strstr(u, "://");
    if (s) u = s + 3;
    size_t l = strcspn(u, "?");
    if (l > 200) l = 200;
    snprintf(out, n, "%s %.*s", rq->method, (int)l, u);
}

int store_http_do(store *s, const http_req *rq, http_resp *rs, int *retryable, ty_err *err)
{
    *retryable = 0;
    store_http_resp_clear(rs);
    int crc = store_check_cancel(s, err);
    if (crc) return crc;
    CURL *h = curl_easy_init();
    if (!h) return ty_err_set(err, TY_ENOMEM, "storage: curl_easy_init failed");
    xfer x = {.rq = rq, .rs = rs};
    if (rq->resp_fd >= 0) {
        x.md5 = EVP_MD_CTX_new();
        if (!x.md5) {
            curl_easy_cleanup(h);
            return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        }
        EVP_DigestInit_ex(x.md5, EVP_md5(), NULL);
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    /* No "Expect: 100-continue": one round trip fewer per part, and proxies
     * in the tests stay simple. */
    struct curl_slist *hdrs = rq->headers;
    struct curl_slist *extra = curl_slist_append(NULL, "Expect:");
    struct curl_slist *all = NULL;
    for (struct curl_slist *p = hdrs; p; p = p->next)
        all = curl_slist_append(all, p->data);
    for (struct curl_slist *p = extra; p; p = p->next)
        all = curl_slist_append(all, p->data);
    curl_slist_free_all(extra);

    curl_easy_setopt(h, CURLOPT_URL, rq->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (s && s->share) curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    if (s) {
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress_cb);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, all);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, s ? s->tune.connect_timeout_s : 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, s ? s->tune.stall_timeout_s : 30L);
    if (s && s->tune.request_timeout_s > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT, s->tune.request_timeout_s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 1024L * 1024);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    int has_body = rq->body_fd >= 0 || rq->body;
    if (rq->no_body) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (has_body) {
        curl_off_t len = rq->body_fd >= 0 ? (curl_off_t)rq->body_size : (curl_off_t)rq->body_len;
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, len);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, &x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, &x);
    } else if (!strcmp(rq->method, "PUT") || !strcmp(rq->method, "POST")) {
        /* An empty body still needs Content-Length: 0. */
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    if (strcmp(rq->method, "GET") && !rq->no_body)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);

    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    curl_slist_free_all(all);
    if (x.md5) {
        EVP_DigestFinal_ex(x.md5, rs->md5, NULL);
        EVP_MD_CTX_free(x.md5);
    }
    char what[256];
    describe(rq, what, sizeof what);
    if (x.io_error)
        return ty_err_set(err, TY_EIO, "storage: %s: local file: %s", what, strerror(x.io_error));
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        return ty_err_set(err, TY_ESTATE, "storage: %s: cancelled", what);
    if (cc == CURLE_WRITE_ERROR && x.over_cap)
        return ty_err_set(err, TY_ETOOBIG, "storage: %s: reply larger than %d bytes", what,
                          HTTP_BODY_CAP);
    if (cc != CURLE_OK) {
        switch (cc) {
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_COULDNT_CONNECT:
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_PARTIAL_FILE:
        case CURLE_GOT_NOTHING:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
        case CURLE_READ_ERROR:
            *retryable = 1;
            break;
        default:
            break;
        }
        return ty_err_set(err, TY_EIO, "storage: %s: %s", what,
                          errbuf[0] ? errbuf : curl_easy_strerror(cc));
    }
    rs->status = status;
    /* A 2xx body shorter than announced is a truncation curl may not flag
     * (e.g. a close-delimited body). */
    if (rq->resp_fd >= 0 && status >= 200 && status < 300 && rs->content_length >= 0 &&
        rs->bytes_written != (uint64_t)rs->content_length) {
        *retryable = 1;
        return ty_err_set(err, TY_EIO, "storage: %s: body truncated (%llu of %lld bytes)", what,
                          (unsigned long long)rs->bytes_written, (long long)rs->content_length);
    }
    return 0;
}
