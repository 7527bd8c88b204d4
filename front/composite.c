/* composite.c — composite ops written in primitives, plus the view helpers
 * that normalize user arguments (negative axes, Python slice bounds) into
 * primitive attributes.  Temporaries live in a scope released at the end;
 * a NULL anywhere flows through fe_op and keeps the first error. */
#include "composite.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../trace/record.h"
#include "../vm/state.h"
#include "scope.h"

static bool null_arg(const vm_tensor *a) {
  if (a) return false;
  vm_null_input(0);
  return true;
}

static bool reject_bool_arg(const vm_tensor *a) {
  if (a->dtype != KILN_BOOL) return false;
  vm_error(KILN_ERR_DTYPE, "bool tensors are not supported; cast them first");
  return true;
}

/* a, or a cast to f32 when it is not a float tensor or is a half: row
   statistics and the math of composites run in f32 (DESIGN §13), and
   rounded_as() rounds their result once to the half */
static vm_tensor *as_float(fe_scope *s, vm_tensor *a) {
  return vm_dtype_is_float(a->dtype) && !vm_dtype_is_half(a->dtype) ? a
                                                                    : keep(s, fe_cast(a, KILN_F32));
}

/* r in a's dtype when a is a half (computed in f32 by as_float), else r */
static vm_tensor *rounded_as(fe_scope *s, vm_tensor *r, const vm_tensor *a) {
  return r && vm_dtype_is_half(a->dtype) ? keep(s, fe_cast(r, a->dtype)) : r;
}

/* where(x <= 0, 0, x): NaN stays NaN, -0 becomes +0, and the gradient is
   0 at 0 (as PyTorch's: a zero-initialized model trains the same) */
vm_tensor *fe_relu(vm_tensor *a) {
  if (null_arg(a) || reject_bool_arg(a)) return NULL;
  bool is_int = !vm_dtype_is_float(a->dtype);
  fe_scope s = {0};
  vm_tensor *off = keep(&s, fe_binary_scalar(VM_OP_le, a, 0, is_int));
  vm_tensor *zero = keep(&s, fe_weak_scalar(0, is_int));
  vm_tensor *in[3] = {off, zero, a};
  return finish(&s, keep(&s, off && zero ? fe_op(VM_OP_where, 3, in, NULL) : NULL));
}

vm_tensor *fe_gelu(vm_tensor *a) { /* 0.5 x (1 + erf(x / sqrt 2)) */
  if (null_arg(a)) return NULL;
  fe_scope s = {0};
  vm_tensor *x = as_float(&s, a);
  vm_tensor *e =
      keep(&s, fe_unary(VM_OP_erf, keep(&s, fe_binary_scalar(VM_OP_mul, x, M_SQRT1_2, false))));
  vm_tensor *h = keep(
      &s,
      fe_binary_scalar(VM_OP_mul, keep(&s, fe_binary_scalar(VM_OP_add, e, 1, false)), 0.5, false));
  return finish(&s, rounded_as(&s, keep(&s, fe_binary(VM_OP_mul, x, h)), a));
}

vm_tensor *fe_clamp(vm_tensor *a, double lo, double hi) {
  if (null_arg(a) || reject_bool_arg(a)) return NULL;
  if (isnan(lo) || isnan(hi)) {
    vm_error(KILN_ERR_ARG, "bounds must not be NaN (lo %g, hi %g)", lo, hi);
    return NULL;
  }
  bool is_int = !vm_dtype_is_float(a->dtype);
  if (is_int) { /* the integers within [lo, hi], as the dtype holds them */
    lo = ceil(lo);
    hi = floor(hi);
    double min, max; /* a bound past a narrow dtype's range saturates, never wraps
                        (u8's clamp(-1, 255) made every element 255) */
    if (vm_dtype_int_range(a->dtype, &min, &max)) {
      lo = fmin(fmax(lo, min), max);
      hi = fmin(fmax(hi, min), max);
    }
  }
  /* y = where(x < lo, lo, x), then where(y > hi, hi, y): NaN passes
     through, lo > hi gives hi, and the gradient passes at the bounds
     themselves (PyTorch's rules) */
  fe_scope s = {0};
  vm_tensor *vlo = keep(&s, fe_host_scalar(lo, is_int)),
            *vhi = keep(&s, fe_host_scalar(hi, is_int));
  vm_tensor *below = keep(&s, fe_binary(VM_OP_lt, a, vlo));
  vm_tensor *in_lo[3] = {below, vlo, a};
  vm_tensor *low = keep(&s, below && vlo ? fe_op(VM_OP_where, 3, in_lo, NULL) : NULL);
  vm_tensor *above = keep(&s, fe_binary(VM_OP_gt, low, vhi));
  vm_tensor *in_hi[3] = {above, vhi, low};
  return finish(&s, keep(&s, above && vhi ? fe_op(VM_OP_where, 3, in_hi, NULL) : NULL));
}

