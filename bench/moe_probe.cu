// moe_probe: the resident MoE decode step's kernels side by side at real
// shapes (Qwen3-30B-A3B: hidden 2048, 128 experts of 768, top-8;
// DeepSeek-V4-Flash experts: hidden 4096, 256 of 2048, top-6), without the
// engine: decode_q8.cu's kernels in each of their variants (set_moe_q8_kernels),
// a plain read of the same bytes (the bound of this access pattern) and the
// L2's read bandwidth. Each timed call uses another random expert set (64
// sets in a CUDA graph, replayed), so the weights come from HBM, not L2.
// Outputs are compared with decode_q8.cu's by
// max |diff| / max |ref| (the same integer sums; only the f32 order differs).
// Also: gate/up with word-layout scales (moe_wsc.cuh); the step behind a
// router stand-in with gate/up's ids read after its wait and before it (a
// perfect prediction), gate/up's per-block timeline there, and both again
// with every kernel at the largest shared-memory carveout (wsc_arms; stop 44:
// bench/results/h100-stop44-predicted-experts.json; PROBE_SKIP_DIAG=1 and
// PROBE_SKIP_L2=1 leave out the diagnosis and L2 arms); the q8 kernels
// reading experts in pinned host memory. (The figures
// of bench/results/h200-moe-probe.json came from this probe at f2e373a, with
// bulk-copy kernels since removed.)
// Build: nvcc -O3 -std=c++20 -arch=sm_90 -Isrc -DMOETIER_CUDA_MIN_ARCH=90
//   bench/moe_probe.cu -o moe_probe  (scripts/device_cuda.sh step probe).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/decode_q8.cu"
#include "kernels/cuda/moe_stream.cu"
#include "moe_diag.cuh"
#include "moe_wsc.cuh"

namespace moetier::cuda {
bool pdl_enabled() { return true; }
void apply_carveout(const void*) {}  // (the probe sets its carveouts itself)
}  // namespace moetier::cuda

#include "cuda_check.cuh"

namespace probe {
using namespace moetier;
using namespace moetier::cuda;

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, int lo, int span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = uint8_t(span ? lo + int(h % uint32_t(span)) : int(h & 0xffu));
  }
}

// The bound of the access pattern: every byte of the call's matrices read
// once, 4 x 16 bytes per thread in flight. segs [n]: pointer, bytes (multiple of 64).
struct Seg {
  const uint4* p;
  size_t n16;
};
__global__ void read_segs(const Seg* segs, uint32_t* sink) {
  const Seg sg = segs[blockIdx.y];
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < sg.n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = i + u * stride < sg.n16 ? __ldg(sg.p + i + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// The L2 lines of segs [blockIdx.y] that a prefetch of predicted experts
// would bring in: line i of n where i < n * num / den (contiguous: the first
// rows of each matrix), or i % den < num (interleaved: a share of every
// row). mode 0 reads their four 32-byte sectors (ld.global.cg: in L2 when the
// kernel ends); the others only prefetch them (in flight when it ends): mode 1
// with prefetch.global.L2 of the line's address, 2 of each sector's, 3 with a
// 128-byte cp.async.bulk.prefetch.L2.
__global__ void touch_lines(const Seg* segs, int num, int den, int interleaved, int mode,
                            uint32_t* sink) {
  const Seg sg = segs[blockIdx.y];
  const size_t lines = sg.n16 / 8;
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < lines;
       i += size_t(gridDim.x) * blockDim.x) {
    if (interleaved ? int(i % size_t(den)) >= num : i * size_t(den) >= lines * size_t(num))
      continue;
    const uint4* p = sg.p + 8 * i;
    if (mode == 0) {  // each 32-byte sector of the line
#pragma unroll
      for (int q = 0; q < 4; ++q) acc ^= __ldcg(reinterpret_cast<const uint32_t*>(p + 2 * q));
    } else if (mode == 1) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    } else if (mode == 2) {  // each sector
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 2 * q));
    } else {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], 128;" ::"l"(p) : "memory");
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// One block spinning for `ns` nanoseconds (the dense ops' time in a layer).
__global__ void spin_ns(unsigned ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < ns);
}

struct Shape {
  const char* name;
  int H, I, E, k, layers;
};

constexpr int kCalls = 64;

