/* opgen_src.c — the CUDA C of the GPU interpreter's kernels (DESIGN §6):
 * one extern "C" __global__ entry per gpu_op_key, generated from per-op
 * expression tables, after a prelude that defines gpu_args (with
 * static_asserts of its host layout) and the device helpers.  Semantics are
 * the CPU interpreter's (vm/kern_*.c), bit for bit where IEEE fixes the
 * result; f32/f64 transcendentals are CUDA's and differ by a few ulps.
 * What each family reads from gpu_args: opgen.c.  No #includes; no fast math
 * (nvrtc.c also turns off fma contraction). */
#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/fold.h"
#include "../vm/state.h"
#include "opgen.h"
#include "src.h"

/* --- a growing string (src.h) ------------------------------------------------- */

typedef gpu_src sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void gpu_src_printf(gpu_src *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    sb_put(b, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb_put(b, big, (size_t)n);
  free(big);
}

/* tmpl with each $NAME replaced by its value in vars ({"NAME", value, ...,
   NULL}), itself substituted; names are [A-Z0-9_]+ */
static void sb_subst(sbuf *b, const char *tmpl, const char *const *vars) {
  while (*tmpl) {
    const char *d = strchr(tmpl, '$');
    if (!d) {
      sb_put(b, tmpl, strlen(tmpl));
      return;
    }
    sb_put(b, tmpl, (size_t)(d - tmpl));
    const char *e = d + 1;
    while ((*e >= 'A' && *e <= 'Z') || (*e >= '0' && *e <= '9') || *e == '_') e++;
    size_t n = (size_t)(e - d - 1);
    const char *val = NULL;
    for (int i = 0; vars[i]; i += 2)
      if (strlen(vars[i]) == n && !memcmp(vars[i], d + 1, n)) val = vars[i + 1];
    assert(val && "a template names an unknown variable");
    if (val && strchr(val, '$'))
      sb_subst(b, val, vars); /* values may name variables too */
    else if (val)
      sb_put(b, val, strlen(val));
    tmpl = e;
  }
}

/* --- dtypes -------------------------------------------------------------------- */

/* ctype: how a value of the dtype is stored (and held in a fused kernel's
   registers): the halves are kbf16 / kf16 (the prelude), 16 bits that
   convert to float and back by vm/half.h's rules.  comp: the type ops
   compute it in (float for the halves: a half op is its f32 op on the
   widened values, rounded once on store, as the CPU's).  utype: the
   unsigned type integer arithmetic wraps in (u32 for the narrow integers,
   whose operands C++ promotes: a u16 product could overflow int). */
static const char *const ctype[VM_NUM_DTYPES] = {"u8",    "i32",  "i64", "float", "double",
                                                 "kbf16", "kf16", "u8",  "i8",    "i16"};
static const char *const comp[VM_NUM_DTYPES] = {"u8",    "i32",   "i64", "float", "double",
                                                "float", "float", "u8",  "i8",    "i16"};
static const char *const utype[VM_NUM_DTYPES] = {"u8",    "u32",   "u64", "float", "double",
                                                 "float", "float", "u32", "u32",   "u32"};
static const char *const dsfx[VM_NUM_DTYPES] = {"b8",   "i32", "i64", "f32", "f64",
                                                "bf16", "f16", "u8",  "i8",  "i16"};
/* the suffix of a C math function for the dtype: expf / exp */
static const char *fsfx(kiln_dtype dt) { return dt == KILN_F64 ? "" : "f"; }

typedef enum { CLS_FLOAT, CLS_INT, CLS_BOOL } dclass;
static dclass class_of(kiln_dtype dt) {
  return vm_dtype_is_float(dt) ? CLS_FLOAT : dt == KILN_BOOL ? CLS_BOOL : CLS_INT;
}

/* --- the per-op expression tables (x, y: operands of type T; U: T's
   unsigned twin; $F: the math suffix).  NULL: the op rejects that dtype
   class (vm/kern_elementwise.c has the same rows). -------------------------------- */

typedef struct {
  const char *f, *i, *b; /* float, integer, bool */
} op_exprs;

static const op_exprs elementwise[VM_OP_COUNT] = {
    [VM_OP_copy] = {"x", "x", "x"},
    [VM_OP_neg] = {"-x", "(T)((U)0 - (U)x)", NULL},
    [VM_OP_abs] = {"fabs$F(x)", "x < 0 ? (T)((U)0 - (U)x) : x", "x"},
    [VM_OP_sign] = {"x != x ? x : (T)((x > 0) - (x < 0))", "(T)((x > 0) - (x < 0))", "x"},
    [VM_OP_floor] = {"floor$F(x)", "x", "x"},
    [VM_OP_ceil] = {"ceil$F(x)", "x", "x"},
    [VM_OP_round] = {"rint$F(x)", "x", "x"}, /* half to even, as nearbyint */
    [VM_OP_exp] = {"exp$F(x)", NULL, NULL},
    [VM_OP_log] = {"log$F(x)", NULL, NULL},
    [VM_OP_sqrt] = {"sqrt$F(x)", NULL, NULL},
    [VM_OP_rsqrt] = {"(T)1 / sqrt$F(x)", NULL, NULL}, /* not rsqrt: that is approximate */
    [VM_OP_sin] = {"sin$F(x)", NULL, NULL},
    [VM_OP_cos] = {"cos$F(x)", NULL, NULL},
    [VM_OP_tanh] = {"tanh$F(x)", NULL, NULL},
    [VM_OP_sigmoid] = {"(T)1 / ((T)1 + exp$F(-x))", NULL, NULL},
    [VM_OP_erf] = {"erf$F(x)", NULL, NULL},
    [VM_OP_log1p] = {"log1p$F(x)", NULL, NULL},
    [VM_OP_expm1] = {"expm1$F(x)", NULL, NULL},
    [VM_OP_logical_not] = {NULL, NULL, "(T)!x"},
    [VM_OP_add] = {"x + y", "(T)((U)x + (U)y)", "(T)(x | y)"},
    [VM_OP_sub] = {"x - y", "(T)((U)x - (U)y)", NULL},
    [VM_OP_mul] = {"x * y", "(T)((U)x * (U)y)", "(T)(x & y)"},
    [VM_OP_div] = {"x / y", NULL, NULL},
    [VM_OP_pow] = {"pow$F(x, y)", "(T)k_int_pow(x, y)", NULL},
    [VM_OP_maximum] = {"k_fmax(x, y)", "x > y ? x : y", "(T)(x | y)"},
    [VM_OP_minimum] = {"k_fmin(x, y)", "x < y ? x : y", "(T)(x & y)"},
    [VM_OP_eq] = {"x == y", "x == y", "x == y"},
    [VM_OP_ne] = {"x != y", "x != y", "x != y"},
    [VM_OP_lt] = {"x < y", "x < y", "x < y"},
    [VM_OP_le] = {"x <= y", "x <= y", "x <= y"},
    [VM_OP_gt] = {"x > y", "x > y", "x > y"},
    [VM_OP_ge] = {"x >= y", "x >= y", "x >= y"},
    [VM_OP_logical_and] = {NULL, NULL, "(T)(x & y)"},
    [VM_OP_logical_or] = {NULL, NULL, "(T)(x | y)"},
    [VM_OP_where] = {"c ? x : y", "c ? x : y", "c ? x : y"},
};

static const char *elementwise_expr(vm_opcode op, kiln_dtype dt) {
  const op_exprs *e = &elementwise[op];
  switch (class_of(dt)) {
    case CLS_FLOAT:
      return e->f;
    case CLS_INT:
      return e->i;
    default:
      return e->b;
  }
}

/* cast: float -> int saturates and NaN -> 0; anything -> bool is != 0
   (vm/kern_elementwise.c TO_INT and TO_BOOL) */
static void cast_expr(sbuf *b, kiln_dtype from, kiln_dtype to) {
  static const char *const lo[VM_NUM_DTYPES] = {[KILN_I32] = "(-2147483647 - 1)",
                                                [KILN_I64] = "(-9223372036854775807LL - 1)",
                                                [KILN_U8] = "0",
                                                [KILN_I8] = "(-128)",
                                                [KILN_I16] = "(-32768)"};
  static const char *const hi[VM_NUM_DTYPES] = {[KILN_I32] = "2147483647",
                                                [KILN_I64] = "9223372036854775807LL",
                                                [KILN_U8] = "255",
                                                [KILN_I8] = "127",
                                                [KILN_I16] = "32767"};
  if (to == KILN_BOOL)
    gpu_src_printf(b, "(TO)(x != 0)");
  else if (vm_dtype_is_float(from) && vm_dtype_is_int(to))
    gpu_src_printf(b, "x != x ? (TO)0 : x <= (T)%s ? (TO)%s : x >= (T)%s ? (TO)%s : (TO)x", lo[to],
                   lo[to], hi[to], hi[to]);
  else
    gpu_src_printf(b, "(TO)x");
}

/* --- reductions: accumulator type, identity, combine ---------------------------- */

static const char *reduce_init(vm_opcode op, kiln_dtype a) {
  /* the halves never fold here: front/op.c records their reductions in f32 */
  static const char *const max_init[VM_NUM_DTYPES] = {"(u8)0",
                                                      "(-2147483647 - 1)",
                                                      "(-9223372036854775807LL - 1)",
                                                      "-__int_as_float(0x7f800000)",
                                                      "-__longlong_as_double(0x7ff0000000000000LL)",
                                                      [KILN_U8] = "(u8)0",
                                                      [KILN_I8] = "(i8)(-128)",
                                                      [KILN_I16] = "(i16)(-32768)"};
  static const char *const min_init[VM_NUM_DTYPES] = {"(u8)1",
                                                      "2147483647",
                                                      "9223372036854775807LL",
                                                      "__int_as_float(0x7f800000)",
                                                      "__longlong_as_double(0x7ff0000000000000LL)",
                                                      [KILN_U8] = "(u8)255",
                                                      [KILN_I8] = "(i8)127",
                                                      [KILN_I16] = "(i16)32767"};
  switch (op) {
    case VM_OP_sum:
      return "0";
    case VM_OP_prod:
      return "1";
    case VM_OP_max:
      return max_init[a];
    default:
      return min_init[a];
  }
}

static const char *reduce_comb(vm_opcode op) {
  switch (op) {
    case VM_OP_sum:
      return "k_sum";
    case VM_OP_prod:
      return "k_prod";
    case VM_OP_max:
      return "k_max";
    default:
      return "k_min";
  }
}

/* --- which keys exist ------------------------------------------------------------- */

static bool reduce_dtype_ok(vm_opcode op, kiln_dtype dt) {
  switch (op) {
    case VM_OP_sum:
    case VM_OP_prod:
      return dt == KILN_I64 || vm_dtype_is_float(dt); /* integers sum in i64 */
    default:
      return true;
  }
}

bool gpu_op_key_supported(const gpu_op_key *k) {
  if (k->op >= VM_OP_COUNT || !vm_dtype_valid(k->out_dtype)) return false;
  for (int i = 0; i < k->nin; i++)
    if (i >= 3 || !vm_dtype_valid(k->in_dtype[i])) return false;
  vm_opcode op = (vm_opcode)k->op;
  kiln_dtype out = (kiln_dtype)k->out_dtype, in0 = (kiln_dtype)k->in_dtype[0];
  kiln_dtype in1 = (kiln_dtype)k->in_dtype[1], in2 = (kiln_dtype)k->in_dtype[2];
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      if (k->nin || k->variant || op == VM_OP_input) return false;
      return op == VM_OP_full || op == VM_OP_arange || vm_dtype_is_float(out);
    case VM_KIND_UNARY:
      if (k->nin != 1 || k->variant) return false;
      if (op == VM_OP_cast) return in0 != out;
      return elementwise_expr(op, in0) && out == (op == VM_OP_logical_not ? KILN_BOOL : in0);
    case VM_KIND_BINARY: {
      if (k->nin != 2 || k->variant || in0 != in1 || !elementwise_expr(op, in0)) return false;
      vm_dtype_rule r = vm_op_table[op].rule;
      return out == (r == VM_DT_COMPARE || r == VM_DT_LOGICAL ? KILN_BOOL : in0);
    }
    case VM_KIND_TERNARY:
      return k->nin == 3 && !k->variant && in0 == KILN_BOOL && in1 == in2 && out == in1;
    case VM_KIND_REDUCE: /* over halves: front/op.c records them in f32 */
      if (k->nin != 1 || vm_dtype_is_half(in0)) return false;
      if (op == VM_OP_argmax || op == VM_OP_argmin) return out == KILN_I64 && k->variant == 0;
      return out == in0 && reduce_dtype_ok(op, in0) && k->variant <= GPU_RED_COL_JOIN;
    case VM_KIND_MATMUL:
      /* floats go to cuBLAS; front/op.c widens the narrow integers to i64 */
      return k->nin == 2 && !k->variant && (out == KILN_I32 || out == KILN_I64) && in0 == out &&
             in1 == out;
    case VM_KIND_INDEX:
      if (k->variant == GPU_IDX_CHECK)
        return op == VM_OP_index_select && k->nin == 1 && in0 == KILN_I64 && out == KILN_I64;
      if (k->variant != GPU_IDX_DATA || in0 != out || in1 != KILN_I64) return false;
      /* a half's scatter_add accumulates: front/op.c records it in f32 */
      return op == VM_OP_scatter_add ? k->nin == 3 && in2 == out && !vm_dtype_is_half(out)
                                     : k->nin == 2;
    case VM_KIND_CONCAT:
      return k->nin == 1 && !k->variant && in0 == out;
    case VM_KIND_SORT:
      return k->nin == 1 && !k->variant && out == KILN_I64 && !vm_dtype_is_half(in0);
    case VM_KIND_ATTENTION: { /* f32 and f64 (fe_attention: halves in f32) */
      int pass = k->variant % GPU_ATT_WIDE;
      return k->nin == 3 && (out == KILN_F32 || out == KILN_F64) && in0 == out && in1 == out &&
             in2 == out && k->variant < 2 * GPU_ATT_WIDE &&
             (pass == GPU_ATT_FWD) == (op == VM_OP_attention);
    }
    case VM_KIND_VIEW:
    case VM_KIND_COLLECTIVE:
    case VM_KIND_CONV:
      return false;
  }
  return false;
}

