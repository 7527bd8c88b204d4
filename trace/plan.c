/* plan.c — building a plan from a trace (tr_plan_build: a driver of named
 * passes, plan_copy .. plan_release_lists) and running plans or plain
 * traces on the interpreter.  Every rewrite here is exact: a plan's results
 * are bit for bit those of running the trace node by node. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "../vm/backend.h"
#include "../vm/pool.h"
#include "../vm/state.h"
#include "key.h"

int tr_rows_run_end(const tr_plan *plan, int g, const vm_meta *R, const int64_t *rk,
                    bool (*fold_ok)(const tr_pnode *reduction, const void *ctx), const void *ctx) {
  int nd = R->ndim, end = g - 1;
  for (int h = g; h < plan->ngroups; h++) {
    const tr_group *grp = &plan->groups[h];
    bool ok = grp->kind == TR_GROUP_REDUCE || grp->kind == TR_GROUP_ELEMENTWISE;
    for (int i = grp->first; ok && i <= grp->last; i++) {
      const tr_pnode *p = &plan->nodes[i];
      vm_kind kind = vm_op_table[p->op].kind;
      if (kind == VM_KIND_VIEW || kind == VM_KIND_INDEX || kind == VM_KIND_CONCAT) ok = false;
      if (kind == VM_KIND_REDUCE) ok = fold_ok(p, ctx);
      ok = ok && (tr_meta_shape_is(&p->meta, nd, R->shape) || tr_meta_shape_is(&p->meta, nd, rk) ||
                  tr_meta_all_ones(&p->meta, nd));
    }
    if (!ok) break;
    end = h;
  }
  return end;
}

bool tr_planning_enabled(void) { return vm_env_long("KILN_JIT", 1) != 0; }

void tr_plan_retain(void *p) {
  atomic_fetch_add_explicit(&((tr_plan *)p)->refs, 1, memory_order_relaxed);
}

void tr_plan_release(void *p) {
  tr_plan *plan = p;
  if (!plan || atomic_fetch_sub_explicit(&plan->refs, 1, memory_order_acq_rel) != 1) return;
  for (int i = 0; i < plan->n; i++) free(plan->nodes[i].more);
  free(plan->nodes);
  free(plan->outputs);
  free(plan->groups);
  free(plan->buffer_bytes);
  free(plan->escapes);
  free(plan->release);
  free(plan->release_at);
  void *jit = atomic_load(&plan->jit);
  if (jit) plan->backend->plan_free(jit);
  free(plan);
}

static bool is_param_leaf(vm_opcode op) {
  return op == VM_OP_full || op == VM_OP_arange || op == VM_OP_rand || op == VM_OP_randn;
}

static bool is_elementwise(vm_opcode op) {
  vm_kind k = vm_op_table[op].kind;
  return k == VM_KIND_UNARY || k == VM_KIND_BINARY || k == VM_KIND_TERNARY;
}

static int64_t numel_of(const vm_meta *m) {
  int64_t c = 1;
  for (int d = 0; d < m->ndim; d++) c *= m->shape[d];
  return c;
}

/* --- building --------------------------------------------------------------- */

/* What the passes of tr_plan_build share.  Up to plan_renumber a node is
   numbered as in the trace (p[i], one per canonical node); from there on,
   as in the plan (plan->nodes). */
typedef struct {
  const tr_trace *t;
  tr_pnode *p;
  int n;
  int *alias;    /* plan ref a node was rewritten to (itself if not) */
  tr_plan *plan; /* what the passes build */
  int *table;    /* plan_copy's CSE table: slots entries (a power of 2), -1 empty */
  int slots;
  bool *live;    /* plan_dce: the outputs need the node */
  int *renumber; /* plan_order: a kept node's index in the plan */
  int m;         /* plan_order: the nodes kept */
  bool moved;    /* plan_renumber: p[i].more now belongs to the plan (or is freed) */
} builder;

static const vm_meta *ref_meta(const builder *b, int ref) {
  if (ref >= 0) return &b->p[ref].meta;
  return &b->t->leaves[-1 - ref]->meta;
}

static int resolve(const builder *b, int ref) { return ref >= 0 ? b->alias[ref] : ref; }

/* the scalar class of a literal full node (its value is part of the key,
   so it holds for every flush this plan serves); -1 when ref is not one.  A
   host scalar is a parameter: never simplified, whatever its value. */
static int full_class(const builder *b, int ref) {
  if (ref < 0) return -1;
  const tr_pnode *p = &b->p[ref];
  if (p->op == VM_OP_full) return p->attr.host ? -1 : tr_scalar_class(p->attr.scalar[0]);
  if (p->op != VM_OP_cast) return -1;
  /* a host scalar cast to the tensor's dtype: 0 and 1 stay exact; -0 stays
     -0 only in a float dtype */
  int c = full_class(b, p->in[0]);
  if (c == 3 && !vm_dtype_is_float(p->meta.dtype)) return 1;
  return c;
}

static bool exact_widening(kiln_dtype from, kiln_dtype to) {
  if (from == to) return true;
  if (from == KILN_BOOL) return true;
  if (from == KILN_I32) return to == KILN_I64 || to == KILN_F64;
  return from == KILN_F32 && to == KILN_F64;
}

/* Exact algebraic identities; returns the ref node i reduces to, or i
   (*rewired is set when i itself was rewritten onto other inputs). */
