/* ops.c — Kiln::Tensor's ops: operators and elementwise math (final, called
 * directly), and the positional `_name` methods lib/kiln/tensor.rb wraps with
 * keywords.  Every method allocates its result wrapper before calling Kiln,
 * clears Kiln's error, and raises Kiln's message when the call fails. */
#include "kiln_ext.h"

typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
typedef kiln_tensor *(*scalar_fn)(kiln_tensor *, double);

/* --- elementwise ----------------------------------------------------------------- */

VALUE rk_unary(VALUE self, kiln_tensor *(*fn)(kiln_tensor *)) {
  kiln_tensor *a = rk_get(self);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(a));
}

/* self OP other, other a Tensor, an Array (converted with Kiln.tensor's
   rules), or a Ruby number.  A Float, or an Integer next to a float tensor,
   goes to the weak kiln_*_scalar form where one exists (the value is a
   runtime parameter, not part of the trace key, and never widens the tensor).
   Otherwise the number becomes a 0-d tensor in the dtype rk_scalar_for picks
   (an Integer keeps an integer tensor's dtype). */
static VALUE binary(VALUE self, VALUE other, binary_fn tt, scalar_fn ts) {
  kiln_tensor *a = rk_get(self);
  if (RB_TYPE_P(other, T_ARRAY)) other = rk_from_ruby(other, Qnil);
  if (rk_is_tensor(other)) {
    kiln_tensor *b = rk_get(other);
    VALUE obj = rk_alloc();
    kiln_clear_error();
    VALUE r = rk_finish(obj, tt(a, b));
    RB_GC_GUARD(other);
    return r;
  }
  if (ts && (RB_FLOAT_TYPE_P(other) ||
             (RB_INTEGER_TYPE_P(other) && rk_dtype_is_float(kiln_dtype_of(a))))) {
    double v = NUM2DBL(other);
    VALUE obj = rk_alloc();
    kiln_clear_error();
    return rk_finish(obj, ts(a, v));
  }
  VALUE obj = rk_alloc();
  kiln_tensor *s = rk_scalar_for(other, a); /* TypeError for anything else */
  if (!s) rk_raise_kiln("kiln_scalar");
  kiln_clear_error();
  kiln_tensor *r = tt(a, s);
  kiln_release(s); /* r keeps what it needs */
  return rk_finish(obj, r);
}

#define UNARY(name) \
  static VALUE t_##name(VALUE self) { return rk_unary(self, kiln_##name); }
UNARY(neg)
UNARY(abs)
UNARY(exp)
UNARY(log)
UNARY(sqrt)
UNARY(rsqrt)
UNARY(sin)
UNARY(cos)
UNARY(tanh)
UNARY(sigmoid)
UNARY(relu)
UNARY(gelu)
UNARY(erf)
UNARY(log1p)
UNARY(expm1)
UNARY(floor)
UNARY(ceil)
UNARY(round)
UNARY(sign)
UNARY(logical_not)

#define BINARY_S(name)                                         \
  static VALUE t_##name(VALUE self, VALUE o) {                 \
    return binary(self, o, kiln_##name, kiln_##name##_scalar); \
  }
#define BINARY(name) \
  static VALUE t_##name(VALUE self, VALUE o) { return binary(self, o, kiln_##name, NULL); }
BINARY_S(add)
BINARY_S(sub)
BINARY_S(mul)
BINARY_S(div)

/* an integer tensor to a negative integer power has no integer value
   (torch refuses it too; 2 ** -1 was 0) */
static VALUE t_pow(VALUE self, VALUE o) {
  kiln_tensor *a = rk_get(self);
  if (RB_INTEGER_TYPE_P(o) && !rk_dtype_is_float(kiln_dtype_of(a)) && NUM2DBL(o) < 0)
    rb_raise(rb_eArgError,
             "Kiln::Tensor#**: integers to negative integer powers are not allowed (%" PRIsVALUE
             "); cast to a float dtype first",
             o);
  return binary(self, o, kiln_pow, kiln_pow_scalar);
}
BINARY(maximum)
BINARY(minimum)
BINARY(eq)
BINARY(ne)
BINARY(lt)
BINARY(le)
BINARY(gt)
BINARY(ge)
BINARY(logical_and)
BINARY(logical_or)
BINARY(matmul)

static VALUE t_pos(VALUE self) { return self; }

/* Tensor#_clamp(lo, hi): Floats, nil already replaced by -/+Infinity */
static VALUE t_clamp(VALUE self, VALUE lo, VALUE hi) {
  kiln_tensor *a = rk_get(self);
  double l = rk_num(lo, "min"), h = rk_num(hi, "max");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_clamp(a, l, h));
}

static VALUE t_cast(VALUE self, VALUE dtype) {
  kiln_tensor *a = rk_get(self);
  kiln_dtype dt = rk_dtype(dtype);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_cast(a, dt));
}

