/* iter.c — strided iteration for the eager kernels: broadcast every
 * operand to the output's shape, coalesce dimensions that are contiguous for
 * all operands, and walk a flat range row by row so the innermost loop is a
 * plain (often unit-stride) loop the compiler vectorizes. */
#include <string.h>

#include "kernels.h"
#include "pool.h"

void vm_iter_init(vm_iter *it, int nops, vm_tensor *const *ops) {
  const vm_tensor *out = ops[0];
  int nd = out->ndim;
  int64_t shape[KILN_MAX_DIMS], strides[4][KILN_MAX_DIMS];
  for (int d = 0; d < nd; d++) shape[d] = out->shape[d];
  for (int k = 0; k < nops; k++) {
    const vm_tensor *t = ops[k];
    int lead = nd - t->ndim;
    for (int d = 0; d < nd; d++) {
      int src = d - lead;
      strides[k][d] = (src < 0 || t->shape[src] == 1) ? 0 : t->strides[src];
    }
    it->base[k] = vm_data(t);
    it->esize[k] = (int)vm_dtype_size(t->dtype);
  }
  it->nops = nops;
  /* drop size-1 dims, then merge dim d into the following kept dim when
     every operand steps through them as one */
  int n = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    if (n > 0) {
      bool merge = true;
      for (int k = 0; k < nops && merge; k++)
        merge = vm_dims_merge(it->strides[k][n - 1], strides[k][d], shape[d]);
      if (merge) {
        it->shape[n - 1] *= shape[d];
        for (int k = 0; k < nops; k++) it->strides[k][n - 1] = strides[k][d];
        continue;
      }
    }
    it->shape[n] = shape[d];
    for (int k = 0; k < nops; k++) it->strides[k][n] = strides[k][d];
    n++;
  }
  if (n == 0) { /* a single element */
    it->shape[0] = 1;
    for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
    n = 1;
  }
  it->ndim = n;
}

void vm_iter_range(const vm_iter *it, int64_t begin, int64_t end, vm_row_fn row, void *ctx) {
  int nd = it->ndim, last = nd - 1;
  int64_t idx[KILN_MAX_DIMS];
  int64_t rem = begin;
  for (int d = last; d >= 0; d--) {
    idx[d] = rem % it->shape[d];
    rem /= it->shape[d];
  }
  char *ptr[4];
  int64_t inner[4];
  for (int k = 0; k < it->nops; k++) inner[k] = it->strides[k][last];
  int64_t pos = begin;
  while (pos < end) {
    for (int k = 0; k < it->nops; k++) {
      int64_t off = 0;
      for (int d = 0; d < nd; d++) off += idx[d] * it->strides[k][d];
      ptr[k] = it->base[k] + off * it->esize[k];
    }
    int64_t count = it->shape[last] - idx[last];
    if (count > end - pos) count = end - pos;
    row(ctx, ptr, inner, count);
    pos += count;
    idx[last] += count;
    for (int d = last; d > 0 && idx[d] == it->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

typedef struct {
  const vm_iter *it;
  vm_row_fn row;
  void *ctx;
} iter_job;

static void iter_chunk(void *p, int64_t begin, int64_t end) {
  iter_job *job = p;
  vm_iter_range(job->it, begin, end, job->row, job->ctx);
}

#define VM_ITER_GRAIN (1 << 15)

void vm_iter_run(const vm_iter *it, vm_row_fn row, void *ctx) {
  int64_t total = 1;
  for (int d = 0; d < it->ndim; d++) total *= it->shape[d];
  iter_job job = {it, row, ctx};
  vm_parallel_for(total, VM_ITER_GRAIN, iter_chunk, &job);
}
