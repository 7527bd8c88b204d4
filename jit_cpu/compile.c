/* compile.c — turning a plan into references to compiled kernels: each
 * kernel looked up by its own description in the kernel cache (kcache.c),
 * then in the disk cache (an index record per kernel naming the object that
 * holds it), and the plan's missing kernels compiled together in one
 * libgccjit context; running a compiled group on the thread pool; what the
 * background compile queue (trace/compile_queue.h) runs for the CPU.  The
 * target is chosen once from the detected CPU: -march=x86-64-vN (libgccjit
 * 12 rejects -march=native). */
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>
#include <xxhash.h>

#include "../cache/disk.h"
#include "../trace/compile_queue.h"
#include "../trace/dump.h"
#include "../trace/key.h"
#include "../trace/rows.h"
#include "../vm/cpu.h"
#include "../vm/kernels.h"
#include "../vm/pool.h"
#include "../vm/private_dir.h"
#include "../vm/state.h"
#include "jitc.h"
#include "kcache.h"
#include "kernel.h"
#include "math.h"

#define CPU_FORMAT_VERSION 2

bool cpu_jit_enabled(void) { return vm_env_long("KILN_JIT", 1) != 0; }
bool cpu_async(void) { return vm_env_long("KILN_ASYNC", 1) != 0; }

cpu_leaf *cpu_leaves_of(const tr_trace *t) {
  cpu_leaf *l = malloc((size_t)(t->nleaves > 0 ? t->nleaves : 1) * sizeof *l);
  for (int j = 0; l && j < t->nleaves; j++) {
    l[j].meta = t->leaves[j]->meta;
    const vm_tensor *v = t->leaves[j]->value;
    l[j].contiguous = vm_is_contiguous(v);
    l[j].inner_unit = l[j].contiguous ||
                      (v->ndim > 0 && v->shape[v->ndim - 1] > 1 && v->strides[v->ndim - 1] == 1);
  }
  return l;
}

static const char *target_march(void) {
  const char *isa = vm_cpu_isa();
  return strcmp(isa, "generic") ? isa : NULL;
}

static void set_options(gcc_jit_context *ctx) {
  /* -O2 with -O3's vectorizer cost model: the loops vectorize as at -O3
     (GCC 12's -O2 model, "very cheap", versions no loop for aliasing and
     leaves a fused kernel scalar), in some 30% less compile time (W8:W7
     77 -> 55 ms per kernel; W10's 18 kernels 1.74 -> 1.2 s) and the same
     speed.  At -O2 the inliner's limits apply to the always_inline math
     helpers too: raised so that a kernel of several transcendentals still
     inlines each (GCC fails the compile otherwise) */
  gcc_jit_context_set_int_option(ctx, GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL, 2);
  gcc_jit_context_add_command_line_option(ctx, "-fvect-cost-model=dynamic");
  gcc_jit_context_add_command_line_option(ctx, "--param=max-inline-insns-single=4000");
  /* the embedded driver calls putenv while it assembles and links, which
     races with getenv on every other thread of the process (seen crashing
     here); the external driver does that work in a child process */
  gcc_jit_context_set_bool_use_external_driver(ctx, 1);
  char march[64];
  const char *isa = target_march();
  if (isa) {
    snprintf(march, sizeof march, "-march=%s", isa);
    gcc_jit_context_add_command_line_option(ctx, march);
  }
  gcc_jit_context_add_command_line_option(ctx, "-fno-math-errno");
  /* elementwise results must match the interpreter's rounding: no FMA contraction */
  gcc_jit_context_add_command_line_option(ctx, "-ffp-contract=off");
  /* a fused kernel reads and writes many buffers (GELU kept for backward:
     5 inputs, 4 outputs); GCC vectorizes only after checking at run time
     that they do not overlap, and by default gives up past 10 pairs to
     check, leaving the loop scalar (libgccjit 12 has no `restrict`) */
  gcc_jit_context_add_command_line_option(ctx, "--param=vect-max-version-for-alias-checks=256");
  /* KILN_JIT_OPT_INFO=1: GCC reports each loop it vectorized (or, with 2,
     each it could not) on stderr; diagnostics only, the code is the same */
  long info = vm_env_long("KILN_JIT_OPT_INFO", 0);
  if (info > 0)
    gcc_jit_context_add_command_line_option(ctx,
                                            info > 1 ? "-fopt-info-vec-all" : "-fopt-info-vec");
  gcc_jit_context_add_driver_option(ctx, "-lm"); /* f64 math calls libm; shared objects need it */
}

static void log_once(const char *what, const char *detail) {
  static atomic_flag said = ATOMIC_FLAG_INIT;
  if (!atomic_flag_test_and_set(&said))
    fprintf(stderr, "kiln: the CPU JIT %s (%s); traces keep running on the interpreter\n", what,
            detail ? detail : "no detail");
}

/* KILN_DUMP: each kernel compiled, as its own context ("kernel-<symbol>.c"
   and a libgccjit reproducer), so a dump shows one kernel per file however
   its batch was compiled */
static bool ctx_open(cg_ctx *c);
static void ctx_close(cg_ctx *c);
static void dump_kernel(const kernel_desc *d) {
  int dfd = tr_dump_dir_open();
  if (dfd < 0) return;
  cg_ctx c;
  if (ctx_open(&c)) {
    if (kernel_desc_emit(&c, d)) {
      char name[96], path[4096];
      snprintf(name, sizeof name, "kernel-%s.c", d->name);
      if (tr_dump_path(dfd, name, path, sizeof path)) gcc_jit_context_dump_to_file(c.ctx, path, 0);
      snprintf(name, sizeof name, "kernel-%s-reproducer.c", d->name);
      if (tr_dump_path(dfd, name, path, sizeof path))
        gcc_jit_context_dump_reproducer_to_file(c.ctx, path);
    }
    ctx_close(&c);
  }
  close(dfd);
}

/* set once libgccjit has run a compile: it sets up (and registers the exit
   teardown of) its state during the first one */
static atomic_bool gccjit_warm;

/* The disk cache key.  The description key (versions, flags, ISA, the
   kernels' node lists) alone missed changes to the code generator, and a
   stale object gave wrong results; so it is joined with the GNU build ID of
   the object this code is in (libkiln.so, or the program it is linked
   into), which every rebuild changes.  Then a lookup needs no libgccjit
   context at all.  Without a build ID, the key hashes the kernel's own
   source as libgccjit prints it (source_key).  Disk keys are per kernel;
   the file a key names is an index record pointing at the object (one
   per compiled batch) that holds the kernel. */
typedef struct {
  uintptr_t addr;
  uint8_t id[64];
  size_t len;
} build_id_search;

static int find_build_id(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  build_id_search *s = arg;
  bool ours = false;
  for (int i = 0; i < info->dlpi_phnum && !ours; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    ours = ph->p_type == PT_LOAD && s->addr >= lo && s->addr < lo + ph->p_memsz;
  }
  if (!ours) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    size_t align = ph->p_align >= 8 ? 8 : 4;
    const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
    while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
      const ElfW(Nhdr) *nh = (const void *)p;
      const uint8_t *name = p + sizeof *nh,
                    *desc = name + ((nh->n_namesz + align - 1) & ~(align - 1));
      if (desc + nh->n_descsz > end) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4) &&
          nh->n_descsz > 0 && nh->n_descsz <= sizeof s->id) {
        memcpy(s->id, desc, nh->n_descsz);
        s->len = nh->n_descsz;
        return 1;
      }
      p = desc + ((nh->n_descsz + align - 1) & ~(align - 1));
    }
  }
  return 1; /* our object, without a build ID */
}

static build_id_search self_id;
static void find_self_id(void) {
  self_id.addr = (uintptr_t)&find_self_id;
  dl_iterate_phdr(find_build_id, &self_id);
}

/* the disk key of description key `key` from this build's ID; false when
   the object has none */
static bool identity_key(const uint64_t key[2], uint64_t out[2]) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_self_id);
  /* KILN_CACHE_BY_SOURCE=1: key by the source, as builds without an ID do
     (tests/test_jit_cache.c runs both) */
  if (!self_id.len || vm_env_long("KILN_CACHE_BY_SOURCE", 0)) return false;
  uint8_t buf[16 + sizeof self_id.id + 8];
  memcpy(buf, key, 16);
  memcpy(buf + 16, self_id.id, self_id.len);
  memcpy(buf + 16 + self_id.len, "build-id", 8);
  XXH128_hash_t h = XXH3_128bits(buf, 16 + self_id.len + 8);
  out[0] = h.low64;
  out[1] = h.high64;
  return true;
}

/* the key from the kernels' printed source, for builds without an ID (the
   source is dumped to a scratch file of the disk cache, which a key is
   only needed for) */
static bool source_key(gcc_jit_context *ctx, const uint64_t key[2], uint64_t out[2]) {
  cache_disk_scratch scratch;
  if (!cache_disk_scratch_open(&scratch, ".c")) return false;
  gcc_jit_context_dump_to_file(ctx, scratch.path, 0);
  int fd = cache_disk_scratch_read(&scratch);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  if (!f && fd >= 0) close(fd);
  XXH3_state_t *st = XXH3_createState();
  bool ok = f && st && XXH3_128bits_reset(st) == XXH_OK &&
            XXH3_128bits_update(st, key, 2 * sizeof *key) == XXH_OK;
  char buf[1 << 14];
  size_t n;
  while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0)
    ok = XXH3_128bits_update(st, buf, n) == XXH_OK;
  if (ok) {
    XXH128_hash_t h = XXH3_128bits_digest(st);
    out[0] = h.low64;
    out[1] = h.high64;
  }
  if (f) fclose(f);
  XXH3_freeState(st);
  cache_disk_scratch_close(&scratch);
  return ok;
}

