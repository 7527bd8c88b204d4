/* fuse.h — a plan's elementwise and reduce groups as fused CUDA kernels
 * (DESIGN §6: the GPU backend's compiled path), from the same
 * device-neutral plan the CPU compiles.  An elementwise group is one
 * kernel: every non-view node computed per element in registers, its
 * inputs read once through their strides (broadcasts and views as index
 * arithmetic), the values read after the group written.  A reduce group's
 * producers are computed per element of the reduction's input inside the
 * fold (the op kernel's own fold, in vm/fold.h's order, so the bits are
 * the op-by-op path's and the CPU's), a long reduction's partials joined by
 * a second kernel, and its epilogue is an elementwise kernel over the
 * result.  A run of reductions over the same rows (softmax, layer_norm)
 * is one row kernel (GPU_FK_ROWS below).  Kernels are shape-generic (extents and strides
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

#define GPU_FUSE_MAX_IO 12      /* outputs + inputs of one kernel */
#define GPU_FUSE_MAX_PARAMS 128 /* host scalars (full nodes, its own or read) it takes */

/* The by-value argument of every fused kernel (about 2 KB; CUDA allows
   4 KB).  Its CUDA twin is emitted into every source with static_asserts
   on its layout. */
typedef struct gpu_fargs {
  void *ptr[GPU_FUSE_MAX_IO];                     /* outputs, then inputs */
  int64_t stride[GPU_FUSE_MAX_IO][KILN_MAX_DIMS]; /* in elements, per iteration dim */
  int64_t shape[KILN_MAX_DIMS];                   /* the iteration's extents, dims coalesced */
  uint64_t param[GPU_FUSE_MAX_PARAMS];            /* each full node's value in its dtype */
  int64_t n;                                      /* elements (reductions: the pass's items) */
  int64_t extent[4];                              /* reductions: as gpu_args's (jit_gpu/opgen.c);
                                                     elementwise: extent[0] = 1 runs the vector path */
  int64_t gstride[GPU_FUSE_MAX_IO]; /* input q a gather's source: its stride along the axis */
  int64_t gextent[GPU_FUSE_MAX_IO]; /* ... and its extent there (indices clamp into it) */
  int32_t ndim;
  int32_t axis; /* reductions: dims [0, axis) kept, [axis, ndim) reduced */
} gpu_fargs;

typedef enum {
  GPU_FK_ELEMENTWISE, /* nodes first..last per element of their shape */
  GPU_FK_REDUCE,      /* producers first..last per input element, folded by node `reduce` */
  GPU_FK_JOIN,        /* the second pass of a long reduction: its partials, in order */
  GPU_FK_ROWS         /* groups group..through as one row kernel (below) */
} gpu_fkind;

/* A row kernel: a run of groups whose reductions all fold the same
   trailing axes of one shape R (softmax, log_softmax, layer_norm ...), as
   one launch.  Each row (a kept position of R, at most VM_FOLD_CHUNK
   positions long) is folded by a group of W warps: per reduction, a pass
   over the row computing the per-element nodes its input needs, in the op
   kernel's lane order (the same bits); the row-level nodes between the
   passes once per row; a last pass storing the per-element values read
   after the run.  Per-element values are recomputed in each pass that
   needs them, not kept: the row's inputs are read again from cache. */
#define GPU_ROW_MAX_NODES 64

/* How a fused kernel reads an input (gpu_fused.role): at the iteration's
   position; as a gather's or index_select's source (its offset without
   the axis, plus the index times gstride: trace/plan.c in_place, the
   plan's vm_backend.fuses_gathers); or as an index_select's 1-d index
   (along the axis only).  The source and index come from outside the
   kernel; the runner checks the indices on the device before the launch
   (gpu_fuse_target.check_indices) and the kernel clamps them, so no read
   leaves the source. */
enum {
  GPU_IN_PLAIN,
  GPU_IN_SOURCE,
  GPU_IN_SELECT,
  GPU_IN_COORD,
  GPU_IN_SCATTER_INDEX,
  GPU_IN_SCATTER_SRC,
  GPU_IN_PART,
  GPU_IN_SCAN
};
/* The other data movement computed in place (vm_backend.fuses_gathers),
   only in elementwise kernels, as the CPU's (docs/JIT.md): scatter_add
   (index and source read at k = 0..m-1 along the axis, gextent = m,
   summed where the index names the output's coordinate), concat (each
   part at the coordinate less the extents before it, clamped; a fill part
   is its parameter, its slot carrying only the extent) and
   argmax/argmin (a scan along the input's axis, gextent long).  The
   coordinate along the axis is an input of its own, GPU_IN_COORD: no
   buffer, strides 1 along the axis and 0 elsewhere, so its offset is the
   coordinate (one axis per kernel).  Scatter indices are checked like
   gathers', against the output's extent. */
