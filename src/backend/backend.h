// Backend: device memory and the ops a forward pass needs. The runtime's
// forwards (runtime/<arch>/) are written against this seam only; `cpu`
// (backend/cpu/, the kernels of kernels/cpu) is the first implementation,
// `cuda` (backend/cuda/) the second; a CPU-only build links backend/no_cuda/.
//
// Protocol:
//   - Pointers given to ops are device pointers (on `cpu` they are host
//     pointers, and is_host() is true). Activations are f32.
//   - Ops are issued in program order on the backend's one stream and may
//     run asynchronously; to_host() and synchronize() wait for everything
//     issued before them. Host spans given to an op (token ids, expert groups)
//     are read before the op returns.
//   - Weights become usable through weights()/vector(): on `cpu` the host view
//     (the checkpoint's mmap) is used in place; elsewhere the bytes are copied
//     into device memory owned by the WeightStore, which must outlive them.
//   - One thread issues a backend's ops at a time (a Session's thread). Memory
//     (DeviceBuffer) may be freed from any thread once its ops are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace moetier {

class Backend;

// Device memory, owned; move-only. Freed through the backend that made it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* p, size_t bytes) : owner_(owner), p_(p), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset();
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  Backend* owner_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Device copies of weights made by Backend::weights()/vector().
struct WeightStore {
  std::vector<DeviceBuffer> buffers;
  uint64_t bytes() const;
};

// One expert batch: experts[i] runs on its tokens pairs [offsets[i],
// offsets[i+1]): out[tokens[p]] += weights[p] * down(silu(gate x) * up x),
// x = rows of x [n, hidden]. Per token, contributions are added in the order
// of i (the runtime passes experts in ascending id order).
struct ExpertBatch {
  std::span<const ExpertView> experts;  // [m] device views
  std::span<const int64_t> offsets;     // [m + 1] host
  std::span<const int64_t> tokens;      // [pairs] host: row of x / out
  std::span<const float> weights;       // [pairs] host: routing weight
  const float* x = nullptr;             // [n, hidden] device
  int64_t n = 0, hidden = 0, intermediate = 0;
  float* out = nullptr;  // [n, hidden] device, accumulated into
};

// Device memory a backend holds through alloc() (not alloc_host()): the bytes
// allocated now and the most allocated at once since the backend was made or
// since the last reset_peak(). Thread-safe (buffers may be freed from any
// thread). Backends that count keep one and report it from memory_use().
struct DeviceMemoryUse {
  uint64_t now = 0, peak = 0;
};

class DeviceMemoryCounter {
 public:
  void on_alloc(const void* p, size_t bytes);
  // Returns false (and counts nothing) for a pointer on_alloc never saw
  // (alloc_host's buffers, where one release() frees both kinds).
  bool on_release(const void* p);
  DeviceMemoryUse use() const;
  void reset_peak();  // peak = now

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, size_t> live_;
  DeviceMemoryUse use_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;        // "cpu", "cuda:0 (NVIDIA H200)"
  virtual bool is_host() const = 0;            // device pointers are host pointers
  virtual uint64_t device_memory() const = 0;  // bytes (cpu: MemTotal)

