/* st_write.c — the safetensors writer: the header, then each tensor's
 * data in file order, produced by the caller's fill function.
 *
 * st_write_ranges asks for pieces of at most ST_WRITE_PIECE elements and
 * hands them to a writer thread through a ring of ST_WRITE_BUFS buffers:
 * the thread narrows each piece (bf16 / fp16) and writes it, in order,
 * while the caller fills the next. A checkpoint's save so overlaps its
 * copies out of the device (and the split masters' join) with the file's
 * writes instead of taking them in turn, and the writer holds a few
 * pieces (12 MiB), not a tensor; st_write_ranges_in takes those from the
 * caller's allocator (the engine's: page-locked memory on a GPU). st_write_as fills whole tensors into one
 * buffer and writes them on the caller's thread. A failed write ends the
 * ring: the caller's next piece is refused and the error is the write's.
 * The file is flushed and fsync'd before the call returns. */
#include "safetensors.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ST_WRITE_BUFS 3

/* fp32 to bf16 / fp16, round-to-nearest-even (what torch's .to() does);
 * NaN stays NaN, fp16 overflows to inf. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* The pieces between the caller and the file. Slots [tail, tail + count)
 * (mod nbuf) are filled and wait for the writer, who owns slot tail until
 * its write is done; slot head = tail + count is the caller's next. */
typedef struct piece_ring {
    FILE *fp;
    st_dtype dtype;
    float *buf[ST_WRITE_BUFS];
    int own[ST_WRITE_BUFS]; /* from bufs->alloc (else malloc) */
    const st_bufs *bufs;
    size_t len[ST_WRITE_BUFS];
    int nbuf, head, tail, count;
    int threaded, closing;
    int werr; /* errno of the first failed write; the rest are skipped */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t tid;
} piece_ring;

/* Narrows n fp32 values in place to the file's type (element j's 2 bytes
 * never pass its 4) and writes them; 0 or an errno. */
static int write_piece(FILE *fp, st_dtype dtype, float *buf, size_t n)
{
    size_t es = dtype == ST_F32 ? 4 : 2;
    if (dtype != ST_F32) {
        uint16_t *h = (uint16_t *)buf;
        for (size_t j = 0; j < n; j++)
            h[j] = dtype == ST_BF16 ? f32_to_bf16(buf[j]) : f32_to_f16(buf[j]);
    }
    errno = 0;
    if (fwrite(buf, es, n, fp) == n) return 0;
    return errno ? errno : EIO;
}

static void *ring_writer(void *arg)
{
    piece_ring *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->count && !r->closing)
            pthread_cond_wait(&r->cv, &r->mu);
        if (!r->count) break;
        int i = r->tail, failed = r->werr;
        pthread_mutex_unlock(&r->mu);
        int e = failed ? 0 : write_piece(r->fp, r->dtype, r->buf[i], r->len[i]);
        pthread_mutex_lock(&r->mu);
        if (e) r->werr = e;
        r->tail = (r->tail + 1) % r->nbuf;
        r->count--;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* A buffer of bytes from bufs, else from malloc (*own says which). */
static float *buf_alloc(const st_bufs *bufs, size_t bytes, int *own)
{
    void *p = bufs && bufs->alloc ? bufs->alloc(bufs->ctx, bytes) : NULL;
    *own = p != NULL;
    return p ? p : malloc(bytes);
}

/* nbuf buffers of cap floats (from bufs where it gives them), a thread
 * when nbuf > 1; one buffer and no thread when that is all memory or the
 * system allows. 0 or -1 (no memory for even one buffer). */
static int ring_open(piece_ring *r, FILE *fp, st_dtype dtype, size_t cap, int nbuf,
                     const st_bufs *bufs)
{
    memset(r, 0, sizeof *r);
    r->fp = fp;
    r->dtype = dtype;
    r->bufs = bufs;
    for (r->nbuf = 0; r->nbuf < nbuf; r->nbuf++)
        if (!(r->buf[r->nbuf] = buf_alloc(bufs, (cap ? cap : 1) * sizeof(float), &r->own[r->nbuf])))
            break;
    if (!r->nbuf) return -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->threaded = r->nbuf > 1 && pthread_create(&r->tid, NULL, ring_writer, r) == 0;
    return 0;
}

/* The buffer to fill next, waiting for a free one; NULL once a write
 * has failed. */
static float *ring_next(piece_ring *r)
{
    if (!r->threaded) return r->werr ? NULL : r->buf[0];
    pthread_mutex_lock(&r->mu);
    while (r->count == r->nbuf && !r->werr)
        pthread_cond_wait(&r->cv, &r->mu);
    float *b = r->werr ? NULL : r->buf[r->head];
    pthread_mutex_unlock(&r->mu);
    return b;
}

