/* w13_demo.c — W13: the demo's training (examples/mlp_digits.c, run as the
 * ctest demo_mlp_digits runs it: `mlp_digits --no-compare DIGITS.csv.gz`)
 * from a cold cache, as a whole process: wall time from fork to the end of
 * the process, each run with a fresh, empty KILN_CACHE_DIR; and how long exit
 * takes: the demo (with --timestamp) prints the CLOCK_MONOTONIC time just
 * before main returns, and this program takes the time the process has ended
 * (waitpid) minus that.  KILN_JIT=0 in the environment makes it the
 * kiln-eager contender (the child inherits it).
 *
 * Rows: W13 (seconds per process) and W13:exit (seconds from main's return to
 * the process's end).  Extra fields: the training time the demo reports, its
 * compiles.  Check: the final test accuracy and the last epoch's loss. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef KILN_W13_DEMO
#error "KILN_W13_DEMO: the path of the mlp_digits executable (perf/CMakeLists.txt)"
#endif
#ifndef KILN_W13_DATA
#error "KILN_W13_DATA: the path of digits.csv.gz"
#endif

typedef struct {
  double wall, exit_s, train_s, acc, loss, compiles, compile_ms;
} run_result;

/* runs the demo once in a fresh cache directory; returns 0 or -1 */
static int run_demo(run_result *r) {
  char dir[] = "/tmp/kiln-w13-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("w13: mkdtemp");
    return -1;
  }
  int fds[2];
  if (pipe(fds) < 0) {
    perror("w13: pipe");
    return -1;
  }
  fflush(stdout);
  double t0 = bench_now();
  pid_t pid = fork();
  if (pid < 0) {
    perror("w13: fork");
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(127);
    close(fds[1]);
    setenv("KILN_CACHE_DIR", dir, 1);
    unsetenv("KILN_STATS");
    execl(KILN_W13_DEMO, "mlp_digits", "--no-compare", "--timestamp", KILN_W13_DATA, (char *)NULL);
    perror("w13: exec " KILN_W13_DEMO);
    _exit(127);
  }
  close(fds[1]);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  if (!buf) abort();
  ssize_t k;
  while ((k = read(fds[0], buf + len, cap - 1 - len)) > 0 || (k < 0 && errno == EINTR)) {
    if (k > 0) len += (size_t)k;
    if (len + 1 == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) abort();
      buf = nb;
    }
  }
  buf[len] = '\0';
  close(fds[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      perror("w13: waitpid");
      free(buf);
      return -1;
    }
  double t1 = bench_now();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "w13: could not remove %s\n", dir);

  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const char *ts = strstr(buf, "main returns at ");
  const char *acc = strstr(buf, "final test accuracy ");
  const char *st = strstr(buf, "  compiles ");
  double at = 0, pct = 0;
  ok = ok && ts && sscanf(ts, "main returns at %lf", &at) == 1;
  ok =
      ok && acc && sscanf(acc, "final test accuracy %lf%%, training %lf s", &pct, &r->train_s) == 2;
  r->compiles = r->compile_ms = -1;
  if (st) sscanf(st, "  compiles %lf (%lf ms", &r->compiles, &r->compile_ms);
  /* the last epoch line: "   25      0.0781    97.50%     10 ms" */
  r->loss = -1;
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
    int epoch;
    double l, a;
    if (sscanf(line, "%d %lf %lf%%", &epoch, &l, &a) == 3) r->loss = l;
  }
  free(buf);
  if (!ok) {
    fprintf(stderr, "w13: the demo failed (wait status %d) or printed no timestamp/accuracy\n",
            status);
    return -1;
  }
  r->wall = t1 - t0;
  r->exit_s = t1 - at;
  r->acc = pct / 100.0;
  return 0;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 3, 0);
  int n = o.reps;
  double *wall = calloc((size_t)n, sizeof *wall), *ex = calloc((size_t)n, sizeof *ex),
         *train = calloc((size_t)n, sizeof *train);
  run_result r = {0};
  for (int i = 0; i < o.warmup + n; i++) {
    if (run_demo(&r) < 0) return 1;
    if (i < o.warmup) continue;
    wall[i - o.warmup] = r.wall;
    ex[i - o.warmup] = r.exit_s;
    train[i - o.warmup] = r.train_s;
  }
  char check[128], extra[512], extra_exit[256];
  snprintf(check, sizeof check, "acc=%.6g,loss=%.6g", r.acc, r.loss);
  snprintf(extra, sizeof extra,
           "train_s=%.4g\texit_ms=%.1f\tcompiles=%.0f\tcompile_ms=%.0f\tnote=mlp_digits "
           "--no-compare, fresh KILN_CACHE_DIR per run: whole process %.2f s, its training "
           "%.2f s, exit %.0f ms (medians)",
           bench_median(train, n), 1e3 * bench_median(ex, n), r.compiles, r.compile_ms,
           bench_median(wall, n), bench_median(train, n), 1e3 * bench_median(ex, n));
  bench_result("W13", o.label, wall, n, extra, check);
  snprintf(extra_exit, sizeof extra_exit,
           "note=from the timestamp main prints before returning "
           "to the end of the process (waitpid)");
  bench_result("W13:exit", o.label, ex, n, extra_exit, "");
  free(wall);
  free(ex);
  free(train);
  return 0;
}
