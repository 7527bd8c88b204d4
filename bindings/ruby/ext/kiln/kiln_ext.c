/* kiln_ext.c — the `kiln` gem's C extension: the Kiln::Tensor type, error
 * mapping, dtypes, argument helpers, GVL-free wrappers around the calls that
 * evaluate, and the module functions (constructors, runtime, no_grad).
 * Tensor methods live in tensor.c and ops.c, Ruby <-> tensor data in
 * convert.c; keyword parsing is done in Ruby (lib/kiln/). */
#include "kiln_ext.h"

#include <ruby/thread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

VALUE rk_mKiln, rk_cTensor, rk_eError, rk_eShapeError, rk_eDTypeError;

/* --- errors ----------------------------------------------------------------------- */

static VALUE status_sym(kiln_status st) {
  switch (st) {
    case KILN_OK:
      return ID2SYM(rb_intern("ok"));
    case KILN_ERR_ARG:
      return ID2SYM(rb_intern("arg"));
    case KILN_ERR_SHAPE:
      return ID2SYM(rb_intern("shape"));
    case KILN_ERR_DTYPE:
      return ID2SYM(rb_intern("dtype"));
    case KILN_ERR_OOM:
      return ID2SYM(rb_intern("oom"));
    case KILN_ERR_DEVICE:
      return ID2SYM(rb_intern("device"));
    case KILN_ERR_STATE:
      return ID2SYM(rb_intern("state"));
    case KILN_ERR_INTERNAL:
      return ID2SYM(rb_intern("internal"));
  }
  return ID2SYM(rb_intern("unknown"));
}

/* Raises the error of the Kiln call that just failed: the class by
   kiln_last_status(), the message kiln_last_error(), copied before Ruby
   allocates anything (an allocation may run the GC, which releases tensors). */
void rk_raise_kiln(const char *fallback_op) {
  kiln_status st = kiln_last_status();
  char msg[1024];
  const char *m = kiln_last_error();
  if (m && *m)
    snprintf(msg, sizeof msg, "%s", m);
  else
    snprintf(msg, sizeof msg, "%s failed (status %d, no message)", fallback_op, (int)st);
  VALUE klass = st == KILN_ERR_SHAPE   ? rk_eShapeError
                : st == KILN_ERR_DTYPE ? rk_eDTypeError
                                       : rk_eError;
  VALUE exc = rb_exc_new_cstr(klass, msg);
  rb_ivar_set(exc, rb_intern("@status"), status_sym(st));
  rb_exc_raise(exc);
}

void rk_raise(VALUE klass, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VALUE msg = rb_vsprintf(fmt, ap); /* understands PRIsVALUE */
  va_end(ap);
  VALUE exc = rb_exc_new_str(klass, msg);
  rb_ivar_set(exc, rb_intern("@status"),
              status_sym(klass == rk_eShapeError   ? KILN_ERR_SHAPE
                         : klass == rk_eDTypeError ? KILN_ERR_DTYPE
                                                   : KILN_ERR_ARG));
  rb_exc_raise(exc);
}

int rk_check_status(int rc) {
  if (rc < 0) rk_raise_kiln("kiln");
  return rc;
}

/* --- the Tensor type ----------------------------------------------------------------- */

size_t rk_dtype_size(kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
      return 1;
    case KILN_I32:
      return 4;
    case KILN_I64:
      return 8;
    case KILN_F32:
      return 4;
    case KILN_F64:
      return 8;
    case KILN_BF16:
    case KILN_F16:
    case KILN_I16:
      return 2;
    case KILN_U8:
    case KILN_I8:
      return 1;
  }
  return 8;
}

int rk_dtype_is_float(kiln_dtype dt) {
  return dt == KILN_F32 || dt == KILN_F64 || rk_dtype_is_half(dt);
}

int rk_dtype_is_half(kiln_dtype dt) { return dt == KILN_BF16 || dt == KILN_F16; }

static void gc_forget(size_t bytes);

static void tensor_free(void *p) {
  rk_tensor *r = p;
  kiln_release(r->t);
  gc_forget(r->gc_bytes);
  xfree(r);
}

static size_t tensor_memsize(const void *p) {
  const rk_tensor *r = p;
  size_t n = sizeof *r;
  if (r->t) {
    int64_t numel = kiln_numel(r->t);
    if (numel > 0) n += (size_t)numel * rk_dtype_size(kiln_dtype_of(r->t));
  }
  return n;
}

/* No VALUE is ever stored in an rk_tensor, so the type is write-barrier
   protected and needs no mark or compact function. */
