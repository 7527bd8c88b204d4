/* test_broadcast.c — numpy broadcasting of the binary elementwise ops (0-d
 * against n-d, [3,1] with [1,4], trailing-vector, size-0 dims), expanded,
 * transposed, permuted and sliced (non-contiguous) operands against their
 * contiguous copies, the 5x5 dtype promotion table, weak host scalars, the
 * broadcast error messages, and large (>= 1<<20 element) multithreaded cases
 * checked element by element against a reference computed here. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static const kiln_dtype ALL_DTYPES[5] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64};

static bool is_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64; }

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

/* T(F32, S(2, 3), 1, 2, 3, 4, 5, 6); V(I32, 1, 2, 3) is 1-d; EMPTY has no elements */
#define T(dt, shape, ...) makev(dt, NDIM(shape), shape, NV(__VA_ARGS__), D(__VA_ARGS__))
#define V(dt, ...) T(dt, S(NV(__VA_ARGS__)), __VA_ARGS__)
#define EMPTY(dt, shape) makev(dt, NDIM(shape), shape, 0, D(0))

/* 0, 1, 2, ... n-1 in dtype dt with this shape */
static kiln_tensor *iota(kiln_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = (double)i;
  kiln_tensor *t = makev(dt, ndim, shape, n, v);
  free(v);
  return t;
}
#define IOTA(dt, shape) iota(dt, NDIM(shape), shape)

static kiln_tensor *scalar0(double v, kiln_dtype dt) { return own(kiln_scalar(v, dt)); }

