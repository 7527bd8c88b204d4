/* backend.c — the CPU's entry in the backend table (vm/backend.h): vm's
 * eager kernels are its interpreter, this folder's libgccjit kernels its
 * compiled path (absent in a build without libgccjit: KILN_CPU_JIT=OFF).
 * CPU storage is vm/tensor.c's own. */
#include "../vm/backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../vm/cpu.h"
#include "../vm/interp.h"
#include "../vm/state.h"
#include "jit.h"
#if KILN_HAVE_CPU_JIT
#include "kcache.h"
#endif

static const char *cpu_info(void) {
  static _Thread_local char buf[160];
  snprintf(buf, sizeof buf, "CPU, %s, %d threads, %s", vm_cpu_isa(), vm_process()->threads,
           KILN_HAVE_CPU_JIT ? "libgccjit JIT" : "no JIT (built without libgccjit)");
  return buf;
}

#if KILN_HAVE_CPU_JIT

static void cpu_compile_plan(tr_plan *plan, const tr_trace *t) {
  if (cpu_async()) {
    cpu_compile_async(plan, t);
    return;
  }
  cpu_leaf *leaves = cpu_leaves_of(t);
  cpu_plan *cp = leaves ? cpu_compile(plan, leaves) : NULL;
  free(leaves);
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&plan->jit, &none, cp)) cpu_plan_free(cp);
}

static void cpu_plan_release(void *compiled) { cpu_plan_free(compiled); }

static const cpu_kernel *group_kernel(const void *compiled, int g) {
  const cpu_plan *cp = compiled;
  return g < cp->ngroups && cp->kernels[g].fn ? &cp->kernels[g] : NULL;
}

static bool cpu_has_kernel(const void *compiled, int g) {
  return group_kernel(compiled, g) != NULL;
}

static bool cpu_group(const void *compiled, const tr_plan *plan, const tr_trace *t, int g,
                      vm_tensor **vals, int *rc, int *resume, int *last_group) {
  const cpu_kernel *k = group_kernel(compiled, g);
  if (!k || !cpu_run_group(k, plan, t, g, vals, rc)) return false;
  *resume = k->resume;
  *last_group = k->last_group;
  /* a reduce kernel's epilogue, compiled apart (kernel_plan_epilogue):
     refused (a layout it was not compiled for), the interpreter runs it */
  const cpu_plan *cp = compiled;
  const cpu_kernel *e = &cp->kernels[cp->ngroups + g];
  if (*rc == KILN_OK && e->fn && k->resume <= plan->groups[g].last &&
      cpu_run_group(e, plan, t, g, vals, rc))
    *resume = e->resume;
  return true;
}

#endif

const vm_backend cpu_backend = {
    .device = KILN_CPU,
    .name = "cpu",
    .info = cpu_info,
    .exec = vm_exec,
    .total_memory = vm_memory_total,
    .attention_max_head = INT64_MAX, /* vm/kern_attention.c: any */
#if KILN_HAVE_CPU_JIT
    .jit_enabled = cpu_jit_enabled,
    .plan_cost_ms = cpu_plan_cost_ms,
    .kernel_generation = cpu_kcache_generation,
    .compile = cpu_compile_plan,
    .compile_wait = cpu_compile_wait,
    .plan_free = cpu_plan_release,
    .has_kernel = cpu_has_kernel,
    .run_group = cpu_group,
    .fuses_gathers = true,
#endif
};
