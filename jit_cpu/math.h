/* math.h — vectorizable transcendental functions for the libgccjit CPU
 * backend (DESIGN §6).
 *
 * The kernel generator asks for fn(x) as an rvalue while it builds a
 * context; the first request for a function emits it into the context as an
 * always-inline helper (once per context), so after inlining GCC sees plain
 * arithmetic, bit casts and bitwise selects, with no calls and no control
 * flow, and the loop vectorizes.  Nothing here calls libm for f32.
 *
 * Compile options the context needs (the generator sets them): -O3
 * (GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL 3), -fno-math-errno (else sqrtf is
 * a call), an explicit -march= (libgccjit 12 rejects -march=native).
 * -ffp-contract=off and =fast (FMA) both keep the bounds below.  Never
 * -ffast-math, -ffinite-math-only, -fassociative-math or -funsafe-math-
 * optimizations: the reductions and the NaN/inf handling rely on IEEE
 * semantics.  exp, log, tanh, sigmoid, log1p, expm1, erf, sqrt and rsqrt
 * vectorize on any x86-64; sin, cos and pow compute in double and
 * vectorize from -march=x86-64-v2 up (scalar, still correct, on baseline
 * x86-64).
 *
 * f32 accuracy: max error in ulps of the float result against the exact
 * value (double libm); "bound" is what cpu_math_ulp_bound() returns and
 * tests/test_jit_math.c asserts, "measured" the worst case over every float
 * (exhaustive check, with and without FMA contraction, and on baseline
 * x86-64 where the helpers have no fma; with fma, x86-64-v3+, the maxima
 * are exp 0.78, log 0.83, tanh 1.35, sigmoid 2.41, sin/cos 0.51, log1p
 * 0.84, expm1 0.99, erf 1.05).  Denormal inputs and
 * results are handled (no flush to zero); NaN in gives NaN out; zero and
 * infinite results are exactly libm's, signs included.
 *
 *   fn       bound  measured  notes
 *   EXP      1      0.78      inf for x > 88.7228, 0 below -103.97
 *   LOG      1      0.83      log(±0) = -inf, log(x < 0) = NaN, log(inf) = inf
 *   TANH     1.5    1.35      tanh(±inf) = ±1, tanh(-0) = -0
 *   SIGMOID  2.5    2.41      vs 1/(1+exp(-x)) computed exactly.  Below
 *                             x = -88.7 it returns the tiny true value
 *                             (a float 1/(1+expf(-x)) would give 0)
 *   SIN/COS  1      0.51      for |x| < 2^27 pi/2 (2.1e8), where the
 *                             reduction is exact.  Beyond, the absolute
 *                             error is about |x| 2^-53 without FMA (1e-4 at
 *                             2^40); with FMA contraction it stays < 4e-8
 *                             up to |x| ~ 2^48; results always stay in
 *                             [-1, 1]; sin/cos(±inf) = NaN
 *   LOG1P    1      0.84      log1p(-1) = -inf, log1p(x < -1) = NaN, keeps -0
 *   EXPM1    1.5    1.01      expm1(-inf) = -1, overflow to inf, keeps -0
 *   ERF      1.5    1.24      erf(±inf) = ±1, keeps -0
 *   SQRT     0.5    0.5       the sqrtf instruction
 *   RSQRT    1.5    1.49      1/sqrtf(x)
 *   POW      1      0.50      (random pairs; not exhaustive) powf's C99
 *                             Annex F special cases: pow(x, ±0) = 1,
 *                             pow(1, y) = 1 even for NaN y, pow(-1, ±inf) =
 *                             1, negative x with odd / even integer y
 *                             (sign), NaN for negative finite x and
 *                             non-integer y, signed zeros and infinities of
 *                             pow(±0, y) and pow(±inf, y); computed as
 *                             exp(y log|x|) in double
 *
 * f64 calls libm through imported functions (exp, log, tanh, sin, cos, log1p,
 * expm1, erf, pow) and composes sigmoid = 1/(1+exp(-x)) and rsqrt =
 * 1/sqrt(x) (sqrt is the builtin): bit-identical to the interpreter, not
 * vectorized.  The process must provide those libm symbols when the result
 * is loaded (Kiln links libm; a shared object written with
 * gcc_jit_context_compile_to_file and dlopened elsewhere needs the driver
 * option -lm).
 *
 * The interpreter computes the same f32 values bit for bit: vm/vmath.h
 * is this IR in C, step for step (tests/test_jit_math.c compares them).
 *
 * The file is named math.h as asked: never put jit_cpu/ on the include path
 * (-Ijit_cpu), or <math.h> elsewhere would find this one; include it as
 * "math.h" from jit_cpu/ or "../jit_cpu/math.h". */
#ifndef KILN_JIT_CPU_MATH_H
#define KILN_JIT_CPU_MATH_H

#include <libgccjit.h>
#include <stdbool.h>

typedef enum {
  CPU_EXP,
  CPU_LOG,
  CPU_TANH,
  CPU_SIGMOID,
  CPU_SIN,
  CPU_COS,
  CPU_LOG1P,
  CPU_EXPM1,
  CPU_ERF,
  CPU_SQRT,
  CPU_RSQRT,
  CPU_POW,
  CPU_FN_COUNT
} cpu_fn;

/* per-context cache of emitted helper functions */
typedef struct cpu_math cpu_math;

/* NULL only when out of memory.  fma: the context's -march has fused
   multiply-add (x86-64-v3 and up); the helpers then use it explicitly
   (fewer instructions, one rounding), else separate multiply and add. */
cpu_math *cpu_math_new(gcc_jit_context *ctx, bool fma);
/* after the context is compiled/released (the helpers belong to the context) */
void cpu_math_free(cpu_math *m);

/* An rvalue computing fn(x) (fn(x, y) for CPU_POW; y is ignored otherwise)
 * in float (f64 false) or double (f64 true).  x and y are cast to that type
 * when they have another numeric type.  The call may be used in any block of
 * any function of the context. */
gcc_jit_rvalue *cpu_math_call(cpu_math *m, cpu_fn fn, bool f64, gcc_jit_rvalue *x,
                              gcc_jit_rvalue *y);

/* the name of fn ("exp", "pow", ...) */
const char *cpu_math_name(cpu_fn fn);

/* the documented max error of the f32 version in ulps (0 for f64: exact libm) */
double cpu_math_ulp_bound(cpu_fn fn, bool f64);

#endif
