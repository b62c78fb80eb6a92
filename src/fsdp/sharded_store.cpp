// The sharded store: synchronous on the CPU, overlapped on a GPU (see the header).
#include "fsdp/sharded_store.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#endif
#include "model/llama.h"
#include "ops/elementwise.h"

namespace shardtrain::fsdp {

using model::Pass;

#ifdef SHARDTRAIN_WITH_CUDA
struct ShardedUnitStore::Overlap {
  cuda::OwnedStream gather_stream, reduce_stream;
  // Offloaded with the gradients on the GPU: the host update's copies down, after the
  // backward's last write (grads_final), into the staging buffer u % 2 (grad_down[u % 2]).
  cuda::OwnedStream grad_down_stream;
  cuda::Event grads_final, grad_down[2];
  std::deque<cuda::Event> gathered;  // [unit] its gather has finished
  std::vector<bool> gather_waited;   // [unit] the compute stream already waits for it
  std::deque<cuda::Event> reduced;   // [unit] its reduce-scatter (and add into the shard) finished
  cuda::Event compute_point;         // the compute stream's progress when a transfer is issued
  struct InFlight {
    size_t unit;
    Tensor full_grads;  // allocated in compute-stream order: freed only after `reduced[unit]`
  };
  std::deque<InFlight> in_flight;
  // Event pairs around each compute-stream wait: (before, after) elapsed = time stood still.
  std::deque<std::pair<cuda::Event, cuda::Event>> waits;
  size_t waits_used = 0;

  explicit Overlap(size_t units) : gathered(units), gather_waited(units, true), reduced(units) {}

