/* test_gpu_ops.c — the GPU "interpreter" against the CPU interpreter: every
 * primitive x dtype, reductions over every axis pattern and odd sizes,
 * matmul shapes with transposed views and batches, data movement, RNG
 * streams, gradients, a short training run, and bad input (mixed devices,
 * out of memory).  Exact where IEEE arithmetic is exact; transcendentals
 * within TRANSCENDENTAL_RTOL (CUDA's libdevice and Kiln's CPU polynomials
 * are each within a few ulps); reductions exact too (they fold in the
 * CPU's order: vm/fold.h).  Without a CUDA device every test skips, saying so: run
 * scripts/gpu-check where there is one. */
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../vm/rng.h"
#include "../vm/tensor.h"
#include "ktest.h"

#define TRANSCENDENTAL_RTOL_F32 4e-6
#define TRANSCENDENTAL_RTOL_F64 1e-13

static const kiln_dtype ALL[] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64,
                                 KILN_BF16, KILN_F16, KILN_U8,  KILN_I8,  KILN_I16};
static const kiln_dtype NUMERIC[] = {KILN_I32, KILN_I64, KILN_F32, KILN_F64, KILN_BF16,
                                     KILN_F16, KILN_U8,  KILN_I8,  KILN_I16};
static const kiln_dtype FLOATS[] = {KILN_F32, KILN_F64, KILN_BF16, KILN_F16};
#define COUNT(a) (int)(sizeof a / sizeof *a)

/* Under KILN_GPU_TEST_SAMPLE=1 (the emulated device, where each kernel
   is compiled by the host's C++ compiler) the dtypes after the first five
   (bf16, f16, u8, i8, i16) run with every fifth op of a loop, a different
   fifth for each dtype, so each op meets one of them and each of them
   several ops; tests/gpu_emu/emulated_ops.c runs every op x dtype kernel.
   On a GPU every pair runs. */
static bool sampled(int op, kiln_dtype dt) {
  static int sample = -1;
  if (sample < 0) sample = getenv("KILN_GPU_TEST_SAMPLE") && atoi(getenv("KILN_GPU_TEST_SAMPLE"));
  return !sample || dt <= KILN_F64 || (op + (int)dt) % 5 == 0;
}

/* a transcendental's tolerance: CUDA's math and Kiln's each within a few
   ulps; a half rounds its f32 value, so the two may land one half ulp
   apart (relative: 2^-7 for bf16's 8-bit significand, 2^-10 for f16's) */
static double transcendental_rtol(kiln_dtype dt) {
  switch (dt) {
    case KILN_F32:
      return TRANSCENDENTAL_RTOL_F32;
    case KILN_F64:
      return TRANSCENDENTAL_RTOL_F64;
    case KILN_BF16:
      return 0x1p-7;
    default:
      return 0x1p-10;
  }
}

static uint64_t rng_state = 88172645463325252ull;
static double uniform(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * 0x1p-53;
}

/* a CPU tensor of dt with values in [lo, hi) (integers: rounded; bools: 0/1) */
static kiln_tensor *random_cpu(kiln_dtype dt, int ndim, const int64_t *shape, double lo,
                               double hi) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * uniform();
  kiln_tensor *f = kiln_from_data(v, KILN_F64, ndim, shape);
  free(v);
  kiln_tensor *t =
      dt == KILN_BOOL ? kiln_gt(f, kiln_scalar(0.5 * (lo + hi), KILN_F64)) : kiln_cast(f, dt);
  kiln_release(f);
  return t;
}

/* t's elements as doubles (evaluated, read through the host) */
static double *read_f64(kiln_tensor *t, int64_t *n) {
  kiln_tensor *h = kiln_to_device(t, KILN_CPU), *c = h ? kiln_cast(h, KILN_F64) : NULL;
  *n = c ? kiln_numel(c) : 0;
  double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
  if (!c || kiln_to_buffer(c, v, (size_t)*n * sizeof *v) != KILN_OK) *n = -1;
  kiln_release(h);
  kiln_release(c);
  return v;
}

/* cpu vs gpu, elementwise within rtol (0: exact; NaN equals NaN) of the
   larger of the cpu element's magnitude and `floor`; with `scaled`, the
   floor is cpu's largest magnitude: for results of long sums (gradients),
   where an element near zero is the difference of large terms */
static void same_within(const char *what, kiln_tensor *cpu, kiln_tensor *gpu, double rtol,
                        bool scaled, double floor_at_least) {
  if (!cpu || !gpu) {
    KTEST_FAIL("%s: cpu %p gpu %p (%s)", what, (void *)cpu, (void *)gpu, kiln_last_error());
    kiln_clear_error();
    return;
  }
  if (kiln_device_of(gpu) != KILN_CUDA) KTEST_FAIL("%s: the result is not on the GPU", what);
  if (kiln_dtype_of(cpu) != kiln_dtype_of(gpu)) KTEST_FAIL("%s: dtypes differ", what);
  int64_t nc, ng;
  double *a = read_f64(cpu, &nc), *b = read_f64(gpu, &ng), floor = fmax(1e-30, floor_at_least);
  if (nc != ng || nc < 0)
    KTEST_FAIL("%s: %lld vs %lld elements (%s)", what, (long long)nc, (long long)ng,
               kiln_last_error());
  for (int64_t i = 0; scaled && i < nc; i++) floor = fmax(floor, fabs(a[i]));
  for (int64_t i = 0; nc == ng && i < nc; i++) {
    bool same = (isnan(a[i]) && isnan(b[i])) || a[i] == b[i] ||
                (rtol > 0 && fabs(a[i] - b[i]) <= rtol * fmax(fabs(a[i]), floor) + 1e-300);
    if (!same) {
      KTEST_FAIL("%s: element %lld: cpu %.17g gpu %.17g", what, (long long)i, a[i], b[i]);
      break;
    }
  }
  free(a);
  free(b);
}

static void check_same(const char *what, kiln_tensor *cpu, kiln_tensor *gpu, double rtol) {
  same_within(what, cpu, gpu, rtol, false, 0);
}
static void check_near(const char *what, kiln_tensor *cpu, kiln_tensor *gpu, double rtol) {
  same_within(what, cpu, gpu, rtol, true, 0);
}

static kiln_tensor *gpu(kiln_tensor *t) { return kiln_to_device(t, KILN_CUDA); }

/* cpu = a b against the GPU's product: any two orders of a dot product's
   adds each stay within k * eps * (|a| |b|)_ij of the exact value (the
   standard bound; relative to the result it is unbounded where terms
   cancel), so the two may differ by twice that; integers exactly */
static void check_matmul(const char *what, kiln_tensor *a, kiln_tensor *b, kiln_tensor *cpu,
                         kiln_tensor *gpu) {
  kiln_dtype dt = kiln_dtype_of(a);
  if (!vm_dtype_is_float(dt)) return check_same(what, cpu, gpu, 0);
  kiln_tensor *fa = kiln_abs(a), *fb = kiln_abs(b), *bound = kiln_matmul(fa, fb);
  int64_t nc, ng, nb;
  double *c = read_f64(cpu, &nc), *g = read_f64(gpu, &ng), *m = read_f64(bound, &nb);
  int64_t k = kiln_shape(a)[kiln_ndim(a) - 1];
  /* a half's product is rounded once more, from f32 */
  double eps = dt == KILN_F32    ? 0x1p-24
               : dt == KILN_F64  ? 0x1p-53
               : dt == KILN_BF16 ? 0x1p-8 + 0x1p-24
                                 : 0x1p-11 + 0x1p-24;
  if (nc != ng || nc != nb || nc < 0)
    KTEST_FAIL("%s: %lld vs %lld elements (%s)", what, (long long)nc, (long long)ng,
               kiln_last_error());
  for (int64_t i = 0; nc == ng && nc == nb && i < nc; i++)
    if (!(fabs(c[i] - g[i]) <= 2 * (double)(k + 2) * eps * m[i])) {
      KTEST_FAIL("%s: element %lld: cpu %.17g gpu %.17g (bound %.3g)", what, (long long)i, c[i],
                 g[i], 2 * (double)(k + 2) * eps * m[i]);
      break;
    }
  free(c), free(g), free(m);
  kiln_release(fa), kiln_release(fb), kiln_release(bound);
}

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);

