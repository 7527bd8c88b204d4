/* layers.h — the model-building ops of issue 18 (creation helpers, var/std,
 * layers, losses), all composites of existing primitives (DESIGN §2): the
 * recorder, autodiff and both code generators see only primitives. */
#ifndef FE_LAYERS_H
#define FE_LAYERS_H

#include "op.h"

vm_tensor *fe_linspace(double start, double stop, int64_t n, kiln_dtype dt);
vm_tensor *fe_eye(int64_t n, kiln_dtype dt);
vm_tensor *fe_randint(int64_t low, int64_t high, kiln_dtype dt, int ndim, const int64_t *shape);
vm_tensor *fe_randperm(int64_t n);
vm_tensor *fe_clone(vm_tensor *a);

vm_tensor *fe_var(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim);
vm_tensor *fe_cumsum(vm_tensor *a, int axis);
vm_tensor *fe_sort(vm_tensor *a, int axis, bool descending, vm_tensor **indices);
vm_tensor *fe_topk(vm_tensor *a, int64_t k, int axis, bool largest, vm_tensor **indices);
vm_tensor *fe_std(vm_tensor *a, int naxes, const int *axes, int correction, bool keepdim);

vm_tensor *fe_conv2d(vm_tensor *x, vm_tensor *w, vm_tensor *b, const int stride[2],
                     const int padding[2], const int dilation[2], int groups);
vm_tensor *fe_pool2d(vm_tensor *x, bool max, const int kernel[2], const int stride[2],
                     const int padding[2]);
vm_tensor *fe_batch_norm(vm_tensor *x, vm_tensor *running_mean, vm_tensor *running_var,
                         vm_tensor *w, vm_tensor *b, bool training, double momentum, double eps);
/* kiln_scaled_dot_product_attention (front/attention.c) */
vm_tensor *fe_attention(vm_tensor *q, vm_tensor *k, vm_tensor *v, vm_tensor *mask, bool causal,
                        double scale);
/* fe_op's matmul(p, v): the attention op when p is attention's softmax
   written the long way, else NULL (no error) */
vm_tensor *fe_attention_of_matmul(vm_tensor *p, vm_tensor *v);
vm_tensor *fe_dropout(vm_tensor *x, double p, bool training);
vm_tensor *fe_embedding(vm_tensor *weight, vm_tensor *idx);
vm_tensor *fe_one_hot(vm_tensor *idx, int64_t num_classes, kiln_dtype dt);
vm_tensor *fe_nll_loss(vm_tensor *log_probs, vm_tensor *target);
vm_tensor *fe_bce_with_logits(vm_tensor *logits, vm_tensor *target);

#endif
