/* gcs_oauth.c — OAuth2 access tokens for Google Cloud Storage from a
 * service-account JSON key.
 *
 * Google's server-to-server flow: build a JWT (header {"alg":"RS256"},
 * claims iss = client_email, scope, aud = token_uri, iat, exp = iat+1h),
 * sign it with the key's RSA private key (OpenSSL, SHA-256, PKCS#1 v1.5),
 * POST it to token_uri as a jwt-bearer grant, and use the returned
 * access_token as a Bearer credential until shortly before it expires.
 * One token is shared by all threads of a store under a mutex. Neither the
 * key, the JWT nor the token is ever put in an error message. */
#include "gcs_oauth.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store_int.h"

#define GCS_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"

struct gcs_oauth {
    char *client_email;
    char *token_uri;
    EVP_PKEY *pkey;
    pthread_mutex_t mu;
    char *token;
    int64_t expires_at; /* epoch seconds */
};

void store_gcs_oauth_free(gcs_oauth *o)
{
    if (!o) return;
    free(o->client_email);
    free(o->token_uri);
    EVP_PKEY_free(o->pkey);
    store_free_secret(o->token);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

int store_gcs_oauth_load(const char *json_path, const char *token_uri_override, gcs_oauth **out,
                         ty_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *j = json_load_file(json_path, 0, &je);
    if (!j)
        return ty_err_set(err, TY_EAUTH,
                          "storage: service account key '%s' is not readable JSON (line %d)",
                          json_path, je.line);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *email = json_string_value(json_object_get(j, "client_email"));
    const char *pem = json_string_value(json_object_get(j, "private_key"));
    const char *turi = token_uri_override ? token_uri_override
                                          : json_string_value(json_object_get(j, "token_uri"));
    if (!turi) turi = "https://oauth2.googleapis.com/token";
    int rc = 0;
    if (!type || strcmp(type, "service_account") || !email || !pem)
        rc = ty_err_set(
            err, TY_EAUTH,
            "storage: '%s' is not a service account key (needs type, client_email, private_key)",
            json_path);
    gcs_oauth *o = NULL;
    if (rc == 0 && !(o = calloc(1, sizeof *o)))
        rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    if (rc == 0) {
        pthread_mutex_init(&o->mu, NULL);
        BIO *b = BIO_new_mem_buf(pem, -1);
        o->pkey = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        o->client_email = strdup(email);
        o->token_uri = strdup(turi);
        if (!o->pkey || EVP_PKEY_base_id(o->pkey) != EVP_PKEY_RSA)
            rc = ty_err_set(err, TY_EAUTH, "storage: the private_key in '%s' is not an RSA PEM key",
                            json_path);
        else if (!o->client_email || !o->token_uri)
            rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    json_decref(j); /* also drops the PEM text */
    if (rc) {
        store_gcs_oauth_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

static char *b64url(const unsigned char *in, size_t n)
{
    size_t cap = 4 * ((n + 2) / 3) + 1;
    char *o = malloc(cap);
    if (!o) return NULL;
    store_b64(in, n, o, cap);
    size_t l = strlen(o);
    while (l && o[l - 1] == '=')
        o[--l] = '\0';
    for (char *c = o; *c; c++) {
        if (*c == '+')
            *c = '-';
        else if (*c == '/')
            *c = '_';
    }
    return o;
}

char *store_gcs_oauth_jwt(gcs_oauth *o, int64_t now, ty_err *err)
{
    json_t *claims =
        json_pack("{s:s, s:s, s:s, s:I, s:I}", "iss", o->client_email, "scope", GCS_SCOPE, "aud",
                  o->token_uri, "iat", (json_int_t)now, "exp", (json_int_t)(now + 3600));
    char *cj = claims ? json_dumps(claims, JSON_COMPACT) : NULL;
    json_decref(claims);
    const char *hj = "{\"alg\":\"RS256\",\"typ\":\"JWT\"}";
    char *h64 = b64url((const unsigned char *)hj, strlen(hj));
    char *c64 = cj ? b64url((const unsigned char *)cj, strlen(cj)) : NULL;
    free(cj);
    char *jwt = NULL, *s64 = NULL;
    unsigned char *sig = NULL;
    if (!h64 || !c64) goto oom;
    size_t il = strlen(h64) + strlen(c64) + 2;
    char *input = malloc(il);
    if (!input) goto oom;
    snprintf(input, il, "%s.%s", h64, c64);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    size_t slen = 0;
    int ok = md && EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, o->pkey) == 1 &&
             EVP_DigestSign(md, NULL, &slen, (const unsigned char *)input, strlen(input)) == 1 &&
             (sig = malloc(slen)) &&
             EVP_DigestSign(md, sig, &slen, (const unsigned char *)input, strlen(input)) == 1;
    EVP_MD_CTX_free(md);
    if (ok) s64 = b64url(sig, slen);
    if (ok && s64) {
        size_t jl = il + strlen(s64) + 1;
        jwt = malloc(jl);
        if (jwt) snprintf(jwt, jl, "%s.%s", input, s64);
    }
    free(input);
    free(sig);
    free(s64);
    free(h64);
    free(c64);
    if (!ok)
        ty_err_set(err, TY_EAUTH, "storage: signing the OAuth2 JWT failed");
    else if (!jwt)
        ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    return jwt;
oom:
    free(h64);
    free(c64);
    ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    return NULL;
}

/* One exchange of a fresh JWT for a token, with retries on 5xx/transport. */
static int fetch_token(store *s, gcs_oauth *o, ty_err *err)
{
    int64_t now = (int64_t)time(NULL);
    char *jwt = store_gcs_oauth_jwt(o, now, err);
    if (!jwt) return err ? err->code : TY_EAUTH;
    const char *pre = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=";
    size_t bl = strlen(pre) + strlen(jwt) + 1;
    char *body = malloc(bl);
    if (!body) {
        store_free_secret(jwt);
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    snprintf(body, bl, "%s%s", pre, jwt);
    store_free_secret(jwt);
    struct curl_slist *h = NULL;
    int rc = store_http_header(&h, err, "Content-Type: application/x-www-form-urlencoded");
    http_resp rs = {0};
    for (int attempt = 1; h && attempt <= s->tune.max_attempts; attempt++) {
        if (attempt > 1 && (rc = store_retry_sleep(s, attempt - 1, err)) != 0) break;
        http_req rq;
        store_http_req_init(&rq, "POST", o->token_uri);
        rq.headers = h;
        rq.body = body;
        rq.body_len = strlen(body);
        int retryable = 0;
        rc = store_http_do(s, &rq, &rs, &retryable, err);
        if (rc) {
            if (retryable) continue;
            break;
        }
        if (rs.status == 200) break;
        /* Only the OAuth error code goes into the message, not the body. */
        json_t *ej = rs.body ? json_loads(rs.body, 0, NULL) : NULL;
        const char *code = ej ? json_string_value(json_object_get(ej, "error")) : NULL;
        rc = ty_err_set(err, store_http_status_retryable(rs.status) ? TY_EIO : TY_EAUTH,
                        "storage: OAuth2 token request failed: HTTP %ld%s%s", rs.status,
                        code ? " " : "", code ? code : "");
        json_decref(ej);
        if (!store_http_status_retryable(rs.status)) break;
    }
    if (rc == 0 && rs.status == 200) {
        json_t *tj = rs.body ? json_loads(rs.body, 0, NULL) : NULL;
        const char *tok = tj ? json_string_value(json_object_get(tj, "access_token")) : NULL;
        json_int_t exp = tj ? json_integer_value(json_object_get(tj, "expires_in")) : 0;
        if (!tok || !*tok) {
            rc = ty_err_set(err, TY_EAUTH, "storage: OAuth2 token reply has no access_token");
        } else {
            store_free_secret(o->token);
            o->token = strdup(tok);
            o->expires_at = now + (exp > 0 ? exp : 3600);
            if (!o->token) rc = ty_err_set(err, TY_ENOMEM, "storage: out of memory");
        }
        json_decref(tj);
    }
    if (rs.body) OPENSSL_cleanse(rs.body, rs.body_len);
    store_http_resp_clear(&rs);
    curl_slist_free_all(h);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    return rc;
}

int store_gcs_oauth_header(store *s, gcs_oauth *o, int force_refresh, struct curl_slist **h,
                           ty_err *err)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    /* Refresh a minute early so a token never expires mid-request. */
    if (force_refresh || !o->token || (int64_t)time(NULL) > o->expires_at - 60)
        rc = fetch_token(s, o, err);
    if (rc == 0) rc = store_http_header(h, err, "Authorization: Bearer %s", o->token);
    pthread_mutex_unlock(&o->mu);
    return rc;
}
