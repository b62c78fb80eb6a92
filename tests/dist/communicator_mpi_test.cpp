// MPI collectives on host memory, exact values. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"

namespace shardtrain::dist {
namespace {

TEST(MpiCommunicator, CollectivesGiveExactValues) {
  auto comm = make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  ASSERT_GE(w, 2) << "run under mpirun -np 2 or more";
  const int64_t n = 37;  // odd, not a multiple of anything

  Tensor mine = Tensor::empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) mine.data<float>()[i] = static_cast<float>(1000 * r + i);
  Tensor all = Tensor::empty({w * n}, DType::kF32);
  comm->all_gather(all, mine);
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(all.data<float>()[q * n + i], static_cast<float>(1000 * q + i));

  // in place: this rank's input already sits in its slot
  Tensor inplace = Tensor::zeros({w * n}, DType::kF64);
  Tensor slot = inplace.flat_range(r * n, n);
  for (int64_t i = 0; i < n; ++i) slot.data<double>()[i] = r + 0.5 * static_cast<double>(i);
  comm->all_gather(inplace, slot);
  for (int q = 0; q < w; ++q) ASSERT_EQ(inplace.data<double>()[q * n + 3], q + 1.5);

  Tensor full = Tensor::empty({w * n}, DType::kF64);
  for (int64_t i = 0; i < w * n; ++i) full.data<double>()[i] = static_cast<double>((r + 1) * i);
  Tensor part = Tensor::empty({n}, DType::kF64);
  comm->reduce_scatter(part, full, ReduceOp::kSum);
  const double ranks_sum = w * (w + 1) / 2.0;  // sum of (r + 1)
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part.data<double>()[i], ranks_sum * static_cast<double>(r * n + i));
  comm->reduce_scatter(part, full, ReduceOp::kAvg);
  for (int64_t i = 0; i < n; ++i) ASSERT_DOUBLE_EQ(part.data<double>()[i], ranks_sum / w * static_cast<double>(r * n + i));

  Tensor count = Tensor::empty({1}, DType::kI64);
  count.data<int64_t>()[0] = r + 1;
  comm->all_reduce(count, ReduceOp::kSum);
  EXPECT_EQ(count.data<int64_t>()[0], static_cast<int64_t>(ranks_sum));

  Tensor b = Tensor::empty({5}, DType::kBF16);
  for (int i = 0; i < 5; ++i) b.data<BFloat16>()[i] = float_to_bf16(static_cast<float>(r * 10 + i));
  comm->broadcast(b, w - 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(bf16_to_float(b.data<BFloat16>()[i]), static_cast<float>((w - 1) * 10 + i));
  comm->barrier();
}

// Point to point, as a decomposed reduce-scatter pairs the ranks: at step s each rank sends
// to r + s and receives from r - s; at s = 0 a rank is its own peer. Sizes and peers checked.
TEST(MpiCommunicator, SendRecvPairsTheRanks) {
  auto comm = make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const int64_t n = 29;
  for (int s = 0; s < w; ++s) {
    const int to = (r + s) % w, from = (r - s + w) % w;
    Tensor send = Tensor::empty({n}, DType::kF32), recv = Tensor::zeros({n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) send.data<float>()[i] = static_cast<float>(1000 * r + 100 * to + i);
    comm->send_recv(send, to, recv, from);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(recv.data<float>()[i], static_cast<float>(1000 * from + 100 * r + i)) << "step " << s;
  }
  Tensor send = Tensor::empty({n}, DType::kF32), shorter = Tensor::empty({n - 1}, DType::kF32);
  EXPECT_THROW(comm->send_recv(send, 0, shorter, 0), Error);
  EXPECT_THROW(comm->send_recv(send, w, send, 0), Error);
}

// A 2-D mesh of the ranks: groups of `tp` consecutive ranks (color: rank / tp) and the ranks
// sharing an index inside them (color: rank % tp), each its own communicator.
TEST(MpiCommunicator, SplitMakesTheMeshGroups) {
  auto comm = make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const int tp = w % 2 == 0 ? 2 : w;
  auto group = comm->split(r / tp, r % tp);
  auto across = comm->split(r % tp, r / tp);
  ASSERT_EQ(group->world_size(), tp);
  ASSERT_EQ(group->rank(), r % tp);
  ASSERT_EQ(across->world_size(), w / tp);
  ASSERT_EQ(across->rank(), r / tp);

  // each group gathers its own members' world ranks, in key order
  Tensor mine = Tensor::empty({1}, DType::kI32);
  mine.data<int32_t>()[0] = r;
  Tensor members = Tensor::empty({tp}, DType::kI32);
  group->all_gather(members, mine);
  for (int q = 0; q < tp; ++q) EXPECT_EQ(members.data<int32_t>()[q], r / tp * tp + q);
  Tensor others = Tensor::empty({w / tp}, DType::kI32);
  across->all_gather(others, mine);
  for (int q = 0; q < w / tp; ++q) EXPECT_EQ(others.data<int32_t>()[q], q * tp + r % tp);

  // a sum over one group sees only its members; a key that reverses the order is obeyed
  Tensor sum = Tensor::empty({1}, DType::kF64);
  sum.data<double>()[0] = r;
  group->all_reduce(sum, ReduceOp::kSum);
  EXPECT_EQ(sum.data<double>()[0], (r / tp) * tp * tp + tp * (tp - 1) / 2.0);
  auto reversed = comm->split(0, w - 1 - r);
  EXPECT_EQ(reversed->rank(), w - 1 - r);
  group->barrier();
  across->barrier();
}

TEST(MpiCommunicator, RejectsMismatchedShapes) {
  auto comm = make_mpi_world();
  Tensor in = Tensor::empty({4}, DType::kF32);
  Tensor out = Tensor::empty({4 * comm->world_size() + 1}, DType::kF32);
  EXPECT_THROW(comm->all_gather(out, in), Error);
  Tensor bf = Tensor::empty({static_cast<int64_t>(comm->world_size())}, DType::kBF16);
  Tensor bo = Tensor::empty({1}, DType::kBF16);
  EXPECT_THROW(comm->reduce_scatter(bo, bf, ReduceOp::kSum), Error);
}

}  // namespace
}  // namespace shardtrain::dist
