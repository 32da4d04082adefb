/* tyerr.c — filling and naming ty_err values (see tyerr.h).
 *
 * Every setter also returns the code, so a failure is reported and passed up
 * in one statement (`return ty_err_set(err, TY_EIO, ...)`); a NULL err is
 * allowed for callers that only want the code. ty_err_name gives a short
 * stable word for each code, for tools that print an error. */
#include "tyerr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int err_vset(ty_err *err, int code, const char *field, const char *fmt, va_list ap)
{
    if (!err) return code;
    err->code = code;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

int ty_err_set(ty_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int ty_err_field(ty_err *err, int code, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(err, code, field, fmt, ap);
    va_end(ap);
    return code;
}

void ty_err_clear(ty_err *err)
{
    if (err) memset(err, 0, sizeof *err);
}

const char *ty_err_name(int code)
{
    switch (code) {
    case TY_OK:
        return "ok";
    case TY_EINVAL:
        return "invalid";
    case TY_ENOENT:
        return "not_found";
    case TY_EIO:
        return "io";
    case TY_ENOMEM:
        return "no_memory";
    case TY_ESTATE:
        return "conflict";
    case TY_ECORRUPT:
        return "corrupt";
    case TY_EAUTH:
        return "unauthorized";
    case TY_ETOOBIG:
        return "too_large";
    case TY_ENOSPC:
        return "no_space";
    case TY_ESPEC:
        return "invalid_spec";
    default:
        return "internal";
    }
}
