#include "convert/calib.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <string>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "runtime/routing.h"
#include "runtime/session.h"

namespace moetier {
namespace fs = std::filesystem;

CalibStats::CalibStats(int64_t layers, int64_t experts, int64_t hidden, int64_t inter)
    : layers_(layers),
      experts_(experts),
      hidden_(hidden),
      inter_(inter),
      acc_(size_t(layers * experts)),
      layer_sq_(size_t(layers)),
      layer_n_(size_t(layers), 0) {}

int64_t CalibStats::routed(int64_t layer, int64_t expert) const {
  return acc_.at(size_t(layer * experts_ + expert)).n;
}

void CalibStats::add_layer(int64_t layer, const float* xn, int64_t n) {
  auto& sq = layer_sq_.at(size_t(layer));
  sq.resize(size_t(hidden_), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < hidden_; ++c)
      sq[size_t(c)] += double(xn[t * hidden_ + c]) * xn[t * hidden_ + c];
  layer_n_[size_t(layer)] += n;
}

void CalibStats::add_expert(int64_t layer, int64_t expert, const float* xs, const float* h,
                            int64_t m) {
  Acc& a = acc_.at(size_t(layer * experts_ + expert));
  a.in_sq.resize(size_t(hidden_), 0.0);
  a.mid_sq.resize(size_t(inter_), 0.0);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t c = 0; c < hidden_; ++c)
      a.in_sq[size_t(c)] += double(xs[t * hidden_ + c]) * xs[t * hidden_ + c];
    for (int64_t c = 0; c < inter_; ++c)
      a.mid_sq[size_t(c)] += double(h[t * inter_ + c]) * h[t * inter_ + c];
  }
  a.n += m;
}

std::vector<float> CalibStats::weights(int64_t layer, int64_t expert, bool down) const {
  const Acc& a = acc_.at(size_t(layer * experts_ + expert));
  const int64_t cols = down ? inter_ : hidden_;
  const std::vector<double>* sum = nullptr;
  int64_t n = 0;
  if (a.n > 0) {
    sum = down ? &a.mid_sq : &a.in_sq, n = a.n;
  } else if (!down && layer_n_.at(size_t(layer)) > 0) {
    sum = &layer_sq_[size_t(layer)], n = layer_n_[size_t(layer)];
  }
  std::vector<float> w(size_t(cols), 1.0f);
  if (!sum) return w;
  double mean = 0;
  for (double s : *sum) mean += s / double(n);
  mean /= double(cols);
  if (!(mean > 0)) return w;
  for (int64_t c = 0; c < cols; ++c)
    w[size_t(c)] = float((*sum)[size_t(c)] / double(n) + 0.01 * mean);
  return w;
}

namespace {

// Up to `max_bytes` of the file, cut after its last newline when cut at all.
std::string read_corpus(const fs::path& p, uint64_t max_bytes) {
  std::ifstream in(p, std::ios::binary);
  check(bool(in), "--calib: {}: cannot open", p.string());
  std::string s(max_bytes, '\0');
  in.read(s.data(), std::streamsize(max_bytes));
  s.resize(size_t(in.gcount()));
  if (s.size() == max_bytes) {
    const size_t nl = s.rfind('\n');
    if (nl != std::string::npos && nl > 0) s.resize(nl + 1);
  }
  return s;
}

// Observes every MoE layer of a forward pass and accumulates its statistics:
// the gate/up halves of all the layer's experts in one parallel run
// (cpu::matmul_glu), then each expert's inputs and hidden activations.
struct Collector {
  CalibStats& stats;
  MappedExperts& experts;
  int64_t hidden, inter;
  std::vector<float> xs, g, u;    // [pairs, H], [pairs, I], [pairs, I]
  std::vector<cpu::GluTask> glu;  // [experts of the layer]

  void operator()(const RoutingEvent& ev) {
    check(ev.hidden != nullptr, "calibration: the forward pass gave no hidden states");
    const Routing& r = *ev.routing;
    stats.add_layer(ev.layer, ev.hidden, r.n_tokens);
    const ExpertGroups grp = group_by_expert(r);
    const int64_t pairs = int64_t(grp.tokens.size());
    xs.resize(size_t(pairs * hidden));
    g.resize(size_t(pairs * inter));
    u.resize(size_t(pairs * inter));
    for (int64_t p = 0; p < pairs; ++p)
      std::copy_n(ev.hidden + grp.tokens[size_t(p)] * hidden, hidden, xs.data() + p * hidden);
    glu.clear();
    for (size_t i = 0; i < grp.ids.size(); ++i) {
      const int64_t b = grp.offsets[i], m = grp.offsets[i + 1] - b;
      const ExpertView& v = experts.view(ev.layer, grp.ids[i]);
      glu.push_back(
          {v.gate, v.up, xs.data() + b * hidden, m, g.data() + b * inter, u.data() + b * inter});
    }
    cpu::matmul_glu(glu);
    for (size_t i = 0; i < grp.ids.size(); ++i) {
      const int64_t b = grp.offsets[i], m = grp.offsets[i + 1] - b;
      stats.add_expert(ev.layer, grp.ids[i], xs.data() + b * hidden, g.data() + b * inter, m);
    }
  }
};

}  // namespace

CalibStats collect_calibration(const Checkpoint& ck, const fs::path& corpus,
                               const CalibOptions& opt, ConvertControl control) {
  check(opt.max_tokens > 0, "--calib-tokens: {} must be positive", opt.max_tokens);
  check(opt.window > 0, "--calib-window: {} must be positive", opt.window);
  std::error_code ec;
  check(fs::is_regular_file(corpus, ec), "--calib: {}: no such file", corpus.string());
  check(fs::exists(ck.dir() / "tokenizer.json", ec),
        "--calib: {}: no tokenizer.json to tokenize the corpus with", ck.dir().string());
  const Tokenizer tok = Tokenizer::load(ck.dir());
  const std::unique_ptr<Model> model = load_model(ck);
  const ModelSpec& cfg = model->spec();
  check_tokenizer_fits(tok, cfg.vocab_size, ck.dir());
  std::vector<int32_t> ids =
      tok.encode(read_corpus(corpus, uint64_t(opt.max_tokens) * 16 + 4096), false);
  check(!ids.empty(), "--calib: {}: the corpus encodes to no tokens", corpus.string());
  if (int64_t(ids.size()) > opt.max_tokens) ids.resize(size_t(opt.max_tokens));
  int64_t window = opt.window;
  if (cfg.max_positions > 0) window = std::min(window, cfg.max_positions);

  CalibStats stats(cfg.num_layers, cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate);
  MappedExperts experts(ck, cfg);
  Collector col{stats, experts, cfg.hidden_size, cfg.expert_intermediate, {}, {}, {}, {}};
  const RoutingObserver obs = [&col](const RoutingEvent& ev) { col(ev); };
  ForwardOptions fo;
  fo.observer = &obs;
  for (size_t at = 0; at < ids.size(); at += size_t(window)) {
    check(!(control.cancel && control.cancel->load()), "--calib: interrupted");
    const size_t n = std::min(ids.size() - at, size_t(window));
    Session session(*model, experts, int64_t(n));
    session.prefill(std::span<const int32_t>(ids.data() + at, n), fo);
    stats.add_tokens(int64_t(n));
  }
  return stats;
}

}  // namespace moetier