static const rb_data_type_t tensor_type = {
    "Kiln::Tensor", {NULL, tensor_free, tensor_memsize, NULL, {NULL}},     NULL,
    NULL,           RUBY_TYPED_FREE_IMMEDIATELY | RUBY_TYPED_WB_PROTECTED,
};

VALUE rk_alloc(void) {
  rk_tensor *r;
  VALUE obj = TypedData_Make_Struct(rk_cTensor, rk_tensor, &tensor_type, r);
  r->t = NULL;
  r->gc_bytes = 0;
  return obj;
}

static void gc_report(rk_tensor *r);

VALUE rk_finish(VALUE obj, kiln_tensor *t) {
  if (!t) rk_raise_kiln("kiln");
  rk_tensor *r = RTYPEDDATA_DATA(obj);
  /* an integer or bool result (.long, argmax, a comparison) has no gradient:
     cut it from the graph, so it never reports requires_grad and a float
     made from it again is a constant (torch's behaviour) */
  if (!rk_dtype_is_float(kiln_dtype_of(t)) && kiln_requires_grad(t)) {
    kiln_clear_error();
    kiln_tensor *d = kiln_detach(t);
    kiln_release(t);
    if (!d) rk_raise_kiln("kiln_detach");
    t = d;
  }
  r->t = t;
  gc_report(r);
  return obj;
}

/* Ruby's GC is paced by what Kiln holds for Ruby's handles.  Each handle
   counts the bytes of its value (numel * itemsize, also what
   ObjectSpace.memsize_of says) from the moment it is made: a pending
   result counts before it is computed, because a flush computes every
   result a live handle names at once (2048 ops' worth of 256 KiB results =
   512 MiB), so counting only computed memory would be too late for the GC
   to have freed the handles nobody reads.

   These bytes are not passed to rb_gc_adjust_memory_usage: Ruby's malloc
   limit (16-32 MiB) would then run a GC for every large op (W1 from Ruby:
   8 GCs per evaluation, 40 of them major, 2.4 ms of its 13 ms).  Instead,
   like Go's GOGC=100, a GC runs when the handles hold twice what they held
   after the previous one (and at least RK_GC_MIN_BYTES more): a minor GC
   first, which frees the young handles nobody reads, and a full one when
   that freed too little (the garbage is old).  Kiln's memory then stays
   within about twice the live tensors' plus RK_GC_MIN_BYTES. */
#define RK_GC_MIN_BYTES ((size_t)64 << 20)

static size_t gc_held; /* bytes the live handles count */
static size_t gc_base; /* gc_held after the last GC */
static size_t gc_seen; /* rb_gc_count() then */

static void gc_forget(size_t bytes) { gc_held = bytes < gc_held ? gc_held - bytes : 0; }

/* a GC just ran: the budget starts again from what the handles hold now */
static void gc_rebase(void) {
  gc_seen = rb_gc_count();
  gc_base = gc_held;
}

static void gc_minor(void) {
  static VALUE opts = Qfalse;
  if (!RTEST(opts)) {
    opts = rb_hash_new();
    rb_hash_aset(opts, ID2SYM(rb_intern("full_mark")), Qfalse);
    rb_hash_aset(opts, ID2SYM(rb_intern("immediate_sweep")), Qtrue);
    rb_obj_freeze(opts);
    rb_gc_register_mark_object(opts);
  }
  rb_funcallv_kw(rb_mGC, rb_intern("start"), 1, &opts, RB_PASS_KEYWORDS);
}

static void gc_pace(void) {
  if (rb_gc_count() != gc_seen) gc_rebase(); /* Ruby collected on its own */
  size_t budget = gc_base > RK_GC_MIN_BYTES ? gc_base : RK_GC_MIN_BYTES;
  if (gc_held <= gc_base + budget) return;
  gc_minor();
  if (gc_held > gc_base + budget / 2) rb_gc(); /* old garbage: a full GC */
  gc_rebase();
}

/* Before a big evaluation, a minor GC: a flush computes every result a
   live handle names, and in Ruby the temporaries of an expression stay
   alive until a GC (`(x * y + 0.5).tanh` leaves two).  Computing them
   costs memory traffic and splits fused kernels; W1 from Ruby took 35 ms
   per evaluation without GCs, 11 ms with one before each (C: 10-11 ms).
   Below RK_GC_FLUSH_BYTES of results the GC costs more than it saves. */
#define RK_GC_FLUSH_BYTES ((size_t)4 << 20)

