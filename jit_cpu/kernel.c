/* kernel.c — builds the libgccjit function of one elementwise group (the
 * loop structure described in codegen.c) and its description for hashing.
 * Kernel ABI:
 *   void k(void **bufs, const int64_t *meta, const void *params,
 *          int64_t begin, int64_t end)
 *   bufs   = outputs (contiguous, the group's shape), then inputs
 *   meta   = nd, shape[nd], then per input strides[nd] (elements), all
 *            coalesced by the caller
 *   params = 8-byte slots holding each full node's value in its dtype
 *   [begin, end) = a range of flat indices of the iteration space */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

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

/* the group's inputs, outputs and params; false if it has a node the code
   generator does not handle */
bool kernel_plan(const tr_plan *plan, int g, const bool *escapes, const cpu_leaf *leaves,
                 kernel_shape *ks) {
  const tr_group *grp = &plan->groups[g];
  memset(ks, 0, sizeof *ks);
  ks->reduce = -1;
  if (grp->last - grp->first >= KERNEL_MAX_NODES) return false;
  if (grp->kind == TR_GROUP_REDUCE) { /* producers + the reduction; the epilogue stays interpreted */
    for (int i = grp->first; i <= grp->last && ks->reduce < 0; i++)
      if (vm_op_table[plan->nodes[i].op].kind == VM_KIND_REDUCE) ks->reduce = i;
    const tr_pnode *r = &plan->nodes[ks->reduce];
    int ref = r->in[0];
    const vm_meta *rin = ref >= 0 ? &plan->nodes[ref].meta : &leaves[-1 - ref].meta;
    int64_t rows, count;
    bool ok_op = r->op == VM_OP_sum || r->op == VM_OP_prod || r->op == VM_OP_max || r->op == VM_OP_min;
    if (!ok_op || rin->dtype == KILN_BOOL || !kernel_reduce_split(r, rin, &rows, &count)) return false;
    ks->resume = ks->reduce + 1;
  } else if (grp->kind != TR_GROUP_ELEMENTWISE) {
    return false;
  } else {
    ks->resume = grp->last + 1;
  }
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
      if (p->meta.ndim != rin->ndim || memcmp(p->meta.shape, rin->shape, (size_t)rin->ndim * sizeof(int64_t)))
        return false;
    }
    kiln_dtype in_dt[3];
    for (int k = 0; k < p->nin; k++) {
      int r = tr_pnode_input(p, k);
      in_dt[k] = r >= 0 ? plan->nodes[r].meta.dtype : leaves[-1 - r].meta.dtype;
      /* an input computed inside the group must be computed by the kernel */
      if (r >= grp->first && r <= grp->last && vm_op_table[plan->nodes[r].op].kind == VM_KIND_VIEW &&
          plan->nodes[r].nin > 0 && tr_pnode_input(&plan->nodes[r], 0) >= grp->first)
        return false;
      bool internal = r >= grp->first && r <= grp->last && ks->compute[r - grp->first];
      if (internal) continue;
      bool seen = false;
      for (int q = 0; q < ks->nin && !seen; q++) seen = ks->ins[q] == r;
      if (!seen) {
        if (ks->nin == KERNEL_MAX_IO) return false;
        ks->ins[ks->nin++] = r;
      }
    }
    if (i != ks->reduce && !cg_supported(p, in_dt)) return false;
    if (p->op == VM_OP_full) {
      if (ks->nparams == KERNEL_MAX_IO) return false;
      ks->params[ks->nparams++] = i;
    }
    bool out = escapes[i] || p->last_use > last_computed || i == ks->reduce;
    if (out) {
      if (ks->nout == KERNEL_MAX_IO) return false;
      ks->outs[ks->nout++] = i;
    }
  }
  if (ks->nout == 0) return false;
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
    bool dense = r < 0 ? leaves[-1 - r].contiguous
                       : vm_op_table[plan->nodes[r].op].kind != VM_KIND_VIEW;
    ks->stride_class[q] = (last == 1 && inner > 1) ? 0 : dense ? 1 : 2;
  }
  return true;
}

