/* test_lazy_fuzz.c — lazy evaluation must not change any value (DESIGN §3).
 *
 * A differential fuzzer: a seeded generator (splitmix64, not kiln_rand)
 * builds random well-typed programs over a pool of live tensors — every
 * elementwise op with broadcasting, the *_scalar ops, where, clamp, cast,
 * reductions, argmax/argmin, matmul, every view, concat/stack, the index ops,
 * the composites, kiln_assign/kiln_sub_scaled_, host reads in the middle and
 * early releases/retains of handles.  Each program runs three times with the
 * same choices: (a) lazily as written, (b) with kiln_sync() after every op,
 * (c) with kiln_sync() at pseudo-random points.  Every tensor left in the pool
 * and every value read mid-way must agree bit for bit (only NaN payloads are
 * not compared: any NaN equals any NaN).  An op returning NULL (or an in-place
 * op / read returning an error) fails the test: the generator only makes valid
 * calls.
 *
 * Reproduce one program: KILN_FUZZ_SEED=<seed> ./test_lazy_fuzz
 * More programs:         KILN_FUZZ_PROGRAMS=<n> ./test_lazy_fuzz   (default 500)
 * Op counts:             KILN_FUZZ_STATS=1 ./test_lazy_fuzz
 *
 * Also directed tests: views and earlier consumers keep the old value across
 * kiln_assign / kiln_sub_scaled_, a pending intermediate read after its
 * consumer, and a 10000-step chain x = x*0.99 + 0.01 against a float
 * reference. */
#include <stdint.h>
#include <time.h>

#include "ktest.h"

/* --- deterministic generator: splitmix64 ----------------------------------- */

static uint64_t sm_next(uint64_t *s) { return ktest_splitmix64(s); }
static int rn(uint64_t *s, int n) { return n <= 1 ? 0 : (int)(sm_next(s) % (uint64_t)n); }
static int rr(uint64_t *s, int lo, int hi) { return lo + rn(s, hi - lo + 1); } /* inclusive */
static bool coin(uint64_t *s, int pct) { return rn(s, 100) < pct; }

/* --- sizes ------------------------------------------------------------------ */

#define MAXPOOL 28
#define MAXRECS 200
#define CAP_NUMEL 512 /* no generated tensor gets larger */
#define MAXND 6       /* no generated tensor gets more dimensions */

static const char *const DT_NAME[] = {"bool", "i32", "i64", "f32", "f64",
                                      "bf16", "f16", "u8",  "i8",  "i16"};

static bool dt_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64; }

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

/* --- leaves: deterministic values from a seed -------------------------------- */

static double float_value(uint64_t *s) {
  static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-30, -1e30, 65504.0};
  int r = rn(s, 100);
  if (r < 4) return special[rn(s, 8)];
  if (r < 30) return (double)(sm_next(s) >> 11) / 9007199254740992.0 * 8.0 - 4.0;
  return (rn(s, 201) - 100) / 16.0;
}

/* bound < 0: general values of the dtype; bound >= 0: indices in [0, bound) */
static kiln_tensor *make_leaf(kiln_dtype dt, int nd, const int64_t *shape, uint64_t vseed,
                              int64_t bound) {
  int64_t n = shape_numel(nd, shape);
  unsigned char *buf = calloc((size_t)(n ? n : 1), 8);
  uint64_t s = vseed;
  for (int64_t i = 0; i < n; i++) {
    int64_t iv = bound >= 0 ? rn(&s, (int)bound) : rr(&s, -5, 5);
    bool big = bound < 0 && coin(&s, 3);
    switch (dt) {
      case KILN_BOOL:
        buf[i] = (unsigned char)rn(&s, 2);
        break;
      case KILN_I32: {
        int32_t v = big ? (coin(&s, 50) ? INT32_MAX : INT32_MIN) : (int32_t)iv;
        memcpy(buf + i * 4, &v, 4);
        break;
      }
      case KILN_I64: {
        int64_t v = big ? (coin(&s, 50) ? (int64_t)1 << 40 : INT64_MIN) : iv;
        memcpy(buf + i * 8, &v, 8);
        break;
      }
      case KILN_F32: {
        float v = (float)float_value(&s);
        memcpy(buf + i * 4, &v, 4);
        break;
      }
      case KILN_F64: {
        double v = float_value(&s);
        memcpy(buf + i * 8, &v, 8);
        break;
      }
      case KILN_BF16:
      case KILN_F16: {
        float f = (float)float_value(&s);
        uint16_t v = dt == KILN_BF16 ? vm_f32_to_bf16(f) : vm_f32_to_f16(f);
        memcpy(buf + i * 2, &v, 2);
        break;
      }
      case KILN_U8:
        buf[i] = (unsigned char)(bound >= 0 ? iv : rr(&s, 0, 255));
        break;
      case KILN_I8:
        buf[i] = (unsigned char)(int8_t)(bound >= 0 ? iv : rr(&s, -128, 127));
        break;
      case KILN_I16: {
        int16_t v = big ? (coin(&s, 50) ? INT16_MAX : INT16_MIN) : (int16_t)iv;
        memcpy(buf + i * 2, &v, 2);
        break;
      }
    }
  }
  kiln_tensor *t = kiln_from_data(buf, dt, nd, shape);
  free(buf);
  return t;
}

/* --- op tables ------------------------------------------------------------------ */

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
typedef kiln_tensor *(*scalar_fn)(kiln_tensor *, double);
typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);

