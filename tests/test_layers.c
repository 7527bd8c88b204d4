/* test_layers.c — the ops of issue 18 other than saving: linspace, eye,
 * randint, randperm, clone, var/std, one_hot, embedding, nll_loss,
 * bce_with_logits, dropout, batch_norm, conv2d, max/avg pooling.
 * Values against references written here (exact where IEEE-exact),
 * gradients against central finite differences in f64, bad input against
 * messages naming the op and the values, and values and gradients against
 * PyTorch in f64 when /usr/bin/python3 has it (ops_agree_with_torch).
 * Everything is released (ASan). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ktest.h"

#define F32 KILN_F32
#define F64 KILN_F64
#define I64 KILN_I64
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})

static uint64_t g_seed = 0x1234567ull;
static double unif(void) { return ktest_unif01(&g_seed); }
static void fill(double *v, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * unif();
}
static int64_t numel_of(int nd, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= s[i];
  return n;
}
static kiln_tensor *f64t(int nd, const int64_t *s, const double *v) {
  return kiln_from_data(v, F64, nd, s);
}
static kiln_tensor *i64t(int nd, const int64_t *s, const int64_t *v) {
  return kiln_from_data(v, I64, nd, s);
}

/* ---- the gradient checker: loss = sum(f(x) * W), W fixed ------------------ */

typedef kiln_tensor *(*build_fn)(kiln_tensor *const *x, const void *ctx); /* new reference */

typedef struct {
  int nd;
  int64_t shape[KILN_MAX_DIMS];
  double *v;
  bool diff;
} gin;

static double loss_at(build_fn f, const void *ctx, int nin, const gin *in, kiln_tensor **x,
                      bool track, double *wbuf, int64_t *nout) {
  for (int i = 0; i < nin; i++) {
    x[i] = f64t(in[i].nd, in[i].shape, in[i].v);
    if (track && in[i].diff) kiln_set_requires_grad(x[i], true);
  }
  kiln_tensor *out = f(x, ctx);
  if (!out) return NAN;
  *nout = kiln_numel(out);
  for (int64_t k = 0; k < *nout; k++)
    wbuf[k] = 0.5 + 0.37 * (double)(k % 7) - 0.11 * (double)(k % 3);
  kiln_tensor *w = f64t(kiln_ndim(out), kiln_shape(out), wbuf);
  kiln_tensor *p = kiln_mul(out, w);
  kiln_tensor *l = kiln_sum(p, 0, NULL, false);
  kiln_release(out);
  kiln_release(w);
  kiln_release(p);
  if (track) {
    x[nin] = l;
    return 0;
  }
  double r = kiln_item(l);
  kiln_release(l);
  return r;
}

static void release_all(kiln_tensor **x, int n) {
  for (int i = 0; i < n; i++) kiln_release(x[i]), x[i] = NULL;
}

#define GRADCHECK(f, ctx, nin, in) gradcheck(__LINE__, #f, f, ctx, nin, in)
static void gradcheck(int line, const char *what, build_fn f, const void *ctx, int nin, gin *in) {
  kiln_tensor *x[8] = {0};
  double *wbuf = malloc(1 << 20);
  int64_t nout = 0;
  loss_at(f, ctx, nin, in, x, true, wbuf, &nout);
  kiln_tensor *loss = x[nin];
  if (!loss) {
    KTEST_FAIL("line %d (%s): the builder failed: %s", line, what, kiln_last_error());
    release_all(x, nin + 1);
    free(wbuf);
    return;
  }
  kiln_tensor *dx[8], *g[8] = {0};
  int nd = 0, which[8];
  for (int i = 0; i < nin; i++)
    if (in[i].diff) which[nd] = i, dx[nd++] = x[i];
  int rc = kiln_grad_of(1, &loss, NULL, nd, dx, g, false);
  if (rc != 0)
    KTEST_FAIL("line %d (%s): kiln_grad_of -> %d: %s", line, what, rc, kiln_last_error());
  for (int k = 0; rc == 0 && k < nd; k++) {
    int i = which[k];
    int64_t n = numel_of(in[i].nd, in[i].shape);
    double *ga = ktest_values(g[k]);
    int reports = 0;
    for (int64_t e = 0; e < n; e++) {
      double v0 = in[i].v[e], h = 1e-6;
      kiln_tensor *y[8] = {0};
      kiln_no_grad_push();
      in[i].v[e] = v0 + h;
      double lp = loss_at(f, ctx, nin, in, y, false, wbuf, &nout);
      release_all(y, nin);
      in[i].v[e] = v0 - h;
      double lm = loss_at(f, ctx, nin, in, y, false, wbuf, &nout);
      release_all(y, nin);
      in[i].v[e] = v0;
      kiln_no_grad_pop();
      double fd = (lp - lm) / (2 * h);
      if (!(fabs(ga[e] - fd) <= 1e-5 * fmax(1.0, fabs(fd))) && reports++ < 4)
        KTEST_FAIL("line %d (%s): d/dx%d[%lld] = %.12g, finite differences %.12g", line, what, i,
                   (long long)e, ga[e], fd);
    }
    free(ga);
  }
  for (int k = 0; k < nd; k++) kiln_release(g[k]);
  release_all(x, nin + 1);
  free(wbuf);
}

static gin rin(int nd, const int64_t *s, double lo, double hi, bool diff) {
  gin g = {.nd = nd, .diff = diff};
  memcpy(g.shape, s, (size_t)nd * sizeof *s);
  int64_t n = numel_of(nd, s);
  g.v = malloc((size_t)(n ? n : 1) * sizeof(double));
  fill(g.v, n, lo, hi);
  return g;
}
static void free_gins(gin *g, int n) {
  for (int i = 0; i < n; i++) free(g[i].v);
}

/* ---- creation ------------------------------------------------------------- */

TEST(linspace_values_and_ends_exact) {
  kiln_tensor *t = kiln_linspace(0, 1, 5, F64);
  CHECK_TENSOR(t, 1, S(5), D(0, 0.25, 0.5, 0.75, 1), 0);
  kiln_release(t);
  t = kiln_linspace(-1, 0.3, 7, F64); /* the end is exact, not start + 6*step */
  double *v = ktest_values(t);
  CHECK(v[0] == -1 && v[6] == 0.3);
  free(v);
  kiln_release(t);
  t = kiln_linspace(2, 5, 1, F32);
  CHECK_TENSOR(t, 1, S(1), D(2), 0);
  CHECK_EQ_INT(kiln_dtype_of(t), F32);
  kiln_release(t);
  t = kiln_linspace(2, 5, 0, F32);
  CHECK(t && kiln_numel(t) == 0);
  kiln_release(t);
  t = kiln_linspace(0, 10, 6, I64);
  CHECK_TENSOR(t, 1, S(6), D(0, 2, 4, 6, 8, 10), 0);
  kiln_release(t);
  CHECK_ERROR(kiln_linspace(0, 1, -1, F32), KILN_ERR_ARG, "kiln_linspace");
}

TEST(eye_values) {
  kiln_tensor *t = kiln_eye(3, F32);
  CHECK_TENSOR(t, 2, S(3, 3), D(1, 0, 0, 0, 1, 0, 0, 0, 1), 0);
  kiln_release(t);
  t = kiln_eye(2, I64);
  CHECK_EQ_INT(kiln_dtype_of(t), I64);
  CHECK_TENSOR(t, 2, S(2, 2), D(1, 0, 0, 1), 0);
  kiln_release(t);
  t = kiln_eye(0, F64);
  CHECK(t && kiln_numel(t) == 0);
  kiln_release(t);
  CHECK_ERROR(kiln_eye(-2, F32), KILN_ERR_ARG, "kiln_eye: n -2");
}

TEST(randint_range_and_reproducible) {
  kiln_manual_seed(7);
  kiln_tensor *a = kiln_randint(-3, 4, I64, 1, S(2000));
  kiln_manual_seed(7);
  kiln_tensor *b = kiln_randint(-3, 4, I64, 1, S(2000));
  double *va = ktest_values(a), *vb = ktest_values(b);
  int seen[7] = {0};
  for (int i = 0; i < 2000; i++) {
    CHECK(va[i] == vb[i]);
    CHECK(va[i] >= -3 && va[i] < 4 && va[i] == floor(va[i]));
    if (va[i] >= -3 && va[i] < 4) seen[(int)va[i] + 3]++;
  }
  for (int k = 0; k < 7; k++) CHECK(seen[k] > 200); /* ~286 each */
  free(va);
  free(vb);
  kiln_release(a);
  kiln_release(b);
  a = kiln_randint(0, 10, KILN_I32, 2, S(3, 4));
  CHECK(a && kiln_dtype_of(a) == KILN_I32 && kiln_numel(a) == 12);
  kiln_release(a);
  CHECK_ERROR(kiln_randint(5, 5, I64, 1, S(3)), KILN_ERR_ARG, "kiln_randint: bad range [5, 5)");
  CHECK_ERROR(kiln_randint(0, 2, KILN_BOOL, 1, S(3)), KILN_ERR_DTYPE, "kiln_randint");
  /* draws the dtype cannot hold are refused (they saturated: [0, 300) in u8
     put 15% of them on 255, [-200, -100) in i8 was all -128) */
  CHECK_ERROR(kiln_randint(0, 300, KILN_U8, 1, S(5)), KILN_ERR_ARG,
              "kiln_randint: range [0, 300) does not fit uint8 ([0, 255])");
  CHECK_ERROR(kiln_randint(-200, -100, KILN_I8, 1, S(5)), KILN_ERR_ARG, "does not fit int8");
  CHECK_ERROR(kiln_randint(-1, 5, KILN_U8, 1, S(5)), KILN_ERR_ARG, "does not fit uint8");
  a = kiln_randint(0, 256, KILN_U8, 1, S(1000));
  double *v = ktest_values(a);
  bool top = false;
  for (int i = 0; v && i < 1000; i++) top |= v[i] == 255;
  CHECK(a && v && top); /* the whole range is drawn */
  free(v);
  kiln_release(a);
}

