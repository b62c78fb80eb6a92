// Context parallelism's exchanges beside the compute on one GPU. The group's own exchanges
// (fsdp::make_context_parallel over a one-rank communicator, each exchange a copy to itself):
// a started one reads its `send` as the compute stream left it, holds `send` and `recv` while
// the caller's handles are gone and the compute stream allocates and writes again, and after
// finish() the compute stream reads what arrived; two started before one finish() both arrive.
// Ring attention on a GPU with its exchanges late: a group of 2 and of 4 ranks as threads, each
// with its own compute stream, whose started exchanges are copies on a side stream held back
// behind other work until finish(), gives, at each rank's tokens, one GPU's attention over the
// whole sequence and its dq, dk and dv (f32 and bf16), also with packed documents that span
// chunks and ranks (the blocks off the diagonal as key spans). Skips without a device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/stream.h"
#include "dist/communicator.h"
#include "fsdp/context_parallel.h"
#include "model/context_parallel.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"
#include "testing/packed_documents.h"

namespace shardtrain {
namespace {

using testing::to_device;
using testing::to_host;

// How many of x's (f32, on the host) values differ from `want`.
int64_t count_not(const Tensor& x, float want) {
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += x.data<float>()[i] != want;
  return n;
}

// x = value after `passes` additions of 1 to 0 queued on the compute stream (time on it).
void fill_slowly(Tensor& x, const Tensor& ones, int passes) {
  ops::fill(x, 0.0);
  for (int i = 0; i < passes; ++i) ops::add(x, x, ones);
}

TEST(ContextParallelCuda, StartedExchangeFollowsTheComputeStreamAndFinishJoinsIt) {
  ST_REQUIRE_CUDA();
  auto comm = dist::make_single_rank();
  auto cp = fsdp::make_context_parallel(comm.get());
  const Device gpu = Device::cuda(0);
  const int64_t n = int64_t{1} << 24;  // 64 MiB of f32: each pass over it takes visible time
  Tensor ones = Tensor::empty({n}, DType::kF32, gpu, "ones");
  ops::fill(ones, 1.0);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Tensor recv = Tensor::empty({n}, DType::kF32, gpu, "recv");
    ops::fill(recv, -1.0);
    {
      Tensor send = Tensor::empty({n}, DType::kF32, gpu, "send");
      fill_slowly(send, ones, 20);  // still queued when the exchange starts
      cp->start_send_recv(send, 0, recv, 0);
    }  // the caller's `send` is gone: the exchange holds it
    // the compute stream goes on: tensors of send's size, written at once (the caching
    // allocator would hand out send's memory again were it not held)
    for (int i = 0; i < 4; ++i) {
      Tensor other = Tensor::empty({n}, DType::kF32, gpu, "other");
      ops::fill(other, -7.0);
    }
    cp->finish();
    Tensor seen = Tensor::empty({n}, DType::kF32, gpu, "seen");
    copy(seen, recv);  // on the compute stream: after finish(), what arrived
    EXPECT_EQ(count_not(to_host(seen), 20.0f), 0);
  }
}

TEST(ContextParallelCuda, TwoStartedBeforeOneFinishBothArrive) {
  ST_REQUIRE_CUDA();
  auto comm = dist::make_single_rank();
  auto cp = fsdp::make_context_parallel(comm.get());
  const Device gpu = Device::cuda(0);
  const int64_t n = int64_t{1} << 22;
  Tensor ones = Tensor::empty({n}, DType::kF32, gpu, "ones");
  ops::fill(ones, 1.0);
  Tensor a = Tensor::empty({n}, DType::kF32, gpu, "a"), b = Tensor::empty({n}, DType::kF32, gpu, "b");
  Tensor ra = Tensor::empty({n}, DType::kF32, gpu, "ra"), rb = Tensor::empty({n}, DType::kF32, gpu, "rb");
  fill_slowly(a, ones, 10);
  cp->start_send_recv(a, 0, ra, 0);
  fill_slowly(b, ones, 30);  // the second one's input is written after the first has started
  cp->start_send_recv(b, 0, rb, 0);
  cp->finish();
  Tensor sa = Tensor::empty({n}, DType::kF32, gpu, "seen a"), sb = Tensor::empty({n}, DType::kF32, gpu, "seen b");
  copy(sa, ra);
  copy(sb, rb);
  EXPECT_EQ(count_not(to_host(sa), 10.0f), 0);
  EXPECT_EQ(count_not(to_host(sb), 30.0f), 0);
}

// The ranks of a context group as threads on one GPU. A started exchange is a copy on the
// receiving rank's side stream, after both ranks' compute streams reached the start (events)
// and after a hold-up (passes over a scratch tensor), so a ring that read a `recv`
// before finish() would read an earlier step's block; finish() makes the compute stream wait
// for this rank's arrivals and for the receivers' copies out of its `send`s.
class ThreadHub {
 public:
  // What one rank leaves for another: its `send`, the point its compute stream had reached,
  // and the receiver's copy's end (recorded by the receiver; `copied` says it is).
  struct Handoff {
    Tensor send;
    cuda::Event ready, consumed;
    bool copied = false;
  };

