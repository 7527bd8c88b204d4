/* w10_gru_lm.c — W10: a GRU language model trained with autodiff
 * (kiln_backward) and plain SGD over sequences whose length changes every
 * step (5..40 tokens, a fixed pseudo-random sequence of lengths, so every run
 * and every contender sees the same one): steps/s, total compile ms, kernels
 * compiled, traces seen.
 *
 * Model (written per time step, as a user writes a GRU cell; gates in
 * PyTorch's order r, z, n):
 *   e = Emb[tokens]                      index_select, [L, B, E]
 *   gx = x_t @ Wx + bx,  gh = h @ Wh + bh   [B, 3H]
 *   r = sigmoid(gx_r + gh_r), z = sigmoid(gx_z + gh_z)
 *   n = tanh(gx_n + r * gh_n),  h = n + z * (h - n)   (= (1-z) n + z h)
 *   logits = stack(h_1..h_L) @ Wout + bout, mean cross-entropy over every position
 * Vocabulary 64, embedding 32, hidden 128, batch 32, SGD lr 0.5.
 *
 * Data: row b of step s starts at token hash(s*7919 + b) % V and continues
 * x' = (5x + 7) % V (a bigram the model learns: the loss goes down); the
 * length of step s is 5 + hash(s + 0x5EED) % 36.  perf/peers.py builds the
 * same data and weights (bench_fill_hash).
 *
 * Timing: the steps come in epochs of EPOCH steps with fresh lengths; the
 * first epoch is the warm-up (first sightings, compiles; reported as
 * cold_s_per_step), then kiln_jit_wait(), then --reps epochs are timed, each
 * giving seconds per step; the median is reported.  The loss is read every
 * step (kiln_item), as a user prints it.
 *
 * KILN_W10_LEN=L trains at the one length L instead (every step the same
 * trace: what compiled code gains once nothing is new).
 *
 * Kiln runs with a fresh, empty KILN_CACHE_DIR (removed at the end; set
 * KILN_W10_KEEP_CACHE=1 to use the one in the environment instead), so
 * compile_ms is everything this sequence of lengths costs to compile.
 *
 * Built with KILN_W16 (perf_w16_lstm_lm) it is W16: the same language model
 * with an LSTM cell (gates in PyTorch's order i, f, g, o; c = f c + i g,
 * h = o tanh(c)) over lengths 5..400, epochs of 8 steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#ifdef KILN_W16
#define WORKLOAD "W16"
#define GATES 4 /* i, f, g, o */
#define SPAN 396
#define EPOCH 8
#define SEED 30
#define LOSS_FALL 0.98 /* 32 steps of long sequences: the loss falls slower */
#else
#define WORKLOAD "W10"
#define GATES 3 /* r, z, n */
#define SPAN 36
#define EPOCH 15
#define SEED 20
#define LOSS_FALL 0.9
#endif

typedef struct {
  int64_t V, E, H, B;
  int min_len, len_span, epoch;
  double lr;
  kiln_tensor *p[7]; /* Emb [V,E], Wx [E,3H], bx [3H], Wh [H,3H], bh [3H], Wout [H,V], bout [V] */
} gru;

enum { EMB, WX, BX, WH, BH, WOUT, BOUT, NPARAM };

static int seq_len(const gru *m, int step) {
  return m->min_len + (int)(bench_hash_u32((uint32_t)step + 0x5EEDu) % (uint32_t)m->len_span);
}

/* tokens of step s: [L+1, B], row 0 the first token of each sequence */
static int64_t *make_tokens(const gru *m, int step, int L) {
  int64_t *tok = malloc(sizeof *tok * (size_t)((L + 1) * m->B));
  if (!tok) abort();
  for (int64_t b = 0; b < m->B; b++) {
    int64_t x = bench_hash_u32((uint32_t)step * 7919u + (uint32_t)b) % (uint32_t)m->V;
    for (int p = 0; p <= L; p++) {
      tok[p * m->B + b] = x;
      x = (5 * x + 7) % m->V;
    }
  }
  return tok;
}

