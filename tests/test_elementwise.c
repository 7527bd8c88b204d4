/* test_elementwise.c — every unary and binary elementwise op, the *_scalar
 * ops, where, clamp and cast, against literal expected arrays or libm in
 * double, for every dtype each op accepts (docs/SEMANTICS.md), checking the
 * result dtype too: NaN/inf/-0.0, NaN propagation, round half-to-even, integer
 * pow with negative exponents, cast saturation, and the dtype errors. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ktest.h"

/* ---- helpers ------------------------------------------------------------ */

#define TOL32 2e-6  /* f32 transcendental: a few ulp */
#define TOL64 1e-12 /* f64 transcendental */
#define PI 3.14159265358979323846

#define BOOL_ KILN_BOOL
#define I32 KILN_I32
#define I64 KILN_I64
#define F32 KILN_F32
#define F64 KILN_F64

/* literal arrays that survive being macro arguments: D(1, 2), S(2, 3) */
#define D(...) ((const double[]){__VA_ARGS__})
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NV(...) ((int)(sizeof(D(__VA_ARGS__)) / sizeof(double)))
#define NI(...) ((int)(sizeof(S(__VA_ARGS__)) / sizeof(int64_t)))
#define NDIM(shape) ((int)(sizeof(shape) / sizeof(int64_t)))

static const kiln_dtype ALL_DTYPES[5] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64};

/* every tensor a test creates as an input goes here; RUN_T releases them */
static kiln_tensor *pool[4096];
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

/* T(F32, S(2, 3), 1, 2, 3, 4, 5, 6); V(I32, 1, 2, 3) is 1-d */
#define T(dt, shape, ...) makev(dt, NDIM(shape), shape, NV(__VA_ARGS__), D(__VA_ARGS__))
#define V(dt, ...) T(dt, S(NV(__VA_ARGS__)), __VA_ARGS__)

