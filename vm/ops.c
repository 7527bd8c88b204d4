/* ops.c — the op table and shape/dtype/device inference for every
 * primitive.  Owns every user-facing shape/dtype error; kernels never
 * report those.  Recording an op is the front-end's (front/op.c); running
 * one is the interpreter's (interp.c). */
#include "ops.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dist.h"
#include "kernels.h"
#include "state.h"

const vm_op_info vm_op_table[VM_OP_COUNT] = {
#define X(name, kind, rule, flags) [VM_OP_##name] = {#name, VM_KIND_##kind, VM_DT_##rule, flags},
#include "ops.def"
#undef X
};

bool vm_norm_axis(int *axis, int ndim) {
  int a = *axis;
  if (a < -ndim || a >= ndim) {
    vm_error(KILN_ERR_ARG, "axis %d is out of range for a tensor of %d dimensions", a, ndim);
    return false;
  }
  *axis = a < 0 ? a + ndim : a;
  return true;
}

bool vm_check_dims_arg(int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > KILN_MAX_DIMS) {
    vm_error(KILN_ERR_SHAPE, "ndim %d is out of range [0, %d]", ndim, KILN_MAX_DIMS);
    return false;
  }
  if (ndim > 0 && !shape) {
    vm_error(KILN_ERR_ARG, "shape is NULL for ndim %d", ndim);
    return false;
  }
  return true;
}

bool vm_broadcast_shapes(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout,
                         int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t x = i < na ? sa[na - 1 - i] : 1, y = i < nb ? sb[nb - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) {
      char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
      vm_error(KILN_ERR_SHAPE, "shapes %s and %s cannot broadcast", vm_shape_str(b1, na, sa),
               vm_shape_str(b2, nb, sb));
      return false;
    }
    out[n - 1 - i] = x == 1 ? y : x;
  }
  *nout = n;
  return true;
}

/* a host scalar (weak) never widens a float tensor; a float scalar with an
   integer tensor gives f32; an integer scalar keeps the tensor's integers */
static kiln_dtype promote_weak(const vm_tensor *a, const vm_tensor *b) {
  if (a->weak == b->weak) return vm_promote(a->dtype, b->dtype);
  const vm_tensor *t = a->weak ? b : a, *s = a->weak ? a : b;
  if (vm_dtype_is_float(t->dtype)) return t->dtype;
  if (vm_dtype_is_float(s->dtype)) return KILN_F32;
  return t->dtype == KILN_BOOL ? KILN_I64 : t->dtype;
}

static bool reject_bool(vm_opcode op, kiln_dtype dt) {
  if ((vm_op_table[op].flags & VM_F_NO_BOOL) && dt == KILN_BOOL) {
    vm_error(KILN_ERR_DTYPE, "bool tensors are not supported by %s; cast them first",
             vm_op_table[op].name);
    return true;
  }
  return false;
}

static void elementwise_dtypes(vm_opcode op, kiln_dtype p, vm_meta *m) {
  m->compute = p;
  m->dtype = p;
  switch (vm_op_table[op].rule) {
    case VM_DT_FLOAT:
    case VM_DT_TRUEDIV:
      m->compute = m->dtype = vm_dtype_is_float(p) ? p : KILN_F32;
      break;
    case VM_DT_COMPARE:
      m->dtype = KILN_BOOL;
      break;
    case VM_DT_LOGICAL:
      m->compute = m->dtype = KILN_BOOL;
      break;
    default:
      break;
  }
}

static bool infer_elementwise(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                              vm_meta *m) {
  const vm_tensor *a = in[n == 3 ? 1 : 0];
  m->ndim = in[0]->ndim;
  memcpy(m->shape, in[0]->shape, sizeof m->shape);
  for (int i = 1; i < n; i++)
    if (!vm_broadcast_shapes(m->ndim, m->shape, in[i]->ndim, in[i]->shape, &m->ndim, m->shape))
      return false;
  kiln_dtype p = a->dtype;
  if (n == 2) p = promote_weak(in[0], in[1]);
  if (n == 3) {
    if (in[0]->dtype != KILN_BOOL) {
      vm_error(KILN_ERR_DTYPE, "the condition must be bool, not %s", vm_dtype_name(in[0]->dtype));
      return false;
    }
    p = promote_weak(in[1], in[2]);
  }
  if (reject_bool(op, p)) return false;
  if (op == VM_OP_cast) {
    if (!vm_dtype_valid(attr->dtype)) {
      vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)attr->dtype);
      return false;
    }
    m->dtype = attr->dtype;
    m->compute = a->dtype;
    return true;
  }
  elementwise_dtypes(op, p, m);
  return true;
}

