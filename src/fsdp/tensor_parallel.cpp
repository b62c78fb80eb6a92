// Tensor parallelism over a communicator; the mesh's split communicators. On a GPU the
// started collectives run on a stream of their own, ordered after the compute stream's work
// so far by an event, and joined back by another in finish().
#include "fsdp/tensor_parallel.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "dist/peer_exchange.h"
#include "ops/elementwise.h"

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace shardtrain::fsdp {
namespace {

// SMs a GPU's products leave to a collective beside them: SHARDTRAIN_TP_OVERLAP_SMS, else
// `fallback`: kOverlapSms for NCCL's kernels, none for the copy engines.
constexpr int kOverlapSms = 16;
int overlap_sms_from_env(int fallback) {
  const char* v = std::getenv("SHARDTRAIN_TP_OVERLAP_SMS");
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  ST_CHECK(end != v && *end == '\0' && n >= 0 && n < 1000, "SHARDTRAIN_TP_OVERLAP_SMS: expected a number of SMs "
           "(0 or more), found \"", v, "\"");
  return static_cast<int>(n);
}

// A switch from the environment: "0" or "1", `fallback` when unset.
bool switch_from_env(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  const std::string s = v;
  ST_CHECK(s == "0" || s == "1", name, ": expected 0 or 1, found \"", s, "\"");
  return s == "1";
}

// The group's collectives. Those started beside the products go through the copy engines
// (dist::PeerExchange) where every rank of the group can map the others' GPU memory, unless
// SHARDTRAIN_TP_COPY_ENGINES=0; through the communicator (NCCL's kernels) otherwise.
// SHARDTRAIN_TP_PIECES=0 turns model::TensorParallel::by_pieces off (to compare against).
class GroupCollectives final : public model::TensorParallel {
 public:
  explicit GroupCollectives(dist::Communicator* comm)
      : comm_(comm), by_pieces_(switch_from_env("SHARDTRAIN_TP_PIECES", true)) {
    if (switch_from_env("SHARDTRAIN_TP_COPY_ENGINES", true)) exchange_ = dist::make_peer_exchange(comm);
    overlap_sms_ = overlap_sms_from_env(exchange_ ? 0 : kOverlapSms);
  }
  int overlap_sm_reserve() const override { return overlap_sms_; }
  bool by_pieces() const override { return by_pieces_; }
  std::string exchange_route() const override { return exchange_ ? "copy engines" : comm_->name(); }
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
    if (copies(out)) {
      start(out, in, [&](Stream s) { gather_by_copies(out, in, s); });
      return;
    }
    start(out, in, [&](Stream s) { comm_->all_gather(out, in, s); });
  }
  void start_reduce_scatter(Tensor& out, const Tensor& in) override {
    if (copies(out)) {
      dist::check_reduce_scatter(out, in, size(), "tensor-parallel reduce_scatter");
      // the other ranks' pieces of this rank's rows, summed into `out` on the side stream
      for (int s = 1; s < size(); ++s)
        received_.push_back(Tensor::empty(out.shape(), out.dtype(), out.device(), "reduce-scatter piece received"));
      start(out, in, [&](Stream s) { reduce_scatter_by_copies(out, in, s); });
      return;
    }
    start(out, in, [&](Stream s) { comm_->reduce_scatter(out, in, dist::ReduceOp::kSum, s); });
  }
  void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    if (copies(recv)) {
      start(recv, send, [&](Stream s) { exchange_->send_recv(send, to, recv, from, s); });
      return;
    }
    start(recv, send, [&](Stream s) { comm_->send_recv(send, to, recv, from, s); });
  }
  void finish() override {
#ifdef SHARDTRAIN_WITH_CUDA
    if (!pending_) return;
    side_->done.make_wait(Stream{});
    // the compute stream now frees or reuses them only after the collective
    pending_out_ = pending_in_ = Tensor();
    received_.clear();
    pending_ = false;
#endif
  }

 private:
  bool copies(const Tensor& t) const { return exchange_ != nullptr && t.device().is_cuda(); }

  // out = every rank's `in` in rank order: this rank's copied in, the others' received, one
  // rank after another (rank + s gets this rank's rows while rank - s's arrive).
  void gather_by_copies(Tensor& out, const Tensor& in, Stream stream) {
    dist::check_all_gather(out, in, size(), "tensor-parallel all_gather");
    const int P = size(), r = rank();
    const int64_t n = in.numel();
    Tensor mine = out.flat_range(r * n, n);
    if (mine.raw_data() != in.raw_data()) copy(mine, in.flat_range(0, n), stream);
    for (int s = 1; s < P; ++s) {
      Tensor slot = out.flat_range(((r - s + P) % P) * n, n);
      exchange_->send_recv(in.flat_range(0, n), (r + s) % P, slot, (r - s + P) % P, stream);
    }
  }

  // out = the sum over ranks of their slice `rank` of `in`: each other rank's slice sent to
  // it, this rank's slices from the others received into received_, then added.
  void reduce_scatter_by_copies(Tensor& out, const Tensor& in, Stream stream) {
    const int P = size(), r = rank();
    const int64_t n = out.numel();
    for (int s = 1; s < P; ++s)
      exchange_->send_recv(in.flat_range(((r + s) % P) * n, n), (r + s) % P, received_[s - 1], (r - s + P) % P,
                           stream);
    const Tensor own = in.flat_range(r * n, n).view(out.shape());
    ops::add(out, own, received_[0], stream);
    for (int s = 2; s < P; ++s) ops::add(out, out, received_[s - 1], stream);
  }

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
  bool by_pieces_;
  std::unique_ptr<dist::PeerExchange> exchange_;  // null: the communicator's collectives
  int overlap_sms_ = 0;
  std::vector<Tensor> received_;  // a started reduce-scatter's pieces, held until finish()
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