TEST(randperm_is_a_reproducible_permutation) {
  kiln_manual_seed(11);
  kiln_tensor *a = kiln_randperm(100);
  kiln_manual_seed(11);
  kiln_tensor *b = kiln_randperm(100);
  kiln_tensor *c = kiln_randperm(100); /* the stream moved on */
  CHECK_EQ_INT(kiln_dtype_of(a), I64);
  double *va = ktest_values(a), *vb = ktest_values(b), *vc = ktest_values(c);
  int seen[100] = {0}, same = 0, fixed = 0;
  for (int i = 0; i < 100; i++) {
    CHECK(va[i] == vb[i]);
    if (va[i] >= 0 && va[i] < 100) seen[(int)va[i]]++;
    same += va[i] == vc[i];
    fixed += va[i] == i;
  }
  for (int i = 0; i < 100; i++) CHECK_EQ_INT(seen[i], 1);
  CHECK(same < 20 && fixed < 20);
  free(va), free(vb), free(vc);
  kiln_release(a), kiln_release(b), kiln_release(c);
  a = kiln_randperm(0);
  CHECK(a && kiln_numel(a) == 0);
  kiln_release(a);
  a = kiln_randperm(1);
  CHECK_TENSOR(a, 1, S(1), D(0), 0);
  kiln_release(a);
  CHECK_ERROR(kiln_randperm(-1), KILN_ERR_ARG, "kiln_randperm: n -1");
}

static kiln_tensor *b_clone(kiln_tensor *const *x, const void *ctx) {
  (void)ctx;
  kiln_tensor *c = kiln_clone(x[0]);
  kiln_tensor *r = kiln_mul(c, x[0]);
  kiln_release(c);
  return r;
}

TEST(clone_copies_and_passes_gradients) {
  kiln_tensor *a = f64t(1, S(3), D(1, 2, 3));
  kiln_tensor *c = kiln_clone(a);
  CHECK(c && c != a);
  CHECK_TENSOR(c, 1, S(3), D(1, 2, 3), 0);
  kiln_tensor *one = kiln_ones(F64, 1, S(3));
  CHECK_EQ_INT(kiln_assign(a, one), 0); /* the clone keeps the old value */
  CHECK_TENSOR(c, 1, S(3), D(1, 2, 3), 0);
  kiln_release(a), kiln_release(c), kiln_release(one);
  gin in[1] = {rin(2, S(2, 3), -2, 2, true)};
  GRADCHECK(b_clone, NULL, 1, in);
  free_gins(in, 1);
}

/* ---- var / std ------------------------------------------------------------- */

typedef struct {
  int naxes, axes[4], correction;
  bool keepdim, std;
} var_ctx;

static kiln_tensor *b_var(kiln_tensor *const *x, const void *ctx) {
  const var_ctx *c = ctx;
  return c->std ? kiln_std(x[0], c->naxes, c->axes, c->correction, c->keepdim)
                : kiln_var(x[0], c->naxes, c->axes, c->correction, c->keepdim);
}

TEST(var_std_values_and_gradients) {
  kiln_tensor *a = f64t(1, S(4), D(1, 2, 3, 4));
  kiln_tensor *v1 = kiln_var(a, 0, NULL, 1, false), *v0 = kiln_var(a, 0, NULL, 0, false);
  CHECK_CLOSE(kiln_item(v1), 5.0 / 3.0, 1e-15);
  CHECK_EQ_INT(kiln_item(v0) == 1.25, 1); /* exact */
  kiln_tensor *s0 = kiln_std(a, 0, NULL, 0, false);
  CHECK_CLOSE(kiln_item(s0), sqrt(1.25), 1e-15);
  kiln_release(v1), kiln_release(v0), kiln_release(s0), kiln_release(a);
  /* rows of a matrix, keepdim */
  a = f64t(2, S(2, 3), D(1, 2, 3, 2, 4, 9));
  int ax = 1;
  kiln_tensor *r = kiln_var(a, 1, &ax, 1, true);
  CHECK_TENSOR(r, 2, S(2, 1), D(1, 13), 1e-15);
  kiln_release(r);
  ax = -2; /* columns, negative axis */
  r = kiln_var(a, 1, &ax, 0, false);
  CHECK_TENSOR(r, 1, S(3), D(0.25, 1, 9), 1e-15);
  kiln_release(r);
  /* one value with correction 1: 0/0 = NaN, as PyTorch */
  kiln_tensor *one = f64t(1, S(1), D(3));
  r = kiln_var(one, 0, NULL, 1, false);
  CHECK(isnan(kiln_item(r)));
  kiln_release(r), kiln_release(one);
  CHECK_ERROR(kiln_var(a, 0, NULL, -1, false), KILN_ERR_ARG, "kiln_var: correction -1");
  ax = 5;
  CHECK_ERROR(kiln_std(a, 1, &ax, 1, false), KILN_ERR_ARG, "kiln_std: axis 5");
  kiln_release(a);
  gin in[1] = {rin(3, S(2, 3, 4), -2, 2, true)};
  var_ctx c1 = {0, {0}, 1, false, false}, c2 = {2, {0, 2}, 0, true, true},
          c3 = {1, {1}, 1, false, true};
  GRADCHECK(b_var, &c1, 1, in);
  GRADCHECK(b_var, &c2, 1, in);
  GRADCHECK(b_var, &c3, 1, in);
  free_gins(in, 1);
}

/* ---- cumsum ---------------------------------------------------------------- */

static kiln_tensor *b_cumsum(kiln_tensor *const *x, const void *ctx) {
  return kiln_cumsum(x[0], *(const int *)ctx);
}

TEST(cumsum_values_dtypes_gradients) {
  kiln_tensor *a = f64t(2, S(2, 5), D(1, 2, 3, 4, 5, 0.5, -1, 0.25, 8, 1));
  kiln_tensor *r = kiln_cumsum(a, 1);
  CHECK_TENSOR(r, 2, S(2, 5), D(1, 3, 6, 10, 15, 0.5, -0.5, -0.25, 7.75, 8.75), 0);
  kiln_release(r);
  r = kiln_cumsum(a, -2);
  CHECK_TENSOR(r, 2, S(2, 5), D(1, 2, 3, 4, 5, 1.5, 1, 3.25, 12, 6), 0);
  kiln_release(r), kiln_release(a);
  /* only additions: inf and NaN as in a sequential sum */
  a = f64t(1, S(5), D(1, INFINITY, 2, -INFINITY, 3));
  r = kiln_cumsum(a, 0);
  CHECK_TENSOR(r, 1, S(5), D(1, INFINITY, INFINITY, NAN, NAN), 0);
  kiln_release(r), kiln_release(a);
  int32_t iv[4] = {2000000000, 2000000000, -5, 1};
  a = kiln_from_data(iv, KILN_I32, 1, S(4));
  r = kiln_cumsum(a, 0);
  CHECK_EQ_INT(kiln_dtype_of(r), I64);
  CHECK_TENSOR(r, 1, S(4), D(2e9, 4e9, 3999999995, 3999999996), 0);
  kiln_release(r), kiln_release(a);
  unsigned char bv[6] = {1, 0, 1, 1, 0, 1};
  a = kiln_from_data(bv, KILN_BOOL, 1, S(6));
  r = kiln_cumsum(a, 0);
  CHECK_TENSOR(r, 1, S(6), D(1, 1, 2, 3, 3, 4), 0);
  kiln_release(r), kiln_release(a);
  a = kiln_zeros(KILN_F32, 2, S(3, 0));
  r = kiln_cumsum(a, 1);
  CHECK(r && kiln_numel(r) == 0 && kiln_dtype_of(r) == F32);
  kiln_release(r);
  /* a long axis: 1000 ones */
  kiln_release(a);
  a = kiln_ones(KILN_F32, 1, S(1000));
  r = kiln_cumsum(a, 0);
  double *v = ktest_values(r);
  for (int i = 0; i < 1000; i++)
    if (v[i] != i + 1) {
      KTEST_FAIL("cumsum(ones)[%d] = %g", i, v[i]);
      break;
    }
  free(v);
  kiln_release(r), kiln_release(a);
  kiln_tensor *z = kiln_scalar(1, F32);
  CHECK_ERROR(kiln_cumsum(z, 0), KILN_ERR_SHAPE, "kiln_cumsum: a 0-d tensor has no axis 0");
  kiln_release(z);
  a = kiln_ones(F32, 2, S(2, 2));
  CHECK_ERROR(kiln_cumsum(a, 2), KILN_ERR_ARG, "kiln_cumsum: axis 2 is out of range");
  kiln_release(a);
  gin in[1] = {rin(2, S(3, 9), -2, 2, true)};
  int ax1 = 1, ax0 = 0;
  GRADCHECK(b_cumsum, &ax1, 1, in);
  GRADCHECK(b_cumsum, &ax0, 1, in);
  free_gins(in, 1);
}

/* ---- sort / topk ------------------------------------------------------------ */

typedef struct {
  bool topk, flag;
  int64_t k;
  int axis;
} sort_ctx;

static kiln_tensor *b_sort(kiln_tensor *const *x, const void *ctx) {
  const sort_ctx *c = ctx;
  return c->topk ? kiln_topk(x[0], c->k, c->axis, c->flag, NULL)
                 : kiln_sort(x[0], c->axis, c->flag, NULL);
}

