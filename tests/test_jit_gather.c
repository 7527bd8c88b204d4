/* test_jit_gather.c — data movement compiled in place: gathers and
 * index_selects (a kernel reads the source at the index: fused with the
 * elementwise work and the reductions around them), small scatter_adds (the
 * VJP of a gather: each output element adds its sources in index order)
 * concats of up to 3 parts (a pick among the parts at the output's
 * coordinate) and argmax/argmin (a scan per output element); and reduce epilogues compiled as
 * kernels of their own (jit_cpu/kernel.c kernel_plan_epilogue).
 *
 * Each program runs three times in a child (KILN_HOT=1, inline compiles):
 * the third run, from the compiled plan, must compute nothing on the
 * interpreter (eager_ops) and its bits must equal those of a child with
 * KILN_JIT=0.  Two programs are also checked against values computed here.
 * An index out of range in a compiled plan must fail as it does on the
 * interpreter (the same status and message), and the next valid run must
 * compute again.  Views are counted in view_ops, not eager_ops. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "ktest.h"

static char self[4096];

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next_u64(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static kiln_tensor *floats(kiln_dtype dt, int ndim, const int64_t *shape, float *keep) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    v[i] = (double)((int)(next_u64() % 2001) - 1000) / 256.0; /* exact in f32 */
    if (keep) keep[i] = (float)v[i];
  }
  kiln_tensor *f = kiln_from_data(v, KILN_F64, ndim, shape), *t = kiln_cast(f, dt);
  kiln_release(f);
  free(v);
  return t;
}

static kiln_tensor *indices(int ndim, const int64_t *shape, int64_t below, int64_t *keep) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  int64_t *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (int64_t)(next_u64() % (uint64_t)below);
  if (keep) memcpy(keep, v, (size_t)n * sizeof *v);
  kiln_tensor *t = kiln_from_data(v, KILN_I64, ndim, shape);
  free(v);
  return t;
}

/* --- the programs ------------------------------------------------------------------ */

/* the mean cross-entropy: a log-softmax, the gather of each row's target
   and its sum, then the mean's division and negation (the epilogue) */
static kiln_tensor *cross_entropy(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){64, 10}, NULL);
  kiln_tensor *y = indices(1, (int64_t[]){64}, 10, NULL);
  kiln_tensor *r = kiln_cross_entropy(x, y);
  kiln_release(x);
  kiln_release(y);
  return r;
}

/* gather(x*x, 1, idx) * 2 + 1: the gather and its consumers in one kernel,
   its source a value computed by the kernel before */
static float ref_fused[33 * 5];
static kiln_tensor *gather_fused(void) {
  static float xs[33 * 17];
  static int64_t is[33 * 5];
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){33, 17}, xs);
  kiln_tensor *idx = indices(2, (int64_t[]){33, 5}, 17, is);
  for (int r = 0; r < 33; r++)
    for (int k = 0; k < 5; k++) {
      float v = xs[r * 17 + is[r * 5 + k]];
      ref_fused[r * 5 + k] = v * v * 2.0f + 1.0f;
    }
  kiln_tensor *sq = kiln_mul(x, x), *g = kiln_gather(sq, 1, idx), *m = kiln_mul_scalar(g, 2.0),
              *r = kiln_add_scalar(m, 1.0);
  kiln_release(x);
  kiln_release(idx);
  kiln_release(sq);
  kiln_release(g);
  kiln_release(m);
  return r;
}

/* gather along axis 0 from a leaf, a broadcast bias, a sum over axis 1:
   the gather is a producer of the reduction */
static kiln_tensor *gather_axis0_sum(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){9, 40}, NULL);
  kiln_tensor *idx = indices(2, (int64_t[]){4, 40}, 9, NULL);
  kiln_tensor *b = floats(KILN_F32, 1, (int64_t[]){40}, NULL);
  kiln_tensor *g = kiln_gather(x, 0, idx), *s = kiln_add(g, b);
  int axis = 1;
  kiln_tensor *r = kiln_sum(s, 1, &axis, false);
  kiln_release(x);
  kiln_release(idx);
  kiln_release(b);
  kiln_release(g);
  kiln_release(s);
  return r;
}

