// The architecture seam, proved from outside the library: "toy_moe" (token
// embedding; L blocks of rmsnorm -> softmax top-k routed experts -> residual,
// no attention; final norm; tied LM head), with its own config fields, tensor
// names and forward on the Backend seam, is defined here and registered at run
// time. With no toy-specific code in the library, check_checkpoint, model_info,
// Engine + Session + generate(), score_windows, TraceRecorder and the arena
// work on it, and its forward matches a scalar double-precision reference.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "experts/trace.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "golden/exact_activations.h"  // compared with a double reference of f32 math
#include "model/architecture.h"
#include "model/check.h"
#include "model/info.h"
#include "numeric.h"
#include "qwen3_fixture.h"
#include "runtime/eval.h"
#include "runtime/generate.h"
#include "runtime/moe_block.h"
#include "runtime/session.h"
#include "runtime/trace_recorder.h"
#include "runtime/weights.h"
#include "runtime/workspace.h"

using namespace moetier;
using moetier::testing::rel_err;
using moetier::testing::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---- The toy's static side: config fields, tensor names, tensor map ----

const MoeTensorNames& toy_names() {
  static const MoeTensorNames n = [] {
    MoeTensorNames m;  // not the transformers defaults, to prove they are honored
    m.layers = "blocks.";
    m.router = "moe.router.weight";
    m.experts = "moe.experts.";
    m.projs = {"w1", "w3", "w2"};  // gate, up, down
    return m;
  }();
  return n;
}

struct ToyConfig {
  int64_t vocab = 0, dim = 0, blocks = 0, experts = 0, top_k = 0, expert_dim = 0, context = 0;
  double eps = 1e-5;
};

ToyConfig parse_toy(const json& j, const fs::path& file, std::vector<std::string>& problems) {
  ToyConfig c;
  auto field = [&](const char* name, int64_t& out) {
    auto it = j.find(name);
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0)
      out = it->get<int64_t>();
    else
      problems.push_back(fmt::format("{}: field '{}': {}", file.string(), name,
                                     it == j.end() ? "missing" : "expected a positive integer"));
  };
  using F = std::pair<const char*, int64_t*>;
  for (auto [name, out] :
       {F{"vocab", &c.vocab}, F{"dim", &c.dim}, F{"blocks", &c.blocks}, F{"experts", &c.experts},
        F{"top_k", &c.top_k}, F{"expert_dim", &c.expert_dim}, F{"context", &c.context}})
    field(name, *out);
  if (j.contains("eps")) c.eps = j["eps"].get<double>();
  if (c.top_k > c.experts)
    problems.push_back(
        fmt::format("{}: field 'top_k': {} exceeds experts {}", file.string(), c.top_k, c.experts));
  return c;
}

class ToyArchitecture final : public Architecture {
 public:
  std::string_view name() const override { return "toy_moe"; }
  std::vector<std::string_view> class_names() const override { return {"ToyMoeForCausalLM"}; }
  const MoeTensorNames& names() const override { return toy_names(); }

  ModelSpec parse(const json& config, const fs::path& file,
                  std::vector<std::string>& problems) const override {
    const ToyConfig c = parse_toy(config, file, problems);
    // Every block is MoE; kv_bytes_per_token 0: no attention.
    return {.arch = this,
            .vocab_size = c.vocab,
            .hidden_size = c.dim,
            .num_layers = c.blocks,
            .max_positions = c.context,
            .num_experts = c.experts,
            .experts_per_token = c.top_k,
            .expert_intermediate = c.expert_dim,
            .moe = std::vector<uint8_t>(size_t(c.blocks), 1)};
  }

  std::vector<TensorSpec> core_tensors(const json& config, const fs::path& file) const override {
    std::vector<std::string> ignored;  // parse() reports them
    const ToyConfig c = parse_toy(config, file, ignored);
    if (!c.vocab || !c.dim || !c.blocks || !c.experts) return {};
    std::vector<TensorSpec> out{{"embed.weight", {c.vocab, c.dim}}};
    for (int64_t l = 0; l < c.blocks; ++l) {
      out.push_back({toy_names().layer_prefix(l) + "norm.weight", {c.dim}});
      out.push_back({toy_names().router_tensor(l), {c.experts, c.dim}});
    }
    out.push_back({"final_norm.weight", {c.dim}});
    return out;
  }

