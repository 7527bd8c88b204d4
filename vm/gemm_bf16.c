/* gemm_bf16.c — a bf16 GEMM on CPUs with AVX512-BF16 (vdpbf16ps: two bf16
 * products added into each f32 lane per instruction, twice the
 * multiply-adds of an f32 FMA).  OpenBLAS 0.3.21 has no sbgemm, and
 * widening both operands to f32 for sgemm ran W6h at 0.9x of f32's
 * GFLOP/s; PyTorch's oneDNN runs bf16 GEMMs on these instructions.
 *
 * C (m x n, bf16, row-major, ldc) = op(A) op(B), A m x k and B k x n after
 * op (a transpose when ta / tb), row-major with lda / ldb.  Each element of
 * C is one f32 sum over k in pairs (k, k+1), in order, rounded once to
 * bf16 by vm/half.h's rounding: its bits depend on k and the values alone,
 * never on m, n, the tile it is computed in or the thread, so the kernel
 * pool's tiles (vm/kern_matmul.c) give the same bits at any thread count.
 * The instruction flushes subnormal inputs and products to zero (Intel SDM
 * VDPBF16PS: DAZ and FTZ, round to nearest even), as oneDNN's bf16 GEMMs do.
 *
 * Blocking: the operands are packed once per call into pairs (32-bit
 * words, a zero pair padding an odd k): op(B) in panels of NR = 32 columns
 * [k/2][32], op(A) in panels of MR rows [k/2][MR].  The micro-kernel
 * keeps an MR x 32 block of C in 2 MR zmm accumulators for the whole k.
 * On CPUs with AMX the product runs on tiles instead (below). */
#include "gemm_bf16.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "state.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BF16_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AMX_ATTR __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

enum { MR = 12, NR = 32 };

bool vm_gemm_bf16_available(void) {
#if defined(__x86_64__)
  static int avail = -1;
  if (avail < 0) {
    __builtin_cpu_init();
    /* KILN_CPU_ISA below v4 turns it off with the rest of AVX-512 */
    avail = __builtin_cpu_supports("avx512bf16") && !strcmp(vm_cpu_isa(), "x86-64-v4") &&
            vm_env_long("KILN_BF16_GEMM", 1) != 0;
  }
  return avail;
#else
  return false;
#endif
}

#if defined(__x86_64__)

static inline uint16_t at_a(const uint16_t *A, int64_t lda, bool ta, int64_t i, int64_t p) {
  return ta ? A[p * lda + i] : A[i * lda + p];
}
static inline uint16_t at_b(const uint16_t *B, int64_t ldb, bool tb, int64_t p, int64_t j) {
  return tb ? B[j * ldb + p] : B[p * ldb + j];
}

/* op(A)'s rows i0.. i0+MR as [pairs][MR] words (rows past m and the k
   past the last are zeros) */
static void pack_a(uint32_t *dst, const uint16_t *A, int64_t lda, bool ta, int64_t m, int64_t k,
                   int64_t i0) {
  int64_t pairs = (k + 1) / 2, q0 = 0;
  if (ta && i0 + MR <= m) { /* op(A)'s rows are A's columns: two rows of A interleaved */
    for (; q0 < k / 2; q0++) {
      const uint16_t *lo = A + 2 * q0 * lda + i0, *hi = lo + lda;
      for (int r = 0; r < MR; r++) dst[q0 * MR + r] = (uint32_t)lo[r] | (uint32_t)hi[r] << 16;
    }
  }
  for (int64_t r = 0; r < MR; r++) {
    int64_t i = i0 + r, q = q0;
    if (!ta && i < m) /* a row's pairs are adjacent: 32-bit words as they lie */
      for (; q < k / 2; q++) memcpy(&dst[q * MR + r], A + i * lda + 2 * q, 4);
    for (; q < pairs; q++) {
      uint32_t lo = i < m ? at_a(A, lda, ta, i, 2 * q) : 0;
      uint32_t hi = i < m && 2 * q + 1 < k ? at_a(A, lda, ta, i, 2 * q + 1) : 0;
      dst[q * MR + r] = lo | hi << 16;
    }
  }
}

/* Transposes of 32-bit words (a pair of bf16 is one word), 16 x 16 at a
   time in registers: word-wise copies to and from 16 rows apart ran the
   transposed operands of W18h's training step at an eighth of its time.
   tr16: rows r[0..16) of 16 words; column i is stored at dst + i * ld. */
