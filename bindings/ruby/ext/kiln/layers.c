/* layers.c — the ops real models need, for Kiln::NN and Kiln::NN::Functional:
 * convolution, attention, pooling, batch norm, dropout, embeddings, more losses, sort
 * and topk, var/std/cumsum, more constructors, and save/load in the
 * safetensors format.  Positional `_name` methods; lib/kiln/ adds the
 * keywords.  Same conventions as ops.c (kiln_ext.h). */
#include <stdlib.h>

#include "kiln_ext.h"

static kiln_tensor *opt_tensor(VALUE v) { return NIL_P(v) ? NULL : rk_get(v); }

/* an Array of two Integers (or one Integer, used twice) into out[2] */
static void pair(VALUE v, const char *what, int out[2]) {
  if (RB_INTEGER_TYPE_P(v)) {
    out[0] = out[1] = rk_int(v, what);
    return;
  }
  if (!RB_TYPE_P(v, T_ARRAY) || RARRAY_LEN(v) != 2)
    rb_raise(rb_eArgError, "%s must be an Integer or an Array of two Integers", what);
  out[0] = rk_int(RARRAY_AREF(v, 0), what);
  out[1] = rk_int(RARRAY_AREF(v, 1), what);
}

/* --- layers ------------------------------------------------------------------------ */

/* x._conv2d(weight, bias_or_nil, stride, padding, dilation, groups) */
static VALUE t_conv2d(VALUE self, VALUE w, VALUE b, VALUE stride, VALUE padding, VALUE dilation,
                      VALUE groups) {
  kiln_tensor *x = rk_get(self), *wt = rk_get(w), *bt = opt_tensor(b);
  int s[2], p[2], d[2];
  pair(stride, "stride", s);
  pair(padding, "padding", p);
  pair(dilation, "dilation", d);
  int g = rk_int(groups, "groups");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_conv2d(x, wt, bt, s, p, d, g));
  RB_GC_GUARD(w);
  RB_GC_GUARD(b);
  return r;
}

/* query._sdpa(key, value, mask_or_nil, causal, scale): scale <= 0 is
   1/sqrt(head size) */
static VALUE t_sdpa(VALUE self, VALUE k, VALUE v, VALUE mask, VALUE causal, VALUE scale) {
  kiln_tensor *qt = rk_get(self), *kt = rk_get(k), *vt = rk_get(v), *mt = opt_tensor(mask);
  double sc = rk_num(scale, "scale");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_scaled_dot_product_attention(qt, kt, vt, mt, RTEST(causal), sc));
  RB_GC_GUARD(k);
  RB_GC_GUARD(v);
  RB_GC_GUARD(mask);
  return r;
}

typedef kiln_tensor *(*pool_fn)(kiln_tensor *, const int[2], const int[2], const int[2]);

/* stride nil: the kernel size */
static VALUE pool(VALUE self, VALUE kernel, VALUE stride, VALUE padding, pool_fn fn) {
  kiln_tensor *x = rk_get(self);
  int k[2], s[2], p[2];
  pair(kernel, "kernel_size", k);
  if (NIL_P(stride))
    s[0] = k[0], s[1] = k[1];
  else
    pair(stride, "stride", s);
  pair(padding, "padding", p);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(x, k, s, p));
}
static VALUE t_max_pool2d(VALUE self, VALUE k, VALUE s, VALUE p) {
  return pool(self, k, s, p, kiln_max_pool2d);
}
static VALUE t_avg_pool2d(VALUE self, VALUE k, VALUE s, VALUE p) {
  return pool(self, k, s, p, kiln_avg_pool2d);
}

/* x._batch_norm(running_mean, running_var, weight, bias, training, momentum, eps):
   any of the four may be nil; in training the running stats are updated in place */