/* an embedding: rows of W by token, scaled, plus positions, relu */
static float ref_embed[20 * 32];
static kiln_tensor *embedding(void) {
  static float ws[50 * 32], ps[20 * 32];
  static int64_t ts[20];
  kiln_tensor *w = floats(KILN_F32, 2, (int64_t[]){50, 32}, ws);
  kiln_tensor *tok = indices(1, (int64_t[]){20}, 50, ts);
  kiln_tensor *pos = floats(KILN_F32, 2, (int64_t[]){20, 32}, ps);
  for (int i = 0; i < 20; i++)
    for (int j = 0; j < 32; j++) {
      float v = ws[ts[i] * 32 + j] * 0.5f + ps[i * 32 + j];
      ref_embed[i * 32 + j] = v > 0 ? v : 0;
    }
  kiln_tensor *e = kiln_index_select(w, 0, tok), *m = kiln_mul_scalar(e, 0.5),
              *s = kiln_add(m, pos), *r = kiln_relu(s);
  kiln_release(w);
  kiln_release(tok);
  kiln_release(pos);
  kiln_release(e);
  kiln_release(m);
  kiln_release(s);
  return r;
}

/* index_select of columns (the select index moves along the inner axis),
   exp, and a row sum */
static kiln_tensor *select_columns(void) {
  kiln_tensor *x = floats(KILN_F64, 2, (int64_t[]){16, 30}, NULL);
  kiln_tensor *idx = indices(1, (int64_t[]){7}, 30, NULL);
  kiln_tensor *s = kiln_index_select(x, 1, idx), *e = kiln_exp(s);
  int axis = 1;
  kiln_tensor *r = kiln_sum(e, 1, &axis, true);
  kiln_release(x);
  kiln_release(idx);
  kiln_release(s);
  kiln_release(e);
  return r;
}

/* a gather from a transposed view (strided source), integers */
static kiln_tensor *gather_transposed_i32(void) {
  kiln_tensor *x = floats(KILN_I32, 2, (int64_t[]){17, 33}, NULL);
  kiln_tensor *xt = kiln_transpose(x, 0, 1);
  kiln_tensor *idx = indices(2, (int64_t[]){33, 3}, 17, NULL);
  kiln_tensor *g = kiln_gather(xt, 1, idx), *r = kiln_add_scalar(g, 3.0);
  kiln_release(x);
  kiln_release(xt);
  kiln_release(idx);
  kiln_release(g);
  return r;
}

/* gather(x * 2, 1, idx) + x with idx of x's shape: the source is computed
   in a loop nest of the gather's own shape, which the gather must not join
   (its kernel reads sources from outside) */
static kiln_tensor *gather_same_shape(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){12, 8}, NULL);
  kiln_tensor *idx = indices(2, (int64_t[]){12, 8}, 8, NULL);
  kiln_tensor *y = kiln_mul_scalar(x, 2.0), *g = kiln_gather(y, 1, idx), *r = kiln_add(g, x);
  kiln_release(x);
  kiln_release(idx);
  kiln_release(y);
  kiln_release(g);
  return r;
}

/* a column sum (sum over axis 0) with an epilogue: a bias update */
static kiln_tensor *column_epilogue(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){128, 40}, NULL);
  kiln_tensor *b = floats(KILN_F32, 1, (int64_t[]){40}, NULL);
  int axis = 0;
  kiln_tensor *s = kiln_sum(x, 1, &axis, false), *m = kiln_mul_scalar(s, 0.01), *r = kiln_sub(b, m);
  kiln_release(x);
  kiln_release(b);
  kiln_release(s);
  kiln_release(m);
  return r;
}

/* a long row sum (folded in chunks between the kernels) and its epilogue */
static kiln_tensor *long_row_epilogue(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){3, 20000}, NULL);
  kiln_tensor *sq = kiln_mul(x, x);
  int axis = 1;
  kiln_tensor *s = kiln_sum(sq, 1, &axis, false), *q = kiln_sqrt(s), *r = kiln_add_scalar(q, 1.0);
  kiln_release(x);
  kiln_release(sq);
  kiln_release(s);
  kiln_release(q);
  return r;
}

/* scatter_add into zeros along axis 1 with repeated indices, times 3: the
   sources of one element are added in index order, which decides the
   bits (1e8 + 1 - 1e8 is 0 in f32, 1e8 - 1e8 + 1 is 1) */
