// AtomicFile, AtomicDir, write_file_atomic (core/atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moetier {

namespace {

void fsync_dir(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  tmp_ = path_;
  tmp_ += fmt::format(".tmp.{}", ::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd_ >= 0, "{}: cannot create: {}", tmp_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  check(fd_ >= 0, "{}: write after commit", path_.string());
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(left, 1u << 30));
    if (n < 0 && errno == EINTR) continue;
    check(n > 0, "{}: write failed: {}", tmp_.string(), std::strerror(errno));
    p += n;
    left -= size_t(n);
  }
  written_ += bytes.size();
}

void AtomicFile::write(std::string_view text) {
  write(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void AtomicFile::write_zeros(uint64_t n) {
  static const std::byte kZeros[65536] = {};
  while (n > 0) {
    uint64_t k = std::min<uint64_t>(n, sizeof(kZeros));
    write(std::span<const std::byte>(kZeros, k));
    n -= k;
  }
}

void AtomicFile::commit() {
  check(fd_ >= 0, "{}: committed twice", path_.string());
  int rc = ::fsync(fd_);
  int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (rc != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    if (rc == 0) err = errno;
    ::unlink(tmp_.c_str());
    fail("{}: cannot write: {}", path_.string(), std::strerror(err));
  }
  fsync_dir(path_.parent_path());
}

AtomicDir::AtomicDir(std::filesystem::path final_path) : final_(std::move(final_path)) {
  std::error_code
      ec;  // refused now, not after the work (commit checks again); a link, even dangling
  check(!std::filesystem::exists(std::filesystem::symlink_status(final_, ec)), "{}: already exists",
        final_.string());
  std::string templ = final_.string() + ".tmp-XXXXXX";
  const bool made = ::mkdtemp(templ.data()) != nullptr;
  const int err = errno;  // (before the arguments below are evaluated)
  check(made, "{}: cannot create: {}", templ, std::strerror(err));
  tmp_ = templ;
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(tmp_, ec);
}

void AtomicDir::commit() {
  check(!committed_, "{}: committed twice", final_.string());
  std::error_code ec;
  check(!std::filesystem::exists(std::filesystem::symlink_status(final_, ec)), "{}: already exists",
        final_.string());
  fsync_dir(tmp_);
  const bool renamed = ::rename(tmp_.c_str(), final_.c_str()) == 0;
  const int err = errno;
  check(renamed, "{}: cannot rename from {}: {}", final_.string(), tmp_.string(),
        std::strerror(err));
  committed_ = true;
  fsync_dir(final_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

}  // namespace moetier
