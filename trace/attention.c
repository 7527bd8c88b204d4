/* attention.c — attention written the long way, recognized as it is
 * recorded (attention.h).  The pattern, read backwards from matmul(p, v):
 *
 *   p   = mul(e, div(1, sum(e, last axis, keepdim)))     kiln_softmax
 *   e   = exp(sub(x, max(x, last axis, keepdim)))
 *   x   = s | add(s, mask) | add(mask, s)                a float mask
 *       | where(keep, s, -inf) | where(out, -inf, s)      a bool mask
 *         (causal when the mask is key j > query i written with aranges)
 *   s   = S | mul(S, c) | mul(c, S) | div(S, c)           c a 0-d fill > 0
 *   S   = matmul(q, kt)
 *
 * every node of it pending, on one device that has the primitive (the CPU,
 * CUDA), f32 or f64, x of S's last two
 * dims and dtype, a float mask that takes no gradient.  Anything else (softmax over
 * another axis, dropout between softmax and v, two masks, a scalar that is
 * not a scalar) is left alone. */
#include "attention.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../vm/backend.h"
#include "../vm/state.h"
#include "dump.h"
#include "graph.h"
#include "record.h"

static bool pending(const tr_node *n) { return n->state == TR_PENDING; }

static bool push(tr_attention_match *m, tr_node *n) {
  if (m->nchain == TR_ATTENTION_CHAIN || !pending(n)) return false;
  m->chain[m->nchain++] = n;
  return true;
}

/* a 0-d fill (a literal, a value the host passed, kiln_scalar): its value */
static bool scalar_of(const tr_node *n, double *v) {
  if (n->op != VM_OP_full || n->meta.ndim != 0) return false;
  *v = n->attr.scalar[0];
  return true;
}

/* a fill of -inf, of any shape */
static bool is_ninf(const tr_node *n) {
  return n->op == VM_OP_full && n->attr.scalar[0] == -INFINITY;
}

/* a reduction of `of` over its last axis, keeping it */
static bool last_axis(const tr_node *n, vm_opcode op, const tr_node *of) {
  int nd = of->meta.ndim;
  return n->op == op && n->nin == 1 && n->in[0] == of && nd >= 2 && n->attr.keepdim &&
         n->attr.axes_mask == 1u << (nd - 1);
}

/* f32 or f64 (or a half: bf16, f16) on dev, a device whose interpreter
   has the attention primitive (the CPU; CUDA) */
static bool float_on(const tr_node *n, int dev, bool half) {
  const vm_backend *b = vm_backend_of((kiln_device)dev);
  kiln_dtype dt = n->meta.dtype;
  return (dt == KILN_F32 || dt == KILN_F64 || (half && vm_dtype_is_half(dt))) &&
         n->meta.device == dev && b && b->attention_max_head > 0;
}

/* a cast of an f32 value to a half (autocast's operand of a matmul, a
   half softmax's rounded result) */
static bool half_of_f32(const tr_node *n) {
  return n->op == VM_OP_cast && n->nin == 1 && n->in[0] && vm_dtype_is_half(n->meta.dtype) &&
         n->in[0]->meta.dtype == KILN_F32 && n->in[0]->meta.device == n->meta.device;
}

/* a cast of a half value to f32 (a half score meeting an f32 mask, a
   half softmax's input) */
static bool f32_of_half(const tr_node *n) {
  return n->op == VM_OP_cast && n->nin == 1 && n->in[0] && n->meta.dtype == KILN_F32 &&
         vm_dtype_is_half(n->in[0]->meta.dtype) && n->in[0]->meta.device == n->meta.device;
}

/* the f32 value n is a bf16 rounding of: n = cast(f32 -> bf16) (autocast's
   operand), or that cast taken back to f32 (a bf16 product run in f32
   where the CPU has no AVX512-BF16); else NULL */
static tr_node *bf16_source(tr_node *n) {
  if (n && f32_of_half(n)) n = n->in[0];
  return n && half_of_f32(n) && n->meta.dtype == KILN_BF16 ? n->in[0] : NULL;
}

