/* kern_conv.c — 2-d convolution for the interpreter (and so for compiled
 * plans, which hand these ops to it): conv2d, and its two adjoints
 * conv2d_input (the gradient of the input) and conv2d_weight (of the
 * weight), NCHW, float32 / float64, through OpenBLAS.
 *
 * Why a primitive and not im2col as one index_select + matmul (what
 * front/layers.c composes on other devices): the batch's column matrix of a
 * ResNet layer ([32, 64*9, 56*56] f32 = 231 MB) went to memory and back
 * six times a step (written by the gather, read by the forward gemm and by
 * the weight gradient; its gradient zeroed by BLAS, written, read by the
 * scatter), which held conv2d fwd+bwd at 0.83x PyTorch's direct kernels.
 * Here each task unfolds one image's tile of CONV_TILE output positions into
 * a buffer that stays in cache and multiplies it at once.
 *
 * Determinism: tiles are fixed (CONV_TILE positions, never a function of the
 * thread count), a gemm's K is never split, and conv2d_weight sums each
 * image's tiles in order into its own partial, then the partials in image
 * order, so results are the same for any KILN_THREADS (test_threads). */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "kernels.h"
#include "pool.h"
#include "state.h"

enum { CONV_TILE = 256 }; /* output positions per task (a multiple of 64) */

typedef struct {
  int64_t n, c, h, w;           /* input */
  int64_t cout, kh, kw, oh, ow; /* weight, output */
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t cg, og, k, l; /* channels in / out per group, K = cg*kh*kw, L = oh*ow */
  int64_t tiles;        /* per image */
  size_t es;
  kiln_dtype dt;
  const vm_blas *blas;
} conv_geom;

static void geom_of(conv_geom *g, const vm_tensor *x, const vm_tensor *w, const vm_tensor *y,
                    const vm_attr *attr) {
  g->n = x->shape[0], g->c = x->shape[1], g->h = x->shape[2], g->w = x->shape[3];
  g->cout = w->shape[0], g->kh = w->shape[2], g->kw = w->shape[3];
  g->oh = y->shape[2], g->ow = y->shape[3];
  g->sh = attr->perm[0], g->sw = attr->perm[1], g->ph = attr->perm[2], g->pw = attr->perm[3];
  g->dh = attr->perm[4], g->dw = attr->perm[5], g->groups = attr->axis;
  g->cg = g->c / g->groups, g->og = g->cout / g->groups;
  g->k = g->cg * g->kh * g->kw, g->l = g->oh * g->ow;
  g->tiles = (g->l + CONV_TILE - 1) / CONV_TILE;
  g->dt = y->dtype;
  g->es = vm_dtype_size(g->dt);
  g->blas = vm_blas_get();
}

/* C[m x n] (ldc) = op(A) @ op(B) + beta * C, row-major */
static void gemm(const conv_geom *g, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                 int64_t ldc) {
  int oa = ta ? VM_BLAS_TRANS : VM_BLAS_NO_TRANS, ob = tb ? VM_BLAS_TRANS : VM_BLAS_NO_TRANS;
  if (g->dt == KILN_F32)
    g->blas->sgemm(VM_BLAS_ROW_MAJOR, oa, ob, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b,
                   (int)ldb, (float)beta, c, (int)ldc);
  else
    g->blas->dgemm(VM_BLAS_ROW_MAJOR, oa, ob, (int)m, (int)n, (int)k, 1.0, a, (int)lda, b, (int)ldb,
                   beta, c, (int)ldc);
}

/* The tile's positions [p0, p0+len) go by runs along output rows; in a
   run, kernel tap (i, j) reads input row iy at ix = ox*sw + off, and the
   ox with ix inside the row are [lo, hi): zeros (padding) outside, a copy
   (a memcpy at stride 1) inside. */
static void tap_range(const conv_geom *g, int64_t j, int64_t ox, int64_t n, int64_t *lo,
                      int64_t *hi, int64_t *off) {
  *off = j * g->dw - g->pw;
  int64_t a = *off >= 0 ? 0 : (-*off + g->sw - 1) / g->sw;             /* first ox inside */
  int64_t b = g->w - 1 - *off < 0 ? 0 : (g->w - 1 - *off) / g->sw + 1; /* past the last */
  *lo = a < ox ? ox : a > ox + n ? ox + n : a;
  *hi = b > ox + n ? ox + n : b < *lo ? *lo : b;
}

