/* test_roots.c — the engine's side of roots as a boundary
 * and the parameter count the server bounds model.init with:
 *
 * - ty_open_input refuses a FIFO (without blocking), /dev/zero, a
 *   directory, and a symlink inside a root that leads outside it; reads a
 *   regular file inside; ty_path_within_roots judges a path that does not
 *   exist yet by where its existing part leads;
 * - jobspec_check_store_roots: file:// stores only under the store roots;
 * - no error quotes file content: ty_json_error, ty_read_json, the tokens
 *   JSONL reader and the safetensors header reader on a credentials file;
 * - hfconfig_param_count equals the n_params model_create builds, for
 *   GPT-2 (tied, untied), Llama with GQA and biases, Qwen2. */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tyassert.h"
#include "data.h"
#include "hfconfig.h"
#include "jobspec.h"
#include "kernels.h"
#include "model.h"
#include "safetensors.h"
#include "tyopen.h"
#include "tyutil.h"

static char tmp[256];
static const char *CREDS =
    "[default]\naws_access_key_id = AKIAROOTSTEST\naws_secret_access_key = s3cr3tW0RD\n";

static void put(const char *name, const void *data, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n);
    if (f) fclose(f);
}

static int no_content(const char *msg)
{
    return !strstr(msg, "default") && !strstr(msg, "AKIA") && !strstr(msg, "s3cr3t") &&
           !strstr(msg, "near '");
}

static void test_open(void)
{
    char root[512], inside[600], fifo[600], link[600], out[600], dir[600];
    snprintf(root, sizeof root, "%s/root", tmp);
    snprintf(out, sizeof out, "%s/outside.txt", tmp);
    snprintf(inside, sizeof inside, "%s/in.txt", root);
    snprintf(fifo, sizeof fifo, "%s/fifo", root);
    snprintf(link, sizeof link, "%s/link", root);
    snprintf(dir, sizeof dir, "%s/sub", root);
    CHECK(mkdir(root, 0700) == 0 && mkdir(dir, 0700) == 0);
    put("root/in.txt", "ok\n", 3);
    put("outside.txt", "secret\n", 7);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(symlink(out, link) == 0);
    ty_err err = {0};

    /* No roots: regular files only. */
    CHECK(ty_open_set_roots(NULL, &err) == 0 && ty_open_roots() == NULL);
    int fd = ty_open_input(fifo, &err);
    CHECK(fd < 0 && err.code == TY_EINVAL && strstr(err.msg, "FIFO"));
    fd = ty_open_input("/dev/zero", &err);
    CHECK(fd < 0 && strstr(err.msg, "character device"));
    fd = ty_open_input(dir, &err);
    CHECK(fd < 0 && strstr(err.msg, "directory"));
    char miss[700];
    snprintf(miss, sizeof miss, "%s/missing", root);
    CHECK(ty_open_input(miss, &err) < 0 && err.code == TY_ENOENT);
    fd = ty_open_input(link, &err); /* allowed: no roots set */
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);

    /* With roots: where the descriptor really leads decides. */
    CHECK(ty_open_set_roots(root, &err) == 0);
    fd = ty_open_input(inside, &err);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
    if (fd >= 0) close(fd);
    fd = ty_open_input(link, &err);
    CHECK(fd < 0 && err.code == TY_EAUTH && strstr(err.msg, "outside the allowed roots") &&
          !strstr(err.msg, "secret"));
    char *text = NULL;
    CHECK(ty_read_file(link, &text, NULL, &err) == TY_EAUTH && text == NULL);
    CHECK(ty_open_set_roots(NULL, &err) == 0);

    /* Paths judged by their existing part. */
    char p[1024];
    snprintf(p, sizeof p, "%s/not/yet", root);
    CHECK(ty_path_within_roots(p, root));
    snprintf(p, sizeof p, "%s/link/not/yet", root); /* link is a file outside */
    CHECK(!ty_path_within_roots(p, root));
    CHECK(symlink(tmp, dir) != 0); /* dir exists */
    char dlink[720];
    snprintf(dlink, sizeof dlink, "%s/dlink", root);
    CHECK(symlink(tmp, dlink) == 0);
    snprintf(p, sizeof p, "%s/x/y", dlink);
    CHECK(!ty_path_within_roots(p, root));
    CHECK(!ty_path_within_roots("/etc/passwd", root));
    CHECK(!ty_path_under_roots(inside, "/nowhere:"));
    CHECK(ty_path_under_roots(inside, root));
}

static void test_store_roots(void)
{
    jobspec s = {0};
    ty_err err = {0};
    char stores[512], uri[600];
    snprintf(stores, sizeof stores, "%s/stores", tmp);
    CHECK(mkdir(stores, 0700) == 0);
    s.store = "s3://bucket/x";
    CHECK(jobspec_check_store_roots(&s, "", &err) == 0);
    s.store = "file:///anywhere/x";
    CHECK(jobspec_check_store_roots(&s, stores, &err) == TY_EINVAL &&
          !strcmp(err.field, "checkpoint.store") && strstr(err.msg, "outside the store roots"));
    CHECK(jobspec_check_store_roots(&s, "", &err) == TY_EINVAL);
    snprintf(uri, sizeof uri, "file://%s/job/x", stores);
    s.store = uri;
    CHECK(jobspec_check_store_roots(&s, stores, &err) == 0);
    char link[600];
    snprintf(link, sizeof link, "%s/out", stores);
    CHECK(symlink("/etc", link) == 0);
    snprintf(uri, sizeof uri, "file://%s/out/x", stores);
    CHECK(jobspec_check_store_roots(&s, stores, &err) == TY_EINVAL);
}

