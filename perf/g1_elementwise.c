/* g1_elementwise.c — G1: W1's tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25 over
 * x, y of 2^27 float32 on the GPU (BENCHMARKS.md: sizes that fill the
 * chip).  After warm-up the trace's elementwise group runs as one fused
 * kernel (jit_gpu/fuse.h): 12 bytes an element move.  Reports GB/s beside
 * the device's copy bandwidth measured in the same run (gpu_bench.h), and
 * how many kernels were built and launched per evaluation.  --bf16 (G1h):
 * the inputs rounded to bf16, every op in bf16 (computed in f32, rounded
 * on store): 6 bytes an element. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"
#include "workloads.h"

typedef struct {
  kiln_tensor *x, *y;
} g1_in;

static kiln_tensor *g1_eval(void *p) {
  const g1_in *in = p;
  return wl_w1(in->x, in->y);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 20, 4);
  const char *name = bench_name("G1", &o);
  if (!gb_device_ready(&o, name)) return 0;
  int64_t n = o.smoke ? 4096 : (int64_t)1 << 27;
  int inner = o.smoke ? 2 : 10; /* ~0.5 ms an evaluation on an H100 */
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, W1_X_FREQ, 0.0, 1.0);
  g1_in in;
  in.x = gb_on_device(&o, bench_input(buf, 1, &n, &o), "x");
  bench_fill_sin(buf, n, W1_Y_FREQ, W1_Y_PHASE, W1_Y_AMP);
  in.y = gb_on_device(&o, bench_input(buf, 1, &n, &o), "y");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  double copy_gbs = gb_copy_gbs(in.x, &o, inner);
  double built0 = kiln_stat("kernels_compiled");
  kiln_tensor *out = NULL;
  double med = gb_time(g1_eval, &in, &o, inner, times, &out);
  double built = kiln_stat("kernels_compiled") - built0, launches = gb_launches(g1_eval, &in);
  char bw[256], extra[512], check[512];
  gb_bandwidth_fields(bw, sizeof bw, (o.bf16 ? 6.0 : 12.0) * (double)n, n, med, copy_gbs);
  snprintf(extra, sizeof extra, "%s\tkernels_built=%.0f\tlaunches_per_eval=%.0f", bw, built,
           launches);
  bench_summary_tensor(check, sizeof check, out);
  gb_result(name, &o, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(in.x);
  kiln_release(in.y);
  free(times);
  return 0;
}
