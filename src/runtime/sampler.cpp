#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace moetier {
namespace {

// Token ids of the `count` largest logits, by descending logit (ties: lower id).
std::vector<int32_t> top_ids(std::span<const float> logits, size_t count) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] ||
           (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  count = std::min(count, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(count), ids.end(), better);
  ids.resize(count);
  return ids;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  check(!logits.empty(), "sampler: empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {
  check(std::isfinite(cfg.temperature), "sampler: temperature must be finite");
  check(cfg.top_k >= 0, "sampler: top-k {} must be >= 0", cfg.top_k);
  check(cfg.top_p > 0.0f && cfg.top_p <= 1.0f, "sampler: top-p {} must be in (0, 1]", cfg.top_p);
  check(cfg.min_p >= 0.0f && cfg.min_p <= 1.0f, "sampler: min-p {} must be in [0, 1]", cfg.min_p);
}

bool Sampler::greedy() const { return cfg_.temperature <= 0.0f || cfg_.top_k == 1; }

std::vector<std::pair<int32_t, double>> Sampler::distribution(std::span<const float> logits) const {
  check(!logits.empty(), "sampler: empty logits");
  for (float l : logits) check(!std::isnan(l), "sampler: logits contain NaN");
  if (greedy()) return {{argmax(logits), 1.0}};
  const size_t v = logits.size();
  const size_t k = cfg_.top_k > 0 ? std::min(size_t(cfg_.top_k), v) : v;
  const bool nucleus = cfg_.top_p < 1.0f;
  const double t = cfg_.temperature;
  const double m = double(logits[size_t(argmax(logits))]) / t;
  double z_all = 0.0;  // normalizer over the whole vocabulary (used when k == v)
  if (k == v)
    for (float l : logits) z_all += std::exp(double(l) / t - m);
  // Candidates: the top k by logit; with top-p alone, try the 1024 most likely
  // first and widen to all only when the nucleus reaches past them.
  size_t count = (k == v && nucleus) ? std::min<size_t>(1024, v) : k;
  for (;;) {
    std::vector<int32_t> ids;
    if (count == v && !nucleus) {  // nothing truncated: no need to sort
      ids.resize(v);
      std::iota(ids.begin(), ids.end(), 0);
    } else {
      ids = top_ids(logits, count);
    }
    std::vector<std::pair<int32_t, double>> d;
    double z = 0.0;
    for (int32_t id : ids) {
      d.emplace_back(id, std::exp(double(logits[size_t(id)]) / t - m));
      z += d.back().second;
    }
    if (k == v) z = z_all;
    size_t keep = d.size();
    if (nucleus) {
      double cum = 0.0;
      keep = 0;
      while (keep < d.size() && (keep == 0 || cum < double(cfg_.top_p)))
        cum += d[keep++].second / z;
      if (cum < double(cfg_.top_p) && count < k) {
        count = k;
        continue;
      }
    }
    d.resize(keep);
    if (cfg_.min_p > 0.0f) {  // weights are exp(l/t - max/t): the most likely weighs 1
      double top = 0.0;
      for (const auto& p : d) top = std::max(top, p.second);
      const double floor = double(cfg_.min_p) * top;
      std::erase_if(d, [&](const auto& p) { return p.second < floor; });
    }
    double s = 0.0;
    for (const auto& p : d) s += p.second;
    for (auto& p : d) p.second /= s;
    return d;
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  auto d = distribution(logits);
  if (d.size() == 1) return d[0].first;
  const double u = double(rng_() >> 11) * 0x1.0p-53;  // [0, 1), platform independent
  double cum = 0.0;
  for (const auto& [id, p] : d) {
    cum += p;
    if (u < cum) return id;
  }
  return d.back().first;
}

}  // namespace moetier
