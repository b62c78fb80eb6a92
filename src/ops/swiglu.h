// SwiGLU gate of the Llama MLP: h = silu(gate) * up, silu(g) = g * sigmoid(g).
#pragma once

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

namespace cpu {
void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF);
void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF);
}  // namespace cpu

// h_TF = silu(gate_TF) * up_TF (overwrites). One dtype (f32/f64 on the CPU). No aliasing.
inline void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, Stream = {}) {
  if (h_TF.device().is_cpu()) return cpu::swiglu_forward(h_TF, gate_TF, up_TF);
  no_kernel("swiglu_forward", h_TF);
}

// dgate_TF, dup_TF (overwrite) from dh_TF and the forward's inputs. dgate/dup may alias
// gate/up respectively (each element is read before it is written).
inline void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                            const Tensor& up_TF, Stream = {}) {
  if (dh_TF.device().is_cpu()) return cpu::swiglu_backward(dgate_TF, dup_TF, dh_TF, gate_TF, up_TF);
  no_kernel("swiglu_backward", dh_TF);
}

}  // namespace shardtrain::ops