/* cols[K, len] = the windows of group gi of image x (its [C,H,W] data) for
   output positions [p0, p0+len), zeros in the padding */
#define UNFOLD(T)                                                                             \
  static void unfold_##T(const conv_geom *g, const T *x, int64_t gi, int64_t p0, int64_t len, \
                         T *cols) {                                                           \
    for (int64_t c = 0; c < g->cg; c++) {                                                     \
      const T *plane = x + (gi * g->cg + c) * g->h * g->w;                                    \
      for (int64_t i = 0; i < g->kh; i++)                                                     \
        for (int64_t j = 0; j < g->kw; j++) {                                                 \
          T *row = cols + ((c * g->kh + i) * g->kw + j) * len;                                \
          for (int64_t q = 0; q < len;) {                                                     \
            int64_t p = p0 + q, oy = p / g->ow, ox = p % g->ow;                               \
            int64_t n = g->ow - ox < len - q ? g->ow - ox : len - q;                          \
            int64_t iy = oy * g->sh - g->ph + i * g->dh, lo, hi, off;                         \
            T *dst = row + q; /* dst[o - ox] */                                               \
            if (iy < 0 || iy >= g->h) {                                                       \
              for (int64_t o = 0; o < n; o++) dst[o] = 0;                                     \
            } else {                                                                          \
              tap_range(g, j, ox, n, &lo, &hi, &off);                                         \
              const T *in = plane + iy * g->w; /* in[o * sw + off] */                         \
              for (int64_t o = ox; o < lo; o++) dst[o - ox] = 0;                              \
              if (g->sw == 1 && hi > lo)                                                      \
                memcpy(dst + (lo - ox), in + (lo + off), (size_t)(hi - lo) * sizeof(T));      \
              else                                                                            \
                for (int64_t o = lo; o < hi; o++) dst[o - ox] = in[o * g->sw + off];          \
              for (int64_t o = hi; o < ox + n; o++) dst[o - ox] = 0;                          \
            }                                                                                 \
            q += n;                                                                           \
          }                                                                                   \
        }                                                                                     \
    }                                                                                         \
  }
UNFOLD(float)
UNFOLD(double)

/* dx (image's [C,H,W]) += the columns cols[K, len] folded back: col2im,
   taps and positions in order, so each element sums in a fixed order */
#define FOLD(T)                                                                        \
  static void fold_##T(const conv_geom *g, T *dx, int64_t gi, int64_t p0, int64_t len, \
                       const T *cols) {                                                \
    for (int64_t c = 0; c < g->cg; c++) {                                              \
      T *plane = dx + (gi * g->cg + c) * g->h * g->w;                                  \
      for (int64_t i = 0; i < g->kh; i++)                                              \
        for (int64_t j = 0; j < g->kw; j++) {                                          \
          const T *row = cols + ((c * g->kh + i) * g->kw + j) * len;                   \
          for (int64_t q = 0; q < len;) {                                              \
            int64_t p = p0 + q, oy = p / g->ow, ox = p % g->ow;                        \
            int64_t n = g->ow - ox < len - q ? g->ow - ox : len - q;                   \
            int64_t iy = oy * g->sh - g->ph + i * g->dh, lo, hi, off;                  \
            if (iy >= 0 && iy < g->h) {                                                \
              tap_range(g, j, ox, n, &lo, &hi, &off);                                  \
              const T *src = row + q + (lo - ox);                                      \
              T *out = plane + iy * g->w + (lo * g->sw + off);                         \
              if (g->sw == 1)                                                          \
                for (int64_t o = 0; o < hi - lo; o++) out[o] += src[o];                \
              else                                                                     \
                for (int64_t o = 0; o < hi - lo; o++) out[o * g->sw] += src[o];        \
            }                                                                          \
            q += n;                                                                    \
          }                                                                            \
        }                                                                              \
    }                                                                                  \
  }
FOLD(float)
FOLD(double)

