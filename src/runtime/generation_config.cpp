#include "runtime/generation_config.h"

#include <fmt/format.h>

#include <string>

#include "core/error.h"
#include "format/json_util.h"

namespace moetier {

namespace {

using json = nlohmann::json;

struct Reader {
  const json& j;
  std::string file;

  const json* get(const char* name) const {
    auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* name, const std::string& why) const {
    fail("{}: field '{}': {}", file, name, why);
  }
  // A number in [lo, hi]; (lo, hi] when open_lo.
  std::optional<float> number(const char* name, double lo, double hi, bool open_lo = false) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(name, fmt::format("is {}, expected a number", json_kind(*v)));
    const double x = v->get<double>();
    if (!(open_lo ? x > lo : x >= lo) || !(x <= hi))
      bad(name, fmt::format("{} is outside {}{}, {}]", x, open_lo ? "(" : "[", lo, hi));
    return float(x);
  }
  std::optional<int64_t> count(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      bad(name, fmt::format("{} is not a non-negative integer", printable(v->dump())));
    return v->get<int64_t>();
  }
  std::optional<bool> boolean(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(name, fmt::format("is {}, expected true or false", json_kind(*v)));
    return v->get<bool>();
  }
  std::vector<int32_t> token_ids(const char* name) const {
    const json* v = get(name);
    if (!v) return {};
    std::vector<int32_t> ids;
    auto add = [&](const json& x) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        bad(name, fmt::format("{} is not a token id", printable(x.dump())));
      ids.push_back(x.get<int32_t>());
    };
    if (v->is_array()) {
      for (const json& x : *v) add(x);
    } else {
      add(*v);
    }
    return ids;
  }
};

}  // namespace

GenerationConfig read_generation_config(const std::filesystem::path& dir) {
  GenerationConfig g;
  const std::filesystem::path file = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return g;
  std::string why;
  const auto j = read_json_file(file, why);
  check(j.has_value(), "{}", why);
  check(j->is_object(), "{}: is {}, expected a JSON object", file.string(), json_kind(*j));
  const Reader r{*j, file.string()};
  g.file = file;
  g.do_sample = r.boolean("do_sample");
  g.temperature = r.number("temperature", 0.0, 1e6);
  g.top_k = r.count("top_k");
  g.top_p = r.number("top_p", 0.0, 1.0, /*open_lo=*/true);
  g.min_p = r.number("min_p", 0.0, 1.0);
  g.eos = r.token_ids("eos_token_id");
  return g;
}

SamplerConfig llama_cpp_sampling() {
  SamplerConfig s;
  s.temperature = 0.8f;
  s.top_k = 40;
  s.top_p = 0.95f;
  s.min_p = 0.05f;
  return s;
}

SamplerConfig checkpoint_sampling(const GenerationConfig& g) {
  SamplerConfig s = llama_cpp_sampling();
  if (g.temperature) s.temperature = *g.temperature;
  if (g.top_k) s.top_k = *g.top_k;
  if (g.top_p) s.top_p = *g.top_p;
  if (g.min_p) s.min_p = *g.min_p;
  if (g.do_sample == false) s.temperature = 0.0f;
  return s;
}

}  // namespace moetier
