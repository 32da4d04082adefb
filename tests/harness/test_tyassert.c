/* test_tyassert.c — the harness checks itself: `pass` counts passing checks
 * and exits 0; `fail` must exit 1 (ctest WILL_FAIL) after reporting each
 * failed CHECK, TY_FAIL and CHECK_ERR with its file and line, and stops at
 * the failed REQUIRE (the line after it would make the summary say so). */
#include <string.h>

#include "tyassert.h"

typedef struct {
    char msg[64];
} fake_err;

int main(int argc, char **argv)
{
    int pass = argc > 1 && !strcmp(argv[1], "pass");
    fake_err e = {"database: disk I/O error"};
    if (pass) {
        CHECK(1 + 1 == 2);
        CHECK(strlen("abc") == 3, "strlen %zu", strlen("abc"));
        CHECK_ERR(-5, e, "disk I/O");
        REQUIRE(ty_checks == 4 && ty_failures == 0, "%d checks, %d failures", ty_checks,
                ty_failures);
        return ty_summary("harness pass");
    }
    CHECK(1 + 1 == 3);
    CHECK(0, "with a message %d", 42);
    TY_FAIL("diagnosed by the test: %s", "x");
    CHECK_ERR(0, e, "disk I/O");
    CHECK_ERR(-5, e, "not in the message");
    REQUIRE(ty_failures == 0, "ends the test here");
    fprintf(stderr, "REQUIRE did not stop the test\n");
    return 0;
}
