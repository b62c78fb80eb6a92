// Without CUDA there is nothing to map: every group keeps its communicator's exchanges
// (dist/cuda/peer_exchange.cpp has the copy-engine one).
#include "dist/peer_exchange.h"

namespace shardtrain::dist {

#ifndef SHARDTRAIN_WITH_CUDA
std::unique_ptr<PeerExchange> make_peer_exchange(Communicator*) { return nullptr; }
#endif

}  // namespace shardtrain::dist