/* the first directory of PATH holding an executable `name`: its path in
   out (cap bytes); false when there is none */
static bool find_on_path(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin"; /* execvp's default */
  while (*path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, path, name) < cap &&
        access(out, X_OK) == 0)
      return true;
    path += n + (path[n] == ':');
  }
  return false;
}

static bool on_path(const char *name) {
  char found[PATH_MAX];
  return find_on_path(name, found, sizeof found);
}

/* libgccjit compiles through the system assembler and linker (binutils):
   without them every compile would fail, so the JIT is off for the process,
   with one clear message */
static bool toolchain_found;

/* libgccjit compiles in a directory "libgccjit-XXXXXX" of its temp
   directory (TMPDIR, TMP, TEMP, else /tmp, read once by libgccjit) and
   removes it when done; a process killed meanwhile leaves it.  Its name
   says nothing of its process, and libgccjit reads TMPDIR only once, at
   its first compile (pointing it elsewhere would mean setenv racing with
   getenv on the user's threads), so leftovers are told by age: ours, only
   libgccjit's files ("fake.*"), nothing touched for ten minutes (no
   compile takes that long).  Run once per process, before its first
   compile. */
#define GCCJIT_STALE_SECONDS 600

static const char *gccjit_tmpdir(void) {
  const char *vars[] = {"TMPDIR", "TMP", "TEMP"};
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(vars[i]);
    struct stat st;
    if (v && *v && stat(v, &st) == 0 && S_ISDIR(st.st_mode) && access(v, W_OK | X_OK) == 0)
      return v;
  }
  return "/tmp";
}

/* whether directory `name` in parent_fd is a stale libgccjit temp dir; removes it if so */
static void reclaim_gccjit_dir(int parent_fd, const char *name, time_t now) {
  int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0) return;
  DIR *d = fstat(fd, &st) == 0 && st.st_uid == geteuid() && now - st.st_mtime > GCCJIT_STALE_SECONDS
               ? fdopendir(fd)
               : NULL;
  if (!d) {
    close(fd);
    return;
  }
  bool stale = true;
  struct dirent *e;
  while (stale && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    stale = !strncmp(e->d_name, "fake.", 5) &&
            fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            now - st.st_mtime > GCCJIT_STALE_SECONDS;
  }
  if (stale) {
    rewinddir(d);
    while ((e = readdir(d)))
      if (!strncmp(e->d_name, "fake.", 5)) (void)unlinkat(fd, e->d_name, 0);
    (void)unlinkat(parent_fd, name, AT_REMOVEDIR);
  }
  closedir(d);
}

static void reclaim_gccjit_leftovers(void) {
  DIR *d = opendir(gccjit_tmpdir());
  if (!d) return;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "libgccjit-", 10) && strlen(e->d_name) == 16)
      reclaim_gccjit_dir(dirfd(d), e->d_name, now);
  closedir(d);
}

/* The programs libgccjit runs in this process — its external driver and
   the as and ld the driver runs — are found through PATH, and
   COMPILER_PATH or GCC_EXEC_PREFIX point the driver elsewhere.  A relative
   PATH entry, or a PATH directory or program that someone else could
   write, would let their program run as the user (DESIGN §11): then this
   process compiles nothing itself (kiln-jitc, whose environment is clean,
   still compiles). */
static bool inprocess_trusted;
static char inprocess_why[PATH_MAX + 160];

static bool trusted_search_path(char *why, size_t why_len) {
  static const char *const redirects[] = {"COMPILER_PATH", "GCC_EXEC_PREFIX"};
  for (int i = 0; i < 2; i++)
    if (getenv(redirects[i]) && *getenv(redirects[i]))
      return snprintf(why, why_len, "%s is set", redirects[i]), false;
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin"; /* execvp's default */
  for (const char *at = path;; at++) {
    size_t n = strcspn(at, ":");
    char entry[PATH_MAX], real[PATH_MAX + 2];
    if (n == 0 || at[0] != '/' || n >= sizeof entry)
      return snprintf(why, why_len, "PATH has a relative entry \"%.*s\"", (int)n, at), false;
    memcpy(entry, at, n);
    entry[n] = 0;
    /* an existing directory and those above it; a missing one, those above it */
    if (realpath(entry, real))
      strcat(real, "/x");
    else
      snprintf(real, sizeof real, "%s", entry);
    if (!vm_trusted_dirs(real, why, why_len)) return false;
    at += n;
    if (!*at) break;
  }
  char name[64], found[PATH_MAX];
  snprintf(name, sizeof name, "x86_64-linux-gnu-gcc-%d",
           gcc_jit_version_major()); /* Debian's driver */
  const char *progs[] = {name, "gcc", "as", "ld"};
  for (int i = 0; i < 4; i++) {
    struct stat st;
    if (find_on_path(progs[i], found, sizeof found) &&
        (stat(found, &st) != 0 || !vm_trusted_mode(&st)))
      return snprintf(why, why_len, "%s is writable by others", found), false;
  }
  return true;
}

static void toolchain_check(void) {
  reclaim_gccjit_leftovers();
  const char *missing = !on_path("as")   ? "the assembler 'as'"
                        : !on_path("ld") ? "the linker 'ld'"
                                         : NULL;
  toolchain_found = missing == NULL;
  inprocess_trusted = trusted_search_path(inprocess_why, sizeof inprocess_why);
  if (missing)
    fprintf(
        stderr,
        "kiln: the CPU JIT is off: %s is not on PATH (libgccjit needs binutils: apt-get install "
        "binutils); traces run on the interpreter\n",
        missing);
}

static bool toolchain_present(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, toolchain_check);
  return toolchain_found;
}

/* --- a plan's kernels: memory, disk, or compiled together ---------------------------- */

/* a new libgccjit context with the JIT's options, its types and the math
   library (in the interpreter's variant) */
static bool ctx_open(cg_ctx *c) {
  memset(c, 0, sizeof *c);
  c->ctx = gcc_jit_context_acquire();
  if (!c->ctx) return false;
  set_options(c->ctx);
  cg_init_types(c);
  const char *isa = target_march();
  c->math = cpu_math_new(c->ctx, isa && vm_cpu_fma());
  /* No -fassociative-math / -fno-signed-zeros, although reduction loops
     then do not vectorize: they apply to the whole context and changed the
     results of elementwise kernels beside a reduction ((x + 2^24) - 2^24
     folded to x; the sign of zeros), which the JIT fuzzer caught. */
  return true;
}

static void ctx_close(cg_ctx *c) {
  cg_math_release(c);
  gcc_jit_context_release(c->ctx);
}

/* what every kernel key starts with: the format, libgccjit's version,
   Kiln's, the target and its math variant */
static size_t key_salt(uint8_t *out, size_t cap) {
  uint32_t version[6] = {CPU_FORMAT_VERSION,
                         (uint32_t)gcc_jit_version_major(),
                         (uint32_t)gcc_jit_version_minor(),
                         (uint32_t)gcc_jit_version_patchlevel(),
                         (uint32_t)vm_cpu_fma(),
                         0};
  const char *isa = target_march();
  int n = snprintf((char *)out + sizeof version, cap - sizeof version, "%s/%s", KILN_VERSION_STRING,
                   isa ? isa : "generic");
  memcpy(out, version, sizeof version);
  return sizeof version + (size_t)(n > 0 ? n : 0);
}

/* the disk key of a kernel: by build ID, else by its printed source (a
   context of its own, only dumped) */
static bool kernel_disk_key(const kernel_desc *d, uint64_t out[2]) {
  if (identity_key(d->key, out)) return true;
  cg_ctx c;
  if (!ctx_open(&c)) return false;
  bool ok = kernel_desc_emit(&c, d) && source_key(c.ctx, d->key, out);
  ctx_close(&c);
  return ok;
}

/* the disk cache's record for a kernel: the object (batch) holding it */
typedef struct {
  char magic[8];
  uint64_t batch[2];
  char name[40];
} kernel_index;
#define KERNEL_INDEX_MAGIC "KILNIX01"

/* the kernel from the disk cache (its object loaded, or found loaded) */
static cpu_kentry *load_kernel(const kernel_desc *d, const uint64_t disk_key[2]) {
  kernel_index rec;
  if (cache_disk_index_get(disk_key, &rec, sizeof rec) != sizeof rec ||
      memcmp(rec.magic, KERNEL_INDEX_MAGIC, 8) || strncmp(rec.name, d->name, sizeof rec.name))
    return NULL;
  cpu_code *code = cpu_code_find(rec.batch);
  if (!code) {
    void *dl = cache_disk_load(rec.batch);
    if (!dl) return NULL;
    if (!(code = cpu_code_new(NULL, dl, rec.batch))) {
      dlclose(dl);
      return NULL;
    }
  }
  cpu_kernel_fn fn = (cpu_kernel_fn)cpu_code_symbol(code, d->name);
  cpu_kentry *e = fn ? cpu_kcache_put(d->key, d->bytes, d->len, code, fn) : NULL;
  cpu_code_release(code);
  return e;
}

