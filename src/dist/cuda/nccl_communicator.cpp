// The NCCL communicator. Sum and Avg map to ncclSum and ncclAvg (the average is NCCL's own
// single division). Every collective runs on the communicator's own stream, joined to the
// caller's stream by events before and after: collectives issued from several streams (the
// store's gathers and reductions) then execute in issue order, the same on every rank, and
// never contend for the communicator. Host tensors are staged through device memory.
#include "dist/nccl_communicator.h"

#include <cstdlib>
#include <cstring>

#include "core/cuda/cuda_check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/log.h"
#include "dist/bootstrap.h"
#ifdef SHARDTRAIN_WITH_MPI
#include "dist/mpi_communicator.h"
#endif

#ifdef SHARDTRAIN_WITH_NCCL
#include <nccl.h>

#define ST_NCCL_CHECK(expr)                                                                                      \
  do {                                                                                                           \
    const ncclResult_t st_nccl_status_ = (expr);                                                                 \
    if (st_nccl_status_ != ncclSuccess)                                                                          \
      ST_THROW("NCCL error in `", #expr, "` at ", __FILE__, ":", __LINE__, ": ", ncclGetErrorString(st_nccl_status_), \
               " (", ncclGetLastError(nullptr), ")");                                                            \
  } while (0)
#endif

namespace shardtrain::dist {

#ifdef SHARDTRAIN_WITH_NCCL
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
    case DType::kF8E4M3: return ncclFloat8e4m3;
    case DType::kF8E5M2: return ncclFloat8e5m2;
  }
  ST_THROW("nccl: unsupported dtype ", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(resolve(s).handle); }

