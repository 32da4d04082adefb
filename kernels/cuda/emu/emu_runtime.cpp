/* emu_runtime.cpp — the launch scheduler and runtime calls of cuda_emu.h.
 *
 * A launch hands blocks to OpenMP threads in a static order (every block is
 * independent on a GPU too). One OS thread runs a block as blockDim fibers
 * (ucontext, stacks reused across launches) and a scheduler loop: run every
 * runnable fiber until it parks (barrier, shuffle) or ends; then release a
 * warp whose live lanes all wait on a shuffle, else the block if all its
 * live threads wait on __syncthreads. Nothing runnable and nothing to
 * release means a divergent barrier: a GPU would hang, we abort.
 * Under AddressSanitizer every switch is announced with
 * __sanitizer_{start,finish}_switch_fiber so it tracks the fiber stacks. */
#include "cuda_emu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unistd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
/* A fiber's stack. Kernels keep at most a few KiB of locals (attention's
 * per-thread rows); ASan clears the shadow of the whole target stack on
 * every swapcontext, so a small stack is also what keeps a switch cheap. */
#define EMU_STACK (64u << 10)

/* The launch geometry of the block this OS thread runs. Read through
 * functions returning values: the kernels see rvalues, as with CUDA's
 * read-only built-ins. */
static thread_local emu_uint3 g_block_idx, g_block_dim, g_grid_dim;

namespace {

enum fstate { RUN, BAR, SHFL, DONE };

struct fiber {
    ucontext_t ctx;
    char *stack;
    emu_uint3 tid;
    fstate st;
    void *fake_stack; /* ASan's fake-stack handle while switched out */
};

struct block_run {
    std::vector<fiber> f;
    ucontext_t sched;
    int cur;
    unsigned n;
    const std::function<void()> *body;
    std::vector<unsigned char> smem;
    /* shuffle slots: [parity][thread]; each fiber flips its own parity */
    std::vector<uint64_t> slot[2];
    std::vector<unsigned char> parity;
    const void *sched_bottom;
    size_t sched_size;
};

thread_local block_run *g_run;
thread_local cudaError_t g_last_error;

__attribute__((noinline)) void switch_to_sched(fiber &me)
{
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(me.st == DONE ? nullptr : &me.fake_stack, g_run->sched_bottom,
                                   g_run->sched_size);
#endif
    swapcontext(&me.ctx, &g_run->sched);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(me.fake_stack, &g_run->sched_bottom, &g_run->sched_size);
#endif
}

void trampoline(void)
{
    block_run *r = g_run;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_bottom, &r->sched_size);
#endif
    (*r->body)();
    fiber &me = r->f[r->cur];
    me.st = DONE;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, r->sched_bottom, r->sched_size);
#endif
    setcontext(&r->sched);
}

