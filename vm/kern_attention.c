/* kern_attention.c — scaled dot-product attention for the interpreter (and
 * so for compiled plans, which hand the op to it): attention and its
 * gradient attention_grad (ops.def), float32 / float64, FlashAttention-2's
 * algorithm on the CPU.
 *
 * Forward: a task is one batch item's block of ATT_BQ queries.  It walks
 * the keys in blocks of ATT_BK: scores S = Q Kᵀ (a BLAS gemm on packed
 * blocks), scaled and masked, then an online softmax — each row's running
 * max m and sum l, its accumulator rescaled by exp(m_old - m_new) when the
 * max grows — and acc += P V (a second gemm).  Only a BQ x BK block of
 * scores ever exists, never the B x H x Tq x Tk matrix the composite
 * writes, softmaxes and reads back.  Causal rows stop at their diagonal
 * block.  A row with every key masked out gives 0 (PyTorch's SDPA since 2.5;
 * the composite gives NaN), and its gradient is 0.
 *
 * Backward: a task is one batch item (its dK, dV accumulate over query
 * blocks without other writers).  Per query block, a first pass over the
 * keys recomputes each row's logsumexp; the second recomputes
 * P = exp(S - lse) block by block and accumulates dV += Pᵀ dO,
 * dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)) · scale, dQ += dS K, dK += dSᵀ Q.
 * Saving the logsumexp instead would need a second output; recomputing it
 * costs one more Q Kᵀ per block (a sixth of the backward's gemms).  With
 * fewer batch items than threads (one long sequence, a few heads), the
 * backward runs in three phases instead (three_phase): the first pass per
 * query block, then dK, dV per key block and dQ per query block, each
 * recomputing its probabilities — a third more gemms, spread over every
 * thread, and the same bits: each sum in the same order, each block
 * computed by the same calls.
 *
 * Determinism: blocks are fixed by Tq and Tk alone (never by the thread
 * count), every sum runs in block order, BLAS is single-threaded inside a
 * task: the same bits for any KILN_THREADS, and for the JIT on or off,
 * which both run this kernel. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "gemm_bf16.h"
#include "half.h"
#include "kernels.h"
#include "pool.h"
#include "state.h"

enum { ATT_BQ = 128, ATT_BK = 512, ATT_LANES = 16, ATT_SPARES = 64 };

/* the row loops as vector code on AVX2 machines too (their sums are
   lane-order folds, the same on every thread; a machine runs one clone) */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define ATT_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define ATT_CLONES
#endif

/* an operand's strides, in elements: over the batch dims, then rows, cols */
typedef struct {
  const char *base;
  int64_t b[KILN_MAX_DIMS], r, c;
  bool round; /* read rounded to bf16 (attr.dtype KILN_BF16: q, k, v) */
} att_operand;

typedef struct {
  bool grad, causal, has_mask, mask_bool;
  bool bf16; /* the forward of bf16 values on AMX tiles (forward_range_bf16) */
  int nb;    /* batch dims */
  int64_t bshape[KILN_MAX_DIMS];
  int64_t nbatch, tq, tk, d, dv, qblocks, kblocks;
  double scale;
  kiln_dtype dt;
  att_operand q, k, v, o, dout, mask;
  char *out;
  void *stats; /* the three-phase backward's m, l, D per query row */
  const vm_blas *blas;
  vm_row_fn exp_row; /* f32: the interpreter's exp */
  atomic_bool failed;
  atomic_uint_fast64_t gemms;
  /* the three-phase backward's scratch, handed from task to task (a task
     is a chunk: one malloc each would hold a block's scratch per task
     where freed memory is not reused at once, as under AddressSanitizer) */
  pthread_mutex_t lock;
  int nspare;
  void *spare[ATT_SPARES];
  size_t spare_bytes[ATT_SPARES];
} att_job;

/* scratch of at least `bytes` for one task (NULL: out of memory) */
static void *scratch_get(att_job *j, size_t bytes) {
  pthread_mutex_lock(&j->lock);
  void *p = NULL;
  if (j->nspare > 0) {
    j->nspare--;
    if (j->spare_bytes[j->nspare] >= bytes)
      p = j->spare[j->nspare];
    else
      free(j->spare[j->nspare]);
  }
  pthread_mutex_unlock(&j->lock);
  return p ? p : malloc(bytes);
}

static void scratch_put(att_job *j, void *p, size_t bytes) {
  pthread_mutex_lock(&j->lock);
  if (j->nspare < ATT_SPARES) {
    j->spare[j->nspare] = p;
    j->spare_bytes[j->nspare++] = bytes;
    p = NULL;
  }
  pthread_mutex_unlock(&j->lock);
  free(p);
}

