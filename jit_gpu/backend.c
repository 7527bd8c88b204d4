/* backend.c — the CUDA entry of the backend table (vm/backend.h): device
 * storage through jit_gpu/cuda.c's caching allocator, and the GPU
 * "interpreter": each primitive as its own generated kernel (opgen.h),
 * float matmul through cuBLAS (blas.h), views as geometry.  Fused plans
 * (the compiled path) are the next step: its entries stay NULL. */
#include "backend.h"

#include <stdlib.h>

#include "../vm/state.h"
#include "blas.h"
#include "cuda.h"
#include "opgen.h"

/* An input on the host reaches a kernel as a copy: only a trace's 0-d
   weak scalars do (vm_infer_device lets them go anywhere) */
static bool inputs_on_device(int n, vm_tensor *const *values, vm_tensor **ins) {
  for (int i = 0; i < n; i++) {
    ins[i] = values[i]->storage->device == KILN_CUDA ? vm_retain(values[i])
                                                      : vm_value_to_device(values[i], KILN_CUDA);
    if (!ins[i]) {
      while (i-- > 0) vm_release(ins[i]);
      return false;
    }
  }
  return true;
}

static bool run_matmul(vm_tensor *out, vm_tensor **ins) {
  vm_tensor *ab[2] = {NULL, NULL};
  bool ok = true;
  for (int i = 0; i < 2 && ok; i++) /* cuBLAS takes contiguous or transposed matrices */
    ok = (ab[i] = gpu_blas_operand_ok(ins[i], i == 0) ? vm_retain(ins[i]) : vm_value_copy(ins[i])) != NULL;
  ok = ok && gpu_blas_matmul(out, ab[0], ab[1]);
  vm_release(ab[0]);
  vm_release(ab[1]);
  return ok;
}

static bool run_generated(vm_opcode op, int n, vm_tensor **ins, vm_tensor *out, const vm_attr *attr) {
  gpu_op_plan p = {0};
  if (!gpu_op_plan_make(op, n, ins, out, attr, &p)) return false;
  bool ok = gpu_run_op_plan(&p);
  gpu_op_plan_free(&p);
  return ok;
}

static vm_tensor *gpu_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                           const vm_meta *m) {
  /* views are geometry only; collectives go through the host (vm/dist.h) */
  if (vm_op_table[op].kind == VM_KIND_VIEW || vm_op_table[op].kind == VM_KIND_COLLECTIVE)
    return vm_exec(op, n, values, attr, m);
  atomic_fetch_add_explicit(&vm_process()->stats.eager_ops, 1, memory_order_relaxed);
  vm_tensor *few[4], **ins = n <= 4 ? few : malloc((size_t)n * sizeof *ins);
  if (!ins) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  vm_tensor *out = NULL;
  if (inputs_on_device(n, values, ins)) {
    out = vm_tensor_new_on(KILN_CUDA, m->dtype, m->ndim, m->shape);
    bool matmul = op == VM_OP_matmul && vm_dtype_is_float(m->compute);
    bool ok = out && (out->numel == 0 || (matmul ? run_matmul(out, ins) : run_generated(op, n, ins, out, attr)));
    if (!ok) {
      vm_release(out);
      out = NULL;
    }
    for (int i = 0; i < n; i++) vm_release(ins[i]);
  }
  if (ins != few) free(ins);
  return out;
}

const vm_backend gpu_backend = {
  .device = KILN_CUDA,
  .name = "cuda",
  .unavailable = gpu_unavailable,
  .info = gpu_info,
  .alloc = gpu_mem_alloc,
  .free = gpu_mem_free,
  .to_host = gpu_copy_to_host,
  .from_host = gpu_copy_from_host,
  .copy = gpu_copy_on_device,
  .exec = gpu_exec,
};
