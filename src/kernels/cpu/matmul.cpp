// Y [n, rows] = X [n, cols] W^T for f32, bf16, mxfp4 and cb3 weights.
//
// Every output is computed in the canonical order of kernels/cpu/tile.h, so a
// token's row of Y is bit-identical whatever n is (batch invariance).
//
// Work split: rows are cut into tiles of 4; the thread pool (core/thread_pool.h)
// hands out chunks of consecutive tiles (grain()), of one matmul or, in
// matmul_many, of several side by side (their tiles numbered one after
// another). Per tile:
//   - n == 1 on the AVX2 path (f32, bf16, mxfp4 with cols % 8 == 0) or the
//     AVX-512 path (f32, bf16 with cols % 16 == 0): the 4 rows are decoded in
//     registers inside the dot products (decode steps);
//   - otherwise the 4 rows are decoded exactly to f32 into a per-thread
//     scratch [4, padded cols] and every token's row of X is dotted against
//     them, so each weight byte is decoded once per call.
// Both give the same bits: the same decoded values in the same order.
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cb3.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/q8.h"
#include "kernels/cpu/tile.h"
#include "kernels/matview.h"

namespace moetier::cpu {
namespace {

// A chunk reads about this many weight bytes (one stream the prefetchers can
// follow), unless that leaves fewer than kChunksPerThread chunks per thread
// to balance the load. A 768-column MXFP4 tile is 1.6 KB: with 4-tile chunks
// a decode step's experts took 299.5 us a layer at 16 threads on the H200
// machine's Xeon, 272.6 us with these (MOETIER_CPU_TIMING, device_cuda.sh
// cputime30, a2528f1 and 05e6ef8; docs/engine.md).
constexpr int64_t kChunkBytes = int64_t(64) << 10;
constexpr int64_t kChunksPerThread = 4;
// Below this many multiply-adds a parallel run costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 17;

// Values of a byte's two e2m1 codes: [low nibble (even column), high nibble].
struct Mxfp4PairTable {
  float v[256][2];
  constexpr Mxfp4PairTable() : v() {
    constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int b = 0; b < 256; ++b) {
      v[b][0] = kE2m1[b & 15];
      v[b][1] = kE2m1[b >> 4];
    }
  }
};
constexpr Mxfp4PairTable kMxfp4Pairs{};  // constant-initialized, 2 KiB

// Row r of w decoded exactly to f32 into dst [padded]; columns past cols are 0.
void decode_row(const MatView& w, int64_t r, float* dst, int64_t padded) {
  const int64_t cols = w.cols;
  std::fill(dst + cols, dst + padded, 0.0f);
  switch (w.enc) {
    case WeightEncoding::F32:
      std::memcpy(dst, static_cast<const float*>(w.data) + r * cols, size_t(cols) * sizeof(float));
      return;
    case WeightEncoding::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) dst[c] = bf16_to_f32(src[c]);
      return;
    }
    case WeightEncoding::MXFP4: {
      const uint8_t* d = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
      const uint8_t* s = w.scales + r * (cols / 32);
      for (int64_t b = 0; b < cols / 32; ++b) {
        const float sc = e8m0_to_f32(s[b]);
        float* out = dst + b * 32;
        for (int j = 0; j < 16; ++j) std::memcpy(out + 2 * j, kMxfp4Pairs.v[d[b * 16 + j]], 8);
        for (int j = 0; j < 32; ++j) out[j] *= sc;
      }
      return;
    }
    case WeightEncoding::CB3:
      return detail::decode_cb3_row(w, r, dst);
  }
}

struct Job {
  MatView w;
  const float* x;         // [n, ld] zero-padded past cols
  int64_t n, ld, groups;  // groups of 8 columns (16 on the AVX-512 path)
  float* y;               // [n, rows]
  KernelPath path;
  bool direct;
};

// Rows of tile r0: r0..r0+3, repeating the last row past the end (its
// results are dropped), so every tile runs the same 4-row kernel.
void row_indices(int64_t r0, int64_t rows, int64_t* idx) {
  for (int i = 0; i < 4; ++i) idx[i] = std::min(r0 + i, rows - 1);
}

// out [nt, 4] -> y's rows r0.. (those that exist) of tokens t, t + 1, ...
void store_rows(float* y, int64_t rows, int64_t t, int64_t nt, int64_t r0, const float* out) {
  for (int64_t u = 0; u < nt; ++u)
    for (int i = 0; i < 4 && r0 + i < rows; ++i) y[(t + u) * rows + r0 + i] = out[4 * u + i];
}

void store(const Job& j, int64_t t, int64_t r0, const float* out) {
  store_rows(j.y, j.w.rows, t, 1, r0, out);
}

