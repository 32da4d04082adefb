/* cli.h — the trainyard command-line client: submit, jobs, show, watch,
 * logs, cancel, pause, resume, delete over the REST API (libcurl).
 *
 * The server binary's main() hands every subcommand that is not its own
 * (serve, token, routes, demo) to cli_main(). The server is found through
 * TY_URL (default http://127.0.0.1:8080) and authenticated with TY_TOKEN.
 * Exit codes are stable so scripts can branch on them (docs/cli.md). */
#ifndef TY_CLI_H
#define TY_CLI_H

#include <stdio.h>

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAILED = 1,    /* the job failed, or the server answered 5xx / nonsense */
    CLI_EXIT_USAGE = 2,     /* bad command line, unreadable file */
    CLI_EXIT_NOT_FOUND = 3, /* 404: no such job */
    CLI_EXIT_CONFLICT = 4,  /* 409: the job's state forbids it, idempotency conflict */
    CLI_EXIT_CONNECT = 5,   /* cannot reach the server */
    CLI_EXIT_REJECTED = 6,  /* 400/413/415/429: the server refused the input */
    CLI_EXIT_AUTH = 7,      /* 401: token missing or wrong */
    CLI_EXIT_CANCELLED = 8, /* watch: the job ended cancelled */
};

/* argv[0] is the program name, argv[1] the subcommand. Returns an exit code. */
int cli_main(int argc, char **argv);
/* Is name one of the client's subcommands? */
int cli_is_command(const char *name);
/* The client's part of `trainyard --help`. */
void cli_usage(FILE *out);

/* For subcommands kept in their own files (cli_ops.c: queue, patch, usage). */
struct cli_ctx;
struct json_t;
/* One request whose 2xx answer is JSON (*out); else the error printed and
 * its exit code returned. */
int cli_call_json(const struct cli_ctx *c, const char *method, const char *path, const char *body,
                  struct json_t **out);
/* One GET whose 2xx answer is text (*out, malloc'd). */
int cli_call_text(const struct cli_ctx *c, const char *path, char **out);
/* Did the user ask for --json? */
int cli_wants_json(const struct cli_ctx *c);
void cli_print_json(struct json_t *j);
/* queue, patch, usage, or -1 when cmd is none of them (cli_ops.c). */
int cli_ops_main(const struct cli_ctx *c, const char *cmd, int argc, char **argv);
void cli_ops_usage(FILE *out);

#endif
