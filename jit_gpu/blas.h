/* blas.h — matmul on the GPU through cuBLAS (libcublas.so.13, loaded at
 * run time; DESIGN §6): numpy matmul semantics as the CPU's
 * vm/kern_matmul.c (1-d operands, broadcast batch dims), f32 and f64, and
 * bf16 and f16 (cublasGemmStridedBatchedEx: f32 sums, rounded once).  A
 * cuBLAS handle per thread bound to that thread's stream (jit_gpu/cuda.h)
 * with its own workspace; transposed operands are passed as flags.  TF32
 * only with KILN_TF32=1. */
#ifndef GPU_BLAS_H
#define GPU_BLAS_H

#include <stdbool.h>

#include "../vm/tensor.h"

/* NULL when cuBLAS loads; otherwise why not */
const char *gpu_blas_unavailable(void);

/* Whether cuBLAS reads operand t as it is: each matrix (the last two dims;
   a 1-d operand is a row on the left, a column on the right) is row-major
   or its transpose, with a leading dimension at least its width (any batch
   strides do).  The caller makes any other operand contiguous first
   (gpu_copy_on_device moves contiguous data only: a strided copy is a
   kernel's job). */
bool gpu_blas_operand_ok(const vm_tensor *t, bool left);

/* out = a @ b on the calling thread's stream.  a, b and out are device
   values of one float dtype (f32, f64, bf16, f16); out is contiguous with the
   matmul's shape (as the CPU interpreter gets it); a and b pass
   gpu_blas_operand_ok.  False + error otherwise: KILN_ERR_INTERNAL for a
   caller's mistake (dtype, layout), KILN_ERR_SHAPE when a dimension
   exceeds cuBLAS's int range, KILN_ERR_DEVICE naming cublasGetStatusName
   for a cuBLAS failure. */
bool gpu_blas_matmul(vm_tensor *out, const vm_tensor *a, const vm_tensor *b);

#endif
