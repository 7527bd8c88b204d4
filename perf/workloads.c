/* workloads.c — W1's expression and W7's training step written with Kiln. */
#include "workloads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

/* temporaries released together at the end of a computation */
typedef struct {
  kiln_tensor *held[64];
  int n;
} arena;

static kiln_tensor *keep(arena *a, kiln_tensor *t, const char *what) {
  bench_ok(t, what);
  if (a->n == (int)(sizeof a->held / sizeof *a->held)) abort();
  a->held[a->n++] = t;
  return t;
}

static void release_all(arena *a) {
  for (int i = 0; i < a->n; i++) kiln_release(a->held[i]);
  a->n = 0;
}

kiln_tensor *wl_w1(kiln_tensor *x, kiln_tensor *y) {
  arena a = {0};
  kiln_tensor *xy = keep(&a, kiln_mul(x, y), "mul");
  kiln_tensor *t = keep(&a, kiln_tanh(keep(&a, kiln_add_scalar(xy, 0.5), "add")), "tanh");
  kiln_tensor *l = keep(&a, kiln_mul(t, keep(&a, kiln_sigmoid(x), "sigmoid")), "mul");
  kiln_tensor *r = keep(&a, kiln_mul_scalar(keep(&a, kiln_mul(y, y), "mul"), 0.25), "mul");
  kiln_tensor *out = bench_ok(kiln_sub(l, r), "sub");
  release_all(&a);
  return out;
}

/* a rows x cols (rows 0: 1-d) tensor of bench_fill_hash values */
static kiln_tensor *tensor_hash(int64_t rows, int64_t cols, uint32_t seed, double amp) {
  int64_t n = (rows ? rows : 1) * cols; /* rows 0: a 1-d tensor of cols */
  float *buf = bench_alloc_f32(n);
  bench_fill_hash(buf, n, seed, amp);
  int64_t shape[2] = {rows, cols};
  kiln_tensor *t =
      rows ? kiln_from_data(buf, KILN_F32, 2, shape) : kiln_from_data(buf, KILN_F32, 1, &shape[1]);
  free(buf);
  return bench_ok(t, "kiln_from_data");
}

void wl_mlp_init(wl_mlp *m, bool smoke) {
  if (smoke)
    wl_mlp_init_dims(m, 16, 64, 32, 32);
  else
    wl_mlp_init_dims(m, 512, 784, 1024, 1024);
}

void wl_mlp_init_dims(wl_mlp *m, int64_t batch, int64_t d_in, int64_t h1, int64_t h2) {
  m->batch = batch;
  m->d_in = d_in;
  m->h1 = h1;
  m->h2 = h2;
  m->classes = 10;
  m->lr = 0.05;
  /* the formulas perf/peers.py uses too */
  /* x uniform in [-1, 1), weights He-uniform, biases small */
  m->x = tensor_hash(m->batch, m->d_in, 1, 1.0);
  m->w1 = tensor_hash(m->d_in, m->h1, 2, sqrt(6.0 / (double)m->d_in));
  m->b1 = tensor_hash(0, m->h1, 3, 0.01);
  m->w2 = tensor_hash(m->h1, m->h2, 4, sqrt(6.0 / (double)m->h1));
  m->b2 = tensor_hash(0, m->h2, 5, 0.01);
  m->w3 = tensor_hash(m->h2, m->classes, 6, sqrt(6.0 / (double)m->h2));
  m->b3 = tensor_hash(0, m->classes, 7, 0.01);
  int64_t *t = malloc(sizeof *t * (size_t)m->batch);
  float *oh = calloc((size_t)(m->batch * m->classes), sizeof *oh);
  if (!t || !oh) abort();
  for (int64_t i = 0; i < m->batch; i++) {
    t[i] = (i * 7 + 3) % m->classes;
    oh[i * m->classes + t[i]] = 1.0f;
  }
  m->target = bench_ok(kiln_from_data(t, KILN_I64, 1, &m->batch), "target");
  m->onehot =
      bench_ok(kiln_from_data(oh, KILN_F32, 2, (int64_t[]){m->batch, m->classes}), "onehot");
  m->zero = bench_ok(kiln_scalar(0.0, KILN_F32), "zero");
  free(t);
  free(oh);
}

static kiln_tensor *tr(arena *a, kiln_tensor *t) {
  return keep(a, kiln_transpose(t, 0, 1), "transpose");
}

/* dL/dz = g where the layer's relu output h was > 0, else 0 */
static kiln_tensor *relu_back(arena *a, const wl_mlp *m, kiln_tensor *g, kiln_tensor *h) {
  kiln_tensor *mask = keep(a, kiln_gt(h, m->zero), "gt");
  return keep(a, kiln_where(mask, g, m->zero), "where");
}

static kiln_tensor *sum_rows(arena *a, kiln_tensor *t) {
  int axis0 = 0;
  return keep(a, kiln_sum(t, 1, &axis0, false), "sum");
}

/* the forward pass: the logits; h1 and h2 (relu outputs) through *h1o, *h2o */
static kiln_tensor *forward(arena *a, wl_mlp *m, kiln_tensor **h1o, kiln_tensor **h2o) {
  kiln_tensor *z1 = keep(a, kiln_add(keep(a, kiln_matmul(m->x, m->w1), "matmul"), m->b1), "add");
  kiln_tensor *h1 = keep(a, kiln_relu(z1), "relu");
  kiln_tensor *z2 = keep(a, kiln_add(keep(a, kiln_matmul(h1, m->w2), "matmul"), m->b2), "add");
  kiln_tensor *h2 = keep(a, kiln_relu(z2), "relu");
  *h1o = h1;
  *h2o = h2;
  return keep(a, kiln_add(keep(a, kiln_matmul(h2, m->w3), "matmul"), m->b3), "add");
}

