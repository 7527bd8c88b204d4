/* fuse.c — a plan's elementwise and reduce groups as fused CUDA kernels
 * (fuse.h): which nodes each kernel computes, what it reads and writes, its
 * CUDA C, and its arguments for one run. */
#include "fuse.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../trace/rows.h"
#include "../vm/dtype.h"
#include "../vm/fold.h"
#include "../vm/kernels.h"
#include "../vm/state.h"
#include "opgen.h"
#include "src.h"

/* --- planning ---------------------------------------------------------------------- */

static kiln_dtype ref_dtype(const tr_plan *plan, const tr_trace *t, int r) {
  return tr_ref_meta(plan, t, r)->dtype;
}

static bool computed(const tr_plan *plan, const gpu_fused *k, int r) {
  bool inside =
      (r >= k->first && r <= k->last) || (k->epi_last && r >= k->reduce && r <= k->epi_last);
  return inside && vm_op_table[plan->nodes[r].op].kind != VM_KIND_VIEW;
}

/* a value the kernel may index by the flat position: a fresh value (not
   a view, nor a uniform one: fills and folded nodes are broadcast views of
   one element) or a contiguous leaf, of the iteration's full shape */
static bool dense_full(const tr_plan *plan, const tr_trace *t, int r, const vm_meta *it) {
  const vm_meta *m = tr_ref_meta(plan, t, r);
  if (m->ndim != it->ndim || memcmp(m->shape, it->shape, (size_t)m->ndim * sizeof(int64_t)))
    return false;
  if (r >= 0) {
    const tr_pnode *p = &plan->nodes[r];
    return vm_op_table[p->op].kind != VM_KIND_VIEW && p->op != VM_OP_full && !p->fold;
  }
  const vm_tensor *v = t->leaves[-1 - r]->value;
  return v && vm_is_contiguous(v);
}

/* the input q that k reads r through in role (fuse.h GPU_IN_*) along
   axis, or -1 */
static int input_of(const gpu_fused *k, int r, int role, int axis) {
  for (int q = 0; q < k->nin; q++)
    if (k->ins[q] == r && k->role[q] == role && (role == GPU_IN_PLAIN || k->role_axis[q] == axis))
      return q;
  return -1;
}

/* input_of, added when k does not read it yet; -1 when k is full */
static int add_input_as(gpu_fused *k, int r, int role, int axis) {
  int q = input_of(k, r, role, axis);
  if (q >= 0) return q;
  if (k->nin + k->nout >= GPU_FUSE_MAX_IO) return -1;
  k->role[k->nin] = (uint8_t)role;
  k->role_axis[k->nin] = (int8_t)axis;
  k->ins[k->nin] = r;
  return k->nin++;
}

static bool add_input(gpu_fused *k, int r) { return add_input_as(k, r, GPU_IN_PLAIN, 0) >= 0; }

/* views run on the interpreter before a group's kernels: they may only
   view values from outside the group */
static bool views_of_outside(const tr_plan *plan, const tr_group *grp) {
  for (int i = grp->first; i <= grp->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW && p->nin > 0 && p->in[0] >= grp->first &&
        p->in[0] < i)
      return false;
  }
  return true;
}

static bool add_param(gpu_fused *k, int i) {
  for (int s = 0; s < k->nparams; s++)
    if (k->params[s] == i) return true;
  if (k->nparams == GPU_FUSE_MAX_PARAMS) return false;
  k->params[k->nparams++] = i;
  return true;
}

/* a fill k reads from outside: it takes the scalar, never the value
   (the run makes fills only for readers that need them: tr_run_value) */
static bool outside_fill(const tr_plan *plan, const gpu_fused *k, int r) {
  return tr_is_fill(plan, r) && !computed(plan, k, r);
}

/* k's coordinate along axis (fuse.h GPU_IN_COORD): one axis per kernel */
static bool add_coord(gpu_fused *k, int axis) {
  for (int q = 0; q < k->nin; q++)
    if (k->role[q] == GPU_IN_COORD && k->role_axis[q] != axis) return false;
  return add_input_as(k, GPU_COORD_REF, GPU_IN_COORD, axis) >= 0;
}

/* scatter_add, concat, argmax/argmin node i in elementwise kernel k (fuse.h:
   what they read comes from outside k, but a scatter's base) */
static bool add_move(const tr_plan *plan, const tr_trace *t, gpu_fused *k, int i) {
  const tr_pnode *p = &plan->nodes[i];
  kiln_dtype dt = p->meta.dtype;
  if (k->kind != GPU_FK_ELEMENTWISE || p->nin < 1 || p->nin > 3) return false;
  for (int j = p->op == VM_OP_scatter_add ? 1 : 0; j < p->nin;
       j++) /* a concat's fill part: a parameter */
    if (computed(plan, k, p->in[j]) && !(p->op == VM_OP_concat && tr_is_fill(plan, p->in[j])))
      return false;
  int axis = p->attr.axis;
  if (p->op == VM_OP_scatter_add) {
    int base = p->in[0], idx = p->in[1], src = p->in[2];
    if (p->nin != 3 || ref_dtype(plan, t, base) != dt || ref_dtype(plan, t, idx) != KILN_I64 ||
        ref_dtype(plan, t, src) != dt || outside_fill(plan, k, idx) || outside_fill(plan, k, src))
      return false;
    kiln_dtype two[2] = {dt, dt};
    if (!gpu_src_node_supported(VM_OP_add, dt, 2, two) ||
        (outside_fill(plan, k, base) ? !add_param(k, base)
                                     : !computed(plan, k, base) && !add_input(k, base)))
      return false;
    return add_input_as(k, idx, GPU_IN_SCATTER_INDEX, axis) >= 0 &&
           add_input_as(k, src, GPU_IN_SCATTER_SRC, axis) >= 0 && add_coord(k, axis);
  }
  if (p->op == VM_OP_concat) {
    for (int j = 0; j < p->nin; j++) {
      int r = p->in[j];
      if (ref_dtype(plan, t, r) != dt || (tr_is_fill(plan, r) && !add_param(k, r)) ||
          add_input_as(k, r, GPU_IN_PART, axis) < 0) /* a fill's slot carries only its extent */
        return false;
    }
    return add_coord(k, axis);
  }
  uint32_t mask = p->attr.axes_mask;
  kiln_dtype in = ref_dtype(plan, t, p->in[0]);
  if (!vm_op_scans(p->op) || p->nin != 1 || dt != KILN_I64 || in == KILN_BOOL || !mask ||
      (mask & (mask - 1)) || outside_fill(plan, k, p->in[0]))
    return false;
  return add_input_as(k, p->in[0], GPU_IN_SCAN, __builtin_ctz(mask)) >= 0;
}

/* node i, computed per element by k: its params and the inputs it reads
   from outside k; false when the kernels lack it or k is full */
static bool add_node(const tr_plan *plan, const tr_trace *t, gpu_fused *k, int i) {
  const tr_pnode *p = &plan->nodes[i];
  if (p->op == VM_OP_full) return add_param(k, i);
  if (p->op == VM_OP_scatter_add || p->op == VM_OP_concat || vm_op_scans(p->op))
    return add_move(plan, t, k, i);
  if (vm_op_gathers(p->op)) { /* source and index from outside k (trace/plan.c in_place) */
    int src = p->in[0], idx = p->in[1], axis = p->attr.axis;
    if (p->nin != 2 || computed(plan, k, src) || computed(plan, k, idx) ||
        outside_fill(plan, k, src) || outside_fill(plan, k, idx) ||
        ref_dtype(plan, t, idx) != KILN_I64 || ref_dtype(plan, t, src) != p->meta.dtype)
      return false;
    return add_input_as(k, src, GPU_IN_SOURCE, axis) >= 0 &&
           add_input_as(k, idx, p->op == VM_OP_index_select ? GPU_IN_SELECT : GPU_IN_PLAIN, axis) >=
               0;
  }
  if (p->nin > 3) return false;
  kiln_dtype in[3];
  for (int j = 0; j < p->nin; j++) {
    int r = p->in[j];
    in[j] = ref_dtype(plan, t, r);
    if (outside_fill(plan, k, r) ? !add_param(k, r) : !computed(plan, k, r) && !add_input(k, r))
      return false;
  }
  return gpu_src_node_supported(p->op, p->meta.dtype, p->nin, in);
}

/* whether node i is read after `last` (so k stores it): fills never are
   stored, their readers take the scalar or make the fill (tr_run_value) */
static bool read_after(const tr_plan *plan, int i, int last) {
  return (plan->escapes[i] || plan->nodes[i].last_use > last) && plan->nodes[i].op != VM_OP_full;
}

static bool add_output(gpu_fused *k, int i) {
  if (k->nin + k->nout >= GPU_FUSE_MAX_IO) return false;
  k->outs[k->nout++] = i;
  return true;
}

/* The vector width of an elementwise kernel whose operands are all dense
   (indexed by the flat position): as many elements as 16 bytes of its
   widest operand hold, so each access of the widest is one 16-byte load
   or store (narrower operands move V of theirs at once).  0: some input
   is strided, or one element per access gains nothing. */
