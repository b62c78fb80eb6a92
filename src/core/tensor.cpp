// Tensor views and storage; every shape and range is checked before a view is formed.
#include "core/tensor.h"

#include <cstring>

#ifdef SHARDTRAIN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#endif

namespace shardtrain {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

void Shape::push_back(int64_t d) {
  ST_CHECK(ndim_ < kMaxDims, "tensor rank above the maximum of ", kMaxDims);
  ST_CHECK(d >= -1, "negative dimension ", d, " in shape");  // -1: inferred by view()
  dims_[static_cast<size_t>(ndim_++)] = d;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

// The stream is resolved once, so a block allocated while a graph capture's stream is
// current returns to that stream's free list (the graph's private pool) when freed.
Storage::Storage(size_t bytes, Device device, Stream stream, const char* what)
    : bytes_(bytes), device_(device), stream_(resolve(stream)), owned_(true) {
  if (bytes_ > 0) data_ = allocator_for(device).allocate(bytes_, stream_, what);
}

namespace {
thread_local void* t_current_compute_stream = nullptr;
}  // namespace

void* current_compute_stream() { return t_current_compute_stream; }
void set_current_compute_stream(void* handle) { t_current_compute_stream = handle; }

Storage::Storage(void* data, size_t bytes, Device device)
    : data_(data), bytes_(bytes), device_(device), owned_(false) {}

Storage::~Storage() {
  if (owned_ && data_ != nullptr) allocator_for(device_).deallocate(data_, bytes_, stream_);
}

namespace {

void set_contiguous_strides(const Shape& shape, std::array<int64_t, kMaxDims>& strides) {
  int64_t s = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = s;
    s *= shape[i];
  }
}

}  // namespace

namespace {
void check_concrete(const Shape& shape, const char* what) {
  for (int i = 0; i < shape.ndim(); ++i)
    ST_CHECK(shape[i] >= 0, what, ": shape ", shape.str(), " has a negative dimension");
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, const char* what, Stream stream) {
  check_concrete(shape, what);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  set_contiguous_strides(shape, t.strides_);
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype),
                                         device, stream, what);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, const char* what) {
  ST_CHECK(device.is_cpu(), "Tensor::zeros(", what, ") is host-only; use ops::fill on ", device.str());
  Tensor t = empty(shape, dtype, device, what);
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  check_concrete(shape, "from_blob");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  set_contiguous_strides(shape, t.strides_);
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape.numel()) * dtype_size(dtype),
                                         device);
  return t;
}

int64_t Tensor::size(int dim) const {
  const int d = dim < 0 ? dim + ndim() : dim;
  ST_CHECK(d >= 0 && d < ndim(), "dimension ", dim, " out of range for ", str());
  return shape_[d];
}

int64_t Tensor::stride(int dim) const {
  const int d = dim < 0 ? dim + ndim() : dim;
  ST_CHECK(d >= 0 && d < ndim(), "dimension ", dim, " out of range for ", str());
  return strides_[static_cast<size_t>(d)];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[static_cast<size_t>(i)] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  ST_CHECK(is_contiguous(), "view ", shape.str(), " of non-contiguous ", str());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.ndim(); ++i) {
    if (s[i] == -1) {
      ST_CHECK(infer < 0, "view ", shape.str(), ": more than one -1");
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    ST_CHECK(known > 0 && numel() % known == 0, "view ", shape.str(), " of ", str(),
             ": element count does not divide");
    s[infer] = numel() / known;
  }
  ST_CHECK(s.numel() == numel(), "view ", s.str(), " of ", str(), ": expected ", numel(),
           " elements, found ", s.numel());
  Tensor t = *this;
  t.shape_ = s;
  set_contiguous_strides(s, t.strides_);
  return t;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end) const {
  const int d = dim < 0 ? dim + ndim() : dim;
  ST_CHECK(d >= 0 && d < ndim(), "slice: dimension ", dim, " out of range for ", str());
  ST_CHECK(0 <= start && start <= end && end <= shape_[d], "slice [", start, ", ", end,
           ") out of range for dimension ", d, " of ", str());
  Tensor t = *this;
  t.offset_bytes_ += start * strides_[static_cast<size_t>(d)] * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  ST_CHECK(ndim() >= 1, "select on a 0-d tensor");
  ST_CHECK(0 <= i && i < shape_[0], "select index ", i, " out of range for ", str());
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.offset_bytes_ = offset_bytes_ + i * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  for (int k = 1; k < ndim(); ++k) {
    t.shape_.push_back(shape_[k]);
    t.strides_[static_cast<size_t>(k - 1)] = strides_[static_cast<size_t>(k)];
  }
  return t;
}

Tensor Tensor::flat_range(int64_t start, int64_t count) const {
  ST_CHECK(is_contiguous(), "flat_range of non-contiguous ", str());
  ST_CHECK(start >= 0 && count >= 0 && start + count <= numel(), "flat_range [", start, ", ",
           start + count, ") out of range for ", str());
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.offset_bytes_ = offset_bytes_ + start * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_.push_back(count);
  t.strides_[0] = 1;
  return t;
}

Tensor Tensor::base() const {
  ST_CHECK(defined(), "base() of an undefined tensor");
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = DType::kU8;
  t.shape_.push_back(static_cast<int64_t>(storage_->bytes()));
  t.strides_[0] = 1;
  return t;
}