__attribute__((noinline)) void run_fiber(block_run *r, unsigned t)
{
    fiber &fb = r->f[t];
    r->cur = (int)t;
    fb.st = RUN;
#ifdef EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, fb.stack, EMU_STACK);
#endif
    swapcontext(&r->sched, &fb.ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* One OS thread's reusable fiber set. */
block_run &thread_run(unsigned n)
{
    static thread_local block_run r;
    while (r.f.size() < n) {
        fiber fb{};
        fb.stack = (char *)mmap(nullptr, EMU_STACK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (fb.stack == MAP_FAILED) {
            fprintf(stderr, "cuda-emu: cannot map a fiber stack\n");
            abort();
        }
        r.f.push_back(fb);
    }
    r.slot[0].resize(n);
    r.slot[1].resize(n);
    r.parity.assign(n, 0);
    r.n = n;
    return r;
}

/* Apart from run_block: getcontext returns twice, which would make the
 * compiler assume the caller's loop variables clobbered. */
__attribute__((noinline)) void init_fiber(fiber &fb, unsigned t)
{
    unsigned x = g_block_dim.x, y = g_block_dim.y;
    fb.tid = emu_uint3{t % x, (t / x) % y, t / (x * y)};
    getcontext(&fb.ctx);
    fb.ctx.uc_stack.ss_sp = fb.stack;
    fb.ctx.uc_stack.ss_size = EMU_STACK;
    fb.ctx.uc_link = nullptr;
    makecontext(&fb.ctx, trampoline, 0);
    fb.st = RUN;
}

void run_block(block_run &r)
{
    for (unsigned t = 0; t < r.n; t++) {
        init_fiber(r.f[t], t);
        r.parity[t] = 0;
    }
    for (;;) {
        for (unsigned t = 0; t < r.n; t++)
            if (r.f[t].st == RUN)
                run_fiber(&r, t);
        /* Release one warp whose live lanes all wait on a shuffle. */
        int released = 0, live = 0, at_bar = 0;
        for (unsigned w = 0; w * 32 < r.n; w++) {
            unsigned lo = w * 32, hi = lo + 32 < r.n ? lo + 32 : r.n;
            int wl = 0, ws = 0;
            for (unsigned t = lo; t < hi; t++) {
                wl += r.f[t].st != DONE;
                ws += r.f[t].st == SHFL;
            }
            if (ws && ws == wl) {
                for (unsigned t = lo; t < hi; t++)
                    if (r.f[t].st == SHFL)
                        r.f[t].st = RUN;
                released = 1;
            }
        }
        if (released)
            continue;
        for (unsigned t = 0; t < r.n; t++) {
            live += r.f[t].st != DONE;
            at_bar += r.f[t].st == BAR;
        }
        if (!live)
            return;
        if (at_bar != live) {
            fprintf(stderr, "cuda-emu: divergent barrier in block (%u,%u,%u): %d of %d live "
                            "threads at __syncthreads, the rest at a warp shuffle\n",
                    g_block_idx.x, g_block_idx.y, g_block_idx.z, at_bar, live);
            abort();
        }
        for (unsigned t = 0; t < r.n; t++)
            if (r.f[t].st == BAR)
                r.f[t].st = RUN;
    }
}

} // namespace

emu_uint3 emu_thread_idx(void) { return g_run->f[g_run->cur].tid; }
emu_uint3 emu_block_idx(void) { return g_block_idx; }
emu_uint3 emu_block_dim(void) { return g_block_dim; }
emu_uint3 emu_grid_dim(void) { return g_grid_dim; }
void *emu_dyn_shared(void) { return g_run->smem.data(); }
int emu_lane(void) { return g_run->cur % 32; }

void __syncthreads(void)
{
    fiber &me = g_run->f[g_run->cur];
    me.st = BAR;
    switch_to_sched(me);
}

uint64_t emu_shfl_exchange(uint64_t mine, int src_lane)
{
    block_run *r = g_run;
    int t = r->cur, base = t - t % 32, src = base + src_lane;
    int par = r->parity[t];
    r->slot[par][t] = mine;
    r->parity[t] ^= 1;
    fiber &me = r->f[t];
    me.st = SHFL;
    switch_to_sched(me);
    if (src < 0 || (unsigned)src >= r->n || r->f[src].st == DONE) {
        fprintf(stderr, "cuda-emu: shuffle reads lane %d, which does not take part\n", src_lane);
        abort();
    }
    return r->slot[par][src];
}

/* ---- the device memory guard (TY_EMU_GUARD=1) ---------------------------
 * On a GPU the host cannot read device memory; here it could, so host code
 * that dereferences a device pointer (a bug that would crash on the GPU)
 * would pass. With TY_EMU_GUARD=1 every cudaMalloc block is its own mapping,
 * PROT_NONE except while the emulated device works (a launch, a copy, a
 * memset, a cuBLASLt call): host code touching it then faults in CI. The
 * engine's device-path tests (engine.device.*) run with it on. */
static bool guard_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("TY_EMU_GUARD");
        on = v && v[0] == '1';
    }
    return on;
}
struct emu_region {
    void *p;
    size_t n;
};
static std::vector<emu_region> g_regions;
static std::mutex g_region_mu;
static int g_device_open; /* nesting depth of emu_device_enter */

