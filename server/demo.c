/* demo.c — `trainyard demo`: a first look at the dashboard in a minute.
 *
 * Writes a small generated token dataset whose next token is predictable
 * (arithmetic progressions modulo the vocabulary), submits a from-scratch
 * GPT-2 job (`model.init`) that learns it on a couple of CPU cores to the
 * server at TY_URL, and prints the dashboard URL where its loss curve falls
 * live — or, when the job waits behind others, that it is queued and at
 * which position. It is a client of the public REST API only, like the CLI. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"
#include "typath.h"
#include "tyerr.h"
#include "tyutil.h"
#include "tyjson.h"

#define DEMO_VOCAB 64
#define DEMO_SEQ 64
#define DEMO_TRAIN_ROWS 512
#define DEMO_EVAL_ROWS 64

typedef struct demo_buf {
    char *data;
    size_t len;
} demo_buf;

/* xorshift64*: deterministic data, so every run of the demo trains on the
 * same files and shows the same curve. */
static uint64_t demo_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* One JSONL file of rows {"input_ids": [a, a+d, a+2d, ...]} mod vocab.
 * After two tokens the rest of a row is determined, so a two-layer model
 * drives the loss from ln(64) ≈ 4.2 towards zero within a few hundred
 * steps. */
static int demo_write_dataset(const char *path, int rows, uint64_t seed, ty_err *err)
{
    size_t cap = (size_t)rows * (DEMO_SEQ * 4 + 32);
    char *text = malloc(cap);
    if (!text) return ty_err_set(err, TY_ENOMEM, "out of memory");
    size_t len = 0;
    uint64_t s = seed;
    for (int r = 0; r < rows; r++) {
        int start = (int)(demo_rand(&s) % DEMO_VOCAB);
        int stride = 1 + (int)(demo_rand(&s) % 7);
        len += (size_t)snprintf(text + len, cap - len, "{\"input_ids\": [");
        for (int t = 0; t < DEMO_SEQ; t++) {
            len += (size_t)snprintf(text + len, cap - len, "%s%d", t ? ", " : "",
                                    (start + t * stride) % DEMO_VOCAB);
        }
        len += (size_t)snprintf(text + len, cap - len, "]}\n");
    }
    int rc = ty_write_file_atomic(path, text, len, err);
    free(text);
    return rc;
}

/* The job spec (DESIGN §4, common/jobspec.c): a GPT-2 of two layers of
 * width 64, trained from random weights. */
static json_t *demo_spec(const char *train, const char *eval, long steps)
{
    return json_pack("{s:s, s:{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:f}},"
                     " s:{s:s, s:s, s:s}, s:s,"
                     " s:{s:I, s:i, s:i, s:f, s:s, s:i, s:i, s:i},"
                     " s:s, s:{s:i, s:s}, s:{s:i, s:i}}",
                     "name", "demo-gpt2-tiny", "model", "init", "model_type", "gpt2", "n_layer", 2,
                     "n_embd", 64, "n_head", 2, "n_positions", 128, "vocab_size", DEMO_VOCAB,
                     "layer_norm_epsilon", 1e-5, "dataset", "train", train, "eval", eval, "format",
                     "tokens", "method", "full", "hyperparameters", "max_steps", (json_int_t)steps,
                     "batch_size", 8, "seq_len", DEMO_SEQ, "lr", 3e-3, "schedule", "cosine",
                     "warmup_steps", (int)(steps / 15), "log_every_steps", 2, "eval_every_steps",
                     (int)(steps / 6 > 0 ? steps / 6 : 1), "precision", "fp32", "resources", "gpus",
                     0, "backend", "cpu", "checkpoint", "every_steps",
                     (int)(steps / 3 > 0 ? steps / 3 : 1), "keep_last", 2);
}

