// CPU causal GQA attention without a T x T matrix: query tiles visit key tiles with an
// online softmax (running max m, running sum l, rescaled accumulator); the backward
// recomputes probabilities tile by tile from the saved log-sum-exp (FlashAttention-2).
// Work is split over (batch, kv head): a task owns dk/dv of its kv head and dq of its
// query heads, so no two threads write the same element. The forward also takes S > T keys
// (a KV cache): query i then sits at position i + S - T. With packed documents a query's
// keys start at its document's first token (AttentionOptions::documents), and with a sliding
// window W keys before it at the latest (AttentionOptions::window).
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ops/attention.h"
#include "ops/cpu/common.h"

namespace shardtrain::ops {

Tensor document_positions(const Tensor& ids_BT, int32_t bos_id) {
  const char* op = "document_positions";
  cpu::check_arg(ids_BT, op, "ids_BT");
  check_dtype(ids_BT, DType::kI32, op, "ids_BT");
  ST_CHECK(ids_BT.ndim() == 2, op, ": `ids_BT` must be [B, T], found ", ids_BT.str());
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  Tensor positions = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "document positions");
  const int32_t* ids = ids_BT.data<int32_t>();
  int32_t* pos = positions.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      pos[i] = t == 0 || ids[i] == bos_id ? 0 : pos[i - 1] + 1;
    }
  return positions;
}

PackedDocuments pack_documents(const Tensor& positions_BT, Device device, Stream stream) {
  const char* op = "pack_documents";
  cpu::check_arg(positions_BT, op, "positions_BT");
  check_dtype(positions_BT, DType::kI32, op, "positions_BT");
  ST_CHECK(positions_BT.ndim() == 2, op, ": `positions_BT` must be [B, T], found ", positions_BT.str());
  const int64_t B = positions_BT.size(0), T = positions_BT.size(1);
  const int32_t* pos = positions_BT.data<int32_t>();
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = pos[b * T + t];
      const bool valid = t == 0 ? p == 0 : p == 0 || p == pos[b * T + t - 1] + 1;
      ST_CHECK(valid, op, ": position ", p, " at row ", b, ", token ", t, " neither starts a document (0) nor ",
               "follows the one before it", t == 0 ? " (a row starts at 0)" : "");
      if (p == 0) starts.push_back(b * T + t);
    }
  PackedDocuments d;
  d.count = static_cast<int64_t>(starts.size());
  // every row starts a document, so a document ends where the next one starts (or at B·T)
  starts.push_back(B * T);
  int64_t longest = 0;
  for (size_t i = 0; i + 1 < starts.size(); ++i) longest = std::max(longest, starts[i + 1] - starts[i]);
  d.longest = std::min(T, std::max<int64_t>(64, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(longest)))));
  d.capacity = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(d.count)));
  if (device.is_cpu()) {
    d.positions_BT = positions_BT;
    return d;
  }
  d.positions_BT = Tensor::empty({B, T}, DType::kI32, device, "document positions", stream);
  copy(d.positions_BT, positions_BT, stream);
  Tensor host_starts = Tensor::empty({d.capacity + 1}, DType::kI64, Device::cpu(), "segment starts");
  Tensor host_lengths = Tensor::empty({d.capacity}, DType::kI32, Device::cpu(), "segment lengths");
  int64_t* st = host_starts.data<int64_t>();
  int32_t* len = host_lengths.data<int32_t>();
  for (int64_t i = 0; i <= d.capacity; ++i) st[i] = starts[static_cast<size_t>(std::min(i, d.count))];
  for (int64_t i = 0; i < d.capacity; ++i) len[i] = static_cast<int32_t>(st[i + 1] - st[i]);
  d.segment_starts_S1 = Tensor::empty(host_starts.shape(), DType::kI64, device, "segment starts", stream);
  d.segment_lengths_S = Tensor::empty(host_lengths.shape(), DType::kI32, device, "segment lengths", stream);
  copy(d.segment_starts_S1, host_starts, stream);
  copy(d.segment_lengths_S, host_lengths, stream);
  return d;
}

