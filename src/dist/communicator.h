// Collectives over the ranks of one mesh dimension. Implementations: a single rank
// (copies only), MPI over host memory, and (with the CUDA backend) NCCL over device memory.
// Every rank calls the same collectives in the same order with the same shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace shardtrain::dist {

enum class ReduceOp { kSum, kAvg };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "single", "mpi", "nccl"

  // out_W·n = concat over ranks of in_n (rank order). `in` may be out's own slice `rank`.
  virtual void all_gather(Tensor& out, const Tensor& in, Stream stream = {}) = 0;
  // out_n = reduction over ranks of slice `rank` of in_W·n. Avg divides the sum by W once.
  virtual void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, Stream stream = {}) = 0;
  // In place, over all ranks.
  virtual void all_reduce(Tensor& inout, ReduceOp op, Stream stream = {}) = 0;
  virtual void broadcast(Tensor& inout, int root, Stream stream = {}) = 0;
  // Point to point: `send` goes to rank `to` while `recv` arrives from rank `from` (each
  // rank's `to` names a rank whose `from` names it, with equal sizes). Not collective: only
  // the pairs meet. A rank may be its own `to` and `from` (a copy).
  virtual void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream stream = {}) = 0;
  virtual void barrier() = 0;
  // Collective: a communicator over the ranks that pass the same `color`, ordered by `key`
  // (then by rank here): the groups of a device mesh (ranks sharing a tensor-parallel index,
  // ranks of one tensor-parallel group). Valid while this one lives. `max_ctas` > 0 caps the
  // thread blocks (and so the SMs) its collectives take on a GPU (NCCL's maxCTAs), for
  // collectives that run beside products planned for the other SMs; elsewhere ignored.
  virtual std::unique_ptr<Communicator> split(int color, int key, int max_ctas = 0) = 0;
  // An error the communicator found outside any call (NCCL's asynchronous errors: a peer or
  // the network gone), or empty. Safe from another thread while this one's calls run.
  virtual std::string async_error() const { return {}; }
};

// The collectives this process has issued, so that a rank that waits too long can say what
// it waits in (train/watchdog.h). The MPI and NCCL communicators note each call as it is
// issued, also those of one-rank groups: they are the progress a step of data parallelism
// without sharding shows before its last micro-batch. A GPU's collectives may still be queued
// behind the call.
struct CollectiveActivity {
  uint64_t issued = 0;      // since the process started
  std::string last;         // "all_reduce of 40 bytes over 2 ranks (nccl)"; empty before the first
  double seconds_ago = 0;   // since the last was issued
};
void note_collective(const char* op, int64_t bytes, int ranks, const char* backend);
CollectiveActivity collective_activity();

// The trivial communicator of a 1-rank run.
std::unique_ptr<Communicator> make_single_rank();

// Checks shared by implementations: contiguous, matching dtypes, out = W·in etc.
void check_all_gather(const Tensor& out, const Tensor& in, int world, const char* who);
void check_reduce_scatter(const Tensor& out, const Tensor& in, int world, const char* who);
void check_send_recv(const Tensor& send, int to, const Tensor& recv, int from, int world, const char* who);

}  // namespace shardtrain::dist
