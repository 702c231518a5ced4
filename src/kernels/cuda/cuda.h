// CUDA kernels: pure math on device pointers and shapes, launched on a given
// stream (the launchers are host functions; backend/cuda/ owns the device,
// the streams and the memory and calls these). Each kernel has a scalar
// reference in kernels/ref and is tested against the CPU backend by
// normalized error on odd shapes (tests/kernels/test_cuda_ops_cuda.cpp).
//
// Numerics: activations and accumulation are f32, as on the CPU; weights are
// decoded exactly (bf16, e2m1 x e8m0, f16 centroids) before they are
// multiplied. Results differ from the CPU only by summation order, except
// where a launcher says otherwise (the tensor-core GEMM of gemm_bf16).
//
// Launchers never synchronize; errors of a launch are reported by the
// backend's next check (cudaGetLastError after every launch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace moetier::cuda {

// Whether gemv/experts can read w 16 bytes at a time (aligned rows whose
// width suits the encoding); otherwise they take the generic path.
bool vectorizable(const MatView& w);

// y [n, rows] (+)= x [n, cols] w^T, f32 activations, any encoding; n <= 64
// per launch is efficient (each weight row is read once per 8 tokens).
void gemv(const MatView& w, const float* x, int64_t n, float* y, bool accumulate, cudaStream_t s);

// dst [rows, cols] bf16 = w decoded (any encoding), for the tensor-core GEMM.
void decode_to_bf16(const MatView& w, uint16_t* dst, cudaStream_t s);
// dst [n] bf16 = src [n] f32 (round to nearest even).
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t s);

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t s);
// d_pos: when non-null (graph mode) the position of token 0 is *d_pos, not pos0.
void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0, const int64_t* d_pos,
          const float* inv_freq, cudaStream_t s);
// cache [capacity, row] rows pos .. pos + n - 1 = src [n, row] (pos = *d_pos when non-null).
void kv_write(float* cache, const float* src, int64_t pos, const int64_t* d_pos, int64_t row,
              int64_t n, cudaStream_t s);
void add(float* x, const float* y, int64_t n, cudaStream_t s);
void add_rows(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t s);
void silu_mul(float* g, const float* u, int64_t n, cudaStream_t s);
void fill_zero(float* x, int64_t n, cudaStream_t s);
// out [n, cols] = rows ids[t] of table decoded to f32; ids device [n].
void embed(const MatView& table, const int32_t* ids, int64_t n, float* out, cudaStream_t s);

// Decode timeline (kernels/cuda/trace.cu, launch.cuh; MOETIER_CUDA_TRACE): one
// row per block of every kernel that calls grid_wait() while recording: its
// launch (%gridid: the same for every replay of a graph node), its linear
// block index, grid size and SM, and the global timer (ns) on entering and on
// leaving the wait (thread 0).
struct TraceRow {
  unsigned long long grid, t_enter, t_leave;
  unsigned block, blocks, sm, pad;
  unsigned long long t_start;  // a block row: its kernel's start (trace_clock), 0 where not given
};
// Starts recording up to cap rows on the current device (false: no memory,
// or a build without -DMOETIER_CUDA_TRACE=ON, whose kernels record nothing).
bool trace_begin(size_t cap);
// Stops recording; the rows recorded (at most cap), in slot order; wanted (if
// set): the rows the kernels asked for, more than were kept once cap filled.
std::vector<TraceRow> trace_end(size_t* wanted = nullptr);

// out [1] = the index of the first maximum of x [n] (torch.argmax), in one
// launch of up to kArgBlocks blocks; sc: device scratch, done 0 before and after.
constexpr int kArgBlocks = 128, kArgThreads = 256;
struct ArgmaxScratch {
  float value[kArgBlocks];
  int32_t index[kArgBlocks];
  unsigned done;
};
// A decode graph's step arguments (Backend::graph_record_advance): *pos += 1,
// *token = the step's token, ring[old pos & 1] = it (host-visible pinned memory).
struct StepAdvance {
  int64_t* pos = nullptr;
  int32_t* token = nullptr;
  int32_t* ring = nullptr;
  // __threadfence_system() after the ring's write (MOETIER_CUDA_ARGMAX_FENCE=1;
  // not needed: the host reads the ring only after the step's event)
  bool fence = false;
};
// adv (or null): the last block also advances the step to *out (no advance_step launch).
void argmax(const float* x, int64_t n, int32_t* out, ArgmaxScratch* sc, cudaStream_t s,
            const StepAdvance* adv = nullptr);
