// The CUDA backend's environment switches: A/B variants of the decode kernels,
// the timing and trace outputs. Read once, by the constructor (read_switches),
// in a fixed order; a bad value is a one-line error that names the variable.
// The kernels' variants are process-wide (cuda::set_*), the rest members.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/error.h"
#include "kernels/cuda/cuda.h"

namespace moetier {
namespace {

// The integer in environment variable var, lo to hi (one-line error
// otherwise), or def when it is not set.
long long env_int(const char* var, long long lo, long long hi, long long def) {
  const char* v = std::getenv(var);
  if (!v) return def;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  check(end != v && *end == '\0' && n >= lo && n <= hi, "{}={}: expected an integer from {} to {}",
        var, v, lo, hi);
  return n;
}

// The value of var, one of ok (one-line error otherwise), or "" when it is not set.
std::string env_choice(const char* var, std::initializer_list<const char*> ok) {
  const char* v = std::getenv(var);
  if (!v) return {};
  std::string all;
  for (const char* o : ok) {
    if (std::string(v) == o) return v;
    all += all.empty() ? o : std::string(", ") + o;
  }
  fail("{}={}: expected one of {}", var, v, all);
}

// MOETIER_CUDA_STAGE=copy (default) | predict (the next layer's prediction,
// nothing copied) | 0 (no staging), and MOETIER_CUDA_STAGE_BLOCKS=N blocks
// per staged expert: A/B of --prefetch next-layer on the mapped host tier.
void read_stage_env(int& mode, int& blocks) {
  if (const std::string v = env_choice("MOETIER_CUDA_STAGE", {"copy", "predict", "0"}); !v.empty())
    mode = v == "copy" ? 2 : v == "predict" ? 1 : 0;
  blocks = int(env_int("MOETIER_CUDA_STAGE_BLOCKS", 1, 1024, blocks));
}

// MOETIER_CUDA_SKIP: a comma-separated list of qkv, attn, o, router, experts.
unsigned parse_skip(const char* v) {
  unsigned m = 0;
  std::string s = v ? v : "";
  for (size_t b = 0; !s.empty() && b <= s.size();) {
    const size_t e = std::min(s.find(',', b), s.size());
    const std::string op = s.substr(b, e - b);
    const char* names[] = {"qkv", "attn", "o", "router", "experts"};  // Skip's bits, in order
    const auto* it = std::find(std::begin(names), std::end(names), op);
    check(it != std::end(names),
          "MOETIER_CUDA_SKIP={}: unknown op '{}' (qkv, attn, o, router, experts)", s, op);
    m |= 1u << (it - std::begin(names));
    b = e + 1;
  }
  return m;
}

// The q8 MoE kernels' variants (A/B; cuda::MoeQ8Kernels): MOETIER_CUDA_MOE_GATE=8 (default) |
// 16 warps per gate/up block; MOETIER_CUDA_MOE_DOWN=warp | 2 | 4 | pair (default): the down
// kernel, a warp per 2 rows, blocks splitting 2 or 4 rows, or two groups of 4 rows a block (one
// wave; where k x inter / 32 <= 512, else 4). Unset: the pair kernel where the 4-row split
// kernel's grid would pass 4 blocks a multiprocessor (DeepSeek-shaped hidden 4096), else 4.
// MOETIER_CUDA_MOE_STREAM=1: the one-launch step where it applies. Returns that choice.
bool read_moe_q8_env() {
  cuda::MoeQ8Kernels mk;
  if (auto v = env_choice("MOETIER_CUDA_MOE_GATE", {"8", "16"}); !v.empty())
    mk.gate_warps = std::stoi(v);
  if (auto v = env_choice("MOETIER_CUDA_MOE_DOWN", {"warp", "2", "4", "pair"}); !v.empty()) {
    mk.down_rows = v == "warp" ? 0 : v == "pair" ? 4 : std::stoi(v);
    mk.down_pair = v == "pair";
    mk.down_auto = false;  // the variable chose
  }
  if (auto v = env_choice("MOETIER_CUDA_MOE_STREAM", {"0", "1"}); !v.empty()) mk.stream = v == "1";
  // MOETIER_CUDA_PREDICT_PASSES=N: gate/up starts N of its first 4 passes of
  // the predicted experts before its wait (A/B)
  mk.predict_passes = int(env_int("MOETIER_CUDA_PREDICT_PASSES", 1, 4, 4));
  cuda::set_moe_q8_kernels(mk);
  return mk.stream;
}

// The GEMV variants (A/B): MOETIER_CUDA_GEMV_WARP_ROWS=N: matrices of N rows
// or more take the warp GEMV (default 32768: the LM head), the others the
// block GEMV, MOETIER_CUDA_GEMV_BLOCK_ROWS=1 | 2 | 4 | 8 its rows per block;
// MOETIER_CUDA_ROUTER_ROWS=1 | 2 (default) | 4: rows per block of the fused
// router (2 gave the DeepSeek-shaped model 0.6% over 1 and 4, Qwen3 shapes no
// change); MOETIER_CUDA_ARGMAX_VALUES=32 (default) | 16 | 64: values per
// argmax thread at the least.
void read_gemv_env() {
  if (std::getenv("MOETIER_CUDA_GEMV_WARP_ROWS"))
    cuda::set_gemv_warp_rows(env_int("MOETIER_CUDA_GEMV_WARP_ROWS", 0, INT64_MAX, 0));
  if (const std::string v = env_choice("MOETIER_CUDA_GEMV_BLOCK_ROWS", {"1", "2", "4", "8"});
      !v.empty())
    cuda::set_gemv_block_rows(std::stoi(v));
  const std::string rr = env_choice("MOETIER_CUDA_ROUTER_ROWS", {"1", "2", "4"});
  cuda::set_router_rows(rr.empty() ? 0 : std::stoi(rr));  // 0: the default
  const std::string av = env_choice("MOETIER_CUDA_ARGMAX_VALUES", {"16", "32", "64"});
  cuda::set_argmax_values(av.empty() ? 32 : std::stoi(av));
}

}  // namespace

void CudaBackend::read_switches() {
  // MOETIER_CUDA_PREFILL=f32: every chunk on the f32 path (tests).
  const char* pf = std::getenv("MOETIER_CUDA_PREFILL");
  f32_prefill_ = pf && std::string(pf) == "f32";
  // MOETIER_CUDA_DECODE=legacy: the warp-per-row GEMV and the four-launch MoE
  // step instead of kernels/cuda/decode.cu (for A/B measurements).
  const char* dk = std::getenv("MOETIER_CUDA_DECODE");
  legacy_decode_ = dk && std::string(dk) == "legacy";
  // MOETIER_CUDA_ACT=f32: f32 activations in the resident MXFP4 decode step
  // (exact, what the golden tests pin) instead of q8 (kernels/cuda/decode_q8.cu).
  act_q8_ = env_choice("MOETIER_CUDA_ACT", {"q8", "f32"}) != "f32";
  moe_stream_ = read_moe_q8_env();
  // MOETIER_CUDA_FUSE=0: at decode, the layer's norms and residual adds as
  // separate launches instead of inside their consumers and producers (A/B).
  fuse_ = env_choice("MOETIER_CUDA_FUSE", {"0", "1"}) != "0";
  // MOETIER_CUDA_ROUTER_Q8=0: x quantized for the q8 MoE kernels by a kernel
  // of its own after the router instead of inside the router (A/B).
  router_q8_ = env_int("MOETIER_CUDA_ROUTER_Q8", 0, 1, 1) == 1;
  // MOETIER_CUDA_ROUTER_STASH=0: the router's blocks load x again after their
  // count to quantize it, instead of using the values their dot read
  // (RouterQ8::stash; A/B: +0.3% decode on one H200, docs/cuda.md).
  router_stash_ = env_int("MOETIER_CUDA_ROUTER_STASH", 0, 1, 1) == 1;
  // MOETIER_CUDA_GRAPH_UPDATE=0: every recording instantiates its graph anew
  // instead of updating a dropped one (A/B).
  graph_update_ = env_int("MOETIER_CUDA_GRAPH_UPDATE", 0, 1, 1) == 1;
  predict_on_ = read_predict_env();
  // MOETIER_CUDA_CARVEOUT=P: every kernel asks for P% of the largest
  // shared-memory carveout (launch.cuh apply_carveout); unset: no preference.
  cuda::set_carveout(int(env_int("MOETIER_CUDA_CARVEOUT", -1, 100, -1)));
  read_stage_env(stage_mode_, stage_blocks_);
  read_output_switches();
  read_gemv_env();
  // MOETIER_CUDA_ARGMAX_FENCE=0 (default) | 1: the decode graph's argmax
  // fences its host write at system scope (A/B; +0.4% for both defaults on
  // one H100, docs/cuda.md)
  argmax_fence_ = env_choice("MOETIER_CUDA_ARGMAX_FENCE", {"0", "1"}) == "1";
  // MOETIER_CUDA_QKV_ROWS=1 | 2 | 4 | 8: rows per block of the q/k/v GEMV (A/B)
  if (const std::string v = env_choice("MOETIER_CUDA_QKV_ROWS", {"1", "2", "4", "8"}); !v.empty())
    qkv_rows_ = std::stoi(v);
  skip_ = parse_skip(std::getenv("MOETIER_CUDA_SKIP"));
}

// MOETIER_CUDA_TIMING=FILE: each op's time, by events (flush_timing).
// MOETIER_CUDA_TRACE=FILE: every block's wait of every PDL kernel recorded
// (cuda::trace_begin; a build with -DMOETIER_CUDA_TRACE=ON), one CSV line per
// launch at the end; MOETIER_CUDA_TRACE_ROWS: the rows kept (default 4M, 128
// MiB; a block with M marks takes 1 + M; the first rows are kept).
void CudaBackend::read_output_switches() {
  if (const char* t = std::getenv("MOETIER_CUDA_TIMING")) timing_path_ = t;
  if (const char* t = std::getenv("MOETIER_CUDA_TRACE")) {
    const long long rows = env_int("MOETIER_CUDA_TRACE_ROWS", 2, (1ll << 32) - 1, 1 << 22);
    check(cuda::trace_begin(size_t(rows)),
          "MOETIER_CUDA_TRACE={}: this build records no trace (configure with "
          "-DMOETIER_CUDA_TRACE=ON), or no device memory for {} rows",
          t, rows);
    trace_path_ = t;
  }
}

}  // namespace moetier
