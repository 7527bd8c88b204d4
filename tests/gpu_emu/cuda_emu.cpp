// cuda_emu.cpp — a CUDA device emulated on the CPU, behind the three
// libraries Kiln loads at run time: the driver (cuGetProcAddress and the
// entry points of jit_gpu/cuda_api.h), NVRTC and cuBLAS.  Kiln loads this
// one library in their place when KILN_CUDA_LIB, KILN_NVRTC_LIB and
// KILN_CUBLAS_LIB name it, so the GPU backend's host side (the allocator,
// streams, staging copies, kernel caches on disk and in memory, NVRTC on
// the compiler threads, plans, cuBLAS calls) runs end to end on a machine
// without a GPU, through the same tests a GPU runs (test_gpu_ops).
//
//  - NVRTC: the CUDA C Kiln generates is compiled by the host C++ compiler
//    against emu.hpp into a shared object (the "cubin": a header and the
//    object's bytes), with an entry per __global__ function that runs it as
//    a grid (emu_grid.hpp).
//  - The driver: cuModuleLoadData loads that object; cuLaunchKernel runs
//    the kernel to completion; copies and memsets happen at once.  Work is
//    therefore done in issue order, which is one legal schedule of streams.
//    cuModuleUnload unloads it (a launch of its functions afterwards is
//    refused), and kiln_emu_module_counts tells tests how many modules
//    are loaded (the kernel cache's bound, tests/test_gpu_kernel_cache.c).
//  - Device memory is a reserved region the host cannot touch: it is
//    readable and writable only while a launch, copy or gemm runs, so host
//    code that reads a device pointer faults here as it would on a GPU.
//  - cuBLAS: column-major (strided batched) gemm, its arguments checked as
//    cuBLAS checks them, products summed in f64.
// What it does not prove: timing, concurrency between streams, the real
// math library's last bits (the host's libm is used), or that NVRTC accepts
// the source (the NVRTC tests do that).
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../../vm/half.h" // the one f32 <-> half conversion (GemmEx results)

extern char **environ;

#define EXPORT extern "C" __attribute__((visibility("default")))

typedef int CUresult;
enum : CUresult {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  INVALID_IMAGE = 200,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
  LAUNCH_FAILED = 719,
};

// --- device memory -------------------------------------------------------

static const size_t ARENA = (size_t)16 << 30; // what cuDeviceTotalMem reports
static const size_t ALIGN = 256;              // cuMemAlloc's alignment

static std::mutex dev_lock; // every device operation, one at a time
static char *arena;
static size_t arena_high;                     // bytes of the arena ever handed out
static std::map<size_t, size_t> free_blocks;  // offset -> size
static std::map<size_t, size_t> used_blocks;  // offset -> size

static bool arena_ready() {
  if (arena) return true;
  void *p = mmap(nullptr, ARENA, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  arena = (char *)p;
  return true;
}

// device memory is open to the host only inside this scope
struct device_access {
  std::lock_guard<std::mutex> g{dev_lock};
  device_access() {
    if (arena_high) mprotect(arena, arena_high, PROT_READ | PROT_WRITE);
  }
  ~device_access() {
    if (arena_high) mprotect(arena, arena_high, PROT_NONE);
  }
};

static bool in_arena(const void *p, size_t n) {
  const char *c = (const char *)p;
  return arena && c >= arena && c + n <= arena + arena_high && c + n >= c;
}

static CUresult mem_alloc(unsigned long long *dptr, size_t bytes) {
  std::lock_guard<std::mutex> g{dev_lock};
  if (!dptr) return INVALID_VALUE;
  if (!arena_ready()) return OUT_OF_MEMORY;
  size_t need = (bytes + ALIGN - 1) / ALIGN * ALIGN;
  if (need == 0 || need < bytes) return bytes == 0 ? INVALID_VALUE : OUT_OF_MEMORY;
  for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
    if (it->second >= need) {
      size_t off = it->first, size = it->second;
      free_blocks.erase(it);
      if (size > need) free_blocks[off + need] = size - need;
      used_blocks[off] = need;
      *dptr = (unsigned long long)(uintptr_t)(arena + off);
      return OK;
    }
  if (need > ARENA - arena_high) return OUT_OF_MEMORY;
  size_t off = arena_high;
  arena_high += need;
  used_blocks[off] = need;
  *dptr = (unsigned long long)(uintptr_t)(arena + off);
  return OK;
}

static CUresult mem_free(unsigned long long dptr) {
  std::lock_guard<std::mutex> g{dev_lock};
  if (!dptr) return OK;
  size_t off = (size_t)((char *)(uintptr_t)dptr - arena);
  auto it = used_blocks.find(off);
  if (!arena || (char *)(uintptr_t)dptr < arena || it == used_blocks.end()) return INVALID_VALUE;
  size_t size = it->second;
  used_blocks.erase(it);
  // the pages wholly inside go back to the system
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t lo = (off + page - 1) / page * page, hi = (off + size) / page * page;
  if (hi > lo) madvise(arena + lo, hi - lo, MADV_DONTNEED);
  auto next = free_blocks.lower_bound(off);
  if (next != free_blocks.end() && next->first == off + size) {
    size += next->second;
    free_blocks.erase(next);
  }
  auto prev = free_blocks.lower_bound(off);
  if (prev != free_blocks.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      prev->second += size;
      return OK;
    }
  }
  free_blocks[off] = size;
  return OK;
}

