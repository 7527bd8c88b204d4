/* nvrtc.c — NVRTC loaded at run time (DESIGN §6): libnvrtc.so.13 through
 * dlopen, its builtins preloaded, every entry point through one table.
 * Compiles CUDA C to a cubin for the device's sm_XY, or to PTX for the
 * highest compute_XX NVRTC knows below it.  Owns nothing else: no caching
 * (jit_gpu/cuda.c) and no source (jit_gpu/opgen*.c). */
#include "nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* NVRTC's C API, declared here so Kiln builds without the CUDA toolkit */
typedef int nvrtc_result;
typedef struct nvrtc_program *nvrtc_program;

/* X(field, return type, symbol, parameters) */
#define NVRTC_SYMBOLS(X)                                                                          \
  X(create, nvrtc_result, nvrtcCreateProgram,                                                     \
    (nvrtc_program *, const char *, const char *, int, const char *const *, const char *const *)) \
  X(compile, nvrtc_result, nvrtcCompileProgram, (nvrtc_program, int, const char *const *))        \
  X(destroy, nvrtc_result, nvrtcDestroyProgram, (nvrtc_program *))                                \
  X(log_size, nvrtc_result, nvrtcGetProgramLogSize, (nvrtc_program, size_t *))                    \
  X(log, nvrtc_result, nvrtcGetProgramLog, (nvrtc_program, char *))                               \
  X(cubin_size, nvrtc_result, nvrtcGetCUBINSize, (nvrtc_program, size_t *))                       \
  X(cubin, nvrtc_result, nvrtcGetCUBIN, (nvrtc_program, char *))                                  \
  X(ptx_size, nvrtc_result, nvrtcGetPTXSize, (nvrtc_program, size_t *))                           \
  X(ptx, nvrtc_result, nvrtcGetPTX, (nvrtc_program, char *))                                      \
  X(num_archs, nvrtc_result, nvrtcGetNumSupportedArchs, (int *))                                  \
  X(archs, nvrtc_result, nvrtcGetSupportedArchs, (int *))                                         \
  X(version, nvrtc_result, nvrtcVersion, (int *, int *))                                          \
  X(error_string, const char *, nvrtcGetErrorString, (nvrtc_result))