/* a contiguous tensor with t's dtype, shape and values (through kiln_to_buffer) */
static kiln_tensor *copy_of(kiln_tensor *t) {
  if (!t) return NULL;
  size_t bytes = (size_t)kiln_numel(t) * ktest_dtype_size(kiln_dtype_of(t));
  void *buf = malloc(bytes ? bytes : 1);
  kiln_tensor *c = NULL;
  if (kiln_to_buffer(t, buf, bytes) < 0)
    KTEST_FAIL("kiln_to_buffer failed: %s", kiln_last_error());
  else
    c = own(kiln_from_data(buf, kiln_dtype_of(t), kiln_ndim(t), kiln_shape(t)));
  free(buf);
  return c;
}

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
    if (kiln_numel(r) != n)
      KTEST_FAIL("%lld elements, expected %lld", (long long)kiln_numel(r), (long long)n);
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
#define EXPECT_EMPTY(expr, dt, shape) \
  expect_impl(__LINE__, #expr, (expr), dt, NDIM(shape), shape, 0, D(0), 0)

/* r and want (both released here) have the same dtype, shape and values
   (bit-for-bit up to NaN == NaN) */
static void expect_same_impl(int line, const char *what, kiln_tensor *r, kiln_tensor *want) {
  int before = ktest_failed_checks;
  if (!r || !want) {
    KTEST_FAIL("result is NULL: %s", kiln_last_error());
  } else if (kiln_dtype_of(r) != kiln_dtype_of(want) || kiln_ndim(r) != kiln_ndim(want)) {
    KTEST_FAIL("%s %d-d result, expected %s %d-d", ktest_dtype_name(kiln_dtype_of(r)), kiln_ndim(r),
               ktest_dtype_name(kiln_dtype_of(want)), kiln_ndim(want));
  } else {
    double *w = ktest_values(want);
    CHECK_TENSOR(r, kiln_ndim(want), kiln_shape(want), w, 0.0);
    free(w);
  }
  if (ktest_failed_checks != before) print_context(line, what, r);
  kiln_release(r);
  kiln_release(want);
}
#define EXPECT_SAME(expr, want_expr) expect_same_impl(__LINE__, #expr, (expr), (want_expr))

/* row-major values of x ([n0,n1,...]) broadcast against nothing: helper for
   references: the flat index into a tensor of shape `in` broadcast to `out`
   (in right-aligned, size-1 dims repeat) for the flat output index i */
static int64_t bcast_index(int64_t i, int out_ndim, const int64_t *out, int in_ndim,
                           const int64_t *in) {
  int64_t idx = 0, stride = 1;
  for (int d = out_ndim - 1, e = in_ndim - 1; d >= 0; d--, e--) {
    int64_t c = i % out[d];
    i /= out[d];
    if (e >= 0) {
      if (in[e] != 1) idx += c * stride;
      stride *= in[e];
    }
  }
  return idx;
}

/* ---- broadcasting shapes ---- */

TEST(scalar_0d_broadcasts_against_nd_on_either_side) {
  kiln_tensor *s = scalar0(10, F32);
  kiln_tensor *m = T(F32, S(2, 3), 1, 2, 3, 4, 5, 6);
  EXPECT(kiln_add(s, m), F32, S(2, 3), 0, 11, 12, 13, 14, 15, 16);
  EXPECT(kiln_sub(s, m), F32, S(2, 3), 0, 9, 8, 7, 6, 5, 4);
  EXPECT(kiln_sub(m, s), F32, S(2, 3), 0, -9, -8, -7, -6, -5, -4);
  EXPECT_0D(kiln_mul(s, scalar0(3, F32)), F32, 0, 30);
  EXPECT(kiln_mul(scalar0(-2, I64), T(I64, S(2, 1, 2), 1, 2, 3, 4)), I64, S(2, 1, 2), 0, -2, -4, -6,
         -8);
  EXPECT(kiln_lt(T(I32, S(1, 1, 3), 1, 5, 9), scalar0(5, I32)), BOOL_, S(1, 1, 3), 0, 1, 0, 0);
}

TEST(col_3x1_with_row_1x4_gives_3x4) {
  kiln_tensor *c = T(I32, S(3, 1), 1, 2, 3);
  kiln_tensor *r = T(I32, S(1, 4), 10, 20, 30, 40);
  EXPECT(kiln_add(c, r), I32, S(3, 4), 0, 11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43);
  EXPECT(kiln_sub(c, r), I32, S(3, 4), 0, -9, -19, -29, -39, -8, -18, -28, -38, -7, -17, -27, -37);
  EXPECT(kiln_sub(r, c), I32, S(3, 4), 0, 9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37);
  kiln_tensor *cf = T(F64, S(3, 1), 1, 2, 3);
  kiln_tensor *rf = T(F64, S(1, 4), 10, 20, 30, 40);
  EXPECT(kiln_mul(cf, rf), F64, S(3, 4), 0, 10, 20, 30, 40, 20, 40, 60, 80, 30, 60, 90, 120);
  EXPECT(kiln_mul(rf, cf), F64, S(3, 4), 0, 10, 20, 30, 40, 20, 40, 60, 80, 30, 60, 90, 120);
  /* [3,1] with a plain [4] is the same as with [1,4] */
  EXPECT(kiln_add(c, V(I32, 10, 20, 30, 40)), I32, S(3, 4), 0, 11, 21, 31, 41, 12, 22, 32, 42, 13,
         23, 33, 43);
  EXPECT(kiln_ge(cf, V(F64, 1, 2, 3, 4)), BOOL_, S(3, 4), 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0);
}

TEST(trailing_vector_4_against_2x3x4_and_2x1x4_with_3x1) {
  kiln_tensor *a = IOTA(F32, S(2, 3, 4));
  kiln_tensor *b = V(F32, 1, 10, 100, 1000);
  double e1[24], e2[24];
  for (int i = 0; i < 24; i++) {
    double bi = i % 4 == 0 ? 1 : i % 4 == 1 ? 10 : i % 4 == 2 ? 100 : 1000;
    e1[i] = i * bi;
    e2[i] = bi - i;
  }
  expect_impl(__LINE__, "a[2,3,4] * b[4]", kiln_mul(a, b), F32, 3, S(2, 3, 4), 24, e1, 0);
  expect_impl(__LINE__, "b[4] - a[2,3,4]", kiln_sub(b, a), F32, 3, S(2, 3, 4), 24, e2, 0);
  /* [2,1,4] with [3,1] -> [2,3,4]: x[i,0,k] + 100*y[j,0] */
  kiln_tensor *x = IOTA(I64, S(2, 1, 4));
  kiln_tensor *y = T(I64, S(3, 1), 100, 200, 300);
  double e3[24];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) e3[(i * 3 + j) * 4 + k] = (i * 4 + k) + 100.0 * (j + 1);
  expect_impl(__LINE__, "x[2,1,4] + y[3,1]", kiln_add(x, y), I64, 3, S(2, 3, 4), 24, e3, 0);
  expect_impl(__LINE__, "y[3,1] + x[2,1,4]", kiln_add(y, x), I64, 3, S(2, 3, 4), 24, e3, 0);
  /* rank 5 with a middle broadcast on both sides */
  kiln_tensor *p = IOTA(F64, S(2, 1, 3, 1, 2));
  kiln_tensor *q = IOTA(F64, S(2, 1, 2, 1));
  double e4[48];
  for (int i = 0; i < 48; i++)
    e4[i] = bcast_index(i, 5, S(2, 2, 3, 2, 2), 5, S(2, 1, 3, 1, 2)) -
            10.0 * bcast_index(i, 5, S(2, 2, 3, 2, 2), 4, S(2, 1, 2, 1));
  kiln_tensor *q10 = own(kiln_mul_scalar(q, 10.0));
  expect_impl(__LINE__, "p - 10 q", kiln_sub(p, q10), F64, 5, S(2, 2, 3, 2, 2), 48, e4, 0);
}

TEST(size_zero_dims_broadcast_to_empty_results) {
  EXPECT_EMPTY(kiln_add(EMPTY(F32, S(0, 3)), V(F32, 1, 2, 3)), F32, S(0, 3));
  EXPECT_EMPTY(kiln_mul(EMPTY(I32, S(2, 0)), T(I32, S(2, 1), 1, 2)), I32, S(2, 0));
  EXPECT_EMPTY(kiln_add(EMPTY(F64, S(1, 0)), T(F64, S(3, 1), 1, 2, 3)), F64, S(3, 0));
  EXPECT_EMPTY(kiln_eq(EMPTY(I64, S(0)), scalar0(1, I64)), BOOL_, S(0));
  EXPECT_EMPTY(kiln_add(EMPTY(F32, S(4, 0, 2)), V(F32, 1, 2)), F32, S(4, 0, 2));
  EXPECT_EMPTY(kiln_add(EMPTY(F32, S(0)), V(F32, 5)), F32, S(0));
  EXPECT_EMPTY(kiln_div(EMPTY(I32, S(0, 1)), EMPTY(I32, S(1, 0))), F32, S(0, 0));
  kiln_tensor *z = EMPTY(F32, S(0));
  kiln_tensor *two = V(F32, 1, 2);
  CHECK_ERROR(kiln_add(z, two), KILN_ERR_SHAPE, "[0] and [2]");
}