// --- the driver ----------------------------------------------------------

struct emu_module {
  void *dl;
  uint64_t id;  // its number: a function of an unloaded module is refused at launch
};
typedef int (*emu_entry)(void **params, unsigned grid, unsigned block, char **stacks);
struct emu_function {
  emu_entry entry;
  std::string name;
  uint64_t module;
};
// the modules loaded now (by number), and the loads and unloads so far:
// kiln_emu_module_counts reports them to tests (the kernel cache's bound)
static std::mutex module_lock;
static std::map<uint64_t, bool> modules_live;
static uint64_t module_loads, module_unloads;
static int token; // streams, events, the context: nothing to hold
#define IMAGE_FORMAT 2 // of the "cubins": a header, then a shared object with emu_entry_<kernel>
static const size_t STACK_BYTES = 1 << 16; // emu_grid.hpp's EMU_STACK

static CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
    case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
    default: *s = nullptr; return INVALID_VALUE;
  }
}
static CUresult cuGetErrorString(CUresult e, const char **s) {
  switch (e) {
    case OK: *s = "no error"; return OK;
    case INVALID_VALUE: *s = "invalid argument"; return OK;
    case OUT_OF_MEMORY: *s = "out of memory (the emulated device's 16 GiB)"; return OK;
    case INVALID_IMAGE: *s = "not an image of the emulated device"; return OK;
    case INVALID_HANDLE: *s = "invalid resource handle"; return OK;
    case NOT_FOUND: *s = "named symbol not found"; return OK;
    case LAUNCH_FAILED: *s = "the emulated kernel could not finish (see stderr)"; return OK;
    default: *s = nullptr; return INVALID_VALUE;
  }
}
static CUresult cuDriverGetVersion(int *v) { return *v = 13000, OK; }
static CUresult cuInit(unsigned) { return OK; }
static CUresult cuDeviceGetCount(int *n) { return *n = 1, OK; }
static CUresult cuDeviceGet(int *d, int ordinal) { return ordinal ? INVALID_VALUE : (*d = 0, OK); }
static CUresult cuDeviceGetName(char *name, int len, int) {
  // the name is in Kiln's disk-cache key: its number changes with the images' format
  snprintf(name, (size_t)len, "Kiln's CUDA emulation %d on the CPU", IMAGE_FORMAT);
  return OK;
}
static CUresult cuDeviceGetAttribute(int *v, int attr, int) {
  switch (attr) {
    case 75: return *v = 9, OK; // compute capability: sm_90, as an H100
    case 76: return *v = 0, OK;
    default: return INVALID_VALUE;
  }
}
static CUresult cuDeviceTotalMem(size_t *bytes, int) { return *bytes = ARENA, OK; }
static CUresult cuDevicePrimaryCtxRetain(void **ctx, int) { return *ctx = &token, OK; }
static CUresult cuCtxSetCurrent(void *) { return OK; }
static CUresult cuCtxSynchronize() { return OK; }
static CUresult cuStreamCreate(void **s, unsigned) { return *s = new int(0), OK; }
static CUresult cuStreamSynchronize(void *) { return OK; }
static CUresult cuStreamDestroy(void *s) { return delete (int *)s, OK; }
static CUresult cuEventCreate(void **e, unsigned) { return *e = new int(0), OK; }
static CUresult cuEventRecord(void *, void *) { return OK; }
static CUresult cuEventSynchronize(void *) { return OK; }
static CUresult cuEventQuery(void *) { return OK; } // work runs in issue order, at once
static CUresult cuEventDestroy(void *e) { return delete (int *)e, OK; }
static CUresult cuMemAlloc(unsigned long long *p, size_t n) { return mem_alloc(p, n); }
static CUresult cuMemFree(unsigned long long p) { return mem_free(p); }
static CUresult cuMemAllocHost(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? OK : OUT_OF_MEMORY; }
static CUresult cuMemFreeHost(void *p) { return free(p), OK; }
static CUresult cuMemcpyHtoDAsync(unsigned long long dst, const void *src, size_t n, void *) {
  device_access a;
  if (!in_arena((void *)(uintptr_t)dst, n) || in_arena(src, n)) return INVALID_VALUE;
  return memcpy((void *)(uintptr_t)dst, src, n), OK;
}
static CUresult cuMemcpyDtoHAsync(void *dst, unsigned long long src, size_t n, void *) {
  device_access a;
  if (!in_arena((void *)(uintptr_t)src, n) || in_arena(dst, n)) return INVALID_VALUE;
  return memcpy(dst, (void *)(uintptr_t)src, n), OK;
}
static CUresult cuMemcpyDtoDAsync(unsigned long long dst, unsigned long long src, size_t n, void *) {
  device_access a;
  if (!in_arena((void *)(uintptr_t)dst, n) || !in_arena((void *)(uintptr_t)src, n)) return INVALID_VALUE;
  return memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n), OK;
}
static CUresult cuMemsetD8Async(unsigned long long dst, unsigned char v, size_t n, void *) {
  device_access a;
  if (!in_arena((void *)(uintptr_t)dst, n)) return INVALID_VALUE;
  return memset((void *)(uintptr_t)dst, v, n), OK;
}