TEST(sort_topk_stable_nan_indices_gradients) {
  kiln_tensor *a = f64t(1, S(8), D(3, 1, NAN, 2, 1, -0.0, 0.0, 3));
  kiln_tensor *idx = NULL, *v = kiln_sort(a, 0, false, &idx);
  CHECK_TENSOR(v, 1, S(8), D(-0.0, 0, 1, 1, 2, 3, 3, NAN), 0);
  CHECK_TENSOR(idx, 1, S(8), D(5, 6, 1, 4, 3, 0, 7, 2), 0); /* ties keep their order */
  CHECK_EQ_INT(kiln_dtype_of(idx), I64);
  kiln_release(v), kiln_release(idx);
  v = kiln_sort(a, -1, true, &idx); /* descending: NaN first, ties still stable */
  CHECK_TENSOR(v, 1, S(8), D(NAN, 3, 3, 2, 1, 1, -0.0, 0), 0);
  CHECK_TENSOR(idx, 1, S(8), D(2, 0, 7, 3, 1, 4, 5, 6), 0);
  kiln_release(v), kiln_release(idx);
  v = kiln_topk(a, 3, 0, true, &idx);
  CHECK_TENSOR(v, 1, S(3), D(NAN, 3, 3), 0);
  CHECK_TENSOR(idx, 1, S(3), D(2, 0, 7), 0);
  kiln_release(v), kiln_release(idx);
  v = kiln_topk(a, 2, 0, false, NULL);
  CHECK_TENSOR(v, 1, S(2), D(-0.0, 0), 0);
  kiln_release(v);
  v = kiln_topk(a, 0, 0, true, &idx);
  CHECK(v && kiln_numel(v) == 0 && idx && kiln_numel(idx) == 0);
  kiln_release(v), kiln_release(idx);
  CHECK_ERROR(kiln_topk(a, 9, 0, true, NULL), KILN_ERR_ARG,
              "kiln_topk: k 9 is out of range [0, 8] for axis 0");
  CHECK_ERROR(kiln_topk(a, -1, 0, true, NULL), KILN_ERR_ARG, "kiln_topk: k -1");
  CHECK_ERROR(kiln_sort(a, 1, false, NULL), KILN_ERR_ARG, "kiln_sort: axis 1 is out of range");
  kiln_release(a);
  /* integers along axis 0 of a matrix (columns), and a long row */
  int32_t iv[6] = {5, -1, 7, 2, -1, 0};
  a = kiln_from_data(iv, KILN_I32, 2, S(3, 2));
  v = kiln_sort(a, 0, false, &idx);
  CHECK_EQ_INT(kiln_dtype_of(v), KILN_I32);
  CHECK_TENSOR(v, 2, S(3, 2), D(-1, -1, 5, 0, 7, 2), 0);
  CHECK_TENSOR(idx, 2, S(3, 2), D(2, 0, 0, 2, 1, 1), 0);
  kiln_release(v), kiln_release(idx), kiln_release(a);
  int64_t n = 5000;
  double *big = malloc((size_t)n * sizeof *big);
  for (int64_t i = 0; i < n; i++) big[i] = (double)((i * 7919) % 1000); /* 5 copies of each */
  a = f64t(1, &n, big);
  v = kiln_sort(a, 0, false, &idx);
  double *vv = ktest_values(v), *vi = ktest_values(idx);
  for (int64_t i = 1; i < n; i++) {
    if (!(vv[i - 1] <= vv[i]) || (vv[i - 1] == vv[i] && !(vi[i - 1] < vi[i]))) {
      KTEST_FAIL("position %lld is out of order or unstable", (long long)i);
      break;
    }
  }
  for (int64_t i = 0; i < n; i++) CHECK(big[(int64_t)vi[i]] == vv[i]);
  free(vv), free(vi), free(big);
  kiln_release(v), kiln_release(idx), kiln_release(a);
  kiln_tensor *z = kiln_scalar(1, F32);
  CHECK_ERROR(kiln_sort(z, 0, false, NULL), KILN_ERR_SHAPE,
              "kiln_sort: a 0-d tensor has no axis 0");
  kiln_release(z);
  gin in[1] = {rin(2, S(3, 7), -2, 2, true)};
  sort_ctx c1 = {false, false, 0, 1}, c2 = {false, true, 0, 0}, c3 = {true, true, 3, 1},
           c4 = {true, false, 2, 0};
  GRADCHECK(b_sort, &c1, 1, in);
  GRADCHECK(b_sort, &c2, 1, in);
  GRADCHECK(b_sort, &c3, 1, in);
  GRADCHECK(b_sort, &c4, 1, in);
  free_gins(in, 1);
}

/* ---- one_hot, embedding, losses ----------------------------------------- */

TEST(one_hot_values_and_errors) {
  kiln_tensor *idx = i64t(2, S(2, 2), (const int64_t[]){0, 2, 1, 2});
  kiln_tensor *h = kiln_one_hot(idx, 3, F32);
  CHECK_EQ_INT(kiln_dtype_of(h), F32);
  CHECK_TENSOR(h, 3, S(2, 2, 3), D(1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1), 0);
  kiln_release(h);
  h = kiln_one_hot(idx, 4, KILN_BOOL);
  CHECK_TENSOR(h, 3, S(2, 2, 4), D(1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0), 0);
  kiln_release(h);
  CHECK_ERROR(kiln_one_hot(idx, 2, F32), KILN_ERR_ARG, "kiln_one_hot: class index 2");
  CHECK_ERROR(kiln_one_hot(idx, 0, F32), KILN_ERR_ARG, "num_classes 0");
  kiln_tensor *f = kiln_ones(F32, 1, S(2));
  CHECK_ERROR(kiln_one_hot(f, 3, F32), KILN_ERR_DTYPE, "kiln_one_hot: idx must be int64");
  kiln_release(f);
  /* a pending index out of range is reported when evaluated */
  kiln_tensor *neg = kiln_neg(idx);
  h = kiln_one_hot(neg, 3, F32);
  CHECK(h != NULL);
  if (h) {
    double *v = malloc(12 * sizeof(float));
    CHECK(kiln_to_buffer(h, v, 12 * sizeof(float)) < 0);
    CHECK_STR_CONTAINS(kiln_last_error(), "index -2 is out of range");
    free(v);
  }
  kiln_clear_error();
  kiln_release(h), kiln_release(neg), kiln_release(idx);
}

static kiln_tensor *b_embedding(kiln_tensor *const *x, const void *ctx) {
  return kiln_embedding(x[0], (kiln_tensor *)ctx);
}

TEST(embedding_values_gradients_errors) {
  kiln_tensor *w = f64t(2, S(3, 2), D(10, 11, 20, 21, 30, 31));
  kiln_tensor *idx = i64t(2, S(2, 2), (const int64_t[]){2, 0, 2, 1});
  kiln_tensor *e = kiln_embedding(w, idx);
  CHECK_TENSOR(e, 3, S(2, 2, 2), D(30, 31, 10, 11, 30, 31, 20, 21), 0);
  kiln_release(e);
  kiln_tensor *i0 = kiln_from_data((const int64_t[]){1}, I64, 0, NULL); /* 0-d index */
  e = kiln_embedding(w, i0);
  CHECK_TENSOR(e, 1, S(2), D(20, 21), 0);
  kiln_release(e), kiln_release(i0);
  /* repeated rows accumulate: d sum(E) / dw = counts */
  CHECK_EQ_INT(kiln_set_requires_grad(w, true), 0);
  e = kiln_embedding(w, idx);
  kiln_tensor *l = kiln_sum(e, 0, NULL, false);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  kiln_tensor *g = kiln_grad(w);
  CHECK_TENSOR(g, 2, S(3, 2), D(1, 1, 1, 1, 2, 2), 0);
  kiln_release(g), kiln_release(l), kiln_release(e);
  kiln_tensor *bad = i64t(1, S(2), (const int64_t[]){0, 3});
  CHECK_ERROR(kiln_embedding(w, bad), KILN_ERR_ARG,
              "kiln_embedding: index 3 (at flat position 1) is out of range [0, 3)");
  kiln_release(bad), kiln_release(w);
  gin in[1] = {rin(2, S(4, 3), -1, 1, true)};
  GRADCHECK(b_embedding, idx, 1, in);
  free_gins(in, 1);
  kiln_release(idx);
}

static kiln_tensor *b_nll(kiln_tensor *const *x, const void *ctx) {
  kiln_tensor *ls = kiln_log_softmax(x[0], 1);
  kiln_tensor *r = kiln_nll_loss(ls, (kiln_tensor *)ctx);
  kiln_release(ls);
  return r;
}

TEST(nll_loss_values_gradients_errors) {
  kiln_tensor *lp = f64t(2, S(3, 4), D(-1, -2, -3, -4, -0.5, -1.5, -2.5, -3.5, -9, -8, -7, -6));
  kiln_tensor *t = i64t(1, S(3), (const int64_t[]){3, 0, 1});
  kiln_tensor *l = kiln_nll_loss(lp, t);
  CHECK_CLOSE(kiln_item(l), (4 + 0.5 + 8) / 3.0, 1e-15);
  kiln_release(l);
  kiln_tensor *bad = i64t(1, S(3), (const int64_t[]){3, 4, 1});
  CHECK_ERROR(kiln_nll_loss(lp, bad), KILN_ERR_ARG, "kiln_nll_loss: label 4");
  kiln_release(bad);
  bad = i64t(1, S(3), (const int64_t[]){-1, 0, 1});
  CHECK_ERROR(kiln_nll_loss(lp, bad), KILN_ERR_ARG, "kiln_nll_loss: label -1");
  kiln_release(bad);
  bad = i64t(1, S(2), (const int64_t[]){0, 1});
  CHECK_ERROR(kiln_nll_loss(lp, bad), KILN_ERR_SHAPE,
              "kiln_nll_loss: log_probs [3,4] and target [2]");
  kiln_release(bad);
  kiln_tensor *ft = kiln_zeros(F32, 1, S(3));
  CHECK_ERROR(kiln_nll_loss(lp, ft), KILN_ERR_DTYPE, "kiln_nll_loss: target must be int64");
  kiln_release(ft), kiln_release(lp);
  gin in[1] = {rin(2, S(3, 4), -2, 2, true)};
  GRADCHECK(b_nll, t, 1, in);
  free_gins(in, 1);
  kiln_release(t);
}

static kiln_tensor *b_bce(kiln_tensor *const *x, const void *ctx) {
  (void)ctx;
  return kiln_bce_with_logits(x[0], x[1]);
}

