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
/* a scatter_add compiles in place while its index spans at most this many
   elements along the axis (each output element sums over all of them) */
#define KERNEL_SCATTER_MAX 16
#define KERNEL_MAX_NODES 4096
#define KERNEL_BOUND_OUT (-2)

/* How a kernel reads an input (kernel_shape.in_role).  Some data movement
 * is computed in place, elementwise over the output (trace/plan.c
 * in_place):
 * - a gather or an index_select is an indirect load: its source is read at
 *   the position of the output element with the gathered axis' coordinate
 *   replaced by the index value, so the runner passes the source's strides
 *   with that axis' stride zeroed and the axis' stride apart (the kernel
 *   adds index x it); index_select's 1-d index is read along the gathered
 *   axis only;
 * - a scatter_add adds to its base, for k along the axis in order, the
 *   source at k wherever the index at k names the output's coordinate
 *   (index and source read as a gather's source is, plus their extent k <
 *   m along the axis);
 * - a concat picks among its parts' values at the output coordinate less
 *   the extents of the parts before (each part read as a gather's source
 *   is, at a coordinate clamped into it, plus its extent);
 * - an argmax or argmin scans its input along the reduced axis (read as a
 *   gather's source is, that axis dropped when the output does not keep
 *   it, plus its extent).
 * The output's coordinate along the axis is an input of its own, with no
 * buffer: its strides are 1 along the axis and 0 elsewhere, so its
 * position is the coordinate, and the runner's merging of dims keeps the
 * axis apart.  A value read in two roles is two inputs. */
enum {
  KERNEL_IN_PLAIN = 0,         /* broadcast to the iteration space (right-aligned) */
  KERNEL_IN_SOURCE = 1,        /* a gather's / index_select's source */
  KERNEL_IN_SELECT = 2,        /* index_select's index, along the gathered axis */
  KERNEL_IN_COORD = 3,         /* the output's coordinate along the kernel's axis (no buffer) */
  KERNEL_IN_SCATTER_INDEX = 4, /* scatter_add's index */
  KERNEL_IN_SCATTER_SRC = 5,   /* scatter_add's source */
  KERNEL_IN_PART = 6,          /* a concat's part */
  KERNEL_IN_SCAN = 7,          /* an argmax's / argmin's input: its reduced axis scanned */
  KERNEL_IN_ROLES
};

/* the kernel reads the input's position, not its value (and loads itself) */
static inline bool kernel_role_positional(uint8_t role) {
  return role != KERNEL_IN_PLAIN && role != KERNEL_IN_SELECT;
}
/* the runner passes the axis' stride apart (meta, after the strides) */
static inline bool kernel_role_moves(uint8_t role) {
  return kernel_role_positional(role) && role != KERNEL_IN_COORD;
}
/* ... and its extent along the axis (after those strides) */
static inline bool kernel_role_extent(uint8_t role) {
  return kernel_role_moves(role) && role != KERNEL_IN_SOURCE;
}
/* an in-place op that reads the output's coordinate */
static inline bool kernel_needs_coord(vm_opcode op) {
  return op == VM_OP_scatter_add || op == VM_OP_concat;
}