BF16_ATTR static inline void tr16(__m512i r[16], uint32_t *dst, int64_t ld) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  /* u[4g + j]'s 128-bit lane L: column 4L + j of rows 4g .. 4g + 3 */
  for (int j = 0; j < 4; j++) {
    __m512i a = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    __m512i b = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    __m512i c = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    __m512i d = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    _mm512_storeu_si512(dst + j * ld, _mm512_shuffle_i32x4(a, c, 0x88));
    _mm512_storeu_si512(dst + (4 + j) * ld, _mm512_shuffle_i32x4(b, d, 0x88));
    _mm512_storeu_si512(dst + (8 + j) * ld, _mm512_shuffle_i32x4(a, c, 0xdd));
    _mm512_storeu_si512(dst + (12 + j) * ld, _mm512_shuffle_i32x4(b, d, 0xdd));
  }
}

/* op(B)'s columns j0.. j0+NR as [pairs][NR] words (vm_gemm_bf16 runs only
   where AVX512-BF16 is, so AVX-512 is) */
BF16_ATTR static void pack_b(uint32_t *dst, const uint16_t *B, int64_t ldb, bool tb, int64_t n,
                             int64_t k, int64_t j0) {
  int64_t pairs = (k + 1) / 2, q = 0;
  if (!tb && j0 + NR <= n) { /* two rows of 32 columns, interleaved (GCC vectorizes it) */
    for (; q < k / 2; q++) {
      const uint16_t *lo = B + 2 * q * ldb + j0, *hi = lo + ldb;
      for (int c = 0; c < NR; c++) dst[q * NR + c] = (uint32_t)lo[c] | (uint32_t)hi[c] << 16;
    }
  } else if (tb && j0 + NR <= n) { /* op(B)'s columns are B's rows: their pairs are words */
    int64_t w0 = 0;
    for (; w0 + 16 <= k / 2; w0 += 16) /* 16 rows of 16 words, transposed */
      for (int c0 = 0; c0 < NR; c0 += 16) {
        __m512i r[16];
        for (int c = 0; c < 16; c++) r[c] = _mm512_loadu_si512(B + (j0 + c0 + c) * ldb + 2 * w0);
        tr16(r, dst + w0 * NR + c0, NR);
      }
    for (int c = 0; c < NR; c++) {
      const uint16_t *row = B + (j0 + c) * ldb;
      for (int64_t w = w0; w < k / 2; w++) memcpy(&dst[w * NR + c], row + 2 * w, 4);
    }
    q = k / 2;
  }
  for (; q < pairs; q++)
    for (int64_t c = 0; c < NR; c++) {
      int64_t j = j0 + c;
      uint32_t lo = j < n ? at_b(B, ldb, tb, 2 * q, j) : 0;
      uint32_t hi = j < n && 2 * q + 1 < k ? at_b(B, ldb, tb, 2 * q + 1, j) : 0;
      dst[q * NR + c] = lo | hi << 16;
    }
}

/* 16 sums rounded to bf16 as vm_f32_to_bf16 does (nearest even; a NaN
   quieted, its sign and top payload kept), the first `cols` stored */
BF16_ATTR static inline void store_bf16(uint16_t *dst, __m512 sums, int cols) {
  const __m512i u = _mm512_castps_si512(sums);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
  _mm256_mask_storeu_epi16(dst, (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1), h);
}

/* the MR x NR block of C at C (rows x cols of it, ldc): the sums over k,
   rounded to bf16 once */
BF16_ATTR static void micro(const uint32_t *ap, const uint32_t *bp, int64_t pairs, uint16_t *C,
                            int64_t ldc, int64_t rows, int64_t cols) {
  __m512 c[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; q++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * NR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + q * NR + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[q * MR + r]);
      c[r][0] = _mm512_dpbf16_ps(c[r][0], a, b0);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], a, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) {
    if (r >= rows) break;
    store_bf16(C + r * ldc, c[r][0], (int)cols);
    if (cols > 16) store_bf16(C + r * ldc + 16, c[r][1], (int)cols - 16);
  }
}