static float ref_scatter[4 * 5];
static kiln_tensor *scatter_repeated(void) {
  static const float sv[4 * 3] = {1e8f, 1.0f, -1e8f, 0.5f,  -0.25f, 2.0f,
                                  1.0f, 1e8f, -1e8f, -0.0f, 3.0f,   1.5f};
  static const int64_t iv[4 * 3] = {2, 2, 2, 0, 4, 0, 1, 1, 1, 3, 3, 0};
  memset(ref_scatter, 0, sizeof ref_scatter);
  for (int r = 0; r < 4; r++)
    for (int k = 0; k < 3; k++) ref_scatter[r * 5 + iv[r * 3 + k]] += sv[r * 3 + k];
  for (int i = 0; i < 20; i++) ref_scatter[i] *= 3.0f;
  kiln_tensor *src = kiln_from_data(sv, KILN_F32, 2, (int64_t[]){4, 3});
  kiln_tensor *idx = kiln_from_data(iv, KILN_I64, 2, (int64_t[]){4, 3});
  kiln_tensor *z = kiln_zeros(KILN_F32, 2, (int64_t[]){4, 5}),
              *sc = kiln_scatter_add(z, 1, idx, src), *r = kiln_mul_scalar(sc, 3.0);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(z);
  kiln_release(sc);
  return r;
}

/* scatter_add along axis 0 (not the inner one) onto a base the kernel
   computes (x * 2), f64, then + 1 */
static kiln_tensor *scatter_axis0_computed_base(void) {
  kiln_tensor *x = floats(KILN_F64, 2, (int64_t[]){6, 9}, NULL);
  kiln_tensor *src = floats(KILN_F64, 2, (int64_t[]){2, 9}, NULL);
  kiln_tensor *idx = indices(2, (int64_t[]){2, 9}, 6, NULL);
  kiln_tensor *b = kiln_mul_scalar(x, 2.0), *sc = kiln_scatter_add(b, 0, idx, src),
              *r = kiln_add_scalar(sc, 1.0);
  kiln_release(x);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(b);
  kiln_release(sc);
  return r;
}

/* scatter_add of integers (wrapping adds) into a leaf */
static kiln_tensor *scatter_i32(void) {
  kiln_tensor *x = floats(KILN_I32, 2, (int64_t[]){5, 8}, NULL);
  kiln_tensor *src = floats(KILN_I32, 2, (int64_t[]){5, 4}, NULL);
  kiln_tensor *idx = indices(2, (int64_t[]){5, 4}, 8, NULL);
  kiln_tensor *sc = kiln_scatter_add(x, 1, idx, src), *r = kiln_mul_scalar(sc, 3.0);
  kiln_release(x);
  kiln_release(src);
  kiln_release(idx);
  kiln_release(sc);
  return r;
}

/* concat of three parts along axis 1 (one a transposed view), times 2,
   minus 1 */
static float ref_concat[6 * 12];
static kiln_tensor *concat_parts(void) {
  static float av[6 * 3], bv[4 * 6], cv[6 * 5];
  kiln_tensor *a = floats(KILN_F32, 2, (int64_t[]){6, 3}, av),
              *b = floats(KILN_F32, 2, (int64_t[]){4, 6}, bv),
              *cc = floats(KILN_F32, 2, (int64_t[]){6, 5}, cv);
  for (int r = 0; r < 6; r++)
    for (int j = 0; j < 12; j++) {
      float v = j < 3 ? av[r * 3 + j] : j < 7 ? bv[(j - 3) * 6 + r] : cv[r * 5 + j - 7];
      ref_concat[r * 12 + j] = v * 2.0f - 1.0f;
    }
  kiln_tensor *bt = kiln_transpose(b, 0, 1);
  kiln_tensor *parts[3] = {a, bt, cc};
  kiln_tensor *c = kiln_concat(3, parts, 1), *m = kiln_mul_scalar(c, 2.0),
              *r = kiln_sub_scalar(m, 1.0);
  kiln_release(a);
  kiln_release(b);
  kiln_release(cc);
  kiln_release(bt);
  kiln_release(c);
  kiln_release(m);
  return r;
}

