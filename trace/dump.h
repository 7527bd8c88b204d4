/* dump.h — observability (DESIGN §8): KILN_LOG flush lines, KILN_DUMP files
 * per planned trace (readable IR with groups, Graphviz, a manifest line),
 * and the KILN_STATS table at exit.  None of it changes a key. */
#ifndef TR_DUMP_H
#define TR_DUMP_H

#include "../cache/trace_cache.h"
#include "key.h"
#include "plan.h"

void tr_dump_plan(const tr_trace *t, const tr_plan *plan, tr_key key);
void tr_log_flush(const tr_trace *t, tr_flush_reason why, tr_key key, const cache_sighting *seen,
                  bool planned, double ms, int rc);
/* writes the plan's IR as text (also used by tests) */
void tr_write_ir(FILE *f, const tr_trace *t, const tr_plan *plan, tr_key key);

#endif
