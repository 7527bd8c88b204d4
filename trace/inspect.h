/* inspect.h — what the last flush of the calling thread did, for tests and
 * tools (not part of the public API). */
#ifndef TR_INSPECT_H
#define TR_INSPECT_H

#include <stdbool.h>
#include <stdint.h>

#include "loop.h"

typedef struct tr_flush_info {
  uint64_t key[2];    /* XXH3-128 of the canonical bytes (lo, hi) */
  uint64_t family[2]; /* the same with extents erased */
  int nodes, leaves, outputs;
  int recomputed;     /* nodes an earlier flush computed (fills aside) */
  const char *reason; /* "read", "sync", "depth", "nodes", "memory", "eval" */
  bool new_key;
  bool planned; /* ran a cached plan (else the plain interpreter) */
  uint64_t sightings;
  int plan_nodes, plan_groups, plan_buffers;
  int simplified, cse, dce, folded;
  int status;           /* KILN_OK or the error */
  tr_loop loop;         /* its loop: found when it was a new key, remembered since (trace/loop.h);
                           copies 0: none */
  bool rolled;          /* the loop ran rolled: */
  uint64_t step_key[2]; /* the key of its steps (the one that ran the most of them) */
} tr_flush_info;

/* false if this thread never flushed */
bool tr_last_flush(tr_flush_info *out);
/* the plan's text IR for the last flush that ran a plan ("" if none) */
const char *tr_last_plan_ir(void);
/* forgets every cached trace (tests) */
void tr_cache_reset(void);

#endif