static int vector_width(const tr_plan *plan, const tr_trace *t, const gpu_fused *k) {
  size_t widest = 1;
  for (int q = 0; q < k->nin; q++) {
    if (!k->contig[q]) return 0;
    size_t es = vm_dtype_size(ref_dtype(plan, t, k->ins[q]));
    if (es > widest) widest = es;
  }
  for (int q = 0; q < k->nout; q++) {
    size_t es = vm_dtype_size(plan->nodes[k->outs[q]].meta.dtype);
    if (es > widest) widest = es;
  }
  int v = (int)(16 / widest);
  return v > 1 ? v : 0;
}

/* nodes first..last (of one shape) as one elementwise kernel; false when
   they do not fit one, with *stop the node it could not take (an op the
   kernels lack, or one operand too many), or last + 1 */
static bool plan_elementwise(const tr_plan *plan, const tr_trace *t, int first, int last,
                             gpu_fused *k, int *stop) {
  memset(k, 0, sizeof *k);
  k->kind = GPU_FK_ELEMENTWISE;
  k->first = first;
  k->last = last;
  k->reduce = -1;
  for (int i = first; i <= last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    *stop = i;
    if (!add_node(plan, t, k, i)) return false;
    if (read_after(plan, i, last) && !add_output(k, i)) return false;
  }
  *stop = last + 1;
  if (k->nout == 0) return false;
  const vm_meta *it = &plan->nodes[k->outs[0]].meta;
  for (int q = 0; q < k->nin; q++)
    k->contig[q] = k->role[q] == GPU_IN_PLAIN && dense_full(plan, t, k->ins[q], it);
  k->vec = vector_width(plan, t, k);
  return true;
}

static int64_t numel_of(const vm_meta *m) {
  int64_t n = 1;
  for (int d = 0; d < m->ndim; d++) n *= m->shape[d];
  return n;
}

/* the fold of reduction r over its input's shape rin: outputs, positions
   each, and the pass schedule (opgen.h) */
static void reduce_schedule(const tr_pnode *r, const vm_meta *rin, gpu_red_sched *s) {
  int64_t nout = 1, count = 1;
  for (int d = 0; d < rin->ndim; d++) {
    if (r->attr.axes_mask & (1u << d))
      count *= rin->shape[d];
    else
      nout *= rin->shape[d];
  }
  gpu_reduce_schedule(r->op, rin->dtype,
                      gpu_reduce_trailing(rin->ndim, rin->shape, r->attr.axes_mask), nout, count,
                      s);
}

_Static_assert(GPU_FUSE_MAX_IO <= 32, "gpu_fused.epi_in/epi_out: a bit per operand");

/* The epilogue red+1..last of reduce kernel k (no join) into k itself:
   every node of the reduction's output shape, reading the reduction,
   each other, fills, and inputs from outside the group that the
   producers do not read (they are indexed by the output's position, the
   producers' by the input's); false (k unchanged) when it cannot be. */
static bool fuse_epilogue(const tr_plan *plan, const tr_trace *t, int red, int last, gpu_fused *k) {
  gpu_fused keep = *k;
  const vm_meta *om = &plan->nodes[red].meta;
  int nin0 = k->nin, nout0 = k->nout;
  k->epi_last = last;
  bool ok = true;
  for (int i = red + 1; i <= last && ok; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    ok = tr_meta_shape_is(&p->meta, om->ndim, om->shape) && !vm_op_gathers(p->op);
    for (int j = 0; j < p->nin && ok; j++) {
      int r = p->in[j];
      if (computed(plan, k, r)) ok = r >= red; /* not a producer's per-position value */
      for (int q = 0; q < nin0 && ok; q++) ok = k->ins[q] != r;
    }
    ok = ok && add_node(plan, t, k, i);
    if (ok && read_after(plan, i, last)) ok = add_output(k, i);
  }
  if (!ok) {
    *k = keep;
    return false;
  }
  for (int q = nin0; q < k->nin; q++) k->epi_in |= 1u << q;
  for (int q = nout0; q < k->nout; q++) k->epi_out |= 1u << q;
  return true;
}

/* a reduce group: its producers and reduction as one kernel (k[0]), the
   join of a long reduction (k[1]), the epilogue (last, optional) */
static bool plan_reduce_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused_group *fg) {
  const tr_group *grp = &plan->groups[g];
  int red = -1;
  for (int i = grp->first; i <= grp->last && red < 0; i++)
    if (vm_op_table[plan->nodes[i].op].kind == VM_KIND_REDUCE) red = i;
  if (red < 0) return false;
  const tr_pnode *r = &plan->nodes[red];
  const vm_meta *rin = tr_ref_meta(plan, t, r->in[0]);
  if (r->op == VM_OP_argmax || r->op == VM_OP_argmin || r->nin != 1 ||
      r->meta.dtype != rin->dtype || !gpu_src_reduce_supported(r->op, rin->dtype))
    return false;
  gpu_fused *k = &fg->k[fg->nk++];
  memset(k, 0, sizeof *k);
  k->kind = GPU_FK_REDUCE;
  k->first = grp->first;
  k->last = red - 1;
  k->reduce = red;
  k->outs[k->nout++] = red;
  for (int i = grp->first; i < red; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    if (p->meta.ndim != rin->ndim ||
        memcmp(p->meta.shape, rin->shape, (size_t)rin->ndim * sizeof(int64_t)))
      return false; /* producers run per element of the reduction's input */
    if (!add_node(plan, t, k, i)) return false;
    if (read_after(plan, i, red) && !add_output(k, i)) return false;
  }
  if (!computed(plan, k, r->in[0]) && !add_input(k, r->in[0])) return false;
  gpu_red_sched s;
  reduce_schedule(r, rin, &s);
  k->variant = s.variant;
  /* the flat index o * count + p is the element's in a dense input of the
     full shape only when the reduced dims are the trailing ones */
  for (int q = 0; q < k->nin; q++)
    k->contig[q] = s.variant == GPU_RED_LANE && k->role[q] == GPU_IN_PLAIN &&
                   dense_full(plan, t, k->ins[q], rin);
  bool epilogue = false;
  for (int i = red + 1; i <= grp->last && !epilogue; i++)
    epilogue = vm_op_table[plan->nodes[i].op].kind != VM_KIND_VIEW;
  if (epilogue && s.join < 0 && fuse_epilogue(plan, t, red, grp->last, k)) return true;
  if (s.join >= 0) {
    gpu_fused *j = &fg->k[fg->nk++];
    memset(j, 0, sizeof *j);
    j->kind = GPU_FK_JOIN;
    j->first = red;
    j->last = red - 1; /* computes no node */
    j->reduce = red;
    j->variant = s.join;
  }
  int stop;
  if (epilogue && !plan_elementwise(plan, t, red + 1, grp->last, &fg->k[fg->nk], &stop)) {
    memset(&fg->k[fg->nk], 0, sizeof fg->k[0]); /* the epilogue runs op by op */
    epilogue = false;
  }
  if (epilogue) fg->nk++;
  return true;
}

/* --- row kernels (fuse.h GPU_FK_ROWS) --- */

static bool row_varies(const gpu_fused *k, int i) { return (k->varies >> (i - k->first)) & 1u; }

typedef struct {
  const tr_row_space *sp;
  const tr_trace *t;
  gpu_fused *k;
  int g; /* the run's first group */
} rows_fill_ctx;

/* one node of a row kernel (tr_rows_walk): a reduction's input, or the
   node's code and inputs, and its output if stored */
static bool rows_take(void *ctx, const tr_row_node *n) {
  rows_fill_ctx *c = ctx;
  const tr_plan *plan = c->sp->plan;
  gpu_fused *k = c->k;
  const tr_pnode *p = &plan->nodes[n->i];
  if (p->nin > 3 || vm_op_gathers(p->op)) return false; /* a row kernel gathers nothing */
  if (n->reduction) {
    if (k->reduce < 0) k->reduce = n->i;
    if (!computed(plan, k, p->in[0]) && !add_input(k, p->in[0])) return false;
  } else if (!add_node(plan, c->t, k, n->i)) {
    return false;
  }
  if (n->varies) k->varies |= 1ull << (n->i - k->first);
  return !n->read_after || add_output(k, n->i);
}

/* groups g..gb as one row kernel; false if they cannot be one */
static bool rows_fill(void *ctx, int gb) {
  rows_fill_ctx *c = ctx;
  const tr_plan *plan = c->sp->plan;
  gpu_fused *k = c->k;
  memset(k, 0, sizeof *k);
  k->kind = GPU_FK_ROWS;
  k->first = plan->groups[c->g].first;
  k->last = plan->groups[gb].last;
  k->through = gb;
  k->reduce = -1;
  k->variant = GPU_RED_LANE;
  if (!tr_rows_walk(c->sp, c->g, gb, GPU_ROW_MAX_NODES, rows_take, c)) return false;
  for (int q = 0; q < k->nin; q++) {
    if (tr_meta_const_along(tr_ref_meta(plan, c->t, k->ins[q]), c->sp->R, c->sp->axes))
      k->hoisted |= 1u << q;
    else
      k->contig[q] = dense_full(plan, c->t, k->ins[q], c->sp->R);
  }
  return true;
}

