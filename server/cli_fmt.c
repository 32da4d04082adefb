/* cli_fmt.c — the client's rendering of jobs and events (see cli_fmt.h).
 *
 * Kept apart from cli.c, which does the HTTP, so that what a person reads
 * is a pure function of the API's JSON: tests/cli feeds fixed jobs and
 * events and compares the text with snapshots. The formats are chosen once
 * per column: printf's %g switches between 0.00015 and 2.72036e-05 as the
 * value crosses 1e-4, which makes a column of learning rates unreadable.
 * Losses follow the dashboard's rule for metrics (clifmt_metric). */
#include "cli_fmt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void clifmt_duration(char *out, size_t cap, double seconds)
{
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(out, cap, "-");
        return;
    }
    long long s = llround(seconds);
    if (s < 60)
        snprintf(out, cap, "%llds", s);
    else if (s < 3600)
        snprintf(out, cap, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(out, cap, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else
        snprintf(out, cap, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
}

void clifmt_count(char *out, size_t cap, long long n)
{
    static const struct {
        double div;
        const char *unit;
    } units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}};
    double a = fabs((double)n);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (a < units[i].div) continue;
        double v = (double)n / units[i].div;
        /* Three significant digits: 1.10B, 11.2M, 112k. */
        int dec = fabs(v) >= 100 ? 0 : fabs(v) >= 10 ? 1 : 2;
        snprintf(out, cap, "%.*f%s", dec, v, units[i].unit);
        return;
    }
    snprintf(out, cap, "%lld", n);
}

void clifmt_metric(char *out, size_t cap, double v)
{
    if (!isfinite(v)) {
        snprintf(out, cap, "-");
        return;
    }
    if (v == 0) {
        snprintf(out, cap, "0");
        return;
    }
    double a = fabs(v);
    if (a < 1e-3) {
        /* "7.590e-04" -> "7.590e-4": the exponent as the dashboard writes it. */
        char tmp[48];
        snprintf(tmp, sizeof tmp, "%.3e", v);
        char *e = strchr(tmp, 'e');
        if (e) {
            char sign = e[1];
            char *d = e + 2;
            while (*d == '0' && d[1])
                d++;
            snprintf(out, cap, "%.*se%s%s", (int)(e - tmp), tmp, sign == '-' ? "-" : "", d);
        } else {
            snprintf(out, cap, "%s", tmp);
        }
        return;
    }
    if (a >= 999.95) {
        snprintf(out, cap, "%.0f", v);
        return;
    }
    /* Four significant digits; a value that rounds up to the next power of
     * ten (0.99996 -> 1.000) keeps four, not five. */
    int dec = 3 - (int)floor(log10(a));
    if (dec < 0) dec = 0;
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%.*f", dec, a);
    if (dec > 0 && strtod(tmp, NULL) >= pow(10.0, 4 - dec)) dec--;
    snprintf(out, cap, "%.*f", dec, v);
}

double clifmt_parse_ts(const char *ts)
{
    if (!ts) return -1;
    struct tm tm = {0};
    const char *p = strptime(ts, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p) return -1;
    double frac = 0;
    if (*p == '.') {
        char *end;
        frac = strtod(p, &end);
        p = end;
    }
    if (strcmp(p, "Z") != 0) return -1;
    return (double)timegm(&tm) + frac;
}

