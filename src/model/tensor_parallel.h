// Tensor parallelism inside a block, as Megatron-LM splits it: each rank of a group holds
// 1/size of the query and key/value heads and of the FFN columns, so q, k, v, gate and up are
// column-parallel products (rows of their weights) and o and down row-parallel ones (columns),
// whose outputs are partial sums over the group. The model names only this interface; fsdp/
// makes one from a communicator (fsdp/tensor_parallel.h).
#pragma once

#include <string>

#include "core/tensor.h"

namespace shardtrain::model {

// The group's collectives, on the compute stream, in the tensors' own dtype.
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // out [size · n] = every rank's in [n], in rank order.
  virtual void all_gather(Tensor& out, const Tensor& in) = 0;
  // out [n] = the sum over ranks of slice `rank` of in [size · n].
  virtual void reduce_scatter(Tensor& out, const Tensor& in) = 0;
  // inout = the sum over ranks, in place (the same values on every rank).
  virtual void all_reduce(Tensor& inout) = 0;
  // `send` to rank `to` while `recv` arrives from rank `from`, the pairs of a decomposed
  // reduce-scatter (each rank's `to` names a rank whose `from` names it).
  virtual void send_recv(const Tensor& send, int to, Tensor& recv, int from) = 0;

  // all_gather, reduce_scatter and send_recv started beside the compute stream: its later
  // work runs while they move, until finish() makes it wait for them (Megatron's overlap of a
  // group's collectives with its products). One at a time; `out` and `in` are
  // left alone (not written, not freed, `out` not read) until finish(). Where nothing runs
  // beside (the CPU) they complete before returning.
  virtual void start_all_gather(Tensor& out, const Tensor& in) { all_gather(out, in); }
  virtual void start_reduce_scatter(Tensor& out, const Tensor& in) { reduce_scatter(out, in); }
  virtual void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) { send_recv(send, to, recv, from); }
  virtual void finish() {}
  // SMs the products that run beside a started collective leave to it (ops::GemmSmReserve).
  virtual int overlap_sm_reserve() const { return 0; }
  // Whether the block moves rows by pieces beside its work under sequence parallelism: a
  // row-parallel product's reduce-scatter decomposed into exchanges beside the next rows'
  // product, and attention run per sequence beside the gather of the other ranks' rows.
  // False: one reduce-scatter after the whole product, attention once every row is here.
  virtual bool by_pieces() const { return true; }
  // What moves the started collectives' bytes, for the log: "copy engines", or the
  // communicator's name.
  virtual std::string exchange_route() const = 0;
};

// Where the residual stream lives between a block's products (BlockContext::tp):
//   kSequence: each rank holds its B·T / size token rows of x, x2, y and their norms'
//     statistics (sequence parallelism): a product's input is all-gathered over the rows,
//     its partial output reduce-scattered back to them. Training and evaluation.
//   kReplicated: every rank holds all B·T rows; the partial outputs are all-reduced. For a
//     forward over rows that do not split evenly (sampling, the KV cache's one-token steps).
enum class ResidualSplit { kSequence, kReplicated };

}  // namespace shardtrain::model
