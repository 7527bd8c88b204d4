/* loop.c — loop detection (loop.h, DESIGN §12).  The trace is read in
 * record order; each node gets a signature (its op, result and key
 * attributes, a slice's position left out); the most frequent distance
 * between equal signatures proposes a period, a run of positions that
 * repeat at that distance proposes a region, and checking every copy's
 * input edges against the copy before confirms it (or cuts it short). */
#include "loop.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../vm/backend.h"
#include "../vm/gemm_f32.h"
#include "../vm/state.h"
#include "dump.h"
#include "flush.h"
#include "graph.h"
#include "ptrmap.h"

enum { CANDIDATES = 16 };

/* --- signatures ------------------------------------------------------------- */

typedef struct {
  uint64_t w[64];
  int n;
} sig_buf;

static void put(sig_buf *b, uint64_t v) {
  if (b->n < 64) b->w[b->n++] = v;
}

static uint64_t bits_of(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

/* what two nodes must share to be the same position of a body: fields one
   by one (never a struct's padding); a slice's start and stop are what a
   stepped input advances, so they are left out (its length is the shape) */
static uint64_t node_sig(const tr_node *n) {
  sig_buf b = {.n = 0};
  const vm_attr *a = &n->attr;
  put(&b, (uint64_t)n->op << 32 | (uint64_t)n->nin);
  put(&b, (uint64_t)n->meta.dtype << 32 | (uint64_t)n->meta.ndim << 8 | n->meta.weak);
  for (int d = 0; d < n->meta.ndim; d++) put(&b, (uint64_t)n->meta.shape[d]);
  put(&b, (uint64_t)a->dtype << 40 | (uint64_t)a->ndim << 32 | a->axes_mask);
  for (int d = 0; d < a->ndim && d < KILN_MAX_DIMS; d++) put(&b, (uint64_t)a->shape[d]);
  for (int d = 0; d < n->meta.ndim; d++) put(&b, (uint64_t)a->perm[d]);
  put(&b, (uint64_t)(uint32_t)a->axis << 32 | (uint64_t)a->keepdim << 16 | (uint64_t)a->weak << 8 |
              (uint64_t)a->host << 4 | a->device);
  if (n->op != VM_OP_slice) put(&b, (uint64_t)a->start), put(&b, (uint64_t)a->stop);
  put(&b, (uint64_t)a->step);
  put(&b, bits_of(a->scalar[0]));
  put(&b, bits_of(a->scalar[1]));
  put(&b, a->seed);
  put(&b, a->counter);
  return XXH3_64bits(b.w, (size_t)b.n * sizeof *b.w);
}

/* a 64-bit number as a tr_ptrmap key (the map's keys are pointers, NULL
   empty): 0 is made 1.  Where pointers are narrower, numbers that then
   meet only propose candidates; runs compare the full signatures. */
static const void *as_key(uint64_t v) { return (const void *)(uintptr_t)(v ? v : 1); }

/* --- the search -------------------------------------------------------------- */

typedef struct {
  const tr_trace *t;
  int n;
  int *order;     /* record position -> trace index */
  int *pos;       /* trace index -> record position */
  uint64_t *sig;  /* per record position */
  int64_t *delta; /* per body position: a slice's start step (scratch) */
} search;

static int by_seq(const void *a, const void *b, void *arg) {
  const tr_trace *t = arg;
  uint64_t x = t->nodes[*(const int *)a]->seq, y = t->nodes[*(const int *)b]->seq;
  return x < y ? -1 : x > y;
}

/* order[p]: the trace index of the node recorded p-th.  Sequence numbers
   of one flush's nodes are mostly a dense run: counted into place when
   their span is small, sorted otherwise. */
static void record_order(const tr_trace *t, int *order) {
  int n = t->n;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int i = 0; i < n; i++) {
    uint64_t q = t->nodes[i]->seq;
    lo = q < lo ? q : lo;
    hi = q > hi ? q : hi;
  }
  int *slot = n && hi - lo < 8 * (uint64_t)n ? malloc((size_t)(hi - lo + 1) * sizeof *slot) : NULL;
  if (!slot) {
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, by_seq, (void *)t);
    return;
  }
  memset(slot, 0xff, (size_t)(hi - lo + 1) * sizeof *slot);
  for (int i = 0; i < n; i++) slot[t->nodes[i]->seq - lo] = i;
  for (uint64_t q = 0, p = 0; q <= hi - lo; q++)
    if (slot[q] >= 0) order[p++] = slot[q];
  free(slot);
}

/* input ref r of a trace node: a node of the trace, or a leaf */
static const tr_node *input_node(const tr_trace *t, int r) {
  return r >= 0 ? t->nodes[r] : t->leaves[-1 - r];
}

static bool same_meta(const tr_node *a, const tr_node *b) {
  return a->meta.dtype == b->meta.dtype && vm_meta_same_shape(&a->meta, &b->meta);
}

/* the copy of region [s, s + k*d) record position p falls in: -1 before,
   k after */
static int copy_of(int p, int s, int d, int k) {
  if (p < s) return -1;
  int c = (p - s) / d;
  return c < k ? c : k;
}

/* Checks copies 1..k-1 of region (s, d, k) against the copy before; returns
   how many copies hold (>= 1), counting the body's input kinds in *lp from
   copy 1. */
static int confirm(search *sr, int s, int d, int k, tr_loop *lp) {
  const tr_trace *t = sr->t;
  memset(lp, 0, sizeof *lp);
  uint64_t h = XXH3_64bits(&d, sizeof d);
  for (int j = 1; j < k; j++) {
    for (int q = 0; q < d; q++) {
      int ia = sr->order[s + (j - 1) * d + q], ib = sr->order[s + j * d + q];
      const tr_node *a = t->nodes[ia], *b = t->nodes[ib];
      if (a->op == VM_OP_slice) { /* stepped: a constant advance */
        int64_t step = b->attr.start - a->attr.start;
        if (j == 1)
          sr->delta[q] = step;
        else if (step != sr->delta[q])
          return j;
        if (b->attr.stop - a->attr.stop != step) return j;
        if (j == 1 && step) lp->stepped++;
      }
      for (int e = 0; e < b->nin; e++) {
        int ra = t->refs[ia][e], rb = t->refs[ib][e], kind;
        int pb = rb >= 0 ? sr->pos[rb] : -1, cb = rb >= 0 ? copy_of(pb, s, d, k) : -1;
        int pa = ra >= 0 ? sr->pos[ra] : -1, ca = ra >= 0 ? copy_of(pa, s, d, k) : -1;
        if (cb == -1) { /* from before the loop: the same in every copy (invariant), or a
                           value of its own per copy (what a backward loop's forward saved) */
          if (ca != -1) return j;
          kind = ra == rb ? 1 : same_meta(input_node(t, ra), input_node(t, rb)) ? 3 : -1;
          if (kind < 0) return j;
        } else {
          if (cb == j) { /* inside the copy: the same offset */
            if (ra < 0 || pa != pb - d) return j;
            kind = 0;
          } else if (cb == j - 1) { /* carried from the copy before */
            if (j >= 2 ? (ra < 0 || pa != pb - d) : (ra >= 0 && pa >= s)) return j;
            kind = 2;
          } else {
            return j; /* an older copy: not a one-step recurrence */
          }
        }
        if (j == 1) {
          lp->invariant += kind == 1;
          lp->carried += kind == 2;
          lp->per_step += kind == 3;
          uint64_t edge[3] = {
              sr->sig[s + j * d + q], (uint64_t)kind,
              kind == 0 || kind == 2 ? (uint64_t)(sr->pos[rb] - s) % (uint64_t)d : 0};
          h = XXH3_64bits_withSeed(edge, sizeof edge, h);
        }
      }
    }
    if (j == 1) lp->body_hash = h;
  }
  return k;
}

/* which of the body's nodes are read after the loop (or are outputs) */
static bool count_outputs(search *sr, tr_loop *lp) {
  const tr_trace *t = sr->t;
  int s = lp->start, d = lp->body, k = lp->copies, end = s + k * d;
  bool *read = calloc((size_t)(k * d), sizeof *read);
  if (!read) return false;
  for (int p = s; p < end; p++) read[p - s] = t->is_output[sr->order[p]];
  for (int p = end; p < sr->n; p++) {
    int i = sr->order[p];
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e];
      if (r >= 0 && sr->pos[r] >= s && sr->pos[r] < end) read[sr->pos[r] - s] = true;
    }
  }
  for (int q = 0; q < d; q++) {
    int copies_read = 0;
    for (int c = 0; c < k; c++) copies_read += read[c * d + q];
    if (copies_read > 1)
      lp->stacked_outputs++;
    else if (copies_read == 1 && read[(k - 1) * d + q])
      lp->last_outputs++;
  }
  free(read);
  return true;
}

/* Up to CANDIDATES periods, most likely first: distances from each node
   back to the last RECENT nodes of its signature, counted.  A body's true
   period is the distance back to the same node of the copy before, which
   is among them for every signature the body holds at most RECENT times
   (the nearest alone would miss it: a GRU's backward has a dozen reshapes
   per step). */