static VALUE t_batch_norm(int argc, VALUE *argv, VALUE self) {
  if (argc != 7) rb_raise(rb_eArgError, "wrong number of arguments (given %d, expected 7)", argc);
  kiln_tensor *x = rk_get(self);
  kiln_tensor *rm = opt_tensor(argv[0]), *rv = opt_tensor(argv[1]);
  kiln_tensor *w = opt_tensor(argv[2]), *b = opt_tensor(argv[3]);
  double momentum = rk_num(argv[5], "momentum"), eps = rk_num(argv[6], "eps");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_batch_norm(x, rm, rv, w, b, RTEST(argv[4]), momentum, eps));
  for (int i = 0; i < 4; i++) RB_GC_GUARD(argv[i]);
  return r;
}

static VALUE t_dropout(VALUE self, VALUE p, VALUE training) {
  kiln_tensor *x = rk_get(self);
  double q = rk_num(p, "p");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_dropout(x, q, RTEST(training)));
}

/* weight._embedding(indices): rows of weight, shaped like indices + [dim] */
static VALUE t_embedding(VALUE self, VALUE idx) {
  kiln_tensor *w = rk_get(self);
  idx = rk_index_arg(idx);
  kiln_tensor *i = rk_get(idx);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_embedding(w, i));
  RB_GC_GUARD(idx);
  return r;
}

static VALUE t_one_hot(VALUE self, VALUE classes, VALUE dtype) {
  kiln_tensor *i = rk_get(self);
  int64_t n = rk_i64(classes, "num_classes");
  kiln_dtype dt = rk_dtype(dtype);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_one_hot(i, n, dt));
}

static VALUE t_nll_loss(VALUE self, VALUE target) {
  return rk_with_target(self, target, true, kiln_nll_loss);
}
static VALUE t_bce_with_logits(VALUE self, VALUE target) {
  return rk_with_target(self, target, false, kiln_bce_with_logits);
}

/* --- sort, topk, var/std, cumsum, clone ------------------------------------------ */

/* [values, indices]: both wrappers exist before Kiln makes either */
static VALUE two(VALUE vobj, VALUE iobj, kiln_tensor *values, kiln_tensor *indices) {
  if (!values) {
    kiln_release(indices);
    rk_finish(vobj, NULL); /* raises Kiln's error */
  }
  VALUE v = rk_finish(vobj, values), i = rk_finish(iobj, indices);
  return rb_ary_new_from_args(2, v, i);
}

static VALUE t_sort(VALUE self, VALUE axis, VALUE descending) {
  kiln_tensor *a = rk_get(self), *idx = NULL;
  int ax = rk_int(axis, "dim");
  VALUE vobj = rk_alloc(), iobj = rk_alloc();
  kiln_clear_error();
  kiln_tensor *v = kiln_sort(a, ax, RTEST(descending), &idx);
  return two(vobj, iobj, v, idx);
}

static VALUE t_topk(VALUE self, VALUE k, VALUE axis, VALUE largest) {
  kiln_tensor *a = rk_get(self), *idx = NULL;
  int64_t n = rk_i64(k, "k");
  int ax = rk_int(axis, "dim");
  VALUE vobj = rk_alloc(), iobj = rk_alloc();
  kiln_clear_error();
  kiln_tensor *v = kiln_topk(a, n, ax, RTEST(largest), &idx);
  return two(vobj, iobj, v, idx);
}

typedef kiln_tensor *(*moment_fn)(kiln_tensor *, int, const int *, int, bool);

/* axes nil (all), an Integer or an Array */
static VALUE moment(VALUE self, VALUE axes, VALUE correction, VALUE keepdim, moment_fn fn) {
  kiln_tensor *a = rk_get(self);
  int ax[RK_MAX_ARGS], n = rk_axes_arg(axes, ax);
  int c = rk_int(correction, "correction");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(a, n, ax, c, RTEST(keepdim)));
}
static VALUE t_var(VALUE self, VALUE axes, VALUE c, VALUE k) {
  return moment(self, axes, c, k, kiln_var);
}
static VALUE t_std(VALUE self, VALUE axes, VALUE c, VALUE k) {
  return moment(self, axes, c, k, kiln_std);
}

