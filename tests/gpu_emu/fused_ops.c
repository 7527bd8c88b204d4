/* fused_ops.c — the GPU backend's fused plan kernels (jit_gpu/fuse.h)
 * without a GPU.  Built twice:
 *   - with FUSED_GEN (gpu_emu_gen_fused, at build time): runs the programs
 *     below with a CPU backend whose compiled path plans each group as a
 *     fused GPU kernel, and writes those kernels' CUDA C (fused_kernels.inc)
 *     and a table of their entries (fused_registry.inc);
 *   - as test_gpu_fused_emulated: runs the same programs on the plain
 *     (planned) interpreter, then with every elementwise and reduce group
 *     run by the real runner (gpu_fused_run) on host memory, its kernels under the
 *     CPU emulation of CUDA (emu.hpp), and compares the results: bit for
 *     bit, except f32/f64 transcendentals (CUDA's math library in place of
 *     Kiln's: 4 ulps f32, 1e-12 relative f64) and NaN payloads.  It also
 *     counts that the kernels ran (every program fuses at least one group;
 *     a reducing one, a reduction; a row program, a row kernel; the long
 *     ones, joins) and that a program's second variant (other extents)
 *     needs no kernel its first did not: kernels are shape-generic.
 * The plans are the ones a CUDA trace would get (plans are device-neutral),
 * so this is what can be proven of the fused path here; scripts/gpu-check
 * runs the same kernels on a GPU (test_gpu_ops). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit_gpu/fuse.h"
#include "jit_gpu/nvrtc.h"
#include "kiln.h"
#include "trace/inspect.h"
#include "vm/backend.h"
#include "vm/dtype.h"
#include "vm/state.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define MAX_OUT 8

/* --- inputs -------------------------------------------------------------------------- */

static uint64_t rs;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

/* deterministic values of dtype dt, specials (NaN, inf, -0, huge) among them */
static kiln_tensor *input(kiln_dtype dt, int nd, const int64_t *shape, uint64_t seed,
                          bool special) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  rs = seed * 0x9E3779B97F4A7C15ull + 1;
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(rnd() >> 11) * 0x1p-53;
    v[i] = (u - 0.5) * 8;
    if (special && rnd() % 11 == 0) {
      static const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 3e9, -3e9, 1e30};
      v[i] = sp[rnd() % 8];
    }
  }
  void *buf = malloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case KILN_F32:
        ((float *)buf)[i] = (float)v[i];
        break;
      case KILN_F64:
        ((double *)buf)[i] = v[i];
        break;
      case KILN_I32:
        ((int32_t *)buf)[i] = (int32_t)(rnd() % 2001) - 1000 + (rnd() % 7 == 0 ? INT32_MAX - 3 : 0);
        break;
      case KILN_I64:
        ((int64_t *)buf)[i] = (int64_t)(rnd() % 2001) - 1000 + (rnd() % 7 == 0 ? INT64_MAX - 3 : 0);
        break;
      case KILN_BF16:
      case KILN_F16: /* a value rounded, or (specials) any pattern: subnormals, signaling NaNs */
        if (special && rnd() % 13 == 0)
          ((uint16_t *)buf)[i] = (uint16_t)rnd();
        else
          vm_store_f64(buf, dt, i, v[i]);
        break;
      case KILN_I16:
        ((uint16_t *)buf)[i] = (uint16_t)rnd(); /* every pattern: arithmetic wraps */
        break;
      case KILN_U8:
      case KILN_I8:
        ((uint8_t *)buf)[i] = (uint8_t)rnd();
        break;
      default:
        ((uint8_t *)buf)[i] = rnd() & 1;
        break;
    }
  }
  kiln_tensor *t = kiln_from_data(buf, dt, nd, shape);
  free(v);
  free(buf);
  return t;
}

/* --- programs: each makes its outputs from fresh inputs ------------------------------ */

typedef struct {
  kiln_tensor *out[MAX_OUT];
  int n;
  bool transcendental; /* compared within ulps */
} outs;

static void put(outs *o, kiln_tensor *t) {
  if (o->n == MAX_OUT) {
    fprintf(stderr, "a program puts more than MAX_OUT outputs\n");
    abort();
  }
  o->out[o->n++] = t;
}

/* broadcasts (a row and a column bias), arithmetic, comparisons, where */
static void p_bias_relu(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 1, true),
              *row = input(KILN_F32, 2, S(1, C), 2, true);
  kiln_tensor *col = input(KILN_F32, 2, S(R, 1), 3, false),
              *g = input(KILN_F32, 2, S(R, C), 4, true);
  kiln_tensor *h = kiln_add(kiln_mul(x, col), row);
  kiln_tensor *zero = kiln_full(0, KILN_F32, 0, NULL);
  kiln_tensor *r = kiln_where(kiln_le(h, zero), zero, h);
  put(o, r);
  put(o, kiln_where(kiln_gt(r, zero), g, zero));
  put(o, kiln_mul_scalar(kiln_sub(h, g), 0.25));
}

/* f64 with host scalars, division, maximum/minimum (NaN, -0), clamp */
static void p_f64_scalars(outs *o, int64_t n) {
  kiln_tensor *x = input(KILN_F64, 1, S(n), 5, true), *y = input(KILN_F64, 1, S(n), 6, true);
  kiln_tensor *a = kiln_div(kiln_mul_scalar(kiln_sub_scalar(x, 0.5), 3.0), y);
  put(o, a);
  put(o, kiln_maximum(x, y));
  put(o, kiln_minimum(kiln_neg(x), y));
  put(o, kiln_clamp(kiln_add(a, x), -2.5, 7.0));
  put(o, kiln_floor(kiln_add_scalar(kiln_abs(y), 0.5)));
}

/* integers wrap (u8, i8, i16 over every bit pattern); comparisons give
   bools; casts from the float dtype fdt saturate (values to +-200: past
   the narrow integers' ranges); a cast to the float dtype to */