static void gc_before_flush(void) {
  gc_minor();
  gc_rebase();
}

static void gc_report(rk_tensor *r) {
  int64_t numel = kiln_numel(r->t);
  size_t bytes = numel > 0 ? (size_t)numel * rk_dtype_size(kiln_dtype_of(r->t)) : 0;
  r->gc_bytes = bytes;
  gc_held += bytes;
  gc_pace();
}

/* Kiln.gc_held_bytes: what the pacer counts (tests) */
static VALUE m_gc_held_bytes(VALUE mod) { return SIZET2NUM(gc_held); }

int rk_is_tensor(VALUE v) { return rb_typeddata_is_kind_of(v, &tensor_type); }

kiln_tensor *rk_get(VALUE obj) {
  rk_tensor *r = rb_check_typeddata(obj, &tensor_type);
  if (!r->t) rk_raise(rk_eError, "uninitialized Kiln::Tensor");
  return r->t;
}

/* --- dtypes ---------------------------------------------------------------------- */

kiln_dtype rk_dtype(VALUE v) {
  if (RB_TYPE_P(v, T_STRING)) v = rb_str_intern(v);
  if (!SYMBOL_P(v))
    rk_raise(rk_eDTypeError, "dtype must be a Symbol such as :float32, not %" PRIsVALUE,
             rb_inspect(v));
  ID id = SYM2ID(v);
  static const struct {
    const char *name;
    kiln_dtype dt;
  } names[] = {{"bool", KILN_BOOL},   {"int32", KILN_I32},   {"int64", KILN_I64},
               {"float32", KILN_F32}, {"float64", KILN_F64}, {"bfloat16", KILN_BF16},
               {"float16", KILN_F16}, {"uint8", KILN_U8},    {"int", KILN_I32},
               {"long", KILN_I64},    {"float", KILN_F32},   {"double", KILN_F64},
               {"half", KILN_F16},    {"byte", KILN_U8},     {"int8", KILN_I8},
               {"char", KILN_I8},     {"int16", KILN_I16},   {"short", KILN_I16}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (id == rb_intern(names[i].name)) return names[i].dt;
  rk_raise(rk_eDTypeError,
           "unknown dtype %" PRIsVALUE
           " (use :bool, :uint8, :int8, :int16, :int32, :int64, :bfloat16, :float16, :float32 or "
           ":float64)",
           rb_inspect(v));
}

VALUE rk_dtype_sym(kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
      return ID2SYM(rb_intern("bool"));
    case KILN_I32:
      return ID2SYM(rb_intern("int32"));
    case KILN_I64:
      return ID2SYM(rb_intern("int64"));
    case KILN_F32:
      return ID2SYM(rb_intern("float32"));
    case KILN_F64:
      return ID2SYM(rb_intern("float64"));
    case KILN_BF16:
      return ID2SYM(rb_intern("bfloat16"));
    case KILN_F16:
      return ID2SYM(rb_intern("float16"));
    case KILN_U8:
      return ID2SYM(rb_intern("uint8"));
    case KILN_I8:
      return ID2SYM(rb_intern("int8"));
    case KILN_I16:
      return ID2SYM(rb_intern("int16"));
  }
  return Qnil;
}

/* --- arguments ------------------------------------------------------------------ */

int rk_int(VALUE v, const char *what) {
  if (!RB_INTEGER_TYPE_P(v))
    rb_raise(rb_eTypeError, "%s must be an Integer, not %" PRIsVALUE, what, rb_inspect(v));
  return NUM2INT(v);
}

int64_t rk_i64(VALUE v, const char *what) {
  if (!RB_INTEGER_TYPE_P(v))
    rb_raise(rb_eTypeError, "%s must be an Integer, not %" PRIsVALUE, what, rb_inspect(v));
  return (int64_t)NUM2LL(v);
}

double rk_num(VALUE v, const char *what) {
  if (!RB_INTEGER_TYPE_P(v) && !RB_FLOAT_TYPE_P(v))
    rb_raise(rb_eTypeError, "%s must be a number, not %" PRIsVALUE, what, rb_inspect(v));
  return NUM2DBL(v);
}

int rk_shape(VALUE ary, int64_t *shape) {
  Check_Type(ary, T_ARRAY);
  long n = RARRAY_LEN(ary);
  if (n > RK_MAX_ARGS)
    rk_raise(rk_eShapeError, "%ld dimensions (Kiln allows %d)", n, KILN_MAX_DIMS);
  for (long i = 0; i < n; i++) shape[i] = rk_i64(RARRAY_AREF(ary, i), "a size");
  return (int)n;
}