  json with_num_experts(const json& config, int64_t n) const override {
    json c = config;
    c["experts"] = n;
    return c;
  }
};

// ---- The toy's forward, on the Backend seam ----

// Position counter only: without attention a token's output depends on it alone.
struct ToyState final : SequenceState {
  explicit ToyState(int64_t capacity) : cap(capacity) {}
  int64_t size() const override { return pos; }
  void set_size(int64_t n) override { pos = n; }
  int64_t capacity() const override { return cap; }
  uint64_t bytes() const override { return 0; }
  int64_t pos = 0, cap = 0;
};

class ToyModel final : public Model {
 public:
  static std::unique_ptr<Model> load(const Checkpoint& ck, Backend& be);

  const ModelSpec& spec() const override { return spec_; }
  const Checkpoint& checkpoint() const override { return *ck_; }
  Backend& backend() const override { return *be_; }
  uint64_t core_device_bytes() const override { return store_.bytes(); }
  std::unique_ptr<SequenceState> new_state(int64_t capacity) const override {
    return std::make_unique<ToyState>(capacity);
  }
  std::vector<float> forward(std::span<const int32_t> tokens, int64_t start_pos,
                             SequenceState& state, ExpertProvider& experts,
                             const ForwardOptions& opt) const override;

 private:
  void observe(const ForwardOptions& opt, int64_t layer, int64_t start_pos, const Routing& r,
               std::span<const int32_t> tokens, const float* xn) const;

  const Checkpoint* ck_ = nullptr;
  Backend* be_ = nullptr;
  ModelSpec spec_;
  float eps_ = 0;
  WeightStore store_;
  std::vector<std::vector<float>> host_;  // decoded norms (used in place on the CPU)
  MatView embed_;                         // [vocab, dim], also the LM head (tied)
  std::vector<const float*> norms_;       // [blocks] -> [dim] device
  std::vector<MatView> routers_;          // [blocks] -> [experts, dim]
  const float* final_norm_ = nullptr;     // [dim] device
};

std::unique_ptr<Model> ToyModel::load(const Checkpoint& ck, Backend& be) {
  std::unique_ptr<ToyModel> m(new ToyModel());
  m->ck_ = &ck;
  m->be_ = &be;
  m->spec_ = model_spec(ck);
  std::vector<std::string> ignored;
  m->eps_ = float(parse_toy(ck.config(), ck.dir() / "config.json", ignored).eps);
  const int64_t V = m->spec_.vocab_size, H = m->spec_.hidden_size, E = m->spec_.num_experts;
  auto vec = [&](const std::string& name) {
    m->host_.push_back(runtime::vector_f32(ck, name, H));
    return be.vector(m->host_.back(), m->store_);
  };
  m->embed_ = be.weights(runtime::matrix_view(ck, "embed.weight", V, H), m->store_);
  for (int64_t l = 0; l < m->spec_.num_layers; ++l) {
    m->norms_.push_back(vec(toy_names().layer_prefix(l) + "norm.weight"));
    m->routers_.push_back(
        be.weights(runtime::matrix_view(ck, toy_names().router_tensor(l), E, H), m->store_));
  }
  m->final_norm_ = vec("final_norm.weight");
  return m;
}

void ToyModel::observe(const ForwardOptions& opt, int64_t layer, int64_t start_pos,
                       const Routing& r, std::span<const int32_t> tokens, const float* xn) const {
  if (!opt.observer || !*opt.observer) return;
  std::vector<float> host(
      size_t(r.n_tokens * spec_.hidden_size));  // the observer reads host memory
  be_->to_host(host.data(), xn, host.size() * sizeof(float));
  const Phase phase = r.n_tokens > 1 ? Phase::Prefill : Phase::Decode;
  (*opt.observer)({layer, start_pos, phase, &r, tokens, host.data()});
}

