/* emu_runtime.cpp — the launch scheduler and runtime calls of cuda_emu.h.
 *
 * A launch hands blocks to OpenMP threads in a static order (every block is
 * independent on a GPU too). One OS thread runs a block as blockDim fibers
 * (ucontext, stacks reused across launches) and a scheduler loop of rounds:
 * run every runnable fiber until it parks (barrier, warp operation) or
 * ends, in the order TY_EMU_ORDER gives; then release each group of lanes
 * whose warp operation is complete (every lane its mask names has posted),
 * else the block if all its live threads wait on __syncthreads. Nothing
 * runnable and nothing to release means a divergent barrier or a warp
 * operation that can never complete: a GPU would hang, we abort.
 *
 * The order is what makes the emulation find missing barriers: a GPU runs
 * a block's warps in no fixed order and, since Volta, a warp's lanes too,
 * so a thread reading another's shared-memory write without a barrier in
 * between sees it or not by chance. Run in index order that read always
 * works when the writer has the lower index; under `reverse` (and under
 * most `shuffle:SEED` draws) it reads the stale value instead, and the
 * kernel's result is wrong. A warp operation's result is computed at its
 * release from what each lane posted then, so a lane may leave the kernel
 * right after it without taking the others' values with it.
 * Under AddressSanitizer every switch is announced with
 * __sanitizer_{start,finish}_switch_fiber so it tracks the fiber stacks. */
#include "cuda_emu.h"

#include <cstdio>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <unistd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <utility>
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
/* Dynamic shared memory a kernel may ask for: 48 KiB unless
 * cudaFuncSetAttribute raised its limit, never above sm_90's 227 KiB. */
#define EMU_SMEM_DEFAULT (48u << 10)
#define EMU_SMEM_OPTIN (227u << 10)

/* The launch geometry of the block this OS thread runs. Read through
 * functions returning values: the kernels see rvalues, as with CUDA's
 * read-only built-ins. */
static thread_local emu_uint3 g_block_idx, g_block_dim, g_grid_dim;

namespace {

/* ---- TY_EMU_ORDER ---------------------------------------------------------- */

enum order_kind { ORDER_FORWARD, ORDER_REVERSE, ORDER_SHUFFLE };
struct run_order {
    order_kind kind;
    unsigned long long seed;
};

run_order parse_order(const char *v)
{
    run_order o = {ORDER_FORWARD, 0};
    if (!v || !*v || !strcmp(v, "forward"))
        return o;
    if (!strcmp(v, "reverse")) {
        o.kind = ORDER_REVERSE;
        return o;
    }
    if (!strncmp(v, "shuffle:", 8) && v[8] >= '0' && v[8] <= '9') {
        char *end = nullptr;
        o.kind = ORDER_SHUFFLE;
        o.seed = strtoull(v + 8, &end, 10);
        if (!*end)
            return o;
    }
    fprintf(stderr, "cuda-emu: TY_EMU_ORDER=%s: expected forward, reverse or shuffle:SEED "
                    "(SEED a decimal integer)\n", v);
    abort();
}

/* Read once: every launch of the process runs under the same order. */
const run_order &order(void)
{
    static const run_order o = parse_order(getenv("TY_EMU_ORDER"));
    return o;
}

uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The shuffle's random stream for one block and round (and purpose), so a
 * run repeats exactly for a given seed whatever the OpenMP threads do. */
uint64_t order_stream(unsigned long block, uint64_t round, uint64_t purpose)
{
    return order().seed ^ (block * 0xd1b54a32d192ed03ULL) ^ (round * 0x8cb92ba72f3d8dd7ULL) ^
           purpose;
}

/* Puts the round's runnable threads (ascending) in the order to run them. */
void order_round(std::vector<unsigned> &ready, unsigned long block, uint64_t round)
{
    const run_order &o = order();
    if (o.kind == ORDER_REVERSE) {
        for (size_t i = 0, j = ready.size(); i + 1 < j; i++, j--)
            std::swap(ready[i], ready[j - 1]);
    } else if (o.kind == ORDER_SHUFFLE) {
        uint64_t s = order_stream(block, round, 0);
        for (size_t i = ready.size(); i > 1; i--)
            std::swap(ready[i - 1], ready[splitmix64(&s) % i]);
    }
}

/* ---- fibers ----------------------------------------------------------------- */

enum fstate { RUN, BAR, WARP, DONE };

/* A cp.async copy in flight: its bytes, taken at issue, land in dst when
 * a wait releases its group. */
struct emu_cp {
    void *dst;
    unsigned char data[16];
    unsigned group;
};

struct fiber {
    ucontext_t ctx;
    char *stack;
    emu_uint3 tid;
    fstate st;
    unsigned hold;    /* rounds a runnable fiber still sits out (shuffle) */
    void *fake_stack; /* ASan's fake-stack handle while switched out */
    /* The warp operation it waits in (st == WARP): */
    int kind;         /* EMU_WARP_* */
    const char *what; /* the intrinsic, for messages */
    unsigned mask;
    int src;      /* the lane a shuffle reads */
    uint64_t val; /* what this lane posted */
    uint64_t got; /* what the operation gives it, set at the release */
    /* cp.async: its copies in flight, and the group they join (commits so far) */
    std::vector<emu_cp> cp;
    unsigned cp_group;
};

struct block_run {
    std::vector<fiber> f;
    std::vector<unsigned> ready; /* the round's runnable threads, in run order */
    ucontext_t sched;
    int cur;
    unsigned n;
    const std::function<void()> *body;
    const char *kernel;
    unsigned long block; /* linear block index */
    uint64_t round;
    std::vector<unsigned char> smem;
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
    r.ready.reserve(n);
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
    fb.cp.clear();
    fb.cp_group = 0;
}

/* "cuda-emu: <kernel>, block (x,y,z): " before every message about a block. */
__attribute__((format(printf, 2, 3))) [[noreturn]] void block_abort(const block_run &r,
                                                                    const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda-emu: %s, block (%u,%u,%u): %s\n", r.kernel, g_block_idx.x,
            g_block_idx.y, g_block_idx.z, msg);
    abort();
}

