// Tensor parallelism over a communicator; the mesh's split communicators. On a GPU the
// started collectives run on a stream of their own, ordered after the compute stream's work
// so far by an event, and joined back by another in finish().
#include "fsdp/tensor_parallel.h"

#include <cstdlib>
#include <string>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace shardtrain::fsdp {
namespace {

// SMs a GPU's products leave to a collective beside them: SHARDTRAIN_TP_OVERLAP_SMS, else
// kOverlapSms.
constexpr int kOverlapSms = 16;
int overlap_sms_from_env() {
  const char* v = std::getenv("SHARDTRAIN_TP_OVERLAP_SMS");
  if (v == nullptr) return kOverlapSms;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  ST_CHECK(end != v && *end == '\0' && n >= 0 && n < 1000, "SHARDTRAIN_TP_OVERLAP_SMS: expected a number of SMs "
           "(0 or more), found \"", v, "\"");
  return static_cast<int>(n);
}

// SHARDTRAIN_TP_PIECES=0 turns model::TensorParallel::by_pieces off (to compare against).
bool by_pieces_from_env() {
  const char* v = std::getenv("SHARDTRAIN_TP_PIECES");
  if (v == nullptr) return true;
  const std::string s = v;
  ST_CHECK(s == "0" || s == "1", "SHARDTRAIN_TP_PIECES: expected 0 or 1, found \"", s, "\"");
  return s == "1";
}

class GroupCollectives final : public model::TensorParallel {
 public:
  explicit GroupCollectives(dist::Communicator* comm)
      : comm_(comm), overlap_sms_(overlap_sms_from_env()), by_pieces_(by_pieces_from_env()) {}
  int overlap_sm_reserve() const override { return overlap_sms_; }
  bool by_pieces() const override { return by_pieces_; }
  int size() const override { return comm_->world_size(); }
  int rank() const override { return comm_->rank(); }
  void all_gather(Tensor& out, const Tensor& in) override { comm_->all_gather(out, in); }
  void reduce_scatter(Tensor& out, const Tensor& in) override {
    comm_->reduce_scatter(out, in, dist::ReduceOp::kSum);
  }
  void all_reduce(Tensor& inout) override { comm_->all_reduce(inout, dist::ReduceOp::kSum); }
  void send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    comm_->send_recv(send, to, recv, from);
  }

  void start_all_gather(Tensor& out, const Tensor& in) override {
    start(out, in, [&](Stream s) { comm_->all_gather(out, in, s); });
  }
  void start_reduce_scatter(Tensor& out, const Tensor& in) override {
    start(out, in, [&](Stream s) { comm_->reduce_scatter(out, in, dist::ReduceOp::kSum, s); });
  }
  void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    start(recv, send, [&](Stream s) { comm_->send_recv(send, to, recv, from, s); });
  }
  void finish() override {
#ifdef SHARDTRAIN_WITH_CUDA
    if (!pending_) return;
    side_->done.make_wait(Stream{});
    // the compute stream now frees or reuses them only after the collective
    pending_out_ = pending_in_ = Tensor();
    pending_ = false;
#endif
  }

 private:
  template <typename Issue>
  void start(const Tensor& out, const Tensor& in, Issue&& issue) {
#ifdef SHARDTRAIN_WITH_CUDA
    ST_ASSERT(!pending_, "tensor parallelism: a collective started before the last one finished");
    if (out.device().is_cuda()) {
      if (!side_) side_ = std::make_unique<Side>();
      side_->ready.record(Stream{});  // the input is written and the output's memory free
      side_->ready.make_wait(side_->stream.get());
      issue(side_->stream.get());
      side_->done.record(side_->stream.get());
      pending_out_ = out;  // held: the caching allocator reuses memory in compute-stream order
      pending_in_ = in;
      pending_ = true;
      return;
    }
#endif
    (void)out, (void)in;
    issue(Stream{});
  }

  dist::Communicator* comm_;
  int overlap_sms_;
  bool by_pieces_;
#ifdef SHARDTRAIN_WITH_CUDA
  struct Side {
    cuda::OwnedStream stream;
    cuda::Event ready, done;
  };
  std::unique_ptr<Side> side_;
  bool pending_ = false;
  Tensor pending_out_, pending_in_;
#endif
};

}  // namespace

std::unique_ptr<model::TensorParallel> make_tensor_parallel(dist::Communicator* comm) {
  return std::make_unique<GroupCollectives>(comm);
}

DeviceMesh::DeviceMesh(dist::Communicator* world, const model::Mesh& shape) : shape_(shape), world_(world) {
  ST_CHECK(shape.world() == world->world_size(), "`parallel.tensor_parallel` = ", shape.tensor_parallel,
           " must divide the ", world->world_size(), " ranks of this run");
  shape.check();
  const int r = world->rank();
  // a group of consecutive ranks (one node's GPUs, where they share the fastest links)
  tp_ = world->split(shape.dp_rank(r), shape.tp_rank(r));
  dp_ = world->split(shape.tp_rank(r), shape.dp_rank(r));
  ST_ASSERT(tp_->world_size() == shape.tensor_parallel && dp_->world_size() == shape.data_parallel,
            "mesh split: groups of ", tp_->world_size(), " and ", dp_->world_size());
  if (shape.replicate > 1) {
    // a replica: consecutive ranks too; the exchange between replicas is the one that crosses nodes
    const int replica = shape.replica(r), place = r % shape.replica_ranks();
    replica_ = world->split(replica, place);
    replica_dp_ = world->split(replica * shape.tensor_parallel + shape.tp_rank(r), shape.dp_rank(r));
    across_ = world->split(place, replica);
    ST_ASSERT(replica_->world_size() == shape.replica_ranks() && replica_dp_->world_size() == shape.shard_groups() &&
                  across_->world_size() == shape.replicate,
              "mesh split: replicas of ", replica_->world_size(), ", ", replica_dp_->world_size(), " and ",
              across_->world_size());
  }
}

}  // namespace shardtrain::fsdp
