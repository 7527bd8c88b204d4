/* kern_elementwise.c — the interpreter's elementwise kernels: one row
 * function per (op, compute dtype), generated from per-op expressions, with
 * unit-stride and scalar-broadcast fast paths GCC vectorizes; plus casts and
 * the leaf fills (full, arange).  Semantics: docs/SEMANTICS.md. */
#include <string.h>
#include <tgmath.h>

#include "fold.h"
#include "kernels.h"
#include "pool.h"
#include "rng.h"
#include "state.h"

/* --- row templates ------------------------------------------------------ */

/* AVX2 code for AVX2 and AVX-512 machines alike: an elementwise row computes
   each element alone, so its bits do not depend on the vector width (the
   libm calls stay scalar calls in every clone) */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define ROW_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define ROW_CLONES
#endif

#define UNARY_ROW(fname, TI, TO, EXPR)                                             \
  ROW_CLONES static void fname(void *ctx, char **p, const int64_t *s, int64_t n) { \
    (void)ctx;                                                                     \
    TO *restrict o = (TO *)p[0];                                                   \
    const TI *restrict a = (const TI *)p[1];                                       \
    int64_t so = s[0], sa = s[1];                                                  \
    if (so == 1 && sa == 1) {                                                      \
      for (int64_t i = 0; i < n; i++) {                                            \
        TI x = a[i];                                                               \
        o[i] = (TO)(EXPR);                                                         \
      }                                                                            \
    } else {                                                                       \
      for (int64_t i = 0; i < n; i++) {                                            \
        TI x = a[i * sa];                                                          \
        o[i * so] = (TO)(EXPR);                                                    \
      }                                                                            \
    }                                                                              \
  }

#define BINARY_LOOP(T, TO, XV, YV, EXPR) \
  for (int64_t i = 0; i < n; i++) {      \
    T x = XV, y = YV;                    \
    o[i * so] = (TO)(EXPR);              \
  }

#define BINARY_ROW(fname, T, TO, EXPR)                                             \
  ROW_CLONES static void fname(void *ctx, char **p, const int64_t *s, int64_t n) { \
    (void)ctx;                                                                     \
    TO *restrict o = (TO *)p[0];                                                   \
    const T *restrict a = (const T *)p[1], *restrict b = (const T *)p[2];          \
    int64_t sa = s[1], sb = s[2], so = 1;                                          \
    if (s[0] != 1) {                                                               \
      so = s[0];                                                                   \
      BINARY_LOOP(T, TO, a[i * sa], b[i * sb], EXPR)                               \
    } else if (sa == 1 && sb == 1) {                                               \
      BINARY_LOOP(T, TO, a[i], b[i], EXPR)                                         \
    } else if (sa == 1 && sb == 0) {                                               \
      const T y0 = *b;                                                             \
      BINARY_LOOP(T, TO, a[i], y0, EXPR)                                           \
    } else if (sa == 0 && sb == 1) {                                               \
      const T x0 = *a;                                                             \
      BINARY_LOOP(T, TO, x0, b[i], EXPR)                                           \
    } else {                                                                       \
      BINARY_LOOP(T, TO, a[i * sa], b[i * sb], EXPR)                               \
    }                                                                              \
  }

#define WHERE_ROW(fname, T)                                                          \
  ROW_CLONES static void fname(void *ctx, char **p, const int64_t *s, int64_t n) {   \
    (void)ctx;                                                                       \
    T *restrict o = (T *)p[0];                                                       \
    const bool *restrict c = (const bool *)p[1];                                     \
    const T *restrict a = (const T *)p[2], *restrict b = (const T *)p[3];            \
    int64_t so = s[0], sc = s[1], sa = s[2], sb = s[3];                              \
    if (so == 1 && sc == 1 && sa == 1 && sb == 1) {                                  \
      for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];                     \
    } else {                                                                         \
      for (int64_t i = 0; i < n; i++) o[i * so] = c[i * sc] ? a[i * sa] : b[i * sb]; \
    }                                                                                \
  }

/* --- per-op expressions (x, y: operands; T: compute type; U: unsigned) --- */

static inline int64_t int_pow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)base;
  while (e) {
    if (e & 1) r *= b;
    b *= b;
    e >>= 1;
  }
  return (int64_t)r;
}

