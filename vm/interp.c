/* interp.c — the CPU interpreter's entry (cpu_backend.exec): runs one op
 * eagerly on materialized values — views as strided views of their input,
 * collectives through the distributed engine, every other op through its
 * kern_*.c kernel.  It never records: values in, a value out. */
#include "interp.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dist.h"
#include "gemm_bf16.h"
#include "kernels.h"
#include "state.h"

/* Strides that let shape `ns` view a's storage (PyTorch's computeStride);
   false when the layout needs a copy. */
static bool reshape_strides(const vm_tensor *a, int nn, const int64_t *ns, int64_t *out) {
  if (a->numel == 0 || a->ndim == 0) {
    vm_contiguous_strides(nn, ns, out);
    return true;
  }
  int view_d = nn - 1;
  int64_t chunk_stride = a->strides[a->ndim - 1], tensor_numel = 1, view_numel = 1;
  for (int d = a->ndim - 1; d >= 0; d--) {
    tensor_numel *= a->shape[d];
    bool chunk_ends =
        d == 0 || (a->shape[d - 1] != 1 && a->strides[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= ns[view_d];
      view_d--;
    }
    if (view_numel != tensor_numel) return false;
    if (d > 0) {
      chunk_stride = a->strides[d - 1];
      tensor_numel = view_numel = 1;
    }
  }
  return view_d == -1;
}

static vm_tensor *make_view(vm_opcode op, vm_tensor *a, const vm_attr *attr, const vm_meta *m) {
  int64_t strides[KILN_MAX_DIMS] = {0};
  int64_t offset = a->offset;
  switch (op) {
    case VM_OP_reshape: {
      if (reshape_strides(a, m->ndim, m->shape, strides)) break;
      vm_tensor *dense = vm_value_copy(a); /* this layout cannot be viewed */
      if (!dense) return NULL;
      vm_contiguous_strides(m->ndim, m->shape, strides);
      vm_tensor *v = vm_tensor_view(dense, m->ndim, m->shape, strides, 0);
      vm_release(dense);
      return v;
    }
    case VM_OP_permute:
      for (int d = 0; d < a->ndim; d++) strides[d] = a->strides[attr->perm[d]];
      break;
    case VM_OP_expand: {
      int lead = m->ndim - a->ndim;
      for (int d = 0; d < m->ndim; d++) {
        int src = d - lead;
        strides[d] = (src < 0 || a->shape[src] != m->shape[d]) ? 0 : a->strides[src];
      }
      break;
    }
    case VM_OP_slice:
      memcpy(strides, a->strides, sizeof strides);
      if (m->shape[attr->axis] > 0) offset += attr->start * a->strides[attr->axis];
      /* along an axis of 0 or 1 elements the step is never taken (and a
         huge one would overflow); with 2 or more, |step| < len bounds it */
      if (m->shape[attr->axis] > 1) strides[attr->axis] *= attr->step;
      break;
    default:
      return NULL;
  }
  return vm_tensor_view(a, m->ndim, m->shape, strides, offset);
}

static bool run_kernel(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *args,
                       const vm_attr *attr) {
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      return vm_k_leaf(op, out, attr);
    case VM_KIND_UNARY:
      if (op == VM_OP_cast) return vm_k_cast(out, args[0]);
      return vm_k_elementwise(op, out, n, args);
    case VM_KIND_BINARY:
    case VM_KIND_TERNARY:
      return vm_k_elementwise(op, out, n, args);
    case VM_KIND_REDUCE:
      return vm_k_reduce(op, out, args[0], attr);
    case VM_KIND_MATMUL:
      return vm_k_matmul(out, args[0], args[1]);
    case VM_KIND_INDEX:
      return vm_k_index(op, out, n, args, attr);
    case VM_KIND_CONCAT:
      return vm_k_concat(out, n, args, attr->axis);
    case VM_KIND_SORT:
      return vm_k_argsort(out, args[0], attr->axis, attr->keepdim);
    case VM_KIND_CONV:
      return vm_k_conv(op, out, args, attr);
    case VM_KIND_ATTENTION:
      return vm_k_attention(op, out, n, args, attr);
    case VM_KIND_VIEW:
    case VM_KIND_COLLECTIVE:
      break; /* vm_exec runs them */
  }
  return false;
}

