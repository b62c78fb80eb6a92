// Causal grouped-query attention that never forms the T x T score matrix: tiles of keys are
// visited with an online softmax (FlashAttention's recurrence), keeping per-row log-sum-exp
// for the backward, which recomputes the probabilities tile by tile. Memory O(T).
// Query head n reads kv head n / (N / M); K/V are never replicated. The CUDA version is
// cuDNN's fused flash attention for bf16/f16, and plain exact kernels for f32 (check runs).
// S: key positions, S >= T; the forward takes S > T (a KV cache's keys), on the CPU and CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

// Documents packed one after another into the rows of a batch (fine-tuning examples, or a
// corpus's documents): with them, query t attends only to the keys of its own document, from
// its first token to t, as if each document were a sequence of its own (flash-attn's varlen
// attention; HF's packing without padding). Made by pack_documents.
struct PackedDocuments {
  Tensor positions_BT;  // i32 [B, T] on the tensors' device: each token's position in its document
  // The documents as segments of the B·T tokens taken row by row, for cuDNN's ragged layout
  // (CUDA only; undefined on the CPU), on the device:
  Tensor segment_starts_S1;  // i64 [S + 1]: b·T + t of each segment's first token, then B·T (also for unused ones)
  Tensor segment_lengths_S;  // i32 [S]: each segment's tokens; 0 for the unused ones
  int64_t count = 0;     // documents in the batch
  int64_t capacity = 0;  // S: count rounded up to a power of two, so that few distinct problem sizes occur
  // The sequence length cuDNN's problem is given: the longest document rounded up to a power of
  // two, at least 64 and at most T (cuDNN's grid covers S segments of this many tokens).
  int64_t longest = 0;
};

// positions_BT: i32 [B, T] on the host, each row 0, 1, 2, ... restarting at 0 where a document
// starts (checked: a row's first position is 0 and each next one is 0 or one more). For a
// CUDA `device` copies them and the segments there on `stream`; on the CPU shares them.
PackedDocuments pack_documents(const Tensor& positions_BT, Device device, Stream stream = {});

// i32 [B, T] positions (host) for rows of ids_BT (i32, host) whose documents each start with
// bos_id: the position counts from 0 at every BOS token and at each row's first token.
Tensor document_positions(const Tensor& ids_BT, int32_t bos_id);

// A block of keys that lies wholly before its queries, seen in spans: in row b the first
// queries[b] queries see every key from first_key[b] on, the other queries none (their output
// 0, their log-sum-exp -inf, their gradients 0). The blocks off the diagonal of context
// parallelism's ring under packed documents: only the document a chunk of queries starts in can
// reach back into an earlier chunk of keys, and its queries are the chunk's first ones. Made by
// key_spans.
struct KeySpans {
  std::vector<int64_t> queries;    // [B], 0 .. T
  std::vector<int64_t> first_key;  // [B], 0 .. S (S: no key)
  // On a CUDA device only (undefined on the CPU):
  Tensor positions_BT;  // i32 [B, T]: t minus the first key query t sees (S for none), the exact kernels' form
  Tensor lengths_2B;    // i32 [2, B]: each row's queries and keys seen (cuDNN's ragged lengths)
  Tensor starts_2B1;    // i64 [2, B + 1]: b·T and b·S + first_key[b], then B·T and B·S (cuDNN's ragged offsets)
};

// Spans for a [B, T] block of queries against S keys (checked: 0 <= queries[b] <= T, 0 <=
// first_key[b] <= S); on a CUDA `device` with their device form, copied on `stream`.
KeySpans key_spans(std::vector<int64_t> queries, std::vector<int64_t> first_key, int64_t T, int64_t S,
                   Device device, Stream stream = {});