std::vector<float> ToyModel::forward(std::span<const int32_t> tokens, int64_t start_pos,
                                     SequenceState& state, ExpertProvider& experts,
                                     const ForwardOptions& opt) const {
  auto* st = dynamic_cast<ToyState*>(&state);
  check(st != nullptr, "toy_moe: forward with another architecture's state");
  const int64_t n = int64_t(tokens.size()), H = spec_.hidden_size, V = spec_.vocab_size;
  check(n > 0 && start_pos >= 0 && start_pos <= st->pos && start_pos + n <= st->cap,
        "toy_moe: positions {}..{} outside the state", start_pos, start_pos + n - 1);
  for (int32_t t : tokens) check(t >= 0 && t < V, "toy_moe: token {} outside the vocabulary", t);
  Backend& be = *be_;
  Workspace ws(be);
  float* x = ws.get(0, n * H);   // [n, dim] residual stream
  float* xn = ws.get(1, n * H);  // [n, dim] normalized
  float* y = ws.get(2, n * H);   // [n, dim] the experts' sum
  be.embed(embed_, tokens, x);
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    be.rmsnorm(x, norms_[size_t(l)], n, H, eps_, xn);
    const Routing r =
        route_softmax_topk(be, routers_[size_t(l)], xn, n, spec_.experts_per_token, true, ws);
    observe(opt, l, start_pos, r, tokens, xn);
    run_moe_block(be, experts,
                  {.layer = l,
                   .phase = n > 1 ? Phase::Prefill : Phase::Decode,
                   .hidden = H,
                   .intermediate = spec_.expert_intermediate,
                   .routing = &r,
                   .x = xn,
                   .out = y,
                   .after_first_submit = {}});
    be.add(x, y, n * H);
  }
  st->pos = start_pos + n;
  const int64_t first = opt.all_logits ? 0 : n - 1, rows = n - first;
  be.rmsnorm(x + first * H, final_norm_, rows, H, eps_, xn);
  float* dl = ws.get(3, rows * V);  // [rows, vocab] device
  be.matmul(embed_, xn, rows, dl);  // tied LM head
  std::vector<float> logits(size_t(rows * V));
  be.to_host(logits.data(), dl, logits.size() * sizeof(float));
  return logits;
}

void register_toy() {
  static std::once_flag once;
  std::call_once(once, [] {
    static const ToyArchitecture kToy;
    register_architecture(kToy);
    register_forward("toy_moe", &ToyModel::load);
  });
}

// ---- A random toy checkpoint and its scalar reference ----

struct Toy {
  int64_t vocab = 29, dim = 64, blocks = 3, experts = 6, top_k = 2, expert_dim = 32;
  bool mxfp4 = false;           // else f32 experts
  std::set<std::string> omit;   // tensors left out
  json patch = json::object();  // config fields overridden
  uint32_t seed = 11;
};

struct Tensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
using Tensors = std::map<std::string, Tensor>;

Tensor f32_tensor(std::vector<int64_t> shape, std::mt19937& rng, float mean, float sd) {
  const size_t n =
      size_t(std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>()));
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (float& f : v) f = nd(rng);
  Tensor t{DType::F32, std::move(shape), std::vector<std::byte>(n * 4)};
  std::memcpy(t.bytes.data(), v.data(), n * 4);
  return t;
}

// One expert matrix [out, in]: f32, or MXFP4 codes + e8m0 scales near 1/8.
void add_matrix(Tensors& w, const std::string& p, int64_t out, int64_t in, bool mxfp4,
                std::mt19937& rng) {
  if (!mxfp4) return void(w[p + "weight"] = f32_tensor({out, in}, rng, 0.0f, 0.2f));
  std::uniform_int_distribution<int> code(0, 255), exp(122, 126);
  Tensor q{DType::U8, {out, in / 2}, std::vector<std::byte>(size_t(out * in / 2))};
  Tensor s{DType::F8_E8M0, {out, in / 32}, std::vector<std::byte>(size_t(out * in / 32))};
  for (auto& b : q.bytes) b = std::byte(code(rng));
  for (auto& b : s.bytes) b = std::byte(exp(rng));
  w[p + "weight"] = std::move(q);
  w[p + "scale"] = std::move(s);
}

Tensors toy_tensors(const Toy& t) {
  std::mt19937 rng(t.seed);
  const MoeTensorNames& n = toy_names();
  Tensors w;
  w["embed.weight"] = f32_tensor({t.vocab, t.dim}, rng, 0.0f, 1.0f);
  for (int64_t l = 0; l < t.blocks; ++l) {
    w[n.layer_prefix(l) + "norm.weight"] = f32_tensor({t.dim}, rng, 1.0f, 0.1f);
    w[n.router_tensor(l)] = f32_tensor({t.experts, t.dim}, rng, 0.0f, 0.5f);
    for (int64_t e = 0; e < t.experts; ++e) {
      const std::string p = n.experts_prefix(l) + std::to_string(e) + ".";
      add_matrix(w, p + n.projs[0] + ".", t.expert_dim, t.dim, t.mxfp4, rng);
      add_matrix(w, p + n.projs[1] + ".", t.expert_dim, t.dim, t.mxfp4, rng);
      add_matrix(w, p + n.projs[2] + ".", t.dim, t.expert_dim, t.mxfp4, rng);
    }
  }
  w["final_norm.weight"] = f32_tensor({t.dim}, rng, 1.0f, 0.1f);
  return w;
}

