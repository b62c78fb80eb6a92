// Tensor parallelism over a communicator; the mesh's split communicators.
#include "fsdp/tensor_parallel.h"

namespace shardtrain::fsdp {
namespace {

class GroupCollectives final : public model::TensorParallel {
 public:
  explicit GroupCollectives(dist::Communicator* comm) : comm_(comm) {}
  int size() const override { return comm_->world_size(); }
  int rank() const override { return comm_->rank(); }
  void all_gather(Tensor& out, const Tensor& in) override { comm_->all_gather(out, in); }
  void reduce_scatter(Tensor& out, const Tensor& in) override {
    comm_->reduce_scatter(out, in, dist::ReduceOp::kSum);
  }
  void all_reduce(Tensor& inout) override { comm_->all_reduce(inout, dist::ReduceOp::kSum); }

 private:
  dist::Communicator* comm_;
};

}  // namespace

std::unique_ptr<model::TensorParallel> make_tensor_parallel(dist::Communicator* comm) {
  return std::make_unique<GroupCollectives>(comm);
}

DeviceMesh::DeviceMesh(dist::Communicator* world, const model::Mesh& shape) : shape_(shape), world_(world) {
  ST_CHECK(shape.world() == world->world_size(), "`parallel.tensor_parallel` = ", shape.tensor_parallel,
           " must divide the ", world->world_size(), " ranks of this run");
  const int r = world->rank();
  // a group of consecutive ranks (one node's GPUs, where they share the fastest links)
  tp_ = world->split(shape.dp_rank(r), shape.tp_rank(r));
  dp_ = world->split(shape.tp_rank(r), shape.dp_rank(r));
  ST_ASSERT(tp_->world_size() == shape.tensor_parallel && dp_->world_size() == shape.data_parallel,
            "mesh split: groups of ", tp_->world_size(), " and ", dp_->world_size());
}

}  // namespace shardtrain::fsdp
