/* test_jit_reduce.c — compiled reduce kernels (jit_cpu/kernel.c) against
 * values computed here in double / exact integers: sum, prod, max and min
 * with an elementwise producer fused in, every dtype a kernel folds, rows
 * short and long, so that the lane loop, its tail, the block fold and the
 * split of long rows into chunks (folded by the caller) all run.  Every
 * program runs twice (KILN_HOT=1 plans it on first sight; the second run
 * hits the cached plan) and must have launched compiled kernels.  NaN must
 * win in max/min wherever it sits, and long reductions (chunked rows,
 * many-block columns, max/min of signed zeros, logsumexp) must print the
 * same bits compiled on 1, 2 and 4 threads and on the interpreter
 * (KILN_JIT=0), children each.
 * Column reductions (kept axes on both sides: sum over axis 0) likewise.
 * Row kernels (softmax, layer_norm: reductions, their epilogues and the
 * elementwise tail fused per row) match double-precision references and
 * run as one kernel (beside the constants').  A chain of 100 host scalars
 * compiles whole. */
#include <stdint.h>
#include <unistd.h>

#include "ktest.h"

typedef enum { R_SUM, R_PROD, R_MAX, R_MIN } rop;
static const char *const rop_name[] = {"sum", "prod", "max", "min"};

static kiln_tensor *reduce(rop op, kiln_tensor *t, int naxes, const int *axes) {
  switch (op) {
    case R_SUM:
      return kiln_sum(t, naxes, axes, false);
    case R_PROD:
      return kiln_prod(t, naxes, axes, false);
    case R_MAX:
      return kiln_max(t, naxes, axes, false);
    default:
      return kiln_min(t, naxes, axes, false);
  }
}

/* the producer fused into the kernel: x * x + x (prod, floats only:
   x * 1e-9 + 1.0001, which keeps long products finite) */
static double produce(rop op, double x) { return op == R_PROD ? x * 1e-9 + 1.0001 : x * x + x; }

static kiln_tensor *produce_t(rop op, kiln_tensor *x) {
  kiln_tensor *a = op == R_PROD ? kiln_mul_scalar(x, 1e-9) : kiln_mul(x, x);
  kiln_tensor *b = op == R_PROD ? kiln_add_scalar(a, 1.0001) : kiln_add(a, x);
  kiln_release(a);
  return b;
}

static void fill(kiln_dtype dt, void *buf, int64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    int v = (int)(s % 2001) - 1000; /* small integers: exact in every dtype */
    switch (dt) {
      case KILN_F32:
        ((float *)buf)[i] = (float)v / 64;
        break;
      case KILN_F64:
        ((double *)buf)[i] = (double)v / 64;
        break;
      case KILN_I32:
        ((int32_t *)buf)[i] = v;
        break;
      default:
        ((int64_t *)buf)[i] = v;
        break;
    }
  }
}

static double at(kiln_dtype dt, const void *buf, int64_t i) {
  switch (dt) {
    case KILN_F32:
      return ((const float *)buf)[i];
    case KILN_F64:
      return ((const double *)buf)[i];
    case KILN_I32:
      return ((const int32_t *)buf)[i];
    default:
      return (double)((const int64_t *)buf)[i];
  }
}

static const char *dt_name(kiln_dtype dt) {
  return dt == KILN_F32 ? "f32" : dt == KILN_F64 ? "f64" : dt == KILN_I32 ? "i32" : "i64";
}

static size_t dsize(kiln_dtype dt) { return dt == KILN_F64 || dt == KILN_I64 ? 8 : 4; }

/* the reduction, in double (a long double sum), of the producer over
   count values of buf from index base, stride apart; the producer rounds
   as the kernel's f32 arithmetic does; NaN if any value is NaN */
static double reference(rop op, kiln_dtype dt, const void *buf, int64_t base, int64_t stride,
                        int64_t count) {
  double want = op == R_PROD ? 1 : op == R_SUM ? 0 : NAN;
  long double lsum = 0;
  bool nan = false;
  for (int64_t k = 0; k < count; k++) {
    double x = at(dt, buf, base + k * stride), v = produce(op, x);
    if (dt == KILN_F32) /* the producer runs in f32 */
      v = op == R_PROD ? (double)((float)(x * (float)1e-9) + (float)1.0001)
                       : (double)((float)(x * x) + (float)x);
    if (v != v) nan = true;
    if (op == R_SUM)
      lsum += v;
    else if (op == R_PROD)
      want *= v;
    else if (k == 0 || (op == R_MAX ? v > want : v < want))
      want = v;
  }
  if (op == R_SUM) want = (double)lsum;
  return nan ? NAN : want;
}