/* the disk key of a batch: from its kernels' disk keys (those emitted) */
static bool batch_key(const uint64_t (*disk_keys)[2], const bool *emitted, int n,
                      uint64_t batch[2]) {
  XXH3_state_t *st = XXH3_createState();
  bool ok = st && XXH3_128bits_reset(st) == XXH_OK;
  for (int i = 0; ok && i < n; i++)
    if (emitted[i]) ok = XXH3_128bits_update(st, disk_keys[i], 16) == XXH_OK;
  ok = ok && XXH3_128bits_update(st, "batch", 5) == XXH_OK;
  if (ok) {
    XXH128_hash_t h = XXH3_128bits_digest(st);
    batch[0] = h.low64;
    batch[1] = h.high64;
  }
  XXH3_freeState(st);
  return ok;
}

/* KILN_JITC_FAULT=after-index (tests): the compiler process dies once a
   batch's index records are written, before its object is stored */
static void fault_between_index_and_object(void) {
  const char *f = getenv("KILN_JITC_FAULT");
  if (f && !strcmp(f, "after-index") && jitc_is_helper()) _exit(9);
}

/* Emits kernels d[0..n) into one context (one `as` + `ld` run: the ~20 ms
   floor is paid once per batch, not per kernel) and compiles it: with
   disk keys, into the disk cache as one object plus an index record per
   kernel; without (or if that fails and in_memory), in memory (*result).
   emitted[i]: kernel i is in the object.  Returns whether anything was
   compiled; why: the first error, for a message.  Runs in the compiler
   process (jitc.c) and, as the fallback, in the user's. */
bool cpu_build_batch(kernel_desc **d, int n, const uint64_t (*disk_keys)[2], bool in_memory,
                     bool *emitted, gcc_jit_result **result, char *why, size_t why_len) {
  *result = NULL;
  why[0] = 0;
  cg_ctx c;
  bool open = ctx_open(&c);
  int count = 0;
  for (int i = 0; i < n; i++) emitted[i] = true;
  /* a kernel the code generator gives up on leaves its function half
     built: start again without it */
  for (int i = 0; open && i < n; i++) {
    if (!emitted[i] || kernel_desc_emit(&c, d[i])) continue;
    if (!why[0])
      snprintf(why, why_len, "the code generator gave up on a%s %s kernel",
               strcmp(kernel_desc_kind(d[i]), "elementwise") ? "" : "n", kernel_desc_kind(d[i]));
    emitted[i] = false;
    ctx_close(&c);
    open = ctx_open(&c);
    i = -1;
  }
  if (!open) snprintf(why, why_len, "libgccjit could not make a context");
  for (int i = 0; open && i < n; i++) count += emitted[i];
  bool stored = false;
  uint64_t batch[2];
  if (open && count && disk_keys && batch_key(disk_keys, emitted, n, batch)) {
    /* the index records go first, the object last: a crash or a full disk
       between them leaves records that name no object (a load misses and
       compiles again), never an object no record names (kept until the
       size bound evicted it).  A kernel whose record could not be written
       is not in the batch; with none, the object is not stored. */
    cache_disk_scratch scratch;
    if (cache_disk_scratch_open(&scratch, ".so")) {
      gcc_jit_context_compile_to_file(c.ctx, GCC_JIT_OUTPUT_KIND_DYNAMIC_LIBRARY, scratch.path);
      int indexed = 0;
      for (int i = 0; !gcc_jit_context_get_first_error(c.ctx) && i < n; i++) {
        if (!emitted[i]) continue;
        kernel_index rec = {.batch = {batch[0], batch[1]}};
        memcpy(rec.magic, KERNEL_INDEX_MAGIC, 8);
        snprintf(rec.name, sizeof rec.name, "%s", d[i]->name);
        if (cache_disk_index_put(disk_keys[i], &rec, sizeof rec))
          indexed++;
        else
          emitted[i] = false;
      }
      fault_between_index_and_object();
      stored = indexed > 0 && cache_disk_store_scratch(batch, &scratch);
      cache_disk_scratch_close(&scratch);
    }
  }
  if (open && count && !stored && (in_memory || !disk_keys))
    *result = gcc_jit_context_compile(c.ctx);
  if (open && count && !stored && !*result && !why[0]) {
    const char *e = gcc_jit_context_get_first_error(c.ctx);
    snprintf(why, why_len, "%s", e ? e : "the disk cache could not store the object");
  }
  if (open) ctx_close(&c);
  if (!stored && !*result)
    for (int i = 0; i < n; i++) emitted[i] = false;
  for (int i = 0; i < n; i++)
    if (emitted[i]) dump_kernel(d[i]);
  return stored || *result;
}

/* Compiles kernels d[0..n) in this process (cpu_build_batch) and caches
   them.  Fills out[i] (NULL: that kernel runs on the interpreter); returns
   how many compiled. */
static int compile_batch(kernel_desc **d, int n, uint64_t (*disk_keys)[2], cpu_kentry **out) {
  bool *emitted = calloc((size_t)n, 1);
  if (!emitted) return 0;
  gcc_jit_result *result = NULL;
  char why[256];
  bool built = cpu_build_batch(d, n, (const uint64_t(*)[2])disk_keys, true, emitted, &result, why,
                               sizeof why);
  atomic_store(&gccjit_warm, true);
  if (why[0])
    log_once(built ? "could not compile a kernel" : "could not compile a plan's kernels", why);
  cpu_code *code = NULL;
  if (result && !(code = cpu_code_new(result, NULL, NULL))) gcc_jit_result_release(result);
  int compiled = 0;
  for (int i = 0; built && i < n; i++) {
    if (!emitted[i]) continue;
    if (code) {
      cpu_kernel_fn fn = (cpu_kernel_fn)cpu_code_symbol(code, d[i]->name);
      out[i] = fn ? cpu_kcache_put(d[i]->key, d[i]->bytes, d[i]->len, code, fn) : NULL;
    } else { /* stored: load it from there */
      out[i] = load_kernel(d[i], disk_keys[i]);
    }
    compiled += out[i] != NULL;
  }
  cpu_code_release(code);
  free(emitted);
  return compiled;
}

/* the plan-level half of group g's kernel: what it reads and writes */
static bool kernel_bind(cpu_kernel *k, const kernel_shape *ks) {
  k->nin = ks->nin;
  k->nout = ks->nout;
  k->nparams = ks->nparams;
  k->reduce = ks->reduce;
  k->resume = ks->resume;
  k->last_group = ks->last_group;
  k->rowwise = ks->rowwise;
  k->cols = ks->cols;
  k->nstash = ks->nstash;
  k->ins = malloc((size_t)(ks->nin + 1) * sizeof(int));
  k->outs = malloc((size_t)(ks->nout + 1) * sizeof(int));
  k->params = malloc((size_t)(ks->nparams + 1) * sizeof(int));
  k->in_stride = malloc((size_t)(ks->nin + 1));
  if (!k->ins || !k->outs || !k->params || !k->in_stride) return false;
  memcpy(k->ins, ks->ins, (size_t)ks->nin * sizeof(int));
  memcpy(k->outs, ks->outs, (size_t)ks->nout * sizeof(int));
  memcpy(k->params, ks->params, (size_t)ks->nparams * sizeof(int));
  memcpy(k->in_stride, ks->stride_class, (size_t)ks->nin);
  bool gathers = false;
  for (int q = 0; q < ks->nin; q++) gathers |= ks->in_role[q] != KERNEL_IN_PLAIN;
  if (gathers) {
    if (!(k->gather = malloc((size_t)ks->nin * sizeof *k->gather))) return false;
    for (int q = 0; q < ks->nin; q++)
      k->gather[q] = (cpu_gather_in){ks->in_role[q], ks->in_axis[q], ks->in_bound[q]};
  }
  return true;
}

/* the plan's kernel descriptions (descs[g] for each group a kernel
   starts at, descs[ngroups + g] for the epilogue kernel of a reduce
   group's) and their plan-level halves in cp */
static void plan_kernels(const tr_plan *plan, const cpu_leaf *leaves, cpu_plan *cp,
                         kernel_desc **descs) {
  uint8_t salt[256];
  size_t salt_len = key_salt(salt, sizeof salt);
  int ng = plan->ngroups;
  kernel_shape *ks = malloc(sizeof *ks);
  for (int g = 0; ks && g < ng; g++) {
    int last = tr_rows_enabled() ? kernel_plan_rows(plan, g, leaves, ks) : -1;
    if (last < g && !kernel_plan(plan, g, plan->escapes, leaves, ks)) continue;
    if (kernel_bind(&cp->kernels[g], ks))
      descs[g] = kernel_desc_new(plan, leaves, ks, salt, salt_len);
    int through = ks->last_group, resume = ks->resume;
    if (!ks->rowwise && ks->reduce >= 0 && resume <= plan->groups[g].last &&
        kernel_plan_epilogue(plan, g, resume, plan->escapes, leaves, ks) &&
        kernel_bind(&cp->kernels[ng + g], ks))
      descs[ng + g] = kernel_desc_new(plan, leaves, ks, salt, salt_len);
    g = through; /* a row kernel covers the groups up to there */
  }
  free(ks);
}