TEST(bce_with_logits_stable_values_gradients_errors) {
  const double xs[6] = {-2, -0.5, 0, 0.75, 3, 1000}, ts[6] = {0, 1, 0.5, 1, 0.25, 1};
  kiln_tensor *x = f64t(1, S(6), xs), *t = f64t(1, S(6), ts);
  kiln_tensor *l = kiln_bce_with_logits(x, t);
  double ref = 0;
  for (int i = 0; i < 5; i++) { /* the naive form is fine away from overflow */
    double p = 1 / (1 + exp(-xs[i]));
    ref += -(ts[i] * log(p) + (1 - ts[i]) * log(1 - p));
  }
  ref += 0; /* x = 1000, t = 1: the loss is 0 (log1p(exp(-1000)) underflows) */
  CHECK_CLOSE(kiln_item(l), ref / 6, 1e-14);
  kiln_release(l);
  /* large negative logits with t = 1: |x|, not inf */
  kiln_tensor *xn = f64t(1, S(1), D(-1000)), *t1 = f64t(1, S(1), D(1));
  l = kiln_bce_with_logits(xn, t1);
  CHECK_CLOSE(kiln_item(l), 1000, 1e-15);
  kiln_release(l), kiln_release(xn), kiln_release(t1);
  /* gradient = (sigmoid(x) - t) / n everywhere, x = 0 included */
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  l = kiln_bce_with_logits(x, t);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  kiln_tensor *g = kiln_grad(x);
  double expect[6];
  for (int i = 0; i < 6; i++) expect[i] = (1 / (1 + exp(-xs[i])) - ts[i]) / 6;
  CHECK_TENSOR(g, 1, S(6), expect, 1e-15);
  kiln_release(g), kiln_release(l);
  kiln_tensor *t2 = kiln_zeros(F64, 2, S(1, 6));
  CHECK_ERROR(kiln_bce_with_logits(x, t2), KILN_ERR_SHAPE,
              "kiln_bce_with_logits: logits shape [6] and target shape [1,6] must be equal");
  kiln_release(t2), kiln_release(x), kiln_release(t);
  gin in[2] = {rin(2, S(3, 2), -3, 3, true), rin(2, S(3, 2), 0, 1, true)};
  GRADCHECK(b_bce, NULL, 2, in);
  free_gins(in, 2);
}

/* ---- dropout ------------------------------------------------------------------ */

TEST(dropout_masks_scale_reproducible) {
  int64_t n = 4000;
  double *xv = malloc((size_t)n * sizeof *xv);
  for (int64_t i = 0; i < n; i++) xv[i] = 1 + (double)(i % 5);
  kiln_tensor *x = f64t(1, &n, xv);
  kiln_tensor *same = kiln_dropout(x, 0.3, false);
  CHECK(same != NULL && same != x); /* a handle of its own: assigning to it leaves x alone */
  CHECK_TENSOR(same, 1, &n, xv, 0);
  kiln_release(same);
  same = kiln_dropout(x, 0, true);
  CHECK_TENSOR(same, 1, &n, xv, 0);
  kiln_release(same);
  kiln_manual_seed(5);
  kiln_tensor *a = kiln_dropout(x, 0.25, true);
  kiln_manual_seed(5);
  kiln_tensor *b = kiln_dropout(x, 0.25, true);
  double *va = ktest_values(a), *vb = ktest_values(b);
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; i++) {
    CHECK(va[i] == vb[i]);
    CHECK(va[i] == 0 || va[i] == xv[i] * (1 / 0.75)); /* x * (1/(1-p)), as PyTorch */
    zeros += va[i] == 0;
  }
  CHECK(zeros > 850 && zeros < 1150); /* ~1000 */
  /* the gradient is the mask scaled by 1/(1-p) */
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  kiln_manual_seed(5);
  kiln_tensor *c = kiln_dropout(x, 0.25, true);
  kiln_tensor *l = kiln_sum(c, 0, NULL, false);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  kiln_tensor *g = kiln_grad(x);
  double *vg = ktest_values(g);
  for (int64_t i = 0; i < n; i++) CHECK(vg[i] == (va[i] == 0 ? 0 : 1 / 0.75));
  free(va), free(vb), free(vg), free(xv);
  kiln_release(a), kiln_release(b), kiln_release(c), kiln_release(l), kiln_release(g);
  CHECK_ERROR(kiln_dropout(x, 1.0, true), KILN_ERR_ARG, "kiln_dropout: p 1 is outside [0, 1)");
  CHECK_ERROR(kiln_dropout(x, -0.1, true), KILN_ERR_ARG, "kiln_dropout: p -0.1");
  kiln_release(x);
}

/* ---- batch_norm ------------------------------------------------------------------- */

typedef struct {
  bool training, affine;
} bn_ctx;

static kiln_tensor *b_bn(kiln_tensor *const *x, const void *ctx) {
  const bn_ctx *c = ctx;
  kiln_tensor *rm = kiln_zeros(F64, 1, S(3)), *rv = kiln_ones(F64, 1, S(3));
  kiln_tensor *r = kiln_batch_norm(x[0], rm, rv, c->affine ? x[1] : NULL, c->affine ? x[2] : NULL,
                                   c->training, 0.1, 1e-5);
  kiln_release(rm), kiln_release(rv);
  return r;
}

TEST(batch_norm_training_eval_running_stats) {
  /* x [4, 3, 2]: per channel 8 values */
  double xv[24];
  for (int i = 0; i < 24; i++) xv[i] = (double)((i * 7) % 11) - 3 + 0.25 * (i % 3);
  kiln_tensor *x = f64t(3, S(4, 3, 2), xv);
  kiln_tensor *rm = kiln_zeros(F64, 1, S(3)), *rv = kiln_ones(F64, 1, S(3));
  kiln_tensor *w = f64t(1, S(3), D(1, 2, 0.5)), *b = f64t(1, S(3), D(0, -1, 3));
  kiln_tensor *y = kiln_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  double mean[3] = {0}, var[3] = {0}, ref[24];
  for (int i = 0; i < 24; i++) mean[(i / 2) % 3] += xv[i] / 8;
  for (int i = 0; i < 24; i++)
    var[(i / 2) % 3] += (xv[i] - mean[(i / 2) % 3]) * (xv[i] - mean[(i / 2) % 3]) / 8;
  const double wv[3] = {1, 2, 0.5}, bv[3] = {0, -1, 3};
  for (int i = 0; i < 24; i++) {
    int c = (i / 2) % 3;
    ref[i] = (xv[i] - mean[c]) / sqrt(var[c] + 1e-5) * wv[c] + bv[c];
  }
  CHECK_TENSOR(y, 3, S(4, 3, 2), ref, 1e-12);
  double erm[3], erv[3];
  for (int c = 0; c < 3; c++) erm[c] = 0.1 * mean[c], erv[c] = 0.9 + 0.1 * var[c] * 8 / 7;
  CHECK_TENSOR(rm, 1, S(3), erm, 1e-14); /* updated in place, unbiased variance */
  CHECK_TENSOR(rv, 1, S(3), erv, 1e-14);
  kiln_release(y);
  /* eval: the running stats */
  y = kiln_batch_norm(x, rm, rv, w, b, false, 0.1, 1e-5);
  for (int i = 0; i < 24; i++) {
    int c = (i / 2) % 3;
    ref[i] = (xv[i] - erm[c]) / sqrt(erv[c] + 1e-5) * wv[c] + bv[c];
  }
  CHECK_TENSOR(y, 3, S(4, 3, 2), ref, 1e-12);
  CHECK_TENSOR(rm, 1, S(3), erm, 1e-14); /* unchanged in eval */
  kiln_release(y);
  kiln_tensor *w4 = kiln_ones(F64, 1, S(4));
  CHECK_ERROR(kiln_batch_norm(x, rm, rv, w4, NULL, true, 0.1, 1e-5), KILN_ERR_SHAPE,
              "kiln_batch_norm: weight has shape [4], expected [3]");
  CHECK_ERROR(kiln_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), KILN_ERR_ARG,
              "kiln_batch_norm: running_mean and running_var");
  kiln_tensor *one = kiln_ones(F64, 2, S(1, 3));
  CHECK_ERROR(kiln_batch_norm(one, rm, rv, NULL, NULL, true, 0.1, 1e-5), KILN_ERR_SHAPE,
              "more than 1 value per channel");
  kiln_release(one), kiln_release(w4);
  kiln_release(x), kiln_release(rm), kiln_release(rv), kiln_release(w), kiln_release(b);
  gin in[3] = {rin(3, S(4, 3, 2), -2, 2, true), rin(1, S(3), 0.5, 1.5, true),
               rin(1, S(3), -1, 1, true)};
  bn_ctx tr = {true, true}, ev = {false, true}, plain = {true, false};
  GRADCHECK(b_bn, &tr, 3, in);
  GRADCHECK(b_bn, &ev, 3, in);
  GRADCHECK(b_bn, &plain, 1, in);
  free_gins(in, 3);
}

/* ---- conv2d and pooling ------------------------------------------------------------ */

typedef struct {
  int stride[2], padding[2], dilation[2], groups;
  bool bias;
} conv_ctx;

static void ref_conv(const double *x, const int64_t *xs, const double *w, const int64_t *ws,
                     const double *b, const conv_ctx *c, double *out, int64_t *oh_, int64_t *ow_) {
  int64_t n = xs[0], cin = xs[1], h = xs[2], wd = xs[3], cout = ws[0], kh = ws[2], kw = ws[3];
  int64_t oh = (h + 2 * c->padding[0] - c->dilation[0] * (kh - 1) - 1) / c->stride[0] + 1;
  int64_t ow = (wd + 2 * c->padding[1] - c->dilation[1] * (kw - 1) - 1) / c->stride[1] + 1;
  int64_t cg = cin / c->groups, og = cout / c->groups;
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < cout; o++)
      for (int64_t y = 0; y < oh; y++)
        for (int64_t z = 0; z < ow; z++) {
          double acc = b ? b[o] : 0;
          int64_t grp = o / og;
          for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t p = 0; p < kh; p++)
              for (int64_t q = 0; q < kw; q++) {
                int64_t ih = y * c->stride[0] - c->padding[0] + p * c->dilation[0];
                int64_t iw = z * c->stride[1] - c->padding[1] + q * c->dilation[1];
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                acc += x[((i * cin + grp * cg + ci) * h + ih) * wd + iw] *
                       w[((o * cg + ci) * kh + p) * kw + q];
              }
          out[((i * cout + o) * oh + y) * ow + z] = acc;
        }
  *oh_ = oh, *ow_ = ow;
}

static kiln_tensor *b_conv(kiln_tensor *const *x, const void *ctx) {
  const conv_ctx *c = ctx;
  return kiln_conv2d(x[0], x[1], c->bias ? x[2] : NULL, c->stride, c->padding, c->dilation,
                     c->groups);
}

