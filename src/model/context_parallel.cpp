// Context parallelism's head-tail chunks and ring attention. Every block the ring computes is
// one chunk of queries against one chunk of keys (C x C), on contiguous chunk-major copies, so
// the same ops::attention_forward / attention_backward calls serve every pair.
#include "model/context_parallel.h"

#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <vector>

#include "ops/elementwise.h"

namespace shardtrain::model {
namespace {

// The chunk of the whole sequence that local chunk `i` (0 or 1) of rank `rank` holds.
int64_t global_chunk(int rank, int i, int degree) { return i == 0 ? rank : 2 * degree - 1 - rank; }

// One block of the ring: local query chunk qi against chunk kj of the key/value block owned by
// rank `owner`, causal on the diagonal.
struct RingBlock {
  int qi, kj;
  bool causal;
  int64_t gk;  // the key chunk in the whole sequence
};

// The blocks rank `rank` computes against the keys and values of rank `owner`: key chunks
// before the query chunk in full, the same chunk causally, later ones not at all.
std::vector<RingBlock> ring_blocks(int rank, int owner, int degree) {
  std::vector<RingBlock> blocks;
  for (int qi = 0; qi < 2; ++qi)
    for (int kj = 0; kj < 2; ++kj) {
      const int64_t gq = global_chunk(rank, qi, degree), gk = global_chunk(owner, kj, degree);
      if (gk <= gq) blocks.push_back({qi, kj, gk == gq, gk});
    }
  return blocks;
}

// What both ring passes take: causal attention without windows, over q and k of a rank's two
// chunks, packed documents (if any) as ContextDocuments of this rank.
void check_ring_inputs(const ops::AttentionOptions& o, const Tensor& q_BLNH, const Tensor& k_BLMH, const char* op,
                       const ContextDocuments* documents, const ContextParallel& cp) {
  ST_CHECK(q_BLNH.ndim() == 4 && k_BLMH.ndim() == 4 && q_BLNH.size(1) % 2 == 0, op,
           ": expected q [B, L, N, H] and k [B, L, M, H] of a rank's two chunks, found ", q_BLNH.str(), " and ",
           k_BLMH.str());
  ST_CHECK(o.causal, op, ": context parallelism computes causal attention only");
  ST_CHECK(o.window == 0, op, ": a sliding window (", o.window,
           " keys) is not supported with context parallelism; "
           "set parallel.context_parallel to 1 for a model with sliding-window layers");
  ST_CHECK(o.documents == nullptr, op,
           ": packed documents come to the ring as its ContextDocuments (context_documents), not as the "
           "attention options' documents");
  ST_CHECK(o.spans == nullptr, op, ": the ring makes its own key spans");
  if (documents == nullptr) return;
  ST_CHECK(documents->degree == cp.size() && documents->rank == cp.rank(), op, ": documents of rank ",
           documents->rank, " of ", documents->degree, " for rank ", cp.rank(), " of ", cp.size());
  ST_CHECK(documents->positions_BL.ndim() == 2 && documents->positions_BL.size(0) == q_BLNH.size(0) &&
               documents->positions_BL.size(1) == q_BLNH.size(1),
           op, ": documents of ", documents->positions_BL.str(), " for q ", q_BLNH.str());
}

// The options of one block: its causal mask, and with documents the diagonal's chunk documents
// or the spans off it; false when no query of the block sees a key.
bool block_options(ops::AttentionOptions& o, const RingBlock& blk, const ContextDocuments* documents) {
  o.causal = blk.causal;
  if (documents == nullptr) return true;
  if (blk.causal) {
    o.documents = &documents->chunks[static_cast<size_t>(blk.qi)];
    return true;
  }
  o.spans = documents->spans(blk.qi, blk.gk);
  return o.spans != nullptr;
}

// Local chunk i of x [B, L, ...] (tokens along dim `dim`), as a contiguous copy. A strided x
// (heads sliced from a stacked q|k|v) is made contiguous first: a chunk of it is not one
// uniform run of rows (copy's strided form).
Tensor chunk_of(const Tensor& x, int i, int64_t C, int dim = 1) {
  return contiguous(contiguous(x).slice(dim, i * C, (i + 1) * C));
}

// Writes the two chunks [B, C, ...] (tokens along dim `dim`) into x [B, 2C, ...] (x may be
// strided, as chunk_of's input).
void write_chunks(Tensor& x, const Tensor& chunk0, const Tensor& chunk1, int64_t C, int dim = 1) {
  Tensor whole = x.is_contiguous() ? x : Tensor::empty(x.shape(), x.dtype(), x.device(), "ring output");
  for (int i = 0; i < 2; ++i) {
    Tensor dst = whole.slice(dim, i * C, (i + 1) * C);
    copy(dst, i == 0 ? chunk0 : chunk1);
  }
  if (whole.raw_data() != x.raw_data()) copy(x, whole);
}

// Chunk-major packing of a rank's keys and values, [2 (k, v), 2 (chunk), B, C, M, H]: each
// chunk of each a contiguous block, and the whole one buffer that travels in one exchange.
Tensor pack_kv(const Tensor& k_BLMH, const Tensor& v_BLMH, int64_t C) {
  const int64_t B = k_BLMH.size(0), M = k_BLMH.size(2), H = k_BLMH.size(3);
  Tensor kv = Tensor::empty({2, 2, B, C, M, H}, k_BLMH.dtype(), k_BLMH.device(), "ring keys and values");
  for (int which = 0; which < 2; ++which)
    for (int i = 0; i < 2; ++i) {
      Tensor dst = kv.select(which).select(i);
      copy(dst, chunk_of(which == 0 ? k_BLMH : v_BLMH, i, C));
    }
  return kv;
}

// The dtype the ring adds up in: f32 for bf16 or f16 inputs (a GPU's), so that the merged
// output, dq and the travelling dk and dv round once, at the end; else the inputs' own.
DType accumulator_dtype(DType compute) { return compute == DType::kBF16 || compute == DType::kF16 ? DType::kF32 : compute; }

// x in `dtype`: itself when it is already, else a cast copy.
Tensor as_dtype(const Tensor& x, DType dtype, const char* name) {
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device(), name);
  ops::cast(out, x);
  return out;
}

// acc += part, acc in the accumulator dtype; a part in a narrower dtype is widened first
// into `widened` (its shape, the accumulator's dtype).
void accumulate(Tensor& acc, const Tensor& part, Tensor& widened) {
  if (part.dtype() == acc.dtype()) return ops::add(acc, acc, part);
  ops::cast(widened, part);
  ops::add(acc, acc, widened);
}

int ring_next(const ContextParallel& cp) { return (cp.rank() + 1) % cp.size(); }
int ring_prev(const ContextParallel& cp) { return (cp.rank() + cp.size() - 1) % cp.size(); }

}  // namespace

