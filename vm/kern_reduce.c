/* kern_reduce.c — the interpreter's reductions (sum, prod, max, min) and
 * arg-reductions (argmax, argmin).  Float reductions fold in the order
 * vm/fold.h defines, the compiled kernels' order, whatever the layout and
 * the thread count; integer ones (exact) as suits the layout.  The input's
 * dims split into kept (K) and reduced (R) lists, each coalesced; then:
 *   - R's innermost dim is unit-stride (row reductions): each output reduces
 *     runs of R;
 *   - else K's innermost dim is unit-stride (column reductions): rows of R
 *     are accumulated into a block of outputs, vectorized across outputs;
 *   - a single output over many elements is split into fixed-size chunks
 *     whose partials are combined in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fold.h"
#include "kernels.h"
#include "pool.h"
#include "state.h"

/* element offset of the flat (row-major) index f */
static int64_t dims_offset(const vm_dims *d, int64_t f) {
  int64_t off = 0;
  for (int i = d->n - 1; i >= 0; i--) {
    off += (f % d->size[i]) * d->stride[i];
    f /= d->size[i];
  }
  return off;
}

/* --- per-op, per-dtype pieces -------------------------------------------
   INIT: identity; COMB(a, v): fold one value; RUN: reduce n values at stride s */

#define LOOP_RUN(fname, T, INIT, COMB)                           \
  static T fname(const T *x, int64_t n, int64_t s) {             \
    T acc = INIT;                                                \
    if (s == 1)                                                  \
      for (int64_t i = 0; i < n; i++) acc = COMB(acc, x[i]);     \
    else                                                         \
      for (int64_t i = 0; i < n; i++) acc = COMB(acc, x[i * s]); \
    return acc;                                                  \
  }

#define IADD(a, v) ((int64_t)((uint64_t)(a) + (uint64_t)(v)))
#define IMUL(a, v) ((int64_t)((uint64_t)(a) * (uint64_t)(v)))
#define IMAX(a, v) ((a) >= (v) ? (a) : (v))
#define IMIN(a, v) ((a) <= (v) ? (a) : (v))

/* integer and bool reducers (exact: any order): X(op, suffix, T, dtype, INIT, COMB, pairwise) */
#define REDUCERS(X)                                  \
  X(sum, i64, int64_t, KILN_I64, 0, IADD, 0)         \
  X(prod, i64, int64_t, KILN_I64, 1, IMUL, 0)        \
  X(max, i32, int32_t, KILN_I32, INT32_MIN, IMAX, 0) \
  X(max, i64, int64_t, KILN_I64, INT64_MIN, IMAX, 0) \
  X(max, b8, bool, KILN_BOOL, false, IMAX, 0)        \
  X(max, u8, uint8_t, KILN_U8, 0, IMAX, 0)           \
  X(max, i8, int8_t, KILN_I8, INT8_MIN, IMAX, 0)     \
  X(max, i16, int16_t, KILN_I16, INT16_MIN, IMAX, 0) \
  X(min, i32, int32_t, KILN_I32, INT32_MAX, IMIN, 0) \
  X(min, i64, int64_t, KILN_I64, INT64_MAX, IMIN, 0) \
  X(min, b8, bool, KILN_BOOL, true, IMIN, 0)         \
  X(min, u8, uint8_t, KILN_U8, UINT8_MAX, IMIN, 0)   \
  X(min, i8, int8_t, KILN_I8, INT8_MAX, IMIN, 0)     \
  X(min, i16, int16_t, KILN_I16, INT16_MAX, IMIN, 0)

typedef struct reduce_job reduce_job;
typedef struct {
  /* reduce flat R-range [b, e) starting at x into *acc (an element of T) */
  void (*range)(const reduce_job *j, const char *x, int64_t b, int64_t e, void *acc);
  /* acc[0..m) = comb(acc, x[0..m) at stride s) */
  void (*cols)(void *acc, const char *x, int64_t m, int64_t s);
  void (*init)(void *acc, int64_t m);
  void (*comb)(void *acc, const void *v); /* *acc = comb(*acc, *v) */
} reducer;

