/* generate.h — `trainyard-engine generate` and `trainyard-engine logits`:
 * inference on a model directory, an export, or a checkpoint's weights,
 * with a LoRA adapter applied. See generate.c and docs/engine.md. */
#ifndef TY_GENERATE_H
#define TY_GENERATE_H

/* argv[0] is "generate" / "logits"; returns the exit status (0 ok, 1
 * failure, 2 bad usage). */
int generate_main(int argc, char **argv);
int logits_main(int argc, char **argv);

#endif
