/* blas.c — matmul through cuBLAS, loaded with dlopen (blas.h).  Owns the
 * library's entry points, a handle per thread (kept in cuda.c's thread
 * slot: bound to the thread's stream, with a workspace of its own) and the
 * mapping of numpy matmul onto (strided batched) column-major gemms:
 * row-major C = A B is column-major C^T = B^T A^T, so the operands swap
 * and a row-major matrix is passed as is (a transposed view as OP_T).
 * The batch dims are one strided batch where every operand's batch
 * strides allow it, else a loop over the outer dims (counted as one call). */
#include "blas.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/gemm.h"
#include "../vm/state.h"
#include "cuda.h"

/* ---- the few cuBLAS declarations used (cublas_api.h of CUDA 13) ---- */

typedef struct cublasContext *cublasHandle_t;
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
#define CUBLAS_DEFAULT_MATH 0
#define CUBLAS_TF32_TENSOR_OP_MATH 3
/* library_types.h cudaDataType, cublasComputeType_t, cublasGemmAlgo_t */
#define CUDA_R_16F 2
#define CUDA_R_16BF 14
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_GEMM_DEFAULT (-1)

#define GPU_CUBLAS_SYMBOLS(X)                                                                      \
  X(cublasCreate_v2, cublasStatus_t, (cublasHandle_t * handle))                                    \
  X(cublasDestroy_v2, cublasStatus_t, (cublasHandle_t handle))                                     \
  X(cublasSetStream_v2, cublasStatus_t, (cublasHandle_t handle, void *stream))                     \
  X(cublasSetWorkspace_v2, cublasStatus_t, (cublasHandle_t handle, void *workspace, size_t bytes)) \
  X(cublasSetMathMode, cublasStatus_t, (cublasHandle_t handle, int mode))                          \
  X(cublasGetStatusName, const char *, (cublasStatus_t status))                                    \
  X(cublasSgemmStridedBatched, cublasStatus_t,                                                     \
    (cublasHandle_t handle, int transa, int transb, int m, int n, int k, const float *alpha,       \
     const float *A, int lda, long long stride_a, const float *B, int ldb, long long stride_b,     \
     const float *beta, float *C, int ldc, long long stride_c, int batch))                         \
  X(cublasDgemmStridedBatched, cublasStatus_t,                                                     \
    (cublasHandle_t handle, int transa, int transb, int m, int n, int k, const double *alpha,      \
     const double *A, int lda, long long stride_a, const double *B, int ldb, long long stride_b,   \
     const double *beta, double *C, int ldc, long long stride_c, int batch))                       \
  X(cublasGemmStridedBatchedEx, cublasStatus_t,                                                    \
    (cublasHandle_t handle, int transa, int transb, int m, int n, int k, const void *alpha,        \
     const void *A, int a_type, int lda, long long stride_a, const void *B, int b_type, int ldb,   \
     long long stride_b, const void *beta, void *C, int c_type, int ldc, long long stride_c,       \
     int batch, int compute_type, int algo))

#define GPU_CUBLAS_FIELD(name, ret, params) ret(*name) params;
typedef struct {
  GPU_CUBLAS_SYMBOLS(GPU_CUBLAS_FIELD)
} gpu_cublas_api;
#undef GPU_CUBLAS_FIELD

/* the workspace each thread's handle gets (cuBLAS's advice: 32 MiB on
   Hopper and newer, 4 MiB before) */
#define WORKSPACE_HOPPER ((size_t)32 << 20)
#define WORKSPACE_OLDER ((size_t)4 << 20)

static struct {
  pthread_once_t once;
  const char *unavailable;
  char reason[384];
  void *lib;
  gpu_cublas_api api;
} blas = {.once = PTHREAD_ONCE_INIT};

typedef struct blas_thread {
  cublasHandle_t handle;
  void *workspace;
  size_t workspace_bytes;
  bool tf32; /* the math mode set on handle */
} blas_thread;

