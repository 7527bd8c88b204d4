/* test_loops.c — loops (trace/loop.h, DESIGN §12).  Detection: a recurrent
 * cell written per time step, as users write it, is found as one body
 * repeated once per step, with the same body (structure hash) whatever the
 * trip count; inputs are classified (carried state, invariant weights,
 * stepped slices of the sequence, by +1, -1 or 2); bodies that almost
 * repeat are not taken for loops.  Rolling: the loop runs as one step
 * trace per copy, with one step key for every length, forward and
 * backward; results equal the unrolled program's bit for bit
 * (KILN_ROLL_LOOPS=0), with the JIT on and off, f32 and f64, for every
 * kind of input, output and almost-repeat.  Counts, never times.  With
 * KILN_DEVICE=cuda (test_loops_cuda_emulated) all of it on the device. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "../trace/inspect.h"
#include "ktest.h"

enum { B = 4, I = 3, H = 5 };
typedef enum { TANH_RNN, GRU, LSTM } cell_kind;

static tr_flush_info last_flush(void) {
  tr_flush_info info;
  memset(&info, 0, sizeof info);
  if (!tr_last_flush(&info)) KTEST_FAIL("tr_last_flush: no flush recorded");
  return info;
}

/* temporaries of one program, released together */
typedef struct {
  kiln_tensor **t;
  int n, cap;
} arena;

static kiln_tensor *keep(arena *a, kiln_tensor *t) {
  CHECK(t != NULL);
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 4096;
    kiln_tensor **more = realloc(a->t, (size_t)cap * sizeof *more);
    if (!more) abort();
    a->t = more;
    a->cap = cap;
  }
  a->t[a->n++] = t;
  return t;
}

static void arena_free(arena *a) {
  for (int i = 0; i < a->n; i++) kiln_release(a->t[i]);
  free(a->t);
  *a = (arena){0};
}

typedef struct {
  kiln_tensor *wx[4], *wh[4], *b[4]; /* one per gate */
  bool linear;                       /* stored as torch.nn.Linear's [out, in], applied as x @ W^T */
} weights;

static void weights_make(weights *w, arena *a, int gates) {
  kiln_manual_seed(7);
  w->linear = false;
  for (int g = 0; g < gates; g++) {
    w->wx[g] = keep(a, kiln_randn(KILN_F32, 2, (int64_t[]){I, H}));
    w->wh[g] = keep(a, kiln_randn(KILN_F32, 2, (int64_t[]){H, H}));
    w->b[g] = keep(a, kiln_randn(KILN_F32, 1, (int64_t[]){H}));
  }
}

/* x @ w, or x @ w^T for a weight stored as Linear's */
static kiln_tensor *apply(arena *a, const weights *w, kiln_tensor *x, kiln_tensor *m) {
  return keep(a, kiln_matmul(x, w->linear ? keep(a, kiln_transpose(m, 0, 1)) : m));
}

/* x_t @ wx + h @ wh + b for gate g */
static kiln_tensor *gate(arena *a, const weights *w, int g, kiln_tensor *x, kiln_tensor *h) {
  kiln_tensor *xw = apply(a, w, x, w->wx[g]);
  kiln_tensor *hw = apply(a, w, h, w->wh[g]);
  return keep(a, kiln_add(keep(a, kiln_add(xw, hw)), w->b[g]));
}

/* one step of the cell: h (and c for the LSTM) rebound */
static void step(arena *a, cell_kind kind, const weights *w, kiln_tensor *x, kiln_tensor **h,
                 kiln_tensor **c) {
  switch (kind) {
    case TANH_RNN:
      *h = keep(a, kiln_tanh(gate(a, w, 0, x, *h)));
      break;
    case GRU: {
      kiln_tensor *r = keep(a, kiln_sigmoid(gate(a, w, 0, x, *h)));
      kiln_tensor *z = keep(a, kiln_sigmoid(gate(a, w, 1, x, *h)));
      kiln_tensor *hr = keep(a, kiln_mul(r, *h));
      kiln_tensor *n = keep(a, kiln_tanh(gate(a, w, 2, x, hr)));
      /* h = n + z * (h - n) */
      *h = keep(a, kiln_add(n, keep(a, kiln_mul(z, keep(a, kiln_sub(*h, n))))));
      break;
    }
    case LSTM: {
      kiln_tensor *i = keep(a, kiln_sigmoid(gate(a, w, 0, x, *h)));
      kiln_tensor *f = keep(a, kiln_sigmoid(gate(a, w, 1, x, *h)));
      kiln_tensor *g = keep(a, kiln_tanh(gate(a, w, 2, x, *h)));
      kiln_tensor *o = keep(a, kiln_sigmoid(gate(a, w, 3, x, *h)));
      *c = keep(a, kiln_add(keep(a, kiln_mul(f, *c)), keep(a, kiln_mul(i, g))));
      *h = keep(a, kiln_mul(o, keep(a, kiln_tanh(*c))));
      break;
    }
  }
}

typedef struct {
  int first, stride; /* x_t = X[first + t * stride] */
  bool stacked;      /* read every step's h (a stack), else the last */
  int odd_step;      /* >= 0: that step multiplies h by a scalar no other step has */
  int short_step;    /* >= 0: that step runs on a batch of B - 1 rows */
  bool backward;     /* then gradients of the weights (a second flush) */
} program;

/* runs kind over T steps and returns what the flush of the result found */
static tr_flush_info run(cell_kind kind, int T, program p) {
  arena a = {.n = 0};
  weights w;
  int gates = kind == TANH_RNN ? 1 : kind == GRU ? 3 : 4;
  weights_make(&w, &a, gates);
  if (p.backward)
    for (int g = 0; g < gates; g++) CHECK(kiln_set_requires_grad(w.wh[g], true) == KILN_OK);
  int steps_in_x = p.first + (T - 1) * p.stride + 1;
  if (p.stride < 0) steps_in_x = p.first + 1;
  kiln_tensor *X = keep(&a, kiln_randn(KILN_F32, 3, (int64_t[]){steps_in_x, B, I}));
  kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
  kiln_tensor *c = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
  CHECK(kiln_sync() == KILN_OK); /* X, h, c made: the loop's flush starts from values */
  kiln_tensor *hs[512];
  for (int t = 0; t < T; t++) {
    int64_t at = p.first + (int64_t)t * p.stride;
    kiln_tensor *xt = keep(&a, kiln_slice(X, 0, at, at + 1, 1));
    int64_t rows = p.short_step >= 0 && t >= p.short_step ? B - 1 : B;
    if (rows != B) xt = keep(&a, kiln_slice(xt, 1, 0, rows, 1));
    if (t == p.short_step) {
      h = keep(&a, kiln_slice(h, 0, 0, rows, 1));
      c = keep(&a, kiln_slice(c, 0, 0, rows, 1));
    }
    xt = keep(&a, kiln_reshape(xt, 2, (int64_t[]){rows, I}));
    step(&a, kind, &w, xt, &h, &c);
    if (t == p.odd_step) h = keep(&a, kiln_mul_scalar(h, 0.5));
    hs[t] = h;
  }
  kiln_tensor *out = p.stacked ? keep(&a, kiln_stack(T, hs, 0)) : h;
  kiln_tensor *loss = keep(&a, kiln_sum(keep(&a, kiln_mul(out, out)), 0, NULL, false));
  double v = kiln_item(loss);
  CHECK(v == v); /* not NaN: the program ran */
  tr_flush_info info = last_flush();
  if (p.backward) {
    CHECK(kiln_backward(loss, NULL) == KILN_OK);
    kiln_tensor *grads[4];
    for (int g = 0; g < gates; g++) grads[g] = keep(&a, kiln_grad(w.wh[g]));
    CHECK(kiln_eval(gates, grads) == KILN_OK);
    info = last_flush();
  }
  arena_free(&a);
  return info;
}

