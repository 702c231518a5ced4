// The architectures moetier supports, and how config.json names one.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "format/json_util.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "model/qwen3_moe/architecture.h"

namespace moetier {

namespace {

// The registry: built in, then registered (see architecture.h's thread-safety rule).
std::vector<const Architecture*>& registry() {
  static std::vector<const Architecture*> all = {
      &qwen3_moe::architecture(),  // one line per architecture
  };
  return all;
}

}  // namespace

std::span<const Architecture* const> architectures() { return registry(); }

void register_architecture(const Architecture& arch) {
  for (const Architecture* a : registry()) {
    check(a->name() != arch.name(), "architecture '{}' is already registered", arch.name());
    for (std::string_view c : arch.class_names()) {
      const auto names = a->class_names();
      check(std::find(names.begin(), names.end(), c) == names.end(),
            "architecture '{}': class name '{}' is already registered by '{}'", arch.name(), c,
            a->name());
    }
  }
  registry().push_back(&arch);
}

std::string supported_architectures() {
  std::string s;
  for (const Architecture* a : architectures())
    s += (s.empty() ? "" : ", ") + std::string(a->name());
  return s;
}

namespace {

const Architecture* by_name(std::string_view n) {
  for (const Architecture* a : architectures())
    if (a->name() == n) return a;
  return nullptr;
}

bool has_class(const Architecture& a, std::string_view c) {
  const auto names = a.class_names();
  return std::find(names.begin(), names.end(), c) != names.end();
}

// The architecture one of whose class names shares c's family (the part
// before "For": "Qwen3MoeForSequenceClassification" -> "Qwen3Moe").
const Architecture* by_family(std::string_view c) {
  const std::string_view fam = c.substr(0, c.find("For"));
  for (const Architecture* a : architectures())
    for (std::string_view n : a->class_names())
      if (!fam.empty() && n.substr(0, n.find("For")) == fam) return a;
  return nullptr;
}

std::string class_list(const Architecture& a) {
  std::string s;
  for (std::string_view n : a.class_names()) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

std::string value_text(const nlohmann::json& v) {
  return printable(v.is_string() ? v.get<std::string>() : v.dump());
}

}  // namespace

const Architecture* find_architecture(const nlohmann::json& j, const std::string& file,
                                      std::vector<std::string>& problems) {
  auto unsupported = [&](const std::string& v) {
    problems.push_back(fmt::format("{}: architecture '{}' is not supported (supported: {})", file,
                                   v, supported_architectures()));
    return nullptr;
  };
  if (!j.is_object()) return nullptr;  // the config parser reports it
  const Architecture* arch = nullptr;
  auto mt = j.find("model_type");
  const bool has_mt = mt != j.end() && !mt->is_null();
  if (has_mt) {
    arch = mt->is_string() ? by_name(mt->get<std::string>()) : nullptr;
    if (!arch) return unsupported(value_text(*mt));
  }
  auto ar = j.find("architectures");
  if (ar == j.end() || ar->is_null()) {
    if (!has_mt)
      problems.push_back(fmt::format("{}: field 'model_type': missing (supported: {})", file,
                                     supported_architectures()));
    return arch;
  }
  if (!ar->is_array() || ar->empty()) {
    problems.push_back(fmt::format("{}: field 'architectures': is {}, expected a list of names",
                                   file, json_kind(*ar)));
    return nullptr;
  }
  for (const auto& a : *ar) {
    const std::string v = a.is_string() ? a.get<std::string>() : a.dump();
    const Architecture* named = arch ? arch : by_family(v);
    if (named && has_class(*named, v)) {
      arch = named;
      continue;
    }
    if (!named) return unsupported(printable(v));
    problems.push_back(
        fmt::format("{}: field 'architectures': '{}' is not supported (supported: {})", file,
                    printable(v), class_list(*named)));
    return nullptr;
  }
  return arch;
}

const Architecture& architecture_of(const nlohmann::json& config,
                                    const std::filesystem::path& file) {
  std::vector<std::string> problems;
  const Architecture* a = find_architecture(config, file.string(), problems);
  if (!problems.empty()) throw Error(problems.front());
  check(a != nullptr, "{}: is {}, expected a JSON object", file.string(), json_kind(config));
  return *a;
}

ModelSpec model_spec(const Checkpoint& ck) {
  const auto file = ck.dir() / "config.json";
  const Architecture& a = architecture_of(ck.config(), file);
  std::vector<std::string> problems;
  ModelSpec s = a.parse(ck.config(), file, problems);
  if (!problems.empty()) throw Error(problems.front());
  return s;
}

}  // namespace moetier
