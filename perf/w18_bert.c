/* w18_bert.c — W18: a BERT-style sentence encoder (6 layers, hidden 384,
 * 12 heads, intermediate 1536, vocabulary 30522: all-MiniLM-L6-v2's shape)
 * written with Kiln's C API the plain way (examples/bert.h: attention as
 * matmul, scale, mask, softmax, matmul, which Kiln records as one attention
 * op), on a batch of 32 sequences of 128 tokens padded from lengths
 * 64..128.  Two rows:
 *   W18:infer  the forward under no_grad, mean(h*h) read (ms per batch)
 *   W18:train  a fine-tuning step: forward, loss mean(h*h) read, backward,
 *              SGD on every parameter (ms per step)
 * Weights and tokens: bench_fill_hash / bench_hash_u32, reproduced by
 * perf/peers.py, which loads them into transformers' BertModel and runs it
 * under PyTorch eager and torch.compile: the first values read agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/bert.h"
#include "bench.h"

enum { VOCAB = 30522, MAXPOS = 512 };

typedef struct {
  bert_model m;
  int64_t B, T;
  kiln_tensor *ids, *mask;
} w18;

static void add_param(bert_model *m, const char *name, int ndim, const int64_t *shape,
                      uint32_t seed, double amp, float offset) {
  m->names = realloc(m->names, (size_t)(m->n + 1) * sizeof *m->names);
  m->ts = realloc(m->ts, (size_t)(m->n + 1) * sizeof *m->ts);
  if (!m->names || !m->ts) bench_ok(NULL, "realloc");
  m->names[m->n] = strdup(name);
  m->ts[m->n] = bench_tensor_hash(ndim, shape, seed, amp, offset);
  bench_ok_status(kiln_set_requires_grad(m->ts[m->n], true), "kiln_set_requires_grad");
  m->n++;
}

/* the parameters in BertModel's order, seeds 100, 101, ... */
static void model_init(w18 *w, bool smoke) {
  bert_config c = {.layers = smoke ? 2 : 6,
                   .hidden = smoke ? 32 : 384,
                   .heads = smoke ? 4 : 12,
                   .intermediate = smoke ? 64 : 1536,
                   .eps = 1e-12};
  memset(&w->m, 0, sizeof w->m);
  w->m.c = c;
  w->B = smoke ? 2 : 32;
  w->T = smoke ? 16 : 128;
  int64_t H = c.hidden, I = c.intermediate;
  uint32_t seed = 100;
  double a = 0.02 * sqrt(3.0); /* uniform with BERT's std 0.02 */
  bert_model *m = &w->m;
  add_param(m, "embeddings.word_embeddings.weight", 2, (int64_t[]){VOCAB, H}, seed++, a, 0);
  add_param(m, "embeddings.position_embeddings.weight", 2, (int64_t[]){MAXPOS, H}, seed++, a, 0);
  add_param(m, "embeddings.token_type_embeddings.weight", 2, (int64_t[]){2, H}, seed++, a, 0);
  add_param(m, "embeddings.LayerNorm.weight", 1, &H, seed++, 0.1, 1.0f);
  add_param(m, "embeddings.LayerNorm.bias", 1, &H, seed++, 0.1, 0);
  static const char *const lin[] = {"attention.self.query", "attention.self.key",
                                    "attention.self.value", "attention.output.dense",
                                    "intermediate.dense",   "output.dense"};
  for (int l = 0; l < c.layers; l++)
    for (int j = 0; j < 6; j++) {
      char name[128];
      int64_t out = j == 4 ? I : H, in = j == 5 ? I : H;
      snprintf(name, sizeof name, "encoder.layer.%d.%s.weight", l, lin[j]);
      add_param(m, name, 2, (int64_t[]){out, in}, seed++, a, 0);
      snprintf(name, sizeof name, "encoder.layer.%d.%s.bias", l, lin[j]);
      add_param(m, name, 1, &out, seed++, 0.01, 0);
      if (j == 3 || j == 5) {
        const char *ln = j == 3 ? "attention.output.LayerNorm" : "output.LayerNorm";
        snprintf(name, sizeof name, "encoder.layer.%d.%s.weight", l, ln);
        add_param(m, name, 1, &H, seed++, 0.1, 1.0f);
        snprintf(name, sizeof name, "encoder.layer.%d.%s.bias", l, ln);
        add_param(m, name, 1, &H, seed++, 0.1, 0);
      }
    }
  /* tokens: hash(b * T + t) % VOCAB; item b has 64 + hash(b) % 65 real
     tokens (smoke: 8 + ...% 9), the rest padding (mask 0) */
  int64_t n = w->B * w->T;
  int64_t *ids = malloc((size_t)n * sizeof *ids);
  float *mk = malloc((size_t)n * sizeof *mk);
  for (int64_t b = 0; b < w->B; b++) {
    int64_t len =
        smoke ? 8 + bench_hash_u32((uint32_t)b) % 9 : 64 + bench_hash_u32((uint32_t)b) % 65;
    for (int64_t t = 0; t < w->T; t++) {
      ids[b * w->T + t] = bench_hash_u32((uint32_t)(b * w->T + t + 7777)) % VOCAB;
      mk[b * w->T + t] = t < len ? 1.0f : 0.0f;
    }
  }
  w->ids = bench_ok(kiln_from_data(ids, KILN_I64, 2, (int64_t[]){w->B, w->T}), "ids");
  w->mask = bench_ok(kiln_from_data(mk, KILN_F32, 2, (int64_t[]){w->B, w->T}), "mask");
  free(ids);
  free(mk);
}

