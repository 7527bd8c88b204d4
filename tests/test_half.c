/* test_half.c — bf16, f16 and u8 (DESIGN §13, issue #41):
 *  - vm/half.h's conversions against references built here from the
 *    formats' definitions: every 16-bit pattern of both formats to f32, and
 *    f32 to each format at every value, midpoint (ties to even) and
 *    neighbour of a midpoint, past the largest finite, subnormals, and
 *    random f32 bit patterns;
 *  - kernels (interpreted, KILN_JIT=0, and compiled) converting as half.h
 *    does, bit for bit, over all 65536 patterns;
 *  - every elementwise op, the reductions and matmul on halves equal to
 *    the op on f32 values rounded once (compute in f32, store rounded);
 *  - fused half kernels equal to the interpreter bit for bit;
 *  - promotion as PyTorch's, u8 arithmetic (wraps), casts (saturate from
 *    floats), gradients in the parameter's dtype. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ktest.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

typedef struct {
  kiln_dtype dt;
  int ebits, mbits; /* exponent and stored significand bits */
} fmt;

static const fmt BF16 = {KILN_BF16, 8, 7}, F16 = {KILN_F16, 5, 10};

static uint16_t to_half(const fmt *f, float x) {
  return f->dt == KILN_BF16 ? vm_f32_to_bf16(x) : vm_f32_to_f16(x);
}

static float from_half(const fmt *f, uint16_t h) {
  return f->dt == KILN_BF16 ? vm_bf16_to_f32(h) : vm_f16_to_f32(h);
}

/* the value of pattern h from the format's definition (NaN for NaNs) */
static double ref_value(const fmt *f, uint16_t h) {
  int bias = (1 << (f->ebits - 1)) - 1;
  int e = (h >> f->mbits) & ((1 << f->ebits) - 1);
  int m = h & ((1 << f->mbits) - 1);
  double sign = (h >> 15) ? -1.0 : 1.0;
  if (e == (1 << f->ebits) - 1) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * ldexp(m, 1 - bias - f->mbits);
  return sign * ldexp((double)((1 << f->mbits) + m), e - bias - f->mbits);
}

/* the finite non-negative values of a format, ascending: patterns 0 ..
   the largest finite (the order of non-negative patterns is the order of
   their values) */
static int finite_count(const fmt *f) { return ((1 << f->ebits) - 1) << f->mbits; }

/* x rounded to the format by the definition: the nearer of the two
   neighbouring values, ties to the even pattern; at or past the largest
   finite plus half its ulp, Inf */
