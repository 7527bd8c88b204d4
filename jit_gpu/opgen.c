/* opgen.c — the GPU interpreter's planner (DESIGN §6): for one primitive on
 * device values, which kernels run (gpu_op_key: op, dtypes, layout class,
 * variant), with which gpu_args (extents and strides, coalesced as
 * vm/iter.c does), grid and scratch; the kernels' names; the list of every
 * key.  The CUDA C itself is opgen_src.c's.  Host code only: a device
 * address is an opaque number here (vm_data of a device value).
 *
 * gpu_args per family.  ptr[0] is the output, ptr[1..] the inputs in op
 * order; "contiguous" (key bit k) means operand k's element of row-major
 * index i is at i.
 *   elementwise (unary, cast, binary, where) and concat: shape/ndim the
 *     coalesced iteration, stride[k] operand k's (0 on broadcast dims), n
 *     the elements.  concat is one launch per nonempty input, each a
 *     strided copy into the output's slice (ptr[0] at the slice).
 *   full, arange: n elements, scalar = {value} / {start, step}.
 *   rand, randn: n Philox blocks, extent[0] the elements, seed, counter.
 *   sum, prod, max, min (vm/fold.h's orders): shape[0, axis) the kept dims
 *     (row-major over the output), shape[axis, ndim) the reduced ones,
 *     stride[1] the input's; extent[0] = reduced count.  LANE (trailing
 *     reductions): n items (output x chunk), extent[1] positions per item,
 *     extent[2] chunks per output, extent[3] warps per item; with more than
 *     one chunk ptr[0] is scratch (T partials) and LANE_JOIN (n outputs,
 *     extent[2] partials each) folds them in order.  COL (other patterns):
 *     a thread per output (extent[1] = count, extent[2] = 1), or COL_PART
 *     (n = outputs x blocks, extent[1] = VM_FOLD_BLOCK, extent[2] = blocks;
 *     A partials in scratch) and COL_JOIN.
 *   argmax, argmin: kept dims as above, the reduced axis is dim axis;
 *     extent[3] warps per output.
 *   matmul (integers only; floats go to cuBLAS): batch dims [0, ndim) with
 *     stride[1] (A), stride[2] (B); A's row/col strides at stride[1][6..7],
 *     B's at stride[2][6..7]; extent = {M, N, K}; n = numel(out).
 *   index_select, gather, scatter_add: launch 0 checks every index into
 *     the thread's gpu_index_check (opgen.h; n indices, stride[1],
 *     extent[0] = axis length, axis = the op's axis), launch 1 moves
 *     data: dims over the output with dim `axis` never merged; stride[1]
 *     a's, stride[2] the index's, stride[3] src's; extent[0] = a's axis
 *     length; scatter_add keeps the index's extents in
 *     stride[0] (the output is contiguous).
 *   argsort: rows over dims [0, axis), the sorted dim is axis (the last);
 *     stride[0] the output's, stride[1] the input's; n rows; flag =
 *     descending.
 *   attention, attention_grad: operands in fixed slots, 1 q, 2 k, 3 v,
 *     4 o, 5 dO, 6 the mask, 7 the backward's scratch (logsumexp and
 *     rowsum(dO ∘ O) per query row); batch dims [0, ndim) with each
 *     operand's strides in stride[k], its row and column strides at
 *     stride[k][6..7]; extent = {Tq, Tk, d, dv}; n = batch items;
 *     scalar[0] the scale; flag bit 0 causal, bits 1-2 the mask's kind
 *     (opgen.h GPU_ATT_*_MASK).  A launch's block is
 *     GPU_ATT_ROWS_PER_BLOCK rows (query rows; key rows for DKDV) of a
 *     group of (head bucket / 32) threads each, the grid every batch
 *     item's blocks of rows. */
#include "opgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/fold.h"
#include "../vm/kernels.h"
#include "../vm/rng.h"
#include "../vm/state.h"

#define BLOCK 256 /* threads per block, every kernel */
#define WARPS (BLOCK / 32)
#define MAX_GRID 8192  /* grid-stride loops cover the rest */
#define COL_SPLIT 4096 /* fewer column outputs than this go two-pass */

static const char *const dsfx[VM_NUM_DTYPES] = {"b8",   "i32", "i64", "f32", "f64",
                                                "bf16", "f16", "u8",  "i8",  "i16"};

/* --- names ------------------------------------------------------------------------- */

static const char *variant_name(const gpu_op_key *k) {
  static const char *const reduce[] = {"_lane", "_lanejoin", "_col", "_colpart", "_coljoin"};
  vm_kind kind = vm_op_table[k->op].kind;
  bool arg = k->op == VM_OP_argmax || k->op == VM_OP_argmin;
  if (kind == VM_KIND_REDUCE && !arg && k->variant <= GPU_RED_COL_JOIN) return reduce[k->variant];
  if (kind == VM_KIND_INDEX && k->variant == GPU_IDX_CHECK) return "_check";
  return k->variant ? "_v" : "";
}

