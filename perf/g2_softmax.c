/* g2_softmax.c — G2: W2's softmax over the rows of a float32 matrix, at
 * 16384x4096 on the GPU (BENCHMARKS.md: sizes that fill the chip).
 * Memory bound: 8 bytes an element must move (read x, write the result).
 * Input as W2: x[i] = 4 sin(0.01 i) over the flat index.  Reports GB/s
 * beside the copy bandwidth measured in the same run (gpu_bench.h). */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

static kiln_tensor *g2_eval(void *x) { return kiln_softmax(x, -1); }

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 20, 4);
  const char *name = bench_name("G2", &o); /* --bf16: G2h, in bf16 (4 bytes an element) */
  if (!gb_device_ready(&o, name)) return 0;
  int64_t shape[2] = {o.smoke ? 64 : 16384, o.smoke ? 128 : 4096}, n = shape[0] * shape[1];
  int inner = o.smoke ? 2 : 20; /* ~0.2 ms an evaluation on an H100 */
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.01, 0.0, 4.0);
  kiln_tensor *x = gb_on_device(&o, bench_input(buf, 2, shape, &o), "x");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  double copy_gbs = gb_copy_gbs(x, &o, inner);
  kiln_tensor *out = NULL;
  double med = gb_time(g2_eval, x, &o, inner, times, &out);
  double launches = gb_launches(g2_eval, x);
  char bw[256], extra[512], check[512];
  gb_bandwidth_fields(bw, sizeof bw, (o.bf16 ? 4.0 : 8.0) * (double)n, n, med, copy_gbs);
  snprintf(extra, sizeof extra, "%s\tlaunches_per_eval=%.0f", bw, launches);
  bench_summary_tensor(check, sizeof check, out);
  gb_result(name, &o, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(x);
  free(times);
  return 0;
}