  explicit ThreadHub(int size) : size_(size) {}
  int size() const { return size_; }

  void post(int from, int to, std::shared_ptr<Handoff> h) {
    std::lock_guard<std::mutex> lock(m_);
    boxes_[{from, to}].push_back(std::move(h));
    cv_.notify_all();
  }
  std::shared_ptr<Handoff> take(int from, int to) {
    std::unique_lock<std::mutex> lock(m_);
    auto& box = boxes_[{from, to}];
    const auto posted = [&] { return !box.empty(); };
    wait(lock, posted, "an exchange from rank " + std::to_string(from));
    auto h = box.front();
    box.pop_front();
    return h;
  }
  void mark_copied(Handoff& h) {
    std::lock_guard<std::mutex> lock(m_);
    h.copied = true;
    cv_.notify_all();
  }
  void wait_copied(const Handoff& h) {
    std::unique_lock<std::mutex> lock(m_);
    const auto copied = [&] { return h.copied; };
    wait(lock, copied, "the copy out of a send");
  }

 private:
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred, const std::string& what) {
    // a rank that failed leaves the others waiting: they give up rather than hang the test
    ST_CHECK(cv_.wait_for(lock, std::chrono::seconds(60), pred), "thread ring: waited 60 s for ", what);
  }

  int size_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Handoff>>> boxes_;
};

class ThreadRing final : public model::ContextParallel {
 public:
  ThreadRing(ThreadHub& hub, int rank)
      : hub_(hub), rank_(rank), scratch_(Tensor::empty({int64_t{1} << 22}, DType::kF32, Device::cuda(0), "hold-up")) {}
  int size() const override { return hub_.size(); }
  int rank() const override { return rank_; }
  void send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    start_send_recv(send, to, recv, from);
    finish();
  }
  void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    auto mine = std::make_shared<ThreadHub::Handoff>();
    mine->send = send;
    mine->ready.record(Stream{});
    hub_.post(rank_, to, mine);
    sent_.push_back(mine);
    std::shared_ptr<ThreadHub::Handoff> theirs = hub_.take(from, rank_);
    const Stream s = side_.get();
    mine->ready.make_wait(s);    // `recv` is free: this rank's compute stream is done with it
    theirs->ready.make_wait(s);  // their `send` is written
    for (int i = 0; i < 20; ++i) ops::fill(scratch_, static_cast<double>(i), s);  // the hold-up
    copy(recv, theirs->send, s);
    theirs->consumed.record(s);
    hub_.mark_copied(*theirs);
    received_.push_back(recv);
  }
  void finish() override {
    for (const auto& h : sent_) {
      hub_.wait_copied(*h);
      h->consumed.make_wait(Stream{});
    }
    arrived_.record(side_.get());
    arrived_.make_wait(Stream{});
    sent_.clear();
    received_.clear();
  }

 private:
  ThreadHub& hub_;
  int rank_;
  cuda::OwnedStream side_;
  cuda::Event arrived_;
  Tensor scratch_;
  std::vector<std::shared_ptr<ThreadHub::Handoff>> sent_;
  std::vector<Tensor> received_;  // held until finish()
};