/* --- the prelude: types, gpu_args with its layout asserts, helpers ---------------- */

static const char prelude_helpers[] =
    "/* vm/half.h's conversions, step for step (tests/gpu_emu checks every\n"
    "   16-bit pattern against it): f32 -> half rounds to nearest even, past\n"
    "   the largest finite half is Inf, a NaN is quieted keeping its top bits */\n"
    "__device__ __forceinline__ float k_bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); "
    "}\n"
    "__device__ __forceinline__ u16 k_f32_to_bf16(float x) {\n"
    "  const u32 u = __float_as_uint(x);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);\n"
    "  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "__device__ __forceinline__ float k_f16_to_f32(u16 h) {\n"
    "  const u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : "
    "0u));\n"
    "  if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * "
    "5.9604644775390625e-8f));\n"
    "  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));\n"
    "}\n"
    "__device__ __forceinline__ u16 k_f32_to_f16(float x) {\n"
    "  const u32 u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n"
    "  if (a > 0x7f800000u) return (u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));\n"
    "  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);\n"
    "  if (a >= 0x38800000u)\n"
    "    return (u16)(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));\n"
    "  const u32 e = a >> 23;\n"
    "  if (e < 102) return (u16)sign;\n"
    "  const u32 m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;\n"
    "  const u32 rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);\n"
    "  u32 q = m >> shift;\n"
    "  q += (rem > half) | ((rem == half) & q);\n"
    "  return (u16)(sign | q);\n"
    "}\n"
    "/* a stored half: its bits; it reads as the float it holds, and a float\n"
    "   (or anything that converts to one) stored into it is rounded */\n"
    "#define K_HALF(H)                                                                         \\\n"
    "  struct k##H {                                                                           \\\n"
    "    u16 bits;                                                                             \\\n"
    "    k##H() = default;                                                                     \\\n"
    "    __device__ __forceinline__ k##H(float x) : bits(k_f32_to_##H(x)) {}                   \\\n"
    "    __device__ __forceinline__ operator float() const { return k_##H##_to_f32(bits); }    \\\n"
    "  };                                                                                      \\\n"
    "  __device__ __forceinline__ k##H k_##H##_bits(u16 b) {                                   \\\n"
    "    k##H h;                                                                               \\\n"
    "    h.bits = b;                                                                           \\\n"
    "    return h;                                                                             \\\n"
    "  }\n"
    "K_HALF(bf16)\n"
    "K_HALF(f16)\n"
    "/* a reduction pass's plain store of result v of item i (src.h gpu_src_reduce) */\n"
    "#define k_store_out(i, v) (out[i] = (v))\n"
    "__device__ __forceinline__ float k_fmax(float x, float y) {\n"
    "  return (x != x || x > y || (x == y && (__float_as_uint(y) >> 31))) ? x : y;\n"
    "}\n"
    "__device__ __forceinline__ double k_fmax(double x, double y) {\n"
    "  return (x != x || x > y || (x == y && __double_as_longlong(y) < 0)) ? x : y;\n"
    "}\n"
    "__device__ __forceinline__ float k_fmin(float x, float y) {\n"
    "  return (x != x || x < y || (x == y && !(__float_as_uint(y) >> 31))) ? x : y;\n"
    "}\n"
    "__device__ __forceinline__ double k_fmin(double x, double y) {\n"
    "  return (x != x || x < y || (x == y && __double_as_longlong(y) >= 0)) ? x : y;\n"
    "}\n"
    "/* vm/kern_elementwise.c int_pow */\n"
    "__device__ __forceinline__ i64 k_int_pow(i64 base, i64 e) {\n"
    "  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;\n"
    "  u64 r = 1, b = (u64)base;\n"
    "  while (e) {\n"
    "    if (e & 1) r *= b;\n"
    "    b *= b;\n"
    "    e >>= 1;\n"
    "  }\n"
    "  return (i64)r;\n"
    "}\n"
    "/* vm/dtype.c vm_store_f64: a double stored into each dtype */\n"
    "__device__ __forceinline__ i64 k_saturate(double v, double lo, double hi) {\n"
    "  if (v != v) return 0;\n"
    "  if (v <= lo) return (i64)lo;\n"
    "  if (v >= hi) return v >= 9.2233720368547758e18 ? 9223372036854775807LL : (i64)hi;\n"
    "  return (i64)v;\n"
    "}\n"
    "__device__ __forceinline__ u8 k_from_f64_b8(double v) { return v != 0; }\n"
    "__device__ __forceinline__ i32 k_from_f64_i32(double v) {\n"
    "  return (i32)k_saturate(v, -2147483648.0, 2147483647.0);\n"
    "}\n"
    "__device__ __forceinline__ i64 k_from_f64_i64(double v) {\n"
    "  return k_saturate(v, -9.2233720368547758e18, 9.2233720368547758e18);\n"
    "}\n"
    "__device__ __forceinline__ float k_from_f64_f32(double v) { return (float)v; }\n"
    "__device__ __forceinline__ double k_from_f64_f64(double v) { return v; }\n"
    "__device__ __forceinline__ kbf16 k_from_f64_bf16(double v) { return kbf16((float)v); }\n"
    "__device__ __forceinline__ kf16 k_from_f64_f16(double v) { return kf16((float)v); }\n"
    "__device__ __forceinline__ u8 k_from_f64_u8(double v) { return (u8)k_saturate(v, 0.0, 255.0); "
    "}\n"
    "__device__ __forceinline__ i8 k_from_f64_i8(double v) { return (i8)k_saturate(v, -128.0, "
    "127.0); }\n"
    "__device__ __forceinline__ i16 k_from_f64_i16(double v) {\n"
    "  return (i16)k_saturate(v, -32768.0, 32767.0);\n"
    "}\n"
    "/* reduction steps (vm/kern_reduce.c): integers wrap */\n"
    "__device__ __forceinline__ double k_sum(double a, double v) { return a + v; }\n"
    "__device__ __forceinline__ i64 k_sum(i64 a, i64 v) { return (i64)((u64)a + (u64)v); }\n"
    "__device__ __forceinline__ double k_prod(double a, double v) { return a * v; }\n"
    "__device__ __forceinline__ i64 k_prod(i64 a, i64 v) { return (i64)((u64)a * (u64)v); }\n"
    "__device__ __forceinline__ float k_max(float a, float v) { return k_fmax(a, v); }\n"
    "__device__ __forceinline__ double k_max(double a, double v) { return k_fmax(a, v); }\n"
    "__device__ __forceinline__ float k_min(float a, float v) { return k_fmin(a, v); }\n"
    "__device__ __forceinline__ double k_min(double a, double v) { return k_fmin(a, v); }\n"
    "#define K_INT_MAXMIN(T)                                                          \\\n"
    "  __device__ __forceinline__ T k_max(T a, T v) { return a >= v ? a : v; } \\\n"
    "  __device__ __forceinline__ T k_min(T a, T v) { return a <= v ? a : v; }\n"
    "K_INT_MAXMIN(u8)\n"
    "K_INT_MAXMIN(i32)\n"
    "K_INT_MAXMIN(i64)\n"
    "K_INT_MAXMIN(i8)\n"
    "K_INT_MAXMIN(i16)\n"
    "__device__ __forceinline__ double k_shfl_xor(double v, int w) { return "
    "__shfl_xor_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ float k_shfl_xor(float v, int w) { return "
    "__shfl_xor_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ double k_shfl_down(double v, int w) { return "
    "__shfl_down_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ float k_shfl_down(float v, int w) { return "
    "__shfl_down_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ i64 k_shfl_down(i64 v, int w) { return "
    "__shfl_down_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ u64 k_shfl_down(u64 v, int w) { return "
    "__shfl_down_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ i32 k_shfl_down(i32 v, int w) { return "
    "__shfl_down_sync(0xffffffffu, v, w); }\n"
    "__device__ __forceinline__ u8 k_shfl_down(u8 v, int w) {\n"
    "  return (u8)__shfl_down_sync(0xffffffffu, (int)v, w);\n"
    "}\n"
    "__device__ __forceinline__ i8 k_shfl_down(i8 v, int w) {\n"
    "  return (i8)__shfl_down_sync(0xffffffffu, (int)v, w);\n"
    "}\n"
    "__device__ __forceinline__ i16 k_shfl_down(i16 v, int w) {\n"
    "  return (i16)__shfl_down_sync(0xffffffffu, (int)v, w);\n"
    "}\n"
    "/* argmax/argmin (vm/kern_reduce.c arg_scan): the first NaN, else the\n"
    "   first extremum; i < 0 is no candidate.  Associative, so any tree. */\n"
    "template <class T> __device__ __forceinline__ void k_argcomb(T &bv, i64 &bi, T v, i64 i, bool "
    "is_max) {\n"
    "  if (i < 0) return;\n"
    "  bool take;\n"
    "  if (bi < 0) {\n"
    "    take = true;\n"
    "  } else {\n"
    "    bool vn = !(v == v), bn = !(bv == bv);\n"
    "    if (vn || bn) take = vn && (!bn || i < bi);\n"
    "    else take = is_max ? (v > bv || (v == bv && i < bi)) : (v < bv || (v == bv && i < bi));\n"
    "  }\n"
    "  if (take) {\n"
    "    bv = v;\n"
    "    bi = i;\n"
    "  }\n"
    "}\n"
    "/* argsort (vm/kern_sort.c): x strictly before y; NaN is the largest */\n"
    "template <class T> __device__ __forceinline__ bool k_before(T x, T y, bool desc) {\n"
    "  bool xn = !(x == x), yn = !(y == y);\n"
    "  return desc ? (x > y || (xn && !yn)) : (x < y || (!xn && yn));\n"
    "}\n"
    "/* vm/rng.c: Philox4x32-10 */\n"
    "__device__ __forceinline__ void k_philox(u32 k0, u32 k1, u32 c0, u32 c1, u32 c2, u32 c3, u32 "
    "*o) {\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;\n"
    "    u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;\n"
    "    u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;\n"
    "    c1 = lo1;\n"
    "    c3 = lo0;\n"
    "    c0 = n0;\n"
    "    c2 = n2;\n"
    "    k0 += 0x9E3779B9u;\n"
    "    k1 += 0xBB67AE85u;\n"
    "  }\n"
    "  o[0] = c0;\n"
    "  o[1] = c1;\n"
    "  o[2] = c2;\n"
    "  o[3] = c3;\n"
    "}\n"
    "__device__ __forceinline__ double k_unit53(u32 hi, u32 lo) {\n"
    "  return (double)((((u64)hi << 32) | lo) >> 11) * 0x1p-53;\n"
    "}\n"
    "/* element offsets of the row-major index i over dims [0, ndim): operand\n"
    "   k's for each bit k of MASK, added to off[k] */\n"
    "template <int MASK> __device__ __forceinline__ void k_offsets(const gpu_args &a, i64 i, i64 "
    "(&off)[4]) {\n"
    "#pragma unroll\n"
    "  for (int d = K_MAX_DIMS - 1; d >= 0; d--) {\n"
    "    if (MASK && d < a.ndim) {\n"
    "      i64 s = a.shape[d], q = i / s, c = i - q * s;\n"
    "      i = q;\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < 4; k++)\n"
    "        if (MASK & (1 << k)) off[k] += c * a.stride[k][d];\n"
    "    }\n"
    "  }\n"
    "}\n"
    "/* operand k's offset of the row-major index i over dims [d0, d1) */\n"
    "template <class G> __device__ __forceinline__ i64 k_offset(const G &a, int k, i64 i, int d0, "
    "int d1) {\n"
    "  i64 off = 0;\n"
    "#pragma unroll\n"
    "  for (int d = K_MAX_DIMS - 1; d >= 0; d--) {\n"
    "    if (d >= d0 && d < d1) {\n"
    "      i64 s = a.shape[d], q = i / s;\n"
    "      off += (i - q * s) * a.stride[k][d];\n"
    "      i = q;\n"
    "    }\n"
    "  }\n"
    "  return off;\n"
    "}\n";

static void emit_prelude(sbuf *b) {
  gpu_src_printf(b,
                 "/* Kiln GPU interpreter kernels (jit_gpu/opgen_src.c) */\n"
                 "#ifndef KILN_GPU_PRELUDE\n"
                 "#define KILN_GPU_PRELUDE\n"
                 "typedef int i32;\n"
                 "typedef unsigned int u32;\n"
                 "typedef long long i64;\n"
                 "typedef unsigned long long u64;\n"
                 "typedef unsigned char u8; /* bool: 0 or 1; uint8 */\n"
                 "typedef signed char i8;\n"
                 "typedef short i16;\n"
                 "typedef unsigned short u16;\n"
                 "#define K_MAX_DIMS %d\n"
                 "struct gpu_args {\n"
                 "  void *ptr[%d];\n"
                 "  i64 stride[%d][K_MAX_DIMS];\n"
                 "  i64 shape[K_MAX_DIMS];\n"
                 "  i64 n;\n"
                 "  i64 extent[4];\n"
                 "  double scalar[2];\n"
                 "  u64 seed, counter;\n"
                 "  i32 ndim;\n"
                 "  i32 axis;\n"
                 "  i32 flag;\n"
                 "  i32 pad;\n"
                 "};\n"
                 "struct gpu_index_check {\n"
                 "  u64 first;\n"
                 "  i64 value;\n"
                 "  i64 size;\n"
                 "  u32 done;\n"
                 "  i32 axis;\n"
                 "  u32 sealed;\n"
                 "  u32 op;\n"
                 "};\n",
                 KILN_MAX_DIMS, GPU_MAX_OPERANDS, GPU_MAX_OPERANDS);
  /* NVRTC's front end (EDG) has no offsetof without <cstddef>; __INTADDR__
     is what EDG's own offsetof expands to, and it is a constant expression */
  gpu_src_printf(
      b, "static_assert(sizeof(gpu_args) == %zu, \"gpu_args: host and device layouts differ\");\n",
      sizeof(gpu_args));
  GPU_SRC_ASSERT_FIELD(b, gpu_args, ptr);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, stride);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, shape);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, n);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, extent);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, scalar);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, seed);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, counter);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, ndim);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, axis);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, flag);
  GPU_SRC_ASSERT_FIELD(b, gpu_args, pad);
  gpu_src_printf(
      b, "static_assert(sizeof(gpu_index_check) == %zu, \"gpu_index_check: layouts differ\");\n",
      sizeof(gpu_index_check));
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, first);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, value);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, size);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, done);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, axis);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, sealed);
  GPU_SRC_ASSERT_FIELD(b, gpu_index_check, op);
  sb_put(b, prelude_helpers, sizeof prelude_helpers - 1);
  gpu_src_printf(b, "#endif /* KILN_GPU_PRELUDE */\n");
}

