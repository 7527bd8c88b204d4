/* test_jit_math.c — the libgccjit math library (jit_cpu/math.h): one context
 * per option set with a kernel per function, y[i] = fn(x[i]), compared with
 * double libm over ~1.6M samples per function (every float bit pattern
 * stepping by 4099, plus dense sweeps of each function's interesting ranges:
 * thresholds, denormals, near multiples of pi/4); NaN, inf and zero results
 * exactly as libm (with their sign).  The documented ulp bounds
 * (cpu_math_ulp_bound) are asserted for three option sets: FMA contraction
 * on the best -march for this CPU, the CPU JIT's own settings (best -march,
 * -ffp-contract=off), and baseline -march=x86-64.  f64 must be bit-identical
 * to libm.  Prints throughput (not asserted).
 * KILN_JIT_MATH_EXHAUSTIVE=1 also checks every float for the unary functions
 * (tens of minutes; =tanh,sigmoid for some of them, and
 * KILN_JIT_MATH_EXHAUSTIVE_VARIANT=contract-off for the JIT's own option set
 * only); the helpers use explicit fma where -march has it (x86-64-v3+), so
 * the first two option sets run that code and baseline x86-64 the other.
 * KILN_JIT_MATH_DUMP=1 keeps libgccjit's intermediate
 * files and writes GCC's missed-vectorization notes to
 * /tmp/kiln_math_vec.txt. */
#include <float.h>
#include <libgccjit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../jit_cpu/math.h"
#include "../vm/cpu.h"
#include "../vm/kernels.h"
#include "ktest.h"

/* libgccjit leaks a little on every compile (DESIGN §6); under
   KILN_SANITIZE that is not this test's leak to report */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libgccjit.so\n"; }

typedef void (*kf32)(const float *x, float *y, long n);
typedef void (*kf64)(const double *x, double *y, long n);
typedef void (*kpow32)(const float *x, const float *y, float *out, long n);
typedef void (*kpow64)(const double *x, const double *y, double *out, long n);

typedef struct {
  gcc_jit_result *res;
  void *f32[CPU_FN_COUNT], *f64[CPU_FN_COUNT];
  double compile_ms;
} kernels;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* void k(const T *x, [const T *y,] T *out, long n) { for i: out[i] = fn(x[i] [, y[i]]) } */
static void build_kernel(gcc_jit_context *ctx, cpu_math *m, cpu_fn fn, bool f64) {
  gcc_jit_type *t = gcc_jit_context_get_type(ctx, f64 ? GCC_JIT_TYPE_DOUBLE : GCC_JIT_TYPE_FLOAT);
  gcc_jit_type *pt = gcc_jit_type_get_pointer(t);
  gcc_jit_type *cpt = gcc_jit_type_get_pointer(gcc_jit_type_get_const(t));
  gcc_jit_type *lng = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_LONG);
  gcc_jit_type *vd = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_VOID);
  bool binary = fn == CPU_POW;
  gcc_jit_param *ps[4];
  int np = 0;
  ps[np++] = gcc_jit_context_new_param(ctx, NULL, cpt, "x");
  if (binary) ps[np++] = gcc_jit_context_new_param(ctx, NULL, cpt, "y");
  ps[np++] = gcc_jit_context_new_param(ctx, NULL, pt, "out");
  ps[np++] = gcc_jit_context_new_param(ctx, NULL, lng, "n");
  char name[64];
  snprintf(name, sizeof name, "k_%s_%s", cpu_math_name(fn), f64 ? "f64" : "f32");
  gcc_jit_function *f =
      gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, vd, name, np, ps, 0);
  gcc_jit_lvalue *i = gcc_jit_function_new_local(f, NULL, lng, "i");
  gcc_jit_block *entry = gcc_jit_function_new_block(f, "entry");
  gcc_jit_block *cond = gcc_jit_function_new_block(f, "cond");
  gcc_jit_block *body = gcc_jit_function_new_block(f, "body");
  gcc_jit_block *done = gcc_jit_function_new_block(f, "done");
  gcc_jit_block_add_assignment(entry, NULL, i, gcc_jit_context_zero(ctx, lng));
  gcc_jit_block_end_with_jump(entry, NULL, cond);
  gcc_jit_rvalue *iv = gcc_jit_lvalue_as_rvalue(i);
  gcc_jit_block_end_with_conditional(
      cond, NULL,
      gcc_jit_context_new_comparison(ctx, NULL, GCC_JIT_COMPARISON_LT, iv,
                                     gcc_jit_param_as_rvalue(ps[np - 1])),
      body, done);
  gcc_jit_rvalue *xi = gcc_jit_lvalue_as_rvalue(
      gcc_jit_context_new_array_access(ctx, NULL, gcc_jit_param_as_rvalue(ps[0]), iv));
  gcc_jit_rvalue *yi = binary ? gcc_jit_lvalue_as_rvalue(gcc_jit_context_new_array_access(
                                    ctx, NULL, gcc_jit_param_as_rvalue(ps[1]), iv))
                              : NULL;
  gcc_jit_lvalue *oi =
      gcc_jit_context_new_array_access(ctx, NULL, gcc_jit_param_as_rvalue(ps[np - 2]), iv);
  gcc_jit_block_add_assignment(body, NULL, oi, cpu_math_call(m, fn, f64, xi, yi));
  gcc_jit_block_add_assignment_op(body, NULL, i, GCC_JIT_BINARY_OP_PLUS,
                                  gcc_jit_context_one(ctx, lng));
  gcc_jit_block_end_with_jump(body, NULL, cond);
  gcc_jit_block_end_with_void_return(done, NULL);
}

