/* tape.h — what autodiff reads and writes of the recorded graph (DESIGN §7):
 * trace nodes seen through accessors (their layout stays trace/'s, in
 * graph.h), the gradient slots of leaf variables, and the node and handle
 * calls backward needs.  autodiff/ includes this, never graph.h. */
#ifndef TR_TAPE_H
#define TR_TAPE_H

#include <stdatomic.h>

#include "../vm/ops.h"
#include "ptrmap.h"
#include "record.h"

typedef struct tr_node tr_node;

/* Where a leaf variable's gradient accumulates (autodiff/, DESIGN §7): held
   by the user's handle and by the leaf node the handle names. */
typedef struct tr_grad_slot {
  atomic_long refs;
  vm_tensor *grad; /* a handle, or NULL */
} tr_grad_slot;

tr_grad_slot *tr_slot_new(void);
tr_grad_slot *tr_slot_retain(tr_grad_slot *s);
void tr_slot_release(tr_grad_slot *s);

tr_node *tr_node_retain(tr_node *n);
void tr_node_release(tr_node *n);
/* a materialized node wrapping value (takes the reference) */
tr_node *tr_node_from_value(vm_tensor *value);
/* a materialized node wrapping value (retained here), tracked by autodiff
   (requires grad) when track; NULL + KILN_ERR_OOM when out of memory */
tr_node *tr_leaf_node(vm_tensor *value, bool track);
/* gives node n (a leaf variable's own) a reference to slot */
void tr_node_set_slot(tr_node *n, tr_grad_slot *slot);

/* A backward pass in progress on this thread names the gradients it will
   still read (each(ctx, keep, acc) calls keep(acc, g) for each).  A flush
   forced by a cap (depth, nodes, memory) in the middle of the pass keeps those
   values: a gradient that one VJP read before the cut and another reads
   after it is not recomputed, with the whole chain behind it (an LSTM's
   gate gradients, read by the bias sum before a cut and by dx and dh after
   it, recomputed ~2,750 nodes per cut).  What the tape holds is the
   program's, so the cut stays a function of the program.  Passes nest
   (create_graph): push saves the one before, pop restores it. */
typedef struct tr_tape_reads {
  void (*each)(void *ctx, void (*keep)(void *acc, vm_tensor *g), void *acc);
  void *ctx;
  struct tr_tape_reads *outer;
} tr_tape_reads;
void tr_tape_reads_push(tr_tape_reads *r);
void tr_tape_reads_pop(tr_tape_reads *r);

vm_opcode tr_node_op(const tr_node *n);
const vm_attr *tr_node_attr(const tr_node *n);
int tr_node_nin(const tr_node *n);
tr_node *tr_node_input(const tr_node *n, int k);
uint64_t tr_node_seq(const tr_node *n); /* creation order: a topological order */
bool tr_node_requires_grad(const tr_node *n);
bool tr_node_materialized(const tr_node *n);
tr_grad_slot *tr_node_slot(const tr_node *n); /* a leaf variable's; NULL for others */

#endif
