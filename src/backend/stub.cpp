#include "backend/backend.h"

namespace moetier::backend {
int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return "none"; }
bool built_with_cuda() { return false; }
}  // namespace moetier::backend
