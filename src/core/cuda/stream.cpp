// CUDA streams and events behind the CUDA-free header core/cuda/stream.h.
#include "core/cuda/stream.h"

#include "core/cuda/cuda_check.h"

namespace shardtrain::cuda {
namespace {
cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(s.handle); }
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
