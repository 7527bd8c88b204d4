/* math.c — vectorizable math for the libgccjit CPU backend: every f32
 * function is emitted as libgccjit IR (range reduction, polynomial, exponent
 * built with bit casts, selects as branch-free bit operations).
 * Accuracy and special values: math.h.  Polynomials: Cephes (log, tanh near
 * 0) and Chebyshev/minimax fits made for Kiln (exp, erf, expm1, sin, cos).
 * Where a result is a difference that would amplify the error of a float
 * intermediate (expm1, erf), exp is carried in double-float precision
 * (exp_core_f2) and the final step is split exactly (Fast2Sum), so that
 * errors stay below ~1 ulp without FMA.  tanh and sigmoid, the activations
 * whose cost shows in fused elementwise kernels, trade half an ulp to one ulp
 * of that for about half the instructions: a plain exp and one division.
 * On targets with FMA (x86-64-v3 and up) polynomials and exp's range
 * reduction use explicit fma instructions (fmadd()): the user's own
 * arithmetic is never contracted (-ffp-contract=off), the library's may be.
 *
 * How the IR is written, so that GCC vectorizes it after inlining:
 *  - no calls (sqrt is the builtin, an instruction under -fno-math-errno);
 *  - selects are bit operations on a mask made from the comparison (see
 *    when_01()), so every function is straight-line code;
 *  - no fmin/fmax builtins (libm calls), no ?: (libgccjit has none);
 *  - integer bit manipulation in unsigned types (no signed-overflow UB);
 *  - exact tricks (Fast2Sum, Cody-Waite) use only additions and products by
 *    exact constants, so FMA contraction (-ffp-contract=fast) cannot break
 *    them; the accuracy holds with and without it.
 * sin, cos and pow work in double internally: they vectorize from
 * x86-64-v2 up (64-bit lane compares), and stay scalar on baseline x86-64.
 *
 * vm/vmath.h is every function here written in C, step for step, for the
 * interpreter (bit for bit, DESIGN §5): change both together. */
#include "math.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef gcc_jit_rvalue R;
typedef gcc_jit_lvalue LV;

struct cpu_math {
  gcc_jit_context *ctx;
  gcc_jit_type *f32, *f64, *i32, *u32, *i64, *u64;
  gcc_jit_function *fn[2][CPU_FN_COUNT];
  gcc_jit_function *libm[CPU_FN_COUNT]; /* imported double functions */
  gcc_jit_function *sqrt_builtin[2];
  bool fma; /* the target has fused multiply-add: helpers use it explicitly */
};

static const char *const names[CPU_FN_COUNT] = {
    [CPU_EXP] = "exp", [CPU_LOG] = "log",   [CPU_TANH] = "tanh",   [CPU_SIGMOID] = "sigmoid",
    [CPU_SIN] = "sin", [CPU_COS] = "cos",   [CPU_LOG1P] = "log1p", [CPU_EXPM1] = "expm1",
    [CPU_ERF] = "erf", [CPU_SQRT] = "sqrt", [CPU_RSQRT] = "rsqrt", [CPU_POW] = "pow"};

/* documented f32 bounds (math.h); tests/test_jit_math.c asserts them */
static const double ulp_bounds[CPU_FN_COUNT] = {
    [CPU_EXP] = 1,   [CPU_LOG] = 1,    [CPU_TANH] = 1.5,  [CPU_SIGMOID] = 2.5,
    [CPU_SIN] = 1,   [CPU_COS] = 1,    [CPU_LOG1P] = 1,   [CPU_EXPM1] = 1.5,
    [CPU_ERF] = 1.5, [CPU_SQRT] = 0.5, [CPU_RSQRT] = 1.5, [CPU_POW] = 1};

const char *cpu_math_name(cpu_fn fn) { return (unsigned)fn < CPU_FN_COUNT ? names[fn] : "?"; }

double cpu_math_ulp_bound(cpu_fn fn, bool f64) {
  if ((unsigned)fn >= CPU_FN_COUNT) return 0;
  return f64 ? 0 : ulp_bounds[fn];
}

cpu_math *cpu_math_new(gcc_jit_context *ctx, bool fma) {
  cpu_math *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->ctx = ctx;
  m->fma = fma;
  m->f32 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_FLOAT);
  m->f64 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_DOUBLE);
  m->i32 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_INT32_T);
  m->u32 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_UINT32_T);
  m->i64 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_INT64_T);
  m->u64 = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_UINT64_T);
  return m;
}

void cpu_math_free(cpu_math *m) { free(m); }

/* --- a tiny IR builder ------------------------------------------------------ */

typedef struct {
  cpu_math *m;
  gcc_jit_context *c;
  gcc_jit_function *fn;
  gcc_jit_block *b; /* the block being filled */
  int nlocal;
} em;

static gcc_jit_type *ty(R *v) { return gcc_jit_rvalue_get_type(v); }

/* a constant of type t; float constants are rounded to float first (libgccjit
   would otherwise keep the double's extra bits in the constant) */
