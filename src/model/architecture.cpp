#include "model/architecture.h"

#include <fmt/format.h>

#include "core/error.h"
#include "format/json_util.h"

namespace moetier {

namespace {

void unsupported(const std::string& file, const std::string& name,
                 std::vector<std::string>& problems) {
  problems.push_back(fmt::format("{}: architecture '{}' is not supported (supported: qwen3_moe)",
                                 file, printable(name)));
}

std::string text_of(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

bool check_architecture(const nlohmann::json& j, const std::string& file,
                        std::vector<std::string>& problems) {
  if (!j.is_object()) {
    problems.push_back(fmt::format("{}: is {}, expected a JSON object", file, json_kind(j)));
    return false;
  }
  auto mt = j.find("model_type");
  const bool has_mt = mt != j.end() && !mt->is_null();
  if (has_mt && text_of(*mt) != "qwen3_moe") {
    unsupported(file, text_of(*mt), problems);
    return false;
  }
  auto ar = j.find("architectures");
  if (ar == j.end() || ar->is_null()) {
    if (!has_mt)
      problems.push_back(
          fmt::format("{}: field 'model_type': missing (supported: qwen3_moe)", file));
    return has_mt;
  }
  if (!ar->is_array() || ar->empty()) {
    problems.push_back(fmt::format("{}: field 'architectures': is {}, expected a list of names",
                                   file, json_kind(*ar)));
    return false;
  }
  for (const auto& a : *ar) {
    const std::string v = text_of(a);
    if (v == "Qwen3MoeForCausalLM") continue;
    if (!has_mt && !v.starts_with("Qwen3Moe"))
      unsupported(file, v, problems);
    else
      problems.push_back(fmt::format(
          "{}: field 'architectures': '{}' is not supported (supported: Qwen3MoeForCausalLM)", file,
          printable(v)));
    return false;
  }
  return true;
}

void require_supported_architecture(const nlohmann::json& config,
                                    const std::filesystem::path& file) {
  std::vector<std::string> problems;
  if (!check_architecture(config, file.string(), problems)) throw Error(problems.front());
}

}  // namespace moetier
