/* kdesc.c — a kernel's own description: its nodes renumbered relative to
 * the kernel, serialized for the kernel cache's key, and kept as a local
 * plan that the emitters of kernel.c run on (so what is compiled depends on
 * the key's bytes only).  Nothing here knows the plan around the kernel
 * once the description is built. */
#include <stddef.h>
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

/* the local ref of plan ref `ref` read in `role` by the kernel (first..last
   its nodes) */
static bool local_ref(const kernel_shape *ks, int first, int last, int ref, uint8_t role,
                      bool outside, int *out) {
  if (!outside && ref >= first && ref <= last && ks->compute[ref - first]) {
    *out = ref - first;
    return true;
  }
  int q = kernel_input(ks, ref, role);
  *out = -(q + 1);
  return q >= 0;
}

/* the local plan and shape of the kernel; false if it cannot be described */
static bool localize(kernel_desc *d, const tr_plan *plan, const cpu_leaf *leaves,
                     const kernel_shape *ks) {
  int first = ks->first_node, last = -1;
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
      if (!local_ref(ks, first, last, p->in[j], kernel_arg_role(p, j), kernel_arg_outside(p, j),
                     &nodes[k].in[j]))
        return false;
  }
  for (int q = 0; q < ks->nin; q++) {
    int r = ks->ins[q];
    d->leaves[q].meta.dtype = r >= 0 ? plan->nodes[r].meta.dtype : leaves[-1 - r].meta.dtype;
  }
  kernel_shape *lk = &d->ks;
  kernel_shape_clear(lk, n);
  lk->nin = ks->nin;
  lk->nout = ks->nout;
  lk->nparams = ks->nparams;
  for (int q = 0; q < ks->nin; q++) {
    lk->ins[q] = -(q + 1);
    lk->stride_class[q] = ks->stride_class[q];
    lk->in_role[q] = ks->in_role[q];
    lk->in_axis[q] = -1; /* the runner's business: the code does not depend on it */
    lk->in_bound[q] = -1;
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
  d->group = (tr_group){.kind = ks->span_kind, .first = 0, .last = n - 1};
  d->plan.n = n;
  d->plan.groups = &d->group;
  d->plan.ngroups = 1;
  return true;
}

/* the key bytes: everything of the local plan the emitters may read */
static void serialize(bytes_buf *b, const kernel_desc *d) {
  const kernel_shape *ks = &d->ks;
  int32_t head[10] = {d->plan.n,  d->group.kind, ks->nin,     ks->nout, ks->nparams,
                      ks->reduce, ks->resume,    ks->rowwise, ks->cols, ks->nstash};
  put(b, head, sizeof head);
  for (int q = 0; q < ks->nin; q++) {
    int32_t in[3] = {d->leaves[q].meta.dtype, ks->stride_class[q], ks->in_role[q]};
    put(b, in, sizeof in);
  }
  put(b, ks->outs, (size_t)ks->nout * sizeof(int));
  put(b, ks->params, (size_t)ks->nparams * sizeof(int));
  for (int k = 0; k < d->plan.n; k++) {
    const tr_pnode *p = &d->plan.nodes[k];
    int32_t node[9] = {ks->compute[k], ks->per_elem[k], ks->stash[k], p->op,   p->meta.dtype,
                       p->nin,         p->in[0],        p->in[1],     p->in[2]};
    put(b, node, sizeof node);
  }
}

/* the key (XXH3-128 of the bytes) and the function's symbol from it */
static void name_it(kernel_desc *d) {
  XXH128_hash_t h = XXH3_128bits(d->bytes, d->len);
  d->key[0] = h.low64;
  d->key[1] = h.high64;
  snprintf(d->name, sizeof d->name, "kiln_%016llx%016llx", (unsigned long long)d->key[1],
           (unsigned long long)d->key[0]);
}

