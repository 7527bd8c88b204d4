/* test_reduce.c — sum, mean, max, min, prod, argmax and argmin against a naive
 * reference written here (nested loops in double, driven by an axis mask):
 * every axis subset of 3-d and 4-d tensors, every dtype, keepdim, negative and
 * unsorted axes, empty and size-1 axes, non-contiguous views, NaN and infinity
 * handling, summation accuracy, large (multithreaded) reductions, and errors. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ktest.h"

/* ---- helpers ------------------------------------------------------------ */

typedef enum { OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_PROD, OP_COUNT } red_op;
static const char *const OP_NAME[OP_COUNT] = {"kiln_sum", "kiln_mean", "kiln_max", "kiln_min",
                                              "kiln_prod"};
static const kiln_dtype ALL_DTYPES[5] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64};

static bool is_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64; }

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* a tensor of dtype dt holding vals (row-major doubles, converted) */
static kiln_tensor *make(kiln_dtype dt, int ndim, const int64_t *shape, const double *vals) {
  kiln_tensor *t = ktest_from_doubles(dt, ndim, shape, vals);
  if (!t) KTEST_FAIL("kiln_from_data(%s) failed: %s", ktest_dtype_name(dt), kiln_last_error());
  return t;
}

/* deterministic test values: bool 0/1; integers in {-3..3} without 0 (so
   products stay exact and nonzero); floats of magnitude in [0.75, 1.25] with
   mixed signs, all distinct.  Already rounded to dt. */
static double gen(kiln_dtype dt, int64_t i) {
  static const int ints[7] = {1, -2, 3, -1, 2, -3, 1};
  switch (dt) {
    case KILN_BOOL:
      return ((i * 5 + 1) % 3) != 0;
    case KILN_I32:
    case KILN_I64:
      return ints[(i * 5 + 2) % 7];
    default: {
      double f = fmod((double)i * 0.6180339887498949, 1.0);
      double s = ((i * 3) % 5 < 2) ? -1.0 : 1.0;
      return ktest_as_dtype(dt, s * (0.75 + 0.5 * f));
    }
  }
}

static double *gen_values(kiln_dtype dt, int64_t n) {
  double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) v[i] = gen(dt, i);
  return v;
}

/* logical row-major values of a strided view of `base` (element strides) */
static void strided_values(const double *base, int64_t offset, int ndim, const int64_t *shape,
                           const int64_t *strides, double *out) {
  int64_t n = numel_of(ndim, shape);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, p = offset;
    for (int d = ndim - 1; d >= 0; d--) {
      p += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    out[i] = base[p];
  }
}

static kiln_tensor *call_op(red_op op, kiln_tensor *a, int naxes, const int *axes, bool keep) {
  switch (op) {
    case OP_SUM:
      return kiln_sum(a, naxes, axes, keep);
    case OP_MEAN:
      return kiln_mean(a, naxes, axes, keep);
    case OP_MAX:
      return kiln_max(a, naxes, axes, keep);
    case OP_MIN:
      return kiln_min(a, naxes, axes, keep);
    case OP_PROD:
      return kiln_prod(a, naxes, axes, keep);
    default:
      return NULL;
  }
}

static kiln_dtype result_dtype(red_op op, kiln_dtype in) {
  switch (op) {
    case OP_SUM:
    case OP_PROD:
      return is_float(in) ? in : KILN_I64;
    case OP_MEAN:
      return is_float(in) ? in : KILN_F32;
    default:
      return in;
  }
}

static double tol_for(kiln_dtype dt) {
  return dt == KILN_F32 ? 1e-5 : dt == KILN_F64 ? 1e-12 : 0.0;
}

/* CHECK_CLOSE's rule: |a-b| <= tol*max(1,|b|); NaN equals NaN; infinities match */
static bool close_enough(double a, double b, double tol) {
  return (isnan(a) && isnan(b)) || a == b ||
         (isfinite(a) && isfinite(b) && fabs(a - b) <= tol * fmax(1.0, fabs(b)));
}

static bool rel_close(double a, double b, double rel) {
  return isfinite(a) && fabs(a - b) <= rel * fabs(b);
}

/* Naive reference: reduces x (row-major, `shape`) over the axes set in `mask`
   in double.  out is row-major over the kept axes; returns its length.
   max/min propagate NaN; mean of nothing is NaN (0/0). */
static int64_t ref_reduce(red_op op, const double *x, int ndim, const int64_t *shape, unsigned mask,
                          double *out) {
  int64_t ostride[KILN_MAX_DIMS], nout = 1, count = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    if (mask >> d & 1u) {
      ostride[d] = 0;
      count *= shape[d];
    } else {
      ostride[d] = nout;
      nout *= shape[d];
    }
  }
  for (int64_t o = 0; o < nout; o++)
    out[o] = op == OP_PROD ? 1.0 : op == OP_MAX ? -INFINITY : op == OP_MIN ? INFINITY : 0.0;
  int64_t n = numel_of(ndim, shape);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, o = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      o += (rem % shape[d]) * ostride[d];
      rem /= shape[d];
    }
    double v = x[i], *acc = &out[o];
    switch (op) {
      case OP_SUM:
      case OP_MEAN:
        *acc += v;
        break;
      case OP_PROD:
        *acc *= v;
        break;
      case OP_MAX:
        if (!isnan(*acc) && (isnan(v) || v > *acc)) *acc = v;
        break;
      case OP_MIN:
        if (!isnan(*acc) && (isnan(v) || v < *acc)) *acc = v;
        break;
      default:
        break;
    }
  }
  if (op == OP_MEAN)
    for (int64_t o = 0; o < nout; o++) out[o] = out[o] / (double)count;
  return nout;
}

/* Naive argmax/argmin along `axis`: first index of the extreme, first NaN wins */
static void ref_arg(bool is_max, const double *x, int ndim, const int64_t *shape, int axis,
                    double *out) {
  int64_t outer = 1, inner = 1, n = shape[axis];
  for (int d = 0; d < axis; d++) outer *= shape[d];
  for (int d = axis + 1; d < ndim; d++) inner *= shape[d];
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t in = 0; in < inner; in++) {
      const double *p = x + o * n * inner + in;
      int64_t best = 0;
      double bv = p[0];
      for (int64_t k = 1; k < n && !isnan(bv); k++) {
        double v = p[k * inner];
        if (isnan(v) || (is_max ? v > bv : v < bv)) {
          best = k;
          bv = v;
        }
      }
      out[o * inner + in] = (double)best;
    }
  }
}

/* axes for `mask`: variant 0 ascending positive, 1 descending negative,
   2 ascending with every second axis negative */
static int build_axes(int ndim, unsigned mask, int variant, int *axes) {
  int n = 0;
  if (variant == 1) {
    for (int d = ndim - 1; d >= 0; d--)
      if (mask >> d & 1u) axes[n++] = d - ndim;
  } else {
    for (int d = 0; d < ndim; d++)
      if (mask >> d & 1u) {
        axes[n] = (variant == 2 && n % 2 == 1) ? d - ndim : d;
        n++;
      }
  }
  return n;
}

/* Checks one reduction of `a` (whose logical values are av) against the
   reference: result dtype, shape (keepdim or not) and every value.
   mask == 0 calls the op with naxes == 0 (all axes). */
