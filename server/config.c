/* config.c — `trainyard serve` settings: defaults, a `key = value` config
 * file, then command-line flags, each later source overriding the earlier.
 *
 * Every flag has the same name in the file (without the dashes), so a
 * deployment can keep its settings in /etc and override one on the command
 * line while testing. */
#include "server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"
#include "typath.h"
#include "tyutil.h"

int srv_config_defaults(srv_config *c, ty_err *err)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:8080");
    snprintf(c->data_dir, sizeof c->data_dir, "./trainyard-data");
    snprintf(c->gpus, sizeof c->gpus, "auto");
    snprintf(c->executor, sizeof c->executor, "local");
    c->cpu_slots = 1;
    c->max_body = 1 << 20;
    c->grace_s = 30;
    c->event_rate = 1000;
    c->gpu_sample_ms = 2000;
    c->heartbeat_s = 15;
    c->http_threads = 2;
    c->upload_workers = 2;
    c->upload_wait_s = 300;
    c->upload_attempts = 5;
    c->per_ip_connections = 256;
    c->max_connections = 10000;
    c->header_timeout_s = 10;
    c->request_timeout_s = 60;
    c->rate_limit = 20;
    c->rate_burst = 100;
    c->gpu_hour_price = -1;
    c->cpu_hour_price = -1;
    snprintf(c->currency, sizeof c->currency, "USD");
    c->max_params = 1000000000;
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

