/* emulated_ops.c — the GPU interpreter's generated kernels (jit_gpu/opgen)
 * run on the CPU under emu.hpp's emulation of CUDA's execution model
 * (threads as coroutines, block and warp barriers, shuffles), against the
 * CPU interpreter (vm_exec): every elementwise op x dtype x layout class,
 * casts, reductions (every path: warp folds, two passes), index ops with
 * their range checks, concat, argsort, integer matmul, leaves and the
 * Philox streams.  Bit for bit, except f32/f64 transcendentals (CUDA's math
 * functions: 4 ulps f32, 1e-12 relative f64) and NaN payloads.  This is
 * what can be proven of the kernels without a GPU; test_gpu_ops checks the
 * same on one.  Special values include NaN, +-inf, -0 and huge numbers,
 * except for f32 sin/cos: the CPU's own f32 sin/cos lose accuracy past
 * |x| ~ 1e8 (a known limit of jit_cpu/math.c's range reduction). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit_cpu/jit.h"
#include "jit_gpu/opgen.h"
#include "vm/backend.h"
#include "vm/fold.h"
#include "vm/interp.h"
#include "vm/state.h"
int emu_launch(const char *name, const void *args, unsigned grid, unsigned block);

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static int fails, checks;
#define S(...) ((const int64_t[]){__VA_ARGS__})

static int special = 1; /* include NaN, inf, -0 */
static int no_huge;     /* specials stay below 1e6 (f32 sin/cos: see above) */
static double lo_v = -4, hi_v = 4;

static void fill(vm_tensor *t) { /* t contiguous fresh */
  for (int64_t i = 0; i < t->numel; i++) {
    double v = lo_v + (hi_v - lo_v) * unif();
    switch (t->dtype) {
      case KILN_BOOL:
        ((unsigned char *)vm_data(t))[i] = rnd() & 1;
        break;
      case KILN_I32:
        ((int32_t *)vm_data(t))[i] = (int32_t)floor(v);
        break;
      case KILN_I64:
        ((int64_t *)vm_data(t))[i] = (int64_t)floor(v);
        break;
      case KILN_U8:
      case KILN_I8:
      case KILN_I16: /* every bit pattern (wrapping), or a small value */
        if (rnd() % 2)
          vm_store_f64(vm_data(t), t->dtype, i, floor(v));
        else if (t->dtype == KILN_I16)
          ((uint16_t *)vm_data(t))[i] = (uint16_t)rnd();
        else
          ((uint8_t *)vm_data(t))[i] = (uint8_t)rnd();
        break;
      case KILN_BF16:
      case KILN_F16:
        if (special && !no_huge && rnd() % 31 == 0) { /* any pattern: subnormals, signaling NaNs */
          ((uint16_t *)vm_data(t))[i] = (uint16_t)rnd();
          break;
        }
        __attribute__((fallthrough)); /* a float value, rounded */
      case KILN_F32:
      case KILN_F64: {
        if (special && rnd() % 23 == 0) {
          double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 1e30, -1e30, 3e9, -3e9, 1e20};
          v = sp[rnd() % 10];
          if (no_huge && fabs(v) > 1e6 && !isinf(v)) v = copysign(1e6, v);
        } else if (rnd() % 5 == 0)
          v = floor(v) + (rnd() % 2) * 0.5; /* ties, halves */
        vm_store_f64(vm_data(t), t->dtype, i, v);
      }
    }
  }
}
/* layout: 0 contiguous, 1 transposed (last two dims), 2 every other element of a bigger base */
static vm_tensor *make(kiln_dtype dt, int nd, const int64_t *shape, int layout) {
  if (layout == 0 || nd < 1) {
    vm_tensor *t = vm_tensor_new(dt, nd, shape);
    fill(t);
    return t;
  }
  if (layout == 1 && nd >= 2) {
    int64_t bs[8];
    memcpy(bs, shape, nd * 8);
    bs[nd - 1] = shape[nd - 2];
    bs[nd - 2] = shape[nd - 1];
    vm_tensor *b = vm_tensor_new(dt, nd, bs);
    fill(b);
    int64_t st[8];
    memcpy(st, b->strides, nd * 8);
    st[nd - 1] = b->strides[nd - 2];
    st[nd - 2] = b->strides[nd - 1];
    vm_tensor *v = vm_tensor_view(b, nd, shape, st, 0);
    vm_release(b);
    return v;
  }
  int64_t bs[8];
  memcpy(bs, shape, nd * 8);
  bs[nd - 1] = shape[nd - 1] * 2 + 1;
  vm_tensor *b = vm_tensor_new(dt, nd, bs);
  fill(b);
  int64_t st[8];
  memcpy(st, b->strides, nd * 8);
  st[nd - 1] = 2;
  vm_tensor *v = vm_tensor_view(b, nd, shape, st, 1);
  vm_release(b);
  return v;
}