static void check_reduce(red_op op, kiln_tensor *a, const double *av, unsigned mask, bool keep,
                         int variant, const char *what) {
  if (!a) {
    KTEST_FAIL("%s: input is NULL: %s", what, kiln_last_error());
    return;
  }
  int ndim = kiln_ndim(a);
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, kiln_shape(a), sizeof(int64_t) * (size_t)ndim);
  unsigned rmask = mask ? mask : (1u << ndim) - 1u;
  int axes[KILN_MAX_DIMS];
  int naxes = mask ? build_axes(ndim, mask, variant, axes) : 0;
  kiln_dtype in = kiln_dtype_of(a), want_dt = result_dtype(op, in);

  int64_t n = numel_of(ndim, shape);
  double *ref = malloc((size_t)(n ? n : 1) * sizeof(double));
  int64_t nout = ref_reduce(op, av, ndim, shape, rmask, ref);

  kiln_tensor *r = call_op(op, a, naxes, naxes ? axes : NULL, keep);
  if (!r) {
    KTEST_FAIL("%s(%s %s, axis mask %#x, keepdim %d, variant %d) failed: %s", OP_NAME[op], what,
               ktest_dtype_name(in), mask, keep, variant, kiln_last_error());
    free(ref);
    return;
  }
  int64_t eshape[KILN_MAX_DIMS];
  int endim = 0;
  for (int d = 0; d < ndim; d++) {
    if (!(rmask >> d & 1u))
      eshape[endim++] = shape[d];
    else if (keep)
      eshape[endim++] = 1;
  }
  bool ok = kiln_dtype_of(r) == want_dt && kiln_ndim(r) == endim;
  for (int d = 0; ok && d < endim; d++) ok = kiln_shape(r)[d] == eshape[d];
  if (kiln_dtype_of(r) != want_dt) {
    KTEST_FAIL("%s(%s %s, mask %#x, keepdim %d): dtype %s, expected %s", OP_NAME[op], what,
               ktest_dtype_name(in), mask, keep, ktest_dtype_name(kiln_dtype_of(r)),
               ktest_dtype_name(want_dt));
  } else if (!ok) {
    KTEST_FAIL("%s(%s %s, mask %#x, keepdim %d, variant %d): wrong shape (ndim %d, expected %d)",
               OP_NAME[op], what, ktest_dtype_name(in), mask, keep, variant, kiln_ndim(r), endim);
  } else {
    double *got = ktest_values(r);
    double tol = tol_for(want_dt);
    for (int64_t i = 0; i < nout; i++) {
      if (!close_enough(got[i], ref[i], tol)) {
        KTEST_FAIL("%s(%s %s, mask %#x, keepdim %d, variant %d)[%lld] = %.17g, expected %.17g",
                   OP_NAME[op], what, ktest_dtype_name(in), mask, keep, variant, (long long)i,
                   got[i], ref[i]);
        break;
      }
    }
    free(got);
  }
  kiln_release(r);
  free(ref);
}

/* every op (mean skipped for bool), every axis subset, keepdim on and off;
   the axis spelling cycles through the variants */
static void check_all_subsets(kiln_tensor *a, const double *av, const char *what) {
  int ndim = kiln_ndim(a);
  for (int op = 0; op < OP_COUNT; op++) {
    if (op == OP_MEAN && kiln_dtype_of(a) == KILN_BOOL) continue;
    for (unsigned mask = 0; mask < (1u << ndim); mask++)
      for (int keep = 0; keep < 2; keep++)
        check_reduce((red_op)op, a, av, mask, keep,
                     (int)((mask + (unsigned)keep + (unsigned)op) % 3), what);
  }
}

/* reads an i64 tensor exactly */
static bool read_i64(kiln_tensor *t, int64_t *dst, int64_t n) {
  if (!t || kiln_dtype_of(t) != KILN_I64 || kiln_numel(t) != n) return false;
  return kiln_to_buffer(t, dst, (size_t)n * sizeof(int64_t)) >= 0;
}

/* ---- every axis subset, every dtype ------------------------------------- */

TEST(reduce_3d_every_axis_subset_every_dtype) {
  const int64_t shape[3] = {2, 3, 4};
  for (int k = 0; k < 5; k++) {
    double *v = gen_values(ALL_DTYPES[k], 24);
    kiln_tensor *a = make(ALL_DTYPES[k], 3, shape, v);
    if (a) check_all_subsets(a, v, "[2,3,4]");
    kiln_release(a);
    free(v);
  }
}

TEST(reduce_4d_every_axis_subset_every_dtype) {
  const int64_t shape[4] = {2, 3, 1, 4};
  for (int k = 0; k < 5; k++) {
    double *v = gen_values(ALL_DTYPES[k], 24);
    kiln_tensor *a = make(ALL_DTYPES[k], 4, shape, v);
    if (a) check_all_subsets(a, v, "[2,3,1,4]");
    kiln_release(a);
    free(v);
  }
}

TEST(reduce_every_axis_spelling_gives_same_result) {
  /* the same subsets spelled ascending, descending-negative and mixed */
  const int64_t shape[3] = {2, 3, 4};
  double *v = gen_values(KILN_F64, 24);
  kiln_tensor *a = make(KILN_F64, 3, shape, v);
  for (unsigned mask = 1; mask < 8; mask++)
    for (int variant = 0; variant < 3; variant++) {
      check_reduce(OP_SUM, a, v, mask, false, variant, "[2,3,4]");
      check_reduce(OP_MAX, a, v, mask, true, variant, "[2,3,4]");
    }
  kiln_release(a);
  free(v);
}

TEST(reduce_result_dtypes) {
  const int64_t shape[2] = {2, 2};
  const double v[4] = {1, 0, 1, 1};
  for (int k = 0; k < 5; k++) {
    kiln_dtype dt = ALL_DTYPES[k];
    kiln_tensor *a = make(dt, 2, shape, v);
    kiln_tensor *s = kiln_sum(a, 0, NULL, false), *p = kiln_prod(a, 0, NULL, false);
    kiln_tensor *mx = kiln_max(a, 0, NULL, false), *mn = kiln_min(a, 0, NULL, false);
    kiln_tensor *m = dt == KILN_BOOL ? NULL : kiln_mean(a, 0, NULL, false);
    kiln_dtype want_sum = is_float(dt) ? dt : KILN_I64;
    CHECK(s && kiln_dtype_of(s) == want_sum);
    CHECK(p && kiln_dtype_of(p) == want_sum);
    CHECK(mx && kiln_dtype_of(mx) == dt);
    CHECK(mn && kiln_dtype_of(mn) == dt);
    if (dt != KILN_BOOL) CHECK(m && kiln_dtype_of(m) == (is_float(dt) ? dt : KILN_F32));
    if (s) CHECK_CLOSE(kiln_item(s), 3.0, 0);
    if (p) CHECK_CLOSE(kiln_item(p), 0.0, 0);
    if (mx) CHECK_CLOSE(kiln_item(mx), 1.0, 0);
    if (mn) CHECK_CLOSE(kiln_item(mn), 0.0, 0);
    if (m) CHECK_CLOSE(kiln_item(m), 0.75, 0);
    kiln_release(s), kiln_release(p), kiln_release(mx), kiln_release(mn), kiln_release(m);
    kiln_release(a);
  }
}

/* ---- integer and bool specifics ---------------------------------------- */

