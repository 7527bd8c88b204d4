/* flush.c — one flush: collect what the targets need, decide the outputs
 * (DESIGN §3: targets, pending stores, values saved for backward, values an
 * earlier flush computed without keeping, and what the key learned to keep;
 * every other intermediate stays recomputable), key it, consult the cache,
 * run the plan or the plain trace on the interpreter, and commit.  None of
 * these rules looks at which handles are alive, so the outputs — and the
 * key — are a function of the program, not of when a GC runs. */
#include "flush.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cache/trace_cache.h"
#include "../vm/backend.h"
#include "../vm/state.h"
#include "dump.h"
#include "key.h"
#include "loop.h"
#include "plan.h"
#include "ptrmap.h"

const char *tr_flush_reason_name(tr_flush_reason why) {
  static const char *names[] = {"read", "sync", "depth", "nodes", "memory", "eval"};
  return names[why];
}

/* --- collecting the trace ------------------------------------------------- */

typedef struct {
  tr_trace t;
  int cap_nodes, cap_leaves;
  /* leaf -> index; leaves may be shared between threads, so nothing is
     written into them */
  tr_ptrmap leaf_map;
  int epoch;
  int fail_status; /* a target that failed in an earlier flush */
  const char *fail_msg;
  int *edges;      /* storage of every refs[i] */
  int *recomputed; /* nodes an earlier flush left recomputable (trace indices) */
  int nrecomputed, cap_recomputed;
  bool oom;
  struct visit_frame *stack; /* visit's */
  int cap_stack;
} collector;

typedef struct visit_frame {
  tr_node *node;
  int next; /* its next input to visit */
} visit_frame;

static bool grow(void **p, int *cap, int need, size_t size) {
  if (need <= *cap) return true;
  int c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * size);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

static int leaf_index(collector *c, tr_node *leaf) {
  int j = tr_ptrmap_get(&c->leaf_map, leaf);
  if (j >= 0) return j;
  if (!grow((void **)&c->t.leaves, &c->cap_leaves, c->t.nleaves + 1, sizeof(tr_node *)) ||
      !tr_ptrmap_put(&c->leaf_map, leaf, c->t.nleaves)) {
    c->oom = true;
    return 0;
  }
  j = c->t.nleaves++;
  c->t.leaves[j] = tr_node_retain(leaf);
  return j;
}

/* post-order DFS: inputs in argument order, so the order is a function of
   the program alone */
/* false when n cannot be evaluated: it (or an input) failed before; it is
   then marked FAILED itself and left out */
static bool visit(collector *c, tr_node *root) {
  if (root->state == TR_FAILED) return false;
  if (c->oom || root->state == TR_MATERIALIZED || root->visit == c->epoch) return true;
  root->visit = c->epoch;
  /* an explicit stack: a rolled loop's graph is thousands of nodes deep */
  if (!grow((void **)&c->stack, &c->cap_stack, 1, sizeof *c->stack)) {
    c->oom = true;
    return true;
  }
  int sp = 0;
  c->stack[sp++] = (visit_frame){root, 0};
  tr_node *failed = NULL; /* an input of the top node that failed */
  while (sp > 0) {
    visit_frame *f = &c->stack[sp - 1];
    tr_node *n = f->node;
    if (failed) { /* it and what depends on it fail, the rest of its inputs unvisited */
      tr_node_fail(n, failed->fail_status, failed->fail_msg);
      failed = n;
      sp--;
      continue;
    }
    if (f->next < n->nin) {
      tr_node *x = n->in[f->next++];
      if (x->state == TR_FAILED) {
        failed = x;
      } else if (!c->oom && x->state != TR_MATERIALIZED && x->visit != c->epoch) {
        x->visit = c->epoch;
        if (grow((void **)&c->stack, &c->cap_stack, sp + 1, sizeof *c->stack))
          c->stack[sp++] = (visit_frame){x, 0};
        else
          c->oom = true;
      }
      continue;
    }
    sp--; /* every input is in: n follows them */
    if (c->oom) continue;
    if (!grow((void **)&c->t.nodes, &c->cap_nodes, c->t.n + 1, sizeof(tr_node *))) {
      c->oom = true;
      continue;
    }
    n->index = c->t.n;
    c->t.nodes[c->t.n++] = tr_node_retain(n);
  }
  return failed == NULL;
}