/* Under shuffle, each warp a barrier releases (or the launch starts) sits
 * out 0..EMU_HOLD_MAX rounds, the same for all its lanes: the other warps
 * run ahead through their shuffles meanwhile, as a slow warp lets them on
 * a GPU. A shared-memory slot reused without a barrier between (one warp
 * writing the next value before another has read the last) shows then;
 * within a round the permutation alone never separates the warps by more
 * than one park. */
#define EMU_HOLD_MAX 15
void draw_holds(block_run &r)
{
    if (order().kind != ORDER_SHUFFLE)
        return;
    uint64_t s = order_stream(r.block, r.round, 0x5851f42d4c957f2dULL);
    for (unsigned w = 0; w * 32 < r.n; w++) {
        unsigned h = (unsigned)(splitmix64(&s) % (EMU_HOLD_MAX + 1));
        for (unsigned t = w * 32; t < r.n && t < w * 32 + 32; t++)
            r.f[t].hold = h;
    }
}

/* Runs every runnable fiber not sitting out once, until it parks or ends.
 * No fiber can make another runnable (only the scheduler releases), so the
 * list is fixed. When all sit out, the shortest hold is skipped. */
void run_round(block_run &r)
{
    unsigned least = ~0u;
    r.ready.clear();
    for (unsigned t = 0; t < r.n; t++)
        if (r.f[t].st == RUN) {
            if (!r.f[t].hold)
                r.ready.push_back(t);
            else if (r.f[t].hold < least)
                least = r.f[t].hold;
        }
    if (r.ready.empty() && least != ~0u)
        for (unsigned t = 0; t < r.n; t++)
            if (r.f[t].st == RUN && (r.f[t].hold -= least) == 0)
                r.ready.push_back(t);
    order_round(r.ready, r.block, r.round++);
    for (unsigned t : r.ready)
        run_fiber(&r, t);
    for (unsigned t = 0; t < r.n; t++)
        if (r.f[t].st == RUN && r.f[t].hold)
            r.f[t].hold--;
}

/* Whether the warp operation lane t waits in can complete: every lane its
 * mask names waits in the same kind of operation with the same mask. A
 * named lane that has exited (or that the block does not have) never will:
 * abort. Otherwise *blocker is the first named lane still elsewhere. */
