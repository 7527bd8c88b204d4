/* kernel.c — plans the kernel of a group (kernel_plan*) and builds its
 * libgccjit function (kernel_emit*: the loop structure described in
 * codegen.c), the latter from the kernel's own description (kdesc.c).
 * Kernel ABI:
 *   void k(void **bufs, const int64_t *meta, const void *params,
 *          int64_t begin, int64_t end)
 *   bufs   = outputs (contiguous, the group's shape), then inputs
 *   meta   = nd, shape[nd], then per input strides[nd] (elements), all
 *            coalesced by the caller
 *   params = 8-byte slots holding each full node's value in its dtype
 *   [begin, end) = a range of flat indices of the iteration space */
#include "kernel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../trace/rows.h"

static gcc_jit_rvalue *rv(gcc_jit_lvalue *l) { return gcc_jit_lvalue_as_rvalue(l); }

static gcc_jit_lvalue *new_local(cg_ctx *c, gcc_jit_type *t, const char *name, int i) {
  char buf[48];
  snprintf(buf, sizeof buf, "%s_%d", name, i);
  return gcc_jit_function_new_local(c->fn, NULL, t, buf);
}

static gcc_jit_rvalue *i64v(cg_ctx *c, long v) {
  return gcc_jit_context_new_rvalue_from_long(c->ctx, c->t_i64, v);
}

static gcc_jit_rvalue *add64(cg_ctx *c, gcc_jit_rvalue *a, gcc_jit_rvalue *b) {
  return gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_PLUS, c->t_i64, a, b);
}

static gcc_jit_rvalue *mul64(cg_ctx *c, gcc_jit_rvalue *a, gcc_jit_rvalue *b) {
  return gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MULT, c->t_i64, a, b);
}

static gcc_jit_rvalue *meta_at(cg_ctx *c, gcc_jit_rvalue *meta, gcc_jit_rvalue *index) {
  return rv(gcc_jit_context_new_array_access(c->ctx, NULL, meta, index));
}

static gcc_jit_block *new_block(cg_ctx *c, const char *name) {
  char buf[48];
  snprintf(buf, sizeof buf, "%s_b%d", name, c->nblocks++);
  return gcc_jit_function_new_block(c->fn, buf);
}

/* An operand's elements along its last dim are adjacent in memory (inner
   stride 1), as far as the plan can tell: a fresh value or a contiguous
   leaf, seen through views that keep its last axis last, unexpanded and
   stepped by 1 (a GRU's gate slices of [B, 3H], a bias row).  Such an
   operand is read at off + j, which vectorizes; the generic class reads at
   off + j*step, which does not, and made a GRU cell's fused kernel slower
   than the interpreter's vectorized loops.  A leaf need only be so along
   its last dim: a rolled loop's step reads its hoisted gate slices as
   leaves, [B, H] views of [T, B, 3H] (rows 3H apart), and read them
   strided, one element at a time (the fused GRU cell 19% of a compiled
   step).  The runner checks the real strides every run (inner_fits), so a
   wrong guess costs the kernel, never a wrong answer. */
static bool inner_unit(const tr_plan *plan, const cpu_leaf *leaves, int r) {
  for (int hops = 0; hops < 64; hops++) {
    if (r < 0) return leaves[-1 - r].inner_unit;
    const tr_pnode *p = &plan->nodes[r];
    if (vm_op_table[p->op].kind != VM_KIND_VIEW) return true;
    int last = p->meta.ndim - 1;
    if (last < 0) return false;
    int src = p->in[0];
    const vm_meta *in = src >= 0 ? &plan->nodes[src].meta : &leaves[-1 - src].meta;
    switch (p->op) {
      case VM_OP_slice:
        if (p->attr.axis == last && p->attr.step != 1 && p->meta.shape[last] > 1) return false;
        break;
      case VM_OP_permute:
        if (p->attr.perm[last] != last) return false;
        break;
      case VM_OP_expand: /* inputs align on the right; a size-1 last dim expanded has stride 0 */
        if (in->ndim == 0 || in->shape[in->ndim - 1] != p->meta.shape[last]) return false;
        break;
      case VM_OP_reshape: /* keeps strides only when its input is dense */
        return src < 0 ? leaves[-1 - src].contiguous
                       : vm_op_table[plan->nodes[src].op].kind != VM_KIND_VIEW;
      default:
        return false;
    }
    r = src;
  }
  return false;
}

/* the inner stride class of an input read in `role` (not PLAIN) over
   iteration space gm: after the runner drops size-1 dims, the inner dim
   is gm's last one longer than 1; along the op's axis a positional input
   moves by index or coordinate only (stride 0 there), a select index
   moves, and the coordinate moves by 1 (0 along the other axes) */
static uint8_t gather_class(const tr_plan *plan, const cpu_leaf *leaves, const vm_meta *gm,
                            uint8_t role, int axis, int r) {
  int d = gm->ndim - 1;
  while (d >= 0 && gm->shape[d] == 1) d--;
  if (d < 0) return 2;
  if (role == KERNEL_IN_COORD) return d == axis ? 1 : 0;
  if (role == KERNEL_IN_SCAN) return 2; /* its axis may be dropped: dims do not line up */
  if (role == KERNEL_IN_SELECT) return d != axis ? 0 : inner_unit(plan, leaves, r) ? 1 : 2;
  return d == axis ? 0 : d == gm->ndim - 1 && inner_unit(plan, leaves, r) ? 1 : 2;
}

/* whether node i, or one of its inputs, is a bf16/f16 value */
static bool touches_half(const tr_plan *plan, const cpu_leaf *leaves, int i) {
  const tr_pnode *p = &plan->nodes[i];
  if (vm_dtype_is_half(p->meta.dtype)) return true;
  for (int k = 0; k < p->nin; k++) {
    int r = tr_pnode_input(p, k);
    if (vm_dtype_is_half(r >= 0 ? plan->nodes[r].meta.dtype : leaves[-1 - r].meta.dtype))
      return true;
  }
  return false;
}

/* the group's inputs, outputs and params; false if it has a node the code
   generator does not handle */
static bool plan_span(const tr_plan *plan, int g, const tr_group *grp, const bool *escapes,
                      const cpu_leaf *leaves, kernel_shape *ks) {
  kernel_shape_clear(ks, grp->last - grp->first + 1);
  ks->first_node = grp->first;
  ks->span_kind = grp->kind;
  ks->reduce = -1;
  if (grp->last - grp->first >= KERNEL_MAX_NODES) return false;
  if (grp->kind ==
      TR_GROUP_REDUCE) { /* producers + the reduction; the epilogue stays interpreted */
    for (int i = grp->first; i <= grp->last && ks->reduce < 0; i++)
      if (vm_op_table[plan->nodes[i].op].kind == VM_KIND_REDUCE) ks->reduce = i;
    const tr_pnode *r = &plan->nodes[ks->reduce];
    int ref = r->in[0];
    const vm_meta *rin = ref >= 0 ? &plan->nodes[ref].meta : &leaves[-1 - ref].meta;
    int64_t rows, count;
    bool ok_op =
        r->op == VM_OP_sum || r->op == VM_OP_prod || r->op == VM_OP_max || r->op == VM_OP_min;
    if (!ok_op || rin->dtype == KILN_BOOL) return false;
    if (!kernel_reduce_split(r, rin, &rows, &count)) {
      int64_t outer, inner;
      if (!kernel_reduce_split3(r, rin, &outer, &count, &inner)) return false;
      ks->cols = true;
    }
    ks->resume = ks->reduce + 1;
  } else if (grp->kind != TR_GROUP_ELEMENTWISE) {
    return false;
  } else {
    ks->resume = grp->last + 1;
  }
  ks->last_group = g;
  ks->last_node = grp->last;
  int last_computed = ks->resume - 1;
  for (int i = grp->first; i <= grp->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    bool is_view = vm_op_table[p->op].kind == VM_KIND_VIEW;
    ks->compute[i - grp->first] = !is_view && i <= last_computed;
    /* views run before the kernel, so they may only view values from
       outside the group */
    if (is_view && p->nin > 0 && p->in[0] >= grp->first && p->in[0] < i) return false;
    if (!ks->compute[i - grp->first]) continue;
    if (grp->kind == TR_GROUP_REDUCE && i != ks->reduce) {
      /* producers run over the reduction's input */
      const tr_pnode *red = &plan->nodes[ks->reduce];
      int ref = red->in[0];
      const vm_meta *rin = ref >= 0 ? &plan->nodes[ref].meta : &leaves[-1 - ref].meta;
      if (p->meta.ndim != rin->ndim ||
          memcmp(p->meta.shape, rin->shape, (size_t)rin->ndim * sizeof(int64_t)))
        return false;
    }
    /* halves: loaded, computed and stored by elementwise nodes (the casts
       beside a reduction among them: front/op.c records reductions of
       halves in f32), concat and gathers.  A bf16 widens and stores by
       shifts, exactly; widening an f16 quiets a signaling NaN, so an f16
       gather's output stores the bits it loaded (kernel_emit: elementwise
       groups only), as the interpreter moves them */
    if (touches_half(plan, leaves, i) &&
        (i == ks->reduce || vm_op_scans(p->op) || p->op == VM_OP_scatter_add ||
         (vm_op_gathers(p->op) && p->meta.dtype != KILN_BF16 &&
          (p->meta.dtype != KILN_F16 || grp->kind != TR_GROUP_ELEMENTWISE))))
      return false;
    kiln_dtype in_dt[3];
    /* a gather, scatter_add, concat or argmax reads what it moves from
       outside the kernel (the runner checks index values before the
       kernel runs); scatter_add and concat read the output's coordinate;
       all but gathers in flat elementwise kernels only */
    bool gathers = vm_op_gathers(p->op), coord = kernel_needs_coord(p->op),
         scans = vm_op_scans(p->op);
    uint32_t mask = p->attr.axes_mask;
    if (gathers && (ks->cols || p->nin != 2)) return false;
    if (scans && (grp->kind != TR_GROUP_ELEMENTWISE || p->nin != 1 || p->meta.dtype != KILN_I64 ||
                  !mask || (mask & (mask - 1))))
      return false;
    if (coord && (grp->kind != TR_GROUP_ELEMENTWISE || p->nin < 1 || p->nin > 3 ||
                  !tr_meta_shape_is(&p->meta, plan->nodes[grp->last].meta.ndim,
                                    plan->nodes[grp->last].meta.shape)))
      return false;
    int in_q[3] = {-1, -1, -1};
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      in_dt[k] = r >= 0 ? plan->nodes[r].meta.dtype : leaves[-1 - r].meta.dtype;
      /* an input computed inside the group must be computed by the kernel */
      if (r >= grp->first && r <= grp->last &&
          vm_op_table[plan->nodes[r].op].kind == VM_KIND_VIEW && plan->nodes[r].nin > 0 &&
          tr_pnode_input(&plan->nodes[r], 0) >= grp->first)
        return false;
      uint8_t role = kernel_arg_role(p, k);
      bool internal = r >= grp->first && r <= grp->last && ks->compute[r - grp->first];
      if (internal && !kernel_arg_outside(p, k) && (gathers || role != KERNEL_IN_PLAIN))
        return false;
      if (internal && kernel_arg_outside(p, k) && !tr_is_fill(plan, r)) return false;
      if (internal && !kernel_arg_outside(p, k)) continue;
      if ((gathers || scans || role == KERNEL_IN_SCATTER_INDEX || role == KERNEL_IN_SCATTER_SRC) &&
          tr_is_fill(plan, r))
        return false;
      /* an arg-reduction's axis: its one reduced axis of the input */
      int8_t axis = role == KERNEL_IN_PLAIN ? -1
                    : scans                 ? (int8_t)__builtin_ctz(mask)
                                            : (int8_t)p->attr.axis;
      int q = kernel_input(ks, r, role);
      if (q >= 0 && ks->in_axis[q] != axis) return false; /* one source, two axes: not described */
      if (q < 0) {
        if (ks->nin == KERNEL_MAX_IO) return false;
        q = ks->nin++;
        ks->ins[q] = r;
        ks->in_role[q] = role;
        ks->in_axis[q] = axis;
        ks->in_bound[q] = -1;
      }
      in_q[k] = q;
    }
    if (gathers) { /* the index is bounded by its source's axis */
      if (in_dt[1] != KILN_I64) return false;
      int idx = in_q[1], src = in_q[0];
      if (ks->in_bound[idx] >= 0 && ks->in_bound[idx] != src) return false;
      ks->in_bound[idx] = (int16_t)src;
    } else if (coord) {
      for (int k = 0; k < p->nin;
           k++) { /* the values in the output's dtype; a scatter's index i64 */
        bool index = p->op == VM_OP_scatter_add && k == 1;
        if (in_dt[k] != (index ? KILN_I64 : p->meta.dtype)) return false;
      }
      if (p->op == VM_OP_scatter_add) { /* bounded by the output's extent along the axis */
        /* an output element sums over the index's whole extent along the
           axis (emit_scatter): out x src work per row, where the
           interpreter's scatter is linear in src.  Small extents (pooling
           windows, one label per row) compile; an index_select's backward
           over 1024 columns fused with compute would do a million compares
           per row */
        int r = tr_pnode_input(p, 1);
        const vm_meta *im = r >= 0 ? &plan->nodes[r].meta : &leaves[-1 - r].meta;
        if (im->shape[p->attr.axis] > KERNEL_SCATTER_MAX) return false;
        ks->in_bound[in_q[1]] = KERNEL_BOUND_OUT;
      }
      int q = kernel_coord_input(ks);
      if (q >= 0 && ks->in_axis[q] != p->attr.axis) return false; /* one coordinate per kernel */
      if (q < 0) {
        if (ks->nin == KERNEL_MAX_IO) return false;
        q = ks->nin++;
        ks->ins[q] = i; /* no value: the runner passes no buffer */
        ks->in_role[q] = KERNEL_IN_COORD;
        ks->in_axis[q] = (int8_t)p->attr.axis;
        ks->in_bound[q] = -1;
      }
    } else if (scans) {
      if (in_dt[0] == KILN_BOOL) return false;
    } else if (i != ks->reduce && !cg_supported(p, in_dt)) {
      return false;
    }
    if (p->op == VM_OP_full) {
      if (ks->nparams == KERNEL_MAX_IO) return false;
      ks->params[ks->nparams++] = i;
    }
    /* a fill is never stored: whoever reads it later takes its value
       (tr_run_value, or fill_slot for a kernel) */
    bool out =
        (escapes[i] || p->last_use > last_computed || i == ks->reduce) && p->op != VM_OP_full;
    if (out) {
      if (ks->nout == KERNEL_MAX_IO) return false;
      ks->outs[ks->nout++] = i;
    }
  }
  if (ks->nout == 0) return false;
  /* a group that only moves or scans (concat, gathers, scatter_add,
     argmax/argmin) computes nothing the interpreter's own kernels do not do
     faster: they move rows with memcpy and scan with branches, where a
     kernel picks a part, an index match or a NaN-aware maximum per element
     in scalar selects.  A GRU's backward joining its three gate gradients
     spent as long in a concat kernel as in every GEMM; the digits CNN's
     max-pool argmax and its backward's scatter ran 2.7x and 2x the
     interpreter's time, its whole step 16% behind KILN_JIT=0 */
  bool moves_only = true;
  for (int i = grp->first; i <= grp->last && moves_only; i++) {
    vm_opcode op = plan->nodes[i].op;
    moves_only = !ks->compute[i - grp->first] || op == VM_OP_full || kernel_needs_coord(op) ||
                 vm_op_gathers(op) || vm_op_scans(op);
  }
  if (moves_only) return false;
  /* inner strides the kernel assumes: broadcast along the last dim -> 0,
     a fresh or contiguous value of the full row -> 1, anything else -> any */
  const vm_meta *gm = &plan->nodes[grp->last].meta;
  if (grp->kind == TR_GROUP_REDUCE) { /* the inner loop runs over the reduced axes */
    int ref = plan->nodes[ks->reduce].in[0];
    gm = ref >= 0 ? &plan->nodes[ref].meta : &leaves[-1 - ref].meta;
  }
  int64_t inner = gm->ndim ? gm->shape[gm->ndim - 1] : 1;
  for (int q = 0; q < ks->nin; q++) {
    int r = ks->ins[q];
    const vm_meta *m = r >= 0 ? &plan->nodes[r].meta : &leaves[-1 - r].meta;
    int64_t last = m->ndim ? m->shape[m->ndim - 1] : 1;
    if (ks->in_role[q] != KERNEL_IN_PLAIN) { /* a concat's fill part: its value, at any position */
      ks->stride_class[q] = tr_is_fill(plan, r) && ks->in_role[q] == KERNEL_IN_PART
                                ? 0
                                : gather_class(plan, leaves, gm, ks->in_role[q], ks->in_axis[q], r);
      continue;
    }
    ks->stride_class[q] = (last == 1 && inner > 1) || tr_is_fill(plan, r) ? 0
                          : inner_unit(plan, leaves, r)                   ? 1
                                                                          : 2;
  }
  return true;
}

