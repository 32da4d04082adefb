/* gpu.c — the GPU inventory: which devices the server schedules and how busy
 * they are, read through NVML loaded at run time with dlopen.
 *
 * The server never links CUDA (DESIGN §1): NVML is opened as
 * libnvidia-ml.so.1 if present, with our own declarations of the handful of
 * functions used, so one binary runs on GPU and CPU-only machines alike. */
#include "gpu.h"

#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"
#include "sched_int.h"
#include "sse.h"
#include "tyjson.h"

typedef struct nvml_dev *nvml_dev_t;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_util;

struct gpu_inv {
    void *lib;
    int n;
    int index[GPU_MAX];
    nvml_dev_t dev[GPU_MAX];
    int (*shutdown)(void);
    int (*get_name)(nvml_dev_t, char *, unsigned);
    int (*get_mem)(nvml_dev_t, nvml_memory *);
    int (*get_util)(nvml_dev_t, nvml_util *);
    int (*get_temp)(nvml_dev_t, int, unsigned *);
};

/* Loads NVML; false (and nothing loaded) when it is missing or fails. */
static bool nvml_load(gpu_inv *g, unsigned *count)
{
    g->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g->lib) return false;
    int (*init)(void) = (int (*)(void))dlsym(g->lib, "nvmlInit_v2");
    int (*get_count)(unsigned *) = (int (*)(unsigned *))dlsym(g->lib, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, nvml_dev_t *) =
        (int (*)(unsigned, nvml_dev_t *))dlsym(g->lib, "nvmlDeviceGetHandleByIndex_v2");
    g->shutdown = (int (*)(void))dlsym(g->lib, "nvmlShutdown");
    g->get_name = (int (*)(nvml_dev_t, char *, unsigned))dlsym(g->lib, "nvmlDeviceGetName");
    g->get_mem = (int (*)(nvml_dev_t, nvml_memory *))dlsym(g->lib, "nvmlDeviceGetMemoryInfo");
    g->get_util = (int (*)(nvml_dev_t, nvml_util *))dlsym(g->lib, "nvmlDeviceGetUtilizationRates");
    g->get_temp = (int (*)(nvml_dev_t, int, unsigned *))dlsym(g->lib, "nvmlDeviceGetTemperature");
    if (!init || !get_count || !by_index || !g->shutdown || !g->get_name || !g->get_mem ||
        !g->get_util || !g->get_temp || init() != 0) {
        dlclose(g->lib);
        g->lib = NULL;
        return false;
    }
    if (get_count(count) != 0) *count = 0;
    if (*count > GPU_MAX) *count = GPU_MAX;
    for (unsigned i = 0; i < *count; i++)
        if (by_index(i, &g->dev[i]) != 0) g->dev[i] = NULL;
    return true;
}

int gpu_inv_open(const char *spec, gpu_inv **out, ty_err *err)
{
    gpu_inv *g = calloc(1, sizeof *g);
    if (!g) return ty_err_set(err, TY_ENOMEM, "out of memory");
    unsigned count = 0;
    bool have_nvml = strcmp(spec, "none") != 0 && nvml_load(g, &count);
    if (!strcmp(spec, "auto")) {
        g->n = (int)count;
        for (int i = 0; i < g->n; i++)
            g->index[i] = i;
    } else if (strcmp(spec, "none") != 0) {
        const char *p = spec;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= GPU_MAX || (*end && *end != ',')) {
                gpu_inv_free(g);
                return ty_err_field(err, TY_EINVAL, "gpus", "bad GPU list '%s'", spec);
            }
            if (have_nvml && (unsigned)v >= count) {
                gpu_inv_free(g);
                return ty_err_field(err, TY_EINVAL, "gpus", "GPU %ld does not exist (NVML sees %u)",
                                    v, count);
            }
            for (int i = 0; i < g->n; i++)
                if (g->index[i] == v) {
                    gpu_inv_free(g);
                    return ty_err_field(err, TY_EINVAL, "gpus", "GPU %ld listed twice", v);
                }
            if (g->n == GPU_MAX) break;
            g->index[g->n++] = (int)v;
            p = *end ? end + 1 : end;
        }
    }
    *out = g;
    return 0;
}

