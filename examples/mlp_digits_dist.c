/* mlp_digits_dist.c — the demo's digits MLP trained data-parallel over MPI:
 *
 *   mpirun -np 2 build/release/examples/mlp_digits_dist [DIGITS.csv.gz]
 *
 * Every rank holds the whole model and shuffles the training set the same
 * way; each global batch of 64 rows is split between the ranks, each rank
 * runs forward and backward on its rows, and kiln_dist_average_grads makes
 * every rank's gradients the mean over the ranks, so N processes train
 * exactly the model one process trains on the whole batch (up to float
 * rounding).  Rank 0 prints the epochs and the test accuracy.  Exits 1 if
 * the final test accuracy is below 95%, 2 on any Kiln error (a run outside
 * mpirun is one: kiln_dist_init says how to start it). */
#define _GNU_SOURCE
#include <kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#ifndef KILN_DATA_DIR
#define KILN_DATA_DIR "data"
#endif

#define DIGITS_PROG "mlp_digits_dist"
#include "digits.h"

enum { HIDDEN = 128, BATCH = 64, EPOCHS = 25 };
static const double LR = 0.2;

/* logits = relu(x @ w1 + b1) @ w2 + b2; temporaries go to s */
static kiln_tensor *forward(kiln_tensor *const *p, kiln_tensor *x, scope *s) {
  kiln_tensor *h = KEEP(s, kiln_relu(KEEP(s, kiln_add(KEEP(s, kiln_matmul(x, p[0])), p[1]))));
  return KEEP(s, kiln_add(KEEP(s, kiln_matmul(h, p[2])), p[3]));
}

int main(int argc, char **argv) {
  CKI(kiln_dist_init());
  int rank = CKI(kiln_dist_rank()), size = CKI(kiln_dist_size());
  dataset d = load_digits(argc > 1 ? argv[1] : KILN_DATA_DIR "/digits.csv.gz");
  /* the same split and the same shuffles on every rank */
  int64_t n = d.n, ntrain = n * 4 / 5, ntest = n - ntrain;
  int64_t *perm = malloc(sizeof *perm * (size_t)n), *order = malloc(sizeof *order * (size_t)ntrain);
  if (!perm || !order) die(__LINE__, "out of memory");
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  rng_state = 20240601;
  shuffle(perm, n);
  kiln_tensor *xtr, *ytr, *xte, *yte;
  to_tensors(&d, perm, ntrain, &xtr, &ytr);
  to_tensors(&d, perm + ntrain, ntest, &xte, &yte);

  kiln_manual_seed(0); /* the same initial weights on every rank */
  kiln_tensor *p[4] = {he(2, (int64_t[]){PIXELS, HIDDEN}, PIXELS),
                       CK(kiln_zeros(KILN_F32, 1, (int64_t[]){HIDDEN})),
                       he(2, (int64_t[]){HIDDEN, CLASSES}, HIDDEN),
                       CK(kiln_zeros(KILN_F32, 1, (int64_t[]){CLASSES}))};
  for (int i = 0; i < 4; i++) CKI(kiln_set_requires_grad(p[i], true));
  if (rank == 0)
    printf(
        "%d ranks; model 64-%d-10, global batch %d (%d rows per rank), lr %g\n\nepoch  train loss  "
        "test acc    time\n",
        size, HIDDEN, BATCH, BATCH / size, LR);
  double t_start = now_s(), acc = 0;
  for (int epoch = 1; epoch <= EPOCHS; epoch++) {
    double t0 = now_s();
    for (int64_t i = 0; i < ntrain; i++) order[i] = i;
    shuffle(order, ntrain);
    kiln_tensor *loss_sum = CK(kiln_zeros(KILN_F32, 0, NULL));
    for (int64_t start = 0; start < ntrain; start += BATCH) {
      int64_t nb = ntrain - start < BATCH ? ntrain - start : BATCH;
      int64_t lo = start + nb * rank / size, hi = start + nb * (rank + 1) / size;
      scope s = {.n = 0};
      kiln_tensor *idx = KEEP(&s, kiln_from_data(order + lo, KILN_I64, 1, (int64_t[]){hi - lo}));
      kiln_tensor *xb = KEEP(&s, kiln_index_select(xtr, 0, idx));
      kiln_tensor *yb = KEEP(&s, kiln_index_select(ytr, 0, idx));
      kiln_tensor *logits = forward(p, xb, &s);
      /* this rank's share of the global batch's mean loss, times the
         ranks: their average is then exactly the global batch's mean */
      kiln_tensor *ce = KEEP(&s, kiln_cross_entropy(logits, yb));
      kiln_tensor *loss = KEEP(&s, kiln_mul_scalar(ce, (double)(hi - lo) * size / (double)nb));
      CKI(kiln_backward(loss, NULL));
      CKI(kiln_dist_average_grads(4, p));
      kiln_no_grad_push();
      for (int i = 0; i < 4; i++) {
        kiln_tensor *g = CK(kiln_grad(p[i]));
        CKI(kiln_sub_scaled_(p[i], g, LR));
        kiln_release(g);
        CKI(kiln_zero_grad(p[i]));
      }
      kiln_tensor *lossd = KEEP(&s, kiln_detach(ce));
      kiln_tensor *sum =
          CK(kiln_add(loss_sum, KEEP(&s, kiln_mul_scalar(lossd, (double)(hi - lo)))));
      kiln_no_grad_pop();
      kiln_release(loss_sum);
      loss_sum = sum;
      scope_release(&s);
      CKI(kiln_sync()); /* one trace per step, the all-reduces inside it */
    }
    /* the epoch's loss over every rank's rows */
    kiln_tensor *total = CK(kiln_all_reduce(loss_sum, KILN_REDUCE_SUM));
    double loss = CKD(kiln_item(total)) / (double)ntrain;
    kiln_release(total);
    kiln_release(loss_sum);
    kiln_no_grad_push();
    scope s = {.n = 0};
    kiln_tensor *logits = forward(p, xte, &s);
    kiln_tensor *hit = KEEP(&s, kiln_eq(KEEP(&s, kiln_argmax(logits, 1, false)), yte));
    acc = CKD(kiln_item(KEEP(&s, kiln_mean(KEEP(&s, kiln_cast(hit, KILN_F32)), 0, NULL, false))));
    scope_release(&s);
    kiln_no_grad_pop();
    if (rank == 0)
      printf("%5d  %10.4f  %7.2f%%  %5.0f ms\n", epoch, loss, 100 * acc, 1e3 * (now_s() - t0));
  }
  if (rank == 0)
    printf("\ntrained in %.2f s on %d ranks; all-reduce: %.0f payloads, %.1f MB, %.0f ms waited\n",
           now_s() - t_start, size, kiln_stat("all_reduces"), kiln_stat("all_reduce_bytes") / 1e6,
           kiln_stat("all_reduce_wait_ms"));
  for (int i = 0; i < 4; i++) kiln_release(p[i]);
  kiln_release(xtr);
  kiln_release(ytr);
  kiln_release(xte);
  kiln_release(yte);
  free(perm);
  free(order);
  free(d.x);
  free(d.y);
  CKI(kiln_dist_finalize());
  return acc >= 0.95 ? 0 : 1;
}
