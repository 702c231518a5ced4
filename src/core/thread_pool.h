// ThreadPool: the CPU kernels' threads. parallel_for(n, grain, fn) cuts [0, n)
// into chunks of `grain` and runs fn(begin, end) on the workers and on the
// calling thread; it returns when every chunk has run.
//
// Why not OpenMP: on a machine shared with other work, OpenMP's spinning
// barriers and static schedules stall each parallel region until a
// descheduled thread runs again (eval fell from 771 to ~40 tok/s with two
// threads on two busy cores). Here chunks are taken dynamically, so threads
// that are running do the work of those that are not, and idle threads sleep.
//
// Protocol (one job at a time per pool; the caller is the job's owner):
//   - The caller writes the job (fn, n, grain, chunk count), then publishes a
//     new generation G in `ticket_` (G << 32 | next chunk index 0) and in
//     `epoch_`, and wakes sleeping workers.
//   - Anyone (workers, caller) takes chunk i of job G by a compare-exchange of
//     ticket_ from (G, i) to (G, i + 1), only while i < chunks (at most
//     kMaxChunks: a larger job gets a larger grain). A thread that
//     woke for an older job fails the exchange (its G is stale), so it never
//     runs a chunk with another job's fn. Job fields are stable while a chunk
//     of G is taken and not finished, since the caller waits for every chunk.
//   - After running a chunk, the thread decrements `pending_`; the caller
//     returns when it reaches 0 (spinning briefly, then sleeping on it).
//   - Idle workers spin on epoch_ for about kSpinIters pauses, then sleep
//     (std::atomic::wait, a futex); `sleepers_` tells the caller whether a
//     wake-up call is needed (seq_cst on both sides, so a worker going to
//     sleep either sees the new epoch or is counted).
//   - A parallel_for from inside fn (or while another thread's job runs on
//     this pool) runs serially on its caller: jobs never nest.
//   - Determinism: which thread runs a chunk is not fixed, so fn must compute
//     each output from its inputs alone (the kernels do; see kernels/cpu).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace moetier {

class ThreadPool {
 public:
  using Fn = std::function<void(int64_t begin, int64_t end)>;

  explicit ThreadPool(int threads);  // threads >= 1, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return int(workers_.size()) + 1; }
  void parallel_for(int64_t n, int64_t grain, const Fn& fn);

 private:
  void worker_loop();
  bool run_one_chunk(uint32_t gen);  // false when job gen has no chunk left
  void wait_done();

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> ticket_{0};  // generation << 32 | next chunk
  std::atomic<uint32_t> epoch_{0};   // generation of the latest job
  // Chunks of the current job not yet finished. 32 bits: std::atomic::wait on
  // a 4-byte atomic is a futex on its own address, while a wider one goes
  // through libstdc++'s shared proxy word. With 64 bits a caller once slept
  // forever in wait_done after every chunk had been claimed (a moetier bench
  // at 2 threads, GCC 12); the stale-worker claim that parallel_for now
  // prevents (it sent this count below zero) can explain that hang too.
  std::atomic<int32_t> pending_{0};
  std::atomic<int> sleepers_{0};   // workers blocked in epoch_.wait
  std::atomic<bool> busy_{false};  // a job is running (jobs never nest)
  std::atomic<bool> stop_{false};
  // The current job; written only by its caller before publishing the epoch.
  std::atomic<const Fn*> fn_{nullptr};
  std::atomic<int64_t> n_{0}, grain_{1}, chunks_{0};
};

// The pool the CPU kernels use, created on first use with default_threads()
// threads (or the count given to set_global_threads before).
ThreadPool& global_pool();
// Replaces the global pool (n <= 0: default_threads()). Not while a kernel runs.
void set_global_threads(int n);
// MOETIER_THREADS, else OMP_NUM_THREADS, else the CPUs this process may run
// on (its affinity mask, capped by a cgroup CPU quota): never more threads
// than the cores it can get.
int default_threads();

}  // namespace moetier