static bool in_trace(const tr_node *n) {
  return n->state == TR_PENDING || n->state == TR_RECOMPUTABLE;
}

/* A value an earlier flush computed without keeping is needed again: keep
   it this time (it is computed at most twice), and tell that flush's key,
   so its next runs keep it at once.  Only the frontier: recomputed values
   that a new node (or the flush itself) reads, not the chain behind them,
   and never a fill. */
static void keep_computed_before(collector *c, tr_node **targets, int ntargets) {
  tr_trace *t = &c->t;
  bool *wanted = calloc((size_t)(t->n ? t->n : 1), sizeof *wanted);
  if (!wanted) {
    c->oom = true;
    return;
  }
  for (int i = 0; i < t->n; i++)
    for (int k = 0; t->nodes[i]->state == TR_PENDING && k < t->nodes[i]->nin; k++)
      if (t->refs[i][k] >= 0) wanted[t->refs[i][k]] = true;
  for (int i = 0; i < ntargets; i++)
    if (in_trace(targets[i])) wanted[targets[i]->index] = true;
  for (int i = 0; i < t->n; i++) {
    const tr_node *n = t->nodes[i];
    if (n->state != TR_RECOMPUTABLE || !wanted[i] || tr_node_is_fill(n)) continue;
    t->is_output[i] = true;
    if (!n->origin_pos) continue;
    if (!grow((void **)&c->recomputed, &c->cap_recomputed, c->nrecomputed + 1, sizeof(int))) {
      c->oom = true;
      break;
    }
    c->recomputed[c->nrecomputed++] = i;
  }
  free(wanted);
}

/* does the VJP of tracked node n read input k? (vm/ops.def's SAVE flags) */
static bool vjp_reads_input(const tr_node *n, int k) {
  unsigned f = vm_op_table[n->op].flags;
  if ((f & VM_F_SAVE_IN) || (k == 0 && (f & VM_F_SAVE_IN0)) || (k == 1 && (f & VM_F_SAVE_IN1)))
    return true;
  if (!(f & VM_F_SAVE_OTHER)) return false;
  for (int q = 0; q < n->nin; q++) /* mul, matmul: the other operand's gradient */
    if (q != k && n->in[q]->requires_grad) return true;
  return false;
}

/* Values a VJP will read, while grad mode was on when they were recorded:
   a backward pass then never recomputes its forward (PyTorch's saved
   tensors).  Fills are cheaper to recompute than to keep. */
static void keep_saved_for_backward(tr_trace *t) {
  for (int i = 0; i < t->n; i++) {
    const tr_node *n = t->nodes[i];
    /* untracked, a leaf variable, or its backward already recorded */
    if (!n->requires_grad || n->slot || n->grad_done) continue;
    if (vm_op_table[n->op].flags & VM_F_SAVE_OUT) t->is_output[i] = true;
    for (int k = 0; k < n->nin; k++) {
      int r = t->refs[i][k];
      if (r >= 0 && !tr_node_is_fill(t->nodes[r]) && vjp_reads_input(n, k)) t->is_output[r] = true;
    }
  }
}

/* A flush forced by a cap (depth, nodes, memory) cuts a computation in the
   middle: what it computed that pending ops still read is on the cut and
   is needed next, so it is kept (else the next flush would recompute the
   whole cut trace: a GRU's backward, cut by the depth cap, recomputed ~1000
   nodes per cut).  Only cap flushes look at pending readers: a read or a
   sync keeps nothing because of them, so garbage a GC has not collected
   never changes their outputs. */
static void keep_read_across_cut(tr_trace *t) {
  for (int i = 0; i < t->n; i++) t->nodes[i]->inside_uses = 0;
  for (int i = 0; i < t->n; i++)
    for (int k = 0; t->nodes[i]->state == TR_PENDING && k < t->nodes[i]->nin; k++)
      if (t->refs[i][k] >= 0) t->nodes[t->refs[i][k]]->inside_uses++;
  for (int i = 0; i < t->n; i++)
    if (t->nodes[i]->pending_uses > t->nodes[i]->inside_uses && !tr_node_is_fill(t->nodes[i]))
      t->is_output[i] = true;
}

static bool is_effect(const tr_node *n) { return vm_op_table[n->op].flags & VM_F_EFFECT; }