/* --- kernels ---------------------------------------------------------------------- */

#define GRID_STRIDE                                                                          \
  "for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (i64)gridDim.x * " \
  "blockDim.x)"

/* gpu_args stays in the parameter bank: __grid_constant__ (sm_70 and up;
   NVRTC 13 knows nothing older) lets helpers take its address without a
   per-thread copy to local memory */
static void kernel_open(sbuf *b, const char *name) {
  gpu_src_printf(b,
                 "\nextern \"C\" __global__ void __launch_bounds__(256) %s(const __grid_constant__ "
                 "gpu_args a) {\n",
                 name);
}

/* unary, binary, where, cast, concat: out[i] = EXPR over the operands */
static void emit_elementwise(sbuf *b, const gpu_op_key *k, const char *name) {
  vm_opcode op = (vm_opcode)k->op;
  kiln_dtype out = (kiln_dtype)k->out_dtype;
  kiln_dtype t = (kiln_dtype)k->in_dtype[k->nin == 3 ? 1 : 0]; /* the compute type */
  kernel_open(b, name);
  /* concat moves a half's bits (as the CPU's); every other op computes
     in comp[t] and stores through TO (a half rounds there) */
  gpu_src_printf(b, "  typedef %s T;\n  typedef %s U;\n  typedef %s TO;\n",
                 op == VM_OP_concat ? ctype[t] : comp[t], utype[t], ctype[out]);
  gpu_src_printf(b, "  TO *out = (TO *)a.ptr[0];\n");
  for (int i = 0; i < k->nin; i++)
    gpu_src_printf(b, "  const %s *in%d = (const %s *)a.ptr[%d];\n", ctype[k->in_dtype[i]], i,
                   ctype[k->in_dtype[i]], i + 1);
  unsigned strided = ~(unsigned)k->contiguous & ((1u << (k->nin + 1)) - 1);
  gpu_src_printf(b, "  " GRID_STRIDE " {\n");
  gpu_src_printf(b, "    i64 off[4] = {%s, %s, %s, %s};\n", strided & 1 ? "0" : "i",
                 strided & 2 ? "0" : "i", strided & 4 ? "0" : "i", strided & 8 ? "0" : "i");
  if (strided) gpu_src_printf(b, "    k_offsets<%u>(a, i, off);\n", strided);
  if (k->nin == 3)
    gpu_src_printf(
        b, "    const u8 c = in0[off[1]];\n    const T x = in1[off[2]], y = in2[off[3]];\n");
  else if (k->nin == 2)
    gpu_src_printf(b, "    const T x = in0[off[1]], y = in1[off[2]];\n");
  else
    gpu_src_printf(b, "    const T x = in0[off[1]];\n");
  gpu_src_printf(b, "    out[off[0]] = (TO)(");
  if (op == VM_OP_cast) {
    cast_expr(b, t, out);
  } else if (op == VM_OP_concat) {
    gpu_src_printf(b, "x");
  } else {
    const char *vars[] = {"F", fsfx(t), NULL};
    sb_subst(b, elementwise_expr(op, t), vars);
  }
  gpu_src_printf(b, ");\n  }\n}\n");
}