/* exact int64 inputs (beyond 2^53) */
static kiln_tensor *make_i64(int n, const int64_t *v) {
  int64_t shape[1] = {n};
  return own(kiln_from_data(v, KILN_I64, 1, shape));
}
#define VI64(...) make_i64(NI(__VA_ARGS__), S(__VA_ARGS__))

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
   (CHECK_TENSOR's rule); expected values are rounded to f32 when dt is f32 */
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

/* r (released here) is i64 with exactly these values */
static void expect_i64_impl(int line, const char *what, kiln_tensor *r, int n,
                            const int64_t *expect) {
  int before = ktest_failed_checks;
  if (!r) {
    KTEST_FAIL("result is NULL: %s", kiln_last_error());
  } else if (kiln_dtype_of(r) != KILN_I64 || kiln_numel(r) != n) {
    KTEST_FAIL("expected %d i64 values, got %lld %s values", n, (long long)kiln_numel(r),
               ktest_dtype_name(kiln_dtype_of(r)));
  } else {
    int64_t *got = malloc(sizeof(int64_t) * (size_t)n);
    CHECK(kiln_to_buffer(r, got, sizeof(int64_t) * (size_t)n) >= 0);
    for (int i = 0; i < n; i++)
      if (got[i] != expect[i])
        KTEST_FAIL("[%d] = %lld, expected %lld", i, (long long)got[i], (long long)expect[i]);
    free(got);
  }
  if (ktest_failed_checks != before) print_context(line, what, r);
  kiln_release(r);
}
#define EXPECT_I64(expr, ...) \
  expect_i64_impl(__LINE__, #expr, (expr), NI(__VA_ARGS__), S(__VA_ARGS__))

/* signbit of each element of r (released here): 1 negative, 0 positive, -1 any */
static void expect_signbits_impl(int line, const char *what, kiln_tensor *r, int n,
                                 const int *neg) {
  int before = ktest_failed_checks;
  if (!r) {
    KTEST_FAIL("result is NULL: %s", kiln_last_error());
  } else if (kiln_numel(r) != n) {
    KTEST_FAIL("%lld elements, expected %d", (long long)kiln_numel(r), n);
  } else {
    double *v = ktest_values(r);
    for (int i = 0; i < n; i++)
      if (neg[i] >= 0 && (signbit(v[i]) != 0) != neg[i])
        KTEST_FAIL("[%d] = %g has the wrong sign (expected %s)", i, v[i],
                   neg[i] ? "negative" : "positive");
    free(v);
  }
  if (ktest_failed_checks != before) print_context(line, what, r);
  kiln_release(r);
}
#define EXPECT_SIGNBITS(expr, ...)                                              \
  expect_signbits_impl(__LINE__, #expr, (expr),                                 \
                       (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)), \
                       (const int[]){__VA_ARGS__})

/* |got - want| <= tol * |want| for each element (relative, also for tiny values) */
static void expect_rel_impl(int line, const char *what, kiln_tensor *r, kiln_dtype dt, int n,
                            const double *want, double tol) {
  int before = ktest_failed_checks;
  if (!r) {
    KTEST_FAIL("result is NULL: %s", kiln_last_error());
  } else if (kiln_dtype_of(r) != dt || kiln_numel(r) != n) {
    KTEST_FAIL("expected %d %s values, got %lld %s", n, ktest_dtype_name(dt),
               (long long)kiln_numel(r), ktest_dtype_name(kiln_dtype_of(r)));
  } else {
    double *v = ktest_values(r);
    for (int i = 0; i < n; i++)
      if (!(fabs(v[i] - want[i]) <= tol * fabs(want[i])))
        KTEST_FAIL("[%d] = %.17g, expected %.17g (relative tol %g)", i, v[i], want[i], tol);
    free(v);
  }
  if (ktest_failed_checks != before) print_context(line, what, r);
  kiln_release(r);
}

typedef kiln_tensor *(*unary_op)(kiln_tensor *);
typedef kiln_tensor *(*binary_op)(kiln_tensor *, kiln_tensor *);

/* op on x stored as `in` gives dtype `out` and ref(x as stored) (rounded to out) */
static void check_unary(int line, const char *what, unary_op op, double (*ref)(double),
                        kiln_dtype in, kiln_dtype out, double tol, int n, const double *x) {
  int64_t shape[1] = {n};
  kiln_tensor *a = makev(in, 1, shape, n, x);
  double *e = malloc(sizeof(double) * (size_t)n);
  for (int i = 0; i < n; i++) e[i] = ktest_as_dtype(out, ref(ktest_as_dtype(in, x[i])));
  expect_impl(line, what, op(a), out, 1, shape, n, e, tol);
  free(e);
}
#define UNARY(op, ref, in, out, tol, ...) \
  check_unary(__LINE__, #op " on " #in, op, ref, in, out, tol, NV(__VA_ARGS__), D(__VA_ARGS__))

static double ref_rsqrt(double x) { return 1.0 / sqrt(x); }
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* ---- transcendental unary ops: f32/f64 keep dtype, integers and bool give f32 ---- */

TEST(exp_floats_specials_and_ints_bool_give_f32) {
  UNARY(kiln_exp, exp, F64, F64, TOL64, 0, 1, -1, 0.5, -20, 700, 710, -INFINITY, INFINITY, NAN);
  UNARY(kiln_exp, exp, F32, F32, TOL32, 0, 1, -1, 0.5, -20, 88, 89, -INFINITY, INFINITY, NAN);
  UNARY(kiln_exp, exp, I32, F32, TOL32, -3, 0, 1, 5);
  UNARY(kiln_exp, exp, I64, F32, TOL32, -3, 0, 1, 5);
  UNARY(kiln_exp, exp, BOOL_, F32, TOL32, 0, 1);
  /* f64 is not computed in f32: exp(0.1) differs from its f32 value by ~1e-9 */
  EXPECT_V(kiln_exp(V(F64, 0.1)), F64, 1e-15, exp(0.1));
}

TEST(log_zero_is_neg_inf_negative_is_nan) {
  UNARY(kiln_log, log, F64, F64, TOL64, 1, 2.718281828459045, 0.5, 1e-300, 1e300, 0, -0.0, -1,
        INFINITY, -INFINITY, NAN);
  UNARY(kiln_log, log, F32, F32, TOL32, 1, 2.7182817, 0.5, 1e-30, 1e30, 0, -0.0, -1, INFINITY,
        -INFINITY, NAN);
  UNARY(kiln_log, log, I32, F32, TOL32, 1, 2, 10, 0, -3);
  UNARY(kiln_log, log, I64, F32, TOL32, 1, 2, 10, 0, -3);
  UNARY(kiln_log, log, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_log(V(F64, 0, -1, 1)), F64, 0, -INFINITY, NAN, 0);
}

TEST(sqrt_negative_is_nan_and_keeps_negative_zero) {
  UNARY(kiln_sqrt, sqrt, F64, F64, TOL64, 0, -0.0, 1, 2, 0.25, 1e300, -1, INFINITY, -INFINITY, NAN);
  UNARY(kiln_sqrt, sqrt, F32, F32, TOL32, 0, -0.0, 1, 2, 0.25, 1e30, -1, INFINITY, -INFINITY, NAN);
  UNARY(kiln_sqrt, sqrt, I32, F32, TOL32, 0, 1, 2, 9, -4);
  UNARY(kiln_sqrt, sqrt, I64, F32, TOL32, 0, 1, 2, 9, -4);
  UNARY(kiln_sqrt, sqrt, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_sqrt(V(F32, 4, 2.25, -1)), F32, 0, 2, 1.5, NAN);
  EXPECT_SIGNBITS(kiln_sqrt(V(F64, -0.0, 0.0)), 1, 0);
  EXPECT_SIGNBITS(kiln_sqrt(V(F32, -0.0, 0.0)), 1, 0);
}

TEST(rsqrt_of_zero_is_inf_of_inf_is_zero) {
  UNARY(kiln_rsqrt, ref_rsqrt, F64, F64, TOL64, 1, 4, 0.25, 2, 3, 1e-300, 0, -1, INFINITY, NAN);
  UNARY(kiln_rsqrt, ref_rsqrt, F32, F32, TOL32, 1, 4, 0.25, 2, 3, 1e-30, 0, -1, INFINITY, NAN);
  UNARY(kiln_rsqrt, ref_rsqrt, I32, F32, TOL32, 1, 4, 2, 0, -1);
  UNARY(kiln_rsqrt, ref_rsqrt, I64, F32, TOL32, 1, 4, 2, 0, -1);
  UNARY(kiln_rsqrt, ref_rsqrt, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_rsqrt(V(F64, 4, 0.25, 0, INFINITY)), F64, 0, 0.5, 2, INFINITY, 0);
}

TEST(sin_values_and_inf_is_nan) {
  UNARY(kiln_sin, sin, F64, F64, TOL64, 0, 0.5, -1, PI / 2, PI, 100, -1000, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_sin, sin, F32, F32, TOL32, 0, 0.5, -1, PI / 2, PI, 100, -1000, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_sin, sin, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_sin, sin, I64, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_sin, sin, BOOL_, F32, TOL32, 0, 1);
}

TEST(cos_values_and_inf_is_nan) {
  UNARY(kiln_cos, cos, F64, F64, TOL64, 0, 0.5, -1, PI / 2, PI, 100, -1000, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_cos, cos, F32, F32, TOL32, 0, 0.5, -1, PI / 2, PI, 100, -1000, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_cos, cos, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_cos, cos, I64, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_cos, cos, BOOL_, F32, TOL32, 0, 1);
}

TEST(tanh_saturates_to_plus_minus_one) {
  UNARY(kiln_tanh, tanh, F64, F64, TOL64, 0, 0.5, -1, 3, 1e-8, 20, -20, 400, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_tanh, tanh, F32, F32, TOL32, 0, 0.5, -1, 3, 1e-4, 20, -20, 400, INFINITY, -INFINITY,
        NAN);
  UNARY(kiln_tanh, tanh, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_tanh, tanh, I64, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_tanh, tanh, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_tanh(V(F64, INFINITY, -INFINITY, 400)), F64, 0, 1, -1, 1);
}

TEST(sigmoid_no_nan_for_large_magnitudes) {
  UNARY(kiln_sigmoid, ref_sigmoid, F64, F64, TOL64, 0, 1, -1, 5, -30, 30, 800, -800, INFINITY,
        -INFINITY, NAN);
  UNARY(kiln_sigmoid, ref_sigmoid, F32, F32, TOL32, 0, 1, -1, 5, -30, 30, 100, -100, INFINITY,
        -INFINITY, NAN);
  UNARY(kiln_sigmoid, ref_sigmoid, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_sigmoid, ref_sigmoid, I64, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_sigmoid, ref_sigmoid, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_sigmoid(V(F32, 0, 1000, -1000)), F32, 0, 0.5, 1, 0);
}

TEST(erf_odd_and_bounded) {
  UNARY(kiln_erf, erf, F64, F64, TOL64, 0, 0.5, -1, 2, 5, -0.1, INFINITY, -INFINITY, NAN);
  UNARY(kiln_erf, erf, F32, F32, TOL32, 0, 0.5, -1, 2, 5, -0.1, INFINITY, -INFINITY, NAN);
  UNARY(kiln_erf, erf, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_erf, erf, I64, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_erf, erf, BOOL_, F32, TOL32, 0, 1);
  EXPECT_V(kiln_erf(V(F64, 1, -1)), F64, 1e-15, 0.8427007929497149, -0.8427007929497149);
}

TEST(log1p_of_minus_one_is_neg_inf) {
  UNARY(kiln_log1p, log1p, F64, F64, TOL64, 0, -0.5, 1, 3, 1e-10, -1, -2, INFINITY, NAN);
  UNARY(kiln_log1p, log1p, F32, F32, TOL32, 0, -0.5, 1, 3, 1e-7, -1, -2, INFINITY, NAN);
  UNARY(kiln_log1p, log1p, I32, F32, TOL32, 0, 1, 3, -1, -2);
  UNARY(kiln_log1p, log1p, I64, F32, TOL32, 0, 1, 3, -1, -2);
  UNARY(kiln_log1p, log1p, BOOL_, F32, TOL32, 0, 1);
}

TEST(expm1_of_neg_inf_is_minus_one) {
  UNARY(kiln_expm1, expm1, F64, F64, TOL64, 0, 1, -1, 1e-10, 50, -50, -INFINITY, INFINITY, NAN);
  UNARY(kiln_expm1, expm1, F32, F32, TOL32, 0, 1, -1, 1e-7, 20, -20, 89, -INFINITY, INFINITY, NAN);
  UNARY(kiln_expm1, expm1, I32, F32, TOL32, -3, 0, 1, 5);
  UNARY(kiln_expm1, expm1, I64, F32, TOL32, -3, 0, 1, 5);
  UNARY(kiln_expm1, expm1, BOOL_, F32, TOL32, 0, 1);
}

TEST(log1p_expm1_relative_accuracy_near_zero) {
  /* log(1+x) and exp(x)-1 lose these digits; log1p/expm1 must not */
  double x64[3] = {1e-10, -1e-12, 3e-300};
  double w[3];
  for (int i = 0; i < 3; i++) w[i] = log1p(x64[i]);
  expect_rel_impl(__LINE__, "log1p f64", kiln_log1p(V(F64, 1e-10, -1e-12, 3e-300)), F64, 3, w,
                  1e-12);
  for (int i = 0; i < 3; i++) w[i] = expm1(x64[i]);
  expect_rel_impl(__LINE__, "expm1 f64", kiln_expm1(V(F64, 1e-10, -1e-12, 3e-300)), F64, 3, w,
                  1e-12);
  float x32[2] = {1e-7f, -3e-8f};
  for (int i = 0; i < 2; i++) w[i] = (float)log1p((double)x32[i]);
  expect_rel_impl(__LINE__, "log1p f32", kiln_log1p(V(F32, 1e-7, -3e-8)), F32, 2, w, 1e-6);
  for (int i = 0; i < 2; i++) w[i] = (float)expm1((double)x32[i]);
  expect_rel_impl(__LINE__, "expm1 f32", kiln_expm1(V(F32, 1e-7, -3e-8)), F32, 2, w, 1e-6);
}

TEST(gelu_exact_erf_form_floats_and_ints_give_f32) {
  UNARY(kiln_gelu, ref_gelu, F64, F64, TOL64, 0, 1, -1, 2.5, -3, 0.1, 10, -10, INFINITY, NAN);
  UNARY(kiln_gelu, ref_gelu, F32, F32, TOL32, 0, 1, -1, 2.5, -3, 0.1, 10, -10, INFINITY, NAN);
  UNARY(kiln_gelu, ref_gelu, I32, F32, TOL32, -2, 0, 1, 3);
  UNARY(kiln_gelu, ref_gelu, I64, F32, TOL32, -2, 0, 1, 3);
  /* the erf form, not the tanh approximation (which gives 0.8411920 at 1) */
  EXPECT_V(kiln_gelu(V(F64, 1, -1)), F64, 1e-14, 0.8413447460685429, -0.15865525393145707);
}

/* ---- exact unary ops ---- */

TEST(neg_int_and_float_dtypes_flip_zero_sign) {
  EXPECT_V(kiln_neg(V(I32, 3, -7, 0, 2147483647)), I32, 0, -3, 7, 0, -2147483647);
  EXPECT_V(kiln_neg(V(I64, 5e12, -1, 0)), I64, 0, -5e12, 1, 0);
  EXPECT_I64(kiln_neg(VI64(INT64_C(9007199254740993))), -INT64_C(9007199254740993));
  EXPECT_V(kiln_neg(V(F32, 1.5, -0.0, INFINITY, NAN, 0.0)), F32, 0, -1.5, 0, -INFINITY, NAN, 0);
  EXPECT_V(kiln_neg(V(F64, 1e300, -2.25, -INFINITY)), F64, 0, -1e300, 2.25, INFINITY);
  EXPECT_SIGNBITS(kiln_neg(V(F32, -0.0, 0.0)), 0, 1);
  EXPECT_SIGNBITS(kiln_neg(V(F64, -0.0, 0.0)), 0, 1);
}

TEST(neg_bool_is_dtype_error) {
  kiln_tensor *b = V(BOOL_, 1, 0);
  CHECK_ERROR(kiln_neg(b), KILN_ERR_DTYPE, "kiln_neg");
}

TEST(abs_all_dtypes_bool_identity_clears_zero_sign) {
  EXPECT_V(kiln_abs(V(I32, -3, 3, 0, -2147483647)), I32, 0, 3, 3, 0, 2147483647);
  EXPECT_V(kiln_abs(V(I64, -5e12, 7, 0)), I64, 0, 5e12, 7, 0);
  EXPECT_V(kiln_abs(V(F32, -1.5, -0.0, -INFINITY, NAN, 2)), F32, 0, 1.5, 0, INFINITY, NAN, 2);
  EXPECT_V(kiln_abs(V(F64, -1e-300, 0.0, INFINITY, NAN)), F64, 0, 1e-300, 0, INFINITY, NAN);
  EXPECT_V(kiln_abs(V(BOOL_, 0, 1, 1)), BOOL_, 0, 0, 1, 1);
  EXPECT_SIGNBITS(kiln_abs(V(F32, -0.0, -2)), 0, 0);
  EXPECT_SIGNBITS(kiln_abs(V(F64, -0.0, -2)), 0, 0);
}

TEST(floor_ceil_round_floats_specials_and_zero_sign) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *x =
        V(dt, -2.5, -1.5, -0.5, -0.0, 0.5, 1.5, 2.5, 2.4, 2.6, -2.6, INFINITY, -INFINITY, NAN);
    EXPECT_V(kiln_floor(x), dt, 0, -3, -2, -1, -0.0, 0, 1, 2, 2, 2, -3, INFINITY, -INFINITY, NAN);
    EXPECT_V(kiln_ceil(x), dt, 0, -2, -1, -0.0, -0.0, 1, 2, 3, 3, 3, -2, INFINITY, -INFINITY, NAN);
    EXPECT_V(kiln_round(x), dt, 0, -2, -2, -0.0, -0.0, 0, 2, 2, 2, 3, -3, INFINITY, -INFINITY, NAN);
    EXPECT_SIGNBITS(kiln_floor(x), 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, -1);
    EXPECT_SIGNBITS(kiln_ceil(x), 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, -1);
    EXPECT_SIGNBITS(kiln_round(x), 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, -1);
  }
}

