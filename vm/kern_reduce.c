/* kern_reduce.c — the interpreter's reductions (sum, prod, max, min) and
 * arg-reductions (argmax, argmin).  The input's dims split into kept (K) and
 * reduced (R) lists, each coalesced; then:
 *   - R's innermost dim is unit-stride (row reductions): each output reduces
 *     runs of R, float sums pairwise (numpy's accuracy);
 *   - else K's innermost dim is unit-stride (column reductions): rows of R
 *     are accumulated into a block of outputs, vectorized across outputs;
 *   - a single output over many elements is split into fixed-size chunks
 *     whose partials are combined in order, so the result never depends on
 *     the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"
#include "state.h"

typedef struct {
  int n;
  int64_t size[KILN_MAX_DIMS], stride[KILN_MAX_DIMS];
} dims;

static void dims_push(dims *d, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (d->n > 0 && vm_dims_merge(d->stride[d->n - 1], stride, size)) {
    d->size[d->n - 1] *= size;
    d->stride[d->n - 1] = stride;
    return;
  }
  d->size[d->n] = size;
  d->stride[d->n] = stride;
  d->n++;
}

static int64_t dims_count(const dims *d) {
  int64_t c = 1;
  for (int i = 0; i < d->n; i++) c *= d->size[i];
  return c;
}

/* element offset of the flat (row-major) index f */
static int64_t dims_offset(const dims *d, int64_t f) {
  int64_t off = 0;
  for (int i = d->n - 1; i >= 0; i--) {
    off += (f % d->size[i]) * d->stride[i];
    f /= d->size[i];
  }
  return off;
}

/* --- per-op, per-dtype pieces -------------------------------------------
   INIT: identity; COMB(a, v): fold one value; RUN: reduce n values at stride s */

#define PAIRWISE_BLOCK 128

#define SUM_RUN(fname, T)                                                  \
  static T fname(const T *x, int64_t n, int64_t s) {                       \
    if (n > PAIRWISE_BLOCK) {                                              \
      int64_t h = (n / 2 + 15) & ~(int64_t)15;                             \
      return fname(x, h, s) + fname(x + h * s, n - h, s);                  \
    }                                                                      \
    T acc[16] = {0};                                                       \
    int64_t i = 0;                                                         \
    if (s == 1)                                                            \
      for (; i + 16 <= n; i += 16)                                         \
        for (int k = 0; k < 16; k++) acc[k] += x[i + k];                   \
    for (; i < n; i++) acc[i & 15] += x[i * s];                            \
    for (int w = 8; w > 0; w /= 2)                                         \
      for (int k = 0; k < w; k++) acc[k] += acc[k + w];                    \
    return acc[0];                                                         \
  }

#define LOOP_RUN(fname, T, INIT, COMB)                                     \
  static T fname(const T *x, int64_t n, int64_t s) {                       \
    T acc = INIT;                                                          \
    if (s == 1)                                                            \
      for (int64_t i = 0; i < n; i++) acc = COMB(acc, x[i]);               \
    else                                                                   \
      for (int64_t i = 0; i < n; i++) acc = COMB(acc, x[i * s]);           \
    return acc;                                                            \
  }

#define ADD(a, v) ((a) + (v))
#define MUL(a, v) ((a) * (v))
#define IADD(a, v) ((int64_t)((uint64_t)(a) + (uint64_t)(v)))
#define IMUL(a, v) ((int64_t)((uint64_t)(a) * (uint64_t)(v)))
#define FMAX(a, v) (((a) != (a) || (a) >= (v)) ? (a) : (v))
#define FMIN(a, v) (((a) != (a) || (a) <= (v)) ? (a) : (v))
#define IMAX(a, v) ((a) >= (v) ? (a) : (v))
#define IMIN(a, v) ((a) <= (v) ? (a) : (v))

