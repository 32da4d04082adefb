/* cli_ops.c — the client's operations commands: `queue` (why
 * each job waits and when it may start), `patch` (priority, name, tags of
 * a waiting job) and `usage` (GPU-seconds, cost, tokens; --csv). The REST
 * calls go through cli.c's plumbing (cli.h), so exit codes and error
 * messages are the same as every other command's. */
#include "cli.h"
#include "tyjson.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage_error(const char *msg)
{
    fprintf(stderr, "trainyard: %s\n", msg);
    return CLI_EXIT_USAGE;
}

/* An estimated start as people say it: "now", "in ~12 min", "in ~3 h 5 min",
 * "in ~2 days"; "unknown" without an estimate (the reason column says why). */
static void fmt_start(char *out, size_t cap, json_t *secs)
{
    if (!json_is_number(secs)) {
        snprintf(out, cap, "unknown");
        return;
    }
    double s = json_number_value(secs);
    long m = (long)(s / 60.0 + 0.5);
    if (s < 30)
        snprintf(out, cap, "now");
    else if (m < 60)
        snprintf(out, cap, "in ~%ld min", m < 1 ? 1 : m);
    else if (m < 48 * 60)
        snprintf(out, cap, m % 60 ? "in ~%ld h %ld min" : "in ~%ld h", m / 60, m % 60);
    else
        snprintf(out, cap, "in ~%ld days", (m + 720) / 1440);
}

static int cmd_queue(const struct cli_ctx *c, int argc)
{
    if (argc) return usage_error("usage: trainyard queue [--json]");
    json_t *q;
    int rc = cli_call_json(c, "GET", "/queue", NULL, &q);
    if (rc) return rc;
    if (cli_wants_json(c)) {
        cli_print_json(q);
        json_decref(q);
        return CLI_EXIT_OK;
    }
    printf("%-4s %-6s %-20s %5s %4s %-16s %s\n", "POS", "ID", "NAME", "PRIO", "GPUS", "EST. START",
           "REASON");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(q, "queue"), i, e)
    {
        json_t *pos = json_object_get(e, "position");
        char p[16] = "-";
        if (json_is_integer(pos)) snprintf(p, sizeof p, "%lld", (long long)json_integer_value(pos));
        char est[32];
        fmt_start(est, sizeof est, json_object_get(e, "estimated_start_s"));
        if (!strcmp(json_string_value(json_object_get(e, "state")) ?: "", "paused"))
            snprintf(est, sizeof est, "-");
        const char *name = json_string_value(json_object_get(e, "name"));
        printf("%-4s %-6lld %-20.20s %5lld %4lld %-16s %s\n", p,
               (long long)json_integer_value(json_object_get(e, "id")), name ? name : "-",
               (long long)json_integer_value(json_object_get(e, "priority")),
               (long long)json_integer_value(json_object_get(e, "gpus")), est,
               json_string_value(json_object_get(e, "reason")));
    }
    printf("%lld of %lld GPUs and %lld of %lld CPU slots free\n",
           (long long)json_integer_value(json_object_get(q, "gpus_free")),
           (long long)json_integer_value(json_object_get(q, "gpus_total")),
           (long long)json_integer_value(json_object_get(q, "cpu_slots_free")),
           (long long)json_integer_value(json_object_get(q, "cpu_slots")));
    json_decref(q);
    return CLI_EXIT_OK;
}

static int cmd_patch(const struct cli_ctx *c, int argc, char **argv)
{
    const char *use = "usage: trainyard patch ID [--priority N] [--name NAME] [--tags a,b]";
    if (argc < 1) return usage_error(use);
    char *end;
    errno = 0;
    long long id = strtoll(argv[0], &end, 10);
    if (errno || *end || id <= 0) return usage_error(use);
    json_t *body = json_object();
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            json_decref(body);
            return usage_error(use);
        }
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--priority")) {
            long p = strtol(v, &end, 10);
            if (*end || end == v) {
                json_decref(body);
                return usage_error("patch: --priority takes an integer");
            }
            json_object_set_new(body, "priority", json_integer(p));
        } else if (!strcmp(argv[i - 1], "--name")) {
            json_object_set_new(body, "name", json_string(v));
        } else if (!strcmp(argv[i - 1], "--tags")) {
            json_t *tags = json_array();
            for (const char *p = v; *p;) {
                size_t n = strcspn(p, ",");
                if (n) json_array_append_new(tags, json_stringn(p, n));
                p += n;
                if (*p) p++;
            }
            json_object_set_new(body, "tags", tags);
        } else {
            json_decref(body);
            return usage_error(use);
        }
    }
    if (json_object_size(body) == 0) {
        json_decref(body);
        return usage_error(use);
    }
    char *text = ty_json_dumps(body, JSON_COMPACT), path[64];
    json_decref(body);
    snprintf(path, sizeof path, "/jobs/%lld", id);
    json_t *job;
    int rc = cli_call_json(c, "PATCH", path, text, &job);
    free(text);
    if (rc) return rc;
    if (cli_wants_json(c)) {
        cli_print_json(job);
    } else {
        char *tags = ty_json_dumps(json_object_get(job, "tags"), JSON_COMPACT);
        const char *name = json_string_value(json_object_get(job, "name"));
        printf("job %lld: priority %lld, name %s, tags %s\n", id,
               (long long)json_integer_value(json_object_get(job, "priority")), name ? name : "-",
               tags ? tags : "[]");
        free(tags);
    }
    json_decref(job);
    return CLI_EXIT_OK;
}

