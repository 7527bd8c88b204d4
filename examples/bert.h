/* bert.h — a BERT encoder (Hugging Face transformers' BertModel: token,
 * position and type embeddings, then post-LN layers of multi-head
 * self-attention and a GELU MLP) written with Kiln's C API the plain way,
 * as a user ports it from its config.json: attention is matmul, scale,
 * an additive padding mask, softmax, matmul — which Kiln records as one
 * attention op (trace/attention.h) — and every linear layer is
 * x @ Wᵀ + b.  The weights are looked up by the names save_pretrained
 * writes to model.safetensors (with or without a "bert." prefix).
 *
 * Shared by tests/test_bert.c (against transformers' own outputs) and
 * perf/w18_bert.c (W18).  Every function returns NULL (or a negative status) on
 * failure — Kiln's error says why, or bert_param printed the name the
 * checkpoint lacks — and releases what it made. */
#ifndef KILN_EXAMPLES_BERT_H
#define KILN_EXAMPLES_BERT_H

#include <kiln.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int layers, hidden, heads, intermediate;
  double eps; /* layer_norm_eps */
} bert_config;

typedef struct {
  bert_config c;
  int n;
  char **names;
  kiln_tensor **ts; /* every tensor of the checkpoint, by names[i] */
} bert_model;

/* temporaries released together */
typedef struct {
  kiln_tensor *t[48];
  int n;
  bool failed;
} bert_scope;

static inline kiln_tensor *bert_keep(bert_scope *s, kiln_tensor *t) {
  if (!t || s->n == (int)(sizeof s->t / sizeof s->t[0])) {
    kiln_release(t);
    s->failed = true;
    return NULL;
  }
  return s->t[s->n++] = t;
}

static inline void bert_scope_release(bert_scope *s) {
  while (s->n > 0) kiln_release(s->t[--s->n]);
}

/* the tensor named by the format (or "bert." + it), borrowed; NULL with an
   error when the checkpoint has none */
static inline kiln_tensor *bert_param(const bert_model *m, const char *fmt, ...) {
  char name[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->names[i], name) ||
        (!strncmp(m->names[i], "bert.", 5) && !strcmp(m->names[i] + 5, name)))
      return m->ts[i];
  fprintf(stderr, "bert: the checkpoint has no tensor %s\n", name);
  return NULL;
}

static inline void bert_free(bert_model *m) {
  for (int i = 0; i < m->n; i++) {
    free(m->names[i]);
    kiln_release(m->ts[i]);
  }
  free(m->names);
  free(m->ts);
  m->n = 0;
  m->names = NULL;
  m->ts = NULL;
}

/* loads a safetensors checkpoint; the count of tensors, or a negative status */
static inline int bert_load(bert_model *m, const bert_config *c, const char *path) {
  memset(m, 0, sizeof *m);
  m->c = *c;
  int n = kiln_load(path, 0, NULL, NULL);
  if (n <= 0) return n < 0 ? n : -1;
  m->names = calloc((size_t)n, sizeof *m->names);
  m->ts = calloc((size_t)n, sizeof *m->ts);
  if (!m->names || !m->ts) return -1;
  int got = kiln_load(path, n, m->names, m->ts);
  m->n = got > 0 ? got : 0;
  return got;
}

/* x @ Wᵀ + b, W [out, in] as torch.nn.Linear stores it */
static inline kiln_tensor *bert_linear(const bert_model *m, kiln_tensor *x, const char *prefix,
                                       int layer) {
  bert_scope s = {0};
  kiln_tensor *w = bert_param(m, "encoder.layer.%d.%s.weight", layer, prefix);
  kiln_tensor *b = bert_param(m, "encoder.layer.%d.%s.bias", layer, prefix);
  kiln_tensor *wt = w ? bert_keep(&s, kiln_transpose(w, 0, 1)) : NULL;
  kiln_tensor *y = wt ? bert_keep(&s, kiln_matmul(x, wt)) : NULL;
  kiln_tensor *r = y && b ? kiln_add(y, b) : NULL;
  bert_scope_release(&s);
  return r;
}

static inline kiln_tensor *bert_norm(const bert_model *m, kiln_tensor *x, const char *fmt,
                                     int layer) {
  char w[96], b[96];
  snprintf(w, sizeof w, fmt, layer);
  snprintf(b, sizeof b, "%s", w);
  strcat(w, ".weight");
  strcat(b, ".bias");
  kiln_tensor *g = bert_param(m, "%s", w), *bb = bert_param(m, "%s", b);
  return g && bb ? kiln_layer_norm(x, g, bb, m->c.eps) : NULL;
}

/* [B, T, H] -> [B, heads, T, H/heads] */
static inline kiln_tensor *bert_heads(const bert_model *m, bert_scope *s, kiln_tensor *x) {
  const int64_t *sh = kiln_shape(x);
  int64_t hs[4] = {sh[0], sh[1], m->c.heads, m->c.hidden / m->c.heads};
  kiln_tensor *r = bert_keep(s, kiln_reshape(x, 4, hs));
  return r ? bert_keep(s, kiln_permute(r, (int[]){0, 2, 1, 3})) : NULL;
}

