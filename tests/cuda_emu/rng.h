/* rng.h - the emulation tests' random numbers: xorshift64*, so every
 * machine draws the same inputs. */
#ifndef HPDL_TEST_RNG_H
#define HPDL_TEST_RNG_H

#include <stdint.h>

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 2654435761u + 88172645463325252ull) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) / 9007199254740992.0; }
};

#endif