void gpu_op_key_name(const gpu_op_key *k, char *buf, size_t cap) {
  if (k->op >= VM_OP_COUNT || !vm_dtype_valid(k->out_dtype)) {
    snprintf(buf, cap, "k_invalid_%u", (unsigned)k->op);
    return;
  }
  if (vm_op_table[k->op].kind == VM_KIND_ATTENTION) { /* k_attention_fwd_d64_f32 */
    static const char *const pass[] = {"fwd", "rows", "dq", "dkdv"};
    snprintf(buf, cap, "k_attention_%s_d%d%s_%s", pass[k->variant % GPU_ATT_WIDE],
             k->variant & GPU_ATT_WIDE ? GPU_ATT_MAX_HEAD : GPU_ATT_MAX_HEAD / 2,
             k->variant >= 2 * GPU_ATT_WIDE ? "_bad" : "", dsfx[k->out_dtype]);
    return;
  }
  size_t used = (size_t)snprintf(buf, cap, "k_%s%s", vm_op_table[k->op].name, variant_name(k));
  if (k->variant && !strcmp(variant_name(k), "_v") && used < cap)
    used += (size_t)snprintf(buf + used, cap - used, "%u", (unsigned)k->variant);
  if (used < cap) used += (size_t)snprintf(buf + used, cap - used, "_%s", dsfx[k->out_dtype]);
  for (int i = 0; i < k->nin && i < 3 && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "_%s",
                             vm_dtype_valid(k->in_dtype[i]) ? dsfx[k->in_dtype[i]] : "bad");
  if (used < cap) snprintf(buf + used, cap - used, "_c%u", (unsigned)k->contiguous);
}

static gpu_op_key make_key(vm_opcode op, int variant, kiln_dtype out, int nin, const kiln_dtype *in,
                           unsigned contiguous) {
  gpu_op_key k;
  memset(&k, 0, sizeof k);
  k.op = (uint16_t)op;
  k.variant = (uint8_t)variant;
  k.nin = (uint8_t)nin;
  k.out_dtype = (uint8_t)out;
  for (int i = 0; i < nin; i++) k.in_dtype[i] = (uint8_t)in[i];
  k.contiguous = (uint8_t)contiguous;
  return k;
}

/* --- geometry ---------------------------------------------------------------------- */

typedef struct {
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t stride[GPU_MAX_OPERANDS][KILN_MAX_DIMS];
} geom;

/* t's strides over shape[nd] (numpy broadcasting: 0 on missing and size-1 dims) */
static void broadcast_strides(const vm_tensor *t, int nd, int64_t *out) {
  int lead = nd - t->ndim;
  for (int d = 0; d < nd; d++) {
    int src = d - lead;
    out[d] = (src < 0 || t->shape[src] == 1) ? 0 : t->strides[src];
  }
}

/* vm/iter.c's coalescing: drops size-1 dims, merges a dim into the kept
   one before it when every operand steps through both as one.  Dim keep
   (-1: none) is neither dropped nor merged; its new index is returned.
   ext (or NULL): extents per dim that must equal the shape for a merge or
   a drop (scatter_add's index), coalesced alongside. */
static int coalesce(geom *g, int keep, int64_t *ext) {
  geom r;
  memset(&r, 0, sizeof r);
  int64_t rext[KILN_MAX_DIMS] = {0};
  int n = 0, kept = -1;
  for (int d = 0; d < g->ndim; d++) {
    bool is_keep = d == keep;
    if (!is_keep && g->shape[d] == 1 && (!ext || ext[d] == 1)) continue;
    if (n > 0 && !is_keep && n - 1 != kept) {
      bool merge = !ext || (ext[d] == g->shape[d] && rext[n - 1] == r.shape[n - 1]);
      for (int k = 0; k < GPU_MAX_OPERANDS && merge; k++)
        merge = vm_dims_merge(r.stride[k][n - 1], g->stride[k][d], g->shape[d]);
      if (merge) {
        r.shape[n - 1] *= g->shape[d];
        for (int k = 0; k < GPU_MAX_OPERANDS; k++) r.stride[k][n - 1] = g->stride[k][d];
        rext[n - 1] = r.shape[n - 1];
        continue;
      }
    }
    r.shape[n] = g->shape[d];
    for (int k = 0; k < GPU_MAX_OPERANDS; k++) r.stride[k][n] = g->stride[k][d];
    rext[n] = ext ? ext[d] : g->shape[d];
    if (is_keep) kept = n;
    n++;
  }
  if (n == 0) { /* a single element */
    r.shape[0] = rext[0] = 1;
    n = 1;
  }
  r.ndim = n;
  *g = r;
  if (ext) memcpy(ext, rext, sizeof rext);
  return kept;
}

/* bit k: operand k's element of row-major index i is at i */
static unsigned contiguous_mask(const geom *g, int nops) {
  unsigned mask = 0;
  for (int k = 0; k < nops; k++) {
    int64_t expect = 1;
    bool ok = true;
    for (int d = g->ndim - 1; d >= 0; d--) {
      if (g->shape[d] != 1 && g->stride[k][d] != expect) ok = false;
      expect *= g->shape[d];
    }
    if (ok) mask |= 1u << k;
  }
  return mask;
}

/* --- launches ---------------------------------------------------------------------- */

static uint32_t grid_for(int64_t work, int64_t per_block) {
  int64_t g = work <= 0 ? 1 : (work + per_block - 1) / per_block;
  return (uint32_t)(g > MAX_GRID ? MAX_GRID : g);
}

