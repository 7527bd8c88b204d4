/* test_attention.c — kiln_scaled_dot_product_attention (the attention
 * primitive, vm/kern_attention.c): values against a reference written here
 * in plain C (f64, 1e-12) over lengths that cross the kernel's query and
 * key blocks (1..1000), head sizes 16..128, without and with a causal
 * mask, a bool mask and an additive float mask, broadcast batch dims;
 * gradients against the composite a user writes (matmul, softmax, matmul,
 * differentiated by autodiff) in f64 and against finite differences;
 * non-contiguous q, k, v (slices of one fused projection) giving the same
 * bits as contiguous copies; rows with every key masked giving 0 and no
 * NaN; the composite route (a float mask that takes a gradient); the work
 * counted (gemms per block, no T x T buffer in memory); the backward
 * spread over blocks for few batch items giving the same bits as by items
 * (KILN_THREADS 1 and 4); bad input as clear errors.  JIT on vs off: test_bitwise_training's model
 * has an attention layer. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ktest.h"

#define F32 KILN_F32
#define F64 KILN_F64

static uint64_t g_seed = 0x5eedull;
static double unif(void) { return ktest_unif01(&g_seed); }
static double *rand_vals(int64_t n, double lo, double hi) {
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * unif();
  return v;
}

/* one case: batch b x h heads; mask kind: 0 none, 1 bool [b,1,tq,tk]
   (every 5th key of a row masked, some rows fully), 2 float [tq,tk],
   3 bool key padding [b,1,1,tk] */
typedef struct {
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  int mask;
  double scale; /* <= 0: 1/sqrt(d) */
} acase;

static int64_t mask_dims(const acase *c, int64_t *shape) {
  switch (c->mask) {
    case 1:
      shape[0] = c->b, shape[1] = 1, shape[2] = c->tq, shape[3] = c->tk;
      return 4;
    case 2:
      shape[0] = c->tq, shape[1] = c->tk;
      return 2;
    case 3:
      shape[0] = c->b, shape[1] = 1, shape[2] = 1, shape[3] = c->tk;
      return 4;
  }
  return 0;
}

/* the mask value at (batch z, query i, key j): keep (bool) or the addend */
static double mask_at(const acase *c, const double *mv, int64_t z, int64_t i, int64_t j) {
  int64_t bz = z / c->h;
  switch (c->mask) {
    case 1:
      return mv[(bz * c->tq + i) * c->tk + j];
    case 2:
      return mv[i * c->tk + j];
    case 3:
      return mv[bz * c->tk + j];
  }
  return 1;
}

static double *mask_values(const acase *c, int64_t *n) {
  int64_t shape[4], nd = mask_dims(c, shape);
  *n = 1;
  for (int i = 0; i < nd; i++) *n *= shape[i];
  double *mv = malloc((size_t)(*n ? *n : 1) * sizeof *mv);
  for (int64_t e = 0; e < *n; e++) {
    if (c->mask == 2) {
      mv[e] = unif() < 0.1 ? -INFINITY : unif() * 2 - 1;
    } else if (c->mask == 1) {
      int64_t i = e / c->tk % c->tq, j = e % c->tk;
      mv[e] = i % 7 == 3 ? 0 : (double)((i + 2 * j) % 5 != 0); /* row 3 (mod 7): none kept */
    } else {
      int64_t bz = e / c->tk, j = e % c->tk;
      mv[e] = j < c->tk - bz; /* item bz: its last bz keys are padding */
    }
  }
  return mv;
}

/* softmax(q kᵀ s + mask) v in plain C, f64; rows with no key give 0 */
static double *reference(const acase *c, const double *q, const double *k, const double *v,
                         const double *mv) {
  int64_t z = c->b * c->h;
  double s = c->scale > 0 ? c->scale : 1 / sqrt((double)c->d);
  double *out = calloc((size_t)(z * c->tq * c->dv + 1), sizeof *out);
  double *sc = malloc((size_t)(c->tk + 1) * sizeof *sc);
  for (int64_t b = 0; b < z; b++)
    for (int64_t i = 0; i < c->tq; i++) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < c->tk; j++) {
        double acc = 0;
        for (int64_t e = 0; e < c->d; e++)
          acc += q[(b * c->tq + i) * c->d + e] * k[(b * c->tk + j) * c->d + e];
        acc *= s;
        if (c->mask == 2) acc += mask_at(c, mv, b, i, j);
        if ((c->mask == 1 || c->mask == 3) && !mask_at(c, mv, b, i, j)) acc = -INFINITY;
        if (c->causal && j > i) acc = -INFINITY;
        sc[j] = acc;
        mx = acc > mx ? acc : mx;
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (int64_t j = 0; j < c->tk; j++) sum += sc[j] = exp(sc[j] - mx);
      for (int64_t j = 0; j < c->tk; j++)
        for (int64_t e = 0; e < c->dv; e++)
          out[(b * c->tq + i) * c->dv + e] += sc[j] / sum * v[(b * c->tk + j) * c->dv + e];
    }
  free(sc);
  return out;
}

static kiln_tensor *mask_tensor(const acase *c, const double *mv, kiln_dtype dt) {
  if (!c->mask) return NULL;
  int64_t shape[4], nd = mask_dims(c, shape);
  kiln_tensor *m64 = kiln_from_data(mv, F64, (int)nd, shape);
  kiln_tensor *m = kiln_cast(m64, c->mask == 2 ? dt : KILN_BOOL);
  kiln_release(m64);
  return m;
}

/* every output within tol + rel |reference| of the reference (the first
   three that are not reported) */
static bool outputs_close(const acase *c, const char *what, const double *got, const double *want,
                          double tol, double rel) {
  int reports = 0;
  for (int64_t e = 0; e < c->b * c->h * c->tq * c->dv; e++)
    if (!(fabs(got[e] - want[e]) <= tol + rel * fabs(want[e])) && reports++ < 3)
      KTEST_FAIL(
          "%sb%lld h%lld tq%lld tk%lld d%lld dv%lld causal %d mask %d: out[%lld] = %.17g, "
          "reference %.17g",
          what, (long long)c->b, (long long)c->h, (long long)c->tq, (long long)c->tk,
          (long long)c->d, (long long)c->dv, c->causal, c->mask, (long long)e, got[e], want[e]);
  return reports == 0;
}

static bool case_forward(const acase *c, kiln_dtype dt, double tol) {
  int64_t z = c->b * c->h, nm;
  double *q = rand_vals(z * c->tq * c->d, -1.5, 1.5), *k = rand_vals(z * c->tk * c->d, -1.5, 1.5);
  double *v = rand_vals(z * c->tk * c->dv, -1, 1), *mv = mask_values(c, &nm);
  double *want = reference(c, q, k, v, mv);
  kiln_tensor *qt = ktest_from_doubles(dt, 4, (int64_t[]){c->b, c->h, c->tq, c->d}, q);
  kiln_tensor *kt = ktest_from_doubles(dt, 4, (int64_t[]){c->b, c->h, c->tk, c->d}, k);
  kiln_tensor *vt = ktest_from_doubles(dt, 4, (int64_t[]){c->b, c->h, c->tk, c->dv}, v);
  kiln_tensor *mt = mask_tensor(c, mv, dt);
  kiln_tensor *o = kiln_scaled_dot_product_attention(qt, kt, vt, mt, c->causal, c->scale);
  bool ok = o != NULL;
  if (!o) {
    KTEST_FAIL("attention failed: %s", kiln_last_error());
  } else {
    CHECK(kiln_ndim(o) == 4 && kiln_shape(o)[2] == c->tq && kiln_shape(o)[3] == c->dv);
    double *got = ktest_values(o);
    ok = outputs_close(c, "", got, want, tol, 0);
    free(got);
  }
  kiln_release(o);
  kiln_release(qt), kiln_release(kt), kiln_release(vt), kiln_release(mt);
  free(q), free(k), free(v), free(mv), free(want);
  return ok;
}

