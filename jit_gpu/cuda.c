/* cuda.c — the CUDA runtime of the GPU backend (cuda.h, DESIGN §6):
 * libcuda.so.1 through dlopen and every driver entry point through
 * cuGetProcAddress into one table (cuda_api.h); device 0's primary
 * context; a stream per user thread (with its pinned staging buffer),
 * destroyed at thread exit; device memory through the caching allocator
 * (alloc.h); op kernels found in memory, then on disk, then compiled with
 * NVRTC, and launched.  Loaded kernels live in the kernel cache shared with
 * the CPU (cache/kernel_cache.h): a module per kernel, unloaded by its rule.
 * Process-wide state is the one `rt` struct; per thread there is only the
 * gpu_thread a thread-local points to. */
#include "cuda.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../cache/disk.h"
#include "../cache/kernel_cache.h"
#include "../vm/state.h"
#include "cuda_api.h"
#include "dump.h"
#include "nvrtc.h"

/* the oldest driver with cuGetProcAddress, and the oldest device CUDA 13's
   NVRTC compiles for */
#define GPU_MIN_DRIVER 11030
#define GPU_MIN_CC 75
/* per-thread pinned staging buffer for host copies, used as two halves so
   one half is filled while the other is in flight */
#define GPU_STAGING_BYTES ((size_t)8 << 20)
#define GPU_STAGING_HALF (GPU_STAGING_BYTES / 2)
/* a disk-cache blob: kind byte ('C' cubin, 'P' PTX), arch[16], the image */
#define GPU_BLOB_HEADER 17
#define GPU_KERNEL_NAME 128

#define GPU_CHECK_NAMES 64

typedef struct gpu_thread {
  CUstream stream;
  char *pinned;         /* GPU_STAGING_BYTES of pinned host memory, made on first copy */
  CUevent half_done[2]; /* recorded after the last copy through each half */
  bool half_busy[2];    /* that copy may still be running */
  int next_half;
  size_t small_used; /* bytes of small host-to-device copies packed into next_half (no event yet) */
  void *blas;        /* blas.c's state (gpu_thread_blas_slot) */
  /* the index ops' record (opgen.h gpu_index_check): on the device, made
     zeroed on the first index op; its host copy after a read (pinned);
     armed: an index op ran since the host last read it */
  gpu_index_check *check;
  gpu_index_check *check_host;
  bool check_armed;
  bool check_fetched; /* its copy to check_host is enqueued, ahead of a wait */
  /* the index ops' numbers (the last is check_seq) and the calls that
     recorded the last GPU_CHECK_NAMES of them: the error's name */
  uint32_t check_seq;
  const char *check_api[GPU_CHECK_NAMES];
} gpu_thread;

/* a kernel's id in the kernel cache: "<entry name>@<cc>" */
#define GPU_KERNEL_ID (GPU_KERNEL_NAME + 16)

static struct gpu_runtime {
  pthread_once_t once, info_once;
  const char *unavailable; /* NULL when usable; else points at reason */
  char reason[512];
  void *lib;
  gpu_cuGetProcAddress_v2 get_proc_v2;
  gpu_cuGetProcAddress_v1 get_proc_v1;
  gpu_cu_api cu;
  int driver_version, api_version;
  CUdevice device;
  CUcontext ctx;
  int cc; /* 90 for sm_90 */
  char name[256];
  size_t total_mem;
  char info[640];
  gpu_alloc *alloc;
  pthread_key_t thread_key;
  void (*blas_thread_exit)(void *);
} rt = {.once = PTHREAD_ONCE_INIT, .info_once = PTHREAD_ONCE_INIT};

static _Thread_local gpu_thread *this_thread;

/* ---- errors ---- */

/* names for the errors of a driver that cannot name them itself (before
   cuGetErrorName is resolved, or a stub library) */
static const char *cu_fallback_name(CUresult rc, const char **desc) {
  switch (rc) {
    case 1:
      return *desc = "invalid argument", "CUDA_ERROR_INVALID_VALUE";
    case 3:
      return *desc = "initialization error", "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
      return *desc = "the CUDA driver is a stub library: no NVIDIA driver is installed",
             "CUDA_ERROR_STUB_LIBRARY";
    case 35:
      return *desc = "the NVIDIA driver is older than the CUDA version asked for",
             "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100:
      return *desc = "no CUDA-capable device is detected", "CUDA_ERROR_NO_DEVICE";
    default:
      return NULL;
  }
}

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" into buf */
static const char *cu_describe(CUresult rc, char *buf, size_t cap) {
  const char *name = NULL, *desc = NULL;
  if (!rt.cu.cuGetErrorName || rt.cu.cuGetErrorName(rc, &name) != CUDA_SUCCESS) name = NULL;
  if (!rt.cu.cuGetErrorString || rt.cu.cuGetErrorString(rc, &desc) != CUDA_SUCCESS) desc = NULL;
  if (!name) name = cu_fallback_name(rc, &desc);
  if (name)
    snprintf(buf, cap, "%s (%s)", name, desc ? desc : "no description");
  else
    snprintf(buf, cap, "CUDA error %d", (int)rc);
  return buf;
}

/* true on success; else KILN_ERR_DEVICE "<what> failed: NAME (description)" */
static bool cu_ok(CUresult rc, const char *what) {
  if (rc == CUDA_SUCCESS) return true;
  char d[256];
  vm_error(KILN_ERR_DEVICE, "%s failed: %s", what, cu_describe(rc, d, sizeof d));
  return false;
}

static void set_unavailable(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_unavailable(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rt.reason, sizeof rt.reason, fmt, ap);
  va_end(ap);
  rt.unavailable = rt.reason;
}

/* ---- start-up: the driver, its entry points, the device, the context ---- */

/* One entry point through cuGetProcAddress; NULL (with why) when the
   driver has none for this version. */