static bool collect(collector *c, tr_graph *g, tr_node **targets, int ntargets,
                    tr_flush_reason why) {
  c->epoch = ++g->visit_epoch;
  /* ordered effects (collectives) first, in recording order: the trace's
     order, which every backend runs, then issues them as every rank does */
  for (int i = 0; i < g->nstores; i++)
    if (is_effect(g->stores[i])) visit(c, g->stores[i]);
  for (int i = 0; i < ntargets; i++)
    if (!visit(c, targets[i]) && !c->fail_status) { /* the first failed target's error */
      c->fail_status = targets[i]->fail_status;
      c->fail_msg = targets[i]->fail_msg;
    }
  for (int i = 0; i < g->nstores; i++) visit(c, g->stores[i]);
  tr_trace *t = &c->t;
  size_t edges = 0;
  for (int i = 0; i < t->n; i++) edges += (size_t)t->nodes[i]->nin;
  size_t count = t->n > 0 ? (size_t)t->n : 1;
  t->refs = calloc(count, sizeof *t->refs);
  t->is_output = calloc(count, sizeof *t->is_output);
  c->edges = malloc((edges ? edges : 1) * sizeof(int));
  if (c->oom || !t->refs || !t->is_output || !c->edges) return false;
  for (int i = 0, *next = c->edges; i < t->n; i++) {
    tr_node *n = t->nodes[i];
    t->refs[i] = next;
    next += n->nin;
    for (int k = 0; k < n->nin; k++) {
      tr_node *x = n->in[k];
      if (x->state == TR_MATERIALIZED) {
        t->refs[i][k] = -1 - leaf_index(c, x);
      } else {
        t->refs[i][k] = x->index;
      }
    }
  }
  for (int i = 0; i < ntargets; i++)
    if (in_trace(targets[i])) t->is_output[targets[i]->index] = true;
  for (int i = 0; i < g->nstores; i++)
    if (in_trace(g->stores[i])) t->is_output[g->stores[i]->index] = true;
  keep_computed_before(c, targets, ntargets);
  keep_saved_for_backward(t);
  if (why == TR_FLUSH_DEPTH || why == TR_FLUSH_NODES || why == TR_FLUSH_MEMORY)
    keep_read_across_cut(t);
  return !c->oom;
}

static void collector_free(collector *c) {
  tr_trace *t = &c->t;
  for (int i = 0; i < t->n; i++) {
    tr_node_release(t->nodes[i]);
  }
  for (int j = 0; j < t->nleaves; j++) tr_node_release(t->leaves[j]);
  free(t->refs);
  free(t->nodes);
  free(t->leaves);
  free(t->is_output);
  tr_ptrmap_free(&c->leaf_map);
  free(c->edges);
  free(c->recomputed);
  free(c->stack);
}

/* --- committing ------------------------------------------------------------ */

static void commit(tr_graph *g, tr_trace *t, vm_tensor **vals, tr_key key, bool keyed) {
  for (int i = 0; i < t->n; i++) {
    tr_node *n = t->nodes[i];
    if (n->state == TR_PENDING) tr_node_unlink(n);
    if (t->is_output[i]) {
      n->value = vals[i];
      vals[i] = NULL;
      n->state = TR_MATERIALIZED;
    } else { /* if a later flush needs it, it tells this key (cache_learn) */
      n->state = TR_RECOMPUTABLE;
      n->origin[0] = key.lo;
      n->origin[1] = key.hi;
      n->origin_pos = keyed ? i + 1 : 0;
    }
  }
  /* materialized nodes no longer need their inputs (the flush still holds
     every node of the trace, so nothing is freed under our feet) */
  for (int i = 0; i < t->n; i++) {
    tr_node *n = t->nodes[i];
    if (n->state != TR_MATERIALIZED || n->nin == 0 || (n->requires_grad && !n->slot)) continue;
    for (int k = 0; k < n->nin; k++) tr_node_release(n->in[k]);
    if (n->in != n->in_small) free(n->in);
    n->in = n->in_small;
    n->nin = 0;
  }
  (void)g;
}

static void drop_stores(tr_graph *g) {
  for (int i = 0; i < g->nstores; i++) tr_node_release(g->stores[i]);
  g->nstores = 0;
}