static int strict; /* NaNs must match bit for bit too */

/* distance in representable values between two halves' bit patterns */
static int ulps_half(uint16_t a, uint16_t b) {
  int x = a & 0x8000 ? -(a & 0x7fff) : a, y = b & 0x8000 ? -(b & 0x7fff) : b;
  return x > y ? x - y : y - x;
}

static int ulps_f32(float a, float b) {
  int32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  if (x < 0) x = INT32_MIN - x;
  if (y < 0) y = INT32_MIN - y;
  long d = (long)x - y;
  return d < 0 ? (int)-d : (int)d;
}

/* runs op on the CPU and in the emulator; compares bitwise, or within
   tol ulps (f32) / rel (f64) */
static void run(const char *what, vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                int tol) {
  static const vm_attr none;
  if (!attr) attr = &none;
  vm_meta m;
  checks++;
  vm_clear_error();
  if (!vm_infer(op, n, in, attr, &m)) {
    printf("%s: infer failed: %s\n", what, vm_thread()->message);
    fails++;
    return;
  }
  vm_tensor *ref = vm_exec(op, n, in, attr, &m);
  char cpu_err[512] = "";
  if (!ref) snprintf(cpu_err, sizeof cpu_err, "%s", vm_thread()->message);
  vm_clear_error();
  vm_tensor *out = vm_tensor_new(m.dtype, m.ndim, m.shape);
  if (out->numel == 0) {
    vm_release(out);
    vm_release(ref);
    return;
  }
  memset(vm_data(out), 0x5a, out->numel * vm_dtype_size(out->dtype));
  gpu_op_plan p;
  if (!gpu_op_plan_make(op, n, in, out, attr, &p)) {
    printf("%s: plan failed: %s\n", what, vm_thread()->message);
    fails++;
    return;
  }
  char *scratch = p.scratch_bytes ? malloc(p.scratch_bytes) : NULL;
  if (scratch) memset(scratch, 0xab, p.scratch_bytes);
  gpu_index_check rec = {0}; /* the thread's record, as jit_gpu/cuda.c makes it */
  for (int i = 0; i < p.nlaunch; i++) {
    gpu_launch l = p.launch[i];
    for (int k = 0; k < 4; k++)
      if (l.check_mask >> k & 1) l.args.ptr[k] = &rec;
    for (int k = 0; k < 4; k++)
      if (l.scratch_mask >> k & 1) {
        if ((uintptr_t)l.args.ptr[k] >= p.scratch_bytes) {
          printf("%s: bad scratch offset\n", what);
          fails++;
        }
        l.args.ptr[k] = scratch + (uintptr_t)l.args.ptr[k];
      }
    char name[128];
    gpu_op_key_name(&l.key, name, sizeof name);
    if (!emu_launch(name, &l.args, l.grid[0], l.block[0])) {
      printf("%s: launch %s failed\n", what, name);
      fails++;
    }
  }
  bool gpu_ok = true;
  if (gpu_op_checks_indices(op)) {
    vm_set_api(NULL);
    gpu_ok = gpu_index_check_report(&rec);
    if (rec.done != 0) {
      printf("%s: the check left done = %u, not 0\n", what, rec.done);
      fails++;
    }
  }
  char gpu_err[512] = "";
  if (!gpu_ok) snprintf(gpu_err, sizeof gpu_err, "%s", vm_thread()->message);
  vm_clear_error();
  if (!ref || !gpu_ok) {
    const char *ce = strstr(cpu_err, ": "), *ge = strstr(gpu_err, ": ");
    if (ref || gpu_ok || !ce || !ge || strcmp(ce, ge)) {
      printf("%s: cpu error '%s' vs gpu error '%s'\n", what, cpu_err, gpu_err);
      fails++;
    }
  } else {
    size_t es = vm_dtype_size(m.dtype);
    int bad = 0;
    for (int64_t i = 0; i < out->numel && bad < 3; i++) {
      const char *g = (const char *)vm_data(out) + i * es, *c = (const char *)vm_data(ref) + i * es;
      if (!memcmp(g, c, es)) continue;
      if (!strict && (m.dtype == KILN_F32 || m.dtype == KILN_F64)) {
        double x = vm_load_f64(vm_data(out), m.dtype, i), y = vm_load_f64(vm_data(ref), m.dtype, i);
        if (isnan(x) && isnan(y)) continue;
      }
      if (tol && vm_dtype_is_half(m.dtype)) { /* CUDA's f32 math, rounded: one half ulp */
        uint16_t a, b;
        memcpy(&a, g, 2);
        memcpy(&b, c, 2);
        double x = vm_load_f64(g, m.dtype, 0), y = vm_load_f64(c, m.dtype, 0);
        if ((isnan(x) && isnan(y)) || ulps_half(a, b) <= 1) continue;
      }
      if (tol && m.dtype == KILN_F32) {
        float a, b;
        memcpy(&a, g, 4);
        memcpy(&b, c, 4);
        if ((isnan(a) && isnan(b)) || ulps_f32(a, b) <= tol) continue;
      }
      if (tol && m.dtype == KILN_F64) {
        double a, b;
        memcpy(&a, g, 8);
        memcpy(&b, c, 8);
        if ((isnan(a) && isnan(b)) || fabs(a - b) <= 1e-12 * fabs(b)) continue;
      }
      double gv = vm_load_f64(vm_data(out), m.dtype, i), cv = vm_load_f64(vm_data(ref), m.dtype, i);
      printf("%s: [%lld] gpu %.17g cpu %.17g\n", what, (long long)i, gv, cv);
      bad++;
    }
    if (bad) fails++;
  }
  free(scratch);
  gpu_op_plan_free(&p);
  vm_release(out);
  vm_release(ref);
}

