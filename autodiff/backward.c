/* backward.c — requires_grad bookkeeping, the backward traversal, and the
 * autodiff API.  Leaf variables are handles with a gradient slot; the node
 * a leaf names is a graph leaf (backward stops there).  Gradients are
 * pending ops; accumulating into a leaf's .grad is a store. */
#include <stdlib.h>
#include <string.h>

#include "../front/composite.h"
#include "../trace/tape.h"
#include "../vm/backend.h"
#include "../vm/state.h"
#include "ad.h"

static bool have(const vm_tensor *t, int index) {
  if (t) return true;
  vm_null_input(index);
  return false;
}

bool ad_requires_grad(const vm_tensor *t) { return t && tr_node_requires_grad(t->node); }

/* a fresh node holding t's current value (materialized), tracked or not */
static tr_node *fresh_leaf(vm_tensor *t, bool track) {
  vm_tensor *v = tr_value(t);
  return v ? tr_leaf_node(v, track) : NULL;
}

int ad_set_requires_grad(vm_tensor *t, bool on) {
  if (!have(t, 0)) return KILN_ERR_ARG;
  if (!vm_dtype_is_float(t->dtype))
    return vm_error(KILN_ERR_DTYPE, "only float tensors can require gradients, not %s",
                    vm_dtype_name(t->dtype));
  if (tr_node_requires_grad(t->node) && !t->slot)
    return vm_error(KILN_ERR_STATE,
                    "only leaf tensors can change requires_grad; this one is "
                    "computed from tensors that require grad (use kiln_detach)");
  if (on == (t->slot != NULL)) return KILN_OK;
  tr_node *n = fresh_leaf(t, on);
  if (!n) return vm_thread()->status;
  if (on) {
    if (!(t->slot = tr_slot_new())) {
      tr_node_release(n);
      return vm_error(KILN_ERR_OOM, "out of memory");
    }
    tr_node_set_slot(n, t->slot);
  } else {
    tr_slot_release(t->slot);
    t->slot = NULL;
  }
  tr_handle_set_node(t, n);
  return KILN_OK;
}

vm_tensor *ad_detach(vm_tensor *t) {
  if (!have(t, 0)) return NULL;
  if (!tr_node_requires_grad(t->node)) return tr_handle_of_node(t->node);
  if (tr_node_materialized(t->node)) {
    tr_node *n = fresh_leaf(t, false);
    vm_tensor *h = n ? tr_handle_of_node(n) : NULL;
    tr_node_release(n); /* the handle holds its own reference */
    return h;
  }
  vm_thread()->no_grad++;
  vm_tensor *r = fe_unary(VM_OP_copy, t);
  vm_thread()->no_grad--;
  return r;
}

/* --- the traversal ----------------------------------------------------------- */

/* the gradient of one slice of a node, not yet scattered back (see
   join_slices) */
typedef struct slice_piece {
  int axis;
  int64_t start, step;
  vm_tensor *g;
  bool joined; /* into the concat (join_slices) */
  struct slice_piece *next;
} slice_piece;

typedef struct {
  tr_node **nodes; /* tracked nodes reachable from the outputs */
  vm_tensor **grads;
  slice_piece **pieces; /* per node: gradients of its slices, joined when its turn comes */
  int n, cap;
  int done;        /* nodes whose gradients have gone to their inputs */
  tr_ptrmap index; /* node -> position in nodes (after sorting) */
  tr_tape_reads reads;
} tape;

/* the gradients the pass will still read (tape.h): those of nodes not yet
   stepped, every leaf's (accumulated at the end), every slice piece */
static void tape_each_read(void *ctx, void (*keep)(void *acc, vm_tensor *g), void *acc) {
  const tape *tp = ctx;
  for (int i = 0; i < tp->n; i++) {
    if (tp->grads[i] && (i >= tp->done || tr_node_slot(tp->nodes[i]))) keep(acc, tp->grads[i]);
    for (const slice_piece *p = tp->pieces[i]; p; p = p->next) keep(acc, p->g);
  }
}