/* --- AMX (Intel Sapphire Rapids and later) ---
   TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a 32 x 16 tile of B
   (stored as 16 rows of 16 pairs: the pack_b layout) into a 16 x 16 tile
   of f32 sums: 16 times the multiply-adds of vdpbf16ps per instruction
   (W6h, 1024^3 on two threads: 10 ms with vdpbf16ps, 0.7x f32 sgemm's
   speed; 1.5 ms on AMX).  op(A)'s rows are read in place where they hold
   whole tiles, else packed to rows of k padded to whole tiles (zeros);
   op(B) is packed to 32-column panels of whole tiles of pairs;
   each 32 x 32 block of C is four tiles summed over k in tiles of 32, in
   order, stored once, rounded to bf16 by store_bf16.  An element's sum
   is the same whatever block, tile or thread computes it; its bits are
   TDPBF16PS's (DAZ/FTZ, as vdpbf16ps), not vdpbf16ps's order. */
enum { AMX_K = 32, AMX_BLOCK = 32 };

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static bool amx_ok;

static void amx_init(void) {
  unsigned a, b, c, d;
  /* CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; Linux lends the
     tile state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM,
     XFEATURE_XTILEDATA), once for all its threads */
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return;
  if (vm_env_long("KILN_AMX", 1) == 0) return;
  amx_ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

static bool amx_available(void) {
  pthread_once(&amx_once, amx_init);
  return amx_ok;
}

/* every tile 16 rows of 64 bytes: 0-3 a 32 x 32 block of sums, 4-5 A's
   two 16-row halves, 6-7 the panel's two 16-column halves */
AMX_ATTR static void amx_configure(void) {
  amx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

/* tiles 0-3 += A's rows (a0: the first 16, a1: the next 16, stride bytes
   apart) times the panel's 32 columns, over k in tiles of 32, in order */
AMX_ATTR static inline void amx_block(const uint16_t *a0, const uint16_t *a1, int64_t stride,
                                      const uint32_t *panel, int64_t kp) {
  for (int64_t k0 = 0; k0 < kp; k0 += AMX_K) {
    _tile_loadd(4, a0 + k0, stride);
    _tile_loadd(5, a1 + k0, stride);
    _tile_loadd(6, panel + (k0 / 2) * NR, NR * 4);
    _tile_loadd(7, panel + (k0 / 2) * NR + 16, NR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

/* op(A)'s rows i0 .. i0 + rows as rows of kp bf16 (zeros past m and k).
   A transposed (a weight gradient's Xᵀ dY) is read in blocks of
   AMX_PACK_K of its rows: each block's lines stay cached while every
   packed row takes its AMX_PACK_K values from them (one value per line,
   row by row, re-read each line from memory for every packed row: W18h's
   training step spent an eighth of its time here). */
enum { AMX_PACK_K = 32 };

BF16_ATTR static void amx_pack_a(uint16_t *dst, const uint16_t *A, int64_t lda, bool ta, int64_t m,
                                 int64_t k, int64_t i0, int64_t rows, int64_t kp) {
  int64_t live = m - i0 < rows ? (m - i0 > 0 ? m - i0 : 0) : rows; /* rows of op(A) here */
  for (int64_t r = 0; r < rows; r++) {
    uint16_t *row = dst + r * kp;
    int64_t have = r < live ? k : 0;
    if (r < live && !ta) memcpy(row, A + (i0 + r) * lda, (size_t)k * sizeof *row);
    memset(row + have, 0, (size_t)(kp - have) * sizeof *row);
  }
  if (!ta) return;
  /* 16 packed rows x 32 of k at a time: rows 2w and 2w + 1 of A
     interleaved into words (16 of its columns), the 16 x 16 words
     transposed; the rest value by value */
  int64_t rv = live / 16 * 16, pv = k / 32 * 32;
  for (int64_t r0 = 0; r0 < rv; r0 += 16)
    for (int64_t p0 = 0; p0 < pv; p0 += 32) {
      __m512i w[16];
      for (int q = 0; q < 16; q++) {
        const uint16_t *lo = A + (p0 + 2 * q) * lda + i0 + r0;
        __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)lo));
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(lo + lda)));
        w[q] = _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
      }
      tr16(w, (uint32_t *)(dst + r0 * kp + p0), kp / 2);
    }
  for (int64_t p0 = 0; p0 < k; p0 += AMX_PACK_K) {
    int64_t p1 = p0 + AMX_PACK_K < k ? p0 + AMX_PACK_K : k;
    for (int64_t r = p1 <= pv ? rv : 0; r < live; r++) {
      uint16_t *row = dst + r * kp;
      const uint16_t *col = A + i0 + r;
      for (int64_t p = p0; p < p1; p++) row[p] = col[p * lda];
    }
  }
}