static uint16_t ref_round(const fmt *f, double x) {
  if (isnan(x)) return 0xffff; /* not compared bitwise */
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  int n = finite_count(f);
  double max = ref_value(f, (uint16_t)(n - 1));
  double top = max + (max - ref_value(f, (uint16_t)(n - 2))) / 2;
  if (a >= top) return sign | (uint16_t)n; /* Inf */
  int lo = 0, hi = n - 1;                  /* largest pattern with value <= a */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (ref_value(f, (uint16_t)mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo == n - 1) return sign | (uint16_t)lo;
  double below = ref_value(f, (uint16_t)lo), above = ref_value(f, (uint16_t)(lo + 1));
  int pick = a - below < above - a ? lo : a - below > above - a ? lo + 1 : (lo & 1) ? lo + 1 : lo;
  return sign | (uint16_t)pick;
}

TEST(every_pattern_widens_exactly_and_nans_stay_nans) {
  const fmt *fs[2] = {&BF16, &F16};
  for (int k = 0; k < 2; k++) {
    const fmt *f = fs[k];
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
      float got = from_half(f, (uint16_t)h);
      double want = ref_value(f, (uint16_t)h);
      /* a bf16 widens to its bits << 16 (a NaN too); an f16 NaN is quieted */
      bool ok = isnan(want) ? isnan(got) && (signbit(got) != 0) == (h >> 15) &&
                                  (f->dt == KILN_BF16 ? vm_f32_bits(got) == h << 16
                                                      : (vm_f32_bits(got) & 0x00400000u) != 0)
                            : (double)got == want && (signbit(got) != 0) == (h >> 15);
      /* and back: the same pattern (a NaN: quieted, its sign and payload top kept) */
      uint16_t back = to_half(f, got);
      uint16_t quiet = f->dt == KILN_BF16 ? 0x0040 : 0x0200;
      ok = ok && (isnan(want) ? back == (uint16_t)(h | quiet) : back == h);
      if (!ok && bad++ < 5)
        KTEST_FAIL("%s pattern 0x%04x: %.9g (back 0x%04x), want %.9g", ktest_dtype_name(f->dt), h,
                   (double)got, back, want);
    }
    CHECK_EQ_INT(bad, 0);
  }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

TEST(f32_rounds_to_nearest_even_overflows_to_inf_and_keeps_subnormals) {
  const fmt *fs[2] = {&BF16, &F16};
  for (int k = 0; k < 2; k++) {
    const fmt *f = fs[k];
    int bad = 0, n = finite_count(f);
    float probes[8];
    for (int p = 0; p < n; p++) { /* each value, the midpoints after it, their neighbours */
      double v = ref_value(f, (uint16_t)p);
      double next =
          p + 1 < n ? ref_value(f, (uint16_t)(p + 1)) : v + (v - ref_value(f, (uint16_t)(p - 1)));
      float mid = (float)((v + next) / 2); /* exact in f32: one more bit */
      int np = 0;
      probes[np++] = (float)v;
      probes[np++] = mid;
      probes[np++] = nextafterf(mid, 0);
      probes[np++] = nextafterf(mid, INFINITY);
      probes[np++] = -mid;
      probes[np++] = -nextafterf(mid, INFINITY);
      for (int q = 0; q < np; q++) {
        uint16_t got = to_half(f, probes[q]), want = ref_round(f, probes[q]);
        if (got != want && bad++ < 5)
          KTEST_FAIL("%s of %.9g: 0x%04x, want 0x%04x", ktest_dtype_name(f->dt), (double)probes[q],
                     got, want);
      }
    }
    for (int r = 0; r < 1 << 20; r++) { /* any f32, NaNs aside */
      float x = vm_f32_from_bits(rnd32());
      if (isnan(x)) continue;
      uint16_t got = to_half(f, x), want = ref_round(f, x);
      if (got != want && bad++ < 5)
        KTEST_FAIL("%s of %a: 0x%04x, want 0x%04x", ktest_dtype_name(f->dt), (double)x, got, want);
    }
    CHECK_EQ_INT(bad, 0);
    /* named cases */
    CHECK_EQ_INT(to_half(f, INFINITY), f->dt == KILN_BF16 ? 0x7f80 : 0x7c00);
    CHECK_EQ_INT(to_half(f, -INFINITY), f->dt == KILN_BF16 ? 0xff80 : 0xfc00);
    CHECK(isnan(from_half(f, to_half(f, NAN))));
  }
  CHECK_EQ_INT(vm_f32_to_f16(65504.0f), 0x7bff);
  CHECK_EQ_INT(vm_f32_to_f16(65519.996f), 0x7bff);
  CHECK_EQ_INT(vm_f32_to_f16(65520.0f), 0x7c00); /* the tie goes to the even: Inf */
  CHECK_EQ_INT(vm_f32_to_f16(0x1p-24f), 0x0001); /* the least subnormal */
  CHECK_EQ_INT(vm_f32_to_f16(0x1p-25f), 0x0000); /* half of it: a tie, to even 0 */
  CHECK_EQ_INT(vm_f32_to_f16(0x1.8p-25f), 0x0001);
  CHECK_EQ_INT(vm_f32_to_f16(0x1.8p-24f), 0x0002);   /* 1.5 units: a tie, to even 2 */
  CHECK_EQ_INT(vm_f32_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: a tie, to even 1.0 */
  CHECK_EQ_INT(vm_f32_to_bf16(1.01171875f), 0x3f82); /* 1 + 3*2^-8: a tie, to even */
  CHECK_EQ_INT(vm_f32_to_bf16(3.4e38f), 0x7f80);     /* past bf16's largest: Inf */
}

/* --- through the API -------------------------------------------------------- */

static void set_env(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

static double compiled_count(void) {
  return kiln_stat("compiles") + kiln_stat("disk_hits") + kiln_stat("kernel_cache_hits");
}

/* a tensor's raw bytes (n elements of size es) */
static void *raw(kiln_tensor *t, size_t es) {
  size_t bytes = (size_t)kiln_numel(t) * es;
  void *buf = malloc(bytes ? bytes : 1);
  if (kiln_to_buffer(t, buf, bytes) != 0) KTEST_FAIL("to_buffer: %s", kiln_last_error());
  return buf;
}

static bool same_bits(kiln_tensor *a, kiln_tensor *b, const char *what) {
  if (!a || !b) return false;
  if (kiln_dtype_of(a) != kiln_dtype_of(b) || kiln_numel(a) != kiln_numel(b)) {
    KTEST_FAIL("%s: %s[%lld] against %s[%lld]", what, ktest_dtype_name(kiln_dtype_of(a)),
               (long long)kiln_numel(a), ktest_dtype_name(kiln_dtype_of(b)),
               (long long)kiln_numel(b));
    return false;
  }
  size_t es = ktest_dtype_size(kiln_dtype_of(a));
  void *x = raw(a, es), *y = raw(b, es);
  bool same = memcmp(x, y, (size_t)kiln_numel(a) * es) == 0;
  if (!same) KTEST_FAIL("%s: the bytes differ", what);
  free(x);
  free(y);
  return same;
}

typedef kiln_tensor *(*program_fn)(kiln_tensor *const *in);

/* prog's result bytes with the JIT off, and compiled (its third run, with
   KILN_HOT=1 and KILN_PAYOFF=0: compiled on the first); equal, and the
   compiled runs compiled something */
static void *jit_agrees(program_fn prog, kiln_tensor *const *in, size_t es, bool want_compile,
                        const char *what) {
  kiln_tensor *r0 = prog(in); /* the rest of the tests run with KILN_JIT=0 (main) */
  void *ref = raw(r0, es);
  set_env("KILN_JIT", "1");
  double before = compiled_count();
  void *got = NULL;
  for (int k = 0; k < 3; k++) {
    kiln_tensor *r = prog(in);
    free(got);
    got = raw(r, es);
    kiln_release(r);
  }
  set_env("KILN_JIT", "0");
  if (want_compile && !(compiled_count() > before)) KTEST_FAIL("%s: nothing compiled", what);
  size_t bytes = (size_t)kiln_numel(r0) * es;
  if (memcmp(ref, got, bytes) != 0) {
    size_t i = 0;
    while (((unsigned char *)ref)[i] == ((unsigned char *)got)[i]) i++;
    KTEST_FAIL("%s: compiled differs from interpreted at byte %zu", what, i);
  }
  kiln_release(r0);
  free(got);
  return ref;
}

static kiln_tensor *widen_prog(kiln_tensor *const *in) { return kiln_cast(in[0], KILN_F32); }
static kiln_tensor *narrow(kiln_tensor *x, kiln_dtype dt) {
  kiln_tensor *m = kiln_mul_scalar(x, 1.0), *r = kiln_cast(m, dt); /* computed: not a leaf cast */
  kiln_release(m);
  return r;
}
static kiln_tensor *narrow_bf16_prog(kiln_tensor *const *in) { return narrow(in[0], KILN_BF16); }
static kiln_tensor *narrow_f16_prog(kiln_tensor *const *in) { return narrow(in[0], KILN_F16); }

TEST(kernels_convert_every_pattern_as_half_h_does) {
  const fmt *fs[2] = {&BF16, &F16};
  for (int k = 0; k < 2; k++) {
    const fmt *f = fs[k];
    uint16_t *all = malloc(65536 * sizeof *all);
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
    kiln_tensor *t = kiln_from_data(all, f->dt, 1, S(65536));
    float *w = jit_agrees(widen_prog, &t, 4, true, "widen");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
      if (vm_f32_bits(w[h]) != vm_f32_bits(from_half(f, (uint16_t)h)) && bad++ < 5)
        KTEST_FAIL("%s 0x%04x widened to %a", ktest_dtype_name(f->dt), h, (double)w[h]);
    free(w);
    kiln_release(t);
    /* narrowing: the widened values, their midpoints, neighbours, and random f32s */
    enum { N = 65536 * 3 + 4096 };
    float *x = malloc(N * sizeof *x);
    for (uint32_t h = 0; h < 65536; h++) {
      float v = from_half(f, (uint16_t)h), u = from_half(f, (uint16_t)(h + 1));
      x[3 * h] = v;
      x[3 * h + 1] = isfinite(v) && isfinite(u) ? (float)(((double)v + u) / 2) : v;
      x[3 * h + 2] = nextafterf(x[3 * h + 1], INFINITY);
    }
    for (int r = 65536 * 3; r < N; r++) x[r] = vm_f32_from_bits(rnd32());
    t = kiln_from_data(x, KILN_F32, 1, S(N));
    uint16_t *n =
        jit_agrees(f->dt == KILN_BF16 ? narrow_bf16_prog : narrow_f16_prog, &t, 2, true, "narrow");
    for (int r = 0; r < N; r++) {
      uint16_t want = to_half(f, x[r]);
      if (n[r] != want && bad++ < 5)
        KTEST_FAIL("%s of %a: 0x%04x, want 0x%04x", ktest_dtype_name(f->dt), (double)x[r], n[r],
                   want);
    }
    CHECK_EQ_INT(bad, 0);
    free(n);
    free(x);
    free(all);
    kiln_release(t);
  }
}

/* --- ops compute in f32 and round once ---------------------------------------- */

typedef kiln_tensor *(*unary_api)(kiln_tensor *);
typedef kiln_tensor *(*binary_api)(kiln_tensor *, kiln_tensor *);

static kiln_tensor *half_values(kiln_dtype dt, int64_t n, double lo, double hi, bool specials) {
  float *v = malloc((size_t)n * sizeof *v);
  static const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 65504.0f, 1e-6f, 3.0f};
  for (int64_t i = 0; i < n; i++)
    v[i] = specials && i % 17 == 0 ? sp[(i / 17) % 8]
                                   : (float)(lo + (hi - lo) * (rnd32() / 4294967296.0));
  kiln_tensor *f = kiln_from_data(v, KILN_F32, 1, &n);
  kiln_tensor *h = kiln_cast(f, dt);
  kiln_release(f);
  free(v);
  return h;
}

/* r (a half) equals the f32 result ref rounded to its dtype, bit for bit */
static void check_rounded(kiln_tensor *r, kiln_tensor *ref, kiln_dtype dt, const char *what) {
  CHECK_EQ_INT(kiln_dtype_of(r), dt);
  CHECK_EQ_INT(kiln_dtype_of(ref), KILN_F32);
  int64_t n = kiln_numel(r);
  uint16_t *got = raw(r, 2);
  float *want = raw(ref, 4);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint16_t w = dt == KILN_BF16 ? vm_f32_to_bf16(want[i]) : vm_f32_to_f16(want[i]);
    if (got[i] != w && bad++ < 3)
      KTEST_FAIL("%s %s at %lld: 0x%04x, want 0x%04x (f32 %a)", what, ktest_dtype_name(dt),
                 (long long)i, got[i], w, (double)want[i]);
  }
  free(got);
  free(want);
}

TEST(every_elementwise_op_is_its_f32_op_rounded_once) {
  static const struct {
    const char *name;
    unary_api fn;
  } un[] = {{"neg", kiln_neg},         {"abs", kiln_abs},     {"exp", kiln_exp},
            {"log", kiln_log},         {"sqrt", kiln_sqrt},   {"rsqrt", kiln_rsqrt},
            {"sin", kiln_sin},         {"cos", kiln_cos},     {"tanh", kiln_tanh},
            {"sigmoid", kiln_sigmoid}, {"erf", kiln_erf},     {"log1p", kiln_log1p},
            {"expm1", kiln_expm1},     {"floor", kiln_floor}, {"ceil", kiln_ceil},
            {"round", kiln_round},     {"sign", kiln_sign},   {"relu", kiln_relu}};
  static const struct {
    const char *name;
    binary_api fn;
  } bin[] = {{"add", kiln_add},        {"sub", kiln_sub}, {"mul", kiln_mul},
             {"div", kiln_div},        {"pow", kiln_pow}, {"maximum", kiln_maximum},
             {"minimum", kiln_minimum}};
  const kiln_dtype dts[2] = {KILN_BF16, KILN_F16};
  for (int d = 0; d < 2; d++) {
    kiln_dtype dt = dts[d];
    kiln_tensor *a = half_values(dt, 999, -6, 6, true), *b = half_values(dt, 999, -3, 3, true);
    kiln_tensor *a32 = kiln_cast(a, KILN_F32), *b32 = kiln_cast(b, KILN_F32);
    for (size_t k = 0; k < sizeof un / sizeof un[0]; k++) {
      kiln_tensor *r = un[k].fn(a), *ref = un[k].fn(a32);
      check_rounded(r, ref, dt, un[k].name);
      kiln_release(r);
      kiln_release(ref);
    }
    for (size_t k = 0; k < sizeof bin / sizeof bin[0]; k++) {
      kiln_tensor *r = bin[k].fn(a, b), *ref = bin[k].fn(a32, b32);
      check_rounded(r, ref, dt, bin[k].name);
      kiln_release(r);
      kiln_release(ref);
    }
    /* a host scalar is rounded to the tensor's dtype first (it does not widen it) */
    kiln_tensor *r = kiln_mul_scalar(a, 0.1), *s = kiln_full(0.1, dt, 0, NULL);
    kiln_tensor *s32 = kiln_cast(s, KILN_F32), *ref = kiln_mul(a32, s32);
    check_rounded(r, ref, dt, "mul_scalar");
    kiln_release(r);
    kiln_release(s);
    kiln_release(s32);
    kiln_release(ref);
    /* comparisons and where on the values themselves */
    kiln_tensor *lt = kiln_lt(a, b), *lt32 = kiln_lt(a32, b32);
    kiln_tensor *eq = kiln_eq(lt, lt32), *all = kiln_min(eq, 0, NULL, false);
    CHECK(kiln_item(all) == 1);
    kiln_tensor *w = kiln_where(lt, a, b), *w32 = kiln_where(lt32, a32, b32);
    check_rounded(w, w32, dt, "where");
    kiln_release(lt);
    kiln_release(lt32);
    kiln_release(eq);
    kiln_release(all);
    kiln_release(w);
    kiln_release(w32);
    kiln_release(a);
    kiln_release(b);
    kiln_release(a32);
    kiln_release(b32);
  }
}

TEST(reductions_softmax_and_matmul_accumulate_in_f32) {
  const kiln_dtype dts[2] = {KILN_BF16, KILN_F16};
  for (int d = 0; d < 2; d++) {
    kiln_dtype dt = dts[d];
    kiln_tensor *flat = half_values(dt, 64 * 48, -2, 2, false);
    kiln_tensor *a = kiln_reshape(flat, 2, S(64, 48)), *a32 = kiln_cast(a, KILN_F32);
    int ax1[1] = {1};
    kiln_tensor *r, *ref;
    r = kiln_sum(a, 1, ax1, false), ref = kiln_sum(a32, 1, ax1, false);
    check_rounded(r, ref, dt, "sum");
    kiln_release(r);
    kiln_release(ref);
    r = kiln_max(a, 0, NULL, false), ref = kiln_max(a32, 0, NULL, false);
    check_rounded(r, ref, dt, "max");
    kiln_release(r);
    kiln_release(ref);
    r = kiln_softmax(a, 1), ref = kiln_softmax(a32, 1);
    check_rounded(r, ref, dt, "softmax");
    kiln_release(r);
    kiln_release(ref);
    r = kiln_logsumexp(a, 1, false), ref = kiln_logsumexp(a32, 1, false);
    check_rounded(r, ref, dt, "logsumexp");
    kiln_release(r);
    kiln_release(ref);
    r = kiln_layer_norm(a, NULL, NULL, 1e-5), ref = kiln_layer_norm(a32, NULL, NULL, 1e-5);
    check_rounded(r, ref, dt, "layer_norm");
    kiln_release(r);
    kiln_release(ref);
    r = kiln_mean(a, 1, ax1, false), ref = kiln_mean(a32, 1, ax1, false);
    check_rounded(r, ref, dt, "mean");
    kiln_release(r);
    kiln_release(ref);
    kiln_tensor *at = kiln_transpose(a, 0, 1), *at32 = kiln_transpose(a32, 0, 1);
    r = kiln_matmul(a, at), ref = kiln_matmul(a32, at32);
    check_rounded(r, ref, dt, "matmul");
    /* and near the f64 product, within the dot-product bound of f32
       accumulation (48 terms) plus the final rounding to the half */
    double *p = ktest_values(r), *q = NULL;
    kiln_tensor *a64 = kiln_cast(a, KILN_F64), *at64 = kiln_transpose(a64, 0, 1);
    kiln_tensor *r64 = kiln_matmul(a64, at64);
    q = ktest_values(r64);
    double u = dt == KILN_BF16 ? 0x1p-8 : 0x1p-11, worst = 0;
    for (int64_t i = 0; i < 64 * 64; i++)
      worst = fmax(worst, fabs(p[i] - q[i]) / (fabs(q[i]) + 1e-3));
    CHECK(worst <= u + 48 * 0x1p-24 * 4);
    free(p);
    free(q);
    kiln_release(a64);
    kiln_release(at64);
    kiln_release(r64);
    kiln_release(r);
    kiln_release(ref);
    kiln_release(at);
    kiln_release(at32);
    kiln_release(a);
    kiln_release(a32);
    kiln_release(flat);
  }
}

/* the intermediates of a program, released when it returns */
static kiln_tensor *held[32];
static int nheld;
static kiln_tensor *H(kiln_tensor *t) {
  held[nheld++] = t;
  return t;
}
static kiln_tensor *done(kiln_tensor *result) {
  while (nheld) kiln_release(held[--nheld]);
  return result;
}

/* a chain the JIT fuses into one kernel: loads, math, compares, a
   select, casts in and out, stores of halves */
static kiln_tensor *chain_prog(kiln_tensor *const *in) {
  kiln_tensor *x = in[0], *y = in[1];
  kiln_tensor *e = H(kiln_tanh(H(kiln_add_scalar(H(kiln_mul(x, y)), 0.5))));
  kiln_tensor *g = H(kiln_gelu(x)), *w = H(kiln_where(H(kiln_gt(e, g)), e, g));
  kiln_tensor *d = H(kiln_div(H(kiln_sigmoid(w)), H(kiln_add_scalar(H(kiln_abs(y)), 1.0))));
  return done(kiln_sub(d, H(kiln_exp(H(kiln_neg(H(kiln_abs(x))))))));
}

/* bf16 with f16 is f32; f32 back to each */
static kiln_tensor *mixed_prog(kiln_tensor *const *in) {
  kiln_tensor *a = H(kiln_add(in[0], in[1]));
  kiln_tensor *b = H(kiln_cast(H(kiln_mul(a, a)), KILN_BF16));
  return done(kiln_cast(H(kiln_sub(H(kiln_cast(b, KILN_F16)), in[1])), KILN_F32));
}

/* moves: an embedding lookup (a gather of bf16 rows) and a concat of
   halves, with math on them: compiled as the interpreter moves and rounds */
static kiln_tensor *moves_prog(kiln_tensor *const *in) {
  kiln_tensor *rows = H(kiln_index_select(in[0], 0, in[1])); /* [37, 16] bf16 */
  kiln_tensor *g = H(kiln_gather(in[0], 1, in[2]));          /* [64, 3] bf16 */
  kiln_tensor *parts[2] = {H(kiln_mul_scalar(rows, 1.5)), H(kiln_tanh(rows))};
  kiln_tensor *cat = H(kiln_concat(2, parts, 1)); /* [37, 32] */
  kiln_tensor *s = H(kiln_add_scalar(H(kiln_slice(cat, 1, 0, 3, 1)), 1.0));
  kiln_tensor *gs = H(kiln_slice(g, 0, 0, 37, 1));
  return done(kiln_mul(s, gs));
}

/* a gather that a kernel computes and stores as it is (an embedding
   lookup read again, besides the math on it) moves its bits: a signaling
   NaN stays one, as in the interpreter */
static kiln_tensor *gather_stored_prog(kiln_tensor *const *in) {
  kiln_tensor *g = H(kiln_index_select(in[0], 0, in[1])), *y = H(kiln_mul_scalar(g, 3.0));
  return done(kiln_concat(2, (kiln_tensor *[]){g, y}, 0));
}

TEST(fused_half_kernels_equal_the_interpreter_bit_for_bit) {
  const kiln_dtype dts[2] = {KILN_BF16, KILN_F16};
  for (int d = 0; d < 2; d++) {
    kiln_tensor *in[2] = {half_values(dts[d], 4099, -4, 4, true),
                          half_values(dts[d], 4099, -4, 4, true)};
    free(jit_agrees(chain_prog, in, 2, true, dts[d] == KILN_BF16 ? "bf16 chain" : "f16 chain"));
    kiln_release(in[0]);
    kiln_release(in[1]);
  }
  kiln_tensor *in[2] = {half_values(KILN_BF16, 4099, -4, 4, true),
                        half_values(KILN_F16, 4099, -4, 4, true)};
  free(jit_agrees(mixed_prog, in, 4, true, "bf16 with f16"));
  kiln_release(in[0]);
  kiln_release(in[1]);
  for (int d = 0; d < 2; d++) {
    kiln_tensor *flat = half_values(dts[d], 64 * 16, -4, 4, true);
    int64_t iv[37], gv[64 * 3];
    for (int i = 0; i < 37; i++) iv[i] = (i * 17) % 64;
    for (int i = 0; i < 64 * 3; i++) gv[i] = (i * 7) % 16;
    kiln_tensor *mv[3] = {kiln_reshape(flat, 2, S(64, 16)), kiln_from_data(iv, KILN_I64, 1, S(37)),
                          kiln_from_data(gv, KILN_I64, 2, S(64, 3))};
    free(jit_agrees(moves_prog, mv, 2, true, dts[d] == KILN_BF16 ? "bf16 moves" : "f16 moves"));
    for (int i = 0; i < 3; i++) kiln_release(mv[i]);
    kiln_release(flat);
  }
  for (int d = 0; d < 2; d++) { /* signaling NaNs (and quiet ones, Inf, numbers) gathered */
    uint16_t bits[64];
    int64_t iv[40];
    for (int i = 0; i < 64; i++)
      bits[i] = dts[d] == KILN_F16 ? (uint16_t)(i % 4 == 0   ? 0x7c01 + i /* sNaN */
                                                : i % 4 == 1 ? 0xfe00 + i /* qNaN */
                                                             : 0x3c00 + i)
                                   : (uint16_t)(i % 4 == 0   ? 0x7f81 + i /* sNaN */
                                                : i % 4 == 1 ? 0xffc0 + i /* qNaN */
                                                             : 0x3f80 + i);
    for (int i = 0; i < 40; i++) iv[i] = (i * 13) % 64;
    kiln_tensor *src[2] = {kiln_from_data(bits, dts[d], 1, S(64)),
                           kiln_from_data(iv, KILN_I64, 1, S(40))};
    uint16_t *got = jit_agrees(gather_stored_prog, src, 2, true,
                               dts[d] == KILN_BF16 ? "bf16 gather stored" : "f16 gather stored");
    for (int i = 0; got && i < 40;
         i++) /* the interpreter's (and so the kernel's) are the source's */
      if (got[i] != bits[iv[i]]) {
        KTEST_FAIL("%s gather %d: 0x%04x, the source's 0x%04x", ktest_dtype_name(dts[d]), i, got[i],
                   bits[iv[i]]);
        break;
      }
    free(got);
    kiln_release(src[0]), kiln_release(src[1]);
  }
}

/* --- promotion, u8 -------------------------------------------------------------- */

TEST(promotion_follows_pytorch) {
  static const struct {
    kiln_dtype a, b, want;
  } rules[] = {
      {KILN_BF16, KILN_F16, KILN_F32}, {KILN_BF16, KILN_F32, KILN_F32},
      {KILN_F16, KILN_F64, KILN_F64},  {KILN_BF16, KILN_I64, KILN_BF16},
      {KILN_F16, KILN_I32, KILN_F16},  {KILN_F16, KILN_BOOL, KILN_F16},
      {KILN_U8, KILN_BOOL, KILN_U8},   {KILN_U8, KILN_I32, KILN_I32},
      {KILN_U8, KILN_I64, KILN_I64},   {KILN_U8, KILN_BF16, KILN_BF16},
      {KILN_U8, KILN_F32, KILN_F32},   {KILN_BF16, KILN_BF16, KILN_BF16},
      {KILN_U8, KILN_I8, KILN_I16},    {KILN_I8, KILN_I16, KILN_I16},
      {KILN_I8, KILN_BOOL, KILN_I8},   {KILN_U8, KILN_I16, KILN_I16},
      {KILN_I16, KILN_I32, KILN_I32},  {KILN_I8, KILN_I64, KILN_I64},
      {KILN_I8, KILN_F16, KILN_F16},   {KILN_I16, KILN_BF16, KILN_BF16},
      {KILN_I16, KILN_F64, KILN_F64},
  };
  for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
    kiln_tensor *a = kiln_ones(rules[k].a, 1, S(2)), *b = kiln_ones(rules[k].b, 1, S(2));
    kiln_tensor *r = kiln_add(a, b), *q = kiln_add(b, a);
    CHECK_EQ_INT(kiln_dtype_of(r), rules[k].want);
    CHECK_EQ_INT(kiln_dtype_of(q), rules[k].want);
    kiln_release(a);
    kiln_release(b);
    kiln_release(r);
    kiln_release(q);
  }
  /* weak host scalars keep the tensor's dtype; true division of u8 is f32 */
  kiln_tensor *h = kiln_ones(KILN_BF16, 1, S(2)), *u = kiln_ones(KILN_U8, 1, S(2));
  kiln_tensor *r1 = kiln_mul_scalar(h, 3.7), *r2 = kiln_add_scalar(u, 1), *r3 = kiln_div(u, u);
  CHECK_EQ_INT(kiln_dtype_of(r1), KILN_BF16);
  CHECK_EQ_INT(kiln_dtype_of(r2), KILN_F32); /* a double scalar with integers: f32 */
  CHECK_EQ_INT(kiln_dtype_of(r3), KILN_F32);
  kiln_tensor *e = kiln_exp(u);
  CHECK_EQ_INT(kiln_dtype_of(e), KILN_F32);
  kiln_release(h);
  kiln_release(u);
  kiln_release(r1);
  kiln_release(r2);
  kiln_release(r3);
  kiln_release(e);
}

