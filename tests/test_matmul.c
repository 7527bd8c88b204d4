/* test_matmul.c — kiln_matmul against a naive triple loop in double with
 * numpy semantics: 2-d shapes of every kind, 1-d operands, batches and batch
 * broadcasting, transposed/sliced/expanded operands, every numeric dtype and
 * mixed dtypes, k = 0, integer wrapping and exactness, a 512^3 f32 product,
 * errors, and which OpenBLAS core is in use. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/gemm_f32.h"
#include "ktest.h"

/* ---- helpers ------------------------------------------------------------ */

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* a tensor of dtype dt holding vals (row-major doubles, converted) */
static kiln_tensor *make(kiln_dtype dt, int ndim, const int64_t *shape, const double *vals) {
  kiln_tensor *t = ktest_from_doubles(dt, ndim, shape, vals);
  if (!t) KTEST_FAIL("kiln_from_data(%s) failed: %s", ktest_dtype_name(dt), kiln_last_error());
  return t;
}

/* deterministic values, exactly representable in dt: integers in [-4, 4],
   floats in [-1, 1] on a 1/1000 grid (rounded to f32 for f32) */
static double gen(kiln_dtype dt, int64_t i, int seed) {
  int64_t h = (i * 2654435761LL + (int64_t)seed * 40503LL + 17) % 2001;
  switch (dt) {
    case KILN_BOOL:
      return h & 1;
    case KILN_I32:
    case KILN_I64:
    case KILN_I8:
    case KILN_I16:
      return (double)(h % 9 - 4);
    case KILN_U8:
      return (double)(h % 9);
    case KILN_F32:
    case KILN_BF16:
    case KILN_F16:
      return ktest_as_dtype(dt, (double)h / 1000.0 - 1.0);
    case KILN_F64:
      return (double)h / 1000.0 - 1.0;
  }
  return 0;
}

/* a new tensor of generated values; *vals gets them (caller frees) */
static kiln_tensor *make_gen(kiln_dtype dt, int ndim, const int64_t *shape, int seed,
                             double **vals) {
  int64_t n = numel_of(ndim, shape);
  double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) v[i] = gen(dt, i, seed);
  *vals = v;
  return make(dt, ndim, shape, v);
}

/* logical row-major values of a strided view of `base` (element strides) */
static void strided_values(const double *base, int64_t offset, int ndim, const int64_t *shape,
                           const int64_t *strides, double *out) {
  int64_t n = numel_of(ndim, shape);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, p = offset;
    for (int d = ndim - 1; d >= 0; d--) {
      p += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    out[i] = base[p];
  }
}

/* the naive numpy matmul: result values, and sum |a_ik b_kj| per entry (the
   scale a rounding error is measured against) */
typedef struct {
  int ndim;
  int64_t shape[KILN_MAX_DIMS + 1];
  int64_t n, K;
  double *val, *mag;
} mm_ref;

static bool ref_matmul(const double *av, int an, const int64_t *ash, const double *bv, int bn,
                       const int64_t *bsh, mm_ref *r) {
  int64_t M = an == 1 ? 1 : ash[an - 2], K = ash[an - 1];
  int64_t Kb = bn == 1 ? bsh[0] : bsh[bn - 2], N = bn == 1 ? 1 : bsh[bn - 1];
  if (an < 1 || bn < 1 || K != Kb) return false;
  int abn = an > 2 ? an - 2 : 0, bbn = bn > 2 ? bn - 2 : 0, nb = abn > bbn ? abn : bbn;
  int64_t batch[KILN_MAX_DIMS], nbatch = 1;
  for (int i = 0; i < nb; i++) {
    int ia = i - (nb - abn), ib = i - (nb - bbn);
    int64_t da = ia >= 0 ? ash[ia] : 1, db = ib >= 0 ? bsh[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    batch[i] = da == 1 ? db : da;
    nbatch *= batch[i];
  }
  r->ndim = 0;
  for (int i = 0; i < nb; i++) r->shape[r->ndim++] = batch[i];
  if (an > 1) r->shape[r->ndim++] = M;
  if (bn > 1) r->shape[r->ndim++] = N;
  r->n = nbatch * M * N;
  r->K = K;
  r->val = malloc((size_t)(r->n ? r->n : 1) * sizeof(double));
  r->mag = malloc((size_t)(r->n ? r->n : 1) * sizeof(double));
  for (int64_t bi = 0; bi < nbatch; bi++) {
    /* offsets (in matrices) of this batch entry in a and b, broadcasting 1s */
    int64_t rem = bi, aoff = 0, boff = 0, astr = 1, bstr = 1;
    for (int i = nb - 1; i >= 0; i--) {
      int64_t idx = rem % batch[i];
      rem /= batch[i];
      int ia = i - (nb - abn), ib = i - (nb - bbn);
      if (ia >= 0) {
        aoff += (ash[ia] == 1 ? 0 : idx) * astr;
        astr *= ash[ia];
      }
      if (ib >= 0) {
        boff += (bsh[ib] == 1 ? 0 : idx) * bstr;
        bstr *= bsh[ib];
      }
    }
    const double *A = av + aoff * M * K, *B = bv + boff * K * N;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < K; k++) {
          double p = A[i * K + k] * B[k * N + j];
          s += p;
          m += fabs(p);
        }
        r->val[bi * M * N + i * N + j] = s;
        r->mag[bi * M * N + i * N + j] = m;
      }
  }
  return true;
}

/* relative tolerance (against max(1, sum |a b|)) for a result dtype and K */
static double mm_tol(kiln_dtype dt, int64_t K) {
  if (dt == KILN_F32) return 1e-5 + 2e-7 * (double)K;
  if (dt == KILN_F64) return 1e-12;
  return 0; /* integers: exact */
}

/* matmul(a, b) has the promoted dtype, numpy's shape and the naive values */
static void check_matmul(kiln_tensor *a, const double *av, kiln_tensor *b, const double *bv,
                         const char *what) {
  if (!a || !b) {
    KTEST_FAIL("%s: an operand is NULL: %s", what, kiln_last_error());
    return;
  }
  mm_ref ref;
  if (!ref_matmul(av, kiln_ndim(a), kiln_shape(a), bv, kiln_ndim(b), kiln_shape(b), &ref)) {
    KTEST_FAIL("%s: test bug, shapes do not multiply", what);
    return;
  }
  kiln_dtype da = kiln_dtype_of(a), db = kiln_dtype_of(b);
  kiln_dtype want = da > db ? da : db; /* enum order is the promotion order */
  kiln_tensor *r = kiln_matmul(a, b);
  if (!r) {
    KTEST_FAIL("kiln_matmul(%s, %s x %s) failed: %s", what, ktest_dtype_name(da),
               ktest_dtype_name(db), kiln_last_error());
  } else if (kiln_dtype_of(r) != want) {
    KTEST_FAIL("kiln_matmul(%s): dtype %s, expected %s", what, ktest_dtype_name(kiln_dtype_of(r)),
               ktest_dtype_name(want));
  } else {
    bool ok = kiln_ndim(r) == ref.ndim;
    for (int d = 0; ok && d < ref.ndim; d++) ok = kiln_shape(r)[d] == ref.shape[d];
    if (!ok) {
      KTEST_FAIL("kiln_matmul(%s, %s): wrong shape (ndim %d, expected %d)", what,
                 ktest_dtype_name(want), kiln_ndim(r), ref.ndim);
    } else {
      double *got = ktest_values(r), tol = mm_tol(want, ref.K);
      for (int64_t i = 0; i < ref.n; i++)
        if (!(fabs(got[i] - ref.val[i]) <= tol * fmax(1.0, ref.mag[i]))) {
          KTEST_FAIL("kiln_matmul(%s, %s)[%lld] = %.17g, expected %.17g (K %lld)", what,
                     ktest_dtype_name(want), (long long)i, got[i], ref.val[i], (long long)ref.K);
          break;
        }
      free(got);
    }
  }
  kiln_release(r);
  free(ref.val);
  free(ref.mag);
}

