/* test_api_fuzz.c — the public C API under hostile input (API.md: bad input
 * of any kind returns an error naming the op and never crashes; DESIGN §9:
 * a UBSan report reachable from the API is a bug).
 *
 * A seeded generator (splitmix64) makes random sequences of calls to every
 * function of kiln.h over a pool of live tensors, with random and hostile
 * arguments: NULL tensors and pointers, sizes and axes at the extremes
 * (INT64_MAX, INT64_MIN, 2^62, 2^60, 2^32, 2^31, -1, INT_MAX ...), ndim
 * outside [0, 8], invalid dtypes, mismatched dtypes and shapes, views of
 * views (slices with huge and negative steps, permutes, expands to 2^31+
 * elements), empty tensors, reads into buffers too small, kiln_item on
 * non-scalars, kiln_sync, autodiff and in-place updates.  It checks:
 *   - nothing crashes (ASan + UBSan in the sanitizer build abort on any
 *     report: tests/CMakeLists.txt sets UBSAN_OPTIONS=halt_on_error=1);
 *   - a failing call returns NULL / a negative status with a nonempty
 *     kiln_last_error() that names a kiln_ op (the called one when it was
 *     given a NULL tensor);
 *   - a result has 0..8 dims, sizes >= 0, numel == the product of its shape
 *     and at most 2^60; a slice has Python's length; bool data read back is
 *     0 or 1; a read into a buffer too small fails.
 *
 * Tensors with more than BIG_NUMEL elements are never read: views of them
 * (2^31+ elements) are kept in a separate pool (inputs for overflow checks),
 * any other result over them is checked and released at once.  A flush may
 * still try to materialize one (memory pressure, kiln_sync): allocations
 * above about 1 GiB fail (ASan's max_allocation_size_mb, or RLIMIT_AS
 * without ASan), so such a request is a quick KILN_ERR_OOM.
 *
 * Default: seeds 1-4, 6000 calls each (ctest).  Longer runs:
 *   KILN_API_FUZZ_CALLS=200000 KILN_API_FUZZ_SEED=7 ./test_api_fuzz
 * A failure prints the seed and the call number; KILN_API_FUZZ_TRACE=1
 * prints every call. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

#include "ktest.h"

#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
__attribute__((used, visibility("default"))) const char *__asan_default_options(void) {
  return "allocator_may_return_null=1:max_allocation_size_mb=1000";
}
#endif

/* --- generator ------------------------------------------------------------ */

static uint64_t rng;
static uint64_t next64(void) { return ktest_splitmix64(&rng); }
static int rn(int n) { return n <= 1 ? 0 : (int)(next64() % (uint64_t)n); }
static bool coin(int pct) { return rn(100) < pct; }

static const int64_t HOSTILE_SIZES[] = {INT64_MAX,
                                        INT64_MIN,
                                        INT64_MAX - 1,
                                        INT64_MIN + 1,
                                        (int64_t)1 << 62,
                                        -((int64_t)1 << 62),
                                        (int64_t)1 << 60,
                                        ((int64_t)1 << 60) - 1,
                                        (int64_t)1 << 32,
                                        (int64_t)1 << 31,
                                        ((int64_t)1 << 31) + 1,
                                        (int64_t)1 << 40,
                                        -1,
                                        -2,
                                        0,
                                        1};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* a size: mostly small, sometimes hostile */
static int64_t gen_size(void) {
  if (coin(80)) return rn(5);
  return HOSTILE_SIZES[rn(COUNT(HOSTILE_SIZES))];
}

/* an axis for ndim dims: mostly in range (negative too), sometimes not */
static int gen_axis(int ndim) {
  static const int hostile[] = {INT_MIN, INT_MAX, -9, 8, 9, 100, -100};
  if (coin(85)) return rn(2 * ndim + 2) - ndim - 1;
  return hostile[rn(COUNT(hostile))];
}

static int gen_ndim(void) {
  static const int hostile[] = {-1, 9, INT_MAX, INT_MIN};
  return coin(92) ? rn(5) : hostile[rn(COUNT(hostile))];
}

static kiln_dtype gen_dtype(void) {
  static const int hostile[] = {-1, KILN_I16 + 1, 99, INT_MIN};
  return (kiln_dtype)(coin(95) ? rn(KILN_I16 + 1) : hostile[rn(COUNT(hostile))]);
}

