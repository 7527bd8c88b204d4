/* record.c — recording ops into the calling thread's pending graph, the
 * flush triggers of DESIGN §3 (host reads, kiln_sync, a depth cap and a node
 * cap with deterministic cut points, memory pressure), and in-place stores. */
#include "record.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/backend.h"
#include "../vm/state.h"
#include "flush.h"
#include "graph.h"

/* Chains deeper than this are cut, at points that depend on the recorded
   program alone.  With loops rolled (trace/loop.h), a recurrent loop of a
   few hundred steps and its backward stay one trace (a GRU's backward is
   ~20 deep per step), whose steps run as one step trace whatever the
   length; the node cap still holds.  With KILN_LOOPS=0, deep enough that
   a backward pass (a transformer block's is ~130) is one trace.  The cap
   is never a function of what ran before: it was raised once a thread had
   rolled a loop, so the same training run gave other bits the first time
   in a process than the second (its flushes were cut elsewhere). */
#define TR_DEPTH_CAP 256
#define TR_DEPTH_CAP_ROLLING 4096
#define TR_NODE_CAP 4096
/* a pending graph's results on one device (as if each were kept: the
   bound of an op-by-op run) are flushed past an eighth of that device's
   memory, 1 GiB at least.  A fixed 1 GiB cut a 512 MiB-per-value
   elementwise chain on an H200 (141 GB) into four traces of four kernels
   where one fused kernel was the whole job (issue 43, G1) */
#define TR_PENDING_BYTES_MIN ((int64_t)1 << 30)
static _Atomic int64_t pending_cap[2]; /* 0: not asked yet */

/* asked only once a device holds that much pending (a device with values
   pending is started already) */
static int64_t device_pending_cap(int d) {
  int64_t cap = atomic_load_explicit(&pending_cap[d], memory_order_relaxed);
  if (cap) return cap;
  const vm_backend *b = vm_backend_of((kiln_device)d);
  size_t total = b && b->total_memory ? b->total_memory() : 0;
  cap = (int64_t)(total / 8) > TR_PENDING_BYTES_MIN ? (int64_t)(total / 8) : TR_PENDING_BYTES_MIN;
  atomic_store_explicit(&pending_cap[d], cap, memory_order_relaxed);
  return cap;
}

static bool pending_over_cap(const tr_graph *g) {
  for (int d = 0; d < 2; d++)
    if (g->pending_device_bytes[d] + g->dropped_device_bytes[d] >= TR_PENDING_BYTES_MIN &&
        g->pending_device_bytes[d] + g->dropped_device_bytes[d] >= device_pending_cap(d))
      return true;
  return false;
}

/* appends n to g's store queue (g locked); false when out of memory */
static bool queue_locked(tr_graph *g, tr_node *n) {
  if (g->nstores == g->cap_stores) {
    int cap = g->cap_stores ? 2 * g->cap_stores : 16;
    tr_node **grown = realloc(g->stores, (size_t)cap * sizeof *grown);
    if (!grown) return false;
    g->stores = grown;
    g->cap_stores = cap;
  }
  g->stores[g->nstores++] = tr_node_retain(n);
  return true;
}

/* a handle on n, taking the caller's reference; `fresh`: n was just made
   on this thread, no other handle or thread has it yet */
static vm_tensor *handle_make(tr_node *n, bool fresh) {
  vm_tensor *t = vm_block_alloc(VM_BLOCK_TENSOR, sizeof *t);
  if (!t) {
    vm_error(KILN_ERR_OOM, "out of memory for a tensor handle");
    tr_node_release(n);
    return NULL;
  }
  atomic_init(&t->refs, 1);
  t->dtype = n->meta.dtype;
  t->ndim = n->meta.ndim;
  t->weak = n->meta.weak;
  t->device = n->meta.device;
  memcpy(t->shape, n->meta.shape, sizeof t->shape);
  bool fits = vm_shape_numel(t->ndim, t->shape, &t->numel);
  assert(fits); /* n's shape was checked by vm_infer or is a value's */
  (void)fits;
  t->node = n; /* takes the caller's reference */
  if (fresh)
    atomic_store_explicit(&n->handles, 1, memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&n->handles, 1, memory_order_relaxed);
  return t;
}