int rk_axes(VALUE ary, int *axes) {
  Check_Type(ary, T_ARRAY);
  long n = RARRAY_LEN(ary);
  if (n > RK_MAX_ARGS) rk_raise(rk_eShapeError, "%ld axes (Kiln allows %d)", n, KILN_MAX_DIMS);
  for (long i = 0; i < n; i++) axes[i] = rk_int(RARRAY_AREF(ary, i), "an axis");
  return (int)n;
}

int rk_axes_arg(VALUE axes, int *ax) {
  if (NIL_P(axes)) return 0;
  if (!RB_INTEGER_TYPE_P(axes)) return rk_axes(axes, ax);
  ax[0] = rk_int(axes, "dim");
  return 1;
}

/* The dtype a Ruby number takes next to tensor x when it must be a tensor
   (comparisons, maximum, where, reflected operators): it never widens x, as
   Kiln's weak scalars do not.  Float with a float x: x's dtype; Float with an
   integer or bool x: float32; Integer: x's dtype (int64 for a bool x);
   true/false: bool. */
kiln_tensor *rk_scalar_for(VALUE num, kiln_tensor *x) {
  kiln_dtype xd = kiln_dtype_of(x), dt;
  double v;
  if (RB_FLOAT_TYPE_P(num)) {
    dt = rk_dtype_is_float(xd) ? xd : KILN_F32;
    v = RFLOAT_VALUE(num);
  } else if (RB_INTEGER_TYPE_P(num)) {
    dt = xd == KILN_BOOL ? KILN_I64 : xd;
    v = NUM2DBL(num);
  } else if (num == Qtrue || num == Qfalse) {
    dt = KILN_BOOL;
    v = num == Qtrue;
  } else {
    rb_raise(rb_eTypeError, "%" PRIsVALUE " can't be combined with a Kiln::Tensor",
             rb_obj_class(num));
  }
  kiln_clear_error();
  /* on x's device: a CPU tensor and a CUDA tensor never mix in one op
     (DESIGN §6), so `cuda_int_tensor * 2` needs its 2 on the GPU, where
     it is a fill the op's kernel takes as a parameter (no copy) */
  return kiln_full_on(v, dt, 0, NULL, kiln_device_of(x));
}

/* --- calls that may evaluate: run without the GVL -------------------------------- */

typedef struct {
  kiln_tensor *t, *g;
  void *dst;
  size_t n;
  FILE *f;
  int rc;
  double d;
  kiln_device device;
  kiln_tensor *result;
  volatile int cancel; /* set by the unblocking function (Ctrl-C, Timeout) */
} nogvl_args;

static void *to_buffer_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->rc = kiln_to_buffer(a->t, a->dst, a->n);
  return NULL;
}
static void *item_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->d = kiln_item(a->t);
  return NULL;
}
static void *print_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->rc = kiln_print(a->t, a->f);
  return NULL;
}
static void *sync_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->rc = kiln_sync();
  return NULL;
}
static void *to_device_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->result = kiln_to_device(a->t, a->device);
  return NULL;
}
static void *backward_fn(void *p) {
  nogvl_args *a = p;
  kiln_clear_error();
  a->rc = kiln_backward(a->t, a->g);
  return NULL;
}

/* Interrupts: the unblocking function sets the evaluating thread's cancel
   flag, Kiln stops at the next kernel boundary (nothing is lost), and Ruby
   then raises the pending Interrupt / Timeout::Error here, before the
   caller would raise Kiln's "interrupted" error. */
typedef struct {
  void *(*fn)(void *);
  nogvl_args *a;
} cancelable;

static void cancel_ubf(void *p) { ((nogvl_args *)p)->cancel = 1; }

static void *cancelable_fn(void *p) {
  cancelable *c = p;
  kiln_set_cancel_flag(&c->a->cancel);
  void *r = c->fn(c->a);
  kiln_set_cancel_flag(NULL);
  return r;
}

/* The GVL is given up with rb_nogvl and RB_NOGVL_UBF_ASYNC_SAFE: cancel_ubf
   only stores to a flag, so Ruby may call it from its signal handler.
   Without that flag, Ruby 3.1 starts a thread per call on the main thread
   to run the unblocking function on a signal: 70 µs per call here (Kiln.sync
   of one small op: 72 µs, with the flag 4.4 µs, holding the GVL 0.3 µs).
   An evaluation that computes at most RK_HOLD_BYTES of results (tens of µs)
   runs with the GVL held, as giving it up would cost more; bigger ones
   give it up and are interruptible. */
