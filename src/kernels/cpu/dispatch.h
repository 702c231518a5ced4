// Which CPU kernel path runs: the portable C++ one or the AVX2+FMA one.
// Auto picks AVX2 when the CPU has AVX2, FMA and F16C. The environment
// variable MOETIER_CPU_KERNELS=portable|avx2|auto, read once at first use,
// forces a path (the test suite runs on each); set_kernel_path overrides it.
// Asking for avx2 on a CPU without it is an Error.
#pragma once

namespace moetier::cpu {

enum class KernelPath { Portable, Avx2 };

KernelPath kernel_path();
void set_kernel_path(KernelPath p);
const char* kernel_path_name(KernelPath p);
bool cpu_has_avx2();  // AVX2 + FMA + F16C

}  // namespace moetier::cpu