vm_tensor *fe_mean(vm_tensor *a, int naxes, const int *axes, bool keepdim) {
  if (null_arg(a)) return NULL;
  fe_scope s = {0};
  vm_tensor *x = as_float(&s, a);
  vm_tensor *sum = keep(&s, fe_reduce(VM_OP_sum, x, naxes, axes, keepdim));
  if (!sum) return finish(&s, NULL);
  int64_t count = sum->numel ? x->numel / sum->numel : 0;
  if (sum->numel == 0) { /* count from the shape when the result is empty */
    count = 1;
    for (int i = 0; i < (naxes ? naxes : x->ndim); i++) {
      int ax = naxes ? axes[i] : i;
      vm_norm_axis(&ax, x->ndim);
      if (__builtin_mul_overflow(count, x->shape[ax], &count))
        count = INT64_MAX; /* unreachable: shapes are checked */
    }
  }
  /* the count is a host scalar, a parameter of the key and of compiled
     code (DESIGN §4): it follows the shape, which a key's family erases,
     so a loss's mean over T*B rows is one family, and one set of kernels,
     for every sequence length T */
  return finish(
      &s, rounded_as(&s, keep(&s, fe_binary_host_scalar(VM_OP_div, sum, (double)count, false)), a));
}

/* the max along axis, subtracted for stability: it cancels exactly, so it
   is computed outside autodiff (its gradient would be a chain of ops that
   sums to zero) */
static vm_tensor *stability_shift(vm_tensor *x, int axis) {
  vm_thread()->no_grad++;
  vm_tensor *m = fe_reduce(VM_OP_max, x, 1, &axis, true);
  vm_thread()->no_grad--;
  return m;
}

/* An input without elements gives an empty result of its shape (in float)
   at once: no row statistics are computed for rows that have no elements
   ([1,2,2^31,0] has 2^32 of them).  It stays a function of a, so gradients
   still reach a. */
static vm_tensor *empty_result(fe_scope *s, vm_tensor *x) {
  return keep(s, fe_binary_scalar(VM_OP_mul, x, 0, false));
}

/* an axis argument must be valid even when the input is empty */
static bool valid_axis(int axis, int ndim) { return vm_norm_axis(&axis, ndim); }

vm_tensor *fe_log_softmax(vm_tensor *a, int axis) {
  if (null_arg(a)) return NULL;
  fe_scope s = {0};
  vm_tensor *x = as_float(&s, a);
  if (x && a->numel == 0)
    return finish(&s, valid_axis(axis, a->ndim) ? rounded_as(&s, empty_result(&s, x), a) : NULL);
  vm_tensor *m = keep(&s, stability_shift(x, axis));
  vm_tensor *shifted = keep(&s, fe_binary(VM_OP_sub, x, m));
  vm_tensor *sum =
      keep(&s, fe_reduce(VM_OP_sum, keep(&s, fe_unary(VM_OP_exp, shifted)), 1, &axis, true));
  return finish(
      &s, rounded_as(
              &s, keep(&s, fe_binary(VM_OP_sub, shifted, keep(&s, fe_unary(VM_OP_log, sum)))), a));
}

