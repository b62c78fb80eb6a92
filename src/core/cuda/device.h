// CUDA device set-up for the process: device count, selection, and the caching allocator
// registered for each device used. Only for code built with the CUDA backend.
#pragma once

#include <string>

#include "core/allocator.h"

namespace shardtrain::cuda {

// Number of visible CUDA devices; 0 when there is no usable driver or device (never throws).
int device_count();
// Makes `index` current, checks that this build has kernels it can run (check_kernel_image)
// and registers its caching allocator (idempotent).
void init_device(int index);
// Throws, saying which architectures the build has and how to build for this device, when none
// of this build's kernel images or PTX runs on device `index`.
void check_kernel_image(int index);
// The message of that error: `archs` as CMAKE_CUDA_ARCHITECTURES listed them ("90a"), the
// device's compute capability, name and index.
std::string no_kernel_image_message(const std::string& archs, int major, int minor, const std::string& name,
                                    int index);
// The device's name as the driver reports it ("NVIDIA H100 80GB HBM3").
std::string device_name(int index);
// Dense bf16 tensor-core peak in FLOP/s from the datasheet (H100 SXM / H200: 989e12, H100
// PCIe: 756e12, A100: 312e12); 0 when the device is not in that table. For MFU.
double dense_bf16_peak_flops(int index);
// Dense bf16 tensor-core FLOPs per clock cycle of the whole device (SMs x 4096 on Hopper, x 2048
// on Ampere); 0 for other architectures. Times an SM clock, the peak at that clock: the
// datasheet's peak is this at its boost clock (989e12 = 132 x 4096 x 1.83 GHz on an H100 SXM).
double dense_bf16_flops_per_clock(int index);
// Peak memory bandwidth in bytes/s from the memory clock and bus width the driver reports
// (double data rate): 3.35e12 for an H100 SXM.
double memory_bandwidth(int index);
// The device's compute capability as major * 10 + minor (90 for an H100 or H200).
int compute_capability(int index);
// Dense FP8 tensor-core peak in FLOP/s: twice the bf16 peak on Hopper (1,979e12 on an H100 SXM
// and an H200); 0 where dense_bf16_peak_flops is 0 or the device has no FP8 tensor cores.
double dense_fp8_peak_flops(int index);
// The device's memory in bytes, as the driver reports it.
int64_t total_memory_bytes(int index);
// The device's PCI bus id ("0000:00:06.0"): how NVML and nvidia-smi name it (core/gpu_monitor.h).
std::string pci_bus_id(int index);
// Returns cached, unused device memory of `index` to the driver (synchronises the device).
void empty_cache(int index);

}  // namespace shardtrain::cuda
