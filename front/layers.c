/* layers.c — the ops real models need beyond the basics (issue 18):
 * linspace/eye/randint/randperm/clone, var/std, conv2d, pooling,
 * batch_norm, dropout, embedding, one_hot and the nll/bce losses.  Every
 * one but the CPU's convolution is a composite of existing primitives
 * recorded at call time, so autodiff (their gradients are the primitives'
 * VJPs), the trace key and the code generators need nothing new.  Window
 * ops (pooling; convolution off the CPU) gather their windows with one
 * index_select whose index is built here, on the host, from the shapes
 * alone.  On the CPU, conv2d is a primitive of its own (ops.def,
 * vm/kern_conv.c): the composed im2col moved the batch's whole column
 * matrix through memory (see fe_conv2d). */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../trace/record.h"
#include "../vm/rng.h"
#include "../vm/state.h"
#include "composite.h"
#include "scope.h"

static bool null_arg(const vm_tensor *a, int index) {
  if (a) return false;
  vm_null_input(index);
  return true;
}

static bool require_float(const vm_tensor *a, const char *what) {
  if (vm_dtype_is_float(a->dtype)) return true;
  vm_error(KILN_ERR_DTYPE, "%s must be a float tensor, not %s", what, vm_dtype_name(a->dtype));
  return false;
}

static bool require_index(const vm_tensor *a, const char *what) {
  if (vm_dtype_is_index(a->dtype)) return true;
  vm_error(KILN_ERR_DTYPE, "%s must be int64 or int32, not %s", what, vm_dtype_name(a->dtype));
  return false;
}

/* Checks the values of an index tensor against [0, size) at the call when
   they are known (a materialized tensor, as labels and token ids usually
   are); pending indices are checked by the index primitive at the flush. */
static bool check_index_values(vm_tensor *idx, int64_t size, const char *what) {
  vm_tensor *v = tr_peek_value(idx);
  if (!v || v->storage->device != KILN_CPU) return true; /* checked by the kernel */
  vm_tensor *c = vm_value_contiguous(v);
  if (!c) return false;
  bool ok = true;
  for (int64_t i = 0; ok && i < c->numel; i++) {
    int64_t x =
        c->dtype == KILN_I32 ? ((const int32_t *)vm_data(c))[i] : ((const int64_t *)vm_data(c))[i];
    if (x < 0 || x >= size) {
      vm_error(KILN_ERR_ARG, "%s %lld (at flat position %lld) is out of range [0, %lld)", what,
               (long long)x, (long long)i, (long long)size);
      ok = false;
    }
  }
  vm_release(c);
  return ok;
}

static bool same_shapes(const vm_tensor *a, const vm_tensor *b, const char *an, const char *bn) {
  if (a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)))
    return true;
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "%s shape %s and %s shape %s must be equal", an,
           vm_shape_str(b1, a->ndim, a->shape), bn, vm_shape_str(b2, b->ndim, b->shape));
  return false;
}

/* --- creation ------------------------------------------------------------ */

/* made on the default device (KILN_DEVICE), as every creation op */
static bool new_tensor_device(vm_attr *attr) {
  kiln_device d;
  if (!vm_default_device(&d)) return false;
  attr->device = (uint8_t)d;
  return true;
}

static vm_tensor *arange_f64(int64_t n) {
  vm_attr attr = {.dtype = KILN_F64, .ndim = 1, .shape = {n}, .scalar = {0, 1}};
  if (!new_tensor_device(&attr)) return NULL;
  return fe_op(VM_OP_arange, 0, NULL, &attr);
}

/* start + i*step for the first half, stop - (n-1-i)*step for the rest (as
   PyTorch): both ends are exact.  Computed in f64, then cast. */
vm_tensor *fe_linspace(double start, double stop, int64_t n, kiln_dtype dt) {
  if (!vm_dtype_valid((int)dt)) {
    vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)dt);
    return NULL;
  }
  if (n < 0 || !isfinite(start) || !isfinite(stop)) {
    vm_error(KILN_ERR_ARG, "bad arguments start %g, stop %g, n %lld", start, stop, (long long)n);
    return NULL;
  }
  double step = n > 1 ? (stop - start) / (double)(n - 1) : 0;
  fe_scope s = {0};
  vm_tensor *i = keep(&s, arange_f64(n));
  vm_tensor *lo = keep(
      &s, fe_binary_host_scalar(
              VM_OP_add, keep(&s, fe_binary_host_scalar(VM_OP_mul, i, step, false)), start, false));
  /* stop - (n-1-i)*step, as (i - (n-1)) * step + stop */
  vm_tensor *back = keep(&s, fe_binary_host_scalar(VM_OP_sub, i, (double)(n - 1), false));
  vm_tensor *hi =
      keep(&s, fe_binary_host_scalar(VM_OP_add,
                                     keep(&s, fe_binary_host_scalar(VM_OP_mul, back, step, false)),
                                     stop, false));
  vm_tensor *first =
      keep(&s, fe_binary_host_scalar(VM_OP_lt, i, n == 1 ? 1.0 : (double)(n / 2), false));
  vm_tensor *in[3] = {first, lo, hi};
  vm_tensor *r = keep(&s, first && lo && hi ? fe_op(VM_OP_where, 3, in, NULL) : NULL);
  return finish(&s, dt == KILN_F64 || !r ? r : keep(&s, fe_cast(r, dt)));
}

