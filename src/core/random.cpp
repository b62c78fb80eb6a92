// Counter-based generator: splitmix64 finaliser chained over (seed, key, index).
#include "core/random.h"

#include "core/random_math.h"

namespace shardtrain {

uint64_t hash3(uint64_t seed, uint64_t key, uint64_t index) { return random_math::hash3(seed, key, index); }

uint64_t name_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

double uniform_at(uint64_t seed, uint64_t key, uint64_t index) { return random_math::uniform_at(seed, key, index); }

double normal_at(uint64_t seed, uint64_t key, uint64_t index) { return random_math::normal_at(seed, key, index); }

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
