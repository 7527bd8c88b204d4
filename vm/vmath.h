/* vmath.h — Kiln's f32 transcendentals in plain C: the same polynomials and
 * the same steps, fma for fma, as the IR jit_cpu/math.c emits into compiled
 * kernels, so the interpreter computes what compiled code computes, bit for
 * bit (DESIGN §5).  Accuracy, special values and the reasons for each step:
 * jit_cpu/math.c and math.h.  Change one, change the other: test_jit_math
 * compares them bitwise over dense samples of every float, with and without
 * fma.
 *
 * Included by vm/kern_math.c once per variant: VMATH_FMA 1 (explicit fma,
 * what kernels compiled for x86-64-v3 and up use) or 0 (separate multiply
 * and add).  Each function becomes NAME_fma or NAME_plain.  Selects are ?:
 * on computed values (GCC if-converts them, as it does the kernels' bit
 * selects); never build this with -ffast-math or fp contraction. */
#ifndef VMATH_FMA
#error "define VMATH_FMA (0 or 1) before including vmath.h"
#endif

#include <stdint.h>
#include <string.h>

#undef VMATH_FN
#undef FMADDF
#undef FMADD
#if VMATH_FMA
#define VMATH_FN(name) name##_fma
#define FMADDF(a, b, c) __builtin_fmaf(a, b, c)
#define FMADD(a, b, c) __builtin_fma(a, b, c)
#else
#define VMATH_FN(name) name##_plain
#define FMADDF(a, b, c) ((a) * (b) + (c))
#define FMADD(a, b, c) ((a) * (b) + (c))
#endif
#ifndef VMATH_ATTR
#define VMATH_ATTR
#endif
#define VMATH_DEF static inline __attribute__((always_inline)) VMATH_ATTR

