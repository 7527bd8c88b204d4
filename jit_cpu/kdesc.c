/* kdesc.c — a kernel's own description: its nodes renumbered relative to
 * the kernel, serialized for the kernel cache's key, and kept as a local
 * plan that the emitters of kernel.c run on (so what is compiled depends on
 * the key's bytes only).  Nothing here knows the plan around the kernel
 * once the description is built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kernel.h"

typedef struct {
  uint8_t *data;
  size_t len, cap;
  bool failed;
} bytes_buf;

static void put(bytes_buf *b, const void *p, size_t n) {
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 512;
    while (cap < b->len + n) cap *= 2;
    uint8_t *g = realloc(b->data, cap);
    if (!g) {
      b->failed = true;
      return;
    }
    b->data = g;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

/* the local ref of plan ref `ref` read by the kernel (first..last its nodes) */
static bool local_ref(const kernel_shape *ks, int first, int last, int ref, int *out) {
  if (ref >= first && ref <= last && ks->compute[ref - first]) {
    *out = ref - first;
    return true;
  }
  for (int q = 0; q < ks->nin; q++)
    if (ks->ins[q] == ref) {
      *out = -(q + 1);
      return true;
    }
  return false;
}

/* the local plan and shape of the kernel; false if it cannot be described */
static bool localize(kernel_desc *d, const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks) {
  int first = plan->groups[g].first, last = -1;
  for (int i = first; i <= ks->last_node; i++)
    if (ks->compute[i - first]) last = i;
  int n = last - first + 1;
  if (n <= 0 || n > KERNEL_MAX_NODES) return false;
  tr_pnode *nodes = calloc((size_t)n, sizeof *nodes);
  d->leaves = calloc((size_t)(ks->nin > 0 ? ks->nin : 1), sizeof *d->leaves);
  d->plan.nodes = nodes;
  if (!nodes || !d->leaves) return false;
  for (int k = 0; k < n; k++) {
    const tr_pnode *p = &plan->nodes[first + k];
    if (!ks->compute[k]) continue; /* not the kernel's: a blank */
    if (p->nin > 3) return false;
    nodes[k].op = p->op;
    nodes[k].meta.dtype = p->meta.dtype;
    nodes[k].nin = p->nin;
    for (int j = 0; j < p->nin; j++)
      if (!local_ref(ks, first, last, p->in[j], &nodes[k].in[j])) return false;
  }
  for (int q = 0; q < ks->nin; q++) {
    int r = ks->ins[q];
    d->leaves[q].meta.dtype = r >= 0 ? plan->nodes[r].meta.dtype : leaves[-1 - r].meta.dtype;
  }
  kernel_shape *lk = &d->ks;
  memset(lk, 0, sizeof *lk);
  lk->nin = ks->nin;
  lk->nout = ks->nout;
  lk->nparams = ks->nparams;
  for (int q = 0; q < ks->nin; q++) {
    lk->ins[q] = -(q + 1);
    lk->stride_class[q] = ks->stride_class[q];
  }
  for (int q = 0; q < ks->nout; q++) lk->outs[q] = ks->outs[q] - first;
  for (int s = 0; s < ks->nparams; s++) lk->params[s] = ks->params[s] - first;
  memcpy(lk->compute, ks->compute, (size_t)n * sizeof *lk->compute);
  memcpy(lk->per_elem, ks->per_elem, (size_t)n * sizeof *lk->per_elem);
  memcpy(lk->stash, ks->stash, (size_t)n * sizeof *lk->stash);
  lk->reduce = ks->reduce >= 0 ? ks->reduce - first : -1;
  lk->resume = (ks->resume < last + 1 ? ks->resume : last + 1) - first;
  lk->last_group = 0;
  lk->last_node = n - 1;
  lk->rowwise = ks->rowwise;
  lk->cols = ks->cols;
  lk->nstash = ks->nstash;
  d->group = (tr_group){.kind = plan->groups[g].kind, .first = 0, .last = n - 1};
  d->plan.n = n;
  d->plan.groups = &d->group;
  d->plan.ngroups = 1;
  return true;
}

/* the key bytes: everything of the local plan the emitters may read */
static void serialize(bytes_buf *b, const kernel_desc *d) {
  const kernel_shape *ks = &d->ks;
  int32_t head[10] = {d->plan.n, d->group.kind, ks->nin, ks->nout, ks->nparams, ks->reduce, ks->resume,
                      ks->rowwise, ks->cols, ks->nstash};
  put(b, head, sizeof head);
  for (int q = 0; q < ks->nin; q++) {
    int32_t in[2] = {d->leaves[q].meta.dtype, ks->stride_class[q]};
    put(b, in, sizeof in);
  }
  put(b, ks->outs, (size_t)ks->nout * sizeof(int));
  put(b, ks->params, (size_t)ks->nparams * sizeof(int));
  for (int k = 0; k < d->plan.n; k++) {
    const tr_pnode *p = &d->plan.nodes[k];
    int32_t node[9] = {ks->compute[k], ks->per_elem[k], ks->stash[k], p->op, p->meta.dtype, p->nin,
                       p->in[0], p->in[1], p->in[2]};
    put(b, node, sizeof node);
  }
}

kernel_desc *kernel_desc_new(const tr_plan *plan, int g, const cpu_leaf *leaves, const kernel_shape *ks,
                             const void *salt, size_t salt_len) {
  kernel_desc *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  bytes_buf b = {0};
  if (!localize(d, plan, g, leaves, ks)) goto fail;
  put(&b, salt, salt_len);
  serialize(&b, d);
  if (b.failed || !b.data) goto fail;
  d->bytes = b.data;
  d->len = b.len;
  XXH128_hash_t h = XXH3_128bits(b.data, b.len);
  d->key[0] = h.low64;
  d->key[1] = h.high64;
  snprintf(d->name, sizeof d->name, "kiln_%016llx%016llx", (unsigned long long)d->key[1],
           (unsigned long long)d->key[0]);
  return d;
fail:
  free(b.data);
  kernel_desc_free(d);
  return NULL;
}

bool kernel_desc_emit(cg_ctx *c, const kernel_desc *d) {
  const kernel_shape *ks = &d->ks;
  c->nlocals = c->nblocks = 0;
  return ks->rowwise      ? kernel_emit_rows(c, &d->plan, 0, d->leaves, ks, d->name)
         : ks->cols        ? kernel_emit_reduce_cols(c, &d->plan, 0, d->leaves, ks, d->name)
         : ks->reduce >= 0 ? kernel_emit_reduce(c, &d->plan, 0, d->leaves, ks, d->name)
                           : kernel_emit(c, &d->plan, 0, d->leaves, ks, d->name);
}

const char *kernel_desc_kind(const kernel_desc *d) {
  return d->ks.rowwise ? "row" : d->ks.cols ? "column-reduce" : d->ks.reduce >= 0 ? "reduce" : "elementwise";
}

void kernel_desc_free(kernel_desc *d) {
  if (!d) return;
  free(d->plan.nodes);
  free(d->leaves);
  free(d->bytes);
  free(d);
}
