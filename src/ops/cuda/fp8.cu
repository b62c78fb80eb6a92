// CUDA FP8 quantisation: amax passes (tensor, per row, per column) into u32 bit patterns of
// |x| (integer atomics order non-negative floats, NaN above infinity), then one tiled pass that
// writes the operand of x's rows and/or of its columns (x^T) with their scales. A 128x128 tile
// of x is held in registers by a block, so the 1x128 and 128x128 groups are reduced in that pass.
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"
#include "ops/fp8.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kTile = 128;         // rows and columns of x per tile
constexpr int kTileThreads = 256;  // 16 groups of 8 rows x 16 chunks of 8 columns
constexpr int kWarps = kTileThreads / 32;

// amax[0] = max |x| over every element (bits), one atomic per block (block_amax). With
// `packed` (C and pitch multiples of a 16-byte pack, x aligned) a thread reads a pack at a time.
template <typename T>
__global__ void amax_all_kernel(uint32_t* amax, const T* x, int64_t R, int64_t C, int64_t pitch, bool packed) {
  uint32_t m = 0;
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, step = int64_t{gridDim.x} * blockDim.x;
  if (packed) {
    constexpr int kSize = Pack<T>::kSize;
    const int64_t row_packs = C / kSize, n = R * row_packs;
    for (int64_t i = start; i < n; i += step) {
      const int64_t at = pitch == C ? i * kSize : i / row_packs * pitch + i % row_packs * kSize;
      const Pack<T> p = *reinterpret_cast<const Pack<T>*>(x + at);
#pragma unroll
      for (int k = 0; k < kSize; ++k) m = max(m, magnitude_bits(to_f32(p.v[k])));
    }
  } else {
    for (int64_t i = start; i < R * C; i += step) m = max(m, magnitude_bits(to_f32(x[i / C * pitch + i % C])));
  }
  block_amax(amax, m);
}

// Loads x's 8 values [row, col, col + 8) as f32, zero past R or C. `vec`: rows 16-byte aligned
// (x and the pitch), so a chunk wholly inside x is one or two 16-byte loads.
template <typename T>
__device__ __forceinline__ void load8(float v[8], const T* __restrict__ x, int64_t row, int64_t col, int64_t R,
                                      int64_t C, int64_t pitch, bool vec) {
  if (row < R && col + 8 <= C && vec) {
    if constexpr (sizeof(T) <= 4) {
      constexpr int kSize = Pack<T>::kSize;
#pragma unroll
      for (int p = 0; p < 8 / kSize; ++p) {
        const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(x + row * pitch + col + p * kSize);
#pragma unroll
        for (int e = 0; e < kSize; ++e) v[p * kSize + e] = to_f32(pk.v[e]);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = row < R && col + e < C ? to_f32(x[row * pitch + col + e]) : 0.0f;
}

// amax[r] = max over row r (bits): one warp per row, 8 values a lane at a time.
template <typename T>
__global__ void amax_rows_kernel(uint32_t* amax, const T* x, int64_t R, int64_t C, int64_t pitch, bool vec) {
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; r < R; r += warps) {
    uint32_t m = 0;
    for (int64_t c = 8 * (threadIdx.x % 32); c < C; c += 256) {
      float v[8];
      load8(v, x, r, c, R, C, pitch, vec);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, magnitude_bits(v[e]));
    }
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) amax[r] = m;
  }
}

// amax[c] = max over column c (bits): a thread per 8 columns over a range of rows, then atomics.
template <typename T>
__global__ void amax_cols_kernel(uint32_t* amax, const T* x, int64_t R, int64_t C, int64_t pitch, int64_t rows_per,
                                 bool vec) {
  const int64_t c = 8 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x);
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(R, r0 + rows_per);
  uint32_t m[8] = {};
  for (int64_t r = r0; r < r1; ++r) {
    float v[8];
    load8(v, x, r, c, R, C, pitch, vec);
#pragma unroll
    for (int e = 0; e < 8; ++e) m[e] = max(m[e], magnitude_bits(v[e]));
  }
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if (c + e < C) atomicMax(&amax[c + e], m[e]);
}

struct TileArgs {
  int64_t R, C, pitch;  // x: R rows of C values, rows `pitch` elements apart
  bool vec;             // x and its pitch 16-byte aligned (load8)
  Fp8Scaling scaling;
  bool e4m3;
  float fmax;
  // q: x's rows, P columns (zero past C); qt: x's columns, PR columns (zero past R)
  uint8_t* q;
  float* q_scale;
  int64_t P, q_block_ld;  // q_block_ld: a 128x128 scale row's entries
  uint8_t* qt;
  float* qt_scale;
  int64_t PR, qt_block_ld;
  const uint32_t* amax_rows;  // kTensor: [1]; kRow: per row of x (q's groups)
  const uint32_t* amax_cols;  // kRow: per column of x (qt's groups)
};