struct Model {
  Shape sh;
  uint8_t* pool = nullptr;
  std::vector<ExpertPtrs> host_table;
  ExpertPtrs* table = nullptr;    // [layers * E]
  ExpertPtrs* table_w = nullptr;  // the same, gate and up scales in word layout (moe_wsc.cuh)
  uint32_t* words = nullptr;      // their words: [layers * E][2][I / 4][H / 32]
  int32_t* ids = nullptr;         // [kCalls][k] (global expert index)
  float* weights = nullptr;       // [kCalls][k]
  float* x = nullptr;             // [kCalls][H]
  Seg* segs = nullptr;            // [kCalls][6k]
  std::vector<Seg> host_segs;     // segs on the host
  size_t bytes_per_call = 0;
};

size_t up256(size_t b) { return (b + 255) / 256 * 256; }

Model make_model(const Shape& sh, std::mt19937& rng) {
  Model m{sh};
  const size_t H = size_t(sh.H), I = size_t(sh.I);
  const size_t code[3] = {I * H / 2, I * H / 2, H * I / 2},
               sc[3] = {I * H / 32, I * H / 32, H * I / 32};
  size_t per = 0;
  for (int j = 0; j < 3; ++j) per += up256(code[j]) + up256(sc[j]);
  const size_t n = size_t(sh.layers) * size_t(sh.E);
  CK(cudaMalloc(&m.pool, per * n));
  for (size_t e = 0; e < n; ++e) {
    ExpertPtrs p{};
    uint8_t* b = m.pool + e * per;
    for (int j = 0; j < 3; ++j) {
      p.w[j] = b, b += up256(code[j]);
      p.s[j] = b;
      fill_bytes<<<256, 256>>>(b, sc[j], uint32_t(e * 7 + j + 1), 119, 4);
      b += up256(sc[j]);
    }
    m.host_table.push_back(p);
  }
  // codes: random bytes everywhere but the scale ranges, refilled after
  for (size_t e = 0; e < n; ++e)
    for (int j = 0; j < 3; ++j)
      fill_bytes<<<1024, 256>>>(static_cast<uint8_t*>(const_cast<void*>(m.host_table[e].w[j])),
                                code[j], uint32_t(e * 13 + j * 5 + 3), 0, 0);
  CK(cudaDeviceSynchronize());
  CK(cudaMalloc(&m.table, n * sizeof(ExpertPtrs)));
  CK(cudaMemcpy(m.table, m.host_table.data(), n * sizeof(ExpertPtrs), cudaMemcpyHostToDevice));
  {  // gate and up scales in word layout
    const size_t nw = I / 4 * (H / 32);
    CK(cudaMalloc(&m.words, n * 2 * nw * 4));
    std::vector<ExpertPtrs> tw = m.host_table;
    for (size_t e = 0; e < n; ++e)
      for (int j = 0; j < 2; ++j) {
        uint32_t* d = m.words + (2 * e + size_t(j)) * nw;
        repack_scales_words<<<256, 256>>>(m.host_table[e].s[j], int64_t(I), int64_t(H / 32), d);
        tw[e].s[j] = reinterpret_cast<const uint8_t*>(d);
      }
    CK(cudaMalloc(&m.table_w, n * sizeof(ExpertPtrs)));
    CK(cudaMemcpy(m.table_w, tw.data(), n * sizeof(ExpertPtrs), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  std::vector<int32_t> ids;
  std::vector<float> w, x;
  std::vector<Seg> segs;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int c = 0; c < kCalls; ++c) {
    const int layer = c % sh.layers;
    std::vector<int> pick(size_t(sh.E));
    for (int e = 0; e < sh.E; ++e) pick[size_t(e)] = e;
    std::shuffle(pick.begin(), pick.end(), rng);
    float sum = 0.0f;
    for (int j = 0; j < sh.k; ++j) {
      const int g = layer * sh.E + pick[size_t(j)];
      ids.push_back(g);
      const float v = 0.1f + std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      w.push_back(v), sum += v;
      for (int q = 0; q < 3; ++q) {
        segs.push_back({static_cast<const uint4*>(m.host_table[size_t(g)].w[q]), code[q] / 16});
        segs.push_back({reinterpret_cast<const uint4*>(m.host_table[size_t(g)].s[q]), sc[q] / 16});
      }
    }
    for (int j = 0; j < sh.k; ++j) w[w.size() - 1 - size_t(j)] /= sum;
    for (int i = 0; i < sh.H; ++i) x.push_back(nd(rng));
  }
  for (int q = 0; q < 3; ++q) m.bytes_per_call += size_t(sh.k) * (code[q] + sc[q]);
  auto up = [](auto*& d, const auto& v) {
    CK(cudaMalloc(&d, v.size() * sizeof(v[0])));
    CK(cudaMemcpy(d, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice));
  };
  up(m.ids, ids), up(m.weights, w), up(m.x, x), up(m.segs, segs);
  m.host_segs = segs;
  return m;
}

struct Arm {
  const char* name;
  std::function<bool(int call, float* out, void* scratch, cudaStream_t s)> run;
};

double time_arm(const Model& m, const Arm& a, float* out, void* scratch, size_t scratch_b,
                cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < kCalls; ++c)
    a.run(c, out + size_t(c) * m.sh.H, static_cast<uint8_t*>(scratch) + c * scratch_b, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<double> t;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 2) t.push_back(1000.0 * ms / kCalls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    md = std::max(md, double(std::fabs(a[i] - ref[i])));
    mr = std::max(mr, double(std::fabs(ref[i])));
  }
  return md / mr;
}

// The step's launches (moe_decode_q8's, early reads on) with any kernels of
// moe_diag.cuh: quantize, then gate (none: stop there), then down (none: stop).
using GateK = void (*)(const ExpertPtrs*, const int32_t*, const float*, const Q8x*, const float*,
                       int64_t, int64_t, Q8x*, float*, int, const int32_t*, int);
using DownK = void (*)(const ExpertPtrs*, const int32_t*, const float*, int, const Q8x*,
                       const float*, int64_t, int64_t, float*, int, int);
// A stand-in for the router before gate/up (the decode step's order): 128
// blocks that let the next launch start right after their wait, then spin `ns`.
// With g_standin_trace set, block 0 records its start and end.
__device__ unsigned long long* g_standin_trace;
__global__ void router_standin(unsigned ns) {
  grid_wait();
  grid_launch_dependents();
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < ns);
  if (blockIdx.x == 0 && threadIdx.x == 0 && g_standin_trace)
    g_standin_trace[0] = t0, g_standin_trace[1] = t;
}