vm_tensor *fe_eye(int64_t n, kiln_dtype dt) {
  if (!vm_dtype_valid((int)dt)) {
    vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)dt);
    return NULL;
  }
  if (n < 0) {
    vm_error(KILN_ERR_ARG, "n %lld is negative", (long long)n);
    return NULL;
  }
  kiln_device d;
  if (!vm_default_device(&d)) return NULL;
  fe_scope s = {0};
  vm_tensor *i = keep(&s, fe_arange_i64(0, 1, n, d));
  vm_tensor *col = keep(&s, fe_reshape(i, 2, (int64_t[]){n, 1}));
  vm_tensor *row = keep(&s, fe_reshape(i, 2, (int64_t[]){1, n}));
  return finish(&s, keep(&s, fe_cast(keep(&s, fe_binary(VM_OP_eq, col, row)), dt)));
}

static vm_tensor *uniform_f64(int ndim, const int64_t *shape) {
  int64_t numel;
  if (!vm_check_dims_arg(ndim, shape) || !vm_check_shape(ndim, shape, &numel)) return NULL;
  vm_attr attr = {.dtype = KILN_F64, .ndim = ndim};
  if (!new_tensor_device(&attr)) return NULL;
  if (ndim) memcpy(attr.shape, shape, (size_t)ndim * sizeof *shape);
  vm_rng_reserve(vm_rng_blocks(numel, KILN_F64), &attr.seed, &attr.counter);
  return fe_op(VM_OP_rand, 0, NULL, &attr);
}

/* floor(low + u * (high - low)) with u ~ U[0,1) in f64 (53 bits): uniform
   up to a bias below 2^-53 * range; ranges beyond 2^53 are refused */
vm_tensor *fe_randint(int64_t low, int64_t high, kiln_dtype dt, int ndim, const int64_t *shape) {
  if (!vm_dtype_valid((int)dt) || dt == KILN_BOOL) {
    vm_error(KILN_ERR_DTYPE, "invalid dtype %d for random integers", (int)dt);
    return NULL;
  }
  if (high <= low || (double)high - (double)low > 0x1p53) {
    vm_error(KILN_ERR_ARG, "bad range [%lld, %lld): it must be non-empty and at most 2^53 wide",
             (long long)low, (long long)high);
    return NULL;
  }
  double min, max; /* a draw the dtype cannot hold would saturate (u8 [0, 300) put 15% on 255) */
  if (vm_dtype_int_range(dt, &min, &max) && ((double)low < min || (double)(high - 1) > max)) {
    vm_error(KILN_ERR_ARG, "range [%lld, %lld) does not fit %s ([%.0f, %.0f])", (long long)low,
             (long long)high, vm_dtype_name(dt), min, max);
    return NULL;
  }
  fe_scope s = {0};
  vm_tensor *u = keep(&s, uniform_f64(ndim, shape));
  double span = (double)high - (double)low;
  vm_tensor *v = keep(&s, fe_binary_host_scalar(
                              VM_OP_add, keep(&s, fe_binary_host_scalar(VM_OP_mul, u, span, false)),
                              (double)low, false));
  vm_tensor *f = keep(&s, fe_unary(VM_OP_floor, v));
  /* rounding in low + u*span can reach high itself */
  vm_tensor *top = keep(&s, fe_host_scalar((double)(high - 1), false));
  vm_tensor *capped = keep(&s, f && top ? fe_binary(VM_OP_minimum, f, top) : NULL);
  return finish(&s, keep(&s, capped ? fe_cast(capped, dt) : NULL));
}

/* A Fisher-Yates shuffle on the host, drawing from the process Philox
   stream (so kiln_manual_seed reproduces it): position i swaps with
   j = floor(r * (i + 1) / 2^64), r the i-th 64-bit word of the reserved
   blocks (Lemire's multiply, bias below n / 2^64).  Made at the call: a
   permutation is data, like kiln_from_data's. */
vm_tensor *fe_randperm(int64_t n) {
  if (n < 0 || n > (INT64_C(1) << 40)) {
    vm_error(KILN_ERR_ARG, "n %lld is out of range [0, 2^40]", (long long)n);
    return NULL;
  }
  vm_tensor *t = vm_tensor_new(KILN_I64, 1, &n);
  if (!t) return NULL;
  int64_t *p = vm_data(t);
  for (int64_t i = 0; i < n; i++) p[i] = i;
  uint64_t seed, counter;
  vm_rng_reserve((uint64_t)(n + 1) / 2, &seed, &counter);
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, r[4];
  for (int64_t k = 0, i = n - 1; i > 0; k++, i--) {
    if (k % 2 == 0) {
      uint64_t c = counter + (uint64_t)(k / 2);
      uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
      vm_philox(key, ctr, r);
    }
    uint64_t word = ((uint64_t)r[(k % 2) * 2] << 32) | r[(k % 2) * 2 + 1];
    int64_t j = (int64_t)(((unsigned __int128)word * (uint64_t)(i + 1)) >> 64);
    int64_t tmp = p[i];
    p[i] = p[j];
    p[j] = tmp;
  }
  kiln_device d;
  if (!vm_default_device(&d)) {
    vm_release(t);
    return NULL;
  }
  return fe_handle_from_host(t, d);
}

/* a new value node (values are immutable, so a copy is all a clone is) */
vm_tensor *fe_clone(vm_tensor *a) {
  if (null_arg(a, 0)) return NULL;
  return fe_unary(VM_OP_copy, a);
}

/* --- var / std ----------------------------------------------------------- */