static const char *dn(kiln_dtype d) {
  static const char *n[] = {"b8", "i32", "i64", "f32", "f64", "bf16", "f16", "u8", "i8", "i16"};
  return n[d];
}
static bool transcendental(vm_opcode op) {
  switch (op) {
    case VM_OP_exp:
    case VM_OP_log:
    case VM_OP_sin:
    case VM_OP_cos:
    case VM_OP_tanh:
    case VM_OP_sigmoid:
    case VM_OP_erf:
    case VM_OP_log1p:
    case VM_OP_expm1:
    case VM_OP_pow:
      return true;
    default:
      return false;
  }
}

static void elementwise(void) {
  char what[256];
  for (int op = 0; op < VM_OP_COUNT; op++) {
    vm_kind kind = vm_op_table[op].kind;
    if (kind != VM_KIND_UNARY && kind != VM_KIND_BINARY && kind != VM_KIND_TERNARY) continue;
    for (int dt = 0; dt < VM_NUM_DTYPES; dt++) {
      for (int lay = 0; lay < 4; lay++) {
        vm_tensor *in[3] = {0};
        int n = kind == VM_KIND_UNARY ? 1 : kind == VM_KIND_BINARY ? 2 : 3;
        gpu_op_key probe = {
            .op = op, .nin = n, .out_dtype = dt, .in_dtype = {dt, dt, dt}, .contiguous = 1};
        if (op == VM_OP_cast) continue;
        if (kind == VM_KIND_TERNARY) probe.in_dtype[0] = KILN_BOOL;
        vm_dtype_rule r = vm_op_table[op].rule;
        if (r == VM_DT_COMPARE || r == VM_DT_LOGICAL) probe.out_dtype = KILN_BOOL;
        if (!gpu_op_key_supported(&probe)) continue;
        const int64_t *sh = S(7, 45);
        no_huge = (dt == KILN_F32 || vm_dtype_is_half(dt)) && (op == VM_OP_sin || op == VM_OP_cos);
        for (int i = 0; i < n; i++) {
          kiln_dtype d = (kind == VM_KIND_TERNARY && i == 0) ? KILN_BOOL : dt;
          if (lay == 3 && i == 1)
            in[i] = make(d, 1, S(45), 0); /* broadcast row */
          else if (lay == 3 && i == 2)
            in[i] = make(d, 0, NULL, 0); /* scalar */
          else
            in[i] = make(d, 2, sh, lay == 3 ? 0 : lay);
        }
        if (op == VM_OP_pow && !vm_dtype_is_float(dt)) {
          lo_v = -3;
          hi_v = 9;
        }
        snprintf(what, sizeof what, "%s %s layout %d", vm_op_table[op].name, dn(dt), lay);
        run(what, op, n, in, NULL, transcendental(op) ? 4 : (op == VM_OP_sigmoid ? 4 : 0));
        lo_v = -4;
        hi_v = 4;
        no_huge = 0;
        for (int i = 0; i < n; i++) vm_release(in[i]);
      }
    }
  }
  /* casts, with huge values */
  for (int from = 0; from < VM_NUM_DTYPES; from++)
    for (int to = 0; to < VM_NUM_DTYPES; to++)
      for (int lay = 0; lay < 3; lay++) {
        lo_v = -5e9;
        hi_v = 5e9;
        vm_tensor *a = make(from, 2, S(9, 33), lay);
        lo_v = -4;
        hi_v = 4;
        vm_attr at = {.dtype = to};
        snprintf(what, sizeof what, "cast %s->%s layout %d", dn(from), dn(to), lay);
        run(what, VM_OP_cast, 1, &a, &at, 0);
        vm_release(a);
      }
}

