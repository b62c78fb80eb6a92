// CUDA device set-up for the process: device count, selection, and the caching allocator
// registered for each device used. Only for code built with the CUDA backend.
#pragma once

#include "core/allocator.h"

namespace shardtrain::cuda {

// Number of visible CUDA devices; 0 when there is no usable driver or device (never throws).
int device_count();
// Makes `index` current and registers its caching allocator (idempotent).
void init_device(int index);
// Returns cached, unused device memory of `index` to the driver (synchronises the device).
void empty_cache(int index);

}  // namespace shardtrain::cuda