static const char *best_march(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "-march=x86-64-v4";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "-march=x86-64-v3";
  if (__builtin_cpu_supports("sse4.2")) return "-march=x86-64-v2";
  return "-march=x86-64";
}

/* the CPU JIT uses fma in the helpers on targets that have it */
static bool march_fma(const char *march) {
  return !strcmp(march, "-march=x86-64-v3") || !strcmp(march, "-march=x86-64-v4");
}

static bool compile_all(kernels *k, const char *march, bool contract) {
  memset(k, 0, sizeof *k);
  gcc_jit_context *ctx = gcc_jit_context_acquire();
  gcc_jit_context_set_int_option(ctx, GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL, 3);
  gcc_jit_context_add_command_line_option(ctx, "-fno-math-errno");
  gcc_jit_context_add_command_line_option(ctx, march);
  if (!contract) gcc_jit_context_add_command_line_option(ctx, "-ffp-contract=off");
  if (getenv("KILN_JIT_MATH_DUMP")) {
    gcc_jit_context_set_bool_option(ctx, GCC_JIT_BOOL_OPTION_KEEP_INTERMEDIATES, 1);
    gcc_jit_context_add_command_line_option(ctx, "-fopt-info-vec-missed=/tmp/kiln_math_vec.txt");
  }
  cpu_math *m = cpu_math_new(ctx, march_fma(march));
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    build_kernel(ctx, m, (cpu_fn)f, false);
    build_kernel(ctx, m, (cpu_fn)f, true);
  }
  double t0 = now_s();
  k->res = gcc_jit_context_compile(ctx);
  k->compile_ms = 1e3 * (now_s() - t0);
  if (!k->res) {
    KTEST_FAIL("libgccjit compile failed: %s", gcc_jit_context_get_first_error(ctx));
    gcc_jit_context_release(ctx);
    cpu_math_free(m);
    return false;
  }
  gcc_jit_context_release(ctx);
  cpu_math_free(m);
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    char name[64];
    snprintf(name, sizeof name, "k_%s_f32", cpu_math_name((cpu_fn)f));
    k->f32[f] = gcc_jit_result_get_code(k->res, name);
    snprintf(name, sizeof name, "k_%s_f64", cpu_math_name((cpu_fn)f));
    k->f64[f] = gcc_jit_result_get_code(k->res, name);
    if (!k->f32[f] || !k->f64[f]) KTEST_FAIL("missing kernel %s", name);
  }
  return true;
}

/* --- references and error measure ---------------------------------------- */

static double ref1(cpu_fn fn, double x) {
  switch (fn) {
    case CPU_EXP:
      return exp(x);
    case CPU_LOG:
      return log(x);
    case CPU_TANH:
      return tanh(x);
    case CPU_SIGMOID:
      return 1.0 / (1.0 + exp(-x));
    case CPU_SIN:
      return sin(x);
    case CPU_COS:
      return cos(x);
    case CPU_LOG1P:
      return log1p(x);
    case CPU_EXPM1:
      return expm1(x);
    case CPU_ERF:
      return erf(x);
    case CPU_SQRT:
      return sqrt(x);
    case CPU_RSQRT:
      return 1.0 / sqrt(x);
    default:
      return NAN;
  }
}

/* libm's float functions: the reference for special values */
static float interp_f32(cpu_fn fn, float x, float y) {
  switch (fn) {
    case CPU_EXP:
      return expf(x);
    case CPU_LOG:
      return logf(x);
    case CPU_TANH:
      return tanhf(x);
    case CPU_SIGMOID:
      return 1.0f / (1.0f + expf(-x));
    case CPU_SIN:
      return sinf(x);
    case CPU_COS:
      return cosf(x);
    case CPU_LOG1P:
      return log1pf(x);
    case CPU_EXPM1:
      return expm1f(x);
    case CPU_ERF:
      return erff(x);
    case CPU_SQRT:
      return sqrtf(x);
    case CPU_RSQRT:
      return 1.0f / sqrtf(x);
    case CPU_POW:
      return powf(x, y);
    default:
      return NAN;
  }
}

static double interp_f64(cpu_fn fn, double x, double y) {
  switch (fn) {
    case CPU_SIGMOID:
      return 1.0 / (1.0 + exp(-x));
    case CPU_POW:
      return pow(x, y);
    default:
      return ref1(fn, x);
  }
}