TEST(round_half_to_even_and_no_floor_x_plus_half) {
  EXPECT_V(kiln_round(V(F32, 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 0.49999997, -0.49999997,
                        8388609, 1e20)),
           F32, 0, 0, 2, 2, 4, -0.0, -2, -2, -4, 0, -0.0, 8388609, 1e20);
  EXPECT_V(kiln_round(V(F64, 0.5, 1.5, 2.5, -2.5, 1e6 + 0.5, 0.49999999999999994,
                        4503599627370497.0, -4503599627370497.0)),
           F64, 0, 0, 2, 2, -2, 1e6, 0, 4503599627370497.0, -4503599627370497.0);
}

TEST(floor_ceil_round_identity_on_integers_and_bool) {
  kiln_tensor *i32 = V(I32, -3, 0, 7, 2147483647);
  kiln_tensor *i64 = V(I64, -5e12, 1, 0);
  kiln_tensor *b = V(BOOL_, 1, 0);
  unary_op ops[3] = {kiln_floor, kiln_ceil, kiln_round};
  for (int k = 0; k < 3; k++) {
    EXPECT_V(ops[k](i32), I32, 0, -3, 0, 7, 2147483647);
    EXPECT_V(ops[k](i64), I64, 0, -5e12, 1, 0);
    EXPECT_V(ops[k](b), BOOL_, 0, 1, 0);
  }
  EXPECT_I64(kiln_round(VI64(INT64_C(9007199254740993))), INT64_C(9007199254740993));
}

TEST(sign_all_dtypes) {
  EXPECT_V(kiln_sign(V(I32, -5, 0, 9)), I32, 0, -1, 0, 1);
  EXPECT_V(kiln_sign(V(I64, -5e12, 0, 1)), I64, 0, -1, 0, 1);
  EXPECT_V(kiln_sign(V(F32, -2.5, 0.0, 3, -INFINITY, INFINITY, 1e-30)), F32, 0, -1, 0, 1, -1, 1, 1);
  EXPECT_V(kiln_sign(V(F64, -2.5, 0.0, 3, -INFINITY, INFINITY, -1e-300)), F64, 0, -1, 0, 1, -1, 1,
           -1);
  EXPECT_V(kiln_sign(V(BOOL_, 0, 1)), BOOL_, 0, 0, 1);
}

TEST(relu_keeps_dtype_propagates_nan_and_rejects_bool) {
  EXPECT_V(kiln_relu(V(F32, -1, 0, 2.5, -INFINITY, INFINITY, NAN)), F32, 0, 0, 0, 2.5, 0, INFINITY,
           NAN);
  EXPECT_V(kiln_relu(V(F64, -1e-300, 1e300, NAN)), F64, 0, 0, 1e300, NAN);
  EXPECT_V(kiln_relu(V(I32, -3, 0, 5)), I32, 0, 0, 0, 5);
  EXPECT_V(kiln_relu(V(I64, -5e12, 5e12)), I64, 0, 0, 5e12);
  CHECK_ERROR(kiln_relu(V(BOOL_, 1, 0)), KILN_ERR_DTYPE, "kiln_relu");
}

