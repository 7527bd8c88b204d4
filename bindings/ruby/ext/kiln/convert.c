/* convert.c — Ruby data <-> Kiln tensors.
 *
 * Kiln.tensor(nested_array) works in two passes.  Pass 1 reads the shape
 * from the first element at each depth, then walks everything to check that
 * the array is not ragged and to find the dtype (Integer -> int64, Float ->
 * float32, true/false -> bool; mixed kinds promote bool < int64 < float32).
 * It runs no Ruby code and raises before anything is allocated.  Pass 2 fills
 * a C buffer from ALLOCV (a Ruby-managed temporary: an exception raised while
 * filling it, such as an Integer too large for int64, cannot leak it), which
 * kiln_from_data copies.  Reading back (to_a, item) goes through
 * kiln_to_buffer / kiln_item without the GVL, since they may flush. */
#include <math.h>
#include <string.h>

#include "kiln_ext.h"

enum { KIND_BOOL = 1, KIND_INT = 2, KIND_FLOAT = 4 };

typedef struct {
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int kinds;
} layout;

static const char *kind_name(VALUE v) {
  if (RB_TYPE_P(v, T_ARRAY)) return "an Array";
  return rb_obj_classname(v);
}

static void check(VALUE v, int depth, layout *L) {
  if (depth == L->ndim) {
    if (RB_FLOAT_TYPE_P(v))
      L->kinds |= KIND_FLOAT;
    else if (RB_INTEGER_TYPE_P(v))
      L->kinds |= KIND_INT;
    else if (v == Qtrue || v == Qfalse)
      L->kinds |= KIND_BOOL;
    else if (RB_TYPE_P(v, T_ARRAY))
      rk_raise(rk_eShapeError,
               "Kiln.tensor: ragged nested array: found an Array at depth %d where the first "
               "elements had numbers",
               depth);
    else
      rb_raise(rb_eTypeError, "Kiln.tensor: %" PRIsVALUE " (%s) is not a number or true/false",
               rb_inspect(v), kind_name(v));
    return;
  }
  if (!RB_TYPE_P(v, T_ARRAY))
    rk_raise(rk_eShapeError,
             "Kiln.tensor: ragged nested array: found %s at depth %d where an Array of %lld "
             "elements was expected",
             kind_name(v), depth, (long long)L->shape[depth]);
  long n = RARRAY_LEN(v);
  if (n != L->shape[depth])
    rk_raise(rk_eShapeError,
             "Kiln.tensor: ragged nested array: an Array at depth %d has %ld elements, "
             "expected %lld",
             depth, n, (long long)L->shape[depth]);
  for (long i = 0; i < n; i++) check(RARRAY_AREF(v, i), depth + 1, L);
}

/* pass 1 */
static void measure(VALUE data, layout *L) {
  L->ndim = 0;
  L->kinds = 0;
  VALUE cur = data;
  while (RB_TYPE_P(cur, T_ARRAY)) {
    if (L->ndim == KILN_MAX_DIMS)
      rk_raise(rk_eShapeError, "Kiln.tensor: nested deeper than %d dimensions", KILN_MAX_DIMS);
    long n = RARRAY_LEN(cur);
    L->shape[L->ndim++] = n;
    if (n == 0) break;
    cur = RARRAY_AREF(cur, 0);
  }
  check(data, 0, L);
}

static const char *int_name(kiln_dtype dt) {
  return dt == KILN_U8    ? "uint8"
         : dt == KILN_I8  ? "int8"
         : dt == KILN_I16 ? "int16"
         : dt == KILN_I32 ? "int32"
                          : "int64";
}

/* whether i is a value of integer dtype dt */
static bool fits(kiln_dtype dt, int64_t i) {
  switch (dt) {
    case KILN_U8:
      return i >= 0 && i <= UINT8_MAX;
    case KILN_I8:
      return i >= INT8_MIN && i <= INT8_MAX;
    case KILN_I16:
      return i >= INT16_MIN && i <= INT16_MAX;
    case KILN_I32:
      return i >= INT32_MIN && i <= INT32_MAX;
    default:
      return true;
  }
}