static const char MAGIC[8] = {'K', 'I', 'L', 'N', 'E', 'M', 'U', '0' + IMAGE_FORMAT};

static CUresult cuModuleLoadData(void **mod, const void *image) {
  if (!image || memcmp(image, MAGIC, sizeof MAGIC)) return INVALID_IMAGE;
  uint64_t size;
  memcpy(&size, (const char *)image + sizeof MAGIC, sizeof size);
  const char *tmp = getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-emu-module-XXXXXX";
  std::vector<char> p(path.begin(), path.end());
  p.push_back('\0');
  int fd = mkstemp(p.data());
  if (fd < 0) return OUT_OF_MEMORY;
  const char *bytes = (const char *)image + sizeof MAGIC + sizeof size;
  bool ok = write(fd, bytes, size) == (ssize_t)size;
  close(fd);
  void *dl = ok ? dlopen(p.data(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!dl && ok) fprintf(stderr, "cuda_emu: %s\n", dlerror());
  unlink(p.data());
  if (!dl) return INVALID_IMAGE;
  std::lock_guard<std::mutex> g(module_lock);
  emu_module *m = new emu_module{dl, ++module_loads};
  modules_live[m->id] = true;
  *mod = m;
  return OK;
}
static CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
  if (!mod) return INVALID_HANDLE;
  std::string sym = std::string("emu_entry_") + name;
  void *e = dlsym(((emu_module *)mod)->dl, sym.c_str());
  if (!e) return NOT_FOUND;
  // lives as long as the process (a few bytes): a launch after its module
  // is unloaded is refused, not a jump into unmapped code
  *fn = new emu_function{(emu_entry)e, name, ((emu_module *)mod)->id};
  return OK;
}
static CUresult cuModuleUnload(void *mod) {
  if (!mod) return INVALID_HANDLE;
  emu_module *m = (emu_module *)mod;
  {
    std::lock_guard<std::mutex> g(module_lock);
    if (!modules_live.erase(m->id)) return INVALID_HANDLE;
    module_unloads++;
  }
  dlclose(m->dl);
  delete m;
  return OK;
}
static CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, void *, void **params, void **extra) {
  if (!fn) return INVALID_HANDLE;
  // the emulation runs 1-d launches of one by-value argument, as Kiln makes them
  if (gx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || !params || extra ||
      gx > 0x7fffffffu)
    return INVALID_VALUE;
  device_access a;
  static char *stacks[1024]; // the threads' stacks, kept from launch to launch (under dev_lock)
  for (unsigned i = 0; i < bx && i < 1024; i++)
    if (!stacks[i] && !(stacks[i] = (char *)malloc(STACK_BYTES))) return OUT_OF_MEMORY;
  emu_function *f = (emu_function *)fn;
  std::lock_guard<std::mutex> g(module_lock);  // its module stays loaded while it runs
  if (!modules_live.count(f->module)) {
    fprintf(stderr, "cuda_emu: cuLaunchKernel(%s): its module was unloaded\n", f->name.c_str());
    return INVALID_HANDLE;
  }
  return f->entry(params, gx, bx, stacks) ? OK : LAUNCH_FAILED;
}