TEST(sum_of_i32_accumulates_in_i64) {
  const int64_t shape[2] = {2, 3};
  const double v[6] = {2000000000, 2000000000, 2000000000, -2000000000, -2000000000, 5};
  kiln_tensor *a = make(KILN_I32, 2, shape, v);
  int ax1[1] = {1}, ax0[1] = {0};
  kiln_tensor *rows = kiln_sum(a, 1, ax1, false), *cols = kiln_sum(a, 1, ax0, false);
  kiln_tensor *all = kiln_sum(a, 0, NULL, false);
  int64_t got[3] = {0, 0, 0};
  CHECK(read_i64(rows, got, 2));
  CHECK_EQ_INT(got[0], 6000000000LL);
  CHECK_EQ_INT(got[1], -3999999995LL);
  CHECK(read_i64(cols, got, 3));
  CHECK_EQ_INT(got[0], 0);
  CHECK_EQ_INT(got[1], 0);
  CHECK_EQ_INT(got[2], 2000000005LL);
  CHECK(read_i64(all, got, 1));
  CHECK_EQ_INT(got[0], 2000000005LL);
  kiln_release(rows), kiln_release(cols), kiln_release(all), kiln_release(a);
}

TEST(sum_of_i64_is_exact_beyond_2_pow_53) {
  const int64_t big = (int64_t)1 << 60, vals[3] = {big, 1, 1}, shape[1] = {3};
  kiln_tensor *a = kiln_from_data(vals, KILN_I64, 1, shape);
  kiln_tensor *s = kiln_sum(a, 0, NULL, false);
  int64_t got = 0;
  CHECK(read_i64(s, &got, 1));
  CHECK_EQ_INT(got, big + 2);
  kiln_release(s), kiln_release(a);
}

TEST(prod_of_i32_accumulates_in_i64) {
  const int64_t shape[1] = {3};
  const double v[3] = {100000, 100000, -3};
  kiln_tensor *a = make(KILN_I32, 1, shape, v);
  kiln_tensor *p = kiln_prod(a, 0, NULL, false);
  int64_t got = 0;
  CHECK(read_i64(p, &got, 1));
  CHECK_EQ_INT(got, -30000000000LL);
  kiln_release(p), kiln_release(a);
}

TEST(mean_of_integers_is_true_division_in_f32) {
  const int64_t shape[2] = {2, 2};
  const double v[4] = {1, 2, 4, 7};
  int ax1[1] = {1};
  for (int k = 1; k <= 2; k++) {
    kiln_tensor *a = make(ALL_DTYPES[k], 2, shape, v);
    kiln_tensor *m = kiln_mean(a, 1, ax1, false);
    const int64_t es[1] = {2};
    const double e[2] = {1.5, 5.5};
    CHECK(m && kiln_dtype_of(m) == KILN_F32);
    CHECK_TENSOR(m, 1, es, e, 0);
    kiln_release(m), kiln_release(a);
  }
}

TEST(sum_of_bool_counts_true_values) {
  const int64_t shape[2] = {2, 4};
  const double v[8] = {1, 1, 1, 0, 0, 0, 0, 1};
  kiln_tensor *a = make(KILN_BOOL, 2, shape, v);
  int ax1[1] = {1};
  kiln_tensor *s = kiln_sum(a, 1, ax1, false);
  const int64_t es[1] = {2};
  const double e[2] = {3, 1};
  CHECK(s && kiln_dtype_of(s) == KILN_I64);
  CHECK_TENSOR(s, 1, es, e, 0);
  kiln_tensor *mx = kiln_max(a, 1, ax1, false), *mn = kiln_min(a, 1, ax1, false);
  const double emx[2] = {1, 1}, emn[2] = {0, 0};
  CHECK(mx && kiln_dtype_of(mx) == KILN_BOOL);
  CHECK_TENSOR(mx, 1, es, emx, 0);
  CHECK_TENSOR(mn, 1, es, emn, 0);
  kiln_release(s), kiln_release(mx), kiln_release(mn), kiln_release(a);
}

TEST(max_min_of_integer_extremes_are_exact) {
  const int64_t v64[4] = {INT64_MIN + 5, INT64_MIN, INT64_MAX, INT64_MAX - 7}, s2[2] = {2, 2};
  kiln_tensor *a = kiln_from_data(v64, KILN_I64, 2, s2);
  int ax1[1] = {1};
  kiln_tensor *mx = kiln_max(a, 1, ax1, false), *mn = kiln_min(a, 1, ax1, false);
  int64_t got[2] = {0, 0};
  CHECK(read_i64(mx, got, 2));
  CHECK_EQ_INT(got[0], INT64_MIN + 5);
  CHECK_EQ_INT(got[1], INT64_MAX);
  CHECK(read_i64(mn, got, 2));
  CHECK_EQ_INT(got[0], INT64_MIN);
  CHECK_EQ_INT(got[1], INT64_MAX - 7);
  kiln_release(mx), kiln_release(mn), kiln_release(a);

  const int32_t v32[3] = {INT32_MIN, INT32_MIN + 1, INT32_MIN + 2};
  const int64_t s1[1] = {3};
  kiln_tensor *b = kiln_from_data(v32, KILN_I32, 1, s1);
  kiln_tensor *bmx = kiln_max(b, 0, NULL, false), *bmn = kiln_min(b, 0, NULL, false);
  int32_t g32 = 0;
  CHECK(bmx && kiln_dtype_of(bmx) == KILN_I32 && kiln_to_buffer(bmx, &g32, 4) >= 0);
  CHECK_EQ_INT(g32, INT32_MIN + 2);
  CHECK(bmn && kiln_to_buffer(bmn, &g32, 4) >= 0);
  CHECK_EQ_INT(g32, INT32_MIN);
  kiln_release(bmx), kiln_release(bmn), kiln_release(b);
}

/* ---- shapes: all axes, 0-d, empty, size 1 -------------------------------- */

TEST(reduce_all_axes_gives_0d_or_keepdim_ones) {
  const int64_t shape[3] = {2, 3, 4};
  double *v = gen_values(KILN_F64, 24);
  kiln_tensor *a = make(KILN_F64, 3, shape, v);
  double total = 0;
  for (int i = 0; i < 24; i++) total += v[i];
  kiln_tensor *s = kiln_sum(a, 0, NULL, false), *k = kiln_sum(a, 0, NULL, true);
  CHECK(s && kiln_ndim(s) == 0 && kiln_numel(s) == 1);
  if (s) CHECK_CLOSE(kiln_item(s), total, 1e-12);
  const int64_t ones[3] = {1, 1, 1};
  CHECK_TENSOR(k, 3, ones, &total, 1e-12);
  int all[3] = {2, 0, -2};
  kiln_tensor *e = kiln_sum(a, 3, all, false);
  CHECK(e && kiln_ndim(e) == 0);
  if (e) CHECK_CLOSE(kiln_item(e), total, 1e-12);
  kiln_release(s), kiln_release(k), kiln_release(e), kiln_release(a);
  free(v);
}

TEST(reduce_of_0d_tensor_is_identity) {
  kiln_tensor *a = kiln_scalar(-2.5, KILN_F32);
  for (int op = 0; op < OP_COUNT; op++) {
    kiln_tensor *r = call_op((red_op)op, a, 0, NULL, false);
    CHECK(r && kiln_ndim(r) == 0 && kiln_dtype_of(r) == KILN_F32);
    if (r) CHECK_CLOSE(kiln_item(r), -2.5, 0);
    kiln_release(r);
  }
  kiln_tensor *i = kiln_scalar(7, KILN_I32);
  kiln_tensor *si = kiln_sum(i, 0, NULL, false);
  CHECK(si && kiln_ndim(si) == 0 && kiln_dtype_of(si) == KILN_I64);
  if (si) CHECK_CLOSE(kiln_item(si), 7, 0);
  kiln_release(si), kiln_release(i), kiln_release(a);
}