bool warp_ready(const block_run &r, unsigned t, unsigned *blocker)
{
    const fiber &me = r.f[t];
    unsigned base = t - t % 32;
    for (unsigned l = 0; l < 32; l++) {
        if (!(me.mask >> l & 1))
            continue;
        if (base + l >= r.n)
            block_abort(r, "lane %u's %s mask 0x%08x names lane %u, which the block of %u "
                           "threads does not have", t % 32, me.what, me.mask, l, r.n);
        const fiber &o = r.f[base + l];
        if (o.st == DONE)
            block_abort(r, "lane %u's %s mask 0x%08x names lane %u (thread %u), which has "
                           "exited", t % 32, me.what, me.mask, l, base + l);
        if (o.st != WARP || o.kind != me.kind || o.mask != me.mask) {
            *blocker = base + l;
            return false;
        }
    }
    return true;
}

/* Completes the warp operation of the lanes lane t's mask names: each gets
 * its result from the values posted now, and runs again. */
void warp_release(block_run &r, unsigned t)
{
    unsigned base = t - t % 32, mask = r.f[t].mask;
    uint64_t ballot = 0;
    for (unsigned l = 0; l < 32; l++)
        if (mask >> l & 1 && r.f[base + l].val)
            ballot |= 1ull << l;
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1))
            continue;
        fiber &o = r.f[base + l];
        if (o.kind == EMU_WARP_SHFL)
            o.got = r.f[base + (unsigned)o.src].val;
        else if (o.kind == EMU_WARP_BALLOT)
            o.got = ballot;
        o.st = RUN;
    }
}

/* Says why nothing can run any more, and aborts. */
[[noreturn]] void block_stuck(const block_run &r)
{
    int live = 0, at_bar = 0;
    for (unsigned t = 0; t < r.n; t++) {
        live += r.f[t].st != DONE;
        at_bar += r.f[t].st == BAR;
    }
    for (unsigned t = 0; t < r.n; t++) {
        unsigned b = 0;
        if (r.f[t].st != WARP || warp_ready(r, t, &b))
            continue;
        const fiber &me = r.f[t], &o = r.f[b];
        if (o.st == BAR)
            block_abort(r, "divergent barrier: %d of %d live threads at __syncthreads, lane %u "
                           "(thread %u) waits in %s (mask 0x%08x) for lane %u (thread %u) which "
                           "is at __syncthreads", at_bar, live, t % 32, t, me.what, me.mask,
                        b % 32, b);
        block_abort(r, "lane %u (thread %u) waits in %s with mask 0x%08x for lane %u (thread %u), "
                       "which waits in %s with mask 0x%08x", t % 32, t, me.what, me.mask, b % 32,
                    b, o.what, o.mask);
    }
    block_abort(r, "divergent barrier: %d of %d live threads at __syncthreads", at_bar, live);
}

void run_block(block_run &r)
{
    r.round = 0;
    for (unsigned t = 0; t < r.n; t++) {
        init_fiber(r.f[t], t);
        r.f[t].hold = 0;
    }
    draw_holds(r);
    for (;;) {
        run_round(r);
        int released = 0, live = 0, at_bar = 0, held = 0;
        for (unsigned t = 0; t < r.n; t++) {
            unsigned blocker;
            if (r.f[t].st == WARP && warp_ready(r, t, &blocker)) {
                warp_release(r, t);
                released = 1;
            }
            held += r.f[t].st == RUN;
        }
        if (released || held)
            continue;
        for (unsigned t = 0; t < r.n; t++) {
            live += r.f[t].st != DONE;
            at_bar += r.f[t].st == BAR;
        }
        if (!live)
            return;
        if (at_bar != live)
            block_stuck(r);
        for (unsigned t = 0; t < r.n; t++)
            if (r.f[t].st == BAR)
                r.f[t].st = RUN;
        draw_holds(r);
    }
}

} // namespace

emu_uint3 emu_thread_idx(void) { return g_run->f[g_run->cur].tid; }
emu_uint3 emu_block_idx(void) { return g_block_idx; }
emu_uint3 emu_block_dim(void) { return g_block_dim; }
emu_uint3 emu_grid_dim(void) { return g_grid_dim; }
/* The GPU starts a block's dynamic shared memory on an aligned address
 * (wmma's tiles need 32 bytes); a vector's data is only malloc's 16. */
