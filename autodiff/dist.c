/* dist.c — kiln_dist_average_grads (DESIGN §10): every parameter's gradient
 * replaced by its mean over the ranks of the MPI job, in buckets.
 *
 * Gradients are pending values of the step's trace, so averaging them is
 * recorded like any op: per bucket an all_reduce_start (packs the bucket's
 * gradients into one flat buffer and starts its non-blocking reduction) and
 * an all_reduce_wait, whose result is sliced back into gradients, divided
 * by the number of ranks and stored into the gradient slots.  The step and
 * its averaging are one trace, cached like any other.
 *
 * Overlap comes from the trace's order: starts are ordered effects, which a
 * flush visits first, in recording order; each start's depth-first visit
 * places just the backward work its bucket needs before it.  Buckets are
 * made from the last parameter to the first — the order backward produces
 * gradients — so the first bucket starts once the last layers' gradients
 * exist, and the rest of backward runs while it is on the wire.  Waits are
 * plain value dependencies, evaluated where the stores need them: at the
 * end.
 *
 * A bucket holds one dtype and at most 25 MiB and — so that a small model
 * still has something to overlap — at most a quarter of all the gradients'
 * bytes, but not less than 1 MiB; KILN_DIST_BUCKET_MB=N sets N MiB instead.  A
 * parameter without a gradient this step contributes zeros, so every rank
 * reduces the same buckets. */
#include "../vm/dist.h"

#include <stdlib.h>

#include "../front/composite.h"
#include "../trace/tape.h"
#include "../vm/backend.h"
#include "../vm/state.h"
#include "ad.h"

typedef struct {
  int first, count; /* order[first .. first+count) */
} bucket;

/* p's gradient (zeros if none) as it is all-reduced: a bf16/f16 gradient
   in f32 (DESIGN §13: summed over the ranks in f32, rounded once after) */
static vm_tensor *grad_or_zeros(vm_tensor *p) {
  vm_tensor *g = p->slot->grad ? vm_retain(p->slot->grad) : fe_zeros_like(p);
  if (!g || !vm_dtype_is_half(g->dtype)) return g;
  vm_tensor *w = fe_cast(g, KILN_F32);
  vm_release(g);
  return w;
}

static int check_params(int n, vm_tensor *const *params) {
  if (n < 0 || (n > 0 && !params))
    return vm_error(KILN_ERR_ARG, "n is %d and params is %s", n, params ? "set" : "NULL");
  for (int i = 0; i < n; i++) {
    if (!params[i]) return vm_error(KILN_ERR_ARG, "params[%d] is NULL", i);
    if (!params[i]->slot)
      return vm_error(KILN_ERR_ARG,
                      "params[%d] is not a leaf that requires grad (kiln_set_requires_grad)", i);
    if (params[i]->device != params[0]->device)
      return vm_error(KILN_ERR_DEVICE,
                      "params[0] is on %s and params[%d] on %s: average the "
                      "gradients of each device separately",
                      vm_device_name((kiln_device)params[0]->device), i,
                      vm_device_name((kiln_device)params[i]->device));
  }
  return KILN_OK;
}

static int64_t bucket_cap(int n, vm_tensor *const *params) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += params[i]->numel * (int64_t)vm_dtype_size(params[i]->dtype);
  long mb = vm_env_long("KILN_DIST_BUCKET_MB", 0);
  if (mb > 0) return (int64_t)mb << 20; /* the user's size, as it is */
  int64_t cap = (int64_t)25 << 20, quarter = total / 4;
  if (quarter < cap) cap = quarter > ((int64_t)1 << 20) ? quarter : (int64_t)1 << 20;
  return cap;
}

