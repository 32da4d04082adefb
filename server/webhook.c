/* webhook.c — signed JSON POSTs of job state changes, budget stops,
 * stalls and idle GPUs.
 *
 * Durable by construction: the events are already committed in
 * job_events; one thread of its own (never the scheduler) fans each one
 * out into the webhook_outbox table (one row per URL, and the cursor moved,
 * in one transaction), and a second delivers due rows, so a receiver that
 * hangs delays deliveries, never the outbox (nor any job). A failed delivery is
 * due again after a backoff (1 s doubling, at most 5 min) until
 * --webhook-attempts; rows survive a restart, so a receiver that was down
 * gets every event once it is back (at least once: a crash between the
 * POST and its bookkeeping sends it again; X-Trainyard-Delivery dedupes).
 *
 * Signature (docs/api.md "Webhooks"): X-Trainyard-Signature:
 * sha256=HEX(HMAC-SHA256(webhook-secret, "<X-Trainyard-Timestamp>.<body>")). */
#include "ops.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db_ops.h"
#include "state.h"
#include "tyutil.h"
#include "tyjson.h"

#define BATCH 64
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS 300000

typedef struct worker {
    struct webhooks *wh;
    bool fan_out; /* else: deliver */
    pthread_t thread;
} worker;

struct webhooks {
    srv *s;
    worker w[2];
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    atomic_bool quit; /* read by transfers in flight: shutdown aborts them */
};

int ops_check_urls(const char *key, const char *v, ty_err *err)
{
    for (const char *p = v; *p;) {
        const char *e = strchrnul(p, ',');
        size_t n = (size_t)(e - p);
        if (!((n > 7 && !strncmp(p, "http://", 7)) || (n > 8 && !strncmp(p, "https://", 8))))
            return ty_err_field(err, TY_EINVAL, key, "%s: '%.*s' is not an http:// or https:// URL",
                                key, (int)n, p);
        p = *e ? e + 1 : e;
    }
    return 0;
}

void webhook_sign(const char *secret, long long ts, const char *body, char out[65])
{
    char *msg = NULL;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    out[0] = 0;
    if (asprintf(&msg, "%lld.%s", ts, body) < 0) return;
    HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)msg, strlen(msg), mac,
         &len);
    free(msg);
    for (unsigned i = 0; i < len && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* The URLs an event of this job goes to: the server's, then the job's own
 * (already checked against webhook-allowed-hosts at submit). */
static int urls_for(srv *s, const jobspec *spec, const char **urls, char (*buf)[1025], int cap)
{
    int n = 0;
    for (const char *p = s->cfg.ops.webhook_urls; *p && n < cap;) {
        const char *e = strchrnul(p, ',');
        size_t len = (size_t)(e - p);
        if (len > 0 && len <= 1024) {
            memcpy(buf[n], p, len);
            buf[n][len] = 0;
            urls[n] = buf[n];
            n++;
        }
        p = *e ? e + 1 : e;
    }
    for (int i = 0; spec && i < spec->n_webhooks && n < cap; i++)
        urls[n++] = spec->webhooks[i];
    return n;
}

/* New events into the outbox; false when there was nothing new. */
static bool fan_out(srv *s, db *d)
{
    int64_t cursor;
    db_event *evs;
    int n;
    ty_err err = {0};
    if (db_webhook_cursor(d, &cursor, &err) || db_webhook_events(d, cursor, BATCH, &evs, &n, &err))
        return false;
    bool failed = false;
    for (int i = 0; i < n; i++) {
        db_job j;
        bool have = db_job_get(d, evs[i].job_id, &j, &err) == 0;
        jobspec parsed, *spec = NULL; /* its URLs are the spec's strings */
        ty_err serr = {0};
        if (have && srv_job_spec(&j, &parsed, &serr) == 0) spec = &parsed;
        const char *urls[20];
        char buf[16][1025];
        int nu = urls_for(s, spec, urls, buf, 16);
        char ts[32];
        srv_time_fmt(evs[i].ts_ms, ts);
        json_t *data = evs[i].data ? json_loads(evs[i].data, 0, NULL) : NULL;
        json_t *job = have ? json_pack("{sI so ss so so}", "id", (json_int_t)j.id, "name",
                                       j.name ? json_string(j.name) : json_null(), "state",
                                       db_state_name(j.state), "tags",
                                       json_loads(j.tags ? j.tags : "[]", 0, NULL), "stop_reason",
                                       j.stop_reason ? json_string(j.stop_reason) : json_null())
                           : json_null();
        json_t *body = json_pack("{sI ss sI sI ss so so}", "event_id", (json_int_t)evs[i].id,
                                 "type", evs[i].type, "job_id", (json_int_t)evs[i].job_id, "seq",
                                 (json_int_t)evs[i].seq, "ts", ts, "data",
                                 data ? data : json_object(), "job", job ? job : json_null());
        char *text = body ? ty_json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        char *bodies[20];
        for (int k = 0; k < nu; k++)
            bodies[k] = text;
        int rc = text ? db_webhook_fanout(d, evs[i].id, urls, bodies, nu, &err) : TY_ENOMEM;
        free(text);
        if (spec) jobspec_free(spec);
        if (have) db_job_free(&j);
        if (rc) {
            /* Logged once per event (a full disk fails every retry), and
             * retried after the usual wait rather than at once. */
            static int64_t last_logged;
            if (evs[i].id != last_logged)
                fprintf(stderr, "trainyard: webhooks: cannot queue event %lld: %s; retrying\n",
                        (long long)evs[i].id, err.msg);
            last_logged = evs[i].id;
            failed = true;
            break;
        }
    }
    db_events_free(evs, n);
    return n > 0 && !failed;
}

static size_t discard(char *p, size_t size, size_t n, void *u)
{
    (void)p;
    (void)u;
    return size * n;
}

static int abort_on_quit(void *u, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return atomic_load(&((webhooks *)u)->quit) ? 1 : 0;
}

/* One POST; 0 on a 2xx answer, else the reason in why. */
static int post(webhooks *wh, const db_webhook *w, char *why, size_t cap)
{
    srv *s = wh->s;
    CURL *c = curl_easy_init();
    if (!c) return snprintf(why, cap, "cannot start a transfer"), -1;
    long long ts = (long long)time(NULL);
    char h_ts[64], h_sig[128], h_id[64], sig[65];
    snprintf(h_ts, sizeof h_ts, "X-Trainyard-Timestamp: %lld", ts);
    snprintf(h_id, sizeof h_id, "X-Trainyard-Delivery: %lld", (long long)w->id);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, h_ts);
    h = curl_slist_append(h, h_id);
    if (s->cfg.ops.webhook_secret[0]) {
        webhook_sign(s->cfg.ops.webhook_secret, ts, w->body, sig);
        snprintf(h_sig, sizeof h_sig, "X-Trainyard-Signature: sha256=%s", sig);
        h = curl_slist_append(h, h_sig);
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, w->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, abort_on_quit);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, wh);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK)
        return snprintf(why, cap, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc)), -1;
    if (code < 200 || code > 299) return snprintf(why, cap, "HTTP %ld", code), -1;
    return 0;
}