/* arange(start, start + count) (step 1, exact values) as [count] (a row,
   over keys) or reshaped [count, 1] (a column, over queries); *start its
   first value */
static bool index_of(const tr_node *n, int64_t count, bool column, int64_t *start) {
  if (column) {
    if (n->op != VM_OP_reshape || n->nin != 1 || !n->in[0] || n->meta.ndim != 2 ||
        n->meta.shape[0] != count || n->meta.shape[1] != 1)
      return false;
    n = n->in[0];
  }
  kiln_dtype dt = n->meta.dtype;
  double a = n->attr.scalar[0];
  if (n->op != VM_OP_arange || n->attr.scalar[1] != 1 || n->meta.ndim != 1 ||
      n->meta.shape[0] != count || a != floor(a) || fabs(a) + (double)count > 0x1p52)
    return false;
  *start = (int64_t)a;
  return dt == KILN_I32 || dt == KILN_I64 || dt == KILN_F64 ||
         (dt == KILN_F32 && fabs(a) + (double)count <= 0x1p24);
}

/* a bool mask of a comparison of two fills' values: where(c, x, y) with x
   and y fills (of any shape) that are nonzero and zero, or such a value
   cast to bool (triu(ones(T, T), 1) and its .bool()), is c */
static const tr_node *peel_fills(const tr_node *n) {
  for (int depth = 0; depth < 2 && n; depth++) {
    if (n->op == VM_OP_cast && n->nin == 1 && n->meta.dtype == KILN_BOOL && n->in[0]) n = n->in[0];
    if (n->op == VM_OP_where && n->nin == 3 && n->in[0] && n->in[1] && n->in[2] &&
        n->in[1]->op == VM_OP_full && n->in[2]->op == VM_OP_full && n->in[1]->attr.scalar[0] != 0 &&
        n->in[2]->attr.scalar[0] == 0 && !isnan(n->in[1]->attr.scalar[0]))
      n = n->in[0];
    else
      break;
  }
  return n;
}

/* a bool mask that is the causal one for tq queries and tk keys: masking
   out (out) the keys j > query i, or keeping (!out) j <= i, written as a
   comparison of j = arange(a, a + tk) with i = arange(b, b + tq) as a
   column, either way round: gt(j, i), ge(j, i + 1) (triu(ones, 1)), lt(i,
   j)... to mask out; le(j, i) (tril(ones)), lt(j, i + 1), ge(i, j)... to
   keep.  Its values are those of the op's causal flag, so the op skips
   the key blocks it masks, and its bits are the causal op's. */
static bool causal_mask(const tr_node *n, bool out, int64_t tq, int64_t tk) {
  n = peel_fills(n);
  if (n && n->op == VM_OP_logical_not && n->nin == 1 && n->in[0]) { /* not keep is out */
    n = peel_fills(n->in[0]);
    out = !out;
  }
  if (!n || n->nin != 2 || !n->in[0] || !n->in[1] || n->meta.dtype != KILN_BOOL) return false;
  const tr_node *x = n->in[0], *y = n->in[1];
  vm_opcode op = n->op;
  int64_t a, b;
  if (!index_of(x, tk, false, &a) || !index_of(y, tq, true, &b)) { /* i op j: flip it */
    const tr_node *t = x;
    x = y, y = t;
    op = op == VM_OP_lt   ? VM_OP_gt
         : op == VM_OP_le ? VM_OP_ge
         : op == VM_OP_gt ? VM_OP_lt
         : op == VM_OP_ge ? VM_OP_le
                          : op;
    if (!index_of(x, tk, false, &a) || !index_of(y, tq, true, &b)) return false;
  }
  /* j + a op i + b, so j - i op c */
  int64_t c = b - a;
  if (out) return (op == VM_OP_gt && c == 0) || (op == VM_OP_ge && c == 1);
  return (op == VM_OP_le && c == 0) || (op == VM_OP_lt && c == 1);
}

