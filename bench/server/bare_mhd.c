/* bare_mhd.c — the peer for the server benchmark: a bare libmicrohttpd
 * server that answers every request "200 OK", built the way `trainyard
 * serve` builds its daemon (epoll internal thread, same thread-pool size).
 *
 * GET /jobs/{id} req/s of trainyard divided by this server's req/s is the
 * share of raw HTTP throughput trainyard keeps after routing, SQLite and
 * JSON. Usage: ty-bench-bare-mhd PORT [THREADS]; runs until SIGTERM/SIGINT. */
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **ctx)
{
    (void)cls, (void)url, (void)method, (void)version, (void)upload, (void)upload_size, (void)ctx;
    static const char body[] = "OK\n";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ty-bench-bare-mhd PORT [THREADS]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    unsigned threads = argc > 2 ? (unsigned)atoi(argv[2]) : 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD, (uint16_t)port, NULL, NULL, on_request, NULL,
        MHD_OPTION_CONNECTION_LIMIT, 10000u, MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "ty-bench-bare-mhd: cannot listen on port %d\n", port);
        return 1;
    }
    while (!g_stop)
        pause();
    MHD_stop_daemon(d);
    return 0;
}