bool kernel_plan(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                 kernel_shape *ks) {
  return plan_span(plan, g, &plan->groups[g], escapes, leaves, ks);
}

bool kernel_plan_epilogue(const tr_plan *plan, int g, int first, const bool *escapes,
                          const cpu_leaf *leaves, kernel_shape *ks) {
  const tr_group *grp = &plan->groups[g];
  if (grp->kind != TR_GROUP_REDUCE || first <= grp->first || first > grp->last) return false;
  /* views run before the group's kernels: of values from outside the
     group only (kernel_plan checked the group's) */
  for (int i = grp->first; i <= grp->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW && p->nin > 0 && p->in[0] >= grp->first)
      return false;
  }
  tr_group span = {.kind = TR_GROUP_ELEMENTWISE, .first = first, .last = grp->last};
  return plan_span(plan, g, &span, escapes, leaves, ks);
}

/* the typed pointers and per-input locals both kernel shapes use */
typedef struct {
  gcc_jit_lvalue *in_ptr[KERNEL_MAX_IO], *off[KERNEL_MAX_IO], *step[KERNEL_MAX_IO],
      *hoist[KERNEL_MAX_IO], *out_ptr[KERNEL_MAX_IO];
  gcc_jit_lvalue *gstride[KERNEL_MAX_IO]; /* kernel_role_moves: the axis' stride */
  gcc_jit_lvalue *gext[KERNEL_MAX_IO];    /* kernel_role_extent: the extent along the axis */
  kiln_dtype in_dt[KERNEL_MAX_IO];
  /* kernel_emit only, per group node: an f16 gather's element as it lies
     (uint16_t bits), which its output stores unchanged, as the
     interpreter's gather moves it (widening quiets a signaling NaN) */
  gcc_jit_lvalue **raw;
} kernel_io;

/* in `entry`: out_ptr[q] = bufs[q], in_ptr[q] = bufs[nout + q], typed */
static void emit_io(cg_ctx *c, gcc_jit_block *entry, gcc_jit_rvalue *bufs, const tr_plan *plan,
                    const cpu_leaf *leaves, const kernel_shape *ks, kernel_io *io) {
  io->raw = NULL;
  for (int q = 0; q < ks->nout; q++) {
    gcc_jit_type *pt =
        gcc_jit_type_get_pointer(cg_mem_type(c, plan->nodes[ks->outs[q]].meta.dtype));
    io->out_ptr[q] = new_local(c, pt, "out", q);
    gcc_jit_block_add_assignment(
        entry, NULL, io->out_ptr[q],
        gcc_jit_context_new_cast(
            c->ctx, NULL, rv(gcc_jit_context_new_array_access(c->ctx, NULL, bufs, i64v(c, q))),
            pt));
  }
  for (int q = 0; q < ks->nin; q++) {
    int ref = ks->ins[q];
    io->in_dt[q] = ref >= 0 ? plan->nodes[ref].meta.dtype : leaves[-1 - ref].meta.dtype;
    /* not const: loads must have the plain type (a const bool is no condition) */
    gcc_jit_type *pt = gcc_jit_type_get_pointer(cg_mem_type(c, io->in_dt[q]));
    io->in_ptr[q] = new_local(c, pt, "in", q);
    io->off[q] = new_local(c, c->t_i64, "off", q);
    io->step[q] = new_local(c, c->t_i64, "step", q);
    io->hoist[q] = new_local(c, cg_type(c, io->in_dt[q]), "x", q);
    io->gstride[q] = kernel_role_moves(ks->in_role[q]) ? new_local(c, c->t_i64, "gs", q) : NULL;
    io->gext[q] = kernel_role_extent(ks->in_role[q]) ? new_local(c, c->t_i64, "ge", q) : NULL;
    gcc_jit_block_add_assignment(
        entry, NULL, io->in_ptr[q],
        gcc_jit_context_new_cast(
            c->ctx, NULL,
            rv(gcc_jit_context_new_array_access(c->ctx, NULL, bufs, i64v(c, ks->nout + q))), pt));
  }
}

/* io->hoist[q] = input q's element at its offset, as a value (a half
   widened), assigned in block b */
static void hoist_input(cg_ctx *c, gcc_jit_block *b, const kernel_io *io, int q) {
  gcc_jit_block *was = c->cur;
  c->cur = b; /* a half's widening adds its statements here */
  gcc_jit_rvalue *x =
      rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->in_ptr[q]), rv(io->off[q])));
  gcc_jit_block_add_assignment(b, NULL, io->hoist[q], cg_load(c, io->in_dt[q], x));
  c->cur = was; /* cg_load adds statements, never blocks */
}

/* output q's element at `at` = value (its node's value; a half's narrowed: cg_store) */
static void store_output(cg_ctx *c, const tr_plan *plan, const kernel_shape *ks,
                         const kernel_io *io, int q, gcc_jit_rvalue *at, gcc_jit_rvalue *value) {
  gcc_jit_rvalue *v = cg_store(c, plan->nodes[ks->outs[q]].meta.dtype, value);
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->out_ptr[q]), at), v);
}

/* the inputs' values at inner index j (unit stride, hoisted, or strided);
   for a positional input, its position instead (the axis not counted: the
   op adds its own coordinate x gstride and loads) */
static void emit_loads(cg_ctx *c, const kernel_shape *ks, const kernel_io *io, gcc_jit_rvalue *j,
                       gcc_jit_rvalue **in_val) {
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_rvalue *index = ks->stride_class[q] == 1
                                ? add64(c, rv(io->off[q]), j)
                                : add64(c, rv(io->off[q]), mul64(c, j, rv(io->step[q])));
    if (kernel_role_positional(ks->in_role[q]))
      in_val[q] = ks->stride_class[q] == 0 ? rv(io->off[q]) : index;
    else
      in_val[q] = ks->stride_class[q] == 0 ? rv(io->hoist[q])
                                           : cg_load(c, io->in_dt[q],
                                                     rv(gcc_jit_context_new_array_access(
                                                         c->ctx, NULL, rv(io->in_ptr[q]), index)));
  }
}

/* a gather / index_select of source input q at index value idx: the
   element as stored */
static gcc_jit_rvalue *emit_gather(cg_ctx *c, const kernel_io *io, int q, gcc_jit_rvalue *pos,
                                   gcc_jit_rvalue *idx) {
  gcc_jit_rvalue *at = add64(
      c, pos, mul64(c, gcc_jit_context_new_cast(c->ctx, NULL, idx, c->t_i64), rv(io->gstride[q])));
  return rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->in_ptr[q]), at));
}