static double gen_double(void) {
  static const double special[] = {0,      1,      -1,       0.5,       2,
                                   1e-5,   NAN,    INFINITY, -INFINITY, 1e308,
                                   -1e308, 5e-324, 9.3e18,   -9.3e18,   2147483648.0};
  if (coin(70)) return (double)rn(9) - 4 + (coin(50) ? 0.25 : 0);
  return special[rn(COUNT(special))];
}

static int64_t gen_slice_bound(void) {
  static const int64_t special[] = {INT64_MIN,     INT64_MIN + 1,    INT64_MAX,
                                    INT64_MAX - 1, (int64_t)1 << 62, -((int64_t)1 << 62)};
  return coin(70) ? rn(13) - 6 : special[rn(COUNT(special))];
}

static int64_t gen_step(void) {
  static const int64_t special[] = {INT64_MIN,        INT64_MIN + 1,       INT64_MAX, INT64_MAX - 1,
                                    (int64_t)1 << 62, -((int64_t)1 << 62), 0};
  return coin(70) ? (coin(50) ? 1 : -1) * (1 + rn(4)) : special[rn(COUNT(special))];
}

/* --- the pools ------------------------------------------------------------- */

#define NSLOTS 24
#define NBIG 6
#define BIG_NUMEL ((int64_t)1 << 16) /* above this a tensor is never evaluated */
static kiln_tensor *pool[NSLOTS], *big[NBIG];
static int64_t call_no;
static const char *call_name;
static bool tainted; /* this call read a big tensor: its result is not kept */
static bool trace_calls;
static uint64_t seed;

static void put(kiln_tensor **slots, int n, kiln_tensor *t) {
  int i = rn(n);
  kiln_release(slots[i]);
  slots[i] = t;
}

/* a tensor argument: sometimes NULL, sometimes a big one */
static kiln_tensor *arg(void) {
  if (coin(4)) return NULL;
  if (coin(15)) {
    kiln_tensor *b = big[rn(NBIG)];
    if (b) {
      tainted = true;
      return b;
    }
  }
  return pool[rn(NSLOTS)];
}

/* for composites: their internal flushes would scan a big input's 2^31+
   elements (legitimately, but for seconds), so they get small tensors */
static kiln_tensor *arg_small(void) { return coin(4) ? NULL : pool[rn(NSLOTS)]; }

#define FUZZ_FAIL(...)                                                       \
  do {                                                                       \
    ktest_failed_checks++;                                                   \
    fprintf(stderr, "%s:%d: seed %llu call %lld (%s): ", __FILE__, __LINE__, \
            (unsigned long long)seed, (long long)call_no, call_name);        \
    fprintf(stderr, __VA_ARGS__);                                            \
    fprintf(stderr, "\n");                                                   \
  } while (0)

/* a failing call: negative status, a message naming a kiln_ op */
static void check_failure(void) {
  const char *msg = kiln_last_error();
  if (kiln_last_status() >= 0 || !msg || !*msg)
    FUZZ_FAIL("failed with status %d and message '%s'", (int)kiln_last_status(), msg ? msg : "");
  else if (!strstr(msg, "kiln_"))
    FUZZ_FAIL("error '%s' names no kiln_ op", msg);
}

/* shape invariants of any tensor handed out */
static void check_tensor(const kiln_tensor *t) {
  int nd = kiln_ndim(t);
  const int64_t *sh = kiln_shape(t);
  kiln_dtype dt = kiln_dtype_of(t);
  if (nd < 0 || nd > KILN_MAX_DIMS || !sh || (int)dt < 0 || (int)dt > KILN_I16) {
    FUZZ_FAIL("bad header: ndim %d dtype %d", nd, (int)dt);
    return;
  }
  __int128 numel = 1;
  for (int d = 0; d < nd; d++) {
    if (sh[d] < 0) FUZZ_FAIL("negative extent %lld in dim %d", (long long)sh[d], d);
    numel *= sh[d] < 0 ? 0 : sh[d];
    if (numel > ((__int128)1 << 62)) numel = (__int128)1 << 62; /* stays finite */
  }
  if (numel != kiln_numel(t) || kiln_numel(t) > ((int64_t)1 << 60))
    FUZZ_FAIL("numel %lld is not the product of the shape", (long long)kiln_numel(t));
}

