// The MPI communicator. Reductions run in the tensor's own dtype; Avg divides once after
// the sum, in f64 for floating types.
#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>
#include <mutex>

namespace shardtrain::dist {
namespace {

#define ST_MPI_CHECK(expr)                                                                         \
  do {                                                                                             \
    const int st_mpi_status_ = (expr);                                                             \
    if (st_mpi_status_ != MPI_SUCCESS) {                                                           \
      char st_mpi_msg_[MPI_MAX_ERROR_STRING];                                                      \
      int st_mpi_len_ = 0;                                                                         \
      MPI_Error_string(st_mpi_status_, st_mpi_msg_, &st_mpi_len_);                                 \
      int st_mpi_rank_ = -1;                                                                       \
      MPI_Comm_rank(MPI_COMM_WORLD, &st_mpi_rank_);                                                \
      ST_THROW("MPI error in `", #expr, "` at ", __FILE__, ":", __LINE__, " on rank ", st_mpi_rank_, ": ", \
               std::string(st_mpi_msg_, static_cast<size_t>(st_mpi_len_)));                        \
    }                                                                                              \
  } while (0)

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      ST_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
  });
}

MPI_Datatype mpi_type(DType t, const char* who) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    default: ST_THROW(who, ": MPI reductions support f32, f64, i32 and i64, found ", dtype_name(t));
  }
}

void divide(Tensor& t, int world) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: {
      float* p = t.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<double>(p[i]) / world);
      return;
    }
    case DType::kF64: {
      double* p = t.data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] /= world;
      return;
    }
    default: ST_THROW("average of ", dtype_name(t.dtype()), " tensors is not supported; use Sum");
  }
}

class MpiWorld final : public Communicator {
 public:
  static constexpr int kSendRecvTag = 17;
  // MPI_COMM_WORLD, or a communicator split from it (owned, freed with this object).
  explicit MpiWorld(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    ensure_initialized();
    ST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    ST_MPI_CHECK(MPI_Comm_size(comm_, &world_));
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
  }
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "mpi"; }

  void all_gather(Tensor& out, const Tensor& in, Stream) override {
    check_all_gather(out, in, world_, "mpi all_gather");
    host_only(out, "all_gather");
    const int bytes = checked_count(in.nbytes(), "all_gather");
    const char* slot = static_cast<const char*>(out.raw_data()) + static_cast<size_t>(rank_) * in.nbytes();
    const void* send = in.raw_data() == slot ? MPI_IN_PLACE : in.raw_data();
    note_collective("all_gather", static_cast<int64_t>(out.nbytes()), world_, "mpi");
    ST_MPI_CHECK(MPI_Allgather(send, bytes, MPI_BYTE, out.raw_data(), bytes, MPI_BYTE, comm_));
  }

  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, Stream) override {
    check_reduce_scatter(out, in, world_, "mpi reduce_scatter");
    host_only(out, "reduce_scatter");
    const int n = checked_count(static_cast<size_t>(out.numel()), "reduce_scatter");
    note_collective("reduce_scatter", static_cast<int64_t>(in.nbytes()), world_, "mpi");
    ST_MPI_CHECK(MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), n, mpi_type(in.dtype(), "reduce_scatter"),
                                          MPI_SUM, comm_));
    if (op == ReduceOp::kAvg) divide(out, world_);
  }

  void all_reduce(Tensor& inout, ReduceOp op, Stream) override {
    check_contiguous(inout, "mpi all_reduce", "inout");
    host_only(inout, "all_reduce");
    const int n = checked_count(static_cast<size_t>(inout.numel()), "all_reduce");
    note_collective("all_reduce", static_cast<int64_t>(inout.nbytes()), world_, "mpi");
    ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, inout.raw_data(), n, mpi_type(inout.dtype(), "all_reduce"), MPI_SUM,
                               comm_));
    if (op == ReduceOp::kAvg) divide(inout, world_);
  }

  void broadcast(Tensor& inout, int root, Stream) override {
    check_contiguous(inout, "mpi broadcast", "inout");
    host_only(inout, "broadcast");
    ST_CHECK(root >= 0 && root < world_, "broadcast: root ", root, " out of range for ", world_, " ranks");
    const int bytes = checked_count(inout.nbytes(), "broadcast");
    note_collective("broadcast", static_cast<int64_t>(inout.nbytes()), world_, "mpi");
    ST_MPI_CHECK(MPI_Bcast(inout.raw_data(), bytes, MPI_BYTE, root, comm_));
  }

  void send_recv(const Tensor& send, int to, Tensor& recv, int from, Stream) override {
    check_send_recv(send, to, recv, from, world_, "mpi send_recv");
    host_only(send, "send_recv");
    host_only(recv, "send_recv");
    const int bytes = checked_count(send.nbytes(), "send_recv");
    note_collective("send_recv", static_cast<int64_t>(send.nbytes()), world_, "mpi");
    ST_MPI_CHECK(MPI_Sendrecv(send.raw_data(), bytes, MPI_BYTE, to, kSendRecvTag, recv.raw_data(), bytes, MPI_BYTE,
                              from, kSendRecvTag, comm_, MPI_STATUS_IGNORE));
  }

  void barrier() override {
    note_collective("barrier", 0, world_, "mpi");
    ST_MPI_CHECK(MPI_Barrier(comm_));
  }

  std::unique_ptr<Communicator> split(int color, int key, int /*max_ctas: no thread blocks here*/) override {
    ST_CHECK(color >= 0, "mpi split: color must be >= 0, found ", color);
    note_collective("split", 0, world_, "mpi");
    MPI_Comm part = MPI_COMM_NULL;
    ST_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
    MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN);
    return std::make_unique<MpiWorld>(part);
  }

 private:
  static void host_only(const Tensor& t, const char* who) {
    ST_CHECK(t.device().is_cpu(), "mpi ", who, ": ", t.str(),
             " is device memory; this MPI is not CUDA-aware (use the NCCL communicator)");
  }
  static int checked_count(size_t n, const char* who) {
    ST_CHECK(n <= static_cast<size_t>(INT32_MAX), "mpi ", who, ": ", n,
             " elements exceed MPI's 32-bit count; split the buffer");
    return static_cast<int>(n);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int world_ = 1;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

std::unique_ptr<Communicator> make_mpi_world() { return std::make_unique<MpiWorld>(); }

}  // namespace shardtrain::dist
