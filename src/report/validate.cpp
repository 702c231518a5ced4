// The moetier-bench/1 checks (docs/bench-format.md): required fields and the
// type of every known field; unknown fields are allowed (later versions of
// bench may add them), absent ones mean "not measured".
#include <initializer_list>

#include "core/error.h"
#include "report/report.h"

namespace moetier::report {
namespace {

using nlohmann::json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::discarded:
      return "nothing";
    default:
      return "a number";
  }
}

struct Checker {
  const std::string& file;

  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    fail("{}: {}: {}", file, path, what);
  }
  void is(const json& v, json::value_t t, const char* want, const std::string& path) const {
    const bool ok = t == json::value_t::number_float ? v.is_number() : v.type() == t;
    if (!ok) bad(path, fmt::format("expected {}, got {}", want, type_name(v)));
  }
  void object(const json& v, const std::string& path) const {
    is(v, json::value_t::object, "an object", path);
  }
  void array(const json& v, const std::string& path) const {
    is(v, json::value_t::array, "an array", path);
  }
  // KEY of OBJ must exist (when REQUIRED) and, when present, have type T.
  void field(const json& obj, const std::string& path, const char* key, json::value_t t,
             bool required = false) const {
    const std::string p = path.empty() ? key : path + "." + key;
    if (!obj.contains(key)) {
      if (required) bad(p, "missing");
      return;
    }
    static const std::pair<json::value_t, const char*> kNames[] = {
        {json::value_t::number_float, "a number"},
        {json::value_t::string, "a string"},
        {json::value_t::boolean, "a boolean"},
        {json::value_t::object, "an object"},
        {json::value_t::array, "an array"}};
    for (const auto& [type, name] : kNames)
      if (type == t) is(obj[key], t, name, p);
  }
  void numbers(const json& obj, const std::string& path,
               std::initializer_list<const char*> keys) const {
    for (const char* k : keys) field(obj, path, k, json::value_t::number_float);
  }
  void strings(const json& obj, const std::string& path,
               std::initializer_list<const char*> keys) const {
    for (const char* k : keys) field(obj, path, k, json::value_t::string);
  }
  // Every member of the object at OBJ[KEY] (when present) is a number.
  void number_map(const json& obj, const std::string& path, const char* key) const {
    field(obj, path, key, json::value_t::object);
    if (!obj.contains(key)) return;
    for (const auto& [k, v] : obj[key].items())
      is(v, json::value_t::number_float, "a number", path + "." + key + "." + k);
  }
  void number_array(const json& v, const std::string& path) const {
    array(v, path);
    for (size_t i = 0; i < v.size(); ++i)
      is(v[i], json::value_t::number_float, "a number", fmt::format("{}[{}]", path, i));
  }
};

constexpr auto kNum = json::value_t::number_float;
constexpr auto kStr = json::value_t::string;
constexpr auto kArr = json::value_t::array;
constexpr auto kObj = json::value_t::object;

void check_run(const Checker& c, const json& r, const std::string& p) {
  c.object(r, p);
  c.field(r, p, "cold", json::value_t::boolean);
  c.field(r, p, "page_cache_dropped", json::value_t::boolean);
  c.numbers(
      r, p,
      {"ttft_s", "prompt_tps", "decode_tps", "expert_uses", "expert_reads", "expert_read_bytes",
       "physical_read_bytes", "io_stall_s", "peak_host_bytes", "peak_device_bytes"});
  c.number_map(r, p, "hit_rate");
}

void check_workload(const Checker& c, const json& w, const std::string& p) {
  c.object(w, p);
  c.field(w, p, "name", kStr, true);
  c.numbers(w, p, {"prompt_tokens", "gen_tokens"});
  c.field(w, p, "runs", kArr);
  if (w.contains("runs"))
    for (size_t i = 0; i < w["runs"].size(); ++i)
      check_run(c, w["runs"][i], fmt::format("{}.runs[{}]", p, i));
  for (const char* k : {"median", "min", "max", "bound", "fraction_of_bound"})
    c.number_map(w, p, k);
  c.field(w, p, "coherence", kObj);
  if (w.contains("coherence")) c.numbers(w["coherence"], p + ".coherence", {"prompts", "failures"});
}