/* a tensor result: NULL must be an error, anything else is checked and
   kept (small, untainted), kept as a big view, or released */
static void take(kiln_tensor *t, bool is_view) {
  if (!t) {
    check_failure();
    return;
  }
  check_tensor(t);
  if (kiln_numel(t) > BIG_NUMEL) {
    if (is_view)
      put(big, NBIG, t);
    else
      kiln_release(t);
  } else if (tainted) {
    kiln_release(t);
  } else {
    put(pool, NSLOTS, t);
  }
}

static void status_result(int rc) {
  if (rc < 0) check_failure();
}

/* given a NULL tensor in position i (with no earlier error), an op fails
   with KILN_ERR_ARG naming itself */
static void check_null_named(const char *name) {
  if (kiln_last_status() != KILN_ERR_ARG || !strstr(kiln_last_error(), name))
    FUZZ_FAIL("NULL input: status %d '%s', expected KILN_ERR_ARG naming %s",
              (int)kiln_last_status(), kiln_last_error(), name);
}

/* --- calls ------------------------------------------------------------------ */

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
typedef kiln_tensor *(*scalar_fn)(kiln_tensor *, double);
typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);
#define NAMED(f) \
  { #f, f }
static const struct {
  const char *name;
  unary_fn fn;
} UNARY[] = {NAMED(kiln_neg),   NAMED(kiln_abs),     NAMED(kiln_exp),   NAMED(kiln_log),
             NAMED(kiln_sqrt),  NAMED(kiln_rsqrt),   NAMED(kiln_sin),   NAMED(kiln_cos),
             NAMED(kiln_tanh),  NAMED(kiln_sigmoid), NAMED(kiln_relu),  NAMED(kiln_gelu),
             NAMED(kiln_erf),   NAMED(kiln_log1p),   NAMED(kiln_expm1), NAMED(kiln_floor),
             NAMED(kiln_ceil),  NAMED(kiln_round),   NAMED(kiln_sign),  NAMED(kiln_logical_not),
             NAMED(kiln_detach)};
static const struct {
  const char *name;
  binary_fn fn;
} BINARY[] = {NAMED(kiln_add),     NAMED(kiln_sub),         NAMED(kiln_mul),
              NAMED(kiln_div),     NAMED(kiln_pow),         NAMED(kiln_maximum),
              NAMED(kiln_minimum), NAMED(kiln_eq),          NAMED(kiln_ne),
              NAMED(kiln_lt),      NAMED(kiln_le),          NAMED(kiln_gt),
              NAMED(kiln_ge),      NAMED(kiln_logical_and), NAMED(kiln_logical_or),
              NAMED(kiln_matmul),  NAMED(kiln_mse_loss),    NAMED(kiln_cross_entropy)};
static const struct {
  const char *name;
  scalar_fn fn;
} SCALAR[] = {NAMED(kiln_add_scalar), NAMED(kiln_sub_scalar), NAMED(kiln_mul_scalar),
              NAMED(kiln_div_scalar), NAMED(kiln_pow_scalar)};
static const struct {
  const char *name;
  reduce_fn fn;
} REDUCE[] = {NAMED(kiln_sum), NAMED(kiln_mean), NAMED(kiln_max), NAMED(kiln_min),
              NAMED(kiln_prod)};

static void call_unary(void) {
  int i = rn(COUNT(UNARY));
  call_name = UNARY[i].name;
  kiln_tensor *a = arg();
  take(UNARY[i].fn(a), false);
  if (!a) check_null_named(UNARY[i].name);
}

static void call_binary(void) {
  int i = rn(COUNT(BINARY));
  call_name = BINARY[i].name;
  bool loss = BINARY[i].fn == kiln_mse_loss || BINARY[i].fn == kiln_cross_entropy;
  kiln_tensor *a = loss ? arg_small() : arg(), *b = loss ? arg_small() : arg();
  take(BINARY[i].fn(a, b), false);
  if (!a || !b) check_null_named(BINARY[i].name);
}

static void call_scalar(void) {
  int i = rn(COUNT(SCALAR));
  call_name = SCALAR[i].name;
  kiln_tensor *a = arg();
  take(SCALAR[i].fn(a, gen_double()), false);
}

static void call_reduce(void) {
  int i = rn(COUNT(REDUCE)), axes[9];
  call_name = REDUCE[i].name;
  kiln_tensor *a = arg();
  int nd = a ? kiln_ndim(a) : 2;
  int naxes = coin(90) ? rn(nd + 1) : gen_ndim();
  for (int k = 0; k < 9; k++) axes[k] = gen_axis(nd);
  bool no_axes = naxes > 0 && coin(3);
  take(REDUCE[i].fn(a, naxes, no_axes ? NULL : axes, coin(50)), false);
}

static void call_arg_reduce(void) {
  bool is_max = coin(50);
  call_name = is_max ? "kiln_argmax" : "kiln_argmin";
  kiln_tensor *a = arg();
  int axis = gen_axis(a ? kiln_ndim(a) : 1);
  bool keep = coin(50);
  take(is_max ? kiln_argmax(a, axis, keep) : kiln_argmin(a, axis, keep), false);
}

/* shapes: an array of 9 entries (reshape/expand may be asked for 9 dims) */
static int gen_shape(int64_t shape[9], bool small) {
  int nd = gen_ndim();
  for (int d = 0; d < 9; d++) shape[d] = small ? rn(4) : gen_size();
  return nd;
}

/* creation with a shape that fits our data buffer when it is valid */
#define DATA_BYTES 4096
static unsigned char data_buf[DATA_BYTES];

/* whether kiln_from_data can only read within data_buf: the shape is
   invalid (an error before any read), empty, or small enough */
static bool fits_buffer(int nd, const int64_t *shape, size_t esize) {
  __int128 n = 1;
  for (int d = 0; d < nd && d < 9; d++) {
    if (shape[d] <= 0) return true; /* an error, or no element: data never read */
    n *= shape[d] > ((int64_t)1 << 62) ? (int64_t)1 << 62 : shape[d]; /* both <= 2^62 */
    if (n > ((__int128)1 << 62)) n = (__int128)1 << 62;
  }
  return n * (__int128)esize <= DATA_BYTES || n > ((__int128)1 << 60);
}

static void call_create(void) {
  int64_t shape[9];
  int nd = gen_shape(shape, coin(60));
  kiln_dtype dt = gen_dtype();
  switch (rn(8)) {
    case 0: {
      call_name = "kiln_from_data";
      for (int k = 0; k < 64; k++) data_buf[k] = (unsigned char)next64();
      if (!fits_buffer(nd, shape, 8)) return;
      const void *src = coin(5) ? NULL : data_buf;
      take(kiln_from_data(src, dt, nd, coin(3) ? NULL : shape), false);
      return;
    }
    case 1:
      call_name = "kiln_zeros";
      take(kiln_zeros(dt, nd, shape), false);
      return;
    case 2:
      call_name = "kiln_ones";
      take(kiln_ones(dt, nd, shape), false);
      return;
    case 3:
      call_name = "kiln_full";
      take(kiln_full(gen_double(), dt, nd, shape), false);
      return;
    case 4:
      call_name = "kiln_scalar";
      take(kiln_scalar(gen_double(), dt), false);
      return;
    case 5:
      call_name = "kiln_arange";
      take(kiln_arange(gen_double(), gen_double() * (coin(90) ? 1 : 1e30), gen_double(), dt),
           false);
      return;
    case 6:
      call_name = "kiln_rand";
      take(kiln_rand(dt, nd, shape), false);
      return;
    default:
      call_name = "kiln_randn";
      take(kiln_randn(dt, nd, coin(3) ? NULL : shape), false);
      return;
  }
}

/* Python's slice length (the reference for kiln_slice); *start becomes the
   clamped first index */
static int64_t python_len(int64_t len, int64_t *start, int64_t stop, int64_t step) {
  __int128 lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1, b = *start, e = stop;
  if (b < 0)
    b = b + len < lo ? lo : b + len;
  else if (b > hi)
    b = hi;
  if (e < 0)
    e = e + len < lo ? lo : e + len;
  else if (e > hi)
    e = hi;
  *start = (int64_t)b;
  if (step > 0) return e > b ? (int64_t)((e - b - 1) / step + 1) : 0;
  return b > e ? (int64_t)((b - e - 1) / -(__int128)step + 1) : 0;
}

/* a small tensor's values as doubles (n <= BIG_NUMEL); false if the read
   failed (a failure pending in its graph is not this check's business) */
static bool read_doubles(kiln_tensor *t, double *out) {
  static unsigned char raw[8 * BIG_NUMEL];
  int64_t n = kiln_numel(t);
  kiln_dtype dt = kiln_dtype_of(t);
  size_t es = ktest_dtype_size(dt);
  if (kiln_to_buffer(t, raw, (size_t)n * es) != 0) return false;
  for (int64_t i = 0; i < n; i++) out[i] = ktest_elem(dt, raw, i);
  return true;
}

/* the slice's values are a's at start + i * step along axis (clamped start) */
static void check_slice_values(kiln_tensor *a, kiln_tensor *s, int ax, int64_t first,
                               int64_t step) {
  static double av[BIG_NUMEL], sv[BIG_NUMEL];
  if (!read_doubles(a, av) || !read_doubles(s, sv)) {
    kiln_clear_error();
    return;
  }
  int nd = kiln_ndim(s);
  const int64_t *ash = kiln_shape(a), *ssh = kiln_shape(s);
  for (int64_t f = 0; f < kiln_numel(s); f++) {
    int64_t rem = f, src = 0, scale = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t i = rem % ssh[d];
      rem /= ssh[d];
      src += (d == ax ? first + i * step : i) * scale;
      scale *= ash[d];
    }
    if (!(av[src] == sv[f] || (isnan(av[src]) && isnan(sv[f])))) {
      FUZZ_FAIL("slice element %lld is %g, expected a[%lld] = %g", (long long)f, sv[f],
                (long long)src, av[src]);
      return;
    }
  }
}

