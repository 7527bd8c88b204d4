/* trace_cache.h — the trace cache (DESIGN §4): canonical key -> entry
 * (sightings, plan, stats).  uthash, bounded (LRU, KILN_TRACE_CACHE_MAX
 * keys, default 4096; an evicted key releases its plan), one lock.  Plans are
 * opaque here: the trace layer registers how to retain and release them. */
#ifndef CACHE_TRACE_CACHE_H
#define CACHE_TRACE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cache_plan_ops {
  void (*retain)(void *plan);
  void (*release)(void *plan);
} cache_plan_ops;

void cache_set_plan_ops(const cache_plan_ops *ops);

enum { CACHE_AUX_MAX = 64 };

typedef struct cache_sighting {
  void *plan;       /* retained plan, or NULL (run on the interpreter) */
  bool hot;         /* seen KILN_HOT times or more and not planned: the payoff
                       rule, then cache_admit, decide whether to plan it */
  bool replan;      /* planned before, but it learned outputs since: plan
                       it again (no admission needed) */
  int learned;      /* outputs learned so far (see cache_learn) */
  bool make_plan;   /* admitted: plan it now (set by the caller) */
  bool over_budget; /* hot, but its family used up its recompile budget */
  bool declined;    /* hot, but its compile does not pay yet (set by the caller) */
  bool new_key;
  uint64_t sightings; /* including this one */
  double interp_ms;   /* mean time of its runs on the interpreter so far (0: none yet) */
  bool priced;        /* cache_note_price gave it a price: */
  double price_ms;
  long price_gen;
  double saving_ms; /* what compiling would have saved so far (set by the payoff rule, for logs) */
  /* its family (the same trace with every extent erased: every sequence
     length of a loop's segment), after cache_sight_family: the family's
     sightings while unplanned, and its interpreter runs' time */
  bool family;
  uint64_t family_sightings;
  double family_interp_ms;    /* this key's run at the family's time per work (0: none yet) */
  double family_interp_total; /* all of its runs */
  /* what the trace layer attached to the key (cache_attach), copied out */
  uint8_t aux[CACHE_AUX_MAX];
  size_t aux_len; /* 0: nothing attached */
} cache_sighting;

/* Attaches up to CACHE_AUX_MAX bytes to key (a trace layer's fact about the
   key's trace, e.g. where its loop is); every later sighting copies them
   out.  Nothing happens if the key has no entry. */
void cache_attach(const uint64_t key[2], const void *aux, size_t len);

/* The payoff rule's price of key's plan (ms), valid while its backend's
   kernel generation is gen (vm_backend.kernel_generation). */
void cache_note_price(const uint64_t key[2], double ms, long gen);
/* Counts a sighting of the trace with canonical bytes (hash key) of
   `nodes` nodes; a hash collision with different bytes is never mistaken
   for a hit.  Sets outputs[i] for every node the key learned to keep. */
void cache_sight(const uint64_t key[2], const uint8_t *bytes, size_t len, int nodes, bool *outputs,
                 cache_sighting *out);
/* A later flush had to recompute node `index` of key's trace: the next runs
   of that key keep it (DESIGN §3: a plan learns).  Bounded per key: past
   CACHE_MAX_RELEARN plans for one key it stops learning. */
void cache_learn(const uint64_t key[2], int index);
/* Counts a sighting of key (just sighted by cache_sight into *io, with no
   plan) as one of its family fam, and fills io's family fields.  The
   family's runs on the interpreter add up across its keys (cache_note_run),
   (work: the size of key's trace, its nodes' elements, which scales the
   family's time per unit of work to this key's in io->family_interp_ms),
   so the payoff rule can price kernels, which every shape of a family
   shares, against what the whole family spends; a key of a family
   sighted KILN_HOT times is hot at its first sighting; and a key not
   priced yet takes its family's last price (cache_note_price). */
void cache_sight_family(const uint64_t key[2], const uint64_t fam[2], double work,
                        cache_sighting *io);
/* A hot trace of key family fam may be planned while the family is within
   its recompile budget; counts it if so.  A plan that compiles nothing
   (compiles false: every kernel is ready) is always admitted, uncounted:
   the budget bounds compiling, not planning. */
bool cache_admit(const uint64_t fam[2], bool compiles);
/* key was refused admission: it is never hot again */
void cache_refuse(const uint64_t key[2]);
/* Publishes the plan of a key, built with the outputs it had learned
   (cache_sighting.learned); the cache takes a reference. */
void cache_publish(const uint64_t key[2], const uint8_t *bytes, size_t len, int learned,
                   void *plan);
/* The time one run of key took: on the interpreter (no plan), or with
   compiled code (then the ratio of that time to the key's interpreter time
   feeds cache_compiled_ratio).  Runs of a plan still waiting for its
   compile are not noted. */
void cache_note_run(const uint64_t key[2], double ms, bool compiled);
/* what compiled code takes of the interpreter's time, measured over the
   process's compiled runs (their time over their keys' interpreter time,
   older runs weighing less; 0.5 before any) */
double cache_compiled_ratio(void);

int cache_entries(void);
void cache_clear(void); /* drops every entry (tests) */

/* settings */
int cache_hot_threshold(void); /* KILN_HOT, default 2 */
int cache_family_budget(void); /* KILN_RECOMPILE_BUDGET, default 8 */

#endif