/* keeps what this flush did for trace/inspect.h */
static void remember(tr_graph *g, const tr_trace *t, tr_flush_reason why, const tr_bytes *fam_bytes,
                     const cache_sighting *seen, const tr_plan *plan, tr_key key, int rc) {
  if (!g->last && !(g->last = calloc(1, sizeof *g->last))) return;
  tr_flush_info *info = g->last;
  memset(info, 0, sizeof *info);
  tr_key fam = fam_bytes->failed || !fam_bytes->data ? (tr_key){0, 0} : tr_key_hash(fam_bytes);
  info->key[0] = key.lo;
  info->key[1] = key.hi;
  info->family[0] = fam.lo;
  info->family[1] = fam.hi;
  info->nodes = t->n;
  info->leaves = t->nleaves;
  for (int i = 0; i < t->n; i++) info->outputs += t->is_output[i];
  info->reason = tr_flush_reason_name(why);
  info->new_key = seen->new_key;
  info->planned = plan != NULL;
  info->sightings = seen->sightings;
  info->status = rc;
  if (!plan) { /* tr_last_plan_ir: this flush's, none */
    free(g->last_ir);
    g->last_ir = NULL;
    return;
  }
  info->plan_nodes = plan->n;
  info->plan_groups = plan->ngroups;
  info->plan_buffers = plan->nbuffers;
  info->simplified = plan->passes.simplified;
  info->cse = plan->passes.cse;
  info->dce = plan->passes.dce;
  info->folded = plan->passes.folded;
  if (getenv("KILN_INSPECT_IR")) { /* tests ask for the text */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
      tr_write_ir(f, t, plan, key);
      fclose(f);
      free(g->last_ir);
      g->last_ir = text;
    }
  }
}

bool tr_last_flush(tr_flush_info *out) {
  tr_graph *g = tr_thread_graph();
  if (!g || !g->last) return false;
  *out = *g->last;
  return true;
}

const char *tr_last_plan_ir(void) {
  tr_graph *g = tr_thread_graph();
  return g && g->last_ir ? g->last_ir : "";
}

void tr_cache_reset(void) { cache_clear(); }

static void plan_ops_once(void) {
  static const cache_plan_ops ops = {tr_plan_retain, tr_plan_release};
  cache_set_plan_ops(&ops);
}

/* planning a new key on the caller's thread, per trace node (measured on
   this process's plans; 1 us before the first) */
static double planning_ms(int nodes) {
  const vm_counters *st = &vm_process()->stats;
  uint64_t us = atomic_load_explicit(&st->plan_us, memory_order_relaxed),
           n = atomic_load_explicit(&st->plan_nodes, memory_order_relaxed);
  return (n ? (double)us / (double)n : 1.0) * 1e-3 * nodes;
}

/* The payoff rule (DESIGN §4): a hot key is planned and compiled once
   what compiling saves is expected to exceed what it costs.  Saving per
   run: the key's measured interpreter time (before its first run, the
   mean run of its family: the same trace at other shapes) times what
   compiled code saves of it (measured over this process's compiled runs);
   runs still to come: as many as so far (a key seen n times is expected to
   run n more times).  Cost: planning it, and making its kernels ready:
   those compiled before (by any trace, in this process or an earlier one)
   cost a lookup or a load, only the missing ones a compile (priced per
   kernel by the backend, vm_backend.plan_cost_ms).  Planning serves this
   key alone, so the key's own saving pays for it; kernels take no extents
   and serve every shape of the family, so what the whole family has run
   on the interpreter pays for them (a loop's segments at every sequence
   length, each length seen a few times).  To price it the key is planned
   once its saving covers planning; the price holds until the backend has
   new kernels.  A key that does not pay yet is asked again at its next
   sightings, as its runs add up; KILN_HOT stays the floor, and
   KILN_PAYOFF=0 compiles every hot key.  *built: the plan made to price
   it, when it pays (the caller publishes it; priced at 0, every kernel
   ready, the recompile budget does not count it). */
