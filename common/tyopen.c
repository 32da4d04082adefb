/* tyopen.c — root lists and safe opening of input files (see tyopen.h).
 *
 * Order matters in ty_open_input: stat first so a FIFO or device is never
 * opened at all (opening some devices has effects); open with O_NONBLOCK
 * so one swapped in after the stat cannot block us; fstat the descriptor
 * for the kind we really got; then read back where the descriptor points
 * and check that against the roots. Only then is O_NONBLOCK cleared. */
#include "tyopen.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *g_roots; /* set once at start-up, read-only afterwards */

/* Is path equal to root[0..rlen) or below it? */
static bool under(const char *path, const char *root, size_t rlen)
{
    while (rlen > 1 && root[rlen - 1] == '/')
        rlen--; /* "/data/" == "/data" */
    if (rlen == 1 && root[0] == '/') return true;
    return strncmp(path, root, rlen) == 0 && (path[rlen] == '\0' || path[rlen] == '/');
}

bool ty_path_under_roots(const char *path, const char *roots)
{
    if (!path || path[0] != '/' || !roots) return false;
    for (const char *r = roots; *r;) {
        const char *e = strchrnul(r, ':');
        size_t n = (size_t)(e - r);
        if (n > 0 && r[0] == '/' && n < PATH_MAX) {
            if (under(path, r, n)) return true;
            char root[PATH_MAX], real[PATH_MAX];
            memcpy(root, r, n);
            root[n] = '\0';
            if (realpath(root, real) && under(path, real, strlen(real))) return true;
        }
        r = *e ? e + 1 : e;
    }
    return false;
}

bool ty_path_within_roots(const char *path, const char *roots)
{
    if (!ty_path_under_roots(path, roots)) return false;
    char buf[PATH_MAX], real[PATH_MAX], full[PATH_MAX * 2];
    if (strlen(path) >= sizeof buf) return false;
    snprintf(buf, sizeof buf, "%s", path);
    /* Strip components from the end until what is left exists. */
    size_t cut = strlen(buf);
    for (;;) {
        char save = buf[cut];
        buf[cut] = '\0';
        bool ok = realpath(cut ? buf : "/", real) != NULL;
        buf[cut] = save;
        if (ok) break;
        if (errno != ENOENT && errno != ENOTDIR) return false;
        char *slash = NULL;
        for (size_t i = cut; i-- > 0;)
            if (buf[i] == '/') {
                slash = buf + i;
                break;
            }
        if (!slash) return false;
        cut = (size_t)(slash - buf);
    }
    snprintf(full, sizeof full, "%s%s", strcmp(real, "/") ? real : "", buf + cut);
    return ty_path_under_roots(full[0] ? full : "/", roots);
}

int ty_open_set_roots(const char *roots, ty_err *err)
{
    free(g_roots);
    g_roots = NULL;
    if (!roots || !*roots) return 0;
    if (!(g_roots = strdup(roots))) return ty_err_set(err, TY_ENOMEM, "out of memory");
    return 0;
}

const char *ty_open_roots(void)
{
    return g_roots;
}

static const char *kind(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int ty_open_input(const char *path, ty_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return ty_err_set(err, errno == ENOENT ? TY_ENOENT : TY_EIO, "%s: %s", path,
                          strerror(errno)),
               -1;
    if (!S_ISREG(st.st_mode))
        return ty_err_set(err, TY_EINVAL, "%s is %s; only regular files can be read", path,
                          kind(st.st_mode)),
               -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return ty_err_set(err, errno == ENOENT ? TY_ENOENT : TY_EIO, "%s: %s", path,
                          strerror(errno)),
               -1;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = ty_err_set(err, TY_EIO, "stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = ty_err_set(err, TY_EINVAL, "%s is %s; only regular files can be read", path,
                        kind(st.st_mode));
    if (rc == 0 && g_roots) {
        char link[64], real[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, real, sizeof real - 1);
        if (n <= 0 || n >= (ssize_t)sizeof real - 1)
            rc = ty_err_set(err, TY_EAUTH,
                            "%s: cannot tell where the file lies (%s), so it is not read", path,
                            n < 0 ? strerror(errno) : "path too long");
        else {
            real[n] = '\0';
            if (!ty_path_under_roots(real, g_roots))
                rc = ty_err_set(err, TY_EAUTH, "%s resolves to %s, outside the allowed roots", path,
                                real);
        }
    }
    if (rc == 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
            rc = ty_err_set(err, TY_EIO, "fcntl %s: %s", path, strerror(errno));
    }
    if (rc) {
        close(fd);
        return -1;
    }
    return fd;
}

FILE *ty_fopen_input(const char *path, ty_err *err)
{
    int fd = ty_open_input(path, err);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        ty_err_set(err, TY_ENOMEM, "fdopen %s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}