/* error of got in ulps of the float nearest ref; inf counts as 2^128 when
   the reference is finite; NaN must match NaN */
static double ulp_err(float got, double ref) {
  if (isnan(ref)) return isnan(got) ? 0 : INFINITY;
  if (isnan(got)) return INFINITY;
  float reff = (float)ref;
  if (isinf(reff) && got == reff) return 0;
  double g = isinf(got) ? copysign(0x1p128, got) : (double)got;
  double a = fabs(ref);
  if (isinf(ref)) return INFINITY;
  double ulp;
  if (a < 0x1p-126) {
    ulp = 0x1p-149;
  } else {
    int ex;
    frexp(a, &ex);
    ulp = ldexp(1.0, ex - 24);
  }
  return fabs(g - ref) / ulp;
}

typedef struct {
  double max_err;
  float worst_x, worst_y, worst_got;
  long n, bad_special;
} stats;

static void note(stats *s, double err, float x, float y, float got) {
  s->n++;
  if (err > s->max_err || (isnan(err) && !isnan(s->max_err))) {
    s->max_err = err;
    s->worst_x = x;
    s->worst_y = y;
    s->worst_got = got;
  }
}

/* sin/cos: the documented range of the error bound */
#define SINCOS_RANGE 210828714.0f /* < 2^27 * pi/2 */

static bool in_domain(cpu_fn fn, float x) {
  if ((fn == CPU_SIN || fn == CPU_COS) && isfinite(x) && fabsf(x) >= SINCOS_RANGE) return false;
  return true;
}

/* --- samples ------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

typedef struct {
  float *v;
  long n, cap;
} vec;

static void push(vec *a, float x) {
  if (a->n == a->cap) {
    a->cap = a->cap ? 2 * a->cap : 1 << 16;
    a->v = realloc(a->v, (size_t)a->cap * sizeof(float));
  }
  a->v[a->n++] = x;
}

/* count floats evenly spaced in bit pattern over [lo, hi] (0 <= lo < hi), both signs */
static void push_range(vec *a, float lo, float hi, long count) {
  uint32_t b0 = to_bits(lo), b1 = to_bits(hi);
  for (long i = 0; i < count; i++) {
    uint32_t b = b0 + (uint32_t)((double)(b1 - b0) * (double)i / (double)(count - 1));
    push(a, from_bits(b));
    push(a, -from_bits(b));
  }
}

static const float specials[] = {0.0f,
                                 -0.0f,
                                 INFINITY,
                                 -INFINITY,
                                 NAN,
                                 -NAN,
                                 1.0f,
                                 -1.0f,
                                 0.5f,
                                 -0.5f,
                                 2.0f,
                                 -2.0f,
                                 3.0f,
                                 -3.0f,
                                 0x1p-149f,
                                 -0x1p-149f,
                                 0x1p-126f,
                                 -0x1p-126f,
                                 0x1.fffffcp-127f,
                                 FLT_MAX,
                                 -FLT_MAX,
                                 0x1p-24f,
                                 -0x1p-24f,
                                 88.72283172607421875f,
                                 88.72283935546875f,
                                 -103.97207641601562f,
                                 -103.97208404541016f,
                                 -87.33654022216797f,
                                 0.625f,
                                 -0.625f,
                                 0.921875f,
                                 3.93f,
                                 1e-30f,
                                 -1e-30f,
                                 1e30f,
                                 -1e30f};

static vec samples_for(cpu_fn fn) {
  vec a = {0};
  /* every binade: all bit patterns stepping by a prime */
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) push(&a, from_bits((uint32_t)b));
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) push(&a, specials[i]);
  push_range(&a, 0x1p-20f, 4.0f, 100000); /* near 0 and the usual values */
  switch (fn) {
    case CPU_EXP:
    case CPU_SIGMOID:
    case CPU_EXPM1:
      push_range(&a, 80.0f, 110.0f, 100000); /* overflow / denormal / underflow thresholds */
      push_range(&a, 4.0f, 80.0f, 100000);
      break;
    case CPU_LOG:
    case CPU_LOG1P:
      push_range(&a, 0.25f, 4.0f, 200000);
      push_range(&a, 0x1p-149f, 0x1p-126f, 20000); /* denormals */
      push_range(&a, 0x1p120f, FLT_MAX, 20000);
      push_range(&a, 0.99f, 1.01f, 50000);
      break;
    case CPU_TANH:
    case CPU_ERF:
      push_range(&a, 0.5f, 10.0f, 200000);
      break;
    case CPU_SIN:
    case CPU_COS:
      push_range(&a, 0.5f, 1e4f, 200000);
      push_range(&a, 1e4f, SINCOS_RANGE, 100000);
      /* floats nearest multiples of pi/4 (hard cancellation cases) */
      for (long k = 1; k < 200000; k++) {
        float x = (float)((double)k * 0.78539816339744830962);
        push(&a, x);
        push(&a, nextafterf(x, 0));
        push(&a, nextafterf(x, INFINITY));
      }
      for (int i = 0; i < 100000; i++)
        push(&a, (float)((double)(rnd() >> 11) * 0x1p-53 * SINCOS_RANGE));
      break;
    default:
      break;
  }
  return a;
}

