// CUDA streams and events behind the CUDA-free header core/cuda/stream.h.
#include "core/cuda/stream.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/host.h"
#include "core/cuda/cuda_check.h"
#include "core/error.h"

namespace shardtrain::cuda {
namespace {
cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(resolve(s).handle); }
}  // namespace

OwnedStream::OwnedStream() {
  cudaStream_t s = nullptr;
  ST_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_.handle = s;
}

OwnedStream::~OwnedStream() {
  if (stream_.handle != nullptr) cudaStreamDestroy(raw(stream_));
}

void OwnedStream::synchronize() const { ST_CUDA_CHECK(cudaStreamSynchronize(raw(stream_))); }

Event::Event() {
  cudaEvent_t e = nullptr;
  ST_CUDA_CHECK(cudaEventCreate(&e));
  handle_ = e;
}

Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::record(Stream stream) { ST_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), raw(stream))); }

void Event::record_timing(Stream stream) {
  // inside a capture a plain record only orders streams; an external record is a graph node
  // that records the event each time the graph runs, so elapsed times work on replays
  const unsigned flags = is_capturing(stream) ? cudaEventRecordExternal : cudaEventRecordDefault;
  ST_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(handle_), raw(stream), flags));
}

PinnedBuffer::PinnedBuffer(size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ST_CHECK(p != MAP_FAILED, "could not map ", format_bytes(static_cast<int64_t>(bytes)), " of host memory for ", what,
           ": ", std::strerror(errno));
  // every page faulted in by one of several threads, each a contiguous share
  const size_t pages = mapped_ / page;
  const size_t threads = std::max<size_t>(  // up to 16, each touching 16 MiB at least
      1, std::min<size_t>({static_cast<size_t>(affinity_cpus()), 16, pages / 4096}));
  {
    std::vector<std::jthread> touching;
    for (size_t t = 0; t < threads; ++t)
      touching.emplace_back([p, page, first = pages * t / threads, last = pages * (t + 1) / threads] {
        for (size_t i = first; i < last; ++i) static_cast<volatile char*>(p)[i * page] = 0;
      });
  }
  const cudaError_t e = cudaHostRegister(p, mapped_, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it
    ::munmap(p, mapped_);
    ST_THROW("could not page-lock ", format_bytes(static_cast<int64_t>(bytes)), " of host memory for ", what, ": ",
             cudaGetErrorString(e), " (the host's free memory or the locked-memory limit, `ulimit -l`)");
  }
  data_ = p;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ == nullptr) return;
  cudaHostUnregister(data_);
  ::munmap(data_, mapped_);
}

BlockingStream::BlockingStream() {
  cudaStream_t s = nullptr;
  ST_CUDA_CHECK(cudaStreamCreate(&s));
  stream_.handle = s;
}

BlockingStream::~BlockingStream() {
  if (stream_.handle != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
}

Graph::~Graph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::begin_capture(Stream stream) {
  ST_ASSERT(graph_ == nullptr && stream.handle != nullptr, "a graph is captured once, on a created stream");
  stream_ = stream;
  ST_CUDA_CHECK(cudaStreamBeginCapture(raw(stream), cudaStreamCaptureModeRelaxed));
}

void Graph::end_capture() {
  cudaGraph_t g = nullptr;
  ST_CUDA_CHECK(cudaStreamEndCapture(raw(stream_), &g));
  graph_ = g;
  cudaGraphExec_t e = nullptr;
  ST_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  exec_ = e;
}

void Graph::capture(Stream stream, const std::function<void()>& work) {
  struct CurrentStreamScope {  // restores the default compute stream however `work` ends
    explicit CurrentStreamScope(Stream s) { set_current_compute_stream(s.handle); }
    ~CurrentStreamScope() { set_current_compute_stream(nullptr); }
  } scope(stream);
  begin_capture(stream);
  try {
    work();
  } catch (...) {
    try {
      end_capture();
    } catch (...) {  // the capture's own error would hide the one that broke it
    }
    throw;
  }
  end_capture();
}

void Graph::launch(Stream stream) const {
  ST_ASSERT(exec_ != nullptr, "launch of a graph not captured");
  ST_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), raw(stream)));
}

bool is_capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ST_CUDA_CHECK(cudaStreamIsCapturing(raw(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

void Event::make_wait(Stream waiter) const {
  ST_CUDA_CHECK(cudaStreamWaitEvent(raw(waiter), static_cast<cudaEvent_t>(handle_), 0));
}

bool Event::done() const {
  const cudaError_t s = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (s == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  ST_CUDA_CHECK(s);
  return true;
}

void Event::synchronize() const { ST_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_))); }

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  ST_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(handle_)));
  return ms;
}

}  // namespace shardtrain::cuda