TEST(forward_matches_reference_f64) {
  /* lengths around the blocks (64 queries, 256 keys) and head sizes 16..128 */
  static const acase cases[] = {
      {1, 1, 1, 1, 16, 16, false, 0, 0},      {2, 3, 5, 7, 16, 8, false, 0, 0},
      {1, 2, 64, 64, 32, 32, false, 0, 0},    {1, 2, 65, 257, 16, 24, false, 0, 0},
      {2, 1, 130, 300, 64, 64, true, 0, 0},   {1, 1, 300, 130, 16, 16, true, 0, 0},
      {2, 2, 70, 90, 32, 16, false, 1, 0},    {2, 2, 70, 513, 16, 16, false, 2, 0.3},
      {3, 2, 33, 40, 128, 32, true, 3, 0},    {2, 1, 129, 129, 16, 16, true, 1, 0},
      {1, 1, 1000, 1000, 16, 16, true, 0, 0}, {1, 1, 1000, 600, 32, 16, false, 2, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (!case_forward(&cases[i], F64, 1e-12)) break;
}

TEST(forward_f32_close_to_reference) {
  static const acase cases[] = {{2, 3, 100, 300, 64, 64, true, 0, 0},
                                {2, 2, 70, 90, 32, 16, false, 1, 0},
                                {2, 2, 17, 513, 16, 16, false, 2, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (!case_forward(&cases[i], F32, 2e-6)) break;
}

/* bf16 q, k, v (an f32 float mask): within bf16's rounding of the
   attention of the values they hold (the reference in f64 on the bf16
   values): the probabilities rounded to bf16 for P V where the CPU has AMX
   (vm/kern_attention.c), the output rounded once: |err| <= 2^-8 |out| +
   2^-8 max |v| */
static bool case_forward_bf16(const acase *c) {
  int64_t z = c->b * c->h, nm;
  double *x[3] = {rand_vals(z * c->tq * c->d, -1.5, 1.5), rand_vals(z * c->tk * c->d, -1.5, 1.5),
                  rand_vals(z * c->tk * c->dv, -1, 1)};
  double *mv = mask_values(c, &nm);
  const int64_t shapes[3][4] = {
      {c->b, c->h, c->tq, c->d}, {c->b, c->h, c->tk, c->d}, {c->b, c->h, c->tk, c->dv}};
  kiln_tensor *t[3];
  for (int e = 0; e < 3; e++) { /* the values bf16 holds, for the reference */
    t[e] = ktest_from_doubles(KILN_BF16, 4, shapes[e], x[e]);
    free(x[e]);
    x[e] = ktest_values(t[e]);
  }
  double *want = reference(c, x[0], x[1], x[2], mv);
  kiln_tensor *mt = mask_tensor(c, mv, F32);
  kiln_tensor *o = kiln_scaled_dot_product_attention(t[0], t[1], t[2], mt, c->causal, c->scale);
  bool ok = o != NULL;
  if (!o) {
    KTEST_FAIL("attention failed: %s", kiln_last_error());
  } else {
    CHECK_EQ_INT(kiln_dtype_of(o), KILN_BF16);
    double *got = ktest_values(o);
    ok = outputs_close(c, "bf16 ", got, want, 0x1p-8 + 1e-6, 0x1p-8);
    free(got);
  }
  kiln_release(o), kiln_release(mt);
  for (int e = 0; e < 3; e++) kiln_release(t[e]), free(x[e]);
  free(mv), free(want);
  return ok;
}

/* blocks of 128 queries and 512 keys, lengths and head sizes off AMX's
   32, every kind of mask; test_attention_no_amx runs it in f32 products */
TEST(forward_bf16_close_to_reference) {
  static const acase cases[] = {
      {2, 3, 100, 300, 64, 64, true, 0, 0},   {2, 2, 70, 90, 32, 16, false, 1, 0},
      {2, 2, 17, 513, 16, 16, false, 2, 0},   {1, 2, 300, 130, 8, 4, true, 3, 0.3},
      {1, 1, 200, 1100, 40, 72, false, 2, 0}, {1, 1, 1, 1, 16, 16, false, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (!case_forward_bf16(&cases[i])) break;
}

/* the composite a user writes, in kiln ops: softmax(q kᵀ s + mask) v;
   kept a composite (never recorded as the attention op) by p * 1 between
   the softmax and the product, a near-miss of trace/attention.h */
static kiln_tensor *composite_as(bool plain, kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                 kiln_tensor *mask, bool causal, double s);
static kiln_tensor *composite(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, kiln_tensor *mask,
                              bool causal, double s) {
  return composite_as(true, q, k, v, mask, causal, s);
}
static kiln_tensor *composite_as(bool plain, kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                 kiln_tensor *mask, bool causal, double s) {
  kiln_tensor *kt = kiln_transpose(k, -1, -2), *sc0 = kiln_matmul(q, kt);
  kiln_tensor *sc = kiln_mul_scalar(sc0, s);
  kiln_release(kt), kiln_release(sc0);
  kiln_tensor *ninf = kiln_scalar(-INFINITY, kiln_dtype_of(q)); /* a f64 fill would promote */
  if (causal) {
    int64_t tq = kiln_shape(q)[kiln_ndim(q) - 2], tk = kiln_shape(k)[kiln_ndim(k) - 2];
    kiln_tensor *ai = kiln_arange(0, (double)tq, 1, KILN_I64),
                *aj = kiln_arange(0, (double)tk, 1, KILN_I64);
    kiln_tensor *ai2 = kiln_reshape(ai, 2, (int64_t[]){tq, 1}), *later = kiln_gt(aj, ai2);
    kiln_tensor *w = kiln_where(later, ninf, sc);
    kiln_release(ai), kiln_release(aj), kiln_release(ai2), kiln_release(later), kiln_release(sc);
    sc = w;
  }
  if (mask && kiln_dtype_of(mask) == KILN_BOOL) {
    kiln_tensor *w = kiln_where(mask, sc, ninf);
    kiln_release(sc);
    sc = w;
  } else if (mask) {
    kiln_tensor *w = kiln_add(sc, mask);
    kiln_release(sc);
    sc = w;
  }
  kiln_tensor *p = kiln_softmax(sc, -1);
  if (plain) {
    kiln_tensor *p1 = kiln_mul_scalar(p, 1.0);
    kiln_release(p);
    p = p1;
  }
  kiln_tensor *o = kiln_matmul(p, v);
  kiln_release(sc), kiln_release(p), kiln_release(ninf);
  return o;
}

/* gradients of sum(out * w) for q, k, v by the op and by the composite */
static void grads_of(bool op, const acase *c, const double *q, const double *k, const double *v,
                     const double *mv, const double *w, double **gq, double **gk, double **gv,
                     double **out) {
  kiln_tensor *t[3] = {
      kiln_from_data(q, F64, 4, (int64_t[]){c->b, c->h, c->tq, c->d}),
      kiln_from_data(k, F64, 4, (int64_t[]){c->b, c->h, c->tk, c->d}),
      kiln_from_data(v, F64, 4, (int64_t[]){c->b, c->h, c->tk, c->dv}),
  };
  for (int i = 0; i < 3; i++) kiln_set_requires_grad(t[i], true);
  kiln_tensor *m = mask_tensor(c, mv, F64);
  double s = c->scale > 0 ? c->scale : 1 / sqrt((double)c->d);
  kiln_tensor *o = op ? kiln_scaled_dot_product_attention(t[0], t[1], t[2], m, c->causal, c->scale)
                      : composite(t[0], t[1], t[2], m, c->causal, s);
  kiln_tensor *wt = kiln_from_data(w, F64, 4, (int64_t[]){c->b, c->h, c->tq, c->dv});
  kiln_tensor *prod = kiln_mul(o, wt), *loss = kiln_sum(prod, 0, NULL, false), *g[3] = {0};
  if (kiln_grad_of(1, &loss, NULL, 3, t, g, false) != 0)
    KTEST_FAIL("kiln_grad_of (%s): %s", op ? "op" : "composite", kiln_last_error());
  *gq = g[0] ? ktest_values(g[0]) : NULL;
  *gk = g[1] ? ktest_values(g[1]) : NULL;
  *gv = g[2] ? ktest_values(g[2]) : NULL;
  *out = o ? ktest_values(o) : NULL;
  for (int i = 0; i < 3; i++) kiln_release(t[i]), kiln_release(g[i]);
  kiln_release(m), kiln_release(o), kiln_release(wt), kiln_release(prod), kiln_release(loss);
}

static void compare(const char *what, const acase *c, const double *a, const double *b, int64_t n,
                    double tol) {
  if (!a || !b) {
    KTEST_FAIL("%s: missing", what);
    return;
  }
  int reports = 0;
  for (int64_t e = 0; e < n; e++)
    if (!(fabs(a[e] - b[e]) <= tol * fmax(1, fabs(b[e]))) && reports++ < 3)
      KTEST_FAIL("tq%lld tk%lld d%lld causal %d mask %d: %s[%lld] = %.17g, composite %.17g",
                 (long long)c->tq, (long long)c->tk, (long long)c->d, c->causal, c->mask, what,
                 (long long)e, a[e], b[e]);
}

TEST(gradients_match_the_composite_f64) {
  /* no fully masked row here: the composite gives NaN there (see
     fully_masked_rows_give_zero) */
  static const acase cases[] = {
      {1, 2, 5, 7, 16, 8, false, 0, 0},      {2, 1, 70, 300, 16, 16, true, 0, 0},
      {1, 2, 130, 90, 32, 16, false, 2, 0},  {3, 1, 40, 40, 16, 32, true, 3, 0.2},
      {1, 1, 300, 600, 64, 16, false, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const acase *c = &cases[i];
    int64_t z = c->b * c->h, nm;
    double *q = rand_vals(z * c->tq * c->d, -1.5, 1.5), *k = rand_vals(z * c->tk * c->d, -1.5, 1.5);
    double *v = rand_vals(z * c->tk * c->dv, -1, 1), *w = rand_vals(z * c->tq * c->dv, -1, 1);
    double *mv = mask_values(c, &nm);
    if (c->mask == 2) /* finite, so that no row is fully masked */
      for (int64_t e = 0; e < nm; e++) mv[e] = isinf(mv[e]) ? -30 : mv[e];
    double *g1[4], *g2[4];
    grads_of(true, c, q, k, v, mv, w, &g1[0], &g1[1], &g1[2], &g1[3]);
    grads_of(false, c, q, k, v, mv, w, &g2[0], &g2[1], &g2[2], &g2[3]);
    compare("out", c, g1[3], g2[3], z * c->tq * c->dv, 1e-12);
    compare("dq", c, g1[0], g2[0], z * c->tq * c->d, 1e-11);
    compare("dk", c, g1[1], g2[1], z * c->tk * c->d, 1e-11);
    compare("dv", c, g1[2], g2[2], z * c->tk * c->dv, 1e-11);
    for (int j = 0; j < 4; j++) free(g1[j]), free(g2[j]);
    free(q), free(k), free(v), free(w), free(mv);
  }
}

/* d/dx of sum(attention(q, k, v) * w) by central differences, one input */
TEST(gradients_match_finite_differences) {
  acase c = {1, 2, 3, 4, 3, 2, true, 0, 0.7};
  int64_t sizes[3] = {2 * 3 * 3, 2 * 4 * 3, 2 * 4 * 2};
  const int64_t shapes[3][4] = {{1, 2, 3, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}};
  double *x[3];
  for (int i = 0; i < 3; i++) x[i] = rand_vals(sizes[i], -1, 1);
  double *w = rand_vals(2 * 3 * 2, -1, 1), *g[4];
  grads_of(true, &c, x[0], x[1], x[2], NULL, w, &g[0], &g[1], &g[2], &g[3]);
  for (int i = 0; i < 3; i++)
    for (int64_t e = 0; e < sizes[i]; e++) {
      double l[2], x0 = x[i][e];
      for (int side = 0; side < 2; side++) {
        x[i][e] = x0 + (side ? -1e-6 : 1e-6);
        kiln_tensor *t[3], *wt = kiln_from_data(w, F64, 4, (int64_t[]){1, 2, 3, 2});
        for (int j = 0; j < 3; j++) t[j] = kiln_from_data(x[j], F64, 4, shapes[j]);
        kiln_tensor *o = kiln_scaled_dot_product_attention(t[0], t[1], t[2], NULL, true, 0.7);
        kiln_tensor *p = kiln_mul(o, wt), *s = kiln_sum(p, 0, NULL, false);
        l[side] = kiln_item(s);
        for (int j = 0; j < 3; j++) kiln_release(t[j]);
        kiln_release(wt), kiln_release(o), kiln_release(p), kiln_release(s);
      }
      x[i][e] = x0;
      double fd = (l[0] - l[1]) / 2e-6;
      if (g[i]) CHECK_CLOSE(g[i][e], fd, 1e-6);
    }
  for (int i = 0; i < 4; i++) free(g[i]);
  for (int i = 0; i < 3; i++) free(x[i]);
  free(w);
}

/* q, k, v as a transformer makes them: slices of one [B, T, 3*H*d]
   projection, viewed as [B, H, T, d] (strides H*d apart in rows) */
TEST(non_contiguous_inputs_give_the_same_bits) {
  const int64_t B = 2, T = 77, H = 3, d = 16;
  double *x = rand_vals(B * T * 3 * H * d, -1, 1);
  kiln_tensor *qkv = ktest_from_doubles(F32, 3, (int64_t[]){B, T, 3 * H * d}, x);
  kiln_tensor *v[3], *c[3];
  for (int i = 0; i < 3; i++) {
    kiln_tensor *s = kiln_slice(qkv, 2, i * H * d, (i + 1) * H * d, 1);
    kiln_tensor *r = kiln_reshape(s, 4, (int64_t[]){B, T, H, d});
    v[i] = kiln_permute(r, (int[]){0, 2, 1, 3});
    c[i] = kiln_clone(v[i]);
    kiln_release(s), kiln_release(r);
  }
  kiln_tensor *a = kiln_scaled_dot_product_attention(v[0], v[1], v[2], NULL, true, 0);
  kiln_tensor *b = kiln_scaled_dot_product_attention(c[0], c[1], c[2], NULL, true, 0);
  double *va = ktest_values(a), *vb = ktest_values(b);
  CHECK(a && b && !memcmp(va, vb, (size_t)(B * H * T * d) * sizeof(double)));
  free(va), free(vb);
  kiln_release(a), kiln_release(b), kiln_release(qkv);
  for (int i = 0; i < 3; i++) kiln_release(v[i]), kiln_release(c[i]);
  free(x);
}

/* a query whose keys are all masked out attends to nothing: 0, and no NaN
   in any gradient (PyTorch's SDPA since 2.5; the plain composite: NaN) */
TEST(fully_masked_rows_give_zero) {
  const int64_t T = 4, d = 2;
  double q[] = {1, 0, 0, 1, 1, 1, -1, 0.5}, k[] = {0.3, 0.1, -0.2, 0.4, 1, 1, 0, 0};
  double vv[] = {1, 2, 3, 4, 5, 6, 7, 8},
         m[] = {1, 1, 0, 0, /* row 1: none */ 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1};
  for (int route = 0; route < 2; route++) { /* the primitive; the composite route */
    kiln_tensor *qt = kiln_from_data(q, F64, 2, (int64_t[]){T, d}),
                *kt = kiln_from_data(k, F64, 2, (int64_t[]){T, d}),
                *vt = kiln_from_data(vv, F64, 2, (int64_t[]){T, d});
    kiln_tensor *m64 = kiln_from_data(m, F64, 2, (int64_t[]){T, T}), *mask;
    if (route == 0) {
      mask = kiln_cast(m64, KILN_BOOL);
    } else { /* 0 / -inf additive, taking a gradient: composed */
      kiln_tensor *keep = kiln_cast(m64, KILN_BOOL), *zero = kiln_scalar(0, F64),
                  *ninf = kiln_scalar(-INFINITY, F64);
      mask = kiln_where(keep, zero, ninf);
      kiln_tensor *leaf = kiln_detach(mask);
      kiln_release(mask), kiln_release(keep), kiln_release(zero), kiln_release(ninf);
      mask = leaf;
      kiln_set_requires_grad(mask, true);
    }
    kiln_set_requires_grad(qt, true);
    kiln_set_requires_grad(kt, true);
    kiln_tensor *o = kiln_scaled_dot_product_attention(qt, kt, vt, mask, false, 0);
    double *ov = ktest_values(o);
    CHECK(ov[2] == 0 && ov[3] == 0);
    CHECK(isfinite(ov[0]) && isfinite(ov[7]));
    kiln_tensor *s = kiln_sum(o, 0, NULL, false), *in[2] = {qt, kt}, *g[2] = {0};
    CHECK(kiln_grad_of(1, &s, NULL, 2, in, g, false) == 0);
    for (int i = 0; i < 2; i++) {
      double *gv = g[i] ? ktest_values(g[i]) : NULL;
      for (int e = 0; gv && e < T * d; e++) CHECK(isfinite(gv[e]));
      if (gv && i == 0) CHECK(gv[2] == 0 && gv[3] == 0); /* the dead query's */
      free(gv);
      kiln_release(g[i]);
    }
    free(ov);
    kiln_release(s), kiln_release(o), kiln_release(qt), kiln_release(kt), kiln_release(vt);
    kiln_release(m64), kiln_release(mask);
  }
}

/* a float mask that takes a gradient goes the composite route: its
   gradient equals the composite's, and q's equal the primitive's */
TEST(float_mask_gradient_by_the_composite) {
  acase c = {1, 2, 6, 5, 4, 3, false, 2, 0};
  int64_t nm;
  double *q = rand_vals(2 * 6 * 4, -1, 1), *k = rand_vals(2 * 5 * 4, -1, 1);
  double *v = rand_vals(2 * 5 * 3, -1, 1), *mv = mask_values(&c, &nm);
  for (int64_t e = 0; e < nm; e++) mv[e] = isinf(mv[e]) ? -3 : mv[e];
  double *gm[2], *gq[2];
  for (int route = 0; route < 2; route++) {
    kiln_tensor *qt = kiln_from_data(q, F64, 4, (int64_t[]){1, 2, 6, 4}),
                *kt = kiln_from_data(k, F64, 4, (int64_t[]){1, 2, 5, 4}),
                *vt = kiln_from_data(v, F64, 4, (int64_t[]){1, 2, 5, 3}),
                *mt = kiln_from_data(mv, F64, 2, (int64_t[]){6, 5});
    kiln_set_requires_grad(qt, true);
    kiln_set_requires_grad(mt, true);
    kiln_tensor *o = route ? composite(qt, kt, vt, mt, false, 0.5)
                           : kiln_scaled_dot_product_attention(qt, kt, vt, mt, false, 0);
    kiln_tensor *sq = kiln_mul(o, o), *s = kiln_sum(sq, 0, NULL, false), *in[2] = {qt, mt},
                *g[2] = {0};
    CHECK(kiln_grad_of(1, &s, NULL, 2, in, g, false) == 0);
    gq[route] = ktest_values(g[0]);
    gm[route] = ktest_values(g[1]);
    for (int i = 0; i < 2; i++) kiln_release(g[i]);
    kiln_release(qt), kiln_release(kt), kiln_release(vt), kiln_release(mt), kiln_release(o);
    kiln_release(sq), kiln_release(s);
  }
  for (int e = 0; e < 30; e++) CHECK_CLOSE(gm[0][e], gm[1][e], 1e-12);
  for (int e = 0; e < 48; e++) CHECK_CLOSE(gq[0][e], gq[1][e], 1e-12);
  for (int i = 0; i < 2; i++) free(gm[i]), free(gq[i]);
  free(q), free(k), free(v), free(mv);
}

static double max_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0;
}

/* the scores are never a T x T buffer: forward + backward at T = 2048 (a
   score matrix is 16 MiB in f32; the composite holds several) raise the
   process's peak RSS by less than one, and the gemms are per block; so
   does the composite written the long way, recorded as the op */
TEST(no_score_matrix_in_memory) {
  const int64_t T = 2048, d = 32;
  kiln_manual_seed(3);
  kiln_tensor *t[3];
  for (int pass = 0; pass < 3; pass++) { /* pass 0 at T = 64: BLAS and the pool start */
    int64_t n = pass ? T : 64;
    for (int i = 0; i < 3; i++) {
      t[i] = kiln_randn(F32, 3, (int64_t[]){1, n, d});
      kiln_set_requires_grad(t[i], true);
    }
    double before = max_rss_mib();
    kiln_reset_stats();
    kiln_tensor *o = pass == 2 ? composite_as(false, t[0], t[1], t[2], NULL, true, 0.125)
                               : kiln_scaled_dot_product_attention(t[0], t[1], t[2], NULL, true, 0);
    kiln_tensor *s = kiln_sum(o, 0, NULL, false);
    CHECK(kiln_backward(s, NULL) == 0);
    kiln_tensor *gq = kiln_grad(t[0]);
    double *gv = ktest_values(gq);
    CHECK(isfinite(gv[0]) && isfinite(gv[n * d - 1]));
    free(gv);
    if (pass) {
      double grew = max_rss_mib() - before;
      if (!(grew < 12))
        KTEST_FAIL("pass %d: peak RSS grew %.1f MiB at T = %lld", pass, grew, (long long)T);
      if (pass == 2) CHECK_EQ_INT(kiln_stat("attention_rewrites"), 1);
      /* causal: 16 query blocks of 128, 1..4 key blocks of 512 each (40
         in all, of 64), and 10 gemms a block forward and backward, no
         more; the causal mask written out (pass 2) is the causal op, not
         a mask over all 64 blocks */
      CHECK(kiln_stat("blas_calls") <= 40 * 10);
    }
    kiln_release(gq), kiln_release(s), kiln_release(o);
    for (int i = 0; i < 3; i++) kiln_release(t[i]);
  }
}

static double *values_and_release(kiln_tensor *t) {
  double *v = t ? ktest_values(t) : NULL;
  if (!t) KTEST_FAIL("NULL: %s", kiln_last_error());
  kiln_release(t);
  return v;
}

/* attention written the long way is recorded as the op (trace/attention.h):
   each common form gives the op's own bits, counted once; reading the
   weights afterwards still gives them */
TEST(long_way_is_one_attention_op) {
  acase c = {2, 2, 9, 11, 8, 4, false, 2, 0};
  int64_t z = c.b * c.h, nm;
  double *qv = rand_vals(z * c.tq * c.d, -1, 1), *kv = rand_vals(z * c.tk * c.d, -1, 1);
  double *vv = rand_vals(z * c.tk * c.dv, -1, 1), *mv = mask_values(&c, &nm);
  for (int64_t e = 0; e < nm; e++) mv[e] = isinf(mv[e]) ? -7 : mv[e];
  kiln_tensor *q = kiln_from_data(qv, F64, 4, (int64_t[]){2, 2, 9, 8}),
              *k = kiln_from_data(kv, F64, 4, (int64_t[]){2, 2, 11, 8}),
              *v = kiln_from_data(vv, F64, 4, (int64_t[]){2, 2, 11, 4});
  kiln_tensor *fm = kiln_from_data(mv, F64, 2, (int64_t[]){9, 11});
  kiln_tensor *zero = kiln_scalar(0, F64), *bm = kiln_gt(fm, zero); /* keep where > 0 */
  double s = 1 / sqrt(8.0);
  int64_t n = z * c.tq * c.dv;
  kiln_tensor *ai = kiln_arange(0, 9, 1, KILN_I64), *aj = kiln_arange(0, 11, 1, KILN_I64);
  kiln_tensor *ai2 = kiln_reshape(ai, 2, (int64_t[]){9, 1});
  kiln_tensor *ninf = kiln_scalar(-INFINITY, F64);
  for (int form = 0; form < 8; form++) {
    double before = kiln_stat("attention_rewrites");
    kiln_tensor *got = NULL, *want = NULL;
    switch (form) {
      case 0: /* softmax(q kT * s) v */
        got = composite_as(false, q, k, v, NULL, false, s);
        want = kiln_scaled_dot_product_attention(q, k, v, NULL, false, 0);
        break;
      case 1: /* + a float mask */
        got = composite_as(false, q, k, v, fm, false, s);
        want = kiln_scaled_dot_product_attention(q, k, v, fm, false, 0);
        break;
      case 2: /* where(keep, scores, -inf) */
        got = composite_as(false, q, k, v, bm, false, s);
        want = kiln_scaled_dot_product_attention(q, k, v, bm, false, 0);
        break;
      case 3: { /* masked_fill(later, -inf): causal written out */
        got = composite_as(false, q, k, v, NULL, true, s);
        want = kiln_scaled_dot_product_attention(q, k, v, NULL, true, 0);
        break;
      }
      case 4: { /* mask + scores / sqrt(d) */
        kiln_tensor *kt = kiln_transpose(k, -1, -2), *sc = kiln_matmul(q, kt);
        kiln_tensor *sd = kiln_div_scalar(sc, sqrt(8.0)), *x = kiln_add(fm, sd);
        kiln_tensor *p = kiln_softmax(x, -1);
        got = kiln_matmul(p, v);
        want = kiln_scaled_dot_product_attention(q, k, v, fm, false, 0);
        kiln_release(kt), kiln_release(sc), kiln_release(sd), kiln_release(x), kiln_release(p);
        break;
      }
      case 6:   /* the causal keep mask where(j <= i, x, -inf) is causal */
      case 7: { /* near-miss: where(j >= i, -inf, x) masks the diagonal too */
        kiln_tensor *kt = kiln_transpose(k, -1, -2), *sc = kiln_matmul(q, kt);
        kiln_tensor *x = kiln_mul_scalar(sc, s),
                    *cond = form == 6 ? kiln_le(aj, ai2) : kiln_ge(aj, ai2);
        kiln_tensor *w = form == 6 ? kiln_where(cond, x, ninf) : kiln_where(cond, ninf, x);
        kiln_tensor *p = kiln_softmax(w, -1), *keep = form == 7 ? kiln_lt(aj, ai2) : NULL;
        got = kiln_matmul(p, v);
        want = kiln_scaled_dot_product_attention(q, k, v, keep, form == 6, 0);
        kiln_release(kt), kiln_release(sc), kiln_release(x), kiln_release(cond), kiln_release(w);
        kiln_release(p), kiln_release(keep);
        break;
      }
      case 5: { /* q scaled first: no scale after the product */
        kiln_tensor *qs = kiln_mul_scalar(q, s), *kt = kiln_transpose(k, -1, -2);
        kiln_tensor *sc = kiln_matmul(qs, kt), *p = kiln_softmax(sc, -1);
        got = kiln_matmul(p, v);
        want = kiln_scaled_dot_product_attention(qs, k, v, NULL, false, 1.0);
        kiln_release(qs), kiln_release(kt), kiln_release(sc), kiln_release(p);
        break;
      }
    }
    CHECK_EQ_INT(kiln_stat("attention_rewrites") - before, 1);
    double *gv = values_and_release(got), *wv = values_and_release(want);
    double tol = form == 4 ? 1e-13 : 0; /* / sqrt(d) vs * (1 / sqrt(d)) */
    for (int64_t e = 0; gv && wv && e < n; e++)
      if (!(fabs(gv[e] - wv[e]) <= tol)) {
        KTEST_FAIL("form %d: out[%lld] = %.17g, the op's %.17g", form, (long long)e, gv[e], wv[e]);
        break;
      }
    free(gv), free(wv);
  }
  kiln_release(ai), kiln_release(aj), kiln_release(ai2), kiln_release(ninf);
  /* the weights, read after the rewrite: recomputed, the composite's bits */
  kiln_tensor *kt = kiln_transpose(k, -1, -2), *sc = kiln_matmul(q, kt),
              *x = kiln_mul_scalar(sc, s);
  kiln_tensor *p = kiln_softmax(x, -1), *o = kiln_matmul(p, v);
  kiln_tensor *p2 = kiln_softmax(x, -1), *p3 = kiln_mul_scalar(p2, 1.0);
  double *pv = ktest_values(p), *p3v = ktest_values(p3);
  CHECK(!memcmp(pv, p3v, (size_t)(z * 9 * 11) * sizeof(double)));
  free(pv), free(p3v);
  kiln_release(kt), kiln_release(sc), kiln_release(x), kiln_release(p), kiln_release(o);
  kiln_release(p2), kiln_release(p3);
  kiln_release(q), kiln_release(k), kiln_release(v), kiln_release(fm), kiln_release(zero);
  kiln_release(bm);
  free(qv), free(kv), free(vv), free(mv);
}

/* in bf16 and f16 the long way has casts between its parts (autocast's
   operands of each matmul; a half softmax taken in f32; half scores
   meeting an f32 mask; on CPUs without AVX512-BF16, and always for f16, a
   half matmul is an f32 matmul cast back): recorded as the op all the
   same, counted once, in the composite's dtype, with the bits of the
   attention op called the same way, and its gradients */
TEST(half_long_way_is_one_attention_op) {
  acase c = {2, 2, 9, 11, 8, 4, false, 2, 0.25}, cn = {2, 2, 9, 11, 8, 4, false, 0, 0.25};
  int64_t z = c.b * c.h, nm, n = z * c.tq * c.dv;
  double *qv = rand_vals(z * c.tq * c.d, -1, 1), *kv = rand_vals(z * c.tk * c.d, -1, 1);
  double *vv = rand_vals(z * c.tk * c.dv, -1, 1), *mv = mask_values(&c, &nm);
  double *wv = rand_vals(n, -1, 1);
  for (int64_t e = 0; e < nm; e++) mv[e] = isinf(mv[e]) ? -7 : mv[e];
  kiln_tensor *q = kiln_from_data(qv, F64, 4, (int64_t[]){2, 2, 9, 8}),
              *k = kiln_from_data(kv, F64, 4, (int64_t[]){2, 2, 11, 8}),
              *v = kiln_from_data(vv, F64, 4, (int64_t[]){2, 2, 11, 4});
  kiln_tensor *fm64 = kiln_from_data(mv, F64, 2, (int64_t[]){9, 11});
  kiln_tensor *w64 = kiln_from_data(wv, F64, 4, (int64_t[]){2, 2, 9, 4});
  kiln_tensor *fm = kiln_cast(fm64, KILN_F32), *w = kiln_cast(w64, KILN_F32);
  kiln_tensor *zero = kiln_scalar(0, KILN_F32), *bm = kiln_gt(fm, zero); /* keep where > 0 */
  double *ref[2] = {reference(&c, qv, kv, vv, mv), reference(&cn, qv, kv, vv, mv)};
  /* form: 0 autocast + f32 mask, 1 autocast without a mask, 2 bf16
     tensors + f32 mask (an f32 result), 3 f16 tensors + a bool mask */
  for (int form = 0; form < 4; form++) {
    kiln_dtype half = form == 3 ? KILN_F16 : KILN_BF16, in_dt = form < 2 ? KILN_F32 : half;
    kiln_tensor *mask = form == 0 || form == 2 ? fm : form == 3 ? bm : NULL;
    double *g[2][3] = {{0}}, *o[2] = {0};
    kiln_dtype got_dt[2] = {0};
    double rewrites[2];
    for (int route = 0; route < 2; route++) { /* 0: the op, 1: the long way */
      kiln_tensor *t[3] = {kiln_cast(q, in_dt), kiln_cast(k, in_dt), kiln_cast(v, in_dt)};
      for (int i = 0; i < 3; i++) kiln_set_requires_grad(t[i], true);
      if (form < 2) CHECK_EQ_INT(kiln_set_autocast(half), 0);
      double before = kiln_stat("attention_rewrites");
      /* f32 probabilities times a bf16 v are an f32 product: the op on
         the halves cast to f32 */
      kiln_tensor *a[3] = {0};
      for (int i = 0; i < 3; i++) a[i] = form == 2 ? kiln_cast(t[i], KILN_F32) : kiln_retain(t[i]);
      kiln_tensor *out =
          route ? composite_as(false, t[0], t[1], t[2], mask, false, 0.25)
                : kiln_scaled_dot_product_attention(a[0], a[1], a[2], mask, false, 0.25);
      for (int i = 0; i < 3; i++) kiln_release(a[i]);
      rewrites[route] = kiln_stat("attention_rewrites") - before;
      CHECK_EQ_INT(kiln_set_autocast(KILN_F32), 0);
      if (!out) {
        KTEST_FAIL("form %d route %d: %s", form, route, kiln_last_error());
        break;
      }
      got_dt[route] = kiln_dtype_of(out);
      kiln_tensor *wc = kiln_cast(w, got_dt[route]), *pr = kiln_mul(out, wc);
      kiln_tensor *l = kiln_sum(pr, 0, NULL, false), *gr[3] = {0};
      CHECK(kiln_grad_of(1, &l, NULL, 3, t, gr, false) == 0);
      for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(kiln_dtype_of(gr[i]), in_dt); /* gradients in the inputs' dtype */
        g[route][i] = values_and_release(gr[i]);
        kiln_release(t[i]);
      }
      o[route] = values_and_release(out);
      kiln_release(wc), kiln_release(pr), kiln_release(l);
    }
    CHECK_EQ_INT(rewrites[1], 1); /* the long way: one attention op */
    CHECK_EQ_INT(rewrites[0], 0);
    CHECK_EQ_INT(got_dt[0], form == 2 ? KILN_F32 : half);
    CHECK_EQ_INT(got_dt[1], got_dt[0]);
    for (int64_t e = 0; o[0] && o[1] && e < n; e++) {
      if (o[0][e] != o[1][e]) {
        KTEST_FAIL("form %d: out[%lld] = %.9g, the op's %.9g", form, (long long)e, o[1][e],
                   o[0][e]);
        break;
      }
      /* and attention itself: half inputs, f32 inside, one rounding */
      double want = ref[form == 1][e];
      if (form != 3 && !(fabs(o[0][e] - want) <= 0.03 + 0.02 * fabs(want))) {
        KTEST_FAIL("form %d: out[%lld] = %.9g, attention's %.9g", form, (long long)e, o[0][e],
                   want);
        break;
      }
    }
    int64_t sizes[3] = {z * c.tq * c.d, z * c.tk * c.d, z * c.tk * c.dv};
    for (int i = 0; i < 3; i++) {
      if (g[0][i] && g[1][i] && memcmp(g[0][i], g[1][i], (size_t)sizes[i] * sizeof(double)))
        KTEST_FAIL("form %d: gradient %d differs from the op's", form, i);
      free(g[0][i]), free(g[1][i]);
    }
    free(o[0]), free(o[1]);
  }
  free(ref[0]), free(ref[1]);
  kiln_release(q), kiln_release(k), kiln_release(v), kiln_release(fm64), kiln_release(w64);
  kiln_release(fm), kiln_release(w), kiln_release(zero), kiln_release(bm);
  free(qv), free(kv), free(vv), free(mv), free(wv);
}

/* under bf16 autocast, attention of f32 q, k, v reads them rounded to
   bf16 itself (no casts made: ops.def attr.dtype): its output and its
   gradients have the bits of attention of the rounded values given as
   f32 tensors, in the forward (AMX tiles, or f32 products with
   KILN_AMX=0: test_attention_no_amx) and in the backward, by items or
   over blocks */
static void grads_under_autocast(const acase *c, kiln_tensor *const *in, kiln_tensor *mask,
                                 kiln_tensor *w, double **vals) {
  CHECK(kiln_set_autocast(KILN_BF16) == KILN_OK);
  kiln_tensor *o =
      kiln_scaled_dot_product_attention(in[0], in[1], in[2], mask, c->causal, c->scale);
  CHECK(kiln_set_autocast(KILN_F32) == KILN_OK);
  CHECK(o && kiln_dtype_of(o) == KILN_BF16);
  kiln_tensor *of = kiln_cast(o, KILN_F32), *pr = kiln_mul(of, w);
  kiln_tensor *l = kiln_sum(pr, 0, NULL, false), *g[3] = {0};
  CHECK(kiln_grad_of(1, &l, NULL, 3, (kiln_tensor **)in, g, false) == KILN_OK);
  vals[0] = values_and_release(o);
  for (int i = 0; i < 3; i++) vals[1 + i] = values_and_release(g[i]);
  kiln_release(of), kiln_release(pr), kiln_release(l);
}

TEST(autocast_attention_rounds_its_operands) {
  static const acase cases[] = {{2, 2, 70, 90, 40, 24, false, 2, 0},
                                {1, 1, 300, 700, 32, 16, true, 0, 0}};
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
    const acase *c = &cases[ci];
    int64_t z = c->b * c->h, nm;
    const int64_t shapes[4][4] = {{c->b, c->h, c->tq, c->d},
                                  {c->b, c->h, c->tk, c->d},
                                  {c->b, c->h, c->tk, c->dv},
                                  {c->b, c->h, c->tq, c->dv}};
    const int64_t n[4] = {z * c->tq * c->d, z * c->tk * c->d, z * c->tk * c->dv, z * c->tq * c->dv};
    double *x[4], *mv = mask_values(c, &nm);
    for (int e = 0; e < 4; e++) x[e] = rand_vals(n[e], -1.5, 1.5);
    kiln_tensor *raw[3], *rounded[3], *w = ktest_from_doubles(F32, 4, shapes[3], x[3]);
    for (int e = 0; e < 3; e++) {
      raw[e] = ktest_from_doubles(F32, 4, shapes[e], x[e]);
      kiln_tensor *h = kiln_cast(raw[e], KILN_BF16), *f = kiln_cast(h, KILN_F32);
      double *hv = ktest_values(f); /* the rounded values, as a tensor of their own */
      rounded[e] = ktest_from_doubles(F32, 4, shapes[e], hv);
      free(hv), kiln_release(h), kiln_release(f);
      CHECK(kiln_set_requires_grad(raw[e], true) == KILN_OK);
      CHECK(kiln_set_requires_grad(rounded[e], true) == KILN_OK);
    }
    kiln_tensor *m = mask_tensor(c, mv, F32);
    double *a[4] = {0}, *b[4] = {0};
    grads_under_autocast(c, raw, m, w, a);
    grads_under_autocast(c, rounded, m, w, b);
    const int64_t count[4] = {n[3], n[0], n[1], n[2]};
    for (int e = 0; e < 4; e++) {
      if (a[e] && b[e] && memcmp(a[e], b[e], (size_t)count[e] * sizeof(double)))
        KTEST_FAIL("case %zu: %s differs from attention of the rounded values", ci,
                   e ? "a gradient" : "the output");
      free(a[e]), free(b[e]);
    }
    for (int e = 0; e < 3; e++) kiln_release(raw[e]), kiln_release(rounded[e]);
    kiln_release(w), kiln_release(m);
    for (int e = 0; e < 4; e++) free(x[e]);
    free(mv);
  }
}

/* what is not attention's softmax, or not one the op takes, stays a
   composite: counted zero times, computing what it says */
TEST(near_misses_stay_composites) {
  kiln_manual_seed(4);
  kiln_tensor *q = kiln_randn(F64, 3, (int64_t[]){2, 5, 4}),
              *k = kiln_randn(F64, 3, (int64_t[]){2, 6, 4});
  kiln_tensor *v = kiln_randn(F64, 3, (int64_t[]){2, 6, 3}), *kt = kiln_transpose(k, -1, -2);
  kiln_tensor *sc = kiln_matmul(q, kt), *fm = kiln_randn(F64, 2, (int64_t[]){5, 6});
  kiln_tensor *zero = kiln_scalar(0, F64), *keep = kiln_gt(fm, zero),
              *quarters = kiln_full(0.25, F64, 1, (int64_t[]){2});
  kiln_tensor *half = kiln_sum(quarters, 0, NULL, false);
  kiln_tensor *ninf = kiln_scalar(-INFINITY, F64), *fmg = kiln_detach(fm);
  kiln_set_requires_grad(fmg, true);
  double before = kiln_stat("attention_rewrites");
  for (int form = 0; form < 5; form++) {
    kiln_tensor *x = NULL, *p = NULL;
    switch (form) {
      case 0: /* softmax over the queries, not the keys */
        x = kiln_retain(sc);
        p = kiln_softmax(x, 1);
        break;
      case 1: { /* dropout-like: the weights times something between */
        x = kiln_retain(sc);
        kiln_tensor *p0 = kiln_softmax(x, -1);
        p = kiln_mul(p0, keep);
        kiln_release(p0);
        break;
      }
      case 2: /* a float mask that takes a gradient */
        x = kiln_add(sc, fmg);
        p = kiln_softmax(x, -1);
        break;
      case 3: { /* two masks */
        kiln_tensor *a = kiln_add(sc, fm);
        x = kiln_where(keep, a, ninf);
        kiln_release(a);
        p = kiln_softmax(x, -1);
        break;
      }
      case 4: /* a computed 0-d tensor, not a fill, as the scale */
        x = kiln_mul(sc, half);
        p = kiln_softmax(x, -1);
        break;
    }
    kiln_tensor *o = kiln_matmul(p, v);
    CHECK(o != NULL);
    double *ov = values_and_release(o);
    CHECK(ov && isfinite(ov[0]));
    free(ov);
    kiln_release(x), kiln_release(p);
  }
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - before, 0);
  kiln_release(q), kiln_release(k), kiln_release(v), kiln_release(kt), kiln_release(sc);
  kiln_release(fm), kiln_release(zero), kiln_release(keep), kiln_release(half), kiln_release(ninf);
  kiln_release(quarters);
  kiln_release(fmg);
}

/* gradients through the rewritten composite are the op's, bit for bit */
TEST(long_way_gradients_are_the_ops) {
  acase c = {2, 3, 70, 300, 16, 8, false, 0, 0};
  int64_t z = c.b * c.h;
  double *q = rand_vals(z * c.tq * c.d, -1.5, 1.5), *k = rand_vals(z * c.tk * c.d, -1.5, 1.5);
  double *v = rand_vals(z * c.tk * c.dv, -1, 1), *w = rand_vals(z * c.tq * c.dv, -1, 1);
  double *g[2][4];
  for (int route = 0; route < 2; route++) {
    kiln_tensor *t[3] = {
        kiln_from_data(q, F64, 4, (int64_t[]){c.b, c.h, c.tq, c.d}),
        kiln_from_data(k, F64, 4, (int64_t[]){c.b, c.h, c.tk, c.d}),
        kiln_from_data(v, F64, 4, (int64_t[]){c.b, c.h, c.tk, c.dv}),
    };
    for (int i = 0; i < 3; i++) kiln_set_requires_grad(t[i], true);
    kiln_tensor *o = route ? composite_as(false, t[0], t[1], t[2], NULL, false, 0.25)
                           : kiln_scaled_dot_product_attention(t[0], t[1], t[2], NULL, false, 0.25);
    kiln_tensor *wt = kiln_from_data(w, F64, 4, (int64_t[]){c.b, c.h, c.tq, c.dv});
    kiln_tensor *pr = kiln_mul(o, wt), *l = kiln_sum(pr, 0, NULL, false), *gr[3] = {0};
    CHECK(kiln_grad_of(1, &l, NULL, 3, t, gr, false) == 0);
    for (int i = 0; i < 3; i++) g[route][i] = values_and_release(gr[i]);
    g[route][3] = values_and_release(o);
    for (int i = 0; i < 3; i++) kiln_release(t[i]);
    kiln_release(wt), kiln_release(pr), kiln_release(l);
  }
  int64_t sizes[4] = {z * c.tq * c.d, z * c.tk * c.d, z * c.tk * c.dv, z * c.tq * c.dv};
  for (int i = 0; i < 4; i++) {
    CHECK(g[0][i] && g[1][i] && !memcmp(g[0][i], g[1][i], (size_t)sizes[i] * sizeof(double)));
    free(g[0][i]), free(g[1][i]);
  }
  free(q), free(k), free(v), free(w);
}

/* no queries, no keys (every row masked: 0), no head size (scores 0: the
   mean of the values) */
TEST(empty_dims) {
  kiln_tensor *q = kiln_ones(F32, 3, (int64_t[]){2, 0, 4}),
              *k = kiln_ones(F32, 3, (int64_t[]){2, 3, 4});
  kiln_tensor *v = kiln_arange(0, 30, 1, F32), *v3 = kiln_reshape(v, 3, (int64_t[]){2, 3, 5});
  kiln_tensor *o = kiln_scaled_dot_product_attention(q, k, v3, NULL, false, 0);
  CHECK(o && kiln_numel(o) == 0 && kiln_shape(o)[2] == 5);
  kiln_release(o), kiln_release(q);
  q = kiln_ones(F32, 3, (int64_t[]){2, 3, 4});
  kiln_tensor *k0 = kiln_ones(F32, 3, (int64_t[]){2, 0, 4}),
              *v0 = kiln_ones(F32, 3, (int64_t[]){2, 0, 5});
  kiln_set_requires_grad(q, true);
  o = kiln_scaled_dot_product_attention(q, k0, v0, NULL, false, 0);
  double *ov = o ? ktest_values(o) : NULL;
  CHECK(ov && kiln_numel(o) == 30);
  for (int e = 0; ov && e < 30; e++) CHECK(ov[e] == 0);
  free(ov);
  kiln_tensor *s = kiln_sum(o, 0, NULL, false), *g = NULL;
  CHECK(kiln_grad_of(1, &s, NULL, 1, &q, &g, false) == 0);
  double *gv = g ? ktest_values(g) : NULL;
  for (int e = 0; gv && e < 24; e++) CHECK(gv[e] == 0);
  free(gv);
  kiln_release(g), kiln_release(s), kiln_release(o);
  kiln_tensor *qd = kiln_ones(F32, 3, (int64_t[]){2, 1, 0}),
              *kd = kiln_ones(F32, 3, (int64_t[]){2, 3, 0});
  o = kiln_scaled_dot_product_attention(qd, kd, v3, NULL, false, 0);
  CHECK_TENSOR(o, 3, ((int64_t[]){2, 1, 5}), ((double[]){5, 6, 7, 8, 9, 20, 21, 22, 23, 24}), 1e-6);
  kiln_release(o), kiln_release(qd), kiln_release(kd), kiln_release(q), kiln_release(k);
  kiln_release(k0), kiln_release(v0), kiln_release(v), kiln_release(v3);
}

TEST(bad_input_is_a_clear_error) {
  kiln_tensor *q = kiln_zeros(F32, 3, (int64_t[]){2, 5, 8}),
              *k = kiln_zeros(F32, 3, (int64_t[]){2, 6, 8});
  kiln_tensor *v = kiln_zeros(F32, 3, (int64_t[]){2, 6, 4}),
              *k7 = kiln_zeros(F32, 3, (int64_t[]){2, 6, 7});
  kiln_tensor *v5 = kiln_zeros(F32, 3, (int64_t[]){2, 5, 4}),
              *q1 = kiln_zeros(F32, 1, (int64_t[]){8});
  kiln_tensor *qi = kiln_zeros(KILN_I64, 3, (int64_t[]){2, 5, 8});
  kiln_tensor *mi = kiln_zeros(KILN_I64, 2, (int64_t[]){5, 6}),
              *m45 = kiln_zeros(KILN_BOOL, 2, (int64_t[]){4, 6});
  kiln_tensor *q3 = kiln_zeros(F32, 3, (int64_t[]){3, 5, 8});
  const char *api = "kiln_scaled_dot_product_attention";
  CHECK_ERROR(kiln_scaled_dot_product_attention(NULL, k, v, NULL, false, 0), KILN_ERR_ARG, api);
  CHECK_ERROR(kiln_scaled_dot_product_attention(q, k7, v, NULL, false, 0), KILN_ERR_SHAPE,
              "query [2,5,8] and key [2,6,7] differ in their last dim");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q, k, v5, NULL, false, 0), KILN_ERR_SHAPE,
              "key [2,6,8] and value [2,5,4] differ in length");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q1, k, v, NULL, false, 0), KILN_ERR_SHAPE,
              "query must be [..., T, d]");
  CHECK_ERROR(kiln_scaled_dot_product_attention(qi, k, v, NULL, false, 0), KILN_ERR_DTYPE,
              "query must be a float tensor, not int64");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q, k, v, mi, false, 0), KILN_ERR_DTYPE,
              "mask must be bool (true: attend) or float");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q, k, v, m45, false, 0), KILN_ERR_SHAPE,
              "mask [4,6] does not broadcast to the scores' shape [2,5,6]");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q3, k, v, NULL, false, 0), KILN_ERR_SHAPE,
              "cannot broadcast");
  CHECK_ERROR(kiln_scaled_dot_product_attention(q, k, v, NULL, false, NAN), KILN_ERR_ARG,
              "scale nan must be finite");
  kiln_release(q), kiln_release(k), kiln_release(v), kiln_release(k7), kiln_release(v5);
  kiln_release(q1), kiln_release(qi), kiln_release(mi), kiln_release(m45), kiln_release(q3);
}