static const struct {
  const char *name;
  unary_fn f;
} UNARY[] = {
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
#define N_UNARY ((int)(sizeof UNARY / sizeof UNARY[0]))
#define U_NEG 0
#define U_RELU 10
#define U_NOT 19

static const struct {
  const char *name;
  binary_fn f;
} BINARY[] = {
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
#define N_BINARY ((int)(sizeof BINARY / sizeof BINARY[0]))
#define B_SUB 1
#define B_POW 4

static const struct {
  const char *name;
  scalar_fn f;
} SCALAR[] = {
    {"add_scalar", kiln_add_scalar}, {"sub_scalar", kiln_sub_scalar},
    {"mul_scalar", kiln_mul_scalar}, {"div_scalar", kiln_div_scalar},
    {"pow_scalar", kiln_pow_scalar},
};
#define N_SCALAR ((int)(sizeof SCALAR / sizeof SCALAR[0]))

/* sum, mean, prod first: they accept empty reductions */
static const struct {
  const char *name;
  reduce_fn f;
} REDUCE[] = {
    {"sum", kiln_sum}, {"mean", kiln_mean}, {"prod", kiln_prod},
    {"max", kiln_max}, {"min", kiln_min},
};
#define N_REDUCE ((int)(sizeof REDUCE / sizeof REDUCE[0]))

/* --- program records ------------------------------------------------------------- */

enum {
  K_LEAF,
  K_UNARY,
  K_BINARY,
  K_SCALAR,
  K_WHERE,
  K_CLAMP,
  K_CAST,
  K_REDUCE,
  K_ARG,
  K_MATMUL,
  K_RESHAPE,
  K_PERMUTE,
  K_TRANSPOSE,
  K_EXPAND,
  K_SQUEEZE,
  K_UNSQUEEZE,
  K_SLICE,
  K_CONCAT,
  K_STACK,
  K_INDEX_SELECT,
  K_GATHER,
  K_GATHER_ARG,
  K_SCATTER_ADD,
  K_SOFTMAX,
  K_LOG_SOFTMAX,
  K_LOGSUMEXP,
  K_LAYER_NORM,
  K_MSE,
  K_XENT,
  K_ASSIGN,
  K_SUB_SCALED,
  K_READ,
  K_ITEM,
  K_RETAIN,
  K_RELEASE,
  K_COUNT
};

static const int WEIGHT[K_COUNT] = {
    [K_LEAF] = 2,        [K_UNARY] = 10,     [K_BINARY] = 14,     [K_SCALAR] = 6,
    [K_WHERE] = 3,       [K_CLAMP] = 2,      [K_CAST] = 3,        [K_REDUCE] = 6,
    [K_ARG] = 2,         [K_MATMUL] = 4,     [K_RESHAPE] = 3,     [K_PERMUTE] = 2,
    [K_TRANSPOSE] = 2,   [K_EXPAND] = 3,     [K_SQUEEZE] = 1,     [K_UNSQUEEZE] = 2,
    [K_SLICE] = 4,       [K_CONCAT] = 2,     [K_STACK] = 2,       [K_INDEX_SELECT] = 2,
    [K_GATHER] = 2,      [K_GATHER_ARG] = 1, [K_SCATTER_ADD] = 1, [K_SOFTMAX] = 1,
    [K_LOG_SOFTMAX] = 1, [K_LOGSUMEXP] = 1,  [K_LAYER_NORM] = 2,  [K_MSE] = 1,
    [K_XENT] = 1,        [K_ASSIGN] = 4,     [K_SUB_SCALED] = 4,  [K_READ] = 3,
    [K_ITEM] = 3,        [K_RETAIN] = 1,     [K_RELEASE] = 3,
};

typedef struct {
  int kind, fn, dst;          /* dst: the pool slot a new tensor goes to, or -1 */
  int nin, in[4];             /* pool slots; -1 = NULL (layer_norm's w/b) */
  int niv, iv[KILN_MAX_DIMS]; /* axes, permutation */
  int nsv;
  int64_t sv[KILN_MAX_DIMS]; /* shape, or slice start/stop/step */
  double dv[2];
  bool flag;     /* keepdim */
  kiln_dtype dt; /* leaf / cast / index dtype */
  int lnd;       /* leaf or index tensor shape */
  int64_t lshape[KILN_MAX_DIMS];
  uint64_t vseed;
  int64_t vbound; /* < 0: general values, else indices in [0, vbound) */
  char text[240];
} oprec;

#define TX(r, ...) \
  snprintf((r)->text + strlen((r)->text), sizeof(r)->text - strlen((r)->text), __VA_ARGS__)

typedef struct {
  int step, nd;
  kiln_dtype dt;
  int64_t shape[KILN_MAX_DIMS];
  size_t nbytes;
  unsigned char *bytes;
} readrec;

typedef struct {
  kiln_tensor *pool[MAXPOOL];
  readrec reads[MAXRECS];
  int nreads;
} state;

static void state_free(state *st) {
  for (int i = 0; i < MAXPOOL; i++) {
    kiln_release(st->pool[i]);
    st->pool[i] = NULL;
  }
  for (int i = 0; i < st->nreads; i++) free(st->reads[i].bytes);
  st->nreads = 0;
}

/* reads t (any layout) as row-major bytes; NULL + message on failure */
static unsigned char *read_bytes(kiln_tensor *t, size_t *nbytes) {
  size_t nb = (size_t)kiln_numel(t) * ktest_dtype_size(kiln_dtype_of(t));
  unsigned char *buf = malloc(nb ? nb : 1);
  if (kiln_to_buffer(t, buf, nb) < 0) {
    free(buf);
    return NULL;
  }
  *nbytes = nb;
  return buf;
}

static bool log_read(state *st, int step, kiln_tensor *t) {
  readrec *rd = &st->reads[st->nreads];
  memset(rd, 0, sizeof *rd);
  rd->step = step;
  rd->dt = kiln_dtype_of(t);
  rd->nd = kiln_ndim(t);
  memcpy(rd->shape, kiln_shape(t), (size_t)rd->nd * sizeof(int64_t));
  rd->bytes = read_bytes(t, &rd->nbytes);
  if (!rd->bytes) return false;
  st->nreads++;
  return true;
}

static void log_item(state *st, int step, double v) {
  readrec *rd = &st->reads[st->nreads++];
  memset(rd, 0, sizeof *rd);
  rd->step = step;
  rd->dt = KILN_F64;
  rd->nbytes = sizeof v;
  rd->bytes = malloc(sizeof v);
  memcpy(rd->bytes, &v, sizeof v);
}

static kiln_tensor *rec_leaf(const oprec *r) {
  return make_leaf(r->dt, r->lnd, r->lshape, r->vseed, r->vbound);
}

/* runs one record against the pool; false (with err) when a call failed */
static bool exec_rec(state *st, const oprec *r, int step, char *err, size_t errn) {
  kiln_tensor **P = st->pool;
  kiln_tensor *A = r->nin > 0 && r->in[0] >= 0 ? P[r->in[0]] : NULL;
  kiln_tensor *B = r->nin > 1 && r->in[1] >= 0 ? P[r->in[1]] : NULL;
  kiln_tensor *C = r->nin > 2 && r->in[2] >= 0 ? P[r->in[2]] : NULL;
  kiln_tensor *res = NULL, *tmp = NULL;
  bool produces = true;
  int rc = KILN_OK;
  kiln_clear_error();
  switch (r->kind) {
    case K_LEAF:
      res = rec_leaf(r);
      break;
    case K_UNARY:
      res = UNARY[r->fn].f(A);
      break;
    case K_BINARY:
      res = BINARY[r->fn].f(A, B);
      break;
    case K_SCALAR:
      res = SCALAR[r->fn].f(A, r->dv[0]);
      break;
    case K_WHERE:
      res = kiln_where(A, B, C);
      break;
    case K_CLAMP:
      res = kiln_clamp(A, r->dv[0], r->dv[1]);
      break;
    case K_CAST:
      res = kiln_cast(A, r->dt);
      break;
    case K_REDUCE:
      res = REDUCE[r->fn].f(A, r->niv, r->iv, r->flag);
      break;
    case K_ARG:
      res = (r->fn ? kiln_argmin : kiln_argmax)(A, r->iv[0], r->flag);
      break;
    case K_MATMUL:
      if (r->fn) { /* a @ transpose(b, -1, -2) */
        tmp = kiln_transpose(B, -1, -2);
        res = tmp ? kiln_matmul(A, tmp) : NULL;
      } else {
        res = kiln_matmul(A, B);
      }
      break;
    case K_RESHAPE:
      res = kiln_reshape(A, r->nsv, r->sv);
      break;
    case K_PERMUTE:
      res = kiln_permute(A, r->iv);
      break;
    case K_TRANSPOSE:
      res = kiln_transpose(A, r->iv[0], r->iv[1]);
      break;
    case K_EXPAND:
      res = kiln_expand(A, r->nsv, r->sv);
      break;
    case K_SQUEEZE:
      res = kiln_squeeze(A, r->iv[0]);
      break;
    case K_UNSQUEEZE:
      res = kiln_unsqueeze(A, r->iv[0]);
      break;
    case K_SLICE:
      res = kiln_slice(A, r->iv[0], r->sv[0], r->sv[1], r->sv[2]);
      break;
    case K_CONCAT:
    case K_STACK: {
      kiln_tensor *ts[4];
      for (int i = 0; i < r->nin; i++) ts[i] = P[r->in[i]];
      res = (r->kind == K_CONCAT ? kiln_concat : kiln_stack)(r->nin, ts, r->iv[0]);
      break;
    }
    case K_INDEX_SELECT:
      tmp = rec_leaf(r);
      res = tmp ? kiln_index_select(A, r->iv[0], tmp) : NULL;
      break;
    case K_GATHER:
      tmp = rec_leaf(r);
      res = tmp ? kiln_gather(A, r->iv[0], tmp) : NULL;
      break;
    case K_GATHER_ARG:
      tmp = (r->fn ? kiln_argmin : kiln_argmax)(A, r->iv[0], true);
      res = tmp ? kiln_gather(A, r->iv[0], tmp) : NULL;
      break;
    case K_SCATTER_ADD:
      tmp = rec_leaf(r);
      res = tmp ? kiln_scatter_add(A, r->iv[0], tmp, B) : NULL;
      break;
    case K_SOFTMAX:
      res = kiln_softmax(A, r->iv[0]);
      break;
    case K_LOG_SOFTMAX:
      res = kiln_log_softmax(A, r->iv[0]);
      break;
    case K_LOGSUMEXP:
      res = kiln_logsumexp(A, r->iv[0], r->flag);
      break;
    case K_LAYER_NORM:
      res = kiln_layer_norm(A, B, C, r->dv[0]);
      break;
    case K_MSE:
      res = kiln_mse_loss(A, B);
      break;
    case K_XENT:
      tmp = rec_leaf(r);
      res = tmp ? kiln_cross_entropy(A, tmp) : NULL;
      break;
    case K_ASSIGN:
      produces = false;
      rc = kiln_assign(A, B);
      break;
    case K_SUB_SCALED:
      produces = false;
      rc = kiln_sub_scaled_(A, B, r->dv[0]);
      break;
    case K_READ:
      produces = false;
      if (!log_read(st, step, A)) rc = kiln_last_status() ? kiln_last_status() : KILN_ERR_INTERNAL;
      break;
    case K_ITEM: {
      kiln_tensor *red = r->fn < 0 ? kiln_retain(A) : REDUCE[r->fn].f(A, 0, NULL, false);
      double v = red ? kiln_item(red) : NAN;
      if (red && kiln_last_status() == KILN_OK) log_item(st, step, v);
      if (r->dst >= 0) {
        res = red;
      } else {
        produces = false;
        rc = red ? kiln_last_status() : KILN_ERR_INTERNAL;
        kiln_release(red);
      }
      if (res && kiln_last_status() != KILN_OK) { /* item failed on a kept tensor */
        rc = kiln_last_status();
      }
      break;
    }
    case K_RETAIN:
      res = kiln_retain(A);
      break;
    case K_RELEASE:
      produces = false;
      kiln_release(A);
      P[r->in[0]] = NULL;
      break;
  }
  kiln_release(tmp);
  if (produces) {
    if (!res) {
      snprintf(err, errn, "returned NULL: %s (status %d)", kiln_last_error(),
               (int)kiln_last_status());
      return false;
    }
    P[r->dst] = res;
  }
  if (rc != KILN_OK) {
    snprintf(err, errn, "failed with status %d: %s", rc, kiln_last_error());
    return false;
  }
  return true;
}

/* --- the generator ------------------------------------------------------------ */

#define ND(t) kiln_ndim(t)
#define SH(t) kiln_shape(t)
#define NUMEL(t) kiln_numel(t)
#define DT(t) kiln_dtype_of(t)

/* iterates j over the occupied slots, starting at a random one */
#define FOR_SLOTS(st, g, j)                                               \
  for (int o_##j = rn(g, MAXPOOL), k_##j = 0, j = o_##j; k_##j < MAXPOOL; \
       k_##j++, j = (o_##j + k_##j) % MAXPOOL)                            \
    if ((st)->pool[j])

static int count_slots(const state *st, bool occupied) {
  int n = 0;
  for (int i = 0; i < MAXPOOL; i++) n += (st->pool[i] != NULL) == occupied;
  return n;
}

static int pick_slot(state *st, uint64_t *g) {
  FOR_SLOTS(st, g, j) return j;
  return -1;
}

static int free_slot(state *st, uint64_t *g) {
  int o = rn(g, MAXPOOL);
  for (int k = 0; k < MAXPOOL; k++)
    if (!st->pool[(o + k) % MAXPOOL]) return (o + k) % MAXPOOL;
  return -1;
}

static kiln_dtype rand_dtype(uint64_t *g) {
  static const kiln_dtype w[] = {KILN_F32,  KILN_F32, KILN_F32, KILN_F32, KILN_F64,
                                 KILN_F64,  KILN_I32, KILN_I64, KILN_I64, KILN_BOOL,
                                 KILN_BOOL, KILN_I8,  KILN_I16};
  return w[rn(g, (int)(sizeof w / sizeof w[0]))];
}

static double rand_scalar(uint64_t *g) {
  static const double v[] = {0, 1, -1, 2, 0.5, -0.5, 3, 0.99, 0.01, -2.5, 1e-3, 100, 0.1};
  if (coin(g, 20)) return (rn(g, 2001) - 1000) / 137.0;
  return v[rn(g, (int)(sizeof v / sizeof v[0]))];
}

static int rand_axis(uint64_t *g, int nd) { return rr(g, -nd, nd - 1); }

static bool same_shape(kiln_tensor *a, kiln_tensor *b) {
  return ND(a) == ND(b) && !memcmp(SH(a), SH(b), (size_t)ND(a) * sizeof(int64_t));
}

/* b broadcasts with a into at most CAP_NUMEL elements */
static bool compatible(kiln_tensor *a, kiln_tensor *b, int *no, int64_t *so) {
  return bshape(ND(a), SH(a), ND(b), SH(b), no, so) && *no <= MAXND &&
         shape_numel(*no, so) <= CAP_NUMEL;
}

static bool matmul_fits(kiln_tensor *a, kiln_tensor *b) {
  int na = ND(a), nb = ND(b), no;
  const int64_t *sa = SH(a), *sb = SH(b);
  int64_t so[KILN_MAX_DIMS];
  if (!na || !nb || (DT(a) == KILN_BOOL && DT(b) == KILN_BOOL)) return false;
  if (sa[na - 1] != (nb == 1 ? sb[0] : sb[nb - 2])) return false;
  if (!bshape(na > 2 ? na - 2 : 0, sa, nb > 2 ? nb - 2 : 0, sb, &no, so)) return false;
  int64_t n = shape_numel(no, so) * (na >= 2 ? sa[na - 2] : 1) * (nb >= 2 ? sb[nb - 1] : 1);
  return no + 2 <= MAXND && n <= CAP_NUMEL;
}

/* a random index tensor in r's leaf fields */
static void index_leaf(uint64_t *g, oprec *r, int nd, const int64_t *shape, int64_t bound) {
  r->dt = coin(g, 50) ? KILN_I64 : KILN_I32;
  r->lnd = nd;
  memcpy(r->lshape, shape, (size_t)nd * sizeof(int64_t));
  r->vseed = sm_next(g);
  r->vbound = bound;
}

static void text_index_leaf(oprec *r) {
  char sb[64];
  fmt_shape(sb, sizeof sb, r->lnd, r->lshape);
  TX(r, "idx=%s%s<", DT_NAME[r->dt], sb);
  int64_t n = shape_numel(r->lnd, r->lshape);
  uint64_t s = r->vseed;
  for (int64_t i = 0; i < n && i < 12; i++) TX(r, i ? ",%d" : "%d", rn(&s, (int)r->vbound));
  TX(r, n > 12 ? ",...>" : ">");
}

static void text_tensor(oprec *r, kiln_tensor *t) {
  char sb[64];
  fmt_shape(sb, sizeof sb, ND(t), SH(t));
  TX(r, " -> %s%s", DT_NAME[DT(t)], sb);
}

static const int64_t LEAF_SHAPES[][4] = {
    /* nd, dims... */
    {0}, {1, 3}, {2, 4, 3}, {3, 2, 4, 3}, {2, 1, 3}, {2, 4, 1}, {1, 1}, {3, 2, 1, 3}, {1, 4},
};

/* fills r for `kind`, choosing operands from the pool; false if it does not fit */
static bool gen_kind(state *st, uint64_t *g, int kind, oprec *r) {
  kiln_tensor **P = st->pool;
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->dst = -1;
  r->vbound = -1;
  int a = -1, b = -1, no;
  int64_t so[KILN_MAX_DIMS];
  if (kind != K_LEAF) {
    a = pick_slot(st, g);
    if (a < 0) return false;
  }
  kiln_tensor *A = a >= 0 ? P[a] : NULL;
  int nd = A ? ND(A) : 0;
  const int64_t *sa = A ? SH(A) : NULL;
  r->nin = 1;
  r->in[0] = a;
  switch (kind) {
    case K_LEAF: {
      const int64_t *ls = LEAF_SHAPES[rn(g, (int)(sizeof LEAF_SHAPES / sizeof LEAF_SHAPES[0]))];
      r->nin = 0;
      r->dt = rand_dtype(g);
      r->lnd = (int)ls[0];
      memcpy(r->lshape, ls + 1, (size_t)r->lnd * sizeof(int64_t));
      r->vseed = sm_next(g);
      char sb[64];
      fmt_shape(sb, sizeof sb, r->lnd, r->lshape);
      TX(r, "leaf %s%s seed=%llx", DT_NAME[r->dt], sb, (unsigned long long)r->vseed);
      break;
    }
    case K_UNARY:
      r->fn = rn(g, N_UNARY);
      if (DT(A) == KILN_BOOL && (r->fn == U_NEG || r->fn == U_RELU)) r->fn = U_NOT;
      TX(r, "%s(t%d)", UNARY[r->fn].name, a);
      break;
    case K_BINARY:
    case K_MSE: {
      FOR_SLOTS(st, g, j) { /* losses take equal shapes, other binaries broadcast */
        if (kind == K_MSE ? same_shape(A, P[j]) : compatible(A, P[j], &no, so)) {
          b = j;
          break;
        }
      }
      if (b < 0) return false;
      if (coin(g, 50)) {
        int t = a;
        a = b;
        b = t;
      }
      bool both_bool = DT(P[a]) == KILN_BOOL && DT(P[b]) == KILN_BOOL;
      r->nin = 2;
      r->in[0] = a;
      r->in[1] = b;
      if (kind == K_MSE) {
        if (both_bool) return false;
        TX(r, "mse_loss(t%d, t%d)", a, b);
        break;
      }
      r->fn = rn(g, N_BINARY);
      if (both_bool && (r->fn == B_SUB || r->fn == B_POW)) r->fn = 0;
      TX(r, "%s(t%d, t%d)", BINARY[r->fn].name, a, b);
      break;
    }
    case K_SCALAR:
      r->fn = rn(g, N_SCALAR);
      r->dv[0] = rand_scalar(g);
      TX(r, "%s(t%d, %.17g)", SCALAR[r->fn].name, a, r->dv[0]);
      break;
    case K_WHERE: {
      int c = -1;
      FOR_SLOTS(st, g, j) {
        if (DT(P[j]) == KILN_BOOL) {
          c = j;
          break;
        }
      }
      if (c < 0) return false;
      int nc = 0;
      int64_t sc[KILN_MAX_DIMS];
      a = -1;
      FOR_SLOTS(st, g, j) {
        if (compatible(P[c], P[j], &nc, sc)) {
          a = j;
          break;
        }
      }
      if (a < 0) return false;
      FOR_SLOTS(st, g, j) {
        if (bshape(nc, sc, ND(P[j]), SH(P[j]), &no, so) && no <= MAXND &&
            shape_numel(no, so) <= CAP_NUMEL) {
          b = j;
          break;
        }
      }
      if (a < 0 || b < 0) return false;
      r->nin = 3;
      r->in[0] = c;
      r->in[1] = a;
      r->in[2] = b;
      TX(r, "where(t%d, t%d, t%d)", c, a, b);
      break;
    }
    case K_CLAMP:
      if (DT(A) == KILN_BOOL) return false;
      r->dv[0] = (rn(g, 41) - 20) / 4.0;
      r->dv[1] = r->dv[0] + rn(g, 40) / 4.0;
      if (coin(g, 10)) { /* lo > hi: everything becomes hi */
        double t = r->dv[0];
        r->dv[0] = r->dv[1] + 0.5;
        r->dv[1] = t;
      }
      TX(r, "clamp(t%d, %g, %g)", a, r->dv[0], r->dv[1]);
      break;
    case K_CAST:
      r->dt = (kiln_dtype)rn(g, 5);
      TX(r, "cast(t%d, %s)", a, DT_NAME[r->dt]);
      break;
    case K_REDUCE: {
      r->fn = rn(g, N_REDUCE);
      if (NUMEL(A) == 0 && r->fn >= 3) r->fn = 0;
      if (nd > 0 && !coin(g, 30)) {
        int perm[KILN_MAX_DIMS];
        for (int i = 0; i < nd; i++) perm[i] = i;
        for (int i = nd - 1; i > 0; i--) {
          int j = rn(g, i + 1), t = perm[i];
          perm[i] = perm[j];
          perm[j] = t;
        }
        r->niv = rr(g, 1, nd);
        for (int i = 0; i < r->niv; i++) r->iv[i] = perm[i] - (coin(g, 30) ? nd : 0);
      }
      r->flag = coin(g, 50);
      TX(r, "%s(t%d, axes={", REDUCE[r->fn].name, a);
      for (int i = 0; i < r->niv; i++) TX(r, i ? ",%d" : "%d", r->iv[i]);
      TX(r, "}, keepdim=%d)", r->flag);
      break;
    }
    case K_ARG:
      if (nd == 0 || NUMEL(A) == 0) return false;
      r->fn = rn(g, 2);
      r->iv[0] = rand_axis(g, nd);
      r->flag = coin(g, 50);
      TX(r, "%s(t%d, %d, keepdim=%d)", r->fn ? "argmin" : "argmax", a, r->iv[0], r->flag);
      break;
    case K_MATMUL:
      if (nd == 0) return false;
      FOR_SLOTS(st, g, j) {
        if (matmul_fits(A, P[j])) {
          b = j;
          break;
        }
      }
      if (b < 0 || (nd >= 2 && coin(g, 30))) { /* a @ a^T always fits */
        if (nd < 2 || DT(A) == KILN_BOOL) return false;
        int64_t out = sa[nd - 2] * sa[nd - 2];
        for (int d = 0; d < nd - 2; d++) out *= sa[d];
        if (out > CAP_NUMEL) return false;
        b = a;
        r->fn = 1;
      }
      r->nin = 2;
      r->in[1] = b;
      if (r->fn)
        TX(r, "matmul(t%d, transpose(t%d, -1, -2))", a, b);
      else
        TX(r, "matmul(t%d, t%d)", a, b);
      break;
    case K_RESHAPE: {
      int64_t n = NUMEL(A);
      int k = rr(g, 0, 4);
      if (n != 1 && k == 0) k = 1;
      for (int i = 0; i < k; i++) r->sv[i] = 1;
      if (n == 0) {
        r->sv[rn(g, k)] = 0;
      } else {
        int64_t m = n;
        for (int64_t p = 2; m > 1; p++)
          while (m % p == 0) {
            r->sv[rn(g, k)] *= p;
            m /= p;
          }
        if (coin(g, 30)) r->sv[rn(g, k)] = -1;
      }
      r->nsv = k;
      char sb[64];
      fmt_shape(sb, sizeof sb, k, r->sv);
      TX(r, "reshape(t%d, %s)", a, sb);
      break;
    }
    case K_PERMUTE:
      for (int i = 0; i < nd; i++) r->iv[i] = i;
      for (int i = nd - 1; i > 0; i--) {
        int j = rn(g, i + 1), t = r->iv[i];
        r->iv[i] = r->iv[j];
        r->iv[j] = t;
      }
      for (int i = 0; i < nd; i++)
        if (coin(g, 20)) r->iv[i] -= nd;
      r->niv = nd;
      TX(r, "permute(t%d, {", a);
      for (int i = 0; i < nd; i++) TX(r, i ? ",%d" : "%d", r->iv[i]);
      TX(r, "})");
      break;
    case K_TRANSPOSE:
      if (nd == 0) return false;
      r->iv[0] = rand_axis(g, nd);
      r->iv[1] = rand_axis(g, nd);
      TX(r, "transpose(t%d, %d, %d)", a, r->iv[0], r->iv[1]);
      break;
    case K_EXPAND: {
      int n = nd + rr(g, 0, 2);
      if (n > MAXND) n = nd;
      int lead = n - nd;
      int64_t real[KILN_MAX_DIMS];
      for (int d = 0; d < n; d++) {
        if (d < lead) {
          real[d] = r->sv[d] = rr(g, 1, 3);
        } else {
          int64_t have = sa[d - lead];
          real[d] = r->sv[d] = have == 1 && coin(g, 60) ? rr(g, 1, 3) : have;
          if (real[d] == have && coin(g, 25)) r->sv[d] = -1;
        }
      }
      if (shape_numel(n, real) > CAP_NUMEL) return false;
      r->nsv = n;
      char sb[64];
      fmt_shape(sb, sizeof sb, n, r->sv);
      TX(r, "expand(t%d, %s)", a, sb);
      break;
    }
    case K_SQUEEZE: {
      a = -1;
      FOR_SLOTS(st, g, j) {
        for (int d = 0; d < ND(P[j]) && a < 0; d++)
          if (SH(P[j])[d] == 1) a = j;
        if (a >= 0) break;
      }
      if (a < 0) return false;
      int n1 = 0, ax[KILN_MAX_DIMS];
      for (int d = 0; d < ND(P[a]); d++)
        if (SH(P[a])[d] == 1) ax[n1++] = d;
      r->in[0] = a;
      r->iv[0] = ax[rn(g, n1)] - (coin(g, 30) ? ND(P[a]) : 0);
      TX(r, "squeeze(t%d, %d)", a, r->iv[0]);
      break;
    }
    case K_UNSQUEEZE:
      if (nd >= MAXND) return false;
      r->iv[0] = rr(g, -(nd + 1), nd);
      TX(r, "unsqueeze(t%d, %d)", a, r->iv[0]);
      break;
    case K_SLICE: {
      static const int64_t steps[] = {1, 1, 1, 2, 3, -1, -1, -2, -3};
      if (nd == 0) return false;
      int ax = rn(g, nd);
      int len = (int)sa[ax];
      r->iv[0] = ax - (coin(g, 30) ? nd : 0);
      r->sv[2] = steps[rn(g, (int)(sizeof steps / sizeof steps[0]))];
      r->sv[0] = rr(g, -len - 2, len + 2);
      r->sv[1] = rr(g, -len - 2, len + 2);
      if (coin(g, 25)) { /* the whole axis, in step's direction */
        r->sv[0] = r->sv[2] > 0 ? 0 : -1;
        r->sv[1] = r->sv[2] > 0 ? INT64_MAX : INT64_MIN;
      }
      TX(r, "slice(t%d, %d, %lld, %lld, %lld)", a, r->iv[0], (long long)r->sv[0],
         (long long)r->sv[1], (long long)r->sv[2]);
      break;
    }
    case K_CONCAT: {
      if (nd == 0) return false;
      int ax = rn(g, nd), want = rr(g, 1, 2);
      int64_t total = NUMEL(A);
      r->nin = 1;
      for (int w = 0; w < want; w++) {
        FOR_SLOTS(st, g, j) {
          kiln_tensor *t = P[j];
          bool ok = ND(t) == nd;
          for (int d = 0; ok && d < nd; d++) ok = d == ax || SH(t)[d] == sa[d];
          if (ok && total + NUMEL(t) <= CAP_NUMEL) {
            r->in[r->nin++] = j;
            total += NUMEL(t);
            break;
          }
        }
      }
      r->iv[0] = ax - (coin(g, 30) ? nd : 0);
      TX(r, "concat({");
      for (int i = 0; i < r->nin; i++) TX(r, i ? ",t%d" : "t%d", r->in[i]);
      TX(r, "}, %d)", r->iv[0]);
      break;
    }
    case K_STACK: {
      if (nd >= MAXND) return false;
      int want = rr(g, 1, 2);
      r->nin = 1;
      for (int w = 0; w < want && NUMEL(A) * (r->nin + 1) <= CAP_NUMEL; w++) {
        FOR_SLOTS(st, g, j) {
          if (same_shape(A, P[j])) {
            r->in[r->nin++] = j;
            break;
          }
        }
      }
      r->iv[0] = rr(g, -(nd + 1), nd);
      TX(r, "stack({");
      for (int i = 0; i < r->nin; i++) TX(r, i ? ",t%d" : "t%d", r->in[i]);
      TX(r, "}, %d)", r->iv[0]);
      break;
    }
    case K_INDEX_SELECT: {
      if (nd == 0) return false;
      int ax = rn(g, nd);
      int64_t len = sa[ax], L = len > 0 ? rr(g, 0, 5) : 0;
      if (len > 0 && NUMEL(A) / len * L > CAP_NUMEL) return false;
      index_leaf(g, r, 1, &L, len);
      r->iv[0] = ax - (coin(g, 30) ? nd : 0);
      TX(r, "index_select(t%d, %d, ", a, r->iv[0]);
      text_index_leaf(r);
      TX(r, ")");
      break;
    }
    case K_GATHER: {
      if (nd == 0) return false;
      int ax = rn(g, nd);
      if (sa[ax] == 0) return false;
      int64_t is[KILN_MAX_DIMS];
      for (int d = 0; d < nd; d++)
        is[d] = d == ax ? rr(g, 1, 4) : sa[d] == 0 ? 0 : rr(g, 1, (int)sa[d]);
      if (shape_numel(nd, is) > CAP_NUMEL) return false;
      index_leaf(g, r, nd, is, sa[ax]);
      r->iv[0] = ax - (coin(g, 30) ? nd : 0);
      TX(r, "gather(t%d, %d, ", a, r->iv[0]);
      text_index_leaf(r);
      TX(r, ")");
      break;
    }
    case K_GATHER_ARG:
      if (nd == 0 || NUMEL(A) == 0) return false;
      r->fn = rn(g, 2);
      r->iv[0] = rand_axis(g, nd);
      TX(r, "gather(t%d, %d, %s(t%d, %d, keepdim=1))", a, r->iv[0], r->fn ? "argmin" : "argmax", a,
         r->iv[0]);
      break;
    case K_SCATTER_ADD: {
      if (nd == 0) return false;
      int ax = rn(g, nd);
      if (sa[ax] == 0) return false;
      FOR_SLOTS(st, g, j) {
        kiln_tensor *t = P[j];
        bool ok = ND(t) == nd;
        for (int d = 0; ok && d < nd; d++) ok = d == ax || SH(t)[d] <= sa[d];
        if (ok) {
          b = j;
          break;
        }
      }
      if (b < 0) return false; /* a itself always fits, so this does not happen */
      index_leaf(g, r, nd, SH(P[b]), sa[ax]);
      r->nin = 2;
      r->in[1] = b;
      r->iv[0] = ax - (coin(g, 30) ? nd : 0);
      TX(r, "scatter_add(t%d, %d, ", a, r->iv[0]);
      text_index_leaf(r);
      TX(r, ", t%d)", b);
      break;
    }
    case K_SOFTMAX:
    case K_LOG_SOFTMAX:
    case K_LOGSUMEXP:
      if (nd == 0 || NUMEL(A) == 0) return false;
      r->iv[0] = rand_axis(g, nd);
      r->flag = kind == K_LOGSUMEXP && coin(g, 50);
      TX(r, "%s(t%d, %d",
         kind == K_SOFTMAX       ? "softmax"
         : kind == K_LOG_SOFTMAX ? "log_softmax"
                                 : "logsumexp",
         a, r->iv[0]);
      TX(r, kind == K_LOGSUMEXP ? ", keepdim=%d)" : ")", r->flag);
      break;
    case K_LAYER_NORM: {
      static const double eps[] = {1e-5, 1e-3, 0.0};
      if (nd == 0) return false;
      int64_t d = sa[nd - 1];
      r->nin = 3;
      r->in[1] = r->in[2] = -1;
      for (int k = 1; k <= 2; k++) {
        if (!coin(g, 60)) continue;
        FOR_SLOTS(st, g, j) {
          if (ND(P[j]) == 1 && SH(P[j])[0] == d) {
            r->in[k] = j;
            break;
          }
        }
      }
      r->dv[0] = eps[rn(g, 3)];
      TX(r, "layer_norm(t%d, ", a);
      TX(r, r->in[1] >= 0 ? "t%d, " : "NULL, ", r->in[1]);
      TX(r, r->in[2] >= 0 ? "t%d, " : "NULL, ", r->in[2]);
      TX(r, "%g)", r->dv[0]);
      break;
    }
    case K_XENT: {
      a = -1;
      FOR_SLOTS(st, g, j) {
        if (ND(P[j]) == 2 && SH(P[j])[1] > 0 && DT(P[j]) != KILN_BOOL) {
          a = j;
          break;
        }
      }
      if (a < 0) return false;
      r->in[0] = a;
      index_leaf(g, r, 1, SH(P[a]), SH(P[a])[1]);
      TX(r, "cross_entropy(t%d, ", a);
      text_index_leaf(r);
      TX(r, ")");
      break;
    }
    case K_ASSIGN:
      FOR_SLOTS(st, g, j) {
        if (same_shape(A, P[j])) {
          b = j;
          break;
        }
      }
      r->nin = 2;
      r->in[1] = b;
      TX(r, "assign(t%d, t%d)", a, b);
      break;
    case K_SUB_SCALED:
      FOR_SLOTS(st, g, j) {
        if (dt_float(DT(P[j])) && bshape(nd, sa, ND(P[j]), SH(P[j]), &no, so) && no == nd &&
            !memcmp(so, sa, (size_t)nd * sizeof(int64_t))) {
          b = j;
          break;
        }
      }
      if (b < 0) return false;
      r->nin = 2;
      r->in[1] = b;
      r->dv[0] = rand_scalar(g);
      TX(r, "sub_scaled_(t%d, t%d, %.17g)", a, b, r->dv[0]);
      break;
    case K_READ:
      TX(r, "read(t%d)", a);
      break;
    case K_ITEM:
      if (NUMEL(A) == 1 && coin(g, 40)) {
        r->fn = -1;
        TX(r, "item(t%d)", a);
      } else {
        r->fn = rn(g, NUMEL(A) == 0 ? 3 : N_REDUCE);
        TX(r, "item(%s(t%d))", REDUCE[r->fn].name, a);
      }
      if (coin(g, 50)) r->dst = free_slot(st, g);
      break;
    case K_RETAIN:
      TX(r, "retain(t%d)", a);
      break;
    case K_RELEASE:
      if (count_slots(st, true) < 3) return false;
      TX(r, "release(t%d)", a);
      break;
  }
  bool produces = kind != K_ASSIGN && kind != K_SUB_SCALED && kind != K_READ && kind != K_RELEASE &&
                  kind != K_ITEM;
  if (produces) r->dst = free_slot(st, g);
  return !produces || r->dst >= 0;
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

/* --- running and comparing ------------------------------------------------------ */

enum { MODE_LAZY, MODE_SYNC_EACH, MODE_SYNC_SOME };
static const char *const MODE_NAME[] = {"lazy", "sync after every op", "sync at random points"};

static int fuzz_reports; /* full step lists printed so far */

static void print_program(uint64_t seed, const oprec *recs, int n, int upto) {
  fprintf(stderr, "  program of seed %llu (%d steps):\n", (unsigned long long)seed, n);
  for (int i = 0; i < n && i <= upto; i++) {
    if (recs[i].dst >= 0)
      fprintf(stderr, "    %3d: t%d = %s\n", i, recs[i].dst, recs[i].text);
    else
      fprintf(stderr, "    %3d: %s\n", i, recs[i].text);
  }
}

static bool sync_after(uint64_t seed, int mode, int i) {
  if (mode == MODE_SYNC_EACH) return true;
  if (mode == MODE_LAZY) return false;
  uint64_t s = seed * 1000003u + (uint64_t)i;
  return sm_next(&s) % 4 == 0;
}

/* generates (mode lazy, recs filled) or replays recs; false on a failed call */
static bool run_program(uint64_t seed, int mode, state *st, oprec *recs, int *nrecs) {
  memset(st, 0, sizeof *st);
  char err[512];
  if (mode == MODE_LAZY) {
    uint64_t g = seed * 0xD1B54A32D192ED03ull + 17;
    int n = 0, nleaves = rr(&g, 4, 6), nsteps = rr(&g, 30, 60);
    for (int s = 0; s < nleaves + nsteps; s++) {
      if (count_slots(st, false) == 0 && gen_kind(st, &g, K_RELEASE, &recs[n])) {
        if (!exec_rec(st, &recs[n], n, err, sizeof err)) goto fail_gen;
        n++;
      }
      int kind = s < nleaves ? K_LEAF : pick_kind(&g);
      for (int tries = 0; !gen_kind(st, &g, kind, &recs[n]); tries++)
        kind = tries < 30 ? pick_kind(&g) : K_LEAF;
      if (!exec_rec(st, &recs[n], n, err, sizeof err)) goto fail_gen;
      if (recs[n].dst >= 0 && st->pool[recs[n].dst]) text_tensor(&recs[n], st->pool[recs[n].dst]);
      if (recs[n].kind == K_ASSIGN || recs[n].kind == K_SUB_SCALED)
        text_tensor(&recs[n], st->pool[recs[n].in[0]]);
      n++;
      continue;
    fail_gen:
      KTEST_FAIL("seed %llu (%s): step %d: %s %s", (unsigned long long)seed, MODE_NAME[mode], n,
                 recs[n].text, err);
      if (fuzz_reports++ < 3) print_program(seed, recs, n + 1, n);
      *nrecs = n;
      return false;
    }
    *nrecs = n;
    return true;
  }
  for (int i = 0; i < *nrecs; i++) {
    if (!exec_rec(st, &recs[i], i, err, sizeof err)) {
      KTEST_FAIL("seed %llu (%s): step %d: %s %s", (unsigned long long)seed, MODE_NAME[mode], i,
                 recs[i].text, err);
      if (fuzz_reports++ < 3) print_program(seed, recs, *nrecs, i);
      return false;
    }
    if (sync_after(seed, mode, i) && kiln_sync() < 0) {
      KTEST_FAIL("seed %llu: kiln_sync failed after step %d: %s", (unsigned long long)seed, i,
                 kiln_last_error());
      return false;
    }
  }
  return true;
}

static double load_elem(const unsigned char *p, kiln_dtype dt, size_t i) {
  switch (dt) {
    case KILN_BOOL:
      return p[i];
    case KILN_I32: {
      int32_t v;
      memcpy(&v, p + i * 4, 4);
      return v;
    }
    case KILN_I64: {
      int64_t v;
      memcpy(&v, p + i * 8, 8);
      return (double)v;
    }
    case KILN_F32: {
      float v;
      memcpy(&v, p + i * 4, 4);
      return v;
    }
    default: {
      double v;
      memcpy(&v, p + i * 8, 8);
      return v;
    }
  }
}

/* first differing element (NaN == NaN), or -1 */
static int64_t first_diff(const unsigned char *x, const unsigned char *y, kiln_dtype dt,
                          size_t nbytes) {
  size_t es = ktest_dtype_size(dt), n = nbytes / es;
  for (size_t i = 0; i < n; i++) {
    if (!memcmp(x + i * es, y + i * es, es)) continue;
    if (dt_float(dt) && isnan(load_elem(x, dt, i)) && isnan(load_elem(y, dt, i))) continue;
    return (int64_t)i;
  }
  return -1;
}

static void report_mismatch(uint64_t seed, int mode, const oprec *recs, int nrecs, const char *what,
                            const char *detail) {
  KTEST_FAIL("seed %llu: lazy and %s differ: %s: %s", (unsigned long long)seed, MODE_NAME[mode],
             what, detail);
  if (fuzz_reports++ < 3) print_program(seed, recs, nrecs, nrecs);
}

static void describe_diff(char *buf, size_t n, const unsigned char *x, const unsigned char *y,
                          kiln_dtype dt, int64_t i) {
  snprintf(buf, n, "%s element %lld: lazy %.17g, other %.17g", DT_NAME[dt], (long long)i,
           load_elem(x, dt, (size_t)i), load_elem(y, dt, (size_t)i));
}

static bool compare_runs(uint64_t seed, int mode, state *x, state *y, const oprec *recs,
                         int nrecs) {
  char what[320], detail[320];
  if (x->nreads != y->nreads) {
    snprintf(detail, sizeof detail, "%d vs %d", x->nreads, y->nreads);
    report_mismatch(seed, mode, recs, nrecs, "number of reads", detail);
    return false;
  }
  for (int i = 0; i < x->nreads; i++) {
    readrec *p = &x->reads[i], *q = &y->reads[i];
    snprintf(what, sizeof what, "read at step %d (%s)", p->step, recs[p->step].text);
    if (p->dt != q->dt || p->nd != q->nd || p->nbytes != q->nbytes ||
        memcmp(p->shape, q->shape, (size_t)p->nd * sizeof(int64_t))) {
      report_mismatch(seed, mode, recs, nrecs, what, "dtype or shape differ");
      return false;
    }
    int64_t d = first_diff(p->bytes, q->bytes, p->dt, p->nbytes);
    if (d >= 0) {
      describe_diff(detail, sizeof detail, p->bytes, q->bytes, p->dt, d);
      report_mismatch(seed, mode, recs, nrecs, what, detail);
      return false;
    }
  }
  for (int s = 0; s < MAXPOOL; s++) {
    kiln_tensor *p = x->pool[s], *q = y->pool[s];
    int last = -1; /* the step that last bound slot s */
    for (int i = 0; i < nrecs; i++)
      if (recs[i].dst == s ||
          ((recs[i].kind == K_ASSIGN || recs[i].kind == K_SUB_SCALED) && recs[i].in[0] == s))
        last = i;
    snprintf(what, sizeof what, "final t%d (last bound at step %d: %s)", s, last,
             last >= 0 ? recs[last].text : "?");
    if (!p || !q) {
      if (p || q) {
        report_mismatch(seed, mode, recs, nrecs, what, "present in one run only");
        return false;
      }
      continue;
    }
    char s1[64], s2[64];
    fmt_shape(s1, sizeof s1, ND(p), SH(p));
    fmt_shape(s2, sizeof s2, ND(q), SH(q));
    if (DT(p) != DT(q) || strcmp(s1, s2)) {
      snprintf(detail, sizeof detail, "%s%s vs %s%s", DT_NAME[DT(p)], s1, DT_NAME[DT(q)], s2);
      report_mismatch(seed, mode, recs, nrecs, what, detail);
      return false;
    }
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = read_bytes(p, &n1), *b2 = read_bytes(q, &n2);
    bool ok = b1 && b2;
    if (!ok) {
      snprintf(detail, sizeof detail, "kiln_to_buffer failed: %s", kiln_last_error());
      report_mismatch(seed, mode, recs, nrecs, what, detail);
    } else {
      int64_t d = first_diff(b1, b2, DT(p), n1);
      if (d >= 0) {
        describe_diff(detail, sizeof detail, b1, b2, DT(p), d);
        report_mismatch(seed, mode, recs, nrecs, what, detail);
        ok = false;
      }
    }
    free(b1);
    free(b2);
    if (!ok) return false;
  }
  return true;
}

static oprec fuzz_recs[MAXRECS];
static state fuzz_lazy, fuzz_other;
static long fuzz_programs_run, fuzz_steps_run, fuzz_kind_count[K_COUNT];
static const char *const KIND_NAME[K_COUNT] = {
    "leaf",        "unary",        "binary",        "scalar",         "where",         "clamp",
    "cast",        "reduce",       "argmax/argmin", "matmul",         "reshape",       "permute",
    "transpose",   "expand",       "squeeze",       "unsqueeze",      "slice",         "concat",
    "stack",       "index_select", "gather",        "gather(argmax)", "scatter_add",   "softmax",
    "log_softmax", "logsumexp",    "layer_norm",    "mse_loss",       "cross_entropy", "assign",
    "sub_scaled_", "read",         "item",          "retain",         "release",
};

static void fuzz_one(uint64_t seed) {
  int n = 0;
  bool ok = run_program(seed, MODE_LAZY, &fuzz_lazy, fuzz_recs, &n);
  for (int mode = MODE_SYNC_EACH; ok && mode <= MODE_SYNC_SOME; mode++) {
    ok = run_program(seed, mode, &fuzz_other, fuzz_recs, &n) &&
         compare_runs(seed, mode, &fuzz_lazy, &fuzz_other, fuzz_recs, n);
    state_free(&fuzz_other);
  }
  state_free(&fuzz_lazy);
  kiln_sync();
  kiln_clear_error();
  fuzz_programs_run++;
  fuzz_steps_run += n;
  for (int i = 0; i < n; i++) fuzz_kind_count[fuzz_recs[i].kind]++;
}

TEST(lazy_fuzz) {
  const char *one = getenv("KILN_FUZZ_SEED"), *count = getenv("KILN_FUZZ_PROGRAMS");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (one) {
    fuzz_one(strtoull(one, NULL, 10));
  } else {
    uint64_t n = count ? strtoull(count, NULL, 10) : 500;
    for (uint64_t seed = 1; seed <= n; seed++) fuzz_one(seed);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  printf("lazy fuzz: %ld programs, %ld steps, 3 runs each, %.0f ms\n", fuzz_programs_run,
         fuzz_steps_run, ms);
  if (getenv("KILN_FUZZ_STATS"))
    for (int k = 0; k < K_COUNT; k++) printf("  %-16s %ld\n", KIND_NAME[k], fuzz_kind_count[k]);
}

/* --- directed tests --------------------------------------------------------------- */

#define S(...) ((const int64_t[]){__VA_ARGS__})

static void check_f32(kiln_tensor *t, const float *expect, int64_t n, const char *what) {
  if (!t) {
    KTEST_FAIL("%s is NULL: %s", what, kiln_last_error());
    return;
  }
  if (kiln_numel(t) != n || kiln_dtype_of(t) != KILN_F32) {
    KTEST_FAIL("%s: %lld elements of dtype %d, expected %lld f32", what, (long long)kiln_numel(t),
               (int)kiln_dtype_of(t), (long long)n);
    return;
  }
  float *got = malloc((size_t)n * sizeof(float));
  if (kiln_to_buffer(t, got, (size_t)n * sizeof(float)) < 0) {
    KTEST_FAIL("%s: kiln_to_buffer failed: %s", what, kiln_last_error());
  } else {
    for (int64_t i = 0; i < n; i++) {
      if (memcmp(&got[i], &expect[i], sizeof(float))) {
        KTEST_FAIL("%s[%lld] = %.9g, expected %.9g", what, (long long)i, got[i], expect[i]);
        break;
      }
    }
  }
  free(got);
}

/* a view of x taken before kiln_assign(x, y) keeps the old values, with no
   flush in between (x a leaf, and x a pending result) */
TEST(view_before_assign_keeps_old_value) {
  const float xv[6] = {1, 2, 3, 4, 5, 6}, yv[6] = {10, 20, 30, 40, 50, 60};
  kiln_tensor *x = kiln_from_data(xv, KILN_F32, 2, S(2, 3));
  kiln_tensor *y = kiln_from_data(yv, KILN_F32, 2, S(2, 3));
  kiln_tensor *tv = kiln_transpose(x, 0, 1);
  kiln_tensor *rv = kiln_slice(x, 1, -1, INT64_MIN, -1); /* columns reversed */
  kiln_tensor *before = kiln_mul_scalar(x, 2);
  CHECK_EQ_INT(kiln_assign(x, y), KILN_OK);
  check_f32(x, yv, 6, "x after assign");
  check_f32(tv, (const float[]){1, 4, 2, 5, 3, 6}, 6, "transpose view taken before");
  check_f32(rv, (const float[]){3, 2, 1, 6, 5, 4}, 6, "slice view taken before");
  check_f32(before, (const float[]){2, 4, 6, 8, 10, 12}, 6, "result computed before");
  kiln_release(tv);
  kiln_release(rv);
  kiln_release(before);

  /* x pending: x = leaf + 1; a view; assign a pending value; read the view
     first, then x, then a view taken after */
  kiln_tensor *leaf = kiln_from_data(xv, KILN_F32, 2, S(2, 3));
  kiln_tensor *xp = kiln_add_scalar(leaf, 1);
  kiln_tensor *v = kiln_slice(xp, 0, 1, 2, 1); /* row 1 */
  kiln_tensor *src = kiln_mul_scalar(y, 0.5);
  CHECK_EQ_INT(kiln_assign(xp, src), KILN_OK);
  kiln_tensor *after = kiln_slice(xp, 0, 1, 2, 1);
  check_f32(v, (const float[]){5, 6, 7}, 3, "view of pending x taken before assign");
  check_f32(xp, (const float[]){5, 10, 15, 20, 25, 30}, 6, "pending x after assign");
  check_f32(after, (const float[]){20, 25, 30}, 3, "view taken after assign");
  check_f32(leaf, xv, 6, "leaf x was computed from");

  /* assign a view of x to x (x = reversed x), then read an older view */
  kiln_tensor *z = kiln_from_data(xv, KILN_F32, 1, S(6));
  kiln_tensor *zold = kiln_slice(z, 0, 0, 3, 1);
  kiln_tensor *zrev = kiln_slice(z, 0, -1, INT64_MIN, -1);
  CHECK_EQ_INT(kiln_assign(z, zrev), KILN_OK);
  kiln_tensor *zsum = kiln_sum(z, 0, NULL, false);
  check_f32(z, (const float[]){6, 5, 4, 3, 2, 1}, 6, "x assigned its own reversal");
  check_f32(zold, (const float[]){1, 2, 3}, 3, "view of x before self-assign");
  CHECK(kiln_item(zsum) == 21.0);

  kiln_release(x);
  kiln_release(y);
  kiln_release(leaf);
  kiln_release(xp);
  kiln_release(v);
  kiln_release(src);
  kiln_release(after);
  kiln_release(z);
  kiln_release(zold);
  kiln_release(zrev);
  kiln_release(zsum);
}

/* a tensor computed from x before kiln_sub_scaled_(x, g, 0.1) keeps the old x */
TEST(sub_scaled_keeps_old_value_for_earlier_results) {
  const float xv[4] = {1, 2, 3, 4}, gv[4] = {0.5f, -1, 2, 10};
  kiln_tensor *x = kiln_from_data(xv, KILN_F32, 1, S(4));
  kiln_tensor *g = kiln_from_data(gv, KILN_F32, 1, S(4));
  kiln_tensor *t = kiln_mul_scalar(x, 3);       /* pending, uses old x */
  kiln_tensor *v = kiln_reshape(x, 2, S(2, 2)); /* view of old x */
  kiln_tensor *s = kiln_sum(x, 0, NULL, false); /* reduction of old x */
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, 0.1), KILN_OK);
  kiln_tensor *t2 = kiln_mul_scalar(x, 3); /* uses new x */
  CHECK_EQ_INT(kiln_sub_scaled_(x, g, 0.1), KILN_OK);

  float x1[4], x2[4], t2e[4];
  for (int i = 0; i < 4; i++) {
    volatile float step = gv[i] * 0.1f; /* Kiln: f32 * weak scalar, then f32 sub */
    x1[i] = xv[i] - step;
    x2[i] = x1[i] - step;
    t2e[i] = x1[i] * 3.0f;
  }
  check_f32(x, x2, 4, "x after two sub_scaled_");
  check_f32(t, (const float[]){3, 6, 9, 12}, 4, "x*3 computed before");
  check_f32(v, xv, 4, "view of x taken before");
  check_f32(t2, t2e, 4, "x*3 computed between the updates");
  CHECK(kiln_item(s) == 10.0);
  check_f32(g, gv, 4, "g");

  /* a pending x, updated by a pending gradient */
  kiln_tensor *leaf = kiln_from_data(xv, KILN_F32, 1, S(4));
  kiln_tensor *xp = kiln_add_scalar(leaf, 1);
  kiln_tensor *gp = kiln_mul_scalar(g, 2);
  kiln_tensor *early = kiln_neg(xp);
  CHECK_EQ_INT(kiln_sub_scaled_(xp, gp, 0.1), KILN_OK);
  float xe[4];
  for (int i = 0; i < 4; i++) {
    volatile float gg = gv[i] * 2.0f;
    volatile float step = gg * 0.1f;
    xe[i] = (xv[i] + 1.0f) - step;
  }
  check_f32(early, (const float[]){-2, -3, -4, -5}, 4, "neg(x) computed before");
  check_f32(xp, xe, 4, "pending x after sub_scaled_");

  kiln_release(x);
  kiln_release(g);
  kiln_release(t);
  kiln_release(v);
  kiln_release(s);
  kiln_release(t2);
  kiln_release(leaf);
  kiln_release(xp);
  kiln_release(gp);
  kiln_release(early);
}

/* reading a pending intermediate after its consumer was read */
TEST(pending_intermediate_read_after_consumer) {
  const float av[6] = {1, -2, 3, -4, 5, 0.5f};
  kiln_tensor *a = kiln_from_data(av, KILN_F32, 2, S(2, 3));
  kiln_tensor *b = kiln_mul_scalar(a, 2);
  kiln_tensor *c = kiln_add_scalar(b, 1);
  kiln_tensor *d = kiln_transpose(c, 0, 1);
  kiln_tensor *s = kiln_sum(d, 0, NULL, false);
  kiln_tensor *m = kiln_max(c, 1, (const int[]){1}, false);
  CHECK(kiln_item(s) == 13.0); /* 2*3.5 + 6 */
  check_f32(c, (const float[]){3, -3, 7, -7, 11, 2}, 6, "c = 2a+1, read after sum(c)");
  check_f32(b, (const float[]){2, -4, 6, -8, 10, 1}, 6, "b = 2a, read after sum(c)");
  check_f32(m, (const float[]){7, 11}, 2, "max(c, 1), read after sum(c)");
  check_f32(d, (const float[]){3, -7, -3, 11, 7, 2}, 6, "transpose(c), read last");

  /* the intermediate's handle chain: only the deepest value is read first */
  kiln_tensor *e = kiln_exp(a);
  kiln_tensor *f = kiln_log(e);
  kiln_tensor *h = kiln_sum(f, 0, NULL, false);
  double hv = kiln_item(h);
  CHECK_CLOSE(hv, 3.5, 1e-6);
  double *ev = ktest_values(e);
  for (int i = 0; i < 6; i++) CHECK_CLOSE(ev[i], exp((double)av[i]), 1e-6);
  free(ev);
  kiln_tensor *e2 = kiln_exp(a); /* the same value computed again, read alone */
  size_t n1 = 0, n2 = 0;
  unsigned char *x1 = read_bytes(e, &n1), *x2 = read_bytes(e2, &n2);
  CHECK(x1 && x2 && n1 == n2 && !memcmp(x1, x2, n1));
  free(x1);
  free(x2);

  kiln_release(a);
  kiln_release(b);
  kiln_release(c);
  kiln_release(d);
  kiln_release(s);
  kiln_release(m);
  kiln_release(e);
  kiln_release(f);
  kiln_release(h);
  kiln_release(e2);
}

/* x = x*0.99 + 0.01, 10000 times with no read in between, equals the same
   float ops done in C one rounding at a time (no fused multiply-add) */
TEST(long_chain_matches_float_reference) {
  enum { STEPS = 10000, N = 6 };
  const float init[N] = {0.0f, 1.0f, -3.5f, 100.0f, 1e-3f, -1e6f};
  kiln_tensor *x = kiln_from_data(init, KILN_F32, 1, S(N));
  for (int i = 0; i < STEPS && x; i++) {
    kiln_tensor *y = kiln_mul_scalar(x, 0.99);
    kiln_tensor *z = kiln_add_scalar(y, 0.01);
    kiln_release(x);
    kiln_release(y);
    x = z;
  }
  float ref[N];
  for (int k = 0; k < N; k++) {
    float v = init[k];
    for (int i = 0; i < STEPS; i++) {
      volatile float p = v * 0.99f;
      v = p + 0.01f;
    }
    ref[k] = v;
  }
  check_f32(x, ref, N, "f32 chain");
  kiln_release(x);

  /* the same in f64, through kiln_assign each step (a store chain) */
  const double init64[3] = {2.0, -7.25, 0.125};
  kiln_tensor *w = kiln_from_data(init64, KILN_F64, 1, S(3));
  kiln_tensor *first = kiln_slice(w, 0, 0, 1, 1); /* view of the initial value */
  for (int i = 0; i < STEPS; i++) {
    kiln_tensor *y = kiln_mul_scalar(w, 0.99);
    kiln_tensor *z = kiln_add_scalar(y, 0.01);
    CHECK(kiln_assign(w, z) == KILN_OK);
    kiln_release(y);
    kiln_release(z);
  }
  double got[3], want[3];
  for (int k = 0; k < 3; k++) {
    double v = init64[k];
    for (int i = 0; i < STEPS; i++) {
      volatile double p = v * 0.99;
      v = p + 0.01;
    }
    want[k] = v;
  }
  CHECK_EQ_INT(kiln_to_buffer(w, got, sizeof got), KILN_OK);
  for (int k = 0; k < 3; k++)
    if (memcmp(&got[k], &want[k], sizeof(double)))
      KTEST_FAIL("f64 assign chain [%d] = %.17g, expected %.17g", k, got[k], want[k]);
  CHECK(kiln_item(first) == 2.0);
  kiln_release(w);
  kiln_release(first);
}

int main(void) {
  /* lazy vs synced, bit for bit on the interpreter: compiled kernels may
     round differently (their math library is documented in ulps) */
  setenv("KILN_JIT", "0", 1);
  RUN(view_before_assign_keeps_old_value);
  RUN(sub_scaled_keeps_old_value_for_earlier_results);
  RUN(pending_intermediate_read_after_consumer);
  RUN(long_chain_matches_float_reference);
  RUN(lazy_fuzz);
  return ktest_done();
}