struct reduce_job {
  const reducer *r;
  vm_dims K, R;
  const char *x;
  char *out;
  size_t esize;
  char *partials; /* single-output chunked mode */
  int64_t chunk;
};

#define DEF_REDUCER(op, sfx, T, DT, INIT, COMB, PAIRWISE)                                        \
  LOOP_RUN(op##_loop_##sfx, T, INIT, COMB)                                                       \
  static T op##_run_##sfx(const T *x, int64_t n, int64_t s) { return op##_loop_##sfx(x, n, s); } \
  static void op##_range_##sfx(const reduce_job *j, const char *xc, int64_t b, int64_t e,        \
                               void *accp) {                                                     \
    const T *x = (const T *)xc;                                                                  \
    const vm_dims *R = &j->R;                                                                    \
    int64_t inner = R->n ? R->size[R->n - 1] : 1;                                                \
    int64_t s = R->n ? R->stride[R->n - 1] : 0;                                                  \
    vm_dims outer = *R;                                                                          \
    if (outer.n) outer.n--;                                                                      \
    T acc = *(T *)accp;                                                                          \
    for (int64_t f = b; f < e;) {                                                                \
      int64_t i = f % inner, len = inner - i;                                                    \
      if (len > e - f) len = e - f;                                                              \
      const T *run = x + dims_offset(&outer, f / inner) + i * s;                                 \
      T v = PAIRWISE ? op##_pairwise_##sfx(run, len, s) : op##_run_##sfx(run, len, s);           \
      acc = COMB(acc, v);                                                                        \
      f += len;                                                                                  \
    }                                                                                            \
    *(T *)accp = acc;                                                                            \
  }                                                                                              \
  static void op##_cols_##sfx(void *accp, const char *xc, int64_t m, int64_t s) {                \
    T *restrict acc = (T *)accp;                                                                 \
    const T *restrict x = (const T *)xc;                                                         \
    if (s == 1)                                                                                  \
      for (int64_t k = 0; k < m; k++) acc[k] = COMB(acc[k], x[k]);                               \
    else                                                                                         \
      for (int64_t k = 0; k < m; k++) acc[k] = COMB(acc[k], x[k * s]);                           \
  }                                                                                              \
  static void op##_init_##sfx(void *accp, int64_t m) {                                           \
    for (int64_t k = 0; k < m; k++) ((T *)accp)[k] = INIT;                                       \
  }                                                                                              \
  static void op##_comb_##sfx(void *accp, const void *v) {                                       \
    *(T *)accp = COMB(*(T *)accp, *(const T *)v);                                                \
  }                                                                                              \
  static const reducer op##_reducer_##sfx = {op##_range_##sfx, op##_cols_##sfx, op##_init_##sfx, \
                                             op##_comb_##sfx};

#define NO_PAIRWISE(op, sfx, T)                                           \
  static inline T op##_pairwise_##sfx(const T *x, int64_t n, int64_t s) { \
    (void)x;                                                              \
    (void)n;                                                              \
    (void)s;                                                              \
    return 0;                                                             \
  }
NO_PAIRWISE(sum, i64, int64_t)
NO_PAIRWISE(prod, i64, int64_t)
NO_PAIRWISE(max, i32, int32_t)
NO_PAIRWISE(max, i64, int64_t)
NO_PAIRWISE(max, b8, bool)
NO_PAIRWISE(min, i32, int32_t)
NO_PAIRWISE(min, i64, int64_t)
NO_PAIRWISE(min, b8, bool)
NO_PAIRWISE(max, u8, uint8_t)
NO_PAIRWISE(min, u8, uint8_t)
NO_PAIRWISE(max, i8, int8_t)
NO_PAIRWISE(min, i8, int8_t)
NO_PAIRWISE(max, i16, int16_t)
NO_PAIRWISE(min, i16, int16_t)

REDUCERS(DEF_REDUCER)

