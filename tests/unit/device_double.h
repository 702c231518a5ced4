// A test double of a device backend on the CPU: it computes with the CPU
// backend but reports is_host() == false, and its "device" pointers are host
// addresses with bit 62 set, which no CPU can dereference (a non-canonical
// address faults; a read() into one fails with EFAULT). So the only ways bytes
// move between host and "device" memory are to_device / to_host / copy and
// the ops, exactly as on a GPU: code that touches device memory from the host
// crashes or fails instead of silently working. Device buffers are filled with
// a poison pattern (0xff: NaN in bf16/f32, a NaN e8m0 scale) on alloc, so a
// slot used before its bytes were copied in gives NaN logits.
//
// Every op checks that the pointers it gets are device pointers (or null).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace moetier::testing {

class DeviceDouble final : public Backend {
 public:
  DeviceDouble() : cpu_(make_cpu_backend()) {}

  static constexpr uintptr_t kTag = uintptr_t(1) << 62;
  static bool is_device(const void* p) { return (uintptr_t(p) & kTag) != 0; }
  template <typename T>
  static T* host(T* p) {  // the real address behind a device pointer
    if (!p) return p;
    check(is_device(p), "device double: a host pointer was passed as a device pointer");
    return reinterpret_cast<T*>(uintptr_t(p) & ~kTag);
  }
  template <typename T>
  static T* device(T* p) {
    return reinterpret_cast<T*>(uintptr_t(p) | kTag);
  }
  static MatView host(const MatView& m) {
    MatView h = m;
    h.data = host(m.data);
    h.scales = host(m.scales);
    return h;
  }

  uint64_t device_bytes_alloced() const { return device_bytes_; }
  uint64_t to_device_bytes() const { return to_device_bytes_; }

  std::string name() const override { return "device-double"; }
  bool is_host() const override { return false; }
  uint64_t device_memory() const override { return cpu_->device_memory(); }

  DeviceBuffer alloc(size_t bytes) override {
    const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    void* p = std::aligned_alloc(4096, rounded);
    check(p != nullptr, "device double: cannot allocate {} bytes", bytes);
    std::memset(p, 0xff, rounded);  // poison
    device_bytes_ += bytes;
    return DeviceBuffer(this, device(p), bytes);
  }
  DeviceBuffer alloc_host(size_t bytes) override {
    const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    void* p = std::aligned_alloc(4096, rounded);
    check(p != nullptr, "device double: cannot allocate {} host bytes", bytes);
    return DeviceBuffer(this, p, bytes);
  }
  void release(void* p, size_t) override { std::free(is_device(p) ? host(p) : p); }
  void to_device(void* dst, const void* src, size_t n) override {
    check(!is_device(src), "device double: to_device from a device pointer");
    std::memcpy(host(dst), src, n);
    to_device_bytes_ += n;
  }
  void to_host(void* dst, const void* src, size_t n) override {
    check(!is_device(dst), "device double: to_host into a device pointer");
    std::memcpy(dst, host(src), n);
  }
  void copy(void* dst, const void* src, size_t n) override {
    std::memmove(host(dst), host(src), n);
  }
  void fill_zero(float* x, int64_t n) override { cpu_->fill_zero(host(x), n); }
  void synchronize() override {}

  MatView weights(const MatView& h, WeightStore& store) override {
    MatView d = h;
    d.data = upload(h.data, data_bytes(h), store);
    if (h.scales) d.scales = static_cast<const uint8_t*>(upload(h.scales, scale_bytes(h), store));
    return d;
  }
  const float* vector(std::span<const float> h, WeightStore& store) override {
    return static_cast<const float*>(upload(h.data(), h.size_bytes(), store));
  }

