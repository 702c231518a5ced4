// Architecture: the static side of a supported model family (no compute):
// its names in config.json, the config parser, the tensor map and how its
// checkpoints name their MoE tensors. Implementations live in
// model/<arch>/; model/registry.cpp lists them (one line each), and
// register_architecture() adds one from outside the library (a test, later a
// plugin). The forward pass of an architecture is registered on the runtime
// side (runtime/registry.cpp, register_forward), by the same name.
//
// Thread-safety: architectures are immutable singletons. Registration is not
// synchronized with lookups: register every architecture before the first
// lookup that may run on another thread (at start-up, in a test's set-up).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/spec.h"

namespace moetier {

class Checkpoint;

class Architecture {
 public:
  virtual ~Architecture() = default;
  // config.json's model_type ("qwen3_moe").
  virtual std::string_view name() const = 0;
  // config.json's `architectures` entries it accepts ("Qwen3MoeForCausalLM").
  virtual std::vector<std::string_view> class_names() const = 0;
  virtual const MoeTensorNames& names() const { return default_names_; }
  // The spec config.json describes; every problem is appended as one line
  // "FILE: field 'NAME': ..." (fields that did not parse keep sizes 0).
  virtual ModelSpec parse(const nlohmann::json& config, const std::filesystem::path& file,
                          std::vector<std::string>& problems) const = 0;
  // Every non-expert tensor with its config-implied shape; empty when the
  // config does not give the sizes (parse() reports why). Never throws.
  virtual std::vector<TensorSpec> core_tensors(const nlohmann::json& config,
                                               const std::filesystem::path& file) const = 0;
  // config.json of a derived checkpoint with `n` experts per MoE layer.
  virtual nlohmann::json with_num_experts(const nlohmann::json& config, int64_t n) const = 0;
  // config.json of a named shape preset (`moetier synth --preset NAME`), or
  // null when the architecture has no such preset; the preset names listed.
  virtual nlohmann::json preset(std::string_view name) const { return nullptr; }
  virtual std::vector<std::string_view> presets() const { return {}; }

 private:
  MoeTensorNames default_names_;
};

// Every registered architecture: the built-in ones (model/registry.cpp), then
// those added by register_architecture, in order.
std::span<const Architecture* const> architectures();
// Appends `arch` (which must outlive every use: a static). Throws Error when
// an architecture of that name or one of its class names is already
// registered. See the thread-safety rule at the top.
void register_architecture(const Architecture& arch);
// "qwen3_moe" or "a, b" for messages.
std::string supported_architectures();

// The architecture config.json (`file`) names through model_type and/or
// architectures; nullptr, with one line appended to problems, when it names
// none that is supported (or names two that disagree).
const Architecture* find_architecture(const nlohmann::json& config, const std::string& file,
                                      std::vector<std::string>& problems);
// Same, throwing Error with that line.
const Architecture& architecture_of(const nlohmann::json& config,
                                    const std::filesystem::path& file);
// architecture_of(ck's config.json), then parse; throws Error with the first
// problem. Every command that computes calls this before anything else.
ModelSpec model_spec(const Checkpoint& ck);

}  // namespace moetier
