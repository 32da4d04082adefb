/* config.c — `trainyard serve` settings: defaults, a `key = value` config
 * file, then command-line flags, each later source overriding the earlier.
 *
 * Every setting is one row of OPTIONS below: its name (the flag without
 * dashes, which is also the config-file key), type, bounds, default, help
 * and whether it is a secret. Defaults, both parsers, `--help` and the check
 * of docs/server.md's option list (server_unit.config) all read that table,
 * so a new option is one row plus its srv_config field. A deployment keeps
 * its settings in /etc and overrides one on the command line while testing;
 * secrets come from the file (or the environment) only, never from argv,
 * which `ps` shows. */
#include "server.h"
#include "ops.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"
#include "typath.h"
#include "tyutil.h"

/* ---- checks beyond the type's ------------------------------------------------------------ */

static int check_listen(const char *key, const char *v, ty_err *err)
{
    (void)key;
    char host[256];
    int port;
    return srv_listen_parse(v, host, sizeof host, &port, err) ? TY_EINVAL : 0;
}

static int check_gpus(const char *key, const char *v, ty_err *err)
{
    if (!strcmp(v, "auto") || !strcmp(v, "none")) return 0;
    for (const char *p = v; *p; p++)
        if (!isdigit((unsigned char)*p) && *p != ',')
            return ty_err_field(err, TY_EINVAL, key, "gpus must be auto, none or a list like 0,1");
    return 0;
}

static int check_executor(const char *key, const char *v, ty_err *err)
{
    if (strcmp(v, "local") && strcmp(v, "slurm"))
        return ty_err_field(err, TY_EINVAL, key, "executor must be local or slurm, got '%s'", v);
    return 0;
}

static int check_abs_path(const char *key, const char *v, ty_err *err)
{
    if (v[0] && v[0] != '/')
        return ty_err_field(err, TY_EINVAL, key, "%s must be an absolute path, got '%s'", key, v);
    return 0;
}

static int check_roots(const char *key, const char *v, ty_err *err)
{
    for (const char *p = v; *p;) {
        const char *e = strchrnul(p, ':');
        if (e > p && *p != '/')
            return ty_err_field(err, TY_EINVAL, key, "%s: '%.*s' is not an absolute path", key,
                                (int)(e - p), p);
        p = *e ? e + 1 : e;
    }
    return 0;
}

static int check_currency(const char *key, const char *v, ty_err *err)
{
    if (strlen(v) != 3 || !isupper((unsigned char)v[0]) || !isupper((unsigned char)v[1]) ||
        !isupper((unsigned char)v[2]))
        return ty_err_field(err, TY_EINVAL, key,
                            "currency must be a 3-letter ISO 4217 code like USD, got '%s'", v);
    return 0;
}

/* A cost limit the server fills into specs must be one a spec may carry:
 * limits.max_cost is in (0, 1e12] (common/jobspec.c). */
static int check_cost_limit(const char *key, const char *v, ty_err *err)
{
    char *end;
    double x = strtod(v, &end);
    if (end != v && *end == '\0' && !(x > 0 && x <= 1e12))
        return ty_err_field(err, TY_EINVAL, key,
                            "%s must be above 0 and at most 1e12 (as limits.max_cost), got '%s'",
                            key, v);
    return 0;
}

/* ---- the table --------------------------------------------------------------------------- */

#define AT(f) offsetof(srv_config, f), sizeof(((srv_config *)0)->f)
#define INT(f, lo, hi) OPT_INT, AT(f), lo, hi
#define STR(f) OPT_STR, AT(f), 0, 0
#define BOOL(f) OPT_BOOL, AT(f), 0, 0
#define PRICE(f) OPT_PRICE, AT(f), 0, 0
#define STORE(name, f)                                                                             \
    {                                                                                              \
        name, NULL, STR(store.f), NULL, NULL, NULL, NULL, OPT_STORE                                \
    }
#define SECRET(name, f)                                                                            \
    {                                                                                              \
        name, NULL, STR(store.f), NULL, NULL, NULL, NULL, OPT_STORE | OPT_SECRET                   \
    }

