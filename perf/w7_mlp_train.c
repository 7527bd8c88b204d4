/* w7_mlp_train.c — W7: one training step of an MLP, batch 512,
 * 784-1024-1024-10, relu, mean cross-entropy, SGD (lr 0.05): steps/s.
 * The kiln rows use a backward pass written by hand from Kiln ops
 * (workloads.c; written when Kiln had no autodiff); with --autodiff the
 * gradients come from kiln_backward instead (row kiln-autodiff).  The first two steps are the
 * warm-up and give the check: the loss of steps 1 and 2 and, per layer, the squared size of step
 * 1's update, sum((W_after - W_before)^2).  Inputs: bench_fill_hash (workloads.c). */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "workloads.h"

static float *copy_out(kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  float *buf = bench_alloc_f32(n);
  bench_ok_status(kiln_to_buffer(t, buf, sizeof *buf * (size_t)n), "kiln_to_buffer");
  return buf;
}

/* sum((after - before)^2) in double, from float32 values as the peers do */
static double delta2(kiln_tensor *after, const float *before) {
  float *a = copy_out(after);
  double s = 0;
  for (int64_t i = 0, n = kiln_numel(after); i < n; i++) {
    double d = (double)a[i] - (double)before[i];
    s += d * d;
  }
  free(a);
  return s;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 9, 0);
  wl_mlp m;
  wl_mlp_init(&m, o.smoke);
  kiln_tensor *(*step)(wl_mlp *) = wl_mlp_step;
  if (o.autodiff) {
    wl_mlp_track(&m);
    step = wl_mlp_step_autodiff;
  }

  kiln_tensor *params[6] = {m.w1, m.b1, m.w2, m.b2, m.w3, m.b3};
  float *before[6];
  for (int i = 0; i < 6; i++) before[i] = copy_out(params[i]);
  kiln_tensor *loss = step(&m);
  double loss1 = kiln_item(loss);
  kiln_release(loss);
  /* kiln_sub_scaled_ rebinds the handles: m.w1 ... now name the new values */
  kiln_tensor *now[6] = {m.w1, m.b1, m.w2, m.b2, m.w3, m.b3};
  double d[6];
  for (int i = 0; i < 6; i++) {
    d[i] = delta2(now[i], before[i]);
    free(before[i]);
  }
  loss = step(&m);
  double loss2 = kiln_item(loss);
  kiln_release(loss);

  for (int r = 0; r < o.warmup; r++) kiln_release(step(&m));
  kiln_jit_wait(); /* time the compiled plans, not the compiler thread */
  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    loss = step(&m);
    bench_force(loss);
    times[r] = bench_now() - t0;
    kiln_release(loss);
  }
  char check[512], extra[256];
  snprintf(check, sizeof check,
           "loss1=%.9g,loss2=%.9g,dw1=%.9g,db1=%.9g,dw2=%.9g,db2=%.9g,dw3=%.9g,db3=%.9g", loss1,
           loss2, d[0], d[1], d[2], d[3], d[4], d[5]);
  snprintf(extra, sizeof extra, "batch=%lld\tnote=%s", (long long)m.batch,
           o.autodiff ? "gradients from kiln_backward (Kiln's autodiff)"
                      : "backward pass hand-written from Kiln ops");
  bench_result("W7", o.label, times, o.reps, extra, check);
  wl_mlp_free(&m);
  free(times);
  return 0;
}
