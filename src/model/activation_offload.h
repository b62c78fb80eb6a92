// Activation offload (training.offload_activations): what each block keeps between its
// forward and its backward (with full checkpointing: only its input) moves to page-locked
// host memory after the block's forward and comes back one block ahead of its backward.
//
// The copies run on a stream of their own beside the compute. A block's copy down starts
// once its forward is queued; the compute stream waits for it one block later, before the
// block's device memory can be reused. In the backward, block l-1's copy up starts as block
// l's backward begins, and the compute stream waits for it only before block l-1's. The last
// two blocks stay on the GPU: their backward comes first, and a round trip would gain
// nothing. Nothing polls and nothing waits on the host, so a CUDA graph can capture a step
// that offloads.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/block.h"

namespace shardtrain::model {

class ActivationOffload {
 public:
  static constexpr int64_t kResidentBlocks = 2;  // the last blocks, never offloaded

  explicit ActivationOffload(Device device);  // a GPU (throws otherwise, and without the CUDA backend)
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // After block l's forward (and release_for), of n_blocks: queues the copy of what acts
  // keeps down to host memory and points acts at it; drops acts.y_BTD (the next block's
  // input, kept there). The device memory of block l-1's copy is handed back here.
  void after_forward(int64_t l, int64_t n_blocks, BlockActivations& acts);
  // After the last block's forward: the compute stream has waited for every copy down.
  void finish_forward();
  // Before block l's backward: the compute stream waits for block l's copy up; block l-1's
  // copy up is queued (so two blocks' activations are on the GPU at a time: the last two at
  // the loss, then the one in its backward and the next).
  void before_backward(int64_t l, std::vector<BlockActivations>& acts);

  // Offload only blocks [0, n) (0: every block but the last two). The first blocks' inputs
  // wait longest for their backward; a limit caps the host memory the offload takes.
  void set_max_blocks(int64_t n);

  // Page-locked host bytes held for the offloaded blocks (grows to the largest step seen).
  int64_t host_bytes() const;
  // Bytes copied down in the last forward (the same come back up in its backward).
  int64_t bytes_offloaded() const;
  // Seconds the compute stream stood waiting for these copies since the last call (event
  // pairs around each wait; none inside a CUDA graph capture, whose replays are not timed).
  // Synchronises with the recorded events.
  double take_wait_seconds();

 private:
  void prefetch(int64_t l, BlockActivations& acts);
  struct State;
  std::unique_ptr<State> s_;
  Device device_;
  int64_t max_blocks_ = 0;
};

}  // namespace shardtrain::model