static const reducer *find_reducer(vm_opcode op, kiln_dtype dt) {
#define MATCH(o, sfx, T, DT, INIT, COMB, P) \
  if (op == VM_OP_##o && dt == DT) return &o##_reducer_##sfx;
  REDUCERS(MATCH)
#undef MATCH
  return NULL;
}

/* --- drivers --------------------------------------------------------------- */

#define ROWS_GRAIN (1 << 15)   /* elements of work before we go parallel */
#define SINGLE_CHUNK (1 << 16) /* chunk size of a single-output reduction */
#define COLS_BLOCK 256         /* rows folded into a partial before adding */

static void rows_range(void *p, int64_t begin, int64_t end) {
  const reduce_job *j = p;
  int64_t count = vm_dims_count(&j->R);
  for (int64_t o = begin; o < end; o++) {
    char *acc = j->out + o * (int64_t)j->esize;
    j->r->init(acc, 1);
    j->r->range(j, j->x + dims_offset(&j->K, o) * (int64_t)j->esize, 0, count, acc);
  }
}

static void single_chunk(void *p, int64_t chunk, int64_t b, int64_t e) {
  const reduce_job *j = p;
  char *acc = j->partials + chunk * (int64_t)j->esize;
  j->r->init(acc, 1);
  j->r->range(j, j->x, b, e, acc);
}

/* column mode: K = [outer..., inner(unit stride)], R anything.  A task is
   one outer index times one block of COLS_WIDTH inner columns. */
#define COLS_WIDTH 2048

static void cols_range(void *p, int64_t begin, int64_t end) {
  const reduce_job *j = p;
  int64_t m = j->K.size[j->K.n - 1], blocks = (m + COLS_WIDTH - 1) / COLS_WIDTH;
  vm_dims Kouter = j->K;
  Kouter.n--;
  int64_t rcount = vm_dims_count(&j->R);
  int64_t es = (int64_t)j->esize;
  char partial[COLS_WIDTH * 8];
  for (int64_t t = begin; t < end; t++) {
    int64_t ko = t / blocks, c0 = (t % blocks) * COLS_WIDTH;
    int64_t w = m - c0 < COLS_WIDTH ? m - c0 : COLS_WIDTH;
    char *acc = j->out + (ko * m + c0) * es;
    const char *xk = j->x + (dims_offset(&Kouter, ko) + c0) * es;
    j->r->init(acc, w);
    for (int64_t r0 = 0; r0 < rcount; r0 += COLS_BLOCK) {
      int64_t r1 = r0 + COLS_BLOCK < rcount ? r0 + COLS_BLOCK : rcount;
      j->r->init(partial, w);
      for (int64_t r = r0; r < r1; r++) j->r->cols(partial, xk + dims_offset(&j->R, r) * es, w, 1);
      j->r->cols(acc, partial, w, 1);
    }
  }
}

static bool argreduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr);

/* --- float reductions, in the order of vm/fold.h ------------------------------
   The order is fixed by the logical axes, never by the layout or the thread
   count; the layout only picks how the values are reached. */

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
/* vector code for AVX2 machines too (the folds are maps: no reassociation) */
#define VECTOR_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define VECTOR_CLONES
#endif

#define FOLD_COLS 512 /* columns of one column-order work item */

typedef struct fold_job fold_job;
typedef struct {
  /* dst (T) = the lane-order fold of positions [p0, p0 + n) of R from base */
  void (*lanes)(const fold_job *j, const char *base, int64_t p0, int64_t n, char *dst);
  /* dst (T) = the column-order fold of all of R from base */
  void (*ordered)(const fold_job *j, const char *base, char *dst);
  /* the column-order outputs (o, [b0, b0 + w)) of the vectorized layout */
  void (*cols)(const fold_job *j, int64_t o, int64_t b0, int64_t w);
} fold_reducer;

struct fold_job {
  const fold_reducer *f;
  vm_dims K, R; /* kept (output order) and reduced dims */
  vm_dims O;    /* column layout: the kept dims before R; I is one dim */
  int64_t inner, inner_stride, nblocks;
  int64_t count, chunk, nchunks;
  const char *x;
  char *out, *part;
  size_t esize;
};

