#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

namespace moetier {
namespace {

constexpr int kBarWidth = 24;
constexpr double kRedrawS = 0.1;

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Progress::Progress(std::string what, int64_t total, std::FILE* out, std::optional<bool> tty)
    : what_(std::move(what)),
      total_(total),
      out_(out),
      tty_(tty.value_or(::isatty(::fileno(out)) == 1)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  if (tty_ && drawn_ && !finished_) {  // an error is on its way: give it a line of its own
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

std::string Progress::count(int64_t done) const {
  if (total_ <= 0) return std::to_string(done);
  return std::to_string(done) + "/" + std::to_string(total_);
}

std::string Progress::bar(int64_t done, std::string_view detail) const {
  std::string s;
  if (total_ > 0) {
    const double f = std::clamp(double(done) / double(total_), 0.0, 1.0);
    const int fill = int(f * kBarWidth + 0.5);
    s = "[" + std::string(size_t(fill), '#') + std::string(size_t(kBarWidth - fill), '.') + "] ";
    s += count(done) + " " + std::to_string(int(f * 100)) + "%";
  } else {
    s = count(done);
  }
  if (!detail.empty()) s += " " + std::string(detail);
  return s;
}

void Progress::update(int64_t done, std::string_view detail) {
  if (finished_) return;
  done_ = done;
  detail_ = detail;
  if (tty_) {
    const bool last = total_ > 0 && done >= total_;
    if (drawn_ && !last && since(last_draw_) < kRedrawS) return;
    // \r and erase-to-end-of-line: a shorter redraw leaves nothing behind.
    std::fprintf(out_, "\rmoetier: %s %s\x1b[K", what_.c_str(), bar(done, detail).c_str());
    std::fflush(out_);
    drawn_ = true;
    last_draw_ = std::chrono::steady_clock::now();
    return;
  }
  const int tenth = total_ > 0 ? int(std::min<int64_t>(10, done * 10 / total_)) : -1;
  if (done <= 0 || (total_ > 10 && tenth == last_tenth_)) return;
  last_tenth_ = tenth;
  std::string line = "moetier: " + what_ + ": " + count(done);
  if (total_ > 0) line += " (" + std::to_string(int(100 * done / total_)) + "%)";
  if (!detail.empty()) line += " " + std::string(detail);
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::note(std::string_view line) {
  if (tty_ && drawn_) std::fputs("\r\x1b[K", out_);
  std::fprintf(out_, "%.*s\n", int(line.size()), line.data());
  if (tty_ && drawn_ && !finished_)
    std::fprintf(out_, "moetier: %s %s\x1b[K", what_.c_str(), bar(done_, detail_).c_str());
  std::fflush(out_);
}

void Progress::finish(std::string_view summary) {
  if (finished_) return;
  finished_ = true;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", since(start_));
  const std::string text = summary.empty()
                               ? "done, " + count(done_) + " in " + std::string(secs) + " s"
                               : std::string(summary);
  if (tty_)
    std::fprintf(out_, "\rmoetier: %s: %s\x1b[K\n", what_.c_str(), text.c_str());
  else
    std::fprintf(out_, "moetier: %s: %s\n", what_.c_str(), text.c_str());
  std::fflush(out_);
}

}  // namespace moetier
