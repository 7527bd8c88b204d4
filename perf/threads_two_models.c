/* threads_two_models.c — pool fairness (DESIGN.md §9, issue 11 item 4): two
 * independent models (W7's MLP, smaller) trained for --steps steps each,
 *   sequential:  one after the other on the main thread,
 *   concurrent:  on two user threads at once,
 * and the same two rows again in a child process run with KILN_THREADS=1.
 * Two models on two threads should take no longer than one after the other.
 * Each row is the median of --reps runs, alternating the rows in one process
 * so that machine noise hits both alike; after an untimed warm-up (compiles
 * finished, kiln_jit_wait).  Not part of the tests and not run by
 * scripts/bench: run it by hand.
 *   perf_threads_two_models [--reps N] [--steps N] [--batch N] [--hidden N] */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "bench.h"
#include "workloads.h"

extern char **environ;

typedef struct {
  int reps, steps;
  int64_t batch, hidden;
} opts;

static void train(const opts *o) {
  wl_mlp m;
  wl_mlp_init_dims(&m, o->batch, o->hidden, o->hidden, o->hidden);
  for (int s = 0; s < o->steps; s++) {
    kiln_tensor *loss = wl_mlp_step(&m);
    bench_force(loss);
    kiln_release(loss);
  }
  wl_mlp_free(&m);
}

static void *train_thread(void *p) {
  train(p);
  return NULL;
}

static double sequential(const opts *o) {
  double t0 = bench_now();
  train(o);
  train(o);
  return bench_now() - t0;
}

static double concurrent(const opts *o) {
  double t0 = bench_now();
  pthread_t a, b;
  pthread_create(&a, NULL, train_thread, (void *)o);
  pthread_create(&b, NULL, train_thread, (void *)o);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  return bench_now() - t0;
}

static void run_rows(const opts *o, const char *suffix) {
  train(o); /* warm-up: the traces get hot and compile */
  train(o);
  kiln_jit_wait();
  double *seq = calloc((size_t)o->reps, sizeof *seq), *con = calloc((size_t)o->reps, sizeof *con);
  for (int r = 0; r < o->reps; r++) {
    seq[r] = sequential(o);
    con[r] = concurrent(o);
  }
  char extra[160], label[64];
  snprintf(extra, sizeof extra, "steps=%d\tbatch=%lld\thidden=%lld", o->steps, (long long)o->batch,
           (long long)o->hidden);
  snprintf(label, sizeof label, "kiln-sequential%s", suffix);
  bench_result("two_models", label, seq, o->reps, extra, "");
  snprintf(label, sizeof label, "kiln-two-threads%s", suffix);
  bench_result("two_models", label, con, o->reps, extra, "");
  double ms = bench_median(seq, o->reps), mc = bench_median(con, o->reps);
  printf(
      "KILN_THREADS=%d: sequential %.3f s, two threads %.3f s, two threads / sequential = %.2f\n",
      kiln_num_threads(), ms, mc, mc / ms);
  fflush(stdout);
  free(seq);
  free(con);
}

int main(int argc, char **argv) {
  opts o = {.reps = 5, .steps = 20, .batch = 128, .hidden = 256};
  bool child = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--child"))
      child = true;
    else if (!strcmp(argv[i], "--smoke"))
      o.reps = 1, o.steps = 2, o.batch = 16, o.hidden = 32;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      o.steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
      o.batch = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--hidden") && i + 1 < argc)
      o.hidden = atoll(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--smoke] [--reps N] [--steps N] [--batch N] [--hidden N]\n",
              argv[0]);
      return 2;
    }
  }
  if (o.reps < 1 || o.steps < 1 || o.batch < 1 || o.hidden < 1) {
    fprintf(stderr, "%s: --reps, --steps, --batch and --hidden must be positive\n", argv[0]);
    return 2;
  }
  if (child) {
    run_rows(&o, "-threads1");
    return 0;
  }
  /* the KILN_THREADS=1 rows first, in a child (the setting is read once per
     process): setenv is safe here, before Kiln starts any thread */
  const char *saved = getenv("KILN_THREADS");
  char *saved_copy = saved ? strdup(saved) : NULL;
  setenv("KILN_THREADS", "1", 1);
  char **child_argv = calloc((size_t)argc + 2, sizeof *child_argv);
  child_argv[0] = argv[0];
  for (int i = 1; i < argc; i++) child_argv[i] = argv[i];
  child_argv[argc] = "--child";
  pid_t pid;
  int status = 1;
  if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, environ) != 0 ||
      waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fprintf(stderr, "%s: the KILN_THREADS=1 run failed\n", argv[0]);
  free(child_argv);
  if (saved_copy)
    setenv("KILN_THREADS", saved_copy, 1);
  else
    unsetenv("KILN_THREADS");
  free(saved_copy);
  run_rows(&o, "");
  return status == 0 ? 0 : 1;
}