static R *kt(em *e, gcc_jit_type *t, double v) {
  if (t == e->m->f32) return gcc_jit_context_new_rvalue_from_double(e->c, t, (double)(float)v);
  if (t == e->m->f64) return gcc_jit_context_new_rvalue_from_double(e->c, t, v);
  return gcc_jit_context_new_rvalue_from_long(e->c, t, (long)v);
}
static R *kf(em *e, double v) { return kt(e, e->m->f32, v); }
static R *kd(em *e, double v) { return kt(e, e->m->f64, v); }
static R *ki(em *e, long v) { return gcc_jit_context_new_rvalue_from_long(e->c, e->m->i32, v); }
static R *ku(em *e, unsigned long v) {
  return gcc_jit_context_new_rvalue_from_long(e->c, e->m->u32, (long)v);
}
static R *kul(em *e, unsigned long long v) {
  return gcc_jit_context_new_rvalue_from_long(e->c, e->m->u64, (long)v);
}
/* a constant of the same type as v */
static R *like(em *e, R *v, double c) { return kt(e, ty(v), c); }

static R *bin(em *e, enum gcc_jit_binary_op op, R *a, R *b) {
  return gcc_jit_context_new_binary_op(e->c, NULL, op, ty(a), a, b);
}
static R *add(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_PLUS, a, b); }
static R *sub(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_MINUS, a, b); }
static R *mul(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_MULT, a, b); }
static R *dv(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_DIVIDE, a, b); }
static R *band(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_BITWISE_AND, a, b); }
static R *bor(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_BITWISE_OR, a, b); }
static R *shl(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_LSHIFT, a, b); }
static R *shr(em *e, R *a, R *b) { return bin(e, GCC_JIT_BINARY_OP_RSHIFT, a, b); }
static R *neg(em *e, R *a) {
  return gcc_jit_context_new_unary_op(e->c, NULL, GCC_JIT_UNARY_OP_MINUS, ty(a), a);
}
static R *fab(em *e, R *a) {
  return gcc_jit_context_new_unary_op(e->c, NULL, GCC_JIT_UNARY_OP_ABS, ty(a), a);
}
static R *cmp(em *e, enum gcc_jit_comparison op, R *a, R *b) {
  return gcc_jit_context_new_comparison(e->c, NULL, op, a, b);
}
static R *lt(em *e, R *a, R *b) { return cmp(e, GCC_JIT_COMPARISON_LT, a, b); }
static R *gt(em *e, R *a, R *b) { return cmp(e, GCC_JIT_COMPARISON_GT, a, b); }
static R *ge(em *e, R *a, R *b) { return cmp(e, GCC_JIT_COMPARISON_GE, a, b); }
static R *eq(em *e, R *a, R *b) { return cmp(e, GCC_JIT_COMPARISON_EQ, a, b); }
static R *ne(em *e, R *a, R *b) { return cmp(e, GCC_JIT_COMPARISON_NE, a, b); }
static R *not_(em *e, R *a) {
  return gcc_jit_context_new_unary_op(e->c, NULL, GCC_JIT_UNARY_OP_LOGICAL_NEGATE,
                                      gcc_jit_context_get_type(e->c, GCC_JIT_TYPE_BOOL), a);
}
static R *cast(em *e, R *a, gcc_jit_type *t) { return gcc_jit_context_new_cast(e->c, NULL, a, t); }
static R *bitcast(em *e, R *a, gcc_jit_type *t) {
  return gcc_jit_context_new_bitcast(e->c, NULL, a, t);
}

/* a fresh local holding v (evaluated now, in the current block) */
static LV *var(em *e, R *v) {
  char name[24];
  snprintf(name, sizeof name, "t%d", e->nlocal++);
  LV *l = gcc_jit_function_new_local(e->fn, NULL, ty(v), name);
  gcc_jit_block_add_assignment(e->b, NULL, l, v);
  return l;
}
static R *let(em *e, R *v) { return gcc_jit_lvalue_as_rvalue(var(e, v)); }
static R *rv(LV *l) { return gcc_jit_lvalue_as_rvalue(l); }

/* the unsigned integer type as wide as t */
static gcc_jit_type *bits_type(em *e, gcc_jit_type *t) {
  return (t == e->m->f64 || t == e->m->i64 || t == e->m->u64) ? e->m->u64 : e->m->u32;
}
static R *to_bits(em *e, R *v, gcc_jit_type *ut) {
  gcc_jit_type *t = ty(v);
  if (t == ut) return v;
  return (t == e->m->f32 || t == e->m->f64) ? bitcast(e, v, ut) : cast(e, v, ut);
}
static R *from_bits(em *e, R *u, gcc_jit_type *t) {
  if (t == ty(u)) return u;
  return (t == e->m->f32 || t == e->m->f64) ? bitcast(e, u, t) : cast(e, u, t);
}

/* if (flag) dst = v;  for an integer flag that is 0 or 1 (or a comparison),
   as straight-line code: dst ^= (dst ^ v) & -flag.  Both values are computed
   anyway (a vector select needs them), and with no control flow nothing
   depends on GCC if-converting: with if-blocks, GCC's sinking pass moves the
   arithmetic that feeds a select into the conditional block, where
   -ftrapping-math forbids speculating it again, and the loop stays scalar
   (seen with sin/cos and pow). */
