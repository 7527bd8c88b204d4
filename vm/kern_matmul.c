/* kern_matmul.c — numpy matmul for the interpreter: batch broadcasting,
 * floats through OpenBLAS gemm (transposed views passed as transposes, not
 * copied; a batch over a shared right operand folded into one gemm; any
 * other batch one job of whole per-item gemms on the pool), and integers
 * through a plain loop with wrapping arithmetic.  Gemms run in tiles on the
 * kernel pool, OpenBLAS itself single-threaded; the tiles depend on the
 * shape only, so results never depend on KILN_THREADS. */
#include <limits.h>
#include <stdatomic.h>
#include <string.h>

#include "blas.h"
#include "gemm.h"
#include "gemm_bf16.h"
#include "gemm_f32.h"
#include "kernels.h"
#include "pool.h"
#include "state.h"

/* --- the geometry (gemm.h) ------------------------------------------------------ */

bool vm_mat_blas_layout(const vm_mat *m, bool *trans, int64_t *ld) {
  int64_t r = m->rows, c = m->cols;
  if ((m->scol == 1 || c == 1) && (r == 1 || m->srow >= (c > 1 ? c : 1))) {
    *trans = false;
    *ld = r == 1 ? (c > 1 ? c : 1) : m->srow;
    return true;
  }
  if ((m->srow == 1 || r == 1) && (c == 1 || m->scol >= (r > 1 ? r : 1))) {
    *trans = true;
    *ld = c == 1 ? (r > 1 ? r : 1) : m->scol;
    return true;
  }
  return false;
}

void vm_mat_of(const vm_tensor *t, bool left, const vm_batch *b, vm_mat *m) {
  int nd = t->ndim;
  if (nd == 1) {
    m->rows = left ? 1 : t->shape[0];
    m->cols = left ? t->shape[0] : 1;
    m->srow = left ? 0 : t->strides[0];
    m->scol = left ? t->strides[0] : 0;
  } else {
    m->rows = t->shape[nd - 2];
    m->cols = t->shape[nd - 1];
    m->srow = t->strides[nd - 2];
    m->scol = t->strides[nd - 1];
  }
  int tb = nd > 2 ? nd - 2 : 0, lead = b->nb - tb;
  for (int d = 0; d < b->nb; d++) {
    int src = d - lead;
    m->bstride[d] = (src < 0 || t->shape[src] == 1) ? 0 : t->strides[src];
  }
  m->base = t->storage ? vm_data(t) : NULL;
}

bool vm_blas_operand_ok(const vm_tensor *t, bool left) {
  vm_batch none = {0};
  vm_mat m;
  vm_mat_of(t, left, &none, &m);
  bool trans;
  int64_t ld;
  return vm_mat_blas_layout(&m, &trans, &ld);
}

void vm_gemm_geom_of(const vm_tensor *out, const vm_tensor *a, const vm_tensor *b,
                     vm_gemm_geom *g) {
  memset(&g->bat, 0, sizeof g->bat);
  g->bat.nb = out->ndim - (a->ndim > 1) - (b->ndim > 1);
  for (int d = 0; d < g->bat.nb; d++) g->bat.bshape[d] = out->shape[d];
  vm_mat_of(a, true, &g->bat, &g->a);
  vm_mat_of(b, false, &g->bat, &g->b);
  g->M = g->a.rows, g->N = g->b.cols, g->K = g->a.cols, g->nbatch = 1;
  for (int d = 0; d < g->bat.nb; d++) g->nbatch *= g->bat.bshape[d];
}

bool vm_gemm_batch_is_rows(const vm_gemm_geom *g) {
  bool b_shared = true, a_rows = g->a.scol == 1 && g->a.srow == g->K;
  for (int d = 0; d < g->bat.nb; d++) b_shared = b_shared && g->b.bstride[d] == 0;
  int64_t step = g->M * g->K;
  for (int d = g->bat.nb - 1; d >= 0 && a_rows; d--) {
    a_rows = g->a.bstride[d] == step;
    step *= g->bat.bshape[d];
  }
  return b_shared && a_rows && g->nbatch > 1;
}

/* --- the interpreter's matmul ------------------------------------------------------ */

/* the row-major BLAS call's transpose flag and leading dim for m */
static bool blas_layout(const vm_mat *m, int *trans, int64_t *ld) {
  bool t;
  if (!vm_mat_blas_layout(m, &t, ld)) return false;
  *trans = t ? VM_BLAS_TRANS : VM_BLAS_NO_TRANS;
  return true;
}