struct RankResult {
  Tensor out, lse, dq, dk, dv;  // on the host
};

// Each rank's ring attention, forward and backward, on a thread with its own compute stream.
// positions_BT (i32 on the host, the whole rows; undefined: none): packed documents.
std::vector<RankResult> thread_ring(int degree, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const ops::AttentionOptions& o, const Tensor& positions_BT = {}) {
  ThreadHub hub(degree);
  std::vector<RankResult> results(static_cast<size_t>(degree));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(degree));
  std::vector<std::thread> threads;
  for (int r = 0; r < degree; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda::OwnedStream compute;
        set_current_compute_stream(compute.get().handle);
        struct Reset {
          ~Reset() { set_current_compute_stream(nullptr); }
        } reset;  // before `compute` goes
        ThreadRing ring(hub, r);
        const Tensor lq = model::context_shard(q, degree, r), lk = model::context_shard(k, degree, r),
                     lv = model::context_shard(v, degree, r), ldout = model::context_shard(dout, degree, r);
        const Device gpu = q.device();
        const int64_t B = q.size(0), L = lq.size(1), N = q.size(2);
        std::optional<model::ContextDocuments> docs;
        if (positions_BT.defined())
          docs = model::context_documents(model::context_shard(positions_BT, degree, r), degree, r, gpu);
        const model::ContextDocuments* d = docs ? &*docs : nullptr;
        Tensor out = Tensor::empty(lq.shape(), q.dtype(), gpu), lse = Tensor::empty({B, N, L}, DType::kF32, gpu);
        Tensor dq = Tensor::empty(lq.shape(), q.dtype(), gpu), dk = Tensor::empty(lk.shape(), q.dtype(), gpu),
               dv = Tensor::empty(lv.shape(), q.dtype(), gpu);
        model::ring_attention_forward(out, lse, lq, lk, lv, o, ring, d);
        model::ring_attention_backward(dq, dk, dv, ldout, lq, lk, lv, out, lse, o, ring, d);
        RankResult& res = results[static_cast<size_t>(r)];
        res = {to_host(out), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

// sqrt(sum (a - b)^2) / sqrt(sum b^2) over two host tensors of any float dtype.
double rel_norm(const Tensor& a, const Tensor& b) {
  const Tensor x = testing::to_f64(a), y = testing::to_f64(b);
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = x.data<double>()[i] - y.data<double>()[i];
    num += d * d;
    den += y.data<double>()[i] * y.data<double>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// One GPU's attention over the whole sequence, forward and backward, on the host.
RankResult one_gpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                   const ops::AttentionOptions& o) {
  const Device gpu = q.device();
  const int64_t B = q.size(0), T = q.size(1), N = q.size(2);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), gpu), lse = Tensor::empty({B, N, T}, DType::kF32, gpu);
  ops::attention_forward(out, lse, q, k, v, o);
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), gpu), dk = Tensor::empty(k.shape(), q.dtype(), gpu),
         dv = Tensor::empty(v.shape(), q.dtype(), gpu);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, o);
  return {to_host(out), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
}

// Documents that span chunks and ranks, and documents that start at a chunk's first token.
Tensor spanning_documents(int64_t T, int64_t C) {
  std::vector<std::vector<int64_t>> rows(2);
  for (int64_t t = 0, i = 0; t < T; ++i) {  // lengths C + 5, 1, 2C + 7, repeated
    const int64_t len = std::min(std::vector<int64_t>{C + 5, 1, 2 * C + 7}[static_cast<size_t>(i % 3)], T - t);
    rows[0].push_back(len);
    t += len;
  }
  for (int64_t t = 0; t < T; t += C) rows[1].push_back(C);
  return testing::document_positions(rows);
}

