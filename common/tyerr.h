/* tyerr.h — the error convention shared by every module.
 *
 * Functions return 0 on success or a negative TY_E* code, and fill a
 * ty_err the caller can show to a user. Library code never prints or exits.
 * `field` names the offending input where there is one (a spec path like
 * "hyperparameters.lr", a tensor name, a file and line), else stays empty. */
#ifndef TY_TYERR_H
#define TY_TYERR_H

#include <stddef.h>

enum {
    TY_OK = 0,
    TY_EINVAL = -1, /* bad input: spec, file contents, arguments */
    TY_ENOENT = -2, /* missing file, job, object */
    TY_EIO = -3,    /* read/write/network failure */
    TY_ENOMEM = -4,
    TY_ESTATE = -5,   /* illegal state transition / conflict */
    TY_ECORRUPT = -6, /* checksum or format corruption */
    TY_EAUTH = -7,
    TY_ETOOBIG = -8,
    TY_EINTERNAL = -9,
    TY_ENOSPC = -10, /* no space left on a disk (a state that passes) */
    TY_ESPEC = -11,  /* a valid job spec this program cannot run as written (the engine's exit 2) */
};

typedef struct ty_err {
    int code;
    char field[128];
    char msg[512];
} ty_err;

/* Sets code and a printf-style message; returns code so callers can
 * `return ty_err_set(err, TY_EINVAL, "...")`. err may be NULL. */
int ty_err_set(ty_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Same, also naming the offending field. */
int ty_err_field(ty_err *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ty_err_clear(ty_err *err);
/* A short stable word for a code: "invalid", "not_found", "io", ... */
const char *ty_err_name(int code);

#endif
