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
#include "inspect.h"
#include "tape.h"

/* FAILED: evaluating it failed (an index out of range); reading it reports
   that error, and flushes of other values leave it alone */
typedef enum { TR_PENDING, TR_RECOMPUTABLE, TR_MATERIALIZED, TR_FAILED } tr_state;

typedef struct tr_graph tr_graph;

struct tr_node {
  atomic_long refs;    /* handles, consumer nodes, the store list, flushes */
  atomic_long handles; /* user handles naming this node */
  vm_opcode op;
  vm_attr attr;
  vm_meta meta;
  int nin;
  struct tr_node **in; /* in_small or heap */
  struct tr_node *in_small[3];
  vm_tensor *value; /* MATERIALIZED only */
  int fail_status;  /* FAILED only: the error */
  char *fail_msg;
  bool requires_grad; /* tracked by autodiff: keeps its inputs after materializing */
  bool grad_done;     /* kiln_backward went through it: nothing is saved for it */
  tr_grad_slot *slot; /* a leaf variable's gradient slot (a reference) */
  uint64_t seq;       /* creation order (a topological order for autodiff) */
  uint64_t origin[2]; /* RECOMPUTABLE: the key of the flush that computed it */
  int origin_pos;     /* ... and its canonical index there + 1 (0: none) */
  tr_state state;
  int depth;                   /* longest unmaterialized path ending here, as of depth_epoch */
  uint64_t depth_epoch;        /* the owner graph's flush count when depth was computed */
  int pending_uses;            /* PENDING consumers (under the graph lock) */
  tr_graph *graph;             /* the recording thread's graph (a reference); NULL for leaves */
  struct tr_node *prev, *next; /* the owner's pending list */
  /* scratch for one flush (under the graph lock) */
  int visit, index, inside_uses;
};

struct tr_graph {
  pthread_mutex_t lock;            /* recursive: releasing a node may release its inputs */
  atomic_long refs;                /* the thread + its pending nodes */
  tr_node head;                    /* sentinel of the pending list, in record order */
  int64_t pending;                 /* nodes in the list */
  int64_t pending_bytes;           /* bytes their results would take */
  int64_t pending_device_bytes[2]; /* the same per kiln_device (CPU, CUDA) */
  /* pending nodes freed unevaluated since the last flush of everything:
     the node and memory caps count them as if pending, so where a graph is
     cut depends on what was recorded, never on when handles were let go
     (Ruby's GC frees them when it runs) */
  int64_t dropped, dropped_device_bytes[2];
  tr_node **stores; /* handles' nodes rebound by stores since the last flush */
  int nstores, cap_stores;
  /* each store since the last flush: the handle, the node it stored and
     the one it named before, so that a store whose value failed can be
     taken back (tr_undo_failed_stores) */
  struct tr_undo {
    struct kiln_tensor *handle; /* a vm_tensor */
    struct tr_node *stored, *before;
  } * undo;
  int nundo, cap_undo;
  bool retrying;             /* tr_undo_failed_stores is flushing the stores again */
  tr_tape_reads *tape_reads; /* the backward passes in progress (tape.h) */
  int visit_epoch;
  uint64_t flush_epoch;  /* flushes committed: depths older than this are stale */
  struct tr_node **walk; /* the depth walk's stack (trace/record.c), under the lock */
  int walk_cap;
  struct tr_flush_info *last; /* what the last flush did (trace/inspect.h) */
  char *last_ir;              /* its plan's IR, when inspection asked for it */
};

tr_graph *tr_thread_graph(void); /* the calling thread's; created on first use */
tr_graph *tr_graph_retain(tr_graph *g);
void tr_graph_release(tr_graph *g);
/* appends a new PENDING node to g (locked); the node holds a graph reference */
void tr_graph_append(tr_graph *g, tr_node *n);
void tr_graph_lock(tr_graph *g);
void tr_graph_unlock(tr_graph *g);

/* A flush that failed and tells its caller so (a read, a sync, an eval)
   takes back its stores whose value failed: each handle names again the
   value it had before (a parameter an optimizer step updated from a loss
   that failed keeps its last good value, as if the step had raised
   before it ran, as PyTorch's does).  Owner graph locked. */
void tr_undo_failed_stores(tr_graph *g);
/* forgets the stores' undo records (the flush committed them) */
void tr_undo_forget(tr_graph *g);

/* a fill, or a cast of one: cheaper to compute again than to keep */
static inline bool tr_node_is_fill(const tr_node *n) {
  if (n->op == VM_OP_cast && n->nin == 1) n = n->in[0];
  return n->op == VM_OP_full;
}

/* leaves the pending list (PENDING -> another state); owner graph locked */
void tr_node_unlink(tr_node *n);
/* marks n FAILED with status and message (leaving the pending list) */
void tr_node_fail(tr_node *n, int status, const char *msg);

#endif
