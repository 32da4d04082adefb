/* test_emu_strict.cpp — kernels.cuda_emu.strict: the emulated CUDA backend
 * catches the kernel bugs a GPU punishes and a naive emulation lets pass.
 *
 * The kernels here are test-only and several are wrong on purpose:
 *  - race: thread t reads the shared slot thread t-1 wrote, no barrier in
 *    between. In index order the write always comes first, so it passes
 *    under TY_EMU_ORDER=forward; under reverse and shuffle:SEED the read
 *    comes first and sees the poisoned (NaN) shared memory.
 *  - reuse: two block sums through one shared array without the barrier
 *    between them; only the shuffle order, which lets warps run ahead of
 *    one another, can see a warp overwrite a partial another has not read.
 *  - mask_exited / mask_outside / mask_self: warp shuffles whose mask
 *    names a lane that returned, that read a lane outside the mask, or
 *    whose mask leaves out the caller; each must abort naming the kernel.
 *  - mask_mismatch / mask_divergent: warp operations that can never
 *    complete (lanes naming each other with different masks, a shuffle
 *    waiting on lanes parked at __syncthreads): a GPU hangs, we abort.
 *  - smem_*: dynamic shared memory above 48 KiB without
 *    cudaFuncSetAttribute, above the raised limit, above 227 KiB.
 * and correct ones that must pass under every order: the same kernels
 * with their barriers, an end-of-kernel butterfly whose lanes return
 * while slower lanes still read their values, shuffles on half-warp
 * masks while the other half is elsewhere.
 *
 * The order (and TY_EMU_GRID) is read once per process, so the driver
 * (no arguments) runs each case as a child, `test_emu_strict <case>`,
 * with the environment the expectation names, and checks how it ended:
 * exit 0 (results right), exit 3 (results wrong: the race was seen), or
 * SIGABRT with a message naming the kernel. */
#include "kn_cuda.cuh"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "tyassert.h"

#define WRONG 3 /* a child's exit status: the kernel's results are wrong */

namespace KN_NS
{

/* WRONG: thread t reads s[t-1] with no barrier after thread t-1 wrote it. */
__global__ void k_racy_neighbour(float *out, const float *in, int sync)
{
    KN_DYN_SHARED(float, s);
    int t = threadIdx.x;
    s[t] = in[t];
    if (sync) __syncthreads();
    out[t] = t ? s[t - 1] : 0.0f;
}

/* WRONG without sync: the second sum's partials overwrite the first's in
 * sh while another warp may still be reading them. Each warp's lane 0
 * writes both sums. */
__global__ void k_two_sums_one_array(float *out, const float *in, int sync)
{
    __shared__ float sh[32];
    int t = threadIdx.x, lane = t % 32, warp = t / 32, nw = blockDim.x / 32;
    float a = in[(size_t)blockIdx.x * blockDim.x + t];
    float v = kn_warp_sum(a);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float s1 = kn_warp_sum(lane < nw ? sh[lane] : 0.0f);
    if (sync) __syncthreads();
    v = kn_warp_sum(a * a);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float s2 = kn_warp_sum(lane < nw ? sh[lane] : 0.0f);
    if (lane == 0) {
        size_t o = ((size_t)blockIdx.x * nw + warp) * 2;
        out[o] = s1;
        out[o + 1] = s2;
    }
}

/* WRONG: lanes 16..31 return, the rest name them in a full mask. */
__global__ void k_sum_after_return(float *out, const float *in)
{
    int t = threadIdx.x;
    if (t % 32 >= 16) return;
    out[t] = kn_warp_sum(in[t]);
}

/* WRONG: each half-warp swaps neighbours among itself, but lane 0 reads
 * lane 16, outside its half's mask. */
__global__ void k_read_outside_mask(float *out, const float *in)
{
    int t = threadIdx.x, lane = t % 32;
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    out[t] = __shfl_sync(half, in[t], lane == 0 ? 16 : lane ^ 1);
}

/* WRONG: lane 5 calls with a mask that leaves it out. */
__global__ void k_mask_without_caller(float *out, const float *in)
{
    int t = threadIdx.x;
    out[t] = __shfl_xor_sync(t % 32 == 5 ? 0xffffffdfu : 0xffffffffu, in[t], 1);
}

/* WRONG: lanes 0..2 name each other with different masks (lane 0 leaves
 * lane 2 out), so neither group can ever complete. */
__global__ void k_mask_mismatch(float *out, const float *in)
{
    int t = threadIdx.x;
    if (t >= 3) return;
    out[t] = __shfl_sync(t == 0 ? 0x3u : 0x7u, in[t], 1);
}

/* WRONG: half the warp waits at a barrier, the other half in a shuffle
 * that names the first half. */
__global__ void k_divergent(float *out, const float *in)
{
    int t = threadIdx.x;
    if (t < 16)
        __syncthreads();
    else
        out[t] = kn_warp_sum(in[t]);
}

/* Right: the sum of each warp written by every lane as it leaves; a lane
 * that returns first does not take its value from the slower ones. */
__global__ void k_butterfly_exit(float *out, const float *in)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float v = in[t];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    out[t] = v;
}

