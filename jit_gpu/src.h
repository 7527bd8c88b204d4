/* src.h — internal to jit_gpu/: what the generator of the op kernels
 * (opgen_src.c) shares with the generator of fused plan kernels (fuse.c):
 * a growing string, the prelude (types, gpu_args with its layout asserts,
 * the device helpers) and one primitive's value as CUDA C, from the same
 * per-op expression tables, so a fused kernel computes each node exactly
 * as the op-by-op kernel does. */
#ifndef GPU_SRC_H
#define GPU_SRC_H

#include <stdbool.h>
#include <stddef.h>

#include "../vm/ops.h"

typedef struct gpu_src {
  char *s;
  size_t len, cap;
  bool oom;
} gpu_src;

void gpu_src_put(gpu_src *b, const char *s);
void gpu_src_printf(gpu_src *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* a static_assert in the source that field f of host struct T sits at the
   same offset on the device (NVRTC's EDG has no offsetof without
   <cstddef>; __INTADDR__ is what its own offsetof expands to) */
#define GPU_SRC_ASSERT_FIELD(b, T, f)                                                     \
  gpu_src_printf(b,                                                                       \
                 "static_assert(__INTADDR__(&((" #T " *)0)->" #f ") == %zu, \"" #T "." #f \
                 ": host and device layouts differ\");\n",                                \
                 offsetof(T, f))

/* the shared prelude (guarded: a batch holds it once) */
void gpu_src_prelude(gpu_src *b);
/* "float", "i64", "u8" (bool), ... */
const char *gpu_src_ctype(kiln_dtype dt);
/* whether the op kernels compute op on these dtypes (elementwise kinds) */
bool gpu_src_node_supported(vm_opcode op, kiln_dtype out, int nin, const kiln_dtype *in);
/* a block assigning op's value on operands args[0..nin) (C expressions of
   the input dtypes; for where: the bool condition first) to dst, which
   has type gpu_src_ctype(out) */
void gpu_src_node(gpu_src *b, vm_opcode op, kiln_dtype out, int nin, const kiln_dtype *in,
                  const char *const *args, const char *dst);

/* A reduction pass's body, after the kernel's opening brace: variant
   (opgen.h GPU_RED_*) of op over input dtype t, in vm/fold.h's order, the
   fields of `a` as opgen.c documents them for gpu_args (gpu_fargs has the
   same names).  The fold passes (LANE, COL, COL_PART) read position p of
   output o through `ld(p)`: src declares what the kernel needs once, item
   (run per output o, with `count` known) defines `auto ld = [&](i64 p) ->
   T {...}`.  The joins read partials from a.ptr[1] and ignore both.  A
   pass writes each result r of item i (the output when there is no join)
   with store(i, r): NULL stores it at out[i] (k_store_out); a fused
   kernel's src defines a lambda that computes its epilogue from it. */
void gpu_src_reduce(gpu_src *b, vm_opcode op, kiln_dtype t, int variant, const char *src,
                    const char *item, const char *store);
/* A row kernel's fold of one row (jit_gpu/fuse.c): the lane order of
   GPU_RED_LANE for a row of at most VM_FOLD_CHUNK positions, so the same
   bits as the op kernel; position p read through `ld(p)` (a lambda of the
   kernel's), the result assigned to dst in every thread of the row's
   group.  pass numbers the kernel's folds (their shared arrays). */
void gpu_src_row_fold(gpu_src *b, vm_opcode op, kiln_dtype t, int pass, const char *ld,
                      const char *dst);
/* whether the op kernels fold op (sum/prod/max/min) over dtype t */
bool gpu_src_reduce_supported(vm_opcode op, kiln_dtype t);

#endif
