/* cpu.c — CPU feature detection (cpuid through GCC's builtins). */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

static const char *detected_isa(void) {
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

/* KILN_CPU_ISA=x86-64-vN caps the level (to run an AVX-512 machine as an
   AVX2 one: the JIT's -march, the math variant, the OpenBLAS core); it
   never raises it, and an unknown value is ignored */
const char *vm_cpu_isa(void) {
  static const char *const levels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
  const char *isa = detected_isa(), *cap = getenv("KILN_CPU_ISA");
  if (!cap || !strcmp(isa, "generic")) return isa;
  int have = 0, want = -1;
  for (int i = 0; i < 4; i++) {
    if (!strcmp(isa, levels[i])) have = i;
    if (!strcmp(cap, levels[i])) want = i;
  }
  return want >= 0 && want < have ? levels[want] : isa;
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
  const char *isa = vm_cpu_isa();
  if (!strcmp(isa, "x86-64-v4")) return "SkylakeX";
  if (!strcmp(isa, "x86-64-v3")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
  return 0;
}