// The advance with *next as a launch of its own (Backend::graph_record_advance;
// the session records argmax_advance, which argmax with adv does in one).
void advance_step(int64_t* pos, int32_t* token, const int32_t* next, int32_t* ring, cudaStream_t s);

// Router: probs [n, e] = softmax(logits) (may alias), ids/weights [n, k] the
// top k by descending probability (ties to the lower id), weights divided by
// their sum when renormalize. e <= 1024, k <= 32.
void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                  float* probs, int32_t* ids, float* weights, cudaStream_t s);

// The router of one token in one launch: probs [e] = softmax(w x), ids /
// weights [k] as softmax_topk gives them (w [e, cols], e <= 1024). done: one
// device counter, 0 before and after (the last block to finish runs the
// top-k). false (nothing launched) where the vector GEMV does not apply.
// norm: the logits of rmsnorm(x, norm, eps) (each block normalizes x itself).
// x_copy [cols] (optional) = x, written by the launch.
// q8 (optional): the router also writes x's q8 blocks for the MoE step
// (moe_decode_q8 with Q8Fuse::x_ready), each block of the router quantizing
// x's 32-column blocks blockIdx.x, + gridDim.x, ... (of rmsnorm(x) with the
// router's own 1 / rms where norm is set) after the blocks' count, and
// prefetches the expert table into L2 before its wait (the MoE step's first
// dependent read).
// predicted / counts: the ids an ExpertPredict predicted for this router
// (its launch two back wrote them); the last block adds to counts [2] how
// many of them the router chose and k (used, issued). Null: none.
struct RouterQ8 {
  void* xq = nullptr;              // [cols / 32] q8 blocks (moe_q8_x); null: none
  float* xd = nullptr;             // [cols / 32] their scales
  const void* prefetch = nullptr;  // [prefetch_bytes], brought into L2
  int64_t prefetch_bytes = 0;
  const int32_t* predicted = nullptr;    // [k]
  unsigned long long* counts = nullptr;  // [2]
  // Block b quantizes its q8 block b from x's values its dot read (kept in
  // shared memory), not loaded again after the count (the decode step's
  // default; MOETIER_CUDA_ROUTER_STASH=0 for A/B).
  bool stash = false;
};
bool router_topk(const MatView& w, const float* x, int64_t k, bool renormalize, float* probs,
                 int32_t* ids, float* weights, unsigned* done, cudaStream_t s,
                 const float* norm = nullptr, float eps = 0.0f, float* x_copy = nullptr,
                 const RouterQ8& q8 = {});

// Causal GQA attention (see Backend::attention). Graph mode: d_pos non-null,
// the query's position is *d_pos and the grid covers max_positions. scratch:
// at least attention_scratch_floats(n_q, covered positions, ...) floats, where
// the covered positions are max_positions in graph mode, else first_pos + n_q.
// done: device counters [kv_heads], 0 before and after (decode: the last
// block of each kv head merges its splits).
int64_t attention_scratch_floats(int64_t n_q, int64_t positions, int64_t heads, int64_t head_dim);
void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
               int64_t head_dim, float scale, float* out, float* scratch, unsigned* done,
               cudaStream_t s);
// Decode attention with its input steps in the same launch (see
// Backend::attend_decode): q [heads, hd] and this token's k_new / v_new
// [kv_heads, hd] before norm and RoPE; the k/v rows of position pos are
// written to the caches. q is not modified. false (nothing launched) where
// the decode kernel does not apply (hd not a multiple of 4 or > 256, over 32
// query heads per kv head).
struct DecodePrep {
  const float* k_new = nullptr;     // [kv_heads, hd]
  const float* v_new = nullptr;     // [kv_heads, hd]
  const float* q_norm = nullptr;    // [hd] or null (no norm)
  const float* k_norm = nullptr;    // [hd] or null
  const float* inv_freq = nullptr;  // [hd / 2]
  float eps = 0.0f;
};
bool attention_decode(const float* q, float* k_cache, float* v_cache, int64_t pos,
                      const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
                      int64_t hd, float scale, const DecodePrep& prep, float* out, float* scratch,
                      unsigned* done, cudaStream_t s);