/* generates a and b of the given shapes and dtypes and checks their product */
static void check_gen(kiln_dtype da, int an, const int64_t *ash, kiln_dtype db, int bn,
                      const int64_t *bsh, const char *what) {
  double *av, *bv;
  kiln_tensor *a = make_gen(da, an, ash, 1, &av), *b = make_gen(db, bn, bsh, 2, &bv);
  check_matmul(a, av, b, bv, what);
  kiln_release(a), kiln_release(b);
  free(av), free(bv);
}

static const kiln_dtype NUMERIC[4] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};

/* ---- 2-d and 1-d operands ------------------------------------------------ */

TEST(matmul_2d_many_shapes_every_numeric_dtype) {
  static const int64_t mkn[][3] = {
      {1, 1, 1},    {2, 3, 4}, {1, 17, 33}, {33, 17, 1}, {1, 64, 1}, {16, 16, 16}, {17, 31, 19},
      {64, 65, 63}, {5, 1, 7}, {100, 3, 2}, {3, 200, 5}, {31, 1, 1}, {1, 1, 40},   {15, 33, 47}};
  for (int t = 0; t < 4; t++)
    for (size_t s = 0; s < sizeof mkn / sizeof mkn[0]; s++) {
      const int64_t ash[2] = {mkn[s][0], mkn[s][1]}, bsh[2] = {mkn[s][1], mkn[s][2]};
      char what[64];
      snprintf(what, sizeof what, "[%lld,%lld]x[%lld,%lld]", (long long)ash[0], (long long)ash[1],
               (long long)bsh[0], (long long)bsh[1]);
      check_gen(NUMERIC[t], 2, ash, NUMERIC[t], 2, bsh, what);
    }
}

TEST(matmul_1d_times_2d_is_a_row_vector_product) {
  static const int64_t kn[][2] = {{1, 1}, {5, 7}, {33, 1}, {17, 20}};
  for (int t = 0; t < 4; t++)
    for (int s = 0; s < 4; s++) {
      const int64_t ash[1] = {kn[s][0]}, bsh[2] = {kn[s][0], kn[s][1]};
      check_gen(NUMERIC[t], 1, ash, NUMERIC[t], 2, bsh, "[K]x[K,N]");
    }
}

TEST(matmul_2d_times_1d_is_a_column_vector_product) {
  static const int64_t mk[][2] = {{1, 1}, {7, 5}, {1, 33}, {20, 17}};
  for (int t = 0; t < 4; t++)
    for (int s = 0; s < 4; s++) {
      const int64_t ash[2] = {mk[s][0], mk[s][1]}, bsh[1] = {mk[s][1]};
      check_gen(NUMERIC[t], 2, ash, NUMERIC[t], 1, bsh, "[M,K]x[K]");
    }
}

TEST(matmul_1d_times_1d_is_a_0d_dot_product) {
  static const int64_t ks[3] = {1, 7, 100};
  for (int t = 0; t < 4; t++)
    for (int s = 0; s < 3; s++) check_gen(NUMERIC[t], 1, &ks[s], NUMERIC[t], 1, &ks[s], "[K]x[K]");
  /* a value worked out by hand */
  const int64_t s3[1] = {3};
  const double x[3] = {1, 2, 3}, y[3] = {4, -5, 6};
  kiln_tensor *a = make(KILN_I64, 1, s3, x), *b = make(KILN_I64, 1, s3, y);
  kiln_tensor *d = kiln_matmul(a, b);
  CHECK(d && kiln_ndim(d) == 0 && kiln_dtype_of(d) == KILN_I64);
  if (d) CHECK_CLOSE(kiln_item(d), 12.0, 0);
  kiln_release(d), kiln_release(a), kiln_release(b);
}

TEST(matmul_1d_with_batched_operand_broadcasts) {
  const int64_t k[1] = {5}, b3[3] = {3, 5, 4}, a3[3] = {3, 4, 5}, a4[4] = {2, 1, 3, 5};
  for (int t = 0; t < 4; t++) {
    check_gen(NUMERIC[t], 1, k, NUMERIC[t], 3, b3, "[K]x[B,K,N]");
    check_gen(NUMERIC[t], 3, a3, NUMERIC[t], 1, k, "[B,M,K]x[K]");
    check_gen(NUMERIC[t], 4, a4, NUMERIC[t], 1, k, "[2,1,3,K]x[K]");
  }
}

/* ---- batches ------------------------------------------------------------- */

TEST(matmul_batched_3d) {
  const int64_t a[3] = {4, 3, 5}, b[3] = {4, 5, 2}, c[3] = {7, 17, 9}, d[3] = {7, 9, 16};
  const int64_t e[3] = {1, 6, 6}, f[3] = {1, 6, 6};
  for (int t = 0; t < 4; t++) {
    check_gen(NUMERIC[t], 3, a, NUMERIC[t], 3, b, "[4,3,5]x[4,5,2]");
    check_gen(NUMERIC[t], 3, c, NUMERIC[t], 3, d, "[7,17,9]x[7,9,16]");
    check_gen(NUMERIC[t], 3, e, NUMERIC[t], 3, f, "[1,6,6]x[1,6,6]");
  }
  /* the result shape, spelled out */
  const int64_t s[3] = {4, 3, 5}, s2[3] = {4, 5, 2};
  kiln_tensor *x = kiln_ones(KILN_F32, 3, s), *y = kiln_ones(KILN_F32, 3, s2);
  kiln_tensor *z = kiln_matmul(x, y);
  const int64_t es[3] = {4, 3, 2};
  double fives[24];
  for (int i = 0; i < 24; i++) fives[i] = 5;
  CHECK_TENSOR(z, 3, es, fives, 0);
  kiln_release(x), kiln_release(y), kiln_release(z);
}

