/* genq.c — generation requests on a job's newest checkpoint (or its base
 * model), run by the engine's `generate` subcommand.
 *
 * Why a queue of its own and not the scheduler: a generation is a few
 * seconds of one CPU thread, never a GPU (the engine generates on the CPU,
 * CUDA_VISIBLE_DEVICES is empty), so it cannot take a device from a
 * training run; one at a time, niced, with one thread, it takes at most one
 * core beside them. Requests wait in FIFO order (at most GENQ_MAX; more is
 * 429), each with a time limit (`time_limit_s`, default 60, at most 600)
 * that kills the engine's process group and answers 503.
 *
 * What runs: the job's effective spec (<jobdir>/spec.json, written at its
 * start with local paths) says the base model and the method. Full
 * fine-tuning: --model BASE --weights <checkpoint>/model.safetensors; LoRA:
 * --adapter <checkpoint>, whose adapter_config.json says r, alpha, rsLoRA,
 * targets and patterns (an older checkpoint without one: the spec's r,
 * alpha, use_rslora and targets as --lora-* options); a model.init
 * job: --config <jobdir>/generate-config.json (its init object). `"base":
 * true` runs the base model without the checkpoint, for side-by-side
 * comparisons (a model.init job has no base weights: 409).
 *
 * A request runs parse (gen_req) → admit (gen_plan: the job has started,
 * its checkpoint is on this disk) → build the command line → enqueue, each
 * refusal an admit_result (admit.h) answered in one place.
 *
 * Connections: the handler suspends the connection after queueing; the
 * worker fills the result and resumes it; libmicrohttpd calls the handler
 * again, which finds the finished task in q->route_state and answers. */
#include "genq.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admit.h"
#include "jobspec.h"
#include "server.h"
#include "state.h"
#include "tyutil.h"

extern char **environ;

#define GENQ_MAX 16
#define GEN_ARGS 48
#define OUT_MAX (4 << 20)

typedef struct gen_task {
    struct gen_task *next;
    struct MHD_Connection *conn;
    char *argv[GEN_ARGS];
    int argc;
    int time_limit_s;
    json_t *extra; /* merged into the engine's result */
    /* result */
    int done;
    unsigned status;
    const char *code; /* error code for status >= 400 */
    char msg[600];
    json_t *body; /* 200 */
} gen_task;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gen_task *head, *tail;
    int n;
    int started, stopping;
    pthread_t th;
    pid_t running; /* process group of the running engine, 0 none */
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void task_free(gen_task *t)
{
    if (!t) return;
    for (int i = 0; i < t->argc; i++)
        free(t->argv[i]);
    json_decref(t->extra);
    json_decref(t->body);
    free(t);
}

static int add_arg(gen_task *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_arg(gen_task *t, const char *fmt, ...)
{
    if (t->argc >= GEN_ARGS - 1) return -1;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&t->argv[t->argc], fmt, ap);
    va_end(ap);
    if (rc < 0) return -1;
    t->argc++;
    return 0;
}

static void finish(gen_task *t, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void finish(gen_task *t, unsigned status, const char *code, const char *fmt, ...)
{
    t->status = status;
    t->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->msg, sizeof t->msg, fmt, ap);
    va_end(ap);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The server's environment without a GPU and with one OpenMP thread (the
 * strings borrow from environ); NULL when out of memory. */
static char **engine_env(void)
{
    size_t ne = 0, k = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 3, sizeof *envp);
    if (!envp) return NULL;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) &&
            strncmp(environ[i], "OMP_NUM_THREADS=", 16))
            envp[k++] = environ[i];
    envp[k++] = "CUDA_VISIBLE_DEVICES=";
    envp[k++] = "OMP_NUM_THREADS=1";
    envp[k] = NULL;
    return envp;
}

/* Starts the engine leading a process group of its own, its stdout on
 * *fd, stderr discarded; on failure finishes t with 500 and returns -1. */
