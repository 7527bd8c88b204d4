/* key.c — canonical serialization of a flushed trace and its XXH3-128. */
#include "key.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ptrmap.h"

static void put(tr_bytes *b, const void *p, size_t n) {
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 512;
    while (cap < b->len + n) cap *= 2;
    uint8_t *grown = realloc(b->data, cap);
    if (!grown) {
      b->failed = true;
      return;
    }
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void put_i64(tr_bytes *b, int64_t v) { put(b, &v, sizeof v); }
static void put_u8(tr_bytes *b, unsigned v) {
  uint8_t x = (uint8_t)v;
  put(b, &x, 1);
}

int tr_scalar_class(double v) {
  if (v == 0) return signbit(v) ? 3 : 1;
  return v == 1 ? 2 : 0;
}

/* dense (row-major contiguous), broadcast (a stride-0 dim), or strided */
static int layout_class(const vm_tensor *v) {
  if (vm_is_contiguous(v)) return 0;
  for (int d = 0; d < v->ndim; d++)
    if (v->strides[d] == 0 && v->shape[d] > 1) return 1;
  return 2;
}

static void put_shape(tr_bytes *b, int ndim, const int64_t *shape, bool with_shapes) {
  put_u8(b, (unsigned)ndim);
  if (with_shapes)
    for (int d = 0; d < ndim; d++) put_i64(b, shape[d]);
}

/* one node's fixed-size record: op, result and the attributes that change
   the code it runs (written in one piece: keys are built on every flush) */
typedef struct {
  uint8_t op, dtype, weak, ndim, nin, output, keepdim, attr_dtype;
  uint8_t attr_weak, host, device, perm[KILN_MAX_DIMS];
  uint32_t axes_mask;
  int32_t axis;
  int64_t start, stop, step;
  double literal; /* a full node's value when the library wrote it; a host
                     scalar's value is a parameter, never key (DESIGN §4) */
} node_record;

static void put_node(tr_bytes *b, const tr_trace *t, int i, bool with_shapes) {
  const tr_node *n = t->nodes[i];
  const vm_attr *a = &n->attr;
  node_record r;
  memset(&r, 0, sizeof r);
  r.op = (uint8_t)n->op;
  r.dtype = (uint8_t)n->meta.dtype;
  r.weak = n->meta.weak;
  r.ndim = (uint8_t)n->meta.ndim;
  r.nin = (uint8_t)n->nin;
  r.output = t->is_output[i];
  r.keepdim = a->keepdim;
  r.attr_dtype = (uint8_t)a->dtype;
  r.attr_weak = a->weak;
  r.host = a->host;
  r.device = n->meta.device;
  if ((n->op == VM_OP_full && !a->host) || vm_op_table[n->op].kind == VM_KIND_ATTENTION)
    r.literal = a->scalar[0]; /* attention: its scale */
  for (int d = 0; d < KILN_MAX_DIMS; d++) r.perm[d] = (uint8_t)a->perm[d];
  r.axes_mask = a->axes_mask;
  r.axis = a->axis;
  r.start = with_shapes ? a->start : 0;
  r.stop = with_shapes ? a->stop : 0;
  r.step = a->step;
  put(b, &r, sizeof r);
  if (with_shapes) put(b, n->meta.shape, (size_t)n->meta.ndim * sizeof(int64_t));
  int32_t refs[8];
  for (int k = 0; k < n->nin; k += 8) {
    int m = n->nin - k < 8 ? n->nin - k : 8;
    for (int q = 0; q < m; q++) refs[q] = t->refs[i][k + q];
    put(b, refs, (size_t)m * sizeof(int32_t));
  }
}

void tr_key_bytes(const tr_trace *t, bool with_shapes, tr_bytes *b) {
  memset(b, 0, sizeof *b);
  /* sized once (keys are built on every flush; growing by doubling copied
     a 100-op trace's bytes six times) */
  size_t need = 32 + (size_t)t->nleaves * (12 + KILN_MAX_DIMS * sizeof(int64_t) + sizeof(int64_t));
  for (int i = 0; i < t->n; i++)
    need += sizeof(node_record) + (size_t)t->nodes[i]->meta.ndim * sizeof(int64_t) +
            (size_t)t->nodes[i]->nin * sizeof(int32_t);
  if ((b->data = malloc(need))) b->cap = need;
  put_u8(b, 1); /* format version */
  put_u8(b, (unsigned)t->device + (t->mixed ? 16u : 0u));
  put_i64(b, t->nleaves);
  /* past a few leaves, their storages are looked up, not compared with
     every leaf before (quadratic: 20% of a 4096-node flush's key) */
  tr_ptrmap first = {0};
  bool mapped = t->nleaves > 16;
  for (int j = 0; j < t->nleaves; j++) {
    const vm_tensor *v = t->leaves[j]->value;
    put_u8(b, v->dtype);
    put_u8(b, v->storage->device);
    put_shape(b, v->ndim, v->shape, with_shapes);
    put_u8(b, (unsigned)layout_class(v));
    int alias = -1; /* the first leaf sharing this one's storage */
    if (mapped) {
      alias = tr_ptrmap_get(&first, v->storage);
      if (alias < 0 && !tr_ptrmap_put(&first, v->storage, j)) b->failed = true;
    } else {
      for (int k = 0; k < j && alias < 0; k++)
        if (t->leaves[k]->value->storage == v->storage) alias = k;
    }
    put_i64(b, alias);
  }
  tr_ptrmap_free(&first);
  put_i64(b, t->n);
  for (int i = 0; i < t->n; i++) put_node(b, t, i, with_shapes);
}

tr_key tr_key_hash(const tr_bytes *b) {
  XXH128_hash_t h = XXH3_128bits(b->data, b->len);
  return (tr_key){h.low64, h.high64};
}

void tr_bytes_free(tr_bytes *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}
