// CUDA attention through cuDNN's fused flash attention (graph API, via the header-only
// cudnn-frontend). Our [B, T, N, H] tensors are given to cuDNN as [B, N, T, H] with
// strides, so nothing is transposed or copied; K/V keep their M heads (cuDNN groups the
// query heads itself). The forward also writes the f32 softmax statistics (the log-sum-exp
// of each scaled score row) that the backward reads. One graph is built per problem and
// device, with its execution plan chosen by cuDNN's heuristics, and cached. f32 tensors,
// which cuDNN's flash kernels do not take, go to plain exact kernels (attention_f32.cu).
#include "ops/cuda/attention_cudnn.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/cuda/cuda_check.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/cuda/attention_cached.h"
#include "ops/cuda/attention_documents.h"
#include "ops/cuda/attention_f32.h"
#include "ops/cuda/attention_fp8.h"
#include "ops/cuda/attention_single.h"

namespace shardtrain::ops::cuda {

namespace cudnn_attention {
namespace {

namespace fe = cudnn_frontend;

fe::DataType_t fe_type(DType t, const char* op) {
  switch (t) {
    case DType::kBF16: return fe::DataType_t::BFLOAT16;
    case DType::kF16: return fe::DataType_t::HALF;
    default:
      ST_THROW(op, ": CUDA attention runs on bf16 or f16 tensors (cuDNN flash attention) or f32 (exact check "
               "kernels), found ", dtype_name(t), "; cast q, k and v first");
  }
}

// [B, T, heads, H] memory, tokens `pitch` elements apart, seen as [B, heads, T, H].
std::shared_ptr<fe::graph::Tensor_attributes> bthd(fe::graph::Graph& g, const char* name, Uid uid, int64_t B,
                                                   int64_t T, int64_t heads, int64_t H, int64_t pitch) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, heads, T, H})
                      .set_stride({T * pitch, H, pitch, 1}));
}

void set_bthd(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, int64_t B, int64_t T, int64_t heads,
              int64_t H, int64_t pitch) {
  t->set_output(true).set_uid(uid).set_dim({B, heads, T, H}).set_stride({T * pitch, H, pitch, 1});
}

// A per-segment index tensor: [rows, 1, 1, 1] of `type`.
std::shared_ptr<fe::graph::Tensor_attributes> index_tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                           int64_t rows, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({rows, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(type));
}

// The ragged description of packed documents: segment lengths and each tensor's offsets.
struct Ragged {
  std::shared_ptr<fe::graph::Tensor_attributes> seq_len_q, seq_len_kv, q, k, v, o, stats;
  Ragged(fe::graph::Graph& g, int64_t segments) {
    seq_len_q = index_tensor(g, "seq_len_q", kSeqLenQ, segments, fe::DataType_t::INT32);
    seq_len_kv = index_tensor(g, "seq_len_kv", kSeqLenKV, segments, fe::DataType_t::INT32);
    q = index_tensor(g, "offset_q", kOffsetQ, segments + 1, fe::DataType_t::INT64);
    k = index_tensor(g, "offset_k", kOffsetK, segments + 1, fe::DataType_t::INT64);
    v = index_tensor(g, "offset_v", kOffsetV, segments + 1, fe::DataType_t::INT64);
    o = index_tensor(g, "offset_o", kOffsetO, segments + 1, fe::DataType_t::INT64);
    stats = index_tensor(g, "offset_stats", kOffsetStats, segments + 1, fe::DataType_t::INT64);
  }
  // The segments' lengths (a padding mask over them) and their total, on forward or backward attributes.
  template <typename Attributes>
  void set_lengths(Attributes& attrs, int64_t total_tokens) const {
    attrs.set_padding_mask(true)
        .set_seq_len_q(seq_len_q)
        .set_seq_len_kv(seq_len_kv)
        .set_max_total_seq_len_q(total_tokens)
        .set_max_total_seq_len_kv(total_tokens);
  }
};

// The statistics [B, N, T, 1]: row-major per head, or with documents token-major ([B·T, N]).
void set_stats_layout(fe::graph::Tensor_attributes& t, int64_t B, int64_t N, int64_t T, bool token_major) {
  t.set_dim({B, N, T, 1});
  if (token_major)
    t.set_stride({N * T, 1, N, 1});
  else
    t.set_stride({N * T, T, 1, 1});
}

// The masks on forward or backward attributes. Without a soft-cap: cuDNN's own causal mask
// and diagonal band (key j seen by query i when j > i - window). With one (Problem::softcap),
// whose score modifier excludes cuDNN's built-in masks: the modifier caps the scaled scores,
// s -> cap · tanh(s / cap), and then masks them itself with the same band, so the order is
// the CPU twin's (scale, cap, masks, softmax). Forward graphs only: cuDNN 9.19 builds no
// backward plan with a score modifier, so attention_backward sends capped scores to
// attention_backward_capped before any graph is made. The masks are aligned top left: cuDNN's graph has as many keys as queries.
template <typename Attributes>
void set_masks(Attributes& attrs, fe::graph::Graph& g, const Problem& k) {
  if (k.softcap <= 0) {
    attrs.set_causal_mask(k.causal);
    if (k.window > 0) attrs.set_diagonal_band_left_bound(static_cast<int>(k.window));
    return;
  }
  namespace mods = fe::graph::attn::score_modifiers;
  using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
  auto cap = g.tensor(static_cast<float>(k.softcap));
  auto softcap = std::make_shared<mods::Softcap>();
  const bool causal = k.causal;
  const std::optional<int64_t> left = k.window > 0 ? std::optional<int64_t>(k.window) : std::nullopt;
  attrs.set_score_mod([softcap, cap, causal, left](std::shared_ptr<fe::graph::Graph> sub, TensorPtr s) {
    TensorPtr capped = softcap->forward(sub, s, cap);
    if (!causal) return capped;
    return mods::sliding_window_mask(sub, capped, fe::DiagonalAlignment_t::TOP_LEFT, left, int64_t{0}, 0, 0, nullptr,
                                     nullptr, nullptr, nullptr);
  });
}

