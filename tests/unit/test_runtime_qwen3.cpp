// Invariants of the qwen3_moe forward pass that can fail, on the committed
// fixture checkpoints (tests/data/fixtures): chunked prefill equals one-token
// steps, the expert batch size changes nothing, prefill routing equals
// per-token routing, MappedExperts views are the raw tensors, and bad input
// is refused with an Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "kernels/ref/ref.h"
#include "numeric.h"
#include "runtime/generate.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "runtime/qwen3_moe/model.h"
#include "runtime/session.h"

using namespace moetier::testing;

using namespace moetier;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

const char* kFixtures[] = {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"};

// Deterministic pseudo-random token ids in [0, vocab).
std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed * 2654435761u + 1;
  for (auto& x : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = int32_t((s >> 33) % uint64_t(vocab));
  }
  return t;
}

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<qwen3_moe::Qwen3MoeModel> owned;
  const qwen3_moe::Qwen3MoeModel& model;
  explicit Loaded(const std::string& name)
      : ck(Checkpoint::open(fixture(name))),
        owned(qwen3_moe::Qwen3MoeModel::load(*ck, default_cpu_backend())),
        model(*owned) {}
};

// A state the qwen3_moe forward must refuse.
struct OtherState final : SequenceState {
  int64_t size() const override { return 0; }
  void set_size(int64_t) override {}
  int64_t capacity() const override { return 4; }
  uint64_t bytes() const override { return 0; }
};

}  // namespace

class Runtime : public ::testing::TestWithParam<const char*> {};

// Prefill of T tokens in one chunk == T one-token decode steps (and == two
// chunks), for the logits at every position, bit for bit: the kernels are
// batch-invariant (kernels/cpu/tile.h), on every kernel path and thread count.
TEST_P(Runtime, ChunkedPrefillEqualsStepByStep) {
  Loaded m(GetParam());
  MappedExperts experts(*m.ck, m.model.spec());
  const int64_t vocab = m.model.config().vocab_size, n = 19;
  auto toks = some_tokens(n, vocab, 1);
  auto kv = m.model.new_state(n);
  ForwardOptions all;
  all.all_logits = true;
  auto chunk = m.model.forward(toks, 0, *kv, experts, all);  // [n, vocab]
  ASSERT_EQ(chunk.size(), size_t(n * vocab));
  EXPECT_EQ(kv->size(), n);

  auto kv2 = m.model.new_state(n);
  std::vector<float> steps;
  for (int64_t t = 0; t < n; ++t) {
    auto l = m.model.forward(std::span(toks).subspan(size_t(t), 1), t, *kv2, experts);
    steps.insert(steps.end(), l.begin(), l.end());
  }
  EXPECT_EQ(steps, chunk);

  auto kv3 = m.model.new_state(n);
  auto a = m.model.forward(std::span(toks).subspan(0, 7), 0, *kv3, experts, all);
  auto b = m.model.forward(std::span(toks).subspan(7), 7, *kv3, experts, all);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, chunk);
  // Last-position logits are the last row of all_logits.
  auto kv4 = m.model.new_state(n);
  auto last = m.model.forward(toks, 0, *kv4, experts);
  EXPECT_EQ(last, std::vector<float>(chunk.end() - vocab, chunk.end()));
}

// Acquiring experts one, three or all at a time gives bit-identical logits,
// and acquire() is never asked for more than max_batch() experts.
TEST_P(Runtime, ExpertBatchSizeChangesNothing) {
  Loaded m(GetParam());
  const auto& c = m.model.config();
  auto toks = some_tokens(23, c.vocab_size, 2);
  ForwardOptions all;
  all.all_logits = true;
  std::vector<float> base;
  for (int64_t batch : {0, 1, 3}) {
    MappedExperts experts(*m.ck, m.model.spec(), batch);
    auto kv = m.model.new_state(23);
    auto l = m.model.forward(toks, 0, *kv, experts, all);
    if (base.empty()) {
      base = l;
      continue;
    }
    EXPECT_EQ(l, base) << "max_batch " << batch;
    EXPECT_GT(experts.acquire_calls(), 1) << "max_batch " << batch;
  }
}

