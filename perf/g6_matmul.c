/* g6_matmul.c — G6: float32 matmul 8192^3 on the GPU through Kiln (cuBLAS,
 * TF32 off unless KILN_TF32=1), reported as TFLOP/s beside the same
 * product through torch.matmul (perf/peers/g6_matmul_torch.py, run by
 * scripts/gpu-check).  Each timed repetition evaluates the product and
 * reads one element back, which waits for the GPU: the read of 4 bytes is
 * noise against a 1.1 TFLOP product.  Inputs: sin fills, as W6. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 10, 2);
  if (!kiln_device_available(KILN_CUDA)) {
    bench_na("G6", "kiln-cuda", kiln_device_info(KILN_CUDA));
    return 0;
  }
  int64_t n = o.smoke ? 256 : 8192, shape[2] = {n, n};
  double flops = 2.0 * (double)n * (double)n * (double)n;
  float *a = bench_alloc_f32(n * n), *b = bench_alloc_f32(n * n);
  bench_fill_sin(a, n * n, 0.0013, 0.0, 1.0);
  bench_fill_sin(b, n * n, 0.0021, 0.7, 1.0);
  kiln_tensor *ha = bench_ok(kiln_from_data(a, KILN_F32, 2, shape), "a");
  kiln_tensor *hb = bench_ok(kiln_from_data(b, KILN_F32, 2, shape), "b");
  kiln_tensor *ta = bench_ok(kiln_to_device(ha, KILN_CUDA), "a on the GPU");
  kiln_tensor *tb = bench_ok(kiln_to_device(hb, KILN_CUDA), "b on the GPU");
  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  for (int r = -o.warmup; r < o.reps; r++) {
    kiln_release(out);
    double t0 = bench_now();
    out = bench_ok(kiln_matmul(ta, tb), "matmul");
    kiln_tensor *row = bench_ok(kiln_slice(out, 0, n - 1, n, 1), "row");
    kiln_tensor *one = bench_ok(kiln_slice(row, 1, n - 1, n, 1), "element");
    (void)kiln_item(one); /* waits for the GPU */
    kiln_release(one), kiln_release(row);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  double med = bench_median(times, o.reps);
  char extra[160];
  snprintf(extra, sizeof extra, "flops=%.0f\ttflops=%.1f\tdevice=%s", flops, flops / med / 1e12,
           kiln_device_info(KILN_CUDA));
  char check[512];
  kiln_tensor *host = bench_ok(kiln_to_device(out, KILN_CPU), "result to the host");
  bench_summary_tensor(check, sizeof check, host);
  bench_result("G6", "kiln-cuda", times, o.reps, extra, check);
  kiln_release(host), kiln_release(out), kiln_release(ta), kiln_release(tb), kiln_release(ha), kiln_release(hb);
  free(times), free(a), free(b);
  return 0;
}