int64_t context_chunk_tokens(int64_t T, int degree) {
  ST_CHECK(degree >= 1, "context parallelism: expected a degree of 1 or more, found ", degree);
  ST_CHECK(T > 0 && T % (2 * degree) == 0, "context parallelism over ", degree, " ranks cuts a sequence into ",
           2 * degree, " chunks; a sequence of ", T,
           " tokens does not divide into them: make training.seq_len a "
           "multiple of 2 x parallel.context_parallel = ",
           2 * degree);
  return T / (2 * degree);
}

Tensor context_shard(const Tensor& x, int degree, int rank, int dim) {
  ST_CHECK(dim >= 0 && dim < x.ndim(), "context_shard: dimension ", dim, " of ", x.str());
  ST_CHECK(rank >= 0 && rank < degree, "context_shard: rank ", rank, " outside a context group of ", degree);
  const int64_t C = context_chunk_tokens(x.size(dim), degree);
  Shape shape = x.shape();
  shape[dim] = 2 * C;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device(), "context shard");
  const Tensor src = contiguous(x);
  for (int i = 0; i < 2; ++i) {
    const int64_t g = global_chunk(rank, i, degree);
    Tensor dst = out.slice(dim, i * C, (i + 1) * C);
    copy(dst, src.slice(dim, g * C, (g + 1) * C));
  }
  return out;
}

Tensor context_unshard(const std::vector<Tensor>& parts, int dim) {
  const int degree = static_cast<int>(parts.size());
  ST_CHECK(degree >= 1, "context_unshard: no parts");
  const Tensor& first = parts[0];
  ST_CHECK(dim >= 0 && dim < first.ndim() && first.size(dim) % 2 == 0, "context_unshard: dimension ", dim, " of ",
           first.str(), " is not a rank's two chunks");
  const int64_t C = first.size(dim) / 2;
  Shape shape = first.shape();
  shape[dim] = 2 * C * degree;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device(), "context unshard");
  for (int r = 0; r < degree; ++r) {
    ST_CHECK(parts[static_cast<size_t>(r)].shape() == first.shape(), "context_unshard: part ", r, " is ",
             parts[static_cast<size_t>(r)].str(), ", part 0 ", first.str());
    for (int i = 0; i < 2; ++i) {
      const int64_t g = global_chunk(r, i, degree);
      Tensor dst = out.slice(dim, g * C, (g + 1) * C);
      copy(dst, contiguous(parts[static_cast<size_t>(r)]).slice(dim, i * C, (i + 1) * C));
    }
  }
  return out;
}