static int periods(search *sr, int *best) {
  enum { RECENT = 4 };
  tr_ptrmap slot = {0}, hist = {0};
  int(*recent)[RECENT] = malloc((size_t)sr->n * sizeof *recent);
  int found = 0, used = 0;
  for (int p = 0; recent && p < sr->n; p++) {
    int i = tr_ptrmap_get(&slot, as_key(sr->sig[p]));
    if (i < 0) {
      if (!tr_ptrmap_put(&slot, as_key(sr->sig[p]), i = used++)) goto out;
      for (int r = 0; r < RECENT; r++) recent[i][r] = -1;
    }
    int *last = recent[i];
    for (int r = 0; r < RECENT && last[r] >= 0; r++) {
      int d = p - last[r];
      if (d < 2) continue;
      int c = tr_ptrmap_get(&hist, as_key((uint64_t)d));
      if (!tr_ptrmap_put(&hist, as_key((uint64_t)d), c < 0 ? 1 : c + 1)) goto out;
    }
    memmove(last + 1, last, (RECENT - 1) * sizeof *last);
    last[0] = p;
  }
  int count[CANDIDATES] = {0};
  for (int i = 0; recent && i < hist.slots; i++) {
    if (!hist.keys[i]) continue;
    int d = (int)(uintptr_t)hist.keys[i], c = hist.vals[i], r = found;
    /* insertion into the top CANDIDATES: more often first, then shorter */
    while (r > 0 && (c > count[r - 1] || (c == count[r - 1] && d < best[r - 1]))) r--;
    if (r >= CANDIDATES) continue;
    if (found < CANDIDATES) found++;
    for (int m = found - 1; m > r; m--) {
      best[m] = best[m - 1];
      count[m] = count[m - 1];
    }
    best[r] = d;
    count[r] = c;
  }
out:
  free(recent);
  tr_ptrmap_free(&slot);
  tr_ptrmap_free(&hist);
  return found;
}

/* the longest confirmed region with period d, or copies = 0 */
static void best_region(search *sr, int d, tr_loop *best) {
  for (int p = d; p < sr->n;) {
    if (sr->sig[p] != sr->sig[p - d]) {
      p++;
      continue;
    }
    int a = p;
    while (p < sr->n && sr->sig[p] == sr->sig[p - d]) p++;
    int s = a - d, k = (p - s) / d;
    if (k < 2 || k * d <= best->copies * best->body) continue;
    tr_loop lp;
    k = confirm(sr, s, d, k, &lp);
    if (k >= 2 && k * d > best->copies * best->body) {
      lp.start = s;
      lp.body = d;
      lp.copies = k;
      *best = lp;
    }
  }
}

/* The body's phase: a region repeating with period d can start at any of
   d positions, and which one the search sees first depends on what was
   recorded before the loop (a forward loop alone, or after the backward
   of the step before), so the same loop would be d different bodies.  The
   canonical phase cuts the fewest edges between copies (the step a user
   wrote: x[t]'s slice and the projection it feeds fall in one copy, where
   work can leave the loop), and of those, starts the least rotation of the
   body's signatures.  Moving there leaves the part before it to the
   segment before the loop and may cost one copy. */
static int canonical_rotation(const search *sr, int s, int d, int k) {
  const tr_trace *t = sr->t;
  int *cuts = calloc((size_t)d + 1, sizeof *cuts), base = 0;
  if (!cuts || k < 2) {
    free(cuts);
    return 0;
  }
  /* copy 1's edges from copy 1 (inside) or copy 0 (carried): with phase f,
     an edge u -> v crosses a boundary unless both ends fall in one copy */
  for (int q = 0; q < d; q++) {
    int i = sr->order[s + d + q];
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e], p = r >= 0 ? sr->pos[r] : -1;
      if (p < s || p >= s + 2 * d) continue;
      int ou = (p - s) % d;
      if (p >= s + d) { /* inside: crosses for f in [ou + 1, q] */
        cuts[ou + 1]++;
        cuts[q + 1]--;
      } else { /* carried: stays inside only for f in [q + 1, ou] */
        base++;
        if (q < ou) {
          cuts[q + 1]--;
          cuts[ou + 1]++;
        }
      }
    }
  }
  int best = -1, fewest = 0;
  for (int f = 0, run = base; f < d; f++) {
    run += f ? cuts[f] : cuts[0];
    bool better = best < 0 || run < fewest;
    if (!better && run == fewest) /* a tie: the least rotation */
      for (int j = 0; j < d; j++) {
        uint64_t a = sr->sig[s + (f + j) % d], b = sr->sig[s + (best + j) % d];
        if (a != b) {
          better = a < b;
          break;
        }
      }
    if (better) {
      best = f;
      fewest = run;
    }
  }
  free(cuts);
  return best < 0 ? 0 : best;
}

static void canonical_phase(search *sr, tr_loop *lp) {
  int phase = canonical_rotation(sr, lp->start, lp->body, lp->copies);
  if (!phase) return;
  int s = lp->start + phase, d = lp->body, end = lp->start + lp->copies * d, k = lp->copies - 1;
  /* all copies still, when the run goes on past the region far enough */
  bool longer = end + phase <= sr->n;
  for (int p = end; longer && p < end + phase; p++) longer = sr->sig[p] == sr->sig[p - d];
  if (longer) k++;
  tr_loop moved;
  k = confirm(sr, s, d, k, &moved);
  if (k < 2) return;
  moved.start = s;
  moved.body = d;
  moved.copies = k;
  *lp = moved;
}

bool tr_loop_find(const tr_trace *t, tr_loop *out) {
  memset(out, 0, sizeof *out);
  if (t->n < 4) return false;
  search sr = {.t = t, .n = t->n};
  sr.order = malloc((size_t)t->n * sizeof *sr.order);
  sr.pos = malloc((size_t)t->n * sizeof *sr.pos);
  sr.sig = malloc((size_t)t->n * sizeof *sr.sig);
  sr.delta = malloc((size_t)t->n * sizeof *sr.delta);
  bool found = false;
  if (sr.order && sr.pos && sr.sig && sr.delta) {
    record_order(t, sr.order);
    for (int p = 0; p < t->n; p++) {
      sr.pos[sr.order[p]] = p;
      sr.sig[p] = node_sig(t->nodes[sr.order[p]]);
    }
    int d[CANDIDATES], nd = periods(&sr, d);
    for (int c = 0; c < nd; c++) best_region(&sr, d[c], out);
    if (out->copies >= 2) canonical_phase(&sr, out);
    found = out->copies >= 2 && count_outputs(&sr, out);
    for (int q = 0; found && q < out->body; q++) {
      vm_kind kind = vm_op_table[t->nodes[sr.order[out->start + q]]->op].kind;
      out->barrier |= kind != VM_KIND_LEAF && kind != VM_KIND_UNARY && kind != VM_KIND_BINARY &&
                      kind != VM_KIND_TERNARY && kind != VM_KIND_VIEW;
    }
  }
  free(sr.order);
  free(sr.pos);
  free(sr.sig);
  free(sr.delta);
  if (!found) memset(out, 0, sizeof *out);
  return found;
}

bool tr_loop_rollable(const tr_loop *lp) {
  return lp->copies >= 2 && lp->carried > 0 && lp->barrier;
}

/* --- running a loop rolled --------------------------------------------------- */

/* One flush's scratch for building segments: the trace's nodes by record
   position, and a sub-trace's arrays (sized for the whole trace, reused). */
typedef struct {
  const tr_trace *t;
  int s, d, k, end;   /* the region: record positions [s, end), k copies of d */
  int *at, *pos;      /* record position <-> trace index */
  bool *outside_read; /* read by a node of another segment or another copy */
  /* the loop's values no later step reads, by the step after which they
     go: drop[drop_at[c] .. drop_at[c + 1]) after step c */
  int *drop, *drop_at;
  /* sums over the steps that leave the loop (sink_sums) */
  struct sink {
    int add;     /* body offsets of `acc + reshape*(term)`: the add, */
    int term;    /* the term (a @ b, or a column sum), */
    int view[2]; /* the reshapes between, from the term on (-1: none) */
    int acc;     /* the add's input that carries the sum */
  } * sinks;
  int nsinks;
  /* per-step products that leave the loop after it (find_maps) */
  struct map {
    int mm;      /* body offset of the product a_t @ W, */
    int view[2]; /* the views after it, read after the loop only (-1: none) */
  } * maps;
  int nmaps;
  bool *sunk;   /* per body offset: computed after the loop */
  bool *mapped; /* per body offset: of those, a map's (each step's value kept) */
  /* work that leaves the loop before it (hoist_before) */
  bool *hoisted;       /* per body offset: computed for every step at once */
  vm_tensor **batched; /* per body offset: that value, [k, ...] */
  bool *needed;        /* per body offset: a step, a sum or a later segment reads it */
  bool *body_out;      /* per body offset: an output of the step (any copy's) */
  vm_tensor **vals;    /* the flush's values */
  /* the segment being built */
  tr_trace sub;
  int *list;         /* its nodes (trace indices), in order */
  int *edges;        /* storage of sub.refs */
  vm_tensor **svals; /* its values */
  tr_node *shells;   /* leaves standing for values computed by other segments */
  int *local, *local_stamp, *leaf, *leaf_stamp, stamp;
  /* the steps' values joined before a segment (join_steps): per list
     position, the concat rewritten over joined runs (NULL: the trace's
     node) and its refs (JOINED(j): joined value j) */
  bool *in_seg;
  tr_node **over, *over_node;
  int **over_refs, *over_edges;
  vm_tensor **joined;
  int njoined;
} roller;