static int64_t batch_offset(const vm_batch *b, const int64_t *strides, int64_t flat) {
  int64_t off = 0;
  for (int d = b->nb - 1; d >= 0; d--) {
    off += (flat % b->bshape[d]) * strides[d];
    flat /= b->bshape[d];
  }
  return off;
}

#define INT_GEMM(T, U)                                                                          \
  static void gemm_##T(const vm_mat *a, const vm_mat *b, T *c, int64_t M, int64_t N, int64_t K, \
                       const T *A, const T *B) {                                                \
    for (int64_t i = 0; i < M; i++) {                                                           \
      T *restrict crow = c + i * N;                                                             \
      for (int64_t j = 0; j < N; j++) crow[j] = 0;                                              \
      for (int64_t k = 0; k < K; k++) {                                                         \
        U aik = (U)A[i * a->srow + k * a->scol];                                                \
        const T *brow = B + k * b->srow;                                                        \
        for (int64_t j = 0; j < N; j++) crow[j] = (T)((U)crow[j] + aik * (U)brow[j * b->scol]); \
      }                                                                                         \
    }                                                                                           \
  }
INT_GEMM(int32_t, uint32_t)
INT_GEMM(int64_t, uint64_t)

/* A gemm runs on the kernel pool in tiles of C, each tile one
   single-threaded BLAS call: OpenBLAS's own threads would run beside the
   pool's and other user threads' (two models on two threads ran 10x slower
   than one after the other), and could not count against KILN_THREADS.

   The tiles are a function of (M, N, K) alone, never of the thread count:
   threads take whole tiles.  That is what makes results independent of
   KILN_THREADS, and it has to be by construction, because OpenBLAS computes
   an element of C in a way that depends on the shape of the call it is in:
   its Haswell/Zen sgemm runs C's rows (its N, row-major being its
   transpose) in panels of 12 and the tail rows through edge kernels that
   sum in another order; its SkylakeX sgemm takes a small-matrix kernel when
   M*N*K is small.  So the same element computed in a 128-row call and in a
   256-row call can differ in its last bit (issue 36: test_threads trained to
   other bits at 1, 2 and 4 threads under OPENBLAS_CORETYPE=Haswell).

   Each tile repacks the operand panels it shares with its neighbours, so
   tiles cost time: measured on one thread of an AMD EPYC (Zen 4) for a
   1024^3 sgemm, 4 tiles of 512^2 +2.5%, 16 of 256^2 +7%, 8 strips of 128
   rows +4-10%.  The rule: halve the longer side of the tile while every
   tile keeps GEMM_TILE_SIDE rows (columns) and GEMM_TILE_WORK multiply-adds,
   up to GEMM_TILES_FEW tiles; past that, only while the sides stay
   GEMM_TILE_SIDE_MANY, up to GEMM_TILES_MAX.  Counts are powers of two, so
   1, 2, 4, 8 or 16 threads share them evenly; edges fall on whole
   GEMM_UNITs.

   The first split, from one tile to two, asks less (GEMM_TILE_SIDE_TWO,
   GEMM_TILE_WORK_TWO): a recurrent step's gemms ([32,128]x[128,384] and
   [32,384]x[384,128], a GRU's) ran on one thread, and two tiles took them
   from 38-48 to 18-24 µs on two threads (AMD EPYC Zen 4).  Only the first:
   four narrow tiles of a [128,960]^T x [960,384] repacked its transposed
   operand four times and ran 1.37x slower than two (490 -> 675 µs). */
#define GEMM_UNIT 64
#define GEMM_TILE_SIDE 128       /* rows (columns) a tile keeps at least */
#define GEMM_TILE_WORK (1 << 22) /* multiply-adds a tile keeps at least */
#define GEMM_TILE_SIDE_TWO 64    /* the same for the split into two tiles */
#define GEMM_TILE_WORK_TWO (1 << 19)
#define GEMM_TILES_FEW 4        /* tiles of at least GEMM_TILE_SIDE */
#define GEMM_TILE_SIDE_MANY 512 /* past GEMM_TILES_FEW, sides of at least this */
#define GEMM_TILES_MAX 16

typedef struct {
  int64_t rows, cols; /* tiles down C's rows and across its columns */
} gemm_tiling;

