/* retry.c — exponential backoff with jitter between attempts of one
 * request or one part.
 *
 * Full jitter over the upper half of the window ([d/2, d]) keeps parallel
 * parts that failed together from retrying in lockstep while still waiting
 * at least half the nominal delay, which a throttling service (429/503)
 * asks for. The wait is sliced so that store_cancel ends it promptly. */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

int64_t store_retry_delay_ms(const store_tuning *t, int attempt, uint32_t rnd)
{
    if (attempt < 1) return 0;
    int64_t d = t->retry_base_ms;
    for (int i = 1; i < attempt && d < t->retry_max_ms; i++)
        d *= 2;
    if (d > t->retry_max_ms) d = t->retry_max_ms;
    int64_t half = d / 2;
    return half + (half > 0 ? (int64_t)(rnd % (uint32_t)(half + 1)) : 0);
}

int store_check_cancel(store *s, ty_err *err)
{
    if (s && atomic_load(&s->cancelled)) return ty_err_set(err, TY_ESTATE, "storage: cancelled");
    return 0;
}

int store_retry_sleep(store *s, int attempt, ty_err *err)
{
    /* Per-thread seed from the clock and the thread's stack address: good
     * enough to spread retries, no shared state to lock. */
    static _Thread_local unsigned seed;
    if (!seed) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (unsigned)ts.tv_nsec ^ (unsigned)(uintptr_t)&ts;
        if (!seed) seed = 1;
    }
    int64_t ms = store_retry_delay_ms(&s->tune, attempt, (uint32_t)rand_r(&seed));
    /* Sleep in short slices so store_cancel is noticed promptly. */
    while (ms > 0) {
        int rc = store_check_cancel(s, err);
        if (rc) return rc;
        int64_t slice = ms < 50 ? ms : 50;
        struct timespec req = {.tv_sec = 0, .tv_nsec = slice * 1000000L};
        while (nanosleep(&req, &req) != 0 && errno == EINTR) {
        }
        ms -= slice;
    }
    return store_check_cancel(s, err);
}