/* a new launch of key k (checked) with its args zeroed, or NULL + error */
static gpu_launch *plan_add(gpu_op_plan *p, const gpu_op_key *k) {
  if (!gpu_op_key_supported(k)) {
    char name[96];
    gpu_op_key_name(k, name, sizeof name);
    vm_error(KILN_ERR_INTERNAL, "no GPU kernel for %s (key %s)", vm_op_table[k->op].name, name);
    return NULL;
  }
  gpu_launch *l = realloc(p->launch, (size_t)(p->nlaunch + 1) * sizeof *l);
  if (!l) {
    vm_error(KILN_ERR_OOM, "out of memory planning a GPU launch");
    return NULL;
  }
  p->launch = l;
  l = &p->launch[p->nlaunch++];
  memset(l, 0, sizeof *l);
  l->key = *k;
  l->block[0] = BLOCK;
  l->block[1] = l->block[2] = 1;
  l->grid[0] = l->grid[1] = l->grid[2] = 1;
  return l;
}

static void set_geom(gpu_args *a, const geom *g) {
  a->ndim = g->ndim;
  memcpy(a->shape, g->shape, sizeof a->shape);
  memcpy(a->stride, g->stride, sizeof a->stride);
}

static void *scratch_at(size_t offset) { return (void *)(uintptr_t)offset; }

/* --- families ---------------------------------------------------------------------- */

static bool plan_elementwise(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                             gpu_op_plan *p) {
  geom g = {.ndim = out->ndim};
  memcpy(g.shape, out->shape, sizeof g.shape);
  broadcast_strides(out, out->ndim, g.stride[0]);
  kiln_dtype dts[3];
  for (int i = 0; i < n; i++) {
    broadcast_strides(in[i], out->ndim, g.stride[i + 1]);
    dts[i] = in[i]->dtype;
  }
  coalesce(&g, -1, NULL);
  if (op == VM_OP_cast && in[0]->dtype == out->dtype) op = VM_OP_copy;
  gpu_op_key k = make_key(op, 0, out->dtype, n, dts, contiguous_mask(&g, n + 1));
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  set_geom(&l->args, &g);
  l->args.ptr[0] = vm_data(out);
  for (int i = 0; i < n; i++) l->args.ptr[i + 1] = vm_data(in[i]);
  l->args.n = out->numel;
  l->grid[0] = grid_for(out->numel, BLOCK);
  return true;
}

static bool plan_leaf(vm_opcode op, vm_tensor *out, const vm_attr *attr, gpu_op_plan *p) {
  if (op == VM_OP_input) {
    vm_error(KILN_ERR_INTERNAL, "input is a materialized value: it never runs as a kernel");
    return false;
  }
  gpu_op_key k = make_key(op, 0, out->dtype, 0, NULL, 1);
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  gpu_args *a = &l->args;
  a->ptr[0] = vm_data(out);
  a->ndim = 1;
  a->shape[0] = out->numel;
  a->stride[0][0] = 1;
  a->n = out->numel;
  if (op == VM_OP_rand || op == VM_OP_randn) {
    a->n = (int64_t)vm_rng_blocks(out->numel, out->dtype);
    a->extent[0] = out->numel;
    a->seed = attr->seed;
    a->counter = attr->counter;
  } else {
    a->scalar[0] = attr->scalar[0];
    a->scalar[1] = attr->scalar[1];
  }
  l->grid[0] = grid_for(a->n, BLOCK);
  return true;
}

/* warps folding one item of `blocks` fold blocks (1 .. 8, a power of 2) */
static int warps_for(int64_t blocks) {
  int w = 1;
  while (w < WARPS && w < blocks) w *= 2;
  return w;
}

/* kept dims then reduced ones into a (stride[1]); the kept count is axis */
static void reduce_geom(gpu_args *a, const vm_dims *K, const vm_dims *R) {
  a->ndim = K->n + R->n;
  a->axis = K->n;
  for (int i = 0; i < K->n; i++) {
    a->shape[i] = K->size[i];
    a->stride[1][i] = K->stride[i];
  }
  for (int i = 0; i < R->n; i++) {
    a->shape[K->n + i] = R->size[i];
    a->stride[1][K->n + i] = R->stride[i];
  }
}

/* whether the input's element (output o, position p) is at o * count + p */
static bool reduce_contiguous(const gpu_args *a) {
  int64_t expect = 1;
  for (int d = a->ndim - 1; d >= 0; d--) {
    if (a->shape[d] != 1 && a->stride[1][d] != expect) return false;
    expect *= a->shape[d];
  }
  return true;
}

static bool plan_argreduce(vm_opcode op, const vm_tensor *in, vm_tensor *out, const vm_attr *attr,
                           gpu_op_plan *p) {
  vm_dims K = {0}, R = {.n = 1, .size = {1}, .stride = {0}};
  for (int d = 0; d < in->ndim; d++) {
    if (attr->axes_mask & (1u << d)) { /* the last reduced axis, as vm/kern_reduce.c */
      R.size[0] = in->shape[d];
      R.stride[0] = in->strides[d];
    } else {
      vm_dims_push(&K, in->shape[d], in->strides[d]);
    }
  }
  gpu_args tmp = {0};
  reduce_geom(&tmp, &K, &R);
  kiln_dtype t = in->dtype;
  gpu_op_key k = make_key(op, 0, KILN_I64, 1, &t, 1u | (reduce_contiguous(&tmp) ? 2u : 0u));
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  l->args = tmp;
  int64_t nout = vm_dims_count(&K), n = R.size[0];
  int w = nout >= 1024 ? 1 : warps_for((n + 31) / 32);
  l->args.ptr[0] = vm_data(out);
  l->args.ptr[1] = vm_data(in);
  l->args.n = nout;
  l->args.extent[0] = n;
  l->args.extent[3] = w;
  l->grid[0] = grid_for(nout, WARPS / w);
  return true;
}

