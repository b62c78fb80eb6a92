// The arithmetic of the counter-based generator, inline for host and device code alike, so
// a GPU initialises parameters from the same integers as the CPU (see core/random.h).
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define ST_HOST_DEVICE __host__ __device__
#else
#define ST_HOST_DEVICE
#endif

namespace shardtrain::random_math {

ST_HOST_DEVICE inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

ST_HOST_DEVICE inline uint64_t hash3(uint64_t seed, uint64_t key, uint64_t index) {
  uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ (key + 0x632be59bd9b4e019ull));
  return mix(h ^ (index + 0x85ebca77c2b2ae63ull));
}

// (k + 0.5) / 2^53 lies strictly inside (0, 1)
ST_HOST_DEVICE inline double uniform_at(uint64_t seed, uint64_t key, uint64_t index) {
  return (static_cast<double>(hash3(seed, key, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Box-Muller over the element's two uniforms. The integers agree bit for bit between host
// and device; log and cos may differ in the last bit of the f64 result.
ST_HOST_DEVICE inline double normal_at(uint64_t seed, uint64_t key, uint64_t index) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = uniform_at(seed, key, 2 * index);
  const double u2 = uniform_at(seed, key, 2 * index + 1);
  return sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);
}

}  // namespace shardtrain::random_math