TEST(logical_not_any_dtype_gives_bool) {
  EXPECT_V(kiln_logical_not(V(F32, 0, -0.0, 2.5, NAN, -INFINITY)), BOOL_, 0, 1, 1, 0, 0, 0);
  EXPECT_V(kiln_logical_not(V(F64, 0, 1e-300, NAN)), BOOL_, 0, 1, 0, 0);
  EXPECT_V(kiln_logical_not(V(I32, 0, 7, -1)), BOOL_, 0, 1, 0, 0);
  EXPECT_V(kiln_logical_not(V(I64, 0, 1099511627776.0)), BOOL_, 0, 1, 0);
  EXPECT_V(kiln_logical_not(V(BOOL_, 0, 1)), BOOL_, 0, 1, 0);
}

/* ---- binary ops, same dtype ---- */

TEST(add_sub_mul_integers) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? I64 : I32;
    kiln_tensor *a = V(dt, 1, -2, 7, 0, 100, -9);
    kiln_tensor *b = V(dt, 3, 5, -2, 0, -100, 4);
    EXPECT_V(kiln_add(a, b), dt, 0, 4, 3, 5, 0, 0, -5);
    EXPECT_V(kiln_sub(a, b), dt, 0, -2, -7, 9, 0, 200, -13);
    EXPECT_V(kiln_sub(b, a), dt, 0, 2, 7, -9, 0, -200, 13);
    EXPECT_V(kiln_mul(a, b), dt, 0, 3, -10, -14, 0, -10000, -36);
  }
}

TEST(add_sub_mul_floats_nan_inf_signed_zero) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *a = V(dt, 1.5, -2.25, NAN, INFINITY, -0.0, 3, INFINITY, 0);
    kiln_tensor *b = V(dt, 0.5, 4, 1, INFINITY, 0.0, NAN, -INFINITY, -0.0);
    EXPECT_V(kiln_add(a, b), dt, 0, 2, 1.75, NAN, INFINITY, 0, NAN, NAN, 0);
    EXPECT_V(kiln_sub(a, b), dt, 0, 1, -6.25, NAN, NAN, -0.0, NAN, INFINITY, 0);
    EXPECT_V(kiln_mul(a, b), dt, 0, 0.75, -9, NAN, INFINITY, -0.0, NAN, -INFINITY, -0.0);
    EXPECT_SIGNBITS(kiln_add(a, b), 0, 0, -1, 0, 0, -1, -1, 0);
    EXPECT_SIGNBITS(kiln_sub(a, b), 0, 1, -1, -1, 1, -1, 0, 0);
    EXPECT_SIGNBITS(kiln_mul(a, b), 0, 1, -1, 0, 1, -1, 1, 1);
  }
  /* f64 keeps f64 precision: 0.1 + 0.2 is not 0.3 and not the f32 sum */
  EXPECT_V(kiln_add(V(F64, 0.1), V(F64, 0.2)), F64, 0, 0.1 + 0.2);
  EXPECT_V(kiln_mul(V(F64, 1e200), V(F64, 1e200)), F64, 0, INFINITY);
  EXPECT_V(kiln_mul(V(F32, 1e20), V(F32, 1e20)), F32, 0, INFINITY);
}

TEST(add_mul_maximum_minimum_on_bool_are_or_and) {
  kiln_tensor *a = V(BOOL_, 0, 0, 1, 1);
  kiln_tensor *b = V(BOOL_, 0, 1, 0, 1);
  EXPECT_V(kiln_add(a, b), BOOL_, 0, 0, 1, 1, 1);
  EXPECT_V(kiln_mul(a, b), BOOL_, 0, 0, 0, 0, 1);
  EXPECT_V(kiln_maximum(a, b), BOOL_, 0, 0, 1, 1, 1);
  EXPECT_V(kiln_minimum(a, b), BOOL_, 0, 0, 0, 0, 1);
  /* bool with an integer is arithmetic in the integer dtype */
  EXPECT_V(kiln_sub(V(BOOL_, 1, 0), V(I32, 3, 3)), I32, 0, -2, -3);
  EXPECT_V(kiln_add(V(BOOL_, 1, 1), V(I64, 1, -1)), I64, 0, 2, 0);
}

TEST(sub_and_pow_bool_bool_are_dtype_errors) {
  kiln_tensor *a = V(BOOL_, 0, 1);
  kiln_tensor *b = V(BOOL_, 1, 1);
  CHECK_ERROR(kiln_sub(a, b), KILN_ERR_DTYPE, "kiln_sub");
  CHECK_ERROR(kiln_pow(a, b), KILN_ERR_DTYPE, "kiln_pow");
}

TEST(div_is_true_division_integers_and_bool_give_f32) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? I64 : I32;
    EXPECT_V(kiln_div(V(dt, 7, -7, 1, -1, 0, 5, 1), V(dt, 2, 2, 0, 0, 0, -5, 3)), F32, 1e-7, 3.5,
             -3.5, INFINITY, -INFINITY, NAN, -1, 1.0 / 3);
  }
  EXPECT_V(kiln_div(V(BOOL_, 0, 0, 1, 1), V(BOOL_, 0, 1, 0, 1)), F32, 0, NAN, 0, INFINITY, 1);
  EXPECT_V(kiln_div(V(F32, 1, -1, 0, 1, 3, INFINITY), V(F32, 0, 0, 0, -0.0, 0.1, INFINITY)), F32,
           1e-7, INFINITY, -INFINITY, NAN, -INFINITY, 3 / (double)0.1f, NAN);
  EXPECT_V(kiln_div(V(F64, 1, 10, -1, 1), V(F64, 3, 4, 0, -INFINITY)), F64, 1e-15, 1.0 / 3, 2.5,
           -INFINITY, -0.0);
  EXPECT_SIGNBITS(kiln_div(V(F64, 1, -1), V(F64, -INFINITY, -INFINITY)), 1, 0);
}

TEST(maximum_minimum_all_dtypes_propagate_nan) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? I64 : I32;
    kiln_tensor *a = V(dt, 1, -2, 7, 0, 100, -9);
    kiln_tensor *b = V(dt, 3, 5, -2, 0, -100, 4);
    EXPECT_V(kiln_maximum(a, b), dt, 0, 3, 5, 7, 0, 100, 4);
    EXPECT_V(kiln_minimum(a, b), dt, 0, 1, -2, -2, 0, -100, -9);
  }
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *a = V(dt, 1.5, -2.25, NAN, INFINITY, 3, -INFINITY, NAN);
    kiln_tensor *b = V(dt, 0.5, 4, 1, INFINITY, NAN, 7, NAN);
    /* NaN in either operand gives NaN (not fmax/fmin) */
    EXPECT_V(kiln_maximum(a, b), dt, 0, 1.5, 4, NAN, INFINITY, NAN, 7, NAN);
    EXPECT_V(kiln_minimum(a, b), dt, 0, 0.5, -2.25, NAN, INFINITY, NAN, -INFINITY, NAN);
    EXPECT_V(kiln_maximum(b, a), dt, 0, 1.5, 4, NAN, INFINITY, NAN, 7, NAN);
    EXPECT_V(kiln_minimum(b, a), dt, 0, 0.5, -2.25, NAN, INFINITY, NAN, -INFINITY, NAN);
  }
  EXPECT_I64(kiln_maximum(VI64(INT64_C(9007199254740993), -INT64_C(9007199254740993)),
                          VI64(INT64_C(9007199254740992), -INT64_C(9007199254740992))),
             INT64_C(9007199254740993), -INT64_C(9007199254740992));
}

