/* nf4_tool — the engine's NF4 quantiser and the kernels' dequantiser, on
 * files, for nf4_check.py to hold against its numpy reference of
 * bitsandbytes' algorithm and against bitsandbytes itself.
 *
 *   nf4_tool tables OUT                 kn_nf4_levels[16] + kn_dyn8_map[256], fp32
 *   nf4_tool quant IN.f32 DQ OUT        nf4_quantize: OUT.codes, OUT.absmax and with
 *                                       DQ = 1 OUT.qabsmax, OUT.absmax2, OUT.offset
 *   nf4_tool dequant IN.f32 DQ DT OUT   quantise, then kn_nf4_dequant on the CPU
 *                                       backend into DT (fp32 | bf16 | fp16)
 * Files are raw little-endian arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "nf4.h"

static void *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && len > 0 && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = len > 0 ? (size_t)len : 0;
    return p;
}

static int put(const char *prefix, const char *ext, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    FILE *f = fopen(path, "wb");
    if (!f || (bytes && fwrite(p, 1, bytes, f) != bytes)) {
        fprintf(stderr, "nf4_tool: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    return fclose(f) != 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "tables"))
        return put(argv[2], ".nf4", kn_nf4_levels, sizeof kn_nf4_levels) ||
               put(argv[2], ".dyn8", kn_dyn8_map, sizeof kn_dyn8_map);
    if (argc < 5 || (strcmp(argv[1], "quant") && strcmp(argv[1], "dequant")) ||
        (!strcmp(argv[1], "dequant") && argc < 6)) {
        fprintf(stderr, "usage: nf4_tool tables OUT | quant IN DQ OUT | dequant IN DQ DT OUT\n");
        return 2;
    }
    size_t bytes;
    float *x = slurp(argv[2], &bytes);
    if (!x) {
        fprintf(stderr, "nf4_tool: cannot read %s\n", argv[2]);
        return 1;
    }
    size_t n = bytes / sizeof(float);
    int dq = atoi(argv[3]);
    nf4_host q;
    ty_err err = {0};
    if (nf4_quantize(x, n, dq, &q, &err)) {
        fprintf(stderr, "nf4_tool: %s\n", err.msg);
        free(x);
        return 1;
    }
    int rc = 0;
    if (!strcmp(argv[1], "quant")) {
        const char *o = argv[4];
        rc = put(o, ".codes", q.codes, (n + 1) / 2) ||
             put(o, ".absmax", q.absmax, q.nb * sizeof(float));
        if (!rc && dq)
            rc = put(o, ".qabsmax", q.qabsmax, q.nb) ||
                 put(o, ".absmax2", q.absmax2, q.nb2 * sizeof(float)) ||
                 put(o, ".offset", &q.offset, sizeof q.offset);
    } else {
        kn_dtype dt = !strcmp(argv[4], "bf16")   ? KN_BF16
                      : !strcmp(argv[4], "fp16") ? KN_F16
                                                 : KN_F32;
        kn_ctx *kn = NULL;
        if (kn_open(&kn, KN_CPU, 0, 1, &err)) {
            fprintf(stderr, "nf4_tool: %s\n", err.msg);
            rc = 1;
        } else {
            void *dev = kn_alloc(kn, nf4_device_bytes(n, dq)),
                 *out = kn_alloc(kn, n * kn_dtype_size(dt));
            void *host = malloc(n * kn_dtype_size(dt) + 1);
            kn_nf4 w;
            nf4_to_device(kn, &q, dev, &w);
            kn_nf4_dequant(kn, out, dt, w, n);
            kn_to_host(kn, host, out, n * kn_dtype_size(dt));
            if (kn_check(kn, &err)) {
                fprintf(stderr, "nf4_tool: %s\n", err.msg);
                rc = 1;
            } else {
                rc = put(argv[5], "", host, n * kn_dtype_size(dt));
            }
            free(host);
            kn_close(kn);
        }
    }
    nf4_free(&q);
    free(x);
    return rc;
}
