/* interp.h — the CPU interpreter's entry (interp.c): cpu_backend.exec. */
#ifndef VM_INTERP_H
#define VM_INTERP_H

#include "ops.h"

/* The interpreter's step: runs op eagerly on materialized *values* (already
   in the dtypes the op computes in) and returns a new value, or NULL with
   the error set (value-dependent failures such as an index out of range). */
vm_tensor *vm_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                   const vm_meta *m);

#endif