/* --- checks ---------------------------------------------------------------- */

/* special values: NaN-ness exact; zero and infinite results exactly
   (with sign) as the libm float function / the interpreter */
static void check_special_f32(cpu_fn fn, float x, float got) {
  if (fn == CPU_SIN || fn == CPU_COS) {
    if (!in_domain(fn, x)) return;
  }
  float want = interp_f32(fn, x, 0);
  if (fn == CPU_SIGMOID) want = (float)ref1(fn, x); /* the float formula flushes tiny results */
  bool ok;
  if (isnan(want) || isnan(got))
    ok = isnan(want) && isnan(got);
  else if (isinf(want) || want == 0 || isinf(got) || got == 0 || isinf(x))
    ok = got == want && signbit(got) == signbit(want); /* also tanh(±inf) = ±1 ... */
  else
    ok = true;
  if (!ok) KTEST_FAIL("%s(%a) = %a, libm gives %a", cpu_math_name(fn), x, got, want);
}

static void check_unary_f32(kernels *k, cpu_fn fn, const char *variant) {
  vec a = samples_for(fn);
  float *y = malloc((size_t)a.n * sizeof(float));
  ((kf32)k->f32[fn])(a.v, y, a.n);
  stats s = {0};
  for (long i = 0; i < a.n; i++) {
    float x = a.v[i];
    check_special_f32(fn, x, y[i]);
    if (fn == CPU_SQRT || fn == CPU_RSQRT) {
      float want = interp_f32(fn, x, 0);
      if (!(to_bits(want) == to_bits(y[i]) || (isnan(want) && isnan(y[i]))))
        KTEST_FAIL("%s(%a) = %a, the interpreter gives %a", cpu_math_name(fn), x, y[i], want);
    }
    if (fn == CPU_SIN || fn == CPU_COS) {
      /* outside the documented range: bounded */
      if (!in_domain(fn, x) && !(fabsf(y[i]) <= 1.0f))
        KTEST_FAIL("%s(%a) = %a out of [-1, 1]", cpu_math_name(fn), x, y[i]);
      if (!in_domain(fn, x)) continue;
    }
    note(&s, ulp_err(y[i], ref1(fn, x)), x, 0, y[i]);
  }
  double bound = cpu_math_ulp_bound(fn, false);
  printf("  %-8s f32 %-8s max %.3f ulp (bound %g) at x=%a (got %a, want %.9g), %ld samples\n",
         cpu_math_name(fn), variant, s.max_err, bound, s.worst_x, s.worst_got, ref1(fn, s.worst_x),
         s.n);
  if (!(s.max_err <= bound + 1e-6))
    KTEST_FAIL("%s f32 (%s): max error %.3f ulp > %g at x=%a (got %a)", cpu_math_name(fn), variant,
               s.max_err, bound, s.worst_x, s.worst_got);
  free(y);
  free(a.v);
}

static void check_unary_f64(kernels *k, cpu_fn fn) {
  vec a = samples_for(fn);
  long n = a.n;
  double *x = malloc((size_t)n * sizeof(double)), *y = malloc((size_t)n * sizeof(double));
  for (long i = 0; i < n; i++) x[i] = (double)a.v[i] * (1.0 + 0x1p-30 * (double)(i & 7));
  ((kf64)k->f64[fn])(x, y, n);
  long bad = 0;
  for (long i = 0; i < n; i++) {
    double want = interp_f64(fn, x[i], 0);
    bool same = memcmp(&want, &y[i], 8) == 0 || (isnan(want) && isnan(y[i]));
    if (!same && bad++ < 5)
      KTEST_FAIL("%s f64(%a) = %a, libm gives %a", cpu_math_name(fn), x[i], y[i], want);
  }
  free(x);
  free(y);
  free(a.v);
}

/* pow: random pairs over the ranges that matter, integer exponents of
   negative bases, near-overflow/underflow results, and every pair of special
   values */