/* whether a reduced axis has size 0 (the reduction folds no elements) */
static bool reduces_nothing(const vm_tensor *a, uint32_t mask) {
  for (int d = 0; d < a->ndim; d++)
    if ((mask & (1u << d)) && a->shape[d] == 0) return true;
  return false;
}

static bool infer_reduce(vm_opcode op, const vm_tensor *a, const vm_attr *attr, vm_meta *m) {
  uint32_t mask = attr->axes_mask;
  m->ndim = 0;
  bool out_empty = false;
  for (int d = 0; d < a->ndim; d++) {
    bool reduced = mask & (1u << d);
    if (reduced && !attr->keepdim) continue;
    m->shape[m->ndim++] = reduced ? 1 : a->shape[d];
    out_empty |= !reduced && a->shape[d] == 0;
  }
  bool needs_element =
      op == VM_OP_max || op == VM_OP_min || op == VM_OP_argmax || op == VM_OP_argmin;
  if (needs_element && !out_empty && reduces_nothing(a, mask)) {
    char buf[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "cannot reduce over zero elements (shape %s)",
             vm_shape_str(buf, a->ndim, a->shape));
    return false;
  }
  switch (vm_op_table[op].rule) {
    case VM_DT_SUM:
      m->dtype = m->compute = vm_dtype_is_float(a->dtype) ? a->dtype : KILN_I64;
      break;
    case VM_DT_INDEX:
      m->dtype = KILN_I64;
      m->compute = a->dtype;
      break;
    default:
      m->dtype = m->compute = a->dtype;
  }
  return true;
}

static bool infer_matmul(const vm_tensor *a, const vm_tensor *b, vm_meta *m) {
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  if (a->ndim == 0 || b->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "operands must have at least 1 dimension, got shapes %s and %s",
             vm_shape_str(b1, a->ndim, a->shape), vm_shape_str(b2, b->ndim, b->shape));
    return false;
  }
  kiln_dtype p = vm_promote(a->dtype, b->dtype);
  if (reject_bool(VM_OP_matmul, p)) return false;
  int64_t k_a = a->shape[a->ndim - 1];
  int64_t k_b = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
  if (k_a != k_b) {
    vm_error(KILN_ERR_SHAPE, "shapes %s and %s: inner dimensions %lld and %lld differ",
             vm_shape_str(b1, a->ndim, a->shape), vm_shape_str(b2, b->ndim, b->shape),
             (long long)k_a, (long long)k_b);
    return false;
  }
  int nba = a->ndim > 2 ? a->ndim - 2 : 0, nbb = b->ndim > 2 ? b->ndim - 2 : 0;
  if (!vm_broadcast_shapes(nba, a->shape, nbb, b->shape, &m->ndim, m->shape)) return false;
  if (a->ndim >= 2) m->shape[m->ndim++] = a->shape[a->ndim - 2];
  if (b->ndim >= 2) m->shape[m->ndim++] = b->shape[b->ndim - 1];
  m->dtype = m->compute = p;
  return true;
}

static bool check_index_dtype(const vm_tensor *idx) {
  if (!vm_dtype_is_index(idx->dtype)) {
    vm_error(KILN_ERR_DTYPE, "indices must be int32 or int64, not %s", vm_dtype_name(idx->dtype));
    return false;
  }
  return true;
}

/* gather/scatter_add: idx has a's ndim and no larger size outside axis */
static bool check_gather_shapes(const vm_tensor *a, const vm_tensor *idx, int axis) {
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  bool ok = idx->ndim == a->ndim;
  for (int d = 0; ok && d < a->ndim; d++) ok = d == axis || idx->shape[d] <= a->shape[d];
  if (!ok)
    vm_error(KILN_ERR_SHAPE, "index shape %s does not fit input shape %s along axis %d",
             vm_shape_str(b1, idx->ndim, idx->shape), vm_shape_str(b2, a->ndim, a->shape), axis);
  return ok;
}