static const vm_meta *leaf_meta(const void *t, int leaf) {
  return &((const tr_trace *)t)->leaves[leaf]->meta;
}

/* the reductions the generated code folds in a row */
static bool row_folds(vm_opcode op, kiln_dtype in, kiln_dtype out) {
  return out == in && gpu_src_reduce_supported(op, in);
}

/* group g, a reduction, and the longest run of groups after it that one
   row kernel computes; false when there is none */
static bool plan_rows(const tr_plan *plan, int g, const tr_trace *t, gpu_fused_group *fg) {
  tr_row_space sp;
  if (!tr_rows_enabled() || !tr_rows_space(plan, g, leaf_meta, t, row_folds, &sp)) return false;
  const vm_meta *R = sp.R;
  if (!gpu_reduce_trailing(R->ndim, R->shape, sp.axes)) return false;
  int64_t count = 1;
  for (int d = 0; d < R->ndim; d++)
    if (sp.axes & (1u << d)) count *= R->shape[d];
  /* a row longer than a chunk takes a second kernel (the join): those
     reductions run group by group */
  if (count < 2 || count > VM_FOLD_CHUNK) return false;
  rows_fill_ctx fc = {&sp, t, &fg->k[0], g};
  if (tr_rows_plan(&sp, g, rows_fill, &fc) >= 0) {
    fg->nk = 1;
    return true;
  }
  memset(&fg->k[0], 0, sizeof fg->k[0]);
  return false;
}

/* An elementwise group as a chain of kernels, each the longest run of
   nodes from where the last one stopped that fits one kernel: a group
   with more operands than a kernel's arguments hold (GPU_FUSE_MAX_IO)
   takes several launches, not one per op.  A chain ends at a node no
   kernel computes (an op the kernels lack), or after
   GPU_FUSE_MAX_KERNELS kernels: the rest of the group runs op by op. */
static bool plan_chain(const tr_plan *plan, const tr_trace *t, int first, int last,
                       gpu_fused_group *fg) {
  while (first <= last && fg->nk < GPU_FUSE_MAX_KERNELS) {
    int end = last, stop;
    /* ending sooner makes more values outputs (read after the end), so
       the end moves down to before the node that overflowed until the
       run fits */
    while (!plan_elementwise(plan, t, first, end, &fg->k[fg->nk], &stop)) {
      end = stop <= end ? stop - 1 : end - 1;
      if (end < first) {
        memset(&fg->k[fg->nk], 0, sizeof fg->k[0]);
        return fg->nk > 0;
      }
    }
    fg->nk++;
    first = end + 1;
  }
  return fg->nk > 0;
}

static bool plan_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused_group *fg) {
  const tr_group *grp = &plan->groups[g];
  memset(fg, 0, sizeof *fg);
  fg->group = g;
  if (!views_of_outside(plan, grp)) return false;
  if (plan_rows(plan, g, t, fg)) return true;
  if (grp->kind == TR_GROUP_REDUCE) return plan_reduce_group(plan, g, t, fg);
  if (grp->kind != TR_GROUP_ELEMENTWISE) return false;
  return plan_chain(plan, t, grp->first, grp->last, fg);
}

/* --- source ------------------------------------------------------------------------ */

static void emit_fargs(gpu_src *b) {
  gpu_src_printf(b,
                 "#ifndef KILN_GPU_FARGS\n"
                 "#define KILN_GPU_FARGS\n"
                 "struct gpu_fargs {\n"
                 "  void *ptr[%d];\n"
                 "  i64 stride[%d][K_MAX_DIMS];\n"
                 "  i64 shape[K_MAX_DIMS];\n"
                 "  u64 param[%d];\n"
                 "  i64 n;\n"
                 "  i64 extent[4];\n"
                 "  i64 gstride[%d];\n"
                 "  i64 gextent[%d];\n"
                 "  i32 ndim;\n"
                 "  i32 axis;\n"
                 "};\n",
                 GPU_FUSE_MAX_IO, GPU_FUSE_MAX_IO, GPU_FUSE_MAX_PARAMS, GPU_FUSE_MAX_IO,
                 GPU_FUSE_MAX_IO);
  gpu_src_printf(
      b,
      "static_assert(sizeof(gpu_fargs) == %zu, \"gpu_fargs: host and device layouts differ\");\n",
      sizeof(gpu_fargs));
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, ptr);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, stride);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, shape);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, param);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, n);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, extent);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, gstride);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, gextent);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, ndim);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, axis);
  /* V elements of T moved as one access of V * sizeof(T) bytes (16 at most) */
  gpu_src_printf(b,
                 "template <typename T, int V> struct alignas(sizeof(T) * V) kvec { T v[V]; };\n");
  gpu_src_printf(b, "#endif /* KILN_GPU_FARGS */\n");
}

/* a full node's value from its 8-byte slot (vm_store_f64 wrote it in its
   dtype at the slot's start; the host is little-endian, as is the GPU) */
static void param_expr(gpu_src *b, kiln_dtype dt, int s) {
  switch (dt) {
    case KILN_F32:
      gpu_src_printf(b, "__int_as_float((i32)(u32)a.param[%d])", s);
      break;
    case KILN_F64:
      gpu_src_printf(b, "__longlong_as_double((i64)a.param[%d])", s);
      break;
    case KILN_I32:
      gpu_src_printf(b, "(i32)(u32)a.param[%d]", s);
      break;
    case KILN_I64:
      gpu_src_printf(b, "(i64)a.param[%d]", s);
      break;
    case KILN_BF16:
    case KILN_F16: /* the half's bits */
      gpu_src_printf(b, "k_%s_bits((u16)(a.param[%d] & 0xffff))", dt == KILN_BF16 ? "bf16" : "f16",
                     s);
      break;
    case KILN_I16:
      gpu_src_printf(b, "(i16)(u16)(a.param[%d] & 0xffff)", s);
      break;
    case KILN_I8:
      gpu_src_printf(b, "(i8)(u8)(a.param[%d] & 0xff)", s);
      break;
    default: /* bool, u8 */
      gpu_src_printf(b, "(u8)(a.param[%d] & 0xff)", s);
      break;
  }
}

/* the name of ref r in k's code: v<node> when k computes it, prm<slot> for
   a fill from outside, else x<input> */
static void ref_name(const tr_plan *plan, const gpu_fused *k, int r, char *buf, size_t cap) {
  if (computed(plan, k, r)) {
    snprintf(buf, cap, "v%d", r - k->first);
    return;
  }
  for (int s = 0; s < k->nparams; s++)
    if (k->params[s] == r) {
      snprintf(buf, cap, "prm%d", s);
      return;
    }
  snprintf(buf, cap, "x%d", input_of(k, r, GPU_IN_PLAIN, 0));
}

/* the pointers to k's outputs (from out0) and inputs, and the values of
   the fills it reads from outside (prm<slot>) */
static void emit_pointers(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k,
                          int out0) {
  for (int s = 0; s < k->nparams; s++) {
    const tr_pnode *p = &plan->nodes[k->params[s]];
    if (computed(plan, k, k->params[s])) continue;
    gpu_src_printf(b, "  const %s prm%d = ", gpu_src_ctype(p->meta.dtype), s);
    param_expr(b, p->meta.dtype, s);
    gpu_src_printf(b, ";\n");
  }
  for (int q = out0; q < k->nout; q++) {
    const char *ct = gpu_src_ctype(plan->nodes[k->outs[q]].meta.dtype);
    gpu_src_printf(b, "  %s *o%d = (%s *)a.ptr[%d];\n", ct, q, ct, q);
  }
  for (int q = 0; q < k->nin; q++) {
    if (k->role[q] == GPU_IN_COORD) continue; /* no buffer: its offset is the coordinate */
    const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
    gpu_src_printf(b, "  const %s *in%d = (const %s *)a.ptr[%d];\n", ct, q, ct, k->nout + q);
  }
}

/* f<operand> += the offsets of the row-major index `from` over dims
   [d0, d1) of every operand in `which` (ptr indices) */
static void emit_offsets(gpu_src *b, const char *from, const char *d0, const char *d1,
                         const bool *which, const char *indent) {
  gpu_src_printf(b, "%s{\n%s  i64 rr = %s;\n%s  for (int d = %s - 1; d >= %s; d--) {\n", indent,
                 indent, from, indent, d1, d0);
  gpu_src_printf(b,
                 "%s    const i64 s = a.shape[d], qd = rr / s, c = rr - qd * s;\n%s    rr = qd;\n",
                 indent, indent);
  for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
    if (which[j]) gpu_src_printf(b, "%s    f%d += c * a.stride[%d][d];\n", indent, j, j);
  gpu_src_printf(b, "%s  }\n%s}\n", indent, indent);
}

/* a scatter_add, concat or argmax/argmin node (fuse.h), as the CPU's
   kernels compute them (jit_cpu/kernel.c emit_scatter, emit_concat,
   emit_argscan): the interpreter's order, picks for its branches */