#define RK_HOLD_BYTES ((size_t)64 << 10)

static void run_cancelable(void *(*fn)(void *), nogvl_args *a) {
  cancelable c = {fn, a};
  size_t pending = kiln_pending_bytes(a->t);
  if (pending <= RK_HOLD_BYTES) {
    fn(a);
    return;
  }
  if (pending >= RK_GC_FLUSH_BYTES) gc_before_flush();
  for (;;) {
    a->cancel = 0;
    rb_nogvl(cancelable_fn, &c, cancel_ubf, a, RB_NOGVL_UBF_ASYNC_SAFE);
    if (!a->cancel) return;
    /* raises Interrupt, Timeout::Error...; but Ruby also runs the
       unblocking function for signals it handles without raising (SIGCHLD
       of a child process the program started; kiln-jitc sends none,
       jit_cpu/jitc.c): then the evaluation, which lost nothing, starts
       again */
    rb_thread_check_ints();
  }
}

kiln_tensor *rk_nogvl_to_device(kiln_tensor *t, kiln_device d) {
  nogvl_args a = {.t = t, .device = d};
  run_cancelable(to_device_fn, &a);
  return a.result;
}
int rk_nogvl_to_buffer(kiln_tensor *t, void *dst, size_t n) {
  nogvl_args a = {.t = t, .dst = dst, .n = n};
  run_cancelable(to_buffer_fn, &a);
  return a.rc;
}
double rk_nogvl_item(kiln_tensor *t) {
  nogvl_args a = {.t = t};
  run_cancelable(item_fn, &a);
  return a.d;
}
int rk_nogvl_print(kiln_tensor *t, FILE *f) {
  nogvl_args a = {.t = t, .f = f};
  run_cancelable(print_fn, &a);
  return a.rc;
}
int rk_nogvl_sync(void) {
  nogvl_args a = {0};
  run_cancelable(sync_fn, &a);
  return a.rc;
}
int rk_nogvl_backward(kiln_tensor *loss, kiln_tensor *grad) {
  nogvl_args a = {.t = loss, .g = grad};
  run_cancelable(backward_fn, &a);
  return a.rc;
}

/* --- module functions ------------------------------------------------------------ */

/* Kiln._tensor(data, dtype_or_nil) */
static VALUE m_tensor(VALUE mod, VALUE data, VALUE dtype) { return rk_from_ruby(data, dtype); }

/* Kiln._full(value, dtype, shape) */
static VALUE m_full(VALUE mod, VALUE value, VALUE dtype, VALUE shape) {
  int64_t s[RK_MAX_ARGS];
  double v = value == Qtrue ? 1.0 : value == Qfalse ? 0.0 : rk_num(value, "the fill value");
  kiln_dtype dt = rk_dtype(dtype);
  int nd = rk_shape(shape, s);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_full(v, dt, nd, s));
}

/* Kiln._zeros(dtype, shape), Kiln._ones, Kiln._rand, Kiln._randn */
static VALUE shaped_tensor(kiln_tensor *(*fn)(kiln_dtype, int, const int64_t *), VALUE dtype,
                           VALUE shape) {
  int64_t s[RK_MAX_ARGS];
  kiln_dtype dt = rk_dtype(dtype);
  int nd = rk_shape(shape, s);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(dt, nd, s));
}
static VALUE m_zeros(VALUE mod, VALUE dtype, VALUE shape) {
  return shaped_tensor(kiln_zeros, dtype, shape);
}
static VALUE m_ones(VALUE mod, VALUE dtype, VALUE shape) {
  return shaped_tensor(kiln_ones, dtype, shape);
}
static VALUE m_rand(VALUE mod, VALUE dtype, VALUE shape) {
  return shaped_tensor(kiln_rand, dtype, shape);
}
static VALUE m_randn(VALUE mod, VALUE dtype, VALUE shape) {
  return shaped_tensor(kiln_randn, dtype, shape);
}

/* Kiln._arange(start, stop, step, dtype) */
static VALUE m_arange(VALUE mod, VALUE start, VALUE stop, VALUE step, VALUE dtype) {
  double a = rk_num(start, "start"), b = rk_num(stop, "stop"), c = rk_num(step, "step");
  kiln_dtype dt = rk_dtype(dtype);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_arange(a, b, c, dt));
}