/* --- the backward over blocks: the same bits as by batch items ---------------------------------
 */

/* cases with few batch items, where the backward on more threads than
   items runs in three phases over query and key blocks */
static const acase spread_cases[] = {
    {1, 1, 300, 700, 32, 16, false, 0, 0}, /* 3 query blocks, 2 key blocks */
    {1, 2, 200, 200, 16, 16, true, 1, 0},  /* causal, a bool mask, rows with no key */
    {1, 1, 130, 1030, 24, 8, false, 2, 0}, /* a float mask with -inf, 3 key blocks */
    {2, 1, 257, 129, 8, 40, true, 3, 0.3}, /* key padding, one key block */
};

/* FNV-1a over bytes */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  return h;
}

/* child: the gradients of every spread case in f32 and f64, hashed by
   their bits; prints the hash and the BLAS calls the backwards made */
static int spread_main(void) {
  uint64_t h = 0xcbf29ce484222325ull;
  double calls = 0;
  for (size_t i = 0; i < sizeof spread_cases / sizeof *spread_cases; i++)
    for (int f = 0; f < 3; f++) { /* f32, f64, bf16 (its forward's bits too) */
      const acase *c = &spread_cases[i];
      kiln_dtype dt = f == 2 ? KILN_BF16 : f ? F64 : F32;
      size_t es = f == 2 ? 2 : f ? 8 : 4;
      g_seed = 0x5eedull + i;
      int64_t z = c->b * c->h, nm;
      double *x[4] = {rand_vals(z * c->tq * c->d, -1.5, 1.5),
                      rand_vals(z * c->tk * c->d, -1.5, 1.5), rand_vals(z * c->tk * c->dv, -1, 1),
                      rand_vals(z * c->tq * c->dv, -1, 1)};
      double *mv = mask_values(c, &nm);
      const int64_t shapes[4][4] = {{c->b, c->h, c->tq, c->d},
                                    {c->b, c->h, c->tk, c->d},
                                    {c->b, c->h, c->tk, c->dv},
                                    {c->b, c->h, c->tq, c->dv}};
      kiln_tensor *t[4], *g[3] = {0};
      for (int e = 0; e < 4; e++) t[e] = ktest_from_doubles(dt, 4, shapes[e], x[e]);
      for (int e = 0; e < 3; e++) kiln_set_requires_grad(t[e], true);
      kiln_tensor *m = mask_tensor(c, mv, f == 2 ? F32 : dt);
      kiln_tensor *o = kiln_scaled_dot_product_attention(t[0], t[1], t[2], m, c->causal, c->scale);
      kiln_tensor *prod = kiln_mul(o, t[3]), *loss = kiln_sum(prod, 0, NULL, false);
      kiln_item(loss);
      if (f == 2) {
        size_t bytes = (size_t)kiln_numel(o) * es;
        void *bits = malloc(bytes ? bytes : 1);
        if (!bits || kiln_to_buffer(o, bits, bytes) != 0) return 1;
        h = fnv(h, bits, bytes);
        free(bits);
      }
      double before = kiln_stat("blas_calls");
      if (kiln_grad_of(1, &loss, NULL, 3, t, g, false) != 0) return 1;
      CHECK(kiln_eval(3, g) == 0);
      calls += kiln_stat("blas_calls") - before;
      for (int e = 0; e < 3; e++) {
        size_t bytes = (size_t)kiln_numel(g[e]) * es;
        void *bits = malloc(bytes ? bytes : 1);
        if (!bits || kiln_to_buffer(g[e], bits, bytes) != 0) return 1;
        h = fnv(h, bits, bytes);
        free(bits);
      }
      for (int e = 0; e < 4; e++) kiln_release(t[e]), free(x[e]);
      for (int e = 0; e < 3; e++) kiln_release(g[e]);
      kiln_release(m), kiln_release(o), kiln_release(prod), kiln_release(loss);
      free(mv);
    }
  printf("%016llx %.0f\n", (unsigned long long)h, calls);
  return 0;
}