static int64_t reduced_count(const vm_tensor *x, int naxes, const int *axes) {
  int64_t count = 1;
  for (int i = 0; i < (naxes ? naxes : x->ndim); i++) {
    int ax = naxes ? axes[i] : i;
    if (!vm_norm_axis(&ax, x->ndim)) return -1;
    count *= x->shape[ax];
  }
  return count;
}

/* sum((x - mean)^2) / (count - correction); count <= correction divides by
   zero (inf, or NaN for an empty reduction), as PyTorch */
vm_tensor *fe_var(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim) {
  if (null_arg(a, 0)) return NULL;
  if (correction < 0) {
    vm_error(KILN_ERR_ARG, "correction %d is negative", correction);
    return NULL;
  }
  if (a->dtype == KILN_BOOL) {
    vm_error(KILN_ERR_DTYPE, "bool tensors are not supported; cast them first");
    return NULL;
  }
  fe_scope s = {0};
  vm_tensor *x = vm_dtype_is_float(a->dtype) ? a : keep(&s, fe_cast(a, KILN_F32));
  vm_tensor *mean = keep(&s, fe_mean(x, naxes, axes, true));
  if (!mean) return finish(&s, NULL);
  int64_t count = reduced_count(x, naxes, axes);
  vm_tensor *xc = keep(&s, fe_binary(VM_OP_sub, x, mean));
  vm_tensor *ss =
      keep(&s, fe_reduce(VM_OP_sum, keep(&s, fe_binary(VM_OP_mul, xc, xc)), naxes, axes, keepdim));
  double denom = count > correction ? (double)(count - correction) : 0.0;
  return finish(&s, keep(&s, ss ? fe_binary_scalar(VM_OP_div, ss, denom, false) : NULL));
}

vm_tensor *fe_std(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim) {
  vm_tensor *v = fe_var(a, naxes, axes, correction, keepdim);
  vm_tensor *r = v ? fe_unary(VM_OP_sqrt, v) : NULL;
  vm_release(v);
  return r;
}

/* --- cumsum --------------------------------------------------------------- */

/* y shifted by s positions along axis, zeros shifted in: concat(zeros,
   y[0 : n - s]) */
static vm_tensor *shift_in_zeros(vm_tensor *y, int axis, int64_t s) {
  vm_attr zattr = {.dtype = y->dtype, .ndim = y->ndim, .device = y->device};
  memcpy(zattr.shape, y->shape, sizeof zattr.shape);
  zattr.shape[axis] = s;
  fe_scope sc = {0};
  vm_tensor *parts[2] = {keep(&sc, fe_op(VM_OP_full, 0, NULL, &zattr)),
                         keep(&sc, fe_slice(y, axis, 0, y->shape[axis] - s, 1))};
  return finish(&sc, keep(&sc, parts[0] && parts[1] ? fe_concat(2, parts, axis) : NULL));
}

/* An inclusive scan in log2(n) steps of y += shift(y, 2^k) (Hillis-Steele):
   only additions (no products with 0, so inf and NaN behave as in a
   sequential sum), all elementwise ops the JIT fuses, a pairwise-like
   summation order, and a gradient (the reverse scan) from the VJPs of
   slice, concat and add.  Integers and bool sum in i64, floats keep their
   dtype (as kiln_sum). */
vm_tensor *fe_cumsum(vm_tensor *a, int axis) {
  if (null_arg(a, 0)) return NULL;
  if (a->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "a 0-d tensor has no axis %d", axis);
    return NULL;
  }
  if (!vm_norm_axis(&axis, a->ndim)) return NULL;
  vm_tensor *y = vm_dtype_is_float(a->dtype) ? fe_unary(VM_OP_copy, a) : fe_cast(a, KILN_I64);
  int64_t n = a->shape[axis];
  for (int64_t s = 1; y && s < n; s *= 2) {
    vm_tensor *shifted = shift_in_zeros(y, axis, s);
    vm_tensor *next = shifted ? fe_binary(VM_OP_add, y, shifted) : NULL;
    vm_release(shifted);
    vm_release(y);
    y = next;
  }
  return y;
}

/* --- sort / topk ---------------------------------------------------------- */

static vm_tensor *argsort(vm_tensor *a, int axis, bool descending) {
  vm_attr attr = {.axis = axis, .keepdim = descending};
  return fe_op(VM_OP_argsort, 1, &a, &attr);
}

static bool sort_axis(vm_tensor *a, int *axis) {
  if (a->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "a 0-d tensor has no axis %d", *axis);
    return false;
  }
  return vm_norm_axis(axis, a->ndim);
}

/* the values gathered with the first k of the (stable) sorting permutation:
   gather's VJP scatters the gradient back to where each value came from */
static vm_tensor *sorted_prefix(vm_tensor *a, int axis, bool descending, int64_t k,
                                vm_tensor **indices) {
  if (indices) *indices = NULL;
  fe_scope s = {0};
  vm_tensor *idx = keep(&s, argsort(a, axis, descending));
  if (idx && k < a->shape[axis]) idx = keep(&s, fe_slice(idx, axis, 0, k, 1));
  vm_tensor *v = keep(&s, idx ? fe_index_op(VM_OP_gather, a, axis, idx, NULL) : NULL);
  if (v && indices) *indices = vm_retain(idx);
  return finish(&s, v);
}

/* stable; NaN is the largest value (last ascending, first descending) */
vm_tensor *fe_sort(vm_tensor *a, int axis, bool descending, vm_tensor **indices) {
  if (indices) *indices = NULL;
  if (null_arg(a, 0) || !sort_axis(a, &axis)) return NULL;
  return sorted_prefix(a, axis, descending, a->shape[axis], indices);
}

