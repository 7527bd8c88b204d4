/* vjp.c — one vector-Jacobian rule per primitive of vm/ops.def, keyed by
 * the op enum (DESIGN §2, §7).  A rule takes the gradient g of a node's
 * output and returns the gradient of input k in that input's shape, built
 * from ordinary ops — so gradients are pending nodes like any other, fused
 * and cached with the forward pass.  NULL with no error: no gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../front/composite.h"
#include "../front/scope.h"
#include "../trace/record.h"
#include "../vm/dist.h"
#include "../vm/state.h"
#include "ad.h"

#define U(op, a) keep(s, fe_unary(VM_OP_##op, (a)))
#define B(op, a, b) keep(s, fe_binary(VM_OP_##op, (a), (b)))
#define BS(op, a, v) keep(s, fe_binary_scalar(VM_OP_##op, (a), (v), false))

/* b - 1, for pow's gradient.  When b is a host number (x ** 2's
   exponent: a weak scalar) so is b - 1, made in b's dtype: it goes to any
   device and never widens x (sub of two weak scalars would be an ordinary
   0-d f64 value on the host, which a CUDA x cannot read and which turns an
   f32 gradient into f64 work) */
static vm_tensor *minus_one(fe_scope *s, vm_tensor *b) {
  double v;
  bool host;
  if (tr_weak_scalar(b, &v, &host)) return keep(s, fe_weak_scalar_of(v - 1, b->dtype, host));
  return BS(sub, b, 1.0);
}

/* g summed over the dims it was broadcast along, in x's shape */
vm_tensor *ad_sum_to(vm_tensor *g, const vm_tensor *x) {
  if (!g) return NULL;
  if (g->ndim == x->ndim && !memcmp(g->shape, x->shape, (size_t)x->ndim * sizeof(int64_t)))
    return vm_retain(g);
  int axes[KILN_MAX_DIMS], n = 0, lead = g->ndim - x->ndim;
  for (int d = 0; d < g->ndim; d++)
    if (d < lead || (x->shape[d - lead] == 1 && g->shape[d] != 1)) axes[n++] = d;
  vm_tensor *r = n ? fe_reduce(VM_OP_sum, g, n, axes, true) : vm_retain(g);
  vm_tensor *out = fe_reshape(r, x->ndim, x->shape);
  vm_release(r);
  return out;
}

/* g (of a reduction's result) reshaped to keepdim form and expanded to x */
static vm_tensor *expand_back(fe_scope *s, const ad_ctx *c, vm_tensor *g) {
  const vm_tensor *x = c->x[0];
  int64_t keep_shape[KILN_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++)
    keep_shape[d] = (c->attr->axes_mask & (1u << d)) ? 1 : x->shape[d];
  vm_tensor *gk = keep(s, fe_reshape(g, x->ndim, keep_shape));
  return keep(s, fe_expand(gk, x->ndim, x->shape));
}

/* 1 - a, one op: a weak 1 minus a (made in a's dtype, as a scalar operand
   is).  The same bits as -a + 1 (negation is exact), one pass fewer: the
   backward of a sigmoid or a tanh is three ops, not four (an LSTM's
   backward step did 20 of its 28 elementwise passes there) */
static vm_tensor *one_minus(fe_scope *s, vm_tensor *a) {
  kiln_dtype dt = vm_dtype_is_float(a->dtype) && !a->weak ? a->dtype : KILN_F64;
  return B(sub, keep(s, fe_weak_scalar_of(1, dt, false)), a);
}

static vm_tensor *rule_unary(fe_scope *s, const ad_ctx *c, int k) {
  (void)k;
  vm_tensor *x = c->x[0], *y = c->y, *g = c->g;
  switch (c->op) {
    case VM_OP_copy:
      return g;
    case VM_OP_cast:
      return vm_dtype_is_float(x->dtype) ? keep(s, fe_cast(g, x->dtype)) : NULL;
    case VM_OP_neg:
      return U(neg, g);
    case VM_OP_abs:
      return B(mul, g, U(sign, x));
    case VM_OP_exp:
      return B(mul, g, y);
    case VM_OP_log:
      return B(div, g, x);
    case VM_OP_sqrt:
      return B(div, BS(mul, g, 0.5), y);
    case VM_OP_rsqrt:
      return B(mul, g, BS(mul, B(mul, B(mul, y, y), y), -0.5));
    case VM_OP_sin:
      return B(mul, g, U(cos, x));
    case VM_OP_cos:
      return U(neg, B(mul, g, U(sin, x)));
    case VM_OP_tanh:
      return B(mul, g, one_minus(s, B(mul, y, y)));
    case VM_OP_sigmoid:
      return B(mul, g, B(mul, y, one_minus(s, y)));
    case VM_OP_erf: /* 2/sqrt(pi) exp(-x^2) */
      return B(mul, g, BS(mul, U(exp, U(neg, B(mul, x, x))), 1.1283791670955126));
    case VM_OP_log1p:
      return B(div, g, BS(add, x, 1.0));
    case VM_OP_expm1:
      return B(mul, g, BS(add, y, 1.0));
    default:
      return NULL; /* sign, floor, ceil, round, logical_not: zero almost everywhere */
  }
}