// table: gate/up's table (default m.table); standin_ns >= 0: router_standin
// between quantize and gate/up; gate_early: gate/up reads its ids before its
// wait; down_grid: the down kernel's blocks (default hidden / 4).
Arm diag_step(const Model& m, const char* name, GateK gate, DownK down,
              const ExpertPtrs* table = nullptr, int standin_ns = -1, int gate_early = 1,
              unsigned down_grid = 0) {
  if (gate)  // the attribute moe_decode_q8 sets on its gate/up kernel
    CK(cudaFuncSetAttribute(gate, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGateSmem)));
  if (!table) table = m.table;
  if (!down_grid) down_grid = unsigned(m.sh.H / 4);
  return {name, [&m, gate, down, table, standin_ns, gate_early, down_grid](
                    int c, float* o, void* sc, cudaStream_t st) {
            const Shape& sh = m.sh;
            const int64_t nb = sh.H / 32, nh = int64_t(sh.k) * (sh.I / 32);
            auto* xq = static_cast<Q8x*>(sc);
            Q8x* hq = xq + nb;
            auto* xd = reinterpret_cast<float*>(hq + nh);
            const int32_t* id = m.ids + c * sh.k;
            const float* w = m.weights + c * sh.k;
            launch(quantize_q8_kernel, unsigned((nb + kQuantThreads - 1) / kQuantThreads),
                   kQuantThreads, 0, st, m.x + size_t(c) * sh.H, nb, nullptr, 0.0f, xq, xd, 1);
            if (standin_ns >= 0) launch(router_standin, 128u, 128u, 0, st, unsigned(standin_ns));
            if (gate)
              launch(gate, dim3(unsigned(sh.I / 32), unsigned(sh.k)), 256u, kGateSmem, st, table,
                     id, w, xq, xd, int64_t(sh.H), int64_t(sh.I), hq, xd + nb, gate_early, nullptr,
                     4);
            if (gate && down)
              launch(down, down_grid, 128u, 0, st, m.table, id, w, sh.k, hq, xd + nb, int64_t(sh.H),
                     int64_t(sh.I), o, 0, 1);
            return true;
          }};
}

// The one-group split down kernel (index 0; the shipped default is the pair
// kernel where it applies) or moe_diag.cuh's in mode 1, 3 or 4, with
// decode_q8.cu's items per thread for the shape.
template <int U>
constexpr DownK kDiagDown[4] = {moe_down_q8_split_kernel<4, U>, diag_down<U, 1>, diag_down<U, 3>,
                                diag_down<U, 4>};
