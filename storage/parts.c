/* parts.c — runs the parts of one large upload on a small thread pool.
 *
 * S3 multipart, Azure blocks and anything else split into independent
 * pieces share this: up to `parallel` threads take part numbers from a
 * counter; the first failure stops the others from starting new parts and
 * its error is returned, so the caller can abort the upload as a whole. */
#include <stdlib.h>

#include "store_int.h"

typedef struct pool {
    int (*fn)(void *ctx, int idx, ty_err *err);
    void *ctx;
    int nparts;
    pthread_mutex_t mu;
    int next, failed, first_rc;
    ty_err first_err;
} pool;

static void *pool_worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->failed ? p->nparts : p->next++;
        pthread_mutex_unlock(&p->mu);
        if (i >= p->nparts) break;
        ty_err e = {0};
        int rc = p->fn(p->ctx, i, &e);
        if (rc) {
            pthread_mutex_lock(&p->mu);
            if (!p->failed) {
                p->failed = 1;
                p->first_rc = rc;
                p->first_err = e;
            }
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
    return NULL;
}

int store_run_parts(store *s, int nparts, int (*fn)(void *ctx, int idx, ty_err *err), void *ctx,
                    ty_err *err)
{
    pool p = {.fn = fn, .ctx = ctx, .nparts = nparts};
    pthread_mutex_init(&p.mu, NULL);
    int nthreads = s->tune.parallel < nparts ? s->tune.parallel : nparts;
    pthread_t th[32];
    int started = 0;
    for (int i = 0; i < nthreads && i < 32; i++) {
        if (pthread_create(&th[i], NULL, pool_worker, &p) != 0) break;
        started++;
    }
    if (started == 0) pool_worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.mu);
    if (p.failed) {
        if (err) *err = p.first_err;
        return p.first_rc;
    }
    return 0;
}
