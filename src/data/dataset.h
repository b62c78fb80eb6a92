// Token streams for training and evaluation: documents become [BOS] tokens [EOS], packed
// end to end. Each document goes to the validation split with probability val_fraction,
// decided by a hash of (seed, document index) so the split never depends on order of work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

struct TokenStreams {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
  int64_t documents = 0;
  int64_t bytes = 0;
};

TokenStreams build_token_streams(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                 double val_fraction, uint64_t seed);

// Draws training windows of T+1 tokens at positions that are a pure function of
// (seed, step, micro-batch, sequence index), so a resumed run and every rank's share of the
// global batch are reproducible with no sampler state beyond the step number.
class WindowSampler {
 public:
  WindowSampler(const std::vector<int32_t>* stream, int64_t seq_len, uint64_t seed);

  // ids_BT = window[0:T], targets_BT = window[1:T+1] for sequences
  // first_sequence .. first_sequence + B - 1 of micro-batch `micro` of step `step`.
  void fill(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro, int64_t first_sequence) const;

 private:
  const std::vector<int32_t>* stream_;
  int64_t seq_len_;
  uint64_t seed_;
};

// Evaluation batches: consecutive non-overlapping windows from the start of the stream.
// Batch `index` holds windows index*B .. index*B + B-1, so a global batch of W*B
// sequences split over W ranks is batches i*W + r. Returns false when the stream has no
// window left for batch `index`.
bool fill_eval_batch(Tensor& ids_BT, Tensor& targets_BT, const std::vector<int32_t>& stream, int64_t index);
// How many such batches of B x T the stream holds.
int64_t eval_batches_available(int64_t stream_tokens, int64_t B, int64_t T);

}  // namespace shardtrain::data