static size_t demo_collect(char *ptr, size_t size, size_t n, void *ud)
{
    demo_buf *b = ud;
    size_t add = size * n;
    char *p = realloc(b->data, b->len + add + 1);
    if (!p) return 0;
    memcpy(p + b->len, ptr, add);
    b->data = p;
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

/* One request to the server; on a 2xx answer *doc is its JSON (the caller
 * frees it). The server's JSON error, or the transport error, goes into err. */
static int demo_request(const char *base, const char *token, const char *path, const char *body,
                        json_t **doc, ty_err *err)
{
    *doc = NULL;
    CURL *c = curl_easy_init();
    if (!c) return ty_err_set(err, TY_ENOMEM, "cannot initialise libcurl");
    char url[1024], auth[1024];
    snprintf(url, sizeof url, "%s%s", base, path);
    struct curl_slist *hdr = curl_slist_append(NULL, "Accept: application/json");
    if (body) hdr = curl_slist_append(hdr, "Content-Type: application/json");
    if (token && *token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hdr = curl_slist_append(hdr, auth);
    }
    demo_buf resp = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, demo_collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);

    int rc = 0;
    json_t *j = resp.data ? json_loads(resp.data, 0, NULL) : NULL;
    if (cc != CURLE_OK) {
        rc = ty_err_set(err, TY_EIO,
                        "cannot reach the server at %s: %s (is `trainyard serve` running? "
                        "`make run` starts one)",
                        base, curl_easy_strerror(cc));
    } else if (status < 200 || status > 299) {
        json_t *e = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(e, "message"));
        if (status == 401)
            rc = ty_err_set(err, TY_EAUTH, "the server wants a token: set TY_TOKEN (%s)",
                            msg ? msg : "401");
        else
            rc = ty_err_set(err, TY_EINVAL, "the server refused %s (HTTP %ld): %s",
                            body ? "the job" : path, status, msg ? msg : "no error message");
    } else if (!json_is_object(j)) {
        rc = ty_err_set(err, TY_EIO, "the server's answer to %s is not a JSON object", path);
    } else {
        *doc = j;
        j = NULL;
    }
    json_decref(j);
    free(resp.data);
    return rc;
}

/* Jobs holding or about to hold a slot: the ones a queued job waits for. */
static long demo_active_jobs(const char *base, const char *token)
{
    ty_err err = {0};
    json_t *page;
    if (demo_request(base, token, "/jobs?state=starting,running,stopping&limit=200", NULL, &page,
                     &err))
        return -1;
    long n = (long)json_array_size(json_object_get(page, "jobs"));
    json_decref(page);
    return n;
}

/* Where the new job stands a moment after submission: the server schedules
 * a job within milliseconds when a slot is free, so one still queued after
 * about two seconds is waiting behind others. Returns the last Job seen. */
static json_t *demo_settle(const char *base, const char *token, long id, json_t *job)
{
    char path[64];
    snprintf(path, sizeof path, "/jobs/%ld", id);
    for (int i = 0; i < 20; i++) {
        const char *st = json_string_value(json_object_get(job, "state"));
        if (!st || strcmp(st, "queued") != 0) break;
        usleep(100 * 1000);
        ty_err err = {0};
        json_t *again;
        if (demo_request(base, token, path, NULL, &again, &err)) break;
        json_decref(job);
        job = again;
    }
    return job;
}

static void demo_usage(FILE *f)
{
    fprintf(f, "usage: trainyard demo [--steps N] [--dir DIR]\n"
               "\n"
               "Submits a small from-scratch GPT-2 job on a generated dataset to the\n"
               "server at $TY_URL (default http://127.0.0.1:8080; token in $TY_TOKEN)\n"
               "and prints the dashboard page where its loss falls live (or its place\n"
               "in the queue when other jobs hold the slots).\n"
               "  --steps N   training steps (default 300)\n"
               "  --dir DIR   where to write the dataset (default /tmp/trainyard-demo-UID);\n"
               "              it must lie under the server's --allowed-roots\n");
}