static void p_ints(outs *o, kiln_dtype dt, kiln_dtype fdt, kiln_dtype to, int64_t R, int64_t C) {
  kiln_tensor *a = input(dt, 2, S(R, C), 7, false), *b = input(dt, 2, S(1, C), 8, false);
  kiln_tensor *f = input(fdt, 2, S(R, C), 9, true);
  kiln_tensor *s = kiln_add(kiln_mul(a, b), a);
  put(o, s);
  put(o, kiln_sub(kiln_neg(s), b));
  put(o, kiln_lt(s, b));
  put(o, kiln_where(kiln_ge(a, b), kiln_abs(a), kiln_sign(b)));
  put(o, kiln_add(kiln_cast(kiln_mul_scalar(f, 50.0), dt), a));
  put(o, kiln_cast(kiln_add(s, b), to));
}

static void p_bools(outs *o, int64_t n) {
  kiln_tensor *a = input(KILN_BOOL, 1, S(n), 10, false), *b = input(KILN_BOOL, 1, S(n), 11, false);
  kiln_tensor *x = input(KILN_F32, 1, S(n), 12, true);
  kiln_tensor *c = kiln_logical_or(kiln_logical_and(a, kiln_logical_not(b)), kiln_ne(a, b));
  put(o, c);
  put(o, kiln_where(c, x, kiln_neg(x)));
  put(o, kiln_cast(c, KILN_F32));
  put(o, kiln_eq(kiln_cast(a, KILN_I32), kiln_cast(b, KILN_I32)));
}

/* views of leaves read through strides: a transpose, a slice, an expand */
static void p_views(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(C, R), 13, true),
              *y = input(KILN_F32, 2, S(R, 2 * C), 14, true);
  kiln_tensor *v = input(KILN_F32, 1, S(C), 15, false);
  kiln_tensor *xt = kiln_transpose(x, 0, 1);       /* [R, C], strided */
  kiln_tensor *ys = kiln_slice(y, 1, 1, 2 * C, 2); /* [R, C], step 2 */
  kiln_tensor *ve = kiln_expand(kiln_reshape(v, 2, S(1, C)), 2, S(R, C));
  put(o, kiln_add(kiln_mul(xt, ys), ve));
  put(o, kiln_sub(ys, xt));
}

/* a contiguous leaf whose data starts off its vector boundary (a slice
   evaluated before: a view 1 element into its storage) beside aligned
   ones: the kernel's vector path is skipped for it (the scalar loop does
   every element), as it is taken for the aligned program above */
static void p_offset(outs *o, int64_t n) {
  kiln_tensor *x = input(KILN_F32, 1, S(n + 1), 20, true), *y = input(KILN_F32, 1, S(n), 21, true);
  kiln_tensor *xs = kiln_slice(x, 0, 1, n + 1, 1);
  (void)kiln_eval(1, &xs);
  put(o, kiln_add(kiln_mul(xs, y), y));
  put(o, kiln_sub(y, xs));
}

/* transcendentals: compared within ulps */
static void p_math(outs *o, kiln_dtype dt, int64_t n) {
  kiln_tensor *x = input(dt, 1, S(n), 16, false);
  o->transcendental = true;
  put(o, kiln_exp(x));
  put(o, kiln_tanh(kiln_mul_scalar(x, 0.7)));
  put(o, kiln_sigmoid(x));
  put(o, kiln_log(kiln_add_scalar(kiln_abs(x), 1e-3)));
  put(o, kiln_sqrt(kiln_abs(x)));
}

/* 0-d values and an empty tensor */
static void p_small(outs *o) {
  kiln_tensor *a = input(KILN_F32, 0, NULL, 17, false), *b = input(KILN_F32, 0, NULL, 18, false);
  put(o, kiln_add(kiln_mul(a, b), kiln_mul_scalar(a, 2)));
  kiln_tensor *e = input(KILN_F32, 2, S(0, 5), 19, false);
  put(o, kiln_add_scalar(kiln_mul(e, e), 1));
}

/* a seeded random elementwise chain over three inputs (f32 or f64) */
static void p_random(outs *o, kiln_dtype dt, uint64_t seed) {
  int64_t R = 3 + (int64_t)(seed % 5), C = 5 + (int64_t)(seed % 7);
  kiln_tensor *pool[32];
  int np = 0;
  pool[np++] = input(dt, 2, S(R, C), seed * 3 + 100, true);
  pool[np++] = input(dt, 2, S(1, C), seed * 3 + 101, true);
  pool[np++] = input(dt, 2, S(R, 1), seed * 3 + 102, true);
  rs = seed * 7919 + 5;
  int steps = 4 + (int)(rnd() % 10);
  for (int s = 0; s < steps; s++) {
    kiln_tensor *a = pool[rnd() % (uint64_t)np], *b = pool[rnd() % (uint64_t)np], *r;
    switch (rnd() % 11) {
      case 0:
        r = kiln_add(a, b);
        break;
      case 1:
        r = kiln_sub(a, b);
        break;
      case 2:
        r = kiln_mul(a, b);
        break;
      case 3:
        r = kiln_div(a, b);
        break;
      case 4:
        r = kiln_maximum(a, b);
        break;
      case 5:
        r = kiln_minimum(a, b);
        break;
      case 6:
        r = kiln_neg(a);
        break;
      case 7:
        r = kiln_abs(a);
        break;
      case 8:
        r = kiln_where(kiln_gt(a, b), a, b);
        break;
      case 9:
        r = kiln_mul_scalar(a, 1.5);
        break;
      default:
        r = kiln_floor(a);
        break;
    }
    if (np < 32) pool[np++] = r;
  }
  put(o, pool[np - 1]);
  if (np > 4) put(o, pool[np - 2]);
}

static kiln_tensor *indices(int nd, const int64_t *shape, int64_t size, uint64_t seed);
#define AX(...) ((const int[]){__VA_ARGS__})

/* bf16 / f16: each op computed in f32 and rounded (a fused kernel rounds
   every half node it holds), host scalars and fills as half parameters,
   casts to and from the other floats and integers, a reduction and
   layer_norm (front/op.c: in f32 between casts), a concat and a gather
   moving a half's bits */
