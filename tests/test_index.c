/* test_index.c — index_select, gather and scatter_add: values worked out by
 * hand on every axis of 2-d and 3-d tensors, i32 and i64 indices, repeated
 * indices, float and integer data; and their errors (index out of range,
 * wrong index dtype, wrong index ndim, mismatched shapes). */
#include <stdint.h>

#include "ktest.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define V(...) ((const double[]){__VA_ARGS__})

/* evaluates expr once, checks shape and values exactly, releases it */
#define CHECK_RESULT(expr, nd, shape, expect) \
  do {                                        \
    kiln_tensor *cr_ = (expr);                \
    CHECK_TENSOR(cr_, nd, shape, expect, 0);  \
    kiln_release(cr_);                        \
  } while (0)

/* same, and the result has dtype dt */
#define CHECK_RESULT_DT(expr, dt, nd, shape, expect) \
  do {                                               \
    kiln_tensor *cr_ = (expr);                       \
    if (cr_) CHECK_EQ_INT(kiln_dtype_of(cr_), dt);   \
    CHECK_TENSOR(cr_, nd, shape, expect, 0);         \
    kiln_release(cr_);                               \
  } while (0)

/* a tensor of dtype dt holding the doubles vals (converted) */
static kiln_tensor *make(kiln_dtype dt, int ndim, const int64_t *shape, const double *vals) {
  kiln_tensor *t = ktest_from_doubles(dt, ndim, shape, vals);
  CHECK(t != NULL);
  return t;
}

/* 0, 1, ... n-1 in the given shape */
static kiln_tensor *iota(kiln_dtype dt, int ndim, const int64_t *shape) {
  double v[64];
  for (int i = 0; i < 64; i++) v[i] = i;
  return make(dt, ndim, shape, v);
}

/* ------------------------------------------------------------ index_select */

TEST(index_select_2d_axis0_i64_repeated_rows) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4)); /* a[i][j] = 4i + j */
  kiln_tensor *idx = make(KILN_I64, 1, S(3), V(2, 0, 2));
  CHECK_RESULT_DT(kiln_index_select(a, 0, idx), KILN_F32, 2, S(3, 4),
                  V(8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11));
  kiln_release(idx);
  kiln_release(a);
}

TEST(index_select_2d_axis1_i32_indices) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I32, 1, S(2), V(3, 1));
  CHECK_RESULT(kiln_index_select(a, 1, idx), 2, S(3, 2), V(3, 1, 7, 5, 11, 9));
  kiln_tensor *same = make(KILN_I64, 1, S(2), V(0, 0));
  CHECK_RESULT(kiln_index_select(a, -1, same), 2, S(3, 2), V(0, 0, 4, 4, 8, 8));
  kiln_release(same);
  kiln_release(idx);
  kiln_release(a);
}

