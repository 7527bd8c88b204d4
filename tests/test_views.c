/* test_views.c — shape ops (reshape, permute, transpose, expand, squeeze,
 * unsqueeze, slice), chains of them, concat/stack, that views share their
 * base's storage, and functional in-place semantics (kiln_assign,
 * kiln_sub_scaled_). Expected values are written out by hand. */
#include <stdint.h>

#include "ktest.h"

/* internal, exported for tests: the storage object a tensor's data lives in */
const void *fe_storage_id(const kiln_tensor *t);

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define V(...) ((const double[]){__VA_ARGS__})
#define P(...) ((const int[]){__VA_ARGS__})

/* evaluates expr once, checks shape and values exactly, releases it */
#define CHECK_VIEW(expr, nd, shape, expect)  \
  do {                                       \
    kiln_tensor *cv_ = (expr);               \
    CHECK_TENSOR(cv_, nd, shape, expect, 0); \
    kiln_release(cv_);                       \
  } while (0)

/* a tensor of dtype dt holding the doubles vals (converted) */
static kiln_tensor *make(kiln_dtype dt, int ndim, const int64_t *shape, const double *vals) {
  kiln_tensor *t = ktest_from_doubles(dt, ndim, shape, vals);
  CHECK(t != NULL);
  return t;
}

/* 0, 1, 2, ... n-1 in the given shape */
static kiln_tensor *iota(kiln_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) v[i] = (double)i;
  kiln_tensor *t = make(dt, ndim, shape, v);
  free(v);
  return t;
}

/* view is readable, and lives in the same storage as base (no copy) */
static void check_shares_storage(kiln_tensor *base, kiln_tensor *view) {
  CHECK(base != NULL && view != NULL);
  if (!base || !view) return;
  double *v = ktest_values(view); /* make sure the view has been evaluated */
  free(v);
  CHECK(fe_storage_id(base) != NULL);
  CHECK(fe_storage_id(view) == fe_storage_id(base));
}

/* ---------------------------------------------------------------- reshape */

TEST(reshape_contiguous_keeps_row_major_order) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  CHECK_VIEW(kiln_reshape(a, 2, S(3, 2)), 2, S(3, 2), V(0, 1, 2, 3, 4, 5));
  CHECK_VIEW(kiln_reshape(a, 1, S(6)), 1, S(6), V(0, 1, 2, 3, 4, 5));
  CHECK_VIEW(kiln_reshape(a, 3, S(1, 6, 1)), 3, S(1, 6, 1), V(0, 1, 2, 3, 4, 5));
  CHECK_VIEW(kiln_reshape(a, 4, S(3, 1, 2, 1)), 4, S(3, 1, 2, 1), V(0, 1, 2, 3, 4, 5));
  kiln_release(a);
}

TEST(reshape_infers_one_minus_one_dimension) {
  kiln_tensor *a = iota(KILN_I32, 1, S(12));
  CHECK_VIEW(kiln_reshape(a, 2, S(-1, 4)), 2, S(3, 4), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  CHECK_VIEW(kiln_reshape(a, 2, S(6, -1)), 2, S(6, 2), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  CHECK_VIEW(kiln_reshape(a, 3, S(2, -1, 3)), 3, S(2, 2, 3),
             V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  kiln_tensor *b = kiln_reshape(a, 2, S(3, 4));
  CHECK_VIEW(kiln_reshape(b, 1, S(-1)), 1, S(12), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  kiln_release(b);
  kiln_release(a);
}

TEST(reshape_keeps_dtype) {
  kiln_tensor *a = iota(KILN_I64, 2, S(2, 2));
  kiln_tensor *r = kiln_reshape(a, 1, S(4));
  CHECK(r != NULL);
  if (r) CHECK_EQ_INT(kiln_dtype_of(r), KILN_I64);
  CHECK_TENSOR(r, 1, S(4), V(0, 1, 2, 3), 0);
  kiln_release(r);
  kiln_release(a);
}

TEST(reshape_of_transposed_input_copies_in_logical_order) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3)); /* [[0,1,2],[3,4,5]] */
  kiln_tensor *t = kiln_transpose(a, 0, 1);    /* [[0,3],[1,4],[2,5]] */
  kiln_tensor *flat = kiln_reshape(t, 1, S(6));
  CHECK_TENSOR(flat, 1, S(6), V(0, 3, 1, 4, 2, 5), 0);
  /* the flattened transpose cannot be a view of a's row-major storage */
  if (flat) CHECK(fe_storage_id(flat) != fe_storage_id(a));
  CHECK_VIEW(kiln_reshape(t, 2, S(2, 3)), 2, S(2, 3), V(0, 3, 1, 4, 2, 5));
  CHECK_VIEW(kiln_reshape(t, 2, S(-1, 1)), 2, S(6, 1), V(0, 3, 1, 4, 2, 5));
  kiln_release(flat);
  kiln_release(t);
  kiln_release(a);
}

TEST(reshape_of_strided_slice_gives_selected_elements) {
  kiln_tensor *a = iota(KILN_F64, 2, S(4, 3));
  kiln_tensor *s = kiln_slice(a, 1, 0, 3, 2); /* columns 0 and 2 */
  CHECK_TENSOR(s, 2, S(4, 2), V(0, 2, 3, 5, 6, 8, 9, 11), 0);
  CHECK_VIEW(kiln_reshape(s, 1, S(8)), 1, S(8), V(0, 2, 3, 5, 6, 8, 9, 11));
  CHECK_VIEW(kiln_reshape(s, 2, S(2, 4)), 2, S(2, 4), V(0, 2, 3, 5, 6, 8, 9, 11));
  kiln_release(s);
  kiln_release(a);
}

TEST(reshape_between_zero_d_and_one_element) {
  kiln_tensor *s = kiln_scalar(3.5, KILN_F32);
  kiln_tensor *one = kiln_reshape(s, 1, S(1));
  CHECK_TENSOR(one, 1, S(1), V(3.5), 0);
  kiln_tensor *one11 = kiln_reshape(s, 2, S(1, 1));
  CHECK_TENSOR(one11, 2, S(1, 1), V(3.5), 0);
  kiln_tensor *back = kiln_reshape(one11, 0, S(0));
  CHECK(back != NULL);
  if (back) {
    CHECK_EQ_INT(kiln_ndim(back), 0);
    CHECK_EQ_INT(kiln_numel(back), 1);
    CHECK_CLOSE(kiln_item(back), 3.5, 0);
  }
  kiln_tensor *inferred = kiln_reshape(s, 1, S(-1));
  CHECK_TENSOR(inferred, 1, S(1), V(3.5), 0);
  kiln_release(inferred);
  kiln_release(back);
  kiln_release(one11);
  kiln_release(one);
  kiln_release(s);
}

TEST(reshape_of_empty_tensor) {
  kiln_tensor *a = kiln_zeros(KILN_F32, 2, S(0, 3));
  kiln_tensor *r = kiln_reshape(a, 3, S(3, 0, 5));
  CHECK(r != NULL);
  if (r) {
    CHECK_EQ_INT(kiln_ndim(r), 3);
    CHECK_EQ_INT(kiln_shape(r)[0], 3);
    CHECK_EQ_INT(kiln_shape(r)[1], 0);
    CHECK_EQ_INT(kiln_shape(r)[2], 5);
    CHECK_EQ_INT(kiln_numel(r), 0);
  }
  kiln_release(r);
  kiln_release(a);
}

/* ------------------------------------------------------ permute/transpose */

TEST(permute_3d_every_order_checked_by_hand) {
  kiln_tensor *a = iota(KILN_F32, 3, S(2, 3, 4)); /* a[i][j][k] = 12i + 4j + k */
  CHECK_VIEW(
      kiln_permute(a, P(0, 1, 2)), 3, S(2, 3, 4),
      V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23));
  CHECK_VIEW(
      kiln_permute(a, P(2, 0, 1)), 3, S(4, 2, 3),
      V(0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23));
  CHECK_VIEW(
      kiln_permute(a, P(1, 2, 0)), 3, S(3, 4, 2),
      V(0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23));
  CHECK_VIEW(
      kiln_permute(a, P(2, 1, 0)), 3, S(4, 3, 2),
      V(0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23));
  CHECK_VIEW(
      kiln_permute(a, P(0, 2, 1)), 3, S(2, 4, 3),
      V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23));
  kiln_release(a);
}

