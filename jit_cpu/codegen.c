/* codegen.c — kernel groups -> libgccjit functions.  An elementwise group
 * becomes one function over the group's iteration space:
 *
 *   for each row in [begin, end):            (rows of the coalesced space)
 *     offsets of every input from the row's multi-index
 *     for j in the row:                      (the inner loop GCC vectorizes)
 *       load inputs (unit stride, broadcast, or strided, as compiled for)
 *       evaluate the group's nodes in order; store its outputs
 *
 * Views inside a group are evaluated by the interpreter first (they move no
 * data) and arrive as strided inputs.  Selects are small if-blocks, which
 * GCC if-converts (libgccjit has no ?:).  Every kernel is emitted from its
 * own description (kdesc.c), whose hash keys the kernel cache. */
#include "codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "math.h"

_Static_assert((int)CG_EXP == (int)CPU_EXP && (int)CG_POW == (int)CPU_POW &&
                   (int)CG_FN_COUNT == (int)CPU_FN_COUNT,
               "cg_fn mirrors cpu_fn");

/* --- types and small helpers -------------------------------------------------- */

void cg_init_types(cg_ctx *c) {
  gcc_jit_context *x = c->ctx;
  c->t_void = gcc_jit_context_get_type(x, GCC_JIT_TYPE_VOID);
  c->t_bool = gcc_jit_context_get_type(x, GCC_JIT_TYPE_BOOL);
  c->t_int = gcc_jit_context_get_type(x, GCC_JIT_TYPE_INT);
  c->t_i32 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_INT32_T);
  c->t_i64 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_INT64_T);
  c->t_u32 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_UINT32_T);
  c->t_u64 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_UINT64_T);
  c->t_f32 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_FLOAT);
  c->t_f64 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_DOUBLE);
  c->t_u8 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_UINT8_T);
  c->t_u16 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_UINT16_T);
  c->t_i8 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_INT8_T);
  c->t_i16 = gcc_jit_context_get_type(x, GCC_JIT_TYPE_INT16_T);
  c->t_voidp = gcc_jit_context_get_type(x, GCC_JIT_TYPE_VOID_PTR);
  c->t_voidpp = gcc_jit_type_get_pointer(c->t_voidp);
  c->t_i64p = gcc_jit_type_get_pointer(gcc_jit_type_get_const(c->t_i64));
}

gcc_jit_type *cg_type(cg_ctx *c, kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
      return c->t_bool;
    case KILN_I32:
      return c->t_i32;
    case KILN_I64:
      return c->t_i64;
    case KILN_F32:
      return c->t_f32;
    case KILN_F64:
      return c->t_f64;
    case KILN_BF16:
    case KILN_F16:
      return c->t_f32;
    case KILN_U8:
      return c->t_u8;
    case KILN_I8:
      return c->t_i8;
    case KILN_I16:
      return c->t_i16;
  }
  return c->t_f32;
}

void cg_int_range(kiln_dtype dt, long *min, long *max) {
  switch (dt) {
    case KILN_U8:
      *min = 0, *max = UINT8_MAX;
      break;
    case KILN_I8:
      *min = INT8_MIN, *max = INT8_MAX;
      break;
    case KILN_I16:
      *min = INT16_MIN, *max = INT16_MAX;
      break;
    case KILN_I32:
      *min = INT32_MIN, *max = INT32_MAX;
      break;
    default:
      *min = INT64_MIN, *max = INT64_MAX;
  }
}

gcc_jit_type *cg_mem_type(cg_ctx *c, kiln_dtype dt) {
  return vm_dtype_is_half(dt) ? c->t_u16 : cg_type(c, dt);
}

static gcc_jit_type *unsigned_of(cg_ctx *c, kiln_dtype dt) {
  switch (vm_dtype_size(dt)) {
    case 1:
      return c->t_u8;
    case 2:
      return c->t_u16;
    case 4:
      return c->t_u32;
    default:
      return c->t_u64;
  }
}

static gcc_jit_rvalue *num(cg_ctx *c, gcc_jit_type *t, double v) {
  return gcc_jit_context_new_rvalue_from_double(c->ctx, t, v);
}

static gcc_jit_rvalue *bin(cg_ctx *c, enum gcc_jit_binary_op op, gcc_jit_type *t, gcc_jit_rvalue *a,
                           gcc_jit_rvalue *b) {
  return gcc_jit_context_new_binary_op(c->ctx, NULL, op, t, a, b);
}