static void unary_case(const char *name, unary_fn f, kiln_dtype dt, double lo, double hi,
                       double rtol) {
  char what[96];
  snprintf(what, sizeof what, "%s(%d)", name, (int)dt);
  int64_t shape[2] = {37, 129};
  kiln_tensor *x = random_cpu(dt, 2, shape, lo, hi), *xg = gpu(x);
  kiln_tensor *yc = f(x), *yg = xg ? f(xg) : NULL;
  check_same(what, yc, yg, rtol);
  /* a strided (transposed) input takes the other layout class */
  kiln_tensor *xt = kiln_transpose(x, 0, 1), *xgt = xg ? kiln_transpose(xg, 0, 1) : NULL;
  kiln_tensor *tc = f(xt), *tg = xgt ? f(xgt) : NULL;
  snprintf(what, sizeof what, "%s(%d) transposed", name, (int)dt);
  check_same(what, tc, tg, rtol);
  kiln_tensor *all[] = {x, xg, yc, yg, xt, xgt, tc, tg};
  for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
}

TEST(every_unary_op_and_dtype) {
  struct {
    const char *name;
    unary_fn f;
    bool floats_only;
    double lo, hi;
    bool exact;
  } ops[] = {
      {"neg", kiln_neg, false, -50, 50, true},
      {"abs", kiln_abs, false, -50, 50, true},
      {"sign", kiln_sign, false, -5, 5, true},
      {"floor", kiln_floor, false, -9, 9, true},
      {"ceil", kiln_ceil, false, -9, 9, true},
      {"round", kiln_round, false, -9, 9, true},
      {"sqrt", kiln_sqrt, true, 0, 100, true},
      {"rsqrt", kiln_rsqrt, true, 0.01, 100, false},
      {"exp", kiln_exp, true, -20, 20, false},
      {"log", kiln_log, true, 0.001, 100, false},
      {"sin", kiln_sin, true, -10, 10, false},
      {"cos", kiln_cos, true, -10, 10, false},
      {"tanh", kiln_tanh, true, -8, 8, false},
      {"sigmoid", kiln_sigmoid, true, -20, 20, false},
      {"erf", kiln_erf, true, -4, 4, false},
      {"log1p", kiln_log1p, true, -0.9, 50, false},
      {"expm1", kiln_expm1, true, -5, 5, false},
      {"relu", kiln_relu, false, -5, 5, true},
      {"logical_not", kiln_logical_not, false, -1, 1, true},
  };
  for (int k = 0; k < COUNT(ops); k++)
    for (int d = 0; d < COUNT(ALL); d++) {
      kiln_dtype dt = ALL[d];
      if (!sampled(k, dt)) continue;
      if (dt == KILN_BOOL && strcmp(ops[k].name, "logical_not") && strcmp(ops[k].name, "abs"))
        continue;
      if (ops[k].floats_only && !vm_dtype_is_float(dt)) continue;
      double rtol = ops[k].exact ? 0 : transcendental_rtol(dt);
      unary_case(ops[k].name, ops[k].f, dt, ops[k].lo, ops[k].hi, rtol);
    }
}

TEST(every_binary_op_and_dtype_with_broadcasts) {
  struct {
    const char *name;
    binary_fn f;
    bool no_bool;
    double lo, hi;
    bool exact;
  } ops[] = {
      {"add", kiln_add, false, -50, 50, true},
      {"sub", kiln_sub, true, -50, 50, true},
      {"mul", kiln_mul, false, -50, 50, true},
      {"div", kiln_div, true, 1, 50, true},
      {"pow", kiln_pow, true, 0.5, 3, false},
      {"maximum", kiln_maximum, false, -5, 5, true},
      {"minimum", kiln_minimum, false, -5, 5, true},
      {"eq", kiln_eq, false, -3, 3, true},
      {"ne", kiln_ne, false, -3, 3, true},
      {"lt", kiln_lt, false, -3, 3, true},
      {"le", kiln_le, false, -3, 3, true},
      {"gt", kiln_gt, false, -3, 3, true},
      {"ge", kiln_ge, false, -3, 3, true},
      {"logical_and", kiln_logical_and, false, -1, 1, true},
      {"logical_or", kiln_logical_or, false, -1, 1, true},
  };
  const int64_t sa[3] = {5, 1, 67}, sb[3] = {1, 9, 67}; /* both operands broadcast */
  for (int k = 0; k < COUNT(ops); k++)
    for (int d = 0; d < COUNT(ALL); d++) {
      kiln_dtype dt = ALL[d];
      if (!sampled(k, dt)) continue;
      if (dt == KILN_BOOL && ops[k].no_bool) continue;
      char what[96];
      snprintf(what, sizeof what, "%s(%d)", ops[k].name, (int)dt);
      kiln_tensor *a = random_cpu(dt, 3, sa, ops[k].lo, ops[k].hi),
                  *b = random_cpu(dt, 3, sb, ops[k].lo, ops[k].hi);
      kiln_tensor *ag = gpu(a), *bg = gpu(b);
      kiln_tensor *c = ops[k].f(a, b), *g = ag && bg ? ops[k].f(ag, bg) : NULL;
      double rtol = ops[k].exact ? 0 : transcendental_rtol(dt);
      check_same(what, c, g, rtol);
      kiln_tensor *all[] = {a, b, ag, bg, c, g};
      for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
    }
}

TEST(where_and_casts_between_every_dtype) {
  const int64_t s[2] = {33, 65};
  kiln_tensor *cond = random_cpu(KILN_BOOL, 2, s, 0, 1), *cg = gpu(cond);
  for (int d = 0; d < COUNT(ALL); d++) {
    kiln_tensor *a = random_cpu(ALL[d], 2, s, -40, 40), *b = random_cpu(ALL[d], 2, s, -40, 40);
    kiln_tensor *ag = gpu(a), *bg = gpu(b);
    kiln_tensor *w = kiln_where(cond, a, b), *wg = kiln_where(cg, ag, bg);
    check_same("where", w, wg, 0);
    for (int e = 0; e < COUNT(ALL); e++) {
      if (!sampled(d, ALL[e]) && !sampled(e, ALL[d])) continue;
      char what[64];
      snprintf(what, sizeof what, "cast %d -> %d", (int)ALL[d], (int)ALL[e]);
      kiln_tensor *x = kiln_cast(a, ALL[e]), *xg = kiln_cast(ag, ALL[e]);
      check_same(what, x, xg, 0);
      kiln_release(x);
      kiln_release(xg);
    }
    kiln_tensor *all[] = {a, b, ag, bg, w, wg};
    for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
  }
  kiln_release(cond);
  kiln_release(cg);
}

TEST(reductions_over_every_axis_pattern) {
  const int64_t s[3] = {3, 35, 129};
  typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);
  struct {
    const char *name;
    reduce_fn f;
  } ops[] = {{"sum", kiln_sum}, {"prod", kiln_prod}, {"max", kiln_max}, {"min", kiln_min}};
  for (int d = 0; d < COUNT(NUMERIC); d++) {
    kiln_dtype dt = NUMERIC[d];
    kiln_tensor *x = random_cpu(dt, 3, s, 0.5, 1.5), *xg = gpu(x);
    for (int k = 0; k < COUNT(ops); k++)
      for (int mask = 1; mask < 8; mask++) {
        if (!sampled(k + mask, dt)) continue;
        int axes[3], n = 0;
        for (int a = 0; a < 3; a++)
          if (mask >> a & 1) axes[n++] = a;
        char what[64];
        snprintf(what, sizeof what, "%s(%d) mask %d", ops[k].name, (int)dt, mask);
        kiln_tensor *c = ops[k].f(x, n, axes, mask & 1), *g = ops[k].f(xg, n, axes, mask & 1);
        check_same(what, c, g, 0); /* the same fold order, the same bits */
        kiln_release(c);
        kiln_release(g);
      }
    for (int axis = 0; axis < 3; axis++) {
      kiln_tensor *c = kiln_argmax(x, axis, false), *g = kiln_argmax(xg, axis, false);
      check_same("argmax", c, g, 0);
      kiln_release(c), kiln_release(g);
      c = kiln_argmin(x, axis, true), g = kiln_argmin(xg, axis, true);
      check_same("argmin", c, g, 0);
      kiln_release(c), kiln_release(g);
    }
    kiln_release(x);
    kiln_release(xg);
  }
  /* long reductions (two passes) and odd sizes */
  const int64_t sizes[] = {1, 31, 1025, 100003, 1 << 22};
  for (int i = 0; i < COUNT(sizes); i++)
    for (int d = 0; d < COUNT(FLOATS); d++) {
      kiln_tensor *x = random_cpu(FLOATS[d], 1, &sizes[i], -1, 1), *xg = gpu(x);
      kiln_tensor *c = kiln_sum(x, 0, NULL, false), *g = kiln_sum(xg, 0, NULL, false);
      check_same("long sum", c, g,
                 FLOATS[d] == KILN_F64 ? 1e-11 : fmax(1e-4, transcendental_rtol(FLOATS[d])));
      kiln_release(c), kiln_release(g);
      c = kiln_max(x, 0, NULL, false), g = kiln_max(xg, 0, NULL, false);
      check_same("long max", c, g, 0);
      kiln_release(c), kiln_release(g), kiln_release(x), kiln_release(xg);
    }
}