/* --- reductions: the schedule (opgen.h), shared with the fused kernels ---------------- */

void gpu_reduce_schedule(vm_opcode op, kiln_dtype t, bool trailing, int64_t nout, int64_t count,
                         gpu_red_sched *s) {
  memset(s, 0, sizeof *s);
  s->join = -1;
  s->extent[0] = count;
  if (trailing) { /* the lane order, a warp group per (output, chunk) */
    int64_t chunk = count > VM_FOLD_CHUNK ? VM_FOLD_CHUNK : count > 0 ? count : 1;
    int64_t nchunks = count > VM_FOLD_CHUNK ? (count + VM_FOLD_CHUNK - 1) / VM_FOLD_CHUNK : 1;
    int w = warps_for((chunk + VM_FOLD_BLOCK - 1) / VM_FOLD_BLOCK);
    s->variant = GPU_RED_LANE;
    s->n = nout * nchunks;
    s->extent[1] = chunk;
    s->extent[2] = nchunks;
    s->extent[3] = w;
    s->grid = grid_for(s->n, WARPS / w);
    if (nchunks > 1) { /* T partials, joined in order (in double for floats) */
      s->join = GPU_RED_LANE_JOIN;
      s->part = t;
      s->nparts = nchunks;
    }
  } else { /* the column order: a thread per output, or with few outputs a
              thread per fold block and a join */
    bool two = nout < COL_SPLIT && count > VM_FOLD_BLOCK;
    int64_t nblk = (count + VM_FOLD_BLOCK - 1) / VM_FOLD_BLOCK;
    s->variant = two ? GPU_RED_COL_PART : GPU_RED_COL;
    s->n = two ? nout * nblk : nout;
    s->extent[1] = two ? VM_FOLD_BLOCK : count;
    s->extent[2] = two ? nblk : 1;
    if (two) { /* partials in the accumulator of vm/fold.h */
      s->join = GPU_RED_COL_JOIN;
      s->part = vm_fold_acc_dtype(op, t);
      s->nparts = nblk;
    }
    s->grid = grid_for(s->n, BLOCK);
  }
  s->join_grid = grid_for(nout, BLOCK);
}

bool gpu_reduce_trailing(int ndim, const int64_t *shape, uint32_t axes_mask) {
  bool seen_reduced =
      false; /* the logical pattern decides the order, as vm/kern_reduce.c float_reduce */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    if (axes_mask & (1u << d))
      seen_reduced = true;
    else if (seen_reduced)
      return false;
  }
  return true;
}

static bool plan_reduce(vm_opcode op, const vm_tensor *in, vm_tensor *out, const vm_attr *attr,
                        gpu_op_plan *p) {
  if (op == VM_OP_argmax || op == VM_OP_argmin) return plan_argreduce(op, in, out, attr, p);
  vm_dims K = {0}, R = {0};
  for (int d = 0; d < in->ndim; d++)
    vm_dims_push(attr->axes_mask & (1u << d) ? &R : &K, in->shape[d], in->strides[d]);
  gpu_args g = {0};
  reduce_geom(&g, &K, &R);
  int64_t nout = vm_dims_count(&K);
  gpu_red_sched s;
  gpu_reduce_schedule(op, in->dtype, gpu_reduce_trailing(in->ndim, in->shape, attr->axes_mask),
                      nout, vm_dims_count(&R), &s);
  kiln_dtype t = in->dtype;
  /* the lane order reads the input at o * count + p when it is contiguous */
  unsigned layout = s.variant == GPU_RED_LANE && reduce_contiguous(&g) ? 3u : 1u;
  gpu_op_key k = make_key(op, s.variant, t, 1, &t, layout);
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  l->args = g;
  l->args.ptr[0] = vm_data(out);
  l->args.ptr[1] = vm_data(in);
  l->args.n = s.n;
  memcpy(l->args.extent, s.extent, sizeof s.extent);
  l->grid[0] = s.grid;
  if (s.join < 0) return true;
  l->args.ptr[0] = scratch_at(0);
  l->scratch_mask = 1;
  p->scratch_bytes = (size_t)(s.n) * vm_dtype_size(s.part);
  k = make_key(op, s.join, t, 1, &t, 3);
  if (!(l = plan_add(p, &k))) return false;
  l->args.ptr[0] = vm_data(out);
  l->args.ptr[1] = scratch_at(0);
  l->scratch_mask = 2;
  l->args.n = nout;
  l->args.extent[2] = s.nparts;
  l->grid[0] = s.join_grid;
  return true;
}

/* integer matmul as numpy: batch broadcasting, 1-d operands as a row (left)
   or a column (right) */