/* the parameters from last to first, cut into buckets */
static int make_buckets(int n, vm_tensor *const *params, int *order, bucket *b) {
  int64_t cap = bucket_cap(n, params), bytes = 0;
  int nb = 0;
  for (int j = 0; j < n; j++) {
    int i = n - 1 - j;
    order[j] = i;
    int64_t size = params[i]->numel * (int64_t)vm_dtype_size(params[i]->dtype);
    bool fits = nb > 0 &&
                vm_dtype_compute(params[order[b[nb - 1].first]]->dtype) ==
                    vm_dtype_compute(params[i]->dtype) &&
                bytes + size <= cap;
    if (!fits) {
      b[nb++] = (bucket){j, 0};
      bytes = 0;
    }
    b[nb - 1].count++;
    bytes += size;
  }
  return nb;
}

/* the bucket's reduced buffer back into its parameters' gradient slots */
static bool store_bucket(vm_tensor *flat, const bucket *bk, const int *order,
                         vm_tensor *const *params, int size) {
  int64_t at = 0;
  bool ok = true;
  for (int q = 0; q < bk->count && ok; q++) {
    vm_tensor *p = params[order[bk->first + q]];
    vm_tensor *piece = fe_slice(flat, 0, at, at + p->numel, 1);
    vm_tensor *shaped = piece ? fe_reshape(piece, p->ndim, p->shape) : NULL;
    vm_tensor *mean = shaped ? fe_binary_scalar(VM_OP_div, shaped, size, true) : NULL;
    if (mean && mean->dtype != p->dtype) { /* a half's mean, rounded once */
      vm_tensor *h = fe_cast(mean, p->dtype);
      vm_release(mean);
      mean = h;
    }
    at += p->numel;
    if ((ok = mean != NULL)) {
      if (p->slot->grad) {
        tr_store(p->slot->grad, mean);
      } else {
        p->slot->grad = vm_retain(mean);
        tr_queue_store(p->slot->grad);
      }
    }
    vm_release(piece);
    vm_release(shaped);
    vm_release(mean);
  }
  return ok;
}

int ad_average_grads(int n, vm_tensor *const *params) {
  int rc = check_params(n, params);
  if (rc != KILN_OK || !vm_dist_ready()) return rc != KILN_OK ? rc : vm_thread()->status;
  if (n == 0) return KILN_OK;
  int size = vm_dist_size();
  int *order = malloc((size_t)n * sizeof *order);
  bucket *b = malloc((size_t)n * sizeof *b);
  vm_tensor **started = calloc((size_t)n, sizeof *started);
  vm_tensor **grads = calloc((size_t)n, sizeof *grads);
  if (!order || !b || !started || !grads) {
    free(order);
    free(b);
    free(started);
    free(grads);
    return vm_error(KILN_ERR_OOM, "out of memory");
  }
  int nb = make_buckets(n, params, order, b);
  vm_thread()->no_grad++;
  bool ok = true;
  for (int k = 0; k < nb && ok; k++) { /* every start first: they are issued in this order */
    for (int q = 0; q < b[k].count && ok; q++)
      ok = (grads[b[k].first + q] = grad_or_zeros(params[order[b[k].first + q]])) != NULL;
    vm_attr attr = {.axis = VM_REDUCE_SUM, .counter = vm_dist_next_seq()};
    ok = ok && (started[k] = fe_op(VM_OP_all_reduce_start, b[k].count, grads + b[k].first, &attr));
  }
  for (int k = 0; k < nb && ok; k++) {
    vm_attr attr = {.axis = VM_REDUCE_SUM, .device = params[0]->device};
    vm_tensor *flat = fe_op(VM_OP_all_reduce_wait, 1, &started[k], &attr);
    ok = flat && store_bucket(flat, &b[k], order, params, size);
    vm_release(flat);
  }
  vm_thread()->no_grad--;
  for (int i = 0; i < n; i++) {
    vm_release(started[i]);
    vm_release(grads[i]);
  }
  free(order);
  free(b);
  free(started);
  free(grads);
  return ok ? KILN_OK : vm_thread()->status;
}