__device__ __forceinline__ uint32_t half_warp_max(uint32_t v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The codes of v[0..7] * factor, v[e] in byte e.
__device__ __forceinline__ uint2 codes8(const float v[8], float factor, bool e4m3) {
  uint32_t word[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t w = 0;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const float2 pair = make_float2(v[4 * h + 2 * p] * factor, v[4 * h + 2 * p + 1] * factor);
      const uint32_t two = e4m3 ? __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3)
                                : __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E5M2);
      w |= (two & 0xffffu) << (16 * p);
    }
    word[h] = w;
  }
  return make_uint2(word[0], word[1]);
}

// One 128x128 tile of x. Thread t holds 8 rows x 8 columns of it in registers: rows
// r0 + 8 (t / 16) .. + 8, columns c0 + 8 (t % 16) .. + 8 (16-byte loads, a half-warp per row of the
// tile). q's codes go straight out, 8 bytes a row; qt's codes (x's columns) pass through 16 KiB of
// shared memory as 8-byte units, swizzled (unit g of row c at g ^ (c / 8)) so that both the
// writes and the half-warp reads of a row hit distinct banks, and go out 8 bytes a lane. Group
// maxima: rows over a half-warp (1x128), columns over the 16 threads sharing them (1x128 of
// qt), the tile over the block (128x128); tensor and row scalings read the amax passes'.
template <typename T>
__global__ void __launch_bounds__(kTileThreads) quantize_tile_kernel(const T* __restrict__ x, TileArgs a) {
  __shared__ __align__(16) uint8_t transposed[kTile * kTile];  // [x column][x row], swizzled units
  __shared__ uint32_t column_max[kWarps][kTile];
  __shared__ uint32_t warp_amax[kWarps];
  const int t = threadIdx.x, cc = t % 16, g = t / 16, warp = t / 32, lane = t % 32;
  const int64_t rb = blockIdx.y, cb = blockIdx.x, r0 = rb * kTile, c0 = cb * kTile;
  const int64_t col = c0 + 8 * cc, row0 = r0 + 8 * g;
  float v[8][8];
  if constexpr (sizeof(T) <= 4) {
    if (a.vec && r0 + kTile <= a.R && c0 + kTile <= a.C) {
      // a tile inside x: every 16-byte load issued before any is used
      constexpr int kPacks = 8 / Pack<T>::kSize;
      Pack<T> raw[8][kPacks];
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int p = 0; p < kPacks; ++p)
          raw[k][p] = *reinterpret_cast<const Pack<T>*>(x + (row0 + k) * a.pitch + col + p * Pack<T>::kSize);
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = to_f32(raw[k][e / Pack<T>::kSize].v[e % Pack<T>::kSize]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) load8(v[k], x, row0 + k, col, a.R, a.C, a.pitch, a.vec);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) load8(v[k], x, row0 + k, col, a.R, a.C, a.pitch, a.vec);
  }

  float q_factor[8], qt_factor[8];
  if (a.scaling == Fp8Scaling::kTensor) {
    const float f = fp8_quantize_factor(__uint_as_float(a.amax_rows[0]), a.fmax);
#pragma unroll
    for (int k = 0; k < 8; ++k) q_factor[k] = qt_factor[k] = f;
  } else if (a.scaling == Fp8Scaling::kRow) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      q_factor[k] = a.q != nullptr && row0 + k < a.R ? fp8_quantize_factor(__uint_as_float(a.amax_rows[row0 + k]), a.fmax)
                                                     : 1.0f;
      qt_factor[k] = a.qt != nullptr && col + k < a.C
                         ? fp8_quantize_factor(__uint_as_float(a.amax_cols[col + k]), a.fmax)
                         : 1.0f;
    }
  } else if (a.scaling == Fp8Scaling::kBlock1x128) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t m = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, magnitude_bits(v[k][e]));
      q_factor[k] = fp8_quantize_factor(__uint_as_float(half_warp_max(m)), a.fmax);
    }
    if (a.qt != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        uint32_t m = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) m = max(m, magnitude_bits(v[k][e]));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 16));  // the other half-warp: the next 8 rows
        if (lane < 16) column_max[warp][8 * cc + e] = m;
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        uint32_t m = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m = max(m, column_max[w][8 * cc + e]);
        qt_factor[e] = fp8_quantize_factor(__uint_as_float(m), a.fmax);
      }
    }
  } else {  // kBlock128x128
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, magnitude_bits(v[k][e]));
    m = warp_max(m);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max(m, warp_amax[w]);
    const float f = fp8_quantize_factor(__uint_as_float(m), a.fmax);
