/* rng.h — the engine's one random number generator: splitmix64 (Steele,
 * Lea and Flood, 2014), a 64-bit counter through a mixing function.
 *
 * Everything random in a run comes from it, seeded from the spec's seed
 * and a purpose (the epoch's shuffle, the random init, LoRA's A, sampling
 * in generate), so a run is a pure function of its spec and a resumed run
 * draws the same numbers as an uninterrupted one. Dropout masks are the
 * kernels' own counter-based stream (kn_dropout, kernels.h). */
#ifndef TY_RNG_H
#define TY_RNG_H

#include <stdint.h>

/* The next 64 bits; advances *state. */
uint64_t rng_splitmix64(uint64_t *state);
/* A uniform double in [0, 1) from the top 53 bits of the next draw. */
double rng_unit(uint64_t *state);
/* The state n draws after `state`: splitmix64's state is a counter, so
 * any stretch of the stream can be drawn on its own (the random init's
 * threads each start at their own piece). */
uint64_t rng_skip(uint64_t state, uint64_t n);

#endif