/* meta[at]: each moving input's stride along its axis (the runner puts
   them after the strides: 0 for other inputs) */
static void emit_gather_strides(cg_ctx *c, gcc_jit_block *b, gcc_jit_rvalue *meta,
                                gcc_jit_rvalue *at, const kernel_shape *ks, const kernel_io *io) {
  for (int q = 0; q < ks->nin; q++)
    if (io->gstride[q])
      gcc_jit_block_add_assignment(b, NULL, io->gstride[q],
                                   meta_at(c, meta, add64(c, at, i64v(c, q))));
}

/* meta[at]: extents along the axis, after those (flat elementwise kernels) */
static void emit_extents(cg_ctx *c, gcc_jit_block *b, gcc_jit_rvalue *meta, gcc_jit_rvalue *at,
                         const kernel_shape *ks, const kernel_io *io) {
  for (int q = 0; q < ks->nin; q++)
    if (io->gext[q])
      gcc_jit_block_add_assignment(b, NULL, io->gext[q],
                                   meta_at(c, meta, add64(c, at, i64v(c, q))));
}

static void cond_loop(gcc_jit_block *from, gcc_jit_rvalue *test, gcc_jit_block *body,
                      gcc_jit_block *exit) {
  gcc_jit_block_end_with_conditional(from, NULL, test, body, exit);
}

/* for (var = from; var < to; var++) { body }: returns the body block (c->cur
   set to it); close_loop ends it, leaving c->cur after the loop */
typedef struct {
  gcc_jit_block *cond, *after;
  gcc_jit_lvalue *var;
} counted_loop;

static counted_loop open_loop(cg_ctx *c, gcc_jit_lvalue *var, gcc_jit_rvalue *from,
                              gcc_jit_rvalue *to, const char *name) {
  counted_loop L = {new_block(c, name), new_block(c, name), var};
  gcc_jit_block *body = new_block(c, name);
  gcc_jit_block_add_assignment(c->cur, NULL, var, from);
  gcc_jit_block_end_with_jump(c->cur, NULL, L.cond);
  cond_loop(L.cond,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(var), to), body,
            L.after);
  c->cur = body;
  return L;
}

static void close_loop(cg_ctx *c, counted_loop *L) {
  gcc_jit_block_add_assignment_op(c->cur, NULL, L->var, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, L->cond);
  c->cur = L->after;
}

static gcc_jit_rvalue *load_at(cg_ctx *c, const kernel_io *io, int q, gcc_jit_rvalue *pos,
                               gcc_jit_rvalue *k) {
  return rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->in_ptr[q]),
                                             add64(c, pos, mul64(c, k, rv(io->gstride[q])))));
}

/* scatter_add at the output coordinate `at`: base, then for k < m in
   order, + src[k] where index[k] == at (a pick, never a branch on the
   data: the loop over k is the only one) — the interpreter adds each
   output element's sources in this order too */
static gcc_jit_rvalue *emit_scatter(cg_ctx *c, const kernel_io *io, kiln_dtype dt,
                                    gcc_jit_rvalue *base, int qi, gcc_jit_rvalue *pi, int qs,
                                    gcc_jit_rvalue *ps, gcc_jit_rvalue *at, int i) {
  gcc_jit_lvalue *acc = new_local(c, cg_type(c, dt), "sacc", i),
                 *k = new_local(c, c->t_i64, "sk", i);
  gcc_jit_block_add_assignment(c->cur, NULL, acc, base);
  counted_loop L = open_loop(c, k, i64v(c, 0), rv(io->gext[qi]), "scatter");
  tr_pnode add = {.op = VM_OP_add, .nin = 2, .meta = {.dtype = dt}};
  kiln_dtype dts[2] = {dt, dt};
  gcc_jit_rvalue *args[2] = {rv(acc), load_at(c, io, qs, ps, rv(k))};
  gcc_jit_rvalue *sum = cg_node(c, &add, dts, args);
  gcc_jit_rvalue *hit = gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_EQ,
                                                       load_at(c, io, qi, pi, rv(k)), at);
  gcc_jit_block_add_assignment(c->cur, NULL, acc, cg_pick(c, dt, hit, sum, rv(acc)));
  close_loop(c, &L);
  return rv(acc);
}

/* argmax / argmin of input q (dtype dt) along its scanned axis from
   position pos: the interpreter's scan (vm/kern_reduce.c arg_scan) — the
   first strict extreme, or the first NaN, whose index then stays — with
   picks instead of its early return */
static gcc_jit_rvalue *emit_argscan(cg_ctx *c, const kernel_io *io, int q, kiln_dtype dt,
                                    bool is_max, gcc_jit_rvalue *pos, int i) {
  bool fl = vm_dtype_is_float(dt);
  gcc_jit_type *t = cg_type(c, dt);
  gcc_jit_lvalue *best = new_local(c, t, "abest", i), *bi = new_local(c, c->t_i64, "abi", i),
                 *k = new_local(c, c->t_i64, "ak", i), *nan = new_local(c, c->t_bool, "anan", i),
                 *v = new_local(c, t, "av", i);
  gcc_jit_block_add_assignment(c->cur, NULL, best, load_at(c, io, q, pos, i64v(c, 0)));
  gcc_jit_block_add_assignment(c->cur, NULL, bi, i64v(c, 0));
  gcc_jit_block_add_assignment(
      c->cur, NULL, nan,
      fl ? gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_NE, rv(best), rv(best))
         : gcc_jit_context_new_rvalue_from_int(c->ctx, c->t_bool, 0));
  counted_loop L = open_loop(c, k, i64v(c, 1), rv(io->gext[q]), "scan");
  gcc_jit_block *body = c->cur;
  gcc_jit_block_add_assignment(body, NULL, v, load_at(c, io, q, pos, rv(k)));
  gcc_jit_rvalue *better = gcc_jit_context_new_comparison(
      c->ctx, NULL, is_max ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, rv(v), rv(best));
  gcc_jit_rvalue *isnan =
      fl ? gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_NE, rv(v), rv(v))
         : gcc_jit_context_new_rvalue_from_int(c->ctx, c->t_bool, 0);
  gcc_jit_lvalue *take = new_local(c, c->t_bool, "atake", i);
  gcc_jit_block_add_assignment(
      body, NULL, take,
      gcc_jit_context_new_binary_op(
          c->ctx, NULL, GCC_JIT_BINARY_OP_LOGICAL_AND, c->t_bool,
          gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_LOGICAL_NEGATE, c->t_bool,
                                       rv(nan)),
          gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_LOGICAL_OR, c->t_bool,
                                        better, isnan)));
  gcc_jit_block_add_assignment(body, NULL, best, cg_pick(c, dt, rv(take), rv(v), rv(best)));
  gcc_jit_block_add_assignment(body, NULL, bi, cg_pick(c, KILN_I64, rv(take), rv(k), rv(bi)));
  gcc_jit_block_add_assignment(
      body, NULL, nan,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_LOGICAL_OR, c->t_bool, rv(nan),
                                    isnan));
  close_loop(c, &L);
  return rv(bi);
}

/* concat of parts qs[0..n) at the output coordinate `at`: each part read at
   at less the extents before it, clamped into the part (every load stays
   in bounds), then the one whose range holds `at` picked */
static gcc_jit_rvalue *emit_concat(cg_ctx *c, const kernel_io *io, kiln_dtype dt, int n,
                                   const int *qs, gcc_jit_rvalue *const *pos, gcc_jit_rvalue *at,
                                   int i) {
  gcc_jit_rvalue *vals[3] = {0}, *ends[3] = {0}, *from = i64v(c, 0);
  for (int j = 0; j < n; j++) {
    int q = qs[j];
    gcc_jit_lvalue *cc = new_local(c, c->t_i64, "cc", 3 * i + j);
    gcc_jit_rvalue *last = add64(c, rv(io->gext[q]), i64v(c, -1));
    gcc_jit_block_add_assignment(
        c->cur, NULL, cc,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, at, from));
    gcc_jit_block_add_assignment(
        c->cur, NULL, cc,
        cg_pick(
            c, KILN_I64,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(cc), i64v(c, 0)),
            i64v(c, 0), rv(cc)));
    gcc_jit_block_add_assignment(
        c->cur, NULL, cc,
        cg_pick(c, KILN_I64,
                gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GT, rv(cc), last),
                last, rv(cc)));
    gcc_jit_lvalue *v = new_local(c, cg_type(c, dt), "part", 3 * i + j);
    gcc_jit_block_add_assignment(c->cur, NULL, v,
                                 cg_load(c, io->in_dt[q], load_at(c, io, q, pos[j], rv(cc))));
    vals[j] = rv(v);
    from = ends[j] = add64(c, from, rv(io->gext[q]));
  }
  gcc_jit_rvalue *value = vals[n - 1];
  for (int j = n - 2; j >= 0; j--)
    value = cg_pick(
        c, dt, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, at, ends[j]),
        vals[j], value);
  return value;
}

/* evaluates the group's computed nodes up to (not including) `stop` into
   locals node_val[i - first] (only those with want[i - first], when want is
   given; the others must already hold their values); a node's inputs are
   group locals or loads */
static bool emit_nodes(cg_ctx *c, const tr_plan *plan, const tr_group *grp, const kernel_shape *ks,
                       const kernel_io *io, gcc_jit_rvalue **in_val, gcc_jit_rvalue *params,
                       int stop, const bool *want, const char *prefix, gcc_jit_lvalue **node_val) {
  for (int i = grp->first; i < stop; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (!ks->compute[i - grp->first] || (want && !want[i - grp->first])) continue;
    gcc_jit_rvalue *args[3];
    kiln_dtype adt[3];
    int qs[3] = {-1, -1, -1};
    for (int k = 0; k < p->nin; k++) {
      int ref = tr_pnode_input(p, k);
      bool internal = ref >= grp->first && ref <= grp->last && ks->compute[ref - grp->first] &&
                      !kernel_arg_outside(p, k);
      if (internal) {
        if (!node_val[ref - grp->first]) return false;
        args[k] = rv(node_val[ref - grp->first]);
        adt[k] = plan->nodes[ref].meta.dtype;
      } else {
        int q = qs[k] = kernel_input(ks, ref, kernel_arg_role(p, k));
        if (q < 0) return false;
        args[k] = in_val[q];
        adt[k] = io->in_dt[q];
      }
    }
    gcc_jit_rvalue *value;
    int qc = kernel_coord_input(ks);
    if (vm_op_gathers(p->op)) {
      if (qs[0] < 0 || ks->in_role[qs[0]] != KERNEL_IN_SOURCE || !io->gstride[qs[0]]) return false;
      gcc_jit_rvalue *stored = emit_gather(c, io, qs[0], args[0], args[1]);
      if (io->in_dt[qs[0]] == KILN_F16) { /* kept as it lies for a store (kernel_emit) */
        if (!io->raw) return false;
        io->raw[i - grp->first] = new_local(c, c->t_u16, "raw", i);
        gcc_jit_block_add_assignment(c->cur, NULL, io->raw[i - grp->first], stored);
        stored = rv(io->raw[i - grp->first]);
      }
      value = cg_load(c, io->in_dt[qs[0]], stored);
    } else if (kernel_needs_coord(p->op) && qc < 0) {
      return false;
    } else if (p->op == VM_OP_scatter_add) {
      if (qs[1] < 0 || qs[2] < 0 || !io->gext[qs[1]] || !io->gext[qs[2]]) return false;
      value = emit_scatter(c, io, p->meta.dtype, args[0], qs[1], args[1], qs[2], args[2],
                           in_val[qc], i);
    } else if (vm_op_scans(p->op)) {
      if (qs[0] < 0 || ks->in_role[qs[0]] != KERNEL_IN_SCAN || !io->gext[qs[0]]) return false;
      value = emit_argscan(c, io, qs[0], io->in_dt[qs[0]], p->op == VM_OP_argmax, args[0], i);
    } else if (p->op == VM_OP_concat) {
      for (int k = 0; k < p->nin; k++)
        if (qs[k] < 0 || !io->gext[qs[k]]) return false;
      value = emit_concat(c, io, p->meta.dtype, p->nin, qs, args, in_val[qc], i);
    } else if (p->op == VM_OP_full) { /* a runtime parameter: 8-byte slot `slot` */
      int slot = 0;
      while (ks->params[slot] != i) slot++;
      gcc_jit_type *pt =
          gcc_jit_type_get_pointer(gcc_jit_type_get_const(cg_mem_type(c, p->meta.dtype)));
      long per = 8 / (long)vm_dtype_size(p->meta.dtype);
      value = cg_load(c, p->meta.dtype,
                      rv(gcc_jit_context_new_array_access(
                          c->ctx, NULL, gcc_jit_context_new_cast(c->ctx, NULL, params, pt),
                          i64v(c, slot * per))));
    } else {
      value = cg_node(c, p, adt, args);
    }
    if (!value) return false;
    node_val[i - grp->first] = new_local(c, cg_type(c, p->meta.dtype), prefix, i);
    gcc_jit_block_add_assignment(c->cur, NULL, node_val[i - grp->first], value);
  }
  return true;
}

