// The architectures moetier runs, checked from config.json's model_type and
// architectures fields. Every command makes this check before anything else
// (parse_qwen3_moe_config starts with it), and `moetier check` reports the
// same line, so a checkpoint check refuses is refused everywhere.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetier {

// Appends one line to `problems` and returns false unless config.json (parsed
// as `config`, named `file`) names a supported architecture: model_type
// "qwen3_moe" and/or architectures ["Qwen3MoeForCausalLM"]. The lines:
//   FILE: architecture 'NAME' is not supported (supported: qwen3_moe)
//   FILE: field 'model_type': missing (supported: qwen3_moe)
//   FILE: field 'architectures': ...
bool check_architecture(const nlohmann::json& config, const std::string& file,
                        std::vector<std::string>& problems);

// Throws Error with check_architecture's line when the architecture is not
// supported.
void require_supported_architecture(const nlohmann::json& config,
                                    const std::filesystem::path& file);

}  // namespace moetier