Tensors write_toy(const fs::path& dir, const Toy& t) {
  json config = {{"architectures", {"ToyMoeForCausalLM"}},
                 {"model_type", "toy_moe"},
                 {"vocab", t.vocab},
                 {"dim", t.dim},
                 {"blocks", t.blocks},
                 {"experts", t.experts},
                 {"top_k", t.top_k},
                 {"expert_dim", t.expert_dim},
                 {"context", 64},
                 {"eps", 1e-5}};
  config.update(t.patch);
  Tensors w = toy_tensors(t);
  std::vector<TensorToWrite> shard;
  for (const auto& [name, x] : w)
    if (!t.omit.count(name)) shard.push_back({name, x.dtype, x.shape, x.bytes});
  write_checkpoint(dir, config, {shard});
  return w;
}

// The toy in double precision, one token at a time (no attention).
struct Reference {
  const Toy& t;
  const Tensors& w;

  // Element (r, c) of matrix `p` + "weight" [rows, cols], decoded.
  double at(const std::string& p, int64_t r, int64_t c, int64_t cols) const {
    const Tensor& q = w.at(p + "weight");
    if (q.dtype == DType::F32) {
      float f;
      std::memcpy(&f, q.bytes.data() + 4 * (r * cols + c), 4);
      return f;
    }
    const uint8_t b = uint8_t(q.bytes[size_t(r * cols / 2 + c / 2)]);
    const uint8_t s = uint8_t(w.at(p + "scale").bytes[size_t(r * cols / 32 + c / 32)]);
    return double(e2m1_to_f32(c % 2 ? b >> 4 : b & 15)) * e8m0_to_f32(s);
  }
  std::vector<double> matvec(const std::string& p, int64_t rows,
                             const std::vector<double>& x) const {
    std::vector<double> y(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < int64_t(x.size()); ++c)
        y[size_t(r)] += at(p, r, c, int64_t(x.size())) * x[size_t(c)];
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const std::string& weight) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + 1e-5);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * at(weight, 0, int64_t(i), 0);
    return y;
  }
  // The k experts of one token at one block, by descending probability
  // (ties to the lower id), with their renormalized weights.
  std::vector<std::pair<int32_t, double>> route(int64_t l, const std::vector<double>& xn) const {
    std::vector<double> p = matvec(toy_names().layer_prefix(l) + "moe.router.", t.experts, xn);
    const double mx = *std::max_element(p.begin(), p.end());
    for (double& v : p) v = std::exp(v - mx);
    std::vector<int32_t> ids(size_t(t.experts));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double sum = 0;
    for (int64_t j = 0; j < t.top_k; ++j) sum += p[size_t(ids[size_t(j)])];
    std::vector<std::pair<int32_t, double>> out;
    for (int64_t j = 0; j < t.top_k; ++j) out.push_back({ids[size_t(j)], p[ids[size_t(j)]] / sum});
    return out;
  }
  // Logits [vocab] of `token`; routing[l] gets the experts it chose at block l.
  std::vector<double> logits(int32_t token,
                             std::vector<std::vector<int32_t>>* routing = nullptr) const {
    std::vector<double> x(size_t(t.dim));
    for (int64_t i = 0; i < t.dim; ++i) x[size_t(i)] = at("embed.", token, i, t.dim);
    for (int64_t l = 0; l < t.blocks; ++l) {
      const std::string p = toy_names().layer_prefix(l);
      const std::vector<double> xn = rmsnorm(x, p + "norm.");
      if (routing) routing->emplace_back();
      for (auto [e, we] : route(l, xn)) {
        if (routing) routing->back().push_back(e);
        const std::string q = p + "moe.experts." + std::to_string(e) + ".";
        std::vector<double> g = matvec(q + "w1.", t.expert_dim, xn);
        const std::vector<double> u = matvec(q + "w3.", t.expert_dim, xn);
        for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        const std::vector<double> d = matvec(q + "w2.", t.dim, g);
        for (size_t i = 0; i < x.size(); ++i) x[i] += we * d[i];
      }
    }
    return matvec("embed.", t.vocab, rmsnorm(x, "final_norm."));
  }
  std::vector<float> logits_f32(std::span<const int32_t> tokens) const {
    std::vector<float> out;
    for (int32_t tok : tokens)
      for (double v : logits(tok)) out.push_back(float(v));
    return out;
  }
};