static void check_pow(kernels *k, const char *variant) {
  static const float sv[] = {0.0f,       -0.0f,    INFINITY,       -INFINITY,
                             NAN,        1.0f,     -1.0f,          0.5f,
                             -0.5f,      2.0f,     -2.0f,          3.0f,
                             -3.0f,      2.5f,     -2.5f,          0x1p-149f,
                             -0x1p-149f, FLT_MAX,  -FLT_MAX,       1e-30f,
                             0x1p24f,    -0x1p24f, 0x1.000002p24f, -0x1.000002p24f,
                             0x1p31f,    127.0f,   -127.0f,        1.0000001f,
                             0.99999994f};
  const long nsv = (long)(sizeof sv / sizeof sv[0]);
  vec xs = {0}, ys = {0};
  for (long i = 0; i < nsv; i++)
    for (long j = 0; j < nsv; j++) {
      push(&xs, sv[i]);
      push(&ys, sv[j]);
    }
  long nspecial = xs.n;
  for (int i = 0; i < 300000; i++) {
    double u = (double)(rnd() >> 11) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    float x, y;
    switch (i % 6) {
      case 0:
        x = (float)exp((u - 0.5) * 40);
        y = (float)((v - 0.5) * 20);
        break;
      case 1:
        x = (float)(u * 100);
        y = (float)((v - 0.5) * 40);
        break;
      case 2:
        x = -(float)exp((u - 0.5) * 20);
        y = (float)floor((v - 0.5) * 60);
        break;
      case 3:
        x = (float)(0.5 + u);
        y = (float)((v - 0.5) * 400);
        break;
      case 4:
        x = from_bits((uint32_t)(rnd() >> 33));
        y = (float)((v - 0.5) * 4);
        break;
      default: {
        /* results near the overflow / denormal thresholds */
        x = (float)exp((u - 0.5) * 20);
        double target = (rnd() & 1) ? 88.0 + 1.5 * v : -87.0 - 17.0 * v;
        y = (float)(target / log((double)x));
        break;
      }
    }
    push(&xs, x);
    push(&ys, y);
  }
  float *out = malloc((size_t)xs.n * sizeof(float));
  ((kpow32)k->f32[CPU_POW])(xs.v, ys.v, out, xs.n);
  stats s = {0};
  for (long i = 0; i < xs.n; i++) {
    float x = xs.v[i], y = ys.v[i], got = out[i];
    float want = powf(x, y);
    bool ok;
    if (isnan(want) || isnan(got))
      ok = isnan(want) && isnan(got);
    else if (isinf(want) || want == 0 || isinf(got) || got == 0 || i < nspecial)
      ok = (got == want && signbit(got) == signbit(want)) ||
           (i >= nspecial && ulp_err(got, pow((double)x, (double)y)) <= 1);
    else
      ok = true;
    if (!ok) KTEST_FAIL("pow(%a, %a) = %a, powf gives %a", x, y, got, want);
    note(&s, ulp_err(got, pow((double)x, (double)y)), x, y, got);
  }
  double bound = cpu_math_ulp_bound(CPU_POW, false);
  printf("  pow      f32 %-8s max %.3f ulp (bound %g) at (%a, %a) (got %a), %ld samples\n", variant,
         s.max_err, bound, s.worst_x, s.worst_y, s.worst_got, s.n);
  if (!(s.max_err <= bound + 1e-6))
    KTEST_FAIL("pow f32 (%s): max error %.3f ulp > %g at (%a, %a)", variant, s.max_err, bound,
               s.worst_x, s.worst_y);

  /* f64: exactly libm's pow */
  double *xd = malloc((size_t)xs.n * sizeof(double)), *yd = malloc((size_t)xs.n * sizeof(double)),
         *od = malloc((size_t)xs.n * sizeof(double));
  for (long i = 0; i < xs.n; i++) {
    xd[i] = xs.v[i];
    yd[i] = ys.v[i];
  }
  ((kpow64)k->f64[CPU_POW])(xd, yd, od, xs.n);
  long bad = 0;
  for (long i = 0; i < xs.n; i++) {
    double want = pow(xd[i], yd[i]);
    if (!(memcmp(&want, &od[i], 8) == 0 || (isnan(want) && isnan(od[i]))) && bad++ < 5)
      KTEST_FAIL("pow f64(%a, %a) = %a, libm gives %a", xd[i], yd[i], od[i], want);
  }
  free(xd);
  free(yd);
  free(od);
  free(out);
  free(xs.v);
  free(ys.v);
}

/* every float, for the unary f32 functions (KILN_JIT_MATH_EXHAUSTIVE=1, or
   a comma-separated list of names such as tanh,sigmoid) */
static void exhaustive(kernels *k, const char *variant) {
  const long chunk = 1 << 24;
  const char *only = getenv("KILN_JIT_MATH_EXHAUSTIVE");
  float *x = malloc(chunk * sizeof(float)), *y = malloc(chunk * sizeof(float));
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    if (f == CPU_POW) continue;
    if (only && strcmp(only, "1") && !strstr(only, cpu_math_name((cpu_fn)f))) continue;
    stats s = {0};
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)chunk) {
      for (long i = 0; i < chunk; i++) x[i] = from_bits((uint32_t)(base + (uint64_t)i));
      ((kf32)k->f32[f])(x, y, chunk);
      for (long i = 0; i < chunk; i++) {
        if (!in_domain((cpu_fn)f, x[i])) continue;
        note(&s, ulp_err(y[i], ref1((cpu_fn)f, x[i])), x[i], 0, y[i]);
      }
    }
    printf("  exhaustive %-8s %-12s max %.3f ulp at %a (got %a)\n", cpu_math_name((cpu_fn)f),
           variant, s.max_err, s.worst_x, s.worst_got);
    fflush(stdout);
    if (!(s.max_err <= cpu_math_ulp_bound((cpu_fn)f, false) + 1e-6))
      KTEST_FAIL("exhaustive %s (%s): %.3f ulp at %a", cpu_math_name((cpu_fn)f), variant, s.max_err,
                 s.worst_x);
  }
  free(x);
  free(y);
}

