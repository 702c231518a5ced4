// Loader: runs the loads of one submit or prefetch (LoadJob: its host-tier
// copies, then its batched storage reads, then the validation of the bytes
// read) off the caller's thread, so that ExpertProvider::submit() returns
// before the bytes arrive and the copies overlap the caller's compute.
//
// Threading protocol (the house rule: written down, checked by tests under
// MOETIER_THREADS=1 and 2):
//   - Two threads touch a Loader: its owner (the provider's caller thread) and
//     one loader thread it starts. The owner push()es a job; from then until
//     the owner has seen it done (done() or wait()), the job's requests,
//     results and destination bytes belong to the thread that runs it, and
//     the owner does not touch them.
//   - Jobs run one at a time (run_mu_), so the Reader is used by one thread at
//     a time as io/reader.h requires: on the loader thread in FIFO order,
//     demand jobs before prefetch jobs; or on the owner's thread inside
//     wait(job) when that job has not started yet (a caller that waits at once
//     pays no hand-off).
//   - A job's copies (experts/copy_work.h) run before its reads. On the
//     loader thread they run on that thread alone (the caller is computing on
//     the thread pool); an owner that waits for a running job helps with the
//     copies left, on the pool's threads; a job run inside wait() copies on
//     the pool's threads from the start.
//   - The runner writes a job's results before it marks the job done under
//     mu_; the owner reads them after seeing done under mu_.
//   - The destructor lets the running job finish and runs the queued ones
//     (their buffers are the owner's; it destroys the Loader before them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "experts/copy_work.h"
#include "experts/index.h"
#include "io/reader.h"

namespace moetier {

struct LoadJob {
  // Set by the owner before push().
  bool prefetch = false;
  bool validate = true;
  const ExpertIndex* index = nullptr;
  std::vector<io::ReadRequest> reqs;
  std::vector<uint32_t> req_load;  // [reqs] index into loads
  struct Load {
    ExpertKey key = 0;
    const std::byte* bytes = nullptr;  // host bytes of the expert's slot image
  };
  std::vector<Load> loads;        // the experts read; validated in this order
  CopyWork copies;                // host-tier spills and fills, run before the reads
  std::vector<ExpertKey> filled;  // the experts the fills bring into the arena
  // Results, written by the runner.
  std::string problem;  // "" or the first failure, naming shard, tensor, layer, expert
  io::IoCounters io;    // what the reads added to the reader's counters
  uint64_t read_ns = 0, validate_ns = 0, copy_ns = 0;
  // Guarded by the Loader's mutex.
  enum class State : uint8_t { Idle, Queued, Running, Done };
  State state = State::Idle;
};

class Loader {
 public:
  explicit Loader(std::unique_ptr<io::Reader> reader);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Queues `job` (owned by the caller; it must stay alive until done).
  void push(LoadJob* job);
  // Non-blocking: whether `job` has finished (ok or not).
  bool done(const LoadJob* job);
  // Blocks until `job` finished; runs it here when it has not started.
  // Returns the nanoseconds spent blocked.
  uint64_t wait(LoadJob* job);
  std::string reader_name() const { return reader_->name(); }

 private:
  void run(LoadJob& job, bool owner);  // run_mu_ held; owner: on the owner's thread
  void thread_main();

  std::unique_ptr<io::Reader> reader_;
  std::mutex run_mu_;  // held while a job runs (the Reader's single user)
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<LoadJob*> demand_, prefetch_;  // guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  std::thread thread_;
};

}  // namespace moetier
