/* blas.c — finds and loads OpenBLAS at run time.  Unless the user set
 * OPENBLAS_CORETYPE, Kiln sets it from its own CPU detection first: on these
 * machines OpenBLAS's detection picks generic kernels, 4-5x slower. */
#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "state.h"

#ifndef KILN_OPENBLAS_PATH
#define KILN_OPENBLAS_PATH "libopenblas.so.0"
#endif

static vm_blas blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* OPENBLAS_CORETYPE is set when the library loads, before any thread of
   ours exists: setenv while another thread reads the environment (the JIT's
   compiler does, constantly) can crash glibc's getenv */
__attribute__((constructor)) static void blas_choose_core(void) {
  const char *core = vm_cpu_blas_core();
  if (core && !getenv("OPENBLAS_CORETYPE")) setenv("OPENBLAS_CORETYPE", core, 0);
}

/* Without OpenBLAS (a machine with no package for it), matmul still works:
   a plain row-major gemm, far slower, with the same k-ordered sums per
   element of C.  kiln_device_info and KILN_LOG say which one runs. */
#define REFERENCE_GEMM(name, T)                                                                  \
  static void name(int order, int ta, int tb, int m, int n, int k, T alpha, const T *a, int lda, \
                   const T *b, int ldb, T beta, T *c, int ldc) {                                 \
    (void)order;                                                                                 \
    for (int i = 0; i < m; i++) {                                                                \
      T *crow = c + (size_t)i * (size_t)ldc;                                                     \
      for (int j = 0; j < n; j++) crow[j] = beta == 0 ? 0 : beta * crow[j];                      \
      for (int p = 0; p < k; p++) {                                                              \
        T aip = alpha * (ta == VM_BLAS_NO_TRANS ? a[(size_t)i * (size_t)lda + (size_t)p]         \
                                                : a[(size_t)p * (size_t)lda + (size_t)i]);       \
        if (tb == VM_BLAS_NO_TRANS) {                                                            \
          const T *brow = b + (size_t)p * (size_t)ldb;                                           \
          for (int j = 0; j < n; j++) crow[j] += aip * brow[j];                                  \
        } else {                                                                                 \
          for (int j = 0; j < n; j++) crow[j] += aip * b[(size_t)j * (size_t)ldb + (size_t)p];   \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }
REFERENCE_GEMM(reference_sgemm, float)
REFERENCE_GEMM(reference_dgemm, double)

static void use_reference(void) {
  blas.sgemm = reference_sgemm;
  blas.dgemm = reference_dgemm;
  snprintf(blas.core, sizeof blas.core, "reference gemm");
  blas.loaded = true;
  if (getenv("KILN_LOG"))
    fprintf(stderr, "kiln: %s; matmul runs Kiln's reference gemm\n", blas.error);
}

static void blas_load(void) {
  const char *want = getenv("KILN_OPENBLAS");
  if (want && !strcmp(want, "none")) { /* tests run the reference on purpose */
    snprintf(blas.error, sizeof blas.error, "KILN_OPENBLAS=none");
    use_reference();
    return;
  }
  const char *candidates[] = {getenv("KILN_OPENBLAS"), KILN_OPENBLAS_PATH, "libopenblas.so.0",
                              "libopenblas.so"};
  void *h = NULL;
  for (size_t i = 0; !h && i < sizeof candidates / sizeof *candidates; i++)
    if (candidates[i] && *candidates[i]) h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(blas.error, sizeof blas.error, "cannot load OpenBLAS (%s): %s", KILN_OPENBLAS_PATH,
             dlerror());
    use_reference();
    return;
  }
  blas.sgemm = (vm_sgemm_fn)dlsym(h, "cblas_sgemm");
  blas.dgemm = (vm_dgemm_fn)dlsym(h, "cblas_dgemm");
  if (!blas.sgemm || !blas.dgemm) {
    snprintf(blas.error, sizeof blas.error, "OpenBLAS has no cblas_sgemm/cblas_dgemm");
    use_reference();
    return;
  }
  char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
  void (*set_threads)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
  if (corename) snprintf(blas.core, sizeof blas.core, "%s", corename());
  /* one thread: kern_matmul.c runs gemms in blocks on Kiln's pool, so
     that BLAS shares KILN_THREADS with every other kernel */
  if (set_threads) set_threads(1);
  blas.loaded = true;
}

const vm_blas *vm_blas_get(void) {
  pthread_once(&blas_once, blas_load);
  return &blas;
}