static void protect_all(int prot)
{
    for (const emu_region &r : g_regions)
        if (mprotect(r.p, r.n, prot)) {
            perror("cuda-emu: mprotect");
            abort();
        }
}
void emu_device_enter(void)
{
    if (!guard_on())
        return;
    std::lock_guard<std::mutex> l(g_region_mu);
    if (g_device_open++ == 0)
        protect_all(PROT_READ | PROT_WRITE);
}
void emu_device_leave(void)
{
    if (!guard_on())
        return;
    std::lock_guard<std::mutex> l(g_region_mu);
    if (--g_device_open == 0)
        protect_all(PROT_NONE);
}

int emu_launch(dim3 grid, dim3 block, size_t dyn_smem, const std::function<void()> &body)
{
    unsigned long nb = (unsigned long)grid.x * grid.y * grid.z;
    unsigned nt = block.x * block.y * block.z;
    if (!nb || !nt || nt > 1024 || dyn_smem > (227u << 10))
        return -1;
    emu_device_guard dg;
#pragma omp parallel for schedule(static)
    for (unsigned long b = 0; b < nb; b++) {
        g_grid_dim = emu_uint3{grid.x, grid.y, grid.z};
        g_block_dim = emu_uint3{block.x, block.y, block.z};
        g_block_idx = emu_uint3{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                                  (unsigned)(b / ((unsigned long)grid.x * grid.y))};
        block_run &r = thread_run(nt);
        r.body = &body;
        /* Fresh shared memory per block: poisoned with NaN-ish bytes so a
         * kernel that reads before writing shows it. */
        r.smem.assign(dyn_smem ? dyn_smem : 1, 0xff);
        g_run = &r;
        run_block(r);
        g_run = nullptr;
    }
    return 0;
}

/* ---- runtime API --------------------------------------------------------- */

struct emu_stream {
    int unused;
};

void emu_set_last_error(cudaError_t e) { g_last_error = e; }
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "invalid argument";
    }
}
/* The emulated machine, for the engine's device-selection tests:
 * TY_EMU_DEVICES (default 1) devices of compute capability TY_EMU_CC
 * (default "9.0"), all alike. */
static int emu_devices(void)
{
    const char *v = getenv("TY_EMU_DEVICES");
    return v && *v ? atoi(v) : 1;
}
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = emu_devices();
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int dev)
{
    return dev >= 0 && dev < emu_devices() ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    if (dev < 0 || dev >= emu_devices())
        return cudaErrorInvalidValue;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda-emu (host fibers)");
    p->totalGlobalMem = (size_t)1 << 34;
    p->major = 9;
    p->minor = 0;
    const char *cc = getenv("TY_EMU_CC");
    if (cc && *cc && sscanf(cc, "%d.%d", &p->major, &p->minor) != 2)
        p->major = 9, p->minor = 0;
    p->multiProcessorCount = 1;
    p->sharedMemPerBlockOptin = 227u << 10;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 0;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 0;
    return cudaSuccess;
}
/* ---- what the host side did, for tests ------------------------------------

 * With TY_EMU_STATS=<file>, the process writes at exit how many device
 * allocations (cudaMalloc), pinned host allocations (cudaMallocHost),
 * device-to-host copies and host-to-device copies from pageable (not
 * pinned) memory it made. engine.device.emu_stats compares runs of
 * different lengths and accumulation: no allocation and no pageable copy
 * in the step loop, and the loss read back once per step, not once per
 * micro-batch (issue 11's memory rules). */
