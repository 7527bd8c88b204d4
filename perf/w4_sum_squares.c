/* w4_sum_squares.c — W4: sum(x*x) over x of 2^24 float32, read back as a
 * number.  Memory bound: 4 bytes per element must move (read x once).
 * Input: x[i] = sin(0.001 i).  Times the reduction and reading the result. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 15, 2);
  int64_t n = o.smoke ? 4096 : (int64_t)1 << 24;
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.001, 0.0, 1.0);
  kiln_tensor *x = bench_input(buf, 1, &n, &o);
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  double value = 0;
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait(); /* time the compiled plan, not the compiler thread */
    double t0 = bench_now();
    kiln_tensor *sq = bench_ok(kiln_mul(x, x), "mul");
    kiln_tensor *s = bench_ok(kiln_sum(sq, 0, NULL, false), "sum");
    value = kiln_item(s);
    if (r >= 0) times[r] = bench_now() - t0;
    kiln_release(sq);
    kiln_release(s);
  }
  char check[128], extra[128];
  snprintf(check, sizeof check, "value=%.9g", value);
  snprintf(extra, sizeof extra, "bytes=%.0f\telems=%lld", (o.bf16 ? 2.0 : 4.0) * (double)n,
           (long long)n);
  bench_result(bench_name("W4", &o), o.label, times, o.reps, extra, check);
  kiln_release(x);
  free(times);
  return 0;
}