/* 1 where pick(a, b), 0.5 on ties, 0 elsewhere (maximum/minimum split ties) */
static vm_tensor *choice_mask(fe_scope *s, vm_opcode pick, vm_tensor *a, vm_tensor *b,
                              kiln_dtype dt) {
  vm_tensor *win = keep(s, fe_cast(keep(s, fe_binary(pick, a, b)), dt));
  vm_tensor *tie = keep(s, fe_cast(B(eq, a, b), dt));
  return B(add, win, BS(mul, tie, 0.5));
}

static vm_tensor *rule_binary(fe_scope *s, const ad_ctx *c, int k) {
  vm_tensor *a = c->x[0], *b = c->x[1], *y = c->y, *g = c->g;
  switch (c->op) {
    case VM_OP_add:
      return g;
    case VM_OP_sub:
      return k == 0 ? g : U(neg, g);
    case VM_OP_mul:
      return B(mul, g, k == 0 ? b : a);
    case VM_OP_div:
      return k == 0 ? B(div, g, b) : U(neg, B(div, B(mul, g, y), b));
    case VM_OP_pow:
      if (k == 0) return B(mul, g, B(mul, b, B(pow, a, minus_one(s, b))));
      return B(mul, g, B(mul, y, U(log, a)));
    case VM_OP_maximum:
      return B(mul, g, choice_mask(s, VM_OP_gt, k == 0 ? a : b, k == 0 ? b : a, g->dtype));
    case VM_OP_minimum:
      return B(mul, g, choice_mask(s, VM_OP_lt, k == 0 ? a : b, k == 0 ? b : a, g->dtype));
    default:
      return NULL; /* comparisons and logical ops */
  }
}

static vm_tensor *where3(fe_scope *s, vm_tensor *c, vm_tensor *a, vm_tensor *b);

static vm_tensor *rule_where(fe_scope *s, const ad_ctx *c, int k) {
  if (k == 0) return NULL;
  vm_tensor *zero = keep(s, fe_weak_scalar(0, false));
  return where3(s, c->x[0], k == 1 ? c->g : zero, k == 1 ? zero : c->g);
}

static vm_tensor *where3(fe_scope *s, vm_tensor *c, vm_tensor *a, vm_tensor *b) {
  vm_tensor *in[3] = {c, a, b};
  return c && a && b ? keep(s, fe_op(VM_OP_where, 3, in, NULL)) : NULL;
}

/* sum over the reduced axes, keepdim, expanded back to x's shape */
static vm_tensor *reduce_back(fe_scope *s, const ad_ctx *c, vm_opcode op, vm_tensor *v) {
  const vm_tensor *x = c->x[0];
  int axes[KILN_MAX_DIMS], n = 0;
  for (int d = 0; d < x->ndim; d++)
    if (c->attr->axes_mask & (1u << d)) axes[n++] = d;
  vm_tensor *r = keep(s, n ? fe_reduce(op, v, n, axes, true) : vm_retain(v));
  return r ? keep(s, fe_expand(r, x->ndim, x->shape)) : NULL;
}

/* d prod / d x_i = product of the others: y / x_i without zeros; with one
   zero in a group only that position gets the others' product; with more,
   nothing */
