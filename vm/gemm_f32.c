/* gemm_f32.c — Kiln's own f32 GEMM for short products and for taller
 * ones of short K, on AVX2 and AVX-512 CPUs.
 *
 * A recurrent step multiplies a batch of states by the same weight in
 * every step: [32,128] x [128,512] forward and [32,512] x [512,128]
 * backward in an LSTM of hidden 128.  OpenBLAS (0.3.21) packs both
 * operands at every call, and at these shapes its packing is a third of
 * its time: on one thread of this Xeon its SkylakeX kernels took 34 and
 * 48 µs, its Haswell ones 48 and 53.  Here the right operand is packed
 * into panels (32 columns with AVX-512, 16 with AVX2), and a rolled loop
 * packs its fixed weights once for all its steps (vm_gemm_fixed_*): 21-22
 * µs each with AVX-512 (190 GFLOP/s), 35 with AVX2.
 *
 * The micro-kernel keeps an MR x panel block of C in registers for a
 * chunk of k (the next chunk's chains go on from the values it stored),
 * each element one chain of FMAs over k in order from +0; A is read in
 * place (a broadcast per row and k).  So an element's bits depend
 * on k and the values alone, never on m, n, the tile, the thread or the
 * ISA, and packed-once and packed-per-call products agree bit for bit.
 * Which products run here is a function of the shape and the CPU's ISA
 * alone (vm_gemm_f32_takes), so a product takes the same path in every
 * step, mode and thread count; on other CPUs OpenBLAS runs them all. */
#include "gemm_f32.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "state.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define V4_ATTR __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))
#define V3_ATTR __attribute__((target("avx2,fma")))
#endif

/* x86-64-v4: MR4 x 32 blocks in 16 zmm; x86-64-v3 (AVX2): MR3 x 16 in 12
   ymm.  Both compute every element as the same chain, so the two give the
   same bits. */
enum { MR4 = 8, NR4 = 32, MR3 = 6, NR3 = 16 };
/* k runs in chunks of KC: every panel and row block of one chunk, then the
   next, whose chains start from C where the last stopped (the same fmas in
   the same order); a chunk of A stays in cache for all the panels */
enum { KC = 512 };

/* the shapes it runs: products of at least 16 rows and 2^20 multiply-adds
   (two threads on this Xeon, best of 100-300, OpenBLAS SkylakeX -> Kiln):
 - short ones (C's rows 16-128: a batch of states, a few tokens), K to
   8192: 1.06-1.6x OpenBLAS's speed packing per call (more with the panels
   a loop keeps); below 16 rows or 2^20 multiply-adds OpenBLAS's
   small-matrix kernels ran products of B as it is 1.1-1.3x faster;
 - taller ones, K to 2048 (512 with AVX2) and one side at most 512: the
   kernel holds a block of C in registers for a chunk of K and streams
   A's rows once per panel of B.  [512,128]x[128,128] 57 -> 44 us,
   [512,128]x[128,512] 252 -> 168, [512,512]x[512,128]ᵀ 246 -> 188,
   [4096,384]x[384,384] 3.45 -> 3.04 ms, [4096,384]x[384,1536] 14.9 -> 12.7,
   [4096,1536]x[1536,384] 14.6 -> 13.6-14.5, [512,1024]x[1024,1024] 3.4 ->
   3.1; equal at K = 4096-8192, and where no side is short (1024^3 5.9-6.1
   -> 5.9-6.2 ms, [2048,768]x[768,768]).  AVX2 (OpenBLAS Haswell): faster to
   K = 512 ([512,128]x[128,128] 155 -> 71 us, [4096,512]x[512,512] 9.5 ->
   9.1 ms), 8-10% slower from K = 768;
 - A transposed (Xᵀ Y: a loop's weight gradient over its steps' rows) is
   read 8 floats a k, a row of X apart: short products on AVX-512 only
   ([128,704]ᵀ x [704,384] 253 -> 223 us, [32,704]ᵀ 81 -> 65, [128,6400]ᵀ x
   [6400,512] 3.9 -> 3.6 ms, [128,8192]ᵀ x [8192,128] 1.22 -> 1.18); taller
   or on AVX2 it ran equal to 2x slower ([1024,512]ᵀ x [512,1024] 4.0 ->
   7.1 ms, [384,4096]ᵀ x [4096,1536] 18.4 -> 21.5).
   K runs in chunks of KC (above), so A's chunk stays in cache for every
   panel: without them [128,6400]ᵀ took 10.1 ms. */