static bool infer_index(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                        vm_meta *m) {
  const vm_tensor *a = in[0], *idx = in[1];
  int axis = attr->axis;
  if (a->ndim == 0) {
    vm_error(KILN_ERR_SHAPE, "cannot index a 0-d tensor");
    return false;
  }
  if (axis < 0 || axis >= a->ndim || n != (op == VM_OP_scatter_add ? 3 : 2)) {
    vm_error(KILN_ERR_ARG, "axis %d is out of range for a tensor of %d dimensions", axis, a->ndim);
    return false;
  }
  if (!check_index_dtype(idx)) return false;
  m->dtype = m->compute = a->dtype;
  if (op == VM_OP_index_select) {
    if (idx->ndim != 1) {
      vm_error(KILN_ERR_SHAPE, "indices must be 1-d, got %d dimensions", idx->ndim);
      return false;
    }
    m->ndim = a->ndim;
    memcpy(m->shape, a->shape, sizeof m->shape);
    m->shape[axis] = idx->shape[0];
    return true;
  }
  if (!check_gather_shapes(a, idx, axis)) return false;
  if (op == VM_OP_gather) {
    m->ndim = idx->ndim;
    memcpy(m->shape, idx->shape, sizeof m->shape);
    return true;
  }
  const vm_tensor *src = in[2];
  bool same = n == 3 && src->ndim == idx->ndim &&
              !memcmp(src->shape, idx->shape, (size_t)idx->ndim * sizeof(int64_t));
  if (!same) {
    char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "source shape %s must equal index shape %s",
             vm_shape_str(b1, src->ndim, src->shape), vm_shape_str(b2, idx->ndim, idx->shape));
    return false;
  }
  m->ndim = a->ndim;
  memcpy(m->shape, a->shape, sizeof m->shape);
  return true;
}

static bool infer_concat(int n, vm_tensor *const *in, int axis, vm_meta *m) {
  const vm_tensor *first = in[0];
  if (n < 1 || first->ndim == 0 || axis < 0 || axis >= first->ndim) {
    vm_error(KILN_ERR_ARG, "cannot concatenate %d tensors of %d dimensions along axis %d", n,
             n ? first->ndim : 0, axis);
    return false;
  }
  m->ndim = first->ndim;
  memcpy(m->shape, first->shape, sizeof m->shape);
  m->dtype = first->dtype;
  m->shape[axis] = 0;
  for (int i = 0; i < n; i++) {
    const vm_tensor *t = in[i];
    bool ok = t->ndim == first->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = d == axis || t->shape[d] == first->shape[d];
    if (!ok) {
      char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
      vm_error(KILN_ERR_SHAPE, "tensor %d has shape %s, which does not match %s outside axis %d", i,
               vm_shape_str(b1, t->ndim, t->shape), vm_shape_str(b2, first->ndim, first->shape),
               axis);
      return false;
    }
    if (__builtin_add_overflow(m->shape[axis], t->shape[axis], &m->shape[axis]))
      m->shape[axis] = INT64_MAX; /* too large: check_result_size reports it */
    m->dtype = vm_promote(m->dtype, t->dtype);
  }
  m->compute = m->dtype;
  return true;
}

/* the length of range(start, stop, step) for bounds already clamped into
   [-1, len]: exact for any nonzero step, INT64_MIN and INT64_MAX included
   (stop - start cannot overflow; nothing is added to step) */
static int64_t slice_length(int64_t start, int64_t stop, int64_t step) {
  if (step > 0) return stop > start ? (stop - start - 1) / step + 1 : 0;
  return start > stop ? 1 - (start - stop - 1) / step : 0; /* step < 0: the quotient is <= 0 */
}