static const program plain = {.first = 0, .stride = 1, .odd_step = -1, .short_step = -1};

/* one body for every trip count: the same size and structure hash, found
   in every copy but at most the first (whose state comes from outside) */
static void one_body(cell_kind kind, program p) {
  const int lengths[] = {3, 4, 7, 12, 20}; /* within one flush: the depth cap cuts longer ones */
  tr_flush_info first = {0};
  for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
    int T = lengths[i];
    tr_flush_info f = run(kind, T, p);
    CHECK(f.new_key);
    if (!(f.loop.copies >= T - 1 && f.loop.copies <= T))
      fprintf(stderr, "T %d: %d copies of %d nodes from %d, %d nodes in the trace\n", T,
              f.loop.copies, f.loop.body, f.loop.start, f.nodes);
    CHECK(f.loop.copies >= T - 1 && f.loop.copies <= T);
    CHECK(f.loop.carried >= 1);
    CHECK(f.loop.invariant >= 1);
    CHECK(f.loop.stepped == 1);
    CHECK(p.stacked ? f.loop.stacked_outputs >= 1 : f.loop.last_outputs >= 1);
    if (i == 0) {
      first = f;
      continue;
    }
    CHECK(f.loop.body == first.loop.body);
    CHECK(f.loop.body_hash == first.loop.body_hash);
    CHECK(f.loop.carried == first.loop.carried);
    CHECK(f.loop.invariant == first.loop.invariant);
  }
}

TEST(tanh_rnn_is_one_body_for_every_length) { one_body(TANH_RNN, plain); }
TEST(gru_is_one_body_for_every_length) { one_body(GRU, plain); }
TEST(lstm_is_one_body_for_every_length) { one_body(LSTM, plain); }

TEST(stacked_states_are_stacked_outputs) {
  program p = plain;
  p.stacked = true;
  one_body(GRU, p);
}

TEST(steps_by_minus_one_and_by_two) {
  program back = plain;
  back.first = 39;
  back.stride = -1;
  one_body(GRU, back);
  program two = plain;
  two.stride = 2;
  one_body(TANH_RNN, two);
}

TEST(lstm_carries_two_states) {
  tr_flush_info f = run(LSTM, 13, plain); /* a new key: found on the first sighting */
  CHECK(f.loop.carried >= 2);             /* h and c */
}

/* a step that is not like the others ends the loop there: the copies
   found never cross it */
TEST(a_step_that_differs_is_not_rolled_with_the_others) {
  const int T = 20;
  program odd = plain;
  odd.odd_step = 10; /* h * 0.5 once */
  tr_flush_info f = run(TANH_RNN, T, odd);
  CHECK(f.loop.copies >= 2 && f.loop.copies <= 11);
  program shorter = plain;
  shorter.short_step = 10; /* one step of another shape */
  f = run(GRU, T, shorter);
  CHECK(f.loop.copies >= 2 && f.loop.copies <= 11);
}

/* with a scalar that changes every step nothing repeats */
TEST(a_scalar_that_changes_every_step_is_no_loop) {
  arena a = {.n = 0};
  weights w;
  weights_make(&w, &a, 1);
  kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
  kiln_tensor *x = keep(&a, kiln_randn(KILN_F32, 2, (int64_t[]){B, I}));
  CHECK(kiln_sync() == KILN_OK);
  for (int t = 0; t < 12; t++) {
    h = keep(&a, kiln_tanh(gate(&a, &w, 0, x, h)));
    h = keep(&a, kiln_mul_scalar(h, 1.0 + t)); /* a literal: part of the program */
  }
  double v = kiln_item(keep(&a, kiln_sum(h, 0, NULL, false)));
  CHECK(v == v);
  tr_flush_info f = last_flush();
  CHECK(f.loop.copies == 0);
  arena_free(&a);
}

/* the backward of a loop is a loop too (in reverse): every step but the
   first and last of backward (the loss's seed, the initial state) is one
   body reading what its forward step saved, less one copy when the body's
   canonical phase (trace/loop.c) cuts into the first */
TEST(backward_of_a_loop_is_found_as_a_loop) {
  program p = plain;
  p.backward = true;
  tr_flush_info f = run(GRU, 6, p);
  CHECK(f.loop.copies >= 3);
  CHECK(f.loop.carried >= 1);
  CHECK(f.loop.per_step >= 1);
  tr_flush_info g = run(GRU, 11, p);
  CHECK(g.loop.copies >= 8);
  CHECK(f.loop.body == g.loop.body);
  CHECK(f.loop.body_hash == g.loop.body_hash);
}

/* found in new keys only, never on a hit (the program's setup flush may
   itself become a compiled plan on its second run, which gives the loop's
   leaves another layout and so a second key: by the third run it hits).
   The segments of a rolled loop are traces too, searched when new: a new
   key may find more than one loop */
TEST(found_once_per_key) {
  tr_flush_info f = {0};
  for (int r = 0; r < 3; r++) {
    double before = kiln_stat("loops_found");
    f = run(GRU, 9, plain);
    if (f.new_key)
      CHECK(kiln_stat("loops_found") >= before + 1);
    else
      CHECK(kiln_stat("loops_found") == before);
  }
  CHECK(!f.new_key);
}

/* --- rolled loops ------------------------------------------------------------ */

typedef enum { X_SLICED, X_TOKENS, X_DECODED } input_kind;

typedef struct {
  cell_kind kind;
  kiln_dtype dt;
  int T;
  int first, stride; /* X_SLICED: x_t = X[first + t * stride] */
  input_kind input;  /* X_TOKENS: x_t = Emb[tok[t]]; X_DECODED: Emb[argmax(h_{t-1} Wo)] */
  int odd_step;      /* >= 0: that step scales h by a scalar no other step has */
  bool stacked;      /* the loss reads every state (else only the last) */
  bool both_ways;    /* a second loop over the reversed sequence (bidirectional) */
  bool grad_x;       /* X_SLICED: X's gradient too (dx_t = dg_t @ W_x^T each step) */
  bool linear;       /* weights as torch.nn.Linear's [out, in], applied as x @ W^T */
  int outer;         /* > 1: a loop around it, over that many sequences (X_SLICED) */
  double stop_above; /* > 0: a step reads sum(h*h) and the loop stops once it is above */
} train;