// A stage's name for cuDNN's refusals; with soft-capped scores it also says what was asked of
// cuDNN and what runs them elsewhere.
std::string stage_name(const Problem& k, const char* stage) {
  if (k.softcap <= 0) return stage;
  std::ostringstream s;
  s << stage << " for attention scores soft-capped at " << k.softcap << (k.causal ? ", causal" : ", not causal");
  if (k.window > 0) s << ", sliding window of " << k.window << " keys";
  s << " (a cuDNN score modifier; needs cuDNN 9.4 or newer on Hopper or newer). The exact f32 kernels take "
       "this attention on any GPU (model.dtype = f32), and so does the CPU (training.device = cpu)";
  return s.str();
}

}  // namespace

void check(fe::error_t e, const char* op, const char* stage) {
  if (e.is_bad()) ST_THROW(op, ": cuDNN attention ", stage, " failed: ", e.get_message());
}

namespace {

// An f32 scalar the graph reads from device memory.
std::shared_ptr<fe::graph::Tensor_attributes> device_scalar(fe::graph::Graph& g, const char* name, Uid uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

// What the FP8 graphs share: e4m3 I/O with f32 math, and contiguous q, k, v with their descales.
struct Fp8Graph {
  std::shared_ptr<fe::graph::Graph> g;
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, descale_q, descale_k, descale_v;
};

Fp8Graph fp8_graph(const Problem& k) {
  Fp8Graph f;
  f.g = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *f.g;
  g.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  f.q = bthd(g, "q", kQ, k.B, k.T, k.N, k.H, k.N * k.H);
  f.k = bthd(g, "k", kK, k.B, k.T, k.M, k.H, k.M * k.H);
  f.v = bthd(g, "v", kV, k.B, k.T, k.M, k.H, k.M * k.H);
  f.descale_q = device_scalar(g, "descale_q", kDescaleQ);
  f.descale_k = device_scalar(g, "descale_k", kDescaleK);
  f.descale_v = device_scalar(g, "descale_v", kDescaleV);
  return f;
}

// The FP8 forward (Problem::fp8): e4m3 q, k, v and out, contiguous, with their scales in
// device memory and the probabilities' fixed scale by value (ops::kFp8AttentionProbScale).
std::shared_ptr<fe::graph::Graph> fp8_forward_graph(const Problem& k, cudnnHandle_t handle, const char* op) {
  auto [g, q, kk, v, descale_q, descale_k, descale_v] = fp8_graph(k);
  auto scale_o = device_scalar(*g, "scale_o", kScaleO);
  auto scale_s = g->tensor(kFp8AttentionProbScale);
  auto descale_s = g->tensor(1.0f / kFp8AttentionProbScale);
  auto attrs = fe::graph::SDPA_fp8_attributes()
                   .set_name("attention_forward_fp8")
                   .set_generate_stats(true)
                   .set_attn_scale(static_cast<float>(k.scale))
                   .set_causal_mask(k.causal);
  auto [o, stats, amax_s, amax_o] =
      g->sdpa_fp8(q, kk, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, attrs);
  set_bthd(o, kO, k.B, k.T, k.N, k.H, k.N * k.H);
  o->set_data_type(fe::DataType_t::FP8_E4M3);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  set_stats_layout(*stats, k.B, k.N, k.T, false);
  for (auto [t, uid] : {std::pair{amax_s, kAmaxS}, std::pair{amax_o, kAmaxO}})
    t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
  check(g->validate(), op, "graph validation");
  check(g->build_operation_graph(handle), op, "operation graph");
  return g;
}

// The FP8 backward (Problem::fp8 and backward): e4m3 q, k, v, out, dout and gradients, all
// contiguous, every scale in device memory (the probabilities' the forward's value).
std::shared_ptr<fe::graph::Graph> fp8_backward_graph(const Problem& k, cudnnHandle_t handle, const char* op) {
  auto [g, q, kk, v, descale_q, descale_k, descale_v] = fp8_graph(k);
  auto o = bthd(*g, "o", kO, k.B, k.T, k.N, k.H, k.N * k.H);
  auto dout = bthd(*g, "dout", kDO, k.B, k.T, k.N, k.H, k.N * k.H);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT));
  set_stats_layout(*stats, k.B, k.N, k.T, false);
  auto descale_o = device_scalar(*g, "descale_o", kDescaleO);
  auto descale_do = device_scalar(*g, "descale_do", kDescaleDO);
  auto descale_dp = device_scalar(*g, "descale_dp", kDescaleDP);
  auto scale_dp = device_scalar(*g, "scale_dp", kScaleDP);
  auto scale_dq = device_scalar(*g, "scale_dq", kScaleDQ);
  auto scale_dk = device_scalar(*g, "scale_dk", kScaleDK);
  auto scale_dv = device_scalar(*g, "scale_dv", kScaleDV);
  auto scale_s = device_scalar(*g, "scale_s", kScaleS);
  auto descale_s = device_scalar(*g, "descale_s", kDescaleS);
  auto attrs = fe::graph::SDPA_fp8_backward_attributes()
                   .set_name("attention_backward_fp8")
                   .set_attn_scale(static_cast<float>(k.scale))
                   .set_causal_mask(k.causal);
  auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] =
      g->sdpa_fp8_backward(q, kk, v, o, dout, stats, descale_q, descale_k, descale_v, descale_o, descale_do,
                           descale_s, descale_dp, scale_s, scale_dq, scale_dk, scale_dv, scale_dp, attrs);
  set_bthd(dq, kDQ, k.B, k.T, k.N, k.H, k.N * k.H);
  set_bthd(dk, kDK, k.B, k.T, k.M, k.H, k.M * k.H);
  set_bthd(dv, kDV, k.B, k.T, k.M, k.H, k.M * k.H);
  for (auto& t : {dq, dk, dv}) t->set_data_type(fe::DataType_t::FP8_E4M3);
  for (auto [t, uid] : {std::pair{amax_dq, kAmaxDQ}, std::pair{amax_dk, kAmaxDK}, std::pair{amax_dv, kAmaxDV},
                        std::pair{amax_dp, kAmaxDP}})
    t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
  check(g->validate(), op, "graph validation");
  check(g->build_operation_graph(handle), op, "operation graph");
  return g;
}

}  // namespace

