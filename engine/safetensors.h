/* safetensors.h — reading and writing Hugging Face's safetensors format.
 *
 * A file is an 8-byte little-endian header length, a JSON header naming each
 * tensor's dtype, shape and [begin, end) byte span in the data area, then the
 * data. st_open mmaps a file and validates the header completely before any
 * byte is trusted (length bound, JSON, dtype, shape x dtype size = span,
 * spans inside the data area and non-overlapping), so a truncated or hostile
 * file is a clear error, never an out-of-bounds read. The writer emits the
 * same format, fp32 only, header padded with spaces to 8 bytes as HF does. */
#ifndef TY_SAFETENSORS_H
#define TY_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "tyerr.h"

#define ST_MAX_DIMS 8

typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_NDTYPES
} st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* byte span relative to the data area */
    const uint8_t *data; /* points into the mapping */
    int fd;              /* the open file, for st_read_as (pread: no mapped pages) */
    uint64_t file_off;   /* where the data starts in it */
} st_tensor;

typedef struct st_file {
    char *path;
    void *map;
    size_t map_len;
    int fd; /* kept open for st_read_as */
    int n;
    st_tensor *t;     /* in header order */
    json_t *metadata; /* "__metadata__" object or NULL (owned ref) */
} st_file;

/* Maps and validates path. On error nothing is left to free. */
int st_open(st_file *f, const char *path, ty_err *err);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
uint64_t st_numel(const st_tensor *t);
const char *st_dtype_name(st_dtype d);
/* Converts an F32 / F16 / BF16 / F64 tensor to fp32 into out[numel]; other
 * dtypes are an error naming the tensor. */
int st_to_f32(const st_tensor *t, float *out, ty_err *err);
/* Elements [e0, e0 + n) of t into out: as fp32 (want ST_F32, from F32 /
 * F16 / BF16 / F64), or copied when want is t's own F32 / F16 / BF16
 * dtype. Read with pread, not through the mapping, so a loader that goes
 * a slice at a time never has more than a slice of the file resident. A
 * range outside the tensor or another conversion is TY_EINVAL; a read
 * error TY_EIO. */
int st_read_as(const st_tensor *t, uint64_t e0, uint64_t n, st_dtype want, void *out, ty_err *err);

/* One tensor to write: fp32, shape as given. */
typedef struct st_out {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
} st_out;

/* Produces tensor i's data (numel floats) into buf; returns 0 or TY_E*. */
typedef int (*st_fill_fn)(void *ctx, int i, float *buf, ty_err *err);

/* Writes n F32 tensors to path (contiguous, in the given order) with an
 * optional string->string metadata object. Data comes from fill(), one
 * tensor at a time, so only the largest tensor is held in host memory. */
int st_write(const char *path, const st_out *tensors, int n, json_t *metadata, st_fill_fn fill,
             void *ctx, ty_err *err);

/* The same, written as ST_F32, ST_BF16 or ST_F16 (narrowed with
 * round-to-nearest-even; other dtypes are TY_EINVAL). */
int st_write_as(const char *path, const st_out *tensors, int n, json_t *metadata, st_fill_fn fill,
                void *ctx, st_dtype dtype, ty_err *err);

/* Produces elements [off, off + n) of tensor i (in the file's order) into
 * buf; returns 0 or TY_E*. */
typedef int (*st_fill_range_fn)(void *ctx, int i, uint64_t off, size_t n, float *buf, ty_err *err);
/* Elements per piece of st_write_ranges (4 MiB of fp32). */
#define ST_WRITE_PIECE ((size_t)1 << 20)

/* st_write_as with each tensor produced in pieces of at most
 * ST_WRITE_PIECE elements: the writer holds one piece (4 MiB), not the
 * largest tensor as fp32 (a 32k x 2048 embedding: 250 MiB, resident next
 * to the whole training state when a checkpoint is saved). */
int st_write_ranges(const char *path, const st_out *tensors, int n, json_t *metadata,
                    st_fill_range_fn fill, void *ctx, st_dtype dtype, ty_err *err);

/* Where st_write_ranges_in takes its piece buffers (st_write.c holds a
 * few): page-locked host memory from a device context, so the fill's
 * copies out of the device run at the link's speed. alloc returns bytes
 * of memory or NULL (malloc's then serve), release frees what it gave. */
typedef struct st_bufs {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *p);
    void *ctx;
} st_bufs;

/* st_write_ranges with its piece buffers from bufs (NULL: malloc). */
int st_write_ranges_in(const char *path, const st_out *tensors, int n, json_t *metadata,
                       st_fill_range_fn fill, void *ctx, st_dtype dtype, const st_bufs *bufs,
                       ty_err *err);

/* fp16 / bf16 bit patterns to float (exact). */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t h);

/* A tensor name that only a model quantised by another tool carries
 * (GPTQ / AWQ qweight, qzeros, scales, g_idx; bitsandbytes' absmax,
 * quant_map, quant_state): a message saying so, else NULL. */
const char *st_foreign_quant(const char *name);

#endif