TEST(u8_wraps_saturates_from_floats_and_sums_to_i64) {
  const uint8_t av[6] = {0, 1, 200, 255, 128, 7}, bv[6] = {0, 255, 100, 1, 128, 9};
  kiln_tensor *a = kiln_from_data(av, KILN_U8, 1, S(6)), *b = kiln_from_data(bv, KILN_U8, 1, S(6));
  kiln_tensor *s = kiln_add(a, b), *d = kiln_sub(a, b), *m = kiln_mul(a, b), *n = kiln_neg(a);
  kiln_tensor *ab = kiln_abs(a), *sg = kiln_sign(a), *mx = kiln_maximum(a, b);
  uint8_t *got;
  const struct {
    kiln_tensor *t;
    uint8_t want[6];
  } cases[] = {{s, {0, 0, 44, 0, 0, 16}},       {d, {0, 2, 100, 254, 0, 254}},
               {m, {0, 255, 32, 255, 0, 63}},   {n, {0, 255, 56, 1, 128, 249}},
               {ab, {0, 1, 200, 255, 128, 7}},  {sg, {0, 1, 1, 1, 1, 1}},
               {mx, {0, 255, 200, 255, 128, 9}}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    CHECK_EQ_INT(kiln_dtype_of(cases[k].t), KILN_U8);
    got = raw(cases[k].t, 1);
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(got[i], cases[k].want[i]);
    free(got);
    kiln_release(cases[k].t);
  }
  kiln_tensor *sum = kiln_sum(a, 0, NULL, false), *mxr = kiln_max(a, 0, NULL, false);
  CHECK_EQ_INT(kiln_dtype_of(sum), KILN_I64);
  CHECK(kiln_item(sum) == 591);
  CHECK_EQ_INT(kiln_dtype_of(mxr), KILN_U8);
  CHECK(kiln_item(mxr) == 255);
  kiln_tensor *am = kiln_argmax(a, 0, false);
  CHECK(kiln_item(am) == 3);
  /* float -> u8 saturates (NaN -> 0); int -> u8 wraps; u8 -> half exact */
  const float fv[6] = {-3.5f, 0.9f, 254.9f, 1e9f, NAN, 17.0f};
  kiln_tensor *f = kiln_from_data(fv, KILN_F32, 1, S(6)), *fu = kiln_cast(f, KILN_U8);
  got = raw(fu, 1);
  const uint8_t fwant[6] = {0, 0, 254, 255, 0, 17};
  for (int i = 0; i < 6; i++) CHECK_EQ_INT(got[i], fwant[i]);
  free(got);
  const int32_t iv[3] = {-1, 256, 300};
  kiln_tensor *it = kiln_from_data(iv, KILN_I32, 1, S(3)), *iu = kiln_cast(it, KILN_U8);
  got = raw(iu, 1);
  CHECK_EQ_INT(got[0], 255);
  CHECK_EQ_INT(got[1], 0);
  CHECK_EQ_INT(got[2], 44);
  free(got);
  /* uint8 is no index; its matmul wraps as its products and sums do */
  CHECK_ERROR(kiln_index_select(a, 0, a), KILN_ERR_DTYPE, "int32 or int64");
  kiln_tensor *a2 = kiln_reshape(a, 2, S(2, 3)), *b2 = kiln_reshape(b, 2, S(3, 2));
  kiln_tensor *ab8 = kiln_matmul(a2, b2), *a64 = kiln_cast(a2, KILN_I64),
              *b64 = kiln_cast(b2, KILN_I64), *ab64 = kiln_matmul(a64, b64),
              *wrapped = kiln_cast(ab64, KILN_U8);
  CHECK_EQ_INT(kiln_dtype_of(ab8), KILN_U8);
  same_bits(ab8, wrapped, "u8 matmul");
  kiln_release(ab8), kiln_release(a64), kiln_release(b64), kiln_release(ab64),
      kiln_release(wrapped);
  kiln_release(a2);
  kiln_release(b2);
  kiln_release(sum);
  kiln_release(mxr);
  kiln_release(am);
  kiln_release(f);
  kiln_release(fu);
  kiln_release(it);
  kiln_release(iu);
  kiln_release(a);
  kiln_release(b);
}

