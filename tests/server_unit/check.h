/* check.h — a minimal assertion macro for the server unit tests: prints the
 * failing expression with file and line and exits non-zero. */
#ifndef TY_CHECK_H
#define TY_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

#endif