/* Kiln._concat(tensors, axis), Kiln._stack(tensors, axis) */
static VALUE join(kiln_tensor *(*fn)(int, kiln_tensor *const *, int), VALUE list, VALUE axis) {
  Check_Type(list, T_ARRAY);
  int ax = rk_int(axis, "dim");
  long n = RARRAY_LEN(list);
  if (n > 1 << 20) rb_raise(rb_eArgError, "too many tensors (%ld)", n);
  VALUE tmp;
  kiln_tensor **ts = ALLOCV_N(kiln_tensor *, tmp, n ? n : 1);
  for (long i = 0; i < n; i++) ts[i] = rk_get(RARRAY_AREF(list, i));
  VALUE obj = rk_alloc();
  kiln_clear_error();
  kiln_tensor *r = fn((int)n, ts, ax);
  ALLOCV_END(tmp);
  RB_GC_GUARD(list);
  return rk_finish(obj, r);
}
static VALUE m_concat(VALUE mod, VALUE list, VALUE axis) { return join(kiln_concat, list, axis); }
static VALUE m_stack(VALUE mod, VALUE list, VALUE axis) { return join(kiln_stack, list, axis); }

/* Kiln._grad_of(outs, gouts_or_nil, ins, create_graph) -> Array (nil where no gradient) */
static VALUE m_grad_of(VALUE mod, VALUE outs, VALUE gouts, VALUE ins, VALUE create_graph) {
  Check_Type(outs, T_ARRAY);
  Check_Type(ins, T_ARRAY);
  if (!NIL_P(gouts)) Check_Type(gouts, T_ARRAY);
  long no = RARRAY_LEN(outs), ni = RARRAY_LEN(ins);
  if (no > 1 << 16 || ni > 1 << 16) rb_raise(rb_eArgError, "too many tensors");
  if (!NIL_P(gouts) && RARRAY_LEN(gouts) != no)
    rb_raise(rb_eArgError, "%ld outputs but %ld output gradients", no, RARRAY_LEN(gouts));
  VALUE tmp;
  kiln_tensor **buf = ALLOCV_N(kiln_tensor *, tmp, 2 * no + 2 * ni + 1);
  kiln_tensor **o = buf, **go = buf + no, **in = buf + 2 * no, **gr = buf + 2 * no + ni;
  for (long i = 0; i < no; i++) {
    o[i] = rk_get(RARRAY_AREF(outs, i));
    go[i] = NIL_P(gouts) || NIL_P(RARRAY_AREF(gouts, i)) ? NULL : rk_get(RARRAY_AREF(gouts, i));
  }
  for (long i = 0; i < ni; i++) {
    in[i] = rk_get(RARRAY_AREF(ins, i));
    gr[i] = NULL;
  }
  /* the result wrappers exist before Kiln hands out any reference */
  VALUE res = rb_ary_new_capa(ni);
  for (long i = 0; i < ni; i++) rb_ary_push(res, rk_alloc());
  kiln_clear_error();
  int rc = kiln_grad_of((int)no, o, NIL_P(gouts) ? NULL : go, (int)ni, in, gr, RTEST(create_graph));
  if (rc < 0) {
    for (long i = 0; i < ni; i++) kiln_release(gr[i]);
    ALLOCV_END(tmp);
    rk_raise_kiln("kiln_grad_of");
  }
  for (long i = 0; i < ni; i++) {
    if (gr[i]) {
      rk_tensor *r = RTYPEDDATA_DATA(RARRAY_AREF(res, i));
      r->t = gr[i];
      gc_report(r);
    } else
      rb_ary_store(res, i, Qnil);
  }
  ALLOCV_END(tmp);
  RB_GC_GUARD(outs);
  RB_GC_GUARD(gouts);
  RB_GC_GUARD(ins);
  return res;
}

static VALUE m_manual_seed(VALUE mod, VALUE seed) {
  if (!RB_INTEGER_TYPE_P(seed)) rb_raise(rb_eTypeError, "seed must be an Integer");
  kiln_manual_seed((uint64_t)NUM2ULL(seed));
  return seed;
}

