// Context parallelism over a communicator: the ring's exchanges are send_recv calls between
// neighbours of the group. On a GPU the started ones run on a stream of their own beside the
// attention of the block in hand, ordered after the compute stream's work so far by an event
// and joined back by another in finish(); on the CPU they complete before returning.
#include "fsdp/context_parallel.h"

#include <vector>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace shardtrain::fsdp {
namespace {

class RingExchanges final : public model::ContextParallel {
 public:
  explicit RingExchanges(dist::Communicator* comm) : comm_(comm) {}
  ~RingExchanges() override {
    // exchanges left in flight (an error between start and finish) still use their buffers:
    // the compute stream, in whose order the caching allocator reuses memory, waits for them
    try {
      finish();
    } catch (...) {  // a destructor reports nothing; the error that left them is the one to see
    }
  }
  int size() const override { return comm_->world_size(); }
  int rank() const override { return comm_->rank(); }
  // On a GPU the exchange is ordered after the compute stream's work and the compute stream
  // waits for it (Stream{}: the compute stream; NCCL's send and receive run on the
  // communicator's own stream between the two), so the next block's attention reads what
  // arrived.
  void send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    comm_->send_recv(send, to, recv, from, Stream{});
  }
  void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
#ifdef SHARDTRAIN_WITH_CUDA
    if (recv.device().is_cuda()) {
      if (!side_) side_ = std::make_unique<Side>();
      const Stream s = side_->stream.get();
      side_->ready.record(Stream{});  // `send` is written and `recv`'s memory free
      side_->ready.make_wait(s);
      comm_->send_recv(send, to, recv, from, s);
      side_->done.record(s);  // after every exchange started so far (one stream, in order)
      // held: the caching allocator reuses memory in compute-stream order, which reaches the
      // side stream's use of them only at finish()
      held_.push_back(send);
      held_.push_back(recv);
      return;
    }
#endif
    send_recv(send, to, recv, from);
  }
  void finish() override {
#ifdef SHARDTRAIN_WITH_CUDA
    if (held_.empty()) return;
    side_->done.make_wait(Stream{});
    held_.clear();  // the compute stream now frees or reuses them only after the exchanges
#endif
  }

 private:
  dist::Communicator* comm_;
#ifdef SHARDTRAIN_WITH_CUDA
  struct Side {
    cuda::OwnedStream stream;
    cuda::Event ready, done;
  };
  std::unique_ptr<Side> side_;
  std::vector<Tensor> held_;  // the started exchanges' buffers, until finish()
#endif
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
