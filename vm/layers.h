/* layers.h — the model-building ops of issue 18 (creation helpers, var/std,
 * layers, losses), all composites of existing primitives (DESIGN §2): the
 * recorder, autodiff and both code generators see only primitives. */
#ifndef VM_LAYERS_H
#define VM_LAYERS_H

#include "ops.h"

vm_tensor *vm_linspace(double start, double stop, int64_t n, kiln_dtype dt);
vm_tensor *vm_eye(int64_t n, kiln_dtype dt);
vm_tensor *vm_randint(int64_t low, int64_t high, kiln_dtype dt, int ndim, const int64_t *shape);
vm_tensor *vm_randperm(int64_t n);
vm_tensor *vm_clone(vm_tensor *a);

vm_tensor *vm_var(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim);
vm_tensor *vm_cumsum(vm_tensor *a, int axis);
vm_tensor *vm_sort(vm_tensor *a, int axis, bool descending, vm_tensor **indices);
vm_tensor *vm_topk(vm_tensor *a, int64_t k, int axis, bool largest, vm_tensor **indices);
vm_tensor *vm_std(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim);

vm_tensor *vm_conv2d(vm_tensor *x, vm_tensor *w, vm_tensor *b, const int stride[2],
                     const int padding[2], const int dilation[2], int groups);
vm_tensor *vm_pool2d(vm_tensor *x, bool max, const int kernel[2], const int stride[2],
                     const int padding[2]);
vm_tensor *vm_batch_norm(vm_tensor *x, vm_tensor *running_mean, vm_tensor *running_var,
                         vm_tensor *w, vm_tensor *b, bool training, double momentum, double eps);
vm_tensor *vm_dropout(vm_tensor *x, double p, bool training);
vm_tensor *vm_embedding(vm_tensor *weight, vm_tensor *idx);
vm_tensor *vm_one_hot(vm_tensor *idx, int64_t num_classes, kiln_dtype dt);
vm_tensor *vm_nll_loss(vm_tensor *log_probs, vm_tensor *target);
vm_tensor *vm_bce_with_logits(vm_tensor *logits, vm_tensor *target);

#endif