TEST(comparisons_integers) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? I64 : I32;
    kiln_tensor *a = V(dt, 1, -2, 7, 0, 100, -9);
    kiln_tensor *b = V(dt, 3, 5, -2, 0, -100, 4);
    EXPECT_V(kiln_eq(a, b), BOOL_, 0, 0, 0, 0, 1, 0, 0);
    EXPECT_V(kiln_ne(a, b), BOOL_, 0, 1, 1, 1, 0, 1, 1);
    EXPECT_V(kiln_lt(a, b), BOOL_, 0, 1, 1, 0, 0, 0, 1);
    EXPECT_V(kiln_le(a, b), BOOL_, 0, 1, 1, 0, 1, 0, 1);
    EXPECT_V(kiln_gt(a, b), BOOL_, 0, 0, 0, 1, 0, 1, 0);
    EXPECT_V(kiln_ge(a, b), BOOL_, 0, 0, 0, 1, 1, 1, 0);
  }
}

TEST(comparisons_floats_nan_is_unordered_and_zeros_equal) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *a = V(dt, 1.5, -2.25, NAN, INFINITY, -0.0, 3, INFINITY, NAN);
    kiln_tensor *b = V(dt, 0.5, 4, 1, INFINITY, 0.0, NAN, -INFINITY, NAN);
    EXPECT_V(kiln_eq(a, b), BOOL_, 0, 0, 0, 0, 1, 1, 0, 0, 0);
    EXPECT_V(kiln_ne(a, b), BOOL_, 0, 1, 1, 1, 0, 0, 1, 1, 1);
    EXPECT_V(kiln_lt(a, b), BOOL_, 0, 0, 1, 0, 0, 0, 0, 0, 0);
    EXPECT_V(kiln_le(a, b), BOOL_, 0, 0, 1, 0, 1, 1, 0, 0, 0);
    EXPECT_V(kiln_gt(a, b), BOOL_, 0, 1, 0, 0, 0, 0, 0, 1, 0);
    EXPECT_V(kiln_ge(a, b), BOOL_, 0, 1, 0, 0, 1, 1, 0, 1, 0);
  }
}

TEST(comparisons_bool) {
  kiln_tensor *a = V(BOOL_, 0, 0, 1, 1);
  kiln_tensor *b = V(BOOL_, 0, 1, 0, 1);
  EXPECT_V(kiln_eq(a, b), BOOL_, 0, 1, 0, 0, 1);
  EXPECT_V(kiln_ne(a, b), BOOL_, 0, 0, 1, 1, 0);
  EXPECT_V(kiln_lt(a, b), BOOL_, 0, 0, 1, 0, 0);
  EXPECT_V(kiln_le(a, b), BOOL_, 0, 1, 1, 0, 1);
  EXPECT_V(kiln_gt(a, b), BOOL_, 0, 0, 0, 1, 0);
  EXPECT_V(kiln_ge(a, b), BOOL_, 0, 1, 0, 1, 1);
}

TEST(comparisons_happen_in_the_promoted_dtype) {
  /* i32 16777217 becomes 16777216 in f32 */
  EXPECT_V(kiln_eq(V(I32, 16777217, 3), V(F32, 16777216, 3)), BOOL_, 0, 1, 1);
  EXPECT_V(kiln_gt(V(I32, 16777217), V(F32, 16777216)), BOOL_, 0, 0);
  /* i64 vs i64 is exact beyond 2^53 ... */
  kiln_tensor *big = VI64(INT64_C(9007199254740993));
  kiln_tensor *big_minus_1 = VI64(INT64_C(9007199254740992));
  EXPECT_V(kiln_eq(big, big_minus_1), BOOL_, 0, 0);
  EXPECT_V(kiln_gt(big, big_minus_1), BOOL_, 0, 1);
  EXPECT_V(kiln_ne(big, big_minus_1), BOOL_, 0, 1);
  /* ... but against f64 the i64 is rounded to f64 first */
  EXPECT_V(kiln_eq(big, V(F64, 9007199254740992.0)), BOOL_, 0, 1);
  /* i32 against f64: 0.1 is not 0 */
  EXPECT_V(kiln_lt(V(I32, 0, 1), V(F64, 0.1, 0.9)), BOOL_, 0, 1, 0);
}

TEST(logical_and_or_nonzero_is_true_any_dtype) {
  for (int k = 0; k < 5; k++) {
    kiln_dtype dt = ALL_DTYPES[k];
    kiln_tensor *a = V(dt, 0, 0, 3, 1);
    kiln_tensor *b = V(dt, 0, 1, 0, 1);
    EXPECT_V(kiln_logical_and(a, b), BOOL_, 0, 0, 0, 0, 1);
    EXPECT_V(kiln_logical_or(a, b), BOOL_, 0, 0, 1, 1, 1);
  }
  /* NaN is nonzero; -0.0 is zero */
  kiln_tensor *x = V(F64, NAN, -0.0, NAN, -0.0, 0.5);
  kiln_tensor *y = V(F32, 1, 1, 0, 0, -2);
  EXPECT_V(kiln_logical_and(x, y), BOOL_, 0, 1, 0, 0, 0, 1);
  EXPECT_V(kiln_logical_or(x, y), BOOL_, 0, 1, 1, 1, 0, 1);
  EXPECT_V(kiln_logical_and(V(I64, 1099511627776.0), V(I32, -1)), BOOL_, 0, 1);
}

TEST(pow_floats_specials) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *a = V(dt, 2, 4, -8, 0, NAN, 1, -2, -2, 0, INFINITY, 2, 9, -INFINITY);
    kiln_tensor *b = V(dt, 3, 0.5, 1.0 / 3, 0, 0, NAN, 3, 2, -1, -1, -1, 0.5, 3);
    EXPECT_V(kiln_pow(a, b), dt, dt == F32 ? TOL32 : TOL64, 8, 2, NAN, 1, 1, 1, -8, 4, INFINITY, 0,
             0.5, 3, -INFINITY);
  }
  EXPECT_V(kiln_pow(V(F64, 2, 10, 0.5), V(F64, 0.5, -2.5, 1.7)), F64, TOL64, sqrt(2.0),
           pow(10, -2.5), pow(0.5, 1.7));
  EXPECT_V(kiln_pow(V(F32, 2, 10, 0.5), V(F32, 0.5, -2.5, 1.7)), F32, TOL32, sqrt(2.0),
           pow(10, -2.5), pow(0.5, (double)1.7f));
}

TEST(pow_integers_negative_exponent_gives_zero_unless_base_is_unit) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? I64 : I32;
    kiln_tensor *a = V(dt, 2, -2, 3, 0, 1, -1, -1, 2, 0, 5, -3, 7, -1);
    kiln_tensor *b = V(dt, 10, 3, 0, 0, -5, -1, -2, -1, -1, 1, 4, -3, 7);
    EXPECT_V(kiln_pow(a, b), dt, 0, 1024, -8, 1, 1, 1, -1, 1, 0, 0, 5, 81, 0, -1);
  }
  /* exact, not through double pow */
  EXPECT_I64(kiln_pow(VI64(3, -3, 2), VI64(39, 39, 62)), INT64_C(4052555153018976267),
             -INT64_C(4052555153018976267), INT64_C(4611686018427387904));
  /* mixed integers promote; bool base or exponent is 0/1 */
  EXPECT_V(kiln_pow(V(I32, 2, -2), V(I64, 40, 3)), I64, 0, 1099511627776.0, -8);
  EXPECT_V(kiln_pow(V(BOOL_, 1, 0, 1, 0), V(I32, 5, 2, 0, 0)), I32, 0, 1, 0, 1, 1);
  EXPECT_V(kiln_pow(V(I32, 5, 5), V(BOOL_, 0, 1)), I32, 0, 1, 5);
}