static void call_slice(void) {
  call_name = "kiln_slice";
  kiln_tensor *a = arg();
  int nd = a ? kiln_ndim(a) : 1, axis = gen_axis(nd);
  int64_t start = gen_slice_bound(), stop = gen_slice_bound(), step = gen_step();
  kiln_tensor *s = kiln_slice(a, axis, start, stop, step);
  if (s) {
    int ax = axis < 0 ? axis + nd : axis;
    int64_t first = start, want = python_len(kiln_shape(a)[ax], &first, stop, step);
    if (kiln_shape(s)[ax] != want)
      FUZZ_FAIL("slice(%lld, %lld, %lld) of extent %lld has %lld elements, expected %lld",
                (long long)start, (long long)stop, (long long)step, (long long)kiln_shape(a)[ax],
                (long long)kiln_shape(s)[ax], (long long)want);
    else if (!tainted && coin(30))
      check_slice_values(a, s, ax, first, step);
  }
  take(s, true);
}

static void call_view(void) {
  kiln_tensor *a = arg();
  int nd = a ? kiln_ndim(a) : 2;
  int64_t shape[9];
  int perm[KILN_MAX_DIMS];
  switch (rn(6)) {
    case 0: {
      call_name = "kiln_reshape";
      int n = gen_shape(shape, coin(70));
      if (coin(30) && n > 0 && n <= 9) shape[rn(n)] = -1;
      take(kiln_reshape(a, n, coin(2) ? NULL : shape), false);
      return;
    }
    case 1: {
      call_name = "kiln_expand";
      int n = coin(80) ? nd + rn(3) : gen_ndim();
      for (int d = 0; d < 9; d++) {
        int64_t src = (int64_t)d - ((int64_t)n - nd);
        int64_t have = a && src >= 0 && src < nd ? kiln_shape(a)[src] : 1;
        shape[d] = coin(60) ? (have == 1 ? gen_size() : have) : coin(50) ? -1 : gen_size();
      }
      take(kiln_expand(a, n, shape), true);
      return;
    }
    case 2:
      call_name = "kiln_permute";
      for (int d = 0; d < KILN_MAX_DIMS; d++) perm[d] = coin(90) ? rn(nd ? nd : 1) : gen_axis(nd);
      take(kiln_permute(a, coin(2) ? NULL : perm), true);
      return;
    case 3:
      call_name = "kiln_transpose";
      take(kiln_transpose(a, gen_axis(nd), gen_axis(nd)), true);
      return;
    case 4:
      call_name = "kiln_squeeze";
      take(kiln_squeeze(a, gen_axis(nd)), false);
      return;
    default:
      call_name = "kiln_unsqueeze";
      take(kiln_unsqueeze(a, gen_axis(nd + 1)), false);
      return;
  }
}