/* starts c->fn: void name(void **bufs, const int64_t *meta, const void *params,
   int64_t begin, int64_t end), the ABI of every kernel */
static void new_kernel_fn(cg_ctx *c, const char *name, gcc_jit_param *prm[5]) {
  prm[0] = gcc_jit_context_new_param(c->ctx, NULL, c->t_voidpp, "bufs");
  prm[1] = gcc_jit_context_new_param(c->ctx, NULL, c->t_i64p, "meta");
  prm[2] = gcc_jit_context_new_param(c->ctx, NULL, c->t_voidp, "params");
  prm[3] = gcc_jit_context_new_param(c->ctx, NULL, c->t_i64, "begin");
  prm[4] = gcc_jit_context_new_param(c->ctx, NULL, c->t_i64, "end");
  c->fn = gcc_jit_context_new_function(c->ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, c->t_void, name, 5,
                                       prm, 0);
}

/* emits the kernel function of group g named `name` */
bool kernel_emit(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                 const kernel_shape *ks, const char *name) {
  const tr_group *grp = &plan->groups[g];
  gcc_jit_param *prm[5];
  new_kernel_fn(c, name, prm);
  gcc_jit_rvalue *bufs = gcc_jit_param_as_rvalue(prm[0]), *meta = gcc_jit_param_as_rvalue(prm[1]);
  gcc_jit_rvalue *params = gcc_jit_param_as_rvalue(prm[2]);
  gcc_jit_block *entry = new_block(c, "entry"), *rows = new_block(c, "rows"),
                *row_body = new_block(c, "row"), *dims = new_block(c, "dims"),
                *dim_body = new_block(c, "dim"), *setup = new_block(c, "setup"),
                *inner_cond = new_block(c, "icond"), *inner_body = new_block(c, "ibody"),
                *row_next = new_block(c, "rnext"), *done = new_block(c, "done");
  gcc_jit_lvalue *nd = new_local(c, c->t_i64, "nd", 0), *inner = new_local(c, c->t_i64, "inner", 0),
                 *flat = new_local(c, c->t_i64, "flat", 0), *row = new_local(c, c->t_i64, "row", 0),
                 *j0 = new_local(c, c->t_i64, "j0", 0), *j1 = new_local(c, c->t_i64, "j1", 0),
                 *d = new_local(c, c->t_i64, "d", 0), *r = new_local(c, c->t_i64, "r", 0),
                 *idx = new_local(c, c->t_i64, "idx", 0), *j = new_local(c, c->t_i64, "j", 0);
  /* the row's multi-index over the outer dims (the odometer of `carry`) */
  gcc_jit_lvalue *pos =
      new_local(c, gcc_jit_context_new_array_type(c->ctx, NULL, c->t_i64, KILN_MAX_DIMS), "pos", 0);
  kernel_io io;
  /* entry: typed pointers, nd, inner */
  c->cur = entry;
  gcc_jit_block_add_assignment(entry, NULL, nd, meta_at(c, meta, i64v(c, 0)));
  gcc_jit_block_add_assignment(entry, NULL, inner, meta_at(c, meta, rv(nd)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  /* meta: nd, shape[nd], strides[nd] per input, then the axis' strides
     and extents per input (0 where the role has none) */
  gcc_jit_rvalue *after_strides = add64(c, i64v(c, 1), mul64(c, rv(nd), i64v(c, ks->nin + 1)));
  emit_gather_strides(c, entry, meta, after_strides, ks, &io);
  emit_extents(c, entry, meta, add64(c, after_strides, i64v(c, ks->nin)), ks, &io);
  gcc_jit_block_add_assignment(entry, NULL, flat, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, rows);
  /* rows: while (flat < end) */
  gcc_jit_block_end_with_conditional(
      rows, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(flat),
                                     gcc_jit_param_as_rvalue(prm[4])),
      row_body, done);
  /* row: row, j0, j1, offsets from the row's multi-index */
  c->cur = row_body;
  gcc_jit_block_add_assignment(row_body, NULL, row,
                               gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE,
                                                             c->t_i64, rv(flat), rv(inner)));
  gcc_jit_block_add_assignment(
      row_body, NULL, j0,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(flat),
                                    mul64(c, rv(row), rv(inner))));
  gcc_jit_block_add_assignment(
      row_body, NULL, j1,
      add64(c, rv(j0),
            gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64,
                                          gcc_jit_param_as_rvalue(prm[4]), rv(flat))));
  {
    /* The first row finds its offsets from its multi-index by a division
       per dim (dims); every later row is the next one, so it steps the
       odometer instead (carry).  Rows of 4 in 5 dims (a max-pool's
       windows) paid 8 divisions per row of 4 elements: the digits CNN's
       compiled step went from 1.75 to 1.69 ms */
    gcc_jit_block *clip = new_block(c, "clip"), *after = new_block(c, "after"),
                  *full = new_block(c, "full"), *carry = new_block(c, "carry"),
                  *carry_wrap = new_block(c, "cwrap");
    gcc_jit_block_end_with_conditional(
        row_body, NULL,
        gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GT, rv(j1), rv(inner)),
        clip, after);
    gcc_jit_block_add_assignment(clip, NULL, j1, rv(inner));
    gcc_jit_block_end_with_jump(clip, NULL, after);
    gcc_jit_block_add_assignment(
        after, NULL, d,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(nd),
                                      i64v(c, 2)));
    /* the call's first row is the one at begin */
    gcc_jit_block_end_with_conditional(
        after, NULL,
        gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_EQ, rv(flat),
                                       gcc_jit_param_as_rvalue(prm[3])),
        full, carry);
    for (int q = 0; q < ks->nin; q++)
      gcc_jit_block_add_assignment(full, NULL, io.off[q], i64v(c, 0));
    gcc_jit_block_add_assignment(full, NULL, r, rv(row));
    gcc_jit_block_end_with_jump(full, NULL, dims);
    /* carry: pos[d] += 1 (its strides added); past its extent it wraps to
       0 (its span taken off) and the next dim up steps.  The rows a call
       runs are consecutive, so d never falls below 0 with rows left */
    gcc_jit_block *carry_step = new_block(c, "cstep");
    gcc_jit_block_end_with_conditional(
        carry, NULL,
        gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GE, rv(d), i64v(c, 0)),
        carry_step, setup);
    gcc_jit_lvalue *pd = gcc_jit_context_new_array_access(c->ctx, NULL, rv(pos), rv(d));
    gcc_jit_rvalue *size = meta_at(c, meta, add64(c, rv(d), i64v(c, 1)));
    gcc_jit_block_add_assignment_op(carry_step, NULL, pd, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
    for (int q = 0; q < ks->nin; q++) {
      gcc_jit_rvalue *at = add64(c, add64(c, i64v(c, 1), mul64(c, rv(nd), i64v(c, q + 1))), rv(d));
      gcc_jit_block_add_assignment_op(carry_step, NULL, io.off[q], GCC_JIT_BINARY_OP_PLUS,
                                      meta_at(c, meta, at));
    }
    gcc_jit_block_end_with_conditional(
        carry_step, NULL,
        gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(pd), size), setup,
        carry_wrap);
    gcc_jit_block_add_assignment(carry_wrap, NULL, pd, i64v(c, 0));
    for (int q = 0; q < ks->nin; q++) {
      gcc_jit_rvalue *at = add64(c, add64(c, i64v(c, 1), mul64(c, rv(nd), i64v(c, q + 1))), rv(d));
      gcc_jit_block_add_assignment_op(carry_wrap, NULL, io.off[q], GCC_JIT_BINARY_OP_MINUS,
                                      mul64(c, meta_at(c, meta, at), size));
    }
    gcc_jit_block_add_assignment_op(carry_wrap, NULL, d, GCC_JIT_BINARY_OP_MINUS, i64v(c, 1));
    gcc_jit_block_end_with_jump(carry_wrap, NULL, carry);
  }
  gcc_jit_block_end_with_conditional(
      dims, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GE, rv(d), i64v(c, 0)),
      dim_body, setup);
  {
    gcc_jit_rvalue *size = meta_at(c, meta, add64(c, rv(d), i64v(c, 1)));
    gcc_jit_block_add_assignment(
        dim_body, NULL, idx,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MODULO, c->t_i64, rv(r),
                                      size));
    gcc_jit_block_add_assignment(
        dim_body, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(pos), rv(d)), rv(idx));
    gcc_jit_block_add_assignment(
        dim_body, NULL, r,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE, c->t_i64, rv(r),
                                      size));
    for (int q = 0; q < ks->nin; q++) {
      /* strides of input q start at 1 + nd + q*nd */
      gcc_jit_rvalue *at = add64(c, add64(c, i64v(c, 1), mul64(c, rv(nd), i64v(c, q + 1))), rv(d));
      gcc_jit_block_add_assignment_op(dim_body, NULL, io.off[q], GCC_JIT_BINARY_OP_PLUS,
                                      mul64(c, rv(idx), meta_at(c, meta, at)));
    }
    gcc_jit_block_add_assignment_op(dim_body, NULL, d, GCC_JIT_BINARY_OP_MINUS, i64v(c, 1));
    gcc_jit_block_end_with_jump(dim_body, NULL, dims);
  }
  /* setup: hoisted broadcast values and generic strides */
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_rvalue *at = add64(c, i64v(c, 1), mul64(c, rv(nd), i64v(c, q + 2)));
    gcc_jit_block_add_assignment(setup, NULL, io.step[q],
                                 meta_at(c, meta, add64(c, at, i64v(c, -1))));
    if (ks->stride_class[q] == 0 && !kernel_role_positional(ks->in_role[q]))
      hoist_input(c, setup, &io, q);
  }
  gcc_jit_block_add_assignment(setup, NULL, j, rv(j0));
  gcc_jit_block_end_with_jump(setup, NULL, inner_cond);
  gcc_jit_block_end_with_conditional(
      inner_cond, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(j), rv(j1)),
      inner_body, row_next);
  /* the inner body: loads, the group's nodes, stores */
  c->cur = inner_body;
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, &io, rv(j), in_val);
  size_t nnodes = (size_t)(grp->last - grp->first + 1);
  gcc_jit_lvalue **node_val = calloc(nnodes, sizeof *node_val);
  io.raw = calloc(nnodes, sizeof *io.raw);
  bool ok = node_val && io.raw &&
            emit_nodes(c, plan, grp, ks, &io, in_val, params, grp->last + 1, NULL, "v", node_val);
  if (ok) {
    gcc_jit_rvalue *at = add64(c, mul64(c, rv(row), rv(inner)), rv(j));
    for (int q = 0; q < ks->nout; q++) {
      gcc_jit_lvalue *raw = io.raw[ks->outs[q] - grp->first];
      if (raw) /* an f16 gather's output: the bits it moved */
        gcc_jit_block_add_assignment(
            c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.out_ptr[q]), at),
            rv(raw));
      else
        store_output(c, plan, ks, &io, q, at, rv(node_val[ks->outs[q] - grp->first]));
    }
    gcc_jit_block_add_assignment_op(c->cur, NULL, j, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
    gcc_jit_block_end_with_jump(c->cur, NULL, inner_cond);
  }
  free(node_val);
  free(io.raw);
  gcc_jit_block_add_assignment_op(
      row_next, NULL, flat, GCC_JIT_BINARY_OP_PLUS,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(j1),
                                    rv(j0)));
  gcc_jit_block_end_with_jump(row_next, NULL, rows);
  gcc_jit_block_end_with_void_return(done, NULL);
  return ok;
}

