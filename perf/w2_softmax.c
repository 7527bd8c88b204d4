/* w2_softmax.c — W2: softmax over the rows of a 4096x1024 float32 matrix.
 * Memory bound: 8 bytes per element must move (read x, write the result).
 * Input: x[i] = 4 sin(0.01 i) over the flat index.  Times one softmax. */
#include <stdlib.h>

#include "bench.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 15, 2);
  int64_t shape[2] = {o.smoke ? 64 : 4096, o.smoke ? 128 : 1024}, n = shape[0] * shape[1];
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.01, 0.0, 4.0);
  kiln_tensor *x = bench_input(buf, 2, shape, &o);
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait(); /* time the compiled plan, not the compiler thread */
    kiln_release(out);
    double t0 = bench_now();
    out = kiln_softmax(x, -1);
    bench_force(out);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  char check[512], extra[128];
  bench_summary_tensor(check, sizeof check, out);
  snprintf(extra, sizeof extra, "bytes=%.0f\telems=%lld", (o.bf16 ? 4.0 : 8.0) * (double)n,
           (long long)n);
  bench_result(bench_name("W2", &o), o.label, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(x);
  free(times);
  return 0;
}
