/* typath.c — lexical path clean-up for messages and defaults (typath.h).
 *
 * Pure string work, no filesystem access: the point is what a person reads
 * and what a default root is written as, not where a path resolves (that is
 * realpath's job where it matters, e.g. the allowed-roots check). */
#include "typath.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void ty_path_clean(char *path)
{
    if (!path || !*path) return;
    int absolute = path[0] == '/';
    char *w = path; /* write position */
    const char *r = path;
    if (absolute) {
        *w++ = '/';
        while (*r == '/')
            r++;
    }
    while (*r) {
        const char *end = strchrnul(r, '/');
        size_t n = (size_t)(end - r);
        if (n == 1 && r[0] == '.') {
            /* "." adds nothing */
        } else if (n > 0) {
            if (w > path && w[-1] != '/') *w++ = '/';
            memmove(w, r, n);
            w += n;
        }
        r = end;
        while (*r == '/')
            r++;
    }
    if (w == path) *w++ = '.'; /* "./" or "." alone */
    *w = '\0';
}

int ty_path_absolute(const char *path, char *out, size_t cap)
{
    char buf[PATH_MAX * 2];
    if (path[0] == '/') {
        if (strlen(path) >= sizeof buf) return -1;
        snprintf(buf, sizeof buf, "%s", path);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return -1;
        if ((size_t)snprintf(buf, sizeof buf, "%s/%s", cwd, path) >= sizeof buf) return -1;
    }
    ty_path_clean(buf);
    if (strlen(buf) >= cap) return -1;
    memmove(out, buf, strlen(buf) + 1);
    return 0;
}
