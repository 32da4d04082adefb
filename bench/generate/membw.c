/* membw.c — how fast this machine can read memory, and how close the
 * decode products come to it (bench/generate, docs/benchmarks.md).
 *
 *   membw THREADS [MiB]
 *
 * 1. Read bandwidth, STREAM-like: THREADS OpenMP threads each sum their
 *    share of a buffer of MiB (default 512, far beyond any cache) with
 *    wide vector loads; best of 7 passes; GB/s = bytes / time. One decoded
 *    token reads every weight matrix once, so this is the ceiling on
 *    weight bytes per second — bench.py divides each side's bytes per
 *    token times tokens/s by it.
 * 2. The one-row product kn_matmul_fwd / kn_matmul16_fwd (N = 1, what a
 *    decode step runs) on the bench's weight shapes, fp32 and bf16, through
 *    the engine's kernels: the one-row kernel (cpu_gemv.c), and the path
 *    taken before it (TY_KN_GEMV=off in the environment: sgemm for fp32,
 *    oneDNN or convert + sgemm for bf16) when run so. Best of 30 calls;
 *    GB/s = weight bytes / time.
 * Output: one JSON object on the last line, {"threads", "read_gbs",
 * "gemv": [{"shape", "dtype", "K", "M", "us", "gbs"}, ...]}. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sum of n floats with 16 independent lanes (vectorised, no reassociation
 * needed); the result is printed so the loads cannot be dropped. */
static float sum_range(const float *p, size_t n)
{
    float acc[16] = {0};
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += p[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    return s;
}

static double read_gbs(int threads, size_t bytes, float *sink)
{
    size_t n = bytes / sizeof(float);
    float *buf = aligned_alloc(64, n * sizeof *buf);
    if (!buf) return 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) /* first touch by the thread that reads it */
        buf[i] = (float)(i & 7);
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        float total = 0;
        double t = now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            int me = omp_get_thread_num(), cnt = omp_get_num_threads();
            size_t lo = n * me / cnt / 16 * 16, hi = n * (me + 1) / cnt / 16 * 16;
            total += sum_range(buf + lo, hi - lo);
        }
        t = now() - t;
        *sink += total;
        if (t < best) best = t;
    }
    free(buf);
    return (double)n * sizeof(float) / best / 1e9;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 512;
    if (threads < 1 || mib < 1) {
        fprintf(stderr, "usage: membw THREADS [MiB]\n");
        return 2;
    }
    float sink = 0;
    double gbs = read_gbs(threads, mib << 20, &sink);
    kn_ctx *c;
    ty_err err = {0};
    if (kn_open(&c, KN_CPU, 0, threads, &err)) {
        fprintf(stderr, "membw: %s\n", err.msg);
        return 1;
    }
    const struct {
        const char *name;
        int K, M;
    } shapes[] = {{"llama-4x256 q/o", 256, 256},  {"llama-4x256 gate/up", 256, 688},
                  {"llama-4x256 down", 688, 256}, {"llama-4x256 lm_head", 256, 32000},
                  {"gpt2-124M qkv", 768, 2304},   {"gpt2-124M fc", 768, 3072},
                  {"gpt2-124M proj", 3072, 768},  {"gpt2-124M lm_head", 768, 50257}};
    printf("| shape | K x M | dtype | us / call | weight GB/s |\n|---|---|---|---|---|\n");
    char json[8192];
    int jl =
        snprintf(json, sizeof json, "{\"threads\":%d,\"read_gbs\":%.2f,\"gemv\":[", threads, gbs);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int K = shapes[s].K, M = shapes[s].M;
        for (int d = 0; d < 2; d++) {
            kn_dtype dt = d ? KN_BF16 : KN_F32;
            size_t wb = (size_t)K * M * kn_dtype_size(dt);
            float *x = kn_alloc(c, (size_t)K * sizeof *x),
                  *out = kn_alloc(c, (size_t)M * sizeof *out);
            float *w32 = kn_alloc(c, (size_t)K * M * sizeof *w32);
            void *w16 = kn_alloc(c, (size_t)K * M * 2);
            if (!x || !out || !w32 || !w16) {
                fprintf(stderr, "membw: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < (size_t)K * M; i++)
                w32[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
            for (int i = 0; i < K; i++)
                x[i] = (float)(i % 17) * 0.0625f;
            kn_convert(c, w16, KN_BF16, w32, KN_F32, (size_t)K * M);
            double best = 1e30;
            for (int rep = 0; rep < 30; rep++) {
                double t = now();
                if (dt == KN_F32)
                    kn_matmul_fwd(c, out, x, w32, NULL, 1, K, M);
                else
                    kn_matmul16_fwd(c, KN_BF16, KN_F32, KN_F32, out, x, w16, NULL, KN_F32, 1, K, M);
                t = now() - t;
                if (t < best) best = t;
            }
            sink += out[M - 1];
            printf("| %s | %d x %d | %s | %.1f | %.1f |\n", shapes[s].name, K, M, kn_dtype_name(dt),
                   best * 1e6, (double)wb / best / 1e9);
            jl += snprintf(json + jl, sizeof json - (size_t)jl,
                           "%s{\"shape\":\"%s\",\"dtype\":\"%s\",\"K\":%d,\"M\":%d,\"us\":%.2f,"
                           "\"gbs\":%.2f}",
                           s || d ? "," : "", shapes[s].name, kn_dtype_name(dt), K, M, best * 1e6,
                           (double)wb / best / 1e9);
            kn_free(c, x);
            kn_free(c, out);
            kn_free(c, w32);
            kn_free(c, w16);
        }
    }
    if (kn_check(c, &err)) {
        fprintf(stderr, "membw: %s\n", err.msg);
        return 1;
    }
    kn_close(c);
    printf("%s]}\n", json);
    fprintf(stderr, "(checksum %g)\n", (double)sink);
    return 0;
}