/* cond._where(a, b): a and b are tensors */
static VALUE t_where(VALUE self, VALUE a, VALUE b) {
  kiln_tensor *c = rk_get(self), *x = rk_get(a), *y = rk_get(b);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_where(c, x, y));
  RB_GC_GUARD(a);
  RB_GC_GUARD(b);
  return r;
}

/* --- reductions ---------------------------------------------------------------- */

typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);

/* axes: nil (all), an Integer, or an Array of Integers */
static VALUE reduce(VALUE self, VALUE axes, VALUE keepdim, reduce_fn fn) {
  kiln_tensor *a = rk_get(self);
  int ax[RK_MAX_ARGS], n = rk_axes_arg(axes, ax);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, fn(a, n, ax, RTEST(keepdim)));
}

#define REDUCE(name)                                             \
  static VALUE t_##name(VALUE self, VALUE axes, VALUE keepdim) { \
    return reduce(self, axes, keepdim, kiln_##name);             \
  }
REDUCE(sum)
REDUCE(mean)
REDUCE(max)
REDUCE(min)
REDUCE(prod)

static VALUE t_argmax(VALUE self, VALUE axis, VALUE keepdim) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_argmax(a, ax, RTEST(keepdim)));
}
static VALUE t_argmin(VALUE self, VALUE axis, VALUE keepdim) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_argmin(a, ax, RTEST(keepdim)));
}

/* --- shape ops ----------------------------------------------------------------- */

static VALUE t_reshape(VALUE self, VALUE shape) {
  kiln_tensor *a = rk_get(self);
  int64_t s[RK_MAX_ARGS];
  int nd = rk_shape(shape, s);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_reshape(a, nd, s));
}

static VALUE t_expand(VALUE self, VALUE shape) {
  kiln_tensor *a = rk_get(self);
  int64_t s[RK_MAX_ARGS];
  int nd = rk_shape(shape, s);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_expand(a, nd, s));
}

static VALUE t_permute(VALUE self, VALUE perm) {
  kiln_tensor *a = rk_get(self);
  int p[RK_MAX_ARGS];
  int n = rk_axes(perm, p);
  /* kiln_permute reads ndim entries: the count is checked here */
  if (n != kiln_ndim(a))
    rk_raise(rk_eShapeError, "kiln_permute: %d dims given for a tensor of %d dimensions", n,
             kiln_ndim(a));
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_permute(a, p));
}

static VALUE t_transpose(VALUE self, VALUE d0, VALUE d1) {
  kiln_tensor *a = rk_get(self);
  int x = rk_int(d0, "dim0"), y = rk_int(d1, "dim1");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_transpose(a, x, y));
}

static VALUE t_squeeze(VALUE self, VALUE axis) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_squeeze(a, ax));
}

static VALUE t_unsqueeze(VALUE self, VALUE axis) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_unsqueeze(a, ax));
}

static VALUE t_slice(VALUE self, VALUE axis, VALUE start, VALUE stop, VALUE step) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  int64_t b = rk_i64(start, "start"), e = rk_i64(stop, "stop"), s = rk_i64(step, "step");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_slice(a, ax, b, e, s));
}

typedef kiln_tensor *(*index_fn)(kiln_tensor *, int, kiln_tensor *);
static VALUE index_op(VALUE self, VALUE axis, VALUE idx, index_fn fn) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  idx = rk_index_arg(idx);
  kiln_tensor *i = rk_get(idx);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, fn(a, ax, i));
  RB_GC_GUARD(idx);
  return r;
}
static VALUE t_index_select(VALUE self, VALUE axis, VALUE idx) {
  return index_op(self, axis, idx, kiln_index_select);
}
static VALUE t_gather(VALUE self, VALUE axis, VALUE idx) {
  return index_op(self, axis, idx, kiln_gather);
}

static VALUE t_scatter_add(VALUE self, VALUE axis, VALUE idx, VALUE src) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  kiln_tensor *i = rk_get(idx), *s = rk_get(src);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_scatter_add(a, ax, i, s));
  RB_GC_GUARD(idx);
  RB_GC_GUARD(src);
  return r;
}

/* --- neural-network composites ----------------------------------------------------- */

static VALUE t_softmax(VALUE self, VALUE axis) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_softmax(a, ax));
}
static VALUE t_log_softmax(VALUE self, VALUE axis) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_log_softmax(a, ax));
}
static VALUE t_logsumexp(VALUE self, VALUE axis, VALUE keepdim) {
  kiln_tensor *a = rk_get(self);
  int ax = rk_int(axis, "dim");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  return rk_finish(obj, kiln_logsumexp(a, ax, RTEST(keepdim)));
}

/* Tensor#_layer_norm(weight_or_nil, bias_or_nil, eps) */
static VALUE t_layer_norm(VALUE self, VALUE w, VALUE b, VALUE eps) {
  kiln_tensor *x = rk_get(self);
  kiln_tensor *wt = NIL_P(w) ? NULL : rk_get(w), *bt = NIL_P(b) ? NULL : rk_get(b);
  double e = rk_num(eps, "eps");
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, kiln_layer_norm(x, wt, bt, e));
  RB_GC_GUARD(w);
  RB_GC_GUARD(b);
  return r;
}

