/* flush.h — evaluating part of a pending graph.  A flush collects the nodes
 * its targets need, decides which of them become materialized (DESIGN §3),
 * keys the result, asks the cache for a plan, and runs it. */
#ifndef TR_FLUSH_H
#define TR_FLUSH_H

#include "graph.h"

typedef enum {
  TR_FLUSH_READ,
  TR_FLUSH_SYNC,
  TR_FLUSH_DEPTH,
  TR_FLUSH_NODES,
  TR_FLUSH_MEMORY,
  TR_FLUSH_EVAL
} tr_flush_reason;

const char *tr_flush_reason_name(tr_flush_reason why);

/* The canonical trace of one flush: nodes in topological order (inputs
   first), the materialized leaves they read (numbered by first use), and
   which nodes are outputs. */
typedef struct tr_trace {
  tr_node **nodes;
  int n;
  int **refs; /* refs[i][k], input k of node i: >= 0 a node, < 0 leaf -(j+1) */
  tr_node **leaves;
  int nleaves;
  bool *is_output;
  kiln_device device; /* where its nodes run (0-d weak scalars go anywhere) */
  bool mixed;         /* nodes on two devices: node by node, never planned */
} tr_trace;

/* Flushes targets (and all pending stores) of graph g, which the caller has
   locked.  Returns KILN_OK, or an error status with the message set. */
int tr_flush(tr_graph *g, tr_node **targets, int ntargets, tr_flush_reason why);

/* loops are rolled (trace/loop.h) unless KILN_LOOPS=0 (API.md; for
   comparisons) or its older name KILN_ROLL_LOOPS=0 */
bool tr_rolling_enabled(void);

#endif
