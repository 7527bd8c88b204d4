/* cpu.h — what the processor can do, detected once: the x86-64 ISA level
 * (used for -march= by the JIT) and the OpenBLAS kernel family to ask for. */
#ifndef VM_CPU_H
#define VM_CPU_H

/* "x86-64-v4", "x86-64-v3", "x86-64-v2", "x86-64", or "generic" off x86 */
const char *vm_cpu_isa(void);
/* whether Kiln's f32 math uses explicit fma here: x86-64-v3 and up.  The JIT
   (its -march) and the interpreter (vm/kern_math.c) both ask this, so they
   run the same variant and agree bit for bit */
#include <stdbool.h>
bool vm_cpu_fma(void);
/* OpenBLAS core type matching the ISA ("SkylakeX", "Haswell", "Sandybridge"),
   or NULL to leave OpenBLAS's own choice */
const char *vm_cpu_blas_core(void);

#endif