vm_tensor *fe_softmax(vm_tensor *a, int axis) {
  if (null_arg(a)) return NULL;
  fe_scope s = {0};
  vm_tensor *x = as_float(&s, a);
  if (x && a->numel == 0)
    return finish(&s, valid_axis(axis, a->ndim) ? rounded_as(&s, empty_result(&s, x), a) : NULL);
  vm_tensor *m = keep(&s, stability_shift(x, axis));
  vm_tensor *e = keep(&s, fe_unary(VM_OP_exp, keep(&s, fe_binary(VM_OP_sub, x, m))));
  vm_tensor *sum = keep(&s, fe_reduce(VM_OP_sum, e, 1, &axis, true));
  /* e * (1 / sum), as PyTorch computes it: one division per row, a
     multiplication per element (a division per element was a quarter of
     compiled softmax's time) */
  vm_tensor *one = keep(&s, fe_weak_scalar(1, false));
  vm_tensor *inv = keep(&s, one && sum ? fe_binary(VM_OP_div, one, sum) : NULL);
  return finish(&s, rounded_as(&s, keep(&s, fe_binary(VM_OP_mul, e, inv)), a));
}

vm_tensor *fe_logsumexp(vm_tensor *a, int axis, bool keepdim) {
  if (null_arg(a)) return NULL;
  fe_scope s = {0};
  vm_tensor *x = as_float(&s, a);
  int ax = axis;
  if (x && a->ndim > 0 && vm_norm_axis(&ax, a->ndim) && a->shape[ax] == 0) {
    /* over nothing: log(0) = -inf, as PyTorch (there is no max to shift by) */
    vm_tensor *e = keep(&s, fe_unary(VM_OP_exp, x));
    vm_tensor *lse =
        keep(&s, fe_unary(VM_OP_log, keep(&s, fe_reduce(VM_OP_sum, e, 1, &axis, keepdim))));
    return finish(&s, rounded_as(&s, lse, a));
  }
  vm_tensor *m = keep(&s, stability_shift(x, axis));
  /* an infinite max (all -inf, or +inf) is not subtracted: exp(-inf - -inf) is NaN */
  vm_tensor *inf =
      keep(&s, fe_binary_scalar(VM_OP_eq, keep(&s, fe_unary(VM_OP_abs, m)), INFINITY, false));
  vm_tensor *zero = keep(&s, fe_weak_scalar(0, false));
  vm_tensor *where_in[3] = {inf, zero, m};
  vm_tensor *msafe = keep(&s, inf && zero && m ? fe_op(VM_OP_where, 3, where_in, NULL) : NULL);
  vm_tensor *e = keep(&s, fe_unary(VM_OP_exp, keep(&s, fe_binary(VM_OP_sub, x, msafe))));
  vm_tensor *lse = keep(
      &s,
      fe_binary(VM_OP_add,
                keep(&s, fe_unary(VM_OP_log, keep(&s, fe_reduce(VM_OP_sum, e, 1, &axis, true)))),
                msafe));
  if (!keepdim && lse) lse = keep(&s, fe_squeeze(lse, axis));
  return finish(&s, rounded_as(&s, lse, a));
}

static bool check_affine(const vm_tensor *p, int64_t d, const char *what) {
  if (!p || (p->ndim == 1 && p->shape[0] == d)) return true;
  char buf[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "%s has shape %s, expected [%lld]", what,
           vm_shape_str(buf, p->ndim, p->shape), (long long)d);
  return false;
}

/* (x - mean) / sqrt(var + eps) over the last axis */
static vm_tensor *normalize_last(fe_scope *s, vm_tensor *xf, double eps) {
  int last = -1;
  vm_tensor *xc = keep(s, fe_binary(VM_OP_sub, xf, keep(s, fe_mean(xf, 1, &last, true))));
  vm_tensor *var = keep(s, fe_mean(keep(s, fe_binary(VM_OP_mul, xc, xc)), 1, &last, true));
  vm_tensor *inv =
      keep(s, fe_unary(VM_OP_rsqrt, keep(s, fe_binary_host_scalar(VM_OP_add, var, eps, false))));
  return keep(s, fe_binary(VM_OP_mul, xc, inv));
}