Tensor context_positions(int64_t B, int64_t L, int degree, int rank) {
  ST_CHECK(L % 2 == 0, "context_positions: a rank's ", L, " tokens are not two chunks");
  const int64_t C = L / 2;
  Tensor pos = Tensor::empty({B, L}, DType::kI32, Device::cpu(), "context positions");
  int32_t* p = pos.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int i = 0; i < 2; ++i)
      for (int64_t t = 0; t < C; ++t)
        p[b * L + i * C + t] = static_cast<int32_t>(global_chunk(rank, i, degree) * C + t);
  return pos;
}

ContextDocuments context_documents(const Tensor& positions_BL, int degree, int rank, Device device) {
  const char* op = "context_documents";
  ST_CHECK(positions_BL.device().is_cpu() && positions_BL.dtype() == DType::kI32 && positions_BL.ndim() == 2 &&
               positions_BL.is_contiguous() && positions_BL.size(1) % 2 == 0,
           op, ": expected i32 [B, L] positions on the host, L a rank's two chunks, found ", positions_BL.str());
  ST_CHECK(rank >= 0 && rank < degree, op, ": rank ", rank, " outside a context group of ", degree);
  const int64_t B = positions_BL.size(0), L = positions_BL.size(1), C = L / 2;
  ContextDocuments d;
  d.degree = degree;
  d.rank = rank;
  d.chunk_tokens = C;
  const int32_t* pos = positions_BL.data<int32_t>();
  for (int i = 0; i < 2; ++i) {
    const size_t ci = static_cast<size_t>(i);
    const int64_t g0 = global_chunk(rank, i, degree) * C;  // the chunk's first token in the whole sequence
    Tensor cut = Tensor::empty({B, C}, DType::kI32, Device::cpu(), "chunk document positions");
    int32_t* c = cut.data<int32_t>();
    d.lead[ci].assign(static_cast<size_t>(B), C);
    d.start[ci].assign(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* p = pos + b * L + i * C;
      ST_CHECK(p[0] >= 0 && p[0] <= g0, op, ": row ", b, ": the token at ", g0,
               " of the sequence has position ", p[0], " in its document, which would start before the sequence");
      for (int64_t t = 0; t < C; ++t) {
        ST_CHECK(t == 0 || p[t] == 0 || p[t] == p[t - 1] + 1, op, ": row ", b, ": position ", p[t], " at token ",
                 g0 + t, " of the sequence neither starts a document (0) nor follows the one before it");
        if (t > 0 && p[t] == 0 && d.lead[ci][static_cast<size_t>(b)] == C) d.lead[ci][static_cast<size_t>(b)] = t;
        c[b * C + t] = std::min<int32_t>(p[t], static_cast<int32_t>(t));  // cut at the chunk's first token
      }
      d.start[ci][static_cast<size_t>(b)] = g0 - p[0];
    }
    d.chunks[ci] = ops::pack_documents(cut, device);
    // the spans against each earlier chunk: only the document the chunk starts in reaches back
    for (int64_t gk = 0; gk < global_chunk(rank, i, degree); ++gk) {
      std::vector<int64_t> queries(static_cast<size_t>(B), 0), first(static_cast<size_t>(B), C);
      bool any = false;
      for (size_t b = 0; b < static_cast<size_t>(B); ++b) {
        const int64_t k0 = d.start[ci][b] - gk * C;  // the document's first token, in the key chunk
        if (k0 >= C) continue;                      // it starts after the key chunk
        queries[b] = d.lead[ci][b];
        first[b] = std::max<int64_t>(0, k0);
        any = true;
      }
      d.key_spans[ci].push_back(any ? std::optional<ops::KeySpans>(ops::key_spans(std::move(queries),
                                                                                   std::move(first), C, C, device))
                                    : std::nullopt);
    }
  }
  if (device.is_cpu()) {
    d.positions_BL = positions_BL;
  } else {
    d.positions_BL = Tensor::empty(positions_BL.shape(), DType::kI32, device, "context document positions");
    copy(d.positions_BL, positions_BL);
  }
  return d;
}

const ops::KeySpans* ContextDocuments::spans(int qi, int64_t gk) const {
  const auto& by_key = key_spans[static_cast<size_t>(qi)];
  ST_ASSERT(gk >= 0 && gk < static_cast<int64_t>(by_key.size()), "key chunk ", gk, " is not before query chunk ",
            qi, "'s");
  const std::optional<ops::KeySpans>& s = by_key[static_cast<size_t>(gk)];
  return s ? &*s : nullptr;
}