std::shared_ptr<fe::graph::Graph> operation_graph(const Problem& k, cudnnHandle_t handle, const char* op,
                                                  fe::AttentionImplementation_t implementation) {
  if (k.fp8) return k.backward ? fp8_backward_graph(k, handle, op) : fp8_forward_graph(k, handle, op);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(k.dtype, op))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const bool ragged = k.segments > 0;
  // with documents cuDNN's batch is the segments, of at most segment_tokens each
  const int64_t B = ragged ? k.segments : k.B, T = ragged ? k.segment_tokens : k.T;
  auto q = bthd(*g, "q", kQ, B, T, k.N, k.H, k.pitch_q);
  auto kk = bthd(*g, "k", kK, B, T, k.M, k.H, k.pitch_k);
  auto v = bthd(*g, "v", kV, B, T, k.M, k.H, k.pitch_v);
  std::unique_ptr<Ragged> r;
  if (ragged) {
    r = std::make_unique<Ragged>(*g, k.segments);
    q->set_ragged_offset(r->q);
    kk->set_ragged_offset(r->k);
    v->set_ragged_offset(r->v);
  }
  if (!k.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(static_cast<float>(k.scale))
                     .set_implementation(implementation);
    set_masks(attrs, *g, k);
    if (ragged) r->set_lengths(attrs, k.B * k.T);
    auto [o, stats] = g->sdpa(q, kk, v, attrs);
    set_bthd(o, kO, B, T, k.N, k.H, k.N * k.H);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    set_stats_layout(*stats, B, k.N, T, ragged);
    if (ragged) {
      o->set_ragged_offset(r->o);
      stats->set_ragged_offset(r->stats);
    }
  } else {
    auto o = bthd(*g, "o", kO, B, T, k.N, k.H, k.N * k.H);
    auto dout = bthd(*g, "dout", kDO, B, T, k.N, k.H, k.N * k.H);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_data_type(fe::DataType_t::FLOAT));
    set_stats_layout(*stats, B, k.N, T, ragged);
    if (ragged) {
      o->set_ragged_offset(r->o);
      dout->set_ragged_offset(r->o);
      stats->set_ragged_offset(r->stats);
    }
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(static_cast<float>(k.scale))
                     .set_deterministic_algorithm(k.deterministic);
    set_masks(attrs, *g, k);
    if (ragged) r->set_lengths(attrs, k.B * k.T);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, attrs);
    set_bthd(dq, kDQ, B, T, k.N, k.H, k.pitch_q);  // the gradients lie as their inputs do
    set_bthd(dk, kDK, B, T, k.M, k.H, k.pitch_k);
    set_bthd(dv, kDV, B, T, k.M, k.H, k.pitch_v);
    if (ragged) {
      dq->set_ragged_offset(r->q);
      dk->set_ragged_offset(r->k);
      dv->set_ragged_offset(r->v);
    }
  }
  check(g->validate(), op, stage_name(k, "graph validation").c_str());
  check(g->build_operation_graph(handle), op, stage_name(k, "operation graph").c_str());
  return g;
}

}  // namespace cudnn_attention

