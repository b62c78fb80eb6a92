// Point-to-point exchanges between the GPUs of one host through their copy engines, for a
// tensor-parallel group whose exchanges run beside products that hold every SM: NCCL's
// kernels wait for SMs there, a copy engine does not. Each rank exports an inbox (CUDA IPC)
// that the others copy into; counters in device memory, written and awaited by stream memory
// operations, order the copies. No kernel takes part.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace shardtrain::dist {

class PeerExchange {
 public:
  virtual ~PeerExchange() = default;
  // Communicator::send_recv of device tensors on `stream`. Every rank of the group calls it
  // with the same sizes in the same order: a message larger than the inboxes hold grows
  // every rank's inbox, collectively (the device is synchronised then).
  virtual void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream stream) = 0;
};

// Collective over `comm` (device tensors: the NCCL communicator of one group). Null unless
// every rank of `comm` runs on this host and can map every other rank's GPU memory with
// peer access (and this build has CUDA): the caller then keeps `comm`'s own send_recv.
std::unique_ptr<PeerExchange> make_peer_exchange(Communicator* comm);

}  // namespace shardtrain::dist
