// Token streams and deterministic window sampling.
#include "data/dataset.h"

#include "core/random.h"

namespace shardtrain::data {

TokenStreams build_token_streams(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                 double val_fraction, uint64_t seed) {
  ST_CHECK(val_fraction >= 0 && val_fraction < 1, "`data.val_fraction` must be in [0, 1), found ", val_fraction);
  TokenStreams s;
  const uint64_t key = name_key("validation split");
  for (size_t d = 0; d < documents.size(); ++d) {
    std::vector<int32_t>& out = uniform_at(seed, key, d) < val_fraction ? s.val : s.train;
    if (tokenizer.bos_id() >= 0) out.push_back(tokenizer.bos_id());
    const std::vector<int32_t> ids = tokenizer.encode(documents[d]);
    out.insert(out.end(), ids.begin(), ids.end());
    if (tokenizer.eos_id() >= 0) out.push_back(tokenizer.eos_id());
    s.bytes += static_cast<int64_t>(documents[d].size());
  }
  s.documents = static_cast<int64_t>(documents.size());
  return s;
}

WindowSampler::WindowSampler(const std::vector<int32_t>* stream, int64_t seq_len, uint64_t seed)
    : stream_(stream), seq_len_(seq_len), seed_(seed) {
  ST_CHECK(static_cast<int64_t>(stream->size()) > seq_len + 1, "training data has ", stream->size(),
           " tokens, fewer than one sequence of `training.seq_len` + 1 = ", seq_len + 1);
}

void WindowSampler::fill(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                         int64_t first_sequence) const {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  ST_ASSERT(T == seq_len_ && targets_BT.shape() == ids_BT.shape());
  const uint64_t starts = stream_->size() - static_cast<uint64_t>(T) - 1;
  const uint64_t key = hash3(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro));
  int32_t* ids = ids_BT.data<int32_t>();
  int32_t* targets = targets_BT.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t start = hash3(seed_, key, static_cast<uint64_t>(first_sequence + b)) % (starts + 1);
    const int32_t* w = stream_->data() + start;
    for (int64_t t = 0; t < T; ++t) {
      ids[b * T + t] = w[t];
      targets[b * T + t] = w[t + 1];
    }
  }
}

int64_t eval_batches_available(int64_t stream_tokens, int64_t B, int64_t T) {
  return stream_tokens < 1 ? 0 : (stream_tokens - 1) / (B * T);
}

bool fill_eval_batch(Tensor& ids_BT, Tensor& targets_BT, const std::vector<int32_t>& stream, int64_t index) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  if (index >= eval_batches_available(static_cast<int64_t>(stream.size()), B, T)) return false;
  int32_t* ids = ids_BT.data<int32_t>();
  int32_t* targets = targets_BT.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* w = stream.data() + (index * B + b) * T;
    for (int64_t t = 0; t < T; ++t) {
      ids[b * T + t] = w[t];
      targets[b * T + t] = w[t + 1];
    }
  }
  return true;
}

}  // namespace shardtrain::data