/* the k largest (or smallest) along axis, in sorted order */
vm_tensor *fe_topk(vm_tensor *a, int64_t k, int axis, bool largest, vm_tensor **indices) {
  if (indices) *indices = NULL;
  if (null_arg(a, 0) || !sort_axis(a, &axis)) return NULL;
  if (k < 0 || k > a->shape[axis]) {
    vm_error(KILN_ERR_ARG, "k %lld is out of range [0, %lld] for axis %d", (long long)k,
             (long long)a->shape[axis], axis);
    return NULL;
  }
  return sorted_prefix(a, axis, largest, k, indices);
}

/* --- window ops: conv2d and pooling ------------------------------------ */

typedef struct {
  int64_t n, c, h, w; /* input */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t oh, ow; /* output */
  int64_t count;  /* c * kh * kw * oh * ow: the window index's length */
} window_geom;

static bool pair_arg(const int *v, int fallback, int64_t out[2]) {
  out[0] = v ? v[0] : fallback;
  out[1] = v ? v[1] : fallback;
  return true;
}

/* output extents (PyTorch's floor rule); error when they would be < 1 */
static bool window_output(window_geom *g) {
  int64_t eh = g->dh * (g->kh - 1) + 1, ew = g->dw * (g->kw - 1) + 1;
  g->oh = vm_window_out(g->h, g->kh, g->sh, g->ph, g->dh);
  g->ow = vm_window_out(g->w, g->kw, g->sw, g->pw, g->dw);
  if (g->oh < 1 || g->ow < 1) {
    vm_error(KILN_ERR_SHAPE,
             "the input of %lldx%lld (padded to %lldx%lld) is smaller than the "
             "%lldx%lld window",
             (long long)g->h, (long long)g->w, (long long)(g->h + 2 * g->ph),
             (long long)(g->w + 2 * g->pw), (long long)eh, (long long)ew);
    return false;
  }
  /* every product the window ops form divides count: check it once */
  int64_t count;
  if (__builtin_mul_overflow(g->c, g->kh, &count) || __builtin_mul_overflow(count, g->kw, &count) ||
      __builtin_mul_overflow(count, g->oh, &count) ||
      __builtin_mul_overflow(count, g->ow, &count) ||
      __builtin_mul_overflow(count, g->n ? g->n : 1, &g->count) || g->count > (INT64_C(1) << 40)) {
    vm_error(KILN_ERR_SHAPE,
             "the windows of %lld x %lld x %lld x %lld x %lld x %lld elements are "
             "too many",
             (long long)g->n, (long long)g->c, (long long)g->kh, (long long)g->kw, (long long)g->oh,
             (long long)g->ow);
    return false;
  }
  g->count = count;
  return true;
}

static bool window_args(window_geom *g, const char *kind) {
  if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0 || g->dh < 1 ||
      g->dw < 1 || g->kh > (1 << 20) || g->kw > (1 << 20) || g->sh > (1 << 20) ||
      g->sw > (1 << 20) || g->ph > (1 << 20) || g->pw > (1 << 20) || g->dh > (1 << 20) ||
      g->dw > (1 << 20)) {
    vm_error(KILN_ERR_ARG,
             "bad %s arguments: kernel [%lld,%lld], stride [%lld,%lld], padding "
             "[%lld,%lld], dilation [%lld,%lld] (kernel, stride, dilation in [1, 2^20], "
             "padding in [0, 2^20])",
             kind, (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw,
             (long long)g->ph, (long long)g->pw, (long long)g->dh, (long long)g->dw);
    return false;
  }
  return window_output(g);
}

/* The flat positions each output reads, in x's [C*H*W] row (plus one pad
   element at C*H*W for positions in the padding): window-major order
   (c, i, j, oh, ow) for convolution, output-major (c, oh, ow, i, j) for
   pooling.  Built from shapes alone: the same call shapes give the same
   index, and the trace key sees only its shape. */
static vm_tensor *window_index(const window_geom *g, bool output_major, kiln_device d,
                               int64_t *count_out) {
  int64_t count = g->count; /* overflow-checked by window_output */
  vm_tensor *t = vm_tensor_new(KILN_I64, 1, &count);
  if (!t) return NULL;
  int64_t *p = vm_data(t), pad = g->c * g->h * g->w, k = 0;
  for (int64_t c = 0; c < g->c; c++) {
    int64_t base = c * g->h * g->w;
    if (output_major) {
      for (int64_t oh = 0; oh < g->oh; oh++)
        for (int64_t ow = 0; ow < g->ow; ow++)
          for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
              int64_t ih = oh * g->sh - g->ph + i * g->dh, iw = ow * g->sw - g->pw + j * g->dw;
              bool in = ih >= 0 && ih < g->h && iw >= 0 && iw < g->w;
              p[k++] = in ? base + ih * g->w + iw : pad;
            }
    } else {
      for (int64_t i = 0; i < g->kh; i++)
        for (int64_t j = 0; j < g->kw; j++)
          for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++) {
              int64_t ih = oh * g->sh - g->ph + i * g->dh, iw = ow * g->sw - g->pw + j * g->dw;
              bool in = ih >= 0 && ih < g->h && iw >= 0 && iw < g->w;
              p[k++] = in ? base + ih * g->w + iw : pad;
            }
    }
  }
  *count_out = count;
  return fe_handle_from_host(t, d);
}

