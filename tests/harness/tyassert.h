/* tyassert.h — the one assertion harness of trainyard's C tests.
 *
 * CHECK records a failure with file, line and the expression (plus an
 * optional printf-style message) and keeps going, so one run reports every
 * broken expectation; REQUIRE does the same and then ends the test, for
 * when what follows cannot run (a NULL handle). TY_FAIL records a failure
 * the test has already diagnosed. main ends with `return ty_summary(name);`,
 * which prints the counts and gives the exit status (0 or 1).
 *
 * Header-only and static, like llm.c's test helpers: each test is one
 * translation unit and needs no library. tests/CMakeLists.txt puts this
 * folder on every test's include path. */
#ifndef TY_ASSERT_H
#define TY_ASSERT_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ty_checks __attribute__((unused));
static int ty_failures __attribute__((unused));

/* fmt starts with one space put there by the macros (so that a CHECK with
 * no message still passes a non-empty format); the space is not printed. */
__attribute__((format(printf, 4, 5))) static inline void
ty_failed(const char *file, int line, const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: ", file, line);
    if (expr) fprintf(stderr, "check failed: %s%s", expr, fmt[1] ? ": " : "");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt + 1, ap);
    va_end(ap);
    fputc('\n', stderr);
    ty_failures++;
}

/* Prints "<name>: N checks, M failed" and returns the exit status. */
static inline int ty_summary(const char *name)
{
    fprintf(stderr, "%s: %d checks, %d failed\n", name, ty_checks, ty_failures);
    return ty_failures ? 1 : 0;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        ty_checks++;                                                                               \
        if (!(cond)) ty_failed(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                        \
    } while (0)

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        ty_checks++;                                                                               \
        if (!(cond)) {                                                                             \
            ty_failed(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                                 \
            exit(ty_summary(__FILE__));                                                            \
        }                                                                                          \
    } while (0)

#define TY_FAIL(...) (ty_checks++, ty_failed(__FILE__, __LINE__, NULL, " " __VA_ARGS__))

/* The call failed (rc != 0) and the ty_err's message contains fragment. */
#define CHECK_ERR(rc, err, fragment)                                                               \
    do {                                                                                           \
        ty_checks++;                                                                               \
        if ((rc) == 0 || !strstr((err).msg, (fragment)))                                           \
            ty_failed(__FILE__, __LINE__, NULL,                                                    \
                      " expected an error containing \"%s\", got rc=%d \"%s\"", (fragment),        \
                      (int)(rc), (err).msg);                                                       \
    } while (0)

#endif