TEST(index_select_3d_every_axis) {
  kiln_tensor *a = iota(KILN_F64, 3, S(2, 3, 4)); /* a[i][j][k] = 12i + 4j + k */
  kiln_tensor *i0 = make(KILN_I64, 1, S(3), V(1, 1, 0));
  kiln_tensor *i1 = make(KILN_I32, 1, S(2), V(2, 0));
  kiln_tensor *i2 = make(KILN_I64, 1, S(3), V(3, 0, 3));
  CHECK_RESULT(kiln_index_select(a, 0, i0), 3, S(3, 3, 4),
               V(12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                 21, 22, 23, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  CHECK_RESULT(kiln_index_select(a, 1, i1), 3, S(2, 2, 4),
               V(8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15));
  CHECK_RESULT(kiln_index_select(a, 2, i2), 3, S(2, 3, 3),
               V(3, 0, 3, 7, 4, 7, 11, 8, 11, 15, 12, 15, 19, 16, 19, 23, 20, 23));
  CHECK_RESULT(kiln_index_select(a, -3, i0), 3, S(3, 3, 4),
               V(12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                 21, 22, 23, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  kiln_release(i2);
  kiln_release(i1);
  kiln_release(i0);
  kiln_release(a);
}

TEST(index_select_integer_data_keeps_dtype) {
  kiln_tensor *a = make(KILN_I32, 2, S(2, 3), V(-1, 2, -3, 4, -5, 6));
  kiln_tensor *idx = make(KILN_I64, 1, S(4), V(2, 2, 0, 1));
  CHECK_RESULT_DT(kiln_index_select(a, 1, idx), KILN_I32, 2, S(2, 4),
                  V(-3, -3, -1, 2, 6, 6, 4, -5));
  kiln_tensor *b = make(KILN_I64, 1, S(3), V(5000000000.0, -7, 9));
  kiln_tensor *i32 = make(KILN_I32, 1, S(2), V(0, 0));
  CHECK_RESULT_DT(kiln_index_select(b, 0, i32), KILN_I64, 1, S(2), V(5000000000.0, 5000000000.0));
  kiln_release(i32);
  kiln_release(b);
  kiln_release(idx);
  kiln_release(a);
}

TEST(index_select_empty_index_gives_empty_axis) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = kiln_zeros(KILN_I64, 1, S(0));
  kiln_tensor *r = kiln_index_select(a, 0, idx);
  CHECK(r != NULL);
  if (r) {
    CHECK_EQ_INT(kiln_ndim(r), 2);
    CHECK_EQ_INT(kiln_shape(r)[0], 0);
    CHECK_EQ_INT(kiln_shape(r)[1], 4);
    CHECK_EQ_INT(kiln_numel(r), 0);
  }
  kiln_release(r);
  kiln_release(idx);
  kiln_release(a);
}

TEST(index_select_of_a_transposed_view) {
  kiln_tensor *a = iota(KILN_F32, 2, S(2, 3));
  kiln_tensor *t = kiln_transpose(a, 0, 1); /* [[0,3],[1,4],[2,5]] */
  kiln_tensor *idx = make(KILN_I64, 1, S(2), V(2, 0));
  CHECK_RESULT(kiln_index_select(t, 0, idx), 2, S(2, 2), V(2, 5, 0, 3));
  kiln_release(idx);
  kiln_release(t);
  kiln_release(a);
}

/* ------------------------------------------------------------------ gather */

TEST(gather_2d_axis0) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I64, 2, S(2, 4), V(2, 0, 1, 2, 0, 0, 2, 1));
  /* out[i][j] = a[idx[i][j]][j] */
  CHECK_RESULT_DT(kiln_gather(a, 0, idx), KILN_F32, 2, S(2, 4), V(8, 1, 6, 11, 0, 1, 10, 7));
  kiln_release(idx);
  kiln_release(a);
}

TEST(gather_2d_axis1_i32_indices) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I32, 2, S(3, 2), V(3, 0, 1, 1, 2, 3));
  /* out[i][j] = a[i][idx[i][j]] */
  CHECK_RESULT(kiln_gather(a, 1, idx), 2, S(3, 2), V(3, 0, 5, 5, 10, 11));
  CHECK_RESULT(kiln_gather(a, -1, idx), 2, S(3, 2), V(3, 0, 5, 5, 10, 11));
  kiln_release(idx);
  kiln_release(a);
}

TEST(gather_index_smaller_than_input_outside_axis) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *i1 = make(KILN_I64, 2, S(2, 3), V(0, 1, 2, 3, 3, 0));
  CHECK_RESULT(kiln_gather(a, 1, i1), 2, S(2, 3), V(0, 1, 2, 7, 7, 4));
  kiln_tensor *i0 = make(KILN_I64, 2, S(1, 2), V(2, 1));
  CHECK_RESULT(kiln_gather(a, 0, i0), 2, S(1, 2), V(8, 5));
  kiln_tensor *wide =
      make(KILN_I64, 2, S(3, 6), V(0, 1, 2, 3, 0, 1, 1, 1, 1, 1, 1, 1, 3, 2, 1, 0, 3, 2));
  /* the gathered axis itself may be longer than a's */
  CHECK_RESULT(kiln_gather(a, 1, wide), 2, S(3, 6),
               V(0, 1, 2, 3, 0, 1, 5, 5, 5, 5, 5, 5, 11, 10, 9, 8, 11, 10));
  kiln_release(wide);
  kiln_release(i0);
  kiln_release(i1);
  kiln_release(a);
}