static void p_halves(outs *o, kiln_dtype dt, int64_t R, int64_t C) {
  kiln_tensor *x = input(dt, 2, S(R, C), 70, true), *w = input(dt, 2, S(1, C), 71, true);
  kiln_tensor *b = input(dt, 2, S(R, 1), 72, false);
  kiln_tensor *h = kiln_add(kiln_mul(x, w), b);
  kiln_tensor *zero = kiln_full(0, dt, 0, NULL);
  put(o, kiln_where(kiln_le(h, zero), zero, h));
  put(o, kiln_mul_scalar(kiln_sub(h, x), 0.1)); /* 0.1 is no half: rounded as the scalar */
  put(o, kiln_cast(kiln_div(h, kiln_add_scalar(kiln_abs(w), 1.0)), KILN_F64));
  kiln_tensor *f = input(KILN_F32, 2, S(R, C), 73, true);
  put(o, kiln_cast(kiln_add(kiln_cast(f, dt), kiln_cast(x, dt == KILN_BF16 ? KILN_F16 : KILN_BF16)),
                   KILN_I16));
  put(o, kiln_sum(kiln_mul(h, h), 1, AX(1), true));
  kiln_tensor *parts[3] = {x, kiln_zeros(dt, 2, S(R, 2)), kiln_neg(h)};
  kiln_tensor *cat = kiln_concat(3, parts, 1);
  put(o, kiln_add(kiln_gather(cat, 1, indices(2, S(R, 3), C + 2, 74)),
                  kiln_layer_norm(kiln_slice(h, 1, 0, 3, 1), NULL, NULL, 1e-3)));
}

/* u8, i8, i16: p_ints with casts from and to halves, then a max and a
   sum (in i64, front/op.c) */
static void p_narrow(outs *o, kiln_dtype dt, int64_t R, int64_t C) {
  p_ints(o, dt, KILN_BF16, KILN_F16, R, C);
  put(o, kiln_max(kiln_sub(o->out[0], o->out[1]), 1, AX(1), false));
  put(o, kiln_sum(o->out[0], 1, AX(0), false));
}

/* i64 indices in [0, size), of the given shape */
static kiln_tensor *indices(int nd, const int64_t *shape, int64_t size, uint64_t seed) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  int64_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  rs = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < n; i++) v[i] = (int64_t)(rnd() % (uint64_t)size);
  kiln_tensor *t = kiln_from_data(v, KILN_I64, nd, shape);
  free(v);
  return t;
}

/* gathers and index_selects computed in place (fuse.h GPU_IN_SOURCE): a
   cross-entropy pick summed (a reduction's producer), an index_select of
   a transposed (strided) source with its 1-d index, f64 and i32 sources
   gathered along axis 0 */
static void p_gathers(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 50, true),
              *y = input(KILN_F32, 2, S(C, 3), 51, false);
  kiln_tensor *lab = indices(2, S(R, 1), C, 52);
  kiln_tensor *picked = kiln_gather(kiln_mul_scalar(x, 2.0), 1, lab);
  put(o, kiln_sum(kiln_add_scalar(picked, 1.0), 0, NULL, false));
  kiln_tensor *xt = kiln_transpose(x, 0, 1); /* [C, R], strided */
  kiln_tensor *rows = indices(1, S(3), R, 53);
  put(o, kiln_add(kiln_mul_scalar(kiln_index_select(xt, 1, rows), 3.0), y));
  kiln_tensor *z = input(KILN_F64, 2, S(R, C), 54, false);
  put(o, kiln_neg(kiln_gather(z, 0, indices(2, S(4, C), R, 55))));
  kiln_tensor *k = input(KILN_I32, 2, S(R, C), 56, false);
  put(o, kiln_add(kiln_gather(k, 0, indices(2, S(2, C), R, 57)), kiln_full(3, KILN_I32, 0, NULL)));
}

/* scatter_add (a cross-entropy gradient's pick, two sources per row: one
   index repeated adds both in index order), a concat of a leaf, a zero
   fill and a computed part, argmax with NaN among the values, argmin
   keeping its axis, each with elementwise work around it (fuse.h
   GPU_IN_SCATTER_INDEX, GPU_IN_PART, GPU_IN_SCAN) */
static void p_moves(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 60, false),
              *src = input(KILN_F32, 2, S(R, 2), 61, false);
  int64_t *iv = malloc((size_t)R * 2 * sizeof *iv);
  for (int64_t r = 0; r < R; r++) iv[2 * r] = r % C, iv[2 * r + 1] = r % 3 ? (r + 1) % C : r % C;
  kiln_tensor *idx = kiln_from_data(iv, KILN_I64, 2, S(R, 2));
  free(iv);
  kiln_tensor *base = kiln_mul_scalar(x, 0.5);
  put(o, kiln_add_scalar(kiln_scatter_add(base, 1, idx, src), 1.0));
  kiln_tensor *d = input(KILN_F64, 2, S(R, 3), 62, false),
              *e = input(KILN_F64, 2, S(R, 2), 63, false);
  kiln_tensor *parts[3] = {d, kiln_zeros(KILN_F64, 2, S(R, 1)), kiln_mul_scalar(e, 3.0)};
  put(o, kiln_mul_scalar(kiln_concat(3, parts, 1), 2.0));
  kiln_tensor *y = input(KILN_F32, 2, S(R, C), 64, true);
  put(o, kiln_add(kiln_argmax(kiln_sub(y, x), 1, false), kiln_full(1, KILN_I64, 0, NULL)));
  put(o, kiln_mul(kiln_argmin(y, 0, true), kiln_full(2, KILN_I64, 0, NULL)));
}

/* --- reductions: producers fused into the fold, epilogues after it -------------------- */

/* trailing reductions (the lane order): everything, rows with an epilogue */
static void p_sum_squares(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 20, false),
              *w = input(KILN_F32, 2, S(1, C), 21, false);
  kiln_tensor *b = input(KILN_F32, 2, S(R, 1), 22, false);
  put(o, kiln_sum(kiln_mul(x, x), 0, NULL, false));
  kiln_tensor *rows = kiln_sum(kiln_add(kiln_mul(x, w), b), 1, AX(1), true);
  put(o, kiln_add_scalar(kiln_mul_scalar(rows, 1.0 / (double)C), 1e-5));
}

/* other patterns (the column order): over the rows, the middle of three dims */
static void p_columns(outs *o, int64_t A, int64_t B, int64_t C) {
  kiln_tensor *x = input(KILN_F64, 2, S(A, B), 23, false),
              *m = input(KILN_F64, 2, S(1, B), 24, false);
  kiln_tensor *d = kiln_sub(x, m);
  put(o, kiln_sum(kiln_mul(d, d), 1, AX(0), false));
  kiln_tensor *y = input(KILN_F32, 3, S(A, B, C), 25, false);
  put(o, kiln_sub_scalar(kiln_sum(kiln_mul_scalar(y, 0.5), 1, AX(1), true), 2.0));
}