static const srv_option OPTIONS[] = {
    {"config", "FILE", OPT_CONFIG, 0, 0, 0, 0, NULL, NULL, "read settings from FILE first", NULL,
     OPT_FLAG_ONLY},
    {"listen", "HOST:PORT", STR(listen), "127.0.0.1:8080", NULL,
     "address to listen on; a non-loopback address requires API tokens", check_listen, 0},
    {"data-dir", "DIR", STR(data_dir), "./trainyard-data", NULL,
     "database, job directories and logs", NULL, 0},
    {"engine", "PATH", STR(engine), NULL, "trainyard-engine beside this binary",
     "the engine binary", NULL, 0},
    {"gpus", "auto|none|LIST", STR(gpus), "auto", NULL,
     "GPUs to schedule: auto asks NVML, none runs CPU jobs only, LIST is like 0,1", check_gpus, 0},
    {"cpu-slots", "N", INT(cpu_slots, 0, 1024), "1", NULL,
     "CPU ranks that may run at once (a job takes resources.cpu_ranks)", NULL, 0},
    {"executor", "NAME", STR(executor), "local", NULL, "where engines run: local or slurm",
     check_executor, 0},
    {"slurm-workdir", "DIR", STR(slurm_workdir), NULL, "the data dir",
     "slurm: a path the server and every node share; job directories go to DIR/jobs",
     check_abs_path, 0},
    {"slurm-partition", "P", STR(slurm_partition), NULL, "Slurm's default",
     "slurm: sbatch --partition", NULL, 0},
    {"slurm-account", "A", STR(slurm_account), NULL, NULL, "slurm: sbatch --account", NULL, 0},
    {"slurm-args", "ARGS", STR(slurm_args), NULL, NULL,
     "slurm: more sbatch arguments, space-separated", NULL, 0},
    {"slurm-poll-ms", "MS", INT(slurm_poll_ms, 100, 600000), "2000", NULL,
     "slurm: how often squeue is asked", NULL, 0},
    {"allowed-roots", "A:B", STR(allowed_roots), NULL, "DATA_DIR/inputs",
     "directories job specs may read from, checked at submit and again by the engine on every open",
     check_roots, 0},
    {"store-roots", "A:B", STR(store_roots), NULL, "DATA_DIR/stores",
     "directories file:// checkpoint stores may lie in", check_roots, 0},
    {"max-params", "N", INT(max_params, 0, 1000000000000000LL), "1000000000", NULL,
     "largest model.init (parameters) accepted at submit; 0 = no limit", NULL, 0},
    {"max-body", "BYTES", INT(max_body, 1024, 1L << 30), "1048576", NULL,
     "largest request body accepted", NULL, 0},
    {"grace", "SECONDS", INT(grace_s, 0, 86400), "30", NULL,
     "SIGTERM to SIGKILL delay for cancel/pause", NULL, 0},
    {"tls-cert", "FILE", STR(tls_cert), NULL, NULL, "PEM certificate; with --tls-key serves HTTPS",
     NULL, 0},
    {"tls-key", "FILE", STR(tls_key), NULL, NULL, "PEM private key", NULL, 0},
    {"require-token", NULL, BOOL(require_token), "false", NULL,
     "require a bearer token even on loopback", NULL, 0},
    {"per-ip-connections", "N", INT(per_ip_connections, 0, 1000000), "256", NULL,
     "connections one client address may hold, request heads still arriving included; 0 = no limit",
     NULL, 0},
    {"max-connections", "N", INT(max_connections, 1, 1000000), "10000", NULL,
     "connections served at once, all clients together; more are 503", NULL, 0},
    {"max-pending-heads", "N", INT(max_pending_heads, 16, 1000000), "4096", NULL,
     "connections whose request head is still arriving, all clients together; past it the oldest "
     "of the address with the most is dropped",
     NULL, 0},
    {"header-timeout", "SECONDS", INT(header_timeout_s, 1, 3600), "10", NULL,
     "the whole request head must arrive within this from connect, else 408", NULL, 0},
    {"request-timeout", "SECONDS", INT(request_timeout_s, 0, 86400), "60", NULL,
     "the whole body must arrive within this from the head, else the connection is closed; 0 = off",
     NULL, 0},
    {"rate-limit", "N", INT(rate_limit, 0, 1000000), "20", NULL,
     "requests per second one API token may make on average, else 429 with Retry-After; 0 = off",
     NULL, 0},
    {"rate-burst", "N", INT(rate_burst, 1, 1000000), "100", NULL,
     "requests one token may make at once", NULL, 0},
    {"event-rate", "N", INT(event_rate, 0, 100000000), "1000", NULL,
     "engine event lines per second (a 2-second burst allowed) above which a job fails as flooding; "
     "0 = off",
     NULL, 0},
    {"gpu-sample-ms", "MS", INT(gpu_sample_ms, 100, 3600000), "2000", NULL, "GPU sampling period",
     NULL, 0},
    {"heartbeat", "SECONDS", INT(heartbeat_s, 1, 3600), "15", NULL, "SSE heartbeat comment period",
     NULL, 0},
    {"http-threads", "N", INT(http_threads, 1, 64), "2", NULL,
     "HTTP worker threads, each with its own epoll", NULL, 0},
    {"upload-workers", "N", INT(upload_workers, 1, 64), "2", NULL, "checkpoint upload threads",
     NULL, 0},
    {"upload-wait", "SECONDS", INT(upload_wait_s, 0, 86400), "300", NULL,
     "pause/cancel/finish wait this long for a running checkpoint upload, then cancel it", NULL, 0},
    {"upload-attempts", "N", INT(upload_attempts, 1, 1000), "5", NULL,
     "tries of one upload before it fails for good", NULL, 0},
    {"gpu-hour-price", "X", PRICE(gpu_hour_price), NULL, "unknown, cost is null",
     "price of one GPU-hour of running time; with it jobs report their cost", NULL, 0},
    {"cpu-hour-price", "X", PRICE(cpu_hour_price), NULL, "unknown",
     "price of one hour of a CPU job's running time", NULL, 0},
    {"currency", "CODE", STR(currency), "USD", NULL, "ISO 4217 code of those prices",
     check_currency, 0},
    /* Operations (docs/server.md "Operations"). */
    {"gpu-hour-prices", "M=X,...", STR(ops.gpu_hour_prices), NULL, "none",
     "price of a GPU-hour per GPU model: the first MODEL in the GPU's name wins, else --gpu-hour-price",
     ops_check_prices, 0},
    {"max-cost-default", "X", PRICE(ops.max_cost_default), NULL, "none",
     "limits.max_cost of a job whose spec sets none", check_cost_limit, 0},
    {"max-cost-cap", "X", PRICE(ops.max_cost_cap), NULL, "none",
     "largest limits.max_cost a spec may ask (the default when no default is set)",
     check_cost_limit, 0},
    {"max-runtime-default", "SECONDS", INT(ops.max_runtime_default, 0, 100000000), "0", NULL,
     "limits.max_runtime_s of a job whose spec sets none; 0 = none", NULL, 0},
    {"max-runtime-cap", "SECONDS", INT(ops.max_runtime_cap, 0, 100000000), "0", NULL,
     "largest limits.max_runtime_s a spec may ask; 0 = none", NULL, 0},
    {"max-tokens-default", "N", INT(ops.max_tokens_default, 0, INT64_MAX), "0", NULL,
     "limits.max_tokens of a job whose spec sets none; 0 = none", NULL, 0},
    {"max-tokens-cap", "N", INT(ops.max_tokens_cap, 0, INT64_MAX), "0", NULL,
     "largest limits.max_tokens a spec may ask; 0 = none", NULL, 0},
    {"stall-floor", "SECONDS", INT(ops.stall_floor_s, 1, 86400), "300", NULL,
     "least stall_after_s derived from a job's step time (lower it only for tests)", NULL, 0},
    {"idle-gpu-util", "PCT", INT(ops.idle_gpu_util, 0, 100), "10", NULL,
     "GPU utilisation below which a held GPU is idle", NULL, 0},
    {"idle-gpu-after", "SECONDS", INT(ops.idle_gpu_after_s, 0, 604800), "600", NULL,
     "a job's GPUs idle this long raise idle_gpu; 0 = off", NULL, 0},
    {"webhook-urls", "U,...", STR(ops.webhook_urls), NULL, "none",
     "URLs every job's state changes, budget stops, stalls and idle GPUs are POSTed to",
     ops_check_urls, 0},
    {"webhook-secret", "KEY", STR(ops.webhook_secret), NULL, "none",
     "HMAC-SHA256 key of the webhook signature", NULL, OPT_SECRET},
    {"webhook-allowed-hosts", "H,...", STR(ops.webhook_allowed_hosts), NULL, "none",
     "hosts (host or host:port) a job spec's own webhooks may name", NULL, 0},
    {"webhook-attempts", "N", INT(ops.webhook_attempts, 1, 100), "8", NULL,
     "tries of one webhook delivery before it fails for good", NULL, 0},
    /* Object stores: copied as given, never echoed in a message. */
    STORE("s3-access-key-id", s3_access_key_id),
    SECRET("s3-secret-access-key", s3_secret_access_key),
    SECRET("s3-session-token", s3_session_token),
    STORE("s3-region", s3_region),
    STORE("s3-endpoint", s3_endpoint),
    STORE("gcs-hmac-access-id", gcs_hmac_access_id),
    SECRET("gcs-hmac-secret", gcs_hmac_secret),
    STORE("gcs-credentials-file", gcs_credentials_file),
    STORE("gcs-xml-endpoint", gcs_xml_endpoint),
    STORE("gcs-json-endpoint", gcs_json_endpoint),
    SECRET("azure-connection-string", azure_connection_string),
    STORE("azure-account", azure_account),
    SECRET("azure-key", azure_key),
    SECRET("azure-sas-token", azure_sas_token),
    STORE("azure-endpoint", azure_endpoint),
};

