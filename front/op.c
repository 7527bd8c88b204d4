/* op.c — the op front-end (op.h): fe_op checks, infers, inserts the casts
 * an op's inputs need and records it (trace/record.h); the convenience
 * makers; handles of host values and weak scalars. */
#include "op.h"

#include <stdlib.h>
#include <string.h>

#include "../trace/record.h"
#include "../vm/gemm_bf16.h"
#include "../vm/state.h"
#include "layers.h"

/* *v, a weak scalar of dtype `from` (as its full node stores it), cast to
   `to` as the cast op does: to a float, the value rounded once (the full
   node of dtype `to` rounds it so); between integer dtypes, wrapped (two's
   complement) or != 0 for bool.  False for float -> integer (left to a
   cast node). */
static bool weak_cast(kiln_dtype from, kiln_dtype to, double *v) {
  if (vm_dtype_is_float(to)) return true;
  if (vm_dtype_is_float(from)) return false;
  union {
    uint8_t b;
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t i64;
  } slot = {0};
  vm_store_f64(&slot, from, 0, *v);
  int64_t x = from == KILN_BOOL || from == KILN_U8 ? slot.b
              : from == KILN_I8                    ? slot.i8
              : from == KILN_I16                   ? slot.i16
              : from == KILN_I32                   ? slot.i32
                                                   : slot.i64;
  /* exact in a double: x came from one (saturated), or is 32 bits; the
     narrower integers wrap (two's complement) */
  *v = to == KILN_BOOL  ? (double)(x != 0)
       : to == KILN_U8  ? (double)(uint8_t)x
       : to == KILN_I8  ? (double)(int8_t)(uint8_t)x
       : to == KILN_I16 ? (double)(int16_t)(uint16_t)x
       : to == KILN_I32 ? (double)(int32_t)(uint32_t)x
                        : (double)x;
  return true;
}

/* the dtype input i must have when the kernel runs */
static kiln_dtype input_dtype(vm_opcode op, int i, const vm_tensor *t, const vm_meta *m) {
  switch (vm_op_table[op].kind) {
    case VM_KIND_UNARY:
      return op == VM_OP_cast ? t->dtype : m->compute;
    case VM_KIND_TERNARY:
      return i == 0 ? KILN_BOOL : m->compute;
    case VM_KIND_INDEX:
      return i == 1 ? KILN_I64 : m->compute;
    case VM_KIND_VIEW:
      return t->dtype;
    case VM_KIND_ATTENTION: /* a bool mask stays bool */
      return i == (op == VM_OP_attention ? 3 : 5) && t->dtype == KILN_BOOL ? KILN_BOOL : m->compute;
    default:
      return m->compute;
  }
}

/* An op that accumulates (a reduction, matmul, convolution, attention,
   scatter_add, a sort's comparisons, an all-reduce over the ranks) over
   bf16/f16 is recorded in f32 between casts (DESIGN §13): its half inputs
   cast to f32, its half result rounded back once.  No kernel of those
   kinds ever sees a half, and the casts fuse into the kernels beside
   them. */
static bool accumulates(vm_opcode op) {
  switch (vm_op_table[op].kind) {
    case VM_KIND_REDUCE:
    case VM_KIND_MATMUL:
    case VM_KIND_CONV:
    case VM_KIND_ATTENTION:
    case VM_KIND_SORT:
      return true;
    default:
      return op == VM_OP_scatter_add || op == VM_OP_all_reduce;
  }
}

static vm_tensor *in_wider(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                           kiln_dtype from, kiln_dtype wide_dt, kiln_dtype result) {
  vm_tensor *few[8] = {0};
  vm_tensor **wide = n <= 8 ? few : calloc((size_t)n, sizeof *wide);
  if (!wide) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  bool ok = true;
  for (int i = 0; i < n && ok; i++)
    /* narrow integers all widen: u8 with i8 computes in i16, itself narrow */
    ok = (wide[i] = in[i]->dtype == from ||
                            (vm_dtype_is_narrow_int(from) && vm_dtype_is_narrow_int(in[i]->dtype))
                        ? fe_cast(in[i], wide_dt)
                        : vm_retain(in[i])) != NULL;
  vm_tensor *r = ok ? fe_op(op, n, wide, attr) : NULL;
  for (int i = 0; i < n; i++) vm_release(wide[i]);
  if (wide != few) free(wide);
  if (!r || result != from) return r;
  vm_tensor *h = fe_cast(r, result);
  vm_release(r);
  return h;
}

