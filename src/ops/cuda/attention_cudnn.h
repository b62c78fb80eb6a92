// The cuDNN graph behind ops::cuda::attention_forward / attention_backward, shared by the
// engine (attention.cpp) and bench/ops/attention_plans_bench.cu, which times every execution
// plan cuDNN offers for it. Needs the cudnn-frontend headers (SHARDTRAIN_CUDNN_FRONTEND).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <tuple>

#include <cudnn_frontend.h>

#include "core/dtype.h"

namespace shardtrain::ops::cuda::cudnn_attention {

// The graph's tensor ids: what a variant pack maps to device pointers.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  // packed documents (ragged segments): their lengths, and the element offsets of each
  // segment's first token in q (and dq), k (dk), v (dv), out (dout) and the statistics
  kSeqLenQ, kSeqLenKV, kOffsetQ, kOffsetK, kOffsetV, kOffsetO, kOffsetStats,
  // the FP8 forward: dequantisation factors of q, k, v, the output's quantisation factor, and
  // the amaxes cuDNN writes of the probabilities and the output
  kDescaleQ, kDescaleK, kDescaleV, kScaleO, kAmaxS, kAmaxO,
  // and the FP8 backward's: the descales of out, dout and dP, the factors of dP and the
  // gradients, and the amaxes cuDNN writes of the gradients and dP
  kDescaleO, kDescaleDO, kDescaleDP, kScaleDP, kScaleDQ, kScaleDK, kScaleDV, kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP,
  kScaleS, kDescaleS
};

// One attention problem: [B, T, N, H] queries, [B, T, M, H] keys and values; in memory each
// token's heads are contiguous and tokens lie pitch_* elements apart (N·H and M·H when
// contiguous; more for heads sliced from a stacked q|k|v tensor); the gradients dq, dk, dv
// lie as q, k, v do; out and dout are contiguous. With packed documents (segments > 0) cuDNN
// sees `segments` sequences of at most `segment_tokens` tokens at ragged offsets into the B·T tokens (a
// padding mask over their lengths, causal within each), and writes the statistics as
// [B·T, N] (token-major, the ragged layout cuDNN takes for them). A sliding window is cuDNN's
// diagonal band with `window` as its left bound: key j is seen by query i when j > i - window.
// With fp8 q, k, v, out (and dout, dq, dk, dv) are contiguous f8e4m3
// (ops::attention_forward_fp8, ops::attention_backward_fp8). With softcap > 0 the scaled scores
// are soft-capped, s -> softcap · tanh(s / softcap), before the causal mask and the window
// (Gemma 2): cuDNN takes no built-in mask beside a score modifier, so the graph's modifier
// applies the cap and then both masks itself, and the backward multiplies dS by the cap's
// derivative 1 - tanh^2(s / softcap).
struct Problem {
  bool backward;
  int64_t B, T, N, M, H;
  DType dtype;
  bool causal;
  double scale;
  bool deterministic;
  int64_t pitch_q = 0, pitch_k = 0, pitch_v = 0;
  int64_t segments = 0;  // packed documents: the segments' capacity (PackedDocuments::capacity); 0 none
  int64_t segment_tokens = 0;  // and the tokens each may hold (PackedDocuments::longest)
  int64_t window = 0;  // sliding window: each query sees its last `window` keys (0: every causal key)
  bool fp8 = false;
  double softcap = 0.0;  // > 0: the scaled scores soft-capped before the masks (0: none)
  auto tie() const {
    return std::tie(backward, B, T, N, M, H, dtype, causal, scale, deterministic, pitch_q, pitch_k, pitch_v,
                    segments, segment_tokens, window, fp8, softcap);
  }
  bool operator<(const Problem& o) const { return tie() < o.tie(); }
};

// Throws "<op>: cuDNN attention <stage> failed: <cuDNN's message>" when e is bad.
void check(cudnn_frontend::error_t e, const char* op, const char* stage);

// The problem's graph, validated and lowered to a cuDNN operation graph; no execution plan
// chosen yet. `implementation` picks the forward's cuDNN node (the backward has one).
std::shared_ptr<cudnn_frontend::graph::Graph> operation_graph(
    const Problem& p, cudnnHandle_t handle, const char* op,
    cudnn_frontend::AttentionImplementation_t implementation = cudnn_frontend::AttentionImplementation_t::AUTO);

}  // namespace shardtrain::ops::cuda::cudnn_attention
