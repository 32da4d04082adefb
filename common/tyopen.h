/* tyopen.h — allowed roots, and opening input files so they stay inside them.
 *
 * A root list is colon-separated absolute directories ("/data:/models").
 * The server checks spec paths against it at submit; the engine checks
 * again when it opens each file, because what a path names can change
 * between the two (a symlink swapped in while the job was queued).
 *
 * ty_open_input is the one way the engine opens a file it reads: regular
 * files only (a FIFO would block forever, a device never ends), and, when
 * a root list is set for the process, the file actually opened — the
 * target of /proc/self/fd/N, not the name asked for — must lie under a
 * root. Checking the open descriptor leaves no window between the check
 * and the read. */
#ifndef TY_TYOPEN_H
#define TY_TYOPEN_H

#include <stdbool.h>
#include <stdio.h>
#include "tyerr.h"

/* Is the absolute path equal to a root or below one? Compared as given
 * and against each root's resolved form (a root may itself be a symlink,
 * /tmp -> /private/tmp). No ".." handling: pass resolved paths. */
bool ty_path_under_roots(const char *path, const char *roots);

/* ty_path_under_roots for the path as given and for where it leads: the
 * longest existing prefix resolved (symlinks followed) plus the rest. A
 * path that does not exist yet (a store directory to be created) is thus
 * judged by the directory it would be created in. */
bool ty_path_within_roots(const char *path, const char *roots);

/* Sets the process-wide root list ty_open_input enforces (copied; NULL
 * or "" = no restriction). Call before starting threads. */
int ty_open_set_roots(const char *roots, ty_err *err);
/* The list set above, or NULL. */
const char *ty_open_roots(void);

/* Opens path read-only (O_CLOEXEC) if it is a regular file inside the
 * roots; returns the descriptor, or -1 with err set: TY_ENOENT (missing),
 * TY_EINVAL (not a regular file: names the kind), TY_EAUTH (outside the
 * roots), TY_EIO. Messages name the path, never its contents. */
int ty_open_input(const char *path, ty_err *err);
/* The same as a stdio stream ("r"). */
FILE *ty_fopen_input(const char *path, ty_err *err);

#endif