/* X(op, expression) lists, one per dtype class */
#define FLOAT_UNARY(X)                         \
  X(copy, x)                                   \
  X(neg, -x)                                   \
  X(abs, fabs(x))                              \
  X(sign, x != x ? x : (T)((x > 0) - (x < 0))) \
  X(floor, floor(x))                           \
  X(ceil, ceil(x))                             \
  X(round, nearbyint(x))                       \
  X(exp, exp(x))                               \
  X(log, log(x))                               \
  X(sqrt, sqrt(x))                             \
  X(rsqrt, (T)1 / sqrt(x))                     \
  X(sin, sin(x))                               \
  X(cos, cos(x))                               \
  X(tanh, tanh(x))                             \
  X(sigmoid, (T)1 / ((T)1 + exp(-x)))          \
  X(erf, erf(x))                               \
  X(log1p, log1p(x))                           \
  X(expm1, expm1(x))

#define INT_UNARY(X)                   \
  X(copy, x)                           \
  X(neg, (T)((U)0 - (U)x))             \
  X(abs, x < 0 ? (T)((U)0 - (U)x) : x) \
  X(sign, (T)((x > 0) - (x < 0)))      \
  X(floor, x)                          \
  X(ceil, x)                           \
  X(round, x)

/* uint8: never negative; neg wraps (as PyTorch's).  Every integer
   dtype's arithmetic wraps: it runs in the unsigned type U of its width */
#define UINT_UNARY(X)      \
  X(copy, x)               \
  X(neg, (T)((U)0 - (U)x)) \
  X(abs, x)                \
  X(sign, (T)(x != 0))     \
  X(floor, x)              \
  X(ceil, x)               \
  X(round, x)

#define BOOL_UNARY(X) \
  X(copy, x)          \
  X(abs, x)           \
  X(sign, x)          \
  X(floor, x)         \
  X(ceil, x)          \
  X(round, x)         \
  X(logical_not, !x)

#define FLOAT_BINARY(X)     \
  X(add, x + y)             \
  X(sub, x - y)             \
  X(mul, x *y)              \
  X(div, x / y)             \
  X(pow, pow(x, y))         \
  X(maximum, VM_FMAX(x, y)) \
  X(minimum, VM_FMIN(x, y))

#define INT_BINARY(X)       \
  X(add, (T)((U)x + (U)y))  \
  X(sub, (T)((U)x - (U)y))  \
  X(mul, (T)((U)x * (U)y))  \
  X(pow, (T)int_pow(x, y))  \
  X(maximum, x > y ? x : y) \
  X(minimum, x < y ? x : y)

#define BOOL_BINARY(X) \
  X(add, x | y)        \
  X(mul, x &y)         \
  X(maximum, x | y)    \
  X(minimum, x &y)     \
  X(logical_and, x &y) \
  X(logical_or, x | y)

#define COMPARE(X) X(eq, x == y) X(ne, x != y) X(lt, x < y) X(le, x <= y) X(gt, x > y) X(ge, x >= y)

/* --- instantiation ------------------------------------------------------ */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define DEF_UNARY(op, expr) UNARY_ROW(CAT(op, SFX), T, T, expr)
#define DEF_BINARY(op, expr) BINARY_ROW(CAT(op, SFX), T, T, expr)
#define DEF_COMPARE(op, expr) BINARY_ROW(CAT(op, SFX), T, bool, expr)

#define T float
#define SFX f32
FLOAT_UNARY(DEF_UNARY)
FLOAT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_f32, float)
#undef T
#undef SFX
#define T double
#define SFX f64
FLOAT_UNARY(DEF_UNARY)
FLOAT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_f64, double)
#undef T
#undef SFX
#define T int32_t
#define U uint32_t
#define SFX i32
INT_UNARY(DEF_UNARY)
INT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_i32, int32_t)
#undef T
#undef U
#undef SFX
#define T int64_t
#define U uint64_t
#define SFX i64
INT_UNARY(DEF_UNARY)
INT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_i64, int64_t)
#undef T
#undef U
#undef SFX
/* the narrow integers wrap through unsigned int: C promotes a uint16_t
   operand to int, where 65535 * 65535 would overflow */