#define TAKES_MIN_M 16
#define TAKES_SHORT_M 128 /* the short products: K to TAKES_MAX_K */
#define TAKES_MIN_N 64
#define TAKES_MIN_K 32
#define TAKES_MAX_K 8192
#define TAKES_TALL_K4 2048  /* taller ones: K to this on AVX-512 */
#define TAKES_TALL_K3 512   /* and to this on AVX2 */
#define TAKES_TALL_SIDE 512 /* with one side (M, N or K) at most this */
#define TAKES_MIN_WORK (1 << 20)

/* 4 (AVX-512), 3 (AVX2 + FMA), or 0: OpenBLAS runs every product */
static int level(void) {
#if defined(__x86_64__)
  static int lv = -1;
  if (lv < 0) {
    const char *isa = vm_cpu_isa();
    lv = vm_env_long("KILN_F32_GEMM", 1) == 0 ? 0
         : !strcmp(isa, "x86-64-v4")          ? 4
         : !strcmp(isa, "x86-64-v3")          ? 3
                                              : 0;
  }
  return lv;
#else
  return 0;
#endif
}

bool vm_gemm_f32_takes(int64_t M, int64_t N, int64_t K, bool ta) {
  int lv = level();
  bool tall = M > TAKES_SHORT_M;
  int64_t max_k = !tall ? TAKES_MAX_K : lv == 4 ? TAKES_TALL_K4 : TAKES_TALL_K3;
  if (tall && M > TAKES_TALL_SIDE && N > TAKES_TALL_SIDE && K > TAKES_TALL_SIDE) return false;
  if (ta && (tall || lv != 4)) return false;
  return lv > 0 && M >= TAKES_MIN_M && N >= TAKES_MIN_N && K >= TAKES_MIN_K && K <= max_k &&
         (double)M * (double)N * (double)K >= TAKES_MIN_WORK;
}

static int64_t panel_width(void) { return level() == 4 ? NR4 : NR3; }

size_t vm_f32_panels_size(int64_t n, int64_t k) {
  int64_t nr = panel_width();
  return (size_t)((n + nr - 1) / nr * nr) * (size_t)k;
}

#if defined(__x86_64__)

/* rows [p, k) of a panel of op(B) = Bᵀ (nr columns, the first w of
   them B's rows j0..), past the transposed blocks: one by one */
static void tail_rows(float *dst, int64_t nr, const float *B, int64_t ldb, int64_t j0, int64_t w,
                      int64_t p, int64_t k) {
  for (; p < k; p++)
    for (int64_t j = 0; j < nr; j++) dst[p * nr + j] = j < w ? B[(j0 + j) * ldb + p] : 0.0f;
}

/* --- x86-64-v4 --- */

