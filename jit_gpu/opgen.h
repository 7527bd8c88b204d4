/* opgen.h — the GPU interpreter's kernels (DESIGN §6): every primitive as
 * CUDA C generated from the one op table, one kernel per (op, dtypes,
 * layout class), shape-generic (extents and strides arrive in gpu_args at
 * launch).  Host code only: what to compile and how to launch it for a
 * given call; jit_gpu/cuda.c compiles, caches and launches.  matmul on
 * floats goes to cuBLAS (jit_gpu/blas.c), not here. */
#ifndef GPU_OPGEN_H
#define GPU_OPGEN_H

#include <stddef.h>
#include <stdint.h>

#include "../vm/ops.h"

#define GPU_MAX_OPERANDS 8 /* attention_grad: out, q, k, v, o, do, mask, scratch */

/* The by-value argument of every generated kernel.  Its CUDA twin is
   emitted into every source with static_asserts on its size and field
   offsets, so host and device can never disagree silently. */
typedef struct gpu_args {
  void *ptr[GPU_MAX_OPERANDS]; /* operand 0 is the output; element 0 of each view */
  int64_t stride[GPU_MAX_OPERANDS][KILN_MAX_DIMS]; /* in elements, per iteration dim */
  int64_t shape[KILN_MAX_DIMS];                    /* the iteration's extents */
  int64_t n;                                       /* elements (or rows) the launch covers */
  int64_t extent[4];      /* family-specific sizes (documented in opgen.c) */
  double scalar[2];       /* full: value; arange: start, step */
  uint64_t seed, counter; /* rand, randn: the Philox key and first block */
  int32_t ndim;
  int32_t axis;
  int32_t flag; /* family-specific (argsort: descending) */
  int32_t pad;
} gpu_args;

/* What makes one compiled kernel.  Two calls with equal keys run the same
   code; only gpu_args differ. */
typedef struct gpu_op_key {
  uint16_t op;     /* vm_opcode */
  uint8_t variant; /* family-specific: reduce pass, ... */
  uint8_t nin;
  uint8_t out_dtype; /* kiln_dtype */
  uint8_t in_dtype[3];
  uint8_t contiguous; /* bit k: operand k is contiguous (the layout class) */
} gpu_op_key;

typedef struct gpu_launch {
  gpu_op_key key;
  gpu_args args;
  uint32_t grid[3], block[3];
  uint32_t shared_bytes;
  uint8_t scratch_mask; /* bit k: args.ptr[k] is an offset into the call's scratch buffer */
  uint8_t check_mask;   /* bit k: args.ptr[k] is the calling thread's gpu_index_check */
} gpu_launch;

/* One op call: launches in order, on one stream, sharing one scratch buffer
   of scratch_bytes (allocated by the runner, freed after the last launch). */
typedef struct gpu_op_plan {
  int nlaunch;
  gpu_launch *launch; /* malloc'd */
  size_t scratch_bytes;
} gpu_op_plan;

/* the kernel's entry name, unique per key ("k_add_f32_f32_f32_c7", ...) */
void gpu_op_key_name(const gpu_op_key *k, char *buf, size_t cap);
/* its CUDA C source (malloc'd; NULL + error on OOM): no #includes, one
   extern "C" __global__ entry named gpu_op_key_name(k) */
char *gpu_op_source(const gpu_op_key *k);
/* How to run op on materialized device values.  out is allocated,
   contiguous, of m's dtype and shape, and has at least one element;
   inputs arrive in the op's compute dtypes, as for the CPU interpreter
   (vm/kernels.h).  Views never come here.  False + error set when the op
   cannot run on the GPU. */
bool gpu_op_plan_make(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                      const vm_attr *attr, gpu_op_plan *p);
void gpu_op_plan_free(gpu_op_plan *p);
/* Only the index check of an index op (launch 0 of its plan): idx
   against [0, size) into the thread's gpu_index_check, for a fused kernel
   that gathers in place (jit_gpu/fuse.h).  false + error on OOM. */
bool gpu_op_plan_index_check(const vm_tensor *idx, int64_t size, int axis, gpu_op_plan *p);
/* Every key gpu_op_plan_make can produce (NVRTC compiles each in CI).
   Writes at most cap keys; returns how many there are. */
int gpu_op_keys(gpu_op_key *keys, int cap);

/* --- additions: variants, batches, index errors (opgen.c documents the
   gpu_args fields each family uses) --------------------------------------- */

/* gpu_op_key.variant: reductions fold in vm/fold.h's order (lane order for
   trailing reductions, column order otherwise), in one pass or two through
   scratch; index ops have a data kernel and an index check */
enum {
  GPU_VAR_MAIN = 0,  /* every other family */
  GPU_RED_LANE = 0,  /* items of <= VM_FOLD_CHUNK positions, lane order */
  GPU_RED_LANE_JOIN, /* the chunk partials of each output, in order, in double */
  GPU_RED_COL,       /* column order, a thread per output */
  GPU_RED_COL_PART,  /* column order, a thread per VM_FOLD_BLOCK block */
  GPU_RED_COL_JOIN,  /* the block partials of each output, in order */
  GPU_IDX_DATA = 0,
  GPU_IDX_CHECK /* every index against the axis length (op: index_select) */
};