TEST(permute_then_inverse_permute_is_identity) {
  kiln_tensor *a = iota(KILN_I64, 3, S(2, 3, 4));
  kiln_tensor *p = kiln_permute(a, P(2, 0, 1));
  kiln_tensor *q = kiln_permute(p, P(1, 2, 0));
  CHECK_TENSOR(
      q, 3, S(2, 3, 4),
      V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23), 0);
  kiln_release(q);
  kiln_release(p);
  kiln_release(a);
}

TEST(transpose_2d_and_3d) {
  kiln_tensor *m = iota(KILN_F32, 2, S(2, 3));
  CHECK_VIEW(kiln_transpose(m, 0, 1), 2, S(3, 2), V(0, 3, 1, 4, 2, 5));
  CHECK_VIEW(kiln_transpose(m, 1, 0), 2, S(3, 2), V(0, 3, 1, 4, 2, 5));
  CHECK_VIEW(kiln_transpose(m, 0, 0), 2, S(2, 3), V(0, 1, 2, 3, 4, 5));
  kiln_tensor *a = iota(KILN_F32, 3, S(2, 3, 4));
  CHECK_VIEW(
      kiln_transpose(a, 0, 2), 3, S(4, 3, 2),
      V(0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23));
  CHECK_VIEW(
      kiln_transpose(a, 1, 2), 3, S(2, 4, 3),
      V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23));
  CHECK_VIEW(
      kiln_transpose(a, 0, 1), 3, S(3, 2, 4),
      V(0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18, 19, 8, 9, 10, 11, 20, 21, 22, 23));
  kiln_release(a);
  kiln_release(m);
}

TEST(transpose_accepts_negative_axes) {
  kiln_tensor *a = iota(KILN_F32, 3, S(2, 3, 4));
  CHECK_VIEW(
      kiln_transpose(a, -1, -2), 3, S(2, 4, 3),
      V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23));
  CHECK_VIEW(
      kiln_transpose(a, 0, -1), 3, S(4, 3, 2),
      V(0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23));
  kiln_release(a);
}

TEST(transposed_view_feeds_elementwise_op) {
  kiln_tensor *m = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *t = kiln_transpose(m, 0, 1);
  kiln_tensor *ones = kiln_ones(KILN_F32, 2, S(3, 2));
  kiln_tensor *s = kiln_add(t, ones);
  CHECK_TENSOR(s, 2, S(3, 2), V(1, 4, 2, 5, 3, 6), 0);
  kiln_release(s);
  kiln_release(ones);
  kiln_release(t);
  kiln_release(m);
}

/* ----------------------------------------------------------------- expand */

