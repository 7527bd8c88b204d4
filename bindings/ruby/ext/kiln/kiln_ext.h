/* kiln_ext.h — shared declarations of the `kiln` gem's C extension.
 *
 * The extension is a thin layer over Kiln's C API (kiln.h): positional
 * methods whose names start with an underscore, plus the operators.  The
 * Ruby files in lib/kiln/ parse keywords and call these.
 *
 * Conventions every C method follows:
 *   - kiln_clear_error() before each Kiln call (rk_call / RK_CLEAR), so a
 *     message is always the one of the call that just failed;
 *   - the Ruby wrapper object of a result is allocated *before* the Kiln call
 *     (rk_alloc), so no Ruby exception can ever leak a Kiln reference;
 *   - a failing Kiln call raises Kiln::Error / ShapeError / DTypeError with
 *     Kiln's own message (rk_raise_kiln);
 *   - calls that may evaluate (a flush) run without the GVL (rk_nogvl_*). */
#ifndef KILN_EXT_H
#define KILN_EXT_H

#include <kiln.h>
#include <ruby.h>

extern VALUE rk_mKiln, rk_cTensor, rk_eError, rk_eShapeError, rk_eDTypeError;

typedef struct {
  kiln_tensor *t;  /* owned reference; NULL only while being constructed */
  size_t gc_bytes; /* bytes it counts for the GC pacer (the value's size) */
} rk_tensor;

/* --- kiln_ext.c: errors, the Tensor type, dtypes, argument helpers -------------- */

NORETURN(void rk_raise_kiln(const char *fallback_op));
NORETURN(void rk_raise(VALUE klass, const char *fmt, ...));

VALUE rk_alloc(void);                       /* a Tensor wrapper holding NULL */
VALUE rk_finish(VALUE obj, kiln_tensor *t); /* raises if t is NULL */
kiln_tensor *rk_get(VALUE obj);             /* TypeError unless a live Tensor */
int rk_is_tensor(VALUE v);
int rk_check_status(int rc); /* raises if rc < 0, returns rc */

kiln_dtype rk_dtype(VALUE sym); /* :float32 ... -> kiln_dtype */
VALUE rk_dtype_sym(kiln_dtype dt);
size_t rk_dtype_size(kiln_dtype dt);
int rk_dtype_is_float(kiln_dtype dt);
int rk_dtype_is_half(kiln_dtype dt); /* bf16, f16: converted through float32 here */

int rk_int(VALUE v, const char *what); /* an Integer that fits an int */
int64_t rk_i64(VALUE v, const char *what);
double rk_num(VALUE v, const char *what); /* Integer or Float */
#define RK_MAX_ARGS 64                    /* longest shape / axis list passed on */
int rk_shape(VALUE ary, int64_t *shape);  /* Array of Integers -> ndim */
int rk_axes(VALUE ary, int *axes);        /* Array of Integers -> count */
int rk_axes_arg(VALUE axes, int *ax);     /* nil (all: 0), an Integer or an Array -> count */

/* a tensor made from a Ruby number, in the dtype a binary op with x uses */
kiln_tensor *rk_scalar_for(VALUE num, kiln_tensor *x);

/* --- conversion (convert.c) ------------------------------------------------------ */
VALUE rk_from_ruby(VALUE data, VALUE dtype); /* dtype: Symbol or nil */
VALUE rk_to_a(VALUE self);
VALUE rk_item(VALUE self);

/* --- GVL-free wrappers (kiln_ext.c) ------------------------------------------------ */
int rk_nogvl_to_buffer(kiln_tensor *t, void *dst, size_t n);
double rk_nogvl_item(kiln_tensor *t);
kiln_tensor *rk_nogvl_to_device(kiln_tensor *t, kiln_device d); /* evaluates t */
int rk_nogvl_print(kiln_tensor *t, FILE *f);
int rk_nogvl_sync(void);
int rk_nogvl_backward(kiln_tensor *loss, kiln_tensor *grad);

/* --- shared method bodies (ops.c) ------------------------------------------------ */
VALUE rk_unary(VALUE self, kiln_tensor *(*fn)(kiln_tensor *));
VALUE rk_index_arg(VALUE v); /* an Array becomes an :int64 Tensor; anything else as it is */
/* self.fn(target): an Array target is converted (as an index when index) */
VALUE rk_with_target(VALUE self, VALUE target, bool index,
                     kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *));

/* --- method tables ----------------------------------------------------------------- */
void rk_init_convert(void);
void rk_init_ops(void);
void rk_init_tensor(void);
void rk_init_layers(void);
void rk_init_dist(void);

#endif /* KILN_EXT_H */