/* got within the tolerance of want: relative 1e-6 (f32) / 1e-13 (f64),
   widened for products by their rounding per step; integers exact */
static bool close_to(double got, double want, rop op, kiln_dtype dt, int64_t count) {
  double tol = dt == KILN_F32 ? 1e-6 : dt == KILN_F64 ? 1e-13 : 0;
  if (op == R_PROD) tol *= 1 + 1e-3 * (double)count;
  return (isnan(got) && isnan(want)) || fabs(got - want) <= tol * fmax(1, fabs(want));
}

/* one case: x of shape (rows, count) (or (rows, a, count / a) reduced over
   the last two axes), reduced over the trailing axes after the producer */
static void check_case(rop op, kiln_dtype dt, int64_t rows, int64_t count, bool three_d,
                       int nan_at) {
  if (op == R_PROD && !(dt == KILN_F32 || dt == KILN_F64)) return;
  int64_t n = rows * count;
  void *buf = malloc((size_t)n * dsize(dt));
  fill(dt, buf, n, (uint64_t)(rows * 31 + count + op));
  if (nan_at >= 0 && nan_at < n) {
    if (dt == KILN_F32) ((float *)buf)[nan_at] = NAN;
    if (dt == KILN_F64) ((double *)buf)[nan_at] = NAN;
  }
  int64_t shape3[3] = {rows, 2, count / 2}, shape2[2] = {rows, count};
  bool use3 = three_d && count % 2 == 0;
  int axes3[2] = {1, 2}, axes2[1] = {1};
  kiln_tensor *x = kiln_from_data(buf, dt, use3 ? 3 : 2, use3 ? shape3 : shape2);
  for (int rep = 0; rep < 2; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *p = produce_t(op, x);
    kiln_tensor *r = reduce(op, p, use3 ? 2 : 1, use3 ? axes3 : axes2);
    kiln_release(p);
    kiln_dtype odt = kiln_dtype_of(r);
    void *got = malloc((size_t)rows * dsize(odt));
    CHECK(kiln_to_buffer(r, got, (size_t)rows * dsize(odt)) == 0);
    kiln_get_stats(&after);
    /* compiled: the producers and the reduction ran in one kernel (and the
       scalars, if any, in another), nothing on the interpreter (eager_ops
       counts interpreter ops) */
    if (after.eager_ops != before.eager_ops || after.kernels_launched > before.kernels_launched + 2)
      KTEST_FAIL("%s %s rows=%lld count=%lld: %llu interpreter ops, %llu launches (want 0, <= 2)",
                 rop_name[op], dt_name(dt), (long long)rows, (long long)count,
                 (unsigned long long)(after.eager_ops - before.eager_ops),
                 (unsigned long long)(after.kernels_launched - before.kernels_launched));
    for (int64_t o = 0; o < rows; o++) {
      double want = reference(op, dt, buf, o * count, 1, count), g = at(odt, got, o);
      if (!close_to(g, want, op, dt, count)) {
        KTEST_FAIL("%s %s rows=%lld count=%lld%s row %lld: %.17g, want %.17g", rop_name[op],
                   dt_name(dt), (long long)rows, (long long)count, use3 ? " (3-d)" : "",
                   (long long)o, g, want);
        break;
      }
    }
    free(got);
    kiln_release(r);
  }
  kiln_release(x);
  free(buf);
}

TEST(reductions_match_reference) {
  const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
  /* rows x count: tails only, lane steps + tail, several blocks, split rows */
  const int64_t shapes[][2] = {{7, 5},      {33, 100},  {4, 4096 * 3 + 17},
                               {1, 200003}, {3, 70000}, {2, 1 << 17}};
  for (int op = 0; op < 4; op++)
    for (int d = 0; d < 4; d++)
      for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        check_case((rop)op, dts[d], shapes[s][0], shapes[s][1], s % 2 == 1, -1);
}

/* x of shape (outer, count, inner) (2-d (count, inner) when outer is 1)
   reduced over the middle axis: column reductions */