static int spawn_engine(gen_task *t, pid_t *pid, int *fd)
{
    int out[2];
    if (pipe2(out, O_CLOEXEC)) {
        finish(t, 500, "internal", "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&at, 0);
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    char **envp = engine_env();
    int rc = envp ? posix_spawn(pid, t->argv[0], &fa, &at, t->argv, envp) : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(envp);
    close(out[1]);
    if (rc) {
        close(out[0]);
        finish(t, 500, "internal", "cannot start %s: %s", t->argv[0], strerror(rc));
        return -1;
    }
    *fd = out[0];
    return 0;
}

/* Reads the engine's stdout into buf (OUT_MAX + 1 bytes) until it ends;
 * at OUT_MAX bytes or past the time limit the group is killed. */
static size_t read_output(const gen_task *t, pid_t pid, int fd, char *buf, int *timed_out)
{
    size_t len = 0;
    int64_t deadline = mono_ms() + (int64_t)t->time_limit_s * 1000;
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            *timed_out = 1;
            kill(-pid, SIGKILL);
            break;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int pr = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) continue;
        ssize_t r = read(fd, buf + len, OUT_MAX - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == OUT_MAX) {
            kill(-pid, SIGKILL);
            break;
        }
    }
    return len;
}

/* The answer from how the engine ended (wait status st) and its last line
 * of output: the result, or the error event that names what is wrong with
 * the request or the model. */
static void settle_task(gen_task *t, char *buf, size_t len, int st, int timed_out, int stopping)
{
    buf[len] = 0;
    while (len && buf[len - 1] == '\n')
        buf[--len] = 0;
    char *line = strrchr(buf, '\n');
    json_t *j = json_loads(line ? line + 1 : buf, 0, NULL);
    const char *ev = json_string_value(json_object_get(j, "ev"));
    const char *msg = json_string_value(json_object_get(j, "message"));
    bool failed = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    if (stopping)
        finish(t, 503, "unavailable", "the server is shutting down");
    else if (timed_out)
        finish(t, 503, "unavailable", "generation exceeded its time limit of %d s",
               t->time_limit_s);
    else if (msg && ev && !strcmp(ev, "error"))
        finish(t, WIFEXITED(st) && failed ? 400 : 500, "bad_request", "%s", msg);
    else if (failed || !json_is_object(j))
        finish(t, 500, "internal", "the engine's generate ended with status %d",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    else {
        t->status = 200;
        json_object_update(j, t->extra);
        t->body = j;
        j = NULL;
    }
    json_decref(j);
}

/* Runs the engine with stdout captured, under the time limit, niced; a
 * shutdown meanwhile kills it. */
static void run_task(gen_task *t)
{
    pid_t pid = 0;
    int fd, st = 0, timed_out = 0;
    if (spawn_engine(t, &pid, &fd)) return;
    setpriority(PRIO_PROCESS, pid, 10);
    pthread_mutex_lock(&G.mu);
    G.running = pid;
    int stopping = G.stopping;
    pthread_mutex_unlock(&G.mu);
    if (stopping) kill(-pid, SIGKILL);
    char *buf = malloc(OUT_MAX + 1);
    size_t len = buf ? read_output(t, pid, fd, buf, &timed_out) : 0;
    close(fd);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&G.mu);
    G.running = 0;
    stopping = G.stopping;
    pthread_mutex_unlock(&G.mu);
    if (buf)
        settle_task(t, buf, len, st, timed_out, stopping);
    else
        finish(t, 500, "internal", "out of memory");
    free(buf);
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&G.mu);
    for (;;) {
        while (!G.head && !G.stopping)
            pthread_cond_wait(&G.cv, &G.mu);
        if (G.stopping) break;
        gen_task *t = G.head;
        G.head = t->next;
        if (!G.head) G.tail = NULL;
        pthread_mutex_unlock(&G.mu);
        run_task(t);
        pthread_mutex_lock(&G.mu);
        G.n--;
        t->done = 1;
        MHD_resume_connection(t->conn);
    }
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

void genq_shutdown(void)
{
    pthread_mutex_lock(&G.mu);
    if (!G.started) {
        pthread_mutex_unlock(&G.mu);
        return;
    }
    G.stopping = 1;
    if (G.running) kill(-G.running, SIGKILL);
    gen_task *t = G.head;
    G.head = G.tail = NULL;
    for (; t; t = t->next) {
        finish(t, 503, "unavailable", "the server is shutting down");
        t->done = 1;
        MHD_resume_connection(t->conn);
    }
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    pthread_join(G.th, NULL);
}