void ring_attention_forward(Tensor& out_BLNH, Tensor& lse_BNL, const Tensor& q_BLNH, const Tensor& k_BLMH,
                            const Tensor& v_BLMH, const ops::AttentionOptions& options, ContextParallel& cp,
                            const ContextDocuments* documents) {
  const char* op = "ring_attention_forward";
  check_ring_inputs(options, q_BLNH, k_BLMH, op, documents, cp);
  const int G = cp.size(), r = cp.rank();
  const int64_t B = q_BLNH.size(0), C = q_BLNH.size(1) / 2, N = q_BLNH.size(2), H = q_BLNH.size(3);
  const DType stats = lse_BNL.dtype();
  // the merged output in f32 where the parts are bf16 or f16 (ops::attention_merge takes an f32
  // accumulator with narrower parts), rounded once at the end
  const DType acc = accumulator_dtype(q_BLNH.dtype());
  const std::array<Tensor, 2> q = {chunk_of(q_BLNH, 0, C), chunk_of(q_BLNH, 1, C)};
  // the running merged output and log-sum-exp of each query chunk (the first block's as it is)
  std::array<Tensor, 2> acc_out, acc_lse;
  Tensor kv = pack_kv(k_BLMH, v_BLMH, C);
  Tensor kv_next = G > 1 ? Tensor::empty(kv.shape(), kv.dtype(), kv.device(), "ring keys and values") : Tensor();
  for (int step = 0; step < G; ++step) {
    const int owner = (r - step + G) % G;
    // the block moves on to the next rank while this one attends to it
    if (step + 1 < G) cp.start_send_recv(kv, ring_next(cp), kv_next, ring_prev(cp));
    for (const RingBlock& blk : ring_blocks(r, owner, G)) {
      ops::AttentionOptions o = options;
      if (!block_options(o, blk, documents)) continue;
      Tensor part = Tensor::empty({B, C, N, H}, q_BLNH.dtype(), q_BLNH.device(), "ring attention part");
      Tensor part_lse = Tensor::empty({B, N, C}, stats, q_BLNH.device(), "ring attention part lse");
      ops::attention_forward(part, part_lse, q[static_cast<size_t>(blk.qi)], kv.select(0).select(blk.kj),
                             kv.select(1).select(blk.kj), o);
      const size_t i = static_cast<size_t>(blk.qi);
      if (!acc_out[i].defined()) {
        acc_out[i] = as_dtype(part, acc, "ring attention output");  // f32 from bf16 parts
        acc_lse[i] = std::move(part_lse);
      } else {
        ops::attention_merge(acc_out[i], acc_lse[i], part, part_lse);
      }
    }
    if (step + 1 < G) {
      cp.finish();
      std::swap(kv, kv_next);
    }
  }
  write_chunks(out_BLNH, as_dtype(acc_out[0], out_BLNH.dtype(), "ring attention output"),
               as_dtype(acc_out[1], out_BLNH.dtype(), "ring attention output"), C);
  write_chunks(lse_BNL, acc_lse[0], acc_lse[1], C, 2);
}