#undef AT
#undef INT
#undef STR
#undef BOOL
#undef PRICE
#undef STORE
#undef SECRET

const srv_option *srv_config_options(size_t *n)
{
    *n = sizeof OPTIONS / sizeof OPTIONS[0];
    return OPTIONS;
}

const srv_option *srv_config_options_find(const char *key)
{
    for (size_t i = 0; i < sizeof OPTIONS / sizeof OPTIONS[0]; i++)
        if (!strcmp(OPTIONS[i].name, key)) return &OPTIONS[i];
    return NULL;
}

bool srv_config_is_secret(const char *key)
{
    const srv_option *o = srv_config_options_find(key);
    return o && (o->flags & OPT_SECRET);
}

/* ---- values ------------------------------------------------------------------------------ */

static int parse_int(const char *key, const char *v, long long lo, long long hi, long long *out,
                     ty_err *err)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ty_err_field(err, TY_EINVAL, key, "%s must be an integer in [%lld, %lld], got '%s'",
                            key, lo, hi, v);
    *out = x;
    return 0;
}

/* A price: a finite number >= 0 (strtod also takes "inf" and "nan"). */
static int parse_price(const char *key, const char *v, double *out, ty_err *err)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < 0)
        return ty_err_field(err, TY_EINVAL, key, "%s must be a number >= 0, got '%s'", key, v);
    *out = x;
    return 0;
}