/* zeros, x, zeros along axis 0 (the join of a slice's gradient), exp */
static kiln_tensor *concat_fills_axis0(void) {
  kiln_tensor *x = floats(KILN_F64, 3, (int64_t[]){2, 3, 7}, NULL);
  kiln_tensor *z1 = kiln_zeros(KILN_F64, 3, (int64_t[]){3, 3, 7}),
              *z2 = kiln_zeros(KILN_F64, 3, (int64_t[]){1, 3, 7});
  kiln_tensor *parts[3] = {z1, x, z2};
  kiln_tensor *c = kiln_concat(3, parts, 0), *r = kiln_exp(c);
  kiln_release(x);
  kiln_release(z1);
  kiln_release(z2);
  kiln_release(c);
  return r;
}

/* the gradient of the mean cross-entropy: the gather's VJP, a scatter_add
   into zeros, fused with the softmax's VJP */
static kiln_tensor *cross_entropy_grad(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){32, 10}, NULL);
  kiln_tensor *y = indices(1, (int64_t[]){32}, 10, NULL);
  kiln_set_requires_grad(x, true);
  kiln_tensor *l = kiln_cross_entropy(x, y);
  kiln_backward(l, NULL);
  kiln_tensor *g = kiln_grad(x);
  kiln_release(x);
  kiln_release(y);
  kiln_release(l);
  return g;
}

/* a GRU cell's gates sliced from one [B, 3H] pre-activation: the gradient
   joins the three slices' gradients with one concat */
static kiln_tensor *gate_slices_grad(void) {
  kiln_tensor *x = floats(KILN_F32, 2, (int64_t[]){8, 3 * 16}, NULL);
  kiln_tensor *h = floats(KILN_F32, 2, (int64_t[]){8, 16}, NULL);
  kiln_set_requires_grad(x, true);
  kiln_tensor *r = kiln_slice(x, 1, 0, 16, 1), *z = kiln_slice(x, 1, 16, 32, 1),
              *n = kiln_slice(x, 1, 32, 48, 1);
  kiln_tensor *rs = kiln_sigmoid(r), *zs = kiln_sigmoid(z), *rn = kiln_mul(rs, n),
              *nt = kiln_tanh(rn), *d = kiln_sub(h, nt), *zd = kiln_mul(zs, d),
              *hn = kiln_add(nt, zd), *sq = kiln_mul(hn, hn);
  kiln_tensor *l = kiln_sum(sq, 0, NULL, false);
  kiln_backward(l, NULL);
  kiln_tensor *g = kiln_grad(x);
  kiln_tensor *all[] = {x, h, r, z, n, rs, zs, rn, nt, d, zd, hn, sq, l};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
  return g;
}

/* argmax + argmin along the inner axis over NaNs, signed zeros and ties
   (the first NaN, else the first extreme), and argmax along axis 0 */
static kiln_tensor *arg_extremes(void) {
  static const float xv[4 * 6] = {1,     3,    3,  2,     0, -1, NAN, 1, 2, NAN, 5,   0,
                                  -0.0f, 0.0f, -1, -0.0f, 0, 0,  4,   2, 9, 9,   NAN, 1};
  kiln_tensor *x = kiln_from_data(xv, KILN_F32, 2, (int64_t[]){4, 6});
  kiln_tensor *a = kiln_argmax(x, 1, false), *b = kiln_argmin(x, 1, false),
              *ab = kiln_mul_scalar(b, 10.0), *r1 = kiln_add(a, ab), *c = kiln_argmax(x, 0, true),
              *cc = kiln_reshape(c, 1, (int64_t[]){6}), *c4 = kiln_slice(cc, 0, 0, 4, 1),
              *c100 = kiln_mul_scalar(c4, 100.0), *r = kiln_add(r1, c100);
  kiln_tensor *all[] = {x, a, b, ab, r1, c, cc, c4, c100};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
  return r;
}

/* accuracy: argmax of computed logits (f64) equal to the targets, as a
   float count */
static kiln_tensor *accuracy(void) {
  kiln_tensor *x = floats(KILN_F64, 2, (int64_t[]){50, 7}, NULL),
              *b = floats(KILN_F64, 1, (int64_t[]){7}, NULL);
  kiln_tensor *y = indices(1, (int64_t[]){50}, 7, NULL);
  kiln_tensor *l = kiln_add(x, b), *a = kiln_argmax(l, 1, false), *e = kiln_eq(a, y),
              *f = kiln_cast(e, KILN_F32);
  kiln_tensor *r = kiln_sum(f, 0, NULL, false);
  kiln_tensor *all[] = {x, b, y, l, a, e, f};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
  return r;
}