/* --- autodiff ------------------------------------------------------------------- */

/* a bf16 matmul (vm/gemm_bf16.c on CPUs with AVX512-BF16, else f32 sgemm
   between casts) at shapes off the kernel's 8 x 32 blocks, with transposed
   and batched operands: each element within the bound of an f32 sum of k
   products plus one rounding to bf16, and an element's bits the same
   whatever block of C it was computed in (rows of A alone give the rows of
   the whole product) */
TEST(bf16_matmul_is_within_the_dot_product_bound_at_any_shape) {
  /* {70, 64, 45}: on AMX, two 32-row blocks read from A in place and a
     packed tail of 6 */
  static const int64_t shapes[][3] = {{1, 1, 1}, {13, 19, 37},    {8, 32, 32}, {65, 130, 70},
                                      {3, 1, 5}, {200, 301, 130}, {70, 64, 45}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
    for (int variant = 0; variant < 3; variant++) { /* plain, A and B transposed, batched */
      kiln_tensor *fa = half_values(KILN_BF16, 2 * m * k, -2, 2, false),
                  *fb = half_values(KILN_BF16, 2 * k * n, -2, 2, false);
      kiln_tensor *a, *b;
      if (variant == 1) { /* views: A = (k x m)^T, B = (n x k)^T */
        kiln_tensor *ka = kiln_slice(fa, 0, 0, m * k, 1), *kb = kiln_slice(fb, 0, 0, k * n, 1);
        kiln_tensor *ra = kiln_reshape(ka, 2, S(k, m)), *rb = kiln_reshape(kb, 2, S(n, k));
        a = kiln_transpose(ra, 0, 1), b = kiln_transpose(rb, 0, 1);
        kiln_release(ka), kiln_release(kb), kiln_release(ra), kiln_release(rb);
      } else if (variant == 2) {
        a = kiln_reshape(fa, 3, S(2, m, k)), b = kiln_reshape(fb, 3, S(2, k, n));
      } else {
        kiln_tensor *ka = kiln_slice(fa, 0, 0, m * k, 1), *kb = kiln_slice(fb, 0, 0, k * n, 1);
        a = kiln_reshape(ka, 2, S(m, k)), b = kiln_reshape(kb, 2, S(k, n));
        kiln_release(ka), kiln_release(kb);
      }
      kiln_tensor *r = kiln_matmul(a, b);
      kiln_tensor *a64 = kiln_cast(a, KILN_F64), *b64 = kiln_cast(b, KILN_F64);
      kiln_tensor *aa = kiln_abs(a64), *ab = kiln_abs(b64);
      kiln_tensor *r64 = kiln_matmul(a64, b64), *s64 = kiln_matmul(aa, ab);
      CHECK_EQ_INT(kiln_dtype_of(r), KILN_BF16);
      double *got = ktest_values(r), *want = ktest_values(r64), *mag = ktest_values(s64);
      int bad = 0;
      for (int64_t i = 0; i < kiln_numel(r); i++) {
        double bound = 0x1p-8 * fabs(want[i]) + 1.01 * (double)(k + 1) * 0x1p-24 * mag[i];
        if (!(fabs(got[i] - want[i]) <= bound) && bad++ < 3)
          KTEST_FAIL("%lldx%lldx%lld variant %d at %lld: %.9g, f64 %.9g (bound %.3g)", (long long)m,
                     (long long)k, (long long)n, variant, (long long)i, got[i], want[i], bound);
      }
      if (variant == 0 && m > 1) { /* rows 1.. of A alone: the same bits as in the whole */
        kiln_tensor *tail = kiln_slice(a, 0, 1, m, 1), *rt = kiln_matmul(tail, b);
        kiln_tensor *whole = kiln_slice(r, 0, 1, m, 1), *wc = kiln_clone(whole);
        same_bits(rt, wc, "rows of A alone");
        kiln_release(tail), kiln_release(rt), kiln_release(whole), kiln_release(wc);
      }
      free(got), free(want), free(mag);
      kiln_tensor *all[] = {fa, fb, a, b, r, a64, b64, aa, ab, r64, s64};
      for (size_t q = 0; q < sizeof all / sizeof all[0]; q++) kiln_release(all[q]);
    }
  }
}

