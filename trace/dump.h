/* dump.h — observability (DESIGN §8): KILN_LOG flush lines, KILN_DUMP files
 * per planned trace (readable IR with groups, Graphviz, a manifest line).
 * None of it changes a key (the KILN_STATS table is bindings/c/stats.c's).  Dumps go
 * into a private directory only (DESIGN §11). */
#ifndef TR_DUMP_H
#define TR_DUMP_H

#include "../cache/trace_cache.h"
#include "key.h"
#include "loop.h"
#include "plan.h"

/* The KILN_DUMP directory, created 0700 and used only when private (a real
   directory owned by the effective user, writable by no one else; else one
   warning per process): a descriptor the caller closes, or -1. */
int tr_dump_dir_open(void);
/* creates dump file `name` in it (O_EXCL | O_NOFOLLOW, 0600; an earlier
   file of that name is replaced, never followed): NULL on failure */
FILE *tr_dump_create(int dir_fd, const char *name);
/* opens dump file `name` for appending, as every process dumping here
   does (the manifests): opened without following a link and checked on
   the descriptor; a bad one is replaced.  NULL on failure */
FILE *tr_dump_append(int dir_fd, const char *name);
/* KILN_LOG: 0 off, 1 info, 2 debug */
int tr_log_level(void);
/* creates `name` the same way and gives a path that reaches it through the
   directory's descriptor, for writers that take a path (libgccjit) */
bool tr_dump_path(int dir_fd, const char *name, char *out, size_t out_len);

void tr_dump_plan(const tr_trace *t, const tr_plan *plan, tr_key key);
/* KILN_DUMP: a text file of that name in the dump directory */
void tr_dump_text(const char *name, const char *text);
/* KILN_LOG=info: the loop found in a new trace (trace/loop.h) */
void tr_log_loop(const tr_loop *loop, tr_key key, bool rolled);
/* KILN_LOG=info: a flush's trace, or a segment of one (what names it) */
void tr_log_flush(const tr_trace *t, const char *what, tr_key key, const cache_sighting *seen,
                  bool planned, double ms, int rc);
/* KILN_LOG=info: the steps of a rolled loop that ran one key in a flush */
void tr_log_steps(int steps, int nodes, int outputs, tr_key key, const cache_sighting *seen,
                  bool planned, double ms);
/* writes the plan's IR as text (also used by tests) */
void tr_write_ir(FILE *f, const tr_trace *t, const tr_plan *plan, tr_key key);

#endif
