/* cli_fmt.h — how the command-line client renders jobs and events for a
 * person: the `jobs` table and the lines of `watch`.
 *
 * Pure functions of their JSON input (no I/O but the FILE they print to, no
 * clock), so tests/cli can pin the output with fixed inputs. Each column
 * has one number format whatever the value: loss with four significant digits (clifmt_metric), the
 * learning rate always in scientific notation, progress as step/max and a
 * percentage, durations as "45s", "3m12s", "1h02m", "2d03h". */
#ifndef TY_CLI_FMT_H
#define TY_CLI_FMT_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

/* A duration in seconds as "45s", "3m12s", "1h02m" or "2d03h"; "-" when
 * negative or not finite. */
void clifmt_duration(char *out, size_t cap, double seconds);

/* A count at a glance: 112384 -> "112k", 1100048384 -> "1.10B". */
void clifmt_count(char *out, size_t cap, long long n);

/* A loss or other metric for people, the dashboard's rule (web/util.js
 * fmtMetric): four significant digits ("2.117", "0.1000", "0.001733"),
 * scientific notation below 1e-3 ("7.590e-4"), whole numbers from 1000 up,
 * "0" for zero, "-" when not finite; never "0.0000". */
void clifmt_metric(char *out, size_t cap, double v);

/* An RFC 3339 UTC timestamp ("2026-12-02T19:10:15.123Z") as seconds since
 * the epoch; -1 when it is not one. */
double clifmt_parse_ts(const char *ts);

/* ---- jobs ---- */

/* The header line of the jobs table. */
void clifmt_jobs_header(FILE *out);
/* One row of the table from a Job object (openapi.yaml): id, state,
 * step/max, percent, last loss, ETA (only when the API gives one), name. */
void clifmt_jobs_row(FILE *out, json_t *job);

/* ---- watch ---- */

/* What watch remembers between events: the job, its length, the last eval
 * loss, and where the current run's rate is measured from (its first metric
 * after a start), which gives the ETA. */
typedef struct clifmt_watch {
    long long job_id;
    long long max_steps; /* 0 when unknown */
    int have_eval;
    double eval_loss;
    int have_rate0; /* rate0_* hold the run's first metric */
    long long rate0_step;
    double rate0_ts;
} clifmt_watch;

/* job is the Job object watch fetched first (for its id and max_steps). */
void clifmt_watch_init(clifmt_watch *w, json_t *job);
/* Prints the line(s) of one event: its type, its data object and its
 * timestamp (the Event's "ts"). Unknown types print nothing. */
void clifmt_watch_event(clifmt_watch *w, FILE *out, const char *type, json_t *data, const char *ts);

#endif
