// Casts between devices: the source bytes travel first, then the conversion runs where the
// output lives.
#include "ops/elementwise.h"

namespace shardtrain::ops {

void cast_across_devices(Tensor& out, const Tensor& in, Stream stream) {
  check_shape(in, out.shape(), "cast", "in");
  if (out.dtype() == in.dtype() && out.is_contiguous() && in.is_contiguous()) return copy(out, in, stream);
  Tensor staged = Tensor::empty(in.shape(), in.dtype(), out.device(), "cast staging", stream);
  if (in.is_contiguous()) {
    copy(staged, in, stream);
  } else {
    Tensor packed = Tensor::empty(in.shape(), in.dtype(), in.device(), "cast staging", stream);
    cast(packed, in, stream);
    copy(staged, packed, stream);
  }
  cast(out, staged, stream);
}

}  // namespace shardtrain::ops