typedef struct {
  const conv_geom *g;
  vm_opcode op;
  const char *x, *w, *dy; /* the operands each op reads */
  char *out;
  char *partials; /* conv2d_weight: one weight-sized sum per image */
  atomic_bool failed;
} conv_job;

static void unfold(const conv_geom *g, const char *x, int64_t gi, int64_t p0, int64_t len,
                   char *cols) {
  if (g->dt == KILN_F32)
    unfold_float(g, (const float *)x, gi, p0, len, (float *)cols);
  else
    unfold_double(g, (const double *)x, gi, p0, len, (double *)cols);
}

/* conv2d: y[n, group rows, tile] = w_group [og, K] @ cols [K, tile] */
static void forward_tile(const conv_job *j, int64_t img, int64_t t, char *cols) {
  const conv_geom *g = j->g;
  int64_t p0 = t * CONV_TILE, len = g->l - p0 < CONV_TILE ? g->l - p0 : CONV_TILE;
  const char *x = j->x + img * g->c * g->h * g->w * (int64_t)g->es;
  for (int64_t gi = 0; gi < g->groups; gi++) {
    unfold(g, x, gi, p0, len, cols);
    const char *w = j->w + gi * g->og * g->k * (int64_t)g->es;
    char *y = j->out + ((img * g->cout + gi * g->og) * g->l + p0) * (int64_t)g->es;
    gemm(g, false, false, g->og, len, g->k, w, g->k, cols, len, 0.0, y, g->l);
  }
}

/* conv2d_input: cols [K, tile] = w_group^T [K, og] @ dy [og, tile], folded
   into dx; the tiles of an image run in order (their windows overlap) */
static void input_image(const conv_job *j, int64_t img, char *cols) {
  const conv_geom *g = j->g;
  char *dx = j->out + img * g->c * g->h * g->w * (int64_t)g->es;
  memset(dx, 0, (size_t)(g->c * g->h * g->w) * g->es);
  for (int64_t t = 0; t < g->tiles; t++) {
    int64_t p0 = t * CONV_TILE, len = g->l - p0 < CONV_TILE ? g->l - p0 : CONV_TILE;
    for (int64_t gi = 0; gi < g->groups; gi++) {
      const char *w = j->w + gi * g->og * g->k * (int64_t)g->es;
      const char *dy = j->dy + ((img * g->cout + gi * g->og) * g->l + p0) * (int64_t)g->es;
      gemm(g, true, false, g->k, len, g->og, w, g->k, dy, g->l, 0.0, cols, len);
      if (g->dt == KILN_F32)
        fold_float(g, (float *)dx, gi, p0, len, (const float *)cols);
      else
        fold_double(g, (double *)dx, gi, p0, len, (const double *)cols);
    }
  }
}

/* conv2d_weight: this image's dw_group [og, K] = sum over tiles of
   dy [og, tile] @ cols^T [tile, K], into its partial */
static void weight_image(const conv_job *j, int64_t img, char *cols) {
  const conv_geom *g = j->g;
  const char *x = j->x + img * g->c * g->h * g->w * (int64_t)g->es;
  char *part = j->partials + img * g->cout * g->k * (int64_t)g->es;
  for (int64_t t = 0; t < g->tiles; t++) {
    int64_t p0 = t * CONV_TILE, len = g->l - p0 < CONV_TILE ? g->l - p0 : CONV_TILE;
    for (int64_t gi = 0; gi < g->groups; gi++) {
      unfold(g, x, gi, p0, len, cols);
      const char *dy = j->dy + ((img * g->cout + gi * g->og) * g->l + p0) * (int64_t)g->es;
      char *dw = part + gi * g->og * g->k * (int64_t)g->es;
      gemm(g, false, true, g->og, g->k, len, dy, g->l, cols, len, t == 0 ? 0.0 : 1.0, dw, g->k);
    }
  }
}

static void conv_range(void *p, int64_t begin, int64_t end) {
  conv_job *j = p;
  const conv_geom *g = j->g;
  char *cols = malloc((size_t)(g->k * CONV_TILE) * g->es);
  if (!cols) {
    atomic_store(&j->failed, true); /* read after the parallel call */
    return;
  }
  for (int64_t task = begin; task < end; task++) {
    if (j->op == VM_OP_conv2d)
      forward_tile(j, task / g->tiles, task % g->tiles, cols);
    else if (j->op == VM_OP_conv2d_input)
      input_image(j, task, cols);
    else
      weight_image(j, task, cols);
  }
  free(cols);
}