static void reductions(void) {
  char what[256];
  struct {
    int nd;
    int64_t shape[4];
    uint32_t mask;
  } cases[] = {
      {2, {5, 300}, 2},    {2, {5, 300}, 1},  {2, {5, 300}, 3},  {3, {3, 4, 5}, 2},
      {3, {3, 4, 5}, 5},   {3, {3, 4, 5}, 6}, {1, {200001}, 1},  {2, {70001, 3}, 1},
      {2, {3, 70001}, 2},  {2, {9000, 5}, 1}, {2, {2, 4097}, 2}, {2, {4, 0}, 2},
      {3, {2, 1, 130}, 6}, {2, {1, 1}, 3},    {2, {6, 7}, 0},    {3, {2, 3000, 30}, 5},
      {1, {63}, 1},        {1, {65}, 1},
  };
  for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++)
    for (int op = VM_OP_sum; op <= VM_OP_argmin; op++)
      for (int dt = 0; dt < VM_NUM_DTYPES; dt++)
        for (int lay = 0; lay < 3; lay++) {
          bool arg = op == VM_OP_argmax || op == VM_OP_argmin;
          if (vm_dtype_is_half(dt)) continue; /* front/op.c folds halves in f32 */
          if (arg && __builtin_popcount(cases[c].mask) != 1) continue;
          if ((op == VM_OP_sum || op == VM_OP_prod) && dt != KILN_I64 && dt != KILN_F32 &&
              dt != KILN_F64)
            continue;
          int64_t total = 1;
          for (int d = 0; d < cases[c].nd; d++) total *= cases[c].shape[d];
          if (total > 50000 && lay != 0) continue;
          if ((op == VM_OP_max || op == VM_OP_min || arg) && total == 0) continue;
          if (op == VM_OP_prod) {
            lo_v = 0.5;
            hi_v = 1.6;
          }
          special = op != VM_OP_sum && op != VM_OP_prod;
          vm_tensor *a = make(dt, cases[c].nd, cases[c].shape, lay);
          lo_v = -4;
          hi_v = 4;
          special = 1;
          vm_attr at = {.axes_mask = cases[c].mask, .keepdim = c % 2};
          snprintf(what, sizeof what, "%s %s case %d layout %d", vm_op_table[op].name, dn(dt), c,
                   lay);
          run(what, op, 1, &a, &at, 0);
          vm_release(a);
        }
}

