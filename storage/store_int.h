/* store_int.h — what the storage backends share inside the module: the
 * store struct and its backend table, the libcurl request helper with its
 * retry loop, hashing helpers, and the small text utilities (URL encoding,
 * base64, XML field extraction) the services' wire formats need.
 *
 * Not installed and not for other modules: they use storage.h. */
#ifndef TY_STORE_INT_H
#define TY_STORE_INT_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "storage.h"
#include "tyerr.h"

typedef struct store_backend {
    const char *scheme;
    int (*put_file)(store *s, const char *key, const char *path, ty_err *err);
    /* Downloads into path, verified by the service's checksum where it has one. */
    int (*get_file)(store *s, const char *key, const char *path, ty_err *err);
    int (*stat)(store *s, const char *key, store_object *out, ty_err *err);
    int (*list)(store *s, const char *prefix, store_listing *out, ty_err *err);
    int (*del)(store *s, const char *key, ty_err *err);
    void (*close)(store *s);
} store_backend;

/* Tuning after defaults were applied. */
typedef struct store_tuning {
    uint64_t multipart_threshold, part_size;
    int parallel, max_attempts, retry_base_ms, retry_max_ms;
    long connect_timeout_s, stall_timeout_s, request_timeout_s;
} store_tuning;

struct store {
    const store_backend *be;
    char *uri;    /* root URI as given, for messages */
    char *bucket; /* bucket / container; for file:// the root directory */
    char *prefix; /* "" or "a/b/" (always ends with '/') */
    store_tuning tune;
    CURLSH *share; /* DNS + connection cache shared by this store's handles */
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    void *impl;           /* backend state */
    atomic_int cancelled; /* set by store_cancel */
};

/* --- URIs and keys (uri.c) --- */
typedef enum store_scheme { STORE_FILE, STORE_S3, STORE_GS, STORE_AZ } store_scheme;
/* Splits a root URI into its scheme, bucket (for file://, the directory)
 * and prefix ("" or ending in '/'); both strings are the caller's. */
int store_uri_parse(const char *uri, store_scheme *scheme, char **bucket, char **prefix,
                    ty_err *err);
/* The full object name for a relative key: prefix + key. Validates key
 * (non-empty, no leading '/', no "." or ".." segments, no empty segments,
 * no control characters). Caller frees. */
int store_full_key(const store *s, const char *key, char **out, ty_err *err);
/* Strips the store prefix from a full object name; NULL if outside it. */
const char *store_rel_key(const store *s, const char *full);

/* Appends an object to a listing (copies key). */
int store_listing_add(store_listing *l, const char *key, uint64_t size, const char *etag,
                      int64_t mtime, ty_err *err);
void store_listing_sort(store_listing *l);

/* --- config resolution (store.c) --- */
/* cfg field if set, else getenv(var) when use_env, else NULL. */
const char *store_cfg_str(const store_config *cfg, const char *field, const char *var);

/* --- backends --- */
int store_file_open(store *s, const store_config *cfg, ty_err *err);
int store_s3_open(store *s, const store_config *cfg, int gcs, ty_err *err);
int store_gcs_open(store *s, const store_config *cfg, ty_err *err);
int store_azure_open(store *s, const store_config *cfg, ty_err *err);

/* --- HTTP (http.c) --- */

/* One HTTP exchange. The body comes from memory (body/body_len) or from a
 * file range (body_fd >= 0). A 2xx response body goes to resp_fd when it is
 * >= 0 (hashed on the way into resp.md5 for the caller to verify), otherwise
 * into resp.body (capped at 4 MiB). Non-2xx bodies are always captured
 * (capped) so error codes in them can be read.
 *
 * The backends' request structs carry one of these for the body and the
 * download target, and their call adds the method, URL and headers. */
typedef struct http_req {
    const char *method;
    const char *url;
    struct curl_slist *headers;
    const char *body;
    size_t body_len;
    int body_fd;
    uint64_t body_off, body_size;
    int resp_fd;
    int no_body; /* HEAD */
} http_req;

typedef struct http_resp {
    long status;
    char *body; /* NUL-terminated; owned; may be NULL */
    size_t body_len;
    uint64_t bytes_written; /* to resp_fd */
    unsigned char md5[16];  /* of the bytes written to resp_fd */
    char etag[128];
    char content_md5[64]; /* Content-MD5 / x-ms-blob-content-md5 (base64) */
    char goog_hash[256];  /* x-goog-hash, all values joined by ',' */
    char location[2048];
    char range[128];
    char last_modified[64];
    char err_code[128];     /* x-ms-error-code */
    int64_t content_length; /* -1 unknown */
} http_resp;

void store_http_req_init(http_req *rq, const char *method, const char *url);
void store_http_resp_clear(http_resp *rs);
/* Performs one attempt. Returns 0 when an HTTP response arrived (any
 * status), or TY_EIO for a transport failure; *retryable says whether
 * trying again could help (timeouts, resets, truncation). */