/* a Tensor, or an Array: converted as an index (Kiln.tensor's rules, :int64) */
VALUE rk_index_arg(VALUE v) {
  return RB_TYPE_P(v, T_ARRAY) ? rk_from_ruby(v, ID2SYM(rb_intern("int64"))) : v;
}

VALUE rk_with_target(VALUE self, VALUE target, bool index, binary_fn fn) {
  kiln_tensor *x = rk_get(self);
  if (RB_TYPE_P(target, T_ARRAY))
    target = index ? rk_index_arg(target) : rk_from_ruby(target, Qnil);
  kiln_tensor *y = rk_get(target);
  VALUE obj = rk_alloc();
  kiln_clear_error();
  VALUE r = rk_finish(obj, fn(x, y));
  RB_GC_GUARD(target);
  return r;
}

static VALUE t_cross_entropy(VALUE self, VALUE target) {
  return rk_with_target(self, target, true, kiln_cross_entropy);
}
static VALUE t_mse_loss(VALUE self, VALUE other) {
  return rk_with_target(self, other, false, kiln_mse_loss);
}

void rk_init_ops(void) {
  VALUE c = rk_cTensor;
#define DEF(rb, fn, n) rb_define_method(c, rb, fn, n)
  /* elementwise unary */
  DEF("neg", t_neg, 0);
  DEF("-@", t_neg, 0);
  DEF("+@", t_pos, 0);
  DEF("abs", t_abs, 0);
  DEF("exp", t_exp, 0);
  DEF("log", t_log, 0);
  DEF("sqrt", t_sqrt, 0);
  DEF("rsqrt", t_rsqrt, 0);
  DEF("sin", t_sin, 0);
  DEF("cos", t_cos, 0);
  DEF("tanh", t_tanh, 0);
  DEF("sigmoid", t_sigmoid, 0);
  DEF("relu", t_relu, 0);
  DEF("gelu", t_gelu, 0);
  DEF("erf", t_erf, 0);
  DEF("log1p", t_log1p, 0);
  DEF("expm1", t_expm1, 0);
  DEF("floor", t_floor, 0);
  DEF("ceil", t_ceil, 0);
  DEF("round", t_round, 0);
  DEF("sign", t_sign, 0);
  DEF("logical_not", t_logical_not, 0);
  /* elementwise binary */
  DEF("+", t_add, 1);
  DEF("add", t_add, 1);
  DEF("-", t_sub, 1);
  DEF("sub", t_sub, 1);
  DEF("*", t_mul, 1);
  DEF("mul", t_mul, 1);
  DEF("/", t_div, 1);
  DEF("div", t_div, 1);
  DEF("**", t_pow, 1);
  DEF("pow", t_pow, 1);
  DEF("maximum", t_maximum, 1);
  DEF("minimum", t_minimum, 1);
  DEF("eq", t_eq, 1);
  DEF("ne", t_ne, 1);
  DEF("lt", t_lt, 1);
  DEF("<", t_lt, 1);
  DEF("le", t_le, 1);
  DEF("<=", t_le, 1);
  DEF("gt", t_gt, 1);
  DEF(">", t_gt, 1);
  DEF("ge", t_ge, 1);
  DEF(">=", t_ge, 1);
  DEF("logical_and", t_logical_and, 1);
  DEF("&", t_logical_and, 1);
  DEF("logical_or", t_logical_or, 1);
  DEF("|", t_logical_or, 1);
  DEF("matmul", t_matmul, 1);
  DEF("_clamp", t_clamp, 2);
  DEF("_cast", t_cast, 1);
  DEF("_where", t_where, 2);
  /* reductions */
  DEF("_sum", t_sum, 2);
  DEF("_mean", t_mean, 2);
  DEF("_max", t_max, 2);
  DEF("_min", t_min, 2);
  DEF("_prod", t_prod, 2);
  DEF("_argmax", t_argmax, 2);
  DEF("_argmin", t_argmin, 2);
  /* shape */
  DEF("_reshape", t_reshape, 1);
  DEF("_expand", t_expand, 1);
  DEF("_permute", t_permute, 1);
  DEF("transpose", t_transpose, 2);
  DEF("_squeeze", t_squeeze, 1);
  DEF("unsqueeze", t_unsqueeze, 1);
  DEF("_slice", t_slice, 4);
  DEF("index_select", t_index_select, 2);
  DEF("gather", t_gather, 2);
  DEF("scatter_add", t_scatter_add, 3);
  /* composites */
  DEF("_softmax", t_softmax, 1);
  DEF("_log_softmax", t_log_softmax, 1);
  DEF("_logsumexp", t_logsumexp, 2);
  DEF("_layer_norm", t_layer_norm, 3);
  DEF("cross_entropy", t_cross_entropy, 1);
  DEF("mse_loss", t_mse_loss, 1);
#undef DEF
}
