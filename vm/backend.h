/* backend.h — the seam between the device-neutral layers and a device
 * (DESIGN §6): one table of functions per kiln_device.  A backend is an
 * allocator (device storage and copies to and from the host), an
 * interpreter (one primitive on materialized values) and, optionally, a
 * compiler (a plan's kernels built in the background, a group run with
 * them).  trace/ and cache/ call only this table; jit_cpu/ and jit_gpu/
 * fill it in; the C binding registers them (a new backend is a folder and
 * one registration). */
#ifndef VM_BACKEND_H
#define VM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "ops.h"

struct tr_plan;
struct tr_trace;

typedef struct vm_backend {
  kiln_device device;
  const char *name;                 /* "cpu", "cuda": for messages */
  const char *(*unavailable)(void); /* NULL when usable here, else why not */
  const char *(*info)(void);        /* kiln_device_info */

  /* storage (devices other than the CPU; the CPU's lives in vm/tensor.c):
     NULL + error set when it cannot be had */
  void *(*alloc)(size_t nbytes);
  void (*free)(void *data, size_t nbytes);
  bool (*to_host)(void *dst, const void *src, size_t nbytes);
  bool (*from_host)(void *dst, const void *src, size_t nbytes);
  bool (*copy)(void *dst, const void *src, size_t nbytes); /* within the device */
  /* bytes the device holds (RAM and swap for the CPU); 0: unknown.  The
     recorder bounds a pending graph's results on each device by it */
  size_t (*total_memory)(void);

  /* the interpreter: op on values of this device, a new value (views share
     their input's storage) or NULL + error set */
  vm_tensor *(*exec)(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                     const vm_meta *m);

  /* the largest head size (q's and v's last dims) its interpreter's
     attention primitive takes (ops.def); 0: none, fe_attention composes
     attention from matmul and softmax on this device */
  int64_t attention_max_head;

  /* the compiled path; all NULL for a backend without one */
  bool (*jit_enabled)(void);
  double (*compile_cost_ms)(int nodes); /* the payoff rule's price of a plan, before planning it */
  /* the payoff rule's price of making this plan ready (its kernels
     neither in memory nor on disk compiled, those on disk loaded): 0 when
     every kernel is in memory, and then they are in plan->jit already.
     NULL: compile_cost_ms prices it */
  double (*plan_cost_ms)(struct tr_plan *plan, const struct tr_trace *t);
  /* changes whenever a kernel becomes available (a price above may drop) */
  long (*kernel_generation)(void);
  /* compiles plan's kernels (now or in the background) and publishes them
     in plan->jit; takes copies of what it needs from t */
  void (*compile)(struct tr_plan *plan, const struct tr_trace *t);
  void (*compile_wait)(void); /* until the background compiles are done */
  void (*plan_free)(void *compiled);
  /* its kernels compute gathers, index_selects, small scatter_adds,
     concats and arg-reductions in place, elementwise over the output
     (trace/plan.c in_place): the partition fuses them with the
     elementwise work around them (else each is a data group of its own,
     one primitive) */
  bool fuses_gathers;
  /* whether group g of a plan has a compiled kernel */
  bool (*has_kernel)(const void *compiled, int g);
  /* runs group g with it when its inputs have the layout it was compiled
     for (false: nothing done).  On true the plan's nodes from *resume on
     still run on the interpreter, and it covered groups g..*last_group */
  bool (*run_group)(const void *compiled, const struct tr_plan *plan, const struct tr_trace *t,
                    int g, vm_tensor **vals, int *rc, int *resume, int *last_group);
} vm_backend;

/* called once per backend by the C binding's initializer */
void vm_backend_register(const vm_backend *b);
/* the registered table of device d: NULL for an unknown device */
const vm_backend *vm_backend_of(kiln_device d);
/* d's backend when it can be used here; else NULL with KILN_ERR_DEVICE
   set ("no CUDA device is available: <reason>") */
const vm_backend *vm_backend_usable(kiln_device d);
/* "cpu" / "cuda" / "device 7" */
const char *vm_device_name(kiln_device d);

#endif
