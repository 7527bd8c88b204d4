/* w5_op_chain.c — W5: the cost of an op on a tiny tensor.  A chain of 100
 * scalar ops (x*1.01, then +0.01, 50 times) on a 16-element float32 tensor
 * x[i] = 0.1 i, then the result read back (kiln_to_buffer).  One repetition
 * runs the chain many times; reports seconds per op (chain time / 100). */
#include <stdlib.h>

#include "bench.h"

enum { ELEMS = 16, OPS = 100 };

static double chain(kiln_tensor *x0, float *out) {
  double t0 = bench_now();
  kiln_tensor *x = kiln_retain(x0);
  for (int k = 0; k < OPS; k++) {
    kiln_tensor *next = k % 2 ? kiln_add_scalar(x, 0.01) : kiln_mul_scalar(x, 1.01);
    kiln_release(x);
    x = bench_ok(next, "scalar op");
  }
  bench_ok_status(kiln_to_buffer(x, out, sizeof(float) * ELEMS), "kiln_to_buffer");
  kiln_release(x);
  return bench_now() - t0;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 7, 1);
  int inner = o.smoke ? 1 : 500; /* chains per repetition */
  float init[ELEMS], out[ELEMS];
  for (int i = 0; i < ELEMS; i++) init[i] = (float)(i * 0.1);
  int64_t n = ELEMS;
  kiln_tensor *x0 = bench_ok(kiln_from_data(init, KILN_F32, 1, &n), "x");

  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait(); /* time the compiled plan, not the compiler thread */
    double t = 0;
    for (int i = 0; i < inner; i++) t += chain(x0, out);
    if (r >= 0) times[r] = t / ((double)inner * OPS);
  }
  char check[512], extra[64];
  bench_summary_f32(check, sizeof check, out, ELEMS);
  snprintf(extra, sizeof extra, "ops=%d\tchains=%d", OPS, inner);
  bench_result("W5", o.label, times, o.reps, extra, check);
  kiln_release(x0);
  free(times);
  return 0;
}
