/* gemm_f32.h — Kiln's own f32 GEMM for short products (and taller ones of
 * short K) on AVX2 and AVX-512 CPUs
 * (vm/gemm_f32.c), and the operands a rolled loop holds fixed, packed once
 * for every step.  vm/kern_matmul.c runs an f32 matmul's tiles through it
 * where vm_gemm_f32_takes(); OpenBLAS elsewhere. */
#ifndef VM_GEMM_F32_H
#define VM_GEMM_F32_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vm_storage;

/* whether C (M x N) = op(A) op(B) over K runs here: this CPU runs
   x86-64-v3 or v4 (KILN_CPU_ISA may lower it), KILN_F32_GEMM is not 0,
   and the shape is one it runs faster than OpenBLAS (a function of M, N,
   K and the ISA level alone, so every tile, thread count and mode of a
   product takes the same path) */
bool vm_gemm_f32_takes(int64_t M, int64_t N, int64_t K, bool ta);

/* floats op(B) (k x n) takes as panels of 32 columns (AVX-512; 16 with
   AVX2): n rounded up to the panel width, times k */
size_t vm_f32_panels_size(int64_t n, int64_t k);

/* op(B) (k x n; B row-major with ldb, transposed when tb) as panels of w
   = 32 columns (16 with AVX2; the last padded with zero columns), each
   [k][w]: panel p at dst + p * k * w */
void vm_f32_panels(float *dst, const float *B, int64_t ldb, bool tb, int64_t n, int64_t k);

/* C (m x n, row-major, ldc) = op(A) op(B), op(A) m x k: A row-major
   (lda), or its transpose when ta (A then k x m, row-major).  Every
   element is one chain of fused multiply-adds over k in order, from +0
   (c = fma(a[i][k], b[k][j], c)): its bits depend on k and the values
   alone.  panels: op(B)'s columns [0, n) packed (vm_f32_panels), or NULL
   to pack them here; false when packing memory cannot be had (no error
   set: it may run on a pool thread) */
bool vm_gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, const float *panels);

/* --- operands fixed while a loop runs ---
   A rolled loop (trace/loop.c) reads its invariant values (the weights)
   in every step.  Between vm_gemm_fixed_begin and _end on this thread it
   names their storages fixed (their bytes cannot change while it holds
   them); a product whose right operand lies in a fixed storage packs it
   once, and every later step with the same view reads those panels.
   Frames nest (a loop in a segment around another). */
void vm_gemm_fixed_begin(void);
void vm_gemm_fixed_add(const struct vm_storage *s);
void vm_gemm_fixed_end(void);
/* op(B)'s panels when B (within storage s) is fixed, packed now or by an
   earlier step; NULL when it is not fixed or memory runs out */
const float *vm_gemm_fixed_panels(const struct vm_storage *s, const float *B, int64_t ldb, bool tb,
                                  int64_t n, int64_t k);

#endif