static void call_join(void) {
  kiln_tensor *ts[12];
  int n = 1 + rn(12);
  for (int i = 0; i < n; i++) ts[i] = coin(60) && i > 0 ? ts[0] : arg();
  int count = coin(90) ? n : (coin(50) ? 0 : -1 - rn(3));
  int axis = gen_axis(ts[0] ? kiln_ndim(ts[0]) + 1 : 1);
  kiln_tensor *const *list = coin(2) ? NULL : ts;
  bool is_concat = coin(50);
  call_name = is_concat ? "kiln_concat" : "kiln_stack";
  take(is_concat ? kiln_concat(count, list, axis) : kiln_stack(count, list, axis), false);
}

static void call_index(void) {
  kiln_tensor *a = arg(), *idx = arg();
  int axis = gen_axis(a ? kiln_ndim(a) : 1);
  switch (rn(3)) {
    case 0:
      call_name = "kiln_index_select";
      take(kiln_index_select(a, axis, idx), false);
      return;
    case 1:
      call_name = "kiln_gather";
      take(kiln_gather(a, axis, idx), false);
      return;
    default:
      call_name = "kiln_scatter_add";
      take(kiln_scatter_add(a, axis, idx, arg()), false);
      return;
  }
}

static void call_misc_op(void) {
  int which = rn(8);
  kiln_tensor *a = which < 4 || which == 7 ? arg_small() : arg();
  int nd = a ? kiln_ndim(a) : 1;
  switch (which) {
    case 0:
      call_name = "kiln_softmax";
      take(kiln_softmax(a, gen_axis(nd)), false);
      return;
    case 1:
      call_name = "kiln_log_softmax";
      take(kiln_log_softmax(a, gen_axis(nd)), false);
      return;
    case 2:
      call_name = "kiln_logsumexp";
      take(kiln_logsumexp(a, gen_axis(nd), coin(50)), false);
      return;
    case 3:
      call_name = "kiln_layer_norm";
      take(kiln_layer_norm(a, coin(50) ? NULL : arg_small(), coin(50) ? NULL : arg_small(),
                           gen_double()),
           false);
      return;
    case 4:
      call_name = "kiln_where";
      take(kiln_where(a, arg(), arg()), false);
      return;
    case 5:
      call_name = "kiln_clamp";
      take(kiln_clamp(a, gen_double(), gen_double()), false);
      return;
    case 7: { /* q, k, v, mask of random shapes and dtypes: mostly errors */
      call_name = "kiln_scaled_dot_product_attention";
      kiln_tensor *k = coin(30) ? a : arg_small();
      if (a && k && kiln_ndim(a) >= 2 && kiln_ndim(k) >= 2 && /* Tq x Tk scores: kept small */
          kiln_shape(a)[nd - 2] * kiln_shape(k)[kiln_ndim(k) - 2] > (int64_t)1 << 20)
        return;
      take(kiln_scaled_dot_product_attention(a, k, arg_small(), coin(50) ? NULL : arg_small(),
                                             coin(50), gen_double()),
           false);
      return;
    }
    default:
      call_name = "kiln_cast";
      take(kiln_cast(a, gen_dtype()), false);
      return;
  }
}