/* C = op(A) op(B) over the packed panels of op(B): op(A)'s 32-row blocks
   read from A itself where its rows hold whole tiles (A not transposed, k
   a multiple of 32: a linear layer's input, attention's q and p), else
   from ap (every block packed, or only the last when it has fewer rows) */
AMX_ATTR static void amx_gemm(const uint16_t *A, int64_t lda, bool direct, const uint16_t *ap,
                              const uint32_t *bp, int64_t m, int64_t n, int64_t mp, int64_t np,
                              int64_t kp, uint16_t *C, int64_t ldc) {
  amx_configure();
  float out[AMX_BLOCK * AMX_BLOCK] __attribute__((aligned(64)));
  int64_t pairs = kp / 2;
  for (int64_t j0 = 0; j0 < np; j0 += AMX_BLOCK) {
    const uint32_t *panel = bp + (j0 / NR) * pairs * NR;
    for (int64_t i0 = 0; i0 < mp; i0 += AMX_BLOCK) {
      bool whole = direct && i0 + AMX_BLOCK <= m;
      const uint16_t *a0 = whole ? A + i0 * lda : ap + (direct ? 0 : i0 * kp);
      int64_t stride = whole ? lda * 2 : kp * 2;
      const uint16_t *a1 = a0 + 16 * (stride / 2);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      amx_block(a0, a1, stride, panel, kp);
      _tile_stored(0, out, AMX_BLOCK * 4);
      _tile_stored(1, out + 16, AMX_BLOCK * 4);
      _tile_stored(2, out + 16 * AMX_BLOCK, AMX_BLOCK * 4);
      _tile_stored(3, out + 16 * AMX_BLOCK + 16, AMX_BLOCK * 4);
      int64_t cols = n - j0 < AMX_BLOCK ? n - j0 : AMX_BLOCK;
      for (int64_t r = 0; r < AMX_BLOCK && i0 + r < m; r++) {
        uint16_t *dst = C + (i0 + r) * ldc + j0;
        store_bf16(dst, _mm512_load_ps(out + r * AMX_BLOCK), (int)cols);
        if (cols > 16)
          store_bf16(dst + 16, _mm512_load_ps(out + r * AMX_BLOCK + 16), (int)cols - 16);
      }
    }
  }
  _tile_release();
}

/* op(B)'s panels of NR columns (n padded to NR with zero columns), each
   `pairs` words long (zero pairs past k) */
static void panels(uint32_t *dst, const uint16_t *B, int64_t ldb, bool tb, int64_t n, int64_t k,
                   int64_t pairs) {
  int64_t packed = (k + 1) / 2;
  for (int64_t j0 = 0; j0 < n; j0 += NR) {
    uint32_t *panel = dst + (j0 / NR) * pairs * NR;
    pack_b(panel, B, ldb, tb, n, k, j0);
    memset(panel + packed * NR, 0, (size_t)((pairs - packed) * NR) * sizeof *panel);
  }
}

static bool gemm_amx(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t *A,
                     int64_t lda, const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
  int64_t kp = (k + AMX_K - 1) / AMX_K * AMX_K, mp = (m + AMX_BLOCK - 1) / AMX_BLOCK * AMX_BLOCK,
          np = (n + NR - 1) / NR * NR, pairs = kp / 2;
  bool direct = !ta && k == kp;
  int64_t packed_rows = direct ? (m % AMX_BLOCK ? AMX_BLOCK : 0) : mp;
  uint16_t *ap = packed_rows ? aligned_alloc(64, (size_t)(packed_rows * kp) * sizeof *ap) : NULL;
  uint32_t *bp = aligned_alloc(64, (size_t)(np * pairs) * sizeof *bp);
  if ((packed_rows && !ap) || !bp) {
    free(ap);
    free(bp);
    return false;
  }
  if (packed_rows)
    amx_pack_a(ap, A, lda, ta, m, k, direct ? m / AMX_BLOCK * AMX_BLOCK : 0, packed_rows, kp);
  panels(bp, B, ldb, tb, n, k, pairs); /* padded to whole tiles of pairs */
  amx_gemm(A, lda, direct, ap, bp, m, n, mp, np, kp, C, ldc);
  free(ap);
  free(bp);
  return true;
}