static VALUE t_cumsum(VALUE self, VALUE axis) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_cumsum(a, ax));
}

static VALUE t_clone(VALUE self) { return rk_unary(self, kiln_clone); }

static VALUE triangle(VALUE self, VALUE diagonal, kiln_tensor *(*fn)(kiln_tensor *, int64_t)) {
  kiln_tensor *a = rk_get(self);
  int64_t k = rk_i64(diagonal, "diagonal");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(a, k));
}
static VALUE t_triu(VALUE self, VALUE diagonal) { return triangle(self, diagonal, kiln_triu); }
static VALUE t_tril(VALUE self, VALUE diagonal) { return triangle(self, diagonal, kiln_tril); }
static VALUE t_isnan(VALUE self) { return rk_unary(self, kiln_isnan); }
static VALUE t_isinf(VALUE self) { return rk_unary(self, kiln_isinf); }
static VALUE t_isfinite(VALUE self) { return rk_unary(self, kiln_isfinite); }

/* --- constructors ------------------------------------------------------------------ */

static VALUE m_eye(VALUE mod, VALUE n, VALUE dtype) {
  int64_t k = rk_i64(n, "n");
  kiln_dtype dt = rk_dtype(dtype);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_eye(k, dt));
}

static VALUE m_linspace(VALUE mod, VALUE start, VALUE stop, VALUE steps, VALUE dtype) {
  double a = rk_num(start, "start"), b = rk_num(stop, "end");
  int64_t n = rk_i64(steps, "steps");
  kiln_dtype dt = rk_dtype(dtype);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_linspace(a, b, n, dt));
}

static VALUE m_randint(VALUE mod, VALUE low, VALUE high, VALUE dtype, VALUE shape) {
  int64_t lo = rk_i64(low, "low"), hi = rk_i64(high, "high"), s[RK_MAX_ARGS];
  kiln_dtype dt = rk_dtype(dtype);
  int nd = rk_shape(shape, s);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_randint(lo, hi, dt, nd, s));
}

static VALUE m_randperm(VALUE mod, VALUE n) {
  int64_t k = rk_i64(n, "n");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_randperm(k));
}

/* --- save / load ------------------------------------------------------------------- */

/* Kiln._save(path, names, tensors): everything pending is evaluated first
   (interruptible, without the GVL), then the file is written */
static VALUE m_save(VALUE mod, VALUE path, VALUE names, VALUE tensors) {
  FilePathValue(path);
  Check_Type(names, T_ARRAY);
  Check_Type(tensors, T_ARRAY);
  long n = RARRAY_LEN(names);
  if (n != RARRAY_LEN(tensors))
    rb_raise(rb_eArgError, "%ld names for %ld tensors", n, RARRAY_LEN(tensors));
  if (n > 1 << 20) rb_raise(rb_eArgError, "too many tensors (%ld)", n);
  VALUE tmp1, tmp2;
  const char **cn = ALLOCV_N(const char *, tmp1, n ? n : 1);
  kiln_tensor **ts = ALLOCV_N(kiln_tensor *, tmp2, n ? n : 1);
  for (long i = 0; i < n; i++) {
    VALUE s = RARRAY_AREF(names, i);
    Check_Type(s, T_STRING);
    cn[i] = StringValueCStr(s);
    ts[i] = rk_get(RARRAY_AREF(tensors, i));
  }
  rk_check_status(rk_nogvl_sync());
  kiln_clear_error();
  int rc = kiln_save(StringValueCStr(path), (int)n, cn, ts);
  ALLOCV_END(tmp1);
  ALLOCV_END(tmp2);
  RB_GC_GUARD(names);
  RB_GC_GUARD(tensors);
  rk_check_status(rc);
  return Qnil;
}

