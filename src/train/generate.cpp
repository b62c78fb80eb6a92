// Autoregressive sampling (recomputes the window each token; fine for short CPU samples).
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/random.h"
#include "ops/elementwise.h"

namespace shardtrain::train {
namespace {

int32_t pick(const std::vector<double>& logits, const SampleOptions& o, CounterRng& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.temperature <= 0) return order[0];
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  double u = rng.next_uniform() * sum;
  for (int64_t i = 0; i < k; ++i) {
    u -= p[i];
    if (u <= 0) return order[i];
  }
  return order[static_cast<size_t>(k - 1)];
}

}  // namespace

std::string generate(model::Llama& model, const data::Tokenizer& tokenizer, const SampleOptions& o) {
  std::vector<int32_t> ids;
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  const std::vector<int32_t> prompt = tokenizer.encode(o.prompt);
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  const size_t first_new = ids.size();
  CounterRng rng(o.seed);
  const int64_t window = model.config().max_seq_len;
  for (int64_t n = 0; n < o.tokens; ++n) {
    const int64_t T = std::min<int64_t>(window, static_cast<int64_t>(ids.size()));
    Tensor x = Tensor::empty({1, T}, DType::kI32, Device::cpu(), "sample ids");
    std::copy(ids.end() - T, ids.end(), x.data<int32_t>());
    const Tensor logits = model.last_logits(x);
    Tensor host = Tensor::empty(logits.shape(), DType::kF64, Device::cpu(), "sample logits");
    ops::cast(host, logits);
    const double* l = host.data<double>();
    const int32_t next = pick(std::vector<double>(l, l + host.numel()), o, rng);
    if (next == tokenizer.eos_id()) break;
    ids.push_back(next);
  }
  return o.prompt + tokenizer.decode(std::span<const int32_t>(ids.data() + first_new, ids.size() - first_new));
}

}  // namespace shardtrain::train