TEST(i64_arithmetic_is_exact_beyond_2_pow_53) {
  kiln_tensor *a =
      VI64(INT64_C(9007199254740993), INT64_C(3037000499), -INT64_C(4611686018427387904));
  kiln_tensor *b = VI64(2, INT64_C(3037000499), -INT64_C(4611686018427387903));
  EXPECT_I64(kiln_add(a, b), INT64_C(9007199254740995), INT64_C(6074000998), INT64_MIN + 1);
  EXPECT_I64(kiln_sub(a, b), INT64_C(9007199254740991), 0, -1);
  EXPECT_I64(kiln_mul(VI64(INT64_C(3037000499), INT64_C(4294967296)), VI64(INT64_C(3037000499), 3)),
             INT64_C(9223372030926249001), INT64_C(12884901888));
}

TEST(mixed_dtype_binary_values) {
  EXPECT_V(kiln_add(V(I32, 1, -2, 3), V(F32, 0.5, 0.25, -3.5)), F32, 0, 1.5, -1.75, -0.5);
  EXPECT_V(kiln_mul(V(I32, 100000, -3), V(I64, 100000, 5)), I64, 0, 1e10, -15);
  /* f32 0.1 widened to f64 is 0.100000001490116..., not 0.1 */
  EXPECT_V(kiln_sub(V(F32, 0.1), V(F64, 0.1)), F64, 0, (double)0.1f - 0.1);
  EXPECT_V(kiln_div(V(I64, 1), V(F64, 3)), F64, 1e-16, 1.0 / 3);
  EXPECT_V(kiln_maximum(V(I32, 1, 5), V(F32, NAN, 2.5)), F32, 0, NAN, 5);
}

/* ---- tensor op host scalar (weak) ---- */

TEST(add_scalar_float_keeps_dtype_integer_and_bool_give_f32) {
  EXPECT_V(kiln_add_scalar(V(F32, 1, -2.5, NAN, INFINITY, 16777216), 1.0), F32, 0, 2, -1.5, NAN,
           INFINITY, 16777216);
  EXPECT_V(kiln_add_scalar(V(F64, 1, -2.5, 16777216, 1e300), 1.0), F64, 0, 2, -1.5, 16777217,
           1e300);
  EXPECT_V(kiln_add_scalar(V(F64, 0.2), 0.1), F64, 0, 0.2 + 0.1);
  EXPECT_V(kiln_add_scalar(V(I32, 1, -2, 7), 0.5), F32, 0, 1.5, -1.5, 7.5);
  EXPECT_V(kiln_add_scalar(V(I32, 1, -2, 7), 2.0), F32, 0, 3, 0, 9);
  EXPECT_V(kiln_add_scalar(V(I64, 3, -4), 2.0), F32, 0, 5, -2);
  EXPECT_V(kiln_add_scalar(V(BOOL_, 0, 1), 1.0), F32, 0, 1, 2);
}

TEST(sub_scalar_all_dtypes) {
  EXPECT_V(kiln_sub_scalar(V(F32, 3, 0.5, NAN), 1.0), F32, 0, 2, -0.5, NAN);
  EXPECT_V(kiln_sub_scalar(V(F64, 3, 0.5, -INFINITY), 0.25), F64, 0, 2.75, 0.25, -INFINITY);
  EXPECT_V(kiln_sub_scalar(V(I32, 5, -5), 1.5), F32, 0, 3.5, -6.5);
  EXPECT_V(kiln_sub_scalar(V(I64, 10), 2.0), F32, 0, 8);
  EXPECT_V(kiln_sub_scalar(V(BOOL_, 1, 0), 1.0), F32, 0, 0, -1);
}

TEST(mul_scalar_all_dtypes) {
  for (int k = 0; k < 2; k++) {
    kiln_dtype dt = k ? F64 : F32;
    kiln_tensor *x = V(dt, 1.5, -2, 0, INFINITY, NAN);
    EXPECT_V(kiln_mul_scalar(x, -2.0), dt, 0, -3, 4, -0.0, -INFINITY, NAN);
    EXPECT_SIGNBITS(kiln_mul_scalar(x, -2.0), 1, 0, 1, 1, -1);
    EXPECT_V(kiln_mul_scalar(x, 0.0), dt, 0, 0, -0.0, 0, NAN, NAN);
  }
  EXPECT_V(kiln_mul_scalar(V(F32, 1, 3), 0.1), F32, 1e-7, 0.1, 0.3);
  EXPECT_V(kiln_mul_scalar(V(I32, 3, -4), 2.5), F32, 0, 7.5, -10);
  EXPECT_V(kiln_mul_scalar(V(I64, 1099511627776.0), 2.0), F32, 0, 2199023255552.0);
  EXPECT_V(kiln_mul_scalar(V(BOOL_, 1, 0), 3.0), F32, 0, 3, 0);
}

TEST(div_scalar_all_dtypes_and_division_by_zero) {
  EXPECT_V(kiln_div_scalar(V(F32, 1, -1, 0, 6), 0.0), F32, 0, INFINITY, -INFINITY, NAN, INFINITY);
  EXPECT_V(kiln_div_scalar(V(F64, 1, 2, -1), 3.0), F64, 1e-15, 1.0 / 3, 2.0 / 3, -1.0 / 3);
  EXPECT_V(kiln_div_scalar(V(F64, 1), -0.0), F64, 0, -INFINITY);
  EXPECT_V(kiln_div_scalar(V(I32, 7, -7), 2.0), F32, 0, 3.5, -3.5);
  EXPECT_V(kiln_div_scalar(V(I64, 9), 4.0), F32, 0, 2.25);
  EXPECT_V(kiln_div_scalar(V(BOOL_, 1, 0), 2.0), F32, 0, 0.5, 0);
}

TEST(pow_scalar_all_dtypes_float_exponent_gives_float) {
  EXPECT_V(kiln_pow_scalar(V(F32, 4, 2, -8, 0, NAN), 0.5), F32, TOL32, 2, sqrt(2.0), NAN, 0, NAN);
  EXPECT_V(kiln_pow_scalar(V(F32, NAN, 0, -3), 0.0), F32, 0, 1, 1, 1);
  EXPECT_V(kiln_pow_scalar(V(F64, 2, -2, 0), -1.0), F64, 0, 0.5, -0.5, INFINITY);
  EXPECT_V(kiln_pow_scalar(V(F64, -2, 1.5), 3.0), F64, 1e-15, -8, 3.375);
  EXPECT_V(kiln_pow_scalar(V(I32, 2, -3, 0, 4), 2.0), F32, 0, 4, 9, 0, 16);
  /* a double exponent makes it f32 true power, not the integer rule */
  EXPECT_V(kiln_pow_scalar(V(I32, 2, 4), -1.0), F32, 0, 0.5, 0.25);
  EXPECT_V(kiln_pow_scalar(V(I64, 3), 3.0), F32, 0, 27);
  EXPECT_V(kiln_pow_scalar(V(BOOL_, 1, 0), 2.0), F32, 0, 1, 0);
}

/* ---- where, clamp ---- */

TEST(where_selects_and_promotes_a_b) {
  kiln_tensor *cond = V(BOOL_, 1, 0, 1, 0);
  EXPECT_V(kiln_where(cond, V(F32, 1, 2, 3, 4), V(F32, -1, -2, -3, -4)), F32, 0, 1, -2, 3, -4);
  EXPECT_V(kiln_where(cond, V(I32, 1, 2, 3, 4), V(F64, 0.5, 0.25, NAN, 8)), F64, 0, 1, 0.25, 3, 8);
  EXPECT_V(kiln_where(cond, V(I32, 1, 2, 3, 4), V(I64, 5e12, 6e12, 7e12, 8e12)), I64, 0, 1, 6e12, 3,
           8e12);
  EXPECT_V(kiln_where(cond, V(I32, 1, 2, 3, 4), V(I32, 5, 6, 7, 8)), I32, 0, 1, 6, 3, 8);
  EXPECT_V(kiln_where(cond, V(BOOL_, 1, 1, 0, 0), V(BOOL_, 0, 1, 1, 0)), BOOL_, 0, 1, 1, 0, 0);
  EXPECT_V(kiln_where(cond, V(BOOL_, 1, 1, 0, 0), V(F32, 7, 7, 7, 7)), F32, 0, 1, 7, 0, 7);
  /* the unselected NaN does not leak */
  EXPECT_V(kiln_where(cond, V(F64, NAN, NAN, NAN, NAN), V(F64, 5, 6, 7, 8)), F64, 0, NAN, 6, NAN,
           8);
}