vm_tensor *fe_layer_norm(vm_tensor *x, vm_tensor *w, vm_tensor *b, double eps) {
  if (null_arg(x)) return NULL;
  if (x->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "input must have at least 1 dimension");
    return NULL;
  }
  int64_t d = x->shape[x->ndim - 1];
  if (!check_affine(w, d, "weight") || !check_affine(b, d, "bias")) return NULL;
  fe_scope s = {0};
  /* a half weight and bias in f32 before the rows' work: recorded first,
     their casts do not split the rows' chain of elementwise ops in two */
  if (w && vm_dtype_is_half(w->dtype)) w = keep(&s, fe_cast(w, KILN_F32));
  if (b && vm_dtype_is_half(b->dtype)) b = keep(&s, fe_cast(b, KILN_F32));
  vm_tensor *xf = as_float(&s, x);
  vm_tensor *y = x->numel == 0 ? empty_result(&s, xf) : normalize_last(&s, xf, eps);
  if (w) y = keep(&s, fe_binary(VM_OP_mul, y, w));
  if (b) y = keep(&s, fe_binary(VM_OP_add, y, b));
  return finish(&s, rounded_as(&s, y, x));
}

/* the class-index form: logits [N,C] (any dtype but bool), target [N] of
   int32/int64 class indices; a label outside [0, C) is reported when the
   loss is evaluated, as an error of the loss naming the label */
static bool check_class_target(const vm_tensor *logits, const vm_tensor *target) {
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  if (!vm_dtype_is_index(target->dtype)) {
    vm_error(KILN_ERR_DTYPE,
             "target must be int64 or int32 class indices, not %s "
             "(the class-index form: logits [N,C], target [N])",
             vm_dtype_name(target->dtype));
    return false;
  }
  if (logits->ndim != 2 || target->ndim != 1 || target->shape[0] != logits->shape[0]) {
    vm_error(KILN_ERR_SHAPE, "logits %s and target %s: expected [N,C] and [N]",
             vm_shape_str(b1, logits->ndim, logits->shape),
             vm_shape_str(b2, target->ndim, target->shape));
    return false;
  }
  return !reject_bool_arg(logits);
}

vm_tensor *fe_cross_entropy(vm_tensor *logits, vm_tensor *target) {
  if (!logits || !target) {
    vm_null_input(logits ? 1 : 0);
    return NULL;
  }
  if (!check_class_target(logits, target)) return NULL;
  fe_scope s = {0};
  vm_tensor *ls = keep(&s, fe_log_softmax(logits, 1));
  vm_tensor *idx = keep(&s, fe_unsqueeze(target, 1));
  vm_tensor *picked = keep(&s, fe_index_op(VM_OP_gather, ls, 1, idx, NULL));
  vm_tensor *mean = keep(&s, fe_mean(picked, 0, NULL, false));
  return finish(&s, keep(&s, fe_unary(VM_OP_neg, mean)));
}

/* losses compare like with like: no silent broadcast ([38400,1,1] against
   [38400,1] would be 38400^2 differences) */
static bool same_loss_shapes(const vm_tensor *a, const vm_tensor *b) {
  if (a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)))
    return true;
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE,
           "shapes %s and %s differ (a loss needs equal shapes; it does not "
           "broadcast)",
           vm_shape_str(b1, a->ndim, a->shape), vm_shape_str(b2, b->ndim, b->shape));
  return false;
}

vm_tensor *fe_mse_loss(vm_tensor *a, vm_tensor *b) {
  if (!a || !b) {
    vm_null_input(a ? 1 : 0);
    return NULL;
  }
  if (!same_loss_shapes(a, b)) return NULL;
  fe_scope s = {0};
  vm_tensor *d = keep(&s, fe_binary(VM_OP_sub, a, b));
  vm_tensor *sq = keep(&s, fe_binary(VM_OP_mul, d, d));
  return finish(&s, keep(&s, fe_mean(sq, 0, NULL, false)));
}

