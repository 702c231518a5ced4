// The forward passes moetier supports, by architecture name (the static side
// is model/registry.cpp): one line per architecture; register_forward adds
// more at run time.
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/model.h"
#include "runtime/qwen3_moe/model.h"

namespace moetier {
namespace {

struct Entry {
  std::string name;
  LoadModelFn load;
};

// Built in, then registered (see model.h's rule on when to register).
std::vector<Entry>& forwards() {
  static std::vector<Entry> all = {
      {"qwen3_moe", &qwen3_moe::load},  // one line per architecture
  };
  return all;
}

}  // namespace

void register_forward(std::string_view name, LoadModelFn load) {
  check(load != nullptr, "architecture '{}': register_forward without a loader", name);
  for (const Entry& e : forwards())
    check(e.name != name, "architecture '{}' already has a forward pass", name);
  forwards().push_back({std::string(name), load});
}

std::unique_ptr<Model> load_model(const Checkpoint& ck, Backend& be) {
  const ModelSpec spec = model_spec(ck);  // refuses what `moetier check` refuses
  for (const Entry& e : forwards())
    if (e.name == spec.arch->name()) return e.load(ck, be);
  fail("{}: architecture '{}' has no forward pass in this build",
       (ck.dir() / "config.json").string(), spec.arch->name());
}

Backend& default_cpu_backend() {
  static const std::unique_ptr<Backend> be = make_cpu_backend();
  return *be;
}

std::unique_ptr<Model> load_model(const Checkpoint& ck) {
  return load_model(ck, default_cpu_backend());
}

}  // namespace moetier
