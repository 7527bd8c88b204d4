/* g1_elementwise.c — G1: W1's tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25 over
 * x, y of 2^24 float32 on the GPU.  After warm-up the trace's elementwise
 * group runs as one fused kernel (jit_gpu/fuse.h): 12 bytes an element
 * move.  Reports GB/s beside the device's copy bandwidth, measured in the
 * same run as a device-to-device copy of x (kiln_clone) of 8 bytes an
 * element; and how many kernels were built and launched per evaluation. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "workloads.h"

static kiln_tensor *w1(kiln_tensor *x, kiln_tensor *y) {
  kiln_tensor *xy = kiln_mul(x, y), *a = kiln_add_scalar(xy, 0.5), *t = kiln_tanh(a), *s = kiln_sigmoid(x);
  kiln_tensor *ts = kiln_mul(t, s), *yy = kiln_mul(y, y), *q = kiln_mul_scalar(yy, 0.25), *r = kiln_sub(ts, q);
  kiln_tensor *tmp[] = {xy, a, t, s, ts, yy, q};
  for (int i = 0; i < 7; i++) kiln_release(tmp[i]);
  return r;
}

/* evaluates t and waits for the GPU (a one-element read) */
static void wait_for(kiln_tensor *t, int64_t n) {
  kiln_tensor *one = bench_ok(kiln_slice(t, 0, n - 1, n, 1), "element");
  (void)kiln_item(one);
  kiln_release(one);
}

static double timed(kiln_tensor *(*f)(kiln_tensor *, kiln_tensor *), kiln_tensor *x, kiln_tensor *y, int64_t n,
                    const bench_opts *o, double *times, kiln_tensor **last) {
  kiln_tensor *out = NULL;
  for (int r = -o->warmup; r < o->reps; r++) {
    if (r == 0) kiln_jit_wait();
    kiln_release(out);
    double t0 = bench_now();
    out = bench_ok(f(x, y), "G1");
    wait_for(out, n);
    if (r >= 0) times[r] = bench_now() - t0;
  }
  *last = out;
  return bench_median(times, o->reps);
}

static kiln_tensor *copy_x(kiln_tensor *x, kiln_tensor *y) {
  (void)y;
  return kiln_clone(x);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 20, 4);
  if (!kiln_device_available(KILN_CUDA)) {
    bench_na("G1", "kiln-cuda", kiln_device_info(KILN_CUDA));
    return 0;
  }
  int64_t n = o.smoke ? 4096 : (int64_t)1 << 24;
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, W1_X_FREQ, 0.0, 1.0);
  kiln_tensor *hx = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "x");
  bench_fill_sin(buf, n, W1_Y_FREQ, W1_Y_PHASE, W1_Y_AMP);
  kiln_tensor *hy = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "y");
  free(buf);
  kiln_tensor *x = bench_ok(kiln_to_device(hx, KILN_CUDA), "x on the GPU");
  kiln_tensor *y = bench_ok(kiln_to_device(hy, KILN_CUDA), "y on the GPU");
  double *times = calloc((size_t)o.reps, sizeof *times);
  kiln_tensor *copy = NULL, *out = NULL;
  double copy_s = timed(copy_x, x, y, n, &o, times, &copy);
  double copy_gbs = 8.0 * (double)n / copy_s / 1e9;
  double built0 = kiln_stat("kernels_compiled"), launched0 = kiln_stat("kernels_launched");
  double med = timed(w1, x, y, n, &o, times, &out);
  double launches = (kiln_stat("kernels_launched") - launched0) / (o.reps + o.warmup);
  double gbs = 12.0 * (double)n / med / 1e9;
  char extra[256], check[512];
  snprintf(extra, sizeof extra, "gbs=%.1f\tcopy_gbs=%.1f\tof_copy=%.2f\tkernels_built=%.0f\tlaunches_per_eval=%.1f",
           gbs, copy_gbs, gbs / copy_gbs, kiln_stat("kernels_compiled") - built0, launches);
  kiln_tensor *host = bench_ok(kiln_to_device(out, KILN_CPU), "result to the host");
  bench_summary_tensor(check, sizeof check, host);
  bench_result("G1", "kiln-cuda", times, o.reps, extra, check);
  kiln_tensor *all[] = {host, out, copy, x, y, hx, hy};
  for (int i = 0; i < 7; i++) kiln_release(all[i]);
  free(times);
  return 0;
}
