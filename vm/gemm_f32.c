/* gemm_f32.c — Kiln's own f32 GEMM for short products, on AVX-512 CPUs.
 *
 * A recurrent step multiplies a batch of states by the same weight in
 * every step: [32,128] x [128,512] forward and [32,512] x [512,128]
 * backward in an LSTM of hidden 128.  OpenBLAS (0.3.21, SkylakeX) packs
 * both operands at every call, and at these shapes its packing is a
 * third of its time: the forward product took 34 µs on one thread of
 * this Xeon, the backward one 48 µs.  Here the right operand is packed
 * into panels of 32 columns, and a rolled loop packs its fixed weights
 * once for all its steps (vm_gemm_fixed_*): 22 µs each, 190 GFLOP/s.
 *
 * The micro-kernel keeps an MR x 32 block of C in 2 MR zmm accumulators
 * for the whole k, each element one chain of FMAs over k in order from
 * +0; A is read in place (a broadcast per row and k).  So an element's
 * bits depend on k and the values alone, never on m, n, the tile or the
 * thread, and packed-once and packed-per-call products agree bit for bit.
 * Which products run here is a function of the shape alone
 * (vm_gemm_f32_takes), so a product takes the same path in every step,
 * mode and thread count; on other CPUs OpenBLAS runs them all. */
#include "gemm_f32.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "state.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define F32_ATTR __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))
#endif

enum { MR = 8, NR = 32 };

/* the shapes it runs: short products (C's rows 16-128: a batch of states,
   a few tokens) of some width and depth, where it ran 1.1-1.4x OpenBLAS's
   speed packing per call on this Xeon (more with the panels a loop keeps);
   below 16 rows OpenBLAS's small-matrix kernels win */
#define TAKES_MIN_M 16
#define TAKES_MAX_M 128
#define TAKES_MIN_N 64
#define TAKES_MIN_K 32
#define TAKES_MAX_K 8192
#define TAKES_MIN_WORK (1 << 18)

static bool available(void) {
#if defined(__x86_64__)
  static int avail = -1;
  if (avail < 0) avail = !strcmp(vm_cpu_isa(), "x86-64-v4") && vm_env_long("KILN_F32_GEMM", 1) != 0;
  return avail;
#else
  return false;
#endif
}

bool vm_gemm_f32_takes(int64_t M, int64_t N, int64_t K, bool ta) {
  return !ta && M >= TAKES_MIN_M && M <= TAKES_MAX_M && N >= TAKES_MIN_N && K >= TAKES_MIN_K &&
         K <= TAKES_MAX_K && (double)M * (double)N * (double)K >= TAKES_MIN_WORK && available();
}

size_t vm_f32_panels_size(int64_t n, int64_t k) {
  return (size_t)((n + NR - 1) / NR) * NR * (size_t)k;
}

#if defined(__x86_64__)

/* rows r[0..15] (16 floats each) transposed: out[c] = column c */
F32_ATTR static inline void tr16x16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* u[4g + x], 128-bit lane L: column 4L + x of rows 4g .. 4g+3 */
  for (int g = 0; g < 4; g++) {
    __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]),
            c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int x = 0; x < 4; x++) {
    __m512 p = _mm512_shuffle_f32x4(u[x], u[4 + x], 0x88),
           q = _mm512_shuffle_f32x4(u[x], u[4 + x], 0xDD),
           p2 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0x88),
           q2 = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0xDD);
    r[x] = _mm512_shuffle_f32x4(p, p2, 0x88);
    r[8 + x] = _mm512_shuffle_f32x4(p, p2, 0xDD);
    r[4 + x] = _mm512_shuffle_f32x4(q, q2, 0x88);
    r[12 + x] = _mm512_shuffle_f32x4(q, q2, 0xDD);
  }
}

