/* Counter-based random numbers: a value is a pure function of (key, counter),
 * so results never depend on thread count, batch composition or call order. */
#ifndef TRILL_RNG_H
#define TRILL_RNG_H

#include <stdint.h>

/* 64 random bits for (key, counter) — SplitMix64 finaliser applied twice. */
uint64_t trill_rng_bits(uint64_t key, uint64_t counter);

/* Mixes several identifiers (seed, step, sequence, ...) into one key. */
uint64_t trill_rng_key(uint64_t a, uint64_t b);

/* Uniform in [0, 1) with 53 random bits. */
double trill_rng_uniform(uint64_t key, uint64_t counter);

/* Standard normal (Box-Muller over counters 2c and 2c+1). */
double trill_rng_normal(uint64_t key, uint64_t counter);

#endif
