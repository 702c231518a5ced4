// What a kernel's code costs to fetch when it is not in the SM's instruction
// caches, or not in L2 either: the decode step runs each of its kernels once
// a layer, with five others (and about 100 MB of weights through L2) in
// between, so its blocks may start on cold code every time.
//
// straight<S, SALT>: every thread runs S steps of straight-line code, each
// step 4 independent chains of an xor and a multiply-add with the step's own
// constants (8 instructions, 128 bytes of SASS), so the code is about 128 S
// bytes and nothing repeats. Thread 0 of each block records clock64 at the
// first step and after the last. Arms, each a median over the blocks, then
// over 7 repeats:
//  - warm: the kernel right after itself;
//  - L1i cold: after a different 256 KB kernel on every SM (its code left the
//    SMs' instruction caches, not L2);
//  - L2 cold: that, then 256 MB read through L2 (the code comes from HBM).
// At 1 block (one SM's fetch) and one block per SM (every SM fetching the
// same lines). Prints one line per arm; cycles and us at the SM clock.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench/cuda_check.cuh"

namespace {

template <int S, uint32_t SALT>
__global__ void __launch_bounds__(128) straight(const uint32_t* in, uint32_t* out, long long* t) {
  uint32_t a = in[0], b = in[1], c = in[2], d = in[3];
  const uint32_t y = in[4];
  const long long t0 = clock64();
#pragma unroll
  for (int i = 0; i < S; ++i) {
    const uint32_t k = (uint32_t(i) + SALT) * 0x9E3779B9u;
    a = (a ^ k) * (k | 1u) + y;
    b = (b ^ (k >> 3)) * ((k >> 1) | 1u) + y;
    c = (c ^ (k >> 5)) * ((k >> 2) | 1u) + y;
    d = (d ^ (k >> 7)) * ((k >> 4) | 1u) + y;
  }
  const long long t1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = a ^ b ^ c ^ d;
  if (threadIdx.x == 0) t[2 * blockIdx.x] = t0, t[2 * blockIdx.x + 1] = t1;
}

__global__ void stream_read(const uint4* p, size_t n, uint32_t* out) {
  uint32_t s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    s ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (s == 0x12345678u) out[0] = s;  // (never, in practice: keeps the loads)
}

struct Bufs {
  uint32_t *in, *out;
  long long* t;
  uint4* big;
  size_t big_n;
  int sms;
};

using Kernel = void (*)(const uint32_t*, uint32_t*, long long*);

void evict(const Bufs& b, bool l2) {
  straight<2048, 7777u><<<b.sms, 128>>>(b.in, b.out, b.t);  // 256 KB of other code
  if (l2) stream_read<<<4 * b.sms, 512>>>(b.big, b.big_n, b.out);
  CK(cudaDeviceSynchronize());
}

double median_cycles(const Bufs& b, int blocks) {
  std::vector<long long> h(2 * size_t(blocks));
  CK(cudaMemcpy(h.data(), b.t, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::vector<double> c(static_cast<size_t>(blocks));
  for (int i = 0; i < blocks; ++i) c[size_t(i)] = double(h[2 * size_t(i) + 1] - h[2 * size_t(i)]);
  std::nth_element(c.begin(), c.begin() + blocks / 2, c.end());
  return c[size_t(blocks / 2)];
}

// mode 0 warm, 1 L1i cold, 2 L2 cold
double run_arm(const Bufs& b, Kernel k, int blocks, int mode) {
  std::vector<double> r;
  for (int rep = 0; rep < 7; ++rep) {
    if (mode == 0) {
      k<<<blocks, 128>>>(b.in, b.out, b.t);
      CK(cudaDeviceSynchronize());
    } else {
      evict(b, mode == 2);
    }
    k<<<blocks, 128>>>(b.in, b.out, b.t);
    CK(cudaDeviceSynchronize());
    r.push_back(median_cycles(b, blocks));
  }
  std::nth_element(r.begin(), r.begin() + 3, r.end());
  return r[3];
}

}  // namespace

int main() {
  Bufs b{};
  CK(cudaDeviceGetAttribute(&b.sms, cudaDevAttrMultiProcessorCount, 0));
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  b.big_n = (size_t(256) << 20) / sizeof(uint4);
  CK(cudaMalloc(&b.in, 64));
  CK(cudaMalloc(&b.out, size_t(b.sms) * 4 * 128 * sizeof(uint32_t)));
  CK(cudaMalloc(&b.t, size_t(b.sms) * 8 * sizeof(long long)));
  CK(cudaMalloc(&b.big, b.big_n * sizeof(uint4)));
  CK(cudaMemset(b.big, 1, b.big_n * sizeof(uint4)));
  const uint32_t init[5] = {0x1234567u, 0x89abcdefu, 0x2468aceu, 0x13579bdu, 0x5a5a5a5u};
  CK(cudaMemcpy(b.in, init, sizeof init, cudaMemcpyHostToDevice));
  struct Size {
    const char* name;
    Kernel k;
  };
  const Size sizes[] = {
      {"4KB", straight<32, 1u>}, {"16KB", straight<128, 2u>}, {"64KB", straight<512, 3u>}};
  const char* modes[] = {"warm", "l1i_cold", "l2_cold"};
  std::printf("icache_probe: %d SMs, SM clock %.0f MHz (cycles at that clock)\n", b.sms,
              khz * 1e-3);
  for (const Size& s : sizes)
    for (int blocks : {1, b.sms}) {
      double warm = 0.0;
      for (int mode = 0; mode < 3; ++mode) {
        const double c = run_arm(b, s.k, blocks, mode);
        if (mode == 0) warm = c;
        std::printf("code %-5s blocks %3d %-8s %8.0f cycles %7.2f us  (+%.2f us over warm)\n",
                    s.name, blocks, modes[mode], c, c / (khz * 1e-3), (c - warm) / (khz * 1e-3));
      }
    }
  return 0;
}