// for tests: modules loaded now, ever loaded, and unloaded (not a CUDA call)
EXPORT void kiln_emu_module_counts(long *live, long *loads, long *unloads) {
  std::lock_guard<std::mutex> g(module_lock);
  *live = (long)modules_live.size();
  *loads = (long)module_loads;
  *unloads = (long)module_unloads;
}

static const struct {
  const char *name;
  void *fn;
} driver[] = {
#define E(n) {#n, (void *)n}
    E(cuGetErrorName), E(cuGetErrorString), E(cuDriverGetVersion), E(cuInit), E(cuDeviceGetCount),
    E(cuDeviceGet), E(cuDeviceGetName), E(cuDeviceGetAttribute), E(cuDeviceTotalMem),
    E(cuDevicePrimaryCtxRetain), E(cuCtxSetCurrent), E(cuCtxSynchronize), E(cuStreamCreate),
    E(cuStreamSynchronize), E(cuStreamDestroy), E(cuEventCreate), E(cuEventRecord),
    E(cuEventSynchronize), E(cuEventQuery), E(cuEventDestroy), E(cuMemAlloc), E(cuMemFree), E(cuMemAllocHost),
    E(cuMemFreeHost), E(cuMemcpyHtoDAsync), E(cuMemcpyDtoHAsync), E(cuMemcpyDtoDAsync),
    E(cuMemsetD8Async), E(cuModuleLoadData), E(cuModuleGetFunction), E(cuModuleUnload),
    E(cuLaunchKernel),
#undef E
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                                    int *status) {
  (void)flags;
  *pfn = nullptr;
  if (status) *status = 1; // not found
  if (version < 11030) return INVALID_VALUE;
  for (auto &d : driver)
    if (!strcmp(d.name, symbol)) {
      *pfn = d.fn;
      if (status) *status = 0;
      return OK;
    }
  return NOT_FOUND;
}

// --- NVRTC ---------------------------------------------------------------

struct emu_program {
  std::string src, name, log;
  std::vector<char> image;
};

EXPORT int nvrtcVersion(int *major, int *minor) { return *major = 13, *minor = 0, 0; }
EXPORT int nvrtcGetNumSupportedArchs(int *n) { return *n = 1, 0; }
EXPORT int nvrtcGetSupportedArchs(int *a) { return a[0] = 90, 0; }
EXPORT const char *nvrtcGetErrorString(int rc) {
  switch (rc) {
    case 0: return "NVRTC_SUCCESS";
    case 3: return "NVRTC_ERROR_INVALID_INPUT";
    case 6: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR (emulation)";
  }
}
EXPORT int nvrtcCreateProgram(emu_program **prog, const char *src, const char *name, int nheaders,
                              const char *const *, const char *const *) {
  if (!prog || !src || nheaders) return 3;
  *prog = new emu_program{src, name ? name : "kernel", "", {}};
  return 0;
}
EXPORT int nvrtcDestroyProgram(emu_program **prog) {
  if (!prog || !*prog) return 3;
  delete *prog;
  *prog = nullptr;
  return 0;
}

