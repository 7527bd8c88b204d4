/* g8_compile.c — G8: what compiling GPU kernels with NVRTC costs, on a cold
 * disk cache (a fresh KILN_CACHE_DIR), for W1's expression (2^20 elements)
 * and W7's training step on the GPU; then a second process on the same
 * cache (a warm start) must compile no kernel.
 *
 * Kernels compile inline (KILN_ASYNC=0): the op kernels at an op's first
 * run, a hot trace's fused kernels at its second sighting (KILN_PAYOFF=0).
 * kernels = kiln_stat("kernels_compiled"), which the GPU backend counts at
 * each NVRTC compile.  The milliseconds (source=counter): NVRTC's own time,
 * kiln_stat("nvrtc_ms") (with --device cpu: the CPU JIT's compile_ms).
 * Beside them, as a check, wall_ms: the wall time of the runs until nothing
 * more compiles minus as many runs of the same work once compiled, which
 * also holds generating the source and loading the module (it is the
 * figure used, source=wall, when the counter reads 0).  The one-off costs
 * are set aside first and reported on their own: the CUDA context,
 * cuBLAS's first call, and the first kernel, which loads NVRTC
 * (first_kernel_ms).  The warm start reports the kernels it compiled (0 is
 * the target) and those it loaded from the disk cache (gpu_disk_loads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_bench.h"
#include "workloads.h"

typedef struct {
  double ms, kernels, runs, counter_ms, wall_ms;
} cold_cost;

/* the counter of compile time for the device, 0 if this Kiln has none */
static double compile_counter_ms(const bench_opts *o) {
  double ms = kiln_stat(o->device == KILN_CUDA ? "nvrtc_ms" : "compile_ms");
  if (ms != ms) { /* NAN: no such counter */
    kiln_clear_error();
    return 0;
  }
  return ms;
}

/* kernels loaded from the disk cache instead of compiled */
static double disk_loads(const bench_opts *o) {
  double n = kiln_stat(o->device == KILN_CUDA ? "gpu_disk_loads" : "disk_hits");
  if (n != n) {
    kiln_clear_error();
    return -1;
  }
  return n;
}

static kiln_tensor *w1_eval(void *p) {
  kiln_tensor **xy = p;
  return wl_w1(xy[0], xy[1]);
}
static kiln_tensor *w7_eval(void *m) { return wl_mlp_step(m); }

static double run_once(gb_eval f, void *ctx) {
  double t0 = bench_now();
  kiln_tensor *out = bench_ok(f(ctx), "evaluation");
  gb_wait(out);
  kiln_release(out);
  return bench_now() - t0;
}

/* runs f until a run compiles nothing (3 runs at least, 12 at most), then
   5 more for the time of a compiled run */
static cold_cost measure(const bench_opts *o, gb_eval f, void *ctx) {
  cold_cost c = {0};
  double k0 = kiln_stat("kernels_compiled"), ms0 = compile_counter_ms(o), cold_s = 0;
  for (int r = 0; r < 12; r++) {
    double before = kiln_stat("kernels_compiled");
    cold_s += run_once(f, ctx);
    c.runs++;
    if (r >= 2 && kiln_stat("kernels_compiled") == before) break;
  }
  c.kernels = kiln_stat("kernels_compiled") - k0;
  c.counter_ms = compile_counter_ms(o) - ms0;
  double steady[5];
  for (int r = 0; r < 5; r++) steady[r] = run_once(f, ctx);
  c.wall_ms = 1e3 * (cold_s - c.runs * bench_median(steady, 5));
  c.ms = c.counter_ms > 0 ? c.counter_ms : c.wall_ms;
  return c;
}

/* the CUDA context, cuBLAS and NVRTC loaded; returns the first kernel's ms */
static double runtime_ready(const bench_opts *o) {
  int64_t one[2] = {1, 1};
  double v = 2.0;
  kiln_tensor *a = gb_on_device(o, kiln_from_data((float[]){1.0f}, KILN_F32, 2, one), "a");
  kiln_tensor *p = bench_ok(kiln_matmul(a, a), "matmul");
  (void)kiln_item(p);
  /* an op no workload here uses (f64 neg): its kernel loads NVRTC */
  kiln_tensor *d = gb_on_device(o, kiln_from_data(&v, KILN_F64, 1, (int64_t[]){1}), "d");
  double t0 = bench_now();
  kiln_tensor *n = bench_ok(kiln_neg(d), "neg");
  (void)kiln_item(n);
  double ms = 1e3 * (bench_now() - t0);
  bench_ok_status(kiln_last_status(), "runtime warm-up");
  kiln_tensor *all[] = {a, p, d, n};
  for (int i = 0; i < 4; i++) kiln_release(all[i]);
  return ms;
}