TEST(expand_repeats_size_one_axes) {
  kiln_tensor *col = make(KILN_F32, 2, S(3, 1), V(1, 2, 3));
  CHECK_VIEW(kiln_expand(col, 2, S(3, 4)), 2, S(3, 4), V(1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
  kiln_tensor *row = make(KILN_I32, 1, S(3), V(7, 8, 9));
  CHECK_VIEW(kiln_expand(row, 2, S(2, 3)), 2, S(2, 3), V(7, 8, 9, 7, 8, 9));
  CHECK_VIEW(kiln_expand(row, 3, S(2, 1, 3)), 3, S(2, 1, 3), V(7, 8, 9, 7, 8, 9));
  CHECK_VIEW(kiln_expand(row, 1, S(3)), 1, S(3), V(7, 8, 9));
  kiln_tensor *mid = make(KILN_F64, 3, S(2, 1, 2), V(1, 2, 3, 4));
  CHECK_VIEW(kiln_expand(mid, 3, S(2, 3, 2)), 3, S(2, 3, 2), V(1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4));
  kiln_release(mid);
  kiln_release(row);
  kiln_release(col);
}

TEST(expand_zero_d_to_matrix) {
  kiln_tensor *s = kiln_scalar(4.0, KILN_F32);
  CHECK_VIEW(kiln_expand(s, 2, S(2, 2)), 2, S(2, 2), V(4, 4, 4, 4));
  kiln_release(s);
}

TEST(expanded_view_feeds_elementwise_op) {
  kiln_tensor *col = make(KILN_F32, 2, S(2, 1), V(10, 20));
  kiln_tensor *e = kiln_expand(col, 2, S(2, 3));
  kiln_tensor *m = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *s = kiln_add(e, m);
  CHECK_TENSOR(s, 2, S(2, 3), V(10, 11, 12, 23, 24, 25), 0);
  kiln_release(s);
  kiln_release(m);
  kiln_release(e);
  kiln_release(col);
}

/* ------------------------------------------------------ squeeze/unsqueeze */

TEST(squeeze_removes_the_named_size_one_axis) {
  kiln_tensor *a = make(KILN_F32, 3, S(1, 3, 1), V(1, 2, 3));
  CHECK_VIEW(kiln_squeeze(a, 0), 2, S(3, 1), V(1, 2, 3));
  CHECK_VIEW(kiln_squeeze(a, 2), 2, S(1, 3), V(1, 2, 3));
  CHECK_VIEW(kiln_squeeze(a, -1), 2, S(1, 3), V(1, 2, 3));
  CHECK_VIEW(kiln_squeeze(a, -3), 2, S(3, 1), V(1, 2, 3));
  kiln_tensor *one = make(KILN_F32, 1, S(1), V(9));
  kiln_tensor *z = kiln_squeeze(one, 0);
  CHECK(z != NULL);
  if (z) {
    CHECK_EQ_INT(kiln_ndim(z), 0);
    CHECK_CLOSE(kiln_item(z), 9, 0);
  }
  kiln_release(z);
  kiln_release(one);
  kiln_release(a);
}

TEST(unsqueeze_inserts_axis_positive_and_negative) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  const double *v = V(0, 1, 2, 3, 4, 5);
  CHECK_VIEW(kiln_unsqueeze(a, 0), 3, S(1, 2, 3), v);
  CHECK_VIEW(kiln_unsqueeze(a, 1), 3, S(2, 1, 3), v);
  CHECK_VIEW(kiln_unsqueeze(a, 2), 3, S(2, 3, 1), v);
  CHECK_VIEW(kiln_unsqueeze(a, -1), 3, S(2, 3, 1), v);
  CHECK_VIEW(kiln_unsqueeze(a, -2), 3, S(2, 1, 3), v);
  CHECK_VIEW(kiln_unsqueeze(a, -3), 3, S(1, 2, 3), v);
  kiln_tensor *s = kiln_scalar(2.0, KILN_F64);
  CHECK_VIEW(kiln_unsqueeze(s, 0), 1, S(1), V(2));
  CHECK_VIEW(kiln_unsqueeze(s, -1), 1, S(1), V(2));
  kiln_release(s);
  kiln_release(a);
}

TEST(squeeze_undoes_unsqueeze) {
  kiln_tensor *a = iota(KILN_I32, 2, S(2, 3));
  kiln_tensor *u = kiln_unsqueeze(a, 1);
  CHECK_VIEW(kiln_squeeze(u, 1), 2, S(2, 3), V(0, 1, 2, 3, 4, 5));
  kiln_release(u);
  kiln_release(a);
}

/* ------------------------------------------------------------------ slice */

TEST(slice_step_one) {
  kiln_tensor *a = iota(KILN_F32, 1, S(10));
  CHECK_VIEW(kiln_slice(a, 0, 2, 7, 1), 1, S(5), V(2, 3, 4, 5, 6));
  CHECK_VIEW(kiln_slice(a, 0, 0, 10, 1), 1, S(10), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  CHECK_VIEW(kiln_slice(a, 0, 9, 10, 1), 1, S(1), V(9));
  kiln_release(a);
}

TEST(slice_steps_two_and_three) {
  kiln_tensor *a = iota(KILN_F32, 1, S(10));
  CHECK_VIEW(kiln_slice(a, 0, 1, 10, 2), 1, S(5), V(1, 3, 5, 7, 9));
  CHECK_VIEW(kiln_slice(a, 0, 0, 10, 2), 1, S(5), V(0, 2, 4, 6, 8));
  CHECK_VIEW(kiln_slice(a, 0, 0, 10, 3), 1, S(4), V(0, 3, 6, 9));
  CHECK_VIEW(kiln_slice(a, 0, 1, 9, 3), 1, S(3), V(1, 4, 7));
  CHECK_VIEW(kiln_slice(a, 0, 2, 8, 3), 1, S(2), V(2, 5));
  kiln_release(a);
}

TEST(slice_negative_steps_walk_backwards) {
  kiln_tensor *a = iota(KILN_F32, 1, S(10));
  /* a[8:2:-2], a[9::-1] (stop clamped), a[7:0:-3], a[::-4] via huge bounds */
  CHECK_VIEW(kiln_slice(a, 0, 8, 2, -2), 1, S(3), V(8, 6, 4));
  CHECK_VIEW(kiln_slice(a, 0, 9, -100, -1), 1, S(10), V(9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  CHECK_VIEW(kiln_slice(a, 0, 7, 0, -3), 1, S(3), V(7, 4, 1));
  CHECK_VIEW(kiln_slice(a, 0, INT64_MAX, INT64_MIN, -4), 1, S(3), V(9, 5, 1));
  CHECK_VIEW(kiln_slice(a, 0, -1, -4, -1), 1, S(3), V(9, 8, 7));
  kiln_release(a);
}

TEST(slice_bounds_clamped_like_python) {
  kiln_tensor *a = iota(KILN_I64, 1, S(10));
  CHECK_VIEW(kiln_slice(a, 0, 5, 100, 1), 1, S(5), V(5, 6, 7, 8, 9));
  CHECK_VIEW(kiln_slice(a, 0, -100, 3, 1), 1, S(3), V(0, 1, 2));
  CHECK_VIEW(kiln_slice(a, 0, -3, 100, 1), 1, S(3), V(7, 8, 9));
  CHECK_VIEW(kiln_slice(a, 0, -100, 100, 4), 1, S(3), V(0, 4, 8));
  CHECK_VIEW(kiln_slice(a, 0, 0, INT64_MAX, 1), 1, S(10), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  CHECK_VIEW(kiln_slice(a, 0, 100, -100, -3), 1, S(4), V(9, 6, 3, 0));
  CHECK_VIEW(kiln_slice(a, 0, 2, -2, 1), 1, S(6), V(2, 3, 4, 5, 6, 7));
  kiln_release(a);
}

static void check_empty_slice(kiln_tensor *a, int axis, int64_t start, int64_t stop, int64_t step,
                              int ndim, const int64_t *shape) {
  kiln_tensor *s = kiln_slice(a, axis, start, stop, step);
  CHECK(s != NULL);
  if (!s) return;
  CHECK_EQ_INT(kiln_ndim(s), ndim);
  for (int d = 0; d < ndim && d < kiln_ndim(s); d++) CHECK_EQ_INT(kiln_shape(s)[d], shape[d]);
  CHECK_EQ_INT(kiln_numel(s), 0);
  float dummy = 0;
  CHECK(kiln_to_buffer(s, &dummy, 0) >= 0);
  kiln_release(s);
}

TEST(slice_empty_results) {
  kiln_tensor *a = iota(KILN_F32, 1, S(10));
  check_empty_slice(a, 0, 7, 3, 1, 1, S(0));
  check_empty_slice(a, 0, 20, 30, 1, 1, S(0));
  check_empty_slice(a, 0, 2, 8, -1, 1, S(0));
  check_empty_slice(a, 0, 4, 4, 1, 1, S(0));
  check_empty_slice(a, 0, -100, -50, 2, 1, S(0));
  kiln_tensor *m = iota(KILN_F32, 2, S(3, 4));
  check_empty_slice(m, 1, 3, 1, 1, 2, S(3, 0));
  check_empty_slice(m, 0, 3, 3, 1, 2, S(0, 4));
  kiln_release(m);
  kiln_release(a);
}

/* Python's slice.indices(len) and the length of range(start, stop, step),
   in 128-bit arithmetic: the reference for the extreme-value slices */
static int64_t python_slice(int64_t len, int64_t *start, int64_t stop, int64_t step) {
  __int128 lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1;
  __int128 b = *start, e = stop;
  if (b < 0)
    b = b + len < lo ? lo : b + len;
  else if (b > hi)
    b = hi;
  if (e < 0)
    e = e + len < lo ? lo : e + len;
  else if (e > hi)
    e = hi;
  *start = (int64_t)b;
  if (step > 0) return e > b ? (int64_t)((e - b - 1) / step + 1) : 0;
  return b > e ? (int64_t)((b - e - 1) / -(__int128)step + 1) : 0;
}

static const int64_t slice_extremes[] = {
    INT64_MIN, INT64_MIN + 1,    -((int64_t)1 << 62), -11,      -10, -9, -3, -1, 0, 1, 2, 9, 10,
    11,        (int64_t)1 << 62, INT64_MAX - 1,       INT64_MAX};
#define N_EXTREMES (int)(sizeof slice_extremes / sizeof slice_extremes[0])

/* issue 13: slice(0, 10, INT64_MAX) had 0 elements and huge steps gave
   negative extents (the length computation overflowed) */
TEST(slice_at_int64_extremes_matches_python) {
  kiln_tensor *a = iota(KILN_I64, 1, S(10));
  CHECK_VIEW(kiln_slice(a, 0, 0, 10, INT64_MAX), 1, S(1), V(0));
  CHECK_VIEW(kiln_slice(a, 0, INT64_MAX, INT64_MIN, INT64_MIN), 1, S(1), V(9));
  CHECK_VIEW(kiln_slice(a, 0, INT64_MIN, INT64_MAX, INT64_MAX - 1), 1, S(1), V(0));
  CHECK_VIEW(kiln_slice(a, 0, 9, INT64_MIN, -((int64_t)1 << 62)), 1, S(1), V(9));
  int64_t got[10];
  for (int i = 0; i < N_EXTREMES; i++)
    for (int j = 0; j < N_EXTREMES; j++)
      for (int k = 0; k < N_EXTREMES; k++) {
        int64_t start = slice_extremes[i], stop = slice_extremes[j], step = slice_extremes[k];
        if (step == 0) continue;
        int64_t first = start, n = python_slice(10, &first, stop, step);
        kiln_tensor *s = kiln_slice(a, 0, start, stop, step);
        CHECK(s != NULL);
        if (!s) continue;
        if (kiln_numel(s) != n || kiln_shape(s)[0] != n) {
          KTEST_FAIL("slice(%lld, %lld, %lld) has %lld elements, expected %lld", (long long)start,
                     (long long)stop, (long long)step, (long long)kiln_numel(s), (long long)n);
        } else if (kiln_to_buffer(s, got, sizeof got) < 0) {
          KTEST_FAIL("slice(%lld, %lld, %lld): %s", (long long)start, (long long)stop,
                     (long long)step, kiln_last_error());
        } else {
          for (int64_t q = 0; q < n; q++)
            if (got[q] != first + q * step)
              KTEST_FAIL("slice(%lld, %lld, %lld)[%lld] = %lld", (long long)start, (long long)stop,
                         (long long)step, (long long)q, (long long)got[q]);
        }
        kiln_release(s);
      }
  kiln_release(a);
}

/* a huge step along an outer axis times its stride overflowed the view's
   stride; slices of such slices, and of reversed views, stay exact */
TEST(huge_step_slices_of_2d_and_of_other_views) {
  kiln_tensor *m = iota(KILN_F32, 2, S(10, 3)); /* m[i][j] = 3i + j */
  CHECK_VIEW(kiln_slice(m, 0, 0, 10, INT64_MAX), 2, S(1, 3), V(0, 1, 2));
  CHECK_VIEW(kiln_slice(m, 0, -1, INT64_MIN, INT64_MIN), 2, S(1, 3), V(27, 28, 29));
  kiln_tensor *r = kiln_slice(m, 0, 9, INT64_MIN, -4); /* rows 9, 5, 1 */
  CHECK_VIEW(kiln_slice(r, 0, 1, INT64_MAX, INT64_MAX), 2, S(1, 3), V(15, 16, 17));
  kiln_tensor *t = kiln_transpose(r, 0, 1); /* [3,3] */
  CHECK_VIEW(kiln_slice(t, 1, INT64_MAX, INT64_MIN, INT64_MIN + 1), 2, S(3, 1), V(3, 4, 5));
  kiln_tensor *e = kiln_slice(t, 0, 0, 0, INT64_MAX); /* empty */
  CHECK(e && kiln_numel(e) == 0);
  CHECK_VIEW(kiln_slice(e, 1, 0, 3, INT64_MAX), 2, S(0, 1), V(0));
  kiln_tensor *col = kiln_slice(m, 1, 2, INT64_MIN, INT64_MIN); /* column 2 */
  kiln_tensor *sum = kiln_sum(col, 0, NULL, false);
  CHECK_TENSOR(sum, 0, S(0), V(155), 0);
  kiln_release(sum);
  kiln_release(col);
  kiln_release(e);
  kiln_release(t);
  kiln_release(r);
  kiln_release(m);
}

/* an empty result needs none of its inputs' values: an empty slice of an
   index_select whose indices are out of range reads fine, because the
   index_select is never evaluated for it (it used to be, and failed) */
TEST(empty_result_evaluates_none_of_its_inputs) {
  kiln_tensor *x = iota(KILN_F32, 2, S(30, 40));
  kiln_tensor *bad = kiln_from_data((const int64_t[]){0, 99}, KILN_I64, 1, S(2));
  kiln_tensor *y = kiln_index_select(x, 0, bad); /* [2,40], fails if evaluated */
  kiln_tensor *e = kiln_slice(y, 1, 5, 5, 1), *z = kiln_mul(e, e);
  CHECK(z && kiln_numel(z) == 0 && kiln_shape(z)[0] == 2 && kiln_shape(z)[1] == 0);
  float none;
  CHECK_EQ_INT(kiln_to_buffer(z, &none, 0), 0);
  CHECK_EQ_INT(kiln_to_buffer(e, &none, 0), 0);
  kiln_release(y); /* nothing pending needs it now */
  CHECK_EQ_INT(kiln_sync(), 0);
  kiln_clear_error();
  kiln_release(z);
  kiln_release(e);
  kiln_release(bad);
  kiln_release(x);
}

TEST(slice_along_each_axis_of_2d) {
  kiln_tensor *m = iota(KILN_F32, 2, S(3, 4)); /* m[i][j] = 4i + j */
  CHECK_VIEW(kiln_slice(m, 1, 0, 4, 2), 2, S(3, 2), V(0, 2, 4, 6, 8, 10));
  CHECK_VIEW(kiln_slice(m, 0, 2, -100, -1), 2, S(3, 4), V(8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3));
  CHECK_VIEW(kiln_slice(m, 1, -1, -100, -2), 2, S(3, 2), V(3, 1, 7, 5, 11, 9));
  CHECK_VIEW(kiln_slice(m, -1, 1, 3, 1), 2, S(3, 2), V(1, 2, 5, 6, 9, 10));
  CHECK_VIEW(kiln_slice(m, 0, 1, 2, 1), 2, S(1, 4), V(4, 5, 6, 7));
  kiln_release(m);
}

TEST(slice_middle_axis_of_3d) {
  kiln_tensor *a = iota(KILN_F32, 3, S(2, 3, 4));
  CHECK_VIEW(kiln_slice(a, 1, 2, -100, -2), 3, S(2, 2, 4),
             V(8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15));
  kiln_release(a);
}

/* ----------------------------------------------------------------- chains */

TEST(chain_transpose_slice_slice_unsqueeze_expand_then_reshape) {
  kiln_tensor *m = iota(KILN_F32, 2, S(3, 4));      /* m[i][j] = 4i + j */
  kiln_tensor *t = kiln_transpose(m, 0, 1);         /* [4,3], t[j][i] = 4i + j */
  kiln_tensor *s1 = kiln_slice(t, 0, 1, 4, 2);      /* rows j=1,3: [[1,5,9],[3,7,11]] */
  kiln_tensor *s2 = kiln_slice(s1, 1, 2, -100, -1); /* [[9,5,1],[11,7,3]] */
  kiln_tensor *u = kiln_unsqueeze(s2, 0);           /* [1,2,3] */
  kiln_tensor *e = kiln_expand(u, 3, S(2, 2, 3));
  CHECK_TENSOR(t, 2, S(4, 3), V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11), 0);
  CHECK_TENSOR(s1, 2, S(2, 3), V(1, 5, 9, 3, 7, 11), 0);
  CHECK_TENSOR(s2, 2, S(2, 3), V(9, 5, 1, 11, 7, 3), 0);
  CHECK_TENSOR(u, 3, S(1, 2, 3), V(9, 5, 1, 11, 7, 3), 0);
  CHECK_TENSOR(e, 3, S(2, 2, 3), V(9, 5, 1, 11, 7, 3, 9, 5, 1, 11, 7, 3), 0);
  CHECK_VIEW(kiln_reshape(e, 1, S(-1)), 1, S(12), V(9, 5, 1, 11, 7, 3, 9, 5, 1, 11, 7, 3));
  CHECK_VIEW(kiln_reshape(e, 2, S(3, 4)), 2, S(3, 4), V(9, 5, 1, 11, 7, 3, 9, 5, 1, 11, 7, 3));
  /* every link of the chain is a view of m */
  check_shares_storage(m, t);
  check_shares_storage(m, s1);
  check_shares_storage(m, s2);
  check_shares_storage(m, u);
  check_shares_storage(m, e);
  kiln_release(e);
  kiln_release(u);
  kiln_release(s2);
  kiln_release(s1);
  kiln_release(t);
  kiln_release(m);
}

TEST(chain_slice_of_reversed_slice) {
  kiln_tensor *a = iota(KILN_F32, 1, S(10));
  kiln_tensor *r = kiln_slice(a, 0, 9, -100, -1); /* 9..0 */
  CHECK_VIEW(kiln_slice(r, 0, 1, 8, 3), 1, S(3), V(8, 5, 2));
  CHECK_VIEW(kiln_slice(r, 0, 8, -100, -2), 1, S(5), V(1, 3, 5, 7, 9));
  kiln_release(r);
  kiln_release(a);
}

TEST(chain_permute_of_expanded_then_elementwise) {
  kiln_tensor *row = make(KILN_F32, 2, S(1, 3), V(1, 2, 3));
  kiln_tensor *e = kiln_expand(row, 2, S(2, 3)); /* [[1,2,3],[1,2,3]] */
  kiln_tensor *p = kiln_permute(e, P(1, 0));     /* [[1,1],[2,2],[3,3]] */
  kiln_tensor *m = iota(KILN_F32, 2, S(3, 2));
  kiln_tensor *r = kiln_mul(p, m);
  CHECK_TENSOR(p, 2, S(3, 2), V(1, 1, 2, 2, 3, 3), 0);
  CHECK_TENSOR(r, 2, S(3, 2), V(0, 1, 4, 6, 12, 15), 0);
  kiln_release(r);
  kiln_release(m);
  kiln_release(p);
  kiln_release(e);
  kiln_release(row);
}

TEST(chain_reshape_of_unsqueezed_slice) {
  kiln_tensor *a = iota(KILN_I32, 2, S(4, 3));
  kiln_tensor *s = kiln_slice(a, 0, 1, 3, 1); /* [[3,4,5],[6,7,8]] */
  kiln_tensor *u = kiln_unsqueeze(s, 1);      /* [2,1,3] */
  CHECK_VIEW(kiln_reshape(u, 2, S(3, 2)), 2, S(3, 2), V(3, 4, 5, 6, 7, 8));
  CHECK_VIEW(kiln_squeeze(u, -2), 2, S(2, 3), V(3, 4, 5, 6, 7, 8));
  kiln_release(u);
  kiln_release(s);
  kiln_release(a);
}

/* ------------------------------------------------------- storage sharing */

TEST(views_share_base_storage) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *r = kiln_reshape(a, 2, S(3, 2));
  kiln_tensor *r1 = kiln_reshape(a, 1, S(-1));
  kiln_tensor *p = kiln_permute(a, P(1, 0));
  kiln_tensor *t = kiln_transpose(a, 0, 1);
  kiln_tensor *sl = kiln_slice(a, 1, 2, -100, -2);
  kiln_tensor *u = kiln_unsqueeze(a, 1);
  kiln_tensor *sq = kiln_squeeze(u, 1);
  kiln_tensor *col = kiln_slice(a, 1, 0, 1, 1); /* [2,1] */
  kiln_tensor *e = kiln_expand(col, 2, S(2, 5));
  check_shares_storage(a, r);
  check_shares_storage(a, r1);
  check_shares_storage(a, p);
  check_shares_storage(a, t);
  check_shares_storage(a, sl);
  check_shares_storage(a, u);
  check_shares_storage(a, sq);
  check_shares_storage(a, col);
  check_shares_storage(a, e);
  CHECK_TENSOR(e, 2, S(2, 5), V(0, 0, 0, 0, 0, 3, 3, 3, 3, 3), 0);
  kiln_tensor *all[] = {r, r1, p, t, sl, u, sq, col, e};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
  kiln_release(a);
}

TEST(zero_d_reshape_and_expand_share_storage) {
  kiln_tensor *s = kiln_scalar(1.25, KILN_F64);
  /* a materialized base: a pending fill read through a view alone is not
     kept (recomputing a fill is cheaper), and its views then own a copy */
  CHECK(kiln_sync() == KILN_OK);
  kiln_tensor *one = kiln_reshape(s, 1, S(1));
  kiln_tensor *e = kiln_expand(s, 2, S(3, 2));
  check_shares_storage(s, one);
  check_shares_storage(s, e);
  kiln_release(e);
  kiln_release(one);
  kiln_release(s);
}

TEST(view_outlives_released_base) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *t = kiln_transpose(a, 0, 1);
  kiln_release(a);
  CHECK_TENSOR(t, 2, S(3, 2), V(0, 3, 1, 4, 2, 5), 0);
  kiln_release(t);
}

/* --------------------------------------------------------- concat / stack */

TEST(concat_2d_along_each_axis) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *b = make(KILN_F32, 2, S(2, 3), V(10, 11, 12, 13, 14, 15));
  kiln_tensor *ab[] = {a, b};
  CHECK_VIEW(kiln_concat(2, ab, 0), 2, S(4, 3), V(0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15));
  CHECK_VIEW(kiln_concat(2, ab, 1), 2, S(2, 6), V(0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15));
  CHECK_VIEW(kiln_concat(2, ab, -1), 2, S(2, 6), V(0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15));
  CHECK_VIEW(kiln_concat(2, ab, -2), 2, S(4, 3), V(0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15));
  kiln_release(b);
  kiln_release(a);
}

TEST(concat_different_sizes_along_axis) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *d = make(KILN_F32, 2, S(1, 3), V(20, 21, 22));
  kiln_tensor *b = make(KILN_F32, 2, S(2, 3), V(10, 11, 12, 13, 14, 15));
  kiln_tensor *adb[] = {a, d, b};
  CHECK_VIEW(kiln_concat(3, adb, 0), 2, S(5, 3),
             V(0, 1, 2, 3, 4, 5, 20, 21, 22, 10, 11, 12, 13, 14, 15));
  kiln_tensor *e = make(KILN_F32, 2, S(2, 1), V(30, 31));
  kiln_tensor *ea[] = {e, a};
  CHECK_VIEW(kiln_concat(2, ea, 1), 2, S(2, 4), V(30, 0, 1, 2, 31, 3, 4, 5));
  kiln_tensor *only[] = {a};
  CHECK_VIEW(kiln_concat(1, only, 0), 2, S(2, 3), V(0, 1, 2, 3, 4, 5));
  kiln_release(e);
  kiln_release(b);
  kiln_release(d);
  kiln_release(a);
}