kernel_desc *kernel_desc_new(const tr_plan *plan, const cpu_leaf *leaves, const kernel_shape *ks,
                             const void *salt, size_t salt_len) {
  kernel_desc *d = malloc(sizeof *d);
  if (!d) return NULL;
  /* all but the shape, whose 15 KiB localize clears as far as it is used */
  memset(d, 0, offsetof(kernel_desc, ks));
  memset((char *)d + offsetof(kernel_desc, bytes), 0, sizeof *d - offsetof(kernel_desc, bytes));
  bytes_buf b = {0};
  if (!localize(d, plan, leaves, ks)) goto fail;
  put(&b, salt, salt_len);
  serialize(&b, d);
  if (b.failed || !b.data) goto fail;
  d->bytes = b.data;
  d->len = b.len;
  name_it(d);
  return d;
fail:
  free(b.data);
  kernel_desc_free(d);
  return NULL;
}

/* the bytes' fields in order (serialize writes them) */
typedef struct {
  const uint8_t *p, *end;
} bytes_reader;

static bool get_i32(bytes_reader *r, int32_t *out, size_t n) {
  if ((size_t)(r->end - r->p) < n * sizeof *out) return false;
  memcpy(out, r->p, n * sizeof *out);
  r->p += n * sizeof *out;
  return true;
}

static bool in_range(int32_t v, int32_t lo, int32_t hi) { return v >= lo && v <= hi; }

