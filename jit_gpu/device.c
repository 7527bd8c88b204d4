/* device.c — probing for a CUDA device through the driver API, loaded with
 * dlopen.  cuInit and cuDeviceGetCount have no versioned variants, so plain
 * dlsym is right for them (versioned entry points will go through
 * cuGetProcAddress). */
#include "device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static struct {
  bool available;
  char reason[256];
} gpu;
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;

static void probe(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(gpu.reason, sizeof gpu.reason, "no CUDA driver (libcuda.so.1: %s)", dlerror());
    return;
  }
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  int (*cu_count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
  int count = 0, rc = cu_init && cu_count ? cu_init(0) : -1;
  if (rc == 0) rc = cu_count(&count);
  if (rc != 0 || count <= 0) {
    snprintf(gpu.reason, sizeof gpu.reason, "the CUDA driver reports no device (cuInit/cuDeviceGetCount: %d, %d devices)", rc, count);
    return; /* keep the library loaded: unloading a driver is not worth the risk */
  }
  gpu.available = true;
}

bool gpu_available(void) {
  pthread_once(&gpu_once, probe);
  return gpu.available;
}

const char *gpu_unavailable_reason(void) {
  pthread_once(&gpu_once, probe);
  return gpu.reason;
}
