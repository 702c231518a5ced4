// Numeric helpers shared by the tests: normalized errors (NaN never passes:
// every error is +inf on a non-finite value or a size mismatch) and seeded
// random inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace moetier::testing {

// ||out - ref|| / ||ref|| (L2).
inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) return INFINITY;
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : INFINITY;
}

// max |a - b| / max |b|.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : INFINITY;
}

// sqrt(sum (a - b)^2 / sum b^2), the same as rel_err.
inline double rms_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_err(a, b);
}

inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace moetier::testing
