#include "runtime/kv_cache.h"

#include "core/error.h"

namespace moetier {

KvCache::KvCache(Backend& be, int64_t layers, int64_t capacity, int64_t kv_heads, int64_t head_dim)
    : layers_(layers), capacity_(capacity), kv_heads_(kv_heads), head_dim_(head_dim) {
  check(layers > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0,
        "kv cache: bad shape layers {} capacity {} kv_heads {} head_dim {}", layers, capacity,
        kv_heads, head_dim);
  const size_t n = static_cast<size_t>(layers * capacity * kv_heads * head_dim);
  k_ = be.alloc(n * sizeof(float));
  v_ = be.alloc(n * sizeof(float));
}

void KvCache::set_size(int64_t n) {
  check(n >= 0 && n <= capacity_, "kv cache: size {} outside capacity {}", n, capacity_);
  size_ = n;
}

}  // namespace moetier
