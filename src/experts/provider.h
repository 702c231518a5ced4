// ExpertProvider: how the runtime gets the weights of the experts it routed to.
//
// Protocol (single caller thread per provider; the provider may use I/O
// threads internally):
//   1. The runtime routes a chunk of tokens for one layer and collects the
//      distinct experts it needs, at most max_batch() at a time.
//   2. It calls acquire(layer, ids, phase, views). On return every view is
//      valid and fully loaded (never partially read bytes), or acquire threw
//      Error and no view is valid.
//   3. Views stay valid until the next acquire() call on this provider.
// Implementations: MappedExperts (all resident, views into the checkpoint's
// mmap; src/runtime) and the arena-backed store (src/experts, issue 3).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace moetier {

enum class Phase : uint8_t { Prefill, Decode };

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Largest number of distinct experts one acquire() call may ask for.
  virtual int64_t max_batch() const = 0;
  // views.size() == ids.size() on return; views[i] belongs to ids[i].
  virtual void acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
                       std::vector<ExpertView>& views) = 0;
  // Optional, for accounting only (ExpertStats' all-k-hit share): after the
  // acquire() calls that served a chunk of tokens for `layer`, the runtime may
  // report their routing, topk [n_tokens, k] expert ids (n_tokens =
  // topk.size() / k). A (token, layer) step counts as an all-hit when every one
  // of its k experts was resident in the arena at the acquire() that served it.
  virtual void note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) {}
  // Optional: a Backend expert table (Backend::register_experts) holding every
  // expert of `layer`, resident for the provider's lifetime, or -1. With one,
  // a decode step may skip acquire() and run the experts on the device
  // straight from the router's output (no host round trip); such steps are
  // not counted in any provider statistic.
  virtual int device_table(int64_t layer) const { return -1; }
};

}  // namespace moetier
