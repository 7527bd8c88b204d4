/* test_composite.c — the neural-network composites and the primitives they
 * lean on: softmax, log_softmax, logsumexp (rows of -inf, values of 1000),
 * layer_norm (with and without weight/bias, eps), cross_entropy (i64
 * targets), mse_loss, mean, gelu, relu and stack, for f32 (relative 1e-5) and
 * f64 (1e-12) against references computed here in double, plus the shape
 * errors of cross_entropy, layer_norm and stack. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ktest.h"

/* ---- helpers ------------------------------------------------------------ */

#define BOOL_ KILN_BOOL
#define I32 KILN_I32
#define I64 KILN_I64
#define F32 KILN_F32
#define F64 KILN_F64

/* literal arrays that survive being macro arguments: D(1, 2), S(2, 3) */
#define D(...) ((const double[]){__VA_ARGS__})
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NV(...) ((int)(sizeof(D(__VA_ARGS__)) / sizeof(double)))
#define NDIM(shape) ((int)(sizeof(shape) / sizeof(int64_t)))

static const kiln_dtype FLOAT_DTYPES[2] = {KILN_F32, KILN_F64};

/* the tolerance for a composite computed in dt */
static double tol_of(kiln_dtype dt) { return dt == KILN_F32 ? 1e-5 : 1e-12; }

/* every tensor a test creates as an input goes here; RUN_T releases them */
static kiln_tensor *pool[1024];
static int npool;

static kiln_tensor *own(kiln_tensor *t) {
  if (!t) {
    KTEST_FAIL("setup op returned NULL: %s", kiln_last_error());
    return NULL;
  }
  if (npool == (int)(sizeof pool / sizeof pool[0])) {
    KTEST_FAIL("test tensor pool is full");
    kiln_release(t);
    return NULL;
  }
  pool[npool++] = t;
  return t;
}

static void release_all(void) {
  while (npool > 0) kiln_release(pool[--npool]);
}

#define RUN_T(name) \
  do {              \
    RUN(name);      \
    release_all();  \
  } while (0)

/* a tensor of dtype dt and this shape from n doubles (converted) */
static kiln_tensor *makev(kiln_dtype dt, int ndim, const int64_t *shape, int64_t n,
                          const double *v) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel != n) {
    KTEST_FAIL("test bug: %lld values for %lld elements", (long long)n, (long long)numel);
    return NULL;
  }
  kiln_tensor *t = own(ktest_from_doubles(dt, ndim, shape, v));
  return t;
}

/* T(F32, S(2, 3), 1, 2, 3, 4, 5, 6); V(I32, 1, 2, 3) is 1-d; EMPTY has no elements */
#define T(dt, shape, ...) makev(dt, NDIM(shape), shape, NV(__VA_ARGS__), D(__VA_ARGS__))
#define V(dt, ...) T(dt, S(NV(__VA_ARGS__)), __VA_ARGS__)
#define EMPTY(dt, shape) makev(dt, NDIM(shape), shape, 0, D(0))

static kiln_tensor *scalar0(double v, kiln_dtype dt) { return own(kiln_scalar(v, dt)); }

static void print_context(int line, const char *what, kiln_tensor *r) {
  fprintf(stderr, "    at %s:%d: %s", __FILE__, line, what);
  if (r) {
    fprintf(stderr, " -> %s [", ktest_dtype_name(kiln_dtype_of(r)));
    for (int d = 0; d < kiln_ndim(r); d++)
      fprintf(stderr, "%s%lld", d ? "," : "", (long long)kiln_shape(r)[d]);
    fprintf(stderr, "]");
  }
  fprintf(stderr, "\n");
}

/* r (released here) has dtype dt, this shape and these values within tol
   (CHECK_TENSOR's rule: relative above 1, absolute below); expected values
   are rounded to f32 when dt is f32 */
static void expect_impl(int line, const char *what, kiln_tensor *r, kiln_dtype dt, int ndim,
                        const int64_t *shape, int64_t n, const double *expect, double tol) {
  int before = ktest_failed_checks;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel != n) {
    KTEST_FAIL("test bug: %lld expected values for %lld elements", (long long)n, (long long)numel);
  } else if (!r) {
    KTEST_FAIL("result is NULL: %s", kiln_last_error());
  } else {
    if (kiln_dtype_of(r) != dt)
      KTEST_FAIL("dtype is %s, expected %s", ktest_dtype_name(kiln_dtype_of(r)),
                 ktest_dtype_name(dt));
    double *e = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) e[i] = dt == KILN_F32 ? (double)(float)expect[i] : expect[i];
    CHECK_TENSOR(r, ndim, shape, e, tol);
    free(e);
  }
  if (ktest_failed_checks != before) print_context(line, what, r);
  kiln_release(r);
}

#define EXPECT_AT(what, expr, dt, shape, tol, ...) \
  expect_impl(__LINE__, what, (expr), dt, NDIM(shape), shape, NV(__VA_ARGS__), D(__VA_ARGS__), tol)