static vm_tensor *prod_grad(fe_scope *s, const ad_ctx *c, vm_tensor *g) {
  vm_tensor *x = c->x[0];
  vm_tensor *zero = keep(s, fe_weak_scalar(0, false)), *one = keep(s, fe_weak_scalar(1, false));
  vm_tensor *is_zero = BS(eq, x, 0.0);
  vm_tensor *safe = where3(s, is_zero, one, x);
  vm_tensor *others = reduce_back(s, c, VM_OP_prod, safe); /* product of the nonzeros */
  vm_tensor *zeros = reduce_back(s, c, VM_OP_sum, keep(s, fe_cast(is_zero, x->dtype)));
  vm_tensor *no_zero = B(div, others, safe);
  vm_tensor *lone = where3(s, B(logical_and, BS(eq, zeros, 1.0), is_zero), others, zero);
  return B(mul, g, where3(s, BS(eq, zeros, 0.0), no_zero, lone));
}

static vm_tensor *rule_reduce(fe_scope *s, const ad_ctx *c, int k) {
  (void)k;
  vm_tensor *x = c->x[0];
  vm_tensor *g = expand_back(s, c, c->g);
  switch (c->op) {
    case VM_OP_sum:
      return g;
    case VM_OP_prod:
      return prod_grad(s, c, g);
    case VM_OP_max:
    case VM_OP_min: { /* split evenly between the positions holding the extreme */
      vm_tensor *hit = keep(s, fe_cast(B(eq, x, expand_back(s, c, c->y)), x->dtype));
      return B(div, B(mul, g, hit), reduce_back(s, c, VM_OP_sum, hit));
    }
    default:
      return NULL; /* argmax, argmin */
  }
}

/* x (batch..., M, K) as one (batch*M, K) matrix */
static vm_tensor *fold_batch(fe_scope *s, vm_tensor *x) {
  int64_t rows = 1;
  for (int d = 0; d < x->ndim - 1; d++) rows *= x->shape[d];
  return keep(s, fe_reshape(x, 2, (int64_t[]){rows, x->shape[x->ndim - 1]}));
}

static vm_tensor *rule_matmul(fe_scope *s, const ad_ctx *c, int k) {
  vm_tensor *a = c->x[0], *b = c->x[1];
  /* a batched input times a matrix (a linear layer on [B, S, D]): the
     matrix's gradient is one GEMM over the folded batch, a^T g with the
     batch sum done by the GEMM's inner dimension, not a GEMM per batch and
     a reduction */
  if (k == 1 && b->ndim == 2 && a->ndim > 2)
    return B(matmul, keep(s, fe_transpose(fold_batch(s, a), 0, 1)), fold_batch(s, c->g));
  if (k == 0 && b->ndim == 2 && a->ndim > 2) /* and a's gradient one GEMM too */
    return keep(s, fe_reshape(B(matmul, fold_batch(s, c->g), keep(s, fe_transpose(b, 0, 1))),
                              a->ndim, a->shape));
  vm_tensor *a2 = a->ndim == 1 ? keep(s, fe_unsqueeze(a, 0)) : a;
  vm_tensor *b2 = b->ndim == 1 ? keep(s, fe_unsqueeze(b, 1)) : b;
  if (!a2 || !b2) return NULL;
  /* g in the 2-d-operand form: batch + [rows of a2, cols of b2] */
  int64_t gshape[KILN_MAX_DIMS];
  int gnd = c->g->ndim - (a->ndim > 1) - (b->ndim > 1);
  memcpy(gshape, c->g->shape, (size_t)gnd * sizeof(int64_t));
  gshape[gnd] = a2->shape[a2->ndim - 2];
  gshape[gnd + 1] = b2->shape[b2->ndim - 1];
  vm_tensor *g2 = keep(s, fe_reshape(c->g, gnd + 2, gshape));
  vm_tensor *full_grad = k == 0 ? B(matmul, g2, keep(s, fe_transpose(b2, -1, -2)))
                                : B(matmul, keep(s, fe_transpose(a2, -1, -2)), g2);
  vm_tensor *x2 = k == 0 ? a2 : b2, *x = k == 0 ? a : b;
  vm_tensor *summed = keep(s, ad_sum_to(full_grad, x2));
  return keep(s, fe_reshape(summed, x->ndim, x->shape));
}

/* Convolutions: y = conv2d(x, w) is linear in x and in w, and its two
   adjoints are each other's (<h, conv2d_input(dy, w)> = <conv2d(h, w), dy>
   = <conv2d_weight(h, dy), w>), so every rule is one of the three ops with
   the node's geometry and the shape of the input it differentiates. */