/* the typed pointers and per-input locals both kernel shapes use */
typedef struct {
  gcc_jit_lvalue *in_ptr[KERNEL_MAX_IO], *off[KERNEL_MAX_IO], *step[KERNEL_MAX_IO],
      *hoist[KERNEL_MAX_IO], *out_ptr[KERNEL_MAX_IO];
  kiln_dtype in_dt[KERNEL_MAX_IO];
} kernel_io;

/* in `entry`: out_ptr[q] = bufs[q], in_ptr[q] = bufs[nout + q], typed */
static void emit_io(cg_ctx *c, gcc_jit_block *entry, gcc_jit_rvalue *bufs, const tr_plan *plan,
                    const cpu_leaf *leaves, const kernel_shape *ks, kernel_io *io) {
  for (int q = 0; q < ks->nout; q++) {
    gcc_jit_type *pt = gcc_jit_type_get_pointer(cg_type(c, plan->nodes[ks->outs[q]].meta.dtype));
    io->out_ptr[q] = new_local(c, pt, "out", q);
    gcc_jit_block_add_assignment(entry, NULL, io->out_ptr[q],
        gcc_jit_context_new_cast(c->ctx, NULL, rv(gcc_jit_context_new_array_access(c->ctx, NULL, bufs, i64v(c, q))), pt));
  }
  for (int q = 0; q < ks->nin; q++) {
    int ref = ks->ins[q];
    io->in_dt[q] = ref >= 0 ? plan->nodes[ref].meta.dtype : leaves[-1 - ref].meta.dtype;
    /* not const: loads must have the plain type (a const bool is no condition) */
    gcc_jit_type *pt = gcc_jit_type_get_pointer(cg_type(c, io->in_dt[q]));
    io->in_ptr[q] = new_local(c, pt, "in", q);
    io->off[q] = new_local(c, c->t_i64, "off", q);
    io->step[q] = new_local(c, c->t_i64, "step", q);
    io->hoist[q] = new_local(c, cg_type(c, io->in_dt[q]), "x", q);
    gcc_jit_block_add_assignment(entry, NULL, io->in_ptr[q],
        gcc_jit_context_new_cast(c->ctx, NULL, rv(gcc_jit_context_new_array_access(c->ctx, NULL, bufs, i64v(c, ks->nout + q))), pt));
  }
}

/* the inputs' values at inner index j (unit stride, hoisted, or strided) */
static void emit_loads(cg_ctx *c, const kernel_shape *ks, const kernel_io *io, gcc_jit_rvalue *j,
                       gcc_jit_rvalue **in_val) {
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_rvalue *index = ks->stride_class[q] == 1 ? add64(c, rv(io->off[q]), j)
                                                     : add64(c, rv(io->off[q]), mul64(c, j, rv(io->step[q])));
    in_val[q] = ks->stride_class[q] == 0 ? rv(io->hoist[q])
                                         : rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->in_ptr[q]), index));
  }
}

/* evaluates the group's computed nodes up to (not including) `stop` into
   locals node_val[i - first]; a node's inputs are group locals or loads */
