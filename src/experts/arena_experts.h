// ArenaExperts: the ExpertProvider for models larger than memory. Experts live
// in an arena of fixed-size slots (hot set + transient ring, see
// experts/residency.h) and, optionally, a host-RAM tier; misses are read in
// place from the checkpoint's shards with O_DIRECT, batched.
//
// submit(layer, ids, phase): looks every id up, evicts what the policy says,
// copies host-tier hits back, and queues ONE batched read for all misses on
// the loader thread (experts/loader.h); it returns at once. wait(ticket)
// blocks until the read is done (or runs it on the spot when the loader has
// not started it), validates the bytes (sizes, NaN/Inf weights, 0xff e8m0
// scales), and only then marks them resident and returns views. Any failure
// (short read, EIO, truncated shard, validation) throws Error from wait()
// naming the file, tensor, layer and expert; the slots that were being loaded
// are released, nothing half-read is ever visible, and the next request works
// normally. Views stay valid (their slots pinned) until release(ticket).
//
// Memory (the backend seam). Without a backend, slots and the host tier are
// 4 KiB-aligned host buffers and reads land in the slots. With
// ArenaConfig::backend: when backend->is_host() (the CPU backend) slots come
// from alloc_host and reads still land in them; otherwise slots are device
// memory (backend->alloc), the host tier and a ring of read staging slots are
// pinned host memory (alloc_host), a read lands in a staging slot, is
// validated there (host bytes) and is copied with to_device when its request
// is reaped; host-tier hits are copied with to_device, spills with to_host.
// A staging slot is reused only after a backend->synchronize() that follows
// its copy.
//
// Host-tier copies. When the arena is host memory (no backend, or a host
// backend) the copies a plan needs (spills arena -> host, then host hits
// host -> arena) are part of its load job: they run off the caller's thread
// before the job's reads, split over threads (experts/copy_work.h), so that
// they overlap compute like reads do; their experts are Loading until the job
// is reaped. Two jobs that touch one slot (a spill reads what a later job
// writes, a later spill writes a host slot an earlier fill reads) run in push
// order: a job is pushed only after every unreaped job touching its slots
// (arena_job_, host_job_) is reaped. A job of copies alone is not handed to
// the loader when that cannot pay: when it is small (kInlineCopyBytes; the
// hand-off costs more than the copy), or when no other ticket is open (the
// caller waits for it at once); it is then copied inside submit, on the
// caller's thread and the pool's. A use that waits for an expert still
// being copied is not a hits.loading (that is for storage reads): it counts
// as where its bytes are once copied, exactly as with synchronous copies. On
// a device arena the copies stay on the owner's thread (to_device / to_host,
// the backend's one stream).
//
// Set-up. The arena, host tier and staging slots that are host memory are
// pre-faulted at construction (experts/prefault.h; huge pages where the
// kernel allows), so no request pays a first touch; setup() says what it took.
//
// Mapped host tier. On a device backend that reads host memory in place
// (Backend::reads_host_memory), with a host tier large enough for every
// expert and ArenaConfig::top_k set, the set-up reads every expert into the
// host tier, and each MoE layer gets a device expert table
// (Backend::register_experts) whose entry for an expert names its arena slot
// when it is resident there (committed) and its host-tier copy otherwise.
// Decode steps then run on the device from the router's output, in one CUDA
// graph, reading arena experts from device memory and the others over PCIe
// in place; prefill goes through submit/wait as before. Protocol of a device
// step (the Session calls both; the owner's thread):
//   - before_device_step(): commits the host -> arena copies that are done
//     (Backend::copy_done, per plan), and sets every table entry that differs from
//     the residency to it (Backend::update_experts, ordered before the step).
//     A table thus never names a slot whose bytes are not all there.
//   - after_device_step(): reads the step's router ids (device_ids) and, per
//     layer, plans them as a decode acquire would (Residency::plan, the same
//     rules and policy), counts them (a use of an expert still being copied
//     in counts as the host-tier hit it was), and starts the plan's host ->
//     arena copies on the copy stream (Backend::to_device_async). A victim's
//     slot is overwritten only after the step that last read it is done, and
//     the next step reads the victim from its host copy (the table is updated
//     before it). Host copies stay in place: a host tier that holds every
//     expert never spills.
//   - With --prefetch next-layer, device_staged() asks the step to stage
//     each layer's predicted host experts in device memory during the layer
//     before (Backend::NextLayer); after_device_step() counts them as
//     prefetches (issued, used, wasted) and resets the reports.
//   - Any submit, prefetch or drain first waits for those copies and commits
//     them (a prefill must not read a slot still being written).
//
// Threading protocol: as ExpertProvider — every public call on the owner's
// thread; the loader thread only runs LoadJobs (reads and validation of host
// bytes; experts/loader.h). Everything else (Residency, tickets, stats,
// backend copies) is touched by the owner's thread only: a finished job is
// "reaped" (committed or aborted) by the owner at its next call.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/buffer.h"
#include "experts/index.h"
#include "experts/prefault.h"
#include "experts/provider.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "io/reader.h"