static int64_t to_int(VALUE v, kiln_dtype dt) {
  if (v == Qtrue) return 1;
  if (v == Qfalse) return 0;
  if (RB_FLOAT_TYPE_P(v)) {
    double d = RFLOAT_VALUE(v);
    if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0))
      rb_raise(rb_eRangeError, "Kiln.tensor: %g does not fit in %s", d, int_name(dt));
    int64_t i = (int64_t)d; /* toward zero, like Kiln's cast */
    if (!fits(dt, i))
      rb_raise(rb_eRangeError, "Kiln.tensor: %g does not fit in %s", d, int_name(dt));
    return i;
  }
  if (RB_TYPE_P(v, T_BIGNUM) &&
      !RTEST(rb_funcall(v, rb_intern("between?"), 2, LL2NUM(INT64_MIN), LL2NUM(INT64_MAX)))) {
    VALUE digits = rb_big2str(v, 10);
    rb_raise(rb_eRangeError, "Kiln.tensor: %s does not fit in %s", StringValueCStr(digits),
             int_name(dt));
  }
  int64_t i = (int64_t)NUM2LL(v);
  if (!fits(dt, i))
    rb_raise(rb_eRangeError, "Kiln.tensor: %lld does not fit in %s", (long long)i, int_name(dt));
  return i;
}

static double to_double(VALUE v) {
  if (v == Qtrue) return 1.0;
  if (v == Qfalse) return 0.0;
  if (RB_FLOAT_TYPE_P(v)) return RFLOAT_VALUE(v);
  return NUM2DBL(v);
}

/* pass 2: writes the leaves of v in row-major order from *pos */
static void fill(VALUE v, int depth, const layout *L, kiln_dtype dt, char *buf, int64_t *pos) {
  if (depth == L->ndim) {
    int64_t i = (*pos)++;
    switch (dt) {
      case KILN_BOOL:
        ((uint8_t *)buf)[i] = v == Qtrue ? 1 : v == Qfalse ? 0 : to_double(v) != 0;
        break;
      case KILN_I32:
        ((int32_t *)buf)[i] = (int32_t)to_int(v, dt);
        break;
      case KILN_I64:
        ((int64_t *)buf)[i] = to_int(v, dt);
        break;
      case KILN_F32:
        ((float *)buf)[i] = (float)to_double(v);
        break;
      case KILN_F64:
        ((double *)buf)[i] = to_double(v);
        break;
      case KILN_U8:
        ((uint8_t *)buf)[i] = (uint8_t)to_int(v, dt);
        break;
      case KILN_I8:
        ((int8_t *)buf)[i] = (int8_t)to_int(v, dt);
        break;
      case KILN_I16:
        ((int16_t *)buf)[i] = (int16_t)to_int(v, dt);
        break;
      case KILN_BF16:
      case KILN_F16:
        break; /* filled as float32 and cast (rk_from_ruby) */
    }
    return;
  }
  /* pass 1 ran no Ruby code since, but stay safe if the data changed */
  if (!RB_TYPE_P(v, T_ARRAY) || RARRAY_LEN(v) != L->shape[depth])
    rk_raise(rk_eShapeError, "Kiln.tensor: the nested array changed while it was read");
  long n = RARRAY_LEN(v);
  for (long i = 0; i < n; i++) fill(RARRAY_AREF(v, i), depth + 1, L, dt, buf, pos);
}

VALUE rk_from_ruby(VALUE data, VALUE dtype) {
  layout L;
  measure(data, &L);
  kiln_dtype dt;
  if (!NIL_P(dtype))
    dt = rk_dtype(dtype);
  else if (L.kinds & KIND_FLOAT)
    dt = KILN_F32;
  else if (L.kinds & KIND_INT)
    dt = KILN_I64;
  else if (L.kinds & KIND_BOOL)
    dt = KILN_BOOL;
  else
    dt = KILN_F32; /* no elements: PyTorch's default dtype */
  int64_t numel = 1;
  for (int d = 0; d < L.ndim; d++) numel *= L.shape[d]; /* bounded by the leaves seen */
  /* halves: the numbers as float32, rounded once by Kiln's cast */
  kiln_dtype fill_dt = rk_dtype_is_half(dt) ? KILN_F32 : dt;
  size_t bytes = (size_t)numel * rk_dtype_size(fill_dt);

  VALUE tmp;
  char *buf = ALLOCV(tmp, bytes ? bytes : 1);
  int64_t pos = 0;
  fill(data, 0, &L, fill_dt, buf, &pos);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  kiln_tensor *t = kiln_from_data(buf, fill_dt, L.ndim, L.shape);
  if (t && fill_dt != dt) {
    kiln_tensor *c = kiln_cast(t, dt);
    kiln_release(t);
    t = c;
  }
  ALLOCV_END(tmp);
  rk_finish(obj, t);
  RB_GC_GUARD(data);
  return obj;
}