static void gru_init(gru *m, bool smoke) {
  m->V = smoke ? 16 : 64;
  m->E = smoke ? 8 : 32;
  m->H = smoke ? 16 : 128;
  m->B = smoke ? 4 : 32;
  m->min_len = 5;
  m->len_span = smoke ? 8 : SPAN;             /* lengths 5..12 (smoke) or 5..40 (W16: 5..400) */
  const char *fixed = getenv("KILN_W10_LEN"); /* one length every step: the fixed-length case */
  if (fixed && atoi(fixed) > 0) {
    m->min_len = atoi(fixed);
    m->len_span = 1;
  }
  m->epoch = smoke ? 3 : EPOCH;
  m->lr = 0.5;
  double a = 1.0 / sqrt((double)m->H); /* PyTorch's GRU and LSTM init range */
  int64_t HG = GATES * m->H;
  m->p[EMB] = bench_tensor_hash(2, (int64_t[]){m->V, m->E}, SEED + 1, 1.0, 0);
  m->p[WX] = bench_tensor_hash(2, (int64_t[]){m->E, HG}, SEED + 2, a, 0);
  m->p[BX] = bench_tensor_hash(1, (int64_t[]){HG}, SEED + 3, a, 0);
  m->p[WH] = bench_tensor_hash(2, (int64_t[]){m->H, HG}, SEED + 4, a, 0);
  m->p[BH] = bench_tensor_hash(1, (int64_t[]){HG}, SEED + 5, a, 0);
  m->p[WOUT] = bench_tensor_hash(2, (int64_t[]){m->H, m->V}, SEED + 6, a, 0);
  m->p[BOUT] = bench_tensor_hash(1, (int64_t[]){m->V}, SEED + 7, 0.01, 0);
  for (int i = 0; i < NPARAM; i++)
    bench_ok_status(kiln_set_requires_grad(m->p[i], true), "kiln_set_requires_grad");
}

/* columns [g*H, (g+1)*H) of a [B, GATES*H] tensor */
static kiln_tensor *gate(bench_scope *s, const gru *m, kiln_tensor *t, int g) {
  return bench_keep(s, kiln_slice(t, 1, g * m->H, (g + 1) * m->H, 1), "slice");
}

/* one training step on sequences of length L; returns the loss read back */
static double train_step(gru *m, int step) {
  bench_scope s = {0};
  int L = seq_len(m, step);
  int64_t *tok = make_tokens(m, step, L);
  int64_t LB = (int64_t)L * m->B;
  kiln_tensor *inputs = bench_keep(&s, kiln_from_data(tok, KILN_I64, 1, &LB), "inputs");
  kiln_tensor *targets = bench_keep(&s, kiln_from_data(tok + m->B, KILN_I64, 1, &LB), "targets");
  free(tok);

  kiln_tensor *emb = bench_keep(&s, kiln_index_select(m->p[EMB], 0, inputs), "index_select");
  emb = bench_keep(&s, kiln_reshape(emb, 3, (int64_t[]){L, m->B, m->E}), "reshape");
  kiln_tensor *h = bench_keep(&s, kiln_zeros(KILN_F32, 2, (int64_t[]){m->B, m->H}), "h0");
#ifdef KILN_W16
  kiln_tensor *c = bench_keep(&s, kiln_zeros(KILN_F32, 2, (int64_t[]){m->B, m->H}), "c0");
#endif
  kiln_tensor **hs = malloc(sizeof *hs * (size_t)L);
  if (!hs) abort();
  for (int t = 0; t < L; t++) {
    kiln_tensor *xt = bench_keep(&s, kiln_slice(emb, 0, t, t + 1, 1), "slice");
    xt = bench_keep(&s, kiln_squeeze(xt, 0), "squeeze");
    kiln_tensor *gx = bench_keep(&s, kiln_matmul(xt, m->p[WX]), "matmul");
    gx = bench_keep(&s, kiln_add(gx, m->p[BX]), "add");
    kiln_tensor *gh = bench_keep(&s, kiln_matmul(h, m->p[WH]), "matmul");
    gh = bench_keep(&s, kiln_add(gh, m->p[BH]), "add");
#ifdef KILN_W16
    kiln_tensor *g4 = bench_keep(&s, kiln_add(gx, gh), "add");
    kiln_tensor *i_ = bench_keep(&s, kiln_sigmoid(gate(&s, m, g4, 0)), "sigmoid");
    kiln_tensor *f_ = bench_keep(&s, kiln_sigmoid(gate(&s, m, g4, 1)), "sigmoid");
    kiln_tensor *g_ = bench_keep(&s, kiln_tanh(gate(&s, m, g4, 2)), "tanh");
    kiln_tensor *o_ = bench_keep(&s, kiln_sigmoid(gate(&s, m, g4, 3)), "sigmoid");
    c = bench_keep(
        &s,
        kiln_add(bench_keep(&s, kiln_mul(f_, c), "mul"), bench_keep(&s, kiln_mul(i_, g_), "mul")),
        "add");
    h = bench_keep(&s, kiln_mul(o_, bench_keep(&s, kiln_tanh(c), "tanh")), "mul");
#else
    kiln_tensor *r = bench_keep(
        &s, kiln_sigmoid(bench_keep(&s, kiln_add(gate(&s, m, gx, 0), gate(&s, m, gh, 0)), "add")),
        "sigmoid");
    kiln_tensor *z = bench_keep(
        &s, kiln_sigmoid(bench_keep(&s, kiln_add(gate(&s, m, gx, 1), gate(&s, m, gh, 1)), "add")),
        "sigmoid");
    kiln_tensor *rn = bench_keep(&s, kiln_mul(r, gate(&s, m, gh, 2)), "mul");
    kiln_tensor *n =
        bench_keep(&s, kiln_tanh(bench_keep(&s, kiln_add(gate(&s, m, gx, 2), rn), "add")), "tanh");
    kiln_tensor *d = bench_keep(&s, kiln_sub(h, n), "sub");
    h = bench_keep(&s, kiln_add(n, bench_keep(&s, kiln_mul(z, d), "mul")), "add");
#endif
    hs[t] = h;
  }
  kiln_tensor *all = bench_keep(&s, kiln_stack(L, hs, 0), "stack");
  free(hs);
  all = bench_keep(&s, kiln_reshape(all, 2, (int64_t[]){LB, m->H}), "reshape");
  kiln_tensor *logits = bench_keep(&s, kiln_matmul(all, m->p[WOUT]), "matmul");
  logits = bench_keep(&s, kiln_add(logits, m->p[BOUT]), "add");
  kiln_tensor *loss = bench_keep(&s, kiln_cross_entropy(logits, targets), "cross_entropy");
  double value = kiln_item(loss); /* the user prints the loss */
  if (isnan(value)) bench_ok(NULL, "kiln_item(loss)");
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  bench_sgd_step(m->p, NPARAM, m->lr);
  bench_scope_free(&s);
  return value;
}

