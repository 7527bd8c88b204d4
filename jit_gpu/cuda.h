/* cuda.h — the CUDA runtime of the GPU backend (DESIGN §6): libcuda.so.1
 * through dlopen and every driver symbol through cuGetProcAddress (one
 * table); the primary context; a stream per user thread; device memory
 * through the caching allocator (jit_gpu/alloc.h); pinned staging for host
 * copies; op kernels compiled once per key with NVRTC and launched.  Every
 * failure is a KILN_ERR_DEVICE (or KILN_ERR_OOM) naming cuGetErrorName. */
#ifndef GPU_CUDA_H
#define GPU_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "alloc.h"
#include "opgen.h"

/* NULL when CUDA tensors can be used here; otherwise why not, one sentence
   ("no CUDA driver (libcuda.so.1: ...)", "cuGetProcAddress has no
   cuMemAlloc_v2", ...).  Initializes on first call (thread-safe). */
const char *gpu_unavailable(void);
/* "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, driver 13.0, NVRTC 13.0"
   (or the reason it is unavailable) */
const char *gpu_info(void);
int gpu_compute_capability(void); /* 90 for sm_90; 0 when unavailable */
size_t gpu_total_memory(void);

/* KILN_GPU_PROFILE=1: the host's time in each phase of the GPU's op-by-op
   and fused paths, counted per call and printed at exit (where the time
   of a launch goes on a real device; issue 43 measured 42 us an op) */
typedef enum {
  GPU_PROF_EXEC,      /* gpu_exec: one op on the interpreter, whole */
  GPU_PROF_TO_DEVICE, /* its host inputs (weak scalars) copied over */
  GPU_PROF_ALLOC,     /* its output allocated */
  GPU_PROF_PLAN,      /* its launches planned (opgen) */
  GPU_PROF_KERNEL,    /* a launch's kernel looked up */
  GPU_PROF_LAUNCH,    /* cuLaunchKernel itself */
  GPU_PROF_FUSED,     /* a fused group run (gpu_fused_run), whole */
  GPU_PROF_N
} gpu_prof_slot;
bool gpu_prof_on(void);
double gpu_prof_now(void); /* seconds; 0 when profiling is off */
void gpu_prof_add(gpu_prof_slot s,
                  double t0); /* the device's memory in bytes; 0 when unavailable */

/* device memory: NULL + error (KILN_ERR_OOM after the cache was freed and
   the allocation retried once) */
void *gpu_mem_alloc(size_t nbytes);
void gpu_mem_free(void *p, size_t nbytes);
/* copies; those that reach the host wait for the calling thread's stream */
bool gpu_copy_to_host(void *dst, const void *src, size_t nbytes);
bool gpu_copy_from_host(void *dst, const void *src, size_t nbytes);
bool gpu_copy_on_device(void *dst, const void *src, size_t nbytes);
/* runs one op call's launches on the calling thread's stream, compiling
   (memory cache, then disk cache, then NVRTC) what is missing */
bool gpu_run_op_plan(const gpu_op_plan *p);
/* The kernel `name` of CUDA C source src, loaded (the kernel cache,
   cache/kernel_cache.h, by name and compute capability, then the disk cache
   keyed by the source, then NVRTC): a reference to it in the kernel cache,
   held until gpu_kernel_release (a plan's, for as long as the plan lives:
   its module stays loaded meanwhile), or NULL + error.  Fused plan kernels
   (jit_gpu/fuse.h) come this way. */
void *gpu_kernel_load(const char *name, const char *src);
/* another reference to kernel (a second holder), and dropping one: the
   last makes it an unused kernel of the cache, kept up to
   KILN_KERNEL_CACHE_MAX of them, its module unloaded once it is dropped */
void gpu_kernel_retain(void *kernel);
void gpu_kernel_release(void *kernel);
/* Where kernel `name` of source src would come from if loaded now: the
   kernel cache (a lookup), the disk cache (its image stored), or NVRTC.
   The payoff rule prices a plan by it (jit_gpu/backend.c). */
typedef enum { GPU_KERNEL_IN_MEMORY, GPU_KERNEL_ON_DISK, GPU_KERNEL_TO_COMPILE } gpu_kernel_source;
gpu_kernel_source gpu_kernel_where(const char *name, const char *src);
/* The same in two steps, so that several kernels compile at once:
   prepare finds the kernel in memory or makes its image (the disk cache,
   else NVRTC) on any thread, with no CUDA context (NULL only when out of
   memory); finish, on a thread that may use the context, loads it and
   frees b: a reference as gpu_kernel_load's, or NULL + the error prepare
   or loading met. */
typedef struct gpu_kernel_build gpu_kernel_build;
gpu_kernel_build *gpu_kernel_prepare(const char *name, const char *src);
void *gpu_kernel_finish(gpu_kernel_build *b);
/* launches kernel (a reference from gpu_kernel_load, held by the caller)
   with its one by-value argument *args on the calling thread's stream */
bool gpu_kernel_launch(void *kernel, const char *name, void *args, unsigned grid, unsigned block);
/* waits for the calling thread's stream */
bool gpu_synchronize(void);

/* ---- added beside the contract above (jit_gpu/cuda.c) ---- */

/* Sets nbytes of device memory to zero, on the calling thread's stream. */
bool gpu_mem_zero(void *dst, size_t nbytes);
/* The calling thread's stream will touch the device block p (one from
   gpu_mem_alloc, possibly made by another thread): its free then waits for
   this stream as well (jit_gpu/alloc.h, the reuse rule).  Call it for
   every operand of work on a thread other than the one that allocated
   it; cheap, and harmless when p is the calling thread's own. */
void gpu_mem_record_use(const void *p);
/* Returns every cached device block to the driver (after waiting for the
   device); false + error when the wait failed. */
bool gpu_mem_trim(void);
/* the allocator's counters; false (zeros) when CUDA is unavailable */
bool gpu_mem_stats(gpu_alloc_stats *s);
/* The calling thread's stream (a CUstream), created on first use with the
   primary context made current on this thread; NULL + error when CUDA is
   unavailable. */
void *gpu_stream(void);
/* Per-thread state of jit_gpu/blas.c (its cuBLAS handle), kept beside the
   stream: the calling thread's slot (NULL + error when CUDA is
   unavailable).  At thread exit cuda.c calls the registered exit function
   on a non-NULL slot value first, then synchronizes and destroys the
   stream. */
void **gpu_thread_blas_slot(void);
void gpu_set_blas_thread_exit(void (*fn)(void *state));

#endif