/* --- reduce kernels -----------------------------------------------------------------
 * A reduction over trailing axes with its elementwise producers fused in.
 * The kernel's range counts (kept row, chunk) pairs v = o * nchunks + ch;
 * each chunk folds reduced positions [ch * chunk, min(count, (ch+1) * chunk))
 * and writes its value to out[v].  One chunk per row (chunk = count) writes
 * the rows' results; more chunks write partials that the caller folds in
 * chunk order, so a reduction over one long row still runs on every thread
 * and its result does not depend on how many there are.
 *
 *   per chunk: acc = identity
 *     per block of REDUCE_BLOCK positions:
 *       lanes[0..L) = identity
 *       per step of L positions: for l in [0, L): value at r + l;
 *                                lanes[l] = comb(lanes[l], value)
 *       the block's tail:        lanes[0] = comb(lanes[0], value)
 *       acc = comb(acc, tree fold of lanes)
 *     out[v] = acc
 *
 * The lanes are explicit partial accumulators: the loop over l is a plain
 * map that GCC vectorizes without reassociating anything, so float sums
 * vectorize under strict IEEE semantics (the context never allows
 * -fassociative-math).  f32 sums and products accumulate in f64
 * (vm_fold_acc_dtype).
 * meta = rows, count, chunk, nchunks, then per input (row stride, inner
 * stride); the caller checked both collapse to one stride. */

#define REDUCE_BLOCK VM_FOLD_BLOCK /* the fold order: vm/fold.h */
#define REDUCE_LANE_BYTES VM_FOLD_LANE_BYTES

bool kernel_reduce_split(const tr_pnode *r, const vm_meta *in, int64_t *rows, int64_t *count) {
  bool seen_reduced = false;
  *rows = *count = 1;
  for (int d = 0; d < in->ndim; d++) {
    bool reduced = r->attr.axes_mask & (1u << d);
    if (in->shape[d] == 1) continue;
    if (reduced) {
      seen_reduced = true;
      *count *= in->shape[d];
    } else {
      if (seen_reduced) return false; /* a kept axis after a reduced one */
      *rows *= in->shape[d];
    }
  }
  return true;
}

static gcc_jit_rvalue *combine(cg_ctx *c, vm_opcode op, kiln_dtype dt, gcc_jit_rvalue *acc,
                               gcc_jit_rvalue *v) {
  gcc_jit_type *t = cg_type(c, dt);
  bool fl = vm_dtype_is_float(dt);
  switch (op) {
    case VM_OP_sum:
    case VM_OP_prod: {
      enum gcc_jit_binary_op bop =
          op == VM_OP_sum ? GCC_JIT_BINARY_OP_PLUS : GCC_JIT_BINARY_OP_MULT;
      if (fl) return gcc_jit_context_new_binary_op(c->ctx, NULL, bop, t, acc, v);
      gcc_jit_type *u = c->t_u64; /* integer sums/products wrap */
      return gcc_jit_context_new_cast(
          c->ctx, NULL,
          gcc_jit_context_new_binary_op(c->ctx, NULL, bop, u,
                                        gcc_jit_context_new_cast(c->ctx, NULL, acc, u),
                                        gcc_jit_context_new_cast(c->ctx, NULL, v, u)),
          t);
    }
    default: { /* max / min, NaN wins: the interpreter's (acc != acc || acc >= v) ? acc : v */
      tr_pnode fake = {.op = op == VM_OP_max ? VM_OP_maximum : VM_OP_minimum};
      gcc_jit_rvalue *args[2] = {acc, v};
      kiln_dtype dts[2] = {dt, dt};
      return cg_node(c, &fake, dts, args);
    }
  }
}

static gcc_jit_rvalue *identity(cg_ctx *c, vm_opcode op, kiln_dtype dt) {
  gcc_jit_type *t = cg_type(c, dt);
  double v = op == VM_OP_sum ? 0 : op == VM_OP_prod ? 1 : 0;
  if (op == VM_OP_max || op == VM_OP_min) {
    bool mx = op == VM_OP_max;
    if (vm_dtype_is_float(dt))
      return gcc_jit_context_new_rvalue_from_double(c->ctx, t, mx ? -INFINITY : INFINITY);
    long min, max;
    cg_int_range(dt, &min, &max);
    return gcc_jit_context_new_rvalue_from_long(c->ctx, t, mx ? min : max);
  }
  if (vm_dtype_is_float(dt)) return gcc_jit_context_new_rvalue_from_double(c->ctx, t, v);
  return gcc_jit_context_new_rvalue_from_long(c->ctx, t, (long)v);
}

static gcc_jit_rvalue *min64(cg_ctx *c, gcc_jit_block *b, gcc_jit_lvalue *tmp, gcc_jit_rvalue *x,
                             gcc_jit_rvalue *lim) {
  /* tmp = x < lim ? x : lim, as straight-line code in block b */
  gcc_jit_block_add_assignment(b, NULL, tmp, x);
  gcc_jit_rvalue *lt = gcc_jit_context_new_cast(
      c->ctx, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(tmp), lim), c->t_i64);
  /* lim + (x - lim) * (x < lim) */
  gcc_jit_rvalue *diff =
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(tmp), lim);
  return add64(c, lim, mul64(c, diff, lt));
}

/* one reduced position r of a reduce kernel's chunk: the producers, the
   stores of producers read elsewhere, and the value the reduction folds
   (NULL on failure) */
typedef struct {
  const tr_plan *plan;
  const tr_group *grp;
  const kernel_shape *ks;
  const kernel_io *io;
  gcc_jit_rvalue *params, *row_at; /* row_at = o * count */
  int reduce;                      /* the reduction node */
  bool store;                      /* store the producers read elsewhere */
  const bool *want;                /* the nodes this pass evaluates (NULL: all up to reduce) */
  gcc_jit_lvalue **node_val;       /* row-level values, kept between passes */
  int npass;
  const bool *avail;          /* row kernels: values kept in the scratch row: loaded */
  const bool *store_now;      /* and those this pass computes first: stored */
  gcc_jit_lvalue **stash_ptr; /* typed pointer to each kept value's scratch slot */
} position_ctx;

/* a kept value's scratch element r */
static gcc_jit_lvalue *stash_at(cg_ctx *c, gcc_jit_lvalue *ptr, gcc_jit_rvalue *r) {
  return gcc_jit_context_new_array_access(c->ctx, NULL, rv(ptr), r);
}

/* before a pass's nodes: kept values from the scratch row */
static void load_kept(cg_ctx *c, const tr_plan *plan, const tr_group *grp, const bool *avail,
                      gcc_jit_lvalue **stash_ptr, gcc_jit_rvalue *r, const char *prefix,
                      gcc_jit_lvalue **node_val) {
  for (int i = grp->first; avail && i <= grp->last; i++)
    if (avail[i - grp->first]) {
      node_val[i - grp->first] = new_local(c, cg_type(c, plan->nodes[i].meta.dtype), prefix, i);
      gcc_jit_block_add_assignment(c->cur, NULL, node_val[i - grp->first],
                                   rv(stash_at(c, stash_ptr[i - grp->first], r)));
    }
}

/* after them: the kept values this pass computed first */
static void store_kept(cg_ctx *c, const tr_group *grp, const bool *store_now,
                       gcc_jit_lvalue **stash_ptr, gcc_jit_rvalue *r, gcc_jit_lvalue **node_val) {
  for (int i = grp->first; store_now && i <= grp->last; i++)
    if (store_now[i - grp->first])
      gcc_jit_block_add_assignment(c->cur, NULL, stash_at(c, stash_ptr[i - grp->first], r),
                                   rv(node_val[i - grp->first]));
}

/* the value the reduction at pc->reduce folds at position r, cast to
   acc_dt; prefix names the locals of this copy of the producers */
static gcc_jit_rvalue *emit_position(cg_ctx *c, position_ctx *pc, gcc_jit_rvalue *r,
                                     kiln_dtype acc_dt, const char *prefix) {
  const tr_group *grp = pc->grp;
  const kernel_shape *ks = pc->ks;
  const tr_pnode *red = &pc->plan->nodes[pc->reduce];
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, pc->io, r, in_val);
  size_t n = (size_t)(grp->last - grp->first + 1);
  gcc_jit_lvalue **node_val = calloc(n, sizeof *node_val);
  if (!node_val) return NULL;
  if (pc->node_val) memcpy(node_val, pc->node_val, n * sizeof *node_val);
  char name[16], kept[16];
  snprintf(name, sizeof name, "%s%d", prefix, pc->npass);
  snprintf(kept, sizeof kept, "k%s%d", prefix, pc->npass);
  load_kept(c, pc->plan, grp, pc->avail, pc->stash_ptr, r, kept, node_val);
  if (!emit_nodes(c, pc->plan, grp, ks, pc->io, in_val, pc->params, pc->reduce, pc->want, name,
                  node_val)) {
    free(node_val);
    return NULL;
  }
  store_kept(c, grp, pc->store_now, pc->stash_ptr, r, node_val);
  int ref = red->in[0];
  bool internal = ref >= grp->first && ref <= grp->last && ks->compute[ref - grp->first];
  gcc_jit_rvalue *value;
  if (internal) {
    value = rv(node_val[ref - grp->first]);
  } else {
    int q = kernel_input(ks, ref, KERNEL_IN_PLAIN);
    if (q < 0) {
      free(node_val);
      return NULL;
    }
    value = in_val[q];
  }
  gcc_jit_rvalue *at = add64(c, pc->row_at, r);
  for (int q = 0; pc->store && q < ks->nout; q++) /* producers read elsewhere */
    if (ks->outs[q] != pc->reduce)
      store_output(c, pc->plan, ks, pc->io, q, at, rv(node_val[ks->outs[q] - grp->first]));
  free(node_val);
  return acc_dt == red->meta.dtype
             ? value
             : gcc_jit_context_new_cast(c->ctx, NULL, value, cg_type(c, acc_dt));
}

static gcc_jit_rvalue *lane(cg_ctx *c, gcc_jit_lvalue *lanes, gcc_jit_rvalue *l) {
  return rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), l));
}

/* From c->cur: acc = fold of positions [r, rlim) (r advances to rlim), in
   blocks of REDUCE_BLOCK, each through the lane loop; ends with c->cur
   after the fold.  `tag` keeps this fold's locals and blocks apart from
   other folds of the same function. */
