// Context parallelism over a communicator: the ring's exchanges are send_recv calls between
// neighbours of the group, synchronous here (on a GPU they would run on a stream of their own
// beside the attention of the block in hand, joined by an event in finish()).
#include "fsdp/context_parallel.h"

namespace shardtrain::fsdp {
namespace {

class RingExchanges final : public model::ContextParallel {
 public:
  explicit RingExchanges(dist::Communicator* comm) : comm_(comm) {}
  int size() const override { return comm_->world_size(); }
  int rank() const override { return comm_->rank(); }
  // On a GPU the exchange is ordered after the compute stream's work and the compute stream
  // waits for it (Stream{}: the compute stream; NCCL's send and receive run on the
  // communicator's own stream between the two), so the next block's attention reads what
  // arrived.
  void send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    comm_->send_recv(send, to, recv, from, Stream{});
  }

 private:
  dist::Communicator* comm_;
};

}  // namespace

std::unique_ptr<model::ContextParallel> make_context_parallel(dist::Communicator* comm) {
  ST_CHECK(comm != nullptr, "context parallelism needs the communicator of its group");
  return std::make_unique<RingExchanges>(comm);
}

ContextGroups split_context_groups(dist::Communicator& world, int degree) {
  const int w = world.world_size(), r = world.rank();
  ST_CHECK(degree >= 1 && w % degree == 0, "parallel.context_parallel = ", degree, " must divide the ", w,
           " ranks of the run; choose a divisor of ", w);
  ContextGroups g;
  g.degree = degree;
  g.group = world.split(r / degree, r % degree);
  g.across = world.split(r % degree, r / degree);
  return g;
}

}  // namespace shardtrain::fsdp
