/* model_fixture.h — a model from a config.json text with random weights,
 * for the engine's C tests (test_model.c, test_longctx.c): the parse,
 * create and init steps every such test starts with, in one place. */
#pragma once

#include <stdint.h>

#include "kernels.h"
#include "model.h"

/* Parses cfg_json as a Hugging Face config.json, creates the model on kn
 * and fills it from seed. Non-zero on failure, with the reason on stderr
 * ("config: ..." or "model: ..."); m then holds nothing to free. */
int fixture_model(model *m, kn_ctx *kn, const char *cfg_json, uint64_t seed);

/* Opens a CPU kernel context; NULL on failure, with the reason on stderr. */
kn_ctx *fixture_cpu(void);