static bool infer_view(vm_opcode op, const vm_tensor *a, const vm_attr *attr, vm_meta *m) {
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  m->dtype = m->compute = a->dtype;
  m->ndim = a->ndim;
  memcpy(m->shape, a->shape, sizeof m->shape);
  switch (op) {
    case VM_OP_reshape: {
      int64_t numel;
      if (!vm_check_shape(attr->ndim, attr->shape, &numel)) return false;
      if (numel != a->numel) {
        vm_error(KILN_ERR_SHAPE, "cannot reshape %s (%lld elements) into %s",
                 vm_shape_str(b1, a->ndim, a->shape), (long long)a->numel,
                 vm_shape_str(b2, attr->ndim, attr->shape));
        return false;
      }
      m->ndim = attr->ndim;
      memcpy(m->shape, attr->shape, sizeof m->shape);
      return true;
    }
    case VM_OP_expand: {
      int lead = attr->ndim - a->ndim;
      bool ok = lead >= 0 && attr->ndim <= KILN_MAX_DIMS;
      for (int d = 0; ok && d < attr->ndim; d++) {
        int64_t want = attr->shape[d], have = d >= lead ? a->shape[d - lead] : 1;
        if (want == -1 && d >= lead) want = have;
        ok = want >= 0 && (have == want || have == 1);
        m->shape[d] = want;
      }
      if (!ok) {
        vm_error(KILN_ERR_SHAPE, "cannot expand shape %s to %s",
                 vm_shape_str(b1, a->ndim, a->shape),
                 vm_shape_str(b2, attr->ndim < 0 ? 0 : attr->ndim, attr->shape));
        return false;
      }
      m->ndim = attr->ndim;
      int64_t numel;
      return vm_check_shape(m->ndim, m->shape, &numel);
    }
    case VM_OP_permute: {
      uint32_t seen = 0;
      for (int d = 0; d < a->ndim; d++) {
        int p = attr->perm[d];
        if (p < 0 || p >= a->ndim || (seen & (1u << p))) {
          vm_error(KILN_ERR_ARG,
                   "permutation entry %d (position %d) is out of range or repeated "
                   "for %d dimensions",
                   p, d, a->ndim);
          return false;
        }
        seen |= 1u << p;
        m->shape[d] = a->shape[p];
      }
      return true;
    }
    case VM_OP_slice: {
      /* bounds as fe_slice clamps them: [0, len] going up, [-1, len-1] down */
      int64_t len = attr->axis >= 0 && attr->axis < a->ndim ? a->shape[attr->axis] : 0;
      int64_t lo = attr->step > 0 ? 0 : -1, hi = attr->step > 0 ? len : len - 1;
      if (attr->axis < 0 || attr->axis >= a->ndim || attr->step == 0 || attr->start < lo ||
          attr->start > hi || attr->stop < lo || attr->stop > hi) {
        vm_error(KILN_ERR_ARG, "bad slice (axis %d, start %lld, stop %lld, step %lld) for shape %s",
                 attr->axis, (long long)attr->start, (long long)attr->stop, (long long)attr->step,
                 vm_shape_str(b1, a->ndim, a->shape));
        return false;
      }
      m->shape[attr->axis] = slice_length(attr->start, attr->stop, attr->step);
      return true;
    }
    default:
      return false;
  }
}

static bool infer_leaf(vm_opcode op, const vm_attr *attr, vm_meta *m) {
  int64_t numel;
  if (!vm_dtype_valid(attr->dtype)) {
    vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)attr->dtype);
    return false;
  }
  if (!vm_check_shape(attr->ndim, attr->shape, &numel)) return false;
  if ((op == VM_OP_rand || op == VM_OP_randn) && !vm_dtype_is_float(attr->dtype)) {
    vm_error(KILN_ERR_DTYPE, "dtype %s is not a float dtype", vm_dtype_name(attr->dtype));
    return false;
  }
  m->dtype = m->compute = attr->dtype;
  m->weak = op == VM_OP_full && attr->weak;
  m->device = attr->device;
  m->ndim = attr->ndim;
  memcpy(m->shape, attr->shape, sizeof m->shape);
  return true;
}

/* argsort: i64 indices of the input's shape, along an existing axis */
static bool infer_sort(const vm_tensor *a, int axis, vm_meta *m) {
  if (a->ndim == 0 || axis < 0 || axis >= a->ndim) {
    vm_error(KILN_ERR_ARG, "axis %d is out of range for a tensor of %d dimensions", axis, a->ndim);
    return false;
  }
  m->ndim = a->ndim;
  memcpy(m->shape, a->shape, sizeof m->shape);
  m->dtype = KILN_I64;
  m->compute = a->dtype;
  return true;
}

/* collectives (vm/dist.h): all_reduce and all_reduce_wait keep their
   input's shape; all_reduce_start packs its inputs, of one dtype,
   flattened, into one buffer */
