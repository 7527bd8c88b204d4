/* cuda_api.h — the few CUDA driver types, constants and entry points Kiln
 * uses, declared here rather than taken from the toolkit's cuda.h so one
 * build works on machines without the toolkit (DESIGN §6).  Values and
 * signatures are those of CUDA 13.0's cuda.h; every entry point in
 * GPU_CU_SYMBOLS is the newest ABI of its name (cuMemAlloc is cuMemAlloc_v2),
 * which is what cuGetProcAddress returns for a CUDA 12/13 version.  Only
 * jit_gpu/cuda.c resolves them (one table, DESIGN §6). */
#ifndef GPU_CUDA_API_H
#define GPU_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600

/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
/* cuStreamCreate: does not synchronize with the legacy NULL stream */
#define CU_STREAM_NON_BLOCKING 0x1
/* cuEventCreate: no timing data (cheaper) */
#define CU_EVENT_DISABLE_TIMING 0x2
/* cuGetProcAddress flags and the symbol status of its _v2 */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* the CUDA version whose symbol ABIs this file declares */
#define GPU_CUDA_API_VERSION 13000

/* found with plain dlsym: CUDA 12+ has _v2 (with the symbol status),
   11.3-11.8 only the first form */
typedef CUresult (*gpu_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cuda_version,
                                            uint64_t flags, int *symbol_status);
typedef CUresult (*gpu_cuGetProcAddress_v1)(const char *symbol, void **pfn, int cuda_version,
                                            uint64_t flags);

/* X(name, (parameters)): every other driver entry point, all returning
   CUresult, resolved through cuGetProcAddress by its base name */
#define GPU_CU_SYMBOLS(X)                                                                          \
  X(cuGetErrorName, (CUresult error, const char **str))                                            \
  X(cuGetErrorString, (CUresult error, const char **str))                                          \
  X(cuDriverGetVersion, (int *version))                                                            \
  X(cuInit, (unsigned int flags))                                                                  \
  X(cuDeviceGetCount, (int *count))                                                                \
  X(cuDeviceGet, (CUdevice * device, int ordinal))                                                 \
  X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                          \
  X(cuDeviceGetAttribute, (int *value, int attribute, CUdevice dev))                               \
  X(cuDeviceTotalMem, (size_t * bytes, CUdevice dev))                                              \
  X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                                     \
  X(cuCtxSetCurrent, (CUcontext ctx))                                                              \
  X(cuCtxSynchronize, (void))                                                                      \
  X(cuStreamCreate, (CUstream * stream, unsigned int flags))                                       \
  X(cuStreamSynchronize, (CUstream stream))                                                        \
  X(cuStreamDestroy, (CUstream stream))                                                            \
  X(cuEventCreate, (CUevent * event, unsigned int flags))                                          \
  X(cuEventRecord, (CUevent event, CUstream stream))                                               \
  X(cuEventSynchronize, (CUevent event))                                                           \
  X(cuEventQuery, (CUevent event))                                                                 \
  X(cuEventDestroy, (CUevent event))                                                               \
  X(cuMemAlloc, (CUdeviceptr * dptr, size_t bytes))                                                \
  X(cuMemFree, (CUdeviceptr dptr))                                                                 \
  X(cuMemAllocHost, (void **p, size_t bytes))                                                      \
  X(cuMemFreeHost, (void *p))                                                                      \
  X(cuMemcpyHtoDAsync, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))          \
  X(cuMemcpyDtoHAsync, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))                \
  X(cuMemcpyDtoDAsync, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))          \
  X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t n, CUstream stream))            \
  X(cuModuleLoadData, (CUmodule * module, const void *image))                                      \
  X(cuModuleGetFunction, (CUfunction * fn, CUmodule module, const char *name))                     \
  X(cuModuleUnload, (CUmodule module))                                                             \
  X(cuLaunchKernel, (CUfunction fn, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z, \
                     unsigned int block_x, unsigned int block_y, unsigned int block_z,             \
                     unsigned int shared_bytes, CUstream stream, void **params, void **extra))

#define GPU_CU_FIELD(name, params) CUresult(*name) params;
typedef struct gpu_cu_api {
  GPU_CU_SYMBOLS(GPU_CU_FIELD)
} gpu_cu_api;
#undef GPU_CU_FIELD

#endif