/* long reductions: chunk partials (lane) and block partials (columns), joined */
static void p_long(outs *o, int64_t n, int64_t cols) {
  kiln_tensor *x = input(KILN_F32, 1, S(n), 26, false);
  put(o, kiln_sum(kiln_mul(x, x), 0, NULL, false));
  kiln_tensor *y = input(KILN_F32, 2, S(5000, cols), 27, false);
  put(o, kiln_sum(kiln_abs(y), 1, AX(0), false));
}

/* max/min with NaN, inf and -0 among the values; prod; integer folds */
static void p_extrema(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 28, true),
              *y = input(KILN_F32, 2, S(R, C), 29, true);
  put(o, kiln_max(kiln_sub(x, y), 1, AX(1), true));
  put(o, kiln_min(kiln_maximum(x, y), 1, AX(0), false));
  kiln_tensor *z = input(KILN_F64, 2, S(R, C), 30, false);
  put(o, kiln_prod(kiln_add_scalar(kiln_mul_scalar(z, 0.05), 1.0), 1, AX(1), false));
  kiln_tensor *i = input(KILN_I64, 2, S(R, C), 31, false),
              *j = input(KILN_I64, 2, S(1, C), 32, false);
  put(o, kiln_sum(kiln_mul(i, j), 1, AX(1), false));
  kiln_tensor *k = input(KILN_I32, 2, S(R, C), 33, false);
  put(o, kiln_max(kiln_neg(k), 1, AX(0), false));
}

/* a value of the fold read after it (the producers' output) and a
   reduction of a transposed leaf */
static void p_escape(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 34, false);
  kiln_tensor *m = kiln_max(x, 1, AX(1), true);
  kiln_tensor *d = kiln_sub(x, m), *e = kiln_mul(d, d);
  kiln_tensor *s = kiln_sum(e, 1, AX(1), true);
  put(o, kiln_div(e, kiln_add_scalar(s, 1.0)));
  kiln_tensor *xt =
      kiln_transpose(input(KILN_F32, 2, S(C, R), 35, false), 0, 1); /* [R, C], strided */
  put(o, kiln_sum(kiln_mul_scalar(xt, 2.0), 1, AX(1), false));
  put(o, kiln_sum(kiln_add(xt, x), 1, AX(0), true));
}

/* epilogues fused into their reduction's kernel that read leaves at the
   output's position: SGD on a bias (the column sum of a gradient, over
   axis 0, and the row sums, over axis 1), a broadcast [1, C] operand with
   keepdim, a fill, a value of the fold kept for later, and a reduction of
   the middle dim */
static void p_epilogue_inputs(outs *o, int64_t R, int64_t C) {
  kiln_tensor *g = input(KILN_F32, 2, S(R, C), 36, false), *b = input(KILN_F32, 1, S(C), 37, false);
  kiln_tensor *c = input(KILN_F32, 1, S(R), 38, false), *w = input(KILN_F32, 2, S(1, C), 39, false);
  kiln_tensor *h = input(KILN_F64, 2, S(C, R), 40, false),
              *hb = input(KILN_F64, 2, S(C, 1), 41, false);
  put(o, kiln_sub(b, kiln_mul_scalar(kiln_sum(g, 1, AX(0), false), 0.05)));
  put(o, kiln_add(c, kiln_sum(kiln_mul(g, g), 1, AX(1), false)));
  kiln_tensor *m = kiln_max(g, 1, AX(0), true);
  put(o, kiln_mul(kiln_sub(m, w), w));
  put(o, m);
  put(o, kiln_div(kiln_sum(h, 1, AX(1), true), kiln_add_scalar(hb, 3.0)));
  /* the middle of three dims: the output's dims are R's first and last */
  kiln_tensor *y = input(KILN_F32, 3, S(3, 4, C), 42, false),
              *z = input(KILN_F32, 2, S(3, C), 43, false);
  put(o, kiln_sub(kiln_sum(y, 1, AX(1), false), z));
}

/* a random elementwise chain, then a random reduction of it */
static void p_random_reduce(outs *o, uint64_t seed) {
  p_random(o, seed % 2 ? KILN_F64 : KILN_F32, seed + 500);
  kiln_tensor *v = o->out[0];
  rs = seed * 104729 + 11;
  int pick = (int)(rnd() % 3);
  int axes = (int)(rnd() % 3); /* rows, columns, everything */
  const int *ax = axes == 0 ? AX(1) : axes == 1 ? AX(0) : NULL;
  int nax = axes == 2 ? 0 : 1;
  bool keep = rnd() % 2;
  kiln_tensor *r = pick == 0   ? kiln_sum(v, nax, ax, keep)
                   : pick == 1 ? kiln_max(v, nax, ax, keep)
                               : kiln_min(v, nax, ax, keep);
  put(o, kiln_mul_scalar(r, 0.5));
}

/* --- row kernels: runs of reductions over the same trailing axes ---------------------- */

/* layer_norm (exact ops only: bit for bit), by hand and through the API */
static void p_layer_norm(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 40, false), *w = input(KILN_F32, 1, S(C), 41, false);
  kiln_tensor *b = input(KILN_F32, 1, S(C), 42, false);
  kiln_tensor *mean = kiln_mean(x, 1, AX(1), true);
  kiln_tensor *d = kiln_sub(x, mean);
  kiln_tensor *var = kiln_mean(kiln_mul(d, d), 1, AX(1), true);
  put(o, kiln_add(kiln_mul(kiln_div(d, kiln_sqrt(kiln_add_scalar(var, 1e-5))), w), b));
  put(o, kiln_layer_norm(input(KILN_F32, 2, S(R, C), 43, false), w, b, 1e-5));
}

/* the max kept and read after; a transposed (strided) input, a per-row
   input read once per row, a broadcast row; three passes.  Short rows get
   NaN and infinities in some of them (long ones would all be NaN) */