static bool emit_nodes(cg_ctx *c, const tr_plan *plan, const tr_group *grp, const kernel_shape *ks,
                       const kernel_io *io, gcc_jit_rvalue **in_val, gcc_jit_rvalue *params, int stop,
                       gcc_jit_lvalue **node_val) {
  for (int i = grp->first; i < stop; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (!ks->compute[i - grp->first]) continue;
    gcc_jit_rvalue *args[3];
    kiln_dtype adt[3];
    for (int k = 0; k < p->nin; k++) {
      int ref = tr_pnode_input(p, k);
      bool internal = ref >= grp->first && ref <= grp->last && ks->compute[ref - grp->first];
      if (internal) {
        args[k] = rv(node_val[ref - grp->first]);
        adt[k] = plan->nodes[ref].meta.dtype;
      } else {
        int q = 0;
        while (ks->ins[q] != ref) q++;
        args[k] = in_val[q];
        adt[k] = io->in_dt[q];
      }
    }
    gcc_jit_rvalue *value;
    if (p->op == VM_OP_full) { /* a runtime parameter: 8-byte slot `slot` */
      int slot = 0;
      while (ks->params[slot] != i) slot++;
      gcc_jit_type *pt = gcc_jit_type_get_pointer(gcc_jit_type_get_const(cg_type(c, p->meta.dtype)));
      long per = 8 / (long)vm_dtype_size(p->meta.dtype);
      value = rv(gcc_jit_context_new_array_access(c->ctx, NULL, gcc_jit_context_new_cast(c->ctx, NULL, params, pt),
                                                  i64v(c, slot * per)));
    } else {
      value = cg_node(c, p, adt, args);
    }
    if (!value) return false;
    node_val[i - grp->first] = new_local(c, cg_type(c, p->meta.dtype), "v", i);
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
bool kernel_emit(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                 const char *name) {
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
  kernel_io io;
  /* entry: typed pointers, nd, inner */
  c->cur = entry;
  gcc_jit_block_add_assignment(entry, NULL, nd, meta_at(c, meta, i64v(c, 0)));
  gcc_jit_block_add_assignment(entry, NULL, inner, meta_at(c, meta, rv(nd)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  gcc_jit_block_add_assignment(entry, NULL, flat, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, rows);
  /* rows: while (flat < end) */
  gcc_jit_block_end_with_conditional(rows, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(flat), gcc_jit_param_as_rvalue(prm[4])),
      row_body, done);
  /* row: row, j0, j1, offsets from the row's multi-index */
  c->cur = row_body;
  gcc_jit_block_add_assignment(row_body, NULL, row,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE, c->t_i64, rv(flat), rv(inner)));
  gcc_jit_block_add_assignment(row_body, NULL, j0,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(flat), mul64(c, rv(row), rv(inner))));
  gcc_jit_block_add_assignment(row_body, NULL, j1,
      add64(c, rv(j0), gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, gcc_jit_param_as_rvalue(prm[4]), rv(flat))));
  {
    gcc_jit_block *clip = new_block(c, "clip"), *after = new_block(c, "after");
    gcc_jit_block_end_with_conditional(row_body, NULL,
        gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GT, rv(j1), rv(inner)), clip, after);
    gcc_jit_block_add_assignment(clip, NULL, j1, rv(inner));
    gcc_jit_block_end_with_jump(clip, NULL, after);
    for (int q = 0; q < ks->nin; q++) gcc_jit_block_add_assignment(after, NULL, io.off[q], i64v(c, 0));
    gcc_jit_block_add_assignment(after, NULL, r, rv(row));
    gcc_jit_block_add_assignment(after, NULL, d,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(nd), i64v(c, 2)));
    gcc_jit_block_end_with_jump(after, NULL, dims);
  }
  gcc_jit_block_end_with_conditional(dims, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_GE, rv(d), i64v(c, 0)), dim_body, setup);
  {
    gcc_jit_rvalue *size = meta_at(c, meta, add64(c, rv(d), i64v(c, 1)));
    gcc_jit_block_add_assignment(dim_body, NULL, idx,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MODULO, c->t_i64, rv(r), size));
    gcc_jit_block_add_assignment(dim_body, NULL, r,
        gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE, c->t_i64, rv(r), size));
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
    gcc_jit_block_add_assignment(setup, NULL, io.step[q], meta_at(c, meta, add64(c, at, i64v(c, -1))));
    if (ks->stride_class[q] == 0)
      gcc_jit_block_add_assignment(setup, NULL, io.hoist[q],
          rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.in_ptr[q]), rv(io.off[q]))));
  }
  gcc_jit_block_add_assignment(setup, NULL, j, rv(j0));
  gcc_jit_block_end_with_jump(setup, NULL, inner_cond);
  gcc_jit_block_end_with_conditional(inner_cond, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(j), rv(j1)), inner_body, row_next);
  /* the inner body: loads, the group's nodes, stores */
  c->cur = inner_body;
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, &io, rv(j), in_val);
  gcc_jit_lvalue **node_val = calloc((size_t)(grp->last - grp->first + 1), sizeof *node_val);
  bool ok = node_val && emit_nodes(c, plan, grp, ks, &io, in_val, params, grp->last + 1, node_val);
  if (ok) {
    gcc_jit_rvalue *at = add64(c, mul64(c, rv(row), rv(inner)), rv(j));
    for (int q = 0; q < ks->nout; q++)
      gcc_jit_block_add_assignment(c->cur, NULL,
          gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.out_ptr[q]), at),
          rv(node_val[ks->outs[q] - grp->first]));
    gcc_jit_block_add_assignment_op(c->cur, NULL, j, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
    gcc_jit_block_end_with_jump(c->cur, NULL, inner_cond);
  }
  free(node_val);
  gcc_jit_block_add_assignment_op(row_next, NULL, flat, GCC_JIT_BINARY_OP_PLUS,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(j1), rv(j0)));
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
 * -fassociative-math).  f32 sums and products accumulate in f64.
 * meta = rows, count, chunk, nchunks, then per input (row stride, inner
 * stride); the caller checked both collapse to one stride. */

