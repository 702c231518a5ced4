// The coherence gate of `moetier bench --coherence [FILE]`: fixed prompts with
// checkable answers, each generated greedily for a few tokens; a check passes
// when its expected text appears in the continuation. The built-in set suits
// code models (moetier-tiny: Go); FILE gives other prompts as a JSON array of
// {"prompt": TEXT, "expect": TEXT[, "max_tokens": N]}. Speed is not measured
// here; the gate says whether the arm being timed still answers sensibly.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetier {

struct CoherenceCheck {
  std::string prompt, expect;
  int64_t max_tokens = 12;
};

std::vector<CoherenceCheck> default_coherence_checks();
// Throws Error naming the file and entry for a file that is not such an array.
std::vector<CoherenceCheck> load_coherence_checks(const std::string& path);

// generate(prompt, max_tokens) -> the continuation's text. Returns
// {"prompts": n, "failures": f, "failed": [{"prompt", "expect", "got"}...]}.
nlohmann::json run_coherence(
    const std::vector<CoherenceCheck>& checks,
    const std::function<std::string(const std::string&, int64_t)>& generate);

}  // namespace moetier
