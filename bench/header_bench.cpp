// header_bench: safetensors header parsing time against the number of tensors
// (Google Benchmark; run by hand, never a timed test).
//
//   header_bench [--benchmark_filter=Parse] [--benchmark_min_time=0.2]
//
// Each case writes one model.safetensors with N tensors (names, dtypes and
// shapes like a per-expert MoE checkpoint's: model.layers.L.mlp.experts.E.
// {gate,up,down}_proj.weight, U8 [4]) into a temporary directory, then times
// parse_safetensors_header (BM_Parse) and Checkpoint::open (BM_Open: parse +
// index of names + mmap) on it. Complexity() fits the time against N: a linear
// parser reports O(N) with a flat per-tensor cost (docs/loading.md).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"

namespace fs = std::filesystem;
using namespace moetier;

namespace {

// A directory holding config.json and a model.safetensors of n tensors.
fs::path make_checkpoint(int64_t n) {
  fs::path dir = fs::temp_directory_path() / fmt::format("header_bench-{}-{}", ::getpid(), n);
  if (fs::exists(dir / "model.safetensors")) return dir;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{}";
  std::string h = "{";
  static const char* projs[] = {"gate_proj", "up_proj", "down_proj"};
  for (int64_t i = 0; i < n; ++i) {
    int64_t l = i / 768, e = (i / 3) % 256;
    h += fmt::format(R"({}"model.layers.{}.mlp.experts.{}.{}.weight":{{"dtype":"U8",)"
                     R"("shape":[4],"data_offsets":[{},{}]}})",
                     i ? "," : "", l, e, projs[i % 3], 4 * i, 4 * i + 4);
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  uint64_t len = h.size();
  f.write(reinterpret_cast<const char*>(&len), 8);  // little-endian host
  f << h;
  std::string data(size_t(4 * n), '\x01');
  f << data;
  return dir;
}

void BM_Parse(benchmark::State& st) {
  const fs::path file = make_checkpoint(st.range(0)) / "model.safetensors";
  for (auto _ : st) {
    Shard shard;
    std::vector<std::string> problems;
    auto ts = parse_safetensors_header(file, 0, shard, problems);
    if (!problems.empty() || int64_t(ts.size()) != st.range(0)) {
      st.SkipWithError(problems.empty() ? "wrong tensor count" : problems[0].c_str());
      break;
    }
    benchmark::DoNotOptimize(ts.data());
  }
  st.SetComplexityN(st.range(0));
  st.counters["per_tensor"] =
      benchmark::Counter(double(st.range(0)), benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kInvert);
}

void BM_Open(benchmark::State& st) {
  const fs::path dir = make_checkpoint(st.range(0));
  for (auto _ : st) {
    auto ck = Checkpoint::open(dir);
    benchmark::DoNotOptimize(ck->tensors().data());
  }
  st.SetComplexityN(st.range(0));
}

void cleanup() {
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path())) {
    if (e.path().filename().string().starts_with(fmt::format("header_bench-{}-", ::getpid())))
      fs::remove_all(e.path());
  }
}

}  // namespace

BENCHMARK(BM_Parse)
    ->Arg(1000)
    ->Arg(3000)
    ->Arg(10000)
    ->Arg(30000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity();
BENCHMARK(BM_Open)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond)->Complexity();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  cleanup();
  return 0;
}
