/* record.h — the trace layer's face to vm/ and the bindings: recording ops
 * into the calling thread's pending graph, and getting values out of it.
 * DESIGN §3.  A tensor handle (what users hold) always names a trace node;
 * the node is pending until a flush materializes it into a value tensor
 * (storage + strides) that kernels read.  Values are never user-visible. */
#ifndef TR_RECORD_H
#define TR_RECORD_H

#include "../vm/ops.h"

/* Records op (inputs are handles in the op's compute dtypes, meta from
   vm_infer) and returns a new pending handle, or NULL with the error set. */
vm_tensor *tr_record(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                     const vm_meta *m);

/* A handle for a materialized value (takes the caller's reference). */
vm_tensor *tr_handle_from_value(vm_tensor *value);

/* The value of handle t, flushing what it needs first: a borrowed reference
   valid while t names the same node, or NULL with the error set. */
vm_tensor *tr_value(vm_tensor *t);
/* t's value if it is materialized already (never flushes), else NULL */
vm_tensor *tr_peek_value(vm_tensor *t);

/* Rebinds dst's handle to src's value and queues the store (a pending store
   is materialized by the next flush).  dtype and shape must already match. */
void tr_store(vm_tensor *dst, vm_tensor *src);

/* Queues t's node as a pending store (materialized by the next flush). */
void tr_queue_store(vm_tensor *t);
/* Takes t's node off the pending stores (a gradient zeroed before any flush
   needed it: nothing names it as a store any more). */
void tr_unqueue_store(vm_tensor *t);
/* Marks the tracked nodes of a finished backward pass: a later flush keeps
   nothing for them (DESIGN §3, saved for backward). */
struct tr_node;
void tr_mark_grad_done(struct tr_node *n);

/* Flushes everything pending on this thread (kiln_sync). */
int tr_sync(void);
/* Bytes of results an evaluation that reads t would compute now (t NULL:
   tr_sync's): 0 when t's value is at hand, SIZE_MAX when unknown
   (a recomputation).  A measure of how long a read blocks. */
size_t tr_pending_bytes(vm_tensor *t);
/* Computes ts[0..n) and keeps their values (kiln_eval): one flush for
   those recorded on this thread, one per other thread's graph. */
int tr_eval(int n, vm_tensor *const *ts);

/* A weak scalar handle's literal (its full node's value and host flag):
   false when t is no such handle. */
bool tr_weak_scalar(const vm_tensor *t, double *value, bool *host);

/* a new handle naming node n (autodiff walks nodes and needs handles) */
struct tr_node;
vm_tensor *tr_handle_of_node(struct tr_node *n);
/* points handle t at node n (takes the reference), no store queued */
void tr_handle_set_node(vm_tensor *t, struct tr_node *n);

#endif