TEST(gather_3d_every_axis) {
  kiln_tensor *a = iota(KILN_F32, 3, S(2, 3, 4)); /* a[i][j][k] = 12i + 4j + k */
  kiln_tensor *g0 = make(KILN_I64, 3, S(2, 3, 4),
                         V(0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0));
  kiln_tensor *g1 =
      make(KILN_I32, 3, S(2, 2, 4), V(0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0));
  kiln_tensor *g2 = make(KILN_I64, 3, S(2, 3, 2), V(0, 3, 2, 1, 0, 3, 1, 0, 3, 2, 1, 0));
  CHECK_RESULT(
      kiln_gather(a, 0, g0), 3, S(2, 3, 4),
      V(0, 13, 2, 15, 16, 5, 18, 7, 8, 21, 10, 23, 12, 1, 14, 3, 4, 17, 6, 19, 20, 9, 22, 11));
  CHECK_RESULT(kiln_gather(a, 1, g1), 3, S(2, 2, 4),
               V(0, 5, 10, 3, 4, 9, 2, 7, 20, 13, 18, 23, 12, 17, 22, 15));
  CHECK_RESULT(kiln_gather(a, 2, g2), 3, S(2, 3, 2), V(0, 3, 6, 5, 8, 11, 13, 12, 19, 18, 21, 20));
  kiln_release(g2);
  kiln_release(g1);
  kiln_release(g0);
  kiln_release(a);
}

TEST(gather_integer_data_keeps_dtype) {
  kiln_tensor *a = make(KILN_I64, 2, S(2, 3), V(10, -20, 30, -40, 50, -60));
  kiln_tensor *idx = make(KILN_I32, 2, S(2, 2), V(2, 2, 0, 1));
  CHECK_RESULT_DT(kiln_gather(a, 1, idx), KILN_I64, 2, S(2, 2), V(30, 30, -40, 50));
  kiln_tensor *b = make(KILN_I32, 1, S(4), V(7, 8, 9, 10));
  kiln_tensor *i1 = make(KILN_I64, 1, S(5), V(3, 3, 0, 1, 3));
  CHECK_RESULT_DT(kiln_gather(b, 0, i1), KILN_I32, 1, S(5), V(10, 10, 7, 8, 10));
  kiln_release(i1);
  kiln_release(b);
  kiln_release(idx);
  kiln_release(a);
}

/* ------------------------------------------------------------- scatter_add */