static int simplify(builder *b, int i, bool *rewired) {
  tr_pnode *p = &b->p[i];
  int x = p->nin > 0 ? p->in[0] : 0, y = p->nin > 1 ? p->in[1] : 0;
  const vm_meta *mx = p->nin > 0 ? ref_meta(b, x) : NULL;
  bool keeps = mx && mx->dtype == p->meta.dtype && vm_meta_same_shape(mx, &p->meta);
  if (vm_op_table[p->op].kind == VM_KIND_VIEW && x >= 0 && b->p[x].op == VM_OP_full && !keeps) {
    /* a view of a fill is a fill of the view's shape, its value bound from
       the same flush node: kernels read fills as values (a view would make
       the interpreter build the fill first, to view it) */
    const tr_pnode *f = &b->p[x];
    p->op = VM_OP_full;
    p->nin = 0;
    p->src = f->src;
    p->attr = f->attr;
    p->attr.ndim = p->meta.ndim;
    memcpy(p->attr.shape, p->meta.shape, sizeof p->attr.shape);
    p->attr.weak = p->meta.weak;
    *rewired = true;
    return i;
  }
  switch (p->op) {
    case VM_OP_neg: /* neg(neg x) */
      if (x >= 0 && b->p[x].op == VM_OP_neg) return b->p[x].in[0];
      break;
    case VM_OP_copy:
      return x;
    case VM_OP_cast: /* cast(x, own dtype); cast(cast(x, wider), back) */
      if (keeps) return x;
      if (x >= 0 && b->p[x].op == VM_OP_cast) {
        int inner = b->p[x].in[0];
        if (ref_meta(b, inner)->dtype == p->meta.dtype &&
            exact_widening(p->meta.dtype, b->p[x].meta.dtype))
          return inner;
      }
      break;
    case VM_OP_reshape:
      if (keeps) return x;
      if (x >= 0 && b->p[x].op == VM_OP_reshape) {
        p->in[0] = b->p[x].in[0];
        *rewired = true;
        return simplify(b, i, rewired);
      }
      break;
    case VM_OP_expand:
      if (keeps) return x;
      break;
    case VM_OP_permute: {
      bool identity = true;
      for (int d = 0; d < p->meta.ndim; d++) identity = identity && p->attr.perm[d] == d;
      if (identity) return x;
      if (x >= 0 && b->p[x].op == VM_OP_permute) { /* compose */
        int composed[KILN_MAX_DIMS] = {0};
        for (int d = 0; d < p->meta.ndim; d++) composed[d] = b->p[x].attr.perm[p->attr.perm[d]];
        memcpy(p->attr.perm, composed, sizeof composed);
        p->in[0] = b->p[x].in[0];
        *rewired = true;
        return simplify(b, i, rewired);
      }
      break;
    }
    case VM_OP_slice:
      if (keeps && p->attr.start == 0 && p->attr.step == 1) return x;
      break;
    case VM_OP_mul: /* x * 1, 1 * x */
      if (keeps && full_class(b, y) == 2) return x;
      if (full_class(b, x) == 2) {
        const vm_meta *my = ref_meta(b, y);
        if (my->dtype == p->meta.dtype && vm_meta_same_shape(my, &p->meta)) return y;
      }
      break;
    case VM_OP_div: /* x / 1 */
    case VM_OP_pow: /* x ** 1 */
      if (keeps && full_class(b, y) == 2) return x;
      break;
    case VM_OP_sub: /* x - (+0) */
      if (keeps && full_class(b, y) == 1) return x;
      break;
    case VM_OP_add: /* x + (-0) */
      if (keeps && full_class(b, y) == 3) return x;
      break;
    default:
      break;
  }
  return i;
}

/* attribute bytes two nodes must share to be the same computation */
static bool same_node(const tr_pnode *a, const tr_pnode *b) {
  if (a->op != b->op || a->nin != b->nin || a->nin > 3) return false;
  if (a->meta.dtype != b->meta.dtype || !vm_meta_same_shape(&a->meta, &b->meta)) return false;
  for (int k = 0; k < a->nin; k++)
    if (a->in[k] != b->in[k]) return false;
  const vm_attr *x = &a->attr, *y = &b->attr;
  return x->dtype == y->dtype && x->axes_mask == y->axes_mask && x->keepdim == y->keepdim &&
         x->axis == y->axis && x->start == y->start && x->stop == y->stop && x->step == y->step &&
         !memcmp(x->perm, y->perm, sizeof x->perm);
}

static uint64_t node_hash(const tr_pnode *p) {
  uint64_t h = (uint64_t)p->op * 0x9E3779B97F4A7C15ull;
  for (int k = 0; k < p->nin && k < 3; k++)
    h = (h ^ (uint64_t)(int64_t)p->in[k]) * 0x100000001B3ull;
  h ^= (uint64_t)p->attr.axes_mask * 31 + (uint64_t)p->attr.axis * 7 + (uint64_t)p->meta.ndim;
  return h;
}

/* common subexpressions: a pure node equal to an earlier one is that one */
static int cse(builder *b, int i) {
  tr_pnode *p = &b->p[i];
  int *table = b->table, slots = b->slots;
  if (is_param_leaf(p->op) || p->nin > 3 || vm_op_table[p->op].kind == VM_KIND_COLLECTIVE) return i;
  size_t h = node_hash(p) & (size_t)(slots - 1);
  while (table[h] >= 0) {
    if (same_node(&b->p[table[h]], p)) return table[h];
    h = (h + 1) & (size_t)(slots - 1);
  }
  table[h] = i;
  return i;
}

/* --- the passes up to partitioning, in tr_plan_build's order ---------------- */

/* copies trace node i into b->p[i], its inputs resolved through the
   rewrites of the nodes before it; false on OOM */