/* reads: buffers of the size claimed (or NULL), too small on purpose often */
static void call_read(void) {
  kiln_tensor *a = arg();
  static unsigned char buf[8 * BIG_NUMEL];
  int64_t numel = a ? kiln_numel(a) : 0;
  bool is_big = numel > BIG_NUMEL;
  switch (rn(4)) {
    case 0: {
      call_name = "kiln_to_buffer";
      size_t need = a ? (size_t)numel * ktest_dtype_size(kiln_dtype_of(a)) : 0;
      size_t have = is_big || coin(30) ? (size_t)rn(17) : need;
      if (have > sizeof buf) have = sizeof buf;
      void *dst = coin(5) ? NULL : buf;
      int rc = kiln_to_buffer(a, dst, have);
      status_result(rc);
      if (rc == 0 && have < need) FUZZ_FAIL("read %zu bytes into a buffer of %zu", need, have);
      if (rc == 0 && dst && a && kiln_dtype_of(a) == KILN_BOOL)
        for (size_t i = 0; i < need; i++)
          if (buf[i] > 1) FUZZ_FAIL("bool byte %u at %zu", buf[i], i);
      return;
    }
    case 1: {
      call_name = "kiln_item";
      double v = kiln_item(a);
      if (a && numel != 1 && !isnan(v))
        FUZZ_FAIL("item of %lld elements gave %g", (long long)numel, v);
      if (kiln_last_status() != KILN_OK || !a || numel != 1) {
        if (!isnan(v)) FUZZ_FAIL("item failed but returned %g", v);
        check_failure();
      }
      return;
    }
    case 2: {
      call_name = "kiln_print";
      if (is_big) return;
      FILE *f = coin(5) ? NULL : fopen("/dev/null", "w");
      status_result(kiln_print(a, f));
      if (f) fclose(f);
      return;
    }
    default:
      if (coin(50)) {
        call_name = "kiln_sync";
        status_result(kiln_sync());
      } else { /* small tensors only: evaluating a big one is legitimate but slow */
        call_name = "kiln_eval";
        kiln_tensor *ts[3] = {arg_small(), arg_small(), arg_small()};
        int n = coin(90) ? rn(4) : -1;
        status_result(kiln_eval(n, coin(5) ? NULL : ts));
      }
      return;
  }
}

