/* test_create.c — creation (from_data, scalar, zeros, ones, full, arange),
 * inspection (shape, ndim, numel, dtype, device), host reads (item,
 * to_buffer), reference counting, runtime queries (version, threads, stats)
 * and kiln_print's PyTorch-style text. */
#include <pthread.h>
#include <stdint.h>

#include "ktest.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define V(...) ((const double[]){__VA_ARGS__})

/* evaluates expr once, checks dtype, shape and values (tolerance tol), releases it */
#define CHECK_MADE(expr, dt, nd, shape, expect, tol) \
  do {                                               \
    kiln_tensor *cm_ = (expr);                       \
    if (cm_) CHECK_EQ_INT(kiln_dtype_of(cm_), dt);   \
    CHECK_TENSOR(cm_, nd, shape, expect, tol);       \
    kiln_release(cm_);                               \
  } while (0)

static const kiln_dtype all_dtypes[] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64};

static size_t dtype_size(kiln_dtype dt) {
  return dt == KILN_BOOL ? 1 : (dt == KILN_I32 || dt == KILN_F32) ? 4 : 8;
}

/* what kiln_print wrote, as a malloc'd string */
static char *print_to_string(kiln_tensor *t) {
  FILE *f = tmpfile();
  if (!f) {
    KTEST_FAIL("tmpfile() failed");
    return NULL;
  }
  int rc = kiln_print(t, f);
  CHECK(rc >= 0);
  fflush(f);
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)(n > 0 ? n : 0) + 1);
  size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
  s[got] = '\0';
  fclose(f);
  return s;
}

/* kiln_print(t) writes exactly `expect`; releases t */
static void check_print(kiln_tensor *t, const char *expect) {
  CHECK(t != NULL);
  if (!t) return;
  char *s = print_to_string(t);
  if (s && strcmp(s, expect) != 0) KTEST_FAIL("printed\n%s\nexpected\n%s", s, expect);
  free(s);
  kiln_release(t);
}

/* ---------------------------------------------------------------- creation */

TEST(from_data_roundtrips_every_dtype_bit_exact) {
  const bool b[6] = {true, false, true, true, false, false};
  const int32_t i32[6] = {0, -1, 2147483647, -2147483647 - 1, 42, 7};
  const int64_t i64[6] = {0, -1, INT64_MAX, INT64_MIN, 5000000000LL, -5000000000LL};
  const float f32[6] = {0.0f, -0.0f, 1.5f, -3.25e-38f, 3.4e38f, 0.1f};
  const double f64[6] = {0.0, -2.5, 1e-300, 1e300, 0.1, -123456.789};
  const void *data[5] = {b, i32, i64, f32, f64};
  for (int k = 0; k < 5; k++) {
    kiln_dtype dt = all_dtypes[k];
    kiln_tensor *t = kiln_from_data(data[k], dt, 2, S(2, 3));
    CHECK(t != NULL);
    if (!t) continue;
    CHECK_EQ_INT(kiln_dtype_of(t), dt);
    CHECK_EQ_INT(kiln_ndim(t), 2);
    CHECK_EQ_INT(kiln_shape(t)[0], 2);
    CHECK_EQ_INT(kiln_shape(t)[1], 3);
    CHECK_EQ_INT(kiln_numel(t), 6);
    unsigned char out[48];
    memset(out, 0xAB, sizeof out);
    CHECK(kiln_to_buffer(t, out, 6 * dtype_size(dt)) >= 0);
    if (memcmp(out, data[k], 6 * dtype_size(dt)) != 0) KTEST_FAIL("dtype %d: bytes differ", k);
    kiln_release(t);
  }
}

TEST(from_data_copies_the_source) {
  float src[4] = {1, 2, 3, 4};
  kiln_tensor *t = kiln_from_data(src, KILN_F32, 1, S(4));
  src[0] = 100;
  src[3] = -100;
  CHECK_TENSOR(t, 1, S(4), V(1, 2, 3, 4), 0);
  kiln_release(t);
}

TEST(from_data_zero_d_with_null_shape) {
  double v = -7.25;
  kiln_tensor *t = kiln_from_data(&v, KILN_F64, 0, NULL);
  CHECK(t != NULL);
  if (t) {
    CHECK_EQ_INT(kiln_ndim(t), 0);
    CHECK_EQ_INT(kiln_numel(t), 1);
    CHECK_CLOSE(kiln_item(t), -7.25, 0);
  }
  kiln_release(t);
}

