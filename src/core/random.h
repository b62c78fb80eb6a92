// Counter-based random numbers: every value is a pure function of (seed, key, index), so a
// parameter element gets the same initial value on 1 or 1000 ranks, in any order.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardtrain {

// A strong 64-bit mix of three words (splitmix64 finaliser applied in a chain).
uint64_t hash3(uint64_t seed, uint64_t key, uint64_t index);
// FNV-1a of a name, e.g. a parameter name, used as the `key` above.
uint64_t name_key(std::string_view name);
// Uniform in (0, 1) from the top 53 bits of hash3.
double uniform_at(uint64_t seed, uint64_t key, uint64_t index);
// Standard normal by Box-Muller over two independent uniforms of this element.
double normal_at(uint64_t seed, uint64_t key, uint64_t index);

// A sequential generator whose whole state is (seed, counter): saved in checkpoints so a
// resumed run draws the same numbers it would have drawn without stopping.
class CounterRng {
 public:
  explicit CounterRng(uint64_t seed = 0, uint64_t counter = 0) : seed_(seed), counter_(counter) {}
  uint64_t next_u64() { return hash3(seed_, 0x5eed, counter_++); }
  double next_uniform();                 // (0, 1)
  uint64_t next_below(uint64_t bound);   // [0, bound), bound > 0, unbiased
  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }

 private:
  uint64_t seed_;
  uint64_t counter_;
};

}  // namespace shardtrain