TEST(concat_3d_along_each_axis) {
  kiln_tensor *p = iota(KILN_I32, 3, S(2, 2, 2));
  kiln_tensor *q = make(KILN_I32, 3, S(2, 2, 2), V(100, 101, 102, 103, 104, 105, 106, 107));
  kiln_tensor *pq[] = {p, q};
  CHECK_VIEW(kiln_concat(2, pq, 0), 3, S(4, 2, 2),
             V(0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103, 104, 105, 106, 107));
  CHECK_VIEW(kiln_concat(2, pq, 1), 3, S(2, 4, 2),
             V(0, 1, 2, 3, 100, 101, 102, 103, 4, 5, 6, 7, 104, 105, 106, 107));
  CHECK_VIEW(kiln_concat(2, pq, 2), 3, S(2, 2, 4),
             V(0, 1, 100, 101, 2, 3, 102, 103, 4, 5, 104, 105, 6, 7, 106, 107));
  kiln_tensor *r = kiln_concat(2, pq, 2);
  if (r) CHECK_EQ_INT(kiln_dtype_of(r), KILN_I32);
  kiln_release(r);
  kiln_release(q);
  kiln_release(p);
}

TEST(concat_of_noncontiguous_views) {
  kiln_tensor *m = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *t = kiln_transpose(m, 0, 1);       /* [[0,3],[1,4],[2,5]] */
  kiln_tensor *r = kiln_slice(t, 0, 2, -100, -1); /* [[2,5],[1,4],[0,3]] */
  kiln_tensor *tr[] = {t, r};
  CHECK_VIEW(kiln_concat(2, tr, 1), 2, S(3, 4), V(0, 3, 2, 5, 1, 4, 1, 4, 2, 5, 0, 3));
  CHECK_VIEW(kiln_concat(2, tr, 0), 2, S(6, 2), V(0, 3, 1, 4, 2, 5, 2, 5, 1, 4, 0, 3));
  kiln_release(r);
  kiln_release(t);
  kiln_release(m);
}

