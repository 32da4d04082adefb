/* train.h — the training run: spec in, events, checkpoints and an export out.
 *
 * train_run is the whole of `trainyard-engine --spec ... --workdir ...`
 * after argument parsing: it loads the model and data, runs the optimizer
 * steps, checkpoints, evaluates, exports, and reports everything as events
 * (events.h). It returns the process exit status of DESIGN §5. */
#ifndef TY_TRAIN_H
#define TY_TRAIN_H

#include <signal.h>

#include "coll.h"

typedef struct train_args {
    const char *spec_path;
    const char *workdir;
    int supervised;     /* run by trainyard serve (TY_SUPERVISOR_PID): it prunes */
    const char *resume; /* checkpoint directory or NULL */
    int threads;        /* 0 = OpenMP default */
    int rank, world, local_rank;
    coll *coll; /* world > 1: the ranks' collectives (dist.h), else NULL */
} train_args;

/* Exit statuses. */
enum { TRAIN_OK = 0, TRAIN_FAILED = 1, TRAIN_BAD_SPEC = 2 };

/* Set from the SIGTERM/SIGINT/SIGUSR1 handler: stop at the next step
 * boundary (with world > 1, the step boundary all ranks agree on). */
extern volatile sig_atomic_t train_stop_requested;

int train_run(const train_args *a);

/* `trainyard-engine dump-rows --spec FILE [--eval]`: builds the batch rows of
 * the spec's dataset exactly as training does (format, template, packing,
 * masking, split) and prints them in dataset order to stdout, one JSON
 * object per row: {"row": i, "input_ids": [...], "targets": [...]} with
 * targets[t] the label position t predicts (-100 = no loss). Returns the
 * exit status; errors on stderr. */
int train_dump_rows(const char *spec_path, int eval);

/* The learning-rate multiplier of HF's get_{constant,linear,cosine}_schedule
 * _with_warmup after `k` scheduler steps. The update of step s (from 1) uses
 * lr * train_lr_lambda(s - 1): the scheduler is stepped after each update,
 * as transformers' Trainer does. */
double train_lr_lambda(int schedule, long long k, long long warmup, long long total);

#endif