/* one panel: op(B)'s columns [j0, j0 + w), w <= 32, as [k][32] */
F32_ATTR static void panel(float *dst, const float *B, int64_t ldb, bool tb, int64_t j0, int64_t w,
                           int64_t k) {
  if (!tb) { /* op(B)[p][j] = B[p * ldb + j]: rows of B, copied */
    for (int64_t p = 0; p < k; p++) {
      float *d = dst + p * NR;
      const float *s = B + p * ldb + j0;
      if (w == NR) {
        _mm512_store_ps(d, _mm512_loadu_ps(s));
        _mm512_store_ps(d + 16, _mm512_loadu_ps(s + 16));
      } else {
        __mmask16 m0 = w >= 16 ? 0xFFFF : (__mmask16)((1u << w) - 1),
                  m1 = w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
        _mm512_store_ps(d, _mm512_maskz_loadu_ps(m0, s));
        _mm512_store_ps(d + 16, _mm512_maskz_loadu_ps(m1, s + 16));
      }
    }
    return;
  }
  /* op(B)[p][j] = B[j * ldb + p]: 16 x 16 blocks of B's rows transposed */
  int64_t p = 0;
  for (; p + 16 <= k; p += 16)
    for (int h = 0; h < 2; h++) {
      __m512 r[16];
      for (int i = 0; i < 16; i++) {
        int64_t j = h * 16 + i;
        r[i] = j < w ? _mm512_loadu_ps(B + (j0 + j) * ldb + p) : _mm512_setzero_ps();
      }
      tr16x16(r);
      for (int i = 0; i < 16; i++) _mm512_store_ps(dst + (p + i) * NR + h * 16, r[i]);
    }
  for (; p < k; p++)
    for (int64_t j = 0; j < NR; j++) dst[p * NR + j] = j < w ? B[(j0 + j) * ldb + p] : 0.0f;
}

void vm_f32_panels(float *dst, const float *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  for (int64_t j0 = 0, p = 0; j0 < n; j0 += NR, p++)
    panel(dst + p * k * NR, B, ldb, tb, j0, n - j0 < NR ? n - j0 : NR, k);
}

/* C's rows [0, mr) x one panel's w columns; mr a constant where inlined */
F32_ATTR static inline __attribute__((always_inline)) void block(int mr, const float *A,
                                                                 int64_t lda, const float *P,
                                                                 int64_t k, float *C, int64_t ldc,
                                                                 int64_t w) {
  __m512 c0[MR], c1[MR]; /* registers: the loops over r unroll (mr is a constant) */
#pragma GCC unroll 8
  for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; p++) {
    __m512 b0 = _mm512_load_ps(P + p * NR), b1 = _mm512_load_ps(P + p * NR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      __m512 a = _mm512_set1_ps(A[r * lda + p]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
  if (w == NR) {
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      _mm512_storeu_ps(C + r * ldc, c0[r]);
      _mm512_storeu_ps(C + r * ldc + 16, c1[r]);
    }
    return;
  }
  __mmask16 m0 = w >= 16 ? 0xFFFF : (__mmask16)((1u << w) - 1),
            m1 = w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < mr; r++) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}

#define BLOCK(R)                                                                                  \
  F32_ATTR static void block##R(const float *A, int64_t lda, const float *P, int64_t k, float *C, \
                                int64_t ldc, int64_t w) {                                         \
    block(R, A, lda, P, k, C, ldc, w);                                                            \
  }
BLOCK(1)
BLOCK(2)
BLOCK(3)
BLOCK(4)
BLOCK(5)
BLOCK(6)
BLOCK(7)
BLOCK(8)
typedef void (*block_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t);
static const block_fn blocks[MR + 1] = {NULL,   block1, block2, block3, block4,
                                        block5, block6, block7, block8};

bool vm_gemm_f32(bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, const float *panels) {
  float *mine = NULL;
  if (!panels) { /* one panel at a time, reused for every row block */
    mine = aligned_alloc(64, (size_t)k * NR * sizeof *mine);
    if (!mine) return false;
  }
  for (int64_t j0 = 0, p = 0; j0 < n; j0 += NR, p++) {
    int64_t w = n - j0 < NR ? n - j0 : NR;
    const float *P = panels ? panels + p * k * NR : mine;
    if (!panels) panel(mine, B, ldb, tb, j0, w, k);
    for (int64_t i = 0; i < m; i += MR) {
      int64_t mr = m - i < MR ? m - i : MR;
      blocks[mr](A + i * lda, lda, P, k, C + i * ldc + j0, ldc, w);
    }
  }
  free(mine);
  return true;
}