static bool infer_collective(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                             vm_meta *m) {
  if (!vm_dist_ready()) return false;
  kiln_dtype dt = in[0]->dtype;
  if (attr->axis < 0 || attr->axis >= VM_REDUCE_COUNT) {
    vm_error(KILN_ERR_ARG, "op %d is not a kiln_reduce_op (KILN_REDUCE_SUM, _MEAN or _MAX)",
             attr->axis);
    return false;
  }
  if (vm_dtype_is_half(dt) && op != VM_OP_all_reduce) { /* buckets are packed in f32 */
    vm_error(KILN_ERR_DTYPE, "a gradient bucket of %s values: all-reduce them as float32",
             vm_dtype_name(dt));
    return false;
  }
  if ((dt == KILN_I8 || dt == KILN_I16) && op != VM_OP_all_reduce) { /* no MPI type: via i32 */
    vm_error(KILN_ERR_DTYPE, "a bucket of %s values: all-reduce them one by one, or as int32",
             vm_dtype_name(dt));
    return false;
  }
  if (attr->axis == VM_REDUCE_MEAN && !vm_dtype_is_float(dt)) {
    vm_error(KILN_ERR_DTYPE, "the mean of %s values is not exact: reduce with sum, then divide",
             vm_dtype_name(dt));
    return false;
  }
  m->dtype = m->compute = dt;
  if (op != VM_OP_all_reduce_start) {
    m->ndim = in[0]->ndim;
    memcpy(m->shape, in[0]->shape, sizeof m->shape);
    return true;
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (in[i]->dtype != dt) {
      vm_error(KILN_ERR_DTYPE, "tensor %d is %s and tensor 0 %s: a bucket holds one dtype", i,
               vm_dtype_name(in[i]->dtype), vm_dtype_name(dt));
      return false;
    }
    total += in[i]->numel;
  }
  m->ndim = 1;
  m->shape[0] = total;
  return true;
}

/* conv2d / conv2d_input / conv2d_weight (vm/kern_conv.c): the geometry
   is fe_conv2d's, checked there against the user's arguments; here the
   operands are checked to agree with it (float, CPU, 4-d) */
static bool infer_conv(vm_opcode op, vm_tensor *const *in, const vm_attr *attr, vm_meta *m) {
  kiln_dtype p = vm_promote(in[0]->dtype, in[1]->dtype);
  if (!vm_dtype_is_float(p)) {
    vm_error(KILN_ERR_DTYPE, "convolution operands must be float, not %s", vm_dtype_name(p));
    return false;
  }
  if (in[0]->device != KILN_CPU || in[1]->device != KILN_CPU) {
    vm_error(KILN_ERR_DEVICE, "the convolution primitive runs on the CPU");
    return false;
  }
  /* x, w and y: two are inputs, the third the result */
  const int64_t *xs = op == VM_OP_conv2d_input ? attr->shape : in[0]->shape;
  const int64_t *ws = op == VM_OP_conv2d_weight ? attr->shape : in[1]->shape;
  const vm_tensor *dy = op == VM_OP_conv2d_input ? in[0] : op == VM_OP_conv2d_weight ? in[1] : NULL;
  int64_t g = attr->axis, st[2] = {attr->perm[0], attr->perm[1]},
          pd[2] = {attr->perm[2], attr->perm[3]};
  int64_t dl[2] = {attr->perm[4], attr->perm[5]}, o[2] = {0, 0};
  bool ok = in[0]->ndim == 4 && in[1]->ndim == 4 && g >= 1 && xs[1] % g == 0 && ws[0] % g == 0 &&
            ws[1] == xs[1] / g && (op == VM_OP_conv2d || attr->ndim == 4);
  for (int d = 0; ok && d < 2; d++) {
    ok = st[d] >= 1 && dl[d] >= 1 && pd[d] >= 0;
    o[d] = ok ? vm_window_out(xs[2 + d], ws[2 + d], st[d], pd[d], dl[d]) : 0;
    ok = ok && o[d] >= 1;
  }
  int64_t ys[4] = {xs[0], ws[0], o[0], o[1]};
  if (ok && dy) ok = !memcmp(dy->shape, ys, sizeof ys);
  if (!ok) {
    vm_error(KILN_ERR_INTERNAL, "%s: operands do not fit the convolution's geometry",
             vm_op_table[op].name);
    return false;
  }
  m->ndim = 4;
  memcpy(m->shape, op == VM_OP_conv2d ? ys : op == VM_OP_conv2d_input ? xs : ws, sizeof ys);
  m->dtype = m->compute = p;
  return true;
}