static bool spread_child(int threads, uint64_t *hash, double *calls) {
  char env[32], line[128];
  snprintf(env, sizeof env, "KILN_THREADS=%d", threads);
  unsigned long long h = 0;
  bool ok =
      ktest_run_self(env, "spread", line, sizeof line) && sscanf(line, "%llx %lf", &h, calls) == 2;
  *hash = h;
  return ok;
}

/* On one thread the backward runs by batch items; on four, these cases'
   one or two items would leave threads idle, so it runs over blocks
   (more gemms: each block's scores three times).  The gradients are the
   same bits either way, in f32 and f64. */
TEST(backward_over_blocks_gives_the_same_bits) {
  uint64_t h1 = 0, h4 = 1;
  double c1 = 0, c4 = 0;
  CHECK(spread_child(1, &h1, &c1));
  CHECK(spread_child(4, &h4, &c4));
  if (h1 != h4)
    KTEST_FAIL("gradient bits by items %016llx, over blocks %016llx", (unsigned long long)h1,
               (unsigned long long)h4);
  if (!(c4 > c1)) KTEST_FAIL("%.0f gemms on 4 threads, %.0f on 1: the blocks did not run", c4, c1);
  printf("  gradients: %.0f gemms by items, %.0f over blocks, the same bits\n", c1, c4);
}

