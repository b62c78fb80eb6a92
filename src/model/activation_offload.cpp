// Activation offload: block activations to page-locked host memory and back (see the header).
#include "model/activation_offload.h"

#include <algorithm>
#include <deque>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace shardtrain::model {

#ifdef SHARDTRAIN_WITH_CUDA
namespace {

// A block's defined tensors grouped by the storage under them (q, k and v are views of one
// product, gate and up of another): each group moves in one copy.
struct Group {
  Tensor base;
  std::vector<Tensor*> members;
};

std::vector<Group> groups_of(BlockActivations& acts) {
  std::vector<Group> out;
  for (Tensor* t : acts.tensors()) {
    if (!t->defined()) continue;
    Tensor b = t->base();
    auto it = std::find_if(out.begin(), out.end(), [&](const Group& g) { return g.base.raw_data() == b.raw_data(); });
    if (it == out.end()) {
      out.push_back({std::move(b), {t}});
    } else {
      it->members.push_back(t);
    }
  }
  return out;
}

}  // namespace

struct ActivationOffload::State {
  cuda::OwnedStream copy_stream;
  cuda::Event compute_point;  // the compute stream's progress when a copy is queued
  std::deque<cuda::Event> down, up;  // [block] its copy down / up has finished
  std::vector<std::vector<std::shared_ptr<cuda::PinnedBuffer>>> pinned;  // [block][group]
  std::vector<bool> on_host;     // [block] acts point at host memory
  std::vector<bool> coming_up;   // [block] copy up queued, the compute stream not yet waiting for it
  std::vector<Tensor> leaving;   // device storage of block `leaving_block`, still being copied down
  int64_t leaving_block = -1;
  int64_t bytes_offloaded = 0;
  // Event pairs around each compute-stream wait: (before, after) elapsed = time stood still.
  // Past kMaxTimedWaits pairs (a caller that never takes them) the oldest are summed into
  // waited_ms, so the pairs do not grow without bound.
  static constexpr size_t kMaxTimedWaits = 1024;
  std::deque<std::pair<cuda::Event, cuda::Event>> waits;
  size_t waits_used = 0;
  double waited_ms = 0;

  double sum_waits_ms() {
    double ms = 0;
    for (size_t i = 0; i < waits_used; ++i) {
      waits[i].second.synchronize();
      ms += waits[i].second.elapsed_ms_since(waits[i].first);
    }
    waits_used = 0;
    return ms;
  }
  // The compute stream waits for `e`; timed outside a capture.
  void compute_waits_for(const cuda::Event& e) {
    if (cuda::is_capturing(Stream{})) return e.make_wait(Stream{});
    if (waits_used == kMaxTimedWaits) waited_ms += sum_waits_ms();
    if (waits_used == waits.size()) waits.emplace_back();
    auto& [before, after] = waits[waits_used++];
    before.record(Stream{});
    e.make_wait(Stream{});
    after.record(Stream{});
  }

  void size_for(int64_t n_blocks) {
    const auto n = static_cast<size_t>(n_blocks);
    if (on_host.size() == n) return;
    ST_CHECK(leaving_block < 0 && std::none_of(on_host.begin(), on_host.end(), [](bool b) { return b; }),
             "activation offload: the model's block count changed between a forward and its backward");
    down.resize(n);
    up.resize(n);
    pinned.resize(n);
    on_host.assign(n, false);
    coming_up.assign(n, false);
  }
  // The compute stream waits for block `leaving_block`'s copy down; its device memory goes
  // back to the allocator in compute-stream order after that wait.
  void settle_leaving() {
    if (leaving_block < 0) return;
    compute_waits_for(down[static_cast<size_t>(leaving_block)]);
    leaving.clear();
    leaving_block = -1;
  }
};

ActivationOffload::ActivationOffload(Device device) : device_(device) {
  ST_CHECK(device.is_cuda(), "activation offload (training.offload_activations) moves activations from a GPU to ",
           "host memory; the model is on ", device.str());
  s_ = std::make_unique<State>();
}

ActivationOffload::~ActivationOffload() {
  if (s_) s_->copy_stream.synchronize();  // copies in flight still use the host buffers
}