/* full, arange (vm_store_f64 of the value), rand, randn (vm/rng.c): a
   thread per Philox block, a.n blocks, a.extent[0] values */
static void emit_leaf(sbuf *b, const gpu_op_key *k, const char *name) {
  vm_opcode op = (vm_opcode)k->op;
  kiln_dtype dt = (kiln_dtype)k->out_dtype;
  kernel_open(b, name);
  gpu_src_printf(b, "  typedef %s TO;\n  TO *out = (TO *)a.ptr[0];\n", ctype[dt]);
  if (op == VM_OP_full) {
    gpu_src_printf(b,
                   "  const TO v = k_from_f64_%s(a.scalar[0]);\n  " GRID_STRIDE " out[i] = v;\n}\n",
                   dsfx[dt]);
    return;
  }
  if (op == VM_OP_arange && dt == KILN_I64) { /* vm_arange_integral (vm/dtype.h) */
    gpu_src_printf(
        b,
        "  const double s0 = a.scalar[0], s1 = a.scalar[1], lim = 9223372036854775808.0;\n"
        "  const bool exact = s0 > -lim && s0 < lim && s0 == (double)(i64)s0 && s1 > -lim "
        "&& s1 < lim && s1 == (double)(i64)s1;\n"
        "  " GRID_STRIDE
        " out[i] = exact ? (TO)((u64)(i64)s0 + (u64)i * (u64)(i64)s1)\n"
        "                      : k_from_f64_%s(s0 + (double)i * s1);\n}\n",
        dsfx[dt]);
    return;
  }
  if (op == VM_OP_arange) {
    gpu_src_printf(
        b, "  " GRID_STRIDE " out[i] = k_from_f64_%s(a.scalar[0] + (double)i * a.scalar[1]);\n}\n",
        dsfx[dt]);
    return;
  }
  bool normal = op == VM_OP_randn, f64 = dt == KILN_F64;
  gpu_src_printf(b,
                 "  const u32 k0 = (u32)a.seed, k1 = (u32)(a.seed >> 32);\n"
                 "  const double two_pi = 6.283185307179586476925;\n"
                 "  const i64 count = a.extent[0];\n"
                 "  (void)two_pi;\n"
                 "  " GRID_STRIDE
                 " {\n"
                 "    u64 c = a.counter + (u64)i;\n"
                 "    u32 r[4];\n"
                 "    k_philox(k0, k1, (u32)c, (u32)(c >> 32), 0, 0, r);\n");
  if (!f64 && !normal)
    gpu_src_printf(b,
                   "    float v[4];\n"
                   "    for (int q = 0; q < 4; q++) v[q] = (float)(r[q] >> 8) * 0x1p-24f;\n");
  else if (!f64)
    gpu_src_printf(
        b,
        "    float v[4];\n"
        "    for (int q = 0; q < 4; q += 2) {\n"
        "      double u1 = ((r[q] >> 8) + 1.0) * 0x1p-24, u2 = (r[q + 1] >> 8) * 0x1p-24;\n"
        "      double rad = sqrt(-2.0 * log(u1));\n"
        "      v[q] = (float)(rad * cos(two_pi * u2));\n"
        "      v[q + 1] = (float)(rad * sin(two_pi * u2));\n"
        "    }\n");
  else if (!normal)
    gpu_src_printf(b, "    double v[2] = {k_unit53(r[0], r[1]), k_unit53(r[2], r[3])};\n");
  else
    gpu_src_printf(b,
                   "    double u1 = 1.0 - k_unit53(r[0], r[1]), u2 = k_unit53(r[2], r[3]);\n"
                   "    double rad = sqrt(-2.0 * log(u1));\n"
                   "    double v[2] = {rad * cos(two_pi * u2), rad * sin(two_pi * u2)};\n");
  if (vm_dtype_is_half(dt) && !normal) {
    /* a half rounds its f32 draws; U[0, 1) keeps a draw that rounds to 1
       below it, as the largest half under 1 (vm/interp.c run_widened) */
    unsigned one = dt == KILN_BF16 ? 0x3f80 : 0x3c00;
    gpu_src_printf(b,
                   "    for (int q = 0; q < 4 && i * 4 + q < count; q++) {\n"
                   "      TO h = v[q];\n"
                   "      if (h.bits == 0x%xu) h.bits = 0x%xu;\n"
                   "      out[i * 4 + q] = h;\n"
                   "    }\n  }\n}\n",
                   one, one - 1);
    return;
  }
  gpu_src_printf(
      b, "    for (int q = 0; q < %d && i * %d + q < count; q++) out[i * %d + q] = v[q];\n  }\n}\n",
      f64 ? 2 : 4, f64 ? 2 : 4, f64 ? 2 : 4);
}

/* the lane order (vm/fold.h): an item is (output o, chunk c) of at most
   a.extent[1] positions, folded by W = a.extent[3] warps, G = 8 / W items
   per block.  Fold blocks of VM_FOLD_BLOCK positions: lane l of L = 256 /
   sizeof(A) folds positions r + l (a warp holds L / 32 lanes per thread),
   the block's tail goes into lane 0, then the tree w = L/2 .. 1; the
   item's acc joins its blocks in order.  Writes (T)acc at out[item]
   (through $STORE: a fused kernel's epilogue, src.h). */
static const char lane_kernel[] =
    "  typedef $T T;\n"
    "  typedef $A A;\n"
    "  __shared__ A part[8][$NBLK];\n"
    "  T *out = (T *)a.ptr[0];\n"
    "$SRC"
    "  const int W = (int)a.extent[3], G = (int)(blockDim.x >> 5) / W;\n"
    "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / W, wig = warp % "
    "W;\n"
    "  const i64 count = a.extent[0], chunk = a.extent[1], nchunks = a.extent[2];\n"
    "  for (i64 first = (i64)blockIdx.x * G; first < a.n; first += (i64)gridDim.x * G) {\n"
    "    const i64 item = first + group;\n"
    "    const bool active = group < G && item < a.n;\n"
    "    i64 nb = 0;\n"
    "    if (active) {\n"
    "      const i64 o = item / nchunks, p0 = (item - o * nchunks) * chunk;\n"
    "      const i64 len = count - p0 < chunk ? count - p0 : chunk;\n"
    "$ITEM"
    "      nb = (len + $BLOCK - 1) / $BLOCK;\n"
    "      for (i64 bk = wig; bk < nb; bk += W) {\n"
    "        const i64 pb = p0 + bk * $BLOCK, blen = p0 + len - pb < $BLOCK ? p0 + len - pb : "
    "$BLOCK;\n"
    "        A l0 = $INIT;\n"
    "$L1_DECL"
    "        i64 r = 0;\n"
    "        for (; r + $L <= blen; r += $L) {\n"
    "          l0 = $COMB(l0, (A)ld(pb + r + lane));\n"
    "$L1_STEP"
    "        }\n"
    "        if (lane == 0)\n"
    "          for (; r < blen; r++) l0 = $COMB(l0, (A)ld(pb + r));\n"
    "$L1_JOIN"
    "        for (int w = 16; w >= 1; w >>= 1) l0 = $COMB(l0, k_shfl_down(l0, w));\n"
    "        if (lane == 0) part[group][bk] = l0;\n"
    "      }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (active && wig == 0 && lane == 0) {\n"
    "      A acc = $INIT;\n"
    "      for (i64 bk = 0; bk < nb; bk++) acc = $COMB(acc, part[group][bk]);\n"
    "      $STORE(item, (T)acc);\n"
    "    }\n"
    "    __syncthreads();\n"
    "  }\n"
    "}\n";

/* one row's fold inside a row kernel (fuse.c): the lane kernel's order for
   a row of one chunk (count <= VM_FOLD_CHUNK positions), by the W warps of
   the row's group; `active`, `wig`, `lane`, `group`, `W` and `count` are
   the kernel's.  The result, cast to T, reaches every thread of the group
   through shared memory (two barriers, which every thread of the block
   passes). */
static const char row_fold[] =
    "    {\n"
    "      typedef $T T;\n"
    "      typedef $A A;\n"
    "      __shared__ A part$K[8][$NBLK];\n"
    "      __shared__ T row$K[8];\n"
    "      i64 nb = 0;\n"
    "      if (active) {\n"
    "        nb = (count + $BLOCK - 1) / $BLOCK;\n"
    "        for (i64 bk = wig; bk < nb; bk += W) {\n"
    "          const i64 pb = bk * $BLOCK, blen = count - pb < $BLOCK ? count - pb : $BLOCK;\n"
    "          A l0 = $INIT;\n"
    "$L1_DECL"
    "          i64 r = 0;\n"
    "          for (; r + $L <= blen; r += $L) {\n"
    "            l0 = $COMB(l0, (A)$LD(pb + r + lane));\n"
    "$L1_STEP"
    "          }\n"
    "          if (lane == 0)\n"
    "            for (; r < blen; r++) l0 = $COMB(l0, (A)$LD(pb + r));\n"
    "$L1_JOIN"
    "          for (int w = 16; w >= 1; w >>= 1) l0 = $COMB(l0, k_shfl_down(l0, w));\n"
    "          if (lane == 0) part$K[group][bk] = l0;\n"
    "        }\n"
    "      }\n"
    "      __syncthreads();\n"
    "      if (active && wig == 0 && lane == 0) {\n"
    "        A acc = $INIT;\n"
    "        for (i64 bk = 0; bk < nb; bk++) acc = $COMB(acc, part$K[group][bk]);\n"
    "        row$K[group] = (T)acc;\n"
    "      }\n"
    "      __syncthreads();\n"
    "      $DST = row$K[group];\n"
    "    }\n";