/* a ref to joined value j in a segment's rewritten concat */
#define JOINED(j) (INT_MIN + (j))
#define IS_JOINED(r) ((r) < INT_MIN / 2)

static int copy_at(const roller *R, int i) {
  int p = R->pos[i];
  return p < R->s ? -1 : p >= R->end ? R->k : (p - R->s) / R->d;
}

/* the attributes of two nodes agree, field by field (what an op computes
   with: a copy's host scalars and RNG counters too) */
static bool same_attr(const vm_attr *a, const vm_attr *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim || a->axis != b->axis ||
      a->axes_mask != b->axes_mask || a->keepdim != b->keepdim || a->weak != b->weak ||
      a->device != b->device || a->host != b->host || a->start != b->start || a->stop != b->stop ||
      a->step != b->step || a->seed != b->seed || a->counter != b->counter ||
      memcmp(a->scalar, b->scalar, sizeof a->scalar) || memcmp(a->perm, b->perm, sizeof a->perm))
    return false;
  for (int d = 0; d < a->ndim && d < KILN_MAX_DIMS; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

/* offset q's node has the same attributes in every copy */
static bool same_in_every_copy(const roller *R, int q) {
  const tr_node *n0 = R->t->nodes[R->at[R->s + q]];
  for (int c = 1; c < R->k; c++) {
    const tr_node *n = R->t->nodes[R->at[R->s + c * R->d + q]];
    if (n->op != n0->op || !same_attr(&n->attr, &n0->attr)) return false;
  }
  return true;
}

/* --- sums over the steps leave the loop ---

   A backward loop accumulates each weight's gradient across its steps:
   acc = acc + a_t @ b_t (h_{t-1}^T @ dgates_t), one small GEMM and one add
   per step, carried (through a reshape or a transpose: x @ W^T's weight
   gets (x^T dg)^T); a bias's is acc + sum(dgates_t, rows).  When nothing
   else reads the partial sums, the sum leaves the loop: the steps keep the
   term's operands, and after the loop one GEMM over them all,
   [a_0 .. a_{k-1}] @ [b_0; ..; b_{k-1}] (or one column sum over the rows
   of every step), is added to the sum the loop started from (RETURNN's
   optimization).  The GEMM adds the steps' products in its own order, in
   both modes alike. */

static int offset_in(const roller *R, int i) { return (R->pos[i] - R->s) % R->d; }

/* the term a sum adds per step: a @ b of 2-d operands, or a sum over the
   rows of a 2-d value */
static bool is_term(const tr_trace *t, int i) {
  const tr_node *n = t->nodes[i];
  if (n->op == VM_OP_matmul && n->nin == 2)
    return input_node(t, t->refs[i][0])->meta.ndim == 2 &&
           input_node(t, t->refs[i][1])->meta.ndim == 2;
  return n->op == VM_OP_sum && n->nin == 1 && n->attr.axes_mask == 1 &&
         input_node(t, t->refs[i][0])->meta.ndim == 2;
}

/* a view the sums and maps take through: a reshape, or a permute (the
   gradient of x @ W^T's weight is (x^T dg)^T, a transpose of the term) */
static bool is_view(const tr_node *n) {
  return n->nin == 1 && (n->op == VM_OP_reshape || n->op == VM_OP_permute);
}

static bool sink_at(roller *R, const int *readers, int q, struct sink *out) {
  const tr_trace *t = R->t;
  struct sink sk = {.add = q, .term = -1, .view = {-1, -1}, .acc = -1};
  for (int c = 0; c < R->k; c++) {
    int a = R->at[R->s + c * R->d + q];
    const tr_node *na = t->nodes[a];
    if (na->op != VM_OP_add || na->nin != 2) return false;
    int carried = -1;
    for (int e = 0; e < 2 && carried < 0; e++) {
      int r = t->refs[a][e];
      if (c == 0 ? r < 0 || R->pos[r] < R->s : r >= 0 && R->pos[r] == R->pos[a] - R->d) carried = e;
    }
    if (carried < 0 || (sk.acc >= 0 && carried != sk.acc)) return false;
    sk.acc = carried;
    if (!same_meta(na, input_node(t, t->refs[a][carried]))) return false;
    /* the partial sums: only the next step reads them */
    if (c < R->k - 1 && (readers[a] != 1 || t->is_output[a])) return false;
    /* down the reshapes to the term, each read by the next only */
    int m = t->refs[a][1 - carried], views[3], nv = 0;
    while (m >= 0 && copy_at(R, m) == c && is_view(t->nodes[m]) && nv < 3) {
      if (readers[m] != 1 || t->is_output[m]) return false;
      views[nv++] = m;
      m = t->refs[m][0];
    }
    if (nv > 2 || m < 0 || copy_at(R, m) != c || !is_term(t, m) || readers[m] != 1 ||
        t->is_output[m])
      return false;
    if (t->nodes[m]->meta.dtype != na->meta.dtype) return false;
    int view[2] = {-1, -1};
    for (int v = 0; v < nv; v++) view[v] = offset_in(R, views[nv - 1 - v]);
    if (c == 0) {
      sk.term = offset_in(R, m);
      memcpy(sk.view, view, sizeof view);
    } else if (offset_in(R, m) != sk.term || memcmp(view, sk.view, sizeof view)) {
      return false;
    }
  }
  *out = sk;
  return true;
}

static void find_sinks(roller *R, const int *readers) {
  for (int q = 0; q < R->d; q++) {
    struct sink sk;
    if (R->sunk[q] || !sink_at(R, readers, q, &sk) || R->sunk[sk.term] ||
        !same_in_every_copy(R, sk.term) ||
        (sk.view[0] >= 0 && !same_in_every_copy(R, sk.view[0])) ||
        (sk.view[1] >= 0 && !same_in_every_copy(R, sk.view[1])))
      continue;
    R->sinks[R->nsinks++] = sk;
    R->sunk[sk.add] = R->sunk[sk.term] = true;
    for (int v = 0; v < 2; v++)
      if (sk.view[v] >= 0) R->sunk[sk.view[v]] = true;
  }
}

static vm_tensor *exec_op(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr) {
  vm_meta m;
  if (!vm_infer(op, n, in, attr, &m)) return NULL;
  return vm_backend_of((kiln_device)m.device)->exec(op, n, in, attr, &m);
}

static vm_tensor *value_of(const roller *R, int r) {
  return r < 0 ? R->t->leaves[-1 - r]->value : R->vals[r];
}

/* a transposed view of a dense 2-d value (h_{t-1}^T in a weight's gradient) */
static bool transposed(const vm_tensor *v) {
  return v->ndim == 2 && v->strides[0] == 1 && v->strides[1] == v->shape[0];
}

static const vm_attr transpose = {.perm = {1, 0}};

/* the k 2-d parts side by side, [a_0 .. a_k-1]; transposed parts (the
   usual case) are joined as rows of their dense sources, one copy each,
   and the result is their transpose (a view a GEMM reads as it is) */
static vm_tensor *join_columns(vm_tensor **parts, int k) {
  bool all = true;
  for (int c = 0; c < k && all; c++) all = transposed(parts[c]);
  if (!all) return exec_op(VM_OP_concat, k, parts, &(vm_attr){.axis = 1});
  vm_tensor **rows = calloc(k > 0 ? (size_t)k : 1, sizeof *rows), *joined = NULL, *out = NULL;
  bool ok = rows != NULL;
  for (int c = 0; ok && c < k; c++)
    ok = (rows[c] = exec_op(VM_OP_permute, 1, &parts[c], &transpose));
  if (ok) joined = exec_op(VM_OP_concat, k, rows, &(vm_attr){.axis = 0});
  if (joined) out = exec_op(VM_OP_permute, 1, &joined, &transpose);
  for (int c = 0; rows && c < k; c++) vm_release(rows[c]);
  free(rows);
  vm_release(joined);
  if (!rows) vm_error(KILN_ERR_OOM, "out of memory");
  return out;
}

/* The joins of one loop's sums: a GRU's gate gradients dg_t are joined
   for their weight's GEMM ([h_0 .. h_k-1] @ [dg_0; ..; dg_k-1]) and again
   for their bias's column sum, the same k parts in the same order: the
   second join is the first's tensor (it was a third of W10's join copies).
   Each sum joins rows once, so a loop has at most nsinks of them. */
typedef struct {
  int n, most, k;
  vm_tensor **parts;  /* join i's k parts, as joined: parts[i * k ..] */
  vm_tensor **joined; /* NULL: nothing is remembered (out of memory) */
} joins;

static joins joins_new(int most, int k) {
  joins J = {0, most, k, malloc((size_t)most * (size_t)k * sizeof *J.parts),
             malloc((size_t)most * sizeof *J.joined)};
  if (!J.parts || !J.joined) { /* remembering is an optimization */
    free(J.parts);
    free(J.joined);
    J.parts = J.joined = NULL;
  }
  return J;
}

static void joins_free(joins *J) {
  for (int i = 0; i < J->n; i++) vm_release(J->joined[i]);
  free(J->parts);
  free(J->joined);
}

/* the same elements in the same layout (a reshape of a part is another
   tensor over the same data) */
static bool same_view(const vm_tensor *a, const vm_tensor *b) {
  if (a == b) return true;
  if (a->dtype != b->dtype || a->ndim != b->ndim || vm_data(a) != vm_data(b)) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d]) return false;
  return true;
}

