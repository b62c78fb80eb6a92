// The copy-engine exchange (dist/peer_exchange.h). Rank r's inbox is one allocation of the
// caching allocator, exported by CUDA IPC as the cudaMalloc block it lies in plus its offset:
// a slot of `capacity_` bytes per rank (slot p receives p's messages), then the signal words:
//   arrived[p]   messages rank p has copied into slot p (rank p writes it),
//   taken[p]     messages of rank r that p has copied out of its own inbox (rank p writes it),
//   staging[2]   values this rank writes before copying them into another rank's words.
// A message k from r to `to`: wait for taken[to] >= k - 1 in r's words (slot r of `to`'s inbox
// is free), copy the data into it, then k into `to`'s arrived[r]. Receiving message j from
// `from`: wait for arrived[from] >= j, copy slot `from` out, then j into `from`'s taken[r].
// Words are only ever awaited where they live and written by a copy that follows the data's
// copy on the same stream, so a word never runs ahead of the bytes it announces.
#include "dist/peer_exchange.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/host.h"
#include "core/log.h"

namespace shardtrain::dist {
namespace {

// The driver's stream memory operations, found through the runtime (cudaGetDriverEntryPoint-
// ByVersion) so that nothing links the driver library: a CUDA build still starts without one.
struct StreamMemoryOperations {
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuMemGetAddressRange_v3020 range = nullptr;  // an allocation's base: what CUDA IPC exports
};
const StreamMemoryOperations& driver() {
  static const StreamMemoryOperations ops = [] {
    // the entry point `name` of driver API version `version`, or null
    auto find = [](const char* name, unsigned version) -> void* {
      void* f = nullptr;
      cudaDriverEntryPointQueryResult found{};
      const bool ok = cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &found) == cudaSuccess &&
                      found == cudaDriverEntryPointSuccess;
      cudaGetLastError();
      return ok ? f : nullptr;
    };
    StreamMemoryOperations o;
    o.wait = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(find("cuStreamWaitValue32", 11070));
    o.write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(find("cuStreamWriteValue32", 11070));
    o.range = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(find("cuMemGetAddressRange", 3020));
    return o;
  }();
  return ops;
}

#define ST_CU_CHECK(expr)                                                                              \
  do {                                                                                                 \
    const CUresult st_cu_status_ = (expr);                                                             \
    if (st_cu_status_ != CUDA_SUCCESS)                                                                 \
      ST_THROW("CUDA driver error ", static_cast<int>(st_cu_status_), " in `", #expr, "` at ", __FILE__, \
               ":", __LINE__);                                                                         \
  } while (0)

cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(resolve(s).handle); }
CUstream cu(Stream s) { return static_cast<CUstream>(resolve(s).handle); }
CUdeviceptr address(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

constexpr size_t kSlotAlignment = size_t{2} << 20;

// Every rank's `mine` (same size on all), in rank order.
std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine) {
  const int64_t n = static_cast<int64_t>(mine.size()), w = comm.world_size();
  Tensor in = Tensor::empty({n}, DType::kU8, Device::cpu(), "peer exchange setup");
  Tensor all = Tensor::empty({n * w}, DType::kU8, Device::cpu(), "peer exchange setup");
  std::memcpy(in.raw_data(), mine.data(), mine.size());
  comm.all_gather(all, in);
  std::vector<std::string> parts;
  for (int64_t p = 0; p < w; ++p) parts.emplace_back(static_cast<const char*>(all.raw_data()) + p * n, n);
  return parts;
}

// Whether every rank said yes (a sum over the group).
bool all_agree(Communicator& comm, bool mine) {
  Tensor flag = Tensor::empty({1}, DType::kF32, Device::cpu(), "peer exchange vote");
  flag.data<float>()[0] = mine ? 0.0f : 1.0f;
  comm.all_reduce(flag, ReduceOp::kSum);
  return flag.data<float>()[0] == 0.0f;
}

// What a rank tells the others at set-up: its host and its GPU's PCI bus id.
struct Identity {
  char host[128] = {};
  char bus[32] = {};
};

class CopyEngineExchange final : public PeerExchange {
 public:
  explicit CopyEngineExchange(Communicator* comm)
      : comm_(comm), rank_(comm->rank()), size_(comm->world_size()), sent_(size_, 0), received_(size_, 0) {}
  ~CopyEngineExchange() override { release(); }