/* EXPECT(kiln_add(a, b), F32, S(2, 2), tol, 1, 2, 3, 4); EXPECT_V: 1-d of that many values */
#define EXPECT(expr, dt, shape, tol, ...) EXPECT_AT(#expr, expr, dt, shape, tol, __VA_ARGS__)
#define EXPECT_V(expr, dt, tol, ...) \
  EXPECT_AT(#expr, expr, dt, S(NV(__VA_ARGS__)), tol, __VA_ARGS__)
#define EXPECT_0D(expr, dt, tol, value) \
  expect_impl(__LINE__, #expr, (expr), dt, 0, S(0), 1, D(value), tol)
/* computed expectations: EXPECT_A(expr, dt, shape, tol, double array) */
#define EXPECT_A(expr, dt, shape, tol, arr)                    \
  expect_impl(__LINE__, #expr, (expr), dt, NDIM(shape), shape, \
              (int64_t)(sizeof(arr) / sizeof(double)), arr, tol)

/* ---- references (double) over a [rows, cols] matrix along axis 0 or 1 ---- */

/* logsumexp of n values x[0], x[stride], ... (max-shifted; all -inf gives -inf) */
static double ref_lse(const double *x, int n, int stride) {
  double m = -INFINITY;
  for (int i = 0; i < n; i++) m = fmax(m, x[i * stride]);
  if (m == -INFINITY || m == INFINITY) return m;
  double s = 0;
  for (int i = 0; i < n; i++) s += exp(x[i * stride] - m);
  return m + log(s);
}

/* x rounded to dt, so f32 references start from the stored inputs */
static void quant_all(kiln_dtype dt, const double *x, int n, double *out) {
  for (int i = 0; i < n; i++) out[i] = ktest_as_dtype(dt, x[i]);
}

typedef enum { R_SOFTMAX, R_LOG_SOFTMAX } ref_kind;

/* softmax or log_softmax of the rows x cols matrix x along axis into out */
static void ref_softmax(ref_kind kind, const double *x, int rows, int cols, int axis, double *out) {
  int nlines = axis == 1 ? rows : cols, len = axis == 1 ? cols : rows;
  int stride = axis == 1 ? 1 : cols;
  for (int l = 0; l < nlines; l++) {
    int start = axis == 1 ? l * cols : l;
    double lse = ref_lse(x + start, len, stride);
    for (int i = 0; i < len; i++) {
      double v = x[start + i * stride] - lse;
      out[start + i * stride] = kind == R_SOFTMAX ? exp(v) : v;
    }
  }
}

/* layer norm of each row of length n: (x - mean) / sqrt(var + eps) * w + b,
   var biased (divided by n); w and b may be NULL */
static void ref_layer_norm(const double *x, int rows, int n, const double *w, const double *b,
                           double eps, double *out) {
  for (int r = 0; r < rows; r++) {
    const double *row = x + r * n;
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += row[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (row[i] - mean) * (row[i] - mean);
    var /= n;
    for (int i = 0; i < n; i++) {
      double y = (row[i] - mean) / sqrt(var + eps);
      out[r * n + i] = y * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
  }
}

/* mean over rows of logsumexp(row) - row[target] */
static double ref_cross_entropy(const double *x, int rows, int cols, const int64_t *target) {
  double s = 0;
  for (int r = 0; r < rows; r++) s += ref_lse(x + r * cols, cols, 1) - x[r * cols + target[r]];
  return s / rows;
}

static double ref_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* ---- softmax ---- */

/* rows: ordinary, large (1000: exp would overflow), with -inf entries, mixed */
static const double SM_X[16] = {1,         2,    3,         4,   /* */
                                1000,      1000, 999,       998, /* */
                                -INFINITY, 0,    -INFINITY, 1,   /* */
                                -0.5,      0.25, 0.1,       -3};

TEST(softmax_last_axis_matches_reference_f32_f64) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[16], want[16];
    quant_all(dt, SM_X, 16, x);
    ref_softmax(R_SOFTMAX, x, 4, 4, 1, want);
    kiln_tensor *t = makev(dt, 2, S(4, 4), 16, SM_X);
    EXPECT_A(kiln_softmax(t, 1), dt, S(4, 4), tol_of(dt), want);
    EXPECT_A(kiln_softmax(t, -1), dt, S(4, 4), tol_of(dt), want);
  }
}

TEST(softmax_literal_values_large_inputs_and_neg_inf) {
  /* [0, ln 3] -> [1/4, 3/4]; shifting by 1000 changes nothing; -inf -> exactly 0 */
  EXPECT(kiln_softmax(T(F64, S(3, 2), 0, log(3.0), 1000, 1000 + log(3.0), -INFINITY, 5), 1), F64,
         S(3, 2), 1e-12, 0.25, 0.75, 0.25, 0.75, 0, 1);
  EXPECT(kiln_softmax(T(F32, S(3, 2), 0, log(3.0), 1000, 1000, -INFINITY, 5), 1), F32, S(3, 2),
         1e-5, 0.25, 0.75, 0.5, 0.5, 0, 1);
  EXPECT_V(kiln_softmax(V(F32, -1000, -1000, -1000, -1000), 0), F32, 1e-6, 0.25, 0.25, 0.25, 0.25);
}

TEST(softmax_axis0_and_transposed_input) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[16], want[16];
    quant_all(dt, SM_X, 16, x);
    ref_softmax(R_SOFTMAX, x, 4, 4, 0, want);
    kiln_tensor *t = makev(dt, 2, S(4, 4), 16, SM_X);
    EXPECT_A(kiln_softmax(t, 0), dt, S(4, 4), tol_of(dt), want);
    EXPECT_A(kiln_softmax(t, -2), dt, S(4, 4), tol_of(dt), want);
    /* softmax over the last axis of the transpose is the transpose of axis 0 */
    double wt[16];
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) wt[i * 4 + j] = want[j * 4 + i];
    EXPECT_A(kiln_softmax(own(kiln_transpose(t, 0, 1)), 1), dt, S(4, 4), tol_of(dt), wt);
  }
}

