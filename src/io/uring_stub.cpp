// Built instead of uring_reader.cpp when liburing is not found.
#include "io/reader.h"

namespace moetier::io {

bool built_with_uring() { return false; }

std::unique_ptr<Reader> make_uring_reader(int, std::string* why) {
  if (why) *why = "moetier was built without liburing";
  return nullptr;
}

}  // namespace moetier::io
