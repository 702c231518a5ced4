// Progress of a long command (bench, trace, repack, prune, eval, model load)
// on stderr. On a terminal (isatty(stderr)) one bar redrawn in place,
//   moetier: trace [##########..........] 512/1024 50% corpus.txt
// at most every 0.1 s, and a last redraw ending the line at finish(); elsewhere
// (a log, CI) plain lines, one at each tenth of the total that is crossed (each
// step when the total is 10 or less; none for 0 done) and one at finish():
//   moetier: trace: 512/1024 (50%) corpus.txt
//   moetier: trace: done, 1024/1024 in 3.2 s
// An error message printed while a bar is drawn starts on a line of its own
// (the destructor ends an unfinished bar's line), so stderr still ends with
// the one-line error. Single-threaded: one thread calls update().
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace moetier {

class Progress {
 public:
  // `what` names the work ("trace", "eval code"); `total` steps (> 0; 0 or
  // less: an unknown total, counted without a bar or percentage). `tty`
  // overrides isatty(fileno(out)) (tests).
  Progress(std::string what, int64_t total, std::FILE* out = stderr,
           std::optional<bool> tty = std::nullopt);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` steps of the total are finished; `detail` is shown after the count.
  void update(int64_t done, std::string_view detail = {});
  // The last line: "done, N/T in S s" (or `summary` when given). Idempotent.
  void finish(std::string_view summary = {});
  // A line of its own (a run's result): above the bar on a terminal, which is
  // then redrawn; as it is elsewhere.
  void note(std::string_view line);

  bool tty() const { return tty_; }
  // The bar text of a redraw (exposed for tests): "[###...] 3/10 30% detail".
  std::string bar(int64_t done, std::string_view detail) const;

 private:
  std::string count(int64_t done) const;

  std::string what_;
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  bool drawn_ = false, finished_ = false;
  int64_t done_ = 0;
  std::string detail_;
  int last_tenth_ = 0;  // plain lines: the last tenth printed
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace moetier
