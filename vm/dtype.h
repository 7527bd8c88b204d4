/* dtype.h — facts about Kiln's five dtypes: sizes, names, categories,
 * promotion.  Owns nothing else; kernels get the C types from here. */
#ifndef VM_DTYPE_H
#define VM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#define VM_NUM_DTYPES 5

/* X(dtype enum, C type, short name, is float) in promotion order */
#define VM_DTYPES(X)             \
  X(KILN_BOOL, bool, bool, 0)    \
  X(KILN_I32, int32_t, int32, 0) \
  X(KILN_I64, int64_t, int64, 0) \
  X(KILN_F32, float, float32, 1) \
  X(KILN_F64, double, float64, 1)

static inline bool vm_dtype_valid(int dt) { return dt >= KILN_BOOL && dt <= KILN_F64; }
static inline bool vm_dtype_is_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64; }
static inline bool vm_dtype_is_int(kiln_dtype dt) { return dt == KILN_I32 || dt == KILN_I64; }

static inline size_t vm_dtype_size(kiln_dtype dt) {
  static const size_t sizes[] = {1, 4, 8, 4, 8};
  return sizes[dt];
}

/* "float32" etc.; "invalid" for values outside the enum */
const char *vm_dtype_name(int dt);

/* the larger of two dtypes in bool < i32 < i64 < f32 < f64 */
static inline kiln_dtype vm_promote(kiln_dtype a, kiln_dtype b) { return a > b ? a : b; }

/* reads element i of a buffer of dtype dt as a double / writes one */
double vm_load_f64(const void *base, kiln_dtype dt, int64_t i);
void vm_store_f64(void *base, kiln_dtype dt, int64_t i, double v);

#endif