// One batch of SwiGLU experts (all of one encoding) on grouped tokens.
struct ExpertPtrs {
  const void* w[3];     // gate [I, H], up [I, H], down [H, I]
  const uint8_t* s[3];  // their scales / codebooks (null for f32, bf16)
};
// A decode layer's experts predicted before its router (docs/cuda.md
// "Predicted experts start gate/up early"; predict.cuh): block 0 of a gemv1
// launch given one takes, before its grid_wait, the top k of logits [e] (the
// layer's router applied to its input before attention, written by the q/k/v
// GEMV two launches back: read through L2) and writes them to ids [k], which
// the router counts and gate/up starts copying early (Q8Fuse::predicted).
struct ExpertPredict {
  static constexpr int kMaxExperts = 1024;  // e (the fused router's limit)
  static constexpr int kMaxK = 32;          // k
  const float* logits = nullptr;            // [e]; null: none
  int32_t* ids = nullptr;                   // [k]
  int e = 0, k = 0;
};

// One entry of a resident expert table set (write_table_entries).
struct TableWrite {
  ExpertPtrs* dst;  // device: the entry
  ExpertPtrs v;
  uint8_t* flag;  // device: the entry's host flag (or null)
  uint8_t host;   // whether v names host memory
};
// *w[i].dst = w[i].v (and *w[i].flag = w[i].host) for i < n; w is read in
// place (pinned host memory is fine). Launched without PDL: the next kernel
// sees the writes.
void write_table_entries(const TableWrite* w, int n, cudaStream_t s);
// While one is in scope, this thread's launches ask for no PDL (kernels on
// a second stream whose first input comes through an event: a programmatic
// edge would let them pass grid_wait once the producer triggered, before
// its writes). Their grid_wait()s then return at once.
struct PlainLaunches {
  PlainLaunches();
  ~PlainLaunches();
  PlainLaunches(const PlainLaunches&) = delete;
  PlainLaunches& operator=(const PlainLaunches&) = delete;
};
// A later layer's predicted experts staged (stage.cu): for each of the k ids
// (device, written by the kernel before) whose host flag is set, the expert's
// six regions (gate, up, down data, then their scales; null pointers
// skipped) are copied from table[id] into staging slot j at offset[r]; shadow
// [num_experts] = table with those entries naming the slot copies; staged [k]
// (optional) = id where staged, -2 - id where not (already in device memory).
// The grid: (blocks, k) of 256 threads.
// The ops that read shadow must wait for the kernel (a plain launch).
struct StageLaunch {
  const ExpertPtrs* table = nullptr;  // [num_experts] device
  const uint8_t* host = nullptr;      // [num_experts] host flags (null: none copied)
  unsigned blocks = 32;               // per predicted expert
  const int32_t* ids = nullptr;       // [k]
  int k = 0, num_experts = 0;
  uint8_t* staging = nullptr;  // [k, slot_bytes]
  size_t slot_bytes = 0;
  size_t offset[6] = {}, bytes[6] = {};
  ExpertPtrs* shadow = nullptr;  // [num_experts]
  int32_t* staged = nullptr;     // [k] or null
};
void stage_experts(const StageLaunch& a, cudaStream_t s);
struct ExpertLaunch {
  WeightEncoding enc = WeightEncoding::BF16;
  int64_t hidden = 0, inter = 0;
  int32_t m = 0;                           // experts
  const ExpertPtrs* experts = nullptr;     // [m] device
  const int32_t* pair_offsets = nullptr;   // [m + 1] device: pairs of expert i
  const int32_t* pair_token = nullptr;     // [pairs] device: token of each pair
  int32_t n = 0;                           // tokens (those with pairs)
  const int32_t* token_offsets = nullptr;  // [n + 1] device: pairs of token t
  const int32_t* token_pairs = nullptr;    // [pairs] device, ascending expert per token
  const int32_t* pair_expert = nullptr;    // [pairs] device: index into experts
  const int32_t* token_rows = nullptr;     // [n] device: row of x/out of token t (null: t)
  const float* pair_weight = nullptr;      // [pairs] device
  const float* x = nullptr;                // [n, hidden]
  int32_t pairs = 0;                       // (expert, token) pairs
  float* h = nullptr;                      // [pairs, inter] scratch
  float* d = nullptr;                      // [pairs, hidden] scratch
  float* out = nullptr;                    // [n, hidden] accumulated into
  int32_t max_pairs_per_expert = 0;        // launch shape hint
  bool vec_ok = false;  // every expert pointer is 16-byte aligned (vectorizable())
};
// h[p] = silu(gate x[token(p)]) * up x[token(p)]; d[p] = down h[p]; then
// out[t] += sum over t's pairs in order: weight(p) * d[p] (one accumulator
// per output, so the order of the sum is the order of token_pairs).
void experts(const ExpertLaunch& l, cudaStream_t s);

