/* test_jit_fuzz.c — compiled kernels must compute what the interpreter
 * computes (DESIGN §4-§6, docs/SEMANTICS.md): a differential fuzz test of
 * the CPU JIT.
 *
 * This process makes no Kiln call.  It re-executes itself (readlink
 * /proc/self/exe, fork + execve with a prepared environment) twice per batch
 * of seeded random programs: once with KILN_JIT=0 (the pure interpreter, the
 * reference) and once with KILN_JIT=1 KILN_HOT=1 KILN_PAYOFF=0 KILN_ASYNC=0
 * and an empty KILN_CACHE_DIR (every trace is planned on first sight and its
 * kernels are compiled inline: KILN_HOT alone is only the floor under the
 * payoff rule, which declines small traces).  Both children make the same Kiln calls — the
 * generator looks only at shapes, dtypes and its own bookkeeping, never at values — and print the
 * raw bytes of every result; the parent compares the two outputs value by value.  A child that dies
 * is reported with the program it was in, and the rest of its batch runs in a new pair.
 *
 * The programs (8-20 ops over 2-4 leaves; tensors up to ~2000 elements, and
 * every 30th program ~2^16 so the thread pool splits kernels in mid-row):
 * every elementwise primitive and *_scalar op in every dtype it accepts,
 * broadcasting, where, clamp, comparisons and logical ops, casts between all
 * dtypes (float -> int saturation and NaN included), views feeding
 * elementwise ops (transposed / permuted, sliced with positive and negative
 * steps, expanded, reshaped; of fresh leaves, of pending values and of
 * materialized views), fills (full, arange, rand), host reads in the middle
 * (a later trace sees materialized, possibly strided, leaves), early
 * releases, and reductions, argmax, matmul, softmax / log_softmax /
 * logsumexp / layer_norm mixed in so compiled groups border interpreter
 * groups; gather, index_select, scatter_add (1-11 picks along the axis:
 * computed in place up to 8, by the interpreter's pass past that) and
 * concat along any axis, with index and part leaves of their own.  The results are the values no
 * later op used (the others stay inside the final flush's kernels) and the host reads.  Every
 * program but the large ones runs a second time with new leaf values and negated host scalars: the
 * same trace keys, so cached plans and kernels run again with new parameters.
 *
 * How values are compared: bit for bit, every value of every dtype (NaN
 * payloads and NaN signs aside: any NaN equals any NaN).  Kiln promises
 * that whether the JIT fired never changes a result (DESIGN §5,
 * docs/SEMANTICS.md): the interpreter and the kernels share one fold order
 * per reduction (vm/fold.h) and one algorithm per f32 transcendental
 * (vm/vmath.h = jit_cpu/math.c).  So the generator no longer avoids any
 * call: discontinuous ops (comparisons, floor/round, casts, argmax, pow
 * exponents) take any inputs, reductions and transcendentals feed anything.
 * (The value model that once bounded how far the runs could drift apart is
 * kept for its magnitude bounds; its difference parts are zero.)  Fuzz
 * pairs run their two children on different thread counts (1, 2, 4 against
 * 4, 1, 2), so results are also checked to be independent of it.
 *
 * The JIT run of each batch must compile plans and leave work to compiled
 * kernels (fewer interpreter ops than the reference, which never compiles).
 * Directed tests run the same way: W1's tanh(x*y + 0.5) * sigmoid(x) -
 * y*y*0.25 on 2^20 f32 (and that it compiles); float -> int32/int64/bool
 * casts of NaN, +-inf, +-3e9, +-2.7 and the int32/int64 limits (exact, and
 * as SEMANTICS.md says); transposed, stride-2, reversed, expanded and
 * materialized-strided inputs of one compiled kernel (exact, against C);
 * algebraic identities on special values (x+0, x*1, x-x, exp(log x), ...); a
 * 2^16 broadcast kernel; every op on every dtype (so coverage does not hang
 * on the seeds); and regressions of what this test found: signed zeros,
 * rsqrt(+0) and evaluation order in kernels planned beside a reduction, a
 * view of a value fused into a reduction's group, and back-to-back pooled
 * kernels (a thread pool race).
 *
 * The GPU fuzz (KILN_FUZZ_DEVICE=cuda; in CI on the emulated device,
 * test_jit_fuzz_cuda_emulated) runs three children per batch, all making
 * the same calls: the GPU's op-by-op kernels (KILN_DEVICE=cuda
 * KILN_JIT=0, the reference), its fused kernels (KILN_DEVICE=cuda, the JIT
 * as above) and the CPU interpreter.  Fused against op by op: bit for bit,
 * everything.  Fused against the CPU: bit for bit too, but for results
 * computed through CUDA's libm or cuBLAS (their names end in "~": the GPU
 * runs another algorithm there, docs/SEMANTICS.md), compared by dtype and
 * shape.  The directed tests run too, but the thread-pool stress; of them
 * only the op sweep is compared with the CPU (the others check their exact
 * values against C's in the child).
 *
 *   KILN_FUZZ_PROGRAMS=n   programs (default 200)    KILN_FUZZ_FIRST=s  first seed (1)
 *   KILN_FUZZ_SEED=s       just that program         KILN_FUZZ_STATS=1  coverage table
 *   KILN_FUZZ_JOBS=j       children at once          KILN_FUZZ_KEEP=1   keep the outputs
 *   KILN_FUZZ_DEVICE=cuda  the GPU fuzz              KILN_FUZZ_TIME=1   directed tests' times
 *   KILN_FUZZ_DIRECTED=0   random programs only (the per-OpenBLAS-core runs)
 *   KILN_FUZZ_NO_PENDING_VIEWS=1  no views of values computed in the same
 *                          trace (triage: to look past a known crash there)
 * A child alone: ./test_jit_fuzz --child fuzz <first> <count> (or directed),
 * with the environment of either run. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ktest.h"

extern char **environ;

#define TOL_F32 1e-5
#define TOL_F64 1e-12
#define ULPS_PER_CALL 4.0 /* charged to one approximated math function */

/* --- deterministic generator: splitmix64 ------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t sm_next(uint64_t *s) { return ktest_splitmix64(s); }
static int rn(uint64_t *s, int n) { return n <= 1 ? 0 : (int)(sm_next(s) % (uint64_t)n); }
static int rr(uint64_t *s, int lo, int hi) { return lo + rn(s, hi - lo + 1); } /* inclusive */
static bool coin(uint64_t *s, int pct) { return rn(s, 100) < pct; }

/* --- dtypes and shapes ------------------------------------------------------- */

#define NDT 10 /* the dtypes, in enum order */
static const char *const DT_NAME[NDT] = {"bool", "i32", "i64", "f32", "f64",
                                         "bf16", "f16", "u8",  "i8",  "i16"};

static size_t dt_size(kiln_dtype dt) { return ktest_dtype_size(dt); }
static bool dt_half(kiln_dtype dt) { return dt == KILN_BF16 || dt == KILN_F16; }
static bool dt_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64 || dt_half(dt); }
/* PyTorch's order: bool < (u8 | i8) < i16 < i32 < i64 < (bf16 | f16) < f32 < f64;
   bf16 with f16: f32, u8 with i8: i16 */
static kiln_dtype promote(kiln_dtype a, kiln_dtype b) {
  static const int rank[NDT] = {0, 3, 4, 6, 7, 5, 5, 1, 1, 2};
  if (a == b) return a;
  if (rank[a] == rank[b]) return dt_half(a) ? KILN_F32 : KILN_I16;
  return rank[a] > rank[b] ? a : b;
}
static double dt_tol(kiln_dtype dt) { return dt == KILN_F64 ? TOL_F64 : TOL_F32; }
static double dt_u(kiln_dtype dt) { return dt == KILN_F64 ? 0x1p-53 : 0x1p-24; }
/* an absolute difference below the normal range (denormal results) */
static double dt_tiny(kiln_dtype dt) { return dt == KILN_F64 ? 4 * DBL_MIN : 4 * (double)FLT_MIN; }
static double dt_imax(kiln_dtype dt) {
  return dt == KILN_BOOL  ? 1
         : dt == KILN_U8  ? 256
         : dt == KILN_I8  ? 128
         : dt == KILN_I16 ? 32768
         : dt == KILN_I32 ? 2147483648.0
                          : 9.3e18;
}
static double dt_fmax(kiln_dtype dt) {
  return dt == KILN_F64 ? DBL_MAX : dt == KILN_F16 ? 65504.0 : FLT_MAX;
}

static int dt_parse(const char *s) {
  for (int i = 0; i < NDT; i++)
    if (!strcmp(s, DT_NAME[i])) return i;
  return -1;
}

static int64_t shape_numel(int nd, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= s[i];
  return n;
}

static void fmt_shape(char *buf, size_t n, int nd, const int64_t *s) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < nd && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, i ? ",%lld" : "%lld", (long long)s[i]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

/* numpy broadcasting of two shapes */
static bool bshape(int na, const int64_t *sa, int nb, const int64_t *sb, int *no, int64_t *so) {
  int n = na > nb ? na : nb;
  if (n > KILN_MAX_DIMS) return false;
  for (int i = 0; i < n; i++) {
    int64_t x = i < na ? sa[na - 1 - i] : 1, y = i < nb ? sb[nb - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return false;
    so[n - 1 - i] = x == 1 ? y : x;
  }
  *no = n;
  return true;
}

/* ============================================================================
 * The child: programs, the value model, output
 * ========================================================================== */

/* --- the value model -----------------------------------------------------------
 * For every value: |finite element| <= mf, and the two runs differ by at most
 * r*|b| + a per element (r = a = 0: bit-identical).  Deliberately simple and
 * conservative; 0 * inf counts as 0. */

typedef struct {
  double mf, r, a;
} num;

/* Kiln guarantees bit-identical results (DESIGN §5, docs/SEMANTICS.md): the
   two runs never differ, so every value's difference parts are 0 and every
   result is compared bit for bit.  The op models below still say how the
   runs would drift apart if an op broke that promise (and bound magnitudes,
   which the generator uses); mk() keeps only the magnitude. */
static num mk(double mf, double r, double a) {
  (void)r;
  (void)a;
  num n = {mf, 0, 0};
  return n;
}
static bool is_exact(num x) { return x.r == 0 && x.a == 0; }
static double mulz(double x, double y) { return x == 0 || y == 0 ? 0 : x * y; }
static double abs_err(num x) { return mulz(x.r, x.mf) + x.a; }
/* whether a result of dtype dt with this bound can be compared */
static bool within(num x, kiln_dtype dt) {
  if (!dt_float(dt)) return is_exact(x);
  return x.r + x.a <= dt_tol(dt) / 2; /* NaN bounds fail */
}
static double bound_of(num x) { return x.r + x.a; }

/* --- op tables ------------------------------------------------------------------ */

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
typedef kiln_tensor *(*scalar_fn)(kiln_tensor *, double);
typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);

enum {
  U_NEG,
  U_ABS,
  U_EXP,
  U_LOG,
  U_SQRT,
  U_RSQRT,
  U_SIN,
  U_COS,
  U_TANH,
  U_SIGMOID,
  U_RELU,
  U_GELU,
  U_ERF,
  U_LOG1P,
  U_EXPM1,
  U_FLOOR,
  U_CEIL,
  U_ROUND,
  U_SIGN,
  U_NOT,
  N_UNARY
};
static const struct {
  const char *name;
  unary_fn f;
} UNARY[N_UNARY] = {
    {"neg", kiln_neg},     {"abs", kiln_abs},
    {"exp", kiln_exp},     {"log", kiln_log},
    {"sqrt", kiln_sqrt},   {"rsqrt", kiln_rsqrt},
    {"sin", kiln_sin},     {"cos", kiln_cos},
    {"tanh", kiln_tanh},   {"sigmoid", kiln_sigmoid},
    {"relu", kiln_relu},   {"gelu", kiln_gelu},
    {"erf", kiln_erf},     {"log1p", kiln_log1p},
    {"expm1", kiln_expm1}, {"floor", kiln_floor},
    {"ceil", kiln_ceil},   {"round", kiln_round},
    {"sign", kiln_sign},   {"logical_not", kiln_logical_not},
};

enum {
  B_ADD,
  B_SUB,
  B_MUL,
  B_DIV,
  B_POW,
  B_MAX,
  B_MIN,
  B_EQ,
  B_NE,
  B_LT,
  B_LE,
  B_GT,
  B_GE,
  B_AND,
  B_OR,
  N_BINARY
};
static const struct {
  const char *name;
  binary_fn f;
} BINARY[N_BINARY] = {
    {"add", kiln_add},
    {"sub", kiln_sub},
    {"mul", kiln_mul},
    {"div", kiln_div},
    {"pow", kiln_pow},
    {"maximum", kiln_maximum},
    {"minimum", kiln_minimum},
    {"eq", kiln_eq},
    {"ne", kiln_ne},
    {"lt", kiln_lt},
    {"le", kiln_le},
    {"gt", kiln_gt},
    {"ge", kiln_ge},
    {"logical_and", kiln_logical_and},
    {"logical_or", kiln_logical_or},
};

enum { S_ADD, S_SUB, S_MUL, S_DIV, S_POW, N_SCALAR };
static const struct {
  const char *name;
  scalar_fn f;
} SCALAR[N_SCALAR] = {
    {"add_scalar", kiln_add_scalar}, {"sub_scalar", kiln_sub_scalar},
    {"mul_scalar", kiln_mul_scalar}, {"div_scalar", kiln_div_scalar},
    {"pow_scalar", kiln_pow_scalar},
};

enum { R_SUM, R_MEAN, R_PROD, R_MAX, R_MIN, N_REDUCE };
static const struct {
  const char *name;
  reduce_fn f;
} REDUCE[N_REDUCE] = {
    {"sum", kiln_sum}, {"mean", kiln_mean}, {"prod", kiln_prod},
    {"max", kiln_max}, {"min", kiln_min},
};

static bool unary_is_math(int fn) {
  return (fn >= U_EXP && fn <= U_SIGMOID) || (fn >= U_GELU && fn <= U_EXPM1);
}
static kiln_dtype unary_out(int fn, kiln_dtype in) {
  if (fn == U_NOT) return KILN_BOOL;
  return unary_is_math(fn) && !dt_float(in) ? KILN_F32 : in;
}
static kiln_dtype binary_out(int fn, kiln_dtype a, kiln_dtype b) {
  kiln_dtype p = promote(a, b);
  if (fn >= B_EQ) return KILN_BOOL;
  return fn == B_DIV && !dt_float(p) ? KILN_F32 : p;
}
static kiln_dtype scalar_out(kiln_dtype in) { return dt_float(in) ? in : KILN_F32; }
static kiln_dtype reduce_out(int fn, kiln_dtype in) {
  if (dt_float(in)) return in;
  return fn == R_SUM || fn == R_PROD ? KILN_I64 : fn == R_MEAN ? KILN_F32 : in;
}

/* --- the model of each op (false: the call could make the runs differ by more
   than the tolerance, or the op is discontinuous at an inexact input) ------------ */

static bool model_unary(int fn, num x, kiln_dtype out, num *o) {
  double u = dt_u(out), k = ULPS_PER_CALL * u, tiny = dt_tiny(out), A = abs_err(x);
  double under = out == KILN_F64 ? 700 : 80;   /* exp(-under) is near the denormals */
  double logmax = out == KILN_F64 ? 745 : 104; /* |log| of the smallest denormal */
  bool ex = is_exact(x);
  switch (fn) {
    case U_NEG:
    case U_ABS:
    case U_RELU:
      *o = x;
      return true;
    case U_SIGN:
    case U_NOT:
      *o = mk(1, 0, 0);
      return ex;
    case U_FLOOR:
    case U_CEIL:
    case U_ROUND:
      *o = mk(x.mf + 1, 0, 0);
      return ex;
    case U_SQRT:
    case U_RSQRT: /* correctly rounded in both runs */
      *o = mk(fn == U_SQRT ? sqrt(x.mf) : INFINITY, ex ? 0 : x.r / 2 + u, 0);
      return ex || x.a == 0;
    case U_EXP:
      *o = mk(x.mf > 709 ? INFINITY : exp(x.mf), k + (ex ? 0 : A), x.mf >= under ? tiny : 0);
      return ex || x.mf <= under;
    case U_EXPM1:
      *o = mk(x.mf > 709 ? INFINITY : expm1(x.mf), k + (ex ? 0 : (1 + x.mf) * x.r + x.a), 0);
      return ex || x.mf <= under;
    case U_LOG:
      *o = mk(fmax(fabs(log(x.mf)), logmax), k, x.r);
      return ex || x.a == 0;
    case U_LOG1P:
      if (ex) {
        *o = mk(fmax(log1p(x.mf), logmax), k, 0);
        return true;
      }
      *o = mk(0.7, k, 2 * A);
      return x.mf <= 0.5;
    case U_SIN:
    case U_COS: /* the compiled range reduction is documented to 2^27*pi/2 */
      *o = mk(1, 0, k + A);
      return x.mf <= 1e5;
    case U_TANH:
      *o = mk(1, k, 0.45 * x.r + x.a);
      return true;
    case U_SIGMOID:
      *o = mk(1, k, (x.mf >= under ? tiny : 0) + 0.23 * x.r + 0.25 * x.a);
      return true;
    case U_ERF:
      *o = mk(1, k, 0.49 * x.r + 1.13 * x.a);
      return true;
    case U_GELU:
      *o = mk(x.mf, 2 * k + 1.2 * x.r, k * (1 + fmin(x.mf, 10)) + 1.13 * x.a);
      return true;
  }
  return false;
}

static bool model_binary(int fn, num x, num y, kiln_dtype out, num *o) {
  bool ex = is_exact(x) && is_exact(y);
  double u = dt_u(out);
  if (fn >= B_EQ) {
    *o = mk(1, 0, 0);
    return ex;
  }
  if (!dt_float(out)) { /* integer arithmetic wraps, exactly in both runs */
    double m = fn == B_ADD || fn == B_SUB   ? x.mf + y.mf
               : fn == B_MUL || fn == B_POW ? INFINITY
                                            : fmax(x.mf, y.mf);
    *o = mk(fmin(m, dt_imax(out)), 0, 0);
    return ex;
  }
  switch (fn) {
    case B_ADD:
    case B_SUB:
      *o = ex ? mk(x.mf + y.mf, 0, 0) : mk(x.mf + y.mf, u, abs_err(x) + abs_err(y));
      return true;
    case B_MUL:
      *o = ex ? mk(x.mf * y.mf, 0, 0)
              : mk(x.mf * y.mf, x.r + y.r + u, mulz(x.a, y.mf) + mulz(y.a, x.mf) + mulz(x.a, y.a));
      return true;
    case B_DIV:
      *o = mk(INFINITY, ex ? 0 : x.r + y.r + u, 0);
      return ex || (x.a == 0 && y.a == 0);
    case B_POW: /* the exponent must be exact: pow(-2, y) is NaN unless y is an integer */
      *o = mk(INFINITY, ULPS_PER_CALL * u + y.mf * x.r, dt_tiny(out));
      return is_exact(y) && (is_exact(x) || (x.a == 0 && y.mf <= 16));
    case B_MAX:
    case B_MIN:
      *o = mk(fmax(x.mf, y.mf), fmax(x.r, y.r), fmax(x.a, y.a));
      return true;
  }
  return false;
}

