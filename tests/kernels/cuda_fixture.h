// Shared by the CUDA op tests (label `cuda`): random matrices of any
// encoding, a CPU / CUDA backend pair, random expert sets and the MoE
// activation mode. Header-only; each test file is its own executable.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "kernels/cb3.h"
#include "kernels/cpu/dispatch.h"
#include "unit/numeric.h"

namespace moetier::testing {

inline bool have_gpu() { return built_with_cuda() && cuda_device_count() > 0; }

// Unless the environment says otherwise, both engines start with f32
// activations (MOETIER_CPU_ACT, MOETIER_CUDA_ACT; read at first use): the
// tests that compare the GPU with the CPU engine end to end (greedy tokens,
// 1e-4 on logits) compare like with like on every CPU (the CPU's q8 mode
// computes bf16 weights with bf16 activations on AVX-512 BF16 CPUs; the
// GPU's does not). ActMode pins the q8 modes where a test compares them.
inline const bool kF32ActivationsByDefault = [] {
  ::setenv("MOETIER_CPU_ACT", "f32", 0);
  ::setenv("MOETIER_CUDA_ACT", "f32", 0);
  return true;
}();

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)"

// Owns the host bytes of a random matrix of any encoding.
struct HostMatrix {
  std::vector<uint8_t> bytes, scales;
  MatView view;
  HostMatrix(WeightEncoding enc, int64_t rows, int64_t cols, std::mt19937& rng) {
    view = {enc, rows, cols, nullptr, nullptr};
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130), code(0, 7);
    auto f = randn(size_t(rows * cols), rng, 0.5f);
    switch (enc) {
      case WeightEncoding::F32:
        bytes.resize(f.size() * 4);
        std::memcpy(bytes.data(), f.data(), bytes.size());
        break;
      case WeightEncoding::BF16:
        bytes.resize(f.size() * 2);
        for (size_t i = 0; i < f.size(); ++i) {
          const uint16_t h = f32_to_bf16(f[i]);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        break;
      case WeightEncoding::MXFP4:
        for (int64_t i = 0; i < rows * cols / 2; ++i) bytes.push_back(uint8_t(byte(rng)));
        for (int64_t i = 0; i < rows * cols / 32; ++i) scales.push_back(uint8_t(sc(rng)));
        break;
      case WeightEncoding::CB3: {
        const int64_t rb = kernels::cb3_row_bytes(cols);
        bytes.assign(size_t(rows * rb), 0);
        std::vector<uint8_t> c(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          for (auto& x : c) x = uint8_t(code(rng));
          kernels::cb3_pack_row(c.data(), cols, bytes.data() + r * rb);
        }
        for (int64_t i = 0; i < rows * 8; ++i) {
          const uint16_t h = f32_to_f16(randn(1, rng, 0.3f)[0]);
          scales.push_back(uint8_t(h & 0xff));
          scales.push_back(uint8_t(h >> 8));
        }
        break;
      }
    }
    view.data = bytes.data();
    view.scales = scales.empty() ? nullptr : scales.data();
  }
};

struct BackendPair {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = have_gpu() ? make_cuda_backend(0) : nullptr;
  WeightStore store;

  float* up(const std::vector<float>& v, std::vector<DeviceBuffer>& keep) {
    keep.push_back(gpu->alloc(v.size() * 4));
    gpu->to_device(keep.back().data(), v.data(), v.size() * 4);
    return keep.back().as<float>();
  }
  std::vector<float> down(const float* d, size_t n) {
    std::vector<float> h(n);
    gpu->to_host(h.data(), d, n * 4);
    return h;
  }
  float* zeros(size_t n, std::vector<DeviceBuffer>& keep) {
    keep.push_back(gpu->alloc(n * 4));
    gpu->fill_zero(keep.back().as<float>(), int64_t(n));
    return keep.back().as<float>();
  }
};

// Random experts of one encoding, on the host and uploaded.
struct ExpertSet {
  std::vector<std::unique_ptr<HostMatrix>> mats;
  std::vector<ExpertView> host, dev;
  ExpertSet(BackendPair& f, WeightEncoding enc, int64_t n, int64_t H, int64_t I,
            std::mt19937& rng) {
    for (int64_t e = 0; e < n; ++e) {
      for (auto [r, cols] : {std::pair<int64_t, int64_t>{I, H}, {I, H}, {H, I}})
        mats.push_back(std::make_unique<HostMatrix>(enc, r, cols, rng));
      const size_t b = mats.size() - 3;
      host.push_back({mats[b]->view, mats[b + 1]->view, mats[b + 2]->view});
    }
    upload(f);
  }
  // dev = the host experts on the GPU (again after the host bytes change).
  void upload(BackendPair& f) {
    dev.clear();
    for (const ExpertView& h : host)
      dev.push_back({f.gpu->weights(h.gate, f.store), f.gpu->weights(h.up, f.store),
                     f.gpu->weights(h.down, f.store)});
  }
  // The CPU's output for one token routed to ids (router order) with w:
  // the experts in ascending id order.
  std::vector<float> cpu_out(BackendPair& f, const std::vector<int32_t>& ids,
                             const std::vector<float>& w, const std::vector<float>& x, int64_t H,
                             int64_t I) const {
    std::vector<size_t> order(ids.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
    std::vector<ExpertView> hs;
    std::vector<int64_t> offs{0}, toks;
    std::vector<float> ws;
    for (size_t j : order) {
      hs.push_back(host[size_t(ids[j])]);
      toks.push_back(0), ws.push_back(w[j]), offs.push_back(int64_t(toks.size()));
    }
    std::vector<float> ref(size_t(H), 0.0f);
    f.cpu->expert_batch({hs, offs, toks, ws, x.data(), 1, H, I, ref.data()});
    return ref;
  }
};

// Sets an environment variable for a scope (the CUDA backend reads its
// switches when it is made).
class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr, old_ = v ? v : "";
    setenv(name, value.c_str(), 1);
  }
  ~EnvVar() { had_ ? (void)setenv(name_, old_.c_str(), 1) : (void)unsetenv(name_); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  bool had_;
  std::string old_;
};

// Sets the CUDA backend's MoE activations (MOETIER_CUDA_ACT, read when a
// backend is made) and the CPU's MXFP4 activations to one mode; restores both.
class ActMode {
 public:
  // The CPU reference of the GPU's q8 mode: q8 activations for MXFP4
  // weights only (no bf16 activations for bf16 weights, as on AVX-512 BF16 CPUs).
  explicit ActMode(const char* mode)
      : before_(cpu::mxfp4_activations()),
        bf16_before_(cpu::bf16_activations_allowed()),
        env_("MOETIER_CUDA_ACT", mode) {
    cpu::set_mxfp4_activations(mode[0] == 'q' ? cpu::Activations::Q8 : cpu::Activations::F32);
    cpu::allow_bf16_activations(false);
  }
  ~ActMode() {
    cpu::set_mxfp4_activations(before_);
    cpu::allow_bf16_activations(bf16_before_);
  }

 private:
  cpu::Activations before_;
  bool bf16_before_;
  EnvVar env_;
};

}  // namespace moetier::testing
