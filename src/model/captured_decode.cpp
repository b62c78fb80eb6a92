// The captured decoding step: eager warm-up, one capture on a blocking stream, replays.
#include "model/captured_decode.h"

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#endif

namespace shardtrain::model {

#ifdef SHARDTRAIN_WITH_CUDA
struct CapturedDecode::State {
  Llama* model;
  KvCache* cache;
  int64_t calls = 0;
  cuda::BlockingStream stream;  // blocking: eager work on the default stream stays ordered with replays
  cuda::Graph graph;
  Tensor ids, logits;  // the graph's input and output (fixed addresses)
};

CapturedDecode::CapturedDecode(Llama& model, KvCache& cache) : s_(std::make_unique<State>()) {
  ST_CHECK(model.device().is_cuda() && cache.device() == model.device(), "captured decoding: the model is on ",
           model.device().str(), " and its KV cache on ", cache.device().str(), "; CUDA graphs need both on a GPU");
  s_->model = &model;
  s_->cache = &cache;
  s_->ids = Tensor::empty({cache.batch(), 1}, DType::kI32, model.device(), "decode graph ids");
  s_->logits = Tensor::empty({cache.batch(), model.config().vocab_size}, model.dtype(), model.device(),
                             "decode graph logits");
}

CapturedDecode::~CapturedDecode() {
  if (s_) synchronize(s_->model->device());  // a replay in flight still uses the pool
}

bool CapturedDecode::captured() const { return s_->graph.ready(); }

const Tensor& CapturedDecode::run(const Tensor& ids_B1) {
  State& s = *s_;
  Llama& m = *s.model;
  KvCache& cache = *s.cache;
  const int64_t V = m.config().vocab_size;
  ST_CHECK(ids_B1.device().is_cpu() && ids_B1.dtype() == DType::kI32 && ids_B1.shape() == s.ids.shape(),
           "captured decoding: expected i32 host ids ", s.ids.shape().str(), ", found ", ids_B1.str());
  for (int64_t b = 0; b < ids_B1.numel(); ++b) {
    const int32_t id = ids_B1.data<int32_t>()[b];
    ST_CHECK(id >= 0 && id < V, "captured decoding: token id ", id, " of sequence ", b, " is outside [0, ", V, ")");
  }
  cache.check_room(1, "captured decoding");
  if (s.calls++ == 0) {
    m.stage_decode(cache);
    copy(s.ids, ids_B1);
    m.issue_decode(s.ids, cache, s.logits);
  } else {
    const Stream stream = s.stream.get();
    m.stage_decode(cache, stream);
    copy(s.ids, ids_B1, stream);
    if (!s.graph.ready()) {
      synchronize(m.device());
      s.graph.capture(stream, [&] { m.issue_decode(s.ids, cache, s.logits); });
    }
    s.graph.launch(stream);
  }
  cache.advance(1);
  return s.logits;
}
#else
struct CapturedDecode::State {};
CapturedDecode::CapturedDecode(Llama& model, KvCache&) {
  ST_THROW("captured decoding: this build has no CUDA backend (model on ", model.device().str(), ")");
}
CapturedDecode::~CapturedDecode() = default;
bool CapturedDecode::captured() const { return false; }
const Tensor& CapturedDecode::run(const Tensor&) { ST_THROW("captured decoding: no CUDA backend"); }
#endif

}  // namespace shardtrain::model