/* Right: each half-warp sums its own lanes (a mask of 16) while the other
 * half is at another warp operation; the odd lanes of the low half then
 * return and the even ones count themselves with a ballot. */
__global__ void k_half_warps(float *out, const float *in)
{
    int t = threadIdx.x, lane = t % 32;
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    float v = in[t];
    if (lane >= 16) __syncwarp(half);
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(half, v, o);
    out[t] = v;
    if (lane >= 16 || lane % 2) return;
    unsigned even = __ballot_sync(0x00005555u, 1);
    out[t] += (float)__builtin_popcount(even);
}

/* Writes and reads all of its dynamic shared memory. */
__global__ void k_big_smem(float *out, int n)
{
    KN_DYN_SHARED(float, s);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s[i] = (float)i;
    __syncthreads();
    float acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += s[n - 1 - i];
    out[threadIdx.x] = acc;
}

} // namespace KN_NS
using namespace KN_NS;

/* ---- the cases (run in a child) ------------------------------------------- */

static float *dev_floats(size_t n, float (*f)(size_t))
{
    float *d = nullptr;
    if (cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu floats) failed\n", n);
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        d[i] = f ? f(i) : 0.0f;
    return d;
}
static float small_int(size_t i)
{
    return (float)(i % 7 + 1);
}

static int race(int sync)
{
    const int n = 64; /* two warps: the neighbour read crosses a warp at 32 */
    float *in = dev_floats(n, small_int), *out = dev_floats(n, nullptr);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_racy_neighbour, 1, n, n * sizeof(float), st, out, in, sync);
    int bad = 0;
    for (int t = 1; t < n; t++)
        bad += out[t] != in[t - 1];
    printf("race%s: %d of %d threads read a stale neighbour\n", sync ? "_fixed" : "", bad, n - 1);
    cudaFree(in);
    cudaFree(out);
    return bad ? WRONG : 0;
}

static int reuse(int sync)
{
    const int blocks = 64, threads = 128, nw = threads / 32;
    float *in = dev_floats((size_t)blocks * threads, small_int);
    float *out = dev_floats((size_t)blocks * nw * 2, nullptr);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_two_sums_one_array, blocks, threads, 0, st, out, in, sync);
    int bad = 0;
    for (int b = 0; b < blocks; b++) {
        double s1 = 0, s2 = 0; /* small integers: exact in any order */
        for (int t = 0; t < threads; t++) {
            float a = in[(size_t)b * threads + t];
            s1 += a;
            s2 += a * a;
        }
        for (int w = 0; w < nw; w++) {
            size_t o = ((size_t)b * nw + w) * 2;
            bad += out[o] != s1 || out[o + 1] != s2;
        }
    }
    printf("reuse%s: %d of %d warps summed an overwritten partial\n", sync ? "_fixed" : "", bad,
           blocks * nw);
    cudaFree(in);
    cudaFree(out);
    return bad ? WRONG : 0;
}

/* Launches one of the aborting mask kernels on a warp (it should not return). */
static int mask_case(const char *which)
{
    float *in = dev_floats(32, small_int), *out = dev_floats(32, nullptr);
    cudaStream_t st = nullptr;
    if (!strcmp(which, "mask_exited"))
        KN_EMU_LAUNCH(k_sum_after_return, 1, 32, 0, st, out, in);
    else if (!strcmp(which, "mask_outside"))
        KN_EMU_LAUNCH(k_read_outside_mask, 1, 32, 0, st, out, in);
    else if (!strcmp(which, "mask_mismatch"))
        KN_EMU_LAUNCH(k_mask_mismatch, 1, 32, 0, st, out, in);
    else if (!strcmp(which, "mask_divergent"))
        KN_EMU_LAUNCH(k_divergent, 1, 32, 0, st, out, in);
    else
        KN_EMU_LAUNCH(k_mask_without_caller, 1, 32, 0, st, out, in);
    cudaFree(in);
    cudaFree(out);
    return 0;
}