static gcc_jit_rvalue *cmp(cg_ctx *c, enum gcc_jit_comparison op, gcc_jit_rvalue *a,
                           gcc_jit_rvalue *b) {
  return gcc_jit_context_new_comparison(c->ctx, NULL, op, a, b);
}

static gcc_jit_rvalue *cast(cg_ctx *c, gcc_jit_rvalue *v, gcc_jit_type *t) {
  return gcc_jit_context_new_cast(c->ctx, NULL, v, t);
}

static gcc_jit_lvalue *local(cg_ctx *c, gcc_jit_type *t, const char *name) {
  char buf[48];
  snprintf(buf, sizeof buf, "%s%d", name, c->nlocals++);
  return gcc_jit_function_new_local(c->fn, NULL, t, buf);
}

static gcc_jit_block *block(cg_ctx *c, const char *name) {
  char buf[48];
  snprintf(buf, sizeof buf, "%s%d", name, c->nblocks++);
  return gcc_jit_function_new_block(c->fn, buf);
}

static void assign(cg_ctx *c, gcc_jit_lvalue *l, gcc_jit_rvalue *r) {
  gcc_jit_block_add_assignment(c->cur, NULL, l, r);
}

/* if (cond) { lv = then_value; } — a small block GCC if-converts */
static void assign_if(cg_ctx *c, gcc_jit_rvalue *cond, gcc_jit_lvalue *lv, gcc_jit_rvalue *value) {
  gcc_jit_block *then = block(c, "then"), *join = block(c, "join");
  gcc_jit_block_end_with_conditional(c->cur, NULL, cond, then, join);
  gcc_jit_block_add_assignment(then, NULL, lv, value);
  gcc_jit_block_end_with_jump(then, NULL, join);
  c->cur = join;
}

static gcc_jit_rvalue *builtin1(cg_ctx *c, const char *name, gcc_jit_rvalue *x) {
  gcc_jit_function *f = gcc_jit_context_get_builtin_function(c->ctx, name);
  return gcc_jit_context_new_call(c->ctx, NULL, f, 1, &x);
}

/* --- bf16 / f16 <-> f32: vm/half.h's steps on 32-bit integers ------------------------
   Branches of half.h become bit selects (every value is computed, a mask
   picks one), so the loops stay vectorizable; a shift whose value is not
   picked still gets a count in [1, 31]. */

static gcc_jit_rvalue *u32c(cg_ctx *c, uint32_t v) {
  return gcc_jit_context_new_rvalue_from_long(c->ctx, c->t_u32, (long)v);
}

static gcc_jit_rvalue *u32op(cg_ctx *c, enum gcc_jit_binary_op op, gcc_jit_rvalue *a,
                             gcc_jit_rvalue *b) {
  return bin(c, op, c->t_u32, a, b);
}

/* a local holding v, so a value used several times is computed once */
static gcc_jit_rvalue *u32var(cg_ctx *c, gcc_jit_rvalue *v, const char *name) {
  gcc_jit_lvalue *l = local(c, c->t_u32, name);
  assign(c, l, v);
  return gcc_jit_lvalue_as_rvalue(l);
}

/* cond ? a : b on u32 values (bool cond), by masks */
static gcc_jit_rvalue *u32pick(cg_ctx *c, gcc_jit_rvalue *cond, gcc_jit_rvalue *a,
                               gcc_jit_rvalue *b) {
  gcc_jit_rvalue *m = u32var(c,
                             cast(c,
                                  gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_MINUS,
                                                               c->t_int, cast(c, cond, c->t_int)),
                                  c->t_u32),
                             "hm");
  gcc_jit_rvalue *nm =
      gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_BITWISE_NEGATE, c->t_u32, m);
  return u32op(c, GCC_JIT_BINARY_OP_BITWISE_OR, u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND, a, m),
               u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND, b, nm));
}

static gcc_jit_rvalue *as_u32(cg_ctx *c, gcc_jit_rvalue *b) {
  return cast(c, cast(c, b, c->t_int), c->t_u32);
}

static gcc_jit_rvalue *f32_of_bits(cg_ctx *c, gcc_jit_rvalue *u) {
  return gcc_jit_context_new_bitcast(c->ctx, NULL, u, c->t_f32);
}

static gcc_jit_rvalue *bits_of_f32(cg_ctx *c, gcc_jit_rvalue *x) {
  return gcc_jit_context_new_bitcast(c->ctx, NULL, x, c->t_u32);
}