/* The request's route state: freed by http.c when the client went away
 * with the task still set; the worker is done with any task it resumed. */
static void task_state_free(void *t)
{
    task_free(t);
}

/* ---- the request ------------------------------------------------------------------------ */

static enum MHD_Result answer(http_req *q)
{
    gen_task *t = q->route_state;
    q->route_state = NULL;
    q->route_state_free = NULL;
    enum MHD_Result r;
    if (t->status == 200) {
        r = http_json(q, 200, t->body);
        t->body = NULL;
    } else {
        r = http_error(q, t->status, t->code, NULL, "%s", t->msg);
    }
    task_free(t);
    return r;
}

static int dir_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A generation request as parsed; the JSON values borrow from body. */
typedef struct gen_req {
    json_t *body;
    json_t *prompt, *pids, *stop; /* exactly one of prompt and pids */
    int max_tokens, time_limit_s;
    double temperature, top_p;
    json_int_t seed;
    bool base;
} gen_req;

/* What admission found: the job's effective spec and, unless the request
 * asks for the base model, its newest checkpoint on this disk. */
typedef struct gen_plan {
    jobspec spec;
    bool has_spec;
    char *ck; /* the checkpoint directory relative to jobdir; NULL for base */
    char jobdir[PATH_MAX];
    char ckpath[PATH_MAX + 300]; /* jobdir/ck */
} gen_plan;

static void gen_plan_free(gen_plan *g)
{
    if (g->has_spec) jobspec_free(&g->spec);
    free(g->ck);
}

static unsigned check_fields(json_t *b, admit_result *r)
{
    static const char *const known[] = {"prompt",      "prompt_ids", "max_tokens",
                                        "temperature", "top_p",      "seed",
                                        "stop",        "base",       "time_limit_s"};
    const char *key;
    json_t *v;
    json_object_foreach(b, key, v)
    {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) return admit_refuse(r, 400, "bad_request", key, "unknown field %s", key);
    }
    return 0;
}

static unsigned parse_prompt(gen_req *g, admit_result *r)
{
    json_t *prompt = g->prompt = json_object_get(g->body, "prompt");
    json_t *pids = g->pids = json_object_get(g->body, "prompt_ids"), *x;
    size_t i;
    if (!prompt == !pids)
        return admit_refuse(r, 400, "bad_request", "prompt",
                            "give exactly one of prompt (text) or prompt_ids (token ids)");
    if (prompt && (!json_is_string(prompt) || !json_string_length(prompt)))
        return admit_refuse(r, 400, "bad_request", "prompt", "prompt must be a non-empty string");
    if (prompt && strlen(json_string_value(prompt)) != json_string_length(prompt))
        return admit_refuse(r, 400, "bad_request", "prompt", "prompt must not contain NUL");
    if (pids && (!json_is_array(pids) || !json_array_size(pids) || json_array_size(pids) > 8192))
        return admit_refuse(r, 400, "bad_request", "prompt_ids",
                            "prompt_ids must be a list of 1 to 8192 token ids");
    json_array_foreach(pids, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return admit_refuse(r, 400, "bad_request", "prompt_ids",
                                "prompt_ids[%zu] must be a non-negative integer", i);
    }
    return 0;
}

/* An optional integer field in [lo, hi]; *out keeps its default when absent. */
static unsigned parse_int(json_t *b, const char *key, int lo, int hi, int *out, admit_result *r)
{
    json_t *x = json_object_get(b, key);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return admit_refuse(r, 400, "bad_request", key, "%s must be an integer from %d to %d", key,
                            lo, hi);
    *out = (int)json_integer_value(x);
    return 0;
}