enum { MAX_VALUES = 8192 };

typedef struct {
  uint64_t bits;             /* of the loss and every gradient */
  double values[MAX_VALUES]; /* the same, as numbers */
  int nvalues;
  tr_flush_info fwd, bwd; /* the flushes of the loss and of the gradients */
  double rolled;          /* loops_rolled during the step */
  double steps;           /* loop_steps: the steps those loops ran */
  double sums;            /* loop_sums during the step */
  double hoists;          /* loop_hoists during the step */
  double maps;            /* loop_maps during the step */
  double blas_bwd;        /* BLAS calls of the backward and the gradients' flush */
  int trips;              /* the steps the cell ran, every loop together */
} trained;

static void fold(trained *out, kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  size_t bytes = (size_t)n * ktest_dtype_size(kiln_dtype_of(t));
  uint8_t *buf = malloc(bytes ? bytes : 1);
  CHECK(buf && kiln_to_buffer(t, buf, bytes) == KILN_OK);
  for (size_t i = 0; buf && i < bytes; i++) out->bits = (out->bits ^ buf[i]) * 0x100000001b3ull;
  for (int64_t i = 0; buf && i < n && out->nvalues < MAX_VALUES; i++)
    out->values[out->nvalues++] =
        kiln_dtype_of(t) == KILN_F64 ? ((double *)buf)[i] : (double)((float *)buf)[i];
  free(buf);
}

/* the largest difference between a's and b's values, relative to b's largest */
static double max_rel_diff(const trained *a, const trained *b) {
  double scale = 0, diff = 0;
  for (int i = 0; i < b->nvalues; i++) scale = fmax(scale, fabs(b->values[i]));
  for (int i = 0; i < a->nvalues && i < b->nvalues; i++)
    diff = fmax(diff, fabs(a->values[i] - b->values[i]));
  return a->nvalues == b->nvalues ? diff / (scale > 0 ? scale : 1) : INFINITY;
}

