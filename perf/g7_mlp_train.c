/* g7_mlp_train.c — G7: W7's training step on the GPU: an MLP 784-1024-1024-10,
 * batch 512, relu, mean cross-entropy, SGD (lr 0.05), the model code of W7
 * (workloads.c) with its inputs and parameters moved to the device.  Row
 * kiln: the backward pass written by hand from Kiln ops; --autodiff (row
 * kiln-autodiff): gradients from kiln_backward, like PyTorch's autograd and
 * jax.grad.  Steps 1 and 2 give W7's check; then steps are timed launched
 * back to back (each forced with kiln_sync), one wait (the loss read) after
 * the last (gpu_bench.h): ms per step.  --bf16 (G7h): W7h's recipe on the
 * GPU, under kiln_set_autocast(KILN_BF16) (GEMMs in bf16 through cuBLAS's
 * GemmEx, f32 parameters), gradients from kiln_backward. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"
#include "workloads.h"

static kiln_tensor *step_by_hand(void *m) { return wl_mlp_step(m); }
static kiln_tensor *step_autodiff(void *m) { return wl_mlp_step_autodiff(m); }

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 10, 4);
  const char *name = bench_name("G7", &o);
  if (!gb_device_ready(&o, name)) return 0;
  if (o.bf16) {
    bench_ok_status(kiln_set_autocast(KILN_BF16), "kiln_set_autocast");
    o.autodiff = true;
  }
  int inner = o.smoke ? 2 : 20; /* steps per repetition */
  wl_mlp m;
  wl_mlp_init(&m, o.smoke);
  wl_mlp_to_device(&m, o.device);
  if (o.autodiff) wl_mlp_track(&m);

  char check[512], extra[512];
  wl_mlp_check(&m, o.autodiff ? wl_mlp_step_autodiff : wl_mlp_step, check, sizeof check);
  gb_eval step = o.autodiff ? step_autodiff : step_by_hand;
  double *times = calloc((size_t)o.reps, sizeof *times);
  double blas0 = kiln_stat("blas_calls");
  (void)gb_time(step, &m, &o, inner, times, NULL);
  double steps = o.warmup + (double)o.reps * inner;
  double blas = (kiln_stat("blas_calls") - blas0) / steps, launches = gb_launches(step, &m);
  double waits = gb_waits(step, &m);
  snprintf(extra, sizeof extra,
           "batch=%lld\tsteps=%d\tlaunches_per_step=%.0f\twaits_per_step=%.0f\tgemm_per_step=%."
           "1f\tnote=%s",
           (long long)m.batch, inner, launches, waits, blas,
           o.bf16       ? "bf16 autocast: GEMMs in bf16, f32 parameters, kiln_backward"
           : o.autodiff ? "gradients from kiln_backward (Kiln's autodiff)"
                        : "backward pass hand-written from Kiln ops");
  gb_result(name, &o, times, o.reps, extra, check);
  wl_mlp_free(&m);
  free(times);
  return 0;
}