static int butterfly(void)
{
    const int blocks = 3, threads = 96;
    size_t n = (size_t)blocks * threads;
    float *in = dev_floats(n, small_int), *out = dev_floats(n, nullptr);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_butterfly_exit, blocks, threads, 0, st, out, in);
    int bad = 0;
    for (size_t w = 0; w < n / 32; w++) {
        float s = 0;
        for (size_t l = 0; l < 32; l++)
            s += in[w * 32 + l];
        for (size_t l = 0; l < 32; l++)
            bad += out[w * 32 + l] != s;
    }
    cudaFree(in);
    cudaFree(out);
    return bad ? WRONG : 0;
}

static int half_warps(void)
{
    float *in = dev_floats(64, small_int), *out = dev_floats(64, nullptr);
    cudaStream_t st = nullptr;
    KN_EMU_LAUNCH(k_half_warps, 1, 64, 0, st, out, in);
    int bad = 0;
    for (int t = 0; t < 64; t++) {
        float s = 0;
        for (int l = t / 16 * 16; l < t / 16 * 16 + 16; l++)
            s += in[l];
        if (t % 32 < 16 && t % 2 == 0) s += 8; /* the eight even lanes of the low half */
        bad += out[t] != s;
    }
    cudaFree(in);
    cudaFree(out);
    return bad ? WRONG : 0;
}

/* smem_no_attr: 64 KiB, never raised (aborts). smem_attr: raised to 64
 * KiB, then launched with it (passes); a limit above 227 KiB is refused.
 * smem_short: raised to 64 KiB, launched with 96 (aborts). smem_over:
 * raised to 227 KiB, launched with 228 (aborts). */
static int smem(const char *which)
{
    const size_t k64 = 64u << 10, k96 = 96u << 10, k227 = 227u << 10, k228 = 228u << 10;
    float *out = dev_floats(128, nullptr);
    cudaStream_t st = nullptr;
    size_t bytes = k64;
    if (!strcmp(which, "smem_attr")) {
        CHECK(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)k228) != cudaSuccess,
              "a limit of 228 KiB was accepted");
        CHECK(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)k64) == cudaSuccess);
    } else if (!strcmp(which, "smem_short")) {
        cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k64);
        bytes = k96;
    } else if (!strcmp(which, "smem_over")) {
        CHECK(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)k227) == cudaSuccess);
        bytes = k228;
    }
    int n = (int)(bytes / sizeof(float));
    KN_EMU_LAUNCH(k_big_smem, 1, 128, bytes, st, out, n);
    int bad = 0;
    for (int t = 0; t < 128; t++) {
        double want = 0;
        for (int i = t; i < n; i += 128)
            want += n - 1 - i;
        bad += out[t] != (float)want;
    }
    cudaFree(out);
    return ty_failures ? 1 : bad ? WRONG : 0;
}

static int run_case(const char *name)
{
    if (!strcmp(name, "race") || !strcmp(name, "race_fixed"))
        return race(!strcmp(name, "race_fixed"));
    if (!strcmp(name, "reuse") || !strcmp(name, "reuse_fixed"))
        return reuse(!strcmp(name, "reuse_fixed"));
    if (!strncmp(name, "mask_", 5)) return mask_case(name);
    if (!strcmp(name, "butterfly")) return butterfly();
    if (!strcmp(name, "half_warps")) return half_warps();
    if (!strncmp(name, "smem_", 5)) return smem(name);
    if (!strcmp(name, "grid_small")) return emu_grid_pick(8, 256) == 8 ? 0 : WRONG;
    if (!strcmp(name, "grid_real")) return emu_grid_pick(8, 256) == 256 ? 0 : WRONG;
    fprintf(stderr, "unknown case %s\n", name);
    return 2;
}

/* ---- the driver ------------------------------------------------------------- */

enum outcome { PASSES, WRONG_RESULT, ABORTS };

/* Runs `self name` with TY_EMU_ORDER / TY_EMU_GRID as given (NULL: unset);
 * returns its wait status and its output in *out. */
static int spawn(const char *self, const char *name, const char *order, const char *grid,
                 std::string *out)
{
    int fd[2];
    if (pipe(fd)) {
        perror("pipe");
        exit(2);
    }
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        unsetenv("TY_EMU_ORDER");
        unsetenv("TY_EMU_GRID");
        if (order) setenv("TY_EMU_ORDER", order, 1);
        if (grid) setenv("TY_EMU_GRID", grid, 1);
        execl(self, self, name, (char *)nullptr);
        _exit(127);
    }
    close(fd[1]);
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0)
        out->append(buf, (size_t)k);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* One expectation: case `name` under the order ends as `want`; an abort's
 * output must hold each of the (up to three) fragments. */
