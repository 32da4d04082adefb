/* model_fixture.c — see model_fixture.h. */
#include "model_fixture.h"

#include <jansson.h>
#include <stdio.h>

#include "hfconfig.h"

int fixture_model(model *m, kn_ctx *kn, const char *cfg_json, uint64_t seed)
{
    json_error_t je;
    json_t *o = json_loads(cfg_json, 0, &je);
    if (!o) {
        fprintf(stderr, "config: %s\n", je.text);
        return -1;
    }
    model_config c;
    ty_err err = {0};
    int rc = hfconfig_parse(o, "test", &c, &err);
    json_decref(o);
    if (rc) {
        fprintf(stderr, "config: %s\n", err.msg);
        return rc;
    }
    rc = model_create(m, &c, kn, &err); /* takes c, also on failure */
    if (!rc) rc = model_init_random(m, seed, &err);
    if (rc) {
        fprintf(stderr, "model: %s\n", err.msg);
        model_free(m);
    }
    return rc;
}

kn_ctx *fixture_cpu(void)
{
    kn_ctx *kn = NULL;
    ty_err err = {0};
    if (kn_open(&kn, KN_CPU, 0, 0, &err)) {
        fprintf(stderr, "kn_open: %s\n", err.msg);
        return NULL;
    }
    return kn;
}