static bool same_parts(vm_tensor *const *a, vm_tensor *const *b, int k) {
  for (int c = 0; c < k; c++)
    if (!same_view(a[c], b[c])) return false;
  return true;
}

/* the k parts one after another along axis 0 (a new reference) */
static vm_tensor *join_rows(joins *J, vm_tensor **parts) {
  int k = J->k;
  for (int i = 0; i < J->n; i++)
    if (same_parts(J->parts + (size_t)i * k, parts, k)) return vm_retain(J->joined[i]);
  vm_tensor *joined = exec_op(VM_OP_concat, k, parts, &(vm_attr){.axis = 0});
  if (joined && J->joined && J->n < J->most) {
    memcpy(J->parts + (size_t)J->n * k, parts, (size_t)k * sizeof *parts);
    J->joined[J->n++] = vm_retain(joined);
  }
  return joined;
}

/* one sum after the loop: the term over every step's operands at once,
   through the same reshapes, added to where the sum started */
static vm_tensor *sink_sum(roller *R, const struct sink *sk, vm_tensor **parts, joins *J) {
  const tr_trace *t = R->t;
  int k = R->k, nin = t->nodes[R->at[R->s + sk->term]]->nin;
  for (int c = 0; c < k; c++) {
    int term = R->at[R->s + c * R->d + sk->term];
    for (int e = 0; e < nin; e++)
      if (!(parts[e * k + c] = value_of(R, t->refs[term][e]))) return NULL;
  }
  const tr_node *term = t->nodes[R->at[R->s + sk->term]];
  vm_tensor *a = NULL, *b = NULL, *v = NULL;
  if (term->op == VM_OP_matmul) { /* [a_0 .. a_k-1] @ [b_0; ..; b_k-1] */
    a = join_columns(parts, k);
    b = a ? join_rows(J, parts + k) : NULL;
    v = b ? exec_op(VM_OP_matmul, 2, (vm_tensor *[]){a, b}, &term->attr) : NULL;
  } else { /* the rows of every step, summed */
    a = join_rows(J, parts);
    v = a ? exec_op(VM_OP_sum, 1, &a, &term->attr) : NULL;
  }
  vm_release(a);
  vm_release(b);
  for (int i = 0; i < 2 && sk->view[i] >= 0 && v; i++) {
    const tr_node *view = t->nodes[R->at[R->s + sk->view[i]]];
    vm_tensor *w = exec_op(view->op, 1, &v, &view->attr);
    vm_release(v);
    v = w;
  }
  int first = R->at[R->s + sk->add];
  vm_tensor *acc0 = value_of(R, t->refs[first][sk->acc]), *sum[2];
  if (!v || !acc0) {
    vm_release(v);
    return NULL;
  }
  sum[sk->acc] = acc0;
  sum[1 - sk->acc] = v;
  vm_tensor *total = exec_op(VM_OP_add, 2, sum, &(vm_attr){0});
  vm_release(v);
  return total;
}

/* --- work leaves the loop before it ---

   Body ops that read only the steps' slices of a sequence (x[t]) and
   values the same in every step (weights) are computed for every step at
   once before the loop, each with the steps as a new leading axis: the
   input projection x_t @ W + b becomes one GEMM over [k, B, I] (RETURNN's
   optimization; ATen's GRU does the same).  A step reads its slice of the
   result.  What is hoisted: a slice of length 1 whose start advances by a
   constant d >= 1; elementwise ops, reshapes, slices and a matmul by an
   invariant 2-d matrix of hoisted values, every hoisted operand of the
   op's own rank (so that invariant operands broadcast as they did). */

/* input e of offset q, the same in every copy and from before the loop */
static bool invariant_input(const roller *R, int q, int e) {
  int r0 = R->t->refs[R->at[R->s + q]][e];
  if (r0 >= 0 && R->pos[r0] >= R->s) return false;
  for (int c = 1; c < R->k; c++)
    if (R->t->refs[R->at[R->s + c * R->d + q]][e] != r0) return false;
  return true;
}

/* input e of offset q, a hoisted node of the same copy (the same offset in
   every copy); its offset, or -1 */
static int hoisted_input(const roller *R, int q, int e) {
  int off = -1;
  for (int c = 0; c < R->k; c++) {
    int r = R->t->refs[R->at[R->s + c * R->d + q]][e];
    if (r < 0 || copy_at(R, r) != c) return -1;
    int o = (R->pos[r] - R->s) % R->d;
    if (!R->hoisted[o] || (off >= 0 && o != off)) return -1;
    off = o;
  }
  return off;
}

/* offset q is x[t]: a slice of length 1 of one source, advancing by >= 1 */
static bool stepped_slice(const roller *R, int q) {
  const tr_node *n0 = R->t->nodes[R->at[R->s + q]];
  if (n0->op != VM_OP_slice || n0->attr.step != 1 || n0->attr.stop - n0->attr.start != 1 ||
      !invariant_input(R, q, 0))
    return false;
  int64_t delta = R->k > 1 ? R->t->nodes[R->at[R->s + R->d + q]]->attr.start - n0->attr.start : 1;
  if (delta < 1) return false;
  for (int c = 1; c < R->k; c++) {
    const tr_node *n = R->t->nodes[R->at[R->s + c * R->d + q]];
    if (n->attr.axis != n0->attr.axis || n->attr.start != n0->attr.start + c * delta ||
        n->attr.stop != n->attr.start + 1 || n->attr.step != 1)
      return false;
  }
  return true;
}

static bool hoistable(const roller *R, int q) {
  const tr_trace *t = R->t;
  const tr_node *n0 = t->nodes[R->at[R->s + q]];
  if (R->sunk[q]) return false;
  if (stepped_slice(R, q)) return true;
  if (!same_in_every_copy(R, q)) return false;
  vm_kind kind = vm_op_table[n0->op].kind;
  bool elementwise = kind == VM_KIND_UNARY || kind == VM_KIND_BINARY || kind == VM_KIND_TERNARY;
  if (!elementwise && n0->op != VM_OP_reshape && n0->op != VM_OP_slice && n0->op != VM_OP_matmul)
    return false;
  if (vm_op_table[n0->op].flags & VM_F_EFFECT) return false;
  int hoisted = 0;
  for (int e = 0; e < n0->nin; e++) {
    int h = hoisted_input(R, q, e);
    if (h >= 0) { /* of the op's rank, but for views of it */
      if (t->nodes[R->at[R->s + h]]->meta.ndim != n0->meta.ndim && n0->op != VM_OP_reshape)
        return false;
      hoisted++;
    } else if (!invariant_input(R, q, e) || (!elementwise && !(n0->op == VM_OP_matmul && e == 1))) {
      return false;
    }
  }
  if (n0->op == VM_OP_matmul &&
      (hoisted_input(R, q, 0) < 0 || input_node(t, t->refs[R->at[R->s + q]][1])->meta.ndim != 2))
    return false;
  return hoisted > 0;
}

static void find_hoists(roller *R) {
  const tr_trace *t = R->t;
  int n = 0;
  for (int q = 0; q < R->d; q++) n += R->hoisted[q] = hoistable(R, q);
  if (!n) return;
  /* what must exist per step: read by a step's node or a sum, or after */
  for (int q = 0; q < R->d; q++) {
    if (!R->hoisted[q]) continue;
    for (int c = 0; c < R->k && !R->needed[q]; c++)
      R->needed[q] =
          t->is_output[R->at[R->s + c * R->d + q]] || R->outside_read[R->at[R->s + c * R->d + q]];
  }
  for (int p = R->s; p < R->end; p++) { /* a step's node, or a sum's term, reading one */
    int i = R->at[p];
    if (R->hoisted[(p - R->s) % R->d]) continue;
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e];
      if (r >= 0 && copy_at(R, r) == copy_at(R, i) && R->hoisted[(R->pos[r] - R->s) % R->d])
        R->needed[(R->pos[r] - R->s) % R->d] = true;
    }
  }
}

/* the hoisted values for every step, [k, ...]; false (and nothing hoisted)
   when one cannot be made as planned */
