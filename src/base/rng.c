#include "trill/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t trill_rng_bits(uint64_t key, uint64_t counter) {
    return splitmix64(splitmix64(key) ^ counter);
}

uint64_t trill_rng_key(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632be59bd9b4e019ull)); }

double trill_rng_uniform(uint64_t key, uint64_t counter) {
    return (double)(trill_rng_bits(key, counter) >> 11) * 0x1.0p-53;
}

double trill_rng_normal(uint64_t key, uint64_t counter) {
    double u1 = trill_rng_uniform(key, 2 * counter);
    double u2 = trill_rng_uniform(key, 2 * counter + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
