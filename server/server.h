/* server.h — the pieces of `trainyard serve` and how they share state.
 *
 * One srv value lives for the daemon's lifetime: configuration, the SSE hub,
 * the batched event writer, the scheduler/executor and the GPU inventory.
 * Every write that creates events goes through srv->write_lock so events are
 * committed and published in id order: a subscriber that replays from the
 * database and then reads live events sees no gap and no duplicate. */
#ifndef TY_SERVER_H
#define TY_SERVER_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "db.h"
#include "tyerr.h"

/* ---- configuration (config.c) ---------------------------------------------- */

typedef struct srv_config {
    char listen[256];             /* host:port, default 127.0.0.1:8080 */
    char data_dir[PATH_MAX];      /* default ./trainyard-data */
    char engine[PATH_MAX];        /* default trainyard-engine beside this binary */
    char gpus[256];               /* auto | none | 0,1,... */
    int cpu_slots;                /* concurrent CPU jobs, default 1 */
    char executor[16];            /* local | slurm (executor.h), default local */
    char slurm_partition[128];    /* --executor slurm: sbatch --partition, "" = Slurm's default */
    char slurm_account[128];      /* sbatch --account, "" = none */
    char slurm_workdir[PATH_MAX]; /* shared path holding jobs/ for the nodes; "" = the data dir */
    char slurm_args[1024];        /* more sbatch arguments, space-separated */
    int slurm_poll_ms;            /* squeue period, default 2000 */
    char allowed_roots[8192];     /* colon-separated; default DATA_DIR/inputs */
    char store_roots[8192];       /* where file:// stores may lie; default DATA_DIR/stores */
    int64_t max_params;           /* largest model.init accepted at submit; 0 = no limit */
    size_t max_body;              /* bytes, default 1 MiB */
    int grace_s;                  /* SIGTERM → SIGKILL, default 30 */
    char tls_cert[PATH_MAX];
    char tls_key[PATH_MAX];
    bool require_token;
    int per_ip_connections; /* connections one client address may hold; 0 = no limit */
    int max_connections;    /* requests being served at once, all clients (503 beyond) */
    int header_timeout_s;   /* whole request head within this, from accept (408) */
    int max_pending_heads;  /* connections whose head is arriving, all clients (fair shares) */
    int request_timeout_s;  /* whole body within this, from the head; 0 = off */
    int rate_limit;         /* requests per second per token; 0 = off */
    int rate_burst;         /* requests a token may make at once */
    int event_rate;         /* engine lines per second before a job is failed; 0 = off */
    int gpu_sample_ms;      /* GPU sampling period, default 2000 */
    int heartbeat_s;        /* SSE heartbeat, default 15 */
    int http_threads;       /* MHD thread pool size, default 2 */
    int upload_workers;     /* checkpoint upload threads, default 2 */
    int upload_wait_s;      /* pause/cancel/finish wait for a running upload, default 300 */
    int upload_attempts;    /* tries of one upload before it fails for good, default 5 */
    double gpu_hour_price;  /* per GPU-hour of running time; < 0 = unknown (default) */
    double cpu_hour_price;  /* per hour of a CPU job's running time; < 0 = unknown */
    char currency[4];       /* ISO 4217 code of those prices, default USD */
    /* Operations (config.c, docs/server.md "Operations"). */
    struct {
        char gpu_hour_prices[1024];                   /* "H100=4.1,A100=2.2": per GPU model */
        double max_cost_default, max_cost_cap;        /* < 0 = none */
        int64_t max_runtime_default, max_runtime_cap; /* seconds; 0 = none */
        int64_t max_tokens_default, max_tokens_cap;   /* 0 = none */
        int stall_floor_s;                            /* least default stall_after_s, default 300 */
        int idle_gpu_util;                /* percent under which a GPU is idle, default 10 */
        int idle_gpu_after_s;             /* idle this long: idle_gpu event; 0 = off */
        char webhook_urls[4096];          /* comma-separated, every job's events */
        char webhook_secret[256];         /* HMAC key (config file only) */
        char webhook_allowed_hosts[1024]; /* hosts a spec's webhooks may name */
        int webhook_attempts;             /* tries before a delivery fails for good */
    } ops;
    /* Object-store settings and credentials (config file only for secrets;
     * empty = the environment variable storage.h names). Never logged. */
    struct {
        char s3_access_key_id[256], s3_secret_access_key[256], s3_session_token[4096];
        char s3_region[64], s3_endpoint[1024];
        char gcs_hmac_access_id[256], gcs_hmac_secret[256], gcs_credentials_file[PATH_MAX];
        char gcs_xml_endpoint[1024], gcs_json_endpoint[1024];
        char azure_connection_string[4096], azure_account[256], azure_key[256];
        char azure_sas_token[2048], azure_endpoint[1024];
    } store;
} srv_config;