static int parse_bool(const char *key, const char *v, bool *out, ty_err *err)
{
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on"))
        *out = true;
    else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off"))
        *out = false;
    else
        return ty_err_field(err, TY_EINVAL, key, "%s must be true or false, got '%s'", key, v);
    return 0;
}

static int copy_str(const char *key, char *dst, size_t cap, const char *v, ty_err *err)
{
    if (strlen(v) >= cap) return ty_err_field(err, TY_EINVAL, key, "%s is too long", key);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

/* Integer fields are int, int64_t or size_t: stored by their size. */
static void store_int(void *field, size_t size, long long x)
{
    if (size == sizeof(int))
        *(int *)field = (int)x;
    else
        *(int64_t *)field = (int64_t)x;
}

static int apply(srv_config *c, const srv_option *o, const char *v, ty_err *err)
{
    void *field = (char *)c + o->offset;
    long long x =
        0; /* set by parse_int; gcc -O2 cannot see it (Release -Werror=maybe-uninitialized) */
    int rc;
    if (o->check && (rc = o->check(o->name, v, err))) return rc;
    switch (o->type) {
    case OPT_STR:
        return copy_str(o->name, field, o->size, v, err);
    case OPT_BOOL:
        return parse_bool(o->name, v, field, err);
    case OPT_PRICE:
        return parse_price(o->name, v, field, err);
    case OPT_INT:
        if ((rc = parse_int(o->name, v, o->lo, o->hi, &x, err))) return rc;
        store_int(field, o->size, x);
        return 0;
    case OPT_CONFIG:
        break;
    }
    return ty_err_field(err, TY_EINVAL, o->name,
                        "unknown setting '%s' (see trainyard serve --help)", o->name);
}

int srv_config_set(srv_config *c, const char *key, const char *v, ty_err *err)
{
    const srv_option *o = srv_config_options_find(key);
    if (!o || (o->flags & OPT_FLAG_ONLY))
        return ty_err_field(err, TY_EINVAL, key,
                            "unknown setting '%s' (see trainyard serve --help)", key);
    return apply(c, o, v, err);
}

int srv_config_defaults(srv_config *c, ty_err *err)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < sizeof OPTIONS / sizeof OPTIONS[0]; i++)
        if (OPTIONS[i].def && apply(c, &OPTIONS[i], OPTIONS[i].def, err)) return TY_EINVAL;
    /* Unset prices are < 0 (cost unknown); a set one is >= 0. */
    c->gpu_hour_price = -1;
    c->cpu_hour_price = -1;
    c->ops.max_cost_default = c->ops.max_cost_cap = -1;
    /* The engine is built beside us: <dir of /proc/self/exe>/trainyard-engine. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return ty_err_set(err, TY_EIO, "readlink /proc/self/exe: %s", strerror(errno));
    exe[n] = 0;
    snprintf(c->engine, sizeof c->engine, "%s/trainyard-engine", dirname(exe));
    /* allowed_roots and store_roots are completed in srv_config_parse once
     * data_dir is final; an empty value here means "use the defaults". */
    return 0;
}