int store_http_do(store *s, const http_req *rq, http_resp *rs, int *retryable, ty_err *err);
/* Whether an HTTP status is worth retrying (5xx, 429, 408). */
int store_http_status_retryable(long status);
/* Adds a header "Name: value" (printf-style); returns 0 or TY_ENOMEM. */
int store_http_header(struct curl_slist **h, ty_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- retries (retry.c) --- */
/* Sleeps before attempt number `attempt` (1 = first retry): exponential from
 * base_ms, capped at max_ms, with full jitter in [d/2, d]. Returns 0, or
 * TY_ESTATE (with err filled) if the store is cancelled meanwhile. */
int store_retry_sleep(store *s, int attempt, ty_err *err);
/* TY_ESTATE with a message if the store was cancelled, else 0. */
int store_check_cancel(store *s, ty_err *err);
/* Milliseconds that store_retry_sleep would wait at most, for tests. */
int64_t store_retry_delay_ms(const store_tuning *t, int attempt, uint32_t rnd);

/* --- parallel parts (parts.c) --- */
/* Calls fn(ctx, i) for i in [0, nparts) on up to tune.parallel threads;
 * stops handing out parts after the first failure and returns it. */
int store_run_parts(store *s, int nparts, int (*fn)(void *ctx, int idx, ty_err *err), void *ctx,
                    ty_err *err);

/* --- hashing and encoding (util in store.c) --- */
/* MD5 and SHA-256 of a file range, streaming. Either out may be NULL. */
int store_hash_range(int fd, uint64_t off, uint64_t len, unsigned char md5[16],
                     unsigned char sha256[32], ty_err *err);
void store_b64(const unsigned char *in, size_t n, char *out, size_t outsz);
/* Decodes standard or URL-safe base64; returns bytes or -1. */
long store_b64_decode(const char *in, unsigned char *out, size_t outsz);
/* Percent-encodes everything but unreserved characters (and '/' when
 * keep_slash). Caller frees. */
char *store_urlencode(const char *in, int keep_slash);
/* First <tag>...</tag> in xml at or after *pos, entity-decoded into out;
 * moves *pos past it. Returns 1 found, 0 not found. */
int store_xml_field(const char *xml, const char *tag, size_t *pos, char *out, size_t outsz);
/* Parses an RFC 1123 / ISO 8601 date to epoch seconds; 0 if unknown. */
int64_t store_parse_time(const char *s);
/* Wipes and frees a copied credential (NULL is fine). */
void store_free_secret(char *p);
/* An ETag without its surrounding double quotes, copied into out[n]. */
void store_etag_unquote(const char *etag, char *out, size_t n);
/* Copies src into dst[n], truncating, always NUL-terminated. */
void store_strlcpy(char *dst, const char *src, size_t n);
/* strdup that returns NULL for NULL. */
char *store_strdup0(const char *p);
/* Writes a file into fd fully from start (used by download retries). */
int store_fd_reset(int fd, ty_err *err);
/* Download helper shared by backends: open path.part, call fetch, then
 * fsync + rename. */
int store_download_to(const char *path, int (*fetch)(void *ctx, int fd, ty_err *err), void *ctx,
                      ty_err *err);

/* The store prefix joined with a relative list prefix; NULL when out of
 * memory. Caller frees. */
char *store_list_prefix(const store *s, const char *prefix);

/* --- what the HTTP backends share (store.c) --- */
/* Start of put_file: the object's full name and the source opened with its
 * size. On success the caller closes *fd and frees *full. */
int store_put_open(store *s, const char *key, const char *path, char **full, int *fd,
                   uint64_t *size, ty_err *err);
/* One GET of object `full` into fd (the call truncates fd before each
 * attempt), its response headers left in rs. */
typedef int (*store_get_fn)(store *s, const char *full, int fd, http_resp *rs, ty_err *err);
/* 1 when the bytes received match the checksum header in rs, or when the
 * service sent none to check against. */
typedef int (*store_verify_fn)(const http_resp *rs);
/* get_file for an HTTP backend: downloads key to path through a .part file
 * with get, checking each try with verified; a mismatch is retried twice,
 * then reported as TY_ECORRUPT naming `checksum`. */
int store_get_verified(store *s, const char *key, const char *path, store_get_fn get,
                       store_verify_fn verified, const char *checksum, ty_err *err);
/* Fills a stat result from a HEAD reply (size, unquoted ETag, mtime). */
int store_object_from_head(const char *key, const http_resp *rs, store_object *out, ty_err *err);

/* Element names of one XML listing dialect (S3 ListObjectsV2, Azure List
 * Blobs): the repeated item and its key, size, ETag and mtime fields. */
typedef struct store_xml_list_tags {
    const char *item, *key, *size, *etag, *mtime;
} store_xml_list_tags;
/* Adds each item of one XML listing page to out, skipping names outside
 * the store prefix. Paging markers are the caller's: they differ. */
int store_xml_list_page(const store *s, const char *xml, const store_xml_list_tags *t,
                        store_listing *out, ty_err *err);

#endif