static void emit_move(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k, int i,
                      const char *indent) {
  const tr_pnode *p = &plan->nodes[i];
  kiln_dtype dt = p->meta.dtype;
  const char *ct = gpu_src_ctype(dt);
  int axis = p->attr.axis, v = i - k->first;
  if (vm_op_scans(p->op)) {
    int q = input_of(k, p->in[0], GPU_IN_SCAN, __builtin_ctz(p->attr.axes_mask)), f = k->nout + q;
    const char *it = gpu_src_ctype(ref_dtype(plan, t, p->in[0]));
    bool fl = vm_dtype_is_float(ref_dtype(plan, t, p->in[0]));
    gpu_src_printf(b, "%s{\n%s  %s best = in%d[f%d];\n%s  i64 bi = 0;\n%s  bool nan = %s;\n",
                   indent, indent, it, q, f, indent, indent, fl ? "best != best" : "false");
    gpu_src_printf(b,
                   "%s  for (i64 kk = 1; kk < a.gextent[%d]; kk++) {\n%s    const %s w = in%d[f%d "
                   "+ kk * a.gstride[%d]];\n",
                   indent, q, indent, it, q, f, q);
    gpu_src_printf(b, "%s    const bool take = !nan && (w %s best%s);\n", indent,
                   p->op == VM_OP_argmax ? ">" : "<", fl ? " || w != w" : "");
    gpu_src_printf(b, "%s    best = take ? w : best;\n%s    bi = take ? kk : bi;\n", indent,
                   indent);
    if (fl) gpu_src_printf(b, "%s    nan = nan || w != w;\n", indent);
    gpu_src_printf(b, "%s  }\n%s  v%d = bi;\n%s}\n", indent, indent, v, indent);
    return;
  }
  int qc = input_of(k, GPU_COORD_REF, GPU_IN_COORD, axis);
  if (p->op == VM_OP_scatter_add) {
    char base[16];
    ref_name(plan, k, p->in[0], base, sizeof base);
    int qi = input_of(k, p->in[1], GPU_IN_SCATTER_INDEX, axis),
        qs = input_of(k, p->in[2], GPU_IN_SCATTER_SRC, axis);
    gpu_src_printf(b, "%s{\n%s  %s acc = %s;\n", indent, indent, ct, base);
    gpu_src_printf(b, "%s  for (i64 kk = 0; kk < a.gextent[%d]; kk++) {\n", indent, qi);
    gpu_src_printf(b, "%s    const %s sv = in%d[f%d + kk * a.gstride[%d]];\n%s    %s sum;\n%s    ",
                   indent, ct, qs, k->nout + qs, qs, indent, ct, indent);
    kiln_dtype dts[2] = {dt, dt};
    const char *args[2] = {"acc", "sv"};
    gpu_src_node(b, VM_OP_add, dt, 2, dts, args, "sum");
    gpu_src_printf(b, "%s    acc = in%d[f%d + kk * a.gstride[%d]] == f%d ? sum : acc;\n%s  }\n",
                   indent, qi, k->nout + qi, qi, k->nout + qc, indent);
    gpu_src_printf(b, "%s  v%d = acc;\n%s}\n", indent, v, indent);
    return;
  }
  /* concat: part j at the coordinate less the extents before it, clamped */
  gpu_src_printf(b, "%s{\n%s  const i64 at = f%d;\n%s  i64 from = 0;\n", indent, indent,
                 k->nout + qc, indent);
  for (int j = 0; j < p->nin; j++) {
    int r = p->in[j], q = input_of(k, r, GPU_IN_PART, axis);
    gpu_src_printf(b,
                   "%s  i64 c%d = at - from;\n%s  c%d = c%d < 0 ? 0 : c%d > a.gextent[%d] - 1 ? "
                   "a.gextent[%d] - 1 : c%d;\n",
                   indent, j, indent, j, j, j, q, q, j);
    if (tr_is_fill(plan, r)) { /* its parameter (v<node> when k computes the fill) */
      char name[16];
      ref_name(plan, k, r, name, sizeof name);
      gpu_src_printf(b, "%s  const %s p%d = %s;\n", indent, ct, j, name);
    } else {
      gpu_src_printf(b, "%s  const %s p%d = in%d[f%d + c%d * a.gstride[%d]];\n", indent, ct, j, q,
                     k->nout + q, j, q);
    }
    gpu_src_printf(b, "%s  from += a.gextent[%d];\n%s  const i64 e%d = from;\n", indent, q, indent,
                   j);
  }
  gpu_src_printf(b, "%s  v%d = ", indent, v);
  for (int j = 0; j < p->nin - 1; j++) gpu_src_printf(b, "at < e%d ? p%d : ", j, j);
  gpu_src_printf(b, "p%d;\n%s}\n", p->nin - 1, indent);
}

/* node i of k: assigns its value to v<i - first>, declared by the caller */
static void emit_node(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k, int i,
                      const char *indent) {
  const tr_pnode *p = &plan->nodes[i];
  if (p->op == VM_OP_full) {
    int s = 0;
    while (k->params[s] != i) s++;
    gpu_src_printf(b, "%sv%d = ", indent, i - k->first);
    param_expr(b, p->meta.dtype, s);
    gpu_src_printf(b, ";\n");
    return;
  }
  if (p->op == VM_OP_scatter_add || p->op == VM_OP_concat || vm_op_scans(p->op)) {
    emit_move(b, plan, t, k, i, indent);
    return;
  }
  if (vm_op_gathers(
          p->op)) { /* the source at its offset without the axis, plus the clamped index's */
    int axis = p->attr.axis, qs = input_of(k, p->in[0], GPU_IN_SOURCE, axis);
    int qi =
        input_of(k, p->in[1], p->op == VM_OP_index_select ? GPU_IN_SELECT : GPU_IN_PLAIN, axis);
    gpu_src_printf(
        b, "%s{\n%s  const i64 e = a.gextent[%d], j = x%d < 0 ? 0 : x%d >= e ? e - 1 : x%d;\n",
        indent, indent, qs, qi, qi, qi);
    gpu_src_printf(b, "%s  v%d = in%d[f%d + j * a.gstride[%d]];\n%s}\n", indent, i - k->first, qs,
                   k->nout + qs, qs, indent);
    return;
  }
  char names[3][16], dst[16];
  const char *args[3];
  kiln_dtype in[3];
  for (int j = 0; j < p->nin; j++) {
    in[j] = ref_dtype(plan, t, p->in[j]);
    ref_name(plan, k, p->in[j], names[j], sizeof names[j]);
    args[j] = names[j];
  }
  snprintf(dst, sizeof dst, "v%d", i - k->first);
  gpu_src_printf(b, "%s", indent);
  gpu_src_node(b, p->op, p->meta.dtype, p->nin, in, args, dst);
}

/* k's nodes (v<node - first>), its inputs x<q> loaded before */
static void emit_values(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k,
                        const char *indent) {
  for (int i = k->first; i <= k->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    gpu_src_printf(b, "%s%s v%d;\n", indent, gpu_src_ctype(p->meta.dtype), i - k->first);
    emit_node(b, plan, t, k, i, indent);
  }
}

/* the loads of k's inputs (x<q>, at `flat` or f<operand>) and its nodes
   (v<node - first>) */
static void emit_nodes(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k,
                       const char *flat, const char *indent) {
  for (int q = 0; q < k->nin; q++) {
    if ((k->epi_in >> q) & 1u) continue; /* read at the output's position (emit_store) */
    if (k->role[q] != GPU_IN_PLAIN && k->role[q] != GPU_IN_SELECT)
      continue; /* read where emit_node moves */
    const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
    if (k->contig[q])
      gpu_src_printf(b, "%sconst %s x%d = in%d[%s];\n", indent, ct, q, q, flat);
    else
      gpu_src_printf(b, "%sconst %s x%d = in%d[f%d];\n", indent, ct, q, q, k->nout + q);
  }
  emit_values(b, plan, t, k, indent);
}

/* The vector path (a.extent[0] = 1: every operand aligned to its
   vector's size): element i0 + e of each vector is computed exactly as
   the scalar loop computes element i, so the bits are the same; the
   scalar loop then does the tail from `from` on. */