KeySpans key_spans(std::vector<int64_t> queries, std::vector<int64_t> first_key, int64_t T, int64_t S, Device device,
                   Stream stream) {
  const char* op = "key_spans";
  const int64_t B = static_cast<int64_t>(queries.size());
  ST_CHECK(B >= 1 && first_key.size() == queries.size(), op, ": expected one query count and one first key per row, "
           "found ", queries.size(), " and ", first_key.size());
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    ST_CHECK(queries[i] >= 0 && queries[i] <= T, op, ": row ", b, " has ", queries[i], " queries seeing keys, of ", T);
    ST_CHECK(first_key[i] >= 0 && first_key[i] <= S, op, ": row ", b, " sees keys from ", first_key[i], ", of ", S);
  }
  KeySpans spans;
  spans.queries = std::move(queries);
  spans.first_key = std::move(first_key);
  if (device.is_cpu()) return spans;
  Tensor positions = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "key spans: positions");
  Tensor lengths = Tensor::empty({2, B}, DType::kI32, Device::cpu(), "key spans: lengths");
  Tensor starts = Tensor::empty({2, B + 1}, DType::kI64, Device::cpu(), "key spans: starts");
  int32_t* pos = positions.data<int32_t>();
  int32_t* len = lengths.data<int32_t>();
  int64_t* st = starts.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    const bool sees = spans.queries[i] > 0 && spans.first_key[i] < S;
    for (int64_t t = 0; t < T; ++t)
      pos[b * T + t] = static_cast<int32_t>(t - (sees && t < spans.queries[i] ? spans.first_key[i] : S));
    len[b] = static_cast<int32_t>(sees ? spans.queries[i] : 0);
    len[B + b] = static_cast<int32_t>(sees ? S - spans.first_key[i] : 0);
    st[b] = b * T;
    st[B + 1 + b] = b * S + (sees ? spans.first_key[i] : 0);
  }
  st[B] = B * T;
  st[2 * B + 1] = B * S;
  auto on_device = [&](const Tensor& host, const char* name) {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), device, name, stream);
    copy(t, host, stream);
    return t;
  };
  spans.positions_BT = on_device(positions, "key spans: positions");
  spans.lengths_2B = on_device(lengths, "key spans: lengths");
  spans.starts_2B1 = on_device(starts, "key spans: starts");
  return spans;
}