/* --- throughput (printed, not asserted) ------------------------------------- */

#define SCALAR_LOOP(name, expr)                                                  \
  __attribute__((noinline)) static void name(const float *x, float *y, long n) { \
    for (long i = 0; i < n; i++) y[i] = expr;                                    \
  }
SCALAR_LOOP(scalar_expf, expf(x[i]))
SCALAR_LOOP(scalar_logf, logf(x[i]))
SCALAR_LOOP(scalar_tanhf, tanhf(x[i]))
SCALAR_LOOP(scalar_sigmoidf, 1.0f / (1.0f + expf(-x[i])))
SCALAR_LOOP(scalar_sinf, sinf(x[i]))
SCALAR_LOOP(scalar_cosf, cosf(x[i]))
SCALAR_LOOP(scalar_log1pf, log1pf(x[i]))
SCALAR_LOOP(scalar_expm1f, expm1f(x[i]))
SCALAR_LOOP(scalar_erff, erff(x[i]))
SCALAR_LOOP(scalar_sqrtf, sqrtf(x[i]))
SCALAR_LOOP(scalar_rsqrtf, 1.0f / sqrtf(x[i]))
static const kf32 scalar_loops[CPU_FN_COUNT] = {
    [CPU_EXP] = scalar_expf,         [CPU_LOG] = scalar_logf,     [CPU_TANH] = scalar_tanhf,
    [CPU_SIGMOID] = scalar_sigmoidf, [CPU_SIN] = scalar_sinf,     [CPU_COS] = scalar_cosf,
    [CPU_LOG1P] = scalar_log1pf,     [CPU_EXPM1] = scalar_expm1f, [CPU_ERF] = scalar_erff,
    [CPU_SQRT] = scalar_sqrtf,       [CPU_RSQRT] = scalar_rsqrtf};

/* seconds per call of f over n elements: best of 5 timings of reps calls */
static double time_kernel(kf32 f, const float *x, float *y, long n, int reps) {
  double best = 1e9;
  f(x, y, n);
  for (int r = 0; r < 5; r++) {
    double t0 = now_s();
    for (int i = 0; i < reps; i++) f(x, y, n);
    double t = (now_s() - t0) / reps;
    if (t < best) best = t;
  }
  return best;
}

static void throughput(kernels *k) {
  /* streaming: 2^24 floats in, 2^24 out (bytes read + written) */
  const long n = 1l << 24;
  float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
  for (long i = 0; i < n; i++) x[i] = (float)(((double)(rnd() >> 11) * 0x1p-53 - 0.5) * 20);
  double t_jit = time_kernel((kf32)k->f32[CPU_EXP], x, y, n, 1);
  double t_sc = time_kernel(scalar_expf, x, y, n, 1);
  printf("  exp on 2^24 floats, 1 thread: jit %.2f GB/s, scalar expf loop %.2f GB/s (%.1fx)\n",
         8.0 * (double)n / t_jit * 1e-9, 8.0 * (double)n / t_sc * 1e-9, t_sc / t_jit);
  /* in cache: 2^14 floats, positive arguments in (0, 10) */
  const long m = 1l << 14;
  for (long i = 0; i < m; i++) x[i] = fabsf(x[i]) + 1e-3f;
  printf("  in-cache throughput, 1 thread, Gfloat/s (jit vs scalar libm loop):\n   ");
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    if (f == CPU_POW) continue;
    double tj = time_kernel((kf32)k->f32[f], x, y, m, 200);
    double ts = time_kernel(scalar_loops[f], x, y, m, 20);
    printf(" %s %.2f/%.2f", cpu_math_name((cpu_fn)f), (double)m / tj * 1e-9, (double)m / ts * 1e-9);
  }
  printf("\n");
  /* pow: x in (0, 10), y in (-5, 5) */
  float *z = malloc((size_t)m * sizeof(float));
  for (long i = 0; i < m; i++) z[i] = (float)(((double)(rnd() >> 11) * 0x1p-53 - 0.5) * 10);
  kpow32 pj = (kpow32)k->f32[CPU_POW];
  double tj = 1e9, ts = 1e9;
  for (int r = 0; r < 5; r++) {
    double t0 = now_s();
    for (int i = 0; i < 100; i++) pj(x, z, y, m);
    double t1 = now_s();
    for (int i = 0; i < 10; i++)
      for (long j = 0; j < m; j++) y[j] = powf(x[j], z[j]);
    double t2 = now_s();
    if ((t1 - t0) / 100 < tj) tj = (t1 - t0) / 100;
    if ((t2 - t1) / 10 < ts) ts = (t2 - t1) / 10;
  }
  printf("    pow %.2f/%.2f\n", (double)m / tj * 1e-9, (double)m / ts * 1e-9);
  free(z);
  free(x);
  free(y);
}