TEST(scatter_add_2d_axis0_repeated_indices_accumulate) {
  kiln_tensor *a = kiln_zeros(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I64, 2, S(2, 4), V(2, 0, 1, 2, 0, 0, 2, 1));
  kiln_tensor *src = make(KILN_F32, 2, S(2, 4), V(1, 2, 3, 4, 5, 6, 7, 8));
  /* out[idx[i][j]][j] += src[i][j]; column 1 receives 2 and 6 at row 0 */
  CHECK_RESULT_DT(kiln_scatter_add(a, 0, idx, src), KILN_F32, 2, S(3, 4),
                  V(5, 8, 0, 0, 0, 0, 3, 8, 1, 0, 7, 4));
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(scatter_add_2d_axis1_adds_onto_input) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4)); /* a[i][j] = 4i + j */
  kiln_tensor *idx = make(KILN_I32, 2, S(3, 2), V(3, 3, 0, 2, 1, 1));
  kiln_tensor *src = make(KILN_F32, 2, S(3, 2), V(1, 2, 3, 4, 5, 6));
  CHECK_RESULT(kiln_scatter_add(a, 1, idx, src), 2, S(3, 4),
               V(0, 1, 2, 6, 7, 5, 10, 7, 8, 20, 10, 11));
  CHECK_RESULT(kiln_scatter_add(a, -1, idx, src), 2, S(3, 4),
               V(0, 1, 2, 6, 7, 5, 10, 7, 8, 20, 10, 11));
  /* the input is a value: it is not modified */
  CHECK_TENSOR(a, 2, S(3, 4), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), 0);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(scatter_add_index_smaller_than_input) {
  kiln_tensor *a = kiln_ones(KILN_F64, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I64, 2, S(2, 2), V(3, 0, 0, 0));
  kiln_tensor *src = make(KILN_F64, 2, S(2, 2), V(0.5, 0.25, 2, 4));
  CHECK_RESULT_DT(kiln_scatter_add(a, 1, idx, src), KILN_F64, 2, S(3, 4),
                  V(1.25, 1, 1, 1.5, 7, 1, 1, 1, 1, 1, 1, 1));
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(scatter_add_1d_all_to_one_slot) {
  kiln_tensor *a = make(KILN_F32, 1, S(3), V(100, 200, 300));
  kiln_tensor *idx = make(KILN_I64, 1, S(5), V(1, 1, 1, 1, 1));
  kiln_tensor *src = make(KILN_F32, 1, S(5), V(1, 2, 3, 4, 5));
  CHECK_RESULT(kiln_scatter_add(a, 0, idx, src), 1, S(3), V(100, 215, 300));
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(scatter_add_3d_every_axis) {
  kiln_tensor *z = kiln_zeros(KILN_F32, 3, S(2, 3, 4));
  kiln_tensor *g0 = make(KILN_I64, 3, S(2, 3, 4),
                         V(0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0));
  kiln_tensor *g1 =
      make(KILN_I32, 3, S(2, 2, 4), V(0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0));
  kiln_tensor *g2 = make(KILN_I64, 3, S(2, 3, 2), V(0, 3, 2, 1, 0, 3, 1, 0, 3, 2, 1, 0));
  double seq[24];
  for (int i = 0; i < 24; i++) seq[i] = i + 1; /* src = 1, 2, 3, ... */
  kiln_tensor *s0 = make(KILN_F32, 3, S(2, 3, 4), seq);
  kiln_tensor *s1 = make(KILN_F32, 3, S(2, 2, 4), seq);
  kiln_tensor *s2 = make(KILN_F32, 3, S(2, 3, 2), seq);
  CHECK_RESULT(
      kiln_scatter_add(z, 0, g0, s0), 3, S(2, 3, 4),
      V(1, 14, 3, 16, 17, 6, 19, 8, 9, 22, 11, 24, 13, 2, 15, 4, 5, 18, 7, 20, 21, 10, 23, 12));
  CHECK_RESULT(kiln_scatter_add(z, 1, g1, s1), 3, S(2, 3, 4),
               V(1, 0, 7, 4, 5, 2, 0, 8, 0, 6, 3, 0, 13, 10, 0, 16, 0, 14, 11, 0, 9, 0, 15, 12));
  CHECK_RESULT(kiln_scatter_add(z, 2, g2, s2), 3, S(2, 3, 4),
               V(1, 0, 0, 2, 0, 4, 3, 0, 5, 0, 0, 6, 8, 7, 0, 0, 0, 0, 10, 9, 12, 11, 0, 0));
  kiln_release(s2);
  kiln_release(s1);
  kiln_release(s0);
  kiln_release(g2);
  kiln_release(g1);
  kiln_release(g0);
  kiln_release(z);
}

TEST(scatter_add_integer_data_keeps_dtype) {
  kiln_tensor *a = make(KILN_I32, 2, S(2, 2), V(1, 2, 3, 4));
  kiln_tensor *idx = make(KILN_I64, 2, S(2, 2), V(1, 1, 0, 1));
  kiln_tensor *src = make(KILN_I32, 2, S(2, 2), V(10, -20, 30, 40));
  CHECK_RESULT_DT(kiln_scatter_add(a, 0, idx, src), KILN_I32, 2, S(2, 2), V(31, 2, 13, 24));
  kiln_tensor *b = kiln_zeros(KILN_I64, 1, S(2));
  kiln_tensor *bi = make(KILN_I32, 1, S(3), V(0, 1, 0));
  kiln_tensor *bs = make(KILN_I64, 1, S(3), V(3000000000.0, 5, 3000000000.0));
  CHECK_RESULT_DT(kiln_scatter_add(b, 0, bi, bs), KILN_I64, 1, S(2), V(6000000000.0, 5));
  kiln_release(bs);
  kiln_release(bi);
  kiln_release(b);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(scatter_add_is_adjoint_of_gather_on_ones) {
  /* scatter_add(zeros, ax, idx, ones) counts how often each slot is gathered */
  kiln_tensor *z = kiln_zeros(KILN_F32, 1, S(4));
  kiln_tensor *idx = make(KILN_I64, 1, S(6), V(3, 0, 3, 3, 1, 0));
  kiln_tensor *ones = kiln_ones(KILN_F32, 1, S(6));
  CHECK_RESULT(kiln_scatter_add(z, 0, idx, ones), 1, S(4), V(2, 1, 0, 3));
  kiln_release(ones);
  kiln_release(idx);
  kiln_release(z);
}

/* ------------------------------------------------------------------ errors */

/* An out-of-range index is an error naming the op and the value. It may be
 * reported when the op is called (NULL) or, if the check needs the index
 * values, when the result is read. */
static void check_index_error(kiln_tensor *r, const char *op, const char *value) {
  if (r) {
    size_t bytes = (size_t)(kiln_numel(r) + 1) * 8;
    void *buf = malloc(bytes);
    int rc = kiln_to_buffer(r, buf, bytes);
    CHECK(rc < 0);
    free(buf);
    kiln_release(r);
  }
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), op);
  CHECK_STR_CONTAINS(kiln_last_error(), value);
  kiln_clear_error();
}

TEST(index_select_index_out_of_range_names_the_value) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *big = make(KILN_I64, 1, S(2), V(0, 17));
  kiln_tensor *neg = make(KILN_I32, 1, S(2), V(-3, 1));
  kiln_tensor *edge = make(KILN_I64, 1, S(1), V(4)); /* == size of axis 1 */
  kiln_clear_error();
  check_index_error(kiln_index_select(a, 0, big), "kiln_index_select", "17");
  check_index_error(kiln_index_select(a, 1, neg), "kiln_index_select", "-3");
  check_index_error(kiln_index_select(a, 1, edge), "kiln_index_select", "4");
  kiln_release(edge);
  kiln_release(neg);
  kiln_release(big);
  kiln_release(a);
}

