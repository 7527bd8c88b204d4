/* test_gpu_kernel_cache.c — the kernel cache's rule on the GPU (cache/
 * kernel_cache.h, shared with the CPU): under KILN_KERNEL_CACHE_MAX=2 and
 * KILN_TRACE_CACHE_MAX=2, programs whose fused kernels all differ leave a
 * bounded number of CUDA modules loaded (evicted plans release their
 * kernels, and a module none of whose kernels is cached is unloaded with
 * cuModuleUnload), the op kernels the GPU interpreter launches one by one
 * stay valid while they run, and a program whose kernels were unloaded
 * runs again with its kernels loaded again (disk cache or NVRTC), giving
 * the same bits.  On the emulated device (tests/gpu_emu/cuda_emu.cpp) the
 * driver's own count of loaded modules is checked as well.  Without a CUDA
 * device it skips, saying so. */
#include <dlfcn.h>
#include <stdlib.h>

#include "../cache/kernel_cache.h"
#include "ktest.h"

#define PROGRAMS 10
/* two live plans' kernels (one or two each), two unused ones, a launch in
   flight; without the bound, 15 (5 op kernels and a fused one per program) */
#define MOST_MODULES 8

/* the emulated driver's module counts (NULL on a real driver) */
typedef void (*module_counts_fn)(long *live, long *loads, long *unloads);
static module_counts_fn emu_counts;

static void find_emulator(void) {
  const char *lib = getenv("KILN_CUDA_LIB");
  void *dl = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (dl) *(void **)&emu_counts = dlsym(dl, "kiln_emu_module_counts");
}

/* program k: a chain of IEEE-exact ops chosen by k's bits, then a sum, so
   that each k's fused kernels differ from every other's */
static kiln_tensor *program(kiln_tensor *x, int k) {
  kiln_tensor *y = kiln_retain(x);
  for (int j = 0; j < 4; j++) {
    kiln_tensor *a, *n;
    if (k >> j & 1) {
      a = kiln_mul_scalar(y, 1.5);
      n = kiln_add(a, x);
    } else {
      a = kiln_sub(y, x);
      n = kiln_abs(a);
    }
    kiln_release(a);
    kiln_release(y);
    y = n;
  }
  kiln_tensor *m = kiln_mul_scalar(y, 0.25);
  kiln_tensor *s = kiln_sum(m, 0, NULL, false);
  kiln_release(m);
  kiln_release(y);
  return s;
}

static double run(kiln_tensor *x, int k) {
  kiln_tensor *s = program(x, k);
  double v = kiln_item(s);
  kiln_release(s);
  return v;
}

static long live_modules(void) {
  long live = -1, loads = -1, unloads = -1;
  if (emu_counts) emu_counts(&live, &loads, &unloads);
  return live;
}

TEST(unused_cuda_modules_are_unloaded_and_reloaded) {
  int64_t shape[1] = {3000};
  kiln_manual_seed(11);
  kiln_tensor *xc = kiln_randn(KILN_F32, 1, shape), *xg = kiln_to_device(xc, KILN_CUDA);
  CHECK(xg != NULL);
  double cpu[PROGRAMS], first[PROGRAMS];
  for (int k = 0; k < PROGRAMS; k++) cpu[k] = run(xc, k); /* once each: the CPU stays interpreted */
  long most_cached = 0, most_live = 0, loads0 = 0, unloads0 = 0, live0 = 0;
  if (emu_counts) emu_counts(&live0, &loads0, &unloads0);
  double unloads_before = kiln_stat("code_unloads");
  for (int k = 0; k <= PROGRAMS; k++) {
    int which = k < PROGRAMS ? k : 0; /* last: the first program again, its kernels long unloaded */
    /* eager, then hot (compiled at once: KILN_ASYNC=0), then compiled */
    for (int rep = 0; rep < 3; rep++) {
      double launched = kiln_stat("kernels_launched");
      double v = run(xg, which);
      launched = kiln_stat("kernels_launched") - launched;
      if (k == which && rep == 0) first[which] = v;
      char what[64];
      snprintf(what, sizeof what, "program %d, pass %d, run %d", which, k, rep);
      if (v != first[which]) KTEST_FAIL("%s: %a, its first run gave %a", what, v, first[which]);
      CHECK_CLOSE(v, cpu[which], 1e-5);
      /* op by op: a launch per op; compiled: its fused kernels (their
         modules loaded again on the last pass, where its key, evicted
         long ago, is planned at its first sighting: its family is hot) */
      bool again = k == PROGRAMS;
      if (rep == 0 && !again) CHECK(launched >= 9);
      if (rep == 2 || again) CHECK(launched >= 1 && launched <= 2);
      long cached = cache_code_count(KILN_CUDA), live = live_modules();
      most_cached = cached > most_cached ? cached : most_cached;
      most_live = live > most_live ? live : most_live;
      if (emu_counts && live != cached)
        KTEST_FAIL("%s: the driver has %ld modules loaded, the cache %ld", what, live, cached);
    }
  }
  printf("most CUDA modules loaded at once: %ld (the driver: %ld); code_unloads %.0f\n",
         most_cached, most_live, kiln_stat("code_unloads") - unloads_before);
  CHECK(most_cached >= 1);
  CHECK(most_cached <= MOST_MODULES); /* not one set per program */
  CHECK(kiln_stat("code_unloads") - unloads_before >= PROGRAMS);
  if (emu_counts) {
    long live, loads, unloads;
    emu_counts(&live, &loads, &unloads);
    printf("emulated driver: %ld modules loaded, %ld unloaded, %ld loaded now\n", loads - loads0,
           unloads - unloads0, live);
    CHECK(loads - loads0 > PROGRAMS);      /* each program's kernels, and the first's again */
    CHECK(unloads - unloads0 >= PROGRAMS); /* cuModuleUnload was called */
    CHECK(live <= MOST_MODULES);
  }
  kiln_release(xc);
  kiln_release(xg);
}

int main(void) {
  /* the bounds under test, unless the caller set others */
  setenv("KILN_KERNEL_CACHE_MAX", "2", 0);
  setenv("KILN_TRACE_CACHE_MAX", "2", 0);
  setenv("KILN_HOT", "2", 0);
  setenv("KILN_ASYNC", "0", 0);
  setenv("KILN_PAYOFF", "0", 0);
  if (!kiln_device_available(KILN_CUDA)) {
    printf("test_gpu_kernel_cache: no CUDA device here (%s); skipped\n",
           kiln_device_info(KILN_CUDA));
    return ktest_done();
  }
  find_emulator();
  printf("test_gpu_kernel_cache: %s%s\n", kiln_device_info(KILN_CUDA),
         emu_counts ? " (its module counts checked)" : "");
  RUN(unused_cuda_modules_are_unloaded_and_reloaded);
  return ktest_done();
}