namespace moetier {

class Loader;

struct ArenaConfig {
  size_t hot_slots = 0;
  size_t transient_slots = 0;
  size_t host_slots = 0;
  PolicyKind policy = PolicyKind::Lru;
  std::vector<ExpertKey> ranking;  // PolicyKind::Pinned: hottest first
  size_t max_pinned = 0;           // PolicyKind::Pinned
  io::ReaderKind reader = io::ReaderKind::Auto;
  int io_depth = 16;   // io_uring queue depth / pread threads
  bool direct = true;  // O_DIRECT (with a counted buffered fallback)
  bool validate = true;
  Backend* backend = nullptr;  // memory through the backend seam (above); null: host buffers
  size_t staging_slots = 0;    // device path: read staging slots (0: max_batch + prefetch_limit)
  size_t prefetch_limit = 0;   // most experts prefetch loads hold at once (0: max_batch)
  // Host arena: host-tier copies in the load jobs, split over threads (false:
  // one memcpy each inside submit, as before issue 12; kept for A/B runs).
  bool async_host_copies = true;
  bool prefault = true;    // pre-fault the tiers' host memory at set-up (see "Set-up")
  bool huge_pages = true;  // with it, ask for transparent huge pages (host arena)
  // The mapped host tier (see "Mapped host tier" above): the router's top-k
  // (0: off; MOETIER_MAPPED_HOST=0 turns it off too).
  int64_t top_k = 0;
  // --prefetch next-layer: ask the runtime for the next layer's predicted
  // experts at decode (ExpertProvider::wants_next_layer_hints).
  bool next_layer_hints = false;
  // One-line notes the CLI may print (an O_DIRECT fallback); null: none.
  std::function<void(const std::string&)> note;
};

class ArenaExperts final : public ExpertProvider {
 public:
  // stats may be null (the provider then keeps its own; see stats()).
  ArenaExperts(ExpertIndex index, const ArenaConfig& cfg, ExpertStats* stats);
  ~ArenaExperts() override;

  int64_t max_batch() const override;
  Ticket submit(int64_t layer, std::span<const int32_t> ids, Phase phase) override;
  void wait(Ticket t, std::vector<ExpertView>& views) override;
  void release(Ticket t) override;
  bool can_overlap(int64_t layer, std::span<const int32_t> ids, Phase phase) override;
  Ticket submit_overlapped(int64_t layer, std::span<const int32_t> ids, Phase phase) override;
  bool wants_next_layer_hints() const override { return cfg_next_layer_hints_; }
  void prefetch(int64_t layer, std::span<const int32_t> ids, Phase phase) override;
  void note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) override;

  // The mapped host tier (null / no-ops without it).
  int device_table(int64_t layer) const override;
  int32_t* device_ids(int64_t layer) const override;
  int32_t* device_staged(int64_t layer) const override;
  void before_device_step() override;
  void after_device_step() override;
  bool device_steps_need_host() const override { return mapped_; }
  bool mapped_host() const { return mapped_; }

