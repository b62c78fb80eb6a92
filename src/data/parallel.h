// Loops over independent items (documents, examples) on every OpenMP thread whose errors do not
// depend on the thread count: when items throw, the one with the lowest index is rethrown.
#pragma once

#include <omp.h>

#include <cstdint>
#include <exception>

namespace shardtrain::data {

// body(i) for i in [0, n) on `threads` threads (0: OpenMP's default), in chunks of 16 handed
// out as threads free up; after all have run, rethrows the exception of the lowest i that threw.
template <typename Body>
void parallel_for_lowest_error(int64_t n, int threads, Body&& body) {
  std::exception_ptr error;
  int64_t error_index = n;
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
#pragma omp critical(shardtrain_parallel_for_lowest_error)
      if (i < error_index) {
        error_index = i;
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace shardtrain::data