static void *get_proc(const char *name, int version, char *why, size_t cap) {
  void *fn = NULL;
  int status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult rc = rt.get_proc_v2
                    ? rt.get_proc_v2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status)
                    : rt.get_proc_v1(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
  if (rc == CUDA_SUCCESS && fn) return fn;
  char d[256];
  if (rc != CUDA_SUCCESS)
    snprintf(why, cap, "cuGetProcAddress(%s, %d) failed: %s", name, version,
             cu_describe(rc, d, sizeof d));
  else
    snprintf(why, cap, "cuGetProcAddress has no %s for CUDA %d.%d%s", name, version / 1000,
             version % 1000 / 10,
             status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                 ? " (it needs a newer CUDA version)"
                 : "");
  return NULL;
}

static bool resolve_all(void) {
  char why[384];
  /* error names first (resolved again below), so what fails can be named */
  void *fn = get_proc("cuGetErrorName", GPU_MIN_DRIVER, why, sizeof why);
  memcpy(&rt.cu.cuGetErrorName, &fn, sizeof fn);
  fn = get_proc("cuGetErrorString", GPU_MIN_DRIVER, why, sizeof why);
  memcpy(&rt.cu.cuGetErrorString, &fn, sizeof fn);
  fn = get_proc("cuDriverGetVersion", GPU_MIN_DRIVER, why, sizeof why);
  if (!fn) return set_unavailable("%s", why), false;
  memcpy(&rt.cu.cuDriverGetVersion, &fn, sizeof fn);
  if (rt.cu.cuDriverGetVersion(&rt.driver_version) != CUDA_SUCCESS ||
      rt.driver_version < GPU_MIN_DRIVER)
    return set_unavailable("the CUDA driver is too old (version %d; CUDA 11.3 or newer is needed)",
                           rt.driver_version),
           false;
  /* asking for a version above the driver's is an error (cuda.h) */
  rt.api_version =
      rt.driver_version < GPU_CUDA_API_VERSION ? rt.driver_version : GPU_CUDA_API_VERSION;
#define GPU_CU_RESOLVE(name, params)                                              \
  fn = get_proc(#name, rt.api_version, why, sizeof why);                          \
  if (!fn)                                                                        \
    return set_unavailable("the CUDA driver %d.%d: %s", rt.driver_version / 1000, \
                           rt.driver_version % 1000 / 10, why),                   \
           false;                                                                 \
  memcpy(&rt.cu.name, &fn, sizeof fn);
  GPU_CU_SYMBOLS(GPU_CU_RESOLVE)
#undef GPU_CU_RESOLVE
  return true;
}

/* a failed start-up call: the backend is off, and says why */
static bool start_ok(CUresult rc, const char *what) {
  if (rc == CUDA_SUCCESS) return true;
  char d[256];
  set_unavailable("%s failed: %s", what, cu_describe(rc, d, sizeof d));
  return false;
}

static bool open_device(void) {
  int count = 0, major = 0, minor = 0;
  if (!start_ok(rt.cu.cuInit(0), "cuInit") ||
      !start_ok(rt.cu.cuDeviceGetCount(&count), "cuDeviceGetCount"))
    return false;
  if (count <= 0) return set_unavailable("the CUDA driver reports no device"), false;
  if (!start_ok(rt.cu.cuDeviceGet(&rt.device, 0), "cuDeviceGet") ||
      !start_ok(rt.cu.cuDeviceGetName(rt.name, (int)sizeof rt.name - 1, rt.device),
                "cuDeviceGetName") ||
      !start_ok(rt.cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                           rt.device),
                "cuDeviceGetAttribute(compute capability major)") ||
      !start_ok(rt.cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                           rt.device),
                "cuDeviceGetAttribute(compute capability minor)") ||
      !start_ok(rt.cu.cuDeviceTotalMem(&rt.total_mem, rt.device), "cuDeviceTotalMem"))
    return false;
  rt.cc = major * 10 + minor;
  if (rt.cc < GPU_MIN_CC)
    return set_unavailable("%s is sm_%d; Kiln's CUDA backend needs sm_%d or newer", rt.name, rt.cc,
                           GPU_MIN_CC),
           false;
  return start_ok(rt.cu.cuDevicePrimaryCtxRetain(&rt.ctx, rt.device), "cuDevicePrimaryCtxRetain");
}

static int raw_alloc(void *ctx, size_t bytes, void **addr) {
  (void)ctx;
  CUdeviceptr p = 0;
  CUresult rc = rt.cu.cuMemAlloc(&p, bytes);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return GPU_RAW_OOM;
  char what[64];
  snprintf(what, sizeof what, "cuMemAlloc(%zu bytes)", bytes);
  if (!cu_ok(rc, what)) return GPU_RAW_ERROR;
  *addr = (void *)(uintptr_t)p;
  return GPU_RAW_OK;
}

static void raw_free(void *ctx, void *addr) {
  (void)ctx;
  (void)rt.cu.cuMemFree((CUdeviceptr)(uintptr_t)addr); /* a failure leaves nothing to undo */
}