void tile_direct(const Job& j, int64_t r0) {
  int64_t idx[4];
  row_indices(r0, j.w.rows, idx);
  float out[4];
  const MatView& w = j.w;
  if (w.enc == WeightEncoding::MXFP4) {
    const uint8_t *codes[4], *scales[4];
    for (int i = 0; i < 4; ++i) {
      codes[i] = static_cast<const uint8_t*>(w.data) + idx[i] * (w.cols / 2);
      scales[i] = w.scales + idx[i] * (w.cols / 32);
    }
    detail::direct4_mxfp4_avx2(codes, scales, j.x, j.groups, out);
  } else if (w.enc == WeightEncoding::BF16) {
    const uint16_t* rows[4];
    for (int i = 0; i < 4; ++i) rows[i] = static_cast<const uint16_t*>(w.data) + idx[i] * w.cols;
    if (j.path == KernelPath::Avx512)
      detail::direct4_bf16_avx512(rows, j.x, j.groups, out);
    else
      detail::direct4_bf16_avx2(rows, j.x, j.groups, out);
  } else {
    const float* rows[4];
    for (int i = 0; i < 4; ++i) rows[i] = static_cast<const float*>(w.data) + idx[i] * w.cols;
    if (j.path == KernelPath::Avx512)
      detail::direct4_f32_avx512(rows, j.x, j.groups, out);
    else
      detail::direct4_f32_avx2(rows, j.x, j.groups, out);
  }
  store(j, 0, r0, out);
}

void tile_scratch(const Job& j, int64_t r0, float* scratch /* [4, ld] */) {
  int64_t idx[4];
  row_indices(r0, j.w.rows, idx);
  for (int i = 0; i < 4; ++i) decode_row(j.w, idx[i], scratch + i * j.ld, j.ld);
  float out[12];
  int64_t t = 0;
  // Three tokens at a time (all 4 rows, or 2 rows twice): the same bits as below.
  for (; j.path != KernelPath::Portable && t + 3 <= j.n; t += 3) {
    if (j.path == KernelPath::Avx512) {
      detail::tile4x3_avx512(scratch, j.ld, j.x + t * j.ld, j.ld, j.groups, out);
      for (int u = 0; u < 3; ++u) store(j, t + u, r0, out + 4 * u);
      continue;
    }
    float o[2][6];
    for (int h = 0; h < 2; ++h)
      detail::tile2x3_avx2(scratch + 2 * h * j.ld, j.ld, j.x + t * j.ld, j.ld, j.groups, o[h]);
    for (int u = 0; u < 3; ++u) {
      const float v[4] = {o[0][2 * u], o[0][2 * u + 1], o[1][2 * u], o[1][2 * u + 1]};
      store(j, t + u, r0, v);
    }
  }
  for (; t < j.n; ++t) {
    const float* xt = j.x + t * j.ld;
    if (j.path == KernelPath::Avx512)
      detail::tile4_avx512(scratch, j.ld, xt, j.groups, out);
    else if (j.path == KernelPath::Avx2)
      detail::tile4_avx2(scratch, j.ld, xt, j.groups, out);
    else
      detail::tile4_portable(scratch, j.ld, xt, j.groups, out);
    store(j, t, r0, out);
  }
}

void run_tiles(const Job& j, int64_t tile0, int64_t tile1) {
  if (j.direct) {
    for (int64_t t = tile0; t < tile1; ++t) tile_direct(j, 4 * t);
    return;
  }
  thread_local std::vector<float> scratch;
  if (scratch.size() < size_t(4 * j.ld)) scratch.resize(size_t(4 * j.ld));
  for (int64_t t = tile0; t < tile1; ++t) tile_scratch(j, 4 * t, scratch.data());
}

// bf16 weights with bf16 activations (kernels/cpu/bf16.h).
struct Bf16Job {
  MatView w;
  const uint16_t* xb;  // [n, ldx] X rounded to bf16, zero-padded
  int64_t n, ldx;
  float* y;  // [n, rows]
};

void run_bf16_tiles(const Bf16Job& j, int64_t tile0, int64_t tile1) {
  float out[4 * 3];
  for (int64_t t = tile0; t < tile1; ++t) {
    int64_t idx[4];
    row_indices(4 * t, j.w.rows, idx);
    const uint16_t* rows[4];
    for (int i = 0; i < 4; ++i)
      rows[i] = static_cast<const uint16_t*>(j.w.data) + idx[i] * j.w.cols;
    for (int64_t t0 = 0; t0 < j.n; t0 += 3) {  // 3 tokens a call: out stays small
      const int64_t nt = std::min<int64_t>(3, j.n - t0);
      detail::bf16act_tile4_avx512bf16(rows, j.w.cols, j.xb + t0 * j.ldx, j.ldx, nt, out);
      store_rows(j.y, j.w.rows, t0, nt, 4 * t, out);
    }
  }
}