/* an output's a.extent[2] partials (a.ptr[1], [output][partial]) joined in
   order from the identity: the lane order's chunks in double for floats
   (vm_fold_partials), the column order's blocks in A */
static const char join_kernel[] =
    "  typedef $T T;\n"
    "  typedef $J J;\n"
    "  typedef $P P;\n"
    "  T *out = (T *)a.ptr[0];\n"
    "  const P *part = (const P *)a.ptr[1];\n"
    "  const i64 np = a.extent[2];\n"
    "  " GRID_STRIDE
    " {\n"
    "    J acc = $INIT;\n"
    "    for (i64 c = 0; c < np; c++) acc = $COMB(acc, (J)part[i * np + c]);\n"
    "    out[i] = (T)acc;\n"
    "  }\n"
    "}\n";

/* the column order: each output (COL) or each (output, fold block) item
   (COL_PART, a.extent[1] positions per item, a.extent[2] items per output)
   folds its positions in order from the identity, VM_FOLD_BLOCK at a time */
static const char col_kernel[] =
    "  typedef $T T;\n"
    "  typedef $A A;\n"
    "  typedef $OUT O;\n"
    "  O *out = (O *)a.ptr[0];\n"
    "$SRC"
    "  const i64 count = a.extent[0], span = a.extent[1], per = a.extent[2];\n"
    "  " GRID_STRIDE
    " {\n"
    "    const i64 o = i / per, p0 = (i - o * per) * span;\n"
    "    const i64 p1 = count - p0 < span ? count : p0 + span;\n"
    "$ITEM"
    "    A acc = $INIT;\n"
    "    for (i64 pb = p0; pb < p1; pb += $BLOCK) {\n"
    "      const i64 pe = p1 - pb < $BLOCK ? p1 : pb + $BLOCK;\n"
    "      A blk = $INIT;\n"
    "      for (i64 p = pb; p < pe; p++) blk = $COMB(blk, (A)ld(p));\n"
    "      acc = $COMB(acc, blk);\n"
    "    }\n"
    "    $STORE(i, (O)acc);\n"
    "  }\n"
    "}\n";

/* a reduction pass's body (src.h gpu_src_reduce) */
static void reduce_body(sbuf *b, vm_opcode op, kiln_dtype t, int variant, bool contig,
                        const char *src, const char *item, const char *store) {
  kiln_dtype acc = vm_fold_acc_dtype(op, t);
  if (!store) store = "k_store_out";
  char block[32], lanes[32], nblk[32];
  snprintf(block, sizeof block, "%d", VM_FOLD_BLOCK);
  snprintf(nblk, sizeof nblk, "%d", (int)(VM_FOLD_CHUNK / VM_FOLD_BLOCK));
  if (variant == GPU_RED_LANE) {
    /* lanes per thread: L = 256 / sizeof(A) lanes over 32 threads.  The
       order matters for floats only; integers take one lane per thread */
    int per_thread = vm_dtype_is_float(t) ? VM_FOLD_LANE_BYTES / (int)vm_dtype_size(acc) / 32 : 1;
    snprintf(lanes, sizeof lanes, "%d", 32 * per_thread);
    bool two = per_thread == 2;
    const char *vars[] = {
        "T",       ctype[t],
        "A",       ctype[acc],
        "NBLK",    nblk,
        "BLOCK",   block,
        "INIT",    reduce_init(op, acc),
        "COMB",    reduce_comb(op),
        "L",       lanes,
        "CONTIG",  contig ? "true" : "false",
        "SRC",     src,
        "ITEM",    item,
        "STORE",   store,
        "L1_DECL", two ? "        A l1 = $INIT;\n" : "",
        "L1_STEP", two ? "          l1 = $COMB(l1, (A)ld(pb + r + lane + 32));\n" : "",
        "L1_JOIN", two ? "        l0 = $COMB(l0, l1);\n" : "",
        NULL};
    sb_subst(b, lane_kernel, vars);
    return;
  }
  if (variant == GPU_RED_LANE_JOIN || variant == GPU_RED_COL_JOIN) {
    /* lane partials are T, joined in double for floats; column partials are A */
    kiln_dtype join = vm_dtype_is_float(t) ? KILN_F64 : t;
    kiln_dtype part = variant == GPU_RED_LANE_JOIN ? t : acc;
    if (variant == GPU_RED_COL_JOIN) join = acc;
    const char *vars[] = {"T",    ctype[t],        "J",    ctype[join],
                          "P",    ctype[part],     "INIT", reduce_init(op, join),
                          "COMB", reduce_comb(op), NULL};
    sb_subst(b, join_kernel, vars);
    return;
  }
  /* COL writes T outputs, COL_PART A partials */
  kiln_dtype o = variant == GPU_RED_COL ? t : acc;
  const char *vars[] = {"T",      ctype[t],        "A",   ctype[acc], "OUT",
                        ctype[o], "BLOCK",         block, "INIT",     reduce_init(op, acc),
                        "COMB",   reduce_comb(op), "SRC", src,        "ITEM",
                        item,     "STORE",         store, NULL};
  sb_subst(b, col_kernel, vars);
}

/* the op kernel's positions: its one input, through stride[1] (the lane
   order's contiguous layout class reads (o, p) at o * count + p) */
static const char op_reduce_src[] =
    "  const T *x = (const T *)a.ptr[1];\n"
    "  const bool one_r = a.ndim - a.axis <= 1;\n"
    "  const i64 rs = a.ndim > a.axis ? a.stride[1][a.axis] : 0;\n";
static const char op_lane_item[] =
    "      const T *xb = x + ($CONTIG ? o * count : k_offset(a, 1, o, 0, a.axis));\n"
    "      auto ld = [&](i64 p) -> T { return xb[$CONTIG ? p : one_r ? p * rs : k_offset(a, 1, p, "
    "a.axis, a.ndim)]; };\n";
static const char op_col_item[] =
    "    const T *xb = x + k_offset(a, 1, o, 0, a.axis);\n"
    "    auto ld = [&](i64 p) -> T { return xb[one_r ? p * rs : k_offset(a, 1, p, a.axis, "
    "a.ndim)]; };\n";

static void emit_reduce(sbuf *b, const gpu_op_key *k, const char *name) {
  kernel_open(b, name);
  reduce_body(b, (vm_opcode)k->op, (kiln_dtype)k->in_dtype[0], k->variant, k->contiguous & 2,
              op_reduce_src, k->variant == GPU_RED_LANE ? op_lane_item : op_col_item, NULL);
}

/* argmax/argmin over dim a.axis (length a.shape[axis], stride
   a.stride[1][axis]) of each output; W = a.extent[3] warps per output */
static const char arg_kernel[] =
    "  typedef $T T;\n"
    "  __shared__ T sv[8];\n"
    "  __shared__ i64 si[8];\n"
    "  i64 *out = (i64 *)a.ptr[0];\n"
    "  const T *x = (const T *)a.ptr[1];\n"
    "  const int W = (int)a.extent[3], G = (int)(blockDim.x >> 5) / W;\n"
    "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / W, wig = warp % "
    "W;\n"
    "  const i64 n = a.shape[a.axis], s = a.stride[1][a.axis];\n"
    "  for (i64 first = (i64)blockIdx.x * G; first < a.n; first += (i64)gridDim.x * G) {\n"
    "    const i64 o = first + group;\n"
    "    const bool active = group < G && o < a.n;\n"
    "    T bv = 0;\n"
    "    i64 bi = -1;\n"
    "    if (active) {\n"
    "      const T *xb = x + ($CONTIG ? o * n : k_offset(a, 1, o, 0, a.axis));\n"
    "      for (i64 p = (i64)wig * 32 + lane; p < n; p += (i64)W * 32) k_argcomb(bv, bi, xb[p * "
    "s], p, $MAX);\n"
    "    }\n"
    "    for (int w = 16; w >= 1; w >>= 1) {\n"
    "      T ov = k_shfl_down(bv, w);\n"
    "      i64 oi = k_shfl_down(bi, w);\n"
    "      k_argcomb(bv, bi, ov, oi, $MAX);\n"
    "    }\n"
    "    if (lane == 0) {\n"
    "      sv[warp] = bv;\n"
    "      si[warp] = bi;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (active && wig == 0 && lane == 0) {\n"
    "      for (int w = 1; w < W; w++) k_argcomb(bv, bi, sv[warp + w], si[warp + w], $MAX);\n"
    "      out[o] = bi;\n"
    "    }\n"
    "    __syncthreads();\n"
    "  }\n"
    "}\n";

/* argsort: a block per row (rows over dims [0, axis)), the row along dim
   a.axis.  Element i goes to position #(j: v[j] strictly before v[i]) +
   #(j < i: neither before the other): exactly the stable order of
   vm/kern_sort.c.  O(n^2) per row, read through shared-memory tiles: fine
   for the rows models sort (top-k, small vocabularies); a long row wants
   a merge sort (a later kernel). */
static const char sort_kernel[] =
    "  typedef $T T;\n"
    "  __shared__ T tile[1024];\n"
    "  i64 *out = (i64 *)a.ptr[0];\n"
    "  const T *x = (const T *)a.ptr[1];\n"
    "  const i64 n = a.shape[a.axis], sin = a.stride[1][a.axis], sout = a.stride[0][a.axis];\n"
    "  const bool desc = a.flag != 0;\n"
    "  for (i64 row = blockIdx.x; row < a.n; row += gridDim.x) {\n"
    "    const T *xr = x + ($CONTIG ? k_offset(a, 0, row, 0, a.axis) : k_offset(a, 1, row, 0, "
    "a.axis));\n"
    "    i64 *orow = out + k_offset(a, 0, row, 0, a.axis);\n"
    "    for (i64 i0 = 0; i0 < n; i0 += blockDim.x) {\n"
    "      const i64 i = i0 + threadIdx.x;\n"
    "      const bool have = i < n;\n"
    "      const T vi = have ? xr[i * sin] : (T)0;\n"
    "      i64 rank = 0;\n"
    "      for (i64 j0 = 0; j0 < n; j0 += 1024) {\n"
    "        const int m = n - j0 < 1024 ? (int)(n - j0) : 1024;\n"
    "        __syncthreads();\n"
    "        for (int t = threadIdx.x; t < m; t += blockDim.x) tile[t] = xr[(j0 + t) * sin];\n"
    "        __syncthreads();\n"
    "        if (have)\n"
    "          for (int t = 0; t < m; t++) {\n"
    "            const T vj = tile[t];\n"
    "            rank += k_before(vj, vi, desc) || (j0 + t < i && !k_before(vi, vj, desc));\n"
    "          }\n"
    "      }\n"
    "      if (have) orow[rank * sout] = i;\n"
    "    }\n"
    "  }\n"
    "}\n";

