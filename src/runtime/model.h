// Model: the runtime side of an architecture (the forward pass), loaded from a
// checkpoint onto a Backend by load_model (runtime/registry.cpp). Everything
// outside runtime/<arch>/ (generate, eval, trace, calib, the session API, the
// CLI) uses this interface and never names an architecture.
//
// Per-sequence state (a KV cache today; compressed caches later) belongs to
// the architecture: new_state() makes it, forward() advances it.
//
// Thread-safety: a Model is immutable after loading; forward() may run for
// different sequences (states) from different threads only on different
// backends (a Backend is driven by one thread at a time), each call using the
// backend's threads inside its ops.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "experts/provider.h"
#include "model/spec.h"
#include "runtime/routing.h"

namespace moetier {

class Checkpoint;

struct ForwardOptions {
  bool all_logits = false;  // logits for every token of the chunk, not just the last
  const RoutingObserver* observer = nullptr;
  // When set, the logits go to this device buffer ([rows, vocab]) and forward
  // returns an empty vector (no host copy: a decode graph is being recorded).
  float* device_logits = nullptr;
};

// One sequence's state. start_pos rules: see KvCache (runtime/kv_cache.h).
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t size() const = 0;      // valid positions
  virtual void set_size(int64_t n) = 0;  // after a replayed decode graph advanced it
  virtual int64_t capacity() const = 0;  // positions it can hold
  virtual uint64_t bytes() const = 0;    // device memory it holds
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual const Checkpoint& checkpoint() const = 0;
  virtual Backend& backend() const = 0;
  // Device memory of the resident core (0 when used in place, as on the CPU).
  virtual uint64_t core_device_bytes() const = 0;

  // A fresh state for up to `capacity` positions.
  virtual std::unique_ptr<SequenceState> new_state(int64_t capacity) const = 0;
  // Runs tokens [n] at positions start_pos .. start_pos + n - 1. Returns
  // logits [vocab] for the last token, or [n, vocab] with all_logits (host
  // memory). Phase is Prefill when n > 1, else Decode. Throws Error for a
  // token outside the vocabulary or positions outside the state.
  virtual std::vector<float> forward(std::span<const int32_t> tokens, int64_t start_pos,
                                     SequenceState& state, ExpertProvider& experts,
                                     const ForwardOptions& opt = {}) const = 0;
};

// Loads the checkpoint's architecture (model_spec(ck) first: an unsupported
// one is refused with `moetier check`'s line) onto `be`. The Checkpoint and
// the Backend must outlive the model.
std::unique_ptr<Model> load_model(const Checkpoint& ck, Backend& be);

// An architecture's forward pass: loads it from ck onto be.
using LoadModelFn = std::unique_ptr<Model> (*)(const Checkpoint& ck, Backend& be);
// Adds the forward pass of the architecture registered (model/architecture.h)
// under `name`, after the built-in ones (runtime/registry.cpp). Throws Error
// when `name` already has one. Not synchronized with load_model: register
// before the first load that may run on another thread, as architectures.
void register_forward(std::string_view name, LoadModelFn load);
// The same on a process-wide CPU backend.
std::unique_ptr<Model> load_model(const Checkpoint& ck);
Backend& default_cpu_backend();

}  // namespace moetier