/* contiguous parts are copied as memcpy pieces spread over the pool: a
   loop's k stacked steps, and rows long enough to take several chunks;
   every element checked, in the dtypes of every width, against the
   element's own formula and against the same concat with one part a
   transposed view (the general path) */
static double piece_value(int64_t part, int64_t r, int64_t c) {
  return (double)((part * 131 + r * 17 + c) % 251);
}

TEST(concat_of_many_parts_and_long_rows_moves_every_element) {
  enum { K = 300, R = 7, C = 33 };
  const kiln_dtype dts[] = {KILN_F32, KILN_I8, KILN_BF16, KILN_F64, KILN_BOOL};
  for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
    kiln_dtype dt = dts[d];
    kiln_tensor *parts[K];
    double *v = malloc(sizeof *v * R * C);
    for (int p = 0; p < K; p++) {
      for (int i = 0; i < R * C; i++)
        v[i] = ktest_as_dtype(dt, piece_value(p, i / C, i % C) - (dt == KILN_I8 ? 125 : 0));
      parts[p] = make(dt, 3, S(1, R, C), v);
    }
    kiln_tensor *all = kiln_concat(K, parts, 0);
    double *got = all ? ktest_values(all) : NULL;
    CHECK(all && kiln_ndim(all) == 3 && kiln_shape(all)[0] == K);
    int bad = 0;
    for (int64_t f = 0; got && f < (int64_t)K * R * C; f++) {
      int64_t p = f / (R * C), i = f % (R * C);
      double want = ktest_as_dtype(dt, piece_value(p, i / C, i % C) - (dt == KILN_I8 ? 125 : 0));
      bad += got[f] != want;
    }
    if (bad) KTEST_FAIL("%s: %d of %d elements moved wrong", ktest_dtype_name(dt), bad, K * R * C);
    free(got);
    kiln_release(all);
    for (int p = 0; p < K; p++) kiln_release(parts[p]);
    free(v);
  }
  /* the last axis, rows of 17 + 1 + 40 from parts of 3 200 rows */
  const int64_t w[3] = {17, 1, 40}, rows = 3200;
  kiln_tensor *cols[3], *viewed[3];
  for (int p = 0; p < 3; p++) {
    double *v = malloc(sizeof *v * (size_t)(rows * w[p]));
    for (int64_t i = 0; i < rows * w[p]; i++) v[i] = piece_value(p, i / w[p], i % w[p]);
    cols[p] = make(KILN_F32, 2, S(rows, w[p]), v);
    free(v);
    viewed[p] = cols[p];
  }
  /* part 2 again as a transposed view (not contiguous) of its columns */
  double *tv = malloc(sizeof *tv * (size_t)(rows * w[2]));
  for (int64_t i = 0; i < rows * w[2]; i++) tv[i] = piece_value(2, i % rows, i / rows);
  kiln_tensor *tc = make(KILN_F32, 2, S(w[2], rows), tv);
  free(tv);
  viewed[2] = kiln_transpose(tc, 0, 1);
  kiln_tensor *fast = kiln_concat(3, cols, 1), *slow = kiln_concat(3, viewed, 1);
  double *a = fast ? ktest_values(fast) : NULL, *b = slow ? ktest_values(slow) : NULL;
  CHECK(a && b);
  int bad = 0;
  for (int64_t r = 0; a && b && r < rows; r++)
    for (int64_t c = 0, at = 0; c < 58; c++) {
      int p = c < 17 ? 0 : c < 18 ? 1 : 2;
      at = c - (p == 0 ? 0 : p == 1 ? 17 : 18);
      double want = piece_value(p, r, at);
      bad += a[r * 58 + c] != want || b[r * 58 + c] != want;
    }
  CHECK_EQ_INT(bad, 0);
  free(a);
  free(b);
  kiln_release(fast);
  kiln_release(slow);
  kiln_release(viewed[2]);
  kiln_release(tc);
  for (int p = 0; p < 3; p++) kiln_release(cols[p]);
}