static void set_env(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* one training step of tr as users write it: the cell called per step,
   a loss over the states, kiln_backward into every weight */
static const trained *train_step(train tr) {
  arena a = {.n = 0};
  static trained out;
  memset(&out, 0, sizeof out);
  out.bits = 0xcbf29ce484222325ull;
  int gates = tr.kind == TANH_RNN ? 1 : tr.kind == GRU ? 3 : 4, V = 6;
  kiln_manual_seed(11);
  weights w = {.linear = tr.linear};
  for (int g = 0; g < gates; g++) {
    w.wx[g] = keep(&a, kiln_randn(tr.dt, 2, tr.linear ? (int64_t[]){H, I} : (int64_t[]){I, H}));
    w.wh[g] = keep(&a, kiln_randn(tr.dt, 2, (int64_t[]){H, H}));
    w.b[g] = keep(&a, kiln_randn(tr.dt, 1, (int64_t[]){H}));
  }
  kiln_tensor *emb = keep(&a, kiln_randn(tr.dt, 2, (int64_t[]){V, I}));
  kiln_tensor *wo = keep(&a, kiln_randn(tr.dt, 2, (int64_t[]){H, V}));
  kiln_tensor *params[15] = {wo, emb};
  int np = tr.input == X_SLICED ? 1 : 2; /* the embedding only when read */
  for (int g = 0; g < gates; g++) {
    params[np++] = w.wx[g];
    params[np++] = w.wh[g];
    params[np++] = w.b[g];
  }
  for (int q = 0; q < np; q++) CHECK(kiln_set_requires_grad(params[q], true) == KILN_OK);
  int span = tr.first + (tr.T - 1) * (tr.stride > 0 ? tr.stride : 0) + 1,
      outer = tr.outer > 1 ? tr.outer : 1;
  kiln_tensor *X = keep(&a, kiln_randn(tr.dt, 3, (int64_t[]){(int64_t)span * outer, B, I}));
  if (tr.grad_x) {
    CHECK(kiln_set_requires_grad(X, true) == KILN_OK);
    params[np++] = X;
  }
  kiln_tensor *tok = keep(&a, kiln_randint(0, V, KILN_I64, 2, (int64_t[]){tr.T, B}));
  kiln_tensor *h0 = keep(&a, kiln_zeros(tr.dt, 2, (int64_t[]){B, H}));
  CHECK(kiln_sync() == KILN_OK); /* the step's flushes start from values */
  double rolled_before = kiln_stat("loops_rolled"), sums_before = kiln_stat("loop_sums"),
         hoists_before = kiln_stat("loop_hoists"), steps_before = kiln_stat("loop_steps"),
         maps_before = kiln_stat("loop_maps");
  kiln_tensor *loss = NULL;
  for (int o = 0; o < outer * (tr.both_ways ? 2 : 1); o++) {
    int way = tr.both_ways ? o % 2 : 0, nt = 0;
    kiln_tensor *h = h0, *c = h0, *hs[512];
    for (int t = 0; t < tr.T; t++) {
      int at = way ? tr.T - 1 - t : t;
      kiln_tensor *xt;
      if (tr.input == X_SLICED) {
        int64_t row =
            (int64_t)span * (tr.both_ways ? o / 2 : o) + tr.first + (int64_t)at * tr.stride;
        xt = keep(&a, kiln_slice(X, 0, row, row + 1, 1));
        xt = keep(&a, kiln_reshape(xt, 2, (int64_t[]){B, I}));
      } else {
        kiln_tensor *ids;
        if (tr.input == X_DECODED && t > 0) /* greedy: the token step t-1 scored best */
          ids = keep(&a, kiln_argmax(keep(&a, kiln_matmul(h, wo)), 1, false));
        else
          ids = keep(&a,
                     kiln_reshape(keep(&a, kiln_slice(tok, 0, at, at + 1, 1)), 1, (int64_t[]){B}));
        xt = keep(&a, kiln_index_select(emb, 0, ids));
      }
      step(&a, tr.kind, &w, xt, &h, &c);
      if (t == tr.odd_step) h = keep(&a, kiln_mul_scalar(h, 0.5));
      hs[nt++] = h;
      if (tr.stop_above > 0) { /* a host read: this step's flush ends here */
        double e = kiln_item(keep(&a, kiln_sum(keep(&a, kiln_mul(h, h)), 0, NULL, false)));
        if (getenv("TEST_LOOPS_VERBOSE")) fprintf(stderr, "step %d: sum(h*h) %g\n", t, e);
        if (e > tr.stop_above) break;
      }
    }
    out.trips += nt;
    kiln_tensor *out_h = tr.stacked ? keep(&a, kiln_stack(nt, hs, 0)) : h;
    kiln_tensor *logits = keep(&a, kiln_matmul(out_h, wo));
    kiln_tensor *l = keep(&a, kiln_mean(keep(&a, kiln_mul(logits, logits)), 0, NULL, false));
    loss = loss ? keep(&a, kiln_add(loss, l)) : l;
  }
  fold(&out, loss);
  out.fwd = last_flush();
  double blas = kiln_stat("blas_calls");
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *grads[15];
  for (int q = 0; q < np; q++) grads[q] = keep(&a, kiln_grad(params[q]));
  CHECK(kiln_eval(np, grads) == KILN_OK);
  out.blas_bwd = kiln_stat("blas_calls") - blas;
  out.bwd = last_flush();
  for (int q = 0; q < np; q++) fold(&out, grads[q]);
  out.rolled = kiln_stat("loops_rolled") - rolled_before;
  out.steps = kiln_stat("loop_steps") - steps_before;
  out.sums = kiln_stat("loop_sums") - sums_before;
  out.hoists = kiln_stat("loop_hoists") - hoists_before;
  out.maps = kiln_stat("loop_maps") - maps_before;
  arena_free(&a);
  return &out;
}

/* tr rolled with the JIT on (run twice: the second hot, compiled with
   KILN_PAYOFF=0) equals tr rolled with the JIT off bit for bit, and the
   unrolled program (KILN_ROLL_LOOPS=0) to rounding: the sums over the
   steps that leave the loop, and the GEMMs hoisted out of it, add in
   another order (f64 to 1e-12 of the largest value, f32 to 1e-5) */
static trained rolled_as_unrolled(train tr) {
  static trained unrolled, interpreted, rolled;
  const char *jit = getenv("KILN_JIT");
  char *saved = jit ? strdup(jit) : NULL;
  set_env("KILN_ROLL_LOOPS", "0");
  unrolled = *train_step(tr);
  set_env("KILN_ROLL_LOOPS", NULL);
  set_env("KILN_JIT", "0");
  interpreted = *train_step(tr);
  set_env("KILN_JIT", saved);
  free(saved);
  train_step(tr);
  rolled = *train_step(tr);
  double diff = max_rel_diff(&rolled, &unrolled), tol = tr.dt == KILN_F64 ? 1e-12 : 1e-5;
  if (rolled.bits != interpreted.bits || !(diff <= tol))
    fprintf(stderr,
            "kind %d dt %d T %d input %d: rolled %016llx, interpreted %016llx; %g from unrolled\n",
            tr.kind, tr.dt, tr.T, tr.input, (unsigned long long)rolled.bits,
            (unsigned long long)interpreted.bits, diff);
  CHECK(rolled.bits == interpreted.bits);
  CHECK(diff <= tol);
  /* the same trips whatever ran them (a loop that stops early decides on
     the host, from values) */
  CHECK_EQ_INT(rolled.trips, unrolled.trips);
  CHECK_EQ_INT(rolled.trips, interpreted.trips);
  /* a rolled forward loop runs its T steps (less at most the copy its
     canonical phase cuts), each as the step trace */
  if (rolled.rolled > 0 && !(tr.stop_above > 0)) CHECK(rolled.steps >= tr.T - 1);
  CHECK(unrolled.steps == 0);
  if (!rolled.sums && !rolled.hoists && !rolled.maps) /* nothing left: the same program and bits */
    CHECK(rolled.bits == unrolled.bits);
  return rolled;
}

static const train gru7 = {
    .kind = GRU, .dt = KILN_F32, .T = 7, .stride = 1, .odd_step = -1, .stacked = true};

TEST(rolled_loops_equal_the_unrolled_program) {
  const cell_kind kinds[] = {TANH_RNN, GRU, LSTM};
  const kiln_dtype dts[] = {KILN_F32, KILN_F64};
  const int lengths[] = {2, 5, 17};
  for (int k = 0; k < 3; k++)
    for (int d = 0; d < 2; d++)
      for (int l = 0; l < 3; l++) {
        train tr = gru7;
        tr.kind = kinds[k];
        tr.dt = dts[d];
        tr.T = lengths[l];
        trained r = rolled_as_unrolled(tr);
        if (tr.T >= 5) { /* forward and backward both ran rolled, the weights' sums after it */
          CHECK(r.fwd.rolled && r.bwd.rolled);
          CHECK(r.rolled >= 2);
          CHECK(r.sums >= 2);
          CHECK(r.hoists >= 1); /* x_t @ W_x + b for every step at once, before the loop */
        }
      }
}

TEST(every_input_and_output_kind_rolls_to_the_same_bits) {
  train tr = gru7;
  tr.stride = -1, tr.first = 6; /* x_t = X[6 - t] */
  rolled_as_unrolled(tr);
  tr.stride = 2, tr.first = 1;
  rolled_as_unrolled(tr);
  tr = gru7;
  tr.input = X_TOKENS; /* Emb[tok[t]]: a gather of token t */
  CHECK(rolled_as_unrolled(tr).fwd.rolled);
  tr.stacked = false; /* only the last state read */
  CHECK(rolled_as_unrolled(tr).fwd.rolled);
  tr = gru7;
  tr.odd_step = 3; /* one step differs: not a copy of the others */
  rolled_as_unrolled(tr);
  tr = gru7;
  tr.kind = LSTM;
  tr.T = 12;
  tr.odd_step = 11; /* the last one */
  rolled_as_unrolled(tr);
}

TEST(a_greedy_decoder_and_a_bidirectional_loop_roll_to_the_same_bits) {
  train tr = gru7;
  tr.input = X_DECODED; /* x_t depends on step t-1's argmax: a gather on the carried path */
  tr.T = 9;
  rolled_as_unrolled(tr);
  tr = gru7;
  tr.both_ways = true; /* two loops in one flush */
  tr.T = 8;
  trained r = rolled_as_unrolled(tr);
  CHECK(r.rolled >= 3); /* both forward loops and at least one backward one */
}

/* Trip counts the data decides: a loop that stops once sum(h*h), read on
   the host each step, passes a bound (each forward step its own flush; the
   backward, one flush of every step, rolls); a loop around the loop, over
   three sequences in one flush (the outer body holds the inner loop) —
   rolled however they are found, the unrolled program's results, and the
   same bits with the JIT on and off */
TEST(a_loop_that_stops_early_and_nested_loops_roll_to_the_same_bits) {
  const kiln_dtype dts[] = {KILN_F32, KILN_F64};
  for (int d = 0; d < 2; d++) {
    train tr = gru7;
    tr.dt = dts[d];
    tr.T = 14;
    tr.stop_above = 8.6; /* passed at step 7 (8.81; the others below 8.53) */
    trained r = rolled_as_unrolled(tr);
    if (getenv("TEST_LOOPS_VERBOSE"))
      fprintf(stderr, "stops after %d of %d steps; rolled %.0f\n", r.trips, tr.T, r.rolled);
    CHECK(r.trips > 2 && r.trips < tr.T); /* it stopped, and not at once */
    CHECK(r.bwd.rolled);                  /* the backward of every step: one loop */
    tr = gru7;
    tr.dt = dts[d];
    tr.outer = 3;
    r = rolled_as_unrolled(tr);
    CHECK_EQ_INT(r.trips, 3 * tr.T);
    CHECK(r.fwd.rolled && r.bwd.rolled);
    tr.kind = LSTM;
    tr.stacked = false;
    rolled_as_unrolled(tr);
  }
}

/* the input projection leaves the loop: a tanh RNN over T steps, without
   gradients, makes 2T BLAS calls unrolled, and rolled one per step
   (h_{t-1} @ W_h), one for every step's x_t @ W_x at once, and one more
   where the body's canonical phase leaves part of a step outside the loop */
TEST(the_input_projection_is_one_gemm) {
  for (int roll = 0; roll <= 1; roll++) {
    set_env("KILN_ROLL_LOOPS", roll ? NULL : "0");
    for (int T = 6; T <= 24; T += 9) {
      arena a = {.n = 0};
      weights w;
      weights_make(&w, &a, 1);
      kiln_tensor *X = keep(&a, kiln_randn(KILN_F32, 3, (int64_t[]){T, B, I}));
      kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
      CHECK(kiln_sync() == KILN_OK);
      kiln_no_grad_push();
      for (int t = 0; t < T; t++) {
        kiln_tensor *xt = keep(&a, kiln_slice(X, 0, t, t + 1, 1));
        xt = keep(&a, kiln_reshape(xt, 2, (int64_t[]){B, I}));
        step(&a, TANH_RNN, &w, xt, &h, NULL);
      }
      kiln_tensor *loss = keep(&a, kiln_sum(h, 0, NULL, false));
      double calls = kiln_stat("blas_calls"), hoists = kiln_stat("loop_hoists");
      CHECK(isfinite(kiln_item(loss)));
      calls = kiln_stat("blas_calls") - calls;
      kiln_no_grad_pop();
      if (roll) {
        CHECK(last_flush().rolled);
        CHECK(kiln_stat("loop_hoists") > hoists);
        CHECK(calls >= T + 1 && calls <= T + 2);
      } else {
        CHECK_EQ_INT((long)calls, 2 * T);
      }
      arena_free(&a);
    }
  }
  set_env("KILN_ROLL_LOOPS", NULL);
}

/* A rolled loop's steps read its weight packed once.  h_t = tanh(P_t +
   h_{t-1} @ W) at a batch of 32 and width 256 is a short product, run on
   AVX-512 CPUs by Kiln's own f32 GEMM (vm/gemm_f32.h), and the loop packs
   W for its first step only (kiln_stat "loop_packs": once per loop; every
   later step's product reads the panels, "loop_pack_reads"); backward,
   dh = dg @ Wᵀ packs Wᵀ once the same way.  Packed once or at every call
   (unrolled: KILN_ROLL_LOOPS=0), the forward has the same bits, and so
   has the gradient with the JIT on and off; unrolled, the gradient agrees
   to rounding (its sum over the steps leaves the loop). */
TEST(a_loops_weight_is_packed_once_for_its_steps) {
  enum { BB = 32, HH = 256 };
  const char *jit = getenv("KILN_JIT"), *own_env = getenv("KILN_F32_GEMM");
  char *saved = jit ? strdup(jit) : NULL;
  bool own = (!strcmp(kiln_cpu_isa(), "x86-64-v4") || !strcmp(kiln_cpu_isa(), "x86-64-v3")) &&
             !(own_env && !strcmp(own_env, "0"));
  double *wv = malloc(HH * HH * sizeof *wv);
  for (int i = 0; i < HH * HH; i++) wv[i] = (double)((i * 37) % 101 - 50) * 1e-3;
  for (int T = 6; T <= 40; T += 34) {
    static trained got[3]; /* unrolled, rolled with the JIT off, rolled: W's gradient */
    uint64_t fwd[3];       /* and h's bits */
    for (int mode = 0; mode < 3; mode++) {
      set_env("KILN_ROLL_LOOPS", mode == 0 ? "0" : NULL);
      set_env("KILN_JIT", mode == 1 ? "0" : saved);
      arena a = {.n = 0};
      kiln_manual_seed(5);
      kiln_tensor *W = keep(&a, ktest_from_doubles(KILN_F32, 2, (int64_t[]){HH, HH}, wv));
      CHECK(kiln_set_requires_grad(W, true) == KILN_OK);
      kiln_tensor *P = keep(&a, kiln_randn(KILN_F32, 3, (int64_t[]){T, BB, HH}));
      kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){BB, HH}));
      CHECK(kiln_sync() == KILN_OK);
      double packs = kiln_stat("loop_packs"), reads = kiln_stat("loop_pack_reads");
      for (int t = 0; t < T; t++) {
        kiln_tensor *pt = keep(&a, kiln_slice(P, 0, t, t + 1, 1));
        pt = keep(&a, kiln_reshape(pt, 2, (int64_t[]){BB, HH}));
        h = keep(&a, kiln_tanh(keep(&a, kiln_add(pt, keep(&a, kiln_matmul(h, W))))));
      }
      kiln_tensor *loss = keep(&a, kiln_sum(keep(&a, kiln_mul(h, h)), 0, NULL, false));
      memset(&got[mode], 0, sizeof got[mode]);
      got[mode].bits = 0xcbf29ce484222325ull;
      fold(&got[mode], h);
      fwd[mode] = got[mode].bits;
      got[mode].bits = 0xcbf29ce484222325ull, got[mode].nvalues = 0; /* the gradient's */
      CHECK(kiln_backward(loss, NULL) == KILN_OK);
      fold(&got[mode], keep(&a, kiln_grad(W)));
      packs = kiln_stat("loop_packs") - packs;
      reads = kiln_stat("loop_pack_reads") - reads;
      if (mode > 0 && own && kiln_device_of(W) == KILN_CPU) { /* (KILN_DEVICE=cuda: cuBLAS) */
        if (packs != 2 || reads < 2 * (T - 3))
          fprintf(stderr, "T %d mode %d: %g packs, %g reads\n", T, mode, packs, reads);
        CHECK(packs == 2); /* W forward, Wᵀ backward */
        CHECK(reads >= 2 * (T - 3));
      } else {
        CHECK(packs == 0);
      }
      arena_free(&a);
    }
    CHECK(fwd[0] == fwd[1] && fwd[1] == fwd[2]);
    CHECK(got[1].bits == got[2].bits);
    CHECK(max_rel_diff(&got[0], &got[2]) <= 1e-5);
  }
  set_env("KILN_ROLL_LOOPS", NULL);
  set_env("KILN_JIT", saved);
  free(saved);
  free(wv);
}