DownK diag_down_for(const Shape& sh, int mode) {
  const int64_t passes = (int64_t(sh.k) * (sh.I / 32) + 127) / 128;
  const int U = int(std::min<int64_t>(passes, 4));
  return (U == 1   ? kDiagDown<1>
          : U == 2 ? kDiagDown<2>
          : U == 3 ? kDiagDown<3>
                   : kDiagDown<4>)[mode];
}

// Where the step's time goes (moe_diag.cuh): quantize alone, quantize + the
// gate/up kernel in each mode, and the whole step with the down kernel in
// each mode. Their outputs are not the step's (no err).
void diag_arms(const Model& m, void* scratch, size_t scratch_b, float* out, cudaStream_t s) {
  const GateK gates[5] = {moe_gate_up_q8_kernel<8>, diag_gate_up<1>, diag_gate_up<2>,
                          diag_gate_up<3>, diag_gate_up<4>};  // as shipped, then the modes
  const char* gname[5] = {"as is", "loads only", "code loads only", "dot only", "frame"};
  const char* dname[4] = {"as is", "loads only", "dot only", "frame"};
  auto show = [&](const std::string& what, const Arm& a) {
    std::printf("  %-38s %8.2f us\n", what.c_str(), time_arm(m, a, out, scratch, scratch_b, s));
  };
  show("quantize alone", diag_step(m, "", nullptr, nullptr));
  for (int gm = 0; gm < 5; ++gm)
    show(std::string("diag quantize + gate/up ") + gname[gm], diag_step(m, "", gates[gm], nullptr));
  for (int dm = 0; dm < 4; ++dm)
    show(std::string("diag step, down ") + dname[dm],
         diag_step(m, "", gates[0], diag_down_for(m.sh, dm)));
  show("diag step, gate/up and down frames", diag_step(m, "", gates[4], diag_down_for(m.sh, 3)));
}

// Gate/up's weights (codes and scales) in L2 before the step, as an L2
// prefetch of predicted experts during a layer's dense ops would leave them:
// touch_lines (share num / den, contiguous or interleaved; read, or only
// prefetched and then a gap of `gap` ns), then the default step. The step's
// time is the pair's less the touch's alone.
void l2_arms(const Model& m, void* scratch, size_t scratch_b, float* out, uint32_t* sink,
             cudaStream_t s) {
  const Shape& sh = m.sh;
  struct L2Arm {
    int num, den, interleaved, mode;
    unsigned gap;
  };
  const L2Arm arms[] = {{1, 2, 0, 0, 0},     {1, 1, 0, 0, 0},     {1, 4, 1, 0, 0},
                        {1, 2, 1, 0, 0},     {3, 4, 1, 0, 0},     {1, 2, 1, 1, 8000},
                        {1, 2, 1, 1, 16000}, {1, 2, 1, 2, 16000}, {1, 2, 1, 3, 16000},
                        {3, 4, 1, 2, 16000}};
  for (const L2Arm& a : arms) {
    size_t bytes = 0;  // per call
    for (int i = 0; i < 6 * sh.k; ++i) {
      const size_t lines = m.host_segs[size_t(i)].n16 / 8;
      bytes += i % 6 >= 4      ? 0
               : a.interleaved ? 128 * (lines / size_t(a.den) * size_t(a.num))
                               : 128 * (lines * size_t(a.num) / size_t(a.den));
    }
    auto touch = [&m, &sh, a, sink](int c, cudaStream_t st) {
      // gate/up's four segments of each expert: 6 a expert, the first 4
      for (int j = 0; j < sh.k; ++j)
        touch_lines<<<dim3(16, 4), 256, 0, st>>>(m.segs + (c * sh.k + j) * 6, a.num, a.den,
                                                 a.interleaved, a.mode, sink);
      if (a.gap) spin_ns<<<1, 32, 0, st>>>(a.gap);
    };
    const double t0 = time_arm(m,
                               {"touch",
                                [&](int c, float*, void*, cudaStream_t st) {
                                  touch(c, st);
                                  return true;
                                }},
                               out, scratch, scratch_b, s);
    const double t1 =
        time_arm(m,
                 {"touch+step",
                  [&](int c, float* o, void* sc, cudaStream_t st) {
                    touch(c, st);
                    return moe_decode_q8(m.table, WeightEncoding::MXFP4, true, m.ids + c * sh.k,
                                         m.weights + c * sh.k, sh.k, m.x + size_t(c) * sh.H, sh.H,
                                         sh.I, sc, o, true, st);
                  }},
                 out, scratch, scratch_b, s);
    std::printf("  gate/up %d/%d %s in L2 (%.1f MB, %s%s): touch %.2f us, step %.2f us\n", a.num,
                a.den, a.interleaved ? "interleaved" : "first rows", bytes / 1e6,
                a.mode == 0   ? "read"
                : a.mode == 1 ? "prefetched by line"
                : a.mode == 2 ? "prefetched by sector"
                              : "bulk-prefetched",
                a.gap ? (" + " + std::to_string(a.gap) + " ns gap").c_str() : "", t0, t1 - t0);
  }
}