static struct {
  bool available;
  char reason[512];
  int version; /* major * 1000 + minor * 10 */
  int narchs;
  int archs[64]; /* ascending, as NVRTC lists them */
  struct {
#define FIELD(field, ret, sym, params) ret(*field) params;
    NVRTC_SYMBOLS(FIELD)
#undef FIELD
  } fn;
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void load(void) {
  /* the builtins first, global: libnvrtc loads them by name when it
     compiles, and a copy already loaded serves it whatever the loader path;
     if this fails NVRTC still tries its own lookup, so it is not fatal */
  /* KILN_NVRTC_LIB: another library in its place (the CUDA emulation of
     tests/gpu_emu) */
  const char *lib = getenv("KILN_NVRTC_LIB");
  if (!lib || !*lib) {
    lib = "libnvrtc.so.13";
    if (!dlopen("libnvrtc-builtins.so.13.0", RTLD_NOW | RTLD_GLOBAL))
      dlopen("libnvrtc-builtins.so.13", RTLD_NOW | RTLD_GLOBAL);
  }
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(nv.reason, sizeof nv.reason, "NVRTC is not installed (%s: %s)", lib, dlerror());
    return;
  }
#define RESOLVE(field, ret, sym, params)                             \
  if (!(*(void **)&nv.fn.field = dlsym(h, #sym))) {                  \
    snprintf(nv.reason, sizeof nv.reason, "%s lacks %s", lib, #sym); \
    return;                                                          \
  }
  NVRTC_SYMBOLS(RESOLVE)
#undef RESOLVE
  int major = 0, minor = 0, n = 0;
  if (nv.fn.version(&major, &minor) != 0 || nv.fn.num_archs(&n) != 0 || n <= 0 ||
      n > (int)(sizeof nv.archs / sizeof nv.archs[0]) || nv.fn.archs(nv.archs) != 0) {
    snprintf(nv.reason, sizeof nv.reason, "NVRTC does not report its version or architectures");
    return;
  }
  nv.narchs = n;
  nv.version = major * 1000 + minor * 10;
  nv.available = true; /* the library stays loaded: NVRTC is not unloaded safely */
}

bool gpu_nvrtc_available(char *why, size_t cap) {
  pthread_once(&nv_once, load);
  if (!nv.available && why && cap) snprintf(why, cap, "%s", nv.reason);
  return nv.available;
}

int gpu_nvrtc_version(void) { return gpu_nvrtc_available(NULL, 0) ? nv.version : 0; }

static char *format_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (s) {
    va_start(ap, fmt);
    vsnprintf(s, (size_t)len + 1, fmt, ap);
    va_end(ap);
  }
  return s;
}

/* sm_XY when NVRTC knows cc, else compute_XX for the highest known XX
   below it (the driver JIT-compiles that PTX); false if none is */
static bool pick_arch(int cc, gpu_image *img) {
  int best = -1;
  if (cc <= 0 || cc > 9999) return false;
  for (int i = 0; i < nv.narchs; i++) {
    if (nv.archs[i] == cc) {
      snprintf(img->arch, sizeof img->arch, "sm_%hu", (unsigned short)cc);
      img->ptx = false;
      return true;
    }
    if (nv.archs[i] > 0 && nv.archs[i] < cc && nv.archs[i] > best) best = nv.archs[i];
  }
  if (best < 0) return false;
  snprintf(img->arch, sizeof img->arch, "compute_%hu", (unsigned short)best);
  img->ptx = true;
  return true;
}

/* NVRTC's log (or what failed) after step failed with rc */
static char *failure_log(nvrtc_program prog, const char *step, nvrtc_result rc) {
  size_t size = 0;
  char *text = NULL;
  if (prog && nv.fn.log_size(prog, &size) == 0 && size > 1 && (text = malloc(size)) &&
      nv.fn.log(prog, text) != 0)
    text[0] = '\0';
  const char *err = nv.fn.error_string(rc);
  char *log = format_log("%s: %s%s%s", step, err ? err : "unknown NVRTC error",
                         text && text[0] ? "\n" : "", text ? text : "");
  free(text);
  return log;
}

static bool compile(const char *src, const char *name, int cc, bool want_ptx, gpu_image *img,
                    char **log) {
  memset(img, 0, sizeof *img);
  *log = NULL;
  char why[512];
  if (!gpu_nvrtc_available(why, sizeof why)) {
    *log = format_log("%s", why);
    return false;
  }
  if (!pick_arch(cc, img)) {
    *log = format_log("NVRTC %d.%d knows no architecture at or below compute capability %d.%d",
                      nv.version / 1000, nv.version % 1000 / 10, cc / 10, cc % 10);
    return false;
  }
  if (want_ptx && !img->ptx) { /* the same architecture, virtual: PTX */
    memmove(img->arch + 8, img->arch + 3, strlen(img->arch + 3) + 1);
    memcpy(img->arch, "compute_", 8);
    img->ptx = true;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  char arch_opt[48];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", img->arch);
  /* bit for bit (DESIGN §5): IEEE division and square root, denormals
     kept, and no a*b+c contracted into an fma behind the source's back */
  const char *opts[] = {arch_opt,      "-std=c++17",      "--fmad=false",
                        "--ftz=false", "--prec-div=true", "--prec-sqrt=true"};
  nvrtc_program prog = NULL;
  nvrtc_result rc = nv.fn.create(&prog, src, name, 0, NULL, NULL);
  if (rc != 0) {
    *log = failure_log(NULL, "nvrtcCreateProgram", rc);
    return false;
  }
  bool ok = false;
  size_t size = 0;
  rc = nv.fn.compile(prog, (int)(sizeof opts / sizeof opts[0]), opts);
  if (rc != 0) {
    *log = failure_log(prog, "nvrtcCompileProgram", rc);
  } else if ((rc = img->ptx ? nv.fn.ptx_size(prog, &size) : nv.fn.cubin_size(prog, &size)) != 0) {
    *log = failure_log(prog, img->ptx ? "nvrtcGetPTXSize" : "nvrtcGetCUBINSize", rc);
  } else if (!(img->data = malloc(size ? size : 1))) {
    *log = format_log("out of memory for a %zu-byte image", size);
  } else if ((rc = img->ptx ? nv.fn.ptx(prog, img->data) : nv.fn.cubin(prog, img->data)) != 0) {
    *log = failure_log(prog, img->ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN", rc);
  } else {
    img->size = size;
    ok = true;
  }
  nv.fn.destroy(&prog);
  if (!ok) {
    free(img->data);
    img->data = NULL;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  img->ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  return ok;
}

bool gpu_nvrtc_compile(const char *src, const char *name, int cc, gpu_image *img, char **log) {
  return compile(src, name, cc, false, img, log);
}

bool gpu_nvrtc_compile_ptx(const char *src, const char *name, int cc, gpu_image *img, char **log) {
  return compile(src, name, cc, true, img, log);
}

void gpu_image_free(gpu_image *img) {
  free(img->data);
  img->data = NULL;
  img->size = 0;
}