static bool skip_space(const std::string &s, size_t &i) {
  while (i < s.size() && isspace((unsigned char)s[i])) i++;
  return i < s.size();
}
static std::string ident(const std::string &s, size_t &i) {
  size_t b = i;
  while (i < s.size() && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
  return s.substr(b, i - b);
}

// "extern "C" __global__ void __launch_bounds__(N) NAME(const __grid_constant__ TYPE a)":
// each kernel's name and argument type; false (why in log) for another form
static bool find_kernels(const std::string &s, std::vector<std::pair<std::string, std::string>> &out,
                         std::string &log) {
  for (size_t at = s.find("__global__"); at != std::string::npos; at = s.find("__global__", at + 1)) {
    size_t i = at + strlen("__global__");
    skip_space(s, i);
    if (ident(s, i) != "void") return log = "a __global__ function not returning void", false;
    skip_space(s, i);
    size_t save = i;
    if (ident(s, i) == "__launch_bounds__") {
      i = s.find(')', i);
      if (i == std::string::npos) return log = "unterminated __launch_bounds__", false;
      i++;
      skip_space(s, i);
    } else {
      i = save;
    }
    std::string name = ident(s, i);
    skip_space(s, i);
    size_t close = s.find(')', i);
    if (name.empty() || s[i] != '(' || close == std::string::npos)
      return log = "a __global__ function the emulation cannot parse", false;
    std::string params = s.substr(i + 1, close - i - 1);
    if (params.find(',') != std::string::npos)
      return log = "kernel " + name + ": the emulation runs kernels of one by-value argument", false;
    std::vector<std::string> words;
    for (size_t k = 0; k < params.size();) {
      skip_space(params, k);
      std::string w = ident(params, k);
      if (w.empty()) k++;
      else words.push_back(w);
    }
    if (words.size() < 2) return log = "kernel " + name + ": no argument", false;
    out.push_back({name, words[words.size() - 2]});
  }
  return !out.empty() || (log = "no __global__ function", false);
}

static bool slurp(const std::string &path, std::string &out) {
  FILE *f = fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return true;
}

// The host compiler's run for one program: g++ with emu.hpp precompiled
// (once per process, below) and a kernel's object linked without the C++
// runtime (emu_grid.hpp needs none; libc and libm come from the process
// that loads it).  A cold kernel cache compiles hundreds of programs: of
// ~650 ms each on a 2-core Zen 3, parsing emu.hpp's headers was ~300 and
// linking libstdc++ ~180; now ~200 in all.
static const char *const CXX_FLAGS[] = {
    "-std=c++17", "-O1", "-w", "-fPIC", "-fvisibility=hidden", "-fno-exceptions", "-fno-rtti",
    "-DEXPORT_ENTRY=extern \"C\" __attribute__((visibility(\"default\")))"};
enum { NFLAGS = sizeof CXX_FLAGS / sizeof *CXX_FLAGS };

// runs the compiler with CXX_FLAGS, then rest (null-terminated); its output in err
static int run_cxx(const char *const *rest, const std::string &err) {
  std::vector<const char *> argv{KILN_EMU_CXX};
  argv.insert(argv.end(), CXX_FLAGS, CXX_FLAGS + NFLAGS);
  for (; *rest; rest++) argv.push_back(*rest);
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int status = -1;
  if (posix_spawn(&pid, KILN_EMU_CXX, &fa, nullptr, (char *const *)argv.data(), environ) == 0)
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  posix_spawn_file_actions_destroy(&fa);
  return status;
}

// a private directory of its own, under TMPDIR
static std::string make_dir(const char *what) {
  const char *tmp = getenv("TMPDIR");
  std::string tpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + what + "-XXXXXX";
  std::vector<char> d(tpl.begin(), tpl.end());
  d.push_back('\0');
  return mkdtemp(d.data()) ? std::string(d.data()) : std::string();
}

// emu.hpp precompiled with CXX_FLAGS into a directory searched before
// KILN_EMU_INCLUDE ("" if that failed: the header is then parsed each time,
// as g++ does with a precompiled header it cannot use)
static std::string pch_dir;
static void pch_remove() {
  unlink((pch_dir + "/emu.hpp.gch").c_str());
  unlink((pch_dir + "/log").c_str());
  rmdir(pch_dir.c_str());
}
static const std::string &pch() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::string dir = make_dir("kiln-emu-pch");
    if (dir.empty()) return;
    std::string hdr = std::string(KILN_EMU_INCLUDE) + "/emu.hpp", gch = dir + "/emu.hpp.gch";
    const char *rest[] = {"-x", "c++-header", hdr.c_str(), "-o", gch.c_str(), nullptr};
    int status = run_cxx(rest, dir + "/log");
    pch_dir = dir;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      pch_remove();
      pch_dir.clear();
      return;
    }
    atexit(pch_remove);
  });
  return pch_dir;
}