TEST(incompatible_shapes_error_names_op_and_shapes) {
  kiln_tensor *a = T(F32, S(2, 3), 1, 2, 3, 4, 5, 6);
  kiln_tensor *b = V(F32, 1, 2, 3, 4);
  CHECK_ERROR(kiln_add(a, b), KILN_ERR_SHAPE, "[2,3] and [4]");
  CHECK_ERROR(kiln_add(a, b), KILN_ERR_SHAPE, "kiln_add");
  CHECK_ERROR(kiln_sub(a, b), KILN_ERR_SHAPE, "kiln_sub");
  CHECK_ERROR(kiln_mul(a, b), KILN_ERR_SHAPE, "kiln_mul");
  CHECK_ERROR(kiln_div(a, b), KILN_ERR_SHAPE, "kiln_div");
  CHECK_ERROR(kiln_pow(a, b), KILN_ERR_SHAPE, "kiln_pow");
  CHECK_ERROR(kiln_maximum(a, b), KILN_ERR_SHAPE, "kiln_maximum");
  CHECK_ERROR(kiln_eq(a, b), KILN_ERR_SHAPE, "kiln_eq");
  CHECK_ERROR(kiln_logical_or(a, b), KILN_ERR_SHAPE, "kiln_logical_or");
  CHECK_ERROR(kiln_add(b, a), KILN_ERR_SHAPE, "[4] and [2,3]");
  kiln_tensor *c = T(F32, S(3, 2), 1, 2, 3, 4, 5, 6);
  CHECK_ERROR(kiln_mul(a, c), KILN_ERR_SHAPE, "[2,3] and [3,2]");
  kiln_tensor *d = IOTA(I32, S(2, 3, 4));
  kiln_tensor *e = IOTA(I32, S(3, 1, 4));
  CHECK_ERROR(kiln_add(d, e), KILN_ERR_SHAPE, "[2,3,4] and [3,1,4]");
  CHECK_ERROR(kiln_where(V(BOOL_, 1, 0), V(F32, 1, 2, 3), V(F32, 1, 2, 3)), KILN_ERR_SHAPE,
              "kiln_where");
}

/* issue 13: a broadcast of [2^32] against [2^32,1] has 2^64 elements; it
   used to wrap to numel 0.  Past int64 or past 2^60 elements (the largest
   size whose bytes fit in int64) the op reports a shape error at the call. */
TEST(broadcast_result_too_large_is_a_shape_error_naming_op_and_shapes) {
  kiln_tensor *one = own(kiln_zeros(F32, 1, S(1)));
  kiln_tensor *row = own(kiln_expand(one, 1, S((int64_t)1 << 32)));
  kiln_tensor *col = own(kiln_expand(one, 2, S((int64_t)1 << 32, 1)));
  CHECK(row && col);
  CHECK_ERROR(kiln_add(row, col), KILN_ERR_SHAPE, "kiln_add");
  CHECK_ERROR(kiln_add(row, col), KILN_ERR_SHAPE, "[4294967296] and [4294967296,1]");
  CHECK_ERROR(kiln_mul(col, row), KILN_ERR_SHAPE, "kiln_mul");
  kiln_tensor *cond = own(kiln_expand(own(kiln_zeros(BOOL_, 1, S(1))), 1, S((int64_t)1 << 32)));
  CHECK_ERROR(kiln_where(cond, col, one), KILN_ERR_SHAPE, "kiln_where");
  /* 2^31 x 2^31 = 2^62 fits in int64, its bytes do not */
  kiln_tensor *r31 = own(kiln_expand(one, 1, S((int64_t)1 << 31)));
  kiln_tensor *c31 = own(kiln_expand(one, 2, S((int64_t)1 << 31, 1)));
  CHECK_ERROR(kiln_sub(r31, c31), KILN_ERR_SHAPE, "kiln_sub");
  CHECK_ERROR(kiln_matmul(c31, own(kiln_expand(one, 2, S(1, (int64_t)1 << 31)))), KILN_ERR_SHAPE,
              "kiln_matmul");
  /* batch dims of a matmul broadcast the same way */
  kiln_tensor *m = own(kiln_zeros(F32, 2, S(1, 1)));
  kiln_tensor *ba = own(kiln_expand(m, 4, S((int64_t)1 << 32, 1, 1, 1)));
  kiln_tensor *bb = own(kiln_expand(m, 3, S((int64_t)1 << 32, 1, 1)));
  CHECK_ERROR(kiln_matmul(ba, bb), KILN_ERR_SHAPE, "kiln_matmul");
  CHECK_EQ_INT(kiln_numel(own(kiln_add(row, one))), (int64_t)1 << 32); /* still fine */
}

/* ---- non-contiguous operands ---- */

