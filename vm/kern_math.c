/* kern_math.c — the interpreter's f32 transcendental rows (exp, log, tanh,
 * sigmoid, sin, cos, erf, log1p, expm1, pow): vm/vmath.h, the compiled
 * kernels' own algorithms, built twice — with explicit fma as vector code
 * for x86-64-v3 and up, and with separate multiply and add for the rest —
 * and chosen at run time by vm_cpu_fma(), the rule the JIT uses to pick its
 * variant, so both compute the same bits on any machine.  f64 math calls
 * libm in both (kern_elementwise.c). */
#include <string.h>

#include "cpu.h"
#include "kernels.h"

#define VMATH_FMA 0
#include "vmath.h"
#undef VMATH_FMA

#if defined(__x86_64__)
#define VMATH_HAVE_FMA 1
#undef VMATH_ATTR
#define VMATH_ATTR __attribute__((target("arch=x86-64-v3")))
#define VMATH_FMA 1
#include "vmath.h"
#undef VMATH_FMA
#undef VMATH_ATTR
#define VMATH_ATTR
#endif

#define MATH_UNARY_ROW(fname, ATTR, FN)                                      \
  ATTR static void fname(void *ctx, char **p, const int64_t *s, int64_t n) { \
    (void)ctx;                                                               \
    float *restrict o = (float *)p[0];                                       \
    const float *restrict a = (const float *)p[1];                           \
    int64_t so = s[0], sa = s[1];                                            \
    if (so == 1 && sa == 1)                                                  \
      for (int64_t i = 0; i < n; i++) o[i] = FN(a[i]);                       \
    else                                                                     \
      for (int64_t i = 0; i < n; i++) o[i * so] = FN(a[i * sa]);             \
  }

#define MATH_POW_ROW(fname, ATTR, FN)                                                 \
  ATTR static void fname(void *ctx, char **p, const int64_t *s, int64_t n) {          \
    (void)ctx;                                                                        \
    float *restrict o = (float *)p[0];                                                \
    const float *restrict a = (const float *)p[1], *restrict b = (const float *)p[2]; \
    int64_t so = s[0], sa = s[1], sb = s[2];                                          \
    if (so == 1 && sa == 1 && sb == 1)                                                \
      for (int64_t i = 0; i < n; i++) o[i] = FN(a[i], b[i]);                          \
    else if (so == 1 && sa == 1 && sb == 0)                                           \
      for (int64_t i = 0; i < n; i++) o[i] = FN(a[i], b[0]);                          \
    else                                                                              \
      for (int64_t i = 0; i < n; i++) o[i * so] = FN(a[i * sa], b[i * sb]);           \
  }

/* X(op, vmath function) */
#define MATH_OPS(X)       \
  X(exp, vm_expf)         \
  X(log, vm_logf)         \
  X(tanh, vm_tanhf)       \
  X(sigmoid, vm_sigmoidf) \
  X(sin, vm_sinf)         \
  X(cos, vm_cosf)         \
  X(erf, vm_erff)         \
  X(log1p, vm_log1pf)     \
  X(expm1, vm_expm1f)

#define DEF_PLAIN(op, fn) MATH_UNARY_ROW(op##_plain_row, , fn##_plain)
MATH_OPS(DEF_PLAIN)
MATH_POW_ROW(pow_plain_row, , vm_powf_plain)
#ifdef VMATH_HAVE_FMA
#define V3 __attribute__((target("arch=x86-64-v3")))
#define DEF_FMA(op, fn) MATH_UNARY_ROW(op##_fma_row, V3, fn##_fma)
MATH_OPS(DEF_FMA)
MATH_POW_ROW(pow_fma_row, V3, vm_powf_fma)
/* the same functions as 512-bit vector code where the CPU runs x86-64-v4
   (its compiled kernels do too): each lane's arithmetic is the v3 row's,
   so the bits are; twice the lanes per instruction and twice the
   registers (the v3 rows keep coefficients on the stack).  Attention's
   exp ran at a tenth of W18h's time on v3 rows. */
#define V4 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))
#define DEF_V4(op, fn) MATH_UNARY_ROW(op##_v4_row, V4, fn##_fma)
MATH_OPS(DEF_V4)
MATH_POW_ROW(pow_v4_row, V4, vm_powf_fma)
#endif

vm_row_fn vm_math_row_f32(vm_opcode op) {
#define ENTRY(op, fn) [VM_OP_##op] = op##_plain_row,
  static const vm_row_fn plain[VM_OP_COUNT] = {MATH_OPS(ENTRY)[VM_OP_pow] = pow_plain_row};
#undef ENTRY
#ifdef VMATH_HAVE_FMA
#define ENTRY(op, fn) [VM_OP_##op] = op##_fma_row,
  static const vm_row_fn fused[VM_OP_COUNT] = {MATH_OPS(ENTRY)[VM_OP_pow] = pow_fma_row};
#undef ENTRY
#define ENTRY(op, fn) [VM_OP_##op] = op##_v4_row,
  static const vm_row_fn wide[VM_OP_COUNT] = {MATH_OPS(ENTRY)[VM_OP_pow] = pow_v4_row};
#undef ENTRY
  if (vm_cpu_fma() && !strcmp(vm_cpu_isa(), "x86-64-v4")) return wide[op];
  if (vm_cpu_fma()) return fused[op];
#endif
  return plain[op];
}

#define CASE(o, fn) \
  case VM_OP_##o:   \
    return fn##_plain(x);
static float math_plain(vm_opcode op, float x, float y) {
  switch (op) {
    MATH_OPS(CASE)
    case VM_OP_pow:
      return vm_powf_plain(x, y);
    default:
      return 0;
  }
}
#undef CASE
#ifdef VMATH_HAVE_FMA
#define CASE(o, fn) \
  case VM_OP_##o:   \
    return fn##_fma(x);
V3 static float math_fma(vm_opcode op, float x, float y) {
  switch (op) {
    MATH_OPS(CASE)
    case VM_OP_pow:
      return vm_powf_fma(x, y);
    default:
      return 0;
  }
}
#undef CASE
#endif

float vm_math_f32(vm_opcode op, bool fma, float x, float y) {
#ifdef VMATH_HAVE_FMA
  if (fma) return math_fma(op, x, y);
#else
  (void)fma;
#endif
  return math_plain(op, x, y);
}
