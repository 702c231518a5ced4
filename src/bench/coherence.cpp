#include "bench/coherence.h"

#include <fmt/format.h>

#include <fstream>

#include "core/error.h"

namespace moetier {

std::vector<CoherenceCheck> default_coherence_checks() {
  return {{"for i := 0; i < n; i", "++", 4},
          {"if err != nil {\n\t\treturn", "err", 6},
          {"fmt.Println(\"hello", "\"", 6},
          {"import (\n\t\"fmt\"\n\t\"os", "\"", 4},
          {"type Point struct {\n\tX, Y int\n}\n\nfunc (p Point) String() string {\n\treturn "
           "fmt.Sprintf(\"",
           "%", 8}};
}

std::vector<CoherenceCheck> load_coherence_checks(const std::string& path) {
  std::ifstream f(path);
  check(f.good(), "--coherence {}: cannot open the file", path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  check(!j.is_discarded() && j.is_array() && !j.empty(),
        "--coherence {}: not a non-empty JSON array of {{\"prompt\", \"expect\"}}", path);
  std::vector<CoherenceCheck> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    check(e.is_object() && e.contains("prompt") && e["prompt"].is_string() &&
              e.contains("expect") && e["expect"].is_string(),
          "--coherence {}: entry {}: needs string fields 'prompt' and 'expect'", path, i);
    CoherenceCheck c{e["prompt"], e["expect"], 12};
    if (e.contains("max_tokens")) {
      check(e["max_tokens"].is_number_integer() && e["max_tokens"].get<int64_t>() > 0,
            "--coherence {}: entry {}: 'max_tokens' must be a positive integer", path, i);
      c.max_tokens = e["max_tokens"];
    }
    out.push_back(std::move(c));
  }
  return out;
}

nlohmann::json run_coherence(
    const std::vector<CoherenceCheck>& checks,
    const std::function<std::string(const std::string&, int64_t)>& generate) {
  nlohmann::json failed = nlohmann::json::array();
  for (const CoherenceCheck& c : checks) {
    const std::string got = generate(c.prompt, c.max_tokens);
    if (got.find(c.expect) == std::string::npos)
      failed.push_back({{"prompt", c.prompt}, {"expect", c.expect}, {"got", got}});
  }
  return {{"prompts", checks.size()}, {"failures", failed.size()}, {"failed", failed}};
}

}  // namespace moetier