static void conv_case(const int64_t *xs, const int64_t *ws, conv_ctx c, bool grad) {
  gin in[3] = {rin(4, xs, -1, 1, true), rin(4, ws, -1, 1, true), rin(1, S(ws[0]), -1, 1, true)};
  kiln_tensor *x[3];
  for (int i = 0; i < 3; i++) x[i] = f64t(in[i].nd, in[i].shape, in[i].v);
  kiln_tensor *y = b_conv(x, &c);
  int64_t oh, ow;
  double *ref = malloc((size_t)(xs[0] * ws[0] * xs[2] * xs[3] * 4 + 16) * sizeof(double));
  ref_conv(in[0].v, xs, in[1].v, ws, c.bias ? in[2].v : NULL, &c, ref, &oh, &ow);
  CHECK_TENSOR(y, 4, S(xs[0], ws[0], oh, ow), ref, 1e-13);
  /* the f32 path agrees too */
  kiln_tensor *x32 = kiln_cast(x[0], F32), *w32 = kiln_cast(x[1], F32), *b32 = kiln_cast(x[2], F32);
  kiln_tensor *y32 =
      kiln_conv2d(x32, w32, c.bias ? b32 : NULL, c.stride, c.padding, c.dilation, c.groups);
  CHECK(y32 && kiln_dtype_of(y32) == F32);
  CHECK_TENSOR(y32, 4, S(xs[0], ws[0], oh, ow), ref, 1e-5);
  kiln_release(x32), kiln_release(w32), kiln_release(b32), kiln_release(y32);
  free(ref);
  kiln_release(y);
  for (int i = 0; i < 3; i++) kiln_release(x[i]);
  if (grad) GRADCHECK(b_conv, &c, c.bias ? 3 : 2, in);
  free_gins(in, 3);
}

static conv_ctx padded_1(void) { return (conv_ctx){{1, 1}, {1, 1}, {1, 1}, 1, false}; }

/* m = sum(gx * A) + sum(gw * B) for (gx, gw) the gradients of
   sum(conv2d(x, w) * R) taken with create_graph: it differentiates the
   convolution's adjoints (conv2d_input, conv2d_weight) once more */
static double second_order(const gin *in, const double *R, const double *A, const double *Bv,
                           const conv_ctx *c, double *dx, double *dw) {
  kiln_tensor *x = f64t(4, in[0].shape, in[0].v), *w = f64t(4, in[1].shape, in[1].v);
  kiln_set_requires_grad(x, true), kiln_set_requires_grad(w, true);
  kiln_tensor *y = kiln_conv2d(x, w, NULL, c->stride, c->padding, c->dilation, c->groups);
  kiln_tensor *r = f64t(4, kiln_shape(y), R), *yr = kiln_mul(y, r),
              *l = kiln_sum(yr, 0, NULL, false);
  kiln_tensor *xw[2] = {x, w}, *g[2] = {0};
  CHECK(kiln_grad_of(1, &l, NULL, 2, xw, g, true) == KILN_OK);
  kiln_tensor *a = f64t(4, in[0].shape, A), *b = f64t(4, in[1].shape, Bv);
  kiln_tensor *ga = kiln_mul(g[0], a), *gb = kiln_mul(g[1], b);
  kiln_tensor *sa = kiln_sum(ga, 0, NULL, false), *sb = kiln_sum(gb, 0, NULL, false),
              *m = kiln_add(sa, sb);
  double v = kiln_item(m);
  if (dx) {
    kiln_tensor *d[2] = {0};
    CHECK(kiln_grad_of(1, &m, NULL, 2, xw, d, false) == KILN_OK);
    CHECK(kiln_to_buffer(d[0], dx, sizeof(double) * (size_t)kiln_numel(x)) == KILN_OK);
    CHECK(kiln_to_buffer(d[1], dw, sizeof(double) * (size_t)kiln_numel(w)) == KILN_OK);
    kiln_release(d[0]), kiln_release(d[1]);
  }
  kiln_tensor *all[] = {x, w, y, r, yr, l, g[0], g[1], a, b, ga, gb, sa, sb, m};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
  return v;
}

TEST(conv2d_second_order_gradients) {
  conv_ctx c = {{2, 1}, {1, 1}, {1, 2}, 2, false};
  int64_t xs[4] = {2, 4, 6, 5}, ws[4] = {4, 2, 2, 3};
  gin in[2] = {rin(4, xs, -1, 1, true), rin(4, ws, -1, 1, true)};
  int64_t nx = numel_of(4, xs), nw = numel_of(4, ws), ny = 2 * 4 * 4 * 3; /* oh 4, ow 3 */
  double *R = malloc(sizeof(double) * (size_t)ny), *A = malloc(sizeof(double) * (size_t)nx);
  double *Bv = malloc(sizeof(double) * (size_t)nw), *dx = malloc(sizeof(double) * (size_t)nx);
  double *dw = malloc(sizeof(double) * (size_t)nw);
  fill(R, ny, -1, 1), fill(A, nx, -1, 1), fill(Bv, nw, -1, 1);
  second_order(in, R, A, Bv, &c, dx, dw);
  for (int k = 0; k < 2; k++) {
    int64_t n = k ? nw : nx;
    for (int64_t e = 0; e < n; e++) {
      double v0 = in[k].v[e], h = 1e-5;
      in[k].v[e] = v0 + h;
      double lp = second_order(in, R, A, Bv, &c, NULL, NULL);
      in[k].v[e] = v0 - h;
      double lm = second_order(in, R, A, Bv, &c, NULL, NULL);
      in[k].v[e] = v0;
      double fd = (lp - lm) / (2 * h), got = k ? dw[e] : dx[e];
      if (!(fabs(got - fd) <= 1e-6 * fmax(1.0, fabs(fd))))
        KTEST_FAIL("d m / d%s[%lld] = %.12g, finite differences %.12g", k ? "w" : "x", (long long)e,
                   got, fd);
    }
  }
  free(R), free(A), free(Bv), free(dx), free(dw);
  free_gins(in, 2);
}

TEST(conv2d_values_and_gradients) {
  conv_ctx plain = {{1, 1}, {0, 0}, {1, 1}, 1, true};
  conv_case(S(2, 3, 5, 6), S(4, 3, 3, 3), plain, true);
  conv_ctx padded = {{2, 1}, {1, 2}, {1, 1}, 1, false};
  conv_case(S(2, 2, 6, 5), S(3, 2, 3, 2), padded, true);
  conv_ctx dilated = {{1, 2}, {2, 1}, {2, 1}, 1, true};
  conv_case(S(1, 2, 7, 6), S(2, 2, 3, 3), dilated, true);
  conv_ctx grouped = {{1, 1}, {1, 1}, {1, 1}, 2, true};
  conv_case(S(2, 4, 5, 5), S(6, 2, 3, 3), grouped, true);
  conv_ctx depthwise = {{2, 2}, {1, 1}, {1, 1}, 3, false};
  conv_case(S(1, 3, 6, 6), S(3, 1, 3, 3), depthwise, true);
  conv_ctx pointwise = {{1, 1}, {0, 0}, {1, 1}, 1, true};
  conv_case(S(3, 5, 4, 4), S(2, 5, 1, 1), pointwise, false);
  /* more output positions than one tile of vm/kern_conv.c (256), tiles
     ending mid-row; strided, dilated and grouped too */
  conv_case(S(2, 3, 21, 23), S(4, 3, 3, 3), padded_1(), false);
  conv_ctx wide = {{2, 1}, {2, 1}, {2, 1}, 2, true};
  conv_case(S(1, 4, 40, 37), S(2, 2, 3, 2), wide, false);
  conv_case(S(1, 2, 17, 19), S(2, 2, 3, 3), padded_1(), true);
  /* a stride past 255 takes the composed im2col path (index_select + matmul) */
  conv_ctx far = {{1, 256}, {0, 1}, {1, 1}, 1, true};
  conv_case(S(1, 2, 2, 300), S(2, 2, 1, 2), far, true);
  { /* an empty batch: an empty output, a zero weight gradient */
    kiln_tensor *x = kiln_zeros(F32, 4, S(0, 2, 5, 5)), *w = kiln_ones(F32, 4, S(3, 2, 3, 3));
    kiln_set_requires_grad(x, true), kiln_set_requires_grad(w, true);
    kiln_tensor *y = kiln_conv2d(x, w, NULL, NULL, NULL, NULL, 1), *l = kiln_sum(y, 0, NULL, false);
    CHECK(y && kiln_numel(y) == 0 && kiln_backward(l, NULL) == KILN_OK);
    kiln_tensor *gw = kiln_grad(w);
    float v[54] = {1};
    CHECK(gw && kiln_to_buffer(gw, v, sizeof v) == KILN_OK);
    for (int i = 0; i < 54; i++) CHECK(v[i] == 0);
    kiln_release(gw), kiln_release(l), kiln_release(y), kiln_release(x), kiln_release(w);
  }
  /* NULL stride/padding/dilation mean 1/0/1 */
  kiln_tensor *x = kiln_ones(F64, 4, S(1, 1, 3, 3)), *w = kiln_ones(F64, 4, S(1, 1, 2, 2));
  kiln_tensor *y = kiln_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
  CHECK_TENSOR(y, 4, S(1, 1, 2, 2), D(4, 4, 4, 4), 0);
  kiln_release(y);
  kiln_release(x), kiln_release(w);
}