void check_arm(const Checker& c, const json& a, const std::string& p) {
  c.object(a, p);
  c.field(a, p, "name", kStr, true);
  c.field(a, p, "engine", kStr, true);
  c.strings(a, p, {"version", "flags"});
  c.field(a, p, "model", kObj);
  if (a.contains("model")) {
    c.strings(a["model"], p + ".model", {"dir", "architecture"});
    c.numbers(a["model"], p + ".model",
              {"layers", "experts_per_layer", "top_k", "expert_bytes", "active_bytes_per_token",
               "total_bytes"});
  }
  c.number_map(a, p, "memory");
  c.numbers(a, p, {"load_s"});
  c.field(a, p, "workloads", kArr, true);
  for (size_t i = 0; i < a["workloads"].size(); ++i)
    check_workload(c, a["workloads"][i], fmt::format("{}.workloads[{}]", p, i));
}

void check_sample(const Checker& c, const json& s, const std::string& p) {
  c.object(s, p);
  c.field(s, p, "t_s", kNum, true);
  c.field(s, p, "phase", kStr, true);
  c.numbers(s, p,
            {"gpu_temp_c", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_mem_used_bytes",
             "gpu_mem_free_bytes", "host_mem_available_bytes", "rss_bytes", "read_bytes"});
  c.field(s, p, "throttle", kArr);
  if (s.contains("throttle"))
    for (size_t i = 0; i < s["throttle"].size(); ++i)
      c.is(s["throttle"][i], kStr, "a string", fmt::format("{}.throttle[{}]", p, i));
}

void check_curve(const Checker& c, const json& s, const std::string& p) {
  c.object(s, p);
  c.field(s, p, "policy", kStr, true);
  c.field(s, p, "budget_experts", kArr, true);
  c.field(s, p, "hit_rate", kArr, true);
  const size_t n = s["budget_experts"].size();
  for (const char* k : {"budget_experts", "budget_bytes", "hit_rate", "all_k_share"}) {
    if (!s.contains(k)) continue;
    c.number_array(s[k], p + "." + k);
    if (s[k].size() != n)
      c.bad(p + "." + k, fmt::format("has {} values, budget_experts has {}", s[k].size(), n));
  }
}

}  // namespace

void validate_result(const json& doc, const std::string& file) {
  const Checker c{file};
  if (!doc.is_object())
    c.bad("(top level)", fmt::format("expected an object, got {}", type_name(doc)));
  c.field(doc, "", "schema", kStr, true);
  if (doc["schema"] != kSchema)
    c.bad("schema",
          fmt::format("expected \"{}\", got \"{}\"", kSchema, doc["schema"].get<std::string>()));
  c.strings(doc, "", {"command", "commit", "started"});
  c.field(doc, "", "machine", kObj);
  if (doc.contains("machine")) {
    c.strings(doc["machine"], "machine", {"cpu", "gpu", "driver", "cuda_runtime"});
    c.numbers(doc["machine"], "machine", {"cores", "ram_bytes", "gpu_memory_bytes"});
  }
  c.number_map(doc, "", "bounds");
  c.field(doc, "", "arms", kArr, true);
  for (size_t i = 0; i < doc["arms"].size(); ++i)
    check_arm(c, doc["arms"][i], fmt::format("arms[{}]", i));
  c.field(doc, "", "monitor", kArr);
  if (doc.contains("monitor"))
    for (size_t i = 0; i < doc["monitor"].size(); ++i)
      check_sample(c, doc["monitor"][i], fmt::format("monitor[{}]", i));
  c.field(doc, "", "simulate", kArr);
  if (doc.contains("simulate"))
    for (size_t i = 0; i < doc["simulate"].size(); ++i)
      check_curve(c, doc["simulate"][i], fmt::format("simulate[{}]", i));
}

}  // namespace moetier::report