/* the input gradient leaves the backward loop: with X's gradient asked
   for, each backward step of a tanh RNN computes dx_t = dg_t @ W_x^T,
   which only the concat after the loop reads; rolled, it is one GEMM over
   every step's dg_t after the loop.  So the backward flush makes about T
   BLAS calls (dh_{t-1} = dg_t @ W_h^T per step, plus the GEMMs after the
   loop), not 2T; results as the unrolled program's (f64 to 1e-12), the
   same bits with the JIT on and off.  LSTM and GRU cells (whose dx_t
   adds the gates' products in the step) still roll to the same results. */
TEST(the_input_gradient_is_one_gemm_after_the_loop) {
  const kiln_dtype dts[] = {KILN_F32, KILN_F64};
  for (int d = 0; d < 2; d++)
    for (int T = 6; T <= 30; T += 12) {
      train tr = gru7;
      tr.kind = TANH_RNN;
      tr.dt = dts[d];
      tr.T = T;
      tr.grad_x = true;
      set_env("KILN_ROLL_LOOPS", "0");
      double unrolled_calls = train_step(tr)->blas_bwd;
      set_env("KILN_ROLL_LOOPS", NULL);
      trained r = rolled_as_unrolled(tr);
      if (getenv("TEST_LOOPS_VERBOSE"))
        fprintf(stderr, "T %d: %g BLAS calls unrolled, %g rolled, %g maps\n", T, unrolled_calls,
                r.blas_bwd, r.maps);
      CHECK(r.bwd.rolled);
      CHECK(r.maps >= 1);
      CHECK(unrolled_calls >= 4 * T);
      CHECK(r.blas_bwd <= T + 12); /* 2T + 10 with dx_t in the loop */
    }
  train tr = gru7;
  tr.grad_x = true;
  for (int k = GRU; k <= LSTM; k++) {
    tr.kind = (cell_kind)k;
    rolled_as_unrolled(tr);
  }
}

