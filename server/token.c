/* token.c — `trainyard token create NAME`: makes an API token, prints it
 * once and stores only its SHA-256 (with its scopes) in the database. It
 * opens the database directly, so it works while the server is down. */
#include "server.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tyutil.h"

int srv_token_main(int argc, char **argv)
{
    const char *data_dir = "./trainyard-data", *name = NULL, *scope = "read,submit,admin";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data-dir") && i + 1 < argc)
            data_dir = argv[++i];
        else if (!strncmp(argv[i], "--data-dir=", 11))
            data_dir = argv[i] + 11;
        else if (!strcmp(argv[i], "--scope") && i + 1 < argc)
            scope = argv[++i];
        else if (!strncmp(argv[i], "--scope=", 8))
            scope = argv[i] + 8;
        else if (!strcmp(argv[i], "create") && !name && i + 1 < argc && argv[i + 1][0] != '-')
            name = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            name = NULL;
            break;
        } else {
            fprintf(stderr, "trainyard token: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!name) {
        fputs("usage: trainyard token create NAME [--scope read,submit,admin] [--data-dir DIR]\n"
              "Prints a new API token once; the server keeps only its SHA-256.\n"
              "Scopes: read (GET routes), submit (POST /jobs, cancel, pause, resume,\n"
              "generate), admin (DELETE /jobs/{id}); default all three.\n",
              stderr);
        return 2;
    }
    unsigned mask;
    char scopes[64];
    if (srv_scopes_parse(scope, &mask)) {
        fprintf(stderr,
                "trainyard token: --scope must be a comma-separated list of read, submit "
                "and admin, got '%s'\n",
                scope);
        return 2;
    }
    srv_scopes_format(mask, scopes);
    ty_err err = {0};
    char path[PATH_MAX + 32], tok[68], hash[65];
    if (ty_mkdir_p(data_dir, &err)) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    chmod(data_dir, 0700); /* the owner's alone, as serve makes it (confine.c) */
    snprintf(path, sizeof path, "%s/trainyard.db", data_dir);
    db *d;
    if (db_open(path, &d, &err) || srv_token_generate(tok, &err)) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    srv_token_hash(tok, hash);
    int rc = db_token_add_scoped(d, name, hash, scopes, &err);
    db_close(d);
    if (rc) {
        fprintf(stderr, "trainyard token: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", tok);
    return 0;
}