static VALUE m_stats(VALUE mod) {
  kiln_stats s;
  kiln_get_stats(&s);
  VALUE h = rb_hash_new();
#define U64(f) rb_hash_aset(h, ID2SYM(rb_intern(#f)), ULL2NUM(s.f))
#define DBL(f) rb_hash_aset(h, ID2SYM(rb_intern(#f)), DBL2NUM(s.f))
  U64(ops_recorded);
  U64(flushes);
  U64(traces_seen);
  U64(cache_hits);
  U64(cache_misses);
  U64(compiles);
  U64(compile_failures);
  U64(disk_hits);
  U64(eager_ops);
  U64(kernels_launched);
  DBL(compile_ms);
  DBL(flush_ms);
#undef U64
#undef DBL
  /* counters beyond kiln_stats, by name */
  static const char *more[] = {
      "kernels_compiled",   "kernel_cache_hits",  "code_objects",        "code_unloads",
      "plans_built",        "blas_calls",         "recomputed",          "kernel_threads_max",
      "view_ops",           "compiler_processes", "loops_found",         "loops_rolled",
      "loop_sums",          "loop_steps",         "trace_cache_entries", "trace_cache_bytes",
      "loop_hoists",        "loop_maps",          "loop_joins",          "trace_families",
      "attention_rewrites", "loop_packs",         "loop_pack_reads"};
  for (size_t i = 0; i < sizeof more / sizeof *more; i++)
    rb_hash_aset(h, ID2SYM(rb_intern(more[i])), ULL2NUM((unsigned long long)kiln_stat(more[i])));
  return h;
}

static VALUE m_reset_stats(VALUE mod) {
  kiln_reset_stats();
  return Qnil;
}

static VALUE m_sync(VALUE mod) {
  rk_check_status(rk_nogvl_sync());
  return Qnil;
}

static void *jit_wait_fn(void *p) {
  (void)p;
  kiln_jit_wait();
  return NULL;
}

/* Kiln.jit_wait: until the background compiler is idle (without the GVL) */
static VALUE m_jit_wait(VALUE mod) {
  (void)mod;
  rb_thread_call_without_gvl(jit_wait_fn, NULL, NULL, NULL);
  return Qnil;
}

static VALUE m_no_grad_push(VALUE mod) {
  kiln_no_grad_push();
  return Qnil;
}
static VALUE m_no_grad_pop(VALUE mod) {
  kiln_no_grad_pop();
  return Qnil;
}
static VALUE m_enable_grad_push(VALUE mod) { return INT2NUM(kiln_enable_grad_push()); }
static VALUE m_enable_grad_pop(VALUE mod, VALUE saved) {
  kiln_enable_grad_pop(NUM2INT(saved));
  return Qnil;
}
static VALUE m_grad_enabled(VALUE mod) { return kiln_is_grad_enabled() ? Qtrue : Qfalse; }

static VALUE m_dtype(VALUE mod, VALUE name) { return rk_dtype_sym(rk_dtype(name)); }

/* Kiln._set_autocast(:bfloat16 / :float16 / :float32 (off)); Kiln._autocast_dtype */
static VALUE m_set_autocast(VALUE mod, VALUE dtype) {
  (void)mod;
  kiln_clear_error();
  rk_check_status(kiln_set_autocast(rk_dtype(dtype)));
  return Qnil;
}
static VALUE m_autocast_dtype(VALUE mod) {
  (void)mod;
  return rk_dtype_sym(kiln_autocast_dtype());
}

/* Kiln.matmul_precision = :tf32 / :highest (float32 matmuls on CUDA); Kiln.matmul_precision */
static VALUE m_set_matmul_precision(VALUE mod, VALUE mode) {
  (void)mod;
  if (SYMBOL_P(mode)) mode = rb_sym2str(mode);
  StringValue(mode);
  kiln_clear_error();
  rk_check_status(kiln_set_matmul_precision(StringValueCStr(mode)));
  return mode;
}
static VALUE m_matmul_precision(VALUE mod) {
  (void)mod;
  return ID2SYM(rb_intern(kiln_matmul_precision()));
}

/* Kiln._unscale_grads(params, inv_scale) -> whether a gradient held an Inf or a NaN */
static VALUE m_unscale_grads(VALUE mod, VALUE params, VALUE inv_scale) {
  (void)mod;
  Check_Type(params, T_ARRAY);
  long n = RARRAY_LEN(params);
  VALUE tmp;
  kiln_tensor **ts = ALLOCV_N(kiln_tensor *, tmp, n ? n : 1);
  for (long i = 0; i < n; i++) ts[i] = rk_get(RARRAY_AREF(params, i));
  bool found = false;
  kiln_clear_error();
  int rc = kiln_unscale_grads((int)n, ts, rk_num(inv_scale, "inv_scale"), &found);
  ALLOCV_END(tmp);
  rk_check_status(rc);
  RB_GC_GUARD(params);
  return found ? Qtrue : Qfalse;
}