  // Blocks until every load in flight (prefetches included) is done and reaped.
  void drain();
  size_t open_tickets() const { return open_; }
  size_t loads_in_flight() const { return inflight_.size(); }

  const ExpertIndex& index() const { return index_; }
  const Residency& residency() const { return res_; }
  const ExpertStats& stats() const { return *stats_; }
  ExpertStats& stats() { return *stats_; }
  const std::string& reader_name() const { return reader_name_; }
  bool device_slots() const { return device_; }  // slots are device memory (staged reads)
  // What the set-up took: allocation and pre-faulting of the host memory.
  struct Setup {
    uint64_t ns = 0;
    PrefaultResult prefault;  // summed over the buffers; ns: the pre-faulting alone
  };
  const Setup& setup() const { return setup_; }

 private:
  struct Job;
  static constexpr uint64_t kInlineCopyBytes = uint64_t(1) << 20;
  struct Request {
    uint32_t gen = 0;
    bool open = false, waited = false, failed = false;
    int64_t layer = 0;
    Plan plan;
    std::vector<uint32_t> pos;  // [ids] index into plan.steps
    std::unique_ptr<Job> job;   // the storage reads, or null
    std::string problem;        // failed: the one-line error
  };

  std::byte* slot_ptr(int32_t slot) const { return arena_base_ + size_t(slot) * slot_bytes_; }
  std::byte* host_ptr(int32_t h) const { return host_base_ + size_t(h) * slot_bytes_; }
  std::byte* staging_ptr(int32_t s) const { return staging_base_ + size_t(s) * slot_bytes_; }
  void allocate_memory(const ArenaConfig& cfg);
  void collect_keys(int64_t layer, std::span<const int32_t> ids);  // -> keys_, pos_
  Request& request(Ticket t);
  uint32_t new_request();
  void free_request(uint32_t index);
  void wait_for_loading_keys(int64_t layer);
  void make_staging_room(size_t n);
  bool sync_copies() const { return device_ || !async_copies_; }
  void copy_tiers(const Plan& plan);  // sync_copies(): the copies on the owner's thread
  std::unique_ptr<Job> make_job(const Plan& plan, int64_t layer, bool prefetch);
  void add_copies(const Plan& plan, Job& job);  // host arena: the copies into the job
  void add_reads(const PlanStep& st, Job& job);
  void order_after_slot_users(Job& job);
  bool run_inline(Job& job, bool waited_at_once);
  void prefault_all(bool huge);
  void push(Job* job);
  void reap(Job* job);
  void reap_finished();
  void reap_ok(Job& job);
  void reap_failed(Job& job);
  void wait_job(Job* job, int64_t layer);
  // Waits for (and reaps) every prefetch still in flight; false when there was none.
  bool wait_prefetches(int64_t layer);
  // submit; with `overlapped`, a batch that cannot be planned beside the open
  // tickets gives an invalid ticket (plan aborted, no use counted; loads it
  // waited for stay reaped).
  Ticket submit_impl(int64_t layer, std::span<const int32_t> ids, Phase phase, bool overlapped);
  void note_fallbacks();
  // The mapped host tier (arena_mapped.cpp).
  void setup_mapped(const ArenaConfig& cfg);
  void fill_host_tier();
  void finish_device_copies(bool wait);  // commits the plans of copying_ whose copies are done
  void device_step_layer(int64_t layer, std::span<const int32_t> ids);
  void device_step_batch(int64_t layer, std::span<const int32_t> ids);  // distinct, ascending