/* x [N,C,H,W] -> its windows [N, count] (a recorded index_select over
   each image's flat row, padded with one element of value pad_value) */
static vm_tensor *gather_windows(fe_scope *s, vm_tensor *x, const window_geom *g, bool output_major,
                                 double pad_value) {
  int64_t count;
  vm_tensor *idx = keep(s, window_index(g, output_major, (kiln_device)x->device, &count));
  if (!idx) return NULL;
  vm_tensor *flat = keep(s, fe_reshape(x, 2, (int64_t[]){g->n, g->c * g->h * g->w}));
  if (g->ph || g->pw) {
    vm_attr attr = {.dtype = x->dtype,
                    .ndim = 2,
                    .shape = {g->n, 1},
                    .scalar = {pad_value},
                    .device = x->device};
    vm_tensor *parts[2] = {flat, keep(s, fe_op(VM_OP_full, 0, NULL, &attr))};
    flat = keep(s, flat && parts[1] ? fe_concat(2, parts, 1) : NULL);
  }
  return keep(s, fe_index_op(VM_OP_index_select, flat, 1, idx, NULL));
}

static bool check_rank(const vm_tensor *t, int ndim, const char *what, const char *layout) {
  if (t->ndim == ndim) return true;
  char buf[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "%s must be %d-d %s, got shape %s", what, ndim, layout,
           vm_shape_str(buf, t->ndim, t->shape));
  return false;
}

/* On the CPU a convolution is its own primitive (vm/kern_conv.c: im2col
   tile by tile in cache, not the batch's column matrix through memory);
   the key keeps its geometry in bytes (attr.perm), so larger strides,
   paddings or dilations take the composed path below */
static bool conv_primitive_fits(const vm_tensor *x, const vm_tensor *w, const window_geom *g) {
  if (x->device != KILN_CPU || w->device != KILN_CPU) return false;
  if (!vm_dtype_is_float(x->dtype) || !vm_dtype_is_float(w->dtype)) return false;
  int64_t v[] = {g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
  for (int i = 0; i < 6; i++)
    if (v[i] > 255) return false;
  return true;
}

/* Convolution as im2col + GEMM (other devices): the windows of every image are gathered by
   one index_select into [N, C*kh*kw, OH*OW] (groups: [N, G, C/G*kh*kw,
   OH*OW]) and multiplied by the weight viewed as [Cout, C*kh*kw] — the
   GEMM goes to BLAS.  The gradients are the primitives': matmul's VJP for
   the weight (and the columns), index_select's scatter-add VJP for the
   input (col2im), expand's sum for the bias. */
vm_tensor *fe_conv2d(vm_tensor *x, vm_tensor *w, vm_tensor *b, const int stride[2],
                     const int padding[2], const int dilation[2], int groups) {
  if (null_arg(x, 0) || null_arg(w, 1)) return NULL;
  if (!check_rank(x, 4, "input", "[N,C,H,W]") ||
      !check_rank(w, 4, "weight", "[Cout,Cin/groups,kh,kw]"))
    return NULL;
  if (!require_float(x, "input") || !require_float(w, "weight") || (b && !require_float(b, "bias")))
    return NULL;
  int64_t cout = w->shape[0], cin = x->shape[1];
  if (groups < 1 || cin % groups || cout % groups) {
    vm_error(KILN_ERR_ARG,
             "groups %d must be >= 1 and divide the input channels %lld and the "
             "output channels %lld",
             groups, (long long)cin, (long long)cout);
    return NULL;
  }
  if (w->shape[1] != cin / groups) {
    char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE,
             "weight %s needs %lld input channels per group for input %s and "
             "groups %d",
             vm_shape_str(b1, w->ndim, w->shape), (long long)(cin / groups),
             vm_shape_str(b2, x->ndim, x->shape), groups);
    return NULL;
  }
  if (b && (b->ndim != 1 || b->shape[0] != cout)) {
    char buf[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "bias has shape %s, expected [%lld]",
             vm_shape_str(buf, b->ndim, b->shape), (long long)cout);
    return NULL;
  }
  window_geom g = {.n = x->shape[0],
                   .c = cin,
                   .h = x->shape[2],
                   .w = x->shape[3],
                   .kh = w->shape[2],
                   .kw = w->shape[3]};
  int64_t st[2], pd[2], dl[2];
  pair_arg(stride, 1, st);
  pair_arg(padding, 0, pd);
  pair_arg(dilation, 1, dl);
  g.sh = st[0], g.sw = st[1], g.ph = pd[0], g.pw = pd[1], g.dh = dl[0], g.dw = dl[1];
  if (!window_args(&g, "convolution")) return NULL;
  int64_t k = cin / groups * g.kh * g.kw, l = g.oh * g.ow, G = groups;
  fe_scope s = {0};
  vm_tensor *cols = NULL, *out;
  if (conv_primitive_fits(x, w, &g)) {
    vm_attr attr = {.axis = groups,
                    .perm = {(int)g.sh, (int)g.sw, (int)g.ph, (int)g.pw, (int)g.dh, (int)g.dw}};
    vm_tensor *in[2] = {x, w};
    out = keep(&s, fe_op(VM_OP_conv2d, 2, in, &attr));
  } else if (!(cols = gather_windows(&s, x, &g, false, 0.0))) {
    out = NULL;
  } else if (groups == 1) {
    cols = keep(&s, fe_reshape(cols, 3, (int64_t[]){g.n, k, l}));
    vm_tensor *wm = keep(&s, fe_reshape(w, 2, (int64_t[]){cout, k}));
    out = keep(&s, cols && wm ? fe_binary(VM_OP_matmul, wm, cols) : NULL);
  } else {
    cols = keep(&s, fe_reshape(cols, 4, (int64_t[]){g.n, G, k, l}));
    vm_tensor *wm = keep(&s, fe_reshape(w, 3, (int64_t[]){G, cout / G, k}));
    out = keep(&s, cols && wm ? fe_binary(VM_OP_matmul, wm, cols) : NULL);
  }
  out = keep(&s, fe_reshape(out, 4, (int64_t[]){g.n, cout, g.oh, g.ow}));
  if (b && out)
    out = keep(&s, fe_binary(VM_OP_add, out, keep(&s, fe_reshape(b, 3, (int64_t[]){cout, 1, 1}))));
  return finish(&s, out);
}

