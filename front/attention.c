/* attention.c — kiln_scaled_dot_product_attention (DESIGN §14): the user's
 * arguments checked, the batch dims of q, k, v and the mask broadcast, and
 * then one attention primitive (ops.def; vm/kern_attention.c on the CPU,
 * jit_gpu/opgen_src.c's kernels on CUDA for heads up to 128).  Past the
 * device's head sizes, and where a float mask itself takes a gradient (the
 * primitive gives none to its mask), the same function is composed from
 * matmul and softmax, with the primitive's semantics: a row whose keys are
 * all masked out gives 0, not NaN.  fe_attention_of_matmul records the op
 * for attention a user wrote the long way (trace/attention.h). */
#include "../trace/attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../trace/dump.h"
#include "../trace/tape.h"
#include "../vm/backend.h"
#include "../vm/state.h"
#include "composite.h"
#include "layers.h"
#include "scope.h"

static const char *const role[3] = {"query", "key", "value"};

/* t with its leading dims broadcast to batch[nb] (t itself when they are) */
static vm_tensor *to_batch(fe_scope *s, vm_tensor *t, int nb, const int64_t *batch, int64_t r,
                           int64_t c) {
  int64_t shape[KILN_MAX_DIMS];
  memcpy(shape, batch, (size_t)nb * sizeof *shape);
  shape[nb] = r, shape[nb + 1] = c;
  if (t->ndim == nb + 2 && !memcmp(t->shape, shape, (size_t)(nb + 2) * sizeof *shape)) return t;
  return keep(s, fe_expand(t, nb + 2, shape));
}

static vm_tensor *scalar(fe_scope *s, double v) { return keep(s, fe_weak_scalar(v, false)); }

static vm_tensor *where(fe_scope *s, vm_tensor *cond, vm_tensor *a, vm_tensor *b) {
  vm_tensor *in[3] = {cond, a, b};
  return cond && a && b ? keep(s, fe_op(VM_OP_where, 3, in, NULL)) : NULL;
}

/* softmax(q kᵀ scale + mask) v from ordinary ops */
static vm_tensor *composed(fe_scope *s, vm_tensor *q, vm_tensor *k, vm_tensor *v, vm_tensor *mask,
                           bool causal, double scale) {
  int64_t tq = q->shape[q->ndim - 2], tk = k->shape[k->ndim - 2];
  vm_tensor *kt = keep(s, fe_transpose(k, -1, -2));
  vm_tensor *sc = keep(s, kt ? fe_binary(VM_OP_matmul, q, kt) : NULL);
  sc = keep(s, sc ? fe_binary_scalar(VM_OP_mul, sc, scale, false) : NULL);
  vm_tensor *ninf = scalar(s, -INFINITY);
  if (causal) { /* key j > query i is masked out */
    vm_tensor *i = keep(s, fe_arange_i64(0, 1, tq, (kiln_device)q->device));
    vm_tensor *j = keep(s, fe_arange_i64(0, 1, tk, (kiln_device)q->device));
    i = keep(s, i ? fe_reshape(i, 2, (int64_t[]){tq, 1}) : NULL);
    vm_tensor *later = keep(s, i && j ? fe_binary(VM_OP_gt, j, i) : NULL);
    sc = where(s, later, ninf, sc);
  }
  if (mask && mask->dtype == KILN_BOOL)
    sc = where(s, mask, sc, ninf);
  else if (mask)
    sc = keep(s, sc ? fe_binary(VM_OP_add, sc, mask) : NULL);
  /* rows with every key masked: softmax of zeros there (finite, so no NaN
     reaches the gradient), then zeroed */
  int last = -1;
  vm_tensor *mx = keep(s, sc ? fe_reduce(VM_OP_max, sc, 1, &last, true) : NULL);
  vm_tensor *dead = keep(s, mx ? fe_binary(VM_OP_eq, mx, ninf) : NULL);
  sc = where(s, dead, scalar(s, 0), sc);
  vm_tensor *p = keep(s, sc ? fe_softmax(sc, -1) : NULL);
  p = where(s, dead, scalar(s, 0), p);
  return keep(s, p ? fe_binary(VM_OP_matmul, p, v) : NULL);
}

/* products: KILN_BF16 where q, k and v are to be read rounded to bf16
   (bf16 values cast to f32, or autocast's f32 operands): the op's
   attr.dtype (ops.def), which also lets the CPU kernel run its products on
   AMX tiles (vm/kern_attention.c); else KILN_BOOL (none) */
