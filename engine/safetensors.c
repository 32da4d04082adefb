/* safetensors.c — mmap reader with full header validation (the writer is
 * st_write.c).
 *
 * Validation happens once in st_open; afterwards every tensor's span is known
 * to lie inside the mapping, so conversions need no further checks. Spans are
 * sorted by offset to check that no two overlap (holes are tolerated).
 * Loaders read a tensor a slice at a time with pread (st_read_as), not
 * through the mapping, so a multi-GB file is never resident in the process. */
#include "safetensors.h"

#include "tyopen.h"
#include "tyutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* HF refuses headers above 100 MB; so do we (a hostile length would
 * otherwise make us parse an arbitrarily large mapping as JSON). */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

static const struct {
    const char *name;
    int size;
} st_dtypes[ST_NDTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},   [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype d)
{
    return (unsigned)d < ST_NDTYPES ? st_dtypes[d].name : "?";
}

uint64_t st_numel(const st_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

static void st_free_tensors(st_file *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

void st_close(st_file *f)
{
    if (!f) return;
    st_free_tensors(f);
    if (f->map) munmap(f->map, f->map_len);
    if (f->map) close(f->fd);
    json_decref(f->metadata);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Parses one tensor entry of the header into t; data_len bounds the span. */
static int st_parse_entry(const char *path, const char *name, json_t *v, uint64_t data_len,
                          st_tensor *t, ty_err *err)
{
    if (!json_is_object(v))
        return ty_err_field(err, TY_EINVAL, name, "%s: tensor %s: header entry is not an object",
                            path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return ty_err_field(
            err, TY_EINVAL, name,
            "%s: tensor %s: header entry needs dtype, shape and data_offsets [begin, end]", path,
            name);
    int dt = -1;
    for (int i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(json_string_value(jd), st_dtypes[i].name)) dt = i;
    if (dt < 0)
        return ty_err_field(err, TY_EINVAL, name, "%s: tensor %s: unknown dtype \"%s\"", path, name,
                            ty_safe_word(json_string_value(jd)));
    t->dtype = (st_dtype)dt;
    if (json_array_size(js) > ST_MAX_DIMS)
        return ty_err_field(err, TY_EINVAL, name, "%s: tensor %s: more than %d dimensions", path,
                            name, ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    /* numel * size computed with an overflow guard: shapes come from the file. */
    uint64_t bytes = (uint64_t)st_dtypes[dt].size;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ty_err_field(err, TY_EINVAL, name,
                                "%s: tensor %s: shape must be non-negative integers", path, name);
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] != 0 && bytes > UINT64_MAX / (uint64_t)t->shape[i])
            return ty_err_field(err, TY_EINVAL, name, "%s: tensor %s: shape overflows", path, name);
        bytes *= (uint64_t)t->shape[i];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return ty_err_field(err, TY_EINVAL, name,
                            "%s: tensor %s: data_offsets must be 0 <= begin <= end", path, name);
    t->begin = (uint64_t)json_integer_value(b);
    t->end = (uint64_t)json_integer_value(e);
    if (t->end - t->begin != bytes)
        return ty_err_field(err, TY_EINVAL, name,
                            "%s: tensor %s: shape x dtype is %llu bytes but data_offsets span %llu",
                            path, name, (unsigned long long)bytes,
                            (unsigned long long)(t->end - t->begin));
    if (t->end > data_len)
        return ty_err_field(
            err, TY_EINVAL, name,
            "%s: tensor %s: data_offsets [%llu, %llu) outside the data area of %llu bytes "
            "(truncated file?)",
            path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
            (unsigned long long)data_len);
    return 0;
}

static int st_cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

int st_open(st_file *f, const char *path, ty_err *err)
{
    memset(f, 0, sizeof *f);
    /* Regular files inside the engine's roots only (tyopen.h). */
    int fd = ty_open_input(path, err);
    if (fd < 0) return err ? err->code : TY_EIO;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ty_err_set(err, TY_EIO, "%s: %s", path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return ty_err_set(err, TY_EINVAL,
                          "%s: truncated: %zu bytes, shorter than the 8-byte header length", path,
                          size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return ty_err_set(err, TY_EIO, "%s: mmap: %s", path, strerror(errno));
    }
    f->fd = fd;
    f->map = map;
    f->map_len = size;
    f->path = strdup(path);

    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    int rc;
    if (hlen > size - 8) {
        rc = ty_err_set(err, TY_EINVAL,
                        "%s: header length %llu beyond the file size %zu (truncated file?)", path,
                        (unsigned long long)hlen, size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER || hlen < 2) {
        rc = ty_err_set(err, TY_EINVAL, "%s: implausible header length %llu", path,
                        (unsigned long long)hlen);
        goto fail;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        rc = ty_err_set(err, TY_EINVAL, "%s: header is not valid JSON (byte %d: %s)", path,
                        je.position, ty_json_error(&je));
        goto fail;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        rc = ty_err_set(err, TY_EINVAL, "%s: header is not a JSON object", path);
        goto fail;
    }
    uint64_t data_len = size - 8 - hlen;
    const uint8_t *data = p + 8 + hlen;
    f->t = calloc(json_object_size(root) + 1, sizeof *f->t);
    if (!f->t) {
        rc = ty_err_set(err, TY_ENOMEM, "%s: out of memory for %zu header entries", path,
                        json_object_size(root));
        json_decref(root);
        goto fail;
    }
    const char *key;
    json_t *val;
    rc = 0;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                rc = ty_err_set(err, TY_EINVAL, "%s: __metadata__ is not an object", path);
                break;
            }
            f->metadata = json_incref(val);
            continue;
        }
        st_tensor *t = &f->t[f->n];
        rc = st_parse_entry(path, key, val, data_len, t, err);
        if (rc) break;
        t->name = strdup(key);
        t->data = data + t->begin;
        t->fd = fd;
        t->file_off = 8 + hlen + t->begin;
        f->n++;
    }
    json_decref(root);
    if (rc) goto fail;

    /* Non-overlap: sort views by begin, each non-empty span must start at or
     * after the previous non-empty span's end. */
    const st_tensor **order = malloc(((size_t)f->n + 1) * sizeof *order);
    if (!order) {
        rc = ty_err_set(err, TY_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < f->n; i++)
        order[i] = &f->t[i];
    qsort(order, (size_t)f->n, sizeof *order, st_cmp_begin);
    const st_tensor *prev = NULL;
    for (int i = 0; i < f->n && rc == 0; i++) {
        const st_tensor *t = order[i];
        if (t->begin == t->end) continue;
        if (prev && t->begin < prev->end)
            rc = ty_err_field(err, TY_EINVAL, t->name,
                              "%s: tensors %s and %s overlap in the data area", path, prev->name,
                              t->name);
        prev = t;
    }
    free(order);
    if (rc) goto fail;
    return 0;
fail:
    st_close(f);
    return rc;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float st_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int st_to_f32(const st_tensor *t, float *out, ty_err *err)
{
    return st_read_as(t, 0, st_numel(t), ST_F32, out, err);
}

/* len bytes of t's data from byte off on. */
static int st_pread(const st_tensor *t, uint64_t off, void *buf, size_t len, ty_err *err)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t k = pread(t->fd, p, len, (off_t)(t->file_off + off));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ty_err_field(err, TY_EIO, t->name, "reading tensor %s: %s", t->name,
                                k < 0 ? strerror(errno) : "the file shrank");
        p += k;
        off += (uint64_t)k;
        len -= (size_t)k;
    }
    return 0;
}

int st_read_as(const st_tensor *t, uint64_t e0, uint64_t n, st_dtype want, void *out, ty_err *err)
{
    if (e0 > st_numel(t) || n > st_numel(t) - e0)
        return ty_err_field(err, TY_EINVAL, t->name,
                            "tensor %s: elements [%llu, +%llu) out of range", t->name,
                            (unsigned long long)e0, (unsigned long long)n);
    uint64_t es = (uint64_t)st_dtypes[t->dtype].size;
    /* The same dtype is a copy (bf16 -> bf16: no fp32 on the way). */
    if (want == t->dtype && (want == ST_F32 || want == ST_F16 || want == ST_BF16))
        return st_pread(t, e0 * es, out, n * es, err);
    if (want != ST_F32)
        return ty_err_field(err, TY_EINVAL, t->name, "tensor %s: cannot read %s as %s", t->name,
                            st_dtype_name(t->dtype), st_dtype_name(want));
    if (t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64)
        return ty_err_field(err, TY_EINVAL, t->name,
                            "tensor %s has dtype %s; want F32, F16 or BF16", t->name,
                            st_dtype_name(t->dtype));
    /* Converted through a small buffer, 64 KiB at a time. */
    uint8_t tmp[1 << 16];
    float *o = out;
    uint64_t per = sizeof tmp / es;
    for (uint64_t i0 = 0; i0 < n; i0 += per) {
        uint64_t k = n - i0 < per ? n - i0 : per;
        int rc = st_pread(t, (e0 + i0) * es, tmp, (size_t)(k * es), err);
        if (rc) return rc;
        for (uint64_t i = 0; i < k; i++) {
            if (t->dtype == ST_F64) {
                double d;
                memcpy(&d, tmp + 8 * i, 8);
                o[i0 + i] = (float)d;
            } else {
                uint16_t h;
                memcpy(&h, tmp + 2 * i, 2);
                o[i0 + i] = t->dtype == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
            }
        }
    }
    return 0;
}

const char *st_foreign_quant(const char *name)
{
    static const struct {
        const char *suffix, *what;
    } marks[] = {
        {".qweight", "GPTQ/AWQ"},
        {".qzeros", "GPTQ/AWQ"},
        {".scales", "GPTQ/AWQ"},
        {".g_idx", "GPTQ"},
        {".weight.absmax", "bitsandbytes"},
        {".weight.quant_map", "bitsandbytes"},
        {".weight.nested_absmax", "bitsandbytes"},
        {".weight.SCB", "bitsandbytes int8"},
    };
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        size_t s = strlen(marks[i].suffix);
        if (n >= s && !strcmp(name + n - s, marks[i].suffix)) return marks[i].what;
    }
    if (strstr(name, ".weight.quant_state.")) return "bitsandbytes";
    return NULL;
}