enum { EMU_SMEM_ALIGN = 128 };
void *emu_dyn_shared(void)
{
    uintptr_t p = (uintptr_t)g_run->smem.data();
    return (void *)((p + EMU_SMEM_ALIGN - 1) / EMU_SMEM_ALIGN * EMU_SMEM_ALIGN);
}
int emu_lane(void) { return g_run->cur % 32; }

void emu_cp_async16(void *dst, const void *src)
{
    fiber &me = g_run->f[g_run->cur];
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16)
        block_abort(*g_run, "thread %d: cp.async of 16 bytes from %p to %p: both must be "
                            "16-byte aligned",
                    g_run->cur, src, dst);
    if (order().kind != ORDER_FORWARD) { /* lands at once: a refill before a barrier shows */
        memcpy(dst, src, 16);
        return;
    }
    emu_cp c; /* lands at the wait: a read before it shows */
    c.dst = dst;
    memcpy(c.data, src, 16);
    c.group = me.cp_group;
    me.cp.push_back(c);
}

void emu_cp_commit(void) { g_run->f[g_run->cur].cp_group++; }

/* Lands every copy of a committed group but the newest n, in issue order. */
void emu_cp_wait(int n)
{
    fiber &me = g_run->f[g_run->cur];
    size_t keep = 0;
    for (size_t i = 0; i < me.cp.size(); i++) {
        emu_cp &c = me.cp[i];
        if (c.group + (unsigned)n < me.cp_group)
            memcpy(c.dst, c.data, 16);
        else
            me.cp[keep++] = c;
    }
    me.cp.resize(keep);
}

void __syncthreads(void)
{
    fiber &me = g_run->f[g_run->cur];
    me.st = BAR;
    switch_to_sched(me);
}

/* What the caller can be told at once (its own mask, the lane it reads) is
 * checked here; whether the named lanes arrive, at the release. */
