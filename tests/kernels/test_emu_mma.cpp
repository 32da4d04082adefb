/* test_emu_mma.cpp — kernels.cuda_emu.mma: kn_mma.cuh's m16n8k16 product
 * and fragment loads on the emulation (emu_mma.h) against a host product,
 * lane by lane in the documented layout.
 *
 * Each warp computes C = A B + C0 for A 16 x 32 and B 32 x 16 (two k
 * steps, two 8-column tiles) in bf16 and fp16, the fragments loaded by
 * ldmatrix: B as rows of B^T (kn_mma_load_bt2) or as B's own rows,
 * transposed (kn_mma_load_b2); every lane writes its accumulators where the
 * layout says they belong (row g + 8 (i / 2), column 2t + i % 2), so a
 * lane holding the wrong elements shows as wrong values. Then the C -> A
 * reuse the flash kernels rely on: E = (A B) B2 with A B's two 16 x 8 tiles
 * packed as the A fragment of the second product. Inputs are small
 * integers, so fp32 accumulation is exact and results must match to the
 * bit. Last: each product counts 2 * 16 * 8 * 16 FLOPs on the mma path,
 * and a warp whose upper half has returned aborts (a child process). */
#include "kn_cuda.cuh"
#include "kn_mma.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

#include "tyassert.h"

using namespace KN_NS;

namespace
{

uint16_t bits16(float f, bool bf)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (bf) return (uint16_t)(u >> 16); /* small integers: exact */
    uint16_t s = f < 0 ? 0x8000u : 0;
    unsigned a = (unsigned)(f < 0 ? -f : f);
    if (!a) return s;
    int e = 31 - __builtin_clz(a);
    return (uint16_t)(s | ((e + 15) << 10) | ((a << (10 - e)) & 0x3ffu));
}

/* Per warp w: A at a + w*512 (16 x 32 row-major); B (32 x 16) at b +
 * w*512, as B^T (16 rows of 32) when bt, else B (32 rows of 16); C0 / C
 * at c / out + w*256 (16 x 16 row-major, two 8-column tiles). */
template <bool BF>
__global__ void k_product(float *out, const uint16_t *a, const uint16_t *b, const float *c,
                          int bt)
{
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float acc[2][4];
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 4; i++)
            acc[n][i] = c[w * 256 + (g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2];
    for (int k0 = 0; k0 < 32; k0 += 16) {
        uint32_t fa[4], fb[2][2];
        kn_mma_load_a(fa, a + w * 512, 32, k0);
        if (bt)
            kn_mma_load_bt2(fb, b + w * 512, 32, 0, k0);
        else
            kn_mma_load_b2(fb, b + w * 512, 16, k0, 0);
        for (int n = 0; n < 2; n++)
            kn_mma16816<BF>(acc[n], fa, fb[n]);
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 4; i++)
            out[w * 256 + (g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2] = acc[n][i];
}

/* E (16 x 16) = (A B) B2 for A 16 x 16, B 16 x 16 (rows of B^T), B2
 * 16 x 16 (its rows): A B's two 8-column tiles as an A fragment. */
template <bool BF>
__global__ void k_chain(float *out, const uint16_t *a, const uint16_t *bt, const uint16_t *b2)
{
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float ab[2][4] = {};
    uint32_t fa[4], fb[2][2];
    kn_mma_load_a(fa, a, 16, 0);
    kn_mma_load_bt2(fb, bt, 16, 0, 0);
    for (int n = 0; n < 2; n++)
        kn_mma16816<BF>(ab[n], fa, fb[n]);
    uint32_t pa[4];
    for (int r = 0; r < 4; r++) { /* register r: row g + 8 (r % 2), columns 8 (r / 2) + 2t, +1 */
        const float *x = ab[r / 2] + 2 * (r % 2);
        pa[r] = kn_pack16(bits16(x[0], BF), bits16(x[1], BF));
    }
    float e[2][4] = {};
    kn_mma_load_b2(fb, b2, 16, 0, 0);
    for (int n = 0; n < 2; n++) {
        kn_mma16816<BF>(e[n], pa, fb[n]);
        for (int i = 0; i < 4; i++)
            out[(g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2] = e[n][i];
    }
}

__global__ void k_half_warp(float *out, const uint16_t *a)
{
    if (threadIdx.x >= 16) return;
    float acc[4] = {};
    uint32_t fa[4], fb[2][2];
    kn_mma_load_a(fa, a, 16, 0);
    kn_mma_load_bt2(fb, a, 16, 0, 0);
    kn_mma16816<false>(acc, fa, fb[0]);
    out[threadIdx.x] = acc[0];
}

template <typename T> T *dev(size_t n)
{
    T *p = nullptr;
    if (cudaMalloc((void **)&p, n * sizeof(T)) != cudaSuccess) exit(2);
    return p;
}

float val(size_t i, int salt)
{
    return (float)((int)((i * 7 + salt * 13) % 11) - 5);
}

/* k_product for 3 warps; the number of wrong elements. */
template <bool BF> int product(int bt)
{
    const int W = 3;
    uint16_t *a = dev<uint16_t>(W * 512), *b = dev<uint16_t>(W * 512);
    float *c = dev<float>(W * 256), *out = dev<float>(W * 256);
    for (int i = 0; i < W * 512; i++) {
        a[i] = bits16(val(i, 1), BF);
        b[i] = bits16(val(i, 2), BF);
    }
    for (int i = 0; i < W * 256; i++)
        c[i] = val(i, 3);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_product<BF>, 1, 32 * W, 0, st, out, a, b, c, bt);
    int bad = 0;
    for (int w = 0; w < W; w++)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                float want = c[w * 256 + i * 16 + j];
                for (int k = 0; k < 32; k++) /* B[k][j]: B^T's row j, or B's row k */
                    want += val(w * 512 + i * 32 + k, 1) *
                            val(w * 512 + (bt ? j * 32 + k : k * 16 + j), 2);
                bad += out[w * 256 + i * 16 + j] != want;
            }
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(out);
    return bad;
}