class NcclWorld final : public Communicator {
 public:
  NcclWorld(int rank, int world, const ncclUniqueId& id, int device) : rank_(rank), world_(world), device_(device) {
    ST_NCCL_CHECK(ncclCommInitRank(&comm_, world, id, rank));
  }
  // A communicator made by ncclCommSplit (owned from here on).
  NcclWorld(ncclComm_t comm, int device) : device_(device), comm_(comm) {
    ST_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    ST_NCCL_CHECK(ncclCommCount(comm_, &world_));
  }
  ~NcclWorld() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }
  std::string async_error() const override {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return {};
    if (state == ncclSuccess || state == ncclInProgress) return {};
    return detail::concat("NCCL: ", ncclGetErrorString(state), " (", ncclGetLastError(comm_), ")");
  }

  void all_gather(Tensor& out, const Tensor& in, Stream stream) override {
    check_all_gather(out, in, world_, "nccl all_gather");
    note_collective("all_gather", static_cast<int64_t>(out.nbytes()), world_, "nccl");
    if (out.device().is_cpu() && in.device().is_cpu()) {
      // host bytes (set-up exchanges): through device memory, like staged()
      const Stream own = comm_stream_.get();
      Tensor d_in = Tensor::empty(in.shape(), in.dtype(), Device::cuda(device_), "nccl staging", own);
      Tensor d_out = Tensor::empty(out.shape(), out.dtype(), Device::cuda(device_), "nccl staging", own);
      ST_CUDA_CHECK(cudaMemcpyAsync(d_in.raw_data(), in.raw_data(), in.nbytes(), cudaMemcpyHostToDevice, raw(own)));
      ST_NCCL_CHECK(ncclAllGather(d_in.raw_data(), d_out.raw_data(), static_cast<size_t>(in.numel()),
                                  nccl_type(in.dtype()), comm_, raw(own)));
      ST_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), d_out.raw_data(), out.nbytes(), cudaMemcpyDeviceToHost, raw(own)));
      comm_stream_.synchronize();
      return;
    }
    on_device(out, "all_gather");
    on_device(in, "all_gather");
    ordered(stream, [&](cudaStream_t s) {
      ST_NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()),
                                  nccl_type(in.dtype()), comm_, s));
    });
  }

  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, Stream stream) override {
    check_reduce_scatter(out, in, world_, "nccl reduce_scatter");
    on_device(out, "reduce_scatter");
    on_device(in, "reduce_scatter");
    note_collective("reduce_scatter", static_cast<int64_t>(in.nbytes()), world_, "nccl");
    ordered(stream, [&](cudaStream_t s) {
      ST_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                                      nccl_type(in.dtype()), nccl_op(op), comm_, s));
    });
  }

  void all_reduce(Tensor& inout, ReduceOp op, Stream stream) override {
    check_contiguous(inout, "nccl all_reduce", "inout");
    note_collective("all_reduce", static_cast<int64_t>(inout.nbytes()), world_, "nccl");
    staged(inout, stream, [&](void* p, cudaStream_t s) {
      ST_NCCL_CHECK(ncclAllReduce(p, p, static_cast<size_t>(inout.numel()), nccl_type(inout.dtype()), nccl_op(op),
                                  comm_, s));
    });
  }

  void broadcast(Tensor& inout, int root, Stream stream) override {
    check_contiguous(inout, "nccl broadcast", "inout");
    ST_CHECK(root >= 0 && root < world_, "broadcast: root ", root, " out of range for ", world_, " ranks");
    note_collective("broadcast", static_cast<int64_t>(inout.nbytes()), world_, "nccl");
    staged(inout, stream, [&](void* p, cudaStream_t s) {
      ST_NCCL_CHECK(ncclBroadcast(p, p, static_cast<size_t>(inout.numel()), nccl_type(inout.dtype()), root, comm_, s));
    });
  }

  void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream stream) override {
    check_send_recv(send, to, recv, from, world_, "nccl send_recv");
    on_device(send, "send_recv");
    on_device(recv, "send_recv");
    note_collective("send_recv", static_cast<int64_t>(send.nbytes()), world_, "nccl");
    ordered(stream, [&](cudaStream_t s) {
      const size_t n = static_cast<size_t>(send.numel());
      ST_NCCL_CHECK(ncclGroupStart());
      ST_NCCL_CHECK(ncclSend(send.raw_data(), n, nccl_type(send.dtype()), to, comm_, s));
      ST_NCCL_CHECK(ncclRecv(recv.raw_data(), n, nccl_type(recv.dtype()), from, comm_, s));
      ST_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    Tensor one = Tensor::empty({1}, DType::kF32, Device::cpu(), "barrier");
    one.data<float>()[0] = 1;
    all_reduce(one, ReduceOp::kSum, {});
  }

  std::unique_ptr<Communicator> split(int color, int key, int max_ctas) override {
    ST_CHECK(color >= 0, "nccl split: color must be >= 0, found ", color);
    note_collective("split", 0, world_, "nccl");
    ST_CHECK(max_ctas >= 0, "nccl split: max_ctas must be >= 0, found ", max_ctas);
    ncclComm_t part = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (max_ctas > 0) config.maxCTAs = config.minCTAs = max_ctas;
    ST_NCCL_CHECK(ncclCommSplit(comm_, color, key, &part, max_ctas > 0 ? &config : nullptr));
    ST_CHECK(part != nullptr, "nccl split: rank ", rank_, " got no communicator for color ", color);
    return std::make_unique<NcclWorld>(part, device_);
  }

 private:
  static void on_device(const Tensor& t, const char* who) {
    ST_CHECK(t.device().is_cuda(), "nccl ", who, ": ", t.str(), " is host memory; NCCL moves device memory");
  }

  // Runs `issue(comm stream)` after the work queued on `stream`, and makes `stream` wait for it.
  template <typename F>
  void ordered(Stream stream, F&& issue) {
    const Stream own = comm_stream_.get();
    before_.record(stream);
    before_.make_wait(own);
    issue(raw(own));
    after_.record(own);
    after_.make_wait(stream);
  }

  // Device tensors: ordered after `stream`. Host tensors: copied to the device, reduced and
  // copied back before returning.
  template <typename F>
  void staged(Tensor& t, Stream stream, F&& run) {
    if (t.device().is_cuda()) {
      ordered(stream, [&](cudaStream_t s) { run(t.raw_data(), s); });
      return;
    }
    const Stream own = comm_stream_.get();
    Tensor d = Tensor::empty(t.shape(), t.dtype(), Device::cuda(device_), "nccl staging", own);
    ST_CUDA_CHECK(cudaMemcpyAsync(d.raw_data(), t.raw_data(), t.nbytes(), cudaMemcpyHostToDevice, raw(own)));
    run(d.raw_data(), raw(own));
    ST_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), d.raw_data(), t.nbytes(), cudaMemcpyDeviceToHost, raw(own)));
    comm_stream_.synchronize();
  }

  int rank_ = 0, world_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cuda::OwnedStream comm_stream_;
  cuda::Event before_, after_;
};