/* where tile i of `tiles` along an extent starts: whole GEMM_UNITs, spread
   evenly (the last tile takes the partial unit) */
static int64_t tile_start(int64_t extent, int64_t tiles, int64_t i) {
  int64_t units = (extent + GEMM_UNIT - 1) / GEMM_UNIT, at = units * i / tiles * GEMM_UNIT;
  return at < extent ? at : extent;
}

/* the narrowest of `tiles` tiles along an extent */
static int64_t narrowest_tile(int64_t extent, int64_t tiles) {
  int64_t least = extent;
  for (int64_t i = 0; i < tiles; i++) {
    int64_t side = tile_start(extent, tiles, i + 1) - tile_start(extent, tiles, i);
    if (side < least) least = side;
  }
  return least;
}

static gemm_tiling gemm_tiles(int64_t M, int64_t N, int64_t K) {
  gemm_tiling t = {1, 1};
  while (t.rows * t.cols < GEMM_TILES_MAX) {
    bool split_rows = M / t.rows >= N / t.cols;
    gemm_tiling next = {t.rows * (split_rows ? 2 : 1), t.cols * (split_rows ? 1 : 2)};
    int64_t side = split_rows ? narrowest_tile(M, next.rows) : narrowest_tile(N, next.cols);
    int64_t tiles = t.rows * t.cols;
    int64_t min_side = tiles >= GEMM_TILES_FEW ? GEMM_TILE_SIDE_MANY
                       : tiles == 1            ? GEMM_TILE_SIDE_TWO
                                               : GEMM_TILE_SIDE;
    double min_work = tiles == 1 ? GEMM_TILE_WORK_TWO : GEMM_TILE_WORK;
    double work = (double)M * (double)N * (double)K / (double)(next.rows * next.cols);
    if (side < min_side || work < min_work) break;
    t = next;
  }
  return t;
}

typedef struct {
  const vm_blas *blas;
  kiln_dtype dt;
  int ta, tb;
  gemm_tiling tiles;
  int64_t M, N, K, lda, ldb, ldc, es;
  const char *A, *B;
  char *C;
  atomic_bool *failed; /* set by a tile that could not run (a bf16 tile's packing) */
  bool own;            /* f32 through Kiln's GEMM (vm/gemm_f32.h), not OpenBLAS */
  const float *panels; /* its op(B) packed for the whole call (a loop's fixed weight), or NULL */
} gemm_job;

/* C[r0:r1, c0:c1], the tile numbered `tile` (row-major over the tiling) of
   C = op(A) op(B), as one BLAS call: row i of op(A) starts at i*lda (at i
   when A is transposed), column k of op(B) at k (at k*ldb when B is
   transposed) */
static void gemm_tile_of(const gemm_job *j, int64_t tile, const char *A, const char *B, char *C) {
  int64_t tr = tile / j->tiles.cols, tc = tile % j->tiles.cols;
  int64_t r0 = tile_start(j->M, j->tiles.rows, tr), r1 = tile_start(j->M, j->tiles.rows, tr + 1);
  int64_t c0 = tile_start(j->N, j->tiles.cols, tc), c1 = tile_start(j->N, j->tiles.cols, tc + 1);
  A += (j->ta == VM_BLAS_NO_TRANS ? r0 * j->lda : r0) * j->es;
  B += (j->tb == VM_BLAS_NO_TRANS ? c0 : c0 * j->ldb) * j->es;
  C += (r0 * j->ldc + c0) * j->es;
  int m = (int)(r1 - r0), n = (int)(c1 - c0), k = (int)j->K, lda = (int)j->lda, ldb = (int)j->ldb,
      ldc = (int)j->ldc;
  if (j->dt == KILN_BF16) { /* vm_gemm_bf16_available(): front/op.c records it only then */
    if (!vm_gemm_bf16(j->ta != VM_BLAS_NO_TRANS, j->tb != VM_BLAS_NO_TRANS, m, n, k,
                      (const uint16_t *)A, lda, (const uint16_t *)B, ldb, (uint16_t *)C, ldc))
      atomic_store(j->failed, true);
  } else if (j->own) {
    /* a tile starts at a whole unit, a whole panel: panel c0 / width at c0 * K */
    const float *panels = j->panels ? j->panels + c0 * j->K : NULL;
    if (!vm_gemm_f32(j->ta != VM_BLAS_NO_TRANS, j->tb != VM_BLAS_NO_TRANS, m, n, k,
                     (const float *)A, lda, (const float *)B, ldb, (float *)C, ldc, panels))
      atomic_store(j->failed, true);
  } else if (j->dt == KILN_F32)
    j->blas->sgemm(VM_BLAS_ROW_MAJOR, j->ta, j->tb, m, n, k, 1.0f, (const float *)A, lda,
                   (const float *)B, ldb, 0.0f, (float *)C, ldc);
  else
    j->blas->dgemm(VM_BLAS_ROW_MAJOR, j->ta, j->tb, m, n, k, 1.0, (const double *)A, lda,
                   (const double *)B, ldb, 0.0, (double *)C, ldc);
}