// The step as shipped (quantize, gate/up, the shape's default down kernel: the
// pair kernel on DeepSeek shapes, the one-group split kernel on Qwen3's), with
// gate/up `gate` reading `table` (word-layout scales for the gate_up_wsc
// kernels); standin_ns >= 0: router_standin between quantize and gate/up, and
// gate/up reads its ids before its wait only with gate_early (a perfect
// prediction of the layer's experts, its first passes in flight during the
// stand-in).
Arm shipped_step(const Model& m, const char* name, GateK gate, const ExpertPtrs* table,
                 int standin_ns, int gate_early) {
  const Shape& sh = m.sh;
  const int64_t passes = (int64_t(sh.k) * (sh.I / 32) + 127) / 128;
  const int U = int(std::min<int64_t>(passes, 4));
  const bool pair = sh.H / 4 > 4 * 132;
  const DownK dk = pair ? (U == 1   ? moe_down_q8_pair_kernel<4, 1>
                           : U == 2 ? moe_down_q8_pair_kernel<4, 2>
                           : U == 3 ? moe_down_q8_pair_kernel<4, 3>
                                    : moe_down_q8_pair_kernel<4, 4>)
                        : diag_down_for(sh, 0);
  return diag_step(m, name, gate, dk, table, standin_ns, gate_early,
                   unsigned(pair ? (sh.H / 4 + 1) / 2 : sh.H / 4));
}

void timeline(const Model& m, void* scratch, size_t scratch_b, float* out, cudaStream_t s,
              const char* tag);

// Gate/up with word-layout scales (moe_wsc.cuh) against the shipped kernel,
// each checked against ref, and each behind router stand-ins of 0, 3 and 6 us
// with its ids read after its wait (as in decode) and before it.
void wsc_arms(const Model& m, void* scratch, size_t scratch_b, float* out,
              const std::vector<float>& ref, cudaStream_t s) {
  const Shape& sh = m.sh;
  if (sh.H / 32 > 128) return;
  struct G {
    const char* name;
    GateK k;
    const ExpertPtrs* table;
  };
  const G gates[3] = {{"shipped gate/up", moe_gate_up_q8_kernel<8>, m.table},
                      {"word scales one ahead", gate_up_wsc<4, false>, m.table_w},
                      {"word scales all at start", gate_up_wsc<4, true>, m.table_w}};
  for (const G& g : gates) {
    const Arm a = shipped_step(m, g.name, g.k, g.table, -1, 0);
    CK(cudaMemset(out, 0xff, sizeof(float) * size_t(sh.H) * kCalls));
    for (int c = 0; c < kCalls; ++c)
      a.run(c, out + size_t(c) * sh.H, static_cast<uint8_t*>(scratch) + c * scratch_b, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    std::vector<float> o(size_t(sh.H) * kCalls);
    CK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
    std::printf("  %-34s %8.2f us  err %.2e\n", g.name, time_arm(m, a, out, scratch, scratch_b, s),
                max_rel(o, ref));
  }
  for (const unsigned ns : {0u, 3000u, 6000u})
    for (const G& g : gates) {
      double t[2];
      for (int early = 0; early < 2; ++early)
        t[early] = time_arm(m, shipped_step(m, g.name, g.k, g.table, int(ns), early), out, scratch,
                            scratch_b, s);
      std::printf("  stand-in %4u ns, %-26s ids after the wait %.2f us, before %.2f (saves %.2f)\n",
                  ns, g.name, t[0], t[1], t[0] - t[1]);
    }
  timeline(m, scratch, scratch_b, out, s, "");
  // Every kernel of the step with the largest shared-memory carveout (the SM's
  // split of L1 and shared memory is set per kernel; a block can only become
  // resident beside another kernel's blocks under the same split), then back
  // to no preference.
  auto carve = [&](int v) {
    const void* ks[] = {(const void*)router_standin,
                        (const void*)quantize_q8_kernel,
                        (const void*)moe_gate_up_q8_kernel<8>,
                        (const void*)gate_up_wsc<4, true>,
                        (const void*)gate_up_wsc<4, true, true>,
                        (const void*)moe_down_q8_pair_kernel<4, 1>,
                        (const void*)moe_down_q8_pair_kernel<4, 2>,
                        (const void*)moe_down_q8_pair_kernel<4, 3>,
                        (const void*)moe_down_q8_pair_kernel<4, 4>,
                        (const void*)diag_down_for(sh, 0)};
    for (const void* k : ks)
      CK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, v));
  };
  carve(cudaSharedmemCarveoutMaxShared);
  for (int j = 0; j < 3; j += 2) {
    std::printf("  carveout 100: %-26s %8.2f us\n", gates[j].name,
                time_arm(m, shipped_step(m, "", gates[j].k, gates[j].table, -1, 0), out, scratch,
                         scratch_b, s));
    for (const unsigned ns : {3000u, 6000u}) {
      double t[2];
      for (int early = 0; early < 2; ++early)
        t[early] = time_arm(m, shipped_step(m, "", gates[j].k, gates[j].table, int(ns), early), out,
                            scratch, scratch_b, s);
      std::printf(
          "  carveout 100: stand-in %4u ns, %-26s ids after %.2f us, before %.2f (saves %.2f)\n",
          ns, gates[j].name, t[0], t[1], t[0] - t[1]);
    }
  }
  timeline(m, scratch, scratch_b, out, s, "carveout 100: ");
  carve(cudaSharedmemCarveoutDefault);
}

