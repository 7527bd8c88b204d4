/* cnn_digits.c — a small convolutional network trained on the 8x8 digits
 * with Kiln's autodiff and Adam written as users write it, then saved
 * (safetensors), loaded back and checked to predict exactly the same.
 * Run by scripts/demo beside mlp_digits.
 *
 *   cnn_digits [--save PATH] [--autocast bf16|f16] [DIGITS.csv.gz]
 *
 * --autocast trains the model twice from the same start: in float32, then
 * in mixed precision (kiln_set_autocast: convolutions and the linear layer
 * in bf16/f16, f32 weights), and exits 1 unless the mixed-precision test
 * accuracy is within 0.5 points of the float32 one (issue #41).
 *
 * Model: conv 1->16 3x3 pad 1, relu, max-pool 2 -> conv 16->32 3x3 pad 1,
 * relu, max-pool 2 -> linear 128->10; mean cross-entropy; Adam (lr 3e-3).
 * The split is mlp_digits's (80/20, the same permutation).  Exits 1 if the
 * test accuracy is below 98% or the loaded weights predict differently, 2 on
 * any Kiln error. */
#define _GNU_SOURCE
#define DIGITS_PROG "cnn_digits"
#include "digits.h"

#ifndef KILN_DATA_DIR
#define KILN_DATA_DIR "data"
#endif

enum { BATCH = 64, EPOCHS = 30, NPARAM = 6 };
static const double LR = 3e-3, BETA1 = 0.9, BETA2 = 0.999, EPS = 1e-8;
static const double MIN_ACCURACY = 0.98;
static const char *const NAMES[NPARAM] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                          "conv2.bias",   "fc.weight",  "fc.bias"};

typedef struct {
  kiln_tensor *p[NPARAM]; /* the NAMES, in order */
} cnn;

static cnn cnn_init(void) {
  kiln_manual_seed(0);
  cnn m;
  m.p[0] = he(4, (int64_t[]){16, 1, 3, 3}, 9);
  m.p[1] = CK(kiln_zeros(KILN_F32, 1, (int64_t[]){16}));
  m.p[2] = he(4, (int64_t[]){32, 16, 3, 3}, 16 * 9);
  m.p[3] = CK(kiln_zeros(KILN_F32, 1, (int64_t[]){32}));
  m.p[4] = he(2, (int64_t[]){128, CLASSES}, 128);
  m.p[5] = CK(kiln_zeros(KILN_F32, 1, (int64_t[]){CLASSES}));
  for (int i = 0; i < NPARAM; i++) CKI(kiln_set_requires_grad(m.p[i], true));
  return m;
}

/* conv (3x3, padding 1) + bias, relu, 2x2 max-pool */
static kiln_tensor *block(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, scope *s) {
  static const int pad[2] = {1, 1}, pool[2] = {2, 2};
  kiln_tensor *c = KEEP(s, kiln_conv2d(x, w, b, NULL, pad, NULL, 1));
  kiln_tensor *r = KEEP(s, kiln_relu(c));
  return KEEP(s, kiln_max_pool2d(r, pool, NULL, NULL));
}

/* logits [n, 10] of images x [n, 64] */
static kiln_tensor *cnn_forward(const cnn *m, kiln_tensor *x, scope *s) {
  int64_t n = kiln_shape(x)[0];
  kiln_tensor *img = KEEP(s, kiln_reshape(x, 4, (int64_t[]){n, 1, 8, 8}));
  kiln_tensor *h = block(block(img, m->p[0], m->p[1], s), m->p[2], m->p[3], s); /* [n,32,2,2] */
  kiln_tensor *flat = KEEP(s, kiln_reshape(h, 2, (int64_t[]){n, 128}));
  return KEEP(s, kiln_add(KEEP(s, kiln_matmul(flat, m->p[4])), m->p[5]));
}

/* predicted classes of x (i64 [n]) */
static kiln_tensor *predict(const cnn *m, kiln_tensor *x) {
  scope s = {.n = 0};
  kiln_no_grad_push();
  kiln_tensor *pred = CK(kiln_argmax(cnn_forward(m, x, &s), 1, false));
  kiln_no_grad_pop();
  scope_release(&s);
  return pred;
}

static double accuracy(const cnn *m, kiln_tensor *x, kiln_tensor *y) {
  scope s = {.n = 0};
  kiln_tensor *hit = KEEP(&s, kiln_eq(KEEP(&s, predict(m, x)), y));
  kiln_tensor *acc = KEEP(&s, kiln_mean(KEEP(&s, kiln_cast(hit, KILN_F32)), 0, NULL, false));
  double a = CKD(kiln_item(acc));
  scope_release(&s);
  return a;
}

