// FSDP's parameter store: each rank owns slice `rank` of every unit's flat buffer as f32
// master weights and an f32 gradient shard. A unit is gathered (its master shard cast to the
// compute dtype, then all-gathered) when the model acquires it and freed when released
// (unless kept for the backward); its full gradient is reduce-scattered (sum: the loss is
// already scaled by 1 / global tokens) into the shard when the model releases it, and
// accumulates across micro-batches.
// On the CPU every step is synchronous. On a GPU, gathers run on their own stream and the
// next unit's gather is issued when a unit is acquired (the next block in the forward, the
// previous one in the backward); reduce-scatters run on a third stream while the backward
// goes on, and the compute stream waits for them only in finish_backward() or when more than
// two are in flight. Events order the streams; the compute stream is the legacy default one.
// Offloaded (ShardingOptions::offload), the shards live in page-locked host memory and travel
// to and from the GPU on those same streams.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/communicator.h"
#include "fsdp/tensor_parallel.h"
#include "model/layout.h"
#include "model/unit_store.h"

namespace shardtrain::fsdp {

struct ShardingOptions {
  DType compute_dtype = DType::kF32;  // gathered parameters (the forward and backward's weights)
  DType grad_dtype = DType::kF32;     // full gradient buffers the backward accumulates into
  DType master_dtype = DType::kF32;   // shards: master weights, gradients, optimizer state
  DType reduce_dtype = DType::kF32;   // gradients travel in this dtype
  // Free a block's gathered parameters after its forward (FSDP2 reshard_after_forward);
  // false keeps every block gathered until its backward (ZeRO-2-like). The last block keeps
  // them by default since its backward comes first.
  bool reshard_after_forward = true;
  bool keep_last_block_gathered = true;
  // Keep a compute-dtype copy of every master shard, written by the optimizer as it updates
  // the weights (AdamW's compute_copy): gathers then all-gather the copy without a cast, and
  // with one rank the copy is the unit's parameters, used in place (no gather at all). Costs
  // one compute-dtype element per shard element. Ignored where the compute dtype is the
  // master's.
  bool compute_shards = false;
  // ZeRO-3 with CPU offload: every shard (master weights, gradients, compute copies) lives
  // in page-locked host memory and the optimizer runs on the host; the GPU holds only the
  // units in use, their gradients until reduced, and the activations. A gather copies the
  // unit's compute shard up on the gather stream before its all-gather; a reduced gradient
  // shard comes down on the reduction stream, and finish_backward() waits for the device
  // and adds any that must accumulate. Needs a GPU; compute shards are always kept then.
  bool offload = false;
  // With offload: false keeps the gradient shards (f32) on the GPU, written (one rank) or
  // reduced (several) there as without offload, so the host holds only the master weights,
  // AdamW's state and, when compute_shards asks for them (here not forced), the compute
  // shards; without them a gather copies the f32 master shard up and casts it on the GPU.
  // The host update (run_host_update) copies each unit's gradient shard down into one of two
  // page-locked buffers just before it updates that unit.
  bool offload_grads = true;
  // GPUs: how many units' full gradients may still be in their reduce-scatter while the
  // backward goes on with the next unit (each holds a whole unit's gradient in grad_dtype).
  // The compute stream waits for the oldest reduction when one more would be in flight:
  // 1 is a double buffer (one reducing while the next is written), 2 rides out one reduction
  // slower than a unit's backward, 0 waits for every reduction before the next unit's backward
  // (no overlap, least memory).
  int reductions_in_flight = 1;
};

class ShardedUnitStore final : public model::UnitStore {
 public:
  // `comm` holds every rank of the run. With tensor parallelism (layout.mesh()), a block's
  // unit is this rank's part of the block, sharded over `block_comm`: the data-parallel ranks
  // holding the same part (dist::DeviceMesh::data_parallel()); the embedding and head are
  // sharded over `comm`.
  ShardedUnitStore(const model::ModelLayout& layout, dist::Communicator* comm, const ShardingOptions& options,
                   Device device = Device::cpu(), dist::Communicator* block_comm = nullptr);
  // On any mesh (the layout's): units sharded over the ranks of this rank's replica (a block
  // split by tensor parallelism over the replica's data-parallel ranks holding its part), and
  // with several replicas (HSDP) each reduced gradient shard summed over the replicas.
  ShardedUnitStore(const model::ModelLayout& layout, const DeviceMesh& mesh, const ShardingOptions& options,
                   Device device = Device::cpu());

  Tensor acquire_params(size_t unit, model::Pass pass) override;
  void release_params(size_t unit, model::Pass pass) override;
  Tensor acquire_grads(size_t unit, bool overwrite) override;
  void release_grads(size_t unit) override;
  void finish_backward() override;
  void before_replay() override;
  ~ShardedUnitStore() override;

  // With replicas (HSDP): whether the reduced gradients of the backwards from now on are summed
  // between the replicas (the default), or kept on this replica, added into its gradient
  // shards, until a backward with it on sums them all (gradient accumulation: only the last
  // micro-batch's backward exchanges; FSDP2's set_requires_all_reduce). Gradient shards
  // offloaded to the host are always summed at once.
  void set_sync_replicas(bool on) { sync_replicas_ = on; }