// The timeline of one step behind a 6 us stand-in (call 5, after 4 untimed):
// gate/up's blocks' marks from the stand-in's start, us (min / median / max).
void timeline(const Model& m, void* scratch, size_t scratch_b, float* out, cudaStream_t s,
              const char* tag) {
  const Shape& sh = m.sh;
  const int nblk = int(sh.I / 32) * sh.k;
  unsigned long long* tr;
  CK(cudaMalloc(&tr, sizeof(unsigned long long) * (4 * size_t(nblk) + 2)));
  unsigned long long* trs = tr + 4 * nblk;
  CK(cudaMemcpyToSymbol(g_wsc_trace, &tr, sizeof tr));
  for (int early = 0; early < 2; ++early) {
    const Arm a = shipped_step(m, "traced", gate_up_wsc<4, true, true>, m.table_w, 6000, early);
    for (int c = 0; c < 5; ++c) {
      if (c == 4) CK(cudaMemcpyToSymbol(g_standin_trace, &trs, sizeof trs));
      a.run(c, out + size_t(c) * sh.H, static_cast<uint8_t*>(scratch) + c * scratch_b, s);
    }
    CK(cudaStreamSynchronize(s));
    unsigned long long* none = nullptr;
    CK(cudaMemcpyToSymbol(g_standin_trace, &none, sizeof none));
    std::vector<unsigned long long> h(4 * size_t(nblk) + 2);
    CK(cudaMemcpy(h.data(), tr, h.size() * 8, cudaMemcpyDeviceToHost));
    const double t0 = double(h[4 * size_t(nblk)]);
    std::printf("  %stimeline, ids %s the wait: stand-in %.2f us;", tag, early ? "before" : "after",
                (double(h[4 * size_t(nblk) + 1]) - t0) / 1e3);
    const char* mark[4] = {"entry", "passes landed", "wait done", "end"};
    for (int j = 0; j < 4; ++j) {
      if (j == 1 && !early) continue;
      std::vector<double> v;
      for (int b = 0; b < nblk; ++b) v.push_back((double(h[4 * size_t(b) + j]) - t0) / 1e3);
      std::sort(v.begin(), v.end());
      std::printf(" %s %.2f / %.2f / %.2f;", mark[j], v[0], v[v.size() / 2], v.back());
    }
    std::printf("\n");
  }
  cudaFree(tr);
}