#define T uint8_t
#define U unsigned
#define SFX u8
UINT_UNARY(DEF_UNARY)
INT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_u8, uint8_t)
#undef T
#undef U
#undef SFX
#define T int8_t
#define U unsigned
#define SFX i8
INT_UNARY(DEF_UNARY)
INT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_i8, int8_t)
#undef T
#undef U
#undef SFX
#define T int16_t
#define U unsigned
#define SFX i16
INT_UNARY(DEF_UNARY)
INT_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_i16, int16_t)
#undef T
#undef U
#undef SFX
#define T bool
#define SFX b8
BOOL_UNARY(DEF_UNARY)
BOOL_BINARY(DEF_BINARY)
COMPARE(DEF_COMPARE)
WHERE_ROW(where_b8, bool)
#undef T
#undef SFX

/* table: rows[op][compute dtype]; NULL where the op rejects the dtype
   (inference refused it before a kernel is looked up) */
#define ENTRY(op, expr) [VM_OP_##op][DT] = CAT(op, SFX),
static const vm_row_fn rows[VM_OP_COUNT][VM_NUM_DTYPES] = {
#define DT KILN_F32
#define SFX f32
    FLOAT_UNARY(ENTRY) FLOAT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_F64
#define SFX f64
        FLOAT_UNARY(ENTRY) FLOAT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_I32
#define SFX i32
            INT_UNARY(ENTRY) INT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_I64
#define SFX i64
                INT_UNARY(ENTRY) INT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_U8
#define SFX u8
                    UINT_UNARY(ENTRY) INT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_I8
#define SFX i8
                        INT_UNARY(ENTRY) INT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_I16
#define SFX i16
                            INT_UNARY(ENTRY) INT_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
#define DT KILN_BOOL
#define SFX b8
                                BOOL_UNARY(ENTRY) BOOL_BINARY(ENTRY) COMPARE(ENTRY) ENTRY(where, _)
#undef DT
#undef SFX
};

/* A half op's row: its operands in chunks, the halves widened to f32 in
   local buffers, the f32 row over them, a half result rounded back (DESIGN
   §13).  So a half op computes exactly what its f32 op computes on the
   widened values, rounded once: what compiled kernels compute. */
typedef struct {
  vm_row_fn row32;
  int nops;
  kiln_dtype dt[4]; /* each operand's dtype: a half, or passed through */
} half_ctx;

enum { HALF_CHUNK = 256 };

/* m halves at stride s into f32 (unit stride: a loop GCC vectorizes) */
static void widen_chunk(kiln_dtype dt, const uint16_t *restrict src, int64_t s, float *restrict dst,
                        int64_t m) {
  if (dt == KILN_BF16 && s == 1)
    for (int64_t i = 0; i < m; i++) dst[i] = vm_bf16_to_f32(src[i]);
  else if (dt == KILN_BF16)
    for (int64_t i = 0; i < m; i++) dst[i] = vm_bf16_to_f32(src[i * s]);
  else if (s == 1)
    for (int64_t i = 0; i < m; i++) dst[i] = vm_f16_to_f32(src[i]);
  else
    for (int64_t i = 0; i < m; i++) dst[i] = vm_f16_to_f32(src[i * s]);
}

static void narrow_chunk(kiln_dtype dt, const float *restrict src, uint16_t *restrict dst,
                         int64_t s, int64_t m) {
  if (dt == KILN_BF16 && s == 1)
    for (int64_t i = 0; i < m; i++) dst[i] = vm_f32_to_bf16(src[i]);
  else if (dt == KILN_BF16)
    for (int64_t i = 0; i < m; i++) dst[i * s] = vm_f32_to_bf16(src[i]);
  else if (s == 1)
    for (int64_t i = 0; i < m; i++) dst[i] = vm_f32_to_f16(src[i]);
  else
    for (int64_t i = 0; i < m; i++) dst[i * s] = vm_f32_to_f16(src[i]);
}

static void half_row(void *ctx, char **p, const int64_t *s, int64_t n) {
  const half_ctx *h = ctx;
  float buf[4][HALF_CHUNK];
  for (int64_t at = 0; at < n; at += HALF_CHUNK) {
    int64_t m = n - at < HALF_CHUNK ? n - at : HALF_CHUNK;
    char *q[4];
    int64_t qs[4];
    for (int k = 0; k < h->nops; k++) {
      kiln_dtype dt = h->dt[k];
      if (!vm_dtype_is_half(dt)) { /* bool: a condition or a comparison's result */
        q[k] = p[k] + at * s[k] * (int64_t)vm_dtype_size(dt);
        qs[k] = s[k];
        continue;
      }
      q[k] = (char *)buf[k];
      qs[k] = 1;
      if (k > 0) widen_chunk(dt, (const uint16_t *)p[k] + at * s[k], s[k], buf[k], m);
    }
    h->row32(NULL, q, qs, m);
    if (vm_dtype_is_half(h->dt[0]))
      narrow_chunk(h->dt[0], buf[0], (uint16_t *)p[0] + at * s[0], s[0], m);
  }
}

