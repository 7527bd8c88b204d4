/* w8_compile.c — W8: compile time, ms from the first sighting of a trace to
 * its compiled plan, for W1's expression and W7's training step.  It runs
 * each a few times (more than KILN_HOT sightings) and reads kiln_stats.
 * Kiln has no JIT yet, so today this reports n/a with the counts that show
 * it: nothing is compiled.  The interpreter (kiln-eager) never compiles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "workloads.h"

static void report(const char *workload, const bench_opts *o, const kiln_stats *s, int runs) {
  char note[256];
  if (s->compiles == 0) {
    if (strcmp(o->label, "kiln-eager") == 0)
      snprintf(note, sizeof note, "the interpreter (KILN_JIT=0) compiles nothing by design");
    else
      snprintf(note, sizeof note,
               "no JIT in this Kiln yet: nothing compiled after %d runs (compiles=%llu, "
               "traces_seen=%llu, flushes=%llu)",
               runs, (unsigned long long)s->compiles, (unsigned long long)s->traces_seen,
               (unsigned long long)s->flushes);
    bench_na(workload, o->label, note);
    return;
  }
  double per_kernel = s->compile_ms / 1e3 / (double)s->compiles;
  char extra[128];
  snprintf(extra, sizeof extra, "kernels=%llu", (unsigned long long)s->compiles);
  bench_result(workload, o->label, &per_kernel, 1, extra, "");
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 4, 0);
  int runs = o.reps < 3 ? 3 : o.reps;

  int64_t n = o.smoke ? 4096 : (int64_t)1 << 20;
  float *buf = bench_alloc_f32(n);
  bench_fill_sin(buf, n, 0.001, 0.0, 1.0);
  kiln_tensor *x = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "x");
  kiln_tensor *y = bench_ok(kiln_from_data(buf, KILN_F32, 1, &n), "y");
  free(buf);
  kiln_stats s;
  kiln_reset_stats();
  for (int r = 0; r < runs; r++) {
    kiln_tensor *out = wl_w1(x, y);
    bench_force(out);
    kiln_release(out);
  }
  kiln_get_stats(&s);
  report("W8:W1", &o, &s, runs);
  kiln_release(x);
  kiln_release(y);

  wl_mlp m;
  wl_mlp_init(&m, o.smoke);
  kiln_reset_stats();
  for (int r = 0; r < runs; r++) {
    kiln_tensor *loss = wl_mlp_step(&m);
    bench_force(loss);
    kiln_release(loss);
  }
  kiln_get_stats(&s);
  report("W8:W7", &o, &s, runs);
  wl_mlp_free(&m);
  return 0;
}
