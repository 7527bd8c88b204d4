/* dtype.c — dtype names and the slow generic element access used by
 * printing, creation from host scalars and tests.  Kernels never use it. */
#include "dtype.h"

#include <math.h>
#include <stdint.h>

const char *vm_dtype_name(int dt) {
#define NAME(dt, ctype, name, fl) #name,
  static const char *names[] = {VM_DTYPES(NAME)};
#undef NAME
  return vm_dtype_valid(dt) ? names[dt] : "invalid";
}

double vm_load_f64(const void *base, kiln_dtype dt, int64_t i) {
  switch (dt) {
    case KILN_BOOL:
      return ((const bool *)base)[i];
    case KILN_I32:
      return ((const int32_t *)base)[i];
    case KILN_I64:
      return (double)((const int64_t *)base)[i];
    case KILN_F32:
      return ((const float *)base)[i];
    case KILN_F64:
      return ((const double *)base)[i];
    case KILN_BF16:
      return vm_bf16_to_f32(((const uint16_t *)base)[i]);
    case KILN_F16:
      return vm_f16_to_f32(((const uint16_t *)base)[i]);
    case KILN_U8:
      return ((const uint8_t *)base)[i];
    case KILN_I8:
      return ((const int8_t *)base)[i];
    case KILN_I16:
      return ((const int16_t *)base)[i];
  }
  return NAN;
}

/* float -> integer conversion that never hits C's undefined cases:
   NaN -> 0, out-of-range saturates (the rule every cast in Kiln follows) */
static int64_t saturate_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return v >= 9.2233720368547758e18 ? INT64_MAX : (int64_t)hi;
  return (int64_t)v;
}

void vm_store_f64(void *base, kiln_dtype dt, int64_t i, double v) {
  switch (dt) {
    case KILN_BOOL:
      ((bool *)base)[i] = v != 0;
      break;
    case KILN_I32:
      ((int32_t *)base)[i] = (int32_t)saturate_i64(v, INT32_MIN, INT32_MAX);
      break;
    case KILN_I64:
      ((int64_t *)base)[i] = saturate_i64(v, -9.2233720368547758e18, 9.2233720368547758e18);
      break;
    case KILN_F32:
      ((float *)base)[i] = (float)v;
      break;
    case KILN_F64:
      ((double *)base)[i] = v;
      break;
    case KILN_BF16:
      ((uint16_t *)base)[i] = vm_f32_to_bf16((float)v);
      break;
    case KILN_F16:
      ((uint16_t *)base)[i] = vm_f32_to_f16((float)v);
      break;
    case KILN_U8:
      ((uint8_t *)base)[i] = (uint8_t)saturate_i64(v, 0, 255);
      break;
    case KILN_I8:
      ((int8_t *)base)[i] = (int8_t)saturate_i64(v, INT8_MIN, INT8_MAX);
      break;
    case KILN_I16:
      ((int16_t *)base)[i] = (int16_t)saturate_i64(v, INT16_MIN, INT16_MAX);
      break;
  }
}
