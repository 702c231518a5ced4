// cuda::stage_experts (kernels/cuda/stage.cu, label `cuda`; skips without a
// GPU): the predicted experts whose host flag is set are copied byte for byte
// from host memory (read in place) into their staging slots, the shadow table
// names those copies and every other entry as the table does, and the staged
// report gives id or -2 - id per slot. Odd region sizes (tails under 16
// bytes), an unaligned source (the byte path), a null region, several grids.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda_fixture.h"
#if MOETIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda.h"
#endif

using namespace moetier::testing;

TEST(CudaStage, CopiesHostExpertsAndWritesTheShadowTable) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
#if MOETIER_HAVE_CUDA
  using moetier::cuda::ExpertPtrs;
  auto ok = [](cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); };
  constexpr int kExperts = 9, kK = 5;
  const size_t bytes[6] = {4096, 4112, 2069, 128, 129, 70};  // gate, up, down, their scales
  size_t offset[6], slot = 0;
  for (int r = 0; r < 6; ++r) offset[r] = slot, slot += (bytes[r] + 255) / 256 * 256;
  const bool host[kExperts] = {false, true, false, true, true, false, false, false, true};
  std::mt19937 rng(77);
  std::vector<std::vector<uint8_t>> src(kExperts * 6);  // expert e, region r: its bytes
  std::vector<void*> allocs;
  std::vector<ExpertPtrs> table(kExperts);
  for (int e = 0; e < kExperts; ++e)
    for (int r = 0; r < 6; ++r) {
      if (e == 4 && r == 5) continue;  // a null region (no scales): skipped, null in the shadow
      std::vector<uint8_t>& b = src[size_t(e * 6 + r)];
      b.resize(bytes[r]);
      for (uint8_t& v : b) v = uint8_t(rng());
      const size_t skew = e == 8 && r == 0 ? 1 : 0;  // an unaligned source
      void* p = nullptr;
      if (host[e]) {
        ok(cudaMallocHost(&p, bytes[r] + skew));
        std::memcpy(static_cast<uint8_t*>(p) + skew, b.data(), bytes[r]);
      } else {
        ok(cudaMalloc(&p, bytes[r]));
        ok(cudaMemcpy(p, b.data(), bytes[r], cudaMemcpyHostToDevice));
      }
      allocs.push_back(p);
      const uint8_t* at = static_cast<const uint8_t*>(p) + skew;
      r < 3 ? (void)(table[size_t(e)].w[r] = at) : (void)(table[size_t(e)].s[r - 3] = at);
    }
  const std::vector<int32_t> ids = {3, 0, 8, 5, 4};
  ExpertPtrs *d_table = nullptr, *d_shadow = nullptr;
  uint8_t *d_host = nullptr, *d_staging = nullptr;
  int32_t *d_ids = nullptr, *d_staged = nullptr;
  ok(cudaMalloc(reinterpret_cast<void**>(&d_table), sizeof(ExpertPtrs) * kExperts));
  ok(cudaMalloc(reinterpret_cast<void**>(&d_shadow), sizeof(ExpertPtrs) * kExperts));
  ok(cudaMalloc(reinterpret_cast<void**>(&d_host), kExperts));
  ok(cudaMalloc(reinterpret_cast<void**>(&d_staging), slot * kK));
  ok(cudaMalloc(reinterpret_cast<void**>(&d_ids), sizeof(int32_t) * kK));
  ok(cudaMalloc(reinterpret_cast<void**>(&d_staged), sizeof(int32_t) * kK));
  std::vector<uint8_t> flags(host, host + kExperts);
  ok(cudaMemcpy(d_table, table.data(), sizeof(ExpertPtrs) * kExperts, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(d_host, flags.data(), kExperts, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(d_ids, ids.data(), sizeof(int32_t) * kK, cudaMemcpyHostToDevice));
  for (unsigned blocks : {1u, 3u, 32u}) {
    ok(cudaMemset(d_staging, 0, slot * kK));
    ok(cudaMemset(d_shadow, 0, sizeof(ExpertPtrs) * kExperts));
    moetier::cuda::StageLaunch a;
    a.table = d_table;
    a.host = d_host;
    a.blocks = blocks;
    a.ids = d_ids;
    a.k = kK;
    a.num_experts = kExperts;
    a.staging = d_staging;
    a.slot_bytes = slot;
    for (int r = 0; r < 6; ++r) a.offset[r] = offset[r], a.bytes[r] = bytes[r];
    a.shadow = d_shadow;
    a.staged = d_staged;
    moetier::cuda::stage_experts(a, nullptr);
    ok(cudaGetLastError());
    ok(cudaDeviceSynchronize());
    std::vector<int32_t> staged(kK);
    std::vector<ExpertPtrs> shadow(kExperts);
    std::vector<uint8_t> staging(slot * kK);
    ok(cudaMemcpy(staged.data(), d_staged, sizeof(int32_t) * kK, cudaMemcpyDeviceToHost));
    ok(cudaMemcpy(shadow.data(), d_shadow, sizeof(ExpertPtrs) * kExperts, cudaMemcpyDeviceToHost));
    ok(cudaMemcpy(staging.data(), d_staging, slot * kK, cudaMemcpyDeviceToHost));
    EXPECT_EQ(staged, (std::vector<int32_t>{3, -2, 8, -7, 4})) << blocks << " blocks";
    for (int e = 0; e < kExperts; ++e) {
      int j = -1;  // the slot e was staged in
      for (int s = 0; s < kK; ++s)
        if (ids[size_t(s)] == e && host[e]) j = s;
      for (int r = 0; r < 6; ++r) {
        const void* want = r < 3 ? table[size_t(e)].w[r] : table[size_t(e)].s[r - 3];
        const void* got = r < 3 ? shadow[size_t(e)].w[r] : shadow[size_t(e)].s[r - 3];
        if (j < 0 || !want) {
          EXPECT_EQ(got, want) << "expert " << e << " region " << r << ", " << blocks << " blocks";
          continue;
        }
        EXPECT_EQ(got, d_staging + size_t(j) * slot + offset[r])
            << "expert " << e << " region " << r;
        const uint8_t* copy = staging.data() + size_t(j) * slot + offset[r];
        EXPECT_EQ(std::vector<uint8_t>(copy, copy + bytes[r]), src[size_t(e * 6 + r)])
            << "expert " << e << " region " << r << ", " << blocks << " blocks";
      }
    }
  }
  for (int e = 0, i = 0; e < kExperts; ++e)
    for (int r = 0; r < 6; ++r) {
      if (e == 4 && r == 5) continue;
      host[e] ? (void)cudaFreeHost(allocs[size_t(i++)]) : (void)cudaFree(allocs[size_t(i++)]);
    }
  for (void* p :
       {static_cast<void*>(d_table), static_cast<void*>(d_shadow), static_cast<void*>(d_host),
        static_cast<void*>(d_staging), static_cast<void*>(d_ids), static_cast<void*>(d_staged)})
    cudaFree(p);
#endif
}