static vm_tensor *conv_op(fe_scope *s, const ad_ctx *c, vm_opcode op, vm_tensor *a, vm_tensor *b,
                          const vm_tensor *shape_of) {
  vm_attr attr = *c->attr;
  attr.ndim = shape_of->ndim;
  memcpy(attr.shape, shape_of->shape, sizeof attr.shape);
  attr.api = NULL;
  vm_tensor *in[2] = {a, b};
  return a && b ? keep(s, fe_op(op, 2, in, &attr)) : NULL;
}

static vm_tensor *rule_conv(fe_scope *s, const ad_ctx *c, int k) {
  vm_tensor *a = c->x[0], *b = c->x[1], *g = c->g;
  switch (c->op) {
    case VM_OP_conv2d: /* (x, w) */
      return k == 0 ? conv_op(s, c, VM_OP_conv2d_input, g, b, a)
                    : conv_op(s, c, VM_OP_conv2d_weight, a, g, b);
    case VM_OP_conv2d_input: /* (dy, w) -> dx */
      return k == 0 ? conv_op(s, c, VM_OP_conv2d, g, b, a)
                    : conv_op(s, c, VM_OP_conv2d_weight, g, a, b);
    default: /* conv2d_weight (x, dy) -> dw */
      return k == 0 ? conv_op(s, c, VM_OP_conv2d_input, b, g, a)
                    : conv_op(s, c, VM_OP_conv2d, a, g, b);
  }
}

/* Attention: one attention_grad node gives the gradients of q, k and v
   packed (dq | dk | dv); each input's is its slice, reshaped.  The node is
   made for the first input asked for and kept in c->memo for the others.
   The mask gets none: fe_attention composes attention where a float mask
   takes a gradient. */
static vm_tensor *rule_attention(fe_scope *s, const ad_ctx *c, int k) {
  if (c->op == VM_OP_attention_grad) {
    vm_error(KILN_ERR_ARG, "attention_grad has no gradient (attention has no second derivative)");
    return NULL;
  }
  if (k > 2) return NULL;
  vm_tensor *packed = c->memo ? *c->memo : NULL;
  if (!packed) {
    vm_tensor *in[6] = {c->x[0], c->x[1], c->x[2], c->y, c->g, NULL};
    int n = 5;
    if (c->attr->axis) in[n++] = c->x[3]; /* the mask */
    vm_attr attr = *c->attr;
    attr.api = NULL;
    packed = fe_op(VM_OP_attention_grad, n, in, &attr);
    if (!packed) return NULL;
    if (c->memo)
      *c->memo = packed;
    else
      keep(s, packed);
  }
  int64_t at = 0;
  for (int i = 0; i < k; i++) at += c->x[i]->numel;
  vm_tensor *part = keep(s, fe_slice(packed, 0, at, at + c->x[k]->numel, 1));
  return part ? keep(s, fe_reshape(part, c->x[k]->ndim, c->x[k]->shape)) : NULL;
}

/* an index tensor for `axis` broadcast to shape (of g): positions idx_1d[j] */
static vm_tensor *axis_index(fe_scope *s, vm_tensor *idx_1d, int axis, const vm_tensor *g) {
  int64_t shape[KILN_MAX_DIMS];
  for (int d = 0; d < g->ndim; d++) shape[d] = d == axis ? g->shape[d] : 1;
  vm_tensor *r = keep(s, fe_reshape(idx_1d, g->ndim, shape));
  return keep(s, fe_expand(r, g->ndim, g->shape));
}

static vm_tensor *zeros_like(fe_scope *s, const vm_tensor *x) { return keep(s, fe_zeros_like(x)); }

static vm_tensor *scatter_into_zeros(fe_scope *s, const vm_tensor *x, int axis, vm_tensor *idx,
                                     vm_tensor *g) {
  return keep(s, fe_index_op(VM_OP_scatter_add, zeros_like(s, x), axis, idx, g));
}

