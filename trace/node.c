/* node.c — trace node lifetime and the per-thread pending graph.  Nodes are
 * reference counted (handles, consumers, store lists, running flushes); a
 * pending node also sits in its thread's pending list, which it leaves when
 * it is flushed or freed.  All pending-graph state is changed under the
 * graph's (recursive) lock, so a handle may be read or released on any
 * thread. */
#include <stdlib.h>
#include <string.h>

#include "../vm/state.h"
#include "graph.h"

static pthread_key_t graph_key;
static pthread_once_t graph_key_once = PTHREAD_ONCE_INIT;

static void graph_release(tr_graph *g) {
  if (g && atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) {
    pthread_mutex_destroy(&g->lock);
    free(g->stores);
    free(g->walk);
    free(g->last);
    free(g->last_ir);
    free(g);
  }
}

/* this thread's graph, as the key holds it (a plain TLS read per op) */
static __thread tr_graph *thread_graph;

/* at thread exit: pending nodes still alive keep the graph; stores are
   dropped with it (their handles still name their nodes) */
static void graph_thread_exit(void *p) {
  tr_graph *g = p;
  thread_graph = NULL;
  vm_post_ops(); /* a thread that recorded has a graph: its ops are counted */
  tr_graph_lock(g);
  tr_node **stores = g->stores;
  int n = g->nstores;
  g->stores = NULL;
  g->nstores = g->cap_stores = 0;
  tr_undo_forget(g);
  tr_graph_unlock(g);
  for (int i = 0; i < n; i++) tr_node_release(stores[i]);
  free(stores);
  graph_release(g);
}

static void graph_key_init(void) { pthread_key_create(&graph_key, graph_thread_exit); }

tr_graph *tr_thread_graph(void) {
  if (thread_graph) return thread_graph;
  pthread_once(&graph_key_once, graph_key_init);
  tr_graph *g = pthread_getspecific(graph_key);
  if (g) return thread_graph = g;
  g = calloc(1, sizeof *g);
  if (!g) return NULL;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&g->lock, &attr);
  pthread_mutexattr_destroy(&attr);
  atomic_init(&g->refs, 1);
  g->head.next = g->head.prev = &g->head;
  pthread_setspecific(graph_key, g);
  return thread_graph = g;
}

void tr_graph_lock(tr_graph *g) { pthread_mutex_lock(&g->lock); }
void tr_graph_unlock(tr_graph *g) { pthread_mutex_unlock(&g->lock); }

tr_grad_slot *tr_slot_new(void) {
  tr_grad_slot *s = calloc(1, sizeof *s);
  if (s) atomic_init(&s->refs, 1);
  return s;
}

tr_grad_slot *tr_slot_retain(tr_grad_slot *s) {
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  return s;
}

void tr_slot_release(tr_grad_slot *s) {
  if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
    vm_release(s->grad);
    free(s);
  }
}

tr_node *tr_node_retain(tr_node *n) {
  if (n) atomic_fetch_add_explicit(&n->refs, 1, memory_order_relaxed);
  return n;
}

tr_node *tr_node_from_value(vm_tensor *value) {
  tr_node *n = vm_block_alloc(VM_BLOCK_NODE, sizeof *n);
  if (!n) {
    vm_release(value);
    return NULL;
  }
  atomic_init(&n->refs, 1);
  n->op = VM_OP_input;
  n->meta.dtype = n->meta.compute = value->dtype;
  n->meta.device = value->storage->device;
  n->meta.ndim = value->ndim;
  memcpy(n->meta.shape, value->shape, sizeof n->meta.shape);
  n->attr.dtype = value->dtype;
  n->attr.ndim = value->ndim;
  memcpy(n->attr.shape, value->shape, sizeof n->attr.shape);
  n->in = n->in_small;
  n->value = value;
  n->state = TR_MATERIALIZED;
  return n;
}

/* the bytes a pending node will allocate, counted at most 2^40 so that the
   sum over a graph's pending nodes stays far from overflowing */
static int64_t node_bytes(const tr_node *n) {
  if (vm_op_table[n->op].kind == VM_KIND_VIEW) return 0;
  const int64_t most = (int64_t)1 << 40;
  int64_t c, bytes;
  if (!vm_shape_numel(n->meta.ndim, n->meta.shape, &c) ||
      __builtin_mul_overflow(c, (int64_t)vm_dtype_size(n->meta.dtype), &bytes) || bytes > most)
    return most;
  return bytes;
}