#pragma unroll
    for (int k = 0; k < 8; ++k) q_factor[k] = qt_factor[k] = f;
  }

  if (a.q != nullptr && col < a.P) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t row = row0 + k;
      if (row >= a.R) break;
      *reinterpret_cast<uint2*>(a.q + row * a.P + col) = codes8(v[k], q_factor[k], a.e4m3);
      if (cc == 0) {
        if (a.scaling == Fp8Scaling::kRow && cb == 0) a.q_scale[row] = 1.0f / q_factor[k];
        if (a.scaling == Fp8Scaling::kBlock1x128) a.q_scale[cb * a.R + row] = 1.0f / q_factor[k];
      }
    }
  }
  if (a.qt != nullptr) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float column[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) column[k] = v[k][e];
      const int c = 8 * cc + e;  // the tile's column: a row of the transposed codes
      *reinterpret_cast<uint2*>(transposed + c * kTile + 8 * (g ^ cc)) = codes8(column, qt_factor[e], a.e4m3);
      if (g == 0 && col + e < a.C) {
        if (a.scaling == Fp8Scaling::kRow && rb == 0) a.qt_scale[col + e] = 1.0f / qt_factor[e];
        if (a.scaling == Fp8Scaling::kBlock1x128) a.qt_scale[rb * a.C + col + e] = 1.0f / qt_factor[e];
      }
    }
    __syncthreads();
    // a half-warp per row of the transposed tile, a lane per 8-byte unit
    const int l = t % 16;
#pragma unroll
    for (int it = 0; it < kTile / 16; ++it) {
      const int c = g + 16 * it;
      const int64_t out_row = c0 + c, out_col = r0 + 8 * l;
      if (out_row < a.C && out_col < a.PR)
        *reinterpret_cast<uint2*>(a.qt + out_row * a.PR + out_col) =
            *reinterpret_cast<const uint2*>(transposed + c * kTile + 8 * (l ^ (c / 8)));
    }
  }
  if (t == 0) {
    if (a.scaling == Fp8Scaling::kTensor && rb == 0 && cb == 0) {
      if (a.q != nullptr) a.q_scale[0] = 1.0f / q_factor[0];
      if (a.qt != nullptr) a.qt_scale[0] = 1.0f / q_factor[0];
    }
    if (a.scaling == Fp8Scaling::kBlock128x128) {
      if (a.q != nullptr && r0 < a.R) a.q_scale[rb * a.q_block_ld + cb] = 1.0f / q_factor[0];
      if (a.qt != nullptr && c0 < a.C) a.qt_scale[cb * a.qt_block_ld + rb] = 1.0f / q_factor[0];
    }
  }
}

void allocate(Fp8Operand& q, int64_t rows, int64_t cols, const Fp8QuantizeOptions& o, Device dev, Stream s) {
  const int64_t P = fp8_padded(cols, o.scaling);
  q.scaling = o.scaling;
  q.cols = cols;
  q.data_RP = Tensor::empty({rows, P}, o.format, dev, "FP8 operand", s);
  const Shape scale_shape = fp8_scale_shape(o.scaling, rows, P);
  q.scale = Tensor::empty(scale_shape, DType::kF32, dev, "FP8 scales", s);
  // a 128x128 scale row's padding entries (past ceil(P / 128)) are 1, as on the CPU
  if (o.scaling == Fp8Scaling::kBlock128x128 && scale_shape[1] != (P + 127) / 128) fill(q.scale, 1.0, s);
}

}  // namespace

