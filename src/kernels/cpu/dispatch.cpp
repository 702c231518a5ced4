#include "kernels/cpu/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace moetier::cpu {
namespace {

KernelPath from_env() {
  const char* v = std::getenv("MOETIER_CPU_KERNELS");
  const std::string s = v ? v : "auto";
  if (s == "portable") return KernelPath::Portable;
  if (s == "avx2") {
    check(cpu_has_avx2(), "MOETIER_CPU_KERNELS=avx2: this CPU lacks AVX2, FMA or F16C");
    return KernelPath::Avx2;
  }
  if (s == "avx512") {
    check(cpu_has_avx512(), "MOETIER_CPU_KERNELS=avx512: this CPU lacks AVX-512 (F, BW, VL, VNNI)");
    return KernelPath::Avx512;
  }
  check(s == "auto" || s.empty(), "MOETIER_CPU_KERNELS: '{}' is not portable, avx2, avx512 or auto",
        s);
  return cpu_has_avx512() ? KernelPath::Avx512
         : cpu_has_avx2() ? KernelPath::Avx2
                          : KernelPath::Portable;
}

std::atomic<int> g_path{-1};
std::atomic<int> g_act{-1};

Activations act_from_env() {
  const char* v = std::getenv("MOETIER_CPU_ACT");
  const std::string s = v ? v : "";
  if (s == "f32") return Activations::F32;
  check(s == "q8" || s.empty(), "MOETIER_CPU_ACT: '{}' is not q8 or f32", s);
  return Activations::Q8;
}

}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
#else
  return false;
#endif
}

bool cpu_has_avx512bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

KernelPath kernel_path() {
  int p = g_path.load(std::memory_order_relaxed);
  if (p < 0) {
    p = int(from_env());
    g_path.store(p, std::memory_order_relaxed);
  }
  return KernelPath(p);
}

void set_kernel_path(KernelPath p) {
  check(p != KernelPath::Avx2 || cpu_has_avx2(),
        "kernel path avx2: this CPU lacks AVX2, FMA or F16C");
  check(p != KernelPath::Avx512 || cpu_has_avx512(),
        "kernel path avx512: this CPU lacks AVX-512 (F, BW, VL, VNNI)");
  g_path.store(int(p), std::memory_order_relaxed);
}

const char* kernel_path_name(KernelPath p) {
  return p == KernelPath::Avx512 ? "avx512" : p == KernelPath::Avx2 ? "avx2" : "portable";
}

}  // namespace moetier::cpu

namespace moetier::cpu {

Activations mxfp4_activations() {
  int a = g_act.load(std::memory_order_relaxed);
  if (a < 0) {
    a = int(act_from_env());
    g_act.store(a, std::memory_order_relaxed);
  }
  return Activations(a);
}

namespace {
std::atomic<bool> g_bf16_allowed{true};
}  // namespace

bool bf16_activations() {
  return g_bf16_allowed.load(std::memory_order_relaxed) && mxfp4_activations() == Activations::Q8 &&
         kernel_path() == KernelPath::Avx512 && cpu_has_avx512bf16();
}

void allow_bf16_activations(bool on) { g_bf16_allowed.store(on, std::memory_order_relaxed); }
bool bf16_activations_allowed() { return g_bf16_allowed.load(std::memory_order_relaxed); }

void set_mxfp4_activations(Activations a) { g_act.store(int(a), std::memory_order_relaxed); }

const char* activations_name(Activations a) { return a == Activations::Q8 ? "q8" : "f32"; }

}  // namespace moetier::cpu