  void embed(const MatView& table, std::span<const int32_t> tokens, float* out) override {
    cpu_->embed(host(table), tokens, host(out));
  }
  void matmul(const MatView& w, const float* x, int64_t n, float* y) override {
    cpu_->matmul(host(w), host(x), n, host(y));
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    cpu_->rmsnorm(host(x), host(w), n, dim, eps, host(y));
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0,
            const float* inv_freq) override {
    cpu_->rope(host(x), n, heads, hd, pos0, host(inv_freq));
  }
  void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
                 int64_t heads, int64_t kv_heads, int64_t hd, float scale, float* out) override {
    cpu_->attention(host(q), host(k), host(v), n_q, first_pos, heads, kv_heads, hd, scale,
                    host(out));
  }
  void add(float* x, const float* y, int64_t n) override { cpu_->add(host(x), host(y), n); }
  void add_rows(float* y, const float* b, int64_t n, int64_t dim) override {
    cpu_->add_rows(host(y), host(b), n, dim);
  }
  void silu_mul(float* g, const float* u, int64_t n) override {
    cpu_->silu_mul(host(g), host(u), n);
  }
  void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                    float* probs, int32_t* ids, float* weights) override {
    cpu_->softmax_topk(host(logits), n, e, k, renormalize, host(probs), host(ids), host(weights));
  }
  // Resident expert tables (the mapped host tier): entries are device views,
  // or host views into alloc_host memory when maps_host (reads_host_memory).
  bool maps_host = false;
  // Overlapped copies (to_device_async) land late: a copy is done at the
  // first copy_done() after the second update_experts() call that follows it
  // (the next step but one, as the mapped host tier calls them; or at
  // wait_copies).
  bool lazy_copies = false;
  uint64_t async_copy_bytes() const { return async_bytes_; }
  uint64_t moe_resident_calls = 0;
  uint64_t async_copies = 0;  // to_device_async calls

  bool reads_host_memory() const override { return maps_host; }
  int register_experts(std::span<const ExpertView> views) override {
    tables_.emplace_back(views.begin(), views.end());
    return int(tables_.size() - 1);
  }
  void update_experts(std::span<const ExpertTableEntry> entries) override {
    ++clock_;  // the lazy copies' clock: one tick per device step
    for (const ExpertTableEntry& e : entries) {
      check(e.table >= 0 && size_t(e.table) < tables_.size(), "device double: table {}", e.table);
      check(e.id >= 0 && size_t(e.id) < tables_[size_t(e.table)].size(), "device double: entry {}",
            e.id);
      tables_[size_t(e.table)][size_t(e.id)] = e.view;
    }
  }
  void moe_resident(int table, const int32_t* ids, const float* weights, int64_t k, const float* x,
                    int64_t hidden, int64_t intermediate, float* out) override {
    check(table >= 0 && size_t(table) < tables_.size(), "device double: table {}", table);
    ++moe_resident_calls;
    std::vector<int32_t> id(host(ids), host(ids) + k);
    std::vector<float> w(host(weights), host(weights) + k);
    std::vector<size_t> order(size_t(k), 0);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return id[a] < id[b]; });
    std::vector<ExpertView> views;  // ascending id: the runtime's order
    std::vector<int64_t> offsets{0}, tokens;
    std::vector<float> ws;
    for (size_t i : order) {
      const ExpertView& v = tables_[size_t(table)].at(size_t(id[i]));
      views.push_back({readable(v.gate), readable(v.up), readable(v.down)});
      offsets.push_back(offsets.back() + 1), tokens.push_back(0), ws.push_back(w[i]);
    }
    cpu_->fill_zero(host(out), hidden);
    ExpertBatch b;
    b.experts = views;
    b.offsets = offsets;
    b.tokens = tokens;
    b.weights = ws;
    b.x = host(x);
    b.n = 1, b.hidden = hidden, b.intermediate = intermediate;
    b.out = host(out);
    cpu_->expert_batch(b);
  }
  uint64_t to_device_async(void* dst, const void* src, size_t n) override {
    check(!is_device(src), "device double: to_device_async from a device pointer");
    async_bytes_ += n;
    ++async_copies;
    if (!lazy_copies) return to_device(dst, src, n), 0;
    pending_.push_back({dst, src, n, ++issued_, clock_});
    return issued_;
  }
  bool copy_done(uint64_t c) override {
    size_t i = 0;  // land, in order, the copies issued before the last table update
    for (; i < pending_.size() && pending_[i].clock < clock_; ++i)
      to_device(pending_[i].dst, pending_[i].src, pending_[i].n), landed_ = pending_[i].id;
    pending_.erase(pending_.begin(), pending_.begin() + int64_t(i));
    return c <= landed_;
  }
  void wait_copies() override {
    for (const Pending& p : pending_) to_device(p.dst, p.src, p.n), landed_ = p.id;
    pending_.clear();
  }

  void expert_batch(const ExpertBatch& b) override {
    std::vector<ExpertView> views;  // [m] host views of the device experts
    for (const ExpertView& v : b.experts) views.push_back({host(v.gate), host(v.up), host(v.down)});
    ExpertBatch h = b;
    h.experts = views;
    h.x = host(b.x);
    h.out = host(b.out);
    cpu_->expert_batch(h);
  }

 private:
  static uint64_t data_bytes(const MatView& m) {
    switch (m.enc) {
      case WeightEncoding::F32:
        return uint64_t(m.rows * m.cols) * 4;
      case WeightEncoding::BF16:
        return uint64_t(m.rows * m.cols) * 2;
      case WeightEncoding::MXFP4:
        return uint64_t(m.rows * m.cols) / 2;
      case WeightEncoding::CB3:
        return uint64_t(m.rows * ((3 * m.cols + 7) / 8));
    }
    return 0;
  }
  static uint64_t scale_bytes(const MatView& m) {
    return m.enc == WeightEncoding::CB3 ? uint64_t(m.rows) * 16 : uint64_t(m.rows * m.cols) / 32;
  }
  const void* upload(const void* h, size_t n, WeightStore& store) {
    store.buffers.push_back(alloc(n));
    to_device(store.buffers.back().data(), h, n);
    return store.buffers.back().data();
  }

  MatView readable(const MatView& m) const {  // a table entry's host view
    if (is_device(m.data)) return host(m);
    check(maps_host, "device double: a host pointer in an expert table");
    return m;
  }
  struct Pending {
    void* dst;
    const void* src;
    size_t n;
    uint64_t id, clock;
  };

  std::unique_ptr<Backend> cpu_;
  uint64_t device_bytes_ = 0, to_device_bytes_ = 0, async_bytes_ = 0;
  std::vector<std::vector<ExpertView>> tables_;
  std::vector<Pending> pending_;  // oldest first
  uint64_t issued_ = 0, landed_ = 0, clock_ = 0;
};

}  // namespace moetier::testing
