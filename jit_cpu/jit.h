/* jit.h — the CPU JIT (DESIGN §6): a plan's kernel groups compiled with
 * libgccjit into native loops, run on the thread pool.  Groups the code
 * generator does not handle (matmul, gathers, reductions for now) keep
 * running on the interpreter, so every plan can be compiled. */
#ifndef CPU_JIT_H
#define CPU_JIT_H

#include "../trace/plan.h"
#include "../vm/backend.h"

typedef void (*cpu_kernel_fn)(void **bufs, const int64_t *meta, const void *params, int64_t begin,
                              int64_t end);

typedef struct cpu_kernel {
  cpu_kernel_fn fn; /* NULL: this group runs on the interpreter */
  int nout, nin, nparams;
  int *outs;          /* plan nodes written (group outputs) */
  int *ins;           /* plan refs read (leaves, earlier groups, views) */
  uint8_t *in_stride; /* inner stride each input was compiled for: 0, 1 or 2 (any) */
  struct cpu_gather_in
      *gather;    /* per input, when the kernel gathers (else NULL): kernel.h's roles */
  int *params;    /* plan nodes (full) whose value is a runtime parameter */
  int reduce;     /* the reduction node of a reduce kernel, -1 for elementwise */
  int resume;     /* the group's nodes from here on run on the interpreter after it */
  int last_group; /* a row kernel runs groups g..last_group (else last_group = g) */
  bool rowwise;
  bool cols;                  /* a column reduction (kept axes on both sides of the reduced ones) */
  int nstash;                 /* row kernels: scratch slots (8 x count bytes each) per call */
  struct cache_kernel *entry; /* the kernel cache's entry fn belongs to (a reference) */
} cpu_kernel;

/* how a gathering kernel reads input q (kernel_shape's in_role, in_axis,
   in_bound) */
typedef struct cpu_gather_in {
  uint8_t role;
  int8_t axis;
  int16_t bound;
} cpu_gather_in;

/* a plan's kernels: references to the process-wide kernel cache
   (jit_cpu/kcache.h), released with the plan */
typedef struct cpu_plan {
  cpu_kernel *kernels;   /* one per plan group, then one per reduce group's epilogue */
  int ngroups, compiled; /* compiled: kernels it has (groups and epilogues) */
  double compile_ms;
} cpu_plan;

/* what the code generator needs to know of a plan's leaves (kept apart from
   the flush, so compiles can run on a background thread) */
typedef struct cpu_leaf {
  vm_meta meta;
  bool contiguous;
  bool inner_unit; /* its elements along its last dim (longer than 1) are adjacent */
} cpu_leaf;

/* the CPU's backend table (jit_cpu/backend.c), registered by the binding */
extern const vm_backend cpu_backend;

bool cpu_jit_enabled(void); /* KILN_JIT != 0 */
bool cpu_async(void);       /* KILN_ASYNC != 0: compile on the background thread */
/* Compiles plan; NULL if nothing could be compiled (the plan then runs on
   the interpreter; errors are logged once, never raised). */
cpu_plan *cpu_compile(const tr_plan *plan, const cpu_leaf *leaves);
/* Compiles plan on the background compiler thread and publishes the result
   in plan->jit when done (the plan keeps running on the interpreter until
   then).  Takes copies of what it needs. */
void cpu_compile_async(tr_plan *plan, const tr_trace *t);
/* the payoff rule's price of plan (vm_backend.plan_cost_ms): its kernels
   found in memory (then the plan is ready: plan->jit set, price 0), on
   disk (a load each), or missing (compiled together at the price measured
   on this machine's compiles, per kernel) */
double cpu_plan_cost_ms(tr_plan *plan, const tr_trace *t);
/* what compiling this many missing kernels together is priced at now: a
   line fitted to this process's compiles, and to earlier processes' kept
   in the disk cache, or the seed before any (tests/test_payoff.c) */
double cpu_kernels_price_ms(int kernels);
/* blocks until the background compiler's queue is empty and it is idle */
void cpu_compile_wait(void);
/* the leaf descriptions of trace t (malloc'd, nleaves entries) */
cpu_leaf *cpu_leaves_of(const tr_trace *t);
void cpu_plan_free(cpu_plan *cp);

/* Runs group g with its kernel if the inputs have the layout it was
   compiled for; false (nothing done) otherwise.  vals: the plan's values. */
bool cpu_run_group(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t, int g,
                   vm_tensor **vals, int *rc);

#endif