static long long jint(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static const char *jstr(json_t *o, const char *k, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : dflt;
}

/* Prints line without the padding its last column left behind. */
static void put_trimmed(FILE *out, char *line)
{
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\n'))
        line[--len] = '\0';
    fprintf(out, "%s\n", line);
}

/* ---- jobs ---- */

#define JOBS_ROW "%-6s %-10s %-13s %6s  %-9s %-7s %s"

void clifmt_jobs_header(FILE *out)
{
    fprintf(out, JOBS_ROW "\n", "ID", "STATE", "STEP", "DONE", "LOSS", "ETA", "NAME");
}

void clifmt_jobs_row(FILE *out, json_t *j)
{
    json_t *prog = json_object_get(j, "progress");
    json_t *lm = json_object_get(j, "last_metric");
    char id[24], step[48] = "-", pct[16] = "-", loss[32] = "-", eta[24] = "-";
    snprintf(id, sizeof id, "%lld", jint(j, "id"));
    if (json_is_object(prog)) {
        long long s = jint(prog, "step"), max = jint(prog, "max_steps");
        snprintf(step, sizeof step, "%lld/%lld", s, max);
        if (max > 0) snprintf(pct, sizeof pct, "%.1f%%", 100.0 * (double)s / (double)max);
        /* The ETA is the server's: shown when it gives one (it does not for
         * a job that is not running). */
        json_t *e = json_object_get(prog, "eta_s");
        if (json_is_number(e)) clifmt_duration(eta, sizeof eta, json_number_value(e));
    }
    if (json_is_number(json_object_get(lm, "loss")))
        clifmt_metric(loss, sizeof loss, json_number_value(json_object_get(lm, "loss")));
    char line[512];
    snprintf(line, sizeof line, JOBS_ROW, id, jstr(j, "state", "?"), step, pct, loss, eta,
             jstr(j, "name", ""));
    put_trimmed(out, line);
}

/* ---- watch ---- */

void clifmt_watch_init(clifmt_watch *w, json_t *job)
{
    memset(w, 0, sizeof *w);
    w->job_id = jint(job, "id");
    w->max_steps = jint(json_object_get(job, "progress"), "max_steps");
    if (w->max_steps <= 0)
        w->max_steps =
            jint(json_object_get(json_object_get(job, "spec"), "hyperparameters"), "max_steps");
}

/* "Job 7 is running.", "Job 7 failed: engine exited with code 1." — a
 * state change as a sentence, with its reason when it has one. */
static void print_state(clifmt_watch *w, FILE *out, json_t *d)
{
    const char *to = jstr(d, "to", "?");
    const char *reason = jstr(d, "reason", "");
    int first = !json_is_string(json_object_get(d, "from"));
    /* "submitted" is what a first state change always says: the sentence
     * says it already. */
    if (first && strcmp(reason, "submitted") == 0) reason = "";
    /* "paused; resumes from step 18" under "Job 7 is paused" would say
     * paused twice: a reason that opens with the state drops that word. */
    size_t tl = strlen(to);
    if (strncmp(reason, to, tl) == 0 &&
        (reason[tl] == '\0' || reason[tl] == ';' || reason[tl] == ',')) {
        reason += tl;
        while (*reason == ';' || *reason == ',' || *reason == ' ')
            reason++;
    }
    fprintf(out, "Job %lld ", w->job_id);
    if (strcmp(to, "queued") == 0)
        fputs(first ? "was submitted and is queued" : "is queued again", out);
    else if (strcmp(to, "succeeded") == 0)
        fputs("succeeded", out);
    else if (strcmp(to, "failed") == 0)
        fputs("failed", out);
    else if (strcmp(to, "cancelled") == 0)
        fputs("was cancelled", out);
    else
        fprintf(out, "is %s", to);
    size_t rl = strlen(reason);
    if (rl) fprintf(out, ": %s", reason);
    fputs(rl && strchr(".!?", reason[rl - 1]) ? "\n" : ".\n", out);
}

static void print_metric(clifmt_watch *w, FILE *out, json_t *d, const char *ts)
{
    long long step = jint(d, "step");
    char head[96], lr[32] = "-", tps[32] = "-", eta[24] = "-";
    if (w->max_steps > 0) {
        int width = snprintf(NULL, 0, "%lld", w->max_steps);
        snprintf(head, sizeof head, "step %*lld/%lld %5.1f%%", width, step, w->max_steps,
                 100.0 * (double)step / (double)w->max_steps);
    } else {
        snprintf(head, sizeof head, "step %lld", step);
    }
    if (json_is_number(json_object_get(d, "lr")))
        snprintf(lr, sizeof lr, "%.3e", json_number_value(json_object_get(d, "lr")));
    if (json_is_number(json_object_get(d, "tokens_per_s")))
        snprintf(tps, sizeof tps, "%.1f", json_number_value(json_object_get(d, "tokens_per_s")));

    /* ETA from this run's pace: the time since its first metric over the
     * steps made since, times the steps left. A new run (started event)
     * measures afresh, so the time a job sat paused does not count. */
    double t = clifmt_parse_ts(ts);
    if (t >= 0) {
        if (!w->have_rate0 || step < w->rate0_step) {
            w->have_rate0 = 1;
            w->rate0_step = step;
            w->rate0_ts = t;
        } else if (w->max_steps > 0 && step >= w->max_steps) {
            snprintf(eta, sizeof eta, "0s");
        } else if (w->max_steps > 0 && step > w->rate0_step && t > w->rate0_ts) {
            double per_step = (t - w->rate0_ts) / (double)(step - w->rate0_step);
            clifmt_duration(eta, sizeof eta, per_step * (double)(w->max_steps - step));
        }
    }
    char line[320], loss[32], evl[32];
    clifmt_metric(loss, sizeof loss, json_number_value(json_object_get(d, "loss")));
    clifmt_metric(evl, sizeof evl, w->eval_loss);
    int n = snprintf(line, sizeof line, "%s  loss %-8s  lr %-9s  tokens/s %-8s  ETA %-6s", head,
                     loss, lr, tps, eta);
    if (w->have_eval && n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "  eval loss %s", evl);
    put_trimmed(out, line);
}

void clifmt_watch_event(clifmt_watch *w, FILE *out, const char *type, json_t *d, const char *ts)
{
    if (!type) return;
    if (strcmp(type, "metric") == 0) {
        print_metric(w, out, d, ts);
    } else if (strcmp(type, "state") == 0) {
        print_state(w, out, d);
    } else if (strcmp(type, "eval") == 0) {
        w->have_eval = 1;
        w->eval_loss = json_number_value(json_object_get(d, "loss"));
        char evl[32];
        clifmt_metric(evl, sizeof evl, w->eval_loss);
        fprintf(out, "eval at step %lld: loss %s\n", jint(d, "step"), evl);
    } else if (strcmp(type, "checkpoint") == 0) {
        /* A failed upload says why (the store and the service's reason). */
        const char *cerr = jstr(d, "error", NULL);
        fprintf(out, "checkpoint at step %lld: %s (%s)%s%s\n", jint(d, "step"), jstr(d, "dir", ""),
                jstr(d, "state", "local"), cerr ? ": " : "", cerr ? cerr : "");
    } else if (strcmp(type, "log") == 0) {
        fprintf(out, "log %s\n", jstr(d, "line", ""));
    } else if (strcmp(type, "started") == 0) {
        char params[32], trainable[32];
        clifmt_count(params, sizeof params, jint(d, "params"));
        clifmt_count(trainable, sizeof trainable, jint(d, "trainable"));
        w->have_rate0 = 0; /* a new run: its own pace */
        long long world = jint(d, "world");
        fprintf(out, "Engine started: %s parameters (%s trainable), %lld process%s, backend %s",
                params, trainable, world, world == 1 ? "" : "es", jstr(d, "backend", "?"));
        json_t *rs = json_object_get(d, "resumed_from_step");
        if (json_is_integer(rs))
            fprintf(out, ", resumed from step %lld", (long long)json_integer_value(rs));
        fputs(".\n", out);
    }
}
