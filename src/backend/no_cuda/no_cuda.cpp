// A build without CUDA: no device, and make_cuda_backend says why.
#include "backend/backend.h"
#include "core/error.h"

namespace moetier {

int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return "none"; }
bool built_with_cuda() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(
      "--backend cuda: this moetier was built without CUDA (configure with nvcc on the PATH, or "
      "-DMOETIER_CUDA=ON)");
}

}  // namespace moetier
