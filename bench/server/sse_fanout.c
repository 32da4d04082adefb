/* sse_fanout.c — load client for the SSE fan-out benchmark: N concurrent
 * Server-Sent-Events connections on one job, driven by one epoll loop.
 *
 * Each connection de-chunks its stream, splits SSE lines, counts events and,
 * for every event whose data carries "ts_us" (the fake engine stamps its
 * metric events with CLOCK_REALTIME microseconds), records the delivery lag
 * now - ts_us. Per stamped event it also keeps the first and the last
 * arrival over all clients, which splits the lag into the server's pipeline
 * (engine -> database -> publish -> first client) and the fan-out spread
 * (first client -> last client). Prints READY once every client has its
 * first event (so the driver can start the job), then one JSON line of
 * results when every stream has ended or the timeout passes, including this
 * process's own CPU time (it shares the machine with the server).
 * Usage: ty-bench-sse-fanout PORT PATH CLIENTS TIMEOUT_S */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { ST_HEADERS, ST_SIZE, ST_DATA, ST_DATA_END, ST_DONE };

typedef struct client {
    int fd;
    int state;
    long chunk_left;
    char hdr[4096];
    size_t hdr_len;
    char line[65536];
    size_t line_len;
    char size_line[32];
    size_t size_len;
    long events;
    long cur_id;  /* the "id:" of the event being read */
    int ended;    /* stream closed by the server */
    int terminal; /* saw the terminal state event */
} client;

static double *g_lags;
static size_t g_nlags, g_caplags;
static long g_first_events; /* clients that have their first event */

/* Per stamped event, indexed by its id: stamp, first and last arrival. */
typedef struct arrival {
    double ts_us, first_us, last_us;
} arrival;
static arrival *g_arr;
static size_t g_narr;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void add_lag(double ms)
{
    if (g_nlags == g_caplags) {
        g_caplags = g_caplags ? g_caplags * 2 : 65536;
        g_lags = realloc(g_lags, g_caplags * sizeof *g_lags);
        if (!g_lags) exit(1);
    }
    g_lags[g_nlags++] = ms;
}

static void note_arrival(long id, double ts_us, double now)
{
    if (id < 0 || id > 10000000) return;
    if ((size_t)id >= g_narr) {
        size_t n = g_narr ? g_narr : 4096;
        while (n <= (size_t)id)
            n *= 2;
        g_arr = realloc(g_arr, n * sizeof *g_arr);
        if (!g_arr) exit(1);
        memset(g_arr + g_narr, 0, (n - g_narr) * sizeof *g_arr);
        g_narr = n;
    }
    arrival *a = &g_arr[id];
    if (a->ts_us == 0 || now < a->first_us) a->first_us = now;
    if (now > a->last_us) a->last_us = now;
    a->ts_us = ts_us;
}

static void on_line(client *c, char *line, size_t n)
{
    if (n == 0) {
        c->events++;
        if (c->events == 1) g_first_events++;
        c->cur_id = -1;
        return;
    }
    line[n] = '\0';
    if (strncmp(line, "id:", 3) == 0) {
        c->cur_id = strtol(line + 3, NULL, 10);
        return;
    }
    if (strncmp(line, "data:", 5) != 0) return;
    const char *p = strstr(line, "\"ts_us\":");
    if (p) {
        double now = now_us(), ts = strtod(p + 8, NULL);
        add_lag((now - ts) / 1000.0);
        note_arrival(c->cur_id, ts, now);
    }
    if (strstr(line, "\"type\":\"state\"") &&
        (strstr(line, "\"to\":\"succeeded\"") || strstr(line, "\"to\":\"failed\"") ||
         strstr(line, "\"to\":\"cancelled\"")))
        c->terminal = 1;
}

static void feed_sse(client *c, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            size_t l = c->line_len;
            if (l && c->line[l - 1] == '\r') l--;
            on_line(c, c->line, l);
            c->line_len = 0;
        } else if (c->line_len < sizeof c->line - 1) {
            c->line[c->line_len++] = p[i];
        }
    }
}