/* Kiln._load(path) -> [[name, tensor], ...] in the file's order */
static VALUE m_load(VALUE mod, VALUE path) {
  FilePathValue(path);
  const char *p = StringValueCStr(path);
  kiln_clear_error();
  int n = rk_check_status(kiln_load(p, 0, NULL, NULL));
  VALUE out = rb_ary_new_capa(n);
  VALUE *objs = ALLOC_N(VALUE, n ? n : 1);
  char **names = calloc((size_t)(n ? n : 1), sizeof *names);
  kiln_tensor **ts = calloc((size_t)(n ? n : 1), sizeof *ts);
  if (!names || !ts) {
    free(names);
    free(ts);
    xfree(objs);
    rb_raise(rb_eNoMemError, "out of memory");
  }
  for (int i = 0; i < n; i++) objs[i] = rb_ary_entry(rb_ary_push(out, rk_alloc()), i);
  kiln_clear_error();
  int got = kiln_load(p, n, names, ts);
  if (got != n) { /* the file changed between the two reads, or is malformed */
    for (int i = 0; got > 0 && i < got; i++) {
      free(names[i]);
      kiln_release(ts[i]);
    }
    free(names);
    free(ts);
    xfree(objs);
    if (got >= 0) rb_raise(rk_eError, "kiln_load: '%s' changed while it was read", p);
    rk_raise_kiln("kiln_load");
  }
  VALUE pairs = rb_ary_new_capa(n);
  for (int i = 0; i < n; i++) {
    VALUE name = rb_utf8_str_new_cstr(names[i]);
    free(names[i]);
    rb_ary_push(pairs, rb_ary_new_from_args(2, name, rk_finish(objs[i], ts[i])));
  }
  free(names);
  free(ts);
  xfree(objs);
  RB_GC_GUARD(out);
  return pairs;
}

void rk_init_layers(void) {
  VALUE c = rk_cTensor;
  rb_define_method(c, "_conv2d", t_conv2d, 6);
  rb_define_method(c, "_sdpa", t_sdpa, 5);
  rb_define_method(c, "_max_pool2d", t_max_pool2d, 3);
  rb_define_method(c, "_avg_pool2d", t_avg_pool2d, 3);
  rb_define_method(c, "_batch_norm", t_batch_norm, -1);
  rb_define_method(c, "_dropout", t_dropout, 2);
  rb_define_method(c, "_embedding", t_embedding, 1);
  rb_define_method(c, "_one_hot", t_one_hot, 2);
  rb_define_method(c, "nll_loss", t_nll_loss, 1);
  rb_define_method(c, "binary_cross_entropy_with_logits", t_bce_with_logits, 1);
  rb_define_method(c, "_sort", t_sort, 2);
  rb_define_method(c, "_topk", t_topk, 3);
  rb_define_method(c, "_var", t_var, 3);
  rb_define_method(c, "_std", t_std, 3);
  rb_define_method(c, "_cumsum", t_cumsum, 1);
  rb_define_method(c, "clone", t_clone, 0);
  rb_define_method(c, "_triu", t_triu, 1);
  rb_define_method(c, "_tril", t_tril, 1);
  rb_define_method(c, "isnan", t_isnan, 0);
  rb_define_method(c, "isinf", t_isinf, 0);
  rb_define_method(c, "isfinite", t_isfinite, 0);
  rb_define_singleton_method(rk_mKiln, "_eye", m_eye, 2);
  rb_define_singleton_method(rk_mKiln, "_linspace", m_linspace, 4);
  rb_define_singleton_method(rk_mKiln, "_randint", m_randint, 4);
  rb_define_singleton_method(rk_mKiln, "_randperm", m_randperm, 1);
  rb_define_singleton_method(rk_mKiln, "_save", m_save, 3);
  rb_define_singleton_method(rk_mKiln, "_load", m_load, 1);
}
