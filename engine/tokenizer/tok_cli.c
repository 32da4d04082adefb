/* tok_cli.c — `trainyard-engine tokenize`: a line filter over the tokenizer,
 * for checking a model's tokenisation by hand and for the agreement tests.
 *
 * Reads stdin line by line (the trailing "\n" is not part of the text) and
 * writes one line of space-separated ids per input line; --decode goes the
 * other way. Exit status: 0 ok, 1 bad input (naming the line), 2 bad usage
 * or a model that does not load. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s --model DIR [--add-special] [--decode]\n"
            "  Reads UTF-8 lines on stdin and prints each line's token ids, space-separated.\n"
            "  --model DIR     a Hugging Face model directory with tokenizer.json\n"
            "  --add-special   add bos/eos as the model's configuration asks\n"
            "  --decode        read lines of ids instead and print their text\n",
            prog);
}

static int encode_line(const tok_tokenizer *tok, const char *line, size_t len, int add_special,
                       long lineno)
{
    int32_t *ids;
    size_t n;
    ty_err err = {0};
    if (tok_encode(tok, line, len, add_special, &ids, &n, &err)) {
        fprintf(stderr, "tokenize: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", (int)ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

static int decode_line(const tok_tokenizer *tok, char *line, long lineno)
{
    size_t n = 0, cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return 1;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ' ' && *end != '\t' && *end != '\r')) {
            fprintf(stderr, "tokenize: line %ld: \"%.32s\" is not a token id\n", lineno, p);
            free(ids);
            return 1;
        }
        if (n == cap) {
            int32_t *g = realloc(ids, (cap *= 2) * sizeof *g);
            if (!g) {
                free(ids);
                return 1;
            }
            ids = g;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    char *text;
    size_t len;
    ty_err err = {0};
    int rc = tok_decode(tok, ids, n, &text, &len, &err);
    free(ids);
    if (rc) {
        fprintf(stderr, "tokenize: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    fwrite(text, 1, len, stdout);
    putchar('\n');
    free(text);
    return 0;
}

int tokenizer_cli_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"add-special", no_argument, NULL, 's'},
        {"decode", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *prog = argc > 0 ? argv[0] : "tokenize";
    int add_special = 0, decode = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 's':
            add_special = 1;
            break;
        case 'd':
            decode = 1;
            break;
        case 'h':
            usage(stdout, prog);
            return 0;
        default:
            usage(stderr, prog);
            return 2;
        }
    }
    if (!model || optind != argc) {
        usage(stderr, prog);
        return 2;
    }
    tok_tokenizer *tok;
    ty_err err = {0};
    if (tok_load(&tok, model, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int status = 0;
    while (status == 0 && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
        status = decode ? decode_line(tok, line, lineno)
                        : encode_line(tok, line, (size_t)len, add_special, lineno);
    }
    free(line);
    tok_free(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "tokenize: writing stdout: %s\n", strerror(errno));
        return 1;
    }
    return status;
}
