/* plan.h — an optimized, backend-neutral plan for a trace key (DESIGN §5):
 * the trace after DCE, CSE, constant folding and algebraic simplification,
 * partitioned into kernel groups, with buffers assigned by liveness.  A
 * plan refers to its trace only by canonical indices, so one plan serves
 * every flush with the same key; host scalars and RNG counters are bound
 * from the flush's own nodes when it runs.  Plans are immutable once
 * published. */
#ifndef TR_PLAN_H
#define TR_PLAN_H

#include <string.h>

#include "flush.h"

typedef enum {
  TR_GROUP_ELEMENTWISE, /* one loop nest over the output: elementwise ops, views, fills */
  TR_GROUP_REDUCE,      /* producers fused into the input loop, epilogue on the result */
  TR_GROUP_MATMUL,      /* a BLAS call */
  TR_GROUP_DATA         /* gather / scatter / concat / sort / a collective: the backend's exec */
} tr_group_kind;

typedef struct tr_pnode {
  vm_opcode op;
  vm_attr attr;
  vm_meta meta;
  int nin;
  int in[3]; /* >= 0 a plan node, < 0 leaf -(j+1); concat uses `more` */
  int *more; /* inputs beyond 3 (concat) */
  int src;   /* canonical node whose scalars/RNG counters bind here */
  bool fold; /* constant-folded: computed on 0-d values, then expanded */
  int group;
  int buffer;   /* buffer slot of a group output, -1 otherwise */
  int last_use; /* last plan node reading it */
} tr_pnode;

typedef struct tr_group {
  tr_group_kind kind;
  int first, last; /* plan nodes [first, last] in order */
} tr_group;

typedef struct tr_pass_stats {
  int cse, dce, folded, simplified;
} tr_pass_stats;

typedef struct tr_plan {
  atomic_long refs;
  tr_pnode *nodes;
  int n;
  int *outputs; /* for each canonical node: the plan ref holding its value (outputs only) */
  int ncanon;
  tr_group *groups;
  int ngroups;
  int64_t *buffer_bytes;
  int nbuffers;
  bool *escapes;   /* per plan node: its value leaves the plan (an output) */
  int *release;    /* the non-escaping nodes by the group of their last use: */
  int *release_at; /* group g frees release[release_at[g] .. release_at[g+1]) */
  tr_pass_stats passes;
  const struct vm_backend *backend; /* of the trace's device: runs it */
  _Atomic(void *) jit;              /* the backend's compiled kernels, once ready */
} tr_plan;

static inline int tr_pnode_input(const tr_pnode *p, int k) {
  return k < 3 ? p->in[k] : p->more[k - 3];
}

/* Shapes in a row kernel's space (a run of reductions over the axes
   `axes` of one shape R; jit_cpu and jit_gpu plan them alike): m has
   shape[0..nd); m is all ones (a broadcast scalar); m, broadcast to R, is
   constant along the reduced axes (read once per row) */
static inline bool tr_meta_shape_is(const vm_meta *m, int nd, const int64_t *shape) {
  return m->ndim == nd && !memcmp(m->shape, shape, (size_t)nd * sizeof *shape);
}

static inline bool tr_meta_all_ones(const vm_meta *m, int nd) {
  if (m->ndim > nd) return false;
  for (int d = 0; d < m->ndim; d++)
    if (m->shape[d] != 1) return false;
  return true;
}

static inline bool tr_meta_const_along(const vm_meta *m, const vm_meta *R, uint32_t axes) {
  int lead = R->ndim - m->ndim;
  for (int d = 0; d < R->ndim; d++)
    if ((axes & (1u << d)) && R->shape[d] > 1 && d - lead >= 0 && m->shape[d - lead] > 1)
      return false;
  return true;
}

/* the last group of the longest run from group g whose nodes a row kernel
   over R (reduced axes `axes`, rk: R with them 1) could hold: elementwise
   and reduce groups without views, every node of shape R, rk or all ones,
   every reduction one that fold_ok(reduction, ctx) accepts; g - 1 if none */
int tr_rows_run_end(const tr_plan *plan, int g, const vm_meta *R, const int64_t *rk,
                    bool (*fold_ok)(const tr_pnode *reduction, const void *ctx), const void *ctx);

/* the plan of trace t, run by backend be (NULL on OOM) */
tr_plan *tr_plan_build(const tr_trace *t, const struct vm_backend *be);
bool tr_planning_enabled(void); /* false with KILN_JIT=0: the plain interpreter */
void tr_plan_retain(void *plan);
void tr_plan_release(void *plan);

/* In a run of plan over t: the value of plan ref r (< 0: a leaf's).  A
   fill is made on its first read here (groups do not run their fills:
   compiled kernels take their scalars), so runners read inputs through
   this; NULL + error if it cannot be made. */
vm_tensor *tr_run_value(const tr_plan *plan, const tr_trace *t, vm_tensor **vals, int r);

/* Runs plan (or, with plan NULL, the trace node by node) on the
   interpreter; fills vals[i] for every output node i of t.  Returns KILN_OK
   or an error status. */
int tr_run(const tr_plan *plan, const tr_trace *t, vm_tensor **vals, int *failed);

#endif
