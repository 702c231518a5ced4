// moetier synth (convert/synth.h): presets, router calibration, random
// weights generated in parallel, written shard by shard.
#include "convert/synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "format/safetensors_writer.h"
#include "format/tokenizer.h"
#include "model/architecture.h"

namespace moetier {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kShardBytes = 4ull << 30;
constexpr int64_t kMaxLayers = 1024;  // --layers, num_hidden_layers
constexpr double kA = 0.8, kB = 0.6;  // embedding = kA m + kB n_t

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t seed_of(uint64_t seed, const std::string& name) {
  uint64_t h = seed;
  for (char c : name) h = mix(h ^ uint8_t(c));
  return h;
}

// Element i's standard normal draw for stream `s` (Box-Muller on two hashes).
float normal(uint64_t s, uint64_t i) {
  const uint64_t a = mix(s ^ (2 * i)), b = mix(s ^ (2 * i + 1));
  const double u = (double(a >> 11) + 0.5) / 9007199254740992.0;
  const double v = double(b >> 11) / 9007199254740992.0;
  return float(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
}

// One tensor's bytes, generated on demand.
using Fill = std::function<void(std::byte*, int64_t /*elements or bytes*/)>;
struct Planned {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  Fill fill;
  uint64_t align = 0;
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return uint64_t(count()) * dtype_size(dtype); }
};

// bf16 [n] = f(i) in parallel.
void fill_bf16(std::byte* out, int64_t n, const std::function<float(int64_t)>& f) {
  global_pool().parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint16_t h = f32_to_bf16(f(i));
      std::memcpy(out + 2 * i, &h, 2);
    }
  });
}

void fill_bytes(std::byte* out, int64_t n, uint64_t s, uint8_t lo, uint8_t hi) {
  const uint64_t span = uint64_t(hi - lo) + 1;
  global_pool().parallel_for((n + 7) / 8, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      uint64_t r = mix(s ^ uint64_t(w));  // eight bytes per draw
      for (int64_t i = 8 * w; i < std::min(n, 8 * w + 8); ++i, r >>= 8)
        out[i] = std::byte(lo + uint8_t(span == 256 ? (r & 0xff) : (r & 0xff) % span));
    }
  });
}

struct Context {
  const SynthOptions& opt;
  ModelSpec spec;
  const MoeTensorNames& names;
  std::vector<float> m;  // [H] the shared embedding direction (unit)
  double tau = 0;
};

std::vector<float> unit_vector(uint64_t s, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  double ss = 0;
  for (int64_t i = 0; i < n; ++i)
    ss += double(v[size_t(i)] = normal(s, uint64_t(i))) * v[size_t(i)];
  for (auto& x : v) x = float(x / std::sqrt(ss));
  return v;
}

// The quantiles (e + 0.5) / E of N(0, 1), e < E, ascending.
std::vector<double> normal_quantiles(int64_t E) {
  std::vector<double> q(static_cast<size_t>(E));
  for (size_t e = 0; e < q.size(); ++e) {
    const double u = (double(e) + 0.5) / double(q.size());
    // inverse normal CDF by bisection on erf (precise enough here)
    double lo = -8, hi = 8;
    for (int it = 0; it < 60; ++it) {
      const double mid = (lo + hi) / 2;
      (0.5 * (1 + std::erf(mid / std::sqrt(2.0))) < u ? lo : hi) = mid;
    }
    q[e] = (lo + hi) / 2;
  }
  return q;
}

// Popularity scores of the E experts of `layer`: quantiles of N(0, 1),
// shuffled per layer.
std::vector<double> popularity(int64_t E, uint64_t seed, int64_t layer) {
  std::vector<double> quant = normal_quantiles(E);
  std::mt19937_64 rng(mix(seed ^ uint64_t(layer)));
  std::shuffle(quant.begin(), quant.end(), rng);
  return quant;
}

// The router of `layer`, row e: tau q_e / (kA sqrt(H)) along m, plus r_e / kB
// (r_e unit, random, orthogonal to m), q_e its popularity score. s: the seed.
Fill router_fill(const Context& c, uint64_t s, int64_t layer) {
  const int64_t H = c.spec.hidden_size;
  const double tau = c.tau;
  return [&c, s, H, quant = popularity(c.spec.num_experts, c.opt.seed, layer), tau](std::byte* o,
                                                                                    int64_t n) {
    // The random parts are made orthogonal to m: their projection on m
    // would otherwise add a fixed per-expert offset (std ~ 1 / 0.6).
    const int64_t E = n / H;
    std::vector<double> rm(static_cast<size_t>(E)),
        rn(static_cast<size_t>(E));  // r.m, |r - (r.m) m|
    global_pool().parallel_for(E, 1, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        double dot = 0, ss = 0;
        for (int64_t i = 0; i < H; ++i) {
          const double v = normal(s, uint64_t(e * H + i));
          dot += v * c.m[size_t(i)];
          ss += v * v;
        }
        rm[size_t(e)] = dot;
        rn[size_t(e)] = std::sqrt(ss - dot * dot);
      }
    });
    fill_bf16(o, n, [&](int64_t i) {
      const int64_t e = i / H, d = i % H;
      const double r = (normal(s, uint64_t(i)) - rm[size_t(e)] * c.m[size_t(d)]) / rn[size_t(e)];
      return float(tau * quant[size_t(e)] / (kA * std::sqrt(double(H))) * c.m[size_t(d)] + r / kB);
    });
  };
}