void ActivationOffload::after_forward(int64_t l, int64_t n_blocks, BlockActivations& acts) {
  State& s = *s_;
  s.size_for(n_blocks);
  acts.y_BTD = Tensor();  // the next block's input: kept (and offloaded) there
  s.settle_leaving();     // block l-1's copy down ran beside block l's forward
  if (l == 0) s.bytes_offloaded = 0;
  if (l >= n_blocks - kResidentBlocks || (max_blocks_ > 0 && l >= max_blocks_)) return;
  const auto b = static_cast<size_t>(l);
  std::vector<Group> groups = groups_of(acts);
  std::vector<std::shared_ptr<cuda::PinnedBuffer>>& buffers = s.pinned[b];
  if (buffers.size() < groups.size()) buffers.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto bytes = static_cast<size_t>(groups[i].base.numel());
    if (buffers[i] && buffers[i]->bytes() >= bytes) continue;
    if (buffers[i]) s.copy_stream.synchronize();  // an earlier copy may still read the smaller buffer
    buffers[i] = std::make_shared<cuda::PinnedBuffer>(bytes, "offloaded activations");
  }
  const Stream copy = s.copy_stream.get();
  s.compute_point.record(Stream{});  // the block's forward has written everything it keeps
  s.compute_point.make_wait(copy);
  for (size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    Tensor host = Tensor::from_blob(buffers[i]->data(), {g.base.numel()}, DType::kU8, Device::cpu());
    copy_async(host, g.base, copy);
    for (Tensor* m : g.members) *m = m->rebased(host);
    s.bytes_offloaded += g.base.numel();
    s.leaving.push_back(std::move(g.base));
  }
  s.down[b].record(copy);
  s.on_host[b] = true;
  s.leaving_block = l;
}

void ActivationOffload::finish_forward() { s_->settle_leaving(); }

void ActivationOffload::before_backward(int64_t l, std::vector<BlockActivations>& acts) {
  State& s = *s_;
  if (s.on_host.empty()) return;  // nothing was offloaded (fewer blocks than kept resident)
  const auto b = static_cast<size_t>(l);
  if (s.on_host[b]) prefetch(l, acts[b]);
  if (s.coming_up[b]) {
    s.compute_waits_for(s.up[b]);
    s.coming_up[b] = false;
  }
  if (l >= 1) prefetch(l - 1, acts[b - 1]);
}

void ActivationOffload::prefetch(int64_t l, BlockActivations& acts) {
  State& s = *s_;
  const auto b = static_cast<size_t>(l);
  if (!s.on_host[b]) return;
  std::vector<Group> groups = groups_of(acts);
  std::vector<Tensor> device(groups.size());
  // allocated in compute-stream order: free once the compute stream reaches this point
  for (size_t i = 0; i < groups.size(); ++i)
    device[i] = Tensor::empty({groups[i].base.numel()}, DType::kU8, device_, "offloaded activations coming back");
  const Stream copy = s.copy_stream.get();
  s.compute_point.record(Stream{});
  s.compute_point.make_wait(copy);
  for (size_t i = 0; i < groups.size(); ++i) {
    copy_async(device[i], groups[i].base, copy);
    for (Tensor* m : groups[i].members) *m = m->rebased(device[i]);
  }
  s.up[b].record(copy);
  s.on_host[b] = false;
  s.coming_up[b] = true;
}

void ActivationOffload::set_max_blocks(int64_t n) {
  ST_CHECK(n >= 0, "activation offload: expected 0 (every block but the last two) or a number of blocks, found ", n);
  max_blocks_ = n;
}

int64_t ActivationOffload::host_bytes() const {
  int64_t n = 0;
  for (const auto& block : s_->pinned)
    for (const auto& buffer : block)
      if (buffer) n += static_cast<int64_t>(buffer->bytes());
  return n;
}

int64_t ActivationOffload::bytes_offloaded() const { return s_->bytes_offloaded; }

double ActivationOffload::take_wait_seconds() {
  State& s = *s_;
  const double ms = s.waited_ms + s.sum_waits_ms();
  s.waited_ms = 0;
  return ms / 1e3;
}

#else
struct ActivationOffload::State {};
void ActivationOffload::set_max_blocks(int64_t n) { max_blocks_ = n; }
ActivationOffload::ActivationOffload(Device device) {
  ST_THROW("activation offload (training.offload_activations) needs a GPU; this build has no CUDA backend (model "
           "on ", device.str(), ")");
}
ActivationOffload::~ActivationOffload() = default;
void ActivationOffload::after_forward(int64_t, int64_t, BlockActivations&) {}
void ActivationOffload::finish_forward() {}
void ActivationOffload::before_backward(int64_t, std::vector<BlockActivations>&) {}
void ActivationOffload::prefetch(int64_t, BlockActivations&) {}
int64_t ActivationOffload::host_bytes() const { return 0; }
int64_t ActivationOffload::bytes_offloaded() const { return 0; }
double ActivationOffload::take_wait_seconds() { return 0; }
#endif

}  // namespace shardtrain::model