TEST(stack_2d_along_each_axis) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *b = make(KILN_F32, 2, S(2, 3), V(10, 11, 12, 13, 14, 15));
  kiln_tensor *ab[] = {a, b};
  CHECK_VIEW(kiln_stack(2, ab, 0), 3, S(2, 2, 3), V(0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15));
  CHECK_VIEW(kiln_stack(2, ab, 1), 3, S(2, 2, 3), V(0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15));
  CHECK_VIEW(kiln_stack(2, ab, 2), 3, S(2, 3, 2), V(0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15));
  CHECK_VIEW(kiln_stack(2, ab, -1), 3, S(2, 3, 2), V(0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15));
  CHECK_VIEW(kiln_stack(2, ab, -3), 3, S(2, 2, 3), V(0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15));
  kiln_release(b);
  kiln_release(a);
}

TEST(stack_1d_and_0d) {
  kiln_tensor *x = make(KILN_I64, 1, S(3), V(1, 2, 3));
  kiln_tensor *y = make(KILN_I64, 1, S(3), V(4, 5, 6));
  kiln_tensor *z = make(KILN_I64, 1, S(3), V(7, 8, 9));
  kiln_tensor *xyz[] = {x, y, z};
  CHECK_VIEW(kiln_stack(3, xyz, 0), 2, S(3, 3), V(1, 2, 3, 4, 5, 6, 7, 8, 9));
  CHECK_VIEW(kiln_stack(3, xyz, 1), 2, S(3, 3), V(1, 4, 7, 2, 5, 8, 3, 6, 9));
  kiln_tensor *s0 = kiln_scalar(1, KILN_F32), *s1 = kiln_scalar(2, KILN_F32);
  kiln_tensor *ss[] = {s0, s1, s0};
  CHECK_VIEW(kiln_stack(3, ss, 0), 1, S(3), V(1, 2, 1));
  kiln_release(s1);
  kiln_release(s0);
  kiln_release(z);
  kiln_release(y);
  kiln_release(x);
}

