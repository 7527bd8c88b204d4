/* backend.c — the CUDA entry of the backend table (vm/backend.h). */
#include "backend.h"

#include "device.h"

static const char *gpu_why_not(void) {
  return gpu_available() ? "CUDA tensors are not built yet" : gpu_unavailable_reason();
}

const vm_backend gpu_backend = {
  .device = KILN_CUDA,
  .name = "cuda",
  .unavailable = gpu_why_not,
};