static void call_in_place(void) {
  kiln_tensor *dst = pool[rn(NSLOTS)], *src = arg();
  if (coin(50)) {
    call_name = "kiln_assign";
    status_result(kiln_assign(dst, src));
  } else {
    call_name = "kiln_sub_scaled_";
    status_result(kiln_sub_scaled_(dst, src, gen_double()));
  }
}

static void call_autodiff(void) {
  kiln_tensor *a = pool[rn(NSLOTS)];
  switch (rn(6)) {
    case 0:
      call_name = "kiln_set_requires_grad";
      status_result(kiln_set_requires_grad(a, coin(80)));
      return;
    case 1:
      call_name = "kiln_backward";
      status_result(kiln_backward(a, coin(70) ? NULL : arg()));
      return;
    case 2: {
      call_name = "kiln_grad";
      kiln_tensor *g = kiln_grad(a);
      if (g)
        take(g, false);
      else if (!a)
        check_failure();
      return;
    }
    case 3:
      call_name = "kiln_zero_grad";
      status_result(kiln_zero_grad(a));
      return;
    case 4: {
      call_name = "kiln_grad_of";
      kiln_tensor *outs[2] = {a, arg()}, *ins[3] = {arg(), arg(), arg()}, *grads[3] = {0};
      int nout = coin(90) ? 1 + rn(2) : -1, nin = coin(90) ? 1 + rn(3) : 0;
      int rc = kiln_grad_of(nout, coin(3) ? NULL : outs, NULL, nin, ins, grads, coin(30));
      status_result(rc);
      for (int i = 0; i < 3; i++)
        if (grads[i]) take(grads[i], false);
      return;
    }
    default:
      call_name = "kiln_no_grad";
      if (coin(50))
        kiln_no_grad_push();
      else
        kiln_no_grad_pop();
      return;
  }
}

static void call_runtime(void) {
  kiln_tensor *a = arg();
  switch (rn(8)) {
    case 0:
      call_name = "kiln_retain";
      if (a && !tainted) put(pool, NSLOTS, kiln_retain(a));
      return;
    case 1:
      call_name = "kiln_release";
      {
        int i = rn(NSLOTS);
        kiln_release(pool[i]);
        pool[i] = NULL;
      }
      return;
    case 2:
      call_name = "kiln_to_device";
      take(kiln_to_device(a, (kiln_device)rn(3)), false);
      return;
    case 3: {
      call_name = "kiln_stat";
      static const char *names[] = {"flushes", "kernels_compiled", "nope", NULL};
      const char *n = names[rn(4)];
      double v = kiln_stat(n);
      if (isnan(v)) check_failure();
      return;
    }
    case 4: {
      call_name = "kiln_inspect";
      if (a) check_tensor(a);
      (void)kiln_device_of(a);
      (void)kiln_requires_grad(a);
      if (!a && (kiln_ndim(a) >= 0 || kiln_shape(a) || kiln_numel(a) >= 0))
        FUZZ_FAIL("inspected NULL");
      return;
    }
    case 5: {
      call_name = "kiln_get_stats";
      kiln_stats st;
      kiln_get_stats(coin(90) ? &st : NULL);
      (void)kiln_device_available((kiln_device)rn(3));
      (void)kiln_version();
      return;
    }
    case 6:
      call_name = "kiln_manual_seed";
      kiln_manual_seed(next64());
      return;
    default:
      call_name = "kiln_jit_wait";
      if (coin(10)) kiln_jit_wait();
      return;
  }
}

