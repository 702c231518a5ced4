// KV cache for one sequence, in device memory (through the Backend): f32, per
// layer [capacity, kv_heads, head_dim] for keys and for values (keys stored
// after the architecture's key normalization and RoPE).
//
// size() is the number of valid positions. A forward pass over positions
// [start, start + n) requires start <= size() (start < size() rewinds: later
// positions are overwritten) and start + n <= capacity(); it then sets
// size() = start + n. Not thread-safe: one sequence, one caller.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace moetier {

class KvCache {
 public:
  KvCache(Backend& be, int64_t layers, int64_t capacity, int64_t kv_heads, int64_t head_dim);

  int64_t layers() const { return layers_; }
  int64_t capacity() const { return capacity_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t size() const { return size_; }
  void set_size(int64_t n);
  void clear() { size_ = 0; }
  uint64_t bytes() const { return k_.bytes() + v_.bytes(); }

  // [capacity, kv_heads, head_dim] of `layer`, device memory.
  float* keys(int64_t layer) const { return k_.as<float>() + layer * layer_floats(); }
  float* values(int64_t layer) const { return v_.as<float>() + layer * layer_floats(); }

 private:
  int64_t layer_floats() const { return capacity_ * kv_heads_ * head_dim_; }
  int64_t layers_, capacity_, kv_heads_, head_dim_;
  int64_t size_ = 0;
  DeviceBuffer k_, v_;  // [layers][capacity, kv_heads, head_dim]
};

}  // namespace moetier