/* --- tests ------------------------------------------------------------------ */

/* the three option sets: FMA contraction on the best -march for this CPU;
   the CPU JIT's own settings (best -march, -ffp-contract=off); and baseline
   x86-64 (SSE2: sin/cos/pow stay scalar there, the others vectorize) */
enum { V_FMA, V_NOCONTRACT, V_BASE, NVARIANT };
static kernels K[NVARIANT];
static const char *const variant_name[NVARIANT] = {"fma", "contract-off", "x86-64"};

TEST(compiles) {
  const char *march = best_march();
  bool ok = compile_all(&K[V_FMA], march, true) && compile_all(&K[V_NOCONTRACT], march, false) &&
            compile_all(&K[V_BASE], "-march=x86-64", false);
  CHECK(ok);
  printf(
      "  24 kernels per context; compile: %s %.0f ms, %s -ffp-contract=off %.0f ms, "
      "-march=x86-64 -ffp-contract=off %.0f ms\n",
      march, K[V_FMA].compile_ms, march, K[V_NOCONTRACT].compile_ms, K[V_BASE].compile_ms);
}

TEST(accuracy_f32) {
  for (int v = 0; v < NVARIANT; v++) {
    if (!K[v].res) continue;
    for (int f = 0; f < CPU_FN_COUNT; f++) {
      if (f == CPU_POW)
        check_pow(&K[v], variant_name[v]);
      else
        check_unary_f32(&K[v], (cpu_fn)f, variant_name[v]);
    }
  }
}

/* the interpreter's f32 math (vm/vmath.h, built into vm/kern_math.c) must
   be the compiled IR, bit for bit, for each fma setting the JIT uses: the
   JIT's own options on this CPU and baseline x86-64 (NaN payloads aside) */
static vm_opcode op_of(cpu_fn fn) {
  static const vm_opcode ops[CPU_FN_COUNT] = {
      [CPU_EXP] = VM_OP_exp,         [CPU_LOG] = VM_OP_log,     [CPU_TANH] = VM_OP_tanh,
      [CPU_SIGMOID] = VM_OP_sigmoid, [CPU_SIN] = VM_OP_sin,     [CPU_COS] = VM_OP_cos,
      [CPU_LOG1P] = VM_OP_log1p,     [CPU_EXPM1] = VM_OP_expm1, [CPU_ERF] = VM_OP_erf,
      [CPU_SQRT] = VM_OP_sqrt,       [CPU_RSQRT] = VM_OP_rsqrt, [CPU_POW] = VM_OP_pow};
  return ops[fn];
}

static void check_interpreter_equal(kernels *k, bool fma, const char *variant) {
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    if (f == CPU_SQRT || f == CPU_RSQRT) continue; /* instructions: checked above */
    vec a = samples_for((cpu_fn)f);
    long n = a.n;
    float *y = malloc((size_t)n * sizeof(float)), *x2 = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) /* pow: exponents from the same samples, shuffled */
      x2[i] = f == CPU_POW ? (i % 7 == 0 ? (float)(int)(i % 9 - 4)
                                         : a.v[(i * 7919) % n] * 0x1p-100f * (float)(i % 3))
                           : 0;
    if (f == CPU_POW)
      ((kpow32)k->f32[f])(a.v, x2, y, n);
    else
      ((kf32)k->f32[f])(a.v, y, n);
    long bad = 0;
    for (long i = 0; i < n; i++) {
      float want = vm_math_f32(op_of((cpu_fn)f), fma, a.v[i], x2[i]);
      if (to_bits(want) == to_bits(y[i]) || (isnan(want) && isnan(y[i]))) continue;
      if (bad++ < 5)
        KTEST_FAIL("%s f32 (%s): compiled %a, interpreter %a at x=%a y=%a",
                   cpu_math_name((cpu_fn)f), variant, y[i], want, a.v[i], x2[i]);
    }
    printf("  %-8s f32 %-8s interpreter == compiled on %ld samples%s\n", cpu_math_name((cpu_fn)f),
           variant, n, bad ? " (NOT)" : "");
    free(y);
    free(x2);
    free(a.v);
  }
}

TEST(interpreter_bitwise_equal) {
  if (K[V_NOCONTRACT].res)
    check_interpreter_equal(&K[V_NOCONTRACT], march_fma(best_march()), "jit");
  if (K[V_BASE].res) check_interpreter_equal(&K[V_BASE], false, "x86-64");
}

/* the interpreter's rows (vm_math_row_f32: vectorized loops over vm/vmath.h)
   give the bits of its scalar math on every sample, contiguous and strided */