static int tape_find(const tape *tp, const tr_node *x) { return tr_ptrmap_get(&tp->index, x); }

static bool tape_add(tape *tp, tr_node *x) {
  if (tp->n == tp->cap) {
    int cap = tp->cap ? 2 * tp->cap : 64;
    tr_node **nodes = realloc(tp->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return false;
    tp->nodes = nodes;
    vm_tensor **grads = realloc(tp->grads, (size_t)cap * sizeof *grads);
    if (!grads) return false;
    tp->grads = grads;
    slice_piece **pieces = realloc(tp->pieces, (size_t)cap * sizeof *pieces);
    if (!pieces) return false;
    tp->pieces = pieces;
    tp->cap = cap;
  }
  if (!tr_ptrmap_put(&tp->index, x, tp->n)) return false;
  tp->nodes[tp->n] = x;
  tp->pieces[tp->n] = NULL;
  tp->grads[tp->n++] = NULL;
  return true;
}

/* every tracked node reachable from root, stopping at leaf variables (an
   explicit stack: graphs can be far deeper than the C stack) */
static bool tape_collect(tape *tp, tr_node *root) {
  if (!tr_node_requires_grad(root) || tape_find(tp, root) >= 0) return true;
  if (!tape_add(tp, root)) return false;
  for (int next = tp->n - 1; next < tp->n; next++) {
    tr_node *x = tp->nodes[next];
    if (tr_node_slot(x)) continue; /* a leaf variable: the walk stops here */
    for (int k = 0; k < tr_node_nin(x); k++) {
      tr_node *in = tr_node_input(x, k);
      if (tr_node_requires_grad(in) && tape_find(tp, in) < 0 && !tape_add(tp, in)) return false;
    }
  }
  return true;
}

static int by_seq_desc(const void *a, const void *b) {
  const tr_node *x = *(tr_node *const *)a, *y = *(tr_node *const *)b;
  uint64_t sx = tr_node_seq(x), sy = tr_node_seq(y);
  return sx < sy ? 1 : sx > sy ? -1 : 0;
}

static bool accumulate(vm_tensor **slot, vm_tensor *g) {
  if (!*slot) {
    *slot = vm_retain(g);
    return true;
  }
  vm_tensor *sum = fe_binary(VM_OP_add, *slot, g);
  vm_release(*slot);
  *slot = sum;
  return sum != NULL;
}

/* --- slices' gradients -------------------------------------------------------
 *
 * The VJP of one slice is its gradient scattered into zeros of the sliced
 * tensor's shape.  A program that slices a tensor into many parts (the time
 * steps of an RNN's input, x[t]; the gates of a GRU or LSTM, h[:, g*H:(g+1)*H])
 * would then build one full-size tensor per part and add them all up:
 * quadratic in the number of parts (a 40-step GRU spent most of its
 * backward there).  So a slice's gradient is kept aside, and when the
 * sliced node's turn comes (every reader has run: the tape is in reverse
 * creation order), the kept pieces that are runs of consecutive positions
 * along one axis and do not overlap are joined by one concat, zeros filling
 * the gaps; any other piece takes the one-slice VJP.  The sum is the same
 * value: each position gets its one piece (or zero), with nothing but
 * exact additions of zero left out. */
static bool defer_slice(tape *tp, int j, const vm_attr *attr, vm_tensor *g) {
  slice_piece *p = malloc(sizeof *p);
  if (!p) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return false;
  }
  *p = (slice_piece){attr->axis, attr->start, attr->step, vm_retain(g), false, tp->pieces[j]};
  tp->pieces[j] = p;
  return true;
}

static int64_t piece_len(const slice_piece *p) { return p->g->shape[p->axis]; }

static bool contiguous_piece(const slice_piece *p) { return p->step == 1 || piece_len(p) == 1; }

