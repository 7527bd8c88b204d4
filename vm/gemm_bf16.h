/* gemm_bf16.h — a bf16 x bf16 -> bf16 GEMM with f32 sums, for CPUs with
 * AVX512-BF16, on AMX tiles where the CPU has them (vm/gemm_bf16.c).
 * vm/kern_matmul.c runs a bf16 matmul's tiles through it where
 * vm_gemm_bf16_available(); elsewhere front/ records a bf16 matmul in f32
 * between casts (sgemm). */
#ifndef VM_GEMM_BF16_H
#define VM_GEMM_BF16_H

#include <stdbool.h>
#include <stdint.h>

/* this CPU has AVX512-BF16, KILN_CPU_ISA leaves it AVX-512, and
   KILN_BF16_GEMM is not 0 (asked once per process) */
bool vm_gemm_bf16_available(void);

/* C (m x n, row-major, ldc) = op(A) op(B) over bf16 bit patterns; false
   when its packing buffers cannot be had (no error set: it may run on a
   pool thread; the caller reports it) */
bool vm_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc);

#endif