static void operand_of(att_operand *o, const vm_tensor *t, int nb) {
  o->base = vm_data(t);
  for (int i = 0; i < nb; i++) o->b[i] = t->strides[i];
  o->r = t->strides[nb];
  o->c = t->strides[nb + 1];
}

/* the element offset of batch item bh (row-major over bshape) in o */
static int64_t batch_offset(const att_job *j, const att_operand *o, int64_t bh) {
  int64_t off = 0;
  for (int i = j->nb - 1; i >= 0; i--) {
    off += bh % j->bshape[i] * o->b[i];
    bh /= j->bshape[i];
  }
  return off;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* the keys query block i0 (rows long) reads: [0, kend) */
static int64_t keys_end(const att_job *j, int64_t i0, int64_t rows) {
  return j->causal ? min64(j->tk, i0 + rows) : j->tk;
}

#define ATT_T float
#define ATT_F32 1
#define ATT_FN(name) name##_f32
#define ATT_GEMM sgemm
#include "kern_attention_impl.h"
#undef ATT_T
#undef ATT_F32
#undef ATT_FN
#undef ATT_GEMM

#define ATT_T double
#define ATT_F32 0
#define ATT_FN(name) name##_f64
#define ATT_GEMM dgemm
#include "kern_attention_impl.h"
#undef ATT_T
#undef ATT_F32
#undef ATT_FN
#undef ATT_GEMM

/* --- bf16 products on AMX ---
   Attention of q, k, v rounded to bf16 (attr.dtype KILN_BF16: the op of
   bf16 operands or of f32 ones under bf16 autocast; every kernel here
   reads them rounded) runs its two products on AMX tiles
   where vm_gemm_bf16_amx(): S = Q Kᵀ with f32 sums (TDPBF16PS: k in
   tiles of 32, in order), the online softmax in f32 as forward_range_f32
   runs it, then P rounded to bf16 for acc += P V (f32 sums), as PyTorch's
   CPU flash attention does in bf16.  Operands are padded with zeros to
   multiples of 32 (rows, head sizes, keys); no padded key is read as a
   score.  Blocks are forward_range_f32's, so the bits depend on Tq and Tk
   alone, at any thread count and with the JIT on or off.  The backward
   (attention_grad) runs in f32: the gradient of attention of the bf16
   values, its probabilities not rounded. */
static int64_t up32(int64_t x) { return (x + 31) / 32 * 32; }

/* rows [row0, row0 + rows) of o's batch item bh, cols wide, as bf16 rows
   ld apart, prow of them (zeros past rows, and past cols) */
static void to_bf16(uint16_t *dst, int64_t ld, const att_job *j, const att_operand *o, int64_t bh,
                    int64_t row0, int64_t rows, int64_t prow, int64_t cols) {
  const float *src = (const float *)o->base + batch_offset(j, o, bh) + row0 * o->r;
  for (int64_t r = 0; r < prow; r++, dst += ld) {
    int64_t c = r < rows ? cols : 0;
    if (c && o->c == 1)
      vm_bf16_row(dst, src + r * o->r, cols);
    else
      for (int64_t e = 0; e < c; e++) dst[e] = vm_f32_to_bf16(src[r * o->r + e * o->c]);
    memset(dst + c, 0, (size_t)(ld - c) * sizeof *dst);
  }
}

static void *buffer(size_t elems, size_t size) {
  size_t bytes = (elems * size + 63) / 64 * 64;
  return aligned_alloc(64, bytes ? bytes : 64);
}

static bool forward_range_bf16(att_job *j, int64_t begin, int64_t end) {
  const int64_t BQ = min64(ATT_BQ, j->tq), BK = min64(ATT_BK, j->tk), d = j->d, dv = j->dv;
  const int64_t bqp = up32(BQ), bkp = up32(BK), dp = up32(d), dvp = up32(dv), tkp = up32(j->tk);
  uint16_t *Q16 = buffer((size_t)(bqp * dp), 2), *K16 = buffer((size_t)(tkp * dp), 2);
  uint16_t *V16 = buffer((size_t)(tkp * dvp), 2), *P16 = buffer((size_t)(bqp * bkp), 2);
  uint32_t *Kp = buffer((size_t)(tkp * dp / 2), 4), *Vp = buffer((size_t)(dvp * tkp / 2), 4);
  float *S = buffer((size_t)(bqp * bkp), 4), *acc = buffer((size_t)(bqp * dvp), 4);
  float *Pf = buffer((size_t)(bqp * bkp), 4), *st = buffer((size_t)(4 * BQ), 4);
  bool ok = Q16 && K16 && V16 && P16 && Kp && Vp && S && acc && Pf && st;
  float *m = st, *l = m + BQ, *mx = l + BQ, *alpha = mx + BQ;
  const int64_t kpanel = dp / 2 * 32, vpanel = tkp / 2 * 32; /* words per panel */
  for (int64_t task = begin, at = -1; ok && task < end; task++) {
    int64_t bh = task / j->qblocks, i0 = task % j->qblocks * BQ;
    int64_t rows = min64(BQ, j->tq - i0), rp = up32(rows), kend = keys_end(j, i0, rows);
    if (at != bh) {
      to_bf16(K16, dp, j, &j->k, bh, 0, j->tk, tkp, d);
      to_bf16(V16, dvp, j, &j->v, bh, 0, j->tk, tkp, dv);
      vm_bf16_panels(Kp, K16, dp, true, tkp, dp);    /* op(B) = Kᵀ: d x keys */
      vm_bf16_panels(Vp, V16, dvp, false, dvp, tkp); /* op(B) = V: keys x dv */
      at = bh;
    }
    to_bf16(Q16, dp, j, &j->q, bh, i0, rows, rp, d);
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, (size_t)(rp * dvp) * sizeof *acc);
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      int64_t cols = min64(BK, kend - j0), cp = up32(cols);
      vm_bf16_amx_f32(Q16, dp, rp, dp, Kp + j0 / 32 * kpanel, kpanel, cp, S, cp, false);
      scores_f32(j, S, cp, rows, cols, bh, i0, j0, mx);
      for (int64_t r = 0; r < rows; r++) { /* as online_block_f32 */
        float mnew = mx[r] > m[r] ? mx[r] : m[r];
        alpha[r] = m[r] == -INFINITY ? 0 : (float)exp(m[r] - mnew);
        m[r] = mnew;
        mx[r] = shift_of_f32(mnew);
      }
      exp_block_f32(j, Pf, S, cp, rows, cols, mx);
      memset(P16, 0, (size_t)(rp * cp) * sizeof *P16);
      for (int64_t r = 0; r < rows; r++) { /* the sums in f32; P rounded for P V */
        l[r] = l[r] * alpha[r] + row_sum_f32(Pf + r * cp, cols);
        vm_bf16_row(P16 + r * cp, Pf + r * cp, cols);
      }
      for (int64_t r = 0; j0 > 0 && r < rows; r++) /* the earlier blocks' terms shrink */
        if (alpha[r] != 1)
          for (int64_t c = 0; c < dv; c++) acc[r * dvp + c] *= alpha[r];
      vm_bf16_amx_f32(P16, cp, rp, cp, Vp + j0 / 2 * 32, vpanel, dvp, acc, dvp, true);
      atomic_fetch_add_explicit(&j->gemms, 2, memory_order_relaxed);
    }
    float *o = (float *)j->out + (bh * j->tq + i0) * dv;
    for (int64_t r = 0; r < rows; r++) {
      float inv = l[r] > 0 ? 1 / l[r] : 0; /* no key: 0 */
      for (int64_t c = 0; c < dv; c++) o[r * dv + c] = acc[r * dvp + c] * inv;
    }
  }
  free(Q16), free(K16), free(V16), free(P16), free(Kp), free(Vp);
  free(S), free(acc), free(Pf), free(st);
  return ok;
}