/* rand/randn of a half draw f32 values and round them; any op that
   accumulates, should one reach the interpreter over halves (front/op.c
   records them in f32 between casts), runs the same way: its half inputs
   widened into f32 copies, its half result rounded once into out (DESIGN
   §13).  Elementwise ops convert row by row (vm/kern_elementwise.c);
   moves (concat, gathers, index_select) move the 16-bit patterns. */
static bool runs_widened(vm_opcode op, const vm_tensor *out, int n, vm_tensor *const *args) {
  vm_kind kind = vm_op_table[op].kind;
  if (kind == VM_KIND_UNARY || kind == VM_KIND_BINARY || kind == VM_KIND_TERNARY ||
      kind == VM_KIND_CONCAT || (kind == VM_KIND_INDEX && op != VM_OP_scatter_add))
    return false;
  if (kind == VM_KIND_LEAF)
    return vm_dtype_is_half(out->dtype) && op != VM_OP_full && op != VM_OP_arange;
  /* bf16 GEMMs run as themselves where the CPU has AVX512-BF16 */
  if (op == VM_OP_matmul && out->dtype == KILN_BF16 && vm_gemm_bf16_available()) return false;
  if (vm_dtype_is_half(out->dtype)) return true;
  for (int i = 0; i < n; i++)
    if (vm_dtype_is_half(args[i]->dtype)) return true;
  return false;
}

/* t itself, or its f32 copy (with copy: its values; else uninitialized) */
static vm_tensor *widened(vm_tensor *t, bool copy) {
  if (!vm_dtype_is_half(t->dtype)) return vm_retain(t);
  vm_tensor *w = vm_tensor_new(KILN_F32, t->ndim, t->shape);
  if (w && copy && w->numel) vm_k_cast(w, t);
  return w;
}

static bool run_widened(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *args,
                        const vm_attr *attr) {
  vm_tensor **wide = calloc((size_t)n + 1, sizeof *wide);
  if (!wide) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return false;
  }
  bool ok = (wide[n] = widened(out, false)) != NULL;
  for (int i = 0; i < n && ok; i++) ok = (wide[i] = widened(args[i], true)) != NULL;
  if (ok) ok = run_kernel(op, wide[n], n, wide, attr);
  if (ok && wide[n] != out) vm_k_cast(out, wide[n]);
  if (ok && op == VM_OP_rand && vm_dtype_is_half(out->dtype)) {
    /* U[0, 1): a draw just below 1 rounds to 1.0 in a half; it becomes
       the largest half below 1 (out is fresh and contiguous) */
    uint16_t one = out->dtype == KILN_BF16 ? 0x3f80 : 0x3c00;
    uint16_t *h = vm_data(out);
    for (int64_t i = 0; i < out->numel; i++)
      if (h[i] == one) h[i] = (uint16_t)(one - 1);
  }
  for (int i = 0; i <= n; i++) vm_release(wide[i]);
  free(wide);
  return ok;
}

vm_tensor *vm_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                   const vm_meta *m) {
  if (vm_op_table[op].kind == VM_KIND_VIEW) {
    atomic_fetch_add_explicit(&vm_process()->stats.view_ops, 1, memory_order_relaxed);
    return make_view(op, values[0], attr, m);
  }
  atomic_fetch_add_explicit(&vm_process()->stats.eager_ops, 1, memory_order_relaxed);
  const char *api = vm_thread()->api;
  if (vm_op_table[op].kind == VM_KIND_COLLECTIVE) {
    vm_set_api(vm_op_api(op, attr));
    vm_tensor *v = vm_dist_exec(op, n, values, attr, m);
    vm_set_api(api);
    return v;
  }
  vm_tensor *out = vm_tensor_new(m->dtype, m->ndim, m->shape);
  if (!out) return NULL;
  if (out->numel == 0) return out; /* nothing to compute */
  atomic_fetch_add_explicit(&vm_process()->stats.kernels_launched, 1, memory_order_relaxed);
  vm_set_api(vm_op_api(op, attr));
  bool ok = runs_widened(op, out, n, values) ? run_widened(op, out, n, values, attr)
                                             : run_kernel(op, out, n, values, attr);
  vm_set_api(api);
  if (!ok) {
    vm_release(out);
    return NULL;
  }
  return out;
}