// The tensor-core path of a large expert group (backend/cuda): dst [m, cols]
// bf16 = rows rows[i] of x [*, cols]; out[rows[i]] += weights[i] * y[i] for
// y [m, cols] (each row once per call, so no two threads add to one element).
void gather_rows_bf16(const float* x, const int32_t* rows, int64_t m, int64_t cols, uint16_t* dst,
                      cudaStream_t s);
void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* weights,
                      int64_t m, int64_t cols, cudaStream_t s);

// Resident decode (n == 1): from the router's ids/weights [k] on the device and
// a device table [num_experts] of expert pointers, fills the ExpertLaunch
// arrays (experts in ascending id order) in `prep` (device memory of
// expert_prep_bytes(k)) without the host. Returns the launch to pass to experts().
size_t expert_prep_bytes(int64_t k);
ExpertLaunch prepare_decode_experts(const int32_t* ids, const float* weights, int64_t k,
                                    const ExpertPtrs* table, void* prep, cudaStream_t s);

// Decode (kernels/cuda/decode.cu). gemv1: y [rows] (+)= w x for one token,
// columns split over each block's threads; false (nothing launched) for cb3
// or a weight the vector path cannot read. moe_decode: out [hidden] = the
// weighted sum (ascending expert id) of the k experts ids[0..k) of `table`
// (device [num_experts]) on x [hidden], h [k, inter] scratch; ids and weights
// [k] on the device; false (nothing launched) where it does not apply (cb3,
// unaligned pointers: vec false, widths not a multiple of the chunk, k > 32).
bool gemv1(const MatView& w, const float* x, float* y, bool accumulate, cudaStream_t s,
           const ExpertPredict& pf = {});
// The row count from which gemv1 / gemv_multi take a warp per rows instead of
// a block (default 32768; for benchmarks).
void set_gemv_warp_rows(int64_t rows);
// Rows per block of the block GEMV: 1, 2, 4 or 8 (0: 4 from 4096 rows in all or
// from 1024 with the norm taken in, 2 from 2048, else 1).
void set_gemv_block_rows(int rows);
// Rows per block of the fused router (router_topk): 1, 2 or 4 (A/B); anything else gives
// the default, 2.
void set_router_rows(int rows);
// Values per argmax thread at the least: 32 (the default: the 8192-entry
// vocabulary in one block, which skips the count), 16 or 64 (A/B); anything
// else gives 32.
void set_argmax_values(int per_thread);
bool moe_decode(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                float* h, float* out, cudaStream_t s);