static void emit_vector_loop(gpu_src *b, const tr_plan *plan, const tr_trace *t,
                             const gpu_fused *k) {
  int V = k->vec;
  gpu_src_printf(b, "  i64 from = 0;\n  if (a.extent[0]) {\n    const i64 nv = a.n / %d;\n", V);
  gpu_src_printf(b,
                 "    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < nv; "
                 "j += (i64)gridDim.x * blockDim.x) {\n      const i64 i0 = j * %d;\n",
                 V);
  for (int q = 0; q < k->nin; q++) {
    const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
    gpu_src_printf(b, "      const kvec<%s, %d> lx%d = *(const kvec<%s, %d> *)(in%d + i0);\n", ct,
                   V, q, ct, V, q);
  }
  for (int q = 0; q < k->nout; q++) {
    const char *ct = gpu_src_ctype(plan->nodes[k->outs[q]].meta.dtype);
    gpu_src_printf(b, "      kvec<%s, %d> so%d;\n", ct, V, q);
  }
  gpu_src_printf(b, "#pragma unroll\n      for (int e = 0; e < %d; e++) {\n", V);
  for (int q = 0; q < k->nin; q++)
    gpu_src_printf(b, "        const %s x%d = lx%d.v[e];\n",
                   gpu_src_ctype(ref_dtype(plan, t, k->ins[q])), q, q);
  emit_values(b, plan, t, k, "        ");
  for (int q = 0; q < k->nout; q++)
    gpu_src_printf(b, "        so%d.v[e] = v%d;\n", q, k->outs[q] - k->first);
  gpu_src_printf(b, "      }\n");
  for (int q = 0; q < k->nout; q++) {
    const char *ct = gpu_src_ctype(plan->nodes[k->outs[q]].meta.dtype);
    gpu_src_printf(b, "      *(kvec<%s, %d> *)(o%d + i0) = so%d;\n", ct, V, q, q);
  }
  gpu_src_printf(b, "    }\n    from = nv * %d;\n  }\n", V);
}

/* an elementwise kernel's body after its signature */
static void emit_elementwise(gpu_src *b, const tr_plan *plan, const tr_trace *t,
                             const gpu_fused *k) {
  emit_pointers(b, plan, t, k, 0);
  if (k->vec) emit_vector_loop(b, plan, t, k);
  gpu_src_printf(b,
                 "  for (i64 i = %s(i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; "
                 "i += (i64)gridDim.x * blockDim.x) {\n",
                 k->vec ? "from + " : "");
  bool strided[GPU_FUSE_MAX_IO] = {false}, any = false;
  for (int q = 0; q < k->nin; q++)
    if (!k->contig[q]) {
      gpu_src_printf(b, "    i64 f%d = 0;\n", k->nout + q);
      strided[k->nout + q] = any = true;
    }
  if (any) emit_offsets(b, "i", "0", "a.ndim", strided, "    ");
  emit_nodes(b, plan, t, k, "i", "    ");
  for (int q = 0; q < k->nout; q++)
    gpu_src_printf(b, "    o%d[i] = v%d;\n", q, k->outs[q] - k->first);
  gpu_src_printf(b, "  }\n}\n");
}

/* a fused epilogue (gpu_fused.epi_last): `kstore(o, r)` stores result r
   of output o and computes the epilogue's nodes there, reading its inputs
   at o's offsets over the kept dims [0, a.axis) */
static void emit_store(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k) {
  const tr_pnode *r = &plan->nodes[k->reduce];
  const char *rt = gpu_src_ctype(r->meta.dtype);
  gpu_src_printf(b, "  auto kstore = [&](i64 o, %s r) {\n    out[o] = r;\n", rt);
  bool strided[GPU_FUSE_MAX_IO] = {false};
  for (int q = 0; q < k->nin; q++)
    if ((k->epi_in >> q) & 1u) {
      strided[k->nout + q] = true;
      gpu_src_printf(b, "    i64 f%d = 0;\n", k->nout + q);
    }
  if (k->epi_in) emit_offsets(b, "o", "0", "a.axis", strided, "    ");
  for (int q = 0; q < k->nin; q++)
    if ((k->epi_in >> q) & 1u)
      gpu_src_printf(b, "    const %s x%d = in%d[f%d];\n",
                     gpu_src_ctype(ref_dtype(plan, t, k->ins[q])), q, q, k->nout + q);
  gpu_src_printf(b, "    const %s v%d = r;\n", rt, k->reduce - k->first);
  for (int i = k->reduce + 1; i <= k->epi_last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    gpu_src_printf(b, "    %s v%d;\n", gpu_src_ctype(p->meta.dtype), i - k->first);
    emit_node(b, plan, t, k, i, "    ");
  }
  for (int q = 1; q < k->nout; q++)
    if ((k->epi_out >> q) & 1u) gpu_src_printf(b, "    o%d[o] = v%d;\n", q, k->outs[q] - k->first);
  gpu_src_printf(b, "  };\n");
}

/* a reduction's body: the op kernel's fold (src.h gpu_src_reduce), whose
   position p of output o is computed here.  Each position is read exactly
   once, so producers read later are stored from there.  Operands indexed
   by strides get their offset of o once (b<operand>) and of p per read. */
static void emit_reduce(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k) {
  const tr_pnode *r = &plan->nodes[k->reduce];
  kiln_dtype dt = ref_dtype(plan, t, r->in[0]);
  gpu_src src = {0}, item = {0};
  emit_pointers(&src, plan, t, k, 1);
  bool strided[GPU_FUSE_MAX_IO] = {false}, any = false;
  bool trailing = k->variant == GPU_RED_LANE;
  bool epi_out[GPU_FUSE_MAX_IO] = {false};
  for (int q = 0; q < k->nout; q++) epi_out[q] = (k->epi_out >> q) & 1u;
  for (int q = 1; q < k->nout; q++)
    strided[q] = !trailing && !epi_out[q]; /* producers' outputs: dense, of the input's shape */
  for (int q = 0; q < k->nin; q++) strided[k->nout + q] = !k->contig[q] && !((k->epi_in >> q) & 1u);
  for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
    if (strided[j]) {
      gpu_src_printf(&item, "%s b%d = 0", any ? "," : "    i64", j);
      any = true;
    }
  if (any) {
    gpu_src_printf(&item, ";\n");
    /* the offsets of o over the kept dims, into b<operand> */
    gpu_src_printf(
        &item,
        "    {\n      i64 rr = o;\n      for (int d = a.axis - 1; d >= 0; d--) {\n"
        "        const i64 s = a.shape[d], qd = rr / s, c = rr - qd * s;\n        rr = qd;\n");
    for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
      if (strided[j]) gpu_src_printf(&item, "        b%d += c * a.stride[%d][d];\n", j, j);
    gpu_src_printf(&item, "      }\n    }\n");
  }
  bool flat = trailing && k->nout > 1;
  for (int q = 0; q < k->nin; q++) flat = flat || k->contig[q];
  gpu_src_printf(&item, "    auto ld = [&](i64 p) -> %s {\n", gpu_src_ctype(dt));
  if (flat) gpu_src_printf(&item, "      const i64 flat = o * count + p;\n");
  if (any) {
    for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
      if (strided[j]) gpu_src_printf(&item, "      i64 f%d = b%d;\n", j, j);
    emit_offsets(&item, "p", "a.axis", "a.ndim", strided, "      ");
  }
  emit_nodes(&item, plan, t, k, "flat", "      ");
  for (int q = 1; q < k->nout; q++) {
    if (epi_out[q]) continue; /* the epilogue's: stored by kstore */
    if (trailing)
      gpu_src_printf(&item, "      o%d[flat] = v%d;\n", q, k->outs[q] - k->first);
    else
      gpu_src_printf(&item, "      o%d[f%d] = v%d;\n", q, q, k->outs[q] - k->first);
  }
  char in0[16];
  ref_name(plan, k, r->in[0], in0, sizeof in0);
  gpu_src_printf(&item, "      return %s;\n    };\n", in0);
  if (k->epi_last) emit_store(&src, plan, t, k);
  if (src.oom || item.oom)
    b->oom = true;
  else
    gpu_src_reduce(b, r->op, dt, k->variant, src.s ? src.s : "", item.s,
                   k->epi_last ? "kstore" : NULL);
  free(src.s);
  free(item.s);
}

/* row kernels: marks in want (bit i - first) the per-element nodes that
   ref i needs, itself included (reductions and row-level nodes are the
   row's, computed before) */
static void row_need(const tr_plan *plan, const gpu_fused *k, int i, uint64_t *want) {
  if (i < k->first || i > k->last || !row_varies(k, i) || (*want >> (i - k->first)) & 1u) return;
  *want |= 1ull << (i - k->first);
  const tr_pnode *p = &plan->nodes[i];
  for (int j = 0; j < p->nin; j++) row_need(plan, k, p->in[j], want);
}

/* the row-level nodes in [from, stop) (reductions aside), once per row:
   declared for the whole row, computed by the threads of live rows */
static void emit_row_level(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k,
                           int from, int stop) {
  bool any = false;
  for (int i = from; i < stop; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (row_varies(k, i) || vm_op_table[p->op].kind == VM_KIND_REDUCE) continue;
    gpu_src_printf(b, "    %s v%d = 0;\n", gpu_src_ctype(p->meta.dtype), i - k->first);
    any = true;
  }
  if (!any) return;
  gpu_src_printf(b, "    if (active) {\n");
  for (int i = from; i < stop; i++)
    if (!row_varies(k, i) && vm_op_table[plan->nodes[i].op].kind != VM_KIND_REDUCE)
      emit_node(b, plan, t, k, i, "      ");
  gpu_src_printf(b, "    }\n");
}

/* at row position p: the offsets and loads of the per-element inputs the
   wanted nodes read, then those nodes (declared here) */