static double infer(w18 *w) {
  kiln_no_grad_push();
  kiln_tensor *h = bench_ok(bert_forward(&w->m, w->ids, w->mask), "bert_forward");
  kiln_tensor *h2 = bench_ok(kiln_mul(h, h), "mul");
  kiln_tensor *s = bench_ok(kiln_mean(h2, 0, NULL, false), "mean");
  double v = kiln_item(s);
  kiln_release(s), kiln_release(h2), kiln_release(h);
  kiln_no_grad_pop();
  return v;
}

static double train_step(w18 *w) {
  kiln_tensor *h = bench_ok(bert_forward(&w->m, w->ids, w->mask), "bert_forward");
  kiln_tensor *h2 = bench_ok(kiln_mul(h, h), "mul");
  kiln_tensor *loss = bench_ok(kiln_mean(h2, 0, NULL, false), "mean");
  double v = kiln_item(loss);
  bench_ok_status(kiln_backward(loss, NULL), "kiln_backward");
  bench_sgd_step(w->m.ts, w->m.n, 0.01);
  kiln_release(loss), kiln_release(h2), kiln_release(h);
  return v;
}

static void settle_infer(void *w) {
  infer(w);
  bench_ok_status(kiln_sync(), "kiln_sync");
}
static void settle_train(void *w) {
  train_step(w);
  bench_ok_status(kiln_sync(), "kiln_sync");
}

static void timed(w18 *w, const bench_opts *o, bool train, const char *workload) {
  double first = train ? train_step(w) : infer(w), v = first;
  for (int r = 0; r < o->warmup; r++) {
    v = train ? train_step(w) : infer(w);
    bench_ok_status(kiln_sync(), "kiln_sync");
  }
  int settle = o->smoke ? 0 : bench_settle(train ? settle_train : settle_infer, w, 20, 60.0);
  double r0 = kiln_stat("attention_rewrites");
  double *times = calloc((size_t)o->reps, sizeof *times);
  for (int r = 0; r < o->reps; r++) {
    double t0 = bench_now();
    v = train ? train_step(w) : infer(w);
    bench_ok_status(kiln_sync(), "kiln_sync");
    times[r] = bench_now() - t0;
  }
  char check[128], extra[512];
  snprintf(check, sizeof check, "first=%.9g", first);
  snprintf(extra, sizeof extra,
           "batch=%lld\tseq=%lld\thidden=%d\tlayers=%d\theads=%d\tvalue_last=%.6g\t"
           "attention_ops_per_step=%.0f\tkernels=%.0f\tsettle_steps=%d\tnote=%s; attention "
           "written as matmul/softmax/matmul, recorded as %.0f attention ops per step",
           (long long)w->B, (long long)w->T, w->m.c.hidden, w->m.c.layers, w->m.c.heads, v,
           (kiln_stat("attention_rewrites") - r0) / o->reps, kiln_stat("kernels_compiled"), settle,
           train ? "fine-tuning step: fwd, loss read, bwd, SGD" : "forward, no_grad",
           (kiln_stat("attention_rewrites") - r0) / o->reps);
  bench_result(workload, o->label, times, o->reps, extra, check);
  free(times);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 5, 1);
  w18 w;
  model_init(&w, o.smoke);
  /* --bf16 (W18h): PyTorch's CPU recipe, the f32 checkpoint under
     autocast to bf16 (kiln_set_autocast): the GEMMs in bf16 (AMX tiles
     where the CPU has them), the rest in f32 */
  if (o.bf16) bench_ok_status(kiln_set_autocast(KILN_BF16), "kiln_set_autocast");
  timed(&w, &o, false, o.bf16 ? "W18h:infer" : "W18:infer");
  timed(&w, &o, true, o.bf16 ? "W18h:train" : "W18:train");
  kiln_release(w.ids);
  kiln_release(w.mask);
  bert_free(&w.m);
  return 0;
}