static bool same_kernel(const kernel_desc *a, const kernel_desc *b) {
  return a->len == b->len && !memcmp(a->key, b->key, sizeof a->key) &&
         !memcmp(a->bytes, b->bytes, a->len);
}

/* What compiling kernels costs, measured: a line ms = floor + per_kernel
   x kernels fitted (least squares, older compiles weighing less) to this
   machine's compiles (this process's, and earlier ones' kept in the disk
   cache, below), so both the fixed price of a compile (spawning the
   compiler, `as`, `ld`, loading) and the price of each kernel are known.
   Two made-up compiles seed it and are outweighed within a few real ones:
   1 kernel 120 ms, 8 kernels 800 ms, near the lower end of what the
   machines we run on take (one kernel of W7 compiled alone: 70-600 ms,
   median 135; W7's 10 in one batch: 0.9 s on a Zen 4, 1.5-2.1 s on a Zen
   3, 2 cores).  The old seed (40 ms, 200 ms) priced a compile 4-8x too
   low, so a short run compiled what could not pay before the run ended:
   W10 compiled 4 kernels (0.8-1.1 s, beside its own two threads) and ran
   6-14% behind KILN_JIT=0 on the Zen 3. */
static pthread_mutex_t cost_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  bool seeded;
  double s0, s1, s2, t0, t1; /* sums of w, w n, w n^2, w ms, w n ms */
} cost;

static void cost_add_locked(double n, double ms, double decay) {
  cost.s0 = decay * cost.s0 + 1;
  cost.s1 = decay * cost.s1 + n;
  cost.s2 = decay * cost.s2 + n * n;
  cost.t0 = decay * cost.t0 + ms;
  cost.t1 = decay * cost.t1 + n * ms;
}

/* The fit outlives the process: it is kept in the disk cache (an index
   record under a key of the compiler, Kiln's version and the target), so
   a process whose cache has seen compiles prices its first one at what
   this machine measured, not at the seed. */
typedef struct {
  char magic[8];
  double s0, s1, s2, t0, t1;
} cost_record;
#define COST_MAGIC "KILNCC01"

static bool cost_key(uint64_t out[2]) {
  uint8_t buf[160];
  size_t n = key_salt(buf, sizeof buf - 13);
  if (n > sizeof buf - 13) n = sizeof buf - 13; /* a salt snprintf cut short */
  memcpy(buf + n, "compile-price", 13);
  XXH128_hash_t h = XXH3_128bits(buf, n + 13);
  out[0] = h.low64;
  out[1] = h.high64;
  return cache_disk_enabled() && cache_disk_dir();
}

/* a record a process of this kind could have written: weights decayed
   by 0.8 per compile (their sum stays under 5) of compiles of 1..2^16
   kernels taking 0..10 minutes each, and a least-squares system that is
   one (Cauchy-Schwarz) */
static bool cost_record_sane(const cost_record *r) {
  double v[5] = {r->s0, r->s1, r->s2, r->t0, r->t1};
  for (int i = 0; i < 5; i++)
    if (!isfinite(v[i]) || v[i] < 0) return false;
  return !memcmp(r->magic, COST_MAGIC, 8) && r->s0 > 0.1 && r->s0 <= 8 && r->s1 <= r->s0 * 65536 &&
         r->t0 <= r->s0 * 6e5 && r->s0 * r->s2 >= r->s1 * r->s1 * (1 - 1e-9);
}

static void cost_seed_locked(void) {
  if (cost.seeded) return;
  cost.seeded = true;
  uint64_t key[2];
  cost_record r;
  if (cost_key(key) && cache_disk_index_get(key, &r, sizeof r) == sizeof r &&
      cost_record_sane(&r)) {
    cost.s0 = r.s0;
    cost.s1 = r.s1;
    cost.s2 = r.s2;
    cost.t0 = r.t0;
    cost.t1 = r.t1;
    return;
  }
  cost_add_locked(1, 120, 1);
  cost_add_locked(8, 800, 1);
}

static void note_compile_cost(double ms, int kernels) {
  if (kernels <= 0 || !(ms >= 0)) return;
  pthread_mutex_lock(&cost_lock);
  cost_seed_locked();
  cost_add_locked(kernels, ms, 0.8);
  cost_record r = {.s0 = cost.s0, .s1 = cost.s1, .s2 = cost.s2, .t0 = cost.t0, .t1 = cost.t1};
  pthread_mutex_unlock(&cost_lock);
  memcpy(r.magic, COST_MAGIC, 8);
  uint64_t key[2];
  if (cost_key(key) && cache_disk_writable()) cache_disk_index_put(key, &r, sizeof r);
}

/* the fitted price of compiling this many kernels together */
static double kernels_cost_ms(int kernels) {
  pthread_mutex_lock(&cost_lock);
  cost_seed_locked();
  double det = cost.s0 * cost.s2 - cost.s1 * cost.s1;
  double per = det > 1e-9 ? (cost.s0 * cost.t1 - cost.s1 * cost.t0) / det : 0;
  if (per < 0) per = 0;
  double floor = (cost.t0 - per * cost.s1) / cost.s0;
  if (floor < 0) floor = 0;
  pthread_mutex_unlock(&cost_lock);
  return floor + per * kernels;
}

double cpu_kernels_price_ms(int kernels) { return kernels_cost_ms(kernels); }

/* set on the compiler thread when it was started for the compiler process
   (jitc.h): no in-process compile may run there */
static _Thread_local bool on_outside_compiler;

/* how far compile_plan may go for a missing kernel */
typedef enum {
  FIND_IN_MEMORY, /* the kernel cache only (the caller's thread: a hash and a lookup per kernel) */
  FIND_PRICE,     /* the same; the price of the missing ones into *price */
  FIND_ON_DISK,   /* and the disk cache (a warm start, before any compile) */
  FIND_OR_COMPILE
} find_mode;

/* loading a kernel an earlier process compiled: its index record, its
   object mapped once per batch */
#define DISK_LOAD_MS 0.5

/* the payoff rule's price of the distinct missing kernels descs[miss[..]]:
   a load each for those on disk, a compile of the rest together.  Disk
   kernels are found by the build's ID only: a build keyed by source would
   emit each kernel with libgccjit to price it (it counts as missing; its
   compile still finds it on disk) */
static double missing_price(kernel_desc *const *descs, const int *miss, int nmiss) {
  bool keyed = cache_disk_enabled() && cache_disk_dir();
  int ndisk = 0;
  for (int m = 0; m < nmiss; m++) {
    uint64_t disk_key[2];
    kernel_index rec;
    ndisk += keyed && identity_key(descs[miss[m]]->key, disk_key) &&
             cache_disk_index_get(disk_key, &rec, sizeof rec) == sizeof rec &&
             !memcmp(rec.magic, KERNEL_INDEX_MAGIC, 8);
  }
  return (nmiss > ndisk ? kernels_cost_ms(nmiss - ndisk) : 0) + DISK_LOAD_MS * ndisk;
}

/* The plan's kernels from the kernel cache, else the disk cache, else
   compiled: the missing ones of the plan together.  NULL when none could
   be had, or when some are missing and mode forbids compiling them (with
   FIND_PRICE, *price is then theirs: 0 when the plan comes back). */