static const char *or_null(const char *s)
{
    return s[0] ? s : NULL;
}

void srv_store_config(const srv_config *c, store_config *out)
{
    store_config_init(out);
    out->aws_access_key_id = or_null(c->store.s3_access_key_id);
    out->aws_secret_access_key = or_null(c->store.s3_secret_access_key);
    out->aws_session_token = or_null(c->store.s3_session_token);
    out->aws_region = or_null(c->store.s3_region);
    out->s3_endpoint = or_null(c->store.s3_endpoint);
    out->gcs_hmac_access_id = or_null(c->store.gcs_hmac_access_id);
    out->gcs_hmac_secret = or_null(c->store.gcs_hmac_secret);
    out->gcs_credentials_file = or_null(c->store.gcs_credentials_file);
    out->gcs_xml_endpoint = or_null(c->store.gcs_xml_endpoint);
    out->gcs_json_endpoint = or_null(c->store.gcs_json_endpoint);
    out->azure_connection_string = or_null(c->store.azure_connection_string);
    out->azure_account = or_null(c->store.azure_account);
    out->azure_key = or_null(c->store.azure_key);
    out->azure_sas_token = or_null(c->store.azure_sas_token);
    out->azure_endpoint = or_null(c->store.azure_endpoint);
    out->file_roots = c->store_roots;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

int srv_config_load_file(srv_config *c, const char *path, ty_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return ty_err_set(err, TY_EIO, "config %s: %s", path, strerror(errno));
    char line[8192];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = ty_err_set(err, TY_EINVAL, "config %s:%d: expected key = value", path, lineno);
            break;
        }
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        size_t vl = strlen(v);
        if (vl >= 2 && v[0] == '"' && v[vl - 1] == '"') {
            v[vl - 1] = 0;
            v++;
        }
        if ((rc = srv_config_set(c, k, v, err))) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "%s", err->msg);
            ty_err_set(err, rc, "config %s:%d: %s", path, lineno, m);
            break;
        }
    }
    fclose(f);
    return rc;
}

/* Prints text from column `col`, wrapped before column 79. */
static void wrap(FILE *out, const char *text, int col, int at)
{
    const char *p = text;
    while (*p) {
        const char *end = p, *brk = NULL;
        while (*end && at + (end - p) < 79) {
            if (*end == ' ') brk = end;
            end++;
        }
        if (*end && brk) end = brk;
        fprintf(out, "%.*s\n", (int)(end - p), p);
        p = *end == ' ' ? end + 1 : end;
        if (*p) fprintf(out, "%*s", col, "");
        at = col;
    }
}

void srv_config_usage(FILE *out)
{
    fputs("usage: trainyard serve [flags]\n"
          "\n"
          "Runs the job server. Every flag can also be set in the file given with\n"
          "--config as a `key = value` line (the flag name without dashes, e.g.\n"
          "`grace = 10`); flags on the command line override the file.\n"
          "\n",
          out);
    size_t n;
    const srv_option *o = srv_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        if (o[i].flags & OPT_STORE) continue;
        char flag[64], text[512];
        int w = snprintf(flag, sizeof flag, "  --%s%s%s", o[i].name, o[i].arg ? " " : "",
                         o[i].arg ? o[i].arg : "");
        const char *def = o[i].def_doc ? o[i].def_doc : o[i].type == OPT_BOOL ? NULL : o[i].def;
        snprintf(text, sizeof text, "%s%s%s%s", o[i].help, def ? " (default " : "", def ? def : "",
                 def ? ")" : "");
        fputs(flag, out);
        if (w < 24)
            fprintf(out, "%*s", 24 - w, "");
        else
            fputs("  ", out), w += 2;
        wrap(out, text, 24, w < 24 ? 24 : w);
    }
    fputs("  --help                this text\n"
          "\n"
          "Object stores (config file; the secrets, marked *, only there, else the\n"
          "environment):\n",
          out);
    int at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(o[i].flags & OPT_STORE)) continue;
        int len = (int)strlen(o[i].name) + ((o[i].flags & OPT_SECRET) ? 1 : 0);
        if (at && at + 1 + len > 78) fputc('\n', out), at = 0;
        at += fprintf(out, "%s%s%s", at ? " " : "  ", o[i].name,
                      (o[i].flags & OPT_SECRET) ? "*" : "");
    }
    fputc('\n', out);
}