TEST(reduce_over_empty_axis) {
  const int64_t shape[2] = {0, 3}, s3[1] = {3};
  int ax0[1] = {0};
  const double zeros[3] = {0, 0, 0}, ones[3] = {1, 1, 1}, nans[3] = {NAN, NAN, NAN};
  for (int k = 1; k < 5; k++) {
    kiln_dtype dt = ALL_DTYPES[k];
    kiln_tensor *a = kiln_zeros(dt, 2, shape);
    CHECK(a && kiln_numel(a) == 0);
    kiln_tensor *s = kiln_sum(a, 1, ax0, false), *p = kiln_prod(a, 1, ax0, false);
    kiln_tensor *m = kiln_mean(a, 1, ax0, false);
    CHECK(s && kiln_dtype_of(s) == result_dtype(OP_SUM, dt));
    CHECK_TENSOR(s, 1, s3, zeros, 0);
    CHECK(p && kiln_dtype_of(p) == result_dtype(OP_PROD, dt));
    CHECK_TENSOR(p, 1, s3, ones, 0);
    CHECK(m && kiln_dtype_of(m) == result_dtype(OP_MEAN, dt));
    CHECK_TENSOR(m, 1, s3, nans, 0);
    CHECK_ERROR(kiln_max(a, 1, ax0, false), KILN_ERR_SHAPE, "kiln_max");
    CHECK_ERROR(kiln_min(a, 1, ax0, false), KILN_ERR_SHAPE, "kiln_min");
    CHECK_ERROR(kiln_max(a, 0, NULL, false), KILN_ERR_SHAPE, "kiln_max");
    CHECK_ERROR(kiln_min(a, 0, NULL, true), KILN_ERR_SHAPE, "kiln_min");
    /* all axes: 0-d sum 0, prod 1, mean NaN */
    kiln_tensor *sa = kiln_sum(a, 0, NULL, false), *pa = kiln_prod(a, 0, NULL, false);
    kiln_tensor *ma = kiln_mean(a, 0, NULL, false);
    CHECK(sa && kiln_ndim(sa) == 0 && pa && ma);
    if (sa) CHECK_CLOSE(kiln_item(sa), 0, 0);
    if (pa) CHECK_CLOSE(kiln_item(pa), 1, 0);
    if (ma) CHECK(isnan(kiln_item(ma)));
    /* keepdim keeps the emptied axis as 1 */
    kiln_tensor *sk = kiln_sum(a, 1, ax0, true);
    const int64_t s13[2] = {1, 3};
    CHECK_TENSOR(sk, 2, s13, zeros, 0);
    kiln_release(s), kiln_release(p), kiln_release(m), kiln_release(sa), kiln_release(pa);
    kiln_release(ma), kiln_release(sk), kiln_release(a);
  }
}

TEST(reduce_of_nonempty_axis_of_empty_tensor_is_empty) {
  const int64_t shape[2] = {0, 3}, s0[1] = {0}, s01[2] = {0, 1};
  int ax1[1] = {1};
  kiln_tensor *a = kiln_zeros(KILN_F32, 2, shape);
  for (int op = 0; op < OP_COUNT; op++) {
    kiln_tensor *r = call_op((red_op)op, a, 1, ax1, false);
    CHECK(r != NULL);
    CHECK_TENSOR(r, 1, s0, NULL, 0);
    kiln_release(r);
    r = call_op((red_op)op, a, 1, ax1, true);
    CHECK_TENSOR(r, 2, s01, NULL, 0);
    kiln_release(r);
  }
  kiln_tensor *am = kiln_argmax(a, 1, false);
  CHECK(am && kiln_dtype_of(am) == KILN_I64);
  CHECK_TENSOR(am, 1, s0, NULL, 0);
  kiln_release(am), kiln_release(a);
}

TEST(reduce_over_size1_axes) {
  const int64_t shape[3] = {3, 1, 4}, s34[2] = {3, 4};
  double *v = gen_values(KILN_F32, 12);
  kiln_tensor *a = make(KILN_F32, 3, shape, v);
  int ax1[1] = {1}, axm2[1] = {-2};
  for (int op = 0; op < OP_COUNT; op++) {
    kiln_tensor *r = call_op((red_op)op, a, 1, op % 2 ? axm2 : ax1, false);
    CHECK_TENSOR(r, 2, s34, v, 1e-7); /* reducing one element is the element */
    kiln_release(r);
  }
  kiln_tensor *am = kiln_argmax(a, 1, false), *an = kiln_argmin(a, -2, true);
  const double zeros[12] = {0};
  CHECK_TENSOR(am, 2, s34, zeros, 0);
  CHECK_TENSOR(an, 3, shape, zeros, 0);
  kiln_release(am), kiln_release(an), kiln_release(a);
  free(v);

  const int64_t s11[2] = {1, 1}, none[1] = {0};
  const double seven = 7;
  kiln_tensor *b = make(KILN_I32, 2, s11, &seven);
  kiln_tensor *sb = kiln_sum(b, 0, NULL, false), *pb = kiln_prod(b, 0, NULL, true);
  CHECK_TENSOR(sb, 0, none, &seven, 0);
  CHECK_TENSOR(pb, 2, s11, &seven, 0);
  kiln_release(sb), kiln_release(pb), kiln_release(b);
}

/* ---- non-contiguous inputs --------------------------------------------- */

static const kiln_dtype VIEW_DTYPES[4] = {KILN_I32, KILN_I64, KILN_F32, KILN_F64};

TEST(reduce_of_permuted_view) {
  const int64_t bshape[3] = {4, 3, 2}, vshape[3] = {2, 3, 4}, vstr[3] = {1, 2, 6};
  const int perm[3] = {2, 1, 0};
  for (int k = 0; k < 4; k++) {
    double *base = gen_values(VIEW_DTYPES[k], 24), lv[24];
    kiln_tensor *b = make(VIEW_DTYPES[k], 3, bshape, base);
    kiln_tensor *t = kiln_permute(b, perm);
    strided_values(base, 0, 3, vshape, vstr, lv);
    CHECK(t && kiln_ndim(t) == 3 && kiln_shape(t)[0] == 2 && kiln_shape(t)[2] == 4);
    if (t) check_all_subsets(t, lv, "permute([4,3,2],{2,1,0})");
    kiln_release(t), kiln_release(b);
    free(base);
  }
}

TEST(reduce_of_transposed_inner_axes) {
  const int64_t bshape[3] = {2, 4, 3}, vshape[3] = {2, 3, 4}, vstr[3] = {12, 1, 3};
  for (int k = 0; k < 4; k++) {
    double *base = gen_values(VIEW_DTYPES[k], 24), lv[24];
    kiln_tensor *b = make(VIEW_DTYPES[k], 3, bshape, base);
    kiln_tensor *t = kiln_transpose(b, 1, 2);
    strided_values(base, 0, 3, vshape, vstr, lv);
    if (t)
      check_all_subsets(t, lv, "transpose([2,4,3],1,2)");
    else
      KTEST_FAIL("kiln_transpose failed: %s", kiln_last_error());
    kiln_release(t), kiln_release(b);
    free(base);
  }
}

