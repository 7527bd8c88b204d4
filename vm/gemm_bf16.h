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

/* dst[0..n) = src rounded to bf16 as vm_f32_to_bf16 does (16 at a time;
   runs where vm_gemm_bf16_available()) */
void vm_bf16_row(uint16_t *dst, const float *src, int64_t n);

/* Products for kernels that keep f32 sums (attention's Q Kᵀ and P V over
   bf16 operands), on AMX tiles only.  vm_gemm_bf16_amx: the CPU has AMX,
   Linux grants its tile state, KILN_AMX is not 0 and
   vm_gemm_bf16_available(). */
bool vm_gemm_bf16_amx(void);

/* op(B) (k x n, bf16 bits; B row-major with ldb, transposed when tb) as
   panels of 32 columns (n padded to 32 with zero columns), each
   [(k + 1) / 2][32] words: a pair of rows of op(B) per word, low half
   first, a zero pair past k; panel p at dst + p * ((k + 1) / 2) * 32 */
void vm_bf16_panels(uint32_t *dst, const uint16_t *B, int64_t ldb, bool tb, int64_t n, int64_t k);

/* C (mp x np f32, ldc) = A op(B) (+ C when accumulate): A mp x kp bf16
   (lda), mp, kp and np multiples of 32; op(B)'s panels (vm_bf16_panels)
   from bp, panel p at bp + p * panel words, each read for pairs [0, kp /
   2).  Each sum runs over k in tiles of 32, in order (TDPBF16PS). */
void vm_bf16_amx_f32(const uint16_t *A, int64_t lda, int64_t mp, int64_t kp, const uint32_t *bp,
                     int64_t panel, int64_t np, float *C, int64_t ldc, bool accumulate);

#endif