/* ring_next's buffer, filled with n elements, to the file. */
static void ring_push(piece_ring *r, size_t n)
{
    if (!r->threaded) {
        r->werr = write_piece(r->fp, r->dtype, r->buf[0], n);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->len[r->head] = n;
    r->head = (r->head + 1) % r->nbuf;
    r->count++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Waits for every pushed piece to be written; the first write's errno,
 * or 0. */
static int ring_close(piece_ring *r)
{
    if (r->threaded) {
        pthread_mutex_lock(&r->mu);
        r->closing = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->tid, NULL);
    }
    for (int i = 0; i < r->nbuf; i++)
        if (r->own[i])
            r->bufs->release(r->bufs->ctx, r->buf[i]);
        else
            free(r->buf[i]);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    return r->werr;
}

/* The header's JSON text: the tensors in order, their data offsets in
 * the file's type; *max_numel: the largest tensor's elements. */
static char *header_text(const st_out *tensors, int n, json_t *metadata, st_dtype dtype,
                         uint64_t *max_numel)
{
    size_t es = dtype == ST_F32 ? 4 : 2;
    json_t *hdr = json_object();
    if (metadata) json_object_set(hdr, "__metadata__", metadata);
    uint64_t off = 0;
    *max_numel = 0;
    for (int i = 0; i < n; i++) {
        const st_out *t = &tensors[i];
        uint64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        if (numel > *max_numel) *max_numel = numel;
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(st_dtype_name(dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + numel * es)));
        json_object_set_new(hdr, t->name, e);
        off += numel * es;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    return text;
}

/* The 8-byte little-endian header length, the header, spaces to the
 * padded length (8 + hlen a multiple of 8); 1 when all was written. */
static int write_header(FILE *fp, const char *text)
{
    size_t tlen = strlen(text), hlen = (tlen + 7) & ~(size_t)7;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(le, 1, 8, fp) == 8 && fwrite(text, 1, tlen, fp) == tlen;
    for (size_t i = tlen; ok && i < hlen; i++)
        ok = fputc(' ', fp) != EOF;
    return ok;
}

/* Every tensor's data through the ring: whole (fill) or piece after piece
 * (fill_range); a tensor of no elements still gets its fill call. 0, or
 * the fill's error; a failed write stops it (ring_close says which). */
static int write_data(piece_ring *r, const st_out *tensors, int n, st_fill_fn fill,
                      st_fill_range_fn fill_range, void *ctx, uint64_t piece, ty_err *err)
{
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++)
            numel *= (uint64_t)tensors[i].shape[d];
        for (uint64_t off = 0; off < numel || off == 0; off += piece) {
            float *buf = ring_next(r);
            if (!buf) return 0;
            size_t k = fill_range ? (size_t)(numel - off < piece ? numel - off : piece) : numel;
            int rc = fill_range ? fill_range(ctx, i, off, k, buf, err) : fill(ctx, i, buf, err);
            if (rc) return rc;
            ring_push(r, k);
            if (!fill_range || !piece) break;
        }
    }
    return 0;
}

/* The writer of st_write_as (whole tensors from fill) and st_write_ranges
 * (pieces from fill_range): one of the two is set. */
static int write_tensors(const char *path, const st_out *tensors, int n, json_t *metadata,
                         st_fill_fn fill, st_fill_range_fn fill_range, void *ctx, st_dtype dtype,
                         const st_bufs *bufs, ty_err *err)
{
    if (dtype != ST_F32 && dtype != ST_BF16 && dtype != ST_F16)
        return ty_err_set(err, TY_EINVAL, "%s: cannot write dtype %s", path, st_dtype_name(dtype));
    uint64_t max_numel;
    char *text = header_text(tensors, n, metadata, dtype, &max_numel);
    if (!text) return ty_err_set(err, TY_ENOMEM, "safetensors header for %s", path);
    uint64_t piece = fill_range && max_numel > ST_WRITE_PIECE ? ST_WRITE_PIECE : max_numel;
    piece_ring r;
    int rc = 0, werr = 0;
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        rc = ty_err_set(err, TY_EIO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (!write_header(fp, text)) {
        werr = errno ? errno : EIO;
    } else if (ring_open(&r, fp, dtype, piece, fill_range ? ST_WRITE_BUFS : 1, bufs)) {
        rc = ty_err_set(err, TY_ENOMEM, "%s: out of memory", path);
        goto out;
    } else {
        rc = write_data(&r, tensors, n, fill, fill_range, ctx, piece, err);
        werr = ring_close(&r);
    }
    if (!rc && !werr && (fflush(fp) != 0 || fsync(fileno(fp)) != 0)) werr = errno ? errno : EIO;
    if (!rc && werr) rc = ty_err_set(err, TY_EIO, "writing %s: %s", path, strerror(werr));
out:
    if (fp && fclose(fp) != 0 && !rc)
        rc = ty_err_set(err, TY_EIO, "closing %s: %s", path, strerror(errno));
    free(text);
    return rc;
}

int st_write(const char *path, const st_out *tensors, int n, json_t *metadata, st_fill_fn fill,
             void *ctx, ty_err *err)
{
    return st_write_as(path, tensors, n, metadata, fill, ctx, ST_F32, err);
}

int st_write_as(const char *path, const st_out *tensors, int n, json_t *metadata, st_fill_fn fill,
                void *ctx, st_dtype dtype, ty_err *err)
{
    return write_tensors(path, tensors, n, metadata, fill, NULL, ctx, dtype, NULL, err);
}

int st_write_ranges(const char *path, const st_out *tensors, int n, json_t *metadata,
                    st_fill_range_fn fill, void *ctx, st_dtype dtype, ty_err *err)
{
    return write_tensors(path, tensors, n, metadata, NULL, fill, ctx, dtype, NULL, err);
}

int st_write_ranges_in(const char *path, const st_out *tensors, int n, json_t *metadata,
                       st_fill_range_fn fill, void *ctx, st_dtype dtype, const st_bufs *bufs,
                       ty_err *err)
{
    return write_tensors(path, tensors, n, metadata, NULL, fill, ctx, dtype, bufs, err);
}