/* --- reading back ----------------------------------------------------------------- */

static VALUE elem(const char *buf, kiln_dtype dt, int64_t i) {
  switch (dt) {
    case KILN_BOOL:
      return ((const uint8_t *)buf)[i] ? Qtrue : Qfalse;
    case KILN_I32:
      return INT2NUM(((const int32_t *)buf)[i]);
    case KILN_I64:
      return LL2NUM(((const int64_t *)buf)[i]);
    case KILN_F32:
      return DBL2NUM((double)((const float *)buf)[i]);
    case KILN_F64:
      return DBL2NUM(((const double *)buf)[i]);
    case KILN_U8:
      return INT2NUM(((const uint8_t *)buf)[i]);
    case KILN_I8:
      return INT2NUM(((const int8_t *)buf)[i]);
    case KILN_I16:
      return INT2NUM(((const int16_t *)buf)[i]);
    case KILN_BF16:
    case KILN_F16:
      break; /* read as float32 (rk_to_a) */
  }
  return Qnil;
}

static VALUE build(const char *buf, kiln_dtype dt, int ndim, const int64_t *shape, int depth,
                   int64_t *pos) {
  if (depth == ndim) return elem(buf, dt, (*pos)++);
  VALUE a = rb_ary_new_capa((long)shape[depth]);
  for (int64_t i = 0; i < shape[depth]; i++)
    rb_ary_push(a, build(buf, dt, ndim, shape, depth + 1, pos));
  return a;
}

/* Tensor#to_a: nested Arrays (a 0-d tensor gives its number) */
VALUE rk_to_a(VALUE self) {
  kiln_tensor *t = rk_get(self);
  int ndim = kiln_ndim(t);
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, kiln_shape(t), (size_t)ndim * sizeof *shape);
  kiln_dtype dt = kiln_dtype_of(t);
  kiln_tensor *wide = NULL; /* a half's values as float32 (exact) */
  if (rk_dtype_is_half(dt)) {
    kiln_clear_error();
    if (!(wide = kiln_cast(t, KILN_F32))) rk_raise_kiln("kiln_cast");
    t = wide;
    dt = KILN_F32;
  }
  size_t bytes = (size_t)kiln_numel(t) * rk_dtype_size(dt);
  VALUE tmp;
  char *buf = ALLOCV(tmp, bytes ? bytes : 1);
  int rc = rk_nogvl_to_buffer(t, buf, bytes);
  kiln_release(wide);
  if (rc < 0) {
    ALLOCV_END(tmp);
    rk_raise_kiln("kiln_to_buffer");
  }
  int64_t pos = 0;
  VALUE r = build(buf, dt, ndim, shape, 0, &pos);
  ALLOCV_END(tmp);
  RB_GC_GUARD(self);
  return r;
}

/* Tensor#item: Float for float tensors, Integer for integer ones, true/false for bool */
VALUE rk_item(VALUE self) {
  kiln_tensor *t = rk_get(self);
  kiln_dtype dt = kiln_dtype_of(t);
  if (kiln_numel(t) != 1 || rk_dtype_is_float(dt)) {
    double d = rk_nogvl_item(t);
    if (isnan(d) && kiln_last_status() != KILN_OK) rk_raise_kiln("kiln_item");
    return DBL2NUM(d);
  }
  char buf[8];
  if (rk_nogvl_to_buffer(t, buf, sizeof buf) < 0) rk_raise_kiln("kiln_to_buffer");
  RB_GC_GUARD(self);
  return elem(buf, dt, 0);
}

void rk_init_convert(void) {
  rb_define_method(rk_cTensor, "to_a", rk_to_a, 0);
  rb_define_method(rk_cTensor, "item", rk_item, 0);
}
