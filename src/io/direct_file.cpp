#include "io/direct_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/fault.h"

namespace moetier::io {

std::unique_ptr<DirectFile> DirectFile::open(const std::filesystem::path& path, bool direct) {
  std::unique_ptr<DirectFile> f(new DirectFile());
  f->path_ = path;
  f->buffered_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(f->buffered_fd_ >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  const bool stated = ::fstat(f->buffered_fd_, &st) == 0;
  const int err = errno;  // (before the arguments below are evaluated)
  check(stated, "{}: cannot stat: {}", path.string(), std::strerror(err));
  check(S_ISREG(st.st_mode), "{}: not a regular file", path.string());
  f->size_ = uint64_t(st.st_size);
  if (!direct) return f;
  if (FaultInjector::global().refuse_direct(path)) {
    f->open_refusal_ = "open(O_DIRECT) refused (injected EINVAL)";
  } else {
    f->direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (f->direct_fd_ < 0) {
      check(errno == EINVAL, "{}: cannot open with O_DIRECT: {}", path.string(),
            std::strerror(errno));
      f->open_refusal_ = "the file system refuses O_DIRECT (EINVAL)";
    }
  }
  if (f->direct_fd_ >= 0) {
    f->direct_.store(true);
  } else {
    f->fallbacks_.store(1);
  }
  return f;
}

DirectFile::~DirectFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

std::string DirectFile::fallback_reason() const {
  if (fallbacks() == 0) return {};
  if (!open_refusal_.empty()) return open_refusal_;
  return "a direct read was refused (EINVAL)";
}

int DirectFile::fd() const { return direct() ? direct_fd_ : buffered_fd_; }

int DirectFile::refuse_direct_read() {
  bool was = direct_.exchange(false);
  if (was) fallbacks_.store(1);
  return buffered_fd_;
}

uint64_t DirectFile::read_at(uint64_t offset, uint64_t length, std::byte* dst, int* err) {
  *err = 0;
  uint64_t got = 0;
  int fd_now = fd();
  while (got < length) {
    ssize_t n = ::pread(fd_now, dst + got, length - got, off_t(offset + got));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL && fd_now == direct_fd_) {
        fd_now = refuse_direct_read();
        continue;
      }
      *err = errno;
      return got;
    }
    if (n == 0) break;  // EOF
    got += uint64_t(n);
    // A direct read that stopped short of a block boundary hit EOF.
    if (fd_now == direct_fd_ && got % kAlign != 0) break;
  }
  return got;
}

}  // namespace moetier::io