int main(int argc, char **argv) {
  /* before any Kiln call: a cache of our own, so every run starts cold */
  char dir[] = "/tmp/kiln-w1x-XXXXXX";
  bool own_cache = !getenv("KILN_W10_KEEP_CACHE");
  if (own_cache) {
    if (!mkdtemp(dir)) {
      perror("w10: mkdtemp");
      return 1;
    }
    setenv("KILN_CACHE_DIR", dir, 1);
  }
  bench_opts o;
  bench_parse(argc, argv, &o, 3, 1); /* --reps, --warmup: epochs */
  gru m;
  gru_init(&m, o.smoke);
  kiln_reset_stats();
  int step = 0, warm_epochs = o.warmup < 1 ? 1 : o.warmup;
  double loss1 = NAN, loss2 = NAN, loss_first_epoch = 0, loss_last_epoch = 0;
  long tokens = 0;

  double t0 = bench_now();
  for (int e = 0; e < warm_epochs; e++)
    for (int i = 0; i < m.epoch; i++, step++) {
      tokens += seq_len(&m, step);
      double l = train_step(&m, step);
      if (step == 0) loss1 = l;
      if (step == 1) loss2 = l;
      if (e == 0) loss_first_epoch += l / m.epoch;
    }
  double cold = (bench_now() - t0) / (double)(warm_epochs * m.epoch);
  kiln_jit_wait(); /* time the compiled plans, not the compiler thread */
  double traces_before = kiln_stat("traces_seen");
  double *times = calloc((size_t)o.reps, sizeof *times);
  for (int r = 0; r < o.reps; r++) {
    double sum = 0;
    double t1 = bench_now();
    for (int i = 0; i < m.epoch; i++, step++) {
      tokens += seq_len(&m, step);
      sum += train_step(&m, step);
    }
    times[r] = (bench_now() - t1) / (double)m.epoch;
    loss_last_epoch = sum / m.epoch;
  }
  kiln_jit_wait();
  double traces_timed = kiln_stat("traces_seen") - traces_before;

  if (!o.smoke && !(loss_last_epoch < LOSS_FALL * loss_first_epoch)) {
    fprintf(stderr, "%s: the loss did not go down: first epoch %.4f, last %.4f\n", WORKLOAD,
            loss_first_epoch, loss_last_epoch);
    return 1;
  }
  char check[256], extra[512];
  snprintf(check, sizeof check, "loss1=%.9g,loss2=%.9g", loss1, loss2);
  snprintf(extra, sizeof extra,
           "steps=%d\ttokens=%ld\tbatch=%lld\thidden=%lld\tlengths=%d..%d\tcold_s_per_step=%.6g\t"
           "compile_ms=%.1f\tkernels=%.0f\tplans=%.0f\tdisk_hits=%.0f\ttraces_seen=%.0f\t"
           "traces_timed=%.0f\tfamilies=%.0f\tloss_first_epoch=%.4f\tloss_last_epoch=%.4f\t"
           "cache=%s",
           step, tokens, (long long)m.B, (long long)m.H, m.min_len, m.min_len + m.len_span - 1,
           cold, kiln_stat("compile_ms"), kiln_stat("kernels_compiled"), kiln_stat("compiles"),
           kiln_stat("disk_hits"), kiln_stat("traces_seen"), traces_timed,
           kiln_stat("trace_families"), loss_first_epoch, loss_last_epoch,
           own_cache ? "cold" : "as-set");
  bench_result(WORKLOAD, o.label, times, o.reps, extra, check);
  for (int i = 0; i < NPARAM; i++) kiln_release(m.p[i]);
  free(times);
  if (own_cache) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "w10: could not remove %s\n", dir);
  }
  return 0;
}