/* Autocast (kiln_set_autocast, DESIGN §13): GEMMs, convolutions and
   attention take their f32 operands in the thread's half dtype, as
   PyTorch's autocast does; everything else runs in the dtypes it is
   given (a half result meeting an f32 bias promotes back to f32).  The
   casts are ops, so gradients come back to f32 parameters in f32. */
static bool autocasts(vm_opcode op) {
  vm_kind k = vm_op_table[op].kind;
  return k == VM_KIND_MATMUL || k == VM_KIND_CONV || op == VM_OP_attention;
}

static vm_tensor *autocast_op(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr,
                              kiln_dtype dt) {
  vm_tensor *cast[6] = {0}, *args[6];
  bool ok = true;
  /* attention of f32 q, k, v in bf16 on the CPU: the op reads them
     rounded itself (attr.dtype, ops.def), the same values without three
     casts made and read back; its result rounded once (CUDA's kernels
     read their operands as they are: there, the casts) */
  bool self_rounds = op == VM_OP_attention && dt == KILN_BF16 && n >= 3 &&
                     in[0]->device == KILN_CPU && in[0]->dtype == KILN_F32 &&
                     in[1]->dtype == KILN_F32 && in[2]->dtype == KILN_F32;
  vm_attr rounded;
  if (self_rounds) {
    rounded = *attr;
    rounded.dtype = KILN_BF16;
    attr = &rounded;
  }
  for (int i = 0; i < n && ok; i++) {
    /* f32 operands only (an f64 program stays f64; a bool or additive mask stays) */
    bool operand = !self_rounds && in[i]->dtype == KILN_F32 && (op != VM_OP_attention || i < 3);
    args[i] = operand ? (cast[i] = fe_cast(in[i], dt)) : in[i];
    ok = args[i] != NULL;
  }
  int saved = vm_thread()->autocast;
  vm_thread()->autocast = 0; /* the op itself, as cast */
  vm_tensor *r = ok ? fe_op(op, n, args, attr) : NULL;
  vm_thread()->autocast = saved;
  for (int i = 0; i < n; i++) vm_release(cast[i]);
  if (self_rounds && r) { /* its f32 result, rounded */
    vm_tensor *h = fe_cast(r, dt);
    vm_release(r);
    r = h;
  }
  return r;
}