static bool hoist_before(roller *R) {
  const tr_trace *t = R->t;
  int k = R->k;
  bool ok = true;
  for (int q = 0; q < R->d && ok; q++) {
    if (!R->hoisted[q]) continue;
    int i0 = R->at[R->s + q];
    const tr_node *n0 = t->nodes[i0];
    vm_attr attr = n0->attr;
    vm_tensor *v = NULL;
    if (stepped_slice(R, q)) { /* the steps' slices along the axis, moved to the front */
      int64_t delta = k > 1 ? t->nodes[R->at[R->s + R->d + q]]->attr.start - attr.start : 1;
      int axis = attr.axis;
      vm_tensor *src = value_of(R, t->refs[i0][0]);
      attr.stop = attr.start + (k - 1) * delta + 1;
      attr.step = delta;
      vm_tensor *all = src ? exec_op(VM_OP_slice, 1, &src, &attr) : NULL, *front = NULL;
      vm_attr perm = {0};
      perm.perm[0] = axis;
      for (int d = 0, j = 1; d < n0->meta.ndim; d++)
        if (d != axis) perm.perm[j++] = d;
      if (all) front = exec_op(VM_OP_permute, 1, &all, &perm);
      vm_attr shape = {.ndim = n0->meta.ndim + 1};
      shape.shape[0] = k;
      memcpy(shape.shape + 1, n0->meta.shape, (size_t)n0->meta.ndim * sizeof(int64_t));
      if (front) v = exec_op(VM_OP_reshape, 1, &front, &shape);
      vm_release(all);
      vm_release(front);
    } else {
      vm_tensor *ins[3];
      for (int e = 0; e < n0->nin; e++) {
        int h = hoisted_input(R, q, e);
        ins[e] = h >= 0 ? R->batched[h] : value_of(R, t->refs[i0][e]);
        ok = ok && ins[e];
      }
      if (n0->op == VM_OP_slice) attr.axis += 1;
      if (n0->op == VM_OP_reshape) {
        attr.ndim = n0->meta.ndim + 1;
        attr.shape[0] = k;
        memcpy(attr.shape + 1, n0->meta.shape, (size_t)n0->meta.ndim * sizeof(int64_t));
      }
      if (ok) v = exec_op(n0->op, n0->nin, ins, &attr);
    }
    /* [k, the step's shape], or nothing is hoisted */
    ok = v && v->ndim == n0->meta.ndim + 1 && v->shape[0] == k &&
         !memcmp(v->shape + 1, n0->meta.shape, (size_t)n0->meta.ndim * sizeof(int64_t)) &&
         v->dtype == n0->meta.dtype;
    R->batched[q] = v;
  }
  if (!ok) {
    for (int q = 0; q < R->d; q++) {
      vm_release(R->batched[q]);
      R->batched[q] = NULL;
      R->hoisted[q] = false;
    }
    vm_clear_error();
  }
  return ok;
}

static int hoists(const roller *R) {
  int n = 0;
  for (int q = 0; q < R->d; q++) n += R->hoisted[q];
  return n;
}

/* step c's slice of a hoisted value */
static vm_tensor *hoisted_step(roller *R, int q, int c) {
  const tr_node *n = R->t->nodes[R->at[R->s + c * R->d + q]];
  vm_tensor *one = exec_op(VM_OP_slice, 1, &R->batched[q],
                           &(vm_attr){.axis = 0, .start = c, .stop = c + 1, .step = 1}),
            *v = NULL;
  vm_attr shape = {.ndim = n->meta.ndim};
  memcpy(shape.shape, n->meta.shape, (size_t)n->meta.ndim * sizeof(int64_t));
  if (one) v = exec_op(VM_OP_reshape, 1, &one, &shape);
  vm_release(one);
  return v;
}

/* --- per-step products leave the loop after it ---

   A backward loop computes each step's input gradient dx_t = dg_t @ W_x^T
   (a GEMM per step) that nothing in the loop reads: only the nodes after
   it do (the concat that joins the slices' gradients).  Such a product,
   with the views after it, leaves the loop: the steps keep a_t, and
   after the loop one GEMM [a_0; ..; a_{k-1}] @ W gives every step's rows
   at once, each step's value a view of its rows.  W must be the same in
   every step: invariant, or a view (a transpose) of an invariant value
   taken in the step.  The GEMM's rows are the steps' products, computed
   in one call, in both modes alike. */

/* a value of the same copy c as node i (offset o), computed in the step: *o */
static bool same_copy(const roller *R, int r, int c, int *o) {
  if (r < 0 || copy_at(R, r) != c) return false;
  *o = offset_in(R, r);
  return true;
}

/* input 1 of offset q: the same in every copy (invariant, or a view taken
   in each step of one invariant value) */
static bool same_rhs(const roller *R, int q) {
  if (invariant_input(R, q, 1)) return true;
  int o = -1;
  for (int c = 0; c < R->k; c++) {
    int oc;
    if (!same_copy(R, R->t->refs[R->at[R->s + c * R->d + q]][1], c, &oc) || (c && oc != o))
      return false;
    o = oc;
  }
  const tr_node *v = R->t->nodes[R->at[R->s + o]];
  return !R->sunk[o] && is_view(v) && same_in_every_copy(R, o) && invariant_input(R, o, 0);
}

static bool map_at(const roller *R, const int *inner, const int *inner_reader, const int *readers,
                   int q, struct map *out) {
  const tr_trace *t = R->t;
  struct map mp = {.mm = q, .view = {-1, -1}};
  for (int c = 0; c < R->k; c++) {
    int i = R->at[R->s + c * R->d + q];
    const tr_node *n = t->nodes[i];
    if (n->op != VM_OP_matmul || n->nin != 2 || !vm_dtype_is_float(n->meta.dtype)) return false;
    for (int e = 0; e < 2; e++) {
      const tr_node *x = input_node(t, t->refs[i][e]);
      if (x->meta.ndim != 2 || x->meta.dtype != n->meta.dtype) return false;
    }
    /* a_t: a value of this step (not one computed after the loop), or of
       before the loop */
    int r0 = t->refs[i][0], o0;
    if (r0 >= 0 && copy_at(R, r0) >= 0 && (!same_copy(R, r0, c, &o0) || R->sunk[o0])) return false;
    /* down the views to what is read after the loop only */
    int m = i, view[2] = {-1, -1}, nv = 0;
    while (inner[m] == 1 && readers[m] == 1 && !t->is_output[m] && nv < 2) {
      int r = inner_reader[m];
      if (copy_at(R, r) != c || !is_view(t->nodes[r])) return false;
      view[nv++] = offset_in(R, r);
      m = r;
    }
    if (inner[m] != 0) return false;
    if (c == 0)
      memcpy(mp.view, view, sizeof view);
    else if (memcmp(view, mp.view, sizeof view))
      return false;
  }
  if (!same_in_every_copy(R, q) || !same_rhs(R, q)) return false;
  for (int v = 0; v < 2; v++)
    if (mp.view[v] >= 0 && (R->sunk[mp.view[v]] || !same_in_every_copy(R, mp.view[v])))
      return false;
  *out = mp;
  return true;
}

static void find_maps(roller *R, const int *readers, const int *inner, const int *inner_reader) {
  const tr_trace *t = R->t;
  for (int q = 0; q < R->d; q++) {
    struct map mp;
    if (R->sunk[q] || t->nodes[R->at[R->s + q]]->op != VM_OP_matmul ||
        !map_at(R, inner, inner_reader, readers, q, &mp))
      continue;
    R->maps[R->nmaps++] = mp;
    R->sunk[q] = R->mapped[q] = true;
    for (int v = 0; v < 2; v++)
      if (mp.view[v] >= 0) R->sunk[mp.view[v]] = R->mapped[mp.view[v]] = true;
  }
}

/* what leaves the loop after it (its sums, then its maps), found from one
   count of each node's readers: all of them, those in the loop, and one
   of those */
static void find_after(roller *R) {
  const tr_trace *t = R->t;
  int n = t->n;
  int *readers = calloc((size_t)n, sizeof *readers), *inner = calloc((size_t)n, sizeof *inner),
      *inner_reader = malloc((size_t)n * sizeof *inner_reader);
  if (readers && inner && inner_reader) { /* else nothing leaves the loop */
    for (int i = 0; i < n; i++)
      for (int e = 0; e < t->nodes[i]->nin; e++) {
        int r = t->refs[i][e];
        if (r < 0) continue;
        readers[r]++;
        if (copy_at(R, i) < R->k) {
          inner[r]++;
          inner_reader[r] = i;
        }
      }
    find_sinks(R, readers);
    find_maps(R, readers, inner, inner_reader);
  }
  free(readers);
  free(inner);
  free(inner_reader);
}

/* one map after the loop: every step's a_t joined as rows, one GEMM, each
   step's value the view of its rows (through the same views) */
static int run_map(roller *R, const struct map *mp, vm_tensor **parts, joins *J, int *failed) {
  const tr_trace *t = R->t;
  int k = R->k, first = R->at[R->s + mp->mm];
  const tr_node *n0 = t->nodes[first];
  for (int c = 0; c < k; c++)
    if (!(parts[c] = value_of(R, t->refs[R->at[R->s + c * R->d + mp->mm]][0]))) {
      *failed = first;
      return vm_error(KILN_ERR_INTERNAL, "rolled loop: a step's operand is missing");
    }
  vm_tensor *w = value_of(R, t->refs[first][1]);
  vm_tensor *a = w ? join_rows(J, parts) : NULL;
  vm_tensor *all = a ? exec_op(VM_OP_matmul, 2, (vm_tensor *[]){a, w}, &n0->attr) : NULL;
  vm_release(a);
  int64_t rows = n0->meta.shape[0];
  for (int c = 0; c < k && all; c++) {
    int i = R->at[R->s + c * R->d + mp->mm];
    vm_tensor *v =
        exec_op(VM_OP_slice, 1, &all,
                &(vm_attr){.axis = 0, .start = c * rows, .stop = (c + 1) * rows, .step = 1});
    R->vals[i] = v;
    for (int x = 0; x < 2 && mp->view[x] >= 0 && v; x++) {
      i = R->at[R->s + c * R->d + mp->view[x]];
      R->vals[i] = v = exec_op(t->nodes[i]->op, 1, &v, &t->nodes[i]->attr);
    }
    if (!v) {
      first = i;
      break;
    }
  }
  bool ok = all != NULL && R->vals[R->at[R->s + (k - 1) * R->d + mp->mm]];
  vm_release(all);
  if (ok) return KILN_OK;
  *failed = first;
  return vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
}

