/* sigv4.c — AWS Signature Version 4 (see sigv4.h).
 *
 * The four steps of the published algorithm: canonical request (method,
 * URI, sorted encoded query, sorted lowercase headers with trimmed values,
 * the signed-header list, the payload hash), string to sign (algorithm,
 * date, scope, SHA-256 of the canonical request), the signing key derived
 * by chained HMAC-SHA256 over date/region/service/"aws4_request", and the
 * final HMAC. OpenSSL does the hashing. */
#include "sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"
#include "tyutil.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_add(sbuf *b, const char *s)
{
    sb_addn(b, s, strlen(s));
}

typedef struct kv {
    char *k, *v;
    size_t idx;
} kv;

static int kv_cmp(const void *a, const void *b)
{
    const kv *x = a, *y = b;
    int c = strcmp(x->k, y->k);
    if (c) return c;
    c = strcmp(x->v, y->v);
    if (c) return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Headers sort by name only, keeping the given order of repeated names. */
static int kv_cmp_name(const void *a, const void *b)
{
    const kv *x = a, *y = b;
    int c = strcmp(x->k, y->k);
    if (c) return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Lowercase name; value trimmed with inner runs of spaces collapsed. */
static char *canon_value(const char *v)
{
    size_t n = strlen(v);
    char *o = malloc(n + 1), *p = o;
    if (!o) return NULL;
    int space = 0;
    while (*v == ' ' || *v == '\t')
        v++;
    for (; *v; v++) {
        if (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') {
            space = 1;
            continue;
        }
        if (space && p > o) *p++ = ' ';
        space = 0;
        *p++ = *v;
    }
    *p = '\0';
    return o;
}

static void hmac(const unsigned char *key, size_t klen, const char *msg, unsigned char out[32])
{
    unsigned int olen = 32;
    HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &olen);
}

void store_sigv4_amz_date(time_t t, char out[17])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

void store_sigv4_output_free(sigv4_output *o)
{
    free(o->canonical_request);
    free(o->string_to_sign);
    free(o->signed_headers);
    free(o->query_string);
    free(o->authorization);
    memset(o, 0, sizeof *o);
}

int store_sigv4_sign(const sigv4_input *in, sigv4_output *out, ty_err *err)
{
    memset(out, 0, sizeof *out);
    if (!in->access_key || !in->secret_key || !in->region || !in->service || !in->method ||
        !in->path || !in->payload_hash || !in->amz_date || strlen(in->amz_date) != 16)
        return ty_err_set(err, TY_EINVAL, "sigv4: incomplete signing input");
    int rc = 0;
    size_t nq = in->n_query, nh = in->n_headers;
    kv *q = calloc(nq ? nq : 1, sizeof *q);
    kv *h = calloc(nh ? nh : 1, sizeof *h);
    sbuf cr = {0}, qs = {0}, sh = {0}, sts = {0}, auth = {0};
    if (!q || !h) goto oom;
    for (size_t i = 0; i < nq; i++) {
        q[i].k = store_urlencode(in->query[i].name, 0);
        q[i].v = store_urlencode(in->query[i].value ? in->query[i].value : "", 0);
        q[i].idx = i;
        if (!q[i].k || !q[i].v) goto oom;
    }
    qsort(q, nq, sizeof *q, kv_cmp);
    for (size_t i = 0; i < nq; i++) {
        if (i) sb_add(&qs, "&");
        sb_add(&qs, q[i].k);
        sb_add(&qs, "=");
        sb_add(&qs, q[i].v);
    }
    if (!qs.p) sb_add(&qs, "");
    for (size_t i = 0; i < nh; i++) {
        h[i].k = strdup(in->headers[i].name);
        h[i].v = canon_value(in->headers[i].value ? in->headers[i].value : "");
        h[i].idx = i;
        if (!h[i].k || !h[i].v) goto oom;
        for (char *c = h[i].k; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    }
    qsort(h, nh, sizeof *h, kv_cmp_name);

    sb_add(&cr, in->method);
    sb_add(&cr, "\n");
    sb_add(&cr, in->path);
    sb_add(&cr, "\n");
    sb_add(&cr, qs.p ? qs.p : "");
    sb_add(&cr, "\n");
    for (size_t i = 0; i < nh; i++) {
        if (i > 0 && !strcmp(h[i].k, h[i - 1].k)) {
            /* Repeated header: values joined by commas on one line. */
            cr.n--; /* drop the newline */
            sb_add(&cr, ",");
            sb_add(&cr, h[i].v);
            sb_add(&cr, "\n");
            continue;
        }
        sb_add(&cr, h[i].k);
        sb_add(&cr, ":");
        sb_add(&cr, h[i].v);
        sb_add(&cr, "\n");
        if (sh.n) sb_add(&sh, ";");
        sb_add(&sh, h[i].k);
    }
    sb_add(&cr, "\n");
    sb_add(&cr, sh.p ? sh.p : "");
    sb_add(&cr, "\n");
    sb_add(&cr, in->payload_hash);
    if (cr.oom || sh.oom || qs.oom) goto oom;

    char date[9];
    memcpy(date, in->amz_date, 8);
    date[8] = '\0';
    char crhash[65];
    ty_sha256_hex(cr.p, cr.n, crhash);
    sb_add(&sts, "AWS4-HMAC-SHA256\n");
    sb_add(&sts, in->amz_date);
    sb_add(&sts, "\n");
    sb_add(&sts, date);
    sb_add(&sts, "/");
    sb_add(&sts, in->region);
    sb_add(&sts, "/");
    sb_add(&sts, in->service);
    sb_add(&sts, "/aws4_request\n");
    sb_add(&sts, crhash);
    if (sts.oom) goto oom;

    /* Signing key: HMAC chain starting from "AWS4" + secret. */
    size_t sl = strlen(in->secret_key);
    unsigned char *k0 = malloc(sl + 4);
    if (!k0) goto oom;
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, in->secret_key, sl);
    unsigned char kd[32], kr[32], ks[32], kk[32], sig[32];
    hmac(k0, sl + 4, date, kd);
    OPENSSL_cleanse(k0, sl + 4);
    free(k0);
    hmac(kd, 32, in->region, kr);
    hmac(kr, 32, in->service, ks);
    hmac(ks, 32, "aws4_request", kk);
    hmac(kk, 32, sts.p, sig);
    ty_hex(sig, 32, out->signature);
    OPENSSL_cleanse(kk, sizeof kk);
    OPENSSL_cleanse(kd, sizeof kd);

    sb_add(&auth, "AWS4-HMAC-SHA256 Credential=");
    sb_add(&auth, in->access_key);
    sb_add(&auth, "/");
    sb_add(&auth, date);
    sb_add(&auth, "/");
    sb_add(&auth, in->region);
    sb_add(&auth, "/");
    sb_add(&auth, in->service);
    sb_add(&auth, "/aws4_request, SignedHeaders=");
    sb_add(&auth, sh.p ? sh.p : "");
    sb_add(&auth, ", Signature=");
    sb_add(&auth, out->signature);
    if (auth.oom) goto oom;
    out->canonical_request = cr.p;
    out->string_to_sign = sts.p;
    out->signed_headers = sh.p ? sh.p : strdup("");
    out->query_string = qs.p;
    out->authorization = auth.p;
    cr.p = sts.p = sh.p = qs.p = auth.p = NULL;
    goto done;
oom:
    rc = ty_err_set(err, TY_ENOMEM, "sigv4: out of memory");
done:
    for (size_t i = 0; q && i < nq; i++)
        free(q[i].k), free(q[i].v);
    for (size_t i = 0; h && i < nh; i++)
        free(h[i].k), free(h[i].v);
    free(q);
    free(h);
    free(cr.p);
    free(qs.p);
    free(sh.p);
    free(sts.p);
    free(auth.p);
    return rc;
}