static bool sync_all(void *ctx) {
  (void)ctx;
  return cu_ok(rt.cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

static void thread_exit(void *state);

static void init_runtime(void) {
  dlerror();
  /* KILN_CUDA_LIB: another library in its place (the CUDA emulation of
     tests/gpu_emu, or a driver outside the loader's path) */
  const char *lib = getenv("KILN_CUDA_LIB");
  if (!lib || !*lib) lib = "libcuda.so.1";
  rt.lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!rt.lib) {
    const char *err = dlerror();
    set_unavailable("no CUDA driver (%s)", err ? err : "the driver library cannot be loaded");
    return;
  }
  /* the one pair found with dlsym: everything else comes through them */
  rt.get_proc_v2 = (gpu_cuGetProcAddress_v2)dlsym(rt.lib, "cuGetProcAddress_v2");
  if (!rt.get_proc_v2) rt.get_proc_v1 = (gpu_cuGetProcAddress_v1)dlsym(rt.lib, "cuGetProcAddress");
  if (!rt.get_proc_v2 && !rt.get_proc_v1) {
    set_unavailable(
        "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress (CUDA 11.3 or newer "
        "is needed)");
    return;
  }
  /* the library stays loaded even when unusable: unloading a driver is
     not worth the risk */
  if (!resolve_all() || !open_device()) return;
  static const gpu_raw_ops ops = {NULL, raw_alloc, raw_free, sync_all};
  rt.alloc = gpu_alloc_new(&ops);
  if (!rt.alloc) return set_unavailable("out of host memory creating the GPU allocator");
  if (pthread_key_create(&rt.thread_key, thread_exit) != 0)
    return set_unavailable("pthread_key_create failed for the per-thread CUDA stream");
}

const char *gpu_unavailable(void) {
  pthread_once(&rt.once, init_runtime);
  return rt.unavailable;
}

int gpu_compute_capability(void) { return gpu_unavailable() ? 0 : rt.cc; }
size_t gpu_total_memory(void) { return gpu_unavailable() ? 0 : rt.total_mem; }

/* ---- KILN_GPU_PROFILE ---- */

static _Atomic long long prof_ns[GPU_PROF_N], prof_calls[GPU_PROF_N];
static int prof_state = -1; /* -1: not read yet */

static void prof_print(void) {
  static const char *names[GPU_PROF_N] = {
      "op (interpreter)", "  inputs to device", "  output alloc", "  launch plan",
      "  kernel lookup",  "  cuLaunchKernel",   "fused group run"};
  fprintf(stderr, "kiln GPU host profile (KILN_GPU_PROFILE)\n  %-22s %10s %12s %10s\n", "phase",
          "calls", "total ms", "us/call");
  for (int s = 0; s < GPU_PROF_N; s++) {
    long long n = atomic_load(&prof_calls[s]), ns = atomic_load(&prof_ns[s]);
    if (n)
      fprintf(stderr, "  %-22s %10lld %12.2f %10.2f\n", names[s], n, (double)ns / 1e6,
              (double)ns / 1e3 / (double)n);
  }
}

bool gpu_prof_on(void) {
  if (prof_state < 0) {
    prof_state = vm_env_long("KILN_GPU_PROFILE", 0) != 0;
    if (prof_state) atexit(prof_print);
  }
  return prof_state;
}

double gpu_prof_now(void) {
  if (!gpu_prof_on()) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void gpu_prof_add(gpu_prof_slot s, double t0) {
  if (!t0) return;
  atomic_fetch_add(&prof_ns[s], (long long)((gpu_prof_now() - t0) * 1e9));
  atomic_fetch_add(&prof_calls[s], 1);
}

static void init_info(void) {
  if (rt.unavailable) {
    snprintf(rt.info, sizeof rt.info, "CUDA unavailable: %s", rt.unavailable);
    return;
  }
  int nv = gpu_nvrtc_version();
  char nvrtc[32];
  if (nv > 0)
    snprintf(nvrtc, sizeof nvrtc, "NVRTC %d.%d", nv / 1000, nv % 1000 / 10);
  else
    snprintf(nvrtc, sizeof nvrtc, "no NVRTC");
  snprintf(rt.info, sizeof rt.info, "%s, sm_%d, %.1f GiB, driver %d.%d, %s", rt.name, rt.cc,
           (double)rt.total_mem / (1024.0 * 1024.0 * 1024.0), rt.driver_version / 1000,
           rt.driver_version % 1000 / 10, nvrtc);
}

const char *gpu_info(void) {
  gpu_unavailable();
  pthread_once(&rt.info_once, init_info);
  return rt.info;
}

/* ---- the calling thread: context, stream, staging ---- */

static bool unavailable_error(void) {
  const char *why = gpu_unavailable();
  if (!why) return false;
  vm_error(KILN_ERR_DEVICE, "CUDA is not available: %s", why);
  return true;
}

/* The calling thread's state, made on first use: the primary context made
   current here and a non-blocking stream of its own.  NULL + error. */
static gpu_thread *thread_get(void) {
  if (this_thread) return this_thread;
  if (unavailable_error()) return NULL;
  if (!cu_ok(rt.cu.cuCtxSetCurrent(rt.ctx), "cuCtxSetCurrent")) return NULL;
  gpu_thread *t = calloc(1, sizeof *t);
  if (!t) {
    vm_error(KILN_ERR_OOM, "out of host memory setting up this thread's CUDA stream");
    return NULL;
  }
  if (!cu_ok(rt.cu.cuStreamCreate(&t->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    free(t);
    return NULL;
  }
  if (pthread_setspecific(rt.thread_key, t) != 0) {
    (void)rt.cu.cuStreamDestroy(t->stream);
    free(t);
    vm_error(KILN_ERR_DEVICE, "pthread_setspecific failed for this thread's CUDA stream");
    return NULL;
  }
  this_thread = t;
  return t;
}

static void count_wait(void) {
  atomic_fetch_add_explicit(&vm_process()->stats.device_waits, 1, memory_order_relaxed);
}

/* the host waits for everything enqueued on t's stream */
static bool stream_wait(gpu_thread *t) {
  uint64_t stamp = gpu_alloc_stamp(rt.alloc);
  count_wait();
  if (!cu_ok(rt.cu.cuStreamSynchronize(t->stream), "cuStreamSynchronize")) return false;
  gpu_alloc_synced(rt.alloc, (uintptr_t)t->stream, stamp);
  return true;
}

/* t's index record (opgen.h gpu_index_check), made zeroed on first use */
static gpu_index_check *index_record(gpu_thread *t) {
  if (t->check) return t->check;
  void *p = NULL;
  if (!gpu_alloc_get(rt.alloc, sizeof(gpu_index_check), (uintptr_t)t->stream, &p)) return NULL;
  if (!cu_ok(
          rt.cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)p, 0, sizeof(gpu_index_check), t->stream),
          "cuMemsetD8Async (index check record)")) {
    gpu_alloc_put(rt.alloc, p, (uintptr_t)t->stream);
    return NULL;
  }
  return t->check = p;
}

/* Enqueues the copy of t's record to the host when index ops ran since the
   last read: a read of a value does this before its own copies, so the
   wait it makes anyway covers the record too */
static bool index_checks_fetch(gpu_thread *t) {
  if (!t->check_armed || t->check_fetched) return true;
  if (!t->check_host && !cu_ok(rt.cu.cuMemAllocHost((void **)&t->check_host, sizeof *t->check_host),
                               "cuMemAllocHost (index check record)"))
    return false;
  if (!cu_ok(rt.cu.cuMemcpyDtoHAsync(t->check_host, (CUdeviceptr)(uintptr_t)t->check,
                                     sizeof *t->check_host, t->stream),
             "cuMemcpyDtoHAsync (index check record)"))
    return false;
  t->check_fetched = true;
  return true;
}

/* After the host waited for t's stream (its work is done): the index ops
   run since the last read, checked (the record fetched before the wait,
   or now, with a wait of its own).  false + the interpreter's error when
   one had an index out of range; the record is cleared for the next. */
static bool index_checks_read(gpu_thread *t) {
  if (!t->check_armed) return true;
  if (!t->check_fetched && !(index_checks_fetch(t) && stream_wait(t))) {
    t->check_fetched = false;
    return false;
  }
  t->check_fetched = false;
  t->check_armed = false;
  CUdeviceptr rec = (CUdeviceptr)(uintptr_t)t->check;
  const gpu_index_check *r = t->check_host;
  if (!r->sealed) return true;
  /* named after the call that recorded the op, when it is among the last
     GPU_CHECK_NAMES checked (else after this read's) */
  const char *api = vm_thread()->api;
  if (t->check_seq - r->op < GPU_CHECK_NAMES && t->check_api[r->op % GPU_CHECK_NAMES])
    vm_set_api(t->check_api[r->op % GPU_CHECK_NAMES]);
  (void)gpu_index_check_report(r);
  vm_set_api(api);
  if (!cu_ok(rt.cu.cuMemsetD8Async(rec, 0, sizeof *t->check_host, t->stream),
             "cuMemsetD8Async (index check record)"))
    t->check_armed = true; /* still sealed: the next read reports it again */
  return false;
}

/* KILN_GPU_SYNC_CHECKS=1: an index op's record is read right after it */
static bool sync_checks(void) { return vm_env_long("KILN_GPU_SYNC_CHECKS", 0) != 0; }

/* At thread exit: blas.c's state, then the stream's work, then the stream.
   Errors are ignored: there is no one left to report them to, and the
   process may be tearing the driver down. */
static void thread_exit(void *state) {
  gpu_thread *t = state;
  this_thread = t; /* blas.c's exit frees its workspace through gpu_mem_free */
  if (t->blas && rt.blas_thread_exit) rt.blas_thread_exit(t->blas);
  t->blas = NULL;
  uint64_t stamp = gpu_alloc_stamp(rt.alloc);
  if (rt.cu.cuStreamSynchronize(t->stream) == CUDA_SUCCESS) {
    if (!index_checks_read(t))
      fprintf(stderr,
              "kiln: a thread ended with an error on its CUDA stream that no read reported: %s\n",
              vm_thread()->message);
    gpu_alloc_synced(rt.alloc, (uintptr_t)t->stream, stamp);
    if (t->check) gpu_alloc_put(rt.alloc, t->check, (uintptr_t)t->stream);
    gpu_alloc_stream_retired(rt.alloc, (uintptr_t)t->stream);
  }
  if (t->check_host) (void)rt.cu.cuMemFreeHost(t->check_host);
  for (int h = 0; h < 2; h++)
    if (t->half_done[h]) (void)rt.cu.cuEventDestroy(t->half_done[h]);
  if (t->pinned) (void)rt.cu.cuMemFreeHost(t->pinned);
  (void)rt.cu.cuStreamDestroy(t->stream);
  this_thread = NULL;
  free(t);
}

void *gpu_stream(void) {
  gpu_thread *t = thread_get();
  return t ? (void *)t->stream : NULL;
}

void **gpu_thread_blas_slot(void) {
  gpu_thread *t = thread_get();
  return t ? &t->blas : NULL;
}

void gpu_set_blas_thread_exit(void (*fn)(void *state)) { rt.blas_thread_exit = fn; }

static bool staging_ready(gpu_thread *t) {
  if (t->pinned) return true;
  for (int h = 0; h < 2; h++)
    if (!t->half_done[h] &&
        !cu_ok(rt.cu.cuEventCreate(&t->half_done[h], CU_EVENT_DISABLE_TIMING), "cuEventCreate"))
      return false;
  void *p = NULL;
  char what[96];
  snprintf(what, sizeof what, "cuMemAllocHost(%zu bytes of pinned staging memory)",
           GPU_STAGING_BYTES);
  if (!cu_ok(rt.cu.cuMemAllocHost(&p, GPU_STAGING_BYTES), what)) return false;
  t->pinned = p;
  return true;
}

/* waits until no copy is using staging half h (the host waits only when
   its event has not passed yet) */
static bool half_wait(gpu_thread *t, int h) {
  if (!t->half_busy[h]) return true;
  CUresult q = rt.cu.cuEventQuery(t->half_done[h]);
  if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
    return cu_ok(q, "cuEventQuery (staging copy)");
  if (q == CUDA_ERROR_NOT_READY) {
    count_wait();
    if (!cu_ok(rt.cu.cuEventSynchronize(t->half_done[h]), "cuEventSynchronize (staging copy)"))
      return false;
  }
  t->half_busy[h] = false;
  return true;
}

/* marks half h in use by the copy just enqueued; if the event cannot be
   recorded, waits for the whole stream instead so the half is free again */
static bool half_enqueued(gpu_thread *t, int h) {
  if (cu_ok(rt.cu.cuEventRecord(t->half_done[h], t->stream), "cuEventRecord (staging copy)")) {
    t->half_busy[h] = true;
    return true;
  }
  (void)rt.cu.cuStreamSynchronize(t->stream);
  return false;
}

/* ---- memory ---- */

void *gpu_mem_alloc(size_t nbytes) {
  gpu_thread *t = thread_get();
  void *p = NULL;
  if (t && !gpu_alloc_get(rt.alloc, nbytes, (uintptr_t)t->stream, &p)) return NULL;
  return p;
}

void gpu_mem_free(void *p, size_t nbytes) {
  (void)nbytes; /* the allocator knows each block's size */
  if (!p || gpu_unavailable()) return;
  /* a thread with no stream has enqueued nothing: no need to make one */
  gpu_alloc_put(rt.alloc, p, this_thread ? (uintptr_t)this_thread->stream : 0);
}

void gpu_mem_record_use(const void *p) {
  gpu_thread *t = p ? thread_get() : NULL;
  if (t) gpu_alloc_record_use(rt.alloc, (void *)p, (uintptr_t)t->stream);
}

bool gpu_mem_trim(void) { return thread_get() && gpu_alloc_trim(rt.alloc); }

bool gpu_mem_stats(gpu_alloc_stats *s) {
  memset(s, 0, sizeof *s);
  if (gpu_unavailable()) return false;
  gpu_alloc_get_stats(rt.alloc, s);
  return true;
}

bool gpu_mem_zero(void *dst, size_t nbytes) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  return !nbytes || cu_ok(rt.cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, 0, nbytes, t->stream),
                          "cuMemsetD8Async");
}