static vm_tensor *rule_view(fe_scope *s, const ad_ctx *c, int k) {
  (void)k;
  vm_tensor *x = c->x[0], *g = c->g;
  const vm_attr *at = c->attr;
  switch (c->op) {
    case VM_OP_reshape:
      return keep(s, fe_reshape(g, x->ndim, x->shape));
    case VM_OP_expand:
      return keep(s, ad_sum_to(g, x));
    case VM_OP_permute: {
      int inverse[KILN_MAX_DIMS];
      for (int d = 0; d < x->ndim; d++) inverse[at->perm[d]] = d;
      return keep(s, fe_permute(g, inverse));
    }
    case VM_OP_slice: { /* scatter g back to the positions start, start+step, ... */
      vm_tensor *pos =
          keep(s, fe_arange_i64(at->start, at->step, g->shape[at->axis], (kiln_device)g->device));
      return scatter_into_zeros(s, x, at->axis, axis_index(s, pos, at->axis, g), g);
    }
    default:
      return NULL;
  }
}

static vm_tensor *rule_index(fe_scope *s, const ad_ctx *c, int k) {
  vm_tensor *a = c->x[0], *idx = c->x[1], *g = c->g;
  int axis = c->attr->axis;
  switch (c->op) {
    case VM_OP_index_select:
      return k == 0 ? scatter_into_zeros(s, a, axis, axis_index(s, idx, axis, g), g) : NULL;
    case VM_OP_gather:
      return k == 0 ? scatter_into_zeros(s, a, axis, idx, g) : NULL;
    case VM_OP_scatter_add:
      if (k == 0) return g;
      return k == 2 ? keep(s, fe_index_op(VM_OP_gather, g, axis, idx, NULL)) : NULL;
    default:
      return NULL;
  }
}

static vm_tensor *rule_concat(fe_scope *s, const ad_ctx *c, int k) {
  int axis = c->attr->axis;
  int64_t at = 0;
  for (int i = 0; i < k; i++) at += c->x[i]->shape[axis];
  return keep(s, fe_slice(c->g, axis, at, at + c->x[k]->shape[axis], 1));
}

/* every rank's output is the reduction of every rank's input: the
   gradient of a sum (mean) is the sum (mean) of the ranks' gradients */
static vm_tensor *rule_collective(fe_scope *s, const ad_ctx *c, int k) {
  (void)k;
  if (c->op != VM_OP_all_reduce || c->attr->axis == VM_REDUCE_MAX) {
    vm_error(KILN_ERR_ARG, "%s%s has no gradient (all_reduce with sum or mean has one)",
             vm_op_table[c->op].name, c->op == VM_OP_all_reduce ? " with max" : "");
    return NULL;
  }
  vm_attr attr = {.axis = c->attr->axis, .counter = vm_dist_next_seq()};
  return keep(s, fe_op(VM_OP_all_reduce, 1, &c->g, &attr));
}

typedef vm_tensor *(*vjp_rule)(fe_scope *s, const ad_ctx *c, int k);

static vjp_rule rule_for(vm_opcode op) {
  switch (vm_op_table[op].kind) {
    case VM_KIND_UNARY:
      return rule_unary;
    case VM_KIND_BINARY:
      return rule_binary;
    case VM_KIND_TERNARY:
      return rule_where;
    case VM_KIND_REDUCE:
      return rule_reduce;
    case VM_KIND_MATMUL:
      return rule_matmul;
    case VM_KIND_VIEW:
      return rule_view;
    case VM_KIND_INDEX:
      return rule_index;
    case VM_KIND_CONCAT:
      return rule_concat;
    case VM_KIND_COLLECTIVE:
      return rule_collective;
    case VM_KIND_CONV:
      return rule_conv;
    case VM_KIND_ATTENTION:
      return rule_attention;
    case VM_KIND_LEAF:
    case VM_KIND_SORT:
      return NULL; /* indices: sort's values get gather's VJP */
  }
  return NULL;
}

bool ad_vjp(const ad_ctx *c, int k, vm_tensor **out) {
  *out = NULL;
  vjp_rule rule = rule_for(c->op);
  if (!rule || !vm_dtype_is_float(c->x[k]->dtype) || !vm_dtype_is_float(c->g->dtype)) return true;
  fe_scope s = {0};
  vm_tensor *r = rule(&s, c, k);
  if (!r && vm_thread()->status != KILN_OK) { /* callers start with a clear error */
    finish(&s, NULL);
    return false;
  }
  /* a gradient always has its input's shape and dtype */
  vm_tensor *shaped = r ? keep(&s, ad_sum_to(r, c->x[k])) : NULL;
  if (shaped && shaped->dtype != c->x[k]->dtype) shaped = keep(&s, fe_cast(shaped, c->x[k]->dtype));
  *out = finish(&s, shaped);
  return !r || *out;
}