static vm_tensor *handle_new(tr_node *n) { return handle_make(n, false); }

vm_tensor *tr_handle_from_value(vm_tensor *value) {
  tr_node *n = tr_node_from_value(value);
  if (!n) {
    vm_error(KILN_ERR_OOM, "out of memory for a trace node");
    return NULL;
  }
  return handle_new(n);
}

bool tr_weak_scalar(const vm_tensor *t, double *value, bool *host) {
  const tr_node *n = t->node;
  if (!t->weak || t->ndim != 0 || !n || n->op != VM_OP_full) return false;
  *value = n->attr.scalar[0];
  *host = n->attr.host;
  return true;
}

/* vm_release's half for handles: drops the handle's node reference */
static void tr_handle_free(vm_tensor *t) {
  atomic_fetch_sub_explicit(&t->node->handles, 1, memory_order_relaxed);
  tr_node_release(t->node);
  tr_slot_release(t->slot);
}

/* vm_release hands a handle's node back here (vm/ never calls up); set
   before main, as the binding registers the backends */
__attribute__((constructor)) static void register_handle_free(void) {
  vm_set_handle_free(tr_handle_free);
}

vm_tensor *tr_handle_of_node(tr_node *n) { return handle_new(tr_node_retain(n)); }

/* flushes the pending nodes of its own graph that x needs */
static bool materialize_node(tr_node *x, tr_flush_reason why) {
  if (x->state == TR_MATERIALIZED) return true;
  if (x->state == TR_FAILED) {
    vm_error_again(x->fail_status, x->fail_msg);
    return false;
  }
  tr_graph *g = tr_graph_retain(x->graph);
  tr_graph_lock(g);
  int rc = x->state == TR_MATERIALIZED ? KILN_OK : tr_flush(g, &x, 1, why);
  tr_graph_unlock(g);
  tr_graph_release(g);
  return rc == KILN_OK;
}

vm_tensor *tr_value(vm_tensor *t) {
  return materialize_node(t->node, TR_FLUSH_READ) ? t->node->value : NULL;
}

/* The length of the longest chain of unmaterialized nodes ending at n.
   Flushes materialize nodes after their consumers were recorded, so a
   stored depth is recomputed once per flush epoch (memoized), walking an
   explicit stack (g->walk): a rolled loop's graph is thousands deep. */
static bool depth_known(const tr_graph *g, const tr_node *n) {
  return n->state == TR_MATERIALIZED || n->state == TR_FAILED ||
         n->depth_epoch == g->flush_epoch + 1;
}

static int depth_of(const tr_node *n) {
  return n->state == TR_MATERIALIZED || n->state == TR_FAILED ? 0 : n->depth;
}

static int current_depth(tr_graph *g, tr_node *n) {
  if (depth_known(g, n)) return depth_of(n);
  int sp = 0;
  for (tr_node *x = n;;) {
    if (sp == g->walk_cap) {
      int cap = g->walk_cap ? 2 * g->walk_cap : 256;
      tr_node **grown = realloc(g->walk, (size_t)cap * sizeof *grown);
      if (!grown) return TR_DEPTH_CAP_ROLLING + 1; /* out of memory: cut here */
      g->walk = grown;
      g->walk_cap = cap;
    }
    g->walk[sp++] = x;
    /* the top's first input not known yet, else the top is known now */
    while (sp > 0) {
      tr_node *top = g->walk[sp - 1], *next = NULL;
      int d = 0;
      for (int k = 0; k < top->nin && !next; k++) {
        if (depth_known(g, top->in[k])) {
          int dk = depth_of(top->in[k]);
          d = dk > d ? dk : d;
        } else {
          next = top->in[k];
        }
      }
      if (next) {
        x = next;
        break;
      }
      top->depth = d + 1;
      top->depth_epoch = g->flush_epoch + 1;
      sp--;
    }
    if (sp == 0) return n->depth;
  }
}

