/* fuzz_jobspec.c — the job spec parser (common/jobspec.c), as POST /jobs and
 * the engine's --spec reach it: jobspec_parse_text on the raw bytes.
 *
 * Beyond "no crash, no leak, no UB", a spec that parses must round-trip:
 * jobspec_to_json (what GET /jobs/{id} shows, and what the server hands the
 * engine) parses again to the same spec, since jobspec.h promises so and the
 * engine relies on it. The roots check runs too; it resolves paths, so it
 * only reads the file system. A model.init object goes on to the engine's
 * config parser (engine/hfconfig.c), as the engine reads it. */
#include <jansson.h>
#include <string.h>

#include "fuzz_util.h"
#include "hfconfig.h"
#include "jobspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jobspec s;
    ty_err err = {0};
    if (jobspec_parse_text((const char *)data, size, &s, &err)) {
        FUZZ_ASSERT(err.msg[0], "a rejected spec has no message");
        return 0;
    }
    json_t *j1 = jobspec_to_json(&s);
    FUZZ_ASSERT(j1, "jobspec_to_json failed");
    char *txt = json_dumps(j1, JSON_COMPACT);
    FUZZ_ASSERT(txt, "cannot dump the spec");
    jobspec s2;
    ty_err err2 = {0};
    int rc = jobspec_parse_text(txt, strlen(txt), &s2, &err2);
    FUZZ_ASSERT(rc == 0, "the spec's own JSON is rejected: %s (%s): %s", err2.msg, err2.field, txt);
    json_t *j2 = jobspec_to_json(&s2);
    FUZZ_ASSERT(json_equal(j1, j2), "round trip changed the spec: %s", txt);
    json_decref(j2);
    jobspec_free(&s2);
    free(txt);
    json_decref(j1);

    if (s.model_init) {
        model_config mc;
        ty_err herr = {0};
        if (hfconfig_parse(s.model_init, "model.init", &mc, &herr) == 0) {
            json_t *ex = hfconfig_export(&mc);
            FUZZ_ASSERT(ex, "hfconfig_export failed");
            json_decref(ex);
            hfconfig_free(&mc);
        } else {
            FUZZ_ASSERT(herr.msg[0], "a rejected model.init has no message");
        }
    }

    ty_err rerr = {0};
    if (jobspec_check_roots(&s, "/tmp/ty-fuzz-root:/srv/data", &rerr))
        FUZZ_ASSERT(rerr.msg[0], "a root violation has no message");
    jobspec_free(&s);
    return 0;
}