/* a computed bool mask whose values are the causal one of tq queries and
   tk keys (out: true where j > i; else true where j <= i), leading dims of
   1: read on the host (a mask made once and reused every step is computed
   by then) */
static bool causal_values(const vm_tensor *v, bool out, int64_t tq, int64_t tk) {
  if (!v || v->device != KILN_CPU || v->dtype != KILN_BOOL || v->ndim < 2 ||
      v->shape[v->ndim - 2] != tq || v->shape[v->ndim - 1] != tk)
    return false;
  for (int d = 0; d < v->ndim - 2; d++)
    if (v->shape[d] != 1) return false;
  const uint8_t *p = vm_data(v);
  int64_t si = v->strides[v->ndim - 2], sj = v->strides[v->ndim - 1];
  for (int64_t i = 0; i < tq; i++)
    for (int64_t j = 0; j < tk; j++)
      if ((p[i * si + j * sj] != 0) != (out ? j > i : j <= i)) return false;
  return true;
}

/* a bool mask node that is the causal one: by its values once computed,
   else by its structure (the caller holds the lock of the graph it is
   pending in) */
static bool causal_node(const tr_node *n, bool out, int64_t tq, int64_t tk) {
  if (n->state == TR_MATERIALIZED) return causal_values(n->value, out, tq, tk);
  return n->state == TR_PENDING && causal_mask(n, out, tq, tk);
}

bool tr_attention_mask_is_causal(const vm_tensor *mask, int64_t tq, int64_t tk) {
  tr_node *n = mask && mask->dtype == KILN_BOOL ? mask->node : NULL;
  if (!n) return false;
  tr_graph *g = tr_thread_graph(), *mine = g && n->graph == g ? g : NULL;
  if (!mine && n->graph) return false;      /* another thread's: it may be materializing */
  if (mine) tr_graph_lock(mine);            /* another thread may flush our graph */
  bool yes = causal_node(n, false, tq, tk); /* no graph: a leaf, computed */
  if (mine) tr_graph_unlock(mine);
  return yes;
}

/* s: S, S * c, c * S or S / c over S = matmul(q, kt); *S its node.  In
   a half dtype: s cast to f32 (to meet an f32 mask), and S a half matmul
   or (where halves are multiplied in f32) an f32 matmul cast to the half */
static bool scaled_scores(tr_node *s, int dev, tr_attention_match *m, tr_node **S) {
  double c;
  int at = -1;
  m->scale = 1;
  if (f32_of_half(s)) {
    if (!push(m, s)) return false;
    s = s->in[0];
  }
  if (s->op == VM_OP_mul && s->nin == 2 && scalar_of(s->in[1], &c))
    at = 0;
  else if (s->op == VM_OP_mul && s->nin == 2 && scalar_of(s->in[0], &c))
    at = 1;
  else if (s->op == VM_OP_div && s->nin == 2 && scalar_of(s->in[1], &c))
    at = 0;
  if (at >= 0) {
    m->scale = s->op == VM_OP_mul ? c : 1 / c;
    if (!push(m, s)) return false;
    s = s->in[at];
  }
  if (half_of_f32(s) && s->in[0]->op == VM_OP_matmul) {
    if (!push(m, s)) return false;
    s = s->in[0];
  }
  if (s->op != VM_OP_matmul || s->nin != 2 || s->in[0]->meta.ndim < 2 || s->in[1]->meta.ndim < 2 ||
      !float_on(s->in[0], dev, true) || !float_on(s->in[1], dev, true) || !push(m, s))
    return false;
  *S = s;
  return isfinite(m->scale) && m->scale > 0;
}