TEST(matmul_batch_dims_broadcast) {
  struct {
    int an, bn;
    int64_t ash[4], bsh[4];
    const char *what;
  } cases[] = {
      {4, 3, {2, 1, 3, 4}, {5, 4, 2}, "[2,1,3,4]x[5,4,2]"},
      {3, 2, {3, 4, 5}, {5, 6}, "[B,M,K]x[K,N]"},
      {2, 3, {4, 5}, {3, 5, 6}, "[M,K]x[B,K,N]"},
      {3, 3, {1, 3, 4}, {5, 4, 2}, "[1,3,4]x[5,4,2]"},
      {3, 3, {5, 3, 4}, {1, 4, 2}, "[5,3,4]x[1,4,2]"},
      {4, 4, {2, 1, 3, 4}, {1, 6, 4, 2}, "[2,1,3,4]x[1,6,4,2]"},
      {4, 2, {2, 3, 17, 9}, {9, 33}, "[2,3,17,9]x[9,33]"},
  };
  for (int t = 0; t < 4; t++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      check_gen(NUMERIC[t], cases[c].an, cases[c].ash, NUMERIC[t], cases[c].bn, cases[c].bsh,
                cases[c].what);
  /* the shape of the first case, spelled out */
  const int64_t as[4] = {2, 1, 3, 4}, bs[3] = {5, 4, 2};
  kiln_tensor *a = kiln_ones(KILN_F64, 4, as), *b = kiln_ones(KILN_F64, 3, bs);
  kiln_tensor *r = kiln_matmul(a, b);
  CHECK(r && kiln_ndim(r) == 4);
  if (r && kiln_ndim(r) == 4) {
    CHECK_EQ_INT(kiln_shape(r)[0], 2);
    CHECK_EQ_INT(kiln_shape(r)[1], 5);
    CHECK_EQ_INT(kiln_shape(r)[2], 3);
    CHECK_EQ_INT(kiln_shape(r)[3], 2);
  }
  kiln_release(a), kiln_release(b), kiln_release(r);
}

/* ---- non-contiguous operands --------------------------------------------- */

TEST(matmul_transposed_operands) {
  static const int64_t mkn[][3] = {{7, 5, 9}, {33, 65, 17}, {1, 8, 3}, {16, 1, 16}};
  const kiln_dtype dts[3] = {KILN_F32, KILN_F64, KILN_I32};
  for (int t = 0; t < 3; t++)
    for (int s = 0; s < 4; s++) {
      int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2];
      const int64_t at_sh[2] = {K, M}, bt_sh[2] = {N, K}, a_sh[2] = {M, K}, b_sh[2] = {K, N};
      double *atv, *btv, *av, *bv;
      kiln_tensor *at = make_gen(dts[t], 2, at_sh, 3, &atv),
                  *bt = make_gen(dts[t], 2, bt_sh, 4, &btv);
      kiln_tensor *a = make_gen(dts[t], 2, a_sh, 5, &av), *b = make_gen(dts[t], 2, b_sh, 6, &bv);
      kiln_tensor *aT = kiln_transpose(at, 0, 1), *bT = kiln_transpose(bt, 1, 0);
      double *aTv = malloc((size_t)(M * K) * sizeof(double)),
             *bTv = malloc((size_t)(K * N) * sizeof(double));
      const int64_t aT_str[2] = {1, M}, bT_str[2] = {1, K};
      strided_values(atv, 0, 2, a_sh, aT_str, aTv);
      strided_values(btv, 0, 2, b_sh, bT_str, bTv);
      check_matmul(aT, aTv, b, bv, "a^T x b");
      check_matmul(a, av, bT, bTv, "a x b^T");
      check_matmul(aT, aTv, bT, bTv, "a^T x b^T");
      kiln_release(at), kiln_release(bt), kiln_release(a), kiln_release(b);
      kiln_release(aT), kiln_release(bT);
      free(atv), free(btv), free(av), free(bv), free(aTv), free(bTv);
    }
}

TEST(matmul_batched_permuted_and_transposed_operands) {
  const int64_t B = 3, M = 5, K = 6, N = 4;
  const kiln_dtype dts[3] = {KILN_F32, KILN_F64, KILN_I64};
  for (int t = 0; t < 3; t++) {
    /* a = permute([K,B,M], {1,2,0}) -> [B,M,K]; b = transpose([B,N,K], 1, 2) -> [B,K,N] */
    const int64_t ab[3] = {K, B, M}, bb[3] = {B, N, K}, ash[3] = {B, M, K}, bsh[3] = {B, K, N};
    const int64_t astr[3] = {M, 1, B * M}, bstr[3] = {N * K, 1, K};
    const int perm[3] = {1, 2, 0};
    double *abv, *bbv, av[90], bv[72];
    kiln_tensor *abase = make_gen(dts[t], 3, ab, 7, &abv),
                *bbase = make_gen(dts[t], 3, bb, 8, &bbv);
    kiln_tensor *a = kiln_permute(abase, perm), *b = kiln_transpose(bbase, 1, 2);
    strided_values(abv, 0, 3, ash, astr, av);
    strided_values(bbv, 0, 3, bsh, bstr, bv);
    check_matmul(a, av, b, bv, "permuted x transposed (batched)");
    kiln_release(a), kiln_release(b), kiln_release(abase), kiln_release(bbase);
    free(abv), free(bbv);
  }
}

TEST(matmul_sliced_operands) {
  const int64_t M = 6, K = 7, N = 5;
  const kiln_dtype dts[3] = {KILN_F32, KILN_F64, KILN_I32};
  for (int t = 0; t < 3; t++) {
    kiln_dtype dt = dts[t];
    const int64_t ash[2] = {M, K}, bsh[2] = {K, N};
    double *av0, *bv0, lv[64];
    kiln_tensor *a = make_gen(dt, 2, ash, 9, &av0), *b = make_gen(dt, 2, bsh, 10, &bv0);

    /* every second column of [M, 2K]: inner stride 2 */
    const int64_t s1[2] = {M, 2 * K}, st1[2] = {2 * K, 2};
    double *v1;
    kiln_tensor *b1 = make_gen(dt, 2, s1, 11, &v1), *a1 = kiln_slice(b1, 1, 0, 2 * K, 2);
    strided_values(v1, 0, 2, ash, st1, lv);
    check_matmul(a1, lv, b, bv0, "a[:, ::2] x b");
    /* rows 1, 3, ... of [2M+1, K] */
    const int64_t s2[2] = {2 * M + 1, K}, st2[2] = {2 * K, 1};
    double *v2;
    kiln_tensor *b2 = make_gen(dt, 2, s2, 12, &v2), *a2 = kiln_slice(b2, 0, 1, 2 * M + 1, 2);
    strided_values(v2, K, 2, ash, st2, lv);
    check_matmul(a2, lv, b, bv0, "a[1::2] x b");
    /* columns 2..2+K of [M, K+5]: contiguous rows with a larger leading dimension */
    const int64_t s3[2] = {M, K + 5}, st3[2] = {K + 5, 1};
    double *v3;
    kiln_tensor *b3 = make_gen(dt, 2, s3, 13, &v3), *a3 = kiln_slice(b3, 1, 2, 2 + K, 1);
    strided_values(v3, 2, 2, ash, st3, lv);
    check_matmul(a3, lv, b, bv0, "a[:, 2:2+K] x b");
    /* rows K, K-1, ..., 1 of [K+1, N] (negative step) */
    const int64_t s4[2] = {K + 1, N}, st4[2] = {-N, 1};
    double *v4;
    kiln_tensor *b4 = make_gen(dt, 2, s4, 14, &v4), *bn = kiln_slice(b4, 0, K, 0, -1);
    strided_values(v4, K * N, 2, bsh, st4, lv);
    check_matmul(a, av0, bn, lv, "a x b[K:0:-1]");
    /* both operands sliced */
    double lv2[64];
    strided_values(v1, 0, 2, ash, st1, lv2);
    check_matmul(a1, lv2, bn, lv, "a[:, ::2] x b[K:0:-1]");

    kiln_release(a1), kiln_release(b1), kiln_release(a2), kiln_release(b2);
    kiln_release(a3), kiln_release(b3), kiln_release(bn), kiln_release(b4);
    kiln_release(a), kiln_release(b);
    free(av0), free(bv0), free(v1), free(v2), free(v3), free(v4);
  }
}

