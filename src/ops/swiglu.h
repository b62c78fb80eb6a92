// SwiGLU gate of the Llama MLP: h = silu(gate) * up, silu(g) = g * sigmoid(g); or GeGLU (Gemma's
// MLP): h = gelu_tanh(gate) * up, the tanh approximation of GELU (transformers' "gelu_pytorch_tanh"),
// gelu_tanh(g) = g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) / 2.
#pragma once

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

// The gate's activation.
enum class GluActivation { kSilu, kGeluTanh };

namespace cpu {
void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_h_1 = {},
                    GluActivation act = GluActivation::kSilu);
void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF, const Tensor& amax_grads_1 = {}, GluActivation act = GluActivation::kSilu);
}  // namespace cpu

namespace cuda {
void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_h_1,
                    GluActivation act, Stream stream);
void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF, const Tensor& amax_grads_1, GluActivation act, Stream stream);
}  // namespace cuda

// h_TF = act(gate_TF) * up_TF (overwrites), act silu or gelu_tanh (`act`). One dtype (f32/f64 on the CPU). No aliasing.
// amax_h_1, when defined (i32 [1] on h's device, read as u32): the largest |h| written, as the
// bits of its f32 value (ops/fp8.h's amax), is max-ed into it (accumulates: it must start at a
// lower bound, such as 0): a tensorwise FP8 product of h then needs no pass of its own for it.
// Every [T, F] argument here and below may have its rows a pitch apart (gate and up as the
// halves of one stacked [T, 2F] product); on CUDA strided rows must be 16-byte aligned.
inline void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_h_1 = {},
                           GluActivation act = GluActivation::kSilu, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("swiglu_forward", h_TF.device(),
                                     {0, profile::bytes_of({&h_TF, &gate_TF, &up_TF})});
  if (h_TF.device().is_cpu()) return cpu::swiglu_forward(h_TF, gate_TF, up_TF, amax_h_1, act);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::swiglu_forward(h_TF, gate_TF, up_TF, amax_h_1, act, stream);
#else
  no_kernel("swiglu_forward", h_TF);
#endif
}

// dgate_TF, dup_TF (overwrite) from dh_TF and the forward's inputs. h_TF, when defined, is
// overwritten with the forward's h = act(gate) * up, bitwise what swiglu_forward writes:
// checkpointing that drops h recomputes it here, in the pass that reads gate and up anyway.
// dgate/dup may alias gate/up respectively (each element is read before it is written).
// amax_grads_1, when defined: the largest |dgate| and |dup| written, as swiglu_forward's amax_h_1
// (the gate|up product's output gradient, quantised next).
inline void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF,
                            const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_grads_1 = {},
                            GluActivation act = GluActivation::kSilu, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("swiglu_backward", dgate_TF.device(),
                                     {0, profile::bytes_of({&dgate_TF, &dup_TF, &h_TF, &dh_TF, &gate_TF, &up_TF})});
  if (dh_TF.device().is_cpu())
    return cpu::swiglu_backward(dgate_TF, dup_TF, h_TF, dh_TF, gate_TF, up_TF, amax_grads_1, act);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::swiglu_backward(dgate_TF, dup_TF, h_TF, dh_TF, gate_TF, up_TF, amax_grads_1, act, stream);
#else
  no_kernel("swiglu_backward", dh_TF);
#endif
}

}  // namespace shardtrain::ops