int32_t argmax_of(const std::vector<double>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

std::unique_ptr<Engine> open_engine(const fs::path& dir, int64_t arena_experts) {
  EngineOptions o;
  o.experts.quiet = true;
  o.experts.mapped = arena_experts <= 0;
  o.experts.arena_experts = arena_experts > 0 ? arena_experts : -1;
  return Engine::open(dir, o);
}

class ToyMoe : public ::testing::TestWithParam<bool> {  // param: MXFP4 experts
 protected:
  static void SetUpTestSuite() { register_toy(); }
  void SetUp() override {
    toy.mxfp4 = GetParam();
    w = write_toy(tmp / "toy", toy);
  }
  fs::path dir() const { return tmp / "toy"; }
  Reference ref() const { return {toy, w}; }

  TempDir tmp;
  Toy toy;
  Tensors w;
  const std::vector<int32_t> prompt = {3, 17, 0, 28, 5, 11, 3};
};

}  // namespace

TEST_P(ToyMoe, IsRegisteredOnceByName) {
  EXPECT_NE(supported_architectures().find("toy_moe"), std::string::npos);
  EXPECT_THROW(register_architecture(ToyArchitecture()), Error);
  EXPECT_THROW(register_forward("toy_moe", &ToyModel::load), Error);
}

TEST_P(ToyMoe, CheckAcceptsItAndReportsPlantedProblems) {
  EXPECT_EQ(check_checkpoint(dir()), std::vector<std::string>{});
  Toy bad = toy;
  bad.omit = {"blocks.2.norm.weight", "blocks.1.moe.experts.4.w3.weight"};
  bad.patch = {{"top_k", 0}};
  write_toy(tmp / "bad", bad);
  const auto problems = check_checkpoint(tmp / "bad");
  ASSERT_EQ(problems.size(), 3u) << ::testing::PrintToString(problems);
  const std::string shard = (tmp / "bad" / "model.safetensors").string();
  EXPECT_EQ(problems[0], (tmp / "bad" / "config.json").string() +
                             ": field 'top_k': expected a positive integer");
  EXPECT_EQ(problems[1], shard + ": tensor 'blocks.2.norm.weight': missing (expected shape [64])");
  EXPECT_EQ(problems[2], shard +
                             ": tensor 'blocks.1.moe.experts.4.w3.weight': missing "
                             "(expected shape [32, " +
                             (toy.mxfp4 ? "32" : "64") + "])");
}

TEST_P(ToyMoe, InfoCountsCoreAndExperts) {
  const ModelInfo m = model_info(dir());
  const int64_t H = toy.dim, E = toy.experts, L = toy.blocks;
  EXPECT_EQ(m.architecture, "toy_moe");
  EXPECT_EQ(m.moe_layers, L);
  EXPECT_EQ(m.total_experts, L * E);
  EXPECT_EQ(m.core_params, toy.vocab * H + L * (H + E * H) + H);
  EXPECT_EQ(m.core_bytes, uint64_t(m.core_params) * 4);
  EXPECT_EQ(m.params_per_expert, 3 * toy.expert_dim * H);
  ASSERT_EQ(m.expert_encodings.size(), 1u);
  EXPECT_EQ(m.expert_encodings.begin()->first, toy.mxfp4 ? "mxfp4" : "f32");
  EXPECT_EQ(m.expert_encodings.begin()->second.experts, L * E);
}

TEST_P(ToyMoe, ForwardMatchesTheDoubleReference) {
  auto engine = open_engine(dir(), 0);
  auto s = engine->new_session(16);
  ForwardOptions all;
  all.all_logits = true;
  const std::vector<float> got = s->prefill(prompt, all);
  EXPECT_LE(rel_err(got, ref().logits_f32(prompt)), 1e-5);
  const int32_t next[1] = {21};
  EXPECT_LE(rel_err(s->decode(next[0]), ref().logits_f32(next)), 1e-5);
  EXPECT_EQ(s->position(), int64_t(prompt.size()) + 1);
}

