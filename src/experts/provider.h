// ExpertProvider: how the runtime gets the weights of the experts it routed to.
//
// Protocol (one caller thread per provider: all calls, and every Session that
// shares the provider, on that thread; the provider may run reads on its own
// threads, which never touch anything but the request being read):
//   1. The runtime routes a chunk of tokens for one layer and collects the
//      distinct experts it needs, at most max_batch() at a time.
//   2. submit(layer, ids, phase) decides where every expert goes, starts the
//      reads of the missing ones and returns a Ticket without waiting for
//      them (it blocks only for experts that an earlier request is still
//      loading, and for the slots a cramped arena must first get back).
//   3. wait(ticket, views) blocks until the ticket's experts are loaded and
//      validated: on return every view is valid and fully loaded (never
//      partially read bytes), or wait threw Error, no view is valid and the
//      ticket is finished (nothing of a failed read stays behind).
//   4. Views stay valid, and their experts pinned (never evicted or
//      overwritten), until release(ticket). Pins are reference counts: several
//      open tickets (of several sessions) may pin the same expert. Every
//      ticket must be released, waited or not (release of a ticket never
//      waited cancels it: its uses are not counted).
//   5. The pins of all open tickets plus the batch being submitted must fit
//      in max_batch() distinct experts (placement is then guaranteed).
//      can_overlap(layer, ids, phase) says whether a submit now would decide
//      exactly as it would with no ticket open: the runtime submits the next
//      batch before computing the current one only then, so that overlapping
//      reads with compute changes no counter (docs/cache-protocol.md).
//      submit_overlapped(layer, ids, phase) is that check and submit in one:
//      an invalid ticket (no plan kept, no use counted) where the batch cannot
//      be placed beside the open tickets; the caller then releases its open
//      batch and submits as usual.
//   6. prefetch(layer, ids, phase) is a hint that those experts will be needed
//      soon: it starts loads where the arena has room without disturbing open
//      tickets and returns at once. It never changes the output; it is counted
//      (ExpertStats::prefetch). With wants_next_layer_hints(), the runtime
//      gives such hints for layer L + 1 after layer L's first submit.
//   7. acquire(layer, ids, phase, views) is submit + wait for callers that do
//      not overlap: its views stay valid until the next acquire(), which
//      releases the previous acquire's ticket first.
//   8. Optionally, after the batches that served a chunk, note_routing(layer,
//      topk, k) reports the chunk's routing (accounting only).
// Implementations: MappedExperts (all resident, views into the checkpoint's
// mmap; src/runtime) and ArenaExperts (src/experts/arena_experts.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace moetier {

enum class Phase : uint8_t { Prefill, Decode };

// An open request of one provider (opaque; copyable; invalid by default).
struct Ticket {
  uint32_t index = UINT32_MAX;
  uint32_t gen = 0;
  bool valid() const { return index != UINT32_MAX; }
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Largest number of distinct experts one submit() may ask for.
  virtual int64_t max_batch() const = 0;
  // Starts a request (see the protocol above). Throws Error for a dense layer,
  // an id out of range, too many ids, or when open tickets leave no room.
  virtual Ticket submit(int64_t layer, std::span<const int32_t> ids, Phase phase) = 0;
  // views.size() == ids.size() on return; views[i] belongs to ids[i].
  virtual void wait(Ticket t, std::vector<ExpertView>& views) = 0;
  virtual void release(Ticket t) = 0;
  // True when submit(layer, ids, phase) now decides as with no ticket open.
  virtual bool can_overlap(int64_t layer, std::span<const int32_t> ids, Phase phase) {
    return false;
  }
  virtual Ticket submit_overlapped(int64_t layer, std::span<const int32_t> ids, Phase phase) {
    return can_overlap(layer, ids, phase) ? submit(layer, ids, phase) : Ticket{};
  }
  // A hint; returns at once; never throws for I/O (a failed prefetch read is
  // counted, and the expert stays absent).
  virtual void prefetch(int64_t layer, std::span<const int32_t> ids, Phase phase) {}
  // Whether the runtime should predict the next MoE layer's experts while a
  // decode step's layer runs and pass them to prefetch() (--prefetch
  // next-layer: layer L + 1's router applied to layer L's hidden state).
  virtual bool wants_next_layer_hints() const { return false; }
  // Optional, for accounting only (ExpertStats' all-k-hit share): after the
  // batches that served a chunk of tokens for `layer`, the runtime may report
  // their routing, topk [n_tokens, k] expert ids (n_tokens = topk.size() / k).
  // A (token, layer) step counts as an all-hit when every one of its k experts
  // was resident in the arena (and not still loading) at the submit that
  // served it.
  virtual void note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) {}
  // Optional: a Backend expert table (Backend::register_experts) holding every
  // expert of `layer`, resident for the provider's lifetime, or -1. With one,
  // a decode step may skip acquire() and run the experts on the device
  // straight from the router's output (no host round trip); such steps are
  // not counted in any provider statistic.
  virtual int device_table(int64_t layer) const { return -1; }
  // Optional, with device_table() (a provider whose tables change, such as
  // the arena's mapped host tier): where a decode step on the device writes
  // layer's router ids [k] (device memory; null: the forward's own scratch),
  // and the two calls around every such step (a graph replay or a plain
  // step): before_device_step() brings the tables up to date (the ops it
  // issues precede the step's), after_device_step() reads the ids and does
  // what a step through acquire() would have done (counting, admission).
  // Only the Session calls them, from the provider's thread.
  virtual int32_t* device_ids(int64_t layer) const { return nullptr; }
  // Optional, with device_table(): where a decode step reports layer's staged
  // experts (Backend::NextLayer::staged, [k] device), or null: no staging of
  // layer's experts is asked for. The step that stages them is the one that
  // reads them; after_device_step() may count them.
  virtual int32_t* device_staged(int64_t layer) const { return nullptr; }
  virtual void before_device_step() {}
  virtual void after_device_step() {}
  // Whether those two calls do anything: a provider whose tables never change
  // lets the session launch a decode step before the one before has finished
  // (Session::decode_greedy_run).
  virtual bool device_steps_need_host() const { return false; }

  // submit + wait; releases the previous acquire()'s ticket first.
  void acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
               std::vector<ExpertView>& views);
  // Releases the ticket of the last acquire() (if any); acquire() does it too.
  void release_acquired();

 private:
  Ticket acquired_;
};

// Releases a ticket when it goes out of scope (exception safety for callers
// that hold several tickets).
class TicketGuard {
 public:
  TicketGuard() = default;
  TicketGuard(ExpertProvider& p, Ticket t) : p_(&p), t_(t) {}
  TicketGuard(const TicketGuard&) = delete;
  TicketGuard& operator=(const TicketGuard&) = delete;
  ~TicketGuard() { reset(); }
  void reset(ExpertProvider* p = nullptr, Ticket t = {});
  Ticket get() const { return t_; }
  // Gives the ticket back to the caller without releasing it.
  Ticket take();

 private:
  ExpertProvider* p_ = nullptr;
  Ticket t_;
};

}  // namespace moetier