static int cmd_usage(const struct cli_ctx *c, int argc, char **argv)
{
    const char *use =
        "usage: trainyard usage [--from T] [--to T] [--group-by token|tag|day] [--csv]";
    char query[512] = "";
    bool csv = false;
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(query);
        const char *key = !strcmp(argv[i], "--from")       ? "from"
                          : !strcmp(argv[i], "--to")       ? "to"
                          : !strcmp(argv[i], "--group-by") ? "group_by"
                                                           : NULL;
        if (!strcmp(argv[i], "--csv")) {
            csv = true;
        } else if (key && i + 1 < argc) {
            char *esc = curl_easy_escape(NULL, argv[++i], 0);
            snprintf(query + l, sizeof query - l, "%c%s=%s", l ? '&' : '?', key, esc ? esc : "");
            curl_free(esc);
        } else {
            return usage_error(use);
        }
    }
    char path[600];
    if (csv) {
        snprintf(path, sizeof path, "/usage%s%cformat=csv", query, query[0] ? '&' : '?');
        char *text;
        int rc = cli_call_text(c, path, &text);
        if (rc) return rc;
        fputs(text, stdout);
        free(text);
        return CLI_EXIT_OK;
    }
    snprintf(path, sizeof path, "/usage%s", query);
    json_t *u;
    int rc = cli_call_json(c, "GET", path, NULL, &u);
    if (rc) return rc;
    if (cli_wants_json(c)) {
        cli_print_json(u);
        json_decref(u);
        return CLI_EXIT_OK;
    }
    /* the cost column names the server's currency (--currency) */
    const char *cur = json_string_value(json_object_get(json_object_get(u, "total"), "currency"));
    char cost_head[32];
    snprintf(cost_head, sizeof cost_head, "COST (%s)", cur && *cur ? cur : "?");
    printf("%-24s %12s %12s %12s %12s %5s %5s %5s\n", "KEY", "GPU-SECONDS", "CPU-SECONDS",
           cost_head, "TOKENS", "OK", "FAIL", "CANC");
    size_t i;
    json_t *g;
    json_t *groups = json_object_get(u, "groups");
    json_array_foreach(groups, i, g)
    {
        const char *k = json_string_value(json_object_get(g, "key"));
        json_t *jobs = json_object_get(g, "jobs"), *cost = json_object_get(g, "cost");
        char cs[32] = "-";
        if (json_is_number(cost)) snprintf(cs, sizeof cs, "%.4f", json_number_value(cost));
        printf("%-24.24s %12.1f %12.1f %12s %12lld %5lld %5lld %5lld\n",
               k ? k : (json_is_null(json_object_get(u, "group_by")) ? "(all)" : "(none)"),
               json_number_value(json_object_get(g, "gpu_seconds")),
               json_number_value(json_object_get(g, "cpu_seconds")), cs,
               (long long)json_integer_value(json_object_get(g, "tokens")),
               (long long)json_integer_value(json_object_get(jobs, "succeeded")),
               (long long)json_integer_value(json_object_get(jobs, "failed")),
               (long long)json_integer_value(json_object_get(jobs, "cancelled")));
    }
    json_decref(u);
    return CLI_EXIT_OK;
}

int cli_ops_main(const struct cli_ctx *c, const char *cmd, int argc, char **argv)
{
    if (!strcmp(cmd, "queue")) return cmd_queue(c, argc);
    if (!strcmp(cmd, "patch")) return cmd_patch(c, argc, argv);
    if (!strcmp(cmd, "usage")) return cmd_usage(c, argc, argv);
    return -1;
}

void cli_ops_usage(FILE *out)
{
    fputs("  queue                                   queued and paused jobs: position, why\n"
          "                                          each waits, estimated start\n"
          "  patch ID [--priority N] [--name NAME] [--tags a,b]\n"
          "                                          change a queued or paused job\n"
          "  usage [--from T] [--to T] [--group-by token|tag|day] [--csv]\n"
          "                                          GPU-seconds, cost, tokens, jobs by state\n",
          out);
}
