// Tensor: a typed, shaped, strided view over shared storage on one device. Views (view,
// slice, select, from_blob) share bytes; only `empty`/`zeros` allocate. Shapes use the
// project's legend (B T D F N M H V L) in variable names, e.g. x_BTD.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace shardtrain {

constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It begin, It end) {
    for (It it = begin; it != end; ++it) push_back(static_cast<int64_t>(*it));
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  void push_back(int64_t d);
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 37, 64]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

// Owns (or borrows) a block of bytes on a device.
class Storage {
 public:
  // Allocates `bytes` from the device's allocator; `what` names the use in OOM errors.
  Storage(size_t bytes, Device device, Stream stream, const char* what);
  // Borrows memory owned elsewhere; never freed here.
  Storage(void* data, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Stream stream_;
  bool owned_ = false;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      const char* what = "tensor", Stream stream = {});
  // CPU only: memset. Device tensors are zeroed by ops::fill.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      const char* what = "tensor");
  // A contiguous view of memory owned elsewhere (e.g. a parameter inside a flat buffer).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t stride(int dim) const;
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + offset_bytes_;
  }
  // Typed pointer; throws if T does not match the dtype.
  template <typename T>
  T* data() const {
    check_dtype(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }

  // Same elements, new shape (contiguous tensors only; one dim may be -1).
  Tensor view(const Shape& shape) const;
  // Elements [start, end) along `dim`; shares storage.
  Tensor slice(int dim, int64_t start, int64_t end) const;
  // Index `i` along dim 0, dropping that dim.
  Tensor select(int64_t i) const;
  // 1-D view of elements [start, start + count) of a contiguous tensor.
  Tensor flat_range(int64_t start, int64_t count) const;
  // The whole storage under this tensor (and under every view sharing it) as a contiguous
  // 1-D u8 tensor; rebased(b) is this tensor's view (offset, shape, strides) carried over to
  // another such block `b` of at least the storage's bytes, on any device. Together they move
  // a tensor with its views in one copy (activation offload: model/activation_offload.h).
  Tensor base() const;
  Tensor rebased(const Tensor& new_base) const;

  std::string str() const;  // "f32[2, 37, 64] cpu"
  void check_dtype(DType expected) const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_bytes_ = 0;
  Shape shape_;
  std::array<int64_t, kMaxDims> strides_{};  // in elements
  DType dtype_ = DType::kF32;
};

// A tensor as `rows` runs of `cols` contiguous elements, each run `pitch` elements after the
// last: every contiguous tensor (one run per leading index), and the views the model takes
// of a stacked tensor, e.g. the query heads of a [B, T, (N + 2M) * H] q|k|v product seen
// as [B, T, N, H] (rows B * T, cols N * H, pitch (N + 2M) * H). `cols` spans the longest
// packed run of trailing dims; the leading dims must step uniformly by `pitch`.
struct RowLayout {
  int64_t rows = 0, cols = 0, pitch = 0;
};
// t's layout with its dims from `run_from` on as one run (rows: the product of the dims
// before); false when t is not such a view (then `out` is unspecified).
bool row_layout(const Tensor& t, int run_from, RowLayout& out);
// The same with the longest packed run of trailing dims as the run.
bool row_layout(const Tensor& t, RowLayout& out);

// dst = src element for element: same dtype and element count, both contiguous, or (same
// device) both with row layouts of the same rows and cols; any devices (host <-> device and
// device <-> device through the CUDA runtime, ordered on `stream`). When dst is on the host
// and src on a device, returns after the bytes have arrived.
void copy(Tensor& dst, const Tensor& src, Stream stream = {});
// copy() without the host wait: a transfer to the host is only queued on `stream`, and `dst`
// holds the data once the stream has reached this point (an event, a synchronisation). For
// page-locked host memory (cuda::PinnedBuffer); host-to-host copies still run at once.
void copy_async(Tensor& dst, const Tensor& src, Stream stream);

// t itself when contiguous, else a contiguous copy (same device, ordered on `stream`).
Tensor contiguous(const Tensor& t, Stream stream = {});

// Checks used at op entry: name the op and the argument in the message.
void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* arg);
void check_dtype(const Tensor& t, DType expected, const char* op, const char* arg);
void check_contiguous(const Tensor& t, const char* op, const char* arg);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);

}  // namespace shardtrain