/* one layer: x + attention, normed; + the MLP, normed */
static inline kiln_tensor *bert_layer(const bert_model *m, kiln_tensor *x, kiln_tensor *ext_mask,
                                      int i) {
  bert_scope s = {0};
  const int64_t *sh = kiln_shape(x);
  int64_t B = sh[0], T = sh[1], H = m->c.hidden;
  kiln_tensor *q = bert_keep(&s, bert_linear(m, x, "attention.self.query", i));
  kiln_tensor *k = bert_keep(&s, bert_linear(m, x, "attention.self.key", i));
  kiln_tensor *v = bert_keep(&s, bert_linear(m, x, "attention.self.value", i));
  kiln_tensor *qh = q ? bert_heads(m, &s, q) : NULL, *kh = k ? bert_heads(m, &s, k) : NULL;
  kiln_tensor *vh = v ? bert_heads(m, &s, v) : NULL;
  kiln_tensor *kt = kh ? bert_keep(&s, kiln_transpose(kh, 2, 3)) : NULL;
  kiln_tensor *sc = qh && kt ? bert_keep(&s, kiln_matmul(qh, kt)) : NULL;
  sc = sc ? bert_keep(&s, kiln_mul_scalar(sc, 1 / sqrt((double)H / m->c.heads))) : NULL;
  if (sc && ext_mask) sc = bert_keep(&s, kiln_add(sc, ext_mask));
  kiln_tensor *p = sc ? bert_keep(&s, kiln_softmax(sc, -1)) : NULL;
  kiln_tensor *ctx = p && vh ? bert_keep(&s, kiln_matmul(p, vh)) : NULL;
  ctx = ctx ? bert_keep(&s, kiln_permute(ctx, (int[]){0, 2, 1, 3})) : NULL;
  ctx = ctx ? bert_keep(&s, kiln_reshape(ctx, 3, (int64_t[]){B, T, H})) : NULL;
  kiln_tensor *ao = ctx ? bert_keep(&s, bert_linear(m, ctx, "attention.output.dense", i)) : NULL;
  kiln_tensor *r1 = ao ? bert_keep(&s, kiln_add(ao, x)) : NULL;
  kiln_tensor *h1 =
      r1 ? bert_keep(&s, bert_norm(m, r1, "encoder.layer.%d.attention.output.LayerNorm", i)) : NULL;
  kiln_tensor *up = h1 ? bert_keep(&s, bert_linear(m, h1, "intermediate.dense", i)) : NULL;
  kiln_tensor *act = up ? bert_keep(&s, kiln_gelu(up)) : NULL;
  kiln_tensor *down = act ? bert_keep(&s, bert_linear(m, act, "output.dense", i)) : NULL;
  kiln_tensor *r2 = down ? bert_keep(&s, kiln_add(down, h1)) : NULL;
  kiln_tensor *out = r2 ? bert_norm(m, r2, "encoder.layer.%d.output.LayerNorm", i) : NULL;
  bert_scope_release(&s);
  return out;
}

/* last_hidden_state [B, T, hidden] of token ids [B, T] (i64), token type 0;
   attention_mask [B, T] (float, 1 attend / 0 padding) or NULL */
static inline kiln_tensor *bert_forward(const bert_model *m, kiln_tensor *ids,
                                        kiln_tensor *attention_mask) {
  bert_scope s = {0};
  const int64_t *sh = kiln_shape(ids);
  int64_t T = sh[1];
  kiln_tensor *we = bert_param(m, "embeddings.word_embeddings.weight");
  kiln_tensor *pe = bert_param(m, "embeddings.position_embeddings.weight");
  kiln_tensor *te = bert_param(m, "embeddings.token_type_embeddings.weight");
  if (!we || !pe || !te) return NULL;
  kiln_tensor *words = bert_keep(&s, kiln_embedding(we, ids));
  kiln_tensor *pos = bert_keep(&s, kiln_slice(pe, 0, 0, T, 1));
  kiln_tensor *type0 = bert_keep(&s, kiln_slice(te, 0, 0, 1, 1));
  kiln_tensor *e = words && pos ? bert_keep(&s, kiln_add(words, pos)) : NULL;
  e = e && type0 ? bert_keep(&s, kiln_add(e, type0)) : NULL;
  kiln_tensor *x = e ? kiln_layer_norm(e, bert_param(m, "embeddings.LayerNorm.weight"),
                                       bert_param(m, "embeddings.LayerNorm.bias"), m->c.eps)
                     : NULL;
  /* the padding mask as transformers makes it: (1 - mask) * the dtype's
     lowest value, added to every head's scores, [B, 1, 1, T] */
  kiln_tensor *ext = NULL;
  if (x && attention_mask) {
    kiln_dtype dt = kiln_dtype_of(x);
    kiln_tensor *m4 = bert_keep(&s, kiln_reshape(attention_mask, 4, (int64_t[]){sh[0], 1, 1, T}));
    kiln_tensor *m4d = m4 ? bert_keep(&s, kiln_cast(m4, dt)) : NULL;
    kiln_tensor *inv = m4d ? bert_keep(&s, kiln_sub(bert_keep(&s, kiln_scalar(1, dt)), m4d)) : NULL;
    ext = inv ? bert_keep(&s, kiln_mul_scalar(inv, dt == KILN_F64 ? -1.7976931348623157e308
                                                                  : -3.4028234663852886e38))
              : NULL;
    if (!ext) {
      kiln_release(x);
      x = NULL;
    }
  }
  for (int i = 0; x && i < m->c.layers; i++) {
    kiln_tensor *y = bert_layer(m, x, ext, i);
    kiln_release(x);
    x = y;
  }
  bert_scope_release(&s);
  return x;
}

#endif