/* the partials summed in image order: dw = p_0 + p_1 + ... */
static void sum_partials(const conv_geom *g, const char *partials, char *out) {
  int64_t m = g->cout * g->k;
  if (g->dt == KILN_F32) {
    float *o = (float *)out;
    const float *p = (const float *)partials;
    memcpy(o, p, (size_t)m * sizeof *o);
    for (int64_t i = 1; i < g->n; i++)
      for (int64_t e = 0; e < m; e++) o[e] += p[i * m + e];
  } else {
    double *o = (double *)out;
    const double *p = (const double *)partials;
    memcpy(o, p, (size_t)m * sizeof *o);
    for (int64_t i = 1; i < g->n; i++)
      for (int64_t e = 0; e < m; e++) o[e] += p[i * m + e];
  }
}

/* args: conv2d (x, w), conv2d_input (dy, w), conv2d_weight (x, dy), contiguous */
static bool conv_run(vm_opcode op, vm_tensor *out, vm_tensor *const *args, const vm_attr *attr) {
  const vm_tensor *x = op == VM_OP_conv2d_input ? out : args[0];
  const vm_tensor *w = op == VM_OP_conv2d_weight ? out : args[1];
  const vm_tensor *y = op == VM_OP_conv2d ? out : op == VM_OP_conv2d_input ? args[0] : args[1];
  conv_geom g;
  geom_of(&g, x, w, y, attr);
  if (!g.blas->loaded) {
    vm_error(KILN_ERR_INTERNAL, "%s", g.blas->error);
    return false;
  }
  if (g.og > INT_MAX || g.k > INT_MAX || g.l > INT_MAX) {
    vm_error(KILN_ERR_SHAPE, "convolution dimensions %lld x %lld x %lld exceed BLAS's int range",
             (long long)g.og, (long long)g.k, (long long)g.l);
    return false;
  }
  if (g.n == 0) { /* conv2d_weight of an empty batch (the others have no elements) */
    memset(vm_data(out), 0, (size_t)out->numel * g.es);
    return true;
  }
  /* the two operands the op reads (the third of x, w, dy is out) */
  conv_job j = {
      .g = &g, .op = op, .x = vm_data(x), .w = vm_data(w), .dy = vm_data(y), .out = vm_data(out)};
  atomic_init(&j.failed, false);
  int64_t tasks = op == VM_OP_conv2d ? g.n * g.tiles : g.n;
  if (op == VM_OP_conv2d_weight && !(j.partials = malloc((size_t)(g.n * g.cout * g.k) * g.es))) {
    vm_error(KILN_ERR_OOM, "out of memory for the weight gradient's %lld partial sums",
             (long long)g.n);
    return false;
  }
  atomic_fetch_add_explicit(&vm_process()->stats.blas_calls, (uint64_t)(tasks * g.groups),
                            memory_order_relaxed);
  /* a task is a tile (conv2d) or an image: about og*K*tile multiply-adds */
  double work = (double)g.og * (double)g.k * (double)(op == VM_OP_conv2d ? CONV_TILE : g.l);
  vm_parallel_for(tasks, work >= (1 << 18) ? 1 : (int64_t)((1 << 18) / (work + 1)) + 1, conv_range,
                  &j);
  bool failed = atomic_load(&j.failed);
  if (!failed && op == VM_OP_conv2d_weight) sum_partials(&g, j.partials, j.out);
  free(j.partials);
  if (failed) vm_error(KILN_ERR_OOM, "out of memory for a convolution tile");
  return !failed;
}

/* the interpreter's entry (ops.c: run_kernel); operands made contiguous */
bool vm_k_conv(vm_opcode op, vm_tensor *out, vm_tensor *const *args, const vm_attr *attr) {
  vm_tensor *in[2] = {vm_value_contiguous(args[0]), vm_value_contiguous(args[1])};
  bool ok = in[0] && in[1] && conv_run(op, out, in, attr);
  vm_release(in[0]);
  vm_release(in[1]);
  return ok;
}
