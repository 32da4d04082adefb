/* test_emu_wmma.cpp — kernels.cuda_emu.wmma: the emulation's nvcuda::wmma
 * (emu_wmma.h) against a host product.
 *
 * Each warp of a block computes C = A B + C0 for A 16 x 32 and B 32 x 16
 * in bf16 and fp16 (two mma_sync along k), B read row-major or
 * column-major, C0 loaded and C stored in either memory layout; inputs
 * are small integers, so fp32 accumulation is exact and the result must
 * match to the bit. Then: the warp-matrix FLOPs land on the "mma" path of
 * the launch's count record (TY_EMU_COUNT); in child processes, a warp
 * whose upper half has returned aborts in mma_sync, and a stored tile read
 * back without a __syncwarp gives wrong results. */
#include "kn_cuda.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

#include "tyassert.h"

using namespace nvcuda;

namespace {

template <typename E> E bits16(float f);
template <> __nv_bfloat16 bits16<__nv_bfloat16>(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return __nv_bfloat16{(uint16_t)(u >> 16)}; /* small integers: exact */
}
template <> __half bits16<__half>(float f)
{
    /* small integers |f| < 2048: exponent and mantissa by hand */
    uint16_t s = f < 0 ? 0x8000u : 0;
    unsigned a = (unsigned)(f < 0 ? -f : f);
    if (!a)
        return __half{s};
    int e = 31 - __builtin_clz(a);
    uint16_t m = (uint16_t)((a << (10 - e)) & 0x3ffu);
    return __half{(uint16_t)(s | ((e + 15) << 10) | m)};
}

/* Per warp w: A at a + w*512 (16 x 32 row-major), B at b + w*512 (32 x 16,
 * row-major, or column-major when bcol), C0 / C at c + w*256 (16 x 16 in
 * the layout lc). sync = 0 leaves out the __syncwarp before reading back. */
template <typename E>
__global__ void k_product(float *out, const E *a, const E *b, const float *c, int bcol, int lc,
                          int sync)
{
    KN_DYN_SHARED(float, tile);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    wmma::layout_t l = lc ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, c + w * 256, 16, l);
    for (int k0 = 0; k0 < 32; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, a + w * 512 + k0, 32);
        if (bcol) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> fb;
            wmma::load_matrix_sync(fb, b + w * 512 + k0, 32);
            wmma::mma_sync(acc, fa, fb, acc);
        } else {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, b + w * 512 + k0 * 16, 16);
            wmma::mma_sync(acc, fa, fb, acc);
        }
    }
    float *t = tile + w * 256;
    wmma::store_matrix_sync(t, acc, 16, l);
    if (sync)
        __syncwarp();
    for (int e = lane; e < 256; e += 32) /* each lane copies elements others stored */
        out[w * 256 + e] = t[(e + 16 * 7) % 256];
}

/* Lanes 16..31 leave before the product: the warp collective aborts. */
__global__ void k_half_warp_mma(float *out, const __half *a)
{
    if (threadIdx.x >= 16)
        return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, a, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

template <typename T> T *dev(size_t n)
{
    T *p = nullptr;
    if (cudaMalloc((void **)&p, n * sizeof(T)) != cudaSuccess)
        exit(2);
    return p;
}

float val(size_t i, int salt) { return (float)((int)((i * 7 + salt * 13) % 11) - 5); }

/* Launches k_product for 3 warps; the number of wrong elements. */
template <typename E> int product(int bcol, int lc, int sync)
{
    const int W = 3;
    E *a = dev<E>(W * 512), *b = dev<E>(W * 512);
    float *c = dev<float>(W * 256), *out = dev<float>(W * 256);
    for (int i = 0; i < W * 512; i++) {
        a[i] = bits16<E>(val(i, 1));
        b[i] = bits16<E>(val(i, 2));
    }
    for (int i = 0; i < W * 256; i++)
        c[i] = val(i, 3);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_product<E>, 1, 32 * W, W * 256 * sizeof(float), st, out, a, b, c, bcol, lc,
                  sync);
    int bad = 0;
    for (int w = 0; w < W; w++)
        for (int e = 0; e < 256; e++) {
            int s = (e + 16 * 7) % 256; /* out[e] holds stored element s */
            int i = lc ? s % 16 : s / 16, j = lc ? s / 16 : s % 16;
            float want = c[w * 256 + s];
            for (int k = 0; k < 32; k++) {
                size_t bi = bcol ? (size_t)j * 32 + k : (size_t)k * 16 + j;
                want += val(w * 512 + i * 32 + k, 1) * val(w * 512 + bi, 2);
            }
            bad += out[w * 256 + e] != want;
        }
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(out);
    return bad;
}

void products(void)
{
    for (int bcol = 0; bcol < 2; bcol++)
        for (int lc = 0; lc < 2; lc++) {
            int bb = product<__nv_bfloat16>(bcol, lc, 1), bh = product<__half>(bcol, lc, 1);
            CHECK(bb == 0, "bf16 product (B %s, C %s): %d wrong", bcol ? "col" : "row",
                  lc ? "col" : "row", bb);
            CHECK(bh == 0, "fp16 product (B %s, C %s): %d wrong", bcol ? "col" : "row",
                  lc ? "col" : "row", bh);
        }
}

/* 3 warps x 2 products x 2*16^3 FLOPs, on the mma path only. */
void counts(void)
{
    emu_count_rec r[16];
    emu_count_take(r, 16);
    product<__half>(0, 0, 1);
    int n = emu_count_take(r, 16), launches = 0;
    for (int i = 0; i < n; i++)
        if (strstr(r[i].name, "k_product")) {
            launches++;
            CHECK(r[i].flops[EMU_PATH_MMA] == 3 * 2 * 8192ull, "mma FLOPs %llu, want %llu",
                  (unsigned long long)r[i].flops[EMU_PATH_MMA], 3 * 2 * 8192ull);
            CHECK(r[i].flops[EMU_PATH_SIMT] == 0 && r[i].flops[EMU_PATH_TC16] == 0,
                  "wmma FLOPs on another path");
        }
    CHECK(launches == 1, "%d k_product records", launches);
}

/* Runs `self which` (a fresh process: the first launch, in the default
 * order); its exit status. */
int child(const char *self, const char *which)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, which, (char *)nullptr);
        _exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Without the __syncwarp, lane 0 (running first after the store) reads
 * elements lane 16 has not stored yet: 3 when the results are wrong. */
int nosync_child(void) { return product<__half>(0, 0, 0) ? 3 : 0; }

int half_warp_child(void)
{
    __half *a = dev<__half>(256);
    float *out = dev<float>(256);
    memset(a, 0, 256 * sizeof *a);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_half_warp_mma, 1, 32, 0, st, out, a);
    return 0; /* not reached: the launch aborts */
}

} // namespace

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "half_warp"))
        return half_warp_child();
    if (argc > 1 && !strcmp(argv[1], "nosync"))
        return nosync_child();
    setenv("TY_EMU_COUNT", "/dev/null", 1);
    products();
    counts();
    int st = child(argv[0], "half_warp");
    CHECK(st != 0 && st != 2, "a half warp's mma_sync did not abort (status %d)", st);
    st = child(argv[0], "nosync");
    CHECK(st == 3, "a read of other lanes' stored elements without __syncwarp passed (%d)", st);
    return ty_summary("cuda_emu.wmma");
}
