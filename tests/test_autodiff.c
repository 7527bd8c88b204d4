/* test_autodiff.c — reverse-mode autodiff (DESIGN §7).
 *
 * 1. A generic gradient checker in f64 (gradcheck): a builder turns leaf
 *    tensors into an output; the loss is sum(out * W) with fixed random
 *    weights W of out's shape, so every output element matters.  Analytic
 *    gradients come from kiln_grad_of and, on fresh leaves, from
 *    kiln_backward + kiln_grad; both are compared element by element with
 *    central differences (h = 1e-6, tolerance 1e-6 relative + 1e-8 absolute,
 *    the absolute part scaled by sum |out * W| for the loss's own rounding),
 *    perturbing the inputs through kiln_from_data of modified host arrays.
 * 2. Gradient checks for every differentiable primitive and composite, over
 *    several shapes, broadcasting and non-contiguous (view) inputs; the
 *    non-differentiable ops (compare, logical, floor/ceil/round/sign, argmax,
 *    casts to int) must contribute nothing.
 * 3. Higher order: d2/dx2 (2x^3+8) = 12 at x = 1, Hessian-vector products
 *    against hand-derived ones, and gradchecks of create_graph gradients.
 * 4. .grad accumulation, zero_grad, no_grad, detach, requires_grad
 *    propagation, grad_of's contract, and the errors; also mixed dtypes,
 *    scatter_add, shift-invariant softmax-family gradients at +1000, a
 *    300-step chain (longer than the pending-graph cap) and a leaf as loss.
 * 5. Backward after the forward was already flushed (item, sync, a read of
 *    an intermediate).
 * 6. Backward, in-place update (kiln_sub_scaled_), zero_grad, backward; an
 *    update inside no_grad; a loss built before the update.
 *
 * Everything created is released (the tests run under ASan/LeakSanitizer).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ktest.h"

#define F32 KILN_F32
#define F64 KILN_F64
#define I64 KILN_I64

#define D(...) ((const double[]){__VA_ARGS__})
#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---- deterministic host generator: splitmix64 --------------------------- */

static uint64_t g_rng = 0x5EEDF00Dull;

static double unif(uint64_t *s) { return ktest_unif01(s); }

static int64_t numel_of(int nd, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= s[i];
  return n;
}

/* n values in [lo, hi] that depend only on seed */
static void fixed_values(double *v, int64_t n, uint64_t seed, double lo, double hi) {
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * unif(&s);
}

/* ---- temporaries: everything a builder creates goes through T() --------- */

#define POOL_CAP 8192
static kiln_tensor *g_pool[POOL_CAP];
static int g_npool;

static kiln_tensor *T(kiln_tensor *t) {
  if (t) {
    if (g_npool == POOL_CAP) {
      fprintf(stderr, "test_autodiff: temporary pool overflow\n");
      abort();
    }
    g_pool[g_npool++] = t;
  }
  return t;
}
static void pool_release_to(int mark) {
  while (g_npool > mark) kiln_release(g_pool[--g_npool]);
}

/* ---- tensor helpers ----------------------------------------------------- */

static kiln_tensor *tf64(int nd, const int64_t *s, const double *v) {
  kiln_tensor *t = kiln_from_data(v, F64, nd, s);
  CHECK(t != NULL);
  return t;
}
static kiln_tensor *ti64(int nd, const int64_t *s, const int64_t *v) {
  kiln_tensor *t = kiln_from_data(v, I64, nd, s);
  CHECK(t != NULL);
  return t;
}
static kiln_tensor *tbool(int nd, const int64_t *s, const unsigned char *v) {
  kiln_tensor *t = kiln_from_data(v, KILN_BOOL, nd, s);
  CHECK(t != NULL);
  return t;
}
/* an f64 tensor of fixed pseudo-random values in [lo, hi] */
static kiln_tensor *fixed_tensor(int nd, const int64_t *s, uint64_t seed, double lo, double hi) {
  int64_t n = numel_of(nd, s);
  double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
  fixed_values(v, n, seed, lo, hi);
  kiln_tensor *t = kiln_from_data(v, F64, nd, s);
  free(v);
  return t;
}
/* a leaf that requires grad */
static kiln_tensor *leaf(int nd, const int64_t *s, const double *v) {
  kiln_tensor *t = tf64(nd, s, v);
  if (t) CHECK_EQ_INT(kiln_set_requires_grad(t, true), 0);
  return t;
}
static bool same_shape(const kiln_tensor *a, const kiln_tensor *b) {
  if (kiln_ndim(a) != kiln_ndim(b)) return false;
  for (int i = 0; i < kiln_ndim(a); i++)
    if (kiln_shape(a)[i] != kiln_shape(b)[i]) return false;
  return true;
}
static kiln_tensor *sum_all(kiln_tensor *a) { return kiln_sum(a, 0, NULL, false); }