static void expect(const char *self, const char *name, const char *order, const char *grid,
                   outcome want, const char *f1 = nullptr, const char *f2 = nullptr,
                   const char *f3 = nullptr)
{
    std::string out;
    int st = spawn(self, name, order, grid, &out);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    const char *ord = order ? order : "(unset)";
    if (want == PASSES)
        CHECK(code == 0, "%s under %s: status %d, expected to pass:\n%s", name, ord, st,
              out.c_str());
    else if (want == WRONG_RESULT)
        CHECK(code == WRONG, "%s under %s: status %d, expected wrong results:\n%s", name, ord, st,
              out.c_str());
    else
        CHECK(aborted, "%s under %s: status %d, expected an abort:\n%s", name, ord, st,
              out.c_str());
    for (const char *f : {f1, f2, f3})
        if (f)
            CHECK(out.find(f) != std::string::npos, "%s under %s: no \"%s\" in:\n%s", name, ord, f,
                  out.c_str());
    printf("%-12s %-10s %s\n", name, ord,
           code == 0       ? "passes"
           : code == WRONG ? "wrong results"
           : aborted       ? "aborts"
                           : "?");
}

int main(int argc, char **argv)
{
    if (argc > 1) return run_case(argv[1]);
    const char *self = "/proc/self/exe";
    const char *orders[] = {"forward", "reverse", "shuffle:1", "shuffle:2"};
    const char *catching[] = {"reverse", "shuffle:1", "shuffle:2"};
    /* (a) the neighbour race: unseen in index order, caught in the others. */
    expect(self, "race", "forward", nullptr, PASSES);
    for (const char *o : catching)
        expect(self, "race", o, nullptr, WRONG_RESULT);
    /* A missing barrier between two uses of one shared array: only warps
     * running ahead of each other (shuffle's holds) show it. */
    expect(self, "reuse", "forward", nullptr, PASSES);
    expect(self, "reuse", "shuffle:1", nullptr, WRONG_RESULT);
    expect(self, "reuse", "shuffle:2", nullptr, WRONG_RESULT);
    /* The correct kernels, (e) the end-of-kernel butterfly among them. */
    for (const char *o : orders)
        for (const char *c : {"race_fixed", "reuse_fixed", "butterfly", "half_warps"})
            expect(self, c, o, nullptr, PASSES);
    /* (b), (c) and a caller outside its own mask. */
    for (const char *o : {"forward", "shuffle:1"}) {
        expect(self, "mask_exited", o, nullptr, ABORTS, "k_sum_after_return", "names lane 16",
               "has exited");
        expect(self, "mask_outside", o, nullptr, ABORTS, "k_read_outside_mask",
               "lane 0 (thread 0) reads lane 16", "outside the mask 0x0000ffff");
        expect(self, "mask_self", o, nullptr, ABORTS, "k_mask_without_caller", "lane 5",
               "leaves it out");
    }
    /* Warp operations that can never complete: a GPU hangs. */
    expect(self, "mask_mismatch", "reverse", nullptr, ABORTS, "k_mask_mismatch",
           "with mask 0x00000003 for lane 1", "which waits in __shfl_sync with mask 0x00000007");
    expect(self, "mask_divergent", "reverse", nullptr, ABORTS, "k_divergent", "divergent barrier",
           "at __syncthreads");
    /* (d) dynamic shared memory. */
    expect(self, "smem_no_attr", nullptr, nullptr, ABORTS, "k_big_smem", "65536 bytes",
           "cudaFuncSetAttribute");
    expect(self, "smem_attr", nullptr, nullptr, PASSES);
    expect(self, "smem_short", nullptr, nullptr, ABORTS, "k_big_smem", "98304 bytes",
           "limit of 65536");
    expect(self, "smem_over", nullptr, nullptr, ABORTS, "k_big_smem", "233472 bytes",
           "above the 232448");
    /* The settings themselves. */
    expect(self, "grid_small", nullptr, nullptr, PASSES);
    expect(self, "grid_real", nullptr, "real", PASSES);
    expect(self, "grid_small", nullptr, "bogus", ABORTS, "TY_EMU_GRID=bogus");
    expect(self, "butterfly", "sideways", nullptr, ABORTS, "TY_EMU_ORDER=sideways");
    expect(self, "butterfly", "shuffle:", nullptr, ABORTS, "TY_EMU_ORDER=shuffle:");
    fflush(stdout);
    return ty_summary("kernels.cuda_emu.strict");
}