/* a bf16 matmul rounds each f32 sum once to nearest even, in every lane and
   at a row's ragged end: ties go to the even neighbour, past them up;
   Inf and NaN come through, an f32 overflow is Inf */
TEST(bf16_matmul_rounds_ties_to_even_and_keeps_inf_and_nan) {
  enum { M = 3, N = 19 };
  /* column j's (b0, b1) against each row's (2^r, 2^r), and what 2^r (b0 + b1) rounds to over 2^r */
  static const double cols[][3] = {
      {1, 0x1p-8, 1},                     /* a tie: to the even 1 */
      {1 + 0x1p-7, 0x1p-8, 1 + 0x1p-6},   /* a tie: to the even 1 + 2^-6 */
      {1, 0x3p-9, 1 + 0x1p-7},            /* past the tie: up */
      {-1, -0x1p-8, -1},                  /* a negative tie */
      {INFINITY, 0, INFINITY},            /* Inf */
      {-INFINITY, 1, -INFINITY},          /* -Inf */
      {NAN, 1, NAN},                      /* NaN */
      {INFINITY, -INFINITY, NAN},         /* Inf - Inf */
      {0x1.fep127, 0x1.fep127, INFINITY}, /* past f32's largest: Inf (row 0) */
      {1 + 0x1p-6, 0x1p-8, 1 + 0x1p-6},   /* below the tie: down */
  };
  const int nc = (int)(sizeof cols / sizeof cols[0]);
  double a[M * 2], b[2 * N];
  for (int r = 0; r < M; r++) a[2 * r] = a[2 * r + 1] = ldexp(1, r);
  for (int j = 0; j < N; j++) { /* the cases at columns j and j + 10, the rest 1 */
    int c = j % 10;
    b[j] = c < nc ? cols[c][0] : 1;
    b[N + j] = c < nc ? cols[c][1] : 0;
  }
  kiln_tensor *a64 = kiln_from_data(a, KILN_F64, 2, S(M, 2)),
              *b64 = kiln_from_data(b, KILN_F64, 2, S(2, N));
  kiln_tensor *ah = kiln_cast(a64, KILN_BF16), *bh = kiln_cast(b64, KILN_BF16);
  kiln_tensor *r = kiln_matmul(ah, bh);
  double *got = ktest_values(r);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      int c = j % 10;
      double want = c < nc ? cols[c][2] : 1;
      if (c == 8 && i > 0) continue; /* only row 0 is set up for the overflow */
      want = isnan(want) || isinf(want) ? want : ldexp(want, i);
      double g = got[i * N + j];
      bool ok = isnan(want) ? isnan(g) : g == want;
      if (!ok) KTEST_FAIL("row %d column %d: %.9g, want %.9g", i, j, g, want);
    }
  free(got);
  kiln_release(a64), kiln_release(b64), kiln_release(ah), kiln_release(bh), kiln_release(r);
}

/* int8 and int16 as PyTorch's: arithmetic wraps, floats saturate into
   them, sums are i64, and matmul wraps; sort, max and argmax order the
   negatives right */