static bool plan_matmul(vm_tensor *const *in, vm_tensor *out, gpu_op_plan *p) {
  const vm_tensor *at = in[0], *bt = in[1];
  if (vm_dtype_is_float(out->dtype)) {
    vm_error(KILN_ERR_INTERNAL,
             "float matmul runs on cuBLAS (jit_gpu/blas.c), not as a generated kernel");
    return false;
  }
  int nb = out->ndim - (at->ndim > 1) - (bt->ndim > 1);
  geom g = {.ndim = nb};
  memcpy(g.shape, out->shape, (size_t)nb * sizeof(int64_t));
  for (int d = 0; d < nb; d++) g.stride[0][d] = out->strides[d];
  const vm_tensor *ops[2] = {at, bt};
  for (int k = 0; k < 2; k++) {
    const vm_tensor *t = ops[k];
    int tb = t->ndim > 2 ? t->ndim - 2 : 0, lead = nb - tb;
    for (int d = 0; d < nb; d++) {
      int src = d - lead;
      g.stride[k + 1][d] = (src < 0 || t->shape[src] == 1) ? 0 : t->strides[src];
    }
  }
  coalesce(&g, -1, NULL); /* at most 6 batch dims remain: 2 of 8 are the matrices' */
  kiln_dtype dts[2] = {at->dtype, bt->dtype};
  gpu_op_key k = make_key(VM_OP_matmul, 0, out->dtype, 2, dts, 1);
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  gpu_args *a = &l->args;
  set_geom(a, &g);
  int an = at->ndim, bn = bt->ndim;
  int64_t M = an == 1 ? 1 : at->shape[an - 2], K = at->shape[an - 1];
  int64_t N = bn == 1 ? 1 : bt->shape[bn - 1];
  a->stride[1][6] = an == 1 ? 0 : at->strides[an - 2];
  a->stride[1][7] = at->strides[an - 1];
  a->stride[2][6] = bn == 1 ? bt->strides[0] : bt->strides[bn - 2];
  a->stride[2][7] = bn == 1 ? 0 : bt->strides[bn - 1];
  a->extent[0] = M;
  a->extent[1] = N;
  a->extent[2] = K;
  a->ptr[0] = vm_data(out);
  a->ptr[1] = vm_data(at);
  a->ptr[2] = vm_data(bt);
  a->n = out->numel;
  l->grid[0] = grid_for(out->numel, BLOCK);
  return true;
}

/* launch 0 of an index op: check every index into the thread's record */
static bool plan_index_check(const vm_tensor *idx, int64_t size, int axis, gpu_op_plan *p) {
  kiln_dtype i64 = KILN_I64;
  geom g = {.ndim = idx->ndim};
  memcpy(g.shape, idx->shape, sizeof g.shape);
  memcpy(g.stride[1], idx->strides, sizeof g.stride[1]);
  coalesce(&g, -1, NULL);
  gpu_op_key k = make_key(VM_OP_index_select, GPU_IDX_CHECK, KILN_I64, 1, &i64,
                          1u | (contiguous_mask(&g, 2) & 2u));
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  set_geom(&l->args, &g);
  l->args.ptr[0] = NULL; /* the runner's thread's record */
  l->args.ptr[1] = vm_data(idx);
  l->check_mask = 1;
  l->args.n = idx->numel;
  l->args.extent[0] = size;
  l->args.axis = axis;
  l->grid[0] = grid_for(idx->numel, BLOCK);
  return true;
}

bool gpu_op_plan_index_check(const vm_tensor *idx, int64_t size, int axis, gpu_op_plan *p) {
  memset(p, 0, sizeof *p);
  if (plan_index_check(idx, size, axis, p)) return true;
  gpu_op_plan_free(p);
  return false;
}

static bool plan_index(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                       const vm_attr *attr, gpu_op_plan *p) {
  const vm_tensor *a = in[0], *idx = in[1];
  int axis = attr->axis, nd = out->ndim;
  if (!plan_index_check(idx, a->shape[axis], axis, p)) return false;
  geom g = {.ndim = nd};
  memcpy(g.shape, out->shape, sizeof g.shape);
  memcpy(g.stride[0], out->strides, sizeof g.stride[0]);
  memcpy(g.stride[1], a->strides, sizeof g.stride[1]);
  int64_t ext[KILN_MAX_DIMS] = {0};
  if (op == VM_OP_index_select) {
    g.stride[2][axis] = idx->strides[0];
  } else {
    memcpy(g.stride[2], idx->strides, sizeof g.stride[2]);
  }
  if (op == VM_OP_scatter_add) {
    memcpy(g.stride[3], in[2]->strides, sizeof g.stride[3]);
    for (int d = 0; d < nd; d++)
      ext[d] = idx->numel ? idx->shape[d] : d == axis ? 0 : out->shape[d];
  }
  int kax = coalesce(&g, axis, op == VM_OP_scatter_add ? ext : NULL);
  if (op == VM_OP_scatter_add) memcpy(g.stride[0], ext, sizeof ext);
  kiln_dtype dts[3] = {a->dtype, idx->dtype, n > 2 ? in[2]->dtype : KILN_BOOL};
  gpu_op_key k = make_key(op, GPU_IDX_DATA, out->dtype, n, dts, 1);
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  set_geom(&l->args, &g);
  l->args.axis = kax;
  for (int i = 0; i < n; i++) l->args.ptr[i + 1] = vm_data(in[i]);
  l->args.ptr[0] = vm_data(out);
  l->args.n = out->numel;
  l->args.extent[0] = a->shape[axis];
  l->grid[0] = grid_for(out->numel, BLOCK);
  return true;
}