TEST(gather_index_out_of_range_names_the_value) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *big = make(KILN_I64, 2, S(1, 2), V(1, 99));
  kiln_tensor *neg = make(KILN_I32, 2, S(1, 1), V(-1));
  kiln_clear_error();
  check_index_error(kiln_gather(a, 1, big), "kiln_gather", "99");
  check_index_error(kiln_gather(a, 0, neg), "kiln_gather", "-1");
  kiln_release(neg);
  kiln_release(big);
  kiln_release(a);
}

TEST(scatter_add_index_out_of_range_names_the_value) {
  kiln_tensor *a = kiln_zeros(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx = make(KILN_I64, 2, S(1, 2), V(0, 33));
  kiln_tensor *src = kiln_ones(KILN_F32, 2, S(1, 2));
  kiln_tensor *neg = make(KILN_I64, 2, S(1, 2), V(-5, 0));
  kiln_clear_error();
  check_index_error(kiln_scatter_add(a, 0, idx, src), "kiln_scatter_add", "33");
  check_index_error(kiln_scatter_add(a, 1, neg, src), "kiln_scatter_add", "-5");
  kiln_release(neg);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(a);
}

TEST(index_ops_reject_float_and_bool_indices) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *fidx = make(KILN_F32, 1, S(2), V(0, 1));
  kiln_tensor *bidx = make(KILN_BOOL, 1, S(2), V(0, 1));
  kiln_tensor *fidx2 = make(KILN_F64, 2, S(3, 4), V(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  kiln_tensor *src = kiln_ones(KILN_F32, 2, S(3, 4));
  CHECK_ERROR(kiln_index_select(a, 0, fidx), KILN_ERR_DTYPE, "kiln_index_select");
  CHECK_ERROR(kiln_index_select(a, 0, bidx), KILN_ERR_DTYPE, "kiln_index_select");
  CHECK_ERROR(kiln_gather(a, 0, fidx2), KILN_ERR_DTYPE, "kiln_gather");
  CHECK_ERROR(kiln_scatter_add(a, 0, fidx2, src), KILN_ERR_DTYPE, "kiln_scatter_add");
  kiln_release(src);
  kiln_release(fidx2);
  kiln_release(bidx);
  kiln_release(fidx);
  kiln_release(a);
}

TEST(index_ops_reject_index_of_wrong_ndim) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx2d = kiln_zeros(KILN_I64, 2, S(2, 2));
  kiln_tensor *idx1d = kiln_zeros(KILN_I64, 1, S(2));
  kiln_tensor *idx3d = kiln_zeros(KILN_I64, 3, S(1, 1, 1));
  kiln_tensor *src1d = kiln_ones(KILN_F32, 1, S(2));
  kiln_tensor *src3d = kiln_ones(KILN_F32, 3, S(1, 1, 1));
  CHECK_ERROR(kiln_index_select(a, 0, idx2d), KILN_ERR_SHAPE, "kiln_index_select");
  CHECK_ERROR(kiln_gather(a, 0, idx1d), KILN_ERR_SHAPE, "kiln_gather");
  CHECK_ERROR(kiln_gather(a, 1, idx3d), KILN_ERR_SHAPE, "kiln_gather");
  CHECK_ERROR(kiln_scatter_add(a, 0, idx1d, src1d), KILN_ERR_SHAPE, "kiln_scatter_add");
  CHECK_ERROR(kiln_scatter_add(a, 0, idx3d, src3d), KILN_ERR_SHAPE, "kiln_scatter_add");
  kiln_release(src3d);
  kiln_release(src1d);
  kiln_release(idx3d);
  kiln_release(idx1d);
  kiln_release(idx2d);
  kiln_release(a);
}

TEST(gather_and_scatter_add_reject_oversized_index_and_bad_src) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *tall = kiln_zeros(KILN_I64, 2, S(4, 2)); /* 4 > 3 outside axis 1 */
  kiln_tensor *idx = kiln_zeros(KILN_I64, 2, S(2, 2));
  kiln_tensor *src_bad = kiln_ones(KILN_F32, 2, S(2, 3)); /* must have idx's shape */
  kiln_tensor *src_tall = kiln_ones(KILN_F32, 2, S(4, 2));
  CHECK_ERROR(kiln_gather(a, 1, tall), KILN_ERR_SHAPE, "kiln_gather");
  CHECK_ERROR(kiln_scatter_add(a, 1, tall, src_tall), KILN_ERR_SHAPE, "kiln_scatter_add");
  CHECK_ERROR(kiln_scatter_add(a, 0, idx, src_bad), KILN_ERR_SHAPE, "kiln_scatter_add");
  kiln_release(src_tall);
  kiln_release(src_bad);
  kiln_release(idx);
  kiln_release(tall);
  kiln_release(a);
}