TEST(interpreter_rows_are_its_scalar_math) {
  bool fma = vm_cpu_fma();
  for (int f = 0; f < CPU_FN_COUNT; f++) {
    if (f == CPU_SQRT || f == CPU_RSQRT) continue;
    vm_opcode op = op_of((cpu_fn)f);
    vec a = samples_for((cpu_fn)f);
    long n = a.n, bad = 0;
    float *y = malloc((size_t)n * 2 * sizeof(float)), *x2 = malloc((size_t)n * sizeof(float));
    float *spread = malloc((size_t)n * 2 * sizeof(float));
    CHECK(y && x2 && spread);
    if (!y || !x2 || !spread) return;
    for (long i = 0; i < n; i++) {
      x2[i] = (float)(int)(i % 9 - 4) * (i % 5 ? 0.5f : 1.0f);
      spread[2 * i] = a.v[i];
      spread[2 * i + 1] = 0;
    }
    for (int strided = 0; strided < 2; strided++) {
      char *p[3] = {(char *)y, strided ? (char *)spread : (char *)a.v, (char *)x2};
      const int64_t st[3] = {strided ? 2 : 1, strided ? 2 : 1, 1};
      vm_math_row_f32(op)(NULL, p, st, n);
      for (long i = 0; i < n; i++) {
        float got = y[i * st[0]], want = vm_math_f32(op, fma, a.v[i], x2[i]);
        if (to_bits(want) == to_bits(got) || (isnan(want) && isnan(got))) continue;
        if (bad++ < 5)
          KTEST_FAIL("%s f32 row (%s): %a, scalar %a at x=%a y=%a", cpu_math_name((cpu_fn)f),
                     strided ? "strided" : "contiguous", got, want, a.v[i], x2[i]);
      }
    }
    free(y);
    free(x2);
    free(spread);
    free(a.v);
  }
}

TEST(f64_is_libm) {
  if (!K[V_NOCONTRACT].res) return;
  for (int f = 0; f < CPU_FN_COUNT; f++)
    if (f != CPU_POW) check_unary_f64(&K[V_NOCONTRACT], (cpu_fn)f);
}

TEST(api_casts_and_caches) {
  /* an int argument is cast; a function is emitted once per context */
  gcc_jit_context *ctx = gcc_jit_context_acquire();
  cpu_math *m = cpu_math_new(ctx, false);
  gcc_jit_type *it = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_INT);
  gcc_jit_type *ft = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_FLOAT);
  gcc_jit_param *p = gcc_jit_context_new_param(ctx, NULL, it, "v");
  gcc_jit_function *f =
      gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, ft, "g", 1, &p, 0);
  gcc_jit_block *b = gcc_jit_function_new_block(f, NULL);
  gcc_jit_rvalue *a = cpu_math_call(m, CPU_EXP, false, gcc_jit_param_as_rvalue(p), NULL);
  gcc_jit_rvalue *c = cpu_math_call(m, CPU_EXP, false, gcc_jit_param_as_rvalue(p), NULL);
  CHECK(cpu_math_call(m, CPU_POW, false, a, NULL) == NULL); /* pow needs y */
  gcc_jit_block_end_with_return(
      b, NULL, gcc_jit_context_new_binary_op(ctx, NULL, GCC_JIT_BINARY_OP_PLUS, ft, a, c));
  gcc_jit_context_set_int_option(ctx, GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL, 2);
  gcc_jit_result *r = gcc_jit_context_compile(ctx);
  CHECK(r != NULL);
  if (r) {
    float (*g)(int) = (float (*)(int))gcc_jit_result_get_code(r, "g");
    CHECK(g != NULL);
    if (g) CHECK_CLOSE(g(2), 2 * expf(2.0f), 1e-6);
    gcc_jit_result_release(r);
  }
  gcc_jit_context_release(ctx);
  cpu_math_free(m);
}

TEST(throughput_printed) {
  if (K[V_NOCONTRACT].res) throughput(&K[V_NOCONTRACT]);
  /* KILN_JIT_MATH_EXHAUSTIVE_VARIANT=contract-off: only the CPU JIT's own settings */
  const char *only = getenv("KILN_JIT_MATH_EXHAUSTIVE_VARIANT");
  if (getenv("KILN_JIT_MATH_EXHAUSTIVE"))
    for (int v = 0; v < NVARIANT; v++)
      if (K[v].res && (!only || !strcmp(only, variant_name[v]))) exhaustive(&K[v], variant_name[v]);
}

int main(void) {
  RUN(compiles);
  RUN(accuracy_f32);
  RUN(interpreter_bitwise_equal);
  RUN(interpreter_rows_are_its_scalar_math);
  RUN(f64_is_libm);
  RUN(api_casts_and_caches);
  RUN(throughput_printed);
  for (int v = 0; v < NVARIANT; v++)
    if (K[v].res) gcc_jit_result_release(K[v].res);
  return ktest_done();
}