static void check_cols(rop op, kiln_dtype dt, int64_t outer, int64_t count, int64_t inner,
                       int64_t nan_at) {
  if (op == R_PROD && !(dt == KILN_F32 || dt == KILN_F64)) return;
  int64_t n = outer * count * inner;
  void *buf = malloc((size_t)n * dsize(dt));
  fill(dt, buf, n, (uint64_t)(outer * 7 + count * 3 + inner + op));
  if (nan_at >= 0 && nan_at < n) {
    if (dt == KILN_F32) ((float *)buf)[nan_at] = NAN;
    if (dt == KILN_F64) ((double *)buf)[nan_at] = NAN;
  }
  int64_t shape3[3] = {outer, count, inner}, shape2[2] = {count, inner};
  int axis = outer == 1 ? 0 : 1;
  kiln_tensor *x = kiln_from_data(buf, dt, outer == 1 ? 2 : 3, outer == 1 ? shape2 : shape3);
  for (int rep = 0; rep < 2; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *p = produce_t(op, x), *r = reduce(op, p, 1, &axis);
    kiln_release(p);
    kiln_dtype odt = kiln_dtype_of(r);
    void *got = malloc((size_t)(outer * inner) * dsize(odt));
    CHECK(kiln_to_buffer(r, got, (size_t)(outer * inner) * dsize(odt)) == 0);
    kiln_get_stats(&after);
    if (after.eager_ops != before.eager_ops || after.kernels_launched > before.kernels_launched + 2)
      KTEST_FAIL("cols %s %s %lldx%lldx%lld: %llu interpreter ops, %llu launches (want 0, <= 2)",
                 rop_name[op], dt_name(dt), (long long)outer, (long long)count, (long long)inner,
                 (unsigned long long)(after.eager_ops - before.eager_ops),
                 (unsigned long long)(after.kernels_launched - before.kernels_launched));
    for (int64_t o = 0; o < outer; o++)
      for (int64_t b = 0; b < inner; b++) {
        double want = reference(op, dt, buf, o * count * inner + b, inner, count),
               g = at(odt, got, o * inner + b);
        if (!close_to(g, want, op, dt, count)) {
          KTEST_FAIL("cols %s %s %lldx%lldx%lld at (%lld, %lld): %.17g, want %.17g", rop_name[op],
                     dt_name(dt), (long long)outer, (long long)count, (long long)inner,
                     (long long)o, (long long)b, g, want);
          o = outer;
          break;
        }
      }
    free(got);
    kiln_release(r);
  }
  kiln_release(x);
  free(buf);
}

TEST(column_reductions_match_reference) {
  const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
  /* outer x count x inner: partial column blocks, several reduced blocks, an outer axis */
  const int64_t shapes[][3] = {{1, 1000, 300}, {1, 9000, 7}, {4, 300, 70}, {3, 5, 600}};
  for (int op = 0; op < 4; op++)
    for (int d = 0; d < 4; d++)
      for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        check_cols((rop)op, dts[d], shapes[s][0], shapes[s][1], shapes[s][2], -1);
  for (int op = R_SUM; op <= R_MIN; op++) {
    check_cols((rop)op, KILN_F32, 1, 1000, 300,
               999 * 300 + 299); /* NaN in the last row, last column */
    check_cols((rop)op, KILN_F64, 4, 300, 70, 70 * 150 + 3);
  }
}

TEST(nan_wins_everywhere) {
  /* NaN in the lane loop, in a tail, in a later chunk of a split row */
  const int nan_at[] = {3, 64 * 5 + 1, 200003 - 2, 150000};
  for (int op = R_SUM; op <= R_MIN; op++)
    for (size_t i = 0; i < sizeof nan_at / sizeof *nan_at; i++) {
      check_case((rop)op, KILN_F32, 1, 200003, false, nan_at[i]);
      check_case((rop)op, KILN_F64, 1, 200003, false, nan_at[i]);
    }
}

/* softmax and layer_norm over the last axis become one row kernel (which
   takes the plan's constants as values); their values match the math done here in double, also when
   an intermediate (the row max, the centred input) is read after the run */