static bool copy_node(builder *b, int i) {
  const tr_node *src = b->t->nodes[i];
  tr_pnode *p = &b->p[i];
  p->op = src->op;
  p->attr = src->attr;
  p->meta = src->meta;
  p->nin = src->nin;
  p->src = i;
  if (src->nin > 3 && !(p->more = malloc((size_t)(src->nin - 3) * sizeof(int)))) return false;
  for (int k = 0; k < src->nin; k++) {
    int r = resolve(b, b->t->refs[i][k]);
    if (k < 3)
      p->in[k] = r;
    else
      p->more[k - 3] = r;
  }
  return true;
}

/* plan_copy: copies the trace node by node, then simplifies each node
   (exact identities) and, if it stays, looks it up for CSE; alias[i] says
   what node i became.  Relies on the trace's order: inputs first. */
static bool plan_copy(builder *b) {
  for (int i = 0; i < b->n; i++) {
    if (!copy_node(b, i)) return false;
    bool rewired = false;
    int r = simplify(b, i, &rewired);
    if (r != i || rewired) b->plan->passes.simplified++;
    if (r == i) {
      r = cse(b, i);
      if (r != i) b->plan->passes.cse++;
    }
    b->alias[i] = r;
  }
  return true;
}

/* plan_drop_kept_dims: a reshape that only drops the kept dims of a
   keepdim reduction read by nothing else (autodiff's bias gradient: sum
   over the batch, keepdim, then to the bias's shape) becomes the reduction
   without keepdim: the same fold, so the same bits, and no view of a value
   computed in the reduction's group, which would end it (plan_partition),
   so the bias update joins the reduction's kernel as its epilogue.  Counted as simplified;
   relies on plan_copy's aliases. */
static bool plan_drop_kept_dims(builder *b) {
  int n = b->n, rewritten = 0;
  int *uses = calloc((size_t)(n ? n : 1), sizeof(int));
  if (!uses) return true; /* an optimization only */
  for (int i = 0; i < n; i++) {
    if (b->alias[i] != i) continue;
    for (int k = 0; k < b->p[i].nin; k++) {
      int r = tr_pnode_input(&b->p[i], k);
      if (r >= 0) uses[r]++;
    }
  }
  for (int i = 0; i < n; i++)
    if (b->t->is_output[i] && b->alias[i] >= 0) uses[b->alias[i]] += 2; /* escapes: kept as it is */
  for (int i = 0; i < n; i++) {
    tr_pnode *p = &b->p[i];
    int x = p->nin == 1 ? p->in[0] : -1;
    if (b->alias[i] != i || p->op != VM_OP_reshape || x < 0 || uses[x] != 1) continue;
    const tr_pnode *r = &b->p[x];
    if (vm_op_table[r->op].kind != VM_KIND_REDUCE || !r->attr.keepdim || r->nin != 1) continue;
    const vm_meta *in = ref_meta(b, r->in[0]);
    int nd = 0;
    int64_t dropped[KILN_MAX_DIMS] = {0};
    for (int d = 0; d < in->ndim; d++)
      if (!((r->attr.axes_mask >> d) & 1u)) dropped[nd++] = in->shape[d];
    if (nd != p->meta.ndim || memcmp(dropped, p->meta.shape, (size_t)nd * sizeof(int64_t)))
      continue;
    vm_meta m = r->meta;
    m.ndim = nd;
    memcpy(m.shape, dropped, sizeof m.shape);
    p->op = r->op;
    p->attr = r->attr;
    p->attr.keepdim = false;
    p->in[0] = r->in[0];
    p->meta = m;
    rewritten++;
  }
  free(uses);
  b->plan->passes.simplified += rewritten;
  return true;
}

/* plan_dce: marks live what the outputs need, from the last node back
   (a node's inputs come before it). */
static bool plan_dce(builder *b) {
  for (int i = b->n - 1; i >= 0; i--) {
    if (b->t->is_output[i] && b->alias[i] >= 0) b->live[b->alias[i]] = true;
    if (!b->live[i] || b->alias[i] != i) continue;
    for (int k = 0; k < b->p[i].nin; k++) {
      int r = tr_pnode_input(&b->p[i], k);
      if (r >= 0) b->live[r] = true;
    }
  }
  return true;
}

static int64_t meta_numel(const vm_meta *m) {
  int64_t c = 1;
  for (int d = 0; d < m->ndim; d++) c *= m->shape[d];
  return c;
}

/* plan_order: numbers the nodes kept (live, not rewritten away) in the
   plan's order: first a matmul's operands made of views of leaves and
   work on them (a weight transposed, and cast to bf16 under autocast:
   recorded between a layer's elementwise work, they split its loop nests:
   W18h's cast of the GELU's output for the next matmul ran as a nest of
   its own), then uniform values (fills, and elementwise work on fills
   only) and the other operands made of leaves that go first (elementwise
   work on leaves and such values only that an elementwise op reads
   broadcast to a larger shape, a weight or a bias cast to f32, or a
   matmul reads), so they never split the loop nests of the nodes that
   read them, then the rest in trace order (inputs stay first).  Counts
   the dead. */