kernel_desc *kernel_desc_parse(const uint8_t *bytes, size_t len, size_t salt_len) {
  if (salt_len > len) return NULL;
  kernel_desc *d = calloc(1, sizeof *d);
  bytes_reader r = {bytes + salt_len, bytes + len};
  int32_t head[10];
  if (!d || !get_i32(&r, head, 10)) goto fail;
  int n = head[0];
  kernel_shape *ks = &d->ks;
  if (!in_range(n, 1, KERNEL_MAX_NODES) || !in_range(head[2], 0, KERNEL_MAX_IO) ||
      !in_range(head[3], 0, KERNEL_MAX_IO) || !in_range(head[4], 0, KERNEL_MAX_IO) ||
      !in_range(head[5], -1, n - 1) || !in_range(head[6], 0, n) ||
      !in_range(head[9], 0, KERNEL_MAX_STASH))
    goto fail;
  ks->nin = head[2];
  ks->nout = head[3];
  ks->nparams = head[4];
  ks->reduce = head[5];
  ks->resume = head[6];
  ks->rowwise = head[7] != 0;
  ks->cols = head[8] != 0;
  ks->nstash = head[9];
  ks->last_group = 0;
  ks->last_node = n - 1;
  d->leaves = calloc((size_t)(ks->nin > 0 ? ks->nin : 1), sizeof *d->leaves);
  tr_pnode *nodes = d->plan.nodes = calloc((size_t)n, sizeof *nodes);
  if (!d->leaves || !nodes) goto fail;
  for (int q = 0; q < ks->nin; q++) {
    int32_t in[3];
    if (!get_i32(&r, in, 3) || !in_range(in[0], 0, VM_NUM_DTYPES - 1) || !in_range(in[1], 0, 255) ||
        !in_range(in[2], KERNEL_IN_PLAIN, KERNEL_IN_ROLES - 1))
      goto fail;
    d->leaves[q].meta.dtype = (kiln_dtype)in[0];
    ks->ins[q] = -(q + 1);
    ks->stride_class[q] = (uint8_t)in[1];
    ks->in_role[q] = (uint8_t)in[2];
    ks->in_axis[q] = -1;
    ks->in_bound[q] = -1;
  }
  if (!get_i32(&r, ks->outs, (size_t)ks->nout) || !get_i32(&r, ks->params, (size_t)ks->nparams))
    goto fail;
  for (int q = 0; q < ks->nout; q++)
    if (!in_range(ks->outs[q], 0, n - 1)) goto fail;
  for (int s = 0; s < ks->nparams; s++)
    if (!in_range(ks->params[s], 0, n - 1)) goto fail;
  for (int k = 0; k < n; k++) {
    int32_t node[9];
    if (!get_i32(&r, node, 9) || !in_range(node[3], 0, VM_OP_COUNT - 1) ||
        !in_range(node[4], 0, VM_NUM_DTYPES - 1) || !in_range(node[5], 0, 3) ||
        !in_range(node[2], 0, KERNEL_MAX_STASH))
      goto fail;
    ks->compute[k] = node[0] != 0;
    ks->per_elem[k] = node[1] != 0;
    ks->stash[k] = (int8_t)node[2];
    nodes[k].op = (vm_opcode)node[3];
    nodes[k].meta.dtype = (kiln_dtype)node[4];
    nodes[k].nin = node[5];
    for (int j = 0; j < 3; j++) {
      /* a node's input: an earlier node of the kernel, or input -(q+1) */
      if (j < node[5] && !in_range(node[6 + j], -ks->nin, k - 1)) goto fail;
      nodes[k].in[j] = node[6 + j];
    }
  }
  if (r.p != r.end) goto fail;
  /* an op that moves data reads its inputs in their roles, in a flat
     kernel (the only ones whose runners pass the axes' strides; a
     coordinate, one at most, in a flat elementwise kernel only); an input
     in a role other than PLAIN is read by such ops only, in that role */
  int coords = 0;
  for (int q = 0; q < ks->nin; q++) coords += ks->in_role[q] == KERNEL_IN_COORD;
  if (coords > 1 || (coords && (ks->rowwise || ks->cols || ks->reduce >= 0))) goto fail;
  for (int k = 0; k < n; k++) {
    const tr_pnode *p = &nodes[k];
    bool moves = vm_op_gathers(p->op) || kernel_needs_coord(p->op) || vm_op_scans(p->op);
    for (int j = 0; j < p->nin; j++) {
      int q = -1 - p->in[j];
      uint8_t role = q >= 0 ? ks->in_role[q] : KERNEL_IN_PLAIN;
      if (moves ? role != kernel_arg_role(p, j) || (role != KERNEL_IN_PLAIN && q < 0)
                : role != KERNEL_IN_PLAIN)
        goto fail;
      if ((kernel_arg_outside(p, j) || vm_op_gathers(p->op) || vm_op_scans(p->op)) && q < 0)
        goto fail;
    }
    if (vm_op_gathers(p->op) && (p->nin != 2 || ks->rowwise || ks->cols)) goto fail;
    if (kernel_needs_coord(p->op) && (!coords || (p->op == VM_OP_scatter_add && p->nin != 3)))
      goto fail;
    if (vm_op_scans(p->op) &&
        (p->nin != 1 || p->meta.dtype != KILN_I64 || ks->rowwise || ks->cols || ks->reduce >= 0))
      goto fail;
  }
  d->group = (tr_group){.kind = head[1], .first = 0, .last = n - 1};
  d->plan.n = n;
  d->plan.groups = &d->group;
  d->plan.ngroups = 1;
  /* the description must be exactly what serialize writes for it */
  bytes_buf b = {0};
  put(&b, bytes, salt_len);
  serialize(&b, d);
  bool same = !b.failed && b.len == len && !memcmp(b.data, bytes, len);
  if (!same) {
    free(b.data);
    goto fail;
  }
  d->bytes = b.data;
  d->len = b.len;
  name_it(d);
  return d;
fail:
  kernel_desc_free(d);
  return NULL;
}

bool kernel_desc_emit(cg_ctx *c, const kernel_desc *d) {
  const kernel_shape *ks = &d->ks;
  c->nlocals = c->nblocks = 0;
  return ks->rowwise       ? kernel_emit_rows(c, &d->plan, 0, d->leaves, ks, d->name)
         : ks->cols        ? kernel_emit_reduce_cols(c, &d->plan, 0, d->leaves, ks, d->name)
         : ks->reduce >= 0 ? kernel_emit_reduce(c, &d->plan, 0, d->leaves, ks, d->name)
                           : kernel_emit(c, &d->plan, 0, d->leaves, ks, d->name);
}

const char *kernel_desc_kind(const kernel_desc *d) {
  return d->ks.rowwise       ? "row"
         : d->ks.cols        ? "column-reduce"
         : d->ks.reduce >= 0 ? "reduce"
                             : "elementwise";
}

void kernel_desc_free(kernel_desc *d) {
  if (!d) return;
  free(d->plan.nodes);
  free(d->leaves);
  free(d->bytes);
  free(d);
}