TEST(expanded_input_matches_contiguous_copy) {
  kiln_tensor *base = T(F32, S(3, 1), 1, 2, 3);
  kiln_tensor *e = own(kiln_expand(base, 2, S(3, 4)));
  kiln_tensor *c = IOTA(F32, S(3, 4));
  EXPECT(kiln_add(e, c), F32, S(3, 4), 0, 1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14);
  EXPECT_SAME(kiln_add(e, c), kiln_add(copy_of(e), c));
  EXPECT(kiln_mul(e, V(F32, 10, 20, 30, 40)), F32, S(3, 4), 0, 10, 20, 30, 40, 20, 40, 60, 80, 30,
         60, 90, 120);
  /* a 0-d expanded to [2,2] and a [4] expanded to [2,3,4] */
  kiln_tensor *s = own(kiln_expand(scalar0(5, I64), 2, S(2, 2)));
  EXPECT(kiln_sub(s, T(I64, S(2, 2), 1, 2, 3, 4)), I64, S(2, 2), 0, 4, 3, 2, 1);
  kiln_tensor *row = V(F64, 1, 2, 3, 4);
  kiln_tensor *e3 = own(kiln_expand(row, 3, S(2, 3, 4)));
  kiln_tensor *a = IOTA(F64, S(2, 3, 4));
  double want[24];
  for (int i = 0; i < 24; i++) want[i] = i * (i % 4 + 1.0);
  expect_impl(__LINE__, "iota * expanded row", kiln_mul(a, e3), F64, 3, S(2, 3, 4), 24, want, 0);
  EXPECT_SAME(kiln_mul(e3, a), kiln_mul(copy_of(e3), a));
  /* both operands expanded */
  EXPECT_SAME(kiln_add(e, e), kiln_add(copy_of(e), copy_of(e)));
}

TEST(transposed_and_permuted_inputs_match_contiguous_copy) {
  kiln_tensor *m = IOTA(I32, S(3, 4));
  kiln_tensor *mt = own(kiln_transpose(m, 0, 1)); /* [4,3], mt[i][j] = 4j + i */
  EXPECT(kiln_add(mt, V(I32, 100, 200, 300)), I32, S(4, 3), 0, 100, 204, 308, 101, 205, 309, 102,
         206, 310, 103, 207, 311);
  EXPECT_SAME(kiln_add(mt, V(I32, 100, 200, 300)), kiln_add(copy_of(mt), V(I32, 100, 200, 300)));
  EXPECT(kiln_add(mt, mt), I32, S(4, 3), 0, 0, 8, 16, 2, 10, 18, 4, 12, 20, 6, 14, 22);
  EXPECT(kiln_mul(T(I32, S(4, 1), 1, -1, 2, 0), mt), I32, S(4, 3), 0, 0, 4, 8, -1, -5, -9, 4, 12,
         20, 0, 0, 0);
  /* transposed against its own contiguous layout: m^T - m^T == 0, and m vs (m^T)^T */
  kiln_tensor *mtt = own(kiln_transpose(mt, 0, 1));
  EXPECT(kiln_eq(mtt, m), BOOL_, S(3, 4), 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  /* permuted 3-d: p[i][j][k] = base[j][k][i] = 12j + 4k + i */
  kiln_tensor *base = IOTA(F64, S(2, 3, 4));
  kiln_tensor *p = own(kiln_permute(base, (const int[]){2, 0, 1})); /* [4,2,3] */
  kiln_tensor *v = V(F64, 0, 0.5, 1);
  double want[24];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 3; k++) want[(i * 2 + j) * 3 + k] = (12 * j + 4 * k + i) + 0.5 * k;
  expect_impl(__LINE__, "permuted + [3]", kiln_add(p, v), F64, 3, S(4, 2, 3), 24, want, 0);
  EXPECT_SAME(kiln_add(p, v), kiln_add(copy_of(p), v));
  /* both operands permuted differently: q[i][j][k] = 8k + 4j + i */
  kiln_tensor *q = own(kiln_permute(IOTA(F64, S(3, 2, 4)), (const int[]){2, 1, 0}));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 3; k++)
        want[(i * 2 + j) * 3 + k] = fmax(12 * j + 4 * k + i, 8 * k + 4 * j + i);
  expect_impl(__LINE__, "maximum(p, q)", kiln_maximum(p, q), F64, 3, S(4, 2, 3), 24, want, 0);
  EXPECT_SAME(kiln_maximum(p, q), kiln_maximum(copy_of(p), copy_of(q)));
}

