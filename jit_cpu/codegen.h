/* codegen.h — internal to jit_cpu/: the code generator's state and the
 * expression emitters shared by the kernel builders. */
#ifndef CPU_CODEGEN_H
#define CPU_CODEGEN_H

#include <libgccjit.h>

#include "jit.h"

/* the functions kernels need from the math library (jit_cpu/math.c) */
typedef enum {
  CG_EXP,
  CG_LOG,
  CG_TANH,
  CG_SIGMOID,
  CG_SIN,
  CG_COS,
  CG_LOG1P,
  CG_EXPM1,
  CG_ERF,
  CG_SQRT,
  CG_RSQRT,
  CG_POW,
  CG_FN_COUNT
} cg_fn;

typedef struct cg_ctx {
  gcc_jit_context *ctx;
  gcc_jit_function *fn; /* the kernel being built */
  gcc_jit_block *cur;   /* where statements go */
  int nlocals, nblocks;
  gcc_jit_type *t_void, *t_bool, *t_int, *t_i32, *t_i64, *t_u32, *t_u64, *t_f32, *t_f64;
  gcc_jit_type *t_u8, *t_u16, *t_i8, *t_i16;
  gcc_jit_type *t_voidp, *t_voidpp, *t_i64p;
  struct cpu_math *math; /* vectorizable approximations, when available */
  gcc_jit_function *libm[CG_FN_COUNT][2];
} cg_ctx;

void cg_init_types(cg_ctx *c);
/* the type a value of dtype dt is computed in (f32 for bf16/f16) */
gcc_jit_type *cg_type(cg_ctx *c, kiln_dtype dt);
/* the type dt is stored as (uint16_t bits for bf16/f16) */
/* the range of integer dtype dt (i64's for bool and the floats) */
void cg_int_range(kiln_dtype dt, long *min, long *max);
gcc_jit_type *cg_mem_type(cg_ctx *c, kiln_dtype dt);
/* a stored element of dtype dt as the value kernels compute with (a half
   widened to f32: vm/half.h's steps), and back (rounded to nearest even) */
gcc_jit_rvalue *cg_load(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *stored);
gcc_jit_rvalue *cg_store(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *value);
/* whether the elementwise code generator handles node p */
bool cg_supported(const tr_pnode *p, const kiln_dtype *in_dt);
/* p's value from its inputs' values (in the current block; may add blocks) */
gcc_jit_rvalue *cg_node(cg_ctx *c, const tr_pnode *p, const kiln_dtype *in_dt, gcc_jit_rvalue **in);
/* fn(x[, y]) through the math library */
/* a if cond else b (bool cond), without a branch: both are computed */
gcc_jit_rvalue *cg_pick(cg_ctx *c, kiln_dtype dt, gcc_jit_rvalue *cond, gcc_jit_rvalue *a,
                        gcc_jit_rvalue *b);
gcc_jit_rvalue *cg_math(cg_ctx *c, cg_fn fn, bool f64, gcc_jit_rvalue *x, gcc_jit_rvalue *y);
void cg_math_release(cg_ctx *c);

#endif