#define SHL(a, n) u32op(c, GCC_JIT_BINARY_OP_LSHIFT, a, n)
#define SHR(a, n) u32op(c, GCC_JIT_BINARY_OP_RSHIFT, a, n)
#define AND(a, b) u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND, a, b)
#define OR(a, b) u32op(c, GCC_JIT_BINARY_OP_BITWISE_OR, a, b)
#define ADD(a, b) u32op(c, GCC_JIT_BINARY_OP_PLUS, a, b)
#define SUB(a, b) u32op(c, GCC_JIT_BINARY_OP_MINUS, a, b)
#define GT(a, b) cmp(c, GCC_JIT_COMPARISON_GT, a, b)
#define GE(a, b) cmp(c, GCC_JIT_COMPARISON_GE, a, b)
#define LT(a, b) cmp(c, GCC_JIT_COMPARISON_LT, a, b)
#define EQ(a, b) cmp(c, GCC_JIT_COMPARISON_EQ, a, b)
#define NE(a, b) cmp(c, GCC_JIT_COMPARISON_NE, a, b)

static gcc_jit_rvalue *bf16_to_f32(cg_ctx *c, gcc_jit_rvalue *h) {
  return f32_of_bits(c, SHL(cast(c, h, c->t_u32), u32c(c, 16)));
}

static gcc_jit_rvalue *f16_to_f32(cg_ctx *c, gcc_jit_rvalue *h) {
  gcc_jit_rvalue *w = u32var(c, cast(c, h, c->t_u32), "hw");
  gcc_jit_rvalue *sign = u32var(c, SHL(AND(w, u32c(c, 0x8000u)), u32c(c, 16)), "hs");
  gcc_jit_rvalue *e = u32var(c, AND(SHR(w, u32c(c, 10)), u32c(c, 0x1fu)), "he");
  gcc_jit_rvalue *m = u32var(c, AND(w, u32c(c, 0x3ffu)), "hm");
  gcc_jit_rvalue *normal =
      OR(OR(sign, SHL(ADD(e, u32c(c, 112)), u32c(c, 23))), SHL(m, u32c(c, 13)));
  gcc_jit_rvalue *special = OR(OR(OR(sign, u32c(c, 0x7f800000u)), SHL(m, u32c(c, 13))),
                               SHL(as_u32(c, NE(m, u32c(c, 0))), u32c(c, 22)));
  gcc_jit_rvalue *sub =
      OR(sign, bits_of_f32(c, bin(c, GCC_JIT_BINARY_OP_MULT, c->t_f32, cast(c, m, c->t_f32),
                                  num(c, c->t_f32, 5.9604644775390625e-8))));
  gcc_jit_rvalue *r = u32pick(c, EQ(e, u32c(c, 0)), sub, normal);
  return f32_of_bits(c, u32pick(c, EQ(e, u32c(c, 0x1f)), special, r));
}

static gcc_jit_rvalue *f32_to_f16(cg_ctx *c, gcc_jit_rvalue *x) {
  gcc_jit_rvalue *u = u32var(c, bits_of_f32(c, x), "fu");
  gcc_jit_rvalue *sign = u32var(c, AND(SHR(u, u32c(c, 16)), u32c(c, 0x8000u)), "fs");
  gcc_jit_rvalue *a = u32var(c, AND(u, u32c(c, 0x7fffffffu)), "fa");
  gcc_jit_rvalue *nanv = OR(OR(sign, u32c(c, 0x7e00u)), AND(SHR(a, u32c(c, 13)), u32c(c, 0x3ffu)));
  gcc_jit_rvalue *infv = OR(sign, u32c(c, 0x7c00u));
  gcc_jit_rvalue *normv = OR(sign, SHR(ADD(ADD(SUB(a, u32c(c, 0x38000000u)), u32c(c, 0xfffu)),
                                           AND(SHR(a, u32c(c, 13)), u32c(c, 1))),
                                       u32c(c, 13)));
  /* a subnormal: e in [102, 112] picks it; e clamped to [102, 125] keeps
     the shift in [1, 24] for the values not picked */
  gcc_jit_rvalue *e = u32var(c, SHR(a, u32c(c, 23)), "fe");
  gcc_jit_rvalue *ec = u32var(c, u32pick(c, LT(e, u32c(c, 102)), u32c(c, 102), e), "fc");
  ec = u32var(c, u32pick(c, GT(ec, u32c(c, 125)), u32c(c, 125), ec), "fc");
  gcc_jit_rvalue *shift = u32var(c, SUB(u32c(c, 126), ec), "fsh");
  gcc_jit_rvalue *m = u32var(c, OR(AND(a, u32c(c, 0x7fffffu)), u32c(c, 0x800000u)), "fm");
  gcc_jit_rvalue *q = u32var(c, SHR(m, shift), "fq");
  gcc_jit_rvalue *rem = u32var(c, AND(m, SUB(SHL(u32c(c, 1), shift), u32c(c, 1))), "fr");
  gcc_jit_rvalue *half = u32var(c, SHL(u32c(c, 1), SUB(shift, u32c(c, 1))), "fh");
  gcc_jit_rvalue *up = OR(as_u32(c, GT(rem, half)), AND(as_u32(c, EQ(rem, half)), q));
  gcc_jit_rvalue *subv = OR(sign, ADD(q, up));
  gcc_jit_rvalue *r = u32pick(c, LT(e, u32c(c, 102)), sign, subv);
  r = u32pick(c, GE(a, u32c(c, 0x38800000u)), normv, r);
  r = u32pick(c, GE(a, u32c(c, 0x477ff000u)), infv, r);
  r = u32pick(c, GT(a, u32c(c, 0x7f800000u)), nanv, r);
  return cast(c, r, c->t_u16);
}