static void softmax_case(int64_t rows, int64_t cols, bool keep_max) {
  int64_t shape[2] = {rows, cols}, n = rows * cols;
  float *x = malloc((size_t)n * sizeof *x), *got = malloc((size_t)n * sizeof *got), mx[64];
  fill(KILN_F32, x, n, (uint64_t)(rows + cols));
  kiln_tensor *t = kiln_from_data(x, KILN_F32, 2, shape);
  int axis1[1] = {1};
  for (int rep = 0; rep < 3; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *y = kiln_softmax(t, 1), *m = keep_max ? kiln_max(t, 1, axis1, true) : NULL;
    CHECK(kiln_to_buffer(y, got, (size_t)n * sizeof *got) == 0);
    if (m) CHECK(kiln_to_buffer(m, mx, (size_t)rows * sizeof *mx) == 0);
    kiln_get_stats(&after);
    if (rep > 0 && !keep_max) { /* one row kernel, taking the constant 1 (of 1 / sum) as a value; no
                                   interpreter */
      CHECK_EQ_INT(after.kernels_launched - before.kernels_launched, 1);
      CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0);
    }
    for (int64_t o = 0; o < rows; o++) {
      double hi = -INFINITY, s = 0;
      for (int64_t k = 0; k < cols; k++) hi = fmax(hi, x[o * cols + k]);
      for (int64_t k = 0; k < cols; k++) s += exp((double)x[o * cols + k] - hi);
      for (int64_t k = 0; k < cols; k++)
        CHECK_CLOSE(got[o * cols + k], exp((double)x[o * cols + k] - hi) / s, 1e-6);
      if (m) CHECK_CLOSE(mx[o], hi, 0);
    }
    kiln_release(y);
    kiln_release(m);
  }
  kiln_release(t);
  free(x);
  free(got);
}

TEST(row_kernels_softmax) {
  softmax_case(64, 1000, false);
  softmax_case(5, 3, false);
  softmax_case(37, 4096 + 33, true);
  softmax_case(3, 70001, true); /* rows too long for a row kernel: group by group */
}

/* a kept value (x / 3, a division both the max and the exp pass need)
   feeding another (the exp): the second one's map loop loads the first
   (a plan once failed to compile here, found by the fuzzer) */
TEST(row_kernels_kept_values_chain) {
  int64_t rows = 17, cols = 300, shape[2] = {rows, cols}, n = rows * cols;
  float *x = malloc((size_t)n * sizeof *x), *got = malloc((size_t)n * sizeof *got);
  fill(KILN_F32, x, n, 21);
  kiln_tensor *t = kiln_from_data(x, KILN_F32, 2, shape);
  for (int rep = 0; rep < 3; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *d = kiln_div_scalar(t, 3), *y = kiln_softmax(d, 1);
    CHECK(kiln_to_buffer(y, got, (size_t)n * sizeof *got) == 0);
    kiln_get_stats(&after);
    if (rep > 0) CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0); /* compiled, all of it */
    CHECK_EQ_INT(after.compile_failures, 0);
    for (int64_t o = 0; o < rows; o++) {
      double hi = -INFINITY, sum = 0;
      for (int64_t k = 0; k < cols; k++) hi = fmax(hi, (double)(x[o * cols + k] / 3.0f));
      for (int64_t k = 0; k < cols; k++) sum += exp((double)(x[o * cols + k] / 3.0f) - hi);
      for (int64_t k = 0; k < cols; k++)
        CHECK_CLOSE(got[o * cols + k], exp((double)(x[o * cols + k] / 3.0f) - hi) / sum, 1e-6);
    }
    kiln_release(d);
    kiln_release(y);
  }
  kiln_release(t);
  free(x);
  free(got);
}

/* sum over every axis (and a column sum) of x + bias: the bias has no
   single stride along the reduced run (strides 0, 1), so the kernel reads a
   contiguous copy of it instead of leaving the group to the interpreter
   (it ran on the interpreter before: sum(gelu(x + b)) was slower compiled);
   equal bit for bit to KILN_JIT=0 */