/* X(op, suffix, T, dtype, INIT, COMB, pairwise) */
#define REDUCERS(X)                                                  \
  X(sum, f32, float, KILN_F32, 0.0f, ADD, 1)                         \
  X(sum, f64, double, KILN_F64, 0.0, ADD, 1)                         \
  X(sum, i64, int64_t, KILN_I64, 0, IADD, 0)                         \
  X(prod, f32, float, KILN_F32, 1.0f, MUL, 0)                        \
  X(prod, f64, double, KILN_F64, 1.0, MUL, 0)                        \
  X(prod, i64, int64_t, KILN_I64, 1, IMUL, 0)                        \
  X(max, f32, float, KILN_F32, -INFINITY, FMAX, 0)                   \
  X(max, f64, double, KILN_F64, -INFINITY, FMAX, 0)                  \
  X(max, i32, int32_t, KILN_I32, INT32_MIN, IMAX, 0)                 \
  X(max, i64, int64_t, KILN_I64, INT64_MIN, IMAX, 0)                 \
  X(max, b8, bool, KILN_BOOL, false, IMAX, 0)                        \
  X(min, f32, float, KILN_F32, INFINITY, FMIN, 0)                    \
  X(min, f64, double, KILN_F64, INFINITY, FMIN, 0)                   \
  X(min, i32, int32_t, KILN_I32, INT32_MAX, IMIN, 0)                 \
  X(min, i64, int64_t, KILN_I64, INT64_MAX, IMIN, 0)                 \
  X(min, b8, bool, KILN_BOOL, true, IMIN, 0)

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
  dims K, R;
  const char *x;
  char *out;
  size_t esize;
  char *partials; /* single-output chunked mode */
  int64_t chunk;
};

#define DEF_REDUCER(op, sfx, T, DT, INIT, COMB, PAIRWISE)                        \
  LOOP_RUN(op##_loop_##sfx, T, INIT, COMB)                                       \
  static T op##_run_##sfx(const T *x, int64_t n, int64_t s) {                    \
    return op##_loop_##sfx(x, n, s);                                             \
  }                                                                              \
  static void op##_range_##sfx(const reduce_job *j, const char *xc, int64_t b,   \
                               int64_t e, void *accp) {                          \
    const T *x = (const T *)xc;                                                  \
    const dims *R = &j->R;                                                       \
    int64_t inner = R->n ? R->size[R->n - 1] : 1;                                \
    int64_t s = R->n ? R->stride[R->n - 1] : 0;                                  \
    dims outer = *R;                                                             \
    if (outer.n) outer.n--;                                                      \
    T acc = *(T *)accp;                                                          \
    for (int64_t f = b; f < e;) {                                                \
      int64_t i = f % inner, len = inner - i;                                    \
      if (len > e - f) len = e - f;                                              \
      const T *run = x + dims_offset(&outer, f / inner) + i * s;                 \
      T v = PAIRWISE ? op##_pairwise_##sfx(run, len, s) : op##_run_##sfx(run, len, s); \
      acc = COMB(acc, v);                                                        \
      f += len;                                                                  \
    }                                                                            \
    *(T *)accp = acc;                                                            \
  }                                                                              \
  static void op##_cols_##sfx(void *accp, const char *xc, int64_t m, int64_t s) { \
    T *restrict acc = (T *)accp;                                                 \
    const T *restrict x = (const T *)xc;                                         \
    if (s == 1)                                                                  \
      for (int64_t k = 0; k < m; k++) acc[k] = COMB(acc[k], x[k]);               \
    else                                                                         \
      for (int64_t k = 0; k < m; k++) acc[k] = COMB(acc[k], x[k * s]);           \
  }                                                                              \
  static void op##_init_##sfx(void *accp, int64_t m) {                           \
    for (int64_t k = 0; k < m; k++) ((T *)accp)[k] = INIT;                       \
  }                                                                              \
  static void op##_comb_##sfx(void *accp, const void *v) {                       \
    *(T *)accp = COMB(*(T *)accp, *(const T *)v);                                \
  }                                                                              \
  static const reducer op##_reducer_##sfx = {op##_range_##sfx, op##_cols_##sfx,  \
                                             op##_init_##sfx, op##_comb_##sfx};

/* pairwise runs exist for float sums; other reducers reference a stub */
SUM_RUN(sum_pairwise_f32, float)
SUM_RUN(sum_pairwise_f64, double)
#define NO_PAIRWISE(op, sfx, T) \
  static inline T op##_pairwise_##sfx(const T *x, int64_t n, int64_t s) { (void)x; (void)n; (void)s; return 0; }