TEST(softmax_3d_middle_axis) {
  double x[24], want[24];
  for (int i = 0; i < 24; i++) x[i] = sin(i * 1.3) * 4;
  /* [2,3,4] along axis 1: for each (a, c) the 3 values x[a][.][c] */
  for (int a = 0; a < 2; a++)
    for (int c = 0; c < 4; c++) {
      double lse = ref_lse(x + a * 12 + c, 3, 4);
      for (int b = 0; b < 3; b++) want[a * 12 + b * 4 + c] = exp(x[a * 12 + b * 4 + c] - lse);
    }
  EXPECT_A(kiln_softmax(makev(F64, 3, S(2, 3, 4), 24, x), 1), F64, S(2, 3, 4), 1e-12, want);
}

/* ---- log_softmax ---- */

TEST(log_softmax_matches_reference_f32_f64_both_axes) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[16], want[16];
    quant_all(dt, SM_X, 16, x);
    kiln_tensor *t = makev(dt, 2, S(4, 4), 16, SM_X);
    ref_softmax(R_LOG_SOFTMAX, x, 4, 4, 1, want);
    EXPECT_A(kiln_log_softmax(t, 1), dt, S(4, 4), tol_of(dt), want);
    ref_softmax(R_LOG_SOFTMAX, x, 4, 4, 0, want);
    EXPECT_A(kiln_log_softmax(t, 0), dt, S(4, 4), tol_of(dt), want);
  }
}

TEST(log_softmax_large_values_and_neg_inf_literal) {
  /* log_softmax([1000, 1000]) = -ln 2 (no overflow); -inf entries stay -inf;
     a tiny probability is not rounded to log(0) */
  EXPECT(kiln_log_softmax(T(F64, S(3, 2), 1000, 1000, -INFINITY, 2, 0, -800), 1), F64, S(3, 2),
         1e-12, -log(2.0), -log(2.0), -INFINITY, 0, -log1p(exp(-800.0)), -800);
  EXPECT(kiln_log_softmax(T(F32, S(3, 2), 1000, 1000, -INFINITY, 2, 0, -200), 1), F32, S(3, 2),
         1e-5, -log(2.0), -log(2.0), -INFINITY, 0, 0, -200);
}

/* ---- logsumexp ---- */

TEST(logsumexp_axis1_keepdim_and_axis0) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[16], rows[4], cols[4];
    quant_all(dt, SM_X, 16, x);
    for (int i = 0; i < 4; i++) rows[i] = ref_lse(x + i * 4, 4, 1);
    for (int j = 0; j < 4; j++) cols[j] = ref_lse(x + j, 4, 4);
    kiln_tensor *t = makev(dt, 2, S(4, 4), 16, SM_X);
    EXPECT_A(kiln_logsumexp(t, 1, false), dt, S(4), tol_of(dt), rows);
    EXPECT_A(kiln_logsumexp(t, -1, true), dt, S(4, 1), tol_of(dt), rows);
    EXPECT_A(kiln_logsumexp(t, 0, false), dt, S(4), tol_of(dt), cols);
    EXPECT_A(kiln_logsumexp(t, 0, true), dt, S(1, 4), tol_of(dt), cols);
  }
}

TEST(logsumexp_row_of_neg_inf_is_neg_inf_and_large_values_do_not_overflow) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    kiln_tensor *t = T(dt, S(4, 3), 1, 2, 3,            /* */
                       1000, 1000, 1000,                /* */
                       -INFINITY, -INFINITY, -INFINITY, /* */
                       -1000, -1000, -1001);
    EXPECT_V(kiln_logsumexp(t, 1, false), dt, tol_of(dt), 3 + log(1 + exp(-1.0) + exp(-2.0)),
             1000 + log(3.0), -INFINITY, -1000 + log(2 + exp(-1.0)));
  }
  EXPECT_0D(kiln_logsumexp(V(F64, -INFINITY, -INFINITY), 0, false), F64, 0, -INFINITY);
  EXPECT_V(kiln_logsumexp(V(F32, 100, 100), 0, true), F32, 1e-5, 100 + log(2.0));
}

/* ---- layer_norm ---- */

static const double LN_X[12] = {1, 2, 3, 4, /* */ -1, 0, 0, 5, /* */ 0.5, 0.25, -2, 10};
static const double LN_W[4] = {1, 2, 0.5, -1};
static const double LN_B[4] = {0, 0.1, -0.2, 3};

TEST(layer_norm_without_affine_f32_f64) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[12], want[12];
    quant_all(dt, LN_X, 12, x);
    ref_layer_norm(x, 3, 4, NULL, NULL, 1e-5, want);
    EXPECT_A(kiln_layer_norm(makev(dt, 2, S(3, 4), 12, LN_X), NULL, NULL, 1e-5), dt, S(3, 4),
             tol_of(dt), want);
  }
  /* literal: [1,2,3,4] has mean 2.5, biased variance 1.25 */
  double r = 1 / sqrt(1.25 + 1e-5);
  EXPECT_V(kiln_layer_norm(V(F64, 1, 2, 3, 4), NULL, NULL, 1e-5), F64, 1e-12, -1.5 * r, -0.5 * r,
           0.5 * r, 1.5 * r);
}