/* ---- copies ---- */

/* Small host-to-device copies (a 0-d scalar an op takes) are packed one
   after another into the current staging half, which gets its event only
   when it is full (or a large copy needs it): the host waits for the
   device only every half's worth of them, never once per copy. */
#define GPU_STAGING_SMALL ((size_t)4096)

/* ends the current half's run of small copies: its event follows them */
static bool small_close(gpu_thread *t) {
  if (!t->small_used) return true;
  t->small_used = 0;
  bool ok = half_enqueued(t, t->next_half);
  t->next_half ^= 1;
  return ok;
}

static bool small_copy(gpu_thread *t, void *dst, const void *src, size_t nbytes) {
  size_t at = (t->small_used + 15) & ~(size_t)15;
  if (at + nbytes > GPU_STAGING_HALF) {
    if (!small_close(t)) return false;
    at = 0;
  }
  int h = t->next_half;
  if (at == 0 && !half_wait(t, h)) return false;
  char *stage = t->pinned + (size_t)h * GPU_STAGING_HALF + at;
  memcpy(stage, src, nbytes);
  if (!cu_ok(rt.cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, stage, nbytes, t->stream),
             "cuMemcpyHtoDAsync"))
    return false;
  t->small_used = at + nbytes;
  return true;
}

bool gpu_copy_from_host(void *dst, const void *src, size_t nbytes) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  if (!nbytes) return true;
  if (!staging_ready(t)) return false;
  if (nbytes <= GPU_STAGING_SMALL) return small_copy(t, dst, src, nbytes);
  if (!small_close(t)) return false;
  int h = t->next_half;
  bool ok = true;
  for (size_t off = 0; ok && off < nbytes; off += GPU_STAGING_HALF) {
    size_t n = nbytes - off < GPU_STAGING_HALF ? nbytes - off : GPU_STAGING_HALF;
    char *stage = t->pinned + (size_t)h * GPU_STAGING_HALF;
    ok = half_wait(t, h);
    if (ok) {
      memcpy(stage, (const char *)src + off, n);
      ok = cu_ok(rt.cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst + off, stage, n, t->stream),
                 "cuMemcpyHtoDAsync") &&
           half_enqueued(t, h);
    }
    h ^= 1;
  }
  t->next_half = h;
  return ok;
}