/* the element offsets of positions p0.. of R, as runs of its last dim:
   calls body with (offset of the run's start, run length, position) */
#define FOR_RUNS(R, p0, n, OFF, LEN, K, BODY)                                \
  {                                                                          \
    int64_t idx_[KILN_MAX_DIMS], f_ = (p0);                                  \
    int last_ = (R)->n - 1;                                                  \
    for (int d_ = last_; d_ >= 0; d_--) {                                    \
      idx_[d_] = f_ % (R)->size[d_];                                         \
      f_ /= (R)->size[d_];                                                   \
    }                                                                        \
    for (int64_t K = 0; K < (n);) {                                          \
      int64_t OFF = 0;                                                       \
      for (int d_ = 0; d_ <= last_; d_++) OFF += idx_[d_] * (R)->stride[d_]; \
      int64_t LEN = (R)->size[last_] - idx_[last_];                          \
      if (LEN > (n)-K) LEN = (n)-K;                                          \
      BODY;                                                                  \
      K += LEN;                                                              \
      idx_[last_] += LEN;                                                    \
      for (int d_ = last_; d_ > 0 && idx_[d_] == (R)->size[d_]; d_--) {      \
        idx_[d_] = 0;                                                        \
        idx_[d_ - 1]++;                                                      \
      }                                                                      \
    }                                                                        \
  }

