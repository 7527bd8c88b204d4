/* op.h — the op front-end: every op, primitive or composite, enters the
 * runtime here.  fe_op checks an op call, infers its result (vm/ops.h) and
 * records it into the calling thread's pending graph (trace/record.h); the
 * makers below build the common calls, and the handle makers turn host
 * values and scalars into handles. */
#ifndef FE_OP_H
#define FE_OP_H

#include "../vm/ops.h"

/* The entry of every op: checks the inputs (errors name the op and the
   values), infers the result, and records it into the calling thread's
   pending graph (trace/record.h).  Returns a new pending handle, or NULL with
   the error set.  attr may be NULL for ops without attributes. */
vm_tensor *fe_op(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr);

/* conveniences over fe_op */
vm_tensor *fe_unary(vm_opcode op, vm_tensor *a);
vm_tensor *fe_binary(vm_opcode op, vm_tensor *a, vm_tensor *b);
/* a scalar the library writes (a literal: its value is key material, and
   exact identities such as x * 1 fold it away) */
vm_tensor *fe_binary_scalar(vm_opcode op, vm_tensor *a, double s, bool is_int);
/* a scalar the user passed (a runtime parameter: one key for every value) */
vm_tensor *fe_binary_host_scalar(vm_opcode op, vm_tensor *a, double s, bool is_int);
vm_tensor *fe_cast(vm_tensor *a, kiln_dtype dt);
vm_tensor *fe_reduce(vm_opcode op, vm_tensor *a, int naxes, const int *axes, bool keepdim);
vm_tensor *fe_reshape(vm_tensor *a, int ndim, const int64_t *shape);
vm_tensor *fe_expand(vm_tensor *a, int ndim, const int64_t *shape);

/* a handle for host value v (takes the reference) on device d: how data
   made on the host (kiln_from_data, loads, index tables) reaches a device */
vm_tensor *fe_handle_from_host(vm_tensor *v, kiln_device d);
/* 0-d host scalar handle (weak): f64 when !is_int, i64 when is_int */
vm_tensor *fe_weak_scalar(double v, bool is_int); /* a literal of the library */
vm_tensor *fe_host_scalar(double v, bool is_int); /* a value the user passed */
/* either, made directly in dtype dt (a float tensor's own: no cast node) */
vm_tensor *fe_weak_scalar_of(double v, kiln_dtype dt, bool host);
/* for tests: the storage a handle's value lives in (views share it);
   evaluates the handle */
const void *fe_storage_id(const vm_tensor *t);

#endif