void fp8_quantize(Fp8Operand* q_RC, Fp8Operand* qt_CR, const Tensor& x_RC, const Fp8QuantizeOptions& o, Stream s) {
  const char* op = "fp8_quantize";
  ST_CHECK(x_RC.device().is_cuda(), op, ": `x_RC` expected on a CUDA device, found ", x_RC.str());
  ST_CHECK(is_fp8(o.format), op, ": the format must be f8e4m3 or f8e5m2, found ", dtype_name(o.format));
  RowLayout l;
  ST_CHECK(x_RC.ndim() == 2 && row_layout(x_RC, 1, l), op, ": `x_RC` must be 2-D with contiguous rows, found ",
           x_RC.str());
  const int64_t R = l.rows, C = l.cols;
  const Device dev = x_RC.device();
  if (q_RC) allocate(*q_RC, R, C, o, dev, s);
  if (qt_CR) allocate(*qt_CR, C, R, o, dev, s);
  if ((!q_RC && !qt_CR) || R == 0 || C == 0) return;
  const cudaStream_t stream = stream_of(s);
  TileArgs a{};
  a.R = R;
  a.C = C;
  a.pitch = l.pitch;
  a.scaling = o.scaling;
  a.e4m3 = o.format == DType::kF8E4M3;
  a.fmax = fp8_max(o.format);
  if (q_RC) {
    a.q = static_cast<uint8_t*>(q_RC->data_RP.raw_data());
    a.q_scale = q_RC->scale.data<float>();
    a.P = q_RC->padded_cols();
    a.q_block_ld = q_RC->scale.ndim() == 2 ? q_RC->scale.size(1) : 0;
  }
  if (qt_CR) {
    a.qt = static_cast<uint8_t*>(qt_CR->data_RP.raw_data());
    a.qt_scale = qt_CR->scale.data<float>();
    a.PR = qt_CR->padded_cols();
    a.qt_block_ld = qt_CR->scale.ndim() == 2 ? qt_CR->scale.size(1) : 0;
  }
  // amax passes for the scalings whose groups span tiles
  Tensor amax_rows, amax_cols;
  dispatch_float(x_RC.dtype(), op, [&]<typename T>() {
    const T* x = static_cast<const T*>(x_RC.raw_data());
    constexpr int kSize = Pack<T>::kSize;
    a.vec = sizeof(T) <= 4 && (l.pitch * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const bool packed = a.vec && C % kSize == 0;  // amax_all_kernel: whole packs per row
    if (o.scaling == Fp8Scaling::kTensor) {
      if (o.amax.defined()) {
        ST_CHECK(o.amax.device() == dev && o.amax.dtype() == DType::kI32 && o.amax.numel() == 1, op,
                 ": the amax must be one i32 on ", dev.str(), ", found ", o.amax.str());
        amax_rows = o.amax;
      } else {
        amax_rows = Tensor::empty({1}, DType::kI32, dev, "FP8 amax", s);
      }
      if (!(o.amax.defined() && o.amax_ready)) {
        ST_CUDA_CHECK(cudaMemsetAsync(amax_rows.raw_data(), 0, sizeof(uint32_t), stream));
        amax_all_kernel<T><<<grid_for(R * C / (packed ? kSize : 1), 256), 256, 0, stream>>>(
            static_cast<uint32_t*>(amax_rows.raw_data()), x, R, C, l.pitch, packed);
        ST_CUDA_CHECK_LAUNCH();
      }
    } else if (o.scaling == Fp8Scaling::kRow) {
      if (q_RC) {
        amax_rows = Tensor::empty({R}, DType::kI32, dev, "FP8 row amax", s);
        amax_rows_kernel<T><<<grid_for(R * 32, 256), 256, 0, stream>>>(static_cast<uint32_t*>(amax_rows.raw_data()),
                                                                        x, R, C, l.pitch, a.vec);
        ST_CUDA_CHECK_LAUNCH();
      }
      if (qt_CR) {
        amax_cols = Tensor::empty({C}, DType::kI32, dev, "FP8 column amax", s);
        ST_CUDA_CHECK(cudaMemsetAsync(amax_cols.raw_data(), 0, C * sizeof(uint32_t), stream));
        const int64_t col_blocks = (C + 8 * 256 - 1) / (8 * 256);  // a thread per 8 columns
        const int64_t row_pieces = std::clamp<int64_t>(4 * sm_count(dev.index) / std::max<int64_t>(col_blocks, 1), 1,
                                                       std::max<int64_t>(R / 64, 1));
        const int64_t rows_per = (R + row_pieces - 1) / row_pieces;
        const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>((R + rows_per - 1) / rows_per));
        amax_cols_kernel<T><<<grid, 256, 0, stream>>>(static_cast<uint32_t*>(amax_cols.raw_data()), x, R, C, l.pitch,
                                                      rows_per, a.vec);
        ST_CUDA_CHECK_LAUNCH();
      }
    }
    a.amax_rows = amax_rows.defined() ? static_cast<const uint32_t*>(amax_rows.raw_data()) : nullptr;
    a.amax_cols = amax_cols.defined() ? static_cast<const uint32_t*>(amax_cols.raw_data()) : nullptr;
    // tiles over x's rows up to PR (qt's padded columns) and its columns up to P
    const int64_t rows = qt_CR ? a.PR : R, cols = q_RC ? a.P : C;
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
    quantize_tile_kernel<T><<<grid, kTileThreads, 0, stream>>>(x, a);
    ST_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace shardtrain::ops::cuda