/* ---------------------------------------------- functional in-place ops */

TEST(assign_rebinds_handle_earlier_views_and_results_keep_old_value) {
  kiln_tensor *x = make(KILN_F32, 1, S(4), V(1, 2, 3, 4));
  kiln_tensor *view = kiln_slice(x, 0, 0, 4, 2); /* pending view of old x */
  kiln_tensor *pending = kiln_mul_scalar(x, 10); /* pending result of old x */
  kiln_tensor *read = kiln_add_scalar(x, 1);     /* evaluated before the assign */
  CHECK_TENSOR(read, 1, S(4), V(2, 3, 4, 5), 0);
  kiln_tensor *src = make(KILN_F32, 1, S(4), V(5, 6, 7, 8));
  CHECK_EQ_INT(kiln_assign(x, src), KILN_OK);
  CHECK_TENSOR(x, 1, S(4), V(5, 6, 7, 8), 0);
  CHECK_EQ_INT(kiln_dtype_of(x), KILN_F32);
  CHECK_TENSOR(view, 1, S(2), V(1, 3), 0);
  CHECK_TENSOR(pending, 1, S(4), V(10, 20, 30, 40), 0);
  CHECK_TENSOR(read, 1, S(4), V(2, 3, 4, 5), 0);
  /* views and results taken after the assign see the new value */
  CHECK_VIEW(kiln_slice(x, 0, 0, 4, 2), 1, S(2), V(5, 7));
  CHECK_VIEW(kiln_mul_scalar(x, 10), 1, S(4), V(50, 60, 70, 80));
  kiln_release(src);
  kiln_release(read);
  kiln_release(pending);
  kiln_release(view);
  kiln_release(x);
}

TEST(assign_does_not_alias_src) {
  kiln_tensor *x = kiln_zeros(KILN_F32, 1, S(3));
  kiln_tensor *src = make(KILN_F32, 1, S(3), V(1, 2, 3));
  kiln_tensor *ones = kiln_ones(KILN_F32, 1, S(3));
  CHECK_EQ_INT(kiln_assign(x, src), KILN_OK);
  CHECK_EQ_INT(kiln_sub_scaled_(src, ones, 1.0), KILN_OK); /* src changes ... */
  CHECK_TENSOR(src, 1, S(3), V(0, 1, 2), 0);
  CHECK_TENSOR(x, 1, S(3), V(1, 2, 3), 0); /* ... x does not */
  kiln_release(ones);
  kiln_release(src);
  kiln_release(x);
}

TEST(sub_scaled_updates_handle_old_views_and_results_keep_old_value) {
  kiln_tensor *x = make(KILN_F32, 1, S(4), V(1, 2, 3, 4));
  kiln_tensor *g = make(KILN_F32, 1, S(4), V(2, 2, 2, 2));
  kiln_tensor *view = kiln_slice(x, 0, 3, -100, -1); /* reversed old x */
  kiln_tensor *neg = kiln_neg(x);
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, 0.5), KILN_OK);
  CHECK_TENSOR(x, 1, S(4), V(0, 1, 2, 3), 0);
  CHECK_TENSOR(view, 1, S(4), V(4, 3, 2, 1), 0);
  CHECK_TENSOR(neg, 1, S(4), V(-1, -2, -3, -4), 0);
  CHECK_TENSOR(g, 1, S(4), V(2, 2, 2, 2), 0);
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, 0.5), KILN_OK); /* updates accumulate */
  CHECK_TENSOR(x, 1, S(4), V(-1, 0, 1, 2), 0);
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, -2.0), KILN_OK); /* negative alpha adds */
  CHECK_TENSOR(x, 1, S(4), V(3, 4, 5, 6), 0);
  kiln_release(neg);
  kiln_release(view);
  kiln_release(g);
  kiln_release(x);
}