TEST(matmul_expanded_operands) {
  const int64_t M = 4, K = 5, N = 3, B = 3;
  for (int t = 0; t < 4; t++) {
    kiln_dtype dt = NUMERIC[t];
    /* a = expand([1,K] -> [M,K]) (stride-0 rows); b = expand([K,1] -> [K,N]) */
    const int64_t r1[2] = {1, K}, c1[2] = {K, 1}, ash[2] = {M, K}, bsh[2] = {K, N};
    const int64_t astr[2] = {0, 1}, bstr[2] = {1, 0};
    double *rv, *cv, av[20], bv[15];
    kiln_tensor *row = make_gen(dt, 2, r1, 15, &rv), *col = make_gen(dt, 2, c1, 16, &cv);
    kiln_tensor *a = kiln_expand(row, 2, ash), *b = kiln_expand(col, 2, bsh);
    strided_values(rv, 0, 2, ash, astr, av);
    strided_values(cv, 0, 2, bsh, bstr, bv);
    check_matmul(a, av, b, bv, "expanded x expanded");
    /* batched: b = expand([1,K,N] -> [B,K,N]) */
    const int64_t a3[3] = {B, M, K}, b1[3] = {1, K, N}, b3[3] = {B, K, N}, b3str[3] = {0, N, 1};
    double *a3v, *b1v, b3v[45];
    kiln_tensor *aa = make_gen(dt, 3, a3, 17, &a3v), *bb1 = make_gen(dt, 3, b1, 18, &b1v);
    kiln_tensor *bb = kiln_expand(bb1, 3, b3);
    strided_values(b1v, 0, 3, b3, b3str, b3v);
    check_matmul(aa, a3v, bb, b3v, "[B,M,K] x expand([1,K,N])");
    kiln_release(row), kiln_release(col), kiln_release(a), kiln_release(b);
    kiln_release(aa), kiln_release(bb1), kiln_release(bb);
    free(rv), free(cv), free(a3v), free(b1v);
  }
}

/* ---- dtypes -------------------------------------------------------------- */

TEST(matmul_mixed_dtypes_promote) {
  const kiln_dtype pairs[][2] = {{KILN_I32, KILN_F32}, {KILN_F32, KILN_I32}, {KILN_F32, KILN_F64},
                                 {KILN_F64, KILN_F32}, {KILN_I32, KILN_I64}, {KILN_I64, KILN_I32},
                                 {KILN_I64, KILN_F64}, {KILN_I32, KILN_F64}, {KILN_I64, KILN_F32}};
  const int64_t ash[2] = {6, 9}, bsh[2] = {9, 4}, b3[3] = {2, 9, 4};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    char what[48];
    snprintf(what, sizeof what, "%s x %s", ktest_dtype_name(pairs[p][0]),
             ktest_dtype_name(pairs[p][1]));
    check_gen(pairs[p][0], 2, ash, pairs[p][1], 2, bsh, what);
    check_gen(pairs[p][0], 2, ash, pairs[p][1], 3, b3, what);
  }
}

TEST(matmul_i32_is_i32_and_wraps) {
  const int64_t ash[2] = {1, 2}, bsh[2] = {2, 1};
  const double av[2] = {50000, 1}, bv[2] = {50000, 7};
  kiln_tensor *a = make(KILN_I32, 2, ash, av), *b = make(KILN_I32, 2, bsh, bv);
  kiln_tensor *r = kiln_matmul(a, b);
  int32_t got = 0;
  CHECK(r && kiln_dtype_of(r) == KILN_I32);
  CHECK(r && kiln_to_buffer(r, &got, sizeof got) >= 0);
  /* 2500000007 mod 2^32, as a signed 32-bit value */
  CHECK_EQ_INT(got, -1794967289);
  kiln_release(r), kiln_release(a), kiln_release(b);
}

TEST(matmul_i64_is_exact_beyond_2_pow_53) {
  const int64_t p40 = (int64_t)1 << 40, p20 = (int64_t)1 << 20;
  const int64_t av[4] = {p40 + 3, 5, -7, 2 * p40 + 1};
  const int64_t bv[4] = {p20 + 5, 3, 11, -(p20 / 2 + 1)};
  const int64_t sh[2] = {2, 2};
  int64_t want[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) want[i * 2 + j] = av[i * 2] * bv[j] + av[i * 2 + 1] * bv[2 + j];
  kiln_tensor *a = kiln_from_data(av, KILN_I64, 2, sh), *b = kiln_from_data(bv, KILN_I64, 2, sh);
  kiln_tensor *r = kiln_matmul(a, b);
  int64_t got[4] = {0, 0, 0, 0};
  CHECK(r && kiln_dtype_of(r) == KILN_I64);
  CHECK(r && kiln_to_buffer(r, got, sizeof got) >= 0);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(got[i], want[i]);
  kiln_release(r), kiln_release(a), kiln_release(b);
}

TEST(matmul_larger_integer_products_are_exact) {
  const int64_t a1[2] = {70, 130}, b1[2] = {130, 90}, a2[3] = {2, 45, 300}, b2[2] = {300, 20};
  check_gen(KILN_I32, 2, a1, KILN_I32, 2, b1, "i32 [70,130]x[130,90]");
  check_gen(KILN_I64, 2, a1, KILN_I64, 2, b1, "i64 [70,130]x[130,90]");
  check_gen(KILN_I64, 3, a2, KILN_I64, 2, b2, "i64 [2,45,300]x[300,20]");
}

TEST(matmul_larger_f64_product_is_accurate) {
  const int64_t ash[2] = {130, 257}, bsh[2] = {257, 70};
  check_gen(KILN_F64, 2, ash, KILN_F64, 2, bsh, "f64 [130,257]x[257,70]");
  check_gen(KILN_F32, 2, ash, KILN_F32, 2, bsh, "f32 [130,257]x[257,70]");
}

/* ---- empty dimensions ------------------------------------------------------ */

TEST(matmul_k0_gives_zeros) {
  const int64_t a0[2] = {3, 0}, b0[2] = {0, 4}, a3[3] = {2, 3, 0}, b3[3] = {2, 0, 4}, k0[1] = {0};
  const double none = 0;
  double zeros[24] = {0};
  const int64_t e34[2] = {3, 4}, e234[3] = {2, 3, 4}, e0[1] = {0};
  for (int t = 0; t < 4; t++) {
    kiln_dtype dt = NUMERIC[t];
    kiln_tensor *a = make(dt, 2, a0, &none), *b = make(dt, 2, b0, &none);
    kiln_tensor *r = kiln_matmul(a, b);
    CHECK(r && kiln_dtype_of(r) == dt);
    CHECK_TENSOR(r, 2, e34, zeros, 0);
    kiln_release(r), kiln_release(a), kiln_release(b);
    a = make(dt, 3, a3, &none), b = make(dt, 3, b3, &none);
    r = kiln_matmul(a, b);
    CHECK_TENSOR(r, 3, e234, zeros, 0);
    kiln_release(r), kiln_release(a), kiln_release(b);
    a = make(dt, 1, k0, &none), b = make(dt, 1, k0, &none);
    r = kiln_matmul(a, b);
    CHECK_TENSOR(r, 0, e0, zeros, 0);
    kiln_release(r), kiln_release(a), kiln_release(b);
  }
}