namespace {

namespace fe = cudnn_frontend;
using namespace cudnn_attention;

#define ST_CUDNN_CHECK(expr)                                                                              \
  do {                                                                                                    \
    const cudnnStatus_t st_cudnn_status_ = (expr);                                                        \
    if (st_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                         \
      ST_THROW("cuDNN error ", static_cast<int>(st_cudnn_status_), " (", cudnnGetErrorString(st_cudnn_status_), \
               ") in `", #expr, "`");                                                                     \
  } while (0)

struct Key {
  int device;
  Problem problem;
  bool operator<(const Key& o) const {
    return device != o.device ? device < o.device : problem < o.problem;
  }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

struct PerDevice {
  cudnnHandle_t handle = nullptr;
  std::map<Key, Built> graphs;
};

std::mutex g_mutex;

PerDevice& per_device(int device) {
  static std::map<int, PerDevice*> table;  // leaked: lives for the process
  PerDevice*& p = table[device];
  if (p == nullptr) {
    p = new PerDevice();
    ST_CUDNN_CHECK(cudnnCreate(&p->handle));
  }
  return *p;
}

// The plan cuDNN's heuristics rank first.
Built build(const Key& k, cudnnHandle_t handle, const char* op) {
  Built b;
  b.graph = operation_graph(k.problem, handle, op);
  const Problem& p = k.problem;
  check(b.graph->create_execution_plans({fe::HeurMode_t::A}), op, stage_name(p, "plan search").c_str());
  check(b.graph->check_support(handle), op,
        stage_name(p, "support check (B, T, heads, head dim not supported?)").c_str());
  check(b.graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), op,
        stage_name(p, "plan build").c_str());
  check(b.graph->get_workspace_size(b.workspace_bytes), op, "workspace query");
  return b;
}

void run(const Key& key, std::unordered_map<int64_t, void*>& pointers, Stream stream, const char* op) {
  std::lock_guard<std::mutex> lock(g_mutex);
  PerDevice& pd = per_device(key.device);
  auto it = pd.graphs.find(key);
  if (it == pd.graphs.end()) it = pd.graphs.emplace(key, build(key, pd.handle, op)).first;
  ST_CUDNN_CHECK(cudnnSetStream(pd.handle, static_cast<cudaStream_t>(resolve(stream).handle)));
  Tensor workspace;
  if (it->second.workspace_bytes > 0)
    workspace = Tensor::empty({it->second.workspace_bytes}, DType::kU8, Device::cuda(key.device),
                              "cuDNN attention workspace");
  check(it->second.graph->execute(pd.handle, pointers, workspace.defined() ? workspace.raw_data() : nullptr), op,
        "execution");
}

// Contiguous, or (heads_strided) [B, T, heads, H] with each token's heads contiguous and
// tokens a pitch apart (heads sliced from a stacked q|k|v tensor); returns that pitch.
int64_t check_tensor(const Tensor& t, const char* op, const char* arg, DType dtype, const Shape& shape,
                     bool heads_strided = false) {
  ST_CHECK(t.device().is_cuda(), op, ": `", arg, "` expected on a CUDA device, found ", t.str());
  ST_CHECK(t.dtype() == dtype, op, ": `", arg, "` expected dtype ", dtype_name(dtype), ", found ", t.str());
  ST_CHECK(t.shape() == shape, op, ": `", arg, "` expected shape ", shape.str(), ", found ", t.str());
  if (heads_strided) return token_pitch(t, op, arg);
  ST_CHECK(t.is_contiguous(), op, ": `", arg, "` must be contiguous, found ", t.str());
  return 0;
}

Key make_key(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, bool backward,
             const char* op) {
  ST_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": expected q [B, T, N, H] and k [B, T, M, H], found ", q.str(),
           " and ", k.str());
  Key key{q.device().index,
          Problem{backward, q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), q.dtype(), o.causal,
                  o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))), o.deterministic}};
  Problem& p = key.problem;
  ST_CHECK(o.window >= 0 && (o.window == 0 || o.causal), op, ": a sliding window (", o.window,
           " keys) needs the causal mask and a positive size");
  // a window that holds every key is no window (one graph for both)
  p.window = o.window < p.T ? o.window : 0;
  ST_CHECK(o.softcap >= 0, op, ": the soft-cap of the attention scores must be >= 0 (0: none), found ", o.softcap);
  p.softcap = o.softcap;
  p.pitch_q = check_tensor(q, op, "q_BTNH", q.dtype(), q.shape(), true);
  p.pitch_k = check_tensor(k, op, "k_BTMH", q.dtype(), {p.B, p.T, p.M, p.H}, true);
  p.pitch_v = check_tensor(v, op, "v_BTMH", q.dtype(), {p.B, p.T, p.M, p.H}, true);
  ST_CHECK(p.M > 0 && p.N % p.M == 0, op, ": key/value heads (", p.M, ") must divide query heads (", p.N, ")");
  ST_CHECK(q.dtype() == DType::kF32 || q.dtype() == DType::kBF16 || q.dtype() == DType::kF16, op,
           ": CUDA attention runs on bf16 or f16 tensors (cuDNN flash attention) or f32 (exact check kernels), "
           "found ", q.str(), "; cast q, k and v first");
  ST_CHECK(q.dtype() == DType::kF32 || (p.H % 8 == 0 && p.H <= 256), op, ": head dim ", p.H,
           " not supported by cuDNN flash attention (a multiple of 8, at most 256)");
  return key;
}

// Packed documents (options.documents): checks them against q and sets p.segments and
// p.segment_tokens for cuDNN's ragged problem (left 0 without documents, with one per row,
// which is plain causal attention, and for the f32 kernels, which read only the positions).
void set_documents(Problem& p, const AttentionOptions& o, const Tensor& q, const char* op) {
  if (o.documents == nullptr) return;
  const PackedDocuments& d = *o.documents;
  ST_CHECK(o.causal, op, ": packed documents need the causal mask");
  check_tensor(d.positions_BT, op, "documents.positions_BT", DType::kI32, {p.B, p.T});
  ST_CHECK(d.positions_BT.device() == q.device(), op, ": documents on ", d.positions_BT.str(), ", q on ", q.str());
  // one document per row: the plain kernel, without the ragged layout's cost (10-13 %)
  if (p.dtype == DType::kF32 || d.count == p.B) return;
  ST_CHECK(d.capacity >= 1 && d.segment_starts_S1.defined() && d.segment_lengths_S.defined(), op,
           ": packed documents without their segments (make them with pack_documents for the CUDA device)");
  check_shape(d.segment_starts_S1, {d.capacity + 1}, op, "documents.segment_starts_S1");
  check_shape(d.segment_lengths_S, {d.capacity}, op, "documents.segment_lengths_S");
  ST_CHECK(d.longest >= 1 && d.longest <= p.T, op, ": documents of up to ", d.longest, " tokens in rows of ", p.T);
  ST_CHECK(p.softcap == 0, op, ": packed documents (", d.count, " in ", p.B, " rows) with attention scores "
           "soft-capped at ", p.softcap, " (Gemma 2) are not supported by the cuDNN attention (its ragged layout "
           "and score modifier do not combine here); pack one document per row, or run with model.dtype = f32 "
           "(exact kernels) or training.device = cpu");
  p.segments = d.capacity;
  p.segment_tokens = d.longest;
}