typedef void (*call_fn)(void);
static const struct {
  call_fn fn;
  int weight;
} CALLS[] = {{call_unary, 10},     {call_binary, 14},  {call_scalar, 5},  {call_reduce, 8},
             {call_arg_reduce, 3}, {call_create, 12},  {call_slice, 10},  {call_view, 12},
             {call_join, 5},       {call_index, 4},    {call_misc_op, 8}, {call_read, 8},
             {call_in_place, 3},   {call_autodiff, 4}, {call_runtime, 4}};

static void one_call(void) {
  int total = 0;
  for (int i = 0; i < COUNT(CALLS); i++) total += CALLS[i].weight;
  int r = rn(total), i = 0;
  while (r >= CALLS[i].weight) r -= CALLS[i++].weight;
  kiln_clear_error();
  tainted = false;
  call_name = "?";
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CALLS[i].fn();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  if (trace_calls)
    fprintf(stderr, "%lld %s %.2f ms: %s\n", (long long)call_no, call_name, ms, kiln_last_error());
}

/* seed the pool with small tensors of every dtype, some views and empties */
static void seed_pool(void) {
  for (int i = 0; i < NSLOTS; i++) {
    kiln_release(pool[i]);
    int64_t shape[3] = {1 + rn(4), rn(4), 1 + rn(3)};
    int nd = rn(4);
    kiln_dtype dt = (kiln_dtype)rn(5);
    pool[i] = coin(30) ? kiln_zeros(dt, nd, shape) : kiln_randn(KILN_F32, nd, shape);
    if (pool[i] && dt != KILN_F32 && coin(50)) {
      kiln_tensor *c = kiln_cast(pool[i], dt);
      kiln_release(pool[i]);
      pool[i] = c;
    }
  }
  for (int i = 0; i < NBIG; i++) {
    kiln_release(big[i]);
    kiln_tensor *one = kiln_ones((kiln_dtype)rn(5), 1, (const int64_t[]){1});
    int64_t shape[2] = {(int64_t)1 << (31 + rn(2)), 1 + rn(3)};
    big[i] = kiln_expand(one, 1 + rn(2), shape);
    kiln_release(one);
  }
}

static long env_long(const char *name, long dflt) {
  const char *s = getenv(name);
  return s && *s ? strtol(s, NULL, 10) : dflt;
}

/* without ASan, allocations above ~1 GiB more than now fail (RLIMIT_AS) */
static void limit_memory(void) {
#if !defined(__SANITIZE_ADDRESS__)
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0;
  if (f && fscanf(f, "%ld", &pages) == 1) {
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = (rlim_t)pages * 4096 + ((rlim_t)1 << 30);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_AS, &rl);
  }
  if (f) fclose(f);
#endif
}

static void fuzz_one_seed(long calls) {
  rng = seed * 0x2545F4914F6CDD1Dull + 1;
  seed_pool();
  for (call_no = 0; call_no < calls; call_no++) {
    if (call_no % 500 == 499) seed_pool(); /* fresh shapes now and then */
    one_call();
  }
  for (int i = 0; i < 64; i++) kiln_no_grad_pop();
  kiln_clear_error();
  for (int i = 0; i < NSLOTS; i++) kiln_release(pool[i]), pool[i] = NULL;
  for (int i = 0; i < NBIG; i++) kiln_release(big[i]), big[i] = NULL;
  CHECK_EQ_INT(kiln_sync(), 0);
  printf("api fuzz: seed %llu, %ld calls\n", (unsigned long long)seed, calls);
}

/* by default seeds 1-4, 6000 calls each (a few seconds under ASan) */
TEST(api_fuzz_hostile_calls) {
  long calls = env_long("KILN_API_FUZZ_CALLS", 6000);
  long only = env_long("KILN_API_FUZZ_SEED", 0);
  trace_calls = env_long("KILN_API_FUZZ_TRACE", 0) != 0;
  for (long s = only ? only : 1; s <= (only ? only : 4); s++) {
    seed = (uint64_t)s;
    fuzz_one_seed(calls);
  }
}

int main(void) {
  limit_memory();
  RUN(api_fuzz_hostile_calls);
  return ktest_done();
}