int demo_main(int argc, char **argv)
{
    long steps = 300;
    const char *dir_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            demo_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            char *end;
            errno = 0;
            steps = strtol(argv[++i], &end, 10);
            if (errno || *end || steps < 6 || steps > 1000000) {
                fprintf(stderr,
                        "trainyard demo: --steps wants a number from 6 to 1000000, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            dir_arg = argv[++i];
        } else {
            fprintf(stderr, "trainyard demo: unknown argument '%s'\n", argv[i]);
            demo_usage(stderr);
            return 2;
        }
    }

    const char *base_env = getenv("TY_URL");
    char base[512];
    snprintf(base, sizeof base, "%s", base_env && *base_env ? base_env : "http://127.0.0.1:8080");
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/')
        base[--bl] = '\0';

    ty_err err = {0};
    char dir[1024], train[1100], eval[1100];
    /* The spec names the files by absolute path: the server resolves them,
     * not our working directory. */
    if (dir_arg) {
        if (!*dir_arg || ty_path_absolute(dir_arg, dir, sizeof dir)) {
            fprintf(stderr, "trainyard demo: --dir '%s' is not a usable directory name\n", dir_arg);
            return 2;
        }
    } else {
        snprintf(dir, sizeof dir, "/tmp/trainyard-demo-%u", (unsigned)getuid());
    }
    snprintf(train, sizeof train, "%s/train.jsonl", dir);
    snprintf(eval, sizeof eval, "%s/eval.jsonl", dir);
    if (ty_mkdir_p(dir, &err) ||
        demo_write_dataset(train, DEMO_TRAIN_ROWS, 0x7472616e79617264ULL, &err) ||
        demo_write_dataset(eval, DEMO_EVAL_ROWS, 0x6576616c75617465ULL, &err)) {
        fprintf(stderr, "trainyard demo: cannot write the dataset in %s: %s\n", dir, err.msg);
        return 1;
    }

    json_t *spec = demo_spec(train, eval, steps);
    char *body = spec ? ty_json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!body) {
        fprintf(stderr, "trainyard demo: out of memory\n");
        return 1;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *token = getenv("TY_TOKEN");
    json_t *job = NULL;
    int rc = demo_request(base, token, "/jobs", body, &job, &err);
    free(body);
    long id = rc ? 0 : (long)json_integer_value(json_object_get(job, "id"));
    if (rc == 0 && id <= 0) rc = ty_err_set(&err, TY_EIO, "the server's answer has no job id");
    if (rc) {
        json_decref(job);
        curl_global_cleanup();
        fprintf(stderr, "trainyard demo: %s\n", err.msg);
        if (strstr(err.msg, "allowed roots"))
            fprintf(stderr,
                    "trainyard demo: the server reads datasets only under its --allowed-roots: "
                    "give one of them with --dir (e.g. --dir DATA_DIR/inputs/demo), or use "
                    "`make run`, which also allows /tmp\n");
        return 1;
    }
    job = demo_settle(base, token, id, job);
    const char *state = json_string_value(json_object_get(job, "state"));
    printf(
        "Submitted job %ld: a 2-layer GPT-2 learning arithmetic sequences (%ld steps, data in %s).\n",
        id, steps, dir);
    if (state && strcmp(state, "queued") == 0) {
        json_t *pos = json_object_get(job, "queue_position");
        long active = demo_active_jobs(base, token);
        printf("It is queued");
        if (json_is_integer(pos)) printf(" at position %lld", (long long)json_integer_value(pos));
        if (active > 0) printf(", behind %ld running job%s", active, active == 1 ? "" : "s");
        printf("; it starts when a slot frees up.\n"
               "Its page, where the loss curve appears once it runs: %s/#/jobs/%ld\n",
               base, id);
    } else if (state && (!strcmp(state, "succeeded") || !strcmp(state, "failed") ||
                         !strcmp(state, "cancelled"))) {
        printf("It has already ended (%s): %s/#/jobs/%ld\n", state, base, id);
    } else {
        printf("It is %s. Watch its loss fall live: %s/#/jobs/%ld\n", state ? state : "submitted",
               base, id);
    }
    json_decref(job);
    curl_global_cleanup();
    return 0;
}
