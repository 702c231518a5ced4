// The CUDA backend's class (backend/cuda/*.cpp share it; nothing else
// includes this). See cuda_backend.cpp for the precision policy.
#pragma once

#include <cublas_v2.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "kernels/cuda/cuda.h"

namespace moetier {

constexpr int64_t kGemvMax = 64;               // tokens per chunk on the f32 path
constexpr int64_t kGroupGemmMin = 32;          // expert pairs that take the GEMM path
constexpr size_t kDecodeChunk = 256ull << 20;  // bytes of bf16 weights decoded at a time

// Throws Error naming the call when s is not CUBLAS_STATUS_SUCCESS.
void check_blas(cublasStatus_t s, const char* what);
// Bytes of w's scales (MXFP4) or codebook (CB3); 0 for f32 / bf16.
size_t scale_bytes(const MatView& w);
// The one-launch GEMV of the weights of one input (q/k/v), of rmsnorm(x, norm)
// when norm is set (matrix i's own norms[i] where given and not null); false
// (nothing launched) where it does not apply.
bool gemv_multi_one(std::span<const MatView> ws, const float* x, std::span<float* const> ys,
                    const float* norm, float eps, int rows_per_block, cudaStream_t s,
                    std::span<const float* const> norms = {});
// MOETIER_CUDA_PREDICT (cuda_predict.cpp): early (each resident decode layer's
// experts predicted before attention, gate/up started on them) or off.
bool read_predict_env();

// A growable device buffer for one purpose.
struct Scratch {
  DeviceBuffer buf;
  void* get(Backend& be, size_t bytes) {
    if (buf.bytes() < bytes) {
      buf.reset();
      buf = be.alloc(bytes + bytes / 4 + 256);
    }
    return buf.data();
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  bool is_host() const override { return false; }
  uint64_t device_memory() const override { return total_mem_; }
  cudaStream_t stream() const { return stream_; }

  DeviceBuffer alloc(size_t bytes) override;
  DeviceBuffer alloc_host(size_t bytes) override;
  void release(void* p, size_t bytes) override;
  void to_device(void* dst, const void* src, size_t n) override;
  void to_host(void* dst, const void* src, size_t n) override;
  void copy(void* dst, const void* src, size_t n) override;
  void fill_zero(float* x, int64_t n) override { cuda::fill_zero(x, n, stream_), after("fill"); }
  void synchronize() override { cuda_check(cudaStreamSynchronize(stream_), "synchronize"); }
  // cudaMalloc'd bytes (alloc(); not the pinned host buffers of alloc_host).
  std::optional<DeviceMemoryUse> memory_use() const override { return memory_.use(); }
  void reset_memory_peak() override { memory_.reset_peak(); }

  MatView weights(const MatView& host, WeightStore& store) override;
  const float* vector(std::span<const float> host, WeightStore& store) override;

  void embed(const MatView& table, std::span<const int32_t> tokens, float* out) override;
  void matmul(const MatView& w, const float* x, int64_t n, float* y) override;
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    cuda::rmsnorm(x, w, n, dim, eps, y, stream_), after("rmsnorm");
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0,
            const float* inv_freq) override {
    cuda::rope(x, n, heads, hd, pos0, step_pos(pos0), inv_freq, stream_), after("rope");
  }
  void kv_write(float* cache, const float* src, int64_t pos, int64_t row, int64_t n) override {
    cuda::kv_write(cache, src, pos, step_pos(pos), row, n, stream_), after("kv_write");
  }
  bool supports_graphs() const override { return true; }
  void graph_begin(int64_t pos, int64_t max_positions) override;
  int graph_end() override;
  void graph_launch(int graph, int64_t pos, int32_t token) override;
  void graph_drop(int graph) override;
  std::optional<GraphCounts> graph_counts() const override { return graph_counts_; }
  void graph_abort() override;
  void graph_record_advance(const int32_t* next) override;
  void argmax_advance(const float* x, int64_t n, int32_t* out) override;
  void graph_launch_next(int graph, int64_t pos) override;
  int32_t graph_token(int64_t pos) override;
  void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
                 int64_t heads, int64_t kv_heads, int64_t hd, float scale, float* out) override;
  void add(float* x, const float* y, int64_t n) override {
    cuda::add(x, y, n, stream_), after("add");
  }
  void add_rows(float* y, const float* b, int64_t n, int64_t dim) override {
    cuda::add_rows(y, b, n, dim, stream_), after("add_rows");
  }
  void silu_mul(float* g, const float* u, int64_t n) override {
    cuda::silu_mul(g, u, n, stream_), after("silu_mul");
  }
  void matmul_multi(std::span<const MatView> ws, const float* x, int64_t n,
                    std::span<float* const> ys) override;
  void matmul_multi_rmsnorm(std::span<const MatView> ws, const float* x, const float* norm,
                            float eps, int64_t n, std::span<float* const> ys, float* xn) override;
  void matmul_rmsnorm(const MatView& w, const float* x, const float* norm, float eps, int64_t n,
                      float* y, float* xn) override;
  void matmul_add(const MatView& w, const float* x, int64_t n, float* y, float* tmp) override;
  void qk_norm_rope_kv(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                       int64_t n, int64_t nh, int64_t nkv, int64_t hd, float eps, int64_t pos,
                       const float* inv_freq, float* k_cache, float* v_cache) override {
    if (legacy_decode_ ||
        !cuda::qk_norm_rope_kv(q, k, v, q_norm, k_norm, n, nh, nkv, hd, eps, pos, step_pos(pos),
                               inv_freq, k_cache, v_cache, stream_))
      return Backend::qk_norm_rope_kv(q, k, v, q_norm, k_norm, n, nh, nkv, hd, eps, pos, inv_freq,
                                      k_cache, v_cache);
    after("qk_norm_rope_kv");
  }
  void attend_decode(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                     int64_t nh, int64_t nkv, int64_t hd, float eps, int64_t pos,
                     const float* inv_freq, float* k_cache, float* v_cache, float scale,
                     float* out) override;
  void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                    float* probs, int32_t* ids, float* weights) override;
  void route_topk(const MatView& router, const float* x, int64_t n, int64_t k, bool renormalize,
                  float* probs, int32_t* ids, float* weights) override;
  void expert_batch(const ExpertBatch& b) override;
  void argmax(const float* x, int64_t n, int32_t* out) override {
    check(n > 0, "cuda argmax of no values");
    cuda::argmax(x, n, out, &sync()->argmax, stream_), after("argmax");
  }
  int register_experts(std::span<const ExpertView> views) override;
  void update_experts(std::span<const ExpertTableEntry> entries) override;
  bool reads_host_memory() const override { return unified_addressing_; }
  uint64_t to_device_async(void* dst, const void* src, size_t n) override;
  bool copy_done(uint64_t n) override;
  void wait_copies() override;
  void moe_resident(int table, const int32_t* ids, const float* weights, int64_t k, const float* x,
                    int64_t hidden, int64_t intermediate, float* out) override;
  void route_moe_resident(const MatView& router, int table, const float* x, int64_t k,
                          bool renormalize, float* probs, int32_t* ids, float* weights,
                          int64_t hidden, int64_t intermediate, float* out) override;
  void route_moe_resident_add(const MatView& router, int table, float* x, int64_t k,
                              bool renormalize, float* probs, int32_t* ids, float* weights,
                              int64_t hidden, int64_t intermediate, const NormAdd& f) override;
  void hint_experts(const ExpertHint& h) override;
  std::optional<PredictionCounts> expert_predictions() override;

 private:
  void read_switches();         // the environment's switches (cuda_switches.cpp)
  void read_output_switches();  // MOETIER_CUDA_TIMING, MOETIER_CUDA_TRACE
  // First member: destroyed last, after every buffer the backend owns is freed.
  DeviceMemoryCounter memory_;  // alloc()'s buffers
  void after(const char* what) {
    cuda_check(cudaGetLastError(), what);
    if (!timing_path_.empty() && !recording_) time_op(what);
  }
  // MOETIER_CUDA_TIMING=FILE (a measurement aid; use with MOETIER_GRAPHS=0):
  // the GPU time between consecutive ops, summed by op name, written to FILE
  // when the backend is destroyed. Includes the GPU's idle time when the host
  // launches slower than the GPU runs (small ops then show the launch rate).
  void time_op(const std::string& what);
  void flush_timing(bool write);
  void write_trace();
  // While recording a decode graph: the device copy of the step's position
  // (pos must be the recorded step's); else null (use the host value).
  const int64_t* step_pos(int64_t pos) const;
  float* attention_scratch(int64_t n_q, int64_t first_pos, int64_t heads, int64_t kv_heads,
                           int64_t hd);
  void gemm_bf16(const MatView& w, const float* x, int64_t n, float* y, bool accumulate);
  // y [n, rows] (+)= xb [n, cols] (bf16, device) w^T.
  void gemm_bf16_raw(const MatView& w, const uint16_t* xb, int64_t n, float* y, bool accumulate);
  void expert_gemm(const ExpertBatch& b, size_t i);               // one large expert group
  void experts_gemv(const ExpertBatch& b, size_t i0, size_t i1);  // experts [i0, i1)
  template <typename T>
  T* upload_array(Scratch& s, const std::vector<T>& v);

  int device_ = 0;
  std::string name_;
  uint64_t total_mem_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  bool f32_prefill_ = false;
  bool legacy_decode_ = false;  // MOETIER_CUDA_DECODE=legacy
  bool act_q8_ = true;          // MOETIER_CUDA_ACT=q8 (default) | f32: resident MXFP4 decode
  int qkv_rows_ = 0;            // MOETIER_CUDA_QKV_ROWS: rows per block of the q/k/v GEMV
  bool fuse_ = true;            // MOETIER_CUDA_FUSE=1 (default) | 0: norms and adds fused
  bool moe_stream_ = false;     // MOETIER_CUDA_MOE_STREAM=1: tables may take the one-launch step
  bool router_stash_ = true;    // MOETIER_CUDA_ROUTER_STASH=1 (default; RouterQ8::stash) | 0
  bool router_q8_ = true;       // MOETIER_CUDA_ROUTER_Q8=1 (default: the router quantizes x) | 0
  bool argmax_fence_ = false;   // MOETIER_CUDA_ARGMAX_FENCE=0 (default) | 1
  // MOETIER_CUDA_SKIP=op,...: a profiling aid that leaves decode ops out (their
  // outputs go stale), so a decode run's time against a full one is what those
  // ops cost inside the graph. Tokens are meaningless then.
  enum Skip : unsigned {
    kSkipQkv = 1,
    kSkipAttn = 2,
    kSkipO = 4,
    kSkipRouter = 8,
    kSkipExperts = 16
  };
  unsigned skip_ = 0;
  bool skipped(unsigned op, int64_t n) const { return n == 1 && (skip_ & op); }
  Scratch ids_, attn_, arrays_, h_, d_, wbf_, xbf_, g_, u_, hbf_, y_, rows_, rw_;
  struct Table {        // a registered layer of resident experts
    DeviceBuffer ptrs;  // [num_experts] cuda::ExpertPtrs
    DeviceBuffer host;  // [num_experts] uint8: the entry names host memory
    WeightEncoding enc = WeightEncoding::BF16;
    bool vec = false;
    int64_t num_experts = 0;
    int64_t inter = 0;  // gate's rows
    // Staging (stage_next): an expert's six regions (gate, up, down data,
    // then their scales) at offset[r] of a slot of slot_bytes; the shadow
    // table [num_experts] cuda::ExpertPtrs the next call on it reads.
    size_t offset[6] = {}, bytes[6] = {}, slot_bytes = 0;
    DeviceBuffer shadow;
    // Whether the one-launch q8 step may read the table (cuda::Q8Fuse::stream):
    // MOETIER_CUDA_MOE_STREAM=1 and every entry in device memory with its six regions 16-byte
    // aligned when registered, and never updated since (a recorded graph keeps the kernel it chose,
    // and update_experts may point entries at host memory).
    bool stream_ok = false;
    // No entry named host memory since registration (updates naming host
    // memory clear it): staging's copies (stage_mode_ 2) have nothing to do.
    bool all_device = true;
  };
  std::vector<Table> tables_;
  // update_experts: the writes, pinned (read in place by the kernel), reused
  // once the kernel that read them is done (writes_done_).
  DeviceBuffer writes_host_;  // [capacity] cuda::TableWrite
  cudaEvent_t writes_done_ = nullptr;
  // to_device_async: the copy stream; copy_start_ orders each copy after the
  // ops before it; copy_events_ holds (number, event recorded after it) of
  // the copies not seen done yet, oldest first; done events are reused.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_start_ = nullptr;
  std::deque<std::pair<uint64_t, cudaEvent_t>> copy_events_;
  std::vector<cudaEvent_t> free_events_;  // (the stagings' join events too)
  cudaEvent_t pooled_event();             // a free event, or a new one
  uint64_t copies_issued_ = 0, copies_seen_done_ = 0;
  bool unified_addressing_ = false;
  Scratch prep_, q8_;
  // Predicted experts (cuda_predict.cpp; MOETIER_CUDA_PREDICT=early, the default):
  // hint_experts keeps the hint (hint_) for the next matmul_multi_rmsnorm,
  // which computes the router's logits alongside q/k/v (predict_qkv) and
  // leaves pf_ for the next matmul_add (o_proj), whose block 0 takes their
  // top k (take_predict); route_moe_resident_add on that table then counts
  // the prediction, starts gate/up on it (predicted_table_) and clears all.
  bool predict_on_ = false;
  std::optional<ExpertHint> hint_;
  cuda::ExpertPredict pf_;  // logits null: none pending
  int pf_table_ = -1, predicted_table_ = -1, predicted_k_ = 0;
  DeviceBuffer predict_;  // PredictSlots: logits, ids, counts (allocated with the first table)
  struct PredictSlots {
    float* logits;               // [ExpertPredict::kMaxExperts]
    int32_t* ids;                // [ExpertPredict::kMaxK]
    unsigned long long* counts;  // [2]: used, issued (the router's count_predicted)
    // byte offsets of ids and counts, and predict_'s size
    static constexpr size_t kIds = cuda::ExpertPredict::kMaxExperts * sizeof(float);
    static constexpr size_t kCounts = kIds + cuda::ExpertPredict::kMaxK * sizeof(int32_t);
    static constexpr size_t kBytes = kCounts + 2 * sizeof(unsigned long long);
  };
  PredictSlots predict_slots() const;
  bool predict_qkv(std::span<const MatView> ws, const float* x, const float* norm, float eps,
                   std::span<float* const> ys);
  cuda::ExpertPredict take_predict();
  const Table& table_at(int table, int64_t k) const;
  // Staging the next MoE layer's predicted host experts (NormAdd::next), on
  // stage_stream_, forked from stream_ after this layer's router (which
  // copies x to stage_x_: the prediction reads x as the router did, while
  // this layer's down projection adds into x) and joined before the next
  // layer's router: stage_join_[table] holds the join event of a table
  // staged and not yet read. Two staging buffers used in turn
  // (stage_count_): the staging after next is forked after the next layer's
  // router, so after this layer's experts were read.
  cudaStream_t stage_stream_ = nullptr;
  cudaEvent_t stage_fork_ = nullptr;
  std::map<int, std::pair<cudaEvent_t, bool>> stage_join_;  // (join, staged)
  Scratch stage_x_, stage_route_, staging_[2];
  uint64_t stage_count_ = 0;
  int stage_mode_ = 2;     // MOETIER_CUDA_STAGE: 0 off, 1 predict only, 2 copy
  int stage_blocks_ = 32;  // MOETIER_CUDA_STAGE_BLOCKS: blocks per staged expert
  bool can_stage(const NextLayer* next, int64_t k, int64_t hidden) const;
  void stage_next(const NextLayer& next, int64_t k, bool renormalize, float eps, int64_t hidden);
  // The table a call on `table` reads: its shadow after waiting for its
  // staging (if any is pending), else its entries.
  const cuda::ExpertPtrs* take_staged(int table);
  void join_staged();  // stream_ waits for every pending staging
  void route_add_ops(const MatView& router, const Table& t, const cuda::ExpertPtrs* p, float* x,
                     int64_t k, bool renormalize, float* probs, int32_t* ids, float* weights,
                     int64_t hidden, int64_t intermediate, const NormAdd& f, bool stage);
  void moe_ptrs(const Table& t, const cuda::ExpertPtrs* p, const int32_t* ids, const float* weights,
                int64_t k, const float* x, int64_t hidden, int64_t intermediate, float* out);
  // The q8 kernels for one token (false: they do not apply, nothing launched).
  bool moe_q8(const Table& t, const cuda::ExpertPtrs* p, const int32_t* ids, const float* weights,
              int64_t k, const float* x, int64_t hidden, int64_t intermediate, float* out,
              bool early, const cuda::Q8Fuse& fuse = {});
  // Block counters and partials of the one-launch kernels (each 0 between
  // launches: the last block of a launch resets what it counted).
  struct Sync {
    unsigned route_done;      // router_topk
    unsigned stage_done;      // router_topk of a staging prediction
    unsigned attn_done[256];  // decode attention, per kv head
    unsigned moe_stream[2];   // moe_stream_q8: finished tiles, finished blocks
    cuda::ArgmaxScratch argmax;
  };
  DeviceBuffer sync_;  // [1] Sync
  Sync* sync() const { return sync_.as<Sync>(); }
  // Decode graphs.
  struct StepArgs {  // pinned host, copied to step_dev_ before each replay
    int64_t pos;
    int32_t token, pad;
  };
  bool recording_ = false;
  int64_t record_pos_ = 0, record_max_ = 0;
  DeviceBuffer step_dev_, step_host_;  // [1] StepArgs device / pinned host
  DeviceBuffer step_ring_;             // [2] int32 pinned host: the token of position p at p & 1
  cudaEvent_t step_done_[2] = {};      // the replay of position p done: p & 1
  std::vector<cudaGraphExec_t> graphs_;
  // Dropped graphs kept for the next recording to update in place
  // (cudaGraphExecUpdate: a new session's step has the same launches, only
  // its buffers differ) instead of instantiating anew; at most kSpareGraphs.
  // MOETIER_CUDA_GRAPH_UPDATE=0: none kept (A/B).
  static constexpr size_t kSpareGraphs = 2;
  std::vector<cudaGraphExec_t> spare_graphs_;
  bool graph_update_ = true;
  GraphCounts graph_counts_;
  std::string timing_path_;
  std::string trace_path_;  // MOETIER_CUDA_TRACE: the decode timeline, per launch (write_trace)
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  std::map<std::string, std::pair<double, int64_t>> op_time_;  // name -> (ms, count)
};

}  // namespace moetier