/* weights stored as torch.nn.Linear's and applied as x @ W^T (the gem's
   RNN modules): each step's weight gradient is (x^T dg)^T, a transpose of
   the term, and the sums still leave the backward loop, as one GEMM each */
TEST(linear_layout_weights_sum_after_the_loop) {
  const cell_kind kinds[] = {TANH_RNN, GRU, LSTM};
  for (int k = 0; k < 3; k++)
    for (int d = 0; d < 2; d++) {
      train tr = gru7;
      tr.kind = kinds[k];
      tr.dt = d ? KILN_F64 : KILN_F32;
      tr.T = 12;
      tr.linear = true;
      tr.grad_x = true;
      trained r = rolled_as_unrolled(tr);
      int gates = tr.kind == TANH_RNN ? 1 : tr.kind == GRU ? 3 : 4;
      CHECK(r.bwd.rolled);
      CHECK(r.sums >= 2 * gates); /* W_h and W_x of every gate (and the biases) */
    }
}

/* a token out of range in one step of a rolled loop: the read reports the
   index error (no crash, nothing half-committed), and the same program
   with good tokens runs rolled after it */
TEST(a_bad_index_in_a_rolled_step_is_an_error) {
  enum { T = 9, V = 6 };
  for (int bad = 1; bad >= 0; bad--) {
    arena a = {.n = 0};
    weights w;
    weights_make(&w, &a, 3);
    kiln_tensor *emb = keep(&a, kiln_randn(KILN_F32, 2, (int64_t[]){V, I}));
    int64_t ids[T * B];
    for (int i = 0; i < T * B; i++) ids[i] = i % V;
    if (bad) ids[4 * B + 2] = V + 3; /* step 4 */
    kiln_tensor *tok = keep(&a, kiln_from_data(ids, KILN_I64, 2, (int64_t[]){T, B}));
    kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
    CHECK(kiln_sync() == KILN_OK);
    for (int t = 0; t < T; t++) {
      kiln_tensor *it =
          keep(&a, kiln_reshape(keep(&a, kiln_slice(tok, 0, t, t + 1, 1)), 1, (int64_t[]){B}));
      step(&a, GRU, &w, keep(&a, kiln_index_select(emb, 0, it)), &h, NULL);
    }
    kiln_clear_error();
    double v = kiln_item(keep(&a, kiln_sum(h, 0, NULL, false)));
    if (bad) {
      CHECK(isnan(v));
      CHECK(strstr(kiln_last_error(), "index") != NULL);
    } else {
      CHECK(isfinite(v));
      CHECK(last_flush().rolled);
    }
    arena_free(&a);
  }
}

/* every length runs one step key, forward and backward: once a thread's
   flushes run loops rolled, its graphs are cut deeper (trace/record.c), so
   a loop of 60 steps and its backward stay whole */
TEST(one_step_key_for_every_length) {
  uint64_t fwd[2] = {0, 0}, bwd[2] = {0, 0};
  int distinct_fwd = 0, distinct_bwd = 0;
  train warm = gru7; /* a first rolled flush */
  train_step(warm);
  for (int T = 5; T <= 60; T += T < 20 ? 1 : 7) {
    train tr = gru7;
    tr.T = T;
    const trained r = *train_step(tr);
    /* past the node cap the backward's last flush may hold only its tail
       (fewer than two copies, after a flush that rolled the rest) */
    CHECK(r.fwd.rolled && (r.bwd.rolled || (T > 48 && r.rolled >= 2)));
    if (getenv("TEST_LOOPS_VERBOSE"))
      fprintf(stderr, "T %d: fwd %d %016llx (%s, %d x %d) bwd %d %016llx (%s, %d x %d)\n", T,
              r.fwd.rolled, (unsigned long long)r.fwd.step_key[1], r.fwd.reason, r.fwd.loop.copies,
              r.fwd.loop.body, r.bwd.rolled, (unsigned long long)r.bwd.step_key[1], r.bwd.reason,
              r.bwd.loop.copies, r.bwd.loop.body);
    if (T <= 48) /* whole: neither cut by the depth cap */
      CHECK(r.fwd.loop.copies >= T - 1 && r.bwd.loop.copies >= T - 4);
    if (r.fwd.step_key[0] != fwd[0] || r.fwd.step_key[1] != fwd[1]) distinct_fwd++;
    if (r.bwd.rolled && (r.bwd.step_key[0] != bwd[0] || r.bwd.step_key[1] != bwd[1]))
      distinct_bwd++;
    memcpy(fwd, r.fwd.step_key, sizeof fwd);
    if (r.bwd.rolled) memcpy(bwd, r.bwd.step_key, sizeof bwd);
  }
  if (distinct_fwd != 1 || distinct_bwd != 1)
    fprintf(stderr, "step keys: %d forward, %d backward\n", distinct_fwd, distinct_bwd);
  CHECK_EQ_INT(distinct_fwd, 1);
  CHECK_EQ_INT(distinct_bwd, 1);
}