static unsigned parse_sampling(gen_req *g, admit_result *r)
{
    json_t *x;
    if ((x = json_object_get(g->body, "temperature"))) {
        if (!json_is_number(x) || json_number_value(x) < 0 || json_number_value(x) > 100)
            return admit_refuse(r, 400, "bad_request", "temperature",
                                "temperature must be a number from 0 (greedy) to 100");
        g->temperature = json_number_value(x);
    }
    if ((x = json_object_get(g->body, "top_p"))) {
        if (!json_is_number(x) || !(json_number_value(x) > 0) || json_number_value(x) > 1)
            return admit_refuse(r, 400, "bad_request", "top_p", "top_p must be a number in (0, 1]");
        g->top_p = json_number_value(x);
    }
    if ((x = json_object_get(g->body, "seed"))) {
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return admit_refuse(r, 400, "bad_request", "seed",
                                "seed must be a non-negative integer");
        g->seed = json_integer_value(x);
    }
    return 0;
}

static unsigned parse_stop_base(gen_req *g, admit_result *r)
{
    json_t *stop = g->stop = json_object_get(g->body, "stop"), *x;
    size_t i;
    if (stop && (!json_is_array(stop) || json_array_size(stop) > 8))
        return admit_refuse(r, 400, "bad_request", "stop",
                            "stop must be a list of at most 8 strings");
    json_array_foreach(stop, i, x)
    {
        if (!json_is_string(x) || !json_string_length(x) ||
            strlen(json_string_value(x)) != json_string_length(x))
            return admit_refuse(r, 400, "bad_request", "stop",
                                "stop[%zu] must be a non-empty string", i);
    }
    json_t *jb = json_object_get(g->body, "base");
    if (jb && !json_is_boolean(jb))
        return admit_refuse(r, 400, "bad_request", "base", "base must be true or false");
    g->base = json_is_true(jb);
    return 0;
}

/* Fields: prompt | prompt_ids, max_tokens, temperature, top_p, seed, stop,
 * base, time_limit_s; an empty body is an empty object. */
static unsigned parse_gen_req(http_req *q, gen_req *g, admit_result *r)
{
    json_error_t je;
    g->body = q->len ? json_loadb(q->body, q->len, 0, &je) : json_object();
    g->max_tokens = 64;
    g->time_limit_s = 60;
    g->top_p = 1;
    if (!json_is_object(g->body))
        return admit_refuse(r, 400, "bad_request", NULL, "the body must be a JSON object");
    if (check_fields(g->body, r) || parse_prompt(g, r) ||
        parse_int(g->body, "max_tokens", 1, 4096, &g->max_tokens, r) ||
        parse_int(g->body, "time_limit_s", 1, 600, &g->time_limit_s, r) || parse_sampling(g, r) ||
        parse_stop_base(g, r))
        return r->status;
    return 0;
}

/* The job's effective spec (<jobdir>/spec.json, written at its start). */
static unsigned load_spec(srv *s, int64_t id, gen_plan *g, admit_result *r)
{
    db *d = srv_db(s);
    db_job job;
    ty_err err = {0};
    char path[PATH_MAX + 16], *text = NULL;
    size_t len;
    if (!d) return admit_refuse(r, 500, "internal", NULL, "database unavailable");
    if (db_job_get(d, id, &job, &err)) return admit_refuse_err(r, &err);
    db_job_free(&job);
    srv_job_dir(s, id, g->jobdir, sizeof g->jobdir);
    snprintf(path, sizeof path, "%s/spec.json", g->jobdir);
    if (ty_read_file(path, &text, &len, &err))
        return admit_refuse(r, 409, "conflict", NULL,
                            "job %lld has not started yet: nothing to generate with",
                            (long long)id);
    int rc = jobspec_parse_text(text, len, &g->spec, &err);
    free(text);
    if (rc)
        return admit_refuse(r, 400, "bad_request", NULL, "job %lld: its spec does not parse: %s",
                            (long long)id, err.msg);
    g->has_spec = true;
    return 0;
}