static void emit_row_position(gpu_src *b, const tr_plan *plan, const tr_trace *t,
                              const gpu_fused *k, uint64_t want, int extra_ref,
                              const char *indent) {
  bool used[GPU_FUSE_MAX_IO] = {false}, strided[GPU_FUSE_MAX_IO] = {false}, any = false,
       flat = false;
  for (int q = 0; q < k->nin; q++) {
    int r = k->ins[q];
    bool read = r == extra_ref;
    for (int i = k->first; i <= k->last && !read; i++) {
      if (!((want >> (i - k->first)) & 1u) || vm_op_table[plan->nodes[i].op].kind == VM_KIND_REDUCE)
        continue;
      for (int j = 0; j < plan->nodes[i].nin; j++) read |= plan->nodes[i].in[j] == r;
    }
    if (!read || (k->hoisted >> q) & 1u) continue;
    used[q] = true;
    if (k->contig[q])
      flat = true;
    else
      strided[k->nout + q] = any = true;
  }
  if (flat) gpu_src_printf(b, "%sconst i64 flat = o * count + p;\n", indent);
  for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
    if (strided[j]) gpu_src_printf(b, "%si64 f%d = b%d;\n", indent, j, j);
  if (any) emit_offsets(b, "p", "a.axis", "a.ndim", strided, indent);
  for (int q = 0; q < k->nin; q++)
    if (used[q]) {
      const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
      if (k->contig[q])
        gpu_src_printf(b, "%sconst %s x%d = in%d[flat];\n", indent, ct, q, q);
      else
        gpu_src_printf(b, "%sconst %s x%d = in%d[f%d];\n", indent, ct, q, q, k->nout + q);
    }
  for (int i = k->first; i <= k->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (!((want >> (i - k->first)) & 1u) || vm_op_table[p->op].kind == VM_KIND_REDUCE) continue;
    gpu_src_printf(b, "%s%s v%d;\n", indent, gpu_src_ctype(p->meta.dtype), i - k->first);
    emit_node(b, plan, t, k, i, indent);
  }
}

/* a row kernel's body (fuse.h GPU_FK_ROWS): rows of `count` positions, a
   group of W warps per row, G groups per block, a.axis kept dims */
static void emit_rows(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k) {
  emit_pointers(b, plan, t, k, 0);
  gpu_src_put(
      b,
      "  const int W = (int)a.extent[3], G = (int)(blockDim.x >> 5) / W;\n"
      "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / W, wig = warp "
      "% W;\n"
      "  const i64 count = a.extent[0];\n"
      "  for (i64 first = (i64)blockIdx.x * G; first < a.n; first += (i64)gridDim.x * G) {\n"
      "    const i64 o = first + group;\n"
      "    const bool active = group < G && o < a.n;\n");
  /* the row's offset in every input not indexed by the flat position */
  bool strided[GPU_FUSE_MAX_IO] = {false}, any = false;
  for (int q = 0; q < k->nin; q++)
    if (!k->contig[q]) strided[k->nout + q] = any = true;
  if (any) {
    for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
      if (strided[j]) gpu_src_printf(b, "    i64 b%d = 0;\n", j);
    gpu_src_printf(
        b,
        "    if (active) {\n      i64 rr = o;\n      for (int d = a.axis - 1; d >= 0; d--) {\n"
        "        const i64 s = a.shape[d], qd = rr / s, c = rr - qd * s;\n        rr = qd;\n");
    for (int j = 0; j < GPU_FUSE_MAX_IO; j++)
      if (strided[j]) gpu_src_printf(b, "        b%d += c * a.stride[%d][d];\n", j, j);
    gpu_src_printf(b, "      }\n    }\n");
  }
  for (int q = 0; q < k->nin; q++)
    if ((k->hoisted >> q) & 1u) {
      const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
      gpu_src_printf(b, "    const %s x%d = active ? in%d[b%d] : (%s)0;\n", ct, q, q, k->nout + q,
                     ct);
    }
  int from = k->first, pass = 0;
  for (int i = k->first; i <= k->last; i++) {
    const tr_pnode *r = &plan->nodes[i];
    if (vm_op_table[r->op].kind != VM_KIND_REDUCE) continue;
    emit_row_level(b, plan, t, k, from, i);
    from = i + 1;
    uint64_t want = 0;
    row_need(plan, k, r->in[0], &want);
    kiln_dtype dt = ref_dtype(plan, t, r->in[0]);
    gpu_src_printf(b, "    auto ld%d = [&](i64 p) -> %s {\n", pass, gpu_src_ctype(dt));
    emit_row_position(b, plan, t, k, want, r->in[0], "      ");
    char in0[16], ld[16], dst[16];
    ref_name(plan, k, r->in[0], in0, sizeof in0);
    gpu_src_printf(b, "      return %s;\n    };\n", in0);
    gpu_src_printf(b, "    %s v%d;\n", gpu_src_ctype(r->meta.dtype), i - k->first);
    snprintf(ld, sizeof ld, "ld%d", pass);
    snprintf(dst, sizeof dst, "v%d", i - k->first);
    gpu_src_row_fold(b, r->op, dt, pass++, ld, dst);
  }
  emit_row_level(b, plan, t, k, from, k->last + 1);
  uint64_t want = 0;
  for (int q = 0; q < k->nout; q++)
    if (row_varies(k, k->outs[q])) row_need(plan, k, k->outs[q], &want);
  if (want) { /* the per-element values read after the run */
    gpu_src_printf(b,
                   "    if (active)\n      for (i64 p = (i64)wig * 32 + lane; p < count; p += "
                   "(i64)W * 32) {\n");
    emit_row_position(b, plan, t, k, want, INT32_MIN, "        ");
    for (int q = 0; q < k->nout; q++)
      if (row_varies(k, k->outs[q]))
        gpu_src_printf(b, "        o%d[o * count + p] = v%d;\n", q, k->outs[q] - k->first);
    gpu_src_printf(b, "      }\n");
  }
  gpu_src_printf(b, "    if (active && wig == 0 && lane == 0) {\n");
  for (int q = 0; q < k->nout; q++)
    if (!row_varies(k, k->outs[q]))
      gpu_src_printf(b, "      o%d[o] = v%d;\n", q, k->outs[q] - k->first);
  gpu_src_printf(b, "    }\n  }\n}\n");
}

/* k's source, named by the hash of its body: equal kernels share one */
static bool emit_kernel(const tr_plan *plan, const tr_trace *t, gpu_fused *k) {
  gpu_src body = {0};
  switch (k->kind) {
    case GPU_FK_ELEMENTWISE:
      emit_elementwise(&body, plan, t, k);
      break;
    case GPU_FK_REDUCE:
      emit_reduce(&body, plan, t, k);
      break;
    case GPU_FK_ROWS:
      emit_rows(&body, plan, t, k);
      break;
    case GPU_FK_JOIN: {
      const tr_pnode *r = &plan->nodes[k->reduce];
      gpu_src_reduce(&body, r->op, ref_dtype(plan, t, r->in[0]), k->variant, "", "", NULL);
      break;
    }
  }
  if (body.oom || !body.s) {
    free(body.s);
    return false;
  }
  snprintf(k->name, sizeof k->name, "kf_%016llx",
           (unsigned long long)XXH3_64bits(body.s, body.len));
  gpu_src src = {0};
  gpu_src_prelude(&src);
  emit_fargs(&src);
  gpu_src_printf(&src,
                 "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(const __grid_constant__ "
                 "gpu_fargs a) {\n",
                 GPU_FUSE_BLOCK, k->name);
  gpu_src_put(&src, body.s);
  free(body.s);
  if (src.oom) {
    free(src.s);
    return false;
  }
  k->src = src.s;
  return true;
}

void gpu_fused_group_free_src(gpu_fused_group *fg) {
  for (int i = 0; i < fg->nk; i++) {
    free(fg->k[i].src);
    fg->k[i].src = NULL;
  }
}

bool gpu_fuse_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused_group *fg) {
  if (!plan_group(plan, g, t, fg)) {
    memset(fg, 0, sizeof *fg);
    return false;
  }
  for (int i = 0; i < fg->nk; i++)
    if (!emit_kernel(plan, t, &fg->k[i])) {
      gpu_fused_group_free_src(fg);
      memset(fg, 0, sizeof *fg);
      return false;
    }
  return true;
}

bool gpu_fused_ready(const gpu_fused_group *fg) {
  if (fg->nk == 0) return false;
  for (int i = 0; i < fg->nk; i++)
    if (!fg->k[i].fn && !(fg->k[i].kind == GPU_FK_ELEMENTWISE && i > 0)) return false;
  return true;
}

/* --- running ----------------------------------------------------------------------- */

enum { REFUSED, RAN, FAILED };

static int failed(int *rc, vm_tensor **outs, int n, int code, const char *what, const char *name) {
  for (int q = 0; q < n; q++) vm_release(outs[q]);
  *rc = vm_thread()->status ? vm_thread()->status : vm_error(code, "%s %s", what, name);
  return FAILED;
}

/* input q of k read by position along its axis (fuse.h GPU_IN_*, not
   PLAIN): its strides over the iteration's nd dims `shape` and, for what
   is moved along the axis, its stride and extent there (gstride,
   gextent); false when it does not fit (as jit_cpu's input_strides).
   The coordinate and a concat's fill part have no value (v NULL). */