TEST_P(ToyMoe, GenerateAndEvalRunIt) {
  auto engine = open_engine(dir(), 0);
  auto s = engine->new_session(32);
  GenerateOptions go;
  go.max_new_tokens = 6;  // greedy
  const GenerateStats st = generate(*s, prompt, go);
  std::vector<int32_t> want;
  for (int32_t tok = prompt.back(); want.size() < 6;)
    want.push_back(tok = argmax_of(ref().logits(tok)));
  EXPECT_EQ(st.tokens, want);

  const std::vector<int32_t> ids = {1, 4, 9, 16, 25, 7, 20, 2, 13, 28, 0, 8, 19, 3, 22, 6, 5};
  EvalOptions eo;
  eo.window = 5;
  const auto windows = score_windows(engine->model(), engine->experts(), ids, eo);
  ASSERT_EQ(windows.size(), 3u);  // 17 ids: three whole windows of 5
  double nll = 0;
  for (size_t t = 0; t + 1 < 15; ++t) {
    if (t % 5 == 4) continue;  // the last token of a window predicts nothing
    const std::vector<double> l = ref().logits(ids[t]);
    double mx = *std::max_element(l.begin(), l.end()), z = 0;
    for (double v : l) z += std::exp(v - mx);
    nll += mx + std::log(z) - l[size_t(ids[t + 1])];
  }
  const ScoreSummary sum = summarize(windows);
  EXPECT_EQ(sum.predicted, 12);
  EXPECT_NEAR(sum.nll_sum, nll, 1e-4 * std::fabs(nll));
}

TEST_P(ToyMoe, TraceRecordsEveryMoeLayer) {
  auto engine = open_engine(dir(), 0);
  TraceHeader h;
  h.model = trace_model_of(engine->model());
  h.corpus = {"toy"};
  EXPECT_EQ(h.model.model_type, "toy_moe");
  EXPECT_EQ(h.model.encoding, toy.mxfp4 ? "mxfp4" : "f32");
  TraceWriter tw(tmp / "toy.trace", h);
  TraceRecorder rec(tw, engine->spec());
  rec.run_window(engine->model(), engine->experts(), prompt, 2, 0, 0);
  tw.commit();
  const Trace tr = read_trace(tmp / "toy.trace");
  ASSERT_EQ(tr.size(), prompt.size() + 2);
  ASSERT_EQ(tr.moe_count(), size_t(toy.blocks));
  for (size_t t = 0; t < tr.size(); ++t) {
    std::vector<std::vector<int32_t>> routing;
    ref().logits(int32_t(tr.token[t]), &routing);
    for (size_t m = 0; m < tr.moe_count(); ++m) {
      const auto got = tr.ids(t, m);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), routing[m]) << t << " " << m;
    }
  }
}

TEST_P(ToyMoe, ArenaIsBitIdenticalToMapped) {
  auto mapped = open_engine(dir(), 0);
  auto arena = open_engine(dir(), 4);  // 4 hot slots for 18 experts: misses and evictions
  std::vector<std::vector<float>> out[2];
  for (int i = 0; i < 2; ++i) {
    auto s = (i ? arena : mapped)->new_session(16);
    ForwardOptions all;
    all.all_logits = true;
    out[i].push_back(s->prefill(prompt, all));
    for (int32_t tok : {4, 27, 4, 9}) out[i].push_back(s->decode(tok));
  }
  ASSERT_EQ(out[0].size(), out[1].size());
  for (size_t i = 0; i < out[0].size(); ++i) {
    ASSERT_EQ(out[0][i].size(), out[1][i].size());
    EXPECT_EQ(std::memcmp(out[0][i].data(), out[1][i].data(), out[0][i].size() * 4), 0) << i;
  }
  const LayerCounters c = arena->stats().total();
  EXPECT_GT(c.misses, 0u);
  EXPECT_GT(c.hot_evictions, 0u);
  EXPECT_EQ(c.uses, c.hits() + c.misses);
}

INSTANTIATE_TEST_SUITE_P(Experts, ToyMoe, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "Mxfp4" : "F32"; });