static VALUE m_memory_in_use(VALUE mod) { return SIZET2NUM(kiln_memory_in_use()); }

static VALUE m_version(VALUE mod) { return rb_str_new_cstr(kiln_version()); }
static VALUE m_num_threads(VALUE mod) { return INT2NUM(kiln_num_threads()); }
static VALUE m_blas_core(VALUE mod) { return rb_str_new_cstr(kiln_blas_core()); }
static VALUE m_cpu_isa(VALUE mod) { return rb_str_new_cstr(kiln_cpu_isa()); }

void Init_kiln_ext(void) {
  rk_mKiln = rb_define_module("Kiln");
  rk_eError = rb_define_class_under(rk_mKiln, "Error", rb_eStandardError);
  rk_eShapeError = rb_define_class_under(rk_mKiln, "ShapeError", rk_eError);
  rk_eDTypeError = rb_define_class_under(rk_mKiln, "DTypeError", rk_eError);
  rk_cTensor = rb_define_class_under(rk_mKiln, "Tensor", rb_cObject);
  rb_define_module_function(rk_mKiln, "gc_held_bytes", m_gc_held_bytes, 0);
  rb_undef_alloc_func(rk_cTensor);

  rb_define_const(rk_mKiln, "LIBRARY_VERSION", rb_str_new_cstr(kiln_version()));
  rb_define_const(rk_mKiln, "MAX_DIMS", INT2NUM(KILN_MAX_DIMS));

  rb_define_singleton_method(rk_mKiln, "_tensor", m_tensor, 2);
  rb_define_singleton_method(rk_mKiln, "_set_autocast", m_set_autocast, 1);
  rb_define_singleton_method(rk_mKiln, "matmul_precision=", m_set_matmul_precision, 1);
  rb_define_singleton_method(rk_mKiln, "matmul_precision", m_matmul_precision, 0);
  rb_define_singleton_method(rk_mKiln, "_autocast_dtype", m_autocast_dtype, 0);
  rb_define_singleton_method(rk_mKiln, "_unscale_grads", m_unscale_grads, 2);
  rb_define_singleton_method(rk_mKiln, "_full", m_full, 3);
  rb_define_singleton_method(rk_mKiln, "_zeros", m_zeros, 2);
  rb_define_singleton_method(rk_mKiln, "_ones", m_ones, 2);
  rb_define_singleton_method(rk_mKiln, "_rand", m_rand, 2);
  rb_define_singleton_method(rk_mKiln, "_randn", m_randn, 2);
  rb_define_singleton_method(rk_mKiln, "_arange", m_arange, 4);
  rb_define_singleton_method(rk_mKiln, "_concat", m_concat, 2);
  rb_define_singleton_method(rk_mKiln, "_stack", m_stack, 2);
  rb_define_singleton_method(rk_mKiln, "_grad_of", m_grad_of, 4);
  rb_define_singleton_method(rk_mKiln, "_no_grad_push", m_no_grad_push, 0);
  rb_define_singleton_method(rk_mKiln, "_no_grad_pop", m_no_grad_pop, 0);
  rb_define_singleton_method(rk_mKiln, "_enable_grad_push", m_enable_grad_push, 0);
  rb_define_singleton_method(rk_mKiln, "_enable_grad_pop", m_enable_grad_pop, 1);
  rb_define_singleton_method(rk_mKiln, "grad_enabled?", m_grad_enabled, 0);
  rb_define_singleton_method(rk_mKiln, "_dtype", m_dtype, 1);
  rb_define_singleton_method(rk_mKiln, "manual_seed", m_manual_seed, 1);
  rb_define_singleton_method(rk_mKiln, "stats", m_stats, 0);
  rb_define_singleton_method(rk_mKiln, "reset_stats", m_reset_stats, 0);
  rb_define_singleton_method(rk_mKiln, "sync", m_sync, 0);
  rb_define_singleton_method(rk_mKiln, "jit_wait", m_jit_wait, 0);
  rb_define_singleton_method(rk_mKiln, "library_version", m_version, 0);
  rb_define_singleton_method(rk_mKiln, "memory_in_use", m_memory_in_use, 0);
  rb_define_singleton_method(rk_mKiln, "num_threads", m_num_threads, 0);
  rb_define_singleton_method(rk_mKiln, "blas_core", m_blas_core, 0);
  rb_define_singleton_method(rk_mKiln, "cpu_isa", m_cpu_isa, 0);

  rk_init_convert();
  rk_init_tensor();
  rk_init_ops();
  rk_init_layers();
  rk_init_dist();
}
