/* ad.h — reverse-mode autodiff on the recorded graph (DESIGN §7).  The
 * trace nodes are the tape: a node whose inputs require grad is tracked and
 * keeps its inputs; backward walks tracked nodes in reverse creation order
 * and applies each primitive's VJP rule (vjp.c), which emits ordinary ops. */
#ifndef AD_H
#define AD_H

#include "../trace/tape.h"

/* one node's VJP: gradient of input k, given the output's gradient g */
typedef struct ad_ctx {
  vm_opcode op;
  const vm_attr *attr;
  vm_tensor **x; /* input handles */
  vm_tensor *y;  /* output handle */
  vm_tensor *g;  /* gradient of y */
  /* NULL, or a slot (NULL at first) where a rule keeps the one value the
     gradients of all the node's inputs come from, for the calls for the
     node's other inputs (attention's packed dq | dk | dv); the caller
     releases it */
  vm_tensor **memo;
} ad_ctx;

/* *out: the gradient (shape and dtype of input k), or NULL for none.
   false with the error set if building it failed. */
bool ad_vjp(const ad_ctx *c, int k, vm_tensor **out);
vm_tensor *ad_sum_to(vm_tensor *g, const vm_tensor *x);

int ad_set_requires_grad(vm_tensor *t, bool on);
bool ad_requires_grad(const vm_tensor *t);
int ad_backward(vm_tensor *loss, vm_tensor *grad);
vm_tensor *ad_grad(vm_tensor *leaf);
int ad_zero_grad(vm_tensor *leaf);
int ad_set_grad(vm_tensor *leaf, vm_tensor *g); /* kiln_set_grad */
int ad_grad_of(int nout, vm_tensor *const *outs, vm_tensor *const *gouts, int nin,
               vm_tensor *const *ins, vm_tensor **grads, bool create_graph);
vm_tensor *ad_detach(vm_tensor *t);
/* kiln_unscale_grads (scale.c) */
int ad_unscale_grads(int n, vm_tensor *const *params, double inv_scale, bool *found_inf);
/* kiln_dist_average_grads (dist.c) */
int ad_average_grads(int n, vm_tensor *const *params);

#endif