static void test_no_content(void)
{
    ty_err err = {0};
    json_error_t je;
    json_t *o = json_loads(CREDS, 0, &je);
    CHECK(o == NULL && strstr(je.text, "default")); /* jansson quotes it ... */
    CHECK(no_content(ty_json_error(&je)));          /* ... we do not */
    put("creds", CREDS, strlen(CREDS));
    char p[600];
    snprintf(p, sizeof p, "%s/creds", tmp);
    CHECK(ty_read_json(p, TY_EINVAL, &o, &err) == TY_EINVAL && no_content(err.msg) &&
          strstr(err.msg, "not valid JSON"));
    dataset d;
    CHECK(data_load_tokens(p, 64, &d, &err) == TY_EINVAL && no_content(err.msg) &&
          strstr(err.msg, "line 1"));
    /* A safetensors file whose header is not JSON. */
    const char hdr[] = "{default = s3cr3tW0RD}";
    unsigned char buf[8 + sizeof hdr + 16] = {0};
    buf[0] = (unsigned char)(sizeof hdr - 1);
    memcpy(buf + 8, hdr, sizeof hdr - 1);
    put("bad.safetensors", buf, sizeof buf);
    snprintf(p, sizeof p, "%s/bad.safetensors", tmp);
    st_file f;
    CHECK(st_open(&f, p, &err) == TY_EINVAL && no_content(err.msg) &&
          strstr(err.msg, "header is not valid JSON"));
    /* Names from a file are quoted only when they are short words. */
    CHECK(!strcmp(ty_safe_word("BF16"), "BF16") && !strcmp(ty_safe_word("<unk>"), "<unk>"));
    CHECK(!strcmp(ty_safe_word("aws_secret_access_key = s3cr3t"), "?"));
    CHECK(!strcmp(ty_safe_word(""), "?") && !strcmp(ty_safe_word("a b"), "?"));
    json_t *cfg = json_loads("{\"model_type\": \"-----BEGIN PRIVATE KEY-----\"}", 0, NULL);
    model_config mc;
    CHECK(hfconfig_parse(cfg, "config.json", &mc, &err) == TY_EINVAL &&
          !strstr(err.msg, "PRIVATE") && strstr(err.msg, "not supported"));
    json_decref(cfg);
    /* A FIFO as safetensors: refused, not blocked on. */
    snprintf(p, sizeof p, "%s/root/fifo", tmp);
    CHECK(st_open(&f, p, &err) != 0 && strstr(err.msg, "FIFO"));
}

static void test_param_count(void)
{
    static const char *cfgs[] = {
        "{\"model_type\":\"gpt2\",\"n_embd\":16,\"n_layer\":2,\"n_head\":2,\"n_positions\":12,\"vocab_size\":37}",
        "{\"model_type\":\"gpt2\",\"n_embd\":8,\"n_layer\":1,\"n_head\":2,\"n_positions\":5,\"vocab_size\":11,"
        "\"tie_word_embeddings\":false,\"n_inner\":12}",
        "{\"model_type\":\"llama\",\"hidden_size\":16,\"intermediate_size\":20,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":31,\"attention_bias\":true,"
        "\"max_position_embeddings\":8}",
        "{\"model_type\":\"llama\",\"hidden_size\":16,\"intermediate_size\":20,\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2,\"head_dim\":4,\"vocab_size\":31,\"tie_word_embeddings\":true}",
        "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"intermediate_size\":24,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":29,\"max_position_embeddings\":16}",
    };
    kn_ctx *kn = NULL;
    ty_err err = {0};
    CHECK(kn_open(&kn, KN_CPU, 0, 1, &err) == 0);
    for (size_t i = 0; kn && i < sizeof cfgs / sizeof *cfgs; i++) {
        json_t *o = json_loads(cfgs[i], 0, NULL);
        model_config c;
        CHECK(o && hfconfig_parse(o, "test", &c, &err) == 0);
        json_decref(o);
        uint64_t want = hfconfig_param_count(&c);
        model m;
        CHECK(model_create_ex(&m, &c, kn, 1, &err) == 0);
        if (m.n_params != want)
            fprintf(stderr, "config %zu: hfconfig_param_count %llu, model %zu\n", i,
                    (unsigned long long)want, m.n_params);
        CHECK(m.n_params == want);
        model_free(&m);
        hfconfig_free(&c);
    }
    /* Huge configs saturate instead of wrapping. */
    json_t *o = json_loads(
        "{\"model_type\":\"llama\",\"hidden_size\":1073741824,\"intermediate_size\":1073741824,"
        "\"num_hidden_layers\":1073741824,\"num_attention_heads\":1,\"vocab_size\":1073741824}",
        0, NULL);
    model_config c;
    CHECK(hfconfig_parse(o, "test", &c, &err) == 0);
    CHECK(hfconfig_param_count(&c) == UINT64_MAX);
    hfconfig_free(&c);
    json_decref(o);
    if (kn) kn_close(kn);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/ty-engine-roots-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    test_open();
    test_store_roots();
    test_no_content();
    test_param_count();
    ty_rm_rf(tmp, NULL);
    return ty_summary("engine roots");
}