NO_PAIRWISE(sum, i64, int64_t)
NO_PAIRWISE(prod, f32, float)
NO_PAIRWISE(prod, f64, double)
NO_PAIRWISE(prod, i64, int64_t)
NO_PAIRWISE(max, f32, float)
NO_PAIRWISE(max, f64, double)
NO_PAIRWISE(max, i32, int32_t)
NO_PAIRWISE(max, i64, int64_t)
NO_PAIRWISE(max, b8, bool)
NO_PAIRWISE(min, f32, float)
NO_PAIRWISE(min, f64, double)
NO_PAIRWISE(min, i32, int32_t)
NO_PAIRWISE(min, i64, int64_t)
NO_PAIRWISE(min, b8, bool)

REDUCERS(DEF_REDUCER)

static const reducer *find_reducer(vm_opcode op, kiln_dtype dt) {
#define MATCH(o, sfx, T, DT, INIT, COMB, P) \
  if (op == VM_OP_##o && dt == DT) return &o##_reducer_##sfx;
  REDUCERS(MATCH)
#undef MATCH
  return NULL;
}

/* --- drivers --------------------------------------------------------------- */

#define ROWS_GRAIN (1 << 15)     /* elements of work before we go parallel */
#define SINGLE_CHUNK (1 << 16)   /* chunk size of a single-output reduction */
#define COLS_BLOCK 256           /* rows folded into a partial before adding */

static void rows_range(void *p, int64_t begin, int64_t end) {
  const reduce_job *j = p;
  int64_t count = dims_count(&j->R);
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
  dims Kouter = j->K;
  Kouter.n--;
  int64_t rcount = dims_count(&j->R);
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

bool vm_k_reduce(vm_opcode op, vm_tensor *out, const vm_tensor *in, const vm_attr *attr) {
  if (op == VM_OP_argmax || op == VM_OP_argmin) return argreduce(op, out, in, attr);
  reduce_job j = {.r = find_reducer(op, in->dtype), .x = vm_data(in), .out = vm_data(out),
                  .esize = vm_dtype_size(in->dtype)};
  if (!j.r) {
    vm_error(KILN_ERR_INTERNAL, "no %s kernel for %s", vm_op_table[op].name,
             vm_dtype_name(in->dtype));
    return false;
  }
  for (int d = 0; d < in->ndim; d++) {
    if (attr->axes_mask & (1u << d))
      dims_push(&j.R, in->shape[d], in->strides[d]);
    else
      dims_push(&j.K, in->shape[d], in->strides[d]);
  }
  int64_t nout = dims_count(&j.K), rcount = dims_count(&j.R);
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
  dims K;
  int64_t n, s; /* the reduced axis */
  const char *x;
  int64_t *out;
  kiln_dtype dt;
  bool is_max;
} arg_job;

#define ARG_SCAN(T, IS_FLOAT)                                              \
  {                                                                        \
    const T *x = (const T *)xv;                                            \
    T best = x[0];                                                         \
    int64_t bi = 0;                                                        \
    if (IS_FLOAT && best != best) return 0;                                \
    for (int64_t i = 1; i < n; i++) {                                      \
      T v = x[i * s];                                                      \
      if (IS_FLOAT && v != v) return i;                                    \
      if (is_max ? v > best : v < best) {                                  \
        best = v;                                                          \
        bi = i;                                                            \
      }                                                                    \
    }                                                                      \
    return bi;                                                             \
  }

static int64_t arg_scan(const char *xv, int64_t n, int64_t s, kiln_dtype dt, bool is_max) {
  switch (dt) {
    case KILN_BOOL: ARG_SCAN(bool, 0)
    case KILN_I32: ARG_SCAN(int32_t, 0)
    case KILN_I64: ARG_SCAN(int64_t, 0)
    case KILN_F32: ARG_SCAN(float, 1)
    case KILN_F64: ARG_SCAN(double, 1)
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
  arg_job j = {.x = vm_data(in), .out = vm_data(out), .dt = in->dtype,
               .is_max = op == VM_OP_argmax, .n = 1, .s = 0};
  for (int d = 0; d < in->ndim; d++) {
    if (attr->axes_mask & (1u << d)) {
      j.n = in->shape[d];
      j.s = in->strides[d];
    } else {
      dims_push(&j.K, in->shape[d], in->strides[d]);
    }
  }
  int64_t nout = dims_count(&j.K);
  if (nout == 0) return true;
  vm_parallel_for(nout, ROWS_GRAIN / (j.n + 1) + 1, arg_range, &j);
  return true;
}
