/* backend.c — the registered backends (vm/backend.h), kept in the process
 * state.  Filled once, before main, by the C binding's initializer; read
 * without locks afterwards. */
#include "backend.h"

#include <stdio.h>

#include "state.h"

#define VM_MAX_BACKENDS (int)(sizeof vm_process()->backends / sizeof vm_process()->backends[0])

void vm_backend_register(const vm_backend *b) {
  if ((int)b->device < VM_MAX_BACKENDS) vm_process()->backends[b->device] = b;
}

const vm_backend *vm_backend_of(kiln_device d) {
  return (unsigned)d < (unsigned)VM_MAX_BACKENDS ? vm_process()->backends[d] : NULL;
}

const char *vm_device_name(kiln_device d) {
  switch (d) {
    case KILN_CPU:
      return "cpu";
    case KILN_CUDA:
      return "cuda";
  }
  static _Thread_local char buf[24];
  snprintf(buf, sizeof buf, "device %d", (int)d);
  return buf;
}

const vm_backend *vm_backend_usable(kiln_device d) {
  const vm_backend *b = vm_backend_of(d);
  const char *why =
      b ? (b->unavailable ? b->unavailable() : NULL) : "no backend for it is built in";
  if (!why) return b;
  vm_error(KILN_ERR_DEVICE, "no %s device is available: %s",
           d == KILN_CUDA ? "CUDA" : vm_device_name(d), why);
  return NULL;
}