static cpu_plan *compile_plan(const tr_plan *plan, const cpu_leaf *leaves, find_mode mode,
                              double *price) {
  bool disk_only = mode != FIND_OR_COMPILE;
  if (!toolchain_present()) return NULL;
  double t0 = vm_now_ms();
  /* a slot per group's kernel, then per reduce group's epilogue kernel */
  int ng = plan->ngroups > 0 ? plan->ngroups : 1, ns = 2 * ng;
  cpu_plan *cp = calloc(1, sizeof *cp);
  kernel_desc **descs = calloc((size_t)ns, sizeof *descs);
  cpu_kentry **got = calloc((size_t)ns, sizeof *got);
  int *miss = calloc((size_t)ns, sizeof *miss);
  uint64_t(*disk_keys)[2] = calloc((size_t)ns, sizeof *disk_keys);
  if (cp) cp->kernels = calloc((size_t)ns, sizeof *cp->kernels);
  vm_counters *st = &vm_process()->stats;
  int hits = 0, nmiss = 0;
  if (!cp || !cp->kernels || !descs || !got || !miss || !disk_keys) goto done;
  cp->ngroups = ng;
  plan_kernels(plan, leaves, cp, descs);
  for (int g = 0; g < ns; g++) {
    if (!descs[g]) continue;
    if ((got[g] = cpu_kcache_get(descs[g]->key, descs[g]->bytes, descs[g]->len))) {
      hits++;
      continue;
    }
    bool twin = false; /* the same kernel twice in one plan is compiled once */
    for (int m = 0; m < nmiss && !twin; m++) twin = same_kernel(descs[miss[m]], descs[g]);
    if (!twin) miss[nmiss++] = g;
  }
  if (price) *price = nmiss > 0 ? missing_price(descs, miss, nmiss) : 0;
  /* the disk cache, kernel by kernel (a build with an ID builds no context) */
  if (nmiss > 0 &&
      (mode == FIND_IN_MEMORY || mode == FIND_PRICE)) { /* the rest is the compiler's */
    for (int g = 0; g < ns; g++) cpu_kcache_release(got[g]);
    memset(got, 0, (size_t)ns * sizeof *got);
    goto done;
  }
  bool keyed = nmiss > 0 && cache_disk_enabled() && cache_disk_dir();
  int left = 0;
  for (int m = 0; m < nmiss; m++) {
    int g = miss[m];
    bool has_key = keyed && kernel_disk_key(descs[g], disk_keys[left]);
    if (has_key && (got[g] = load_kernel(descs[g], disk_keys[left]))) {
      atomic_fetch_add_explicit(&st->disk_hits, 1, memory_order_relaxed);
      continue;
    }
    keyed = keyed && has_key;
    miss[left++] = g;
  }
  if (left > 0 && disk_only) { /* not all on disk: the compiler does the rest */
    for (int g = 0; g < ns; g++) cpu_kcache_release(got[g]);
    memset(got, 0, (size_t)ns * sizeof *got);
    goto done;
  }
  if (left > 0) {
    kernel_desc **batch = malloc((size_t)left * sizeof *batch);
    cpu_kentry **made = calloc((size_t)left, sizeof *made);
    bool *stored = calloc((size_t)left, 1);
    int compiled = 0, batches = 0;
    for (int m = 0; batch && m < left; m++) batch[m] = descs[miss[m]];
    uint8_t salt[256];
    size_t salt_len = key_salt(salt, sizeof salt);
    char why[256];
    /* kernels are stored in the disk cache only when it can take them: a
       read-only or full one still serves loads, and compiles go to memory */
    bool storable = keyed && cache_disk_writable();
    if (batch && made && stored && storable && jitc_available() &&
        jitc_compile(batch, left, (const uint64_t(*)[2])disk_keys, salt_len, stored, &batches, why,
                     sizeof why)) {
      if (why[0]) log_once("could not compile a kernel", why);
      /* the compiler process stored them: load them as any cached kernel */
      for (int m = 0; m < left; m++)
        if (stored[m]) compiled += (made[m] = load_kernel(batch[m], disk_keys[m])) != NULL;
    } else if (on_outside_compiler) {
      /* the compiler thread started for the compiler process registered
         no exit handler: libgccjit here could be torn down under a compile
         at exit (seen crashing).  These kernels stay interpreted. */
      log_once("could not compile in its compiler process", "the kernels run on the interpreter");
    } else if (!inprocess_trusted) {
      log_once("will not run the compiler in this process", inprocess_why);
    } else {
      /* KILN_COMPILE_BATCH=0 (a measuring knob): each kernel in a context
         of its own, as one object each */
      int per = vm_env_long("KILN_COMPILE_BATCH", 1) ? left : 1;
      for (int m = 0; batch && made && m < left; m += per, batches++)
        compiled += compile_batch(batch + m, left - m < per ? left - m : per,
                                  storable ? disk_keys + m : NULL, made + m);
    }
    for (int m = 0; made && m < left; m++) got[miss[m]] = made[m];
    free(batch);
    free(made);
    free(stored);
    if (compiled > 0) {
      note_compile_cost(vm_now_ms() - t0, compiled);
      atomic_fetch_add_explicit(&st->compiles, (uint_fast64_t)batches, memory_order_relaxed);
      atomic_fetch_add_explicit(&st->kernels_compiled, (uint_fast64_t)compiled,
                                memory_order_relaxed);
      vm_add_ms(&st->compile_us, vm_now_ms() - t0);
    } else {
      atomic_fetch_add_explicit(&st->compile_failures, 1, memory_order_relaxed);
    }
  }
  for (int g = 0; g < ns; g++) /* twins of a kernel compiled just now */
    if (descs[g] && !got[g]) got[g] = cpu_kcache_get(descs[g]->key, descs[g]->bytes, descs[g]->len);
  atomic_fetch_add_explicit(&st->kernel_cache_hits, (uint_fast64_t)hits, memory_order_relaxed);
  for (int g = 0; g < ns; g++) {
    cp->kernels[g].entry = got[g];
    cp->kernels[g].fn = cpu_kentry_fn(got[g]);
    cp->compiled += cp->kernels[g].fn != NULL;
  }
done:
  for (int g = 0; descs && g < ns; g++) kernel_desc_free(descs[g]);
  free(descs);
  free(got);
  free(miss);
  free(disk_keys);
  if (cp) cp->compile_ms = vm_now_ms() - t0;
  if (cp && !cp->compiled) {
    cpu_plan_free(cp);
    return NULL;
  }
  return cp;
}

cpu_plan *cpu_compile(const tr_plan *plan, const cpu_leaf *leaves) {
  return compile_plan(plan, leaves, FIND_OR_COMPILE, NULL);
}

#define NEVER_MS 1e300 /* what cannot be compiled never pays */

double cpu_plan_cost_ms(tr_plan *plan, const tr_trace *t) {
  cpu_leaf *leaves = toolchain_present() ? cpu_leaves_of(t) : NULL;
  if (!leaves) return NEVER_MS; /* never compiled: the interpreter */
  double price = NEVER_MS;
  cpu_plan *known = compile_plan(plan, leaves, FIND_PRICE, &price);
  if (known) { /* every kernel is here: the plan is ready now */
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&plan->jit, &none, known)) cpu_plan_free(known);
  }
  free(leaves);
  return price;
}

void cpu_plan_free(cpu_plan *cp) {
  if (!cp) return;
  for (int g = 0; cp->kernels && g < 2 * cp->ngroups; g++) {
    cpu_kcache_release(cp->kernels[g].entry);
    free(cp->kernels[g].ins);
    free(cp->kernels[g].outs);
    free(cp->kernels[g].params);
    free(cp->kernels[g].in_stride);
    free(cp->kernels[g].gather);
  }
  free(cp->kernels);
  free(cp);
}

/* --- running a compiled group ------------------------------------------------------ */

typedef struct {
  cpu_kernel_fn fn;
  void **bufs;
  const int64_t *meta;
  const void *params;
  int nbufs;            /* with a scratch row: the buffers before it */
  size_t scratch_bytes; /* a row kernel's scratch row, one per call (0: none) */
  atomic_bool failed;   /* a scratch row could not be allocated */
} run_job;

static void run_range(void *p, int64_t begin, int64_t end) {
  run_job *j = p;
  if (!j->scratch_bytes) {
    j->fn(j->bufs, j->meta, j->params, begin, end);
    return;
  }
  void *bufs[2 * KERNEL_MAX_IO + 1];
  memcpy(bufs, j->bufs, (size_t)j->nbufs * sizeof *bufs);
  bufs[j->nbufs] = malloc(j->scratch_bytes);
  if (!bufs[j->nbufs]) { /* this range computes nothing: the caller reports it */
    atomic_store(&j->failed, true);
    return;
  }
  j->fn(bufs, j->meta, j->params, begin, end);
  free(bufs[j->nbufs]);
}

#define RUN_GRAIN                                                                              \
  (1 << 15) /* as the interpreter's (VM_ITER_GRAIN): below, waking a worker costs more than it \
               saves */

/* --- what every runner does --------------------------------------------------------- */

/* input q's value and its strides over the iteration space `shape` (nd
   dims): broadcast (0 along broadcast dims); for an input a kernel reads
   by position along an axis (a gather's source, scatter_add's index and
   source, a concat's part), its own strides with the axis' put in
   *gstride and 0 in its place, and its extent along the axis in *extent;
   for an index_select's index, its stride along the gathered axis only;
   the coordinate has no value (*coord: strides 1 along its axis, 0
   elsewhere).  NULL when it does not fit */
static vm_tensor *input_strides(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                                vm_tensor **vals, int q, int nd, const int64_t *shape,
                                int64_t *strides, int64_t *gstride, int64_t *extent, bool *coord) {
  *gstride = *extent = 0;
  *coord = false;
  uint8_t role = k->gather ? k->gather[q].role : KERNEL_IN_PLAIN;
  if (role == KERNEL_IN_COORD) {
    int axis = k->gather[q].axis;
    if (axis < 0 || axis >= nd) return NULL;
    for (int d = 0; d < nd; d++) strides[d] = d == axis && shape[d] > 1 ? 1 : 0;
    *coord = true;
    return NULL;
  }
  vm_tensor *v = tr_run_value(plan, t, vals, k->ins[q]);
  if (v && role == KERNEL_IN_SCAN) /* the scanned axis kept (size 1) or dropped in the output */
    return vm_scan_strides(v, k->gather[q].axis, nd, shape, strides, gstride, extent) ? v : NULL;
  if (!v || v->ndim > nd) return NULL;
  if (role != KERNEL_IN_PLAIN) {
    int axis = k->gather[q].axis;
    if (axis < 0 || axis >= nd || v->ndim != (role == KERNEL_IN_SELECT ? 1 : nd)) return NULL;
    for (int d = 0; d < nd; d++) {
      if (kernel_role_extent(role) && d != axis && v->shape[d] != shape[d]) return NULL;
      strides[d] = shape[d] == 1              ? 0
                   : role == KERNEL_IN_SELECT ? (d == axis ? v->strides[0] : 0)
                   : d == axis                ? 0
                                              : v->strides[d];
    }
    if (kernel_role_moves(role)) *gstride = v->strides[axis];
    if (kernel_role_extent(role)) *extent = v->shape[axis];
    return v;
  }
  int lead = nd - v->ndim;
  for (int d = 0; d < nd; d++) {
    int src = d - lead;
    strides[d] = (src < 0 || v->shape[src] == 1) ? 0 : v->strides[src];
  }
  return v;
}