typedef struct {
  tr_graph *g;
  tr_node **targets;
  int64_t n, cap;
} cut_targets;

/* appends x to c's targets (retained); out of memory, the cut keeps less */
static void keep_next(cut_targets *c, tr_node *x) {
  if (c->n == c->cap) {
    int64_t cap = 2 * c->cap + 16;
    tr_node **more = realloc(c->targets, (size_t)cap * sizeof *more);
    if (!more) return;
    c->targets = more;
    c->cap = cap;
  }
  c->targets[c->n++] = tr_node_retain(x);
}

/* a pending value read next is kept by the cut (those nothing pending reads
   yet are sinks, a flush of everything's targets already; fills are
   cheaper to compute again) */
static void keep_across_cut(void *acc, vm_tensor *t) {
  cut_targets *c = acc;
  tr_node *x = t ? t->node : NULL;
  if (x && x->graph == c->g && x->state == TR_PENDING && x->pending_uses > 0 && !tr_node_is_fill(x))
    keep_next(c, x);
}

/* flushes c's targets and lets them go */
static int flush_cut(cut_targets *c, tr_flush_reason why) {
  int rc = tr_flush(c->g, c->targets, (int)c->n, why);
  for (int64_t i = 0; i < c->n; i++) tr_node_release(c->targets[i]);
  free(c->targets);
  return rc;
}

/* the gradients the backward passes in progress will still read */
static void keep_tape_reads(cut_targets *c) {
  for (tr_tape_reads *r = c->g->tape_reads; r; r = r->outer) r->each(r->ctx, keep_across_cut, c);
}

/* everything pending that nothing pending reads (and, through them, all the
   rest): which intermediates users still hold does not matter.  A cap flush
   inside an op (why NODES or MEMORY) also keeps what is read next: that
   op's inputs (in, nin) and the gradients a backward pass in progress will
   still read (tape.h).  Left recomputable, each would be recomputed with
   the whole chain behind it by the next flush. */
static int flush_all(tr_graph *g, tr_flush_reason why, vm_tensor *const *in, int nin) {
  cut_targets c = {g, NULL, 0, g->pending + nin};
  c.targets = malloc((size_t)(c.cap ? c.cap : 1) * sizeof *c.targets);
  if (!c.targets) return KILN_OK; /* nothing flushed: the cap is met again at the next op */
  for (tr_node *p = g->head.next; p != &g->head; p = p->next) {
    long r = atomic_load(&p->refs);
    /* a node whose last reference is going away right now is not a target */
    while (r > 0 && !atomic_compare_exchange_weak(&p->refs, &r, r + 1)) {
    }
    if (r == 0) continue;
    if (p->pending_uses == 0)
      c.targets[c.n++] = p;
    else
      tr_node_release(p);
  }
  if (why == TR_FLUSH_NODES || why == TR_FLUSH_MEMORY) {
    for (int i = 0; i < nin; i++) keep_across_cut(&c, in[i]);
    keep_tape_reads(&c);
  }
  int rc = flush_cut(&c, why);
  g->dropped = 0; /* nothing recorded before is counted from here on */
  memset(g->dropped_device_bytes, 0, sizeof g->dropped_device_bytes);
  return rc;
}

/* A flush forced by a cap inside an op.  Where it failed, the failure stays
   with the values that failed, and reading one of them reports it; the op
   fails now only if it reads one (returns false, that error set).
   Otherwise the op goes on with the thread's error as it was: an op that
   returns a tensor never leaves an error set (a 4 TB fill that could not
   be allocated made kiln_add_scalar return a tensor with an OOM error). */