/* integer matmul (vm/kern_matmul.c INT_GEMM): a thread per output element
   of batch x M x N; batch dims [0, ndim) with A's strides in stride[1],
   B's in stride[2]; A's row/col strides at stride[1][6..7], B's at
   stride[2][6..7]; extent = {M, N, K}.  Wrapping k-ordered sums. */
static const char matmul_kernel[] =
    "  typedef $T T;\n"
    "  typedef $U U;\n"
    "  T *out = (T *)a.ptr[0];\n"
    "  const T *A = (const T *)a.ptr[1], *B = (const T *)a.ptr[2];\n"
    "  const i64 M = a.extent[0], N = a.extent[1], K = a.extent[2];\n"
    "  const i64 sar = a.stride[1][6], sac = a.stride[1][7], sbr = a.stride[2][6], sbc = "
    "a.stride[2][7];\n"
    "  " GRID_STRIDE
    " {\n"
    "    const i64 j = i % N, r = i / N, m = r % M, bt = r / M;\n"
    "    const T *ar = A + k_offset(a, 1, bt, 0, a.ndim) + m * sar;\n"
    "    const T *bc = B + k_offset(a, 2, bt, 0, a.ndim) + j * sbc;\n"
    "    U acc = 0;\n"
    "    for (i64 q = 0; q < K; q++) acc += (U)ar[q * sac] * (U)bc[q * sbr];\n"
    "    out[i] = (T)acc;\n"
    "  }\n"
    "}\n";

/* index_select / gather: out (contiguous) over dims [0, ndim); a's strides
   in stride[1], the index's in stride[2] (index_select: only dim axis);
   the index value (clamped into [0, a.extent[0])) replaces the axis
   coordinate */
static const char gather_kernel[] =
    "  typedef $T T;\n"
    "  T *out = (T *)a.ptr[0];\n"
    "  const T *x = (const T *)a.ptr[1];\n"
    "  const i64 *idx = (const i64 *)a.ptr[2];\n"
    "  const i64 size = a.extent[0];\n"
    "  " GRID_STRIDE
    " {\n"
    "    i64 rem = i, xo = 0, io = 0;\n"
    "#pragma unroll\n"
    "    for (int d = K_MAX_DIMS - 1; d >= 0; d--) {\n"
    "      if (d < a.ndim) {\n"
    "        const i64 s = a.shape[d], q = rem / s, c = rem - q * s;\n"
    "        rem = q;\n"
    "        io += c * a.stride[2][d];\n"
    "        if (d != a.axis) xo += c * a.stride[1][d];\n"
    "      }\n"
    "    }\n"
    "    i64 v = idx[io];\n"
    "    v = v < 0 ? 0 : v >= size ? size - 1 : v;\n"
    "    out[i] = x[xo + v * a.stride[1][a.axis]];\n"
    "  }\n"
    "}\n";

/* scatter_add: out[c] = a[c] + the src elements whose index (at the same
   coordinates, axis coordinate k) equals c's axis coordinate, added in k
   order — each output element sums exactly as vm/kern_index.c does, with
   no atomics.  stride[0][d] holds the index's extent along d (out is
   contiguous); a, idx, src strides in stride[1..3].  O(numel(out) x
   extent along axis): a sort-based kernel is the fast path to add. */
static const char scatter_kernel[] =
    "  typedef $T T;\n"
    "  typedef $U U;\n"
    "  T *out = (T *)a.ptr[0];\n"
    "  const T *x = (const T *)a.ptr[1], *src = (const T *)a.ptr[3];\n"
    "  const i64 *idx = (const i64 *)a.ptr[2];\n"
    "  const i64 K = a.stride[0][a.axis], is = a.stride[2][a.axis], ss = a.stride[3][a.axis];\n"
    "  " GRID_STRIDE
    " {\n"
    "    i64 rem = i, xo = 0, io = 0, so = 0, cax = 0;\n"
    "    bool inside = true;\n"
    "#pragma unroll\n"
    "    for (int d = K_MAX_DIMS - 1; d >= 0; d--) {\n"
    "      if (d < a.ndim) {\n"
    "        const i64 s = a.shape[d], q = rem / s, c = rem - q * s;\n"
    "        rem = q;\n"
    "        xo += c * a.stride[1][d];\n"
    "        if (d == a.axis) {\n"
    "          cax = c;\n"
    "        } else {\n"
    "          inside = inside && c < a.stride[0][d];\n"
    "          io += c * a.stride[2][d];\n"
    "          so += c * a.stride[3][d];\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "    T acc = x[xo];\n"
    "    if (inside)\n"
    "      for (i64 q = 0; q < K; q++)\n"
    "        if (idx[io + q * is] == cax) acc = $ADD;\n"
    "    out[i] = acc;\n"
    "  }\n"
    "}\n";

/* the index check: every index (a.n of them, over dims [0, ndim) with
   strides stride[1]) against [0, a.extent[0]) (a.extent[1]: the op's
   number, kept with a bad index); the first one out of range
   in row-major order goes into the gpu_index_check at a.ptr[0], its value
   written and the record sealed by the last block to finish, which also
   sets `done` back to 0 for the next check.  A sealed record (an earlier
   op's bad index, not yet read by the host) is left as it is: every block
   sees the same seal, since only a finished check writes it. */
static const char check_kernel[] =
    "  __shared__ u64 worst[8];\n"
    "  __shared__ bool last;\n"
    "  gpu_index_check *rec = (gpu_index_check *)a.ptr[0];\n"
    "  if (*(volatile u32 *)&rec->sealed) return;\n"
    "  const i64 *idx = (const i64 *)a.ptr[1];\n"
    "  const i64 size = a.extent[0];\n"
    "  u64 bad = 0; /* ~position: the largest is the first */\n"
    "  " GRID_STRIDE
    " {\n"
    "    const i64 v = idx[$CONTIG ? i : k_offset(a, 1, i, 0, a.ndim)];\n"
    "    if ((v < 0 || v >= size) && ~(u64)i > bad) bad = ~(u64)i;\n"
    "  }\n"
    "  for (int w = 16; w >= 1; w >>= 1) {\n"
    "    const u64 o = k_shfl_down(bad, w);\n"
    "    bad = o > bad ? o : bad;\n"
    "  }\n"
    "  if ((threadIdx.x & 31) == 0) worst[threadIdx.x >> 5] = bad;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    for (int w = 1; w < (int)(blockDim.x >> 5); w++) bad = worst[w] > bad ? worst[w] : bad;\n"
    "    if (bad) atomicMax(&rec->first, bad);\n"
    "    __threadfence();\n"
    "    last = atomicAdd(&rec->done, 1u) == gridDim.x - 1;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (last && threadIdx.x == 0) {\n"
    "    __threadfence();\n"
    "    const u64 first = atomicAdd(&rec->first, 0ull);\n"
    "    if (first) {\n"
    "      const i64 p = (i64)~first;\n"
    "      rec->value = idx[$CONTIG ? p : k_offset(a, 1, p, 0, a.ndim)];\n"
    "      rec->size = size;\n"
    "      rec->axis = a.axis;\n"
    "      rec->op = (u32)a.extent[1];\n"
    "      rec->sealed = 1u;\n"
    "    }\n"
    "    rec->done = 0u;\n"
    "  }\n"
    "}\n";

static void emit_index(sbuf *b, const gpu_op_key *k, const char *name) {
  kiln_dtype t = (kiln_dtype)k->out_dtype;
  kernel_open(b, name);
  if (k->variant == GPU_IDX_CHECK) {
    const char *vars[] = {"CONTIG", k->contiguous & 2 ? "true" : "false", NULL};
    sb_subst(b, check_kernel, vars);
    return;
  }
  if (k->op != VM_OP_scatter_add) {
    const char *vars[] = {"T", ctype[t], NULL};
    sb_subst(b, gather_kernel, vars);
    return;
  }
  const char *add = t == KILN_BOOL         ? "(T)(acc | src[so + q * ss])"
                    : vm_dtype_is_float(t) ? "acc + src[so + q * ss]"
                                           : "(T)((U)acc + (U)src[so + q * ss])";
  const char *vars[] = {"T", ctype[t], "U", utype[t], "ADD", add, NULL};
  sb_subst(b, scatter_kernel, vars);
}

/* Attention (vm/kern_attention.c's semantics; opgen.c: the gpu_args).  A
   row (a query's; a key's for DKDV) belongs to a group of G = $DM / 32
   adjacent threads of one warp; each holds 32 of the row's columns
   (columns part, part + G, ...: the group's threads read neighbouring
   words of a shared tile, no bank conflict) and its accumulators over
   them in registers ($DM = 64 or GPU_ATT_MAX_HEAD, zero-padded).  A dot
   product is each thread's partial sum, then a butterfly of xor shuffles,
   which leaves every thread of the group the same bits.  The block's
   threads stage tiles of $BK key (or query) rows in shared memory, which
   every group then reads at the same addresses (broadcasts).  Scores are
   (q . k) * scale, then masked (bool false or causal: -inf; a float mask
   added); a score of -inf gives probability 0 exactly, and a row with no
   key left gives 0.  Every thread of a warp runs every loop trip (the
   shuffles need all 32), a row past the end with zeros.
   FWD: an online softmax over the keys (running max m and sum l, the
   accumulator rescaled when m grows); only the tile ever exists, never
   the Tq x Tk scores.  The backward recomputes the probabilities from
   each row's logsumexp: ROWS writes (lse, D = rowsum(dO ∘ O)) per query
   row into scratch; DQ sums dS K per query row and DKDV sums Pᵀ dO and
   dSᵀ Q per key row, dS = P ∘ (dO Vᵀ - D).  Each sum runs in key (query)
   order: the same bits on every run. */