kiln_tensor *wl_mlp_step(wl_mlp *m) {
  arena a = {0};
  kiln_tensor *h1, *h2, *logits = forward(&a, m, &h1, &h2);
  kiln_tensor *loss = bench_ok(kiln_cross_entropy(logits, m->target), "cross_entropy");
  /* backward, by hand: d loss / d logits = (softmax - onehot) / batch */
  kiln_tensor *p = keep(&a, kiln_softmax(logits, 1), "softmax");
  kiln_tensor *g3 = keep(
      &a, kiln_mul_scalar(keep(&a, kiln_sub(p, m->onehot), "sub"), 1.0 / (double)m->batch), "mul");
  kiln_tensor *dw3 = keep(&a, kiln_matmul(tr(&a, h2), g3), "matmul");
  kiln_tensor *db3 = sum_rows(&a, g3);
  kiln_tensor *g2 = relu_back(&a, m, keep(&a, kiln_matmul(g3, tr(&a, m->w3)), "matmul"), h2);
  kiln_tensor *dw2 = keep(&a, kiln_matmul(tr(&a, h1), g2), "matmul");
  kiln_tensor *db2 = sum_rows(&a, g2);
  kiln_tensor *g1 = relu_back(&a, m, keep(&a, kiln_matmul(g2, tr(&a, m->w2)), "matmul"), h1);
  kiln_tensor *dw1 = keep(&a, kiln_matmul(tr(&a, m->x), g1), "matmul");
  kiln_tensor *db1 = sum_rows(&a, g1);
  /* SGD */
  bench_ok_status(kiln_sub_scaled_(m->w1, dw1, m->lr), "sub_scaled_");
  bench_ok_status(kiln_sub_scaled_(m->b1, db1, m->lr), "sub_scaled_");
  bench_ok_status(kiln_sub_scaled_(m->w2, dw2, m->lr), "sub_scaled_");
  bench_ok_status(kiln_sub_scaled_(m->b2, db2, m->lr), "sub_scaled_");
  bench_ok_status(kiln_sub_scaled_(m->w3, dw3, m->lr), "sub_scaled_");
  bench_ok_status(kiln_sub_scaled_(m->b3, db3, m->lr), "sub_scaled_");
  release_all(&a);
  return loss;
}

void wl_mlp_track(wl_mlp *m) {
  kiln_tensor *params[] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
  for (int i = 0; i < 6; i++)
    bench_ok_status(kiln_set_requires_grad(params[i], true), "requires_grad");
}

kiln_tensor *wl_mlp_step_autodiff(wl_mlp *m) {
  arena a = {0};
  kiln_tensor *h1, *h2, *logits = forward(&a, m, &h1, &h2);
  kiln_tensor *loss = bench_ok(kiln_cross_entropy(logits, m->target), "cross_entropy");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  kiln_tensor *params[] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
  bench_sgd_step(params, 6, m->lr);
  release_all(&a);
  return loss;
}

void wl_mlp_to_device(wl_mlp *m, kiln_device d) {
  kiln_tensor **all[] = {&m->x,  &m->target, &m->onehot, &m->zero, &m->w1,
                         &m->b1, &m->w2,     &m->b2,     &m->w3,   &m->b3};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    kiln_tensor *t = bench_ok(kiln_to_device(*all[i], d), "kiln_to_device");
    kiln_release(*all[i]);
    *all[i] = t;
  }
}

static float *copy_out(kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  float *buf = bench_alloc_f32(n);
  bench_ok_status(kiln_to_buffer(t, buf, sizeof *buf * (size_t)n), "kiln_to_buffer");
  return buf;
}

/* sum((after - before)^2) in double, from float32 values as the peers do */
static double delta2(kiln_tensor *after, const float *before) {
  float *a = copy_out(after);
  double s = 0;
  for (int64_t i = 0, n = kiln_numel(after); i < n; i++) {
    double d = (double)a[i] - (double)before[i];
    s += d * d;
  }
  free(a);
  return s;
}

void wl_mlp_check(wl_mlp *m, kiln_tensor *(*step)(wl_mlp *), char *out, size_t cap) {
  kiln_tensor *params[6] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
  float *before[6];
  for (int i = 0; i < 6; i++) before[i] = copy_out(params[i]);
  kiln_tensor *loss = step(m);
  double loss1 = kiln_item(loss);
  kiln_release(loss);
  /* kiln_sub_scaled_ rebinds the handles: m->w1 ... now name the new values */
  kiln_tensor *now[6] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
  double d[6];
  for (int i = 0; i < 6; i++) {
    d[i] = delta2(now[i], before[i]);
    free(before[i]);
  }
  loss = step(m);
  double loss2 = kiln_item(loss);
  kiln_release(loss);
  snprintf(out, cap, "loss1=%.9g,loss2=%.9g,dw1=%.9g,db1=%.9g,dw2=%.9g,db2=%.9g,dw3=%.9g,db3=%.9g",
           loss1, loss2, d[0], d[1], d[2], d[3], d[4], d[5]);
}

void wl_mlp_free(wl_mlp *m) {
  kiln_tensor *all[] = {m->x,  m->target, m->onehot, m->zero, m->w1,
                        m->b1, m->w2,     m->b2,     m->w3,   m->b3};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
}
