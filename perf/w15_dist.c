/* w15_dist.c — W15: data-parallel training over MPI (BENCHMARKS.md).
 *
 *   mpirun -np N perf_w15_dist [--model w7|digits] [--reps R] [--smoke]
 *
 * W7's MLP (784-1024-1024-10, relu, cross-entropy, SGD) or the digits MLP
 * (64-128-10) with a global batch (512 / 64) split between the N ranks,
 * gradients from kiln_backward averaged by kiln_dist_average_grads.  Two
 * modes, timed back to back in one run:
 *   overlap  the step as users write it: backward and the averaging are one
 *            trace, each gradient bucket's reduction starting as soon as
 *            backward has produced it;
 *   serial   backward evaluated first (kiln_sync), then the averaging: every
 *            reduction waits for the whole backward (no overlap).
 * Rank 0 prints one @w15 line per mode: median ms per step, ms per step spent
 * waiting for reductions (all_reduce_wait_ms), ms of reduction (engine time,
 * all_reduce_ms), and the share of the step waiting.  scripts/bench W15 runs
 * it at 1, 2 and 4 ranks and derives how much of the communication the
 * overlap hides: 1 - wait(overlap) / wait(serial). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct {
  int nl; /* layers */
  kiln_tensor *w[3], *b[3];
  kiln_tensor *x, *y; /* this rank's rows */
} model;

static model make(const char *which, int rank, int size, bool smoke) {
  bool w7 = !strcmp(which, "w7");
  int64_t dims[4] = {784, 1024, 1024, 10}, batch = 512;
  if (!w7) dims[0] = 64, dims[1] = 128, dims[2] = 10, batch = 64;
  if (smoke) dims[0] = 32, dims[1] = 16, dims[2] = w7 ? 16 : 10, batch = 8 * size;
  model m = {.nl = w7 ? 3 : 2};
  for (int l = 0; l < m.nl; l++) {
    m.w[l] = bench_tensor_hash(2, (int64_t[]){dims[l], dims[l + 1]}, 2 + 2 * (uint32_t)l,
                               __builtin_sqrt(6.0 / (double)dims[l]), 0);
    m.b[l] = bench_tensor_hash(1, (int64_t[]){dims[l + 1]}, 3 + 2 * (uint32_t)l, 0.01, 0);
    bench_ok_status(kiln_set_requires_grad(m.w[l], true), "requires_grad");
    bench_ok_status(kiln_set_requires_grad(m.b[l], true), "requires_grad");
  }
  int64_t lo = batch * rank / size, hi = batch * (rank + 1) / size, rows = hi - lo;
  kiln_tensor *all = bench_tensor_hash(2, (int64_t[]){batch, dims[0]}, 1, 1.0, 0);
  m.x = bench_ok(kiln_slice(all, 0, lo, hi, 1), "slice");
  int64_t *t = malloc(sizeof *t * (size_t)rows);
  for (int64_t i = 0; i < rows; i++) t[i] = ((lo + i) * 7 + 3) % 10;
  m.y = bench_ok(kiln_from_data(t, KILN_I64, 1, &rows), "labels");
  bench_ok_status(kiln_eval(1, &m.x), "eval");
  kiln_release(all);
  free(t);
  return m;
}

static void step(model *m, bool overlap) {
  bench_scope s = {0};
  kiln_tensor *h = m->x;
  for (int l = 0; l < m->nl; l++) {
    h = bench_keep(&s, kiln_add(bench_keep(&s, kiln_matmul(h, m->w[l]), "matmul"), m->b[l]), "add");
    if (l < m->nl - 1) h = bench_keep(&s, kiln_relu(h), "relu");
  }
  kiln_tensor *loss = bench_keep(&s, kiln_cross_entropy(h, m->y), "cross_entropy");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  if (!overlap) bench_ok_status(kiln_sync(), "kiln_sync");
  kiln_tensor *params[6];
  for (int l = 0; l < m->nl; l++) params[2 * l] = m->w[l], params[2 * l + 1] = m->b[l];
  bench_ok_status(kiln_dist_average_grads(2 * m->nl, params), "kiln_dist_average_grads");
  bench_sgd_step(params, 2 * m->nl, 0.05);
  bench_ok_status(kiln_sync(), "kiln_sync");
  bench_scope_free(&s);
}

int main(int argc, char **argv) {
  const char *which = "w7";
  int reps = 20;
  bool smoke = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc)
      which = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--smoke"))
      smoke = true, reps = 2;
    else {
      fprintf(stderr,
              "usage: mpirun -np N perf_w15_dist [--model w7|digits] [--reps R] [--smoke]\n");
      return 2;
    }
  }
  bench_ok_status(kiln_dist_init(), "kiln_dist_init");
  int rank = kiln_dist_rank(), size = kiln_dist_size();
  model m = make(which, rank, size, smoke);
  /* the two modes alternate step by step, so the load of a shared machine
     weighs on both alike */
  double *times[2] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double))};
  double wait[2] = {0, 0}, comm[2] = {0, 0}, buckets[2] = {0, 0};
  const char *modes[] = {"serial", "overlap"};
  for (int w = 0; w < 4; w++) /* warm-up: the steps' traces planned and compiled */
    for (int mode = 0; mode < 2; mode++) step(&m, mode == 1);
  kiln_jit_wait();
  for (int r = 0; r < reps; r++)
    for (int mode = 0; mode < 2; mode++) {
      double w0 = kiln_stat("all_reduce_wait_ms"), c0 = kiln_stat("all_reduce_ms"),
             n0 = kiln_stat("all_reduces");
      double t0 = bench_now();
      step(&m, mode == 1);
      times[mode][r] = bench_now() - t0;
      wait[mode] += (kiln_stat("all_reduce_wait_ms") - w0) / reps;
      comm[mode] += (kiln_stat("all_reduce_ms") - c0) / reps;
      buckets[mode] += (kiln_stat("all_reduces") - n0) / reps;
    }
  for (int mode = 0; mode < 2 && rank == 0; mode++) {
    double med = bench_median(times[mode], reps) * 1e3;
    printf(
        "@w15\tmodel=%s\tranks=%d\tmode=%s\tstep_ms=%.3f\twait_ms=%.3f\tcomm_ms=%.3f\t"
        "wait_share=%.3f\tbuckets=%.0f\tthreads=%d\n",
        which, size, modes[mode], med, wait[mode], comm[mode], wait[mode] / med, buckets[mode],
        kiln_num_threads());
  }
  free(times[0]);
  free(times[1]);
  for (int l = 0; l < m.nl; l++) {
    kiln_release(m.w[l]);
    kiln_release(m.b[l]);
  }
  kiln_release(m.x);
  kiln_release(m.y);
  bench_ok_status(kiln_dist_finalize(), "kiln_dist_finalize");
  return 0;
}