#ifndef VMATH_COMMON
#define VMATH_COMMON
/* constants as jit_cpu/math.c makes them: a double rounded to float */
#define KF(v) ((float)(v))
static inline uint32_t vm_fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float vm_ffrom(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static inline uint64_t vm_dbits(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return u;
}
static inline double vm_dfrom(uint64_t u) {
  double x;
  memcpy(&x, &u, 8);
  return x;
}
/* 2^n for int32 n in [-126, 127] */
static inline float vm_pow2i_f(int32_t n) { return vm_ffrom((uint32_t)(n + 127) << 23); }
static inline float vm_with_sign_of(float res, float x) {
  return vm_ffrom(vm_fbits(res) | (vm_fbits(x) & 0x80000000u));
}
static inline float vm_clampf(float x, float lo, float hi) {
  float v = x;
  v = x > hi ? hi : v;
  v = x < lo ? lo : v;
  return v;
}
static inline double vm_clampd(double x, double lo, double hi) {
  double v = x;
  v = x > hi ? hi : v;
  v = x < lo ? lo : v;
  return v;
}
#define VM_NELEM(a) ((int)(sizeof a / sizeof a[0]))
#endif

/* c[0]*x^(n-1) + ... + c[n-1], Horner, constants rounded to float */
VMATH_DEF float VMATH_FN(vm_hornerf)(float x, const double *c, int n) {
  float p = KF(c[0]);
  for (int i = 1; i < n; i++) p = FMADDF(p, x, KF(c[i]));
  return p;
}
VMATH_DEF double VMATH_FN(vm_horner)(double x, const double *c, int n) {
  double p = c[0];
  for (int i = 1; i < n; i++) p = FMADD(p, x, c[i]);
  return p;
}
#define HORNERF(x, arr) VMATH_FN(vm_hornerf)(x, arr, VM_NELEM(arr))
#define HORNERD(x, arr) VMATH_FN(vm_horner)(x, arr, VM_NELEM(arr))

/* exp_core_f2: e^x with its rounding error (*lo_out, when asked) */
VMATH_DEF float VMATH_FN(vm_exp_core_f2)(float x, float *lo_out) {
  static const double P[] = {1.9890988187398762e-4, 1.393364742398262e-3, 8.33331048488617e-3,
                             4.166646674275398e-2,  0.1666666716337204,   0.5};
  const float magic = KF(12582912.0);
  float t = x * KF(1.44269504088896341) + magic;
  float n = t - magic;
  int32_t ni = (int32_t)(vm_fbits(t) - 0x4B400000u);
  float r1 = x - n * KF(0.693359375);
  float c = n * KF(-2.12194440e-4);
  float r = r1 - c;
  float r_lo = (r1 - r) - c;
  float z = r * r;
  float p = HORNERF(r, P);
  float hi = KF(1) + r;
  float lo = (KF(1) - hi) + r;
  float l = (lo + r_lo) + p * z;
  float y = hi + l;
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  float s1 = vm_pow2i_f(n1), s2 = vm_pow2i_f(n2);
  if (lo_out) {
    float y_lo = (hi - y) + l;
    *lo_out = (y_lo * s1) * s2;
  }
  return (y * s1) * s2;
}

VMATH_DEF float VMATH_FN(vm_exp_core_f)(float x, int wide) {
#if !VMATH_FMA
  (void)wide;
  return VMATH_FN(vm_exp_core_f2)(x, 0);
#else
  static const double P[] = {1.9890988187398762e-4, 1.393364742398262e-3, 8.33331048488617e-3,
                             4.166646674275398e-2,  0.1666666716337204,   0.5};
  const float magic = KF(12582912.0);
  float t = FMADDF(x, KF(1.44269504088896341), magic);
  float n = t - magic;
  int32_t ni = (int32_t)(vm_fbits(t) - 0x4B400000u);
  float r = FMADDF(n, KF(-0.693359375), x);
  r = FMADDF(n, KF(2.12194440e-4), r);
  float p = HORNERF(r, P);
  float hi = KF(1) + r;
  float lo = (KF(1) - hi) + r;
  float y = hi + FMADDF(r * r, p, lo);
  if (!wide) return y * vm_pow2i_f(ni);
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  return (y * vm_pow2i_f(n1)) * vm_pow2i_f(n2);
#endif
}

VMATH_DEF float VMATH_FN(vm_expf)(float x) {
  return VMATH_FN(vm_exp_core_f)(vm_clampf(x, KF(-104), KF(89)), 1);
}

/* log_core_f: x1p_on selects log1p's form (x = 1 + x1p) */
VMATH_DEF float VMATH_FN(vm_log_core_f)(float x, int denormals, int x1p_on, float x1p) {
  static const double P[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                             -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                             2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
  float xs = x;
  int32_t kadj = 0;
  if (denormals) {
    int tiny = x < KF(1.17549435e-38);
    xs = tiny ? x * KF(8388608.0) : x;
    kadj = tiny ? -23 : 0;
  }
  uint32_t u = vm_fbits(xs);
  int32_t k = (int32_t)(u >> 23) - 126 + kadj;
  float mant = vm_ffrom((u & 0x007FFFFFu) | 0x3F000000u);
  float fk = (float)k;
  float f = mant - KF(1);
  int small = mant < KF(0.707106781186547524);
  fk = small ? fk - KF(1) : fk;
  f = small ? (mant + mant) - KF(1) : f;
  float c = 0;
  if (x1p_on) {
    int in = (x1p > KF(-0.29289321881345248)) & (x1p < KF(0.41421356237309505));
    f = in ? x1p : f;
    fk = in ? KF(0) : fk;
    float cv = (x1p - (x - KF(1))) / x;
    c = in ? KF(0) : cv;
  }
  float z = f * f;
  float p = HORNERF(f, P);
  float y = (p * f) * z;
  if (x1p_on) y = y + c;
  y = y + fk * KF(-2.12194440e-4);
  y = y + KF(-0.5) * z;
  float res = (f + y) + fk * KF(0.693359375);
  res = !(x >= KF(0)) ? __builtin_nanf("") : res;
  res = x == KF(0) ? -__builtin_inff() : res;
  res = x == __builtin_inff() ? __builtin_inff() : res;
  return res;
}

VMATH_DEF float VMATH_FN(vm_logf)(float x) { return VMATH_FN(vm_log_core_f)(x, 1, 0, 0); }

VMATH_DEF float VMATH_FN(vm_tanhf)(float x) {
  static const double P[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                             1.33314422036E-1, -3.33332819422E-1};
  float ax = __builtin_fabsf(x);
  float z = ax * ax;
  float p = HORNERF(z, P);
  float small = (p * z) * ax + ax;
  float a = ax > KF(10) ? KF(10) : ax;
  float ex = VMATH_FN(vm_exp_core_f)(a + a, 0);
  float res = KF(1) - KF(2) / (ex + KF(1));
  res = ax < KF(0.625) ? small : res;
  return vm_with_sign_of(res, x);
}

VMATH_DEF float VMATH_FN(vm_sigmoidf)(float x) {
  float a = -__builtin_fabsf(x);
  a = a < KF(-104) ? KF(-104) : a;
  float t = VMATH_FN(vm_exp_core_f)(a, 1);
  float num = x < KF(0) ? t : KF(1);
  return num / (KF(1) + t);
}

VMATH_DEF float VMATH_FN(vm_expm1f)(float x) {
  static const double G[] = {1.423194134986261e-06,  2.500498158042319e-05, 1.994022895814851e-04,
                             1.3888514367863536e-03, 8.33315122872591e-03,  4.16666679084301e-02,
                             1.666666716337204e-01};
  float ax = __builtin_fabsf(x);
  float g = HORNERF(x, G);
  float z = x * x;
  float small = x + z * (KF(0.5) + x * g);
  float E_lo;
  float E = VMATH_FN(vm_exp_core_f2)(vm_clampf(x, KF(-30), KF(89)), &E_lo);
  float s = E - KF(1);
  float err = E - (s + KF(1));
  err = E >= KF(1) ? (E - s) - KF(1) : err;
  float res = s + (err + E_lo);
  res = E == __builtin_inff() ? __builtin_inff() : res;
  res = ax < KF(0.35) ? small : res;
  res = ax < KF(0x1p-25) ? x : res;
  return res;
}

VMATH_DEF float VMATH_FN(vm_log1pf)(float x) {
  float u = KF(1) + x;
  float res = VMATH_FN(vm_log_core_f)(u, 0, 1, x);
  return x == KF(0) ? x : res;
}

VMATH_DEF float VMATH_FN(vm_erff)(float x) {
  static const double Q[] = {8.37010084069334e-05,  -0.0008142704609781504, 0.005201032385230064,
                             -0.026859398931264877, 0.11283695697784424,    -0.37612634897232056,
                             0.12837916612625122};
  static const double P[] = {0.0001947334094438702,  -0.003031590487807989, 0.02218136005103588,
                             -0.10383883118629456,   -0.6372858285903931,   -1.1276154518127441,
                             -0.00020992521604057401};
  float ax = __builtin_fabsf(x);
  float z = ax * ax;
  float small = ax + ax * HORNERF(z, Q);
  float a = ax > KF(3.93) ? KF(3.93) : ax;
  float lg = HORNERF(a, P);
  float E_lo;
  float E = VMATH_FN(vm_exp_core_f2)(lg, &E_lo);
  float s = KF(1) - E;
  float s_err = (KF(1) - s) - E;
  float res = s + (s_err - E_lo);
  res = ax < KF(0.921875) ? small : res;
  return vm_with_sign_of(res, x);
}

VMATH_DEF float VMATH_FN(vm_sincosf)(float x, int is_cos) {
  static const double S[] = {2.724939007605605e-06, -0.0001984008271761515, 0.008333331867593243,
                             -0.16666666663838375};
  static const double C[] = {2.4463215389755764e-05, -0.0013887584885816234, 0.041666650569649716,
                             -0.4999999996894482};
  const double P1 = 0x1.921fb5p+0, P2 = 0x1.110b46p-26, P3 = 0x1.1a62633145c07p-54;
  double xd = (double)x;
  const double magic = 6755399441055744.0;
  double k = xd * 0.636619772367581343 + magic;
  double j = k - magic;
  uint32_t q = (uint32_t)vm_dbits(k);
  if (is_cos) q = q + 1;
  double r = xd - j * P1;
  r = r - j * P2;
  r = r - j * P3;
  double z = r * r;
  double s = r * (1.0 + z * HORNERD(z, S));
  double c = 1.0 + z * HORNERD(z, C);
  double v = (q & 1) ? c : s;
  v = ((q >> 1) & 1) ? -v : v;
  v = v > 1.0 ? 1.0 : v;
  v = v < -1.0 ? -1.0 : v;
  return (float)v;
}

VMATH_DEF float VMATH_FN(vm_sinf)(float x) { return VMATH_FN(vm_sincosf)(x, 0); }
VMATH_DEF float VMATH_FN(vm_cosf)(float x) { return VMATH_FN(vm_sincosf)(x, 1); }

VMATH_DEF double VMATH_FN(vm_log_d_of_f)(float ax) {
  static const double A[] = {2.0 / 13, 2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3};
  int tiny = ax < KF(1.17549435e-38);
  float xv = tiny ? ax * KF(8388608.0) : ax;
  int32_t ka = tiny ? -23 : 0;
  uint32_t u = vm_fbits(xv);
  int32_t k = ((int32_t)(u >> 23) - 127) + ka;
  float mant = vm_ffrom((u & 0x007FFFFFu) | 0x3F800000u);
  int big = mant > KF(1.41421356237309505);
  k = big ? k + 1 : k;
  mant = big ? mant * KF(0.5) : mant;
  double f = (double)mant - 1.0;
  double s = f / (2.0 + f);
  double z = s * s;
  double logm = (s + s) + (s * z) * HORNERD(z, A);
  return (double)k * 0.693147180559945309 + logm;
}

VMATH_DEF float VMATH_FN(vm_exp_d_to_f)(double t) {
  static const double T[] = {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                             1.0 / 24,     1.0 / 6,     0.5,        1,         1};
  double tc = vm_clampd(t, -200, 200);
  const double magic = 6755399441055744.0;
  double k = tc * 1.44269504088896340736 + magic;
  double n = k - magic;
  double r = tc - n * 6.93147180369123816490e-01;
  r = r - n * 1.90821492927058770002e-10;
  double p = HORNERD(r, T);
  int32_t ni = (int32_t)(uint32_t)vm_dbits(k);
  uint64_t e2 = (uint64_t)(int64_t)(ni + 1023) << 52;
  return (float)(p * vm_dfrom(e2));
}

VMATH_DEF float VMATH_FN(vm_powf)(float x, float y) {
  float ax = __builtin_fabsf(x), ay = __builtin_fabsf(y);
  double l = VMATH_FN(vm_log_d_of_f)(ax);
  float res = VMATH_FN(vm_exp_d_to_f)((double)y * l);
  int yneg = y < KF(0);
  float zr = yneg ? __builtin_inff() : KF(0), ir = yneg ? KF(0) : __builtin_inff();
  res = ax == KF(0) ? zr : res;
  res = ax == __builtin_inff() ? ir : res;
  res = ((x != x) | (y != y)) ? __builtin_nanf("") : res;
  float yc = !(ay < KF(1073741824.0)) ? KF(1073741824.0) : ay;
  int32_t iy = (int32_t)yc;
  int is_int = (float)iy == yc;
  uint32_t flip = ((uint32_t)iy & (vm_fbits(x) >> 31)) & (uint32_t)is_int;
  res = flip ? -res : res;
  int bad = (x < KF(0)) & (x > -__builtin_inff()) & !is_int;
  res = bad ? __builtin_nanf("") : res;
  int one = (y == KF(0)) | (x == KF(1));
  int m1 = (x == KF(-1)) & (ay == __builtin_inff());
  res = (one | m1) ? KF(1) : res;
  return res;
}
