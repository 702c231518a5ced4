#include "core/units.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "core/error.h"

namespace moetier {

namespace {

__extension__ typedef unsigned __int128 u128;

struct Unit {
  std::string_view name;
  uint64_t factor;
};

constexpr uint64_t kKi = 1024;
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", kKi},
    {"kib", kKi},
    {"kb", 1000},
    {"m", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", 1000 * 1000},
    {"g", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", 1000ull * 1000 * 1000},
    {"t", kKi* kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", 1000ull * 1000 * 1000 * 1000},
    {"p", kKi* kKi* kKi* kKi* kKi},
    {"pib", kKi* kKi* kKi* kKi* kKi},
    {"pb", 1000ull * 1000 * 1000 * 1000 * 1000},
};

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

[[noreturn]] void bad(std::string_view text, std::string_view what, std::string_view why) {
  std::string shown;
  for (char c : text) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  fail("{}: invalid size '{}' ({}; e.g. 512MB, 8GiB, 81GB)", what, shown, why);
}

}  // namespace

uint64_t parse_bytes(std::string_view text, std::string_view what) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  uint64_t whole = 0;
  size_t digits = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
    if (__builtin_mul_overflow(whole, 10u, &whole) ||
        __builtin_add_overflow(whole, uint64_t(text[i] - '0'), &whole))
      bad(text, what, "too large");
  }
  // Fraction: kept as numerator/denominator so "0.1GB" is exact.
  uint64_t frac_num = 0, frac_den = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
      if (frac_den >= 1000000000000000000ull) continue;  // beyond 18 digits: ignored
      frac_num = frac_num * 10 + uint64_t(text[i] - '0');
      frac_den *= 10;
    }
  }
  if (digits == 0) bad(text, what, "no number");
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t unit_end = text.size();
  while (unit_end > i && std::isspace(static_cast<unsigned char>(text[unit_end - 1]))) --unit_end;
  std::string unit = lower(text.substr(i, unit_end - i));
  for (const auto& u : kUnits) {
    if (u.name != unit) continue;
    uint64_t r;
    if (__builtin_mul_overflow(whole, u.factor, &r)) bad(text, what, "too large");
    // frac_num / frac_den * factor, exact: factor <= 2^50 and frac_num < 10^18 fit in 128 bits.
    u128 f = u128(frac_num) * u128(u.factor) / u128(frac_den);
    if (__builtin_add_overflow(r, uint64_t(f), &r)) bad(text, what, "too large");
    return r;
  }
  bad(text, what, fmt::format("unknown unit '{}'", unit));
}

std::optional<double> parse_percent(std::string_view text, std::string_view what) {
  if (text.empty() || text.back() != '%') return std::nullopt;
  const std::string num(text.substr(0, text.size() - 1));
  double pct = 0;
  size_t used = 0;
  try {
    pct = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool digits_only = std::all_of(num.begin(), num.end(),
                                       [](unsigned char c) { return std::isdigit(c) || c == '.'; });
  check(digits_only && used == num.size() && pct > 0 && pct <= 100,
        "{}: invalid percentage '{}' (expected 0 < N <= 100)", what, text);
  return pct;
}

uint64_t percent_of(double pct, uint64_t total) {
  return std::max<uint64_t>(1, uint64_t(std::ceil(pct / 100.0 * double(total) - 1e-9)));
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  // 1023.999 MiB would print as "1024.00 MiB": move to the next unit instead.
  if (v >= 1023.995 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kNames[u]);
}

}  // namespace moetier