/* one Adam step for parameter i: m and v rebound, as users write it */
static void adam_step(cnn *net, kiln_tensor **mom, kiln_tensor **vel, int i, int t) {
  scope s = {.n = 0};
  kiln_tensor *g = KEEP(&s, kiln_grad(net->p[i]));
  kiln_tensor *m = CK(
      kiln_add(KEEP(&s, kiln_mul_scalar(mom[i], BETA1)), KEEP(&s, kiln_mul_scalar(g, 1 - BETA1))));
  kiln_tensor *gg = KEEP(&s, kiln_mul(g, g));
  kiln_tensor *v = CK(
      kiln_add(KEEP(&s, kiln_mul_scalar(vel[i], BETA2)), KEEP(&s, kiln_mul_scalar(gg, 1 - BETA2))));
  kiln_release(mom[i]);
  kiln_release(vel[i]);
  mom[i] = m;
  vel[i] = v;
  kiln_tensor *mhat = KEEP(&s, kiln_div_scalar(m, 1 - pow(BETA1, t)));
  kiln_tensor *vhat = KEEP(&s, kiln_div_scalar(v, 1 - pow(BETA2, t)));
  kiln_tensor *den = KEEP(&s, kiln_add_scalar(KEEP(&s, kiln_sqrt(vhat)), EPS));
  CKI(kiln_sub_scaled_(net->p[i], KEEP(&s, kiln_div(mhat, den)), LR));
  CKI(kiln_zero_grad(net->p[i]));
  scope_release(&s);
}

/* saves the weights, loads them into a fresh model, and compares its
   predictions on x with net's, element for element; true when equal */
static bool save_and_reload(const cnn *net, const char *path, kiln_tensor *x) {
  CKI(kiln_save(path, NPARAM, NAMES, net->p));
  char *names[NPARAM] = {0};
  kiln_tensor *loaded[NPARAM] = {0};
  int got = CKI(kiln_load(path, NPARAM, names, loaded));
  cnn back = {{0}};
  for (int i = 0; i < got; i++)
    for (int j = 0; j < NPARAM; j++)
      if (names[i] && !strcmp(names[i], NAMES[j])) back.p[j] = loaded[i];
  bool complete = got == NPARAM;
  for (int j = 0; j < NPARAM; j++) complete = complete && back.p[j];
  bool same = false;
  if (complete) {
    int64_t n = kiln_shape(x)[0];
    int64_t *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n);
    kiln_tensor *pa = predict(net, x), *pb = predict(&back, x);
    same = a && b && kiln_to_buffer(pa, a, sizeof *a * (size_t)n) == KILN_OK &&
           kiln_to_buffer(pb, b, sizeof *b * (size_t)n) == KILN_OK &&
           !memcmp(a, b, sizeof *a * (size_t)n);
    kiln_release(pa);
    kiln_release(pb);
    free(a);
    free(b);
  }
  for (int i = 0; i < NPARAM; i++) {
    free(names[i]);
    kiln_release(loaded[i]);
  }
  return complete && same;
}

/* trains net on (xtr, ytr) for EPOCHS, printing each epoch, its batches
   drawn from seed; its test accuracy */
static double train(cnn *net, kiln_tensor *xtr, kiln_tensor *ytr, kiln_tensor *xte,
                    kiln_tensor *yte, int64_t ntrain, int64_t *order, uint64_t seed) {
  kiln_tensor *mom[NPARAM], *vel[NPARAM];
  for (int i = 0; i < NPARAM; i++) {
    mom[i] = CK(kiln_zeros(KILN_F32, kiln_ndim(net->p[i]), kiln_shape(net->p[i])));
    vel[i] = CK(kiln_zeros(KILN_F32, kiln_ndim(net->p[i]), kiln_shape(net->p[i])));
  }
  double t_start = now_s(), acc = 0;
  int step = 0;
  rng_state = seed; /* the same batches in every run */
  printf("epoch  train loss  test acc    time\n");
  for (int epoch = 1; epoch <= EPOCHS; epoch++) {
    double t0 = now_s(), loss_sum = 0;
    for (int64_t i = 0; i < ntrain; i++) order[i] = i;
    shuffle(order, ntrain);
    for (int64_t start = 0; start < ntrain; start += BATCH) {
      int64_t nb = ntrain - start < BATCH ? ntrain - start : BATCH;
      scope s = {.n = 0};
      kiln_tensor *idx = KEEP(&s, kiln_from_data(order + start, KILN_I64, 1, (int64_t[]){nb}));
      kiln_tensor *xb = KEEP(&s, kiln_index_select(xtr, 0, idx));
      kiln_tensor *yb = KEEP(&s, kiln_index_select(ytr, 0, idx));
      kiln_tensor *loss = KEEP(&s, kiln_cross_entropy(cnn_forward(net, xb, &s), yb));
      loss_sum += CKD(kiln_item(loss)) * (double)nb; /* read before backward, as users print it */
      CKI(kiln_backward(loss, NULL));
      step++;
      kiln_no_grad_push();
      for (int p = 0; p < NPARAM; p++) adam_step(net, mom, vel, p, step);
      kiln_no_grad_pop();
      scope_release(&s);
    }
    acc = accuracy(net, xte, yte);
    printf("%5d  %10.4f  %7.2f%%  %5.0f ms\n", epoch, loss_sum / (double)ntrain, 100.0 * acc,
           1e3 * (now_s() - t0));
  }
  printf("\ntrained in %.2f s: test accuracy %.2f%%\n", now_s() - t_start, 100.0 * acc);
  for (int i = 0; i < NPARAM; i++) {
    kiln_release(mom[i]);
    kiln_release(vel[i]);
  }
  return acc;
}

