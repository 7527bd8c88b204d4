/* blas.h — OpenBLAS, loaded with dlopen on first use so that Kiln can pick
 * its kernels (OPENBLAS_CORETYPE must be set before the library starts). */
#ifndef VM_BLAS_H
#define VM_BLAS_H

#include <stdbool.h>

typedef void (*vm_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c,
                            int ldc);
typedef void (*vm_dgemm_fn)(int order, int ta, int tb, int m, int n, int k, double alpha,
                            const double *a, int lda, const double *b, int ldb, double beta,
                            double *c, int ldc);

enum { VM_BLAS_ROW_MAJOR = 101, VM_BLAS_NO_TRANS = 111, VM_BLAS_TRANS = 112 };

typedef struct vm_blas {
  bool loaded;
  vm_sgemm_fn sgemm;
  vm_dgemm_fn dgemm;
  char core[64];   /* openblas_get_corename(), "" if unknown */
  char error[256]; /* why it did not load */
} vm_blas;

const vm_blas *vm_blas_get(void); /* loads once; never NULL */

#endif