bool vm_gemm_bf16_amx(void) { return vm_gemm_bf16_available() && amx_available(); }

BF16_ATTR void vm_bf16_row(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    int left = n - i < 16 ? (int)(n - i) : 16;
    __m512 x = _mm512_maskz_loadu_ps((__mmask16)(left == 16 ? 0xffff : (1u << left) - 1), src + i);
    store_bf16(dst + i, x, left);
  }
}

void vm_bf16_panels(uint32_t *dst, const uint16_t *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  panels(dst, B, ldb, tb, n, k, (k + 1) / 2);
}

AMX_ATTR void vm_bf16_amx_f32(const uint16_t *A, int64_t lda, int64_t mp, int64_t kp,
                              const uint32_t *bp, int64_t panel, int64_t np, float *C, int64_t ldc,
                              bool accumulate) {
  amx_configure();
  int64_t stride = lda * 2, cstride = ldc * 4;
  for (int64_t j0 = 0; j0 < np; j0 += AMX_BLOCK) {
    const uint32_t *pn = bp + (j0 / NR) * panel;
    for (int64_t i0 = 0; i0 < mp; i0 += AMX_BLOCK) {
      const uint16_t *a0 = A + i0 * lda, *a1 = a0 + 16 * lda;
      float *c0 = C + i0 * ldc + j0, *c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, cstride);
        _tile_loadd(1, c0 + 16, cstride);
        _tile_loadd(2, c1, cstride);
        _tile_loadd(3, c1 + 16, cstride);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      amx_block(a0, a1, stride, pn, kp);
      _tile_stored(0, c0, cstride);
      _tile_stored(1, c0 + 16, cstride);
      _tile_stored(2, c1, cstride);
      _tile_stored(3, c1 + 16, cstride);
    }
  }
  _tile_release();
}

bool vm_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
  if (amx_available()) return gemm_amx(ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
  int64_t pairs = (k + 1) / 2, panels = (m + MR - 1) / MR;
  uint32_t *ap = malloc((size_t)(panels * pairs * MR + 1) * sizeof *ap);
  uint32_t *bp = malloc((size_t)(pairs * NR + 1) * sizeof *bp);
  if (!ap || !bp) { /* the caller reports it (this may be a pool thread) */
    free(ap);
    free(bp);
    return false;
  }
  for (int64_t p = 0; p < panels; p++) pack_a(ap + p * pairs * MR, A, lda, ta, m, k, p * MR);
  for (int64_t j0 = 0; j0 < n; j0 += NR) {
    pack_b(bp, B, ldb, tb, n, k, j0);
    int64_t cols = n - j0 < NR ? n - j0 : NR;
    for (int64_t p = 0; p < panels; p++) {
      int64_t rows = m - p * MR < MR ? m - p * MR : MR;
      micro(ap + p * pairs * MR, bp, pairs, C + p * MR * ldc + j0, ldc, rows, cols);
    }
  }
  free(ap);
  free(bp);
  return true;
}

#else

bool vm_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)A, (void)lda, (void)B, (void)ldb, (void)C,
      (void)ldc;
  return false; /* never called: vm_gemm_bf16_available() is false */
}

bool vm_gemm_bf16_amx(void) { return false; }

void vm_bf16_row(uint16_t *dst, const float *src, int64_t n) {
  (void)dst, (void)src, (void)n; /* never called: vm_gemm_bf16_available() is false */
}

void vm_bf16_panels(uint32_t *dst, const uint16_t *B, int64_t ldb, bool tb, int64_t n, int64_t k) {
  (void)dst, (void)B, (void)ldb, (void)tb, (void)n, (void)k; /* never called */
}

void vm_bf16_amx_f32(const uint16_t *A, int64_t lda, int64_t mp, int64_t kp, const uint32_t *bp,
                     int64_t panel, int64_t np, float *C, int64_t ldc, bool accumulate) {
  (void)A, (void)lda, (void)mp, (void)kp, (void)bp, (void)panel, (void)np, (void)C, (void)ldc,
      (void)accumulate; /* never called: vm_gemm_bf16_amx() is false */
}

#endif