TEST(sliced_inputs_match_contiguous_copy) {
  kiln_tensor *v = IOTA(F64, S(10));
  kiln_tensor *s = own(kiln_slice(v, 0, 1, 8, 2)); /* 1,3,5,7 */
  EXPECT_V(kiln_add(s, V(F64, 10, 20, 30, 40)), F64, 0, 11, 23, 35, 47);
  EXPECT_SAME(kiln_add(s, V(F64, 10, 20, 30, 40)), kiln_add(copy_of(s), V(F64, 10, 20, 30, 40)));
  kiln_tensor *r = own(kiln_slice(v, 0, 8, 0, -3)); /* 8,5,2 */
  EXPECT_V(kiln_mul(r, scalar0(2, F64)), F64, 0, 16, 10, 4);
  EXPECT_V(kiln_sub(r, own(kiln_slice(v, 0, 0, 3, 1))), F64, 0, 8, 4, 0);
  /* 2-d column slice broadcast against a column */
  kiln_tensor *m = IOTA(F32, S(3, 6));
  kiln_tensor *sl = own(kiln_slice(m, 1, 0, 6, 2)); /* [3,3]: 6i + 2j */
  kiln_tensor *col = T(F32, S(3, 1), 100, 200, 300);
  EXPECT(kiln_add(sl, col), F32, S(3, 3), 0, 100, 102, 104, 206, 208, 210, 312, 314, 316);
  EXPECT_SAME(kiln_add(sl, col), kiln_add(copy_of(sl), col));
  /* slice, then transpose: st[i][j] = 6j + 2i */
  kiln_tensor *st = own(kiln_transpose(sl, 0, 1));
  EXPECT(kiln_sub(st, sl), F32, S(3, 3), 0, 0, 4, 8, -4, 0, 4, -8, -4, 0);
  EXPECT_SAME(kiln_sub(st, sl), kiln_sub(copy_of(st), copy_of(sl)));
  /* row slice with a reversed step on the other axis */
  kiln_tensor *rr = own(kiln_slice(own(kiln_slice(m, 0, 1, 3, 1)), 1, 5, 0, -2)); /* [2,3] */
  EXPECT(kiln_mul(rr, V(I32, 1, 0, -1)), F32, S(2, 3), 0, 11, 0, -7, 17, 0, -13);
  EXPECT_SAME(kiln_mul(rr, V(I32, 1, 0, -1)), kiln_mul(copy_of(rr), V(I32, 1, 0, -1)));
}

/* ---- dtype promotion ---- */

static const kiln_dtype ADD_TABLE[5][5] = {
    /*          bool     i32      i64      f32      f64 */
    /* bool */ {BOOL_, I32, I64, F32, F64},
    /* i32  */ {I32, I32, I64, F32, F64},
    /* i64  */ {I64, I64, I64, F32, F64},
    /* f32  */ {F32, F32, F32, F32, F64},
    /* f64  */ {F64, F64, F64, F64, F64},
};
static const kiln_dtype DIV_TABLE[5][5] = {
    /*          bool     i32      i64      f32      f64 */
    /* bool */ {F32, F32, F32, F32, F64},
    /* i32  */ {F32, F32, F32, F32, F64},
    /* i64  */ {F32, F32, F32, F32, F64},
    /* f32  */ {F32, F32, F32, F32, F64},
    /* f64  */ {F64, F64, F64, F64, F64},
};

/* the promotion operands: A[i] op B[i] in every dtype pair */
static const double PA[4] = {1, 0, 3, -2};
static const double PB[4] = {2.5, 1, 0, 0.25};

typedef enum {
  K_ADD,
  K_SUB,
  K_MUL,
  K_MAX,
  K_MIN,
  K_DIV,
  K_POW,
  K_EQ,
  K_NE,
  K_LT,
  K_LE,
  K_GT,
  K_GE,
  K_AND,
  K_OR
} op_kind;

typedef struct {
  const char *name;
  kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
  op_kind kind;
} binop;

static const binop BINOPS[] = {
    {"kiln_add", kiln_add, K_ADD},
    {"kiln_sub", kiln_sub, K_SUB},
    {"kiln_mul", kiln_mul, K_MUL},
    {"kiln_maximum", kiln_maximum, K_MAX},
    {"kiln_minimum", kiln_minimum, K_MIN},
    {"kiln_div", kiln_div, K_DIV},
    {"kiln_pow", kiln_pow, K_POW},
    {"kiln_eq", kiln_eq, K_EQ},
    {"kiln_ne", kiln_ne, K_NE},
    {"kiln_lt", kiln_lt, K_LT},
    {"kiln_le", kiln_le, K_LE},
    {"kiln_gt", kiln_gt, K_GT},
    {"kiln_ge", kiln_ge, K_GE},
    {"kiln_logical_and", kiln_logical_and, K_AND},
    {"kiln_logical_or", kiln_logical_or, K_OR},
};

static double int_pow(double b, double e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? (fmod(e, 2) == 0 ? 1 : -1) : 0;
  double r = 1;
  for (int i = 0; i < (int)e; i++) r *= b;
  return r;
}

static kiln_dtype result_dtype(op_kind k, kiln_dtype a, kiln_dtype b) {
  int i = (int)a, j = (int)b; /* ALL_DTYPES order is the enum order */
  if (k >= K_EQ) return BOOL_;
  if (k == K_DIV) return DIV_TABLE[i][j];
  return ADD_TABLE[i][j];
}