// One matmul of a matmul_many run, its activations in its kernel's form. The
// vectors are its own storage (kept across calls: the per-thread plan list).
struct Plan {
  enum class Kind { F32, Q8, Bf16 } kind = Kind::F32;
  detail::Q8Job q8job{};
  Bf16Job bjob{};
  Job job{};  // the task's w, x, n (every kind: for sharing); the f32 kind's job
  int64_t tiles = 0;
  std::vector<int8_t> q;
  std::vector<float> d, xpad;
  std::vector<uint16_t> xb;
};

// Plan p of task t; an earlier plan of the same kind, x, n and cols (gate and
// up of one input; q, k and v) lends its converted copy.
void prepare(const MatmulTask& t, KernelPath path, std::span<Plan> earlier, Plan& p) {
  using Kind = Plan::Kind;
  const MatView& w = t.w;
  p.tiles = (w.rows + 3) / 4;
  p.kind = w.enc == WeightEncoding::MXFP4 && mxfp4_activations() == Activations::Q8 ? Kind::Q8
           : w.enc == WeightEncoding::BF16 && bf16_activations()                    ? Kind::Bf16
                                                                                    : Kind::F32;
  if (p.kind != Kind::F32) {
    for (const Plan& e : earlier) {
      if (e.kind != p.kind || e.tiles == 0 || e.job.x != t.x || e.job.n != t.n ||
          e.job.w.cols != w.cols)
        continue;
      p.job = e.job;  // the task's x, n, cols (for later matches)
      p.job.w = w;
      if (p.kind == Kind::Q8) p.q8job = detail::share_mxfp4_q8(e.q8job, w, t.y);
      if (p.kind == Kind::Bf16) p.bjob = Bf16Job{w, e.bjob.xb, t.n, e.bjob.ldx, t.y};
      return;
    }
  }
  p.job.x = t.x, p.job.n = t.n, p.job.w = w;
  if (p.kind == Kind::Q8) {
    p.q8job = detail::prepare_mxfp4_q8(w, t.x, t.n, t.y, path, p.q, p.d);
    return;
  }
  if (p.kind == Kind::Bf16) {
    const int64_t ldx = (w.cols + 31) / 32 * 32;
    p.xb.resize(size_t(t.n * ldx));
    for (int64_t r = 0; r < t.n; ++r)
      detail::to_bf16_avx512bf16(t.x + r * w.cols, w.cols, ldx, p.xb.data() + r * ldx);
    p.bjob = Bf16Job{w, p.xb.data(), t.n, ldx, t.y};
    return;
  }
  const int64_t width = path == KernelPath::Avx512 ? 16 : 8;
  const int64_t groups = (w.cols + width - 1) / width, ld = groups * width;
  // X padded with zeros to whole groups (a copy only when cols is not a multiple).
  const float* xp = t.x;
  if (ld != w.cols) {
    p.xpad.assign(size_t(t.n * ld), 0.0f);
    for (int64_t r = 0; r < t.n; ++r) std::copy_n(t.x + r * w.cols, w.cols, p.xpad.data() + r * ld);
    xp = p.xpad.data();
  }
  // One token straight from the stored rows (no AVX-512 MXFP4 f32 kernel:
  // there those decode through the scratch, as batches do).
  const bool direct = path != KernelPath::Portable && t.n == 1 && ld == w.cols &&
                      w.enc != WeightEncoding::CB3 &&
                      !(path == KernelPath::Avx512 && w.enc == WeightEncoding::MXFP4);
  p.job = Job{w, xp, t.n, ld, groups, t.y, path, direct};
}

void run_plan(const Plan& p, int64_t tile0, int64_t tile1) {
  if (p.kind == Plan::Kind::Q8)
    detail::run_q8_tiles(p.q8job, tile0, tile1);
  else if (p.kind == Plan::Kind::Bf16)
    run_bf16_tiles(p.bjob, tile0, tile1);
  else
    run_tiles(p.job, tile0, tile1);
}

}  // namespace

void set_threads(int n) { set_global_threads(n); }
int threads() { return global_pool().threads(); }

void get_row(const MatView& w, int64_t r, float* out) {
  kernels::check_matview(w, "cpu::get_row");
  check(r >= 0 && r < w.rows, "cpu::get_row: row {} outside [0, {})", r, w.rows);
  thread_local std::vector<float> row;
  const int64_t padded = (w.cols + 7) / 8 * 8;
  row.resize(size_t(padded));
  decode_row(w, r, row.data(), padded);
  std::copy_n(row.data(), w.cols, out);
}

void matmul(const MatView& w, const float* x, int64_t n, float* y) {
  const MatmulTask t{w, x, n, y};
  matmul_many({&t, 1});
}

