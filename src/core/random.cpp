// Counter-based generator: splitmix64 finaliser chained over (seed, key, index).
#include "core/random.h"

#include <cmath>

namespace shardtrain {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr double kTwoPi = 6.283185307179586476925286766559;

}  // namespace

uint64_t hash3(uint64_t seed, uint64_t key, uint64_t index) {
  uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ (key + 0x632be59bd9b4e019ull));
  return mix(h ^ (index + 0x85ebca77c2b2ae63ull));
}

uint64_t name_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

double uniform_at(uint64_t seed, uint64_t key, uint64_t index) {
  // (k + 0.5) / 2^53 lies strictly inside (0, 1)
  return (static_cast<double>(hash3(seed, key, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double normal_at(uint64_t seed, uint64_t key, uint64_t index) {
  const double u1 = uniform_at(seed, key, 2 * index);
  const double u2 = uniform_at(seed, key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

double CounterRng::next_uniform() {
  return (static_cast<double>(next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

uint64_t CounterRng::next_below(uint64_t bound) {
  // rejection sampling: discard the top partial range so every residue is equally likely
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t r;
  do {
    r = next_u64();
  } while (r >= limit);
  return r % bound;
}

}  // namespace shardtrain
