/* test_cli_fmt.c — cli.format: what `trainyard watch` and `trainyard jobs`
 * print, pinned by snapshots.
 *
 * The inputs are fixed API JSON in snapshots/ (a Job and its event stream
 * for watch, a GET /jobs page for jobs); the rendered text must equal
 * snapshots/watch.txt and snapshots/jobs.txt byte for byte. After a
 * deliberate change of format, run with TY_UPDATE_SNAPSHOTS=1 to rewrite
 * them, and review the diff. The helpers' edge cases are checked directly.
 *
 * usage: test_cli_fmt SNAPSHOT_DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_fmt.h"

#include "tyassert.h"

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&s, &n);
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, r, m);
    fclose(f);
    fclose(m);
    return s;
}

static json_t *load_json(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) {
        fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
        exit(1);
    }
    return j;
}

/* Compares got with the snapshot file, or rewrites it when asked to. */
static void snapshot(const char *dir, const char *name, const char *got)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const char *upd = getenv("TY_UPDATE_SNAPSHOTS");
    if (upd && *upd == '1') {
        FILE *f = fopen(path, "wb");
        if (!f || fputs(got, f) < 0 || fclose(f)) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        fprintf(stderr, "rewrote %s\n", path);
        return;
    }
    char *want = read_all(path);
    if (!want || strcmp(want, got) != 0) {
        TY_FAIL("%s differs from the snapshot.\n--- want\n%s--- got\n%s---", name,
                want ? want : "(missing)\n", got);
    }
    free(want);
}

static void check_helpers(void)
{
    char b[32];
    clifmt_duration(b, sizeof b, 0);
    CHECK(strcmp(b, "0s") == 0);
    clifmt_duration(b, sizeof b, 59.4);
    CHECK(strcmp(b, "59s") == 0);
    clifmt_duration(b, sizeof b, 192);
    CHECK(strcmp(b, "3m12s") == 0);
    clifmt_duration(b, sizeof b, 3720);
    CHECK(strcmp(b, "1h02m") == 0);
    clifmt_duration(b, sizeof b, 2 * 86400 + 3 * 3600 + 59);
    CHECK(strcmp(b, "2d03h") == 0);
    clifmt_duration(b, sizeof b, -1);
    CHECK(strcmp(b, "-") == 0);
    clifmt_duration(b, sizeof b, NAN);
    CHECK(strcmp(b, "-") == 0);

    clifmt_count(b, sizeof b, 999);
    CHECK(strcmp(b, "999") == 0);
    clifmt_count(b, sizeof b, 112384);
    CHECK(strcmp(b, "112k") == 0);
    clifmt_count(b, sizeof b, 11234567);
    CHECK(strcmp(b, "11.2M") == 0);
    clifmt_count(b, sizeof b, 1100048384);
    CHECK(strcmp(b, "1.10B") == 0);

    CHECK(clifmt_parse_ts("1970-01-01T00:00:10.500Z") == 10.5);
    CHECK(clifmt_parse_ts("2026-12-02T10:00:00Z") == 1796205600.0);
    CHECK(clifmt_parse_ts("2026-12-02T10:00:00+01:00") < 0);
    CHECK(clifmt_parse_ts("yesterday") < 0);
    CHECK(clifmt_parse_ts(NULL) < 0);
    /* Metrics: the dashboard's rule (web/util.js fmtMetric), never 0.0000. */
    static const struct {
        double v;
        const char *want;
    } metrics[] = {{0, "0"},
                   {2.11723, "2.117"},
                   {0.1, "0.1000"},
                   {0.001733, "0.001733"},
                   {0.00099996, "1.000e-3"},
                   {7.59e-4, "7.590e-4"},
                   {1e-9, "1.000e-9"},
                   {3.5e-12, "3.500e-12"},
                   {0.99996, "1.000"},
                   {999.94, "999.9"},
                   {999.96, "1000"},
                   {12345.6, "12346"},
                   {-0.5, "-0.5000"},
                   {NAN, "-"}};
    for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; i++) {
        clifmt_metric(b, sizeof b, metrics[i].v);
        if (strcmp(b, metrics[i].want) != 0)
            TY_FAIL("clifmt_metric(%g) = \"%s\", want \"%s\"", metrics[i].v, b, metrics[i].want);
    }
}

/* watch: every event of the stream through one view, as cmd_watch does. */
static void check_watch(const char *dir)
{
    json_t *job = load_json(dir, "watch-job.json");
    char path[1024];
    snprintf(path, sizeof path, "%s/watch-events.jsonl", dir);
    char *events = read_all(path);
    CHECK(events != NULL);
    if (!events) return;
    char *out = NULL;
    size_t outlen = 0;
    FILE *m = open_memstream(&out, &outlen);
    clifmt_watch w;
    clifmt_watch_init(&w, job);
    CHECK(w.job_id == 7 && w.max_steps == 3000);
    for (char *line = strtok(events, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *ev = json_loads(line, 0, &e);
        CHECK(ev != NULL);
        if (!ev) continue;
        clifmt_watch_event(&w, m, json_string_value(json_object_get(ev, "type")),
                           json_object_get(ev, "data"),
                           json_string_value(json_object_get(ev, "ts")));
        json_decref(ev);
    }
    fclose(m);
    snapshot(dir, "watch.txt", out);
    /* The rules the snapshot shows, spelt out so a careless rewrite of it
     * cannot drop them: one lr format, a sentence for the first state, losses
     * in four significant digits. */
    CHECK(strstr(out, "lr 1.500e-04") && strstr(out, "lr 2.720e-05"));
    CHECK(strstr(out, "Job 7 was submitted and is queued.\n") == out);
    CHECK(strstr(out, "resumed from step 201"));
    CHECK(strstr(out, "step  101/3000   3.4%"));
    CHECK(strstr(out, "eval loss 1.200"));
    /* A tiny loss reads as a number, not as 0.0000. */
    CHECK(strstr(out, "loss 7.590e-4") && !strstr(out, "0.0000"));
    CHECK(strstr(out, "Job 7 is paused: resumes from step 201.\n")); /* not "paused: paused; ..." */
    free(out);
    free(events);
    json_decref(job);
}

static void check_jobs(const char *dir)
{
    json_t *page = load_json(dir, "jobs-page.json");
    char *out = NULL;
    size_t outlen = 0;
    FILE *m = open_memstream(&out, &outlen);
    clifmt_jobs_header(m);
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(page, "jobs"), i, j) clifmt_jobs_row(m, j);
    fclose(m);
    snapshot(dir, "jobs.txt", out);
    /* Losses in four significant digits, tiny ones in scientific notation. */
    CHECK(strstr(out, "0.001733 ") && strstr(out, "7.590e-4 ") && !strstr(out, "0.0000"));
    free(out);
    json_decref(page);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SNAPSHOT_DIR\n", argv[0]);
        return 2;
    }
    check_helpers();
    check_watch(argv[1]);
    check_jobs(argv[1]);
    return ty_summary("cli.format");
}