/* Pooling gathers each output's window into a last axis [N,C,OH,OW,kh*kw]:
   max takes the first maximum by argmax + gather (so the gradient goes to
   that one position, as PyTorch's, and a NaN wins), avg the mean over the
   window with the padding counted (PyTorch's count_include_pad default).
   stride NULL = the kernel, padding NULL = 0. */
vm_tensor *fe_pool2d(vm_tensor *x, bool max, const int kernel[2], const int stride[2],
                     const int padding[2]) {
  if (null_arg(x, 0)) return NULL;
  if (!check_rank(x, 4, "input", "[N,C,H,W]") || !require_float(x, "input")) return NULL;
  if (!kernel) {
    vm_error(KILN_ERR_ARG, "kernel is NULL");
    return NULL;
  }
  window_geom g = {.n = x->shape[0],
                   .c = x->shape[1],
                   .h = x->shape[2],
                   .w = x->shape[3],
                   .kh = kernel[0],
                   .kw = kernel[1],
                   .dh = 1,
                   .dw = 1};
  int64_t st[2], pd[2];
  pair_arg(stride, 0, st);
  pair_arg(padding, 0, pd);
  g.sh = stride ? st[0] : g.kh, g.sw = stride ? st[1] : g.kw, g.ph = pd[0], g.pw = pd[1];
  if (!window_args(&g, "pooling")) return NULL;
  if (2 * g.ph > g.kh || 2 * g.pw > g.kw) {
    vm_error(KILN_ERR_ARG, "padding [%lld,%lld] must be at most half the kernel [%lld,%lld]",
             (long long)g.ph, (long long)g.pw, (long long)g.kh, (long long)g.kw);
    return NULL;
  }
  int64_t kk = g.kh * g.kw;
  fe_scope s = {0};
  vm_tensor *win = gather_windows(&s, x, &g, true, max ? -INFINITY : 0.0);
  win = keep(&s, fe_reshape(win, 5, (int64_t[]){g.n, g.c, g.oh, g.ow, kk}));
  vm_tensor *r;
  int last = 4;
  if (max) {
    vm_tensor *at = keep(&s, fe_reduce(VM_OP_argmax, win, 1, &last, true));
    r = keep(&s, at ? fe_index_op(VM_OP_gather, win, 4, at, NULL) : NULL);
    r = keep(&s, fe_reshape(r, 4, (int64_t[]){g.n, g.c, g.oh, g.ow}));
  } else {
    r = keep(&s, fe_reduce(VM_OP_sum, win, 1, &last, false));
    r = keep(&s, r ? fe_binary_scalar(VM_OP_div, r, (double)kk, false) : NULL);
  }
  return finish(&s, r);
}

/* --- normalization, dropout ------------------------------------------- */

static bool check_channel_vec(const vm_tensor *p, int64_t c, const char *what) {
  if (!p || (p->ndim == 1 && p->shape[0] == c)) return true;
  char buf[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "%s has shape %s, expected [%lld]", what,
           vm_shape_str(buf, p->ndim, p->shape), (long long)c);
  return false;
}

/* [C] -> [1, C, 1, ...] for x of ndim dims */
static vm_tensor *per_channel(fe_scope *s, vm_tensor *v, int ndim, int64_t c) {
  int64_t shape[KILN_MAX_DIMS];
  for (int d = 0; d < ndim; d++) shape[d] = d == 1 ? c : 1;
  return keep(s, fe_reshape(v, ndim, shape));
}

/* running = running * (1 - m) + batch * m, computed without tracking and
   queued as a store (the handle names the new value) */
static int update_running(vm_tensor *running, vm_tensor *batch, double momentum) {
  fe_scope s = {0};
  vm_thread()->no_grad++;
  vm_tensor *old = keep(&s, fe_binary_host_scalar(VM_OP_mul, running, 1.0 - momentum, false));
  vm_tensor *add = keep(&s, fe_binary_host_scalar(VM_OP_mul, batch, momentum, false));
  vm_tensor *v = keep(&s, old && add ? fe_binary(VM_OP_add, old, add) : NULL);
  vm_thread()->no_grad--;
  int rc = v ? fe_assign(running, v) : vm_thread()->status;
  finish(&s, NULL);
  return rc;
}