static void when_01(em *e, R *flag, LV *dst, R *v) {
  gcc_jit_type *t = ty(v), *ut = bits_type(e, t);
  R *mask = let(
      e, gcc_jit_context_new_unary_op(e->c, NULL, GCC_JIT_UNARY_OP_MINUS, ut, cast(e, flag, ut)));
  R *a = let(e, to_bits(e, rv(dst), ut));
  R *b = to_bits(e, v, ut);
  R *r = bin(e, GCC_JIT_BINARY_OP_BITWISE_XOR, a,
             band(e, bin(e, GCC_JIT_BINARY_OP_BITWISE_XOR, a, b), mask));
  gcc_jit_block_add_assignment(e->b, NULL, dst, from_bits(e, r, t));
}

/* if (cond) dst = v;  for a comparison.  Bit tests are written as 0/1 flags
   for when_01 instead: GCC turns "(q & 1) != 0" into a 1-bit bool that the
   vectorizer cannot convert to a mask */
static void when(em *e, R *cond, LV *dst, R *v) { when_01(e, cond, dst, v); }

/* a * b + c: one rounding (the fma instruction) when the target has it,
   else two */
static R *fmadd(em *e, R *a, R *b, R *c) {
  if (!e->m->fma) return add(e, mul(e, a, b), c);
  gcc_jit_function *f = gcc_jit_context_get_builtin_function(
      e->c, ty(a) == e->m->f64 ? "__builtin_fma" : "__builtin_fmaf");
  R *args[3] = {a, b, c};
  return gcc_jit_context_new_call(e->c, NULL, f, 3, args);
}

/* c[0]*x^(n-1) + ... + c[n-1], Horner */
static R *horner(em *e, R *x, const double *c, int n) {
  R *p = like(e, x, c[0]);
  for (int i = 1; i < n; i++) p = fmadd(e, p, x, like(e, x, c[i]));
  return let(e, p);
}
#define HORNER(e, x, arr) horner(e, x, arr, (int)(sizeof arr / sizeof arr[0]))

/* float <-> uint32 and double <-> uint64 views */
static R *fbits(em *e, R *x) { return bitcast(e, x, e->m->u32); }
static R *ffrom(em *e, R *u) { return bitcast(e, u, e->m->f32); }
static R *dbits(em *e, R *x) { return bitcast(e, x, e->m->u64); }
static R *dfrom(em *e, R *u) { return bitcast(e, u, e->m->f64); }

/* |res| with the sign bit of x (float): the odd functions compute on |x| */
static R *with_sign_of(em *e, R *res, R *x) {
  R *sign = band(e, fbits(e, x), ku(e, 0x80000000u));
  return let(e, ffrom(e, bor(e, fbits(e, res), sign)));
}

/* x clamped to [lo, hi]; NaN stays NaN */
static R *clampf(em *e, R *x, double lo, double hi) {
  LV *v = var(e, x);
  when(e, gt(e, x, like(e, x, hi)), v, like(e, x, hi));
  when(e, lt(e, x, like(e, x, lo)), v, like(e, x, lo));
  return rv(v);
}

/* --- f32 kernels -------------------------------------------------------- */

/* (no <math.h>: this directory's math.h would shadow it under -Ijit_cpu) */
#define F_INF (__builtin_inf())
#define F_NAN (__builtin_nan(""))

/* 2^n for int32 n in [-126, 127] */
static R *pow2i_f(em *e, R *n) {
  R *u = shl(e, cast(e, add(e, n, ki(e, 127)), e->m->u32), ku(e, 23));
  return ffrom(e, u);
}

/* e^x, x already clamped to [-104, 89] (or NaN).  Cephes-style: n =
   rint(x/ln2) by the 1.5*2^23 trick, r = x - n ln2 in two parts (Cephes's
   split of ln2; the rounding error of r is kept), e^r = 1 + r + r^2 p(r),
   then two power-of-two factors so that n in [-150, 128] needs no special
   case: overflow, denormals and underflow come out of the final
   multiplications (one rounding).  With lo_out, also returns the rounding
   error of the result (e^x ~ result + *lo_out to ~2^-28 relative;
   meaningless for denormal results) for callers that need more than a
   float's precision. */
static R *exp_core_f2(em *e, R *x, R **lo_out) {
  x = let(e, x);
  /* (e^r - 1 - r)/r^2 on |r| <= 0.3466, Chebyshev fit with float
     coefficients: e^r to 7e-10 relative */
  static const double P[] = {1.9890988187398762e-4, 1.393364742398262e-3, 8.33331048488617e-3,
                             4.166646674275398e-2,  0.1666666716337204,   0.5};
  R *magic = kf(e, 12582912.0); /* 1.5 * 2^23 */
  R *t = let(e, add(e, mul(e, x, kf(e, 1.44269504088896341)), magic));
  R *n = let(e, sub(e, t, magic));
  R *ni = let(e, cast(e, sub(e, fbits(e, t), ku(e, 0x4B400000u)), e->m->i32));
  /* r = x - n ln2: n C1 and x - n C1 are exact, r_lo is the rounding error
     of subtracting n C2 */
  R *r1 = let(e, sub(e, x, mul(e, n, kf(e, 0.693359375))));
  R *c = let(e, mul(e, n, kf(e, -2.12194440e-4)));
  R *r = let(e, sub(e, r1, c));
  R *r_lo = sub(e, sub(e, r1, r), c);
  R *z = let(e, mul(e, r, r));
  R *p = HORNER(e, r, P);
  /* y = 1 + r + z p with 1 + r split exactly (Fast2Sum, |r| < 1) so that only
     the final addition rounds at the scale of y */
  R *hi = let(e, add(e, kf(e, 1), r));
  R *lo = add(e, sub(e, kf(e, 1), hi), r);
  R *l = let(e, add(e, add(e, lo, r_lo), mul(e, p, z)));
  R *y = let(e, add(e, hi, l));
  R *n1 = let(e, shr(e, ni, ki(e, 1)));
  R *n2 = let(e, sub(e, ni, n1));
  R *s1 = let(e, pow2i_f(e, n1)), *s2 = let(e, pow2i_f(e, n2));
  if (lo_out) {
    R *y_lo = add(e, sub(e, hi, y), l); /* Fast2Sum: |hi| >= |l| */
    *lo_out = let(e, mul(e, mul(e, y_lo, s1), s2));
  }
  return let(e, mul(e, mul(e, y, s1), s2));
}

