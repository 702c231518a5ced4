// Which CPU kernel path runs: the portable C++ one, the AVX2+FMA one, or the
// AVX-512 one (the f32-activation matmuls 16 columns at a time, in an order
// of their own; everything else as on the AVX2 path). Auto picks the widest
// the CPU has (AVX-512 F, BW, VL and VNNI on top of AVX2, FMA and F16C); the
// q8 matmuls run there with VNNI and give the AVX2 path's bits. The environment
// variable MOETIER_CPU_KERNELS=portable|avx2|avx512|auto, read once at first
// use, forces a path (the test suite runs on each); set_kernel_path overrides
// it. Asking for a path the CPU lacks is an Error.
//
// Activations of MXFP4 matmuls: q8 (default; int8 blocks of 32 with one
// scale, integer dot products, kernels/cpu/q8.h) or f32 (exact: the canonical
// f32 order of kernels/cpu/tile.h, what the golden tests pin).
// MOETIER_CPU_ACT=q8|f32, read once at first use; set_mxfp4_activations
// overrides it. In the q8 mode bf16 weights take bf16 activations on the
// avx512 path of a CPU with AVX-512 BF16 (kernels/cpu/bf16.h); otherwise they,
// f32 and cb3 weights take f32 activations.
#pragma once

namespace moetier::cpu {

enum class KernelPath { Portable, Avx2, Avx512 };

KernelPath kernel_path();
void set_kernel_path(KernelPath p);
const char* kernel_path_name(KernelPath p);
bool cpu_has_avx2();        // AVX2 + FMA + F16C
bool cpu_has_avx512();      // those and AVX-512 F, BW, VL, VNNI
bool cpu_has_avx512bf16();  // those and AVX-512 BF16
// The AVX2 kernels (attention, q8, cb3 decoding) run on both vector paths.
inline bool vector_path(KernelPath p) { return p != KernelPath::Portable; }

enum class Activations { F32, Q8 };

Activations mxfp4_activations();
// bf16 weights take bf16 activations (kernels/cpu/bf16.h): the q8 mode on the
// avx512 path of a CPU with AVX-512 BF16.
bool bf16_activations();
// false: bf16 weights keep f32 activations in the q8 mode too (the CUDA
// backend's q8 mode quantizes only MXFP4 experts' activations: its tests
// compare against this CPU mode). Process-wide; default true.
void allow_bf16_activations(bool on);
bool bf16_activations_allowed();
void set_mxfp4_activations(Activations a);
const char* activations_name(Activations a);

}  // namespace moetier::cpu