/* attention / attention_grad (vm/kern_attention.c): fe_attention checks
   the user's arguments and expands the batch dims; here the operands are
   checked to agree (float, one batch shape, the mask [..., Tq, Tk], head
   sizes the device's primitive takes) */
static bool infer_attention(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                            vm_meta *m) {
  bool grad = op == VM_OP_attention_grad;
  int nfixed = grad ? 5 : 3;
  const vm_tensor *q = in[0], *k = in[1], *v = in[2], *mask = n > nfixed ? in[nfixed] : NULL;
  kiln_dtype p = vm_promote(vm_promote(q->dtype, k->dtype), v->dtype);
  if (!vm_dtype_is_float(p)) {
    vm_error(KILN_ERR_DTYPE, "attention operands must be float, not %s", vm_dtype_name(p));
    return false;
  }
  int nd = q->ndim;
  /* vm_infer_device has put every operand on one device; its backend
     takes heads up to its attention_max_head (else fe_attention composes) */
  const vm_backend *b = vm_backend_of((kiln_device)q->device);
  int64_t most = b ? b->attention_max_head : 0;
  if (nd >= 2 && v->ndim == nd && (q->shape[nd - 1] > most || v->shape[nd - 1] > most)) {
    vm_error(KILN_ERR_DEVICE, "the attention primitive on %s takes head sizes up to %lld",
             vm_device_name((kiln_device)q->device), (long long)most);
    return false;
  }
  bool ok = n == nfixed + (attr->axis != 0) && nd >= 2 && k->ndim == nd && v->ndim == nd &&
            !memcmp(q->shape, k->shape, (size_t)(nd - 2) * sizeof(int64_t)) &&
            !memcmp(q->shape, v->shape, (size_t)(nd - 2) * sizeof(int64_t)) &&
            q->shape[nd - 1] == k->shape[nd - 1] && k->shape[nd - 2] == v->shape[nd - 2];
  int64_t oshape[KILN_MAX_DIMS];
  if (ok) {
    memcpy(oshape, q->shape, (size_t)nd * sizeof(int64_t));
    oshape[nd - 1] = v->shape[nd - 1];
  }
  for (int i = 3; ok && grad && i < 5; i++) /* o and its gradient */
    ok = in[i]->ndim == nd && !memcmp(in[i]->shape, oshape, (size_t)nd * sizeof(int64_t));
  if (ok && mask) {
    ok = mask->ndim == nd && (mask->dtype == KILN_BOOL || vm_dtype_is_float(mask->dtype)) &&
         !memcmp(mask->shape, q->shape, (size_t)(nd - 1) * sizeof(int64_t)) &&
         mask->shape[nd - 1] == k->shape[nd - 2];
  }
  if (!ok) {
    vm_error(KILN_ERR_INTERNAL, "%s: operands do not fit the attention's geometry",
             vm_op_table[op].name);
    return false;
  }
  m->dtype = m->compute = p;
  if (grad) {
    m->ndim = 1;
    m->shape[0] = q->numel + k->numel + v->numel;
  } else {
    m->ndim = nd;
    memcpy(m->shape, oshape, (size_t)nd * sizeof(int64_t));
  }
  return true;
}

/* Every result's size fits (vm_shape_numel): a broadcast, matmul, concat
   or expand past 2^60 elements is a shape error naming the input shapes. */
static bool check_result_size(int n, vm_tensor *const *in, const vm_meta *m) {
  int64_t numel;
  if (vm_shape_numel(m->ndim, m->shape, &numel)) return true;
  char list[4 * VM_SHAPE_BUF + 32] = "", buf[VM_SHAPE_BUF];
  size_t used = 0;
  for (int i = 0; i < n && i < 4; i++) {
    const char *sep = i == 0 ? "" : (i == n - 1 || i == 3) ? " and " : ", ";
    const char *shape = i == 3 && n > 4 ? "more" : vm_shape_str(buf, in[i]->ndim, in[i]->shape);
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", sep, shape);
  }
  char out[VM_SHAPE_BUF];
  vm_error(KILN_ERR_SHAPE, "shape%s %s give%s a result of shape %s, more than 2^60 elements",
           n == 1 ? "" : "s", list, n == 1 ? "s" : "", vm_shape_str(out, m->ndim, m->shape));
  return false;
}

