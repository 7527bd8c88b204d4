/* w12_adam.c — W12: an MLP (784-256-10, relu, batch 128, mean cross-entropy)
 * trained with Adam written as users write it: per parameter the state
 * tensors m and v are rebound every step (new handles, the old ones
 * released), bias correction with host scalars that change every step
 * (1 - b1^t, 1 - b2^t), the update through kiln_sub_scaled_, the loss read
 * every step: ms/step, and the distinct traces the timed steps produce
 * (kiln_stat("traces_seen") after the warm-up minus before).
 *
 *   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * lr 1e-3, b1 0.9, b2 0.999, eps 1e-8.  Inputs: bench_fill_hash (W7's
 * formulas at these sizes), labels (7i + 3) % 10; perf/peers.py runs the same
 * hand-written Adam in PyTorch eager (row torch) and torch.optim.Adam (row
 * torch.optim). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

enum { NP = 4 };

typedef struct {
  int64_t batch, d_in, hidden, classes;
  bench_adam adam;
  kiln_tensor *x, *target;
  kiln_tensor *p[NP], *m[NP], *v[NP]; /* w1 [in,h], b1 [h], w2 [h,c], b2 [c] */
} model;

static void model_init(model *md, bool smoke) {
  md->batch = smoke ? 16 : 128;
  md->d_in = smoke ? 64 : 784;
  md->hidden = smoke ? 32 : 256;
  md->classes = 10;
  md->adam = (bench_adam){.lr = 1e-3, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8};
  md->x = bench_tensor_hash(2, (int64_t[]){md->batch, md->d_in}, 61, 1.0, 0);
  md->p[0] =
      bench_tensor_hash(2, (int64_t[]){md->d_in, md->hidden}, 62, sqrt(6.0 / (double)md->d_in), 0);
  md->p[1] = bench_tensor_hash(1, &md->hidden, 63, 0.01, 0);
  md->p[2] = bench_tensor_hash(2, (int64_t[]){md->hidden, md->classes}, 64,
                               sqrt(6.0 / (double)md->hidden), 0);
  md->p[3] = bench_tensor_hash(1, &md->classes, 65, 0.01, 0);
  int64_t *y = malloc(sizeof *y * (size_t)md->batch);
  if (!y) abort();
  for (int64_t i = 0; i < md->batch; i++) y[i] = (i * 7 + 3) % md->classes;
  md->target = bench_ok(kiln_from_data(y, KILN_I64, 1, &md->batch), "target");
  free(y);
  for (int i = 0; i < NP; i++) {
    bench_ok_status(kiln_set_requires_grad(md->p[i], true), "kiln_set_requires_grad");
    md->m[i] = bench_ok(kiln_zeros(KILN_F32, kiln_ndim(md->p[i]), kiln_shape(md->p[i])), "zeros");
    md->v[i] = bench_ok(kiln_zeros(KILN_F32, kiln_ndim(md->p[i]), kiln_shape(md->p[i])), "zeros");
  }
}

/* one step; returns the loss (read, as users print it) */
static double step(model *md) {
  bench_scope s = {0};
  kiln_tensor *h = bench_keep(&s, kiln_matmul(md->x, md->p[0]), "matmul");
  h = bench_keep(&s, kiln_relu(bench_keep(&s, kiln_add(h, md->p[1]), "add")), "relu");
  kiln_tensor *logits = bench_keep(&s, kiln_matmul(h, md->p[2]), "matmul");
  logits = bench_keep(&s, kiln_add(logits, md->p[3]), "add");
  kiln_tensor *loss = bench_keep(&s, kiln_cross_entropy(logits, md->target), "cross_entropy");
  double value = kiln_item(loss);
  if (isnan(value)) bench_ok(NULL, "kiln_item(loss)");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");

  bench_adam_step(&md->adam, NP, md->p, md->m, md->v, &s);
  bench_scope_free(&s);
  return value;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 30, 10);
  model md;
  model_init(&md, o.smoke);
  double loss1 = step(&md), loss2 = step(&md), loss = loss2;
  for (int r = 0; r < o.warmup; r++) { /* the timed loop's shape: a step, then sync */
    loss = step(&md);
    bench_ok_status(kiln_sync(), "kiln_sync");
  }
  kiln_jit_wait(); /* time the compiled plans, not the compiler thread */
  double traces0 = kiln_stat("traces_seen"), compiles0 = kiln_stat("compiles");
  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    loss = step(&md);
    bench_ok_status(kiln_sync(), "kiln_sync");
    times[r] = bench_now() - t0;
  }
  double traces = kiln_stat("traces_seen") - traces0, compiles = kiln_stat("compiles") - compiles0;
  if (!o.smoke && !(loss < 0.9 * loss1)) {
    fprintf(stderr, "w12: the loss did not go down: %.6f then %.6f\n", loss1, loss);
    return 1;
  }
  char check[256], extra[512];
  snprintf(check, sizeof check, "loss1=%.9g,loss2=%.9g", loss1, loss2);
  snprintf(extra, sizeof extra,
           "traces_timed=%.0f\tcompiles_timed=%.0f\tsteps=%d\tbatch=%lld\tloss_last=%.6g\t"
           "compile_ms=%.1f\tkernels=%.0f\tdisk_hits=%.0f\ttraces_seen=%.0f\tnote=%.0f new traces "
           "and %.0f "
           "compiles over the %d timed steps (after %d warm-up steps)",
           traces, compiles, md.adam.t, (long long)md.batch, loss, kiln_stat("compile_ms"),
           kiln_stat("kernels_compiled"), kiln_stat("disk_hits"), kiln_stat("traces_seen"), traces,
           compiles, o.reps, o.warmup + 2);
  bench_result("W12", o.label, times, o.reps, extra, check);
  for (int i = 0; i < NP; i++) {
    kiln_release(md.p[i]);
    kiln_release(md.m[i]);
    kiln_release(md.v[i]);
  }
  kiln_release(md.x);
  kiln_release(md.target);
  free(times);
  return 0;
}
