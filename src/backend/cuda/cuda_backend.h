// The CUDA backend's own interface beyond backend.h (backend/cuda/): what the
// runtime may ask a CUDA backend for when it knows it has one.
//
// Threading: as backend.h (one issuing thread). One non-blocking compute
// stream; host-to-device copies of pinned memory are ordered on it.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace moetier {

class CudaBackend;
// The backend as a CudaBackend, or null when it is another backend.
CudaBackend* as_cuda(Backend& be);

// Throws Error naming the call and CUDA's message when e != cudaSuccess.
void cuda_check(cudaError_t e, const char* what);

}  // namespace moetier
