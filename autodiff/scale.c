/* scale.c — the dynamic loss scaler's step (kiln_unscale_grads, DESIGN
 * §13): f16 training multiplies the loss by a scale so small gradients do
 * not flush to zero, then divides every gradient by it before the
 * optimizer step and skips the step when one overflowed.  The gradients
 * are unscaled in place (their handles name the new values) and checked
 * for Inf/NaN with one read: the sum over every gradient of g * 0, which
 * is 0 for finite values and NaN as soon as one is not. */
#include <math.h>

#include "../front/composite.h"
#include "../trace/record.h"
#include "../vm/state.h"
#include "ad.h"

int ad_unscale_grads(int n, vm_tensor *const *params, double inv_scale, bool *found_inf) {
  vm_clear_error();
  if (n < 0 || (n > 0 && !params) || !found_inf)
    return vm_error(KILN_ERR_ARG, "n %d, params %s, found_inf %s: a count, an array and a flag", n,
                    params ? "given" : "NULL", found_inf ? "given" : "NULL");
  if (!isfinite(inv_scale)) return vm_error(KILN_ERR_ARG, "inv_scale %g is not finite", inv_scale);
  *found_inf = false;
  vm_thread()->no_grad++;
  int rc = KILN_OK;
  vm_tensor *total = NULL; /* sum over the gradients of sum(g * 0), f32 */
  for (int i = 0; i < n && rc == KILN_OK; i++) {
    if (!params[i]) {
      vm_null_input(i);
      rc = vm_thread()->status;
      break;
    }
    vm_tensor *g = ad_grad(params[i]);
    if (!g) {
      rc = vm_thread()->status; /* no gradient (yet) is no error: skipped */
      continue;
    }
    vm_tensor *zero = fe_binary_scalar(VM_OP_mul, g, 0, false);
    vm_tensor *z32 = zero && zero->dtype != KILN_F32 ? fe_cast(zero, KILN_F32) : vm_retain(zero);
    vm_tensor *part = z32 ? fe_reduce(VM_OP_sum, z32, 0, NULL, false) : NULL;
    vm_tensor *sum = part && total ? fe_binary(VM_OP_add, total, part) : vm_retain(part);
    vm_tensor *un = fe_binary_host_scalar(VM_OP_mul, g, inv_scale, false);
    rc = sum && un ? ad_set_grad(params[i], un) : vm_thread()->status;
    vm_release(total);
    total = sum;
    vm_release(un);
    vm_release(part);
    vm_release(z32);
    vm_release(zero);
    vm_release(g);
  }
  vm_thread()->no_grad--;
  if (rc == KILN_OK && total) {
    vm_tensor *v = tr_value(total);
    vm_tensor *h = v ? vm_value_on_host(v) : NULL;
    if (h)
      *found_inf = isnan(vm_load_f64(vm_data(h), h->dtype, 0));
    else
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
    vm_release(h);
  }
  vm_release(total);
  return rc;
}