static vm_tensor *index_tensor(int nd, const int64_t *shape, int64_t size, int bad) {
  vm_tensor *t = vm_tensor_new(KILN_I64, nd, shape);
  for (int64_t i = 0; i < t->numel; i++)
    ((int64_t *)vm_data(t))[i] = (int64_t)(rnd() % (uint64_t)size);
  if (bad && t->numel)
    ((int64_t *)vm_data(t))[t->numel / 2 + 1 < t->numel ? t->numel / 2 + 1 : 0] =
        bad > 0 ? size + 3 : -1;
  if (bad && t->numel > 3) ((int64_t *)vm_data(t))[t->numel - 1] = size + 100;
  return t;
}

static void indexing(void) {
  char what[256];
  for (int dt = 0; dt < VM_NUM_DTYPES; dt++)
    for (int bad = -1; bad <= 1; bad++)
      for (int lay = 0; lay < 3; lay++) {
        vm_tensor *a = make(dt, 3, S(4, 6, 5), lay);
        for (int axis = 0; axis < 3; axis++) {
          vm_tensor *idx = index_tensor(1, S(7), a->shape[axis], bad);
          vm_attr at = {.axis = axis};
          snprintf(what, sizeof what, "index_select %s axis %d bad %d layout %d", dn(dt), axis, bad,
                   lay);
          run(what, VM_OP_index_select, 2, (vm_tensor *[]){a, idx}, &at, 0);
          vm_release(idx);
          int64_t gs[3] = {3, 4, 4};
          gs[axis] = 9;
          idx = index_tensor(3, gs, a->shape[axis], bad);
          snprintf(what, sizeof what, "gather %s axis %d bad %d layout %d", dn(dt), axis, bad, lay);
          run(what, VM_OP_gather, 2, (vm_tensor *[]){a, idx}, &at, 0);
          if (vm_dtype_is_half(dt)) { /* a half's scatter_add runs in f32 (front/op.c) */
            vm_release(idx);
            continue;
          }
          vm_tensor *src = make(dt, 3, gs, lay);
          snprintf(what, sizeof what, "scatter_add %s axis %d bad %d layout %d", dn(dt), axis, bad,
                   lay);
          run(what, VM_OP_scatter_add, 3, (vm_tensor *[]){a, idx, src}, &at, 0);
          vm_release(src);
          vm_release(idx);
          /* the index expanded from 1-d (index_select's VJP) */
          vm_tensor *i1 = index_tensor(1, S(8), a->shape[axis], bad);
          int64_t es[3] = {4, 6, 5}, st[3] = {0, 0, 0};
          es[axis] = 8;
          st[axis] = 1;
          vm_tensor *ie = vm_tensor_view(i1, 3, es, st, 0);
          src = make(dt, 3, es, 0);
          snprintf(what, sizeof what, "scatter_add expanded %s axis %d bad %d layout %d", dn(dt),
                   axis, bad, lay);
          run(what, VM_OP_scatter_add, 3, (vm_tensor *[]){a, ie, src}, &at, 0);
          vm_release(src);
          vm_release(ie);
          vm_release(i1);
        }
        vm_release(a);
      }
}