#define REDUCE_BLOCK 4096
#define REDUCE_LANE_BYTES 256 /* four 512-bit vectors of partial sums */

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

kiln_dtype kernel_reduce_acc_dtype(vm_opcode op, kiln_dtype out) {
  bool arith = op == VM_OP_sum || op == VM_OP_prod;
  return arith && out == KILN_F32 ? KILN_F64 : out;
}

static gcc_jit_rvalue *combine(cg_ctx *c, vm_opcode op, kiln_dtype dt, gcc_jit_rvalue *acc,
                               gcc_jit_rvalue *v) {
  gcc_jit_type *t = cg_type(c, dt);
  bool fl = vm_dtype_is_float(dt);
  switch (op) {
    case VM_OP_sum:
    case VM_OP_prod: {
      enum gcc_jit_binary_op bop = op == VM_OP_sum ? GCC_JIT_BINARY_OP_PLUS : GCC_JIT_BINARY_OP_MULT;
      if (fl) return gcc_jit_context_new_binary_op(c->ctx, NULL, bop, t, acc, v);
      gcc_jit_type *u = c->t_u64; /* integer sums/products wrap */
      return gcc_jit_context_new_cast(c->ctx, NULL,
          gcc_jit_context_new_binary_op(c->ctx, NULL, bop, u, gcc_jit_context_new_cast(c->ctx, NULL, acc, u),
                                        gcc_jit_context_new_cast(c->ctx, NULL, v, u)), t);
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
    if (vm_dtype_is_float(dt)) return gcc_jit_context_new_rvalue_from_double(c->ctx, t, mx ? -INFINITY : INFINITY);
    long lim = dt == KILN_I32 ? (mx ? INT32_MIN : INT32_MAX) : (mx ? INT64_MIN : INT64_MAX);
    return gcc_jit_context_new_rvalue_from_long(c->ctx, t, lim);
  }
  if (vm_dtype_is_float(dt)) return gcc_jit_context_new_rvalue_from_double(c->ctx, t, v);
  return gcc_jit_context_new_rvalue_from_long(c->ctx, t, (long)v);
}

static gcc_jit_rvalue *min64(cg_ctx *c, gcc_jit_block *b, gcc_jit_lvalue *tmp, gcc_jit_rvalue *x,
                             gcc_jit_rvalue *lim) {
  /* tmp = x < lim ? x : lim, as straight-line code in block b */
  gcc_jit_block_add_assignment(b, NULL, tmp, x);
  gcc_jit_rvalue *lt = gcc_jit_context_new_cast(c->ctx, NULL,
      gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(tmp), lim), c->t_i64);
  /* lim + (x - lim) * (x < lim) */
  gcc_jit_rvalue *diff = gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(tmp), lim);
  return add64(c, lim, mul64(c, diff, lt));
}