int gpu_inv_count(const gpu_inv *g)
{
    return g->n;
}
int gpu_inv_index(const gpu_inv *g, int i)
{
    return g->index[i];
}

int gpu_inv_sample(gpu_inv *g, srv_gpu_sample *out)
{
    for (int i = 0; i < g->n; i++) {
        srv_gpu_sample *s = &out[i];
        memset(s, 0, sizeof *s);
        s->index = g->index[i];
        snprintf(s->name, sizeof s->name, "GPU %d", s->index);
        nvml_dev_t d = g->lib ? g->dev[g->index[i]] : NULL;
        if (!d) continue;
        char name[96];
        nvml_memory m;
        nvml_util u;
        unsigned t;
        if (g->get_name(d, name, sizeof name) == 0) snprintf(s->name, sizeof s->name, "%s", name);
        if (g->get_mem(d, &m) == 0) {
            s->mem_total = (int64_t)m.total;
            s->mem_used = (int64_t)m.used;
        }
        if (g->get_util(d, &u) == 0) s->util = (int)u.gpu;
        if (g->get_temp(d, 0 /* NVML_TEMPERATURE_GPU */, &t) == 0) s->temp = (int)t;
    }
    /* Tests inject utilisation (idle_gpu, docs/server.md "Stalls and idle
     * GPUs"): TY_TEST_GPU_UTIL_FILE holds one percentage for every GPU. */
    const char *inj = getenv("TY_TEST_GPU_UTIL_FILE");
    FILE *f = inj ? fopen(inj, "re") : NULL;
    int util;
    if (f && fscanf(f, "%d", &util) == 1)
        for (int i = 0; i < g->n; i++)
            out[i].util = util;
    if (f) fclose(f);
    return g->n;
}

void gpu_inv_free(gpu_inv *g)
{
    if (!g) return;
    if (g->lib) {
        g->shutdown();
        dlclose(g->lib);
    }
    free(g);
}

/* ---- sampling --------------------------------------------------------------------------------- */

/* The scheduler's second thread: every --gpu-sample-ms it reads the GPUs,
 * records which job holds each, feeds the idle-GPU check and publishes the
 * readings (as the holding job's events, or live only). */
void *sched_sampler_main(void *arg)
{
    sched *x = arg;
    srv *s = x->s;
    int n = gpu_inv_count(x->gpu);
    if (n == 0) return NULL;
    pthread_mutex_lock(&x->sample_mu);
    while (!x->stop) {
        srv_gpu_sample cur[GPU_MAX];
        pthread_mutex_unlock(&x->sample_mu);
        gpu_inv_sample(x->gpu, cur);
        pthread_mutex_lock(&x->sample_mu);
        for (int i = 0; i < n; i++) {
            cur[i].job_id = x->sample_job[i];
            x->samples[i] = cur[i];
        }
        pthread_mutex_unlock(&x->sample_mu);
        ops_gpu_sweep(s, cur, n);
        for (int i = 0; i < n; i++) {
            json_t *o = json_pack("{si si sI sI si}", "index", cur[i].index, "util", cur[i].util,
                                  "mem_used", (json_int_t)cur[i].mem_used, "mem_total",
                                  (json_int_t)cur[i].mem_total, "temp", cur[i].temp);
            char *data = ty_json_dumps(o, JSON_COMPACT);
            json_decref(o);
            if (!data) continue;
            if (cur[i].job_id > 0) {
                evw_push(s->evw, cur[i].job_id, "gpu", data);
            } else {
                sse_hub_publish_live(s->hub, "gpu", data);
                free(data);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)s->cfg.gpu_sample_ms * 1000000LL;
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        pthread_mutex_lock(&x->sample_mu);
        if (!x->stop) pthread_cond_timedwait(&x->sample_cond, &x->sample_mu, &ts);
    }
    pthread_mutex_unlock(&x->sample_mu);
    return NULL;
}