/* the value of x op y computed in dtype rd (x, y already stored values) */
static double ref_binop(op_kind k, kiln_dtype rd, double x, double y) {
  bool fl = is_float(rd);
  if (rd == KILN_F32) { /* inputs as f32 */
    x = (float)x;
    y = (float)y;
  }
  double r = 0;
  switch (k) {
    case K_ADD:
      r = x + y;
      break;
    case K_SUB:
      r = x - y;
      break;
    case K_MUL:
      r = x * y;
      break;
    case K_MAX:
      r = (isnan(x) || isnan(y)) ? NAN : fmax(x, y);
      break;
    case K_MIN:
      r = (isnan(x) || isnan(y)) ? NAN : fmin(x, y);
      break;
    case K_DIV:
      r = x / y;
      break;
    case K_POW:
      r = fl ? pow(x, y) : int_pow(x, y);
      break;
    case K_EQ:
      r = x == y;
      break;
    case K_NE:
      r = x != y;
      break;
    case K_LT:
      r = x < y;
      break;
    case K_LE:
      r = x <= y;
      break;
    case K_GT:
      r = x > y;
      break;
    case K_GE:
      r = x >= y;
      break;
    case K_AND:
      r = (x != 0) && (y != 0);
      break;
    case K_OR:
      r = (x != 0) || (y != 0);
      break;
  }
  return ktest_as_dtype(rd, r);
}

/* every op in [first, last] over all 25 dtype pairs: dtype and values */
static void check_promotion(op_kind first, op_kind last) {
  for (size_t o = 0; o < sizeof BINOPS / sizeof BINOPS[0]; o++) {
    const binop *op = &BINOPS[o];
    if (op->kind < first || op->kind > last) continue;
    for (int i = 0; i < 5; i++) {
      for (int j = 0; j < 5; j++) {
        kiln_dtype da = ALL_DTYPES[i], db = ALL_DTYPES[j];
        kiln_tensor *a = makev(da, 1, S(4), 4, PA);
        kiln_tensor *b = makev(db, 1, S(4), 4, PB);
        char what[96];
        snprintf(what, sizeof what, "%s(%s, %s)", op->name, ktest_dtype_name(da),
                 ktest_dtype_name(db));
        if (da == BOOL_ && db == BOOL_ && (op->kind == K_SUB || op->kind == K_POW)) {
          int before = ktest_failed_checks;
          CHECK_ERROR(op->fn(a, b), KILN_ERR_DTYPE, op->name);
          if (ktest_failed_checks != before) print_context(__LINE__, what, NULL);
          continue;
        }
        kiln_dtype rd = result_dtype(op->kind, da, db);
        kiln_dtype cd = op->kind >= K_EQ ? ADD_TABLE[i][j] : rd; /* computed in */
        double e[4];
        for (int k = 0; k < 4; k++)
          e[k] = ref_binop(op->kind, cd, ktest_as_dtype(da, PA[k]), ktest_as_dtype(db, PB[k]));
        if (op->kind >= K_EQ)
          for (int k = 0; k < 4; k++) e[k] = e[k] != 0;
        expect_impl(__LINE__, what, op->fn(a, b), rd, 1, S(4), 4, e,
                    op->kind == K_POW ? (rd == F32 ? 1e-6 : 1e-12) : 0);
      }
    }
  }
}

TEST(promotion_table_add_result_dtypes_and_values_5x5) { check_promotion(K_ADD, K_ADD); }
TEST(promotion_table_div_true_division_5x5) { check_promotion(K_DIV, K_DIV); }
TEST(promotion_table_eq_compares_in_promoted_dtype_5x5) { check_promotion(K_EQ, K_EQ); }
TEST(promotion_table_sub_mul_maximum_minimum_5x5) { check_promotion(K_SUB, K_MIN); }
TEST(promotion_table_pow_5x5_bool_bool_rejected) { check_promotion(K_POW, K_POW); }
TEST(promotion_table_ne_lt_le_gt_ge_logical_5x5) { check_promotion(K_NE, K_OR); }

TEST(promotion_table_literal_spot_checks) {
  /* explicit values for a few pairs, independent of the generic reference */
  EXPECT_V(kiln_add(V(BOOL_, 1, 0), V(F32, 0.5, 0.5)), F32, 0, 1.5, 0.5);
  EXPECT_V(kiln_add(V(I32, 2147483647, 1), V(I64, 1, 1)), I64, 0, 2147483648.0, 2);
  EXPECT_V(kiln_add(V(I64, 16777217, 1), V(F32, 0, 0)), F32, 0, 16777216, 1);
  EXPECT_V(kiln_add(V(F32, 0.1), V(F64, 0)), F64, 0, (double)0.1f);
  EXPECT_V(kiln_div(V(I32, 1, 7), V(I64, 4, 2)), F32, 0, 0.25, 3.5);
  EXPECT_V(kiln_div(V(I64, 1), V(F64, 3)), F64, 1e-16, 1.0 / 3);
  EXPECT_V(kiln_div(V(BOOL_, 1), V(F64, 4)), F64, 0, 0.25);
  EXPECT_V(kiln_eq(V(I32, 3, 2), V(F32, 3, 2.5)), BOOL_, 0, 1, 0);
  EXPECT_V(kiln_eq(V(BOOL_, 1, 1), V(I64, 1, 2)), BOOL_, 0, 1, 0);
}