/* what leaves the loop after it: its sums, then its maps (which often
   join the same rows as a sum: dg_t for dW_x and again for dx_t) */
static int after_the_loop(roller *R, int *failed) {
  vm_tensor **parts = malloc((size_t)R->k * 2 * sizeof *parts);
  if (!parts) return vm_error(KILN_ERR_OOM, "out of memory");
  int rc = KILN_OK;
  joins J = joins_new(R->nsinks + R->nmaps, R->k);
  for (int x = 0; x < R->nsinks && rc == KILN_OK; x++) {
    int last = R->at[R->s + (R->k - 1) * R->d + R->sinks[x].add];
    if (!(R->vals[last] = sink_sum(R, &R->sinks[x], parts, &J))) {
      *failed = last;
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
    }
  }
  for (int x = 0; x < R->nmaps && rc == KILN_OK; x++)
    rc = run_map(R, &R->maps[x], parts, &J, failed);
  joins_free(&J);
  free(parts);
  return rc;
}

static bool roller_init(roller *R, const tr_trace *t, const tr_loop *lp, vm_tensor **vals) {
  memset(R, 0, sizeof *R);
  int n = t->n, edges = 0;
  for (int i = 0; i < n; i++) edges += t->nodes[i]->nin;
  R->t = t;
  R->vals = vals;
  R->s = lp->start;
  R->d = lp->body;
  R->k = lp->copies;
  R->end = lp->start + lp->body * lp->copies;
  R->at = malloc((size_t)n * sizeof *R->at);
  R->pos = malloc((size_t)n * sizeof *R->pos);
  R->outside_read = calloc((size_t)n, sizeof *R->outside_read);
  R->body_out = calloc((size_t)R->d, sizeof *R->body_out);
  R->drop = malloc((size_t)n * sizeof *R->drop);
  R->drop_at = calloc((size_t)R->k + 2, sizeof *R->drop_at);
  R->sinks = malloc((size_t)R->d * sizeof *R->sinks);
  R->sunk = calloc((size_t)R->d, sizeof *R->sunk);
  R->maps = malloc((size_t)R->d * sizeof *R->maps);
  R->mapped = calloc((size_t)R->d, sizeof *R->mapped);
  R->hoisted = calloc((size_t)R->d, sizeof *R->hoisted);
  R->batched = calloc((size_t)R->d, sizeof *R->batched);
  R->needed = calloc((size_t)R->d, sizeof *R->needed);
  R->list = malloc((size_t)n * sizeof *R->list);
  R->edges = malloc((size_t)(edges ? edges : 1) * sizeof *R->edges);
  R->svals = calloc((size_t)n, sizeof *R->svals);
  R->shells = malloc((size_t)(edges ? edges : 1) * sizeof *R->shells); /* cleared as used */
  R->local = malloc((size_t)n * sizeof *R->local);
  R->local_stamp = calloc((size_t)n, sizeof *R->local_stamp);
  /* slots: trace nodes, the trace's leaves, joined values (join_steps) */
  R->leaf = malloc((size_t)(n + t->nleaves + edges + 1) * sizeof *R->leaf);
  R->leaf_stamp = calloc((size_t)(n + t->nleaves + edges + 1), sizeof *R->leaf_stamp);
  R->sub.nodes = malloc((size_t)n * sizeof *R->sub.nodes);
  R->sub.refs = malloc((size_t)n * sizeof *R->sub.refs);
  R->sub.leaves = malloc((size_t)(edges ? edges : 1) * sizeof *R->sub.leaves);
  R->sub.is_output = malloc((size_t)n * sizeof *R->sub.is_output);
  R->sub.device = t->device;
  R->in_seg = calloc((size_t)n, sizeof *R->in_seg);
  R->over = calloc((size_t)n, sizeof *R->over);
  R->over_node = malloc((size_t)n * sizeof *R->over_node);
  R->over_refs = calloc((size_t)n, sizeof *R->over_refs);
  R->over_edges = malloc((size_t)(edges ? edges : 1) * sizeof *R->over_edges);
  R->joined = calloc((size_t)(edges ? edges : 1), sizeof *R->joined);
  if (!R->in_seg || !R->over || !R->over_node || !R->over_refs || !R->over_edges || !R->joined)
    return false;
  if (!R->at || !R->pos || !R->outside_read || !R->body_out || !R->drop || !R->drop_at ||
      !R->sinks || !R->sunk || !R->maps || !R->mapped || !R->hoisted || !R->batched || !R->needed ||
      !R->list || !R->edges || !R->svals || !R->shells || !R->local || !R->local_stamp ||
      !R->leaf || !R->leaf_stamp || !R->sub.nodes || !R->sub.refs || !R->sub.leaves ||
      !R->sub.is_output)
    return false;
  record_order(t, R->at);
  for (int p = 0; p < n; p++) R->pos[R->at[p]] = p;
  /* who reads what across segments and copies */
  for (int i = 0; i < n; i++) {
    int ci = copy_at(R, i);
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e];
      if (r < 0) continue;
      int cr = copy_at(R, r);
      if (cr != ci) R->outside_read[r] = true;
    }
  }
  for (int p = R->s; p < R->end; p++) {
    int i = R->at[p];
    if (t->is_output[i] || R->outside_read[i]) R->body_out[(p - R->s) % R->d] = true;
  }
  find_after(R);
  find_hoists(R);
  /* a value of the loop goes after the last step that reads it (the copy
     after its own, in the trace the loop was found in; any later one in
     another trace of the key that recorded its nodes in another order:
     segments by record position are right for any order, their keys
     decide what they share), unless it is an output or read after the
     loop */
  int *last = R->local; /* scratch: the last copy reading each node */
  for (int p = R->s; p < R->end; p++) last[R->at[p]] = copy_at(R, R->at[p]);
  for (int i = 0; i < n; i++) {
    int ci = copy_at(R, i);
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e], cr = r >= 0 ? copy_at(R, r) : -1;
      if (cr >= 0 && cr < R->k && ci > last[r]) last[r] = ci;
    }
  }
  for (int x = 0; x < R->nsinks + R->nmaps; x++) /* what sums and maps read is kept for after */
    for (int c = 0; c < R->k; c++) {
      int term =
          R->at[R->s + c * R->d + (x < R->nsinks ? R->sinks[x].term : R->maps[x - R->nsinks].mm)];
      for (int e = 0; e < t->nodes[term]->nin; e++) {
        int r = t->refs[term][e];
        if (r >= 0 && copy_at(R, r) >= 0 && copy_at(R, r) < R->k) {
          last[r] = R->k;
          R->body_out[(R->pos[r] - R->s) % R->d] = true;
        }
      }
    }
  for (int p = R->s; p < R->end; p++) {
    int i = R->at[p];
    if (last[i] < R->k && !t->is_output[i]) R->drop_at[last[i] + 1]++;
  }
  for (int c = 0; c <= R->k; c++) R->drop_at[c + 1] += R->drop_at[c];
  int *fill = R->local_stamp; /* scratch: where each step's list is filled */
  memcpy(fill, R->drop_at, (size_t)(R->k + 1) * sizeof *fill);
  for (int p = R->s; p < R->end; p++) {
    int i = R->at[p];
    if (last[i] < R->k && !t->is_output[i]) R->drop[fill[last[i]]++] = i;
  }
  memset(R->local_stamp, 0, (size_t)n * sizeof *R->local_stamp);
  return true;
}

static void roller_free(roller *R) {
  free(R->at);
  free(R->pos);
  free(R->outside_read);
  free(R->body_out);
  free(R->drop);
  free(R->drop_at);
  free(R->sinks);
  free(R->sunk);
  free(R->maps);
  free(R->mapped);
  for (int q = 0; R->batched && q < R->d; q++) vm_release(R->batched[q]);
  free(R->hoisted);
  free(R->batched);
  free(R->needed);
  free(R->list);
  free(R->edges);
  free(R->svals);
  free(R->shells);
  free(R->local);
  free(R->local_stamp);
  free(R->leaf);
  free(R->leaf_stamp);
  free(R->sub.nodes);
  free(R->sub.refs);
  free(R->sub.leaves);
  free(R->sub.is_output);
  for (int j = 0; R->joined && j < R->njoined; j++) vm_release(R->joined[j]);
  free(R->in_seg);
  free(R->over);
  free(R->over_node);
  free(R->over_refs);
  free(R->over_edges);
  free(R->joined);
}