template <bool BF> int chain(void)
{
    uint16_t *a = dev<uint16_t>(256), *bt = dev<uint16_t>(256), *b2 = dev<uint16_t>(256);
    float *out = dev<float>(256);
    /* values in {-1, 0, 1}: A B stays within 16, exact in both types */
    for (int i = 0; i < 256; i++) {
        a[i] = bits16((float)((int)(i * 5 % 3) - 1), BF);
        bt[i] = bits16((float)((int)(i * 7 % 3) - 1), BF);
        b2[i] = bits16(val(i, 4), BF);
    }
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_chain<BF>, 1, 32, 0, st, out, a, bt, b2);
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float want = 0;
            for (int m = 0; m < 16; m++) {
                float ab = 0; /* (A B)[i][m] = sum_k A[i][k] B^T[m][k] */
                for (int k = 0; k < 16; k++)
                    ab += (float)((int)((i * 16 + k) * 5 % 3) - 1) *
                          (float)((int)((m * 16 + k) * 7 % 3) - 1);
                want += ab * val(m * 16 + j, 4);
            }
            bad += out[i * 16 + j] != want;
        }
    cudaFree(a), cudaFree(bt), cudaFree(b2), cudaFree(out);
    return bad;
}

/* 3 warps x 4 products x 2*16*8*16 FLOPs, on the mma path only. */
void counts(void)
{
    emu_count_rec r[16];
    emu_count_take(r, 16);
    product<false>(1);
    int n = emu_count_take(r, 16), launches = 0;
    for (int i = 0; i < n; i++)
        if (strstr(r[i].name, "k_product")) {
            launches++;
            CHECK(r[i].flops[EMU_PATH_MMA] == 3 * 4 * 4096ull, "mma FLOPs %llu, want %llu",
                  (unsigned long long)r[i].flops[EMU_PATH_MMA], 3 * 4 * 4096ull);
            CHECK(r[i].flops[EMU_PATH_SIMT] == 0 && r[i].flops[EMU_PATH_TC16] == 0,
                  "mma FLOPs on another path");
        }
    CHECK(launches == 1, "%d k_product records", launches);
}

int half_warp_child(void)
{
    uint16_t *a = dev<uint16_t>(256);
    float *out = dev<float>(32);
    memset(a, 0, 256 * sizeof *a);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_half_warp, 1, 32, 0, st, out, a);
    return 0; /* not reached: the launch aborts */
}

} // namespace

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "half_warp")) return half_warp_child();
    setenv("TY_EMU_COUNT", "/dev/null", 1);
    for (int bt = 0; bt < 2; bt++) {
        int bb = product<true>(bt), bh = product<false>(bt);
        CHECK(bb == 0, "bf16 product (B as %s): %d wrong", bt ? "B^T rows" : "rows", bb);
        CHECK(bh == 0, "fp16 product (B as %s): %d wrong", bt ? "B^T rows" : "rows", bh);
    }
    int cb = chain<true>(), ch = chain<false>();
    CHECK(cb == 0 && ch == 0, "C tiles as an A fragment: %d (bf16), %d (fp16) wrong", cb, ch);
    counts();
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[0], argv[0], "half_warp", (char *)nullptr);
        _exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    st = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    CHECK(st != 0 && st != 2, "a half warp's mma did not abort (status %d)", st);
    return ty_summary("cuda_emu.mma");
}
