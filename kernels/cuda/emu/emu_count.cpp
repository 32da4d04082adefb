/* emu_count.cpp — per-launch work counts of the emulated device, for the
 * roofline model (bench/engine-gpu/model.py) and its check.
 *
 * Off unless TY_EMU_COUNT=<file.jsonl> is set (read once): then every
 * kernel launch, cuBLASLt matmul, device memset and copy appends one JSON
 * line to the file and to an in-process list (emu_count_take), with
 *  - flops by path: "tc16" (16-bit tensor cores), "tf32", "simt" (fp32
 *    CUDA cores), "mma" (warp matrix operations: the kernels' own
 *    nvcuda::wmma products, counted by emu_wmma.h's mma_sync);
 *  - "decl": the bytes the launch reads and writes in global memory as
 *    its source declares them (KN_IO next to each KN_LAUNCH; cuBLASLt's
 *    from the matmul's layouts), each byte once (compulsory traffic), or
 *    null for a launch that declares nothing;
 *  - "seen": with TY_EMU_COUNT_MEM=1 as well, the bytes the launch really
 *    touched: every device block is then its own mapping (as under
 *    TY_EMU_GUARD), set PROT_NONE as the launch starts; the first read of
 *    a page faults, is counted and opens the page for reading, the first
 *    write likewise opens it for writing (a read-then-write page counts
 *    in both). A page counts its bytes inside the block only, so whole
 *    tensors come out to the byte. Slow (a fault per page and launch):
 *    for the check on small shapes, kernels.cuda_emu.count.
 * Faults outside the counted blocks go to the handler that was there
 * before (AddressSanitizer's, or the default crash). On x86-64 the fault's
 * error code tells a write from a read; elsewhere a touched page counts as
 * both. */
#include "cuda_emu.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

namespace {

struct region {
    char *p;
    size_t bytes; /* what cudaMalloc was asked for */
    size_t pages;
    std::atomic<unsigned char> *state; /* per page: 1 read, 2 written */
};

std::vector<region> g_regs;
std::mutex g_mu; /* regions, records, the file */
std::vector<emu_count_rec> g_recs;
FILE *g_file;
size_t g_page;
std::atomic<int> g_counting{0};
struct sigaction g_old_segv;
thread_local const char *t_pending; /* the kernel a declaration is for */
thread_local uint64_t t_rd, t_wr, t_simt;
std::atomic<uint64_t> g_mma{0};

const char *count_path(void)
{
    static const char *p = [] {
        const char *v = getenv("TY_EMU_COUNT");
        return v && *v ? v : (const char *)nullptr;
    }();
    return p;
}

void on_segv(int sig, siginfo_t *si, void *uc)
{
    char *a = (char *)si->si_addr;
    if (g_counting.load())
        for (region &r : g_regs) {
            if (a < r.p || a >= r.p + r.pages * g_page)
                continue;
            size_t i = (size_t)(a - r.p) / g_page;
#if defined(__x86_64__)
            bool write = (((ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else /* no error code to read: every first touch counts as both */
            bool write = true;
            r.state[i].fetch_or(1);
            (void)uc;
#endif
            unsigned char old = r.state[i].fetch_or(write ? 2 : 1);
            char *pg = r.p + i * g_page;
            if (write)
                mprotect(pg, g_page, PROT_READ | PROT_WRITE);
            else if (!(old & 2))
                mprotect(pg, g_page, PROT_READ);
            return;
        }
    /* Not ours: the previous handler takes the repeated fault. */
    sigaction(SIGSEGV, &g_old_segv, nullptr);
    (void)sig;
}

void install_handler(void)
{
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_old_segv);
    });
}

void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    fputc('"', f);
}

void write_rec(const emu_count_rec &r)
{
    if (!g_file) {
        g_file = fopen(count_path(), "w");
        if (!g_file) {
            fprintf(stderr, "cuda-emu: TY_EMU_COUNT=%s: cannot open for writing\n", count_path());
            abort();
        }
    }
    fprintf(g_file, "{\"name\":");
    json_str(g_file, r.name);
    fprintf(g_file, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u]", r.grid[0], r.grid[1], r.grid[2],
            r.block[0], r.block[1], r.block[2]);
    fprintf(g_file, ",\"flops\":{\"tc16\":%llu,\"tf32\":%llu,\"simt\":%llu,\"mma\":%llu}",
            (unsigned long long)r.flops[EMU_PATH_TC16], (unsigned long long)r.flops[EMU_PATH_TF32],
            (unsigned long long)r.flops[EMU_PATH_SIMT], (unsigned long long)r.flops[EMU_PATH_MMA]);
    if (r.declared)
        fprintf(g_file, ",\"decl\":{\"read\":%llu,\"write\":%llu}", (unsigned long long)r.decl_rd,
                (unsigned long long)r.decl_wr);
    else
        fprintf(g_file, ",\"decl\":null");
    if (r.seen)
        fprintf(g_file, ",\"seen\":{\"read\":%llu,\"write\":%llu}", (unsigned long long)r.seen_rd,
                (unsigned long long)r.seen_wr);
    fprintf(g_file, "}\n");
    fflush(g_file);
}

} // namespace