TEST(conv2d_errors) {
  kiln_tensor *x = kiln_ones(F32, 4, S(2, 4, 5, 5)), *w = kiln_ones(F32, 4, S(6, 2, 3, 3));
  kiln_tensor *x3 = kiln_ones(F32, 3, S(4, 5, 5)), *b = kiln_ones(F32, 1, S(5));
  int one[2] = {1, 1}, zero[2] = {0, 0}, neg[2] = {-1, 0}, big[2] = {4, 4};
  CHECK_ERROR(kiln_conv2d(x3, w, NULL, one, zero, one, 2), KILN_ERR_SHAPE,
              "kiln_conv2d: input must be 4-d [N,C,H,W], got shape [4,5,5]");
  CHECK_ERROR(kiln_conv2d(x, w, NULL, one, neg, one, 2), KILN_ERR_ARG, "padding [-1,0]");
  CHECK_ERROR(kiln_conv2d(x, w, NULL, zero, zero, one, 2), KILN_ERR_ARG, "stride [0,0]");
  int vast[2] = {1 << 30, 1 << 30}; /* the message names the limit it broke */
  CHECK_ERROR(kiln_conv2d(x, w, NULL, one, vast, one, 2), KILN_ERR_ARG, "padding in [0, 2^20]");
  CHECK_ERROR(kiln_conv2d(x, w, NULL, one, zero, one, 3), KILN_ERR_ARG,
              "kiln_conv2d: groups 3 must be >= 1 and divide the input channels 4");
  CHECK_ERROR(kiln_conv2d(x, w, NULL, one, zero, one, 1), KILN_ERR_SHAPE,
              "weight [6,2,3,3] needs 4 input channels per group");
  CHECK_ERROR(kiln_conv2d(x, w, b, one, zero, one, 2), KILN_ERR_SHAPE,
              "bias has shape [5], expected [6]");
  CHECK_ERROR(kiln_conv2d(x, w, NULL, one, zero, big, 2), KILN_ERR_SHAPE,
              "smaller than the 9x9 window");
  kiln_tensor *xi = kiln_ones(I64, 4, S(2, 4, 5, 5));
  CHECK_ERROR(kiln_conv2d(xi, w, NULL, one, zero, one, 2), KILN_ERR_DTYPE,
              "input must be a float tensor, not int64");
  kiln_release(xi), kiln_release(x), kiln_release(w), kiln_release(x3), kiln_release(b);
  /* sizes whose window count overflows are refused before anything is built */
  kiln_tensor *huge = kiln_zeros(F32, 4, S(1, 2, INT64_C(1) << 29, INT64_C(1) << 29));
  kiln_tensor *w1 = kiln_zeros(F32, 4, S(1, 2, 3, 3)); /* 9 * 2^59 windows */
  CHECK(huge != NULL);
  if (huge) CHECK_ERROR(kiln_conv2d(huge, w1, NULL, one, one, one, 1), KILN_ERR_SHAPE, "too many");
  if (huge)
    CHECK_ERROR(kiln_max_pool2d(huge, (int[]){1, 1}, NULL, NULL), KILN_ERR_SHAPE, "too many");
  kiln_release(huge), kiln_release(w1);
}

typedef struct {
  bool max;
  int kernel[2], stride[2], padding[2];
} pool_ctx;

static kiln_tensor *b_pool(kiln_tensor *const *x, const void *ctx) {
  const pool_ctx *c = ctx;
  return c->max ? kiln_max_pool2d(x[0], c->kernel, c->stride, c->padding)
                : kiln_avg_pool2d(x[0], c->kernel, c->stride, c->padding);
}

static void pool_case(const int64_t *xs, pool_ctx c) {
  gin in[1] = {rin(4, xs, -1, 1, true)};
  kiln_tensor *x = f64t(4, xs, in[0].v);
  kiln_tensor *y = b_pool(&x, &c);
  int64_t oh = (xs[2] + 2 * c.padding[0] - c.kernel[0]) / c.stride[0] + 1;
  int64_t ow = (xs[3] + 2 * c.padding[1] - c.kernel[1]) / c.stride[1] + 1;
  int64_t nc = xs[0] * xs[1];
  double *ref = malloc((size_t)(nc * oh * ow) * sizeof(double));
  for (int64_t p = 0; p < nc; p++)
    for (int64_t a = 0; a < oh; a++)
      for (int64_t b = 0; b < ow; b++) {
        double acc = c.max ? -INFINITY : 0;
        for (int i = 0; i < c.kernel[0]; i++)
          for (int j = 0; j < c.kernel[1]; j++) {
            int64_t ih = a * c.stride[0] - c.padding[0] + i,
                    iw = b * c.stride[1] - c.padding[1] + j;
            if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
            double v = in[0].v[(p * xs[2] + ih) * xs[3] + iw];
            acc = c.max ? fmax(acc, v) : acc + v;
          }
        ref[(p * oh + a) * ow + b] = c.max ? acc : acc / (c.kernel[0] * c.kernel[1]);
      }
  CHECK_TENSOR(y, 4, S(xs[0], xs[1], oh, ow), ref, 1e-15);
  free(ref);
  kiln_release(y), kiln_release(x);
  GRADCHECK(b_pool, &c, 1, in);
  free_gins(in, 1);
}

TEST(pooling_values_and_gradients) {
  pool_case(S(2, 3, 6, 6), (pool_ctx){true, {2, 2}, {2, 2}, {0, 0}});
  pool_case(S(1, 2, 7, 5), (pool_ctx){true, {3, 3}, {2, 1}, {1, 1}});
  pool_case(S(2, 2, 6, 6), (pool_ctx){false, {2, 2}, {2, 2}, {0, 0}});
  pool_case(S(1, 2, 5, 7), (pool_ctx){false, {3, 2}, {2, 2}, {1, 1}});
  /* max: the gradient goes to the first maximum only (PyTorch), NaN wins */
  kiln_tensor *x = f64t(4, S(1, 1, 2, 2), D(1, 3, 3, 2));
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  int k[2] = {2, 2};
  kiln_tensor *y = kiln_max_pool2d(x, k, NULL, NULL);
  CHECK_TENSOR(y, 4, S(1, 1, 1, 1), D(3), 0);
  kiln_tensor *seed = kiln_ones(F64, 4, S(1, 1, 1, 1));
  CHECK_EQ_INT(kiln_backward(y, seed), 0);
  kiln_release(seed);
  kiln_tensor *g = kiln_grad(x);
  CHECK_TENSOR(g, 4, S(1, 1, 2, 2), D(0, 1, 0, 0), 0);
  kiln_release(g), kiln_release(y), kiln_release(x);
  x = f64t(4, S(1, 1, 2, 2), D(1, NAN, 3, 2));
  y = kiln_max_pool2d(x, k, NULL, NULL);
  CHECK(isnan(kiln_item(y)));
  kiln_release(y);
  int pad[2] = {2, 0}, one[2] = {1, 1}, zero[2] = {0, 0};
  CHECK_ERROR(kiln_max_pool2d(x, k, one, pad), KILN_ERR_ARG,
              "kiln_max_pool2d: padding [2,0] must be at most half the kernel [2,2]");
  CHECK_ERROR(kiln_avg_pool2d(x, zero, one, zero), KILN_ERR_ARG,
              "kiln_avg_pool2d: bad pooling arguments");
  kiln_tensor *x2 = kiln_ones(F64, 2, S(2, 2));
  CHECK_ERROR(kiln_avg_pool2d(x2, k, NULL, NULL), KILN_ERR_SHAPE,
              "kiln_avg_pool2d: input must be 4-d");
  kiln_release(x2), kiln_release(x);
}

/* index_select and scatter_add take fast paths for contiguous operands
   (runs of consecutive indices copied / added as blocks): they must give
   the general loops' values bit for bit, repeats and runs included */
TEST(index_fast_paths_match_the_general_loops) {
  const int64_t idx[12] = {0, 1, 2, 3, 10, 11, 12, 5, 5, 6, 49, 48};
  float av[150], wide[300], src[36];
  for (int i = 0; i < 150; i++) av[i] = (float)sin(i * 0.37) * 3;
  for (int i = 0; i < 150; i++) wide[2 * i] = av[i], wide[2 * i + 1] = -1;
  for (int i = 0; i < 36; i++) src[i] = (float)cos(i * 0.91) / 7;
  kiln_tensor *a = kiln_from_data(av, F32, 2, S(3, 50));
  kiln_tensor *w = kiln_from_data(wide, F32, 2, S(3, 100));
  kiln_tensor *strided = kiln_slice(w, 1, 0, 100, 2); /* a's values, not contiguous */
  kiln_tensor *i1 = i64t(1, S(12), idx);
  kiln_tensor *fast = kiln_index_select(a, 1, i1), *slow = kiln_index_select(strided, 1, i1);
  float vf[36], vs[36];
  CHECK_EQ_INT(kiln_to_buffer(fast, vf, sizeof vf), 0);
  CHECK_EQ_INT(kiln_to_buffer(slow, vs, sizeof vs), 0);
  CHECK(!memcmp(vf, vs, sizeof vf));
  for (int r = 0; r < 3; r++)
    for (int k = 0; k < 12; k++) CHECK(vf[r * 12 + k] == av[r * 50 + idx[k]]);
  /* scatter_add: an expanded 1-d index (fast) vs the same index materialized */
  int64_t full_idx[36];
  for (int i = 0; i < 36; i++) full_idx[i] = idx[i % 12];
  kiln_tensor *row = kiln_reshape(i1, 2, S(1, 12)), *ex = kiln_expand(row, 2, S(3, 12));
  kiln_tensor *mat = i64t(2, S(3, 12), full_idx), *sv = kiln_from_data(src, F32, 2, S(3, 12));
  kiln_tensor *base = kiln_from_data(av, F32, 2, S(3, 50));
  kiln_tensor *sf = kiln_scatter_add(base, 1, ex, sv), *ss = kiln_scatter_add(base, 1, mat, sv);
  float of[150], os[150];
  CHECK_EQ_INT(kiln_to_buffer(sf, of, sizeof of), 0);
  CHECK_EQ_INT(kiln_to_buffer(ss, os, sizeof os), 0);
  CHECK(!memcmp(of, os, sizeof of));
  CHECK(of[50 + 5] == (av[55] + src[12 + 7]) + src[12 + 8]); /* the repeat, in k order */
  /* gather and scatter_add with an elementwise index: every operand
     contiguous (the fast path) vs a strided source (the general loop) */
  kiln_tensor *gf = kiln_gather(a, 1, mat), *gs = kiln_gather(strided, 1, mat);
  CHECK_EQ_INT(kiln_to_buffer(gf, vf, sizeof vf), 0);
  CHECK_EQ_INT(kiln_to_buffer(gs, vs, sizeof vs), 0);
  CHECK(!memcmp(vf, vs, sizeof vf));
  for (int i = 0; i < 36; i++) CHECK(vf[i] == av[(i / 12) * 50 + full_idx[i]]);
  float src2[72];
  for (int i = 0; i < 36; i++) src2[2 * i] = src[i], src2[2 * i + 1] = 99;
  kiln_tensor *sw = kiln_from_data(src2, F32, 2, S(3, 24)), *sstr = kiln_slice(sw, 1, 0, 24, 2);
  kiln_tensor *sg = kiln_scatter_add(base, 1, mat, sstr);
  CHECK_EQ_INT(kiln_to_buffer(sg, os, sizeof os), 0);
  CHECK(!memcmp(of, os, sizeof of));
  kiln_tensor *all[] = {a,  w,    strided, i1, fast, slow, row, ex,   mat,
                        sv, base, sf,      ss, gf,   gs,   sw,  sstr, sg};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
}

