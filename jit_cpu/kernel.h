/* kernel.h — internal to jit_cpu/: which nodes of a group a kernel
 * computes, what it reads and writes, and the emitter. */
#ifndef CPU_KERNEL_H
#define CPU_KERNEL_H

#include "codegen.h"

#define KERNEL_MAX_IO 32
#define KERNEL_MAX_NODES 4096

typedef struct kernel_shape {
  int nin, nout, nparams;
  int ins[KERNEL_MAX_IO];          /* plan refs read */
  uint8_t stride_class[KERNEL_MAX_IO];
  int outs[KERNEL_MAX_IO];         /* plan nodes written */
  int params[KERNEL_MAX_IO];       /* full nodes */
  bool compute[KERNEL_MAX_NODES];  /* per node of the group: computed by the kernel */
  int reduce;                      /* the reduction node of a reduce kernel, or -1 */
  int resume;                      /* the group's nodes from here on stay interpreted */
} kernel_shape;

bool kernel_emit_reduce(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                        const kernel_shape *ks, const char *name);
/* the reduction's input as (kept rows, reduced count) when the reduced axes
   are its trailing non-trivial dims; false otherwise */
bool kernel_reduce_split(const tr_pnode *r, const vm_meta *in, int64_t *rows, int64_t *count);
/* the dtype a reduce kernel accumulates in (f64 for f32 sums and products) */
kiln_dtype kernel_reduce_acc_dtype(vm_opcode op, kiln_dtype out);
/* reduced positions per chunk when a row is split (a multiple of the block) */
#define KERNEL_REDUCE_CHUNK ((int64_t)1 << 16)

bool kernel_plan(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                 kernel_shape *ks);
bool kernel_emit(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                 const char *name);

#endif