bool emu_count_on(void) { return count_path() != nullptr; }

bool emu_count_mem_on(void)
{
    static const bool on = [] {
        const char *v = getenv("TY_EMU_COUNT_MEM");
        return emu_count_on() && v && v[0] == '1';
    }();
    return on;
}

void emu_declare(const char *kernel, uint64_t read_bytes, uint64_t write_bytes, uint64_t simt_flops)
{
    t_pending = kernel;
    t_rd = read_bytes, t_wr = write_bytes, t_simt = simt_flops;
}

void emu_count_mma(uint64_t flops) { g_mma += flops; }

/* Called with the runtime's region lock held: no launch is running. */
void emu_count_region_add(void *p, size_t mapped, size_t bytes)
{
    if (!emu_count_mem_on())
        return;
    std::lock_guard<std::mutex> l(g_mu);
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    region r{(char *)p, bytes, mapped / g_page, nullptr};
    r.state = new std::atomic<unsigned char>[r.pages];
    for (size_t i = 0; i < r.pages; i++)
        r.state[i] = 0;
    g_regs.push_back(r);
}

void emu_count_region_remove(void *p)
{
    if (!emu_count_mem_on())
        return;
    std::lock_guard<std::mutex> l(g_mu);
    for (size_t i = 0; i < g_regs.size(); i++)
        if (g_regs[i].p == p) {
            delete[] g_regs[i].state;
            g_regs.erase(g_regs.begin() + (long)i);
            return;
        }
}

emu_count_scope::emu_count_scope(const char *name, dim3 grid, dim3 block)
{
    active = emu_count_on();
    if (!active)
        return;
    memset(&rec, 0, sizeof rec);
    snprintf(rec.name, sizeof rec.name, "%s", name);
    rec.grid[0] = grid.x, rec.grid[1] = grid.y, rec.grid[2] = grid.z;
    rec.block[0] = block.x, rec.block[1] = block.y, rec.block[2] = block.z;
    if (t_pending && !strcmp(t_pending, name)) {
        rec.declared = 1;
        rec.decl_rd = t_rd, rec.decl_wr = t_wr;
        rec.flops[EMU_PATH_SIMT] = t_simt;
    }
    t_pending = nullptr;
    g_mma = 0;
    if (!emu_count_mem_on())
        return;
    install_handler();
    std::lock_guard<std::mutex> l(g_mu);
    for (region &r : g_regs) {
        for (size_t i = 0; i < r.pages; i++)
            r.state[i] = 0;
        mprotect(r.p, r.pages * g_page, PROT_NONE);
    }
    g_counting = 1;
}

emu_count_scope::~emu_count_scope()
{
    if (!active)
        return;
    rec.flops[EMU_PATH_MMA] = g_mma.load();
    std::lock_guard<std::mutex> l(g_mu);
    if (emu_count_mem_on()) {
        g_counting = 0;
        rec.seen = 1;
        for (region &r : g_regs) {
            for (size_t i = 0; i < r.pages; i++) {
                unsigned char s = r.state[i];
                size_t lo = i * g_page, hi = lo + g_page < r.bytes ? lo + g_page : r.bytes;
                size_t n = hi > lo ? hi - lo : 0;
                rec.seen_rd += s & 1 ? n : 0;
                rec.seen_wr += s & 2 ? n : 0;
            }
            mprotect(r.p, r.pages * g_page, PROT_READ | PROT_WRITE);
        }
    }
    write_rec(rec);
    if (g_recs.size() < 65536)
        g_recs.push_back(rec);
}

extern "C" int emu_count_take(emu_count_rec *out, int max)
{
    std::lock_guard<std::mutex> l(g_mu);
    int n = (int)g_recs.size() < max ? (int)g_recs.size() : max;
    for (int i = 0; i < n; i++)
        out[i] = g_recs[(size_t)i];
    g_recs.clear();
    return n;
}