static void attention_range(void *p, int64_t begin, int64_t end) {
  att_job *j = p;
  bool ok = j->bf16 ? forward_range_bf16(j, begin, end)
            : j->dt == KILN_F32
                ? (j->grad ? backward_range_f32(j, begin, end) : forward_range_f32(j, begin, end))
                : (j->grad ? backward_range_f64(j, begin, end) : forward_range_f64(j, begin, end));
  if (!ok) atomic_store(&j->failed, true); /* read after the parallel call */
}

/* the three-phase backward's tasks, one a chunk, taken by whichever
   thread is free (a key block's task does a query block's work many times) */
static void stats_task(void *p, int64_t chunk, int64_t begin, int64_t end) {
  att_job *j = p;
  (void)chunk;
  if (!(j->dt == KILN_F32 ? stats_range_f32(j, begin, end) : stats_range_f64(j, begin, end)))
    atomic_store(&j->failed, true);
}

static void grads_task(void *p, int64_t chunk, int64_t begin, int64_t end) {
  att_job *j = p;
  (void)chunk;
  if (!(j->dt == KILN_F32 ? grads_range_f32(j, begin, end) : grads_range_f64(j, begin, end)))
    atomic_store(&j->failed, true);
}

/* the backward in three phases: when batch items alone leave threads idle
   (it computes the scores three times, not twice, so it must gain more
   than a third of the time: fewer items than threads, or one or two more)
   and there are blocks to spread.  Either way the same bits. */
