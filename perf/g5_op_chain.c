/* g5_op_chain.c — G5: W5's chain of 100 scalar ops (x*1.01, then +0.01,
 * 50 times) on a 16-element float32 tensor x[i] = 0.1 i on the GPU, a
 * trace that is cached after warm-up and replayed.  The target
 * (BENCHMARKS.md) is a replay of the whole trace in <= 20 µs: one launch
 * per fused group (or a CUDA graph), not one per op.
 *   time_s: one replay as a user waits for it: the 100 ops recorded, the
 *           trace found in the cache and launched, the 16 values read back;
 *   async_us: replays launched back to back (kiln_sync, no read), one wait
 *           at the end: what a replay costs when nothing waits for it;
 *   launches_per_replay: kernels launched by one replay (kiln_stat). */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

enum { ELEMS = 16, OPS = 100 };

static kiln_tensor *chain(void *x0) {
  kiln_tensor *x = kiln_retain(x0);
  for (int k = 0; k < OPS; k++) {
    kiln_tensor *next = k % 2 ? kiln_add_scalar(x, 0.01) : kiln_mul_scalar(x, 1.01);
    kiln_release(x);
    x = bench_ok(next, "scalar op");
  }
  return x;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 9, 20);
  if (!gb_device_ready(&o, "G5")) return 0;
  int inner = o.smoke ? 2 : 200; /* replays per repetition */
  float init[ELEMS], out[ELEMS];
  for (int i = 0; i < ELEMS; i++) init[i] = (float)(i * 0.1);
  int64_t n = ELEMS;
  kiln_tensor *x0 = gb_on_device(&o, kiln_from_data(init, KILN_F32, 1, &n), "x");

  double *times = calloc((size_t)o.reps, sizeof *times);
  /* back to back first: its warm-up makes the trace hot and compiled */
  double async_s = gb_time(chain, x0, &o, inner, times, NULL);
  double launches = gb_launches(chain, x0);
  for (int r = 0; r < o.warmup; r++) { /* the same trace, flushed by a read this time */
    kiln_tensor *x = chain(x0);
    bench_ok_status(kiln_to_buffer(x, out, sizeof out), "kiln_to_buffer");
    kiln_release(x);
  }
  kiln_jit_wait();
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    for (int i = 0; i < inner; i++) {
      kiln_tensor *x = chain(x0);
      bench_ok_status(kiln_to_buffer(x, out, sizeof out), "kiln_to_buffer"); /* waits */
      kiln_release(x);
    }
    times[r] = (bench_now() - t0) / inner;
  }
  char check[512], extra[256];
  bench_summary_f32(check, sizeof check, out, ELEMS);
  snprintf(extra, sizeof extra,
           "ops=%d\treplays=%d\tus_per_replay=%.2f\tasync_us=%.2f\tlaunches_per_replay=%.0f", OPS,
           inner, 1e6 * bench_median(times, o.reps), 1e6 * async_s, launches);
  gb_result("G5", &o, times, o.reps, extra, check);
  kiln_release(x0);
  free(times);
  return 0;
}