int srv_config_parse(srv_config *c, int argc, char **argv, FILE *out, ty_err *err)
{
    /* The config file first, wherever --config appears, so flags win. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            srv_config_usage(out);
            return 1;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc)
                return ty_err_field(err, TY_EINVAL, "config", "--config needs a file");
            if (srv_config_load_file(c, argv[i + 1], err)) return TY_EINVAL;
        } else if (!strncmp(argv[i], "--config=", 9)) {
            if (srv_config_load_file(c, argv[i] + 9, err)) return TY_EINVAL;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) return ty_err_set(err, TY_EINVAL, "unexpected argument '%s'", a);
        char key[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (kl >= sizeof key) return ty_err_set(err, TY_EINVAL, "unknown flag '%s'", a);
        memcpy(key, a + 2, kl);
        key[kl] = 0;
        const srv_option *o = srv_config_options_find(key);
        if (o && o->type == OPT_BOOL && !eq) { /* --require-token alone means true */
            if (srv_config_set(c, key, "true", err)) return TY_EINVAL;
            continue;
        }
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return ty_err_set(err, TY_EINVAL, "flag --%s needs a value", key);
        if (!strcmp(key, "config")) continue;
        if (srv_config_is_secret(key))
            return ty_err_field(err, TY_EINVAL, key,
                                "--%s is a secret: set it in the --config file or the environment, "
                                "not on the command line",
                                key);
        if (srv_config_set(c, key, val, err)) return TY_EINVAL;
    }
    /* The data dir absolute and clean from here on, so every message and
     * default root built from it reads /srv/x/trainyard-data, never
     * /srv/x/./trainyard-data (typath.h). */
    ty_path_absolute(c->data_dir, c->data_dir, sizeof c->data_dir);
    if ((c->tls_cert[0] != 0) != (c->tls_key[0] != 0))
        return ty_err_field(err, TY_EINVAL, c->tls_cert[0] ? "tls-key" : "tls-cert",
                            "--tls-cert and --tls-key go together");
    /* The defaults are directories of our own, never the cwd, $HOME or /:
     * a root is what any API client may read, and the data directory
     * itself holds the database. srv_data_dir_prepare creates them. */
    if (!c->allowed_roots[0] || !c->store_roots[0]) {
        char cwd[PATH_MAX] = "";
        char dd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
        if (!realpath(c->data_dir, dd)) {
            if (c->data_dir[0] == '/')
                snprintf(dd, sizeof dd, "%s", c->data_dir);
            else
                snprintf(dd, sizeof dd, "%.2040s/%.2040s", cwd,
                         c->data_dir + (strncmp(c->data_dir, "./", 2) ? 0 : 2));
        }
        if (!c->allowed_roots[0])
            snprintf(c->allowed_roots, sizeof c->allowed_roots, "%.4000s/inputs", dd);
        if (!c->store_roots[0])
            snprintf(c->store_roots, sizeof c->store_roots, "%.4000s/stores", dd);
    }
    return 0;
}

int srv_listen_parse(const char *listen, char *host, size_t hostcap, int *port, ty_err *err)
{
    const char *colon;
    const char *h = listen;
    size_t hl;
    if (listen[0] == '[') {
        const char *rb = strchr(listen, ']');
        if (!rb || rb[1] != ':')
            return ty_err_field(err, TY_EINVAL, "listen", "listen must be HOST:PORT, got '%s'",
                                listen);
        h = listen + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(listen, ':');
        if (!colon)
            return ty_err_field(err, TY_EINVAL, "listen", "listen must be HOST:PORT, got '%s'",
                                listen);
        hl = (size_t)(colon - listen);
    }
    if (hl == 0 || hl >= hostcap)
        return ty_err_field(err, TY_EINVAL, "listen", "listen needs a host, got '%s'", listen);
    memcpy(host, h, hl);
    host[hl] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 0 || p > 65535)
        return ty_err_field(err, TY_EINVAL, "listen", "bad port in '%s'", listen);
    *port = (int)p;
    return 0;
}

bool srv_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcmp(host, "localhost")) return true;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}
