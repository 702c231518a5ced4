// moetier errors: one-line messages that name the file and the tensor or field.
//
// Convention: library code throws moetier::Error with a complete one-line
// message ("FILE: tensor 'X': shape [..] needs N bytes, range holds M");
// tools catch it at main(), print "moetier: error: <message>" and exit 1.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moetier {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// check(cond, "fmt", args...): throws Error when cond is false.
template <typename... Args>
void check(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moetier