static bool pays(const vm_backend *be, const tr_trace *t, const tr_key *key, cache_sighting *seen,
                 tr_plan **built) {
  long gen = be->kernel_generation ? be->kernel_generation() : 0;
  if (!vm_env_long("KILN_PAYOFF", 1)) { /* priced all the same: is every kernel ready? */
    if (be->plan_cost_ms && (*built = tr_plan_build(t, be))) {
      seen->price_ms = be->plan_cost_ms(*built, t);
      seen->priced = true;
      seen->price_gen = gen;
    }
    return true;
  }
  double kept = 1 - cache_compiled_ratio();
  double per_run = seen->interp_ms > 0 ? seen->interp_ms : seen->family_interp_ms;
  double saving = per_run * kept * (double)seen->sightings;
  double shared = (seen->family_interp_total + per_run) * kept;
  if (shared < saving) shared = saving;
  seen->saving_ms = shared;
  if (!be->plan_cost_ms) return saving >= (seen->price_ms = be->compile_cost_ms(t->n));
  double plan_ms = planning_ms(t->n);
  if (saving < plan_ms) {
    seen->price_ms = plan_ms; /* at least */
    return false;
  }
  if (seen->priced && seen->price_gen == gen) return shared >= plan_ms + seen->price_ms;
  tr_plan *plan = tr_plan_build(t, be);
  if (!plan) return false;
  double price = seen->price_ms = be->plan_cost_ms(plan, t);
  seen->priced = true;
  seen->price_gen = gen;
  cache_note_price((uint64_t[]){key->lo, key->hi}, price, gen);
  if (shared >= price) { /* planning is paid for already */
    *built = plan;
    return true;
  }
  tr_plan_release(plan);
  return false;
}

/* where trace t runs: the device of its nodes, 0-d weak scalars (which go
   anywhere) aside; two devices make it mixed (run node by node) */
static void trace_device(tr_trace *t) {
  bool found = false;
  t->device = KILN_CPU;
  t->mixed = false;
  for (int i = 0; i < t->n; i++) {
    const vm_meta *m = &t->nodes[i]->meta;
    if (m->weak && m->ndim == 0) continue;
    if (!found)
      t->device = (kiln_device)m->device;
    else if (m->device != t->device)
      t->mixed = true;
    found = true;
  }
}

/* One keyed run of a trace: its key and sighting, then (decide) the payoff
   rule, admission, planning and compiling. */
typedef struct keyed {
  tr_bytes bytes, fam_bytes;
  tr_key key, fam; /* fam: once fam_bytes are made */
  cache_sighting seen;
  tr_plan *plan; /* a reference, or NULL: the interpreter */
} keyed;

static void sight(tr_trace *t, keyed *k) {
  vm_counters *st = &vm_process()->stats;
  tr_key_bytes(t, true, &k->bytes);
  if (k->bytes.failed) return;
  k->key = tr_key_hash(&k->bytes);
  cache_sight((uint64_t[]){k->key.lo, k->key.hi}, k->bytes.data, k->bytes.len, t->n, t->is_output,
              &k->seen);
  atomic_fetch_add_explicit(k->seen.new_key ? &st->cache_misses : &st->cache_hits, 1,
                            memory_order_relaxed);
  if (k->seen.new_key) atomic_fetch_add_explicit(&st->traces_seen, 1, memory_order_relaxed);
  k->plan = k->seen.plan;
}

/* k's family key (its bytes with every extent erased), made once */
static bool family_of(tr_trace *t, keyed *k) {
  if (!k->fam_bytes.data && !k->fam_bytes.failed) {
    tr_key_bytes(t, false, &k->fam_bytes);
    if (!k->fam_bytes.failed) k->fam = tr_key_hash(&k->fam_bytes);
  }
  return !k->fam_bytes.failed;
}