static bool plan_order(builder *b) {
  int n = b->n;
  bool *uniform = calloc((size_t)n, sizeof(bool)), *operand = calloc((size_t)n, sizeof(bool));
  bool *viewed = calloc((size_t)n, sizeof(bool)), *first = calloc((size_t)n, sizeof(bool));
  if (!uniform || !operand || !viewed || !first) {
    free(uniform), free(operand), free(viewed), free(first);
    return false;
  }
  for (int i = 0; i < n; i++) { /* uniform: fills; operand: elementwise work and views on
                                   leaves, fills; viewed: an operand with a view in it */
    const tr_pnode *p = &b->p[i];
    bool view = vm_op_table[p->op].kind == VM_KIND_VIEW && p->nin > 0;
    bool u = p->op == VM_OP_full || (is_elementwise(p->op) && p->nin > 0), o = u || view, v = view;
    for (int k = 0; p->op != VM_OP_full && k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      u = u && r >= 0 && uniform[r];
      o = o && (r < 0 || operand[r]);
      v = v || (r >= 0 && viewed[r]);
    }
    uniform[i] = u;
    operand[i] = o;
    viewed[i] = o && v;
  }
  /* an operand goes first if it, or work on it, is broadcast by an
     elementwise op or read by a matmul (marked from the last node back,
     so a chain goes whole) */
  for (int j = n - 1; j >= 0; j--) {
    const tr_pnode *p = &b->p[j];
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      if (r < 0 || !operand[r]) continue;
      bool broadcast = is_elementwise(p->op) && meta_numel(&b->p[r].meta) < meta_numel(&p->meta);
      bool gemm = vm_op_table[p->op].kind == VM_KIND_MATMUL;
      if (broadcast || gemm || (first[j] && operand[j])) first[r] = true;
    }
  }
  /* the pass a node is numbered in: never before its inputs' (a view's
     work that reads a fill waits for the fills) */
  uint8_t *at = (uint8_t *)viewed; /* reused: viewed[i] is read before at[i] is set */
  for (int i = 0; i < n; i++) {
    const tr_pnode *p = &b->p[i];
    bool early = operand[i] && first[i];
    uint8_t a = early && viewed[i] ? 0 : uniform[i] || early ? 1 : 2;
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      if (r >= 0 && at[r] > a) a = at[r];
    }
    at[i] = a;
  }
  b->m = 0;
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < n; i++) {
      if (at[i] != pass) continue;
      if (b->live[i] && b->alias[i] == i)
        b->renumber[i] = b->m++;
      else if (b->alias[i] == i)
        b->plan->passes.dce++;
    }
  free(uniform), free(operand), free(viewed), free(first);
  return true;
}

/* plan_renumber: moves the kept nodes into the plan at their new numbers,
   inputs renumbered; frees what the dropped ones held.  Relies on
   plan_order. */
static bool plan_renumber(builder *b) {
  tr_plan *plan = b->plan;
  int n = b->n, m = b->m;
  plan->escapes = calloc((size_t)(m ? m : 1), sizeof(bool));
  plan->nodes = calloc((size_t)(m ? m : 1), sizeof(tr_pnode));
  plan->outputs = malloc((size_t)n * sizeof(int));
  plan->groups = calloc((size_t)(m ? m : 1), sizeof(tr_group));
  if (!plan->nodes || !plan->outputs || !plan->groups || !plan->escapes) return false;
  for (int i = 0; i < n; i++) /* plan_order numbers every input first (never false) */
    for (int k = 0; b->live[i] && b->alias[i] == i && k < b->p[i].nin; k++) {
      int r = tr_pnode_input(&b->p[i], k);
      if (r >= 0 && b->renumber[r] >= b->renumber[i]) return false;
    }
  for (int i = 0; i < n; i++) {
    if (!b->live[i] || b->alias[i] != i) {
      free(b->p[i].more);
      continue;
    }
    tr_pnode *p = &plan->nodes[b->renumber[i]];
    *p = b->p[i];
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k), nr = r >= 0 ? b->renumber[r] : r;
      if (k < 3)
        p->in[k] = nr;
      else
        p->more[k - 3] = nr;
    }
  }
  plan->n = m;
  b->moved = true;
  plan->ncanon = n;
  return true;
}

/* plan_fold: constant folding — elementwise work on uniform values (fills,
   folded nodes) runs at 0-d and is expanded where read.  Relies on the
   plan's order: inputs first. */
static bool plan_fold(builder *b) {
  tr_plan *plan = b->plan;
  for (int i = 0; i < plan->n; i++) {
    tr_pnode *p = &plan->nodes[i];
    bool uniform = is_elementwise(p->op) && p->nin > 0;
    for (int k = 0; uniform && k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      uniform = r >= 0 && (plan->nodes[r].op == VM_OP_full || plan->nodes[r].fold);
    }
    if (uniform) {
      p->fold = true;
      plan->passes.folded++;
    }
  }
  return true;
}

/* plan_outputs: for each canonical output node, the plan ref holding its
   value; a plan node so named escapes (its value leaves the plan). */
static bool plan_outputs(builder *b) {
  tr_plan *plan = b->plan;
  for (int i = 0; i < b->n; i++) {
    int r = b->alias[i];
    plan->outputs[i] = b->t->is_output[i] ? (r >= 0 ? b->renumber[r] : r) : 0;
    if (b->t->is_output[i] && r >= 0) plan->escapes[b->renumber[r]] = true;
  }
  return true;
}

/* plan_last_use: the last plan node reading each node (itself if none);
   plan_buffers and plan_release_lists rely on it. */
static bool plan_last_use(builder *b) {
  tr_plan *plan = b->plan;
  for (int i = 0; i < plan->n; i++) plan->nodes[i].last_use = i;
  for (int i = 0; i < plan->n; i++)
    for (int k = 0; k < plan->nodes[i].nin; k++) {
      int r = tr_pnode_input(&plan->nodes[i], k);
      if (r >= 0) plan->nodes[r].last_use = i;
    }
  return true;
}