vm_tensor *fe_op(vm_opcode op, int n, vm_tensor *const *in, const vm_attr *attr) {
  static const vm_attr no_attr;
  if (!attr) attr = &no_attr;
  for (int i = 0; i < n; i++)
    if (!in[i]) {
      vm_null_input(i);
      return NULL;
    } else if (vm_released(in[i])) {
      vm_error(KILN_ERR_STATE, "argument %d was released (kiln_release) before this use", i + 1);
      return NULL;
    }
  int ac = vm_thread()->autocast;
  if (ac && n <= 6 && autocasts(op)) {
    bool any_f32 = false;
    for (int i = 0; i < n; i++) any_f32 |= in[i]->dtype == KILN_F32;
    if (any_f32) return autocast_op(op, n, in, attr, (kiln_dtype)ac);
  }
  if (op == VM_OP_matmul && n == 2) { /* attention written the long way */
    vm_tensor *fused = fe_attention_of_matmul(in[0], in[1]);
    if (fused) return fused;
  }
  vm_meta m;
  if (!vm_infer(op, n, in, attr, &m)) return NULL;
  /* a bf16 matmul on a CPU with AVX512-BF16 runs as itself, its sums in
     f32 (vm/gemm_bf16.c), as does a bf16 or f16 matmul on CUDA (cuBLAS's
     GemmEx, jit_gpu/blas.c); every other accumulation over halves in f32 */
  bool native = op == VM_OP_matmul &&
                ((m.compute == KILN_BF16 && m.device == KILN_CPU && vm_gemm_bf16_available()) ||
                 (vm_dtype_is_half(m.compute) && m.device == KILN_CUDA));
  if (vm_dtype_is_half(m.compute) && accumulates(op) && !native) {
    /* attention of bf16 values: the CPU kernel may run its products in
       bf16 (attr.dtype, vm/kern_attention.c), as fe_attention records it */
    vm_attr bf16 = *attr;
    if (op == VM_OP_attention && m.compute == KILN_BF16) bf16.dtype = KILN_BF16, attr = &bf16;
    return in_wider(op, n, in, attr, m.compute, KILN_F32, m.dtype);
  }
  /* u8, i8, i16 summed over the ranks as i32, wrapped back (MPI's own
     uint8 sum saturates in Open MPI 4.1's AVX reductions) */
  if (op == VM_OP_all_reduce && vm_dtype_is_narrow_int(m.compute))
    return in_wider(op, n, in, attr, m.compute, KILN_I32, m.compute);
  /* a matmul of u8, i8, i16 in i64, wrapped back: the same bits as
     products and sums wrapping in the narrow type (PyTorch's) */
  if (op == VM_OP_matmul && vm_dtype_is_narrow_int(m.compute))
    return in_wider(op, n, in, attr, m.compute, KILN_I64, m.compute);
  /* inputs of another dtype get explicit cast nodes: the recorded graph is
     exactly what runs, for the interpreter and the code generators alike */
  vm_tensor *few[8] = {0};
  vm_tensor **args = n <= 8 ? few : calloc((size_t)n, sizeof *args);
  vm_tensor *out = NULL;
  bool ok = args != NULL;
  if (!ok) vm_error(KILN_ERR_OOM, "out of memory");
  uint64_t made = 0; /* args[i] made here (bit i, i < 64), released after; the rest are in[i] */
  for (int i = 0; ok && i < n; i++) {
    kiln_dtype want = input_dtype(op, i, in[i], &m);
    /* a weak scalar cast to another dtype is made in that dtype instead,
       with the value the cast gives: a cast node would be a 0-d value on
       the host, and a CUDA trace holding one would run node by node */
    double v;
    bool host;
    if (in[i]->dtype == want && i < 64) {
      args[i] = in[i]; /* borrowed: no reference taken (atomics are a W5 op's main cost) */
      continue;
    }
    if (in[i]->dtype != want && tr_weak_scalar(in[i], &v, &host) &&
        weak_cast(in[i]->dtype, want, &v))
      ok = (args[i] = fe_weak_scalar_of(v, want, host)) != NULL;
    else
      ok = (args[i] = in[i]->dtype == want ? vm_retain(in[i]) : fe_cast(in[i], want)) != NULL;
    if (i < 64) made |= 1ull << i;
  }
  if (ok) out = tr_record(op, n, args, attr, &m);
  for (int i = 0; args && i < n; i++)
    if (i >= 64 || (made >> i & 1)) vm_release(args[i]);
  if (args != few) free(args);
  return out;
}

/* --- conveniences ------------------------------------------------------ */

vm_tensor *fe_unary(vm_opcode op, vm_tensor *a) { return fe_op(op, 1, &a, NULL); }

vm_tensor *fe_binary(vm_opcode op, vm_tensor *a, vm_tensor *b) {
  vm_tensor *in[2] = {a, b};
  return fe_op(op, 2, in, NULL);
}

static vm_tensor *binary_with_scalar(vm_opcode op, vm_tensor *a, double s, bool is_int, bool host) {
  if (!a) {
    vm_null_input(0);
    return NULL;
  }
  /* with a float tensor the scalar is made in its dtype: rounding the
     value once there is exactly what the cast the op would insert does,
     and a recorded op saves a node */
  kiln_dtype dt = is_int ? KILN_I64 : vm_dtype_is_float(a->dtype) && !a->weak ? a->dtype : KILN_F64;
  vm_tensor *sc = fe_weak_scalar_of(s, dt, host);
  vm_tensor *r = sc ? fe_binary(op, a, sc) : NULL;
  vm_release(sc);
  return r;
}

vm_tensor *fe_binary_scalar(vm_opcode op, vm_tensor *a, double s, bool is_int) {
  return binary_with_scalar(op, a, s, is_int, false);
}

vm_tensor *fe_binary_host_scalar(vm_opcode op, vm_tensor *a, double s, bool is_int) {
  return binary_with_scalar(op, a, s, is_int, true);
}

vm_tensor *fe_cast(vm_tensor *a, kiln_dtype dt) {
  vm_attr attr = {.dtype = dt};
  return fe_op(VM_OP_cast, 1, &a, &attr);
}