/* rows r[0..15] (16 floats each) transposed: out[c] = column c */
V4_ATTR static inline void tr16x16(__m512 r[16]) {
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

static inline __mmask16 mask16(int64_t w) {
  return w >= 16 ? 0xFFFF : w <= 0 ? 0 : (__mmask16)((1u << w) - 1);
}

/* one panel: op(B)'s columns [j0, j0 + w), w <= 32, as [k][32] */
V4_ATTR static void panel4(float *dst, const float *B, int64_t ldb, bool tb, int64_t j0, int64_t w,
                           int64_t k) {
  if (!tb) { /* op(B)[p][j] = B[p * ldb + j]: rows of B, copied */
    for (int64_t p = 0; p < k; p++) {
      const float *s = B + p * ldb + j0;
      _mm512_store_ps(dst + p * NR4, _mm512_maskz_loadu_ps(mask16(w), s));
      _mm512_store_ps(dst + p * NR4 + 16, _mm512_maskz_loadu_ps(mask16(w - 16), s + 16));
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
      for (int i = 0; i < 16; i++) _mm512_store_ps(dst + (p + i) * NR4 + h * 16, r[i]);
    }
  tail_rows(dst, NR4, B, ldb, j0, w, p, k);
}

/* C's rows [0, mr) x one panel's w columns; mr a constant where inlined */
V4_ATTR static inline __attribute__((always_inline)) void blockV4(int mr, const float *A,
                                                                  int64_t rsa, int64_t csa,
                                                                  const float *P, int64_t k,
                                                                  float *C, int64_t ldc, int64_t w,
                                                                  bool acc) {
  __m512 c0[MR4], c1[MR4]; /* registers: the loops over r unroll (mr is a constant) */
  __mmask16 m0 = mask16(w), m1 = mask16(w - 16);
  if (acc) { /* the chains continue from C (a chunk of k before this one) */
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      c0[r] = _mm512_maskz_loadu_ps(m0, C + r * ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, C + r * ldc + 16);
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; p++) {
    __m512 b0 = _mm512_load_ps(P + p * NR4), b1 = _mm512_load_ps(P + p * NR4 + 16);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      __m512 a = _mm512_set1_ps(A[r * rsa + p * csa]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < mr; r++) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}

/* --- x86-64-v3 (AVX2) --- */

/* rows r[0..7] (8 floats each) transposed */
V3_ATTR static inline void tr8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; g++) {
    u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int x = 0; x < 4; x++) {
    r[x] = _mm256_permute2f128_ps(u[x], u[4 + x], 0x20);
    r[4 + x] = _mm256_permute2f128_ps(u[x], u[4 + x], 0x31);
  }
}

/* lanes [0, w) of 8 */
V3_ATTR static inline __m256i mask8(int64_t w) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w < 0 ? 0 : w > 8 ? 8 : w)), lane);
}

V3_ATTR static void panel3(float *dst, const float *B, int64_t ldb, bool tb, int64_t j0, int64_t w,
                           int64_t k) {
  if (!tb) {
    __m256i m0 = mask8(w), m1 = mask8(w - 8);
    for (int64_t p = 0; p < k; p++) {
      const float *s = B + p * ldb + j0;
      _mm256_store_ps(dst + p * NR3, w >= 8 ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, m0));
      _mm256_store_ps(dst + p * NR3 + 8,
                      w >= 16 ? _mm256_loadu_ps(s + 8) : _mm256_maskload_ps(s + 8, m1));
    }
    return;
  }
  int64_t p = 0;
  for (; p + 8 <= k; p += 8)
    for (int h = 0; h < 2; h++) {
      __m256 r[8];
      for (int i = 0; i < 8; i++) {
        int64_t j = h * 8 + i;
        r[i] = j < w ? _mm256_loadu_ps(B + (j0 + j) * ldb + p) : _mm256_setzero_ps();
      }
      tr8x8(r);
      for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (p + i) * NR3 + h * 8, r[i]);
    }
  tail_rows(dst, NR3, B, ldb, j0, w, p, k);
}

V3_ATTR static inline __attribute__((always_inline)) void blockV3(int mr, const float *A,
                                                                  int64_t rsa, int64_t csa,
                                                                  const float *P, int64_t k,
                                                                  float *C, int64_t ldc, int64_t w,
                                                                  bool acc) {
  __m256 c0[MR3], c1[MR3];
  if (acc) { /* the chains continue from C */
    __m256i m0 = mask8(w), m1 = mask8(w - 8);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      c0[r] = _mm256_maskload_ps(C + r * ldc, m0);
      c1[r] = _mm256_maskload_ps(C + r * ldc + 8, m1);
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < k; p++) {
    __m256 b0 = _mm256_load_ps(P + p * NR3), b1 = _mm256_load_ps(P + p * NR3 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      __m256 a = _mm256_broadcast_ss(A + r * rsa + p * csa);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  if (w == NR3) {
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
      _mm256_storeu_ps(C + r * ldc, c0[r]);
      _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
    }
    return;
  }
  __m256i m0 = mask8(w), m1 = mask8(w - 8);
#pragma GCC unroll 8
  for (int r = 0; r < mr; r++) {
    _mm256_maskstore_ps(C + r * ldc, m0, c0[r]);
    _mm256_maskstore_ps(C + r * ldc + 8, m1, c1[r]);
  }
}

/* A row-major (row r of the block at A + r * lda, its k-th at + k), or
   transposed (an operand Xᵀ: row r at A + r, its k-th at + k * lda); each
   a function with the block's rows a constant */
#define BLOCKS(V, R)                                                                             \
  V##_ATTR static void block##V##_##R(const float *A, int64_t lda, const float *P, int64_t k,    \
                                      float *C, int64_t ldc, int64_t w, bool acc) {              \
    block##V(R, A, lda, 1, P, k, C, ldc, w, acc);                                                \
  }                                                                                              \
  V##_ATTR static void block##V##_##R##t(const float *A, int64_t lda, const float *P, int64_t k, \
                                         float *C, int64_t ldc, int64_t w, bool acc) {           \
    block##V(R, A, 1, lda, P, k, C, ldc, w, acc);                                                \
  }