static vm_tensor *attention_of(vm_tensor *q, vm_tensor *k, vm_tensor *v, vm_tensor *mask,
                               bool causal, double scale, kiln_dtype products);

vm_tensor *fe_attention(vm_tensor *q, vm_tensor *k, vm_tensor *v, vm_tensor *mask, bool causal,
                        double scale) {
  return attention_of(q, k, v, mask, causal, scale, KILN_BOOL);
}

static vm_tensor *attention_of(vm_tensor *q, vm_tensor *k, vm_tensor *v, vm_tensor *mask,
                               bool causal, double scale, kiln_dtype products) {
  vm_tensor *qkv[3] = {q, k, v};
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  for (int i = 0; i < 3; i++) {
    if (!qkv[i]) {
      vm_null_input(i);
      return NULL;
    }
    if (qkv[i]->ndim < 2) {
      vm_error(KILN_ERR_SHAPE, "%s must be [..., T, d] (2-d at least), got shape %s", role[i],
               vm_shape_str(b1, qkv[i]->ndim, qkv[i]->shape));
      return NULL;
    }
    if (!vm_dtype_is_float(qkv[i]->dtype)) {
      vm_error(KILN_ERR_DTYPE, "%s must be a float tensor, not %s", role[i],
               vm_dtype_name(qkv[i]->dtype));
      return NULL;
    }
  }
  int nq = q->ndim, nk = k->ndim, nv = v->ndim;
  int64_t tq = q->shape[nq - 2], d = q->shape[nq - 1], tk = k->shape[nk - 2];
  if (k->shape[nk - 1] != d) {
    vm_error(KILN_ERR_SHAPE, "query %s and key %s differ in their last dim (the head size)",
             vm_shape_str(b1, nq, q->shape), vm_shape_str(b2, nk, k->shape));
    return NULL;
  }
  if (v->shape[nv - 2] != tk) {
    vm_error(KILN_ERR_SHAPE, "key %s and value %s differ in length (dim -2)",
             vm_shape_str(b1, nk, k->shape), vm_shape_str(b2, nv, v->shape));
    return NULL;
  }
  if (!isfinite(scale)) {
    vm_error(KILN_ERR_ARG, "scale %g must be finite (<= 0 means 1/sqrt(head size))", scale);
    return NULL;
  }
  if (scale <= 0) scale = d > 0 ? 1 / sqrt((double)d) : 1;
  /* the batch: q's, k's and v's leading dims (and the mask's) broadcast */
  int nb = 0;
  int64_t batch[KILN_MAX_DIMS], grown[KILN_MAX_DIMS];
  for (int i = 0; i < 3; i++) {
    if (!vm_broadcast_shapes(nb, batch, qkv[i]->ndim - 2, qkv[i]->shape, &nb, grown)) return NULL;
    memcpy(batch, grown, (size_t)nb * sizeof *batch);
  }
  if (mask) {
    if (mask->dtype != KILN_BOOL && !vm_dtype_is_float(mask->dtype)) {
      vm_error(KILN_ERR_DTYPE,
               "mask must be bool (true: attend) or float (added to the scores), not %s",
               vm_dtype_name(mask->dtype));
      return NULL;
    }
    int64_t scores[KILN_MAX_DIMS], full[KILN_MAX_DIMS];
    int ns = nb + 2, nf;
    memcpy(scores, batch, (size_t)nb * sizeof *batch);
    scores[nb] = tq, scores[nb + 1] = tk;
    if (ns > KILN_MAX_DIMS ||
        !vm_broadcast_shapes(ns, scores, mask->ndim, mask->shape, &nf, full) ||
        full[nf - 2] != tq || full[nf - 1] != tk) {
      vm_clear_error();
      vm_error(KILN_ERR_SHAPE, "mask %s does not broadcast to the scores' shape %s",
               vm_shape_str(b1, mask->ndim, mask->shape), vm_shape_str(b2, ns, scores));
      return NULL;
    }
    nb = nf - 2;
    memcpy(batch, full, (size_t)nb * sizeof *batch);
    if (tr_attention_mask_is_causal(mask, tq, tk)) { /* the same values, blocks skipped */
      mask = NULL;
      causal = true;
      if (tr_log_level())
        fprintf(stderr, "kiln: attention's bool mask [%lld, %lld] is the causal one: causal op\n",
                (long long)tq, (long long)tk);
    }
  }
  if (nb + 2 > KILN_MAX_DIMS) {
    vm_error(KILN_ERR_SHAPE, "attention over %d batch dims is more than %d dims", nb,
             KILN_MAX_DIMS);
    return NULL;
  }
  kiln_dtype dt = vm_promote(vm_promote(q->dtype, k->dtype), v->dtype);
  /* the primitive where the device's interpreter has one for these heads
     (vm_backend: any on the CPU, up to 128 on CUDA), else the composite */
  kiln_device dev = (kiln_device)q->device;
  const vm_backend *be = vm_backend_of(dev);
  bool native = be && k->device == dev && v->device == dev && (!mask || mask->device == dev) &&
                d <= be->attention_max_head && v->shape[nv - 1] <= be->attention_max_head;
  bool mask_grad =
      mask && mask->dtype != KILN_BOOL && mask->node && tr_node_requires_grad(mask->node);
  fe_scope s = {0};
  vm_tensor *out;
  if (vm_dtype_is_half(dt)) { /* in f32, rounded once (DESIGN §13) */
    vm_tensor *q32 = keep(&s, fe_cast(q, KILN_F32)), *k32 = keep(&s, fe_cast(k, KILN_F32));
    vm_tensor *v32 = keep(&s, fe_cast(v, KILN_F32)), *m32 = mask;
    if (mask && vm_dtype_is_half(mask->dtype)) m32 = keep(&s, fe_cast(mask, KILN_F32));
    out = keep(&s, attention_of(q32, k32, v32, m32, causal, scale,
                                dt == KILN_BF16 ? KILN_BF16 : KILN_BOOL));
    return finish(&s, out ? keep(&s, fe_cast(out, dt)) : NULL);
  }
  if (native && (dt == KILN_F32 || dt == KILN_F64) && !mask_grad) {
    vm_tensor *in[4] = {to_batch(&s, q, nb, batch, tq, d), to_batch(&s, k, nb, batch, tk, d),
                        to_batch(&s, v, nb, batch, tk, v->shape[nv - 1]),
                        mask ? to_batch(&s, mask, nb, batch, tq, tk) : NULL};
    vm_attr attr = {.dtype = products, .axis = mask != NULL, .keepdim = causal, .scalar = {scale}};
    out = keep(&s, fe_op(VM_OP_attention, mask ? 4 : 3, in, &attr));
  } else {
    out = composed(&s, q, k, v, mask, causal, scale);
  }
  return finish(&s, out);
}

