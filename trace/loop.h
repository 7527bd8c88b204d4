/* loop.h — loop detection (DESIGN §12): in one flush's trace, a body the
 * program recorded k >= 2 times in a row, each copy's inputs carried from
 * the copy before, invariant across copies, or stepped (a slice whose start
 * advances by a constant, or a value of its own per copy).  A function of the recorded program
 * only.  This first step finds and reports loops; rolling them into one loop node is the next
 * (issue #39). */
#ifndef TR_LOOP_H
#define TR_LOOP_H

#include <stdbool.h>
#include <stdint.h>

struct tr_trace;

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
} tr_loop;

/* The longest loop in t (most nodes covered), or false when there is none
   (a body must have >= 2 nodes and repeat >= 2 times).  Linear in the
   trace, but for sorting it into record order. */
bool tr_loop_find(const struct tr_trace *t, tr_loop *out);

#endif