#undef SHL
#undef SHR
#undef AND
#undef OR
#undef ADD
#undef SUB
#undef GT
#undef GE
#undef LT
#undef EQ
#undef NE

gcc_jit_rvalue *cg_load(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *stored) {
  if (dt == KILN_BF16) return bf16_to_f32(c, stored);
  if (dt == KILN_F16) return f16_to_f32(c, stored);
  return stored;
}

/* a value that is exactly a half's (every half node's value is: loads
   widen, ops round): a bf16 is the f32's top half; an f16 goes through the
   conversion (exact for such a value) */
gcc_jit_rvalue *cg_store(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *value) {
  if (dt == KILN_BF16)
    return cast(c, u32op(c, GCC_JIT_BINARY_OP_RSHIFT, bits_of_f32(c, value), u32c(c, 16)),
                c->t_u16);
  if (dt == KILN_F16) return f32_to_f16(c, value);
  return value;
}

/* x rounded to bf16 and widened back, in one: f32_to_bf16's steps with
   the low half masked off instead of shifted out and back */
static gcc_jit_rvalue *round_bf16(cg_ctx *c, gcc_jit_rvalue *x) {
  gcc_jit_rvalue *u = u32var(c, bits_of_f32(c, x), "ru");
  gcc_jit_rvalue *nan =
      cmp(c, GCC_JIT_COMPARISON_GT,
          u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND, u, u32c(c, 0x7fffffffu)), u32c(c, 0x7f800000u));
  gcc_jit_rvalue *lsb = u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND,
                              u32op(c, GCC_JIT_BINARY_OP_RSHIFT, u, u32c(c, 16)), u32c(c, 1));
  gcc_jit_rvalue *near =
      u32op(c, GCC_JIT_BINARY_OP_PLUS, u32op(c, GCC_JIT_BINARY_OP_PLUS, u, u32c(c, 0x7fffu)), lsb);
  gcc_jit_rvalue *quiet = u32op(c, GCC_JIT_BINARY_OP_BITWISE_OR, u, u32c(c, 0x00400000u));
  gcc_jit_rvalue *r =
      u32op(c, GCC_JIT_BINARY_OP_BITWISE_AND, u32pick(c, nan, quiet, near), u32c(c, 0xffff0000u));
  return f32_of_bits(c, r);
}

/* an f32 value rounded to dt's precision, as storing and loading it does */
static gcc_jit_rvalue *round_to(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *x) {
  if (!x) return NULL;
  if (dt == KILN_BF16) return round_bf16(c, x);
  if (dt == KILN_F16) return f16_to_f32(c, f32_to_f16(c, x));
  return x;
}

/* --- elementwise expressions ------------------------------------------------------ */

/* float -> integer as the interpreter does it: NaN -> 0, out of range
   saturates, otherwise truncation (never C's undefined conversion) */