TEST(layer_norm_with_weight_and_bias_f32_f64) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[12], w[4], b[4], want[12];
    quant_all(dt, LN_X, 12, x);
    quant_all(dt, LN_W, 4, w);
    quant_all(dt, LN_B, 4, b);
    ref_layer_norm(x, 3, 4, w, b, 1e-5, want);
    kiln_tensor *tx = makev(dt, 2, S(3, 4), 12, LN_X);
    kiln_tensor *tw = makev(dt, 1, S(4), 4, LN_W);
    kiln_tensor *tb = makev(dt, 1, S(4), 4, LN_B);
    EXPECT_A(kiln_layer_norm(tx, tw, tb, 1e-5), dt, S(3, 4), tol_of(dt), want);
    /* weight only, bias only */
    ref_layer_norm(x, 3, 4, w, NULL, 1e-5, want);
    EXPECT_A(kiln_layer_norm(tx, tw, NULL, 1e-5), dt, S(3, 4), tol_of(dt), want);
    ref_layer_norm(x, 3, 4, NULL, b, 1e-5, want);
    EXPECT_A(kiln_layer_norm(tx, NULL, tb, 1e-5), dt, S(3, 4), tol_of(dt), want);
  }
}

TEST(layer_norm_eps_is_added_to_variance_inside_sqrt) {
  /* var([1,2,3,4]) = 1.25; with eps 1: (x - 2.5) / sqrt(2.25) = (x - 2.5) / 1.5 */
  EXPECT_V(kiln_layer_norm(V(F64, 1, 2, 3, 4), NULL, NULL, 1.0), F64, 1e-12, -1, -1.0 / 3, 1.0 / 3,
           1);
  EXPECT_V(kiln_layer_norm(V(F32, 1, 2, 3, 4), NULL, NULL, 1.0), F32, 1e-5, -1, -1.0 / 3, 1.0 / 3,
           1);
  /* a constant row has zero variance: the output is 0 (then the bias), not NaN */
  kiln_tensor *b = V(F64, 0.5, -0.5, 0, 7);
  EXPECT(kiln_layer_norm(T(F64, S(2, 4), 3, 3, 3, 3, -2, -2, -2, -2), NULL, b, 1e-5), F64, S(2, 4),
         1e-12, 0.5, -0.5, 0, 7, 0.5, -0.5, 0, 7);
}

TEST(layer_norm_3d_normalizes_last_axis_only) {
  double x[12], want[12];
  for (int i = 0; i < 12; i++) x[i] = ktest_as_dtype(F32, cos(i * 0.7) * 3 + i * 0.1);
  double w[3] = {1.5, -1, 0.25}, b[3] = {0, 1, -1};
  ref_layer_norm(x, 4, 3, w, b, 1e-5, want);
  EXPECT_A(kiln_layer_norm(makev(F32, 3, S(2, 2, 3), 12, x), makev(F32, 1, S(3), 3, w),
                           makev(F32, 1, S(3), 3, b), 1e-5),
           F32, S(2, 2, 3), 1e-5, want);
}

/* issue 13: layer_norm of zeros([1,2,2^31,0]) asked for 16 GiB: the row
   statistics (2^32 means and variances of empty rows) were computed although
   the result has no elements.  Empty inputs give empty results at once; the
   process must not grow (a 16 GiB NaN fill would show in ru_maxrss). */
static void expect_empty(kiln_tensor *t, kiln_dtype dt, int nd, const int64_t *shape) {
  CHECK(t != NULL);
  if (!t) return;
  CHECK_EQ_INT(kiln_dtype_of(t), dt);
  CHECK_EQ_INT(kiln_ndim(t), nd);
  for (int d = 0; d < nd && d < kiln_ndim(t); d++) CHECK_EQ_INT(kiln_shape(t)[d], shape[d]);
  float none;
  CHECK_EQ_INT(kiln_to_buffer(t, &none, 0), 0);
  kiln_release(t);
}

static long max_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

TEST(layer_norm_softmax_of_empty_rows_allocate_nothing_large) {
  long before = max_rss_mib();
  const int64_t *shape = S(1, 2, (int64_t)1 << 31, 0);
  kiln_tensor *x = own(kiln_zeros(F32, 4, shape));
  kiln_tensor *w = own(kiln_zeros(F32, 1, S(0)));
  kiln_tensor *outs[4] = {kiln_layer_norm(x, NULL, NULL, 1e-5), kiln_layer_norm(x, w, w, 1e-5),
                          kiln_softmax(x, -1), kiln_log_softmax(x, 3)};
  for (int i = 0; i < 4; i++) {
    CHECK(outs[i] != NULL);
    if (!outs[i]) continue;
    CHECK_EQ_INT(kiln_ndim(outs[i]), 4);
    for (int d = 0; d < 4; d++) CHECK_EQ_INT(kiln_shape(outs[i])[d], shape[d]);
    CHECK_EQ_INT(kiln_numel(outs[i]), 0);
  }
  CHECK_EQ_INT(kiln_sync(), 0);
  float none;
  for (int i = 0; i < 4; i++) {
    if (outs[i]) CHECK_EQ_INT(kiln_to_buffer(outs[i], &none, 0), 0);
    kiln_release(outs[i]);
  }
  /* rows of zero length along another axis, and an empty batch */
  kiln_tensor *rows = own(kiln_zeros(F64, 2, S(3, 0)));
  expect_empty(kiln_softmax(rows, 1), F64, 2, S(3, 0));
  expect_empty(kiln_layer_norm(own(kiln_zeros(F64, 2, S(0, 5))), NULL, NULL, 1e-5), F64, 2,
               S(0, 5));
  CHECK(max_rss_mib() - before < 512);
}

