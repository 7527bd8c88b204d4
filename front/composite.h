/* composite.h — ops built from primitives at record time (DESIGN §2):
 * autodiff and the code generators only ever see their primitives. */
#ifndef FE_COMPOSITE_H
#define FE_COMPOSITE_H

#include "op.h"

vm_tensor *fe_relu(vm_tensor *a);
vm_tensor *fe_gelu(vm_tensor *a);
vm_tensor *fe_clamp(vm_tensor *a, double lo, double hi);
vm_tensor *fe_mean(vm_tensor *a, int naxes, const int *axes, bool keepdim);
vm_tensor *fe_softmax(vm_tensor *a, int axis);
vm_tensor *fe_log_softmax(vm_tensor *a, int axis);
vm_tensor *fe_logsumexp(vm_tensor *a, int axis, bool keepdim);
vm_tensor *fe_layer_norm(vm_tensor *x, vm_tensor *w, vm_tensor *b, double eps);
vm_tensor *fe_cross_entropy(vm_tensor *logits, vm_tensor *target);
vm_tensor *fe_mse_loss(vm_tensor *a, vm_tensor *b);
vm_tensor *fe_triangle(vm_tensor *a, int64_t k, bool upper); /* triu, tril */
vm_tensor *fe_isnan(vm_tensor *a);
vm_tensor *fe_isinf(vm_tensor *a);
vm_tensor *fe_isfinite(vm_tensor *a);

vm_tensor *fe_arange_i64(int64_t start, int64_t step, int64_t count, kiln_device d);
vm_tensor *fe_permute(vm_tensor *a, const int *perm);
vm_tensor *fe_transpose(vm_tensor *a, int d0, int d1);
vm_tensor *fe_squeeze(vm_tensor *a, int axis);
vm_tensor *fe_unsqueeze(vm_tensor *a, int axis);
vm_tensor *fe_slice(vm_tensor *a, int axis, int64_t start, int64_t stop, int64_t step);
/* zeros of x's dtype and shape, on x's device */
vm_tensor *fe_zeros_like(const vm_tensor *x);
vm_tensor *fe_concat(int n, vm_tensor *const *ts, int axis);
vm_tensor *fe_stack(int n, vm_tensor *const *ts, int axis);
vm_tensor *fe_index_op(vm_opcode op, vm_tensor *a, int axis, vm_tensor *idx, vm_tensor *src);

/* functionalized in-place updates: rebind dst's handle to the new value */
int fe_assign(vm_tensor *dst, vm_tensor *src);
int fe_sub_scaled(vm_tensor *dst, vm_tensor *src, double alpha);

#endif