/* --- partitioning (DESIGN §5) ------------------------------------------------- */

/* Data movement a backend's kernels compute in place, elementwise over
   the output (vm_backend.fuses_gathers):
   - a gather or index_select: an indirect load of its source;
   - a scatter_add whose index has at most TR_SCATTER_PICKS positions
     along the axis and the output's extent elsewhere: each output
     element adds, in index order, the sources whose index names it (the
     interpreter's order for that element, so the same bits);
   - a concat of at most 3 non-empty parts of its own dtype: a pick
     between the parts' values at the output position;
   - an argmax or argmin over one axis: a scan along it per output element
     (the interpreter's scan: the first extreme, or the first NaN).
   The inputs these read at other positions than the output's (source,
   index, parts) come from outside the kernel. */
#define TR_SCATTER_PICKS 8

static const vm_meta *input_meta(const tr_plan *plan, const tr_trace *t, int ref) {
  return ref >= 0 ? &plan->nodes[ref].meta : &t->leaves[-1 - ref]->meta;
}

static bool in_place(const tr_plan *plan, const tr_trace *t, const tr_pnode *p) {
  if (!plan->backend || !plan->backend->fuses_gathers) return false;
  if (vm_op_gathers(p->op)) return true;
  int axis = p->attr.axis;
  if (p->op == VM_OP_scatter_add) {
    const vm_meta *idx = input_meta(plan, t, p->in[1]), *src = input_meta(plan, t, p->in[2]);
    if (idx->ndim != p->meta.ndim || idx->shape[axis] > TR_SCATTER_PICKS ||
        src->dtype != p->meta.dtype || input_meta(plan, t, p->in[0])->dtype != p->meta.dtype)
      return false;
    for (int d = 0; d < idx->ndim; d++)
      if (d != axis && idx->shape[d] != p->meta.shape[d]) return false;
    return true;
  }
  if (vm_op_scans(p->op)) {
    const vm_meta *in = input_meta(plan, t, p->in[0]);
    uint32_t m = p->attr.axes_mask;
    return in->dtype != KILN_BOOL && m && !(m & (m - 1));
  }
  if (p->op == VM_OP_concat && p->nin >= 1 && p->nin <= 3) {
    for (int k = 0; k < p->nin; k++) {
      const vm_meta *m = input_meta(plan, t, p->in[k]);
      if (m->dtype != p->meta.dtype || m->ndim != p->meta.ndim || m->shape[axis] < 1) return false;
    }
    return true;
  }
  return false;
}

/* an in-place op reads input k at other positions than its output's */
static bool reads_elsewhere(const tr_pnode *p, int k) {
  return vm_op_gathers(p->op) || vm_op_scans(p->op) || p->op == VM_OP_concat ||
         (p->op == VM_OP_scatter_add && k > 0);
}

/* in-place ops that need the output position's coordinate along an axis */
static bool needs_coord(const tr_pnode *p) {
  return p->op == VM_OP_scatter_add || p->op == VM_OP_concat;
}

/* in-place ops only flat elementwise kernels compute (never a reduction's
   producers) */
static bool flat_only(const tr_pnode *p) { return needs_coord(p) || vm_op_scans(p->op); }

/* plan_partition: cuts the plan, in its order, into kernel groups
   (tr_group_kind): elementwise work joins the loop nest or reduction
   before it where shapes allow.  Relies on the plan's order (inputs
   first, uniform values first). */