  // Seconds the compute stream stood waiting on gathers and reductions since the last call
  // (GPU only; measured with event pairs around each wait; synchronises the device).
  double take_comm_wait_seconds();

  // Counter-based init of this rank's shards (identical values for any number of ranks).
  void init_random(uint64_t seed, double init_std);
  // Fills this rank's shards from a source of whole parameters: `read(spec, first, out)` must
  // write elements [first, first + out.numel()) of the whole parameter `spec.name` (row-major,
  // shape spec.full_shape) into `out`. Only the ranges inside this rank's slices are requested
  // (a tensor-parallel part of columns: row by row).
  using ParamReader = std::function<void(const model::ParamSpec& spec, int64_t first, Tensor& out)>;
  void load(const ParamReader& read);
  // The same from a source only rank 0 can read: rank 0 reads one unit at a time (whole
  // parameters; a block once per tensor-parallel part) and broadcasts it; each rank keeps its
  // slice. No rank holds more than one unit beyond its shards. `read` is called on rank 0 only.
  void load_from_rank0(const ParamReader& read);
  // Clears the gradient shards. Offloaded, lazily: a shard's first reduced gradient is
  // written over it, and one that gets none is zero-filled by finish_backward() (or when
  // grad_shards() is asked for first).
  void zero_grad_shards();
  // One rank with the gradient dtype of the masters: acquire_grads hands out the gradient
  // shards themselves, so a first micro-batch that overwrites them needs no zero_grad_shards.
  bool grads_in_shards() const { return grads_aliased(); }
  // Where the shards live: the store's device, or the host when offloaded.
  Device shard_device() const { return options_.offload ? Device::cpu() : device_; }
  bool offloaded() const { return options_.offload; }
  // Page-locked host bytes held for offloaded shards and gradient landing buffers.
  int64_t pinned_bytes() const;
  // Offloaded, after finish_backward(): the sum of squares of this rank's gradient shards,
  // taken on the GPU: from each reduced shard before it went down (so the host need not read
  // them again for the norm), when every gradient since zero_grad_shards() landed over a
  // cleared shard (one micro-batch per step); or from the shards themselves where they stay
  // on the GPU (offload_grads off). Nothing otherwise (gradient accumulation with offloaded
  // gradients, no offload): then sum the shards themselves.
  // Nothing with tensor parallelism or replicas (grad_norm_parts() then).
  std::optional<double> landed_grad_sum_squares() const;
  // The gradient, as the global norm counts it: this rank's gradient shards, less the ranges
  // of parameters replicated over a tensor-parallel group (ParamSpec::replicated) on every
  // rank of the group but its rank 0 (their gradients are equal there, and count once), and
  // none at all outside the first replica (the others hold the same gradients).
  // Views into grad_shards(); summing their squares over all ranks gives the norm's square.
  std::vector<Tensor> grad_norm_parts();

  // Offloaded: runs `update` (the optimizer over this rank's host shards, unit by unit in
  // unit order, calling done(u) once unit u's masters and compute shard are written) on a
  // worker thread, and returns at once, so the host update overlaps the next step's forward.
  // With the gradients on the GPU (offload_grads off) the update's gradients
  // (optimizer_targets().grads) are two page-locked buffers taken in turn: unit 0's shard is
  // down before `update` starts, unit u + 1's by the time done(u) returns (copied while unit
  // u updates), so the update must read unit u's gradient only before it calls done(u).
  // Until unit u is done its gather waits for it (the copy up of its compute shard; the
  // prefetch skips it), and so does the copy down of its next gradient (the update reads the
  // gradient shard). Everything else here that reads or writes the shards (their accessors,
  // finish_backward, loads) waits for the whole update first; so must callers that read the
  // optimizer's own state (a checkpoint): wait_for_host_update(), which also rethrows an
  // error of the update.
  using UnitDone = std::function<void(size_t unit)>;
  void run_host_update(std::function<void(const UnitDone& done)> update);
  void wait_for_host_update() const;
  // An update started by run_host_update that wait_for_host_update has not yet waited for.
  bool host_update_in_flight() const;