static bool emit_fold(cg_ctx *c, position_ctx *pc, gcc_jit_lvalue *acc, gcc_jit_lvalue *r,
                      gcc_jit_rvalue *rlim, int tag) {
  const tr_pnode *red = &pc->plan->nodes[pc->reduce];
  kiln_dtype acc_dt = vm_fold_acc_dtype(red->op, red->meta.dtype);
  long nlanes = REDUCE_LANE_BYTES / (long)vm_dtype_size(acc_dt);
  gcc_jit_type *acc_t = cg_type(c, acc_dt);
  gcc_jit_lvalue *rend = new_local(c, c->t_i64, "rend", tag), *l = new_local(c, c->t_i64, "l", tag),
                 *tmp = new_local(c, c->t_i64, "tmp", tag),
                 *lanes =
                     new_local(c, gcc_jit_context_new_array_type(c->ctx, NULL, acc_t, (int)nlanes),
                               "lanes", tag);
  gcc_jit_block *outer = new_block(c, "outer"), *blk_init = new_block(c, "blk"),
                *vcond = new_block(c, "vcond"), *vinit = new_block(c, "vinit"),
                *lcond = new_block(c, "lcond"), *lbody = new_block(c, "lbody"),
                *vnext = new_block(c, "vnext"), *tcond = new_block(c, "tcond"),
                *tbody = new_block(c, "tbody"), *blk_done = new_block(c, "blkdone"),
                *after = new_block(c, "folded");
  gcc_jit_block_add_assignment(c->cur, NULL, acc, identity(c, red->op, acc_dt));
  gcc_jit_block_end_with_jump(c->cur, NULL, outer);
  cond_loop(outer, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rlim),
            blk_init, after);
  /* a block: lanes reset, its end */
  for (long k = 0; k < nlanes; k++)
    gcc_jit_block_add_assignment(
        blk_init, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, k)),
        identity(c, red->op, acc_dt));
  gcc_jit_block_add_assignment(
      blk_init, NULL, rend, min64(c, blk_init, tmp, add64(c, rv(r), i64v(c, REDUCE_BLOCK)), rlim));
  gcc_jit_block_end_with_jump(blk_init, NULL, vcond);
  /* full steps of L positions: the vectorized lane loop */
  cond_loop(vcond,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LE,
                                           add64(c, rv(r), i64v(c, nlanes)), rv(rend)),
            vinit, tcond);
  gcc_jit_block_add_assignment(vinit, NULL, l, i64v(c, 0));
  gcc_jit_block_end_with_jump(vinit, NULL, lcond);
  cond_loop(
      lcond,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(l), i64v(c, nlanes)),
      lbody, vnext);
  c->cur = lbody;
  gcc_jit_rvalue *val = emit_position(c, pc, add64(c, rv(r), rv(l)), acc_dt, "v");
  if (!val) return false;
  gcc_jit_rvalue *next =
      combine(c, red->op, acc_dt, lane(c, lanes, rv(l)), val); /* may add blocks */
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), rv(l)), next);
  gcc_jit_block_add_assignment_op(c->cur, NULL, l, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, lcond);
  gcc_jit_block_add_assignment_op(vnext, NULL, r, GCC_JIT_BINARY_OP_PLUS, i64v(c, nlanes));
  gcc_jit_block_end_with_jump(vnext, NULL, vcond);
  /* the block's tail, one position at a time into lane 0 */
  cond_loop(tcond,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rv(rend)),
            tbody, blk_done);
  c->cur = tbody;
  val = emit_position(c, pc, rv(r), acc_dt, "t");
  if (!val) return false;
  next = combine(c, red->op, acc_dt, lane(c, lanes, i64v(c, 0)), val);
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, 0)), next);
  gcc_jit_block_add_assignment_op(c->cur, NULL, r, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, tcond);
  /* block done: a tree fold of the lanes into acc */
  c->cur = blk_done;
  for (long w = nlanes / 2; w >= 1; w /= 2)
    for (long k = 0; k < w; k++) {
      gcc_jit_rvalue *folded =
          combine(c, red->op, acc_dt, lane(c, lanes, i64v(c, k)), lane(c, lanes, i64v(c, k + w)));
      gcc_jit_block_add_assignment(
          c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, k)),
          folded);
    }
  next = combine(c, red->op, acc_dt, rv(acc), lane(c, lanes, i64v(c, 0)));
  gcc_jit_block_add_assignment(c->cur, NULL, acc, next);
  gcc_jit_block_end_with_jump(c->cur, NULL, outer);
  c->cur = after;
  return true;
}

bool kernel_emit_reduce(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                        const kernel_shape *ks, const char *name) {
  const tr_group *grp = &plan->groups[g];
  const tr_pnode *red = &plan->nodes[ks->reduce];
  gcc_jit_param *prm[5];
  new_kernel_fn(c, name, prm);
  gcc_jit_rvalue *bufs = gcc_jit_param_as_rvalue(prm[0]), *meta = gcc_jit_param_as_rvalue(prm[1]);
  gcc_jit_block *entry = new_block(c, "entry"), *rows = new_block(c, "rows"),
                *row = new_block(c, "row"), *done = new_block(c, "done");
  kiln_dtype out_dt = red->meta.dtype, acc_dt = vm_fold_acc_dtype(red->op, out_dt);
  gcc_jit_lvalue *count = new_local(c, c->t_i64, "count", 0),
                 *chunk = new_local(c, c->t_i64, "chunk", 0),
                 *nchunks = new_local(c, c->t_i64, "nchunks", 0),
                 *v = new_local(c, c->t_i64, "v", 0), *o = new_local(c, c->t_i64, "o", 0),
                 *r = new_local(c, c->t_i64, "r", 0), *rlim = new_local(c, c->t_i64, "rlim", 0),
                 *row_at = new_local(c, c->t_i64, "rowat", 0),
                 *tmp = new_local(c, c->t_i64, "tmp", 0),
                 *acc = new_local(c, cg_type(c, acc_dt), "acc", 0);
  kernel_io io; /* io.off holds each input's row base */
  gcc_jit_block_add_assignment(entry, NULL, count, meta_at(c, meta, i64v(c, 1)));
  gcc_jit_block_add_assignment(entry, NULL, chunk, meta_at(c, meta, i64v(c, 2)));
  gcc_jit_block_add_assignment(entry, NULL, nchunks, meta_at(c, meta, i64v(c, 3)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  for (int q = 0; q < ks->nin; q++)
    gcc_jit_block_add_assignment(entry, NULL, io.step[q], meta_at(c, meta, i64v(c, 5 + 2 * q)));
  emit_gather_strides(c, entry, meta, i64v(c, 4 + 2 * ks->nin), ks, &io);
  gcc_jit_block_add_assignment(entry, NULL, v, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, rows);
  cond_loop(rows,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(v),
                                           gcc_jit_param_as_rvalue(prm[4])),
            row, done);
  /* row: o, the chunk's positions, the inputs' row bases */
  gcc_jit_block_add_assignment(row, NULL, o,
                               gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE,
                                                             c->t_i64, rv(v), rv(nchunks)));
  gcc_jit_block_add_assignment(
      row, NULL, r,
      mul64(c,
            gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(v),
                                          mul64(c, rv(o), rv(nchunks))),
            rv(chunk)));
  gcc_jit_block_add_assignment(row, NULL, rlim,
                               min64(c, row, tmp, add64(c, rv(r), rv(chunk)), rv(count)));
  gcc_jit_block_add_assignment(row, NULL, row_at, mul64(c, rv(o), rv(count)));
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_block_add_assignment(row, NULL, io.off[q],
                                 mul64(c, rv(o), meta_at(c, meta, i64v(c, 4 + 2 * q))));
    if (ks->stride_class[q] == 0 && !kernel_role_positional(ks->in_role[q]))
      hoist_input(c, row, &io, q);
  }
  c->cur = row;
  position_ctx pc = {.plan = plan,
                     .grp = grp,
                     .ks = ks,
                     .io = &io,
                     .params = gcc_jit_param_as_rvalue(prm[2]),
                     .row_at = rv(row_at),
                     .reduce = ks->reduce,
                     .store = true};
  if (!emit_fold(c, &pc, acc, r, rv(rlim), 0)) return false;
  /* the chunk's value */
  int qr = 0;
  while (ks->outs[qr] != ks->reduce) qr++;
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.out_ptr[qr]), rv(v)),
      gcc_jit_context_new_cast(c->ctx, NULL, rv(acc), cg_type(c, out_dt)));
  gcc_jit_block_add_assignment_op(c->cur, NULL, v, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, rows);
  gcc_jit_block_end_with_void_return(done, NULL);
  return true;
}

/* --- column reductions ----------------------------------------------------------------
 * A reduction whose kept axes surround it (sum over axis 0 of a matrix: a
 * bias gradient) as outer x count x inner.  Work items are (o, block of
 * KERNEL_COLS inner positions); per item:
 *   acc[0..w) = identity
 *   per block of REDUCE_BLOCK reduced positions r:
 *     blk[0..w) = identity
 *     for r: for b in the item's columns: blk[b] = comb(blk[b], value(o, r, b))
 *     acc[b] = comb(acc[b], blk[b])
 *   out[o * inner + b] = acc[b]
 * The loop over b is a map over contiguous columns, so it vectorizes with
 * no reassociation; each column folds its positions in order.
 * meta = outer, count, inner, nblocks, then per input (outer stride,
 * reduced stride, inner stride). */

bool kernel_reduce_split3(const tr_pnode *r, const vm_meta *in, int64_t *outer, int64_t *count,
                          int64_t *inner) {
  int stage = 0; /* 0: kept before, 1: reduced, 2: kept after */
  *outer = *count = *inner = 1;
  for (int d = 0; d < in->ndim; d++) {
    if (in->shape[d] == 1) continue;
    bool reduced = r->attr.axes_mask & (1u << d);
    if (reduced) {
      if (stage == 2) return false;
      stage = 1;
      *count *= in->shape[d];
    } else if (stage == 0) {
      *outer *= in->shape[d];
    } else {
      stage = 2;
      *inner *= in->shape[d];
    }
  }
  return true;
}