/* --- random data movement: one of gather, index_select, scatter_add,
   concat, argmax/argmin, over a random dtype, rank (1-3), shape, axis and
   source layout (possibly transposed), then a consumer; the inputs and
   the choices come from rng_state (set per program by the child) --------- */

static int pick_int(int n) { return (int)(next_u64() % (uint64_t)n); }

static kiln_tensor *random_leaf(kiln_dtype dt, int nd, const int64_t *shape, bool transposed) {
  if (!transposed || nd < 2) return floats(dt, nd, shape, NULL);
  int64_t sw[3];
  memcpy(sw, shape, (size_t)nd * sizeof *sw);
  sw[0] = shape[nd - 1], sw[nd - 1] = shape[0];
  kiln_tensor *t = floats(dt, nd, sw, NULL), *v = kiln_transpose(t, 0, nd - 1);
  kiln_release(t);
  return v;
}

static kiln_tensor *random_move(void) {
  static const kiln_dtype dts[4] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
  kiln_dtype dt = dts[pick_int(4)];
  int nd = 1 + pick_int(3), axis = pick_int(nd), kind = pick_int(5);
  int64_t shape[3];
  for (int d = 0; d < nd; d++) shape[d] = 1 + pick_int(9);
  bool tr = pick_int(2);
  kiln_tensor *x = random_leaf(dt, nd, shape, tr), *r = NULL, *idx = NULL, *y = NULL, *z = NULL;
  int64_t is[3];
  memcpy(is, shape, sizeof is);
  switch (kind) {
    case 0: /* gather: an index of the source's shape but for the axis */
      is[axis] = 1 + pick_int(6);
      idx = indices(nd, is, shape[axis], NULL);
      r = kiln_gather(x, axis, idx);
      break;
    case 1:
      idx = indices(1, (int64_t[]){1 + pick_int(7)}, shape[axis], NULL);
      r = kiln_index_select(x, axis, idx);
      break;
    case 2: /* scatter_add of at most 8 positions onto x */
      is[axis] = 1 + pick_int(8);
      idx = indices(nd, is, shape[axis], NULL);
      y = random_leaf(dt, nd, is, pick_int(2));
      r = kiln_scatter_add(x, axis, idx, y);
      break;
    case 3: { /* concat of 2 or 3 parts, one maybe zeros */
      int n = 2 + pick_int(2);
      kiln_tensor *parts[3];
      for (int k = 0; k < n; k++) {
        int64_t ps[3];
        memcpy(ps, shape, sizeof ps);
        ps[axis] = 1 + pick_int(4);
        parts[k] = k == 1 && pick_int(3) == 0 ? kiln_zeros(dt, nd, ps)
                                              : random_leaf(dt, nd, ps, pick_int(2));
      }
      r = kiln_concat(n, parts, axis);
      for (int k = 0; k < n; k++) kiln_release(parts[k]);
      break;
    }
    default:
      r = pick_int(2) ? kiln_argmax(x, axis, pick_int(2)) : kiln_argmin(x, axis, pick_int(2));
      break;
  }
  /* a consumer in the same loop nest */
  z = pick_int(2) ? kiln_mul(r, r) : kiln_add_scalar(r, 3.0);
  kiln_release(x);
  kiln_release(idx);
  kiln_release(y);
  kiln_release(r);
  return z;
}

typedef struct {
  const char *name;
  kiln_tensor *(*build)(void);
  const float *reference; /* values computed here, or NULL */
  int copies; /* groups that only move or scan (a concat, an argmax alone): jit_cpu compiles no
                 kernel for them (the interpreter's own kernels are faster), so they run there */
} program;