TEST(ContextParallelCuda, RingAttentionWithLateExchangesMatchesOneGpu) {
  ST_REQUIRE_CUDA();
  for (bool documents : {false, true})
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int degree : {2, 4}) {
      const int64_t B = 2, N = 8, M = 2, H = 64, C = 96, T = 2 * degree * C;
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", degree " + std::to_string(degree) + ", T = " + std::to_string(T) +
                   (documents ? ", packed documents" : ""));
      const uint64_t seed = static_cast<uint64_t>(T + degree);
      // f32 values that `dt` holds exactly: the f32 reference and the `dt` run see the same inputs
      const Tensor q = to_device(testing::rounded_f32({B, T, N, H}, dt, seed + 1, 0.1, 0.8));
      const Tensor k = to_device(testing::rounded_f32({B, T, M, H}, dt, seed + 2, -0.1, 0.8));
      const Tensor v = to_device(testing::rounded_f32({B, T, M, H}, dt, seed + 3, 0.2, 1.5));
      const Tensor dout = to_device(testing::rounded_f32({B, T, N, H}, dt, seed + 4, 0.05, 1.0));
      const auto in_dtype = [&](const Tensor& x) {
        if (dt == DType::kF32) return x;
        Tensor y = Tensor::empty(x.shape(), dt, x.device(), "test input");
        ops::cast(y, x);
        return y;
      };
      const Tensor qd = in_dtype(q), kd = in_dtype(k), vd = in_dtype(v), doutd = in_dtype(dout);
      ops::AttentionOptions o;
      o.deterministic = true;
      const Tensor positions = documents ? spanning_documents(T, C) : Tensor();
      const std::optional<ops::PackedDocuments> whole_documents =
          documents ? std::optional<ops::PackedDocuments>(ops::pack_documents(positions, q.device())) : std::nullopt;
      ops::AttentionOptions one = o;
      one.documents = whole_documents ? &*whole_documents : nullptr;
      const RankResult f32 = one_gpu(q, k, v, dout, one);        // the reference
      const RankResult whole = one_gpu(qd, kd, vd, doutd, one);  // one GPU in `dt`
      const std::vector<RankResult> ring = thread_ring(degree, qd, kd, vd, doutd, o, positions);
      for (int r = 0; r < degree; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const RankResult& got = ring[static_cast<size_t>(r)];
        const auto check = [&](const Tensor& ring_part, const Tensor& whole_all, const Tensor& ref_all, int dim,
                               const char* name) {
          const Tensor ref = model::context_shard(ref_all, degree, r, dim);
          const double err = rel_norm(ring_part, ref);
          if (ring_part.dtype() == DType::kF32) {
            // f32: the blocks' merges and sums against one pass, to f32's rounding; the
            // log-sum-exps of bf16 inputs (cuDNN's, against the f32 kernel's) to the 1e-4 the
            // attention's own GPU tests allow them
            EXPECT_LT(err, dt == DType::kF32 ? 1e-5 : 1e-4) << name;
          } else {
            // bf16: each block's part is rounded to bf16 before the parts add up in f32, where
            // one GPU rounds once; a block read before it arrived would be off by O(1)
            const double one = rel_norm(model::context_shard(whole_all, degree, r, dim), ref);
            EXPECT_LT(err, std::max(3 * one, 1e-2)) << name << ": one GPU in bf16 is " << one << " off";
          }
        };
        check(got.out, whole.out, f32.out, 1, "out");
        check(got.lse, whole.lse, f32.lse, 2, "lse");
        check(got.dq, whole.dq, f32.dq, 1, "dq");
        check(got.dk, whole.dk, f32.dk, 1, "dk");
        check(got.dv, whole.dv, f32.dv, 1, "dv");
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain
