// kernels_bench: Google Benchmark of the CPU matmuls (kernels/cpu) on the
// shapes that decode and prefill run: moetier-tiny's (hidden 256, experts
// 64 x 256, vocab 8192) and Qwen3-30B-A3B's (hidden 2048, experts 768 x 2048).
//
//   build/bench/kernels_bench [--benchmark_filter=REGEX] [--benchmark_repetitions=5]
//
// Arguments of each benchmark: rows, cols, n (rows of X), threads (1 and 2,
// or the list in KERNELS_BENCH_THREADS, e.g. "1,2,16"). Counters:
// MAC/s (multiply-adds per second) and weight bytes/s. The kernel path and
// the MXFP4 activations come from MOETIER_CPU_KERNELS and MOETIER_CPU_ACT
// (kernels/cpu/dispatch.h), or the Q8 / F32 benchmark variants below.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"

using namespace moetier;

namespace {

struct Weights {
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> codes, scales;
  MatView view;
  Weights(WeightEncoding enc, int64_t rows, int64_t cols) {
    std::mt19937 rng(uint32_t(rows + cols));
    std::normal_distribution<float> nd(0.0f, 0.5f);
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
    if (enc == WeightEncoding::BF16) {
      for (int64_t i = 0; i < rows * cols; ++i) bf16.push_back(f32_to_bf16(nd(rng)));
      view = MatView{enc, rows, cols, bf16.data(), nullptr};
    } else {
      for (int64_t i = 0; i < rows * cols / 2; ++i) codes.push_back(uint8_t(byte(rng)));
      for (int64_t i = 0; i < rows * cols / 32; ++i) scales.push_back(uint8_t(sc(rng)));
      view = MatView{enc, rows, cols, codes.data(), scales.data()};
    }
  }
  double bytes() const {
    return view.enc == WeightEncoding::BF16 ? 2.0 * double(view.rows * view.cols)
                                            : double(view.rows * view.cols) * 17.0 / 32.0;
  }
};

void run(benchmark::State& st, WeightEncoding enc, int act) {
  const int64_t rows = st.range(0), cols = st.range(1), n = st.range(2);
  cpu::set_threads(int(st.range(3)));
  if (act >= 0) cpu::set_mxfp4_activations(cpu::Activations(act));
  Weights w(enc, rows, cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
  for (float& v : x) v = nd(rng);
  for (auto _ : st) {
    cpu::matmul(w.view, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iters = double(st.iterations());
  st.counters["MAC/s"] =
      benchmark::Counter(iters * double(rows * cols * n), benchmark::Counter::kIsRate);
  st.counters["wbytes/s"] = benchmark::Counter(iters * w.bytes(), benchmark::Counter::kIsRate);
  st.SetLabel(std::string(cpu::kernel_path_name(cpu::kernel_path())) +
              (enc == WeightEncoding::MXFP4
                   ? std::string(" act ") + cpu::activations_name(cpu::mxfp4_activations())
                   : std::string()));
}

void BM_bf16(benchmark::State& st) { run(st, WeightEncoding::BF16, -1); }
void BM_mxfp4_q8(benchmark::State& st) {
  run(st, WeightEncoding::MXFP4, int(cpu::Activations::Q8));
}
void BM_mxfp4_f32(benchmark::State& st) {
  run(st, WeightEncoding::MXFP4, int(cpu::Activations::F32));
}

std::vector<int> thread_counts() {
  std::vector<int> v;
  if (const char* e = std::getenv("KERNELS_BENCH_THREADS"))
    for (const char* p = e; *p;) {
      char* end = nullptr;
      const long t = std::strtol(p, &end, 10);
      if (end == p) break;
      if (t > 0) v.push_back(int(t));
      p = *end ? end + 1 : end;
    }
  if (v.empty()) v = {1, 2};
  return v;
}

void shapes_bf16(benchmark::internal::Benchmark* b) {
  for (int t : thread_counts())
    for (auto s : std::vector<std::vector<int64_t>>{{8192, 256, 1},
                                                    {256, 256, 1},
                                                    {256, 256, 64},
                                                    {8192, 256, 16},  // tiny
                                                    {4096, 2048, 1},
                                                    {4096, 2048, 64},   // 30B q_proj
                                                    {65536, 2048, 1}})  // 256 MB: from DRAM
      b->Args({s[0], s[1], s[2], t});
}

void shapes_mxfp4(benchmark::internal::Benchmark* b) {
  for (int t : thread_counts())
    for (auto s :
         std::vector<std::vector<int64_t>>{{64, 256, 1},
                                           {256, 64, 1},
                                           {64, 256, 48},  // tiny expert gate, down, prefill
                                           {768, 2048, 1},
                                           {2048, 768, 1},
                                           {768, 2048, 32},   // 30B expert
                                           {65536, 2048, 1},  // 68 MB: from DRAM
                                           {65536, 2048, 4},
                                           {65536, 2048, 8}})
      b->Args({s[0], s[1], s[2], t});
}

}  // namespace

BENCHMARK(BM_bf16)->Apply(shapes_bf16)->UseRealTime();
BENCHMARK(BM_mxfp4_q8)->Apply(shapes_mxfp4)->UseRealTime();
BENCHMARK(BM_mxfp4_f32)->Apply(shapes_mxfp4)->UseRealTime();

BENCHMARK_MAIN();