#define GPU_COORD_REF INT32_MIN /* the coordinate's ins[] entry: no plan ref */

/* one fused kernel */
typedef struct gpu_fused {
  gpu_fkind kind;
  int first, last; /* the nodes it computes (views run before) */
  int reduce;      /* REDUCE, JOIN: the reduction node */
  int variant;     /* REDUCE, JOIN: its pass (opgen.h GPU_RED_*) */
  int nin, nout, nparams;
  int vec; /* ELEMENTWISE: elements per vector access (0: none; fuse.c) */
  /* REDUCE without a join: its epilogue, nodes reduce+1..epi_last (0:
     none, or a kernel of its own), computed per output as its result is
     stored; epi_in / epi_out: the inputs it reads at the output's
     position and the outputs it writes there (bit q) */
  int epi_last;
  uint32_t epi_in, epi_out;
  int ins[GPU_FUSE_MAX_IO];          /* plan refs read (< 0: leaves) */
  uint8_t role[GPU_FUSE_MAX_IO];     /* GPU_IN_* of each */
  int8_t role_axis[GPU_FUSE_MAX_IO]; /* SOURCE, SELECT: the axis */
  bool contig[GPU_FUSE_MAX_IO];      /* compiled for a dense input of the full shape (flat index) */
  int outs[GPU_FUSE_MAX_IO];         /* plan nodes written (REDUCE: the reduction first) */
  int params[GPU_FUSE_MAX_PARAMS];   /* full nodes */
  char name[40];                     /* "kf_<16 hex of the source's hash>" */
  char *src;                         /* the CUDA C (malloc'd), until compiled */
  void *fn;                          /* the loaded kernel (CUDA: a cache reference) */
  /* ROWS: the last group it computes, the span's nodes that vary along
     the reduced axes (bit i - first), its inputs read once per row (bit q) */
  int through;
  uint64_t varies;
  uint32_t hoisted;
} gpu_fused;

/* a plan group's kernels, in launch order: a chain of elementwise kernels
   (one, unless the group has more operands than one kernel takes: fuse.c
   plan_chain); or a reduction with its producers and its epilogue (one
   kernel), or with its join when the reduction is long and its epilogue's
   elementwise kernel (optional: without it, or when its inputs do not have
   the layout it was compiled for, the epilogue runs op by op) */
#define GPU_FUSE_MAX_KERNELS 4
typedef struct gpu_fused_group {
  int group;
  int nk;
  gpu_fused k[GPU_FUSE_MAX_KERNELS];
} gpu_fused_group;

/* The kernels of group g of plan (the trace t gives the leaves' layouts),
   their sources in k[].src; false when the group is not fused (a matmul or
   data group, an op or dtype the kernels lack, too many operands, a view
   of a value computed inside the group): it runs op by op. */
bool gpu_fuse_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused_group *fg);
/* whether the kernels a run needs are loaded (an epilogue's and a chain's
   after the first are optional: what they compute then runs op by op) */
bool gpu_fused_ready(const gpu_fused_group *fg);
void gpu_fused_group_free_src(gpu_fused_group *fg);

/* Where a fused kernel runs: the CUDA backend, or a test's emulation */
typedef struct gpu_fuse_target {
  kiln_device device;
  /* a new contiguous value (NULL + error) */
  vm_tensor *(*alloc)(kiln_dtype dt, int ndim, const int64_t *shape);
  /* launches k over args (false + error) */
  bool (*launch)(const gpu_fused *k, const gpu_fargs *args, unsigned grid, unsigned block);
  /* checks every index of idx against [0, size) before what is launched
     next, reporting a bad one as the interpreter does (on the GPU at the
     next read: jit_gpu/opgen.h gpu_index_check); api names the op */
  bool (*check_indices)(vm_tensor *idx, int64_t size, int axis, const char *api);
} gpu_fuse_target;

#define GPU_FUSE_BLOCK 256

/* Runs fg for group fg->group: false when its inputs do not have the
   layout it was compiled for (nothing done: the group runs op by op);
   true when it ran (vals[] holds what it computed; the nodes of group
   *last_group from *resume on are left to the interpreter: a row kernel
   runs groups fg->group..*last_group) or failed (*rc set). */
bool gpu_fused_run(const gpu_fused_group *fg, const gpu_fuse_target *dev, const tr_plan *plan,
                   const tr_trace *t, vm_tensor **vals, int *rc, int *resume, int *last_group);

#endif
