/* device.h — which device a training run uses, and what it reports about it.
 *
 * The training loop (train.c) asks three things of this file: open the
 * kernel context the spec's `resources.backend` asks for (device_open), say
 * whether the device can hold the spec's precision (device_check_precision),
 * and describe the device in the `started` event and `mem_bytes`. The
 * rules are in docs/engine.md, "Devices". */
#ifndef TY_ENGINE_DEVICE_H
#define TY_ENGINE_DEVICE_H

#include <jansson.h>
#include <stdint.h>

#include "jobspec.h"
#include "kernels.h"

/* 1 when this program can open a CUDA context at all: a CUDA build, or the
 * test hook TY_KERNELS=cuda-emu in a program linked with the emulation. */
int device_cuda_built(void);

/* Opens *kn for the spec:
 *   cuda  the GPU at TY_LOCAL_RANK among the visible ones
 *         (CUDA_VISIBLE_DEVICES, set by the server); failing that, an error;
 *   auto  the same when the job was given GPUs (resources.gpus > 0), else
 *         or failing that the CPU, writing why into fallback (never silent);
 *   cpu   the CPU.
 * fallback is "" when no fallback happened. */
int device_open(kn_ctx **kn, const jobspec *s, int local_rank, int threads, char *fallback,
                size_t fallback_cap, ty_err *err);

/* TY_EINVAL (field "precision") when the opened device cannot run dt:
 * bf16 needs compute capability 8.0 (the bf16 tensor cores of Ampere). */
int device_check_precision(const kn_ctx *kn, kn_dtype dt, ty_err *err);
/* What precision "auto" stores in on the opened device: fp16 (with loss
 * scaling) on a GPU before compute capability 8.0, bf16 everywhere else. */
kn_dtype device_auto_precision(const kn_ctx *kn);

/* Adds the device's fields to the `started` event: on CUDA a "gpu" object
 * (name, memory_bytes, compute_capability, driver, cuda_runtime). */
void device_describe(const kn_ctx *kn, json_t *started);

/* `mem_bytes` of the metric events: device memory in use at its peak on a
 * GPU (every block the context holds), the process's peak RSS on the CPU
 * (where device memory is host memory). */
uint64_t device_mem_bytes(const kn_ctx *kn);

/* `device_used_bytes` of the metric events on a GPU: the whole device's
 * memory in use now as the driver counts it (total - free: the engine's
 * buffers plus the CUDA context, cuBLASLt's own allocations and anything
 * else on the card); 0 on the CPU. */
uint64_t device_used_bytes(kn_ctx *kn);

#endif