/* HTTP/1.1 chunked transfer decoding, byte by byte across reads. */
static void feed(client *c, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        switch (c->state) {
        case ST_HEADERS:
            if (c->hdr_len < sizeof c->hdr) c->hdr[c->hdr_len++] = p[i];
            i++;
            if (c->hdr_len >= 4 && memcmp(c->hdr + c->hdr_len - 4, "\r\n\r\n", 4) == 0) {
                if (strncmp(c->hdr, "HTTP/1.1 200", 12) != 0) {
                    fprintf(stderr, "sse-fanout: bad answer: %.*s\n", (int)c->hdr_len, c->hdr);
                    exit(1);
                }
                c->state = ST_SIZE;
            }
            break;
        case ST_SIZE:
            if (p[i] == '\n') {
                c->size_line[c->size_len] = '\0';
                c->chunk_left = strtol(c->size_line, NULL, 16);
                c->size_len = 0;
                c->state = c->chunk_left ? ST_DATA : ST_DONE;
            } else if (c->size_len < sizeof c->size_line - 1) {
                c->size_line[c->size_len++] = p[i];
            }
            i++;
            break;
        case ST_DATA: {
            size_t take = n - i < (size_t)c->chunk_left ? n - i : (size_t)c->chunk_left;
            feed_sse(c, p + i, take);
            i += take;
            c->chunk_left -= (long)take;
            if (c->chunk_left == 0) c->state = ST_DATA_END;
            break;
        }
        case ST_DATA_END:
            if (p[i] == '\n') c->state = ST_SIZE;
            i++;
            break;
        default:
            i = n;
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* p50, p99 and max of xs (sorted in place); -1 each when there is none
 * (qsort is never handed a NULL array). */
static void percentiles(double *xs, size_t n, double *p50, double *p99, double *mx)
{
    if (n == 0) {
        *p50 = *p99 = *mx = -1;
        return;
    }
    qsort(xs, n, sizeof *xs, cmp_double);
    *p50 = xs[n / 2];
    *p99 = xs[(size_t)((double)n * 0.99)];
    *mx = xs[n - 1];
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: ty-bench-sse-fanout PORT PATH CLIENTS TIMEOUT_S\n");
        return 2;
    }
    int port = atoi(argv[1]), n = atoi(argv[3]), timeout_s = atoi(argv[4]);
    const char *path = argv[2];
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);

    client *cs = calloc((size_t)n, sizeof *cs);
    int ep = epoll_create1(0);
    char req[1024];
    int rl_len = snprintf(
        req, sizeof req,
        "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n", path, port);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            fprintf(stderr, "sse-fanout: connect %d: %s\n", i, strerror(errno));
            return 1;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (write(fd, req, (size_t)rl_len) != rl_len) return 1;
        fcntl(fd, F_SETFL, O_NONBLOCK);
        cs[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    int ready_printed = 0, open = n;
    time_t deadline = time(NULL) + timeout_s;
    struct epoll_event evs[256];
    char buf[65536];
    while (open > 0 && time(NULL) < deadline) {
        int k = epoll_wait(ep, evs, 256, 200);
        for (int e = 0; e < k; e++) {
            client *c = evs[e].data.ptr;
            /* Level-triggered: one read per readiness. A short read drained
             * the socket, and anything left is reported again; reading on
             * to EAGAIN would double this client's syscalls (it shares the
             * CPUs with the server it measures). */
            for (;;) {
                ssize_t r = read(c->fd, buf, sizeof buf);
                if (r > 0) {
                    feed(c, buf, (size_t)r);
                    if ((size_t)r < sizeof buf) break;
                    continue;
                }
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
                c->ended = 1;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                open--;
                break;
            }
        }
        if (!ready_printed && g_first_events == n) {
            printf("READY\n");
            fflush(stdout);
            ready_printed = 1;
        }
    }
    long emin = -1, emax = 0, terminal = 0;
    for (int i = 0; i < n; i++) {
        if (emin < 0 || cs[i].events < emin) emin = cs[i].events;
        if (cs[i].events > emax) emax = cs[i].events;
        terminal += cs[i].terminal;
        if (cs[i].fd >= 0) close(cs[i].fd);
    }
    double p50, p99, mx;
    percentiles(g_lags, g_nlags, &p50, &p99, &mx);
    /* Per event: pipeline = first arrival - stamp, spread = last - first. */
    double *pipe = calloc(g_narr + 1, sizeof *pipe), *spread = calloc(g_narr + 1, sizeof *spread);
    size_t ne = 0;
    for (size_t i = 0; i < g_narr; i++) {
        if (g_arr[i].ts_us == 0) continue;
        pipe[ne] = (g_arr[i].first_us - g_arr[i].ts_us) / 1000.0;
        spread[ne++] = (g_arr[i].last_us - g_arr[i].first_us) / 1000.0;
    }
    double pp50, pp99, ppmx, sp50, sp99, spmx;
    percentiles(pipe, ne, &pp50, &pp99, &ppmx);
    percentiles(spread, ne, &sp50, &sp99, &spmx);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                   (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    printf(
        "{\"clients\": %d, \"ended_with_terminal\": %ld, \"events_min\": %ld, \"events_max\": %ld, "
        "\"lag_samples\": %zu, \"lag_ms_p50\": %.2f, \"lag_ms_p99\": %.2f, \"lag_ms_max\": %.2f, "
        "\"stamped_events\": %zu, \"pipeline_ms_p50\": %.2f, \"pipeline_ms_p99\": %.2f, "
        "\"spread_ms_p50\": %.2f, \"spread_ms_p99\": %.2f, \"spread_ms_max\": %.2f, "
        "\"client_cpu_s\": %.2f}\n",
        n, terminal, emin, emax, g_nlags, p50, p99, mx, ne, pp50, pp99, sp50, sp99, spmx, cpu_s);
    (void)ppmx;
    free(pipe);
    free(spread);
    free(g_arr);
    free(g_lags);
    free(cs);
    close(ep);
    return 0;
}