/* t's values against expect (n values): |a-e| <= rtol*|e| + atol */
#define CHECK_VALUES(t, n, expect, rtol, atol)                                               \
  do {                                                                                       \
    kiln_tensor *cv_ = (t);                                                                  \
    if (!cv_) {                                                                              \
      KTEST_FAIL("%s is NULL: %s", #t, kiln_last_error());                                   \
      break;                                                                                 \
    }                                                                                        \
    if (kiln_numel(cv_) != (n)) {                                                            \
      KTEST_FAIL("%s has %lld elements, expected %lld", #t, (long long)kiln_numel(cv_),      \
                 (long long)(n));                                                            \
      break;                                                                                 \
    }                                                                                        \
    double *vv_ = ktest_values(cv_);                                                         \
    const double *ee_ = (expect);                                                            \
    for (int64_t i_ = 0; i_ < (n); i_++)                                                     \
      if (!(fabs(vv_[i_] - ee_[i_]) <= (rtol)*fabs(ee_[i_]) + (atol))) {                     \
        KTEST_FAIL("%s[%lld] = %.17g, expected %.17g", #t, (long long)i_, vv_[i_], ee_[i_]); \
        break;                                                                               \
      }                                                                                      \
    free(vv_);                                                                               \
  } while (0)

/* the leaf's accumulated gradient against expect; releases the reference */
#define CHECK_GRAD(x, n, expect, tol)                                               \
  do {                                                                              \
    kiln_tensor *cg_ = kiln_grad(x);                                                \
    if (!cg_) {                                                                     \
      KTEST_FAIL("kiln_grad(%s) is NULL: %s", #x, kiln_last_error());               \
      break;                                                                        \
    }                                                                               \
    if (!same_shape(cg_, (x))) KTEST_FAIL("kiln_grad(%s) has the wrong shape", #x); \
    CHECK_EQ_INT(kiln_dtype_of(cg_), kiln_dtype_of(x));                             \
    CHECK_VALUES(cg_, n, expect, tol, tol);                                         \
    kiln_release(cg_);                                                              \
  } while (0)

/* ======================================================================== */
/* 1. the gradient checker                                                  */
/* ======================================================================== */

typedef struct {
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  double lo, hi, away; /* random values in [lo, hi] with |v| >= away */
  const double *data;  /* explicit values instead */
  bool constant;       /* an input that is not differentiated (no requires_grad) */
} gin;

static gin R(int nd, const int64_t *s, double lo, double hi) {
  gin g;
  memset(&g, 0, sizeof g);
  g.ndim = nd;
  for (int i = 0; i < nd; i++) g.shape[i] = s[i];
  g.lo = lo;
  g.hi = hi;
  return g;
}
static gin RA(int nd, const int64_t *s, double lo, double hi, double away) {
  gin g = R(nd, s, lo, hi);
  g.away = away;
  return g;
}
static gin DAT(int nd, const int64_t *s, const double *data) {
  gin g = R(nd, s, 0, 0);
  g.data = data;
  return g;
}
static gin CONSTANT(gin g) {
  g.constant = true;
  return g;
}

/* builds the output from the inputs; every tensor it creates goes through T(),
   and the result it returns is borrowed (owned by the pool) */
typedef kiln_tensor *(*gfn)(kiln_tensor *const *x, const void *ctx);

enum {
  GC_FD_WITH_GRAD = 1
}; /* evaluate the finite differences outside no_grad,
      on leaves that require grad (builders that call
      kiln_grad_of themselves) */
#define GC_MAX_IN 6
#define FD_H 1e-6
#define FD_RTOL 1e-6
#define FD_ATOL 1e-8
#define MAX_REPORTS 4

static int g_case;      /* counts gradchecks: the weight seed */
static int g_gc_checks; /* gradient elements compared with finite differences */

static kiln_tensor *make_input(const gin *g, const double *v, bool rg) {
  kiln_tensor *t = kiln_from_data(v, F64, g->ndim, g->shape);
  if (!t) return NULL;
  if (rg && !g->constant && kiln_set_requires_grad(t, true) != 0)
    KTEST_FAIL("kiln_set_requires_grad failed: %s", kiln_last_error());
  return t;
}

/* loss = sum(out * W), pool-owned */
static kiln_tensor *weighted_loss(kiln_tensor *out, uint64_t wseed) {
  kiln_tensor *w = T(fixed_tensor(kiln_ndim(out), kiln_shape(out), wseed, -1.5, 1.5));
  return T(sum_all(T(kiln_mul(out, w))));
}

/* the loss at the given input values; *mag (if given) = sum |out * W| */
static double eval_loss(gfn f, const void *ctx, int nin, const gin *spec, double *const *vals,
                        uint64_t wseed, unsigned flags, double *mag) {
  bool ng = !(flags & GC_FD_WITH_GRAD);
  if (ng) kiln_no_grad_push();
  int mark = g_npool;
  kiln_tensor *x[GC_MAX_IN];
  for (int i = 0; i < nin; i++) x[i] = T(make_input(&spec[i], vals[i], !ng));
  kiln_tensor *out = f(x, ctx);
  double r = NAN;
  if (out) {
    kiln_tensor *loss = weighted_loss(out, wseed);
    r = kiln_item(loss);
    if (mag) {
      int64_t n = kiln_numel(out);
      double *o = ktest_values(out), *w = malloc((size_t)(n ? n : 1) * sizeof(double));
      fixed_values(w, n, wseed, -1.5, 1.5);
      *mag = 0;
      for (int64_t k = 0; k < n; k++) *mag += fabs(o[k] * w[k]);
      free(o);
      free(w);
    }
  }
  pool_release_to(mark);
  if (ng) kiln_no_grad_pop();
  return r;
}

static void gradcheck(int line, const char *what, gfn f, const void *ctx, int nin, const gin *spec,
                      unsigned flags) {
  uint64_t wseed = 1000u + (uint64_t)g_case++;
  double *vals[GC_MAX_IN] = {0};
  double *ga[GC_MAX_IN] = {0}, *gb[GC_MAX_IN] = {0};
  int64_t n[GC_MAX_IN];
  int diff[GC_MAX_IN], nd = 0;
  kiln_tensor *x[GC_MAX_IN] = {0};
  int mark = g_npool;

  for (int i = 0; i < nin; i++) {
    n[i] = numel_of(spec[i].ndim, spec[i].shape);
    vals[i] = malloc((size_t)(n[i] ? n[i] : 1) * sizeof(double));
    for (int64_t k = 0; k < n[i]; k++) {
      if (spec[i].data) {
        vals[i][k] = spec[i].data[k];
        continue;
      }
      double v;
      do v = spec[i].lo + (spec[i].hi - spec[i].lo) * unif(&g_rng);
      while (fabs(v) < spec[i].away);
      vals[i][k] = v;
    }
    if (!spec[i].constant) diff[nd++] = i;
  }

  /* (a) kiln_grad_of */
  for (int i = 0; i < nin; i++) x[i] = make_input(&spec[i], vals[i], true);
  kiln_tensor *out = f(x, ctx);
  if (!out) {
    KTEST_FAIL("line %d (%s): the builder failed: %s", line, what, kiln_last_error());
    goto done;
  }
  if (kiln_dtype_of(out) != F64) KTEST_FAIL("line %d (%s): output is not f64", line, what);
  kiln_tensor *loss = weighted_loss(out, wseed);
  if (!kiln_requires_grad(loss))
    KTEST_FAIL("line %d (%s): the loss does not require grad", line, what);
  kiln_tensor *dx[GC_MAX_IN], *g[GC_MAX_IN] = {0};
  for (int k = 0; k < nd; k++) dx[k] = x[diff[k]];
  int rc = kiln_grad_of(1, &loss, NULL, nd, dx, g, false);
  if (rc != 0) {
    KTEST_FAIL("line %d (%s): kiln_grad_of -> %d: %s", line, what, rc, kiln_last_error());
    for (int k = 0; k < nd; k++) kiln_release(g[k]);
    goto done;
  }
  for (int k = 0; k < nd; k++) {
    if (!g[k]) {
      KTEST_FAIL("line %d (%s): kiln_grad_of gave NULL for input %d", line, what, diff[k]);
      goto done;
    }
    if (!same_shape(g[k], dx[k]) || kiln_dtype_of(g[k]) != F64)
      KTEST_FAIL("line %d (%s): gradient %d has the wrong shape or dtype", line, what, diff[k]);
    ga[k] = ktest_values(g[k]);
    kiln_release(g[k]);
    kiln_tensor *acc = kiln_grad(dx[k]);
    if (acc) {
      KTEST_FAIL("line %d (%s): kiln_grad_of touched .grad", line, what);
      kiln_release(acc);
    }
  }
  pool_release_to(mark);
  for (int i = 0; i < nin; i++) kiln_release(x[i]), x[i] = NULL;

  /* (b) kiln_backward on fresh leaves; the intermediates are released first */
  for (int i = 0; i < nin; i++) x[i] = make_input(&spec[i], vals[i], true);
  out = f(x, ctx);
  if (!out) {
    KTEST_FAIL("line %d (%s): the builder failed: %s", line, what, kiln_last_error());
    goto done;
  }
  loss = kiln_retain(weighted_loss(out, wseed));
  pool_release_to(mark);
  rc = kiln_backward(loss, NULL);
  kiln_release(loss);
  if (rc != 0) {
    KTEST_FAIL("line %d (%s): kiln_backward -> %d: %s", line, what, rc, kiln_last_error());
    goto done;
  }
  for (int k = 0; k < nd; k++) {
    kiln_tensor *gr = kiln_grad(x[diff[k]]);
    if (!gr) {
      KTEST_FAIL("line %d (%s): no .grad on input %d after backward: %s", line, what, diff[k],
                 kiln_last_error());
      goto done;
    }
    if (!same_shape(gr, x[diff[k]]) || kiln_dtype_of(gr) != F64)
      KTEST_FAIL("line %d (%s): .grad %d has the wrong shape or dtype", line, what, diff[k]);
    gb[k] = ktest_values(gr);
    kiln_release(gr);
  }
  for (int i = 0; i < nin; i++) kiln_release(x[i]), x[i] = NULL;

  /* (c) central differences */
  double mag = 0;
  double l0 = eval_loss(f, ctx, nin, spec, vals, wseed, flags, &mag);
  if (isnan(l0)) {
    KTEST_FAIL("line %d (%s): evaluating the loss failed: %s", line, what, kiln_last_error());
    goto done;
  }
  double atol = FD_ATOL * fmax(1.0, mag);
  for (int k = 0; k < nd; k++) {
    int i = diff[k], reports = 0;
    for (int64_t e = 0; e < n[i]; e++) {
      double orig = vals[i][e];
      vals[i][e] = orig + FD_H;
      double lp = eval_loss(f, ctx, nin, spec, vals, wseed, flags, NULL);
      vals[i][e] = orig - FD_H;
      double lm = eval_loss(f, ctx, nin, spec, vals, wseed, flags, NULL);
      vals[i][e] = orig;
      double fd = (lp - lm) / (2 * FD_H), tol = FD_RTOL * fabs(fd) + atol;
      g_gc_checks++;
      bool oka = fabs(ga[k][e] - fd) <= tol, okb = fabs(gb[k][e] - fd) <= tol;
      bool okab = fabs(ga[k][e] - gb[k][e]) <= 1e-9 * fabs(ga[k][e]) + 1e-12 * fmax(1.0, mag);
      if ((!oka || !okb || !okab) && reports++ < MAX_REPORTS)
        KTEST_FAIL(
            "line %d (%s): d/dx%d[%lld]: grad_of %.12g, backward %.12g, "
            "finite difference %.12g (x = %.6g)",
            line, what, i, (long long)e, ga[k][e], gb[k][e], fd, orig);
    }
  }

done:
  pool_release_to(mark);
  for (int i = 0; i < nin; i++) {
    kiln_release(x[i]);
    free(vals[i]);
  }
  for (int k = 0; k < GC_MAX_IN; k++) {
    free(ga[k]);
    free(gb[k]);
  }
}

#define GC(what, f, ctx, ...)                                                          \
  gradcheck(__LINE__, what, f, ctx, (int)(sizeof((gin[]){__VA_ARGS__}) / sizeof(gin)), \
            (const gin[]){__VA_ARGS__}, 0)
#define GC_FLAGS(flags, what, f, ctx, ...)                                             \
  gradcheck(__LINE__, what, f, ctx, (int)(sizeof((gin[]){__VA_ARGS__}) / sizeof(gin)), \
            (const gin[]){__VA_ARGS__}, flags)

/* the checker itself: a function whose gradient is known (sanity) */
static kiln_tensor *f_cube(kiln_tensor *const *x, const void *ctx) {
  (void)ctx;
  return T(kiln_mul(x[0], T(kiln_mul(x[0], x[0]))));
}

TEST(gradcheck_sanity_cube) {
  GC("x^3", f_cube, NULL, R(1, S(5), -2, 2));
  GC("x^3 0-d", f_cube, NULL, R(0, NULL, -2, 2));
}

/* ======================================================================== */
/* 2. every differentiable op                                               */
/* ======================================================================== */

/* non-contiguous inputs: how the leaf is viewed before feeding the op */
static kiln_tensor *view_in(kiln_tensor *x, int view) {
  switch (view) {
    case 1:
      return T(kiln_transpose(x, 0, 1)); /* leaf [4,3] -> [3,4] */
    case 2:
      return T(kiln_slice(x, 1, 0, 8, 2)); /* leaf [3,8] -> [3,4], step 2 */
    case 3:
      return T(kiln_slice(x, 0, 2, -100, -1)); /* leaf [3,4], rows reversed */
    default:
      return x; /* leaf [3,4] or 0-d */
  }
}
static const int64_t VIEW_LEAF[4][2] = {{3, 4}, {4, 3}, {3, 8}, {3, 4}};

/* ---- elementwise unary ---- */

typedef kiln_tensor *(*unop)(kiln_tensor *);
static const struct {
  const char *name;
  unop op;
  double lo, hi, away;
} UNARY[] = {
    {"neg", kiln_neg, -2, 2, 0},     {"abs", kiln_abs, -2, 2, 0.1},
    {"exp", kiln_exp, -2, 2, 0},     {"log", kiln_log, 0.2, 3, 0},
    {"sqrt", kiln_sqrt, 0.2, 3, 0},  {"rsqrt", kiln_rsqrt, 0.2, 3, 0},
    {"sin", kiln_sin, -3, 3, 0},     {"cos", kiln_cos, -3, 3, 0},
    {"tanh", kiln_tanh, -2, 2, 0},   {"sigmoid", kiln_sigmoid, -3, 3, 0},
    {"relu", kiln_relu, -2, 2, 0.1}, {"gelu", kiln_gelu, -3, 3, 0},
    {"erf", kiln_erf, -2, 2, 0},     {"log1p", kiln_log1p, -0.5, 2, 0},
    {"expm1", kiln_expm1, -2, 2, 0},
};
#define NUNARY ((int)(sizeof UNARY / sizeof UNARY[0]))

typedef struct {
  unop op;
  int view;
} un_ctx;

static kiln_tensor *f_unary(kiln_tensor *const *x, const void *c) {
  const un_ctx *u = c;
  return T(u->op(view_in(x[0], u->view)));
}

TEST(grad_unary) {
  char what[96];
  for (int o = 0; o < NUNARY; o++) {
    for (int v = 0; v < 4; v++) {
      un_ctx c = {UNARY[o].op, v};
      snprintf(what, sizeof what, "%s, view %d", UNARY[o].name, v);
      GC(what, f_unary, &c, RA(2, VIEW_LEAF[v], UNARY[o].lo, UNARY[o].hi, UNARY[o].away));
    }
    un_ctx c = {UNARY[o].op, 0};
    snprintf(what, sizeof what, "%s, 0-d", UNARY[o].name);
    GC(what, f_unary, &c, RA(0, NULL, UNARY[o].lo, UNARY[o].hi, UNARY[o].away));
  }
}

/* ---- tensor op host scalar, clamp ---- */

enum { SC_ADD, SC_SUB, SC_MUL, SC_DIV, SC_POW, SC_CLAMP };
typedef struct {
  int op;
  double s, s2;
  int view;
} sc_ctx;

static kiln_tensor *f_scalar(kiln_tensor *const *x, const void *c) {
  const sc_ctx *k = c;
  kiln_tensor *a = view_in(x[0], k->view);
  switch (k->op) {
    case SC_ADD:
      return T(kiln_add_scalar(a, k->s));
    case SC_SUB:
      return T(kiln_sub_scalar(a, k->s));
    case SC_MUL:
      return T(kiln_mul_scalar(a, k->s));
    case SC_DIV:
      return T(kiln_div_scalar(a, k->s));
    case SC_POW:
      return T(kiln_pow_scalar(a, k->s));
    default:
      return T(kiln_clamp(a, k->s, k->s2));
  }
}

TEST(grad_scalar_ops) {
  static const struct {
    const char *name;
    sc_ctx c;
    double lo, hi, away;
  } cases[] = {
      {"add_scalar 1.5", {SC_ADD, 1.5, 0, 0}, -2, 2, 0},
      {"sub_scalar 0.5", {SC_SUB, 0.5, 0, 1}, -2, 2, 0},
      {"mul_scalar -2.5", {SC_MUL, -2.5, 0, 2}, -2, 2, 0},
      {"div_scalar 3", {SC_DIV, 3, 0, 0}, -2, 2, 0},
      {"div_scalar -0.7", {SC_DIV, -0.7, 0, 3}, -2, 2, 0},
      {"pow_scalar 2.5", {SC_POW, 2.5, 0, 0}, 0.3, 2, 0},
      {"pow_scalar -1.5", {SC_POW, -1.5, 0, 1}, 0.3, 2, 0},
      {"pow_scalar 0.5", {SC_POW, 0.5, 0, 0}, 0.3, 2, 0},
      {"pow_scalar 3, negative base", {SC_POW, 3, 0, 0}, -2, 2, 0.1},
      {"pow_scalar 2, negative base", {SC_POW, 2, 0, 2}, -2, 2, 0.1},
      {"pow_scalar 1", {SC_POW, 1, 0, 0}, -2, 2, 0.1},
      {"pow_scalar 0", {SC_POW, 0, 0, 0}, 0.3, 2, 0},
      {"clamp, nothing clipped", {SC_CLAMP, -10, 10, 1}, -2, 2, 0},
  };
  char what[96];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(what, sizeof what, "%s, view %d", cases[i].name, cases[i].c.view);
    GC(what, f_scalar, &cases[i].c,
       RA(2, VIEW_LEAF[cases[i].c.view], cases[i].lo, cases[i].hi, cases[i].away));
  }
  /* clamp to [-0.5, 0.5]: values inside and outside, away from the bounds */
  static const double cv[12] = {-1.2, -0.7, -0.3, 0.1, 0.4, 0.8, 1.3, -0.45, 0.2, 0.6, -0.9, 0.05};
  for (int v = 0; v < 4; v += 3) {
    sc_ctx c = {SC_CLAMP, -0.5, 0.5, v};
    GC("clamp [-0.5, 0.5]", f_scalar, &c, DAT(2, S(3, 4), cv));
  }
  sc_ctx c1 = {SC_CLAMP, -0.5, 0.5, 1};
  GC("clamp [-0.5, 0.5], transposed", f_scalar, &c1, DAT(2, S(4, 3), cv));
}

/* ---- elementwise binary with broadcasting ---- */

typedef kiln_tensor *(*binop)(kiln_tensor *, kiln_tensor *);
static const struct {
  const char *name;
  binop op;
  double alo, ahi, aaway, blo, bhi, baway;
} BINARY[] = {
    {"add", kiln_add, -2, 2, 0, -2, 2, 0},         {"sub", kiln_sub, -2, 2, 0, -2, 2, 0},
    {"mul", kiln_mul, -2, 2, 0, -2, 2, 0},         {"div", kiln_div, -2, 2, 0, -2, 2, 0.5},
    {"pow", kiln_pow, 0.5, 2, 0, -2, 2, 0},        {"maximum", kiln_maximum, -2, 2, 0, -2, 2, 0},
    {"minimum", kiln_minimum, -2, 2, 0, -2, 2, 0},
};
#define NBINARY ((int)(sizeof BINARY / sizeof BINARY[0]))

/* mode 1: a is transposed (leaf [4,3] -> [3,4]); mode 2: b expanded to a's shape */
static const struct {
  int na;
  int64_t sa[3];
  int nb;
  int64_t sb[3];
  int mode;
} BSHAPES[] = {
    {2, {2, 3}, 2, {2, 3}, 0},    {2, {3, 1}, 2, {1, 4}, 0}, {3, {2, 3, 4}, 1, {4}, 0},
    {1, {4}, 3, {2, 3, 4}, 0},    {2, {2, 3}, 0, {0}, 0},    {0, {0}, 2, {2, 3}, 0},
    {3, {2, 1, 4}, 2, {3, 1}, 0}, {2, {4, 3}, 1, {4}, 1},    {2, {3, 4}, 2, {3, 1}, 2},
};
#define NBSHAPES ((int)(sizeof BSHAPES / sizeof BSHAPES[0]))

typedef struct {
  binop op;
  int mode;
} bin_ctx;

static kiln_tensor *f_binary(kiln_tensor *const *x, const void *c) {
  const bin_ctx *b = c;
  kiln_tensor *a = x[0], *bb = x[1];
  if (b->mode == 1) a = T(kiln_transpose(a, 0, 1));
  if (b->mode == 2) bb = T(kiln_expand(bb, kiln_ndim(a), kiln_shape(a)));
  return T(b->op(a, bb));
}

TEST(grad_binary_broadcast) {
  char what[128];
  for (int o = 0; o < NBINARY; o++)
    for (int s = 0; s < NBSHAPES; s++) {
      bin_ctx c = {BINARY[o].op, BSHAPES[s].mode};
      snprintf(what, sizeof what, "%s, shapes #%d", BINARY[o].name, s);
      GC(what, f_binary, &c,
         RA(BSHAPES[s].na, BSHAPES[s].sa, BINARY[o].alo, BINARY[o].ahi, BINARY[o].aaway),
         RA(BSHAPES[s].nb, BSHAPES[s].sb, BINARY[o].blo, BINARY[o].bhi, BINARY[o].baway));
    }
}

/* one input used along several paths: contributions add up */
static kiln_tensor *f_shared(kiln_tensor *const *x, const void *c) {
  (void)c;
  kiln_tensor *a = x[0];
  kiln_tensor *t = T(kiln_add(T(kiln_mul(a, T(kiln_sin(a)))), a));
  return T(kiln_add(t, T(kiln_div(a, T(kiln_add_scalar(T(kiln_mul(a, a)), 1.0))))));
}
static kiln_tensor *f_self_ops(kiln_tensor *const *x, const void *c) {
  (void)c;
  kiln_tensor *a = x[0];
  /* a*a + a/a + (a - a) + pow(a, a) + maximum(a, a*0.5+3) */
  kiln_tensor *t = T(kiln_add(T(kiln_mul(a, a)), T(kiln_div(a, a))));
  t = T(kiln_add(t, T(kiln_sub(a, a))));
  t = T(kiln_add(t, T(kiln_pow(a, a))));
  return T(kiln_add(t, T(kiln_maximum(a, T(kiln_add_scalar(T(kiln_mul_scalar(a, 0.5)), 3.0))))));
}

TEST(grad_input_used_twice) {
  GC("x sin x + x + x/(x^2+1)", f_shared, NULL, R(2, S(2, 3), -2, 2));
  GC("self binary ops", f_self_ops, NULL, R(2, S(2, 3), 0.5, 2));
}

/* ---- where ---- */

typedef struct {
  kiln_tensor *cond;
  int mode; /* 1: a transposed */
} where_ctx;

static kiln_tensor *f_where(kiln_tensor *const *x, const void *c) {
  const where_ctx *w = c;
  kiln_tensor *a = w->mode == 1 ? T(kiln_transpose(x[0], 0, 1)) : x[0];
  return T(kiln_where(w->cond, a, x[1]));
}

TEST(grad_where) {
  static const unsigned char c23[6] = {1, 0, 0, 1, 1, 0}, c21[2] = {0, 1};
  where_ctx w = {tbool(2, S(2, 3), c23), 0};
  GC("where [2,3] [2,3] [2,3]", f_where, &w, R(2, S(2, 3), -2, 2), R(2, S(2, 3), -2, 2));
  GC("where [2,3] [2,3] [3]", f_where, &w, R(2, S(2, 3), -2, 2), R(1, S(3), -2, 2));
  GC("where [2,3] 0-d [2,3]", f_where, &w, R(0, NULL, -2, 2), R(2, S(2, 3), -2, 2));
  w.mode = 1;
  GC("where [2,3] [3,2]^T [1,3]", f_where, &w, R(2, S(3, 2), -2, 2), R(2, S(1, 3), -2, 2));
  kiln_release(w.cond);
  where_ctx w2 = {tbool(2, S(2, 1), c21), 0};
  GC("where [2,1] [1,3] 0-d", f_where, &w2, R(2, S(1, 3), -2, 2), R(0, NULL, -2, 2));
  GC("where [2,1] [2,3] [2,3]", f_where, &w2, R(2, S(2, 3), -2, 2), R(2, S(2, 3), -2, 2));
  kiln_release(w2.cond);
}

/* ---- reductions ---- */

typedef kiln_tensor *(*redop)(kiln_tensor *, int, const int *, bool);
static const struct {
  const char *name;
  redop op;
  double lo, hi, away;
} REDUCE[] = {
    {"sum", kiln_sum, -2, 2, 0},      {"mean", kiln_mean, -2, 2, 0},
    {"max", kiln_max, -2, 2, 0},      {"min", kiln_min, -2, 2, 0},
    {"prod", kiln_prod, 0.5, 1.5, 0}, {"prod (negatives)", kiln_prod, -1.5, 1.5, 0.5},
};
#define NREDUCE ((int)(sizeof REDUCE / sizeof REDUCE[0]))

typedef struct {
  redop op;
  int naxes;
  int axes[3];
  bool keep;
  int view; /* 1: leaf [4,2,3] permuted to [2,3,4] */
} red_ctx;

static kiln_tensor *f_reduce(kiln_tensor *const *x, const void *c) {
  const red_ctx *r = c;
  kiln_tensor *a = x[0];
  if (r->view == 1) a = T(kiln_permute(a, (const int[]){1, 2, 0}));
  return T(r->op(a, r->naxes, r->axes, r->keep));
}

TEST(grad_reductions) {
  static const struct {
    int naxes;
    int axes[3];
  } AXES[] = {{0, {0}}, {1, {0}}, {1, {-1}}, {1, {1}}, {2, {0, 2}}, {3, {2, 0, 1}}};
  char what[128];
  for (int o = 0; o < NREDUCE; o++)
    for (int a = 0; a < 6; a++)
      for (int v = 0; v < 2; v++) {
        red_ctx c = {REDUCE[o].op,
                     AXES[a].naxes,
                     {AXES[a].axes[0], AXES[a].axes[1], AXES[a].axes[2]},
                     (a + v) % 2 == 1,
                     v};
        snprintf(what, sizeof what, "%s, axes #%d keepdim %d view %d", REDUCE[o].name, a, c.keep,
                 v);
        GC(what, f_reduce, &c,
           RA(3, v ? S(4, 2, 3) : S(2, 3, 4), REDUCE[o].lo, REDUCE[o].hi, REDUCE[o].away));
      }
  for (int o = 0; o < NREDUCE; o++) {
    red_ctx c1 = {REDUCE[o].op, 0, {0}, false, 0}, c2 = {REDUCE[o].op, 1, {0}, true, 0};
    snprintf(what, sizeof what, "%s of a 1-d tensor", REDUCE[o].name);
    GC(what, f_reduce, &c1, RA(1, S(5), REDUCE[o].lo, REDUCE[o].hi, REDUCE[o].away));
    GC(what, f_reduce, &c2, RA(1, S(5), REDUCE[o].lo, REDUCE[o].hi, REDUCE[o].away));
    snprintf(what, sizeof what, "%s of a 0-d tensor", REDUCE[o].name);
    GC(what, f_reduce, &c1, RA(0, NULL, REDUCE[o].lo, REDUCE[o].hi, REDUCE[o].away));
  }
}

/* prod is differentiable at 0 too: d/dx_i = product of the others */
TEST(grad_prod_with_zeros) {
  red_ctx all = {kiln_prod, 0, {0}, false, 0}, rows = {kiln_prod, 1, {1}, false, 0};
  GC("prod, one zero", f_reduce, &all, DAT(1, S(4), D(1.5, 0.0, -0.7, 1.2)));
  GC("prod, two zeros", f_reduce, &all, DAT(1, S(4), D(0.0, 1.3, 0.0, 0.8)));
  GC("prod rows, zeros in some", f_reduce, &rows,
     DAT(2, S(3, 3), D(0.0, 1.1, 0.9, 1.2, -0.8, 1.3, 0.7, 0.0, 0.0)));
}

/* ---- matmul ---- */

typedef struct {
  int ta, tb; /* transpose the leaf's last two dims before the matmul */
} mm_ctx;

static kiln_tensor *f_matmul(kiln_tensor *const *x, const void *c) {
  const mm_ctx *m = c;
  kiln_tensor *a = m->ta ? T(kiln_transpose(x[0], -2, -1)) : x[0];
  kiln_tensor *b = m->tb ? T(kiln_transpose(x[1], -2, -1)) : x[1];
  return T(kiln_matmul(a, b));
}

TEST(grad_matmul) {
  static const struct {
    int na;
    int64_t sa[4];
    int nb;
    int64_t sb[4];
    mm_ctx c;
    const char *name;
  } cases[] = {
      {2, {3, 4}, 2, {4, 5}, {0, 0}, "[3,4]@[4,5]"},
      {3, {2, 3, 4}, 3, {2, 4, 5}, {0, 0}, "batched [2,3,4]@[2,4,5]"},
      {4, {2, 1, 3, 4}, 3, {3, 4, 2}, {0, 0}, "broadcast batch [2,1,3,4]@[3,4,2]"},
      {3, {1, 3, 4}, 3, {2, 4, 2}, {0, 0}, "broadcast batch [1,3,4]@[2,4,2]"},
      {3, {2, 3, 4}, 2, {4, 2}, {0, 0}, "[2,3,4]@[4,2]"},
      {1, {4}, 2, {4, 5}, {0, 0}, "[4]@[4,5]"},
      {2, {3, 4}, 1, {4}, {0, 0}, "[3,4]@[4]"},
      {1, {4}, 1, {4}, {0, 0}, "[4]@[4]"},
      {3, {2, 3, 4}, 1, {4}, {0, 0}, "[2,3,4]@[4]"},
      {1, {4}, 3, {2, 4, 3}, {0, 0}, "[4]@[2,4,3]"},
      {2, {4, 3}, 2, {4, 5}, {1, 0}, "[4,3]^T@[4,5]"},
      {2, {3, 4}, 2, {5, 4}, {0, 1}, "[3,4]@[5,4]^T"},
      {3, {2, 4, 3}, 3, {2, 5, 4}, {1, 1}, "[2,4,3]^T@[2,5,4]^T"},
      {2, {4, 3}, 1, {4}, {1, 0}, "[4,3]^T@[4]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    GC(cases[i].name, f_matmul, &cases[i].c, R(cases[i].na, cases[i].sa, -1.5, 1.5),
       R(cases[i].nb, cases[i].sb, -1.5, 1.5));
}

/* ---- view ops ---- */

enum {
  V_RESHAPE,
  V_RESHAPE_NEG,
  V_RESHAPE_NC,
  V_PERMUTE,
  V_TRANSPOSE,
  V_EXPAND,
  V_EXPAND_1D,
  V_EXPAND_ROW,
  V_EXPAND_0D,
  V_SLICE,
  V_SLICE_STEP2,
  V_SLICE_REV,
  V_SLICE_REV2,
  V_SLICE_CLAMP,
  V_SLICE_NEGSTART,
  V_SLICE_SLICE,
  V_SQUEEZE,
  V_SQUEEZE_NEG,
  V_UNSQUEEZE0,
  V_UNSQUEEZE_END,
  V_CHAIN,
  V_CHAIN_SIN,
  V_PERMUTE_SIN
};

static kiln_tensor *f_view(kiln_tensor *const *x, const void *c) {
  int v = *(const int *)c;
  kiln_tensor *a = x[0];
  switch (v) {
    case V_RESHAPE:
      return T(kiln_reshape(a, 2, S(4, 6)));
    case V_RESHAPE_NEG:
      return T(kiln_reshape(a, 2, S(-1, 4)));
    case V_RESHAPE_NC:
      return T(kiln_reshape(T(kiln_transpose(a, 0, 1)), 1, S(12)));
    case V_PERMUTE:
      return T(kiln_permute(a, (const int[]){2, 0, 1}));
    case V_TRANSPOSE:
      return T(kiln_transpose(a, 0, 2));
    case V_EXPAND:
      return T(kiln_expand(a, 3, S(2, 3, 4)));
    case V_EXPAND_1D:
      return T(kiln_expand(a, 2, S(3, 4)));
    case V_EXPAND_ROW:
      return T(kiln_expand(a, 2, S(5, 3)));
    case V_EXPAND_0D:
      return T(kiln_expand(a, 2, S(2, 3)));
    case V_SLICE:
      return T(kiln_slice(a, 0, 1, 4, 1));
    case V_SLICE_STEP2:
      return T(kiln_slice(a, 1, 0, 7, 2));
    case V_SLICE_REV:
      return T(kiln_slice(a, 0, 4, -100, -1));
    case V_SLICE_REV2:
      return T(kiln_slice(a, 0, 5, -100, -2));
    case V_SLICE_CLAMP:
      return T(kiln_slice(a, 0, -100, 100, 1));
    case V_SLICE_NEGSTART:
      return T(kiln_slice(a, -1, -3, 100, 1));
    case V_SLICE_SLICE:
      return T(kiln_slice(T(kiln_slice(a, 0, 1, 6, 2)), 1, 4, -100, -2));
    case V_SQUEEZE:
      return T(kiln_squeeze(a, 1));
    case V_SQUEEZE_NEG:
      return T(kiln_squeeze(a, -2));
    case V_UNSQUEEZE0:
      return T(kiln_unsqueeze(a, 0));
    case V_UNSQUEEZE_END:
      return T(kiln_unsqueeze(a, -1));
    case V_CHAIN: {
      kiln_tensor *t = T(kiln_slice(T(kiln_transpose(a, 0, 1)), 0, 0, 6, 2)); /* [3,4] */
      t = T(kiln_unsqueeze(T(kiln_reshape(t, 1, S(12))), 0));                 /* [1,12] */
      return T(kiln_expand(t, 2, S(2, 12)));
    }
    case V_CHAIN_SIN:
      return T(kiln_sin(T(kiln_slice(T(kiln_transpose(a, 0, 1)), 0, 5, -100, -2))));
    default:
      return T(kiln_exp(T(kiln_permute(a, (const int[]){1, 2, 0}))));
  }
}

TEST(grad_views) {
  static const struct {
    const char *name;
    int v, nd;
    int64_t s[3];
  } cases[] = {
      {"reshape [2,3,4]->[4,6]", V_RESHAPE, 3, {2, 3, 4}},
      {"reshape [2,3,4]->[-1,4]", V_RESHAPE_NEG, 3, {2, 3, 4}},
      {"reshape of a transpose", V_RESHAPE_NC, 2, {3, 4}},
      {"permute {2,0,1}", V_PERMUTE, 3, {2, 3, 4}},
      {"transpose 0,2", V_TRANSPOSE, 3, {2, 3, 4}},
      {"expand [3,1]->[2,3,4]", V_EXPAND, 2, {3, 1}},
      {"expand [4]->[3,4]", V_EXPAND_1D, 1, {4}},
      {"expand [1,3]->[5,3]", V_EXPAND_ROW, 2, {1, 3}},
      {"expand 0-d->[2,3]", V_EXPAND_0D, 0, {0}},
      {"slice 1:4", V_SLICE, 2, {5, 4}},
      {"slice ::2", V_SLICE_STEP2, 2, {3, 7}},
      {"slice 4::-1", V_SLICE_REV, 2, {5, 3}},
      {"slice 5::-2", V_SLICE_REV2, 2, {6, 3}},
      {"slice clamped", V_SLICE_CLAMP, 2, {4, 3}},
      {"slice -3:", V_SLICE_NEGSTART, 2, {2, 5}},
      {"slice of slice", V_SLICE_SLICE, 2, {6, 5}},
      {"squeeze 1", V_SQUEEZE, 3, {3, 1, 4}},
      {"squeeze -2", V_SQUEEZE_NEG, 3, {3, 1, 4}},
      {"unsqueeze 0", V_UNSQUEEZE0, 2, {3, 4}},
      {"unsqueeze -1", V_UNSQUEEZE_END, 2, {3, 4}},
      {"transpose/slice/reshape/unsqueeze/expand", V_CHAIN, 2, {4, 6}},
      {"sin of a reversed strided transpose", V_CHAIN_SIN, 2, {3, 6}},
      {"exp of a permute", V_PERMUTE_SIN, 3, {2, 3, 4}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    GC(cases[i].name, f_view, &cases[i].v, R(cases[i].nd, cases[i].s, -1.5, 1.5));
}

/* ---- concat / stack ---- */

static kiln_tensor *f_join(kiln_tensor *const *x, const void *c) {
  int v = *(const int *)c;
  switch (v) {
    case 0:
      return T(kiln_concat(3, x, 1));
    case 1:
      return T(kiln_concat(2, x, 0));
    case 2: {
      kiln_tensor *ts[2] = {T(kiln_transpose(x[0], 0, 1)), x[1]};
      return T(kiln_concat(2, ts, -1));
    }
    case 3: {
      kiln_tensor *ts[3] = {x[0], x[0], T(kiln_mul(x[0], x[0]))};
      return T(kiln_concat(3, ts, 0));
    }
    case 4:
      return T(kiln_stack(3, x, 0));
    case 5:
      return T(kiln_stack(3, x, -1));
    case 6: {
      kiln_tensor *ts[2] = {x[0], T(kiln_transpose(x[1], 0, 1))};
      return T(kiln_stack(2, ts, 1));
    }
    default: {
      kiln_tensor *ts[2] = {x[0], x[0]};
      return T(kiln_stack(2, ts, 0));
    }
  }
}

TEST(grad_concat_stack) {
  static const int c[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  GC("concat [2,3] [2,1] [2,2] axis 1", f_join, &c[0], R(2, S(2, 3), -1, 1), R(2, S(2, 1), -1, 1),
     R(2, S(2, 2), -1, 1));
  GC("concat [1,3] [2,3] axis 0", f_join, &c[1], R(2, S(1, 3), -1, 1), R(2, S(2, 3), -1, 1));
  GC("concat [3,2]^T [2,2] axis -1", f_join, &c[2], R(2, S(3, 2), -1, 1), R(2, S(2, 2), -1, 1));
  GC("concat x, x, x*x", f_join, &c[3], R(2, S(2, 3), -1, 1));
  GC("stack 3 x [2,3] axis 0", f_join, &c[4], R(2, S(2, 3), -1, 1), R(2, S(2, 3), -1, 1),
     R(2, S(2, 3), -1, 1));
  GC("stack 3 x [2,3] axis -1", f_join, &c[5], R(2, S(2, 3), -1, 1), R(2, S(2, 3), -1, 1),
     R(2, S(2, 3), -1, 1));
  GC("stack [2,3] [3,2]^T axis 1", f_join, &c[6], R(2, S(2, 3), -1, 1), R(2, S(3, 2), -1, 1));
  GC("stack x, x", f_join, &c[7], R(1, S(4), -1, 1));
}

/* ---- slices of one tensor: their gradients join (backward.c) ---- */

/* the sum of a's elements, owned by the pool */
static kiln_tensor *tsum(kiln_tensor *a) { return T(sum_all(a)); }

static kiln_tensor *f_slices(kiln_tensor *const *x, const void *c) {
  int v = *(const int *)c;
  switch (v) {
    case 0: { /* an RNN over the time steps of x [5,2,3] */
      kiln_tensor *h = NULL;
      for (int t = 0; t < 5; t++) {
        kiln_tensor *xt = T(kiln_squeeze(T(kiln_slice(x[0], 0, t, t + 1, 1)), 0));
        h = T(kiln_tanh(h ? T(kiln_add(T(kiln_mul(h, x[1])), xt)) : xt));
      }
      return h;
    }
    case 1: { /* gates of x [2,6] */
      kiln_tensor *a = T(kiln_slice(x[0], 1, 0, 2, 1)), *b = T(kiln_slice(x[0], 1, 2, 4, 1));
      kiln_tensor *g = T(kiln_slice(x[0], 1, 4, 6, 1));
      return T(kiln_add(T(kiln_mul(T(kiln_sigmoid(a)), T(kiln_tanh(g)))), T(kiln_mul(b, b))));
    }
    case 2: { /* a gap, an overlap, a stride, another axis and a dense use of x [4,6] */
      kiln_tensor *p1 = T(kiln_slice(x[0], 0, 0, 1, 1)), *p2 = T(kiln_slice(x[0], 0, 2, 4, 1));
      kiln_tensor *p3 = T(kiln_slice(x[0], 0, 1, 3, 1)), *p4 = T(kiln_slice(x[0], 1, 0, 6, 2));
      kiln_tensor *p5 = T(kiln_slice(x[0], 1, 3, 4, 1)), *p6 = T(kiln_slice(x[0], 0, 3, 4, 1));
      kiln_tensor *s = tsum(T(kiln_mul(p1, p1)));
      s = T(kiln_add(s, tsum(T(kiln_sin(p2)))));
      s = T(kiln_add(s, tsum(T(kiln_mul(T(kiln_mul(p3, p3)), p3)))));
      s = T(kiln_add(s, tsum(T(kiln_tanh(p4)))));
      s = T(kiln_add(s, tsum(T(kiln_exp(p5)))));
      s = T(kiln_add(s, tsum(T(kiln_mul(p6, p6)))));
      return T(kiln_add(s, tsum(T(kiln_mul(x[0], x[0])))));
    }
    case 3: { /* rows of an intermediate, stacked back reversed */
      kiln_tensor *y = T(kiln_add_scalar(T(kiln_mul_scalar(x[0], 2.0)), 1.0)), *rows[3];
      for (int r = 0; r < 3; r++) rows[2 - r] = T(kiln_tanh(T(kiln_slice(y, 0, r, r + 1, 1))));
      return T(kiln_mul(T(kiln_concat(3, rows, 0)), y));
    }
    default: { /* reversed (step -1) and forward slices of x [4] */
      kiln_tensor *r = T(kiln_slice(x[0], 0, 3, -100, -1)), *f = T(kiln_slice(x[0], 0, 0, 2, 1));
      return T(kiln_add(tsum(T(kiln_mul(r, T(kiln_exp(r))))), tsum(T(kiln_mul(f, f)))));
    }
  }
}

TEST(grad_sibling_slices) {
  static const int c[5] = {0, 1, 2, 3, 4};
  GC("RNN over slices of x [5,2,3]", f_slices, &c[0], R(3, S(5, 2, 3), -1, 1),
     R(2, S(2, 3), -1, 1));
  GC("gates: three slices of [2,6]", f_slices, &c[1], R(2, S(2, 6), -1, 1));
  GC("gap, overlap, stride, two axes, dense", f_slices, &c[2], R(2, S(4, 6), -1, 1));
  GC("rows of an intermediate", f_slices, &c[3], R(2, S(3, 4), -1, 1));
  GC("reversed and forward slices", f_slices, &c[4], R(1, S(4), -1, 1));
}

/* slicing a tensor into T parts costs a backward linear in T: the parts'
   gradients join in one concat, not T full-size scatters added up */
TEST(sliced_backward_is_linear) {
  enum { STEPS = 40 };
  int mark = g_npool;
  kiln_tensor *x = T(fixed_tensor(2, S(STEPS, 8), 7, -1, 1));
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), KILN_OK);
  kiln_tensor *loss = NULL;
  for (int t = 0; t < STEPS; t++) {
    kiln_tensor *s = tsum(T(kiln_slice(x, 0, t, t + 1, 1)));
    loss = loss ? T(kiln_add(loss, s)) : s;
  }
  double before = kiln_stat("ops_recorded");
  CHECK_EQ_INT(kiln_backward(loss, NULL), KILN_OK);
  double ops = kiln_stat("ops_recorded") - before;
  /* per part: its sum's VJP (an expand); then the join: a concat (old: an
     arange, reshape, expand, zeros, scatter_add and an add per part) */
  if (ops > 2 * STEPS + 8) KTEST_FAIL("backward recorded %.0f ops for %d slices", ops, STEPS);
  kiln_tensor *g = T(kiln_grad(x));
  double v[STEPS * 8];
  CHECK_EQ_INT(kiln_to_buffer(g, v, sizeof v), KILN_OK);
  for (int i = 0; i < STEPS * 8; i++)
    if (v[i] != 1.0) {
      KTEST_FAIL("grad[%d] = %g, expected 1", i, v[i]);
      break;
    }
  pool_release_to(mark);
}

/* ---- index_select / gather ---- */

typedef struct {
  int kind; /* 0 index_select, 1 gather */
  int axis;
  bool transpose;
  kiln_tensor *idx;
} idx_ctx;

static kiln_tensor *f_index(kiln_tensor *const *x, const void *c) {
  const idx_ctx *k = c;
  kiln_tensor *a = k->transpose ? T(kiln_transpose(x[0], 0, 1)) : x[0];
  kiln_tensor *r =
      T(k->kind ? kiln_gather(a, k->axis, k->idx) : kiln_index_select(a, k->axis, k->idx));
  return T(kiln_mul(r, T(kiln_add_scalar(r, 0.5)))); /* r*(r+0.5): not linear */
}

TEST(grad_index_select_gather) {
  idx_ctx k;
  k = (idx_ctx){0, 0, false, ti64(1, S(4), (const int64_t[]){2, 0, 2, 3})};
  GC("index_select axis 0, repeated", f_index, &k, R(2, S(4, 3), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){0, 1, false, ti64(1, S(3), (const int64_t[]){1, 1, 0})};
  GC("index_select axis 1, repeated", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){0, 0, true, ti64(1, S(3), (const int64_t[]){3, 0, 0})};
  GC("index_select of a transpose", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){0, -1, false, ti64(1, S(5), (const int64_t[]){3, 3, 3, 1, 0})};
  GC("index_select 3-d axis -1", f_index, &k, R(3, S(2, 2, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){1, 1, false, ti64(2, S(3, 2), (const int64_t[]){0, 3, 2, 2, 1, 0})};
  GC("gather axis 1, repeated", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){1, 0, false, ti64(2, S(2, 4), (const int64_t[]){2, 0, 1, 2, 0, 0, 2, 1})};
  GC("gather axis 0", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){1, 1, false, ti64(2, S(2, 3), (const int64_t[]){3, 3, 0, 1, 2, 3})};
  GC("gather axis 1, idx smaller than a", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){1, 0, true, ti64(2, S(2, 3), (const int64_t[]){1, 0, 3, 1, 1, 2})};
  GC("gather of a transpose", f_index, &k, R(2, S(3, 4), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){1, 1, false,
                ti64(3, S(2, 3, 2), (const int64_t[]){0, 2, 1, 1, 3, 0, 2, 2, 0, 1, 3, 3})};
  GC("gather 3-d axis 1", f_index, &k, R(3, S(2, 4, 2), -1, 1));
  kiln_release(k.idx);
  k = (idx_ctx){0, 0, false, kiln_from_data((const int32_t[]){1, 3, 1}, KILN_I32, 1, S(3))};
  GC("index_select with i32 indices", f_index, &k, R(2, S(4, 2), -1, 1));
  kiln_release(k.idx);
}

/* ---- composites ---- */

enum { C_SOFTMAX, C_LOG_SOFTMAX, C_LOGSUMEXP, C_LN, C_LN_PLAIN, C_CE, C_MSE, C_MLP };
typedef struct {
  int kind, axis;
  bool keep, transpose;
  kiln_tensor *target;
} comp_ctx;

static kiln_tensor *f_comp(kiln_tensor *const *x, const void *c) {
  const comp_ctx *k = c;
  kiln_tensor *a = k->transpose ? T(kiln_transpose(x[0], 0, 1)) : x[0];
  switch (k->kind) {
    case C_SOFTMAX:
      return T(kiln_softmax(a, k->axis));
    case C_LOG_SOFTMAX:
      return T(kiln_log_softmax(a, k->axis));
    case C_LOGSUMEXP:
      return T(kiln_logsumexp(a, k->axis, k->keep));
    case C_LN:
      return T(kiln_layer_norm(a, x[1], x[2], 1e-5));
    case C_LN_PLAIN:
      return T(kiln_layer_norm(a, NULL, NULL, 1e-5));
    case C_CE:
      return T(kiln_cross_entropy(a, k->target));
    case C_MSE:
      return T(kiln_mse_loss(a, x[1]));
    default: { /* x[0] [4,3] inputs, x[1] [3,5], x[2] [5], x[3] [5,3], x[4] [3] */
      kiln_tensor *h = T(kiln_relu(T(kiln_add(T(kiln_matmul(a, x[1])), x[2]))));
      kiln_tensor *logits = T(kiln_add(T(kiln_matmul(h, x[3])), x[4]));
      return T(kiln_cross_entropy(logits, k->target));
    }
  }
}

TEST(grad_softmax_family) {
  comp_ctx k = {C_SOFTMAX, -1, false, false, NULL};
  GC("softmax axis -1", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.axis = 0;
  GC("softmax axis 0", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.axis = 1;
  GC("softmax 3-d axis 1", f_comp, &k, R(3, S(2, 3, 4), -2, 2));
  k.transpose = true;
  GC("softmax of a transpose", f_comp, &k, R(2, S(4, 3), -2, 2));
  k = (comp_ctx){C_LOG_SOFTMAX, -1, false, false, NULL};
  GC("log_softmax axis -1", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.axis = 0;
  GC("log_softmax 3-d axis 0", f_comp, &k, R(3, S(2, 3, 4), -2, 2));
  k.axis = 1, k.transpose = true;
  GC("log_softmax of a transpose", f_comp, &k, R(2, S(4, 3), -2, 2));
  k = (comp_ctx){C_LOGSUMEXP, -1, false, false, NULL};
  GC("logsumexp axis -1", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.keep = true;
  GC("logsumexp axis -1 keepdim", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.axis = 0;
  GC("logsumexp axis 0 keepdim", f_comp, &k, R(2, S(3, 4), -2, 2));
  k.axis = 1, k.keep = false;
  GC("logsumexp 3-d axis 1", f_comp, &k, R(3, S(2, 3, 4), -2, 2));
  k.transpose = true;
  GC("logsumexp of a transpose", f_comp, &k, R(2, S(4, 3), -2, 2));
  k = (comp_ctx){C_LOGSUMEXP, 0, false, false, NULL};
  GC("logsumexp 1-d", f_comp, &k, R(1, S(5), -2, 2));
}

TEST(grad_layer_norm) {
  comp_ctx k = {C_LN, -1, false, false, NULL};
  GC("layer_norm [3,5] w b", f_comp, &k, R(2, S(3, 5), -2, 2), R(1, S(5), 0.5, 1.5),
     R(1, S(5), -1, 1));
  GC("layer_norm [2,3,4] w b", f_comp, &k, R(3, S(2, 3, 4), -2, 2), R(1, S(4), 0.5, 1.5),
     R(1, S(4), -1, 1));
  k.transpose = true;
  GC("layer_norm of a transpose, w b", f_comp, &k, R(2, S(5, 3), -2, 2), R(1, S(5), 0.5, 1.5),
     R(1, S(5), -1, 1));
  k = (comp_ctx){C_LN_PLAIN, -1, false, false, NULL};
  GC("layer_norm [3,5] no affine", f_comp, &k, R(2, S(3, 5), -2, 2));
  GC("layer_norm [2,3,4] no affine", f_comp, &k, R(3, S(2, 3, 4), -2, 2));
  k.transpose = true;
  GC("layer_norm of a transpose, no affine", f_comp, &k, R(2, S(5, 3), -2, 2));
}

TEST(grad_losses) {
  comp_ctx k = {C_CE, 0, false, false, ti64(1, S(4), (const int64_t[]){1, 0, 4, 2})};
  GC("cross_entropy [4,5]", f_comp, &k, R(2, S(4, 5), -2, 2));
  k.transpose = true;
  GC("cross_entropy of a transpose", f_comp, &k, R(2, S(5, 4), -2, 2));
  kiln_release(k.target);
  k = (comp_ctx){C_CE, 0, false, false, ti64(1, S(1), (const int64_t[]){2})};
  GC("cross_entropy [1,3]", f_comp, &k, R(2, S(1, 3), -2, 2));
  kiln_release(k.target);
  k = (comp_ctx){C_MSE, 0, false, false, NULL};
  GC("mse_loss [3,4]", f_comp, &k, R(2, S(3, 4), -2, 2), R(2, S(3, 4), -2, 2));
  GC("mse_loss, constant target", f_comp, &k, R(2, S(3, 4), -2, 2), CONSTANT(R(2, S(3, 4), -2, 2)));
  GC("mse_loss 1-d", f_comp, &k, R(1, S(5), -2, 2), R(1, S(5), -2, 2));
  k.transpose = true;
  GC("mse_loss of a transpose", f_comp, &k, R(2, S(4, 3), -2, 2), R(2, S(3, 4), -2, 2));
  k = (comp_ctx){C_MLP, 0, false, false, ti64(1, S(4), (const int64_t[]){0, 2, 1, 2})};
  GC("2-layer MLP + cross_entropy", f_comp, &k, R(2, S(4, 3), -1, 1), R(2, S(3, 5), -1, 1),
     R(1, S(5), -0.5, 0.5), R(2, S(5, 3), -1, 1), R(1, S(3), -0.5, 0.5));
  kiln_release(k.target);
}

/* ---- ops without a gradient must contribute nothing ---- */

typedef struct {
  int kind;
} nd_ctx;

static kiln_tensor *f_nondiff(kiln_tensor *const *x, const void *c) {
  int k = ((const nd_ctx *)c)->kind;
  kiln_tensor *a = x[0];
  switch (k) {
    case 0:
      return T(kiln_mul(T(kiln_floor(a)), a));
    case 1:
      return T(kiln_mul(T(kiln_ceil(a)), a));
    case 2:
      return T(kiln_mul(T(kiln_round(a)), a));
    case 3:
      return T(kiln_mul(T(kiln_sign(a)), a));
    case 4: /* leaky relu through a comparison */
      return T(
          kiln_where(T(kiln_gt(a, T(kiln_zeros(F64, 0, NULL)))), a, T(kiln_mul_scalar(a, 0.1))));
    case 5: { /* logical ops pick the branch */
      kiln_tensor *one = T(kiln_ones(F64, 0, NULL)), *mone = T(kiln_neg(one));
      kiln_tensor *in = T(kiln_logical_and(T(kiln_gt(a, mone)), T(kiln_lt(a, one))));
      kiln_tensor *out = T(kiln_logical_or(T(kiln_le(a, mone)), T(kiln_ge(a, one))));
      kiln_tensor *t = T(kiln_where(in, T(kiln_mul(a, a)), T(kiln_sin(a))));
      t = T(kiln_where(T(kiln_logical_not(out)), t, T(kiln_mul_scalar(a, 3.0))));
      kiln_tensor *e = T(kiln_cast(T(kiln_eq(a, a)), F64)),
                  *ne = T(kiln_cast(T(kiln_ne(a, one)), F64));
      return T(kiln_add(t, T(kiln_mul(T(kiln_add(e, ne)), a))));
    }
    case 6: /* cast to integers and back */
      return T(kiln_add(
          T(kiln_mul(T(kiln_cast(T(kiln_cast(a, I64)), F64)), a)),
          T(kiln_mul(T(kiln_cast(T(kiln_cast(T(kiln_mul_scalar(a, 3.0)), KILN_I32)), F64)), a))));
    case 7: /* argmax picks, index_select differentiates: x 1-d [5] */
      return T(kiln_index_select(a, 0, T(kiln_argmax(a, 0, true))));
    case 8: /* row maxima / minima through gather with argmax/argmin, [3,4] */
      return T(kiln_add(T(kiln_gather(a, 1, T(kiln_argmax(a, 1, true)))),
                        T(kiln_mul_scalar(T(kiln_gather(a, 1, T(kiln_argmin(a, 1, true)))), 2.0))));
    default: /* the argmax index itself, cast to float, scales the input */
      return T(kiln_mul(a, T(kiln_cast(T(kiln_argmax(a, 1, true)), F64))));
  }
}

TEST(grad_nondifferentiable_ops_contribute_nothing) {
  /* away from integers and from halves (floor/ceil/round jump there) */
  static const double v[12] = {-2.3, -1.7, -0.8, -0.2, 0.3, 0.7, 1.2, 1.8, 2.2, -1.2, 0.1, 1.6};
  static const char *names[] = {"floor(x)*x",
                                "ceil(x)*x",
                                "round(x)*x",
                                "sign(x)*x",
                                "where(x>0, x, 0.1x)",
                                "where/logical ops/eq/ne",
                                "cast to int and back",
                                "index_select at argmax",
                                "gather at argmax/argmin",
                                "x * argmax"};
  for (int k = 0; k < 10; k++) {
    nd_ctx c = {k};
    if (k == 7)
      GC(names[k], f_nondiff, &c, DAT(1, S(5), D(0.3, -1.2, 1.7, 0.9, -0.4)));
    else
      GC(names[k], f_nondiff, &c, DAT(2, S(3, 4), v));
  }
}

/* cast between float dtypes passes the gradient through (not a gradcheck:
   f32 values cannot be perturbed by 1e-6) */
TEST(grad_cast_between_floats) {
  static const double xv[4] = {0.5, -1.25, 2.0, 0.75}, wv[4] = {1.0, -2.0, 0.5, 3.0};
  /* f64 leaf -> f32 -> loss in f32: grad is f64 */
  kiln_tensor *x = leaf(1, S(4), xv);
  kiln_tensor *w = kiln_from_data((const float[]){1.0f, -2.0f, 0.5f, 3.0f}, F32, 1, S(4));
  kiln_tensor *xf = kiln_cast(x, F32);
  CHECK(kiln_requires_grad(xf));
  kiln_tensor *l = sum_all(T(kiln_mul(xf, w)));
  CHECK(l && kiln_dtype_of(l) == F32);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  CHECK_GRAD(x, 4, wv, 1e-6);
  /* f32 leaf -> f64 -> x^3: grad 3x^2 in f32 */
  kiln_tensor *y = kiln_from_data((const float[]){0.5f, -1.25f, 2.0f, 0.75f}, F32, 1, S(4));
  CHECK_EQ_INT(kiln_set_requires_grad(y, true), 0);
  kiln_tensor *l2 = sum_all(T(kiln_pow_scalar(T(kiln_cast(y, F64)), 3.0)));
  CHECK(l2 && kiln_dtype_of(l2) == F64);
  CHECK_EQ_INT(kiln_backward(l2, NULL), 0);
  double e[4];
  for (int i = 0; i < 4; i++) e[i] = 3 * xv[i] * xv[i];
  CHECK_GRAD(y, 4, e, 1e-6);
  /* f64 -> f32 -> f64 round trip */
  kiln_tensor *z = leaf(1, S(4), xv);
  kiln_tensor *l3 =
      sum_all(T(kiln_mul(T(kiln_cast(T(kiln_cast(z, F32)), F64)), T(tf64(1, S(4), wv)))));
  CHECK_EQ_INT(kiln_backward(l3, NULL), 0);
  CHECK_GRAD(z, 4, wv, 1e-6);
  pool_release_to(0);
  kiln_release(x), kiln_release(w), kiln_release(xf), kiln_release(l);
  kiln_release(y), kiln_release(l2), kiln_release(z), kiln_release(l3);
}

/* f32 leaves: gradients are f32 and close to the f64 ones */
TEST(grad_f32) {
  static const float xv[6] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f, 1.1f};
  kiln_tensor *x = kiln_from_data(xv, F32, 2, S(2, 3));
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  /* sum(tanh(x) * x) -> tanh(x) + x (1 - tanh^2 x) */
  kiln_tensor *l = sum_all(T(kiln_mul(T(kiln_tanh(x)), x)));
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  double e[6];
  for (int i = 0; i < 6; i++) {
    double t = tanh((double)xv[i]);
    e[i] = t + xv[i] * (1 - t * t);
  }
  CHECK_GRAD(x, 6, e, 1e-5);
  pool_release_to(0);
  kiln_release(x), kiln_release(l);
}

/* ======================================================================== */
/* 3. higher order                                                          */
/* ======================================================================== */

TEST(second_derivative_of_cubic) {
  for (int form = 0; form < 2; form++) {
    kiln_tensor *x = leaf(0, NULL, D(1.0));
    kiln_tensor *x3 = form ? T(kiln_mul(x, T(kiln_mul(x, x)))) : T(kiln_pow_scalar(x, 3.0));
    kiln_tensor *y = T(kiln_add_scalar(T(kiln_mul_scalar(x3, 2.0)), 8.0));
    CHECK_CLOSE(kiln_item(y), 10.0, 1e-15);
    kiln_tensor *g1 = NULL, *g2 = NULL, *g3 = NULL;
    CHECK_EQ_INT(kiln_grad_of(1, &y, NULL, 1, &x, &g1, true), 0);
    if (g1) {
      CHECK(kiln_requires_grad(g1));
      CHECK_CLOSE(kiln_item(g1), 6.0, 1e-14);
      CHECK_EQ_INT(kiln_grad_of(1, &g1, NULL, 1, &x, &g2, true), 0);
    }
    if (g2) {
      CHECK_CLOSE(kiln_item(g2), 12.0, 1e-14);
      CHECK_EQ_INT(kiln_grad_of(1, &g2, NULL, 1, &x, &g3, false), 0);
    }
    if (g3) CHECK_CLOSE(kiln_item(g3), 12.0, 1e-14); /* d3/dx3 = 12 */
    /* grad_of never touched .grad */
    kiln_tensor *acc = kiln_grad(x);
    CHECK(acc == NULL);
    kiln_release(acc);
    /* second order through backward: backward(d/dx y) puts 12 into x.grad */
    kiln_tensor *g1b = NULL;
    CHECK_EQ_INT(kiln_grad_of(1, &y, NULL, 1, &x, &g1b, true), 0);
    if (g1b) {
      CHECK_EQ_INT(kiln_backward(g1b, NULL), 0);
      CHECK_GRAD(x, 1, D(12.0), 1e-14);
    }
    kiln_release(g1), kiln_release(g2), kiln_release(g3), kiln_release(g1b);
    pool_release_to(0);
    kiln_release(x);
  }
}

TEST(hvp_cubic) {
  /* f = sum(x^3 w): grad 3 x^2 w, H = diag(6 x w), Hv = 6 x w v */
  static const double xv[5] = {0.5, -1.0, 1.5, 2.0, -0.25}, wv[5] = {1.0, 2.0, -0.5, 0.25, 3.0},
                      vv[5] = {1.0, -1.0, 2.0, 0.5, 4.0};
  kiln_tensor *x = leaf(1, S(5), xv), *w = tf64(1, S(5), wv), *v = tf64(1, S(5), vv);
  kiln_tensor *f = T(sum_all(T(kiln_mul(T(kiln_pow_scalar(x, 3.0)), w))));
  kiln_tensor *g = NULL, *hv = NULL;
  CHECK_EQ_INT(kiln_grad_of(1, &f, NULL, 1, &x, &g, true), 0);
  double eg[5], ehv[5];
  for (int i = 0; i < 5; i++) eg[i] = 3 * xv[i] * xv[i] * wv[i], ehv[i] = 6 * xv[i] * wv[i] * vv[i];
  if (g) {
    CHECK_VALUES(g, 5, eg, 1e-14, 1e-14);
    CHECK_EQ_INT(kiln_grad_of(1, &g, &v, 1, &x, &hv, false), 0);
    CHECK_VALUES(hv, 5, ehv, 1e-14, 1e-14);
    /* d/dx sum(g*g) = 2 g * 6 x w = 36 x^3 w^2, via backward */
    kiln_tensor *l2 = T(sum_all(T(kiln_mul(g, g))));
    CHECK_EQ_INT(kiln_backward(l2, NULL), 0);
    double e2[5];
    for (int i = 0; i < 5; i++) e2[i] = 36 * pow(xv[i], 3) * wv[i] * wv[i];
    CHECK_GRAD(x, 5, e2, 1e-13);
  }
  kiln_release(g), kiln_release(hv);
  pool_release_to(0);
  kiln_release(x), kiln_release(w), kiln_release(v);
}

/* t = tanh(A x); f = sum(t); df/dx = A^T (1 - t^2); Hv = A^T (-2 t (1 - t^2) (A v)) */
static void tanh_ax_ref(const double *A, const double *x, const double *v, int m, int n,
                        double *grad, double *gradA, double *hv) {
  for (int j = 0; j < n; j++) grad[j] = hv[j] = 0;
  for (int i = 0; i < m; i++) {
    double z = 0, av = 0;
    for (int j = 0; j < n; j++) z += A[i * n + j] * x[j], av += A[i * n + j] * v[j];
    double t = tanh(z), d = 1 - t * t;
    for (int j = 0; j < n; j++) {
      grad[j] += A[i * n + j] * d;
      hv[j] += A[i * n + j] * (-2 * t * d * av);
      if (gradA) gradA[i * n + j] = d * x[j];
    }
  }
}

TEST(hvp_tanh_ax) {
  static const double Av[12] = {0.5, -0.3, 0.8, 1.1, 0.2, -0.7, -0.4, 0.9, 0.3, 0.6, -1.2, 0.1};
  static const double xv[3] = {0.7, -0.4, 1.2}, vv[3] = {1.0, 2.0, -0.5};
  double eg[3], ehv[3];
  tanh_ax_ref(Av, xv, vv, 4, 3, eg, NULL, ehv);
  kiln_tensor *A = tf64(2, S(4, 3), Av), *x = leaf(1, S(3), xv), *v = tf64(1, S(3), vv);
  kiln_tensor *f = T(sum_all(T(kiln_tanh(T(kiln_matmul(A, x))))));
  kiln_tensor *g = NULL, *hv = NULL;
  CHECK_EQ_INT(kiln_grad_of(1, &f, NULL, 1, &x, &g, true), 0);
  if (g) {
    CHECK_VALUES(g, 3, eg, 1e-13, 1e-14);
    CHECK_EQ_INT(kiln_grad_of(1, &g, &v, 1, &x, &hv, false), 0);
    CHECK_VALUES(hv, 3, ehv, 1e-13, 1e-14);
  }
  kiln_release(g), kiln_release(hv);
  pool_release_to(0);
  kiln_release(A), kiln_release(x), kiln_release(v);
}

/* gradchecks of create_graph gradients: the builder returns
   sum_k <d inner / d x_k, V_k> for fixed V_k, whose gradient is a
   Hessian-vector product */
static kiln_tensor *inner_fn(int kind, kiln_tensor *const *x) {
  switch (kind) {
    case 0:
      return T(sum_all(T(kiln_tanh(T(kiln_matmul(x[0], x[1]))))));
    case 1: {
      kiln_tensor *s = T(kiln_softmax(x[0], -1));
      return T(sum_all(T(kiln_mul(s, T(fixed_tensor(2, S(3, 4), 7, -1, 1))))));
    }
    case 2: {
      kiln_tensor *y = T(kiln_layer_norm(x[0], x[1], x[2], 1e-5));
      return T(sum_all(T(kiln_mul(y, T(kiln_sin(y))))));
    }
    case 3: {
      kiln_tensor *y = T(kiln_sigmoid(T(kiln_matmul(x[0], x[1]))));
      return T(sum_all(T(kiln_mul(y, y))));
    }
    case 4: {
      kiln_tensor *num = T(kiln_mul(T(kiln_exp(x[0])), T(kiln_sin(x[1]))));
      return T(sum_all(T(kiln_div(num, T(kiln_add_scalar(T(kiln_mul(x[0], x[0])), 1.0))))));
    }
    case 5:
      return T(sum_all(T(kiln_pow(x[0], x[1]))));
    case 6: {
      kiln_tensor *t = T(ti64(1, S(3), (const int64_t[]){2, 0, 3}));
      return T(kiln_cross_entropy(x[0], t));
    }
    case 7: {
      kiln_tensor *p = T(kiln_prod(x[0], 1, (const int[]){1}, false));
      kiln_tensor *m = T(kiln_max(T(kiln_mul(x[0], x[0])), 1, (const int[]){0}, false));
      return T(kiln_add(T(sum_all(p)), T(sum_all(T(kiln_mul(m, m))))));
    }
    case 8: {
      kiln_tensor *i = T(ti64(1, S(3), (const int64_t[]){1, 1, 0}));
      kiln_tensor *g = T(ti64(2, S(3, 2), (const int64_t[]){0, 1, 1, 1, 0, 2}));
      kiln_tensor *a = T(kiln_index_select(x[0], 0, i)); /* [3,3] */
      kiln_tensor *b = T(kiln_gather(T(kiln_transpose(x[0], 0, 1)), 1, g));
      return T(kiln_add(T(sum_all(T(kiln_pow_scalar(a, 3.0)))),
                        T(sum_all(T(kiln_mul(b, T(kiln_exp(b))))))));
    }
    case 9: {
      kiln_tensor *l = T(kiln_log_softmax(T(kiln_slice(x[0], 1, 3, -100, -1)), 0));
      kiln_tensor *c = T(kiln_concat(2, (kiln_tensor *const[]){l, T(kiln_sqrt(x[1]))}, 0));
      return T(kiln_add(T(sum_all(T(kiln_mul(c, c)))), T(kiln_mse_loss(x[1], T(kiln_gelu(x[1]))))));
    }
    default: {
      kiln_tensor *s = T(kiln_stack(2, x, 0));
      kiln_tensor *e = T(kiln_expand(T(kiln_unsqueeze(x[0], 0)), 2, S(2, 3)));
      return T(
          sum_all(T(kiln_mul(T(kiln_logsumexp(T(kiln_mul(s, e)), 0, false)),
                             T(kiln_rsqrt(T(kiln_add_scalar(T(kiln_mul(x[1], x[1])), 1.0))))))));
    }
  }
}

typedef struct {
  int kind, nin;
} hess_ctx;

static kiln_tensor *f_hess(kiln_tensor *const *x, const void *c) {
  const hess_ctx *h = c;
  kiln_tensor *l = inner_fn(h->kind, x);
  kiln_tensor *g[GC_MAX_IN] = {0};
  if (!l || kiln_grad_of(1, &l, NULL, h->nin, x, g, true) != 0) {
    for (int k = 0; k < h->nin; k++) kiln_release(g[k]);
    return NULL;
  }
  kiln_tensor *acc = NULL;
  for (int k = 0; k < h->nin; k++) {
    T(g[k]);
    kiln_tensor *vk = T(fixed_tensor(kiln_ndim(g[k]), kiln_shape(g[k]), 77 + (uint64_t)k, -1, 1));
    kiln_tensor *term = T(sum_all(T(kiln_mul(g[k], vk))));
    acc = acc ? T(kiln_add(acc, term)) : term;
  }
  return acc;
}

TEST(grad_of_grad_gradcheck) {
  hess_ctx h;
  h = (hess_ctx){0, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess sum(tanh(A x))", f_hess, &h, R(2, S(4, 3), -1, 1),
           R(1, S(3), -1, 1));
  h = (hess_ctx){1, 1};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess softmax", f_hess, &h, R(2, S(3, 4), -2, 2));
  h = (hess_ctx){2, 3};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess layer_norm", f_hess, &h, R(2, S(2, 5), -2, 2),
           R(1, S(5), 0.5, 1.5), R(1, S(5), -1, 1));
  h = (hess_ctx){3, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess sigmoid(matmul)", f_hess, &h, R(3, S(2, 2, 3), -1, 1),
           R(2, S(3, 2), -1, 1));
  h = (hess_ctx){4, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess exp sin div, broadcast", f_hess, &h, R(2, S(3, 1), -1, 1),
           R(2, S(1, 4), -2, 2));
  h = (hess_ctx){5, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess pow", f_hess, &h, R(2, S(2, 3), 0.5, 2), R(1, S(3), -2, 2));
  h = (hess_ctx){6, 1};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess cross_entropy", f_hess, &h, R(2, S(3, 4), -2, 2));
  h = (hess_ctx){7, 1};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess prod, max", f_hess, &h, RA(2, S(3, 4), -1.5, 1.5, 0.3));
  h = (hess_ctx){8, 1};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess index_select, gather", f_hess, &h, R(2, S(3, 3), -1, 1));
  h = (hess_ctx){9, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess log_softmax slice concat sqrt gelu mse", f_hess, &h,
           R(2, S(2, 4), -1, 1), R(2, S(1, 4), 0.3, 2));
  h = (hess_ctx){10, 2};
  GC_FLAGS(GC_FD_WITH_GRAD, "hess stack expand logsumexp rsqrt", f_hess, &h, R(1, S(3), -1, 1),
           R(1, S(3), -1, 1));
}

/* ======================================================================== */
/* 4. accumulation, zero_grad, no_grad, detach, errors                      */
/* ======================================================================== */

static const double XV6[6] = {0.5, -1.0, 1.5, 2.0, -0.25, 0.75};

/* sum(x*x), pool-owned */
static kiln_tensor *sq_loss(kiln_tensor *x) { return T(sum_all(T(kiln_mul(x, x)))); }

TEST(requires_grad_flags) {
  kiln_tensor *x = tf64(1, S(6), XV6), *c = tf64(1, S(6), XV6);
  CHECK(!kiln_requires_grad(x));
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  CHECK(kiln_requires_grad(x));
  CHECK(!kiln_requires_grad(c));
  CHECK(!kiln_requires_grad(T(kiln_exp(c))));
  CHECK(kiln_requires_grad(T(kiln_add(x, c))));
  CHECK(kiln_requires_grad(T(kiln_add(c, x))));
  CHECK(kiln_requires_grad(T(kiln_reshape(x, 2, S(2, 3)))));
  CHECK(kiln_requires_grad(T(kiln_sum(x, 0, NULL, false))));
  CHECK(kiln_requires_grad(T(kiln_stack(2, (kiln_tensor *const[]){c, x}, 0))));
  CHECK(kiln_requires_grad(T(kiln_softmax(x, 0))));
  /* turning it off again */
  kiln_tensor *y = tf64(1, S(6), XV6);
  CHECK_EQ_INT(kiln_set_requires_grad(y, true), 0);
  CHECK_EQ_INT(kiln_set_requires_grad(y, false), 0);
  CHECK(!kiln_requires_grad(y));
  CHECK(!kiln_requires_grad(T(kiln_mul(y, c))));
  /* f32 leaves are fine too */
  kiln_tensor *f = kiln_ones(F32, 1, S(3));
  CHECK_EQ_INT(kiln_set_requires_grad(f, true), 0);
  CHECK(kiln_requires_grad(f));
  pool_release_to(0);
  kiln_release(x), kiln_release(c), kiln_release(y), kiln_release(f);
}

TEST(backward_accumulates) {
  kiln_tensor *x = leaf(1, S(6), XV6);
  double e2[6], e4[6], e6[6];
  for (int i = 0; i < 6; i++) e2[i] = 2 * XV6[i], e4[i] = 4 * XV6[i], e6[i] = 6 * XV6[i];
  kiln_tensor *g0 = kiln_grad(x);
  CHECK(g0 == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_OK);
  kiln_release(g0);
  CHECK_EQ_INT(kiln_backward(sq_loss(x), NULL), 0);
  CHECK_GRAD(x, 6, e2, 1e-15);
  CHECK_EQ_INT(kiln_backward(sq_loss(x), NULL), 0); /* a second graph: adds */
  CHECK_GRAD(x, 6, e4, 1e-15);
  /* the same loss again also adds (the recorded graph is the tape) */
  kiln_tensor *l = sq_loss(x);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  CHECK_GRAD(x, 6, e6, 1e-15);
  /* a gradient read earlier is a value: it does not change with later backwards */
  kiln_tensor *held = kiln_grad(x);
  CHECK_EQ_INT(kiln_backward(sq_loss(x), NULL), 0);
  CHECK_VALUES(held, 6, e6, 1e-15, 1e-15);
  kiln_release(held);
  pool_release_to(0);
  kiln_release(x);
}

TEST(backward_same_loss_twice) {
  kiln_tensor *x = leaf(1, S(6), XV6);
  double e2[6], e4[6];
  for (int i = 0; i < 6; i++) e2[i] = 2 * XV6[i], e4[i] = 4 * XV6[i];
  kiln_tensor *l = sq_loss(x);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  CHECK_GRAD(x, 6, e2, 1e-15);
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  CHECK_GRAD(x, 6, e4, 1e-15);
  pool_release_to(0);
  kiln_release(x);
}

TEST(zero_grad_clears) {
  kiln_tensor *x = leaf(1, S(6), XV6), *y = leaf(1, S(6), XV6);
  double e2[6], ex[6];
  for (int i = 0; i < 6; i++) e2[i] = 2 * XV6[i], ex[i] = XV6[i];
  CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_mul(x, y)))), NULL), 0);
  CHECK_EQ_INT(kiln_zero_grad(x), 0);
  kiln_clear_error();
  kiln_tensor *g = kiln_grad(x);
  CHECK(g == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_OK);
  kiln_release(g);
  CHECK_GRAD(y, 6, ex, 1e-15); /* y untouched */
  CHECK_EQ_INT(kiln_backward(sq_loss(x), NULL), 0);
  CHECK_GRAD(x, 6, e2, 1e-15); /* starts from nothing */
  CHECK_EQ_INT(kiln_zero_grad(y), 0);
  CHECK_EQ_INT(kiln_zero_grad(y), 0); /* twice is fine */
  kiln_tensor *gy = kiln_grad(y);
  CHECK(gy == NULL);
  kiln_release(gy);
  pool_release_to(0);
  kiln_release(x), kiln_release(y);
}

TEST(no_grad_scope) {
  kiln_tensor *x = leaf(1, S(6), XV6);
  kiln_no_grad_push();
  kiln_tensor *a = T(kiln_mul_scalar(x, 2.0));
  CHECK(!kiln_requires_grad(a));
  kiln_no_grad_push(); /* nested */
  kiln_tensor *b = T(kiln_exp(x));
  CHECK(!kiln_requires_grad(b));
  kiln_no_grad_pop();
  kiln_tensor *c = T(sum_all(T(kiln_mul(x, x))));
  CHECK(!kiln_requires_grad(c)); /* still inside the outer scope */
  kiln_no_grad_pop();
  CHECK(kiln_requires_grad(x)); /* the leaf keeps its flag */
  /* values inside no_grad are the ordinary values */
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = 2 * XV6[i];
  CHECK_VALUES(a, 6, e, 1e-15, 0);
  /* backward on a result made inside no_grad */
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(c, NULL), KILN_ERR_STATE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_STATE);
  kiln_clear_error();
  /* after the scope, results require grad again; the no_grad value is a constant */
  kiln_tensor *d = T(kiln_mul(x, a)); /* 2 x^2 with a constant: grad = a = 2x */
  CHECK(kiln_requires_grad(d));
  CHECK_EQ_INT(kiln_backward(T(sum_all(d)), NULL), 0);
  CHECK_GRAD(x, 6, e, 1e-15);
  pool_release_to(0);
  kiln_release(x);
}

/* kiln_enable_grad_push inside no_grad scopes records for autodiff again;
   a no_grad inside it nests; the pop gives back the depth it took */
TEST(enable_grad_inside_no_grad) {
  kiln_tensor *x = leaf(1, S(6), XV6);
  CHECK(kiln_is_grad_enabled());
  kiln_no_grad_push();
  kiln_no_grad_push();
  CHECK(!kiln_is_grad_enabled());
  int saved = kiln_enable_grad_push();
  CHECK(kiln_is_grad_enabled());
  kiln_tensor *y = T(kiln_mul(x, x));
  CHECK(kiln_requires_grad(y));
  kiln_no_grad_push();
  CHECK(!kiln_requires_grad(T(kiln_exp(x))));
  kiln_no_grad_pop();
  CHECK(kiln_is_grad_enabled());
  kiln_enable_grad_pop(saved);
  CHECK(!kiln_requires_grad(T(kiln_exp(x))));
  kiln_no_grad_pop();
  CHECK(!kiln_is_grad_enabled()); /* the outer scope still */
  kiln_no_grad_pop();
  CHECK(kiln_is_grad_enabled());
  CHECK_EQ_INT(kiln_backward(T(sum_all(y)), NULL), 0);
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = 2 * XV6[i];
  CHECK_GRAD(x, 6, e, 1e-15);
  pool_release_to(0);
  kiln_release(x);
}

TEST(detach_stops_gradient) {
  kiln_tensor *x = leaf(1, S(6), XV6);
  kiln_tensor *d = T(kiln_detach(x));
  CHECK(d != NULL);
  if (!d) return;
  CHECK(!kiln_requires_grad(d));
  CHECK_VALUES(d, 6, XV6, 0, 0);
  CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_mul(d, x)))), NULL), 0);
  CHECK_GRAD(x, 6, XV6, 1e-15); /* not 2x */
  CHECK_EQ_INT(kiln_zero_grad(x), 0);
  /* detach of an intermediate: h = x^2 detached, loss = sum(h * sin(x)) */
  kiln_tensor *h = T(kiln_detach(T(kiln_mul(x, x))));
  CHECK(!kiln_requires_grad(h));
  CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_mul(h, T(kiln_sin(x)))))), NULL), 0);
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = XV6[i] * XV6[i] * cos(XV6[i]);
  CHECK_GRAD(x, 6, e, 1e-14);
  /* backward on something built only from detached values */
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(T(sum_all(d)), NULL), KILN_ERR_STATE);
  kiln_clear_error();
  pool_release_to(0);
  kiln_release(x);
}

