/* device.h — the CUDA device, found at run time: libcuda is loaded with
 * dlopen, so one build runs everywhere and a machine without a driver or GPU
 * simply has no CUDA device (DESIGN §6).  Kernels for it come later. */
#ifndef GPU_DEVICE_H
#define GPU_DEVICE_H

#include <stdbool.h>

/* true when libcuda loads, cuInit succeeds and it reports a device */
bool gpu_available(void);
/* why it is not available ("" when it is) */
const char *gpu_unavailable_reason(void);

#endif