static gcc_jit_rvalue *saturating_to_int(cg_ctx *c, gcc_jit_rvalue *x, kiln_dtype from,
                                         kiln_dtype to) {
  gcc_jit_type *ft = cg_type(c, from), *it = cg_type(c, to);
  long min, max;
  cg_int_range(to, &min, &max);
  double lo = (double)min, hi = (double)max; /* 2^63 - 1 rounds up to 2^63: >= saturates */
  gcc_jit_lvalue *v = local(c, ft, "satv"), *res = local(c, it, "satr");
  gcc_jit_lvalue *big = local(c, c->t_bool, "big");
  assign(c, v, x);
  assign_if(c, cmp(c, GCC_JIT_COMPARISON_NE, x, x), v, num(c, ft, 0)); /* NaN -> 0 */
  assign_if(c, cmp(c, GCC_JIT_COMPARISON_LE, gcc_jit_lvalue_as_rvalue(v), num(c, ft, lo)), v,
            num(c, ft, lo)); /* -2^31 / -2^63 convert exactly */
  assign(c, big, cmp(c, GCC_JIT_COMPARISON_GE, gcc_jit_lvalue_as_rvalue(v), num(c, ft, hi)));
  assign_if(c, gcc_jit_lvalue_as_rvalue(big), v, num(c, ft, 0));
  assign(c, res, cast(c, gcc_jit_lvalue_as_rvalue(v), it));
  assign_if(c, gcc_jit_lvalue_as_rvalue(big), res,
            gcc_jit_context_new_rvalue_from_long(c->ctx, it, max));
  return gcc_jit_lvalue_as_rvalue(res);
}

static gcc_jit_rvalue *emit_cast(cg_ctx *c, gcc_jit_rvalue *x, kiln_dtype from, kiln_dtype to) {
  if (from == to) return round_to(c, to, x); /* a copy: a NaN quieted, as the interpreter's */
  /* a half's value is an f32 (cg_load); to a half: through f32, rounded */
  if (vm_dtype_is_half(from)) from = KILN_F32;
  if (vm_dtype_is_half(to)) {
    gcc_jit_rvalue *f = from == KILN_F32 ? x : emit_cast(c, x, from, KILN_F32);
    return round_to(c, to, f);
  }
  if (to == KILN_BOOL)
    return cmp(c, GCC_JIT_COMPARISON_NE, x, gcc_jit_context_zero(c->ctx, cg_type(c, from)));
  if (from == KILN_BOOL)
    return cast(c, cast(c, x, c->t_int), cg_type(c, to)); /* libgccjit: bool -> int only */
  if (vm_dtype_is_float(from) && vm_dtype_is_int(to)) return saturating_to_int(c, x, from, to);
  return cast(c, x, cg_type(c, to));
}

static gcc_jit_rvalue *wrap_int(cg_ctx *c, enum gcc_jit_binary_op op, kiln_dtype dt,
                                gcc_jit_rvalue *a, gcc_jit_rvalue *b) {
  gcc_jit_type *u = unsigned_of(c, dt);
  return cast(c, bin(c, op, u, cast(c, a, u), cast(c, b, u)), cg_type(c, dt));
}

/* pick_value(cond, a, b): a if cond else b, without a branch: the bits of
   a under an all-ones mask, b's under its complement.  An if-block here
   (the first version) put the load of a inside the branch, where GCC may
   not if-convert it (the load could trap); so the loop stayed scalar with a
   branch that a relu mask mispredicts half the time: W7's where(mask, g, 0)
   ran at 1.5 ns an element.  The bit select vectorizes, picks the same bits
   (NaN payloads included) and both values are pure, so computing both is
   always allowed. */
static gcc_jit_rvalue *pick_value(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *cond, gcc_jit_rvalue *a,
                                  gcc_jit_rvalue *b) {
  if (dt == KILN_BOOL)
    return bin(c, GCC_JIT_BINARY_OP_BITWISE_OR, c->t_bool,
               bin(c, GCC_JIT_BINARY_OP_BITWISE_AND, c->t_bool, cond, a),
               bin(c, GCC_JIT_BINARY_OP_BITWISE_AND, c->t_bool,
                   gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_LOGICAL_NEGATE,
                                                c->t_bool, cond),
                   b));
  bool wide = dt == KILN_F64 || dt == KILN_I64, fl = vm_dtype_is_float(dt);
  gcc_jit_type *u = wide ? c->t_u64 : c->t_u32, *t = cg_type(c, dt);
  gcc_jit_lvalue *m = local(c, u, "mask");
  gcc_jit_rvalue *neg = gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_MINUS, c->t_int,
                                                     cast(c, cond, c->t_int));
  assign(c, m, cast(c, neg, u)); /* 0 or all ones (int -1 widens to all ones) */
  gcc_jit_rvalue *mv = gcc_jit_lvalue_as_rvalue(m);
  gcc_jit_rvalue *ua = fl ? gcc_jit_context_new_bitcast(c->ctx, NULL, a, u) : cast(c, a, u);
  gcc_jit_rvalue *ub = fl ? gcc_jit_context_new_bitcast(c->ctx, NULL, b, u) : cast(c, b, u);
  gcc_jit_rvalue *r =
      bin(c, GCC_JIT_BINARY_OP_BITWISE_OR, u, bin(c, GCC_JIT_BINARY_OP_BITWISE_AND, u, ua, mv),
          bin(c, GCC_JIT_BINARY_OP_BITWISE_AND, u, ub,
              gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_BITWISE_NEGATE, u, mv)));
  return fl ? gcc_jit_context_new_bitcast(c->ctx, NULL, r, t) : cast(c, r, t);
}

