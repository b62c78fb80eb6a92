// Context parallelism: one sequence of T tokens split over the `size` ranks of a context group.
// The sequence is cut into 2·size chunks of C = T / (2·size) tokens; rank r holds chunks r and
// 2·size − 1 − r (head-tail, so every rank has the same causal work) as its local L = 2C
// tokens, in that order. Attention is the only op that talks across the group: a ring that
// passes the key/value blocks around and merges the partial results by their log-sum-exp
// (Liu et al., Ring Attention; torchtitan's context parallelism). The model names only this
// interface; fsdp/ makes one from a communicator (fsdp/context_parallel.h).
// Letters: L = 2C, a rank's local tokens; C, a chunk's tokens.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "ops/attention.h"

namespace shardtrain::model {

// The group's exchanges, on the compute stream.
class ContextParallel {
 public:
  virtual ~ContextParallel() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // `send` to rank `to` while `recv` arrives from rank `from` (contiguous, equal sizes; each
  // rank's `to` names a rank whose `from` names it).
  virtual void send_recv(const Tensor& send, int to, Tensor& recv, int from) = 0;
  // send_recv started beside the compute stream: later work runs while it moves, until
  // finish() makes the compute stream wait for it. Several may be started before one finish()
  // (the backward's keys and values and the gradient travelling behind them): they move one
  // after another in the order started, which must be the same on every rank of the group, and
  // finish() waits for all of them. Until finish(), each one's `send` is left alone (not
  // written, not freed) and its `recv` neither read, written nor freed. Where nothing runs
  // beside (the CPU) each completes before returning.
  virtual void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) { send_recv(send, to, recv, from); }
  virtual void finish() {}
};

// Tokens per chunk, C = T / (2·degree); throws, naming the lengths, unless 2·degree divides T.
int64_t context_chunk_tokens(int64_t T, int degree);

// Rank `rank`'s local tokens of x (any dtype, on the host or a device): along dimension `dim`
// (the tokens, of length T), chunks rank and 2·degree − 1 − rank, in that order: length 2C
// there, the other dimensions as x's. A new contiguous tensor. For ids, targets [B, T] (dim 1),
// per-token tensors [B, T, ...] (dim 1) and [B, N, T] log-sum-exps (dim 2).
Tensor context_shard(const Tensor& x, int degree, int rank, int dim = 1);
// The inverse: the whole tensor from every rank's local part (parts[r] is rank r's, as
// context_shard gives it).
Tensor context_unshard(const std::vector<Tensor>& parts, int dim = 1);

// The true positions (in the whole sequence of T = degree·L tokens) of rank `rank`'s local
// tokens: i32 [B, L] on the host, each row r·C .. r·C + C − 1 then (2·degree − 1 − r)·C ..
// (2·degree − r)·C − 1. Rope reads them (ops::rope_forward's positions).
Tensor context_positions(int64_t B, int64_t L, int degree, int rank);

// Packed documents under context parallelism: what the ring needs of a rank's local tokens'
// positions in their documents. A document may span chunks and ranks. Query t (at position g
// in the whole sequence, its document's token p) sees the keys g - p .. g. On the diagonal
// (a local chunk against itself) that is a chunk's own packed documents, the one it starts in
// cut at its first token; off it (a chunk against an earlier one) only the document the query
// chunk starts in can reach back, so the block is ops::KeySpans: its first `lead` queries see
// the keys from that document's first token on.
struct ContextDocuments {
  Tensor positions_BL;                          // i32 [B, L] on the device: rope's positions
  std::array<ops::PackedDocuments, 2> chunks;   // each local chunk's documents, on the device
  std::array<std::vector<int64_t>, 2> lead;     // [chunk][b]: its first tokens in the document it starts in
  std::array<std::vector<int64_t>, 2> start;    // [chunk][b]: that document's first token in the whole sequence
  int degree = 1, rank = 0;
  int64_t chunk_tokens = 0;  // C
  // [chunk][gk]: the key spans of local chunk `chunk` against chunk gk of the whole sequence, for
  // every gk before the chunk's own, made once on the device (every layer and both passes read
  // them); nullopt where no query sees any of gk's keys.
  std::array<std::vector<std::optional<ops::KeySpans>>, 2> key_spans;
  // key_spans[qi][gk], or null when no query sees a key (gk must lie before qi's chunk).
  const ops::KeySpans* spans(int qi, int64_t gk) const;
};

// From positions_BL (i32 [B, L] on the host: this rank's local tokens of the whole sequence's
// document positions, context_shard of ops::document_positions), for `rank` of a group of
// `degree`; checked: each chunk's positions step as documents' do, and none claims a start
// before the sequence's.
ContextDocuments context_documents(const Tensor& positions_BL, int degree, int rank, Device device);

// Ring attention over the group, causal over the whole sequence: out_BLNH (overwrites) and
// lse_BNL (overwrites, stats_dtype) are, for this rank's local queries, what
// ops::attention_forward gives over the whole sequence, at those queries' rows. q_BLNH,
// k_BLMH, v_BLMH are this rank's local tokens (true-position rope already applied; may be
// strided head slices). Every rank of the group calls it together with the same shapes.
// Only the M key/value heads travel: size − 1 steps, each passing k and v one rank on while
// this rank attends to the block it holds. Per pair of a local query chunk i and a key chunk
// j: full attention when j < i, causal when j == i, nothing when j > i; the partial results
// merge by their log-sum-exp (ops::attention_merge), in f32 or above: with bf16 or f16 inputs
// (a GPU's) the merged output is an f32 accumulator, rounded once into out_BLNH. options: causal (must
// be), scale and deterministic are used; no sliding window and no options.documents (an error):
// packed documents come as `documents` (context_documents of this rank's tokens).
void ring_attention_forward(Tensor& out_BLNH, Tensor& lse_BNL, const Tensor& q_BLNH, const Tensor& k_BLMH,
                            const Tensor& v_BLMH, const ops::AttentionOptions& options, ContextParallel& cp,
                            const ContextDocuments* documents = nullptr);

// Its backward: dq_BLNH, dk_BLMH, dv_BLMH (overwrite) from dout_BLNH and the forward's inputs
// and merged out and lse. Each block's gradients come from ops::attention_backward given the
// merged out and lse (so its probabilities are the block's share of the whole softmax); dq
// adds up here, while dk and dv of a key block travel around the ring with it, gathering every
// rank's share, and arrive back at their owner after `size` steps. With bf16 or f16 inputs dq
// and the travelling dk and dv add up in f32 (twice the bytes on the wire), rounded once at the
// end; f32 and f64 inputs add up in their own dtype. Every exchange runs beside the attention
// of a block: the keys and values of the next step, and the gradient gathered so far, which
// arrives while this rank computes its own share of the block into an accumulator of its own
// and is added to it once there (three key/value-sized accumulators; one exchange, bringing
// each block's gradient home, follows the last step).
void ring_attention_backward(Tensor& dq_BLNH, Tensor& dk_BLMH, Tensor& dv_BLMH, const Tensor& dout_BLNH,
                             const Tensor& q_BLNH, const Tensor& k_BLMH, const Tensor& v_BLMH, const Tensor& out_BLNH,
                             const Tensor& lse_BNL, const ops::AttentionOptions& options, ContextParallel& cp,
                             const ContextDocuments* documents = nullptr);

}  // namespace shardtrain::model