static const char att_head[] =
    "  typedef $T T;\n"
    "  enum { DM = $DM, BK = $BK, BR = $BR, G = DM / 32, DG = 32 };\n"
    "  const i64 tq = a.extent[0], tk = a.extent[1], d = a.extent[2], dv = a.extent[3];\n"
    "  const T scale = (T)a.scalar[0], ninf = $NINF;\n"
    "  const bool causal = a.flag & 1;\n"
    "  const i64 rows = $BYKEY ? tk : tq, nblk = (rows + BR - 1) / BR;\n"
    "  const i64 bt = blockIdx.x / nblk, r0 = (i64)(blockIdx.x % nblk) * BR;\n"
    "  const int part = (int)(threadIdx.x % G);\n"
    "  const i64 row = r0 + threadIdx.x / G;\n"
    "  const bool live = row < rows;\n"
    "  const T *Q = (const T *)a.ptr[1] + k_offset(a, 1, bt, 0, a.ndim);\n"
    "  const T *Kx = (const T *)a.ptr[2] + k_offset(a, 2, bt, 0, a.ndim);\n"
    "  const T *V = (const T *)a.ptr[3] + k_offset(a, 3, bt, 0, a.ndim);\n"
    "  const i64 qr = a.stride[1][6], qc = a.stride[1][7], kr = a.stride[2][6], kc = "
    "a.stride[2][7];\n"
    "  const i64 vr = a.stride[3][6], vc = a.stride[3][7];\n"
    "  /* the group's sum of x (every thread of it: the same bits) */\n"
    "  auto gsum = [](T x) -> T {\n"
    "#pragma unroll\n"
    "    for (int w = 1; w < G; w <<= 1) x += k_shfl_xor(x, w);\n"
    "    return x;\n"
    "  };\n"
    "$MASKDECL";

/* the mask (a.flag bits 1-2: none, bool, or a float added), read where
   query i meets key j: a uniform branch */
static const char att_mask_decl[] =
    "  const int mkind = a.flag >> 1;\n"
    "  const i64 mo = k_offset(a, 6, bt, 0, a.ndim), mr = a.stride[6][6], mc = a.stride[6][7];\n"
    "  const u8 *Mb = (const u8 *)a.ptr[6] + (mkind == 1 ? mo : 0);\n"
    "  const T *Mf = (const T *)a.ptr[6] + (mkind == 2 ? mo : 0);\n";
static const char att_mask_use[] =
    "      if (mkind == 1 && (!live || !Mb[i * mr + j * mc])) s = ninf;\n"
    "      if (mkind == 2 && live) s += Mf[i * mr + j * mc];\n";

/* the key tile [j0, j0 + nk) into ks (and vs), zero-padded to DM */
static const char att_load_keys[] =
    "    __syncthreads();\n"
    "    for (int e = threadIdx.x; e < BK * DM; e += BR * G) {\n"
    "      const int r = e / DM, c = e % DM;\n"
    "      ks[e] = r < nk && c < d ? Kx[(j0 + r) * kr + c * kc] : (T)0;\n"
    "      $LOADV\n"
    "    }\n"
    "    __syncthreads();\n";

/* s: query i's score for key j (the group's dot product), masked */
static const char att_score[] =
    "      T s = 0;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) s += $QE * $KE;\n"
    "      s = gsum(s) * scale;\n"
    "$MASK"
    "      if (causal && j > i) s = ninf;\n";

static const char att_query_row[] =
    "  const i64 i = row;\n"
    "  T q[DG];\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++) {\n"
    "    const int col = c * G + part;\n"
    "    q[c] = live && col < d ? Q[i * qr + col * qc] : (T)0;\n"
    "  }\n"
    "  /* causal: the block's keys end at its last query */\n"
    "  const i64 jend = causal && r0 + BR < tk ? r0 + BR : tk;\n";

/* the walk over the keys a query row sees, tile by tile: each key j's
   score s (the body follows, then two closing braces) */
static const char att_keys[] =
    "  for (i64 j0 = 0; j0 < jend; j0 += BK) {\n"
    "    const int nk = jend - j0 < BK ? (int)(jend - j0) : BK;\n"
    "$LOAD"
    "    for (int r = 0; r < nk; r++) {\n"
    "      const i64 j = j0 + r;\n"
    "$SCORE";

static const char att_fwd[] =
    "  __shared__ __attribute__((aligned(16))) T ks[BK * DM];\n"
    "  __shared__ __attribute__((aligned(16))) T vs[BK * DM];\n"
    "$QUERY"
    "  T acc[DG];\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++) acc[c] = 0;\n"
    "  T m = ninf, l = 0;\n"
    "$KEYS"
    "      if (s == ninf) continue;\n"
    "      if (s > m) {\n"
    "        const T alpha = m == ninf ? (T)0 : $EXP(m - s);\n"
    "        l *= alpha;\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < DG; c++) acc[c] *= alpha;\n"
    "        m = s;\n"
    "      }\n"
    "      const T p = $EXP(s - m);\n"
    "      l += p;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) acc[c] += p * vs[r * DM + c * G + part];\n"
    "    }\n"
    "  }\n"
    "  if (!live) return;\n"
    "  T *o = (T *)a.ptr[0] + (bt * tq + i) * dv;\n"
    "  const T inv = l > 0 ? (T)1 / l : (T)0; /* no key: 0 */\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++)\n"
    "    if (c * G + part < dv) o[c * G + part] = acc[c] * inv;\n"
    "}\n";

static const char att_rows[] =
    "  __shared__ __attribute__((aligned(16))) T ks[BK * DM];\n"
    "$QUERY"
    "  T m = ninf, l = 0;\n"
    "$KEYS"
    "      if (s == ninf) continue;\n"
    "      if (s > m) {\n"
    "        l *= m == ninf ? (T)0 : $EXP(m - s);\n"
    "        m = s;\n"
    "      }\n"
    "      l += $EXP(s - m);\n"
    "    }\n"
    "  }\n"
    "  const T *O = (const T *)a.ptr[4] + k_offset(a, 4, bt, 0, a.ndim) + i * a.stride[4][6];\n"
    "  const T *G_ = (const T *)a.ptr[5] + k_offset(a, 5, bt, 0, a.ndim) + i * a.stride[5][6];\n"
    "  T D = 0;\n"
    "  for (i64 c = part; live && c < dv; c += G) D += G_[c * a.stride[5][7]] * O[c * "
    "a.stride[4][7]];\n"
    "  D = gsum(D);\n"
    "  if (!live || part) return;\n"
    "  T *st = (T *)a.ptr[7] + (bt * tq + i) * 2;\n"
    "  st[0] = l > 0 ? m + $LOG(l) : ninf;\n"
    "  st[1] = D;\n"
    "}\n";

static const char att_dq[] =
    "  __shared__ __attribute__((aligned(16))) T ks[BK * DM];\n"
    "  __shared__ __attribute__((aligned(16))) T vs[BK * DM];\n"
    "$QUERY"
    "  const T *G_ = (const T *)a.ptr[5] + k_offset(a, 5, bt, 0, a.ndim);\n"
    "  T g[DG], dq[DG];\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++) {\n"
    "    const int col = c * G + part;\n"
    "    g[c] = live && col < dv ? G_[i * a.stride[5][6] + col * a.stride[5][7]] : (T)0;\n"
    "    dq[c] = 0;\n"
    "  }\n"
    "  const T *st = (const T *)a.ptr[7] + (bt * tq + (live ? i : 0)) * 2;\n"
    "  const T L = live ? st[0] : ninf, D = live ? st[1] : (T)0;\n"
    "$KEYS"
    "      T dp = 0;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) dp += g[c] * vs[r * DM + c * G + part];\n"
    "      dp = gsum(dp);\n"
    "      if (s == ninf || L == ninf) continue;\n"
    "      const T ds = $EXP(s - L) * (dp - D);\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) dq[c] += ds * ks[r * DM + c * G + part];\n"
    "    }\n"
    "  }\n"
    "  if (!live) return;\n"
    "  T *out = (T *)a.ptr[0] + (bt * tq + i) * d;\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++)\n"
    "    if (c * G + part < d) out[c * G + part] = dq[c] * scale;\n"
    "}\n";

static const char att_dkdv[] =
    "  __shared__ __attribute__((aligned(16))) T qs[BK * DM];\n"
    "  __shared__ __attribute__((aligned(16))) T gs[BK * DM];\n"
    "  __shared__ T Ls[BK], Ds[BK];\n"
    "  const i64 j = row;\n"
    "  const T *G_ = (const T *)a.ptr[5] + k_offset(a, 5, bt, 0, a.ndim);\n"
    "  const i64 gr = a.stride[5][6], gc = a.stride[5][7];\n"
    "  const T *st = (const T *)a.ptr[7] + bt * tq * 2;\n"
    "  T kv[DG], vv[DG], dk[DG], dw[DG];\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++) {\n"
    "    const int col = c * G + part;\n"
    "    kv[c] = live && col < d ? Kx[j * kr + col * kc] : (T)0;\n"
    "    vv[c] = live && col < dv ? V[j * vr + col * vc] : (T)0;\n"
    "    dk[c] = dw[c] = 0;\n"
    "  }\n"
    "  /* causal: queries before the block's first key see none of its keys */\n"
    "  const i64 istart = causal ? (r0 < tq ? r0 : tq) : 0;\n"
    "  for (i64 i0 = istart; i0 < tq; i0 += BK) {\n"
    "    const int nq = tq - i0 < BK ? (int)(tq - i0) : BK;\n"
    "    __syncthreads();\n"
    "    for (int e = threadIdx.x; e < BK * DM; e += BR * G) {\n"
    "      const int r = e / DM, c = e % DM;\n"
    "      qs[e] = r < nq && c < d ? Q[(i0 + r) * qr + c * qc] : (T)0;\n"
    "      gs[e] = r < nq && c < dv ? G_[(i0 + r) * gr + c * gc] : (T)0;\n"
    "    }\n"
    "    for (int r = threadIdx.x; r < BK; r += BR * G) {\n"
    "      Ls[r] = r < nq ? st[(i0 + r) * 2] : ninf;\n"
    "      Ds[r] = r < nq ? st[(i0 + r) * 2 + 1] : (T)0;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    for (int r = 0; r < nq; r++) {\n"
    "      const i64 i = i0 + r;\n"
    "$SCORE"
    "      T dp = 0;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) dp += gs[r * DM + c * G + part] * vv[c];\n"
    "      dp = gsum(dp);\n"
    "      const T L = Ls[r];\n"
    "      if (s == ninf || L == ninf) continue;\n"
    "      const T p = $EXP(s - L), ds = p * (dp - Ds[r]);\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DG; c++) {\n"
    "        dw[c] += p * gs[r * DM + c * G + part];\n"
    "        dk[c] += ds * qs[r * DM + c * G + part];\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "  if (!live) return;\n"
    "  const i64 nbatch = a.n;\n"
    "  T *dko = (T *)a.ptr[0] + nbatch * tq * d + (bt * tk + j) * d;\n"
    "  T *dvo = (T *)a.ptr[0] + nbatch * (tq + tk) * d + (bt * tk + j) * dv;\n"
    "#pragma unroll\n"
    "  for (int c = 0; c < DG; c++) {\n"
    "    const int col = c * G + part;\n"
    "    if (col < d) dko[col] = dk[c] * scale;\n"
    "    if (col < dv) dvo[col] = dw[c];\n"
    "  }\n"
    "}\n";