static void blas_thread_exit(void *state);

static void blas_load(void) {
  dlerror();
  /* KILN_CUBLAS_LIB: another library in its place (the CUDA emulation of
     tests/gpu_emu) */
  const char *lib = getenv("KILN_CUBLAS_LIB");
  if (!lib || !*lib) lib = "libcublas.so.13";
  blas.lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!blas.lib) {
    const char *err = dlerror();
    snprintf(blas.reason, sizeof blas.reason, "no cuBLAS (%s)", err ? err : "cannot be loaded");
    blas.unavailable = blas.reason;
    return;
  }
  void *fn;
#define GPU_CUBLAS_RESOLVE(name, ret, params)                              \
  if (!(fn = dlsym(blas.lib, #name))) {                                    \
    snprintf(blas.reason, sizeof blas.reason, "%s has no %s", lib, #name); \
    blas.unavailable = blas.reason;                                        \
    return;                                                                \
  }                                                                        \
  memcpy(&blas.api.name, &fn, sizeof fn);
  GPU_CUBLAS_SYMBOLS(GPU_CUBLAS_RESOLVE)
#undef GPU_CUBLAS_RESOLVE
  gpu_set_blas_thread_exit(blas_thread_exit);
}

const char *gpu_blas_unavailable(void) {
  pthread_once(&blas.once, blas_load);
  return blas.unavailable;
}

/* true on success; else KILN_ERR_DEVICE "<what> failed: CUBLAS_STATUS_..." */
static bool cublas_ok(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  const char *name = blas.api.cublasGetStatusName ? blas.api.cublasGetStatusName(st) : NULL;
  if (name)
    vm_error(KILN_ERR_DEVICE, "%s failed: %s", what, name);
  else
    vm_error(KILN_ERR_DEVICE, "%s failed: cuBLAS status %d", what, (int)st);
  return false;
}

/* ---- the per-thread handle ---- */

static void blas_thread_free(blas_thread *bt) {
  if (bt->handle) (void)blas.api.cublasDestroy_v2(bt->handle); /* waits for the device */
  gpu_mem_free(bt->workspace, bt->workspace_bytes);
  free(bt);
}

static void blas_thread_exit(void *state) { blas_thread_free(state); }

/* The calling thread's handle: made on first use, bound to the thread's
   stream, with its workspace and math mode.  NULL + error. */
static blas_thread *blas_thread_get(void) {
  const char *why = gpu_blas_unavailable();
  if (why) {
    vm_error(KILN_ERR_DEVICE, "cuBLAS is not available: %s", why);
    return NULL;
  }
  void **slot = gpu_thread_blas_slot();
  if (!slot) return NULL;
  if (*slot) return *slot;
  void *stream = gpu_stream();
  blas_thread *bt = stream ? calloc(1, sizeof *bt) : NULL;
  if (!bt) {
    if (stream) vm_error(KILN_ERR_OOM, "out of host memory creating a cuBLAS handle");
    return NULL;
  }
  bt->workspace_bytes = gpu_compute_capability() >= 90 ? WORKSPACE_HOPPER : WORKSPACE_OLDER;
  bool ok = cublas_ok(blas.api.cublasCreate_v2(&bt->handle), "cublasCreate");
  if (!ok) bt->handle = NULL;
  /* SetStream resets the workspace to cuBLAS's own pool: set it after */
  ok = ok && cublas_ok(blas.api.cublasSetStream_v2(bt->handle, stream), "cublasSetStream");
  ok = ok && (bt->workspace = gpu_mem_alloc(bt->workspace_bytes)) != NULL;
  ok = ok &&
       cublas_ok(blas.api.cublasSetWorkspace_v2(bt->handle, bt->workspace, bt->workspace_bytes),
                 "cublasSetWorkspace");
  bt->tf32 = atomic_load(&vm_process()->tf32);
  ok = ok && cublas_ok(blas.api.cublasSetMathMode(
                           bt->handle, bt->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                       "cublasSetMathMode");
  if (!ok) {
    blas_thread_free(bt);
    return NULL;
  }
  *slot = bt;
  return bt;
}

/* ---- numpy matmul as gemms (the geometry is vm/gemm.h's) ---- */

bool gpu_blas_operand_ok(const vm_tensor *t, bool left) {
  return t && t->ndim >= 1 && vm_blas_operand_ok(t, left);
}

/* offset (elements) of flat index `flat` over batch dims [from, to) */
static int64_t batch_offset(const vm_batch *b, const int64_t *strides, int from, int to,
                            int64_t flat) {
  int64_t off = 0;
  for (int d = to - 1; d >= from; d--) {
    off += (flat % b->bshape[d]) * strides[d];
    flat /= b->bshape[d];
  }
  return off;
}

/* whether batch dims [from, nb) step through m as one stride (into *step):
   element i of their flattening at i * step */
static bool uniform_batch(const vm_batch *b, const int64_t *strides, int from, int64_t *step) {
  int64_t unit = 0, span = 1;
  bool have = false;
  for (int d = b->nb - 1; d >= from; d--) {
    if (b->bshape[d] == 1) continue;
    if (!have) {
      unit = strides[d];
      have = true;
    } else if (strides[d] != unit * span) {
      return false;
    }
    span *= b->bshape[d];
  }
  *step = unit;
  return true;
}

typedef struct {
  blas_thread *bt;
  kiln_dtype dt;
  bool ta, tb;
  int64_t M, N, K, lda, ldb, es;
} gemm_call;

/* count products C_i = A_i B_i, A_i = A + i*sa (elements), ... */
static bool gemm(const gemm_call *g, int64_t M, const char *A, int64_t sa, const char *B,
                 int64_t sb, char *C, int64_t count) {
  if (M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
      count > INT_MAX) {
    vm_error(KILN_ERR_SHAPE,
             "matrix dimensions %lld x %lld x %lld (batch %lld) exceed cuBLAS's int range",
             (long long)M, (long long)g->K, (long long)g->N, (long long)count);
    return false;
  }
  /* column-major C^T (N x M) = op(B)^T (N x K) * op(A)^T (K x M) */
  int opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int n = (int)g->N, m = (int)M, k = (int)g->K, ldc = g->N > 1 ? (int)g->N : 1;
  long long sc = (long long)(M * g->N);
  if (g->dt == KILN_F32) {
    bool tf32 = atomic_load_explicit(&vm_process()->tf32, memory_order_relaxed);
    if (tf32 != g->bt->tf32) { /* kiln_set_matmul_precision changed it */
      if (!cublas_ok(blas.api.cublasSetMathMode(
                         g->bt->handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                     "cublasSetMathMode"))
        return false;
      g->bt->tf32 = tf32;
    }
    const float one = 1.0f, zero = 0.0f;
    return cublas_ok(blas.api.cublasSgemmStridedBatched(
                         g->bt->handle, opb, opa, n, m, k, &one, (const float *)B, (int)g->ldb, sb,
                         (const float *)A, (int)g->lda, sa, &zero, (float *)C, ldc, sc, (int)count),
                     "cublasSgemmStridedBatched");
  }
  if (g->dt == KILN_BF16 || g->dt == KILN_F16) {
    /* 16-bit operands and result, f32 sums (tensor cores), the result
       rounded once: what the CPU computes in f32 between casts */
    const float one = 1.0f, zero = 0.0f;
    int t = g->dt == KILN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    return cublas_ok(blas.api.cublasGemmStridedBatchedEx(g->bt->handle, opb, opa, n, m, k, &one, B,
                                                         t, (int)g->ldb, sb, A, t, (int)g->lda, sa,
                                                         &zero, C, t, ldc, sc, (int)count,
                                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx");
  }
  const double one = 1.0, zero = 0.0;
  return cublas_ok(blas.api.cublasDgemmStridedBatched(
                       g->bt->handle, opb, opa, n, m, k, &one, (const double *)B, (int)g->ldb, sb,
                       (const double *)A, (int)g->lda, sa, &zero, (double *)C, ldc, sc, (int)count),
                   "cublasDgemmStridedBatched");
}

static bool bad_operand(const char *which, const vm_tensor *t) {
  char shape[VM_SHAPE_BUF], strides[VM_SHAPE_BUF];
  vm_error(KILN_ERR_INTERNAL,
           "gpu_blas_matmul: operand %s (shape %s, strides %s) is neither row-major nor a "
           "transpose: make it "
           "contiguous first",
           which, vm_shape_str(shape, t->ndim, t->shape),
           vm_shape_str(strides, t->ndim, t->strides));
  return false;
}

bool gpu_blas_matmul(vm_tensor *out, const vm_tensor *at, const vm_tensor *bt) {
  kiln_dtype dt = out->dtype;
  if (!vm_dtype_is_float(dt) || at->dtype != dt || bt->dtype != dt) {
    vm_error(KILN_ERR_INTERNAL,
             "gpu_blas_matmul: cuBLAS multiplies float operands of the output's dtype");
    return false;
  }
  if (at->ndim < 1 || bt->ndim < 1 || !vm_is_contiguous(out)) {
    vm_error(KILN_ERR_INTERNAL,
             "gpu_blas_matmul: needs operands of at least one dim and a contiguous output");
    return false;
  }
  vm_gemm_geom geo;
  vm_gemm_geom_of(out, at, bt, &geo);
  const vm_batch bat = geo.bat;
  const vm_mat a = geo.a, b = geo.b;
  int64_t M = geo.M, N = geo.N, K = geo.K, nbatch = geo.nbatch;
  int64_t es = (int64_t)vm_dtype_size(dt);
  if (out->numel == 0) return true;
  if (K == 0) return gpu_mem_zero(vm_data(out), (size_t)(out->numel * es));
  gemm_call g = {NULL, dt, false, false, M, N, K, 0, 0, es};
  if (!vm_mat_blas_layout(&a, &g.ta, &g.lda)) return bad_operand("a", at);
  if (!vm_mat_blas_layout(&b, &g.tb, &g.ldb)) return bad_operand("b", bt);
  if (!(g.bt = blas_thread_get())) return false;
  char *c = vm_data(out);
  /* one matmul, one BLAS call in the count (kiln.h), however many strided
     batches its outer broadcast dims take below */
  atomic_fetch_add_explicit(&vm_process()->stats.blas_calls, 1, memory_order_relaxed);

  /* every batch shares b and a's batches are evenly spaced rows: one gemm */
  if (vm_gemm_batch_is_rows(&geo) && M * nbatch <= INT_MAX) {
    g.ta = false;
    g.lda = K;
    return gemm(&g, M * nbatch, a.base, 0, b.base, 0, c, 1);
  }

  /* the longest run of inner batch dims that is one stride for a and b
     goes to one strided batched call; the outer dims loop here */
  int from = 0;
  int64_t sa = 0, sb = 0, inner = 1;
  while (from < bat.nb &&
         !(uniform_batch(&bat, a.bstride, from, &sa) && uniform_batch(&bat, b.bstride, from, &sb)))
    from++;
  if (from == bat.nb) sa = sb = 0;
  for (int d = from; d < bat.nb; d++) inner *= bat.bshape[d];
  int64_t outer = nbatch / inner;
  for (int64_t o = 0; o < outer; o++) {
    const char *A = a.base + batch_offset(&bat, a.bstride, 0, from, o) * es;
    const char *B = b.base + batch_offset(&bat, b.bstride, 0, from, o) * es;
    char *C = c + o * inner * M * N * es;
    if (!gemm(&g, M, A, sa, B, sb, C, inner)) return false;
  }
  return true;
}