/* one reduced position r of the current chunk: the producers, the stores of
   producers read elsewhere, and the value the reduction folds (NULL on
   failure); row_at = o * count */
static gcc_jit_rvalue *emit_position(cg_ctx *c, const tr_plan *plan, const tr_group *grp, const kernel_shape *ks,
                                     const kernel_io *io, gcc_jit_rvalue *params, gcc_jit_rvalue *r,
                                     gcc_jit_rvalue *row_at, kiln_dtype acc_dt) {
  const tr_pnode *red = &plan->nodes[ks->reduce];
  gcc_jit_rvalue *in_val[KERNEL_MAX_IO];
  emit_loads(c, ks, io, r, in_val);
  gcc_jit_lvalue **node_val = calloc((size_t)(ks->reduce - grp->first + 1), sizeof *node_val);
  if (!node_val || !emit_nodes(c, plan, grp, ks, io, in_val, params, ks->reduce, node_val)) {
    free(node_val);
    return NULL;
  }
  int ref = red->in[0];
  bool internal = ref >= grp->first && ref <= grp->last && ks->compute[ref - grp->first];
  gcc_jit_rvalue *value;
  if (internal) {
    value = rv(node_val[ref - grp->first]);
  } else {
    int q = 0;
    while (ks->ins[q] != ref) q++;
    value = in_val[q];
  }
  gcc_jit_rvalue *at = add64(c, row_at, r);
  for (int q = 0; q < ks->nout; q++) /* producers read elsewhere */
    if (ks->outs[q] != ks->reduce)
      gcc_jit_block_add_assignment(c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(io->out_ptr[q]), at),
                                   rv(node_val[ks->outs[q] - grp->first]));
  free(node_val);
  return acc_dt == red->meta.dtype ? value : gcc_jit_context_new_cast(c->ctx, NULL, value, cg_type(c, acc_dt));
}

static gcc_jit_rvalue *lane(cg_ctx *c, gcc_jit_lvalue *lanes, gcc_jit_rvalue *l) {
  return rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), l));
}

static void cond_loop(gcc_jit_block *from, gcc_jit_rvalue *test, gcc_jit_block *body, gcc_jit_block *exit) {
  gcc_jit_block_end_with_conditional(from, NULL, test, body, exit);
}