TEST(matmul_shapes_transposes_and_batches) {
  const int64_t dims[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 64, 64}, {129, 33, 257}, {300, 700, 1}};
  for (int d = 0; d < COUNT(NUMERIC); d++)
    for (int i = 0; i < COUNT(dims); i++) {
      kiln_dtype dt = NUMERIC[d];
      if (!sampled(i, dt)) continue;
      const int64_t sa[2] = {dims[i][0], dims[i][1]}, sb[2] = {dims[i][1], dims[i][2]},
                    sbt[2] = {dims[i][2], dims[i][1]};
      kiln_tensor *a = random_cpu(dt, 2, sa, -3, 3), *b = random_cpu(dt, 2, sb, -3, 3),
                  *bt = random_cpu(dt, 2, sbt, -3, 3);
      kiln_tensor *ag = gpu(a), *bg = gpu(b), *btg = gpu(bt);
      kiln_tensor *c = kiln_matmul(a, b), *g = kiln_matmul(ag, bg);
      check_matmul("matmul", a, b, c, g);
      kiln_tensor *t1 = kiln_transpose(bt, 0, 1), *t1g = kiln_transpose(btg, 0, 1);
      kiln_tensor *c2 = kiln_matmul(a, t1), *g2 = kiln_matmul(ag, t1g);
      check_matmul("matmul with a transposed view", a, t1, c2, g2);
      kiln_tensor *all[] = {a, b, bt, ag, bg, btg, c, g, t1, t1g, c2, g2};
      for (int k = 0; k < COUNT(all); k++) kiln_release(all[k]);
    }
  const int64_t sa[3] = {4, 33, 17}, sb[3] = {4, 17, 9}, sb1[2] = {17, 9};
  kiln_tensor *a = random_cpu(KILN_F32, 3, sa, -1, 1), *b = random_cpu(KILN_F32, 3, sb, -1, 1),
              *b1 = random_cpu(KILN_F32, 2, sb1, -1, 1);
  kiln_tensor *ag = gpu(a), *bg = gpu(b), *b1g = gpu(b1);
  kiln_tensor *c = kiln_matmul(a, b), *g = kiln_matmul(ag, bg), *c1 = kiln_matmul(a, b1),
              *g1 = kiln_matmul(ag, b1g);
  check_matmul("batched matmul", a, b, c, g);
  check_matmul("broadcast batch matmul", a, b1, c1, g1);
  kiln_tensor *all[] = {a, b, b1, ag, bg, b1g, c, g, c1, g1};
  for (int k = 0; k < COUNT(all); k++) kiln_release(all[k]);
}

/* attention's batched products on the device: q k^T (k^T a view) and p v
   over [batch, heads] are each one strided batched cuBLAS call, and a batch
   broadcast both ways ([2,1] x [1,3]: a strided batch per outer index) is
   still one matmul in kiln_stat("blas_calls") */
TEST(batched_matmuls_are_one_blas_call_each) {
  const int64_t sq[4] = {2, 3, 16, 8}, sp[4] = {2, 3, 16, 16}, sa[4] = {2, 1, 5, 8},
                sb[4] = {1, 3, 8, 7};
  kiln_tensor *q = random_cpu(KILN_F32, 4, sq, -1, 1), *k = random_cpu(KILN_F32, 4, sq, -1, 1),
              *p = random_cpu(KILN_F32, 4, sp, 0, 1), *v = random_cpu(KILN_F32, 4, sq, -1, 1),
              *a = random_cpu(KILN_F64, 4, sa, -1, 1), *b = random_cpu(KILN_F64, 4, sb, -1, 1);
  kiln_tensor *qg = gpu(q), *kg = gpu(k), *pg = gpu(p), *vg = gpu(v), *ag = gpu(a), *bg = gpu(b);
  kiln_tensor *kt = kiln_transpose(k, 2, 3), *ktg = kiln_transpose(kg, 2, 3);
  kiln_tensor *lhs[3][2] = {{q, qg}, {p, pg}, {a, ag}}, *rhs[3][2] = {{kt, ktg}, {v, vg}, {b, bg}};
  const char *what[3] = {"q k^T [2,3,16,8]x[2,3,8,16]", "p v [2,3,16,16]x[2,3,16,8]",
                         "broadcast [2,1,5,8]x[1,3,8,7] f64"};
  for (int i = 0; i < 3; i++) {
    kiln_tensor *c = kiln_matmul(lhs[i][0], rhs[i][0]);
    CHECK(kiln_eval(1, &c) == KILN_OK);
    double b0 = kiln_stat("blas_calls");
    kiln_tensor *g = kiln_matmul(lhs[i][1], rhs[i][1]);
    CHECK(kiln_eval(1, &g) == KILN_OK);
    double calls = kiln_stat("blas_calls") - b0;
    if (calls != 1) KTEST_FAIL("%s on the device: %g BLAS calls, want 1", what[i], calls);
    check_matmul(what[i], lhs[i][0], rhs[i][0], c, g);
    kiln_release(c), kiln_release(g);
  }
  kiln_tensor *all[] = {q, k, p, v, a, b, qg, kg, pg, vg, ag, bg, kt, ktg};
  for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
}

/* kiln_scaled_dot_product_attention on CUDA is the attention primitive
   (jit_gpu/opgen_src.c's kernels: no BLAS call, no Tq x Tk scores), with
   the CPU primitive's values and gradients: f64 to 1e-12 and f32 to 2e-5
   of the largest element (the sums run in other orders), over both head
   buckets, Tq != Tk, causal, a bool mask broadcast over heads with a row
   masked out entirely, a float padding mask with -inf, q/k/v strided
   slices of one projection, and T = 1.  A case whose heads exceed 128
   runs composed (BLAS calls) with the same values. */
typedef struct {
  int64_t b, h, tq, tk, d, dv;
  int mask; /* 0 none, 1 bool [b, 1, tq, tk], 2 float [b, 1, 1, tk] */
  bool causal, strided;
  kiln_dtype dt;
} att_case;

static void attention_inputs(const att_case *c, kiln_tensor **leaves, int *nleaves,
                             kiln_tensor **qkv, bool on_gpu, kiln_tensor *const *cpu_leaves) {
  int64_t shp[3][4] = {
      {c->b, c->h, c->tq, c->d}, {c->b, c->h, c->tk, c->d}, {c->b, c->h, c->tk, c->dv}};
  if (c->strided) { /* [b, t, 3, h, d]: q, k, v are slices of one projection */
    int64_t ps[5] = {c->b, c->tq, 3, c->h, c->d}, rs[4] = {c->b, c->tq, c->h, c->d};
    leaves[0] = on_gpu ? gpu(cpu_leaves[0]) : random_cpu(c->dt, 5, ps, -1, 1);
    *nleaves = 1;
    kiln_set_requires_grad(leaves[0], true);
    const int perm[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++) {
      kiln_tensor *sl = kiln_slice(leaves[0], 2, i, i + 1, 1), *r = kiln_reshape(sl, 4, rs);
      qkv[i] = kiln_permute(r, perm);
      kiln_release(sl), kiln_release(r);
    }
    return;
  }
  for (int i = 0; i < 3; i++) {
    leaves[i] = on_gpu ? gpu(cpu_leaves[i]) : random_cpu(c->dt, 4, shp[i], -1.5, 1.5);
    kiln_set_requires_grad(leaves[i], true);
    qkv[i] = kiln_retain(leaves[i]);
  }
  *nleaves = 3;
}

static kiln_tensor *attention_mask(const att_case *c) {
  if (c->mask == 1) { /* random, and query 0 of item 0 attends to nothing */
    int64_t ms[4] = {c->b, 1, c->tq, c->tk};
    int64_t n = c->b * c->tq * c->tk;
    uint8_t *bits = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) bits[i] = i >= c->tk && uniform() > 0.3;
    kiln_tensor *mask = kiln_from_data(bits, KILN_BOOL, 4, ms);
    free(bits);
    return mask;
  }
  if (c->mask == 2) { /* padding: item 0's last 3 keys -inf, small biases elsewhere */
    int64_t ms[4] = {c->b, 1, 1, c->tk}, n = c->b * c->tk;
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
      v[i] = i < c->tk && i >= c->tk - 3 ? -INFINITY : uniform() - 0.5;
    kiln_tensor *f = kiln_from_data(v, KILN_F64, 4, ms), *mask = kiln_cast(f, c->dt);
    free(v);
    kiln_release(f);
    return mask;
  }
  return NULL;
}

