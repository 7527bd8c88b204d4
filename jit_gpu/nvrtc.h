/* nvrtc.h — NVRTC, loaded at run time (libnvrtc.so.13, with its builtins
 * preloaded): CUDA C to a cubin for the device's sm_XY, or to PTX for the
 * highest compute_XX NVRTC knows when it does not know the device. */
#ifndef GPU_NVRTC_H
#define GPU_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gpu_image {
  void *data; /* malloc'd */
  size_t size;
  bool ptx;      /* PTX text (the driver JIT-compiles it) rather than a cubin */
  char arch[16]; /* "sm_90" or "compute_90" */
  double ms;     /* NVRTC's wall time */
} gpu_image;

/* whether NVRTC loads; why not into why (cap bytes) otherwise */
bool gpu_nvrtc_available(char *why, size_t cap);
/* NVRTC's version as major*1000 + minor*10 (13000 for 13.0), 0 if absent */
int gpu_nvrtc_version(void);
/* Compiles src for compute capability cc (90 for sm_90).  False with
 *log (malloc'd: NVRTC's log or why it could not run) on failure. */
bool gpu_nvrtc_compile(const char *src, const char *name, int cc, gpu_image *img, char **log);
/* the same, always PTX (for compute_XX of the architecture chosen above):
   what KILN_DUMP shows */
bool gpu_nvrtc_compile_ptx(const char *src, const char *name, int cc, gpu_image *img, char **log);
void gpu_image_free(gpu_image *img);

#endif
