#include "experts/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/thread_pool.h"

namespace moetier {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

io::IoCounters minus(const io::IoCounters& a, const io::IoCounters& b) {
  io::IoCounters d;
  d.requests = a.requests - b.requests;
  d.batches = a.batches - b.batches;
  d.bytes_wanted = a.bytes_wanted - b.bytes_wanted;
  d.bytes_aligned = a.bytes_aligned - b.bytes_aligned;
  d.direct_reads = a.direct_reads - b.direct_reads;
  d.buffered_reads = a.buffered_reads - b.buffered_reads;
  d.failures = a.failures - b.failures;
  return d;
}

}  // namespace

Loader::Loader(std::unique_ptr<io::Reader> reader) : reader_(std::move(reader)) {
  thread_ = std::thread([this] { thread_main(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void Loader::push(LoadJob* job) {
  {
    std::lock_guard lock(mu_);
    job->state = LoadJob::State::Queued;
    (job->prefetch ? prefetch_ : demand_).push_back(job);
  }
  work_cv_.notify_one();
}

bool Loader::done(const LoadJob* job) {
  std::lock_guard lock(mu_);
  return job->state == LoadJob::State::Done;
}

uint64_t Loader::wait(LoadJob* job) {
  const uint64_t t0 = now_ns();
  std::unique_lock lock(mu_);
  if (job->state == LoadJob::State::Queued) {  // not started: run it on this thread
    auto& q = job->prefetch ? prefetch_ : demand_;
    q.erase(std::find(q.begin(), q.end(), job));
    job->state = LoadJob::State::Running;
    lock.unlock();
    {
      std::lock_guard run_lock(run_mu_);
      run(*job, true);
    }
    lock.lock();
    job->state = LoadJob::State::Done;
    done_cv_.notify_all();
  } else if (job->state == LoadJob::State::Running && !job->copies.empty()) {
    lock.unlock();  // help the loader thread with the copies left (none once its reads began)
    job->copies.run_on(global_pool());
    lock.lock();
  }
  done_cv_.wait(lock, [&] { return job->state == LoadJob::State::Done; });
  return now_ns() - t0;
}

void Loader::thread_main() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !demand_.empty() || !prefetch_.empty(); });
    if (demand_.empty() && prefetch_.empty()) return;  // stop_, nothing left
    auto& q = demand_.empty() ? prefetch_ : demand_;
    LoadJob* job = q.front();
    q.pop_front();
    job->state = LoadJob::State::Running;
    lock.unlock();
    {
      std::lock_guard run_lock(run_mu_);
      run(*job, false);
    }
    lock.lock();
    job->state = LoadJob::State::Done;
    done_cv_.notify_all();
  }
}

// The copies, then one batched read for every request of the job, then
// validation of each expert's bytes read. The first problem wins.
void Loader::run(LoadJob& job, bool owner) {
  if (!job.copies.empty()) {
    const uint64_t c0 = now_ns();
    if (owner) {
      job.copies.run_on(global_pool());
    } else {
      job.copies.finish();
    }
    job.copy_ns = now_ns() - c0;
  }
  if (job.reqs.empty()) return;
  const io::IoCounters before = reader_->counters();
  const uint64_t t0 = now_ns();
  try {
    reader_->read(job.reqs);
  } catch (const std::exception& e) {
    job.problem = e.what();
  }
  job.read_ns = now_ns() - t0;
  job.io = minus(reader_->counters(), before);
  if (!job.problem.empty()) return;
  for (size_t j = 0; j < job.reqs.size(); ++j) {
    if (job.reqs[j].ok()) continue;
    const ExpertKey k = job.loads[job.req_load[j]].key;
    job.problem = fmt::format("{} (layer {} expert {})", io::describe_failure(job.reqs[j]),
                              job.index->layer_of(k), job.index->expert_of(k));
    return;
  }
  if (!job.validate) return;
  const uint64_t t1 = now_ns();
  for (const LoadJob::Load& l : job.loads) {
    job.problem = job.index->validate(l.key, l.bytes);
    if (!job.problem.empty()) break;
  }
  job.validate_ns = now_ns() - t1;
}

}  // namespace moetier
