/* test_bert.c — a BERT checkpoint written by Hugging Face transformers
 * (tests/fixtures/make_bert.py: BertModel's own save_pretrained of a small
 * random-initialized config) run by examples/bert.h, the encoder written
 * with Kiln's C API the plain way: its last_hidden_state equals what
 * transformers computed within 2e-5 and the gradients of a weighted sum of
 * it within 1e-4 (seen: 3e-7 and 3e-6), with a padding mask; its attention,
 * written as matmul, scale, mask, softmax, matmul, is recorded as one
 * attention op per layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/bert.h"
#include "ktest.h"

#ifndef KILN_FIXTURES
#error "KILN_FIXTURES: the tests/fixtures directory"
#endif

static const bert_config tiny = {
    .layers = 2, .hidden = 32, .heads = 4, .intermediate = 64, .eps = 1e-12};

typedef struct {
  int n;
  char **names;
  kiln_tensor **ts;
} tensor_file;

static bool file_load(tensor_file *f, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", KILN_FIXTURES, name);
  memset(f, 0, sizeof *f);
  int n = kiln_load(path, 0, NULL, NULL);
  if (n <= 0) {
    KTEST_FAIL("cannot read %s: %s", path, kiln_last_error());
    return false;
  }
  f->names = calloc((size_t)n, sizeof *f->names);
  f->ts = calloc((size_t)n, sizeof *f->ts);
  f->n = kiln_load(path, n, f->names, f->ts);
  return f->n == n;
}

static kiln_tensor *file_get(const tensor_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->names[i], name)) return f->ts[i];
  KTEST_FAIL("no tensor %s in the fixture", name);
  return NULL;
}

static void file_free(tensor_file *f) {
  for (int i = 0; i < f->n; i++) free(f->names[i]), kiln_release(f->ts[i]);
  free(f->names);
  free(f->ts);
}

/* max |a - b| / max(1, |b|) over all elements */
static double max_rel_err(kiln_tensor *a, kiln_tensor *b) {
  if (!a || !b || kiln_numel(a) != kiln_numel(b)) return INFINITY;
  double *va = ktest_values(a), *vb = ktest_values(b), worst = 0;
  for (int64_t i = 0; i < kiln_numel(a); i++) {
    double e = fabs(va[i] - vb[i]) / fmax(1, fabs(vb[i]));
    worst = e > worst || isnan(e) ? e : worst;
  }
  free(va), free(vb);
  return worst;
}

TEST(matches_transformers) {
  bert_model m;
  char path[512];
  snprintf(path, sizeof path, "%s/bert_tiny.safetensors", KILN_FIXTURES);
  if (bert_load(&m, &tiny, path) <= 0) {
    KTEST_FAIL("cannot load %s: %s", path, kiln_last_error());
    return;
  }
  tensor_file ex;
  if (!file_load(&ex, "bert_tiny_expect.safetensors")) {
    bert_free(&m);
    return;
  }
  static const char *const grads[] = {
      "embeddings.word_embeddings.weight",       "encoder.layer.0.attention.self.query.weight",
      "encoder.layer.0.attention.self.key.bias", "encoder.layer.1.attention.self.value.weight",
      "encoder.layer.1.output.LayerNorm.weight",
  };
  enum { NG = sizeof grads / sizeof *grads };
  kiln_tensor *params[NG];
  for (int i = 0; i < NG; i++) {
    params[i] = bert_param(&m, "%s", grads[i]);
    CHECK(params[i] && kiln_set_requires_grad(params[i], true) == KILN_OK);
  }
  double before = kiln_stat("attention_rewrites");
  kiln_tensor *out = bert_forward(&m, file_get(&ex, "input_ids"), file_get(&ex, "attention_mask"));
  CHECK(out != NULL);
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - before, tiny.layers);
  double err = max_rel_err(out, file_get(&ex, "last_hidden_state"));
  if (!(err <= 2e-5)) KTEST_FAIL("last_hidden_state: max error %.3g against transformers", err);
  kiln_tensor *prod = kiln_mul(out, file_get(&ex, "w")), *loss = kiln_sum(prod, 0, NULL, false);
  kiln_tensor *g[NG] = {0};
  CHECK(kiln_grad_of(1, &loss, NULL, NG, params, g, false) == KILN_OK);
  for (int i = 0; i < NG; i++) {
    char name[128];
    snprintf(name, sizeof name, "grad.%s", grads[i]);
    double e = max_rel_err(g[i], file_get(&ex, name));
    if (!(e <= 1e-4)) KTEST_FAIL("%s: max error %.3g against transformers", name, e);
    kiln_release(g[i]);
  }
  kiln_release(prod), kiln_release(loss), kiln_release(out);
  file_free(&ex);
  bert_free(&m);
}

int main(void) {
  RUN(matches_transformers);
  return ktest_done();
}