static bool cap_flush(tr_graph *g, tr_flush_reason why, int n, vm_tensor *const *in) {
  vm_thread_state *ts = vm_thread();
  kiln_status status = ts->status;
  char message[sizeof ts->message];
  memcpy(message, ts->message, sizeof message);
  int rc = flush_all(g, why, in, n);
  for (int i = 0; rc != KILN_OK && i < n; i++)
    if (in[i]->node->state == TR_FAILED) {
      vm_error_again(in[i]->node->fail_status, in[i]->node->fail_msg);
      return false;
    }
  ts->status = status;
  memcpy(ts->message, message, sizeof message);
  return true;
}

void tr_tape_reads_push(tr_tape_reads *r) {
  tr_graph *g = tr_thread_graph();
  if (!g) return; /* out of memory: the cuts keep less, nothing else changes */
  r->outer = g->tape_reads;
  g->tape_reads = r;
}

void tr_tape_reads_pop(tr_tape_reads *r) {
  tr_graph *g = tr_thread_graph();
  if (g && g->tape_reads == r) g->tape_reads = r->outer;
}

int tr_sync(void) {
  tr_graph *g = tr_thread_graph();
  if (!g) return vm_error(KILN_ERR_OOM, "out of memory");
  vm_clear_error();
  tr_graph_lock(g);
  flush_all(g, TR_FLUSH_SYNC, NULL, 0);
  tr_graph_unlock(g);
  return vm_thread()->status;
}

static size_t graph_pending_bytes(tr_graph *g) {
  tr_graph_lock(g);
  int64_t b = g->pending_bytes;
  tr_graph_unlock(g);
  return b > 0 ? (size_t)b : 0;
}

size_t tr_pending_bytes(vm_tensor *t) {
  if (!t) {
    tr_graph *g = tr_thread_graph();
    return g ? graph_pending_bytes(g) : 0;
  }
  tr_node *x = t->node;
  switch (x->state) {
    case TR_MATERIALIZED:
    case TR_FAILED:
      return 0;
    case TR_PENDING:
      break;
    case TR_RECOMPUTABLE:
      return SIZE_MAX;
  }
  /* the owner's whole pending list bounds what the flush computes */
  tr_graph *g = tr_graph_retain(x->graph);
  size_t b = graph_pending_bytes(g);
  tr_graph_release(g);
  return b;
}

int tr_eval(int n, vm_tensor *const *ts) {
  vm_clear_error();
  if (n < 0 || (n > 0 && !ts))
    return vm_error(KILN_ERR_ARG, "n is %d and ts is %s", n, ts ? "set" : "NULL");
  for (int i = 0; i < n; i++)
    if (!ts[i]) return vm_error(KILN_ERR_ARG, "tensor %d is NULL", i);
  tr_graph *g = tr_thread_graph();
  tr_node **mine = malloc((size_t)(n ? n : 1) * sizeof *mine);
  if (!g || !mine) {
    free(mine);
    return vm_error(KILN_ERR_OOM, "out of memory");
  }
  int nmine = 0, rc = KILN_OK;
  for (int i = 0; i < n && rc == KILN_OK; i++) {
    tr_node *x = ts[i]->node;
    if (x->state == TR_MATERIALIZED) continue;
    if (x->graph == g && x->state != TR_FAILED)
      mine[nmine++] = x;
    else if (!materialize_node(x, TR_FLUSH_EVAL))
      rc = vm_thread()->status;
  }
  if (rc == KILN_OK && nmine) {
    tr_graph_lock(g);
    rc = tr_flush(g, mine, nmine, TR_FLUSH_EVAL);
    tr_graph_unlock(g);
  }
  free(mine);
  return rc;
}

static bool grad_flows(int n, vm_tensor *const *in) {
  if (vm_thread()->no_grad) return false;
  for (int i = 0; i < n; i++)
    if (in[i]->node->requires_grad) return true;
  return false;
}