TEST(backward_with_explicit_grad) {
  static const double gv[6] = {1.0, -2.0, 0.5, 3.0, 0.0, -1.5};
  kiln_tensor *x = leaf(2, S(2, 3), XV6), *go = tf64(2, S(2, 3), gv);
  kiln_tensor *y = T(kiln_mul(x, x));
  CHECK_EQ_INT(kiln_backward(y, go), 0);
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = 2 * XV6[i] * gv[i];
  CHECK_GRAD(x, 6, e, 1e-15);
  /* a grad whose shape is not the loss's */
  kiln_tensor *bad = tf64(1, S(6), gv);
  kiln_clear_error();
  int rc = kiln_backward(y, bad);
  CHECK(rc < 0);
  CHECK_EQ_INT(rc, KILN_ERR_SHAPE);
  kiln_clear_error();
  CHECK_GRAD(x, 6, e, 1e-15); /* a failed backward adds nothing */
  pool_release_to(0);
  kiln_release(x), kiln_release(go), kiln_release(bad);
}

TEST(autodiff_errors) {
  kiln_tensor *x = leaf(2, S(2, 3), XV6);
  /* non-scalar loss without a grad */
  kiln_tensor *y = T(kiln_mul(x, x));
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(y, NULL), KILN_ERR_SHAPE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "backward");
  /* a loss that needs no grad */
  kiln_tensor *c = tf64(1, S(6), XV6);
  kiln_tensor *lc = T(sum_all(c));
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(lc, NULL), KILN_ERR_STATE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_STATE);
  CHECK_STR_CONTAINS(kiln_last_error(), "backward");
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(c, NULL), KILN_ERR_STATE); /* a plain tensor, no graph */
  /* a 1-element non-0-d loss is fine without a grad */
  kiln_tensor *l1 = T(kiln_sum(x, 0, NULL, true)); /* [1,1] */
  kiln_clear_error();
  CHECK_EQ_INT(kiln_backward(l1, NULL), 0);
  kiln_tensor *g = kiln_grad(x);
  CHECK(g != NULL);
  kiln_release(g);
  /* requires_grad on integer and bool tensors */
  kiln_tensor *ti = kiln_arange(0, 4, 1, I64), *tb = kiln_zeros(KILN_BOOL, 1, S(3));
  kiln_tensor *t32 = kiln_arange(0, 4, 1, KILN_I32);
  kiln_clear_error();
  CHECK_EQ_INT(kiln_set_requires_grad(ti, true), KILN_ERR_DTYPE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DTYPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "requires_grad");
  CHECK(!kiln_requires_grad(ti));
  CHECK_EQ_INT(kiln_set_requires_grad(tb, true), KILN_ERR_DTYPE);
  CHECK_EQ_INT(kiln_set_requires_grad(t32, true), KILN_ERR_DTYPE);
  /* requires_grad on a grad-tracked result */
  kiln_clear_error();
  CHECK_EQ_INT(kiln_set_requires_grad(y, true), KILN_ERR_STATE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_STATE);
  /* NULL arguments */
  kiln_clear_error();
  CHECK(kiln_backward(NULL, NULL) < 0);
  CHECK(kiln_set_requires_grad(NULL, true) < 0);
  CHECK(!kiln_requires_grad(NULL));
  CHECK(kiln_zero_grad(NULL) < 0);
  kiln_clear_error();
  CHECK(kiln_detach(NULL) == NULL);
  kiln_clear_error();
  kiln_tensor *gn = kiln_grad(NULL);
  CHECK(gn == NULL);
  kiln_release(gn);
  kiln_clear_error();
  kiln_tensor *gx = NULL; /* NULL arrays are named as such, not as counts */
  CHECK_EQ_INT(kiln_grad_of(1, NULL, NULL, 1, &x, &gx, false), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "the outputs array is NULL");
  CHECK_EQ_INT(kiln_grad_of(1, &l1, NULL, 1, &x, NULL, false), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "gradients (results) array is NULL");
  CHECK_EQ_INT(kiln_grad_of(0, &l1, NULL, 1, &x, &gx, false), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "needs at least one output");
  kiln_clear_error();
  pool_release_to(0);
  kiln_release(x), kiln_release(c), kiln_release(ti), kiln_release(tb), kiln_release(t32);
}