bool vm_k_elementwise(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *in) {
  kiln_dtype dt = in[n == 3 ? 1 : 0]->dtype, cdt = vm_dtype_compute(dt);
  vm_row_fn row = rows[op][cdt];
  if (cdt == KILN_F32 && vm_math_row_f32(op)) row = vm_math_row_f32(op); /* the kernels' math */
  if (!row) {
    vm_error(KILN_ERR_INTERNAL, "no %s kernel for %s", vm_op_table[op].name, vm_dtype_name(dt));
    return false;
  }
  vm_tensor *ops[4] = {out, in[0], n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL};
  vm_iter it;
  vm_iter_init(&it, n + 1, ops);
  if (cdt == dt) {
    vm_iter_run(&it, row, NULL);
    return true;
  }
  half_ctx h = {.row32 = row, .nops = n + 1};
  for (int k = 0; k <= n; k++) h.dt[k] = ops[k]->dtype;
  vm_iter_run(&it, half_row, &h);
  return true;
}

/* --- casts: every (from, to) pair ------------------------------------------
   float -> int saturates, NaN -> 0; int -> int wraps (two's complement);
   to a half rounds once from f32 (a double or an integer goes through f32,
   as PyTorch's conversions do); from a half widens exactly first. */

#define TO_INT(TO, MIN, MAX) \
  (x != x ? (TO)0 : x <= (MIN) ? (TO)(MIN) : x >= (MAX) ? (TO)(MAX) : (TO)x)

/* X(short name, C type, min, max): the integer dtypes */
#define INTS(X)                         \
  X(i32, int32_t, INT32_MIN, INT32_MAX) \
  X(i64, int64_t, INT64_MIN, INT64_MAX) \
  X(u8, uint8_t, 0, UINT8_MAX)          \
  X(i8, int8_t, INT8_MIN, INT8_MAX)     \
  X(i16, int16_t, INT16_MIN, INT16_MAX)
/* X(short name, C type): bool and the integers, and each of them as a
   target (a second list: a macro cannot expand inside itself) */
#define INTLIKE(X) \
  X(b8, bool) X(i32, int32_t) X(i64, int64_t) X(u8, uint8_t) X(i8, int8_t) X(i16, int16_t)
#define INTLIKE_TO(X, fs, FT)         \
  X(fs, FT, b8, bool, x != 0)         \
  X(fs, FT, i32, int32_t, (int32_t)x) \
  X(fs, FT, i64, int64_t, (int64_t)x) \
  X(fs, FT, u8, uint8_t, (uint8_t)x)  \
  X(fs, FT, i8, int8_t, (int8_t)x) X(fs, FT, i16, int16_t, (int16_t)x)
/* X(short name, C type, its value as a float of type W, W): the floats
   (a half widens exactly to f32 first) */
#define FLOATS(X)                             \
  X(f32, float, x, float)                     \
  X(f64, double, x, double)                   \
  X(bf16, uint16_t, vm_bf16_to_f32(x), float) \
  X(f16, uint16_t, vm_f16_to_f32(x), float)