namespace cpu {
namespace {

struct Dims {
  int64_t B, T, S, N, M, H, group;
};

// With `longer_keys` k and v may hold S >= T positions (the forward over a KV cache); else S = T.
Dims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op, bool longer_keys) {
  check_arg(q, op, "q_BTNH");
  ST_CHECK(q.ndim() == 4, op, ": `q_BTNH` must be 4-D, found ", q.str());
  Dims d{q.size(0), q.size(1), q.size(1), q.size(2), k.ndim() == 4 ? k.size(2) : 0, q.size(3), 0};
  if (longer_keys && k.ndim() == 4) {
    d.S = k.size(1);
    ST_CHECK(d.S >= d.T, op, ": ", d.S, " key positions for ", d.T, " queries; the queries are the last of the ",
             "keys' positions, so there must be at least as many keys");
  }
  check_arg(k, op, "k_BTMH", q.dtype(), {d.B, d.S, d.M, d.H});
  check_arg(v, op, "v_BTMH", q.dtype(), {d.B, d.S, d.M, d.H});
  ST_CHECK(d.M > 0 && d.N % d.M == 0, op, ": key/value heads (", d.M, ") must divide query heads (", d.N, ")");
  d.group = d.N / d.M;
  return d;
}

// Per query row b·T + t, the first key it sees: t - positions[b, t] with documents, else 0;
// with a sliding window of W keys at least p - W + 1, p = t + S - T the query's position.
std::vector<int64_t> first_keys(const AttentionOptions& o, const Dims& d, const char* op) {
  ST_CHECK(o.window >= 0, op, ": the sliding window must be >= 0 keys (0: none), found ", o.window);
  ST_CHECK(o.window == 0 || o.causal, op, ": a sliding window of ", o.window, " keys needs a causal mask");
  std::vector<int64_t> first(static_cast<size_t>(d.B * d.T), 0);
  if (o.spans != nullptr) {
    const KeySpans& sp = *o.spans;
    ST_CHECK(!o.causal && o.documents == nullptr && o.window == 0 && d.S == d.T, op,
             ": key spans take no causal mask, packed documents or window, and as many keys as queries");
    ST_CHECK(static_cast<int64_t>(sp.queries.size()) == d.B && static_cast<int64_t>(sp.first_key.size()) == d.B, op,
             ": key spans for ", sp.queries.size(), " rows, q has ", d.B);
    for (int64_t i = 0; i < d.B * d.T; ++i) {
      const size_t b = static_cast<size_t>(i / d.T);
      first[static_cast<size_t>(i)] = i % d.T < sp.queries[b] ? sp.first_key[b] : d.S;
    }
  }
  if (o.documents != nullptr) {
    const Tensor& pos = o.documents->positions_BT;
    check_arg(pos, op, "documents.positions_BT", DType::kI32, {d.B, d.T});
    ST_CHECK(o.causal && d.S == d.T, op, ": packed documents need a causal mask and as many keys as queries");
    for (int64_t i = 0; i < d.B * d.T; ++i) first[static_cast<size_t>(i)] = i % d.T - pos.data<int32_t>()[i];
  }
  if (o.window > 0)
    for (int64_t i = 0; i < d.B * d.T; ++i) {
      int64_t& f = first[static_cast<size_t>(i)];
      f = std::max(f, i % d.T + d.S - d.T - o.window + 1);
    }
  return first;
}

// The first key tile that query rows [q0, q1) can see (all of them with no window): tiles
// start at multiples of `block_keys` as without a window, so a row's sum runs in the same
// order whatever it skips.
int64_t first_key_tile(const AttentionOptions& o, int64_t q0, int64_t shift, int64_t block_keys) {
  if (o.window <= 0) return 0;
  const int64_t lowest = std::max<int64_t>(0, q0 + shift - o.window + 1);
  return lowest / block_keys * block_keys;
}

double softmax_scale(const AttentionOptions& o, int64_t H) {
  return o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(H));
}

// A scaled score soft-capped (AttentionOptions::softcap > 0): cap · tanh(s / cap); s itself at 0.
template <typename F>
F capped(F s, double cap) {
  return cap > 0 ? static_cast<F>(cap * std::tanh(static_cast<double>(s) / cap)) : s;
}