static void gemm_tile(void *ctx, int64_t tile, int64_t b, int64_t e) {
  (void)b, (void)e;
  const gemm_job *j = ctx;
  gemm_tile_of(j, tile, j->A, j->B, j->C);
}

/* the BLAS geometry of C = a b, M x N x K, in *job (its A, B, C unset);
   false + error when BLAS is missing or cannot take the operands */
static bool gemm_job_of(gemm_job *job, kiln_dtype dt, const vm_mat *a, const vm_mat *b, int64_t M,
                        int64_t N, int64_t K) {
  const vm_blas *blas = vm_blas_get();
  if (!blas->loaded) {
    vm_error(KILN_ERR_INTERNAL, "%s", blas->error);
    return false;
  }
  int ta, tb;
  int64_t lda, ldb;
  if (!blas_layout(a, &ta, &lda) || !blas_layout(b, &tb, &ldb)) {
    vm_error(KILN_ERR_INTERNAL, "matmul operand layout not supported by BLAS");
    return false;
  }
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX) {
    vm_error(KILN_ERR_SHAPE, "matrix dimensions %lld x %lld x %lld exceed BLAS's int range",
             (long long)M, (long long)K, (long long)N);
    return false;
  }
  *job = (gemm_job){.blas = blas,
                    .dt = dt,
                    .ta = ta,
                    .tb = tb,
                    .tiles = gemm_tiles(M, N, K),
                    .M = M,
                    .N = N,
                    .K = K,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = N > 1 ? N : 1,
                    .es = (int64_t)vm_dtype_size(dt),
                    .own = dt == KILN_F32 && vm_gemm_f32_takes(M, N, K, ta != VM_BLAS_NO_TRANS)};
  return true;
}

/* bs: B's storage (a loop's fixed weight is packed once, vm/gemm_f32.h) */
static bool float_gemm(kiln_dtype dt, const vm_mat *a, const vm_mat *b, char *c, int64_t M,
                       int64_t N, int64_t K, const char *A, const char *B, const vm_storage *bs) {
  gemm_job job;
  if (!gemm_job_of(&job, dt, a, b, M, N, K)) return false;
  if (job.own)
    job.panels =
        vm_gemm_fixed_panels(bs, (const float *)B, job.ldb, job.tb != VM_BLAS_NO_TRANS, N, K);
  atomic_fetch_add_explicit(&vm_process()->stats.blas_calls, 1, memory_order_relaxed);
  atomic_bool failed = false;
  job.A = A, job.B = B, job.C = c, job.failed = &failed;
  int64_t tiles = job.tiles.rows * job.tiles.cols;
  vm_parallel_chunks(tiles, tiles, gemm_tile, &job); /* one tile a chunk */
  if (!atomic_load(&failed)) return true;
  vm_error(KILN_ERR_OOM, "out of memory packing a matmul's operands");
  return false;
}

/* A batch of products (q k^T over [batch, heads]) is one job on the pool,
   not one gemm after another: its units are the tiles of every item, each
   item tiled exactly as a single matmul of its shape (gemm_tiles), so an
   item's bits are those of the same product made alone, at any thread
   count.  Units are grouped into chunks of about BATCH_CHUNK_WORK
   multiply-adds (a shape-only grouping; it moves no bits, only keeps tiny
   batches from waking the pool).  OpenBLAS 0.3.21 (Debian 12) has no batch
   API (cblas_?gemm_batch came in 0.3.27), so this loop is the batch and
   each item packs its own operands; it is counted as one BLAS call.  A
   batch over one shared right operand whose left items are evenly spaced
   rows never comes here: it is one gemm of nbatch * M rows. */
