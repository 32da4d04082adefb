/* fuzz_jsonl.c — the JSONL dataset readers: engine/textdata.c (text,
 * prompt_completion, chat in the three templates, with and without packing)
 * and engine/data.c (pre-tokenised "tokens" rows).
 *
 * The first input byte picks the reader and options, the rest is the file
 * (a memfd, fuzz_util.h, so the real mmap index pass and pread read-back
 * run). Once a dataset opens, every row is filled as the trainer would,
 * which renders and tokenises every example; the invariants are those of
 * data.h: a row's target count is what it says, inputs are valid ids. The
 * tokenizer is a small SentencePiece-style one with byte fallback (every
 * byte encodes) that knows the chat templates' special tokens. */
#include <jansson.h>
#include <string.h>

#include "data.h"
#include "fuzz_util.h"
#include "textdata.h"
#include "tokenizer.h"

enum { T = 24, VOCAB_SLACK = 0 };

static tok_tokenizer *tok;

static tok_tokenizer *make_tokenizer(void)
{
    json_t *v = json_object();
    int id = 0;
    const char *base[] = {"<unk>", "<s>",           "</s>", "\xE2\x96\x81",    "a",  "e", "h",
                          "t",     "\xE2\x96\x81t", "he",   "\xE2\x96\x81the", "th", NULL};
    for (int i = 0; base[i]; i++)
        json_object_set_new(v, base[i], json_integer(id++));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(v, name, json_integer(id++));
    }
    json_t *added = json_array();
    const char *special[] = {"<|im_start|>",      "<|im_end|>", "<|start_header_id|>",
                             "<|end_header_id|>", "<|eot_id|>", NULL};
    for (int i = 0; special[i]; i++) {
        json_object_set_new(v, special[i], json_integer(id));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b}", "id", id,
                                               "content", special[i], "special", 1, "normalized", 0,
                                               "lstrip", 0, "rstrip", 0));
        id++;
    }
    json_array_append_new(added,
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b}", "id", 1, "content", "<s>",
                                    "special", 1, "normalized", 0, "lstrip", 0, "rstrip", 0));
    json_t *merges = json_pack("[s, s, s, s]", "\xE2\x96\x81 t", "h e", "\xE2\x96\x81t he", "t h");
    json_t *root = json_pack(
        "{s:s, s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n, s:n,"
        " s:{s:s, s:o, s:o, s:s, s:b}}",
        "version", "1.0", "added_tokens", added, "normalizer", "type", "Sequence", "normalizers",
        "type", "Prepend", "prepend", "\xE2\x96\x81", "type", "Replace", "pattern", "String", " ",
        "content", "\xE2\x96\x81", "pre_tokenizer", "decoder", "model", "type", "BPE", "vocab", v,
        "merges", merges, "unk_token", "<unk>", "byte_fallback", 1);
    char *text = json_dumps(root, 0);
    json_decref(root);
    tok_tokenizer *t = NULL;
    ty_err err = {0};
    if (tok_load_json(&t, text,
                      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true}",
                      NULL, &err)) {
        fprintf(stderr, "fuzz_jsonl: the harness tokenizer does not load: %s\n", err.msg);
        abort();
    }
    free(text);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tok = make_tokenizer();
    return 0;
}

static void fill_all(const dataset *d, int vocab)
{
    int32_t in[T], tg[T];
    for (int r = 0; r < d->n && r < 256; r++) {
        int k = data_fill_row(d, r, T, in, tg);
        if (k < 0) {
            FUZZ_ASSERT(data_error(d) && data_error(d)[0], "a failed row has no message");
            return;
        }
        int counted = 0;
        for (int i = 0; i < T; i++) {
            FUZZ_ASSERT(in[i] >= 0 && in[i] < vocab, "row %d: input id %d outside [0, %d)", r,
                        in[i], vocab);
            FUZZ_ASSERT(tg[i] == DATA_IGNORE || (tg[i] >= 0 && tg[i] < vocab), "row %d: target %d",
                        r, tg[i]);
            counted += tg[i] != DATA_IGNORE;
        }
        FUZZ_ASSERT(counted == k, "row %d: %d targets counted, fill said %d", r, counted, k);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t sel = data[0];
    char path[64];
    int fd = fuzz_memfile(data + 1, size - 1, path);
    int vocab = tok_vocab_size(tok);
    dataset d;
    ty_err err = {0};
    int rc;
    /* Bits 0-1: format (0 tokens, 1 text, 2 prompt_completion, 3 chat);
     * bits 2-3: chat template; bit 4 packing; bit 5 skip_invalid;
     * bit 6: text_field "body" instead of the default. */
    int fmt = sel & 3;
    if (fmt == 0) {
        rc = data_load_tokens(path, vocab, &d, &err);
    } else {
        textdata_opts o = {0};
        o.format = fmt == 1 ? TD_TEXT : fmt == 2 ? TD_PROMPT_COMPLETION : TD_CHAT;
        o.chat_template = (textdata_template)(((sel >> 2) & 3) % 3);
        o.packing = (sel >> 4) & 1;
        o.seq_len = T;
        o.skip_invalid = (sel >> 5) & 1;
        o.text_field = (sel >> 6) & 1 ? "body" : NULL;
        o.vocab = vocab;
        o.tok = tok;
        rc = textdata_open(path, &o, &d, &err);
    }
    if (rc) {
        FUZZ_ASSERT(err.msg[0], "a rejected dataset has no message");
    } else {
        FUZZ_ASSERT(d.n > 0, "an accepted dataset has no rows");
        fill_all(&d, vocab);
        /* eval_fraction splits share the text; fill the held-out part too. */
        dataset ev;
        ty_err serr = {0};
        if (d.n >= 2 && data_split(&d, 0.25, 7, &ev, &serr) == 0) {
            fill_all(&ev, vocab);
            fill_all(&d, vocab);
            data_free(&ev);
        }
        data_free(&d);
    }
    close(fd);
    return 0;
}