TEST(int8_and_int16_wrap_saturate_and_sum_to_i64) {
  const int8_t av[4] = {127, -128, -3, 100};
  const int16_t bv[4] = {32767, -32768, 300, -7};
  kiln_tensor *a = kiln_from_data(av, KILN_I8, 1, S(4)), *b = kiln_from_data(bv, KILN_I16, 1, S(4));
  kiln_tensor *one8 = kiln_ones(KILN_I8, 1, S(4)), *one16 = kiln_ones(KILN_I16, 1, S(4));
  kiln_tensor *a1 = kiln_add(a, one8), *na = kiln_neg(a), *aa = kiln_abs(a), *aa2 = kiln_mul(a, a);
  kiln_tensor *b1 = kiln_add(b, one16), *bb = kiln_mul(b, b), *ab = kiln_add(a, b);
  static const struct {
    int slot;
    int64_t want[4];
  } cases8[] = {{0, {-128, -127, -2, 101}}, /* 127 + 1 wraps */
                {1, {-127, -128, 3, -100}}, /* -(-128) is -128 */
                {2, {127, -128, 3, 100}},
                {3, {1, 0, 9, 16}}}; /* 127^2 = 16129 = 63*256 + 1; 100^2 = 10000 -> 16 */
  kiln_tensor *t8[] = {a1, na, aa, aa2};
  for (int k = 0; k < 4; k++) {
    CHECK_EQ_INT(kiln_dtype_of(t8[cases8[k].slot]), KILN_I8);
    int8_t *g = raw(t8[cases8[k].slot], 1);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(g[i], cases8[k].want[i]);
    free(g);
  }
  int16_t *g16 = raw(b1, 2);
  CHECK_EQ_INT(g16[0], -32768);
  CHECK_EQ_INT(g16[2], 301);
  free(g16);
  g16 = raw(bb, 2); /* 300^2 = 90000 = 65536 + 24464; 32767^2 wraps to 1 */
  CHECK_EQ_INT(g16[0], 1);
  CHECK_EQ_INT(g16[1], 0);
  CHECK_EQ_INT(g16[2], 24464);
  CHECK_EQ_INT(g16[3], 49);
  free(g16);
  CHECK_EQ_INT(kiln_dtype_of(ab), KILN_I16);
  g16 = raw(ab, 2); /* i8 widens exactly, then i16 wraps */
  CHECK_EQ_INT(g16[0], -32768 + 126);
  CHECK_EQ_INT(g16[1], 32767 - 127);
  CHECK_EQ_INT(g16[2], 297);
  CHECK_EQ_INT(g16[3], 93);
  free(g16);
  /* float -> int8 / int16 saturates, NaN -> 0; int -> int8 wraps */
  const float fv[5] = {200.5f, -1e9f, NAN, -3.9f, 40000.0f};
  kiln_tensor *f = kiln_from_data(fv, KILN_F32, 1, S(5));
  kiln_tensor *f8 = kiln_cast(f, KILN_I8), *f16 = kiln_cast(f, KILN_I16);
  const int64_t w8[5] = {127, -128, 0, -3, 127}, w16[5] = {200, -32768, 0, -3, 32767};
  int8_t *h8 = raw(f8, 1);
  int16_t *h16 = raw(f16, 2);
  for (int i = 0; i < 5; i++) {
    CHECK_EQ_INT(h8[i], w8[i]);
    CHECK_EQ_INT(h16[i], w16[i]);
  }
  free(h8);
  free(h16);
  const int32_t iv[3] = {200, -129, 70000};
  kiln_tensor *i32 = kiln_from_data(iv, KILN_I32, 1, S(3)), *i8 = kiln_cast(i32, KILN_I8),
              *i16 = kiln_cast(i32, KILN_I16);
  h8 = raw(i8, 1);
  h16 = raw(i16, 2);
  CHECK_EQ_INT(h8[0], -56);
  CHECK_EQ_INT(h8[1], 127);
  CHECK_EQ_INT(h8[2], 112);
  CHECK_EQ_INT(h16[2], 4464);
  free(h8);
  free(h16);
  /* reductions: sum in i64, max/min/argmax/sort over negatives */
  kiln_tensor *s = kiln_sum(a, 0, NULL, false), *mx = kiln_max(a, 0, NULL, false),
              *mn = kiln_min(b, 0, NULL, false), *am = kiln_argmin(a, 0, false);
  CHECK_EQ_INT(kiln_dtype_of(s), KILN_I64);
  CHECK(kiln_item(s) == 96);
  CHECK_EQ_INT(kiln_dtype_of(mx), KILN_I8);
  CHECK(kiln_item(mx) == 127);
  CHECK(kiln_item(mn) == -32768);
  CHECK(kiln_item(am) == 1);
  kiln_tensor *order = NULL, *sorted = kiln_sort(b, 0, false, &order);
  int64_t *o = raw(order, 8);
  int16_t *sv = raw(sorted, 2);
  const int64_t wo[4] = {1, 3, 2, 0};
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(o[i], wo[i]);
  CHECK_EQ_INT(sv[0], -32768);
  CHECK_EQ_INT(sv[3], 32767);
  free(o);
  free(sv);
  /* matmul wraps: [[100, 100]] @ [[2], [1]] = 300 -> 44 */
  const int8_t mv[2] = {100, 100}, nv[2] = {2, 1};
  kiln_tensor *m = kiln_from_data(mv, KILN_I8, 2, S(1, 2)),
              *n = kiln_from_data(nv, KILN_I8, 2, S(2, 1));
  kiln_tensor *mn8 = kiln_matmul(m, n);
  CHECK_EQ_INT(kiln_dtype_of(mn8), KILN_I8);
  CHECK(kiln_item(mn8) == 44);
  /* where keeps int8 */
  kiln_tensor *gt = kiln_gt(a, one8), *w = kiln_where(gt, a, one8);
  CHECK_EQ_INT(kiln_dtype_of(w), KILN_I8);
  kiln_tensor *all[] = {a,   b,  one8, one16, a1, na, aa, aa2,   b1,     bb, ab, f,   f8, f16,
                        i32, i8, i16,  s,     mx, mn, am, order, sorted, m,  n,  mn8, gt, w};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) kiln_release(all[k]);
}

TEST(gradients_come_in_the_parameters_dtype) {
  const kiln_dtype dts[2] = {KILN_BF16, KILN_F16};
  for (int d = 0; d < 2; d++) {
    kiln_dtype dt = dts[d];
    const float xv[4] = {0.5f, -1.25f, 3.0f, 0.1f};
    kiln_tensor *x32 = kiln_from_data(xv, KILN_F32, 1, S(4)), *x = kiln_cast(x32, dt);
    kiln_tensor *xl = kiln_detach(x);
    CHECK(kiln_set_requires_grad(xl, true) == KILN_OK);
    kiln_tensor *sq = kiln_mul(xl, xl), *loss = kiln_sum(sq, 0, NULL, false);
    CHECK_EQ_INT(kiln_dtype_of(loss), dt);
    CHECK(kiln_backward(loss, NULL) == KILN_OK);
    kiln_tensor *g = kiln_grad(xl);
    CHECK(g != NULL);
    if (g) {
      CHECK_EQ_INT(kiln_dtype_of(g), dt);
      double *gv = ktest_values(g), *xr = ktest_values(xl);
      for (int i = 0; i < 4; i++) CHECK(gv[i] == ktest_as_dtype(dt, 2 * xr[i]));
      free(gv);
      free(xr);
    }
    /* through a cast: an f32 parameter used in bf16 gets an f32 gradient */
    kiln_tensor *p = kiln_detach(x32);
    CHECK(kiln_set_requires_grad(p, true) == KILN_OK);
    kiln_tensor *ph = kiln_cast(p, dt), *p3 = kiln_mul_scalar(ph, 3.0);
    kiln_tensor *l2 = kiln_sum(p3, 0, NULL, false);
    CHECK(kiln_backward(l2, NULL) == KILN_OK);
    kiln_tensor *gp = kiln_grad(p);
    CHECK(gp && kiln_dtype_of(gp) == KILN_F32);
    if (gp) {
      double *gv = ktest_values(gp);
      for (int i = 0; i < 4; i++) CHECK(gv[i] == 3.0);
      free(gv);
    }
    kiln_release(gp);
    kiln_release(p3);
    kiln_release(ph);
    kiln_release(l2);
    kiln_release(p);
    kiln_release(g);
    kiln_release(sq);
    kiln_release(loss);
    kiln_release(xl);
    kiln_release(x);
    kiln_release(x32);
  }
}

/* --- safetensors --------------------------------------------------------------- */

/* a and b hold the same bytes (and dtype and count) */

/* the fixture PyTorch wrote (tests/fixtures/make_half.py): its halves widen
   to PyTorch's f32 values, f32 rounds to PyTorch's halves bit for bit, the
   narrow integers widen exactly; and all of it saves and loads back the
   same */