TEST(layer_norm_wrong_weight_or_bias_size_is_shape_error) {
  kiln_tensor *x = makev(F32, 2, S(3, 4), 12, LN_X);
  kiln_tensor *w3 = V(F32, 1, 1, 1);
  kiln_tensor *w4 = V(F32, 1, 1, 1, 1);
  kiln_tensor *b5 = V(F32, 0, 0, 0, 0, 0);
  CHECK_ERROR(kiln_layer_norm(x, w3, NULL, 1e-5), KILN_ERR_SHAPE, "kiln_layer_norm");
  CHECK_ERROR(kiln_layer_norm(x, w3, w4, 1e-5), KILN_ERR_SHAPE, "kiln_layer_norm");
  CHECK_ERROR(kiln_layer_norm(x, w4, b5, 1e-5), KILN_ERR_SHAPE, "kiln_layer_norm");
}

/* ---- cross_entropy ---- */

static const double CE_X[12] = {1, 2, 3, 4, /* */ 0, 0, 0, 0, /* */ 2, -1, 0.5, 1};
static const int64_t CE_T[3] = {3, 0, 1};

TEST(cross_entropy_hand_computed_f32_f64) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double x[12];
    quant_all(dt, CE_X, 12, x);
    /* row 0: lse - 4 = log(1 + e^-1 + e^-2 + e^-3); row 1: log 4;
       row 2: lse([2,-1,.5,1]) + 1 */
    double want = (log(1 + exp(-1.0) + exp(-2.0) + exp(-3.0)) + log(4.0) +
                   (2 + log(1 + exp(-3.0) + exp(-1.5) + exp(-1.0)) + 1)) /
                  3;
    CHECK_CLOSE(want, ref_cross_entropy(x, 3, 4, CE_T), 1e-12); /* the reference itself */
    kiln_tensor *logits = makev(dt, 2, S(3, 4), 12, CE_X);
    kiln_tensor *target = own(kiln_from_data(CE_T, I64, 1, S(3)));
    expect_impl(__LINE__, "kiln_cross_entropy(logits, target)", kiln_cross_entropy(logits, target),
                dt, 0, S(0), 1, &want, tol_of(dt));
  }
  /* uniform logits: log(number of classes) */
  kiln_tensor *z = T(F64, S(2, 4), 0, 0, 0, 0, 0, 0, 0, 0);
  kiln_tensor *t2 = own(kiln_from_data((const int64_t[]){0, 3}, I64, 1, S(2)));
  EXPECT_0D(kiln_cross_entropy(z, t2), F64, 1e-12, 1.3862943611198906);
}

TEST(cross_entropy_large_logits_are_stable) {
  /* target is the 1000 logit: loss ~ 0; target a 0 logit: loss ~ 1000 */
  kiln_tensor *logits = T(F32, S(2, 3), 1000, 0, 0, 1000, 0, 0);
  kiln_tensor *target = own(kiln_from_data((const int64_t[]){0, 1}, I64, 1, S(2)));
  EXPECT_0D(kiln_cross_entropy(logits, target), F32, 1e-5, (2 * exp(-1000.0) + 1000) / 2);
  kiln_tensor *l64 = T(F64, S(1, 3), -1000, -1000, -1001);
  kiln_tensor *t1 = own(kiln_from_data((const int64_t[]){2}, I64, 1, S(1)));
  EXPECT_0D(kiln_cross_entropy(l64, t1), F64, 1e-12, log(2 + exp(-1.0)) + 1);
}

TEST(cross_entropy_wrong_target_shape_is_shape_error) {
  kiln_tensor *logits = makev(F32, 2, S(3, 4), 12, CE_X);
  kiln_tensor *t2 = own(kiln_from_data((const int64_t[]){0, 1}, I64, 1, S(2)));
  kiln_tensor *t31 = own(kiln_from_data(CE_T, I64, 2, S(3, 1)));
  CHECK_ERROR(kiln_cross_entropy(logits, t2), KILN_ERR_SHAPE, "kiln_cross_entropy");
  CHECK_ERROR(kiln_cross_entropy(logits, t31), KILN_ERR_SHAPE, "kiln_cross_entropy");
}

/* issue 13: losses broadcast mismatched shapes silently ([38400,1,1] vs
   [38400,1] made 38400^2 values); now equal shapes are required */
TEST(mse_loss_of_mismatched_shapes_is_a_shape_error_naming_both) {
  kiln_tensor *a = own(kiln_zeros(F32, 2, S(3, 4))), *b = own(kiln_zeros(F32, 1, S(4)));
  CHECK_ERROR(kiln_mse_loss(a, b), KILN_ERR_SHAPE, "kiln_mse_loss");
  CHECK_ERROR(kiln_mse_loss(a, b), KILN_ERR_SHAPE, "[3,4] and [4]");
  CHECK_ERROR(kiln_mse_loss(b, a), KILN_ERR_SHAPE, "[4] and [3,4]");
  kiln_tensor *p = own(kiln_zeros(F32, 3, S(38400, 1, 1))),
              *q = own(kiln_zeros(F32, 2, S(38400, 1)));
  CHECK_ERROR(kiln_mse_loss(p, q), KILN_ERR_SHAPE, "[38400,1,1] and [38400,1]");
  CHECK_ERROR(kiln_mse_loss(own(kiln_scalar(1, F32)), b), KILN_ERR_SHAPE, "kiln_mse_loss");
  /* equal shapes, mixed float dtypes: promoted as before; empty: NaN */
  EXPECT_0D(kiln_mse_loss(V(F32, 1, 2), V(F64, 2, 2)), F64, 0, 0.5);
  EXPECT_0D(kiln_mse_loss(EMPTY(F32, S(0, 3)), EMPTY(F32, S(0, 3))), F32, 0, NAN);
}