/* Attention (opgen.c documents its gpu_args): variant = pass +
   GPU_ATT_WIDE (head sizes 65..GPU_ATT_MAX_HEAD; else up to 64); the
   mask's kind is a launch argument (a uniform branch: a third of the
   kernels NVRTC builds).  attention is one FWD launch; attention_grad is
   ROWS (each query row's logsumexp and rowsum(dO ∘ O) into scratch), then
   DQ (a thread per query row) and DKDV (a thread per key row): no
   atomics, so the same bits on every run. */
enum { GPU_ATT_FWD = 0, GPU_ATT_ROWS, GPU_ATT_DQ, GPU_ATT_DKDV, GPU_ATT_WIDE = 4 };
/* gpu_args.flag of an attention launch: bit 0 causal, bits 1-2 the mask */
enum { GPU_ATT_NO_MASK = 0, GPU_ATT_BOOL_MASK, GPU_ATT_FLOAT_MASK };
#define GPU_ATT_MAX_HEAD 128 /* larger heads: fe_attention composes (vm_backend) */
#define GPU_ATT_ROWS_PER_BLOCK 64

/* How a reduction of nout outputs of count positions each is folded, in
   vm/fold.h's order: the first pass (variant, items n, extents and grid as
   opgen.c documents for gpu_args) and, when join >= 0, a second pass
   folding each output's nparts partials (of dtype part) in order.  The op
   kernels and the fused reductions (fuse.c) both plan with it, so both
   give the same bits. */
typedef struct gpu_red_sched {
  int variant; /* GPU_RED_LANE, GPU_RED_COL or GPU_RED_COL_PART */
  int64_t n;   /* items of the first pass */
  int64_t extent[4];
  uint32_t grid;
  int join; /* GPU_RED_LANE_JOIN, GPU_RED_COL_JOIN, or -1: one pass */
  kiln_dtype part;
  int64_t nparts;
  uint32_t join_grid;
} gpu_red_sched;
void gpu_reduce_schedule(vm_opcode op, kiln_dtype t, bool trailing, int64_t nout, int64_t count,
                         gpu_red_sched *s);
/* whether reducing axes_mask of shape is a trailing reduction (no kept dim
   after a reduced one, size-1 dims ignored): the lane order; else the
   column order */
bool gpu_reduce_trailing(int ndim, const int64_t *shape, uint32_t axes_mask);

/* whether gpu_op_source can generate k (the planner's check) */
bool gpu_op_key_supported(const gpu_op_key *k);
/* One translation unit holding n keys' entries (the shared definitions
   once): NVRTC's cost is per program, so compiling several kernels at once
   is cheaper.  malloc'd; NULL + error on OOM or an unsupported key. */
char *gpu_op_source_batch(const gpu_op_key *keys, int n);

/* Index ops cannot raise an error on the device, and a plan must not wait
   for one (DESIGN §6: no host sync inside a plan).  Each calling thread
   owns one gpu_index_check in device memory (jit_gpu/cuda.c).  An index
   op's plan checks every index first (launch 0, GPU_IDX_CHECK: the first
   index out of range in row-major order over the index), then runs its
   data kernels, which clamp indices into [0, size) so no access leaves an
   operand.  A check that finds one seals the record; while it is sealed
   later checks do nothing, so the record keeps the first bad index in
   stream order.  The host reads the record where it waits for the stream
   anyway (a read of a value to the host) and reports it there with
   gpu_index_check_report, named after the call that recorded the op (the
   runner numbers its index ops: a.extent[1] of the check); the values
   computed since are garbage.
   KILN_GPU_SYNC_CHECKS=1 reads it after every index op instead (a wait per
   op: the error comes at the flush that ran it). */
typedef struct gpu_index_check {
  uint64_t first; /* 0: every index in range; else ~position of the first one out of range */
  int64_t value;  /* that index */
  int64_t size;   /* the axis length it was checked against */
  uint32_t done;  /* blocks of the running check that finished (back to 0 after it) */
  int32_t axis;
  uint32_t sealed; /* nonzero: first/value/size/axis/op describe an unreported bad index */
  uint32_t op;     /* the sealing check's a.extent[1]: the runner's number for its op */
} gpu_index_check;
/* whether plans of op carry a gpu_index_check in their scratch */
bool gpu_op_checks_indices(vm_opcode op);
/* the same asked of a plan (a runner that has no op at hand) */
bool gpu_op_plan_has_index_check(const gpu_op_plan *p);
/* true if every index was in range; else false with the interpreter's error
   ("index 7 is out of range for axis 0 of size 5") */
bool gpu_index_check_report(const gpu_index_check *rec);

#endif