TEST(matmul_empty_m_or_n_gives_empty_result) {
  const int64_t a1[2] = {0, 3}, b1[2] = {3, 4}, a2[2] = {3, 4}, b2[2] = {4, 0};
  const int64_t e1[2] = {0, 4}, e2[2] = {3, 0};
  for (int t = 0; t < 4; t++) {
    kiln_tensor *a = kiln_zeros(NUMERIC[t], 2, a1), *b = kiln_ones(NUMERIC[t], 2, b1);
    kiln_tensor *r = kiln_matmul(a, b);
    CHECK(r != NULL);
    CHECK_TENSOR(r, 2, e1, NULL, 0);
    kiln_release(r), kiln_release(a), kiln_release(b);
    a = kiln_ones(NUMERIC[t], 2, a2), b = kiln_zeros(NUMERIC[t], 2, b2);
    r = kiln_matmul(a, b);
    CHECK(r != NULL);
    CHECK_TENSOR(r, 2, e2, NULL, 0);
    kiln_release(r), kiln_release(a), kiln_release(b);
  }
}

/* ---- errors -------------------------------------------------------------- */

TEST(matmul_error_inner_dims_mismatch_names_both_shapes) {
  const int64_t s23[2] = {2, 3}, s45[2] = {4, 5};
  kiln_tensor *a = kiln_ones(KILN_F32, 2, s23), *b = kiln_ones(KILN_F32, 2, s45);
  kiln_clear_error();
  kiln_tensor *r = kiln_matmul(a, b);
  CHECK(r == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_matmul");
  CHECK_STR_CONTAINS(kiln_last_error(), "[2,3]");
  CHECK_STR_CONTAINS(kiln_last_error(), "[4,5]");
  kiln_release(r);
  kiln_clear_error();

  const int64_t s3[1] = {3}, s4[1] = {4}, s32[2] = {3, 2}, b234[3] = {2, 3, 4}, b345[3] = {3, 4, 5};
  kiln_tensor *v3 = kiln_ones(KILN_F32, 1, s3), *v4 = kiln_ones(KILN_F32, 1, s4);
  kiln_tensor *m32 = kiln_ones(KILN_F32, 2, s32);
  kiln_tensor *x = kiln_ones(KILN_F32, 3, b234), *y = kiln_ones(KILN_F32, 3, b345);
  CHECK_ERROR(kiln_matmul(v3, v4), KILN_ERR_SHAPE, "kiln_matmul");
  CHECK_ERROR(kiln_matmul(a, v4), KILN_ERR_SHAPE, "kiln_matmul");
  CHECK_ERROR(kiln_matmul(v4, m32), KILN_ERR_SHAPE, "kiln_matmul");
  CHECK_ERROR(kiln_matmul(b, a), KILN_ERR_SHAPE, "kiln_matmul");
  /* batch dims 2 and 3 do not broadcast (inner dims 4 and 4 do match) */
  CHECK_ERROR(kiln_matmul(x, y), KILN_ERR_SHAPE, "kiln_matmul");
  kiln_release(a), kiln_release(b), kiln_release(v3), kiln_release(v4), kiln_release(m32);
  kiln_release(x), kiln_release(y);
}

TEST(matmul_error_bool_rejected) {
  const int64_t s[2] = {2, 2};
  const double v[4] = {1, 0, 1, 1};
  kiln_tensor *a = make(KILN_BOOL, 2, s, v), *b = make(KILN_BOOL, 2, s, v);
  CHECK_ERROR(kiln_matmul(a, b), KILN_ERR_DTYPE, "kiln_matmul");
  kiln_release(a), kiln_release(b);
}

TEST(matmul_error_0d_operand_rejected) {
  const int64_t s[2] = {2, 2};
  kiln_tensor *m = kiln_ones(KILN_F32, 2, s), *z = kiln_scalar(2.0, KILN_F32);
  kiln_tensor *pairs[3][2] = {{z, m}, {m, z}, {z, z}};
  for (int p = 0; p < 3; p++) {
    kiln_clear_error();
    kiln_tensor *r = kiln_matmul(pairs[p][0], pairs[p][1]);
    if (r) {
      KTEST_FAIL("kiln_matmul with a 0-d operand (case %d) succeeded", p);
      kiln_release(r);
    } else {
      kiln_status st = kiln_last_status();
      if (st != KILN_ERR_SHAPE && st != KILN_ERR_ARG)
        KTEST_FAIL("0-d operand: status %d, expected KILN_ERR_SHAPE or KILN_ERR_ARG", (int)st);
      CHECK_STR_CONTAINS(kiln_last_error(), "kiln_matmul");
    }
  }
  kiln_clear_error();
  kiln_release(m), kiln_release(z);
}

TEST(matmul_of_null_returns_null_and_keeps_first_error) {
  const int64_t s[2] = {2, 2}, bad[1] = {-3};
  kiln_tensor *m = kiln_ones(KILN_F32, 2, s);
  kiln_clear_error();
  kiln_tensor *z = kiln_zeros(KILN_F32, 1, bad);
  CHECK(z == NULL);
  kiln_status first = kiln_last_status();
  CHECK(first != KILN_OK);
  kiln_tensor *r1 = kiln_matmul(z, m), *r2 = kiln_matmul(m, z);
  CHECK(r1 == NULL && r2 == NULL);
  CHECK_EQ_INT(kiln_last_status(), first);
  kiln_release(r1), kiln_release(r2), kiln_release(m);
  kiln_clear_error();
}

/* ---- big, repeated, chained ----------------------------------------------- */

TEST(matmul_512_f32_matches_naive_loop_on_samples) {
  const int64_t n = 512, sh[2] = {512, 512};
  kiln_manual_seed(42);
  kiln_tensor *a = kiln_randn(KILN_F32, 2, sh), *b = kiln_randn(KILN_F32, 2, sh);
  kiln_tensor *c = kiln_matmul(a, b);
  float *av = malloc(512 * 512 * sizeof(float)), *bv = malloc(512 * 512 * sizeof(float));
  float *cv = malloc(512 * 512 * sizeof(float));
  size_t bytes = 512 * 512 * sizeof(float);
  bool ok = a && b && c && kiln_dtype_of(c) == KILN_F32 && kiln_to_buffer(a, av, bytes) >= 0 &&
            kiln_to_buffer(b, bv, bytes) >= 0 && kiln_to_buffer(c, cv, bytes) >= 0;
  CHECK(ok);
  if (ok) {
    double tol = mm_tol(KILN_F32, n);
    int bad = 0;
    /* the four edges (all of them) and 4096 scattered entries */
    for (int s = 0; s < 4 * 512 + 4096 && bad < 5; s++) {
      int64_t i, j;
      if (s < 512)
        i = 0, j = s;
      else if (s < 1024)
        i = 511, j = s - 512;
      else if (s < 1536)
        i = s - 1024, j = 0;
      else if (s < 2048)
        i = s - 1536, j = 511;
      else
        i = ((int64_t)s * 7919) % 512, j = ((int64_t)s * 104729 + 13) % 512;
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < n; k++) {
        double p = (double)av[i * n + k] * (double)bv[k * n + j];
        ref += p;
        mag += fabs(p);
      }
      if (!(fabs(cv[i * n + j] - ref) <= tol * fmax(1.0, mag))) {
        KTEST_FAIL("c[%lld,%lld] = %.9g, expected %.9g", (long long)i, (long long)j,
                   (double)cv[i * n + j], ref);
        bad++;
      }
    }
  }
  free(av), free(bv), free(cv);
  kiln_release(a), kiln_release(b), kiln_release(c);
}

