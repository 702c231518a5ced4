// Workspace: device scratch for one sequence's forward passes (activations),
// allocated through the Backend and reused: get(slot, n) returns at least n
// floats for a numbered slot, growing it when needed. Contents are not kept
// across calls that grow a slot. One caller (the sequence's thread).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace moetier {

class Workspace {
 public:
  explicit Workspace(Backend& be) : be_(&be) {}
  float* get(size_t slot, int64_t floats);
  int32_t* get_i32(size_t slot, int64_t n) { return reinterpret_cast<int32_t*>(get(slot, n)); }
  uint64_t bytes() const;

 private:
  Backend* be_;
  std::vector<DeviceBuffer> slots_;
};

}  // namespace moetier