vm_tensor *fe_arange_i64(int64_t start, int64_t step, int64_t count, kiln_device d) {
  vm_attr attr = {.dtype = KILN_I64,
                  .ndim = 1,
                  .shape = {count},
                  .scalar = {(double)start, (double)step},
                  .device = (uint8_t)d};
  return fe_op(VM_OP_arange, 0, NULL, &attr);
}

/* --- views --------------------------------------------------------------- */

vm_tensor *fe_permute(vm_tensor *a, const int *perm) {
  if (null_arg(a)) return NULL;
  vm_attr attr = {0};
  if (a->ndim && !perm) {
    vm_error(KILN_ERR_ARG, "perm is NULL");
    return NULL;
  }
  for (int d = 0; d < a->ndim; d++) {
    attr.perm[d] = perm[d];
    if (attr.perm[d] < 0 && attr.perm[d] >= -a->ndim) attr.perm[d] += a->ndim;
  }
  return fe_op(VM_OP_permute, 1, &a, &attr);
}

vm_tensor *fe_transpose(vm_tensor *a, int d0, int d1) {
  if (null_arg(a) || !vm_norm_axis(&d0, a->ndim) || !vm_norm_axis(&d1, a->ndim)) return NULL;
  int perm[KILN_MAX_DIMS];
  for (int d = 0; d < a->ndim; d++) perm[d] = d;
  if (a->ndim) {
    perm[d0] = d1;
    perm[d1] = d0;
  }
  return fe_permute(a, perm);
}

vm_tensor *fe_squeeze(vm_tensor *a, int axis) {
  if (null_arg(a) || !vm_norm_axis(&axis, a->ndim)) return NULL;
  if (a->shape[axis] != 1) {
    vm_error(KILN_ERR_SHAPE, "cannot squeeze axis %d of size %lld", axis,
             (long long)a->shape[axis]);
    return NULL;
  }
  int64_t shape[KILN_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < a->ndim; d++)
    if (d != axis) shape[n++] = a->shape[d];
  return fe_reshape(a, n, shape);
}

/* the axis of a new dimension (unsqueeze, stack): one of the result's
   ndim + 1 axes, named in those terms */
static bool new_axis(int *axis, int ndim) {
  if (*axis < -(ndim + 1) || *axis > ndim) {
    vm_error(KILN_ERR_ARG, "axis %d is out of range [%d, %d]: the new dimension is one of %d",
             *axis, -(ndim + 1), ndim, ndim + 1);
    return false;
  }
  return vm_norm_axis(axis, ndim + 1);
}

vm_tensor *fe_unsqueeze(vm_tensor *a, int axis) {
  if (null_arg(a) || !new_axis(&axis, a->ndim)) return NULL;
  if (a->ndim == KILN_MAX_DIMS) {
    vm_error(KILN_ERR_SHAPE, "a tensor already has the maximum of %d dimensions", KILN_MAX_DIMS);
    return NULL;
  }
  int64_t shape[KILN_MAX_DIMS];
  int n = 0;
  for (int d = 0; d <= a->ndim; d++) {
    if (d == axis) shape[n++] = 1;
    if (d < a->ndim) shape[n++] = a->shape[d];
  }
  return fe_reshape(a, n, shape);
}

/* triu (upper) or tril of the last two dims: element (i, j) is kept where
   j - i >= k (triu) or j - i <= k (tril), else 0.  The kept set is a
   comparison of two aranges, j against i + k (trace/attention.c reads a
   causal mask written this way as the op's causal flag). */