/* runs the index check of op's plan over idx into rec */
static void check_into(vm_opcode op, vm_tensor *a, vm_tensor *idx, gpu_index_check *rec, int seq) {
  vm_attr at = {.axis = 1};
  vm_meta m;
  if (!vm_infer(op, 2, (vm_tensor *[]){a, idx}, &at, &m)) {
    printf("sealed: infer failed\n");
    fails++;
    return;
  }
  vm_tensor *out = vm_tensor_new(m.dtype, m.ndim, m.shape);
  gpu_op_plan p;
  if (!gpu_op_plan_make(op, 2, (vm_tensor *[]){a, idx}, out, &at, &p)) {
    printf("sealed: plan failed\n");
    fails++;
    return;
  }
  gpu_launch l = p.launch[0];
  if (l.check_mask != 1) {
    printf("sealed: launch 0 is not the check\n");
    fails++;
  }
  l.args.ptr[0] = rec;
  l.args.extent[1] = seq; /* the runner's number for the op */
  char name[128];
  gpu_op_key_name(&l.key, name, sizeof name);
  if (!emu_launch(name, &l.args, l.grid[0], l.block[0])) {
    printf("sealed: launch %s failed\n", name);
    fails++;
  }
  gpu_op_plan_free(&p);
  vm_release(out);
}

/* the thread's record keeps the first bad index in stream order until the
   host reads and clears it; a check of good indices leaves it clear */
static void sealed_record(void) {
  checks++;
  vm_tensor *a = make(KILN_F32, 3, S(4, 6, 5), 0);
  vm_tensor *bad_hi = index_tensor(3, S(4, 9, 5), 6, 1), *bad_lo = index_tensor(1, S(7), 6, -1);
  vm_tensor *good = index_tensor(3, S(4, 9, 5), 6, 0);
  gpu_index_check rec = {0};
  check_into(VM_OP_gather, a, good, &rec, 1);
  bool ok = !rec.sealed && rec.first == 0 && rec.done == 0;
  check_into(VM_OP_gather, a, bad_hi, &rec, 2); /* first bad: 9 at position 91 */
  ok = ok && rec.sealed && rec.value == 9 && rec.size == 6 && rec.axis == 1 && ~rec.first == 91 &&
       rec.done == 0 && rec.op == 2;
  check_into(VM_OP_index_select, a, bad_lo, &rec, 3); /* -1: later, so not recorded */
  ok = ok && rec.sealed && rec.value == 9 && ~rec.first == 91 && rec.op == 2;
  vm_set_api(NULL);
  ok = ok && !gpu_index_check_report(&rec) &&
       strstr(vm_thread()->message, "index 9 is out of range for axis 1 of size 6");
  vm_clear_error();
  memset(&rec, 0, sizeof rec); /* what the host does after reporting it */
  check_into(VM_OP_index_select, a, bad_lo, &rec, 4);
  ok = ok && rec.sealed && rec.value == -1 && rec.op == 4;
  if (!ok) {
    printf("sealed record: sealed %u value %lld first ~%llu done %u op %u\n", rec.sealed,
           (long long)rec.value, (unsigned long long)~rec.first, rec.done, rec.op);
    fails++;
  }
  vm_release(a);
  vm_release(bad_hi);
  vm_release(bad_lo);
  vm_release(good);
}