static void decide(tr_trace *t, const vm_backend *be, bool planning, keyed *k) {
  if (k->bytes.failed) return;
  vm_counters *st = &vm_process()->stats;
  cache_sighting *seen = &k->seen;
  bool compiles = planning && be->jit_enabled && be->jit_enabled();
  /* a key without a plan is a sighting of its family too (its payoff) */
  if (compiles && !k->plan && !seen->replan && family_of(t, k)) {
    double work = 0; /* its size: elements its nodes make */
    for (int i = 0; i < t->n; i++) {
      int64_t e;
      if (vm_shape_numel(t->nodes[i]->meta.ndim, t->nodes[i]->meta.shape, &e)) work += (double)e;
    }
    cache_sight_family((uint64_t[]){k->key.lo, k->key.hi}, (uint64_t[]){k->fam.lo, k->fam.hi}, work,
                       seen);
  }
  tr_plan *priced = NULL; /* the plan the payoff rule made to price the key */
  double p0 = vm_now_ms();
  if (seen->hot && planning && compiles && !pays(be, t, &k->key, seen, &priced)) {
    seen->declined = true;
    atomic_fetch_add_explicit(&st->compiles_declined, 1, memory_order_relaxed);
  } else if (seen->hot && planning) { /* the family's recompile budget decides */
    /* priced at nothing (every kernel ready) at this kernel generation,
       by itself or by its family: it compiles nothing */
    long gen = be->kernel_generation ? be->kernel_generation() : 0;
    bool ready = seen->priced && seen->price_ms == 0 && seen->price_gen == gen;
    tr_key fam = family_of(t, k) ? k->fam : (tr_key){0, 0};
    seen->make_plan = cache_admit((uint64_t[]){fam.lo, fam.hi}, !ready);
    seen->over_budget = !seen->make_plan;
    if (seen->over_budget) cache_refuse((uint64_t[]){k->key.lo, k->key.hi});
  }
  if (seen->replan && planning) seen->make_plan = true;
  if (priced && !seen->make_plan)
    tr_plan_release(priced);
  else if (priced)
    k->plan = priced;
  if (!priced) p0 = vm_now_ms();
  if (seen->make_plan && (k->plan || (k->plan = tr_plan_build(t, be)))) {
    if (compiles) be->compile(k->plan, t); /* here or in the background */
    cache_publish((uint64_t[]){k->key.lo, k->key.hi}, k->bytes.data, k->bytes.len, seen->learned,
                  k->plan);
    atomic_fetch_add_explicit(&st->plans_built, 1, memory_order_relaxed);
    vm_add_ms(&st->plan_us, vm_now_ms() - p0);
    atomic_fetch_add_explicit(&st->plan_nodes, (uint_fast64_t)t->n, memory_order_relaxed);
    tr_dump_plan(t, k->plan, k->key);
  }
}

/* a run of ms of k's trace (on the interpreter, or compiled code) */
static void note_run(const keyed *k, double ms) {
  if (!k->bytes.failed && (!k->plan || atomic_load(&k->plan->jit)))
    cache_note_run((uint64_t[]){k->key.lo, k->key.hi}, ms, k->plan != NULL);
}

static void keyed_free(keyed *k) {
  if (k->plan) tr_plan_release(k->plan);
  tr_bytes_free(&k->bytes);
  tr_bytes_free(&k->fam_bytes);
  memset(k, 0, sizeof *k);
}

/* --- a loop run rolled (trace/loop.h) --------------------------------------- */

/* Each segment is keyed and planned like a flush's trace.  The steps of
   the body share one key (their traces are the same but for the values
   they read), keyed once while the next step's bytes are the same, sighted
   once per flush and timed as one run: every trip count adds to one key's
   economics. */
typedef struct {
  tr_segment_runner base;
  const vm_backend *be;
  bool planning;
  keyed step;     /* the body's current key */
  double step_ms; /* its steps' time in this flush */
  int steps, step_nodes, step_outputs;
  bool have_step;
  tr_key main_step; /* the key that ran the most steps */
  int main_steps;
  int64_t all_steps; /* every step run, whatever its key */
} rolled;

static void step_done(rolled *r) {
  if (r->have_step) {
    note_run(&r->step, r->step_ms);
    tr_log_steps(r->steps, r->step_nodes, r->step_outputs, r->step.key, &r->step.seen,
                 r->step.plan != NULL, r->step_ms);
    if (r->steps > r->main_steps) {
      r->main_steps = r->steps;
      r->main_step = r->step.key;
    }
  }
  r->steps = 0;
  keyed_free(&r->step);
  r->step_ms = 0;
  r->have_step = false;
}

static int run_keyed(tr_trace *t, keyed *k, const vm_backend *be, bool planning, vm_tensor **vals,
                     int *failed, tr_loop *loop, bool *rolled, tr_key *step);