// The resident MoE step with int8 activations (kernels/cuda/decode_q8.cu;
// MXFP4 experts, hidden and inter multiples of 32): same contract as
// moe_decode, scratch of moe_q8_scratch_bytes(k, hidden, inter) device bytes
// for x and h in q8 form. early: the launch right before is the router that
// wrote ids and weights, and x was written before the router
// (route_moe_resident: the kernels then read them before their grid_wait).
// false (nothing launched) where it does not apply (moe_q8_applies).
size_t moe_q8_scratch_bytes(int64_t k, int64_t hidden, int64_t inter);
bool moe_q8_applies(WeightEncoding enc, bool vec, int k, int64_t hidden, int64_t inter);
// fuse: the step's neighbours taken in: x is normalized first (norm [hidden]
// set: rmsnorm(x, norm, eps), in the quantize kernel) and the output added
// to out (accumulate: out += the step, the residual add).
// x_ready: x's q8 blocks are already in scratch (the router wrote them,
// RouterQ8, normalized where it was given the norm; norm is then unused): no
// quantize launch, and gate/up, launched right after the router, reads ids
// only after its wait.
// stream: two device words, 0 between launches, for the one-launch gate/up
// and down (moe_stream_q8); null where the experts may not take it (an entry
// in host memory, or not 16-byte aligned throughout).
struct Q8Fuse {
  const float* norm = nullptr;
  float eps = 0.0f;
  bool accumulate = false;
  bool x_ready = false;
  unsigned* stream = nullptr;
  // with x_ready: the layer's predicted ids [k] (ExpertPredict, written two or
  // more launches back), whose weights gate/up starts copying before its wait
  const int32_t* predicted = nullptr;
};
// Where x's q8 blocks and scales lie in moe_decode_q8's scratch.
struct Q8XSlots {
  void* xq;
  float* xd;
};
Q8XSlots moe_q8_x(void* scratch, int64_t k, int64_t hidden, int64_t inter);
// Returns 0 where nothing was launched, 2 for the one-launch gate/up and down
// (moe_stream_q8), 1 for the separate kernels.
int moe_decode_q8(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                  const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                  void* scratch, float* out, bool early, cudaStream_t s, const Q8Fuse& fuse = {});
// Which q8 kernels moe_decode_q8 launches (process-wide; MOETIER_CUDA_MOE_GATE
// and MOETIER_CUDA_MOE_DOWN, for A/B): gate/up with 8 warps of 4 rows
// (default) or 16 of 2 per block of 32 rows; down with a warp per 2 rows
// (down_rows 0) or a block of 128 threads splitting the items of 2 or 4 rows,
// at 4 by default two groups of 4 rows a block (down_pair: one wave where a
// row's items fit one pass; MOETIER_CUDA_MOE_DOWN=4 for one group; docs/cuda.md).
// stream (MOETIER_CUDA_MOE_STREAM=0 | 1): gate/up and down in one launch
// (moe_stream_q8) where it applies and Q8Fuse::stream is given.
struct MoeQ8Kernels {
  int gate_warps = 8;     // 8 | 16
  int down_rows = 4;      // 0 | 2 | 4
  bool down_pair = true;  // at 4 rows: two groups a block, one wave (moe_down_q8_pair_kernel)
  // down_pair by shape (the default): only where the split kernel's grid of
  // hidden / 4 blocks passes kPairBlocksPerSm a multiprocessor
  bool down_auto = true;
  bool stream = false;
  // with Q8Fuse::predicted: how many of gate/up's first four passes (gate and
  // up rows of its first two chunks) it starts before its wait (1..4)
  int predict_passes = 4;
};
// Every decode kernel's preferred shared-memory carveout, percent (0..100);
// -1 (the default): no preference (MOETIER_CUDA_CARVEOUT; launch.cuh).
void set_carveout(int percent);
void set_moe_q8_kernels(const MoeQ8Kernels& k);
// Gate/up and down of the q8 step in one persistent launch streaming the
// experts through shared memory (kernels/cuda/moe_stream.cu): x's q8 blocks
// (xq, xd [hidden / 32]) already written, h's (hq, hd [k, inter / 32]) its
// scratch, counters two device words that are 0 (and left 0). Applies to
// hidden / 32 and inter / 32 powers of two in [64, 256] and
// k x inter / 32 <= 640, every expert's six regions 16-byte aligned in device memory, on sm_90+
// with room for one block an SM; false (nothing launched) elsewhere.
bool moe_stream_applies(int k, int64_t hidden, int64_t inter);
// Whether the current device runs moe_stream_q8 at all (sm_90+ in both the
// device and the kernel's compiled code, one block an SM): where not, it
// returns false for every shape.
bool moe_stream_supported();
bool moe_stream_q8(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                   const void* xq, const float* xd, int64_t hidden, int64_t inter, void* hq,
                   float* hd, float* out, bool accumulate, unsigned* counters, cudaStream_t s);

// Fused steps (kernels/cuda/fused.cu, decode.cu; Backend's fused ops). gemv_multi: y[m] [rows[m]] =
// w[m] x for up to kMax weights of one encoding and width, one row per block (tile0: prefix sums of
// rows), of rmsnorm(x, norm, eps) when norm is set (each block normalizes x itself); false (nothing
// launched) where the vector path does not apply. qk_norm_rope_kv: see Backend::qk_norm_rope_kv
// (d_pos: graph mode); false for head_dim > 512 or odd.
struct GemvMulti {
  static constexpr int kMax = 4;
  const uint8_t* w[kMax] = {};
  const uint8_t* sc[kMax] = {};
  float* y[kMax] = {};
  int64_t tile0[kMax + 1] = {};
  int count = 0;
  const float* norm = nullptr;    // [cols] RMSNorm weights, or none
  const float* norms[kMax] = {};  // matrix m's own RMSNorm weights where set (norm set too)
  float eps = 0.0f;
  int rows_per_block = 0;  // of the block GEMV: 1, 2, 4 or 8 (0: set_gemv_block_rows' rule)
  ExpertPredict pf;        // the block GEMV only (its block 0); else refused
};
bool gemv_multi(const GemvMulti& g, WeightEncoding enc, int64_t cols, const float* x,
                cudaStream_t s);
bool qk_norm_rope_kv(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                     int64_t n, int64_t nh, int64_t nkv, int64_t hd, float eps, int64_t pos,
                     const int64_t* d_pos, const float* inv_freq, float* k_cache, float* v_cache,
                     cudaStream_t s);

}  // namespace moetier::cuda