static bool plan_concat(int n, vm_tensor *const *in, vm_tensor *out, int axis, gpu_op_plan *p) {
  int64_t at = 0, es = (int64_t)vm_dtype_size(out->dtype);
  for (int i = 0; i < n; i++) {
    int64_t len = in[i]->shape[axis];
    if (len == 0) continue;
    geom g = {.ndim = out->ndim};
    memcpy(g.shape, out->shape, sizeof g.shape);
    g.shape[axis] = len;
    memcpy(g.stride[0], out->strides, sizeof g.stride[0]);
    memcpy(g.stride[1], in[i]->strides, sizeof g.stride[1]);
    coalesce(&g, -1, NULL);
    kiln_dtype dt = in[i]->dtype;
    gpu_op_key k = make_key(VM_OP_concat, 0, out->dtype, 1, &dt, contiguous_mask(&g, 2));
    gpu_launch *l = plan_add(p, &k);
    if (!l) return false;
    set_geom(&l->args, &g);
    l->args.ptr[0] = (char *)vm_data(out) + at * out->strides[axis] * es;
    l->args.ptr[1] = vm_data(in[i]);
    l->args.n = in[i]->numel;
    l->grid[0] = grid_for(in[i]->numel, BLOCK);
    at += len;
  }
  return true;
}

static bool plan_sort(const vm_tensor *in, vm_tensor *out, const vm_attr *attr, gpu_op_plan *p) {
  int axis = attr->axis, nd = in->ndim;
  geom g = {.ndim = nd};
  for (int d = 0, j = 0; d < nd; d++) { /* the sorted dim last */
    int dst = d == axis ? nd - 1 : j++;
    g.shape[dst] = in->shape[d];
    g.stride[0][dst] = out->strides[d];
    g.stride[1][dst] = in->strides[d];
  }
  int kax = coalesce(&g, nd - 1, NULL);
  bool same = true; /* the input laid out as the output */
  for (int d = 0; d < g.ndim; d++)
    same = same && (g.shape[d] == 1 || g.stride[0][d] == g.stride[1][d]);
  kiln_dtype dt = in->dtype;
  gpu_op_key k = make_key(VM_OP_argsort, 0, KILN_I64, 1, &dt, 1u | (same ? 2u : 0u));
  gpu_launch *l = plan_add(p, &k);
  if (!l) return false;
  set_geom(&l->args, &g);
  int64_t len = in->shape[axis];
  l->args.axis = kax;
  l->args.ptr[0] = vm_data(out);
  l->args.ptr[1] = vm_data((vm_tensor *)in);
  l->args.n = out->numel / len;
  l->args.flag = attr->keepdim;
  l->grid[0] = grid_for(l->args.n, 1);
  l->block[0] = len >= BLOCK ? BLOCK : (uint32_t)((len + 31) / 32 * 32);
  return true;
}

/* attention (one launch) or attention_grad (three): see the family's
   gpu_args above and opgen_src.c's kernels */