EXPORT int nvrtcCompileProgram(emu_program *prog, int, const char *const *) {
  if (!prog) return 3;
  std::vector<std::pair<std::string, std::string>> kernels;
  if (!find_kernels(prog->src, kernels, prog->log)) return 6;
  const std::string &pch_at = pch();
  std::string dir = make_dir("kiln-emu-nvrtc");
  if (dir.empty()) return prog->log = "mkdtemp failed", 6;
  std::string cpp = dir + "/k.cpp", so = dir + "/k.so", err = dir + "/log";
  std::string text = "#include \"emu.hpp\"\n";
  for (size_t b = 0; b < prog->src.size();) { // the layout asserts are EDG's, not g++'s
    size_t e = prog->src.find('\n', b);
    size_t len = e == std::string::npos ? prog->src.size() - b : e - b + 1;
    if (prog->src.compare(b, 14, "static_assert(")) text.append(prog->src, b, len);
    b += len;
  }
  text += "\n#include \"emu_grid.hpp\"\n";
  for (auto &k : kernels)
    text += "EXPORT_ENTRY int emu_entry_" + k.first + "(void **p, unsigned g, unsigned b, char **s) {\n"
            "  return emu_run_grid(\"" + k.first + "\", [](const void *a) { " + k.first +
            "(*(const " + k.second + " *)a); }, p[0], g, b, s);\n}\n";
  FILE *f = fopen(cpp.c_str(), "w");
  bool wrote = f && fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) fclose(f);
  int status = -1;
  if (wrote) {
    std::string inc = std::string("-I") + KILN_EMU_INCLUDE, pinc = "-I" + pch_at;
    // -nostdlib: no C++ runtime, no start files; libgcc for what code
    // generation may call (128-bit division).  The precompiled header's
    // directory, when there is one, is searched first.
    std::vector<const char *> rest{"-shared", "-nostdlib"};
    if (!pch_at.empty()) rest.push_back(pinc.c_str());
    rest.insert(rest.end(), {inc.c_str(), cpp.c_str(), "-o", so.c_str(), "-lgcc", nullptr});
    status = run_cxx(rest.data(), err);
  }
  std::string object;
  bool ok = wrote && WIFEXITED(status) && WEXITSTATUS(status) == 0 && slurp(so, object);
  if (!ok) {
    prog->log = "the emulation's C++ compiler failed on " + prog->name + ":\n";
    slurp(err, prog->log);
  } else {
    uint64_t size = object.size();
    prog->image.assign(MAGIC, MAGIC + sizeof MAGIC);
    prog->image.insert(prog->image.end(), (const char *)&size, (const char *)&size + sizeof size);
    prog->image.insert(prog->image.end(), object.begin(), object.end());
  }
  unlink(cpp.c_str());
  unlink(so.c_str());
  unlink(err.c_str());
  rmdir(dir.c_str());
  return ok ? 0 : 6;
}
EXPORT int nvrtcGetProgramLogSize(emu_program *p, size_t *n) { return *n = p->log.size() + 1, 0; }
EXPORT int nvrtcGetProgramLog(emu_program *p, char *out) { return memcpy(out, p->log.c_str(), p->log.size() + 1), 0; }
EXPORT int nvrtcGetCUBINSize(emu_program *p, size_t *n) { return p->image.empty() ? 3 : (*n = p->image.size(), 0); }
EXPORT int nvrtcGetCUBIN(emu_program *p, char *out) {
  return p->image.empty() ? 3 : (memcpy(out, p->image.data(), p->image.size()), 0);
}
// "PTX" (KILN_DUMP asks for it): the source, as the emulation has no PTX
EXPORT int nvrtcGetPTXSize(emu_program *p, size_t *n) { return *n = p->src.size() + 1, 0; }
EXPORT int nvrtcGetPTX(emu_program *p, char *out) { return memcpy(out, p->src.c_str(), p->src.size() + 1), 0; }

// --- cuBLAS --------------------------------------------------------------