TEST(cross_entropy_rejects_other_target_dtypes_and_shapes_clearly) {
  kiln_tensor *logits = makev(F32, 2, S(3, 4), 12, CE_X);
  CHECK_ERROR(kiln_cross_entropy(logits, V(F32, 3, 0, 1)), KILN_ERR_DTYPE, "kiln_cross_entropy");
  CHECK_ERROR(kiln_cross_entropy(logits, V(BOOL_, 1, 0, 1)), KILN_ERR_DTYPE, "bool");
  kiln_tensor *probs = own(kiln_zeros(F32, 2, S(3, 4))); /* probabilities: not this form */
  CHECK_ERROR(kiln_cross_entropy(logits, probs), KILN_ERR_DTYPE, "kiln_cross_entropy");
  kiln_tensor *t3 = own(kiln_from_data(CE_T, I64, 1, S(3)));
  CHECK_ERROR(kiln_cross_entropy(own(kiln_zeros(F32, 1, S(4))), t3), KILN_ERR_SHAPE, "[N,C]");
  CHECK_ERROR(kiln_cross_entropy(own(kiln_zeros(F32, 3, S(3, 4, 1))), t3), KILN_ERR_SHAPE,
              "[3,4,1]");
  CHECK_ERROR(kiln_cross_entropy(logits, own(kiln_scalar(1, I64))), KILN_ERR_SHAPE, "[N]");
  CHECK_ERROR(kiln_cross_entropy(V(I64, 1, 2), t3), KILN_ERR_SHAPE, "kiln_cross_entropy");
  /* an empty batch is the mean of nothing: NaN, as PyTorch */
  kiln_tensor *t0 = own(kiln_from_data(CE_T, I64, 1, S(0)));
  EXPECT_0D(kiln_cross_entropy(own(kiln_zeros(F32, 2, S(0, 4))), t0), F32, 0, NAN);
}

/* a label outside [0, C) is reported, when the loss is evaluated, as an
   error of kiln_cross_entropy naming the label (not of an internal gather) */
TEST(cross_entropy_label_out_of_range_names_the_op_and_the_label) {
  kiln_tensor *logits = makev(F32, 2, S(3, 4), 12, CE_X);
  const int64_t bad[2][3] = {{3, 0, 7}, {3, -1, 0}};
  const char *label[2] = {"7", "-1"};
  for (int k = 0; k < 2; k++) {
    kiln_clear_error();
    kiln_tensor *loss = kiln_cross_entropy(logits, own(kiln_from_data(bad[k], I64, 1, S(3))));
    double v = loss ? kiln_item(loss) : 0;
    CHECK(isnan(v));
    CHECK_STR_CONTAINS(kiln_last_error(), "kiln_cross_entropy");
    CHECK_STR_CONTAINS(kiln_last_error(), label[k]);
    CHECK_EQ_INT(kiln_last_status(), KILN_ERR_ARG);
    kiln_release(loss);
  }
  kiln_clear_error();
}

/* ---- mse_loss, mean ---- */

TEST(mse_loss_is_mean_squared_difference_f32_f64) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    /* diffs -0.5, 0, 2, -0.5: squares sum to 4.5, mean 1.125 */
    EXPECT_0D(kiln_mse_loss(V(dt, 1, 2, 3, 4), V(dt, 1.5, 2, 1, 4.5)), dt, tol_of(dt), 1.125);
    EXPECT_0D(kiln_mse_loss(T(dt, S(2, 2), 0.1, -0.2, 0.3, 4), T(dt, S(2, 2), 0, 0, 0, 0)), dt,
              tol_of(dt),
              (ktest_as_dtype(dt, 0.1) * ktest_as_dtype(dt, 0.1) +
               ktest_as_dtype(dt, 0.2) * ktest_as_dtype(dt, 0.2) +
               ktest_as_dtype(dt, 0.3) * ktest_as_dtype(dt, 0.3) + 16) /
                  4);
  }
  EXPECT_0D(kiln_mse_loss(V(F64, 1, 1), V(F64, 1, 1)), F64, 0, 0);
}

TEST(mean_all_axes_keepdim_negative_axis) {
  kiln_tensor *x = T(F32, S(2, 3), 1, 2, 3, 4, 5, 6);
  const int ax1[1] = {1}, axm2[1] = {-2}, both[2] = {0, 1};
  EXPECT_0D(kiln_mean(x, 0, NULL, false), F32, 1e-6, 3.5);
  EXPECT_0D(kiln_mean(x, 2, both, false), F32, 1e-6, 3.5);
  EXPECT(kiln_mean(x, 2, both, true), F32, S(1, 1), 1e-6, 3.5);
  EXPECT(kiln_mean(x, 1, ax1, true), F32, S(2, 1), 1e-6, 2, 5);
  EXPECT_V(kiln_mean(x, 1, axm2, false), F32, 1e-6, 2.5, 3.5, 4.5);
  EXPECT_0D(kiln_mean(V(F64, 0.1, 0.2, 0.4), 0, NULL, false), F64, 1e-15, (0.1 + 0.2 + 0.4) / 3);
}