gcc_jit_rvalue *cg_pick(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *cond, gcc_jit_rvalue *a,
                        gcc_jit_rvalue *b) {
  return pick_value(c, dt, cond, a, b);
}

static gcc_jit_rvalue *emit_unary(cg_ctx *c, vm_opcode op, kiln_dtype dt, gcc_jit_rvalue *x) {
  gcc_jit_type *t = cg_type(c, dt);
  bool fl = vm_dtype_is_float(dt), f64 = dt == KILN_F64;
  switch (op) {
    case VM_OP_copy:
      return x;
    case VM_OP_neg:
      if (fl) return gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_MINUS, t, x);
      return wrap_int(c, GCC_JIT_BINARY_OP_MINUS, dt, gcc_jit_context_zero(c->ctx, t), x);
    case VM_OP_abs:
      if (dt == KILN_BOOL) return x;
      if (fl) return builtin1(c, f64 ? "__builtin_fabs" : "__builtin_fabsf", x);
      return pick_value(
          c, dt, cmp(c, GCC_JIT_COMPARISON_LT, x, gcc_jit_context_zero(c->ctx, t)),
          wrap_int(c, GCC_JIT_BINARY_OP_MINUS, dt, gcc_jit_context_zero(c->ctx, t), x), x);
    case VM_OP_sign: {
      if (dt == KILN_BOOL) return x;
      gcc_jit_rvalue *zero = gcc_jit_context_zero(c->ctx, t);
      gcc_jit_rvalue *s = bin(c, GCC_JIT_BINARY_OP_MINUS, c->t_int,
                              cast(c, cmp(c, GCC_JIT_COMPARISON_GT, x, zero), c->t_int),
                              cast(c, cmp(c, GCC_JIT_COMPARISON_LT, x, zero), c->t_int));
      gcc_jit_rvalue *r = cast(c, s, t);
      return fl ? pick_value(c, dt, cmp(c, GCC_JIT_COMPARISON_NE, x, x), x, r) : r;
    }
    case VM_OP_floor:
    case VM_OP_ceil:
    case VM_OP_round: {
      if (!fl) return x;
      static const char *names[3][2] = {{"__builtin_floorf", "__builtin_floor"},
                                        {"__builtin_ceilf", "__builtin_ceil"},
                                        {"__builtin_nearbyintf", "__builtin_nearbyint"}};
      int which = op == VM_OP_floor ? 0 : op == VM_OP_ceil ? 1 : 2;
      return builtin1(c, names[which][f64], x);
    }
    case VM_OP_logical_not:
      return gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_LOGICAL_NEGATE, c->t_bool,
                                          x);
    case VM_OP_exp:
      return cg_math(c, CG_EXP, f64, x, NULL);
    case VM_OP_log:
      return cg_math(c, CG_LOG, f64, x, NULL);
    case VM_OP_sqrt:
      return cg_math(c, CG_SQRT, f64, x, NULL);
    case VM_OP_rsqrt:
      return cg_math(c, CG_RSQRT, f64, x, NULL);
    case VM_OP_sin:
      return cg_math(c, CG_SIN, f64, x, NULL);
    case VM_OP_cos:
      return cg_math(c, CG_COS, f64, x, NULL);
    case VM_OP_tanh:
      return cg_math(c, CG_TANH, f64, x, NULL);
    case VM_OP_sigmoid:
      return cg_math(c, CG_SIGMOID, f64, x, NULL);
    case VM_OP_erf:
      return cg_math(c, CG_ERF, f64, x, NULL);
    case VM_OP_log1p:
      return cg_math(c, CG_LOG1P, f64, x, NULL);
    case VM_OP_expm1:
      return cg_math(c, CG_EXPM1, f64, x, NULL);
    default:
      return NULL;
  }
}

