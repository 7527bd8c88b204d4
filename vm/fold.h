/* fold.h — the one order in which Kiln folds a float reduction, shared by
 * the interpreter (vm/kern_reduce.c) and the compiled kernels
 * (jit_cpu/kernel.c, jit_cpu/compile.c), so that whether the JIT fired
 * never changes a result (DESIGN §5, docs/SEMANTICS.md "Reductions").
 *
 * Positions p = 0..n-1 are an output's reduced elements in logical
 * row-major order (size-1 dims ignored); A is the accumulator type
 * (vm_fold_acc_dtype below: f64 for f32 sum/prod, else the dtype); comb is + , * , max or min
 * (below).
 *   - trailing reductions (no kept axis after a reduced one): the lane
 *     order.  Chunks of VM_FOLD_CHUNK positions; in each, blocks of
 *     VM_FOLD_BLOCK; in each block, L = VM_FOLD_LANE_BYTES / sizeof(A)
 *     lanes: lanes[l] = comb(lanes[l], x[r + l]) for whole steps of L, the
 *     block's tail into lane 0, then a tree fold (lanes[k] = comb(lanes[k],
 *     lanes[k + w]) for w = L/2 .. 1); the chunk's acc = comb(acc, lanes[0])
 *     block by block, from the identity.  One chunk: the result is (T)acc.
 *     Several: each chunk's (T)acc, folded in chunk order in double
 *     (vm_fold_partials), then rounded to T.
 *   - any other axis pattern: the column order.  Blocks of VM_FOLD_BLOCK
 *     positions, each folded in order from the identity, joined in order
 *     into acc from the identity; the result is (T)acc.
 * Integer reductions are exact (wrapping), so any order gives them. */
#ifndef VM_FOLD_H
#define VM_FOLD_H

#include <stdint.h>

#include "ops.h"

#define VM_FOLD_BLOCK 4096
#define VM_FOLD_LANE_BYTES 256 /* four 512-bit vectors of partial sums */
#define VM_FOLD_CHUNK ((int64_t)1 << 16)

/* max / min with NaN first (x's NaN if x is one, else y's) and -0 < +0, so
   a max or min over values is the same in every order, NaN payloads aside */
#define VM_FMAX(x, y) \
  (((x) != (x) || (x) > (y) || ((x) == (y) && __builtin_signbit(y))) ? (x) : (y))
#define VM_FMIN(x, y) \
  (((x) != (x) || (x) < (y) || ((x) == (y) && !__builtin_signbit(y))) ? (x) : (y))

/* A, the dtype a fold of dt by op accumulates in: f64 for f32 sum and
   prod, else dt.  The interpreter's folds (vm/kern_reduce.c, checked at
   compile time) and every compiled kernel's take it from here. */
#define VM_FOLD_ACC_DTYPE(op, dt) \
  ((dt) == KILN_F32 && ((op) == VM_OP_sum || (op) == VM_OP_prod) ? KILN_F64 : (dt))
static inline kiln_dtype vm_fold_acc_dtype(vm_opcode op, kiln_dtype dt) {
  return VM_FOLD_ACC_DTYPE(op, dt);
}

/* out[o] = the chunk partials part[o * nchunks + c] (dtype dt, c in order)
   folded as the lane order says, for o in [0, rows) */
void vm_fold_partials(vm_opcode op, kiln_dtype dt, const void *part, int64_t nchunks, int64_t rows,
                      void *out);

#endif
