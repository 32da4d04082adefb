/* typath.h — paths as people read them in messages and defaults.
 *
 * `--data-dir ./trainyard-data` started in /srv/x used to show up in
 * errors as /srv/x/./trainyard-data. These helpers make a path absolute and
 * lexically clean: no "." components, no doubled or trailing slashes. ".."
 * is kept: where it leads through a symlink only the kernel knows, and a
 * path that means something else than the user wrote is worse than an
 * untidy one. */
#ifndef TY_TYPATH_H
#define TY_TYPATH_H

#include <stddef.h>

/* Cleans path in place ("/a//./b/" -> "/a/b", "./x" -> "x", "." stays "."). */
void ty_path_clean(char *path);

/* out = path made absolute against the working directory, then cleaned.
 * out may be path itself. Returns 0, or -1 when the working directory is
 * unknown or the result does not fit in cap (out is then left as path). */
int ty_path_absolute(const char *path, char *out, size_t cap);

#endif