/* Chunks go device -> staging half -> dst, two halves in flight: while one
   chunk is copied out on the host the next is on its way. */
bool gpu_copy_to_host(void *dst, const void *src, size_t nbytes) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  if (!nbytes) return gpu_synchronize();
  if (!staging_ready(t) || !small_close(t) || !index_checks_fetch(t)) return false;
  struct {
    char *dst;
    size_t n;
  } pending[2] = {{NULL, 0}, {NULL, 0}};
  uint64_t stamp = 0;
  int h = t->next_half;
  bool ok = true;
  for (size_t off = 0; ok && off < nbytes; off += GPU_STAGING_HALF) {
    size_t n = nbytes - off < GPU_STAGING_HALF ? nbytes - off : GPU_STAGING_HALF;
    char *stage = t->pinned + (size_t)h * GPU_STAGING_HALF;
    ok = half_wait(t, h) &&
         cu_ok(rt.cu.cuMemcpyDtoHAsync(stage, (CUdeviceptr)(uintptr_t)src + off, n, t->stream),
               "cuMemcpyDtoHAsync");
    if (ok) stamp = gpu_alloc_stamp(rt.alloc); /* before the event the last wait is on */
    ok = ok && half_enqueued(t, h);
    if (ok) pending[h].dst = (char *)dst + off, pending[h].n = n;
    int prev = h ^ 1;
    if (ok && pending[prev].n && (ok = half_wait(t, prev))) {
      memcpy(pending[prev].dst, t->pinned + (size_t)prev * GPU_STAGING_HALF, pending[prev].n);
      pending[prev].n = 0;
    }
    h ^= 1;
  }
  int last = h ^ 1;
  if (ok && pending[last].n && (ok = half_wait(t, last)))
    memcpy(pending[last].dst, t->pinned + (size_t)last * GPU_STAGING_HALF, pending[last].n);
  t->next_half = h;
  /* the last event follows all earlier work on the stream (the record's
     copy too): it has finished */
  if (ok)
    gpu_alloc_synced(rt.alloc, (uintptr_t)t->stream, stamp);
  else
    t->check_fetched = false; /* not known to have arrived: fetched again */
  return ok && index_checks_read(t);
}