/* Short products (C's rows 16-128, a batch of states times a weight), and
   taller ones while K is short (to 2048 with AVX-512, 512 with AVX2), run
   through Kiln's own f32 GEMM on AVX2 and AVX-512 CPUs (vm/gemm_f32.h): every
   element is one chain of FMAs over k in order from +0, fmaf by fmaf,
   whatever the tile, row block or panel it lands in.  Shapes with tails of
   rows (not a multiple of 8) and columns (not of 32), depths not of 16,
   B as itself, as a transposed view (a weight's Wᵀ) and as a column slice,
   A as a row slice of a wider matrix.  Elsewhere (another CPU,
   KILN_F32_GEMM=0) OpenBLAS runs them: then within the f32 bound. */
TEST(matmul_short_products_are_fma_chains_over_k) {
  static const struct {
    int64_t m, n, k;
  } shapes[] = {/* each of at least 2^20 multiply-adds (k in chunks of 512 from 513 on); the
                   last four taller */
                {16, 256, 256},  {17, 65, 1024}, {23, 100, 512}, {32, 512, 128},  {32, 128, 511},
                {64, 96, 200},   {100, 130, 81}, {128, 64, 128}, {31, 257, 132},  {40, 96, 3000},
                {512, 128, 128}, {129, 70, 512}, {300, 96, 700}, {200, 160, 2048}};
  bool v4 = !strcmp(kiln_cpu_isa(), "x86-64-v4");
  bool own_cpu = (v4 || !strcmp(kiln_cpu_isa(), "x86-64-v3")) &&
                 !(getenv("KILN_F32_GEMM") && !strcmp(getenv("KILN_F32_GEMM"), "0"));
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (int form = 0; form < 4; form++) { /* B plain, B = Wᵀ (a view), B a column slice,
                                                A = Xᵀ (a view of a column slice) */
      int64_t m = shapes[s].m, n = shapes[s].n, k = shapes[s].k, wa = k + 3, wb = n + 5;
      /* vm/gemm_f32.c's rule */
      int64_t max_k = m <= 128 ? 8192 : v4 ? 2048 : 512;
      bool short_side = m <= 512 || n <= 512 || k <= 512;
      bool own = own_cpu && k <= max_k && short_side && (form != 3 || (v4 && m <= 128));
      kiln_manual_seed(100 + (uint64_t)s * 3 + (uint64_t)form);
      kiln_tensor *abig = form == 3 ? kiln_randn(KILN_F32, 2, (int64_t[]){k, m + 3})
                                    : kiln_randn(KILN_F32, 2, (int64_t[]){m, wa});
      kiln_tensor *acols = form == 3 ? kiln_slice(abig, 1, 1, 1 + m, 1) : NULL;
      kiln_tensor *a = form == 3 ? kiln_transpose(acols, 0, 1)
                                 : kiln_slice(abig, 1, 2, 2 + k, 1); /* rows of a wider matrix */
      kiln_tensor *bsrc = form == 1   ? kiln_randn(KILN_F32, 2, (int64_t[]){n, k})
                          : form == 2 ? kiln_randn(KILN_F32, 2, (int64_t[]){k, wb})
                                      : kiln_randn(KILN_F32, 2, (int64_t[]){k, n});
      kiln_tensor *b = form == 1   ? kiln_transpose(bsrc, 0, 1)
                       : form == 2 ? kiln_slice(bsrc, 1, 1, 1 + n, 1)
                                   : kiln_retain(bsrc);
      kiln_tensor *c = kiln_matmul(a, b), *ac = kiln_retain(a),
                  *bc = kiln_retain(b); /* read back row-major */
      float *av = malloc((size_t)(m * k) * sizeof *av), *bv = malloc((size_t)(k * n) * sizeof *bv),
            *cv = malloc((size_t)(m * n) * sizeof *cv);
      bool ok = c && av && bv && cv &&
                kiln_to_buffer(ac, av, (size_t)(m * k) * sizeof *av) == KILN_OK &&
                kiln_to_buffer(bc, bv, (size_t)(k * n) * sizeof *bv) == KILN_OK &&
                kiln_to_buffer(c, cv, (size_t)(m * n) * sizeof *cv) == KILN_OK;
      CHECK(ok);
      int bad = 0;
      for (int64_t i = 0; ok && i < m && bad < 3; i++)
        for (int64_t j = 0; j < n && bad < 3; j++) {
          float chain = 0.0f;
          double ref = 0, mag = 0;
          for (int64_t p = 0; p < k; p++) {
            chain = fmaf(av[i * k + p], bv[p * n + j], chain);
            ref += (double)av[i * k + p] * bv[p * n + j];
            mag += fabs((double)av[i * k + p] * bv[p * n + j]);
          }
          bool fine = own ? !memcmp(&chain, &cv[i * n + j], sizeof chain)
                          : fabs(cv[i * n + j] - ref) <= mm_tol(KILN_F32, k) * fmax(1.0, mag);
          if (!fine) {
            KTEST_FAIL("[%lld,%lld]x[%lld,%lld] form %d: c[%lld,%lld] = %a, the fma chain %a",
                       (long long)m, (long long)k, (long long)k, (long long)n, form, (long long)i,
                       (long long)j, (double)cv[i * n + j], (double)chain);
            bad++;
          }
        }
      free(av), free(bv), free(cv);
      kiln_release(abig), kiln_release(acols), kiln_release(a), kiln_release(bsrc), kiln_release(b);
      kiln_release(c), kiln_release(ac), kiln_release(bc);
    }
}

/* vm/gemm_f32.h directly, past the rule: B packed once for a whole product
   (a rolled loop's fixed weight) and packed at every call give the same
   bits, the fma chains over k, across k's chunks of 512, for A as rows or
   as Xᵀ and B as rows or as Wᵀ */
TEST(gemm_f32_packed_once_equals_packed_per_call_across_k_chunks) {
  if (strcmp(kiln_cpu_isa(), "x86-64-v4") && strcmp(kiln_cpu_isa(), "x86-64-v3")) {
    printf("  skipped: %s runs no Kiln f32 GEMM\n", kiln_cpu_isa());
    return;
  }
  if (getenv("KILN_F32_GEMM") && !strcmp(getenv("KILN_F32_GEMM"), "0")) return;
  const int64_t m = 37, n = 70, k = 1300, ld = 1310; /* 3 chunks, tails of rows and columns */
  float *A = malloc(sizeof *A * (size_t)(ld * ld)), *B = malloc(sizeof *B * (size_t)(ld * ld));
  float *c1 = malloc(sizeof *c1 * (size_t)(m * n)), *c2 = malloc(sizeof *c2 * (size_t)(m * n));
  float *panels = aligned_alloc(64, (vm_f32_panels_size(n, k) * sizeof *panels + 63) / 64 * 64);
  CHECK(A && B && c1 && c2 && panels);
  uint64_t seed = 7;
  for (int64_t i = 0; i < ld * ld; i++) {
    A[i] = (float)(2 * ktest_unif01(&seed) - 1);
    B[i] = (float)(2 * ktest_unif01(&seed) - 1);
  }
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      vm_f32_panels(panels, B, ld, tb, n, k);
      CHECK(vm_gemm_f32(ta, tb, m, n, k, A, ld, B, ld, c1, n, NULL));
      CHECK(vm_gemm_f32(ta, tb, m, n, k, A, ld, B, ld, c2, n, panels));
      int bad = 0;
      for (int64_t i = 0; i < m && bad < 3; i++)
        for (int64_t j = 0; j < n && bad < 3; j++) {
          float chain = 0.0f;
          for (int64_t p = 0; p < k; p++)
            chain =
                fmaf(ta ? A[p * ld + i] : A[i * ld + p], tb ? B[j * ld + p] : B[p * ld + j], chain);
          if (memcmp(&chain, &c1[i * n + j], sizeof chain) ||
              memcmp(&chain, &c2[i * n + j], sizeof chain)) {
            KTEST_FAIL("ta %d tb %d: c[%lld,%lld] = %a per call, %a packed once; the chain %a", ta,
                       tb, (long long)i, (long long)j, (double)c1[i * n + j], (double)c2[i * n + j],
                       (double)chain);
            bad++;
          }
        }
    }
  free(A), free(B), free(c1), free(c2), free(panels);
}