void ring_attention_backward(Tensor& dq_BLNH, Tensor& dk_BLMH, Tensor& dv_BLMH, const Tensor& dout_BLNH,
                             const Tensor& q_BLNH, const Tensor& k_BLMH, const Tensor& v_BLMH, const Tensor& out_BLNH,
                             const Tensor& lse_BNL, const ops::AttentionOptions& options, ContextParallel& cp,
                             const ContextDocuments* documents) {
  const char* op = "ring_attention_backward";
  check_ring_inputs(options, q_BLNH, k_BLMH, op, documents, cp);
  const int G = cp.size(), r = cp.rank();
  const int64_t C = q_BLNH.size(1) / 2;
  const Device dev = q_BLNH.device();
  // dq and the travelling dk and dv add up in f32 where the inputs are bf16 or f16 (each
  // block's parts widened before they are added), rounded once at the end
  const DType acc = accumulator_dtype(q_BLNH.dtype());
  std::array<Tensor, 2> q, dout, out, lse, dq;
  for (int i = 0; i < 2; ++i) {
    const size_t s = static_cast<size_t>(i);
    q[s] = chunk_of(q_BLNH, i, C);
    dout[s] = chunk_of(dout_BLNH, i, C);
    out[s] = chunk_of(out_BLNH, i, C);
    lse[s] = chunk_of(lse_BNL, i, C, 2);
    dq[s] = Tensor::empty(q[s].shape(), acc, dev, "ring dq");
    ops::fill(dq[s], 0.0);
  }
  Tensor kv = pack_kv(k_BLMH, v_BLMH, C);
  Tensor kv_next = G > 1 ? Tensor::empty(kv.shape(), kv.dtype(), dev, "ring keys and values") : Tensor();
  // The gradient of a key block, [2 (dk, dv), 2 (chunk), B, C, M, H], gathers every rank's
  // share as it travels one step behind the block itself. At step s this rank adds its share
  // of the block in hand into `mine` while the gradient of the same block, holding the shares
  // of the ranks it has passed, arrives from the previous rank into `arrived`, and the sum of
  // the last step (`total`) leaves for the next; once they are here, total = arrived + mine.
  const auto dkv_buffer = [&] { return Tensor::empty(kv.shape(), acc, dev, "ring dk and dv"); };
  Tensor mine = dkv_buffer();
  Tensor total = G > 1 ? dkv_buffer() : Tensor();
  Tensor arrived = G > 1 ? dkv_buffer() : Tensor();
  const Shape kv_chunk = kv.select(0).select(0).shape();
  Tensor dq_part = Tensor::empty(q[0].shape(), q_BLNH.dtype(), dev, "ring dq part");
  Tensor dk_part = Tensor::empty(kv_chunk, kv.dtype(), dev, "ring dk part");
  Tensor dv_part = Tensor::empty(kv_chunk, kv.dtype(), dev, "ring dv part");
  // the parts widened to the accumulators' dtype (bf16 or f16 inputs only)
  const bool widen = acc != q_BLNH.dtype();
  Tensor dq_wide = widen ? Tensor::empty(q[0].shape(), acc, dev, "ring dq part (f32)") : Tensor();
  Tensor dk_wide = widen ? Tensor::empty(kv_chunk, acc, dev, "ring dk part (f32)") : Tensor();
  Tensor dv_wide = widen ? Tensor::empty(kv_chunk, acc, dev, "ring dv part (f32)") : Tensor();
  for (int step = 0; step < G; ++step) {
    const int owner = (r - step + G) % G;
    // the block moves on to the next rank, and the gradient of the last one after it, while
    // this rank attends to the block in hand
    const bool kv_moves = step + 1 < G, dkv_moves = step > 0;
    if (kv_moves) cp.start_send_recv(kv, ring_next(cp), kv_next, ring_prev(cp));
    if (dkv_moves) cp.start_send_recv(total, ring_next(cp), arrived, ring_prev(cp));
    ops::fill(mine, 0.0);
    for (const RingBlock& blk : ring_blocks(r, owner, G)) {
      ops::AttentionOptions o = options;
      if (!block_options(o, blk, documents)) continue;
      const size_t i = static_cast<size_t>(blk.qi);
      ops::attention_backward(dq_part, dk_part, dv_part, dout[i], q[i], kv.select(0).select(blk.kj),
                              kv.select(1).select(blk.kj), out[i], lse[i], o);
      Tensor dk = mine.select(0).select(blk.kj), dv = mine.select(1).select(blk.kj);
      accumulate(dq[i], dq_part, dq_wide);
      accumulate(dk, dk_part, dk_wide);
      accumulate(dv, dv_part, dv_wide);
    }
    if (kv_moves || dkv_moves) cp.finish();
    if (kv_moves) std::swap(kv, kv_next);
    // this rank's share is in; at the first step (its own block) it is all the block has yet
    if (dkv_moves) {
      ops::add(total, arrived, mine);
    } else {
      std::swap(total, mine);
    }
  }
  // the last block's gradient, now complete, goes home while this rank's own arrives
  Tensor dkv = total;
  if (G > 1) {
    cp.send_recv(total, ring_next(cp), arrived, ring_prev(cp));
    dkv = arrived;
  }
  auto narrow = [](const Tensor& x, const Tensor& like) { return as_dtype(x, like.dtype(), "ring gradient"); };
  write_chunks(dq_BLNH, narrow(dq[0], dq_BLNH), narrow(dq[1], dq_BLNH), C);
  write_chunks(dk_BLMH, narrow(dkv.select(0).select(0), dk_BLMH), narrow(dkv.select(0).select(1), dk_BLMH), C);
  write_chunks(dv_BLMH, narrow(dkv.select(1).select(0), dv_BLMH), narrow(dkv.select(1).select(1), dv_BLMH), C);
}

}  // namespace shardtrain::model
