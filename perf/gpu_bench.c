/* gpu_bench.c — the helpers of gpu_bench.h. */
#include "gpu_bench.h"

#include <dlfcn.h>
#include <math.h>
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

static kiln_tensor *neg_of(void *x) { return kiln_neg(x); }

/* the driver's entry points the copy timing needs, through cuGetProcAddress
   as Kiln finds them (jit_gpu/cuda.c), from the same library (KILN_CUDA_LIB
   names another, as the emulated device does) */
typedef int (*cu_get_proc)(const char *name, void **fn, int version, unsigned long long flags,
                           int *status);
typedef struct {
  int (*device_get)(int *dev, int ordinal);
  int (*primary_retain)(void **ctx, int dev);
  int (*primary_release)(int dev);
  int (*ctx_set_current)(void *ctx);
  int (*ctx_synchronize)(void);
  int (*mem_alloc)(unsigned long long *p, size_t bytes);
  int (*mem_free)(unsigned long long p);
  int (*copy)(unsigned long long dst, unsigned long long src, size_t bytes, void *stream);
} cu_copy_api;

static bool cu_copy_resolve(cu_copy_api *api) {
  const char *lib = getenv("KILN_CUDA_LIB");
  void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cu_get_proc get = h ? (cu_get_proc)dlsym(h, "cuGetProcAddress_v2") : NULL;
  if (!get) return false;
  struct {
    const char *name;
    void **slot;
  } want[] = {{"cuDeviceGet", (void **)&api->device_get},
              {"cuDevicePrimaryCtxRetain", (void **)&api->primary_retain},
              {"cuCtxSetCurrent", (void **)&api->ctx_set_current},
              {"cuCtxSynchronize", (void **)&api->ctx_synchronize},
              {"cuMemAlloc", (void **)&api->mem_alloc},
              {"cuMemFree", (void **)&api->mem_free},
              {"cuMemcpyDtoDAsync", (void **)&api->copy}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int status = 0;
    if (get(want[i].name, want[i].slot, 12000, 0, &status) != 0 || !*want[i].slot) return false;
  }
  int status = 0; /* optional (the emulated device has none) */
  if (get("cuDevicePrimaryCtxRelease", (void **)&api->primary_release, 12000, 0, &status) != 0)
    api->primary_release = NULL;
  return true;
}

/* NAN when the driver cannot be used this way (the table then has no limit) */
static double cu_copy_gbs(size_t bytes, const bench_opts *o, int inner) {
  cu_copy_api api = {0};
  int dev = 0;
  void *ctx = NULL;
  unsigned long long src = 0, dst = 0;
  double gbs = NAN;
  if (!cu_copy_resolve(&api) || api.device_get(&dev, 0) || api.primary_retain(&ctx, dev)) {
    fprintf(stderr, "gpu_bench: the copy bandwidth: no CUDA driver to time a copy with\n");
    return NAN;
  }
  double *times = calloc((size_t)o->reps, sizeof *times);
  bool ok = times && !api.ctx_set_current(ctx) && !api.mem_alloc(&src, bytes) &&
            !api.mem_alloc(&dst, bytes) && !api.copy(dst, src, bytes, NULL) &&
            !api.ctx_synchronize();
  for (int r = 0; ok && r < o->reps; r++) {
    double t0 = bench_now();
    for (int i = 0; ok && i < inner; i++) ok = !api.copy(dst, src, bytes, NULL);
    ok = ok && !api.ctx_synchronize();
    times[r] = (bench_now() - t0) / inner;
  }
  if (ok)
    gbs = 2.0 * (double)bytes / bench_median(times, o->reps) / 1e9;
  else
    fprintf(stderr, "gpu_bench: the copy bandwidth: a driver call failed\n");
  if (dst) api.mem_free(dst);
  if (src) api.mem_free(src);
  if (api.primary_release) api.primary_release(dev);
  free(times);
  return gbs;
}

double gb_copy_gbs(kiln_tensor *x, const bench_opts *o, int inner) {
  kiln_dtype dt = kiln_dtype_of(x);
  double bytes = (double)kiln_numel(x) * (dt == KILN_F64                      ? 8.0
                                          : dt == KILN_BF16 || dt == KILN_F16 ? 2.0
                                                                              : 4.0);
  if (o->device == KILN_CUDA) return cu_copy_gbs((size_t)bytes, o, inner);
  double *times = calloc((size_t)o->reps, sizeof *times);
  if (!times) abort();
  double med = gb_time(neg_of, x, o, inner, times, NULL);
  free(times);
  return 2.0 * bytes / med / 1e9;
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
