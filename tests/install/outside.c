/* outside.c — a program outside the tree, compiled against the *installed*
 * kiln.h and libkiln with `pkg-config --cflags --libs kiln` by scripts/test;
 * its hot trace compiles in the installed compiler process (kiln-jitc,
 * found relative to the installed library) into a fresh cache. */
#define _DEFAULT_SOURCE
#include <kiln.h>
#include <stdio.h>
#include <stdlib.h>

static double hot_trace(kiln_tensor *x) {
  kiln_tensor *t = kiln_tanh(x), *s = kiln_sum(t, 0, NULL, false);
  double v = kiln_item(s);
  kiln_release(t);
  kiln_release(s);
  return v;
}

int main(void) {
  char dir[] = "/tmp/kiln-outside-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  setenv("KILN_CACHE_DIR", dir, 1);
  setenv("KILN_PAYOFF", "0", 1); /* compile at the second sighting */
  double xs[] = {1, 2, 3, 4};
  kiln_tensor *a = kiln_from_data(xs, KILN_F64, 2, (int64_t[]){2, 2});
  kiln_tensor *b = kiln_matmul(a, a); /* [[7, 10], [15, 22]] */
  kiln_tensor *s = kiln_sum(b, 0, NULL, false);
  double total = kiln_item(s);
  kiln_release(a);
  kiln_release(b);
  kiln_release(s);
  if (total != 54.0) {
    fprintf(stderr, "outside: expected 54, got %g (%s)\n", total, kiln_last_error());
    return 1;
  }
  kiln_tensor *x = kiln_arange(0, 1000, 1, KILN_F32);
  kiln_sync();
  double first = hot_trace(x);
  hot_trace(x);
  kiln_jit_wait();
  double again = hot_trace(x);
  kiln_release(x);
  double processes = kiln_stat("compiler_processes"), kernels = kiln_stat("kernels_compiled");
  char rm[64];
  snprintf(rm, sizeof rm, "rm -rf %s", dir);
  if (system(rm) != 0) return 1;
  if (processes < 1 || kernels < 1 || again != first) {
    fprintf(stderr,
            "outside: the JIT did not compile in kiln-jitc (%g processes, %g kernels, %g vs %g)\n",
            processes, kernels, again, first);
    return 1;
  }
  printf("outside: kiln %s, sum(a @ a) = %g, %g kernels compiled in kiln-jitc\n", kiln_version(),
         total, kernels);
  return 0;
}
