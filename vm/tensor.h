/* tensor.h — Kiln's tensor: a view (dtype, shape, strides, offset) onto a
 * reference-counted storage.  Owns allocation, lifetime and view geometry;
 * computing values is the op layer's job (vm/ops.h). */
#ifndef VM_TENSOR_H
#define VM_TENSOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "kiln.h"

typedef struct vm_storage {
  atomic_long refs;
  void *data; /* 64-byte aligned */
  size_t nbytes;
  bool inline_data;   /* data follows this header in one allocation */
  kiln_device device; /* where data lives: other devices' data is theirs
                         (vm/backend.h), never read by the host */
} vm_storage;

/* Two roles, one struct.  A *handle* (what users hold, what ops take) names
   a trace node (trace/graph.h) and carries its dtype and shape; its storage
   is NULL.  A *value* (what kernels read and write) has storage and strides
   and no node; values live inside materialized trace nodes and never reach
   users. */
struct kiln_tensor {
  atomic_long refs;
  struct tr_node *node;      /* handles only */
  struct tr_grad_slot *slot; /* handles of leaf variables (autodiff) */
  kiln_dtype dtype;
  int ndim;
  bool weak;      /* a host scalar: does not widen (dtype.h) */
  uint8_t device; /* kiln_device: the node's (handles), the storage's (values) */
  int64_t numel;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS]; /* in elements; 0 for broadcast dims */
  int64_t offset;                 /* in elements, into storage */
  vm_storage *storage;
};
typedef struct kiln_tensor vm_tensor;

/* A released tensor's ndim, until its memory is used again (the thread's
   block cache keeps it): a handle used after kiln_release is an error
   where that is still detectable, never a read of freed memory taken for
   a value (builds with AddressSanitizer free the block at once, and it
   reports the use instead). */
#define VM_RELEASED (-1)
static inline bool vm_released(const vm_tensor *t) { return t->ndim == VM_RELEASED; }

/* The most elements a tensor may have: its bytes, in any dtype, fit in
   int64.  The product of a shape's *nonzero* extents is bounded too, so
   the strides of an empty tensor ([0, 2^40, 2^40]) cannot overflow. */
#define VM_MAX_NUMEL (INT64_MAX / 8)

/* The element count of a shape of extents >= 0 into *numel; false (no
   error set) when the product of its nonzero extents exceeds VM_MAX_NUMEL. */
bool vm_shape_numel(int ndim, const int64_t *shape, int64_t *numel);

/* Checks ndim and sizes (error naming the values on failure) and computes
   the element count.  Returns false with the error set. */
bool vm_check_shape(int ndim, const int64_t *shape, int64_t *numel_out);

/* A new contiguous tensor with uninitialized storage; NULL + error on OOM. */
vm_tensor *vm_tensor_new(kiln_dtype dt, int ndim, const int64_t *shape);
/* the same on device d (through its backend's allocator: NULL + error
   when the device is unavailable or out of memory) */
vm_tensor *vm_tensor_new_on(kiln_device d, kiln_dtype dt, int ndim, const int64_t *shape);
/* A host copy of value v's elements (v itself, retained, when it is on the
   CPU already), with v's geometry; NULL + error on failure.  What every
   reader of values on the host goes through. */
vm_tensor *vm_value_on_host(vm_tensor *v);
/* v's value copied to device d (v itself, retained, when it is there) */
vm_tensor *vm_value_to_device(vm_tensor *v, kiln_device d);
/* A new tensor header viewing base's storage with the given geometry. */
vm_tensor *vm_tensor_view(const vm_tensor *base, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset);

vm_tensor *vm_retain(vm_tensor *t);
void vm_release(vm_tensor *t);
vm_tensor *vm_value_copy(vm_tensor *v);       /* contiguous copy of a value (its device's exec) */
vm_tensor *vm_value_contiguous(vm_tensor *v); /* v itself (retained) if contiguous */
/* a contiguous host copy of v (v itself, retained, when it is one already):
   what the host reads values through */
vm_tensor *vm_value_host_contiguous(vm_tensor *v);
/* trace/ registers how a handle's node is dropped when its last reference
   goes (once, before it makes the first handle): the one call vm/ makes
   upward, through a hook like the backend table */
void vm_set_handle_free(void (*fn)(vm_tensor *t));

static inline void *vm_data(const vm_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)vm_dtype_size(t->dtype);
}
bool vm_is_contiguous(const vm_tensor *t);
/* whether dim (stride_outer) steps as size elements of stride_inner: the
   test that merges two dims, false (no merge) if the product overflows */
static inline bool vm_dims_merge(int64_t stride_outer, int64_t stride_inner, int64_t size) {
  int64_t span;
  return !__builtin_mul_overflow(stride_inner, size, &span) && stride_outer == span;
}
void vm_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* The iteration over shape[nd] coalesced: size-1 dims dropped, a dim
   merged into the one before it where the contiguous layout of shape and
   every operand's strides in[q] (over the nd dims) step through both as
   one.  Writes the dims into shape_out and operand q's strides into
   out[q]; returns how many (>= 1: a single element is one dim of 1, its
   strides 0).  How the compiled kernels (jit_cpu/, jit_gpu/fuse.c) see an
   elementwise group's space. */
int vm_coalesce(int nd, const int64_t *shape, int nops, const int64_t (*in)[KILN_MAX_DIMS],
                int64_t *shape_out, int64_t (*out)[KILN_MAX_DIMS]);

/* An arg-reduction's input v read per output element of shape[nd] (the
   compiled kernels' scan, jit_cpu/ and jit_gpu/fuse.c): its strides over
   the output's dims (the scanned axis kept with size 1, or dropped), with
   the axis' stride and extent in *gstride and *extent; false when v does
   not fit the output or the axis is empty. */
bool vm_scan_strides(const vm_tensor *v, int axis, int nd, const int64_t *shape, int64_t *strides,
                     int64_t *gstride, int64_t *extent);

size_t vm_memory_in_use(void); /* bytes held by live storages */
size_t vm_memory_total(void);  /* the machine's RAM and swap (0: unknown) */

#endif