vm_tensor *fe_batch_norm(vm_tensor *x, vm_tensor *running_mean, vm_tensor *running_var,
                         vm_tensor *w, vm_tensor *b, bool training, double momentum, double eps) {
  if (null_arg(x, 0)) return NULL;
  if (x->ndim < 2) {
    char buf[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "input must have at least 2 dimensions [N,C,...], got shape %s",
             vm_shape_str(buf, x->ndim, x->shape));
    return NULL;
  }
  if (!require_float(x, "input")) return NULL;
  if (!isfinite(momentum) || !(eps >= 0) || !isfinite(eps)) {
    vm_error(KILN_ERR_ARG, "bad momentum %g or eps %g", momentum, eps);
    return NULL;
  }
  int64_t c = x->shape[1];
  if (!check_channel_vec(running_mean, c, "running_mean") ||
      !check_channel_vec(running_var, c, "running_var") || !check_channel_vec(w, c, "weight") ||
      !check_channel_vec(b, c, "bias"))
    return NULL;
  if ((running_mean == NULL) != (running_var == NULL) || (!training && !running_mean)) {
    vm_error(KILN_ERR_ARG,
             "running_mean and running_var must both be given (both are needed in "
             "eval mode)");
    return NULL;
  }
  int axes[KILN_MAX_DIMS], na = 0;
  for (int d = 0; d < x->ndim; d++)
    if (d != 1) axes[na++] = d;
  int64_t count = c ? x->numel / c : 0;
  if (training && count < 2) {
    char buf[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "training needs more than 1 value per channel, got input shape %s",
             vm_shape_str(buf, x->ndim, x->shape));
    return NULL;
  }
  fe_scope s = {0};
  vm_tensor *mean, *var;
  if (training) {
    mean = keep(&s, fe_mean(x, na, axes, true));
    vm_tensor *xc = keep(&s, fe_binary(VM_OP_sub, x, mean));
    var = keep(&s, fe_mean(keep(&s, fe_binary(VM_OP_mul, xc, xc)), na, axes, true)); /* biased */
    if (running_mean && mean && var) {
      vm_tensor *m1 = keep(&s, fe_reshape(mean, 1, &c));
      vm_tensor *v1 = keep(&s, fe_reshape(var, 1, &c));
      vm_thread()->no_grad++;
      vm_tensor *unbiased =
          keep(&s, v1 ? fe_binary_scalar(VM_OP_mul, v1, (double)count / (double)(count - 1), false)
                      : NULL);
      vm_thread()->no_grad--;
      if (!m1 || !unbiased || update_running(running_mean, m1, momentum) ||
          update_running(running_var, unbiased, momentum))
        return finish(&s, NULL);
    }
  } else {
    mean = per_channel(&s, running_mean, x->ndim, c);
    var = per_channel(&s, running_var, x->ndim, c);
  }
  vm_tensor *inv = keep(
      &s, var ? fe_unary(VM_OP_rsqrt, keep(&s, fe_binary_host_scalar(VM_OP_add, var, eps, false)))
              : NULL);
  vm_tensor *y = keep(
      &s, mean && inv ? fe_binary(VM_OP_mul, keep(&s, fe_binary(VM_OP_sub, x, mean)), inv) : NULL);
  if (w && y) y = keep(&s, fe_binary(VM_OP_mul, y, per_channel(&s, w, x->ndim, c)));
  if (b && y) y = keep(&s, fe_binary(VM_OP_add, y, per_channel(&s, b, x->ndim, c)));
  return finish(&s, y);
}

/* where(u >= p, x / (1 - p), 0) with u ~ U[0,1) drawn from the process
   Philox stream in x's dtype: the mask replays with its counter, so a
   recomputed value is the same value, and kiln_manual_seed reproduces it.
   p and 1/(1-p) are runtime parameters (one trace key for every p). */
vm_tensor *fe_dropout(vm_tensor *x, double p, bool training) {
  if (null_arg(x, 0)) return NULL;
  if (!(p >= 0 && p < 1)) {
    vm_error(KILN_ERR_ARG, "p %g is outside [0, 1)", p);
    return NULL;
  }
  if (!require_float(x, "input")) return NULL;
  if (!training || p == 0) return tr_handle_of_node(x->node); /* x's value, a handle of its own */
  vm_attr attr = {.dtype = x->dtype, .ndim = x->ndim, .device = x->device};
  memcpy(attr.shape, x->shape, sizeof attr.shape);
  vm_rng_reserve(vm_rng_blocks(x->numel, x->dtype), &attr.seed, &attr.counter);
  fe_scope s = {0};
  vm_tensor *u = keep(&s, fe_op(VM_OP_rand, 0, NULL, &attr));
  vm_tensor *kept = keep(&s, u ? fe_binary_host_scalar(VM_OP_ge, u, p, false) : NULL);
  vm_tensor *scaled = keep(&s, fe_binary_host_scalar(VM_OP_mul, x, 1.0 / (1.0 - p), false));
  vm_tensor *zero = keep(&s, fe_weak_scalar(0, false));
  vm_tensor *in[3] = {kept, scaled, zero};
  return finish(&s, keep(&s, kept && scaled && zero ? fe_op(VM_OP_where, 3, in, NULL) : NULL));
}

/* --- embeddings, one_hot, losses ---------------------------------------- */

/* weight [V, D...] rows picked by idx of any shape: idx.shape + [D...].
   One index_select of the flattened index; its VJP scatter-adds rows. */
