/* kernels.h — the eager CPU kernels (the interpreter's engines), one entry
 * per op kind.  Inputs arrive already converted to the op's compute dtype
 * (fe_op does that); outputs are fresh contiguous tensors.  A kernel returns
 * false with the error set only for value-dependent failures (an index out of
 * range); everything shape- or dtype-related was checked before. */
#ifndef VM_KERNELS_H
#define VM_KERNELS_H

#include "ops.h"

bool vm_k_leaf(vm_opcode op, vm_tensor *out, const vm_attr *attr);
bool vm_k_elementwise(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *in);
bool vm_k_cast(vm_tensor *out, const vm_tensor *in);
bool vm_k_reduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr);
bool vm_k_matmul(vm_tensor *out, const vm_tensor *a, const vm_tensor *b);
/* every value of idx (i64, any layout) in [0, size); false + KILN_ERR_ARG
   ("index 12 is out of range for axis 1 of size 10") otherwise */
bool vm_check_indices(const vm_tensor *idx, int64_t size, int axis);
bool vm_k_index(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *in, const vm_attr *attr);
bool vm_k_concat(vm_tensor *out, int n, vm_tensor *const *in, int axis);
bool vm_k_argsort(vm_tensor *out, const vm_tensor *a, int axis, bool descending);
/* conv2d, conv2d_input, conv2d_weight (ops.def): out from args[0..1] */
bool vm_k_conv(vm_opcode op, vm_tensor *out, vm_tensor *const *args, const vm_attr *attr);
/* attention, attention_grad (ops.def): any strides in, out contiguous */
bool vm_k_attention(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *args,
                    const vm_attr *attr);

/* A list of (size, stride) dims, size-1 dims dropped and a dim merged into
   the one before it where their strides allow: how a reduction sees its
   kept and its reduced dims (vm/kern_reduce.c; jit_gpu/opgen.c plans the
   GPU's reductions over the same lists, so both fold in one order). */
typedef struct vm_dims {
  int n;
  int64_t size[KILN_MAX_DIMS], stride[KILN_MAX_DIMS];
} vm_dims;

static inline void vm_dims_push(vm_dims *d, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (d->n > 0 && vm_dims_merge(d->stride[d->n - 1], stride, size)) {
    d->size[d->n - 1] *= size;
    d->stride[d->n - 1] = stride;
    return;
  }
  d->size[d->n] = size;
  d->stride[d->n] = stride;
  d->n++;
}

static inline int64_t vm_dims_count(const vm_dims *d) {
  int64_t c = 1;
  for (int i = 0; i < d->n; i++) c *= d->size[i];
  return c;
}

/* Strided iteration shared by the kernels: operand 0 is the output, the
   rest are inputs broadcast to its shape (stride 0 on broadcast dims).
   Dimensions are coalesced where every operand allows it. */
typedef struct vm_iter {
  int nops, ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[4][KILN_MAX_DIMS]; /* in elements */
  char *base[4];
  int esize[4];
} vm_iter;

void vm_iter_init(vm_iter *it, int nops, vm_tensor *const *ops);
/* calls row(ctx, ptrs, inner_strides, count) over the flat range [begin, end) */
typedef void (*vm_row_fn)(void *ctx, char **ptrs, const int64_t *strides, int64_t count);
void vm_iter_range(const vm_iter *it, int64_t begin, int64_t end, vm_row_fn row, void *ctx);
/* runs the whole iteration, in parallel for large tensors */
void vm_iter_run(const vm_iter *it, vm_row_fn row, void *ctx);

/* f32 transcendentals (kern_math.c): the row computing op (exp, log, tanh,
   sigmoid, sin, cos, erf, log1p, expm1, pow) as compiled kernels do on this
   machine, or NULL for other ops; one value, with or without fma (tests) */
vm_row_fn vm_math_row_f32(vm_opcode op);
float vm_math_f32(vm_opcode op, bool fma, float x, float y);

#endif
