/* gemm.h — numpy matmul as gemms: the geometry the CPU interpreter
 * (vm/kern_matmul.c, through OpenBLAS) and the GPU (jit_gpu/blas.c,
 * through cuBLAS) share.  The output's leading dims are the batch (every
 * operand broadcast over it); each operand is a matrix per batch element,
 * read by a row-major BLAS as itself or as a transpose. */
#ifndef VM_GEMM_H
#define VM_GEMM_H

#include "tensor.h"

/* a matrix operand: rows x cols with element strides, per batch element */
typedef struct vm_mat {
  int64_t rows, cols, srow, scol;
  int64_t bstride[KILN_MAX_DIMS]; /* over the output's batch dims */
  const char *base;
} vm_mat;

typedef struct vm_batch {
  int nb;
  int64_t bshape[KILN_MAX_DIMS];
} vm_batch;

/* out = a @ b: the batch, both operands (1-d: a row on the left, a column
   on the right), C = M x N with K the shared dim, nbatch products */
typedef struct vm_gemm_geom {
  vm_batch bat;
  vm_mat a, b;
  int64_t M, N, K, nbatch;
} vm_gemm_geom;

void vm_gemm_geom_of(const vm_tensor *out, const vm_tensor *a, const vm_tensor *b, vm_gemm_geom *g);
/* t as a matrix operand over batch b */
void vm_mat_of(const vm_tensor *t, bool left, const vm_batch *b, vm_mat *m);
/* how a row-major BLAS reads m (trans: as its transpose); false when its
   layout needs a copy */
bool vm_mat_blas_layout(const vm_mat *m, bool *trans, int64_t *ld);
/* whether t, alone, is a matrix a BLAS reads as it is */
bool vm_blas_operand_ok(const vm_tensor *t, bool left);
/* every batch shares b and a's batches are evenly spaced rows: the batch is
   one gemm of M * nbatch rows */
bool vm_gemm_batch_is_rows(const vm_gemm_geom *g);

#endif