static const program programs[] = {
    {"cross_entropy", cross_entropy, NULL, 0},
    {"gather_fused", gather_fused, ref_fused, 0},
    {"gather_axis0_sum", gather_axis0_sum, NULL, 0},
    {"embedding", embedding, ref_embed, 0},
    {"select_columns", select_columns, NULL, 0},
    {"gather_transposed_i32", gather_transposed_i32, NULL, 0},
    {"gather_same_shape", gather_same_shape, NULL, 0},
    {"column_epilogue", column_epilogue, NULL, 0},
    {"long_row_epilogue", long_row_epilogue, NULL, 0},
    {"scatter_repeated", scatter_repeated, ref_scatter, 0},
    {"scatter_axis0_computed_base", scatter_axis0_computed_base, NULL, 0},
    {"scatter_i32", scatter_i32, NULL, 0},
    {"concat_parts", concat_parts, ref_concat, 0},
    {"concat_fills_axis0", concat_fills_axis0, NULL, 0},
    {"cross_entropy_grad", cross_entropy_grad, NULL, 0},
    {"gate_slices_grad", gate_slices_grad, NULL, 1},
    {"arg_extremes", arg_extremes, NULL, 1}, /* the argmax over axis 0 is a group of its own */
    {"accuracy", accuracy, NULL, 0},
#define R(k) \
  { "random_move_" #k, random_move, NULL, 0 }
    R(00),
    R(01),
    R(02),
    R(03),
    R(04),
    R(05),
    R(06),
    R(07),
    R(08),
    R(09),
    R(10),
    R(11),
    R(12),
    R(13),
    R(14),
    R(15),
    R(16),
    R(17),
    R(18),
    R(19),
    R(20),
    R(21),
    R(22),
    R(23),
#undef R
};
#define NPROGRAMS (int)(sizeof programs / sizeof programs[0])

/* the child: per program "name eager=N ref=ok|bad|- bits" for its third run */
static int work(void) {
  for (int p = 0; p < NPROGRAMS; p++) {
    for (int rep = 0; rep < 3; rep++) {
      rng_state = 88172645463325252ull + (uint64_t)p; /* the same inputs every run */
      kiln_stats before, after;
      kiln_get_stats(&before);
      kiln_tensor *r = programs[p].build();
      kiln_dtype dt = r ? kiln_dtype_of(r) : KILN_F32;
      size_t bytes = r ? (size_t)kiln_numel(r) * (dt == KILN_F64 || dt == KILN_I64 ? 8
                                                  : dt == KILN_BOOL                ? 1
                                                                                   : 4)
                       : 0;
      unsigned char *buf = malloc(bytes ? bytes : 1);
      int rc = r ? kiln_to_buffer(r, buf, bytes) : -1;
      kiln_get_stats(&after);
      if (rep == 2) {
        const char *ref = "-";
        if (programs[p].reference && rc == 0) {
          ref = "ok";
          for (size_t i = 0; i < bytes / 4; i++)
            if (((float *)buf)[i] != programs[p].reference[i]) ref = "bad";
        }
        printf("%s rc=%d eager=%llu ref=%s ", programs[p].name, rc,
               (unsigned long long)(after.eager_ops - before.eager_ops), ref);
        for (size_t i = 0; rc == 0 && i < bytes; i++) printf("%02x", buf[i]);
        printf("\n");
      }
      free(buf);
      kiln_release(r);
    }
  }
  return 0;
}

static char *child_out(const char *jit) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "env KILN_JIT=%s KILN_HOT=1 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work", jit,
           self);
  FILE *p = popen(cmd, "r");
  size_t len = 0, cap = 1 << 20;
  char *out = calloc(cap, 1); /* the last line's NUL, then another */
  if (p) {
    size_t got;
    while ((got = fread(out + len, 1, cap - 2 - len, p)) > 0) len += got;
    pclose(p);
  }
  return out;
}

/* the line of program name in a child's output (its lines NUL-ended by
   split_lines); NULL if none */
static char *line_of(char *out, const char *name) {
  size_t n = strlen(name);
  for (char *l = out; *l; l += strlen(l) + 1)
    if (!strncmp(l, name, n) && l[n] == ' ') return l;
  return NULL;
}

/* ends every line with a NUL (calloc'd: the last is followed by more) */
static void split_lines(char *out) {
  size_t n = strlen(out);
  for (size_t i = 0; i < n; i++)
    if (out[i] == '\n') out[i] = 0;
}

/* the bits after "ref=..." */
static const char *bits_of(const char *l) {
  const char *r = strstr(l, "ref=");
  return r ? strchr(r, ' ') : NULL;
}