#define DEF_FOLD(op, sfx, T, A, INIT, COMB)                                                        \
  /* one block (n <= VM_FOLD_BLOCK) through the lanes, tree-folded */                              \
  VECTOR_CLONES static A op##_block_##sfx(const T *x, int64_t n, int64_t s) {                      \
    enum { L = VM_FOLD_LANE_BYTES / sizeof(A) };                                                   \
    A lanes[L];                                                                                    \
    for (int l = 0; l < L; l++) lanes[l] = INIT;                                                   \
    int64_t r = 0;                                                                                 \
    if (s == 1)                                                                                    \
      for (; r + L <= n; r += L)                                                                   \
        for (int l = 0; l < L; l++) lanes[l] = COMB(lanes[l], (A)x[r + l]);                        \
    else                                                                                           \
      for (; r + L <= n; r += L)                                                                   \
        for (int l = 0; l < L; l++) lanes[l] = COMB(lanes[l], (A)x[(r + l) * s]);                  \
    for (; r < n; r++) lanes[0] = COMB(lanes[0], (A)x[r * s]);                                     \
    for (int w = L / 2; w >= 1; w /= 2)                                                            \
      for (int k = 0; k < w; k++) lanes[k] = COMB(lanes[k], lanes[k + w]);                         \
    return lanes[0];                                                                               \
  }                                                                                                \
  /* positions [p0, p0 + n) of R, n <= VM_FOLD_BLOCK, copied in order */                           \
  static void op##_gather_##sfx(const vm_dims *R, const T *base, int64_t p0, int64_t n, T *buf) {  \
    FOR_RUNS(R, p0, n, off, len, k, {                                                              \
      const T *src = base + off;                                                                   \
      int64_t s = R->stride[last_];                                                                \
      for (int64_t i = 0; i < len; i++) buf[k + i] = src[i * s];                                   \
    })                                                                                             \
  }                                                                                                \
  static void op##_lanes_##sfx(const fold_job *j, const char *b, int64_t p0, int64_t n,            \
                               char *dst) {                                                        \
    const T *base = (const T *)b;                                                                  \
    const vm_dims *R = &j->R;                                                                      \
    int64_t s = R->n ? R->stride[R->n - 1] : 0;                                                    \
    A acc = INIT;                                                                                  \
    T buf[R->n > 1 ? VM_FOLD_BLOCK : 1];                                                           \
    for (int64_t p = p0; p < p0 + n; p += VM_FOLD_BLOCK) {                                         \
      int64_t len = p0 + n - p < VM_FOLD_BLOCK ? p0 + n - p : VM_FOLD_BLOCK;                       \
      if (R->n > 1) {                                                                              \
        op##_gather_##sfx(R, base, p, len, buf);                                                   \
        acc = COMB(acc, op##_block_##sfx(buf, len, 1));                                            \
      } else {                                                                                     \
        acc = COMB(acc, op##_block_##sfx(base + p * s, len, s));                                   \
      }                                                                                            \
    }                                                                                              \
    *(T *)dst = (T)acc;                                                                            \
  }                                                                                                \
  static void op##_ordered_##sfx(const fold_job *j, const char *b, char *dst) {                    \
    const T *base = (const T *)b;                                                                  \
    const vm_dims *R = &j->R;                                                                      \
    A acc = INIT;                                                                                  \
    T buf[VM_FOLD_BLOCK];                                                                          \
    for (int64_t p = 0; p < j->count; p += VM_FOLD_BLOCK) {                                        \
      int64_t len = j->count - p < VM_FOLD_BLOCK ? j->count - p : VM_FOLD_BLOCK;                   \
      if (R->n)                                                                                    \
        op##_gather_##sfx(R, base, p, len, buf);                                                   \
      else                                                                                         \
        buf[0] = base[0];                                                                          \
      A blk = INIT;                                                                                \
      for (int64_t i = 0; i < len; i++) blk = COMB(blk, (A)buf[i]);                                \
      acc = COMB(acc, blk);                                                                        \
    }                                                                                              \
    *(T *)dst = (T)acc;                                                                            \
  }                                                                                                \
  VECTOR_CLONES static void op##_cols_##sfx(const fold_job *j, int64_t o, int64_t b0, int64_t w) { \
    A acc[FOLD_COLS], blk[FOLD_COLS];                                                              \
    int64_t si = j->inner_stride;                                                                  \
    const T *x = (const T *)j->x + dims_offset(&j->O, o) + b0 * si;                                \
    for (int64_t b = 0; b < w; b++) acc[b] = INIT;                                                 \
    for (int64_t r0 = 0; r0 < j->count; r0 += VM_FOLD_BLOCK) {                                     \
      int64_t r1 = j->count - r0 < VM_FOLD_BLOCK ? j->count : r0 + VM_FOLD_BLOCK;                  \
      for (int64_t b = 0; b < w; b++) blk[b] = INIT;                                               \
      for (int64_t r = r0; r < r1; r++) {                                                          \
        const T *restrict xr = x + dims_offset(&j->R, r);                                          \
        if (si == 1)                                                                               \
          for (int64_t b = 0; b < w; b++) blk[b] = COMB(blk[b], (A)xr[b]);                         \
        else                                                                                       \
          for (int64_t b = 0; b < w; b++) blk[b] = COMB(blk[b], (A)xr[b * si]);                    \
      }                                                                                            \
      for (int64_t b = 0; b < w; b++) acc[b] = COMB(acc[b], blk[b]);                               \
    }                                                                                              \
    T *out = (T *)j->out + o * j->inner + b0;                                                      \
    for (int64_t b = 0; b < w; b++) out[b] = (T)acc[b];                                            \
  }                                                                                                \
  static const fold_reducer op##_fold_##sfx = {op##_lanes_##sfx, op##_ordered_##sfx,               \
                                               op##_cols_##sfx};

