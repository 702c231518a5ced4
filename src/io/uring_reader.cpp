// The io_uring reader (compiled only when liburing is found). One ring per
// reader, used only by the caller thread: read_batch() keeps up to `depth`
// reads in flight, resubmits the rest of a partial read, and retries a direct
// read the kernel refused (EINVAL) on the file's buffered descriptor.
#include <fmt/format.h>
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "core/error.h"
#include "io/reader.h"

namespace moetier::io {

namespace {

class UringReader final : public Reader {
 public:
  UringReader(io_uring ring, int depth) : ring_(ring), depth_(depth) {}
  ~UringReader() override { io_uring_queue_exit(&ring_); }
  std::string name() const override { return fmt::format("io_uring (depth {})", depth_); }

 protected:
  void read_batch(std::span<ReadRequest> reqs) override {
    std::vector<uint64_t> want(reqs.size());  // [n] bytes to read from the aligned start
    std::deque<size_t> pending;
    for (size_t i = 0; i < reqs.size(); ++i) {
      AlignedSpan s = reqs[i].span();
      want[i] = reqs[i].file->direct() ? s.length : s.head + reqs[i].length;
      pending.push_back(i);
    }
    int inflight = 0;
    int broken = 0;  // errno of a failed io_uring_submit_and_wait: stop submitting
    while ((!pending.empty() && !broken) || inflight > 0) {
      while (!broken && inflight < depth_ && !pending.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;  // submit what is queued first
        size_t i = pending.front();
        pending.pop_front();
        ReadRequest& r = reqs[i];
        io_uring_prep_read(sqe, r.file->fd(), r.dst + r.got, unsigned(want[i] - r.got),
                           r.span().offset + r.got);
        io_uring_sqe_set_data64(sqe, i);
        ++inflight;
      }
      int rc = broken ? io_uring_wait_cqe(&ring_, nullptr) : io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) broken = -rc;
      reap(reqs, want, pending, inflight);
    }
    // Requests never submitted (the ring broke) fail with its errno; no read is
    // in flight any more, so no buffer is written after this returns.
    for (size_t i : pending) {
      reqs[i].err = broken;
      finish(reqs[i]);
    }
  }

  // Folds every available completion in; unfinished reads go back to pending.
  void reap(std::span<ReadRequest> reqs, const std::vector<uint64_t>& want,
            std::deque<size_t>& pending, int& inflight) {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      size_t i = io_uring_cqe_get_data64(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --inflight;
      if (complete(reqs[i], want[i], res)) {
        finish(reqs[i]);
      } else {
        pending.push_back(i);
      }
    }
  }

 private:
  // Folds one completion into r; true when r is finished.
  static bool complete(ReadRequest& r, uint64_t want, int res) {
    if (res == -EINTR || res == -EAGAIN) return false;
    if (res == -EINVAL && r.file->direct()) {
      r.file->refuse_direct_read();
      return false;
    }
    if (res < 0) {
      r.err = -res;
      return true;
    }
    if (res == 0) return true;  // EOF
    r.got += uint64_t(res);
    if (r.got >= want) return true;
    return r.file->direct() && r.got % kAlign != 0;  // stopped at EOF
  }

  io_uring ring_;
  int depth_;
};

}  // namespace

bool built_with_uring() { return true; }

std::unique_ptr<Reader> make_uring_reader(int depth, std::string* why) {
  if (depth < 1) depth = 1;
  io_uring ring;
  int rc = io_uring_queue_init(unsigned(depth), &ring, 0);
  if (rc < 0) {
    if (why) *why = fmt::format("io_uring_queue_init: {}", std::strerror(-rc));
    return nullptr;
  }
  return std::make_unique<UringReader>(ring, depth);
}

}  // namespace moetier::io
