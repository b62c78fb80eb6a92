// Streams and events for overlapping work (FSDP's gathers and reductions beside the
// compute). No CUDA headers here: CPU-side modules built with the backend include this.
// The compute stream of the engine is Stream{} (the legacy default stream, or a capture's
// stream: core/device.h); streams made here are non-blocking, so they order against it only
// through events.
#pragma once

#include <functional>

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
  // record() for timing: also works inside a CUDA graph capture (the graph records it on
  // every replay).
  void record_timing(Stream stream);
  void make_wait(Stream waiter) const;
  bool done() const;          // the recorded work has finished (true if never recorded)
  void synchronize() const;   // the host waits for the recorded work
  // Milliseconds from `start` to this event; both recorded and finished.
  float elapsed_ms_since(const Event& start) const;

 private:
  void* handle_ = nullptr;
};

// True while `stream` (Stream{}: the current compute stream) is being captured into a graph.
bool is_capturing(Stream stream);

// A blocking stream (ordered against the legacy default stream like it, so eager work and
// a graph launched here follow each other in issue order), destroyed with the object.
class BlockingStream {
 public:
  BlockingStream();
  ~BlockingStream();
  BlockingStream(const BlockingStream&) = delete;
  BlockingStream& operator=(const BlockingStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_;
};

// The work queued on one stream between begin_capture and end_capture, as an executable
// CUDA graph that launch() replays. Capture mode is relaxed: the caching allocator may
// still reserve memory from the driver while capturing.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture(Stream stream);
  void end_capture();  // instantiates; throws naming the CUDA error if the capture broke
  // begin_capture, then `work` with `stream` as the thread's compute stream (what Stream{}
  // means, core/device.h), then end_capture; an error in `work` ends the capture and is rethrown.
  void capture(Stream stream, const std::function<void()>& work);
  void launch(Stream stream) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  Stream stream_;
  void* graph_ = nullptr;
  void* exec_ = nullptr;
};

// Page-locked host memory, freed with the object: copies between it and a GPU run
// asynchronously on a stream at the bus's full rate (the offloaded shards of
// fsdp/sharded_store.h live here). Its pages are first touched by several threads, then
// registered with the driver (cudaHostRegister): locking pages the process never touched
// faults each one in a single thread of the driver, which made a 405B-wide rank's 49 GiB take
// ~56 s. Allocation failures name `what` and the size.
class PinnedBuffer {
 public:
  PinnedBuffer(size_t bytes, const char* what);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // bytes_ rounded up to whole pages
};

}  // namespace shardtrain::cuda
