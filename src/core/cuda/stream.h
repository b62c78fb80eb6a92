// Streams and events for overlapping work (FSDP's gathers and reductions beside the
// compute). No CUDA headers here: CPU-side modules built with the backend include this.
// The compute stream of the engine is the legacy default stream (Stream{}); streams made
// here are non-blocking, so they order against it only through events.
#pragma once

#include "core/device.h"

namespace shardtrain::cuda {

// A non-blocking stream on the current device, destroyed with the object.
class OwnedStream {
 public:
  OwnedStream();
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }
  void synchronize() const;

 private:
  Stream stream_;
};

// A CUDA event (timing enabled). record() marks the point reached by a stream's queued
// work; make_wait() makes another stream wait for the most recent record.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }

  void record(Stream stream);
  void make_wait(Stream waiter) const;
  bool done() const;          // the recorded work has finished (true if never recorded)
  void synchronize() const;   // the host waits for the recorded work
  // Milliseconds from `start` to this event; both recorded and finished.
  float elapsed_ms_since(const Event& start) const;

 private:
  void* handle_ = nullptr;
};

}  // namespace shardtrain::cuda