  // This rank's slice [shard_numel] of unit u: master weights and accumulated gradient.
  // Taking the master shards for writing marks the compute shards (if any) out of date: they
  // are cast afresh from the masters before the next unit is used. Write through the
  // returned vector at once, not through references kept from an earlier call.
  std::vector<Tensor>& master_shards() {
    wait_for_host_update();
    compute_stale_ = true;
    return master_;
  }
  const std::vector<Tensor>& master_shards() const {
    wait_for_host_update();
    return master_;
  }
  std::vector<Tensor>& grad_shards() {
    settle_cleared_grads();
    return grad_;
  }
  // What the optimizer updates, per unit: master shards, gradient shards and, with
  // ShardingOptions::compute_shards in effect, the compute shards it must write (else empty).
  // Updating through these keeps the compute shards current. Offloaded with the gradients on
  // the GPU, `grads` are the host update's page-locked buffers (run_host_update), valid only
  // inside it; grad_shards() are the shards themselves.
  struct OptimizerTargets {
    std::vector<Tensor*> params;
    std::vector<const Tensor*> grads;
    std::vector<Tensor*> compute_copies;
  };
  OptimizerTargets optimizer_targets();
  bool has_compute_shards() const { return !compute_.empty(); }
  const std::vector<Tensor>& compute_shards() const {
    wait_for_host_update();
    return compute_;
  }
  // Turns ShardingOptions::compute_shards on or off after construction (allocating or freeing
  // the copies); call between steps, before a captured step records their addresses.
  void set_compute_shards(bool on);
  const model::ModelLayout& layout() const { return *layout_; }
  int rank() const { return comm_->rank(); }  // in the whole run
  int world_size() const { return comm_->world_size(); }
  // The ranks that shard unit u, and this rank's place among them.
  dist::Communicator& unit_comm(size_t u) const { return *unit_comms_[u]; }
  // Gathered units right now (for tests of the schedule).
  int gathered_units() const;

 private:
  struct UnitState {
    Tensor full_params;  // [numel] compute dtype while gathered
    int param_refs = 0;
    bool keep_for_backward = false;
    Tensor full_grads;   // [numel] grad dtype while the backward of the unit runs
    int grad_refs = 0;
  };
  // One rank and equal dtypes: the full buffers are the shards themselves.
  bool params_aliased() const;
  bool grads_aliased() const;
  // A shard of n elements where the shards live (page-locked host memory when offloaded,
  // kept alive by `owners`).
  Tensor shard_tensor(int64_t n, DType dtype, const char* what, std::vector<std::shared_ptr<void>>& owners);
  Tensor host_tensor(int64_t n, DType dtype, const char* what, std::vector<std::shared_ptr<void>>& owners);
  void settle_cleared_grads();  // offload: zero-fills the shards zero_grad_shards left to clear
  // Calls fn(spec, first, dst) for each parameter range inside this rank's slices, with
  // dst the matching range of the master shard (on the store's device).
  void for_each_owned_range(const ParamReader& fn);
  void gather(size_t unit);            // fills state_[unit].full_params
  void prefetch_after(size_t unit, model::Pass pass);
  void reduce(size_t unit);            // reduce-scatters state_[unit].full_grads into grad_[unit]

  struct Overlap;                      // streams and events of the GPU path (null on the CPU)
  std::unique_ptr<Overlap> overlap_;

  const model::ModelLayout* layout_;
  dist::Communicator* comm_;
  std::vector<dist::Communicator*> unit_comms_;  // [unit] the ranks sharding it
  dist::Communicator* across_ = nullptr;         // the same slices in the other replicas (HSDP)
  bool sync_replicas_ = true;                    // set_sync_replicas
  std::vector<bool> unsynced_;                   // [unit] its shard holds gradients not yet summed
  bool unsharded_ = false;                       // every unit whole on this rank (one rank, or DDP)
  // The constructors' common part: `shards` shard the embedding and head, `blocks` the blocks.
  void init(dist::Communicator* shards, dist::Communicator* blocks);
  ShardingOptions options_;
  Device device_;
  std::vector<Tensor> master_, grad_;
  std::vector<Tensor> compute_;  // [unit] compute-dtype copy of the master shard (compute_shards)
  bool compute_stale_ = true;    // compute_ must be cast afresh from master_ before use
  void refresh_compute_shards_if_stale();  // casts every compute shard from its master
  // Whole units with compute shards: a unit's parameters are its compute shard, never gathered.
  bool params_in_place() const { return unsharded_ && !compute_.empty() && !options_.offload; }
  std::vector<UnitState> state_;
  // Offloaded with the gradients on the GPU: two page-locked buffers of the largest shard,
  // and per unit a view of the one its gradient comes down into (u % 2).
  bool grads_on_host() const { return options_.offload && options_.offload_grads; }
  std::vector<Tensor> grad_staging_, host_grad_views_;
  void fetch_grad_for_host(size_t u);  // issues unit u's copy down (offload_grads off)
  void wait_grad_for_host(size_t u) const;
  // Offload: owners of the page-locked memory behind the host shards (compute shards apart,
  // as set_compute_shards replaces them), a host landing buffer per unit for gradients that
  // add to a shard, and per unit: cleared by zero_grad_shards and not yet written; a landed
  // gradient waiting to be added at finish_backward.
  std::vector<std::shared_ptr<void>> pinned_, compute_pinned_;
  std::vector<Tensor> landing_;
  std::vector<bool> grad_cleared_, grad_landed_;
  // Offload: [unit] f64 sums of squares of the gradients landed over cleared shards, on the
  // device (filled on the reduction stream); valid while no gradient used a landing buffer.
  Tensor landed_sum_squares_;
  bool landed_sum_squares_valid_ = false;
  struct HostUpdate;  // the worker thread of run_host_update and its per-unit progress
  std::unique_ptr<HostUpdate> host_update_;
  void wait_for_unit_update(size_t u) const;  // until unit u's host update is written
  bool unit_update_pending(size_t u) const;
};

}  // namespace shardtrain::fsdp