static void p_rows_mixed(outs *o, int64_t R, int64_t C) {
  kiln_tensor *xt =
      kiln_transpose(input(KILN_F32, 2, S(C, R), 44, C < 50), 0, 1); /* [R, C], strided */
  kiln_eval(1, &xt); /* a strided leaf of the next trace (a view node would end the row kernel) */
  kiln_tensor *col = input(KILN_F32, 2, S(R, 1), 45, false),
              *row = input(KILN_F32, 2, S(1, C), 46, false);
  kiln_tensor *h = kiln_add(kiln_mul(xt, row), col);
  kiln_tensor *m = kiln_max(h, 1, AX(1), true);
  kiln_tensor *d = kiln_sub(h, m);
  kiln_tensor *s1 = kiln_sum(kiln_mul(d, d), 1, AX(1), true);
  kiln_tensor *s2 = kiln_min(kiln_div(d, kiln_add_scalar(s1, 1.0)), 1, AX(1), true);
  put(o, kiln_sub(kiln_mul(d, s2), col));
  put(o, m);
  put(o, kiln_add(s1, s2));
}

/* f64 and integer rows; a 3-d value folded over its last two dims */
static void p_rows_dtypes(outs *o, int64_t A, int64_t B, int64_t C) {
  kiln_tensor *x = input(KILN_F64, 3, S(A, B, C), 47, false);
  kiln_tensor *m = kiln_min(x, 2, AX(1, 2), true);
  put(o, kiln_div(kiln_sub(x, m), kiln_sum(kiln_sub(x, m), 2, AX(1, 2), true)));
  kiln_tensor *k = input(KILN_I32, 2, S(A * B, C), 48, false);
  kiln_tensor *km = kiln_max(k, 1, AX(1), true);
  put(o, kiln_add(kiln_sub(k, km), kiln_sum(kiln_sub(km, k), 1, AX(1), true)));
}

/* softmax and log_softmax (f64: CUDA's exp and log in place of Kiln's) */
static void p_softmax(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F64, 2, S(R, C), 49, false);
  o->transcendental = true;
  put(o, kiln_softmax(x, 1));
  put(o, kiln_log_softmax(kiln_mul_scalar(x, 3.0), 1));
}

typedef struct {
  const char *name;
  void (*run)(outs *o, int variant);
  bool reduces; /* must run a fused reduction (or a row kernel) */
  bool rows;    /* must run a row kernel */
} program;

static void r_bias(outs *o, int v) { p_bias_relu(o, v ? 33 : 8, v ? 70 : 16); }
static void r_f64(outs *o, int v) { p_f64_scalars(o, v ? 1000 : 37); }
static void r_i32(outs *o, int v) {
  p_ints(o, KILN_I32, KILN_F32, KILN_F64, v ? 9 : 4, v ? 40 : 5);
}
static void r_i64(outs *o, int v) {
  p_ints(o, KILN_I64, KILN_F32, KILN_F64, v ? 9 : 4, v ? 40 : 5);
}
static void r_bool(outs *o, int v) { p_bools(o, v ? 600 : 9); }
static void r_views(outs *o, int v) { p_views(o, v ? 17 : 3, v ? 9 : 4); }
static void r_offset(outs *o, int v) { p_offset(o, v ? 1001 : 13); }
static void r_gathers(outs *o, int v) { p_gathers(o, v ? 70 : 6, v ? 33 : 5); }
static void r_moves(outs *o, int v) { p_moves(o, v ? 40 : 5, v ? 17 : 4); }
static void r_math32(outs *o, int v) { p_math(o, KILN_F32, v ? 700 : 9); }
static void r_math64(outs *o, int v) { p_math(o, KILN_F64, v ? 700 : 9); }
static void r_small(outs *o, int v) {
  (void)v;
  p_small(o);
}
static void r_rand32(outs *o, int v) { p_random(o, KILN_F32, (uint64_t)v); }
static void r_rand64(outs *o, int v) { p_random(o, KILN_F64, (uint64_t)v + 1000); }
static void r_squares(outs *o, int v) { p_sum_squares(o, v ? 37 : 8, v ? 300 : 16); }
static void r_columns(outs *o, int v) { p_columns(o, v ? 40 : 6, v ? 9 : 5, v ? 7 : 3); }
static void r_long(outs *o, int v) { p_long(o, v ? 150001 : 70000, v ? 3 : 2); }
static void r_extrema(outs *o, int v) { p_extrema(o, v ? 17 : 5, v ? 90 : 12); }
static void r_escape(outs *o, int v) { p_escape(o, v ? 19 : 4, v ? 70 : 9); }
static void r_rand_reduce(outs *o, int v) { p_random_reduce(o, (uint64_t)v); }
/* rows of 9000 positions fold with several warps per row */
static void r_epilogue_inputs(outs *o, int v) { p_epilogue_inputs(o, v ? 300 : 9, v ? 70 : 5); }
static void r_layer_norm(outs *o, int v) { p_layer_norm(o, v ? 5 : 33, v ? 9000 : 40); }
static void r_rows_mixed(outs *o, int v) { p_rows_mixed(o, v ? 13 : 6, v ? 300 : 7); }
static void r_rows_dtypes(outs *o, int v) { p_rows_dtypes(o, v ? 3 : 2, v ? 5 : 3, v ? 70 : 4); }
static void r_softmax(outs *o, int v) { p_softmax(o, v ? 21 : 4, v ? 5000 : 10); }
static void r_bf16(outs *o, int v) { p_halves(o, KILN_BF16, v ? 21 : 4, v ? 300 : 9); }
static void r_f16(outs *o, int v) { p_halves(o, KILN_F16, v ? 21 : 4, v ? 300 : 9); }
static void r_u8(outs *o, int v) { p_narrow(o, KILN_U8, v ? 9 : 4, v ? 40 : 5); }
static void r_i8(outs *o, int v) { p_narrow(o, KILN_I8, v ? 9 : 4, v ? 40 : 5); }
static void r_i16(outs *o, int v) { p_narrow(o, KILN_I16, v ? 9 : 4, v ? 40 : 5); }