TEST(from_data_high_rank_and_empty) {
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t shape8[8] = {1, 2, 1, 2, 1, 2, 1, 1};
  kiln_tensor *t = kiln_from_data(v, KILN_F32, 8, shape8);
  CHECK_TENSOR(t, 8, shape8, V(1, 2, 3, 4, 5, 6, 7, 8), 0);
  kiln_release(t);
  kiln_tensor *e = kiln_from_data(v, KILN_F32, 2, S(3, 0));
  CHECK(e != NULL);
  if (e) {
    CHECK_EQ_INT(kiln_numel(e), 0);
    CHECK_EQ_INT(kiln_shape(e)[0], 3);
    CHECK_EQ_INT(kiln_shape(e)[1], 0);
  }
  kiln_release(e);
}

/* issue 13: bool data kept its raw bytes, so sum({0,1,2,255}) was 258, a
   cast gave 255, logical_not(2) was 3, and logical_and(2, 1) was 0
   interpreted and 1 compiled.  Bytes become 0/1 on entry. */
static const unsigned char raw_bool_bytes[8] = {0, 1, 2, 255, 128, 0, 7, 1};

TEST(from_data_bool_bytes_are_normalized_to_0_and_1) {
  kiln_tensor *b = kiln_from_data(raw_bool_bytes, KILN_BOOL, 1, S(8));
  unsigned char got[8];
  CHECK(kiln_to_buffer(b, got, sizeof got) == 0);
  const unsigned char want[8] = {0, 1, 1, 1, 1, 0, 1, 1};
  CHECK(memcmp(got, want, sizeof want) == 0);
  kiln_tensor *sum = kiln_sum(b, 0, NULL, false);
  CHECK_EQ_INT(kiln_item(sum), 6);
  CHECK_MADE(kiln_cast(b, KILN_I32), KILN_I32, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
  CHECK_MADE(kiln_cast(b, KILN_F64), KILN_F64, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
  CHECK_MADE(kiln_logical_not(b), KILN_BOOL, 1, S(8), V(1, 0, 0, 0, 0, 1, 0, 0), 0);
  kiln_tensor *ones = kiln_ones(KILN_BOOL, 1, S(8)), *zeros = kiln_zeros(KILN_BOOL, 1, S(8));
  CHECK_MADE(kiln_eq(b, ones), KILN_BOOL, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
  CHECK_MADE(kiln_logical_or(b, zeros), KILN_BOOL, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
  CHECK_MADE(kiln_mul(b, ones), KILN_BOOL, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
  kiln_tensor *mx = kiln_max(b, 0, NULL, false);
  CHECK_EQ_INT(kiln_item(mx), 1);
  kiln_tensor *s2 = kiln_from_data(raw_bool_bytes + 2, KILN_BOOL, 0, NULL); /* 0-d, byte 2 */
  CHECK_EQ_INT(kiln_item(s2), 1);
  /* host values become bools as != 0 (full, scalar, arange) */
  CHECK_MADE(kiln_full(255, KILN_BOOL, 1, S(2)), KILN_BOOL, 1, S(2), V(1, 1), 0);
  CHECK_MADE(kiln_scalar(-2, KILN_BOOL), KILN_BOOL, 0, S(0), V(1), 0);
  CHECK_MADE(kiln_arange(0, 3, 1, KILN_BOOL), KILN_BOOL, 1, S(3), V(0, 1, 1), 0);
  kiln_release(s2);
  kiln_release(mx);
  kiln_release(zeros);
  kiln_release(ones);
  kiln_release(sum);
  kiln_release(b);
}

/* the same trace on the interpreter and then compiled (KILN_HOT sightings,
   then kiln_jit_wait): logical_and(2, 1) is true both times */
TEST(bool_logic_on_nonzero_bytes_same_interpreted_and_compiled) {
  kiln_tensor *b = kiln_from_data(raw_bool_bytes, KILN_BOOL, 1, S(8));
  kiln_tensor *ones = kiln_ones(KILN_BOOL, 1, S(8));
  for (int rep = 0; rep < 4; rep++) {
    kiln_tensor *and_ = kiln_logical_and(b, ones), *not_ = kiln_logical_not(b);
    kiln_tensor *none = kiln_logical_and(and_, not_);
    kiln_tensor *both = kiln_logical_or(none, and_);
    kiln_tensor *n = kiln_sum(both, 0, NULL, false);
    kiln_release(none);
    kiln_release(not_);
    CHECK_MADE(and_, KILN_BOOL, 1, S(8), V(0, 1, 1, 1, 1, 0, 1, 1), 0);
    CHECK_EQ_INT(kiln_item(n), 6);
    kiln_release(n);
    kiln_release(both);
    kiln_jit_wait();
  }
  kiln_release(ones);
  kiln_release(b);
}

TEST(scalar_every_dtype) {
  const int64_t *one = S(0); /* unused for 0-d */
  kiln_tensor *t;
  t = kiln_scalar(2.5, KILN_F32);
  CHECK(t && kiln_ndim(t) == 0 && kiln_numel(t) == 1);
  CHECK_MADE(t, KILN_F32, 0, one, V(2.5), 0);
  CHECK_MADE(kiln_scalar(0.1, KILN_F64), KILN_F64, 0, one, V(0.1), 0);
  CHECK_MADE(kiln_scalar(0.1, KILN_F32), KILN_F32, 0, one, V((double)0.1f), 0);
  CHECK_MADE(kiln_scalar(-7, KILN_I32), KILN_I32, 0, one, V(-7), 0);
  CHECK_MADE(kiln_scalar(1099511627776.0, KILN_I64), KILN_I64, 0, one, V(1099511627776.0), 0);
  CHECK_MADE(kiln_scalar(2, KILN_BOOL), KILN_BOOL, 0, one, V(1), 0);
  CHECK_MADE(kiln_scalar(0, KILN_BOOL), KILN_BOOL, 0, one, V(0), 0);
}

TEST(scalar_to_integer_truncates_toward_zero) {
  const int64_t *one = S(0); /* unused for 0-d */
  CHECK_MADE(kiln_scalar(3.7, KILN_I32), KILN_I32, 0, one, V(3), 0);
  CHECK_MADE(kiln_scalar(-3.7, KILN_I64), KILN_I64, 0, one, V(-3), 0);
}

TEST(zeros_ones_full_every_dtype) {
  for (int k = 0; k < 5; k++) {
    kiln_dtype dt = all_dtypes[k];
    CHECK_MADE(kiln_zeros(dt, 2, S(2, 3)), dt, 2, S(2, 3), V(0, 0, 0, 0, 0, 0), 0);
    CHECK_MADE(kiln_ones(dt, 2, S(3, 2)), dt, 2, S(3, 2), V(1, 1, 1, 1, 1, 1), 0);
    double v = dt == KILN_BOOL ? 1 : 5;
    CHECK_MADE(kiln_full(5, dt, 1, S(3)), dt, 1, S(3), V(v, v, v), 0);
  }
}

TEST(full_converts_the_value_to_the_dtype) {
  CHECK_MADE(kiln_full(7.5, KILN_F32, 2, S(1, 2)), KILN_F32, 2, S(1, 2), V(7.5, 7.5), 0);
  CHECK_MADE(kiln_full(0.1, KILN_F64, 1, S(2)), KILN_F64, 1, S(2), V(0.1, 0.1), 0);
  CHECK_MADE(kiln_full(0.1, KILN_F32, 1, S(2)), KILN_F32, 1, S(2), V((double)0.1f, (double)0.1f),
             0);
  CHECK_MADE(kiln_full(-2, KILN_I32, 1, S(2)), KILN_I32, 1, S(2), V(-2, -2), 0);
  CHECK_MADE(kiln_full(-4e9, KILN_I64, 1, S(1)), KILN_I64, 1, S(1), V(-4e9), 0);
  CHECK_MADE(kiln_full(0.5, KILN_BOOL, 1, S(2)), KILN_BOOL, 1, S(2), V(1, 1), 0);
  CHECK_MADE(kiln_full(-INFINITY, KILN_F32, 1, S(2)), KILN_F32, 1, S(2), V(-INFINITY, -INFINITY),
             0);
  CHECK_MADE(kiln_full(NAN, KILN_F64, 1, S(1)), KILN_F64, 1, S(1), V(NAN), 0);
}

TEST(zeros_and_full_zero_d_and_empty) {
  const int64_t *one = S(0); /* unused for 0-d */
  CHECK_MADE(kiln_zeros(KILN_F32, 0, NULL), KILN_F32, 0, one, V(0), 0);
  CHECK_MADE(kiln_full(3, KILN_I64, 0, NULL), KILN_I64, 0, one, V(3), 0);
  kiln_tensor *e = kiln_ones(KILN_F64, 3, S(2, 0, 4));
  CHECK(e != NULL);
  if (e) {
    CHECK_EQ_INT(kiln_ndim(e), 3);
    CHECK_EQ_INT(kiln_numel(e), 0);
    CHECK_EQ_INT(kiln_shape(e)[2], 4);
  }
  kiln_release(e);
}

/* kiln_full_on: on the device asked for, whatever the default; a device
   that is not there (CUDA on this machine, unless emulated) is
   KILN_ERR_DEVICE, an invalid one KILN_ERR_ARG */
TEST(full_on_a_device) {
  CHECK_MADE(kiln_full_on(2.5, KILN_F32, 1, S(2), KILN_CPU), KILN_F32, 1, S(2), V(2.5, 2.5), 0);
  kiln_tensor *t = kiln_full_on(-INFINITY, KILN_F64, 0, NULL, KILN_CPU);
  CHECK(t && kiln_device_of(t) == KILN_CPU);
  kiln_release(t);
  CHECK(kiln_full_on(1, KILN_F32, 1, S(2), (kiln_device)7) == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_ARG);
  kiln_clear_error();
  t = kiln_full_on(1, KILN_F32, 1, S(2), KILN_CUDA);
  if (kiln_device_available(KILN_CUDA)) {
    CHECK(t && kiln_device_of(t) == KILN_CUDA);
  } else {
    CHECK(t == NULL);
    CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  }
  kiln_release(t);
  kiln_clear_error();
}

/* ------------------------------------------------------------------ arange */

TEST(arange_integer_steps) {
  CHECK_MADE(kiln_arange(0, 5, 1, KILN_F32), KILN_F32, 1, S(5), V(0, 1, 2, 3, 4), 0);
  CHECK_MADE(kiln_arange(2, 9, 3, KILN_F64), KILN_F64, 1, S(3), V(2, 5, 8), 0);
  CHECK_MADE(kiln_arange(-3, 3, 2, KILN_I32), KILN_I32, 1, S(3), V(-3, -1, 1), 0);
}

TEST(arange_negative_step) {
  CHECK_MADE(kiln_arange(5, 0, -1, KILN_I64), KILN_I64, 1, S(5), V(5, 4, 3, 2, 1), 0);
  CHECK_MADE(kiln_arange(10, -10, -7.5, KILN_F32), KILN_F32, 1, S(3), V(10, 2.5, -5), 0);
  CHECK_MADE(kiln_arange(1, -1, -0.5, KILN_F64), KILN_F64, 1, S(4), V(1, 0.5, 0, -0.5), 0);
}

TEST(arange_non_integer_step) {
  CHECK_MADE(kiln_arange(0, 1, 0.25, KILN_F32), KILN_F32, 1, S(4), V(0, 0.25, 0.5, 0.75), 0);
  CHECK_MADE(kiln_arange(1, 2.5, 0.5, KILN_F64), KILN_F64, 1, S(3), V(1, 1.5, 2), 0);
  /* length is ceil((stop - start) / step) */
  CHECK_MADE(kiln_arange(0, 1, 0.3, KILN_F64), KILN_F64, 1, S(4), V(0, 0.3, 0.6, 0.9), 1e-12);
  CHECK_MADE(kiln_arange(0, 1.01, 0.5, KILN_F32), KILN_F32, 1, S(3), V(0, 0.5, 1), 0);
}

TEST(arange_empty_range) {
  const int64_t *z = S(0);
  CHECK_MADE(kiln_arange(3, 3, 1, KILN_F32), KILN_F32, 1, z, V(0), 0);
  CHECK_MADE(kiln_arange(5, 0, 1, KILN_F32), KILN_F32, 1, z, V(0), 0);
  CHECK_MADE(kiln_arange(0, 5, -1, KILN_I64), KILN_I64, 1, z, V(0), 0);
}

TEST(arange_i64_dtype) {
  CHECK_MADE(kiln_arange(0, 10, 3, KILN_I64), KILN_I64, 1, S(4), V(0, 3, 6, 9), 0);
  CHECK_MADE(kiln_arange(4000000000.0, 4000000003.0, 1, KILN_I64), KILN_I64, 1, S(3),
             V(4000000000.0, 4000000001.0, 4000000002.0), 0);
}

/* past 2^53 an int64 arange of whole numbers is exact, as PyTorch's: the
   values were start + i * step in doubles, so 2^53 + 1 came out 2^53 (on
   the device too, KILN_DEVICE=cuda) */
TEST(arange_i64_is_exact_past_2_pow_53) {
  const int64_t base = (int64_t)1 << 53;
  kiln_tensor *up = kiln_arange(0x1p53, 0x1p53 + 8, 1, KILN_I64);
  kiln_tensor *down = kiln_arange(0x1p62, 0x1p62 - 3 * 1024, -3, KILN_I64);
  int64_t got[8], got_down[1024];
  CHECK(up && kiln_to_buffer(up, got, sizeof got) == KILN_OK);
  for (int i = 0; up && i < 8; i++) CHECK_EQ_INT(got[i], base + i);
  CHECK(down && kiln_numel(down) == 1024 &&
        kiln_to_buffer(down, got_down, sizeof got_down) == KILN_OK);
  for (int i = 0; down && i < 1024; i++) CHECK_EQ_INT(got_down[i], ((int64_t)1 << 62) - 3 * i);
  kiln_release(up);
  kiln_release(down);
  /* a fractional start still counts in doubles, truncated as before */
  CHECK_MADE(kiln_arange(0.5, 3, 1, KILN_I64), KILN_I64, 1, S(3), V(0, 1, 2), 0);
}

/* -------------------------------------------------------------- inspection */

TEST(inspection_reports_shape_ndim_numel_dtype_device) {
  kiln_tensor *t = kiln_zeros(KILN_I64, 3, S(2, 3, 4));
  CHECK(t != NULL);
  if (!t) return;
  CHECK_EQ_INT(kiln_ndim(t), 3);
  CHECK_EQ_INT(kiln_shape(t)[0], 2);
  CHECK_EQ_INT(kiln_shape(t)[1], 3);
  CHECK_EQ_INT(kiln_shape(t)[2], 4);
  CHECK_EQ_INT(kiln_numel(t), 24);
  CHECK_EQ_INT(kiln_dtype_of(t), KILN_I64);
  const char *dev = getenv("KILN_DEVICE");
  if (!dev || strcmp(dev, "cuda") != 0) CHECK_EQ_INT(kiln_device_of(t), KILN_CPU);
  kiln_tensor *s = kiln_scalar(1, KILN_BOOL);
  CHECK(s != NULL);
  if (s) {
    CHECK_EQ_INT(kiln_ndim(s), 0);
    CHECK_EQ_INT(kiln_numel(s), 1);
    CHECK_EQ_INT(kiln_dtype_of(s), KILN_BOOL);
  }
  kiln_release(s);
  kiln_release(t);
}

TEST(inspection_of_pending_result_does_not_flush) {
  kiln_tensor *a = kiln_ones(KILN_F32, 2, S(2, 3));
  kiln_tensor *b = kiln_full(2, KILN_F32, 1, S(3));
  CHECK(kiln_to_buffer(a, (float[6]){0}, 24) >= 0); /* inputs materialized */
  CHECK(kiln_to_buffer(b, (float[3]){0}, 12) >= 0);
  kiln_reset_stats();
  kiln_tensor *c = kiln_mul(a, b);
  CHECK(c != NULL);
  if (c) {
    CHECK_EQ_INT(kiln_ndim(c), 2);
    CHECK_EQ_INT(kiln_shape(c)[0], 2);
    CHECK_EQ_INT(kiln_shape(c)[1], 3);
    CHECK_EQ_INT(kiln_numel(c), 6);
    CHECK_EQ_INT(kiln_dtype_of(c), KILN_F32);
    kiln_stats st;
    kiln_get_stats(&st);
    CHECK_EQ_INT(st.flushes, 0);
    CHECK_TENSOR(c, 2, S(2, 3), V(2, 2, 2, 2, 2, 2), 0);
    kiln_get_stats(&st);
    CHECK(st.ops_recorded >= 1);
  }
  kiln_release(c);
  kiln_release(b);
  kiln_release(a);
}

/* ------------------------------------------------------------- host reads */

TEST(item_reads_one_element_tensors) {
  kiln_tensor *a = kiln_full(2.5, KILN_F32, 2, S(1, 1));
  CHECK_CLOSE(kiln_item(a), 2.5, 0);
  int64_t big = 9007199254740991LL; /* 2^53 - 1, exact in a double */
  kiln_tensor *b = kiln_from_data(&big, KILN_I64, 1, S(1));
  CHECK(kiln_item(b) == 9007199254740991.0);
  kiln_tensor *c = kiln_scalar(1, KILN_BOOL);
  CHECK_CLOSE(kiln_item(c), 1, 0);
  kiln_tensor *d = kiln_scalar(-3, KILN_I32);
  CHECK_CLOSE(kiln_item(d), -3, 0);
  kiln_tensor *s = kiln_add(a, a); /* pending: item forces evaluation */
  CHECK_CLOSE(kiln_item(s), 5, 0);
  CHECK_EQ_INT(kiln_last_status(), KILN_OK);
  kiln_release(s);
  kiln_release(d);
  kiln_release(c);
  kiln_release(b);
  kiln_release(a);
}

TEST(item_of_multi_element_tensor_is_nan_and_shape_error) {
  kiln_tensor *t = kiln_ones(KILN_F32, 1, S(2));
  kiln_clear_error();
  CHECK(isnan(kiln_item(t)));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_item");
  kiln_clear_error();
  kiln_tensor *e = kiln_zeros(KILN_F32, 1, S(0));
  CHECK(isnan(kiln_item(e)));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  kiln_clear_error();
  kiln_release(e);
  kiln_release(t);
}

TEST(to_buffer_exact_and_larger_buffers) {
  kiln_tensor *t = kiln_arange(0, 6, 1, KILN_F32);
  float exact[6] = {0};
  CHECK(kiln_to_buffer(t, exact, sizeof exact) >= 0);
  for (int i = 0; i < 6; i++) CHECK_CLOSE(exact[i], i, 0);
  float larger[10];
  for (int i = 0; i < 10; i++) larger[i] = -1;
  CHECK(kiln_to_buffer(t, larger, sizeof larger) >= 0);
  for (int i = 0; i < 6; i++) CHECK_CLOSE(larger[i], i, 0);
  kiln_tensor *b = kiln_from_data((const bool[]){true, false, true}, KILN_BOOL, 1, S(3));
  unsigned char bb[3] = {7, 7, 7};
  CHECK(kiln_to_buffer(b, bb, 3) >= 0);
  CHECK(bb[0] == 1 && bb[1] == 0 && bb[2] == 1);
  kiln_release(b);
  kiln_release(t);
}

TEST(to_buffer_too_small_is_an_arg_error) {
  kiln_tensor *t = kiln_ones(KILN_F64, 2, S(2, 3));
  double buf[6];
  kiln_clear_error();
  CHECK_EQ_INT(kiln_to_buffer(t, buf, sizeof buf - 1), KILN_ERR_ARG);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_to_buffer");
  kiln_clear_error();
  CHECK_EQ_INT(kiln_to_buffer(t, buf, 0), KILN_ERR_ARG);
  kiln_clear_error();
  kiln_release(t);
}

TEST(memory_in_use_counts_live_storages) {
  kiln_sync();
  size_t before = kiln_memory_in_use();
  float *src = calloc(1 << 20, sizeof *src); /* 4 MiB */
  kiln_tensor *t = kiln_from_data(src, KILN_F32, 1, S(1 << 20));
  free(src);
  CHECK(kiln_memory_in_use() >= before + (4u << 20));
  kiln_tensor *u = kiln_add_scalar(t, 1.0);
  CHECK(kiln_eval(1, &u) >= 0);
  CHECK(kiln_memory_in_use() >= before + (8u << 20));
  kiln_release(u);
  kiln_release(t);
  kiln_sync();
  CHECK(kiln_memory_in_use() < before + (1u << 20));
}

/* --------------------------------------------------------------- refcounts */

TEST(retain_returns_same_handle_and_keeps_it_alive) {
  kiln_tensor *t = kiln_arange(0, 3, 1, KILN_F32);
  kiln_tensor *r = kiln_retain(t);
  CHECK(r == t);
  kiln_retain(t);
  kiln_retain(t);
  kiln_release(t);
  kiln_release(t);
  kiln_release(t); /* three of four references dropped */
  CHECK_TENSOR(r, 1, S(3), V(0, 1, 2), 0);
  kiln_release(r);
}

TEST(results_and_views_keep_their_inputs_alive) {
  kiln_tensor *a = kiln_arange(0, 4, 1, KILN_F32);
  kiln_tensor *b = kiln_full(10, KILN_F32, 1, S(4));
  kiln_tensor *c = kiln_add(a, b); /* pending */
  kiln_tensor *v = kiln_slice(a, 0, 3, -100, -1);
  kiln_release(a);
  kiln_release(b);
  CHECK_TENSOR(c, 1, S(4), V(10, 11, 12, 13), 0);
  CHECK_TENSOR(v, 1, S(4), V(3, 2, 1, 0), 0);
  kiln_release(v);
  kiln_release(c);
}

TEST(release_null_is_a_no_op) {
  kiln_clear_error();
  kiln_release(NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_OK);
}

/* ----------------------------------------------------------------- runtime */

TEST(version_is_a_non_empty_string) {
  const char *v = kiln_version();
  CHECK(v != NULL);
  CHECK(v && strlen(v) > 0);
}

TEST(num_threads_is_positive_and_honours_env) {
  int n = kiln_num_threads();
  CHECK(n >= 1);
  const char *env = getenv("KILN_THREADS");
  if (env && atoi(env) > 0) CHECK_EQ_INT(n, atoi(env));
}

/* ops_recorded is posted per thread in batches (vm/state.h VM_OPS_POST):
   exact on the recording thread at every read, and another thread's ops
   count once it exits, flush or not */
static void *record_ops(void *arg) {
  kiln_tensor *x = kiln_ones(KILN_F32, 1, S(4));
  for (int k = 0; k < 9; k++) {
    kiln_tensor *y = kiln_add_scalar(x, 1);
    kiln_release(x);
    x = y;
  }
  *(kiln_tensor **)arg = x; /* pending: never flushed on this thread */
  return NULL;
}

TEST(ops_recorded_is_exact_per_thread_and_counts_exited_threads) {
  kiln_reset_stats();
  kiln_tensor *x = kiln_ones(KILN_F32, 1, S(4));
  double before = kiln_stat("ops_recorded");
  for (int k = 0; k < 300; k++) { /* past one post */
    kiln_tensor *y = kiln_mul_scalar(x, 1);
    kiln_release(x);
    x = y;
  }
  kiln_stats st;
  kiln_get_stats(&st);
  CHECK_EQ_INT((long long)st.ops_recorded - (long long)before,
               600); /* each op: the scalar and the mul */
  CHECK_EQ_INT(kiln_stat("ops_recorded") - before, 600);
  pthread_t th;
  kiln_tensor *other = NULL;
  before = kiln_stat("ops_recorded");
  CHECK_EQ_INT(pthread_create(&th, NULL, record_ops, &other), 0);
  pthread_join(th, NULL);
  CHECK_EQ_INT(kiln_stat("ops_recorded") - before, 1 + 9 * 2); /* ones, then 9 scalars and adds */
  CHECK_TENSOR(other, 1, S(4), V(10, 10, 10, 10), 0);
  kiln_release(other);
  kiln_release(x);
}

TEST(stats_reset_zeroes_counters_and_ops_are_counted) {
  kiln_reset_stats();
  kiln_stats st;
  memset(&st, 0xFF, sizeof st);
  kiln_get_stats(&st);
  CHECK_EQ_INT(st.ops_recorded, 0);
  CHECK_EQ_INT(st.flushes, 0);
  CHECK_EQ_INT(st.traces_seen, 0);
  CHECK_EQ_INT(st.cache_hits, 0);
  CHECK_EQ_INT(st.cache_misses, 0);
  CHECK_EQ_INT(st.kernels_launched, 0);
  kiln_tensor *a = kiln_ones(KILN_F32, 1, S(8));
  kiln_tensor *b = kiln_mul_scalar(a, 3);
  CHECK_TENSOR(b, 1, S(8), V(3, 3, 3, 3, 3, 3, 3, 3), 0);
  kiln_get_stats(&st);
  CHECK(st.ops_recorded >= 1);
  kiln_reset_stats();
  kiln_get_stats(&st);
  CHECK_EQ_INT(st.ops_recorded, 0);
  CHECK_EQ_INT(st.flushes, 0);
  kiln_release(b);
  kiln_release(a);
}

/* ------------------------------------------------------------------- print */

TEST(print_f32_matrix) {
  check_print(kiln_from_data((const float[]){1, 2, 3, 4}, KILN_F32, 2, S(2, 2)),
              "tensor([[1., 2.],\n        [3., 4.]])\n");
}

TEST(print_i32_vector_names_dtype) {
  check_print(kiln_from_data((const int32_t[]){1, 2, 3}, KILN_I32, 1, S(3)),
              "tensor([1, 2, 3], dtype=int32)\n");
}

TEST(print_i64_vector_has_no_dtype) {
  check_print(kiln_from_data((const int64_t[]){1, 2, 3}, KILN_I64, 1, S(3)), "tensor([1, 2, 3])\n");
}

TEST(print_bool_vector) {
  check_print(kiln_from_data((const bool[]){true, false}, KILN_BOOL, 1, S(2)),
              "tensor([ True, False])\n");
}

TEST(print_zero_d) {
  check_print(kiln_scalar(3.5, KILN_F32), "tensor(3.5000)\n");
  check_print(kiln_scalar(7, KILN_I64), "tensor(7)\n");
}

TEST(print_f32_fractions_use_four_decimals) {
  check_print(kiln_from_data((const float[]){1.5f, 2.25f}, KILN_F32, 1, S(2)),
              "tensor([1.5000, 2.2500])\n");
}

TEST(print_negative_values_align) {
  check_print(kiln_from_data((const float[]){-1, 2}, KILN_F32, 1, S(2)), "tensor([-1.,  2.])\n");
}

TEST(print_3d_separates_blocks_with_blank_line) {
  kiln_tensor *a = kiln_arange(0, 8, 1, KILN_F32);
  kiln_tensor *c = a ? kiln_reshape(a, 3, S(2, 2, 2)) : NULL;
  check_print(c,
              "tensor([[[0., 1.],\n"
              "         [2., 3.]],\n"
              "\n"
              "        [[4., 5.],\n"
              "         [6., 7.]]])\n");
  kiln_release(a);
}

TEST(print_f64_names_dtype) {
  kiln_tensor *t = kiln_from_data((const double[]){1, 2}, KILN_F64, 1, S(2));
  char *s = t ? print_to_string(t) : NULL;
  CHECK(s != NULL);
  if (s) {
    CHECK(strncmp(s, "tensor([1., 2.], dtype=", 23) == 0);
    CHECK_STR_CONTAINS(s, "float64)\n");
  }
  free(s);
  kiln_release(t);
}

TEST(print_long_vector_is_elided) {
  kiln_tensor *t = kiln_arange(0, 2000, 1, KILN_I64);
  check_print(t, "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])\n");
  kiln_tensor *f = kiln_arange(0, 2000, 1, KILN_F32);
  char *s = f ? print_to_string(f) : NULL;
  CHECK(s != NULL);
  if (s) {
    CHECK(strncmp(s, "tensor([", 8) == 0);
    CHECK_STR_CONTAINS(s, "...");
    CHECK(strlen(s) < 300);
    CHECK(strlen(s) >= 3 && strcmp(s + strlen(s) - 3, "])\n") == 0);
  }
  free(s);
  kiln_release(f);
}

TEST(print_large_matrix_elides_rows_and_columns) {
  kiln_tensor *a = kiln_arange(0, 2500, 1, KILN_I64);
  kiln_tensor *m = a ? kiln_reshape(a, 2, S(50, 50)) : NULL;
  check_print(m,
              "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
              "        [  50,   51,   52,  ...,   97,   98,   99],\n"
              "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
              "        ...,\n"
              "        [2350, 2351, 2352,  ..., 2397, 2398, 2399],\n"
              "        [2400, 2401, 2402,  ..., 2447, 2448, 2449],\n"
              "        [2450, 2451, 2452,  ..., 2497, 2498, 2499]])\n");
  kiln_release(a);
}

int main(void) {
  RUN(from_data_roundtrips_every_dtype_bit_exact);
  RUN(from_data_copies_the_source);
  RUN(from_data_zero_d_with_null_shape);
  RUN(from_data_high_rank_and_empty);
  RUN(from_data_bool_bytes_are_normalized_to_0_and_1);
  RUN(bool_logic_on_nonzero_bytes_same_interpreted_and_compiled);
  RUN(scalar_every_dtype);
  RUN(scalar_to_integer_truncates_toward_zero);
  RUN(zeros_ones_full_every_dtype);
  RUN(full_converts_the_value_to_the_dtype);
  RUN(zeros_and_full_zero_d_and_empty);
  RUN(full_on_a_device);
  RUN(arange_integer_steps);
  RUN(arange_negative_step);
  RUN(arange_non_integer_step);
  RUN(arange_empty_range);
  RUN(arange_i64_dtype);
  RUN(arange_i64_is_exact_past_2_pow_53);
  RUN(inspection_reports_shape_ndim_numel_dtype_device);
  RUN(inspection_of_pending_result_does_not_flush);
  RUN(item_reads_one_element_tensors);
  RUN(item_of_multi_element_tensor_is_nan_and_shape_error);
  RUN(to_buffer_exact_and_larger_buffers);
  RUN(to_buffer_too_small_is_an_arg_error);
  RUN(memory_in_use_counts_live_storages);
  RUN(retain_returns_same_handle_and_keeps_it_alive);
  RUN(results_and_views_keep_their_inputs_alive);
  RUN(release_null_is_a_no_op);
  RUN(version_is_a_non_empty_string);
  RUN(num_threads_is_positive_and_honours_env);
  RUN(ops_recorded_is_exact_per_thread_and_counts_exited_threads);
  RUN(stats_reset_zeroes_counters_and_ops_are_counted);
  RUN(print_f32_matrix);
  RUN(print_i32_vector_names_dtype);
  RUN(print_i64_vector_has_no_dtype);
  RUN(print_bool_vector);
  RUN(print_zero_d);
  RUN(print_f32_fractions_use_four_decimals);
  RUN(print_negative_values_align);
  RUN(print_3d_separates_blocks_with_blank_line);
  RUN(print_f64_names_dtype);
  RUN(print_long_vector_is_elided);
  RUN(print_large_matrix_elides_rows_and_columns);
  return ktest_done();
}
