/* g4_sum_squares.c — G4: W4's sum(x*x) over x of 2^27 float32 on the GPU.
 * Memory bound: 4 bytes an element must move (read x once).  Input as W4:
 * x[i] = sin(0.001 i).  Each evaluation is launched and left on the device
 * (as the peers' are); the last one is read as a number, which is the
 * check.  Reports GB/s beside the copy bandwidth measured in the same run. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

static kiln_tensor *g4_eval(void *x) {
  kiln_tensor *sq = kiln_mul(x, x), *s = kiln_sum(sq, 0, NULL, false);
  kiln_release(sq);
  return s;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 20, 4);
  const char *name = bench_name("G4", &o); /* --bf16: G4h, in bf16 (2 bytes an element) */
  if (!gb_device_ready(&o, name)) return 0;
  int64_t n = o.smoke ? 4096 : (int64_t)1 << 27;
  int inner = o.smoke ? 2 : 20; /* ~0.2 ms an evaluation on an H100 */
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.001, 0.0, 1.0);
  kiln_tensor *x = gb_on_device(&o, bench_input(buf, 1, &n, &o), "x");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  double copy_gbs = gb_copy_gbs(x, &o, inner);
  kiln_tensor *out = NULL;
  double med = gb_time(g4_eval, x, &o, inner, times, &out);
  double launches = gb_launches(g4_eval, x);
  char bw[256], extra[512], check[128];
  gb_bandwidth_fields(bw, sizeof bw, (o.bf16 ? 2.0 : 4.0) * (double)n, n, med, copy_gbs);
  snprintf(extra, sizeof extra, "%s\tlaunches_per_eval=%.0f", bw, launches);
  snprintf(check, sizeof check, "value=%.9g", kiln_item(out));
  gb_result(name, &o, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(x);
  free(times);
  return 0;
}