static const program programs[] = {
    {"bias_relu", r_bias, false, false},
    {"f64_scalars", r_f64, false, false},
    {"int32", r_i32, false, false},
    {"int64", r_i64, false, false},
    {"bools", r_bool, false, false},
    {"views", r_views, false, false},
    {"math_f32", r_math32, false, false},
    {"math_f64", r_math64, false, false},
    {"small", r_small, false, false},
    {"sum_squares", r_squares, true, true},
    {"columns", r_columns, true, false},
    {"long", r_long, true, false},
    {"extrema", r_extrema, true, false},
    {"escape", r_escape, true, true},
    {"layer_norm", r_layer_norm, true, true},
    {"rows_mixed", r_rows_mixed, true, true},
    {"rows_dtypes", r_rows_dtypes, true, true},
    {"softmax", r_softmax, true, true},
    {"offset", r_offset, false, false},
    {"epilogue_inputs", r_epilogue_inputs, true, false},
    {"gathers", r_gathers, true, false},
    {"moves", r_moves, false, false},
    {"bf16", r_bf16, true, false},
    {"f16", r_f16, true, false},
    {"uint8", r_u8, true, false},
    {"int8", r_i8, true, false},
    {"int16", r_i16, true, false},
};
#define NPROG (int)(sizeof programs / sizeof programs[0])
#define NRANDOM 24 /* elementwise chains, and as many with a reduction after them */

/* --- the backend: the CPU's, with fused GPU kernels as its compiled path ------------- */

static vm_backend emu_backend;
static bool fusing;
#ifndef FUSED_GEN
static long fused_launches, kind_launches[4]; /* by gpu_fkind */
/* elementwise kernels with a vector path (fuse.c): launches that took it,
   and launches that could not (an operand off its vector boundary) */
static long vector_launches, unaligned_launches;
static long epilogue_launches; /* reduce kernels that computed their epilogue too */
static long gather_launches;   /* kernels that gathered in place */
static long move_launches;     /* kernels that scattered, concatenated or scanned in place */
static bool verbose;
#endif
/* the kernel names the current run planned (shape-generic kernels: a
   program's second variant, other extents, must need no new one) */
static char run_names[256][40];
static int nrun_names;

typedef struct {
  int n;
  gpu_fused_group *k;
} fused_plan;

#ifdef FUSED_GEN
typedef struct {
  char name[40];
} seen_name;
static seen_name seen[4096];
static int nseen;
static FILE *kernels_out, *registry_out;

static void collect(const gpu_fused *k) {
  for (int i = 0; i < nseen; i++)
    if (!strcmp(seen[i].name, k->name)) return;
  if (nseen == 4096) return;
  snprintf(seen[nseen++].name, sizeof seen[0].name, "%s", k->name);
  /* the layout static_asserts use EDG's __INTADDR__, which g++ lacks */
  for (const char *line = k->src; *line;) {
    const char *e = strchr(line, '\n');
    size_t len = e ? (size_t)(e - line + 1) : strlen(line);
    if (strncmp(line, "static_assert(", 14)) fwrite(line, 1, len, kernels_out);
    line += len;
  }
  fprintf(registry_out, "{\"%s\", %s},\n", k->name, k->name);
}
#else
int emu_launch(const char *name, const void *args, unsigned grid, unsigned block);
/* every distinct kernel's whole source (its layout asserts included), for
   NVRTC */
static char *all_src;
static size_t all_len;
static char all_names[1024][40];
static int nall;

static void keep_source(const gpu_fused *k) {
  for (int i = 0; i < nall; i++)
    if (!strcmp(all_names[i], k->name)) return;
  if (nall == 1024) return;
  snprintf(all_names[nall++], sizeof all_names[0], "%s", k->name);
  size_t n = strlen(k->src);
  char *g = realloc(all_src, all_len + n + 1);
  if (!g) return;
  all_src = g;
  memcpy(all_src + all_len, k->src, n + 1);
  all_len += n;
}
#endif

static bool emu_jit_enabled(void) { return fusing; }
static double emu_cost_ms(int nodes) {
  (void)nodes;
  return 0;
}

static void emu_plan_free(void *p) {
  fused_plan *f = p;
  if (!f) return;
  for (int g = 0; g < f->n; g++) gpu_fused_group_free_src(&f->k[g]);
  free(f->k);
  free(f);
}

static void emu_compile(tr_plan *plan, const tr_trace *t) {
  fused_plan *f = calloc(1, sizeof *f);
  f->n = plan->ngroups;
  f->k = calloc((size_t)(f->n ? f->n : 1), sizeof *f->k);
  for (int g = 0; g < f->n; g++) {
    if (!gpu_fuse_group(plan, g, t, &f->k[g])) continue;
    for (int i = 0; i < f->k[g].nk; i++) {
      gpu_fused *k = &f->k[g].k[i];
      if (nrun_names < 256) snprintf(run_names[nrun_names++], sizeof run_names[0], "%s", k->name);
#ifdef FUSED_GEN
      collect(k);
#else
      keep_source(k);
      if (verbose) printf("%s\n", k->src);
      k->fn = (void *)1; /* launched by name */
#endif
    }
    gpu_fused_group_free_src(&f->k[g]);
    if (f->k[g].k[0].kind == GPU_FK_ROWS) g = f->k[g].k[0].through; /* a row kernel covers them */
  }
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&plan->jit, &none, f)) emu_plan_free(f);
}

static void emu_wait(void) {}

static bool emu_has_kernel(const void *compiled, int g) {
  const fused_plan *f = compiled;
  return g < f->n && gpu_fused_ready(&f->k[g]);
}

#ifndef FUSED_GEN
static vm_tensor *host_alloc(kiln_dtype dt, int ndim, const int64_t *shape) {
  return vm_tensor_new(dt, ndim, shape);
}

static bool emu_launch_fused(const gpu_fused *k, const gpu_fargs *args, unsigned grid,
                             unsigned block) {
  /* the emulation runs every block in turn: a smaller grid (the kernel
     loops over the rest) keeps it quick */
  if (grid > 4) grid = 4;
  if (!emu_launch(k->name, args, grid, block)) {
    vm_error(KILN_ERR_INTERNAL, "no emulated kernel %s (not generated at build time)", k->name);
    return false;
  }
  fused_launches++;
  kind_launches[k->kind]++;
  if (k->kind == GPU_FK_REDUCE && k->epi_last) epilogue_launches++;
  for (int q = 0; q < k->nin; q++)
    if (k->role[q] == GPU_IN_SOURCE) {
      gather_launches++;
      break;
    }
  for (int q = 0; q < k->nin; q++)
    if (k->role[q] == GPU_IN_SCATTER_INDEX || k->role[q] == GPU_IN_PART ||
        k->role[q] == GPU_IN_SCAN) {
      move_launches++;
      break;
    }
  if (k->kind == GPU_FK_ELEMENTWISE && k->vec) {
    if (args->extent[0])
      vector_launches++;
    else
      unaligned_launches++;
  }
  if (verbose) printf("launch %s (kind %d) over %lld\n", k->name, (int)k->kind, (long long)args->n);
  return true;
}

