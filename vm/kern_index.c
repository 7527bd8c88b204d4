/* kern_index.c — data movement for the interpreter: index_select, gather,
 * scatter_add (gather's adjoint) and concat.  Index values are checked here,
 * the only place they are known: an index outside [0, size) is an error. */
#include <string.h>

#include "kernels.h"
#include "state.h"

/* checks every index in idx (i64, any layout) against size */
static bool check_indices(const vm_tensor *idx, int64_t size, int axis) {
  vm_iter it;
  vm_tensor *ops[1] = {(vm_tensor *)idx};
  vm_iter_init(&it, 1, ops);
  int64_t total = idx->numel, pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < total; f++) {
    int64_t off = 0;
    for (int d = 0; d < it.ndim; d++) off += pos[d] * it.strides[0][d];
    int64_t v = ((const int64_t *)it.base[0])[off];
    if (v < 0 || v >= size) {
      vm_error(KILN_ERR_ARG, "index %lld is out of range for axis %d of size %lld", (long long)v,
               axis, (long long)size);
      return false;
    }
    for (int d = it.ndim - 1; d >= 0 && ++pos[d] == it.shape[d]; d--) pos[d] = 0;
  }
  return true;
}

static void copy_elem(char *dst, const char *src, size_t es) {
  switch (es) {
    case 1: *dst = *src; break;
    case 4: memcpy(dst, src, 4); break;
    default: memcpy(dst, src, 8); break;
  }
}

/* out[i...] = a[i... with position axis replaced by pick(i...)], over out's
   shape; pick reads idx either at i's axis coordinate (index_select) or at
   i itself (gather) */
static void gather_like(vm_tensor *out, const vm_tensor *a, const vm_tensor *idx, int axis,
                        bool elementwise_idx) {
  size_t es = vm_dtype_size(a->dtype);
  const char *ab = vm_data(a);
  const int64_t *ib = vm_data(idx);
  char *ob = vm_data(out);
  int nd = out->ndim;
  int64_t pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < out->numel; f++) {
    int64_t ioff = 0, aoff = 0;
    if (elementwise_idx)
      for (int d = 0; d < nd; d++) ioff += pos[d] * idx->strides[d];
    else
      ioff = pos[axis] * idx->strides[0];
    for (int d = 0; d < nd; d++) aoff += (d == axis ? ib[ioff] : pos[d]) * a->strides[d];
    copy_elem(ob + f * (int64_t)es, ab + aoff * (int64_t)es, es);
    for (int d = nd - 1; d >= 0 && ++pos[d] == out->shape[d]; d--) pos[d] = 0;
  }
}

static void scatter_add(vm_tensor *out, const vm_tensor *idx, const vm_tensor *src, int axis) {
  int nd = out->ndim;
  const int64_t *ib = vm_data(idx);
  const char *sb = vm_data(src);
  char *ob = vm_data(out);
  int64_t pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < idx->numel; f++) {
    int64_t ioff = 0, soff = 0, ooff = 0;
    for (int d = 0; d < nd; d++) {
      ioff += pos[d] * idx->strides[d];
      soff += pos[d] * src->strides[d];
    }
    for (int d = 0; d < nd; d++) ooff += (d == axis ? ib[ioff] : pos[d]) * out->strides[d];
    switch (out->dtype) {
      case KILN_BOOL: ((bool *)ob)[ooff] |= ((const bool *)sb)[soff]; break;
      case KILN_I32:
        ((int32_t *)ob)[ooff] = (int32_t)((uint32_t)((int32_t *)ob)[ooff] +
                                          (uint32_t)((const int32_t *)sb)[soff]);
        break;
      case KILN_I64:
        ((int64_t *)ob)[ooff] = (int64_t)((uint64_t)((int64_t *)ob)[ooff] +
                                          (uint64_t)((const int64_t *)sb)[soff]);
        break;
      case KILN_F32: ((float *)ob)[ooff] += ((const float *)sb)[soff]; break;
      case KILN_F64: ((double *)ob)[ooff] += ((const double *)sb)[soff]; break;
    }
    for (int d = nd - 1; d >= 0 && ++pos[d] == idx->shape[d]; d--) pos[d] = 0;
  }
}

bool vm_k_index(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *in, const vm_attr *attr) {
  (void)n;
  const vm_tensor *a = in[0], *idx = in[1];
  int axis = attr->axis;
  if (!check_indices(idx, a->shape[axis], axis)) return false;
  switch (op) {
    case VM_OP_index_select: gather_like(out, a, idx, axis, false); return true;
    case VM_OP_gather: gather_like(out, a, idx, axis, true); return true;
    case VM_OP_scatter_add:
      if (!vm_k_elementwise(VM_OP_copy, out, 1, (vm_tensor *const *)in)) return false;
      scatter_add(out, idx, in[2], axis);
      return true;
    default: return false;
  }
}

bool vm_k_concat(vm_tensor *out, int n, vm_tensor *const *in, int axis) {
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, out->shape, sizeof shape);
    shape[axis] = in[i]->shape[axis];
    if (shape[axis] == 0) continue;
    vm_tensor *part = vm_tensor_view(out, out->ndim, shape, out->strides, at * out->strides[axis]);
    if (!part) return false;
    vm_tensor *pair[1] = {in[i]};
    bool ok = vm_k_elementwise(VM_OP_copy, part, 1, pair);
    vm_release(part);
    if (!ok) return false;
    at += in[i]->shape[axis];
  }
  return true;
}