namespace {

// Multiply-adds and weight bytes of a run.
struct RunSize {
  int64_t macs = 0, bytes = 0;
};

// Plans of tasks into plans [tasks] (kept across calls); first [tasks + 1]
// the first tile of each in the run's numbering.
RunSize prepare_all(std::span<const MatmulTask> tasks, std::vector<Plan>& plans,
                    std::vector<int64_t>& first) {
  for (const MatmulTask& t : tasks) kernels::check_matview(t.w, "cpu::matmul");
  if (plans.size() < tasks.size()) plans.resize(tasks.size());
  first.assign(1, 0);
  const KernelPath path = kernel_path();
  RunSize size;
  for (size_t i = 0; i < tasks.size(); ++i) {
    Plan& p = plans[i];
    const MatmulTask& t = tasks[i];
    p.tiles = 0;
    if (t.n > 0 && t.w.rows > 0) {
      prepare(t, path, std::span<Plan>(plans.data(), i), p);
      size.macs += t.w.rows * t.w.cols * t.n;
      size.bytes += t.w.rows * kernels::row_bytes(t.w);
    }
    first.push_back(first.back() + p.tiles);
  }
  return size;
}

// fn(i, tile0, tile1) for the tiles of item i among [g0, g1) of the run's
// numbering (first [items + 1]).
template <class Fn>
void for_items(const int64_t* first, size_t items, int64_t g0, int64_t g1, const Fn& fn) {
  size_t i = size_t(std::upper_bound(first, first + items + 1, g0) - first) - 1;
  for (; g0 < g1; ++i) {
    const int64_t end = std::min(g1, first[i + 1]);
    if (end > g0) fn(i, g0 - first[i], end - first[i]);
    g0 = std::max(g0, end);
  }
}

// Tiles per chunk of a run of `tiles` tiles reading `bytes` of weights.
int64_t grain(int64_t tiles, int64_t bytes) {
  const int64_t per_tile = std::max<int64_t>(1, bytes / std::max<int64_t>(1, tiles));
  const int64_t want = (kChunkBytes + per_tile - 1) / per_tile;
  const int64_t cap = tiles / (kChunksPerThread * global_pool().threads());
  return std::clamp<int64_t>(std::min(want, cap), 1, tiles);
}

// The tiles of items [0, count) (first [count + 1]) on the pool, fn(i, tile0,
// tile1) per item's part of a chunk; serially below kParallelMin multiply-adds.
template <class Fn>
void run_items(const int64_t* first, size_t count, const RunSize& size, const Fn& fn) {
  const int64_t tiles = first[count];
  if (tiles == 0) return;
  global_pool().parallel_for(
      tiles, size.macs >= kParallelMin ? grain(tiles, size.bytes) : tiles,
      [first, count, &fn](int64_t g0, int64_t g1) { for_items(first, count, g0, g1, fn); });
}

}  // namespace

void matmul_many(std::span<const MatmulTask> tasks) {
  thread_local std::vector<Plan> plans;
  thread_local std::vector<int64_t> first;
  const RunSize size = prepare_all(tasks, plans, first);
  const Plan* pl = plans.data();
  run_items(first.data(), tasks.size(), size,
            [pl](size_t i, int64_t t0, int64_t t1) { run_plan(pl[i], t0, t1); });
}

void matmul_glu(std::span<const GluTask> tasks) {
  thread_local std::vector<MatmulTask> mm;  // [2 * tasks]: gate, up of each
  thread_local std::vector<Plan> plans;
  thread_local std::vector<int64_t> first, glu_first;  // [2 tasks + 1], [tasks + 1]
  mm.clear();
  for (const GluTask& t : tasks) {
    check(t.gate.rows == t.up.rows && t.gate.cols == t.up.cols,
          "cpu::matmul_glu: gate [{}, {}] and up [{}, {}] differ", t.gate.rows, t.gate.cols,
          t.up.rows, t.up.cols);
    mm.push_back({t.gate, t.x, t.n, t.g});
    mm.push_back({t.up, t.x, t.n, t.u});
  }
  const RunSize size = prepare_all(mm, plans, first);
  glu_first.assign(1, 0);
  for (size_t i = 0; i < tasks.size(); ++i)
    glu_first.push_back(glu_first.back() + plans[2 * i].tiles);
  const Plan* pl = plans.data();
  const GluTask* ts = tasks.data();
  run_items(glu_first.data(), tasks.size(), size, [pl, ts](size_t i, int64_t t0, int64_t t1) {
    run_plan(pl[2 * i], t0, t1);
    run_plan(pl[2 * i + 1], t0, t1);
    const GluTask& t = ts[i];
    const int64_t rows = t.gate.rows, r0 = 4 * t0, r1 = std::min(rows, 4 * t1);
    for (int64_t r = 0; r < t.n; ++r) silu_mul(t.g + r * rows + r0, t.u + r * rows + r0, r1 - r0);
  });
}

}  // namespace moetier::cpu