/* out and the gradients of sum(out * w) for c on the CPU (cpu_leaves
   NULL: made here) or on the GPU (copies of cpu_leaves); returns out,
   grads[] the leaves' gradients */
static kiln_tensor *attention_run(const att_case *c, bool on_gpu, kiln_tensor **cpu_leaves,
                                  kiln_tensor *w, kiln_tensor *mask, kiln_tensor **grads,
                                  int *nleaves) {
  kiln_tensor *leaves[3], *qkv[3];
  attention_inputs(c, leaves, nleaves, qkv, on_gpu, cpu_leaves);
  kiln_tensor *m = mask && on_gpu ? gpu(mask) : mask ? kiln_retain(mask) : NULL;
  kiln_tensor *wd = on_gpu ? gpu(w) : kiln_retain(w);
  kiln_tensor *out = kiln_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], m, c->causal, 0);
  CHECK(out != NULL);
  CHECK_EQ_INT(kiln_grad_of(1, &out, &wd, *nleaves, leaves, grads, false), KILN_OK);
  for (int i = 0; i < *nleaves; i++) {
    if (!on_gpu) cpu_leaves[i] = kiln_retain(leaves[i]);
    kiln_release(leaves[i]);
  }
  for (int i = 0; i < 3; i++) kiln_release(qkv[i]);
  kiln_release(m), kiln_release(wd);
  return out;
}

static void attention_on_both_devices(const att_case *c, const char *what) {
  int64_t os[4] = {c->b, c->h, c->tq, c->dv};
  kiln_tensor *w = random_cpu(c->dt, 4, os, -1, 1), *mask = attention_mask(c);
  kiln_tensor *leaves[3] = {0}, *gc[3] = {0}, *gg[3] = {0}, *again[3] = {0};
  int nl = 0;
  kiln_tensor *oc = attention_run(c, false, leaves, w, mask, gc, &nl);
  CHECK(kiln_eval(1, &oc) == KILN_OK);
  CHECK(kiln_eval(nl, gc) == KILN_OK);
  double b0 = kiln_stat("blas_calls");
  kiln_tensor *og = attention_run(c, true, leaves, w, mask, gg, &nl);
  CHECK(kiln_eval(1, &og) == KILN_OK);
  CHECK(kiln_eval(nl, gg) == KILN_OK);
  double calls = kiln_stat("blas_calls") - b0;
  bool native = c->d <= 128 && c->dv <= 128;
  if (native ? calls != 0 : calls == 0)
    KTEST_FAIL("%s: %g BLAS calls on the device (want %s)", what, calls,
               native ? "none: the primitive" : "some: composed");
  double rtol = c->dt == KILN_F64 ? 1e-12 : 2e-5;
  char name[160];
  snprintf(name, sizeof name, "%s: out", what);
  check_near(name, oc, og, rtol);
  for (int i = 0; i < nl; i++) { /* relative to the terms' size (about 1): a gradient
                                     may be a cancellation, exactly 0 (T = 1: dq, dk) */
    snprintf(name, sizeof name, "%s: gradient %d", what, i);
    same_within(name, gc[i], gg[i], rtol, true, 1.0);
  }
  /* a second run on the device: the same bits (no atomics, fixed order) */
  kiln_tensor *og2 = attention_run(c, true, leaves, w, mask, again, &nl);
  snprintf(name, sizeof name, "%s: out, run 2", what);
  check_same(name, og, og2, 0);
  for (int i = 0; i < nl; i++) {
    snprintf(name, sizeof name, "%s: gradient %d, run 2", what, i);
    check_same(name, gg[i], again[i], 0);
  }
  kiln_release(w), kiln_release(mask), kiln_release(oc), kiln_release(og), kiln_release(og2);
  for (int i = 0; i < nl; i++) {
    kiln_release(leaves[i]), kiln_release(gc[i]), kiln_release(gg[i]), kiln_release(again[i]);
  }
}

TEST(attention_is_one_primitive_on_the_device) {
  const att_case cases[] = {
      {2, 3, 37, 37, 16, 16, 0, false, false, KILN_F64},
      {2, 2, 70, 45, 24, 40, 0, true, false, KILN_F64},
      {1, 2, 65, 66, 100, 72, 1, false, false, KILN_F32},
      {2, 2, 33, 50, 8, 8, 2, false, false, KILN_F64},
      {2, 2, 40, 40, 16, 16, 1, true, true, KILN_F32},
      {2, 1, 1, 1, 5, 3, 0, false, false, KILN_F32},
      {1, 2, 20, 24, 130, 16, 2, false, false, KILN_F64},
  };
  const char *names[] = {"f64, one block",
                         "f64 causal, Tq 70 > Tk 45",
                         "f32 d 100, bool mask",
                         "f64 float padding mask",
                         "f32 causal + bool mask, strided slices",
                         "f32 T 1",
                         "f64 d 130: composed"};
  for (int i = 0; i < COUNT(cases); i++) attention_on_both_devices(&cases[i], names[i]);
}

/* attention written the long way on the device (matmul, scale, an
   additive mask with -inf above the diagonal, softmax, matmul) is
   recorded as the primitive (trace/attention.c): one rewrite, no BLAS
   call, the op's bits with that mask; with a triu mask and a -inf fill
   (kiln_full_on) it is the causal op */
TEST(attention_written_the_long_way_on_the_device) {
  int64_t s[4] = {2, 2, 48, 32}, sq[2] = {48, 48};
  kiln_tensor *q = random_cpu(KILN_F32, 4, s, -1, 1), *k = random_cpu(KILN_F32, 4, s, -1, 1),
              *v = random_cpu(KILN_F32, 4, s, -1, 1);
  float *mv = malloc(48 * 48 * sizeof *mv);
  for (int i = 0; i < 48; i++)
    for (int j = 0; j < 48; j++) mv[i * 48 + j] = j > i ? -INFINITY : (float)(0.01 * (i - j));
  kiln_tensor *mask = kiln_from_data(mv, KILN_F32, 2, sq);
  free(mv);
  kiln_tensor *qg = gpu(q), *kg = gpu(k), *vg = gpu(v), *maskg = gpu(mask);
  double r0 = kiln_stat("attention_rewrites"), b0 = kiln_stat("blas_calls");
  kiln_tensor *kt = kiln_transpose(kg, 2, 3), *sc = kiln_matmul(qg, kt);
  kiln_tensor *scaled = kiln_mul_scalar(sc, 1 / sqrt(32.0)), *x = kiln_add(scaled, maskg);
  kiln_tensor *p = kiln_softmax(x, -1), *out = kiln_matmul(p, vg);
  CHECK(kiln_eval(1, &out) == KILN_OK);
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - r0, 1);
  CHECK_EQ_INT(kiln_stat("blas_calls") - b0, 0);
  kiln_tensor *op = kiln_scaled_dot_product_attention(qg, kg, vg, maskg, false, 0);
  check_same("the long way against the op", op, out, 0);
  kiln_tensor *cpu_op = kiln_scaled_dot_product_attention(q, k, v, mask, false, 0);
  check_near("the device's op against the CPU's", cpu_op, op, 2e-5);
  /* a causal mask written with triu and a -inf fill on the device: the
     causal op, with its bits (the scores anew: only pending work is
     rewritten) */
  kiln_tensor *ones = kiln_full_on(1, KILN_BOOL, 2, sq, KILN_CUDA);
  kiln_tensor *ninf = kiln_full_on(-INFINITY, KILN_F32, 0, NULL, KILN_CUDA);
  kiln_tensor *sc2 = kiln_matmul(qg, kt), *scaled2 = kiln_mul_scalar(sc2, 1 / sqrt(32.0));
  kiln_tensor *later = kiln_triu(ones, 1), *xc = kiln_where(later, ninf, scaled2);
  kiln_tensor *pc = kiln_softmax(xc, -1), *outc = kiln_matmul(pc, vg);
  CHECK(kiln_eval(1, &outc) == KILN_OK);
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - r0, 2);
  kiln_tensor *causal = kiln_scaled_dot_product_attention(qg, kg, vg, NULL, true, 0);
  check_same("the long way with triu against the causal op", causal, outc, 0);
  /* heads past the device's 128: left as written (the op would compose) */
  int64_t sw[4] = {1, 1, 8, 130};
  kiln_tensor *qw = random_cpu(KILN_F32, 4, sw, -1, 1), *qwg = gpu(qw);
  kiln_tensor *ktw = kiln_transpose(qwg, 2, 3), *sw2 = kiln_matmul(qwg, ktw);
  kiln_tensor *pw = kiln_softmax(sw2, -1), *ow = kiln_matmul(pw, qwg);
  CHECK(kiln_eval(1, &ow) == KILN_OK);
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - r0, 2);
  kiln_tensor *wide[] = {qw, qwg, ktw, sw2, pw, ow};
  for (int i = 0; i < COUNT(wide); i++) kiln_release(wide[i]);
  kiln_tensor *all[] = {q, k,   v,  mask, qg,   kg,    vg, maskg, kt,   sc,     scaled, x,
                        p, out, op, ones, ninf, later, xc, pc,    outc, causal, cpu_op};
  for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
}

