// The forward passes moetier supports, by architecture name (the static side
// is model/registry.cpp): one line per architecture.
#include <string_view>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/model.h"
#include "runtime/qwen3_moe/model.h"

namespace moetier {
namespace {

struct Entry {
  std::string_view name;
  std::unique_ptr<Model> (*load)(const Checkpoint&, Backend&);
};

constexpr Entry kForwards[] = {
    {"qwen3_moe", &qwen3_moe::load},  // one line per architecture
};

}  // namespace

std::unique_ptr<Model> load_model(const Checkpoint& ck, Backend& be) {
  const ModelSpec spec = model_spec(ck);  // refuses what `moetier check` refuses
  for (const Entry& e : kForwards)
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
