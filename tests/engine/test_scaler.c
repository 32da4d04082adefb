/* test_scaler.c — the fp16 loss scaler's rule (engine/scaler.c), driven
 * for thousands of steps without a model: GradScaler's defaults (2^16,
 * doubling after exactly 2000 clean steps, halving and skipping on an
 * inf/NaN step), the growth that would overflow fp32, and the test knob
 * TY_TEST_SCALE_GROWTH_INTERVAL. The end-to-end run with the knob is
 * engine_ref.mixed_fp16_growth. */
#include <math.h>
#include <stdlib.h>

#include "tyassert.h"
#include "scaler.h"

int main(void)
{
    ty_scaler s;

    /* The real default: 2^16, and the interval is 2000. */
    unsetenv("TY_TEST_SCALE_GROWTH_INTERVAL");
    ty_scaler_init(&s, 1);
    CHECK(s.scale == 65536.0f && s.interval == 2000 && s.growth_tracker == 0 && s.skipped == 0);
    CHECK(ty_scaler_env_interval() == 2000);

    /* 1999 clean steps: no growth; the 2000th doubles and restarts the count. */
    for (int i = 0; i < 1999; i++)
        CHECK(ty_scaler_update(&s, 0) == 0);
    CHECK(s.scale == 65536.0f && s.growth_tracker == 1999);
    CHECK(ty_scaler_update(&s, 0) == 0);
    CHECK(s.scale == 131072.0f && s.growth_tracker == 0);

    /* Another 2000 clean steps: doubles again, exactly at the 2000th. */
    for (int i = 0; i < 1999; i++)
        ty_scaler_update(&s, 0);
    CHECK(s.scale == 131072.0f);
    ty_scaler_update(&s, 0);
    CHECK(s.scale == 262144.0f);

    /* An inf/NaN step: skipped, halved, the clean count restarts ... */
    for (int i = 0; i < 1500; i++)
        ty_scaler_update(&s, 0);
    CHECK(s.growth_tracker == 1500);
    CHECK(ty_scaler_update(&s, 1) == 1);
    CHECK(s.scale == 131072.0f && s.growth_tracker == 0 && s.skipped == 1);
    /* ... so the next growth needs 2000 clean steps from there, not 500. */
    for (int i = 0; i < 1999; i++)
        ty_scaler_update(&s, 0);
    CHECK(s.scale == 131072.0f);
    ty_scaler_update(&s, 0);
    CHECK(s.scale == 262144.0f && s.skipped == 1);

    /* Consecutive overflows halve each time. */
    for (int i = 0; i < 3; i++)
        CHECK(ty_scaler_update(&s, 1) == 1);
    CHECK(s.scale == 32768.0f && s.skipped == 4);

    /* A growth that would overflow fp32 is not taken (GradScaler keeps
     * the scale then), and the count still restarts. */
    s.scale = 0x1p127f;
    s.growth_tracker = 1999;
    ty_scaler_update(&s, 0);
    CHECK(s.scale == 0x1p127f && isfinite(s.scale) && s.growth_tracker == 0);

    /* Not enabled (fp32, bf16): scale 1 for ever, nothing skipped. */
    ty_scaler_init(&s, 0);
    for (int i = 0; i < 4100; i++)
        CHECK(ty_scaler_update(&s, i == 7) == 0);
    CHECK(s.scale == 1.0f && s.skipped == 0);

    /* The test knob: a positive integer replaces the interval; anything
     * else leaves the default. */
    setenv("TY_TEST_SCALE_GROWTH_INTERVAL", "3", 1);
    CHECK(ty_scaler_env_interval() == 3);
    const char *bad[] = {"0", "-5", "3x", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TY_TEST_SCALE_GROWTH_INTERVAL", bad[i], 1);
        CHECK(ty_scaler_env_interval() == 2000);
    }
    unsetenv("TY_TEST_SCALE_GROWTH_INTERVAL");

    return ty_summary("engine scaler");
}
