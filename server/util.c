/* util.c — small pure pieces of the server that the unit tests exercise
 * directly: list cursors, timestamps, API tokens and the Prometheus text.
 *
 * Nothing here touches the daemon's state, so each is testable alone. */
#include "server.h"

#include <jansson.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tyutil.h"
#include "tyjson.h"

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* The cursor is opaque to clients so the paging key can change later; today
 * it is base64url("j<id>") without padding, naming the last job returned. */
void srv_cursor_encode(int64_t id, char out[32])
{
    char raw[24];
    int n = snprintf(raw, sizeof raw, "j%lld", (long long)id);
    size_t o = 0;
    for (int i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)raw[i] << 16;
        if (i + 1 < n) v |= (uint32_t)(unsigned char)raw[i + 1] << 8;
        if (i + 2 < n) v |= (unsigned char)raw[i + 2];
        out[o++] = b64url[(v >> 18) & 63];
        out[o++] = b64url[(v >> 12) & 63];
        if (i + 1 < n) out[o++] = b64url[(v >> 6) & 63];
        if (i + 2 < n) out[o++] = b64url[v & 63];
    }
    out[o] = 0;
}

int srv_cursor_decode(const char *s, int64_t *id)
{
    char raw[24];
    size_t n = strlen(s), o = 0;
    if (n == 0 || n > 28 || n % 4 == 1) return TY_EINVAL;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(b64url, s[i]);
        if (!p || !s[i]) return TY_EINVAL;
        acc = (acc << 6) | (uint32_t)(p - b64url);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= sizeof raw - 1) return TY_EINVAL;
            raw[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    raw[o] = 0;
    if (o < 2 || raw[0] != 'j') return TY_EINVAL;
    char *end;
    long long v = strtoll(raw + 1, &end, 10);
    if (*end || v <= 0 || raw[1] == '0' || raw[1] == '+' || raw[1] == '-') return TY_EINVAL;
    *id = v;
    return 0;
}

void srv_time_fmt(int64_t ms, char out[32])
{
    if (ms <= 0) {
        out[0] = 0;
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}

int srv_token_generate(char out[68], ty_err *err)
{
    unsigned char raw[32];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return ty_err_set(err, TY_EINTERNAL, "no randomness for a token");
    memcpy(out, "ty_", 3);
    ty_hex(raw, sizeof raw, out + 3);
    return 0;
}

void srv_token_hash(const char *token, char hex[65])
{
    ty_sha256_hex(token, strlen(token), hex);
}

/* Hashing first makes the comparison length-independent; every stored hash
 * is compared in full, so timing says nothing about which one matched. */
int srv_token_find(const char *token, const char (*hashes)[65], int n)
{
    char h[65];
    srv_token_hash(token, h);
    int found = -1;
    for (int i = 0; i < n; i++) {
        /* Branch-free select: the loop does the same work whichever matches. */
        int eq = ty_memeq_ct(h, hashes[i], 64) != 0;
        found = eq * i + (1 - eq) * found;
    }
    return found;
}

bool srv_token_matches(const char *token, const char (*hashes)[65], int n)
{
    return srv_token_find(token, hashes, n) >= 0;
}

static const char *const scope_names[] = {"read", "submit", "admin"};

const char *srv_scope_name(unsigned one_scope)
{
    for (unsigned i = 0; i < 3; i++)
        if (one_scope == 1u << i) return scope_names[i];
    return "unknown";
}

int srv_scopes_parse(const char *s, unsigned *mask)
{
    *mask = 0;
    if (!s || !*s) return TY_EINVAL;
    for (const char *p = s;;) {
        size_t n = strcspn(p, ",");
        unsigned bit = 0;
        for (unsigned i = 0; i < 3; i++)
            if (n == strlen(scope_names[i]) && !strncmp(p, scope_names[i], n)) bit = 1u << i;
        if (!bit) return TY_EINVAL;
        *mask |= bit;
        if (!p[n]) return 0;
        p += n + 1;
    }
}

void srv_scopes_format(unsigned mask, char out[64])
{
    size_t o = 0;
    out[0] = 0;
    for (unsigned i = 0; i < 3; i++)
        if (mask & (1u << i))
            o += (size_t)snprintf(out + o, 64 - o, "%s%s", o ? "," : "", scope_names[i]);
    if (!o) snprintf(out, 64, "none");
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if none. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80) return 1;
    size_t len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (p[0] >= 0xf5 || len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    /* Overlong, surrogate and beyond-U+10FFFF forms. */
    if (len == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0;
    if (len == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) return 0;
    return len;
}

void srv_utf8_sanitize(const char *in, char *out, size_t cap)
{
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o + 1 < cap;) {
        size_t k = utf8_seq((const unsigned char *)in + i, n - i);
        if (k == 0 || o + k >= cap) {
            if (k) break; /* a whole character that no longer fits */
            out[o++] = '?';
            i++;
            continue;
        }
        memcpy(out + o, in + i, k);
        o += k;
        i += k;
    }
    out[o] = 0;
}

/* The JSON error of docs/api.md; malloc'd text. The gate writes it on the
 * raw socket and http_error through libmicrohttpd, so both say the same.
 * Messages quote client input (paths, parameter names), which need not be
 * UTF-8: JSON strings must be, so invalid bytes become '?'. */
char *srv_error_json(const char *code, const char *field, const char *msg)
{
    char m[1024], f[256];
    srv_utf8_sanitize(msg && *msg ? msg : code, m, sizeof m);
    json_t *e = json_pack("{ss ss}", "code", code, "message", m);
    if (!e) return NULL;
    if (field && *field) {
        srv_utf8_sanitize(field, f, sizeof f);
        json_object_set_new(e, "field", json_string(f));
    }
    json_t *o = json_pack("{so}", "error", e);
    char *txt = o ? ty_json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return txt;
}

/* ---- Prometheus ------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *g = realloc(b->p, cap);
        if (!g) {
            b->oom = true;
            return;
        }
        b->p = g;
        b->cap = cap;
    }
}

/* Label values are escaped per the exposition format: \\, \" and \n. */
static void sb_label(sbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            sb_printf(b, "\\%c", *v);
        else if (*v == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *v);
    }
}

