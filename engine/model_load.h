/* model_load.h — the model's weights into their home, a bounded slice at a
 * time (model.c's loaders and model_init_random call it; nothing else).
 *
 * A tensor's home is the fp32 buffer the caller names (the parameters or
 * an AdamW moment), or, for the frozen 16-bit base of a QLoRA run, the
 * 16-bit copy p16 itself (the caller passes NULL): there is then no fp32
 * parameter buffer at all. A block linear of a QLoRA base goes to the
 * attached store (linear.h), which pulls it a slice at a time. */
#ifndef TY_MODEL_LOAD_H
#define TY_MODEL_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "safetensors.h"
#include "tyerr.h"

struct model;

/* Per load: which tensors were seen, and the slice buffers (host fp32 and
 * 16-bit, and a device fp32 slice for conversions into p16). */
typedef struct load_ctx {
    kn_ctx *kn;
    char *seen;
    size_t cap; /* elements per slice */
    float *buf;
    uint16_t *buf16;
    float *dev; /* kn_alloc'd on first use */
} load_ctx;

int load_ctx_init(const struct model *m, load_ctx *lc, ty_err *err);
void load_ctx_free(load_ctx *lc);

/* Stored tensor st (its shape already checked) into tensor idx's home:
 * dst + off in fp32, p16 when dst is NULL, or the linear store. */
int load_tensor(struct model *m, int idx, const st_tensor *st, float *dst, load_ctx *lc,
                ty_err *err);

/* The same from host fp32 w[numel] (model_init_random's draws). */
int model_put_f32(struct model *m, int idx, const float *w, ty_err *err);

#endif
