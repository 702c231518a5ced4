// The compute backend: the only code that touches the CUDA runtime.
// CPU-only builds link stub.cpp, where every query answers "no device".
#pragma once

#include <string>

namespace moetier::backend {

// Number of usable CUDA devices (0 in CPU builds or without a GPU).
int cuda_device_count();
// "NVIDIA H200, 139 GiB" or "none".
std::string cuda_device_name(int device);
// Whether this binary was built with the CUDA backend.
bool built_with_cuda();

}  // namespace moetier::backend
