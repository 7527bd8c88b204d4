/* g3_layer_norm.c — G3: W3's layer_norm over the rows of a float32 matrix
 * with weight and bias, eps 1e-5, at 16384x4096 on the GPU.  Memory bound:
 * 8 bytes an element must move (w and b are 16 KiB each).  Inputs as W3:
 * x[i] = 2 sin(0.003 i + 0.2), w[j] = 0.5 sin(0.9 j), b[j] = 0.1 sin(0.45 j + 1).
 * Reports GB/s beside the copy bandwidth measured in the same run. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

typedef struct {
  kiln_tensor *x, *w, *b;
} g3_in;

static kiln_tensor *g3_eval(void *p) {
  const g3_in *in = p;
  return kiln_layer_norm(in->x, in->w, in->b, 1e-5);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 20, 4);
  const char *name = bench_name("G3", &o); /* --bf16: G3h, in bf16 (4 bytes an element) */
  if (!gb_device_ready(&o, name)) return 0;
  int64_t shape[2] = {o.smoke ? 64 : 16384, o.smoke ? 128 : 4096}, n = shape[0] * shape[1];
  int inner = o.smoke ? 2 : 20; /* ~0.2 ms an evaluation on an H100 */
  float *buf = bench_alloc_f32(n);
  g3_in in;
  bench_fill_sin(buf, n, 0.003, 0.2, 2.0);
  in.x = gb_on_device(&o, bench_input(buf, 2, shape, &o), "x");
  bench_fill_sin(buf, shape[1], 0.9, 0.0, 0.5);
  in.w = gb_on_device(&o, bench_input(buf, 1, &shape[1], &o), "w");
  bench_fill_sin(buf, shape[1], 0.45, 1.0, 0.1);
  in.b = gb_on_device(&o, bench_input(buf, 1, &shape[1], &o), "b");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  double copy_gbs = gb_copy_gbs(in.x, &o, inner);
  kiln_tensor *out = NULL;
  double med = gb_time(g3_eval, &in, &o, inner, times, &out);
  double launches = gb_launches(g3_eval, &in);
  char bw[256], extra[512], check[512];
  gb_bandwidth_fields(bw, sizeof bw, (o.bf16 ? 4.0 : 8.0) * (double)n, n, med, copy_gbs);
  snprintf(extra, sizeof extra, "%s\tlaunches_per_eval=%.0f", bw, launches);
  bench_summary_tensor(check, sizeof check, out);
  gb_result(name, &o, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(in.x);
  kiln_release(in.w);
  kiln_release(in.b);
  free(times);
  return 0;
}