static void deliver(webhooks *wh, db *d)
{
    srv *s = wh->s;
    db_webhook *due;
    int n;
    ty_err err = {0};
    if (db_webhook_due(d, ty_now_ms(), BATCH, &due, &n, &err)) return;
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&wh->mu);
        bool stop = wh->stop;
        pthread_mutex_unlock(&wh->mu);
        if (stop) break;
        char why[CURL_ERROR_SIZE + 64];
        if (post(wh, &due[i], why, sizeof why) == 0) {
            db_webhook_result(d, due[i].id, "delivered", 0, NULL, &err);
            continue;
        }
        int tries = due[i].attempts + 1;
        bool final = tries >= s->cfg.ops.webhook_attempts;
        int64_t backoff = BACKOFF_FIRST_MS << (tries - 1 < 20 ? tries - 1 : 20);
        if (backoff > BACKOFF_MAX_MS) backoff = BACKOFF_MAX_MS;
        fprintf(stderr, "trainyard: webhook %lld to %s: %s%s\n", (long long)due[i].id, due[i].url,
                why, final ? "; giving up" : "; will retry");
        db_webhook_result(d, due[i].id, final ? "failed" : "pending", ty_now_ms() + backoff, why,
                          &err);
    }
    db_webhooks_free(due, n);
}

static void *webhook_main(void *arg)
{
    worker *me = arg;
    webhooks *wh = me->wh;
    srv *s = wh->s;
    for (;;) {
        pthread_mutex_lock(&wh->mu);
        bool stop = wh->stop;
        pthread_mutex_unlock(&wh->mu);
        if (stop) break;
        db *d = srv_db(s);
        bool more = false;
        if (d && me->fan_out)
            more = fan_out(s, d);
        else if (d)
            deliver(wh, d);
        pthread_mutex_lock(&wh->mu);
        if (!wh->stop && !more) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&wh->cond, &wh->mu, &ts);
        }
        pthread_mutex_unlock(&wh->mu);
    }
    srv_db_release(s);
    return NULL;
}

webhooks *webhooks_start(srv *s, ty_err *err)
{
    webhooks *wh = calloc(1, sizeof *wh);
    if (!wh) {
        ty_err_set(err, TY_ENOMEM, "out of memory");
        return NULL;
    }
    wh->s = s;
    /* The cursor exists before the API answers: at the very first start no
     * submit may slip in before it and be taken for history. */
    db *d = srv_db(s);
    int64_t cursor;
    if (!d || db_webhook_cursor(d, &cursor, err)) {
        free(wh);
        return NULL;
    }
    pthread_mutex_init(&wh->mu, NULL);
    pthread_cond_init(&wh->cond, NULL);
    for (int i = 0; i < 2; i++) {
        wh->w[i] = (worker){.wh = wh, .fan_out = i == 0};
        if (pthread_create(&wh->w[i].thread, NULL, webhook_main, &wh->w[i])) {
            if (i)
                webhooks_stop(wh);
            else
                free(wh);
            ty_err_set(err, TY_EINTERNAL, "cannot start the webhook threads");
            return NULL;
        }
    }
    return wh;
}

void webhooks_wake(webhooks *wh)
{
    if (!wh) return;
    pthread_mutex_lock(&wh->mu);
    pthread_cond_signal(&wh->cond);
    pthread_mutex_unlock(&wh->mu);
}

void webhooks_stop(webhooks *wh)
{
    if (!wh) return;
    pthread_mutex_lock(&wh->mu);
    wh->stop = true;
    atomic_store(&wh->quit, true);
    pthread_cond_broadcast(&wh->cond);
    pthread_mutex_unlock(&wh->mu);
    for (int i = 0; i < 2; i++)
        if (wh->w[i].thread) pthread_join(wh->w[i].thread, NULL);
    pthread_mutex_destroy(&wh->mu);
    pthread_cond_destroy(&wh->cond);
    free(wh);
}