TEST(matmul_repeated_with_fresh_data_stays_correct) {
  /* the same trace many times (the JIT may compile it meanwhile) */
  const int64_t ash[2] = {9, 13}, bsh[2] = {13, 11};
  for (int iter = 0; iter < 6; iter++) {
    double *av, *bv;
    kiln_tensor *a = make_gen(KILN_F32, 2, ash, 20 + iter, &av);
    kiln_tensor *b = make_gen(KILN_F32, 2, bsh, 40 + iter, &bv);
    check_matmul(a, av, b, bv, "repeated [9,13]x[13,11]");
    kiln_release(a), kiln_release(b);
    free(av), free(bv);
  }
}

TEST(matmul_result_feeds_elementwise_ops) {
  /* (a @ b) * 2 + 1 and relu(a @ b): matmul followed by a fused consumer */
  const int64_t ash[2] = {8, 6}, bsh[2] = {6, 10};
  double *av, *bv;
  kiln_tensor *a = make_gen(KILN_F64, 2, ash, 60, &av), *b = make_gen(KILN_F64, 2, bsh, 61, &bv);
  mm_ref ref;
  CHECK(ref_matmul(av, 2, ash, bv, 2, bsh, &ref));
  kiln_tensor *c = kiln_matmul(a, b), *c2 = kiln_mul_scalar(c, 2.0);
  kiln_tensor *e = kiln_add_scalar(c2, 1.0), *rl = kiln_relu(c);
  double *want = malloc(80 * sizeof(double)), *want_relu = malloc(80 * sizeof(double));
  for (int i = 0; i < 80; i++) {
    want[i] = ref.val[i] * 2 + 1;
    want_relu[i] = ref.val[i] > 0 ? ref.val[i] : 0;
  }
  const int64_t es[2] = {8, 10};
  CHECK_TENSOR(e, 2, es, want, 1e-12);
  CHECK_TENSOR(rl, 2, es, want_relu, 1e-12);
  kiln_release(e), kiln_release(c2), kiln_release(c), kiln_release(rl);
  kiln_release(a), kiln_release(b);
  free(av), free(bv), free(want), free(want_relu), free(ref.val), free(ref.mag);
}

/* ---- the BLAS in use ----------------------------------------------------- */

/* OPENBLAS_CORETYPE as the user set it, read before Kiln runs (Kiln sets it
   itself when it is unset) */
static char user_coretype[64];

/* ---- a batch is one batched call, each item with its own bits ----------- */

/* item idx[0..nb) of t's leading dims (size-1 dims broadcast: index 0), as
   a 2-d tensor; transposed: that matrix's transpose (a view, as kT is) */
static kiln_tensor *item_of(kiln_tensor *t, int nb, const int64_t *idx, bool transposed) {
  int nd = kiln_ndim(t);
  const int64_t *sh = kiln_shape(t);
  kiln_tensor *cur = kiln_retain(t);
  for (int d = 0; d < nb; d++) {
    int64_t i = sh[d] == 1 ? 0 : idx[d];
    kiln_tensor *next = kiln_slice(cur, d, i, i + 1, 1);
    kiln_release(cur);
    cur = next;
  }
  kiln_tensor *m = kiln_reshape(cur, 2, (int64_t[]){sh[nd - 2], sh[nd - 1]});
  kiln_release(cur);
  if (!transposed) return m;
  kiln_tensor *mt = kiln_transpose(m, 0, 1);
  kiln_release(m);
  return mt;
}

/* t's row-major bytes (caller frees) */
static unsigned char *bytes_of(kiln_tensor *t, size_t *n) {
  *n = (size_t)kiln_numel(t) * ktest_dtype_size(kiln_dtype_of(t));
  unsigned char *buf = malloc(*n ? *n : 1);
  if (kiln_to_buffer(t, buf, *n) != 0) KTEST_FAIL("kiln_to_buffer: %s", kiln_last_error());
  return buf;
}

/* c (the batched product over nb batch dims of shape bshape) equals, bit
   for bit, the products a_i b_i made one 2-d matmul at a time; a_t (b_t):
   the operand was the transpose of abase's (bbase's) last two dims, a view,
   and a_i (b_i) is made the same way */
static void check_items(kiln_tensor *c, kiln_tensor *abase, bool a_t, kiln_tensor *bbase, bool b_t,
                        int nb, const int64_t *bshape, const char *what) {
  size_t cn, in;
  unsigned char *cb = bytes_of(c, &cn);
  int64_t items = 1, idx[4] = {0};
  for (int d = 0; d < nb; d++) items *= bshape[d];
  size_t at = 0;
  for (int64_t i = 0; i < items; i++) {
    for (int64_t r = i, d = nb - 1; d >= 0; d--) idx[d] = r % bshape[d], r /= bshape[d];
    kiln_tensor *ai = item_of(abase, nb, idx, a_t), *bi = item_of(bbase, nb, idx, b_t);
    kiln_tensor *ci = kiln_matmul(ai, bi);
    unsigned char *ib = bytes_of(ci, &in);
    if (at + in > cn || memcmp(cb + at, ib, in) != 0) {
      KTEST_FAIL("%s: item %lld of the batched matmul differs from the same 2-d matmul", what,
                 (long long)i);
      i = items;
    }
    at += in;
    free(ib);
    kiln_release(ai), kiln_release(bi), kiln_release(ci);
  }
  CHECK(at == cn);
  free(cb);
}

/* a matmul over batch dims is one batched call (kiln_stat "blas_calls"),
   whose items run on the pool side by side (vm/kern_matmul.c), each item
   tiled as the same product alone: so its bits are the 2-d matmul's.  The
   attention shapes (q k^T, p v), a broadcast batch, items big enough to
   run in several tiles, f32 and f64. */