vm_tensor *fe_triangle(vm_tensor *a, int64_t k, bool upper) {
  if (null_arg(a)) return NULL;
  if (a->ndim < 2) {
    vm_error(KILN_ERR_SHAPE, "a tensor of at least 2 dimensions expected, got %d", a->ndim);
    return NULL;
  }
  int64_t rows = a->shape[a->ndim - 2], cols = a->shape[a->ndim - 1];
  /* past the matrix every k keeps all or nothing: i + k stays in range */
  if (k > cols) k = cols;
  if (k < -rows) k = -rows;
  fe_scope s = {0};
  kiln_device d = (kiln_device)a->device;
  vm_tensor *j = keep(&s, fe_arange_i64(0, 1, cols, d));
  vm_tensor *i = keep(&s, fe_arange_i64(k, 1, rows, d));
  i = keep(&s, i ? fe_reshape(i, 2, (int64_t[]){rows, 1}) : NULL);
  vm_tensor *kept = keep(&s, i && j ? fe_binary(upper ? VM_OP_ge : VM_OP_le, j, i) : NULL);
  vm_attr za = {.dtype = a->dtype, .device = a->device}; /* a 0-d 0 of a's dtype (bool too) */
  vm_tensor *zero = keep(&s, fe_op(VM_OP_full, 0, NULL, &za));
  vm_tensor *in[3] = {kept, a, zero};
  return finish(&s, keep(&s, kept && zero ? fe_op(VM_OP_where, 3, in, NULL) : NULL));
}

/* x != x; |x| == inf; |x| < inf (NaN is neither) — false, false, true on
   integers and bool */
vm_tensor *fe_isnan(vm_tensor *a) {
  if (null_arg(a)) return NULL;
  return fe_binary(VM_OP_ne, a, a);
}

static vm_tensor *abs_against_inf(vm_tensor *a, vm_opcode op) {
  if (null_arg(a)) return NULL;
  if (!vm_dtype_is_float(a->dtype)) { /* no integer is infinite: all true, or none */
    vm_tensor *all = fe_binary(VM_OP_eq, a, a);
    if (!all || op != VM_OP_eq) return all;
    vm_tensor *none = fe_unary(VM_OP_logical_not, all);
    vm_release(all);
    return none;
  }
  fe_scope s = {0};
  vm_tensor *m = keep(&s, fe_unary(VM_OP_abs, a));
  return finish(&s, keep(&s, m ? fe_binary_scalar(op, m, INFINITY, false) : NULL));
}

vm_tensor *fe_isinf(vm_tensor *a) { return abs_against_inf(a, VM_OP_eq); }
vm_tensor *fe_isfinite(vm_tensor *a) { return abs_against_inf(a, VM_OP_lt); }

/* Python's slice.indices: clamps bounds into the axis */
vm_tensor *fe_zeros_like(const vm_tensor *x) {
  vm_attr attr = {.dtype = x->dtype, .ndim = x->ndim, .device = x->device};
  memcpy(attr.shape, x->shape, sizeof attr.shape);
  return fe_op(VM_OP_full, 0, NULL, &attr);
}

vm_tensor *fe_slice(vm_tensor *a, int axis, int64_t start, int64_t stop, int64_t step) {
  if (null_arg(a)) return NULL;
  if (a->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "cannot slice a 0-d tensor");
    return NULL;
  }
  if (!vm_norm_axis(&axis, a->ndim)) return NULL;
  if (step == 0) {
    vm_error(KILN_ERR_ARG, "slice step must not be 0");
    return NULL;
  }
  int64_t len = a->shape[axis];
  int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1;
  if (start < 0) start = start < -len ? lo : start + len;
  if (stop < 0) stop = stop < -len ? lo : stop + len;
  if (start > hi) start = hi;
  if (stop > hi) stop = hi;
  if (start < lo) start = lo;
  if (stop < lo) stop = lo;
  vm_attr attr = {.axis = axis, .start = start, .stop = stop, .step = step};
  return fe_op(VM_OP_slice, 1, &a, &attr);
}

vm_tensor *fe_concat(int n, vm_tensor *const *ts, int axis) {
  if (n < 1 || !ts) {
    vm_error(KILN_ERR_ARG, "needs at least one tensor, got %d", n);
    return NULL;
  }
  for (int i = 0; i < n; i++)
    if (!ts[i]) {
      vm_null_input(i);
      return NULL;
    }
  if (ts[0]->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "cannot concatenate 0-d tensors");
    return NULL;
  }
  if (!vm_norm_axis(&axis, ts[0]->ndim)) return NULL;
  vm_attr attr = {.axis = axis};
  return fe_op(VM_OP_concat, n, ts, &attr);
}

