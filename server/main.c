/* main.c — the `trainyard` binary: the server (`serve`, `token`, `routes`)
 * and, for every other subcommand, the command-line client.
 *
 * One binary keeps deployment to a single file: the daemon, its admin
 * commands and the client that talks to it. */
#include <stdio.h>
#include <string.h>

#include "routes.h"
#include "serve.h"
#include "server.h"

#ifdef TY_HAVE_CLI
#include "cli.h"
#endif
#ifdef TY_HAVE_DEMO
#include "demo.h"
#endif

static void usage(FILE *out)
{
    fputs("usage: trainyard COMMAND [args]\n"
          "\n"
          "Server commands:\n"
          "  serve [flags]          run the job server (trainyard serve --help)\n"
          "  token create NAME      print a new API token (--scope S,.. --data-dir DIR)\n"
          "  routes                 list the HTTP routes the server answers\n",
          out);
#ifdef TY_HAVE_DEMO
    fputs("  demo [--steps N]       submit a small demo job and print the dashboard URL\n", out);
#endif
#ifdef TY_HAVE_CLI
    fputc('\n', out);
    cli_usage(out);
#endif
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;
    if (!cmd || !strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(cmd ? stdout : stderr);
        return cmd ? 0 : 2;
    }
    if (!strcmp(cmd, "serve")) return srv_serve_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "token")) return srv_token_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "routes")) {
        for (int i = 0; i < routes_count; i++)
            printf("%s %s\n", routes_table[i].method, routes_table[i].pattern);
        return 0;
    }
#ifdef TY_HAVE_DEMO
    if (!strcmp(cmd, "demo")) return demo_main(argc - 1, argv + 1);
#endif
#ifdef TY_HAVE_CLI
    return cli_main(argc, argv);
#else
    fprintf(stderr, "trainyard: unknown command '%s' (CLI not built)\n", cmd);
    return 2;
#endif
}