static void emit_attention(sbuf *b, const gpu_op_key *k, const char *name) {
  kiln_dtype t = (kiln_dtype)k->out_dtype;
  int pass = k->variant % GPU_ATT_WIDE;
  bool f32 = t == KILN_F32, by_key = pass == GPU_ATT_DKDV;
  char dm[8], bk[8], br[8];
  snprintf(dm, sizeof dm, "%d",
           k->variant & GPU_ATT_WIDE ? GPU_ATT_MAX_HEAD : GPU_ATT_MAX_HEAD / 2);
  snprintf(bk, sizeof bk, "%d", f32 ? 32 : 16); /* two tiles: 32 KB of shared memory at most */
  snprintf(br, sizeof br, "%d", GPU_ATT_ROWS_PER_BLOCK);
  const char *body = pass == GPU_ATT_FWD    ? att_fwd
                     : pass == GPU_ATT_ROWS ? att_rows
                     : pass == GPU_ATT_DQ   ? att_dq
                                            : att_dkdv;
  const char *vars[] = {
      "T",
      ctype[t],
      "DM",
      dm,
      "BK",
      bk,
      "BR",
      br,
      "NINF",
      f32 ? "-__int_as_float(0x7f800000)" : "-__longlong_as_double(0x7ff0000000000000ll)",
      "BYKEY",
      by_key ? "true" : "false",
      "MASKDECL",
      att_mask_decl,
      "MASK",
      att_mask_use,
      "EXP",
      f32 ? "expf" : "exp",
      "LOG",
      f32 ? "logf" : "log",
      "KEYS",
      att_keys,
      "QUERY",
      att_query_row,
      "LOAD",
      att_load_keys,
      "LOADV",
      pass == GPU_ATT_ROWS ? ""
                           : "vs[e] = r < nk && c < dv ? V[(j0 + r) * vr + c * vc] "
                             ": (T)0;",
      "SCORE",
      att_score,
      "QE",
      by_key ? "qs[r * DM + c * G + part]" : "q[c]",
      "KE",
      by_key ? "kv[c]" : "ks[r * DM + c * G + part]",
      NULL};
  kernel_open(b, name);
  sb_subst(b, att_head, vars);
  sb_subst(b, body, vars);
}

static void emit_kernel(sbuf *b, const gpu_op_key *k) {
  char name[96];
  gpu_op_key_name(k, name, sizeof name);
  vm_opcode op = (vm_opcode)k->op;
  kiln_dtype t = (kiln_dtype)k->in_dtype[0];
  switch (vm_op_table[op].kind) {
    case VM_KIND_LEAF:
      emit_leaf(b, k, name);
      return;
    case VM_KIND_UNARY:
    case VM_KIND_BINARY:
    case VM_KIND_TERNARY:
    case VM_KIND_CONCAT:
      emit_elementwise(b, k, name);
      return;
    case VM_KIND_REDUCE:
      if (op == VM_OP_argmax || op == VM_OP_argmin) {
        kernel_open(b, name);
        const char *vars[] = {"T",      ctype[t],
                              "CONTIG", k->contiguous & 2 ? "true" : "false",
                              "MAX",    op == VM_OP_argmax ? "true" : "false",
                              NULL};
        sb_subst(b, arg_kernel, vars);
      } else {
        emit_reduce(b, k, name);
      }
      return;
    case VM_KIND_MATMUL: {
      kernel_open(b, name);
      const char *vars[] = {"T", ctype[t], "U", utype[t], NULL};
      sb_subst(b, matmul_kernel, vars);
      return;
    }
    case VM_KIND_INDEX:
      emit_index(b, k, name);
      return;
    case VM_KIND_SORT: {
      kernel_open(b, name);
      const char *vars[] = {"T", ctype[t], "CONTIG", k->contiguous & 2 ? "true" : "false", NULL};
      sb_subst(b, sort_kernel, vars);
      return;
    }
    case VM_KIND_ATTENTION:
      emit_attention(b, k, name);
      return;
    case VM_KIND_VIEW:
    case VM_KIND_COLLECTIVE:
    case VM_KIND_CONV:
      return;
  }
}

char *gpu_op_source_batch(const gpu_op_key *keys, int n) {
  for (int i = 0; i < n; i++)
    if (!gpu_op_key_supported(&keys[i])) {
      char name[96];
      gpu_op_key_name(&keys[i], name, sizeof name);
      vm_error(KILN_ERR_INTERNAL, "no GPU kernel for key %s", name);
      return NULL;
    }
  sbuf b = {0};
  emit_prelude(&b);
  for (int i = 0; i < n; i++) emit_kernel(&b, &keys[i]);
  if (b.oom) {
    free(b.s);
    vm_error(KILN_ERR_OOM, "out of memory generating GPU kernel source");
    return NULL;
  }
  return b.s;
}

char *gpu_op_source(const gpu_op_key *k) { return gpu_op_source_batch(k, 1); }

/* --- shared with fuse.c (src.h) --------------------------------------------------- */

void gpu_src_put(gpu_src *b, const char *s) { sb_put(b, s, strlen(s)); }

void gpu_src_prelude(gpu_src *b) { emit_prelude(b); }

const char *gpu_src_ctype(kiln_dtype dt) { return ctype[dt]; }

void gpu_src_reduce(gpu_src *b, vm_opcode op, kiln_dtype t, int variant, const char *src,
                    const char *item, const char *store) {
  reduce_body(b, op, t, variant, false, src, item, store);
}

void gpu_src_row_fold(gpu_src *b, vm_opcode op, kiln_dtype t, int pass, const char *ld,
                      const char *dst) {
  kiln_dtype acc = vm_fold_acc_dtype(op, t);
  char block[32], lanes[32], nblk[32], k[16];
  snprintf(block, sizeof block, "%d", VM_FOLD_BLOCK);
  snprintf(nblk, sizeof nblk, "%d", (int)(VM_FOLD_CHUNK / VM_FOLD_BLOCK));
  snprintf(k, sizeof k, "%d", pass);
  int per_thread = vm_dtype_is_float(t) ? VM_FOLD_LANE_BYTES / (int)vm_dtype_size(acc) / 32 : 1;
  snprintf(lanes, sizeof lanes, "%d", 32 * per_thread);
  bool two = per_thread == 2;
  const char *vars[] = {
      "T",       ctype[t],
      "A",       ctype[acc],
      "NBLK",    nblk,
      "BLOCK",   block,
      "K",       k,
      "INIT",    reduce_init(op, acc),
      "COMB",    reduce_comb(op),
      "L",       lanes,
      "LD",      ld,
      "DST",     dst,
      "L1_DECL", two ? "          A l1 = $INIT;\n" : "",
      "L1_STEP", two ? "            l1 = $COMB(l1, (A)$LD(pb + r + lane + 32));\n" : "",
      "L1_JOIN", two ? "          l0 = $COMB(l0, l1);\n" : "",
      NULL};
  sb_subst(b, row_fold, vars);
}

bool gpu_src_reduce_supported(vm_opcode op, kiln_dtype t) {
  gpu_op_key k = {.op = (uint16_t)op, .nin = 1, .out_dtype = (uint8_t)t, .in_dtype = {(uint8_t)t}};
  return vm_op_table[op].kind == VM_KIND_REDUCE && op != VM_OP_argmax && op != VM_OP_argmin &&
         gpu_op_key_supported(&k);
}

bool gpu_src_node_supported(vm_opcode op, kiln_dtype out, int nin, const kiln_dtype *in) {
  vm_kind kind = vm_op_table[op].kind;
  if (kind != VM_KIND_UNARY && kind != VM_KIND_BINARY && kind != VM_KIND_TERNARY) return false;
  gpu_op_key k = {.op = (uint16_t)op, .nin = (uint8_t)nin, .out_dtype = (uint8_t)out};
  for (int i = 0; i < nin && i < 3; i++) k.in_dtype[i] = (uint8_t)in[i];
  return nin <= 3 && gpu_op_key_supported(&k);
}

void gpu_src_node(gpu_src *b, vm_opcode op, kiln_dtype out, int nin, const kiln_dtype *in,
                  const char *const *args, const char *dst) {
  kiln_dtype t = in[nin == 3 ? 1 : 0]; /* the compute type, as emit_elementwise */
  gpu_src_printf(b, "{ typedef %s T; typedef %s U; typedef %s TO; ", comp[t], utype[t], ctype[out]);
  if (nin == 3)
    gpu_src_printf(b, "const u8 c = %s; const T x = %s, y = %s; ", args[0], args[1], args[2]);
  else if (nin == 2)
    gpu_src_printf(b, "const T x = %s, y = %s; ", args[0], args[1]);
  else
    gpu_src_printf(b, "const T x = %s; ", args[0]);
  gpu_src_printf(b, "%s = (TO)(", dst);
  if (op == VM_OP_cast) {
    cast_expr(b, t, out);
  } else {
    const char *vars[] = {"F", fsfx(t), NULL};
    sb_subst(b, elementwise_expr(op, t), vars);
  }
  gpu_src_printf(b, "); }\n");
}
