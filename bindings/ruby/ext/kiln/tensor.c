/* tensor.c — Kiln::Tensor's non-op methods: inspection (never evaluates),
 * printing (kiln_print into an open_memstream buffer), autodiff, and the
 * in-place updates optimizers use. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* open_memstream (ruby/config.h defines it the same way) */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_ext.h"

static VALUE t_shape(VALUE self) {
  kiln_tensor *t = rk_get(self);
  int nd = kiln_ndim(t);
  const int64_t *s = kiln_shape(t);
  VALUE a = rb_ary_new_capa(nd);
  for (int i = 0; i < nd; i++) rb_ary_push(a, LL2NUM(s[i]));
  return a;
}

static VALUE t_dtype(VALUE self) { return rk_dtype_sym(kiln_dtype_of(rk_get(self))); }
static VALUE t_ndim(VALUE self) { return INT2NUM(kiln_ndim(rk_get(self))); }
static VALUE t_numel(VALUE self) { return LL2NUM(kiln_numel(rk_get(self))); }
/* :cpu / :cuda (or "cpu" / "cuda") to a kiln_device; ArgumentError otherwise */
static kiln_device device_arg(VALUE dev) {
  VALUE s = rb_obj_as_string(dev);
  if (!strcmp(StringValueCStr(s), "cpu")) return KILN_CPU;
  if (!strcmp(StringValueCStr(s), "cuda")) return KILN_CUDA;
  rb_raise(rb_eArgError, "unknown device %" PRIsVALUE " (:cpu or :cuda)", rb_inspect(dev));
}

/* t._to_device(dev): a copy on dev (t's value itself when it is there);
   Kiln::Error (:device) with the reason when dev is not available */
static VALUE t_to_device(VALUE self, VALUE dev) {
  kiln_tensor *t = rk_get(self);
  kiln_device d = device_arg(dev);
  VALUE obj = rk_alloc();
  kiln_tensor *r = rk_nogvl_to_device(t, d);
  RB_GC_GUARD(self);
  return rk_finish(obj, r);
}

/* Kiln::CUDA.available? / Kiln::CUDA.info / Kiln.device_info(dev) */
static VALUE m_cuda_available(VALUE mod) {
  (void)mod;
  return kiln_device_available(KILN_CUDA) ? Qtrue : Qfalse;
}
static VALUE m_device_info(VALUE mod, VALUE dev) {
  (void)mod;
  return rb_utf8_str_new_cstr(kiln_device_info(device_arg(dev)));
}

static VALUE t_device(VALUE self) {
  return kiln_device_of(rk_get(self)) == KILN_CUDA ? ID2SYM(rb_intern("cuda"))
                                                   : ID2SYM(rb_intern("cpu"));
}

typedef struct {
  char *text;
  size_t len;
} print_buf;

static VALUE print_str(VALUE p) {
  print_buf *b = (print_buf *)p;
  return rb_utf8_str_new(b->text, (long)b->len);
}
static VALUE print_free(VALUE p) {
  free(((print_buf *)p)->text);
  return Qnil;
}

/* Tensor#_print: Kiln's PyTorch-style text, without the final newline */
static VALUE t_print(VALUE self) {
  kiln_tensor *t = rk_get(self);
  print_buf b = {NULL, 0};
  FILE *f = open_memstream(&b.text, &b.len);
  if (!f) rb_sys_fail("open_memstream");
  int rc = rk_nogvl_print(t, f);
  fclose(f);
  if (rc < 0) {
    free(b.text);
    rk_raise_kiln("kiln_print");
  }
  while (b.len > 0 && (b.text[b.len - 1] == '\n' || b.text[b.len - 1] == ' ')) b.len--;
  /* the malloc'ed text is freed even if making the Ruby string raises */
  VALUE s = rb_ensure(print_str, (VALUE)&b, print_free, (VALUE)&b);
  RB_GC_GUARD(self);
  return s;
}

/* --- autodiff ------------------------------------------------------------------- */

static VALUE t_requires_grad(VALUE self) {
  return kiln_requires_grad(rk_get(self)) ? Qtrue : Qfalse;
}

static VALUE t_set_requires_grad(VALUE self, VALUE on) {
  kiln_tensor *t = rk_get(self);
  kiln_clear_error();
  rk_check_status(kiln_set_requires_grad(t, RTEST(on)));
  return on;
}

/* Tensor#_backward(grad_or_nil) */
static VALUE t_backward(VALUE self, VALUE grad) {
  kiln_tensor *t = rk_get(self);
  kiln_tensor *g = NIL_P(grad) ? NULL : rk_get(grad);
  rk_check_status(rk_nogvl_backward(t, g));
  RB_GC_GUARD(grad);
  return Qnil;
}

static VALUE t_grad(VALUE self) {
  kiln_tensor *t = rk_get(self);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  kiln_tensor *g = kiln_grad(t);
  if (!g) {
    if (kiln_last_status() != KILN_OK) rk_raise_kiln("kiln_grad");
    return Qnil; /* no gradient yet; obj is garbage holding NULL */
  }
  return rk_finish(obj, g);
}

static VALUE t_set_grad(VALUE self, VALUE grad) {
  kiln_tensor *t = rk_get(self);
  kiln_clear_error();
  rk_check_status(kiln_set_grad(t, NIL_P(grad) ? NULL : rk_get(grad)));
  return self;
}

static VALUE t_zero_grad(VALUE self) {
  kiln_tensor *t = rk_get(self);
  kiln_clear_error();
  rk_check_status(kiln_zero_grad(t));
  return self;
}

