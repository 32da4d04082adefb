/* fuzz_safetensors.c — the safetensors reader (engine/safetensors.c): the
 * input is a whole file (8-byte header length, JSON header, data).
 *
 * st_open maps it and validates the header; when it accepts, every tensor
 * the header names is touched the way the model loader does — st_find by
 * name, st_numel, and st_to_f32 for the float dtypes — so a span that the
 * validation let through but lies outside the mapping is an ASan report,
 * not a silent read. The file is a memfd (fuzz_util.h): the real
 * open/fstat/mmap path runs. */
#include <string.h>

#include "fuzz_util.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path);
    st_file f;
    ty_err err = {0};
    if (st_open(&f, path, &err)) {
        FUZZ_ASSERT(err.msg[0], "a rejected file has no message");
        close(fd);
        return 0;
    }
    for (int i = 0; i < f.n; i++) {
        const st_tensor *t = &f.t[i];
        FUZZ_ASSERT(st_find(&f, t->name) != NULL, "tensor %s not found by name", t->name);
        uint64_t n = st_numel(t);
        const uint8_t *lo = f.map, *hi = lo + f.map_len;
        FUZZ_ASSERT(t->end >= t->begin && t->data >= lo && t->data + (t->end - t->begin) <= hi,
                    "tensor %s's span lies outside the mapping", t->name);
        if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F64) {
            /* The mapping bounds the element count, so this stays small. */
            float *out = malloc((n ? n : 1) * sizeof *out);
            FUZZ_ASSERT(out, "out of memory for %llu elements", (unsigned long long)n);
            ty_err cerr = {0};
            FUZZ_ASSERT(st_to_f32(t, out, &cerr) == 0, "conversion of %s failed: %s", t->name,
                        cerr.msg);
            free(out);
        }
    }
    st_close(&f);
    close(fd);
    return 0;
}