#define BATCH_CHUNK_WORK (1 << 18)

typedef struct {
  gemm_job g;          /* every item's geometry and tiling (A, B, C unset) */
  int64_t tiles;       /* units per item: its tiles (1 for integers) */
  const vm_batch *bat; /* the batch ... */
  const vm_mat *a, *b; /* ... and the operands' strides over it */
  char *C;             /* item i at i * M * N */
} batch_job;

static void batch_units(void *ctx, int64_t chunk, int64_t begin, int64_t end) {
  (void)chunk;
  const batch_job *j = ctx;
  const gemm_job *g = &j->g;
  for (int64_t u = begin; u < end; u++) {
    int64_t i = u / j->tiles;
    const char *A = j->a->base + batch_offset(j->bat, j->a->bstride, i) * g->es;
    const char *B = j->b->base + batch_offset(j->bat, j->b->bstride, i) * g->es;
    char *C = j->C + i * g->M * g->N * g->es;
    switch (g->dt) {
      case KILN_I32:
        gemm_int32_t(j->a, j->b, (int32_t *)C, g->M, g->N, g->K, (const int32_t *)A,
                     (const int32_t *)B);
        break;
      case KILN_I64:
        gemm_int64_t(j->a, j->b, (int64_t *)C, g->M, g->N, g->K, (const int64_t *)A,
                     (const int64_t *)B);
        break;
      default:
        gemm_tile_of(g, u % j->tiles, A, B, C);
    }
  }
}

static bool matmul_batched(vm_tensor *out, const vm_tensor *at, const vm_tensor *bt) {
  vm_gemm_geom g;
  vm_gemm_geom_of(out, at, bt, &g);
  int64_t M = g.M, N = g.N, K = g.K, nbatch = g.nbatch;
  kiln_dtype dt = out->dtype;
  int64_t es = (int64_t)vm_dtype_size(dt);
  char *c = vm_data(out);
  if (out->numel == 0) return true;
  if (K == 0) {
    memset(c, 0, (size_t)(out->numel * es));
    return true;
  }
  bool fl = vm_dtype_is_float(dt);
  if (fl && vm_gemm_batch_is_rows(&g)) { /* one gemm */
    vm_mat a2 = g.a;
    a2.rows = M * nbatch;
    return float_gemm(dt, &a2, &g.b, c, M * nbatch, N, K, g.a.base, g.b.base, bt->storage);
  }
  if (fl && nbatch == 1)
    return float_gemm(dt, &g.a, &g.b, c, M, N, K, g.a.base, g.b.base, bt->storage);
  batch_job job = {.bat = &g.bat, .a = &g.a, .b = &g.b, .C = c, .tiles = 1};
  if (fl) {
    if (!gemm_job_of(&job.g, dt, &g.a, &g.b, M, N, K)) return false;
    job.tiles = job.g.tiles.rows * job.g.tiles.cols;
    atomic_fetch_add_explicit(&vm_process()->stats.blas_calls, 1, memory_order_relaxed);
  } else {
    job.g = (gemm_job){.dt = dt, .M = M, .N = N, .K = K, .es = es};
  }
  int64_t units = nbatch * job.tiles;
  double work = (double)M * (double)N * (double)K * (double)nbatch;
  int64_t chunks =
      work / BATCH_CHUNK_WORK < (double)units ? (int64_t)(work / BATCH_CHUNK_WORK) : units;
  atomic_bool failed = false;
  job.g.failed = &failed;
  vm_parallel_chunks(units, chunks > 1 ? chunks : 1, batch_units, &job);
  if (!atomic_load(&failed)) return true;
  vm_error(KILN_ERR_OOM, "out of memory packing a matmul's operands");
  return false;
}

/* an operand BLAS cannot read as it is becomes contiguous first */
static vm_tensor *blas_ready(vm_tensor *t, bool left) {
  if (!vm_dtype_is_float(t->dtype) || vm_blas_operand_ok(t, left)) return vm_retain(t);
  return vm_value_copy(t);
}

bool vm_k_matmul(vm_tensor *out, const vm_tensor *a, const vm_tensor *b) {
  vm_tensor *ra = blas_ready((vm_tensor *)a, true), *rb = blas_ready((vm_tensor *)b, false);
  bool ok = ra && rb && matmul_batched(out, ra, rb);
  vm_release(ra);
  vm_release(rb);
  return ok;
}