void run_shape(const Shape& sh, std::mt19937& rng, double copy_gbs) {
  Model m = make_model(sh, rng);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t scratch_b = up256(moe_q8_scratch_bytes(sh.k, sh.H, sh.I));
  void* scratch;
  float* out;
  uint32_t* sink;
  CK(cudaMalloc(&scratch, scratch_b * kCalls));
  CK(cudaMalloc(&out, sizeof(float) * size_t(sh.H) * kCalls));
  CK(cudaMalloc(&sink, 64));
  auto ids = [&](int c) { return m.ids + c * sh.k; };
  auto wts = [&](int c) { return m.weights + c * sh.k; };
  auto xs = [&](int c) { return m.x + size_t(c) * sh.H; };
  std::vector<Arm> arms;
  arms.push_back({"default (gate 8 warps, down pair of 4 rows)",
                  [&](int c, float* o, void* sc, cudaStream_t st) {
                    return moe_decode_q8(m.table, WeightEncoding::MXFP4, true, ids(c), wts(c), sh.k,
                                         xs(c), sh.H, sh.I, sc, o, true, st);
                  }});
  struct Variant {
    const char* name;
    MoeQ8Kernels k;
  };
  auto kern = [](int gate, int rows, bool pair = true) {
    MoeQ8Kernels k;
    k.gate_warps = gate, k.down_rows = rows, k.down_pair = pair;
    return k;
  };
  const Variant kVariants[] = {{"down warp", kern(8, 0)},
                               {"down split 2 rows", kern(8, 2)},
                               {"down split 4 rows", kern(8, 4, false)},
                               {"gate 16 warps", kern(16, 4)}};
  for (const Variant& v : kVariants)
    arms.push_back({v.name, [&, v](int c, float* o, void* sc, cudaStream_t st) {
                      set_moe_q8_kernels(v.k);
                      const bool ok =
                          moe_decode_q8(m.table, WeightEncoding::MXFP4, true, ids(c), wts(c), sh.k,
                                        xs(c), sh.H, sh.I, sc, o, true, st);
                      set_moe_q8_kernels({});
                      return ok;
                    }});
  unsigned* ctr;  // moe_stream_q8's two counters (0 between launches)
  CK(cudaMalloc(&ctr, 8));
  CK(cudaMemset(ctr, 0, 8));
  arms.push_back(
      {"stream (gate/up + down, one launch)", [&, ctr](int c, float* o, void* sc, cudaStream_t st) {
         MoeQ8Kernels k;
         k.stream = true;
         set_moe_q8_kernels(k);
         Q8Fuse f;
         f.stream = ctr;
         const bool ok = moe_decode_q8(m.table, WeightEncoding::MXFP4, true, ids(c), wts(c), sh.k,
                                       xs(c), sh.H, sh.I, sc, o, true, st, f) == 2;
         set_moe_q8_kernels({});
         return ok;
       }});
  if (std::getenv("PROBE_SKIP_DIAG") == nullptr) diag_arms(m, scratch, scratch_b, out, s);
  std::vector<float> ref;
  std::printf("\n%s: hidden %d, %d experts of %d, top-%d, %.1f MB per call\n", sh.name, sh.H, sh.E,
              sh.I, sh.k, m.bytes_per_call / 1e6);
  {  // the plain read
    const double us = time_arm(m,
                               {"read",
                                [&](int c, float*, void*, cudaStream_t st) {
                                  read_segs<<<dim3(sh.H == 4096 ? 48 : 24, 6 * sh.k), 256, 0, st>>>(
                                      m.segs + c * 6 * sh.k, sink);
                                  return true;
                                }},
                               out, scratch, scratch_b, s);
    std::printf("  %-34s %8.2f us %7.0f GB/s  %5.1f%% of copy\n", "plain read of the bytes", us,
                m.bytes_per_call / us / 1e3, 100.0 * m.bytes_per_call / us / 1e3 / copy_gbs);
  }
  for (const Arm& a : arms) {
    CK(cudaMemset(out, 0xff, sizeof(float) * size_t(sh.H) * kCalls));  // NaN poison
    bool ok = true;
    for (int c = 0; c < kCalls; ++c)
      ok =
          a.run(c, out + size_t(c) * sh.H, static_cast<uint8_t*>(scratch) + c * scratch_b, s) && ok;
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    if (!ok) {
      std::printf("  %-34s does not apply\n", a.name);
      continue;
    }
    std::vector<float> o(size_t(sh.H) * kCalls);
    CK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
    if (ref.empty()) ref = o;
    const double err = max_rel(o, ref);
    const double us = time_arm(m, a, out, scratch, scratch_b, s);
    std::printf("  %-34s %8.2f us %7.0f GB/s  %5.1f%% of copy  err %.2e\n", a.name, us,
                m.bytes_per_call / us / 1e3, 100.0 * m.bytes_per_call / us / 1e3 / copy_gbs, err);
  }
  wsc_arms(m, scratch, scratch_b, out, ref, s);
  if (std::getenv("PROBE_SKIP_L2") == nullptr) l2_arms(m, scratch, scratch_b, out, sink, s);
  // Experts in pinned host memory (the mapped host tier): call 0's k experts.
  {
    std::vector<ExpertPtrs> ht = m.host_table;
    std::vector<int32_t> hid(size_t(sh.k));
    CK(cudaMemcpy(hid.data(), m.ids, hid.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<void*> bufs;
    for (int j = 0; j < sh.k; j += 2) {  // every other selected expert from host memory
      ExpertPtrs& p = ht[size_t(hid[size_t(j)])];
      for (int q = 0; q < 3; ++q) {
        const size_t cb = q < 2 ? size_t(sh.I) * sh.H / 2 : size_t(sh.H) * sh.I / 2;
        void* hc;
        void* hs;
        CK(cudaHostAlloc(&hc, cb, cudaHostAllocMapped));
        CK(cudaHostAlloc(&hs, cb / 16, cudaHostAllocMapped));
        CK(cudaMemcpy(hc, p.w[q], cb, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hs, p.s[q], cb / 16, cudaMemcpyDeviceToHost));
        p.w[q] = hc, p.s[q] = static_cast<uint8_t*>(hs);
        bufs.push_back(hc), bufs.push_back(hs);
      }
    }
    ExpertPtrs* t2;
    CK(cudaMalloc(&t2, ht.size() * sizeof(ExpertPtrs)));
    CK(cudaMemcpy(t2, ht.data(), ht.size() * sizeof(ExpertPtrs), cudaMemcpyHostToDevice));
    CK(cudaMemset(out, 0xff, sizeof(float) * size_t(sh.H)));
    const bool ok = moe_decode_q8(t2, WeightEncoding::MXFP4, true, ids(0), wts(0), sh.k, xs(0),
                                  sh.H, sh.I, scratch, out, true, s);
    const cudaError_t e = cudaStreamSynchronize(s);
    std::vector<float> o(size_t(sh.H));
    if (ok && e == cudaSuccess) CK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> r(ref.begin(), ref.begin() + sh.H);
    std::printf("  q8 kernels, half the experts in pinned host memory: %s, err %.2e\n",
                e == cudaSuccess ? "ran" : cudaGetErrorString(e),
                ok && e == cudaSuccess ? max_rel(o, r) : -1.0);
    (void)cudaGetLastError();
    for (void* b : bufs) cudaFreeHost(b);
    cudaFree(t2);
  }
  cudaFree(m.pool), cudaFree(m.table), cudaFree(m.table_w), cudaFree(m.words), cudaFree(m.ids),
      cudaFree(m.weights), cudaFree(m.x);
  cudaFree(m.segs), cudaFree(scratch), cudaFree(out), cudaFree(sink);
  cudaStreamDestroy(s);
}

double copy_bound() {
  const size_t n = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(2.0 * n / (ms * 1e6));
  }
  std::sort(t.begin(), t.end());
  cudaFree(a), cudaFree(b);
  return t[3];
}

// L2 read bandwidth: a 16 MB buffer (a third of the H200's L2), read by
// every block in turn after a warm-up pass, 16 times; 4 x 16 bytes per
// thread in flight. The bound of reads that hit L2 (x and h in the MoE step).
__global__ void read_l2(const uint4* p, size_t n16, int reps, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < reps; ++r) {
    const size_t off = (size_t(blockIdx.x) * 7919 * (r + 1)) % gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __ldcg(p + (i + j * stride + off) % n16);
#pragma unroll
      for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}

double l2_bound(int sms) {
  const size_t n = size_t(16) << 20;
  void* a;
  uint32_t* sink;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(a, 3, n));
  read_l2<<<sms * 8, 256>>>(static_cast<const uint4*>(a), n / 16, 1, sink);  // into L2
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(e0));
    read_l2<<<sms * 8, 256>>>(static_cast<const uint4*>(a), n / 16, 16, sink);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(16.0 * n / (ms * 1e6));
  }
  std::sort(t.begin(), t.end());
  cudaFree(a), cudaFree(sink);
  return t[2];
}

}  // namespace probe

int main() {
  using namespace probe;
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  const double copy = copy_bound();
  std::printf("%s, %d SMs, copy bound %.0f GB/s (read + write), L2 reads %.0f GB/s\n", p.name,
              p.multiProcessorCount, copy, l2_bound(p.multiProcessorCount));
  std::mt19937 rng(7);
  run_shape({"Qwen3-30B-A3B", 2048, 768, 128, 8, 8}, rng, copy);
  run_shape({"DeepSeek-V4-Flash experts", 4096, 2048, 256, 6, 1}, rng, copy);
  return 0;
}