vm_tensor *fe_stack(int n, vm_tensor *const *ts, int axis) {
  if (n < 1 || !ts) {
    vm_error(KILN_ERR_ARG, "needs at least one tensor, got %d", n);
    return NULL;
  }
  if (!ts[0]) {
    vm_null_input(0);
    return NULL;
  }
  if (!new_axis(&axis, ts[0]->ndim)) return NULL;
  vm_tensor **parts = calloc((size_t)n, sizeof *parts);
  if (!parts) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    if (ts[i] && (ts[i]->ndim != ts[0]->ndim ||
                  memcmp(ts[i]->shape, ts[0]->shape, (size_t)ts[0]->ndim * sizeof(int64_t)))) {
      char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
      vm_error(
          KILN_ERR_SHAPE, "tensor %d has shape %s, tensor 0 %s: stacked tensors have one shape", i,
          vm_shape_str(b1, ts[i]->ndim, ts[i]->shape), vm_shape_str(b2, ts[0]->ndim, ts[0]->shape));
      ok = false;
    } else {
      ok = (parts[i] = fe_unsqueeze(ts[i], axis)) != NULL;
    }
  }
  vm_tensor *r = ok ? fe_concat(n, parts, axis) : NULL;
  for (int i = 0; i < n; i++) vm_release(parts[i]);
  free(parts);
  return r;
}

vm_tensor *fe_index_op(vm_opcode op, vm_tensor *a, int axis, vm_tensor *idx, vm_tensor *src) {
  vm_tensor *in[3] = {a, idx, src};
  int n = op == VM_OP_scatter_add ? 3 : 2;
  for (int i = 0; i < n; i++)
    if (!in[i]) {
      vm_null_input(i);
      return NULL;
    }
  if (!vm_norm_axis(&axis, a->ndim)) return NULL;
  vm_attr attr = {.axis = axis};
  return fe_op(op, n, in, &attr);
}

/* --- functionalized in-place updates -------------------------------------- */

/* A store: dst's handle now names value (cast to dst's dtype).  A leaf
   variable (dst->slot) gets a node of its own, computed without tracking,
   so its update never becomes part of a gradient graph. */
static int rebind_to(vm_tensor *dst, vm_tensor *value) {
  if (!value) return vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
  vm_tensor *v;
  if (dst->slot) {
    vm_thread()->no_grad++;
    v = value->dtype == dst->dtype ? fe_unary(VM_OP_copy, value) : fe_cast(value, dst->dtype);
    vm_thread()->no_grad--;
  } else {
    v = value->dtype == dst->dtype ? vm_retain(value) : fe_cast(value, dst->dtype);
  }
  if (!v) return vm_thread()->status;
  tr_store(dst, v);
  vm_release(v);
  return KILN_OK;
}

static bool same_shape(const vm_tensor *a, const vm_tensor *b) {
  if (a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)))
    return true;
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "destination shape %s and source shape %s differ",
           vm_shape_str(b1, a->ndim, a->shape), vm_shape_str(b2, b->ndim, b->shape));
  return false;
}

int fe_assign(vm_tensor *dst, vm_tensor *src) {
  if (!dst || !src) {
    vm_null_input(dst ? 1 : 0);
    return vm_thread()->status;
  }
  if (!same_shape(dst, src)) return KILN_ERR_SHAPE;
  if (dst == src) return KILN_OK;
  return rebind_to(dst, src);
}

int fe_sub_scaled(vm_tensor *dst, vm_tensor *src, double alpha) {
  if (!dst || !src) {
    vm_null_input(dst ? 1 : 0);
    return vm_thread()->status;
  }
  fe_scope s = {0};
  if (dst->slot) vm_thread()->no_grad++; /* an optimizer step is not differentiated */
  vm_tensor *step = keep(&s, fe_binary_host_scalar(VM_OP_mul, src, alpha, false));
  vm_tensor *value = keep(&s, fe_binary(VM_OP_sub, dst, step));
  if (dst->slot) vm_thread()->no_grad--;
  int rc = value ? (same_shape(dst, value) ? rebind_to(dst, value) : KILN_ERR_SHAPE)
                 : vm_thread()->status;
  finish(&s, NULL);
  return rc;
}