static unsigned find_checkpoint(srv *s, int64_t id, gen_plan *g, admit_result *r)
{
    ty_err err = {0};
    if (db_checkpoint_newest(srv_db(s), id, &g->ck, &err)) return admit_refuse_err(r, &err);
    if (!g->ck)
        return admit_refuse(r, 409, "conflict", NULL, "job %lld has no checkpoint yet",
                            (long long)id);
    snprintf(g->ckpath, sizeof g->ckpath, "%s/%s", g->jobdir, g->ck);
    if (!dir_exists(g->ckpath))
        return admit_refuse(r, 409, "conflict", NULL,
                            "job %lld: its newest checkpoint %s is not on this server's disk",
                            (long long)id, g->ck);
    return 0;
}

/* The job has started (its effective spec is written), has a checkpoint
 * on this disk unless the base model is asked for, and its model is a
 * local one: weights the engine can read here, or model.init's random
 * ones (which have no base to compare with). */
static unsigned admit_gen(srv *s, int64_t id, const gen_req *rq, gen_plan *g, admit_result *r)
{
    const char *m;
    if (load_spec(s, id, g, r) || (!rq->base && find_checkpoint(s, id, g, r))) return r->status;
    if ((m = g->spec.model_path) && strstr(m, "://"))
        return admit_refuse(r, 400, "bad_request", NULL,
                            "job %lld: its model is at %s, not on this server's disk",
                            (long long)id, m);
    if (!m && rq->base)
        return admit_refuse(r, 409, "conflict", "base",
                            "job %lld starts from random weights (model.init): there is no base "
                            "model",
                            (long long)id);
    return 0;
}

/* The engine, and the model: the base weights, or a model.init job's
 * config written beside its spec. -1: too many arguments. */
static int model_args(gen_task *t, const srv *s, const gen_plan *g, admit_result *r)
{
    int bad = add_arg(t, "%s", s->cfg.engine) || add_arg(t, "generate") ||
              add_arg(t, "--threads") || add_arg(t, "1");
    if (g->spec.model_path)
        return bad | add_arg(t, "--model") | add_arg(t, "%s", g->spec.model_path);
    char cfgp[PATH_MAX + 64];
    snprintf(cfgp, sizeof cfgp, "%s/generate-config.json", g->jobdir);
    if (json_dump_file(g->spec.model_init, cfgp, JSON_COMPACT))
        return (int)admit_refuse(r, 400, "bad_request", NULL, "cannot write %s", cfgp);
    return bad | add_arg(t, "--config") | add_arg(t, "%s", cfgp);
}

/* The checkpoint: full fine-tuning's weights, or lora/qlora adapters,
 * which the checkpoint's adapter_config.json describes (rsLoRA, patterns
 * and layers from lora.adapter); an older checkpoint without one is
 * described by the spec's r, alpha, use_rslora and targets. */
static int checkpoint_args(gen_task *t, const gen_plan *g)
{
    const jobspec *sp = &g->spec;
    char acfg[sizeof g->ckpath + 32], tl[1024] = "";
    struct stat st;
    if (sp->method == METHOD_FULL)
        return add_arg(t, "--weights") | add_arg(t, "%s/model.safetensors", g->ckpath);
    int bad = add_arg(t, "--adapter") | add_arg(t, "%s", g->ckpath);
    snprintf(acfg, sizeof acfg, "%s/adapter_config.json", g->ckpath);
    if (stat(acfg, &st) == 0 && S_ISREG(st.st_mode)) return bad;
    bad |= add_arg(t, "--lora-r") | add_arg(t, "%d", sp->lora_r) | add_arg(t, "--lora-alpha") |
           add_arg(t, "%.17g", sp->lora_alpha);
    if (sp->lora_use_rslora) bad |= add_arg(t, "--lora-rslora");
    for (int k = 0; k < sp->n_targets; k++)
        snprintf(tl + strlen(tl), sizeof tl - strlen(tl), "%s%s", k ? "," : "", sp->targets[k]);
    if (sp->n_targets) bad |= add_arg(t, "--lora-targets") | add_arg(t, "%s", tl);
    return bad;
}

/* The prompt (text, or ids as one space-separated argument), sampling and
 * stop strings. */