  // The compute stream waits for `e`; the wait is timed.
  void compute_waits_for(const cuda::Event& e) {
    if (cuda::is_capturing(Stream{})) return e.make_wait(Stream{});  // a graph's waits are not timed
    if (waits_used == waits.size()) waits.emplace_back();
    auto& [before, after] = waits[waits_used++];
    before.record(Stream{});
    e.make_wait(Stream{});
    after.record(Stream{});
  }
  // `stream` waits for the work queued on the compute stream so far.
  void after_compute(Stream stream) {
    compute_point.record(Stream{});
    compute_point.make_wait(stream);
  }
};
#else
struct ShardedUnitStore::Overlap {};
#endif

struct ShardedUnitStore::HostUpdate {
  std::thread worker;
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::vector<bool> done;  // [unit] written by the update in flight
  bool running = false;
  std::exception_ptr error;
};

void ShardedUnitStore::run_host_update(std::function<void(const UnitDone& done)> update) {
  ST_CHECK(options_.offload, "run_host_update: the shards are on ", device_.str(), ", not offloaded to the host");
  wait_for_host_update();
  if (!host_update_) host_update_ = std::make_unique<HostUpdate>();
  HostUpdate& h = *host_update_;
  h.done.assign(master_.size(), false);
  h.running = true;
#ifdef SHARDTRAIN_WITH_CUDA
  const bool fetch = !grads_on_host();
  if (fetch) {
    // the gradients are final once the compute stream's queued work is done
    overlap_->grads_final.record(Stream{});
    overlap_->grads_final.make_wait(overlap_->grad_down_stream.get());
  }
#else
  const bool fetch = false;
#endif
  // OpenMP's thread count belongs to each thread: a new one starts from the process default
  // (OMP_NUM_THREADS, which torchrun sets to 1), not from what this thread was given
  const int threads = omp_get_max_threads();
  h.worker = std::thread([this, &h, fetch, threads, update = std::move(update)] {
    omp_set_num_threads(threads);
    try {
#ifdef SHARDTRAIN_WITH_CUDA
      if (fetch) {
        cuda::init_device(device_.index);  // this thread issues the copies down
        fetch_grad_for_host(0);
        wait_grad_for_host(0);
        if (grad_.size() > 1) fetch_grad_for_host(1);
      }
#endif
      update([this, &h, fetch](size_t u) {
        if (fetch && u + 1 < grad_.size()) {
          // unit u's buffer is free again: unit u + 1's gradient must be down, u + 2's goes into it
          wait_grad_for_host(u + 1);
          if (u + 2 < grad_.size()) fetch_grad_for_host(u + 2);
        }
        std::lock_guard<std::mutex> lock(h.mutex);
        h.done[u] = true;
        h.changed.notify_all();
      });
    } catch (...) {
      std::lock_guard<std::mutex> lock(h.mutex);
      h.error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(h.mutex);
    h.running = false;
    h.changed.notify_all();
  });
}

void ShardedUnitStore::fetch_grad_for_host([[maybe_unused]] size_t u) {
#ifdef SHARDTRAIN_WITH_CUDA
  const Stream s = overlap_->grad_down_stream.get();
  copy_async(host_grad_views_[u], grad_[u], s);
  overlap_->grad_down[u % 2].record(s);
#endif
}

void ShardedUnitStore::wait_grad_for_host([[maybe_unused]] size_t u) const {
#ifdef SHARDTRAIN_WITH_CUDA
  overlap_->grad_down[u % 2].synchronize();
#endif
}

void ShardedUnitStore::wait_for_host_update() const {
  if (!host_update_ || !host_update_->worker.joinable()) return;
  HostUpdate& h = *host_update_;
  h.worker.join();
  if (h.error) {
    const std::exception_ptr e = h.error;
    h.error = nullptr;
    std::rethrow_exception(e);
  }
}

bool ShardedUnitStore::host_update_in_flight() const { return host_update_ && host_update_->worker.joinable(); }

void ShardedUnitStore::wait_for_unit_update(size_t u) const {
  if (!host_update_) return;
  HostUpdate& h = *host_update_;
  std::unique_lock<std::mutex> lock(h.mutex);
  h.changed.wait(lock, [&] { return !h.running || h.done[u]; });
  if (h.error) {
    lock.unlock();
    wait_for_host_update();  // rethrows
  }
}

bool ShardedUnitStore::unit_update_pending(size_t u) const {
  if (!host_update_) return false;
  std::lock_guard<std::mutex> lock(host_update_->mutex);
  return host_update_->running && !host_update_->done[u];
}

ShardedUnitStore::ShardedUnitStore(const model::ModelLayout& layout, dist::Communicator* comm,
                                   const ShardingOptions& options, Device device, dist::Communicator* block_comm)
    : layout_(&layout), comm_(comm), options_(options), device_(device) {
  ST_ASSERT(layout.mesh().replicate == 1, "sharded store: a layout of ", layout.mesh().replicate,
            " replicas needs the mesh's communicators");
  init(comm, block_comm);
}

ShardedUnitStore::ShardedUnitStore(const model::ModelLayout& layout, const DeviceMesh& mesh,
                                   const ShardingOptions& options, Device device)
    : layout_(&layout), comm_(&mesh.world()), options_(options), device_(device) {
  ST_ASSERT(layout.mesh().replicate == mesh.shape().replicate && layout.mesh().world() == mesh.shape().world(),
            "sharded store: layout and mesh differ");
  across_ = mesh.across_replicas();
  init(&mesh.replica(), &mesh.block_shards());
}

void ShardedUnitStore::init(dist::Communicator* shards, dist::Communicator* blocks) {
  const model::ModelLayout& layout = *layout_;
  const ShardingOptions& options = options_;
  const Device device = device_;
  ST_CHECK(layout.world_size() == comm_->world_size(), "sharded store: layout padded for ", layout.world_size(),
           " ranks but the communicator has ", comm_->world_size());
  ST_CHECK(options.reductions_in_flight >= 0, "sharded store: reductions_in_flight must be 0 or more, found ",
           options.reductions_in_flight);
  unsharded_ = true;
  unsynced_.assign(layout.units().size(), false);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const model::UnitLayout& unit = layout.units()[u];
    dist::Communicator* c = unit.tp_part ? blocks : shards;
    ST_ASSERT(c != nullptr && c->world_size() == unit.ranks && c->rank() == layout.shard_index(u, comm_->rank()),
              "sharded store: unit ", unit.name, " is sharded over ", unit.ranks, " ranks; no communicator of them");
    unit_comms_.push_back(c);
    unsharded_ = unsharded_ && c->world_size() == 1;
  }
  ST_CHECK(!options.offload || device.is_cuda(), "offloading the shards to host memory (parallel.offload) is for "
           "training on GPUs; this run is on ", device.str(), ", where they are in host memory already");
  const auto& units = layout.units();
  landing_.resize(units.size());
  grad_cleared_.assign(units.size(), false);
  grad_landed_.assign(units.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t s = units[u].shard_numel();
    master_.push_back(shard_tensor(s, options.master_dtype, "master weights shard", pinned_));
    grad_.push_back(grads_on_host() || !options.offload
                        ? shard_tensor(s, options.master_dtype, "gradient shard", pinned_)
                        : Tensor::empty({s}, options.master_dtype, device_, "gradient shard"));
    ops::fill(master_.back(), 0.0);
    ops::fill(grad_.back(), 0.0);
    UnitState st;
    // Only blocks are kept: their backward re-reads the weights. The embedding's backward
    // does not, and the head is used at once, so their last release in a step is a forward
    // release; keeping them would carry stale weights past the optimizer step.
    const bool block = units[u].kind == model::UnitKind::kBlock;
    st.keep_for_backward =
        block && (!options.reshard_after_forward || (options.keep_last_block_gathered && u + 2 == units.size()));
    state_.push_back(st);
  }
  if (options.offload && !grads_on_host()) {
    int64_t largest = 0;
    for (const Tensor& g : grad_) largest = std::max(largest, g.numel());
    for (int i = 0; i < 2; ++i)
      grad_staging_.push_back(host_tensor(largest, options.master_dtype, "gradient staging for the host update",
                                          pinned_));
    for (size_t u = 0; u < grad_.size(); ++u)
      host_grad_views_.push_back(grad_staging_[u % 2].flat_range(0, grad_[u].numel()));
  }
  set_compute_shards(options.compute_shards);
#ifdef SHARDTRAIN_WITH_CUDA
  if (device.is_cuda()) overlap_ = std::make_unique<Overlap>(units.size());
#endif
}

ShardedUnitStore::~ShardedUnitStore() {
  if (host_update_ && host_update_->worker.joinable()) host_update_->worker.join();  // it writes the shards
  if (overlap_) synchronize(device_);  // transfers in flight still use the buffers
}

Tensor ShardedUnitStore::shard_tensor(int64_t n, DType dtype, const char* what,
                                      std::vector<std::shared_ptr<void>>& owners) {
  if (!options_.offload) return Tensor::empty({n}, dtype, device_, what);
  return host_tensor(n, dtype, what, owners);
}

Tensor ShardedUnitStore::host_tensor(int64_t n, DType dtype, const char* what,
                                     std::vector<std::shared_ptr<void>>& owners) {
#ifdef SHARDTRAIN_WITH_CUDA
  const size_t bytes = std::max<size_t>(static_cast<size_t>(n) * dtype_size(dtype), 64);
  auto buffer = std::make_shared<cuda::PinnedBuffer>(bytes, what);
  owners.push_back(buffer);
  return Tensor::from_blob(buffer->data(), {n}, dtype, Device::cpu());
#else
  (void)n, (void)dtype, (void)what, (void)owners;
  ST_THROW("sharded store: offload needs the CUDA backend");
#endif
}

int64_t ShardedUnitStore::pinned_bytes() const {
  if (!options_.offload) return 0;
  int64_t bytes = 0;
  for (const std::vector<Tensor>* v : {&master_, &grad_, &compute_, &landing_, &grad_staging_})
    for (const Tensor& t : *v) bytes += t.defined() && t.device().is_cpu() ? t.nbytes() : 0;
  return bytes;
}

bool ShardedUnitStore::params_aliased() const {
  return unsharded_ && options_.compute_dtype == options_.master_dtype && !options_.offload;
}

bool ShardedUnitStore::grads_aliased() const {
  return comm_->world_size() == 1 && options_.grad_dtype == options_.master_dtype && !grads_on_host();
}

Tensor ShardedUnitStore::acquire_params(size_t u, Pass pass) {
  UnitState& st = state_[u];
  ++st.param_refs;
  if (params_aliased()) return master_[u];
  refresh_compute_shards_if_stale();
  if (params_in_place()) return compute_[u];
  if (!st.full_params.defined()) gather(u);
#ifdef SHARDTRAIN_WITH_CUDA
  if (overlap_) {
    prefetch_after(u, pass);
    if (!overlap_->gather_waited[u]) {
      overlap_->compute_waits_for(overlap_->gathered[u]);
      overlap_->gather_waited[u] = true;
    }
  }
#else
  (void)pass;
#endif
  return st.full_params;
}

void ShardedUnitStore::gather(size_t u) {
  UnitState& st = state_[u];
  const int64_t n = layout_->units()[u].numel, s = master_[u].numel();
  // allocated in compute-stream order, so the memory's earlier users have been queued there
  st.full_params = Tensor::empty({n}, options_.compute_dtype, device_, "gathered parameters");
  dist::Communicator& comm = *unit_comms_[u];
  Tensor mine = st.full_params.flat_range(comm.rank() * s, s);
#ifdef SHARDTRAIN_WITH_CUDA
  if (overlap_) {
    const Stream g = overlap_->gather_stream.get();
    overlap_->after_compute(g);  // the memory is free and the master shard is up to date
    if (options_.offload) {
      // the host shard (the optimizer's compute copy, or the masters when they are the
      // compute dtype) comes up into this rank's slice, then the slices are gathered
      wait_for_unit_update(u);
      if (!compute_.empty() || options_.compute_dtype == options_.master_dtype) {
        copy_async(mine, compute_.empty() ? master_[u] : compute_[u], g);
      } else {
        // no compute copy on the host: the f32 masters come up piece by piece, cast here
        constexpr int64_t kPiece = int64_t{1} << 24;
        Tensor up = Tensor::empty({std::min(s, kPiece)}, options_.master_dtype, device_, "master shard coming up", g);
        for (int64_t first = 0; first < s; first += kPiece) {
          const int64_t n_piece = std::min(kPiece, s - first);
          Tensor piece = up.flat_range(0, n_piece);
          copy_async(piece, master_[u].flat_range(first, n_piece), g);
          Tensor dst = mine.flat_range(first, n_piece);
          ops::cast(dst, piece, g);
        }
      }
      if (comm.world_size() > 1) comm.all_gather(st.full_params, mine, g);
    } else if (compute_.empty()) {
      ops::cast(mine, master_[u], g);
      comm.all_gather(st.full_params, mine, g);
    } else {
      comm.all_gather(st.full_params, compute_[u], g);  // the optimizer wrote it
    }
    overlap_->gathered[u].record(g);
    overlap_->gather_waited[u] = false;
    return;
  }
#endif
  if (!compute_.empty()) return comm.all_gather(st.full_params, compute_[u]);
  ops::cast(mine, master_[u]);
  comm.all_gather(st.full_params, mine);
}

void ShardedUnitStore::before_replay() { refresh_compute_shards_if_stale(); }

void ShardedUnitStore::set_compute_shards(bool on) {
  wait_for_host_update();
  on = on || grads_on_host();  // fully offloaded, the bus carries the compute dtype
  if (on == options_.compute_shards && (!compute_.empty() || options_.compute_dtype == options_.master_dtype)) return;
  options_.compute_shards = on;
  if (overlap_) synchronize(device_);  // no transfer still reads the old copies
  compute_.clear();
  compute_pinned_.clear();
  compute_stale_ = true;
  if (!on || options_.compute_dtype == options_.master_dtype) return;
  for (const Tensor& m : master_)
    compute_.push_back(shard_tensor(m.numel(), options_.compute_dtype, "compute-dtype shard", compute_pinned_));
}

void ShardedUnitStore::refresh_compute_shards_if_stale() {
  if (!compute_stale_) return;
  wait_for_host_update();
  if (options_.offload) synchronize(device_);  // host copies: no gather may still be reading them
  // on the compute stream: gathers start after it (after_compute), in-place use follows it
  for (size_t u = 0; u < compute_.size(); ++u) ops::cast(compute_[u], master_[u]);
  compute_stale_ = false;
}

ShardedUnitStore::OptimizerTargets ShardedUnitStore::optimizer_targets() {
  wait_for_host_update();
  OptimizerTargets t;
  for (size_t u = 0; u < master_.size(); ++u) {
    t.params.push_back(&master_[u]);
    t.grads.push_back(host_grad_views_.empty() ? &grad_[u] : &host_grad_views_[u]);
    if (!compute_.empty()) t.compute_copies.push_back(&compute_[u]);
  }
  return t;
}

// The unit the model will ask for next: the next one in a forward, the previous block in a
// backward (the embedding's backward needs no parameters). Gathered now, it arrives while
// the current unit computes.
void ShardedUnitStore::prefetch_after(size_t u, Pass pass) {
  if (params_in_place()) return;
  const size_t n = layout_->units().size();
  size_t next = 0;
  if (pass == Pass::kBackward) {
    if (u < 2) return;
    next = u - 1;
    if (layout_->units()[next].kind != model::UnitKind::kBlock) return;
  } else {
    if (u + 1 >= n) return;
    next = u + 1;
  }
  // a unit the host is still updating is gathered when acquired (its wait then holds up only
  // that unit's issue, not the one computing now)
  if (!state_[next].full_params.defined() && !unit_update_pending(next)) gather(next);
}

void ShardedUnitStore::release_params(size_t u, Pass pass) {
  UnitState& st = state_[u];
  ST_ASSERT(st.param_refs > 0, "release of unit ", layout_->units()[u].name, " that was not acquired");
  if (--st.param_refs > 0) return;
  if (pass == Pass::kForward && st.keep_for_backward) return;
  st.full_params = Tensor();
}

Tensor ShardedUnitStore::acquire_grads(size_t u, bool overwrite) {
  UnitState& st = state_[u];
  if (grads_aliased()) {
    ++st.grad_refs;
    return grad_[u];  // one rank: accumulate straight into the shard
  }
  if (st.grad_refs++ == 0) {
    const model::UnitLayout& unit = layout_->units()[u];
    st.full_grads = Tensor::empty({unit.numel}, options_.grad_dtype, device_, "full gradients");
    if (!overwrite) {
      ops::fill(st.full_grads, 0.0);
    } else {
      // the backward writes every parameter's range; the padding must reduce to zero
      for (const auto& [first, end] : unit.padding()) {
        Tensor gap = st.full_grads.flat_range(first, end - first);
        ops::fill(gap, 0.0);
      }
    }
  }
  return st.full_grads;
}

void ShardedUnitStore::release_grads(size_t u) {
  UnitState& st = state_[u];
  ST_ASSERT(st.grad_refs > 0, "release of gradients of unit ", layout_->units()[u].name, " that were not acquired");
  if (--st.grad_refs > 0 || grads_aliased()) return;
  reduce(u);
  st.full_grads = Tensor();
}

void ShardedUnitStore::reduce(size_t u) {
  UnitState& st = state_[u];
  const int64_t s = grad_[u].numel();
  Stream stream{};
#ifdef SHARDTRAIN_WITH_CUDA
  if (overlap_) {
    stream = overlap_->reduce_stream.get();
    overlap_->after_compute(stream);  // the unit's gradient is complete
  }
#endif
  // temporaries live in the reduction stream's order
  Tensor send = st.full_grads;
  if (options_.reduce_dtype != options_.grad_dtype) {
    send = Tensor::empty(st.full_grads.shape(), options_.reduce_dtype, device_, "gradients to reduce", stream);
    ops::cast(send, st.full_grads, stream);
  }
  Tensor reduced = send;  // offloaded on one rank the full gradient is the shard
  if (unit_comms_[u]->world_size() > 1 || !grads_on_host()) {
    reduced = Tensor::empty({s}, options_.reduce_dtype, device_, "reduced gradient shard", stream);
    unit_comms_[u]->reduce_scatter(reduced, send, dist::ReduceOp::kSum, stream);
  }
  // the other replicas' rows: summed now, or (deferred) added here and summed with a later backward's
  const bool defer = across_ != nullptr && !grads_on_host() && (!sync_replicas_ || unsynced_[u]);
  if (across_ != nullptr && !defer) across_->all_reduce(reduced, dist::ReduceOp::kSum, stream);
  if (reduced.dtype() != options_.master_dtype) {
    Tensor r = Tensor::empty({s}, options_.master_dtype, device_, "reduced gradient shard", stream);
    ops::cast(r, reduced, stream);
    reduced = r;
  }
  if (grads_on_host()) {
    // down to the host: over a cleared shard, or into the landing buffer to be added at
    // finish_backward (the memory of `reduced` is reused only after this, in stream order)
    if (!grad_cleared_[u] && !landing_[u].defined())
      landing_[u] = shard_tensor(s, options_.master_dtype, "gradient landing buffer", pinned_);
    Tensor& host = grad_cleared_[u] ? grad_[u] : landing_[u];
    ST_ASSERT(!grad_landed_[u], "unit ", layout_->units()[u].name, " reduced twice in one backward");
    wait_for_unit_update(u);  // the host update of the last step still reads this gradient shard
    if (grad_cleared_[u] && landed_sum_squares_valid_) {
      Tensor slot = landed_sum_squares_.slice(0, static_cast<int64_t>(u), static_cast<int64_t>(u) + 1);
      ops::sum_squares(slot, reduced, stream);  // the shard's whole contribution to the norm
    } else {
      landed_sum_squares_valid_ = false;  // it adds to an earlier gradient on the host
    }
    copy_async(host, reduced, stream);
    grad_landed_[u] = !grad_cleared_[u];
    grad_cleared_[u] = false;
  } else {
    ops::add(grad_[u], grad_[u], reduced, stream);
    if (defer && sync_replicas_) across_->all_reduce(grad_[u], dist::ReduceOp::kSum, stream);
    if (across_ != nullptr) unsynced_[u] = defer && !sync_replicas_;
  }
#ifdef SHARDTRAIN_WITH_CUDA
  if (overlap_) {
    Overlap& ov = *overlap_;
    ov.reduced[u].record(stream);
    ov.in_flight.push_back({u, st.full_grads});
    while (!ov.in_flight.empty() &&
           (ov.in_flight.size() > static_cast<size_t>(options_.reductions_in_flight) ||
            ov.reduced[ov.in_flight.front().unit].done())) {
      // the compute stream must not reuse the buffer before the reduction has read it
      if (!ov.reduced[ov.in_flight.front().unit].done()) ov.compute_waits_for(ov.reduced[ov.in_flight.front().unit]);
      ov.in_flight.pop_front();
    }
  }
#endif
}

void ShardedUnitStore::finish_backward() {
#ifdef SHARDTRAIN_WITH_CUDA
  if (!overlap_) return;
  if (grads_on_host()) {
    // every gradient shard is down (and nothing prefetched is left in flight); the host
    // adds the ones that accumulate
    wait_for_host_update();
    synchronize(device_);
    for (size_t u = 0; u < grad_.size(); ++u)
      if (grad_landed_[u]) {
        ops::add(grad_[u], grad_[u], landing_[u]);
        grad_landed_[u] = false;
      }
    settle_cleared_grads();
  }
  Overlap& ov = *overlap_;
  for (const Overlap::InFlight& f : ov.in_flight) ov.compute_waits_for(ov.reduced[f.unit]);
  ov.in_flight.clear();
  // a gather prefetched but never used would hold weights the optimizer is about to change
  for (size_t u = 0; u < state_.size(); ++u) {
    UnitState& st = state_[u];
    if (st.param_refs == 0 && st.full_params.defined() && !st.keep_for_backward) {
      if (!ov.gather_waited[u]) ov.compute_waits_for(ov.gathered[u]);
      ov.gather_waited[u] = true;
      st.full_params = Tensor();
    }
  }
#endif
}

double ShardedUnitStore::take_comm_wait_seconds() {
#ifdef SHARDTRAIN_WITH_CUDA
  if (!overlap_) return 0;
  Overlap& ov = *overlap_;
  double ms = 0;
  for (size_t i = 0; i < ov.waits_used; ++i) {
    ov.waits[i].second.synchronize();
    ms += ov.waits[i].second.elapsed_ms_since(ov.waits[i].first);
  }
  ov.waits_used = 0;
  return ms / 1e3;
#else
  return 0;
#endif
}

void ShardedUnitStore::init_random(uint64_t seed, double init_std) {
  compute_stale_ = true;
  // computed in place, on the device that holds the shard: no host pass over the model
  for_each_owned_range([&](const model::ParamSpec& p, int64_t first, Tensor& dst) {
    model::init_param_range(dst, p, first, seed, init_std);
  });
}

void ShardedUnitStore::load(const ParamReader& read) {
  compute_stale_ = true;
  for_each_owned_range([&](const model::ParamSpec& p, int64_t first, Tensor& dst) {
    // readers fill host memory with runs of the whole parameter; the range then travels to
    // the device at once
    Tensor staged = dst.device().is_cpu() ? dst
                                          : Tensor::empty({dst.numel()}, options_.master_dtype, Device::cpu(),
                                                          "parameter staging");
    model::for_each_run(p, first, dst.numel(), [&](int64_t full_first, int64_t local_first, int64_t n) {
      Tensor run = staged.flat_range(local_first - first, n);
      read(p, full_first, run);
    });
    if (!dst.device().is_cpu()) copy(dst, staged);
  });
}

void ShardedUnitStore::for_each_owned_range(const ParamReader& fn) {
  wait_for_host_update();  // it writes the masters
  for (size_t u = 0; u < layout_->units().size(); ++u)
    for (const model::ShardRange& r : model::shard_ranges(layout_->units()[u], unit_comms_[u]->rank())) {
      Tensor dst = master_[u].flat_range(r.shard_offset, r.count);
      fn(*r.spec, r.first, dst);
    }
}

void ShardedUnitStore::load_from_rank0(const ParamReader& read) {
  wait_for_host_update();
  compute_stale_ = true;
  const int rank = comm_->rank();
  const model::Mesh& mesh = layout_->mesh();
  for (size_t u = 0; u < layout_->units().size(); ++u) {
    const model::UnitLayout& unit = layout_->units()[u];
    const int64_t s = master_[u].numel();
    // a block split by tensor parallelism comes once per part, for the ranks holding it
    for (int t = 0; t < (unit.tp_part ? mesh.tensor_parallel : 1); ++t) {
      Tensor full = Tensor::empty({s * unit.ranks}, options_.master_dtype, Device::cpu(), "unit from rank 0");
      if (rank == 0) {
        ops::fill(full, 0.0);  // the padding
        for (const model::ParamSpec& whole : unit.params) {
          const model::ParamSpec p = whole.part(t);
          model::for_each_run(p, 0, p.numel(), [&](int64_t full_first, int64_t local_first, int64_t n) {
            Tensor dst = full.flat_range(p.offset + local_first, n);
            read(p, full_first, dst);
          });
        }
      }
      constexpr int64_t kPiece = int64_t{1} << 26;  // elements per message (MPI counts are 32-bit)
      for (int64_t first = 0; first < full.numel(); first += kPiece) {
        Tensor piece = full.flat_range(first, std::min(kPiece, full.numel() - first));
        comm_->broadcast(piece, 0);
      }
      if (!unit.tp_part || mesh.tp_rank(rank) == t) copy(master_[u], full.flat_range(unit_comms_[u]->rank() * s, s));
    }
  }
}

void ShardedUnitStore::zero_grad_shards() {
  unsynced_.assign(unsynced_.size(), false);
  if (grads_on_host()) {
    grad_cleared_.assign(grad_.size(), true);  // the first gradient to land is written over it
    if (device_.is_cuda()) {
      // cleared in compute-stream order; each reduction starts after the compute reached it
      if (!landed_sum_squares_.defined())
        landed_sum_squares_ = Tensor::empty({static_cast<int64_t>(grad_.size())}, DType::kF64, device_,
                                            "landed gradient sums of squares");
      ops::fill(landed_sum_squares_, 0.0);
      landed_sum_squares_valid_ = true;
    }
    return;
  }
  if (options_.offload) wait_for_host_update();  // it copies the shards down
  for (Tensor& g : grad_) ops::fill(g, 0.0);
}

std::vector<Tensor> ShardedUnitStore::grad_norm_parts() {
  for (size_t u = 0; u < unsynced_.size(); ++u)
    ST_ASSERT(!unsynced_[u], "unit ", layout_->units()[u].name, "'s gradients were never summed between the replicas: "
              "the step's last backward must run with set_sync_replicas(true)");
  std::vector<Tensor>& grads = grad_shards();
  const bool counts_replicated = layout_->tp_rank() == 0;
  std::vector<Tensor> parts;
  if (layout_->mesh().replica(comm_->rank()) != 0) return parts;
  for (size_t u = 0; u < grads.size(); ++u) {
    int64_t kept_from = 0;  // the shard's elements since the last range left out
    if (!counts_replicated)
      for (const model::ShardRange& r : model::shard_ranges(layout_->units()[u], unit_comms_[u]->rank())) {
        if (!r.spec->replicated) continue;
        if (r.shard_offset > kept_from) parts.push_back(grads[u].flat_range(kept_from, r.shard_offset - kept_from));
        kept_from = r.shard_offset + r.count;
      }
    if (kept_from == 0) {
      parts.push_back(grads[u]);
    } else if (kept_from < grads[u].numel()) {
      parts.push_back(grads[u].flat_range(kept_from, grads[u].numel() - kept_from));
    }
  }
  return parts;
}

std::optional<double> ShardedUnitStore::landed_grad_sum_squares() const {
  if (layout_->mesh().tensor_parallel > 1 || layout_->mesh().replicate > 1) return std::nullopt;
  if (options_.offload && !grads_on_host()) {
    // the shards are on the GPU: summed there, in a fixed order
    Tensor sums = Tensor::empty({static_cast<int64_t>(grad_.size())}, DType::kF64, device_, "gradient sums of squares");
    ops::fill(sums, 0.0);  // sum_squares adds
    for (size_t u = 0; u < grad_.size(); ++u) {
      Tensor slot = sums.slice(0, static_cast<int64_t>(u), static_cast<int64_t>(u) + 1);
      ops::sum_squares(slot, grad_[u]);
    }
    Tensor host = Tensor::empty(sums.shape(), DType::kF64, Device::cpu(), "gradient sums of squares");
    copy(host, sums);
    double sum = 0;
    for (int64_t u = 0; u < host.numel(); ++u) sum += host.data<double>()[u];
    return sum;
  }
  if (!options_.offload || !landed_sum_squares_valid_) return std::nullopt;
  Tensor host = Tensor::empty(landed_sum_squares_.shape(), DType::kF64, Device::cpu(), "landed sums of squares");
  copy(host, landed_sum_squares_);  // after the reductions: finish_backward() waited for them
  double sum = 0;
  for (int64_t u = 0; u < host.numel(); ++u) sum += host.data<double>()[u];  // a shard never landed adds 0
  return sum;
}

void ShardedUnitStore::settle_cleared_grads() {
  wait_for_host_update();
  for (size_t u = 0; u < grad_cleared_.size(); ++u)
    if (grad_cleared_[u]) {
      ops::fill(grad_[u], 0.0);
      grad_cleared_[u] = false;
    }
}

int ShardedUnitStore::gathered_units() const {
  int n = 0;
  for (const UnitState& st : state_) n += st.full_params.defined();
  return n;
}

}  // namespace shardtrain::fsdp
