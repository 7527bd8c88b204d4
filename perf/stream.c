/* stream.c — the machine's memory bandwidth: a STREAM triad
 * a[i] = b[i] + s * c[i] over double arrays far larger than the caches, run
 * with kiln_num_threads() pthreads (KILN_THREADS), each thread first-touching
 * the part it later works on.  GB/s counts the bytes the triad must move:
 * 24 per element (two reads, one write; the write-allocate read is not
 * counted, as in STREAM and in BENCHMARKS.md's "bytes that must move").
 * The limit is the best run (STREAM's convention), so it never flatters Kiln. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct {
  double *a, *b, *c;
  int64_t n;
  int nthreads, reps;
  pthread_barrier_t barrier;
  double *times;
} triad;

typedef struct {
  triad *t;
  int id;
} worker;

static void bounds(const triad *t, int id, int64_t *b, int64_t *e) {
  int64_t q = t->n / t->nthreads, r = t->n % t->nthreads;
  *b = id * q + (id < r ? id : r);
  *e = *b + q + (id < r ? 1 : 0);
}

static void *run(void *arg) {
  worker *w = arg;
  triad *t = w->t;
  int64_t b, e;
  bounds(t, w->id, &b, &e);
  double *restrict a = t->a, *restrict bb = t->b, *restrict c = t->c;
  for (int64_t i = b; i < e; i++) { /* first touch: pages land near this thread */
    a[i] = 0.0;
    bb[i] = 1.0 + (double)(i % 7);
    c[i] = 0.5;
  }
  const double s = 3.0;
  for (int rep = -1; rep < t->reps; rep++) { /* rep -1 is the warm-up */
    pthread_barrier_wait(&t->barrier);
    double t0 = bench_now();
    for (int64_t i = b; i < e; i++) a[i] = bb[i] + s * c[i];
    pthread_barrier_wait(&t->barrier);
    if (w->id == 0 && rep >= 0) t->times[rep] = bench_now() - t0;
  }
  return NULL;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 10, 1);
  int threads = kiln_num_threads();
  /* 3 x 256 MiB: 24x a 32 MiB L3; the smoke run only checks that it works */
  int64_t n = o.smoke ? (int64_t)1 << 20 : (int64_t)1 << 25;
  triad t = {.n = n, .nthreads = threads, .reps = o.reps};
  size_t bytes = sizeof(double) * (size_t)n;
  if (posix_memalign((void **)&t.a, 4096, bytes) || posix_memalign((void **)&t.b, 4096, bytes) ||
      posix_memalign((void **)&t.c, 4096, bytes)) {
    fprintf(stderr, "perf_stream: out of memory\n");
    return 1;
  }
  t.times = calloc((size_t)o.reps, sizeof *t.times);
  worker *ws = calloc((size_t)threads, sizeof *ws);
  pthread_t *th = calloc((size_t)threads, sizeof *th);
  if (!t.times || !ws || !th) return 1;
  pthread_barrier_init(&t.barrier, NULL, (unsigned)threads);
  for (int i = 0; i < threads; i++) {
    ws[i] = (worker){&t, i};
    if (i && pthread_create(&th[i], NULL, run, &ws[i]) != 0) {
      fprintf(stderr, "perf_stream: cannot start thread %d\n", i);
      return 1;
    }
  }
  run(&ws[0]);
  for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);

  for (int64_t i = 0; i < n; i += 4099) /* the triad really ran */
    if (t.a[i] != 1.0 + (double)(i % 7) + 1.5) {
      fprintf(stderr, "perf_stream: wrong result at %lld\n", (long long)i);
      return 1;
    }
  double moved = 3.0 * (double)bytes;
  double best = moved / bench_min(t.times, o.reps) / 1e9;
  double median = moved / bench_median(t.times, o.reps) / 1e9;
  /* after the measurement: loads OpenBLAS, whose core the peers are given */
  const char *core = kiln_blas_core();
  printf(
      "@limit\tthreads=%d\tisa=%s\tblas=%s\tarray_mib=%.0f\tbytes=%.0f\treps=%d\t"
      "best_gbs=%.3f\tmedian_gbs=%.3f\n",
      threads, kiln_cpu_isa(), *core ? core : "none", (double)bytes / 1048576.0, moved, o.reps,
      best, median);
  printf("STREAM triad: %d threads, 3 x %.0f MiB, best %.2f GB/s, median %.2f GB/s\n", threads,
         (double)bytes / 1048576.0, best, median);
  pthread_barrier_destroy(&t.barrier);
  free(t.a);
  free(t.b);
  free(t.c);
  free(t.times);
  free(ws);
  free(th);
  return 0;
}
