/* unit.c — storage unit tests that need no emulator: the SigV4 signer
 * against vectors from AWS's published SigV4 test suite, key and URI
 * validation, backoff bounds, the GCS JWT (verified with the public key),
 * the file:// backend and checkpoint upload/download rules end to end, and
 * that error messages never carry a credential. */
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcs_oauth.h"
#include "sigv4.h"
#include "storage.h"
#include "store_int.h"
#include "tyutil.h"

#include "tyassert.h"

/* --- SigV4: AWS test-suite vectors (AKIDEXAMPLE, 20150830T123600Z, us-east-1, "service") --- */

#define EX_AK "AKIDEXAMPLE"
#define EX_SK "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define EX_DATE "20150830T123600Z"
#define EMPTY_HASH "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static void sign_vector(const char *name, const char *method, const char *path,
                        const sigv4_param *q, size_t nq, const sigv4_param *extra, size_t nextra,
                        const char *body, const char *want_sig, const char *want_cr,
                        const char *want_sts_hash)
{
    sigv4_param h[8];
    size_t nh = 0;
    h[nh++] = (sigv4_param){"Host", "example.amazonaws.com"};
    h[nh++] = (sigv4_param){"X-Amz-Date", EX_DATE};
    for (size_t i = 0; i < nextra; i++)
        h[nh++] = extra[i];
    char ph[65];
    ty_sha256_hex(body, strlen(body), ph);
    sigv4_input in = {.access_key = EX_AK,
                      .secret_key = EX_SK,
                      .region = "us-east-1",
                      .service = "service",
                      .method = method,
                      .path = path,
                      .query = q,
                      .n_query = nq,
                      .headers = h,
                      .n_headers = nh,
                      .payload_hash = ph,
                      .amz_date = EX_DATE};
    sigv4_output out;
    ty_err err = {0};
    int rc = store_sigv4_sign(&in, &out, &err);
    CHECK(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;
    CHECK(!strcmp(out.signature, want_sig), "%s: signature %s, want %s\ncanonical:\n%s", name,
          out.signature, want_sig, out.canonical_request);
    if (want_cr)
        CHECK(!strcmp(out.canonical_request, want_cr), "%s: canonical request\n%s", name,
              out.canonical_request);
    if (want_sts_hash) {
        const char *last = strrchr(out.string_to_sign, '\n');
        CHECK(last && !strcmp(last + 1, want_sts_hash), "%s: string to sign\n%s", name,
              out.string_to_sign);
    }
    char auth[512];
    snprintf(auth, sizeof auth,
             "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
             "SignedHeaders=%s, "
             "Signature=%s",
             out.signed_headers, want_sig);
    CHECK(!strcmp(out.authorization, auth), "%s: authorization %s", name, out.authorization);
    store_sigv4_output_free(&out);
}

static void test_sigv4_vectors(void)
{
    sign_vector("get-vanilla", "GET", "/", NULL, 0, NULL, 0, "",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
                "GET\n/"
                "\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-"
                "date\n" EMPTY_HASH,
                "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
    sigv4_param qk[] = {{"Param2", "value2"}, {"Param1", "value1"}};
    sign_vector("get-vanilla-query-order-key-case", "GET", "/", qk, 2, NULL, 0, "",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500", NULL, NULL);
    sign_vector("post-vanilla", "POST", "/", NULL, 0, NULL, 0, "",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b", NULL, NULL);
    sign_vector("get-utf8", "GET", "/%E1%88%B4", NULL, 0, NULL, 0, "",
                "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85", NULL, NULL);
    sigv4_param hv[] = {{"My-Header1", "VALUE1"}};
    sign_vector("post-header-value-case", "POST", "/", NULL, 0, hv, 1, "",
                "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d", NULL, NULL);
    sigv4_param ct[] = {{"Content-Type", "application/x-www-form-urlencoded"}};
    sign_vector(
        "post-x-www-form-urlencoded", "POST", "/", NULL, 0, ct, 1, "Param1=value1",
        "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
        "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
        "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n"
        "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
        "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");

    /* Trimming and repeated headers (the suite's get-header-value-trim /
     * key-duplicate rules). */
    sigv4_param dup[] = {
        {"host", "h"}, {"My-Header1", "  a   b  "}, {"my-header1", "c"}, {"x-amz-date", EX_DATE}};
    sigv4_input in = {.access_key = EX_AK,
                      .secret_key = EX_SK,
                      .region = "r",
                      .service = "s",
                      .method = "GET",
                      .path = "/",
                      .headers = dup,
                      .n_headers = 4,
                      .payload_hash = "UNSIGNED-PAYLOAD",
                      .amz_date = EX_DATE};
    sigv4_output out;
    ty_err err = {0};
    CHECK(store_sigv4_sign(&in, &out, &err) == 0, "%s", err.msg);
    CHECK(strstr(out.canonical_request, "\nmy-header1:a b,c\n") != NULL, "dup headers:\n%s",
          out.canonical_request);
    CHECK(!strcmp(out.signed_headers, "host;my-header1;x-amz-date"), "%s", out.signed_headers);
    store_sigv4_output_free(&out);
    in.amz_date = "2015";
    CHECK(store_sigv4_sign(&in, &out, &err) == TY_EINVAL, "short date accepted");
}

/* --- validation --- */

static void test_uris_and_keys(void)
{
    store *s = NULL;
    ty_err err = {0};
    CHECK(store_open("ftp://x/y", NULL, &s, &err) == TY_EINVAL, "ftp accepted");
    CHECK(store_open("s3://", NULL, &s, &err) == TY_EINVAL, "no bucket accepted");
    CHECK(store_open("s3://Bad Bucket/x", NULL, &s, &err) == TY_EINVAL, "bad bucket accepted");
    CHECK(store_open("file://relative/dir", NULL, &s, &err) == TY_EINVAL,
          "relative file URI accepted");
    CHECK(store_open("nonsense", NULL, &s, &err) == TY_EINVAL, "no scheme accepted");
    CHECK(s == NULL, "store returned on failure");

    char dir[] = "/tmp/ty-storage-unit-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char uri[128];
    snprintf(uri, sizeof uri, "file://%s", dir);
    CHECK(store_open(uri, NULL, &s, &err) == 0, "%s", err.msg);
    const char *bad[] = {"",   "/abs",  "a//b",  "a/../b", ".",
                         "..", "a/./b", "a\x01", "trail/", "back\\slash"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *full = NULL;
        CHECK(store_full_key(s, bad[i], &full, &err) == TY_EINVAL, "key '%s' accepted", bad[i]);
        free(full);
    }
    char *full = NULL;
    CHECK(store_full_key(s, "job-1/step-000001/model.safetensors", &full, &err) == 0, "%s",
          err.msg);
    free(full);
    store_close(s);
    ty_rm_rf(dir, NULL);

    /* Prefix handling: trailing slashes collapse, keys are joined once. */
    store_config cfg;
    store_config_init(&cfg);
    cfg.use_env = 0;
    cfg.aws_access_key_id = "AK";
    cfg.aws_secret_access_key = "SK";
    CHECK(store_open("s3://bucket/a//b", &cfg, &s, &err) == TY_EINVAL && s == NULL,
          "a//b accepted");
    CHECK(store_open("s3://bucket/a/b//", &cfg, &s, &err) == 0, "%s", err.msg);
    if (s) {
        CHECK(store_full_key(s, "k", &full, &err) == 0 && !strcmp(full, "a/b/k"), "full key %s",
              full);
        free(full);
        CHECK(store_rel_key(s, "a/b/k") && !strcmp(store_rel_key(s, "a/b/k"), "k"), "rel key");
        CHECK(store_rel_key(s, "other/k") == NULL, "rel key outside prefix");
        store_close(s);
    }
}

static void test_helpers(void)
{
    char out[64];
    size_t pos = 0;
    CHECK(store_xml_field("<a><Key>x&amp;y&lt;&#47;</Key></a>", "Key", &pos, out, sizeof out) ==
                  1 &&
              !strcmp(out, "x&y</"),
          "xml decode '%s'", out);
    pos = 0;
    CHECK(store_xml_field("<a></a>", "Key", &pos, out, sizeof out) == 0, "xml missing");
    unsigned char b[16];
    CHECK(store_b64_decode("aGVsbG8=", b, sizeof b) == 5 && !memcmp(b, "hello", 5), "b64");
    CHECK(store_b64_decode("a*b", b, sizeof b) == -1, "bad b64 accepted");
    char *e = store_urlencode("a b/c~", 1);
    CHECK(!strcmp(e, "a%20b/c~"), "urlencode %s", e);
    free(e);
    e = store_urlencode("a/b", 0);
    CHECK(!strcmp(e, "a%2Fb"), "urlencode %s", e);
    free(e);
    CHECK(store_parse_time("Wed, 21 Oct 2015 07:28:00 GMT") == 1445412480, "rfc1123");
    CHECK(store_parse_time("2015-10-21T07:28:00.000Z") == 1445412480, "iso8601");

    store_tuning t = {.retry_base_ms = 100, .retry_max_ms = 1000};
    for (uint32_t r = 0; r < 1000; r += 37) {
        int64_t d1 = store_retry_delay_ms(&t, 1, r), d3 = store_retry_delay_ms(&t, 3, r),
                d9 = store_retry_delay_ms(&t, 9, r);
        CHECK(d1 >= 50 && d1 <= 100, "attempt 1 delay %lld", (long long)d1);
        CHECK(d3 >= 200 && d3 <= 400, "attempt 3 delay %lld", (long long)d3);
        CHECK(d9 >= 500 && d9 <= 1000, "capped delay %lld", (long long)d9);
    }
}

/* --- credentials never in messages --- */

static void expect_clean(const char *what, const ty_err *err, const char *secret)
{
    CHECK(err->msg[0] != '\0', "%s: empty error", what);
    CHECK(strstr(err->msg, secret) == NULL, "%s: secret in message: %s", what, err->msg);
}

static char *write_temp(const char *dir, const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static EVP_PKEY *gen_rsa(void)
{
    EVP_PKEY_CTX *c = EVP_PKEY_CTX_new_id(EVP_PKEY_RSA, NULL);
    EVP_PKEY *k = NULL;
    if (c && EVP_PKEY_keygen_init(c) == 1 && EVP_PKEY_CTX_set_rsa_keygen_bits(c, 2048) == 1)
        EVP_PKEY_keygen(c, &k);
    EVP_PKEY_CTX_free(c);
    return k;
}

static void test_secrets(void)
{
    char dir[] = "/tmp/ty-storage-sec-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char *src = write_temp(dir, "blob", "hello");
    char srcpath[512];
    snprintf(srcpath, sizeof srcpath, "%s", src);
    store_config cfg;
    store_config_init(&cfg);
    cfg.use_env = 0;
    cfg.max_attempts = 2;
    cfg.retry_base_ms = 1;
    cfg.connect_timeout_s = 2;
    store *s = NULL;
    ty_err err = {0};

    /* S3: unreachable endpoint, and a missing-key message. */
    cfg.aws_access_key_id = "AKIAUNITTEST";
    cfg.aws_secret_access_key = "S3cretKeyNeverPrinted/xyz";
    cfg.aws_session_token = "SessionTokenNeverPrinted";
    cfg.s3_endpoint = "http://127.0.0.1:9";
    CHECK(store_open("s3://bkt/p", &cfg, &s, &err) == 0, "%s", err.msg);
    if (s) {
        CHECK(store_put_file(s, "k", srcpath, &err) == TY_EIO, "put to closed port: %s", err.msg);
        expect_clean("s3 put", &err, "S3cretKeyNeverPrinted");
        expect_clean("s3 put", &err, "SessionTokenNeverPrinted");
        store_close(s);
    }
    cfg.aws_secret_access_key = NULL;
    CHECK(store_open("s3://bkt/p", &cfg, &s, &err) == TY_EAUTH, "open without secret");
    expect_clean("s3 open", &err, "SessionTokenNeverPrinted");

    /* Azure: SAS token in the URL must not reach the message. */
    cfg.azure_account = "acct";
    cfg.azure_sas_token = "?sv=2021&sig=SasSignatureNeverPrinted";
    cfg.azure_endpoint = "http://127.0.0.1:9/acct";
    CHECK(store_open("az://cont/p", &cfg, &s, &err) == 0, "%s", err.msg);
    if (s) {
        CHECK(store_get_file(s, "k", "/dev/null/x", &err) != 0, "get from closed port");
        CHECK(store_put_file(s, "k", srcpath, &err) == TY_EIO, "az put: %s", err.msg);
        expect_clean("az put", &err, "SasSignatureNeverPrinted");
        store_close(s);
    }
    cfg.azure_sas_token = NULL;
    cfg.azure_key = "not base64 ***";
    CHECK(store_open("az://cont/p", &cfg, &s, &err) == TY_EAUTH, "bad key accepted");
    expect_clean("az key", &err, "not base64 ***");

    /* GCS: a service-account key; the token endpoint is unreachable. */
    EVP_PKEY *k = gen_rsa();
    CHECK(k != NULL, "rsa keygen");
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL);
    char *pem;
    long pl = BIO_get_mem_data(b, &pem);
    char *json = malloc((size_t)pl * 2 + 512), *jp = json;
    jp += sprintf(jp, "{\"type\":\"service_account\",\"client_email\":\"sa@proj.iam.example\","
                      "\"private_key\":\"");
    for (long i = 0; i < pl; i++) {
        if (pem[i] == '\n')
            jp += sprintf(jp, "\\n");
        else
            *jp++ = pem[i];
    }
    sprintf(jp, "\",\"token_uri\":\"http://127.0.0.1:9/token\"}");
    BIO_free(b);
    char keypath[512];
    snprintf(keypath, sizeof keypath, "%s", write_temp(dir, "sa.json", json));
    free(json);
    cfg.gcs_credentials_file = keypath;
    cfg.gcs_json_endpoint = "127.0.0.1:9";
    CHECK(store_open("gs://bkt/p", &cfg, &s, &err) == 0, "%s", err.msg);
    if (s) {
        CHECK(store_put_file(s, "k", srcpath, &err) != 0, "gcs put with no token endpoint");
        expect_clean("gcs put", &err, "PRIVATE KEY");
        store_close(s);
    }

    /* The JWT verifies with the public key and carries the claims. */
    gcs_oauth *o = NULL;
    CHECK(store_gcs_oauth_load(keypath, NULL, &o, &err) == 0, "%s", err.msg);
    if (o) {
        char *jwt = store_gcs_oauth_jwt(o, 1700000000, &err);
        CHECK(jwt != NULL, "%s", err.msg);
        char *dot2 = jwt ? strrchr(jwt, '.') : NULL;
        if (dot2) {
            unsigned char sig[512];
            long sl = store_b64_decode(dot2 + 1, sig, sizeof sig);
            EVP_MD_CTX *md = EVP_MD_CTX_new();
            int ok = EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, k) == 1 &&
                     EVP_DigestVerify(md, sig, (size_t)sl, (unsigned char *)jwt,
                                      (size_t)(dot2 - jwt)) == 1;
            EVP_MD_CTX_free(md);
            CHECK(ok, "JWT signature does not verify");
            char *dot1 = strchr(jwt, '.');
            char claims[1024];
            *dot2 = '\0';
            long cl = store_b64_decode(dot1 + 1, (unsigned char *)claims, sizeof claims - 1);
            claims[cl > 0 ? cl : 0] = '\0';
            CHECK(strstr(claims, "\"iss\":\"sa@proj.iam.example\"") &&
                      strstr(claims, "\"iat\":1700000000") &&
                      strstr(claims, "\"exp\":1700003600") &&
                      strstr(claims, "\"aud\":\"http://127.0.0.1:9/token\"") &&
                      strstr(claims, "devstorage.read_write"),
                  "claims %s", claims);
        }
        free(jwt);
        store_gcs_oauth_free(o);
    }
    EVP_PKEY_free(k);
    snprintf(keypath, sizeof keypath, "%s",
             write_temp(dir, "bad.json", "{\"type\":\"authorized_user\"}"));
    CHECK(store_gcs_oauth_load(keypath, NULL, &o, &err) == TY_EAUTH,
          "non-service-account key accepted");
    ty_rm_rf(dir, NULL);
}

/* --- cancellation --- */

static void *cancel_later(void *arg)
{
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    store_cancel(arg);
    return NULL;
}

static void test_cancel(void)
{
    char dir[] = "/tmp/ty-storage-cancel-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char src[512];
    snprintf(src, sizeof src, "%s", write_temp(dir, "f", "data"));
    store_config cfg;
    store_config_init(&cfg);
    cfg.use_env = 0;
    cfg.aws_access_key_id = "AK";
    cfg.aws_secret_access_key = "SK";
    cfg.s3_endpoint = "http://127.0.0.1:9";
    cfg.max_attempts = 1000; /* would retry for many minutes without the cancel */
    cfg.retry_base_ms = 100;
    cfg.retry_max_ms = 1000;
    store *s = NULL;
    ty_err err = {0};
    CHECK(store_open("s3://bkt", &cfg, &s, &err) == 0, "%s", err.msg);
    if (!s) return;
    pthread_t th;
    pthread_create(&th, NULL, cancel_later, s);
    int rc = store_put_file(s, "k", src, &err);
    pthread_join(th, NULL);
    CHECK(rc == TY_ESTATE && strstr(err.msg, "cancelled"), "cancelled put: %d %s", rc, err.msg);
    CHECK(store_get_file(s, "k", src, &err) == TY_ESTATE, "store stays cancelled");
    store_close(s);
    ty_rm_rf(dir, NULL);
}

/* --- file:// backend and checkpoints --- */

static int write_bytes(const char *path, size_t n, unsigned seed)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (size_t i = 0; i < n; i++)
        fputc((int)((i * 131u + seed) & 0xff), f);
    return fclose(f);
}

static void make_checkpoint(const char *dir)
{
    ty_mkdir_p(dir, NULL);
    const char *names[] = {"model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    size_t sizes[] = {300000, 600000, 412};
    char manifest[4096];
    size_t n =
        (size_t)snprintf(manifest, sizeof manifest,
                         "{\"format\": \"trainyard-checkpoint/1\", \"step\": 200, \"files\": [");
    for (int i = 0; i < 3; i++) {
        char p[1024], hex[65];
        uint64_t bytes;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        write_bytes(p, sizes[i], (unsigned)i);
        ty_sha256_file(p, hex, &bytes, NULL);
        n += (size_t)snprintf(manifest + n, sizeof manifest - n,
                              "%s{\"path\": \"%s\", \"bytes\": %llu, \"sha256\": \"%s\"}",
                              i ? ", " : "", names[i], (unsigned long long)bytes, hex);
    }
    snprintf(manifest + n, sizeof manifest - n, "]}");
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/MANIFEST.json", dir);
    ty_write_file_atomic(mp, manifest, strlen(manifest), NULL);
}

static int exists(const char *dir, const char *name)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_file_backend(void)
{
    char root[] = "/tmp/ty-storage-file-XXXXXX";
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    char remote[256], local[256], uri[320], p[1024], q[1024];
    snprintf(remote, sizeof remote, "%s/remote", root);
    snprintf(local, sizeof local, "%s/local", root);
    snprintf(uri, sizeof uri, "file://%s/jobs", remote);
    ty_mkdir_p(local, NULL);
    store *s = NULL;
    ty_err err = {0};
    CHECK(store_open(uri, NULL, &s, &err) == 0, "%s", err.msg);
    if (!s) return;

    snprintf(p, sizeof p, "%s/a.bin", local);
    write_bytes(p, 100000, 7);
    CHECK(store_put_file(s, "x/a.bin", p, &err) == 0, "%s", err.msg);
    store_object o;
    CHECK(store_stat(s, "x/a.bin", &o, &err) == 0 && o.size == 100000, "stat size %llu",
          (unsigned long long)o.size);
    store_object_clear(&o);
    CHECK(store_stat(s, "x/none", &o, &err) == TY_ENOENT, "stat missing");
    snprintf(q, sizeof q, "%s/back.bin", local);
    CHECK(store_get_file(s, "x/a.bin", q, &err) == 0, "%s", err.msg);
    char h1[65], h2[65];
    uint64_t n1, n2;
    ty_sha256_file(p, h1, &n1, NULL);
    ty_sha256_file(q, h2, &n2, NULL);
    CHECK(!strcmp(h1, h2) && n1 == n2, "round trip differs");
    CHECK(store_get_file(s, "x/none", q, &err) == TY_ENOENT, "get missing");
    CHECK(store_put_file(s, "x/b.bin", "/nonexistent/file", &err) == TY_ENOENT,
          "put of missing local file");
    store_listing l;
    CHECK(store_put_file(s, "y/c.bin", p, &err) == 0, "%s", err.msg);
    CHECK(store_list(s, "x/", &l, &err) == 0 && l.n == 1 && !strcmp(l.items[0].key, "x/a.bin"),
          "list x/: %zu", l.n);
    store_listing_free(&l);
    CHECK(store_list(s, "", &l, &err) == 0 && l.n == 2, "list all: %zu", l.n);
    store_listing_free(&l);
    CHECK(store_delete(s, "x/a.bin", &err) == 0, "%s", err.msg);
    CHECK(store_delete(s, "x/a.bin", &err) == TY_ENOENT, "delete twice");

    /* Checkpoint round trip. */
    char ck[512], back[512];
    snprintf(ck, sizeof ck, "%s/step-000200", local);
    snprintf(back, sizeof back, "%s/restored", local);
    make_checkpoint(ck);
    uint64_t bytes = 0;
    CHECK(store_put_checkpoint(s, ck, "job-1/step-000200", &bytes, &err) == 0, "%s", err.msg);
    CHECK(bytes == 300000 + 600000 + 412, "bytes %llu", (unsigned long long)bytes);
    CHECK(store_list(s, "job-1/step-000200/", &l, &err) == 0 && l.n == 4, "remote files %zu", l.n);
    store_listing_free(&l);
    CHECK(store_get_checkpoint(s, "job-1/step-000200/", back, &err) == 0, "%s", err.msg);
    CHECK(exists(back, "MANIFEST.json") && exists(back, "optimizer.safetensors"),
          "restored files missing");
    CHECK(store_get_checkpoint(s, "job-1/step-000999", back, &err) == TY_ENOENT,
          "missing checkpoint: %s", err.msg);

    /* A torn local checkpoint is refused and commits nothing. */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", ck);
    write_bytes(p, 600000, 99);
    CHECK(store_put_checkpoint(s, ck, "job-1/step-000300", &bytes, &err) == TY_ECORRUPT,
          "torn upload: %s", err.msg);
    CHECK(store_stat(s, "job-1/step-000300/MANIFEST.json", &o, &err) == TY_ENOENT,
          "manifest of torn checkpoint");
    store_object_clear(&o);

    /* A remote file changed after commit is caught on download, and the
     * local directory gets no manifest. */
    snprintf(p, sizeof p, "%s/jobs/job-1/step-000200/model.safetensors", remote);
    write_bytes(p, 300000, 42);
    char back2[512];
    snprintf(back2, sizeof back2, "%s/restored2", local);
    CHECK(store_get_checkpoint(s, "job-1/step-000200", back2, &err) == TY_ECORRUPT,
          "corrupt download: %s", err.msg);
    CHECK(!exists(back2, "MANIFEST.json"), "manifest written for a corrupt download");

    CHECK(store_delete_checkpoint(s, "job-1/step-000200", &err) == 0, "%s", err.msg);
    CHECK(store_list(s, "job-1/step-000200/", &l, &err) == 0 && l.n == 0, "left after delete: %zu",
          l.n);
    store_listing_free(&l);
    CHECK(store_delete_checkpoint(s, "job-1/step-000200", &err) == 0, "second delete: %s", err.msg);
    store_close(s);
    ty_rm_rf(root, NULL);
}

/* store_probe writes and removes one uniquely named object; a root that
 * cannot be written fails naming the probe step. store_put_dir uploads a
 * tree as it is and refuses what is not a file or directory. */
static void test_probe_and_dir(void)
{
    char root[] = "/tmp/ty-storage-probe-XXXXXX";
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    char uri[320], p[1024], key[64] = "";
    snprintf(uri, sizeof uri, "file://%s/store", root);
    store *s = NULL;
    ty_err err = {0};
    CHECK(store_open(uri, NULL, &s, &err) == 0, "%s", err.msg);
    if (!s) return;
    CHECK(store_probe(s, key, sizeof key, &err) == 0, "%s", err.msg);
    CHECK(!strncmp(key, ".trainyard-probe-", 17) && strlen(key) == 17 + 16, "probe key %s", key);
    store_listing l;
    CHECK(store_list(s, "", &l, &err) == 0 && l.n == 0, "probe left %zu object(s)", l.n);
    store_listing_free(&l);
    char key2[64];
    CHECK(store_probe(s, key2, sizeof key2, &err) == 0 && strcmp(key, key2), "names are unique");

    /* A tree: nested files land under the prefix, sizes checked. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/export", root);
    snprintf(p, sizeof p, "%s/sub", dir);
    ty_mkdir_p(p, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_bytes(p, 200000, 3);
    snprintf(p, sizeof p, "%s/sub/tokenizer.json", dir);
    write_bytes(p, 10, 4);
    uint64_t bytes = 0;
    int files = 0;
    CHECK(store_put_dir(s, dir, "job-3/export/", &bytes, &files, &err) == 0, "%s", err.msg);
    CHECK(bytes == 200010 && files == 2, "put_dir %llu bytes, %d files", (unsigned long long)bytes,
          files);
    CHECK(store_list(s, "job-3/export/", &l, &err) == 0 && l.n == 2 &&
              !strcmp(l.items[0].key, "job-3/export/model.safetensors") &&
              !strcmp(l.items[1].key, "job-3/export/sub/tokenizer.json"),
          "export listing");
    store_listing_free(&l);
    snprintf(p, sizeof p, "%s/link", dir);
    CHECK(symlink("/etc/hostname", p) == 0, "symlink");
    CHECK(store_put_dir(s, dir, "job-4/export", &bytes, &files, &err) == TY_EINVAL,
          "a symlink is refused: %s", err.msg);
    snprintf(p, sizeof p, "%s/empty", root);
    ty_mkdir_p(p, NULL);
    CHECK(store_put_dir(s, p, "job-5/export", &bytes, &files, &err) == TY_ENOENT, "empty dir");
    store_close(s);

    /* The store's root is a file: the probe cannot write, and says so. */
    snprintf(p, sizeof p, "%s/blocked", root);
    write_bytes(p, 1, 0);
    snprintf(uri, sizeof uri, "file://%s/blocked/store", root);
    s = NULL;
    if (store_open(uri, NULL, &s, &err) == 0) {
        CHECK(store_probe(s, NULL, 0, &err) != 0 && strstr(err.msg, "cannot write probe object"),
              "blocked root: %s", err.msg);
        store_close(s);
    }
    ty_rm_rf(root, NULL);
}

int main(void)
{
    test_sigv4_vectors();
    test_uris_and_keys();
    test_helpers();
    test_secrets();
    test_cancel();
    test_file_backend();
    test_probe_and_dir();
    return ty_summary("storage unit");
}