TEST(gathers_scatters_concat_and_sorts) {
  const int64_t s[2] = {17, 40}, si[1] = {23}, sg[2] = {17, 11};
  for (int d = 0; d < COUNT(NUMERIC); d++) {
    kiln_dtype dt = NUMERIC[d];
    kiln_tensor *x = random_cpu(dt, 2, s, -9, 9), *xg = gpu(x);
    kiln_tensor *idx = random_cpu(KILN_I64, 1, si, 0, 16.99), *idxg = gpu(idx);
    kiln_tensor *gi = random_cpu(KILN_I64, 2, sg, 0, 39.99), *gig = gpu(gi);
    kiln_tensor *c = kiln_index_select(x, 0, idx), *g = kiln_index_select(xg, 0, idxg);
    check_same("index_select", c, g, 0);
    kiln_release(c), kiln_release(g);
    c = kiln_gather(x, 1, gi), g = kiln_gather(xg, 1, gig);
    check_same("gather", c, g, 0);
    kiln_tensor *src = random_cpu(dt, 2, sg, -9, 9), *srcg = gpu(src);
    kiln_tensor *sc = kiln_scatter_add(x, 1, gi, src), *sgp = kiln_scatter_add(xg, 1, gig, srcg);
    check_same("scatter_add (deterministic, no atomics)", sc, sgp,
               dt == KILN_F32          ? 1e-6
               : dt == KILN_F64        ? 1e-14
               : vm_dtype_is_float(dt) ? transcendental_rtol(dt)
                                       : 0);
    kiln_tensor *parts[3] = {x, src, x}, *partsg[3] = {xg, srcg, xg};
    kiln_tensor *cc = kiln_concat(3, parts, 1), *cg = kiln_concat(3, partsg, 1);
    check_same("concat", cc, cg, 0);
    kiln_tensor *ids = NULL, *idsg = NULL;
    kiln_tensor *vals = kiln_sort(x, 1, d % 2 == 0, &ids),
                *valsg = kiln_sort(xg, 1, d % 2 == 0, &idsg);
    check_same("sort values", vals, valsg, 0);
    check_same("sort indices (stable)", ids, idsg, 0);
    kiln_tensor *all[] = {x,    xg, idx, idxg, gi, gig,  c,   g,     src,
                          srcg, sc, sgp, cc,   cg, vals, ids, valsg, idsg};
    for (int k = 0; k < COUNT(all); k++) kiln_release(all[k]);
  }
}

/* an index out of range on the GPU is an error at the flush, as on the CPU */
TEST(out_of_range_index_is_an_error) {
  const int64_t s[2] = {4, 3};
  kiln_tensor *x = gpu(kiln_ones(KILN_F32, 2, s));
  kiln_tensor *bad = gpu(kiln_from_data((int64_t[]){1, 9}, KILN_I64, 1, (int64_t[]){2}));
  kiln_tensor *y = kiln_index_select(x, 0, bad);
  double buf[8];
  CHECK(y == NULL || kiln_to_buffer(y, buf, sizeof buf) != KILN_OK);
  CHECK(strstr(kiln_last_error(), "out of range"));
  kiln_clear_error();
  kiln_release(x), kiln_release(bad), kiln_release(y);
}

/* An index op checks its indices on the device into the thread's record
   (jit_gpu/opgen.h), which the host reads where it waits anyway: a plan
   with a gather never waits for the device, so the host can run ahead of
   it.  Compiled, the gather is computed in place by its consumers' kernel,
   after the check.  A bad index is reported at the next read of a value, the first
   bad one in stream order, named after the call that recorded it; the
   record is clear after it.  With
   KILN_GPU_SYNC_CHECKS=1 it is an error at the flush that ran it. */
static kiln_tensor *picked(kiln_tensor *x, kiln_tensor *labels) {
  kiln_tensor *g = kiln_gather(x, 1, labels);
  kiln_tensor *out = kiln_add_scalar(kiln_mul_scalar(g, 2), 1);
  kiln_release(g);
  return out;
}

TEST(index_checks_never_wait_for_the_device) {
  const int64_t s[2] = {64, 10}, ls[2] = {64, 1};
  kiln_tensor *x = random_cpu(KILN_F32, 2, s, -2, 2), *xg = gpu(x);
  kiln_tensor *lf = random_cpu(KILN_I64, 2, ls, 0, 9.49), *lg = gpu(lf);
  for (int rep = 0; rep < 5; rep++) {
    kiln_tensor *want = picked(x, lf), *got = picked(xg, lg);
    double waits = kiln_stat("device_waits"), launched = kiln_stat("kernels_launched");
    CHECK_EQ_INT(kiln_eval(1, &got), KILN_OK);
    CHECK(kiln_stat("device_waits") == waits); /* launched, not waited for */
    /* compiled: the check, then one kernel that gathers in place (fuse.h) */
    if (rep >= 3) CHECK_EQ_INT(kiln_stat("kernels_launched") - launched, 2);
    /* a read waits once: the record's copy rides ahead of the value's (the
       emulation finishes work as it is enqueued, so there it waits 0 times) */
    float first;
    waits = kiln_stat("device_waits");
    kiln_tensor *flat = kiln_reshape(got, 1, (int64_t[]){-1}), *one = kiln_slice(flat, 0, 0, 1, 1);
    CHECK_EQ_INT(kiln_to_buffer(one, &first, sizeof first), KILN_OK);
    CHECK(kiln_stat("device_waits") - waits <=
          (strstr(kiln_device_info(KILN_CUDA), "emulation") ? 0 : 1));
    kiln_release(one), kiln_release(flat);
    check_same("gather, then read", want, got, 0);
    kiln_release(want), kiln_release(got);
    if (rep == 2) kiln_jit_wait();
  }
  /* two bad gathers before a read: the first is reported, at the read */
  int64_t bad_hi[64], bad_lo[64];
  for (int i = 0; i < 64; i++) bad_hi[i] = bad_lo[i] = i % 10;
  bad_hi[17] = 10, bad_hi[40] = 12, bad_lo[3] = -1;
  kiln_tensor *hi = gpu(kiln_from_data(bad_hi, KILN_I64, 2, ls)),
              *lo = gpu(kiln_from_data(bad_lo, KILN_I64, 2, ls));
  kiln_tensor *y1 = picked(xg, hi), *y2 = picked(xg, lo);
  double waits = kiln_stat("device_waits");
  CHECK_EQ_INT(kiln_eval(1, &y1), KILN_OK);
  CHECK_EQ_INT(kiln_eval(1, &y2), KILN_OK);
  CHECK(kiln_stat("device_waits") == waits);
  float buf[64];
  CHECK(kiln_to_buffer(y2, buf, sizeof buf) != KILN_OK);
  /* named after the call that recorded the gather, not the read */
  CHECK_STR_CONTAINS(kiln_last_error(),
                     "kiln_gather: index 10 is out of range for axis 1 of size 10");
  kiln_clear_error();
  /* the record is clear again: a good gather reads back right */
  kiln_tensor *want = picked(x, lf), *got = picked(xg, lg);
  check_same("a good gather after a reported bad one", want, got, 0);
  kiln_release(want), kiln_release(got), kiln_release(y1), kiln_release(y2);
  /* checked at the op: the flush that runs it fails */
  setenv("KILN_GPU_SYNC_CHECKS", "1", 1);
  kiln_tensor *y3 = picked(xg, lo);
  CHECK(kiln_eval(1, &y3) != KILN_OK);
  CHECK_STR_CONTAINS(kiln_last_error(),
                     "kiln_gather: index -1 is out of range for axis 1 of size 10");
  kiln_clear_error();
  unsetenv("KILN_GPU_SYNC_CHECKS");
  kiln_release(y3);
  kiln_tensor *all[] = {x, xg, lf, lg, hi, lo};
  for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
}

/* dropout draws its mask on the input's device: the same Philox stream as
   the CPU, so the same seed keeps the same elements */
