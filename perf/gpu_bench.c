/* gpu_bench.c — the helpers of gpu_bench.h. */
#include "gpu_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool gb_device_ready(const bench_opts *o, const char *workload) {
  setenv("KILN_PAYOFF", "0", 0);
  if (o->device == KILN_CPU || kiln_device_available(KILN_CUDA)) return true;
  char note[512];
  snprintf(note, sizeof note, "skipped: no CUDA device (%s)", kiln_device_info(KILN_CUDA));
  bench_na(workload, o->label, note);
  return false;
}

kiln_tensor *gb_on_device(const bench_opts *o, kiln_tensor *host, const char *what) {
  bench_ok(host, what);
  kiln_tensor *t = bench_ok(kiln_to_device(host, o->device), what);
  kiln_release(host);
  return t;
}

void gb_wait(kiln_tensor *t) {
  bench_ok(t, "the timed computation");
  /* the workload's trace on its own first: the views below would join it
     and make another trace key than the timed loop's */
  bench_ok_status(kiln_sync(), "kiln_sync");
  int64_t n = kiln_numel(t);
  if (n == 1) {
    (void)kiln_item(t);
  } else {
    kiln_tensor *flat = bench_ok(kiln_reshape(t, 1, (int64_t[]){-1}), "reshape");
    kiln_tensor *one = bench_ok(kiln_slice(flat, 0, n - 1, n, 1), "element");
    (void)kiln_item(one);
    kiln_release(one);
    kiln_release(flat);
  }
  bench_ok_status(kiln_last_status(), "reading the result");
}

/* new trace keys during the last gb_time's timed repetitions (gb_result
   prints it: 0 says the timed loop replayed cached traces only) */
static double traces_timed = -1;

double gb_time(gb_eval f, void *ctx, const bench_opts *o, int inner, double *times,
               kiln_tensor **last) {
  kiln_tensor *out = NULL;
  if (inner < 1) inner = 1;
  for (int r = 0; r < o->warmup; r++) {
    kiln_release(out);
    out = bench_ok(f(ctx), "evaluation");
    gb_wait(out);
  }
  kiln_jit_wait(); /* time the compiled kernels, not the compiler thread */
  double seen = kiln_stat("traces_seen");
  for (int r = 0; r < o->reps; r++) {
    double t0 = bench_now();
    for (int i = 0; i < inner; i++) {
      kiln_release(out); /* the device's allocator reuses it in stream order */
      out = bench_ok(f(ctx), "evaluation");
      bench_ok_status(kiln_sync(), "kiln_sync"); /* launched, not waited for */
    }
    gb_wait(out);
    times[r] = (bench_now() - t0) / inner;
  }
  traces_timed = kiln_stat("traces_seen") - seen;
  if (last)
    *last = out;
  else
    kiln_release(out);
  return bench_median(times, o->reps);
}

double gb_launches(gb_eval f, void *ctx) {
  double before = kiln_stat("kernels_launched");
  kiln_tensor *out = bench_ok(f(ctx), "evaluation");
  gb_wait(out);
  kiln_release(out);
  return kiln_stat("kernels_launched") - before;
}

double gb_waits(gb_eval f, void *ctx) {
  kiln_tensor *out = bench_ok(f(ctx), "evaluation");
  double before = kiln_stat("device_waits");
  bench_ok_status(kiln_sync(), "kiln_sync");
  double waits = kiln_stat("device_waits") - before;
  gb_wait(out);
  kiln_release(out);
  return waits;
}

static kiln_tensor *clone_of(void *x) { return kiln_clone(x); }

double gb_copy_gbs(kiln_tensor *x, const bench_opts *o, int inner) {
  double *times = calloc((size_t)o->reps, sizeof *times);
  if (!times) abort();
  double med = gb_time(clone_of, x, o, inner, times, NULL);
  free(times);
  double bytes = 2.0 * (double)kiln_numel(x) * (kiln_dtype_of(x) == KILN_F64 ? 8.0 : 4.0);
  return bytes / med / 1e9;
}

void gb_bandwidth_fields(char *out, size_t cap, double bytes, int64_t elems, double median_s,
                         double copy_gbs) {
  double gbs = bytes / median_s / 1e9;
  snprintf(out, cap, "bytes=%.0f\telems=%lld\tgbs=%.1f\tcopy_gbs=%.1f\tof_copy=%.3f", bytes,
           (long long)elems, gbs, copy_gbs, gbs / copy_gbs);
}

const char *gb_device_name(const bench_opts *o) {
  static char cpu[64];
  if (o->device == KILN_CUDA) return kiln_device_info(KILN_CUDA);
  snprintf(cpu, sizeof cpu, "cpu %s", kiln_cpu_isa());
  return cpu;
}

void gb_result(const char *workload, const bench_opts *o, const double *times, int n,
               const char *extra, const char *check) {
  char fields[1024];
  snprintf(fields, sizeof fields, "%s%straces_timed=%.0f\tdevice=%s", extra ? extra : "",
           extra && *extra ? "\t" : "", traces_timed, gb_device_name(o));
  bench_result(workload, o->label, times, n, fields, check);
}
