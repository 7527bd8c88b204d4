/* kernel.h — internal to jit_cpu/: which nodes of a group a kernel
 * computes, what it reads and writes, and the emitter. */
#ifndef CPU_KERNEL_H
#define CPU_KERNEL_H

#include <string.h>

#include "../vm/fold.h"
#include "codegen.h"

/* buffers a kernel reads or writes (and params it takes): a trace with many
   host scalars has a constants group writing one 0-d buffer per scalar and
   a kernel reading them all (W5: 100); at 32 such plans ran interpreted */
#define KERNEL_MAX_IO 256
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
  int last_group, last_node;       /* the last plan group and node the kernel covers */
  bool rowwise;                    /* a row kernel (kernel_plan_rows) */
  bool cols;                       /* a column reduction (kernel_emit_reduce_cols) */
  bool per_elem[KERNEL_MAX_NODES]; /* row kernels: the node varies along the reduced axes */
  int8_t stash[KERNEL_MAX_NODES];  /* row kernels: scratch slot + 1 of a value kept between passes */
  int nstash;
} kernel_shape;

/* empties ks for a kernel over n nodes: the counts and flags, and the
   per-node arrays' first n entries only (the arrays are sized for the
   largest kernel, some 15 KiB; clearing all of them for every group of
   every new plan was a tenth of a varying-length RNN's step) */
static inline void kernel_shape_clear(kernel_shape *ks, int n) {
  if (n < 0) n = 0;
  if (n > KERNEL_MAX_NODES) n = KERNEL_MAX_NODES;
  ks->nin = ks->nout = ks->nparams = 0;
  ks->reduce = ks->resume = ks->last_group = ks->last_node = 0;
  ks->rowwise = ks->cols = false;
  ks->nstash = 0;
  memset(ks->compute, 0, (size_t)n * sizeof *ks->compute);
  memset(ks->per_elem, 0, (size_t)n * sizeof *ks->per_elem);
  memset(ks->stash, 0, (size_t)n * sizeof *ks->stash);
}

/* row kernels keep at most this many per-element values in a row scratch
   (8 bytes x count each) instead of recomputing them in later passes */
#define KERNEL_MAX_STASH 4

/* A row kernel fuses a run of groups g..gb — reductions over the trailing
 * axes of one shape R (keepdim), their epilogues, and elementwise groups
 * over R or over the reduced shape — into one loop over the kept rows:
 * per row, a pass over the reduced positions for each reduction (its
 * producers recomputed in the pass), the row-level nodes in between, and a
 * last pass that stores the values read after the run.  A row stays in
 * cache across its passes, so softmax or layer_norm read their input from
 * memory once.  A single reduce group with an epilogue is a row kernel too
 * (its epilogue then runs compiled).  A costly value (a transcendental
 * function, a division) needed by several passes is computed once per row
 * and kept in a scratch row (bufs[nout + nin], KERNEL_MAX_STASH slots of
 * 8 x count bytes, one per call of the kernel) instead of being recomputed.
 * Returns gb (>= g), or -1 when no such run starts at g. */
int kernel_plan_rows(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                     kernel_shape *ks);
bool kernel_emit_rows(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                      const char *name);

bool kernel_emit_reduce(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                        const kernel_shape *ks, const char *name);
/* the reduction's input as (kept rows, reduced count) when the reduced axes
   are its trailing non-trivial dims; false otherwise */
bool kernel_reduce_split(const tr_pnode *r, const vm_meta *in, int64_t *rows, int64_t *count);
/* the reduction's input as (outer kept, reduced count, inner kept) when
   the reduced axes are one run of its non-trivial dims; false otherwise */
bool kernel_reduce_split3(const tr_pnode *r, const vm_meta *in, int64_t *outer, int64_t *count,
                          int64_t *inner);
/* inner positions per work item of a column reduction */
#define KERNEL_COLS 256
bool kernel_emit_reduce_cols(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                             const kernel_shape *ks, const char *name);
/* the dtype a reduce kernel accumulates in (f64 for f32 sums and products) */
kiln_dtype kernel_reduce_acc_dtype(vm_opcode op, kiln_dtype out);
/* reduced positions per chunk when a row is split (a multiple of the block) */
#define KERNEL_REDUCE_CHUNK VM_FOLD_CHUNK

bool kernel_plan(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                 kernel_shape *ks);
bool kernel_emit(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                 const char *name);

/* A kernel's own description (DESIGN §4): its nodes alone, numbered from
 * its first node, its inputs as -(q+1) in the order it reads them, and its
 * kernel_shape in the same numbering — no plan-global index, no group
 * number, no extent.  The emitters run on this local plan, which is built
 * from nothing but the fields the key bytes hold (a node's op, dtype and
 * inputs; per input its dtype and stride class; outputs, params, the
 * reduction, computed / per-element / kept flags, the kernel kind), so
 * two kernels with equal bytes generate the same code: a wrong cache hit
 * cannot happen by a field the key misses. */
typedef struct kernel_desc {
  tr_plan plan;       /* nodes and one group, local numbering */
  tr_group group;
  cpu_leaf *leaves;   /* its inputs (dtype only) */
  kernel_shape ks;    /* local numbering */
  uint8_t *bytes;     /* salt + the description: what the key hashes */
  size_t len;
  uint64_t key[2];    /* XXH3-128 of bytes */
  char name[40];      /* the function's symbol: "kiln_<32 hex of key>" */
} kernel_desc;

/* the description of the kernel ks of group g; salt (versions, target)
   goes first into the bytes.  NULL when it cannot be described (OOM, an
   input the shape does not list) */
kernel_desc *kernel_desc_new(const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                             const void *salt, size_t salt_len);
/* the description whose bytes (salt_len bytes of salt first) are these,
   rebuilt from them alone (the compiler process receives nothing else);
   NULL when they are not exactly what kernel_desc_new writes for some
   kernel */
kernel_desc *kernel_desc_parse(const uint8_t *bytes, size_t len, size_t salt_len);
bool kernel_desc_emit(cg_ctx *c, const kernel_desc *d);
/* what kind of kernel it is, for messages */
const char *kernel_desc_kind(const kernel_desc *d);
void kernel_desc_free(kernel_desc *d);

#endif