static bool plan_partition(builder *b) {
  tr_plan *plan = b->plan;
  const tr_trace *t = b->t;
  plan->ngroups = 0;
  tr_group *cur = NULL;
  vm_meta cur_shape = {0}; /* the group's iteration space (or the reduction's result) */
  int cur_axis = -1;       /* the axis of the group's coordinate (needs_coord), or -1 */
  bool cur_flat = false;   /* the group has an op only flat kernels compute (flat_only) */
  for (int i = 0; i < plan->n; i++) {
    tr_pnode *p = &plan->nodes[i];
    vm_kind kind = vm_op_table[p->op].kind;
    bool placed = in_place(plan, t, p);
    if (placed) kind = VM_KIND_BINARY;
    bool join = false;
    if (cur && (kind == VM_KIND_UNARY || kind == VM_KIND_BINARY || kind == VM_KIND_TERNARY ||
                kind == VM_KIND_VIEW || kind == VM_KIND_LEAF)) {
      /* elementwise work joins a loop nest over its own shape, or a
         reduction's epilogue of the reduction's result shape */
      join = (cur->kind == TR_GROUP_ELEMENTWISE || cur->kind == TR_GROUP_REDUCE) &&
             vm_meta_same_shape(&cur_shape, &p->meta);
      /* an in-place op reads its source, index or parts from outside its
         kernel (indices are checked before the kernel runs): computed in
         this loop nest, they end it (views of outside values are read as
         inputs; a concat's fills are values, read at any position) */
      for (int k = 0; join && placed && k < p->nin; k++) {
        int r = tr_pnode_input(p, k);
        join = !(reads_elsewhere(p, k) && r >= cur->first &&
                 vm_op_table[plan->nodes[r].op].kind != VM_KIND_VIEW &&
                 !(p->op == VM_OP_concat && plan->nodes[r].op == VM_OP_full));
      }
      /* a view runs before its group's kernel (it moves no data): of a
         value the loop nest computes, it starts the next nest, which reads
         the value stored (kept, the whole nest would be interpreted) */
      if (join && kind == VM_KIND_VIEW) {
        int base = p->in[0];
        while (base >= 0 && vm_op_table[plan->nodes[base].op].kind == VM_KIND_VIEW)
          base = plan->nodes[base].in[0];
        if (base >= cur->first) join = false;
      }
      /* one coordinate axis per kernel */
      if (join && placed && needs_coord(p)) join = cur_axis < 0 || cur_axis == p->attr.axis;
      if (join && cur->kind == TR_GROUP_REDUCE)
        for (int k = 0; k < p->nin; k++) { /* an epilogue reads results, never the reduced loop */
          int r = tr_pnode_input(p, k);
          if (r >= cur->first && r <= cur->last &&
              vm_op_table[plan->nodes[r].op].kind != VM_KIND_REDUCE &&
              !vm_meta_same_shape(&plan->nodes[r].meta, &cur_shape))
            join = false;
        }
    } else if (cur && kind == VM_KIND_REDUCE && cur->kind == TR_GROUP_ELEMENTWISE && !cur_flat) {
      /* producers fuse into the reduction's input loop (a concat,
         scatter_add or argmax among them ends the group before) */
      int r = p->in[0];
      join = r >= cur->first && vm_meta_same_shape(&cur_shape, &plan->nodes[r].meta);
    }
    if (!join) cur_axis = -1, cur_flat = false;
    if (placed && needs_coord(p)) cur_axis = p->attr.axis;
    if (placed && flat_only(p)) cur_flat = true;
    if (join) {
      cur->last = i;
      if (kind == VM_KIND_REDUCE) {
        cur->kind = TR_GROUP_REDUCE;
        cur_shape = p->meta;
      }
    } else {
      cur = &plan->groups[plan->ngroups++];
      cur->first = cur->last = i;
      cur->kind = kind == VM_KIND_MATMUL ? TR_GROUP_MATMUL
                  : kind == VM_KIND_INDEX || kind == VM_KIND_CONCAT || kind == VM_KIND_SORT ||
                          kind == VM_KIND_COLLECTIVE || kind == VM_KIND_CONV ||
                          kind == VM_KIND_ATTENTION
                      ? TR_GROUP_DATA
                  : kind == VM_KIND_REDUCE ? TR_GROUP_REDUCE
                                           : TR_GROUP_ELEMENTWISE;
      cur_shape = p->meta;
      if (cur->kind == TR_GROUP_MATMUL || cur->kind == TR_GROUP_DATA) cur = NULL; /* one op each */
    }
    p->group = plan->ngroups - 1;
  }
  return true;
}

/* plan_buffers: a group output (read by a later group, or a plan output)
   owns a buffer; buffers whose last reader has run are reused by later
   outputs.  Relies on the groups, last uses and escapes. */
