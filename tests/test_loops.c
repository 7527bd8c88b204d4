/* test_loops.c — loop detection (trace/loop.h, DESIGN §12): a recurrent
 * cell written per time step, as users write it, is found as one body
 * repeated once per step, with the same body (structure hash) whatever the
 * trip count; inputs are classified (carried state, invariant weights,
 * stepped slices of the sequence, by +1, -1 or 2); bodies that almost
 * repeat are not taken for loops.  Counts, never times.  Detection reports
 * only: rolling the copies into one loop node is the next step of #39. */
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
  kiln_tensor *t[4096];
  int n;
} arena;

static kiln_tensor *keep(arena *a, kiln_tensor *t) {
  CHECK(t != NULL);
  if (a->n < 4096) a->t[a->n++] = t;
  return t;
}

static void arena_free(arena *a) {
  for (int i = 0; i < a->n; i++) kiln_release(a->t[i]);
  a->n = 0;
}

typedef struct {
  kiln_tensor *wx[4], *wh[4], *b[4]; /* one per gate */
} weights;

static void weights_make(weights *w, arena *a, int gates) {
  kiln_manual_seed(7);
  for (int g = 0; g < gates; g++) {
    w->wx[g] = keep(a, kiln_randn(KILN_F32, 2, (int64_t[]){I, H}));
    w->wh[g] = keep(a, kiln_randn(KILN_F32, 2, (int64_t[]){H, H}));
    w->b[g] = keep(a, kiln_randn(KILN_F32, 1, (int64_t[]){H}));
  }
}

/* x_t @ wx + h @ wh + b for gate g */
static kiln_tensor *gate(arena *a, const weights *w, int g, kiln_tensor *x, kiln_tensor *h) {
  kiln_tensor *xw = keep(a, kiln_matmul(x, w->wx[g]));
  kiln_tensor *hw = keep(a, kiln_matmul(h, w->wh[g]));
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

int main(void) {
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
  return ktest_done();
}