char *srv_prom_render(const srv_prom *p)
{
    sbuf b = {.p = malloc(1024), .cap = 1024};
    if (!b.p) return NULL;
    b.p[0] = 0;
    sb_printf(&b, "# HELP trainyard_jobs Jobs by state.\n# TYPE trainyard_jobs gauge\n");
    for (int s = 0; s < JOB_NSTATES; s++)
        sb_printf(&b, "trainyard_jobs{state=\"%s\"} %lld\n", db_state_name((job_state)s),
                  (long long)p->jobs[s]);
    sb_printf(&b,
              "# HELP trainyard_queue_length Jobs waiting to be scheduled.\n"
              "# TYPE trainyard_queue_length gauge\ntrainyard_queue_length %lld\n",
              (long long)p->queue_length);
    sb_printf(&b,
              "# HELP trainyard_events_ingested_total Engine events committed to the "
              "database.\n# TYPE trainyard_events_ingested_total counter\n"
              "trainyard_events_ingested_total %lld\n",
              (long long)p->events_ingested);
    sb_printf(&b,
              "# HELP trainyard_sse_clients Connected event-stream clients.\n"
              "# TYPE trainyard_sse_clients gauge\ntrainyard_sse_clients %lld\n",
              (long long)p->sse_clients);
    sb_printf(&b,
              "# HELP trainyard_http_requests_total HTTP requests answered.\n"
              "# TYPE trainyard_http_requests_total counter\n"
              "trainyard_http_requests_total %lld\n",
              (long long)p->http_requests);
    static const char *const gm[][3] = {
        {"trainyard_gpu_utilization_percent", "GPU utilisation over the last sample.", "util"},
        {"trainyard_gpu_memory_used_bytes", "GPU memory in use.", "used"},
        {"trainyard_gpu_memory_total_bytes", "GPU memory in total.", "total"},
        {"trainyard_gpu_temperature_celsius", "GPU temperature.", "temp"},
    };
    for (size_t m = 0; m < sizeof gm / sizeof gm[0]; m++) {
        sb_printf(&b, "# HELP %s %s\n# TYPE %s gauge\n", gm[m][0], gm[m][1], gm[m][0]);
        for (int i = 0; i < p->ngpus; i++) {
            const srv_gpu_sample *g = &p->gpus[i];
            long long v = m == 0 ? g->util : m == 1 ? g->mem_used : m == 2 ? g->mem_total : g->temp;
            sb_printf(&b, "%s{gpu=\"%d\",name=\"", gm[m][0], g->index);
            sb_label(&b, g->name);
            sb_printf(&b, "\"} %lld\n", v);
        }
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