static int run_segment(tr_segment_runner *self, tr_trace *sub, int segment, vm_tensor **vals,
                       int *failed) {
  rolled *r = (rolled *)self;
  double t0 = vm_now_ms();
  if (segment != TR_SEGMENT_STEP) { /* like a flush's trace: it may hold a loop of its own */
    keyed k = {0};
    tr_loop loop;
    bool inner = false;
    tr_key step;
    sight(sub, &k);
    int rc = run_keyed(sub, &k, r->be, r->planning, vals, failed, &loop, &inner, &step);
    double ms = vm_now_ms() - t0;
    if (rc == KILN_OK && !inner) note_run(&k, ms);
    tr_log_flush(sub,
                 segment == TR_SEGMENT_BEFORE
                     ? (inner ? "  before the loop, rolled:" : "  before the loop:")
                     : (inner ? "  after the loop, rolled:" : "  after the loop:"),
                 k.key, &k.seen, k.plan != NULL, ms, rc);
    keyed_free(&k);
    return rc;
  }
  tr_bytes bytes;
  tr_key_bytes(sub, true, &bytes);
  bool same = r->have_step && !bytes.failed && !r->step.bytes.failed &&
              bytes.len == r->step.bytes.len && !memcmp(bytes.data, r->step.bytes.data, bytes.len);
  tr_bytes_free(&bytes);
  if (!same) {
    step_done(r);
    sight(sub, &r->step);
    decide(sub, r->be, r->planning, &r->step);
    r->have_step = true;
    if (r->step.seen.new_key && tr_log_level() >= 2) /* KILN_LOG=debug: a new step's nodes */
      tr_log_flush(sub, "  a new loop step:", r->step.key, &r->step.seen, r->step.plan != NULL, 0,
                   KILN_OK);
    r->step_nodes = sub->n;
    r->step_outputs = 0;
    for (int i = 0; i < sub->n; i++) r->step_outputs += sub->is_output[i];
  }
  r->steps++;
  r->all_steps++;
  int rc = tr_run(r->step.plan, sub, vals, failed);
  r->step_ms += vm_now_ms() - t0;
  return rc;
}

static int run_rolled(tr_trace *t, const tr_loop *loop, const vm_backend *be, bool planning,
                      vm_tensor **vals, int *failed, tr_key *step) {
  rolled r = {.base = {run_segment}, .be = be, .planning = planning};
  int rc = tr_loop_run(t, loop, &r.base, vals, failed);
  if (rc == KILN_OK)
    step_done(&r);
  else
    keyed_free(&r.step);
  *step = r.main_step;
  atomic_fetch_add_explicit(&vm_process()->stats.loops_rolled, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&vm_process()->stats.loop_steps, (uint64_t)r.all_steps,
                            memory_order_relaxed);
  return rc;
}

bool tr_rolling_enabled(void) {
  return vm_env_long("KILN_LOOPS", 1) != 0 && vm_env_long("KILN_ROLL_LOOPS", 1) != 0;
}

/* Runs t, sighted in k: rolled if it holds a loop (found when its key is
   new, remembered with the key; in both modes, on the CPU), else planned
   or interpreted as its key decides.  The segments of a rolled loop come
   back here, so each loop of a trace is rolled in turn (a forward loop
   and the backward loop of the step before, in one flush). */
static int run_keyed(tr_trace *t, keyed *k, const vm_backend *be, bool planning, vm_tensor **vals,
                     int *failed, tr_loop *loop, bool *rolled, tr_key *step) {
  memset(loop, 0, sizeof *loop);
  *rolled = false;
  *step = (tr_key){0, 0};
  if (!k->bytes.failed && k->seen.new_key && tr_loop_find(t, loop)) {
    atomic_fetch_add_explicit(&vm_process()->stats.loops_found, 1, memory_order_relaxed);
    bool rollable = tr_loop_rollable(loop) && !t->mixed;
    if (rollable) cache_attach((uint64_t[]){k->key.lo, k->key.hi}, loop, sizeof *loop);
    *rolled = rollable && tr_rolling_enabled();
    tr_log_loop(loop, k->key, *rolled);
  } else if (k->seen.aux_len == sizeof *loop) {
    memcpy(loop, k->seen.aux, sizeof *loop);
    *rolled = tr_rolling_enabled();
  }
  if (*rolled) {
    int rc = run_rolled(t, loop, be, planning, vals, failed, step);
    if (k->seen.new_key && rc == KILN_OK)
      tr_loop_dump(t, loop, (uint64_t[]){k->key.lo, k->key.hi}, (uint64_t[]){step->lo, step->hi});
    return rc;
  }
  decide(t, be, planning, k);
  return tr_run(k->plan, t, vals, failed);
}