TEST(where_broadcasts_cond_a_b) {
  kiln_tensor *cond = T(BOOL_, S(2, 1), 1, 0);
  EXPECT(kiln_where(cond, V(F32, 1, 2, 3), scalar0(-1, F32)), F32, S(2, 3), 0, 1, 2, 3, -1, -1, -1);
  EXPECT(kiln_where(V(BOOL_, 0, 1, 1), T(I64, S(2, 1), 10, 20), scalar0(-7, I64)), I64, S(2, 3), 0,
         -7, 10, 10, -7, 20, 20);
}

TEST(where_non_bool_cond_is_dtype_error) {
  kiln_tensor *a = V(F32, 1, 2);
  kiln_tensor *b = V(F32, 3, 4);
  CHECK_ERROR(kiln_where(V(I32, 1, 0), a, b), KILN_ERR_DTYPE, "kiln_where");
  CHECK_ERROR(kiln_where(V(F32, 1, 0), a, b), KILN_ERR_DTYPE, "kiln_where");
}

TEST(clamp_floats_propagates_nan) {
  EXPECT_V(kiln_clamp(V(F32, NAN, -1, 0.25, 2, -INFINITY, INFINITY), 0, 1), F32, 0, NAN, 0, 0.25, 1,
           0, 1);
  EXPECT_V(kiln_clamp(V(F64, -1, -0.25, 0.3, 0.75, NAN, -INFINITY), -0.5, 0.5), F64, 0, -0.5, -0.25,
           0.3, 0.5, NAN, -0.5);
  /* bounds are weak: an f32 tensor gets the f32 value of the bound */
  EXPECT_V(kiln_clamp(V(F32, 0.05, 0.2, 0.12), 0.1, 0.15), F32, 0, 0.1, 0.15, 0.12);
}

TEST(clamp_integers_uses_ceil_lo_floor_hi_and_keeps_dtype) {
  EXPECT_V(kiln_clamp(V(I32, -5, -2, 0, 3, 4, 10), -2.5, 3.7), I32, 0, -2, -2, 0, 3, 3, 3);
  EXPECT_V(kiln_clamp(V(I32, -3, 3, 1), -2.0, 2.0), I32, 0, -2, 2, 1);
  EXPECT_V(kiln_clamp(V(I64, 5e9, -5e9, 7), -1e9, 1e9), I64, 0, 1e9, -1e9, 7);
  EXPECT_V(kiln_clamp(V(I64, 5, -5), -0.5, 0.5), I64, 0, 0, 0);
  /* ceil/floor, not truncation or rounding: [1.5, 4.5] is [2, 4]; [-4.5, -1.5] is [-4, -2] */
  EXPECT_V(kiln_clamp(V(I32, 0, 1, 2, 3, 5, 9), 1.5, 4.5), I32, 0, 2, 2, 2, 3, 4, 4);
  EXPECT_V(kiln_clamp(V(I64, -5, -3, -1, 0), -4.5, -1.5), I64, 0, -4, -3, -2, -2);
}

/* an int32 bound past int32's range saturates (it once wrapped: -3e9
   became 1294967296 and clamped everything to it) */
TEST(clamp_int32_bounds_past_the_range_saturate) {
  EXPECT_V(kiln_clamp(V(I32, -7, 0, 5, 2147483647, -2147483647), -3e9, 3e9), I32, 0, -7, 0, 5,
           2147483647, -2147483647);
  EXPECT_V(kiln_clamp(V(I32, -7, 0, 5), -1, 5e9), I32, 0, -1, 0, 5);
  EXPECT_V(kiln_clamp(V(I32, -7, 0, 5), 3e9, 4e9), I32, 0, 2147483647, 2147483647, 2147483647);
  EXPECT_V(kiln_clamp(V(I32, -7, 0, 5), -INFINITY, -5e9), I32, 0, -2147483648.0, -2147483648.0,
           -2147483648.0);
}

/* the same for u8, i8 and i16: u8's clamp(-1, 255) once made every
   element 255 (the bound -1 wrapped), clamp(-3.5, 300) every one 44 */
TEST(clamp_narrow_int_bounds_past_the_range_saturate) {
  EXPECT_V(kiln_clamp(V(KILN_U8, 0, 10, 200, 255), -1, 255), KILN_U8, 0, 0, 10, 200, 255);
  EXPECT_V(kiln_clamp(V(KILN_U8, 0, 10, 200, 255), -3.5, 300), KILN_U8, 0, 0, 10, 200, 255);
  EXPECT_V(kiln_clamp(V(KILN_U8, 0, 10, 200, 255), 5, 256), KILN_U8, 0, 5, 10, 200, 255);
  EXPECT_V(kiln_clamp(V(KILN_U8, 0, 10, 200, 255), -200, 1000), KILN_U8, 0, 0, 10, 200, 255);
  EXPECT_V(kiln_clamp(V(KILN_I8, -128, -5, 5, 127), -1000, 1000), KILN_I8, 0, -128, -5, 5, 127);
  EXPECT_V(kiln_clamp(V(KILN_I8, -128, -5, 5, 127), -6, 200), KILN_I8, 0, -6, -5, 5, 127);
  EXPECT_V(kiln_clamp(V(KILN_I16, -32768, -7, 7, 32767), -1e5, 1e5), KILN_I16, 0, -32768, -7, 7,
           32767);
  EXPECT_V(kiln_clamp(V(KILN_I16, -32768, -7, 7, 32767), 1e5, 2e5), KILN_I16, 0, 32767, 32767,
           32767, 32767);
}

TEST(clamp_bool_is_dtype_error) {
  kiln_tensor *b = V(BOOL_, 1, 0);
  CHECK_ERROR(kiln_clamp(b, 0, 1), KILN_ERR_DTYPE, "kiln_clamp");
}

/* ---- cast ---- */

static bool is_float_dtype(kiln_dtype dt) {
  return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_BF16 || dt == KILN_F16;
}

/* v (a value of dtype from) cast to `to`: floats round (a half through
   f32), to an integer truncates, float -> uint8 saturates to [0, 255] and
   integer -> uint8 wraps */
static double cast_ref(kiln_dtype from, kiln_dtype to, double v) {
  switch (to) {
    case KILN_BOOL:
      return v != 0;
    case KILN_I32:
    case KILN_I64:
      return trunc(v);
    case KILN_U8:
      if (is_float_dtype(from)) return v <= 0 ? 0 : v >= 255 ? 255 : trunc(v);
      return (double)(uint8_t)(int64_t)v;
    default:
      return ktest_as_dtype(to, v);
  }
}

TEST(cast_every_dtype_pair_in_range) {
  const double x[6] = {0, 1, -2, 3.75, -0.5, 100};
  const kiln_dtype every[8] = {KILN_BOOL, KILN_I32,  KILN_I64, KILN_F32,
                               KILN_F64,  KILN_BF16, KILN_F16, KILN_U8};
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 8; j++) {
      kiln_dtype from = every[i], to = every[j];
      int64_t shape[1] = {6};
      double e[6];
      for (int k = 0; k < 6; k++) e[k] = cast_ref(from, to, ktest_as_dtype(from, x[k]));
      char what[64];
      snprintf(what, sizeof what, "kiln_cast %s -> %s", ktest_dtype_name(from),
               ktest_dtype_name(to));
      expect_impl(__LINE__, what, kiln_cast(makev(from, 1, shape, 6, x), to), to, 1, shape, 6, e,
                  0);
    }
  }
}