  void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream stream) override {
    check_send_recv(send, to, recv, from, size_, "copy-engine send_recv");
    ST_CHECK(send.device().is_cuda() && recv.device().is_cuda(), "copy-engine send_recv: ", send.str(), " and ",
             recv.str(), " must be device memory");
    const size_t bytes = send.nbytes();
    const cudaStream_t s = raw(stream);
    if (to == rank_) {
      ST_ASSERT(from == rank_, "send_recv: a rank that sends to itself receives from itself");
      ST_CUDA_CHECK(cudaMemcpyAsync(recv.raw_data(), send.raw_data(), bytes, cudaMemcpyDeviceToDevice, s));
      return;
    }
    if (bytes > capacity_) grow(bytes);
    // send: slot rank_ of `to`'s inbox, once `to` has taken the last message out of it
    const uint32_t k = ++sent_[to];
    ST_CU_CHECK(driver().wait(cu(stream), address(word(inbox_, kTaken, to)), k - 1, CU_STREAM_WAIT_VALUE_GEQ));
    ST_CUDA_CHECK(cudaMemcpyAsync(slot(peers_[to], rank_), send.raw_data(), bytes, cudaMemcpyDeviceToDevice, s));
    signal(word(peers_[to], kArrived, rank_), 0, k, stream);
    // receive: slot `from` of this inbox, then tell `from` it may write it again
    const uint32_t j = ++received_[from];
    ST_CU_CHECK(
        driver().wait(cu(stream), address(word(inbox_, kArrived, from)), j, CU_STREAM_WAIT_VALUE_GEQ));
    ST_CUDA_CHECK(cudaMemcpyAsync(recv.raw_data(), slot(inbox_, from), bytes, cudaMemcpyDeviceToDevice, s));
    signal(word(peers_[from], kTaken, rank_), 1, j, stream);
  }

 private:
  enum Words { kArrived = 0, kTaken = 1, kStaging = 2 };

  char* slot(char* inbox, int p) const { return inbox + static_cast<size_t>(p) * capacity_; }
  uint32_t* word(char* inbox, Words which, int p) const {
    return reinterpret_cast<uint32_t*>(inbox + static_cast<size_t>(size_) * capacity_) + which * size_ + p;
  }
  size_t words_bytes() const { return (2 * static_cast<size_t>(size_) + 2) * sizeof(uint32_t); }

  // `value` into another rank's word: written into this rank's staging word, then copied,
  // both after the stream's earlier work (the data the value announces).
  void signal(uint32_t* remote, int staging, uint32_t value, Stream stream) {
    uint32_t* local = word(inbox_, kStaging, 0) + staging;
    ST_CU_CHECK(driver().write(cu(stream), address(local), value, CU_STREAM_WRITE_VALUE_DEFAULT));
    ST_CUDA_CHECK(cudaMemcpyAsync(remote, local, sizeof(uint32_t), cudaMemcpyDeviceToDevice, raw(stream)));
  }

  // Collective: every rank's inbox replaced by one with slots of at least `bytes`, the counters
  // back at zero. Nothing may be in flight into any inbox: each device is synchronised and the
  // group meets before any inbox is freed.
  void grow(size_t bytes) {
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    comm_->barrier();
    release();
    capacity_ = (bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    const size_t total = static_cast<size_t>(size_) * capacity_ + words_bytes();
    int device = 0;
    ST_CUDA_CHECK(cudaGetDevice(&device));
    // from the caching allocator, so that memory figures count it; CUDA IPC exports the whole
    // cudaMalloc block it lies in, and the others add its offset there
    inbox_memory_ = Tensor::empty({static_cast<int64_t>(total)}, DType::kU8, Device::cuda(device),
                                  "tensor-parallel inboxes (copy engines)");
    inbox_ = static_cast<char*>(inbox_memory_.raw_data());
    ST_CUDA_CHECK(cudaMemset(word(inbox_, kArrived, 0), 0, words_bytes()));
    CUdeviceptr base = 0;
    size_t range = 0;
    ST_CU_CHECK(driver().range(&base, &range, address(inbox_)));
    Shared mine;
    ST_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, reinterpret_cast<void*>(static_cast<uintptr_t>(base))));
    mine.offset = static_cast<uint64_t>(address(inbox_) - base);
    const std::vector<std::string> all =
        all_gather_bytes(*comm_, std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
    peers_.assign(size_, nullptr);
    mapped_.assign(size_, nullptr);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        peers_[q] = inbox_;
        continue;
      }
      Shared theirs;
      std::memcpy(&theirs, all[q].data(), sizeof theirs);
      ST_CUDA_CHECK(cudaIpcOpenMemHandle(&mapped_[q], theirs.handle, cudaIpcMemLazyEnablePeerAccess));
      peers_[q] = static_cast<char*>(mapped_[q]) + theirs.offset;
    }
    std::fill(sent_.begin(), sent_.end(), 0u);
    std::fill(received_.begin(), received_.end(), 0u);
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    comm_->barrier();  // every inbox's words are zero before anyone writes into them
    log::debug(detail::concat("tensor-parallel exchange: rank ", rank_, " of ", size_, ", copy-engine inboxes of ",
                              size_, " x ", capacity_ >> 20, " MiB"));
  }

  void release() {
    for (void* p : mapped_)
      if (p != nullptr) cudaIpcCloseMemHandle(p);
    mapped_.clear();
    peers_.clear();
    inbox_memory_ = Tensor();
    inbox_ = nullptr;
    capacity_ = 0;
  }

  // What a rank shares of its inbox: the IPC handle of the block it lies in, and where.
  struct Shared {
    cudaIpcMemHandle_t handle;
    uint64_t offset = 0;
  };

  Communicator* comm_;
  int rank_, size_;
  std::vector<uint32_t> sent_, received_;  // messages sent to / received from each rank
  size_t capacity_ = 0;
  Tensor inbox_memory_;
  char* inbox_ = nullptr;          // inbox_memory_'s bytes
  std::vector<char*> peers_;       // each rank's inbox as mapped here (this rank's: inbox_)
  std::vector<void*> mapped_;      // the blocks opened from the other ranks' handles
};

