// The captured step: eager warm-up, one capture on a blocking stream, replays.
#include "model/captured_step.h"

#include <chrono>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#endif

namespace shardtrain::model {

#ifdef SHARDTRAIN_WITH_CUDA
struct CapturedStep::State {
  Llama* model;
  int64_t B, T;
  StepOptions options;
  int64_t calls = 0;
  cuda::BlockingStream stream;  // blocking: eager work on the default stream stays ordered with replays
  cuda::Graph graph;
  Tensor ids, targets, scale, loss;  // the graph's inputs and its loss accumulator (fixed addresses)
  Tensor host_scale = Tensor::empty({1}, DType::kF32, Device::cpu(), "gradient scale");
};

CapturedStep::CapturedStep(Llama& model, int64_t batch, int64_t seq, const StepOptions& options)
    : s_(std::make_unique<State>()) {
  ST_CHECK(model.device().is_cuda(), "captured step: the model is on ", model.device().str(),
           "; CUDA graphs need a GPU");
  s_->model = &model;
  s_->B = batch;
  s_->T = seq;
  s_->options = options;
  s_->ids = Tensor::empty({batch, seq}, DType::kI32, model.device(), "graph input ids");
  s_->targets = Tensor::empty({batch, seq}, DType::kI32, model.device(), "graph input targets");
  s_->scale = Tensor::empty({1}, DType::kF32, model.device(), "graph gradient scale");
  s_->options.grad_scale_device = s_->scale;
}

CapturedStep::~CapturedStep() {
  if (s_) synchronize(s_->model->device());  // a replay in flight still uses the pool
}

bool CapturedStep::captured() const { return s_->graph.ready(); }

LossSum CapturedStep::run(const Tensor& ids_BT, const Tensor& targets_BT, double grad_scale) {
  State& s = *s_;
  Llama& m = *s.model;
  ST_CHECK(ids_BT.ndim() == 2 && ids_BT.size(0) == s.B && ids_BT.size(1) == s.T, "captured step: expected ids [",
           s.B, ", ", s.T, "] (the captured shape), found ", ids_BT.str());
  s.host_scale.data<float>()[0] = static_cast<float>(grad_scale);
  s.options.grad_scale = grad_scale;
  if (s.calls++ == 0) {
    copy(s.scale, s.host_scale);
    return m.forward_backward(ids_BT, targets_BT, s.options);
  }
  const int64_t counted = m.check_inputs(ids_BT, targets_BT, s.options, "captured step");
  const auto t0 = std::chrono::steady_clock::now();
  const Stream stream = s.stream.get();
  if (!s.graph.ready()) {
    // the eager step's cached blocks go back to the driver; the pool is filled afresh
    synchronize(m.device());
    cuda::empty_cache(m.device().index);
    s.graph.capture(stream, [&] {
      s.loss = m.new_loss();  // zeroed by the graph on every replay
      m.issue_forward_backward(s.ids, s.targets, s.loss, s.options);
    });
  }
  m.store().before_replay();  // on the default stream, which the blocking stream follows
  copy(s.ids, ids_BT, stream);
  copy(s.targets, targets_BT, stream);
  copy(s.scale, s.host_scale, stream);
  s.graph.launch(stream);
  const double issued = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double loss_sum = Llama::read_loss(s.loss);  // the default stream waits for the blocking stream
  m.read_phase_times();
  m.set_host_issue_seconds(issued);
  return {loss_sum, counted};
}
#else
struct CapturedStep::State {};
CapturedStep::CapturedStep(Llama& model, int64_t, int64_t, const StepOptions&) {
  ST_THROW("captured step: this build has no CUDA backend (model on ", model.device().str(), ")");
}
CapturedStep::~CapturedStep() = default;
bool CapturedStep::captured() const { return false; }
LossSum CapturedStep::run(const Tensor&, const Tensor&, double) { ST_THROW("captured step: no CUDA backend"); }
#endif

}  // namespace shardtrain::model