static bool plan_attention(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                           const vm_attr *attr, gpu_op_plan *p) {
  bool grad = op == VM_OP_attention_grad;
  int nfixed = grad ? 5 : 3, nb = in[0]->ndim - 2;
  const vm_tensor *q = in[0], *k = in[1], *v = in[2], *mask = n > nfixed ? in[nfixed] : NULL;
  int64_t tq = q->shape[nb], tk = k->shape[nb], d = q->shape[nb + 1], dv = v->shape[nb + 1];
  kiln_dtype t = out->dtype;
  if (d > GPU_ATT_MAX_HEAD || dv > GPU_ATT_MAX_HEAD) {
    vm_error(KILN_ERR_SHAPE, "attention on cuda takes head sizes up to %d, not %lld and %lld",
             GPU_ATT_MAX_HEAD, (long long)d, (long long)dv);
    return false;
  }
  geom g = {.ndim = nb};
  memcpy(g.shape, q->shape, (size_t)nb * sizeof(int64_t));
  const vm_tensor *slot[7] = {NULL, q, k, v, grad ? in[3] : NULL, grad ? in[4] : NULL, mask};
  for (int s = 1; s < 7; s++)
    if (slot[s]) memcpy(g.stride[s], slot[s]->strides, (size_t)nb * sizeof(int64_t));
  coalesce(&g, -1, NULL);
  int64_t nbatch = 1;
  for (int i = 0; i < nb; i++) nbatch *= q->shape[i];
  int kind = !mask                      ? GPU_ATT_NO_MASK
             : mask->dtype == KILN_BOOL ? GPU_ATT_BOOL_MASK
                                        : GPU_ATT_FLOAT_MASK;
  if (kind == GPU_ATT_FLOAT_MASK && mask->dtype != t) {
    vm_error(KILN_ERR_INTERNAL, "attention's float mask is %s, its operands %s",
             vm_dtype_name(mask->dtype), vm_dtype_name(t));
    return false;
  }
  int wide = d > GPU_ATT_MAX_HEAD / 2 || dv > GPU_ATT_MAX_HEAD / 2 ? GPU_ATT_WIDE : 0;
  kiln_dtype dts[3] = {t, t, t};
  static const int fwd[] = {GPU_ATT_FWD}, bwd[] = {GPU_ATT_ROWS, GPU_ATT_DQ, GPU_ATT_DKDV};
  const int *passes = grad ? bwd : fwd;
  for (int i = 0; i < (grad ? 3 : 1); i++) {
    int64_t rows = passes[i] == GPU_ATT_DKDV ? tk : tq;
    int64_t blocks = nbatch * ((rows + GPU_ATT_ROWS_PER_BLOCK - 1) / GPU_ATT_ROWS_PER_BLOCK);
    if (blocks == 0) continue; /* no rows: nothing to write (dq or dk, dv empty) */
    if (blocks > INT32_MAX) {
      vm_error(KILN_ERR_SHAPE,
               "attention over %lld batch items of %lld rows is too large for one launch",
               (long long)nbatch, (long long)rows);
      return false;
    }
    gpu_op_key key = make_key(op, passes[i] + wide, t, 3, dts, 1);
    gpu_launch *l = plan_add(p, &key);
    if (!l) return false;
    gpu_args *a = &l->args;
    set_geom(a, &g);
    a->ptr[0] = vm_data(out);
    for (int s = 1; s < 7; s++) {
      if (!slot[s]) continue;
      a->ptr[s] = vm_data((vm_tensor *)slot[s]);
      a->stride[s][6] = slot[s]->strides[nb];
      a->stride[s][7] = slot[s]->strides[nb + 1];
    }
    if (grad) {
      a->ptr[7] = scratch_at(0);
      l->scratch_mask = 1u << 7;
    }
    a->extent[0] = tq, a->extent[1] = tk, a->extent[2] = d, a->extent[3] = dv;
    a->n = nbatch;
    a->scalar[0] = attr->scalar[0];
    a->flag = (attr->keepdim ? 1 : 0) | kind << 1;
    l->grid[0] = (uint32_t)blocks;
    l->block[0] = GPU_ATT_ROWS_PER_BLOCK * (wide ? GPU_ATT_MAX_HEAD : GPU_ATT_MAX_HEAD / 2) / 32;
  }
  if (grad) { /* never 0 bytes: the scratch operand must point into it */
    size_t stats = (size_t)(nbatch * tq * 2) * vm_dtype_size(t);
    p->scratch_bytes = stats ? stats : vm_dtype_size(t);
  }
  return true;
}

bool gpu_op_plan_make(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                      const vm_attr *attr, gpu_op_plan *p) {
  static const vm_attr no_attr;
  memset(p, 0, sizeof *p);
  if (!attr) attr = &no_attr;
  if (op < 0 || op >= VM_OP_COUNT) {
    vm_error(KILN_ERR_INTERNAL, "invalid op %d", (int)op);
    return false;
  }
  const char *name = vm_op_table[op].name;
  if (vm_op_table[op].kind == VM_KIND_VIEW) {
    vm_error(KILN_ERR_INTERNAL, "%s is a view: it never runs as a kernel", name);
    return false;
  }
  if (!out || out->numel < 1 || !vm_is_contiguous(out)) {
    vm_error(KILN_ERR_INTERNAL, "%s: the GPU kernels write a contiguous, nonempty output", name);
    return false;
  }
  bool ok = false;
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      ok = plan_leaf(op, out, attr, p);
      break;
    case VM_KIND_UNARY:
      ok = n == 1 && plan_elementwise(op, 1, in, out, p);
      break;
    case VM_KIND_BINARY:
      ok = n == 2 && plan_elementwise(op, 2, in, out, p);
      break;
    case VM_KIND_TERNARY:
      ok = n == 3 && plan_elementwise(op, 3, in, out, p);
      break;
    case VM_KIND_REDUCE:
      ok = n == 1 && plan_reduce(op, in[0], out, attr, p);
      break;
    case VM_KIND_MATMUL:
      ok = n == 2 && plan_matmul(in, out, p);
      break;
    case VM_KIND_INDEX:
      ok = n == (op == VM_OP_scatter_add ? 3 : 2) && plan_index(op, n, in, out, attr, p);
      break;
    case VM_KIND_CONCAT:
      ok = n >= 1 && plan_concat(n, in, out, attr->axis, p);
      break;
    case VM_KIND_SORT:
      ok = n == 1 && plan_sort(in[0], out, attr, p);
      break;
    case VM_KIND_ATTENTION:
      ok = n >= (op == VM_OP_attention_grad ? 5 : 3) && plan_attention(op, n, in, out, attr, p);
      break;
    case VM_KIND_VIEW:
    case VM_KIND_COLLECTIVE: /* geometry; the distributed engine (vm/dist.h) */
    case VM_KIND_CONV:
      break; /* the CPU's primitive (GPU convolutions are composed) */
  }
  if (!ok) {
    if (vm_thread()->status == KILN_OK)
      vm_error(KILN_ERR_INTERNAL, "%s: %d inputs do not fit the op", name, n);
    gpu_op_plan_free(p);
  }
  return ok;
}

void gpu_op_plan_free(gpu_op_plan *p) {
  free(p->launch);
  memset(p, 0, sizeof *p);
}