// The generator of a core tensor, by role.
Planned core_tensor(const Context& c, const TensorSpec& t, int64_t layer) {
  Planned p{t.name, DType::BF16, t.shape, nullptr, 0};
  const uint64_t s = seed_of(c.opt.seed, t.name);
  const int64_t H = c.spec.hidden_size;
  const float sd = 0.02f;
  switch (t.role) {
    case TensorRole::Norm:
      p.fill = [](std::byte* o, int64_t n) { fill_bf16(o, n, [](int64_t) { return 1.0f; }); };
      break;
    case TensorRole::Embedding: {
      const float scale = 1.0f;  // per element: |m| = |n_t| = sqrt(H), residual writes << this
      p.fill = [&c, s, H, scale](std::byte* o, int64_t n) {
        fill_bf16(o, n, [&](int64_t i) {
          return scale * (float(kA) * c.m[size_t(i % H)] * std::sqrt(float(H)) +
                          float(kB) * normal(s, uint64_t(i)));
        });
      };
      break;
    }
    case TensorRole::Router:
      p.fill = router_fill(c, s, layer);
      break;
    default: {
      const float k = t.role == TensorRole::ResidualWrite ? sd / 100 : sd;
      p.fill = [s, k](std::byte* o, int64_t n) {
        fill_bf16(o, n, [&](int64_t i) { return k * normal(s, uint64_t(i)); });
      };
    }
  }
  return p;
}

// The three projections of expert e of `layer`, as one 4 KiB-aligned record.
void expert_tensors(const Context& c, int64_t layer, int64_t e, std::vector<Planned>& out) {
  const int64_t H = c.spec.hidden_size, I = c.spec.expert_intermediate;
  const std::string q = fmt::format("{}{}.", c.names.experts_prefix(layer), e);
  for (int p = 0; p < 3; ++p) {
    const bool down = p == 2;
    const int64_t rows = down ? H : I, cols = down ? I : H;
    const std::string base = q + c.names.projs[size_t(p)];
    const uint64_t s = seed_of(c.opt.seed, base);
    if (c.opt.experts == "mxfp4") {
      out.push_back({base + ".weight",
                     DType::U8,
                     {rows, cols / 2},
                     [s](std::byte* o, int64_t n) { fill_bytes(o, n, s, 0, 255); },
                     p == 0 ? 4096u : 64u});
      const uint8_t sc = down ? 127 - 16 : 127 - 6;
      out.push_back({base + ".scale",
                     DType::F8_E8M0,
                     {rows, cols / 32},
                     [s, sc](std::byte* o, int64_t n) { fill_bytes(o, n, s ^ 1, sc, sc); },
                     64});
    } else {
      const float k = down ? 0.0002f : 0.02f;
      out.push_back({base + ".weight",
                     DType::BF16,
                     {rows, cols},
                     [s, k](std::byte* o, int64_t n) {
                       fill_bf16(o, n, [&](int64_t i) { return k * normal(s, uint64_t(i)); });
                     },
                     p == 0 ? 4096u : 64u});
    }
  }
}

}  // namespace

