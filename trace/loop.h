/* loop.h — loops (DESIGN §12): in one flush's trace, a body the program
 * recorded k >= 2 times in a row, each copy's inputs carried from the copy
 * before, invariant across copies, or stepped (a slice whose start advances
 * by a constant, or a value of its own per copy).  Detection is a function
 * of the recorded program only.  A loop that carries state is run rolled:
 * the trace in three segments (before the loop, one step of the body run
 * once per copy, after the loop), each a trace of its own that the caller
 * keys, plans and compiles, so every trip count runs the same body trace
 * and its compiled code. */
#ifndef TR_LOOP_H
#define TR_LOOP_H

#include <stdbool.h>
#include <stdint.h>

struct tr_trace;
struct kiln_tensor;

typedef struct tr_loop {
  int start;  /* the first copy's first node, in record order (0-based) */
  int body;   /* nodes per copy */
  int copies; /* k >= 2 */
  /* the body's inputs by kind, each input edge of the body counted once:
     carried from the copy before, invariant, stepped (a slice advancing by
     a constant), and per-step values (a value of its own in every copy, as
     a backward loop reads what its forward saved) */
  int carried, invariant, stepped, per_step;
  /* the body's nodes read after the loop: from the last copy only, or
     from every copy (collected per step, as a stack) */
  int last_outputs, stacked_outputs;
  uint64_t body_hash; /* the body's structure: the same for every trip count */
  bool barrier;       /* the body holds an op no fused loop nest takes (a matmul, a
                         reduction, a gather, ...): its copies cannot fuse into one kernel */
} tr_loop;

/* The longest loop in t (most nodes covered), or false when there is none
   (a body must have >= 2 nodes and repeat >= 2 times).  Linear in the
   trace, but for sorting it into record order. */
bool tr_loop_find(const struct tr_trace *t, tr_loop *out);

/* whether lp is run rolled: it carries state from copy to copy through a
   body that ends a fused kernel.  Copies that share nothing, or a chain of
   elementwise ops, are left to the plan, which fuses them together. */
bool tr_loop_rollable(const tr_loop *lp);

enum { TR_SEGMENT_BEFORE, TR_SEGMENT_STEP, TR_SEGMENT_AFTER };

/* How the caller runs one segment: sub is a trace of its own (nodes of
   the flush's trace; leaves the values that other segments computed), to
   run like a flush's trace, filling vals[m] for each output m; *failed:
   the index in sub of a node that failed. */
typedef struct tr_segment_runner {
  int (*run)(struct tr_segment_runner *self, struct tr_trace *sub, int segment,
             struct kiln_tensor **vals, int *failed);
} tr_segment_runner;

/* Runs trace t, which holds loop lp (found in a trace with t's key), by
   segments: the nodes recorded before the loop, then each copy of the body
   in turn (its slices of values from outside the copy taken first, as
   views: they are what a step advances), then the nodes recorded after it.
   Fills vals[i] for every output of t, as tr_run does; *failed: t's index
   of a node that failed. */
int tr_loop_run(const struct tr_trace *t, const tr_loop *lp, tr_segment_runner *run,
                struct kiln_tensor **vals, int *failed);

/* KILN_DUMP: loop-<key>.txt describes how trace t's loop ran: its copies,
   the body in record order with what ran for every step at once before
   the loop (hoisted), after it (a sum) or per step, and the step key */
void tr_loop_dump(const struct tr_trace *t, const tr_loop *lp, const uint64_t key[2],
                  const uint64_t step_key[2]);

#endif