bool gpu_copy_on_device(void *dst, const void *src, size_t nbytes) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  return !nbytes || cu_ok(rt.cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst,
                                                  (CUdeviceptr)(uintptr_t)src, nbytes, t->stream),
                          "cuMemcpyDtoDAsync");
}

bool gpu_synchronize(void) {
  gpu_thread *t = thread_get();
  return t && index_checks_fetch(t) && stream_wait(t) && index_checks_read(t);
}

/* ---- kernels: memory cache, disk cache, NVRTC ---- */

/* The disk cache's key: the source and everything that changes the code
   made from it (the target, NVRTC's and the driver's versions, and the
   device's name: the CUDA emulation's images are no cubins). */
static void kernel_disk_hash(const char *src, uint64_t h[2]) {
  char head[128 + sizeof rt.name];
  int n = snprintf(head, sizeof head, "kiln-cuda-kernel 1 sm_%d nvrtc %d driver %d %s\n", rt.cc,
                   gpu_nvrtc_version(), rt.driver_version, rt.name);
  XXH3_state_t *s = XXH3_createState();
  if (!s) {
    h[0] = h[1] = 0; /* no disk cache this time: the caller checks */
    return;
  }
  XXH3_128bits_reset(s);
  XXH3_128bits_update(s, head, (size_t)n);
  XXH3_128bits_update(s, src, strlen(src));
  XXH128_hash_t d = XXH3_128bits_digest(s);
  XXH3_freeState(s);
  h[0] = d.high64;
  h[1] = d.low64;
}

/* a code image to load: `image` points into `owned` (malloc'd) */
typedef struct {
  void *owned;
  const void *image;
  size_t size; /* of image */
  bool ptx;
  char arch[16];   /* "sm_90", "compute_90" */
  double nvrtc_ms; /* 0: from the disk cache */
} kernel_image;

/* the image stored for h, if the disk cache has a well-formed one */
static bool image_from_disk(const uint64_t h[2], kernel_image *out) {
  size_t len = 0;
  uint8_t *blob = cache_disk_blob_get(h, &len);
  if (!blob) return false;
  bool ptx = blob[0] == 'P';
  bool ok = len > GPU_BLOB_HEADER && (blob[0] == 'C' || ptx) && (!ptx || blob[len - 1] == '\0');
  if (!ok) {
    free(blob);
    return false;
  }
  out->owned = blob;
  out->image = blob + GPU_BLOB_HEADER;
  out->size = len - GPU_BLOB_HEADER;
  out->ptx = ptx;
  memcpy(out->arch, blob + 1, sizeof out->arch - 1); /* NUL-padded in the header */
  out->arch[sizeof out->arch - 1] = '\0';
  atomic_fetch_add_explicit(&vm_process()->stats.gpu_disk_loads, 1, memory_order_relaxed);
  return true;
}

static void image_to_disk(const uint64_t h[2], const gpu_image *img) {
  size_t len = GPU_BLOB_HEADER + img->size;
  uint8_t *blob = malloc(len);
  if (!blob) return; /* the disk cache is an optimization */
  blob[0] = img->ptx ? 'P' : 'C';
  memset(blob + 1, 0, GPU_BLOB_HEADER - 1);
  memcpy(blob + 1, img->arch, strnlen(img->arch, GPU_BLOB_HEADER - 2));
  memcpy(blob + GPU_BLOB_HEADER, img->data, img->size);
  (void)cache_disk_blob_put(h, blob, len);
  free(blob);
}

/* NVRTC: the image for name's source; stored on disk when it can be */
static bool image_compiled(const char *src, const char *name, const uint64_t h[2], bool use_disk,
                           kernel_image *out) {
  gpu_image img = {0};
  char *log = NULL;
  if (!gpu_nvrtc_compile(src, name, rt.cc, &img, &log)) {
    vm_error(KILN_ERR_DEVICE, "NVRTC could not compile kernel %s for sm_%d: %s", name, rt.cc,
             log ? log : "no log");
    free(log);
    gpu_image_free(&img);
    return false;
  }
  free(log);
  if (img.ptx && (!img.size || ((const char *)img.data)[img.size - 1] != '\0')) {
    /* cuModuleLoadData reads PTX as a C string */
    char *z = realloc(img.data, img.size + 1);
    if (!z) {
      gpu_image_free(&img);
      vm_error(KILN_ERR_OOM, "out of host memory loading kernel %s", name);
      return false;
    }
    z[img.size] = '\0';
    img.data = z;
    img.size++;
  }
  atomic_fetch_add_explicit(&vm_process()->stats.kernels_compiled, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&vm_process()->stats.nvrtc_us, (uint_fast64_t)(img.ms * 1e3),
                            memory_order_relaxed);
  if (use_disk) image_to_disk(h, &img);
  out->owned = img.data; /* ownership moves: img is not freed */
  out->image = img.data;
  out->size = img.size;
  out->ptx = img.ptx;
  memcpy(out->arch, img.arch, sizeof out->arch);
  out->nvrtc_ms = img.ms;
  return true;
}

