// cuda_ops_bench: the CUDA backend's decode ops at real shapes (Qwen3-30B-A3B:
// hidden 2048, 32 q / 4 kv heads of 128, 128 experts of 768, top-8, vocab
// 151936; DeepSeek-V4-Flash experts: hidden 4096, 256 experts of 2048, top-6),
// each timed as decode runs it: 50 calls captured in a CUDA graph and replayed,
// beside the device's measured copy bandwidth (read + write of a 2 GiB
// buffer): achieved GB/s of weight bytes read and the fraction of that bound.
// Random weights, never zeros. Prints one JSON object.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench/pdl_probe.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda.h"

using namespace moetier;

namespace {

struct Timer {
  cudaStream_t s;
  double median_us(const std::function<void()>& f, int reps = 50) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 5; ++i) f();  // warm-up
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(a, s);
      for (int i = 0; i < reps; ++i) f();
      cudaEventRecord(b, s);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      t.push_back(1000.0 * ms / reps);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return t[2];
  }
};

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng, int lo = 0, int hi = 255) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = uint8_t(d(rng));
  return v;
}

// A random matrix on the device (bf16: random normal bits; mxfp4: random codes,
// scales around 2^-5).
MatView device_matrix(Backend& be, WeightStore& st, WeightEncoding enc, int64_t rows, int64_t cols,
                      std::mt19937& rng) {
  std::vector<uint8_t> data, scales;
  if (enc == WeightEncoding::BF16) {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    data.resize(size_t(rows * cols) * 2);
    for (size_t i = 0; i < data.size() / 2; ++i) {
      const uint16_t h = f32_to_bf16(nd(rng));
      data[2 * i] = uint8_t(h), data[2 * i + 1] = uint8_t(h >> 8);
    }
  } else {
    data = random_bytes(size_t(rows * cols / 2), rng);
    scales = random_bytes(size_t(rows * cols / 32), rng, 120, 123);
  }
  MatView h{enc, rows, cols, data.data(), scales.empty() ? nullptr : scales.data()};
  return be.weights(h, st);
}

// Copies of device matrices in pinned host memory (device-accessible under
// unified addressing); `bufs` owns them.
MatView host_copy(Backend& be, const MatView& d, std::vector<DeviceBuffer>& bufs) {
  MatView h = d;
  const size_t n =
      d.enc == WeightEncoding::BF16 ? size_t(d.rows * d.cols) * 2 : size_t(d.rows * d.cols) / 2;
  bufs.push_back(be.alloc_host(n));
  be.to_host(bufs.back().data(), d.data, n);
  h.data = bufs.back().data();
  if (d.scales) {
    bufs.push_back(be.alloc_host(size_t(d.rows * d.cols) / 32));
    be.to_host(bufs.back().data(), d.scales, size_t(d.rows * d.cols) / 32);
    h.scales = bufs.back().as<uint8_t>();
  }
  return h;
}

std::vector<ExpertView> host_copies(Backend& be, const std::vector<ExpertView>& views,
                                    std::vector<DeviceBuffer>& bufs) {
  std::vector<ExpertView> out;
  for (const ExpertView& v : views)
    out.push_back(
        {host_copy(be, v.gate, bufs), host_copy(be, v.up, bufs), host_copy(be, v.down, bufs)});
  return out;
}

std::string fmt_T(const char* what, int64_t T) { return what + std::to_string(T); }

// CUDA_OPS_FILTER=substring: run only the ops whose name contains it (for ncu).
bool wanted(const std::string& name) {
  const char* f = std::getenv("CUDA_OPS_FILTER");
  return !f || name.find(f) != std::string::npos;
}

void row(bool& first, const char* name, double us, double bytes, double bound_gbs) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf(
      "%s    {\"op\": \"%s\", \"us\": %.2f, \"weight_bytes\": %.0f, \"gb_s\": %.1f, "
      "\"fraction_of_bound\": %.3f}",
      first ? "" : ",\n", name, us, bytes, gbs, gbs / bound_gbs);
  first = false;
}

}  // namespace