double hot_call_share(double tau, int64_t experts, int64_t k, double share, int samples,
                      uint64_t seed) {
  check(experts > 0 && k > 0 && k <= experts && samples > 0 && share > 0 && share <= 1,
        "hot_call_share: {} experts, top-{}, {} samples, share {}", experts, k, samples, share);
  const std::vector<double> q = normal_quantiles(experts);
  std::vector<int64_t> calls(static_cast<size_t>(experts), 0);
  std::vector<std::pair<double, int64_t>> l(static_cast<size_t>(experts));
  for (int t = 0; t < samples; ++t) {
    // Token t's own stream. (It was seed + t, whose draws normal() hashes
    // from (seed + t) ^ 2e: tokens whose seed + t differ only in bits 1-6
    // drew permutations of the same 64 values, 3072 distinct draws for 3000
    // tokens of 64 experts, and the estimate came out about 2 points low.)
    const uint64_t st = mix(seed ^ mix(uint64_t(t) + 1));
    for (int64_t e = 0; e < experts; ++e)
      l[size_t(e)] = {tau * q[size_t(e)] + double(normal(st, uint64_t(e))), e};
    std::partial_sort(l.begin(), l.begin() + k, l.end(), std::greater<>());
    for (int64_t j = 0; j < k; ++j) ++calls[size_t(l[size_t(j)].second)];
  }
  std::sort(calls.begin(), calls.end(), std::greater<>());
  const int64_t hot = std::max<int64_t>(1, int64_t(std::llround(share * double(experts))));
  const double top = double(std::accumulate(calls.begin(), calls.begin() + hot, int64_t(0)));
  return top / double(int64_t(samples) * k);
}

namespace {

double calibrate_tau(const SynthOptions& o, const ModelSpec& s) {
  double lo = 0, hi = 6;
  for (int it = 0; it < 20; ++it) {
    const double mid = (lo + hi) / 2;
    const double got =
        hot_call_share(mid, s.num_experts, s.experts_per_token, o.hot_share, 10000, o.seed);
    (got < o.hot_calls ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// Every tensor of the checkpoint in file order: embeddings first, then each
// layer's core tensors and experts, the final norm and the LM head last.
std::vector<Planned> plan(const Context& c, const nlohmann::json& config) {
  const auto core = c.spec.arch->core_tensors(config, "config.json");
  check(!core.empty(), "synth: preset '{}' gives no tensor map", c.opt.preset);
  std::vector<Planned> out;
  auto layer_of = [&](const std::string& n) -> int64_t {
    if (!n.starts_with(c.names.layers)) return -1;
    return std::stoll(n.substr(c.names.layers.size()));
  };
  std::vector<const TensorSpec*> tail;
  for (const TensorSpec& t : core) {
    if (t.optional) continue;
    if (layer_of(t.name) < 0 && t.role != TensorRole::Embedding) tail.push_back(&t);
  }
  for (const TensorSpec& t : core)
    if (t.role == TensorRole::Embedding) out.push_back(core_tensor(c, t, -1));
  for (int64_t l = 0; l < c.spec.num_layers; ++l) {
    for (const TensorSpec& t : core)
      if (layer_of(t.name) == l) out.push_back(core_tensor(c, t, l));
    if (c.spec.is_moe_layer(l))
      for (int64_t e = 0; e < c.spec.num_experts; ++e) expert_tensors(c, l, e, out);
  }
  for (const TensorSpec* t : tail) out.push_back(core_tensor(c, *t, -1));
  return out;
}

void copy_tokenizer(const SynthOptions& o, const ModelSpec& s, const fs::path& dir) {
  check(!o.tokenizer.empty(), "synth: --tokenizer DIR is needed (a tokenizer.json for the model)");
  const Tokenizer tok = Tokenizer::load(o.tokenizer);
  check(tok.vocab_size() <= s.vocab_size,
        "synth: {}: the tokenizer has {} ids, more than the preset's vocab_size {}",
        o.tokenizer.string(), tok.vocab_size(), s.vocab_size);
  const fs::path src = fs::is_directory(o.tokenizer) ? o.tokenizer : o.tokenizer.parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(src / f)) fs::copy_file(src / f, dir / f);
}

// SynthOptions::set on the preset's config: each KEY an integer field of it,
// each VALUE a positive integer (one-line error naming the --set otherwise).
void apply_sets(const SynthOptions& o, nlohmann::json& config) {
  for (const std::string& kv : o.set) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    check(eq != std::string::npos && !key.empty(), "--set {}: expected KEY=VALUE", kv);
    check(config.contains(key) && config[key].is_number_integer(),
          "--set {}: '{}' is not an integer field of preset '{}'", kv, key, o.preset);
    check(key != "num_hidden_layers" || o.layers == 0,
          "--set {}: --layers {} sets it too (give one of them)", kv, o.layers);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    check(!v.empty() && v[0] != '-' && ec == std::errc() && end == v.data() + v.size() && n > 0,
          "--set {}: '{}' is not a positive integer", kv, v);
    config[key] = n;  // (the config parser bounds every size)
  }
}

// The preset's config.json with --layers and --set applied, after checking
// the options; its architecture in arch.
nlohmann::json preset_config(const SynthOptions& opt, const Architecture*& arch) {
  nlohmann::json config;
  std::string known;
  arch = nullptr;
  for (const Architecture* a : architectures()) {
    for (std::string_view p : a->presets()) known += (known.empty() ? "" : ", ") + std::string(p);
    if (config.is_null() && !(config = a->preset(opt.preset)).is_null()) arch = a;
  }
  check(arch != nullptr, "--preset: '{}' is not a preset (presets: {})", opt.preset, known);
  check(opt.experts == "mxfp4" || opt.experts == "bf16", "--experts: '{}' (mxfp4 or bf16)",
        opt.experts);
  check(opt.hot_share > 0 && opt.hot_share < 1, "--hot-share: {} (expected between 0 and 1)",
        opt.hot_share);
  check(opt.hot_calls > opt.hot_share && opt.hot_calls < 1,
        "--hot-calls: {} (expected above --hot-share {} and below 1)", opt.hot_calls,
        opt.hot_share);
  check(opt.layers >= 0, "--layers: {} (expected a positive count)", opt.layers);
  if (opt.layers > 0) config["num_hidden_layers"] = opt.layers;
  apply_sets(opt, config);
  return config;
}

// The planned tensors in file order as shards of at most kShardBytes (and at
// least one tensor each) in dir, with their index; adds to rep's bytes and shards.
void write_shards(const fs::path& dir, const std::vector<Planned>& all, const SynthOptions& opt,
                  SynthReport& rep) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (in_shard + all[i].bytes() > kShardBytes && !shards.back().empty())
      shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += all[i].bytes() + 4096;
  }
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<std::vector<std::byte>> bytes;
    std::vector<TensorToWrite> tensors;
    for (size_t i : shards[s]) {
      const Planned& p = all[i];
      bytes.emplace_back(p.bytes());
      p.fill(bytes.back().data(), p.count());
      tensors.push_back({p.name, p.dtype, p.shape, bytes.back(), p.align});
      weight_map[p.name] = file;
    }
    rep.bytes += write_safetensors(dir / file, tensors, {4096, {}});
    if (opt.log)
      opt.log(
          fmt::format("synth: {} ({} tensors, {})", file, tensors.size(), format_bytes(rep.bytes)));
  }
  rep.shards = int64_t(shards.size());
  write_safetensors_index(dir / "model.safetensors.index.json", weight_map, rep.bytes);
}

}  // namespace

