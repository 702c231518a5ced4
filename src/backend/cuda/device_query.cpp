// Device queries (no backend needed): count and names of CUDA devices.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "backend/backend.h"

namespace moetier {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "none";
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s, %.0f GiB", p.name,
                double(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
  return buf;
}

bool built_with_cuda() { return true; }

}  // namespace moetier