// Key spans (options.spans): checks them against q and sets cuDNN's ragged problem, one
// segment a row: its first queries against its last keys, no causal mask (left 0 for the f32
// kernels, which read only the spans' positions).
void set_spans(Problem& p, const AttentionOptions& o, const char* op) {
  if (o.spans == nullptr) return;
  const KeySpans& s = *o.spans;
  ST_CHECK(!o.causal && o.documents == nullptr && p.window == 0, op,
           ": key spans take no causal mask, packed documents or window");
  ST_CHECK(p.softcap == 0, op, ": key spans with attention scores soft-capped at ", p.softcap,
           " are not supported by the CUDA attention");
  ST_CHECK(static_cast<int64_t>(s.queries.size()) == p.B && static_cast<int64_t>(s.first_key.size()) == p.B, op,
           ": key spans for ", s.queries.size(), " rows, q has ", p.B);
  ST_CHECK(s.positions_BT.defined() && s.lengths_2B.defined() && s.starts_2B1.defined(), op,
           ": key spans without their device form (make them with key_spans for the CUDA device)");
  check_tensor(s.positions_BT, op, "spans.positions_BT", DType::kI32, {p.B, p.T});
  check_tensor(s.lengths_2B, op, "spans.lengths_2B", DType::kI32, {2, p.B});
  check_tensor(s.starts_2B1, op, "spans.starts_2B1", DType::kI64, {2, p.B + 1});
  if (p.dtype == DType::kF32) return;
  p.segments = p.B;
  p.segment_tokens = p.T;
}

// With key spans: each row's lengths and each tensor's element offsets into `pointers` (held
// by `offsets`): the queries, out and statistics from the row's first token, the keys and
// values from its first key; and cuDNN's token-major statistics buffer.
Tensor add_spans(std::unordered_map<int64_t, void*>& pointers, Tensor& offsets, const Problem& p, const KeySpans& s,
                 Stream stream) {
  const Device device = s.positions_BT.device();
  offsets = Tensor::empty({2, 5, p.B + 1}, DType::kI64, device, "attention span offsets", stream);
  Tensor by_query = offsets.select(0), by_key = offsets.select(1);
  ragged_offsets(by_query, s.starts_2B1.select(0), p.pitch_q, p.pitch_k, p.pitch_v, p.N, p.H, stream);
  ragged_offsets(by_key, s.starts_2B1.select(1), p.pitch_q, p.pitch_k, p.pitch_v, p.N, p.H, stream);
  const int64_t rows = p.B + 1;
  int64_t* oq = static_cast<int64_t*>(by_query.raw_data());
  int64_t* ok = static_cast<int64_t*>(by_key.raw_data());
  pointers[kSeqLenQ] = s.lengths_2B.select(0).raw_data();
  pointers[kSeqLenKV] = s.lengths_2B.select(1).raw_data();
  pointers[kOffsetQ] = oq;
  pointers[kOffsetK] = ok + rows;
  pointers[kOffsetV] = ok + 2 * rows;
  pointers[kOffsetO] = oq + 3 * rows;
  pointers[kOffsetStats] = oq + 4 * rows;
  Tensor stats = Tensor::empty({p.B * p.T, p.N}, DType::kF32, device, "attention statistics by token", stream);
  pointers[kStats] = stats.raw_data();
  return stats;
}

// Zeroes t on `stream` (the rows cuDNN's ragged problems leave alone).
void zero(Tensor& t, Stream stream) {
  ST_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), static_cast<cudaStream_t>(resolve(stream).handle)));
}

// With packed documents: the segments' lengths and each tensor's element offsets into
// `pointers` (held by `offsets`), and cuDNN's token-major statistics buffer.
Tensor add_segments(std::unordered_map<int64_t, void*>& pointers, Tensor& offsets, const Problem& p,
                    const PackedDocuments& d, Stream stream) {
  const Device device = d.positions_BT.device();
  offsets = Tensor::empty({5, p.segments + 1}, DType::kI64, device, "attention segment offsets", stream);
  ragged_offsets(offsets, d.segment_starts_S1, p.pitch_q, p.pitch_k, p.pitch_v, p.N, p.H, stream);
  int64_t* o = static_cast<int64_t*>(offsets.raw_data());
  const int64_t rows = p.segments + 1;
  pointers[kSeqLenQ] = d.segment_lengths_S.raw_data();
  pointers[kSeqLenKV] = d.segment_lengths_S.raw_data();
  pointers[kOffsetQ] = o;
  pointers[kOffsetK] = o + rows;
  pointers[kOffsetV] = o + 2 * rows;
  pointers[kOffsetO] = o + 3 * rows;
  pointers[kOffsetStats] = o + 4 * rows;
  Tensor stats = Tensor::empty({p.B * p.T, p.N}, DType::kF32, device, "attention statistics by token", stream);
  pointers[kStats] = stats.raw_data();
  return stats;
}

}  // namespace

