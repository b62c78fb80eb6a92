// Does a tensor-parallel group's collective run beside a product at all? Two GPUs under
// torchrun, the shapes of the 1B model's group of 2 at 8 x 4096 tokens (16,384 token rows per
// rank, D 2048), the collectives on their own stream (as fsdp/tensor_parallel.cpp starts
// them) and the products on the compute stream (the legacy default stream, as the engine):
//   gather        all-gather of the normed rows: [16384, 2048] -> [32768, 2048] bf16 (NCCL)
//   product       the q|k|v product of this rank's own rows: [16384, 2048] x [1536, 2048]^T
//   serial        gather, then the product, on one stream
//   overlap(k)    both at once, the product planned for the SMs less k (ops::GemmSmReserve)
//   copy          a 64 MiB device-to-device copy (the copy engines, no SMs) beside the product
//   rs / wgrad    the backward's pair: reduce-scatter of dxn2's partial sums [32768, 2048] ->
//                 [16384, 2048] beside up's weight gradient dW [4096, 2048] += dy^T x over
//                 32768 rows (f32 out), alone, serial and overlapped; then through a
//                 communicator capped at k thread blocks (NCCL's maxCTAs) beside the product
//                 leaving k SMs, as the engine runs them
//   send_recv     the pair exchange of a decomposed reduce-scatter (64 MiB each way): NCCL's
//                 send/recv and the copy engines' (dist::PeerExchange), alone and beside the
//                 weight gradient leaving k SMs
// Each variant is timed with events on the compute stream over 30 repetitions after 5 (the
// median), every rank in step (each repetition's collective joins them); rank 0 prints. A
// variant's time near max(parts) means the two ran side by side; near the sum, one after the
// other.
//   torchrun --nproc-per-node 2 --no-python tp_overlap_bench [sm reserves: default 0,16,32]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/elementwise.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "dist/nccl_communicator.h"
#include "dist/peer_exchange.h"
#include "ops/linear.h"