SynthReport write_synthetic(const fs::path& out, const SynthOptions& opt) {
  const Architecture* arch = nullptr;
  nlohmann::json config = preset_config(opt, arch);
  std::vector<std::string> problems;
  Context c{opt, arch->parse(config, "config.json", problems), arch->names(), {}, 0};
  check(problems.empty(), "synth: preset '{}': {}", opt.preset,
        problems.empty() ? "" : problems[0]);
  check(c.spec.num_layers <= kMaxLayers, "synth: preset '{}': {} layers (at most {})", opt.preset,
        c.spec.num_layers, kMaxLayers);
  bool moe = false;
  for (int64_t l = 0; l < c.spec.num_layers; ++l) moe = moe || c.spec.is_moe_layer(l);
  check(moe, "synth: preset '{}': no layer is a MoE layer with these settings", opt.preset);
  check(opt.experts != "mxfp4" ||
            (c.spec.hidden_size % 32 == 0 && c.spec.expert_intermediate % 32 == 0),
        "synth: preset '{}': hidden_size {} and moe_intermediate_size {} must be multiples of 32 "
        "for MXFP4 experts",
        opt.preset, c.spec.hidden_size, c.spec.expert_intermediate);
  AtomicDir dir(out);  // (an OUT that exists is refused before the work)
  c.m = unit_vector(seed_of(opt.seed, "m"), c.spec.hidden_size);
  c.tau = calibrate_tau(opt, c.spec);
  SynthReport rep;
  rep.tau = c.tau;
  rep.hot_calls = hot_call_share(c.tau, c.spec.num_experts, c.spec.experts_per_token, opt.hot_share,
                                 20000, opt.seed + 7);
  check(std::abs(rep.hot_calls - opt.hot_calls) <= 0.01,
        "--hot-calls: {} cannot be reached with {} experts and top-{} (the router's scale gives "
        "{:.3f})",
        opt.hot_calls, c.spec.num_experts, c.spec.experts_per_token, rep.hot_calls);
  copy_tokenizer(opt, c.spec, dir.path());
  write_shards(dir.path(), plan(c, config), opt, rep);
  config["moetier"] = {{"synthetic",
                        {{"preset", opt.preset},
                         {"seed", opt.seed},
                         {"experts", opt.experts},
                         {"router_tau", c.tau},
                         {"hot_share", opt.hot_share},
                         {"hot_calls", rep.hot_calls}}}};
  write_file_atomic(dir.path() / "config.json", config.dump(2) + "\n");
  dir.commit();
  return rep;
}

}  // namespace moetier
