/* w11_transformer.c — W11: a pre-LN transformer block, forward + backward,
 * 4 heads, dim 128, seq 64, batch 8: ms per iteration and matmul calls per
 * iteration (kiln_stat("blas_calls"): gemm calls into BLAS).
 *
 *   h  = layer_norm(x, ln1)
 *   q, k, v = h @ Wq + bq, h @ Wk + bk, h @ Wv + bv   -> [B, heads, S, D/heads]
 *   a  = softmax(q @ k^T / sqrt(D/heads))
 *   x1 = x + (a @ v, heads merged) @ Wo + bo
 *   y  = x1 + gelu(layer_norm(x1, ln2) @ W1 + b1) @ W2 + b2      (W1: D x 4D)
 *   loss = mean(y * y)
 * One iteration: the forward, the loss read (kiln_item, as users print it),
 * kiln_backward, and an SGD update (lr 0.01) of the 16 parameters from their
 * .grad (which is what makes the backward pass run), zero_grad.
 *
 * Reported besides the time: blas_per_iter (gemm calls per timed iteration)
 * and blas_fwd (the same forward alone under no_grad, loss read): a backward
 * that does not recompute the forward needs blas_per_iter = 3 x blas_fwd
 * (each forward matmul has two in the backward).  Inputs and weights:
 * bench_fill_hash, reproduced by perf/peers.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

enum { LN1W, LN1B, WQ, BQ, WK, BK, WV, BV, WO, BO, LN2W, LN2B, W1, B1, W2, B2, NPARAM };

typedef struct {
  int64_t B, S, D, heads, F;
  double lr;
  kiln_tensor *x, *p[NPARAM];
} block;

static void block_init(block *m, bool smoke) {
  m->B = smoke ? 2 : 8;
  m->S = smoke ? 8 : 64;
  m->D = smoke ? 32 : 128;
  m->heads = 4;
  m->F = 4 * m->D;
  m->lr = 0.01;
  int64_t D = m->D, F = m->F;
  double a = 1.0 / sqrt((double)D), af = 1.0 / sqrt((double)F);
  m->x = bench_tensor_hash(3, (int64_t[]){m->B, m->S, D}, 40, 1.0, 0);
  m->p[LN1W] = bench_tensor_hash(1, &D, 41, 0.1, 1.0f);
  m->p[LN1B] = bench_tensor_hash(1, &D, 42, 0.1, 0);
  int64_t dd[2] = {D, D};
  m->p[WQ] = bench_tensor_hash(2, dd, 43, a, 0);
  m->p[BQ] = bench_tensor_hash(1, &D, 44, 0.01, 0);
  m->p[WK] = bench_tensor_hash(2, dd, 45, a, 0);
  m->p[BK] = bench_tensor_hash(1, &D, 46, 0.01, 0);
  m->p[WV] = bench_tensor_hash(2, dd, 47, a, 0);
  m->p[BV] = bench_tensor_hash(1, &D, 48, 0.01, 0);
  m->p[WO] = bench_tensor_hash(2, dd, 49, a, 0);
  m->p[BO] = bench_tensor_hash(1, &D, 50, 0.01, 0);
  m->p[LN2W] = bench_tensor_hash(1, &D, 51, 0.1, 1.0f);
  m->p[LN2B] = bench_tensor_hash(1, &D, 52, 0.1, 0);
  m->p[W1] = bench_tensor_hash(2, (int64_t[]){D, F}, 53, a, 0);
  m->p[B1] = bench_tensor_hash(1, &F, 54, 0.01, 0);
  m->p[W2] = bench_tensor_hash(2, (int64_t[]){F, D}, 55, af, 0);
  m->p[B2] = bench_tensor_hash(1, &D, 56, 0.01, 0);
  for (int i = 0; i < NPARAM; i++)
    bench_ok_status(kiln_set_requires_grad(m->p[i], true), "kiln_set_requires_grad");
}

static kiln_tensor *linear(bench_scope *s, kiln_tensor *x, kiln_tensor *w, kiln_tensor *b) {
  kiln_tensor *y = bench_keep(s, kiln_matmul(x, w), "matmul");
  return bench_keep(s, kiln_add(y, b), "add");
}

/* [B, S, D] -> [B, heads, S, D/heads] */
static kiln_tensor *split_heads(bench_scope *s, const block *m, kiln_tensor *t) {
  t = bench_keep(s, kiln_reshape(t, 4, (int64_t[]){m->B, m->S, m->heads, m->D / m->heads}),
                 "reshape");
  return bench_keep(s, kiln_permute(t, (int[]){0, 2, 1, 3}), "permute");
}