/* e^x as exp_core_f2 without the rounding error, shorter with fma: r = x -
   n ln2 by two fmas (the first exact), e^r = (1 + r) + r^2 p(r) with 1 + r
   split exactly and the small part in one fma.  wide: n may leave [-126, 127] (two scale factors,
   denormal and infinite results); else one factor. */
static R *exp_core_f(em *e, R *x, bool wide) {
  if (!e->m->fma) return exp_core_f2(e, x, NULL);
  x = let(e, x);
  static const double P[] = {1.9890988187398762e-4, 1.393364742398262e-3, 8.33331048488617e-3,
                             4.166646674275398e-2,  0.1666666716337204,   0.5};
  R *magic = kf(e, 12582912.0); /* 1.5 * 2^23 */
  R *t = let(e, fmadd(e, x, kf(e, 1.44269504088896341), magic));
  R *n = let(e, sub(e, t, magic));
  R *ni = let(e, cast(e, sub(e, fbits(e, t), ku(e, 0x4B400000u)), e->m->i32));
  R *r = let(e, fmadd(e, n, kf(e, -0.693359375), x));
  r = let(e, fmadd(e, n, kf(e, 2.12194440e-4), r));
  R *p = HORNER(e, r, P);
  /* 1 + r split exactly (Fast2Sum, |r| < 1): only the last addition
     rounds at the scale of y */
  R *hi = let(e, add(e, kf(e, 1), r));
  R *lo = add(e, sub(e, kf(e, 1), hi), r);
  R *y = let(e, add(e, hi, fmadd(e, mul(e, r, r), p, lo)));
  if (!wide) return let(e, mul(e, y, pow2i_f(e, ni)));
  R *n1 = let(e, shr(e, ni, ki(e, 1)));
  R *n2 = let(e, sub(e, ni, n1));
  return let(e, mul(e, mul(e, y, pow2i_f(e, n1)), pow2i_f(e, n2)));
}

static R *exp_f(em *e, R *x) { return exp_core_f(e, clampf(e, x, -104, 89), true); }

/* log of a float; Cephes logf: x = 2^k m with m in [sqrt(1/2), sqrt(2)),
   f = m - 1 exactly, log(1+f) = f - f^2/2 + f^3 P(f), k ln2 in two parts.
   special: selects for x <= 0, inf and NaN (denormals are rescaled).
   log1p: x1p is the argument and x = 1 + x1p; where k = 0 f is x1p itself
   (exact), elsewhere the bits of x1p lost in 1 + x1p come back as the
   low-order term (x1p - (x - 1))/x. */
