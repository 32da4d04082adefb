/* model_load.c — weights into their home a bounded slice at a time.
 *
 * Loading an 8B model used to stage every stored tensor whole in fp32
 * (the 2 GB embedding became a 4 GB fp32 copy, next to the fp32 parameter
 * buffer it was copied into and the mapped file), which made QLoRA's peak
 * resident size the load's rather than the training's (docs/benchmarks.md
 * "QLoRA"). Here a tensor moves LOAD_CHUNK elements at a time: read from
 * the file with pread (st_read_as: its pages stay in the page cache, never
 * in this process), a bf16 file into a bf16 home as a plain copy, other
 * dtypes through an fp32 slice and kn_convert (the rounding the whole-
 * buffer conversion did, so the bytes are the same), then written to the
 * home. The peak a load adds is its destination plus a few slices,
 * whatever the largest tensor. */
#include "model_load.h"

#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "model.h"

#define LOAD_CHUNK ((size_t)1 << 20) /* elements: a 4 MiB fp32 slice */

int load_ctx_init(const model *m, load_ctx *lc, ty_err *err)
{
    memset(lc, 0, sizeof *lc);
    size_t maxn = 1;
    for (int i = 0; i < m->nt; i++)
        if (m->t[i].numel > maxn) maxn = m->t[i].numel;
    lc->kn = m->kn;
    lc->cap = maxn < LOAD_CHUNK ? maxn : LOAD_CHUNK;
    lc->buf = malloc(lc->cap * sizeof *lc->buf);
    lc->buf16 = malloc(lc->cap * sizeof *lc->buf16);
    lc->seen = calloc((size_t)m->nt, 1);
    if (!lc->buf || !lc->buf16 || !lc->seen)
        return ty_err_set(err, TY_ENOMEM, "out of memory loading weights");
    return 0;
}

void load_ctx_free(load_ctx *lc)
{
    free(lc->buf);
    free(lc->buf16);
    free(lc->seen);
    if (lc->dev) kn_free(lc->kn, lc->dev);
    memset(lc, 0, sizeof *lc);
}

/* A stored tensor as a linear_src: elements of the engine's layout. */
typedef struct {
    const st_tensor *st;
    int conv1d;
} file_src;

static int file_read(void *ctx, size_t e0, size_t n, float *out, ty_err *err)
{
    const file_src *fs = ctx;
    const st_tensor *st = fs->st;
    if (!fs->conv1d) {
        return st_read_as(st, e0, n, ST_F32, out, err);
    }
    /* GPT-2's Conv1D is [in, out] on disk, [out, in] here: element (o, i)
     * is the file's i * out + o. The slice's outputs o0..o1 are one span of
     * every file row i: read that span once per row (in reads a slice, not
     * one per element) and scatter the elements that fall in the slice. */
    if (n == 0) return 0;
    uint64_t in = (uint64_t)st->shape[0], nout = (uint64_t)st->shape[1];
    uint64_t o0 = e0 / in, o1 = (e0 + n - 1) / in, span = o1 - o0 + 1;
    float *row = malloc(span * sizeof *row);
    if (!row)
        return ty_err_field(err, TY_ENOMEM, st->name, "out of memory reading tensor %s", st->name);
    int rc = 0;
    for (uint64_t i = 0; i < in && !rc; i++) {
        rc = st_read_as(st, i * nout + o0, span, ST_F32, row, err);
        for (uint64_t o = o0; !rc && o <= o1; o++) {
            uint64_t e = o * in + i;
            if (e >= e0 && e < e0 + n) out[e - e0] = row[o - o0];
        }
    }
    free(row);
    return rc;
}

static int mem_read(void *ctx, size_t e0, size_t n, float *out, ty_err *err)
{
    (void)err;
    memcpy(out, (const float *)ctx + e0, n * sizeof *out);
    return 0;
}

static int store_aside(model *m, int i, const linear_src *src, ty_err *err)
{
    char hf[128];
    model_hf_name(m, &m->t[i], hf, sizeof hf);
    if (!m->base.put)
        return ty_err_set(err, TY_EINVAL, "tensor %s: no store attached for the quantised base",
                          hf);
    return m->base.put(m->base.state, m->t[i].q4 - 1, hf, m->t[i].numel, src, err);
}

/* Tensor idx from src (or, same dtype as the 16-bit home, straight from
 * st's bytes) into its home. */
static int put_home(model *m, int idx, const linear_src *src, const st_tensor *st, float *dst,
                    load_ctx *lc, ty_err *err)
{
    const model_tensor *t = &m->t[idx];
    if (t->q4) return store_aside(m, idx, src, err);
    if (!dst && !m->p16)
        return ty_err_set(err, TY_EINTERNAL, "tensor %s: the model has no weight buffer", t->name);
    size_t es = dst ? sizeof(float) : kn_dtype_size(m->dt);
    st_dtype home = m->dt == KN_BF16 ? ST_BF16 : ST_F16;
    int copy = !dst && st && !t->conv1d && st->dtype == home;
    if (!dst && !copy && !lc->dev && !(lc->dev = kn_alloc(lc->kn, lc->cap * sizeof(float))))
        return ty_err_set(err, TY_ENOMEM, "out of memory: a %zu-element load slice", lc->cap);
    for (size_t e0 = 0; e0 < t->numel; e0 += lc->cap) {
        size_t n = t->numel - e0 < lc->cap ? t->numel - e0 : lc->cap;
        char *to = dst ? (char *)(dst + t->off + e0) : (char *)m->p16 + (t->off + e0) * es;
        int rc;
        if (copy) { /* bf16 -> bf16 (fp16 -> fp16): the bytes as stored */
            rc = st_read_as(st, e0, n, st->dtype, lc->buf16, err);
            if (!rc) kn_to_device(m->kn, to, lc->buf16, n * es);
        } else if ((rc = src->read(src->ctx, e0, n, lc->buf, err)) == 0) {
            if (dst) {
                kn_to_device(m->kn, to, lc->buf, n * sizeof(float));
            } else {
                kn_to_device(m->kn, lc->dev, lc->buf, n * sizeof(float));
                kn_convert(m->kn, to, m->dt, lc->dev, KN_F32, n);
            }
        }
        if (rc) return rc;
    }
    return 0;
}

int load_tensor(model *m, int idx, const st_tensor *st, float *dst, load_ctx *lc, ty_err *err)
{
    if (st->dtype != ST_F32 && st->dtype != ST_F16 && st->dtype != ST_BF16 && st->dtype != ST_F64)
        return ty_err_field(err, TY_EINVAL, st->name,
                            "tensor %s has dtype %s; want F32, F16 or BF16", st->name,
                            st_dtype_name(st->dtype));
    file_src fs = {st, m->t[idx].conv1d};
    linear_src src = {&fs, file_read};
    return put_home(m, idx, &src, st, dst, lc, err);
}

int model_put_f32(model *m, int idx, const float *w, ty_err *err)
{
    const model_tensor *t = &m->t[idx];
    linear_src src = {(void *)w, mem_read};
    if (t->q4) return store_aside(m, idx, &src, err);
    if (m->params) { /* fp32 home: one copy, no slices */
        kn_to_device(m->kn, m->params + t->off, w, t->numel * sizeof(float));
        return 0;
    }
    load_ctx lc;
    int rc = load_ctx_init(m, &lc, err);
    if (!rc) rc = put_home(m, idx, &src, NULL, m->params, &lc, err);
    load_ctx_free(&lc);
    return rc;
}
