/* nf4.h — quantising a weight to 4-bit NormalFloat, bitsandbytes' format.
 *
 * What QLoRA does to the frozen linear weights at load (docs/engine.md
 * "QLoRA"): blocks of 64 consecutive values, each stored as 4-bit codes of
 * the 16 NF4 levels scaled by the block's absmax (fp32); two codes per
 * byte, the even element in the high nibble. With double quantisation the
 * absmax values lose their mean (the fp32 `offset`) and are themselves
 * quantised to 8 bits in blocks of 256 with bitsandbytes' signed dynamic
 * map, with one fp32 absmax2 per block. The layout and the arithmetic are
 * bitsandbytes' quantize_4bit(blocksize=64, quant_type="nf4",
 * compress_statistics=...); kernels.h (kn_nf4) dequantises. */
#ifndef TY_NF4_H
#define TY_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "tyerr.h"

/* A quantised tensor in host memory. */
typedef struct nf4_host {
    size_t n;       /* elements */
    size_t nb, nb2; /* blocks of 64; blocks of 256 absmax values (double quant) */
    int double_quant;
    uint8_t *codes;   /* [(n + 1) / 2] */
    float *absmax;    /* [nb] (also kept with double quantisation: the fp32 values) */
    uint8_t *qabsmax; /* [nb] when double_quant */
    float *absmax2;   /* [nb2] when double_quant */
    float offset;
} nf4_host;

/* Quantises x[n] (finite values; an inf or NaN is TY_EINVAL naming the
 * element). Allocates out's arrays; nf4_free releases them. */
int nf4_quantize(const float *x, size_t n, int double_quant, nf4_host *out, ty_err *err);
/* The same a slice at a time, byte for byte: nf4_begin allocates for n
 * elements; nf4_add quantises x[cnt], elements [e0, e0 + cnt) (e0 a
 * multiple of 64, cnt too unless the slice ends the tensor); nf4_end
 * double-quantises once every slice is in. On error the caller frees. */
int nf4_begin(nf4_host *q, size_t n, int double_quant, ty_err *err);
int nf4_add(nf4_host *q, size_t e0, const float *x, size_t cnt, ty_err *err);
int nf4_end(nf4_host *q, ty_err *err);
void nf4_free(nf4_host *q);

/* Bytes one device copy takes (kernels' layout: codes, then absmax or
 * qabsmax + absmax2, each 64-byte aligned), and the copy itself into dev
 * (a kn_alloc of that many bytes); w receives the device view. */
size_t nf4_device_bytes(size_t n, int double_quant);
void nf4_to_device(kn_ctx *kn, const nf4_host *q, void *dev, kn_nf4 *w);

#endif