TEST(reduce_of_sliced_view_with_steps) {
  /* base [4,3,8]; rows 1,3 (step 2); last axis 7,5,3,1 (step -2) -> [2,3,4] */
  const int64_t bshape[3] = {4, 3, 8}, vshape[3] = {2, 3, 4}, vstr[3] = {48, 8, -2};
  for (int k = 0; k < 4; k++) {
    double *base = gen_values(VIEW_DTYPES[k], 96), lv[24];
    kiln_tensor *b = make(VIEW_DTYPES[k], 3, bshape, base);
    kiln_tensor *s1 = kiln_slice(b, 0, 1, 4, 2);
    kiln_tensor *t = kiln_slice(s1, 2, 7, 0, -2);
    strided_values(base, 24 + 7, 3, vshape, vstr, lv);
    CHECK(t && kiln_shape(t)[0] == 2 && kiln_shape(t)[1] == 3 && kiln_shape(t)[2] == 4);
    if (t) check_all_subsets(t, lv, "slice([4,3,8])");
    kiln_release(t), kiln_release(s1), kiln_release(b);
    free(base);
  }
}

TEST(reduce_of_expanded_view) {
  const int64_t bshape[3] = {1, 3, 1}, vshape[3] = {2, 3, 4}, vstr[3] = {0, 1, 0};
  for (int k = 0; k < 4; k++) {
    double *base = gen_values(VIEW_DTYPES[k], 3), lv[24];
    kiln_tensor *b = make(VIEW_DTYPES[k], 3, bshape, base);
    kiln_tensor *t = kiln_expand(b, 3, vshape);
    strided_values(base, 0, 3, vshape, vstr, lv);
    if (t)
      check_all_subsets(t, lv, "expand([1,3,1]->[2,3,4])");
    else
      KTEST_FAIL("kiln_expand failed: %s", kiln_last_error());
    kiln_release(t), kiln_release(b);
    free(base);
  }
}

TEST(reduce_of_pending_elementwise_expression) {
  /* sum/max over (a*b + 1): the reduction consumes a fused producer */
  const int64_t shape[2] = {5, 7};
  double av[35], bv[35], ev[35];
  for (int i = 0; i < 35; i++) {
    av[i] = gen(KILN_F64, i);
    bv[i] = gen(KILN_F64, 100 + i);
    ev[i] = av[i] * bv[i] + 1.0;
  }
  kiln_tensor *a = make(KILN_F64, 2, shape, av), *b = make(KILN_F64, 2, shape, bv);
  kiln_tensor *ab = kiln_mul(a, b), *e = kiln_add_scalar(ab, 1.0);
  for (unsigned mask = 0; mask < 4; mask++) {
    check_reduce(OP_SUM, e, ev, mask, false, 0, "a*b+1");
    check_reduce(OP_MAX, e, ev, mask, true, 1, "a*b+1");
  }
  kiln_release(e), kiln_release(ab), kiln_release(a), kiln_release(b);
}

/* ---- NaN and infinities -------------------------------------------------- */

TEST(max_min_propagate_nan) {
  const int64_t shape[2] = {3, 4}, s3[1] = {3}, s4[1] = {4}, none[1] = {0};
  const double v[12] = {NAN, 1, 2, 3, /**/ 1, 5, -2, NAN, /**/ 0, -1, 7, 2};
  int ax0[1] = {0}, ax1[1] = {-1};
  for (int k = 3; k < 5; k++) {
    kiln_tensor *a = make(ALL_DTYPES[k], 2, shape, v);
    kiln_tensor *mx1 = kiln_max(a, 1, ax1, false), *mn1 = kiln_min(a, 1, ax1, false);
    kiln_tensor *mx0 = kiln_max(a, 1, ax0, false), *mn0 = kiln_min(a, 1, ax0, false);
    kiln_tensor *mxa = kiln_max(a, 0, NULL, false), *mna = kiln_min(a, 0, NULL, false);
    const double emx1[3] = {NAN, NAN, 7}, emn1[3] = {NAN, NAN, -1};
    const double emx0[4] = {NAN, 5, 7, NAN}, emn0[4] = {NAN, -1, -2, NAN}, enan = NAN;
    CHECK_TENSOR(mx1, 1, s3, emx1, 0);
    CHECK_TENSOR(mn1, 1, s3, emn1, 0);
    CHECK_TENSOR(mx0, 1, s4, emx0, 0);
    CHECK_TENSOR(mn0, 1, s4, emn0, 0);
    CHECK_TENSOR(mxa, 0, none, &enan, 0);
    CHECK_TENSOR(mna, 0, none, &enan, 0);
    /* sum and mean propagate NaN too (IEEE) */
    kiln_tensor *s1 = kiln_sum(a, 1, ax1, false);
    const double es1[3] = {NAN, NAN, 8};
    CHECK_TENSOR(s1, 1, s3, es1, 0);
    kiln_release(mx1), kiln_release(mn1), kiln_release(mx0), kiln_release(mn0);
    kiln_release(mxa), kiln_release(mna), kiln_release(s1), kiln_release(a);
  }
}

TEST(max_min_handle_infinities) {
  const int64_t shape[2] = {2, 3}, s2[1] = {2};
  const double v[6] = {-INFINITY, -INFINITY, -INFINITY, INFINITY, INFINITY, 1};
  int ax1[1] = {1};
  for (int k = 3; k < 5; k++) {
    kiln_tensor *a = make(ALL_DTYPES[k], 2, shape, v);
    kiln_tensor *mx = kiln_max(a, 1, ax1, false), *mn = kiln_min(a, 1, ax1, false);
    kiln_tensor *s = kiln_sum(a, 1, ax1, false);
    kiln_tensor *am = kiln_argmax(a, 1, false), *an = kiln_argmin(a, 1, false);
    const double emx[2] = {-INFINITY, INFINITY}, emn[2] = {-INFINITY, 1};
    const double es[2] = {-INFINITY, INFINITY}, eam[2] = {0, 0}, ean[2] = {0, 2};
    CHECK_TENSOR(mx, 1, s2, emx, 0);
    CHECK_TENSOR(mn, 1, s2, emn, 0);
    CHECK_TENSOR(s, 1, s2, es, 0);
    CHECK_TENSOR(am, 1, s2, eam, 0);
    CHECK_TENSOR(an, 1, s2, ean, 0);
    kiln_release(mx), kiln_release(mn), kiln_release(s), kiln_release(am), kiln_release(an);
    kiln_release(a);
  }
}

/* ---- argmax / argmin ----------------------------------------------------- */

static void check_arg(bool is_max, kiln_tensor *a, const double *av, int axis, bool keep,
                      const char *what) {
  int ndim = kiln_ndim(a);
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, kiln_shape(a), sizeof(int64_t) * (size_t)ndim);
  int pos = axis < 0 ? axis + ndim : axis;
  int64_t n = kiln_numel(a);
  double *ref = malloc((size_t)(n ? n : 1) * sizeof(double));
  ref_arg(is_max, av, ndim, shape, pos, ref);
  int64_t eshape[KILN_MAX_DIMS];
  int endim = 0;
  for (int d = 0; d < ndim; d++) {
    if (d != pos)
      eshape[endim++] = shape[d];
    else if (keep)
      eshape[endim++] = 1;
  }
  kiln_tensor *r = is_max ? kiln_argmax(a, axis, keep) : kiln_argmin(a, axis, keep);
  if (!r) {
    KTEST_FAIL("%s(%s %s, axis %d, keepdim %d) failed: %s", is_max ? "argmax" : "argmin", what,
               ktest_dtype_name(kiln_dtype_of(a)), axis, keep, kiln_last_error());
  } else {
    if (kiln_dtype_of(r) != KILN_I64)
      KTEST_FAIL("%s(%s): dtype %s, expected i64", is_max ? "argmax" : "argmin", what,
                 ktest_dtype_name(kiln_dtype_of(r)));
    bool ok = kiln_ndim(r) == endim;
    for (int d = 0; ok && d < endim; d++) ok = kiln_shape(r)[d] == eshape[d];
    if (!ok) {
      KTEST_FAIL("%s(%s, axis %d, keepdim %d): wrong shape", is_max ? "argmax" : "argmin", what,
                 axis, keep);
    } else {
      double *got = ktest_values(r);
      for (int64_t i = 0; i < kiln_numel(r); i++)
        if (got[i] != ref[i]) {
          KTEST_FAIL("%s(%s %s, axis %d, keepdim %d)[%lld] = %g, expected %g",
                     is_max ? "argmax" : "argmin", what, ktest_dtype_name(kiln_dtype_of(a)), axis,
                     keep, (long long)i, got[i], ref[i]);
          break;
        }
      free(got);
    }
  }
  kiln_release(r);
  free(ref);
}