TEST(sub_scaled_f64_in_a_loop_without_reads) {
  kiln_tensor *x = make(KILN_F64, 2, S(2, 2), V(10, 20, 30, 40));
  kiln_tensor *g = make(KILN_F64, 2, S(2, 2), V(1, 2, 3, 4));
  for (int i = 0; i < 10; i++) CHECK_EQ_INT(kiln_sub_scaled_(x, g, 0.25), KILN_OK);
  CHECK_TENSOR(x, 2, S(2, 2), V(7.5, 15, 22.5, 30), 1e-12);
  CHECK_EQ_INT(kiln_dtype_of(x), KILN_F64);
  kiln_release(g);
  kiln_release(x);
}

TEST(in_place_on_a_view_handle_leaves_other_handles_alone) {
  kiln_tensor *x = make(KILN_F32, 1, S(4), V(1, 2, 3, 4));
  kiln_tensor *v = kiln_slice(x, 0, 0, 2, 1); /* [1,2] */
  kiln_tensor *src = make(KILN_F32, 1, S(2), V(9, 9));
  CHECK_EQ_INT(kiln_assign(v, src), KILN_OK);
  CHECK_TENSOR(v, 1, S(2), V(9, 9), 0);
  CHECK_TENSOR(x, 1, S(4), V(1, 2, 3, 4), 0);
  kiln_release(src);
  kiln_release(v);
  kiln_release(x);
}

TEST(assign_casts_src_to_dst_dtype) {
  kiln_tensor *xf = kiln_zeros(KILN_F32, 1, S(3));
  kiln_tensor *si = make(KILN_I32, 1, S(3), V(1, -2, 3));
  CHECK_EQ_INT(kiln_assign(xf, si), KILN_OK);
  CHECK_EQ_INT(kiln_dtype_of(xf), KILN_F32);
  CHECK_TENSOR(xf, 1, S(3), V(1, -2, 3), 0);

  kiln_tensor *xi = kiln_zeros(KILN_I32, 1, S(3));
  kiln_tensor *sd = make(KILN_F64, 1, S(3), V(1.5, -2.7, 3.9));
  CHECK_EQ_INT(kiln_assign(xi, sd), KILN_OK);
  CHECK_EQ_INT(kiln_dtype_of(xi), KILN_I32);
  CHECK_TENSOR(xi, 1, S(3), V(1, -2, 3), 0); /* float -> int truncates toward zero */

  kiln_tensor *xb = kiln_zeros(KILN_BOOL, 1, S(3));
  kiln_tensor *sf = make(KILN_F32, 1, S(3), V(0, 0.5, -3));
  CHECK_EQ_INT(kiln_assign(xb, sf), KILN_OK);
  CHECK_EQ_INT(kiln_dtype_of(xb), KILN_BOOL);
  CHECK_TENSOR(xb, 1, S(3), V(0, 1, 1), 0);

  kiln_release(sf);
  kiln_release(xb);
  kiln_release(sd);
  kiln_release(xi);
  kiln_release(si);
  kiln_release(xf);
}

TEST(assign_with_mismatched_shape_is_an_error_and_keeps_value) {
  kiln_tensor *x = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *s32 = kiln_zeros(KILN_F32, 2, S(3, 2));
  kiln_tensor *s22 = kiln_zeros(KILN_F32, 2, S(2, 2));
  kiln_clear_error();
  CHECK_EQ_INT(kiln_assign(x, s32), KILN_ERR_SHAPE);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_assign");
  kiln_clear_error();
  CHECK_EQ_INT(kiln_assign(x, s22), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_assign");
  kiln_clear_error();
  kiln_tensor *g = kiln_ones(KILN_F32, 1, S(4));
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, 1.0), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_sub_scaled_");
  kiln_clear_error();
  CHECK_TENSOR(x, 2, S(2, 3), V(0, 1, 2, 3, 4, 5), 0);
  kiln_release(g);
  kiln_release(s22);
  kiln_release(s32);
  kiln_release(x);
}

int main(void) {
  RUN(reshape_contiguous_keeps_row_major_order);
  RUN(reshape_infers_one_minus_one_dimension);
  RUN(reshape_keeps_dtype);
  RUN(reshape_of_transposed_input_copies_in_logical_order);
  RUN(reshape_of_strided_slice_gives_selected_elements);
  RUN(reshape_between_zero_d_and_one_element);
  RUN(reshape_of_empty_tensor);
  RUN(permute_3d_every_order_checked_by_hand);
  RUN(permute_then_inverse_permute_is_identity);
  RUN(transpose_2d_and_3d);
  RUN(transpose_accepts_negative_axes);
  RUN(transposed_view_feeds_elementwise_op);
  RUN(expand_repeats_size_one_axes);
  RUN(expand_zero_d_to_matrix);
  RUN(expanded_view_feeds_elementwise_op);
  RUN(squeeze_removes_the_named_size_one_axis);
  RUN(unsqueeze_inserts_axis_positive_and_negative);
  RUN(squeeze_undoes_unsqueeze);
  RUN(slice_step_one);
  RUN(slice_steps_two_and_three);
  RUN(slice_negative_steps_walk_backwards);
  RUN(slice_bounds_clamped_like_python);
  RUN(slice_empty_results);
  RUN(slice_at_int64_extremes_matches_python);
  RUN(huge_step_slices_of_2d_and_of_other_views);
  RUN(empty_result_evaluates_none_of_its_inputs);
  RUN(slice_along_each_axis_of_2d);
  RUN(slice_middle_axis_of_3d);
  RUN(chain_transpose_slice_slice_unsqueeze_expand_then_reshape);
  RUN(chain_slice_of_reversed_slice);
  RUN(chain_permute_of_expanded_then_elementwise);
  RUN(chain_reshape_of_unsqueezed_slice);
  RUN(views_share_base_storage);
  RUN(zero_d_reshape_and_expand_share_storage);
  RUN(view_outlives_released_base);
  RUN(concat_2d_along_each_axis);
  RUN(concat_different_sizes_along_axis);
  RUN(concat_3d_along_each_axis);
  RUN(concat_of_noncontiguous_views);
  RUN(concat_of_many_parts_and_long_rows_moves_every_element);
  RUN(stack_2d_along_each_axis);
  RUN(stack_1d_and_0d);
  RUN(assign_rebinds_handle_earlier_views_and_results_keep_old_value);
  RUN(assign_does_not_alias_src);
  RUN(sub_scaled_updates_handle_old_views_and_results_keep_old_value);
  RUN(sub_scaled_f64_in_a_loop_without_reads);
  RUN(in_place_on_a_view_handle_leaves_other_handles_alone);
  RUN(assign_casts_src_to_dst_dtype);
  RUN(assign_with_mismatched_shape_is_an_error_and_keeps_value);
  return ktest_done();
}