#else

void vm_f32_panels(float *dst, const float *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  (void)dst, (void)B, (void)ldb, (void)tb, (void)n, (void)k;
}

bool vm_gemm_f32(bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, const float *panels) {
  (void)tb, (void)m, (void)n, (void)k, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc,
      (void)panels;
  return false; /* never taken: available() is false */
}

#endif

/* --- operands fixed while a loop runs --- */

/* at most this many bytes of panels a loop keeps (a bigger weight is
   packed per call, as by OpenBLAS) */
#define FIXED_MAX_BYTES ((size_t)16 << 20)

typedef struct {
  const struct vm_storage *s;
  const float *B;
  int64_t ldb, n, k;
  bool tb;
  float *panels;
} packed;

static __thread struct {
  const struct vm_storage **fixed;
  int nfixed, capfixed;
  packed *packs;
  int npacks, cappacks;
  int frames[16][2]; /* nfixed, npacks at each begin */
  int depth;         /* frames begun (past 16: nothing kept) */
} reg;

void vm_gemm_fixed_begin(void) {
  if (reg.depth < 16) {
    reg.frames[reg.depth][0] = reg.nfixed;
    reg.frames[reg.depth][1] = reg.npacks;
  }
  reg.depth++;
}

void vm_gemm_fixed_add(const struct vm_storage *s) {
  if (!s || reg.depth == 0 || reg.depth > 16) return;
  for (int i = 0; i < reg.nfixed; i++)
    if (reg.fixed[i] == s) return;
  if (reg.nfixed == reg.capfixed) {
    int cap = reg.capfixed ? 2 * reg.capfixed : 16;
    const struct vm_storage **grown = realloc(reg.fixed, (size_t)cap * sizeof *grown);
    if (!grown) return; /* not fixed: packed per call */
    reg.fixed = grown;
    reg.capfixed = cap;
  }
  reg.fixed[reg.nfixed++] = s;
}

void vm_gemm_fixed_end(void) {
  if (reg.depth == 0) return;
  reg.depth--;
  if (reg.depth >= 16) return;
  int nfixed = reg.frames[reg.depth][0], npacks = reg.frames[reg.depth][1];
  for (int i = npacks; i < reg.npacks; i++) free(reg.packs[i].panels);
  reg.nfixed = nfixed;
  reg.npacks = npacks;
  if (reg.depth == 0) { /* the outermost loop is over: nothing held */
    free(reg.fixed);
    free(reg.packs);
    memset(&reg, 0, sizeof reg);
  }
}

const float *vm_gemm_fixed_panels(const struct vm_storage *s, const float *B, int64_t ldb, bool tb,
                                  int64_t n, int64_t k) {
  if (reg.depth == 0 || reg.depth > 16 || !s) return NULL;
  bool fixed = false;
  for (int i = 0; i < reg.nfixed && !fixed; i++) fixed = reg.fixed[i] == s;
  if (!fixed) return NULL;
  for (int i = 0; i < reg.npacks; i++) {
    const packed *q = &reg.packs[i];
    if (q->s == s && q->B == B && q->ldb == ldb && q->tb == tb && q->n == n && q->k == k) {
      atomic_fetch_add_explicit(&vm_process()->stats.loop_pack_reads, 1, memory_order_relaxed);
      return q->panels;
    }
  }
  size_t bytes = vm_f32_panels_size(n, k) * sizeof(float);
  if (bytes > FIXED_MAX_BYTES) return NULL;
  if (reg.npacks == reg.cappacks) {
    int cap = reg.cappacks ? 2 * reg.cappacks : 8;
    packed *grown = realloc(reg.packs, (size_t)cap * sizeof *grown);
    if (!grown) return NULL;
    reg.packs = grown;
    reg.cappacks = cap;
  }
  float *panels = aligned_alloc(64, bytes);
  if (!panels) return NULL;
  vm_f32_panels(panels, B, ldb, tb, n, k);
  atomic_fetch_add_explicit(&vm_process()->stats.loop_packs, 1, memory_order_relaxed);
  reg.packs[reg.npacks++] = (packed){s, B, ldb, n, k, tb, panels};
  return panels;
}
