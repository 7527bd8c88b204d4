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

/* a fixture of tests/fixtures (ktest_file) */
static bool file_load(ktest_file *f, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", KILN_FIXTURES, name);
  return ktest_file_load(f, path);
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
  ktest_file ex;
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
  kiln_tensor *out =
      bert_forward(&m, ktest_file_get(&ex, "input_ids"), ktest_file_get(&ex, "attention_mask"));
  CHECK(out != NULL);
  CHECK_EQ_INT(kiln_stat("attention_rewrites") - before, tiny.layers);
  double err = max_rel_err(out, ktest_file_get(&ex, "last_hidden_state"));
  if (!(err <= 2e-5)) KTEST_FAIL("last_hidden_state: max error %.3g against transformers", err);
  kiln_tensor *prod = kiln_mul(out, ktest_file_get(&ex, "w")),
              *loss = kiln_sum(prod, 0, NULL, false);
  kiln_tensor *g[NG] = {0};
  CHECK(kiln_grad_of(1, &loss, NULL, NG, params, g, false) == KILN_OK);
  for (int i = 0; i < NG; i++) {
    char name[128];
    snprintf(name, sizeof name, "grad.%s", grads[i]);
    double e = max_rel_err(g[i], ktest_file_get(&ex, name));
    if (!(e <= 1e-4)) KTEST_FAIL("%s: max error %.3g against transformers", name, e);
    kiln_release(g[i]);
  }
  kiln_release(prod), kiln_release(loss), kiln_release(out);
  ktest_file_free(&ex);
  bert_free(&m);
}

int main(void) {
  RUN(matches_transformers);
  return ktest_done();
}