static void report(const char *workload, const bench_opts *o, const cold_cost *c, double first_ms) {
  if (c->kernels == 0) {
    bench_na(workload, o->label,
             "no GPU kernel was compiled on a cold cache (kiln_stat kernels_compiled stayed 0)");
    return;
  }
  double per_kernel = c->ms / 1e3 / c->kernels;
  char extra[384];
  snprintf(extra, sizeof extra,
           "kernels=%.0f\tms_per_kernel=%.1f\tsource=%s\tcounter_ms=%.1f\twall_ms=%.1f\truns=%.0f\t"
           "first_kernel_ms=%.1f",
           c->kernels, 1e3 * per_kernel, c->counter_ms > 0 ? "counter" : "wall", c->counter_ms,
           c->wall_ms, c->runs, first_ms);
  gb_result(workload, o, &per_kernel, 1, extra, "");
}

/* W1's and W7's cold costs; returns the kernels compiled and their ms */
static cold_cost run_both(const bench_opts *o, bool print) {
  double first_ms = runtime_ready(o);
  int64_t n = o->smoke ? 4096 : (int64_t)1 << 20;
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, W1_X_FREQ, 0.0, 1.0);
  kiln_tensor *xy[2];
  xy[0] = gb_on_device(o, kiln_from_data(buf, KILN_F32, 1, &n), "x");
  bench_fill_sin(buf, n, W1_Y_FREQ, W1_Y_PHASE, W1_Y_AMP);
  xy[1] = gb_on_device(o, kiln_from_data(buf, KILN_F32, 1, &n), "y");
  free(buf);
  cold_cost w1 = measure(o, w1_eval, xy);
  kiln_release(xy[0]);
  kiln_release(xy[1]);

  wl_mlp m;
  wl_mlp_init(&m, o->smoke);
  wl_mlp_to_device(&m, o->device);
  cold_cost w7 = measure(o, w7_eval, &m);
  wl_mlp_free(&m);
  if (print) {
    report("G8:W1", o, &w1, first_ms);
    report("G8:W7", o, &w7, first_ms);
  }
  return (cold_cost){w1.ms + w7.ms, w1.kernels + w7.kernels, w1.runs + w7.runs, 0, 0};
}

/* the warm start: this program again, on the same cache */
static void warm_start(const bench_opts *o) {
  char self[4096], cmd[8192];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    bench_na("G8:warm", o->label, "cannot find this program to run it again");
    return;
  }
  self[len] = 0;
  snprintf(cmd, sizeof cmd, "'%s' %s--device %s --warm", self, o->smoke ? "--smoke " : "",
           o->device == KILN_CUDA ? "cuda" : "cpu");
  double t0 = bench_now(), kernels = -1, loads = -1;
  FILE *p = popen(cmd, "r");
  int got = p ? fscanf(p, "%lf %lf", &kernels, &loads) : 0;
  int rc = p ? pclose(p) : -1;
  double s = bench_now() - t0;
  if (got != 2 || rc != 0) {
    bench_na("G8:warm", o->label, "the warm-start process failed");
    return;
  }
  char extra[256];
  snprintf(
      extra, sizeof extra,
      "kernels_compiled=%.0f\tdisk_loads=%.0f\tnote=whole second process on the same disk cache",
      kernels, loads);
  gb_result("G8:warm", o, &s, 1, extra, "");
}

int main(int argc, char **argv) {
  bool warm = argc > 1 && !strcmp(argv[argc - 1], "--warm");
  if (warm) argc--;
  /* before any Kiln call: compile inline, into a cache of our own (the
     warm start inherits it) */
  setenv("KILN_ASYNC", "0", 1);
  char dir[] = "/tmp/kiln-g8-XXXXXX";
  if (!warm) {
    if (!mkdtemp(dir)) {
      perror("g8: mkdtemp");
      return 1;
    }
    setenv("KILN_CACHE_DIR", dir, 1);
  }
  bench_opts o;
  bench_parse(argc, argv, &o, 1, 0);
  if (!gb_device_ready(&o, "G8")) {
    if (!warm) rmdir(dir);
    return 0;
  }
  cold_cost c = run_both(&o, !warm);
  if (warm) { /* the child: what a warm start compiled, and loaded from disk */
    printf("%.0f %.0f\n", c.kernels, disk_loads(&o));
    return 0;
  }
  warm_start(&o);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "g8: could not remove %s\n", dir);
  return 0;
}