int main() {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device\n");
    return 1;
  }
  auto be = make_cuda_backend(0);
  Timer tm{nullptr};
  cudaStreamCreate(&tm.s);
  // The bound: a 2 GiB device-to-device copy, bytes read + written.
  const size_t big = size_t(2) << 30;
  DeviceBuffer a = be->alloc(big), b = be->alloc(big);
  cudaMemset(a.data(), 1, big);
  const double copy_us = tm.median_us(
      [&] { cudaMemcpyAsync(b.data(), a.data(), big, cudaMemcpyDeviceToDevice, tm.s); }, 5);
  const double bound = 2.0 * double(big) / (copy_us * 1e-6) / 1e9;
  a.reset(), b.reset();
  cudaStreamDestroy(tm.s);
  tm.s = nullptr;  // the backend's ops run on its own stream: time with a sync wrapper below

  std::mt19937 rng(1);
  WeightStore st;
  DeviceBuffer x = be->alloc(4096 * 4 * 8), y = be->alloc(size_t(151936) * 4 * 8);
  std::vector<float> hx(4096 * 8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : hx) v = nd(rng);
  be->to_device(x.data(), hx.data(), hx.size() * 4);
  // GPU time per op as decode runs it: 50 calls captured in one CUDA graph,
  // replayed 10 times (pos / max_positions: the step the graph records).
  auto timed = [&](const std::function<void()>& f, int64_t pos = 0, int64_t max_pos = 1) {
    constexpr int kCalls = 50, kReplays = 10;
    f();  // sizes the op's scratch: nothing may be allocated while recording
    be->synchronize();
    be->graph_begin(pos, max_pos);
    for (int i = 0; i < kCalls; ++i) f();
    const int g = be->graph_end();
    be->graph_launch(g, pos, 0);
    be->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReplays; ++i) be->graph_launch(g, pos, 0);
    be->synchronize();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    be->graph_drop(g);
    return us / (kCalls * kReplays);
  };
  const bench::PdlProbe pdl = bench::pdl_probe();
  std::printf(
      "{\n  \"device\": \"%s\",\n  \"copy_bound_gb_s\": %.1f,\n  \"pdl_probe\": {\"ok\": %s, "
      "\"stream_gap_us\": %.2f, \"graph_gap_us\": %.2f},\n  \"ops\": [\n",
      be->name().c_str(), bound, pdl.ok ? "true" : "false", pdl.stream_gap_us, pdl.graph_gap_us);
  bool first = true;
  struct Shape {
    const char* name;
    WeightEncoding enc;
    int64_t rows, cols;
  };
  for (const Shape& s : {Shape{"bf16 q_proj 4096x2048", WeightEncoding::BF16, 4096, 2048},
                         Shape{"bf16 o_proj 2048x4096", WeightEncoding::BF16, 2048, 4096},
                         Shape{"bf16 k_proj 512x2048", WeightEncoding::BF16, 512, 2048},
                         Shape{"bf16 router 128x2048", WeightEncoding::BF16, 128, 2048},
                         Shape{"bf16 lm_head 151936x2048", WeightEncoding::BF16, 151936, 2048},
                         Shape{"mxfp4 768x2048", WeightEncoding::MXFP4, 768, 2048},
                         Shape{"mxfp4 2048x4096", WeightEncoding::MXFP4, 2048, 4096}}) {
    if (!wanted(s.name)) continue;
    const MatView w = device_matrix(*be, st, s.enc, s.rows, s.cols, rng);
    const double bytes = s.enc == WeightEncoding::BF16 ? double(s.rows * s.cols * 2)
                                                       : double(s.rows * s.cols) * 17.0 / 32.0;
    const double us = timed([&] { be->matmul(w, x.as<float>(), 1, y.as<float>()); });
    row(first, s.name, us, bytes, bound);
    cuda::set_gemv_warp_rows(0);  // the other GEMV kernel, for comparison
    const double uw = timed([&] { be->matmul(w, x.as<float>(), 1, y.as<float>()); });
    cuda::set_gemv_warp_rows(32768);
    row(first, (std::string(s.name) + " (warp kernel)").c_str(), uw, bytes, bound);
  }
  if (wanted("bf16 q/k/v")) {  // q/k/v of one input in one launch (matmul_multi)
    const MatView qkv[3] = {device_matrix(*be, st, WeightEncoding::BF16, 4096, 2048, rng),
                            device_matrix(*be, st, WeightEncoding::BF16, 512, 2048, rng),
                            device_matrix(*be, st, WeightEncoding::BF16, 512, 2048, rng)};
    float* ys[3] = {y.as<float>(), y.as<float>() + 4096, y.as<float>() + 4608};
    const double us = timed([&] { be->matmul_multi(qkv, x.as<float>(), 1, ys); });
    row(first, "bf16 q/k/v 5120x2048 (one launch)", us, 5120.0 * 2048 * 2, bound);
  }
  // Resident experts, one token: Qwen3-30B-A3B (k 8 of 128, 768x2048) and
  // DeepSeek-V4-Flash (k 6 of 256, 2048x4096), MXFP4.
  struct MoeShape {
    const char* name;
    int64_t experts, k, inter, hidden;
  };
  for (const MoeShape& m :
       {MoeShape{"moe qwen3-30b-a3b 8 of 128 x 768x2048", 128, 8, 768, 2048},
        MoeShape{"moe deepseek-v4-flash 6 of 256 x 2048x4096", 64, 6, 2048, 4096}}) {
    if (!wanted(m.name)) continue;
    std::vector<ExpertView> views;
    for (int64_t e = 0; e < m.experts; ++e)
      views.push_back({device_matrix(*be, st, WeightEncoding::MXFP4, m.inter, m.hidden, rng),
                       device_matrix(*be, st, WeightEncoding::MXFP4, m.inter, m.hidden, rng),
                       device_matrix(*be, st, WeightEncoding::MXFP4, m.hidden, m.inter, rng)});
    const int table = be->register_experts(views);
    std::vector<DeviceBuffer> host_bufs;  // the pinned host copies of the arms below
    std::vector<int32_t> ids;
    std::vector<float> w;
    for (int64_t i = 0; i < m.k; ++i)
      ids.push_back(int32_t((i * 37 + 5) % m.experts)), w.push_back(0.1f);
    DeviceBuffer di = be->alloc(ids.size() * 4), dw = be->alloc(w.size() * 4);
    be->to_device(di.data(), ids.data(), ids.size() * 4);
    be->to_device(dw.data(), w.data(), w.size() * 4);
    const double us = timed([&] {
      be->moe_resident(table, di.as<int32_t>(), dw.as<float>(), m.k, x.as<float>(), m.hidden,
                       m.inter, y.as<float>());
    });
    const double bytes = double(m.k * 3 * m.inter * m.hidden) * 17.0 / 32.0;
    row(first, m.name, us, bytes, bound);
    {  // each of the 50 calls of a replay with other experts: weights from HBM, not L2
      constexpr int kSets = 50;
      std::vector<int32_t> rot;
      for (int c = 0; c < kSets; ++c)
        for (int64_t i = 0; i < m.k; ++i) rot.push_back(int32_t((c * 7 + i * 13 + 1) % m.experts));
      DeviceBuffer dr = be->alloc(rot.size() * 4);
      be->to_device(dr.data(), rot.data(), rot.size() * 4);
      int call = 0;
      const double uc = timed([&] {
        be->moe_resident(table, dr.as<int32_t>() + (call++ % kSets) * m.k, dw.as<float>(), m.k,
                         x.as<float>(), m.hidden, m.inter, y.as<float>());
      });
      row(first, (std::string(m.name) + ", other experts each call").c_str(), uc, bytes, bound);
      // The same calls with experts read over PCIe from pinned host memory
      // (a mapped host tier): every expert, and one of each call's k (e % 8 == 3).
      std::vector<ExpertView> all_host = host_copies(*be, views, host_bufs);
      std::vector<ExpertView> mixed = views;
      for (size_t e = 3; e < mixed.size(); e += 8) mixed[e] = all_host[e];
      for (const auto& [what, tv] : {std::pair{", all from host memory", &all_host},
                                     std::pair{", 1 of k from host memory", &mixed}}) {
        const int ht = be->register_experts(*tv);
        const double uh = timed([&] {
          be->moe_resident(ht, dr.as<int32_t>() + (call++ % kSets) * m.k, dw.as<float>(), m.k,
                           x.as<float>(), m.hidden, m.inter, y.as<float>());
        });
        row(first, (std::string(m.name) + what).c_str(), uh, bytes, bound);
      }
      host_bufs.clear();
    }
    // The router (bf16 [experts, hidden]) and the experts in one call, as
    // decode runs them: the experts' kernels read the router's ids early.
    const MatView router = device_matrix(*be, st, WeightEncoding::BF16, m.experts, m.hidden, rng);
    DeviceBuffer dp = be->alloc(size_t(m.experts) * 4);
    const double ur = timed([&] {
      be->route_moe_resident(router, table, x.as<float>(), m.k, true, dp.as<float>(),
                             di.as<int32_t>(), dw.as<float>(), m.hidden, m.inter, y.as<float>());
    });
    row(first, (std::string("router + ") + m.name).c_str(), ur,
        bytes + double(m.experts * m.hidden * 2), bound);
  }
  // Decode attention at 512 and 8192 positions (32 q heads, 4 kv heads, 128).
  for (int64_t T : {256, 512, 8192}) {
    if (!wanted(fmt_T("attention decode T=", T))) continue;
    DeviceBuffer k = be->alloc(size_t(T * 4 * 128) * 4), v = be->alloc(size_t(T * 4 * 128) * 4);
    cudaMemset(k.data(), 0x3c, k.bytes()), cudaMemset(v.data(), 0x3c, v.bytes());
    const double us = timed(
        [&] {
          be->attention(x.as<float>(), k.as<float>(), v.as<float>(), 1, T - 1, 32, 4, 128, 0.088f,
                        y.as<float>());
        },
        T - 1, T);
    row(first, fmt_T("attention decode T=", T).c_str(), us, double(2 * T * 4 * 128 * 4), bound);
  }
  // Decode attention as the model runs it (attend_decode: q/k norm, RoPE and the
  // KV write in the same launch) in an 8448-position cache: Qwen3 shapes (32 q
  // heads, 4 kv heads) at 384 positions, the DeepSeek-shaped model's (8, 1) at 576.
  for (const auto& [name, heads, kvh, T] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{
            "attend decode T=384 of 8448 (norms, RoPE, KV write)", 32, 4, 384},
        {"attend decode 8q/1kv T=576 of 8448 (norms, RoPE, KV write)", 8, 1, 576}}) {
    if (!wanted(name)) continue;
    const int64_t cap = 8448, kvd = kvh * 128;
    DeviceBuffer k = be->alloc(size_t(cap * kvd) * 4), v = be->alloc(size_t(cap * kvd) * 4);
    cudaMemset(k.data(), 0x3c, k.bytes()), cudaMemset(v.data(), 0x3c, v.bytes());
    std::vector<float> hf(64 + 2 * 128, 1.0f);
    for (int i = 0; i < 64; ++i) hf[size_t(i)] = float(std::pow(1e6, -i / 64.0));
    DeviceBuffer c = be->alloc(hf.size() * 4), q = be->alloc(size_t(heads) * 128 * 4);
    be->to_device(c.data(), hf.data(), hf.size() * 4);
    be->copy(q.data(), x.data(), size_t(heads) * 128 * 4);
    const float* cf = c.as<float>();
    const double us = timed(
        [&] {
          be->attend_decode(q.as<float>(), x.as<float>() + 4096, x.as<float>() + 8192, cf + 64,
                            cf + 192, heads, kvh, 128, 1e-6f, T - 1, cf, k.as<float>(),
                            v.as<float>(), 0.088f, y.as<float>());
        },
        T - 1, cap);
    row(first, name, us, double(2 * T * kvd * 4), bound);
  }
  if (wanted("softmax top-8")) {  // the router's softmax + top-8 of 128 (a latency figure)
    DeviceBuffer ids = be->alloc(64), w = be->alloc(64), p = be->alloc(128 * 4);
    const double us = timed([&] {
      be->softmax_topk(x.as<float>(), 1, 128, 8, true, p.as<float>(), ids.as<int32_t>(),
                       w.as<float>());
    });
    row(first, "softmax top-8 of 128", us, 128 * 4, bound);
  }
  const double small =
      timed([&] { be->rmsnorm(x.as<float>(), x.as<float>(), 1, 2048, 1e-6f, y.as<float>()); });
  row(first, "rmsnorm 2048", small, 2048 * 8, bound);
  const double floor_us = timed([&] { be->fill_zero(y.as<float>(), 1); });
  row(first, "fill of one float (the per-kernel floor)", floor_us, 4, bound);
  std::printf("\n  ]\n}\n");
  return 0;
}
