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
// this rank's tensor-parallel group, and the data-parallel ranks holding the same
// tensor-parallel part (both split from the whole run, collectively).
class DeviceMesh {
 public:
  DeviceMesh(dist::Communicator* world, const model::Mesh& shape);
  const model::Mesh& shape() const { return shape_; }
  dist::Communicator& world() const { return *world_; }
  dist::Communicator& tensor_parallel() const { return *tp_; }
  dist::Communicator& data_parallel() const { return *dp_; }
  int tp_rank() const { return tp_->rank(); }
  int dp_rank() const { return dp_->rank(); }

 private:
  model::Mesh shape_;
  dist::Communicator* world_;
  std::unique_ptr<dist::Communicator> tp_, dp_;
};

}  // namespace shardtrain::fsdp