static int parse_int(const char *key, const char *v, long lo, long hi, long *out, ty_err *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ty_err_field(err, TY_EINVAL, key, "%s must be an integer in [%ld, %ld], got '%s'",
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

int srv_config_set(srv_config *c, const char *key, const char *v, ty_err *err)
{
    long x = 0;
    if (!strcmp(key, "listen")) {
        char host[256];
        int port;
        if (srv_listen_parse(v, host, sizeof host, &port, err)) return TY_EINVAL;
        return copy_str(key, c->listen, sizeof c->listen, v, err);
    }
    if (!strcmp(key, "data-dir")) return copy_str(key, c->data_dir, sizeof c->data_dir, v, err);
    if (!strcmp(key, "engine")) return copy_str(key, c->engine, sizeof c->engine, v, err);
    if (!strcmp(key, "gpus")) {
        if (strcmp(v, "auto") && strcmp(v, "none")) {
            for (const char *p = v; *p; p++)
                if (!isdigit((unsigned char)*p) && *p != ',')
                    return ty_err_field(err, TY_EINVAL, key,
                                        "gpus must be auto, none or a list like 0,1");
        }
        return copy_str(key, c->gpus, sizeof c->gpus, v, err);
    }
    if (!strcmp(key, "executor")) {
        if (strcmp(v, "local"))
            return ty_err_field(err, TY_EINVAL, key, "executor must be local, got '%s'", v);
        return copy_str(key, c->executor, sizeof c->executor, v, err);
    }
    if (!strcmp(key, "cpu-slots")) {
        if (parse_int(key, v, 0, 1024, &x, err)) return TY_EINVAL;
        c->cpu_slots = (int)x;
        return 0;
    }
    if (!strcmp(key, "allowed-roots") || !strcmp(key, "store-roots")) {
        for (const char *p = v; *p;) {
            const char *e = strchrnul(p, ':');
            if (e > p && *p != '/')
                return ty_err_field(err, TY_EINVAL, key, "%s: '%.*s' is not an absolute path", key,
                                    (int)(e - p), p);
            p = *e ? e + 1 : e;
        }
        if (key[0] == 'a') return copy_str(key, c->allowed_roots, sizeof c->allowed_roots, v, err);
        return copy_str(key, c->store_roots, sizeof c->store_roots, v, err);
    }
    if (!strcmp(key, "max-params")) {
        if (parse_int(key, v, 0, 1000000000000000L, &x, err)) return TY_EINVAL;
        c->max_params = x;
        return 0;
    }
    if (!strcmp(key, "max-body")) {
        if (parse_int(key, v, 1024, 1L << 30, &x, err)) return TY_EINVAL;
        c->max_body = (size_t)x;
        return 0;
    }
    if (!strcmp(key, "grace")) {
        if (parse_int(key, v, 0, 86400, &x, err)) return TY_EINVAL;
        c->grace_s = (int)x;
        return 0;
    }
    if (!strcmp(key, "tls-cert")) return copy_str(key, c->tls_cert, sizeof c->tls_cert, v, err);
    if (!strcmp(key, "tls-key")) return copy_str(key, c->tls_key, sizeof c->tls_key, v, err);
    if (!strcmp(key, "require-token")) return parse_bool(key, v, &c->require_token, err);
    if (!strcmp(key, "event-rate")) {
        if (parse_int(key, v, 0, 100000000, &x, err)) return TY_EINVAL;
        c->event_rate = (int)x;
        return 0;
    }
    if (!strcmp(key, "gpu-sample-ms")) {
        if (parse_int(key, v, 100, 3600000, &x, err)) return TY_EINVAL;
        c->gpu_sample_ms = (int)x;
        return 0;
    }
    if (!strcmp(key, "heartbeat")) {
        if (parse_int(key, v, 1, 3600, &x, err)) return TY_EINVAL;
        c->heartbeat_s = (int)x;
        return 0;
    }
    if (!strcmp(key, "http-threads")) {
        if (parse_int(key, v, 1, 64, &x, err)) return TY_EINVAL;
        c->http_threads = (int)x;
        return 0;
    }
    if (!strcmp(key, "upload-workers")) {
        if (parse_int(key, v, 1, 64, &x, err)) return TY_EINVAL;
        c->upload_workers = (int)x;
        return 0;
    }
    if (!strcmp(key, "upload-wait")) {
        if (parse_int(key, v, 0, 86400, &x, err)) return TY_EINVAL;
        c->upload_wait_s = (int)x;
        return 0;
    }
    if (!strcmp(key, "upload-attempts")) {
        if (parse_int(key, v, 1, 1000, &x, err)) return TY_EINVAL;
        c->upload_attempts = (int)x;
        return 0;
    }
    if (!strcmp(key, "per-ip-connections")) {
        if (parse_int(key, v, 0, 1000000, &x, err)) return TY_EINVAL;
        c->per_ip_connections = (int)x;
        return 0;
    }
    if (!strcmp(key, "max-connections")) {
        if (parse_int(key, v, 1, 1000000, &x, err)) return TY_EINVAL;
        c->max_connections = (int)x;
        return 0;
    }
    if (!strcmp(key, "header-timeout")) {
        if (parse_int(key, v, 1, 3600, &x, err)) return TY_EINVAL;
        c->header_timeout_s = (int)x;
        return 0;
    }
    if (!strcmp(key, "request-timeout")) {
        if (parse_int(key, v, 0, 86400, &x, err)) return TY_EINVAL;
        c->request_timeout_s = (int)x;
        return 0;
    }
    if (!strcmp(key, "rate-limit")) {
        if (parse_int(key, v, 0, 1000000, &x, err)) return TY_EINVAL;
        c->rate_limit = (int)x;
        return 0;
    }
    if (!strcmp(key, "rate-burst")) {
        if (parse_int(key, v, 1, 1000000, &x, err)) return TY_EINVAL;
        c->rate_burst = (int)x;
        return 0;
    }
    if (!strcmp(key, "gpu-hour-price")) return parse_price(key, v, &c->gpu_hour_price, err);
    if (!strcmp(key, "cpu-hour-price")) return parse_price(key, v, &c->cpu_hour_price, err);
    if (!strcmp(key, "currency")) {
        if (strlen(v) != 3 || !isupper((unsigned char)v[0]) || !isupper((unsigned char)v[1]) ||
            !isupper((unsigned char)v[2]))
            return ty_err_field(err, TY_EINVAL, key,
                                "currency must be a 3-letter ISO 4217 code like USD, got '%s'", v);
        return copy_str(key, c->currency, sizeof c->currency, v, err);
    }
    /* Object-store settings: copied as given, never echoed in a message. */
#define STORE_KEY(name, field)                                                     \
    if (!strcmp(key, name)) return copy_str(key, c->store.field, sizeof c->store.field, v, err);
    STORE_KEY("s3-access-key-id", s3_access_key_id)
    STORE_KEY("s3-secret-access-key", s3_secret_access_key)
    STORE_KEY("s3-session-token", s3_session_token)
    STORE_KEY("s3-region", s3_region)
    STORE_KEY("s3-endpoint", s3_endpoint)
    STORE_KEY("gcs-hmac-access-id", gcs_hmac_access_id)
    STORE_KEY("gcs-hmac-secret", gcs_hmac_secret)
    STORE_KEY("gcs-credentials-file", gcs_credentials_file)
    STORE_KEY("gcs-xml-endpoint", gcs_xml_endpoint)
    STORE_KEY("gcs-json-endpoint", gcs_json_endpoint)
    STORE_KEY("azure-connection-string", azure_connection_string)
    STORE_KEY("azure-account", azure_account)
    STORE_KEY("azure-key", azure_key)
    STORE_KEY("azure-sas-token", azure_sas_token)
    STORE_KEY("azure-endpoint", azure_endpoint)
#undef STORE_KEY
    return ty_err_field(err, TY_EINVAL, key, "unknown setting '%s' (see trainyard serve --help)",
                        key);
}

bool srv_config_is_secret(const char *key)
{
    static const char *const secrets[] = {"s3-secret-access-key", "s3-session-token",
                                          "gcs-hmac-secret", "azure-connection-string",
                                          "azure-key", "azure-sas-token"};
    for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
        if (!strcmp(key, secrets[i])) return true;
    return false;
}

static const char *or_null(const char *s) { return s[0] ? s : NULL; }

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
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
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

void srv_config_usage(FILE *out)
{
    fputs("usage: trainyard serve [flags]\n"
          "\n"
          "Runs the job server. Every flag can also be set in the file given with\n"
          "--config as a `key = value` line (the flag name without dashes, e.g.\n"
          "`grace = 10`); flags on the command line override the file.\n"
          "\n"
          "  --config FILE         read settings from FILE first\n"
          "  --listen HOST:PORT    address to listen on (default 127.0.0.1:8080); a\n"
          "                        non-loopback address requires API tokens\n"
          "  --data-dir DIR        database, job directories and logs\n"
          "                        (default ./trainyard-data)\n"
          "  --engine PATH         the engine binary (default: trainyard-engine beside\n"
          "                        this binary)\n"
          "  --gpus auto|none|LIST GPUs to schedule: auto asks NVML, none runs CPU jobs\n"
          "                        only, LIST is like 0,1 (default auto)\n"
          "  --cpu-slots N         CPU-only jobs that may run at once (default 1)\n"
          "  --executor NAME       where engines run: local (default)\n"
          "  --allowed-roots A:B   directories job specs may read from, checked at\n"
          "                        submit and again by the engine on every open\n"
          "                        (default DATA_DIR/inputs)\n"
          "  --store-roots A:B     directories file:// checkpoint stores may lie in\n"
          "                        (default DATA_DIR/stores)\n"
          "  --max-params N        largest model.init (parameters) accepted at submit;\n"
          "                        0 = no limit (default 1000000000)\n"
          "  --max-body BYTES      largest request body accepted (default 1048576)\n"
          "  --grace SECONDS       SIGTERM to SIGKILL delay for cancel/pause (default 30)\n"
          "  --tls-cert FILE       PEM certificate; with --tls-key serves HTTPS\n"
          "  --tls-key FILE        PEM private key\n"
          "  --require-token       require a bearer token even on loopback\n"
          "  --per-ip-connections N  connections one client address may hold, request\n"
          "                        heads still arriving included; 0 = no limit\n"
          "                        (default 256)\n"
          "  --max-connections N   connections served at once, all clients together;\n"
          "                        more are 503 (default 10000)\n"
          "  --header-timeout SECONDS  the whole request head must arrive within this\n"
          "                        from connect, else 408 (default 10)\n"
          "  --request-timeout SECONDS  the whole body must arrive within this from\n"
          "                        the head, else the connection is closed; 0 = off\n"
          "                        (default 60)\n"
          "  --rate-limit N        requests per second one API token may make on\n"
          "                        average, else 429 with Retry-After; 0 = off\n"
          "                        (default 20)\n"
          "  --rate-burst N        requests one token may make at once (default 100)\n"
          "  --event-rate N        engine event lines per second (a 2-second burst\n"
          "                        allowed) above which a job fails as flooding;\n"
          "                        0 = off (default 1000)\n"
          "  --gpu-sample-ms MS    GPU sampling period (default 2000)\n"
          "  --heartbeat SECONDS   SSE heartbeat comment period (default 15)\n"
          "  --http-threads N      HTTP worker threads, each with its own epoll\n"
          "                        (default 2)\n"
          "  --upload-workers N    checkpoint upload threads (default 2)\n"
          "  --upload-wait SECONDS pause/cancel/finish wait this long for a running\n"
          "                        checkpoint upload, then cancel it (default 300)\n"
          "  --upload-attempts N   tries of one upload before it fails for good (default 5)\n"
          "  --gpu-hour-price X    price of one GPU-hour of running time; with it jobs\n"
          "                        report their cost (default: unknown, cost is null)\n"
          "  --cpu-hour-price X    price of one hour of a CPU job's running time\n"
          "                        (default: unknown)\n"
          "  --currency CODE       ISO 4217 code of those prices (default USD)\n"
          "\n"
          "Object stores (config file; secrets only there, else the environment):\n"
          "  s3-access-key-id s3-secret-access-key s3-session-token s3-region s3-endpoint\n"
          "  gcs-hmac-access-id gcs-hmac-secret gcs-credentials-file gcs-xml-endpoint\n"
          "  gcs-json-endpoint azure-connection-string azure-account azure-key\n"
          "  azure-sas-token azure-endpoint\n"
          "  --help                this text\n",
          out);
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
            if (i + 1 >= argc) return ty_err_field(err, TY_EINVAL, "config", "--config needs a file");
            if (srv_config_load_file(c, argv[i + 1], err)) return TY_EINVAL;
        } else if (!strncmp(argv[i], "--config=", 9)) {
            if (srv_config_load_file(c, argv[i] + 9, err)) return TY_EINVAL;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2))
            return ty_err_set(err, TY_EINVAL, "unexpected argument '%s'", a);
        char key[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (kl >= sizeof key) return ty_err_set(err, TY_EINVAL, "unknown flag '%s'", a);
        memcpy(key, a + 2, kl);
        key[kl] = 0;
        if (!strcmp(key, "require-token") && !eq) {
            c->require_token = true;
            continue;
        }
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return ty_err_set(err, TY_EINVAL, "flag --%s needs a value", key);
        if (!strcmp(key, "config")) continue;
        if (srv_config_is_secret(key))
            return ty_err_field(err, TY_EINVAL, key,
                                "--%s is a secret: set it in the --config file or the environment, "
                                "not on the command line", key);
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
            if (c->data_dir[0] == '/') snprintf(dd, sizeof dd, "%s", c->data_dir);
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
            return ty_err_field(err, TY_EINVAL, "listen", "listen must be HOST:PORT, got '%s'", listen);
        h = listen + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(listen, ':');
        if (!colon) return ty_err_field(err, TY_EINVAL, "listen", "listen must be HOST:PORT, got '%s'", listen);
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