void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                       const Tensor& v_BTMH, const AttentionOptions& options, Stream stream) {
  const char* op = "attention_forward";
  // over a KV cache: more keys than queries, or keys that are rows of a longer cache (their
  // sequences further apart than T tokens)
  auto cache_rows = [&](const Tensor& x) {
    return x.ndim() == 4 && x.size(0) > 1 && x.stride(0) != x.size(1) * x.stride(1);
  };
  // (with packed documents make_key requires as many keys as queries)
  if (options.documents == nullptr && options.spans == nullptr && q_BTNH.ndim() == 4 && k_BTMH.ndim() == 4 &&
      (k_BTMH.size(1) != q_BTNH.size(1) || cache_rows(k_BTMH) || cache_rows(v_BTMH)))
    return attention_forward_cached(out_BTNH, lse_BNT, q_BTNH, k_BTMH, v_BTMH, options, stream);
  Key key = make_key(q_BTNH, k_BTMH, v_BTMH, options, false, op);
  set_documents(key.problem, options, q_BTNH, op);
  set_spans(key.problem, options, op);
  const int64_t segments = key.problem.segments;
  check_tensor(out_BTNH, op, "out_BTNH", q_BTNH.dtype(), q_BTNH.shape());
  check_tensor(lse_BNT, op, "lse_BNT", DType::kF32, {key.problem.B, key.problem.N, key.problem.T});
  if (key.problem.dtype == DType::kF32)
    return attention_forward_f32(out_BTNH, lse_BNT, contiguous(q_BTNH, stream), contiguous(k_BTMH, stream),
                                 contiguous(v_BTMH, stream), options, stream);
  std::unordered_map<int64_t, void*> p = {{kQ, q_BTNH.raw_data()}, {kK, k_BTMH.raw_data()},
                                          {kV, v_BTMH.raw_data()}, {kO, out_BTNH.raw_data()},
                                          {kStats, lse_BNT.raw_data()}};
  if (segments == 0) return run(key, p, stream, op);  // one document per row: plain causal
  Tensor offsets;
  if (options.spans != nullptr) {  // the queries outside the spans: output 0, log-sum-exp -inf
    Tensor stats = add_spans(p, offsets, key.problem, *options.spans, stream);
    zero(out_BTNH, stream);
    fill(stats, -INFINITY, stream);
    run(key, p, stream, op);
    return stats_to_heads(lse_BNT, stats, stream);
  }
  const Tensor stats = add_segments(p, offsets, key.problem, *options.documents, stream);
  run(key, p, stream, op);
  stats_to_heads(lse_BNT, stats, stream);
}

void attention_forward_fp8(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& q_BTNH, Tensor& k_BTMH, Tensor& v_BTMH,
                           const AttentionOptions& options, Stream stream, Tensor* scales_4) {
  const char* op = "attention_forward_fp8";
  ST_CHECK(options.documents == nullptr && options.window == 0 && options.softcap == 0, op,
           ": the FP8 forward takes neither packed documents, a sliding window nor soft-capped scores; use "
           "attention_forward");
  ST_CHECK(q_BTNH.ndim() == 4 && k_BTMH.ndim() == 4 && k_BTMH.size(1) == q_BTNH.size(1), op,
           ": expected q [B, T, N, H] and k [B, T, M, H] with as many keys as queries, found ", q_BTNH.str(),
           " and ", k_BTMH.str());
  Key key = make_key(q_BTNH, k_BTMH, v_BTMH, options, false, op);
  Problem& p = key.problem;
  ST_CHECK(p.dtype == DType::kBF16, op, ": the FP8 forward takes bf16 q, k and v, found ", q_BTNH.str());
  ST_CHECK(p.H % 16 == 0, op, ": head dim ", p.H, " not supported by cuDNN's FP8 attention (a multiple of 16)");
  check_tensor(out_BTNH, op, "out_BTNH", DType::kBF16, q_BTNH.shape());
  check_tensor(lse_BNT, op, "lse_BNT", DType::kF32, {p.B, p.N, p.T});
  p.fp8 = true;
  p.pitch_q = p.N * p.H;  // the e4m3 copies are contiguous
  p.pitch_k = p.pitch_v = p.M * p.H;
  const Device dev = q_BTNH.device();
  Tensor q8 = Tensor::empty(q_BTNH.shape(), DType::kF8E4M3, dev, "FP8 attention q", stream);
  Tensor k8 = Tensor::empty(k_BTMH.shape(), DType::kF8E4M3, dev, "FP8 attention k", stream);
  Tensor v8 = Tensor::empty(v_BTMH.shape(), DType::kF8E4M3, dev, "FP8 attention v", stream);
  Tensor out8 = Tensor::empty(out_BTNH.shape(), DType::kF8E4M3, dev, "FP8 attention output", stream);
  Tensor scales = Tensor::empty({kFp8Count}, DType::kF32, dev, "FP8 attention scales", stream);
  Tensor amax = Tensor::empty({2}, DType::kF32, dev, "FP8 attention amax", stream);
  fp8_attention_inputs(q8, k8, v8, scales, q_BTNH, k_BTMH, v_BTMH, stream);
  float* sc = scales.data<float>();
  std::unordered_map<int64_t, void*> ptrs = {
      {kQ, q8.raw_data()},           {kK, k8.raw_data()},           {kV, v8.raw_data()},
      {kO, out8.raw_data()},         {kStats, lse_BNT.raw_data()},  {kDescaleQ, sc + kFp8DescaleQ},
      {kDescaleK, sc + kFp8DescaleK}, {kDescaleV, sc + kFp8DescaleV}, {kScaleO, sc + kFp8FactorOut},
      {kAmaxS, amax.data<float>()},  {kAmaxO, amax.data<float>() + 1}};
  run(key, ptrs, stream, op);
  fp8_attention_output(out_BTNH, out8, scales, stream);
  if (scales_4 != nullptr) {
    ST_CHECK(scales_4->dtype() == DType::kF32 && scales_4->numel() == 4 && scales_4->is_contiguous(), op,
             ": `scales_4` must be contiguous f32 [4], found ", scales_4->str());
    Tensor first4 = scales.flat_range(kFp8DescaleQ, 4);
    copy(*scales_4, first4, stream);
  }
}

