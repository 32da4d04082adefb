/* gemm_bf16.c — is a bf16 GEMM (oneDNN, AVX512-BF16) faster than what the
 * engine does with 16-bit weights: convert them to fp32 and call sgemm?
 *
 * For each linear layer shape of GPT-2 124M and a Llama 1B, N = 1024 tokens:
 *   convert+sgemm  kn_convert(w bf16 -> fp32 scratch) + kn_matmul_fwd
 *                  (the engine's path: OpenBLAS sgemm, fp32 activations)
 *   onednn bf16    kn_convert(x fp32 -> bf16) + oneDNN matmul bf16 x bf16
 *                  -> fp32 (what a bf16 GEMM path would need)
 * Both include their conversions; best of `reps` wall times; GFLOP/s =
 * 2NKM / time. The outputs are compared (relative L2), so a wrong layout
 * cannot look fast. Usage: gemm-bf16 [threads] [reps]. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            fprintf(stderr, "%s: oneDNN status %d\n", #call, (int)st_);                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    omp_set_num_threads(threads);
    kn_ctx *c;
    ty_err err = {0};
    if (kn_open(&c, KN_CPU, 0, threads, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    const struct {
        const char *name;
        int K, M;
    } shapes[] = {{"gpt2-124M qkv", 768, 2304},  {"gpt2-124M fc", 768, 3072},
                  {"gpt2-124M proj", 3072, 768}, {"gpt2-124M lm_head", 768, 50257},
                  {"llama-1B q/o", 2048, 2048},  {"llama-1B gate/up", 2048, 5632},
                  {"llama-1B down", 5632, 2048}, {"llama-1B lm_head", 2048, 32000}};
    const int N = 1024;
    printf("%s, %d threads, N = %d tokens, best of %d\n", kn_describe(c), threads, N, reps);
    printf("%-20s %8s %8s %14s %14s %7s %9s\n", "shape", "K", "M", "convert+sgemm", "onednn bf16",
           "ratio", "rel diff");
    double sum_a = 0, sum_b = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int K = shapes[si].K, M = shapes[si].M;
        size_t nx = (size_t)N * K, nw = (size_t)M * K, no = (size_t)N * M;
        float *x = kn_alloc(c, nx * 4), *w32 = kn_alloc(c, nw * 4), *o1 = kn_alloc(c, no * 4),
              *o2 = kn_alloc(c, no * 4);
        uint16_t *w16 = kn_alloc(c, nw * 2), *x16 = kn_alloc(c, nx * 2);
        uint64_t s = 0x9e3779b97f4a7c15ULL + si;
        for (size_t i = 0; i < nx; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        }
        for (size_t i = 0; i < nw; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            w32[i] = (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.05);
        }
        kn_round(c, x, nx, KN_BF16); /* activations are bf16 values in the engine */
        kn_convert(c, w16, KN_BF16, w32, KN_F32, nw);

        /* oneDNN: src [N,K] ab, weights [K,M] given as our [M,K] row-major = tag ba. */
        dnnl_memory_desc_t src_md, wei_md, dst_md;
        dnnl_dims_t sd = {N, K}, wd = {K, M}, dd = {N, M};
        DN(dnnl_memory_desc_init_by_tag(&src_md, 2, sd, dnnl_bf16, dnnl_ab));
        DN(dnnl_memory_desc_init_by_tag(&wei_md, 2, wd, dnnl_bf16, dnnl_ba));
        DN(dnnl_memory_desc_init_by_tag(&dst_md, 2, dd, dnnl_f32, dnnl_ab));
        dnnl_matmul_desc_t md;
        DN(dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md));
        dnnl_primitive_desc_t pd;
        DN(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
        dnnl_primitive_t prim;
        DN(dnnl_primitive_create(&prim, pd));
        const char *impl = "?";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        dnnl_memory_t ms, mw, mdst;
        DN(dnnl_memory_create(&ms, &src_md, eng, x16));
        DN(dnnl_memory_create(&mw, &wei_md, eng, w16));
        DN(dnnl_memory_create(&mdst, &dst_md, eng, o2));
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mdst}};

        double best_a = 1e30, best_b = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first round warms both up */
            double t0 = now();
            kn_convert(c, w32, KN_F32, w16, KN_BF16, nw);
            kn_matmul_fwd(c, o1, x, w32, NULL, N, K, M);
            double t1 = now();
            kn_convert(c, x16, KN_BF16, x, KN_F32, nx);
            DN(dnnl_primitive_execute(prim, stream, 3, args));
            DN(dnnl_stream_wait(stream));
            double t2 = now();
            if (r) {
                best_a = fmin(best_a, t1 - t0);
                best_b = fmin(best_b, t2 - t1);
            }
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < no; i++) {
            num += ((double)o1[i] - o2[i]) * ((double)o1[i] - o2[i]);
            den += (double)o1[i] * o1[i];
        }
        double gf = 2.0 * N * K * (double)M * 1e-9;
        printf("%-20s %8d %8d %9.1f GF/s %9.1f GF/s %6.2fx %9.1e  (%s)\n", shapes[si].name, K, M,
               gf / best_a, gf / best_b, best_a / best_b, sqrt(num / den), impl);
        sum_a += best_a;
        sum_b += best_b;
        dnnl_primitive_destroy(prim);
        dnnl_primitive_desc_destroy(pd);
        dnnl_memory_destroy(ms);
        dnnl_memory_destroy(mw);
        dnnl_memory_destroy(mdst);
        kn_free(c, x), kn_free(c, w32), kn_free(c, o1), kn_free(c, o2), kn_free(c, w16),
            kn_free(c, x16);
    }
    printf("all shapes: convert+sgemm %.3f s, onednn bf16 %.3f s: onednn is %.2fx %s\n", sum_a,
           sum_b, sum_a > sum_b ? sum_a / sum_b : sum_b / sum_a,
           sum_a > sum_b ? "faster" : "slower");
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    kn_close(c);
    return 0;
}