static bool match_locked(tr_node *pn, const vm_tensor *v, tr_attention_match *m, tr_node **S,
                         tr_node **maskn) {
  /* p = mul(e, inv), inv = div(1, sum), sum = sum(e), e = exp(sub(x, max(x))) */
  int dev = pn->meta.device;                           /* every part of it on one device */
  if (half_of_f32(pn) && pn->in[0]->op == VM_OP_mul) { /* rounded to a half for the product */
    if (!push(m, pn)) return false;
    pn = pn->in[0];
  }
  if (pn->op != VM_OP_mul || pn->nin != 2 || !float_on(pn, dev, false) || pn->meta.ndim < 2)
    return false;
  tr_node *e = pn->in[0], *inv = pn->in[1];
  double one;
  if (inv->op != VM_OP_div || inv->nin != 2 || !scalar_of(inv->in[0], &one) || one != 1)
    return false;
  tr_node *sum = inv->in[1];
  if (!last_axis(sum, VM_OP_sum, e) || e->op != VM_OP_exp || e->nin != 1) return false;
  tr_node *sh = e->in[0];
  if (sh->op != VM_OP_sub || sh->nin != 2) return false;
  tr_node *x = sh->in[0], *mx = sh->in[1];
  if (!last_axis(mx, VM_OP_max, x) || x->meta.dtype != pn->meta.dtype) return false;
  tr_node *const parts[] = {pn, inv, sum, e, sh, mx};
  for (int i = 0; i < 6; i++)
    if (!push(m, parts[i])) return false;
  if (f32_of_half(x)) { /* the softmax of a half, taken in f32 */
    if (!push(m, x)) return false;
    x = x->in[0];
  }
  /* the mask, if any, then the scaled scores */
  tr_node *s = x;
  if (x->op == VM_OP_where && x->nin == 3 && x->in[0]->meta.dtype == KILN_BOOL &&
      x->in[0]->meta.device == dev && (is_ninf(x->in[1]) || is_ninf(x->in[2]))) {
    m->mask_out = is_ninf(x->in[1]);
    *maskn = x->in[0];
    s = x->in[m->mask_out ? 2 : 1];
    if (!push(m, x)) return false;
  } else if (x->op == VM_OP_add && x->nin == 2) {
    if (!push(m, x)) return false;
    int before = m->nchain;
    for (int k = 0; k < 2 && !*maskn; k++) {
      m->nchain = before;
      if (scaled_scores(x->in[k], dev, m, S)) *maskn = x->in[1 - k];
    }
    tr_node *mk = *maskn;
    if (!mk || !vm_dtype_is_float(mk->meta.dtype) || mk->requires_grad || mk->meta.device != dev)
      return false;
    s = NULL;
  }
  if (s && !scaled_scores(s, dev, m, S)) return false;
  /* the softmax is over S's own last two dims, in S's dtype (a scale or a
     fill of another dtype promotes); v is [..., Tk, dv] */
  const tr_node *sc = *S;
  int nx = x->meta.ndim, ns = sc->meta.ndim;
  const tr_node *mk = *maskn;
  int64_t tq = ns >= 2 ? sc->meta.shape[ns - 2] : 0, tk = ns >= 2 ? sc->meta.shape[ns - 1] : 0;
  if (mk && mk->meta.dtype == KILN_BOOL && ns >= 2 && causal_node(mk, m->mask_out, tq, tk)) {
    m->causal = true;
    *maskn = NULL;
  }
  /* heads the device's primitive takes (else the op would be composed
     again: nothing gained) */
  const tr_node *qn = sc->in[0];
  int64_t most = vm_backend_of((kiln_device)dev)->attention_max_head;
  kiln_dtype sdt = sc->meta.dtype, xdt = x->meta.dtype; /* a half and f32: casts between */
  bool same = sdt == xdt || (vm_dtype_is_half(sdt) && xdt == KILN_F32) ||
              (sdt == KILN_F32 && vm_dtype_is_half(xdt));
  return nx >= 2 && same && x->meta.shape[nx - 1] == sc->meta.shape[ns - 1] &&
         x->meta.shape[nx - 2] == sc->meta.shape[ns - 2] && v->ndim >= 2 &&
         v->shape[v->ndim - 2] == sc->meta.shape[ns - 1] && v->device == dev &&
         vm_dtype_is_float(v->dtype) && qn->meta.shape[qn->meta.ndim - 1] <= most &&
         v->shape[v->ndim - 1] <= most;
}

