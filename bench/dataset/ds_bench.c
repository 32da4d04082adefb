/* ds_bench.c — dataset indexing benchmark for the engine's text formats.
 *
 *   ds-bench gen FILE MIB            writes MIB MiB of text-format JSONL
 *   ds-bench index FILE MODEL_DIR TOKENIZE_MIB
 *
 * `index` times textdata_open (the one pass that checks every line and keeps
 * its offset: what a job pays before its first step), reports the peak RSS
 * against the file size (the file is mapped, not loaded), then builds rows
 * in file order until TOKENIZE_MIB MiB of lines have been tokenised, for the
 * first epoch's tokenisation throughput. Figures go to stdout as key=value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "data.h"
#include "textdata.h"
#include "tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Prose-like lines: common words, punctuation, some escapes and non-ASCII,
 * 200 to 3000 bytes of text each, as in a typical pre-training dump. */
static int gen(const char *path, long mib)
{
    static const char *const words[] = {
        "the",         "of",       "and",       "to",       "in",       "a",
        "is",          "that",     "for",       "it",       "as",       "was",
        "with",        "be",       "by",        "on",       "not",      "he",
        "this",        "are",      "or",        "his",      "from",     "at",
        "which",       "but",      "have",      "an",       "had",      "they",
        "model",       "training", "data",      "language", "learning", "token",
        "weights",     "gradient", "optimizer", "café",     "naïve",    "東京",
        "数据",        "🙂",     "2026",      "3.14159",  "x_1",      "\\\"quoted\\\"",
        "line\\nbreak"};
    const int nw = (int)(sizeof words / sizeof *words);
    FILE *f = fopen(path, "w");
    if (!f) return perror(path), 1;
    uint64_t s = 42, total = (uint64_t)mib << 20, done = 0;
    char *buf = malloc(8192);
    while (done < total) {
        int target = 200 + (int)(rng(&s) % 2800), n = 0;
        n += sprintf(buf + n, "{\"text\": \"");
        int first = 1;
        while (n < target + 10) {
            const char *w = words[rng(&s) % (uint64_t)nw];
            n += sprintf(buf + n, "%s%s", first ? "" : (rng(&s) % 12 == 0 ? ". " : " "), w);
            first = 0;
        }
        n += sprintf(buf + n, ".\"}\n");
        fwrite(buf, 1, (size_t)n, f);
        done += (uint64_t)n;
    }
    free(buf);
    if (fclose(f)) return perror(path), 1;
    return 0;
}

static long rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

static int bench_index(const char *path, const char *model_dir, double tok_mib)
{
    ty_err err = {0};
    tok_tokenizer *tok = NULL;
    if (tok_load(&tok, model_dir, &err)) return fprintf(stderr, "ds-bench: %s\n", err.msg), 1;
    FILE *f = fopen(path, "r");
    if (!f) return perror(path), 1;
    fseek(f, 0, SEEK_END);
    double bytes = (double)ftell(f);
    fclose(f);
    textdata_opts o = {0};
    o.format = TD_TEXT;
    o.seq_len = 1024;
    o.vocab = tok_vocab_size(tok);
    o.tok = tok;
    dataset d;
    long rss0 = rss_mib();
    double t0 = now_s();
    if (textdata_open(path, &o, &d, &err)) return fprintf(stderr, "ds-bench: %s\n", err.msg), 1;
    double t1 = now_s();
    printf(
        "file_mib=%.1f\nlines=%d\nindex_s=%.2f\nindex_mib_s=%.1f\nrss_before_mib=%ld\nrss_after_index_mib=%ld\n",
        bytes / 1048576.0, d.n, t1 - t0, bytes / 1048576.0 / (t1 - t0), rss0, rss_mib());
    /* First-epoch tokenisation: rows in file order until tok_mib MiB. */
    int T = 4096;
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    double text_bytes = 0, t2 = now_s();
    long long tokens = 0;
    int rows = 0;
    for (int i = 0; i < d.n && text_bytes < tok_mib * 1048576.0; i++, rows++) {
        int c = data_fill_row(&d, i, T, in, tg);
        if (c < 0) return fprintf(stderr, "ds-bench: %s\n", data_error(&d)), 1;
        tokens += c + 1;
        text_bytes += bytes / d.n; /* mean line size: rows are of similar length */
    }
    double t3 = now_s();
    printf(
        "tokenize_rows=%d\ntokenize_mib=%.1f\ntokenize_s=%.2f\ntokenize_mib_s=%.2f\ntokens_per_s=%.0f\n",
        rows, text_bytes / 1048576.0, t3 - t2, text_bytes / 1048576.0 / (t3 - t2),
        (double)tokens / (t3 - t2));
    free(in);
    free(tg);
    data_free(&d);
    tok_free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "gen")) return gen(argv[2], atol(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "index")) return bench_index(argv[2], argv[3], atof(argv[4]));
    fprintf(stderr, "usage: ds-bench gen FILE MIB | ds-bench index FILE MODEL_DIR TOKENIZE_MIB\n");
    return 2;
}