TEST(compiled_gathers_match_the_interpreter_bit_for_bit) {
  char *jit = child_out("1"), *ref = child_out("0");
  split_lines(jit);
  split_lines(ref);
  for (int p = 0; p < NPROGRAMS; p++) {
    char *lj = line_of(jit, programs[p].name), *lr = line_of(ref, programs[p].name);
    if (!lj || !lr) {
      KTEST_FAIL("%s: no output (jit: %s, interpreter: %s)", programs[p].name, lj ? "yes" : "no",
                 lr ? "yes" : "no");
      continue;
    }
    const char *bj = bits_of(lj), *br = bits_of(lr);
    if (!strstr(lj, " rc=0 ") || !strstr(lr, " rc=0 "))
      KTEST_FAIL("%s failed: %.80s", programs[p].name, lj);
    /* compiled: nothing ran on the interpreter (BLAS aside: none here) but
       the copies */
    const char *e = strstr(lj, " eager=");
    if (!e || atoi(e + 7) != programs[p].copies)
      KTEST_FAIL("%s left work to the interpreter: %.60s", programs[p].name, lj);
    if (strstr(lj, "ref=bad") || strstr(lr, "ref=bad"))
      KTEST_FAIL("%s disagrees with the values computed here", programs[p].name);
    if (!bj || !br || strcmp(bj, br))
      KTEST_FAIL("%s: compiled bits differ from the interpreter's", programs[p].name);
  }
  free(jit);
  free(ref);
}

/* the compiled plan of a gather is run with an index out of range: the
   kernel must not read it; the error is the interpreter's */
static int gather_with(const int64_t *idx_values, float *out) {
  int64_t xs[2] = {6, 4}, is[2] = {6, 2};
  float xv[24];
  for (int i = 0; i < 24; i++) xv[i] = (float)i;
  kiln_tensor *x = kiln_from_data(xv, KILN_F32, 2, xs),
              *idx = kiln_from_data(idx_values, KILN_I64, 2, is);
  kiln_tensor *sq = kiln_mul(x, x), *g = kiln_gather(sq, 1, idx), *r = kiln_add_scalar(g, 0.5);
  int rc = kiln_to_buffer(r, out, 12 * sizeof(float));
  kiln_release(x);
  kiln_release(idx);
  kiln_release(sq);
  kiln_release(g);
  kiln_release(r);
  return rc;
}

TEST(index_out_of_range_in_a_compiled_plan) {
  int64_t good[12] = {0, 3, 1, 2, 3, 3, 0, 0, 2, 1, 1, 0}, bad[12];
  memcpy(bad, good, sizeof bad);
  bad[7] = 4; /* axis 1 has 4 columns */
  float out[12];
  for (int rep = 0; rep < 3; rep++) CHECK_EQ_INT(gather_with(good, out), 0);
  CHECK(out[1] == 3.0f * 3.0f + 0.5f && out[7] == 12.0f * 12.0f + 0.5f);
  kiln_stats before, after;
  kiln_get_stats(&before);
  CHECK_EQ_INT(gather_with(good, out), 0);
  kiln_get_stats(&after);
  CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0); /* the compiled plan ran */
  kiln_clear_error();
  CHECK(gather_with(bad, out) == KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "index 4 is out of range for axis 1 of size 4");
  kiln_clear_error();
  bad[7] = -1;
  CHECK(gather_with(bad, out) == KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "index -1 is out of range");
  kiln_clear_error();
  CHECK_EQ_INT(gather_with(good, out), 0);
  CHECK(out[1] == 3.0f * 3.0f + 0.5f && out[11] == 20.0f * 20.0f + 0.5f);
}

/* a compiled scatter_add's index out of range (of the output's axis):
   the interpreter's error, then the next valid run computes again */
static int scatter_with(const int64_t *idx_values, float *out) {
  float sv[6] = {1, 2, 3, 4, 5, 6};
  kiln_tensor *src = kiln_from_data(sv, KILN_F32, 2, (int64_t[]){3, 2});
  kiln_tensor *idx = kiln_from_data(idx_values, KILN_I64, 2, (int64_t[]){3, 2});
  kiln_tensor *z = kiln_zeros(KILN_F32, 2, (int64_t[]){3, 4}),
              *sc = kiln_scatter_add(z, 1, idx, src), *r = kiln_add_scalar(sc, 0.5);
  int rc = kiln_to_buffer(r, out, 12 * sizeof(float));
  kiln_release(src);
  kiln_release(idx);
  kiln_release(z);
  kiln_release(sc);
  kiln_release(r);
  return rc;
}