/* a small CNN step (conv-relu-pool-linear) runs repeatedly: the traces
   settle, compile, and give the interpreter's values */
TEST(cnn_step_repeats_with_the_same_values) {
  double first = NAN;
  for (int step = 0; step < 4; step++) {
    kiln_manual_seed(3);
    kiln_tensor *x = kiln_randn(F32, 4, S(4, 1, 8, 8)), *w = kiln_randn(F32, 4, S(4, 1, 3, 3));
    kiln_tensor *fc = kiln_randn(F32, 2, S(64, 10));
    kiln_set_requires_grad(w, true);
    kiln_set_requires_grad(fc, true);
    int one[2] = {1, 1}, k[2] = {2, 2};
    kiln_tensor *c = kiln_conv2d(x, w, NULL, one, one, one, 1);
    kiln_tensor *r = kiln_relu(c), *p = kiln_max_pool2d(r, k, NULL, NULL);
    kiln_tensor *flat = kiln_reshape(p, 2, S(4, -1)), *logits = kiln_matmul(flat, fc);
    kiln_tensor *t = i64t(1, S(4), (const int64_t[]){1, 2, 3, 4});
    kiln_tensor *l = kiln_cross_entropy(logits, t);
    CHECK_EQ_INT(kiln_backward(l, NULL), 0);
    kiln_tensor *g = kiln_grad(w);
    kiln_tensor *gs = kiln_sum(g, 0, NULL, false);
    double v = kiln_item(l) + kiln_item(gs);
    if (step == 0) first = v;
    CHECK(v == first && isfinite(v));
    kiln_tensor *all[] = {x, w, fc, c, r, p, flat, logits, t, l, g, gs};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
  }
}

/* ---- compiled vs interpreter -------------------------------------------------
   The same training steps (conv, batch_norm, relu, dropout, both pools,
   cumsum, embedding, one_hot, nll and bce losses, backward) run in two
   child processes, KILN_JIT=0 and KILN_JIT=1 KILN_HOT=1 KILN_PAYOFF=0 KILN_ASYNC=0 with
   an empty cache (every trace compiled at first sight); they print the raw
   bytes of every result and must agree bit for bit. */

static void print_bytes(kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  size_t es = kiln_dtype_of(t) == F64 || kiln_dtype_of(t) == I64 ? 8 : 4;
  unsigned char *b = malloc((size_t)n * es + 1);
  if (kiln_to_buffer(t, b, (size_t)n * es) == 0)
    for (size_t i = 0; i < (size_t)n * es; i++) printf("%02x", b[i]);
  else
    printf("error:%s", kiln_last_error());
  printf("\n");
  free(b);
}

static int child_steps(void) {
  int one[2] = {1, 1}, k2[2] = {2, 2};
  kiln_manual_seed(1);
  kiln_tensor *w = kiln_randn(F32, 4, S(6, 3, 3, 3)), *b = kiln_randn(F32, 1, S(6));
  kiln_tensor *gamma = kiln_ones(F32, 1, S(6)), *beta = kiln_zeros(F32, 1, S(6));
  kiln_tensor *rm = kiln_zeros(F32, 1, S(6)), *rv = kiln_ones(F32, 1, S(6));
  kiln_tensor *fc = kiln_randn(F32, 2, S(150, 5)), *emb = kiln_randn(F32, 2, S(7, 5));
  kiln_tensor *params[] = {w, b, gamma, beta, fc, emb};
  for (int i = 0; i < 6; i++) kiln_set_requires_grad(params[i], true);
  const int64_t tv[4] = {0, 3, 4, 1}, iv[4] = {6, 0, 2, 2};
  kiln_tensor *t = i64t(1, S(4), tv), *ids = i64t(1, S(4), iv);
  for (int step = 0; step < 3; step++) {
    kiln_tensor *x = kiln_randn(F32, 4, S(4, 3, 8, 8));
    kiln_tensor *c = kiln_conv2d(x, w, b, one, one, one, 1);
    kiln_tensor *n = kiln_batch_norm(c, rm, rv, gamma, beta, true, 0.1, 1e-5);
    kiln_tensor *r = kiln_relu(n), *d = kiln_dropout(r, 0.2, true);
    kiln_tensor *p = kiln_max_pool2d(d, k2, NULL, NULL), *a = kiln_avg_pool2d(p, k2, one, one);
    kiln_tensor *flat = kiln_reshape(a, 2, S(4, 150)), *cs = kiln_cumsum(flat, 1);
    kiln_tensor *scaled = kiln_mul_scalar(cs, 0.01), *logits0 = kiln_matmul(scaled, fc);
    kiln_tensor *e = kiln_embedding(emb, ids), *logits = kiln_add(logits0, e);
    kiln_tensor *ls = kiln_log_softmax(logits, 1), *nll = kiln_nll_loss(ls, t);
    kiln_tensor *oh = kiln_one_hot(t, 5, F32), *bce = kiln_bce_with_logits(logits, oh);
    kiln_tensor *top = kiln_topk(logits, 2, 1, true, NULL), *topsum = kiln_sum(top, 0, NULL, false);
    kiln_tensor *top_scaled = kiln_mul_scalar(topsum, 0.01), *loss0 = kiln_add(nll, bce);
    kiln_tensor *loss = kiln_add(loss0, top_scaled);
    if (kiln_backward(loss, NULL) != 0) printf("backward failed: %s\n", kiln_last_error());
    print_bytes(loss);
    for (int i = 0; i < 6; i++) {
      kiln_tensor *g = kiln_grad(params[i]);
      print_bytes(g);
      kiln_sub_scaled_(params[i], g, 0.05);
      kiln_release(g);
      kiln_zero_grad(params[i]);
    }
    print_bytes(rm);
    print_bytes(rv);
    kiln_tensor *tmp[] = {x, c,      n,  r,   d,  p,   a,   flat,   cs,         scaled, logits0,
                          e, logits, ls, nll, oh, bce, top, topsum, top_scaled, loss0,  loss};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) kiln_release(tmp[i]);
  }
  printf("compiles=%g\n", kiln_stat("kernels_compiled") > 0 ? 1.0 : 0.0);
  for (int i = 0; i < 6; i++) kiln_release(params[i]);
  kiln_release(rm), kiln_release(rv), kiln_release(t), kiln_release(ids);
  return 0;
}