static bool model_scalar(int fn, num x, double s, kiln_dtype out, num *o) {
  bool ex = is_exact(x);
  double u = dt_u(out), as = fabs(s);
  switch (fn) {
    case S_ADD:
    case S_SUB:
      *o = ex ? mk(x.mf + as, 0, 0) : mk(x.mf + as, u, abs_err(x));
      return true;
    case S_MUL:
      *o = ex ? mk(mulz(x.mf, as), 0, 0) : mk(mulz(x.mf, as), x.r + u, mulz(x.a, as));
      return true;
    case S_DIV:
      *o = mk(as == 0 ? INFINITY : x.mf / as, ex ? 0 : x.r + u, as == 0 ? 0 : x.a / as);
      return ex || as != 0 || x.a == 0;
    case S_POW:
      *o =
          mk(s >= 0 ? pow(fmax(1, x.mf), s) : INFINITY, ULPS_PER_CALL * u + as * x.r, dt_tiny(out));
      return ex || (x.a == 0 && as <= 16);
  }
  return false;
}

/* n: elements reduced into each output */
static bool model_reduce(int fn, num x, int64_t n, kiln_dtype in, kiln_dtype out, num *o) {
  double u = dt_u(out), A = abs_err(x), dn = (double)n;
  if (!dt_float(out)) { /* integer sums and products wrap, exactly */
    double m = fn == R_SUM ? x.mf * dn : fn == R_PROD ? INFINITY : x.mf;
    *o = mk(fmin(m, dt_imax(out)), 0, 0);
    return true;
  }
  if (!dt_float(in)) { /* mean of integers: converted to float and summed in float */
    *o = mk(x.mf, u, 2 * mulz(u, x.mf));
    return true;
  }
  switch (fn) {
    case R_SUM:
      *o = mk(x.mf * dn, 0, 2 * dn * mulz(u, x.mf) + dn * A);
      return true;
    case R_MEAN:
      *o = mk(x.mf, u, 2 * mulz(u, x.mf) + A);
      return true;
    case R_PROD: { /* no overflow anywhere (inf * 0 is NaN in one order, 0 in another);
                      what underflows in one order only is below tiny * the product bound */
      double m = x.mf > 1 ? pow(x.mf, dn) : 1;
      *o = mk(m, (2 * dn + 1) * u + dn * x.r, dt_tiny(out) * m);
      return x.a == 0 && m <= (out == KILN_F64 ? 1e300 : 1e30);
    }
    default: /* max/min: the same value, but a zero result's sign may depend on the order */
      *o = mk(x.mf, x.r, fmax(x.a, 1e-300));
      return true;
  }
}

/* --- leaves ---------------------------------------------------------------------------- */

enum { VK_MOD, VK_SPECIAL, VK_POS, VK_NONFIN, VK_SMALL, VK_COUNT };
static const char *const VK_NAME[VK_COUNT] = {"moderate", "special", "positive", "nonfinite",
                                              "small"};

/* values that probe casts (saturation, NaN, truncation), rounding and overflow */
static const double SPECIAL[] = {
    0.0,
    -0.0,
    INFINITY,
    -INFINITY,
    NAN,
    1e-30,
    -1e30,
    1e30,
    65504.0,
    3e9,
    -3e9,
    2.7,
    -2.7,
    0.5,
    -0.5,
    1.5,
    2.5,
    -2.5,
    2147483520.0,
    2147483648.0,
    -2147483648.0,
    -2147483904.0,
    9.3e18,
    -9.3e18,
    9223372036854775808.0,
    -9223372036854775808.0,
    1e-40,
    16777217.0,
};
#define N_SPECIAL ((int)(sizeof SPECIAL / sizeof SPECIAL[0]))

static double leaf_mag(kiln_dtype dt, int vk) {
  static const double fm[VK_COUNT] = {6.25, 1e30, 4, 6.25, 1};
  switch (dt) {
    case KILN_BOOL:
      return 1;
    case KILN_I32:
      return vk == VK_SPECIAL ? 2147483648.0 : 5;
    case KILN_I64:
      return vk == VK_SPECIAL ? 9.3e18 : 5;
    case KILN_U8:
      return 255;
    case KILN_I8:
      return 128;
    case KILN_I16:
      return vk == VK_SPECIAL ? 32768 : 5;
    default:
      return fm[vk];
  }
}

static double moderate(uint64_t *s) {
  if (coin(s, 30)) return (double)(sm_next(s) >> 11) * 0x1p-53 * 8.0 - 4.0;
  return (rn(s, 201) - 100) / 16.0;
}

static double leaf_float(uint64_t *s, int vk) {
  static const double nonfinite[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0};
  switch (vk) {
    case VK_SPECIAL:
      return coin(s, 30) ? SPECIAL[rn(s, N_SPECIAL)] : moderate(s);
    case VK_POS:
      return rr(s, 4, 64) / 16.0;
    case VK_NONFIN:
      return coin(s, 10) ? nonfinite[rn(s, 5)] : moderate(s);
    case VK_SMALL:
      return (rn(s, 129) - 64) / 64.0;
    default:
      return moderate(s);
  }
}

static int64_t leaf_int(uint64_t *s, kiln_dtype dt, int vk) {
  if (vk == VK_SPECIAL && coin(s, 8)) {
    static const int64_t big32[] = {INT32_MAX, INT32_MIN, 1 << 20, -(1 << 20), 65537};
    static const int64_t big64[] = {INT64_MAX,           INT64_MIN, (int64_t)1 << 40,
                                    -((int64_t)1 << 40), INT32_MAX, (int64_t)INT32_MIN - 1};
    return dt == KILN_I32 ? big32[rn(s, 5)] : big64[rn(s, 6)];
  }
  return rr(s, -5, 5);
}

static kiln_tensor *make_leaf(kiln_dtype dt, int nd, const int64_t *shape, int vk, uint64_t seed) {
  int64_t n = shape_numel(nd, shape);
  unsigned char *buf = calloc((size_t)(n ? n : 1), 8);
  if (!buf) return NULL;
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case KILN_BOOL:
        buf[i] = (unsigned char)rn(&s, 2);
        break;
      case KILN_I32: {
        int32_t v = (int32_t)leaf_int(&s, dt, vk);
        memcpy(buf + i * 4, &v, 4);
        break;
      }
      case KILN_I64: {
        int64_t v = leaf_int(&s, dt, vk);
        memcpy(buf + i * 8, &v, 8);
        break;
      }
      case KILN_F32: {
        float v = (float)leaf_float(&s, vk);
        memcpy(buf + i * 4, &v, 4);
        break;
      }
      case KILN_F64: {
        double v = leaf_float(&s, vk);
        memcpy(buf + i * 8, &v, 8);
        break;
      }
      case KILN_BF16:
      case KILN_F16: {
        float f = (float)leaf_float(&s, vk);
        uint16_t v = dt == KILN_BF16 ? vm_f32_to_bf16(f) : vm_f32_to_f16(f);
        memcpy(buf + i * 2, &v, 2);
        break;
      }
      case KILN_U8:
        buf[i] = (unsigned char)rr(&s, 0, 255);
        break;
      case KILN_I8:
        buf[i] = (unsigned char)(int8_t)rr(&s, -128, 127);
        break;
      case KILN_I16: { /* small values, or the whole range (wraps) */
        int16_t v = (int16_t)(vk == VK_SPECIAL && coin(&s, 30) ? rr(&s, INT16_MIN, INT16_MAX)
                                                               : leaf_int(&s, dt, vk) % 6);
        memcpy(buf + i * 2, &v, 2);
        break;
      }
    }
  }
  kiln_tensor *t = kiln_from_data(buf, dt, nd, shape);
  free(buf);
  return t;
}

/* --- program records ----------------------------------------------------------------- */

enum {
  K_LEAF,
  K_VLEAF,
  K_UNARY,
  K_BINARY,
  K_SCALAR,
  K_WHERE,
  K_CLAMP,
  K_CAST,
  K_VIEW,
  K_REDUCE,
  K_ARG,
  K_MATMUL,
  K_NN,
  K_MOVE,
  K_READ,
  K_RELEASE,
  K_COUNT
};
static const int WEIGHT[K_COUNT] = {
    [K_LEAF] = 3,  [K_VLEAF] = 3, [K_UNARY] = 12, [K_BINARY] = 14, [K_SCALAR] = 8, [K_WHERE] = 3,
    [K_CLAMP] = 2, [K_CAST] = 4,  [K_VIEW] = 5,   [K_REDUCE] = 3,  [K_ARG] = 1,    [K_MATMUL] = 1,
    [K_NN] = 2,    [K_MOVE] = 3,  [K_READ] = 1,   [K_RELEASE] = 3,
};
/* K_MOVE: data movement along an axis, with index and part leaves of its own */
enum { MV_GATHER, MV_INDEX_SELECT, MV_SCATTER_ADD, MV_CONCAT, MV_COUNT };
static const char *const MOVE_NAME[MV_COUNT] = {"gather", "index_select", "scatter_add", "concat"};

enum { LV_DATA, LV_FULL, LV_ARANGE, LV_RAND, LV_RANDN };
enum { VS_PERMUTE, VS_TRANSPOSE, VS_SLICE, VS_EXPAND, VS_RESHAPE, VS_UNSQUEEZE, VS_SQUEEZE };
enum { NN_SOFTMAX, NN_LOG_SOFTMAX, NN_LOGSUMEXP, NN_LAYER_NORM };

typedef struct {
  int op, ax, ax2, nd;
  int64_t p[3];                 /* slice start, stop, step */
  int64_t shape[KILN_MAX_DIMS]; /* expand / reshape */
  int perm[KILN_MAX_DIMS];
} vstep;

typedef struct {
  int kind, fn, dst, nin, in[3];
  int niv, iv[KILN_MAX_DIMS];
  double dv[2];
  bool flag;
  kiln_dtype dt;
  int lmode, vk, lnd; /* leaves (and matmul's right operand) */
  int64_t lshape[KILN_MAX_DIMS];
  uint64_t vseed;
  int nv;
  vstep v[3]; /* views applied to the leaf (K_VLEAF) or the input (K_VIEW) */
  num model;  /* of the result */
  bool pending;
  char text[400];
} oprec;

#define TX(r, ...) \
  snprintf((r)->text + strlen((r)->text), sizeof(r)->text - strlen((r)->text), __VA_ARGS__)

#define MAXPOOL 24
#define MAXRECS 64

typedef struct {
  kiln_tensor *t;
  num v;
  int born;
  bool pending; /* computed since the last read of it (not a leaf) */
  /* computed through an op whose GPU algorithm is not the CPU's (libm's
     transcendentals on the device, cuBLAS): its name ends in "~", and the
     GPU fuzz compares it with the CPU's only as a value of the same shape */
  bool device_math;
} slot;

typedef struct {
  slot s[MAXPOOL];
  int bnd;
  int64_t base[KILN_MAX_DIMS];
  int64_t cap; /* no generated tensor gets larger (in elements) */
  bool large;
  uint64_t seed;
  int variant, nreads;
  FILE *out;
} prog;

#define ND(t) kiln_ndim(t)
#define SH(t) kiln_shape(t)
#define DT(t) kiln_dtype_of(t)

/* --- coverage: (op, input dtype) pairs executed ------------------------------------- */

#define MAXCOV 96
static struct {
  char name[48];
  long n[NDT];
} cov[MAXCOV];
static int ncov;

static void count_op(const char *name, kiln_dtype dt) {
  int i = 0;
  while (i < ncov && strcmp(cov[i].name, name)) i++;
  if (i == ncov) {
    if (ncov == MAXCOV) return;
    snprintf(cov[ncov++].name, sizeof cov[0].name, "%s", name);
  }
  cov[i].n[dt]++;
}

/* --- output --------------------------------------------------------------------------- */