TEST(argmax_argmin_every_axis_every_dtype) {
  /* integer values repeat, so ties are exercised: the first index must win */
  const int64_t shape[3] = {2, 3, 4};
  for (int k = 1; k < 5; k++) {
    double *v = gen_values(ALL_DTYPES[k], 24);
    kiln_tensor *a = make(ALL_DTYPES[k], 3, shape, v);
    for (int axis = -3; axis < 3; axis++)
      for (int keep = 0; keep < 2; keep++) {
        check_arg(true, a, v, axis, keep, "[2,3,4]");
        check_arg(false, a, v, axis, keep, "[2,3,4]");
      }
    kiln_release(a);
    free(v);
  }
}

TEST(argmax_argmin_return_first_index_of_ties) {
  const int64_t shape[2] = {2, 4}, s2[1] = {2}, s4[1] = {4};
  const double v[8] = {1, 3, 3, 2, /**/ 2, 0, 5, 0};
  for (int k = 1; k < 5; k++) {
    kiln_tensor *a = make(ALL_DTYPES[k], 2, shape, v);
    kiln_tensor *am = kiln_argmax(a, 1, false), *an = kiln_argmin(a, -1, false);
    const double eam[2] = {1, 2}, ean[2] = {0, 1};
    CHECK_TENSOR(am, 1, s2, eam, 0);
    CHECK_TENSOR(an, 1, s2, ean, 0);
    kiln_tensor *am0 = kiln_argmax(a, 0, false), *an0 = kiln_argmin(a, -2, false);
    const double eam0[4] = {1, 0, 1, 0}, ean0[4] = {0, 1, 0, 1};
    CHECK_TENSOR(am0, 1, s4, eam0, 0);
    CHECK_TENSOR(an0, 1, s4, ean0, 0);
    kiln_release(am), kiln_release(an), kiln_release(am0), kiln_release(an0), kiln_release(a);
  }
  /* all equal: index 0 */
  const double same[4] = {4, 4, 4, 4};
  kiln_tensor *b = make(KILN_F32, 1, s4, same);
  kiln_tensor *bm = kiln_argmax(b, 0, false), *bn = kiln_argmin(b, 0, false);
  CHECK(bm && kiln_ndim(bm) == 0 && bn);
  if (bm) CHECK_CLOSE(kiln_item(bm), 0, 0);
  if (bn) CHECK_CLOSE(kiln_item(bn), 0, 0);
  kiln_release(bm), kiln_release(bn), kiln_release(b);
}

TEST(argmax_argmin_return_first_nan) {
  const int64_t shape[2] = {3, 4}, s3[1] = {3}, s4[1] = {4};
  const double v[12] = {1, NAN, 5, NAN, /**/ 9, 2, -3, NAN, /**/ NAN, 8, 0, 1};
  for (int k = 3; k < 5; k++) {
    kiln_tensor *a = make(ALL_DTYPES[k], 2, shape, v);
    kiln_tensor *am = kiln_argmax(a, 1, false), *an = kiln_argmin(a, 1, false);
    const double e[3] = {1, 3, 0};
    CHECK_TENSOR(am, 1, s3, e, 0);
    CHECK_TENSOR(an, 1, s3, e, 0);
    kiln_tensor *am0 = kiln_argmax(a, 0, false), *an0 = kiln_argmin(a, 0, false);
    const double eam0[4] = {2, 0, 0, 0}, ean0[4] = {2, 0, 1, 0};
    CHECK_TENSOR(am0, 1, s4, eam0, 0);
    CHECK_TENSOR(an0, 1, s4, ean0, 0);
    kiln_release(am), kiln_release(an), kiln_release(am0), kiln_release(an0), kiln_release(a);
  }
}

TEST(argmax_argmin_keepdim_and_negative_axis) {
  const int64_t shape[3] = {2, 3, 4}, ek[3] = {2, 1, 4};
  double *v = gen_values(KILN_F32, 24), ref[8];
  kiln_tensor *a = make(KILN_F32, 3, shape, v);
  kiln_tensor *am = kiln_argmax(a, -2, true), *an = kiln_argmin(a, 1, true);
  ref_arg(true, v, 3, shape, 1, ref);
  CHECK_TENSOR(am, 3, ek, ref, 0);
  ref_arg(false, v, 3, shape, 1, ref);
  CHECK_TENSOR(an, 3, ek, ref, 0);
  kiln_release(am), kiln_release(an), kiln_release(a);
  free(v);
}

TEST(argmax_argmin_of_noncontiguous_views) {
  const int64_t bshape[3] = {4, 3, 8}, vshape[3] = {2, 3, 4};
  const int64_t sstr[3] = {48, 8, -2}, pshape[3] = {8, 3, 4}, pstr[3] = {1, 8, 24};
  double *base = gen_values(KILN_F32, 96), lv[96];
  kiln_tensor *b = make(KILN_F32, 3, bshape, base);
  kiln_tensor *s1 = kiln_slice(b, 0, 1, 4, 2), *s = kiln_slice(s1, 2, 7, 0, -2);
  const int perm[3] = {2, 1, 0};
  kiln_tensor *p = kiln_permute(b, perm);
  strided_values(base, 31, 3, vshape, sstr, lv);
  for (int axis = 0; axis < 3; axis++) {
    if (s) check_arg(true, s, lv, axis, false, "sliced");
    if (s) check_arg(false, s, lv, axis - 3, true, "sliced");
  }
  strided_values(base, 0, 3, pshape, pstr, lv);
  for (int axis = 0; axis < 3; axis++) {
    if (p) check_arg(true, p, lv, axis, false, "permuted");
    if (p) check_arg(false, p, lv, axis, false, "permuted");
  }
  kiln_release(s), kiln_release(s1), kiln_release(p), kiln_release(b);
  free(base);
}

TEST(argmax_argmin_errors) {
  const int64_t empty[2] = {0, 3}, shape[2] = {2, 3};
  kiln_tensor *e = kiln_zeros(KILN_F32, 2, empty);
  CHECK_ERROR(kiln_argmax(e, 0, false), KILN_ERR_SHAPE, "kiln_argmax");
  CHECK_ERROR(kiln_argmin(e, -2, true), KILN_ERR_SHAPE, "kiln_argmin");
  kiln_tensor *a = kiln_ones(KILN_F32, 2, shape);
  CHECK_ERROR(kiln_argmax(a, 2, false), KILN_ERR_ARG, "kiln_argmax");
  CHECK_ERROR(kiln_argmax(a, -3, false), KILN_ERR_ARG, "kiln_argmax");
  CHECK_ERROR(kiln_argmin(a, 5, true), KILN_ERR_ARG, "kiln_argmin");
  kiln_release(a), kiln_release(e);
}