/* Makes R->sub of the m trace nodes in R->list (an order inputs-first),
   with outputs R->sub.is_output set by the caller afterwards.  An input
   from outside the list is a leaf: the trace's own leaf, or a shell node
   holding the value another segment computed (numbered by first use). */
static int build_sub(roller *R, int m) {
  const tr_trace *t = R->t;
  tr_trace *sub = &R->sub;
  int stamp = ++R->stamp, *next = R->edges, n = t->n;
  sub->n = m;
  sub->nleaves = 0;
  for (int x = 0; x < m; x++) {
    R->local[R->list[x]] = x;
    R->local_stamp[R->list[x]] = stamp;
  }
  for (int x = 0; x < m; x++) {
    int i = R->list[x];
    tr_node *node = R->over[x] ? R->over[x] : t->nodes[i];
    const int *refs = R->over[x] ? R->over_refs[x] : t->refs[i];
    sub->nodes[x] = node;
    sub->refs[x] = next;
    next += node->nin;
    for (int e = 0; e < node->nin; e++) {
      int r = refs[e];
      if (r >= 0 && R->local_stamp[r] == stamp) {
        sub->refs[x][e] = R->local[r];
        continue;
      }
      int slot = IS_JOINED(r) ? n + t->nleaves + (r - INT_MIN) : r >= 0 ? r : n + (-1 - r);
      if (R->leaf_stamp[slot] != stamp) {
        int j = sub->nleaves++;
        R->leaf_stamp[slot] = stamp;
        R->leaf[slot] = j;
        if (IS_JOINED(r)) {
          vm_tensor *v = R->joined[r - INT_MIN];
          tr_node *shell = &R->shells[j];
          memset(shell, 0, sizeof *shell);
          shell->meta = (vm_meta){.dtype = v->dtype,
                                  .compute = v->dtype,
                                  .device = (uint8_t)v->storage->device,
                                  .ndim = v->ndim};
          memcpy(shell->meta.shape, v->shape, (size_t)v->ndim * sizeof *v->shape);
          shell->value = v;
          shell->state = TR_MATERIALIZED;
          sub->leaves[j] = shell;
        } else if (r < 0) {
          sub->leaves[j] = t->leaves[-1 - r];
        } else {
          if (!R->vals[r])
            return vm_error(KILN_ERR_INTERNAL,
                            "rolled loop: a value of another segment is missing");
          tr_node *shell = &R->shells[j];
          memset(shell, 0, sizeof *shell);
          shell->meta = t->nodes[r]->meta;
          shell->value = R->vals[r];
          shell->state = TR_MATERIALIZED;
          sub->leaves[j] = shell;
        }
      }
      sub->refs[x][e] = -1 - R->leaf[slot];
    }
  }
  return KILN_OK;
}

/* --- the steps' values joined before a segment ---
   The nodes around a loop may read a value of every step at once: the
   stack of the states after it (kiln_stack: a reshape of each step's h,
   then a concat), or in backward the gradient of every step's slice x[t]
   (a concat of each step's dx, the first step's computed in the segment
   itself).  Such a concat has as many inputs as the loop has copies, and
   the segment a key (and a family) for every trip count.  Before a
   segment runs, each run of two or more inputs of a concat of three or
   more that other segments computed (directly, or through a reshape of
   their own) is joined into one value, which the segment reads as one
   leaf: its trace is the same at every length, and a concat of a concat
   copies the same bytes.  A concat whose inputs all come from outside is
   made here whole.  Both modes run it. */

/* the value of ref r made outside the segment, or NULL */
static vm_tensor *outside_value(const roller *R, int r) {
  return r >= 0 && R->in_seg[r] ? NULL : value_of(R, r);
}

/* runs node i of the trace here, on its inputs' values made outside the
   segment being built (a step's slice x[t], a join, a waiting view) */
static int run_here(roller *R, int i, int *failed) {
  const tr_node *node = R->t->nodes[i];
  vm_tensor *few[3], **ins = node->nin <= 3 ? few : malloc((size_t)node->nin * sizeof *ins);
  if (!ins) return vm_error(KILN_ERR_OOM, "out of memory running a loop");
  for (int e = 0; e < node->nin; e++)
    if (!(ins[e] = outside_value(R, R->t->refs[i][e]))) {
      if (ins != few) free(ins);
      return vm_error(KILN_ERR_INTERNAL,
                      "rolled loop: a value made outside the segment is missing");
    }
  const vm_backend *be = vm_backend_of((kiln_device)node->meta.device);
  R->vals[i] = be->exec(node->op, node->nin, ins, &node->attr, &node->meta);
  if (ins != few) free(ins);
  if (R->vals[i]) return KILN_OK;
  *failed = i;
  return vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
}

/* a reshape in the segment of a value made outside it */
static bool outside_view(const roller *R, int r) {
  if (r < 0 || !R->in_seg[r]) return false;
  const tr_node *v = R->t->nodes[r];
  return v->op == VM_OP_reshape && v->nin == 1 && outside_value(R, R->t->refs[r][0]);
}

static int join_steps(roller *R, int *m_io, int *failed) {
  const tr_trace *t = R->t;
  int m = *m_io, rc = KILN_OK, *edges = R->over_edges;
  for (int x = 0; x < m; x++) R->in_seg[R->list[x]] = true;
  for (int x = 0; x < m && rc == KILN_OK; x++) {
    int i = R->list[x];
    const tr_node *node = t->nodes[i];
    if (node->op != VM_OP_concat || node->nin < 3) continue;
    int outside = 0;
    for (int e = 0; e < node->nin; e++) {
      int r = t->refs[i][e];
      outside += outside_value(R, r) != NULL || outside_view(R, r);
    }
    if (outside < 2) continue;
    for (int e = 0; e < node->nin && rc == KILN_OK; e++) { /* the views first, here */
      int r = t->refs[i][e];
      if (outside_view(R, r) && (rc = run_here(R, r, failed)) == KILN_OK) R->in_seg[r] = false;
    }
    if (rc != KILN_OK) break;
    if (outside == node->nin) { /* all of it */
      if ((rc = run_here(R, i, failed)) == KILN_OK) R->in_seg[i] = false;
      atomic_fetch_add_explicit(&vm_process()->stats.loop_joins, 1, memory_order_relaxed);
      continue;
    }
    /* runs of two or more outside inputs, each one joined value */
    int nin = 0, *refs = edges;
    for (int e = 0; e < node->nin && rc == KILN_OK;) {
      int run = 0;
      while (e + run < node->nin && outside_value(R, t->refs[i][e + run])) run++;
      if (run < 2) {
        refs[nin++] = t->refs[i][e++];
        continue;
      }
      vm_tensor **ins = malloc((size_t)run * sizeof *ins);
      if (!ins) {
        rc = vm_error(KILN_ERR_OOM, "out of memory running a loop");
        break;
      }
      for (int q = 0; q < run; q++) ins[q] = outside_value(R, t->refs[i][e + q]);
      vm_tensor *v = exec_op(VM_OP_concat, run, ins, &node->attr);
      free(ins);
      if (!v) {
        *failed = i;
        rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
        break;
      }
      R->joined[R->njoined] = v;
      refs[nin++] = JOINED(R->njoined++);
      e += run;
    }
    if (rc != KILN_OK) break;
    if (nin == node->nin) continue;               /* no run of two */
    memcpy(&R->over_node[x], node, sizeof *node); /* the concat over the joined runs */
    R->over_node[x].nin = nin;
    R->over[x] = &R->over_node[x];
    R->over_refs[x] = refs;
    edges += nin;
    atomic_fetch_add_explicit(&vm_process()->stats.loop_joins, 1, memory_order_relaxed);
  }
  /* the nodes made here leave the segment */
  int kept = 0;
  for (int x = 0; x < m; x++) {
    int i = R->list[x];
    if (!R->in_seg[i]) {
      R->over[x] = NULL;
      continue;
    }
    if (kept != x) {
      R->list[kept] = i;
      R->sub.is_output[kept] = R->sub.is_output[x];
      R->over[kept] = NULL;
      if (R->over[x]) {
        memcpy(&R->over_node[kept], &R->over_node[x], sizeof R->over_node[x]);
        R->over[kept] = &R->over_node[kept];
        R->over_refs[kept] = R->over_refs[x];
      }
      R->over[x] = NULL;
    }
    kept++;
  }
  for (int x = 0; x < m; x++) R->in_seg[R->list[x]] = false;
  *m_io = kept;
  return rc;
}

/* runs the segment in R->list (m nodes, outputs set); its outputs' values
   move into the flush's */
static int run_sub(roller *R, tr_segment_runner *run, int m, int segment, int *failed) {
  int rc = segment == TR_SEGMENT_STEP ? KILN_OK : join_steps(R, &m, failed);
  if (rc == KILN_OK) rc = build_sub(R, m);
  for (int x = 0; x < m; x++) R->over[x] = NULL;
  int sub_failed = -1;
  memset(R->svals, 0, (size_t)m * sizeof *R->svals);
  if (rc == KILN_OK && m > 0) rc = run->run(run, &R->sub, segment, R->svals, &sub_failed);
  for (int j = 0; j < R->njoined; j++) vm_release(R->joined[j]);
  R->njoined = 0;
  if (sub_failed >= 0 && sub_failed < m) *failed = R->list[sub_failed];
  for (int x = 0; x < m; x++) {
    if (rc == KILN_OK && R->sub.is_output[x] && !R->vals[R->list[x]])
      R->vals[R->list[x]] = R->svals[x];
    else
      vm_release(R->svals[x]);
    R->svals[x] = NULL;
  }
  return rc;
}