static void others(void) {
  char what[256];
  /* concat */
  for (int dt = 0; dt < VM_NUM_DTYPES; dt++)
    for (int axis = 0; axis < 2; axis++) {
      int64_t s1[2] = {3, 4}, s2[2] = {3, 4}, s3[2] = {3, 4};
      s1[axis] = 2;
      s2[axis] = 0;
      s3[axis] = 5;
      vm_tensor *a = make(dt, 2, s1, 1), *b = make(dt, 2, s2, 0), *c = make(dt, 2, s3, 2),
                *d = make(dt, 2, S(3, 4), 0);
      snprintf(what, sizeof what, "concat %s axis %d", dn(dt), axis);
      run(what, VM_OP_concat, 4, (vm_tensor *[]){a, b, c, d}, &(vm_attr){.axis = axis}, 0);
      vm_release(a);
      vm_release(b);
      vm_release(c);
      vm_release(d);
    }
  /* argsort */
  struct {
    int nd;
    int64_t shape[3];
    int axis;
  } sc[] = {
      {2, {5, 37}, 1}, {2, {300, 3}, 0}, {3, {2, 1500, 2}, 1}, {1, {1}, 0}, {3, {3, 4, 70}, 2}};
  for (int c = 0; c < 5; c++)
    for (int dt = 0; dt < VM_NUM_DTYPES; dt++)
      for (int desc = 0; desc < 2; desc++)
        for (int lay = 0; lay < 3 && !vm_dtype_is_half(dt); lay++) {
          lo_v = -3;
          hi_v = 3;
          vm_tensor *a = make(dt, sc[c].nd, sc[c].shape, lay);
          lo_v = -4;
          hi_v = 4;
          snprintf(what, sizeof what, "argsort %s case %d desc %d layout %d", dn(dt), c, desc, lay);
          run(what, VM_OP_argsort, 1, &a, &(vm_attr){.axis = sc[c].axis, .keepdim = desc}, 0);
          vm_release(a);
        }
  /* integer matmul */
  struct {
    int na;
    int64_t sa[3];
    int nb;
    int64_t sb[3];
  } mc[] = {{2, {3, 4}, 2, {4, 5}}, {3, {2, 3, 4}, 2, {4, 5}}, {1, {4}, 2, {4, 5}},
            {2, {3, 4}, 1, {4}},    {1, {4}, 1, {4}},          {3, {2, 3, 4}, 3, {1, 4, 2}},
            {2, {3, 0}, 2, {0, 2}}};
  for (int c = 0; c < 7; c++)
    for (int dt = 1; dt < 3; dt++)
      for (int lay = 0; lay < 3; lay++) {
        lo_v = -1e9;
        hi_v = 1e9;
        vm_tensor *a = make(dt, mc[c].na, mc[c].sa, lay),
                  *b = make(dt, mc[c].nb, mc[c].sb, (lay + 1) % 3);
        lo_v = -4;
        hi_v = 4;
        snprintf(what, sizeof what, "matmul %s case %d layout %d", dn(dt), c, lay);
        run(what, VM_OP_matmul, 2, (vm_tensor *[]){a, b}, NULL, 0);
        vm_release(a);
        vm_release(b);
      }
  /* leaves */
  double vals[] = {2.5,  -0.0,         NAN,           1e19,     -1e19, 3e9,
                   -3e9, 2147483647.5, -2147483648.7, INFINITY, 0.5,   -7.25};
  for (int dt = 0; dt < VM_NUM_DTYPES; dt++)
    for (int v = 0; v < 12; v++) {
      vm_attr at = {.dtype = dt, .ndim = 1, .shape = {37}, .scalar = {vals[v], vals[(v + 5) % 12]}};
      snprintf(what, sizeof what, "full %s %g", dn(dt), vals[v]);
      run(what, VM_OP_full, 0, NULL, &at, 0);
      at.scalar[1] = v % 2 ? 0.1 : -3.0;
      snprintf(what, sizeof what, "arange %s %g", dn(dt), vals[v]);
      run(what, VM_OP_arange, 0, NULL, &at, 0);
    }
  for (int dt = KILN_F32; dt <= KILN_F16; dt++)
    for (int normal = 0; normal < 2; normal++)
      for (int len = 1; len < 2000; len = len * 3 + 1) {
        vm_attr at = {.dtype = dt,
                      .ndim = 1,
                      .shape = {len},
                      .seed = 0x123456789abcdefull * len,
                      .counter = 77ull << 33};
        snprintf(what, sizeof what, "%s %s %d", normal ? "randn" : "rand", dn(dt), len);
        run(what, normal ? VM_OP_randn : VM_OP_rand, 0, NULL, &at, normal ? 4 : 0);
      }
}

/* The GPU's conversions are vm/half.h's, bit for bit, NaN payloads
   included: every 16-bit pattern of both halves widened (to f32, to f64)
   and copied (a copy quiets a signaling NaN, as the CPU's), and f32
   patterns at every exponent and high significand with the low bits at
   and around each half's rounding ties, plus random doubles, narrowed */
