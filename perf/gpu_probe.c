/* gpu_probe.c — what scripts/bench --device cuda asks first: whether Kiln
 * sees a CUDA device.  Prints kiln_device_info(KILN_CUDA) (the device, or
 * why there is none); exit status 0 with a device, 3 without. */
#include <kiln.h>
#include <stdio.h>

int main(void) {
  bool ok = kiln_device_available(KILN_CUDA);
  printf("%s\n", kiln_device_info(KILN_CUDA));
  return ok ? 0 : 3;
}