namespace {
struct emu_stats {
    std::mutex mu;
    std::vector<std::pair<const char *, size_t>> pinned;
    long malloc_n = 0, host_n = 0, d2h = 0, h2d_pageable = 0;
    bool is_pinned(const void *p)
    {
        for (auto &r : pinned)
            if ((const char *)p >= r.first && (const char *)p < r.first + r.second)
                return true;
        return false;
    }
    ~emu_stats()
    {
        const char *path = getenv("TY_EMU_STATS");
        FILE *f = path && *path ? fopen(path, "w") : nullptr;
        if (!f)
            return;
        fprintf(f, "malloc %ld\nhost_alloc %ld\nd2h %ld\nh2d_pageable %ld\n", malloc_n, host_n,
                d2h, h2d_pageable);
        fclose(f);
    }
};
emu_stats g_stats;
} // namespace

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    {
        std::lock_guard<std::mutex> l(g_stats.mu);
        g_stats.malloc_n++;
    }
    if (guard_on()) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + pg - 1) / pg * pg;
        std::lock_guard<std::mutex> l(g_region_mu);
        void *m = mmap(nullptr, n ? n : pg, g_device_open ? PROT_READ | PROT_WRITE : PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return cudaErrorMemoryAllocation;
        g_regions.push_back(emu_region{m, n ? n : pg});
        *p = m;
        return cudaSuccess;
    }
    size_t r = (bytes + 255) / 256 * 256;
    *p = aligned_alloc(256, r ? r : 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    if (guard_on()) {
        std::lock_guard<std::mutex> l(g_region_mu);
        for (size_t i = 0; i < g_regions.size(); i++)
            if (g_regions[i].p == p) {
                munmap(p, g_regions[i].n);
                g_regions.erase(g_regions.begin() + (long)i);
                return cudaSuccess;
            }
        return p ? cudaErrorInvalidValue : cudaSuccess;
    }
    free(p);
    return cudaSuccess;
}
/* Host memory (pinned on a GPU) is never guarded. */
cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    size_t r = (bytes + 255) / 256 * 256;
    *p = aligned_alloc(256, r ? r : 256);
    if (!*p)
        return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> l(g_stats.mu);
    g_stats.host_n++;
    g_stats.pinned.push_back({(const char *)*p, r ? r : 256});
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
    {
        std::lock_guard<std::mutex> l(g_stats.mu);
        for (size_t i = 0; i < g_stats.pinned.size(); i++)
            if (g_stats.pinned[i].first == p) {
                g_stats.pinned.erase(g_stats.pinned.begin() + (long)i);
                break;
            }
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t)
{
    emu_device_guard dg;
    if (bytes)
        memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t)
{
    {
        std::lock_guard<std::mutex> l(g_stats.mu);
        if (kind == cudaMemcpyDeviceToHost)
            g_stats.d2h++;
        else if (kind == cudaMemcpyHostToDevice && !g_stats.is_pinned(s))
            g_stats.h2d_pageable++;
    }
    emu_device_guard dg;
    if (bytes)
        memmove(d, s, bytes);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = new emu_stream{0};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void *, int, int) { return cudaSuccess; }
/* The emulated device's memory is the host's; its total is the 16 GiB
 * cudaGetDeviceProperties reports. In use: with TY_EMU_GUARD=1 every live
 * cudaMalloc block (each its own mapping, page-rounded); without the guard
 * the blocks are plain heap memory, so the process's resident set stands
 * for them. Capped at the total. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    size_t total = (size_t)1 << 34, used = 0;
    if (guard_on()) {
        std::lock_guard<std::mutex> l(g_region_mu);
        for (const emu_region &r : g_regions)
            used += r.n;
    } else {
        long size = 0, resident = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f) {
            if (fscanf(f, "%ld %ld", &size, &resident) == 2)
                used = (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
            fclose(f);
        }
    }
    if (used > total)
        used = total;
    *free_bytes = total - used;
    *total_bytes = total;
    return cudaSuccess;
}