bool kernel_emit_reduce_cols(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                             const kernel_shape *ks, const char *name) {
  const tr_group *grp = &plan->groups[g];
  const tr_pnode *red = &plan->nodes[ks->reduce];
  gcc_jit_param *prm[5];
  new_kernel_fn(c, name, prm);
  gcc_jit_rvalue *bufs = gcc_jit_param_as_rvalue(prm[0]), *meta = gcc_jit_param_as_rvalue(prm[1]);
  kiln_dtype out_dt = red->meta.dtype, acc_dt = vm_fold_acc_dtype(red->op, out_dt);
  gcc_jit_type *acc_t = cg_type(c, acc_dt),
               *arr_t = gcc_jit_context_new_array_type(c->ctx, NULL, acc_t, KERNEL_COLS);
  gcc_jit_block *entry = new_block(c, "entry"), *items = new_block(c, "items"),
                *item = new_block(c, "item"), *done = new_block(c, "done");
  gcc_jit_lvalue *count = new_local(c, c->t_i64, "count", 0),
                 *inner = new_local(c, c->t_i64, "inner", 0),
                 *nblocks = new_local(c, c->t_i64, "nblocks", 0),
                 *v = new_local(c, c->t_i64, "v", 0), *o = new_local(c, c->t_i64, "o", 0),
                 *b0 = new_local(c, c->t_i64, "b0", 0), *w = new_local(c, c->t_i64, "w", 0),
                 *r = new_local(c, c->t_i64, "r", 0), *rend = new_local(c, c->t_i64, "rend", 0),
                 *b = new_local(c, c->t_i64, "b", 0), *k = new_local(c, c->t_i64, "k", 0),
                 *tmp = new_local(c, c->t_i64, "tmp", 0),
                 *row_at = new_local(c, c->t_i64, "rowat", 0), *acc = new_local(c, arr_t, "acc", 0),
                 *blk = new_local(c, arr_t, "blk", 0);
  kernel_io io;
  gcc_jit_block_add_assignment(entry, NULL, count, meta_at(c, meta, i64v(c, 1)));
  gcc_jit_block_add_assignment(entry, NULL, inner, meta_at(c, meta, i64v(c, 2)));
  gcc_jit_block_add_assignment(entry, NULL, nblocks, meta_at(c, meta, i64v(c, 3)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  for (int q = 0; q < ks->nin; q++)
    gcc_jit_block_add_assignment(entry, NULL, io.step[q], meta_at(c, meta, i64v(c, 6 + 3 * q)));
  gcc_jit_block_add_assignment(entry, NULL, v, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, items);
  cond_loop(items,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(v),
                                           gcc_jit_param_as_rvalue(prm[4])),
            item, done);
  /* the item: o, its columns [b0, b0 + w) */
  c->cur = item;
  gcc_jit_block_add_assignment(item, NULL, o,
                               gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE,
                                                             c->t_i64, rv(v), rv(nblocks)));
  gcc_jit_block_add_assignment(
      item, NULL, b0,
      mul64(c,
            gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(v),
                                          mul64(c, rv(o), rv(nblocks))),
            i64v(c, KERNEL_COLS)));
  gcc_jit_rvalue *left = gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS,
                                                       c->t_i64, rv(inner), rv(b0));
  gcc_jit_block_add_assignment(item, NULL, w, min64(c, item, tmp, left, i64v(c, KERNEL_COLS)));
  counted_loop L = open_loop(c, k, i64v(c, 0), rv(w), "ainit");
  gcc_jit_block_add_assignment(c->cur, NULL,
                               gcc_jit_context_new_array_access(c->ctx, NULL, rv(acc), rv(k)),
                               identity(c, red->op, acc_dt));
  close_loop(c, &L);
  /* blocks of reduced positions */
  gcc_jit_block *outer = new_block(c, "outer"), *blk_init = new_block(c, "blk"),
                *finish = new_block(c, "finish");
  gcc_jit_block_add_assignment(c->cur, NULL, r, i64v(c, 0));
  gcc_jit_block_end_with_jump(c->cur, NULL, outer);
  cond_loop(outer,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rv(count)),
            blk_init, finish);
  c->cur = blk_init;
  gcc_jit_block_add_assignment(
      c->cur, NULL, rend, min64(c, c->cur, tmp, add64(c, rv(r), i64v(c, REDUCE_BLOCK)), rv(count)));
  L = open_loop(c, k, i64v(c, 0), rv(w), "binit");
  gcc_jit_block_add_assignment(c->cur, NULL,
                               gcc_jit_context_new_array_access(c->ctx, NULL, rv(blk), rv(k)),
                               identity(c, red->op, acc_dt));
  close_loop(c, &L);
  /* for r in the block: the inputs' bases at (o, r), then the columns */
  gcc_jit_block *rcond = new_block(c, "rcond"), *rbody = new_block(c, "rbody"),
                *blk_done = new_block(c, "blkdone");
  gcc_jit_block_end_with_jump(c->cur, NULL, rcond);
  cond_loop(rcond,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rv(rend)),
            rbody, blk_done);
  c->cur = rbody;
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_block_add_assignment(
        c->cur, NULL, io.off[q],
        add64(c, mul64(c, rv(o), meta_at(c, meta, i64v(c, 4 + 3 * q))),
              add64(c, mul64(c, rv(r), meta_at(c, meta, i64v(c, 5 + 3 * q))),
                    mul64(c, rv(b0), meta_at(c, meta, i64v(c, 6 + 3 * q))))));
    if (ks->stride_class[q] == 0 && !kernel_role_positional(ks->in_role[q]))
      hoist_input(c, c->cur, &io, q);
  }
  gcc_jit_block_add_assignment(
      c->cur, NULL, row_at,
      add64(c, mul64(c, add64(c, mul64(c, rv(o), rv(count)), rv(r)), rv(inner)), rv(b0)));
  L = open_loop(c, b, i64v(c, 0), rv(w), "cols");
  position_ctx pc = {.plan = plan,
                     .grp = grp,
                     .ks = ks,
                     .io = &io,
                     .params = gcc_jit_param_as_rvalue(prm[2]),
                     .row_at = rv(row_at),
                     .reduce = ks->reduce,
                     .store = true};
  gcc_jit_rvalue *val = emit_position(c, &pc, rv(b), acc_dt, "v");
  if (!val) return false;
  gcc_jit_rvalue *next = combine(
      c, red->op, acc_dt, rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(blk), rv(b))), val);
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(blk), rv(b)), next);
  close_loop(c, &L);
  gcc_jit_block_add_assignment_op(c->cur, NULL, r, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, rcond);
  /* the block folds into acc */
  c->cur = blk_done;
  L = open_loop(c, k, i64v(c, 0), rv(w), "bfold");
  next = combine(c, red->op, acc_dt,
                 rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(acc), rv(k))),
                 rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(blk), rv(k))));
  gcc_jit_block_add_assignment(
      c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(acc), rv(k)), next);
  close_loop(c, &L);
  gcc_jit_block_end_with_jump(c->cur, NULL, outer);
  /* the item's results */
  c->cur = finish;
  int qr = 0;
  while (ks->outs[qr] != ks->reduce) qr++;
  L = open_loop(c, k, i64v(c, 0), rv(w), "store");
  gcc_jit_block_add_assignment(
      c->cur, NULL,
      gcc_jit_context_new_array_access(
          c->ctx, NULL, rv(io.out_ptr[qr]),
          add64(c, mul64(c, rv(o), rv(inner)), add64(c, rv(b0), rv(k)))),
      gcc_jit_context_new_cast(c->ctx, NULL,
                               rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(acc), rv(k))),
                               cg_type(c, out_dt)));
  close_loop(c, &L);
  gcc_jit_block_add_assignment_op(c->cur, NULL, v, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, items);
  gcc_jit_block_end_with_void_return(done, NULL);
  return true;
}

/* --- row kernels ---------------------------------------------------------------------
 * kernel.h says what they fuse.  Per kept row o in [begin, end):
 *   the row-level nodes before the first reduction
 *   per reduction k: a fold pass over the row (emit_fold) evaluating the
 *     per-element nodes its input needs; then the row-level nodes up to
 *     the next reduction
 *   a last pass storing the per-element values read after the run
 *   the row-level values read after the run: out[o]
 * meta = rows, count, then per input (row stride, inner stride), as for
 * reduce kernels. */

static const vm_meta *ref_meta(const tr_plan *plan, const cpu_leaf *leaves, int ref) {
  return ref >= 0 ? &plan->nodes[ref].meta : &leaves[-1 - ref].meta;
}

static void plan_stash(const tr_plan *plan, kernel_shape *ks, int first);

typedef struct {
  const tr_row_space *sp;
  const cpu_leaf *leaves;
  kernel_shape *ks;
  int g, first; /* the run's first group, its first node */
} rows_fill_ctx;

/* one node of a row kernel (tr_rows_walk): its inputs, whether the code
   generator computes it, its scalar if a fill, its output if stored */
static bool rows_take(void *ctx, const tr_row_node *n) {
  rows_fill_ctx *c = ctx;
  const tr_plan *plan = c->sp->plan;
  kernel_shape *ks = c->ks;
  const tr_pnode *p = &plan->nodes[n->i];
  ks->compute[n->i - c->first] = true;
  if (n->reduction && ks->reduce < 0) ks->reduce = n->i;
  kiln_dtype in_dt[3];
  for (int k = 0; k < p->nin; k++) {
    int ref = tr_pnode_input(p, k);
    in_dt[k] = ref_meta(plan, c->leaves, ref)->dtype;
    if (ref >= c->first && ref <= ks->last_node) continue;
    bool seen = false;
    for (int q = 0; q < ks->nin && !seen; q++) seen = ks->ins[q] == ref;
    if (!seen) {
      if (ks->nin == KERNEL_MAX_IO) return false;
      ks->in_role[ks->nin] = KERNEL_IN_PLAIN;
      ks->in_axis[ks->nin] = -1;
      ks->in_bound[ks->nin] = -1;
      ks->ins[ks->nin++] = ref;
    }
  }
  if (n->reduction && touches_half(plan, c->leaves, n->i)) return false; /* reduced in f32 */
  if (!n->reduction) {
    if (!cg_supported(p, in_dt)) return false;
    ks->per_elem[n->i - c->first] = n->varies;
    if (p->op == VM_OP_full) {
      if (ks->nparams == KERNEL_MAX_IO) return false;
      ks->params[ks->nparams++] = n->i;
    }
  }
  if (n->read_after) { /* stored */
    if (ks->nout == KERNEL_MAX_IO) return false;
    ks->outs[ks->nout++] = n->i;
  }
  return true;
}

/* the kernel shape of groups g..gb as a row kernel; false if it cannot be one */
static bool rows_fill(void *ctx, int gb) {
  rows_fill_ctx *c = ctx;
  const tr_row_space *sp = c->sp;
  const tr_plan *plan = sp->plan;
  kernel_shape *ks = c->ks;
  int first = c->first, last = plan->groups[gb].last;
  kernel_shape_clear(ks, last - first + 1);
  ks->rowwise = true;
  ks->last_group = gb;
  ks->last_node = last;
  ks->resume = last + 1;
  ks->reduce = -1;
  if (!tr_rows_walk(sp, c->g, gb, KERNEL_MAX_NODES, rows_take, c)) return false;
  for (int q = 0; q < ks->nin; q++) {
    int r = ks->ins[q];
    ks->stride_class[q] =
        tr_meta_const_along(ref_meta(plan, c->leaves, r), sp->R, sp->axes) || tr_is_fill(plan, r)
            ? 0
        : inner_unit(plan, c->leaves, r) ? 1
                                         : 2;
  }
  plan_stash(plan, ks, first);
  return true;
}

static const vm_meta *leaf_meta(const void *leaves, int leaf) {
  return &((const cpu_leaf *)leaves)[leaf].meta;
}

/* the reductions the code generator folds in a row */
static bool row_folds(vm_opcode op, kiln_dtype in, kiln_dtype out) {
  (void)out;
  return (op == VM_OP_sum || op == VM_OP_prod || op == VM_OP_max || op == VM_OP_min) &&
         in != KILN_BOOL;
}

int kernel_plan_rows(const tr_plan *plan, int g, const cpu_leaf *leaves, kernel_shape *ks) {
  tr_row_space sp;
  if (!tr_rows_space(plan, g, leaf_meta, leaves, row_folds, &sp)) return -1;
  const tr_pnode *r0 = &plan->nodes[sp.red0];
  int64_t rows, count;
  /* rows longer than a chunk would not stay in cache between passes, and
     a row kernel cannot split a row across threads: those compile group by
     group (plans are specialized to shapes, so this is decided once) */
  if (!kernel_reduce_split(r0, sp.R, &rows, &count) || count < 2 || count > KERNEL_REDUCE_CHUNK)
    return -1;
  rows_fill_ctx fc = {&sp, leaves, ks, g, plan->groups[g].first};
  int gb = tr_rows_plan(&sp, g, rows_fill, &fc);
  if (gb < 0) return -1;
  ks->first_node = plan->groups[g].first;
  ks->span_kind = plan->groups[g].kind;
  return gb;
}

/* marks in want the per-element nodes node i needs (i itself included),
   except values kept in the scratch row (avail) */
static void need(const tr_plan *plan, const kernel_shape *ks, int first, int i, const bool *avail,
                 bool *want) {
  if (i < first || i > ks->last_node || !ks->per_elem[i - first] || want[i - first]) return;
  if (avail && avail[i - first]) return;
  want[i - first] = true;
  const tr_pnode *p = &plan->nodes[i];
  for (int k = 0; k < p->nin; k++) need(plan, ks, first, tr_pnode_input(p, k), avail, want);
}

/* the op's cost counts as high: worth keeping rather than recomputing */
static bool costly(const tr_pnode *p) {
  switch (p->op) {
    case VM_OP_exp:
    case VM_OP_log:
    case VM_OP_tanh:
    case VM_OP_sigmoid:
    case VM_OP_sin:
    case VM_OP_cos:
    case VM_OP_log1p:
    case VM_OP_expm1:
    case VM_OP_erf:
    case VM_OP_pow:
    case VM_OP_div:
      return true;
    default:
      return false;
  }
}

