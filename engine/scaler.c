/* scaler.c — GradScaler's update rule (see scaler.h). */
#include "scaler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

void ty_scaler_init(ty_scaler *s, int enabled)
{
    s->enabled = enabled != 0;
    s->scale = enabled ? TY_SCALER_INIT : 1.0f;
    s->growth_tracker = 0;
    s->skipped = 0;
    s->interval = TY_SCALER_GROWTH_INTERVAL;
}

int64_t ty_scaler_env_interval(void)
{
    const char *v = getenv("TY_TEST_SCALE_GROWTH_INTERVAL");
    if (!v || !*v) return TY_SCALER_GROWTH_INTERVAL;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || *end || n <= 0) return TY_SCALER_GROWTH_INTERVAL;
    return (int64_t)n;
}

int ty_scaler_update(ty_scaler *s, int found_nonfinite)
{
    if (!s->enabled) return 0;
    if (found_nonfinite) {
        s->scale *= 0.5f;
        s->growth_tracker = 0;
        s->skipped++;
        return 1;
    }
    if (++s->growth_tracker >= s->interval) {
        float grown = s->scale * 2.0f;
        if (isfinite(grown))
            s->scale = grown; /* as GradScaler: an overflowing growth is not taken */
        s->growth_tracker = 0;
    }
    return 0;
}
