/* cpu.c — CPU feature detection (cpuid through GCC's builtins). */
#include "cpu.h"

#include <string.h>

const char *vm_cpu_isa(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
  if (__builtin_cpu_supports("x86-64-v2")) return "x86-64-v2";
  return "x86-64";
#else
  return "generic";
#endif
}

bool vm_cpu_fma(void) {
  const char *isa = vm_cpu_isa();
  return !strcmp(isa, "x86-64-v3") || !strcmp(isa, "x86-64-v4");
}

const char *vm_cpu_blas_core(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  /* OpenBLAS's SkylakeX kernels need AVX-512 F/BW/DQ/VL (v4 has them all);
     on AMD Zen 4 its own detection falls back to generic Prescott kernels */
  if (__builtin_cpu_supports("x86-64-v4")) return "SkylakeX";
  if (__builtin_cpu_supports("x86-64-v3")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
  return 0;
}