/* A result with no elements needs none of its inputs' values: unless a
   gradient must flow through it, it is recorded as an empty leaf, so no
   flush evaluates anything upstream for it (the empty result of
   x - mean(x) once made a flush compute 2^32 row means). */
static bool as_empty_leaf(vm_opcode op, int n, vm_tensor *const *in, const vm_meta *m,
                          vm_attr *attr, vm_meta *meta) {
  int64_t numel = 1;
  if (vm_op_table[op].kind == VM_KIND_LEAF || vm_op_table[op].kind == VM_KIND_COLLECTIVE ||
      !vm_shape_numel(m->ndim, m->shape, &numel) || numel != 0 || grad_flows(n, in))
    return false;
  *attr = (vm_attr){.dtype = m->dtype, .ndim = m->ndim};
  memcpy(attr->shape, m->shape, sizeof attr->shape);
  *meta = *m;
  meta->compute = m->dtype;
  return true;
}

/* Node sequence numbers order autodiff's walk (autodiff/backward.c): a
   node's number exceeds its inputs', and on one thread numbers grow in
   recording order.  Each thread takes blocks of numbers from a shared
   counter (one atomic per block, not per op); an input numbered past this
   thread's block (recorded on another thread since) starts a new block,
   which lies past every number handed out. */
#define SEQ_BLOCK 1024
static atomic_uint_fast64_t seq_blocks;
static __thread uint64_t seq_next, seq_end;

static uint64_t next_seq(int n, vm_tensor *const *in) {
  uint64_t newest = 0;
  for (int i = 0; i < n; i++)
    if (in[i]->node->seq > newest) newest = in[i]->node->seq;
  if (seq_next == seq_end || newest >= seq_next) {
    seq_next = atomic_fetch_add_explicit(&seq_blocks, SEQ_BLOCK, memory_order_relaxed) + 1;
    seq_end = seq_next + SEQ_BLOCK;
  }
  return seq_next++;
}