static int by_start(const void *a, const void *b) {
  const slice_piece *x = *(slice_piece *const *)a, *y = *(slice_piece *const *)b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* zeros of x's shape with `len` positions along axis */
static vm_tensor *zeros_along(const vm_tensor *x, int axis, int64_t len) {
  vm_attr attr = {.dtype = x->dtype, .ndim = x->ndim, .device = x->device};
  memcpy(attr.shape, x->shape, sizeof attr.shape);
  attr.shape[axis] = len;
  return fe_op(VM_OP_full, 0, NULL, &attr);
}

/* one piece the usual way: its slice's VJP */
static bool piece_vjp(vm_tensor **slot, vm_tensor *x, const slice_piece *p) {
  vm_attr attr = {.axis = p->axis, .start = p->start, .step = p->step};
  attr.stop = p->start + p->step * piece_len(p);
  ad_ctx c = {VM_OP_slice, &attr, &x, NULL, p->g, NULL};
  vm_tensor *gx = NULL;
  bool ok = ad_vjp(&c, 0, &gx) && gx && accumulate(slot, gx);
  vm_release(gx);
  return ok;
}

/* joins node j's kept pieces into its gradient */
static bool join_slices(tape *tp, int j) {
  slice_piece *list = tp->pieces[j];
  tp->pieces[j] = NULL;
  if (!list) return true;
  vm_tensor *x = tr_handle_of_node(tp->nodes[j]);
  int n = 0;
  for (slice_piece *p = list; p; p = p->next) n++;
  slice_piece **all = malloc((size_t)n * sizeof *all), **run = malloc((size_t)n * sizeof *run);
  vm_tensor **parts = calloc((size_t)(2 * n + 1), sizeof *parts);
  bool ok = x && all && run && parts;
  if (!ok && x) vm_error(KILN_ERR_OOM, "out of memory");
  int nall = 0, nrun = 0, nparts = 0, axis = -1, best = 0;
  for (slice_piece *p = list; ok && p; p = p->next) all[nall++] = p; /* latest slice first */
  for (int a = 0; a < nall; a++) { /* the axis most runs lie along */
    int count = 0;
    for (int b = 0; b < nall; b++)
      count += contiguous_piece(all[b]) && all[b]->axis == all[a]->axis;
    if (contiguous_piece(all[a]) && count > best) best = count, axis = all[a]->axis;
  }
  for (int a = 0; a < nall; a++)
    if (contiguous_piece(all[a]) && all[a]->axis == axis) run[nrun++] = all[a];
  if (ok && nrun > 0) {
    qsort(run, (size_t)nrun, sizeof *run, by_start);
    int64_t at = 0;
    for (int r = 0; ok && r < nrun; r++) {
      slice_piece *p = run[r];
      if (p->start < at) continue; /* overlaps the one before: taken alone below */
      if (p->start > at) ok = (parts[nparts++] = zeros_along(x, axis, p->start - at)) != NULL;
      parts[nparts++] = vm_retain(p->g);
      at = p->start + piece_len(p);
      p->joined = true;
    }
    if (ok && at < x->shape[axis])
      ok = (parts[nparts++] = zeros_along(x, axis, x->shape[axis] - at)) != NULL;
    vm_tensor *whole =
        ok ? (nparts == 1 ? vm_retain(parts[0]) : fe_concat(nparts, parts, axis)) : NULL;
    ok = whole && accumulate(&tp->grads[j], whole);
    vm_release(whole);
  }
  /* the rest (strided, along another axis, overlapping): one by one, in the
     order the slices were taken */
  for (int a = nall - 1; ok && a >= 0; a--)
    if (!all[a]->joined) ok = piece_vjp(&tp->grads[j], x, all[a]);
  for (int k = 0; k < nparts; k++) vm_release(parts[k]);
  free(parts);
  free(run);
  free(all);
  vm_release(x);
  while (list) {
    slice_piece *next = list->next;
    vm_release(list->g);
    free(list);
    list = next;
  }
  return ok;
}

/* propagates one node's gradient to its inputs */
static bool step(tape *tp, int i) {
  tr_node *n = tp->nodes[i];
  int nin = tr_node_nin(n);
  vm_tensor *xs[8], **x = nin <= 8 ? xs : calloc((size_t)nin, sizeof *x);
  if (!x) return false;
  for (int k = 0; k < nin; k++) x[k] = tr_handle_of_node(tr_node_input(n, k));
  vm_tensor *y = tr_handle_of_node(n);
  vm_tensor *memo = NULL;
  ad_ctx c = {tr_node_op(n), tr_node_attr(n), x, y, tp->grads[i], &memo};
  bool ok = y != NULL;
  for (int k = 0; ok && k < nin; k++) {
    if (!x[k] || !tr_node_requires_grad(tr_node_input(n, k))) continue;
    int j = tape_find(tp, tr_node_input(n, k));
    if (c.op == VM_OP_slice && j >= 0) { /* joined with its siblings later */
      ok = defer_slice(tp, j, c.attr, c.g);
      continue;
    }
    vm_tensor *gk = NULL;
    ok = ad_vjp(&c, k, &gk);
    if (ok && gk && j >= 0) ok = accumulate(&tp->grads[j], gk);
    vm_release(gk);
  }
  for (int k = 0; k < nin; k++) vm_release(x[k]);
  vm_release(y);
  vm_release(memo);
  if (x != xs) free(x);
  return ok;
}

static vm_tensor *ones_like(const vm_tensor *t) {
  vm_attr attr = {.dtype = t->dtype, .ndim = t->ndim, .scalar = {1.0}, .device = t->device};
  memcpy(attr.shape, t->shape, sizeof attr.shape);
  return fe_op(VM_OP_full, 0, NULL, &attr);
}

/* the seed gradient of out: gout (checked, cast) or ones for one element */
static vm_tensor *seed(const vm_tensor *out, vm_tensor *gout) {
  char b1[VM_SHAPE_BUF], b2[VM_SHAPE_BUF];
  if (!gout) {
    if (out->numel != 1) {
      vm_error(KILN_ERR_SHAPE,
               "the output has shape %s; pass its gradient (only 1-element "
               "outputs get ones)",
               vm_shape_str(b1, out->ndim, out->shape));
      return NULL;
    }
    return ones_like(out);
  }
  if (gout->ndim != out->ndim ||
      memcmp(gout->shape, out->shape, (size_t)out->ndim * sizeof(int64_t))) {
    vm_error(KILN_ERR_SHAPE, "gradient shape %s does not match output shape %s",
             vm_shape_str(b1, gout->ndim, gout->shape), vm_shape_str(b2, out->ndim, out->shape));
    return NULL;
  }
  return gout->dtype == out->dtype ? vm_retain(gout) : fe_cast(gout, out->dtype);
}

/* runs the tape for outs; fills tp with every tracked node's gradient */
static int run(tape *tp, int nout, vm_tensor *const *outs, vm_tensor *const *gouts,
               bool create_graph) {
  for (int k = 0; k < nout; k++) {
    if (!have(outs[k], k)) return KILN_ERR_ARG;
    if (!tr_node_requires_grad(outs[k]->node))
      return vm_error(KILN_ERR_STATE,
                      "output %d does not require grad (no input it depends on "
                      "requires grad, or it was computed under no_grad)",
                      k);
    if (!tape_collect(tp, outs[k]->node)) return vm_error(KILN_ERR_OOM, "out of memory");
  }
  tp->reads = (tr_tape_reads){tape_each_read, tp, NULL};
  tr_tape_reads_push(&tp->reads); /* popped by tape_free */
  qsort(tp->nodes, (size_t)tp->n, sizeof *tp->nodes, by_seq_desc);
  for (int i = 0; i < tp->n; i++) /* positions after sorting */
    if (!tr_ptrmap_put(&tp->index, tp->nodes[i], i)) return vm_error(KILN_ERR_OOM, "out of memory");
  if (!create_graph) vm_thread()->no_grad++;
  bool ok = true;
  for (int k = 0; ok && k < nout; k++) {
    vm_tensor *g = seed(outs[k], gouts ? gouts[k] : NULL);
    ok = g && accumulate(&tp->grads[tape_find(tp, outs[k]->node)], g);
    vm_release(g);
  }
  for (int i = 0; ok && i < tp->n; i++) {
    ok = join_slices(tp, i); /* every reader of node i has run */
    if (ok && tp->grads[i] && !tr_node_slot(tp->nodes[i])) ok = step(tp, i);
    tp->done = i + 1;
  }
  if (!create_graph) vm_thread()->no_grad--;
  return ok ? KILN_OK : (vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL);
}

static void tape_free(tape *tp) {
  tr_tape_reads_pop(&tp->reads);
  for (int i = 0; i < tp->n; i++) {
    vm_release(tp->grads[i]);
    for (slice_piece *p = tp->pieces[i], *next; p; p = next) {
      next = p->next;
      vm_release(p->g);
      free(p);
    }
  }
  free(tp->pieces);
  free(tp->nodes);
  free(tp->grads);
  tr_ptrmap_free(&tp->index);
}

/* The slot's own handle on gradient g.  Never a handle someone else holds:
   accumulating later rebinds it (tr_store), and it rebound the caller's
   gradient tensor when g passed through unchanged (kiln_backward(w, g)
   twice left g doubled).  Never a node autodiff tracks either (a leaf's
   own node, for kiln_backward(w, w), or a gradient the caller computed
   from tensors that require grad): a tracked node keeps its inputs, and
   slot -> grad -> ... -> leaf node -> slot was a cycle nothing freed.  A
   copy made under no_grad is a node of its own that drops its input once
   the queued store evaluates it. */
static vm_tensor *grad_for_slot(vm_tensor *g) {
  if (!tr_node_requires_grad(g->node)) return tr_handle_of_node(g->node);
  vm_thread()->no_grad++;
  vm_tensor *copy = fe_unary(VM_OP_copy, g);
  vm_thread()->no_grad--;
  return copy;
}

int ad_backward(vm_tensor *loss, vm_tensor *grad) {
  vm_clear_error();
  tape tp = {0};
  int rc = run(&tp, 1, &loss, grad ? &grad : NULL, false);
  for (int i = 0; rc == KILN_OK && i < tp.n; i++) /* its saved values are spent */
    if (!tr_node_slot(tp.nodes[i])) tr_mark_grad_done(tp.nodes[i]);
  /* what leaves accumulate is data, not graph */
  vm_thread()->no_grad++;
  for (int i = 0; rc == KILN_OK && i < tp.n; i++) { /* accumulate into leaves: stores */
    tr_grad_slot *slot = tr_node_slot(tp.nodes[i]);
    if (!slot || !tp.grads[i]) continue;
    if (!slot->grad) {
      if (!(slot->grad = grad_for_slot(tp.grads[i]))) {
        rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_OOM;
        break;
      }
      tr_queue_store(slot->grad);
    } else {
      vm_tensor *sum = fe_binary(VM_OP_add, slot->grad, tp.grads[i]);
      if (!sum) {
        rc = vm_thread()->status;
        break;
      }
      tr_store(slot->grad, sum);
      vm_release(sum);
    }
  }
  vm_thread()->no_grad--;
  tape_free(&tp);
  return rc;
}

int ad_grad_of(int nout, vm_tensor *const *outs, vm_tensor *const *gouts, int nin,
               vm_tensor *const *ins, vm_tensor **grads, bool create_graph) {
  vm_clear_error();
  if (nout < 1 || nin < 1)
    return vm_error(KILN_ERR_ARG, "needs at least one output and one input (nout %d, nin %d)", nout,
                    nin);
  if (!outs || !ins || !grads)
    return vm_error(KILN_ERR_ARG, "the %s array is NULL",
                    !outs  ? "outputs"
                    : !ins ? "inputs"
                           : "gradients (results)");
  for (int i = 0; i < nin; i++) {
    grads[i] = NULL;
    if (!have(ins[i], i)) return KILN_ERR_ARG;
  }
  tape tp = {0};
  int rc = run(&tp, nout, outs, gouts, create_graph);
  for (int i = 0; rc == KILN_OK && i < nin; i++) {
    int j = tr_node_requires_grad(ins[i]->node) ? tape_find(&tp, ins[i]->node) : -1;
    vm_tensor *g = j >= 0 ? tp.grads[j] : NULL;
    grads[i] = g ? vm_retain(g) : NULL;
    if (!grads[i]) { /* the outputs do not depend on it: zeros */
      vm_attr attr = {.dtype = ins[i]->dtype, .ndim = ins[i]->ndim, .device = ins[i]->device};
      memcpy(attr.shape, ins[i]->shape, sizeof attr.shape);
      grads[i] = fe_op(VM_OP_full, 0, NULL, &attr);
      if (!grads[i]) rc = vm_thread()->status;
    }
  }
  if (rc != KILN_OK)
    for (int i = 0; i < nin; i++) {
      vm_release(grads[i]);
      grads[i] = NULL;
    }
  tape_free(&tp);
  return rc;
}

vm_tensor *ad_grad(vm_tensor *leaf) {
  if (!have(leaf, 0)) return NULL;
  if (!leaf->slot && tr_node_requires_grad(leaf->node)) {
    vm_error(KILN_ERR_STATE,
             "this tensor is not a leaf (it is computed from tensors that "
             "require grad), so no gradient accumulates in it; use kiln_grad_of for the "
             "gradient of an intermediate");
    return NULL;
  }
  if (!leaf->slot || !leaf->slot->grad) return NULL; /* none yet: no error */
  return tr_handle_of_node(leaf->slot->grad->node);
}

/* leaf's gradient becomes g's values (a handle of the slot's own, as a
   backward's first gradient is); NULL drops it.  What p.grad.mul!(c) in
   the Ruby binding (gradient clipping) writes back through: kiln_grad
   hands out values, so an in-place op on one changed nothing before. */
int ad_set_grad(vm_tensor *leaf, vm_tensor *g) {
  vm_clear_error();
  if (!have(leaf, 0)) return KILN_ERR_ARG;
  if (!g) return ad_zero_grad(leaf);
  if (!leaf->slot) {
    return vm_error(KILN_ERR_STATE,
                    tr_node_requires_grad(leaf->node)
                        ? "this tensor is not a leaf (it is computed from tensors that require "
                          "grad), so it holds no gradient"
                        : "this tensor does not require grad (kiln_set_requires_grad first)");
  }
  if (g->dtype != leaf->dtype)
    return vm_error(KILN_ERR_DTYPE, "the gradient is %s, the tensor %s", vm_dtype_name(g->dtype),
                    vm_dtype_name(leaf->dtype));
  if (g->device != leaf->device)
    return vm_error(KILN_ERR_DEVICE, "the gradient is on %s, the tensor on %s",
                    vm_device_name(g->device), vm_device_name(leaf->device));
  if (g->ndim != leaf->ndim || memcmp(g->shape, leaf->shape, (size_t)g->ndim * sizeof g->shape[0]))
    return vm_error(KILN_ERR_SHAPE, "the gradient's shape differs from the tensor's");
  vm_thread()->no_grad++;
  vm_tensor *h = grad_for_slot(g);
  vm_thread()->no_grad--;
  if (!h) return vm_thread()->status ? vm_thread()->status : KILN_ERR_OOM;
  if (leaf->slot->grad) {
    tr_unqueue_store(leaf->slot->grad);
    vm_release(leaf->slot->grad);
  }
  leaf->slot->grad = h;
  tr_queue_store(h);
  return KILN_OK;
}

int ad_zero_grad(vm_tensor *leaf) {
  if (!have(leaf, 0)) return KILN_ERR_ARG;
  if (leaf->slot) {
    /* a gradient no flush has stored yet need not be: handles the user
       took with kiln_grad still name its (pending) value */
    if (leaf->slot->grad) tr_unqueue_store(leaf->slot->grad);
    vm_release(leaf->slot->grad);
    leaf->slot->grad = NULL;
  }
  return KILN_OK;
}
