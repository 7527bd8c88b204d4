/* cpu.c — CPU feature detection (cpuid through GCC's builtins). */
#include "cpu.h"

#include <pthread.h>
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
   never raises it, and an unknown value is ignored.  Read once per
   process: every float math op asks (vm_cpu_fma), and a getenv per op
   was 1% of a GRU's step */
static const char *cpu_isa;
static bool cpu_fma;
static pthread_once_t cpu_isa_once = PTHREAD_ONCE_INIT;

static void cpu_isa_level(void) {
  static const char *const levels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
  const char *isa = detected_isa(), *cap = getenv("KILN_CPU_ISA");
  cpu_isa = isa;
  if (!cap || !strcmp(isa, "generic")) return;
  int have = 0, want = -1;
  for (int i = 0; i < 4; i++) {
    if (!strcmp(isa, levels[i])) have = i;
    if (!strcmp(cap, levels[i])) want = i;
  }
  if (want >= 0 && want < have) cpu_isa = levels[want];
}

static void cpu_isa_init(void) {
  cpu_isa_level();
  cpu_fma = !strcmp(cpu_isa, "x86-64-v3") || !strcmp(cpu_isa, "x86-64-v4");
}

const char *vm_cpu_isa(void) {
  pthread_once(&cpu_isa_once, cpu_isa_init);
  return cpu_isa;
}

bool vm_cpu_fma(void) {
  pthread_once(&cpu_isa_once, cpu_isa_init);
  return cpu_fma;
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