static bool three_phase(const att_job *j) {
  int threads = vm_pool_threads();
  double rounds = (double)((j->nbatch + threads - 1) / threads);
  return threads > 1 && j->qblocks * j->kblocks >= 2 && (double)j->nbatch * 1.5 / threads < rounds;
}

/* args: attention (q, k, v [, mask]), attention_grad (q, k, v, o, do [, mask]) */
bool vm_k_attention(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *args,
                    const vm_attr *attr) {
  att_job j = {.grad = op == VM_OP_attention_grad, .causal = attr->keepdim};
  int nfixed = j.grad ? 5 : 3;
  const vm_tensor *q = args[0], *k = args[1], *v = args[2];
  j.has_mask = n > nfixed;
  j.nb = q->ndim - 2;
  j.nbatch = 1;
  for (int i = 0; i < j.nb; i++) j.nbatch *= j.bshape[i] = q->shape[i];
  j.tq = q->shape[j.nb], j.tk = k->shape[j.nb], j.d = q->shape[j.nb + 1];
  j.dv = v->shape[j.nb + 1];
  j.qblocks = (j.tq + ATT_BQ - 1) / ATT_BQ;
  j.kblocks = (j.tk + ATT_BK - 1) / ATT_BK;
  j.scale = attr->scalar[0];
  j.dt = out->dtype;
  j.out = vm_data(out);
  j.blas = vm_blas_get();
  if (j.dt == KILN_F32) j.exp_row = vm_math_row_f32(VM_OP_exp);
  operand_of(&j.q, q, j.nb);
  operand_of(&j.k, k, j.nb);
  operand_of(&j.v, v, j.nb);
  /* q, k, v rounded to bf16 first (attr.dtype KILN_BF16, ops.def): the
     forward's products on AMX tiles, where the CPU has them */
  j.q.round = j.k.round = j.v.round = attr->dtype == KILN_BF16 && j.dt == KILN_F32;
  j.bf16 = !j.grad && j.q.round && vm_gemm_bf16_amx();
  if (j.grad) {
    operand_of(&j.o, args[3], j.nb);
    operand_of(&j.dout, args[4], j.nb);
  }
  if (j.has_mask) {
    operand_of(&j.mask, args[nfixed], j.nb);
    j.mask_bool = args[nfixed]->dtype == KILN_BOOL;
  }
  atomic_init(&j.failed, false);
  atomic_init(&j.gemms, 0);
  if (!j.blas->loaded) {
    vm_error(KILN_ERR_INTERNAL, "%s", j.blas->error);
    return false;
  }
  if (j.tq > INT_MAX || j.tk > INT_MAX || j.d > INT_MAX || j.dv > INT_MAX) {
    vm_error(KILN_ERR_SHAPE, "attention dimensions %lld x %lld x %lld exceed BLAS's int range",
             (long long)j.tq, (long long)j.tk, (long long)(j.d > j.dv ? j.d : j.dv));
    return false;
  }
  if (out->numel == 0) return true;
  if (j.grad && three_phase(&j)) {
    size_t row_bytes = 3 * (j.dt == KILN_F32 ? sizeof(float) : sizeof(double));
    j.stats = malloc((size_t)(j.nbatch * j.tq) * row_bytes);
    if (!j.stats) {
      vm_error(KILN_ERR_OOM, "out of memory for attention's row statistics");
      return false;
    }
    int64_t stats = j.nbatch * j.qblocks, grads = j.nbatch * (j.kblocks + j.qblocks);
    pthread_mutex_init(&j.lock, NULL);
    vm_parallel_chunks(stats, stats, stats_task, &j);
    if (!atomic_load(&j.failed)) vm_parallel_chunks(grads, grads, grads_task, &j);
    for (int i = 0; i < j.nspare; i++) free(j.spare[i]);
    pthread_mutex_destroy(&j.lock);
    free(j.stats);
  } else {
    /* forward: a task per query block; backward: per batch item */
    int64_t tasks = j.grad ? j.nbatch : j.nbatch * j.qblocks;
    double work = (double)(j.grad ? j.tq : min64(j.tq, ATT_BQ)) * (double)j.tk *
                  (double)(j.d + j.dv) * (j.grad ? 3.0 : 1.0);
    vm_parallel_for(tasks, work >= (1 << 17) ? 1 : (int64_t)((1 << 17) / (work + 1)) + 1,
                    attention_range, &j);
  }
  atomic_fetch_add_explicit(&vm_process()->stats.blas_calls, atomic_load(&j.gemms),
                            memory_order_relaxed);
  if (atomic_load(&j.failed)) {
    vm_error(KILN_ERR_OOM, "out of memory for an attention block's scratch");
    return false;
  }
  return true;
}