uint64_t emu_warp_op(int kind, const char *what, unsigned mask, uint64_t mine, int src_lane)
{
    block_run *r = g_run;
    unsigned t = (unsigned)r->cur, lane = t % 32;
    if (!(mask >> lane & 1))
        block_abort(*r, "lane %u (thread %u) calls %s with mask 0x%08x, which leaves it out", lane,
                    t, what, mask);
    if (kind == EMU_WARP_SHFL && (src_lane < 0 || src_lane > 31 || !(mask >> src_lane & 1)))
        block_abort(*r, "lane %u (thread %u) reads lane %d in %s, outside the mask 0x%08x", lane,
                    t, src_lane, what, mask);
    fiber &me = r->f[t];
    me.kind = kind;
    me.what = what;
    me.mask = mask;
    me.src = src_lane;
    me.val = mine;
    me.st = WARP;
    switch_to_sched(me);
    return me.got;
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

/* ---- launch rules ------------------------------------------------------------ */

/* Each kernel's dynamic shared memory limit, as cudaFuncSetAttribute set it. */
static std::vector<std::pair<const void *, int>> g_smem_limits;
static std::mutex g_smem_mu;

static size_t smem_limit(const void *fn)
{
    std::lock_guard<std::mutex> l(g_smem_mu);
    for (auto &e : g_smem_limits)
        if (e.first == fn)
            return (size_t)e.second;
    return EMU_SMEM_DEFAULT;
}

cudaError_t cudaFuncSetAttribute(const void *f, int attr, int value)
{
    if (!f || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (unsigned)value > EMU_SMEM_OPTIN)
        return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> l(g_smem_mu);
    for (auto &e : g_smem_limits)
        if (e.first == f) {
            e.second = value;
            return cudaSuccess;
        }
    g_smem_limits.push_back({f, value});
    return cudaSuccess;
}

/* A GPU refuses the launch (a sticky error the kernel tests would report
 * far from the cause); the emulation stops at it. */
static void check_dyn_smem(const char *kernel, const void *fn, size_t bytes)
{
    if (bytes > EMU_SMEM_OPTIN) {
        fprintf(stderr, "cuda-emu: %s: %zu bytes of dynamic shared memory, above the %u an sm_90 "
                        "block may have\n", kernel, bytes, EMU_SMEM_OPTIN);
        abort();
    }
    size_t lim = bytes > EMU_SMEM_DEFAULT ? smem_limit(fn) : EMU_SMEM_DEFAULT;
    if (bytes > lim) {
        fprintf(stderr, "cuda-emu: %s: %zu bytes of dynamic shared memory, above its limit of %zu "
                        "(above %u needs cudaFuncSetAttribute(%s, "
                        "cudaFuncAttributeMaxDynamicSharedMemorySize, n) first)\n",
                kernel, bytes, lim, EMU_SMEM_DEFAULT, kernel);
        abort();
    }
}

/* Read once, as the kernels' grid shapes must not change under a context. */
unsigned emu_grid_pick(unsigned small, unsigned real)
{
    static const int is_real = [] {
        const char *v = getenv("TY_EMU_GRID");
        if (!v || !*v || !strcmp(v, "small"))
            return 0;
        if (!strcmp(v, "real"))
            return 1;
        fprintf(stderr, "cuda-emu: TY_EMU_GRID=%s: expected small or real\n", v);
        abort();
    }();
    return is_real ? real : small;
}

int emu_launch(const char *kernel, const void *fn, dim3 grid, dim3 block, size_t dyn_smem,
               const std::function<void()> &body)
{
    unsigned long nb = (unsigned long)grid.x * grid.y * grid.z;
    unsigned nt = block.x * block.y * block.z;
    if (!nb || !nt || nt > 1024)
        return -1;
    check_dyn_smem(kernel, fn, dyn_smem);
    order(); /* a bad TY_EMU_ORDER stops the first launch, not a block */
    emu_device_guard dg;
    emu_count_scope cs(kernel, grid, block);
#pragma omp parallel for schedule(static)
    for (unsigned long b = 0; b < nb; b++) {
        g_grid_dim = emu_uint3{grid.x, grid.y, grid.z};
        g_block_dim = emu_uint3{block.x, block.y, block.z};
        g_block_idx = emu_uint3{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                                  (unsigned)(b / ((unsigned long)grid.x * grid.y))};
        block_run &r = thread_run(nt);
        r.body = &body;
        r.kernel = kernel;
        r.block = b;
        /* Fresh shared memory per block: poisoned with NaN-ish bytes so a
         * kernel that reads before writing shows it. */
        r.smem.assign(dyn_smem + EMU_SMEM_ALIGN, 0xff);
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
 * micro-batch (the device path's memory rules, docs/engine.md). */
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
    if (guard_on() || emu_count_mem_on()) { /* a mapping per block: guarded, or counted */
        size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + pg - 1) / pg * pg;
        std::lock_guard<std::mutex> l(g_region_mu);
        void *m = mmap(nullptr, n ? n : pg,
                       g_device_open || !guard_on() ? PROT_READ | PROT_WRITE : PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return cudaErrorMemoryAllocation;
        g_regions.push_back(emu_region{m, n ? n : pg});
        emu_count_region_add(m, n ? n : pg, bytes);
        *p = m;
        return cudaSuccess;
    }
    size_t r = (bytes + 255) / 256 * 256;
    *p = aligned_alloc(256, r ? r : 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    if (guard_on() || emu_count_mem_on()) {
        std::lock_guard<std::mutex> l(g_region_mu);
        for (size_t i = 0; i < g_regions.size(); i++)
            if (g_regions[i].p == p) {
                emu_count_region_remove(p);
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
    emu_declare("cudaMemsetAsync", 0, bytes, 0);
    emu_count_scope cs("cudaMemsetAsync", dim3(), dim3());
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
    const char *what = kind == cudaMemcpyHostToDevice   ? "cudaMemcpyAsync.h2d"
                       : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync.d2h"
                                                        : "cudaMemcpyAsync.d2d";
    emu_declare(what, kind == cudaMemcpyHostToDevice ? 0 : bytes,
                kind == cudaMemcpyDeviceToHost ? 0 : bytes, 0);
    emu_count_scope cs(what, dim3(), dim3());
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
struct emu_event {
    double ms; /* CLOCK_MONOTONIC when recorded; negative until then */
};
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)malloc(sizeof **e);
    if (!*e)
        return cudaErrorMemoryAllocation;
    (*e)->ms = -1;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->ms = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (start->ms < 0 || end->ms < 0)
        return cudaErrorInvalidValue;
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}
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