/* out (read here) with the BLAS calls that computing it made */
static double *values_counting_blas(kiln_tensor *out, double *blas) {
  double before = kiln_stat("blas_calls");
  double *v = values_and_release(out);
  *blas = kiln_stat("blas_calls") - before;
  return v;
}

/* A causal mask built as users build it is the causal op: tril(ones) (or
   not triu(ones, 1)) given as the op's bool mask, pending or already
   computed, and triu(ones, 1).bool() in masked_fill written the long way,
   give the causal op's bits with its gemms (T = 600: 6 of the 10 blocks of
   128 queries x 512 keys); tril(ones, 1) is not causal (all 10 blocks) */
TEST(causal_masks_built_with_triu_and_tril_are_the_causal_op) {
  const int64_t T = 600, d = 16;
  double *qv = rand_vals(T * d, -1, 1), *kv = rand_vals(T * d, -1, 1),
         *vv = rand_vals(T * d, -1, 1);
  kiln_tensor *q = kiln_from_data(qv, F64, 4, (int64_t[]){1, 1, T, d}),
              *k = kiln_from_data(kv, F64, 4, (int64_t[]){1, 1, T, d}),
              *v = kiln_from_data(vv, F64, 4, (int64_t[]){1, 1, T, d});
  double causal_blas, blas;
  double *want =
      values_counting_blas(kiln_scaled_dot_product_attention(q, k, v, NULL, true, 0), &causal_blas);
  CHECK_EQ_INT(causal_blas, 2 * 6);
  kiln_tensor *ones = kiln_ones(KILN_BOOL, 2, (int64_t[]){T, T});
  for (int form = 0; form < 5; form++) {
    kiln_tensor *mask = NULL, *got = NULL;
    if (form == 0 || form == 1) { /* tril(ones): pending, then computed */
      mask = kiln_tril(ones, 0);
      if (form == 1) CHECK(kiln_eval(1, &mask) == KILN_OK);
    } else if (form == 2) { /* not triu(ones, 1) */
      kiln_tensor *up = kiln_triu(ones, 1);
      mask = kiln_logical_not(up);
      kiln_release(up);
    } else if (form == 3) { /* near-miss: tril(ones, 1) lets each query see one key more */
      mask = kiln_tril(ones, 1);
    } else { /* long way: masked_fill(scores, triu(ones_f64, 1).bool(), -inf) */
      kiln_tensor *of = kiln_ones(F64, 2, (int64_t[]){T, T}), *up = kiln_triu(of, 1);
      kiln_tensor *later = kiln_cast(up, KILN_BOOL), *ninf = kiln_scalar(-INFINITY, F64);
      kiln_tensor *kt = kiln_transpose(k, -1, -2), *sc = kiln_matmul(q, kt);
      kiln_tensor *x = kiln_mul_scalar(sc, 0.25), *w = kiln_where(later, ninf, x);
      kiln_tensor *p = kiln_softmax(w, -1);
      double rewrites = kiln_stat("attention_rewrites");
      got = kiln_matmul(p, v);
      CHECK_EQ_INT(kiln_stat("attention_rewrites") - rewrites, 1);
      kiln_release(of), kiln_release(up), kiln_release(later), kiln_release(ninf);
      kiln_release(kt), kiln_release(sc), kiln_release(x), kiln_release(w), kiln_release(p);
    }
    if (!got) got = kiln_scaled_dot_product_attention(q, k, v, mask, false, 0);
    double *gv = values_counting_blas(got, &blas);
    if (form == 3) {
      CHECK_EQ_INT(blas, 2 * 10);
      /* query 0 sees keys 0 and 1: not the causal op's values */
      CHECK(gv && want && gv[0] != want[0]);
    } else {
      if (blas != causal_blas)
        KTEST_FAIL("form %d: %.0f gemms, the causal op %.0f", form, blas, causal_blas);
      for (int64_t e = 0; gv && want && e < T * d; e++)
        if (gv[e] != want[e]) {
          KTEST_FAIL("form %d: out[%lld] = %.17g, the causal op's %.17g", form, (long long)e, gv[e],
                     want[e]);
          break;
        }
    }
    free(gv);
    kiln_release(mask);
  }
  free(want), free(qv), free(kv), free(vv);
  kiln_release(ones), kiln_release(q), kiln_release(k), kiln_release(v);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "spread")) return spread_main();
  RUN(no_score_matrix_in_memory); /* first: the peak RSS is the process's */
  RUN(forward_matches_reference_f64);
  RUN(forward_f32_close_to_reference);
  RUN(forward_bf16_close_to_reference);
  RUN(autocast_attention_rounds_its_operands);
  RUN(gradients_match_the_composite_f64);
  RUN(gradients_match_finite_differences);
  RUN(non_contiguous_inputs_give_the_same_bits);
  RUN(fully_masked_rows_give_zero);
  RUN(float_mask_gradient_by_the_composite);
  RUN(long_way_is_one_attention_op);
  RUN(half_long_way_is_one_attention_op);
  RUN(near_misses_stay_composites);
  RUN(long_way_gradients_are_the_ops);
  RUN(empty_dims);
  RUN(causal_masks_built_with_triu_and_tril_are_the_causal_op);
  RUN(bad_input_is_a_clear_error);
  RUN(backward_over_blocks_gives_the_same_bits);
  return ktest_done();
}