#define FLOAT_TO_INTS(X, fs, FT, WIDEN, W)      \
  X(fs, FT, i32, int32_t, to_int_##fs##_i32(x)) \
  X(fs, FT, i64, int64_t, to_int_##fs##_i64(x)) \
  X(fs, FT, u8, uint8_t, to_int_##fs##_u8(x))   \
  X(fs, FT, i8, int8_t, to_int_##fs##_i8(x))    \
  X(fs, FT, i16, int16_t, to_int_##fs##_i16(x)) X(fs, FT, b8, bool, (WIDEN) != 0)

#define DEF_CAST(fs, FT, ts, TT, EXPR) UNARY_ROW(cast_##fs##_##ts, FT, TT, EXPR)

/* int-like -> int-like: wraps (two's complement), != 0 to bool */
#define DEF_FROM_INTLIKE(fs, FT) INTLIKE_TO(DEF_CAST, fs, FT)
INTLIKE(DEF_FROM_INTLIKE)

/* float -> integer: saturates, NaN -> 0 (a helper per pair) */
#define DEF_TO_INT_HELPER(ts, TT, MIN, MAX)                                   \
  static inline TT to_int_f32_##ts(float x) { return TO_INT(TT, MIN, MAX); }  \
  static inline TT to_int_f64_##ts(double x) { return TO_INT(TT, MIN, MAX); } \
  static inline TT to_int_bf16_##ts(uint16_t h) {                             \
    float x = vm_bf16_to_f32(h);                                              \
    return TO_INT(TT, MIN, MAX);                                              \
  }                                                                           \
  static inline TT to_int_f16_##ts(uint16_t h) {                              \
    float x = vm_f16_to_f32(h);                                               \
    return TO_INT(TT, MIN, MAX);                                              \
  }
INTS(DEF_TO_INT_HELPER)
#define DEF_FROM_FLOAT(fs, FT, WIDEN, W) FLOAT_TO_INTS(DEF_CAST, fs, FT, WIDEN, W)
FLOATS(DEF_FROM_FLOAT)

/* int-like -> float: to a half through f32 (as PyTorch's), rounded once */
#define DEF_INT_TO_FLOATS(fs, FT)                                     \
  UNARY_ROW(cast_##fs##_f32, FT, float, (float)x)                     \
  UNARY_ROW(cast_##fs##_f64, FT, double, (double)x)                   \
  UNARY_ROW(cast_##fs##_bf16, FT, uint16_t, vm_f32_to_bf16((float)x)) \
  UNARY_ROW(cast_##fs##_f16, FT, uint16_t, vm_f32_to_f16((float)x))
INTLIKE(DEF_INT_TO_FLOATS)

/* float -> float: a half widens exactly; to a half from f64 through f32 */
UNARY_ROW(cast_f32_f64, float, double, x)
UNARY_ROW(cast_f64_f32, double, float, x)
UNARY_ROW(cast_bf16_f32, uint16_t, float, vm_bf16_to_f32(x))
UNARY_ROW(cast_bf16_f64, uint16_t, double, vm_bf16_to_f32(x))
UNARY_ROW(cast_f16_f32, uint16_t, float, vm_f16_to_f32(x))
UNARY_ROW(cast_f16_f64, uint16_t, double, vm_f16_to_f32(x))
UNARY_ROW(cast_f32_bf16, float, uint16_t, vm_f32_to_bf16(x))
UNARY_ROW(cast_f64_bf16, double, uint16_t, vm_f32_to_bf16((float)x))
UNARY_ROW(cast_f32_f16, float, uint16_t, vm_f32_to_f16(x))
UNARY_ROW(cast_f64_f16, double, uint16_t, vm_f32_to_f16((float)x))
UNARY_ROW(cast_bf16_f16, uint16_t, uint16_t, vm_f32_to_f16(vm_bf16_to_f32(x)))
UNARY_ROW(cast_f16_bf16, uint16_t, uint16_t, vm_f32_to_bf16(vm_f16_to_f32(x)))
UNARY_ROW(copy_bf16, uint16_t, uint16_t, vm_f32_to_bf16(vm_bf16_to_f32(x)))
UNARY_ROW(copy_f16, uint16_t, uint16_t, vm_f32_to_f16(vm_f16_to_f32(x)))

#define DT_b8 KILN_BOOL
#define DT_i32 KILN_I32
#define DT_i64 KILN_I64
#define DT_f32 KILN_F32
#define DT_f64 KILN_F64
#define DT_u8 KILN_U8
#define DT_i8 KILN_I8
#define DT_i16 KILN_I16
#define DT_bf16 KILN_BF16
#define DT_f16 KILN_F16
#define CAST_ENTRY(fs, FT, ts, TT, EXPR) [DT_##fs][DT_##ts] = cast_##fs##_##ts,
#define INTLIKE_ENTRIES(fs, FT)                                                 \
  INTLIKE_TO(CAST_ENTRY, fs, FT)                                                \
  [DT_##fs][KILN_F32] = cast_##fs##_f32, [DT_##fs][KILN_F64] = cast_##fs##_f64, \
  [DT_##fs][KILN_BF16] = cast_##fs##_bf16, [DT_##fs][KILN_F16] = cast_##fs##_f16,
#define FLOAT_ENTRIES(fs, FT, WIDEN, W) FLOAT_TO_INTS(CAST_ENTRY, fs, FT, WIDEN, W)

static vm_row_fn cast_row(kiln_dtype from, kiln_dtype to) {
  static const vm_row_fn table[VM_NUM_DTYPES][VM_NUM_DTYPES] = {
      INTLIKE(INTLIKE_ENTRIES) FLOATS(FLOAT_ENTRIES)[KILN_F32][KILN_F64] = cast_f32_f64,
      [KILN_F64][KILN_F32] = cast_f64_f32,
      [KILN_BF16][KILN_F32] = cast_bf16_f32,
      [KILN_BF16][KILN_F64] = cast_bf16_f64,
      [KILN_F16][KILN_F32] = cast_f16_f32,
      [KILN_F16][KILN_F64] = cast_f16_f64,
      [KILN_F32][KILN_BF16] = cast_f32_bf16,
      [KILN_F64][KILN_BF16] = cast_f64_bf16,
      [KILN_F32][KILN_F16] = cast_f32_f16,
      [KILN_F64][KILN_F16] = cast_f64_f16,
      [KILN_BF16][KILN_F16] = cast_bf16_f16,
      [KILN_F16][KILN_BF16] = cast_f16_bf16,
  };
  /* a half to itself goes through f32 too (a signaling NaN is quieted), as
     compiled code's loads and stores do */
  if (from == to)
    return from == KILN_BF16 ? copy_bf16 : from == KILN_F16 ? copy_f16 : rows[VM_OP_copy][from];
  return table[from][to];
}

bool vm_k_cast(vm_tensor *out, const vm_tensor *in) {
  vm_tensor *ops[2] = {out, (vm_tensor *)in};
  vm_iter it;
  vm_iter_init(&it, 2, ops);
  vm_iter_run(&it, cast_row(in->dtype, out->dtype), NULL);
  return true;
}

/* --- leaves ------------------------------------------------------------- */

typedef struct {
  void *data;
  kiln_dtype dt;
  double a, b; /* full: value; arange: start, step */
} fill_job;

#define FILL_CASE(DT, T, VALUE)                         \
  case DT: {                                            \
    T *o = (T *)j->data;                                \
    for (int64_t i = begin; i < end; i++) o[i] = VALUE; \
    break;                                              \
  }

static void fill_full(void *p, int64_t begin, int64_t end) {
  fill_job *j = p;
  char one[8];
  vm_store_f64(one, j->dt, 0, j->a);
  switch (j->dt) {
    FILL_CASE(KILN_BOOL, bool, *(bool *)one)
    FILL_CASE(KILN_I32, int32_t, *(int32_t *)one)
    FILL_CASE(KILN_I64, int64_t, *(int64_t *)one)
    FILL_CASE(KILN_F32, float, *(float *)one)
    FILL_CASE(KILN_F64, double, *(double *)one)
    FILL_CASE(KILN_BF16, uint16_t, *(uint16_t *)one)
    FILL_CASE(KILN_F16, uint16_t, *(uint16_t *)one)
    FILL_CASE(KILN_U8, uint8_t, *(uint8_t *)one)
    FILL_CASE(KILN_I8, int8_t, *(int8_t *)one)
    FILL_CASE(KILN_I16, int16_t, *(int16_t *)one)
  }
}

static void fill_arange(void *p, int64_t begin, int64_t end) {
  fill_job *j = p;
  if (j->dt == KILN_I64 && vm_arange_integral(j->a, j->b)) { /* exact past 2^53 */
    int64_t *o = j->data;
    uint64_t start = (uint64_t)(int64_t)j->a, step = (uint64_t)(int64_t)j->b;
    for (int64_t i = begin; i < end; i++) o[i] = (int64_t)(start + (uint64_t)i * step);
    return;
  }
  for (int64_t i = begin; i < end; i++) vm_store_f64(j->data, j->dt, i, j->a + (double)i * j->b);
}

bool vm_k_leaf(vm_opcode op, vm_tensor *out, const vm_attr *attr) {
  fill_job job = {vm_data(out), out->dtype, attr->scalar[0], attr->scalar[1]};
  switch (op) {
    case VM_OP_full:
      vm_parallel_for(out->numel, 1 << 16, fill_full, &job);
      return true;
    case VM_OP_arange:
      vm_parallel_for(out->numel, 1 << 16, fill_arange, &job);
      return true;
    case VM_OP_rand:
    case VM_OP_randn:
      vm_rng_fill(out, op == VM_OP_randn, attr->seed, attr->counter);
      return true;
    default:
      return false;
  }
}
