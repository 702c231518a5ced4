// The pread thread-pool reader. Protocol: read_batch() publishes the batch
// under mu_ (bumping gen_), then works on it itself; workers that see a new
// generation join in while the batch is still published (batch_ non-empty,
// so read_batch() cannot return before they leave). Requests are claimed with
// next_.fetch_add, so each is done by exactly one thread. read_batch() returns
// only when every request is done and no worker is still inside the batch
// (active_ == 0), and unpublishes it in the same critical section.
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "io/reader.h"

namespace moetier::io {

namespace {

class PoolReader final : public Reader {
 public:
  explicit PoolReader(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
  }
  ~PoolReader() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  std::string name() const override {
    return fmt::format("pread pool ({} threads)", workers_.size() + 1);
  }

 protected:
  void read_batch(std::span<ReadRequest> reqs) override {
    {
      std::lock_guard lock(mu_);
      batch_ = reqs;
      next_.store(0);
      done_ = 0;
      ++gen_;
    }
    work_cv_.notify_all();
    work(reqs);
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_ == reqs.size() && active_ == 0; });
    batch_ = {};
  }

 private:
  void work(std::span<ReadRequest> reqs) {
    for (;;) {
      size_t i = next_.fetch_add(1);
      if (i >= reqs.size()) return;
      ReadRequest& r = reqs[i];
      AlignedSpan s = r.span();
      int err = 0;
      // Direct files need aligned lengths; buffered ones read just the bytes wanted.
      uint64_t len = r.file->direct() ? s.length : s.head + r.length;
      r.got = r.file->read_at(s.offset, len, r.dst, &err);
      r.err = err;
      finish(r);
      std::lock_guard lock(mu_);
      ++done_;
    }
  }

  void worker() {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
      // No batch in progress: read_batch already returned (it had done the
      // batch alone). Joining now would claim, through next_, a request of the
      // next batch and skip it, and that read_batch would wait forever.
      if (batch_.empty()) continue;
      std::span<ReadRequest> reqs = batch_;
      ++active_;
      lock.unlock();
      work(reqs);
      lock.lock();
      --active_;
      if (active_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::span<ReadRequest> batch_;  // guarded by mu_
  std::atomic<size_t> next_{0};
  size_t done_ = 0;    // guarded by mu_
  int active_ = 0;     // workers inside the batch; guarded by mu_
  uint64_t gen_ = 0;   // guarded by mu_
  bool stop_ = false;  // guarded by mu_
};

}  // namespace

std::unique_ptr<Reader> make_pool_reader(int threads) {
  return std::make_unique<PoolReader>(threads < 1 ? 1 : threads);
}

}  // namespace moetier::io