/* KILN_FUSE_ATTENTION=0: no rewrite (for comparisons), read once */
static bool rewrites_on(void) {
  static _Atomic int on = -1;
  int v = atomic_load_explicit(&on, memory_order_relaxed);
  if (v < 0) {
    v = vm_env_long("KILN_FUSE_ATTENTION", 1) != 0;
    atomic_store_explicit(&on, v, memory_order_relaxed);
  }
  return v;
}

bool tr_attention_match_of(vm_tensor *p, const vm_tensor *v, tr_attention_match *m) {
  memset(m, 0, sizeof *m);
  tr_node *pn = p->node;
  /* cheap first: the op is fixed once recorded */
  if (!pn || (pn->op != VM_OP_mul && pn->op != VM_OP_cast) || !v->node || !pn->graph ||
      !rewrites_on())
    return false;
  tr_graph *g = tr_thread_graph();
  if (!g || pn->graph != g) return false;
  tr_graph_lock(g);
  tr_node *S = NULL, *maskn = NULL;
  bool ok = match_locked(pn, v, m, &S, &maskn);
  if (ok) {
    m->q = tr_handle_of_node(S->in[0]);
    m->kt = tr_handle_of_node(S->in[1]);
    m->mask = maskn ? tr_handle_of_node(maskn) : NULL;
    ok = m->q && m->kt && (!maskn || m->mask);
  }
  tr_node *qs = S ? bf16_source(S->in[0]) : NULL, *ks = S ? bf16_source(S->in[1]) : NULL,
          *vs = bf16_source(v->node);
  if (ok && qs && ks && vs) {
    m->q_f32 = tr_handle_of_node(qs);
    m->kt_f32 = tr_handle_of_node(ks);
    m->v_f32 = tr_handle_of_node(vs);
    ok = m->q_f32 && m->kt_f32 && m->v_f32;
  }
  if (ok)
    for (int i = 0; i < m->nchain; i++) tr_node_retain(m->chain[i]);
  else
    m->nchain = 0;
  tr_graph_unlock(g);
  if (!ok) tr_attention_match_free(m);
  return ok;
}

void tr_attention_retire(tr_attention_match *m) {
  tr_graph *g = tr_thread_graph();
  if (!g) return;
  tr_graph_lock(g);
  for (int i = 0; i < m->nchain; i++) {
    tr_node *n = m->chain[i];
    if (n->state != TR_PENDING || n->graph != g) continue;
    tr_node_unlink(n);
    n->state = TR_RECOMPUTABLE; /* computed if read: no flush origin */
    n->origin[0] = n->origin[1] = 0;
    n->origin_pos = 0;
  }
  tr_graph_unlock(g);
  atomic_fetch_add_explicit(&vm_process()->stats.attention_rewrites, 1, memory_order_relaxed);
  if (tr_log_level()) {
    char bq[VM_SHAPE_BUF], bk[VM_SHAPE_BUF];
    fprintf(stderr,
            "kiln: softmax(q kT * %.6g%s) v recorded as one attention op: q %s, kT %s (%d nodes "
            "of the composite left unevaluated)\n",
            m->scale,
            m->causal                     ? ", causal"
            : !m->mask                    ? ""
            : m->mask->dtype != KILN_BOOL ? " + float mask"
            : m->mask_out                 ? ", -inf where a bool mask is true"
                                          : ", -inf where a bool mask is false",
            vm_shape_str(bq, m->q->ndim, m->q->shape), vm_shape_str(bk, m->kt->ndim, m->kt->shape),
            m->nchain);
  }
}

void tr_attention_match_free(tr_attention_match *m) {
  vm_release(m->q_f32);
  vm_release(m->kt_f32);
  vm_release(m->v_f32);
  vm_release(m->q);
  vm_release(m->kt);
  vm_release(m->mask);
  for (int i = 0; i < m->nchain; i++) tr_node_release(m->chain[i]);
  memset(m, 0, sizeof *m);
}