/* A kernel that moves data reads at index values unchecked: the values of
   every index input are checked first (as the interpreter does) against
   their source's axis, or a scatter_add's against the output's.  false:
   one is out of range, and the group then runs on the interpreter, which
   reports it as it would with the JIT off (the same message, the same
   failed values). */
static bool indices_in_range(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                             vm_tensor **vals) {
  for (int q = 0; k->gather && q < k->nin; q++) {
    int src = k->gather[q].bound;
    if (src == -1) continue;
    vm_tensor *idx = tr_run_value(plan, t, vals, k->ins[q]);
    int axis = k->gather[q].axis;
    int64_t size = -1;
    if (src == KERNEL_BOUND_OUT) {
      const vm_meta *om = &plan->nodes[k->outs[0]].meta;
      if (axis >= 0 && axis < om->ndim) size = om->shape[axis];
    } else if (src >= 0) {
      vm_tensor *from = tr_run_value(plan, t, vals, k->ins[src]);
      axis = k->gather[src].axis;
      if (from && axis >= 0 && axis < from->ndim) size = from->shape[axis];
    }
    if (!idx || idx->dtype != KILN_I64 || size < 0 || !vm_check_indices(idx, size, axis)) {
      vm_clear_error();
      return false;
    }
  }
  return true;
}

/* A fill the kernel reads (a full node: no group makes it, and
   tr_run_value would make it on the interpreter, one tensor per fill per
   run) is read from an 8-byte slot holding its value in its dtype, with
   strides 0: kernel_plan gives fills stride class 0, a broadcast, which a
   fill always is.  NULL for any other input. */
static void *fill_slot(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t, int q,
                       uint64_t *slot) {
  int r = k->ins[q];
  if (r < 0 || plan->nodes[r].op != VM_OP_full || k->in_stride[q] != 0) return NULL;
  const tr_pnode *p = &plan->nodes[r];
  *slot = 0;
  vm_store_f64(slot, p->meta.dtype, 0, t->nodes[p->src]->attr.scalar[0]);
  return slot;
}

/* the inner stride an input has now fits the one its kernel was compiled for */
static bool inner_fits(const cpu_kernel *k, int q, int64_t inner_stride) {
  return !(k->in_stride[q] == 0 && inner_stride != 0) &&
         !(k->in_stride[q] == 1 && inner_stride != 1);
}

/* this flush's host scalars: one 8-byte slot per full node */
static void kernel_params(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                          uint64_t *params) {
  for (int s = 0; s < k->nparams; s++) {
    const tr_pnode *p = &plan->nodes[k->params[s]];
    params[s] = 0;
    vm_store_f64(&params[s], p->meta.dtype, 0, t->nodes[p->src]->attr.scalar[0]);
  }
}

/* allocates the kernel's outputs into outs/bufs; each must hold `small`
   elements (the reduction's result, when by_reduce) or `big` (any output
   when !by_reduce may hold either).  1: done; 0: a layout the kernel cannot
   write (nothing allocated: the group runs on the interpreter); -1: out of
   memory (*rc set).  Not shared with jit_gpu/fuse.c's: what is the same
   (a tensor of each output node's meta) is one call; the layout check is
   the CPU's (its kernels index outputs by a row-major position the GPU's
   schedules do not share), the allocation and errors each device's own */
static int alloc_outputs(const cpu_kernel *k, const tr_plan *plan, int64_t small, int64_t big,
                         bool by_reduce, vm_tensor **outs, void **bufs, int *rc) {
  for (int q = 0; q < k->nout; q++) {
    const vm_meta *m = &plan->nodes[k->outs[q]].meta;
    outs[q] = vm_tensor_new(m->dtype, m->ndim, m->shape);
    bool fits = outs[q] && (by_reduce ? outs[q]->numel == (k->outs[q] == k->reduce ? small : big)
                                      : outs[q]->numel == small || outs[q]->numel == big);
    if (!fits) {
      bool oom = !outs[q];
      for (int u = 0; u <= q; u++) vm_release(outs[u]);
      if (oom)
        *rc = vm_thread()->status ? vm_thread()->status : vm_error(KILN_ERR_OOM, "out of memory");
      return oom ? -1 : 0;
    }
    bufs[q] = vm_data(outs[q]);
  }
  return 1;
}

/* runs the kernel over [0, n) on the pool and publishes its outputs (or,
   when a row kernel's scratch row could not be allocated, releases them
   and sets *rc) */
static void launch(run_job *job, int64_t n, int64_t grain, const cpu_kernel *k, vm_tensor **outs,
                   vm_tensor **vals, int *rc) {
  if (n > 0) { /* an empty range launches nothing: empty tensors do no work */
    vm_parallel_for(n, grain, run_range, job);
    atomic_fetch_add_explicit(&vm_process()->stats.kernels_launched, 1, memory_order_relaxed);
  }
  if (atomic_load(&job->failed)) {
    for (int q = 0; q < k->nout; q++) vm_release(outs[q]);
    *rc = vm_error(KILN_ERR_OOM, "out of memory (a row kernel's scratch row of %zu bytes)",
                   job->scratch_bytes);
    return;
  }
  for (int q = 0; q < k->nout; q++) vals[k->outs[q]] = outs[q];
}

/* one stride for the dims d in [d0, d1) (size 1 ignored) when they collapse */
static bool collapse_range(const int64_t *shape, const int64_t *stride, int d0, int d1,
                           int64_t *out) {
  int64_t s = 0, span = 0;
  bool any = false;
  for (int d = d1 - 1; d >= d0; d--) {
    if (shape[d] == 1) continue;
    if (any && stride[d] != span) return false;
    if (!any) s = stride[d];
    any = true;
    if (__builtin_mul_overflow(stride[d], shape[d], &span)) return false;
  }
  *out = s;
  return true;
}

/* the reduced run [*first, *last] of a reduction over input shape rin */
static bool reduced_run(const tr_pnode *red, const vm_meta *rin, int *first, int *last) {
  *first = rin->ndim;
  *last = -1;
  for (int d = 0; d < rin->ndim; d++)
    if ((red->attr.axes_mask & (1u << d)) && rin->shape[d] > 1) {
      if (*first == rin->ndim) *first = d;
      *last = d;
    }
  return true;
}

/* per input, its strides over the reduction input's dims split at the
   reduced run: (outer, reduced, inner) into meta3 (3 per input) or, for
   trailing reductions, (rows, reduced) into meta2 (2 per input); bufs get
   the inputs' data.  false: a layout the kernel was not compiled for */
/* contiguous copies of inputs a reduction kernel could not read in place
   (held until the kernel ran) */
typedef struct {
  vm_tensor *t[KERNEL_MAX_IO];
  int n;
} input_copies;

static void release_copies(input_copies *c) {
  while (c->n > 0) vm_release(c->t[--c->n]);
}

/* v seen with strides over shape, as a contiguous copy (strides set to its
   own): a broadcast input (a bias under a sum over every axis, strides
   (0, 1)) has no single stride along the reduced run, and a copy lets the
   kernel run instead of the interpreter; it reads the same values in the
   same order, so the result is the same */
static vm_tensor *contiguous_copy(vm_tensor *v, const vm_meta *rin, int64_t *strides,
                                  input_copies *c) {
  if (c->n == KERNEL_MAX_IO) return NULL;
  vm_tensor *view = vm_tensor_view(v, rin->ndim, rin->shape, strides, v->offset);
  vm_tensor *copy = view ? vm_value_copy(view) : NULL;
  vm_release(view);
  if (!copy) {
    vm_clear_error();
    return NULL;
  }
  c->t[c->n++] = copy;
  for (int d = 0; d < rin->ndim; d++) strides[d] = rin->shape[d] == 1 ? 0 : copy->strides[d];
  return copy;
}

static bool split_strides(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                          vm_tensor **vals, const tr_pnode *red, const vm_meta *rin, int64_t count,
                          int per_input, int64_t *meta, int64_t *gstrides, void **bufs,
                          uint64_t *fills, input_copies *copies) {
  int first, last, nd = rin->ndim;
  reduced_run(red, rin, &first, &last);
  if (last < 0) { /* nothing reduced: every dim is a kept one */
    first = nd;
    last = nd - 1;
  }
  if (!indices_in_range(k, plan, t, vals)) return false;
  for (int q = 0; q < k->nin; q++) {
    gstrides[q] = 0;
    if ((bufs[k->nout + q] = fill_slot(k, plan, t, q, &fills[q]))) {
      memset(meta + per_input * q, 0, (size_t)per_input * sizeof *meta);
      continue;
    }
    int64_t strides[KILN_MAX_DIMS], s_out, s_red, s_in;
    int64_t extent;
    bool coord;
    vm_tensor *v =
        input_strides(k, plan, t, vals, q, nd, rin->shape, strides, &gstrides[q], &extent, &coord);
    /* a source's copy would lose what its zeroed axis hides */
    bool source = k->gather && k->gather[q].role == KERNEL_IN_SOURCE;
    if (v && !collapse_range(rin->shape, strides, first, last + 1, &s_red))
      v = source ? NULL : contiguous_copy(v, rin, strides, copies);
    if (!v || !collapse_range(rin->shape, strides, 0, first, &s_out) ||
        !collapse_range(rin->shape, strides, first, last + 1, &s_red) ||
        !collapse_range(rin->shape, strides, last + 1, nd, &s_in)) {
      release_copies(copies);
      return false;
    }
    if (per_input == 2) { /* trailing: nothing after the reduced run */
      if (count > 1 && !inner_fits(k, q, s_red)) {
        release_copies(copies);
        return false;
      }
      meta[2 * q] = s_out;
      meta[2 * q + 1] = s_red;
    } else {
      if (!inner_fits(k, q, s_in)) {
        release_copies(copies);
        return false;
      }
      meta[3 * q] = s_out;
      meta[3 * q + 1] = s_red;
      meta[3 * q + 2] = s_in;
    }
    bufs[k->nout + q] = vm_data(v);
  }
  return true;
}