/* ---- errors -------------------------------------------------------------- */

TEST(reduce_error_repeated_axis) {
  const int64_t shape[3] = {2, 3, 4};
  kiln_tensor *a = kiln_ones(KILN_F32, 3, shape);
  int same[2] = {1, 1}, alias[2] = {1, -2}, three[3] = {0, 2, -1};
  for (int op = 0; op < OP_COUNT; op++) {
    CHECK_ERROR(call_op((red_op)op, a, 2, same, false), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 2, alias, true), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 3, three, false), KILN_ERR_ARG, OP_NAME[op]);
  }
  kiln_release(a);
}

TEST(reduce_error_axis_out_of_range) {
  const int64_t shape[3] = {2, 3, 4};
  kiln_tensor *a = kiln_ones(KILN_I32, 3, shape);
  int hi[1] = {3}, lo[1] = {-4}, mixed[2] = {0, 7};
  for (int op = 0; op < OP_COUNT; op++) {
    CHECK_ERROR(call_op((red_op)op, a, 1, hi, false), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 1, lo, true), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 2, mixed, false), KILN_ERR_ARG, OP_NAME[op]);
  }
  kiln_tensor *s = kiln_scalar(1.0, KILN_F32);
  int zero[1] = {0};
  CHECK_ERROR(kiln_sum(s, 1, zero, false), KILN_ERR_ARG, "kiln_sum");
  kiln_release(s), kiln_release(a);
}

TEST(reduce_error_bad_naxes) {
  const int64_t shape[3] = {2, 3, 4};
  kiln_tensor *a = kiln_ones(KILN_F64, 3, shape);
  int four[4] = {0, 1, 2, 0}, nine[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, one[1] = {0};
  for (int op = 0; op < OP_COUNT; op++) {
    CHECK_ERROR(call_op((red_op)op, a, 4, four, false), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 9, nine, false), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, -1, one, false), KILN_ERR_ARG, OP_NAME[op]);
    CHECK_ERROR(call_op((red_op)op, a, 1, NULL, false), KILN_ERR_ARG, OP_NAME[op]);
  }
  kiln_release(a);
}

TEST(reduce_of_null_keeps_first_error) {
  kiln_clear_error();
  const int64_t bad[1] = {-1};
  kiln_tensor *z = kiln_zeros(KILN_F32, 1, bad); /* fails first */
  CHECK(z == NULL);
  kiln_status first = kiln_last_status();
  CHECK(first != KILN_OK);
  kiln_tensor *s = kiln_sum(z, 0, NULL, false);
  CHECK(s == NULL);
  CHECK_EQ_INT(kiln_last_status(), first);
  kiln_release(s), kiln_release(z);
  kiln_clear_error();
}

/* ---- accuracy ------------------------------------------------------------ */

TEST(sum_f32_of_2p24_tenths_is_accurate) {
  const int64_t n = (int64_t)1 << 24;
  kiln_tensor *a = kiln_full(0.1, KILN_F32, 1, &n);
  kiln_tensor *s = kiln_sum(a, 0, NULL, false), *m = kiln_mean(a, 0, NULL, false);
  double ref = (double)n * (double)0.1f;
  CHECK(s && kiln_dtype_of(s) == KILN_F32);
  if (s) {
    double got = kiln_item(s);
    if (!rel_close(got, ref, 1e-5)) KTEST_FAIL("sum = %.9g, expected %.9g", got, ref);
  }
  if (m) {
    double got = kiln_item(m);
    if (!rel_close(got, (double)0.1f, 1e-5)) KTEST_FAIL("mean = %.9g, expected 0.1", got);
  } else {
    KTEST_FAIL("kiln_mean failed: %s", kiln_last_error());
  }
  kiln_release(s), kiln_release(m), kiln_release(a);
}

TEST(sum_f32_of_2p24_random_squares_is_accurate) {
  const int64_t n = (int64_t)1 << 24;
  kiln_manual_seed(1234);
  kiln_tensor *x = kiln_rand(KILN_F32, 1, &n);
  float *xs = malloc((size_t)n * sizeof(float));
  CHECK(x && kiln_to_buffer(x, xs, (size_t)n * sizeof(float)) >= 0);
  double ref = 0;
  for (int64_t i = 0; i < n; i++) {
    float p = xs[i] * xs[i];
    ref += p;
  }
  kiln_tensor *sq = kiln_mul(x, x), *s = kiln_sum(sq, 0, NULL, false);
  if (s) {
    double got = kiln_item(s);
    if (!rel_close(got, ref, 1e-5)) KTEST_FAIL("sum(x*x) = %.9g, expected %.9g", got, ref);
  } else {
    KTEST_FAIL("kiln_sum failed: %s", kiln_last_error());
  }
  kiln_release(s), kiln_release(sq), kiln_release(x);
  free(xs);
}

/* ---- large reductions (multithreaded) -------------------------------------- */

/* a [r, c] (or any shape) f32 rand tensor and its values as doubles */
static kiln_tensor *large_rand(int ndim, const int64_t *shape, uint64_t seed, double **vals) {
  int64_t n = numel_of(ndim, shape);
  kiln_manual_seed(seed);
  kiln_tensor *x = kiln_rand(KILN_F32, ndim, shape);
  float *f = malloc((size_t)n * sizeof(float));
  *vals = malloc((size_t)n * sizeof(double));
  if (!x || kiln_to_buffer(x, f, (size_t)n * sizeof(float)) < 0) {
    KTEST_FAIL("large rand failed: %s", kiln_last_error());
    memset(f, 0, (size_t)n * sizeof(float));
  }
  for (int64_t i = 0; i < n; i++) (*vals)[i] = f[i];
  free(f);
  return x;
}

/* compares result r (f32) to ref (n values) with relative tolerance */
static void check_large(kiln_tensor *r, const double *ref, int64_t n, double rel,
                        const char *what) {
  if (!r || kiln_numel(r) != n) {
    KTEST_FAIL("%s: wrong result (%s)", what, r ? "numel" : kiln_last_error());
    return;
  }
  double *got = ktest_values(r);
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - ref[i]) <= rel * fmax(1.0, fabs(ref[i])))) {
      KTEST_FAIL("%s[%lld] = %.9g, expected %.9g", what, (long long)i, got[i], ref[i]);
      break;
    }
  free(got);
}

TEST(large_reduce_along_contiguous_axis) {
  const int64_t shape[2] = {1024, 4096};
  double *v, *ref = malloc(1024 * sizeof(double));
  kiln_tensor *x = large_rand(2, shape, 11, &v);
  int ax[1] = {1};
  printf("kiln_num_threads: %d\n", kiln_num_threads());
  for (int op = 0; op < OP_COUNT; op++) {
    if (op == OP_PROD) continue; /* a product of 4096 values in [0,1) underflows */
    ref_reduce((red_op)op, v, 2, shape, 2u, ref);
    kiln_tensor *r = call_op((red_op)op, x, 1, ax, false);
    check_large(r, ref, 1024, op <= OP_MEAN ? 1e-5 : 0, OP_NAME[op]);
    kiln_release(r);
  }
  kiln_tensor *am = kiln_argmax(x, 1, false);
  ref_arg(true, v, 2, shape, 1, ref);
  check_large(am, ref, 1024, 0, "argmax axis 1");
  kiln_release(am), kiln_release(x);
  free(v), free(ref);
}

