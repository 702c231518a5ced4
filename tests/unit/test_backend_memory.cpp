// Backend::memory_use (backend/backend.h): the bytes a backend holds through
// alloc() now and at peak. On the CPU backend alloc()'s buffers count (as the
// backend rounds them) and alloc_host()'s do not; a freed buffer leaves the
// count but not the peak; reset_memory_peak() starts a new peak at the bytes
// held now; the counter stays exact when buffers are made and freed on many
// threads.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "backend/backend.h"

namespace moetier {
namespace {

TEST(BackendMemory, CpuCountsAllocButNotAllocHost) {
  auto be = make_cpu_backend();
  ASSERT_TRUE(be->memory_use().has_value());
  EXPECT_EQ(be->memory_use()->now, 0u);
  EXPECT_EQ(be->memory_use()->peak, 0u);
  {
    DeviceBuffer a = be->alloc(1000);  // rounded to 64 bytes: 1024
    EXPECT_EQ(be->memory_use()->now, 1024u);
    DeviceBuffer h = be->alloc_host(1 << 20);
    EXPECT_EQ(be->memory_use()->now, 1024u) << "alloc_host is not device memory";
    {
      DeviceBuffer b = be->alloc(4096);
      EXPECT_EQ(be->memory_use()->now, 1024u + 4096u);
    }
    EXPECT_EQ(be->memory_use()->now, 1024u);
    EXPECT_EQ(be->memory_use()->peak, 1024u + 4096u) << "the peak outlives the buffer";
    be->reset_memory_peak();
    EXPECT_EQ(be->memory_use()->peak, 1024u);
    h.reset();
    EXPECT_EQ(be->memory_use()->now, 1024u) << "freeing a host buffer changes nothing";
  }
  EXPECT_EQ(be->memory_use()->now, 0u);
  EXPECT_EQ(be->memory_use()->peak, 1024u);
}

TEST(BackendMemory, MovedBuffersCountOnce) {
  auto be = make_cpu_backend();
  DeviceBuffer a = be->alloc(640);
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(be->memory_use()->now, 640u);
  a.reset();  // empty after the move: nothing to free
  EXPECT_EQ(be->memory_use()->now, 640u);
  b = be->alloc(128);  // the old 640 bytes are freed
  EXPECT_EQ(be->memory_use()->now, 128u);
  EXPECT_EQ(be->memory_use()->peak, 768u);
}

TEST(BackendMemory, CounterIgnoresPointersItNeverSaw) {
  DeviceMemoryCounter c;
  int x = 0, y = 0;
  c.on_alloc(&x, 100);
  EXPECT_FALSE(c.on_release(&y));
  EXPECT_EQ(c.use().now, 100u);
  EXPECT_TRUE(c.on_release(&x));
  EXPECT_FALSE(c.on_release(&x)) << "a second release of the same pointer counts nothing";
  EXPECT_EQ(c.use().now, 0u);
  EXPECT_EQ(c.use().peak, 100u);
}

TEST(BackendMemory, CounterIsExactAcrossThreads) {
  auto be = make_cpu_backend();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&be] {
      for (int i = 0; i < 200; ++i) {
        DeviceBuffer b = be->alloc(64 * size_t(1 + i % 7));
        DeviceBuffer c = be->alloc(64);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(be->memory_use()->now, 0u);
  EXPECT_GE(be->memory_use()->peak, 64u * 7 + 64);
  EXPECT_LE(be->memory_use()->peak, 4u * (64 * 7 + 64));
}

}  // namespace
}  // namespace moetier