static void half_conversions(void) {
  strict = 1;
  static const uint32_t lows[] = {0, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xffff, 1};
  enum { NLOW = sizeof lows / sizeof lows[0] + 1 };
  vm_tensor *f = vm_tensor_new(KILN_F32, 1, S(65536 * NLOW));
  uint32_t *fb = vm_data(f);
  for (int64_t i = 0; i < 65536; i++)
    for (int j = 0; j < NLOW; j++)
      fb[i * NLOW + j] = (uint32_t)i << 16 | (j < NLOW - 1 ? lows[j] : (uint32_t)rnd() & 0xffff);
  vm_tensor *d = vm_tensor_new(KILN_F64, 1, S(20000));
  for (int64_t i = 0; i < 20000; i++) {
    uint64_t u = rnd();
    if (i % 2) u = (u & 0x800fffffffffffffull) | (uint64_t)(0x3e0 + rnd() % 0x40) << 52;
    memcpy((double *)vm_data(d) + i, &u, 8);
  }
  char what[128];
  for (int h = KILN_BF16; h <= KILN_F16; h++) {
    vm_tensor *all = vm_tensor_new(h, 1, S(65536));
    for (int i = 0; i < 65536; i++) ((uint16_t *)vm_data(all))[i] = (uint16_t)i;
    for (int to = KILN_F32; to <= KILN_F16; to++) {
      snprintf(what, sizeof what, "every %s pattern to %s", dn(h), dn(to));
      run(what, VM_OP_cast, 1, &all, &(vm_attr){.dtype = to}, 0);
    }
    snprintf(what, sizeof what, "f32 patterns to %s", dn(h));
    run(what, VM_OP_cast, 1, &f, &(vm_attr){.dtype = h}, 0);
    snprintf(what, sizeof what, "f64 values to %s", dn(h));
    run(what, VM_OP_cast, 1, &d, &(vm_attr){.dtype = h}, 0);
    vm_release(all);
  }
  vm_release(f);
  vm_release(d);
  strict = 0;
}

static void big(void) {
  vm_tensor *a = make(KILN_F32, 1, S((1 << 21) + 777), 0),
            *b = make(KILN_F32, 1, S((1 << 21) + 777), 0);
  run("big add", VM_OP_add, 2, (vm_tensor *[]){a, b}, NULL, 0);
  vm_release(a);
  vm_release(b);
  vm_tensor *c = make(KILN_F64, 2, S(70000, 3), 0);
  run("many argmax", VM_OP_argmax, 1, &c, &(vm_attr){.axes_mask = 2}, 0);
  run("many sums", VM_OP_sum, 1, &c, &(vm_attr){.axes_mask = 2}, 0);
  run("many col sums", VM_OP_sum, 1, &c, &(vm_attr){.axes_mask = 1}, 0);
  run("many sorts", VM_OP_argsort, 1, &c, &(vm_attr){.axis = 1}, 0);
  vm_release(c);
  vm_tensor *d = make(KILN_F32, 2, S(3, 300000), 1);
  run("long argmin", VM_OP_argmin, 1, &d, &(vm_attr){.axes_mask = 2}, 0);
  run("long prod", VM_OP_max, 1, &d, &(vm_attr){.axes_mask = 2}, 0);
  vm_release(d);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : "";
  /* the reference is the CPU interpreter, called directly: its backend is
     registered here, as the binding does for programs of the public API */
  vm_backend_register(&cpu_backend);
  if (!*only || strstr(only, "e")) elementwise();
  if (!*only || strstr(only, "r")) reductions();
  if (!*only || strstr(only, "i")) indexing();
  if (!*only || strstr(only, "i")) sealed_record();
  if (!*only || strstr(only, "o")) others();
  if (!*only || strstr(only, "h")) half_conversions();
  if (strstr(only, "b")) big();
  printf("%d checks, %d failed\n", checks, fails);
  return fails != 0;
}