Tensor Tensor::rebased(const Tensor& new_base) const {
  ST_CHECK(defined(), "rebased() of an undefined tensor");
  ST_CHECK(new_base.dtype() == DType::kU8 && new_base.ndim() == 1 && new_base.is_contiguous() &&
               new_base.nbytes() >= storage_->bytes(),
           "rebased(): expected a contiguous u8 block of at least ", storage_->bytes(), " bytes (the storage under ",
           str(), "), found ", new_base.str());
  Tensor t = *this;
  t.storage_ = new_base.storage_;
  t.offset_bytes_ = new_base.offset_bytes_ + offset_bytes_;
  return t;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_.str() + " " + device().str();
}

void Tensor::check_dtype(DType expected) const {
  ST_CHECK(dtype_ == expected, "tensor ", str(), ": expected dtype ", dtype_name(expected));
}

void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* arg) {
  ST_CHECK(t.shape() == expected, op, ": `", arg, "` expected shape ", expected.str(), ", found ",
           t.shape().str());
}

void check_dtype(const Tensor& t, DType expected, const char* op, const char* arg) {
  ST_CHECK(t.dtype() == expected, op, ": `", arg, "` expected dtype ", dtype_name(expected),
           ", found ", dtype_name(t.dtype()));
}

bool row_layout(const Tensor& t, int run_from, RowLayout& out) {
  const int n = t.ndim();
  if (run_from < 0 || run_from > n) return false;
  int64_t cols = 1;  // dims [run_from, n) packed
  for (int i = n - 1; i >= run_from; --i) {
    if (t.size(i) != 1 && t.stride(i) != cols) return false;
    cols *= t.size(i);
  }
  int64_t rows = 1, pitch = 0, step = 0;  // dims [0, run_from): one uniform step between runs
  for (int i = run_from - 1; i >= 0; --i) {
    if (t.size(i) != 1) {
      if (pitch == 0) pitch = step = t.stride(i);
      if (t.stride(i) != step) return false;
    }
    rows *= t.size(i);
    step *= t.size(i);
  }
  if (pitch == 0) pitch = cols;
  if (pitch < cols && rows > 1) return false;
  out = {rows, cols, pitch};
  return true;
}

bool row_layout(const Tensor& t, RowLayout& out) {
  int run_from = t.ndim();  // the longest packed run of trailing dims
  for (int64_t packed = 1; run_from > 0; --run_from) {
    const int i = run_from - 1;
    if (t.size(i) != 1 && t.stride(i) != packed) break;
    packed *= t.size(i);
  }
  return row_layout(t, run_from, out);
}

namespace {

void copy_impl(Tensor& dst, const Tensor& src, [[maybe_unused]] Stream stream, [[maybe_unused]] bool wait_for_host) {
  ST_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy: destination ", dst.str(),
           " and source ", src.str(), " differ in dtype or element count");
  if (dst.numel() == 0 || dst.raw_data() == src.raw_data()) return;
  const bool packed = dst.is_contiguous() && src.is_contiguous();
  RowLayout d{}, s{};
  if (!packed) {
    // a contiguous side takes the strided side's runs
    const bool ok = row_layout(dst, d) && row_layout(src, s);
    if (ok && dst.is_contiguous()) d = {s.rows, s.cols, s.cols};
    if (ok && src.is_contiguous()) s = {d.rows, d.cols, d.cols};
    ST_CHECK(ok && d.rows == s.rows && d.cols == s.cols, "copy: ", src.str(), " -> ", dst.str(),
             ": strided copies need both sides as runs of the same length");
    ST_CHECK(dst.device() == src.device(), "copy: strided copies stay on one device, found ", src.str(), " -> ",
             dst.str());
  }
  const size_t elem = dtype_size(dst.dtype());
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (packed) {
      std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
      return;
    }
    for (int64_t r = 0; r < d.rows; ++r)
      std::memcpy(static_cast<char*>(dst.raw_data()) + static_cast<size_t>(r * d.pitch) * elem,
                  static_cast<const char*>(src.raw_data()) + static_cast<size_t>(r * s.pitch) * elem,
                  static_cast<size_t>(d.cols) * elem);
    return;
  }
#ifdef SHARDTRAIN_WITH_CUDA
  const auto st = static_cast<cudaStream_t>(resolve(stream).handle);
  if (packed) {
    ST_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault, st));
  } else {
    ST_CUDA_CHECK(cudaMemcpy2DAsync(dst.raw_data(), static_cast<size_t>(d.pitch) * elem, src.raw_data(),
                                    static_cast<size_t>(s.pitch) * elem, static_cast<size_t>(d.cols) * elem,
                                    static_cast<size_t>(d.rows), cudaMemcpyDefault, st));
  }
  if (dst.device().is_cpu() && wait_for_host) ST_CUDA_CHECK(cudaStreamSynchronize(st));
#else
  ST_THROW("copy: ", src.str(), " -> ", dst.str(), " needs the CUDA backend");
#endif
}

}  // namespace

void copy(Tensor& dst, const Tensor& src, Stream stream) { copy_impl(dst, src, stream, true); }

void copy_async(Tensor& dst, const Tensor& src, Stream stream) { copy_impl(dst, src, stream, false); }

Tensor contiguous(const Tensor& t, Stream stream) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), "contiguous copy", stream);
  copy(c, t, stream);
  return c;
}

void synchronize([[maybe_unused]] Device device) {
  if (device.is_cpu()) return;
#ifdef SHARDTRAIN_WITH_CUDA
  ST_CUDA_CHECK(cudaSetDevice(device.index));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

void check_contiguous(const Tensor& t, const char* op, const char* arg) {
  ST_CHECK(t.is_contiguous(), op, ": `", arg, "` must be contiguous, found strided ", t.str());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  ST_CHECK(a.device() == b.device(), op, ": tensors on different devices (", a.device().str(), " and ",
           b.device().str(), ")");
}

}  // namespace shardtrain