static gcc_jit_rvalue *emit_binary(cg_ctx *c, vm_opcode op, kiln_dtype dt, gcc_jit_rvalue *x,
                                   gcc_jit_rvalue *y) {
  gcc_jit_type *t = cg_type(c, dt);
  bool fl = vm_dtype_is_float(dt), b8 = dt == KILN_BOOL;
  static const enum gcc_jit_comparison cmps[] = {GCC_JIT_COMPARISON_EQ, GCC_JIT_COMPARISON_NE,
                                                 GCC_JIT_COMPARISON_LT, GCC_JIT_COMPARISON_LE,
                                                 GCC_JIT_COMPARISON_GT, GCC_JIT_COMPARISON_GE};
  switch (op) {
    case VM_OP_add:
      if (b8) return bin(c, GCC_JIT_BINARY_OP_LOGICAL_OR, t, x, y);
      return fl ? bin(c, GCC_JIT_BINARY_OP_PLUS, t, x, y)
                : wrap_int(c, GCC_JIT_BINARY_OP_PLUS, dt, x, y);
    case VM_OP_sub:
      return fl ? bin(c, GCC_JIT_BINARY_OP_MINUS, t, x, y)
                : wrap_int(c, GCC_JIT_BINARY_OP_MINUS, dt, x, y);
    case VM_OP_mul:
      if (b8) return bin(c, GCC_JIT_BINARY_OP_LOGICAL_AND, t, x, y);
      return fl ? bin(c, GCC_JIT_BINARY_OP_MULT, t, x, y)
                : wrap_int(c, GCC_JIT_BINARY_OP_MULT, dt, x, y);
    case VM_OP_div:
      return fl ? bin(c, GCC_JIT_BINARY_OP_DIVIDE, t, x, y) : NULL;
    case VM_OP_pow:
      return fl ? cg_math(c, CG_POW, dt == KILN_F64, x, y) : NULL;
    case VM_OP_maximum:
    case VM_OP_minimum: {
      if (b8)
        return bin(
            c, op == VM_OP_maximum ? GCC_JIT_BINARY_OP_LOGICAL_OR : GCC_JIT_BINARY_OP_LOGICAL_AND,
            t, x, y);
      gcc_jit_rvalue *pick =
          cmp(c, op == VM_OP_maximum ? GCC_JIT_COMPARISON_GT : GCC_JIT_COMPARISON_LT, x, y);
      if (fl) { /* equal values: -0 < +0 (vm/fold.h's VM_FMAX / VM_FMIN) */
        gcc_jit_type *it = dt == KILN_F64 ? c->t_i64 : c->t_i32;
        gcc_jit_rvalue *ysign =
            cmp(c, op == VM_OP_maximum ? GCC_JIT_COMPARISON_LT : GCC_JIT_COMPARISON_GE,
                gcc_jit_context_new_bitcast(c->ctx, NULL, y, it), gcc_jit_context_zero(c->ctx, it));
        gcc_jit_rvalue *tie = bin(c, GCC_JIT_BINARY_OP_BITWISE_AND, c->t_bool,
                                  cmp(c, GCC_JIT_COMPARISON_EQ, x, y), ysign);
        pick = bin(c, GCC_JIT_BINARY_OP_BITWISE_OR, c->t_bool, pick, tie);
      }
      gcc_jit_rvalue *r = pick_value(c, dt, pick, x, y);
      return fl ? pick_value(c, dt, cmp(c, GCC_JIT_COMPARISON_NE, x, x), x, r) : r; /* NaN wins */
    }
    case VM_OP_eq:
    case VM_OP_ne:
    case VM_OP_lt:
    case VM_OP_le:
    case VM_OP_gt:
    case VM_OP_ge:
      return cmp(c, cmps[op - VM_OP_eq], x, y);
    case VM_OP_logical_and:
      return bin(c, GCC_JIT_BINARY_OP_LOGICAL_AND, c->t_bool, x, y);
    case VM_OP_logical_or:
      return bin(c, GCC_JIT_BINARY_OP_LOGICAL_OR, c->t_bool, x, y);
    default:
      return NULL;
  }
}