TEST(a_pytorch_checkpoint_of_halves_and_bytes_loads_to_the_same_bits) {
  ktest_file f;
  if (!ktest_file_load(&f, KILN_FIXTURES "/half_torch.safetensors")) return;
  const char *pairs[][3] = {{"bf16", "bf16_f32", "f32"}, {"f16", "f16_f32", "f32"},
                            {"i8", "i8_i64", "i64"},     {"i16", "i16_i64", "i64"},
                            {"u16", "u16_i64", "i64"},   {"u32", "u32_i64", "i64"}};
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    kiln_tensor *a = ktest_file_get(&f, pairs[k][0]), *want = ktest_file_get(&f, pairs[k][1]);
    if (!a || !want) continue;
    kiln_tensor *c = kiln_cast(a, kiln_dtype_of(want));
    same_bits(c, want, pairs[k][0]);
    kiln_release(c);
  }
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "bf16")), KILN_BF16);
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "f16")), KILN_F16);
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "u8")), KILN_U8);
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "i8")), KILN_I8);
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "i16")), KILN_I16);
  CHECK_EQ_INT(kiln_dtype_of(ktest_file_get(&f, "u32")), KILN_I64);
  kiln_tensor *src = ktest_file_get(&f, "src");
  kiln_tensor *b = kiln_cast(src, KILN_BF16), *h = kiln_cast(src, KILN_F16);
  same_bits(b, ktest_file_get(&f, "src_bf16"), "f32 -> bf16 as PyTorch rounds");
  same_bits(h, ktest_file_get(&f, "src_f16"), "f32 -> f16 as PyTorch rounds");
  kiln_release(b);
  kiln_release(h);
  uint8_t *u = raw(ktest_file_get(&f, "u8"), 1);
  for (int i = 0; i < 256; i++) CHECK_EQ_INT(u[i], i);
  free(u);
  /* written back (bf16, f16, u8 as themselves) and read again: the same */
  char path[] = "/tmp/kiln-half-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK(kiln_save(path, f.n, (const char *const *)f.names, f.ts) == KILN_OK);
  ktest_file g;
  if (ktest_file_load(&g, path)) {
    CHECK_EQ_INT(g.n, f.n);
    for (int i = 0; i < g.n; i++) same_bits(ktest_file_get(&f, g.names[i]), g.ts[i], g.names[i]);
    ktest_file_free(&g);
  }
  unlink(path);
  ktest_file_free(&f);
}

TEST(a_u64_past_int64_and_unknown_dtypes_are_clear_errors) {
  static const struct {
    const char *header, *needle;
  } bad[] = {
      {"{\"x\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", "does not fit int64"},
      {"{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}",
       "unsupported dtype \"F8_E4M3\""},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char path[] = "/tmp/kiln-half-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    uint64_t len = strlen(bad[k].header), big = UINT64_MAX;
    CHECK(write(fd, &len, 8) == 8);
    CHECK(write(fd, bad[k].header, len) == (ssize_t)len);
    CHECK(write(fd, &big, 8) == 8);
    close(fd);
    kiln_tensor *t = NULL;
    char *name = NULL;
    CHECK(kiln_load(path, 1, &name, &t) < 0);
    CHECK_STR_CONTAINS(kiln_last_error(), bad[k].needle);
    free(name);
    kiln_release(t);
    unlink(path);
  }
}

/* --- mixed precision ------------------------------------------------------------ */

/* under autocast a matmul of f32 operands is the matmul of their bf16
   roundings, its result bf16; the f32 parameters get f32 gradients; off,
   everything is f32 again */
TEST(autocast_runs_matmuls_in_the_half_dtype_with_f32_gradients) {
  CHECK_EQ_INT(kiln_autocast_dtype(), KILN_F32);
  CHECK_EQ_INT(kiln_set_autocast(KILN_I32), KILN_ERR_DTYPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "autocast is to bfloat16 or float16");
  CHECK_EQ_INT(kiln_autocast_dtype(), KILN_F32);
  kiln_tensor *a = half_values(KILN_F32, 48 * 32, -2, 2, false);
  kiln_tensor *b = half_values(KILN_F32, 32 * 16, -2, 2, false);
  kiln_tensor *a2 = kiln_reshape(a, 2, S(48, 32)), *b2 = kiln_reshape(b, 2, S(32, 16));
  kiln_tensor *w = kiln_detach(b2);
  CHECK(kiln_set_requires_grad(w, true) == KILN_OK);
  CHECK(kiln_set_autocast(KILN_BF16) == KILN_OK);
  CHECK_EQ_INT(kiln_autocast_dtype(), KILN_BF16);
  kiln_tensor *y = kiln_matmul(a2, w);
  CHECK(kiln_set_autocast(KILN_F32) == KILN_OK);
  CHECK_EQ_INT(kiln_dtype_of(y), KILN_BF16);
  kiln_tensor *ah = kiln_cast(a2, KILN_BF16), *bh = kiln_cast(b2, KILN_BF16);
  kiln_tensor *want = kiln_matmul(ah, bh);
  same_bits(y, want, "autocast matmul");
  kiln_tensor *loss = kiln_sum(y, 0, NULL, false);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *g = kiln_grad(w);
  CHECK(g && kiln_dtype_of(g) == KILN_F32);
  kiln_tensor *y32 = kiln_matmul(a2, w); /* off again: f32 */
  CHECK_EQ_INT(kiln_dtype_of(y32), KILN_F32);
  kiln_release(y32);
  kiln_release(g);
  kiln_release(loss);
  kiln_release(want);
  kiln_release(ah);
  kiln_release(bh);
  kiln_release(y);
  kiln_release(w);
  kiln_release(a2);
  kiln_release(b2);
  kiln_release(a);
  kiln_release(b);
}

/* Layers of an MLP block under autocast, as a user writes them (an
   affine norm, a linear layer: the weight's transpose, then the matmul,
   which casts the activation and the weight to bf16; GELU; a linear
   layer; the residual): rolled into one loop, whose step trace is in
   record order, each weight's transpose recorded between the activation's
   work and its cast.  The weights' casts are planned first (trace/plan.c
   plan_order), so each activation's cast joins the loop nest that
   computes it: 29 kernels a run (the first layer's norm before the loop,
   then 7 a layer, for 3 steps and the layer after them: the two weights'
   casts, the fills, the norm with its cast, bias with GELU and its cast,
   bias with the residual and the next norm's scale), nothing but the
   matmuls on the interpreter, where the casts planned in record order
   made 35 kernels.  The bits are the interpreter's. */
static void mlp_layers(kiln_tensor *x, kiln_tensor *const *p, float *out, int64_t n) {
  kiln_tensor *h = kiln_retain(x);
  CHECK(kiln_set_autocast(KILN_BF16) == KILN_OK);
  for (int l = 0; l < 4; l++) {
    kiln_tensor *hg = kiln_mul(h, p[0]), *x1 = kiln_add(hg, p[1]);
    kiln_tensor *t1 = kiln_transpose(p[2], 0, 1), *a = kiln_matmul(x1, t1), *ab = kiln_add(a, p[3]);
    kiln_tensor *g = kiln_gelu(ab), *t2 = kiln_transpose(p[4], 0, 1), *y = kiln_matmul(g, t2);
    kiln_tensor *yb = kiln_add(y, p[5]), *next = kiln_add(yb, x1);
    kiln_tensor *all[] = {hg, x1, t1, a, ab, g, t2, y, yb, h};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
    h = next;
  }
  CHECK(kiln_set_autocast(KILN_F32) == KILN_OK);
  CHECK(kiln_to_buffer(h, out, (size_t)n * sizeof *out) == KILN_OK);
  kiln_release(h);
}

TEST(autocast_layers_cast_in_their_nests) {
  if (!ktest_cpu_jit()) return;
  static const int64_t shapes[6][2] = {{1, 32}, {1, 32}, {48, 32}, {1, 48}, {32, 48}, {1, 32}};
  kiln_tensor *xf = half_values(KILN_F32, 64 * 32, -2, 2, false),
              *x = kiln_reshape(xf, 2, S(64, 32));
  kiln_tensor *flat[6], *p[6];
  for (int i = 0; i < 6; i++) {
    int64_t rows = shapes[i][0], cols = shapes[i][1];
    flat[i] = half_values(KILN_F32, rows * cols, -1, 1, false);
    p[i] = rows == 1 ? kiln_retain(flat[i]) : kiln_reshape(flat[i], 2, S(rows, cols));
  }
  CHECK(kiln_eval(1, &x) == KILN_OK);
  CHECK(kiln_eval(6, p) == KILN_OK); /* leaves of the runs */
  float want[64 * 32], got[64 * 32];
  setenv("KILN_JIT", "0", 1);
  mlp_layers(x, p, want, 64 * 32);
  unsetenv("KILN_JIT");
  double rolled = kiln_stat("loops_rolled");
  for (int rep = 0; rep < 3; rep++) {
    kiln_stats before, after;
    kiln_get_stats(&before);
    mlp_layers(x, p, got, 64 * 32);
    kiln_get_stats(&after);
    CHECK(!memcmp(got, want, sizeof got));
    if (rep == 0) kiln_jit_wait();
    if (rep < 2) continue;
    CHECK_EQ_INT(after.eager_ops - before.eager_ops, 8); /* the matmuls, two a layer */
    CHECK_EQ_INT(after.kernels_launched - before.kernels_launched, 29);
  }
  CHECK(kiln_stat("loops_rolled") > rolled);
  for (int i = 0; i < 6; i++) kiln_release(flat[i]), kiln_release(p[i]);
  kiln_release(xf), kiln_release(x);
}