void tr_node_unlink(tr_node *n) {
  tr_graph *g = n->graph;
  if (!n->prev) return; /* not in the list */
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = NULL;
  g->pending--;
  g->pending_bytes -= node_bytes(n);
  if (n->meta.device < 2) g->pending_device_bytes[n->meta.device] -= node_bytes(n);
  for (int i = 0; i < n->nin; i++)
    if (n->in[i]->state != TR_MATERIALIZED) n->in[i]->pending_uses--;
}

void tr_node_fail(tr_node *n, int status, const char *msg) {
  if (n->state == TR_FAILED) return;
  if (n->state == TR_PENDING) tr_node_unlink(n);
  n->state = TR_FAILED;
  n->fail_status = status ? status : KILN_ERR_INTERNAL;
  n->fail_msg = strdup(msg ? msg : "evaluation failed");
}

tr_graph *tr_graph_retain(tr_graph *g) {
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  return g;
}

void tr_graph_release(tr_graph *g) { graph_release(g); }

/* frees n, whose last reference is gone; its inputs whose last reference
   that was go onto *dead (to be freed in turn), or, where *dead cannot
   grow, are released here */
static void node_free(tr_node *n, tr_node ***dead, int *ndead, int *cap) {
  tr_graph *g = n->graph;
  if (g) { /* leave the pending list, and give back the owner reference */
    tr_graph_lock(g);
    if (n->state == TR_PENDING && n->prev) { /* still counted (graph.h) */
      g->dropped++;
      if (n->meta.device < 2) g->dropped_device_bytes[n->meta.device] += node_bytes(n);
    }
    if (n->state == TR_PENDING) tr_node_unlink(n);
    tr_graph_unlock(g);
    graph_release(g);
  }
  for (int i = 0; i < n->nin; i++) {
    tr_node *x = n->in[i];
    if (atomic_fetch_sub_explicit(&x->refs, 1, memory_order_acq_rel) != 1) continue;
    if (*ndead == *cap) {
      int c = *cap ? 2 * *cap : 64;
      tr_node **grown = realloc(*dead, (size_t)c * sizeof *grown);
      if (!grown) { /* out of memory: this one recursively */
        node_free(x, dead, ndead, cap);
        continue;
      }
      *dead = grown;
      *cap = c;
    }
    (*dead)[(*ndead)++] = x;
  }
  if (n->in != n->in_small) free(n->in);
  vm_release(n->value);
  free(n->fail_msg);
  tr_slot_release(n->slot);
  vm_block_free(VM_BLOCK_NODE, n);
}

/* A chain of nodes whose last references go together (a long recurrent
   graph dropped at once) is freed from a worklist, not by recursion: it
   can be far deeper than a thread's stack. */
void tr_node_release(tr_node *n) {
  if (!n || atomic_fetch_sub_explicit(&n->refs, 1, memory_order_acq_rel) != 1) return;
  tr_node **dead = NULL;
  int ndead = 0, cap = 0;
  node_free(n, &dead, &ndead, &cap);
  while (ndead > 0) node_free(dead[--ndead], &dead, &ndead, &cap);
  free(dead);
}

void tr_graph_append(tr_graph *g, tr_node *n) {
  atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
  n->graph = g;
  n->prev = g->head.prev;
  n->next = &g->head;
  g->head.prev->next = n;
  g->head.prev = n;
  g->pending++;
  g->pending_bytes += node_bytes(n);
  if (n->meta.device < 2) g->pending_device_bytes[n->meta.device] += node_bytes(n);
  for (int i = 0; i < n->nin; i++)
    if (n->in[i]->state != TR_MATERIALIZED) n->in[i]->pending_uses++;
}

tr_node *tr_leaf_node(vm_tensor *value, bool track) {
  tr_node *n = tr_node_from_value(vm_retain(value));
  if (!n) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  n->requires_grad = track;
  return n;
}

void tr_node_set_slot(tr_node *n, tr_grad_slot *slot) { n->slot = tr_slot_retain(slot); }

/* --- autodiff's view of a node (tape.h) ---------------------------------- */

vm_opcode tr_node_op(const tr_node *n) { return n->op; }
const vm_attr *tr_node_attr(const tr_node *n) { return &n->attr; }
int tr_node_nin(const tr_node *n) { return n->nin; }
tr_node *tr_node_input(const tr_node *n, int k) { return n->in[k]; }
uint64_t tr_node_seq(const tr_node *n) { return n->seq; }
bool tr_node_requires_grad(const tr_node *n) { return n->requires_grad; }
bool tr_node_materialized(const tr_node *n) { return n->state == TR_MATERIALIZED; }
tr_grad_slot *tr_node_slot(const tr_node *n) { return n->slot; }