BLOCKS(V4, 1)
BLOCKS(V4, 2)
BLOCKS(V4, 3)
BLOCKS(V4, 4)
BLOCKS(V4, 5)
BLOCKS(V4, 6)
BLOCKS(V4, 7)
BLOCKS(V4, 8)
BLOCKS(V3, 1)
BLOCKS(V3, 2)
BLOCKS(V3, 3)
BLOCKS(V3, 4)
BLOCKS(V3, 5)
BLOCKS(V3, 6)
typedef void (*block_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t,
                         bool);
static const block_fn blocks4[2][MR4 + 1] = {
    {NULL, blockV4_1, blockV4_2, blockV4_3, blockV4_4, blockV4_5, blockV4_6, blockV4_7, blockV4_8},
    {NULL, blockV4_1t, blockV4_2t, blockV4_3t, blockV4_4t, blockV4_5t, blockV4_6t, blockV4_7t,
     blockV4_8t}};
static const block_fn blocks3[2][MR3 + 1] = {
    {NULL, blockV3_1, blockV3_2, blockV3_3, blockV3_4, blockV3_5, blockV3_6},
    {NULL, blockV3_1t, blockV3_2t, blockV3_3t, blockV3_4t, blockV3_5t, blockV3_6t}};

typedef void (*panel_fn)(float *, const float *, int64_t, bool, int64_t, int64_t, int64_t);

/* this CPU's panel packer (panel_width() columns) */
static panel_fn packer(void) { return level() == 4 ? panel4 : panel3; }

void vm_f32_panels(float *dst, const float *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  int64_t nr = panel_width();
  panel_fn pack = packer();
  for (int64_t j0 = 0; j0 < n; j0 += nr)
    pack(dst + j0 * k, B, ldb, tb, j0, n - j0 < nr ? n - j0 : nr, k);
}

bool vm_gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, const float *panels) {
  bool v4 = level() == 4;
  int64_t nr = panel_width(), mrmax = v4 ? MR4 : MR3, kc = k < KC ? k : KC;
  int64_t rsa = ta ? 1 : lda, csa = ta ? lda : 1; /* element (i, p) of op(A) */
  const block_fn *blocks = v4 ? blocks4[ta] : blocks3[ta];
  panel_fn pack = packer();
  float *mine = NULL;
  if (!panels) { /* one panel's chunk at a time, reused for every row block */
    mine = aligned_alloc(64, (size_t)kc * (size_t)nr * sizeof *mine);
    if (!mine) return false;
  }
  for (int64_t p0 = 0; p0 < k; p0 += KC) { /* the chains of C go on from chunk to chunk */
    int64_t kp = k - p0 < KC ? k - p0 : KC;
    const float *Bp = B + (tb ? p0 : p0 * ldb); /* op(B)'s rows from p0 */
    for (int64_t j0 = 0; j0 < n; j0 += nr) {    /* panel j0 / nr starts at j0 * k */
      int64_t w = n - j0 < nr ? n - j0 : nr;
      const float *P = panels ? panels + j0 * k + p0 * nr : mine;
      if (!panels) pack(mine, Bp, ldb, tb, j0, w, kp);
      for (int64_t i = 0; i < m; i += mrmax) {
        int64_t mr = m - i < mrmax ? m - i : mrmax;
        blocks[mr](A + i * rsa + p0 * csa, lda, P, kp, C + i * ldc + j0, ldc, w, p0 > 0);
      }
    }
  }
  free(mine);
  return true;
}

#else

void vm_f32_panels(float *dst, const float *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  (void)dst, (void)B, (void)ldb, (void)tb, (void)n, (void)k;
}

bool vm_gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, const float *panels) {
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)A, (void)lda, (void)B, (void)ldb, (void)C,
      (void)ldc, (void)panels;
  return false; /* never taken: level() is 0 */
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