TEST(large_reduce_along_strided_axis) {
  const int64_t shape[2] = {1024, 4096};
  double *v, *ref = malloc(4096 * sizeof(double));
  kiln_tensor *x = large_rand(2, shape, 12, &v);
  int ax[1] = {0};
  for (int op = 0; op < OP_COUNT; op++) {
    if (op == OP_PROD) continue;
    ref_reduce((red_op)op, v, 2, shape, 1u, ref);
    kiln_tensor *r = call_op((red_op)op, x, 1, ax, false);
    /* numpy sums a strided axis row by row: allow 1e-4 relative */
    check_large(r, ref, 4096, op <= OP_MEAN ? 1e-4 : 0, OP_NAME[op]);
    kiln_release(r);
  }
  kiln_tensor *an = kiln_argmin(x, 0, false);
  ref_arg(false, v, 2, shape, 0, ref);
  check_large(an, ref, 4096, 0, "argmin axis 0");
  kiln_release(an), kiln_release(x);
  free(v), free(ref);
}

TEST(large_reduce_over_all_axes) {
  const int64_t shape[2] = {2048, 2048};
  double *v, ref;
  kiln_tensor *x = large_rand(2, shape, 13, &v);
  for (int op = 0; op < OP_COUNT; op++) {
    if (op == OP_PROD) continue;
    ref_reduce((red_op)op, v, 2, shape, 3u, &ref);
    kiln_tensor *r = call_op((red_op)op, x, 0, NULL, false);
    check_large(r, &ref, 1, op <= OP_MEAN ? 1e-5 : 0, OP_NAME[op]);
    kiln_release(r);
  }
  kiln_release(x);
  free(v);
}

TEST(large_reduce_over_middle_and_outer_axes_3d) {
  const int64_t shape[3] = {64, 1024, 64};
  double *v, *ref = malloc(64 * 1024 * sizeof(double));
  kiln_tensor *x = large_rand(3, shape, 14, &v);
  int mid[1] = {1}, outer[2] = {0, -1};
  ref_reduce(OP_SUM, v, 3, shape, 2u, ref);
  kiln_tensor *r = kiln_sum(x, 1, mid, false);
  check_large(r, ref, 64 * 64, 1e-4, "sum axis 1");
  kiln_release(r);
  ref_reduce(OP_MAX, v, 3, shape, 2u, ref);
  r = kiln_max(x, 1, mid, true);
  check_large(r, ref, 64 * 64, 0, "max axis 1");
  kiln_release(r);
  ref_reduce(OP_MEAN, v, 3, shape, 5u, ref);
  r = kiln_mean(x, 2, outer, false);
  check_large(r, ref, 1024, 1e-4, "mean axes {0,2}");
  kiln_release(r);
  kiln_release(x);
  free(v), free(ref);
}

TEST(large_integer_sum_is_exact) {
  const int64_t n = (int64_t)1 << 22, shape[2] = {2048, 2048};
  int32_t *v = malloc((size_t)n * sizeof(int32_t));
  int64_t total = 0, *cols = calloc(2048, sizeof(int64_t)), *got = malloc(2048 * sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) {
    v[i] = (int32_t)((i * 2654435761LL) % 2001); /* 0..2000; the total exceeds 2^31 */
    total += v[i];
    cols[i % 2048] += v[i];
  }
  kiln_tensor *x = kiln_from_data(v, KILN_I32, 2, shape);
  kiln_tensor *s = kiln_sum(x, 0, NULL, false);
  int64_t g = 0;
  CHECK(read_i64(s, &g, 1));
  CHECK_EQ_INT(g, total);
  int ax0[1] = {0};
  kiln_tensor *c = kiln_sum(x, 1, ax0, false);
  bool ok = read_i64(c, got, 2048);
  CHECK(ok);
  if (ok)
    for (int j = 0; j < 2048; j++)
      if (got[j] != cols[j]) {
        KTEST_FAIL("column sum [%d] = %lld, expected %lld", j, (long long)got[j],
                   (long long)cols[j]);
        break;
      }
  kiln_release(s), kiln_release(c), kiln_release(x);
  free(v), free(cols), free(got);
}

/* ---- repeated traces (the JIT may compile them) ---------------------------- */

TEST(reduce_repeated_with_fresh_data_stays_correct) {
  const int64_t shape[2] = {33, 65};
  double *ref = malloc(65 * sizeof(double));
  for (int iter = 0; iter < 6; iter++) {
    double *v;
    kiln_tensor *x = large_rand(2, shape, 100 + (uint64_t)iter, &v);
    int ax1[1] = {1}, ax0[1] = {0};
    ref_reduce(OP_SUM, v, 2, shape, 2u, ref);
    kiln_tensor *r = kiln_sum(x, 1, ax1, false);
    check_large(r, ref, 33, 1e-5, "sum axis 1");
    kiln_release(r);
    ref_reduce(OP_MAX, v, 2, shape, 1u, ref);
    r = kiln_max(x, 1, ax0, false);
    check_large(r, ref, 65, 0, "max axis 0");
    kiln_release(r);
    kiln_release(x);
    free(v);
  }
  free(ref);
}

int main(void) {
  RUN(reduce_3d_every_axis_subset_every_dtype);
  RUN(reduce_4d_every_axis_subset_every_dtype);
  RUN(reduce_every_axis_spelling_gives_same_result);
  RUN(reduce_result_dtypes);
  RUN(sum_of_i32_accumulates_in_i64);
  RUN(sum_of_i64_is_exact_beyond_2_pow_53);
  RUN(prod_of_i32_accumulates_in_i64);
  RUN(mean_of_integers_is_true_division_in_f32);
  RUN(sum_of_bool_counts_true_values);
  RUN(max_min_of_integer_extremes_are_exact);
  RUN(reduce_all_axes_gives_0d_or_keepdim_ones);
  RUN(reduce_of_0d_tensor_is_identity);
  RUN(reduce_over_empty_axis);
  RUN(reduce_of_nonempty_axis_of_empty_tensor_is_empty);
  RUN(reduce_over_size1_axes);
  RUN(reduce_of_permuted_view);
  RUN(reduce_of_transposed_inner_axes);
  RUN(reduce_of_sliced_view_with_steps);
  RUN(reduce_of_expanded_view);
  RUN(reduce_of_pending_elementwise_expression);
  RUN(max_min_propagate_nan);
  RUN(max_min_handle_infinities);
  RUN(argmax_argmin_every_axis_every_dtype);
  RUN(argmax_argmin_return_first_index_of_ties);
  RUN(argmax_argmin_return_first_nan);
  RUN(argmax_argmin_keepdim_and_negative_axis);
  RUN(argmax_argmin_of_noncontiguous_views);
  RUN(argmax_argmin_errors);
  RUN(reduce_error_repeated_axis);
  RUN(reduce_error_axis_out_of_range);
  RUN(reduce_error_bad_naxes);
  RUN(reduce_of_null_keeps_first_error);
  RUN(sum_f32_of_2p24_tenths_is_accurate);
  RUN(sum_f32_of_2p24_random_squares_is_accurate);
  RUN(large_reduce_along_contiguous_axis);
  RUN(large_reduce_along_strided_axis);
  RUN(large_reduce_over_all_axes);
  RUN(large_reduce_over_middle_and_outer_axes_3d);
  RUN(large_integer_sum_is_exact);
  RUN(reduce_repeated_with_fresh_data_stays_correct);
  return ktest_done();
}
