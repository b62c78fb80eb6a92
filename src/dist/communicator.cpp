// The single-rank communicator, the shape checks every implementation uses, and the record
// of collectives issued.
#include "dist/communicator.h"

#include <chrono>
#include <mutex>

#include "core/allocator.h"

namespace shardtrain::dist {
namespace {

struct Activity {
  std::mutex mutex;
  uint64_t issued = 0;
  const char* op = nullptr;  // string literals
  const char* backend = nullptr;
  int64_t bytes = 0;
  int ranks = 0;
  std::chrono::steady_clock::time_point at;
};

Activity& activity() {
  static Activity a;
  return a;
}

}  // namespace

void note_collective(const char* op, int64_t bytes, int ranks, const char* backend) {
  Activity& a = activity();
  const auto now = std::chrono::steady_clock::now();
  const std::lock_guard lock(a.mutex);
  ++a.issued;
  a.op = op;
  a.backend = backend;
  a.bytes = bytes;
  a.ranks = ranks;
  a.at = now;
}

CollectiveActivity collective_activity() {
  Activity& a = activity();
  const std::lock_guard lock(a.mutex);
  CollectiveActivity c;
  c.issued = a.issued;
  if (a.op == nullptr) return c;
  c.last = detail::concat(a.op, " of ", format_bytes(a.bytes), " over ", a.ranks, " ranks (", a.backend, ")");
  c.seconds_ago = std::chrono::duration<double>(std::chrono::steady_clock::now() - a.at).count();
  return c;
}

void check_all_gather(const Tensor& out, const Tensor& in, int world, const char* who) {
  check_contiguous(out, who, "out");
  check_contiguous(in, who, "in");
  ST_CHECK(out.dtype() == in.dtype(), who, ": dtypes differ (out ", dtype_name(out.dtype()), ", in ",
           dtype_name(in.dtype()), ")");
  ST_CHECK(out.numel() == in.numel() * world, who, ": out has ", out.numel(), " elements, expected ", world, " x ",
           in.numel());
}

void check_reduce_scatter(const Tensor& out, const Tensor& in, int world, const char* who) {
  check_contiguous(out, who, "out");
  check_contiguous(in, who, "in");
  ST_CHECK(out.dtype() == in.dtype(), who, ": dtypes differ (out ", dtype_name(out.dtype()), ", in ",
           dtype_name(in.dtype()), ")");
  ST_CHECK(in.numel() == out.numel() * world, who, ": in has ", in.numel(), " elements, expected ", world, " x ",
           out.numel());
}

void check_send_recv(const Tensor& send, int to, const Tensor& recv, int from, int world, const char* who) {
  check_contiguous(send, who, "send");
  check_contiguous(recv, who, "recv");
  ST_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel(), who, ": send ", send.str(),
           " and recv ", recv.str(), " differ in dtype or size");
  ST_CHECK(to >= 0 && to < world && from >= 0 && from < world, who, ": peers ", to, " (to) and ", from,
           " (from) out of range for ", world, " ranks");
}

namespace {

class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "single"; }
  void all_gather(Tensor& out, const Tensor& in, Stream stream) override {
    check_all_gather(out, in, 1, "all_gather");
    copy(out, in, stream);
  }
  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp, Stream stream) override {
    check_reduce_scatter(out, in, 1, "reduce_scatter");
    copy(out, in, stream);
  }
  void all_reduce(Tensor&, ReduceOp, Stream) override {}
  void broadcast(Tensor&, int root, Stream) override {
    ST_CHECK(root == 0, "broadcast: root ", root, " out of range for 1 rank");
  }
  void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream stream) override {
    check_send_recv(send, to, recv, from, 1, "send_recv");
    copy(recv, send, stream);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, int) override { return std::make_unique<SingleRank>(); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank() { return std::make_unique<SingleRank>(); }

}  // namespace shardtrain::dist