TEST(grad_of_contract) {
  static const double yv[3] = {2.0, -1.0, 0.5};
  kiln_tensor *x = leaf(1, S(6), XV6), *y = leaf(1, S(3), yv), *u = leaf(2, S(2, 2), D(1, 2, 3, 4));
  /* an input the output does not depend on gets zeros of its shape */
  kiln_tensor *l = T(kiln_add(sq_loss(x), T(sum_all(T(kiln_exp(y))))));
  kiln_tensor *ins[3] = {x, y, u}, *gr[3] = {0};
  CHECK_EQ_INT(kiln_grad_of(1, &l, NULL, 3, ins, gr, false), 0);
  double ex[6], ey[3];
  for (int i = 0; i < 6; i++) ex[i] = 2 * XV6[i];
  for (int i = 0; i < 3; i++) ey[i] = exp(yv[i]);
  CHECK_VALUES(gr[0], 6, ex, 1e-15, 1e-15);
  CHECK_VALUES(gr[1], 3, ey, 1e-15, 1e-15);
  CHECK(gr[2] && same_shape(gr[2], u));
  CHECK_VALUES(gr[2], 4, D(0, 0, 0, 0), 0, 0);
  for (int k = 0; k < 3; k++) {
    if (gr[k]) CHECK(!kiln_requires_grad(gr[k])); /* create_graph false */
    kiln_release(gr[k]), gr[k] = NULL;
  }
  /* .grad untouched */
  for (int k = 0; k < 3; k++) {
    kiln_tensor *a = kiln_grad(ins[k]);
    CHECK(a == NULL);
    kiln_release(a);
  }
  /* several outputs with their own output gradients: sum_k <outs[k], gouts[k]> */
  kiln_tensor *o1 = T(kiln_mul(x, x));                                          /* [6] */
  kiln_tensor *o2 = T(kiln_mul(T(kiln_sum(x, 0, NULL, false)), T(sum_all(y)))); /* 0-d */
  kiln_tensor *go1 = T(tf64(1, S(6), D(1, 2, 3, 4, 5, 6))), *go2 = T(kiln_scalar(3.0, F64));
  kiln_tensor *outs[2] = {o1, o2}, *gouts[2] = {go1, go2};
  CHECK_EQ_INT(kiln_grad_of(2, outs, gouts, 2, ins, gr, false), 0);
  double sx = 0, sy = 0;
  for (int i = 0; i < 6; i++) sx += XV6[i];
  for (int i = 0; i < 3; i++) sy += yv[i];
  for (int i = 0; i < 6; i++) ex[i] = 2 * XV6[i] * (i + 1) + 3 * sy;
  for (int i = 0; i < 3; i++) ey[i] = 3 * sx;
  CHECK_VALUES(gr[0], 6, ex, 1e-14, 1e-14);
  CHECK_VALUES(gr[1], 3, ey, 1e-14, 1e-14);
  kiln_release(gr[0]), kiln_release(gr[1]), gr[0] = gr[1] = NULL;
  /* gouts NULL: ones for one-element outputs (two 0-d losses) */
  kiln_tensor *l2[2] = {sq_loss(x), T(sum_all(T(kiln_mul(y, y))))};
  CHECK_EQ_INT(kiln_grad_of(2, l2, NULL, 2, ins, gr, false), 0);
  for (int i = 0; i < 6; i++) ex[i] = 2 * XV6[i];
  for (int i = 0; i < 3; i++) ey[i] = 2 * yv[i];
  CHECK_VALUES(gr[0], 6, ex, 1e-15, 1e-15);
  CHECK_VALUES(gr[1], 3, ey, 1e-15, 1e-15);
  kiln_release(gr[0]), kiln_release(gr[1]), gr[0] = gr[1] = NULL;
  /* with respect to an intermediate: h = 3x; l = sum(h*h) -> dl/dh = 2h */
  kiln_tensor *h = T(kiln_mul_scalar(x, 3.0));
  kiln_tensor *lh = T(sum_all(T(kiln_mul(h, h))));
  kiln_tensor *hin[2] = {h, x};
  CHECK_EQ_INT(kiln_grad_of(1, &lh, NULL, 2, hin, gr, false), 0);
  double eh[6];
  for (int i = 0; i < 6; i++) eh[i] = 6 * XV6[i], ex[i] = 18 * XV6[i];
  CHECK_VALUES(gr[0], 6, eh, 1e-15, 1e-15);
  CHECK_VALUES(gr[1], 6, ex, 1e-15, 1e-15);
  kiln_release(gr[0]), kiln_release(gr[1]), gr[0] = gr[1] = NULL;
  /* grad_of on an output that needs no grad, or non-scalar without gouts */
  kiln_clear_error();
  kiln_tensor *lc = T(sum_all(T(kiln_detach(x))));
  CHECK(kiln_grad_of(1, &lc, NULL, 1, ins, gr, false) < 0);
  kiln_release(gr[0]), gr[0] = NULL;
  kiln_clear_error();
  CHECK_EQ_INT(kiln_grad_of(1, &o1, NULL, 1, ins, gr, false), KILN_ERR_SHAPE);
  kiln_release(gr[0]), gr[0] = NULL;
  kiln_clear_error();
  pool_release_to(0);
  kiln_release(x), kiln_release(y), kiln_release(u);
}

