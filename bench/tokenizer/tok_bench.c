/* tok_bench.c — encode throughput of our tokenizer: loads a model
 * directory, encodes a text file line by line (as dataset preparation
 * does) for at least a couple of seconds, and prints MB/s: the first
 * pass on its own (cold word cache, the figure compared with the reference)
 * and the sustained rate over all passes.
 *
 * usage: tok-bench MODEL_DIR TEXT_FILE [THREADS]
 * With THREADS > 1 the lines are shared out among threads encoding on the
 * same tokenizer at once. Loading time is reported apart, not counted. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"
#include "tyutil.h"

typedef struct bench_job {
    const tok_tokenizer *tok;
    char **lines;
    size_t *lens;
    size_t from, to;
    size_t tokens;
    int failed;
} bench_job;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *bench_thread(void *arg)
{
    bench_job *j = arg;
    for (size_t i = j->from; i < j->to; i++) {
        int32_t *ids;
        size_t n;
        ty_err err;
        if (tok_encode(j->tok, j->lines[i], j->lens[i], 0, &ids, &n, &err)) {
            fprintf(stderr, "tok-bench: line %zu: %s\n", i + 1, err.msg);
            j->failed = 1;
            return NULL;
        }
        j->tokens += n;
        free(ids);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [THREADS]\n", argv[0]);
        return 2;
    }
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads < 1 || threads > 64) threads = 1;
    ty_err err = {0};
    double t0 = now_s();
    tok_tokenizer *tok;
    if (tok_load(&tok, argv[1], &err)) {
        fprintf(stderr, "tok-bench: %s\n", err.msg);
        return 2;
    }
    double load_s = now_s() - t0;
    char *text;
    size_t len;
    if (ty_read_file(argv[2], &text, &len, &err)) {
        fprintf(stderr, "tok-bench: %s\n", err.msg);
        return 2;
    }
    /* Split in place into lines (without their "\n"). */
    size_t n_lines = 0, cap = 1024;
    char **lines = malloc(cap * sizeof *lines);
    size_t *lens = malloc(cap * sizeof *lens);
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (n_lines == cap) {
            cap *= 2;
            lines = realloc(lines, cap * sizeof *lines);
            lens = realloc(lens, cap * sizeof *lens);
        }
        lines[n_lines] = p;
        lens[n_lines++] = l;
        p += l + 1;
    }
    size_t bytes = 0, tokens = 0;
    int passes = 0;
    double start = now_s(), elapsed, first = 0;
    do {
        bench_job jobs[64];
        pthread_t th[64];
        for (int k = 0; k < threads; k++) {
            jobs[k] = (bench_job){tok,
                                  lines,
                                  lens,
                                  n_lines * (size_t)k / (size_t)threads,
                                  n_lines * (size_t)(k + 1) / (size_t)threads,
                                  0,
                                  0};
            pthread_create(&th[k], NULL, bench_thread, &jobs[k]);
        }
        for (int k = 0; k < threads; k++) {
            pthread_join(th[k], NULL);
            if (jobs[k].failed) return 1;
            tokens += jobs[k].tokens;
        }
        bytes += len;
        passes++;
        elapsed = now_s() - start;
        if (passes == 1) first = elapsed;
    } while (elapsed < 2.0);
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.3f, \"passes\": %d, \"threads\": %d, "
           "\"load_seconds\": %.3f, \"first_pass_mb_per_s\": %.3f, \"mb_per_s\": %.3f}\n",
           bytes, tokens, elapsed, passes, threads, load_s, (double)len / 1e6 / first,
           (double)bytes / 1e6 / elapsed);
    free(lines);
    free(lens);
    free(text);
    tok_free(tok);
    return 0;
}