/* which costly per-element values more than one pass needs: those get a
   scratch slot (ks->stash), at most KERNEL_MAX_STASH */
static void plan_stash(const tr_plan *plan, kernel_shape *ks, int first) {
  int n = ks->last_node - first + 1;
  uint8_t *uses = calloc((size_t)n, 1);
  bool *want = calloc((size_t)n, 1);
  if (!uses || !want) {
    free(uses);
    free(want);
    return;
  }
  for (int pass = first; pass <= ks->last_node + 1; pass++) { /* each reduction, then the stores */
    memset(want, 0, (size_t)n);
    if (pass <= ks->last_node) {
      if (vm_op_table[plan->nodes[pass].op].kind != VM_KIND_REDUCE) continue;
      need(plan, ks, first, tr_pnode_input(&plan->nodes[pass], 0), NULL, want);
    } else {
      for (int q = 0; q < ks->nout; q++)
        if (ks->per_elem[ks->outs[q] - first]) need(plan, ks, first, ks->outs[q], NULL, want);
    }
    for (int i = 0; i < n; i++) uses[i] += want[i];
  }
  for (int i = 0; i < n && ks->nstash < KERNEL_MAX_STASH; i++)
    if (uses[i] > 1 && costly(&plan->nodes[first + i])) ks->stash[i] = (int8_t)(++ks->nstash);
  free(uses);
  free(want);
}

/* the row-level nodes in [from, stop) not yet evaluated */
static bool emit_row_level(cg_ctx *c, const tr_plan *plan, const tr_group *span,
                           const kernel_shape *ks, const kernel_io *io, gcc_jit_rvalue *params,
                           int from, int stop, bool *want, gcc_jit_lvalue **node_val) {
  int n = span->last - span->first + 1;
  memset(want, 0, (size_t)n);
  for (int i = from; i < stop; i++)
    want[i - span->first] =
        !ks->per_elem[i - span->first] && vm_op_table[plan->nodes[i].op].kind != VM_KIND_REDUCE;
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, io, i64v(c, 0), in_val); /* only hoisted inputs are read */
  return emit_nodes(c, plan, span, ks, io, in_val, params, stop, want, "w", node_val);
}

/* a row kernel's map loop at position r: the wanted per-element nodes,
   with values kept by earlier passes loaded from the scratch row, into a
   copy of the row's values (malloc'd: the caller frees; NULL on failure) */
static gcc_jit_lvalue **row_position(cg_ctx *c, const tr_plan *plan, const tr_group *span,
                                     const kernel_shape *ks, const kernel_io *io,
                                     gcc_jit_rvalue *params, gcc_jit_lvalue **node_val,
                                     const bool *avail, gcc_jit_lvalue **stash_ptr,
                                     const bool *want, gcc_jit_rvalue *r, const char *prefix) {
  int n = span->last - span->first + 1;
  gcc_jit_lvalue **pass_val = malloc((size_t)n * sizeof *pass_val);
  if (!pass_val) return NULL;
  memcpy(pass_val, node_val, (size_t)n * sizeof *pass_val);
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, io, r, in_val);
  char kept[20];
  snprintf(kept, sizeof kept, "k%s", prefix);
  load_kept(c, plan, span, avail, stash_ptr, r, kept, pass_val);
  if (!emit_nodes(c, plan, span, ks, io, in_val, params, span->last + 1, want, prefix, pass_val)) {
    free(pass_val);
    return NULL;
  }
  return pass_val;
}

bool kernel_emit_rows(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                      const kernel_shape *ks, const char *name) {
  tr_group span = {.kind = TR_GROUP_REDUCE, .first = plan->groups[g].first, .last = ks->last_node};
  int n = span.last - span.first + 1;
  gcc_jit_param *prm[5];
  new_kernel_fn(c, name, prm);
  gcc_jit_rvalue *bufs = gcc_jit_param_as_rvalue(prm[0]), *meta = gcc_jit_param_as_rvalue(prm[1]),
                 *params = gcc_jit_param_as_rvalue(prm[2]);
  gcc_jit_block *entry = new_block(c, "entry"), *rows = new_block(c, "rows"),
                *row = new_block(c, "row"), *done = new_block(c, "done");
  gcc_jit_lvalue *count = new_local(c, c->t_i64, "count", 0), *o = new_local(c, c->t_i64, "o", 0),
                 *r = new_local(c, c->t_i64, "r", 0), *row_at = new_local(c, c->t_i64, "rowat", 0);
  kernel_io io;
  gcc_jit_block_add_assignment(entry, NULL, count, meta_at(c, meta, i64v(c, 1)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  for (int q = 0; q < ks->nin; q++)
    gcc_jit_block_add_assignment(entry, NULL, io.step[q], meta_at(c, meta, i64v(c, 3 + 2 * q)));
  gcc_jit_block_add_assignment(entry, NULL, o, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, rows);
  cond_loop(rows,
            gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(o),
                                           gcc_jit_param_as_rvalue(prm[4])),
            row, done);
  gcc_jit_block_add_assignment(row, NULL, row_at, mul64(c, rv(o), rv(count)));
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_block_add_assignment(row, NULL, io.off[q],
                                 mul64(c, rv(o), meta_at(c, meta, i64v(c, 2 + 2 * q))));
    if (ks->stride_class[q] == 0 && !kernel_role_positional(ks->in_role[q]))
      hoist_input(c, row, &io, q);
  }
  c->cur = row;
  gcc_jit_lvalue **node_val = calloc((size_t)n, sizeof *node_val),
                 **stash_ptr = calloc((size_t)n, sizeof *stash_ptr);
  bool *want = calloc((size_t)n, 1), *avail = calloc((size_t)n, 1),
       *store_now = calloc((size_t)n, 1);
  bool ok = node_val && stash_ptr && want && avail && store_now;
  /* the scratch row's slots: bufs[nout + nin] + slot * 8 * count (set per row: cheap) */
  for (int i = 0; ok && i < n; i++) {
    if (!ks->stash[i]) continue;
    gcc_jit_type *pt = gcc_jit_type_get_pointer(cg_type(c, plan->nodes[span.first + i].meta.dtype));
    gcc_jit_rvalue *base =
        rv(gcc_jit_context_new_array_access(c->ctx, NULL, bufs, i64v(c, ks->nout + ks->nin)));
    gcc_jit_lvalue *bytes = gcc_jit_context_new_array_access(
        c->ctx, NULL,
        gcc_jit_context_new_cast(
            c->ctx, NULL, base,
            gcc_jit_type_get_pointer(gcc_jit_context_get_type(c->ctx, GCC_JIT_TYPE_CHAR))),
        mul64(c, rv(count), i64v(c, 8L * (ks->stash[i] - 1))));
    stash_ptr[i] = new_local(c, pt, "kept", span.first + i);
    gcc_jit_block_add_assignment(
        c->cur, NULL, stash_ptr[i],
        gcc_jit_context_new_cast(c->ctx, NULL, gcc_jit_lvalue_get_address(bytes, NULL), pt));
  }
  /* the reductions in order, each with the row-level nodes before it */
  int from = span.first, npass = 0;
  for (int i = span.first; ok && i <= span.last; i++) {
    const tr_pnode *red = &plan->nodes[i];
    if (vm_op_table[red->op].kind != VM_KIND_REDUCE) continue;
    ok = emit_row_level(c, plan, &span, ks, &io, params, from, i, want, node_val);
    from = i + 1;
    memset(want, 0, (size_t)n);
    need(plan, ks, span.first, tr_pnode_input(red, 0), avail, want);
    bool keep_now = false;
    for (int k = 0; k < n; k++) keep_now |= store_now[k] = want[k] && ks->stash[k];
    if (ok && keep_now) {
      /* the values this pass keeps are computed and stored by a map loop of
         their own first; the fold then loads them.  A store inside the
         fold's lane loop made GCC re-check aliasing and re-broadcast the
         constants every few positions (a third of softmax's time). */
      memset(want, 0, (size_t)n);
      for (int k = 0; k < n; k++)
        if (store_now[k]) need(plan, ks, span.first, span.first + k, avail, want);
      gcc_jit_lvalue *pr = new_local(c, c->t_i64, "pre", i);
      counted_loop L = open_loop(c, pr, i64v(c, 0), rv(count), "keep");
      char name[16];
      snprintf(name, sizeof name, "p%d", npass);
      gcc_jit_lvalue **pass_val = row_position(c, plan, &span, ks, &io, params, node_val, avail,
                                               stash_ptr, want, rv(pr), name);
      ok = pass_val != NULL;
      if (ok) store_kept(c, &span, store_now, stash_ptr, rv(pr), pass_val);
      free(pass_val);
      close_loop(c, &L);
      for (int k = 0; k < n; k++) avail[k] |= store_now[k];
      memset(store_now, 0, (size_t)n);
      memset(want, 0, (size_t)n);
      need(plan, ks, span.first, tr_pnode_input(red, 0), avail, want);
    }
    kiln_dtype acc_dt = vm_fold_acc_dtype(red->op, red->meta.dtype);
    gcc_jit_lvalue *acc = new_local(c, cg_type(c, acc_dt), "acc", i);
    position_ctx pc = {.plan = plan,
                       .grp = &span,
                       .ks = ks,
                       .io = &io,
                       .params = params,
                       .row_at = rv(row_at),
                       .reduce = i,
                       .want = want,
                       .node_val = node_val,
                       .npass = npass++,
                       .avail = avail,
                       .store_now = store_now,
                       .stash_ptr = stash_ptr};
    if (ok) gcc_jit_block_add_assignment(c->cur, NULL, r, i64v(c, 0));
    ok = ok && emit_fold(c, &pc, acc, r, rv(count), i + 1);
    if (ok) {
      node_val[i - span.first] = new_local(c, cg_type(c, red->meta.dtype), "red", i);
      gcc_jit_block_add_assignment(
          c->cur, NULL, node_val[i - span.first],
          gcc_jit_context_new_cast(c->ctx, NULL, rv(acc), cg_type(c, red->meta.dtype)));
    }
    for (int k = 0; k < n; k++) avail[k] |= store_now[k];
  }
  ok = ok && emit_row_level(c, plan, &span, ks, &io, params, from, span.last + 1, want, node_val);
  /* the last pass: per-element values read after the run */
  bool stores = false;
  if (ok) {
    memset(want, 0, (size_t)n);
    for (int q = 0; q < ks->nout; q++)
      if (ks->per_elem[ks->outs[q] - span.first]) {
        need(plan, ks, span.first, ks->outs[q], avail, want);
        stores = true;
      }
  }
  if (ok && stores) {
    counted_loop L = open_loop(c, r, i64v(c, 0), rv(count), "store");
    gcc_jit_lvalue **pass_val =
        row_position(c, plan, &span, ks, &io, params, node_val, avail, stash_ptr, want, rv(r), "s");
    ok = pass_val != NULL;
    gcc_jit_rvalue *at = add64(c, rv(row_at), rv(r));
    for (int q = 0; ok && q < ks->nout; q++)
      if (ks->per_elem[ks->outs[q] - span.first])
        store_output(c, plan, ks, &io, q, at, rv(pass_val[ks->outs[q] - span.first]));
    free(pass_val);
    close_loop(c, &L);
  }
  /* row-level values read after the run */
  for (int q = 0; ok && q < ks->nout; q++)
    if (!ks->per_elem[ks->outs[q] - span.first])
      store_output(c, plan, ks, &io, q, rv(o), rv(node_val[ks->outs[q] - span.first]));
  if (ok) {
    gcc_jit_block_add_assignment_op(c->cur, NULL, o, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
    gcc_jit_block_end_with_jump(c->cur, NULL, rows);
  }
  gcc_jit_block_end_with_void_return(done, NULL);
  free(node_val);
  free(stash_ptr);
  free(want);
  free(avail);
  free(store_now);
  return ok;
}