TEST(rng_streams_match_the_cpu) {
  const int64_t s[1] = {4099};
  kiln_tensor *x = kiln_ones(KILN_F32, 1, s), *xg = gpu(x);
  kiln_manual_seed(1234);
  kiln_tensor *c = kiln_dropout(x, 0.5, true);
  kiln_manual_seed(1234);
  kiln_tensor *g = kiln_dropout(xg, 0.5, true);
  check_same("dropout mask", c, g, 0);
  kiln_release(x), kiln_release(xg), kiln_release(c), kiln_release(g);
}

static kiln_tensor *mlp_loss(kiln_tensor *x, kiln_tensor *w1, kiln_tensor *w2,
                             kiln_tensor *labels) {
  kiln_tensor *h = kiln_matmul(x, w1), *r = kiln_relu(h), *o = kiln_matmul(r, w2);
  kiln_tensor *l = kiln_cross_entropy(o, labels);
  kiln_release(h), kiln_release(r), kiln_release(o);
  return l;
}

/* mlp_loss trained `steps` SGD steps (lr 0.5) from one start on the CPU
   and on the GPU (under the thread's autocast, if any): every gradient is
   f32, the parameters' dtype; step 0's first-layer gradients agree within
   grad_tol of the largest, every loss within loss_tol; the GPU's loss
   falls by a fifth */
static void mlp_on_both_devices(int steps, double grad_tol, double loss_tol) {
  const int64_t sx[2] = {64, 20}, s1[2] = {20, 32}, s2[2] = {32, 5}, sl[1] = {64};
  kiln_tensor *x = random_cpu(KILN_F32, 2, sx, -1, 1),
              *labels = random_cpu(KILN_I64, 1, sl, 0, 4.99);
  kiln_tensor *w[2][2] = {
      {random_cpu(KILN_F32, 2, s1, -0.3, 0.3), random_cpu(KILN_F32, 2, s2, -0.3, 0.3)}};
  w[1][0] = gpu(w[0][0]);
  w[1][1] = gpu(w[0][1]);
  kiln_tensor *xs[2] = {x, gpu(x)}, *ls[2] = {labels, gpu(labels)};
  double losses[2][30];
  kiln_tensor *first_grad = NULL; /* the CPU's, of step 0 (zeroed after each step) */
  for (int dev = 0; dev < 2; dev++) {
    kiln_set_requires_grad(w[dev][0], true);
    kiln_set_requires_grad(w[dev][1], true);
    for (int step = 0; step < steps; step++) {
      kiln_tensor *l = mlp_loss(xs[dev], w[dev][0], w[dev][1], ls[dev]);
      losses[dev][step] = kiln_item(l);
      kiln_backward(l, NULL);
      if (step == 0 && dev == 0) first_grad = kiln_grad(w[0][0]);
      if (step == 0 && dev == 1) {
        kiln_tensor *gg = kiln_grad(w[1][0]);
        check_near("first-layer gradient", first_grad, gg, grad_tol);
        kiln_release(gg);
      }
      for (int k = 0; k < 2; k++) {
        kiln_tensor *g = kiln_grad(w[dev][k]);
        if (kiln_dtype_of(g) != KILN_F32) KTEST_FAIL("a gradient of f32 weights is not f32");
        kiln_sub_scaled_(w[dev][k], g, 0.5);
        kiln_release(g);
        kiln_zero_grad(w[dev][k]);
      }
      kiln_release(l);
    }
  }
  kiln_release(first_grad);
  for (int step = 0; step < steps; step++) CHECK_CLOSE(losses[1][step], losses[0][step], loss_tol);
  CHECK(losses[1][steps - 1] < 0.8 * losses[1][0]);
  for (int dev = 0; dev < 2; dev++) {
    kiln_release(w[dev][0]), kiln_release(w[dev][1]);
    kiln_release(xs[dev]), kiln_release(ls[dev]);
  }
}

TEST(gradients_and_a_training_run_match_the_cpu) { mlp_on_both_devices(30, 1e-4, 1e-4); }

TEST(bad_input_is_a_clear_error) {
  const int64_t s[1] = {3};
  kiln_tensor *c = kiln_ones(KILN_F32, 1, s), *g = gpu(c);
  CHECK_ERROR(kiln_add(c, g), KILN_ERR_DEVICE, "input 0 is on cpu and input 1 on cuda");
  CHECK_ERROR(kiln_matmul(g, c), KILN_ERR_DEVICE, "input 0 is on cuda and input 1 on cpu");
  /* 2^40 floats made on the GPU (a broadcast sum of two 4 MiB columns):
     more than any GPU; the cache is freed, the retry fails.  (Made on the
     CPU first, as this test once did, the host's own memory was the
     question: a lent H200 machine overcommitted 4 TiB of zeros and the
     copy paged for minutes; vm/tensor.c now refuses that.) */
  kiln_tensor *zc = kiln_zeros(KILN_F32, 2, (int64_t[]){1 << 20, 1}),
              *zr = kiln_reshape(zc, 2, (int64_t[]){1, 1 << 20});
  kiln_tensor *zcg = gpu(zc), *zrg = gpu(zr);
  kiln_tensor *e = kiln_add(zcg, zrg);
  CHECK(!e || kiln_eval(1, &e) != KILN_OK);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_OOM);
  CHECK_STR_CONTAINS(kiln_last_error(), "out of GPU memory");
  kiln_clear_error();
  kiln_tensor *after = kiln_add(g, g); /* and the device still works */
  kiln_tensor *two = kiln_mul_scalar(c, 2);
  check_same("after an out-of-memory error", two, after, 0);
  kiln_tensor *all[] = {c, g, zc, zr, zcg, zrg, e, after, two};
  for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
}

/* DESIGN §6 target: the op-by-op path costs at most 10 us per op */
/* A program of the fused-kernel tests below: outputs out[] from inputs in[] */
typedef void (*fused_program)(kiln_tensor *const *in, kiln_tensor **out);

/* Runs prog five times on the CPU inputs and on their GPU copies (after
   the third, the compiler is waited for: later runs use the fused
   kernels); every GPU output must equal the CPU's, before and after.
   Returns the launches per GPU evaluation of the last two runs. */
static double fused_reps(const char *what, fused_program prog, int nin, kiln_tensor *const *cpu,
                         int nout, double rtol) {
  kiln_tensor *dev[8], *oc[16], *og[16];
  for (int i = 0; i < nin; i++) dev[i] = gpu(cpu[i]);
  double launched = 0;
  for (int rep = 0; rep < 5; rep++) {
    prog(cpu, oc);
    prog(dev, og);
    double before = kiln_stat("kernels_launched");
    CHECK_EQ_INT(kiln_eval(nout, og), KILN_OK);
    if (rep >= 3) launched += kiln_stat("kernels_launched") - before;
    if (rep == 2) kiln_jit_wait();
    for (int i = 0; i < nout; i++) {
      char name[96];
      snprintf(name, sizeof name, "%s output %d, rep %d", what, i, rep);
      check_same(name, oc[i], og[i], rtol);
      kiln_release(oc[i]);
      kiln_release(og[i]);
    }
  }
  for (int i = 0; i < nin; i++) kiln_release(dev[i]);
  return launched / 2;
}

/* hot elementwise chains on CUDA run as fused kernels (jit_gpu/fuse.h):
   broadcasts, host scalars, where, a transposed input; IEEE-exact
   arithmetic gives the CPU's bits.  The fused kernels must have been
   built or loaded (kernels_compiled or gpu_disk_loads grows) and the
   results stay the same before and after they are.  in: x, b, g */
static void fused_chain(kiln_tensor *const *in, kiln_tensor **out) {
  kiln_tensor *x = in[0], *b = in[1], *g = in[2];
  /* on x's device: a CPU scalar and a CUDA tensor do not mix (DESIGN §6) */
  kiln_tensor *zero0 = kiln_scalar(0, KILN_F32), *zero = kiln_to_device(zero0, kiln_device_of(x));
  kiln_release(zero0);
  kiln_tensor *h = kiln_add(kiln_mul_scalar(x, 1.5), b);
  kiln_tensor *r = kiln_where(kiln_gt(h, zero), h, zero);
  out[0] = r;
  out[1] = kiln_mul_scalar(kiln_where(kiln_gt(r, zero), g, zero), 0.5);
  out[2] = kiln_sub(h, kiln_maximum(kiln_transpose(kiln_transpose(g, 0, 1), 0, 1), b));
  kiln_release(zero);
}