TEST(cast_float_to_int_truncates_nan_is_zero_out_of_range_saturates) {
  EXPECT_V(
      kiln_cast(V(F32, 1.9, -1.9, NAN, 1e10, -1e10, INFINITY, -INFINITY, -0.5, 2147483520), I32),
      I32, 0, 1, -1, 0, 2147483647, -2147483648.0, 2147483647, -2147483648.0, 0, 2147483520);
  EXPECT_V(kiln_cast(V(F64, 2147483647.9, -2147483648.9, 2147483648.0, -2147483649.0, NAN), I32),
           I32, 0, 2147483647, -2147483648.0, 2147483647, -2147483648.0, 0);
  EXPECT_I64(kiln_cast(V(F64, 9.3e18, -9.3e18, NAN, INFINITY, -INFINITY, 4e18, -1.5), I64),
             INT64_MAX, INT64_MIN, 0, INT64_MAX, INT64_MIN, INT64_C(4000000000000000000), -1);
  EXPECT_I64(kiln_cast(V(F32, 1e19, -1e19, NAN, 2.5), I64), INT64_MAX, INT64_MIN, 0, 2);
}

TEST(cast_to_bool_is_nonzero) {
  EXPECT_V(kiln_cast(V(F32, 0, -0.0, 0.5, -2, NAN, INFINITY), BOOL_), BOOL_, 0, 0, 0, 1, 1, 1, 1);
  EXPECT_V(kiln_cast(V(F64, 1e-300, 0), BOOL_), BOOL_, 0, 1, 0);
  EXPECT_V(kiln_cast(V(I32, 0, 2, -1), BOOL_), BOOL_, 0, 0, 1, 1);
  /* 2^40 has zero low 32 bits but is nonzero */
  EXPECT_V(kiln_cast(V(I64, 0, 1099511627776.0), BOOL_), BOOL_, 0, 0, 1);
}

TEST(cast_to_float_rounds_to_nearest) {
  EXPECT_V(kiln_cast(V(I32, 16777217, -16777217, 16777219), F32), F32, 0, 16777216, -16777216,
           16777220);
  EXPECT_V(kiln_cast(VI64(INT64_C(9007199254740993)), F64), F64, 0, 9007199254740992.0);
  EXPECT_V(kiln_cast(VI64(INT64_C(16777217)), F32), F32, 0, 16777216);
  EXPECT_V(kiln_cast(V(F64, 0.1, 1e-50, -1e-50, 3.4e38), F32), F32, 0, (double)0.1f, 0, -0.0,
           (double)3.4e38f);
  EXPECT_SIGNBITS(kiln_cast(V(F64, 1e-50, -1e-50), F32), 0, 1);
  EXPECT_V(kiln_cast(V(F32, 0.1), F64), F64, 0, (double)0.1f);
  EXPECT_V(kiln_cast(V(BOOL_, 1, 0), F64), F64, 0, 1, 0);
  EXPECT_V(kiln_cast(V(I64, -5, 7), I32), I32, 0, -5, 7);
}

/* ---- NULL inputs ---- */

TEST(null_input_returns_null_and_keeps_first_error) {
  kiln_tensor *b = V(BOOL_, 1);
  kiln_tensor *x = V(F32, 1);
  kiln_clear_error();
  kiln_tensor *r = kiln_neg(b);
  CHECK(r == NULL);
  kiln_tensor *r2 = kiln_exp(r);
  CHECK(r2 == NULL);
  kiln_tensor *r3 = kiln_add(x, r2);
  CHECK(r3 == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DTYPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_neg");
  kiln_release(r3);
  kiln_release(r2);
  kiln_release(r);
  kiln_clear_error();
}

int main(void) {
  RUN_T(exp_floats_specials_and_ints_bool_give_f32);
  RUN_T(log_zero_is_neg_inf_negative_is_nan);
  RUN_T(sqrt_negative_is_nan_and_keeps_negative_zero);
  RUN_T(rsqrt_of_zero_is_inf_of_inf_is_zero);
  RUN_T(sin_values_and_inf_is_nan);
  RUN_T(cos_values_and_inf_is_nan);
  RUN_T(tanh_saturates_to_plus_minus_one);
  RUN_T(sigmoid_no_nan_for_large_magnitudes);
  RUN_T(erf_odd_and_bounded);
  RUN_T(log1p_of_minus_one_is_neg_inf);
  RUN_T(expm1_of_neg_inf_is_minus_one);
  RUN_T(log1p_expm1_relative_accuracy_near_zero);
  RUN_T(gelu_exact_erf_form_floats_and_ints_give_f32);

  RUN_T(neg_int_and_float_dtypes_flip_zero_sign);
  RUN_T(neg_bool_is_dtype_error);
  RUN_T(abs_all_dtypes_bool_identity_clears_zero_sign);
  RUN_T(floor_ceil_round_floats_specials_and_zero_sign);
  RUN_T(round_half_to_even_and_no_floor_x_plus_half);
  RUN_T(floor_ceil_round_identity_on_integers_and_bool);
  RUN_T(sign_all_dtypes);
  RUN_T(relu_keeps_dtype_propagates_nan_and_rejects_bool);
  RUN_T(logical_not_any_dtype_gives_bool);

  RUN_T(add_sub_mul_integers);
  RUN_T(add_sub_mul_floats_nan_inf_signed_zero);
  RUN_T(add_mul_maximum_minimum_on_bool_are_or_and);
  RUN_T(sub_and_pow_bool_bool_are_dtype_errors);
  RUN_T(div_is_true_division_integers_and_bool_give_f32);
  RUN_T(maximum_minimum_all_dtypes_propagate_nan);
  RUN_T(comparisons_integers);
  RUN_T(comparisons_floats_nan_is_unordered_and_zeros_equal);
  RUN_T(comparisons_bool);
  RUN_T(comparisons_happen_in_the_promoted_dtype);
  RUN_T(logical_and_or_nonzero_is_true_any_dtype);
  RUN_T(pow_floats_specials);
  RUN_T(pow_integers_negative_exponent_gives_zero_unless_base_is_unit);
  RUN_T(i64_arithmetic_is_exact_beyond_2_pow_53);
  RUN_T(mixed_dtype_binary_values);

  RUN_T(add_scalar_float_keeps_dtype_integer_and_bool_give_f32);
  RUN_T(sub_scalar_all_dtypes);
  RUN_T(mul_scalar_all_dtypes);
  RUN_T(div_scalar_all_dtypes_and_division_by_zero);
  RUN_T(pow_scalar_all_dtypes_float_exponent_gives_float);

  RUN_T(where_selects_and_promotes_a_b);
  RUN_T(where_broadcasts_cond_a_b);
  RUN_T(where_non_bool_cond_is_dtype_error);
  RUN_T(clamp_floats_propagates_nan);
  RUN_T(clamp_integers_uses_ceil_lo_floor_hi_and_keeps_dtype);
  RUN_T(clamp_int32_bounds_past_the_range_saturate);
  RUN_T(clamp_narrow_int_bounds_past_the_range_saturate);
  RUN_T(clamp_bool_is_dtype_error);

  RUN_T(cast_every_dtype_pair_in_range);
  RUN_T(cast_float_to_int_truncates_nan_is_zero_out_of_range_saturates);
  RUN_T(cast_to_bool_is_nonzero);
  RUN_T(cast_to_float_rounds_to_nearest);

  RUN_T(null_input_returns_null_and_keeps_first_error);
  return ktest_done();
}
