#include "io/fault.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moetier::io {

namespace {

uint64_t parse_u64(std::string_view v, std::string_view text) {
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  check(ec == std::errc() && p == v.data() + v.size(), "MOETIER_FAULT '{}': '{}' is not a number",
        text, v);
  return x;
}

FaultKind parse_kind(std::string_view k, std::string_view text) {
  for (auto kind : {FaultKind::ShortRead, FaultKind::Eio, FaultKind::Truncate, FaultKind::Corrupt,
                    FaultKind::RefuseDirect}) {
    if (k == fault_kind_name(kind)) return kind;
  }
  fail("MOETIER_FAULT '{}': unknown kind '{}' (short, eio, truncate, corrupt, refuse-direct)", text,
       k);
}

}  // namespace

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::ShortRead:
      return "short";
    case FaultKind::Eio:
      return "eio";
    case FaultKind::Truncate:
      return "truncate";
    case FaultKind::Corrupt:
      return "corrupt";
    case FaultKind::RefuseDirect:
      return "refuse-direct";
  }
  return "?";
}

FaultSpec parse_fault_spec(std::string_view text) {
  FaultSpec s;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t end = text.find(':', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    if (first) {
      s.kind = parse_kind(part, text);
      first = false;
    } else {
      size_t eq = part.find('=');
      check(eq != std::string_view::npos, "MOETIER_FAULT '{}': '{}' is not key=value", text, part);
      std::string_view key = part.substr(0, eq), val = part.substr(eq + 1);
      if (key == "path")
        s.path_contains = std::string(val);
      else if (key == "skip")
        s.skip = parse_u64(val, text);
      else if (key == "count")
        s.count = parse_u64(val, text);
      else if (key == "size")
        s.size = parse_u64(val, text);
      else
        fail("MOETIER_FAULT '{}': unknown key '{}' (path, skip, count, size)", text, key);
    }
    pos = end + 1;
  }
  return s;
}

FaultInjector& FaultInjector::global() {
  static FaultInjector* g = [] {
    auto* f = new FaultInjector();
    if (const char* env = std::getenv("MOETIER_FAULT"); env && *env) {
      f->arm(parse_fault_spec(env));
    }
    return f;
  }();
  return *g;
}

void FaultInjector::arm(const FaultSpec& spec) {
  std::lock_guard lock(mu_);
  spec_ = spec;
  seen_ = 0;
  fired_ = 0;
}

void FaultInjector::disarm() {
  std::lock_guard lock(mu_);
  spec_.reset();
}

bool FaultInjector::armed() const {
  std::lock_guard lock(mu_);
  return spec_.has_value();
}

uint64_t FaultInjector::fired() const {
  std::lock_guard lock(mu_);
  return fired_;
}

bool FaultInjector::take(const std::filesystem::path& path, FaultKind kind) {
  if (!spec_ || spec_->kind != kind) return false;
  if (spec_->count != 0 && fired_ >= spec_->count) return false;
  if (!spec_->path_contains.empty() &&
      path.string().find(spec_->path_contains) == std::string::npos) {
    return false;
  }
  if (seen_++ < spec_->skip) return false;
  ++fired_;
  return true;
}

void FaultInjector::apply(const std::filesystem::path& path, ReadOutcome& r) {
  std::unique_lock lock(mu_);
  if (!spec_ || spec_->kind == FaultKind::RefuseDirect) return;
  FaultKind kind = spec_->kind;
  uint64_t size = spec_->size;
  if (!take(path, kind)) return;
  lock.unlock();
  switch (kind) {
    case FaultKind::ShortRead:
      r.got = std::min(r.got, r.need / 2);
      break;
    case FaultKind::Eio:
      r.err = EIO;
      r.got = 0;
      break;
    case FaultKind::Truncate:
      r.got = size <= r.file_offset ? 0 : std::min(r.got, size - r.file_offset);
      break;
    case FaultKind::Corrupt:
      if (r.need > r.head) std::memset(r.dst + r.head, 0xff, r.need - r.head);
      break;
    case FaultKind::RefuseDirect:
      break;
  }
}

bool FaultInjector::refuse_direct(const std::filesystem::path& path) {
  std::lock_guard lock(mu_);
  return take(path, FaultKind::RefuseDirect);
}

}  // namespace moetier::io