void attention_backward_fp8(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                            const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                            const Tensor& lse_BNT, Tensor& history_4, bool seed, const AttentionOptions& options,
                            Stream stream) {
  const char* op = "attention_backward_fp8";
  ST_CHECK(options.documents == nullptr && options.window == 0 && options.softcap == 0, op,
           ": the FP8 backward takes neither packed documents, a sliding window nor soft-capped scores; use "
           "attention_backward");
  Key key = make_key(q_BTNH, k_BTMH, v_BTMH, options, true, op);
  Problem& p = key.problem;
  ST_CHECK(p.dtype == DType::kBF16, op, ": the FP8 backward takes bf16 q, k and v, found ", q_BTNH.str());
  ST_CHECK(p.H == 128, op, ": head dim ", p.H, " not supported by cuDNN's FP8 attention backward on Hopper (128)");
  check_tensor(out_BTNH, op, "out_BTNH", DType::kBF16, q_BTNH.shape());
  check_tensor(dout_BTNH, op, "dout_BTNH", DType::kBF16, q_BTNH.shape());
  check_tensor(lse_BNT, op, "lse_BNT", DType::kF32, {p.B, p.N, p.T});
  check_tensor(dq_BTNH, op, "dq_BTNH", DType::kBF16, q_BTNH.shape(), true);
  check_tensor(dk_BTMH, op, "dk_BTMH", DType::kBF16, k_BTMH.shape(), true);
  check_tensor(dv_BTMH, op, "dv_BTMH", DType::kBF16, k_BTMH.shape(), true);
  p.fp8 = true;
  p.deterministic = false;  // the FP8 backward has one algorithm
  p.pitch_q = p.N * p.H;    // every e4m3 tensor is contiguous
  p.pitch_k = p.pitch_v = p.M * p.H;
  const Device dev = q_BTNH.device();
  auto codes = [&](const Tensor& like, const char* what) {
    return Tensor::empty(like.shape(), DType::kF8E4M3, dev, what, stream);
  };
  Tensor q8 = codes(q_BTNH, "FP8 attention q"), k8 = codes(k_BTMH, "FP8 attention k"),
         v8 = codes(v_BTMH, "FP8 attention v"), out8 = codes(out_BTNH, "FP8 attention output"),
         dout8 = codes(dout_BTNH, "FP8 attention output gradient"), dq8 = codes(q_BTNH, "FP8 attention dq"),
         dk8 = codes(k_BTMH, "FP8 attention dk"), dv8 = codes(v_BTMH, "FP8 attention dv");
  Tensor scales = Tensor::empty({kFp8Count}, DType::kF32, dev, "FP8 attention scales", stream);
  Tensor amax = Tensor::empty({4}, DType::kF32, dev, "FP8 attention gradients' amax", stream);
  if (seed)  // the first pass's scales from bounds
    ST_CUDA_CHECK(cudaMemsetAsync(history_4.raw_data(), 0, history_4.nbytes(),
                                  static_cast<cudaStream_t>(resolve(stream).handle)));
  fp8_attention_backward_inputs(q8, k8, v8, out8, dout8, scales, q_BTNH, k_BTMH, v_BTMH, out_BTNH, dout_BTNH,
                                history_4, p.scale, stream);
  float* sc = scales.data<float>();
  float* am = amax.data<float>();
  std::unordered_map<int64_t, void*> ptrs = {
      {kQ, q8.raw_data()},          {kK, k8.raw_data()},           {kV, v8.raw_data()},
      {kO, out8.raw_data()},        {kDO, dout8.raw_data()},       {kStats, lse_BNT.raw_data()},
      {kDQ, dq8.raw_data()},        {kDK, dk8.raw_data()},         {kDV, dv8.raw_data()},
      {kDescaleQ, sc + kFp8DescaleQ}, {kDescaleK, sc + kFp8DescaleK}, {kDescaleV, sc + kFp8DescaleV},
      {kDescaleO, sc + kFp8DescaleOut}, {kDescaleDO, sc + kFp8DescaleDOut}, {kDescaleDP, sc + kFp8DescaleDP},
      {kScaleDP, sc + kFp8FactorDP}, {kScaleDQ, sc + kFp8FactorDQ}, {kScaleDK, sc + kFp8FactorDK},
      {kScaleDV, sc + kFp8FactorDV}, {kAmaxDQ, am},                {kAmaxDK, am + 1},
      {kAmaxDV, am + 2},            {kAmaxDP, am + 3},             {kScaleS, sc + kFp8FactorP},
      {kDescaleS, sc + kFp8DescaleP}};
  run(key, ptrs, stream, op);
  if (seed) {  // again, under scales from the amaxes of the first pass
    fp8_attention_update_history(history_4, amax, stream);
    fp8_attention_backward_inputs(q8, k8, v8, out8, dout8, scales, q_BTNH, k_BTMH, v_BTMH, out_BTNH, dout_BTNH,
                                  history_4, p.scale, stream);
    run(key, ptrs, stream, op);
  }
  fp8_attention_gradient(dq_BTNH, dq8, scales, kFp8DescaleDQ, stream);
  fp8_attention_gradient(dk_BTMH, dk8, scales, kFp8DescaleDK, stream);
  fp8_attention_gradient(dv_BTMH, dv8, scales, kFp8DescaleDV, stream);
  fp8_attention_update_history(history_4, amax, stream);
}

