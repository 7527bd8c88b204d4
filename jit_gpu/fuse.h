/* fuse.h — a plan's elementwise groups as fused CUDA kernels (DESIGN §6:
 * the GPU backend's compiled path).  One kernel per group, from the same
 * device-neutral plan the CPU compiles: every non-view node of the group
 * is computed per element in registers, its inputs read once through
 * their strides (broadcasts and views as index arithmetic), the values read
 * after the group written.  Kernels are shape-generic (extents and strides
 * arrive in gpu_fargs) and named by a hash of their source, so equal
 * groups of different traces or shapes share one compiled kernel.  Each
 * node's value is the op-by-op kernel's expression (src.h), so a fused
 * group gives the op-by-op GPU path's bits.
 *
 * Planning, source and argument building here are host code that touches
 * no device: the runner takes the device as a gpu_fuse_target (allocation
 * and launch), so tests run the real runner on host memory under the CPU
 * emulation of CUDA (tests/gpu_emu). */
#ifndef GPU_FUSE_H
#define GPU_FUSE_H

#include <stdbool.h>
#include <stdint.h>

#include "../trace/plan.h"
#include "../vm/tensor.h"

#define GPU_FUSE_MAX_IO 12     /* outputs + inputs of one kernel */
#define GPU_FUSE_MAX_PARAMS 16 /* host scalars (full nodes) it takes */

/* The by-value argument of every fused kernel (about 1.2 KB; CUDA allows
   4 KB).  Its CUDA twin is emitted into every source with static_asserts
   on its layout. */
typedef struct gpu_fargs {
  void *ptr[GPU_FUSE_MAX_IO];                    /* outputs (contiguous), then inputs */
  int64_t stride[GPU_FUSE_MAX_IO][KILN_MAX_DIMS]; /* in elements, per iteration dim (inputs) */
  int64_t shape[KILN_MAX_DIMS];                  /* the iteration's extents, dims coalesced */
  uint64_t param[GPU_FUSE_MAX_PARAMS];           /* each full node's value in its dtype */
  int64_t n;                                     /* elements */
  int32_t ndim;
  int32_t pad;
} gpu_fargs;

typedef struct gpu_fused {
  int group, first, last;           /* plan group; its nodes first..last (views run before) */
  int nin, nout, nparams;
  int ins[GPU_FUSE_MAX_IO];         /* plan refs read (< 0: leaves) */
  bool contig[GPU_FUSE_MAX_IO];     /* compiled for a dense input of the full shape (indexed by i) */
  int outs[GPU_FUSE_MAX_IO];        /* plan nodes written */
  int params[GPU_FUSE_MAX_PARAMS];  /* full nodes */
  char name[40];                    /* "kf_<16 hex of the source's hash>" */
  char *src;                        /* the CUDA C (malloc'd), until compiled */
  void *fn;                         /* the backend's loaded kernel */
} gpu_fused;

/* The kernel of group g of plan (the trace t gives the leaves' layouts),
   its source in k->src; false when the group is not fused (not
   elementwise, an op or dtype the kernels lack, too many operands, a view
   of a value computed inside the group): it runs op by op. */
bool gpu_fuse_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused *k);

/* Where a fused kernel runs: the CUDA backend, or a test's emulation */
typedef struct gpu_fuse_target {
  kiln_device device;
  /* a new contiguous value (NULL + error) */
  vm_tensor *(*alloc)(kiln_dtype dt, int ndim, const int64_t *shape);
  /* launches k over args (false + error) */
  bool (*launch)(const gpu_fused *k, const gpu_fargs *args, unsigned grid, unsigned block);
} gpu_fuse_target;

#define GPU_FUSE_BLOCK 256

/* Runs k for group k->group: false when its inputs do not have the layout
   it was compiled for (nothing done: the group runs op by op); true when
   it ran (vals[] holds its outputs) or failed (*rc set). */
bool gpu_fused_run(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                   const tr_trace *t, vm_tensor **vals, int *rc);

#endif