/* A new sequence length costs planning, never a compile: the kernels of
   a loop's segments take no extents, so a length not seen before finds
   the ones the lengths before it compiled; and its segments whose
   structure is the same at every length (the forward's input projection
   and embedding, the loss) are planned at their first sighting: their
   family is hot (trace_cache.h). */
TEST(a_new_length_is_planned_at_once_and_compiles_nothing) {
  if (!ktest_cpu_jit()) return;
  const char *payoff = getenv("KILN_PAYOFF");
  char *was = payoff ? strdup(payoff) : NULL;
  set_env("KILN_PAYOFF", "0"); /* every hot key planned */
  for (int T = 5; T <= 12; T++) {
    train tr = gru7;
    tr.T = T;
    train_step(tr);
    train_step(tr);
  }
  kiln_jit_wait();
  for (int T = 21; T <= 26; T++) { /* lengths no test before ran */
    double kernels = kiln_stat("kernels_compiled") + kiln_stat("disk_hits"),
           plans = kiln_stat("plans_built");
    train tr = gru7;
    tr.T = T;
    const trained *r = train_step(tr); /* its first sighting */
    CHECK(r->fwd.rolled && r->bwd.rolled);
    kiln_jit_wait();
    double new_kernels = kiln_stat("kernels_compiled") + kiln_stat("disk_hits") - kernels;
    if (new_kernels != 0 || kiln_stat("plans_built") == plans)
      KTEST_FAIL("length %d, first sighting: %.0f plans, %.0f kernels compiled or loaded", T,
                 kiln_stat("plans_built") - plans, new_kernels);
  }
  set_env("KILN_PAYOFF", was);
  free(was);
}

/* internal (trace/flush.h): drop every key, plan and family */
void tr_cache_reset(void);

/* The segments around a loop are the same trace at every length: the
   states stacked after it are joined before the segment runs
   (loop_joins), the slices of their gradient that one backward step reads
   wait for that step: lengths 11..16 sight no family (trace with its
   extents erased) that lengths 5..10 did not.  (Families are sighted by
   the JIT's payoff rule.) */
TEST(the_segments_around_a_loop_are_one_family_for_every_length) {
  if (!ktest_cpu_jit()) return;
  tr_cache_reset();
  double joins = kiln_stat("loop_joins"), families[2] = {0, 0};
  for (int T = 5; T <= 16; T++) {
    train tr = gru7;
    tr.T = T;
    const trained *r = train_step(tr);
    CHECK(r->fwd.rolled && r->bwd.rolled);
    if (T == 10) families[0] = kiln_stat("trace_families");
  }
  families[1] = kiln_stat("trace_families");
  if (getenv("TEST_LOOPS_VERBOSE"))
    fprintf(stderr, "families %.0f after lengths 5..10, %.0f after 11..16; joins %.0f\n",
            families[0], families[1], kiln_stat("loop_joins") - joins);
  CHECK(families[0] >= 4); /* before, after and a step, forward and backward */
  CHECK(families[1] == families[0]);
  CHECK(kiln_stat("loop_joins") - joins >= 12); /* the stack, at every length */
}

/* Where a graph is cut depends on the recorded program alone: the same
   training step, deeper than 256 before its loss is read, run first on a
   fresh thread and then again on it, flushes the same way and gives the
   same bits.  (The depth cap was raised once a thread had rolled a loop,
   so the first run was cut at depth 256 and the second not: other loops,
   other sums, other bits.) */
static void *train_twice(void *arg) {
  trained *runs = arg;
  train tr = gru7;
  tr.T = 60; /* ~5 deep per step forward, ~20 backward */
  for (int r = 0; r < 2; r++) {
    double flushes = kiln_stat("flushes");
    runs[r] = *train_step(tr);
    runs[r].steps = kiln_stat("flushes") - flushes; /* reused: the flushes */
  }
  return NULL;
}

TEST(the_first_run_on_a_thread_is_cut_as_the_next) {
  static trained runs[2];
  pthread_t th;
  CHECK(pthread_create(&th, NULL, train_twice, runs) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  if (runs[0].steps != runs[1].steps || runs[0].bits != runs[1].bits)
    fprintf(stderr, "first run: %.0f flushes, %.0f rolled; second: %.0f, %.0f\n", runs[0].steps,
            runs[0].rolled, runs[1].steps, runs[1].rolled);
  CHECK(runs[0].steps == runs[1].steps);
  CHECK(runs[0].bits == runs[1].bits);
}

/* A backward pass longer than the node cap is cut in the middle, and what
   the rest of the pass reads is kept by the cut: nothing computed before a
   cut is computed again after it.  (A gate gradient read by the bias sum
   before a cut and by dx_t and dh_{t-1} after it was left recomputable, and
   the next flush recomputed it with the whole chain of steps behind it:
   ~2,750 nodes a cut in W16.)  So a second run gives the first's bits:
   a recomputation rolls its loop another way. */
TEST(a_cut_in_a_backward_pass_recomputes_nothing) {
  const cell_kind kinds[] = {GRU, LSTM};
  for (int k = 0; k < 2; k++) {
    train tr = gru7;
    tr.kind = kinds[k];
    tr.T = 300; /* the backward is ~20 nodes a step: cut by the node cap */
    tr.grad_x = true;
    double before = kiln_stat("recomputed"), flushes = kiln_stat("flushes");
    uint64_t bits = train_step(tr)->bits;
    double recomputed = kiln_stat("recomputed") - before;
    if (getenv("TEST_LOOPS_VERBOSE"))
      fprintf(stderr, "kind %d: %.0f flushes, %.0f nodes recomputed\n", tr.kind,
              kiln_stat("flushes") - flushes, recomputed);
    CHECK(kiln_stat("flushes") - flushes >= 4);
    /* the forward's cut may leave an LSTM's c_t (3 nodes) to its next read,
       which recomputes it once (and the key learns to keep it) */
    CHECK(recomputed <= 3);
    CHECK(train_step(tr)->bits == bits);
  }
}

/* KILN_LOOPS=0 (API.md) runs loops unrolled, as KILN_ROLL_LOOPS=0 does */
TEST(kiln_loops_0_turns_rolling_off) {
  train tr = gru7;
  tr.T = 9;
  set_env("KILN_LOOPS", "0");
  const trained *off = train_step(tr);
  CHECK(off->rolled == 0);
  uint64_t bits = off->bits;
  set_env("KILN_ROLL_LOOPS", "0");
  CHECK(train_step(tr)->bits == bits);
  set_env("KILN_ROLL_LOOPS", NULL);
  set_env("KILN_LOOPS", NULL);
  CHECK(train_step(tr)->rolled > 0);
}

/* The gates of a GRU written the fused way (one [B, 3H] product per
   input, sliced per gate, as W10) are hoisted out of the loop as slices
   of [T, B, 3H]; a step reads each as a [B, H] leaf whose rows are 3H
   apart.  The step's compiled kernel reads those rows as rows (at off + j,
   which vectorizes), not element by element at off + j * step: no kernel
   KILN_DUMP writes has a strided read.  In a process of its own, with a
   fresh disk cache, so that its kernels compile (and are dumped there). */
static int strided_kernels(const char *dir, int *kernels) {
  DIR *d = opendir(dir);
  int strided = 0;
  *kernels = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "kernel-", 7) || n < 2 || strcmp(e->d_name + n - 2, ".c") ||
        strstr(e->d_name, "reproducer"))
      continue;
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    bool seen = false;
    while (f && fgets(line, sizeof line, f))
      if (strstr(line, "* step_")) seen = true;
    if (f) fclose(f);
    (*kernels)++;
    strided += seen;
    if (seen) fprintf(stderr, "  %s reads an input element by element\n", path);
  }
  if (d) closedir(d);
  return strided;
}