/* softmax-family gradients are invariant to shifting the logits: at +1000
   they must still be finite and equal (a numerically stable backward) */
TEST(grad_large_logits_stable) {
  static const double base[12] = {0.3, -1.2, 0.8, 2.0, -0.5, 0.1, 1.4, -2.2, 0.9, 0.0, -0.7, 1.1};
  double shifted[12];
  for (int i = 0; i < 12; i++) shifted[i] = base[i] + 1000.0;
  kiln_tensor *tgt = ti64(1, S(3), (const int64_t[]){3, 0, 2});
  kiln_tensor *w = fixed_tensor(2, S(3, 4), 99, -1, 1), *w3 = fixed_tensor(1, S(3), 98, -1, 1);
  for (int kind = 0; kind < 4; kind++) {
    double *g[2] = {NULL, NULL};
    for (int sh = 0; sh < 2; sh++) {
      kiln_tensor *x = leaf(2, S(3, 4), sh ? shifted : base), *l = NULL;
      switch (kind) {
        case 0:
          l = T(sum_all(T(kiln_mul(T(kiln_softmax(x, -1)), w))));
          break;
        case 1:
          l = T(sum_all(T(kiln_mul(T(kiln_log_softmax(x, -1)), w))));
          break;
        case 2:
          l = T(sum_all(T(kiln_mul(T(kiln_logsumexp(x, -1, false)), w3))));
          break;
        default:
          l = T(kiln_cross_entropy(x, tgt));
          break;
      }
      kiln_tensor *gr = NULL;
      CHECK_EQ_INT(kiln_grad_of(1, &l, NULL, 1, &x, &gr, false), 0);
      if (gr) g[sh] = ktest_values(gr);
      kiln_release(gr);
      pool_release_to(0);
      kiln_release(x);
    }
    if (g[0] && g[1])
      for (int i = 0; i < 12; i++)
        if (!isfinite(g[1][i]) || fabs(g[0][i] - g[1][i]) > 1e-9) {
          KTEST_FAIL("kind %d: gradient[%d] at +1000 is %.17g, at 0 %.17g", kind, i, g[1][i],
                     g[0][i]);
          break;
        }
    free(g[0]), free(g[1]);
  }
  kiln_release(tgt), kiln_release(w), kiln_release(w3);
}

