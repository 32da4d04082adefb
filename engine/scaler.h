/* scaler.h — fp16 dynamic loss scaling, torch.cuda.amp.GradScaler's rule.
 *
 * The loss (so every gradient) is multiplied by `scale` before the
 * backward. After the backward the trainer asks whether any gradient is
 * inf/NaN and reports it here once per optimizer step:
 *   - inf/NaN: the update is skipped, the scale halves (backoff 0.5), the
 *     clean-step count restarts and the skipped count grows;
 *   - clean: after `interval` clean steps in a row (GradScaler's
 *     growth_interval, 2000) the scale doubles (growth 2.0), unless the
 *     doubled scale would not be finite in fp32 (GradScaler keeps it then).
 * The scale is an fp32 number, as GradScaler keeps it. The state (scale,
 * growth tracker, skipped steps) goes into trainer_state.json so a resumed
 * run continues bit-identically. A scaler that is not enabled (fp32,
 * bf16) stays at scale 1 and never skips.
 *
 * Kept apart from train.c so the rule can be driven thousands of steps
 * in a unit test (tests/engine/test_scaler.c) without a model. */
#ifndef TY_SCALER_H
#define TY_SCALER_H

#include <stdint.h>

#define TY_SCALER_INIT 65536.0f        /* 2^16, GradScaler's init_scale */
#define TY_SCALER_GROWTH_INTERVAL 2000 /* GradScaler's growth_interval */

typedef struct ty_scaler {
    int enabled;            /* fp16 only */
    float scale;            /* 1 when not enabled */
    int64_t growth_tracker; /* clean steps since the scale last changed */
    int64_t skipped;        /* steps skipped for inf/NaN gradients */
    int64_t interval;       /* clean steps before the scale doubles */
} ty_scaler;

/* enabled: the initial state of GradScaler (scale 2^16, interval 2000);
 * otherwise scale 1. */
void ty_scaler_init(ty_scaler *s, int enabled);

/* The growth interval from TY_TEST_SCALE_GROWTH_INTERVAL (a test-only knob
 * so an end-to-end test sees a doubling in a few steps): its value when it
 * is a positive integer, else TY_SCALER_GROWTH_INTERVAL. */
int64_t ty_scaler_env_interval(void);

/* One optimizer step's verdict. Returns 1 when the step must be skipped
 * (found_nonfinite and enabled), 0 when the update goes ahead. Call it
 * after the update for a clean step, so `scale` still holds the value the
 * step's gradients were multiplied by when they are unscaled. */
int ty_scaler_update(ty_scaler *s, int found_nonfinite);

#endif
