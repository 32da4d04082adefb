/* check.h — a tiny assertion harness for the engine's C unit tests.
 *
 * CHECK records a failure with file and line and keeps going, so one run
 * reports every broken expectation; main returns check_failures != 0. */
#ifndef TY_TEST_CHECK_H
#define TY_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures = 0;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                  \
            check_failures++;                                                                                          \
        }                                                                                                              \
    } while (0)

/* The call failed and its message contains every given fragment. */
#define CHECK_ERR(rc, err, fragment)                                                                                   \
    do {                                                                                                               \
        if ((rc) == 0 || !strstr((err).msg, (fragment))) {                                                             \
            fprintf(stderr, "%s:%d: expected an error containing \"%s\", got rc=%d \"%s\"\n", __FILE__, __LINE__,       \
                    (fragment), (rc), (err).msg);                                                                       \
            check_failures++;                                                                                          \
        }                                                                                                              \
    } while (0)

#endif