  // Memory. alloc throws Error naming the size when it cannot; release is
  // DeviceBuffer's (it waits for the ops that may still use the memory).
  virtual DeviceBuffer alloc(size_t bytes) = 0;
  // Host memory the device copies from fastest (CUDA: pinned; cpu: 4 KiB
  // aligned, usable for O_DIRECT reads on both), owned like alloc.
  virtual DeviceBuffer alloc_host(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;  // waits
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;     // device to device
  virtual void fill_zero(float* x, int64_t n) = 0;
  virtual void synchronize() = 0;
  // Device memory allocated through alloc(), now and at peak (above); nullopt
  // for a backend that does not count. reset_memory_peak() starts a new peak
  // (the bench does, before each run).
  virtual std::optional<DeviceMemoryUse> memory_use() const { return std::nullopt; }
  virtual void reset_memory_peak() {}

  // Weights (see the protocol above).
  virtual MatView weights(const MatView& host, WeightStore& store) = 0;
  virtual const float* vector(std::span<const float> host, WeightStore& store) = 0;

  // Ops. Shapes as in kernels/cpu/cpu.h.
  // out [n, cols] = rows tokens[t] of table.
  virtual void embed(const MatView& table, std::span<const int32_t> tokens, float* out) = 0;
  // y [n, rows] = x [n, cols] w^T.
  virtual void matmul(const MatView& w, const float* x, int64_t n, float* y) = 0;
  // y [n, dim] = rmsnorm of x's rows times weight [dim]; y may alias x.
  virtual void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                       float* y) = 0;
  // x [n, heads, head_dim] rotated for positions pos0 + t; inv_freq [head_dim/2] device.
  virtual void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0,
                    const float* inv_freq) = 0;
  // Causal GQA: q [n_q, heads, hd] at positions first_pos.., k/v caches
  // [>= first_pos + n_q, kv_heads, hd]; out [n_q, heads, hd].
  virtual void attention(const float* q, const float* k, const float* v, int64_t n_q,
                         int64_t first_pos, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         float scale, float* out) = 0;
  // cache [capacity, row] rows pos .. pos + n - 1 = src [n, row] (the KV write).
  virtual void kv_write(float* cache, const float* src, int64_t pos, int64_t row, int64_t n) {
    copy(cache + pos * row, src, size_t(n * row) * sizeof(float));
  }
  // Fused steps. The defaults compose the ops above (so a backend that does
  // not override them computes exactly what the separate calls compute); a
  // device backend may do each in one launch.
  // ys[i] [n, ws[i].rows] = x [n, cols] ws[i]^T, every ws[i] of the same cols
  // (the q/k/v projections of one input).
  virtual void matmul_multi(std::span<const MatView> ws, const float* x, int64_t n,
                            std::span<float* const> ys) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(ws[i], x, n, ys[i]);
  }
  // matmul_multi of xn [n, cols] = rmsnorm(x, norm [cols], eps): the input norm
  // fused into its consumers (q/k/v at decode). xn is the default's scratch; a
  // backend that fuses the two may leave it unwritten.
  virtual void matmul_multi_rmsnorm(std::span<const MatView> ws, const float* x, const float* norm,
                                    float eps, int64_t n, std::span<float* const> ys, float* xn) {
    rmsnorm(x, norm, n, ws[0].cols, eps, xn);
    matmul_multi(ws, xn, n, ys);
  }
  // y [n, w.rows] = rmsnorm(x, norm [w.cols], eps) w^T: the final norm fused
  // into the LM head. xn [n, w.cols] is the default's scratch (a backend that
  // fuses the two may leave it unwritten).
  virtual void matmul_rmsnorm(const MatView& w, const float* x, const float* norm, float eps,
                              int64_t n, float* y, float* xn) {
    rmsnorm(x, norm, n, w.cols, eps, xn);
    matmul(w, xn, n, y);
  }
  // y [n, w.rows] += x [n, w.cols] w^T: the residual add fused into its
  // producer (o_proj). tmp [n, w.rows] is the default's scratch (it may be
  // left unwritten).
  virtual void matmul_add(const MatView& w, const float* x, int64_t n, float* y, float* tmp) {
    matmul(w, x, n, tmp);
    add(y, tmp, n * w.rows);
  }
  // Attention's per-head steps: q [n, nh, hd] and k [n, nkv, hd] normalized per
  // head (q_norm / k_norm [hd]; null: no norm) and rotated (RoPE at positions
  // pos..) in place, then k and v [n, nkv, hd] written to the caches
  // [capacity, nkv * hd] at rows pos.. (the KV write).
  virtual void qk_norm_rope_kv(float* q, float* k, const float* v, const float* q_norm,
                               const float* k_norm, int64_t n, int64_t nh, int64_t nkv, int64_t hd,
                               float eps, int64_t pos, const float* inv_freq, float* k_cache,
                               float* v_cache) {
    if (q_norm) rmsnorm(q, q_norm, n * nh, hd, eps, q);
    if (k_norm) rmsnorm(k, k_norm, n * nkv, hd, eps, k);
    rope(q, n, nh, hd, pos, inv_freq);
    rope(k, n, nkv, hd, pos, inv_freq);
    kv_write(k_cache, k, pos, nkv * hd, n);
    kv_write(v_cache, v, pos, nkv * hd, n);
  }
  // One token's attention with its per-head steps: qk_norm_rope_kv (n = 1, at
  // position pos), then out [nh, hd] = attention of q over the caches'
  // positions 0..pos. q and k may be left modified or as they were.
  virtual void attend_decode(float* q, float* k, const float* v, const float* q_norm,
                             const float* k_norm, int64_t nh, int64_t nkv, int64_t hd, float eps,
                             int64_t pos, const float* inv_freq, float* k_cache, float* v_cache,
                             float scale, float* out) {
    qk_norm_rope_kv(q, k, v, q_norm, k_norm, 1, nh, nkv, hd, eps, pos, inv_freq, k_cache, v_cache);
    attention(q, k_cache, v_cache, 1, pos, nh, nkv, hd, scale, out);
  }
  virtual void add(float* x, const float* y, int64_t n) = 0;                    // x += y
  virtual void add_rows(float* y, const float* b, int64_t n, int64_t dim) = 0;  // y[t] += b
  virtual void silu_mul(float* g, const float* u, int64_t n) = 0;               // g = silu(g) u
  // Router: probs [n, e] = softmax(logits [n, e]) (in place allowed), then per
  // token the k largest (ties to the lower id) as ids [n, k] and weights
  // [n, k] (divided by their sum when renormalize).
  virtual void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                            float* probs, int32_t* ids, float* weights) = 0;
  // The router itself: probs [n, e] = softmax(router x) for router [e, dim]
  // and x [n, dim], with ids / weights as softmax_topk gives them. The
  // default is matmul, then softmax_topk; CUDA fuses the two for one token.
  virtual void route_topk(const MatView& router, const float* x, int64_t n, int64_t k,
                          bool renormalize, float* probs, int32_t* ids, float* weights);
  virtual void expert_batch(const ExpertBatch& b) = 0;
  // out [1] = the index of the first maximum of x [n] (torch.argmax; x and out
  // in the backend's memory). The default goes through host memory.
  virtual void argmax(const float* x, int64_t n, int32_t* out);

  // Resident experts (optional; CUDA): the device views of every expert of one
  // layer, [num_experts] by id, registered once; returns a table handle, or -1
  // when the backend has no resident path. moe_resident then runs one token's
  // k routed experts with ids [k] and weights [k] in device memory (the
  // router's output), without the host: out [hidden] = sum over the experts
  // in ascending id order of weight * expert(x). Views must stay valid.
  virtual int register_experts(std::span<const ExpertView> views) { return -1; }
  virtual void moe_resident(int table, const int32_t* ids, const float* weights, int64_t k,
                            const float* x, int64_t hidden, int64_t intermediate, float* out) {}
  // Entries of registered tables replaced: entry e.id of table e.table is
  // e.view from the ops issued after this call on (the ops before it see the
  // old views). One call may change entries of many tables. host: the view
  // names alloc_host() memory (the mapped host tier's copies).
  struct ExpertTableEntry {
    int table = -1;
    int32_t id = 0;
    ExpertView view;
    bool host = false;
  };
  virtual void update_experts(std::span<const ExpertTableEntry> entries) {}
  // Whether ops (and so table entries) may point into alloc_host() memory,
  // read in place by the device (CUDA: pinned memory under unified addressing;
  // reads cross PCIe). The mapped host tier needs it.
  virtual bool reads_host_memory() const { return false; }
  // Host -> device copies that overlap the ops (CUDA: a second stream): each
  // starts after every op issued before it; the ops issued after it do not
  // wait for it. It returns the copy's number (increasing; 0: done already);
  // copy_done(n) says whether copy n and every copy before it have finished,
  // wait_copies() blocks until all have. src must stay unchanged until then.
  // The default copies in stream order (to_device) and returns 0.
  virtual uint64_t to_device_async(void* dst, const void* src, size_t bytes) {
    to_device(dst, src, bytes);
    return 0;
  }
  virtual bool copy_done(uint64_t n) { return true; }
  virtual void wait_copies() {}
  // One token's router and resident experts in one call: route_topk(router,
  // x, 1, k, renormalize) into probs [e], ids [k] and weights [k], then
  // moe_resident with them (the default). CUDA starts the experts' kernels
  // while the router runs (kernels/cuda/decode_q8.cu, "early reads").
  virtual void route_moe_resident(const MatView& router, int table, const float* x, int64_t k,
                                  bool renormalize, float* probs, int32_t* ids, float* weights,
                                  int64_t hidden, int64_t intermediate, float* out);
  // The same step with its norm and residual add taken in: xn [hidden] =
  // rmsnorm(x, norm, eps), route_moe_resident(.., xn, ..) into tmp [hidden],
  // then x += tmp (the default; CUDA normalizes x in the router and quantize
  // kernels and adds in the down projection). xn and tmp are the default's
  // scratch (they may be left unwritten).
  // next (optional; the default ignores it): the next MoE layer of a decode
  // step whose table entries may name host memory (the mapped host tier). A
  // backend may predict that layer's experts as route_topk(next.router,
  // rmsnorm(x, next.norm, eps)) on x as this call receives it, and copy those
  // in host memory to device memory while this layer computes; the call on
  // next.table then reads them there (same bytes: the same result).
  // next.staged [k] (device) gets, per predicted slot, the id where it was
  // copied and -2 - id where it was already in device memory (unwritten
  // where the backend does not stage).
  struct NextLayer {
    const MatView* router = nullptr;  // [experts, hidden]
    const float* norm = nullptr;      // [hidden]
    int table = -1;
    int32_t* staged = nullptr;  // [k] device
  };
  struct NormAdd {
    const float* norm = nullptr;  // [hidden]
    float eps = 0.0f;
    float *xn = nullptr, *tmp = nullptr;
    const NextLayer* next = nullptr;
  };
  virtual void route_moe_resident_add(const MatView& router, int table, float* x, int64_t k,
                                      bool renormalize, float* probs, int32_t* ids, float* weights,
                                      int64_t hidden, int64_t intermediate, const NormAdd& f);
  // Decode hint (optional; the default ignores it): the layer about to run
  // routes its experts (registered table `table`) with route_moe_resident_add
  // (router, norm = its post-attention norm, k) after its attention. A backend
  // may apply the router to rmsnorm(x, norm) of the layer's input, in the
  // matmul_multi_rmsnorm that comes next (q/k/v), and start on the top k
  // experts' weights before the router's ids are known (CUDA: gate/up copies
  // its first passes of them into shared memory while the router runs;
  // docs/cuda.md). Never changes a result. expert_predictions: the predicted
  // experts so far (issued) and how many the router then chose (used); none
  // where the backend does not predict.
  struct ExpertHint {
    const MatView* router = nullptr;  // [experts, hidden]
    const float* norm = nullptr;      // [hidden]
    int table = -1;
    int64_t k = 0;
  };
  virtual void hint_experts(const ExpertHint& h) {}
  struct PredictionCounts {
    uint64_t issued = 0, used = 0;
  };
  virtual std::optional<PredictionCounts> expert_predictions() { return std::nullopt; }

  // Decode graphs (optional; CUDA). graph_begin(pos, max_positions) starts
  // recording the ops of one decode step (one token at position pos: every
  // position argument of the recorded ops is pos, and the embedding reads the
  // token from the backend's device token slot); graph_end returns a handle.
  // graph_launch replays it for the token at position p < max_positions,
  // reading p and the token from device memory; nothing recorded may depend
  // on host values that change between steps. Ops are not run while recording.
  virtual bool supports_graphs() const { return false; }
  virtual void graph_begin(int64_t pos, int64_t max_positions) {}
  virtual int graph_end() { return -1; }
  virtual void graph_launch(int graph, int64_t pos, int32_t token) {}
  // A dropped graph may be kept and updated in place by a later recording of
  // the same launches (CUDA: cudaGraphExecUpdate; a new session's step
  // differs only in its buffers), which costs less than building it anew.
  // graph_counts: the recordings so far (ended) and how many of them updated a
  // dropped graph; none where the backend has no graphs.
  virtual void graph_drop(int graph) {}
  struct GraphCounts {
    uint64_t recorded = 0, updated = 0;
  };
  virtual std::optional<GraphCounts> graph_counts() const { return std::nullopt; }
  // Ends a recording that failed (an op threw): nothing is kept.
  virtual void graph_abort() {}
  // Chained replays (with graphs). graph_record_advance(next), recorded as a
  // step's last op (or argmax_advance, below, which records it with the
  // step's argmax), makes each replay leave the following step's arguments on
  // the device (position + 1, token = *next) and *next in a host-visible slot
  // of its position; graph_launch_next(graph, pos) then replays the step at
  // pos on them, without waiting for the replay before it or sending anything
  // from the host; graph_token(pos) waits for the replay at pos (launched
  // either way; at most the two latest are kept) and returns its *next.
  virtual void graph_record_advance(const int32_t* next) {}
  // argmax(x, n, out), then graph_record_advance(out): a backend may do both in one launch.
  virtual void argmax_advance(const float* x, int64_t n, int32_t* out) {
    argmax(x, n, out);
    graph_record_advance(out);
  }
  virtual void graph_launch_next(int graph, int64_t pos) {}
  virtual int32_t graph_token(int64_t pos) { return -1; }
};

// The CPU backend (kernels/cpu, the global thread pool).
std::unique_ptr<Backend> make_cpu_backend();
// The CUDA backend on `device`; throws Error in a build without CUDA or
// without such a device.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// "cpu" or "cuda[:N]" (throws Error naming the flag value otherwise).
std::unique_ptr<Backend> make_backend(const std::string& spec);

// Number of usable CUDA devices (0 in CPU builds or without a GPU).
int cuda_device_count();
// "NVIDIA H200, 139 GiB" or "none".
std::string cuda_device_name(int device);
// Whether this binary was built with the CUDA backend.
bool built_with_cuda();

}  // namespace moetier