static VALUE t_detach(VALUE self) {
  kiln_tensor *t = rk_get(self);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_detach(t));
}

/* --- in place (functionalized: this handle names the new value) ------------------- */

static VALUE t_sub_scaled(VALUE self, VALUE src, VALUE alpha) {
  rb_check_frozen(self);
  kiln_tensor *t = rk_get(self), *s = rk_get(src);
  double a = rk_num(alpha, "alpha");
  kiln_clear_error();
  rk_check_status(kiln_sub_scaled_(t, s, a));
  RB_GC_GUARD(src);
  return self;
}

static VALUE t_assign(VALUE self, VALUE src) {
  rb_check_frozen(self);
  kiln_tensor *t = rk_get(self), *s = rk_get(src);
  kiln_clear_error();
  rk_check_status(kiln_assign(t, s));
  RB_GC_GUARD(src);
  return self;
}

/* Tensor#_scalar_like(number): a 0-d tensor in the dtype a binary op with self uses */
static VALUE t_scalar_like(VALUE self, VALUE num) {
  kiln_tensor *t = rk_get(self);
  VALUE obj = rk_alloc();
  return rk_finish(obj, rk_scalar_for(num, t));
}

/* Tensor#to_binary: the elements, row-major, as raw native-endian bytes
   (little-endian on every platform Kiln runs on) in an ASCII-8BIT String,
   like Numo::NArray#to_binary.  Large results are written straight into the
   String's buffer. */
static VALUE t_to_binary(VALUE self) {
  kiln_tensor *t = rk_get(self);
  int64_t n = kiln_numel(t);
  size_t bytes = (size_t)(n > 0 ? n : 0) * rk_dtype_size(kiln_dtype_of(t));
  if (bytes == 0) {
    kiln_clear_error();
    rk_check_status(rk_nogvl_sync());
    return rb_str_new(NULL, 0);
  }
  if (bytes <= 4096) { /* may be embedded in the String object, which GC compaction moves */
    char buf[4096];
    rk_check_status(rk_nogvl_to_buffer(t, buf, bytes));
    RB_GC_GUARD(self);
    return rb_str_new(buf, (long)bytes);
  }
  VALUE str = rb_str_buf_new((long)bytes); /* a heap buffer: it does not move */
  rk_check_status(rk_nogvl_to_buffer(t, RSTRING_PTR(str), bytes));
  rb_str_set_len(str, (long)bytes);
  RB_GC_GUARD(self);
  return str;
}

/* Kiln._from_binary(str, dtype, shape): copies the bytes */
static VALUE m_from_binary(VALUE mod, VALUE str, VALUE dtype, VALUE shape) {
  StringValue(str);
  kiln_dtype dt = rk_dtype(dtype);
  int64_t s[RK_MAX_ARGS];
  int nd = rk_shape(shape, s);
  if (nd > KILN_MAX_DIMS)
    rk_raise(rk_eShapeError, "Kiln.from_binary: %d dimensions (Kiln allows %d)", nd, KILN_MAX_DIMS);
  int64_t numel = 1;
  for (int i = 0; i < nd; i++) {
    if (s[i] < 0 || __builtin_mul_overflow(numel, s[i], &numel))
      rk_raise(rk_eShapeError, "Kiln.from_binary: bad shape %" PRIsVALUE, rb_inspect(shape));
  }
  size_t want = (size_t)numel * rk_dtype_size(dt);
  if ((size_t)RSTRING_LEN(str) != want)
    rb_raise(rb_eArgError,
             "Kiln.from_binary: %ld bytes given, shape %" PRIsVALUE " of %" PRIsVALUE " needs %zu",
             RSTRING_LEN(str), rb_inspect(shape), rb_inspect(dtype), want);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_from_data(RSTRING_PTR(str), dt, nd, s));
  RB_GC_GUARD(str);
  return r;
}

void rk_init_tensor(void) {
  VALUE c = rk_cTensor;
  rb_define_method(c, "shape", t_shape, 0);
  rb_define_method(c, "dtype", t_dtype, 0);
  rb_define_method(c, "ndim", t_ndim, 0);
  rb_define_method(c, "numel", t_numel, 0);
  rb_define_method(c, "device", t_device, 0);
  rb_define_method(c, "_to_device", t_to_device, 1);
  VALUE cuda = rb_define_module_under(rk_mKiln, "CUDA");
  rb_define_singleton_method(cuda, "available?", m_cuda_available, 0);
  rb_define_singleton_method(rk_mKiln, "device_info", m_device_info, 1);
  rb_define_method(c, "_print", t_print, 0);
  rb_define_method(c, "requires_grad", t_requires_grad, 0);
  rb_define_method(c, "requires_grad?", t_requires_grad, 0);
  rb_define_method(c, "_set_requires_grad", t_set_requires_grad, 1);
  rb_define_method(c, "_backward", t_backward, 1);
  rb_define_method(c, "_grad", t_grad, 0);
  rb_define_method(c, "_set_grad", t_set_grad, 1);
  rb_define_method(c, "zero_grad!", t_zero_grad, 0);
  rb_define_method(c, "detach", t_detach, 0);
  rb_define_method(c, "sub_scaled!", t_sub_scaled, 2);
  rb_define_method(c, "assign!", t_assign, 1);
  rb_define_method(c, "_scalar_like", t_scalar_like, 1);
  rb_define_method(c, "to_binary", t_to_binary, 0);
  rb_define_singleton_method(rk_mKiln, "_from_binary", m_from_binary, 3);
}
