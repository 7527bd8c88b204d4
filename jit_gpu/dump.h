/* dump.h — KILN_DUMP and KILN_LOG for GPU kernels (dump.c) */
#ifndef GPU_DUMP_H
#define GPU_DUMP_H

#include <stdbool.h>
#include <stddef.h>

#include "nvrtc.h"

/* With KILN_DUMP: kernel `name`'s source, its image (bytes of PTX text or
   a cubin for `arch`), PTX and SASS, and its manifest line; how: "nvrtc"
   or "disk"; cc: the device's compute capability (for the PTX). */
void gpu_dump_kernel(const char *name, const char *src, const void *image, size_t bytes, bool ptx,
                     const char *arch, int cc, const char *how, double nvrtc_ms);
/* With KILN_LOG=info: "kiln: gpu kernel <name>: <how>[ in <ms> ms]" */
void gpu_log_kernel(const char *name, const char *how, double nvrtc_ms);

#endif
