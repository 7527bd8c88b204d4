/* dtype.h — facts about Kiln's dtypes: sizes, names, categories,
 * promotion.  Owns nothing else; kernels get the C types from here, and
 * the 16-bit float conversions from half.h. */
#ifndef VM_DTYPE_H
#define VM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "half.h"
#include "kiln.h"

#define VM_NUM_DTYPES 10

/* X(dtype enum, storage C type, short name, is float), in enum order.
   bf16 and f16 are stored as their bits (uint16_t) and computed in f32. */
#define VM_DTYPES(X)                  \
  X(KILN_BOOL, bool, bool, 0)         \
  X(KILN_I32, int32_t, int32, 0)      \
  X(KILN_I64, int64_t, int64, 0)      \
  X(KILN_F32, float, float32, 1)      \
  X(KILN_F64, double, float64, 1)     \
  X(KILN_BF16, uint16_t, bfloat16, 1) \
  X(KILN_F16, uint16_t, float16, 1)   \
  X(KILN_U8, uint8_t, uint8, 0)       \
  X(KILN_I8, int8_t, int8, 0)         \
  X(KILN_I16, int16_t, int16, 0)

static inline bool vm_dtype_valid(int dt) { return dt >= KILN_BOOL && dt <= KILN_I16; }
static inline bool vm_dtype_is_half(kiln_dtype dt) { return dt == KILN_BF16 || dt == KILN_F16; }
static inline bool vm_dtype_is_float(kiln_dtype dt) {
  return dt == KILN_F32 || dt == KILN_F64 || vm_dtype_is_half(dt);
}
static inline bool vm_dtype_is_int(kiln_dtype dt) {
  return dt == KILN_I32 || dt == KILN_I64 || dt == KILN_U8 || dt == KILN_I8 || dt == KILN_I16;
}
/* the integers narrower than 32 bits (u8, i8, i16) */
static inline bool vm_dtype_is_narrow_int(kiln_dtype dt) {
  return dt == KILN_U8 || dt == KILN_I8 || dt == KILN_I16;
}
/* the values integer dtype dt holds, [*lo, *hi]; false for int64 (whose
   range doubles cannot bound exactly) and the rest */
static inline bool vm_dtype_int_range(kiln_dtype dt, double *lo, double *hi) {
  switch (dt) {
    case KILN_U8:
      *lo = 0, *hi = UINT8_MAX;
      return true;
    case KILN_I8:
      *lo = INT8_MIN, *hi = INT8_MAX;
      return true;
    case KILN_I16:
      *lo = INT16_MIN, *hi = INT16_MAX;
      return true;
    case KILN_I32:
      *lo = INT32_MIN, *hi = INT32_MAX;
      return true;
    default:
      return false;
  }
}

/* the dtypes an index or a class label may have */
static inline bool vm_dtype_is_index(kiln_dtype dt) { return dt == KILN_I32 || dt == KILN_I64; }

static inline size_t vm_dtype_size(kiln_dtype dt) {
  static const size_t sizes[] = {1, 4, 8, 4, 8, 2, 2, 1, 1, 2};
  return sizes[dt];
}

/* the dtype a kernel computes a value of dtype dt in: f32 for the halves,
   dt itself otherwise */
static inline kiln_dtype vm_dtype_compute(kiln_dtype dt) {
  return vm_dtype_is_half(dt) ? KILN_F32 : dt;
}

/* "float32" etc.; "invalid" for values outside the enum */
const char *vm_dtype_name(int dt);

/* PyTorch's promotion: bool < (u8 | i8) < i16 < i32 < i64 < (bf16 | f16)
   < f32 < f64; u8 with i8 is i16, bf16 with f16 is f32 (neither of the
   pair holds the other) */
static inline kiln_dtype vm_promote(kiln_dtype a, kiln_dtype b) {
  static const int rank[] = {
      [KILN_BOOL] = 0, [KILN_U8] = 1,   [KILN_I8] = 1,  [KILN_I16] = 2, [KILN_I32] = 3,
      [KILN_I64] = 4,  [KILN_BF16] = 5, [KILN_F16] = 5, [KILN_F32] = 6, [KILN_F64] = 7};
  if (a == b) return a;
  if (rank[a] == rank[b]) return vm_dtype_is_half(a) ? KILN_F32 : KILN_I16;
  return rank[a] > rank[b] ? a : b;
}

/* reads element i of a buffer of dtype dt as a double / writes one (a
   double to a half rounds through f32, as every cast to a half does) */
double vm_load_f64(const void *base, kiln_dtype dt, int64_t i);
void vm_store_f64(void *base, kiln_dtype dt, int64_t i, double v);
/* An int64 arange whose start and step are whole numbers is computed in
   int64 (start + i * step), exact past 2^53 where the double value is not
   (PyTorch's too); any other arange is vm_store_f64(start + i * step).
   The GPU's kernel (jit_gpu/opgen_src.c) makes the same choice. */
static inline bool vm_arange_integral(double start, double step) {
  return start > -0x1p63 && start < 0x1p63 && start == (double)(int64_t)start && step > -0x1p63 &&
         step < 0x1p63 && step == (double)(int64_t)step;
}

#endif
