/* ops.h — the primitive op table (generated from ops.def), op attributes,
 * and shape/dtype/device inference: what every layer knows about an op.
 * Ops enter the runtime through the front-end (front/op.h: fe_op records
 * them); the interpreter (interp.h) runs them. */
#ifndef VM_OPS_H
#define VM_OPS_H

#include <string.h>

#include "tensor.h"

typedef enum {
#define X(name, kind, rule, flags) VM_OP_##name,
#include "ops.def"
#undef X
  VM_OP_COUNT
} vm_opcode;

typedef enum {
  VM_KIND_LEAF,
  VM_KIND_UNARY,
  VM_KIND_BINARY,
  VM_KIND_TERNARY,
  VM_KIND_REDUCE,
  VM_KIND_MATMUL,
  VM_KIND_VIEW,
  VM_KIND_INDEX,
  VM_KIND_CONCAT,
  VM_KIND_SORT,
  VM_KIND_COLLECTIVE,
  VM_KIND_CONV,
  VM_KIND_ATTENTION
} vm_kind;

typedef enum {
  VM_DT_ATTR,    /* attr.dtype */
  VM_DT_SAME,    /* the input's dtype */
  VM_DT_FLOAT,   /* the input's if float, else f32 */
  VM_DT_PROMOTE, /* the promoted dtype of the inputs */
  VM_DT_TRUEDIV, /* promoted, but integer/bool -> f32 */
  VM_DT_COMPARE, /* bool, computed in the promoted dtype */
  VM_DT_LOGICAL, /* bool, inputs read as "nonzero" */
  VM_DT_WHERE,   /* promoted(a, b); cond must be bool */
  VM_DT_SUM,     /* integer/bool -> i64, floats keep theirs */
  VM_DT_INDEX    /* i64 */
} vm_dtype_rule;

#define VM_F_NO_BOOL 1u
/* what the op's VJP reads (ops.def explains) */
#define VM_F_SAVE_IN 2u
#define VM_F_SAVE_IN0 4u
#define VM_F_SAVE_IN1 8u
#define VM_F_SAVE_OTHER 16u
#define VM_F_SAVE_OUT 32u
/* an ordered effect (ops.def) */
#define VM_F_EFFECT 64u

typedef struct vm_op_info {
  const char *name;
  vm_kind kind;
  vm_dtype_rule rule;
  unsigned flags;
} vm_op_info;

extern const vm_op_info vm_op_table[VM_OP_COUNT];

/* a gather or an index_select: reads in[0] at positions in[1] names */
static inline bool vm_op_gathers(vm_opcode op) {
  return op == VM_OP_gather || op == VM_OP_index_select;
}
/* an arg-reduction: argmax or argmin */
static inline bool vm_op_scans(vm_opcode op) { return op == VM_OP_argmax || op == VM_OP_argmin; }

/* Attributes of one op call.  Fields that change the generated code (axes,
   shapes, permutation, slice bounds, dtype) are key material for the trace
   layer; host scalars and RNG counters are runtime parameters. */
typedef struct vm_attr {
  kiln_dtype dtype; /* cast, leaves */
  int ndim;         /* leaves, reshape, expand */
  int64_t shape[KILN_MAX_DIMS];
  int perm[KILN_MAX_DIMS];   /* permute */
  int axis;                  /* slice, index ops, concat, argmax/argmin */
  uint32_t axes_mask;        /* reductions: bit d set = axis d reduced */
  bool keepdim;              /* reductions; argsort: descending */
  bool weak;                 /* full: a scalar (does not widen) */
  uint8_t device;            /* leaves: the kiln_device they are made on */
  bool host;                 /* full: a value the host passed: a runtime
                                parameter, never key material, never
                                simplified (DESIGN §4); else a literal */
  int64_t start, stop, step; /* slice, already normalized */
  double scalar[2];          /* full: value; arange: start, step */
  uint64_t seed, counter;    /* rand, randn */
  const char *api;           /* the public call that recorded the op: names errors
                                found while running it (never key material) */
} vm_attr;

/* A window op's output extent along one axis (PyTorch's floor rule):
   input `in` padded by `pad` on both sides, a window of k taps `dil` apart,
   stride `stride`; < 1 when the padded input is smaller than the window */
static inline int64_t vm_window_out(int64_t in, int64_t k, int64_t stride, int64_t pad,
                                    int64_t dil) {
  int64_t span = in + 2 * pad - (dil * (k - 1) + 1);
  return span < 0 ? 0 : span / stride + 1;
}

/* Result description computed by shape/dtype inference. */
typedef struct vm_meta {
  kiln_dtype dtype;   /* of the result */
  bool weak;          /* the result is a host scalar */
  kiln_dtype compute; /* dtype the inputs are brought to before the kernel */
  uint8_t device;     /* kiln_device the result lives on (its inputs' one) */
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
} vm_meta;

/* a and b have the same shape (dtypes aside) */
static inline bool vm_meta_same_shape(const vm_meta *a, const vm_meta *b) {
  return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t));
}

/* the public call an error while computing op names: the one that
   recorded it (attr->api), else "kiln_<op>" */
const char *vm_op_api(vm_opcode op, const vm_attr *attr);

/* Shape and dtype inference alone (also used by the trace layer). */
/* the device of an op over in[0..n): that of its inputs, which must agree
   (0-d weak scalars go anywhere: fe_op moves them); false + KILN_ERR_DEVICE
   naming both devices otherwise */
bool vm_infer_device(int n, vm_tensor *const *in, kiln_device *d);
/* where new tensors go: KILN_DEVICE (cpu, cuda), read once; false +
   KILN_ERR_ARG when it names no device */
bool vm_default_device(kiln_device *d);
bool vm_infer(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr, vm_meta *out);

/* ndim in [0, KILN_MAX_DIMS] and shape non-NULL when needed (user arguments) */
bool vm_check_dims_arg(int ndim, const int64_t *shape);
/* normalizes a possibly negative axis for ndim dims; error if out of range */
bool vm_norm_axis(int *axis, int ndim);
/* numpy broadcasting of two shapes into out; error naming both if impossible */
bool vm_broadcast_shapes(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout,
                         int64_t *out);

#endif
