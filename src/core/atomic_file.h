// Files and directories that appear whole or not at all (DESIGN.md: derived
// checkpoints, traces and reports are written atomically).
//
// A file is written to NAME.tmp.PID, fsynced, renamed over NAME, and the
// parent directory is fsynced. A directory is built in DIR.tmp-XXXXXX and
// renamed to DIR on commit (DIR must not exist yet). Either is removed if
// destroyed before commit(), so an error or an exception leaves nothing
// half-written under the final name.
//
// Not thread-safe: one writer per object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace moetier {

// A file written to PATH.tmp.PID and renamed to PATH by commit(); removed
// if destroyed before commit().
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);
  void write_zeros(uint64_t n);
  uint64_t written() const { return written_; }
  // fsync, close, rename over the final path, fsync the directory.
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// A directory built at DIR.tmp-XXXXXX and renamed to DIR by commit(); removed
// (recursively) if destroyed before commit().
class AtomicDir {
 public:
  explicit AtomicDir(std::filesystem::path final_path);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::filesystem::path& path() const { return tmp_; }  // write files here
  void commit();                                              // throws if DIR exists

 private:
  std::filesystem::path final_, tmp_;
  bool committed_ = false;
};

// PATH holds exactly `bytes` afterwards, or (on Error) is unchanged.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

}  // namespace moetier
