// The q8 MoE decode step's gate/up and down in one persistent launch that
// streams the selected experts' bytes through a ring of shared-memory stages
// (sm_90+: bulk copies, mbarriers). decode_q8.cu's two launches lose time
// between them: down's blocks cannot be resident while gate/up runs, so its
// loads start only when gate/up's last block leaves. Here every block, as soon
// as its gate/up share is done, keeps loading its down rows' weights; only
// their dots wait for h (a count of finished h blocks).
//
// Grid: G blocks, at most one per SM, all resident (stream_sms checks that
// one block an SM fits at the largest shared memory the launch may take).
// Block: 16 consumer warps (512 threads) and one producer warp.
//  - Work: T = k x (inter / 32) gate/up tiles (expert slot j, 32 rows of h:
//    32 rows of gate, 32 of up), block b taking tiles b, b + G, ...; then the
//    down projection's groups of RD = 2048 / nch output rows, a contiguous run
//    of them per block, cut so that every block streams about as many stages
//    (Split). Each stage is 32 KB of codes (2048 chunks of 32) and their 2 KB
//    of e8m0 scales: RS = 2048 / nb rows of gate or up, or RD rows of one
//    expert's down; each consumer thread dots 4 chunks a stage.
//  - Ring protocol: ns stages (as many as fit, at most 5), each with a full
//    and an empty mbarrier. The
//    producer's lane 0 walks the block's stages in order: it waits until the
//    slot's consumers released it (empty, 16 warp arrivals), arms full with
//    the stage's bytes and issues two bulk copies (codes, scales) completing
//    on full. A consumer warp waits on full, reads its chunks into registers,
//    and releases the slot (syncwarp, lane 0 arrives on empty) before its dot.
//  - gate/up: thread t owns chunk c = t % nb (x's q8 block c in registers)
//    and 4 rows of each stage; its products of a tile are summed over the
//    warp at the tile's end (a transposed butterfly) into part[tile parity]
//    [row][warp of row]. Then (consumer barrier) one warp, in turn, sums them
//    in warp order, h = silu(gate) * up, quantizes the 32 values as one q8
//    block (scale times the slot's routing weight) and adds 1 to the count
//    (a release add after a syncwarp).
//  - The producer warp ranks the experts for down (lanes j < k) after issuing
//    its first tile; consumers read the ranks only after a down stage's full
//    barrier, which the producer's later arrive completes (release/acquire).
//  - down: thread t owns chunk c = t % nch and 4 rows of each stage; before
//    its first down stage thread 0 waits (acquire) until the tile count
//    reaches T, then the block copies all of h into shared memory. A group's
//    k stages (experts in ascending id order) accumulate in registers; at its
//    end the warps' sums are added in warp order and each row's total written
//    (added to out with accumulate: out is x).
//  - The count and a count of finished blocks live in `ctr` (two words, 0
//    between launches): the last block to finish resets both. The next
//    launch on the stream starts after this one completed.
// PDL (launch.cuh): every thread waits before reading ids, weights or x's q8
// blocks, and lets the next kernel launch right after. That kernel's blocks
// can only start once every block of this grid has triggered, so all G
// blocks are resident before anything else can take their SMs.
#include <algorithm>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/q8.cuh"

// Below sm_90 the kernel's body (bulk copies, mbarriers) is a trap, which
// leaves its device helpers unreferenced: no warning (error #177) there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#pragma nv_diag_suppress 177
#endif

