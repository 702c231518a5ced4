// Aligned host buffers (4 KiB by default, for O_DIRECT reads).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

namespace moetier {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, size_t align = 4096) { reset(bytes, align); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(p_); }

  void reset(size_t bytes, size_t align = 4096) {
    std::free(p_);
    n_ = bytes;
    size_t rounded = (bytes + align - 1) / align * align;
    p_ = rounded ? std::aligned_alloc(align, rounded) : nullptr;
    if (rounded && !p_) throw std::bad_alloc();
  }
  void* data() { return p_; }
  const void* data() const { return p_; }
  template <typename T>
  T* as() { return static_cast<T*>(p_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace moetier
