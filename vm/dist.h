/* dist.h — the distributed engine (DESIGN §10): Open MPI loaded at run time,
 * one engine thread per process that makes every MPI call, and the
 * interpreter of the collective primitives (ops.def: all_reduce,
 * all_reduce_start, all_reduce_wait), which both backends' exec call.
 *
 * Collectives are *ordered effects*: every rank must issue them in the same
 * order, exactly once.  The trace layer therefore runs a pending collective
 * in the next flush whatever its targets, in recording order, keeps its
 * value (never recomputes it), and never merges two of them (CSE).  Each
 * carries a sequence number (attr.counter, a runtime parameter): the engine
 * refuses one that runs out of that order, or again.
 *
 * Before its payload, each collective agrees on a signature (kind, op,
 * dtype, count) with the other ranks, so ranks that disagree get a shape
 * error, all of them, instead of garbage or a crash.  A collective with no
 * answer within KILN_DIST_TIMEOUT seconds (default 300) means a rank died
 * or diverged: the engine prints why and aborts the job (MPI_Abort), so no
 * rank hangs. */
#ifndef VM_DIST_H
#define VM_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "ops.h"

/* the values of kiln_reduce_op, kept in attr.axis of a collective */
enum { VM_REDUCE_SUM, VM_REDUCE_MEAN, VM_REDUCE_MAX, VM_REDUCE_COUNT };
const char *vm_reduce_name(int op);

int vm_dist_init(void);     /* KILN_OK, or KILN_ERR_STATE saying why (no mpirun, no libmpi) */
int vm_dist_finalize(void); /* waits for the collectives in flight */
int vm_dist_rank(void);     /* KILN_ERR_STATE (negative) before init */
int vm_dist_size(void);
/* true when collectives can be recorded; else false + KILN_ERR_STATE */
bool vm_dist_ready(void);
/* the sequence number of a collective recorded now */
uint64_t vm_dist_next_seq(void);

/* the three collective primitives on materialized values (any device: the
   payload travels through the host) */
vm_tensor *vm_dist_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                        const vm_meta *m);

/* launched by mpirun (or another PMI launcher): the number of ranks on
   this node, else 0 */
int vm_dist_local_size(void);

#endif