/* loads a module from the image and finds name in it */
static bool module_load(const kernel_image *img, const char *name, CUmodule *mod, CUfunction *fn) {
  char what[GPU_KERNEL_NAME + 64];
  snprintf(what, sizeof what, "cuModuleLoadData (kernel %s)", name);
  if (!cu_ok(rt.cu.cuModuleLoadData(mod, img->image), what)) return false;
  snprintf(what, sizeof what, "cuModuleGetFunction(%s)", name);
  if (cu_ok(rt.cu.cuModuleGetFunction(fn, *mod, name), what)) return true;
  (void)rt.cu.cuModuleUnload(*mod);
  return false;
}

/* the kernel cache's key of id (name@cc): its hash; id itself is the
   description compared on a hit */
static void kernel_id_key(const char *id, uint64_t key[2]) {
  XXH128_hash_t h = XXH3_128bits(id, strlen(id));
  key[0] = h.high64;
  key[1] = h.low64;
}

/* a kernel's id in the kernel cache: its name and the device's compute
   capability (name@cc) */
static void kernel_id(const char *name, char *id, size_t cap) {
  snprintf(id, cap, "%s@%d", name, rt.cc);
}

/* the kernel cached under id, retained; NULL if none */
static cache_kernel *kernel_cached(const char *id) {
  uint64_t key[2];
  kernel_id_key(id, key);
  return cache_kernel_get(KILN_CUDA, key, id, strlen(id));
}

/* a module none of whose kernels is cached any more (the kernel cache's
   unload callback, on whichever thread released the last one): work
   already enqueued may still run its code, so the device is waited for
   first (rare: KILN_KERNEL_CACHE_MAX unused kernels are kept) */
static void module_unload(void *module) {
  if (rt.cu.cuCtxSetCurrent(rt.ctx) != CUDA_SUCCESS) return; /* left loaded */
  (void)rt.cu.cuCtxSynchronize();
  (void)rt.cu.cuModuleUnload((CUmodule)module);
}

/* The compiled kernel `name` of source src: built outside the lock (NVRTC
   takes a while); two threads building the same one keep the first. */
static cache_kernel *kernel_publish(gpu_kernel_build *b);

/* a kernel on its way: its image made (any thread), then loaded */
struct gpu_kernel_build {
  char name[GPU_KERNEL_NAME];
  char id[GPU_KERNEL_ID];
  const char *src;      /* the caller's, until finished */
  cache_kernel *cached; /* in memory already (a reference): nothing to make */
  bool ok;              /* img holds the image */
  kernel_image img;
  int status; /* why not, when !ok && !cached */
  char why[512];
};

gpu_kernel_source gpu_kernel_where(const char *name, const char *src) {
  if (gpu_unavailable()) return GPU_KERNEL_TO_COMPILE;
  char id[GPU_KERNEL_ID];
  kernel_id(name, id, sizeof id);
  cache_kernel *k = kernel_cached(id);
  if (k) {
    cache_kernel_release(k);
    return GPU_KERNEL_IN_MEMORY;
  }
  uint64_t h[2];
  kernel_disk_hash(src, h);
  size_t len = 0;
  void *blob = (h[0] || h[1]) ? cache_disk_blob_get(h, &len) : NULL;
  free(blob);
  return blob ? GPU_KERNEL_ON_DISK : GPU_KERNEL_TO_COMPILE;
}

gpu_kernel_build *gpu_kernel_prepare(const char *name, const char *src) {
  gpu_kernel_build *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  snprintf(b->name, sizeof b->name, "%s", name);
  b->src = src;
  if (unavailable_error()) goto failed;
  kernel_id(name, b->id, sizeof b->id);
  if ((b->cached = kernel_cached(b->id))) return b;
  uint64_t h[2];
  kernel_disk_hash(src, h);
  bool use_disk = h[0] || h[1];
  b->ok =
      (use_disk && image_from_disk(h, &b->img)) || image_compiled(src, name, h, use_disk, &b->img);
  if (b->ok) return b;
failed:
  b->status = vm_thread()->status ? vm_thread()->status : KILN_ERR_DEVICE;
  snprintf(b->why, sizeof b->why, "%s", vm_thread()->message);
  vm_clear_error();
  return b;
}

void *gpu_kernel_finish(gpu_kernel_build *b) {
  if (!b) {
    vm_error(KILN_ERR_OOM, "out of host memory building a kernel");
    return NULL;
  }
  cache_kernel *fn = NULL;
  if (b->cached) {
    gpu_log_kernel(b->name, "in memory", 0);
    fn = b->cached;
  } else if (!b->ok) {
    vm_error(b->status, "%s", b->why);
  } else if (thread_get()) { /* the primary context, current on this thread */
    const char *how = b->img.nvrtc_ms > 0 ? "nvrtc" : "disk";
    gpu_log_kernel(b->name,
                   b->img.nvrtc_ms > 0 ? "compiled by NVRTC" : "loaded from the disk cache",
                   b->img.nvrtc_ms);
    gpu_dump_kernel(b->name, b->src, b->img.image, b->img.size, b->img.ptx, b->img.arch, rt.cc, how,
                    b->img.nvrtc_ms);
    fn = kernel_publish(b);
  }
  free(b->img.owned);
  free(b);
  return (void *)fn;
}

/* loads b's image as a code object of the kernel cache and caches its
   function there (another thread's, if it built the same kernel
   meanwhile: then this module is unloaded again): a reference */
