/* test_paths.c — cli.paths: paths in messages and defaults read as a person
 * would write them. ty_path_clean / ty_path_absolute on their own, then
 * `trainyard serve --data-dir ./trainyard-data` (and untidier spellings)
 * parsed in a fresh working directory: the data dir and every default root
 * built from it are absolute and hold no "/./" or "//" — the message that
 * used to say /tmp/x/./trainyard-data. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "typath.h"
#include "tyutil.h"

#include "tyassert.h"

static void clean_is(const char *in, const char *want)
{
    char b[256];
    snprintf(b, sizeof b, "%s", in);
    ty_path_clean(b);
    if (strcmp(b, want) != 0) {
        TY_FAIL("ty_path_clean(\"%s\") = \"%s\", want \"%s\"", in, b, want);
    }
}

static int untidy(const char *s)
{
    return strstr(s, "/./") || strstr(s, "//") || strstr(s, "/.:") ||
           (strlen(s) > 2 && !strcmp(s + strlen(s) - 2, "/."));
}

int main(void)
{
    clean_is("/tmp/x/./trainyard-data", "/tmp/x/trainyard-data");
    clean_is("./trainyard-data", "trainyard-data");
    clean_is("a//b/./c/", "a/b/c");
    clean_is("/", "/");
    clean_is("//", "/");
    clean_is("/./.", "/");
    clean_is(".", ".");
    clean_is("./", ".");
    clean_is("a/../b", "a/../b"); /* ".." is the kernel's to resolve */
    clean_is("/.hidden/./x", "/.hidden/x");

    char dir[] = "/tmp/ty-paths-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char real[PATH_MAX];
    CHECK(realpath(dir, real) != NULL);
    CHECK(chdir(dir) == 0);

    char out[PATH_MAX + 64], want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s/trainyard-data", real);
    CHECK(ty_path_absolute("./trainyard-data", out, sizeof out) == 0 && !strcmp(out, want));
    CHECK(ty_path_absolute("/abs//p/./", out, sizeof out) == 0 && !strcmp(out, "/abs/p"));
    char small[8];
    CHECK(ty_path_absolute("./a-longer-name", small, sizeof small) == -1);

    /* The server's configuration, as `make run` and the README start it,
     * before the data dir exists (the case that printed "/./"). */
    const char *spellings[] = {"./trainyard-data", "trainyard-data/", ".//trainyard-data/.", NULL};
    for (const char **sp = spellings; *sp; sp++) {
        srv_config c;
        ty_err err = {0};
        CHECK(srv_config_defaults(&c, &err) == 0);
        char *argv[] = {"serve", "--data-dir", (char *)*sp, "--gpus", "none", NULL};
        CHECK(srv_config_parse(&c, 5, argv, stdout, &err) == 0);
        if (strcmp(c.data_dir, want) != 0) {
            TY_FAIL("--data-dir %s gives data_dir %s, want %s", *sp, c.data_dir, want);
        }
        if (untidy(c.allowed_roots) || !strstr(c.allowed_roots, want)) {
            TY_FAIL("--data-dir %s gives allowed roots %s", *sp, c.allowed_roots);
        }
    }
    CHECK(chdir("/") == 0);
    ty_err err = {0};
    ty_rm_rf(dir, &err);
    return ty_summary("cli.paths");
}
