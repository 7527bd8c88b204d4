/* w7_mlp_train.c — W7: one training step of an MLP, batch 512,
 * 784-1024-1024-10, relu, mean cross-entropy, SGD (lr 0.05): steps/s.
 * The kiln rows use a backward pass written by hand from Kiln ops
 * (workloads.c; written when Kiln had no autodiff); with --autodiff the
 * gradients come from kiln_backward instead (row kiln-autodiff).  The first two steps are the
 * warm-up and give the check: the loss of steps 1 and 2 and, per layer, the squared size of step
 * 1's update, sum((W_after - W_before)^2).  Inputs: bench_fill_hash (workloads.c).
 * --bf16 (W7h): the same step in bf16 mixed precision, PyTorch's CPU recipe:
 * under kiln_set_autocast(KILN_BF16) the GEMMs take bf16 operands and give
 * bf16 results (f32 accumulation), the f32 biases bring each layer back to
 * f32, the parameters and their gradients stay f32; gradients from
 * kiln_backward. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "workloads.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 9, 0);
  wl_mlp m;
  wl_mlp_init(&m, o.smoke);
  kiln_tensor *(*step)(wl_mlp *) = wl_mlp_step;
  if (o.bf16) bench_ok_status(kiln_set_autocast(KILN_BF16), "kiln_set_autocast");
  if (o.autodiff || o.bf16) {
    wl_mlp_track(&m);
    step = wl_mlp_step_autodiff;
  }

  char check[512], extra[256];
  wl_mlp_check(&m, step, check, sizeof check);

  for (int r = 0; r < o.warmup; r++) kiln_release(step(&m));
  kiln_jit_wait(); /* time the compiled plans, not the compiler thread */
  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    kiln_tensor *loss = step(&m);
    bench_force(loss);
    times[r] = bench_now() - t0;
    kiln_release(loss);
  }
  snprintf(extra, sizeof extra, "batch=%lld\tnote=%s", (long long)m.batch,
           o.bf16       ? "bf16 autocast: GEMMs in bf16, f32 parameters, kiln_backward"
           : o.autodiff ? "gradients from kiln_backward (Kiln's autodiff)"
                        : "backward pass hand-written from Kiln ops");
  bench_result(bench_name("W7", &o), o.label, times, o.reps, extra, check);
  wl_mlp_free(&m);
  free(times);
  return 0;
}
