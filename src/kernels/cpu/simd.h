// Function multi-versioning for the hot loops: on x86-64 with GCC, a function
// marked MOETIER_CLONES is compiled for AVX-512 (x86-64-v4), AVX2+FMA
// (x86-64-v3) and the baseline, and the loader picks one for the CPU it runs
// on (ifunc). Elsewhere it is a plain function.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define MOETIER_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MOETIER_CLONES
#endif