/* runs this program as a child with env prefix `env`; its stdout, malloc'd */
static char *run_child(const char *env) {
  char self[512], cmd[1200];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return NULL;
  self[n] = 0;
  snprintf(cmd, sizeof cmd, "env %s '%s' --child-steps", env, self);
  FILE *f = popen(cmd, "r");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  size_t got;
  while ((got = fread(out + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (cap - len < 4096) out = realloc(out, cap *= 2);
  }
  out[len] = 0;
  if (pclose(f) != 0) {
    free(out);
    return NULL;
  }
  return out;
}

TEST(compiled_steps_match_the_interpreter_bit_for_bit) {
  char dir[] = "/tmp/kiln-layers-cache-XXXXXX", env[256];
  if (!mkdtemp(dir)) {
    KTEST_FAIL("mkdtemp failed");
    return;
  }
  char *ref = run_child("KILN_JIT=0");
  snprintf(env, sizeof env, "KILN_JIT=1 KILN_HOT=1 KILN_PAYOFF=0 KILN_ASYNC=0 KILN_CACHE_DIR=%s",
           dir);
  char *jit = run_child(env);
  CHECK(ref && jit);
  if (ref && jit) {
    char *rl = strstr(ref, "compiles="), *jl = strstr(jit, "compiles=");
    CHECK(rl && jl && !strncmp(rl, "compiles=0", 10) && !strncmp(jl, "compiles=1", 10));
    if (rl) *rl = 0;
    if (jl) *jl = 0;
    CHECK(!strstr(ref, "error") && !strstr(ref, "failed"));
    if (strcmp(ref, jit)) {
      size_t i = 0;
      while (ref[i] && ref[i] == jit[i]) i++;
      int line = 1;
      for (size_t k = 0; k < i; k++) line += ref[k] == '\n';
      KTEST_FAIL("compiled and interpreted results differ (first at output line %d)", line);
    }
  }
  free(ref);
  free(jit);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* ---- PyTorch as a peer ------------------------------------------------------------ */

/* The layer ops and their gradients against PyTorch in f64, when
   /usr/bin/python3 has torch (it skips cleanly otherwise).  Each case's
   loss is sum(out * W), W[k] = 0.5 + 0.37 (k % 7) - 0.11 (k % 3) over out's
   flat index, on both sides; the inputs go to Python as raw f64 files, and
   Python's outputs and gradients come back the same way, in the order the
   cases list them here. */
enum { PEER_MAX = 64 };
typedef struct {
  kiln_tensor *t[PEER_MAX]; /* Kiln's results, in order */
  int n;
  FILE *manifest; /* "name ndim d0 d1 ..." per input */
  char dir[64];
  int nin;
} peer;

static kiln_tensor *peer_input(peer *P, const char *name, int nd, const int64_t *shape, double lo,
                               double hi, bool grad) {
  int64_t n = numel_of(nd, shape);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  fill(v, n, lo, hi);
  char path[160];
  snprintf(path, sizeof path, "%s/in%d.bin", P->dir, P->nin++);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(v, sizeof(double), (size_t)n, f) == (size_t)n);
  if (f) fclose(f);
  fprintf(P->manifest, "%s %d", name, nd);
  for (int d = 0; d < nd; d++) fprintf(P->manifest, " %lld", (long long)shape[d]);
  fputc('\n', P->manifest);
  kiln_tensor *t = f64t(nd, shape, v);
  free(v);
  if (grad) kiln_set_requires_grad(t, true);
  return t;
}

static void peer_keep(peer *P, kiln_tensor *t) {
  if (P->n < PEER_MAX) P->t[P->n++] = t;
}

/* sum(out * W) */
static kiln_tensor *peer_loss(kiln_tensor *out) {
  int64_t n = kiln_numel(out);
  double *w = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t k = 0; k < n; k++) w[k] = 0.5 + 0.37 * (double)(k % 7) - 0.11 * (double)(k % 3);
  kiln_tensor *wt = f64t(kiln_ndim(out), kiln_shape(out), w), *p = kiln_mul(out, wt);
  kiln_tensor *l = kiln_sum(p, 0, NULL, false);
  free(w);
  kiln_release(wt), kiln_release(p);
  return l;
}

/* out, then the gradients of sum(out * W) with respect to each of ins */
static void peer_case(peer *P, kiln_tensor *out, int nin, kiln_tensor *const *ins) {
  peer_keep(P, out);
  kiln_tensor *l = peer_loss(out), *g[8] = {0};
  CHECK(kiln_grad_of(1, &l, NULL, nin, ins, g, false) == KILN_OK);
  for (int i = 0; i < nin; i++) peer_keep(P, g[i]);
  kiln_release(l);
}

static const char *const PEER_PY =
    "import sys, numpy as np, torch\n"
    "import torch.nn.functional as F\n"
    "d = sys.argv[1]\n"
    "T = {}\n"
    "for i, line in enumerate(open(d + '/manifest.txt')):\n"
    "    name, nd, *shape = line.split()\n"
    "    T[name] = torch.from_numpy(np.fromfile('%s/in%d.bin' % (d, i), dtype=np.float64)\n"
    "                               .reshape([int(s) for s in shape])).requires_grad_(True)\n"
    "outs = []\n"
    "def case(out, *ins):\n"
    "    w = torch.arange(out.numel(), dtype=torch.float64)\n"
    "    w = (0.5 + 0.37 * (w % 7) - 0.11 * (w % 3)).reshape(out.shape)\n"
    "    gs = torch.autograd.grad((out * w).sum(), ins, allow_unused=True)\n"
    "    outs.append(out.detach())\n"
    "    outs.extend(g if g is not None else torch.zeros_like(x) for g, x in zip(gs, ins))\n"
    "x, w, b = T['x'], T['w'], T['b']\n"
    "case(F.conv2d(x, w, b, (2, 1), (1, 2), (1, 2), 2), x, w, b)\n"
    "p = T['p']\n"
    "case(F.max_pool2d(p, (3, 2), (2, 2), (1, 1)), p)\n"
    "case(F.avg_pool2d(p, (3, 2), (2, 2), (1, 1)), p)\n"
    "q, g, h = T['q'], T['g'], T['h']\n"
    "rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)\n"
    "case(F.batch_norm(q, rm, rv, g, h, True, 0.1, 1e-5), q, g, h)\n"
    "outs.append(rm); outs.append(rv)\n"
    "c = T['c']\n"
    "case(torch.cumsum(c, 1), c)\n"
    "case(torch.var(c, 1, unbiased=True, keepdim=True), c)\n"
    "case(torch.sort(c, 1, descending=True)[0], c)\n"
    "case(torch.topk(c, 3, 1)[0], c)\n"
    "z, t = T['z'], T['t'].detach().long()\n"
    "case(F.nll_loss(F.log_softmax(z, 1), t), z)\n"
    "case(F.binary_cross_entropy_with_logits(z, torch.sigmoid(T['y'])), z)\n"
    "E, ix = T['E'], T['ix'].detach().long()\n"
    "case(F.embedding(ix, E), E)\n"
    "np.concatenate([o.detach().double().reshape(-1).numpy() for o in outs]).tofile(d + "
    "'/torch.bin')\n";

TEST(ops_agree_with_torch) {
  if (access("/usr/bin/python3", X_OK) != 0 ||
      system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
    printf("ops_agree_with_torch: skipped (no torch in /usr/bin/python3)\n");
    return;
  }
  peer P = {.n = 0};
  snprintf(P.dir, sizeof P.dir, "/tmp/kiln-torch-XXXXXX");
  if (!mkdtemp(P.dir)) {
    KTEST_FAIL("mkdtemp: %s", strerror(errno));
    return;
  }
  char path[160];
  snprintf(path, sizeof path, "%s/manifest.txt", P.dir);
  P.manifest = fopen(path, "w");
  kiln_tensor *in[16];
  int ni = 0;
  /* conv2d: stride (2,1), padding (1,2), dilation (1,2), groups 2, bias */
  kiln_tensor *x = in[ni++] = peer_input(&P, "x", 4, S(2, 4, 9, 8), -1, 1, true);
  kiln_tensor *w = in[ni++] = peer_input(&P, "w", 4, S(6, 2, 3, 2), -1, 1, true);
  kiln_tensor *b = in[ni++] = peer_input(&P, "b", 1, S(6), -1, 1, true);
  int st[2] = {2, 1}, pd[2] = {1, 2}, dl[2] = {1, 2}, pk[2] = {3, 2}, ps[2] = {2, 2},
      pp[2] = {1, 1};
  peer_case(&P, kiln_conv2d(x, w, b, st, pd, dl, 2), 3, (kiln_tensor *[]){x, w, b});
  kiln_tensor *p = in[ni++] = peer_input(&P, "p", 4, S(2, 3, 7, 6), -1, 1, true);
  peer_case(&P, kiln_max_pool2d(p, pk, ps, pp), 1, &p);
  peer_case(&P, kiln_avg_pool2d(p, pk, ps, pp), 1, &p);
  kiln_tensor *q = in[ni++] = peer_input(&P, "q", 3, S(4, 3, 5), -2, 2, true);
  kiln_tensor *g = in[ni++] = peer_input(&P, "g", 1, S(3), 0.5, 1.5, true);
  kiln_tensor *h = in[ni++] = peer_input(&P, "h", 1, S(3), -1, 1, true);
  kiln_tensor *rm = kiln_zeros(F64, 1, S(3)), *rv = kiln_ones(F64, 1, S(3));
  peer_case(&P, kiln_batch_norm(q, rm, rv, g, h, true, 0.1, 1e-5), 3, (kiln_tensor *[]){q, g, h});
  peer_keep(&P, rm), peer_keep(&P, rv);
  kiln_tensor *c = in[ni++] = peer_input(&P, "c", 2, S(3, 7), -3, 3, true);
  int ax1[1] = {1};
  peer_case(&P, kiln_cumsum(c, 1), 1, &c);
  peer_case(&P, kiln_var(c, 1, ax1, 1, true), 1, &c);
  peer_case(&P, kiln_sort(c, 1, true, NULL), 1, &c);
  peer_case(&P, kiln_topk(c, 3, 1, true, NULL), 1, &c);
  kiln_tensor *z = in[ni++] = peer_input(&P, "z", 2, S(5, 4), -2, 2, true);
  kiln_tensor *tf = in[ni++] = peer_input(&P, "t", 1, S(5), 0, 3.999, false);
  kiln_tensor *tfl = kiln_floor(tf), *t = kiln_cast(tfl, I64); /* as .long() of values >= 0 */
  kiln_tensor *yl = in[ni++] = peer_input(&P, "y", 2, S(5, 4), -2, 2, false);
  kiln_tensor *ls = kiln_log_softmax(z, 1), *sg = kiln_sigmoid(yl);
  peer_case(&P, kiln_nll_loss(ls, t), 1, &z);
  peer_case(&P, kiln_bce_with_logits(z, sg), 1, &z);
  kiln_tensor *E = in[ni++] = peer_input(&P, "E", 2, S(6, 3), -1, 1, true);
  kiln_tensor *ixf = in[ni++] = peer_input(&P, "ix", 2, S(2, 4), 0, 5.999, false);
  kiln_tensor *ixl = kiln_floor(ixf), *ix = kiln_cast(ixl, I64);
  peer_case(&P, kiln_embedding(E, ix), 1, &E);
  fclose(P.manifest);
  snprintf(path, sizeof path, "%s/peer.py", P.dir);
  FILE *f = fopen(path, "w");
  CHECK(f && fputs(PEER_PY, f) >= 0);
  if (f) fclose(f);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/peer.py %s", P.dir, P.dir);
  CHECK(system(cmd) == 0);
  snprintf(path, sizeof path, "%s/torch.bin", P.dir);
  f = fopen(path, "rb");
  CHECK(f != NULL);
  for (int i = 0; f && i < P.n; i++) {
    double *want = ktest_values(P.t[i]);
    int64_t n = kiln_numel(P.t[i]);
    double *got = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!want || fread(got, sizeof(double), (size_t)n, f) != (size_t)n) {
      KTEST_FAIL("result %d: torch gave fewer values than Kiln's %lld", i, (long long)n);
    } else {
      int bad = 0;
      for (int64_t e = 0; e < n; e++)
        if (!(fabs(want[e] - got[e]) <= 1e-10 * fmax(1.0, fabs(got[e]))) && bad++ < 3)
          KTEST_FAIL("result %d[%lld]: Kiln %.15g, torch %.15g", i, (long long)e, want[e], got[e]);
    }
    free(want), free(got);
  }
  if (f) {
    double extra;
    CHECK(fread(&extra, sizeof extra, 1, f) == 0); /* nothing left over */
    fclose(f);
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", P.dir);
  CHECK(system(cmd) == 0);
  for (int i = 0; i < P.n; i++) kiln_release(P.t[i]);
  for (int i = 0; i < ni; i++) kiln_release(in[i]);
  kiln_tensor *more[] = {tfl, t, ixl, ix, ls, sg};
  for (int i = 0; i < 6; i++) kiln_release(more[i]);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--child-steps")) return child_steps();
  RUN(linspace_values_and_ends_exact);
  RUN(eye_values);
  RUN(randint_range_and_reproducible);
  RUN(randperm_is_a_reproducible_permutation);
  RUN(clone_copies_and_passes_gradients);
  RUN(var_std_values_and_gradients);
  RUN(cumsum_values_dtypes_gradients);
  RUN(sort_topk_stable_nan_indices_gradients);
  RUN(one_hot_values_and_errors);
  RUN(embedding_values_gradients_errors);
  RUN(nll_loss_values_gradients_errors);
  RUN(bce_with_logits_stable_values_gradients_errors);
  RUN(dropout_masks_scale_reproducible);
  RUN(batch_norm_training_eval_running_stats);
  RUN(conv2d_values_and_gradients);
  RUN(conv2d_second_order_gradients);
  RUN(conv2d_errors);
  RUN(pooling_values_and_gradients);
  RUN(index_fast_paths_match_the_general_loops);
  RUN(cnn_step_repeats_with_the_same_values);
  RUN(ops_agree_with_torch);
  if (ktest_cpu_jit()) RUN(compiled_steps_match_the_interpreter_bit_for_bit);
  return ktest_done();
}
