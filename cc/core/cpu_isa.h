// Which vector instruction set the CPU engine's element loops use, chosen once per process.
//
// The library is compiled for the x86-64 baseline (SSE2), so it loads on any x86-64 CPU;
// the element loop (engine.h, UpdateSpan) is compiled a second time for AVX2 and used where
// the CPU has it. Results are bit-identical either way (no FMA, no reassociation: each lane
// does the baseline's operations), so this is a speed choice only.
// FUSEDOPT_CPU_ISA=baseline forces the baseline loop (comparisons, tests).
#pragma once

#include <cstdlib>
#include <cstring>

// GCC and clang on x86-64 host code; nvcc's host passes keep the baseline loop (they never
// run the CPU engine's loops).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define FUSEDOPT_CPU_DISPATCH 1
#else
#define FUSEDOPT_CPU_DISPATCH 0
#endif

// Before a loop whose pointers never overlap (each a separate buffer: the ops check or
// separate them first), so that GCC vectorises it without run-time overlap checks, whose
// count it caps: restrict parameters do not survive always_inline.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define FO_LOOP_NO_ALIAS _Pragma("GCC ivdep")
#else
#define FO_LOOP_NO_ALIAS
#endif

#if defined(__GNUC__)
#define FO_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FO_ALWAYS_INLINE inline
#endif

namespace fusedopt {

enum class VectorIsa { kBaseline, kAvx2 };

inline VectorIsa DetectCpuVectorIsa() {
  const char* forced = std::getenv("FUSEDOPT_CPU_ISA");
  if (forced != nullptr && std::strcmp(forced, "baseline") == 0) return VectorIsa::kBaseline;
#if FUSEDOPT_CPU_DISPATCH
  if (__builtin_cpu_supports("avx2")) return VectorIsa::kAvx2;
#endif
  return VectorIsa::kBaseline;
}

// Read once (the first update of the process), then fixed.
inline VectorIsa CpuVectorIsa() {
  static const VectorIsa isa = DetectCpuVectorIsa();
  return isa;
}

inline const char* VectorIsaName(VectorIsa isa) {
  return isa == VectorIsa::kAvx2 ? "avx2" : "baseline";
}

}  // namespace fusedopt
