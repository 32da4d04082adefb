/* dist_bucket.c — bucketed, overlapped gradient sum (see dist_bucket.h). */
#include "dist_bucket.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "events.h"

int bucket_init(grad_buckets *g, coll *c, float *buf, size_t n, int world, int bucket_kb,
                int gather, ty_err *err)
{
    memset(g, 0, sizeof *g);
    g->c = c;
    g->buf = buf;
    g->n = n;
    g->gather = gather;
    g->off = calloc(2 * (size_t)world, sizeof *g->off);
    if (!g->off) return ty_err_set(err, TY_ENOMEM, "out of memory");
    g->len = g->off + world;
    dist_cuts(n, world, g->off, g->len);
    size_t per = (size_t)bucket_kb * 1024 / sizeof(float) / 16 * 16;
    if (per < 16) per = 16;
    g->nb = (int)((n + per - 1) / per);
    if (g->nb < 1) g->nb = 1;
    g->lo = calloc((size_t)g->nb, sizeof *g->lo);
    if (!g->lo) return ty_err_set(err, TY_ENOMEM, "out of memory");
    /* From the end: the full buckets first, the remainder (at the start of
     * the buffer, the embeddings) last. */
    for (int k = 0; k < g->nb; k++)
        g->lo[k] = n > (size_t)(k + 1) * per ? n - (size_t)(k + 1) * per : 0;
    ev_log("data parallel: %d gradient bucket%s of up to %zu KiB, %s during the backward", g->nb,
           g->nb == 1 ? "" : "s", per * sizeof(float) / 1024,
           gather ? "reduce-scattered and all-gathered" : "reduce-scattered (ZeRO-1)");
    return 0;
}

void bucket_free(grad_buckets *g)
{
    free(g->lo);
    free(g->off);
    memset(g, 0, sizeof *g);
}

/* Starts buckets [next, upto). */
static void start(grad_buckets *g, int upto)
{
    for (; g->next < upto && !g->err; g->next++) {
        size_t lo = g->lo[g->next], hi = g->next ? g->lo[g->next - 1] : g->n;
        if (coll_ireduce_f32(g->c, g->buf, lo, hi, g->off, g->len, g->gather, &g->first))
            g->err = 1;
    }
}

void bucket_ready(void *ctx, size_t from)
{
    grad_buckets *g = ctx;
    if (g->err) return;
    double t0 = dist_now();
    int upto = g->next;
    while (upto < g->nb && g->lo[upto] >= from)
        upto++;
    g->early += upto - g->next;
    start(g, upto);
    if (!g->err && coll_progress(g->c, &g->first)) g->err = 1;
    g->comm_s += dist_now() - t0;
}

int bucket_finish(grad_buckets *g, ty_err *err)
{
    double t0 = dist_now();
    g->total += g->nb;
    start(g, g->nb);
    /* Wait even after a failure: no request may outlive the step. */
    ty_err werr;
    int rc = coll_wait(g->c, &werr);
    g->comm_s += dist_now() - t0;
    g->next = 0;
    if (g->err) {
        g->err = 0;
        *err = g->first;
        return -1;
    }
    if (rc) {
        *err = werr;
        return -1;
    }
    return 0;
}
