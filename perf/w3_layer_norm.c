/* w3_layer_norm.c — W3: layer_norm over the rows of a 4096x1024 float32
 * matrix with weight and bias, eps 1e-5.  Memory bound: 8 bytes per element
 * must move (w and b are 8 KiB).  Inputs: x[i] = 2 sin(0.003 i + 0.2),
 * w[j] = 0.5 sin(0.9 j) (so some weights are negative), b[j] = 0.1 sin(0.45 j + 1). */
#include <stdlib.h>

#include "bench.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 15, 2);
  int64_t shape[2] = {o.smoke ? 64 : 4096, o.smoke ? 128 : 1024}, n = shape[0] * shape[1];
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.003, 0.2, 2.0);
  kiln_tensor *x = bench_input(buf, 2, shape, &o);
  bench_fill_sin(buf, shape[1], 0.9, 0.0, 0.5);
  kiln_tensor *w = bench_input(buf, 1, &shape[1], &o);
  bench_fill_sin(buf, shape[1], 0.45, 1.0, 0.1);
  kiln_tensor *b = bench_input(buf, 1, &shape[1], &o);
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait(); /* time the compiled plan, not the compiler thread */
    kiln_release(out);
    double t0 = bench_now();
    out = kiln_layer_norm(x, w, b, 1e-5);
    bench_force(out);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  char check[512], extra[128];
  bench_summary_tensor(check, sizeof check, out);
  snprintf(extra, sizeof extra, "bytes=%.0f\telems=%lld", (o.bf16 ? 4.0 : 8.0) * (double)n,
           (long long)n);
  bench_result(bench_name("W3", &o), o.label, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(x);
  kiln_release(w);
  kiln_release(b);
  free(times);
  return 0;
}