namespace moetier::cuda {
namespace {

constexpr int kConsumers = 512, kThreads = kConsumers + 32, kMaxNS = 5;
constexpr int kStageW = 32768, kStageS = 2048, kStage = kStageW + kStageS;
constexpr int kMaxH = 640;  // k x nch: h's q8 blocks held in shared memory
// Dynamic shared memory a block may take (sm_90: 227 KB, less the static ranks).
constexpr size_t kSmemMax = 232448 - 1024;

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile(
      "{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(saddr(b)),
      "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(saddr(b))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(saddr(dst)),
      "l"(src), "r"(bytes), "r"(saddr(bar))
      : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 512;" ::: "memory"); }
__device__ __forceinline__ void red_release_add(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b's down groups [first, end): the groups are cut so that the stages
// before each block's first (all gate/up stages of the blocks before it plus
// their groups) are about b / G of all. Monotone when every block's share of
// the stages covers its gate/up stages (balanced(); the launcher shrinks G
// until it holds).
struct Split {
  int64_t tiles, spt, groups, k, g;
  __host__ __device__ int64_t tiles_before(int64_t b) const {
    const int64_t q = tiles / g, rem = tiles % g;
    return b * q + (b < rem ? b : rem);
  }
  __host__ __device__ int64_t group0(int64_t b) const {
    const int64_t total = tiles * spt + groups * k;
    const int64_t num = b * total - tiles_before(b) * spt * g + k * g / 2;
    const int64_t r = num < 0 ? 0 : num / (k * g);
    return r < groups ? r : groups;
  }
  bool balanced() const {
    const int64_t q1 = (tiles + g - 1) / g;
    return tiles * spt + groups * k >= g * q1 * spt;
  }
};

struct StreamArgs {
  const ExpertPtrs* table;
  const int32_t* ids;
  const float* weights;
  const Q8x* xq;
  const float* xd;
  Q8x* hq;    // [k, nch] q8 blocks of h
  float* hd;  // [k, nch] their scales times the slot's routing weight
  float* out;
  unsigned* ctr;  // [2]: finished tiles, finished blocks
  int k, nb, nch, accumulate, ns;
};

// The block's view of its shared memory and its share of the work.
struct Block {
  int ns;          // ring stages: as many as fit (stream_ns)
  uint8_t* ring;   // [ns][kStage]
  float* part;     // [2][64][8]: gate/up partials by tile parity, row, warp of the row
  float* red;      // [2][32][8]: down partials by group parity, row, warp of the row
  Q8x* hqs;        // [k * nch]
  float* hds;      // [k * nch]
  uint64_t* bars;  // full [ns], empty [ns]
  const RankedExperts* rk;
  int RS, RD, spt;
  int64_t b, tiles, g0, g1;
};

// The producer warp: lane 0 issues every stage of the block in order; after
// the first tile's stages the warp ranks the experts for down (lanes j < k),
// which the consumers read only after a down stage's full barrier (the
// producer's arrive on it releases the ranks).
__device__ void produce(const StreamArgs& a, const Block& m, RankedExperts& rk) {
  const int lane = int(threadIdx.x & 31);
  int slot = 0;
  unsigned phase = 0;
  auto issue = [&](const uint8_t* w, const uint8_t* s) {
    mbar_wait(m.bars + m.ns + slot, phase ^ 1u);
    mbar_expect_tx(m.bars + slot, kStage);
    bulk_copy(m.ring + slot * kStage, w, kStageW, m.bars + slot);
    bulk_copy(m.ring + slot * kStage + kStageW, s, kStageS, m.bars + slot);
    if (++slot == m.ns) slot = 0, phase ^= 1u;
  };
  auto entry = [&](int64_t tile) {
    return tile < m.tiles ? a.table[__ldcg(a.ids + tile / a.nch)] : ExpertPtrs{};
  };
  auto tile_stages = [&](int64_t tile, const ExpertPtrs& ex) {
    const int64_t row0 = (tile % a.nch) * 32;
    for (int h = 0; h < 2; ++h)
      for (int st = 0; st < m.spt / 2; ++st) {
        const int64_t r = row0 + st * m.RS;
        issue(static_cast<const uint8_t*>(ex.w[h]) + r * a.nb * 16, ex.s[h] + r * a.nb);
      }
  };
  if (lane == 0 && m.b < m.tiles) tile_stages(m.b, entry(m.b));
  __syncwarp();
  rank_slot(a.table, a.ids, a.weights, a.k, lane, rk);
  __syncwarp();
  if (lane != 0) return;
  ExpertPtrs cur = entry(m.b + gridDim.x);
  for (int64_t tile = m.b + gridDim.x; tile < m.tiles; tile += gridDim.x) {
    const ExpertPtrs next = entry(tile + gridDim.x);  // in flight during this tile's issues
    tile_stages(tile, cur);
    cur = next;
  }
  for (int64_t gr = m.g0; gr < m.g1; ++gr)
    for (int e = 0; e < a.k; ++e)
      issue(rk.w[e] + gr * m.RD * a.nch * 16, rk.s[e] + gr * m.RD * a.nch);
}

// The dot of one chunk; a probe build (bench/moe_probe.cu with
// -DMOETIER_STREAM_DIAG_LOADS) replaces it by a fold of the codes, to time
// the ring without the dot (its outputs are then not the step's).
__device__ __forceinline__ int chunk_dot(const uint4& w, const int4 (&x)[2]) {
#ifdef MOETIER_STREAM_DIAG_LOADS
  return int((w.x ^ w.y ^ w.z ^ w.w) & 0xffu) + x[0].x * 0;
#else
  return dot_chunk(w, x);
#endif
}

// The warp sums of v[R] (R a power of two up to 32) transposed: R - 1 +
// log2(32 / R) shuffles; lane l returns the total of v[l / (32 / R)] (the
// same on each lane of that run).
template <int R, int N, int O>
__device__ __forceinline__ void transpose_step(float (&v)[R], int lane) {
  if constexpr (N > 1) {  // v[0, N) live: keep one half, add the partner's copy of it
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float give = upper ? v[i] : v[i + N / 2], keep = upper ? v[i + N / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, give, O);
    }
    transpose_step<R, N / 2, O / 2>(v, lane);
  }
}
template <int R>
__device__ __forceinline__ float warp_transpose_sum(float (&v)[R]) {
  transpose_step<R, R, 16>(v, int(threadIdx.x & 31));
#pragma unroll
  for (int o = 16 / R; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  return v[0];
}

// A consumer's walk over the ring: take() reads this thread's four chunks of
// the next stage (i0 + j q, j < 4) and releases the slot.
struct Ring {
  const Block& m;
  int slot = 0;
  unsigned phase = 0;
  __device__ void take(int i0, int q, uint4 (&w)[4], uint32_t (&e)[4]) {
    mbar_wait(m.bars + slot, phase);
    const uint8_t* st = m.ring + slot * kStage;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = reinterpret_cast<const uint4*>(st)[i0 + j * q], e[j] = st[kStageW + i0 + j * q];
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(m.bars + m.ns + slot);
    if (++slot == m.ns) slot = 0, phase ^= 1u;
  }
};

// gate/up, NB = hidden / 32 chunks a row: a stage is RS = 2048 / NB rows,
// thread t takes chunk c = t % NB of rows rr + j Q (rr = t / NB, Q = RS / 4);
// its NB / 8 products of a tile (v = 4 st + j) are summed over the warp once,
// at the tile's end.
template <int NB>
__device__ void consume_gate_up(const StreamArgs& a, const Block& m, Ring& ring) {
  constexpr int RS = 2048 / NB, Q = RS / 4, SPT = 64 / RS, PT = 4 * SPT;
  const int t = int(threadIdx.x), lane = t & 31;
  const int c = t % NB, rr = t / NB, wi = c / 32;
  int4 xr[2];  // x's q8 block c
  xr[0] = __ldcg(&a.xq[c].p0), xr[1] = __ldcg(&a.xq[c].p1);
  const float xdc = __ldcg(a.xd + c);
  int par = 0;
  for (int64_t tile = m.b; tile < m.tiles; tile += gridDim.x, par ^= 1) {
    float v[PT];
#pragma unroll
    for (int st = 0; st < SPT; ++st) {
      uint4 w[4];
      uint32_t e[4];
      ring.take(rr * NB + c, Q * NB, w, e);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[4 * st + j] = float(chunk_dot(w[j], xr)) * (e8m0_half(e[j]) * xdc);
    }
    const float sum = warp_transpose_sum<PT>(v);
    float* pt = m.part + par * 64 * 8;
    const int vi = lane / (32 / PT);  // v index: tile row (vi / 4) RS + rr + (vi % 4) Q
    if (lane % (32 / PT) == 0) pt[((vi / 4) * RS + rr + (vi % 4) * Q) * 8 + wi] = sum;
    consumers_sync();
    if (t / 32 == int(tile / gridDim.x) % 16) {  // one warp (in turn): h's 32 rows of this tile,
      // one q8 block (hq, hd [k, nch]: tile = j nch + m), then the count (release)
      float gs = 0.0f, us = 0.0f;
      for (int w = 0; w < NB / 32; ++w) gs += pt[lane * 8 + w], us += pt[(32 + lane) * 8 + w];
      const float d = quantize_warp(gs / (1.0f + expf(-gs)) * us, a.hq + tile);
      if (lane == 0) a.hd[tile] = d * __ldcg(a.weights + tile / a.nch);
      __syncwarp();
      if (lane == 0) red_release_add(a.ctr);
    }
  }
}

// down: a stage is RD = 2048 / nch rows of one expert; thread t takes chunk
// c = t % nch of rows rr + j QD (rr = t / nch, QD = RD / 4), summed over the
// group's k experts, then over the warp.
__device__ void consume_down(const StreamArgs& a, const Block& m, Ring& ring) {
  const int t = int(threadIdx.x), lane = t & 31, nch = a.nch, RD = m.RD, QD = RD / 4;
  if (t == 0)  // every tile's h written
    while (load_acquire(a.ctr) < unsigned(m.tiles)) __nanosleep(32);
  consumers_sync();
  for (int i = t; i < a.k * nch; i += kConsumers)
    m.hqs[i].p0 = __ldcg(&a.hq[i].p0), m.hqs[i].p1 = __ldcg(&a.hq[i].p1),
    m.hds[i] = __ldcg(a.hd + i);
  consumers_sync();
  const int c = t % nch, rr = t / nch, wi = c / 32;
  int par = 0;
  for (int64_t gr = m.g0; gr < m.g1; ++gr, par ^= 1) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < a.k; ++e) {  // ascending expert id
      uint4 w[4];
      uint32_t s[4];
      ring.take(rr * nch + c, QD * nch, w, s);
      const int hb = m.rk->slot[e] * nch + c;
      const int4 hx[2] = {m.hqs[hb].p0, m.hqs[hb].p1};
      const float hdv = m.hds[hb];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] += float(chunk_dot(w[j], hx)) * (e8m0_half(s[j]) * hdv);
    }
    const float sum = warp_transpose_sum<4>(acc);  // lane 8 j: row rr + j QD
    float* rd = m.red + par * 32 * 8;
    if (lane % 8 == 0) rd[(rr + (lane / 8) * QD) * 8 + wi] = sum;
    consumers_sync();
    if (t / 32 == int(gr % 16) && lane < RD) {  // one warp, in turn
      float total = 0.0f;
      for (int w = 0; w < nch / 32; ++w) total += rd[lane * 8 + w];
      const int64_t row = gr * RD + lane;
      a.out[row] = a.accumulate ? a.out[row] + total : total;
    }
  }
}

template <int NB>
__global__ void __launch_bounds__(kThreads, 1) moe_stream_q8_kernel(StreamArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ RankedExperts rk;  // the producer's (its weights unused: h carries them)
  const int k = a.k, nch = a.nch, t = int(threadIdx.x);
  Block m;
  m.RS = 2048 / NB, m.RD = 2048 / nch, m.spt = 64 / m.RS;
  m.tiles = int64_t(k) * nch;
  const Split sp{m.tiles, m.spt, int64_t(NB) * 32 / m.RD, k, gridDim.x};
  m.b = blockIdx.x, m.g0 = sp.group0(m.b), m.g1 = sp.group0(m.b + 1);
  m.ring = smem;
  m.ns = a.ns;
  m.part = reinterpret_cast<float*>(smem + m.ns * kStage);
  m.red = m.part + 2 * 64 * 8;
  m.hqs = reinterpret_cast<Q8x*>(m.red + 2 * 32 * 8);
  m.hds = reinterpret_cast<float*>(m.hqs + k * nch);
  m.bars = reinterpret_cast<uint64_t*>(m.hds + ((k * nch + 1) & ~1));
  m.rk = &rk;
  if (t == 0)
    for (int i = 0; i < m.ns; ++i) mbar_init(m.bars + i, 1), mbar_init(m.bars + m.ns + i, 16);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const unsigned ts = grid_wait<2>();  // ids, weights, x's q8 blocks: the kernel before
  grid_launch_dependents();
  if (t >= kConsumers) {
    produce(a, m, rk);
  } else {
    Ring ring{m};
    consume_gate_up<NB>(a, m, ring);
    trace_mark(ts, 1);
    if (m.g0 < m.g1) consume_down(a, m, ring);
  }
  __syncthreads();
  trace_mark(ts, 2);
  if (t == 0) {  // the last block resets both counts (after every block's last use of them)
    __threadfence();
    if (atomicAdd(a.ctr + 1, 1u) == gridDim.x - 1) a.ctr[0] = 0, a.ctr[1] = 0;
  }
#else
  (void)a;
  __trap();
#endif
}

// Shared memory besides the ring: partials, h, the barriers.
size_t stream_fixed(int k, int nch) {
  return (2 * 64 * 8 + 2 * 32 * 8) * sizeof(float) + size_t(k) * nch * sizeof(Q8x) +
         size_t((k * nch + 1) & ~1) * sizeof(float) + 2 * kMaxNS * sizeof(uint64_t);
}
int stream_ns(int k, int nch) {
  return int(std::min<size_t>(kMaxNS, (kSmemMax - stream_fixed(k, nch)) / kStage));
}
size_t stream_smem(int k, int nch) {
  return size_t(stream_ns(k, nch)) * kStage + stream_fixed(k, nch);
}

bool pow2_in(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

using Kernel = void (*)(StreamArgs);
Kernel kernel_for(int nb) {
  return nb == 64    ? moe_stream_q8_kernel<64>
         : nb == 128 ? moe_stream_q8_kernel<128>
                     : moe_stream_q8_kernel<256>;
}

// The current device's SM count where it is sm_90+, the kernels were compiled
// for sm_90+ (ptxVersion: a build for sm_80 JIT-compiled on an H100 has only
// the trap), and one block of every kernel fits an SM at kSmemMax of shared
// memory (so at any launch's, which takes less), else 0 (checked once per
// device, not on every launch).
int stream_sms() {
  return per_device_once([](int dev) {
    int major = 0;
    const int n = current_device_sms();
    bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        n > 0 && major >= 9;
    for (int nb : {64, 128, 256}) {
      int per_sm = 0;
      cudaFuncAttributes fa{};
      ok = ok && cudaFuncGetAttributes(&fa, kernel_for(nb)) == cudaSuccess && fa.ptxVersion >= 90 &&
           cudaFuncSetAttribute(kernel_for(nb), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(kSmemMax)) == cudaSuccess &&
           cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(nb), kThreads,
                                                         kSmemMax) == cudaSuccess &&
           per_sm >= 1;
    }
    (void)cudaGetLastError();
    return ok ? n : 0;
  });
}

}  // namespace

