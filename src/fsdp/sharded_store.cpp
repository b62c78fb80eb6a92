// The synchronous sharded store (CPU path of FSDP).
#include "fsdp/sharded_store.h"

#include "model/llama.h"
#include "ops/elementwise.h"

namespace shardtrain::fsdp {

using model::Pass;

ShardedUnitStore::ShardedUnitStore(const model::ModelLayout& layout, dist::Communicator* comm,
                                   const ShardingOptions& options, Device device)
    : layout_(&layout), comm_(comm), options_(options), device_(device) {
  ST_CHECK(layout.world_size() == comm->world_size(), "sharded store: layout padded for ", layout.world_size(),
           " ranks but the communicator has ", comm->world_size());
  const auto& units = layout.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t s = units[u].shard_numel(comm->world_size());
    master_.push_back(Tensor::empty({s}, options.master_dtype, device, "master weights shard"));
    grad_.push_back(Tensor::empty({s}, options.master_dtype, device, "gradient shard"));
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
}

bool ShardedUnitStore::params_aliased() const {
  return comm_->world_size() == 1 && options_.compute_dtype == options_.master_dtype;
}

bool ShardedUnitStore::grads_aliased() const {
  return comm_->world_size() == 1 && options_.grad_dtype == options_.master_dtype;
}

Tensor ShardedUnitStore::acquire_params(size_t u, Pass) {
  UnitState& st = state_[u];
  if (st.param_refs++ > 0 || st.full_params.defined()) return params_aliased() ? master_[u] : st.full_params;
  if (params_aliased()) return master_[u];
  const int64_t n = layout_->units()[u].numel, s = master_[u].numel();
  st.full_params = Tensor::empty({n}, options_.compute_dtype, device_, "gathered parameters");
  Tensor mine = st.full_params.flat_range(comm_->rank() * s, s);
  ops::cast(mine, master_[u]);
  comm_->all_gather(st.full_params, mine);
  return st.full_params;
}

void ShardedUnitStore::release_params(size_t u, Pass pass) {
  UnitState& st = state_[u];
  ST_ASSERT(st.param_refs > 0, "release of unit ", layout_->units()[u].name, " that was not acquired");
  if (--st.param_refs > 0) return;
  if (pass == Pass::kForward && st.keep_for_backward) return;
  st.full_params = Tensor();
}

Tensor ShardedUnitStore::acquire_grads(size_t u) {
  UnitState& st = state_[u];
  if (grads_aliased()) {
    ++st.grad_refs;
    return grad_[u];  // one rank: accumulate straight into the shard
  }
  if (st.grad_refs++ == 0) {
    st.full_grads = Tensor::empty({layout_->units()[u].numel}, options_.grad_dtype, device_, "full gradients");
    ops::fill(st.full_grads, 0.0);
  }
  return st.full_grads;
}

void ShardedUnitStore::release_grads(size_t u) {
  UnitState& st = state_[u];
  ST_ASSERT(st.grad_refs > 0, "release of gradients of unit ", layout_->units()[u].name, " that were not acquired");
  if (--st.grad_refs > 0 || grads_aliased()) return;
  const int64_t s = grad_[u].numel();
  Tensor send = st.full_grads;
  if (options_.reduce_dtype != options_.grad_dtype) {
    send = Tensor::empty(st.full_grads.shape(), options_.reduce_dtype, device_, "gradients to reduce");
    ops::cast(send, st.full_grads);
  }
  Tensor reduced = Tensor::empty({s}, options_.reduce_dtype, device_, "reduced gradient shard");
  comm_->reduce_scatter(reduced, send, dist::ReduceOp::kSum);
  if (options_.reduce_dtype != options_.master_dtype) {
    Tensor r = Tensor::empty({s}, options_.master_dtype, device_, "reduced gradient shard");
    ops::cast(r, reduced);
    reduced = r;
  }
  ops::add(grad_[u], grad_[u], reduced);
  st.full_grads = Tensor();
}

void ShardedUnitStore::init_random(uint64_t seed, double init_std) {
  load([&](const model::ParamSpec& p, int64_t first, Tensor& out) { model::init_param_range(out, p, first, seed, init_std); });
}

void ShardedUnitStore::load(const ParamReader& read) {
  const int64_t r = comm_->rank();
  for (size_t u = 0; u < layout_->units().size(); ++u) {
    const int64_t s = master_[u].numel(), lo = r * s, hi = lo + s;
    for (const model::ParamSpec& p : layout_->units()[u].params) {
      const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
      if (a >= b) continue;
      Tensor dst = master_[u].flat_range(a - lo, b - a);
      if (device_.is_cpu()) {
        read(p, a - p.offset, dst);
      } else {  // readers fill host memory; the range then travels to the device
        Tensor staged = Tensor::empty({b - a}, options_.master_dtype, Device::cpu(), "parameter staging");
        read(p, a - p.offset, staged);
        copy(dst, staged);
      }
    }
  }
}

void ShardedUnitStore::zero_grad_shards() {
  for (Tensor& g : grad_) ops::fill(g, 0.0);
}

int ShardedUnitStore::gathered_units() const {
  int n = 0;
  for (const UnitState& st : state_) n += st.full_params.defined();
  return n;
}

}  // namespace shardtrain::fsdp