  ExpertIndex index_;
  Residency res_;
  size_t slot_bytes_ = 0;
  Backend* backend_ = nullptr;
  bool device_ = false;
  // Memory: host buffers without a backend, else the backend's.
  AlignedBuffer arena_host_, host_host_;
  DeviceBuffer arena_dev_, host_dev_, staging_dev_;
  std::byte* arena_base_ = nullptr;    // [hot + transient slots, slot_bytes]
  std::byte* host_base_ = nullptr;     // [host slots, slot_bytes]
  std::byte* staging_base_ = nullptr;  // [staging slots, slot_bytes] (device path)
  std::vector<int32_t> staging_free_, staging_pending_;  // pending: copied, not synchronized
  std::vector<std::unique_ptr<io::DirectFile>> files_;   // [shards]
  std::vector<uint8_t> fallback_noted_;                  // [shards]
  std::function<void(const std::string&)> note_;
  bool validate_ = true;
  bool async_copies_ = true;
  size_t prefetch_limit_ = 0, prefetch_held_ = 0;
  bool cfg_next_layer_hints_ = false;
  ExpertStats own_stats_;
  ExpertStats* stats_ = nullptr;
  std::string reader_name_;
  // Requests and loads.
  std::vector<Request> requests_;  // [ticket index]
  std::vector<uint32_t> free_requests_;
  size_t open_ = 0;
  std::vector<std::unique_ptr<Job>> prefetch_jobs_;
  std::deque<Job*> inflight_;      // pushed, not reaped; oldest first
  std::vector<Job*> loading_job_;  // [num_keys] the job reading or copying the key, or null
  std::vector<Job*> arena_job_;    // [arena slots] last unreaped job touching the slot, or null
  std::vector<Job*> host_job_;     // [host slots] last unreaped job touching the slot, or null
  Setup setup_;
  std::vector<uint8_t> last_hit_;  // [num_keys] latest use was a hot/transient hit
  std::vector<uint64_t> pf_cost_;  // [num_keys] load time share of a prefetched key
  // Scratch of one call.
  std::vector<ExpertKey> keys_;     // distinct keys, first-seen order
  std::vector<uint32_t> pos_;       // [ids] index into keys_
  std::vector<ExpertKey> late_;     // keys whose earlier load this submit waited for
  std::vector<uint64_t> key_seen_;  // [num_keys] dedupe stamp
  std::vector<uint32_t> key_pos_;   // [num_keys] index into keys_ when stamped
  uint64_t stamp_ = 0;
  // The mapped host tier.
  bool mapped_ = false;
  int64_t top_k_ = 0;
  std::vector<int> tables_;            // [layers] backend expert table, -1 for a dense layer
  DeviceBuffer routing_dev_;           // [layers, top_k] int32: a device step's router ids
  std::vector<int32_t> routing_host_;  // [layers, top_k] their host copy
  DeviceBuffer staged_dev_;            // [layers, top_k] int32: staged experts (device_staged)
  std::vector<int32_t> staged_host_;   // [layers, top_k] their host copy
  std::vector<int32_t> staged_none_;   // [layers, top_k] all -1: the reset
  void count_staged(int64_t layer, std::span<const int32_t> staged, std::span<const int32_t> ids);
  uint64_t admit_window_ = 64;       // MOETIER_MAPPED_ADMIT (0: admit on every host-tier use)
  uint64_t device_steps_ = 0;        // device steps seen (after_device_step)
  std::vector<uint64_t> host_seen_;  // [num_keys] device step of the last use (0: none)
  void keep_admitted(int64_t layer);
  std::vector<int32_t> entry_slot_;  // [num_keys] arena slot the table names, -1: host tier
  // Plans whose host -> arena copies are in flight, oldest first, with the
  // number of each plan's last copy (Backend::copy_done).
  std::vector<std::pair<uint64_t, Plan>> copying_;
  std::vector<std::pair<ExpertKey, int32_t>> changed_;  // scratch of before_device_step
  std::vector<Backend::ExpertTableEntry> updates_;      // scratch of before_device_step
  std::vector<int32_t> sorted_ids_;                     // scratch of device_step_layer
  std::unique_ptr<Loader> loader_;  // last: destroyed first (its jobs point into the memory)
};

}  // namespace moetier
