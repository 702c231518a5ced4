// ArenaExperts: the load side. A Job is built from a plan's storage misses,
// pushed to the Loader, and reaped on the owner's thread once done: on
// success its bytes are copied to the device (staged path) and the plan is
// committed; on failure the plan is released and aborted (nothing stays
// behind) and the error waits for the request's wait().
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/thread_pool.h"
#include "experts/arena_experts.h"
#include "experts/arena_job.h"
#include "experts/loader.h"

namespace moetier {

// The job of a plan: its host-tier copies (host arena) and its storage
// reads, or null when it needs neither.
std::unique_ptr<ArenaExperts::Job> ArenaExperts::make_job(const Plan& plan, int64_t layer,
                                                          bool prefetch) {
  const bool fills = std::any_of(plan.steps.begin(), plan.steps.end(),
                                 [](const PlanStep& st) { return st.found == Tier::Host; });
  const bool reads = std::any_of(plan.steps.begin(), plan.steps.end(),
                                 [](const PlanStep& st) { return st.found == Tier::Storage; });
  const bool copies = !sync_copies() && (fills || !plan.spills.empty());
  if (!copies && !reads) return nullptr;
  auto j = std::make_unique<Job>();
  j->prefetch = prefetch;
  j->validate = validate_;
  j->index = &index_;
  j->layer = layer;
  if (copies) add_copies(plan, *j);
  for (const PlanStep& st : plan.steps)
    if (st.found == Tier::Storage) add_reads(st, *j);
  if (!device_) order_after_slot_users(*j);
  return j;
}

// Spills first, then fills (copy_work.h runs them in that order).
void ArenaExperts::add_copies(const Plan& plan, Job& j) {
  for (const Spill& sp : plan.spills) {
    const size_t n = index_.record(sp.key).slot_bytes;
    j.copies.add(host_ptr(sp.host_slot), slot_ptr(sp.slot), n, true);
    j.arena_touch.push_back(sp.slot);
    j.host_touch.push_back(sp.host_slot);
    stats_->host_copy_bytes += n;
  }
  for (const PlanStep& st : plan.steps) {
    if (st.found != Tier::Host) continue;
    const size_t n = index_.record(st.key).slot_bytes;
    j.copies.add(slot_ptr(st.slot), host_ptr(st.host_slot), n, false);
    j.filled.push_back(st.key);
    j.arena_touch.push_back(st.slot);
    j.host_touch.push_back(st.host_slot);
    stats_->host_copy_bytes += n;
  }
}

void ArenaExperts::add_reads(const PlanStep& st, Job& j) {
  int32_t stg = -1;
  if (device_) {
    if (staging_free_.empty()) {  // reuse staging only once its copies are done
      check(!staging_pending_.empty(), "expert arena: no read staging slot (internal error)");
      backend_->synchronize();
      staging_free_.insert(staging_free_.end(), staging_pending_.begin(), staging_pending_.end());
      staging_pending_.clear();
    }
    stg = staging_free_.back();
    staging_free_.pop_back();
  } else {
    j.arena_touch.push_back(st.slot);
  }
  std::byte* dest = device_ ? staging_ptr(stg) : slot_ptr(st.slot);  // host bytes
  const uint32_t li = uint32_t(j.loads.size());
  for (const Extent& e : index_.record(st.key).extents) {
    io::ReadRequest r;
    r.file = files_[e.shard].get();
    r.offset = e.offset;
    r.length = e.length;
    r.dst = dest + e.slot_offset;
    j.reqs.push_back(r);
    j.req_load.push_back(li);
  }
  j.loads.push_back({st.key, dest});
  j.slots.push_back(st.slot);
  j.staging.push_back(stg);
}

// Copies alone (no reads), small or waited at once: made now, on the
// owner's thread and the pool's (order_after_slot_users ran already).
bool ArenaExperts::run_inline(Job& j, bool waited_at_once) {
  if (!j.reqs.empty() || j.copies.empty()) return false;
  if (!waited_at_once && j.copies.bytes() > kInlineCopyBytes) return false;
  const auto t0 = std::chrono::steady_clock::now();
  j.copies.run_on(global_pool());
  stats_->host_copy_ns += uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  for (int32_t s : j.arena_touch)
    if (arena_job_[size_t(s)] == &j) arena_job_[size_t(s)] = nullptr;
  for (int32_t h : j.host_touch)
    if (host_job_[size_t(h)] == &j) host_job_[size_t(h)] = nullptr;
  return true;
}

// Jobs that touch one slot run in push order: before `j` is pushed, every
// unreaped job touching one of its slots is waited for and reaped (the loader
// may run jobs out of order: demand before prefetch, or inline in a wait).
void ArenaExperts::order_after_slot_users(Job& j) {
  for (int32_t s : j.arena_touch)
    if (Job* o = arena_job_[size_t(s)]; o && o != &j) wait_job(o, o->layer);
  for (int32_t h : j.host_touch)
    if (Job* o = host_job_[size_t(h)]; o && o != &j) wait_job(o, o->layer);
  for (int32_t s : j.arena_touch) arena_job_[size_t(s)] = &j;
  for (int32_t h : j.host_touch) host_job_[size_t(h)] = &j;
}

// Staging slots for up to n reads: finish loads in flight (oldest first)
// until enough are free or waiting for a synchronize.
void ArenaExperts::make_staging_room(size_t n) {
  while (staging_free_.size() + staging_pending_.size() < n) {
    check(!inflight_.empty(), "expert arena: {} read staging slots for {} reads (internal error)",
          staging_free_.size() + staging_pending_.size(), n);
    Job* j = inflight_.front();
    wait_job(j, j->layer);
  }
}

void ArenaExperts::push(Job* job) {
  for (const LoadJob::Load& l : job->loads) loading_job_[l.key] = job;
  for (ExpertKey k : job->filled) loading_job_[k] = job;
  inflight_.push_back(job);
  loader_->push(job);
}

void ArenaExperts::wait_job(Job* job, int64_t layer) {
  if (job->reaped) return;
  const uint64_t ns = loader_->wait(job);
  stats_->layers[size_t(layer)].stall_ns += ns;
  if (job->prefetch) stats_->prefetch.wait_ns += ns;
  reap(job);
}

void ArenaExperts::reap_finished() {
  if (inflight_.empty()) return;
  for (Job* j : std::vector<Job*>(inflight_.begin(), inflight_.end()))
    if (loader_->done(j)) reap(j);  // reap(j) touches j only: the other pointers stay valid
}

void ArenaExperts::drain() {
  finish_device_copies(true);
  while (!inflight_.empty()) {
    Job* j = inflight_.front();
    wait_job(j, j->layer);
  }
}

// Folds a finished job in. A reaped prefetch job is destroyed here.
void ArenaExperts::reap(Job* job) {
  if (job->reaped) return;
  job->reaped = true;
  inflight_.erase(std::find(inflight_.begin(), inflight_.end(), job));
  for (const LoadJob::Load& l : job->loads)
    if (loading_job_[l.key] == job) loading_job_[l.key] = nullptr;
  for (ExpertKey k : job->filled)
    if (loading_job_[k] == job) loading_job_[k] = nullptr;
  for (int32_t s : job->arena_touch)
    if (arena_job_[size_t(s)] == job) arena_job_[size_t(s)] = nullptr;
  for (int32_t h : job->host_touch)
    if (host_job_[size_t(h)] == job) host_job_[size_t(h)] = nullptr;
  stats_->host_copy_ns += job->copy_ns;
  stats_->read_requests += job->io.requests;
  stats_->aligned_read_bytes += job->io.bytes_aligned;
  stats_->direct_reads += job->io.direct_reads;
  stats_->buffered_reads += job->io.buffered_reads;
  stats_->validate_ns += job->validate_ns;
  stats_->sample_process_io();
  note_fallbacks();
  if (job->problem.empty()) {
    reap_ok(*job);
  } else {
    reap_failed(*job);
  }
  if (job->prefetch) {
    auto it = std::find_if(prefetch_jobs_.begin(), prefetch_jobs_.end(),
                           [&](const std::unique_ptr<Job>& p) { return p.get() == job; });
    prefetch_jobs_.erase(it);
  }
}

void ArenaExperts::reap_ok(Job& job) {
  if (device_) {
    for (size_t i = 0; i < job.loads.size(); ++i) {
      backend_->to_device(slot_ptr(job.slots[i]), staging_ptr(job.staging[i]),
                          index_.record(job.loads[i].key).slot_bytes);
      staging_pending_.push_back(job.staging[i]);  // free after the next synchronize
    }
  }
  if (!job.prefetch) {
    res_.commit(requests_[job.request].plan);
    return;
  }
  res_.commit(job.plan);
  res_.release(job.plan);
  prefetch_held_ -= job.plan.steps.size();
  const uint64_t ns = job.read_ns + job.validate_ns;
  stats_->prefetch.load_ns += ns;
  for (const LoadJob::Load& l : job.loads) pf_cost_[l.key] = ns / job.loads.size();
}

void ArenaExperts::reap_failed(Job& job) {
  if (device_) staging_free_.insert(staging_free_.end(), job.staging.begin(), job.staging.end());
  if (job.prefetch) {
    res_.release(job.plan);
    res_.abort(job.plan);
    prefetch_held_ -= job.plan.steps.size();
    stats_->prefetch.failed += job.loads.size();
    return;
  }
  Request& rq = requests_[job.request];
  res_.release(rq.plan);
  res_.abort(rq.plan);  // the slots being loaded are freed; hits stay valid
  rq.failed = true;
  rq.problem = job.problem;
  stats_->failed_acquires++;
  stats_->last_error = job.problem;
}

void ArenaExperts::note_fallbacks() {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (fallback_noted_[i] || files_[i]->fallbacks() == 0) continue;
    fallback_noted_[i] = 1;
    std::string note = files_[i]->path().string() + ": " + files_[i]->fallback_reason() +
                       "; reading it through the page cache";
    if (note_) note_(note);
    stats_->fallback_files++;
    stats_->fallback_notes.push_back(std::move(note));
  }
}

}  // namespace moetier