struct AttentionOptions {
  bool causal = true;
  double scale = 0.0;          // softmax scale; 0 means 1 / sqrt(H)
  int64_t block_queries = 64;  // CPU tile sizes (any positive values give the same result
  int64_t block_keys = 64;     // up to rounding)
  bool deterministic = false;  // CUDA backward: a bitwise-reproducible (slower) algorithm
  // Not null: query t of row b sees keys t - positions[b, t] .. t only (needs causal, as many
  // keys as queries, and documents of q's batch shape on q's device). Not owned.
  const PackedDocuments* documents = nullptr;
  // > 0: sliding-window attention (Mistral, Qwen2's sliding layers): the query at position i
  // sees the `window` keys i - window < j <= i only, itself included (needs causal; with
  // documents, the keys of its own document among those). 0: every key the masks allow.
  // On CUDA: cuDNN's diagonal band (bf16/f16), the exact f32 kernels and the KV-cache kernel.
  int64_t window = 0;
  // > 0: the scaled scores soft-capped before the masks and the softmax,
  // s -> softcap · tanh(s / softcap) (Gemma 2's attn_logit_softcapping); the backward through
  // the cap. On CUDA: cuDNN's flash attention through a score modifier (bf16/f16; not with
  // packed documents of several per row, nor in FP8), the exact f32 kernels and the KV-cache kernel.
  double softcap = 0.0;
  // Not null: the keys are seen in spans (KeySpans), without the causal mask (causal must be
  // off), packed documents or a window; as many keys as queries. Not owned.
  const KeySpans* spans = nullptr;
};

// The (query, key) pairs a causal mask with a sliding window of `window` keys (0: none) lets
// through for T queries at the last T of S key positions: the sum over query positions p of
// min(p + 1, window).
inline double causal_attention_pairs(int64_t T, int64_t S, int64_t window) {
  // keys seen by the queries at positions 0 .. n - 1
  auto upto = [window](int64_t n) {
    const double nd = static_cast<double>(n);
    if (window <= 0 || n <= window) return nd * (nd + 1) / 2;
    const double w = static_cast<double>(window);
    return w * (w + 1) / 2 + (nd - w) * w;
  };
  return upto(S) - upto(S - T);
}

// Whether every tensor given is contiguous.
inline bool all_contiguous(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!t->is_contiguous()) return false;
  return true;
}

// For the kernels that read and write contiguous tensors only (the CPU's, and on CUDA the f32
// check kernels and the one-token case): runs fn(dq, dk, dv, q, k, v) on contiguous copies of
// strided q, k, v and on contiguous stand-ins for strided dq, dk, dv, copied back after.
template <typename Fn>
void attention_backward_on_contiguous(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k,
                                      const Tensor& v, Stream stream, Fn&& fn) {
  auto stand_in = [&](const Tensor& t) {
    return t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device(), "attention gradient", stream);
  };
  Tensor cdq = stand_in(dq), cdk = stand_in(dk), cdv = stand_in(dv);
  fn(cdq, cdk, cdv, contiguous(q, stream), contiguous(k, stream), contiguous(v, stream));
  for (auto [dst, src] : {std::pair<Tensor*, Tensor*>{&dq, &cdq}, {&dk, &cdk}, {&dv, &cdv}})
    if (dst->raw_data() != src->raw_data()) copy(*dst, *src, stream);
}

namespace cpu {
void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                       const Tensor& v_BTMH, const AttentionOptions& options);
void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                        const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                        const Tensor& out_BTNH, const Tensor& lse_BNT, const AttentionOptions& options);

void attention_forward_kv_cache(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& cache_k_BCMH, Tensor& cache_v_BCMH,
                                const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                                const Tensor& position_1, const AttentionOptions& options);
}  // namespace cpu

namespace cuda {
void attention_forward_kv_cache(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& cache_k_BCMH, Tensor& cache_v_BCMH,
                                const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                                const Tensor& position_1, const AttentionOptions& options, Stream stream);
void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                       const Tensor& v_BTMH, const AttentionOptions& options, Stream stream);
void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                        const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                        const Tensor& out_BTNH, const Tensor& lse_BNT, const AttentionOptions& options,
                        Stream stream);
}  // namespace cuda

// The forward's two products (q k^T and p v) over the scores that count: B·N·T·S·H
// multiply-adds each, half of them with a causal mask (torchtitan's convention), and with a
// sliding window those of the pairs inside it (causal_attention_pairs). S = keys.
inline double attention_forward_flops(const Tensor& q_BTNH, const Tensor& k_BTMH, const AttentionOptions& options) {
  if (q_BTNH.ndim() != 4 || k_BTMH.ndim() != 4) return 0;  // the op's own checks report it
  if (options.spans != nullptr) {  // each row's spanned queries against its keys from first_key on
    double pairs = 0;
    const KeySpans& s = *options.spans;
    for (size_t b = 0; b < s.queries.size() && b < s.first_key.size(); ++b)
      pairs += static_cast<double>(s.queries[b]) * static_cast<double>(std::max<int64_t>(0, k_BTMH.size(1) - s.first_key[b]));
    return 4.0 * static_cast<double>(q_BTNH.size(2) * q_BTNH.size(3)) * pairs;
  }
  const double d = 4.0 * static_cast<double>(q_BTNH.numel()) * static_cast<double>(k_BTMH.size(1));
  if (options.causal && options.window > 0) {
    const int64_t T = q_BTNH.size(1), S = k_BTMH.size(1);
    return d * causal_attention_pairs(T, S, options.window) / (static_cast<double>(T) * static_cast<double>(S));
  }
  return options.causal ? d / 2 : d;
}