static int prompt_args(gen_task *t, const gen_req *rq)
{
    int bad = 0;
    size_t i, off = 0;
    json_t *x;
    if (rq->prompt) {
        bad |= add_arg(t, "--prompt") | add_arg(t, "%s", json_string_value(rq->prompt));
    } else {
        char *ids = calloc(json_array_size(rq->pids), 12);
        json_array_foreach(rq->pids, i, x)
        {
            if (ids)
                off += (size_t)sprintf(ids + off, "%s%lld", i ? " " : "",
                                       (long long)json_integer_value(x));
        }
        bad |= !ids || add_arg(t, "--prompt-ids") | add_arg(t, "%s", ids);
        free(ids);
    }
    bad |= add_arg(t, "--max-tokens") | add_arg(t, "%d", rq->max_tokens) |
           add_arg(t, "--temperature") | add_arg(t, "%.17g", rq->temperature) |
           add_arg(t, "--top-p") | add_arg(t, "%.17g", rq->top_p) | add_arg(t, "--seed") |
           add_arg(t, "%lld", (long long)rq->seed);
    json_array_foreach(rq->stop, i, x) bad |=
        add_arg(t, "--stop") | add_arg(t, "%s", json_string_value(x));
    return bad;
}

/* The engine's command line and what the answer adds to its result. */
static unsigned task_new(srv *s, int64_t id, const gen_req *rq, const gen_plan *g, gen_task **out,
                         admit_result *r)
{
    gen_task *t = *out = calloc(1, sizeof *t);
    if (!t) return admit_refuse(r, 500, "internal", NULL, "out of memory");
    int bad = model_args(t, s, g, r);
    if (r->status) return r->status;
    if (!rq->base) bad |= checkpoint_args(t, g);
    if (bad | prompt_args(t, rq))
        return admit_refuse(r, 400, "bad_request", NULL, "too many arguments");
    t->argv[t->argc] = NULL;
    t->time_limit_s = rq->time_limit_s;
    t->extra = json_object();
    json_object_set_new(t->extra, "job_id", json_integer((json_int_t)id));
    json_object_set_new(t->extra, "base", json_boolean(rq->base));
    json_object_set_new(t->extra, "checkpoint", rq->base ? json_null() : json_string(g->ck));
    return 0;
}

/* Queues t (and suspends the connection) or refuses: shutting down (503),
 * GENQ_MAX waiting already (429), no worker thread (500). */
static unsigned enqueue(http_req *q, gen_task *t, admit_result *r)
{
    unsigned st = 0;
    pthread_mutex_lock(&G.mu);
    if (G.stopping)
        st = admit_refuse(r, 503, "unavailable", NULL, "the server is shutting down");
    else if (G.n >= GENQ_MAX)
        st = admit_refuse(r, 429, "rate_limited", NULL,
                          "%d generation requests are already waiting; try again later", GENQ_MAX);
    else if (!G.started && pthread_create(&G.th, NULL, worker, NULL))
        st = admit_refuse(r, 500, "internal", NULL, "cannot start the generation worker");
    if (!st) {
        G.started = 1;
        /* Suspended before the worker can see it, so its resume always follows. */
        t->conn = q->conn;
        q->route_state = t;
        q->route_state_free = task_state_free;
        MHD_suspend_connection(q->conn);
        if (G.tail)
            G.tail->next = t;
        else
            G.head = t;
        G.tail = t;
        G.n++;
        pthread_cond_signal(&G.cv);
    }
    pthread_mutex_unlock(&G.mu);
    return st;
}

/* Parse, admit, build and queue: a refusal of any step is answered in one
 * place; a queued request is answered when the worker resumes it. */
enum MHD_Result genq_post(http_req *q)
{
    if (q->route_state) return answer(q);
    gen_req rq = {0};
    gen_plan g = {0};
    admit_result r = {0};
    gen_task *t = NULL;
    if (!parse_gen_req(q, &rq, &r) && !admit_gen(q->s, q->id, &rq, &g, &r) &&
        !task_new(q->s, q->id, &rq, &g, &t, &r))
        enqueue(q, t, &r);
    if (r.status) task_free(t);
    json_decref(rq.body);
    gen_plan_free(&g);
    return r.status ? admit_reply(q, &r) : MHD_YES;
}