/* the bits of an integer accumulator as dt's value (two's complement) */
static int64_t wrap_int(kiln_dtype dt, uint64_t v) {
  switch (dt) {
    case KILN_U8:
      return (uint8_t)v;
    case KILN_I8:
      return (int8_t)(uint8_t)v;
    case KILN_I16:
      return (int16_t)(uint16_t)v;
    case KILN_I32:
      return (int32_t)(uint32_t)v;
    default:
      return (int64_t)v;
  }
}

/* folds integer chunk partials part[o * nchunks + ch] of each row o into
   out[o] (wrapping; float partials fold in vm_fold_partials) */
static void fold_int_partials(vm_opcode op, kiln_dtype dt, const void *part, int64_t nchunks,
                              int64_t rows, void *out) {
  size_t es = vm_dtype_size(dt);
  for (int64_t o = 0; o < rows; o++) {
    uint64_t iacc = op == VM_OP_prod ? 1 : 0;
    for (int64_t ch = 0; ch < nchunks; ch++) {
      uint64_t bits = 0; /* the element's bytes, little-endian, as its dtype's value */
      memcpy(&bits, (const char *)part + (size_t)(o * nchunks + ch) * es, es);
      int64_t x = wrap_int(dt, bits), a = wrap_int(dt, iacc);
      if (ch == 0 && (op == VM_OP_max || op == VM_OP_min))
        iacc = (uint64_t)x;
      else if (op == VM_OP_sum)
        iacc += (uint64_t)x;
      else if (op == VM_OP_prod)
        iacc *= (uint64_t)x;
      else if (op == VM_OP_max ? x > a : x < a)
        iacc = (uint64_t)x;
    }
    memcpy((char *)out + (size_t)o * es, &iacc, es); /* the low bytes: wrapped to dt */
  }
}

/* a reduction over trailing axes: rows x count, long rows in chunks.
   What it shares with jit_gpu/fuse.c's run_reduce is the plan's (the
   reduction's input: tr_ref_meta; the fold order: vm/fold.h); the split
   into rows and chunks across the pool's threads and the host fold of the
   partials are the CPU's, the GPU's launch grid and join kernel its own */
static bool run_reduce(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                       vm_tensor **vals, int *rc) {
  const tr_pnode *red = &plan->nodes[k->reduce];
  const vm_meta *rin = tr_ref_meta(plan, t, red->in[0]);
  int64_t rows, count;
  if (!kernel_reduce_split(red, rin, &rows, &count)) return false;
  /* long rows split into chunks of a fixed size, so results do not depend
     on the thread count */
  int64_t chunk = count > KERNEL_REDUCE_CHUNK ? KERNEL_REDUCE_CHUNK : count > 0 ? count : 1;
  int64_t nchunks = count > KERNEL_REDUCE_CHUNK ? (count + chunk - 1) / chunk : 1;
  int64_t meta[4 + 3 * KERNEL_MAX_IO] = {rows, count, chunk, nchunks}; /* + gathered strides */
  void *bufs[2 * KERNEL_MAX_IO + 1];
  uint64_t params[KERNEL_MAX_IO], fills[KERNEL_MAX_IO];
  vm_tensor *outs[KERNEL_MAX_IO] = {0}, *partials = NULL;
  input_copies copies = {.n = 0};
  if (!split_strides(k, plan, t, vals, red, rin, count, 2, meta + 4, meta + 4 + 2 * k->nin, bufs,
                     fills, &copies))
    return false;
  kernel_params(k, plan, t, params);
  int got = alloc_outputs(k, plan, rows, rows * count, true, outs, bufs, rc);
  if (got <= 0) {
    release_copies(&copies);
    return got < 0;
  }
  int qr = 0;
  while (k->outs[qr] != k->reduce) qr++;
  if (nchunks > 1) { /* the chunks' values, folded below */
    int64_t np = rows * nchunks;
    if (!(partials = vm_tensor_new(red->meta.dtype, 1, &np))) {
      for (int q = 0; q < k->nout; q++) vm_release(outs[q]);
      release_copies(&copies);
      *rc = vm_thread()->status ? vm_thread()->status : vm_error(KILN_ERR_OOM, "out of memory");
      return true;
    }
    bufs[qr] = vm_data(partials);
  }
  run_job job = {.fn = k->fn, .bufs = bufs, .meta = meta, .params = params};
  launch(&job, rows * nchunks, RUN_GRAIN / chunk + 1, k, outs, vals, rc);
  release_copies(&copies);
  if (partials) {
    if (vm_dtype_is_float(red->meta.dtype)) /* the interpreter's fold (vm/fold.h) */
      vm_fold_partials(red->op, red->meta.dtype, vm_data(partials), nchunks, rows,
                       vm_data(outs[qr]));
    else
      fold_int_partials(red->op, red->meta.dtype, vm_data(partials), nchunks, rows,
                        vm_data(outs[qr]));
    vm_release(partials);
  }
  return true;
}

/* a column reduction: outer x count x inner */
static bool run_reduce_cols(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                            vm_tensor **vals, int *rc) {
  const tr_pnode *red = &plan->nodes[k->reduce];
  const vm_meta *rin = tr_ref_meta(plan, t, red->in[0]);
  int64_t outer, count, inner;
  if (!kernel_reduce_split3(red, rin, &outer, &count, &inner)) return false;
  int64_t nblocks = (inner + KERNEL_COLS - 1) / KERNEL_COLS;
  int64_t meta[4 + 3 * KERNEL_MAX_IO] = {outer, count, inner, nblocks};
  void *bufs[2 * KERNEL_MAX_IO + 1];
  uint64_t params[KERNEL_MAX_IO], fills[KERNEL_MAX_IO];
  vm_tensor *outs[KERNEL_MAX_IO] = {0};
  input_copies copies = {.n = 0};
  int64_t gstrides[KERNEL_MAX_IO]; /* none: a column reduction gathers nothing */
  if (!split_strides(k, plan, t, vals, red, rin, count, 3, meta + 4, gstrides, bufs, fills,
                     &copies))
    return false;
  kernel_params(k, plan, t, params);
  int got = alloc_outputs(k, plan, outer * inner, outer * count * inner, true, outs, bufs, rc);
  if (got <= 0) {
    release_copies(&copies);
    return got < 0;
  }
  run_job job = {.fn = k->fn, .bufs = bufs, .meta = meta, .params = params};
  int64_t per_item = count * (inner < KERNEL_COLS ? inner : KERNEL_COLS);
  launch(&job, outer * nblocks, RUN_GRAIN / (per_item > 0 ? per_item : 1) + 1, k, outs, vals, rc);
  release_copies(&copies);
  return true;
}

/* a row kernel: rows x count as for its first reduction; its outputs are
   row-level (rows) or per element (rows x count).  What it covers was
   planned in trace/rows.h for both backends; running it (threads, strides,
   scratch rows) is the CPU's, as run_reduce says */
static bool run_rows(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t, vm_tensor **vals,
                     int *rc) {
  const tr_pnode *red = &plan->nodes[k->reduce];
  const vm_meta *rin = tr_ref_meta(plan, t, red->in[0]);
  int64_t rows, count;
  if (!kernel_reduce_split(red, rin, &rows, &count)) return false;
  int64_t meta[2 + 2 * KERNEL_MAX_IO] = {rows, count};
  void *bufs[2 * KERNEL_MAX_IO + 1];
  uint64_t params[KERNEL_MAX_IO], fills[KERNEL_MAX_IO];
  vm_tensor *outs[KERNEL_MAX_IO] = {0};
  input_copies copies = {.n = 0};
  int64_t gstrides[KERNEL_MAX_IO]; /* none: a row kernel gathers nothing */
  if (!split_strides(k, plan, t, vals, red, rin, count, 2, meta + 2, gstrides, bufs, fills,
                     &copies))
    return false;
  kernel_params(k, plan, t, params);
  int got = alloc_outputs(k, plan, rows, rows * count, false, outs, bufs, rc);
  if (got <= 0) {
    release_copies(&copies);
    return got < 0;
  }
  run_job job = {.fn = k->fn,
                 .bufs = bufs,
                 .meta = meta,
                 .params = params,
                 .nbufs = k->nout + k->nin,
                 .scratch_bytes = (size_t)k->nstash * 8 * (size_t)count};
  launch(&job, rows, RUN_GRAIN / (count > 0 ? count : 1) + 1, k, outs, vals, rc);
  release_copies(&copies);
  return true;
}

