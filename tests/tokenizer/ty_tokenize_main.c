/* ty_tokenize_main.c — a standalone driver for `tokenize`, so the tokenizer
 * tests and benchmark run without the engine binary: it is exactly what
 * `trainyard-engine tokenize` runs (tokenizer_cli_main). */
#include "tokenizer.h"

int main(int argc, char **argv)
{
    return tokenizer_cli_main(argc, argv);
}