TEST(scatter_index_out_of_range_in_a_compiled_plan) {
  int64_t good[6] = {3, 3, 0, 1, 2, 0}, bad[6];
  memcpy(bad, good, sizeof bad);
  bad[3] = 4;
  float out[12];
  for (int rep = 0; rep < 3; rep++) CHECK_EQ_INT(scatter_with(good, out), 0);
  CHECK(out[3] == 3.5f && out[4] == 3.5f && out[5] == 4.5f && out[10] == 5.5f && out[8] == 6.5f);
  kiln_stats before, after;
  kiln_get_stats(&before);
  CHECK_EQ_INT(scatter_with(good, out), 0);
  kiln_get_stats(&after);
  CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0); /* the compiled plan ran */
  kiln_clear_error();
  CHECK(scatter_with(bad, out) == KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "index 4 is out of range for axis 1 of size 4");
  kiln_clear_error();
  CHECK_EQ_INT(scatter_with(good, out), 0);
  CHECK(out[3] == 3.5f && out[0] == 0.5f);
}

/* a scatter_add with more than a few positions along its axis (an
   embedding's gradient) is not computed per output element: it stays the
   interpreter's one pass over the sources, and the rest is compiled */
TEST(a_long_scatter_stays_one_data_op) {
  float out[40 * 4];
  double eager = 0;
  for (int rep = 0; rep < 3; rep++) {
    float sv[64 * 4];
    int64_t iv[64 * 4];
    for (int i = 0; i < 64 * 4; i++) sv[i] = (float)(i % 7), iv[i] = (i * 13) % 40;
    kiln_tensor *src = kiln_from_data(sv, KILN_F32, 2, (int64_t[]){64, 4});
    kiln_tensor *idx = kiln_from_data(iv, KILN_I64, 2, (int64_t[]){64, 4});
    kiln_tensor *z = kiln_zeros(KILN_F32, 2, (int64_t[]){40, 4}),
                *sc = kiln_scatter_add(z, 0, idx, src), *r = kiln_add_scalar(sc, 1.0);
    double e0 = kiln_stat("eager_ops");
    CHECK_EQ_INT(kiln_to_buffer(r, out, sizeof out), 0);
    eager = kiln_stat("eager_ops") - e0;
    kiln_release(src);
    kiln_release(idx);
    kiln_release(z);
    kiln_release(sc);
    kiln_release(r);
  }
  CHECK(eager == 2); /* the scatter_add and the zeros it adds into */
  float want = 1.0f;
  for (int i = 0; i < 64; i++)
    if ((i * 4 * 13) % 40 == 0) want += (float)((i * 4) % 7);
  CHECK(out[0] == want);
}

/* a view moves no data: counted in view_ops, never in eager_ops */
TEST(views_are_counted_apart_from_eager_ops) {
  float v[6] = {1, 2, 3, 4, 5, 6}, out[6];
  kiln_tensor *x = kiln_from_data(v, KILN_F32, 2, (int64_t[]){2, 3});
  double views = kiln_stat("view_ops");
  kiln_stats before, after;
  kiln_get_stats(&before);
  kiln_tensor *t = kiln_transpose(x, 0, 1), *r = kiln_add_scalar(t, 1.0); /* one compiled kernel */
  CHECK_EQ_INT(kiln_to_buffer(r, out, sizeof out), 0);
  kiln_get_stats(&after);
  CHECK(out[1] == 5.0f && out[2] == 3.0f);
  CHECK(kiln_stat("view_ops") >= views + 1);
  CHECK_EQ_INT(after.eager_ops - before.eager_ops, 0);
  kiln_release(r);
  kiln_release(t);
  kiln_release(x);
}

int main(int argc, char **argv) {
  /* before any Kiln call: plan every trace on first sight, compile inline */
  setenv("KILN_HOT", "1", 1);
  setenv("KILN_ASYNC", "0", 1);
  if (argc >= 2 && !strcmp(argv[1], "work")) return work();
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  unsetenv("KILN_JIT");
  RUN(compiled_gathers_match_the_interpreter_bit_for_bit);
  RUN(index_out_of_range_in_a_compiled_plan);
  RUN(scatter_index_out_of_range_in_a_compiled_plan);
  RUN(a_long_scatter_stays_one_data_op);
  RUN(views_are_counted_apart_from_eager_ops);
  return ktest_done();
}