/* One setting: the table in config.c drives defaults, the config file, the
 * flags, --help and the docs check (server_unit.config). */
typedef enum { OPT_STR, OPT_INT, OPT_BOOL, OPT_PRICE, OPT_CONFIG } srv_option_type;
enum {
    OPT_SECRET = 1,    /* config file or environment only, never a flag; never echoed */
    OPT_STORE = 2,     /* an object-store setting (listed apart in --help and the docs) */
    OPT_FLAG_ONLY = 4, /* a flag with no config-file key (--config) */
};
typedef struct srv_option {
    const char *name; /* flag without dashes = config-file key */
    const char *arg;  /* the value's name in --help; NULL for a bool */
    srv_option_type type;
    size_t offset, size; /* the srv_config field */
    long long lo, hi;    /* OPT_INT bounds */
    const char *def;     /* default as text, applied by srv_config_defaults; NULL: none */
    const char *def_doc; /* the default in words where it is computed */
    const char *help;
    int (*check)(const char *key, const char *value, ty_err *err); /* beyond the type's */
    unsigned flags;
} srv_option;
const srv_option *srv_config_options(size_t *n);
const srv_option *srv_config_options_find(const char *key);

struct store_config;
/* Fills a storage config from the server's (unset fields fall back to the
 * environment). The pointers borrow from c. */
void srv_store_config(const srv_config *c, struct store_config *out);
/* Is this setting a secret (accepted from the config file only, never a
 * flag, which `ps` would show)? */
bool srv_config_is_secret(const char *key);

/* Fills defaults (needs the cwd and /proc/self/exe). */
int srv_config_defaults(srv_config *c, ty_err *err);
/* Parses `serve` arguments: --config FILE first, then flags override.
 * Returns 1 when --help was asked (usage already printed to out). */
int srv_config_parse(srv_config *c, int argc, char **argv, FILE *out, ty_err *err);
/* Applies one `key = value` setting (the flag name without dashes). */
int srv_config_set(srv_config *c, const char *key, const char *value, ty_err *err);
int srv_config_load_file(srv_config *c, const char *path, ty_err *err);
void srv_config_usage(FILE *out);
/* ---- confinement (confine.c, speccheck.c) ---------------------------------- */

/* The data directory 0700 (also one made before) and its default roots
 * inputs/ and stores/ created; the directory must exist. */
int srv_data_dir_prepare(const srv_config *c, ty_err *err);
/* Does this NAME=value of the server's environment go to an engine? */
bool srv_engine_env_keep(const char *kv);
struct jobspec;
/* The submit-time checks beyond jobspec_parse (admit.c runs them), each
 * TY_EINVAL with err->field. Paths: the spec's under allowed_roots, a
 * dataset that exists a regular file, a file:// store under store_roots. */
int srv_spec_check_paths(const srv_config *c, const struct jobspec *spec, ty_err *err);
/* Model: a local model.path's config.json and lora.adapter's
 * adapter_config.json as the engine reads them, model.init valid for the
 * engine and within max_params. */
int srv_spec_check_model(const srv_config *c, const struct jobspec *spec, ty_err *err);

/* Splits "host:port" ([v6]:port accepted); is the host a loopback address? */
int srv_listen_parse(const char *listen, char *host, size_t hostcap, int *port, ty_err *err);
bool srv_host_is_loopback(const char *host);

/* ---- pure helpers, unit-tested (util.c) -------------------------------------- */

/* Opaque list cursor: base64url of "j<id>". */
void srv_cursor_encode(int64_t id, char out[32]);
int srv_cursor_decode(const char *s, int64_t *id);
/* RFC 3339 UTC with milliseconds; "" for 0. */
void srv_time_fmt(int64_t ms, char out[32]);

/* Copies in to out (cap bytes with the NUL), each byte that is not part of
 * valid UTF-8 replaced by '?', never cutting a character. */
void srv_utf8_sanitize(const char *in, char *out, size_t cap);
/* {"error": {"code", "message", "field"?}} as compact JSON; malloc'd. */
char *srv_error_json(const char *code, const char *field, const char *msg);

/* API tokens: "ty_" + 64 hex chars from 32 random bytes. */
int srv_token_generate(char out[68], ty_err *err);
void srv_token_hash(const char *token, char hex[65]);
/* Constant-time: does the token hash to any of the n stored hashes? */
bool srv_token_matches(const char *token, const char (*hashes)[65], int n);
/* The same, returning which (-1: none); every hash is still compared. */
int srv_token_find(const char *token, const char (*hashes)[65], int n);