/* a chain longer than the pending-graph cap (depth 256): the forward and the
   backward are both cut into several flushes; y <- 0.99 y + 0.01 sin(y) */
TEST(backward_through_a_deep_graph) {
  static const double xv[4] = {0.3, -1.2, 2.0, 0.7};
  for (int read_midway = 0; read_midway < 2; read_midway++) {
    kiln_tensor *x = leaf(1, S(4), xv), *y = x;
    double yh[4], dh[4];
    for (int i = 0; i < 4; i++) yh[i] = xv[i], dh[i] = 1;
    for (int step = 0; step < 300; step++) {
      y = T(kiln_add(T(kiln_mul_scalar(y, 0.99)), T(kiln_mul_scalar(T(kiln_sin(y)), 0.01))));
      for (int i = 0; i < 4; i++) {
        dh[i] *= 0.99 + 0.01 * cos(yh[i]);
        yh[i] = 0.99 * yh[i] + 0.01 * sin(yh[i]);
      }
      if (read_midway && step == 150) free(ktest_values(y));
    }
    kiln_tensor *l = T(sum_all(y));
    CHECK_EQ_INT(kiln_backward(l, NULL), 0);
    CHECK_GRAD(x, 4, dh, 1e-12);
    CHECK_VALUES(y, 4, yh, 1e-12, 1e-12);
    pool_release_to(0);
    kiln_release(x);
  }
}