template <typename F>
F dot(const F* a, const F* b, int64_t n) {
  F s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                       const Tensor& v_BTMH, const AttentionOptions& options) {
  const char* op = "attention_forward";
  if (!all_contiguous({&q_BTNH, &k_BTMH, &v_BTMH}))  // heads sliced from a stacked q|k|v tensor
    return cpu::attention_forward(out_BTNH, lse_BNT, contiguous(q_BTNH), contiguous(k_BTMH), contiguous(v_BTMH),
                                  options);
  const Dims d = check_qkv(q_BTNH, k_BTMH, v_BTMH, op, true);
  check_arg(out_BTNH, op, "out_BTNH", q_BTNH.dtype(), q_BTNH.shape());
  check_arg(lse_BNT, op, "lse_BNT", stats_dtype(q_BTNH.dtype()), {d.B, d.N, d.T});
  ST_CHECK(options.block_queries > 0 && options.block_keys > 0, op, ": tile sizes must be positive");
  const int64_t BQ = options.block_queries, BK = options.block_keys;
  const double scale = softmax_scale(options, d.H);
  const int64_t shift = d.S - d.T;  // query i is at position i + shift
  const std::vector<int64_t> first = first_keys(options, d, op);
  dispatch_real(q_BTNH, op, "q_BTNH", [&]<typename F>() {
    const F* q = q_BTNH.data<F>();
    const F* k = k_BTMH.data<F>();
    const F* v = v_BTMH.data<F>();
    F* out = out_BTNH.data<F>();
    F* lse = lse_BNT.data<F>();
    const int64_t q_tiles = (d.T + BQ - 1) / BQ;
#pragma omp parallel
    {
      std::vector<F> s(static_cast<size_t>(BK)), acc(static_cast<size_t>(BQ * d.H));
      std::vector<F> m(static_cast<size_t>(BQ)), l(static_cast<size_t>(BQ));
#pragma omp for collapse(3) schedule(dynamic)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t n = 0; n < d.N; ++n)
          for (int64_t qt = 0; qt < q_tiles; ++qt) {
            const int64_t kv = n / d.group, q0 = qt * BQ, q1 = std::min(d.T, q0 + BQ);
            std::fill(acc.begin(), acc.end(), F(0));
            std::fill(m.begin(), m.end(), -std::numeric_limits<F>::infinity());
            std::fill(l.begin(), l.end(), F(0));
            const int64_t k_end = options.causal ? q1 + shift : d.S;
            for (int64_t k0 = first_key_tile(options, q0, shift, BK); k0 < k_end; k0 += BK) {
              const int64_t k1 = std::min(k_end, k0 + BK);
              for (int64_t i = q0; i < q1; ++i) {
                const F* qi = q + ((b * d.T + i) * d.N + n) * d.H;
                const int64_t j_begin = std::max(k0, first[static_cast<size_t>(b * d.T + i)]);
                const int64_t j_end = options.causal ? std::min(k1, i + shift + 1) : k1;
                if (j_end <= j_begin) continue;
                F tile_max = -std::numeric_limits<F>::infinity();
                for (int64_t j = j_begin; j < j_end; ++j) {
                  const F sj =
                      capped(static_cast<F>(scale) * dot(qi, k + ((b * d.S + j) * d.M + kv) * d.H, d.H), options.softcap);
                  s[static_cast<size_t>(j - k0)] = sj;
                  tile_max = std::max(tile_max, sj);
                }
                const size_t r = static_cast<size_t>(i - q0);
                const F m_new = std::max(m[r], tile_max);
                const F correction = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first tile
                F* a = acc.data() + r * static_cast<size_t>(d.H);
                for (int64_t h = 0; h < d.H; ++h) a[h] *= correction;
                l[r] *= correction;
                for (int64_t j = j_begin; j < j_end; ++j) {
                  const F p = std::exp(s[static_cast<size_t>(j - k0)] - m_new);
                  l[r] += p;
                  const F* vj = v + ((b * d.S + j) * d.M + kv) * d.H;
                  for (int64_t h = 0; h < d.H; ++h) a[h] += p * vj[h];
                }
                m[r] = m_new;
              }
            }
            for (int64_t i = q0; i < q1; ++i) {
              const size_t r = static_cast<size_t>(i - q0);
              F* oi = out + ((b * d.T + i) * d.N + n) * d.H;
              const F* a = acc.data() + r * static_cast<size_t>(d.H);
              // a row that saw no key (key spans): output 0, log-sum-exp -inf
              for (int64_t h = 0; h < d.H; ++h) oi[h] = l[r] > 0 ? a[h] / l[r] : F(0);
              lse[(b * d.N + n) * d.T + i] = l[r] > 0 ? m[r] + std::log(l[r]) : -std::numeric_limits<F>::infinity();
            }
          }
    }
  });
}