TEST(fused_plans_match_the_cpu) {
  int64_t s[2] = {300, 257}, r[2] = {1, 257};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 2, s, -2, 2), random_cpu(KILN_F32, 2, r, -1, 1),
                       random_cpu(KILN_F32, 2, s, -1, 1)};
  /* built by NVRTC, or loaded from the disk cache of an earlier run */
  double built = kiln_stat("kernels_compiled") + kiln_stat("gpu_disk_loads");
  fused_reps("fused chain", fused_chain, COUNT(in), in, 3, 0);
  CHECK(kiln_stat("kernels_compiled") + kiln_stat("gpu_disk_loads") > built);
  for (int i = 0; i < COUNT(in); i++) kiln_release(in[i]);
}

/* reduce groups: producers fused into the fold, epilogues after it; long
   reductions (two passes) of both orders.  in: x, b, g, v */
static void fused_reductions(kiln_tensor *const *in, kiln_tensor **out) {
  kiln_tensor *x = in[0], *b = in[1], *g = in[2], *v = in[3];
  const int rows[1] = {1}, cols[1] = {0};
  kiln_tensor *rs = kiln_sum(kiln_add(kiln_mul(x, x), b), 1, rows, true);
  out[0] = kiln_add_scalar(kiln_mul_scalar(rs, 1.0 / 257), 1e-5);
  out[1] = kiln_sum(kiln_abs(kiln_sub(x, g)), 1, cols, false);
  kiln_tensor *d = kiln_sub(x, kiln_max(x, 1, rows, true)), *e = kiln_mul(d, d);
  out[2] = kiln_div(e, kiln_add_scalar(kiln_sum(e, 1, rows, true), 1));
  out[3] = kiln_sum(kiln_mul(v, v), 0, NULL, false);
  out[4] = kiln_min(kiln_mul_scalar(g, 3), 1, cols, true);
}

TEST(fused_reductions_match_the_cpu) {
  int64_t s[2] = {5000, 257}, r[2] = {1, 257}, n[1] = {300001};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 2, s, -2, 2), random_cpu(KILN_F32, 2, r, -1, 1),
                       random_cpu(KILN_F32, 2, s, -1, 1), random_cpu(KILN_F32, 1, n, -1, 1)};
  /* the fused runs: far fewer launches than the op-by-op ones' 21 (8 on
     the emulated device, where epilogues run in their reduction's kernel
     and fills are parameters) */
  double per_rep = fused_reps("fused reduction", fused_reductions, COUNT(in), in, 5, 0);
  printf("fused reductions: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep <= 8);
  for (int i = 0; i < COUNT(in); i++) kiln_release(in[i]);
}

/* SGD on a bias: a column sum whose epilogue reads the bias at the
   output's position, and a mean loss scaled after its sum: each is one
   kernel, the epilogue computed as each result is stored (fuse.h
   gpu_fused.epi_last), not a launch of its own.  in: g, b */
static void reduce_epilogues(kiln_tensor *const *in, kiln_tensor **out) {
  const int rows[1] = {0};
  out[0] = kiln_sub(in[1], kiln_mul_scalar(kiln_sum(in[0], 1, rows, false), 0.05));
  out[1] = kiln_neg(kiln_mul_scalar(kiln_sum(in[1], 0, NULL, false), 1.0 / 300));
}

TEST(reduce_epilogues_are_one_launch) {
  int64_t s[2] = {512, 300}, b[1] = {300};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 2, s, -1, 1), random_cpu(KILN_F32, 1, b, -1, 1)};
  double per_rep = fused_reps("reduce epilogues", reduce_epilogues, COUNT(in), in, 2, 0);
  printf("two reductions with epilogues: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep == 2);
  for (int i = 0; i < COUNT(in); i++) kiln_release(in[i]);
}

/* row kernels (fuse.h GPU_FK_ROWS): layer_norm written by hand (IEEE-exact
   ops: the CPU's bits), one launch per evaluation once compiled; rows of
   300 (one warp each) and of 9000 (several warps fold a row).  in: x, w */
static void fused_rows(kiln_tensor *const *in, kiln_tensor **out) {
  const int last[1] = {1};
  kiln_tensor *d = kiln_sub(in[0], kiln_mean(in[0], 1, last, true));
  kiln_tensor *var = kiln_mean(kiln_mul(d, d), 1, last, true);
  out[0] = kiln_mul(kiln_div(d, kiln_sqrt(kiln_add_scalar(var, 1e-5))), in[1]);
  kiln_release(d);
  kiln_release(var);
}

TEST(fused_rows_match_the_cpu) {
  for (int shape = 0; shape < 2; shape++) {
    int64_t s[2] = {shape ? 7 : 1000, shape ? 9000 : 300}, r[2] = {1, s[1]};
    kiln_tensor *in[] = {random_cpu(KILN_F32, 2, s, -2, 2), random_cpu(KILN_F32, 2, r, -1, 1)};
    char what[64];
    snprintf(what, sizeof what, "layer_norm rows of %lld", (long long)s[1]);
    double per_rep = fused_reps(what, fused_rows, COUNT(in), in, 1, 0);
    printf("%s: %.0f launches per evaluation\n", what, per_rep);
    CHECK(per_rep == 1); /* the row kernel: fills are its parameters, never stored */
    for (int i = 0; i < COUNT(in); i++) kiln_release(in[i]);
  }
}

/* G5's trace: 100 scalar ops, each with a fill of its own.  Fills are not
   run with their group (tr_run_value): the fused kernel takes their
   scalars, so a replay is one launch, not one per fill and op.  in: x */
static void scalar_chain(kiln_tensor *const *in, kiln_tensor **out) {
  kiln_tensor *x = kiln_retain(in[0]);
  for (int k = 0; k < 100; k++) {
    kiln_tensor *next = k % 2 ? kiln_add_scalar(x, 0.01) : kiln_mul_scalar(x, 1.01);
    kiln_release(x);
    x = next;
  }
  out[0] = x;
}

TEST(a_chain_of_scalar_ops_is_one_launch) {
  int64_t s[1] = {16};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 1, s, -2, 2)};
  double per_rep = fused_reps("scalar chain", scalar_chain, COUNT(in), in, 1, 0);
  printf("a chain of 100 scalar ops: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep == 1);
  kiln_release(in[0]);
}

/* relu and clamp of an integer tensor compare with integer weak scalars:
   made in the tensor's dtype (a cast node of one would be a 0-d value on
   the host, the trace "mixed", run op by op: 26 launches).  in: x (i32) */
static void integer_bounds(kiln_tensor *const *in, kiln_tensor **out) {
  out[0] = kiln_relu(in[0]);
  out[1] = kiln_clamp(in[0], -3, 3);
  out[2] = kiln_clamp(in[0], -3e9, 3e9); /* bounds past int32 saturate: the identity */
}

TEST(integer_relu_and_clamp_are_fused) {
  int64_t s[2] = {40, 33};
  kiln_tensor *in[] = {random_cpu(KILN_I32, 2, s, -9, 9)};
  double per_rep = fused_reps("integer relu and clamp", integer_bounds, COUNT(in), in, 3, 0);
  printf("integer relu and clamp: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep == 1);
  kiln_release(in[0]);
}

/* a group with more operands than one kernel takes (fuse.h
   GPU_FUSE_MAX_IO, 12): a chain of two kernels, not one launch per op
   (it once ran op by op: 32 launches).  in: x */
static void wide_group(kiln_tensor *const *in, kiln_tensor **out) {
  for (int k = 0; k < 16; k++) out[k] = kiln_mul_scalar(in[0], 1.5 + k);
}

TEST(a_wide_group_is_a_chain_of_kernels) {
  int64_t s[1] = {1000};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 1, s, -2, 2)};
  double per_rep = fused_reps("16 outputs of one input", wide_group, COUNT(in), in, 16, 0);
  printf("a group of 16 outputs: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep == 2);
  kiln_release(in[0]);
}

/* kiln_softmax takes 1 / sum with a weak scalar 1: made in the sum's
   dtype, not cast on the host (a 0-d host value made the trace "mixed":
   op by op, 8 launches).  Fused, it is a row kernel, its fills parameters.
   exp is CUDA's (or, emulated, the host's libm): within its bound */
static void softmax_rows(kiln_tensor *const *in, kiln_tensor **out) {
  out[0] = kiln_softmax(in[0], -1);
}

TEST(softmax_is_fused) {
  int64_t s[2] = {64, 300};
  kiln_tensor *in[] = {random_cpu(KILN_F32, 2, s, -4, 4)};
  double per_rep = fused_reps("softmax", softmax_rows, COUNT(in), in, 1, TRANSCENDENTAL_RTOL_F32);
  printf("softmax: %.0f launches per evaluation\n", per_rep);
  CHECK(per_rep == 1);
  kiln_release(in[0]);
}