bool kernel_emit_reduce(cg_ctx *c, const tr_plan *plan, int g, const cpu_leaf *leaves,
                        const kernel_shape *ks, const char *name) {
  const tr_group *grp = &plan->groups[g];
  const tr_pnode *red = &plan->nodes[ks->reduce];
  gcc_jit_param *prm[5];
  new_kernel_fn(c, name, prm);
  gcc_jit_rvalue *bufs = gcc_jit_param_as_rvalue(prm[0]), *meta = gcc_jit_param_as_rvalue(prm[1]);
  gcc_jit_rvalue *params = gcc_jit_param_as_rvalue(prm[2]);
  gcc_jit_block *entry = new_block(c, "entry"), *rows = new_block(c, "rows"), *row = new_block(c, "row"),
                *outer = new_block(c, "outer"), *blk_init = new_block(c, "blk"), *vcond = new_block(c, "vcond"),
                *vinit = new_block(c, "vinit"), *lcond = new_block(c, "lcond"), *lbody = new_block(c, "lbody"),
                *vnext = new_block(c, "vnext"), *tcond = new_block(c, "tcond"), *tbody = new_block(c, "tbody"),
                *blk_done = new_block(c, "blkdone"), *finish = new_block(c, "finish"), *done = new_block(c, "done");
  kiln_dtype out_dt = red->meta.dtype, acc_dt = kernel_reduce_acc_dtype(red->op, out_dt);
  long nlanes = REDUCE_LANE_BYTES / (long)vm_dtype_size(acc_dt);
  gcc_jit_type *acc_t = cg_type(c, acc_dt);
  gcc_jit_lvalue *count = new_local(c, c->t_i64, "count", 0), *chunk = new_local(c, c->t_i64, "chunk", 0),
                 *nchunks = new_local(c, c->t_i64, "nchunks", 0), *v = new_local(c, c->t_i64, "v", 0),
                 *o = new_local(c, c->t_i64, "o", 0), *r = new_local(c, c->t_i64, "r", 0),
                 *rlim = new_local(c, c->t_i64, "rlim", 0), *rend = new_local(c, c->t_i64, "rend", 0),
                 *row_at = new_local(c, c->t_i64, "rowat", 0), *l = new_local(c, c->t_i64, "l", 0),
                 *tmp = new_local(c, c->t_i64, "tmp", 0), *acc = new_local(c, acc_t, "acc", 0),
                 *lanes = new_local(c, gcc_jit_context_new_array_type(c->ctx, NULL, acc_t, (int)nlanes), "lanes", 0);
  kernel_io io; /* io.off holds each input's row base */
  gcc_jit_block_add_assignment(entry, NULL, count, meta_at(c, meta, i64v(c, 1)));
  gcc_jit_block_add_assignment(entry, NULL, chunk, meta_at(c, meta, i64v(c, 2)));
  gcc_jit_block_add_assignment(entry, NULL, nchunks, meta_at(c, meta, i64v(c, 3)));
  emit_io(c, entry, bufs, plan, leaves, ks, &io);
  for (int q = 0; q < ks->nin; q++)
    gcc_jit_block_add_assignment(entry, NULL, io.step[q], meta_at(c, meta, i64v(c, 5 + 2 * q)));
  gcc_jit_block_add_assignment(entry, NULL, v, gcc_jit_param_as_rvalue(prm[3]));
  gcc_jit_block_end_with_jump(entry, NULL, rows);
  cond_loop(rows, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(v), gcc_jit_param_as_rvalue(prm[4])),
            row, done);
  /* row: o, the chunk's positions, the inputs' row bases */
  gcc_jit_block_add_assignment(row, NULL, o,
      gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_DIVIDE, c->t_i64, rv(v), rv(nchunks)));
  gcc_jit_block_add_assignment(row, NULL, r,
      mul64(c, gcc_jit_context_new_binary_op(c->ctx, NULL, GCC_JIT_BINARY_OP_MINUS, c->t_i64, rv(v),
                                             mul64(c, rv(o), rv(nchunks))), rv(chunk)));
  gcc_jit_block_add_assignment(row, NULL, rlim, min64(c, row, tmp, add64(c, rv(r), rv(chunk)), rv(count)));
  gcc_jit_block_add_assignment(row, NULL, row_at, mul64(c, rv(o), rv(count)));
  gcc_jit_block_add_assignment(row, NULL, acc, identity(c, red->op, acc_dt));
  for (int q = 0; q < ks->nin; q++) {
    gcc_jit_block_add_assignment(row, NULL, io.off[q], mul64(c, rv(o), meta_at(c, meta, i64v(c, 4 + 2 * q))));
    if (ks->stride_class[q] == 0)
      gcc_jit_block_add_assignment(row, NULL, io.hoist[q],
          rv(gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.in_ptr[q]), rv(io.off[q]))));
  }
  gcc_jit_block_end_with_jump(row, NULL, outer);
  cond_loop(outer, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rv(rlim)),
            blk_init, finish);
  /* a block: lanes reset, its end */
  for (long k = 0; k < nlanes; k++)
    gcc_jit_block_add_assignment(blk_init, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, k)),
                                 identity(c, red->op, acc_dt));
  gcc_jit_block_add_assignment(blk_init, NULL, rend,
                               min64(c, blk_init, tmp, add64(c, rv(r), i64v(c, REDUCE_BLOCK)), rv(rlim)));
  gcc_jit_block_end_with_jump(blk_init, NULL, vcond);
  /* full steps of L positions: the vectorized lane loop */
  cond_loop(vcond, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LE,
                                                     add64(c, rv(r), i64v(c, nlanes)), rv(rend)),
            vinit, tcond);
  gcc_jit_block_add_assignment(vinit, NULL, l, i64v(c, 0));
  gcc_jit_block_end_with_jump(vinit, NULL, lcond);
  cond_loop(lcond, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(l), i64v(c, nlanes)),
            lbody, vnext);
  c->cur = lbody;
  gcc_jit_rvalue *val = emit_position(c, plan, grp, ks, &io, params, add64(c, rv(r), rv(l)), rv(row_at), acc_dt);
  if (!val) return false;
  gcc_jit_rvalue *next = combine(c, red->op, acc_dt, lane(c, lanes, rv(l)), val); /* may add blocks */
  gcc_jit_block_add_assignment(c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), rv(l)), next);
  gcc_jit_block_add_assignment_op(c->cur, NULL, l, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, lcond);
  gcc_jit_block_add_assignment_op(vnext, NULL, r, GCC_JIT_BINARY_OP_PLUS, i64v(c, nlanes));
  gcc_jit_block_end_with_jump(vnext, NULL, vcond);
  /* the block's tail, one position at a time into lane 0 */
  cond_loop(tcond, gcc_jit_context_new_comparison(c->ctx, NULL, GCC_JIT_COMPARISON_LT, rv(r), rv(rend)),
            tbody, blk_done);
  c->cur = tbody;
  val = emit_position(c, plan, grp, ks, &io, params, rv(r), rv(row_at), acc_dt);
  if (!val) return false;
  next = combine(c, red->op, acc_dt, lane(c, lanes, i64v(c, 0)), val);
  gcc_jit_block_add_assignment(c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, 0)), next);
  gcc_jit_block_add_assignment_op(c->cur, NULL, r, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(c->cur, NULL, tcond);
  /* block done: a tree fold of the lanes into acc */
  c->cur = blk_done;
  for (long w = nlanes / 2; w >= 1; w /= 2)
    for (long k = 0; k < w; k++) {
      gcc_jit_rvalue *folded = combine(c, red->op, acc_dt, lane(c, lanes, i64v(c, k)), lane(c, lanes, i64v(c, k + w)));
      gcc_jit_block_add_assignment(c->cur, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(lanes), i64v(c, k)),
                                   folded);
    }
  next = combine(c, red->op, acc_dt, rv(acc), lane(c, lanes, i64v(c, 0)));
  gcc_jit_block_add_assignment(c->cur, NULL, acc, next);
  gcc_jit_block_end_with_jump(c->cur, NULL, outer);
  /* the chunk's value */
  int qr = 0;
  while (ks->outs[qr] != ks->reduce) qr++;
  gcc_jit_block_add_assignment(finish, NULL, gcc_jit_context_new_array_access(c->ctx, NULL, rv(io.out_ptr[qr]), rv(v)),
                               gcc_jit_context_new_cast(c->ctx, NULL, rv(acc), cg_type(c, out_dt)));
  gcc_jit_block_add_assignment_op(finish, NULL, v, GCC_JIT_BINARY_OP_PLUS, i64v(c, 1));
  gcc_jit_block_end_with_jump(finish, NULL, rows);
  gcc_jit_block_end_with_void_return(done, NULL);
  return true;
}