bool moe_stream_applies(int k, int64_t hidden, int64_t inter) {
  return hidden % 32 == 0 && inter % 32 == 0 && pow2_in(hidden / 32, 64, 256) &&
         pow2_in(inter / 32, 64, 256) && k >= 1 && k <= 32 && k * (inter / 32) <= kMaxH;
}

bool moe_stream_supported() { return stream_sms() > 0; }

bool moe_stream_q8(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                   const void* xq, const float* xd, int64_t hidden, int64_t inter, void* hq,
                   float* hd, float* out, bool accumulate, unsigned* counters, cudaStream_t s) {
  if (!counters || !moe_stream_applies(k, hidden, inter)) return false;
  const int sms = stream_sms(), nch = int(inter / 32), nb = int(hidden / 32);
  if (sms == 0) return false;
  // Stages of 2048 chunks: gate/up tiles of 64 / (2048 / nb) stages, down groups of 2048 / nch
  // rows.
  Split sp{int64_t(k) * nch, 64 / (2048 / nb), hidden / (2048 / nch), k, sms};
  while (sp.g > 1 && !sp.balanced()) --sp.g;
  const StreamArgs args{table,
                        ids,
                        weights,
                        static_cast<const Q8x*>(xq),
                        xd,
                        static_cast<Q8x*>(hq),
                        hd,
                        out,
                        counters,
                        k,
                        nb,
                        nch,
                        accumulate ? 1 : 0,
                        stream_ns(k, nch)};
  launch(kernel_for(nb), unsigned(sp.g), unsigned(kThreads), stream_smem(k, nch), s, args);
  return true;
}

}  // namespace moetier::cuda