namespace {

// Soft-capped scores (Gemma 2) in bf16 or f16: cuDNN 9's flash backward builds no plan for a
// graph with a score modifier ("Attention score mod enabled and hence other subgraphs are
// disabled", cuDNN 9.19, H200), though its forward does. The exact f32 kernels take the
// backward on f32 copies of the contiguous inputs, against the forward's output and
// statistics, and the gradients are rounded once: exact, and slower than flash attention.
void attention_backward_capped(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                               const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                               const Tensor& out_BTNH, const Tensor& lse_BNT, const AttentionOptions& options,
                               Stream stream) {
  auto f32 = [&](const Tensor& t, const char* name) {
    Tensor c = Tensor::empty(t.shape(), DType::kF32, t.device(), name, stream);
    cast(c, t, stream);
    return c;
  };
  const Tensor q = f32(q_BTNH, "soft-capped attention: f32 q"), k = f32(k_BTMH, "soft-capped attention: f32 k"),
               v = f32(v_BTMH, "soft-capped attention: f32 v"), out = f32(out_BTNH, "soft-capped attention: f32 out"),
               dout = f32(dout_BTNH, "soft-capped attention: f32 dout");
  Tensor dq = Tensor::empty(q.shape(), DType::kF32, q.device(), "soft-capped attention: f32 dq", stream);
  Tensor dk = Tensor::empty(k.shape(), DType::kF32, q.device(), "soft-capped attention: f32 dk", stream);
  Tensor dv = Tensor::empty(v.shape(), DType::kF32, q.device(), "soft-capped attention: f32 dv", stream);
  attention_backward_f32(dq, dk, dv, dout, q, k, v, out, lse_BNT, options, stream);
  cast(dq_BTNH, dq, stream);
  cast(dk_BTMH, dk, stream);
  cast(dv_BTMH, dv, stream);
}

}  // namespace

void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                        const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                        const Tensor& lse_BNT, const AttentionOptions& options, Stream stream) {
  const char* op = "attention_backward";
  Key key = make_key(q_BTNH, k_BTMH, v_BTMH, options, true, op);
  set_documents(key.problem, options, q_BTNH, op);
  set_spans(key.problem, options, op);
  const int64_t segments = key.problem.segments;
  check_tensor(out_BTNH, op, "out_BTNH", q_BTNH.dtype(), q_BTNH.shape());
  check_tensor(dout_BTNH, op, "dout_BTNH", q_BTNH.dtype(), q_BTNH.shape());
  check_tensor(lse_BNT, op, "lse_BNT", DType::kF32, {key.problem.B, key.problem.N, key.problem.T});
  const Problem& p = key.problem;
  const bool same_pitches = check_tensor(dq_BTNH, op, "dq_BTNH", p.dtype, q_BTNH.shape(), true) == p.pitch_q &&
                            check_tensor(dk_BTMH, op, "dk_BTMH", p.dtype, k_BTMH.shape(), true) == p.pitch_k &&
                            check_tensor(dv_BTMH, op, "dv_BTMH", p.dtype, k_BTMH.shape(), true) == p.pitch_v;
  // cuDNN takes strided views as they are, its gradients laid out as their inputs; the other
  // kernels (and gradients laid out otherwise) work on contiguous copies, and so does cuDNN's
  // ragged backward (packed documents), whose workspace grows with the token pitch: 3.4 GiB for
  // the 1B shape's stacked q|k|v at batch 8, 0.8 GiB contiguous (H100, cuDNN 9.14)
  const bool capped = p.softcap > 0;
  if (p.T == 1 || p.dtype == DType::kF32 || capped || !same_pitches || segments > 0)
    if (!all_contiguous({&q_BTNH, &k_BTMH, &v_BTMH, &dq_BTNH, &dk_BTMH, &dv_BTMH}))
      return attention_backward_on_contiguous(
          dq_BTNH, dk_BTMH, dv_BTMH, q_BTNH, k_BTMH, v_BTMH, stream,
          [&](Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v) {
            cuda::attention_backward(dq, dk, dv, dout_BTNH, q, k, v, out_BTNH, lse_BNT, options, stream);
          });
  if (p.T == 1) return attention_backward_single_token(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, stream);
  if (p.dtype == DType::kF32)
    return attention_backward_f32(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH, lse_BNT,
                                  options, stream);
  if (capped) return attention_backward_capped(dq_BTNH, dk_BTMH, dv_BTMH, dout_BTNH, q_BTNH, k_BTMH, v_BTMH, out_BTNH,
                                               lse_BNT, options, stream);
  std::unordered_map<int64_t, void*> ptrs = {
      {kQ, q_BTNH.raw_data()},   {kK, k_BTMH.raw_data()},     {kV, v_BTMH.raw_data()},
      {kO, out_BTNH.raw_data()}, {kDO, dout_BTNH.raw_data()}, {kStats, lse_BNT.raw_data()},
      {kDQ, dq_BTNH.raw_data()}, {kDK, dk_BTMH.raw_data()},   {kDV, dv_BTMH.raw_data()}};
  if (segments == 0) return run(key, ptrs, stream, op);
  Tensor offsets;
  Tensor stats;
  if (options.spans != nullptr) {  // the rows outside the spans keep gradients of 0
    stats = add_spans(ptrs, offsets, key.problem, *options.spans, stream);
    zero(dq_BTNH, stream);
    zero(dk_BTMH, stream);
    zero(dv_BTMH, stream);
  } else {
    stats = add_segments(ptrs, offsets, key.problem, *options.documents, stream);
  }
  stats_to_tokens(stats, lse_BNT, stream);
  run(key, ptrs, stream, op);
}

}  // namespace shardtrain::ops::cuda
