// CUDA backend smoke test (label `cuda`): skips without a GPU or in CPU builds.
#include <gtest/gtest.h>

#include "backend/backend.h"

using namespace moetier;

TEST(BackendCuda, DeviceQuery) {
  if (!built_with_cuda()) GTEST_SKIP() << "CPU-only build";
  int n = cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  for (int d = 0; d < n; ++d) {
    std::string name = cuda_device_name(d);
    EXPECT_NE(name, "none");
    EXPECT_NE(name.find("GiB"), std::string::npos) << name;
  }
  EXPECT_EQ(cuda_device_name(n), "none");  // out of range is refused
}