/* autocast is per thread: a thread that turned it on gets bf16 matmuls, a
   thread beside it that did not gets f32, whatever order they run in */
typedef struct {
  kiln_dtype autocast, got[20];
} autocast_job;

static void *autocast_thread(void *p) {
  autocast_job *j = p;
  kiln_set_autocast(j->autocast);
  kiln_tensor *a = kiln_ones(KILN_F32, 2, S(8, 8));
  for (int i = 0; i < 20; i++) {
    kiln_tensor *y = kiln_matmul(a, a);
    j->got[i] = y ? kiln_dtype_of(y) : KILN_BOOL;
    kiln_release(y);
  }
  kiln_release(a);
  kiln_set_autocast(KILN_F32);
  return NULL;
}

TEST(autocast_is_per_thread) {
  autocast_job on = {.autocast = KILN_BF16}, off = {.autocast = KILN_F32};
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, autocast_thread, &on) == 0);
  CHECK(pthread_create(&t2, NULL, autocast_thread, &off) == 0);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  for (int i = 0; i < 20; i++) {
    CHECK_EQ_INT(on.got[i], KILN_BF16);
    CHECK_EQ_INT(off.got[i], KILN_F32);
  }
  CHECK_EQ_INT(kiln_autocast_dtype(), KILN_F32); /* this thread's never changed */
}

/* the loss scaler's step: gradients divided by the scale in place, and an
   Inf or a NaN in any of them found */
TEST(unscale_grads_divides_and_finds_overflow) {
  const float xv[3] = {1, 2, 3};
  kiln_tensor *p = kiln_from_data(xv, KILN_F32, 1, S(3)),
              *q = kiln_from_data(xv, KILN_F32, 1, S(3));
  kiln_tensor *none = kiln_from_data(xv, KILN_F32, 1, S(3));
  CHECK(kiln_set_requires_grad(p, true) == KILN_OK);
  CHECK(kiln_set_requires_grad(q, true) == KILN_OK);
  CHECK(kiln_set_requires_grad(none, true) == KILN_OK); /* no gradient: skipped */
  kiln_tensor *pq = kiln_mul(p, q), *scaled = kiln_mul_scalar(pq, 1024.0);
  kiln_tensor *loss = kiln_sum(scaled, 0, NULL, false);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *params[3] = {p, q, none};
  bool found = true;
  CHECK(kiln_unscale_grads(3, params, 1.0 / 1024, &found) == KILN_OK);
  CHECK(!found);
  kiln_tensor *g = kiln_grad(p);
  double *gv = ktest_values(g);
  for (int i = 0; i < 3; i++) CHECK(gv[i] == xv[i]); /* d(p*q)/dp = q, unscaled */
  free(gv);
  kiln_release(g);
  /* an injected Inf: found, and the other values still unscaled */
  const float bad[3] = {1, INFINITY, 3};
  kiln_tensor *gb = kiln_from_data(bad, KILN_F32, 1, S(3));
  CHECK(kiln_set_grad(q, gb) == KILN_OK);
  CHECK(kiln_unscale_grads(3, params, 0.5, &found) == KILN_OK);
  CHECK(found);
  const float nan3[3] = {NAN, 0, 0};
  kiln_tensor *gn = kiln_from_data(nan3, KILN_F32, 1, S(3));
  CHECK(kiln_set_grad(q, gn) == KILN_OK);
  CHECK(kiln_unscale_grads(2, params, 1.0, &found) == KILN_OK);
  CHECK(found);
  CHECK(kiln_unscale_grads(-1, params, 1.0, &found) == KILN_ERR_ARG);
  CHECK(kiln_unscale_grads(1, params, INFINITY, &found) == KILN_ERR_ARG);
  kiln_release(gn);
  kiln_release(gb);
  kiln_release(loss);
  kiln_release(scaled);
  kiln_release(pq);
  kiln_release(p);
  kiln_release(q);
  kiln_release(none);
}

/* rand in a half stays in [0, 1): draws that would round up to 1.0 do not */
TEST(rand_in_halves_stays_below_one) {
  const kiln_dtype dts[2] = {KILN_BF16, KILN_F16};
  for (int d = 0; d < 2; d++) {
    kiln_tensor *r = kiln_rand(dts[d], 1, S(1 << 18));
    double *v = ktest_values(r);
    int bad = 0, top = 0;
    for (int i = 0; i < 1 << 18; i++) {
      bad += !(v[i] >= 0 && v[i] < 1);
      top += v[i] > 0.99;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(top > 0); /* the top of the range is drawn (and kept below 1) */
    free(v);
    kiln_release(r);
  }
}

/* the switch exists on every machine (the CPU's GEMMs ignore it) */
TEST(matmul_precision_is_highest_unless_asked) {
  CHECK(!strcmp(kiln_matmul_precision(), "highest"));
  CHECK_EQ_INT(kiln_set_matmul_precision("tf32"), KILN_OK);
  CHECK(!strcmp(kiln_matmul_precision(), "tf32"));
  CHECK_EQ_INT(kiln_set_matmul_precision("fast"), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "unknown matmul precision \"fast\"");
  CHECK_EQ_INT(kiln_set_matmul_precision(NULL), KILN_ERR_ARG);
  CHECK(!strcmp(kiln_matmul_precision(), "tf32")); /* an error changes nothing */
  CHECK_EQ_INT(kiln_set_matmul_precision("highest"), KILN_OK);
  CHECK(!strcmp(kiln_matmul_precision(), "highest"));
}

TEST(names_and_printing) {
  kiln_tensor *h = kiln_full(1.5, KILN_BF16, 1, S(2)), *f = kiln_full(-2.25, KILN_F16, 1, S(1));
  kiln_tensor *u = kiln_full(200, KILN_U8, 1, S(1)), *i8 = kiln_full(-100, KILN_I8, 1, S(1)),
              *i16 = kiln_full(-30000, KILN_I16, 1, S(1));
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  CHECK(kiln_print(h, m) == 0);
  CHECK(kiln_print(f, m) == 0);
  CHECK(kiln_print(u, m) == 0);
  CHECK(kiln_print(i8, m) == 0);
  CHECK(kiln_print(i16, m) == 0);
  fclose(m);
  CHECK_STR_CONTAINS(buf, "-100");
  CHECK_STR_CONTAINS(buf, "int8");
  CHECK_STR_CONTAINS(buf, "-30000");
  CHECK_STR_CONTAINS(buf, "int16");
  CHECK_STR_CONTAINS(buf, "1.5");
  CHECK_STR_CONTAINS(buf, "bfloat16");
  CHECK_STR_CONTAINS(buf, "-2.25");
  CHECK_STR_CONTAINS(buf, "float16");
  CHECK_STR_CONTAINS(buf, "200");
  CHECK_STR_CONTAINS(buf, "uint8");
  free(buf);
  kiln_release(h);
  kiln_release(f);
  kiln_release(u);
  kiln_release(i8);
  kiln_release(i16);
}

int main(void) {
  /* the interpreter, but where jit_agrees compiles (on the calling thread,
     at the first sighting): compiling every trace here took 45 s */
  set_env("KILN_JIT", "0");
  set_env("KILN_ASYNC", "0");
  set_env("KILN_HOT", "1");
  RUN(every_pattern_widens_exactly_and_nans_stay_nans);
  RUN(f32_rounds_to_nearest_even_overflows_to_inf_and_keeps_subnormals);
  RUN(kernels_convert_every_pattern_as_half_h_does);
  RUN(every_elementwise_op_is_its_f32_op_rounded_once);
  RUN(reductions_softmax_and_matmul_accumulate_in_f32);
  RUN(fused_half_kernels_equal_the_interpreter_bit_for_bit);
  RUN(promotion_follows_pytorch);
  RUN(u8_wraps_saturates_from_floats_and_sums_to_i64);
  RUN(bf16_matmul_is_within_the_dot_product_bound_at_any_shape);
  RUN(bf16_matmul_rounds_ties_to_even_and_keeps_inf_and_nan);
  RUN(int8_and_int16_wrap_saturate_and_sum_to_i64);
  RUN(gradients_come_in_the_parameters_dtype);
  RUN(autocast_runs_matmuls_in_the_half_dtype_with_f32_gradients);
  RUN(autocast_layers_cast_in_their_nests);
  RUN(autocast_is_per_thread);
  RUN(unscale_grads_divides_and_finds_overflow);
  RUN(a_pytorch_checkpoint_of_halves_and_bytes_loads_to_the_same_bits);
  RUN(a_u64_past_int64_and_unknown_dtypes_are_clear_errors);
  RUN(rand_in_halves_stays_below_one);
  RUN(matmul_precision_is_highest_unless_asked);
  RUN(names_and_printing);
  return ktest_done();
}