int main(int argc, char **argv) {
  const char *path = KILN_DATA_DIR "/digits.csv.gz", *save = "cnn_digits.safetensors";
  kiln_dtype autocast = KILN_F32;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--save") && i + 1 < argc) {
      save = argv[++i];
    } else if (!strcmp(argv[i], "--autocast") && i + 1 < argc) {
      i++;
      autocast = !strcmp(argv[i], "bf16")  ? KILN_BF16
                 : !strcmp(argv[i], "f16") ? KILN_F16
                                           : KILN_I32;
      if (autocast == KILN_I32) {
        fprintf(stderr, "cnn_digits: --autocast takes bf16 or f16, not %s\n", argv[i]);
        return 2;
      }
    } else {
      path = argv[i];
    }
  }
  dataset d = load_digits(path);
  int64_t n = d.n, ntrain = n * 4 / 5, ntest = n - ntrain;
  int64_t *perm = malloc(sizeof *perm * (size_t)n), *order = malloc(sizeof *order * (size_t)ntrain);
  if (!perm || !order) return 2;
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  rng_state = 20240601; /* mlp_digits's split */
  shuffle(perm, n);
  kiln_tensor *xtr, *ytr, *xte, *yte;
  to_tensors(&d, perm, ntrain, &xtr, &ytr);
  to_tensors(&d, perm + ntrain, ntest, &xte, &yte);
  printf(
      "data: %lld train / %lld test; conv(1->16)-pool-conv(16->32)-pool-linear(128->10), "
      "Adam lr %g, batch %d\n\n",
      (long long)ntrain, (long long)ntest, LR, BATCH);

  cnn net = cnn_init();
  uint64_t batches = rng_state; /* where the split left the generator */
  double acc = train(&net, xtr, ytr, xte, yte, ntrain, order, batches), acc32 = acc;
  if (autocast != KILN_F32) { /* again from the same start, in mixed precision */
    for (int i = 0; i < NPARAM; i++) kiln_release(net.p[i]);
    net = cnn_init();
    printf("\nthe same in mixed precision (kiln_set_autocast %s):\n",
           autocast == KILN_BF16 ? "bf16" : "f16");
    CKI(kiln_set_autocast(autocast));
    acc = train(&net, xtr, ytr, xte, yte, ntrain, order, batches);
    CKI(kiln_set_autocast(KILN_F32));
    printf("mixed precision %.2f%% against float32 %.2f%%\n", 100.0 * acc, 100.0 * acc32);
  }
  bool same = save_and_reload(&net, save, xte);
  printf("saved %s; loaded back, it predicts %s\n", save,
         same ? "the same classes" : "DIFFERENTLY");
  kiln_stats st;
  kiln_get_stats(&st);
  printf(
      "kiln: %llu flushes, %llu traces, %.1f%% cache hits, %llu compiles, %.0f kernels compiled\n",
      (unsigned long long)st.flushes, (unsigned long long)st.traces_seen,
      100.0 * (double)st.cache_hits / (double)(st.flushes ? st.flushes : 1),
      (unsigned long long)st.compiles, kiln_stat("kernels_compiled"));
  for (int i = 0; i < NPARAM; i++) kiln_release(net.p[i]);
  kiln_release(xtr);
  kiln_release(ytr);
  kiln_release(xte);
  kiln_release(yte);
  free(perm);
  free(order);
  free(d.x);
  free(d.y);
  if (autocast != KILN_F32 && acc < acc32 - 0.005) {
    fprintf(stderr,
            "cnn_digits: FAIL: mixed precision %.2f%% is more than 0.5 points below %.2f%%\n",
            100.0 * acc, 100.0 * acc32);
    return 1;
  }
  if (acc < MIN_ACCURACY) {
    fprintf(stderr, "cnn_digits: FAIL: test accuracy %.2f%% is below %.0f%%\n", 100.0 * acc,
            100.0 * MIN_ACCURACY);
    return 1;
  }
  return same ? 0 : 1;
}
