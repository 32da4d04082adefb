/* cuda_profile.cu — GPU time by launch name: where a step's time goes.
 *
 * With TY_CUDA_PROFILE=DIR in the environment, a context records a CUDA
 * event on its stream before and after every KN_LAUNCH and every cuBLASLt
 * call. The pairs are read back in batches of KN_PROF_BATCH (one wait for
 * the GPU per batch, so the host still runs ahead between reads). Each
 * launch's time is added to its name's total. The time from one launch's
 * end to the next one's start, the GPU idle while the host prepares work
 * or while a copy or memset runs, is added to "(gaps)". When the context
 * closes, DIR/cuda-profile.<pid>.<device>.tsv gets one row a name, the
 * largest total first: total ms, calls, microseconds a call, share of the
 * timed span, and the name. cuBLASLt calls are named by shape and types
 * ("lt NT 768x8192x3072 bf16>bf16 epi1").
 *
 * Recording costs the host a microsecond or two an event and the batch
 * reads stall the queue, so the step's wall time under the profile is not
 * the step's time; the launches' own times are. Without the variable a
 * launch costs one test of a null pointer. */
#include "kn_cuda.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace KN_NS {

#define KN_PROF_BATCH 4096
#define KN_PROF_NAME 64

struct kn_prof_row {
    char name[KN_PROF_NAME];
    double ms;
    long calls;
};

struct kn_prof {
    char path[1024];
    cudaEvent_t ev[2 * KN_PROF_BATCH]; /* start, end of each pending launch */
    int name_of[KN_PROF_BATCH];        /* its row */
    int pending;
    kn_prof_row *rows;
    int n_rows, cap_rows;
    double span_ms, gap_ms; /* first start to last end of each batch; idle inside it */
    bool failed;            /* an event call failed: the report says so */
};

kn_prof *kn_prof_open(int device)
{
    const char *dir = getenv("TY_CUDA_PROFILE");
    if (!dir || !*dir)
        return nullptr;
    kn_prof *p = (kn_prof *)calloc(1, sizeof *p);
    if (!p)
        return nullptr;
    snprintf(p->path, sizeof p->path, "%s/cuda-profile.%ld.%d.tsv", dir, (long)getpid(), device);
    for (int i = 0; i < 2 * KN_PROF_BATCH; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            for (int j = 0; j < i; j++)
                cudaEventDestroy(p->ev[j]);
            free(p);
            fprintf(stderr, "trainyard: TY_CUDA_PROFILE: cannot create CUDA events\n");
            return nullptr;
        }
    return p;
}

static int row_of(kn_prof *p, const char *name)
{
    for (int i = 0; i < p->n_rows; i++)
        if (!strncmp(p->rows[i].name, name, KN_PROF_NAME - 1))
            return i;
    if (p->n_rows == p->cap_rows) {
        int cap = p->cap_rows ? 2 * p->cap_rows : 64;
        kn_prof_row *r = (kn_prof_row *)realloc(p->rows, cap * sizeof *r);
        if (!r)
            return -1;
        p->rows = r;
        p->cap_rows = cap;
    }
    kn_prof_row *r = &p->rows[p->n_rows];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->ms = 0;
    r->calls = 0;
    return p->n_rows++;
}

/* Waits for the pending launches and adds their times. */
static void harvest(kn_prof *p)
{
    int n = p->pending;
    p->pending = 0;
    if (!n)
        return;
    if (cudaEventSynchronize(p->ev[2 * n - 1]) != cudaSuccess) {
        p->failed = true;
        return;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p->ev[0], p->ev[2 * n - 1]) == cudaSuccess)
        p->span_ms += ms;
    for (int i = 0; i < n; i++) {
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) != cudaSuccess) {
            p->failed = true;
            continue;
        }
        if (p->name_of[i] >= 0) {
            p->rows[p->name_of[i]].ms += ms;
            p->rows[p->name_of[i]].calls++;
        }
        if (i && cudaEventElapsedTime(&ms, p->ev[2 * i - 1], p->ev[2 * i]) == cudaSuccess)
            p->gap_ms += ms;
    }
}

void kn_prof_begin(kn_prof *p, cudaStream_t s)
{
    if (p->pending == KN_PROF_BATCH)
        harvest(p);
    if (cudaEventRecord(p->ev[2 * p->pending], s) != cudaSuccess)
        p->failed = true;
}

void kn_prof_end(kn_prof *p, cudaStream_t s, const char *name)
{
    if (cudaEventRecord(p->ev[2 * p->pending + 1], s) != cudaSuccess)
        p->failed = true;
    p->name_of[p->pending++] = row_of(p, name);
}

static int by_ms(const void *a, const void *b)
{
    double x = ((const kn_prof_row *)a)->ms, y = ((const kn_prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void kn_prof_close(kn_prof *p)
{
    if (!p)
        return;
    harvest(p);
    double kernels = 0;
    for (int i = 0; i < p->n_rows; i++)
        kernels += p->rows[i].ms;
    qsort(p->rows, p->n_rows, sizeof *p->rows, by_ms);
    FILE *f = fopen(p->path, "w");
    if (!f) {
        fprintf(stderr, "trainyard: TY_CUDA_PROFILE: cannot write %s\n", p->path);
    } else {
        double span = p->span_ms > 0 ? p->span_ms : 1;
        fprintf(f, "# span %.3f ms, launches %.3f ms, gaps %.3f ms%s\n", p->span_ms, kernels,
                p->gap_ms, p->failed ? " (some events failed: incomplete)" : "");
        fprintf(f, "ms\tcalls\tus_per_call\tshare\tname\n");
        for (int i = 0; i < p->n_rows; i++) {
            kn_prof_row *r = &p->rows[i];
            fprintf(f, "%.3f\t%ld\t%.2f\t%.4f\t%s\n", r->ms, r->calls,
                    r->calls ? 1e3 * r->ms / r->calls : 0.0, r->ms / span, r->name);
        }
        fprintf(f, "%.3f\t-\t-\t%.4f\t(gaps)\n", p->gap_ms, p->gap_ms / span);
        fclose(f);
    }
    for (int i = 0; i < 2 * KN_PROF_BATCH; i++)
        cudaEventDestroy(p->ev[i]);
    free(p->rows);
    free(p);
}

} // namespace KN_NS