TEST(backward_misc) {
  /* an explicit 0-d output gradient scales everything */
  kiln_tensor *x = leaf(1, S(6), XV6);
  kiln_tensor *two = T(kiln_scalar(2.0, F64));
  CHECK_EQ_INT(kiln_backward(sq_loss(x), two), 0);
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = 4 * XV6[i];
  CHECK_GRAD(x, 6, e, 1e-15);
  /* a gradient reference read before zero_grad keeps its value */
  kiln_tensor *held = kiln_grad(x);
  CHECK_EQ_INT(kiln_zero_grad(x), 0);
  CHECK_VALUES(held, 6, e, 1e-15, 1e-15);
  kiln_release(held);
  /* the result of an untracked op may become a leaf */
  kiln_tensor *c = T(tf64(1, S(6), XV6));
  kiln_tensor *y = kiln_exp(c);
  CHECK(!kiln_requires_grad(y));
  CHECK_EQ_INT(kiln_set_requires_grad(y, true), 0);
  CHECK(kiln_requires_grad(y));
  CHECK_EQ_INT(kiln_backward(sq_loss(y), NULL), 0);
  for (int i = 0; i < 6; i++) e[i] = 2 * exp(XV6[i]);
  CHECK_GRAD(y, 6, e, 1e-14);
  kiln_release(y);
  /* set_requires_grad(true) twice keeps the leaf and its gradient */
  CHECK_EQ_INT(kiln_backward(sq_loss(x), NULL), 0);
  CHECK_EQ_INT(kiln_set_requires_grad(x, true), 0);
  for (int i = 0; i < 6; i++) e[i] = 2 * XV6[i];
  CHECK_GRAD(x, 6, e, 1e-15);
  pool_release_to(0);
  kiln_release(x);
  /* the leaf handle released before backward: no crash, the loss still works */
  kiln_tensor *z = leaf(1, S(6), XV6);
  kiln_tensor *lz = T(sum_all(T(kiln_mul(z, T(kiln_sin(z))))));
  kiln_release(z);
  CHECK_EQ_INT(kiln_backward(lz, NULL), 0);
  pool_release_to(0);
}

/* mixed dtypes: integer/bool operands pass no gradient but scale it; a
   gradient always comes back in its leaf's dtype */
TEST(grad_mixed_dtypes) {
  static const double xv[3] = {0.5, -1.5, 2.0};
  kiln_tensor *x = leaf(1, S(3), xv);
  kiln_tensor *n = T(ti64(1, S(3), (const int64_t[]){1, 2, 3}));
  kiln_tensor *b = T(tbool(1, S(3), (const unsigned char[]){1, 0, 1}));
  kiln_tensor *l = T(kiln_add(T(sum_all(T(kiln_mul(x, n)))), T(sum_all(T(kiln_mul(b, x))))));
  CHECK_EQ_INT(kiln_backward(l, NULL), 0);
  CHECK_GRAD(x, 3, D(2, 2, 4), 1e-15);
  /* f32 leaf times an f64 constant: the loss is f64, the gradient f32 */
  kiln_tensor *y = kiln_from_data((const float[]){0.5f, 1.0f, -2.0f}, F32, 1, S(3));
  CHECK_EQ_INT(kiln_set_requires_grad(y, true), 0);
  kiln_tensor *c = T(tf64(1, S(3), D(0.25, -3.0, 1.5)));
  kiln_tensor *ly = T(sum_all(T(kiln_mul(y, c))));
  CHECK_EQ_INT(kiln_dtype_of(ly), F64);
  CHECK_EQ_INT(kiln_backward(ly, NULL), 0);
  CHECK_GRAD(y, 3, D(0.25, -3.0, 1.5), 1e-7);
  /* integer base, float exponent: d/de base^e = base^e ln(base) */
  kiln_tensor *e = leaf(1, S(3), D(0.5, 1.5, 2.0));
  kiln_tensor *base = T(ti64(1, S(3), (const int64_t[]){1, 2, 3}));
  CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_pow(base, e)))), NULL), 0);
  CHECK_GRAD(e, 3, D(0.0, pow(2, 1.5) * log(2.0), 9 * log(3.0)), 1e-14);
  pool_release_to(0);
  kiln_release(x), kiln_release(y), kiln_release(e);
}

/* scatter_add (gather's adjoint) has a gradient too: a gets g, src gets
   g gathered at idx */
typedef struct {
  int axis;
  kiln_tensor *idx;
} sa_ctx;
static kiln_tensor *f_scatter_add(kiln_tensor *const *x, const void *c) {
  const sa_ctx *k = c;
  kiln_tensor *r = T(kiln_scatter_add(x[0], k->axis, k->idx, x[1]));
  return T(kiln_mul(r, r));
}
TEST(grad_scatter_add) {
  sa_ctx k = {1, ti64(2, S(3, 2), (const int64_t[]){0, 3, 2, 2, 1, 0})};
  GC("scatter_add axis 1, repeated", f_scatter_add, &k, R(2, S(3, 4), -1, 1), R(2, S(3, 2), -1, 1));
  kiln_release(k.idx);
  k = (sa_ctx){0, ti64(2, S(2, 4), (const int64_t[]){2, 0, 1, 2, 0, 0, 2, 1})};
  GC("scatter_add axis 0", f_scatter_add, &k, R(2, S(3, 4), -1, 1), R(2, S(2, 4), -1, 1));
  kiln_release(k.idx);
}

/* kiln_set_grad replaces a leaf's gradient (gradient clipping writes the
   scaled gradient back with it): the next backward accumulates onto it,
   the caller's tensor is never aliased, and a wrong dtype, shape, a
   non-leaf or a tensor without grad is a clear error */
TEST(set_grad_replaces_a_leafs_gradient) {
  kiln_tensor *w = leaf(1, S(3), D(2.0, 3.0, 4.0)), *g = tf64(1, S(3), D(0.5, -1.0, 2.0));
  CHECK_EQ_INT(kiln_backward(sq_loss(w), NULL), 0);
  CHECK_GRAD(w, 3, D(4.0, 6.0, 8.0), 0);
  CHECK_EQ_INT(kiln_set_grad(w, g), 0);
  CHECK_GRAD(w, 3, D(0.5, -1.0, 2.0), 0);
  CHECK_EQ_INT(kiln_backward(sq_loss(w), NULL), 0); /* accumulates onto it */
  CHECK_GRAD(w, 3, D(4.5, 5.0, 10.0), 0);
  CHECK_VALUES(g, 3, D(0.5, -1.0, 2.0), 0, 0); /* the caller's tensor as it was */
  kiln_tensor *f32 = kiln_ones(KILN_F32, 1, S(3)), *two = tf64(1, S(2), D(1.0, 1.0));
  CHECK_EQ_INT(kiln_set_grad(w, f32), KILN_ERR_DTYPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "float32");
  CHECK_EQ_INT(kiln_set_grad(w, two), KILN_ERR_SHAPE);
  kiln_tensor *y = kiln_mul_scalar(w, 2); /* not a leaf */
  CHECK_EQ_INT(kiln_set_grad(y, g), KILN_ERR_STATE);
  CHECK_STR_CONTAINS(kiln_last_error(), "not a leaf");
  CHECK_EQ_INT(kiln_set_grad(g, g), KILN_ERR_STATE); /* requires no grad */
  CHECK_STR_CONTAINS(kiln_last_error(), "does not require grad");
  CHECK_GRAD(w, 3, D(4.5, 5.0, 10.0), 0); /* the errors changed nothing */
  CHECK_EQ_INT(kiln_set_grad(w, NULL), 0);
  kiln_tensor *none = kiln_grad(w);
  CHECK(none == NULL);
  kiln_clear_error();
  kiln_release(y), kiln_release(two), kiln_release(f32), kiln_release(g), kiln_release(w);
  pool_release_to(0);
}