/* a fold whose accumulator A is checked against vm/fold.h's (vm_fold_acc_dtype) */
#define DTYPE_f32 KILN_F32
#define DTYPE_f64 KILN_F64
#define DTYPE_OF(A) (sizeof(A) == sizeof(double) ? KILN_F64 : KILN_F32) /* A: float or double */
#define DEF_CHECKED_FOLD(op, sfx, T, A, INIT, COMB)                         \
  _Static_assert(VM_FOLD_ACC_DTYPE(VM_OP_##op, DTYPE_##sfx) == DTYPE_OF(A), \
                 "vm/fold.h's accumulator of " #op " " #sfx);               \
  DEF_FOLD(op, sfx, T, A, INIT, COMB)

#define FADD(a, v) ((a) + (v))
#define FMUL(a, v) ((a) * (v))
DEF_CHECKED_FOLD(sum, f32, float, double, 0.0, FADD)
DEF_CHECKED_FOLD(sum, f64, double, double, 0.0, FADD)
DEF_CHECKED_FOLD(prod, f32, float, double, 1.0, FMUL)
DEF_CHECKED_FOLD(prod, f64, double, double, 1.0, FMUL)
DEF_CHECKED_FOLD(max, f32, float, float, -INFINITY, VM_FMAX)
DEF_CHECKED_FOLD(max, f64, double, double, -INFINITY, VM_FMAX)
DEF_CHECKED_FOLD(min, f32, float, float, INFINITY, VM_FMIN)
DEF_CHECKED_FOLD(min, f64, double, double, INFINITY, VM_FMIN)

static const fold_reducer *find_fold(vm_opcode op, kiln_dtype dt) {
  bool f64 = dt == KILN_F64;
  switch (op) {
    case VM_OP_sum:
      return f64 ? &sum_fold_f64 : &sum_fold_f32;
    case VM_OP_prod:
      return f64 ? &prod_fold_f64 : &prod_fold_f32;
    case VM_OP_max:
      return f64 ? &max_fold_f64 : &max_fold_f32;
    case VM_OP_min:
      return f64 ? &min_fold_f64 : &min_fold_f32;
    default:
      return NULL;
  }
}

void vm_fold_partials(vm_opcode op, kiln_dtype dt, const void *part, int64_t nchunks, int64_t rows,
                      void *out) {
  for (int64_t o = 0; o < rows; o++) {
    double acc = op == VM_OP_sum    ? 0
                 : op == VM_OP_prod ? 1
                 : op == VM_OP_max  ? -INFINITY
                                    : INFINITY;
    for (int64_t c = 0; c < nchunks; c++) {
      double x = dt == KILN_F64 ? ((const double *)part)[o * nchunks + c]
                                : (double)((const float *)part)[o * nchunks + c];
      switch (op) {
        case VM_OP_sum:
          acc += x;
          break;
        case VM_OP_prod:
          acc *= x;
          break;
        case VM_OP_max:
          acc = VM_FMAX(acc, x);
          break;
        default:
          acc = VM_FMIN(acc, x);
          break;
      }
    }
    if (dt == KILN_F64)
      ((double *)out)[o] = acc;
    else
      ((float *)out)[o] = (float)acc;
  }
}

static void lanes_items(void *p, int64_t begin, int64_t end) {
  const fold_job *j = p;
  int64_t es = (int64_t)j->esize;
  for (int64_t v = begin; v < end; v++) {
    int64_t o = v / j->nchunks, p0 = (v % j->nchunks) * j->chunk;
    int64_t n = j->count - p0 < j->chunk ? j->count - p0 : j->chunk;
    char *dst = j->nchunks > 1 ? j->part + v * es : j->out + o * es;
    j->f->lanes(j, j->x + dims_offset(&j->K, o) * es, p0, n, dst);
  }
}

static void ordered_items(void *p, int64_t begin, int64_t end) {
  const fold_job *j = p;
  int64_t es = (int64_t)j->esize;
  for (int64_t o = begin; o < end; o++)
    j->f->ordered(j, j->x + dims_offset(&j->K, o) * es, j->out + o * es);
}

static void cols_items(void *p, int64_t begin, int64_t end) {
  const fold_job *j = p;
  for (int64_t v = begin; v < end; v++) {
    int64_t o = v / j->nblocks, b0 = (v % j->nblocks) * FOLD_COLS;
    j->f->cols(j, o, b0, j->inner - b0 < FOLD_COLS ? j->inner - b0 : FOLD_COLS);
  }
}

static bool float_reduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr) {
  fold_job j = {.f = find_fold(op, in->dtype),
                .x = vm_data(in),
                .out = vm_data(out),
                .esize = vm_dtype_size(in->dtype)};
  if (!j.f) {
    vm_error(KILN_ERR_INTERNAL, "no %s kernel for %s", vm_op_table[op].name,
             vm_dtype_name(in->dtype));
    return false;
  }
  /* the logical pattern: kept dims before the reduced ones (O), reduced
     (R), kept after (I); a reduced dim after I is neither order's layout */
  vm_dims I = {0};
  int stage = 0; /* 0: O, 1: R, 2: I */
  bool trailing = true, split = true;
  for (int d = 0; d < in->ndim; d++) {
    if (in->shape[d] == 1) continue;
    if (attr->axes_mask & (1u << d)) {
      vm_dims_push(&j.R, in->shape[d], in->strides[d]);
      if (stage == 2) split = false;
      stage = 1;
    } else {
      vm_dims_push(&j.K, in->shape[d], in->strides[d]);
      if (stage == 0) {
        vm_dims_push(&j.O, in->shape[d], in->strides[d]);
      } else {
        vm_dims_push(&I, in->shape[d], in->strides[d]);
        stage = 2;
        trailing = false;
      }
    }
  }
  int64_t nout = vm_dims_count(&j.K);
  j.count = vm_dims_count(&j.R);
  if (nout == 0) return true;
  if (trailing) { /* the lane order, long rows in chunks */
    j.chunk = j.count > VM_FOLD_CHUNK ? VM_FOLD_CHUNK : j.count > 0 ? j.count : 1;
    j.nchunks = j.count > VM_FOLD_CHUNK ? (j.count + VM_FOLD_CHUNK - 1) / VM_FOLD_CHUNK : 1;
    if (j.nchunks > 1 && !(j.part = malloc((size_t)(nout * j.nchunks) * j.esize))) {
      vm_error(KILN_ERR_OOM, "out of memory");
      return false;
    }
    vm_parallel_for(nout * j.nchunks, ROWS_GRAIN / j.chunk + 1, lanes_items, &j);
    if (j.part) vm_fold_partials(op, in->dtype, j.part, j.nchunks, nout, j.out);
    free(j.part);
  } else if (split && I.n == 1) { /* the column order, vectorized across columns */
    j.inner = I.size[0];
    j.inner_stride = I.stride[0];
    j.nblocks = (j.inner + FOLD_COLS - 1) / FOLD_COLS;
    int64_t per_item = j.count * (j.inner < FOLD_COLS ? j.inner : FOLD_COLS);
    vm_parallel_for(vm_dims_count(&j.O) * j.nblocks, ROWS_GRAIN / (per_item + 1) + 1, cols_items,
                    &j);
  } else { /* the column order, an output at a time */
    vm_parallel_for(nout, ROWS_GRAIN / (j.count + 1) + 1, ordered_items, &j);
  }
  return true;
}

bool vm_k_reduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr) {
  if (op == VM_OP_argmax || op == VM_OP_argmin) return argreduce(op, out, in, attr);
  if (vm_dtype_is_float(in->dtype)) return float_reduce(op, out, in, attr);
  reduce_job j = {.r = find_reducer(op, in->dtype),
                  .x = vm_data(in),
                  .out = vm_data(out),
                  .esize = vm_dtype_size(in->dtype)};
  if (!j.r) {
    vm_error(KILN_ERR_INTERNAL, "no %s kernel for %s", vm_op_table[op].name,
             vm_dtype_name(in->dtype));
    return false;
  }
  for (int d = 0; d < in->ndim; d++) {
    if (attr->axes_mask & (1u << d))
      vm_dims_push(&j.R, in->shape[d], in->strides[d]);
    else
      vm_dims_push(&j.K, in->shape[d], in->strides[d]);
  }
  int64_t nout = vm_dims_count(&j.K), rcount = vm_dims_count(&j.R);
  if (nout == 0) return true;
  if (rcount == 0 || j.R.n == 0) { /* nothing or one element per output */
    rows_range(&j, 0, nout);
    return true;
  }
  bool row_mode = j.R.stride[j.R.n - 1] == 1 || j.K.n == 0 || j.K.stride[j.K.n - 1] != 1;
  if (nout == 1) {
    int64_t chunks = (rcount + SINGLE_CHUNK - 1) / SINGLE_CHUNK;
    j.partials = malloc((size_t)chunks * j.esize);
    if (!j.partials) {
      vm_error(KILN_ERR_OOM, "out of memory");
      return false;
    }
    vm_parallel_chunks(rcount, chunks, single_chunk, &j);
    j.r->init(j.out, 1);
    for (int64_t c = 0; c < chunks; c++) j.r->comb(j.out, j.partials + c * (int64_t)j.esize);
    free(j.partials);
  } else if (row_mode) {
    int64_t grain = ROWS_GRAIN / rcount + 1;
    vm_parallel_for(nout, grain, rows_range, &j);
  } else {
    int64_t m = j.K.size[j.K.n - 1], tasks = nout / m * ((m + COLS_WIDTH - 1) / COLS_WIDTH);
    int64_t grain = ROWS_GRAIN / (rcount * (m < COLS_WIDTH ? m : COLS_WIDTH)) + 1;
    vm_parallel_for(tasks, grain, cols_range, &j);
  }
  return true;
}

