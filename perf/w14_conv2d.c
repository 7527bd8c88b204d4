/* w14_conv2d.c — W14: conv2d forward + backward, a ResNet-style 3x3 layer:
 * x [32, 64, 56, 56] f32, w [64, 64, 3, 3], bias [64], stride 1, padding 1;
 * one unit = y = conv2d(x, w, b), backward of sum(y * 1) into x, w and b
 * (all three gradients evaluated).  Inputs: bench_fill_hash (x seed 1,
 * amp 1; w seed 2, amp 0.05; b seed 3, amp 0.1), as peers reproduce. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 5, 2);
  int64_t n = o.smoke ? 2 : 32, c = o.smoke ? 8 : 64, hw = o.smoke ? 12 : 56;
  kiln_tensor *x = bench_tensor_hash(4, (int64_t[]){n, c, hw, hw}, 1, 1.0, 0);
  kiln_tensor *w = bench_tensor_hash(4, (int64_t[]){c, c, 3, 3}, 2, 0.05, 0);
  kiln_tensor *b = bench_tensor_hash(1, (int64_t[]){c}, 3, 0.1, 0);
  bench_ok_status(kiln_set_requires_grad(x, true), "requires_grad");
  bench_ok_status(kiln_set_requires_grad(w, true), "requires_grad");
  bench_ok_status(kiln_set_requires_grad(b, true), "requires_grad");
  int one[2] = {1, 1};
  double *times = calloc((size_t)o.reps, sizeof *times);
  char check[512] = "";
  for (int r = -o.warmup; r < o.reps; r++) {
    if (r == 0) kiln_jit_wait();
    double t0 = bench_now();
    kiln_tensor *y = bench_ok(kiln_conv2d(x, w, b, one, one, one, 1), "conv2d");
    kiln_tensor *l = bench_ok(kiln_sum(y, 0, NULL, false), "sum");
    bench_ok_status(kiln_backward(l, NULL), "backward");
    kiln_tensor *g[3] = {kiln_grad(x), kiln_grad(w), kiln_grad(b)};
    bench_ok_status(kiln_eval(3, g), "eval");
    if (r >= 0) times[r] = bench_now() - t0;
    if (r == o.reps - 1) bench_summary_tensor(check, sizeof check, g[1]);
    for (int i = 0; i < 3; i++) kiln_release(g[i]);
    kiln_zero_grad(x), kiln_zero_grad(w), kiln_zero_grad(b);
    kiln_release(y), kiln_release(l);
  }
  bench_result("W14", o.label, times, o.reps, "", check);
  kiln_release(x), kiln_release(w), kiln_release(b);
  free(times);
  return 0;
}