namespace {

using namespace shardtrain;

// Median milliseconds of `once` (which must leave the compute stream after all its work).
double time_ms(const std::function<void()>& once) {
  cuda::Event start, end;
  std::vector<double> ms;
  for (int i = 0; i < 35; ++i) {
    start.record(Stream{});
    once();
    end.record(Stream{});
    end.synchronize();
    if (i >= 5) ms.push_back(end.elapsed_ms_since(start));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> reserves = {0, 16, 32};
  if (argc > 1) {
    reserves.clear();
    std::stringstream s(argv[1]);
    for (std::string v; std::getline(s, v, ',');) reserves.push_back(std::stoi(v));
  }
  int gpu = 0;
  const std::unique_ptr<dist::Communicator> comm = dist::make_nccl_world(300, &gpu);
  ST_CHECK(comm->world_size() == 2, "tp_overlap_bench: start 2 ranks (torchrun --nproc-per-node 2)");
  const Device dev = Device::cuda(gpu);
  const int64_t R = 16384, BT = 2 * R, D = 2048, Q = 1536, F = 4096;
  const uint64_t key = 100 * static_cast<uint64_t>(comm->rank());
  auto dev_normal = [&](const Shape& shape, DType t, uint64_t k, double std = 1.0) {
    Tensor v = Tensor::empty(shape, t, dev, "bench input");
    ops::fill_normal(v, 99, k, 0, std);
    return v;
  };
  const Tensor mine = dev_normal({R, D}, DType::kBF16, key + 1);
  Tensor all = Tensor::empty({BT, D}, DType::kBF16, dev, "gathered rows");
  const Tensor w_qkv = dev_normal({Q, D}, DType::kBF16, key + 2, 0.02);
  Tensor qkv = Tensor::empty({R, Q}, DType::kBF16, dev, "q|k|v");
  const Tensor src = dev_normal({BT / 2, D}, DType::kBF16, key + 3);
  Tensor dst = Tensor::empty({BT / 2, D}, DType::kBF16, dev, "copy");
  const Tensor partial = dev_normal({BT, D}, DType::kBF16, key + 4);
  Tensor rows = Tensor::empty({R, D}, DType::kBF16, dev, "reduced rows");
  const Tensor dy = dev_normal({BT, F}, DType::kBF16, key + 5);
  const Tensor x = dev_normal({BT, D}, DType::kBF16, key + 6);
  Tensor dw = Tensor::empty({F, D}, DType::kF32, dev, "dW");
  const Tensor w_up = dev_normal({F, D}, DType::kBF16, key + 7, 0.02);
  Tensor none;

  cuda::OwnedStream side;
  cuda::Event ready, done;
  const Stream s = side.get();
  auto beside = [&](const std::function<void(Stream)>& collective, const std::function<void()>& product) {
    ready.record(Stream{});
    ready.make_wait(s);
    collective(s);
    done.record(s);
    product();
    done.make_wait(Stream{});
  };
  auto gather = [&](Stream on) { comm->all_gather(all, mine, on); };
  auto product = [&] { ops::linear_forward(qkv, mine, w_qkv); };
  auto copy = [&](Stream on) { copy_async(dst, src, on); };
  auto rs = [&](Stream on) { comm->reduce_scatter(rows, partial, dist::ReduceOp::kSum, on); };
  auto wgrad = [&] {
    const ops::LinearBackwardOptions o{.overwrite_dweight = true};
    ops::linear_backward(none, dw, none, dy, x, w_up, o);
  };

  // checked before timing: the gather holds every rank's rows in rank order, and a capped
  // communicator's reduce-scatter gives the same sums as the default one
  gather(Stream{});
  ST_CHECK(bench::rel_err(all.slice(0, comm->rank() * R, comm->rank() * R + R), mine) == 0,
           "tp_overlap_bench: the gather misplaced this rank's rows");
  rs(Stream{});
  const Tensor want = bench::host_of(rows);
  for (int k : reserves) {
    if (k == 0) continue;
    const std::unique_ptr<dist::Communicator> capped = comm->split(0, comm->rank(), k);
    ops::fill(rows, 0.0);
    capped->reduce_scatter(rows, partial, dist::ReduceOp::kSum, Stream{});
    ST_CHECK(bench::rel_err(rows, want) == 0, "tp_overlap_bench: the ", k, "-block communicator's sums differ");
  }

  struct Line {
    std::string name;
    double ms;
  };
  std::vector<Line> lines;
  const double t_gather = time_ms([&] { gather(Stream{}); });
  const double t_product = time_ms(product);
  lines.push_back({"gather", t_gather});
  lines.push_back({"product", t_product});
  lines.push_back({"serial (gather, product)", time_ms([&] { gather(Stream{}), product(); })});
  for (int k : reserves)
    lines.push_back({"overlap(" + std::to_string(k) + ")", time_ms([&] {
                       const ops::GemmSmReserve reserve(k);
                       beside(gather, product);
                     })});
  lines.push_back({"copy (64 MiB) alone", time_ms([&] { copy(Stream{}); })});
  lines.push_back({"copy beside the product", time_ms([&] { beside(copy, product); })});
  const double t_rs = time_ms([&] { rs(Stream{}); });
  lines.push_back({"rs", t_rs});
  lines.push_back({"wgrad", time_ms(wgrad)});
  lines.push_back({"serial (rs, wgrad)", time_ms([&] { rs(Stream{}), wgrad(); })});
  for (int k : reserves)
    lines.push_back({"rs beside wgrad(" + std::to_string(k) + ")", time_ms([&] {
                       const ops::GemmSmReserve reserve(k);
                       beside(rs, wgrad);
                     })});
  // the engine's reduce-scatters beside weight gradients: a communicator of the same ranks
  // capped at k thread blocks, the product leaving k SMs (fsdp/tensor_parallel.cpp)
  for (int k : reserves) {
    if (k == 0) continue;
    const std::unique_ptr<dist::Communicator> capped = comm->split(0, comm->rank(), k);
    auto capped_rs = [&](Stream on) { capped->reduce_scatter(rows, partial, dist::ReduceOp::kSum, on); };
    lines.push_back({"rs, " + std::to_string(k) + "-block communicator", time_ms([&] { capped_rs(Stream{}); })});
    lines.push_back({"rs, " + std::to_string(k) + "-block communicator, beside wgrad(" + std::to_string(k) + ")",
                     time_ms([&] {
                       const ops::GemmSmReserve reserve(k);
                       beside(capped_rs, wgrad);
                     })});
  }
  // the pair exchange of a decomposed reduce-scatter or gather (64 MiB each way): NCCL's
  // send/recv against the copy engines (dist::PeerExchange), alone and beside the weight
  // gradient; each checked first against the gathered rows of the other rank
  const int peer = 1 - comm->rank();
  Tensor got = Tensor::empty({R, D}, DType::kBF16, dev, "rows received");
  const Tensor theirs = all.slice(0, peer * R, peer * R + R);
  auto nccl_pair = [&](Stream on) { comm->send_recv(mine, peer, got, peer, on); };
  std::vector<std::pair<std::string, std::function<void(Stream)>>> exchanges = {{"send_recv, NCCL", nccl_pair}};
  const std::unique_ptr<dist::PeerExchange> engines = dist::make_peer_exchange(comm.get());
  if (engines) {
    exchanges.push_back({"send_recv, copy engines", [&](Stream on) { engines->send_recv(mine, peer, got, peer, on); }});
  } else if (comm->rank() == 0) {
    std::printf("# no copy-engine exchange between these GPUs (dist::make_peer_exchange)\n");
  }
  double t_pair = 0;
  for (auto& [name, exchange] : exchanges) {
    ops::fill(got, 0.0);
    exchange(Stream{});
    ST_CHECK(bench::rel_err(got, theirs) == 0, "tp_overlap_bench: ", name, " delivered other rows");
    ops::fill(got, 0.0);
    beside(exchange, wgrad);  // started beside a product too
    done.synchronize();
    ST_CHECK(bench::rel_err(got, theirs) == 0, "tp_overlap_bench: ", name, " beside a product delivered other rows");
    const double t = time_ms([&] { exchange(Stream{}); });
    if (name == "send_recv, copy engines") t_pair = t;
    lines.push_back({name + " alone", t});
    for (int k : reserves)
      lines.push_back({name + " beside wgrad(" + std::to_string(k) + ")", time_ms([&] {
                         const ops::GemmSmReserve reserve(k);
                         beside(exchange, wgrad);
                       })});
  }
  if (comm->rank() == 0) {
    if (t_pair > 0)
      std::printf("# copy engines: %.0f GB/s each way\n", static_cast<double>(R * D * 2) / t_pair / 1e6);
    std::printf("# %s x 2, tensor-parallel group of 2: rows %lld per rank, D %lld (ms, median of 30)\n",
                cuda::device_name(gpu).c_str(), static_cast<long long>(R), static_cast<long long>(D));
    std::printf("| variant | ms |\n|---|---|\n");
    for (const Line& l : lines) std::printf("| %s | %.3f |\n", l.name.c_str(), l.ms);
    std::printf("# gather: %.0f GB/s of rows received; rs: %.0f GB/s of partial sums sent\n",
                static_cast<double>(R * D * 2) / t_gather / 1e6, static_cast<double>(R * D * 2) / t_rs / 1e6);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tp_overlap_bench: %s\n", e.what());
  return 1;
}