vm_tensor *tr_record(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                     const vm_meta *m) {
  vm_attr empty_attr;
  vm_meta empty_meta;
  if (as_empty_leaf(op, n, in, m, &empty_attr, &empty_meta)) {
    op = VM_OP_full;
    n = 0;
    attr = &empty_attr;
    m = &empty_meta;
  }
  tr_graph *g = tr_thread_graph();
  if (!g) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  vm_thread_state *ts = vm_thread();
  if (++ts->ops_unposted >= VM_OPS_POST) vm_post_ops();
  /* an unmaterialized input recorded by another thread is evaluated there
     first: a pending graph never reaches into another thread's */
  for (int i = 0; i < n; i++) {
    tr_node *x = in[i]->node;
    if (x->state != TR_MATERIALIZED && x->graph != g && !materialize_node(x, TR_FLUSH_READ))
      return NULL;
  }
  tr_graph_lock(g);
  if ((g->pending + g->dropped >= TR_NODE_CAP && !cap_flush(g, TR_FLUSH_NODES, n, in)) ||
      (pending_over_cap(g) && !cap_flush(g, TR_FLUSH_MEMORY, n, in))) {
    tr_graph_unlock(g);
    return NULL;
  }
  int depth = 0;
  for (int i = 0; i < n; i++) {
    int d = in[i]->node->graph == g ? current_depth(g, in[i]->node) : 0;
    if (d > depth) depth = d;
  }
  if (depth + 1 > TR_DEPTH_CAP &&
      (depth + 1 > TR_DEPTH_CAP_ROLLING || !tr_rolling_enabled())) { /* cut: the inputs
                                                                         become outputs */
    cut_targets c = {g, NULL, 0, 0};
    for (int i = 0; i < n; i++)
      if (in[i]->node->state != TR_MATERIALIZED) keep_next(&c, in[i]->node);
    keep_tape_reads(&c);
    if (flush_cut(&c, TR_FLUSH_DEPTH) != KILN_OK) {
      tr_graph_unlock(g);
      return NULL;
    }
    depth = 0;
    for (int i = 0; i < n; i++) {
      int d = in[i]->node->graph == g ? current_depth(g, in[i]->node) : 0;
      if (d > depth) depth = d;
    }
  }
  tr_node *node = vm_block_alloc(VM_BLOCK_NODE, sizeof *node);
  tr_node **ins = n <= 3 ? NULL : malloc((size_t)n * sizeof *ins);
  if (!node || (n > 3 && !ins)) {
    tr_graph_unlock(g);
    vm_block_free(VM_BLOCK_NODE, node);
    free(ins);
    vm_error(KILN_ERR_OOM, "out of memory for a trace node");
    return NULL;
  }
  atomic_init(&node->refs, 1);
  node->seq = next_seq(n, in);
  if (ts->no_grad == 0)
    for (int i = 0; i < n; i++) node->requires_grad |= in[i]->node->requires_grad;
  node->op = op;
  node->attr = *attr;
  node->attr.api = ts->api;
  node->meta = *m;
  node->nin = n;
  node->in = ins ? ins : node->in_small;
  for (int i = 0; i < n; i++) node->in[i] = tr_node_retain(in[i]->node);
  node->depth = depth + 1;
  node->depth_epoch = g->flush_epoch + 1;
  node->state = TR_PENDING;
  tr_graph_append(g, node);
  /* an ordered effect (a collective) is queued like a store: the next
     flush runs it, whatever its targets */
  if ((vm_op_table[op].flags & VM_F_EFFECT) && !queue_locked(g, node)) {
    tr_graph_unlock(g);
    tr_node_release(node);
    vm_error(KILN_ERR_OOM, "out of memory for a trace node");
    return NULL;
  }
  tr_graph_unlock(g);
  return handle_make(node, true);
}

/* remembers that handle t was rebound from `before` to its pending node
   (graph.h: tr_undo_failed_stores); nothing is remembered out of memory */
static void remember_store(vm_tensor *t, tr_node *before) {
  tr_node *n = t->node;
  if (n->state != TR_PENDING || !n->graph) return;
  tr_graph *g = n->graph;
  tr_graph_lock(g);
  if (g->nundo == g->cap_undo) {
    int cap = g->cap_undo ? 2 * g->cap_undo : 16;
    struct tr_undo *grown = realloc(g->undo, (size_t)cap * sizeof *grown);
    if (!grown) {
      tr_graph_unlock(g);
      return;
    }
    g->undo = grown;
    g->cap_undo = cap;
  }
  g->undo[g->nundo++] = (struct tr_undo){vm_retain(t), tr_node_retain(n), tr_node_retain(before)};
  tr_graph_unlock(g);
}

void tr_store(vm_tensor *dst, vm_tensor *src) {
  tr_node *n = tr_node_retain(src->node), *old = dst->node;
  if (dst->slot) { /* a leaf variable stays one: its new value is a fresh leaf */
    n->requires_grad = true;
    if (!n->slot) n->slot = tr_slot_retain(dst->slot);
  }
  atomic_fetch_add_explicit(&n->handles, 1, memory_order_relaxed);
  dst->node = n;
  remember_store(dst, old);
  atomic_fetch_sub_explicit(&old->handles, 1, memory_order_relaxed);
  tr_node_release(old);
  tr_queue_store(dst);
}

