/* rows.c — the backend-neutral half of planning a row kernel (rows.h):
 * its row space, the reductions it folds, the walk over its nodes and the
 * choice of its run of groups.  jit_cpu/kernel.c and jit_gpu/fuse.c fill
 * in their own kernel descriptions from it. */
#include "rows.h"

#include <stdlib.h>

#include "../vm/state.h"

bool tr_rows_enabled(void) { return vm_env_long("KILN_ROW_FUSION", 1) != 0; }

const vm_meta *tr_row_meta(const tr_row_space *sp, int r) {
  return r >= 0 ? &sp->plan->nodes[r].meta : sp->leaf_meta(sp->leaves, -1 - r);
}

bool tr_row_fold_ok(const tr_pnode *p, const void *ctx) {
  const tr_row_space *sp = ctx;
  if (p->nin != 1) return false;
  const vm_meta *in = tr_row_meta(sp, p->in[0]);
  return p->attr.axes_mask == sp->axes && p->attr.keepdim &&
         tr_meta_shape_is(in, sp->R->ndim, sp->R->shape) &&
         sp->folds(p->op, in->dtype, p->meta.dtype);
}

bool tr_rows_space(const tr_plan *plan, int g, tr_leaf_meta_fn leaf_meta, const void *leaves,
                   bool (*folds)(vm_opcode, kiln_dtype, kiln_dtype), tr_row_space *sp) {
  const tr_group *g0 = &plan->groups[g];
  if (g0->kind != TR_GROUP_REDUCE) return false;
  int red0 = g0->first;
  while (red0 <= g0->last && vm_op_table[plan->nodes[red0].op].kind != VM_KIND_REDUCE) red0++;
  if (red0 > g0->last || plan->nodes[red0].nin != 1) return false;
  const tr_pnode *r0 = &plan->nodes[red0];
  *sp = (tr_row_space){
      .plan = plan, .leaf_meta = leaf_meta, .leaves = leaves, .folds = folds, .red0 = red0};
  sp->R = tr_row_meta(sp, r0->in[0]);
  sp->axes = r0->attr.axes_mask;
  for (int d = 0; d < sp->R->ndim; d++) sp->rk[d] = (sp->axes & (1u << d)) ? 1 : sp->R->shape[d];
  return tr_row_fold_ok(r0, sp);
}

bool tr_rows_walk(const tr_row_space *sp, int g, int gb, int max_nodes,
                  bool (*take)(void *ctx, const tr_row_node *node), void *ctx) {
  const tr_plan *plan = sp->plan;
  int first = plan->groups[g].first, last = plan->groups[gb].last, nd = sp->R->ndim;
  if (last - first >= max_nodes) return false;
  bool *per_elem = calloc((size_t)(last - first + 1), sizeof *per_elem); /* node first + j varies */
  if (!per_elem) return false;
  bool ok = true, stored = false;
  for (int i = first; ok && i <= last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    tr_row_node n = {.i = i, .reduction = vm_op_table[p->op].kind == VM_KIND_REDUCE};
    bool varies = false;
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      varies |= r >= first && r <= last ? per_elem[r - first]
                                        : !tr_meta_const_along(tr_row_meta(sp, r), sp->R, sp->axes);
    }
    n.varies = per_elem[i - first] = varies && !n.reduction; /* a reduction's value is the row's */
    n.read_after = (plan->escapes[i] || p->last_use > last) && p->op != VM_OP_full;
    bool shaped = tr_meta_shape_is(&p->meta, nd, n.varies ? sp->R->shape : sp->rk);
    ok = !(n.reduction && !varies) && /* a reduction of a row-constant value */
         (shaped || (!n.varies && tr_meta_all_ones(&p->meta, nd))) && (shaped || !n.read_after) &&
         take(ctx, &n);
    stored |= n.read_after;
  }
  free(per_elem);
  return ok && stored;
}

int tr_rows_plan(const tr_row_space *sp, int g, bool (*fill)(void *ctx, int gb), void *ctx) {
  const tr_plan *plan = sp->plan;
  int gmax = tr_rows_run_end(plan, g, sp->R, sp->rk, tr_row_fold_ok, sp);
  int lowest = sp->red0 < plan->groups[g].last ? g : g + 1;
  for (int gb = gmax; gb >= lowest; gb--)
    if (fill(ctx, gb)) return gb;
  return -1;
}