typedef struct kernel_shape {
  int nin, nout, nparams;
  int ins[KERNEL_MAX_IO]; /* plan refs read */
  uint8_t stride_class[KERNEL_MAX_IO];
  uint8_t in_role[KERNEL_MAX_IO];  /* KERNEL_IN_*: part of the kernel's description */
  int8_t in_axis[KERNEL_MAX_IO];   /* inputs not PLAIN: the axis of their op (runner only) */
  int16_t in_bound[KERNEL_MAX_IO]; /* an index input: the source whose axis bounds it,
                                      KERNEL_BOUND_OUT: the output's extent along its axis, else -1
                                      (runner only) */
  int outs[KERNEL_MAX_IO];         /* plan nodes written */
  int params[KERNEL_MAX_IO];       /* full nodes */
  bool compute[KERNEL_MAX_NODES];  /* per node of the group: computed by the kernel */
  int first_node;                  /* the kernel's first node (its group's, or its epilogue's) */
  int span_kind;             /* what its nodes are: the group's kind (an epilogue: elementwise) */
  int reduce;                /* the reduction node of a reduce kernel, or -1 */
  int resume;                /* the group's nodes from here on stay interpreted */
  int last_group, last_node; /* the last plan group and node the kernel covers */
  bool rowwise;              /* a row kernel (kernel_plan_rows) */
  bool cols;                 /* a column reduction (kernel_emit_reduce_cols) */
  bool per_elem[KERNEL_MAX_NODES]; /* row kernels: the node varies along the reduced axes */
  int8_t stash[KERNEL_MAX_NODES]; /* row kernels: scratch slot + 1 of a value kept between passes */
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

/* the role in which node p reads its input k */
static inline uint8_t kernel_arg_role(const tr_pnode *p, int k) {
  if (vm_op_gathers(p->op))
    return k == 0                        ? KERNEL_IN_SOURCE
           : p->op == VM_OP_index_select ? KERNEL_IN_SELECT
                                         : KERNEL_IN_PLAIN;
  if (p->op == VM_OP_scatter_add)
    return k == 1 ? KERNEL_IN_SCATTER_INDEX : k == 2 ? KERNEL_IN_SCATTER_SRC : KERNEL_IN_PLAIN;
  if (p->op == VM_OP_concat) return KERNEL_IN_PART;
  if (vm_op_scans(p->op)) return KERNEL_IN_SCAN;
  return KERNEL_IN_PLAIN;
}

/* node p reads its input k from outside the kernel even when the kernel
   computes it: a concat's parts (fills, the only parts a kernel may
   compute, are read from their slots) */
static inline bool kernel_arg_outside(const tr_pnode *p, int k) {
  (void)k;
  return p->op == VM_OP_concat;
}

/* the kernel input reading ref in that role, or -1 */
static inline int kernel_input(const kernel_shape *ks, int ref, uint8_t role) {
  for (int q = 0; q < ks->nin; q++)
    if (ks->ins[q] == ref && ks->in_role[q] == role) return q;
  return -1;
}

/* the kernel's coordinate input, or -1 */
static inline int kernel_coord_input(const kernel_shape *ks) {
  for (int q = 0; q < ks->nin; q++)
    if (ks->in_role[q] == KERNEL_IN_COORD) return q;
  return -1;
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
int kernel_plan_rows(const tr_plan *plan, int g, const cpu_leaf *leaves, kernel_shape *ks);
bool kernel_emit_rows(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                      const kernel_shape *ks, const char *name);

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
/* reduced positions per chunk when a row is split (a multiple of the block) */
#define KERNEL_REDUCE_CHUNK VM_FOLD_CHUNK

bool kernel_plan(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                 kernel_shape *ks);
/* the epilogue of reduce group g (its nodes from `first`, after the
   reduction, over the reduction's result) as an elementwise kernel of its
   own: a flat or column reduce kernel leaves it, and the runner launches
   it after them (a long reduction's result is folded between the two) */
bool kernel_plan_epilogue(const tr_plan *plan, int g, int first, const bool *escapes,
                          const cpu_leaf *leaves, kernel_shape *ks);
bool kernel_emit(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                 const kernel_shape *ks, const char *name);

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
  tr_plan plan; /* nodes and one group, local numbering */
  tr_group group;
  cpu_leaf *leaves; /* its inputs (dtype only) */
  kernel_shape ks;  /* local numbering */
  uint8_t *bytes;   /* salt + the description: what the key hashes */
  size_t len;
  uint64_t key[2]; /* XXH3-128 of bytes */
  char name[40];   /* the function's symbol: "kiln_<32 hex of key>" */
} kernel_desc;

/* the description of kernel ks (of a plan); salt (versions, target)
   goes first into the bytes.  NULL when it cannot be described (OOM, an
   input the shape does not list) */
kernel_desc *kernel_desc_new(const tr_plan *plan, const cpu_leaf *leaves, const kernel_shape *ks,
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
