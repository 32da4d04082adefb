/* rng.c — splitmix64 and the uniform draw built on it (see rng.h). */
#include "rng.h"

#define RNG_GAMMA 0x9E3779B97F4A7C15ull

uint64_t rng_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += RNG_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_unit(uint64_t *state)
{
    return (double)(rng_splitmix64(state) >> 11) * 0x1.0p-53;
}

uint64_t rng_skip(uint64_t state, uint64_t n)
{
    return state + n * RNG_GAMMA;
}