/* a leaf that is itself the loss */
TEST(backward_on_a_leaf) {
  kiln_tensor *x = leaf(0, NULL, D(3.0)), *y = leaf(1, S(1), D(-2.0));
  CHECK_EQ_INT(kiln_backward(x, NULL), 0);
  CHECK_GRAD(x, 1, D(1.0), 0);
  CHECK_EQ_INT(kiln_backward(y, NULL), 0);
  CHECK_GRAD(y, 1, D(1.0), 0);
  kiln_tensor *g = NULL;
  CHECK_EQ_INT(kiln_grad_of(1, &x, NULL, 1, &x, &g, false), 0);
  if (g) CHECK_CLOSE(kiln_item(g), 1.0, 0);
  kiln_release(g);
  kiln_release(x), kiln_release(y);
}

/* The gradient a leaf accumulates is its own: kiln_backward(w, g) twice
   doubles w's gradient and leaves the caller's g as it was (the leaf's
   slot held g's very handle, and the second backward rebound it: g came
   back doubled).  kiln_backward(w, w) works, and releasing w frees it all
   (the slot held w's own node: a cycle the ASan build reported as a leak). */
TEST(a_leaf_gradient_never_aliases_the_callers_tensors) {
  kiln_tensor *w = leaf(1, S(3), D(2.0, 3.0, 4.0)), *g = tf64(1, S(3), D(1.0, -1.0, 0.5));
  CHECK_EQ_INT(kiln_backward(w, g), 0);
  CHECK_EQ_INT(kiln_backward(w, g), 0);
  CHECK_GRAD(w, 3, D(2.0, -2.0, 1.0), 0);
  CHECK_VALUES(g, 3, D(1.0, -1.0, 0.5), 0, 0);
  kiln_tensor *before = kiln_grad(w); /* a handle on the gradient so far */
  CHECK_EQ_INT(kiln_backward(w, g), 0);
  CHECK_VALUES(before, 3, D(2.0, -2.0, 1.0), 0, 0);
  CHECK_GRAD(w, 3, D(3.0, -3.0, 1.5), 0);
  kiln_release(before);
  kiln_release(g);
  kiln_release(w);
  kiln_tensor *v = leaf(1, S(2), D(5.0, -1.0));
  CHECK_EQ_INT(kiln_backward(v, v), 0);
  CHECK_GRAD(v, 2, D(5.0, -1.0), 0);
  CHECK_EQ_INT(kiln_backward(v, v), 0);
  CHECK_GRAD(v, 2, D(10.0, -2.0), 0);
  CHECK_VALUES(v, 2, D(5.0, -1.0), 0, 0);
  kiln_release(v);
}

TEST(grad_of_more) {
  kiln_tensor *x = leaf(1, S(6), XV6), *c = tf64(1, S(6), XV6);
  kiln_tensor *l = T(sum_all(T(kiln_mul(x, c))));
  /* with respect to a tensor that requires no grad: zeros */
  kiln_tensor *ins[2] = {x, c}, *gr[2] = {0};
  CHECK_EQ_INT(kiln_grad_of(1, &l, NULL, 2, ins, gr, false), 0);
  CHECK_VALUES(gr[0], 6, XV6, 0, 0);
  if (gr[1]) CHECK(same_shape(gr[1], c));
  CHECK_VALUES(gr[1], 6, D(0, 0, 0, 0, 0, 0), 0, 0);
  kiln_release(gr[0]), kiln_release(gr[1]), gr[0] = gr[1] = NULL;
  /* bad counts */
  kiln_clear_error();
  CHECK(kiln_grad_of(0, &l, NULL, 1, ins, gr, false) < 0);
  CHECK(kiln_grad_of(1, &l, NULL, 0, ins, gr, false) < 0);
  kiln_clear_error();
  /* a wrong output-gradient shape */
  kiln_tensor *o = T(kiln_mul(x, x)), *bad = T(tf64(1, S(3), D(1, 2, 3)));
  CHECK_EQ_INT(kiln_grad_of(1, &o, &bad, 1, ins, gr, false), KILN_ERR_SHAPE);
  CHECK(gr[0] == NULL);
  kiln_clear_error();
  /* the same input twice gets the same gradient twice */
  kiln_tensor *twice[2] = {x, x};
  CHECK_EQ_INT(kiln_grad_of(1, &l, NULL, 2, twice, gr, false), 0);
  CHECK_VALUES(gr[0], 6, XV6, 0, 0);
  CHECK_VALUES(gr[1], 6, XV6, 0, 0);
  kiln_release(gr[0]), kiln_release(gr[1]);
  pool_release_to(0);
  kiln_release(x), kiln_release(c);
}

/* ======================================================================== */
/* 5. backward after the forward was flushed                                */
/* ======================================================================== */

static const double AV12[12] = {0.5, -0.3, 0.8, 1.1, 0.2, -0.7, -0.4, 0.9, 0.3, 0.6, -1.2, 0.1};
static const double XV3[3] = {0.7, -0.4, 1.2};

/* mode 0: lazy; 1: kiln_item(loss) first; 2: kiln_sync() first;
   3: an intermediate read first; 4: loss read, then more ops on it */
static void tanh_ax_grads(int mode, double *gx, double *gA) {
  kiln_tensor *A = leaf(2, S(4, 3), AV12), *x = leaf(1, S(3), XV3);
  kiln_tensor *z = T(kiln_matmul(A, x));
  kiln_tensor *loss = T(sum_all(T(kiln_tanh(z))));
  if (mode == 1) {
    double v = kiln_item(loss), e = 0;
    for (int i = 0; i < 4; i++) {
      double zi = 0;
      for (int j = 0; j < 3; j++) zi += AV12[i * 3 + j] * XV3[j];
      e += tanh(zi);
    }
    CHECK_CLOSE(v, e, 1e-14);
  }
  if (mode == 2) CHECK_EQ_INT(kiln_sync(), 0);
  if (mode == 3) free(ktest_values(z));
  if (mode == 4) {
    kiln_item(loss);
    loss = T(kiln_mul_scalar(loss, 1.0));
  }
  CHECK_EQ_INT(kiln_backward(loss, NULL), 0);
  kiln_tensor *g1 = kiln_grad(x), *g2 = kiln_grad(A);
  CHECK(g1 && g2);
  if (g1 && g2) {
    double *a = ktest_values(g1), *b = ktest_values(g2);
    memcpy(gx, a, 3 * sizeof(double));
    memcpy(gA, b, 12 * sizeof(double));
    free(a), free(b);
  }
  kiln_release(g1), kiln_release(g2);
  pool_release_to(0);
  kiln_release(A), kiln_release(x);
}

TEST(backward_after_flush) {
  double ex[3], eA[12], hv[3];
  tanh_ax_ref(AV12, XV3, XV3, 4, 3, ex, eA, hv);
  for (int mode = 0; mode < 5; mode++) {
    double gx[3] = {0}, gA[12] = {0};
    tanh_ax_grads(mode, gx, gA);
    for (int i = 0; i < 3; i++)
      if (fabs(gx[i] - ex[i]) > 1e-13)
        KTEST_FAIL("mode %d: dx[%d] %.17g, expected %.17g", mode, i, gx[i], ex[i]);
    for (int i = 0; i < 12; i++)
      if (fabs(gA[i] - eA[i]) > 1e-13)
        KTEST_FAIL("mode %d: dA[%d] %.17g, expected %.17g", mode, i, gA[i], eA[i]);
  }
}

/* ======================================================================== */
/* 6. in-place update of a parameter between backward passes                */
/* ======================================================================== */

TEST(in_place_update_then_backward) {
  static const double w0[6] = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6};
  kiln_tensor *w = leaf(2, S(2, 3), w0), *x = tf64(2, S(2, 3), XV6);
  kiln_tensor *l1 = T(sum_all(T(kiln_mul(w, x))));
  CHECK_EQ_INT(kiln_backward(l1, NULL), 0);
  kiln_tensor *g = kiln_grad(w);
  CHECK(g != NULL);
  if (!g) {
    pool_release_to(0);
    kiln_release(w), kiln_release(x);
    return;
  }
  CHECK_VALUES(g, 6, XV6, 1e-15, 0);
  CHECK_EQ_INT(kiln_sub_scaled_(w, g, 0.1), 0);
  kiln_release(g);
  CHECK(kiln_requires_grad(w));
  CHECK_EQ_INT(kiln_zero_grad(w), 0);
  kiln_tensor *l2 = T(sum_all(T(kiln_mul(w, x))));
  CHECK(kiln_requires_grad(l2));
  CHECK_EQ_INT(kiln_backward(l2, NULL), 0);
  CHECK_GRAD(w, 6, XV6, 1e-15);
  double ew[6], el2 = 0, el1 = 0;
  for (int i = 0; i < 6; i++)
    ew[i] = w0[i] - 0.1 * XV6[i], el2 += ew[i] * XV6[i], el1 += w0[i] * XV6[i];
  CHECK_VALUES(w, 6, ew, 1e-15, 1e-15);
  CHECK_CLOSE(kiln_item(l2), el2, 1e-14);
  CHECK_CLOSE(kiln_item(l1), el1, 1e-14); /* the old loss keeps the old value */
  /* a few more SGD steps: w_k = w0 - 0.1 k x; grad stays x */
  for (int step = 2; step <= 4; step++) {
    kiln_tensor *gg = kiln_grad(w);
    CHECK_EQ_INT(kiln_sub_scaled_(w, gg, 0.1), 0);
    kiln_release(gg);
    CHECK_EQ_INT(kiln_zero_grad(w), 0);
    CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_mul(w, x)))), NULL), 0);
    CHECK_GRAD(w, 6, XV6, 1e-15);
  }
  for (int i = 0; i < 6; i++) ew[i] = w0[i] - 0.4 * XV6[i];
  CHECK_VALUES(w, 6, ew, 1e-14, 1e-14);
  pool_release_to(0);
  kiln_release(w), kiln_release(x);
}

/* a nonlinear loss: w <- w - lr * grad twice, checked against a host loop */
TEST(in_place_sgd_nonlinear) {
  static const double w0[3] = {0.3, -0.6, 0.9};
  double wh[3];
  memcpy(wh, w0, sizeof wh);
  kiln_tensor *w = leaf(1, S(3), w0);
  kiln_tensor *A = tf64(2, S(4, 3), AV12);
  for (int step = 0; step < 3; step++) {
    CHECK_EQ_INT(kiln_zero_grad(w), 0);
    kiln_tensor *l = T(sum_all(T(kiln_tanh(T(kiln_matmul(A, w))))));
    CHECK_EQ_INT(kiln_backward(l, NULL), 0);
    double gh[3], ga[12], hv[3];
    tanh_ax_ref(AV12, wh, wh, 4, 3, gh, ga, hv);
    CHECK_GRAD(w, 3, gh, 1e-13);
    kiln_tensor *g = kiln_grad(w);
    CHECK_EQ_INT(kiln_sub_scaled_(w, g, 0.5), 0);
    kiln_release(g);
    for (int j = 0; j < 3; j++) wh[j] -= 0.5 * gh[j];
    pool_release_to(0);
  }
  CHECK_VALUES(w, 3, wh, 1e-13, 1e-13);
  kiln_release(w), kiln_release(A);
}

/* the update inside no_grad (the usual optimizer step); a loss built
   before the update differentiates at the old value */
TEST(in_place_update_in_no_grad_and_old_loss) {
  static const double w0[3] = {1.0, 2.0, 3.0};
  kiln_tensor *w = leaf(1, S(3), w0);
  kiln_tensor *old_loss = T(sum_all(T(kiln_mul(w, w))));
  kiln_tensor *one = T(kiln_ones(F64, 1, S(3)));
  kiln_no_grad_push();
  CHECK_EQ_INT(kiln_sub_scaled_(w, one, 1.0), 0);
  kiln_no_grad_pop();
  CHECK(kiln_requires_grad(w));
  CHECK_VALUES(w, 3, D(0, 1, 2), 0, 0);
  CHECK_EQ_INT(kiln_backward(old_loss, NULL), 0);
  CHECK_GRAD(w, 3, D(2, 4, 6), 0); /* 2 w0, not 2 w1 */
  CHECK_CLOSE(kiln_item(old_loss), 14.0, 0);
  CHECK_EQ_INT(kiln_zero_grad(w), 0);
  CHECK_EQ_INT(kiln_backward(T(sum_all(T(kiln_mul(w, w)))), NULL), 0);
  CHECK_GRAD(w, 3, D(0, 2, 4), 0);
  pool_release_to(0);
  kiln_release(w);
}

int main(void) {
  RUN(gradcheck_sanity_cube);
  RUN(grad_unary);
  RUN(grad_scalar_ops);
  RUN(grad_binary_broadcast);
  RUN(grad_input_used_twice);
  RUN(grad_where);
  RUN(grad_reductions);
  RUN(grad_prod_with_zeros);
  RUN(grad_matmul);
  RUN(grad_views);
  RUN(grad_concat_stack);
  RUN(grad_sibling_slices);
  RUN(sliced_backward_is_linear);
  RUN(grad_index_select_gather);
  RUN(grad_softmax_family);
  RUN(grad_layer_norm);
  RUN(grad_losses);
  RUN(grad_nondifferentiable_ops_contribute_nothing);
  RUN(grad_cast_between_floats);
  RUN(grad_f32);
  RUN(second_derivative_of_cubic);
  RUN(hvp_cubic);
  RUN(hvp_tanh_ax);
  RUN(grad_of_grad_gradcheck);
  RUN(requires_grad_flags);
  RUN(backward_accumulates);
  RUN(backward_same_loss_twice);
  RUN(zero_grad_clears);
  RUN(no_grad_scope);
  RUN(enable_grad_inside_no_grad);
  RUN(detach_stops_gradient);
  RUN(backward_with_explicit_grad);
  RUN(autodiff_errors);
  RUN(grad_of_contract);
  RUN(grad_large_logits_stable);
  RUN(grad_mixed_dtypes);
  RUN(grad_scatter_add);
  RUN(backward_on_a_leaf);
  RUN(a_leaf_gradient_never_aliases_the_callers_tensors);
  RUN(set_grad_replaces_a_leafs_gradient);
  RUN(grad_of_more);
  RUN(backward_through_a_deep_graph);
  RUN(backward_misc);
  RUN(backward_after_flush);
  RUN(in_place_update_then_backward);
  RUN(in_place_sgd_nonlinear);
  RUN(in_place_update_in_no_grad_and_old_loss);
  printf("%d gradient elements checked against finite differences\n", g_gc_checks);
  return ktest_done();
}