TEST(weak_host_scalars_do_not_widen_float_tensors) {
  EXPECT_V(kiln_mul_scalar(V(F32, 1.5, -3), 2.0), F32, 0, 3, -6);
  EXPECT_V(kiln_mul_scalar(V(F64, 1.5, -3), 2.0), F64, 0, 3, -6);
  /* 1 + 1e-8 is 1 in f32: the scalar does not make the op f64 */
  EXPECT_V(kiln_add_scalar(V(F32, 1), 1e-8), F32, 0, 1);
  EXPECT_V(kiln_add_scalar(V(F64, 1), 1e-8), F64, 0, 1 + 1e-8);
  /* integer and bool tensors with a double scalar give f32 */
  EXPECT_V(kiln_mul_scalar(V(I64, 3, 1099511627776.0), 2.0), F32, 0, 6, 2199023255552.0);
  EXPECT_V(kiln_mul_scalar(V(I32, 3, -5), 2.0), F32, 0, 6, -10);
  EXPECT_V(kiln_mul_scalar(V(BOOL_, 1, 0), 2.0), F32, 0, 2, 0);
  EXPECT_V(kiln_div_scalar(V(I64, 1), 3.0), F32, 1e-7, 1.0 / 3);
  /* clamp bounds are weak too and keep integer tensors integer */
  EXPECT_V(kiln_clamp(V(F32, -5, 5, 0.3), -100, 0.1), F32, 0, -5, 0.1, 0.1);
  EXPECT_V(kiln_clamp(V(I32, -5, 5), -1.5, 1.5), I32, 0, -1, 1);
  /* the scalar broadcasts over any shape, 0-d included */
  EXPECT(kiln_sub_scalar(T(F32, S(2, 1, 2), 1, 2, 3, 4), 1.0), F32, S(2, 1, 2), 0, 0, 1, 2, 3);
  EXPECT_0D(kiln_mul_scalar(scalar0(4, F64), 0.5), F64, 0, 2);
}

TEST(zero_dim_tensor_operand_promotes_like_any_tensor) {
  /* only host scalars are weak: a 0-d f64 tensor makes an f32 op f64 */
  EXPECT_V(kiln_mul(V(F32, 1.5, 2), scalar0(0.1, F64)), F64, 0, 1.5 * 0.1, 0.2);
  EXPECT_V(kiln_add(V(I32, 1, 2), scalar0(3, I64)), I64, 0, 4, 5);
  EXPECT_V(kiln_add(V(I32, 1, 2), scalar0(0.5, F32)), F32, 0, 1.5, 2.5);
}

/* ---- large, multithreaded ---- */

enum { BIG = 1024 }; /* BIG*BIG = 1<<20 elements */

/* out[i][j] = A^T[i][j] * row[j] + col[i], A^T a transposed view; all exact in f32 */
TEST(big_f32_transposed_times_row_plus_col_1m_elements) {
  float *a = malloc(sizeof(float) * BIG * BIG);
  float row[BIG], colv[BIG];
  for (int i = 0; i < BIG; i++)
    for (int j = 0; j < BIG; j++) a[i * BIG + j] = (float)(((i * 7 + j * 13) % 512) * 0.5 - 128);
  for (int j = 0; j < BIG; j++) row[j] = (float)((j % 64) * 0.25);
  for (int i = 0; i < BIG; i++) colv[i] = (float)(i % 32 - 16);
  kiln_tensor *A = own(kiln_from_data(a, F32, 2, S(BIG, BIG)));
  kiln_tensor *At = own(kiln_transpose(A, 0, 1));
  kiln_tensor *r = own(kiln_from_data(row, F32, 1, S(BIG)));
  kiln_tensor *c = own(kiln_from_data(colv, F32, 2, S(BIG, 1)));
  kiln_tensor *out = own(kiln_add(own(kiln_mul(At, r)), c));
  float *got = malloc(sizeof(float) * BIG * BIG);
  if (out && kiln_ndim(out) == 2 && kiln_shape(out)[0] == BIG && kiln_shape(out)[1] == BIG &&
      kiln_dtype_of(out) == F32) {
    CHECK(kiln_to_buffer(out, got, sizeof(float) * BIG * BIG) >= 0);
    int64_t bad = 0;
    for (int i = 0; i < BIG; i++) {
      for (int j = 0; j < BIG; j++) {
        float want = a[j * BIG + i] * row[j] + colv[i];
        if (got[i * BIG + j] != want && bad++ == 0)
          KTEST_FAIL("out[%d][%d] = %.9g, expected %.9g", i, j, got[i * BIG + j], want);
      }
    }
    CHECK_EQ_INT(bad, 0);
  } else {
    KTEST_FAIL("expected an f32 [1024,1024] result: %s", kiln_last_error());
  }
  free(got);
  free(a);
}