/* the device's index check, on the host: the interpreter's message, at once */
static long index_checks;
static bool host_check_indices(vm_tensor *idx, int64_t size, int axis, const char *api) {
  index_checks++;
  for (int64_t i = 0; i < idx->numel; i++) {
    int64_t off = idx->offset, rest = i;
    for (int d = idx->ndim - 1; d >= 0; d--) {
      off += rest % idx->shape[d] * idx->strides[d];
      rest /= idx->shape[d];
    }
    int64_t v = ((const int64_t *)idx->storage->data)[off];
    if (v < 0 || v >= size) {
      const char *was = vm_thread()->api;
      vm_set_api(api);
      vm_error(KILN_ERR_ARG, "index %lld is out of range for axis %d of size %lld", (long long)v,
               axis, (long long)size);
      vm_set_api(was);
      return false;
    }
  }
  return true;
}

static const gpu_fuse_target host_target = {KILN_CPU, host_alloc, emu_launch_fused,
                                            host_check_indices};
#endif

static bool emu_group(const void *compiled, const tr_plan *plan, const tr_trace *t, int g,
                      vm_tensor **vals, int *rc, int *resume, int *last_group) {
#ifdef FUSED_GEN
  (void)compiled, (void)plan, (void)t, (void)g, (void)vals, (void)rc, (void)resume,
      (void)last_group;
  return false;
#else
  const fused_plan *f = compiled;
  return emu_has_kernel(f, g) &&
         gpu_fused_run(&f->k[g], &host_target, plan, t, vals, rc, resume, last_group);
#endif
}

static void install_backend(void) {
  emu_backend = *vm_backend_of(KILN_CPU);
  emu_backend.jit_enabled = emu_jit_enabled;
  emu_backend.compile_cost_ms = emu_cost_ms;
  emu_backend.plan_cost_ms = NULL; /* the CPU's would put CPU kernels in its plans */
  emu_backend.kernel_generation = NULL;
  emu_backend.compile = emu_compile;
  emu_backend.compile_wait = emu_wait;
  emu_backend.plan_free = emu_plan_free;
  emu_backend.has_kernel = emu_has_kernel;
  emu_backend.run_group = emu_group;
  vm_backend_register(&emu_backend);
}

/* --- running and comparing ------------------------------------------------------------ */

typedef struct {
  kiln_dtype dt[MAX_OUT];
  int64_t n[MAX_OUT];
  void *data[MAX_OUT];
  int count;
} results;

/* the program three times (the third runs its plan), the last results kept */
static void run_program(void (*run)(outs *, int), int variant, results *res) {
  for (int rep = 0; rep < 3; rep++) {
    outs o = {.n = 0};
    run(&o, variant);
    kiln_eval(o.n, o.out);
    for (int i = 0; i < o.n; i++) {
      if (rep == 2) {
        res->dt[i] = kiln_dtype_of(o.out[i]);
        res->n[i] = kiln_numel(o.out[i]);
        size_t bytes = (size_t)res->n[i] * vm_dtype_size(res->dt[i]);
        res->data[i] = malloc(bytes ? bytes : 1);
        if (kiln_to_buffer(o.out[i], res->data[i], bytes) != KILN_OK)
          fprintf(stderr, "read failed: %s\n", kiln_last_error());
      }
      kiln_release(o.out[i]);
    }
    if (rep == 2) res->count = o.n;
  }
}

#ifdef FUSED_GEN
int main(void) {
  install_backend();
  fusing = true;
  kernels_out = fopen("fused_kernels.inc", "w");
  registry_out = fopen("fused_registry.inc", "w");
  if (!kernels_out || !registry_out) return 1;
  for (int p = 0; p < NPROG; p++)
    for (int v = 0; v < 2; v++) {
      results r = {.count = 0};
      run_program(programs[p].run, v, &r);
      for (int i = 0; i < r.count; i++) free(r.data[i]);
    }
  for (int s = 0; s < NRANDOM; s++) {
    results r = {.count = 0};
    run_program(s % 2 ? r_rand64 : r_rand32, s, &r);
    for (int i = 0; i < r.count; i++) free(r.data[i]);
    results q = {.count = 0};
    run_program(r_rand_reduce, s, &q);
    for (int i = 0; i < q.count; i++) free(q.data[i]);
  }
  fclose(kernels_out);
  fclose(registry_out);
  printf("%d fused kernels\n", nseen);
  return 0;
}
#else
static int fails, checks;

static double ulps_f32(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return fabs((double)ia - (double)ib);
}

static bool same(kiln_dtype dt, const void *a, const void *b, int64_t i, bool approx) {
  switch (dt) {
    case KILN_F32: {
      float x = ((const float *)a)[i], y = ((const float *)b)[i];
      if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
      if (!approx) return !memcmp(&x, &y, 4);
      return x == y || ulps_f32(x, y) <= 4;
    }
    case KILN_F64: {
      double x = ((const double *)a)[i], y = ((const double *)b)[i];
      if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
      if (!approx) return !memcmp(&x, &y, 8);
      return x == y || fabs(x - y) <= 1e-12 * fabs(y);
    }
    case KILN_I32:
      return ((const int32_t *)a)[i] == ((const int32_t *)b)[i];
    case KILN_I64:
      return ((const int64_t *)a)[i] == ((const int64_t *)b)[i];
    case KILN_BF16:
    case KILN_F16: { /* approx: CUDA's f32 math, rounded: one half ulp */
      uint16_t x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
      float fx = vm_load_f64(a, dt, i), fy = vm_load_f64(b, dt, i);
      if (isnan(fx) || isnan(fy)) return isnan(fx) && isnan(fy);
      int sx = x & 0x8000 ? -(x & 0x7fff) : x, sy = y & 0x8000 ? -(y & 0x7fff) : y;
      return x == y || (approx && abs(sx - sy) <= 1);
    }
    case KILN_I16:
      return ((const int16_t *)a)[i] == ((const int16_t *)b)[i];
    default:
      return ((const uint8_t *)a)[i] == ((const uint8_t *)b)[i];
  }
}