/* a slice of a value from outside copy c: what a step advances (x[:, t]);
   taken as a view before the step runs, so that the step's trace is the
   same for every copy */
static bool stepped(const roller *R, int i, int c) {
  const tr_node *node = R->t->nodes[i];
  if (node->op != VM_OP_slice) return false;
  for (int e = 0; e < node->nin; e++) {
    int r = R->t->refs[i][e];
    if (r >= 0 && copy_at(R, r) == c) return false;
  }
  return true;
}

/* the loop's values no step after c reads, nor anything after the loop */
static void drop_after(roller *R, int c) {
  for (int x = R->drop_at[c]; x < R->drop_at[c + 1]; x++) {
    vm_release(R->vals[R->drop[x]]);
    R->vals[R->drop[x]] = NULL;
  }
}

/* --- views one step reads wait for it ---
   A backward loop reads a value of its own per step, made before the loop
   from one value of all of them: the gradient of kiln_stack, a slice of
   it per step (then a reshape).  Left in the segment before the loop,
   those views make it a key for every trip count.  A view (a slice,
   reshape or permute) recorded before the loop that only the steps of one
   copy read (directly, or through views that wait too) is made after
   that segment, here, as the steps' slices of x are: it moves no data. */
static bool waiting_view(const tr_node *n) {
  return n->nin == 1 && (n->op == VM_OP_slice || n->op == VM_OP_reshape || n->op == VM_OP_permute);
}

/* marks wait[i] for each such view; false on OOM */
static bool find_waiting(roller *R, bool *wait) {
  const tr_trace *t = R->t;
  int n = t->n;
  int *copy =
      malloc((size_t)n * sizeof *copy); /* the one copy reading i: -1 none yet, -2 several */
  if (!copy) return false;
  for (int i = 0; i < n; i++) copy[i] = -1;
  /* readers come after what they read: from the last node back, each
     node's own copy (or its waiting copy) is known before its inputs' */
  for (int i = n - 1; i >= 0; i--) {
    int ci = copy_at(R, i);
    if (ci < 0) { /* before the loop */
      wait[i] = copy[i] >= 0 && waiting_view(t->nodes[i]) && !t->is_output[i];
      ci = wait[i] ? copy[i] : -2;
    } else if (ci >= R->k) {
      ci = -2; /* after the loop */
    }
    for (int e = 0; e < t->nodes[i]->nin; e++) {
      int r = t->refs[i][e];
      if (r < 0) continue;
      copy[r] = copy[r] == -1 ? ci : copy[r] == ci ? ci : -2;
    }
  }
  free(copy);
  return true;
}

/* --- the steps' fixed operands ---
   The values every step reads alike (the weights, made before the loop)
   cannot change while the steps run: their storages are named fixed
   (vm/gemm_f32.h), so a step's product by one (h @ W_hh, or dg @ W_hhᵀ
   through the step's own transpose) packs it for the first step only. */
static void fix_invariants(const roller *R) {
  vm_gemm_fixed_begin();
  for (int q = 0; q < R->d; q++) {
    const tr_node *n0 = R->t->nodes[R->at[R->s + q]];
    for (int e = 0; e < n0->nin; e++) {
      if (!invariant_input(R, q, e)) continue;
      const vm_tensor *v = value_of(R, R->t->refs[R->at[R->s + q]][e]);
      if (v && v->storage && v->storage->device == KILN_CPU) vm_gemm_fixed_add(v->storage);
    }
  }
}

int tr_loop_run(const tr_trace *t, const tr_loop *lp, tr_segment_runner *run, vm_tensor **vals,
                int *failed) {
  roller R;
  int rc = KILN_OK;
  if (!roller_init(&R, t, lp, vals)) {
    roller_free(&R);
    return vm_error(KILN_ERR_OOM, "out of memory running a loop");
  }
  /* before the loop: nodes recorded before it, in the trace's order, but
     the views one step reads, made after it (what they read is kept) */
  bool *wait = calloc((size_t)(t->n ? t->n : 1), sizeof *wait);
  if (!wait || !find_waiting(&R, wait)) {
    free(wait);
    roller_free(&R);
    return vm_error(KILN_ERR_OOM, "out of memory running a loop");
  }
  bool *keep = R.in_seg; /* scratch: read by a waiting view */
  for (int i = 0; i < t->n; i++)
    for (int e = 0; wait[i] && e < t->nodes[i]->nin; e++)
      if (t->refs[i][e] >= 0) keep[t->refs[i][e]] = true;
  int m = 0;
  for (int i = 0; i < t->n; i++)
    if (R.pos[i] < R.s && !wait[i]) {
      R.sub.is_output[m] = t->is_output[i] || R.outside_read[i] || keep[i];
      R.list[m++] = i;
    }
  for (int i = 0; i < t->n; i++) keep[i] = false;
  if (m) rc = run_sub(&R, run, m, TR_SEGMENT_BEFORE, failed);
  for (int i = 0; i < t->n && rc == KILN_OK; i++)
    if (wait[i]) rc = run_here(&R, i, failed);
  free(wait);
  if (rc == KILN_OK && hoists(&R) && hoist_before(&R))
    atomic_fetch_add_explicit(&vm_process()->stats.loop_hoists, (uint_fast64_t)hoists(&R),
                              memory_order_relaxed);
  fix_invariants(&R);
  for (int c = 0; c < R.k && rc == KILN_OK; c++) {
    m = 0;
    for (int q = 0; q < R.d && rc == KILN_OK; q++) {
      int i = R.at[R.s + c * R.d + q];
      if (R.sunk[q]) continue;
      if (R.hoisted[q]) {
        if (R.needed[q] && !(vals[i] = hoisted_step(&R, q, c))) {
          *failed = i;
          rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
        }
        continue;
      }
      if (stepped(&R, i, c)) {
        rc = run_here(&R, i, failed);
      } else {
        R.sub.is_output[m] = R.body_out[q];
        R.list[m++] = i;
      }
    }
    if (rc == KILN_OK && m) rc = run_sub(&R, run, m, TR_SEGMENT_STEP, failed);
    drop_after(&R, c);
  }
  vm_gemm_fixed_end();
  if (rc == KILN_OK && (R.nsinks || R.nmaps)) {
    rc = after_the_loop(&R, failed);
    atomic_fetch_add_explicit(&vm_process()->stats.loop_sums, (uint_fast64_t)R.nsinks,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&vm_process()->stats.loop_maps, (uint_fast64_t)R.nmaps,
                              memory_order_relaxed);
  }
  m = 0;
  for (int i = 0; i < t->n; i++)
    if (R.pos[i] >= R.end) {
      R.sub.is_output[m] = t->is_output[i];
      R.list[m++] = i;
    }
  if (m && rc == KILN_OK) rc = run_sub(&R, run, m, TR_SEGMENT_AFTER, failed);
  roller_free(&R);
  return rc;
}

void tr_loop_dump(const tr_trace *t, const tr_loop *lp, const uint64_t key[2],
                  const uint64_t step_key[2]) {
  const char *dir = getenv("KILN_DUMP");
  if (!dir || !*dir) return;
  roller R;
  char *text = NULL;
  size_t len = 0;
  FILE *f = roller_init(&R, t, lp, NULL) ? open_memstream(&text, &len) : NULL;
  if (f) {
    fprintf(f,
            "# loop in trace %016llx%016llx: %d copies of a %d-node body from record position %d\n"
            "# inputs: %d carried, %d invariant, %d stepped, %d per step; outputs: %d last, "
            "%d stacked\n# body %016llx; steps run as key %016llx%016llx\n",
            (unsigned long long)key[1], (unsigned long long)key[0], lp->copies, lp->body, lp->start,
            lp->carried, lp->invariant, lp->stepped, lp->per_step, lp->last_outputs,
            lp->stacked_outputs, (unsigned long long)lp->body_hash, (unsigned long long)step_key[1],
            (unsigned long long)step_key[0]);
    for (int q = 0; q < R.d; q++) {
      const tr_node *n = t->nodes[R.at[R.s + q]];
      fprintf(f, "%3d %-12s %s\n", q, vm_op_table[n->op].name,
              R.hoisted[q]                    ? "before the loop, for every step at once"
              : R.mapped[q]                   ? "after the loop, for every step at once"
              : R.sunk[q]                     ? "after the loop, summed over the steps"
              : stepped(&R, R.at[R.s + q], 0) ? "per step, a view taken before it"
                                              : "per step");
    }
    fclose(f);
    char name[64];
    snprintf(name, sizeof name, "loop-%016llx%016llx.txt", (unsigned long long)key[1],
             (unsigned long long)key[0]);
    tr_dump_text(name, text);
  }
  free(text);
  roller_free(&R);
}