EXPORT int cublasCreate_v2(void **h) { return *h = new int(0), 0; }
EXPORT int cublasDestroy_v2(void *h) { return delete (int *)h, 0; }
EXPORT int cublasSetStream_v2(void *h, void *) { return h ? 0 : 1; }
EXPORT int cublasSetWorkspace_v2(void *h, void *w, size_t n) {
  std::lock_guard<std::mutex> g{dev_lock};
  return !h ? 1 : n && !in_arena(w, n) ? 7 : 0;
}
EXPORT int cublasSetMathMode(void *h, int) { return h ? 0 : 1; }
EXPORT const char *cublasGetStatusName(int st) {
  switch (st) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS (emulation)";
  }
}

// column-major C_i = alpha op(A_i) op(B_i) + beta C_i, i < batch
template <class T>
static int gemm(void *h, int ta, int tb, int m, int n, int k, const T *alpha, const T *A, int lda,
                long long sa, const T *B, int ldb, long long sb, const T *beta, T *C, int ldc, long long sc,
                int batch) {
  if (!h) return 1;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1) ||
      lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) || ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) ||
      ldc < (m > 1 ? m : 1))
    return 7;
  device_access a;
  for (int i = 0; i < batch; i++) {
    const T *Ai = A + i * sa, *Bi = B + i * sb;
    T *Ci = C + i * sc;
    if (m && n && !in_arena(Ci, sizeof(T))) return 7;
    for (int col = 0; col < n; col++)
      for (int row = 0; row < m; row++) {
        double acc = 0;
        for (int l = 0; l < k; l++)
          acc += (double)(ta ? Ai[l + (long long)row * lda] : Ai[row + (long long)l * lda]) *
                 (double)(tb ? Bi[col + (long long)l * ldb] : Bi[l + (long long)col * ldb]);
        T *c = &Ci[row + (long long)col * ldc];
        *c = (T)((double)*alpha * acc + (*beta == 0 ? 0.0 : (double)*beta * (double)*c));
      }
  }
  return 0;
}
EXPORT int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                                     const float *A, int lda, long long sa, const float *B, int ldb,
                                     long long sb, const float *beta, float *C, int ldc, long long sc,
                                     int batch) {
  return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
// 16-bit A, B, C with f32 sums (CUBLAS_COMPUTE_32F), the result rounded once by
// vm/half.h's rule: what the cuBLAS calls of jit_gpu/blas.c ask for; any other
// combination is refused as cuBLAS refuses an unsupported one
EXPORT int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                                      const void *A, int at, int lda, long long sa, const void *B,
                                      int bt, int ldb, long long sb, const void *beta, void *C, int ct,
                                      int ldc, long long sc, int batch, int compute, int algo) {
  if (!h) return 1;
  if ((at != 2 && at != 14) || bt != at || ct != at || compute != 68 || algo != -1) return 7;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1) ||
      lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) || ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) ||
      ldc < (m > 1 ? m : 1))
    return 7;
  bool bf = at == 14;
  auto ld = [bf](const void *p, long long i) {
    uint16_t v = ((const uint16_t *)p)[i];
    return bf ? vm_bf16_to_f32(v) : vm_f16_to_f32(v);
  };
  float al = *(const float *)alpha, be = *(const float *)beta;
  device_access a;
  for (int i = 0; i < batch; i++) {
    long long ao = i * sa, bo = i * sb, co = i * sc;
    if (m && n && !in_arena((uint16_t *)C + co, 2)) return 7;
    for (int col = 0; col < n; col++)
      for (int row = 0; row < m; row++) {
        float acc = 0;
        for (int l = 0; l < k; l++)
          acc += ld(A, ao + (ta ? l + (long long)row * lda : row + (long long)l * lda)) *
                 ld(B, bo + (tb ? col + (long long)l * ldb : l + (long long)col * ldb));
        long long c = co + row + (long long)col * ldc;
        float v = al * acc + (be == 0 ? 0.0f : be * ld(C, c));
        ((uint16_t *)C)[c] = bf ? vm_f32_to_bf16(v) : vm_f32_to_f16(v);
      }
  }
  return 0;
}
EXPORT int cublasDgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const double *alpha,
                                     const double *A, int lda, long long sa, const double *B, int ldb,
                                     long long sb, const double *beta, double *C, int ldc,
                                     long long sc, int batch) {
  return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