static bool infer_kind(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr, vm_meta *m) {
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      return infer_leaf(op, attr, m);
    case VM_KIND_UNARY:
      if (op != VM_OP_cast && reject_bool(op, in[0]->dtype)) return false;
      return infer_elementwise(op, 1, in, attr, m);
    case VM_KIND_BINARY:
      return infer_elementwise(op, 2, in, attr, m);
    case VM_KIND_TERNARY:
      return infer_elementwise(op, 3, in, attr, m);
    case VM_KIND_REDUCE:
      return infer_reduce(op, in[0], attr, m);
    case VM_KIND_MATMUL:
      return infer_matmul(in[0], in[1], m);
    case VM_KIND_VIEW:
      return infer_view(op, in[0], attr, m);
    case VM_KIND_INDEX:
      return infer_index(op, n, in, attr, m);
    case VM_KIND_CONCAT:
      return infer_concat(n, in, attr->axis, m);
    case VM_KIND_SORT:
      return infer_sort(in[0], attr->axis, m);
    case VM_KIND_COLLECTIVE:
      return infer_collective(op, n, in, attr, m);
    case VM_KIND_CONV:
      return infer_conv(op, in, attr, m);
    case VM_KIND_ATTENTION:
      return infer_attention(op, n, in, attr, m);
  }
  return false;
}

static bool movable_scalar(const vm_tensor *t) { return t->weak && t->ndim == 0; }

bool vm_infer_device(int n, vm_tensor *const *in, kiln_device *d) {
  int first = -1;
  for (int i = 0; i < n; i++)
    if (!movable_scalar(in[i]) && (first < 0 || in[i]->device != in[first]->device)) {
      if (first < 0) {
        first = i;
        continue;
      }
      vm_error(KILN_ERR_DEVICE,
               "input %d is on %s and input %d on %s: an op's tensors must be on one "
               "device (move one with kiln_to_device)",
               first, vm_device_name((kiln_device)in[first]->device), i,
               vm_device_name((kiln_device)in[i]->device));
      return false;
    }
  *d = (kiln_device)(first >= 0 ? in[first]->device : n > 0 ? in[0]->device : KILN_CPU);
  return true;
}

bool vm_default_device(kiln_device *d) {
  static _Atomic int cached = -1; /* -2: KILN_DEVICE names no device */
  int c = atomic_load_explicit(&cached, memory_order_relaxed);
  if (c == -1) {
    const char *s = getenv("KILN_DEVICE");
    c = !s || !*s || !strcmp(s, "cpu") ? KILN_CPU : !strcmp(s, "cuda") ? KILN_CUDA : -2;
    atomic_store_explicit(&cached, c, memory_order_relaxed);
  }
  if (c == -2) {
    vm_error(KILN_ERR_ARG, "KILN_DEVICE=%s names no device (cpu or cuda)", getenv("KILN_DEVICE"));
    return false;
  }
  *d = (kiln_device)c;
  return true;
}

bool vm_infer(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr, vm_meta *m) {
  memset(m, 0, sizeof *m);
  kiln_device d = KILN_CPU;
  if (vm_op_table[op].kind != VM_KIND_LEAF && !vm_infer_device(n, in, &d)) return false;
  if (!infer_kind(op, n, in, attr, m)) return false;
  if (vm_op_table[op].kind != VM_KIND_LEAF) m->device = (uint8_t)d;
  /* a gradient bucket is packed and reduced on the host; its wait puts
     the values back on the gradients' device (attr.device) */
  if (op == VM_OP_all_reduce_start) m->device = KILN_CPU;
  if (op == VM_OP_all_reduce_wait) m->device = attr->device;
  if (m->device != KILN_CPU && !vm_backend_usable((kiln_device)m->device)) return false;
  return vm_op_table[op].kind == VM_KIND_LEAF || check_result_size(n, in, m);
}

/* --- the public names errors report ----------------------------------- */

/* errors found while running (an index out of range) name the public call
   that recorded the op (kiln_cross_entropy for its gather), or else the
   op, never the read that flushed it */
static const char *const public_names[VM_OP_COUNT] = {
#define X(name, kind, rule, flags) [VM_OP_##name] = "kiln_" #name,
#include "ops.def"
#undef X
};

const char *vm_op_api(vm_opcode op, const vm_attr *attr) {
  return attr && attr->api ? attr->api : public_names[op];
}