/* the block's output y, then the scalar loss mean(y*y) */
static kiln_tensor *forward_loss(bench_scope *s, const block *m) {
  kiln_tensor *h = bench_keep(s, kiln_layer_norm(m->x, m->p[LN1W], m->p[LN1B], 1e-5), "layer_norm");
  kiln_tensor *q = split_heads(s, m, linear(s, h, m->p[WQ], m->p[BQ]));
  kiln_tensor *k = split_heads(s, m, linear(s, h, m->p[WK], m->p[BK]));
  kiln_tensor *v = split_heads(s, m, linear(s, h, m->p[WV], m->p[BV]));
  kiln_tensor *kt = bench_keep(s, kiln_transpose(k, 2, 3), "transpose");
  kiln_tensor *sc = bench_keep(s, kiln_matmul(q, kt), "matmul");
  sc = bench_keep(s, kiln_mul_scalar(sc, 1.0 / sqrt((double)(m->D / m->heads))), "mul_scalar");
  kiln_tensor *att = bench_keep(s, kiln_softmax(sc, 3), "softmax");
  kiln_tensor *o = bench_keep(s, kiln_matmul(att, v), "matmul");
  o = bench_keep(s, kiln_permute(o, (int[]){0, 2, 1, 3}), "permute");
  o = bench_keep(s, kiln_reshape(o, 3, (int64_t[]){m->B, m->S, m->D}), "reshape");
  kiln_tensor *x1 = bench_keep(s, kiln_add(m->x, linear(s, o, m->p[WO], m->p[BO])), "add");
  kiln_tensor *h2 = bench_keep(s, kiln_layer_norm(x1, m->p[LN2W], m->p[LN2B], 1e-5), "layer_norm");
  kiln_tensor *f = bench_keep(s, kiln_gelu(linear(s, h2, m->p[W1], m->p[B1])), "gelu");
  kiln_tensor *y = bench_keep(s, kiln_add(x1, linear(s, f, m->p[W2], m->p[B2])), "add");
  kiln_tensor *y2 = bench_keep(s, kiln_mul(y, y), "mul");
  return bench_keep(s, kiln_mean(y2, 0, NULL, false), "mean");
}

/* one iteration; returns the loss read before backward */
static double iteration(block *m) {
  bench_scope s = {0};
  kiln_tensor *loss = forward_loss(&s, m);
  double value = kiln_item(loss);
  if (isnan(value)) bench_ok(NULL, "kiln_item(loss)");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  bench_sgd_step(m->p, NPARAM, m->lr);
  bench_scope_free(&s);
  return value;
}

static void settle_step(void *m) {
  iteration(m);
  bench_ok_status(kiln_sync(), "kiln_sync");
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 31, 2); /* medians of 11 swung 30% on a loaded 2-core machine */
  block m;
  block_init(&m, o.smoke);

  /* the forward alone, once, for its matmul count */
  double b0 = kiln_stat("blas_calls");
  kiln_no_grad_push();
  bench_scope s = {0};
  double loss0 = kiln_item(forward_loss(&s, &m));
  bench_scope_free(&s);
  kiln_no_grad_pop();
  bench_ok_status(kiln_sync(), "kiln_sync");
  double blas_fwd = kiln_stat("blas_calls") - b0;

  double loss1 = iteration(&m), loss2 = iteration(&m), loss = loss2;
  for (int r = 0; r < o.warmup; r++) { /* the timed loop's shape: an iteration, then sync */
    loss = iteration(&m);
    bench_ok_status(kiln_sync(), "kiln_sync");
  }
  /* steady state: the steps until the JIT settles (then its compiles are
     waited for: the compiled plans are timed, not the compiler) */
  int settle = o.smoke ? 0 : bench_settle(settle_step, &m, 400, 20.0);
  if (o.smoke) kiln_jit_wait();
  double *times = calloc((size_t)o.reps, sizeof *times);
  b0 = kiln_stat("blas_calls");
  for (int r = 0; r < o.reps; r++) {
    double t0 = bench_now();
    loss = iteration(&m);
    bench_ok_status(kiln_sync(), "kiln_sync");
    times[r] = bench_now() - t0;
  }
  double blas_iter = (kiln_stat("blas_calls") - b0) / (double)o.reps;
  if (!o.smoke && !(loss < loss1)) {
    fprintf(stderr, "w11: the loss did not go down: %.6f then %.6f\n", loss1, loss);
    return 1;
  }
  char check[256], extra[512];
  snprintf(check, sizeof check, "loss0=%.9g,loss1=%.9g,loss2=%.9g", loss0, loss1, loss2);
  snprintf(extra, sizeof extra,
           "blas_per_iter=%.1f\tblas_fwd=%.0f\tbatch=%lld\tseq=%lld\tdim=%lld\theads=%lld\t"
           "loss_last=%.6g\tcompile_ms=%.1f\tkernels=%.0f\tdisk_hits=%.0f\ttraces_seen=%.0f\t"
           "settle_steps=%d\tnote=fwd+bwd+SGD; "
           "matmul calls per iteration %.1f (forward alone %.0f; no recompute: 3x the forward); "
           "timed after the JIT settled (%d steps)",
           blas_iter, blas_fwd, (long long)m.B, (long long)m.S, (long long)m.D, (long long)m.heads,
           loss, kiln_stat("compile_ms"), kiln_stat("kernels_compiled"), kiln_stat("disk_hits"),
           kiln_stat("traces_seen"), settle, blas_iter, blas_fwd, settle);
  bench_result("W11", o.label, times, o.reps, extra, check);
  for (int i = 0; i < NPARAM; i++) kiln_release(m.p[i]);
  kiln_release(m.x);
  free(times);
  return 0;
}
