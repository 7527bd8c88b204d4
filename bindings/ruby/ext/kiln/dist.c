/* dist.c — Kiln::Distributed: data-parallel training over MPI (the C API's
 * kiln_dist_*, DESIGN §10).  lib/kiln/distributed.rb adds DataParallel. */
#include <ruby/thread.h>

#include "kiln_ext.h"

static kiln_reduce_op reduce_op(VALUE op) {
  if (op == ID2SYM(rb_intern("sum"))) return KILN_REDUCE_SUM;
  if (op == ID2SYM(rb_intern("mean"))) return KILN_REDUCE_MEAN;
  if (op == ID2SYM(rb_intern("max"))) return KILN_REDUCE_MAX;
  rb_raise(rb_eArgError, "op must be :sum, :mean or :max, not %" PRIsVALUE, rb_inspect(op));
}

static VALUE d_init(VALUE self) {
  kiln_clear_error();
  rk_check_status(kiln_dist_init());
  return self;
}

static VALUE d_rank(VALUE self) {
  (void)self;
  kiln_clear_error();
  return INT2NUM(rk_check_status(kiln_dist_rank()));
}

static VALUE d_size(VALUE self) {
  (void)self;
  kiln_clear_error();
  return INT2NUM(rk_check_status(kiln_dist_size()));
}

static VALUE d_initialized(VALUE self) {
  (void)self;
  int rank = kiln_dist_rank();
  kiln_clear_error();
  return rank >= 0 ? Qtrue : Qfalse;
}

static VALUE d_all_reduce(int argc, VALUE *argv, VALUE self) {
  (void)self;
  VALUE t, op;
  rb_scan_args(argc, argv, "11", &t, &op);
  kiln_reduce_op o = NIL_P(op) ? KILN_REDUCE_SUM : reduce_op(op);
  kiln_clear_error();
  return rk_finish(rk_alloc(), kiln_all_reduce(rk_get(t), o));
}

static VALUE d_average_grads(VALUE self, VALUE params) {
  (void)self;
  params = rb_Array(params);
  long n = RARRAY_LEN(params);
  if (n > INT32_MAX) rb_raise(rb_eArgError, "too many parameters");
  kiln_tensor **ps = ALLOCA_N(kiln_tensor *, n ? n : 1);
  for (long i = 0; i < n; i++) ps[i] = rk_get(rb_ary_entry(params, i));
  kiln_clear_error();
  rk_check_status(kiln_dist_average_grads((int)n, ps));
  return Qnil;
}

static void *finalize_fn(void *p) {
  *(int *)p = kiln_dist_finalize();
  return NULL;
}

static VALUE d_finalize(VALUE self) {
  int rc = 0;
  kiln_clear_error();
  /* it evaluates what is pending first: without the GVL */
  rb_thread_call_without_gvl(finalize_fn, &rc, NULL, NULL);
  rk_check_status(rc);
  return self;
}

void rk_init_dist(void) {
  VALUE m = rb_define_module_under(rk_mKiln, "Distributed");
  rb_define_singleton_method(m, "init", d_init, 0);
  rb_define_singleton_method(m, "rank", d_rank, 0);
  rb_define_singleton_method(m, "size", d_size, 0);
  rb_define_singleton_method(m, "initialized?", d_initialized, 0);
  rb_define_singleton_method(m, "all_reduce", d_all_reduce, -1);
  rb_define_singleton_method(m, "average_grads", d_average_grads, 1);
  rb_define_singleton_method(m, "finalize", d_finalize, 0);
}