/* bf16 and f16 through the fused path: each half node computed in f32
   and rounded (a host scalar a half parameter), casts among the floats,
   a reduction in f32 between casts; the CPU's bits before and after the
   kernels are built.  in: x (bf16), b (bf16 row), g (f32) */
static void half_chain(kiln_tensor *const *in, kiln_tensor **out) {
  kiln_tensor *x = in[0], *b = in[1], *g = in[2];
  kiln_tensor *h = kiln_add(kiln_mul_scalar(x, 1.5), b);
  out[0] = kiln_relu(h);
  out[1] = kiln_cast(kiln_mul(h, kiln_cast(g, KILN_BF16)), KILN_F32);
  out[2] = kiln_sub(kiln_cast(h, KILN_F16), kiln_mul_scalar(kiln_cast(x, KILN_F16), 0.3));
  out[3] = kiln_sum(kiln_mul(h, h), 1, (const int[]){1}, true);
}

TEST(half_precision_is_fused_and_trains_on_the_device) {
  int64_t s[2] = {300, 257}, r[2] = {1, 257};
  kiln_tensor *in[] = {random_cpu(KILN_BF16, 2, s, -2, 2), random_cpu(KILN_BF16, 2, r, -1, 1),
                       random_cpu(KILN_F32, 2, s, -1, 1)};
  double built = kiln_stat("kernels_compiled") + kiln_stat("gpu_disk_loads");
  fused_reps("half chain", half_chain, COUNT(in), in, 4, 0);
  CHECK(kiln_stat("kernels_compiled") + kiln_stat("gpu_disk_loads") > built);
  for (int i = 0; i < COUNT(in); i++) kiln_release(in[i]);
  /* a half matmul is one cuBLAS GemmEx on the 16-bit values (f32 sums),
     no casts around it; within the dot-product bound of the CPU's */
  for (int h = 0; h < 2; h++) {
    kiln_dtype dt = h ? KILN_F16 : KILN_BF16;
    kiln_tensor *a = random_cpu(dt, 3, (int64_t[]){3, 40, 70}, -2, 2),
                *b = random_cpu(dt, 2, (int64_t[]){70, 33}, -2, 2);
    kiln_tensor *ag = gpu(a), *bg = gpu(b);
    CHECK(kiln_eval(1, &ag) == KILN_OK && kiln_eval(1, &bg) == KILN_OK);
    double calls = kiln_stat("blas_calls"), launched = kiln_stat("kernels_launched");
    kiln_tensor *c = kiln_matmul(a, b), *g = kiln_matmul(ag, bg);
    CHECK(kiln_eval(1, &g) == KILN_OK);
    CHECK_CLOSE(kiln_stat("blas_calls") - calls, 1, 0);
    CHECK_CLOSE(kiln_stat("kernels_launched") - launched, 0, 0); /* no cast kernels */
    check_matmul(h ? "f16 matmul" : "bf16 matmul", a, b, c, g);
    kiln_tensor *all[] = {a, b, ag, bg, c, g};
    for (int i = 0; i < COUNT(all); i++) kiln_release(all[i]);
  }
  /* the MLP of the test above under bf16 autocast (matmuls in bf16, f32
     weights): the GPU follows the CPU's gradients and losses (cuBLAS and
     OpenBLAS sum in other orders, each rounded to bf16) and learns */
  kiln_set_autocast(KILN_BF16);
  mlp_on_both_devices(20, 3e-2, 3e-2);
  kiln_set_autocast(KILN_F32);
}

TEST(overhead_per_op) {
  const int64_t s[1] = {256};
  kiln_tensor *x = gpu(kiln_ones(KILN_F32, 1, s));
  for (int rep = 0; rep < 2; rep++) { /* the first compiles the kernel */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kiln_tensor *y = kiln_retain(x);
    for (int i = 0; i < 1000; i++) {
      kiln_tensor *z = kiln_add_scalar(y, 1);
      kiln_release(y);
      y = z;
    }
    double v = 0;
    kiln_tensor *one = kiln_slice(y, 0, 0, 1, 1), *h = kiln_to_device(one, KILN_CPU);
    kiln_to_buffer(h, &(float){0}, sizeof(float));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    v = kiln_item(h);
    double us =
        ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3 / 1000;
    if (rep == 1) {
      printf("test_gpu_ops: %.2f us per op on the op-by-op path\n", us);
      /* a bound for a GPU: the CPU emulation runs each kernel's threads in turn */
      CHECK(us <= 10 || strstr(kiln_device_info(KILN_CUDA), "emulation"));
    }
    CHECK_CLOSE(v, 1001, 0);
    kiln_release(y), kiln_release(one), kiln_release(h);
  }
  kiln_release(x);
}

/* KILN_DEVICE=cuda: rand/randn made on the GPU give the CPU's Philox numbers */
static int child_rng(void) {
  kiln_manual_seed(77);
  kiln_tensor *u = kiln_rand(KILN_F32, 1, (int64_t[]){1001});
  kiln_tensor *n = kiln_randn(KILN_F64, 1, (int64_t[]){1001});
  if (!u || !n || kiln_device_of(u) != KILN_CUDA) return 2;
  vm_tensor *ru = vm_tensor_new(KILN_F32, 1, (int64_t[]){1001}),
            *rn = vm_tensor_new(KILN_F64, 1, (int64_t[]){1001});
  vm_rng_fill(ru, false, 77, 0);
  vm_rng_fill(rn, true, 77, vm_rng_blocks(1001, KILN_F32));
  int64_t k;
  double *gu = read_f64(u, &k), *gn = read_f64(n, &k);
  int bad = 0;
  for (int i = 0; i < 1001; i++) {
    bad += gu[i] != ((float *)vm_data(ru))[i]; /* uniforms: bit for bit */
    bad += fabs(gn[i] - ((double *)vm_data(rn))[i]) > 1e-12 * fmax(1, fabs(gn[i]));
  }
  if (bad) return 3;
  /* a half's draws are the f32 stream rounded, a 1.0 kept below 1 */
  kiln_manual_seed(78);
  kiln_tensor *h = kiln_rand(KILN_BF16, 1, (int64_t[]){1001});
  vm_tensor *rh = vm_tensor_new(KILN_F32, 1, (int64_t[]){1001});
  vm_rng_fill(rh, false, 78, 0);
  double *gh = read_f64(h, &k);
  for (int i = 0; i < 1001 && k == 1001; i++) {
    uint16_t b = vm_f32_to_bf16(((float *)vm_data(rh))[i]);
    bad += gh[i] != vm_bf16_to_f32(b == 0x3f80 ? 0x3f7f : b);
  }
  return bad || k != 1001 ? 4 : 0;
}

TEST(rand_on_the_gpu_matches_the_cpu_stream) {
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return;
  self[len] = '\0';
  pid_t pid = fork();
  if (pid == 0) {
    setenv("KILN_DEVICE", "cuda", 1);
    execl(self, self, "--rng", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--rng")) return child_rng();
  if (!kiln_device_available(KILN_CUDA)) {
    printf(
        "test_gpu_ops: no CUDA device here (%s); GPU tests skipped: run scripts/gpu-check on a GPU "
        "machine\n",
        kiln_device_info(KILN_CUDA));
    return ktest_done();
  }
  printf("test_gpu_ops: %s\n", kiln_device_info(KILN_CUDA));
  RUN(every_unary_op_and_dtype);
  RUN(every_binary_op_and_dtype_with_broadcasts);
  RUN(where_and_casts_between_every_dtype);
  RUN(reductions_over_every_axis_pattern);
  RUN(matmul_shapes_transposes_and_batches);
  RUN(batched_matmuls_are_one_blas_call_each);
  RUN(attention_is_one_primitive_on_the_device);
  RUN(attention_written_the_long_way_on_the_device);
  RUN(gathers_scatters_concat_and_sorts);
  RUN(out_of_range_index_is_an_error);
  RUN(index_checks_never_wait_for_the_device);
  RUN(rng_streams_match_the_cpu);
  RUN(gradients_and_a_training_run_match_the_cpu);
  RUN(bad_input_is_a_clear_error);
  RUN(fused_plans_match_the_cpu);
  RUN(fused_reductions_match_the_cpu);
  RUN(reduce_epilogues_are_one_launch);
  RUN(fused_rows_match_the_cpu);
  RUN(a_chain_of_scalar_ops_is_one_launch);
  RUN(integer_relu_and_clamp_are_fused);
  RUN(a_wide_group_is_a_chain_of_kernels);
  RUN(softmax_is_fused);
  RUN(half_precision_is_fused_and_trains_on_the_device);
  RUN(overhead_per_op);
  RUN(rand_on_the_gpu_matches_the_cpu_stream);
  return ktest_done();
}
