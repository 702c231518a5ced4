#include "runtime/workspace.h"

namespace moetier {

float* Workspace::get(size_t slot, int64_t floats) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  const size_t want = size_t(floats > 0 ? floats : 1) * sizeof(float);
  DeviceBuffer& b = slots_[slot];
  if (b.bytes() < want) b = be_->alloc(want + want / 4);  // headroom for the next chunk
  return b.as<float>();
}

uint64_t Workspace::bytes() const {
  uint64_t n = 0;
  for (const auto& b : slots_) n += b.bytes();
  return n;
}

}  // namespace moetier