/* an elementwise kernel over its outputs' shape, dims coalesced */
static bool run_elementwise(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t,
                            vm_tensor **vals, int *rc) {
  const vm_meta *om = &plan->nodes[k->outs[0]].meta;
  int nd = om->ndim, nin = k->nin;
  int64_t shape[KILN_MAX_DIMS], strides[KERNEL_MAX_IO][KILN_MAX_DIMS], gstrides[KERNEL_MAX_IO],
      extents[KERNEL_MAX_IO];
  void *bufs[2 * KERNEL_MAX_IO + 1];
  uint64_t fills[KERNEL_MAX_IO];
  static const uint64_t no_value; /* the coordinate's buffer: never read */
  if (!indices_in_range(k, plan, t, vals)) return false;
  for (int q = 0; q < nin; q++) {
    gstrides[q] = extents[q] = 0;
    if ((bufs[k->nout + q] = fill_slot(k, plan, t, q, &fills[q]))) {
      memset(strides[q], 0, (size_t)nd * sizeof(int64_t));
      if (k->gather && kernel_role_extent(k->gather[q].role)) { /* a concat's fill part */
        const vm_meta *fm = &plan->nodes[k->ins[q]].meta;
        int axis = k->gather[q].axis;
        if (fm->ndim != nd || axis < 0 || axis >= nd) return false;
        extents[q] = fm->shape[axis];
      }
      continue;
    }
    bool coord;
    vm_tensor *v = input_strides(k, plan, t, vals, q, nd, om->shape, strides[q], &gstrides[q],
                                 &extents[q], &coord);
    if (!v && !coord) return false;
    bufs[k->nout + q] = coord ? (void *)&no_value : vm_data(v);
  }
  for (int q = 0; k->gather && q < nin; q++) /* a part's clamped loads stay inside it */
    if (k->gather[q].role == KERNEL_IN_PART && extents[q] < 1) return false;
  /* coalesce: drop size-1 dims, merge dims every input (and the contiguous
     outputs) steps through as one */
  int64_t cs[KERNEL_MAX_IO][KILN_MAX_DIMS];
  int n = vm_coalesce(nd, om->shape, nin, (const int64_t(*)[KILN_MAX_DIMS])strides, shape, cs);
  for (int q = 0; q < nin; q++) /* the layout the kernel was compiled for */
    if (shape[n - 1] > 1 && !inner_fits(k, q, cs[q][n - 1])) return false;
  int64_t meta[1 + KILN_MAX_DIMS * (KERNEL_MAX_IO + 1) + 2 * KERNEL_MAX_IO];
  meta[0] = n;
  memcpy(meta + 1, shape, (size_t)n * sizeof(int64_t));
  for (int q = 0; q < nin; q++) memcpy(meta + 1 + n * (q + 1), cs[q], (size_t)n * sizeof(int64_t));
  memcpy(meta + 1 + n * (nin + 1), gstrides, (size_t)nin * sizeof(int64_t));
  memcpy(meta + 1 + n * (nin + 1) + nin, extents, (size_t)nin * sizeof(int64_t));
  int64_t total = 1;
  for (int d = 0; d < n; d++) total *= shape[d];
  uint64_t params[KERNEL_MAX_IO];
  kernel_params(k, plan, t, params);
  vm_tensor *outs[KERNEL_MAX_IO] = {0};
  int got = alloc_outputs(k, plan, total, total, false, outs, bufs,
                          rc); /* every output spans the space */
  if (got <= 0) return got < 0;
  run_job job = {.fn = k->fn, .bufs = bufs, .meta = meta, .params = params};
  /* an argmax scans, a scatter_add sums, `extent` elements per output: the
     grain counts them (16384 argmax outputs over windows of 4 made one
     chunk, so one thread) */
  int64_t per = 1;
  for (int q = 0; k->gather && q < nin; q++)
    if ((k->gather[q].role == KERNEL_IN_SCAN || k->gather[q].role == KERNEL_IN_SCATTER_INDEX) &&
        extents[q] > per)
      per = extents[q];
  launch(&job, total, RUN_GRAIN / per + 1, k, outs, vals, rc);
  return true;
}

bool cpu_run_group(const cpu_kernel *k, const tr_plan *plan, const tr_trace *t, int g,
                   vm_tensor **vals, int *rc) {
  (void)g;
  if (k->rowwise) return run_rows(k, plan, t, vals, rc);
  if (k->cols) return run_reduce_cols(k, plan, t, vals, rc);
  if (k->reduce >= 0) return run_reduce(k, plan, t, vals, rc);
  return run_elementwise(k, plan, t, vals, rc);
}

/* --- the background compiler (trace/compile_queue.h) ------------------------------ */

typedef struct {
  tr_compile_job job; /* first: the queue's part */
  cpu_leaf *leaves;
} compile_job;

/* compiles plan here, on this thread, and publishes it */
static void compile_here(tr_plan *plan, const cpu_leaf *leaves) {
  cpu_plan *cp = cpu_compile(plan, leaves);
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&plan->jit, &none, cp)) cpu_plan_free(cp);
}

static void compiler_stop(void) { tr_compile_stop(KILN_CPU); }

static void compiler_begin(void *outside) { on_outside_compiler = outside != NULL; }

static void compiler_run(tr_compile_job *queued) {
  compile_job *job = (compile_job *)queued;
  compile_here(job->job.plan, job->leaves);
  free(job->leaves);
  free(job);
  /* exit handlers run last-registered first, and libgccjit registers
     teardown of its own while it compiles: ours must come after them all
     so that it runs first and waits for a compile in flight.  Only for
     compiles in this process: the compiler process needs no waiting */
  if (atomic_load(&gccjit_warm)) atexit(compiler_stop);
}

static void compiler_drop(tr_compile_job *queued) {
  compile_job *job = (compile_job *)queued;
  free(job->leaves);
  free(job);
}

static const tr_compile_ops compiler_ops = {compiler_run, compiler_drop, compiler_begin, true};

/* one compile of an empty function with the JIT's options, on this thread */
static void warm_gccjit(void) {
  if (atomic_load(&gccjit_warm) || !toolchain_present() || !inprocess_trusted) return;
  gcc_jit_context *ctx = gcc_jit_context_acquire();
  if (!ctx) return;
  set_options(ctx);
  gcc_jit_type *v = gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_VOID);
  gcc_jit_function *f = gcc_jit_context_new_function(ctx, NULL, GCC_JIT_FUNCTION_EXPORTED, v,
                                                     "kiln_warm", 0, NULL, 0);
  gcc_jit_block_end_with_void_return(gcc_jit_function_new_block(f, "entry"), NULL);
  gcc_jit_result *r = gcc_jit_context_compile(ctx);
  if (r) {
    atomic_store(&gccjit_warm, true);
    gcc_jit_result_release(r);
  } else {
    log_once("could not compile", gcc_jit_context_get_first_error(ctx));
  }
  gcc_jit_context_release(ctx);
}

void cpu_compile_wait(void) { tr_compile_wait(KILN_CPU); }

void cpu_compile_async(tr_plan *plan, const tr_trace *t) {
  if (atomic_load(&plan->jit)) return; /* ready already (cpu_plan_cost_ms found every kernel) */
  compile_job *job = calloc(1, sizeof *job);
  if (!job || !(job->leaves = cpu_leaves_of(t))) {
    free(job);
    return;
  }
  /* a plan whose kernels are all compiled already (another trace has
     them: an RNN at a new length) is ready now, not after the queue */
  cpu_plan *known =
      cpu_kcache_kernels() > 0 ? compile_plan(plan, job->leaves, FIND_IN_MEMORY, NULL) : NULL;
  if (known) {
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&plan->jit, &none, known)) cpu_plan_free(known);
    free(job->leaves);
    free(job);
    return;
  }
  job->job.plan = plan;
  if (tr_compile_unstarted(KILN_CPU)) {
    /* libgccjit sets up, and registers the exit teardown of, its state
       during its first compile; our exit handler (which waits for a
       background compile) must be registered after that, to run before it
       (exit crashed otherwise).  So before the first compile, a trivial
       context is compiled here (~35 ms, not the plan's compile), then the
       thread starts (none of this with the compiler process: jitc.h).
       Until then, plans an earlier process compiled load from the disk
       cache right here (no compiler runs), so a warm start pays for no
       compiler at all. */
    cpu_plan *cached =
        atomic_load(&gccjit_warm) ? NULL : compile_plan(plan, job->leaves, FIND_ON_DISK, NULL);
    if (cached) {
      void *none = NULL;
      if (!atomic_compare_exchange_strong(&plan->jit, &none, cached)) cpu_plan_free(cached);
      free(job->leaves);
      free(job);
      return;
    }
    /* with the compiler process, this process never runs libgccjit */
    bool outside = jitc_available();
    if (!outside) warm_gccjit();
    if ((outside || atomic_load(&gccjit_warm)) &&
        tr_compile_start(KILN_CPU, &compiler_ops, outside ? (void *)1 : NULL) && !outside)
      atexit(compiler_stop);
  }
  if (!tr_compile_push(KILN_CPU, &job->job)) { /* no thread, or stopping: compile here */
    compile_here(plan, job->leaves);
    free(job->leaves);
    free(job);
  }
}