void attention_backward(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                        const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                        const Tensor& lse_BNT, const AttentionOptions& options) {
  const char* op = "attention_backward";
  if (!all_contiguous({&q_BTNH, &k_BTMH, &v_BTMH, &dq_BTNH, &dk_BTMH, &dv_BTMH}))
    return attention_backward_on_contiguous(
        dq_BTNH, dk_BTMH, dv_BTMH, q_BTNH, k_BTMH, v_BTMH, {},
        [&](Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v) {
          cpu::attention_backward(dq, dk, dv, dout_BTNH, q, k, v, out_BTNH, lse_BNT, options);
        });
  const Dims d = check_qkv(q_BTNH, k_BTMH, v_BTMH, op, false);
  const DType dt = q_BTNH.dtype();
  check_arg(dout_BTNH, op, "dout_BTNH", dt, q_BTNH.shape());
  check_arg(out_BTNH, op, "out_BTNH", dt, q_BTNH.shape());
  check_arg(lse_BNT, op, "lse_BNT", stats_dtype(dt), {d.B, d.N, d.T});
  check_arg(dq_BTNH, op, "dq_BTNH", dt, q_BTNH.shape());
  check_arg(dk_BTMH, op, "dk_BTMH", dt, k_BTMH.shape());
  check_arg(dv_BTMH, op, "dv_BTMH", dt, v_BTMH.shape());
  const int64_t BQ = std::max<int64_t>(1, options.block_queries), BK = std::max<int64_t>(1, options.block_keys);
  const double scale = softmax_scale(options, d.H);
  const std::vector<int64_t> first = first_keys(options, d, op);
  dispatch_real(q_BTNH, op, "q_BTNH", [&]<typename F>() {
    const F* q = q_BTNH.data<F>();
    const F* k = k_BTMH.data<F>();
    const F* v = v_BTMH.data<F>();
    const F* o = out_BTNH.data<F>();
    const F* dout = dout_BTNH.data<F>();
    const F* lse = lse_BNT.data<F>();
    F* dq = dq_BTNH.data<F>();
    F* dk = dk_BTMH.data<F>();
    F* dv = dv_BTMH.data<F>();
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t kv = 0; kv < d.M; ++kv) {
        for (int64_t j = 0; j < d.T; ++j) {
          std::fill_n(dk + ((b * d.T + j) * d.M + kv) * d.H, d.H, F(0));
          std::fill_n(dv + ((b * d.T + j) * d.M + kv) * d.H, d.H, F(0));
        }
        for (int64_t n = kv * d.group; n < (kv + 1) * d.group; ++n) {
          std::vector<F> delta(static_cast<size_t>(d.T));
          for (int64_t i = 0; i < d.T; ++i) {
            const int64_t off = ((b * d.T + i) * d.N + n) * d.H;
            delta[static_cast<size_t>(i)] = dot(dout + off, o + off, d.H);  // D_i = rowsum(dO * O)
            std::fill_n(dq + off, d.H, F(0));
          }
          for (int64_t q0 = 0; q0 < d.T; q0 += BQ) {
            const int64_t q1 = std::min(d.T, q0 + BQ);
            const int64_t k_end = options.causal ? q1 : d.T;
            for (int64_t k0 = first_key_tile(options, q0, 0, BK); k0 < k_end; k0 += BK) {
              const int64_t k1 = std::min(k_end, k0 + BK);
              for (int64_t i = q0; i < q1; ++i) {
                const int64_t qoff = ((b * d.T + i) * d.N + n) * d.H;
                const F l_i = lse[(b * d.N + n) * d.T + i];
                const int64_t j_end = options.causal ? std::min(k1, i + 1) : k1;
                for (int64_t j = std::max(k0, first[static_cast<size_t>(b * d.T + i)]); j < j_end; ++j) {
                  const int64_t koff = ((b * d.T + j) * d.M + kv) * d.H;
                  const F raw = static_cast<F>(scale) * dot(q + qoff, k + koff, d.H);
                  const F s = capped(raw, options.softcap);
                  const F p = std::exp(s - l_i);
                  const F dp = dot(dout + qoff, v + koff, d.H);
                  // through the cap: d(cap tanh(r / cap)) / dr = 1 - tanh^2 = 1 - (s / cap)^2
                  const F slope = options.softcap > 0 ? static_cast<F>(1 - (s / options.softcap) * (s / options.softcap))
                                                      : F(1);
                  const F ds = p * (dp - delta[static_cast<size_t>(i)]) * slope * static_cast<F>(scale);
                  for (int64_t h = 0; h < d.H; ++h) {
                    dv[koff + h] += p * dout[qoff + h];
                    dq[qoff + h] += ds * k[koff + h];
                    dk[koff + h] += ds * q[qoff + h];
                  }
                }
              }
            }
          }
        }
      }
  });
}

