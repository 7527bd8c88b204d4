/* w1_elementwise.c — W1: tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25 over
 * x, y of 2^24 float32.  Memory bound: 12 bytes per element must move (read
 * x and y, write the result).  Times one evaluation of the expression. */
#include <stdlib.h>

#include "bench.h"
#include "workloads.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 9, 2);
  int64_t n = o.smoke ? 4096 : (int64_t)1 << 24;
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, W1_X_FREQ, 0.0, 1.0);
  kiln_tensor *x = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "x");
  bench_fill_sin(buf, n, W1_Y_FREQ, W1_Y_PHASE, W1_Y_AMP);
  kiln_tensor *y = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "y");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait(); /* time the compiled plan, not the compiler thread */
    kiln_release(out);
    double t0 = bench_now();
    out = wl_w1(x, y);
    bench_force(out);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  char check[512], extra[128];
  bench_summary_tensor(check, sizeof check, out);
  snprintf(extra, sizeof extra, "bytes=%.0f\telems=%lld", 12.0 * (double)n, (long long)n);
  bench_result("W1", o.label, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(x);
  kiln_release(y);
  free(times);
  return 0;
}