static bool moved_strides(const gpu_fused *k, const tr_plan *plan, int q, const vm_tensor *v,
                          int nd, const int64_t *shape, int64_t *st, gpu_fargs *a) {
  int axis = k->role_axis[q], role = k->role[q];
  if (role == GPU_IN_SCAN) /* the scanned axis kept (size 1) or dropped in the output */
    return vm_scan_strides(v, axis, nd, shape, st, &a->gstride[q], &a->gextent[q]);
  if (axis < 0 || axis >= nd) return false;
  if (role == GPU_IN_COORD || !v) { /* the coordinate; a fill part (its extent from the plan) */
    for (int d = 0; d < nd; d++) st[d] = role == GPU_IN_COORD && d == axis && shape[d] > 1 ? 1 : 0;
    if (role == GPU_IN_PART) a->gextent[q] = plan->nodes[k->ins[q]].meta.shape[axis];
    return role == GPU_IN_COORD || a->gextent[q] >= 1;
  }
  bool select = role == GPU_IN_SELECT;
  if (v->ndim != (select ? 1 : nd)) return false;
  for (int d = 0; d < nd; d++) {
    if (!select && d != axis && v->shape[d] != shape[d]) return false;
    st[d] = shape[d] == 1 ? 0
            : select      ? (d == axis ? v->strides[0] : 0)
            : d == axis   ? 0
                          : v->strides[d];
  }
  if (!select) {
    a->gstride[q] = v->strides[axis];
    a->gextent[q] = v->shape[axis];
    /* nothing to clamp into: the op-by-op path reports it (a scatter of no sources loops 0 times)
     */
    if (a->gextent[q] < 1 && role != GPU_IN_SCATTER_INDEX && role != GPU_IN_SCATTER_SRC)
      return false;
  }
  return true;
}

/* k's inputs into a (pointers) and st (strides over shape's nd dims, 0 on
   broadcast dims); REFUSED when one is not where, or not laid out as, k
   was compiled for */
static int bind_inputs(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                       const tr_trace *t, vm_tensor **vals, int nd, const int64_t *shape,
                       gpu_fargs *a, int64_t (*st)[KILN_MAX_DIMS]) {
  for (int q = 0; q < k->nin; q++) {
    int r = k->ins[q];
    bool valueless = k->role[q] == GPU_IN_COORD ||
                     (k->role[q] == GPU_IN_PART && r >= 0 && plan->nodes[r].op == VM_OP_full);
    if (valueless) { /* fuse.h: strides and extent only */
      if (!moved_strides(k, plan, q, NULL, nd, shape, st[k->nout + q], a)) return REFUSED;
      a->ptr[k->nout + q] = NULL;
      continue;
    }
    vm_tensor *v = tr_run_value(plan, t, vals, r);
    if (!v || !v->storage || v->storage->device != dev->device) return REFUSED;
    if (k->role[q] != GPU_IN_PLAIN) {
      if (!moved_strides(k, plan, q, v, nd, shape, st[k->nout + q], a)) return REFUSED;
      a->ptr[k->nout + q] = vm_data(v);
      continue;
    }
    if (v->ndim > nd) return REFUSED;
    if (k->contig[q] && (v->ndim != nd || !vm_is_contiguous(v) ||
                         memcmp(v->shape, shape, (size_t)nd * sizeof(int64_t))))
      return REFUSED; /* compiled to index it by the flat position */
    int lead = nd - v->ndim;
    for (int d = 0; d < nd; d++) {
      int src = d - lead;
      st[k->nout + q][d] = (src < 0 || v->shape[src] == 1) ? 0 : v->strides[src];
    }
    a->ptr[k->nout + q] = vm_data(v);
  }
  return RAN;
}

/* the indices of k's gathers and scatters checked before it runs (fuse.h): RAN, or
   FAILED with *rc when the target reports a bad one at once */
static int check_gathers(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                         const tr_trace *t, vm_tensor **vals, int *rc) {
  for (int i = k->first; i <= k->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    bool scatter = p->op == VM_OP_scatter_add;
    if (!vm_op_gathers(p->op) && !scatter) continue;
    vm_tensor *idx = tr_run_value(plan, t, vals, p->in[1]);
    int axis = p->attr.axis; /* a gather's index bounded by its source's extent, a scatter's by its
                                output's */
    int64_t size =
        scatter ? p->meta.shape[axis] : tr_run_value(plan, t, vals, p->in[0])->shape[axis];
    if (!dev->check_indices(idx, size, axis, vm_op_api(p->op, &t->nodes[p->src]->attr))) {
      *rc = vm_thread()->status ? vm_thread()->status
                                : vm_error(KILN_ERR_DEVICE, "checking the indices of %s", k->name);
      return FAILED;
    }
  }
  return RAN;
}

static void bind_params(const gpu_fused *k, const tr_plan *plan, const tr_trace *t, gpu_fargs *a) {
  for (int s = 0; s < k->nparams; s++) {
    const tr_pnode *p = &plan->nodes[k->params[s]];
    vm_store_f64(&a->param[s], p->meta.dtype, 0, t->nodes[p->src]->attr.scalar[0]);
  }
}

/* fresh values for k's outputs from `from` on; their pointers into a (on
   the target's device: not shared with jit_cpu/compile.c's, which also
   refuses layouts its kernels cannot index) */
static int alloc_outputs(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                         int from, vm_tensor **outs, gpu_fargs *a, int *rc) {
  for (int q = from; q < k->nout; q++) {
    const vm_meta *m = &plan->nodes[k->outs[q]].meta;
    if (!(outs[q] = dev->alloc(m->dtype, m->ndim, m->shape)))
      return failed(rc, outs, q, KILN_ERR_OOM, "out of memory for the outputs of", k->name);
    a->ptr[q] = vm_data(outs[q]);
  }
  return RAN;
}

static unsigned grid_of(int64_t n) {
  int64_t blocks = (n + GPU_FUSE_BLOCK - 1) / GPU_FUSE_BLOCK;
  return blocks > 65536 ? 65536u : (unsigned)blocks; /* a grid-stride loop covers the rest */
}

/* whether k's vector path may run over a's operands: each address a
   multiple of its vector's size (a view's offset may break it) */
static bool vector_aligned(const gpu_fused *k, const tr_plan *plan, const tr_trace *t,
                           const gpu_fargs *a) {
  if (!k->vec) return false;
  for (int j = 0; j < k->nout + k->nin; j++) {
    kiln_dtype dt =
        j < k->nout ? plan->nodes[k->outs[j]].meta.dtype : ref_dtype(plan, t, k->ins[j - k->nout]);
    if ((uintptr_t)a->ptr[j] % (vm_dtype_size(dt) * (size_t)k->vec)) return false;
  }
  return true;
}

static int run_elementwise(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                           const tr_trace *t, vm_tensor **vals, int *rc) {
  const vm_meta *om = &plan->nodes[k->outs[0]].meta;
  int nd = om->ndim;
  gpu_fargs a;
  memset(&a, 0, sizeof a);
  int64_t strides[GPU_FUSE_MAX_IO][KILN_MAX_DIMS];
  if (bind_inputs(k, dev, plan, t, vals, nd, om->shape, &a, strides) != RAN) return REFUSED;
  a.ndim = vm_coalesce(nd, om->shape, k->nin, (const int64_t(*)[KILN_MAX_DIMS])(strides + k->nout),
                       a.shape, a.stride + k->nout);
  a.n = 1;
  for (int d = 0; d < a.ndim; d++) a.n *= a.shape[d];
  for (int q = 0; q < k->nout; q++) /* every output spans the iteration */
    if (numel_of(&plan->nodes[k->outs[q]].meta) != a.n) return REFUSED;
  vm_tensor *outs[GPU_FUSE_MAX_IO] = {0};
  if (check_gathers(k, dev, plan, t, vals, rc) != RAN ||
      alloc_outputs(k, dev, plan, 0, outs, &a, rc) != RAN)
    return FAILED;
  bind_params(k, plan, t, &a);
  a.extent[0] = vector_aligned(k, plan, t, &a);
  int64_t threads = a.extent[0] ? (a.n + k->vec - 1) / k->vec : a.n;
  if (a.n > 0 && !dev->launch(k, &a, grid_of(threads), GPU_FUSE_BLOCK))
    return failed(rc, outs, k->nout, KILN_ERR_DEVICE, "launching", k->name);
  for (int q = 0; q < k->nout; q++) vals[k->outs[q]] = outs[q];
  return RAN;
}

/* the reduction's geometry: its input's dims (size 1 dropped), the kept
   ones first, then the reduced ones, each part merged where every operand
   steps through two dims as one (the order of positions stays row-major,
   so the fold's order is unchanged) */