static void fused_gru_runs(void) {
  arena a = {.n = 0};
  kiln_manual_seed(11);
  const int64_t G = 3 * H, T = 9;
  kiln_tensor *wx = keep(&a, kiln_randn(KILN_F32, 2, (int64_t[]){I, G}));
  kiln_tensor *wh = keep(&a, kiln_randn(KILN_F32, 2, (int64_t[]){H, G}));
  kiln_tensor *bx = keep(&a, kiln_randn(KILN_F32, 1, (int64_t[]){G}));
  kiln_tensor *bh = keep(&a, kiln_randn(KILN_F32, 1, (int64_t[]){G}));
  kiln_tensor *X = keep(&a, kiln_randn(KILN_F32, 3, (int64_t[]){T, B, I}));
  double first = 0;
  for (int run = 0; run < 4; run++) {
    if (run == 3) kiln_jit_wait(); /* the last run on the compiled step */
    kiln_tensor *h = keep(&a, kiln_zeros(KILN_F32, 2, (int64_t[]){B, H}));
    for (int t = 0; t < T; t++) {
      kiln_tensor *x = keep(&a, kiln_squeeze(keep(&a, kiln_slice(X, 0, t, t + 1, 1)), 0));
      kiln_tensor *gx = keep(&a, kiln_add(keep(&a, kiln_matmul(x, wx)), bx));
      kiln_tensor *gh = keep(&a, kiln_add(keep(&a, kiln_matmul(h, wh)), bh));
      kiln_tensor *sx[3], *sh[3];
      for (int g = 0; g < 3; g++) {
        sx[g] = keep(&a, kiln_slice(gx, 1, g * H, (g + 1) * H, 1));
        sh[g] = keep(&a, kiln_slice(gh, 1, g * H, (g + 1) * H, 1));
      }
      kiln_tensor *r = keep(&a, kiln_sigmoid(keep(&a, kiln_add(sx[0], sh[0]))));
      kiln_tensor *z = keep(&a, kiln_sigmoid(keep(&a, kiln_add(sx[1], sh[1]))));
      kiln_tensor *n = keep(&a, kiln_tanh(keep(&a, kiln_add(sx[2], keep(&a, kiln_mul(r, sh[2]))))));
      h = keep(&a, kiln_add(n, keep(&a, kiln_mul(z, keep(&a, kiln_sub(h, n))))));
    }
    double v = kiln_item(keep(&a, kiln_sum(h, 0, NULL, false)));
    CHECK(isfinite(v));
    if (run == 0) first = v;
    CHECK(v == first); /* the compiled step gives the interpreter's bits */
  }
  CHECK(last_flush().rolled);
  CHECK(kiln_stat("kernels_compiled") > 0);
  arena_free(&a);
}

TEST(hoisted_gate_slices_are_read_as_rows) {
  if (getenv("TEST_LOOPS_CHILD")) { /* the child: run it */
    fused_gru_runs();
    return;
  }
  const char *device = getenv("KILN_DEVICE");
  if (!ktest_cpu_jit() || (device && !strcmp(device, "cuda"))) return;
  char dir[] = "/tmp/kiln-test-loops-XXXXXX", cmd[512];
  if (!mkdtemp(dir)) {
    KTEST_FAIL("mkdtemp failed");
    return;
  }
  snprintf(cmd, sizeof cmd,
           "TEST_LOOPS_CHILD=1 KTEST_ONLY=hoisted_gate_slices_are_read_as_rows KILN_PAYOFF=0 "
           "KILN_DUMP='%s' KILN_CACHE_DIR='%s/cache' /proc/%d/exe",
           dir, dir, (int)getpid());
  int status = system(cmd);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  int kernels = 0, strided = strided_kernels(dir, &kernels);
  CHECK(kernels > 0);
  CHECK_EQ_INT(strided, 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  /* KILN_DEVICE=cuda (ctest's test_loops_cuda_emulated): every test on
     the device, or none passes */
  const char *device = getenv("KILN_DEVICE");
  if (device && !strcmp(device, "cuda")) {
    kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){1});
    if (!x || kiln_device_of(x) != KILN_CUDA) {
      fprintf(stderr, "KILN_DEVICE=cuda, but tensors are not made there: %s\n",
              kiln_device_info(KILN_CUDA));
      return 1;
    }
    kiln_release(x);
  }
  RUN(tanh_rnn_is_one_body_for_every_length);
  RUN(gru_is_one_body_for_every_length);
  RUN(lstm_is_one_body_for_every_length);
  RUN(stacked_states_are_stacked_outputs);
  RUN(steps_by_minus_one_and_by_two);
  RUN(lstm_carries_two_states);
  RUN(a_step_that_differs_is_not_rolled_with_the_others);
  RUN(a_scalar_that_changes_every_step_is_no_loop);
  RUN(backward_of_a_loop_is_found_as_a_loop);
  RUN(found_once_per_key);
  RUN(rolled_loops_equal_the_unrolled_program);
  RUN(every_input_and_output_kind_rolls_to_the_same_bits);
  RUN(a_greedy_decoder_and_a_bidirectional_loop_roll_to_the_same_bits);
  RUN(a_loop_that_stops_early_and_nested_loops_roll_to_the_same_bits);
  RUN(the_input_projection_is_one_gemm);
  RUN(a_loops_weight_is_packed_once_for_its_steps);
  RUN(the_input_gradient_is_one_gemm_after_the_loop);
  RUN(linear_layout_weights_sum_after_the_loop);
  RUN(a_bad_index_in_a_rolled_step_is_an_error);
  RUN(one_step_key_for_every_length);
  RUN(a_new_length_is_planned_at_once_and_compiles_nothing);
  RUN(the_segments_around_a_loop_are_one_family_for_every_length);
  RUN(the_first_run_on_a_thread_is_cut_as_the_next);
  RUN(a_cut_in_a_backward_pass_recomputes_nothing);
  RUN(kiln_loops_0_turns_rolling_off);
  RUN(hoisted_gate_slices_are_read_as_rows);
  return ktest_done();
}