// The routing of a prefill chunk equals the routing of the same tokens fed
// one at a time; the observer sees every MoE layer with valid top-k sets.
TEST_P(Runtime, PrefillRoutingEqualsPerTokenRouting) {
  Loaded m(GetParam());
  const auto& c = m.model.config();
  MappedExperts experts(*m.ck, m.model.spec());
  const int64_t n = 11, k = c.num_experts_per_tok;
  auto toks = some_tokens(n, c.vocab_size, 3);
  std::vector<std::vector<int32_t>> prefill(size_t(c.num_hidden_layers)),
      steps(size_t(c.num_hidden_layers));
  int events = 0;
  RoutingObserver obs = [&](const RoutingEvent& e) {
    ++events;
    const Routing& r = *e.routing;
    ASSERT_EQ(r.k, k);
    ASSERT_EQ(int64_t(e.tokens.size()), r.n_tokens);
    EXPECT_EQ(e.phase, r.n_tokens > 1 ? Phase::Prefill : Phase::Decode);
    EXPECT_TRUE(c.is_moe_layer(e.layer));
    for (int64_t t = 0; t < r.n_tokens; ++t) {
      const float* p = r.probs.data() + t * r.num_experts;
      const int32_t* ex = r.experts.data() + t * k;
      const float* w = r.weights.data() + t * k;
      double psum = 0;
      for (int64_t j = 0; j < k; ++j) psum += p[ex[j]];
      // The chosen experts are the k most probable (nothing outside beats them).
      float kth = p[ex[k - 1]];
      int64_t above = 0;
      for (int64_t e2 = 0; e2 < r.num_experts; ++e2) above += p[e2] > kth;
      EXPECT_EQ(above, k - 1);
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_NEAR(w[j], c.norm_topk_prob ? p[ex[j]] / psum : p[ex[j]], 1e-6);
        if (j > 0) {
          EXPECT_GE(w[j - 1], w[j]);
        }
      }
    }
    auto& dst = r.n_tokens > 1 ? prefill[size_t(e.layer)] : steps[size_t(e.layer)];
    dst.insert(dst.end(), r.experts.begin(), r.experts.end());
  };
  ForwardOptions fo;
  fo.observer = &obs;
  auto kv = m.model.new_state(n);
  m.model.forward(toks, 0, *kv, experts, fo);
  auto kv2 = m.model.new_state(n);
  for (int64_t t = 0; t < n; ++t)
    m.model.forward(std::span(toks).subspan(size_t(t), 1), t, *kv2, experts, fo);
  int moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l);
  EXPECT_EQ(events, moe_layers * (1 + n));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_EQ(prefill[size_t(l)], steps[size_t(l)]) << "layer " << l;
    if (c.is_moe_layer(l)) {
      EXPECT_EQ(prefill[size_t(l)].size(), size_t(n * k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Runtime, ::testing::ValuesIn(kFixtures));

// MappedExperts returns views of exactly the checkpoint's bytes, per layout.
TEST(MappedExperts, ViewsAreTheRawTensors) {
  {  // stacked: gate/up are rows [0, I) and [I, 2I) of gate_up_proj[e]
    Loaded m("qwen3moe-bf16");
    const auto& c = m.model.config();
    MappedExperts ex(*m.ck, m.model.spec());
    const int64_t h = c.hidden_size, in = c.moe_intermediate_size;
    const TensorInfo& gu = m.ck->get("model.layers.0.mlp.experts.gate_up_proj");
    const TensorInfo& dn = m.ck->get("model.layers.0.mlp.experts.down_proj");
    ASSERT_EQ(gu.shape, (std::vector<int64_t>{c.num_experts, 2 * in, h}));
    auto raw = [&](const TensorInfo& t, int64_t i) {
      uint16_t v;
      std::memcpy(&v, m.ck->bytes(t).data() + 2 * i, 2);
      return bf16_to_f32(v);
    };
    for (int32_t e : {0, 5, int32_t(c.num_experts - 1)}) {
      const ExpertView& v = ex.view(0, e);
      ASSERT_EQ(v.gate.enc, WeightEncoding::BF16);
      for (int64_t r : {int64_t(0), in - 1})
        for (int64_t col : {int64_t(0), int64_t(7), h - 1}) {
          EXPECT_EQ(ref::weight_at(v.gate, r, col), raw(gu, (e * 2 * in + r) * h + col));
          EXPECT_EQ(ref::weight_at(v.up, r, col), raw(gu, (e * 2 * in + in + r) * h + col));
        }
      EXPECT_EQ(ref::weight_at(v.down, h - 1, in - 1), raw(dn, (e * h + h - 1) * in + in - 1));
    }
    EXPECT_THROW(ex.view(1, 0), Error);  // layer 1 is a dense (mlp_only) layer
    EXPECT_THROW(ex.view(0, int32_t(c.num_experts)), Error);
  }
  {  // per-expert MXFP4: data and scales point at the tensors
    Loaded m("qwen3moe-mxfp4");
    MappedExperts ex(*m.ck, m.model.spec());
    const ExpertView& v = ex.view(1, 9);
    ASSERT_EQ(v.down.enc, WeightEncoding::MXFP4);
    auto w = m.ck->bytes(m.ck->get("model.layers.1.mlp.experts.9.down_proj.weight"));
    auto s = m.ck->bytes(m.ck->get("model.layers.1.mlp.experts.9.down_proj.scale"));
    EXPECT_EQ(v.down.data, static_cast<const void*>(w.data()));
    EXPECT_EQ(static_cast<const void*>(v.down.scales), static_cast<const void*>(s.data()));
    EXPECT_EQ(v.down.cols, m.model.config().moe_intermediate_size);
  }
  {  // per-expert bf16 across shards
    Loaded m("qwen3moe-sharded");
    MappedExperts ex(*m.ck, m.model.spec());
    for (int32_t e = 0; e < int32_t(m.model.config().num_experts); ++e) {
      auto g =
          m.ck->bytes(m.ck->get(fmt::format("model.layers.1.mlp.experts.{}.gate_proj.weight", e)));
      EXPECT_EQ(ex.view(1, e).gate.data, static_cast<const void*>(g.data()));
    }
    std::vector<ExpertView> views;
    const int32_t ids[] = {3, 1};
    ex.acquire(0, ids, Phase::Decode, views);
    ASSERT_EQ(views.size(), 2u);
    EXPECT_EQ(views[1].up.data, ex.view(0, 1).up.data);
    MappedExperts small(*m.ck, m.model.spec(), 1);
    EXPECT_THROW(small.acquire(0, ids, Phase::Prefill, views), Error);
  }
}

TEST(Runtime, BadInputIsRefused) {
  Loaded m("qwen3moe-sharded");
  const auto& c = m.model.config();
  MappedExperts ex(*m.ck, m.model.spec());
  auto kv = m.model.new_state(4);
  const int32_t bad[] = {1, int32_t(c.vocab_size)};
  EXPECT_THROW(m.model.forward(bad, 0, *kv, ex), Error);
  const int32_t neg[] = {-1};
  EXPECT_THROW(m.model.forward(neg, 0, *kv, ex), Error);
  const int32_t ok[] = {1, 2, 3};
  EXPECT_THROW(m.model.forward(ok, 1, *kv, ex), Error);  // position 1 before 0 is filled
  m.model.forward(ok, 0, *kv, ex);
  EXPECT_THROW(m.model.forward(ok, 3, *kv, ex), Error);  // past capacity 4
  EXPECT_THROW(m.model.forward(std::span<const int32_t>(), 0, *kv, ex), Error);
  OtherState wrong;
  EXPECT_THROW(m.model.forward(ok, 0, wrong, ex), Error);
  EXPECT_THROW(generate(m.model, ex, std::span<const int32_t>(), GenerateOptions{}), Error);
}

// Rewinding the cache (start_pos < size) recomputes from there: the same
// logits as a fresh run.
TEST(Runtime, RewindRecomputes) {
  Loaded m("qwen3moe-bf16");
  const auto& c = m.model.config();
  MappedExperts ex(*m.ck, m.model.spec());
  auto toks = some_tokens(9, c.vocab_size, 4);
  auto kv = m.model.new_state(9);
  auto first = m.model.forward(toks, 0, *kv, ex);
  auto other = some_tokens(4, c.vocab_size, 5);
  m.model.forward(other, 5, *kv, ex);
  auto again = m.model.forward(std::span(toks).subspan(5), 5, *kv, ex);
  EXPECT_LE(max_rel_diff(again, first), 1e-5);
}

// Generation stops at eos (not emitted) and after max_new_tokens; the
// callback sees exactly the returned tokens.
TEST(Runtime, GenerateStopsAtEosAndLength) {
  Loaded m("qwen3moe-sharded");
  MappedExperts ex(*m.ck, m.model.spec());
  auto prompt = some_tokens(6, m.model.config().vocab_size, 6);
  GenerateOptions go;
  go.max_new_tokens = 7;
  std::vector<int32_t> seen;
  auto st = generate(m.model, ex, prompt, go, [&](int32_t t) { seen.push_back(t); });
  ASSERT_EQ(st.tokens.size(), 7u);
  EXPECT_EQ(seen, st.tokens);
  EXPECT_EQ(st.prompt_tokens, 6);
  EXPECT_EQ(st.decode_steps, 6);
  EXPECT_FALSE(st.stopped_at_eos);
  go.eos = {st.tokens[3]};
  auto st2 = generate(m.model, ex, prompt, go);
  EXPECT_TRUE(st2.stopped_at_eos);
  auto stop = std::find(st.tokens.begin(), st.tokens.end(), st.tokens[3]);
  EXPECT_EQ(st2.tokens, std::vector<int32_t>(st.tokens.begin(), stop));
}

// decode_greedy_run (one step at a time here: no decode graphs on the CPU):
// the greedy tokens, a stop taken where the callback says, the position
// advanced by the steps taken, and a run resumed after a stop continuing
// as an uninterrupted one.
TEST(Runtime, GreedyRunStopsAndResumes) {
  Loaded m("qwen3moe-sharded");
  MappedExperts ex(*m.ck, m.model.spec());
  const auto prompt = some_tokens(5, m.model.config().vocab_size, 8);
  Session plain(m.model, ex, 20);
  std::vector<int32_t> want{argmax(plain.prefill(prompt))};
  for (int i = 0; i < 9; ++i) want.push_back(plain.decode_greedy(want.back()));
  Session s(m.model, ex, 20);
  std::vector<int32_t> got{argmax(s.prefill(prompt))};
  auto keep = [&](int32_t t) {
    got.push_back(t);
    return got.size() < 5;  // stop after the 4th step
  };
  EXPECT_EQ(s.decode_greedy_run(got.back(), 9, keep), 4);
  EXPECT_EQ(s.position(), 5 + 4);
  EXPECT_EQ(s.decode_greedy_run(got.back(), 5,
                                [&](int32_t t) {
                                  got.push_back(t);
                                  return true;
                                }),
            5);
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.position(), 5 + 9);
  EXPECT_EQ(s.decode_greedy_run(got.back(), 0, [](int32_t) { return true; }), 0);
  EXPECT_THROW(s.decode_greedy_run(got.back(), 7, [](int32_t) { return true; }), Error);
}
