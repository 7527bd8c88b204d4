/* w6_matmul.c — W6: float32 matmul 1024x1024 @ 1024x1024 (2 GFLOP), reported
 * as GFLOP/s.  With --openblas it also times OpenBLAS's cblas_sgemm called
 * directly on the same data: the same library Kiln loads (dlopen), the same
 * OPENBLAS_CORETYPE (Kiln sets it from its CPU detection unless the user set
 * it), the same thread count, a preallocated output — OpenBLAS at its best.
 * Inputs: A[i] = sin(0.0013 i), B[i] = sin(0.0021 i + 0.7), flat row-major. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

#ifndef KILN_OPENBLAS_PATH
#define KILN_OPENBLAS_PATH "libopenblas.so.0"
#endif

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111 };

static void time_openblas(const bench_opts *o, int64_t n, const float *a, const float *b,
                          double flops) {
  /* the same candidates, in the same order, as Kiln's vm/blas.c */
  const char *candidates[] = {getenv("KILN_OPENBLAS"), KILN_OPENBLAS_PATH, "libopenblas.so.0",
                              "libopenblas.so"};
  void *h = NULL;
  for (size_t i = 0; !h && i < sizeof candidates / sizeof *candidates; i++)
    if (candidates[i] && *candidates[i]) h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
  sgemm_fn sgemm = h ? (sgemm_fn)dlsym(h, "cblas_sgemm") : NULL;
  if (!sgemm) {
    bench_na("W6", "openblas", "cannot load OpenBLAS's cblas_sgemm");
    return;
  }
  void (*set_threads)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
  char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
  int (*get_threads)(void) = (int (*)(void))dlsym(h, "openblas_get_num_threads");
  if (set_threads) set_threads(kiln_num_threads());
  float *c = bench_alloc_f32(n * n);
  double *times = calloc((size_t)o->reps, sizeof *times);
  for (int r = -o->warmup; r < o->reps; r++) {
    if (r == 0) kiln_jit_wait();
    double t0 = bench_now();
    sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)n, (int)n, (int)n, 1.0f, a, (int)n,
          b, (int)n, 0.0f, c, (int)n);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  char check[512], extra[128];
  bench_summary_f32(check, sizeof check, c, n * n);
  snprintf(extra, sizeof extra, "flops=%.0f", flops);
  bench_result_with("W6", "openblas", times, o->reps, extra, check,
                    get_threads ? get_threads() : kiln_num_threads(), kiln_cpu_isa(),
                    corename ? corename() : "unknown");
  free(c);
  free(times);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 15, 2);
  int64_t n = o.smoke ? 64 : 1024, shape[2] = {n, n};
  double flops = 2.0 * (double)n * (double)n * (double)n;
  float *a = bench_alloc_f32(n * n), *b = bench_alloc_f32(n * n);
  bench_fill_sin(a, n * n, 0.0013, 0.0, 1.0);
  bench_fill_sin(b, n * n, 0.0021, 0.7, 1.0);
  kiln_tensor *ta = bench_input(a, 2, shape, &o), *tb = bench_input(b, 2, shape, &o);

  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait();
    kiln_release(out);
    double t0 = bench_now();
    out = kiln_matmul(ta, tb);
    bench_force(out);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  char check[512], extra[128];
  bench_summary_tensor(check, sizeof check, out);
  snprintf(extra, sizeof extra, "flops=%.0f", flops);
  bench_result(bench_name("W6", &o), o.label, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(ta);
  kiln_release(tb);
  free(times);

  if (o.openblas) time_openblas(&o, n, a, b, flops);
  free(a);
  free(b);
  return 0;
}