/* --- argmax / argmin ---------------------------------------------------------- */

typedef struct {
  vm_dims K;
  int64_t n, s; /* the reduced axis */
  const char *x;
  int64_t *out;
  kiln_dtype dt;
  bool is_max;
} arg_job;

#define ARG_SCAN(T, IS_FLOAT)               \
  {                                         \
    const T *x = (const T *)xv;             \
    T best = x[0];                          \
    int64_t bi = 0;                         \
    if (IS_FLOAT && best != best) return 0; \
    for (int64_t i = 1; i < n; i++) {       \
      T v = x[i * s];                       \
      if (IS_FLOAT && v != v) return i;     \
      if (is_max ? v > best : v < best) {   \
        best = v;                           \
        bi = i;                             \
      }                                     \
    }                                       \
    return bi;                              \
  }

static int64_t arg_scan(const char *xv, int64_t n, int64_t s, kiln_dtype dt, bool is_max) {
  switch (dt) {
    case KILN_BOOL:
      ARG_SCAN(bool, 0)
    case KILN_I32:
      ARG_SCAN(int32_t, 0)
    case KILN_I64:
      ARG_SCAN(int64_t, 0)
    case KILN_F32:
      ARG_SCAN(float, 1)
    case KILN_F64:
      ARG_SCAN(double, 1)
    case KILN_U8:
      ARG_SCAN(uint8_t, 0)
    case KILN_I8:
      ARG_SCAN(int8_t, 0)
    case KILN_I16:
      ARG_SCAN(int16_t, 0)
    case KILN_BF16:
    case KILN_F16:
      break; /* computed widened (vm/interp.c) */
  }
  return 0;
}

static void arg_range(void *p, int64_t begin, int64_t end) {
  const arg_job *j = p;
  size_t es = vm_dtype_size(j->dt);
  for (int64_t o = begin; o < end; o++)
    j->out[o] = arg_scan(j->x + dims_offset(&j->K, o) * (int64_t)es, j->n, j->s, j->dt, j->is_max);
}

static bool argreduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr) {
  arg_job j = {.x = vm_data(in),
               .out = vm_data(out),
               .dt = in->dtype,
               .is_max = op == VM_OP_argmax,
               .n = 1,
               .s = 0};
  for (int d = 0; d < in->ndim; d++) {
    if (attr->axes_mask & (1u << d)) {
      j.n = in->shape[d];
      j.s = in->strides[d];
    } else {
      vm_dims_push(&j.K, in->shape[d], in->strides[d]);
    }
  }
  int64_t nout = vm_dims_count(&j.K);
  if (nout == 0) return true;
  vm_parallel_for(nout, ROWS_GRAIN / (j.n + 1) + 1, arg_range, &j);
  return true;
}
