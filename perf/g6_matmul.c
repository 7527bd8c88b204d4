/* g6_matmul.c — G6: float32 matmul 8192^3 on the GPU through Kiln (cuBLAS,
 * TF32 off unless KILN_TF32=1), reported as TFLOP/s beside the same
 * product through torch.matmul, torch.compile and JAX
 * (perf/peers/gpu_peers.py, TF32 off there too).  Each repetition is one
 * product and one read of an element, which waits for the GPU: 4 bytes
 * against a 1.1 TFLOP product.  Inputs: sin fills, as W6.  --bf16 (G6h):
 * the inputs rounded to bf16, a bf16 product (cublasGemmStridedBatchedEx,
 * f32 sums: tensor cores) beside the peers' bf16 matmul. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

typedef struct {
  kiln_tensor *a, *b;
} g6_in;

static kiln_tensor *g6_eval(void *p) {
  const g6_in *in = p;
  return kiln_matmul(in->a, in->b);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 10, 2);
  const char *name = bench_name("G6", &o);
  if (!gb_device_ready(&o, name)) return 0;
  int64_t n = o.smoke ? 256 : 8192, shape[2] = {n, n};
  double flops = 2.0 * (double)n * (double)n * (double)n;
  float *buf = bench_alloc_f32(n * n);
  g6_in in;
  bench_fill_sin(buf, n * n, 0.0013, 0.0, 1.0);
  in.a = gb_on_device(&o, bench_input(buf, 2, shape, &o), "a");
  bench_fill_sin(buf, n * n, 0.0021, 0.7, 1.0);
  in.b = gb_on_device(&o, bench_input(buf, 2, shape, &o), "b");
  free(buf);

  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *out = NULL;
  double med = gb_time(g6_eval, &in, &o, 1, times, &out);
  char extra[160], check[512];
  snprintf(extra, sizeof extra, "flops=%.0f\ttflops=%.1f\ttf32=%s", flops, flops / med / 1e12,
           o.bf16                                                 ? "n/a (bf16)"
           : getenv("KILN_TF32") && getenv("KILN_TF32")[0] == '1' ? "on"
                                                                  : "off");
  bench_summary_tensor(check, sizeof check, out);
  gb_result(name, &o, times, o.reps, extra, check);
  kiln_release(out);
  kiln_release(in.a);
  kiln_release(in.b);
  free(times);
  return 0;
}