static bool plan_buffers(builder *b) {
  tr_plan *plan = b->plan;
  const bool *escapes = plan->escapes;
  int n = plan->n;
  size_t slots = n > 0 ? (size_t)n : 1;
  int *slot_free_after = malloc(slots * sizeof(int));
  plan->buffer_bytes = calloc(slots, sizeof(int64_t));
  if (!slot_free_after || !plan->buffer_bytes) {
    free(slot_free_after);
    return false;
  }
  plan->nbuffers = 0;
  for (int i = 0; i < n; i++) {
    tr_pnode *p = &plan->nodes[i];
    p->buffer = -1;
    bool group_output =
        escapes[i] || (p->last_use > i && plan->nodes[p->last_use].group != p->group);
    if (!group_output || vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    int64_t bytes = numel_of(&p->meta) * (int64_t)vm_dtype_size(p->meta.dtype);
    int g = p->group, found = -1;
    for (int s = 0; s < plan->nbuffers && found < 0 && !escapes[i]; s++)
      if (slot_free_after[s] < plan->groups[g].first && plan->buffer_bytes[s] >= bytes) found = s;
    if (found < 0) {
      found = plan->nbuffers++;
      plan->buffer_bytes[found] = bytes;
    }
    p->buffer = found;
    int end = escapes[i] ? n : plan->groups[plan->nodes[p->last_use].group].last;
    slot_free_after[found] = end;
  }
  free(slot_free_after);
  return true;
}

/* plan_release_lists: which values each group is the last reader of
   (run_plan frees them after it): a counting sort of the nodes by the group
   of their last use, so a run frees in O(nodes), not O(groups x nodes) */
static bool plan_release_lists(builder *b) {
  tr_plan *plan = b->plan;
  const bool *escapes = plan->escapes;
  int ng = plan->ngroups;
  plan->release_at = calloc((size_t)ng + 2, sizeof(int));
  plan->release = malloc((size_t)(plan->n ? plan->n : 1) * sizeof(int));
  if (!plan->release_at || !plan->release) return false;
  for (int i = 0; i < plan->n; i++)
    if (!escapes[i]) plan->release_at[plan->nodes[plan->nodes[i].last_use].group + 2]++;
  for (int g = 0; g < ng; g++) plan->release_at[g + 2] += plan->release_at[g + 1];
  for (int i = 0; i < plan->n; i++)
    if (!escapes[i])
      plan->release[plan->release_at[plan->nodes[plan->nodes[i].last_use].group + 1]++] = i;
  return true;
}

/* --- the driver --------------------------------------------------------------- */

/* the plan and the passes' scratch for trace t; false on OOM */
static bool builder_init(builder *b, const tr_trace *t, const vm_backend *be) {
  int n = t->n;
  *b = (builder){.t = t, .n = n, .slots = 64};
  b->plan = calloc(1, sizeof *b->plan);
  if (b->plan) b->plan->backend = be;
  b->p = calloc((size_t)n, sizeof(tr_pnode));
  b->alias = malloc((size_t)n * sizeof(int));
  while (b->slots < 2 * n) b->slots *= 2;
  b->table = malloc((size_t)b->slots * sizeof(int));
  b->live = calloc((size_t)n, sizeof(bool));
  b->renumber = malloc((size_t)n * sizeof(int));
  if (!b->plan || !b->p || !b->alias || !b->table || !b->live || !b->renumber) return false;
  memset(b->table, -1, (size_t)b->slots * sizeof(int));
  return true;
}

/* frees the scratch; returns the plan, or NULL + an OOM error if !ok */
static tr_plan *builder_finish(builder *b, bool ok) {
  /* a pass that failed before plan_renumber leaves the wide nodes' extra
     inputs with the builder */
  for (int i = 0; b->p && !b->moved && i < b->n; i++) free(b->p[i].more);
  free(b->p);
  free(b->alias);
  free(b->table);
  free(b->live);
  free(b->renumber);
  if (b->plan) atomic_init(&b->plan->refs, 1);
  if (ok) return b->plan;
  tr_plan_release(b->plan);
  vm_error(KILN_ERR_OOM, "out of memory building a plan");
  return NULL;
}

/* The passes, in order; each returns false on OOM only.  Every rewrite is
   exact (see the file's comment). */
tr_plan *tr_plan_build(const tr_trace *t, const vm_backend *be) {
  builder b;
  bool ok = builder_init(&b, t, be);
  ok = ok && plan_copy(&b);           /* copy, simplify, CSE */
  ok = ok && plan_drop_kept_dims(&b); /* keepdim reduction + reshape: one reduction */
  ok = ok && plan_dce(&b);            /* what the outputs need */
  ok = ok && plan_order(&b);          /* uniform values first */
  ok = ok && plan_renumber(&b);       /* into the plan, in that order */
  ok = ok && plan_fold(&b);           /* constant folding */
  ok = ok && plan_outputs(&b);        /* outputs, escapes */
  ok = ok && plan_last_use(&b);       /* each node's last reader */
  ok = ok && plan_partition(&b);      /* kernel groups */
  ok = ok && plan_buffers(&b);        /* buffers by liveness */
  ok = ok && plan_release_lists(&b);  /* what each group frees */
  return builder_finish(&b, ok);
}

/* --- running on the interpreter --------------------------------------------------- */

/* a 0-d view of a uniform value (all strides 0), for folded nodes */
static vm_tensor *scalar_view(vm_tensor *v) { return vm_tensor_view(v, 0, NULL, NULL, v->offset); }

static vm_tensor *expand_view(vm_tensor *v0, const vm_meta *m) {
  int64_t zeros[KILN_MAX_DIMS] = {0};
  return vm_tensor_view(v0, m->ndim, m->shape, zeros, v0->offset);
}

static vm_tensor *run_pnode(const vm_backend *be, const tr_pnode *p, const vm_attr *attr,
                            vm_tensor *const *ins) {
  if (p->op == VM_OP_full || p->fold) { /* uniform: compute one element, broadcast it */
    vm_meta m0 = p->meta;
    m0.ndim = 0;
    vm_attr a0 = *attr;
    a0.ndim = 0;
    vm_tensor *scalars[3] = {NULL, NULL, NULL}, *v0 = NULL;
    bool ok = true;
    for (int k = 0; k < p->nin && ok; k++) ok = (scalars[k] = scalar_view(ins[k])) != NULL;
    if (ok) v0 = be->exec(p->op, p->nin, scalars, &a0, &m0);
    for (int k = 0; k < p->nin; k++) vm_release(scalars[k]);
    if (!v0) return NULL;
    vm_tensor *v = expand_view(v0, &p->meta);
    vm_release(v0);
    return v;
  }
  return be->exec(p->op, p->nin, ins, attr, &p->meta);
}

static int run_node(const tr_plan *plan, const tr_trace *t, int i, vm_tensor **vals);

/* Fills (full nodes) are not run with their group: a kernel that reads one
   takes its host scalar as a parameter, so most are never made at all
   (a chain of scalar ops on a GPU would launch a kernel per fill).  The
   first reader that needs the value makes it. */
vm_tensor *tr_run_value(const tr_plan *plan, const tr_trace *t, vm_tensor **vals, int ref) {
  if (ref < 0) return t->leaves[-1 - ref]->value;
  if (!vals[ref] && plan && plan->nodes[ref].op == VM_OP_full) (void)run_node(plan, t, ref, vals);
  return vals[ref];
}

static int run_node(const tr_plan *plan, const tr_trace *t, int i, vm_tensor **vals) {
  const tr_pnode *p = &plan->nodes[i];
  vm_tensor *few[3], **ins = p->nin <= 3 ? few : malloc((size_t)p->nin * sizeof *ins);
  if (!ins) return vm_error(KILN_ERR_OOM, "out of memory");
  bool have = true; /* a fill made here can fail (out of memory) */
  for (int k = 0; k < p->nin; k++)
    have = (ins[k] = tr_run_value(plan, t, vals, tr_pnode_input(p, k))) != NULL && have;
  if (!have) {
    if (ins != few) free(ins);
    return vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
  }
  vm_attr attr = p->attr; /* this flush's host scalars and RNG counters */
  const vm_attr *now = &t->nodes[p->src]->attr;
  memcpy(attr.scalar, now->scalar, sizeof attr.scalar);
  attr.seed = now->seed;
  attr.counter = now->counter;
  /* each node on its own device's backend: a trace's 0-d weak scalars are
     the host's (backends take them as inputs from there) */
  vals[i] = run_pnode(vm_backend_of((kiln_device)p->meta.device), p, &attr, ins);
  if (ins != few) free(ins);
  if (vals[i]) return KILN_OK;
  return vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
}

/* kiln_set_cancel_flag: checked between kernels; nothing is committed, so
   what was pending stays pending */
static int interrupted(void) {
  volatile int *flag = vm_thread()->cancel;
  if (!flag || !*flag) return KILN_OK;
  return vm_error(KILN_ERR_STATE,
                  "interrupted: the evaluation stopped at a kernel boundary; "
                  "nothing was lost (pending values stay pending)");
}

/* A group runs as one compiled kernel when it has one and its inputs have
   the layout the kernel was compiled for; otherwise node by node.  Views
   always run on the interpreter (they move no data): a kernel reads them as
   strided inputs. */
static int run_group(const tr_plan *plan, const void *jit, const tr_trace *t, int g,
                     vm_tensor **vals, int *failed, int *last_group) {
  const tr_group *grp = &plan->groups[g];
  const vm_backend *be = plan->backend;
  int rc = KILN_OK, first = grp->first;
  *last_group = g;
  if (jit && be->has_kernel(jit, g)) {
    for (int i = grp->first; i <= grp->last && rc == KILN_OK; i++)
      if (vm_op_table[plan->nodes[i].op].kind == VM_KIND_VIEW) rc = run_node(plan, t, i, vals);
    int resume, through;
    if (rc == KILN_OK && be->run_group(jit, plan, t, g, vals, &rc, &resume, &through)) {
      /* the kernel computed the group up to `resume`; the rest (a
         reduction's epilogue) runs here.  A row kernel computed groups
         g..through (their values read later) */
      if (rc != KILN_OK) return rc;
      first = resume;
      *last_group = through;
      if (through > g) return KILN_OK;
    }
  }
  for (int i = first; i <= grp->last && rc == KILN_OK && (rc = interrupted()) == KILN_OK; i++)
    if (!vals[i] && plan->nodes[i].op != VM_OP_full && (rc = run_node(plan, t, i, vals)) != KILN_OK)
      *failed = plan->nodes[i].src;
  return rc;
}

static int run_plan(const tr_plan *plan, const tr_trace *t, vm_tensor **out, int *failed) {
  vm_tensor **vals = calloc((size_t)(plan->n ? plan->n : 1), sizeof *vals);
  if (!vals) return vm_error(KILN_ERR_OOM, "out of memory");
  const void *jit = atomic_load_explicit(&plan->jit, memory_order_acquire);
  int rc = KILN_OK, first_unfreed = 0;
  for (int g = 0; g < plan->ngroups && rc == KILN_OK && (rc = interrupted()) == KILN_OK; g++) {
    int through = g; /* a row kernel runs several groups */
    rc = run_group(plan, jit, t, g, vals, failed, &through);
    g = through;
    for (int k = plan->release_at[first_unfreed]; k < plan->release_at[g + 1]; k++) {
      int r = plan->release[k]; /* free what no later group reads */
      vm_release(vals[r]);
      vals[r] = NULL;
    }
    first_unfreed = g + 1;
  }
  for (int c = 0; c < t->n && rc == KILN_OK; c++)
    if (t->is_output[c] && !(out[c] = vm_retain(tr_run_value(plan, t, vals, plan->outputs[c]))))
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
  for (int i = 0; i < plan->n; i++) vm_release(vals[i]);
  free(vals);
  return rc;
}

static int run_trace(const tr_trace *t, vm_tensor **vals, int *failed) {
  int *last = malloc((size_t)t->n * sizeof(int));
  if (!last) return vm_error(KILN_ERR_OOM, "out of memory");
  for (int i = 0; i < t->n; i++) last[i] = i;
  for (int i = 0; i < t->n; i++)
    for (int k = 0; k < t->nodes[i]->nin; k++)
      if (t->refs[i][k] >= 0) last[t->refs[i][k]] = i;
  int rc = KILN_OK;
  for (int i = 0; i < t->n && rc == KILN_OK && (rc = interrupted()) == KILN_OK; i++) {
    const tr_node *n = t->nodes[i];
    vm_tensor *few[3], **ins = n->nin <= 3 ? few : malloc((size_t)n->nin * sizeof *ins);
    if (!ins) {
      rc = vm_error(KILN_ERR_OOM, "out of memory");
      break;
    }
    for (int k = 0; k < n->nin; k++) ins[k] = tr_run_value(NULL, t, vals, t->refs[i][k]);
    const vm_backend *be = vm_backend_of((kiln_device)n->meta.device); /* as in run_node */
    vals[i] = be->exec(n->op, n->nin, ins, &n->attr, &n->meta);
    if (ins != few) free(ins);
    if (!vals[i]) {
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
      *failed = i;
    }
    for (int k = 0; k < n->nin; k++) {
      int r = t->refs[i][k];
      if (r >= 0 && last[r] == i && !t->is_output[r] && vals[r]) {
        vm_release(vals[r]);
        vals[r] = NULL;
      }
    }
  }
  free(last);
  return rc;
}

/* the whole flush runs under one kernel token (vm/pool.h): its serial
   parts count against KILN_THREADS as much as its parallel ones */
int tr_run(const tr_plan *plan, const tr_trace *t, vm_tensor **vals, int *failed) {
  vm_pool_enter();
  int rc = plan ? run_plan(plan, t, vals, failed) : run_trace(t, vals, failed);
  vm_pool_leave();
  return rc;
}