TEST(matmul_batched_is_one_blas_call_and_each_item_keeps_its_bits) {
  static const struct {
    int nd;
    int64_t ash[4], bsh[4]; /* b: before the transpose when b_t */
    bool b_t;
    const char *what;
  } cases[] = {
      {4, {2, 3, 128, 32}, {2, 3, 128, 32}, true, "q k^T [2,3,128,32]x[2,3,32,128]"},
      {4, {2, 3, 128, 128}, {2, 3, 128, 32}, false, "p v [2,3,128,128]x[2,3,128,32]"},
      {4, {2, 1, 64, 32}, {1, 3, 32, 48}, false, "broadcast [2,1,64,32]x[1,3,32,48]"},
      {3, {2, 256, 512}, {2, 512, 300}, false, "tiled items [2,256,512]x[2,512,300]"},
  };
  const kiln_dtype dts[2] = {KILN_F32, KILN_F64};
  for (int t = 0; t < 2; t++)
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      int nd = cases[k].nd, nb = nd - 2;
      double *av, *bv;
      kiln_tensor *a = make_gen(dts[t], nd, cases[k].ash, 21 + (int)k, &av);
      kiln_tensor *bbase = make_gen(dts[t], nd, cases[k].bsh, 31 + (int)k, &bv);
      kiln_tensor *b = cases[k].b_t ? kiln_transpose(bbase, nd - 2, nd - 1) : kiln_retain(bbase);
      double c0 = kiln_stat("blas_calls");
      kiln_tensor *c = kiln_matmul(a, b);
      CHECK(kiln_eval(1, &c) == KILN_OK);
      double calls = kiln_stat("blas_calls") - c0;
      if (calls != 1)
        KTEST_FAIL("%s %s: %g BLAS calls, want 1", cases[k].what, ktest_dtype_name(dts[t]), calls);
      int64_t bshape[2];
      for (int d = 0; d < nb; d++)
        bshape[d] = cases[k].ash[d] > cases[k].bsh[d] ? cases[k].ash[d] : cases[k].bsh[d];
      check_items(c, a, false, bbase, cases[k].b_t, nb, bshape, cases[k].what);
      kiln_release(a), kiln_release(bbase), kiln_release(b), kiln_release(c);
      free(av), free(bv);
    }
}

/* the gradients of a batched matmul are batched matmuls too: q k^T's
   backward makes two calls (dq = g k, dk^T = q^T g), each one call for the
   whole batch, and each item's gradient has the bits of its 2-d product */
TEST(matmul_batched_backward_is_one_blas_call_per_gradient) {
  const int64_t sh[4] = {2, 3, 128, 32}, csh[4] = {2, 3, 128, 128};
  const kiln_dtype dts[2] = {KILN_F32, KILN_F64};
  for (int t = 0; t < 2; t++) {
    double *qv, *kv, *wv;
    kiln_tensor *q = make_gen(dts[t], 4, sh, 41, &qv), *k = make_gen(dts[t], 4, sh, 42, &kv);
    kiln_tensor *w = make_gen(dts[t], 4, csh, 43, &wv);
    CHECK(kiln_set_requires_grad(q, true) == KILN_OK);
    CHECK(kiln_set_requires_grad(k, true) == KILN_OK);
    kiln_tensor *kt = kiln_transpose(k, 2, 3), *c = kiln_matmul(q, kt), *cw = kiln_mul(c, w);
    kiln_tensor *loss = kiln_sum(cw, 0, NULL, false);
    double c0 = kiln_stat("blas_calls");
    CHECK(kiln_eval(1, &loss) == KILN_OK);
    CHECK_EQ_INT(kiln_stat("blas_calls") - c0, 1);
    c0 = kiln_stat("blas_calls");
    CHECK(kiln_backward(loss, NULL) == KILN_OK);
    kiln_tensor *g[2] = {kiln_grad(q), kiln_grad(k)};
    CHECK(g[0] && g[1]);
    if (!g[0] || !g[1]) return;
    CHECK(kiln_eval(2, g) == KILN_OK);
    CHECK_EQ_INT(kiln_stat("blas_calls") - c0, 2);
    /* the gradient of sum(c * w) by c is w: dq_i = w_i k_i, dk_i = (q_i^T w_i)^T */
    const int64_t bshape[2] = {2, 3};
    check_items(g[0], w, false, k, false, 2, bshape, "dq = g k");
    kiln_tensor *qt = kiln_transpose(q, 2, 3), *dkt = kiln_matmul(qt, w);
    kiln_tensor *dk = kiln_transpose(dkt, 2, 3);
    size_t n1, n2;
    unsigned char *b1 = bytes_of(g[1], &n1), *b2 = bytes_of(dk, &n2);
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1), free(b2);
    check_items(dkt, q, true, w, false, 2, bshape, "dk^T: q^T g");
    kiln_tensor *ts[] = {q, k, w, kt, c, cw, loss, g[0], g[1], qt, dkt, dk};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
    free(qv), free(kv), free(wv);
  }
}

static bool equal_ignoring_case(const char *x, const char *y) {
  for (; *x && *y; x++, y++)
    if (tolower((unsigned char)*x) != tolower((unsigned char)*y)) return false;
  return *x == *y;
}

TEST(blas_core_is_reported) {
  /* one float product first, so a lazily loaded BLAS is loaded */
  const int64_t s[2] = {2, 2};
  kiln_tensor *a = kiln_ones(KILN_F32, 2, s), *p = kiln_matmul(a, a);
  const double twos[4] = {2, 2, 2, 2};
  CHECK_TENSOR(p, 2, s, twos, 0);
  kiln_release(p), kiln_release(a);

  const char *core = kiln_blas_core();
  CHECK(core != NULL);
  if (!core) return;
  printf("kiln_blas_core: %s\n", core);
  CHECK(core[0] != '\0');
  const char *want = getenv("KILN_OPENBLAS");
  if (want && !strcmp(want, "none")) { /* this run checks Kiln's own gemm */
    CHECK(!strcmp(core, "reference gemm"));
    return;
  }
  if (user_coretype[0] && !equal_ignoring_case(core, user_coretype))
    KTEST_FAIL("kiln_blas_core() = \"%s\", but OPENBLAS_CORETYPE = \"%s\"", core, user_coretype);
}

int main(void) {
  const char *env = getenv("OPENBLAS_CORETYPE");
  if (env) snprintf(user_coretype, sizeof user_coretype, "%s", env);
  RUN(matmul_2d_many_shapes_every_numeric_dtype);
  RUN(matmul_1d_times_2d_is_a_row_vector_product);
  RUN(matmul_2d_times_1d_is_a_column_vector_product);
  RUN(matmul_1d_times_1d_is_a_0d_dot_product);
  RUN(matmul_1d_with_batched_operand_broadcasts);
  RUN(matmul_batched_3d);
  RUN(matmul_batch_dims_broadcast);
  RUN(matmul_transposed_operands);
  RUN(matmul_batched_permuted_and_transposed_operands);
  RUN(matmul_sliced_operands);
  RUN(matmul_expanded_operands);
  RUN(matmul_mixed_dtypes_promote);
  RUN(matmul_i32_is_i32_and_wraps);
  RUN(matmul_i64_is_exact_beyond_2_pow_53);
  RUN(matmul_larger_integer_products_are_exact);
  RUN(matmul_larger_f64_product_is_accurate);
  RUN(matmul_k0_gives_zeros);
  RUN(matmul_empty_m_or_n_gives_empty_result);
  RUN(matmul_error_inner_dims_mismatch_names_both_shapes);
  RUN(matmul_error_bool_rejected);
  RUN(matmul_error_0d_operand_rejected);
  RUN(matmul_of_null_returns_null_and_keeps_first_error);
  RUN(matmul_512_f32_matches_naive_loop_on_samples);
  RUN(matmul_short_products_are_fma_chains_over_k);
  RUN(gemm_f32_packed_once_equals_packed_per_call_across_k_chunks);
  RUN(matmul_repeated_with_fresh_data_stays_correct);
  RUN(matmul_result_feeds_elementwise_ops);
  RUN(matmul_batched_is_one_blas_call_and_each_item_keeps_its_bits);
  RUN(matmul_batched_backward_is_one_blas_call_per_gradient);
  RUN(blas_core_is_reported);
  return ktest_done();
}