void attention_forward_kv_cache(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& cache_k_BCMH, Tensor& cache_v_BCMH,
                                const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                                const Tensor& position_1, const AttentionOptions& options) {
  const char* op = "attention_forward_kv_cache";
  ST_CHECK(options.documents == nullptr, op, ": packed documents are for training sequences, not a KV cache");
  ST_CHECK(position_1.device().is_cpu() && position_1.dtype() == DType::kI32 && position_1.numel() == 1, op,
           ": `position_1` must be one i32 on the CPU, found ", position_1.str());
  ST_CHECK(k_BTMH.ndim() == 4 && cache_k_BCMH.ndim() == 4 && cache_v_BCMH.shape() == cache_k_BCMH.shape() &&
               cache_k_BCMH.size(0) == k_BTMH.size(0) && cache_k_BCMH.size(2) == k_BTMH.size(2) &&
               cache_k_BCMH.size(3) == k_BTMH.size(3) && cache_k_BCMH.dtype() == k_BTMH.dtype() &&
               cache_v_BCMH.dtype() == k_BTMH.dtype(),
           op, ": caches [B, C, M, H] of k's batch, heads, head dim and dtype expected, found ", cache_k_BCMH.str(),
           ", ", cache_v_BCMH.str(), " for k ", k_BTMH.str());
  const int64_t p = position_1.data<int32_t>()[0], T = k_BTMH.size(1), C = cache_k_BCMH.size(1);
  ST_CHECK(p >= 0 && p + T <= C, op, ": ", T, " new positions after ", p, " exceed the cache's ", C);
  Tensor k_rows = cache_k_BCMH.slice(1, p, p + T), v_rows = cache_v_BCMH.slice(1, p, p + T);
  copy(k_rows, k_BTMH);
  copy(v_rows, v_BTMH);
  cpu::attention_forward(out_BTNH, lse_BNT, q_BTNH, contiguous(cache_k_BCMH.slice(1, 0, p + T)),
                         contiguous(cache_v_BCMH.slice(1, 0, p + T)), options);
}

void attention_merge(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& part_out_BTNH, const Tensor& part_lse_BNT) {
  const char* op = "attention_merge";
  check_arg(out_BTNH, op, "out_BTNH");
  ST_CHECK(out_BTNH.ndim() == 4, op, ": `out_BTNH` must be 4-D, found ", out_BTNH.str());
  const int64_t B = out_BTNH.size(0), T = out_BTNH.size(1), N = out_BTNH.size(2), H = out_BTNH.size(3);
  const DType dt = out_BTNH.dtype();
  check_arg(part_out_BTNH, op, "part_out_BTNH", dt, out_BTNH.shape());
  check_arg(lse_BNT, op, "lse_BNT", stats_dtype(dt), {B, N, T});
  check_arg(part_lse_BNT, op, "part_lse_BNT", stats_dtype(dt), {B, N, T});
  dispatch_real(out_BTNH, op, "out_BTNH", [&]<typename F>() {
    using S = F;  // the CPU's stats dtype is the tensors' own
    F* out = out_BTNH.data<F>();
    const F* part = part_out_BTNH.data<F>();
    S* lse = lse_BNT.data<S>();
    const S* plse = part_lse_BNT.data<S>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < T; ++t) {
          S& l = lse[(b * N + n) * T + t];
          const double a = static_cast<double>(l), p = static_cast<double>(plse[(b * N + n) * T + t]);
          F* o = out + ((b * T + t) * N + n) * H;
          const F* po = part + ((b * T + t) * N + n) * H;
          if (p == -std::numeric_limits<double>::infinity()) continue;  // the part saw no key
          const double m = std::max(a, p);
          const double merged = m + std::log(std::exp(a - m) + std::exp(p - m));
          const double wa = std::exp(a - merged), wp = std::exp(p - merged);
          for (int64_t h = 0; h < H; ++h)
            o[h] = static_cast<F>(wa * static_cast<double>(o[h]) + wp * static_cast<double>(po[h]));
          l = static_cast<S>(merged);
        }
  });
}

}  // namespace cpu
}  // namespace shardtrain::ops