/* the value of plan node p given its inputs' values (NULL: not supported) */
gcc_jit_rvalue *cg_node(cg_ctx *c, const tr_pnode *p, const kiln_dtype *in_dt,
                        gcc_jit_rvalue **in) {
  /* an op on halves computes on their f32 values; a half result is rounded
     (DESIGN §13): what the interpreter's half rows do */
  kiln_dtype out = p->meta.dtype;
  switch (vm_op_table[p->op].kind) {
    case VM_KIND_UNARY:
      if (p->op == VM_OP_cast) return emit_cast(c, in[0], in_dt[0], out);
      {
        gcc_jit_rvalue *v = emit_unary(c, p->op, vm_dtype_compute(in_dt[0]), in[0]);
        return v ? round_to(c, out, v) : NULL;
      }
    case VM_KIND_BINARY: {
      gcc_jit_rvalue *v = emit_binary(c, p->op, vm_dtype_compute(in_dt[0]), in[0], in[1]);
      return v ? round_to(c, out, v) : NULL;
    }
    case VM_KIND_TERNARY:
      return round_to(c, out, pick_value(c, vm_dtype_compute(out), in[0], in[1], in[2]));
    default:
      return NULL;
  }
}

bool cg_supported(const tr_pnode *p, const kiln_dtype *in_dt) {
  vm_kind k = vm_op_table[p->op].kind;
  if (p->op == VM_OP_full) return true;
  if (k != VM_KIND_UNARY && k != VM_KIND_BINARY && k != VM_KIND_TERNARY) return false;
  if (p->op == VM_OP_pow && !vm_dtype_is_float(in_dt[0])) return false;
  if (p->op == VM_OP_div && !vm_dtype_is_float(in_dt[0])) return false;
  return true;
}

/* --- math ----------------------------------------------------------------------------- */

static gcc_jit_rvalue *libm_call(cg_ctx *c, cg_fn fn, bool f64, gcc_jit_rvalue *x,
                                 gcc_jit_rvalue *y) {
  static const char *names[CG_FN_COUNT][2] = {
      [CG_EXP] = {"expf", "exp"},       [CG_LOG] = {"logf", "log"},
      [CG_TANH] = {"tanhf", "tanh"},    [CG_SIN] = {"sinf", "sin"},
      [CG_COS] = {"cosf", "cos"},       [CG_LOG1P] = {"log1pf", "log1p"},
      [CG_EXPM1] = {"expm1f", "expm1"}, [CG_ERF] = {"erff", "erf"},
      [CG_POW] = {"powf", "pow"}};
  gcc_jit_type *t = f64 ? c->t_f64 : c->t_f32;
  gcc_jit_function **slot = &c->libm[fn][f64];
  if (!*slot) {
    gcc_jit_param *ps[2] = {gcc_jit_context_new_param(c->ctx, NULL, t, "a"),
                            gcc_jit_context_new_param(c->ctx, NULL, t, "b")};
    *slot = gcc_jit_context_new_function(c->ctx, NULL, GCC_JIT_FUNCTION_IMPORTED, t, names[fn][f64],
                                         fn == CG_POW ? 2 : 1, ps, 0);
  }
  gcc_jit_rvalue *args[2] = {x, y};
  return gcc_jit_context_new_call(c->ctx, NULL, *slot, fn == CG_POW ? 2 : 1, args);
}

gcc_jit_rvalue *cg_math(cg_ctx *c, cg_fn fn, bool f64, gcc_jit_rvalue *x, gcc_jit_rvalue *y) {
  if (c->math) { /* the vectorizable library (f32) / libm (f64): jit_cpu/math.h */
    return cpu_math_call(c->math, (cpu_fn)fn, f64, x, y);
  }
  gcc_jit_type *t = f64 ? c->t_f64 : c->t_f32;
  gcc_jit_rvalue *one = num(c, t, 1.0);
  switch (fn) {
    case CG_SQRT:
      return builtin1(c, f64 ? "__builtin_sqrt" : "__builtin_sqrtf", x);
    case CG_RSQRT:
      return bin(c, GCC_JIT_BINARY_OP_DIVIDE, t, one, cg_math(c, CG_SQRT, f64, x, NULL));
    case CG_SIGMOID: { /* 1 / (1 + exp(-x)), as the interpreter computes it */
      gcc_jit_rvalue *e =
          cg_math(c, CG_EXP, f64,
                  gcc_jit_context_new_unary_op(c->ctx, NULL, GCC_JIT_UNARY_OP_MINUS, t, x), NULL);
      return bin(c, GCC_JIT_BINARY_OP_DIVIDE, t, one, bin(c, GCC_JIT_BINARY_OP_PLUS, t, one, e));
    }
    default:
      return libm_call(c, fn, f64, x, y);
  }
}

void cg_math_release(cg_ctx *c) {
  cpu_math_free(c->math);
  c->math = NULL;
}
