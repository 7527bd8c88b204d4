/* backend.h — the CUDA entry of the backend table (vm/backend.h). */
#ifndef GPU_BACKEND_H
#define GPU_BACKEND_H

#include "../vm/backend.h"

extern const vm_backend gpu_backend;

#endif
