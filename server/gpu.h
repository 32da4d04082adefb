/* gpu.h — the GPU inventory (gpu.c): which GPUs the server schedules and
 * their readings, from NVML opened with dlopen (the server never links
 * CUDA), or a fixed list, or none. */
#ifndef TY_GPU_H
#define TY_GPU_H

#include "server.h"

#define GPU_MAX 64 /* GPUs one server schedules at most (a bitmap) */

typedef struct gpu_inv gpu_inv;

/* spec: "auto" (NVML if it loads, else no GPUs), "none", or "0,1,...". */
int gpu_inv_open(const char *spec, gpu_inv **out, ty_err *err);
int gpu_inv_count(const gpu_inv *g);
/* Device index of slot i (the number CUDA_VISIBLE_DEVICES uses). */
int gpu_inv_index(const gpu_inv *g, int i);
/* Fresh readings of every GPU (zeros where NVML is not available);
 * job_id is left 0 for the caller to fill. Returns the count. */
int gpu_inv_sample(gpu_inv *g, srv_gpu_sample *out);
void gpu_inv_free(gpu_inv *g);

#endif