TEST(reduction_over_a_broadcast_input_runs_compiled) {
  int64_t rows = 300, cols = 257, n = rows * cols;
  float *x = malloc((size_t)n * sizeof *x), bias[257];
  fill(KILN_F32, x, n, 31);
  fill(KILN_F32, bias, cols, 32);
  kiln_tensor *t = kiln_from_data(x, KILN_F32, 2, (int64_t[]){rows, cols});
  kiln_tensor *b = kiln_from_data(bias, KILN_F32, 1, (int64_t[]){cols});
  float got[3][2];
  for (int rep = 0; rep < 3; rep++) {
    if (rep == 2) setenv("KILN_JIT", "0", 1); /* the reference */
    for (int which = 0; which < 2; which++) { /* over every axis; over axis 0 (columns) */
      kiln_stats before, after;
      kiln_get_stats(&before);
      kiln_tensor *xb = kiln_add(t, b), *e = kiln_tanh(xb);
      kiln_tensor *r = which ? kiln_sum(e, 1, (int[]){0}, false) : kiln_sum(e, 0, NULL, false);
      float all[257];
      CHECK(kiln_to_buffer(r, all, (size_t)(which ? cols : 1) * sizeof(float)) == 0);
      got[rep][which] = all[which ? 5 : 0];
      kiln_get_stats(&after);
      /* compiled: at most the bias's contiguous copy runs outside the kernel
         (before, the whole group ran on the interpreter: 3 ops) */
      if (rep == 1 && after.eager_ops - before.eager_ops > 1)
        KTEST_FAIL("sum %d: %llu ops on the interpreter", which,
                   (unsigned long long)(after.eager_ops - before.eager_ops));
      kiln_release(xb);
      kiln_release(e);
      kiln_release(r);
    }
  }
  unsetenv("KILN_JIT");
  CHECK(!memcmp(got[1], got[2], sizeof got[1])); /* compiled == interpreter, bit for bit */
  double ref = 0;
  for (int64_t i = 0; i < n; i++) ref += tanh((double)(x[i] + bias[i % cols]));
  CHECK_CLOSE(got[1][0], ref, 1e-4);
  kiln_release(t);
  kiln_release(b);
  free(x);
}

TEST(row_kernels_layer_norm) {
  int64_t rows = 48, cols = 777, shape[2] = {rows, cols}, n = rows * cols;
  float *x = malloc((size_t)n * sizeof *x), *got = malloc((size_t)n * sizeof *got), w[777], b[777];
  fill(KILN_F32, x, n, 11);
  fill(KILN_F32, w, cols, 12);
  fill(KILN_F32, b, cols, 13);
  kiln_tensor *t = kiln_from_data(x, KILN_F32, 2, shape),
              *wt = kiln_from_data(w, KILN_F32, 1, &cols),
              *bt = kiln_from_data(b, KILN_F32, 1, &cols);
  for (int rep = 0; rep < 3; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *y = kiln_layer_norm(t, wt, bt, 1e-5);
    CHECK(kiln_to_buffer(y, got, (size_t)n * sizeof *got) == 0);
    kiln_get_stats(&after);
    /* the three constants' group, then the row kernel */
    if (rep > 0) CHECK(after.kernels_launched - before.kernels_launched <= 2);
    for (int64_t o = 0; o < rows; o++) {
      double mean = 0, var = 0;
      for (int64_t k = 0; k < cols; k++) mean += x[o * cols + k];
      mean /= (double)cols;
      for (int64_t k = 0; k < cols; k++) var += (x[o * cols + k] - mean) * (x[o * cols + k] - mean);
      var /= (double)cols;
      for (int64_t k = 0; k < cols; k++)
        CHECK_CLOSE(got[o * cols + k], (x[o * cols + k] - mean) / sqrt(var + 1e-5) * w[k] + b[k],
                    2e-5);
    }
    kiln_release(y);
  }
  kiln_release(t);
  kiln_release(wt);
  kiln_release(bt);
  free(x);
  free(got);
}

/* a chain of 100 scalar ops (W5's shape): 100 host scalars, each a
   runtime parameter and a 0-d buffer of the plan's constants group, all
   compiled (there was a limit of 32 buffers per kernel, and such plans ran
   on the interpreter) */
TEST(many_host_scalars_compile) {
  int64_t n = 16;
  kiln_tensor *x = kiln_arange(0, (double)n, 1, KILN_F32);
  CHECK(kiln_sync() == 0);
  for (int rep = 0; rep < 3; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    kiln_tensor *y = kiln_retain(x);
    double want[16];
    for (int64_t i = 0; i < n; i++) want[i] = (float)i;
    for (int k = 0; k < 100; k++) {
      double c = 1.0 + 0.001 * (k + rep);
      kiln_tensor *z = k % 2 ? kiln_mul_scalar(y, c) : kiln_add_scalar(y, c);
      for (int64_t i = 0; i < n; i++)
        want[i] = k % 2 ? (float)(want[i] * (float)c) : (float)(want[i] + (float)c);
      kiln_release(y);
      y = z;
    }
    float got[16];
    CHECK(kiln_to_buffer(y, got, sizeof got) == 0);
    kiln_get_stats(&after);
    if (rep > 0) CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0);
    for (int64_t i = 0; i < n; i++) CHECK_CLOSE(got[i], want[i], 1e-6);
    kiln_release(y);
  }
  kiln_release(x);
}