int tr_flush(tr_graph *g, tr_node **targets, int ntargets, tr_flush_reason why) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, plan_ops_once);
  vm_post_ops();
  double t0 = vm_now_ms();
  collector c = {0};
  if (!collect(&c, g, targets, ntargets, why)) {
    collector_free(&c);
    drop_stores(g);
    return vm_error(KILN_ERR_OOM, "out of memory collecting a trace");
  }
  tr_trace *t = &c.t;
  trace_device(t);
  /* the device's backend; a mixed trace is never planned */
  const vm_backend *be = t->mixed ? NULL : vm_backend_of(t->device);
  bool planning = be && tr_planning_enabled();
  int earlier = c.fail_status;
  if (earlier) vm_error_again(earlier, c.fail_msg);
  if (t->n == 0) {
    collector_free(&c);
    drop_stores(g);
    return earlier ? earlier : KILN_OK;
  }
  vm_counters *st = &vm_process()->stats;
  int recomputed = 0;
  for (int i = 0; i < t->n; i++)
    recomputed += t->nodes[i]->state == TR_RECOMPUTABLE && !tr_node_is_fill(t->nodes[i]);
  for (int i = 0; i < c.nrecomputed; i++) { /* their flushes learn to keep them */
    const tr_node *n = t->nodes[c.recomputed[i]];
    cache_learn(n->origin, n->origin_pos - 1);
  }
  keyed k = {0};
  sight(t, &k);
  tr_loop loop = {0};
  bool rolled = false;
  tr_key step = {0, 0};
  vm_tensor **vals = calloc((size_t)t->n, sizeof *vals);
  int failed = -1;
  int rc = vals ? run_keyed(t, &k, be, planning, vals, &failed, &loop, &rolled, &step)
                : vm_error(KILN_ERR_OOM, "out of memory");
  double ms = vm_now_ms() - t0;
  if (rc == KILN_OK && !rolled) note_run(&k, ms);
  char what[48];
  snprintf(what, sizeof what, "flush (%s)%s", tr_flush_reason_name(why), rolled ? " rolled" : "");
  tr_log_flush(t, what, k.key, &k.seen, k.plan != NULL, ms, rc); /* before commit drops inputs */
  if (rc == KILN_OK) {
    commit(g, t, vals, k.key, !k.bytes.failed);
    g->flush_epoch++;
  } else if (failed >= 0) { /* it and what depends on it fail from now on */
    tr_node_fail(t->nodes[failed], rc, vm_thread()->message);
    for (int i = failed + 1; i < t->n; i++)
      for (int e = 0; e < t->nodes[i]->nin; e++)
        if (t->refs[i][e] >= 0 && t->nodes[t->refs[i][e]]->state == TR_FAILED)
          tr_node_fail(t->nodes[i], rc, vm_thread()->message);
  }
  for (int i = 0; vals && i < t->n; i++) vm_release(vals[i]);
  free(vals);
  remember(g, t, why, &k.fam_bytes, &k.seen, k.plan, k.key, rc);
  if (g->last) {
    tr_flush_info *info = g->last;
    info->recomputed = recomputed;
    info->loop = loop;
    info->rolled = rolled;
    info->step_key[0] = step.lo;
    info->step_key[1] = step.hi;
  }
  atomic_fetch_add_explicit(&st->recomputed, (uint_fast64_t)recomputed, memory_order_relaxed);
  atomic_fetch_add_explicit(&st->flushes, 1, memory_order_relaxed);
  vm_add_ms(&st->flush_us, ms);
  keyed_free(&k);
  collector_free(&c);
  /* a flush stopped without a failed value (interrupted, out of memory)
     keeps its stores queued: the next flush materializes them */
  /* its caller reports a failure: what it stored from a failed value is
     taken back (graph.h) */
  if (failed >= 0 && why != TR_FLUSH_NODES && why != TR_FLUSH_MEMORY && !g->retrying)
    tr_undo_failed_stores(g);
  if (rc == KILN_OK || failed >= 0) {
    drop_stores(g);
    if (!g->retrying) tr_undo_forget(g);
  }
  return rc != KILN_OK ? rc : earlier;
}
