/* graph.h — trace nodes and the per-thread pending graph (internal to
 * trace/).  A node is an immutable value: an op applied to input nodes, or a
 * materialized value.  States: PENDING (recorded, never flushed),
 * RECOMPUTABLE (was in a flushed graph but not an output: keeps its inputs
 * so it can be evaluated if it is ever read), MATERIALIZED (has a value). */
#ifndef TR_GRAPH_H
#define TR_GRAPH_H

#include <pthread.h>
#include <stdatomic.h>

#include "../vm/ops.h"

typedef enum { TR_PENDING, TR_RECOMPUTABLE, TR_MATERIALIZED } tr_state;

typedef struct tr_graph tr_graph;

typedef struct tr_node {
  atomic_long refs;        /* handles, consumer nodes, the store list, flushes */
  atomic_long handles;     /* user handles naming this node */
  vm_opcode op;
  vm_attr attr;
  vm_meta meta;
  int nin;
  struct tr_node **in;     /* in_small or heap */
  struct tr_node *in_small[3];
  vm_tensor *value;        /* MATERIALIZED only */
  tr_state state;
  int depth;               /* longest path of pending nodes ending here */
  int pending_uses;        /* PENDING consumers (under the graph lock) */
  tr_graph *graph;         /* the recording thread's graph (a reference); NULL for leaves */
  struct tr_node *prev, *next; /* the owner's pending list */
  /* scratch for one flush (under the graph lock) */
  int visit, index, inside_uses;
} tr_node;

struct tr_graph {
  pthread_mutex_t lock;    /* recursive: releasing a node may release its inputs */
  atomic_long refs;        /* the thread + its pending nodes */
  tr_node head;            /* sentinel of the pending list, in record order */
  int64_t pending;         /* nodes in the list */
  int64_t pending_bytes;   /* bytes their results would take */
  tr_node **stores;        /* handles' nodes rebound by stores since the last flush */
  int nstores, cap_stores;
  int visit_epoch;
};

tr_graph *tr_thread_graph(void); /* the calling thread's; created on first use */
tr_graph *tr_graph_retain(tr_graph *g);
void tr_graph_release(tr_graph *g);
/* appends a new PENDING node to g (locked); the node holds a graph reference */
void tr_graph_append(tr_graph *g, tr_node *n);
void tr_graph_lock(tr_graph *g);
void tr_graph_unlock(tr_graph *g);

tr_node *tr_node_retain(tr_node *n);
void tr_node_release(tr_node *n);
/* a materialized node wrapping value (takes the reference) */
tr_node *tr_node_from_value(vm_tensor *value);
/* leaves the pending list (PENDING -> another state); owner graph locked */
void tr_node_unlink(tr_node *n);

#endif