/* --- every key ------------------------------------------------------------------------ */

typedef struct {
  gpu_op_key *keys;
  int cap, count;
} key_list;

static void add_key(key_list *L, gpu_op_key k) {
  if (!gpu_op_key_supported(&k)) return;
  if (L->count < L->cap) L->keys[L->count] = k;
  L->count++;
}

/* the layout classes the planner produces for each family */
static void add_elementwise(key_list *L, vm_opcode op, kiln_dtype out, int nin,
                            const kiln_dtype *in) {
  for (unsigned m = 0; m < (1u << nin); m++)
    add_key(L, make_key(op, 0, out, nin, in, 1u | (m << 1)));
}

static void add_family(key_list *L, vm_opcode op, kiln_dtype dt) {
  kiln_dtype i64 = KILN_I64, same[3] = {dt, dt, dt}, where[3] = {KILN_BOOL, dt, dt};
  kiln_dtype gather[3] = {dt, KILN_I64, dt};
  vm_dtype_rule rule = vm_op_table[op].rule;
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      add_key(L, make_key(op, 0, dt, 0, NULL, 1));
      break;
    case VM_KIND_UNARY:
      if (op == VM_OP_cast)
        for (int to = 0; to < VM_NUM_DTYPES; to++) add_elementwise(L, op, (kiln_dtype)to, 1, &dt);
      else
        add_elementwise(L, op, rule == VM_DT_LOGICAL ? KILN_BOOL : dt, 1, &dt);
      break;
    case VM_KIND_BINARY:
      add_elementwise(L, op, rule == VM_DT_COMPARE || rule == VM_DT_LOGICAL ? KILN_BOOL : dt, 2,
                      same);
      break;
    case VM_KIND_TERNARY:
      add_elementwise(L, op, dt, 3, where);
      break;
    case VM_KIND_REDUCE:
      if (op == VM_OP_argmax || op == VM_OP_argmin) {
        add_elementwise(L, op, KILN_I64, 1, &dt);
        break;
      }
      add_elementwise(L, op, dt, 1, &dt); /* LANE: input contiguous or not */
      add_key(L, make_key(op, GPU_RED_LANE_JOIN, dt, 1, &dt, 3));
      add_key(L, make_key(op, GPU_RED_COL, dt, 1, &dt, 1));
      add_key(L, make_key(op, GPU_RED_COL_PART, dt, 1, &dt, 1));
      add_key(L, make_key(op, GPU_RED_COL_JOIN, dt, 1, &dt, 3));
      break;
    case VM_KIND_MATMUL:
      add_key(L, make_key(op, 0, dt, 2, same, 1));
      break;
    case VM_KIND_INDEX:
      add_key(L, make_key(op, GPU_IDX_DATA, dt, op == VM_OP_scatter_add ? 3 : 2, gather, 1));
      if (op == VM_OP_index_select && dt == KILN_I64)
        for (unsigned m = 1; m <= 3; m += 2)
          add_key(L, make_key(op, GPU_IDX_CHECK, i64, 1, &i64, m));
      break;
    case VM_KIND_CONCAT:
      for (unsigned m = 0; m < 4; m++) add_key(L, make_key(op, 0, dt, 1, &dt, m));
      break;
    case VM_KIND_SORT:
      add_elementwise(L, op, KILN_I64, 1, &dt);
      break;
    case VM_KIND_ATTENTION: /* every pass and head bucket, over f32 and f64 */
      if (dt != KILN_F32 && dt != KILN_F64) break;
      for (int pass = 0; pass < GPU_ATT_WIDE; pass++)
        for (int wide = 0; wide <= GPU_ATT_WIDE; wide += GPU_ATT_WIDE)
          if ((pass == GPU_ATT_FWD) == (op == VM_OP_attention))
            add_key(L, make_key(op, pass + wide, dt, 3, same, 1));
      break;
    case VM_KIND_VIEW:
    case VM_KIND_COLLECTIVE:
    case VM_KIND_CONV:
      break;
  }
}

int gpu_op_keys(gpu_op_key *keys, int cap) {
  key_list L = {keys, keys ? cap : 0, 0};
  for (int op = 0; op < VM_OP_COUNT; op++)
    for (int dt = 0; dt < VM_NUM_DTYPES; dt++) add_family(&L, (vm_opcode)op, (kiln_dtype)dt);
  return L.count;
}

/* --- index errors -------------------------------------------------------------------- */

bool gpu_op_checks_indices(vm_opcode op) {
  return op >= 0 && op < VM_OP_COUNT && vm_op_table[op].kind == VM_KIND_INDEX;
}

bool gpu_op_plan_has_index_check(const gpu_op_plan *p) {
  for (int i = 0; i < p->nlaunch; i++)
    if (vm_op_table[p->launch[i].key.op].kind == VM_KIND_INDEX &&
        p->launch[i].key.variant == GPU_IDX_CHECK)
      return true;
  return false;
}

bool gpu_index_check_report(const gpu_index_check *rec) {
  if (!rec->sealed) return true;
  vm_error(KILN_ERR_ARG, "index %lld is out of range for axis %d of size %lld",
           (long long)rec->value, (int)rec->axis, (long long)rec->size);
  return false;
}