void tr_undo_failed_stores(tr_graph *g) {
  /* A flush stops at its first failed value: a store that a later one
     would have failed (a gradient's own index op, after the loss's) is
     still pending.  The stores are flushed again, alone, until each has
     a value or has failed: one that does not need the failure is kept. */
  vm_thread_state *ts = vm_thread(); /* the error reported is the first flush's */
  kiln_status status = ts->status;
  char message[sizeof ts->message];
  memcpy(message, ts->message, sizeof message);
  g->retrying = true;
  for (int progress = 1; progress;) {
    int n = 0;
    tr_node **pending = malloc((size_t)(g->nundo ? g->nundo : 1) * sizeof *pending);
    if (!pending) break;
    for (int i = 0; i < g->nundo; i++)
      if (g->undo[i].handle->node == g->undo[i].stored && g->undo[i].stored->state == TR_PENDING)
        pending[n++] = tr_node_retain(g->undo[i].stored);
    int rc = n ? tr_flush(g, pending, n, TR_FLUSH_SYNC) : KILN_OK;
    progress = 0;
    for (int i = 0; i < n; i++) {
      progress |= pending[i]->state != TR_PENDING;
      tr_node_release(pending[i]);
    }
    free(pending);
    if (rc == KILN_OK) break;
  }
  g->retrying = false;
  ts->status = status;
  memcpy(ts->message, message, sizeof message);
  /* last first: two steps' stores to one handle, both failed, go back
     through the first's value to the one before it */
  for (int i = g->nundo - 1; i >= 0; i--) {
    struct tr_undo *u = &g->undo[i];
    if (u->handle->node != u->stored || u->stored->state == TR_MATERIALIZED) continue;
    tr_handle_set_node(u->handle, tr_node_retain(u->before));
    atomic_fetch_add_explicit(&vm_process()->stats.stores_undone, 1, memory_order_relaxed);
  }
}

void tr_undo_forget(tr_graph *g) {
  int n = g->nundo;
  struct tr_undo *undo = g->undo;
  g->undo = NULL;
  g->nundo = g->cap_undo = 0;
  for (int i = 0; i < n; i++) {
    tr_node_release(undo[i].stored);
    tr_node_release(undo[i].before);
    vm_release(undo[i].handle);
  }
  free(undo);
}

void tr_handle_set_node(vm_tensor *t, tr_node *n) {
  tr_node *old = t->node;
  atomic_fetch_add_explicit(&n->handles, 1, memory_order_relaxed);
  t->node = n; /* takes the caller's reference */
  atomic_fetch_sub_explicit(&old->handles, 1, memory_order_relaxed);
  tr_node_release(old);
}

void tr_unqueue_store(vm_tensor *t) {
  tr_node *n = t->node;
  if (n->state != TR_PENDING) return;
  tr_graph *g = n->graph;
  tr_graph_lock(g);
  for (int i = g->nstores - 1; i >= 0; i--)
    if (g->stores[i] == n) {
      memmove(&g->stores[i], &g->stores[i + 1], (size_t)(g->nstores - i - 1) * sizeof *g->stores);
      g->nstores--;
      tr_node_release(n);
      break;
    }
  tr_graph_unlock(g);
}

void tr_mark_grad_done(tr_node *n) { n->grad_done = true; }

void tr_queue_store(vm_tensor *t) {
  tr_node *n = t->node;
  if (n->state == TR_MATERIALIZED) return;
  tr_graph *g = n->graph;
  tr_graph_lock(g);
  if (!queue_locked(g, n)) { /* cannot queue: evaluate the store now */
    tr_graph_unlock(g);
    materialize_node(n, TR_FLUSH_MEMORY);
    return;
  }
  tr_graph_unlock(g);
}

/* t's value when it is already materialized (no flush), else NULL: lets an
   op check values that are known at the call (labels, indices) eagerly */
vm_tensor *tr_peek_value(vm_tensor *t) {
  tr_node *x = t->node;
  if (!x) return NULL;
  if (!x->graph) return x->state == TR_MATERIALIZED ? x->value : NULL;
  tr_graph *g = tr_graph_retain(x->graph);
  tr_graph_lock(g);
  vm_tensor *v = x->state == TR_MATERIALIZED ? x->value : NULL;
  tr_graph_unlock(g);
  tr_graph_release(g);
  return v;
}
