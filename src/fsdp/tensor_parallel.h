// The model's tensor-parallel collectives (model/tensor_parallel.h) over a communicator of
// the group's ranks, and the device mesh's communicators of a 2-D run.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "model/layout.h"
#include "model/tensor_parallel.h"

namespace shardtrain::fsdp {

// `comm` (not owned) holds the ranks of one tensor-parallel group; sums are dist::ReduceOp::kSum.
std::unique_ptr<model::TensorParallel> make_tensor_parallel(dist::Communicator* comm);

// A run's ranks as the mesh `shape` arranges them (model::Mesh): the whole run (not owned),
// this rank's tensor-parallel group, the data-parallel ranks holding the same tensor-parallel
// part, and with several replicas (HSDP) the ranks of this rank's replica, the data-parallel
// ranks of the replica holding its part, and the ranks holding the same slices in the other
// replicas (all split from the whole run, collectively). With one replica the first two are
// the whole run and the data-parallel ranks, and there is no third.
class DeviceMesh {
 public:
  DeviceMesh(dist::Communicator* world, const model::Mesh& shape);
  const model::Mesh& shape() const { return shape_; }
  dist::Communicator& world() const { return *world_; }
  dist::Communicator& tensor_parallel() const { return *tp_; }
  dist::Communicator& data_parallel() const { return *dp_; }
  int tp_rank() const { return tp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  // The ranks sharding the embedding and head (a replica), and the blocks.
  dist::Communicator& replica() const { return replica_ ? *replica_ : *world_; }
  dist::Communicator& block_shards() const { return replica_dp_ ? *replica_dp_ : *dp_; }
  // Null with one replica.
  dist::Communicator* across_replicas() const { return across_.get(); }

 private:
  model::Mesh shape_;
  dist::Communicator* world_;
  std::unique_ptr<dist::Communicator> tp_, dp_, replica_, replica_dp_, across_;
};

}  // namespace shardtrain::fsdp