TEST(mean_of_integers_is_f32_and_of_nothing_is_nan) {
  EXPECT_0D(kiln_mean(V(I32, 1, 2, 4), 0, NULL, false), F32, 1e-6, 7.0 / 3);
  EXPECT_0D(kiln_mean(V(I64, -3, 4), 0, NULL, false), F32, 0, 0.5);
  EXPECT_0D(kiln_mean(EMPTY(F32, S(0)), 0, NULL, false), F32, 0, NAN);
  EXPECT_0D(kiln_mean(EMPTY(F64, S(0)), 0, NULL, false), F64, 0, NAN);
}

/* ---- gelu, relu ---- */

TEST(gelu_matches_erf_form_f32_f64) {
  const double xs[6] = {-3, -1, -0.5, 0, 0.5, 2};
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = FLOAT_DTYPES[k];
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = ref_gelu(ktest_as_dtype(dt, xs[i]));
    EXPECT_A(kiln_gelu(makev(dt, 2, S(2, 3), 6, xs)), dt, S(2, 3), tol_of(dt), want);
  }
  EXPECT_V(kiln_gelu(V(F64, 1, -1, 0)), F64, 1e-14, 0.8413447460685429, -0.15865525393145707, 0);
}

TEST(relu_zeroes_negatives_keeps_dtype) {
  EXPECT(kiln_relu(T(F64, S(2, 2), -1, 0, 2, NAN)), F64, S(2, 2), 0, 0, 0, 2, NAN);
  EXPECT(kiln_relu(T(F32, S(2, 2), -1e-30, 3.5, -INFINITY, INFINITY)), F32, S(2, 2), 0, 0, 3.5, 0,
         INFINITY);
  EXPECT(kiln_relu(T(I32, S(2, 2), -7, 7, 0, -1)), I32, S(2, 2), 0, 0, 7, 0, 0);
  EXPECT(kiln_relu(T(I64, S(1, 2), -5e12, 5e12)), I64, S(1, 2), 0, 0, 5e12);
}

/* ---- stack ---- */

TEST(stack_1d_along_axis_0_1_and_negative) {
  kiln_tensor *ts[3] = {V(F32, 1, 2), V(F32, 3, 4), V(F32, 5, 6)};
  EXPECT(kiln_stack(3, ts, 0), F32, S(3, 2), 0, 1, 2, 3, 4, 5, 6);
  EXPECT(kiln_stack(3, ts, 1), F32, S(2, 3), 0, 1, 3, 5, 2, 4, 6);
  EXPECT(kiln_stack(3, ts, -1), F32, S(2, 3), 0, 1, 3, 5, 2, 4, 6);
  EXPECT(kiln_stack(1, ts, 0), F32, S(1, 2), 0, 1, 2);
}

TEST(stack_2d_every_axis_and_other_dtypes) {
  kiln_tensor *ms[2] = {T(F64, S(2, 2), 1, 2, 3, 4), T(F64, S(2, 2), 5, 6, 7, 8)};
  EXPECT(kiln_stack(2, ms, 0), F64, S(2, 2, 2), 0, 1, 2, 3, 4, 5, 6, 7, 8);
  EXPECT(kiln_stack(2, ms, 1), F64, S(2, 2, 2), 0, 1, 2, 5, 6, 3, 4, 7, 8);
  EXPECT(kiln_stack(2, ms, 2), F64, S(2, 2, 2), 0, 1, 5, 2, 6, 3, 7, 4, 8);
  kiln_tensor *ss[3] = {scalar0(1, I64), scalar0(-2, I64), scalar0(3, I64)};
  EXPECT_V(kiln_stack(3, ss, 0), I64, 0, 1, -2, 3);
  kiln_tensor *is[2] = {V(I32, 7, 8, 9), V(I32, -1, -2, -3)};
  EXPECT(kiln_stack(2, is, 1), I32, S(3, 2), 0, 7, -1, 8, -2, 9, -3);
  /* a transposed (non-contiguous) member */
  kiln_tensor *m = T(F32, S(2, 2), 1, 2, 3, 4);
  kiln_tensor *tm[2] = {m, own(kiln_transpose(m, 0, 1))};
  EXPECT(kiln_stack(2, tm, 0), F32, S(2, 2, 2), 0, 1, 2, 3, 4, 1, 3, 2, 4);
}

TEST(stack_mismatched_shapes_is_shape_error) {
  kiln_tensor *ts[2] = {V(F32, 1, 2), V(F32, 1, 2, 3)};
  CHECK_ERROR(kiln_stack(2, ts, 0), KILN_ERR_SHAPE, "kiln_stack");
  kiln_tensor *ms[2] = {T(F32, S(2, 1), 1, 2), T(F32, S(1, 2), 1, 2)};
  CHECK_ERROR(kiln_stack(2, ms, 0), KILN_ERR_SHAPE, "kiln_stack");
}

/* torch.triu / torch.tril: j - i >= k kept (triu), j - i <= k (tril),
   the rest 0, over the last two dims of any dtype; every k, also past the
   matrix; the gradient flows where kept; a 1-d tensor is a shape error */
