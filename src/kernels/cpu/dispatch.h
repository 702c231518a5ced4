// Which CPU kernel path runs: the portable C++ one or the AVX2+FMA one.
// Auto picks AVX2 when the CPU has AVX2, FMA and F16C. The environment
// variable MOETIER_CPU_KERNELS=portable|avx2|auto, read once at first use,
// forces a path (the test suite runs on each); set_kernel_path overrides it.
// Asking for avx2 on a CPU without it is an Error.
//
// Activations of MXFP4 matmuls: q8 (default; int8 blocks of 32 with one
// scale, integer dot products, kernels/cpu/q8.h) or f32 (exact: the canonical
// f32 order of kernels/cpu/tile.h, what the golden tests pin).
// MOETIER_CPU_ACT=q8|f32, read once at first use; set_mxfp4_activations
// overrides it. bf16, f32 and cb3 weights always take f32 activations.
#pragma once

namespace moetier::cpu {

enum class KernelPath { Portable, Avx2 };

KernelPath kernel_path();
void set_kernel_path(KernelPath p);
const char* kernel_path_name(KernelPath p);
bool cpu_has_avx2();  // AVX2 + FMA + F16C

enum class Activations { F32, Q8 };

Activations mxfp4_activations();
void set_mxfp4_activations(Activations a);
const char* activations_name(Activations a);

}  // namespace moetier::cpu