static void reduce_geometry(const vm_meta *rin, uint32_t mask, int nops,
                            const int64_t (*st)[KILN_MAX_DIMS], gpu_fargs *a) {
  int n = 0;
  for (int part = 0; part < 2; part++) {
    int start = n;
    for (int d = 0; d < rin->ndim; d++) {
      if (rin->shape[d] == 1 || (int)((mask >> d) & 1u) != part) continue;
      bool merge = n > start;
      for (int j = 0; j < nops && merge; j++)
        merge = vm_dims_merge(a->stride[j][n - 1], st[j][d], rin->shape[d]);
      if (merge) {
        a->shape[n - 1] *= rin->shape[d];
        for (int j = 0; j < nops; j++) a->stride[j][n - 1] = st[j][d];
        continue;
      }
      a->shape[n] = rin->shape[d];
      for (int j = 0; j < nops; j++) a->stride[j][n] = st[j][d];
      n++;
    }
    if (part == 0) a->axis = n;
  }
  a->ndim = n;
}

/* st: the strides over R's dims of value ref, read by a fused epilogue at
   the position of reduction r's output (its shape broadcast to the
   output's, whose dims are R's kept ones, or all of R's with keepdim; 0
   along the reduced dims); false if it does not broadcast so */
static bool epilogue_strides(const tr_plan *plan, const tr_trace *t, vm_tensor **vals,
                             const tr_pnode *r, const vm_meta *R, int ref, int64_t *st) {
  vm_tensor *v = tr_run_value(plan, t, vals, ref);
  const vm_meta *om = &r->meta;
  if (!v || v->ndim > om->ndim) return false;
  int64_t ost[KILN_MAX_DIMS];
  int lead = om->ndim - v->ndim;
  for (int d = 0; d < om->ndim; d++) {
    int src = d - lead;
    if (src >= 0 && v->shape[src] != 1 && v->shape[src] != om->shape[d]) return false;
    ost[d] = (src < 0 || v->shape[src] == 1) ? 0 : v->strides[src];
  }
  bool keep = om->ndim == R->ndim;
  for (int d = 0, j = 0; d < R->ndim; d++) {
    bool reduced = (r->attr.axes_mask >> d) & 1u;
    st[d] = reduced ? 0 : ost[keep ? d : j];
    if (!reduced) j++;
  }
  return true;
}

/* a fold's arguments over the shape R of reduction r's input: k's inputs
   (REFUSED when one is not as compiled), its outputs from out0 on dense
   of shape R, the geometry, and schedule s's extents */
static int bind_fold(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                     const tr_trace *t, vm_tensor **vals, const tr_pnode *r, const vm_meta *R,
                     int out0, const gpu_red_sched *s, gpu_fargs *a) {
  memset(a, 0, sizeof *a);
  int64_t st[GPU_FUSE_MAX_IO][KILN_MAX_DIMS];
  memset(st, 0, sizeof st);
  if (bind_inputs(k, dev, plan, t, vals, R->ndim, R->shape, a, st) != RAN) return REFUSED;
  for (int q = out0; q < k->nout; q++) {
    int64_t step = 1;
    for (int d = R->ndim - 1; d >= 0; d--) {
      st[q][d] = (k->epi_out >> q) & 1u ? 0 : step; /* an epilogue's output is indexed by o */
      step *= R->shape[d];
    }
  }
  for (int q = 0; q < k->nin; q++)
    if ((k->epi_in >> q) & 1u && !epilogue_strides(plan, t, vals, r, R, k->ins[q], st[k->nout + q]))
      return REFUSED;
  reduce_geometry(R, r->attr.axes_mask, k->nout + k->nin, (const int64_t(*)[KILN_MAX_DIMS])st, a);
  a->n = s->n;
  memcpy(a->extent, s->extent, sizeof a->extent);
  return RAN;
}

/* a reduce kernel, and its join when a row is long: the launch schedule
   (reduce_schedule) and the partials' join on the device are the GPU's;
   what it shares with jit_cpu/compile.c's run_reduce is the plan's (the
   reduction's input: tr_ref_meta; the fold order and accumulator:
   vm/fold.h) */
static int run_reduce(const gpu_fused *k, const gpu_fused *join, const gpu_fuse_target *dev,
                      const tr_plan *plan, const tr_trace *t, vm_tensor **vals, int *rc) {
  const tr_pnode *r = &plan->nodes[k->reduce];
  const vm_meta *rin = tr_ref_meta(plan, t, r->in[0]);
  gpu_red_sched s;
  reduce_schedule(r, rin, &s);
  if (s.variant != k->variant || (s.join >= 0) != (join != NULL)) return REFUSED;
  gpu_fargs a; /* the producers' outputs: dense, of the input's shape */
  if (bind_fold(k, dev, plan, t, vals, r, rin, 1, &s, &a) != RAN) return REFUSED;
  vm_tensor *outs[GPU_FUSE_MAX_IO] = {0};
  if (check_gathers(k, dev, plan, t, vals, rc) != RAN ||
      alloc_outputs(k, dev, plan, 0, outs, &a, rc) != RAN)
    return FAILED;
  bind_params(k, plan, t, &a);
  int64_t nout = numel_of(&r->meta);
  if (nout > 0) {
    vm_tensor *part = NULL;
    if (join) { /* the first pass leaves partials, the join folds them into the result */
      if (!(part = dev->alloc(s.part, 1, &s.n)))
        return failed(rc, outs, k->nout, KILN_ERR_OOM, "out of memory for the partials of",
                      k->name);
      a.ptr[0] = vm_data(part);
    }
    bool ok = dev->launch(k, &a, s.grid, GPU_FUSE_BLOCK);
    if (ok && join) {
      gpu_fargs b;
      memset(&b, 0, sizeof b);
      b.ptr[0] = vm_data(outs[0]);
      b.ptr[1] = vm_data(part);
      b.n = nout;
      b.extent[2] = s.nparts;
      ok = dev->launch(join, &b, s.join_grid, GPU_FUSE_BLOCK);
    }
    vm_release(part); /* stream-ordered on the GPU: reused only after the join */
    if (!ok) return failed(rc, outs, k->nout, KILN_ERR_DEVICE, "launching", k->name);
  }
  for (int q = 0; q < k->nout; q++) vals[k->outs[q]] = outs[q];
  return RAN;
}

/* a row kernel: a.n rows of a.extent[0] positions, the reduced dims last.
   What it covers was planned in trace/rows.h for both backends; its
   schedule, arguments and launch are the GPU's (the CPU's run_rows splits
   rows across host threads instead) */
static int run_rows(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                    const tr_trace *t, vm_tensor **vals, int *rc) {
  const tr_pnode *r = &plan->nodes[k->reduce];
  const vm_meta *R = tr_ref_meta(plan, t, r->in[0]);
  gpu_red_sched s;
  reduce_schedule(r, R, &s);
  if (s.variant != GPU_RED_LANE || s.join >= 0) return REFUSED;
  gpu_fargs a; /* outputs: dense, indexed by o (and p) */
  if (bind_fold(k, dev, plan, t, vals, r, R, 0, &s, &a) != RAN) return REFUSED;
  vm_tensor *outs[GPU_FUSE_MAX_IO] = {0};
  if (alloc_outputs(k, dev, plan, 0, outs, &a, rc) != RAN) return FAILED;
  bind_params(k, plan, t, &a);
  if (a.n > 0 && !dev->launch(k, &a, s.grid, GPU_FUSE_BLOCK))
    return failed(rc, outs, k->nout, KILN_ERR_DEVICE, "launching", k->name);
  for (int q = 0; q < k->nout; q++) vals[k->outs[q]] = outs[q];
  return RAN;
}

bool gpu_fused_run(const gpu_fused_group *fg, const gpu_fuse_target *dev, const tr_plan *plan,
                   const tr_trace *t, vm_tensor **vals, int *rc, int *resume, int *last_group) {
  const gpu_fused *k = &fg->k[0];
  *last_group = fg->group;
  if (k->kind == GPU_FK_ROWS) {
    if (run_rows(k, dev, plan, t, vals, rc) == REFUSED) return false;
    *resume = k->last + 1;
    *last_group = k->through;
    return true;
  }
  if (k->kind == GPU_FK_ELEMENTWISE) { /* a chain (plan_chain): what it leaves runs op by op */
    for (int i = 0; i < fg->nk; i++) {
      const gpu_fused *c = &fg->k[i];
      int how = i == 0 || c->fn ? run_elementwise(c, dev, plan, t, vals, rc) : REFUSED;
      if (how == REFUSED) {
        *resume = c->first;
        return i > 0;
      }
      *resume = c->last + 1;
      if (how == FAILED) break;
    }
    return true;
  }
  const gpu_fused *join = fg->nk > 1 && fg->k[1].kind == GPU_FK_JOIN ? &fg->k[1] : NULL;
  const gpu_fused *epilogue =
      fg->k[fg->nk - 1].kind == GPU_FK_ELEMENTWISE ? &fg->k[fg->nk - 1] : NULL;
  int how = run_reduce(k, join, dev, plan, t, vals, rc);
  if (how == REFUSED) return false;
  *resume = (k->epi_last ? k->epi_last : k->reduce) + 1;
  if (how == FAILED || !epilogue || !epilogue->fn) return true;
  how = run_elementwise(epilogue, dev, plan, t, vals, rc);
  if (how != REFUSED) *resume = epilogue->last + 1;
  return true;
}