// Whether this process can run the exchange at all: stream memory operations work here.
bool stream_memory_operations_work() {
  if (driver().wait == nullptr || driver().write == nullptr || driver().range == nullptr) return false;
  void* p = nullptr;
  if (cudaMalloc(&p, sizeof(uint32_t)) != cudaSuccess) return false;
  cudaStream_t s = nullptr;
  bool ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess;
  ok = ok && driver().write(static_cast<CUstream>(s), address(p), 7, CU_STREAM_WRITE_VALUE_DEFAULT) ==
                 CUDA_SUCCESS;
  ok = ok && driver().wait(static_cast<CUstream>(s), address(p), 7, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
  ok = ok && cudaStreamSynchronize(s) == cudaSuccess;
  if (s != nullptr) cudaStreamDestroy(s);
  cudaFree(p);
  cudaGetLastError();  // a failed probe leaves no error behind
  return ok;
}

}  // namespace

std::unique_ptr<PeerExchange> make_peer_exchange(Communicator* comm) {
  if (comm->name() != "nccl" || comm->world_size() < 2) return nullptr;
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  Identity me;
  std::strncpy(me.host, host_name().c_str(), sizeof me.host - 1);
  ST_CUDA_CHECK(cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, device));
  const std::vector<std::string> all =
      all_gather_bytes(*comm, std::string(reinterpret_cast<const char*>(&me), sizeof me));
  // every peer on this host, its GPU visible here and reachable by peer access
  bool ok = stream_memory_operations_work();
  std::string why = ok ? "" : "stream memory operations fail";
  for (int q = 0; q < comm->world_size() && ok; ++q) {
    Identity them;
    std::memcpy(&them, all[q].data(), sizeof them);
    if (std::strncmp(them.host, me.host, sizeof me.host) != 0) {
      ok = false, why = detail::concat("rank ", q, " runs on ", them.host);
      continue;
    }
    int theirs = -1;
    if (cudaDeviceGetByPCIBusId(&theirs, them.bus) != cudaSuccess) {
      ok = false, why = detail::concat("rank ", q, "'s GPU ", them.bus, " is not visible here");
    } else if (theirs != device) {
      int can = 0;
      ST_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, theirs));
      if (!can) ok = false, why = detail::concat("no peer access to rank ", q, "'s GPU ", them.bus);
    }
  }
  cudaGetLastError();
  if (!all_agree(*comm, ok)) {
    log::debug(detail::concat("tensor-parallel exchange through NCCL", why.empty() ? "" : ": ", why));
    return nullptr;
  }
  return std::make_unique<CopyEngineExchange>(comm);
}

}  // namespace shardtrain::dist