vm_tensor *fe_reduce(vm_opcode op, vm_tensor *a, int naxes, const int *axes, bool keepdim) {
  if (!a) {
    vm_null_input(0);
    return NULL;
  }
  vm_attr attr = {.keepdim = keepdim};
  if (a->ndim == 0 && naxes > 0 && axes) { /* argmax(x, 0) of a scalar: it has no axis */
    vm_error(KILN_ERR_ARG, "a 0-d tensor has no axis %d", axes[0]);
    return NULL;
  }
  if (naxes < 0 || naxes > a->ndim || (naxes > 0 && !axes)) {
    vm_error(KILN_ERR_ARG, "naxes %d is invalid for a tensor of %d dimensions", naxes, a->ndim);
    return NULL;
  }
  if (naxes == 0) attr.axes_mask = a->ndim ? (1u << a->ndim) - 1 : 0;
  for (int i = 0; i < naxes; i++) {
    int ax = axes[i];
    if (!vm_norm_axis(&ax, a->ndim)) return NULL;
    if (attr.axes_mask & (1u << ax)) {
      vm_error(KILN_ERR_ARG, "axis %d appears more than once", axes[i]);
      return NULL;
    }
    attr.axes_mask |= 1u << ax;
  }
  return fe_op(op, 1, &a, &attr);
}

vm_tensor *fe_reshape(vm_tensor *a, int ndim, const int64_t *shape) {
  if (!a) {
    vm_null_input(0);
    return NULL;
  }
  char buf[VM_SHAPE_BUF], buf2[VM_SHAPE_BUF];
  vm_attr attr = {.ndim = ndim};
  if (!vm_check_dims_arg(ndim, shape)) return NULL;
  int infer_at = -1;
  int64_t known = 1;
  for (int d = 0; d < ndim; d++) {
    attr.shape[d] = shape[d];
    if (shape[d] == -1 && infer_at < 0) {
      infer_at = d;
    } else if (shape[d] < 0) {
      vm_error(KILN_ERR_SHAPE, "invalid size %lld in shape %s (only one -1 is allowed)",
               (long long)shape[d], vm_shape_str(buf, ndim, shape));
      return NULL;
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      vm_error(KILN_ERR_SHAPE, "shape %s is too large", vm_shape_str(buf, ndim, shape));
      return NULL;
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || a->numel % known != 0) {
      vm_error(KILN_ERR_SHAPE, "cannot reshape %s (%lld elements) into %s",
               vm_shape_str(buf, a->ndim, a->shape), (long long)a->numel,
               vm_shape_str(buf2, ndim, shape));
      return NULL;
    }
    attr.shape[infer_at] = a->numel / known;
  }
  return fe_op(VM_OP_reshape, 1, &a, &attr);
}

vm_tensor *fe_expand(vm_tensor *a, int ndim, const int64_t *shape) {
  vm_attr attr = {.ndim = ndim};
  if (!vm_check_dims_arg(ndim, shape)) return NULL;
  if (ndim) memcpy(attr.shape, shape, (size_t)ndim * sizeof *shape);
  return fe_op(VM_OP_expand, 1, &a, &attr);
}

/* --- handles of host values and scalars ---------------------------------- */

vm_tensor *fe_handle_from_host(vm_tensor *v, kiln_device d) {
  if (v && d != KILN_CPU) {
    vm_tensor *w = vm_value_to_device(v, d);
    vm_release(v);
    v = w;
  }
  return v ? tr_handle_from_value(v) : NULL;
}

vm_tensor *fe_weak_scalar_of(double v, kiln_dtype dt, bool host) {
  vm_attr attr = {.dtype = dt, .weak = true, .host = host, .scalar = {v}};
  return fe_op(VM_OP_full, 0, NULL, &attr);
}

vm_tensor *fe_weak_scalar(double v, bool is_int) {
  return fe_weak_scalar_of(v, is_int ? KILN_I64 : KILN_F64, false);
}

vm_tensor *fe_host_scalar(double v, bool is_int) {
  return fe_weak_scalar_of(v, is_int ? KILN_I64 : KILN_F64, true);
}

const void *fe_storage_id(const vm_tensor *t) {
  if (!t) return NULL;
  if (!t->node) return t->storage;
  vm_tensor *v = tr_value((vm_tensor *)t);
  return v ? v->storage : NULL;
}