static R *log_core_f(em *e, R *x, bool denormals, R *x1p) {
  static const double P[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                             -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                             2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
  cpu_math *m = e->m;
  R *xs = x, *kadj = NULL;
  if (denormals) {
    LV *xv = var(e, x), *ka = var(e, ki(e, 0));
    R *tiny = lt(e, x, kf(e, 1.17549435e-38));
    when(e, tiny, xv, mul(e, x, kf(e, 8388608.0))); /* 2^23 */
    when(e, tiny, ka, ki(e, -23));
    xs = rv(xv);
    kadj = rv(ka);
  }
  R *u = let(e, fbits(e, xs));
  /* m in [0.5, 1), k such that x = 2^k m */
  R *k = cast(e, shr(e, u, ku(e, 23)), m->i32);
  k = sub(e, k, ki(e, 126));
  if (kadj) k = add(e, k, kadj);
  R *mant = let(e, ffrom(e, bor(e, band(e, u, ku(e, 0x007FFFFFu)), ku(e, 0x3F000000u))));
  LV *fk = var(e, cast(e, k, m->f32));
  LV *f = var(e, sub(e, mant, kf(e, 1)));
  R *small = lt(e, mant, kf(e, 0.707106781186547524));
  when(e, small, fk, sub(e, rv(fk), kf(e, 1)));
  when(e, small, f, sub(e, add(e, mant, mant), kf(e, 1)));
  R *c = NULL;
  if (x1p) {
    R *in = bin(e, GCC_JIT_BINARY_OP_BITWISE_AND, gt(e, x1p, kf(e, -0.29289321881345248)),
                lt(e, x1p, kf(e, 0.41421356237309505)));
    in = let(e, in);
    when(e, in, f, x1p);
    when(e, in, fk, kf(e, 0));
    LV *cv = var(e, dv(e, sub(e, x1p, sub(e, x, kf(e, 1))), x));
    when(e, in, cv, kf(e, 0));
    c = rv(cv);
  }
  R *ff = rv(f), *kk = rv(fk);
  R *z = let(e, mul(e, ff, ff));
  R *p = HORNER(e, ff, P);
  R *y = mul(e, mul(e, p, ff), z);
  if (c) y = add(e, y, c);
  y = add(e, y, mul(e, kk, kf(e, -2.12194440e-4)));
  y = add(e, y, mul(e, kf(e, -0.5), z));
  R *res = add(e, add(e, ff, y), mul(e, kk, kf(e, 0.693359375)));
  LV *out = var(e, res);
  when(e, not_(e, ge(e, x, kf(e, 0))), out, kf(e, F_NAN)); /* x < 0 or NaN */
  when(e, eq(e, x, kf(e, 0)), out, kf(e, -F_INF));
  when(e, eq(e, x, kf(e, F_INF)), out, kf(e, F_INF));
  return rv(out);
}

static R *log_f(em *e, R *x) { return log_core_f(e, x, true, NULL); }

/* tanh: |x| < 0.625: x + x^3 P(x^2) (Cephes); else 1 - 2/(E + 1) with
   E = e^{2|x|}: there tanh >= 0.55 and 2/(E + 1) <= 0.45, so the error of
   the quotient (exp's, the addition's and the division's roundings, about
   2 ulps of a number below 0.45) is about 1 ulp of the result.  Computed on
   |x|, sign copied back (keeps -0) */
static R *tanh_f(em *e, R *x) {
  static const double P[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                             1.33314422036E-1, -3.33332819422E-1};
  R *ax = let(e, fab(e, x));
  R *z = let(e, mul(e, ax, ax));
  R *p = HORNER(e, z, P);
  R *small = let(e, add(e, mul(e, mul(e, p, z), ax), ax));
  LV *a = var(e, ax);
  when(e, gt(e, ax, kf(e, 10)), a, kf(e, 10)); /* tanh(10) == 1 in float */
  R *ex = exp_core_f(e, add(e, rv(a), rv(a)), false);
  LV *res = var(e, sub(e, kf(e, 1), dv(e, kf(e, 2), add(e, ex, kf(e, 1)))));
  when(e, lt(e, ax, kf(e, 0.625)), res, small);
  return with_sign_of(e, rv(res), x);
}

/* sigmoid: with t = e^{-|x|} (never overflows): 1/(1+t) for x >= 0, t/(1+t)
   for x < 0, one division of the selected numerator.  t <= 1, so exp's
   error reaches a result >= 1/2 halved, and a tiny one (t/(1+t) ~ t) as is */
static R *sigmoid_f(em *e, R *x) {
  LV *a = var(e, neg(e, fab(e, x)));
  when(e, lt(e, rv(a), kf(e, -104)), a, kf(e, -104));
  R *t = exp_core_f(e, rv(a), true);
  LV *num = var(e, kf(e, 1));
  when(e, lt(e, x, kf(e, 0)), num, t);
  return let(e, dv(e, rv(num), add(e, kf(e, 1), t)));
}

/* expm1:
   |x| < 0.35: x + x^2/2 + x^3 g(x) (there e^x - 1 would cancel);
   else:         e^x - 1 with e^x in double-float precision (E + E_lo), the
                 subtraction split exactly (Fast2Sum, ordered by |E| vs 1),
                 so only the last addition rounds.
   x is clamped to [-30, 89]: expm1 = -1 in float below -17.4, inf above
   88.73; |x| < 2^-25 returns x (keeps -0 and denormals). */
static R *expm1_f(em *e, R *x) {
  /* Chebyshev fit on |x| <= 0.7 with float coefficients (the last one is
     1/6 rounded, the others absorb its error): relative error 3e-9 (used
     on |x| < 0.35) */
  static const double G[] = {1.423194134986261e-06,  2.500498158042319e-05, 1.994022895814851e-04,
                             1.3888514367863536e-03, 8.33315122872591e-03,  4.16666679084301e-02,
                             1.666666716337204e-01};
  R *ax = let(e, fab(e, x));
  R *g = HORNER(e, x, G);
  R *z = let(e, mul(e, x, x));
  R *small = let(e, add(e, x, mul(e, z, add(e, kf(e, 0.5), mul(e, x, g)))));
  R *E_lo;
  R *E = exp_core_f2(e, clampf(e, x, -30, 89), &E_lo);
  R *s = let(e, sub(e, E, kf(e, 1)));
  LV *err = var(e, sub(e, E, add(e, s, kf(e, 1))));                 /* exact when E < 1 */
  when(e, ge(e, E, kf(e, 1)), err, sub(e, sub(e, E, s), kf(e, 1))); /* when E >= 1 */
  LV *res = var(e, add(e, s, add(e, rv(err), E_lo)));
  when(e, eq(e, E, kf(e, F_INF)), res, kf(e, F_INF));
  when(e, lt(e, ax, kf(e, 0.35)), res, small);
  when(e, lt(e, ax, kf(e, 0x1p-25)), res, x);
  return rv(res);
}

/* log1p: log of u = 1 + x with the reduction of log_core_f (which handles
   u <= 0, i.e. x <= -1, and inf); u is never denormal */
static R *log1p_f(em *e, R *x) {
  R *u = let(e, add(e, kf(e, 1), x));
  LV *res = var(e, log_core_f(e, u, false, x));
  when(e, eq(e, x, kf(e, 0)), res, x); /* keeps -0 */
  return rv(res);
}

/* erf on |x|, sign copied back:
   |x| < 0.921875: x + x Q(x^2), Q minimax (relative error 4e-10)
   else:           1 - exp(P(|x|)), P ~ log(erfc) on [0.921875, 3.93] minimax
                   weighted by erfc (absolute error of erfc 1.5e-9), exp in
                   double-float precision and 1 - E split exactly;
                   erf = 1 in float beyond 3.9192, |x| is clamped to 3.93 */
static R *erf_f(em *e, R *x) {
  static const double Q[] = {8.37010084069334e-05,  -0.0008142704609781504, 0.005201032385230064,
                             -0.026859398931264877, 0.11283695697784424,    -0.37612634897232056,
                             0.12837916612625122};
  static const double P[] = {0.0001947334094438702,  -0.003031590487807989, 0.02218136005103588,
                             -0.10383883118629456,   -0.6372858285903931,   -1.1276154518127441,
                             -0.00020992521604057401};
  R *ax = let(e, fab(e, x));
  R *z = let(e, mul(e, ax, ax));
  R *small = let(e, add(e, ax, mul(e, ax, HORNER(e, z, Q))));
  LV *a = var(e, ax);
  when(e, gt(e, ax, kf(e, 3.93)), a, kf(e, 3.93));
  R *lg = HORNER(e, rv(a), P);
  R *E_lo;
  R *E = exp_core_f2(e, lg, &E_lo);
  R *s = let(e, sub(e, kf(e, 1), E));
  R *s_err = sub(e, sub(e, kf(e, 1), s), E); /* exact (Fast2Sum): 1 - E = s + s_err */
  LV *res = var(e, add(e, s, sub(e, s_err, E_lo)));
  when(e, lt(e, ax, kf(e, 0.921875)), res, small);
  return with_sign_of(e, rv(res), x);
}

/* sin / cos: reduction in double, exact for |x| < 2^27 pi/2: j = rint(x 2/pi),
   r = x - j pi/2 with pi/2 split into two 26-bit parts (j * part and the
   first two subtractions are exact) and a 53-bit tail; minimax polynomials in
   double for |r| <= pi/4 (relative error < 2^-31), one rounding to float. */
static R *sincos_f(em *e, R *x, bool is_cos) {
  static const double S[] = {2.724939007605605e-06, -0.0001984008271761515, 0.008333331867593243,
                             -0.16666666663838375};
  static const double C[] = {2.4463215389755764e-05, -0.0013887584885816234, 0.041666650569649716,
                             -0.4999999996894482};
  /* pi/2 = P1 + P2 + P3: P1 and P2 have 26 significant bits, P3 is the
     rest rounded to double (pi/2 - P1 - P2 - P3 = -1.5e-33) */
  const double P1 = 0x1.921fb5p+0, P2 = 0x1.110b46p-26, P3 = 0x1.1a62633145c07p-54;
  cpu_math *m = e->m;
  R *xd = let(e, cast(e, x, m->f64));
  R *magic = kd(e, 6755399441055744.0); /* 1.5 * 2^52 */
  R *k = let(e, add(e, mul(e, xd, kd(e, 0.636619772367581343)), magic));
  R *j = let(e, sub(e, k, magic));
  R *q = let(e, cast(e, dbits(e, k), m->u32));
  if (is_cos) q = let(e, add(e, q, ku(e, 1)));
  R *r = sub(e, xd, mul(e, j, kd(e, P1)));
  r = sub(e, r, mul(e, j, kd(e, P2)));
  r = let(e, sub(e, r, mul(e, j, kd(e, P3))));
  R *z = let(e, mul(e, r, r));
  R *s = let(e, mul(e, r, add(e, kd(e, 1), mul(e, z, HORNER(e, z, S))))); /* keeps -0 */
  R *c = let(e, add(e, kd(e, 1), mul(e, z, HORNER(e, z, C))));
  LV *v = var(e, s);
  when_01(e, band(e, q, ku(e, 1)), v, c);
  when_01(e, band(e, shr(e, q, ku(e, 1)), ku(e, 1)), v, neg(e, rv(v)));
  /* past the exact range the reduction degrades: keep the results in [-1, 1] */
  when(e, gt(e, rv(v), kd(e, 1)), v, kd(e, 1));
  when(e, lt(e, rv(v), kd(e, -1)), v, kd(e, -1));
  return let(e, cast(e, rv(v), m->f32));
}

/* --- pow (f32), computed in double --------------------------------------- */

/* ln(ax) for a finite float ax > 0 (finite garbage for 0, inf and NaN: the
   caller selects those), in double with relative error < 2^-36: ax = 2^k m,
   m in [sqrt(1/2), sqrt(2)), f = m - 1, log(1+f) = 2 atanh(s), s = f/(2+f),
   series to s^13 */
static R *log_d_of_f(em *e, R *ax) {
  static const double A[] = {2.0 / 13, 2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3};
  cpu_math *m = e->m;
  LV *xv = var(e, ax), *ka = var(e, ki(e, 0));
  R *tiny = lt(e, ax, kf(e, 1.17549435e-38));
  when(e, tiny, xv, mul(e, ax, kf(e, 8388608.0)));
  when(e, tiny, ka, ki(e, -23));
  R *u = let(e, fbits(e, rv(xv)));
  R *k = add(e, sub(e, cast(e, shr(e, u, ku(e, 23)), m->i32), ki(e, 127)), rv(ka));
  LV *mant = var(e, ffrom(e, bor(e, band(e, u, ku(e, 0x007FFFFFu)), ku(e, 0x3F800000u))));
  LV *kv = var(e, k);
  R *big = gt(e, rv(mant), kf(e, 1.41421356237309505));
  when(e, big, kv, add(e, rv(kv), ki(e, 1)));
  when(e, big, mant, mul(e, rv(mant), kf(e, 0.5)));
  R *f = let(e, sub(e, cast(e, rv(mant), m->f64), kd(e, 1)));
  R *s = let(e, dv(e, f, add(e, kd(e, 2), f)));
  R *z = let(e, mul(e, s, s));
  R *logm = add(e, add(e, s, s), mul(e, mul(e, s, z), HORNER(e, z, A)));
  return let(e, add(e, mul(e, cast(e, rv(kv), m->f64), kd(e, 0.693147180559945309)), logm));
}

/* e^t for a double t, result rounded to float: |t| clamped to 200 (NaN passes),
   n = rint(t/ln2), r = t - n ln2 (two parts), Taylor to r^9 (2^-36) */
static R *exp_d_to_f(em *e, R *t) {
  static const double T[] = {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                             1.0 / 24,     1.0 / 6,     0.5,        1,         1};
  cpu_math *m = e->m;
  R *tc = clampf(e, t, -200, 200);
  R *magic = kd(e, 6755399441055744.0);
  R *k = let(e, add(e, mul(e, tc, kd(e, 1.44269504088896340736)), magic));
  R *n = let(e, sub(e, k, magic));
  R *r = sub(e, tc, mul(e, n, kd(e, 6.93147180369123816490e-01)));
  r = let(e, sub(e, r, mul(e, n, kd(e, 1.90821492927058770002e-10))));
  R *p = HORNER(e, r, T);
  /* 2^n: n in [-289, 289]; low 32 bits of k hold n in two's complement */
  R *ni = cast(e, cast(e, dbits(e, k), m->u32), m->i32);
  R *e2 = shl(e, cast(e, cast(e, add(e, ni, ki(e, 1023)), m->i64), m->u64), kul(e, 52));
  return let(e, cast(e, mul(e, p, dfrom(e, e2)), m->f32));
}

/* powf with C99 Annex F special cases (see math.h) */
static R *pow_f(em *e, R *x, R *y) {
  cpu_math *m = e->m;
  gcc_jit_type *bt = gcc_jit_context_get_type(e->c, GCC_JIT_TYPE_BOOL);
  R *ax = let(e, fab(e, x));
  R *ay = let(e, fab(e, y));
  R *l = log_d_of_f(e, ax);
  LV *res = var(e, exp_d_to_f(e, mul(e, cast(e, y, m->f64), l)));
  R *yneg = let(e, lt(e, y, kf(e, 0)));
  /* |x| = 0 or inf: 0 or inf by the sign of y; NaN x or y: NaN */
  LV *zr = var(e, kf(e, 0)), *ir = var(e, kf(e, F_INF));
  when(e, yneg, zr, kf(e, F_INF));
  when(e, yneg, ir, kf(e, 0));
  when(e, eq(e, ax, kf(e, 0)), res, rv(zr));
  when(e, eq(e, ax, kf(e, F_INF)), res, rv(ir));
  when(e, bin(e, GCC_JIT_BINARY_OP_BITWISE_OR, ne(e, x, x), ne(e, y, y)), res, kf(e, F_NAN));
  /* integer / odd-integer y: |y| >= 2^24 is even; clamping to 2^30 also maps
     inf and NaN to "even integer" */
  LV *yc = var(e, ay);
  when(e, not_(e, lt(e, ay, kf(e, 1073741824.0))), yc, kf(e, 1073741824.0));
  R *iy = let(e, cast(e, rv(yc), m->i32));
  R *is_int = let(e, eq(e, cast(e, iy, m->f32), rv(yc)));
  /* negative base (sign bit: -0 and -inf too) and odd integer y: flip */
  R *flip = band(e, band(e, cast(e, iy, m->u32), shr(e, fbits(e, x), ku(e, 31))),
                 cast(e, is_int, m->u32));
  R *r0 = rv(res);
  when_01(e, flip, res, neg(e, r0));
  /* finite x < 0 with non-integer y: NaN */
  R *bad = bin(e, GCC_JIT_BINARY_OP_BITWISE_AND, lt(e, x, kf(e, 0)), gt(e, x, kf(e, -F_INF)));
  bad = gcc_jit_context_new_binary_op(e->c, NULL, GCC_JIT_BINARY_OP_BITWISE_AND, bt, bad,
                                      not_(e, is_int));
  when(e, bad, res, kf(e, F_NAN));
  /* pow(x, ±0) = 1, pow(1, y) = 1, pow(-1, ±inf) = 1 */
  R *one = bin(e, GCC_JIT_BINARY_OP_BITWISE_OR, eq(e, y, kf(e, 0)), eq(e, x, kf(e, 1)));
  R *m1 = bin(e, GCC_JIT_BINARY_OP_BITWISE_AND, eq(e, x, kf(e, -1)), eq(e, ay, kf(e, F_INF)));
  when(e, bin(e, GCC_JIT_BINARY_OP_BITWISE_OR, one, m1), res, kf(e, 1));
  return rv(res);
}

/* --- emission --------------------------------------------------------------- */

static gcc_jit_function *sqrt_fn(cpu_math *m, bool f64) {
  if (!m->sqrt_builtin[f64])
    m->sqrt_builtin[f64] =
        gcc_jit_context_get_builtin_function(m->ctx, f64 ? "__builtin_sqrt" : "__builtin_sqrtf");
  return m->sqrt_builtin[f64];
}

static R *call1(em *e, gcc_jit_function *f, R *x) {
  return gcc_jit_context_new_call(e->c, NULL, f, 1, &x);
}

/* libm's double function for fn (the imported declaration, made once) */
static gcc_jit_function *libm_fn(cpu_math *m, cpu_fn fn) {
  if (!m->libm[fn]) {
    gcc_jit_param *ps[2] = {gcc_jit_context_new_param(m->ctx, NULL, m->f64, "x"),
                            gcc_jit_context_new_param(m->ctx, NULL, m->f64, "y")};
    m->libm[fn] = gcc_jit_context_new_function(m->ctx, NULL, GCC_JIT_FUNCTION_IMPORTED, m->f64,
                                               names[fn], fn == CPU_POW ? 2 : 1, ps, 0);
  }
  return m->libm[fn];
}

static void emit_body(em *e, cpu_fn fn, bool f64, R *x, R *y) {
  R *res = NULL;
  if (f64) {
    switch (fn) {
      case CPU_SQRT:
        res = call1(e, sqrt_fn(e->m, true), x);
        break;
      case CPU_RSQRT:
        res = dv(e, kd(e, 1), call1(e, sqrt_fn(e->m, true), x));
        break;
      case CPU_SIGMOID:
        res = dv(e, kd(e, 1), add(e, kd(e, 1), call1(e, libm_fn(e->m, CPU_EXP), neg(e, x))));
        break;
      case CPU_POW: {
        R *args[2] = {x, y};
        res = gcc_jit_context_new_call(e->c, NULL, libm_fn(e->m, CPU_POW), 2, args);
        break;
      }
      default:
        res = call1(e, libm_fn(e->m, fn), x);
        break;
    }
  } else {
    switch (fn) {
      case CPU_EXP:
        res = exp_f(e, x);
        break;
      case CPU_LOG:
        res = log_f(e, x);
        break;
      case CPU_TANH:
        res = tanh_f(e, x);
        break;
      case CPU_SIGMOID:
        res = sigmoid_f(e, x);
        break;
      case CPU_SIN:
        res = sincos_f(e, x, false);
        break;
      case CPU_COS:
        res = sincos_f(e, x, true);
        break;
      case CPU_LOG1P:
        res = log1p_f(e, x);
        break;
      case CPU_EXPM1:
        res = expm1_f(e, x);
        break;
      case CPU_ERF:
        res = erf_f(e, x);
        break;
      case CPU_SQRT:
        res = call1(e, sqrt_fn(e->m, false), x);
        break;
      case CPU_RSQRT:
        res = dv(e, kf(e, 1), call1(e, sqrt_fn(e->m, false), x));
        break;
      case CPU_POW:
        res = pow_f(e, x, y);
        break;
      case CPU_FN_COUNT:
        break;
    }
  }
  gcc_jit_block_end_with_return(e->b, NULL, res);
}

static gcc_jit_function *get_fn(cpu_math *m, cpu_fn fn, bool f64) {
  if (m->fn[f64][fn]) return m->fn[f64][fn];
  gcc_jit_type *t = f64 ? m->f64 : m->f32;
  gcc_jit_param *ps[2] = {gcc_jit_context_new_param(m->ctx, NULL, t, "x"),
                          gcc_jit_context_new_param(m->ctx, NULL, t, "y")};
  char name[48];
  snprintf(name, sizeof name, "kiln_math_%s_%s", names[fn], f64 ? "f64" : "f32");
  gcc_jit_function *f = gcc_jit_context_new_function(m->ctx, NULL, GCC_JIT_FUNCTION_ALWAYS_INLINE,
                                                     t, name, fn == CPU_POW ? 2 : 1, ps, 0);
  em e = {m, m->ctx, f, gcc_jit_function_new_block(f, "entry"), 0};
  emit_body(&e, fn, f64, gcc_jit_param_as_rvalue(ps[0]), gcc_jit_param_as_rvalue(ps[1]));
  m->fn[f64][fn] = f;
  return f;
}

gcc_jit_rvalue *cpu_math_call(cpu_math *m, cpu_fn fn, bool f64, gcc_jit_rvalue *x,
                              gcc_jit_rvalue *y) {
  if (!m || (unsigned)fn >= CPU_FN_COUNT || !x || (fn == CPU_POW && !y)) return NULL;
  gcc_jit_type *t = f64 ? m->f64 : m->f32;
  gcc_jit_function *f = get_fn(m, fn, f64);
  R *args[2] = {x, y};
  int n = fn == CPU_POW ? 2 : 1;
  for (int i = 0; i < n; i++)
    if (!gcc_jit_compatible_types(gcc_jit_rvalue_get_type(args[i]), t))
      args[i] = gcc_jit_context_new_cast(m->ctx, NULL, args[i], t);
  return gcc_jit_context_new_call(m->ctx, NULL, f, n, args);
}