/* matmul(p, v) where p is the softmax of attention written the long way
   (trace/attention.h): the attention op instead, and the composite's
   nodes retired.  NULL with no error where it is not (or the op cannot
   take it): the caller records the matmul. */
vm_tensor *fe_attention_of_matmul(vm_tensor *p, vm_tensor *v) {
  tr_attention_match m;
  if (!tr_attention_match_of(p, v, &m)) return NULL;
  fe_scope s = {0};
  /* the dtype the matmul gives: a half (p and v halves: the op rounds its
     f32 result once), else f32 or f64, which half q, k, v are cast to
     first (f32 probabilities of half scores times a half v) */
  kiln_dtype dt = vm_promote(p->dtype, v->dtype);
  vm_tensor *q = m.q, *kt = m.kt;
  kiln_dtype products = KILN_BOOL;
  if (dt == KILN_BF16 && m.q_f32 && m.q_f32->device == KILN_CPU) { /* the op rounds them itself */
    q = m.q_f32, kt = m.kt_f32, v = m.v_f32;
    products = KILN_BF16;
  } else if (!vm_dtype_is_half(dt)) {
    if (q->dtype != dt) q = keep(&s, fe_cast(q, dt));
    if (kt && kt->dtype != dt) kt = keep(&s, fe_cast(kt, dt));
    if (v->dtype != dt) v = keep(&s, fe_cast(v, dt));
  }
  vm_tensor *k = q && kt && v ? keep(&s, fe_transpose(kt, -1, -2)) : NULL, *mask = m.mask;
  if (mask && m.mask_out) mask = keep(&s, fe_unary(VM_OP_logical_not, mask));
  vm_tensor *out = k && (!m.mask || mask)
                       ? keep(&s, attention_of(q, k, v, mask, m.causal, m.scale, products))
                       : NULL;
  if (out && out->dtype != dt) out = keep(&s, fe_cast(out, dt)); /* q, kᵀ f32 of halves */
  if (out)
    tr_attention_retire(&m);
  else
    vm_clear_error();
  tr_attention_match_free(&m);
  return finish(&s, out);
}