static void put_hex(FILE *f, uint64_t v) {
  char b[18];
  int i = 17;
  b[i] = 0;
  do {
    b[--i] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  b[--i] = ' ';
  fputs(b + i, f);
}

/* "R name dtype shape bound n v0 v1 ...": raw bytes as hex integers; bound 0
   means the value must be bit-identical */
static bool emit(FILE *out, const char *name, kiln_tensor *t, double bound) {
  kiln_dtype dt = DT(t);
  int64_t n = kiln_numel(t);
  size_t es = dt_size(dt);
  unsigned char *buf = malloc((size_t)n * es + 8);
  if (kiln_to_buffer(t, buf, (size_t)n * es) < 0) {
    fprintf(out, "F %s: kiln_to_buffer failed: %s\n", name, kiln_last_error());
    free(buf);
    return false;
  }
  char sb[128];
  fmt_shape(sb, sizeof sb, ND(t), SH(t));
  fprintf(out, "R %s %s %s %.3g %lld", name, DT_NAME[dt], sb, bound, (long long)n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t v = 0;
    memcpy(&v, buf + (size_t)i * es, es);
    put_hex(out, v);
  }
  fputc('\n', out);
  free(buf);
  return true;
}

/* --- picking operands --------------------------------------------------------------- */

/* KILN_FUZZ_NO_PENDING_VIEWS=1 (a triage aid): no K_VIEW of a value computed
   in the pending trace, to look past a known crash there (views of fused
   values crashed twice while this test was written) */
static bool no_pending_views;

enum { PK_EXACT = 1, PK_FLOAT = 2, PK_NOBOOL = 4, PK_BOOL = 8, PK_ND1 = 16 };

static bool slot_ok(const prog *P, int j, int flags) {
  const slot *s = &P->s[j];
  if (!s->t) return false;
  kiln_dtype dt = DT(s->t);
  if ((flags & PK_EXACT) && !is_exact(s->v)) return false;
  if ((flags & PK_FLOAT) && !dt_float(dt)) return false;
  if ((flags & PK_NOBOOL) && dt == KILN_BOOL) return false;
  if ((flags & PK_BOOL) && dt != KILN_BOOL) return false;
  if ((flags & PK_ND1) && ND(s->t) == 0) return false;
  return true;
}

static int pick(const prog *P, uint64_t *g, int flags) {
  int o = rn(g, MAXPOOL);
  for (int k = 0; k < MAXPOOL; k++)
    if (slot_ok(P, (o + k) % MAXPOOL, flags)) return (o + k) % MAXPOOL;
  return -1;
}

/* a slot broadcasting with shape (nd, s) into at most cap elements */
static int pick_partner(const prog *P, uint64_t *g, int nd, const int64_t *s, int flags) {
  int o = rn(g, MAXPOOL), no = 0;
  int64_t so[KILN_MAX_DIMS];
  for (int k = 0; k < MAXPOOL; k++) {
    int j = (o + k) % MAXPOOL;
    if (slot_ok(P, j, flags) && bshape(nd, s, ND(P->s[j].t), SH(P->s[j].t), &no, so) &&
        shape_numel(no, so) <= P->cap)
      return j;
  }
  return -1;
}

static int free_slot(const prog *P, uint64_t *g) {
  int o = rn(g, MAXPOOL);
  for (int k = 0; k < MAXPOOL; k++)
    if (!P->s[(o + k) % MAXPOOL].t) return (o + k) % MAXPOOL;
  return -1;
}

static int pick_kind(uint64_t *g) {
  int total = 0;
  for (int k = 0; k < K_COUNT; k++) total += WEIGHT[k];
  int x = rn(g, total);
  for (int k = 0; k < K_COUNT; k++) {
    if (x < WEIGHT[k]) return k;
    x -= WEIGHT[k];
  }
  return K_LEAF;
}

static kiln_dtype rand_dtype(uint64_t *g) {
  static const kiln_dtype w[] = {KILN_F32, KILN_F32, KILN_F32, KILN_F32, KILN_F64,  KILN_F64,
                                 KILN_I32, KILN_I32, KILN_I64, KILN_I64, KILN_BOOL, KILN_BF16,
                                 KILN_F16, KILN_U8,  KILN_I8,  KILN_I16};
  return w[rn(g, (int)(sizeof w / sizeof w[0]))];
}

static double rand_scalar(uint64_t *g) {
  static const double v[] = {0, 1, -1, 2, 0.5, -0.5, 3, 0.99, 0.01, -2.5, 1e-3, 100, 0.1, 0.25};
  if (coin(g, 20)) return (rn(g, 2001) - 1000) / 137.0;
  return v[rn(g, (int)(sizeof v / sizeof v[0]))];
}

/* a shape that broadcasts to the program's base shape */
static int base_pattern(const prog *P, uint64_t *g, int64_t *out) {
  if (coin(g, 5)) return 0;
  int drop = coin(g, 25) ? rn(g, P->bnd) : 0, nd = P->bnd - drop;
  for (int d = 0; d < nd; d++) out[d] = coin(g, 25) ? 1 : P->base[drop + d];
  return nd;
}

/* --- views -------------------------------------------------------------------------- */

static void text_view(oprec *r, const vstep *v) {
  char sb[96];
  switch (v->op) {
    case VS_PERMUTE:
      TX(r, "permute(., {");
      for (int i = 0; i < v->nd; i++) TX(r, i ? ",%d" : "%d", v->perm[i]);
      TX(r, "})");
      break;
    case VS_TRANSPOSE:
      TX(r, "transpose(., %d, %d)", v->ax, v->ax2);
      break;
    case VS_SLICE:
      TX(r, "slice(., %d, %lld, %lld, %lld)", v->ax, (long long)v->p[0], (long long)v->p[1],
         (long long)v->p[2]);
      break;
    case VS_EXPAND:
    case VS_RESHAPE:
      fmt_shape(sb, sizeof sb, v->nd, v->shape);
      TX(r, "%s(., %s)", v->op == VS_EXPAND ? "expand" : "reshape", sb);
      break;
    case VS_UNSQUEEZE:
      TX(r, "unsqueeze(., %d)", v->ax);
      break;
    case VS_SQUEEZE:
      TX(r, "squeeze(., %d)", v->ax);
      break;
  }
}

static kiln_tensor *apply_view(kiln_tensor *t, const vstep *v) {
  switch (v->op) {
    case VS_PERMUTE:
      return kiln_permute(t, v->perm);
    case VS_TRANSPOSE:
      return kiln_transpose(t, v->ax, v->ax2);
    case VS_SLICE:
      return kiln_slice(t, v->ax, v->p[0], v->p[1], v->p[2]);
    case VS_EXPAND:
      return kiln_expand(t, v->nd, v->shape);
    case VS_RESHAPE:
      return kiln_reshape(t, v->nd, v->shape);
    case VS_UNSQUEEZE:
      return kiln_unsqueeze(t, v->ax);
    case VS_SQUEEZE:
      return kiln_squeeze(t, v->ax);
  }
  return NULL;
}

/* one step of a chain that ends in shape cur (nd dims): fills v and the shape
   `pre` it starts from; false if none fits */
static bool view_into(uint64_t *g, int nd, const int64_t *cur, vstep *v, int *pnd, int64_t *pre) {
  memset(v, 0, sizeof *v);
  memcpy(pre, cur, (size_t)nd * sizeof(int64_t));
  *pnd = nd;
  int choice = rn(g, 4);
  if (nd < 2 && choice <= 1) choice = 2 + rn(g, 2);
  if (nd == 0) return false;
  switch (choice) {
    case 0: /* permute: pre[perm[i]] = cur[i] */
      v->op = VS_PERMUTE;
      v->nd = nd;
      for (int i = 0; i < nd; i++) v->perm[i] = i;
      for (int i = nd - 1; i > 0; i--) {
        int j = rn(g, i + 1), t = v->perm[i];
        v->perm[i] = v->perm[j];
        v->perm[j] = t;
      }
      for (int i = 0; i < nd; i++) pre[v->perm[i]] = cur[i];
      return true;
    case 1: {
      v->op = VS_TRANSPOSE;
      v->ax = rn(g, nd);
      v->ax2 = (v->ax + 1 + rn(g, nd - 1)) % nd;
      pre[v->ax] = cur[v->ax2];
      pre[v->ax2] = cur[v->ax];
      if (coin(g, 30)) v->ax -= nd;
      return true;
    }
    case 2: { /* a strided slice with exactly cur[ax] elements */
      static const int steps[] = {2, 2, 3, -1, -2, -3};
      int ax = rn(g, nd);
      int64_t n = cur[ax], m = steps[rn(g, 6)], am = m < 0 ? -m : m, off = rn(g, 3),
              extra = rn(g, 3);
      v->op = VS_SLICE;
      v->ax = coin(g, 30) ? ax - nd : ax;
      v->p[2] = m;
      if (m > 0) {
        v->p[0] = off;
        v->p[1] = off + (n - 1) * m + 1 + rn(g, (int)m);
        pre[ax] = v->p[1] + rn(g, 3);
        if (coin(g, 30)) v->p[0] -= pre[ax]; /* the same start, counted from the end */
      } else {
        int64_t start = (n - 1) * am + extra; /* elements start, start-am, ... */
        pre[ax] = start + 1 + off;
        v->p[0] = coin(g, 30) ? start - pre[ax] : start;
        v->p[1] = extra == 0 ? INT64_MIN : extra - 1;
      }
      return true;
    }
    default: { /* expand from fewer / size-1 dims */
      int lead = coin(g, 30) ? rn(g, nd + 1) : 0;
      v->op = VS_EXPAND;
      v->nd = nd;
      *pnd = nd - lead;
      for (int d = 0; d < nd; d++) {
        v->shape[d] = cur[d];
        if (d < lead) continue;
        pre[d - lead] = cur[d] > 1 && coin(g, 50) ? 1 : cur[d];
        if (pre[d - lead] == cur[d] && coin(g, 30)) v->shape[d] = -1;
      }
      return true;
    }
  }
}

/* --- the generator ------------------------------------------------------------------ */

static void text_leaf(oprec *r) {
  char sb[96];
  fmt_shape(sb, sizeof sb, r->lnd, r->lshape);
  switch (r->lmode) {
    case LV_FULL:
      TX(r, "full(%.17g, %s%s)", r->dv[0], DT_NAME[r->dt], sb);
      break;
    case LV_ARANGE:
      TX(r, "arange(%g, %g, 1, %s)", r->dv[0], r->dv[1], DT_NAME[r->dt]);
      break;
    case LV_RAND:
    case LV_RANDN:
      TX(r, "%s(%s%s)", r->lmode == LV_RAND ? "rand" : "randn", DT_NAME[r->dt], sb);
      break;
    default:
      TX(r, "leaf %s%s %s seed=%llx", DT_NAME[r->dt], sb, VK_NAME[r->vk],
         (unsigned long long)r->vseed);
  }
}

static void gen_leaf(prog *P, uint64_t *g, oprec *r, int nd, const int64_t *shape) {
  r->dt = rand_dtype(g);
  r->lnd = nd;
  memcpy(r->lshape, shape, (size_t)nd * sizeof(int64_t));
  r->vseed = sm_next(g);
  int x = rn(g, 100);
  r->vk = dt_float(r->dt) ? (x < 45   ? VK_MOD
                             : x < 62 ? VK_SPECIAL
                             : x < 75 ? VK_POS
                             : x < 87 ? VK_NONFIN
                                      : VK_SMALL)
                          : (x < 75 ? VK_MOD : VK_SPECIAL);
  r->lmode = LV_DATA;
  r->model = mk(leaf_mag(r->dt, r->vk), 0, 0);
  x = rn(g, 100);
  if (x < 7) {
    r->lmode = LV_FULL;
    r->dv[0] = r->dt == KILN_BOOL ? 1 : dt_float(r->dt) ? rand_scalar(g) : rr(g, -7, 7);
    r->model.mf = fabs(r->dv[0]);
  } else if (x < 11 && r->dt != KILN_BOOL && nd > 0 && !P->large) {
    r->lmode = LV_ARANGE;
    r->lnd = 1;
    r->lshape[0] = shape[nd - 1];
    r->dv[0] = rr(g, -6, 4);
    r->dv[1] = r->dv[0] + (double)r->lshape[0];
    r->model.mf = fmax(fabs(r->dv[0]), fabs(r->dv[1]));
  } else if (x < 14 && dt_float(r->dt)) {
    r->lmode = coin(g, 50) ? LV_RAND : LV_RANDN;
    r->model.mf = r->lmode == LV_RAND ? 1 : 8;
  }
  text_leaf(r);
}

/* fills r for kind, choosing operands; false if it does not fit */
static bool gen_kind(prog *P, uint64_t *g, int kind, oprec *r) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->dst = -1;
  int a = -1, b = -1, c = -1;
  kiln_tensor *A = NULL;
  if (kind != K_LEAF && kind != K_VLEAF) {
    int flags = kind == K_CLAMP                   ? PK_NOBOOL
                : kind == K_CAST || kind == K_ARG ? PK_EXACT
                : kind == K_VIEW || kind == K_REDUCE || kind == K_MATMUL || kind == K_MOVE ? PK_ND1
                : kind == K_NN ? PK_ND1 | PK_FLOAT | PK_EXACT
                               : 0;
    if ((a = pick(P, g, flags)) < 0) return false;
    A = P->s[a].t;
  }
  num x = a >= 0 ? P->s[a].v : mk(0, 0, 0), y = mk(0, 0, 0), o = mk(0, 0, 0);
  int nd = A ? ND(A) : 0;
  const int64_t *sa = A ? SH(A) : NULL;
  kiln_dtype adt = A ? DT(A) : KILN_F32, out = adt;
  r->nin = A ? 1 : 0;
  r->in[0] = a;
  switch (kind) {
    case K_LEAF: {
      int64_t s[KILN_MAX_DIMS];
      int lnd = base_pattern(P, g, s);
      gen_leaf(P, g, r, lnd, s);
      out = r->dt;
      o = r->model;
      break;
    }
    case K_VLEAF: { /* a leaf made in another shape, viewed into a base pattern */
      int64_t cur[KILN_MAX_DIMS], pre[KILN_MAX_DIMS];
      int cnd = base_pattern(P, g, cur), pnd;
      if (cnd == 0) return false;
      r->nv = coin(g, 30) ? 2 : 1;
      for (int k = r->nv - 1; k >= 0; k--) {
        if (!view_into(g, cnd, cur, &r->v[k], &pnd, pre)) return false;
        cnd = pnd;
        memcpy(cur, pre, (size_t)pnd * sizeof(int64_t));
      }
      if (shape_numel(cnd, cur) > 4 * P->cap) return false;
      gen_leaf(P, g, r, cnd, cur);
      if (r->lmode != LV_DATA) {
        r->lmode = LV_DATA;
        r->lnd = cnd;
        memcpy(r->lshape, cur, (size_t)cnd * sizeof(int64_t));
        r->model = mk(leaf_mag(r->dt, r->vk), 0, 0);
        r->text[0] = 0;
        text_leaf(r);
      }
      for (int k = 0; k < r->nv; k++) {
        TX(r, " | ");
        text_view(r, &r->v[k]);
      }
      out = r->dt;
      o = r->model;
      break;
    }
    case K_UNARY:
      r->fn = rn(g, N_UNARY);
      if (adt == KILN_BOOL && (r->fn == U_NEG || r->fn == U_RELU)) r->fn = U_NOT;
      out = unary_out(r->fn, adt);
      if (!model_unary(r->fn, x, out, &o)) return false;
      TX(r, "%s(t%d)", UNARY[r->fn].name, a);
      break;
    case K_BINARY:
      r->fn = rn(g, N_BINARY);
      if ((b = pick_partner(P, g, nd, sa, r->fn == B_POW ? PK_EXACT : 0)) < 0) return false;
      if (r->fn != B_POW && coin(g, 50)) { /* either operand first */
        int t = a;
        a = b;
        b = t;
      }
      if (DT(P->s[a].t) == KILN_BOOL && DT(P->s[b].t) == KILN_BOOL &&
          (r->fn == B_SUB || r->fn == B_POW))
        return false;
      x = P->s[a].v;
      y = P->s[b].v;
      out = binary_out(r->fn, DT(P->s[a].t), DT(P->s[b].t));
      if (!model_binary(r->fn, x, y, out, &o)) return false;
      r->nin = 2;
      r->in[0] = a;
      r->in[1] = b;
      TX(r, "%s(t%d, t%d)", BINARY[r->fn].name, a, b);
      break;
    case K_SCALAR:
      r->fn = rn(g, N_SCALAR);
      r->dv[0] = r->fn == S_POW ? (double)rr(g, -2, 4) / (coin(g, 30) ? 2 : 1) : rand_scalar(g);
      out = scalar_out(adt);
      if (!model_scalar(r->fn, x, r->dv[0], out, &o)) return false;
      TX(r, "%s(t%d, %.17g)", SCALAR[r->fn].name, a, r->dv[0]);
      break;
    case K_WHERE: {
      int nc = 0, no = 0;
      int64_t sc[KILN_MAX_DIMS], so[KILN_MAX_DIMS];
      if ((c = pick(P, g, PK_BOOL)) < 0) return false;
      if ((a = pick_partner(P, g, ND(P->s[c].t), SH(P->s[c].t), 0)) < 0) return false;
      bshape(ND(P->s[c].t), SH(P->s[c].t), ND(P->s[a].t), SH(P->s[a].t), &nc, sc);
      if ((b = pick_partner(P, g, nc, sc, 0)) < 0) return false;
      bshape(nc, sc, ND(P->s[b].t), SH(P->s[b].t), &no, so);
      if (shape_numel(no, so) > P->cap) return false;
      x = P->s[a].v;
      y = P->s[b].v;
      out = promote(DT(P->s[a].t), DT(P->s[b].t));
      o = mk(fmax(x.mf, y.mf), fmax(x.r, y.r), fmax(x.a, y.a));
      r->nin = 3;
      r->in[0] = c;
      r->in[1] = a;
      r->in[2] = b;
      TX(r, "where(t%d, t%d, t%d)", c, a, b);
      break;
    }
    case K_CLAMP:
      r->dv[0] = (rn(g, 41) - 20) / 4.0;
      r->dv[1] = r->dv[0] + rn(g, 40) / 4.0;
      if (coin(g, 10)) { /* lo > hi: everything becomes hi */
        double t = r->dv[0];
        r->dv[0] = r->dv[1] + 0.5;
        r->dv[1] = t;
      }
      o = mk(fmax(fabs(r->dv[0]), fabs(r->dv[1])) + 1, x.r, x.a); /* clamp(inf) is finite */
      TX(r, "clamp(t%d, %g, %g)", a, r->dv[0], r->dv[1]);
      break;
    case K_CAST:
      r->dt = out = (kiln_dtype)rn(g, NDT);
      /* mf bounds finite values: a cast saturates +-inf to the integer limits */
      o = mk(dt_float(out)   ? fmin(x.mf, dt_fmax(out))
             : dt_float(adt) ? dt_imax(out)
                             : fmin(x.mf + 1, dt_imax(out)),
             0, 0);
      TX(r, "cast(t%d, %s)", a, DT_NAME[out]);
      break;
    case K_VIEW: {
      vstep *v = &r->v[0];
      int ch = rn(g, 7), no;
      if (no_pending_views && P->s[a].pending) return false;
      int64_t so[KILN_MAX_DIMS];
      r->nv = 1;
      if (ch == 0) { /* reversed along an axis: the same shape */
        v->op = VS_SLICE;
        v->ax = rn(g, nd);
        v->p[0] = -1;
        v->p[1] = INT64_MIN;
        v->p[2] = -1;
      } else if (ch == 1 && nd >= 2) { /* transpose, of two equal dims if there are */
        v->op = VS_TRANSPOSE;
        v->ax = rn(g, nd);
        v->ax2 = (v->ax + 1 + rn(g, nd - 1)) % nd;
        for (int i = 0; i < nd; i++)
          for (int j = i + 1; j < nd; j++)
            if (sa[i] == sa[j] && sa[i] > 1) {
              v->ax = i;
              v->ax2 = j;
            }
      } else if (ch == 2 && nd >= 3) {
        v->op = VS_PERMUTE;
        v->nd = nd;
        for (int i = 0; i < nd; i++) v->perm[i] = (i + 1) % nd;
      } else if (ch == 3) { /* every 2nd element, either way */
        v->op = VS_SLICE;
        v->ax = rn(g, nd);
        v->p[2] = coin(g, 50) ? 2 : -2;
        v->p[0] = sa[v->ax] > 1 ? rn(g, 2) : 0;
        if (v->p[2] < 0) v->p[0] = -1 - v->p[0];
        v->p[1] = v->p[2] > 0 ? INT64_MAX : INT64_MIN;
      } else if (ch == 4 && bshape(nd, sa, P->bnd, P->base, &no, so) &&
                 shape_numel(no, so) <= P->cap) { /* expand to the base shape */
        v->op = VS_EXPAND;
        v->nd = no;
        memcpy(v->shape, so, (size_t)no * sizeof(int64_t));
      } else if (ch == 5) { /* flatten, or merge the last two dims */
        v->op = VS_RESHAPE;
        if (nd >= 2 && coin(g, 50)) {
          v->nd = nd - 1;
          memcpy(v->shape, sa, (size_t)(nd - 1) * sizeof(int64_t));
          v->shape[nd - 2] = coin(g, 50) ? -1 : sa[nd - 2] * sa[nd - 1];
        } else {
          v->nd = 1;
          v->shape[0] = -1;
        }
      } else {
        int d1 = -1;
        for (int d = 0; d < nd; d++)
          if (sa[d] == 1) d1 = d;
        if (d1 >= 0 && coin(g, 50)) {
          v->op = VS_SQUEEZE;
          v->ax = d1;
        } else {
          if (nd >= 6) return false;
          v->op = VS_UNSQUEEZE;
          v->ax = rn(g, nd + 1);
        }
      }
      o = x;
      TX(r, "t%d | ", a);
      text_view(r, v);
      break;
    }
    case K_REDUCE: {
      int perm[KILN_MAX_DIMS];
      r->fn = rn(g, N_REDUCE);
      for (int i = 0; i < nd; i++) perm[i] = i;
      for (int i = nd - 1; i > 0; i--) {
        int j = rn(g, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
      int64_t n = 1;
      r->niv = coin(g, 15) ? 0 : rr(g, 1, nd);
      for (int i = 0; i < r->niv; i++) {
        r->iv[i] = perm[i] - (coin(g, 30) ? nd : 0);
        n *= sa[perm[i]];
      }
      if (r->niv == 0) n = kiln_numel(A);
      r->flag = coin(g, 70);
      out = reduce_out(r->fn, adt);
      if (!model_reduce(r->fn, x, n, adt, out, &o)) return false;
      TX(r, "%s(t%d, axes={", REDUCE[r->fn].name, a);
      for (int i = 0; i < r->niv; i++) TX(r, i ? ",%d" : "%d", r->iv[i]);
      TX(r, "}, keepdim=%d)", r->flag);
      break;
    }
    case K_MOVE: { /* iv: the axis, the picks (or the part's length) */
      int ax = rn(g, nd);
      int64_t m =
          coin(g, 85) ? rr(g, 1, 4) : rr(g, 5, 11); /* a scatter past 8 picks: not in place */
      r->fn = rn(g, MV_COUNT);
      if (sa[ax] == 0 || (r->fn == MV_SCATTER_ADD && adt == KILN_BOOL)) return false;
      r->iv[0] = coin(g, 30) ? ax - nd : ax; /* negative axes too */
      r->iv[1] = (int)m;
      r->dt = adt;
      r->lnd = r->fn == MV_INDEX_SELECT ? 1 : nd;
      if (r->fn == MV_INDEX_SELECT)
        r->lshape[0] = m;
      else
        memcpy(r->lshape, sa, (size_t)nd * sizeof *sa), r->lshape[ax] = m;
      int64_t res = shape_numel(nd, sa) / sa[ax] *
                    (r->fn == MV_CONCAT        ? sa[ax] + m
                     : r->fn == MV_SCATTER_ADD ? sa[ax]
                                               : m);
      if (res > P->cap || shape_numel(r->lnd, r->lshape) > P->cap) return false;
      r->flag = coin(g, 50); /* concat: the part first */
      r->vk = VK_MOD;
      r->vseed = sm_next(g);
      double mag = leaf_mag(adt, VK_MOD);
      o = r->fn == MV_SCATTER_ADD ? mk(x.mf + (double)m * mag, 0, 0)
          : r->fn == MV_CONCAT    ? mk(fmax(x.mf, mag), 0, 0)
                                  : x;
      char sb[96];
      fmt_shape(sb, sizeof sb, r->lnd, r->lshape);
      if (r->fn == MV_CONCAT && r->flag)
        TX(r, "concat({leaf %s%s seed=%llx, t%d}, %d)", DT_NAME[adt], sb,
           (unsigned long long)r->vseed, a, r->iv[0]);
      else if (r->fn == MV_CONCAT)
        TX(r, "concat({t%d, leaf %s%s seed=%llx}, %d)", a, DT_NAME[adt], sb,
           (unsigned long long)r->vseed, r->iv[0]);
      else
        TX(r, "%s(t%d, %d, index i64%s < %lld seed=%llx%s)", MOVE_NAME[r->fn], a, r->iv[0], sb,
           (long long)sa[ax], (unsigned long long)r->vseed,
           r->fn == MV_SCATTER_ADD ? ", source of the index's shape" : "");
      break;
    }
    case K_ARG:
      if (nd == 0) return false;
      r->fn = rn(g, 2);
      r->iv[0] = rr(g, -nd, nd - 1);
      r->flag = coin(g, 50);
      out = KILN_I64;
      o = mk((double)sa[r->iv[0] < 0 ? r->iv[0] + nd : r->iv[0]], 0, 0);
      TX(r, "%s(t%d, %d, keepdim=%d)", r->fn ? "argmin" : "argmax", a, r->iv[0], r->flag);
      break;
    case K_MATMUL: {
      int64_t k = sa[nd - 1], rows = kiln_numel(A) / (k ? k : 1);
      if (adt == KILN_BOOL || nd > 3) return false;
      if (nd >= 2 && coin(g, 35)) { /* a @ transpose(a) */
        if (rows / sa[nd - 2] * sa[nd - 2] * sa[nd - 2] > P->cap) return false;
        r->fn = 1;
        y = x;
        TX(r, "matmul(t%d, transpose(t%d, -1, -2))", a, a);
      } else {
        int64_t n = coin(g, 50) ? P->base[P->bnd - 1] : rr(g, 1, 5);
        if (rows * n > P->cap || k * n > P->cap) return false;
        r->fn = 0;
        r->dt = adt;
        r->lnd = 2;
        r->lshape[0] = k;
        r->lshape[1] = n;
        r->vk = dt_float(adt) && coin(g, 50) ? VK_SMALL : VK_MOD;
        r->vseed = sm_next(g);
        y = mk(leaf_mag(adt, r->vk), 0, 0);
        TX(r, "matmul(t%d, leaf %s[%lld,%lld] %s seed=%llx)", a, DT_NAME[adt], (long long)k,
           (long long)n, VK_NAME[r->vk], (unsigned long long)r->vseed);
      }
      double dk = (double)k;
      if (!dt_float(adt)) {
        o = mk(dt_imax(adt), 0, 0);
      } else {
        double u = dt_u(adt);
        o = mk(dk * x.mf * y.mf, 0,
               2 * dk * u * x.mf * y.mf + dk * (mulz(abs_err(x), y.mf) + mulz(abs_err(y), x.mf)));
      }
      break;
    }
    case K_NN: {
      double u = dt_u(adt), dn;
      r->fn = rn(g, 4);
      r->iv[0] = rr(g, -nd, nd - 1);
      dn = (double)sa[r->iv[0] < 0 ? r->iv[0] + nd : r->iv[0]];
      double m2 = 2 * x.mf + log(dn) + 1;
      switch (r->fn) {
        case NN_SOFTMAX:
          o = mk(1, (dn + 8) * u, 2 * x.mf >= 80 ? dt_tiny(adt) : 0);
          TX(r, "softmax(t%d, %d)", a, r->iv[0]);
          break;
        case NN_LOG_SOFTMAX:
          o = mk(m2, 2 * u, (dn + 8) * u);
          TX(r, "log_softmax(t%d, %d)", a, r->iv[0]);
          break;
        case NN_LOGSUMEXP:
          r->flag = coin(g, 60);
          o = mk(m2, 2 * u, (dn + 8) * u);
          TX(r, "logsumexp(t%d, %d, keepdim=%d)", a, r->iv[0], r->flag);
          break;
        default: {
          static const double eps[] = {1e-3, 1e-2, 1e-5};
          int64_t d = sa[nd - 1];
          double mw = 1, mb = 0;
          dn = (double)d;
          r->dv[0] = eps[rn(g, 3)];
          r->nin = 3;
          r->in[1] = r->in[2] = -1;
          for (int k = 1; k <= 2; k++) {
            if (!coin(g, 60)) continue;
            for (int j = 0; j < MAXPOOL; j++) {
              kiln_tensor *t = P->s[j].t;
              if (t && ND(t) == 1 && SH(t)[0] == d && DT(t) == adt && is_exact(P->s[j].v)) {
                r->in[k] = j;
                if (k == 1)
                  mw = P->s[j].v.mf;
                else
                  mb = P->s[j].v.mf;
                break;
              }
            }
          }
          /* the mean and variance may be summed in another order */
          o = mk(sqrt(dn) * mw + mb, 4 * dn * u,
                 (2 + log2(dn)) * u * x.mf / sqrt(r->dv[0]) * mw + u * mb);
          TX(r, "layer_norm(t%d, ", a);
          TX(r, r->in[1] >= 0 ? "t%d, " : "NULL, ", r->in[1]);
          TX(r, r->in[2] >= 0 ? "t%d, " : "NULL, ", r->in[2]);
          TX(r, "%g)", r->dv[0]);
        }
      }
      break;
    }
    case K_READ:
      TX(r, "read(t%d)", a);
      return true;
    case K_RELEASE: {
      int live = 0;
      for (int j = 0; j < MAXPOOL; j++) live += P->s[j].t != NULL;
      if (live < 3) return false;
      TX(r, "release(t%d)", a);
      return true;
    }
  }
  if (!within(o, out)) return false;
  r->model = o;
  r->pending = kind != K_LEAF && kind != K_VLEAF && (kind != K_VIEW || P->s[a].pending);
  r->dst = free_slot(P, g);
  return r->dst >= 0;
}

/* --- running ------------------------------------------------------------------------ */

/* the host scalars of the replay: negated (not pow exponents), so the
   magnitude bounds of the model still hold; 0 and +-1 stay, as the trace
   key tells them apart (tr_scalar_class) and the replay is to reuse plans */
static bool key_scalar(double s) { return s == 0 || fabs(s) == 1; }
static double var_scalar(const prog *P, double s) { return P->variant && !key_scalar(s) ? -s : s; }

static kiln_tensor *exec_leaf(const prog *P, const oprec *r) {
  uint64_t seed = r->vseed ^ (P->variant ? 0x5BD1E9955BD1E995ull : 0);
  switch (r->lmode) {
    case LV_FULL:
      return kiln_full(var_scalar(P, r->dv[0]), r->dt, r->lnd, r->lshape);
    case LV_ARANGE:
      return kiln_arange(r->dv[0], r->dv[1], 1, r->dt);
    case LV_RAND:
      return kiln_rand(r->dt, r->lnd, r->lshape);
    case LV_RANDN:
      return kiln_randn(r->dt, r->lnd, r->lshape);
    default:
      return make_leaf(r->dt, r->lnd, r->lshape, r->vk, seed);
  }
}

/* K_MOVE's leaves: its index (int64 in [0, bound), of r's leaf shape) and
   its source or part (r's dtype and leaf shape); new values on the replay */
static kiln_tensor *move_index(const prog *P, const oprec *r, int64_t bound) {
  uint64_t s = r->vseed ^ (P->variant ? 0x5BD1E9955BD1E995ull : 0);
  int64_t n = shape_numel(r->lnd, r->lshape);
  int64_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = rn(&s, (int)bound);
  kiln_tensor *t = kiln_from_data(v, KILN_I64, r->lnd, r->lshape);
  free(v);
  return t;
}

static kiln_tensor *move_part(const prog *P, const oprec *r) {
  return make_leaf(r->dt, r->lnd, r->lshape, r->vk,
                   (r->vseed + 1) ^ (P->variant ? 0x5BD1E9955BD1E995ull : 0));
}

static kiln_tensor *exec_move(const prog *P, const oprec *r, kiln_tensor *A) {
  int ax = r->iv[0] < 0 ? r->iv[0] + ND(A) : r->iv[0];
  kiln_tensor *idx = NULL, *part = NULL, *res = NULL;
  if (r->fn != MV_CONCAT) idx = move_index(P, r, SH(A)[ax]);
  if (r->fn == MV_SCATTER_ADD || r->fn == MV_CONCAT) part = move_part(P, r);
  switch (r->fn) {
    case MV_GATHER:
      res = kiln_gather(A, r->iv[0], idx);
      break;
    case MV_INDEX_SELECT:
      res = kiln_index_select(A, r->iv[0], idx);
      break;
    case MV_SCATTER_ADD:
      res = kiln_scatter_add(A, r->iv[0], idx, part);
      break;
    default: {
      kiln_tensor *parts[2] = {r->flag ? part : A, r->flag ? A : part};
      res = kiln_concat(2, parts, r->iv[0]);
    }
  }
  kiln_release(idx);
  kiln_release(part);
  return res;
}

static kiln_tensor *exec_views(kiln_tensor *t, const oprec *r) {
  kiln_tensor *cur = kiln_retain(t);
  for (int k = 0; cur && k < r->nv; k++) {
    kiln_tensor *next = apply_view(cur, &r->v[k]);
    kiln_release(cur);
    cur = next;
  }
  return cur;
}

static void count_exec(const prog *P, const oprec *r) {
  char name[40];
  kiln_tensor *A = r->nin > 0 && r->in[0] >= 0 ? P->s[r->in[0]].t : NULL;
  switch (r->kind) {
    case K_UNARY:
      count_op(UNARY[r->fn].name, DT(A));
      break;
    case K_BINARY:
      count_op(BINARY[r->fn].name, promote(DT(A), DT(P->s[r->in[1]].t)));
      break;
    case K_SCALAR:
      count_op(SCALAR[r->fn].name, DT(A));
      break;
    case K_WHERE:
      count_op("where", promote(DT(P->s[r->in[1]].t), DT(P->s[r->in[2]].t)));
      break;
    case K_CLAMP:
      count_op("clamp", DT(A));
      break;
    case K_CAST:
      snprintf(name, sizeof name, "cast->%s", DT_NAME[r->dt]);
      count_op(name, DT(A));
      break;
    default:
      break;
  }
}

/* whether r itself computes with an algorithm the GPU does not share with
   the CPU (docs/SEMANTICS.md, "Bit for bit"): f32/f64 transcendentals and pow
   are CUDA's libm there, Kiln's polynomials (f32) or glibc (f64) here;
   matmul is cuBLAS; randn draws through log and cos; softmax and its
   kin use exp and log */
static bool device_math_op(const oprec *r) {
  switch (r->kind) {
    case K_UNARY:
      return unary_is_math(r->fn);
    case K_BINARY:
      return r->fn == B_POW;
    case K_SCALAR:
      return r->fn == S_POW;
    case K_LEAF:
    case K_VLEAF:
      return r->lmode == LV_RANDN;
    case K_MATMUL:
      return true;
    case K_NN:
      return r->fn != NN_LAYER_NORM; /* layer_norm: means, a sqrt and divisions */
    default:
      return false;
  }
}

/* runs r; false (with an F line written) when a call failed */
static bool exec_rec(prog *P, const oprec *r, int step) {
  slot *S = P->s;
  kiln_tensor *A = r->nin > 0 && r->in[0] >= 0 ? S[r->in[0]].t : NULL;
  kiln_tensor *B = r->nin > 1 && r->in[1] >= 0 ? S[r->in[1]].t : NULL;
  kiln_tensor *C = r->nin > 2 && r->in[2] >= 0 ? S[r->in[2]].t : NULL;
  kiln_tensor *res = NULL, *tmp = NULL;
  kiln_clear_error();
  count_exec(P, r);
  switch (r->kind) {
    case K_LEAF:
      res = exec_leaf(P, r);
      break;
    case K_VLEAF:
      tmp = exec_leaf(P, r);
      res = tmp ? exec_views(tmp, r) : NULL;
      break;
    case K_UNARY:
      res = UNARY[r->fn].f(A);
      break;
    case K_BINARY:
      res = BINARY[r->fn].f(A, B);
      break;
    case K_SCALAR:
      res = SCALAR[r->fn].f(A, r->fn == S_POW ? r->dv[0] : var_scalar(P, r->dv[0]));
      break;
    case K_WHERE:
      res = kiln_where(A, B, C);
      break;
    case K_CLAMP:
      res = P->variant && !key_scalar(r->dv[0]) && !key_scalar(r->dv[1])
                ? kiln_clamp(A, -r->dv[1], -r->dv[0])
                : kiln_clamp(A, r->dv[0], r->dv[1]);
      break;
    case K_CAST:
      res = kiln_cast(A, r->dt);
      break;
    case K_VIEW:
      res = exec_views(A, r);
      break;
    case K_REDUCE:
      res = REDUCE[r->fn].f(A, r->niv, r->iv, r->flag);
      break;
    case K_ARG:
      res = (r->fn ? kiln_argmin : kiln_argmax)(A, r->iv[0], r->flag);
      break;
    case K_MOVE:
      res = exec_move(P, r, A);
      break;
    case K_MATMUL:
      tmp = r->fn ? kiln_transpose(A, -1, -2) : exec_leaf(P, r);
      res = tmp ? kiln_matmul(A, tmp) : NULL;
      break;
    case K_NN:
      switch (r->fn) {
        case NN_SOFTMAX:
          res = kiln_softmax(A, r->iv[0]);
          break;
        case NN_LOG_SOFTMAX:
          res = kiln_log_softmax(A, r->iv[0]);
          break;
        case NN_LOGSUMEXP:
          res = kiln_logsumexp(A, r->iv[0], r->flag);
          break;
        default:
          res = kiln_layer_norm(A, B, C, r->dv[0]);
          break;
      }
      break;
    case K_READ: {
      char name[64];
      snprintf(name, sizeof name, "r%d.t%d@%d%s", P->nreads++, r->in[0], step,
               S[r->in[0]].device_math ? "~" : "");
      S[r->in[0]].pending = false;
      return emit(P->out, name, A, is_exact(S[r->in[0]].v) ? 0 : bound_of(S[r->in[0]].v));
    }
    case K_RELEASE:
      kiln_release(A);
      S[r->in[0]].t = NULL;
      return true;
  }
  kiln_release(tmp);
  if (!res) {
    fprintf(P->out, "F step %d (%s): returned NULL: %s (status %d)\n", step, r->text,
            kiln_last_error(), (int)kiln_last_status());
    return false;
  }
  bool dm = device_math_op(r);
  for (int k = 0; k < r->nin; k++) dm |= r->in[k] >= 0 && S[r->in[k]].device_math;
  S[r->dst].t = res;
  S[r->dst].device_math = dm;
  S[r->dst].v = r->model;
  S[r->dst].born = step;
  S[r->dst].pending = r->pending;
  return true;
}

/* the dtype the op must give (SEMANTICS.md), checked against Kiln's */
static int expected_dtype(const prog *P, const oprec *r) {
  kiln_tensor *A = r->nin > 0 && r->in[0] >= 0 ? P->s[r->in[0]].t : NULL;
  switch (r->kind) {
    case K_LEAF:
    case K_VLEAF:
    case K_CAST:
      return r->dt;
    case K_UNARY:
      return unary_out(r->fn, DT(A));
    case K_BINARY:
      return binary_out(r->fn, DT(A), DT(P->s[r->in[1]].t));
    case K_SCALAR:
      return scalar_out(DT(A));
    case K_WHERE:
      return promote(DT(P->s[r->in[1]].t), DT(P->s[r->in[2]].t));
    case K_REDUCE:
      return reduce_out(r->fn, DT(A));
    case K_ARG:
      return KILN_I64;
    default:
      return A ? (int)DT(A) : -1;
  }
}

static void print_rec(FILE *out, const oprec *r, int step) {
  if (r->dst >= 0)
    fprintf(out, "O %3d: t%d = %s\n", step, r->dst, r->text);
  else
    fprintf(out, "O %3d: %s\n", step, r->text);
}

static void choose_base(prog *P, uint64_t *g) {
  static const int64_t LARGE[][4] = {{2, 257, 255},    {1, 65536},    {2, 16, 4096},
                                     {3, 3, 129, 170}, {2, 255, 257}, {3, 2, 181, 181}};
  static const int64_t DIMS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 24, 31, 33, 64};
  if (P->large) {
    const int64_t *l = LARGE[rn(g, 6)];
    P->bnd = (int)l[0];
    memcpy(P->base, l + 1, (size_t)P->bnd * sizeof(int64_t));
  } else {
    P->bnd = coin(g, 10) ? 4 : rr(g, 1, 3);
    for (int d = 0; d < P->bnd; d++) P->base[d] = DIMS[rn(g, 17)];
    if (P->bnd >= 2 && coin(g, 35)) { /* two equal dims: transposes keep the shape */
      int i = rn(g, P->bnd), j = (i + 1 + rn(g, P->bnd - 1)) % P->bnd;
      P->base[j] = P->base[i];
    }
    while (shape_numel(P->bnd, P->base) > 2000) {
      int big = 0;
      for (int d = 1; d < P->bnd; d++)
        if (P->base[d] > P->base[big]) big = d;
      P->base[big] = (P->base[big] + 1) / 2;
    }
  }
  P->cap = shape_numel(P->bnd, P->base);
  if (P->cap < 64) P->cap = 64;
}

static void release_all(prog *P) {
  for (int j = 0; j < MAXPOOL; j++) {
    kiln_release(P->s[j].t);
    P->s[j].t = NULL;
  }
}

/* generates (variant 0) or replays (variant 1) one program and prints it and
   its results */
static void run_program(FILE *out, uint64_t seed, int variant, oprec *recs, int *nrecs) {
  static prog P;
  memset(&P, 0, sizeof P);
  P.out = out;
  P.seed = seed;
  P.variant = variant;
  P.large = seed % 30 == 0;
  uint64_t g = seed * 0xD1B54A32D192ED03ull + 17;
  choose_base(&P, &g);
  char sb[96];
  fmt_shape(sb, sizeof sb, P.bnd, P.base);
  fprintf(out, "P s%llu %d\n", (unsigned long long)seed, variant);
  fflush(out); /* a crash below still names this program */
  fprintf(out, "O base shape %s%s\n", sb,
          variant ? "; replay: new leaf values, host scalars negated (not pow exponents, "
                    "0 or +-1), clamp(lo, hi) -> clamp(-hi, -lo)"
                  : "");
  int n = variant ? *nrecs : 0;
  bool ok = true;
  if (!variant) {
    int nleaves = rr(&g, 2, 4), nops = P.large ? rr(&g, 6, 12) : rr(&g, 8, 20);
    for (int s = 0; s < nleaves + nops && n < MAXRECS - 1; s++) {
      if (free_slot(&P, &g) < 0) { /* a full pool: make room */
        gen_kind(&P, &g, K_RELEASE, &recs[n]);
        print_rec(out, &recs[n], n);
        exec_rec(&P, &recs[n], n);
        n++;
      }
      int kind = s < nleaves ? (coin(&g, 70) ? K_LEAF : K_VLEAF) : pick_kind(&g);
      for (int tries = 0; !gen_kind(&P, &g, kind, &recs[n]); tries++)
        kind = tries < 40 ? pick_kind(&g) : K_LEAF;
      print_rec(out, &recs[n], n);
      if (!(ok = exec_rec(&P, &recs[n], n))) {
        n++;
        break;
      }
      if (recs[n].dst >= 0) {
        int want = expected_dtype(&P, &recs[n]);
        kiln_tensor *t = P.s[recs[n].dst].t;
        if (want >= 0 && (int)DT(t) != want) {
          fprintf(out, "F step %d: %s gave %s, SEMANTICS.md says %s\n", n, recs[n].text,
                  DT_NAME[DT(t)], DT_NAME[want]);
          ok = false;
          n++;
          break;
        }
      }
      n++;
    }
    *nrecs = n;
  } else {
    for (int i = 0; i < n && ok; i++) {
      print_rec(out, &recs[i], i);
      ok = exec_rec(&P, &recs[i], i);
    }
  }
  /* the results are the values no later op used: the others are released
     before the final flush, so they stay inside its kernels (a value read
     after a flush that did not materialize it is recomputed by another
     trace, one more compile each) */
  for (int j = 0; ok && j < MAXPOOL; j++) {
    bool used = false;
    for (int i = P.s[j].born + 1; P.s[j].t && i < n && !used; i++)
      for (int k = 0; k < recs[i].nin && recs[i].kind != K_READ && recs[i].kind != K_RELEASE; k++)
        used |= recs[i].in[k] == j;
    if (used) {
      kiln_release(P.s[j].t);
      P.s[j].t = NULL;
    }
  }
  if (ok && P.large) { /* keep the output small: only the newest values stay results */
    int kept = 0;
    for (int i = n - 1; i >= 0; i--) {
      int d = recs[i].dst;
      if (d < 0 || !P.s[d].t || P.s[d].born != i) continue;
      if (++kept > 5) {
        kiln_release(P.s[d].t);
        P.s[d].t = NULL;
      }
    }
  }
  if (ok && kiln_sync() < 0) {
    fprintf(out, "F kiln_sync failed: %s\n", kiln_last_error());
    ok = false;
  }
  for (int j = 0; ok && j < MAXPOOL; j++) {
    if (!P.s[j].t) continue;
    char name[64];
    snprintf(name, sizeof name, "t%d@%d%s", j, P.s[j].born, P.s[j].device_math ? "~" : "");
    ok = emit(out, name, P.s[j].t, is_exact(P.s[j].v) ? 0 : bound_of(P.s[j].v));
  }
  release_all(&P);
  kiln_clear_error();
  fflush(out);
}

/* --- directed tests (child side) ---------------------------------------------------- */

static bool child_jit; /* this child runs with the JIT */

/* KILN_FUZZ_DEVICE=cuda (the parent): both children of a pair run with
   KILN_DEVICE=cuda, so every tensor is made on the GPU and every op runs
   there: the GPU's op-by-op kernels (KILN_JIT=0) against its fused ones */
static bool on_cuda;
/* the parent compares the GPU fused run with the CPU's interpreter (after
   comparing it with the GPU op-by-op run): results named "~" only by
   dtype and shape, the rest bit for bit */
static bool cross;
static const char *ref_name(void) {
  return cross ? "CPU interpreter" : on_cuda ? "GPU op-by-op run" : "interpreter";
}
static const char *jit_name(void) { return on_cuda ? "GPU fused run" : "JIT"; }

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* the counters; on the GPU, plans built stand for compiles (NVRTC compiles
   a plan's kernels, and kiln_stats.compiles counts the CPU's) */
/* compiles: plans given kernels, compiled or all found in the kernel cache
   (a sweep's kernels may all have been compiled by an earlier sweep) */
static void snap(kiln_stats *s) {
  kiln_get_stats(s);
  if (on_cuda)
    s->compiles = (uint64_t)kiln_stat("plans_built");
  else
    s->compiles += (uint64_t)kiln_stat("kernel_cache_hits");
}

/* "E label need eager compiles": the interpreter ops (eager_ops) and the
   compiles since s0.  The parent checks that the JIT run left some ops to
   compiled kernels (fewer eager ops than the reference) where need >= 1 and
   compiled where need is 2; the reference run never compiles. */
enum { NEED_NOTHING, NEED_KERNEL, NEED_COMPILE };
static void mark(FILE *out, const char *label, const kiln_stats *s0, int need) {
  kiln_stats s1;
  snap(&s1);
  fprintf(out, "E %s %d %llu %llu\n", label, need,
          (unsigned long long)(s1.eager_ops - s0->eager_ops),
          (unsigned long long)(s1.compiles - s0->compiles));
}

static bool same_bits_or_nan_f(float x, float y) {
  return (isnan(x) && isnan(y)) || !memcmp(&x, &y, sizeof x);
}

/* reads t as f32 and checks it bit for bit against want (NaN == NaN) */
static void check_f32_exact(kiln_tensor *t, const float *want, int64_t n, const char *what) {
  if (!t || kiln_numel(t) != n || DT(t) != KILN_F32) {
    KTEST_FAIL("%s: missing or wrong shape/dtype (%s)", what, kiln_last_error());
    return;
  }
  float *got = malloc((size_t)n * sizeof(float));
  if (kiln_to_buffer(t, got, (size_t)n * sizeof(float)) < 0) {
    KTEST_FAIL("%s: kiln_to_buffer: %s", what, kiln_last_error());
  } else {
    for (int64_t i = 0; i < n; i++)
      if (!same_bits_or_nan_f(got[i], want[i])) {
        KTEST_FAIL("%s[%lld] = %a (%.9g), expected %a (%.9g)", what, (long long)i, got[i], got[i],
                   want[i], want[i]);
        break;
      }
  }
  free(got);
}

/* W1 (perf/): tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25 on 2^20 f32 */
static void directed_w1(FILE *out) {
  int64_t n = 1 << 20;
  ktest_current = "directed W1";
  fprintf(out,
          "P W1 0\nO x, y = randn(f32[1048576]) after manual_seed(42), materialized\n"
          "O w1 = tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25, computed twice\n");
  fflush(out); /* a crash below still names this test */
  kiln_manual_seed(42);
  kiln_tensor *x = kiln_randn(KILN_F32, 1, &n), *y = kiln_randn(KILN_F32, 1, &n);
  CHECK(kiln_sync() == KILN_OK);
  for (int rep = 0; rep < 2; rep++) {
    kiln_stats s0;
    snap(&s0);
    kiln_tensor *xy = kiln_mul(x, y), *t = kiln_add_scalar(xy, 0.5), *th = kiln_tanh(t);
    kiln_tensor *sg = kiln_sigmoid(x), *p = kiln_mul(th, sg), *yy = kiln_mul(y, y);
    kiln_tensor *q = kiln_mul_scalar(yy, 0.25), *w = kiln_sub(p, q);
    /* the model: tanh and sigmoid 4 ulps each, their product, then - y*y/4 */
    CHECK(w && emit(out, rep ? "w1.again" : "w1", w, 10 * 0x1p-24));
    mark(out, rep ? "W1-cached-plan" : "W1", &s0, rep ? NEED_KERNEL : NEED_COMPILE);
    kiln_tensor *all[] = {xy, t, th, sg, p, yy, q, w};
    for (int i = 0; i < 8; i++) kiln_release(all[i]);
  }
  kiln_release(x);
  kiln_release(y);
}

static int64_t sat_cast(double v, kiln_dtype to) {
  if (to == KILN_BOOL) return v != 0; /* NaN != 0 */
  if (isnan(v)) return 0;
  double lo = to == KILN_I32 ? -2147483648.0 : -9223372036854775808.0;
  double hi = to == KILN_I32 ? 2147483648.0 : 9223372036854775808.0;
  if (v <= lo) return to == KILN_I32 ? INT32_MIN : INT64_MIN;
  if (v >= hi) return to == KILN_I32 ? INT32_MAX : INT64_MAX;
  return (int64_t)v; /* truncation toward zero */
}

/* float -> i32/i64/bool casts: NaN -> 0, out of range saturates, truncation
   (SEMANTICS.md), alone and fused after another op */
static void directed_casts(FILE *out) {
  static const double V[] = {NAN,           INFINITY,
                             -INFINITY,     3e9,
                             -3e9,          2.7,
                             -2.7,          2147483520.0,
                             2147483648.0,  -2147483648.0,
                             -2147483904.0, 9.3e18,
                             -9.3e18,       9223372036854775808.0,
                             1e-40,         -0.0,
                             0.5,           -0.99,
                             16777217.0,    1e30};
  enum { N = sizeof V / sizeof V[0] };
  static const kiln_dtype TO[] = {KILN_I32, KILN_I64, KILN_BOOL};
  ktest_current = "directed float->int casts";
  fprintf(out,
          "P casts 0\nO x = f32/f64 [NaN, inf, -inf, 3e9, -3e9, 2.7, -2.7, 2147483520, 2^31, "
          "-2^31, -2147483904, 9.3e18, -9.3e18, 2^63, 1e-40, -0, 0.5, -0.99, 16777217, 1e30]\n"
          "O cast(x, i32|i64|bool), cast(neg(x), ...), cast(x * 1, ...)\n");
  fflush(out); /* a crash below still names this test */
  for (int f = 0; f < 2; f++) {
    kiln_dtype from = f ? KILN_F64 : KILN_F32;
    float vf[N];
    for (int i = 0; i < N; i++) vf[i] = (float)V[i];
    kiln_tensor *x = kiln_from_data(f ? (const void *)V : (const void *)vf, from, 1, S(N));
    for (int k = 0; k < 3; k++) {
      for (int variant = 0; variant < 3; variant++) {
        kiln_stats s0;
        snap(&s0);
        kiln_tensor *pre = variant == 0   ? kiln_retain(x)
                           : variant == 1 ? kiln_neg(x)
                                          : kiln_mul_scalar(x, 1.0);
        kiln_tensor *c = kiln_cast(pre, TO[k]);
        char name[64];
        snprintf(name, sizeof name, "cast.%s.%s->%s",
                 variant == 0   ? "x"
                 : variant == 1 ? "neg"
                                : "x1",
                 DT_NAME[from], DT_NAME[TO[k]]);
        CHECK(c && emit(out, name, c, 0));
        mark(out, name, &s0, NEED_KERNEL); /* x*1 may reuse cast(x)'s code */
        int64_t got[N] = {0};
        unsigned char raw[N * 8];
        if (c && kiln_to_buffer(c, raw, N * dt_size(TO[k])) == KILN_OK) {
          for (int i = 0; i < N; i++) {
            if (TO[k] == KILN_BOOL)
              got[i] = raw[i];
            else if (TO[k] == KILN_I32) {
              int32_t v;
              memcpy(&v, raw + 4 * i, 4);
              got[i] = v;
            } else
              memcpy(&got[i], raw + 8 * i, 8);
            double src = f ? V[i] : (double)vf[i];
            if (variant == 1) src = -src;
            int64_t want = sat_cast(src, TO[k]);
            if (got[i] != want)
              KTEST_FAIL("%s[%d]: cast of %.17g gave %lld, expected %lld", name, i, src,
                         (long long)got[i], (long long)want);
          }
        }
        kiln_release(pre);
        kiln_release(c);
      }
    }
    kiln_release(x);
  }
}

/* a transposed input, stride-2 and reversed slices, an expanded row and a
   materialized strided view feeding one compiled kernel, against C */
static void directed_views(FILE *out) {
  enum { R = 5, C = 7, W = 12 };
  float av[R * C], bv[C * W], rowv[R];
  for (int i = 0; i < R * C; i++) av[i] = (float)i * 0.25f - 4.0f;
  for (int i = 0; i < C * W; i++) bv[i] = (float)i * 0.5f - 20.0f;
  for (int i = 0; i < R; i++) rowv[i] = (float)(i * i) - 3.5f;
  ktest_current = "directed strided inputs";
  fprintf(
      out,
      "P views 0\nO a = f32[5,7] i*0.25-4; b = f32[7,12] i*0.5-20; row = f32[1,5]\n"
      "O at = transpose(a, 0, 1); bs = slice(b, 1, 1, 11, 2); br = slice(b, 1, 10, 0, -2)\n"
      "O c = at*bs + br*0.5 + expand(row, [7,5]);  d = where(at > bs, at, bs) - at\n"
      "O v = transpose(a, 0, 1) read (a materialized strided value); e = v*2 + 1 in a new trace\n");
  fflush(out); /* a crash below still names this test */
  kiln_tensor *a = kiln_from_data(av, KILN_F32, 2, S(R, C));
  kiln_tensor *b = kiln_from_data(bv, KILN_F32, 2, S(C, W));
  kiln_tensor *row = kiln_from_data(rowv, KILN_F32, 2, S(1, R));
  kiln_stats s0;
  snap(&s0);
  kiln_tensor *at = kiln_transpose(a, 0, 1), *bs = kiln_slice(b, 1, 1, 11, 2);
  kiln_tensor *br = kiln_slice(b, 1, 10, 0, -2), *rx = kiln_expand(row, 2, S(C, R));
  kiln_tensor *m = kiln_mul(at, bs), *h = kiln_mul_scalar(br, 0.5), *s = kiln_add(m, h);
  kiln_tensor *c = kiln_add(s, rx);
  kiln_tensor *gt = kiln_gt(at, bs), *wh = kiln_where(gt, at, bs), *d = kiln_sub(wh, at);
  CHECK(c && d && kiln_sync() == KILN_OK);
  mark(out, "strided-inputs", &s0, NEED_COMPILE);
  float want_c[C * R], want_d[C * R];
  for (int i = 0; i < C; i++)
    for (int j = 0; j < R; j++) {
      float x = av[j * C + i], y = bv[i * W + 1 + 2 * j], z = bv[i * W + 10 - 2 * j];
      float p = x * y, q = z * 0.5f, t = p + q;
      want_c[i * R + j] = t + rowv[j];
      float w = x > y ? x : y;
      want_d[i * R + j] = w - x;
    }
  check_f32_exact(c, want_c, C * R, "at*bs + br*0.5 + expand(row)");
  check_f32_exact(d, want_d, C * R, "where(at > bs, at, bs) - at");
  CHECK(emit(out, "views.c", c, 0) && emit(out, "views.d", d, 0));
  /* v: a materialized view (strided), then a leaf of the next trace */
  kiln_tensor *v = kiln_transpose(a, 0, 1);
  float vbuf[C * R], want_e[C * R];
  CHECK(kiln_to_buffer(v, vbuf, sizeof vbuf) == KILN_OK);
  snap(&s0);
  kiln_tensor *v2 = kiln_mul_scalar(v, 2.0), *e = kiln_add_scalar(v2, 1.0);
  for (int i = 0; i < C * R; i++) {
    float t = vbuf[i] * 2.0f;
    want_e[i] = t + 1.0f;
  }
  check_f32_exact(e, want_e, C * R, "materialized transpose * 2 + 1");
  mark(out, "materialized-strided-leaf", &s0, NEED_COMPILE);
  CHECK(emit(out, "views.e", e, 0));
  kiln_tensor *all[] = {a, b, row, at, bs, br, rx, m, h, s, c, gt, wh, d, v, v2, e};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

/* identities a plan must not "simplify" away on special values: x+0 is +0 for
   x = -0, x*0 and x-x are NaN for infinities, exp(log x) is NaN for x < 0 */
static void directed_identities(FILE *out) {
  static const float X[] = {-1.5f,     -0.0f, 0.0f,   2.0f, INFINITY,
                            -INFINITY, NAN,   1e-40f, 3.0f, -7.25f};
  enum { N = sizeof X / sizeof X[0] };
  ktest_current = "directed identities";
  fprintf(out,
          "P identities 0\nO x = f32[-1.5, -0, 0, 2, inf, -inf, nan, 1e-40, 3, -7.25]\n"
          "O neg(neg x), x*1, x+0, x-0, x*0, x-x, x/x, x+zeros, x*ones, maximum(x, x), "
          "exp(log x), log(exp x) in one trace\n");
  fflush(out); /* a crash below still names this test */
  kiln_tensor *x = kiln_from_data(X, KILN_F32, 1, S(N));
  kiln_tensor *z = kiln_zeros(KILN_F32, 1, S(N)), *one = kiln_ones(KILN_F32, 1, S(N));
  kiln_stats s0;
  snap(&s0);
  kiln_tensor *nx = kiln_neg(x), *lx = kiln_log(x), *ex = kiln_exp(x);
  kiln_tensor *r[12] = {kiln_neg(nx),
                        kiln_mul_scalar(x, 1.0),
                        kiln_add_scalar(x, 0.0),
                        kiln_sub_scalar(x, 0.0),
                        kiln_mul_scalar(x, 0.0),
                        kiln_sub(x, x),
                        kiln_div(x, x),
                        kiln_add(x, z),
                        kiln_mul(x, one),
                        kiln_maximum(x, x),
                        kiln_exp(lx),
                        kiln_log(ex)};
  static const char *const names[12] = {"neg(neg x)", "x*1",          "x+0",        "x-0",
                                        "x*0",        "x-x",          "x/x",        "x+zeros",
                                        "x*ones",     "maximum(x,x)", "exp(log x)", "log(exp x)"};
  CHECK(kiln_sync() == KILN_OK);
  mark(out, "identities", &s0, NEED_COMPILE);
  for (int k = 0; k < 12; k++) {
    float want[N];
    for (int i = 0; i < N; i++) {
      volatile float v = X[i], zero = 0.0f, onef = 1.0f;
      switch (k) {
        case 0:
          want[i] = v;
          break;
        case 1:
        case 8:
          want[i] = v * onef;
          break;
        case 2:
        case 7:
          want[i] = v + zero;
          break;
        case 3:
          want[i] = v - zero;
          break;
        case 4:
          want[i] = v * zero;
          break;
        case 5:
          want[i] = v - v;
          break;
        case 6:
          want[i] = v / v;
          break;
        case 9:
          want[i] = v;
          break;
        default:
          want[i] = k == 10 ? expf(logf(v)) : logf(expf(v));
          break;
      }
    }
    char name[48];
    snprintf(name, sizeof name, "id.%d", k);
    if (k < 10) {
      check_f32_exact(r[k], want, N, names[k]);
      CHECK(emit(out, name, r[k], 0));
    } else { /* approximated math: NaN where C has NaN, else close */
      float got[N];
      if (r[k] && kiln_to_buffer(r[k], got, sizeof got) == KILN_OK) {
        for (int i = 0; i < N; i++) {
          bool ok = isnan(want[i]) ? isnan(got[i])
                    : isinf(want[i])
                        ? got[i] == want[i]
                        : fabsf(got[i] - want[i]) <= 1e-5f * fmaxf(1.0f, fabsf(want[i]));
          if (!ok)
            KTEST_FAIL("%s of %g = %.9g, expected %.9g", names[k], (double)X[i], (double)got[i],
                       (double)want[i]);
        }
      }
      CHECK(emit(out, name, r[k], 2 * ULPS_PER_CALL * 0x1p-24));
    }
  }
  for (int k = 0; k < 12; k++) kiln_release(r[k]);
  kiln_tensor *all[] = {x, z, one, nx, lx, ex};
  for (int i = 0; i < 6; i++) kiln_release(all[i]);
}

/* a 2^16-element kernel with a row and a column broadcast, split by the thread
   pool in mid-row, in f32 and i32, against C */
static void directed_large(FILE *out) {
  enum { R = 257, C = 255 };
  ktest_current = "directed large broadcast";
  fprintf(out,
          "P large 0\nO a = f32[257,255], row = f32[255], col = f32[257,1]\n"
          "O f = maximum((a*row - col) / 1.5, col) and the same in i32 (a*row - col + a)\n");
  fflush(out); /* a crash below still names this test */
  float *av = malloc(sizeof(float) * R * C), rowv[C], colv[R];
  int32_t *ai = malloc(sizeof(int32_t) * R * C), rowi[C], coli[R];
  for (int i = 0; i < R * C; i++) {
    av[i] = (float)((i * 37) % 101) * 0.125f - 6.0f;
    ai[i] = (i * 7919) % 2003 - 1000;
  }
  for (int j = 0; j < C; j++) {
    rowv[j] = (float)(j % 13) - 6.5f;
    rowi[j] = j * 131 - 17000;
  }
  for (int i = 0; i < R; i++) {
    colv[i] = (float)(i % 17) * 0.75f;
    coli[i] = 2147483000 + i; /* a*row - col wraps */
  }
  kiln_tensor *a = kiln_from_data(av, KILN_F32, 2, S(R, C)),
              *row = kiln_from_data(rowv, KILN_F32, 1, S(C));
  kiln_tensor *col = kiln_from_data(colv, KILN_F32, 2, S(R, 1));
  kiln_tensor *a2 = kiln_from_data(ai, KILN_I32, 2, S(R, C)),
              *row2 = kiln_from_data(rowi, KILN_I32, 1, S(C));
  kiln_tensor *col2 = kiln_from_data(coli, KILN_I32, 2, S(R, 1));
  kiln_stats s0;
  snap(&s0);
  kiln_tensor *m = kiln_mul(a, row), *d = kiln_sub(m, col), *q = kiln_div_scalar(d, 1.5);
  kiln_tensor *f = kiln_maximum(q, col);
  kiln_tensor *m2 = kiln_mul(a2, row2), *d2 = kiln_sub(m2, col2), *f2 = kiln_add(d2, a2);
  CHECK(f && f2 && kiln_sync() == KILN_OK);
  mark(out, "large-broadcast", &s0, NEED_COMPILE);
  float *want = malloc(sizeof(float) * R * C);
  int32_t *want2 = malloc(sizeof(int32_t) * R * C), *got2 = malloc(sizeof(int32_t) * R * C);
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) {
      float p = av[i * C + j] * rowv[j], t = p - colv[i], u = t / 1.5f;
      want[i * C + j] = u > colv[i] ? u : colv[i];
      uint32_t w =
          (uint32_t)ai[i * C + j] * (uint32_t)rowi[j] - (uint32_t)coli[i] + (uint32_t)ai[i * C + j];
      want2[i * C + j] = (int32_t)w;
    }
  check_f32_exact(f, want, R * C, "maximum((a*row - col)/1.5, col)");
  if (kiln_to_buffer(f2, got2, sizeof(int32_t) * R * C) == KILN_OK) {
    for (int i = 0; i < R * C; i++)
      if (got2[i] != want2[i]) {
        KTEST_FAIL("i32 a*row - col + a [%d] = %d, expected %d", i, got2[i], want2[i]);
        break;
      }
  }
  CHECK(emit(out, "large.f32", f, 0) && emit(out, "large.i32", f2, 0));
  kiln_tensor *all[] = {a, row, col, a2, row2, col2, m, d, q, f, m2, d2, f2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
  free(av);
  free(ai);
  free(want);
  free(want2);
  free(got2);
}

/* every elementwise op, *_scalar op, where, clamp and cast on every dtype
   it accepts (and binary ops on mixed dtypes), so that coverage does not
   depend on the seeds: one trace per (dtype, family), at most ~20 outputs
   each (a kernel has at most 32 inputs and outputs) */
typedef struct {
  kiln_tensor *t[24];
  char name[24][48];
  double bound[24];
  int n;
} sweep_set;

static void sweep_add(sweep_set *ss, kiln_tensor *t, const char *name, kiln_dtype in, num model) {
  if (!t) {
    KTEST_FAIL("sweep: %s on %s returned NULL: %s", name, DT_NAME[in], kiln_last_error());
    return;
  }
  count_op(name, in);
  bool device_math = !strcmp(name, "pow") || !strcmp(name, "pow_scalar");
  for (int fn = 0; fn < N_UNARY; fn++)
    device_math |= unary_is_math(fn) && !strcmp(name, UNARY[fn].name);
  snprintf(ss->name[ss->n], sizeof ss->name[0], "sweep.%s.%s%s", DT_NAME[in], name,
           device_math ? "~" : "");
  ss->bound[ss->n] = is_exact(model) ? 0 : bound_of(model);
  ss->t[ss->n++] = t;
}

static void sweep_flush(FILE *out, sweep_set *ss, const char *label, const kiln_stats *s0) {
  CHECK(kiln_sync() == KILN_OK);
  mark(out, label, s0, NEED_COMPILE);
  for (int i = 0; i < ss->n; i++) {
    CHECK(emit(out, ss->name[i], ss->t[i], ss->bound[i]));
    kiln_release(ss->t[i]);
  }
  ss->n = 0;
}

/* the sweep's float operands: x [2,6] against y [6] meets every pair of
   special values whose order or sign an op may get wrong (NaN on either
   side and both, -0 against +0 both ways, infinities), then plain values */
static kiln_tensor *sweep_leaf(kiln_dtype dt, bool is_x, int vk, uint64_t seed) {
  static const double X[12] = {NAN, 1, -0.0, 0.0, INFINITY, -1.25, -0.0, NAN, 0.0, -0.0, NAN, 2.5};
  static const double Y[6] = {1, NAN, 0.0, -0.0, -INFINITY, 2.5};
  int nd = is_x ? 2 : 1;
  const int64_t *shape = is_x ? S(2, 6) : S(6);
  const double *v = is_x ? X : Y;
  if (!dt_float(dt)) return make_leaf(dt, nd, shape, vk, seed);
  if (dt == KILN_F64) return kiln_from_data(v, dt, nd, shape);
  float f[12];
  for (int i = 0; i < (is_x ? 12 : 6); i++) f[i] = (float)v[i];
  if (dt == KILN_F32) return kiln_from_data(f, dt, nd, shape);
  kiln_tensor *w = kiln_from_data(f, KILN_F32, nd, shape), *h = kiln_cast(w, dt); /* halves */
  kiln_release(w);
  return h;
}

static void directed_sweep(FILE *out) {
  ktest_current = "directed op x dtype sweep";
  fprintf(out,
          "P sweep 0\nO x = leaf [2,6], y = leaf [6] of each dtype (floats: the pairs (NaN, 1), "
          "(1, NaN), (NaN, NaN), (-0, +0), (+0, -0), (inf, -inf), ...; integers in [-5, 5]); every "
          "unary, binary (x, y), *_scalar (x, 2.5 / pow 2), "
          "where(x > y, x, y), clamp(x, -1.5, 2.25), cast(x, each dtype); binary ops on "
          "bool/f32, i32/f64, i64/f32, i32/i64, bool/i32, bf16/f16, bf16/f32, u8/f16, u8/i8, "
          "i8/i16 pairs\n");
  fflush(out); /* a crash below still names this test */
  static const kiln_dtype mixed[][2] = {
      {KILN_BOOL, KILN_F32}, {KILN_I32, KILN_F64},  {KILN_I64, KILN_F32},  {KILN_I32, KILN_I64},
      {KILN_BOOL, KILN_I32}, {KILN_BF16, KILN_F16}, {KILN_BF16, KILN_F32}, {KILN_U8, KILN_F16},
      {KILN_U8, KILN_I8},    {KILN_I8, KILN_I16}};
  sweep_set ss = {0};
  char label[48];
  int nmixed = (int)(sizeof mixed / sizeof mixed[0]);
  for (int d = 0; d < NDT + nmixed; d++) {
    bool mix = d >= NDT;
    kiln_dtype dx = mix ? mixed[d - NDT][0] : (kiln_dtype)d, dy = mix ? mixed[d - NDT][1] : dx;
    int vkx = dt_float(dx) ? VK_NONFIN : VK_MOD, vky = dt_float(dy) ? VK_NONFIN : VK_MOD;
    kiln_tensor *x = sweep_leaf(dx, true, vkx, 101 + (uint64_t)d);
    kiln_tensor *y = sweep_leaf(dy, false, vky, 203 + (uint64_t)d);
    num nx = mk(leaf_mag(dx, vkx), 0, 0), ny = mk(leaf_mag(dy, vky), 0, 0), o;
    kiln_stats s0;
    if (!mix) {
      snap(&s0);
      for (int fn = 0; fn < N_UNARY; fn++) {
        if (dx == KILN_BOOL && (fn == U_NEG || fn == U_RELU)) continue;
        if (model_unary(fn, nx, unary_out(fn, dx), &o))
          sweep_add(&ss, UNARY[fn].f(x), UNARY[fn].name, dx, o);
      }
      snprintf(label, sizeof label, "sweep-unary-%s", DT_NAME[dx]);
      sweep_flush(out, &ss, label, &s0);
    }
    snap(&s0);
    for (int fn = 0; fn < N_BINARY; fn++) {
      if (dx == KILN_BOOL && dy == KILN_BOOL && (fn == B_SUB || fn == B_POW)) continue;
      if (model_binary(fn, nx, ny, binary_out(fn, dx, dy), &o))
        sweep_add(&ss, BINARY[fn].f(x, y), BINARY[fn].name, promote(dx, dy), o);
    }
    snprintf(label, sizeof label, "sweep-binary-%s-%s", DT_NAME[dx], DT_NAME[dy]);
    sweep_flush(out, &ss, label, &s0);
    if (!mix) {
      snap(&s0);
      for (int fn = 0; fn < N_SCALAR; fn++) {
        double sc = fn == S_POW ? 2 : 2.5;
        if (model_scalar(fn, nx, sc, scalar_out(dx), &o))
          sweep_add(&ss, SCALAR[fn].f(x, sc), SCALAR[fn].name, dx, o);
      }
      kiln_tensor *c = kiln_gt(x, y);
      sweep_add(&ss, kiln_where(c, x, y), "where", dx, nx);
      kiln_release(c);
      if (dx != KILN_BOOL) sweep_add(&ss, kiln_clamp(x, -1.5, 2.25), "clamp", dx, nx);
      for (int to = 0; to < NDT; to++) {
        char name[16];
        snprintf(name, sizeof name, "cast->%s", DT_NAME[to]);
        sweep_add(&ss, kiln_cast(x, (kiln_dtype)to), name, dx, mk(0, 0, 0));
      }
      snprintf(label, sizeof label, "sweep-scalar-where-clamp-cast-%s", DT_NAME[dx]);
      sweep_flush(out, &ss, label, &s0);
    }
    kiln_release(x);
    kiln_release(y);
  }
}

/* elementwise kernels planned next to a reduction keep IEEE semantics (no
   -fno-signed-zeros / -fassociative-math leaking from the reduction): signed
   zeros, infinities of 1/sqrt(+0) and the evaluation order, against C */
static void directed_next_to_reduction(FILE *out) {
  enum { N = 8 };
  static const float X[N] = {-0.5f, 0.5f, -0.0f, 0.0f, -1.5f, 2.0f, -0.25f, 3.0f};
  static const double A[N] = {-3.125, 0.3, 7.75, -1.1, 2.5, 1e-3, -6.0, 4.4};
  ktest_current = "directed elementwise next to a reduction";
  fprintf(out,
          "P next-to-reduction 0\nO x = f32[-0.5, 0.5, -0, 0, -1.5, 2, -0.25, 3]; a = f64[8]; "
          "s = sum(x) in the same trace\n"
          "O cast(x, i64) * 0.99; rsqrt(cast(x, i32)); x + 0; (x + 2^24) - 2^24; "
          "(0.3125 - (a + 6.62)) * -0.01\n");
  fflush(out); /* a crash below still names this test */
  int64_t n = N;
  kiln_tensor *x = kiln_from_data(X, KILN_F32, 1, &n), *a = kiln_from_data(A, KILN_F64, 1, &n);
  kiln_stats s0;
  snap(&s0);
  kiln_tensor *sum = kiln_sum(x, 0, NULL, false);
  kiln_tensor *ci = kiln_cast(x, KILN_I64), *r0 = kiln_mul_scalar(ci, 0.99);
  kiln_tensor *c32 = kiln_cast(x, KILN_I32), *r1 = kiln_rsqrt(c32);
  kiln_tensor *r2 = kiln_add_scalar(x, 0.0);
  kiln_tensor *big = kiln_add_scalar(x, 16777216.0), *r3 = kiln_sub_scalar(big, 16777216.0);
  kiln_tensor *b = kiln_full(0.3125, KILN_F64, 0, NULL);
  kiln_tensor *t7 = kiln_add_scalar(a, 6.62), *t14 = kiln_sub(b, t7);
  kiln_tensor *r4 = kiln_mul_scalar(t14, -0.01);
  CHECK(kiln_sync() == KILN_OK);
  mark(out, "next-to-reduction", &s0, NEED_COMPILE);
  float w0[N], w1[N], w2[N], w3[N];
  double w4[N], g4[N];
  for (int i = 0; i < N; i++) {
    volatile float v = X[i], c = 0.99f, z = 0.0f, b = 16777216.0f, one = 1.0f;
    w0[i] = (float)(int64_t)v * c;
    w1[i] = one / sqrtf((float)(int32_t)v);
    w2[i] = v + z;
    volatile float t = v + b;
    w3[i] = t - b;
    volatile double p = A[i] + 6.62, q = 0.3125 - p;
    w4[i] = q * -0.01;
  }
  check_f32_exact(r0, w0, N, "cast(x, i64) * 0.99");
  check_f32_exact(r1, w1, N, "rsqrt(cast(x, i32))");
  check_f32_exact(r2, w2, N, "x + 0");
  check_f32_exact(r3, w3, N, "(x + 2^24) - 2^24");
  if (r4 && kiln_to_buffer(r4, g4, sizeof g4) == KILN_OK)
    for (int i = 0; i < N; i++)
      if (memcmp(&g4[i], &w4[i], sizeof(double))) {
        KTEST_FAIL("(0.3125 - (a + 6.62)) * -0.01 [%d] = %a, expected %a", i, g4[i], w4[i]);
        break;
      }
  CHECK(emit(out, "red.cast_mul", r0, 0) && emit(out, "red.rsqrt", r1, 0) &&
        emit(out, "red.add0", r2, 0) && emit(out, "red.order", r3, 0) &&
        emit(out, "red.f64", r4, 0));
  kiln_tensor *all[] = {x, a, sum, ci, r0, c32, r1, r2, big, r3, b, t7, t14, r4};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

/* a view of an elementwise value, in a trace whose reduction group fuses
   that value (one-element tensors): run last, it crashed */
static void directed_view_next_to_reduction(FILE *out) {
  ktest_current = "directed view next to a reduction";
  fprintf(out,
          "P view-next-to-reduction 0\nO x = f32[1,1] {0.5}; l = log_softmax(x, -1); "
          "p = transpose(neg(x), 0, 1)\n");
  fflush(out); /* a crash below still names this test */
  const float v = 0.5f;
  kiln_tensor *x = kiln_from_data(&v, KILN_F32, 2, S(1, 1));
  kiln_stats s0;
  snap(&s0);
  kiln_tensor *l = kiln_log_softmax(x, -1), *r = kiln_neg(x), *p = kiln_transpose(r, 0, 1);
  kiln_release(r);
  CHECK(kiln_sync() == KILN_OK);
  mark(out, "view-next-to-reduction", &s0,
       NEED_NOTHING); /* a crash regression: the group stays interpreted */
  check_f32_exact(p, (const float[]){-0.5f}, 1, "transpose(neg(x))");
  check_f32_exact(l, (const float[]){0.0f}, 1, "log_softmax(x) of one element");
  CHECK(emit(out, "vred.p", p, 0) && emit(out, "vred.l", l, 0));
  kiln_release(x);
  kiln_release(l);
  kiln_release(p);
}

/* back-to-back parallel kernels with a host read between them: a pool
   worker that woke after its job had finished once took chunks of the next
   job with the old (NULL) function (vm/pool.c) */
static void directed_pool_stress(FILE *out) {
  enum { ITERS = 4000 };
  ktest_current = "directed thread pool stress";
  fprintf(out,
          "P pool-stress 0\nO x = ones(f32[65536]); %d times: y = x*1.5 - 0.25 (a kernel split "
          "over the pool), read y[0]\n",
          ITERS);
  fflush(out); /* a crash below still names this test */
  int64_t n = 1 << 16;
  kiln_tensor *x = kiln_ones(KILN_F32, 1, &n), *y = NULL;
  kiln_stats s0;
  snap(&s0);
  for (int it = 0; it < ITERS; it++) {
    kiln_tensor *m = kiln_mul_scalar(x, 1.5), *d = kiln_sub_scalar(m, 0.25),
                *h = kiln_slice(d, 0, 0, 1, 1);
    float v = 0;
    if (kiln_to_buffer(h, &v, sizeof v) != KILN_OK || v != 1.25f) {
      KTEST_FAIL("iteration %d: y[0] = %g, expected 1.25 (%s)", it, (double)v, kiln_last_error());
      it = ITERS;
    }
    kiln_release(m);
    kiln_release(h);
    kiln_release(y);
    y = d;
  }
  mark(out, "pool-stress", &s0, NEED_KERNEL);
  CHECK(y && emit(out, "pool.y", y, 0));
  kiln_release(x);
  kiln_release(y);
}

/* The layers of real models (conv2d with stride / padding / dilation /
   groups, max and avg pooling, batch_norm in training and eval, dropout,
   cumsum, var, sort, topk, embedding, one_hot, nll_loss, bce_with_logits)
   and their gradients, in seeded random geometries: each program feeds a
   fusable elementwise prelude into them and sums what they give into one
   loss, so compiled kernels border their index and matmul ops on both
   sides; it runs twice (the second time from cached plans).  Every value
   and gradient must be bit-identical to the interpreter's. */
enum { LAYER_PROGRAMS = 12 };

static kiln_tensor *lay_keep(kiln_tensor **keep, int *n, kiln_tensor *t) {
  if (*n < 96) keep[(*n)++] = t;
  return t;
}

static kiln_tensor *index_leaf(uint64_t *g, int nd, const int64_t *shape, int64_t bound) {
  int64_t n = shape_numel(nd, shape), v[64];
  for (int64_t i = 0; i < n && i < 64; i++) v[i] = rn(g, (int)bound);
  return kiln_from_data(v, KILN_I64, nd, shape);
}

static int64_t out_len(int64_t in, int64_t k, int64_t st, int64_t pad, int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / st + 1;
}

static void layer_program(FILE *out, int prog_no, int rep) {
  uint64_t g = 0x1a7e5u + 7919u * (uint64_t)prog_no;
  kiln_tensor *keep[96];
  int nk = 0;
#define K(t) lay_keep(keep, &nk, (t))
  kiln_dtype dt = coin(&g, 70) ? KILN_F32 : KILN_F64;
  int groups = rr(&g, 1, 2), st[2], pad[2], dil[2], pk[2], pst[2], ppad[2];
  int64_t n = rr(&g, 1, 3), cin = groups * rr(&g, 1, 2), cout = groups * rr(&g, 1, 3);
  int64_t hw[2] = {rr(&g, 4, 9), rr(&g, 4, 9)}, kk[2] = {rr(&g, 1, 3), rr(&g, 1, 3)};
  for (int d = 0; d < 2; d++) {
    st[d] = rr(&g, 1, 2), dil[d] = rr(&g, 1, 2), pad[d] = rr(&g, 0, 1);
    while (out_len(hw[d], kk[d], st[d], pad[d], dil[d]) < 2) pad[d]++;
    pk[d] = rr(&g, 1, 2), pst[d] = rr(&g, 1, 2), ppad[d] = pk[d] / 2 ? rr(&g, 0, 1) : 0;
  }
  bool max_pool = coin(&g, 60), bias = coin(&g, 70), train = coin(&g, 70),
       drop_train = coin(&g, 50);
  int cum_axis = rr(&g, 0, 3), corr = rr(&g, 0, 1);
  bool desc = coin(&g, 50);
  char text[400];
  snprintf(
      text, sizeof text,
      "%s x[%lld,%lld,%lld,%lld] conv %lldx%lld->%lld groups %d stride %d,%d pad %d,%d dil %d,%d "
      "bias %d; %s pool %dx%d stride %d,%d pad %d,%d; batch_norm train %d; dropout train %d",
      DT_NAME[dt], (long long)n, (long long)cin, (long long)hw[0], (long long)hw[1],
      (long long)kk[0], (long long)kk[1], (long long)cout, groups, st[0], st[1], pad[0], pad[1],
      dil[0], dil[1], bias, max_pool ? "max" : "avg", pk[0], pk[1], pst[0], pst[1], ppad[0],
      ppad[1], train, drop_train);
  fprintf(out, "P layers-%d %d\nO %s\n", prog_no, rep, text);
  fflush(out);
  char name[64];
#define EMIT(t, what)                                                  \
  do {                                                                 \
    snprintf(name, sizeof name, "layers%d.%d.%s", prog_no, rep, what); \
    CHECK((t) && emit(out, name, (t), 0));                             \
  } while (0)
  uint64_t vs = 0x5eed0000u + 131u * (uint64_t)prog_no + (uint64_t)rep; /* new values on rep 1 */
  kiln_tensor *x = K(make_leaf(dt, 4, (int64_t[]){n, cin, hw[0], hw[1]}, VK_MOD, vs));
  kiln_tensor *w =
      K(make_leaf(dt, 4, (int64_t[]){cout, cin / groups, kk[0], kk[1]}, VK_MOD, vs + 1));
  kiln_tensor *b = bias ? K(make_leaf(dt, 1, &cout, VK_MOD, vs + 2)) : NULL;
  kiln_tensor *gw = K(make_leaf(dt, 1, &cout, VK_POS, vs + 3)),
              *gb = K(make_leaf(dt, 1, &cout, VK_MOD, vs + 4));
  kiln_tensor *rm = K(kiln_zeros(dt, 1, &cout)), *rv = K(kiln_ones(dt, 1, &cout));
  kiln_tensor *leaves[] = {x, w, b, gw, gb};
  for (int i = 0; i < 5; i++)
    if (leaves[i]) kiln_set_requires_grad(leaves[i], true);
  kiln_stats s0;
  snap(&s0);
  kiln_manual_seed(1000 + (uint64_t)prog_no);
  kiln_tensor *xs = K(kiln_sub_scalar(K(kiln_mul_scalar(x, 1.5)), 0.25));
  kiln_tensor *c = K(kiln_conv2d(xs, w, b, st, pad, dil, groups));
  kiln_tensor *a = K(kiln_tanh(c));
  kiln_tensor *p =
      K(max_pool ? kiln_max_pool2d(a, pk, pst, ppad) : kiln_avg_pool2d(a, pk, pst, ppad));
  kiln_tensor *bn = K(kiln_batch_norm(p, rm, rv, gw, gb, train, 0.1, 1e-5));
  kiln_tensor *d = K(kiln_dropout(bn, 0.3, drop_train));
  kiln_tensor *cs = K(kiln_cumsum(d, cum_axis));
  int vax[1] = {1};
  kiln_tensor *v = K(kiln_var(d, 1, vax, corr, true));
  kiln_tensor *flat = K(kiln_reshape(d, 2, (int64_t[]){n, -1}));
  kiln_tensor *sidx = NULL, *tidx = NULL;
  kiln_tensor *sorted = K(kiln_sort(flat, 1, desc, &sidx));
  K(sidx);
  int64_t kt = kiln_numel(flat) / n > 2 ? 2 : 1;
  kiln_tensor *top = K(kiln_topk(flat, kt, 1, !desc, &tidx));
  K(tidx);
  /* embedding, one_hot and the losses on their own leaves */
  int64_t V = rr(&g, 2, 6), D = rr(&g, 1, 4), ishape[2] = {rr(&g, 1, 3), rr(&g, 1, 3)};
  int64_t B = rr(&g, 1, 4), C = rr(&g, 2, 5);
  kiln_tensor *E = K(make_leaf(dt, 2, (int64_t[]){V, D}, VK_MOD, vs + 5));
  kiln_tensor *z = K(make_leaf(dt, 2, (int64_t[]){B, C}, VK_MOD, vs + 6));
  kiln_tensor *q = K(make_leaf(dt, 2, (int64_t[]){B, C}, VK_MOD, vs + 7));
  kiln_set_requires_grad(E, true);
  kiln_set_requires_grad(z, true);
  kiln_tensor *idx = K(index_leaf(&g, 2, ishape, V)), *target = K(index_leaf(&g, 1, &B, C));
  kiln_tensor *emb = K(kiln_embedding(E, idx));
  kiln_tensor *oh = K(kiln_one_hot(idx, V, dt));
  kiln_tensor *nll = K(kiln_nll_loss(K(kiln_log_softmax(z, 1)), target));
  kiln_tensor *bce = K(kiln_bce_with_logits(z, K(kiln_sigmoid(q))));
  kiln_tensor *terms[] = {K(kiln_sum(K(kiln_mul(cs, cs)), 0, NULL, false)),
                          K(kiln_sum(v, 0, NULL, false)),
                          K(kiln_sum(K(kiln_mul_scalar(sorted, 0.5)), 0, NULL, false)),
                          K(kiln_sum(top, 0, NULL, false)),
                          K(kiln_sum(K(kiln_mul(emb, emb)), 0, NULL, false)),
                          nll,
                          bce};
  kiln_tensor *loss = terms[0];
  for (int i = 1; i < 7; i++) loss = K(kiln_add(loss, terms[i]));
  CHECK(loss && kiln_backward(loss, NULL) == KILN_OK);
  EMIT(c, "conv");
  EMIT(p, "pool");
  EMIT(bn, "batch_norm");
  EMIT(d, "dropout");
  EMIT(cs, "cumsum");
  EMIT(v, "var");
  EMIT(sorted, "sort");
  EMIT(sidx, "sort.indices");
  EMIT(top, "topk");
  EMIT(tidx, "topk.indices");
  EMIT(emb, "embedding");
  EMIT(oh, "one_hot");
  EMIT(loss, "loss");
  EMIT(rm, "running_mean");
  EMIT(rv, "running_var");
  const char *gname[] = {"grad.x", "grad.w", "grad.b", "grad.bn_w", "grad.bn_b"};
  for (int i = 0; i < 5; i++) {
    if (!leaves[i]) continue;
    kiln_tensor *gr = K(kiln_grad(leaves[i]));
    EMIT(gr, gname[i]);
  }
  kiln_tensor *ge = K(kiln_grad(E)), *gz = K(kiln_grad(z));
  EMIT(ge, "grad.embedding");
  EMIT(gz, "grad.logits");
  snprintf(name, sizeof name, "layers-%d.%d", prog_no, rep);
  mark(out, name, &s0, rep ? NEED_KERNEL : NEED_NOTHING);
  for (int i = 0; i < nk; i++) kiln_release(keep[i]);
#undef K
#undef EMIT
}

static void directed_layers(FILE *out) {
  ktest_current = "directed layers";
  for (int i = 0; i < LAYER_PROGRAMS; i++)
    for (int rep = 0; rep < 2; rep++) layer_program(out, i, rep);
}

static void print_stats(FILE *out) {
  kiln_stats st;
  snap(&st);
  fprintf(
      out,
      "S compiles=%llu eager=%llu failures=%llu flushes=%llu hits=%llu ops=%llu compile_ms=%.0f\n",
      (unsigned long long)st.compiles, (unsigned long long)st.eager_ops,
      (unsigned long long)st.compile_failures, (unsigned long long)st.flushes,
      (unsigned long long)st.cache_hits, (unsigned long long)st.ops_recorded, st.compile_ms);
  for (int i = 0; i < ncov; i++)
    for (int d = 0; d < NDT; d++)
      if (cov[i].n[d]) fprintf(out, "C %s %s %ld\n", cov[i].name, DT_NAME[d], cov[i].n[d]);
}

static int child_main(int argc, char **argv) {
  const char *jit = getenv("KILN_JIT");
  child_jit = !jit || strcmp(jit, "0") != 0;
  no_pending_views = getenv("KILN_FUZZ_NO_PENDING_VIEWS") && *getenv("KILN_FUZZ_NO_PENDING_VIEWS");
  FILE *out = stdout;
  static char obuf[1 << 16];
  setvbuf(out, obuf, _IOFBF, sizeof obuf);
  const char *dev = getenv("KILN_DEVICE"), *fuzz_dev = getenv("KILN_FUZZ_DEVICE");
  on_cuda = dev && !strcmp(dev, "cuda");
  /* the GPU fuzz's children, the CPU's among them, run the same tests */
  bool gpu_fuzz = fuzz_dev && !strcmp(fuzz_dev, "cuda");
  if (on_cuda && !kiln_device_available(KILN_CUDA)) {
    fprintf(out, "X no CUDA device: %s\n", kiln_device_info(KILN_CUDA));
    fflush(out);
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[2], "directed")) {
    static const struct {
      void (*run)(FILE *);
      bool gpu; /* on the GPU too (the pool stress is the CPU thread pool's) */
    } tests[] = {
        {directed_w1, true},
        {directed_casts, true},
        {directed_views, true},
        {directed_identities, true},
        {directed_large, true},
        {directed_sweep, true},
        {directed_next_to_reduction, true},
        {directed_view_next_to_reduction, true}, /* these two crashed: last */
        {directed_pool_stress, false},
        {directed_layers, true},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
      double t0 = now_s();
      if (!gpu_fuzz || tests[i].gpu) tests[i].run(out);
      if (getenv("KILN_FUZZ_TIME")) fprintf(stderr, "directed test %zu: %.2f s\n", i, now_s() - t0);
    }
  } else if (argc >= 5 && !strcmp(argv[2], "fuzz")) {
    uint64_t first = strtoull(argv[3], NULL, 10), count = strtoull(argv[4], NULL, 10);
    static oprec recs[MAXRECS];
    for (uint64_t seed = first; seed < first + count; seed++) {
      int n = 0;
      run_program(out, seed, 0, recs, &n);
      if (seed % 30 != 0) run_program(out, seed, 1, recs, &n);
    }
  } else {
    fprintf(stderr, "usage: %s --child fuzz <first> <count> | --child directed\n", argv[0]);
    return 2;
  }
  print_stats(out);
  fflush(out);
  if (ktest_failed_checks)
    fprintf(stderr, "child (%s): %d checks failed\n", child_jit ? "JIT" : "interpreter",
            ktest_failed_checks);
  return ktest_failed_checks ? 1 : 0;
}

/* ============================================================================
 * The parent: run the children, compare their outputs
 * ========================================================================== */

typedef struct {
  char *data;
  size_t len;
  char **lines;
  int nlines;
} blob;

static bool load_blob(const char *path, blob *b) {
  memset(b, 0, sizeof *b);
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  b->data = malloc((size_t)n + 1);
  b->len = fread(b->data, 1, (size_t)n, f);
  b->data[b->len] = 0;
  fclose(f);
  int cap = 1024;
  b->lines = malloc((size_t)cap * sizeof *b->lines);
  for (char *p = b->data; p < b->data + b->len;) {
    char *nl = memchr(p, '\n', (size_t)(b->data + b->len - p));
    if (!nl) break; /* a truncated last line (a crashed child) is dropped */
    *nl = 0;
    if (b->nlines == cap) b->lines = realloc(b->lines, (size_t)(cap *= 2) * sizeof *b->lines);
    b->lines[b->nlines++] = p;
    p = nl + 1;
  }
  return true;
}

static void free_blob(blob *b) {
  free(b->data);
  free(b->lines);
  memset(b, 0, sizeof *b);
}

typedef struct {
  long programs, replays, directed, results, elements, approx_elements, mismatched_programs,
      reported;
  long cross_results, cross_elements, cross_skipped; /* GPU against CPU */
  double max_dev[NDT], max_ratio[NDT];  /* of approximate floats: |a-b|/max(1,|b|), and / bound */
  unsigned long long compiles, kernels; /* kernels: interpreter ops the JIT runs did not need */
  long cov[MAXCOV][NDT];
  char cov_name[MAXCOV][32];
  int ncov;
} summary;

static summary sum;

static double decode(uint64_t bits, int dt) {
  switch (dt) {
    case KILN_BOOL:
      return (double)bits;
    case KILN_I32:
      return (double)(int32_t)(uint32_t)bits;
    case KILN_I64:
      return (double)(int64_t)bits;
    case KILN_F32: {
      uint32_t u = (uint32_t)bits;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case KILN_BF16:
      return vm_bf16_to_f32((uint16_t)bits);
    case KILN_F16:
      return vm_f16_to_f32((uint16_t)bits);
    case KILN_U8:
      return (double)(uint8_t)bits;
    case KILN_I8:
      return (double)(int8_t)(uint8_t)bits;
    case KILN_I16:
      return (double)(int16_t)(uint16_t)bits;
    default: {
      double d;
      memcpy(&d, &bits, 8);
      return d;
    }
  }
}

static void fmt_value(char *buf, size_t n, uint64_t bits, int dt) {
  double v = decode(bits, dt);
  if (dt_float((kiln_dtype)dt))
    snprintf(buf, n, "%.17g (%a, bits %llx)", v, v, (unsigned long long)bits);
  else if (dt == KILN_I64)
    snprintf(buf, n, "%lld", (long long)(int64_t)bits);
  else
    snprintf(buf, n, "%.0f", v);
}

/* the multi-index of flat element i of shape text "[a,b,c]" */
static void fmt_index(char *buf, size_t n, const char *shape, long long i) {
  long long dims[KILN_MAX_DIMS];
  int nd = 0;
  for (const char *p = shape + 1; *p && *p != ']' && nd < KILN_MAX_DIMS;) {
    dims[nd++] = strtoll(p, (char **)&p, 10);
    if (*p == ',') p++;
  }
  long long idx[KILN_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = dims[d] ? i % dims[d] : 0;
    i = dims[d] ? i / dims[d] : 0;
  }
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < nd && at < n; d++)
    at += (size_t)snprintf(buf + at, n - at, d ? ",%lld" : "%lld", idx[d]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

static void print_program(const blob *b, int first, int last) {
  fprintf(stderr, "  the program:\n");
  for (int i = first; i <= last && i < b->nlines; i++)
    if (b->lines[i][0] == 'O') fprintf(stderr, "    %s\n", b->lines[i] + 2);
}

static const char *program_label(const blob *b, int pline) {
  return pline >= 0 ? b->lines[pline] + 2 : "(before any program)";
}

static void report_program(const char *batch, const blob *jit, int pline, int upto,
                           const char *detail) {
  sum.mismatched_programs++;
  KTEST_FAIL("%s: program %s: %s", batch, program_label(jit, pline), detail);
  if (sum.reported++ < 5) {
    print_program(jit, pline, upto);
    if (pline >= 0 && jit->lines[pline][2] == 's')
      fprintf(stderr, "  reproduce: KILN_FUZZ_SEED=%lld ./test_jit_fuzz\n",
              strtoll(jit->lines[pline] + 3, NULL, 10));
  }
}

/* compares one result line pair; false (reported) on a mismatch */
static bool compare_result(const char *batch, const blob *ref, const blob *jit, int li, int lj,
                           int pline) {
  char nr[128], nj[128], dr[16], dj[16], sr[160], sj[160];
  double br, bj;
  long long cr, cj;
  int offr = 0, offj = 0;
  char detail[1024];
  if (sscanf(ref->lines[li], "R %127s %15s %159s %lg %lld %n", nr, dr, sr, &br, &cr, &offr) < 5 ||
      sscanf(jit->lines[lj], "R %127s %15s %159s %lg %lld %n", nj, dj, sj, &bj, &cj, &offj) < 5) {
    report_program(batch, jit, pline, lj, "a malformed result line");
    return false;
  }
  if (strcmp(nr, nj) || strcmp(dr, dj) || strcmp(sr, sj) || cr != cj) {
    snprintf(detail, sizeof detail, "result %s is %s%s in the %s, %s %s%s in the %s", nr, dr, sr,
             ref_name(), nj, dj, sj, jit_name());
    report_program(batch, jit, pline, lj, detail);
    return false;
  }
  if (cross && nr[strlen(nr) - 1] == '~') {
    sum.cross_skipped++;
    return true;
  }
  int dt = dt_parse(dr);
  bool fl = dt_float((kiln_dtype)dt);
  double tol = fl ? dt_tol((kiln_dtype)dt) : 0;
  const char *pr = ref->lines[li] + offr, *pj = jit->lines[lj] + offj;
  long long first = -1, ndiff = 0;
  uint64_t fr = 0, fj = 0;
  double fdev = 0;
  if (cross)
    sum.cross_results++;
  else
    sum.results++;
  for (long long i = 0; i < cr; i++) {
    char *er, *ej;
    uint64_t xr = strtoull(pr, &er, 16), xj = strtoull(pj, &ej, 16);
    pr = er;
    pj = ej;
    if (cross)
      sum.cross_elements++;
    else
      sum.elements++;
    if (xr == xj) continue;
    double a = decode(xj, dt), b = decode(xr, dt), dev = INFINITY;
    if (fl && isnan(a) && isnan(b)) continue; /* NaN payloads and signs are not compared */
    (void)br;
    (void)tol;
    if (first < 0) {
      first = i;
      fr = xr;
      fj = xj;
      fdev = dev;
    }
    ndiff++;
  }
  if (first < 0) return true;
  char vr[96], vj[96], ix[96];
  fmt_value(vr, sizeof vr, fr, dt);
  fmt_value(vj, sizeof vj, fj, dt);
  fmt_index(ix, sizeof ix, sr, first);
  snprintf(detail, sizeof detail,
           "result %s (%s%s): %lld of %lld elements differ; first: element %lld %s: %s %s, "
           "%s %s; %s",
           nr, dr, sr, ndiff, cr, first, ix, ref_name(), vr, jit_name(), vj,
           cross ? "the GPU computes this with the CPU's algorithm (IEEE arithmetic, the same "
                   "fold order), so it must give the same bits (docs/SEMANTICS.md)"
           : !fl ? "integer/bool results must be equal"
                 : "float results must be bit-identical (DESIGN §5: whether the JIT fired never "
                   "changes a result)");
  (void)fdev;
  report_program(batch, jit, pline, lj, detail);
  return false;
}

static void add_coverage(const char *line) {
  char name[32], dt[16];
  long n;
  if (sscanf(line, "C %31s %15s %ld", name, dt, &n) != 3) return;
  int d = dt_parse(dt), i = 0;
  if (d < 0) return;
  while (i < sum.ncov && strcmp(sum.cov_name[i], name)) i++;
  if (i == sum.ncov) {
    if (sum.ncov == MAXCOV) return;
    snprintf(sum.cov_name[sum.ncov++], sizeof sum.cov_name[0], "%s", name);
  }
  sum.cov[i][d] += n;
}

typedef struct {
  unsigned long long compiles, eager, failures;
  bool seen;
} child_stats;

static void parse_stats(const char *line, child_stats *s) {
  s->seen = sscanf(line, "S compiles=%llu eager=%llu failures=%llu", &s->compiles, &s->eager,
                   &s->failures) == 3;
}

/* the "E" lines of a directed test in both runs */
static void check_marks(const char *batch, const char *a, const char *b) {
  char la[64], lb[64];
  int need_a, need_b;
  unsigned long long ea, eb, ca, cb;
  if (sscanf(a, "E %63s %d %llu %llu", la, &need_a, &ea, &ca) != 4 ||
      sscanf(b, "E %63s %d %llu %llu", lb, &need_b, &eb, &cb) != 4 || strcmp(la, lb)) {
    KTEST_FAIL("%s: malformed or different marks \"%s\" / \"%s\"", batch, a, b);
    return;
  }
  if (ca) KTEST_FAIL("%s: %s: the KILN_JIT=0 run compiled %llu plans", batch, la, ca);
  if (need_a >= NEED_COMPILE && !cb) KTEST_FAIL("%s: %s: the JIT run compiled nothing", batch, la);
  if (need_a >= NEED_KERNEL && eb >= ea)
    KTEST_FAIL(
        "%s: %s: no compiled kernel ran in the JIT run (%llu interpreter ops, the "
        "reference %llu)",
        batch, la, eb, ea);
  if (ea > eb) sum.kernels += ea - eb;
}

/* the line index of b's last program header, or -1 */
static int last_program(const blob *b) {
  for (int i = b->nlines - 1; i >= 0; i--)
    if (b->lines[i][0] == 'P') return i;
  return -1;
}

static int find_line(const blob *b, const char *text) {
  for (int i = 0; i < b->nlines; i++)
    if (!strcmp(b->lines[i], text)) return i;
  return -1;
}

static void describe_status(char *buf, size_t n, int status) {
  if (WIFSIGNALED(status))
    snprintf(buf, n, "killed by signal %d", WTERMSIG(status));
  else
    snprintf(buf, n, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* A child that did not finish (no stats line: a crash, or a sanitizer
   report): reports the program it was in, printed from the other run.
   Returns that program's seed (0: a directed test, or none). */
static uint64_t report_death(const char *batch, const blob *dead, const blob *other, int status,
                             bool jit) {
  char how[64];
  describe_status(how, sizeof how, status);
  int pl = last_program(dead);
  const char *label = pl >= 0 ? dead->lines[pl] + 2 : "(before its first program)";
  KTEST_FAIL("%s: the %s died (%s) in program %s", batch,
             jit       ? (on_cuda ? "GPU fused run" : "JIT run")
             : cross   ? "CPU interpreter run"
             : on_cuda ? "GPU op-by-op run"
                       : "interpreter run",
             how, label);
  int po = pl >= 0 ? find_line(other, dead->lines[pl]) : -1;
  if (po >= 0 && sum.reported++ < 5) {
    print_program(other, po + 1, other->nlines - 1 < po + 200 ? other->nlines - 1 : po + 200);
    if (label[0] == 's')
      fprintf(stderr, "  reproduce: KILN_FUZZ_SEED=%llu ./test_jit_fuzz\n",
              strtoull(label + 1, NULL, 10));
  }
  return label[0] == 's' ? strtoull(label + 1, NULL, 10) : 0;
}

/* compares the two outputs of a pair line by line; returns the seed of the
   program a child died in (0: none) */
static uint64_t compare_batch(const char *batch, const blob *ref, const blob *jit, int ref_status,
                              int jit_status) {
  int i = 0, j = 0, pline = -1;
  bool program_bad = false, cross_skip = false;
  child_stats sr = {0}, sj = {0};
  for (int k = 0; k < ref->nlines; k++)
    if (ref->lines[k][0] == 'S') parse_stats(ref->lines[k], &sr);
  for (int k = 0; k < jit->nlines; k++)
    if (jit->lines[k][0] == 'S') parse_stats(jit->lines[k], &sj);
  while (i < ref->nlines && j < jit->nlines) {
    const char *a = ref->lines[i], *b = jit->lines[j];
    if (a[0] != b[0] || ((a[0] == 'P' || a[0] == 'O') && strcmp(a, b))) {
      char detail[600];
      snprintf(detail, sizeof detail, "the runs diverge: %s \"%.200s\", %s \"%.200s\"", ref_name(),
               a, jit_name(), b);
      if (!program_bad) report_program(batch, jit, pline, j, detail);
      /* resynchronize at the next program */
      while (++i < ref->nlines && ref->lines[i][0] != 'P' && ref->lines[i][0] != 'S') {
      }
      while (++j < jit->nlines && jit->lines[j][0] != 'P' && jit->lines[j][0] != 'S') {
      }
      program_bad = false;
      continue;
    }
    switch (a[0]) {
      case 'P':
        pline = j;
        program_bad = false;
        /* directed tests besides the sweep check their exact values against
           C's in the child; the rest of them is device math */
        cross_skip =
            cross && !(a[2] == 's' && a[3] >= '0' && a[3] <= '9') && strncmp(a + 2, "sweep ", 6);
        if (cross) break;
        sum.programs++;
        if (a[2] != 's' || a[3] < '0' || a[3] > '9')
          sum.directed++;
        else if (a[strlen(a) - 1] == '1')
          sum.replays++;
        break;
      case 'R':
        if (cross_skip)
          sum.cross_skipped++;
        else if (!program_bad && !compare_result(batch, ref, jit, i, j, pline))
          program_bad = true;
        break;
      case 'F':
        if (!program_bad) {
          char detail[800];
          snprintf(detail, sizeof detail, "a call failed: %s \"%.300s\", %s \"%.300s\"", ref_name(),
                   a, jit_name(), b);
          report_program(batch, jit, pline, j, detail);
        }
        program_bad = true;
        break;
      case 'E':
        if (!cross) check_marks(batch, a, b);
        break;
      case 'C':
        if (!cross) add_coverage(a);
        break;
      default:
        break;
    }
    i++;
    j++;
  }
  if (!sj.seen || !sr.seen) {
    uint64_t seed = 0;
    if (!sj.seen) seed = report_death(batch, jit, ref, jit_status, true);
    if (!sr.seen) {
      uint64_t s2 = report_death(batch, ref, jit, ref_status, false);
      if (!seed || (s2 && s2 < seed)) seed = s2;
    }
    return seed;
  }
  if (i < ref->nlines || j < jit->nlines)
    KTEST_FAIL("%s: the outputs have different lengths (%d and %d lines)", batch, ref->nlines,
               jit->nlines);
  if (cross) return 0; /* the counts were checked against the GPU op-by-op run */
  if (sr.compiles) KTEST_FAIL("%s: the KILN_JIT=0 run compiled %llu plans", batch, sr.compiles);
  if (sj.compiles == 0) KTEST_FAIL("%s: the JIT run compiled nothing", batch);
  if (sj.eager >= sr.eager)
    KTEST_FAIL(
        "%s: no compiled kernel ran: the JIT run made %llu interpreter ops, the "
        "reference %llu",
        batch, sj.eager, sr.eager);
  if (sj.failures)
    KTEST_FAIL("%s: %llu plans failed to compile (%s rejected generated code)", batch, sj.failures,
               on_cuda ? "NVRTC" : "libgccjit");
  sum.compiles += sj.compiles;
  if (sj.eager < sr.eager) sum.kernels += sr.eager - sj.eager;
  return 0;
}

/* --- the children -------------------------------------------------------------------- */

typedef struct {
  char name[96], out[600];
  char *argv[6];
  char args[3][32];
  bool jit;
  bool cpu;              /* the GPU fuzz's third child: the CPU interpreter */
  int threads;           /* KILN_THREADS of this child */
  uint64_t first, count; /* the seeds of a fuzz pair; count 0: the directed tests */
  pid_t pid;
  int status;
  double secs;
  struct timespec t0;
} job;

/* where make_env put KILN_THREADS: start_job sets each child's */
static int threads_slot;

/* environ without the variables the runs set, plus them; `cuda`: every
   tensor is made on the GPU (the op-by-op run there keeps the caller's
   KILN_CACHE_DIR: its kernels are the same in every batch) */
static char **make_env(bool jit, bool cuda, const char *cache_dir) {
  static const char *const drop[] = {
      "KILN_JIT=",   "KILN_HOT=",     "KILN_PAYOFF=",           "KILN_ASYNC=", "KILN_CACHE_DIR=",
      "KILN_CACHE=", "KILN_THREADS=", "KILN_RECOMPILE_BUDGET=", "KILN_DEVICE="};
  int n = 0;
  while (environ[n]) n++;
  char **env = calloc((size_t)n + 10, sizeof *env);
  int k = 0;
  for (int i = 0; i < n; i++) {
    bool keep = true;
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++)
      if (!strncmp(environ[i], drop[d], strlen(drop[d]))) keep = false;
    if (cuda && !jit && !strncmp(environ[i], "KILN_CACHE_DIR=", 15)) keep = true;
    if (keep) env[k++] = environ[i];
  }
  static char cache_var[700];
  snprintf(cache_var, sizeof cache_var, "KILN_CACHE_DIR=%s", cache_dir);
  threads_slot = k;
  env[k++] = "KILN_THREADS=4"; /* 2^16-element kernels split into 4 ranges */
  if (cuda) env[k++] = "KILN_DEVICE=cuda";
  if (jit) {
    env[k++] = "KILN_JIT=1";
    env[k++] = "KILN_HOT=1";
    env[k++] = "KILN_PAYOFF=0"; /* compile every hot trace, paying or not */
    env[k++] = "KILN_ASYNC=0";
    env[k++] = cache_var; /* empty: every kernel is compiled here */
  } else {
    env[k++] = "KILN_JIT=0";
  }
  env[k] = NULL;
  return env;
}

static void start_job(job *jb, const char *exe, char **env) {
  static const char *const threads_var[] = {"KILN_THREADS=1", "KILN_THREADS=2", "KILN_THREADS=4"};
  env[threads_slot] = (char *)threads_var[jb->threads == 1 ? 0 : jb->threads == 2 ? 1 : 2];
  clock_gettime(CLOCK_MONOTONIC, &jb->t0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(jb->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    close(fd);
    execve(exe, jb->argv, env);
    _exit(127);
  }
  jb->pid = pid;
  if (pid < 0) jb->status = -1;
}

static void finish_job(job *jobs, int njobs, pid_t pid, int status) {
  for (int i = 0; i < njobs; i++)
    if (jobs[i].pid == pid) {
      jobs[i].status = status;
      jobs[i].pid = 0;
      struct timespec t1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      jobs[i].secs = (double)(t1.tv_sec - jobs[i].t0.tv_sec) +
                     1e-9 * (double)(t1.tv_nsec - jobs[i].t0.tv_nsec);
    }
}

static char **env_ref, **env_jit, **env_cpu;

/* runs every job, at most `parallel` at once */
static void run_jobs(job *jobs, int njobs, const char *exe, int parallel) {
  int next = 0, running = 0;
  while (next < njobs || running > 0) {
    while (next < njobs && running < parallel) {
      start_job(&jobs[next], exe, jobs[next].jit ? env_jit : jobs[next].cpu ? env_cpu : env_ref);
      if (jobs[next].pid > 0) running++;
      next++;
    }
    int status;
    pid_t pid = wait(&status);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    finish_job(jobs, njobs, pid, status);
    running--;
  }
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static char self_exe[4096], tmp_dir[512];

/* children per batch: the JIT run and its reference, and on the GPU the CPU
   interpreter as well */
static int group_size(void) { return on_cuda ? 3 : 2; }

/* appends a JIT + reference pair of children (+ the CPU's, on the GPU) */
static void add_pair(job **jobs, int *njobs, uint64_t first, uint64_t count) {
  int group = group_size();
  *jobs = realloc(*jobs, (size_t)(*njobs + group) * sizeof **jobs);
  int pair = *njobs / group;
  for (int k = 0; k < group; k++) {
    job *jb = &(*jobs)[(*njobs)++];
    bool jit = k == 0;
    memset(jb, 0, sizeof *jb);
    jb->jit = jit;
    jb->cpu = k == 2;
    jb->first = first;
    jb->count = count;
    /* results never depend on the thread count: fuzz pairs run the two
       children on different counts, 1, 2 and 4 in turn */
    static const int jit_threads[] = {1, 2, 4}, ref_threads[] = {4, 1, 2};
    jb->threads = !count ? 4 : jit ? jit_threads[pair % 3] : ref_threads[pair % 3];
    if (count)
      snprintf(jb->name, sizeof jb->name, "seeds %llu-%llu", (unsigned long long)first,
               (unsigned long long)(first + count - 1));
    else
      snprintf(jb->name, sizeof jb->name, "directed");
    snprintf(jb->out, sizeof jb->out, "%s/%03d-%s.out", tmp_dir, pair,
             jit       ? "jit"
             : jb->cpu ? "cpu"
                       : "ref");
    snprintf(jb->args[0], sizeof jb->args[0], "%s", count ? "fuzz" : "directed");
    snprintf(jb->args[1], sizeof jb->args[1], "%llu", (unsigned long long)first);
    snprintf(jb->args[2], sizeof jb->args[2], "%llu", (unsigned long long)count);
    jb->argv[0] = self_exe;
    jb->argv[1] = "--child";
    jb->argv[2] = jb->args[0];
    jb->argv[3] = jb->args[1];
    jb->argv[4] = jb->args[2];
    jb->argv[5] = NULL;
  }
}

static long env_long(const char *name, long dflt) {
  const char *s = getenv(name);
  return s && *s ? strtol(s, NULL, 10) : dflt;
}

static void print_coverage(void) {
  /* every (op, input dtype) pair the API accepts */
  static const char *const all_dtypes[] = {"neg", "relu", "clamp", "sub", "pow", NULL};
  int have = 0, want = 0;
  char missing[2048] = "";
  size_t at = 0;
  const char *names[64];
  int nn = 0;
  for (int i = 0; i < N_UNARY; i++) names[nn++] = UNARY[i].name;
  for (int i = 0; i < N_BINARY; i++) names[nn++] = BINARY[i].name;
  for (int i = 0; i < N_SCALAR; i++) names[nn++] = SCALAR[i].name;
  names[nn++] = "where";
  names[nn++] = "clamp";
  static char castn[NDT][16];
  for (int d = 0; d < NDT; d++) {
    snprintf(castn[d], sizeof castn[d], "cast->%s", DT_NAME[d]);
    names[nn++] = castn[d];
  }
  for (int k = 0; k < nn; k++) {
    int i = 0;
    while (i < sum.ncov && strcmp(sum.cov_name[i], names[k])) i++;
    for (int d = 0; d < NDT; d++) {
      bool no_bool = false;
      for (int x = 0; all_dtypes[x]; x++) no_bool |= !strcmp(names[k], all_dtypes[x]);
      if (d == KILN_BOOL && no_bool) continue;
      want++;
      if (i < sum.ncov && sum.cov[i][d]) {
        have++;
      } else if (at < sizeof missing - 40) {
        at += (size_t)snprintf(missing + at, sizeof missing - at, " %s(%s)", names[k], DT_NAME[d]);
      }
    }
  }
  printf("coverage: %d of %d (elementwise op, input dtype) pairs ran%s%s\n", have, want,
         have < want ? "; not reached:" : "", missing);
  if (!getenv("KILN_FUZZ_STATS") || !*getenv("KILN_FUZZ_STATS")) return;
  printf("  %-14s", "op");
  for (int d = 0; d < NDT; d++) printf(" %8s", DT_NAME[d]);
  printf("\n");
  for (int i = 0; i < sum.ncov; i++) {
    printf("  %-14s", sum.cov_name[i]);
    for (int d = 0; d < NDT; d++) printf(" %8ld", sum.cov[i][d]);
    printf("\n");
  }
}

TEST(jit_matches_interpreter) {
  uint64_t first = (uint64_t)env_long("KILN_FUZZ_FIRST", 1);
  long nprog = env_long("KILN_FUZZ_PROGRAMS", 200);
  bool directed = env_long("KILN_FUZZ_DIRECTED", 1) != 0;
  if (getenv("KILN_FUZZ_SEED") && *getenv("KILN_FUZZ_SEED")) {
    first = strtoull(getenv("KILN_FUZZ_SEED"), NULL, 10);
    nprog = 1;
    directed = false;
  }
  /* KILN_CPU_ISA caps the level the JIT compiles for (the ctest runs at
     x86-64-v3 and -v2): the cap must hold, never the CPU's own level */
  const char *cap = getenv("KILN_CPU_ISA");
  printf("jit_fuzz: compiling for %s%s%s\n", kiln_cpu_isa(), cap ? ", KILN_CPU_ISA=" : "",
         cap ? cap : "");
  if (cap) CHECK(strcmp(kiln_cpu_isa(), cap) <= 0); /* "x86-64" < "x86-64-v2" < ... */
  long nproc = sysconf(_SC_NPROCESSORS_ONLN);
  /* one more child than CPUs: a compile waits on the assembler and linker */
  int parallel = (int)env_long("KILN_FUZZ_JOBS", nproc < 1 ? 2 : nproc > 7 ? 8 : nproc + 1);
  int nbatch = (int)((nprog + 19) / 20); /* ~20 programs a child */
  if (nbatch > 64) nbatch = 64;
  job *jobs = NULL;
  int njobs = 0, done = 0, crashes = 0;
  bool skipped = false;
  if (directed) add_pair(&jobs, &njobs, 0, 0); /* the slowest pair first */
  for (int b = 0; b < nbatch; b++) {
    uint64_t lo = first + (uint64_t)(nprog * b / nbatch),
             hi = first + (uint64_t)(nprog * (b + 1) / nbatch);
    add_pair(&jobs, &njobs, lo, hi - lo);
  }
  double t0 = now_s(), jit_secs = 0, ref_secs = 0, cpu_secs = 0;
  /* rounds: the programs after one a child died in run in a new pair */
  for (int round = 0; done < njobs && round < 16; round++) {
    run_jobs(jobs + done, njobs - done, self_exe, parallel);
    int end = njobs;
    for (int i = done; i < end; i += group_size()) {
      blob bj, br;
      jit_secs += jobs[i].secs;
      ref_secs += jobs[i + 1].secs;
      if (on_cuda) cpu_secs += jobs[i + 2].secs;
      if (!load_blob(jobs[i].out, &bj) || !load_blob(jobs[i + 1].out, &br)) {
        KTEST_FAIL("%s: cannot read the outputs in %s", jobs[i].name, tmp_dir);
        continue;
      }
      if (bj.nlines && bj.lines[0][0] == 'X' && br.nlines && br.lines[0][0] == 'X') {
        if (!skipped) printf("SKIP: the GPU fuzz pairs: %s\n", bj.lines[0] + 2);
        skipped = true;
        free_blob(&bj);
        free_blob(&br);
        continue;
      }
      uint64_t died = compare_batch(jobs[i].name, &br, &bj, jobs[i + 1].status, jobs[i].status);
      blob bc;
      if (on_cuda && !died) { /* the GPU fused run against the CPU's interpreter */
        if (!load_blob(jobs[i + 2].out, &bc)) {
          KTEST_FAIL("%s: cannot read the CPU run's output in %s", jobs[i].name, tmp_dir);
        } else {
          cross = true;
          compare_batch(jobs[i].name, &bc, &bj, jobs[i + 2].status, jobs[i].status);
          cross = false;
          free_blob(&bc);
        }
      }
      if (jobs[i].count == 0 && (!WIFEXITED(jobs[i].status) || WEXITSTATUS(jobs[i].status) ||
                                 !WIFEXITED(jobs[i + 1].status) || WEXITSTATUS(jobs[i + 1].status)))
        KTEST_FAIL("directed: a child's own checks failed (see above)");
      uint64_t last = jobs[i].first + jobs[i].count - 1;
      if (died && jobs[i].count) crashes++;
      if (died && jobs[i].count && died < last) add_pair(&jobs, &njobs, died + 1, last - died);
      free_blob(&bj);
      free_blob(&br);
    }
    done = end;
  }
  free(jobs);
  if (skipped) return;
  double t1 = now_s();
  printf(
      "%s fuzz: %ld random programs (%ld replayed with new leaves and scalars), %ld directed "
      "tests; %ld results, %ld values compared (%ld approximate); the JIT runs compiled %llu "
      "plans, and compiled kernels did the work of %llu interpreter ops%s\n",
      on_cuda ? "GPU" : "jit", sum.programs - sum.replays - sum.directed, sum.replays, sum.directed,
      sum.results, sum.elements, sum.approx_elements, sum.compiles, sum.kernels,
      crashes ? " (crashed children resumed after the program they died in)" : "");
  if (on_cuda)
    printf(
        "  against the CPU interpreter: %ld results, %ld values bit for bit; %ld results through "
        "CUDA's libm or cuBLAS compared by dtype and shape only\n",
        sum.cross_results, sum.cross_elements, sum.cross_skipped);
  else
    printf(
        "  largest difference of approximate values |a-b|/max(1,|b|): f32 %.3g (%.2g of the "
        "model's bound), f64 %.3g (%.2g of the bound); tolerances %g / %g\n",
        sum.max_dev[KILN_F32], sum.max_ratio[KILN_F32], sum.max_dev[KILN_F64],
        sum.max_ratio[KILN_F64], TOL_F32, TOL_F64);
  printf("  %.1f s wall, children: %s %.1f s, %s %.1f s", t1 - t0, jit_name(), jit_secs, ref_name(),
         ref_secs);
  if (on_cuda) printf(", CPU interpreter %.1f s", cpu_secs);
  printf(" (%d children at once)\n", parallel);
  if (nprog > 1) print_coverage();
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--child")) return child_main(argc, argv);
  /* the parent: no Kiln call, no thread, no setenv — only fork + execve */
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0) {
    fprintf(stderr, "cannot read /proc/self/exe\n");
    return 1;
  }
  self_exe[n] = 0;
  const char *dev = getenv("KILN_FUZZ_DEVICE");
  on_cuda = dev && !strcmp(dev, "cuda");
  const char *tmp = getenv("TMPDIR");
  snprintf(tmp_dir, sizeof tmp_dir, "%s/kiln-jit-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(tmp_dir)) {
    fprintf(stderr, "mkdtemp %s: %s\n", tmp_dir, strerror(errno));
    return 1;
  }
  char cache_dir[600];
  snprintf(cache_dir, sizeof cache_dir, "%s/cache", tmp_dir);
  env_ref = make_env(false, on_cuda, cache_dir);
  env_jit = make_env(true, on_cuda, cache_dir);
  env_cpu = make_env(false, false, cache_dir);
  RUN(jit_matches_interpreter);
  if (getenv("KILN_FUZZ_KEEP") && *getenv("KILN_FUZZ_KEEP"))
    printf("outputs kept in %s\n", tmp_dir);
  else
    nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(env_ref);
  free(env_jit);
  free(env_cpu);
  return ktest_done();
}