// out_BTNH = softmax(scale · q k^T + causal mask) v (overwrites); lse_BNT (overwrites,
// stats_dtype(q)) = log-sum-exp of each query row's scaled scores. N % M == 0. q, k, v, out
// share one dtype (f32/f64 on the CPU; on CUDA bf16/f16 with head dim a multiple of 8 up to
// 256, or f32 with head dim up to 512 through slow exact kernels); softmax math in
// stats_dtype. No aliasing. k and v may be [B, S, M, H] with S > T keys: the T
// queries are the last T of S positions, so the causal mask lets query i see keys
// j <= i + S - T (incremental decoding over a KV cache; the bottom-right alignment of
// flash-attn). The visiting order of key tiles is the one a query at that position has in a
// full S-query call, so each query row comes out the same as there. On CUDA, S > T (and
// keys that are rows of a longer cache) take an exact kernel of its own (attention_cached.h),
// S == T cuDNN's flash attention.
inline void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                              const Tensor& v_BTMH, const AttentionOptions& options = {},
                              [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("attention_forward", out_BTNH.device(),
                                     {attention_forward_flops(q_BTNH, k_BTMH, options),
                                      profile::bytes_of({&out_BTNH, &lse_BNT, &q_BTNH, &k_BTMH, &v_BTMH})});
  if (q_BTNH.device().is_cpu()) return cpu::attention_forward(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::attention_forward(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options, stream);
#else
  no_kernel("attention_forward", q_BTNH);
#endif
}

// FP8 attention forward (training.fp8_attention): the two products of attention_forward in
// FP8 e4m3 with f32 accumulation, as cuDNN's FP8 flash attention does them on Hopper.
//   1. q, k and v are each quantised to e4m3 with one power-of-two scale per tensor from its
//      amax (ops/fp8.h's kTensor rule, bit for bit), and ROUNDED IN PLACE to those values:
//      afterwards they hold exactly what the products read (a power-of-two scale keeps every
//      e4m3 value exact in bf16), so the backward, given these q, k and v, differentiates the
//      attention the forward computed (the straight-through rule of the FP8 linears).
//   2. The probabilities are quantised with the fixed scale 256 (they lie in [0, 1]) and the
//      output with V's scale halved: |out| <= max |v| (a convex combination of v's rows), and
//      the half keeps the probabilities' rounding (at most 2^-4 of each) from overflowing.
//   3. out_BTNH (bf16) is that e4m3 output dequantised; lse_BNT (f32) the log-sum-exp cuDNN
//      forms from the rounded probabilities (within 2^-4 + T 2^-18 of the exact one).
// attention_backward given these out and lse is not the gradient of either attention: its
// probabilities, recomputed from lse without rounding, do not sum to one and do not make out, so
// the softmax gradient's rows no longer sum to zero, and dq and dk gain a share of the mean key
// and query (on real text at seq 2048, bf16 with this forward ended at 2.6 times bf16's
// held-out loss, and with FP8 linears diverged). attention_backward_fp8 is its backward.
// Takes bf16 q, k, v on CUDA with S == T keys, the causal mask (or none), no packed documents
// (an error otherwise), no sliding window, head dim a multiple of 16 up to 256 (the backward
// takes 128 only). The CPU twin is the oracle: the same rounding of q, k and v,
// exact attention over them, and the output rounded once to e4m3 at the same scale; cuDNN's
// output differs from it by the probabilities' rounding (bounded in the tests).
struct Fp8AttentionScales {
  float q = 0, k = 0, v = 0;  // dequantisation factors (powers of two)
  float out = 0;              // the output's dequantisation factor: 2 * v
};
namespace cpu {
Fp8AttentionScales attention_forward_fp8(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& q_BTNH, Tensor& k_BTMH,
                                         Tensor& v_BTMH, const AttentionOptions& options);
}  // namespace cpu
namespace cuda {
// scales_4, when not null: f32 [4] on the device receives {q, k, v, out} dequantisation factors.
void attention_forward_fp8(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& q_BTNH, Tensor& k_BTMH, Tensor& v_BTMH,
                           const AttentionOptions& options, Stream stream, Tensor* scales_4 = nullptr);
}  // namespace cuda
// FP8 attention backward: dq, dk, dv (bf16, overwrite, laid out as attention_backward's) from
// cuDNN's FP8 backward, which recomputes the probabilities from q, k and lse and rounds them as
// the forward did, so its gradients belong to the rounded forward (with the bf16 backward they
// do not: see above). q, k, v, out and lse must be attention_forward_fp8's (q, k, v rounded by
// it; out's codes come back exactly under v's output scale); dout is rounded to e4m3 under a
// scale from its amax, dP = dout v^T and the gradients are e4m3 too, under scales from
// history_4 (f32 [4] on the device, one per layer: the largest |dq|, |dk|, |dv| and |dP| of
// earlier calls, 0 before the first; this call updates it to max(its own, history / 2)) with
// two powers of two of headroom. With `seed` (a layer's first call) it runs twice: first under
// scales from bounds that hold for any input, which are coarse (dk's counts every query and
// loses most of dk to underflow) but give the history cuDNN's exact amaxes, then under the
// history's. Hopper takes head dim 128 only. The CPU twin is the exact backward (cpu::attention_backward) over the same rounded
// q, k, v; the CUDA gradients differ from it by the e4m3 rounding of P, dP, dout and the
// gradients (bounded in the tests).
namespace cuda {
void attention_backward_fp8(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                            const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                            const Tensor& lse_BNT, Tensor& history_4, bool seed, const AttentionOptions& options,
                            Stream stream);
}  // namespace cuda

inline void attention_backward_fp8(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                                   const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                                   const Tensor& out_BTNH, const Tensor& lse_BNT, [[maybe_unused]] Tensor& history_4,
                                   [[maybe_unused]] bool seed, const AttentionOptions& options = {},
                                   [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer(
      "attention_backward_fp8", dq_BTNH.device(),
      {2.5 * attention_forward_flops(q_BTNH, k_BTMH, options),
       profile::bytes_of({&dq_BTNH, &dk_BTMH, &dv_BTMH, &dout_BTNH, &q_BTNH, &k_BTMH, &v_BTMH, &out_BTNH, &lse_BNT})});
  if (q_BTNH.device().is_cpu())
    return cpu::attention_backward(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH, lse_BNT,
                                   options);
#ifdef SHARDTRAIN_WITH_CUDA
  cuda::attention_backward_fp8(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH, lse_BNT,
                               history_4, seed, options, stream);
#else
  no_kernel("attention_backward_fp8", q_BTNH);
#endif
}

// The probabilities' quantisation scale of the FP8 forward (a power of two: P in [0, 1] maps
// into e4m3's [0, 256]).
constexpr float kFp8AttentionProbScale = 256.0f;

inline void attention_forward_fp8(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& q_BTNH, Tensor& k_BTMH,
                                  Tensor& v_BTMH, const AttentionOptions& options = {},
                                  [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("attention_forward_fp8", out_BTNH.device(),
                                     {attention_forward_flops(q_BTNH, k_BTMH, options),
                                      profile::bytes_of({&out_BTNH, &lse_BNT, &q_BTNH, &k_BTMH, &v_BTMH})});
  if (q_BTNH.device().is_cpu()) {
    cpu::attention_forward_fp8(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options);
    return;
  }
#ifdef SHARDTRAIN_WITH_CUDA
  cuda::attention_forward_fp8(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options, stream);
#else
  no_kernel("attention_forward_fp8", q_BTNH);
#endif
}

// Incremental decoding with the position in memory (so that a CUDA graph can replay the step
// at every position): p = position_1[0] (i32, one element on the tensors' device) positions of
// the caches [B, C, M, H] (C the capacity) hold keys and values; k_BTMH and v_BTMH, the next T
// tokens' (after rope), are written into rows p .. p + T - 1 of cache_k_BCMH and cache_v_BCMH,
// and then out_BTNH and lse_BNT are attention_forward's for q over the cache's first p + T
// rows (causal: query t sees keys j <= p + t). Requires p + T <= C (the CPU checks it; on
// CUDA, where p is read by the kernels, the caller's KV cache checks its length on the host).
// Same dtypes and layouts as attention_forward; the caches' rows may be strided.
inline void attention_forward_kv_cache(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& cache_k_BCMH,
                                       Tensor& cache_v_BCMH, const Tensor& q_BTNH, const Tensor& k_BTMH,
                                       const Tensor& v_BTMH, const Tensor& position_1,
                                       const AttentionOptions& options = {}, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("attention_forward_kv_cache", out_BTNH.device(),
                                     {0, profile::bytes_of({&out_BTNH, &lse_BNT, &q_BTNH, &k_BTMH, &v_BTMH})});
  if (q_BTNH.device().is_cpu())
    return cpu::attention_forward_kv_cache(out_BTNH, lse_BNT, cache_k_BCMH, cache_v_BCMH, q_BTNH, k_BTMH, v_BTMH,
                                           position_1, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::attention_forward_kv_cache(out_BTNH, lse_BNT, cache_k_BCMH, cache_v_BCMH, q_BTNH, k_BTMH, v_BTMH,
                                          position_1, options, stream);
#else
  no_kernel("attention_forward_kv_cache", q_BTNH);
#endif
}

// dq_BTNH, dk_BTMH, dv_BTMH (all overwrite; dk/dv sum over the N/M query heads of a group)
// from dout_BTNH and the forward's q, k, v, out and lse. As many keys as queries (S == T).
inline void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                               const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                               const Tensor& out_BTNH, const Tensor& lse_BNT,
                               const AttentionOptions& options = {}, [[maybe_unused]] Stream stream = {}) {
  // five products against the forward's two
  profile::ScopedTimer profile_timer(
      "attention_backward", dq_BTNH.device(),
      {2.5 * attention_forward_flops(q_BTNH, k_BTMH, options),
       profile::bytes_of({&dq_BTNH, &dk_BTMH, &dv_BTMH, &dout_BTNH, &q_BTNH, &k_BTMH, &v_BTMH, &out_BTNH, &lse_BNT})});
  if (q_BTNH.device().is_cpu())
    return cpu::attention_backward(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH,
                                   lse_BNT, options);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::attention_backward(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH, lse_BNT,
                                  options, stream);
#else
  no_kernel("attention_backward", q_BTNH);
#endif
}

// Merges two attentions of the same queries over disjoint sets of keys into the attention over
// their union (ring attention's step, model/context_parallel.h): with l = log(e^lse + e^part_lse),
//   out = out · e^(lse − l) + part_out · e^(part_lse − l),   lse = l
// per query row and head; out_BTNH and lse_BNT are updated in place (accumulate), part_out_BTNH
// and part_lse_BNT are read. A row whose lse is −inf (no key yet) takes the part as it is. out
// and part_out share a dtype (f32/f64 on the CPU), the lse tensors stats_dtype of it; the
// math runs in f64 on the CPU. On CUDA out and part_out are each f32, bf16 or f16 (an f32
// accumulator may take bf16 parts), the lse tensors f32, the math f32. All contiguous; no
// aliasing.
namespace cpu {
void attention_merge(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& part_out_BTNH, const Tensor& part_lse_BNT);
}  // namespace cpu
namespace cuda {
void attention_merge(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& part_out_BTNH, const Tensor& part_lse_BNT,
                     Stream stream);
}  // namespace cuda
inline void attention_merge(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& part_out_BTNH,
                            const Tensor& part_lse_BNT, [[maybe_unused]] Stream stream = {}) {
  profile::ScopedTimer profile_timer("attention_merge", out_BTNH.device(),
                                     {0, profile::bytes_of({&out_BTNH, &lse_BNT, &part_out_BTNH, &part_lse_BNT})});
  if (out_BTNH.device().is_cpu()) return cpu::attention_merge(out_BTNH, lse_BNT, part_out_BTNH, part_lse_BNT);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::attention_merge(out_BTNH, lse_BNT, part_out_BTNH, part_lse_BNT, stream);
#else
  no_kernel("attention_merge", out_BTNH);
#endif
}

}  // namespace shardtrain::ops