static cache_kernel *kernel_publish(gpu_kernel_build *b) {
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  if (!module_load(&b->img, b->name, &mod, &fn)) return NULL;
  cache_code *code = cache_code_new(KILN_CUDA, mod, module_unload, NULL);
  if (!code) {
    (void)rt.cu.cuModuleUnload(mod);
    vm_error(KILN_ERR_OOM, "out of host memory caching kernel %s", b->name);
    return NULL;
  }
  uint64_t key[2];
  kernel_id_key(b->id, key);
  cache_kernel *k = cache_kernel_put(KILN_CUDA, key, b->id, strlen(b->id), code, fn);
  cache_code_release(code); /* held by k now (unloaded here if k is another's, or NULL) */
  if (!k) vm_error(KILN_ERR_OOM, "out of host memory caching kernel %s", b->name);
  return k;
}

static cache_kernel *kernel_build(const char *name, const char *src) {
  return gpu_kernel_finish(gpu_kernel_prepare(name, src));
}

/* The compiled kernel for key (its source generated only on a miss), a
   reference */
static cache_kernel *kernel_get(const gpu_op_key *key) {
  char name[GPU_KERNEL_NAME], id[GPU_KERNEL_ID];
  gpu_op_key_name(key, name, sizeof name);
  kernel_id(name, id, sizeof id);
  cache_kernel *fn = kernel_cached(id);
  if (fn) return fn;
  char *src = gpu_op_source(key);
  if (!src) return NULL; /* gpu_op_source said why */
  fn = kernel_build(name, src);
  free(src);
  return fn;
}

void *gpu_kernel_load(const char *name, const char *src) {
  if (!thread_get()) return NULL; /* the primary context, current on this thread (the compiler's) */
  return kernel_build(name, src);
}

void gpu_kernel_retain(void *kernel) { cache_kernel_retain(kernel); }

void gpu_kernel_release(void *kernel) { cache_kernel_release(kernel); }

bool gpu_kernel_launch(void *kernel, const char *name, void *args, unsigned grid, unsigned block) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  void *params[] = {args};
  CUfunction fn = cache_kernel_fn(kernel);
  double p0 = gpu_prof_now();
  CUresult rc = rt.cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, t->stream, params, NULL);
  gpu_prof_add(GPU_PROF_LAUNCH, p0);
  if (rc != CUDA_SUCCESS) {
    char what[GPU_KERNEL_NAME + 96];
    snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u, block %u)", name, grid, block);
    return cu_ok(rc, what);
  }
  atomic_fetch_add_explicit(&vm_process()->stats.kernels_launched, 1, memory_order_relaxed);
  return true;
}

static bool launch_one(gpu_thread *t, const gpu_launch *l, char *scratch, size_t scratch_bytes) {
  gpu_args args = l->args;
  for (int k = 0; k < GPU_MAX_OPERANDS; k++) {
    if (!(l->scratch_mask >> k & 1)) continue;
    uintptr_t offset = (uintptr_t)args.ptr[k];
    if (!scratch || offset >= scratch_bytes) {
      vm_error(KILN_ERR_INTERNAL,
               "gpu_run_op_plan: operand %d's scratch offset %" PRIuPTR
               " is outside the call's %zu bytes of scratch",
               k, offset, scratch_bytes);
      return false;
    }
    args.ptr[k] = scratch + offset;
  }
  if (l->check_mask) {
    gpu_index_check *rec = index_record(t);
    if (!rec) return false;
    for (int k = 0; k < GPU_MAX_OPERANDS; k++)
      if (l->check_mask >> k & 1) args.ptr[k] = rec;
    t->check_seq++;
    t->check_api[t->check_seq % GPU_CHECK_NAMES] = vm_thread()->api;
    args.extent[1] = t->check_seq;
  }
  /* held while it is launched: no other thread's release unloads it
     meanwhile (an unload waits for the device: module_unload) */
  double p0 = gpu_prof_now();
  cache_kernel *kernel = kernel_get(&l->key);
  gpu_prof_add(GPU_PROF_KERNEL, p0);
  if (!kernel) return false;
  void *params[] = {&args};
  p0 = gpu_prof_now();
  CUresult rc =
      rt.cu.cuLaunchKernel(cache_kernel_fn(kernel), l->grid[0], l->grid[1], l->grid[2], l->block[0],
                           l->block[1], l->block[2], l->shared_bytes, t->stream, params, NULL);
  gpu_prof_add(GPU_PROF_LAUNCH, p0);
  cache_kernel_release(kernel);
  if (rc != CUDA_SUCCESS) {
    char name[GPU_KERNEL_NAME], what[GPU_KERNEL_NAME + 160];
    gpu_op_key_name(&l->key, name, sizeof name);
    snprintf(what, sizeof what,
             "cuLaunchKernel(%s, grid %u,%u,%u, block %u,%u,%u, %u shared bytes)", name, l->grid[0],
             l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->shared_bytes);
    return cu_ok(rc, what);
  }
  atomic_fetch_add_explicit(&vm_process()->stats.kernels_launched, 1, memory_order_relaxed);
  if (l->check_mask) t->check_armed = true; /* whatever follows: its record is read */
  return true;
}

bool gpu_run_op_plan(const gpu_op_plan *p) {
  gpu_thread *t = thread_get();
  if (!t) return false;
  char *scratch = NULL;
  if (p->scratch_bytes && !(scratch = gpu_mem_alloc(p->scratch_bytes))) return false;
  bool ok = true;
  for (int i = 0; ok && i < p->nlaunch; i++)
    ok = launch_one(t, &p->launch[i], scratch, p->scratch_bytes);
  /* an index op's record is read where the host waits anyway (a read of a
     value), not here: a plan never waits for the device (opgen.h) */
  if (ok && gpu_op_plan_has_index_check(p) && sync_checks())
    ok = stream_wait(t) && index_checks_read(t);
  /* work on this stream that uses it runs before any later reuse by it */
  gpu_mem_free(scratch, p->scratch_bytes);
  return ok;
}