static char first_names[256][40];
static int nfirst_names;

static void check_program(const char *name, void (*run)(outs *, int), int variant,
                          bool same_kernels, bool reduces, bool rows) {
  results ref = {.count = 0}, got = {.count = 0};
  fusing = false;
  tr_cache_reset();
  run_program(run, variant, &ref);
  fusing = true;
  tr_cache_reset();
  long before = fused_launches,
       reduce_before = kind_launches[GPU_FK_REDUCE] + kind_launches[GPU_FK_ROWS],
       rows_before = kind_launches[GPU_FK_ROWS];
  nrun_names = 0;
  run_program(run, variant, &got);
  if (!same_kernels) { /* the first variant: remember its kernels */
    memcpy(first_names, run_names, sizeof run_names);
    nfirst_names = nrun_names;
  } else { /* other extents, the same kernels */
    for (int i = 0; i < nrun_names; i++) {
      bool known = false;
      for (int j = 0; j < nfirst_names && !known; j++)
        known = !strcmp(run_names[i], first_names[j]);
      if (!known) {
        printf("%s/%d: kernel %s is new: other extents must reuse the first variant's kernels\n",
               name, variant, run_names[i]);
        fails++;
        break;
      }
    }
  }
  outs probe = {.n = 0};
  run(&probe, variant); /* only to learn whether it is transcendental */
  for (int i = 0; i < probe.n; i++) kiln_release(probe.out[i]);
  checks++;
  bool ok = ref.count == got.count && ref.count > 0;
  if (fused_launches == before) {
    printf("%s/%d: no fused kernel ran\n", name, variant);
    ok = false;
  }
  if (reduces && kind_launches[GPU_FK_REDUCE] + kind_launches[GPU_FK_ROWS] == reduce_before) {
    printf("%s/%d: no fused reduction ran\n", name, variant);
    ok = false;
  }
  if (rows && kind_launches[GPU_FK_ROWS] == rows_before) {
    printf("%s/%d: no row kernel ran\n", name, variant);
    ok = false;
  }
  for (int o = 0; ok && o < ref.count; o++) {
    if (ref.dt[o] != got.dt[o] || ref.n[o] != got.n[o]) {
      ok = false;
      break;
    }
    for (int64_t i = 0; i < ref.n[o]; i++)
      if (!same(ref.dt[o], got.data[o], ref.data[o], i, probe.transcendental)) {
        printf("%s/%d: output %d differs at %lld\n", name, variant, o, (long long)i);
        ok = false;
        break;
      }
  }
  if (!ok) fails++;
  for (int i = 0; i < ref.count; i++) free(ref.data[i]);
  for (int i = 0; i < got.count; i++) free(got.data[i]);
}

int main(void) {
  install_backend();
  /* to debug: KILN_EMU_ONLY=<program> checks that one (and the random
     ones), KILN_EMU_VERBOSE=1 prints each kernel's source and launches */
  const char *only = getenv("KILN_EMU_ONLY");
  verbose = getenv("KILN_EMU_VERBOSE") != NULL;
  for (int p = 0; p < NPROG; p++)
    for (int v = 0; v < 2 && (!only || !strcmp(only, programs[p].name)); v++)
      check_program(programs[p].name, programs[p].run, v, v == 1, programs[p].reduces,
                    programs[p].rows);
  for (int s = 0; s < NRANDOM; s++) {
    check_program(s % 2 ? "random_f64" : "random_f32", s % 2 ? r_rand64 : r_rand32, s, false, false,
                  false);
    check_program("random_reduce", r_rand_reduce, s, false, true, false);
  }
  printf(
      "%ld fused launches (%ld elementwise, %ld reductions, %ld joins, %ld row kernels), %d "
      "distinct kernels\n",
      fused_launches, kind_launches[GPU_FK_ELEMENTWISE], kind_launches[GPU_FK_REDUCE],
      kind_launches[GPU_FK_JOIN], kind_launches[GPU_FK_ROWS], nall);
  printf(
      "%ld vector launches, %ld with an operand off its vector boundary; %ld reductions with their "
      "epilogue\n",
      vector_launches, unaligned_launches, epilogue_launches);
  printf("%ld kernels gathered in place, %ld moved data in place, after %ld index checks\n",
         gather_launches, move_launches, index_checks);
  checks++;
  if (!only && (gather_launches == 0 || move_launches == 0 || index_checks == 0)) {
    printf("no kernel gathered or moved data in place, or its indices were not checked first\n");
    fails++;
  }
  checks++;
  if (epilogue_launches == 0) {
    printf("no reduction computed its epilogue in its own kernel\n");
    fails++;
  }
  checks++;
  if (!only &&
      (vector_launches == 0 || unaligned_launches == 0)) { /* the aligned programs; p_offset */
    printf("the vector path and the scalar path of vector kernels must both have run\n");
    fails++;
  }
  checks++;
  if (kind_launches[GPU_FK_JOIN] == 0) { /* p_long's two kinds of long reduction */
    printf("no long reduction ran its join\n");
    fails++;
  }
  /* the same sources through NVRTC, as one program (each holds the
     guarded prelude; entry names are unique): sm_90 cubins */
  char why[256];
  checks++;
  if (!gpu_nvrtc_available(why, sizeof why)) {
    printf("NVRTC compile of the fused kernels skipped: %s\n", why);
  } else if (!nall) {
    printf("no fused kernel source was kept\n");
    fails++;
  } else {
    gpu_image img = {0};
    char *log = NULL;
    if (!gpu_nvrtc_compile(all_src, "fused_ops", 90, &img, &log)) {
      printf("NVRTC rejected the fused kernels:\n%s\n", log ? log : "(no log)");
      fails++;
    } else {
      printf("NVRTC compiled %d fused kernels for sm_90 (%zu bytes of cubin)\n", nall, img.size);
    }
    free(log);
    gpu_image_free(&img);
  }
  free(all_src);
  printf("%d passed, %d failed\n", checks - fails, fails);
  return fails ? 1 : 0;
}
#endif