/* Token scopes: what a route needs, what a token may do (docs/server.md). */
enum { SCOPE_READ = 1, SCOPE_SUBMIT = 2, SCOPE_ADMIN = 4, SCOPE_ALL = 7 };
/* "read,submit" -> mask; TY_EINVAL for an unknown or empty scope. */
int srv_scopes_parse(const char *s, unsigned *mask);
/* mask -> "read,submit" ("none" for 0). */
void srv_scopes_format(unsigned mask, char out[64]);
const char *srv_scope_name(unsigned one_scope);

typedef struct srv_gpu_sample {
    int index;
    char name[96];
    int64_t mem_total, mem_used;
    int util, temp;
    int64_t job_id; /* 0 = free */
} srv_gpu_sample;

typedef struct srv_prom {
    int64_t jobs[JOB_NSTATES];
    int64_t queue_length;
    int64_t events_ingested;
    int64_t sse_clients;
    int64_t http_requests;
    int ngpus;
    const srv_gpu_sample *gpus;
} srv_prom;

/* Prometheus text exposition (version 0.0.4) of a snapshot; malloc'd. */
char *srv_prom_render(const srv_prom *p);

/* ---- the daemon ---------------------------------------------------------------- */

struct sse_hub;
struct evw;
struct sched;
struct uploader;
struct gpu_inv;
struct MHD_Daemon;
struct gate;
struct ratelim;

typedef struct srv {
    srv_config cfg;
    char db_path[PATH_MAX + 32];
    char jobs_dir[PATH_MAX + 32];
    bool auth_required;
    pthread_mutex_t write_lock; /* commit + publish of events, in id order */
    struct sse_hub *hub;
    struct evw *evw;
    struct sched *sched;
    struct uploader *up; /* checkpoint upload queue workers (upload.c) */
    struct gpu_inv *gpu;
    struct MHD_Daemon *mhd;
    struct gate *gate;  /* accepts and checks request heads (gate.c) */
    struct ratelim *rl; /* per-token request buckets (http.c) */
    atomic_llong events_ingested;
    atomic_llong http_requests;
    atomic_bool stopping;
    pthread_key_t db_key; /* per-thread db handle */
    /* The disk (disk.c): the handles' mode (db_mode: read-only while the
     * disk is full at start), its generation (handles of an older one are
     * reopened), whether the reserve file is held, the next tick. */
    atomic_int db_mode, db_gen;
    atomic_bool reserve_held;
    atomic_llong disk_tick_ms;
    struct overlay *overlay; /* jobs whose final state is being written (overlay.c) */
} srv;
/* What every part does with it (the database handle, publishing,
 * transitions, job directories) is state.h's; starting and stopping it
 * is serve.h's. */

/* `trainyard token create NAME [--data-dir D]` (token.c). */
int srv_token_main(int argc, char **argv);

/* ---- batched event writer (evwriter.c) ------------------------------------------ */

/* Engine events are queued here and committed by one thread in batches of at
 * most EVW_MAX_BATCH events, then handed to the publish callback in id order
 * (under *lock, which also orders transitions). The writer commits as soon
 * as it is idle, so a quiet job's events reach streams at once while a
 * chatty one's are grouped: whatever arrives during a commit goes into the
 * next one. */
#define EVW_MAX_BATCH 1000
typedef void (*evw_publish_fn)(void *ctx, const db_event *ev);
struct evw *evw_new(const char *db_path, pthread_mutex_t *lock, evw_publish_fn publish, void *ctx,
                    ty_err *err);
/* The same with handle(ctx) (not db_path) giving the database handle of
 * whichever thread commits, so it follows the server's mode (disk.c). */
struct evw *evw_new_with(const char *db_path, db *(*handle)(void *ctx), pthread_mutex_t *lock,
                         evw_publish_fn publish, void *ctx, ty_err *err);
/* Takes ownership of data (malloc'd JSON text). Blocks briefly while more
 * than a few batches are pending, which back-pressures a flooding engine. */
void evw_push(struct evw *w, int64_t job_id, const char *type, char *data);
/* Commits and publishes whatever is pending; the caller holds *lock. */
int evw_flush_locked(struct evw *w, ty_err *err);
/* Events committed and transactions used so far. */
void evw_stats(struct evw *w, int64_t *events, int64_t *batches);
/* Final flush, then stops the thread. */
void evw_free(struct evw *w);

#endif