// Rank, world size and local rank from MPI or the environment; the unique id shared.
struct Bootstrapped {
  int rank = 0, world = 1, local_rank = 0;
  ncclUniqueId id{};
};

Bootstrapped bootstrap(double timeout_s) {
  Bootstrapped b;
#ifdef SHARDTRAIN_WITH_MPI
  if (launched_by_mpi()) {
    auto mpi = make_mpi_world();
    b.rank = mpi->rank();
    b.world = mpi->world_size();
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
      if (const char* s = std::getenv(v)) {
        b.local_rank = std::atoi(s);
        break;
      }
    Tensor id = Tensor::empty({static_cast<int64_t>(sizeof(ncclUniqueId))}, DType::kU8, Device::cpu(), "nccl id");
    if (b.rank == 0) {
      ST_NCCL_CHECK(ncclGetUniqueId(&b.id));
      std::memcpy(id.raw_data(), &b.id, sizeof b.id);
    }
    mpi->broadcast(id, 0);
    std::memcpy(&b.id, id.raw_data(), sizeof b.id);
    return b;
  }
#endif
  const std::optional<LaunchEnv> env = launch_from_env();
  ST_CHECK(env.has_value(), "several GPUs: launch with mpirun/srun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
           "and MASTER_PORT (torchrun-style)");
  b.rank = env->rank;
  b.world = env->world_size;
  b.local_rank = env->local_rank;
  std::string payload;
  if (b.rank == 0) {
    ST_NCCL_CHECK(ncclGetUniqueId(&b.id));
    payload.assign(reinterpret_cast<const char*>(&b.id), sizeof b.id);
  }
  payload = share_from_rank0(*env, payload, timeout_s);
  ST_CHECK(payload.size() == sizeof b.id, "bootstrap: received ", payload.size(), " bytes, expected an NCCL id of ",
           sizeof b.id);
  std::memcpy(&b.id, payload.data(), sizeof b.id);
  return b;
}

}  // namespace

std::string nccl_version() {
  int v = 0;
  ST_NCCL_CHECK(ncclGetVersion(&v));
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<Communicator> make_nccl_world(double timeout_s, int* gpu_index) {
  const int gpus = cuda::device_count();
  ST_CHECK(gpus > 0, "NCCL communicator: no CUDA device is visible");
  const Bootstrapped b = bootstrap(timeout_s);
  const int index = b.local_rank % gpus;
  cuda::init_device(index);
  if (gpu_index != nullptr) *gpu_index = index;
  log::debug(detail::concat("rank ", b.rank, " of ", b.world, ": cuda:", index, ", joining the NCCL communicator"));
  return std::make_unique<NcclWorld>(b.rank, b.world, b.id, index);
}

#else

std::string nccl_version() { return "no NCCL (one GPU at most)"; }

std::unique_ptr<Communicator> make_nccl_world(double, int*) {
  ST_THROW("this build has no NCCL (libnccl was not found when it was configured); several GPUs need it");
}

#endif

}  // namespace shardtrain::dist