TEST(triu_and_tril_keep_the_triangles) {
  kiln_tensor *a = T(F64, S(3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  EXPECT(kiln_triu(a, 0), F64, S(3, 4), 0, 1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12);
  EXPECT(kiln_triu(a, 1), F64, S(3, 4), 0, 0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12);
  EXPECT(kiln_triu(a, -1), F64, S(3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12);
  EXPECT(kiln_tril(a, 0), F64, S(3, 4), 0, 1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0);
  EXPECT(kiln_tril(a, 2), F64, S(3, 4), 0, 1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11, 12);
  EXPECT(kiln_tril(a, -2), F64, S(3, 4), 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0);
  EXPECT(kiln_triu(a, 4), F64, S(3, 4), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  EXPECT(kiln_triu(a, INT64_MAX), F64, S(3, 4), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  EXPECT(kiln_triu(a, INT64_MIN), F64, S(3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  EXPECT(kiln_tril(a, INT64_MIN), F64, S(3, 4), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  /* leading dims: each matrix alike; integers and bool keep their dtype */
  kiln_tensor *b = T(I32, S(2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8);
  EXPECT(kiln_tril(b, 0), I32, S(2, 2, 2), 0, 1, 0, 3, 4, 5, 0, 7, 8);
  kiln_tensor *ones = own(kiln_ones(BOOL_, 2, S(3, 3)));
  EXPECT(kiln_triu(ones, 1), BOOL_, S(3, 3), 0, 0, 1, 1, 0, 0, 1, 0, 0, 0);
  /* the gradient of sum(triu(x) * w) is w where kept */
  kiln_tensor *x = own(kiln_randn(F64, 2, S(2, 3)));
  CHECK(kiln_set_requires_grad(x, true) == KILN_OK);
  kiln_tensor *w = T(F64, S(2, 3), 1, 2, 3, 4, 5, 6);
  kiln_tensor *u = own(kiln_triu(x, 0)), *p = own(kiln_mul(u, w));
  kiln_tensor *l = own(kiln_sum(p, 0, NULL, false));
  CHECK(kiln_backward(l, NULL) == KILN_OK);
  EXPECT(kiln_grad(x), F64, S(2, 3), 0, 1, 2, 3, 0, 5, 6);
  kiln_clear_error();
  CHECK(kiln_triu(own(kiln_ones(F32, 1, S(3))), 0) == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_triu");
  kiln_clear_error();
}

/* isnan, isinf, isfinite on every special value; integers are finite */
TEST(isnan_isinf_isfinite) {
  for (int k = 0; k < 3; k++) {
    kiln_dtype dt = k == 0 ? F32 : k == 1 ? F64 : KILN_BF16;
    kiln_tensor *a = V(dt, 1, -0.0, NAN, INFINITY, -INFINITY, 1e30);
    EXPECT(kiln_isnan(a), BOOL_, S(6), 0, 0, 0, 1, 0, 0, 0);
    EXPECT(kiln_isinf(a), BOOL_, S(6), 0, 0, 0, 0, 1, 1, 0);
    EXPECT(kiln_isfinite(a), BOOL_, S(6), 0, 1, 1, 0, 0, 0, 1); /* 1e30: finite in each */
  }
  kiln_tensor *i = V(I64, INT64_MIN, 0, 5);
  EXPECT(kiln_isnan(i), BOOL_, S(3), 0, 0, 0, 0);
  EXPECT(kiln_isinf(i), BOOL_, S(3), 0, 0, 0, 0);
  EXPECT(kiln_isfinite(i), BOOL_, S(3), 0, 1, 1, 1);
}

int main(void) {
  RUN_T(triu_and_tril_keep_the_triangles);
  RUN_T(isnan_isinf_isfinite);
  RUN_T(softmax_last_axis_matches_reference_f32_f64);
  RUN_T(softmax_literal_values_large_inputs_and_neg_inf);
  RUN_T(softmax_axis0_and_transposed_input);
  RUN_T(softmax_3d_middle_axis);
  RUN_T(log_softmax_matches_reference_f32_f64_both_axes);
  RUN_T(log_softmax_large_values_and_neg_inf_literal);
  RUN_T(logsumexp_axis1_keepdim_and_axis0);
  RUN_T(logsumexp_row_of_neg_inf_is_neg_inf_and_large_values_do_not_overflow);

  RUN_T(layer_norm_without_affine_f32_f64);
  RUN_T(layer_norm_with_weight_and_bias_f32_f64);
  RUN_T(layer_norm_eps_is_added_to_variance_inside_sqrt);
  RUN_T(layer_norm_3d_normalizes_last_axis_only);
  RUN_T(layer_norm_wrong_weight_or_bias_size_is_shape_error);
  RUN_T(layer_norm_softmax_of_empty_rows_allocate_nothing_large);

  RUN_T(cross_entropy_hand_computed_f32_f64);
  RUN_T(cross_entropy_large_logits_are_stable);
  RUN_T(cross_entropy_wrong_target_shape_is_shape_error);
  RUN_T(mse_loss_of_mismatched_shapes_is_a_shape_error_naming_both);
  RUN_T(cross_entropy_rejects_other_target_dtypes_and_shapes_clearly);
  RUN_T(cross_entropy_label_out_of_range_names_the_op_and_the_label);

  RUN_T(mse_loss_is_mean_squared_difference_f32_f64);
  RUN_T(mean_all_axes_keepdim_negative_axis);
  RUN_T(mean_of_integers_is_f32_and_of_nothing_is_nan);
  RUN_T(gelu_matches_erf_form_f32_f64);
  RUN_T(relu_zeroes_negatives_keeps_dtype);

  RUN_T(stack_1d_along_axis_0_1_and_negative);
  RUN_T(stack_2d_every_axis_and_other_dtypes);
  RUN_T(stack_mismatched_shapes_is_shape_error);
  return ktest_done();
}