/* out[i][j] = B[i][2j+1] - 3i, from a step-2 column slice of an f64 [1024,2048] */
TEST(big_f64_strided_slice_minus_col_1m_elements) {
  double *b = malloc(sizeof(double) * BIG * 2 * BIG);
  double colv[BIG];
  for (int64_t k = 0; k < (int64_t)BIG * 2 * BIG; k++) b[k] = (double)k * 0.25 - 1000.0;
  for (int i = 0; i < BIG; i++) colv[i] = 3.0 * i;
  kiln_tensor *B = own(kiln_from_data(b, F64, 2, S(BIG, 2 * BIG)));
  kiln_tensor *s = own(kiln_slice(B, 1, 1, 2 * BIG, 2));
  kiln_tensor *c = own(kiln_from_data(colv, F64, 2, S(BIG, 1)));
  kiln_tensor *out = own(kiln_sub(s, c));
  double *got = malloc(sizeof(double) * BIG * BIG);
  if (out && kiln_ndim(out) == 2 && kiln_shape(out)[0] == BIG && kiln_shape(out)[1] == BIG &&
      kiln_dtype_of(out) == F64) {
    CHECK(kiln_to_buffer(out, got, sizeof(double) * BIG * BIG) >= 0);
    int64_t bad = 0;
    for (int i = 0; i < BIG; i++) {
      for (int j = 0; j < BIG; j++) {
        double want = b[(int64_t)i * 2 * BIG + 2 * j + 1] - colv[i];
        if (got[i * BIG + j] != want && bad++ == 0)
          KTEST_FAIL("out[%d][%d] = %.17g, expected %.17g", i, j, got[i * BIG + j], want);
      }
    }
    CHECK_EQ_INT(bad, 0);
  } else {
    KTEST_FAIL("expected an f64 [1024,1024] result: %s", kiln_last_error());
  }
  free(got);
  free(b);
}

/* i32 [1,128,128] expanded to [64,128,128] (stride 0) against a [64,1,1] column:
   maximum (i32) and gt (bool), element by element */
TEST(big_i32_expanded_3d_maximum_and_gt_1m_elements) {
  enum { N0 = 64, N1 = 128, N2 = 128 };
  int32_t *x = malloc(sizeof(int32_t) * N1 * N2);
  int32_t y[N0];
  for (int j = 0; j < N1; j++)
    for (int k = 0; k < N2; k++) x[j * N2 + k] = (j * 131 + k * 7) % 1000 - 500;
  for (int i = 0; i < N0; i++) y[i] = i * 16 - 512;
  kiln_tensor *X = own(kiln_from_data(x, I32, 3, S(1, N1, N2)));
  kiln_tensor *Xe = own(kiln_expand(X, 3, S(N0, N1, N2)));
  kiln_tensor *Y = own(kiln_from_data(y, I32, 3, S(N0, 1, 1)));
  kiln_tensor *mx = own(kiln_maximum(Xe, Y));
  kiln_tensor *gt = own(kiln_gt(Xe, Y));
  int32_t *got = malloc(sizeof(int32_t) * N0 * N1 * N2);
  uint8_t *gotb = malloc((size_t)N0 * N1 * N2);
  bool shapes_ok = mx && gt && kiln_numel(mx) == N0 * N1 * N2 && kiln_numel(gt) == N0 * N1 * N2 &&
                   kiln_dtype_of(mx) == I32 && kiln_dtype_of(gt) == BOOL_;
  if (shapes_ok) {
    CHECK(kiln_to_buffer(mx, got, sizeof(int32_t) * N0 * N1 * N2) >= 0);
    CHECK(kiln_to_buffer(gt, gotb, (size_t)N0 * N1 * N2) >= 0);
    int64_t bad = 0;
    for (int i = 0; i < N0; i++) {
      for (int jk = 0; jk < N1 * N2; jk++) {
        int64_t o = (int64_t)i * N1 * N2 + jk;
        int32_t want = x[jk] > y[i] ? x[jk] : y[i];
        uint8_t wantb = x[jk] > y[i];
        if ((got[o] != want || gotb[o] != wantb) && bad++ == 0)
          KTEST_FAIL("flat %lld: max %d gt %d, expected %d and %d", (long long)o, got[o], gotb[o],
                     want, wantb);
      }
    }
    CHECK_EQ_INT(bad, 0);
  } else {
    KTEST_FAIL("expected i32 and bool [64,128,128] results: %s", kiln_last_error());
  }
  free(gotb);
  free(got);
  free(x);
}

int main(void) {
  RUN_T(scalar_0d_broadcasts_against_nd_on_either_side);
  RUN_T(col_3x1_with_row_1x4_gives_3x4);
  RUN_T(trailing_vector_4_against_2x3x4_and_2x1x4_with_3x1);
  RUN_T(size_zero_dims_broadcast_to_empty_results);
  RUN_T(incompatible_shapes_error_names_op_and_shapes);
  RUN_T(broadcast_result_too_large_is_a_shape_error_naming_op_and_shapes);

  RUN_T(expanded_input_matches_contiguous_copy);
  RUN_T(transposed_and_permuted_inputs_match_contiguous_copy);
  RUN_T(sliced_inputs_match_contiguous_copy);

  RUN_T(promotion_table_add_result_dtypes_and_values_5x5);
  RUN_T(promotion_table_div_true_division_5x5);
  RUN_T(promotion_table_eq_compares_in_promoted_dtype_5x5);
  RUN_T(promotion_table_sub_mul_maximum_minimum_5x5);
  RUN_T(promotion_table_pow_5x5_bool_bool_rejected);
  RUN_T(promotion_table_ne_lt_le_gt_ge_logical_5x5);
  RUN_T(promotion_table_literal_spot_checks);
  RUN_T(weak_host_scalars_do_not_widen_float_tensors);
  RUN_T(zero_dim_tensor_operand_promotes_like_any_tensor);

  RUN_T(big_f32_transposed_times_row_plus_col_1m_elements);
  RUN_T(big_f64_strided_slice_minus_col_1m_elements);
  RUN_T(big_i32_expanded_3d_maximum_and_gt_1m_elements);
  return ktest_done();
}
