/* events.c — JSON-lines events on fd 3 (or stdout, or TY_EVENTS_PATH) and
 * logs on stderr.
 *
 * The fd is chosen once: fcntl(3, F_GETFD) tells whether the parent opened
 * fd 3 for us. A failed write (reader gone) is ignored; the server treats a
 * vanished engine through its exit status, not through this pipe. */
#include "events.h"
#include "tyjson.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ev_fd = 1;
static int ev_rank = 0;
static int ev_fixed = 0; /* ev_set_output chose the fd; ev_init keeps it */

void ev_init(int rank)
{
    ev_rank = rank;
    if (!ev_fixed) ev_fd = fcntl(3, F_GETFD) != -1 ? 3 : 1;
}

int ev_set_output(const char *path, int world)
{
    if (ev_rank == 0 && path && *path) {
        /* A FIFO the server reads (open blocks until it does, and it
         * opened its end before starting us) or a file a follower tails. */
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return -1;
        ev_fd = fd;
        ev_fixed = 1;
    } else if (world > 1) {
        /* Under mpirun our fd 3 is the launcher's own pipe, never ours. */
        ev_fd = 1;
        ev_fixed = 1;
    }
    return 0;
}

static void ev_write_all(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(ev_fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

void ev_emit(json_t *obj)
{
    if (ev_rank == 0 && obj) {
        /* Doubles print with 17 significant digits (jansson's default), so
         * two runs whose losses are bit-identical print identical lines. */
        char *s = ty_json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) {
            size_t n = strlen(s);
            s[n] = '\n';
            ev_write_all(s, n + 1);
            free(s);
        }
    }
    json_decref(obj);
}

void ev_error(const char *message)
{
    ev_emit(json_pack("{s:s, s:s}", "ev", "error", "message", message));
}

void ev_done(const char *status)
{
    ev_emit(json_pack("{s:s, s:s}", "ev", "done", "status", status));
}

void ev_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "trainyard-engine[%d]: %s\n", ev_rank, line);
}
