/* rows.h — planning a row kernel (a run of reductions over the same axes of
 * one shape R, with the elementwise work around them, in one kernel), as
 * both backends do it: which groups and nodes it covers, which reductions it
 * folds, which nodes vary along a row and which are stored.  What the
 * kernel's code and launch look like stays with each backend. */
#ifndef TR_ROWS_H
#define TR_ROWS_H

#include "plan.h"

/* plan ref r is a fill (a full): read from outside a kernel it is
   uniform, a broadcast whatever its shape, and the runner passes its
   scalar, not a buffer (both backends' kernels) */
static inline bool tr_is_fill(const tr_plan *plan, int r) {
  return r >= 0 && plan->nodes[r].op == VM_OP_full;
}

/* the meta of plan ref r in a run over trace t (< 0: t's leaf's) */
static inline const vm_meta *tr_ref_meta(const tr_plan *plan, const tr_trace *t, int r) {
  return r >= 0 ? &plan->nodes[r].meta : &t->leaves[-1 - r]->meta;
}

bool tr_rows_enabled(void); /* false with KILN_ROW_FUSION=0: each group on its own */

/* the meta of a plan's leaf (ref -1 - leaf), from the backend's copy of the trace's leaves */
typedef const vm_meta *(*tr_leaf_meta_fn)(const void *leaves, int leaf);

typedef struct tr_row_space {
  const tr_plan *plan;
  tr_leaf_meta_fn leaf_meta;
  const void *leaves;
  /* the backend folds reduction op of in into out in a row kernel */
  bool (*folds)(vm_opcode op, kiln_dtype in, kiln_dtype out);
  int red0;                  /* the first reduction of the first group */
  const vm_meta *R;          /* its input */
  uint32_t axes;             /* its reduced axes */
  int64_t rk[KILN_MAX_DIMS]; /* R with the reduced axes 1 */
} tr_row_space;

/* the meta of plan ref r (< 0: a leaf's) */
const vm_meta *tr_row_meta(const tr_row_space *sp, int r);

/* The row space of reduce group g: its first reduction, which a row kernel
   must fold; false when g is no reduce group or that reduction does not
   fold (the backend then checks the row length it takes). */
bool tr_rows_space(const tr_plan *plan, int g, tr_leaf_meta_fn leaf_meta, const void *leaves,
                   bool (*folds)(vm_opcode, kiln_dtype, kiln_dtype), tr_row_space *sp);

/* a reduction a row kernel folds: one the backend folds, over R's axes,
   dims kept, of an input of R's shape (ctx: the tr_row_space) */
bool tr_row_fold_ok(const tr_pnode *p, const void *ctx);

/* A node of a row kernel as tr_rows_walk finds it */
typedef struct tr_row_node {
  int i;
  bool reduction;  /* its value is the row's */
  bool varies;     /* per element: varies along the reduced axes */
  bool read_after; /* a value read after the run: the kernel stores it */
} tr_row_node;

/* Walks the nodes of groups g..gb (at most max_nodes) as one row kernel:
   false when they cannot be one (a reduction of a row-constant value, a
   node of neither R's shape (when it varies) nor R's with the reduced axes
   1, nor all ones, a value read after the run not of those shapes, nothing
   read after the run) or when take(ctx, node) refuses one (what the
   backend's kernels lack: an op, room for inputs or outputs). */
bool tr_rows_walk(const tr_row_space *sp, int g, int gb, int max_nodes,
                  bool (*take)(void *ctx, const tr_row_node *node), void *ctx);

/* The last group of the longest run from g that fill(ctx, gb) makes one
   row kernel of (trying the longest first: tr_rows_run_end), or -1.  One
   group alone is worth it only with an epilogue (one kernel, not a kernel
   and the interpreter). */
int tr_rows_plan(const tr_row_space *sp, int g, bool (*fill)(void *ctx, int gb), void *ctx);

#endif
