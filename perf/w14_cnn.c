/* w14_cnn.c — W14's second half: one training step of the digits CNN
 * (examples/cnn_digits.c's model) as users write it: ms/step.
 *
 * Model: x [64, 64] viewed as [64, 1, 8, 8]; conv 1->16 3x3 pad 1 + bias,
 * relu, max-pool 2; conv 16->32 3x3 pad 1 + bias, relu, max-pool 2;
 * reshape [64, 128]; linear 128->10; mean cross-entropy, the loss read every
 * step (kiln_item, as users print it), backward, and Adam written as users
 * write it (bench_adam_step: lr 3e-3, b1 0.9, b2 0.999, eps 1e-8; state
 * rebound every step).  A step is timed up to kiln_sync() after the update.
 *
 * Inputs (perf/peers.py and perf/w9_ruby.rb reproduce them):
 * bench_fill_hash x seed 70 amp 0.5 plus 0.5 (pixels in [0, 1)); labels
 * (7i + 3) % 10; conv1.weight [16,1,3,3] seed 71 amp sqrt(6/9), conv1.bias
 * [16] seed 72 amp 0.01, conv2.weight [32,16,3,3] seed 73 amp sqrt(6/144),
 * conv2.bias [32] seed 74 amp 0.01, fc.weight [128,10] seed 75 amp
 * sqrt(6/128), fc.bias [10] seed 76 amp 0.01.  The check is the loss of the
 * first two steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

enum { NP = 6, BATCH = 64, CLASSES = 10 };

typedef struct {
  kiln_tensor *x, *target;
  kiln_tensor *p[NP], *m[NP], *v[NP];
  bench_adam adam;
} cnn;

static void cnn_init(cnn *c) {
  int64_t n = BATCH;
  c->x = bench_tensor_hash(2, (int64_t[]){n, 64}, 70, 0.5, 0.5f);
  int64_t y[BATCH];
  for (int64_t i = 0; i < n; i++) y[i] = (i * 7 + 3) % CLASSES;
  c->target = bench_ok(kiln_from_data(y, KILN_I64, 1, &n), "target");
  c->p[0] = bench_tensor_hash(4, (int64_t[]){16, 1, 3, 3}, 71, sqrt(6.0 / 9), 0);
  c->p[1] = bench_tensor_hash(1, (int64_t[]){16}, 72, 0.01, 0);
  c->p[2] = bench_tensor_hash(4, (int64_t[]){32, 16, 3, 3}, 73, sqrt(6.0 / 144), 0);
  c->p[3] = bench_tensor_hash(1, (int64_t[]){32}, 74, 0.01, 0);
  c->p[4] = bench_tensor_hash(2, (int64_t[]){128, CLASSES}, 75, sqrt(6.0 / 128), 0);
  c->p[5] = bench_tensor_hash(1, (int64_t[]){CLASSES}, 76, 0.01, 0);
  for (int i = 0; i < NP; i++) {
    bench_ok_status(kiln_set_requires_grad(c->p[i], true), "kiln_set_requires_grad");
    c->m[i] = bench_ok(kiln_zeros(KILN_F32, kiln_ndim(c->p[i]), kiln_shape(c->p[i])), "zeros");
    c->v[i] = bench_ok(kiln_zeros(KILN_F32, kiln_ndim(c->p[i]), kiln_shape(c->p[i])), "zeros");
  }
  c->adam = (bench_adam){.lr = 3e-3, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8};
}

/* conv 3x3 pad 1 + bias, relu, 2x2 max-pool */
static kiln_tensor *block(bench_scope *s, kiln_tensor *x, kiln_tensor *w, kiln_tensor *b) {
  static const int pad[2] = {1, 1}, pool[2] = {2, 2};
  kiln_tensor *h = bench_keep(s, kiln_conv2d(x, w, b, NULL, pad, NULL, 1), "conv2d");
  h = bench_keep(s, kiln_relu(h), "relu");
  return bench_keep(s, kiln_max_pool2d(h, pool, NULL, NULL), "max_pool2d");
}

/* one step; returns the loss (read before backward) */
static double step(cnn *c) {
  bench_scope s = {0};
  kiln_tensor *img = bench_keep(&s, kiln_reshape(c->x, 4, (int64_t[]){BATCH, 1, 8, 8}), "reshape");
  kiln_tensor *h = block(&s, block(&s, img, c->p[0], c->p[1]), c->p[2], c->p[3]);
  h = bench_keep(&s, kiln_reshape(h, 2, (int64_t[]){BATCH, 128}), "reshape");
  kiln_tensor *logits = bench_keep(&s, kiln_matmul(h, c->p[4]), "matmul");
  logits = bench_keep(&s, kiln_add(logits, c->p[5]), "add");
  kiln_tensor *loss = bench_keep(&s, kiln_cross_entropy(logits, c->target), "cross_entropy");
  double value = kiln_item(loss);
  if (isnan(value)) bench_ok(NULL, "kiln_item(loss)");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  bench_adam_step(&c->adam, NP, c->p, c->m, c->v, &s);
  bench_scope_free(&s);
  return value;
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 200, 50);
  if (o.smoke) o.reps = 3, o.warmup = 1;
  cnn c;
  cnn_init(&c);
  double loss1 = step(&c), loss2 = step(&c), loss = loss2;
  for (int r = 0; r < o.warmup; r++) {
    loss = step(&c);
    bench_ok_status(kiln_sync(), "kiln_sync");
  }
  kiln_jit_wait(); /* time the compiled plans, not the compiler */
  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    loss = step(&c);
    bench_ok_status(kiln_sync(), "kiln_sync");
    times[r] = bench_now() - t0;
  }
  if (!o.smoke && !(loss < 0.5 * loss1)) {
    fprintf(stderr, "w14_cnn: the loss did not go down: %.6f then %.6f\n", loss1, loss);
    return 1;
  }
  char check[256], extra[256];
  snprintf(check, sizeof check, "loss1=%.9g,loss2=%.9g", loss1, loss2);
  snprintf(extra, sizeof extra, "steps=%d\tbatch=%d\tloss_last=%.6g\tcompiles=%.0f\teager_ops=%.0f",
           c.adam.t, BATCH, loss, kiln_stat("compiles"), kiln_stat("eager_ops"));
  bench_result("W14:cnn", o.label, times, o.reps, extra, check);
  for (int i = 0; i < NP; i++) {
    kiln_release(c.p[i]);
    kiln_release(c.m[i]);
    kiln_release(c.v[i]);
  }
  kiln_release(c.x);
  kiln_release(c.target);
  free(times);
  return 0;
}