TEST(index_ops_reject_axis_out_of_range) {
  kiln_tensor *a = iota(KILN_F32, 2, S(3, 4));
  kiln_tensor *idx1 = kiln_zeros(KILN_I64, 1, S(1));
  kiln_tensor *idx2 = kiln_zeros(KILN_I64, 2, S(1, 1));
  kiln_tensor *src = kiln_ones(KILN_F32, 2, S(1, 1));
  CHECK_ERROR(kiln_index_select(a, 2, idx1), KILN_ERR_ARG, "kiln_index_select");
  CHECK_ERROR(kiln_index_select(a, -3, idx1), KILN_ERR_ARG, "kiln_index_select");
  CHECK_ERROR(kiln_gather(a, 2, idx2), KILN_ERR_ARG, "kiln_gather");
  CHECK_ERROR(kiln_scatter_add(a, -3, idx2, src), KILN_ERR_ARG, "kiln_scatter_add");
  kiln_release(src);
  kiln_release(idx2);
  kiln_release(idx1);
  kiln_release(a);
}

int main(void) {
  RUN(index_select_2d_axis0_i64_repeated_rows);
  RUN(index_select_2d_axis1_i32_indices);
  RUN(index_select_3d_every_axis);
  RUN(index_select_integer_data_keeps_dtype);
  RUN(index_select_empty_index_gives_empty_axis);
  RUN(index_select_of_a_transposed_view);
  RUN(gather_2d_axis0);
  RUN(gather_2d_axis1_i32_indices);
  RUN(gather_index_smaller_than_input_outside_axis);
  RUN(gather_3d_every_axis);
  RUN(gather_integer_data_keeps_dtype);
  RUN(scatter_add_2d_axis0_repeated_indices_accumulate);
  RUN(scatter_add_2d_axis1_adds_onto_input);
  RUN(scatter_add_index_smaller_than_input);
  RUN(scatter_add_1d_all_to_one_slot);
  RUN(scatter_add_3d_every_axis);
  RUN(scatter_add_integer_data_keeps_dtype);
  RUN(scatter_add_is_adjoint_of_gather_on_ones);
  RUN(index_select_index_out_of_range_names_the_value);
  RUN(gather_index_out_of_range_names_the_value);
  RUN(scatter_add_index_out_of_range_names_the_value);
  RUN(index_ops_reject_float_and_bool_indices);
  RUN(index_ops_reject_index_of_wrong_ndim);
  RUN(gather_and_scatter_add_reject_oversized_index_and_bad_src);
  RUN(index_ops_reject_axis_out_of_range);
  return ktest_done();
}