vm_tensor *fe_embedding(vm_tensor *weight, vm_tensor *idx) {
  if (null_arg(weight, 0) || null_arg(idx, 1)) return NULL;
  if (!require_index(idx, "idx")) return NULL;
  if (weight->ndim < 1 || idx->ndim + weight->ndim - 1 > KILN_MAX_DIMS) {
    char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE,
             "weight %s and idx %s: the weight needs >= 1 dimension and the "
             "result at most %d",
             vm_shape_str(b1, weight->ndim, weight->shape), vm_shape_str(b2, idx->ndim, idx->shape),
             KILN_MAX_DIMS);
    return NULL;
  }
  if (!check_index_values(idx, weight->shape[0], "index")) return NULL;
  int64_t shape[KILN_MAX_DIMS], n = idx->numel;
  int nd = 0;
  for (int d = 0; d < idx->ndim; d++) shape[nd++] = idx->shape[d];
  for (int d = 1; d < weight->ndim; d++) shape[nd++] = weight->shape[d];
  fe_scope s = {0};
  vm_tensor *flat = keep(&s, fe_reshape(idx, 1, &n));
  vm_tensor *rows = keep(&s, flat ? fe_index_op(VM_OP_index_select, weight, 0, flat, NULL) : NULL);
  return finish(&s, keep(&s, rows ? fe_reshape(rows, nd, shape) : NULL));
}

/* idx.shape + [num_classes]: eq(idx[..., None], arange(num_classes)).  The
   values are checked at the call when known, else at the flush by an
   index_select of the classes (which also names the bad value). */
vm_tensor *fe_one_hot(vm_tensor *idx, int64_t num_classes, kiln_dtype dt) {
  if (null_arg(idx, 0)) return NULL;
  if (!require_index(idx, "idx")) return NULL;
  if (!vm_dtype_valid((int)dt)) {
    vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)dt);
    return NULL;
  }
  if (num_classes < 1 || idx->ndim == KILN_MAX_DIMS) {
    vm_error(KILN_ERR_ARG, "num_classes %lld must be >= 1 (and idx below %d dimensions)",
             (long long)num_classes, KILN_MAX_DIMS);
    return NULL;
  }
  if (!check_index_values(idx, num_classes, "class index")) return NULL;
  int64_t n = idx->numel;
  fe_scope s = {0};
  vm_tensor *classes = keep(&s, fe_arange_i64(0, 1, num_classes, (kiln_device)idx->device));
  vm_tensor *flat = keep(&s, fe_reshape(idx, 1, &n));
  vm_tensor *checked =
      keep(&s, flat ? fe_index_op(VM_OP_index_select, classes, 0, flat, NULL) : NULL);
  vm_tensor *col = keep(&s, checked ? fe_reshape(checked, 2, (int64_t[]){n, 1}) : NULL);
  vm_tensor *hot = keep(&s, col ? fe_binary(VM_OP_eq, col, classes) : NULL);
  int64_t shape[KILN_MAX_DIMS];
  for (int d = 0; d < idx->ndim; d++) shape[d] = idx->shape[d];
  shape[idx->ndim] = num_classes;
  hot = keep(&s, hot ? fe_reshape(hot, idx->ndim + 1, shape) : NULL);
  return finish(&s, keep(&s, hot ? fe_cast(hot, dt) : NULL));
}

/* -mean(log_probs[i, target[i]]) for log_probs [N,C] and target [N] */
vm_tensor *fe_nll_loss(vm_tensor *log_probs, vm_tensor *target) {
  if (null_arg(log_probs, 0) || null_arg(target, 1)) return NULL;
  if (!require_float(log_probs, "log_probs") || !require_index(target, "target")) return NULL;
  if (log_probs->ndim != 2 || target->ndim != 1 || target->shape[0] != log_probs->shape[0]) {
    char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "log_probs %s and target %s: expected [N,C] and [N]",
             vm_shape_str(b1, log_probs->ndim, log_probs->shape),
             vm_shape_str(b2, target->ndim, target->shape));
    return NULL;
  }
  if (!check_index_values(target, log_probs->shape[1], "label")) return NULL;
  fe_scope s = {0};
  vm_tensor *col = keep(&s, fe_unsqueeze(target, 1));
  vm_tensor *picked = keep(&s, col ? fe_index_op(VM_OP_gather, log_probs, 1, col, NULL) : NULL);
  vm_tensor *mean = keep(&s, picked ? fe_mean(picked, 0, NULL, false) : NULL);
  return finish(&s, keep(&s, mean ? fe_unary(VM_OP_neg, mean) : NULL));
}

/* mean(max(x, 0) - x*t + log1p(exp(-|x|))): never overflows; maximum
   splits its tie at x = 0, so the gradient there is sigmoid(0) - t, as
   everywhere else (PyTorch's sigmoid(x) - t) */
vm_tensor *fe_bce_with_logits(vm_tensor *logits, vm_tensor *target) {
  if (null_arg(logits, 0) || null_arg(target, 1)) return NULL;
  if (!require_float(logits, "logits") || !require_float(target, "target")) return NULL;
  if (!same_shapes(logits, target, "logits", "target")) return NULL;
  fe_scope s = {0};
  vm_tensor *zero = keep(&s, fe_weak_scalar(0, false));
  vm_tensor *pos = keep(&s, zero ? fe_binary(VM_OP_maximum, logits, zero) : NULL);
  vm_tensor *xt = keep(&s, fe_binary(VM_OP_mul, logits, target));
  vm_tensor *nabs = keep(&s, fe_unary(VM_OP_neg, keep(&s, fe_unary(VM_OP_abs, logits))));
  vm_tensor *soft = keep(&s, fe_unary(VM_OP_log1p, keep(&s, fe_unary(VM_OP_exp, nabs))));
  vm_tensor *l = keep(&s, fe_binary(VM_OP_add, keep(&s, fe_binary(VM_OP_sub, pos, xt)), soft));
  return finish(&s, keep(&s, l ? fe_mean(l, 0, NULL, false) : NULL));
}