static char self[4096];

/* child: the bits of long reductions (chunked rows: the chunks joined by
   vm_fold_partials; columns over many blocks; f32 and f64; signed zeros) */
static void print_bits(kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  double *v = malloc((size_t)n * sizeof *v);
  kiln_tensor *d = kiln_cast(t, KILN_F64);
  kiln_to_buffer(d, v, (size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) printf("%a ", v[i]);
  printf("\n");
  kiln_release(d);
  free(v);
}

static int work(void) {
  int64_t n = 3000001;
  kiln_manual_seed(5);
  kiln_tensor *x = kiln_randn(KILN_F32, 1, &n);
  for (int rep = 0; rep < 2; rep++) {
    kiln_tensor *s = kiln_mul(x, x), *t = kiln_sum(s, 0, NULL, false);
    print_bits(t);
    kiln_release(s);
    kiln_release(t);
  }
  int64_t shape[2] = {3, 1000000}, cshape[2] = {70001, 7};
  kiln_tensor *xr = kiln_slice(x, 0, 0, 3000000, 1), *xc = kiln_slice(x, 0, 0, 490007, 1);
  kiln_tensor *rows = kiln_reshape(xr, 2, shape), *cols = kiln_reshape(xc, 2, cshape);
  kiln_release(xr);
  kiln_release(xc);
  kiln_tensor *rows64 = kiln_cast(rows, KILN_F64), *neg = kiln_neg(rows);
  kiln_tensor *zero = kiln_mul_scalar(rows, 0.0); /* zeros of both signs */
  int last = 1, first = 0;
  kiln_tensor *r[] = {kiln_sum(rows, 1, &last, false),  kiln_sum(rows64, 1, &last, false),
                      kiln_mean(rows, 1, &last, false), kiln_max(rows, 1, &last, false),
                      kiln_min(neg, 1, &last, false),   kiln_max(zero, 1, &last, false),
                      kiln_min(zero, 1, &last, false),  kiln_sum(cols, 1, &first, false),
                      kiln_max(zero, 0, NULL, false),   kiln_min(zero, 0, NULL, false),
                      kiln_logsumexp(rows, 1, false)};
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    print_bits(r[i]);
    kiln_release(r[i]);
  }
  kiln_release(rows);
  kiln_release(cols);
  kiln_release(rows64);
  kiln_release(neg);
  kiln_release(zero);
  kiln_release(x);
  return 0;
}

static char *child_out(const char *threads, const char *jit) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "env KILN_THREADS=%s KILN_JIT=%s KILN_HOT=1 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work",
           threads, jit, self);
  FILE *p = popen(cmd, "r");
  size_t len = 0, cap = 1 << 20;
  char *out = calloc(cap, 1);
  if (p) {
    size_t got;
    while ((got = fread(out + len, 1, cap - 1 - len, p)) > 0) len += got;
    pclose(p);
  }
  return out;
}

/* bit for bit: 1, 2 and 4 threads, compiled, and the interpreter */
TEST(long_rows_independent_of_threads_and_jit) {
  char *ref = child_out("2", "0"), *one = child_out("1", "1"), *two = child_out("2", "1"),
       *four = child_out("4", "1");
  CHECK(strlen(ref) > 100 && !strstr(ref, "nan"));
  CHECK(!strcmp(ref, one));
  CHECK(!strcmp(ref, two));
  CHECK(!strcmp(ref, four));
  if (strcmp(ref, one)) fprintf(stderr, "interpreter:\n%s\ncompiled, 1 thread:\n%s\n", ref, one);
  free(ref);
  free(one);
  free(two);
  free(four);
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "work")) return work();
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  /* before any Kiln call: plan every trace on first sight, compile inline */
  setenv("KILN_HOT", "1", 1);
  setenv("KILN_ASYNC", "0", 1);
  unsetenv("KILN_JIT");
  RUN(reductions_match_reference);
  RUN(nan_wins_everywhere);
  RUN(column_reductions_match_reference);
  RUN(long_rows_independent_of_threads_and_jit);
  RUN(row_kernels_softmax);
  RUN(row_kernels_layer_norm);
  RUN(row_kernels_kept_values_chain);
  RUN(many_host_scalars_compile);
  RUN(reduction_over_a_broadcast_input_runs_compiled);
  return ktest_done();
}
