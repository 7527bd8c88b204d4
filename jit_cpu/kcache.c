/* kcache.c — the CPU's side of the kernel cache (cache/kernel_cache.c):
 * its code objects (a libgccjit result or a dlopen'd shared object) and how
 * they are unloaded, and kernels typed as cpu_kernel_fn.  The cache itself,
 * its references, LRU and unloading rule, lives in cache/. */
#include "kcache.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* a code object's handle: one of the two */
typedef struct {
  gcc_jit_result *result;
  void *dl;
} cpu_object;

static void object_unload(void *handle) {
  cpu_object *o = handle;
  if (o->dl) dlclose(o->dl);
  if (o->result) gcc_jit_result_release(o->result);
  free(o);
}

cpu_code *cpu_code_new(gcc_jit_result *result, void *dl, const uint64_t *batch) {
  cpu_object *o = malloc(sizeof *o);
  if (!o) return NULL;
  *o = (cpu_object){result, dl};
  cpu_code *c = cache_code_new(KILN_CPU, o, object_unload, batch);
  if (!c) free(o);
  return c;
}

cpu_code *cpu_code_find(const uint64_t batch[2]) { return cache_code_find(KILN_CPU, batch); }

void *cpu_code_symbol(cpu_code *code, const char *name) {
  cpu_object *o = cache_code_handle(code);
  return o->dl ? dlsym(o->dl, name) : gcc_jit_result_get_code(o->result, name);
}

void cpu_code_release(cpu_code *code) { cache_code_release(code); }

cpu_kentry *cpu_kcache_get(const uint64_t key[2], const uint8_t *bytes, size_t len) {
  return cache_kernel_get(KILN_CPU, key, bytes, len);
}

cpu_kentry *cpu_kcache_put(const uint64_t key[2], const uint8_t *bytes, size_t len, cpu_code *code,
                           cpu_kernel_fn fn) {
  void *p;
  memcpy(&p, &fn, sizeof p); /* a function pointer kept as the cache's opaque one */
  return cache_kernel_put(KILN_CPU, key, bytes, len, code, fn ? p : NULL);
}

cpu_kernel_fn cpu_kentry_fn(const cpu_kentry *e) {
  void *p = cache_kernel_fn(e);
  cpu_kernel_fn fn;
  memcpy(&fn, &p, sizeof fn);
  return fn;
}

void cpu_kcache_release(cpu_kentry *e) { cache_kernel_release(e); }

long cpu_kcache_kernels(void) { return cache_kernel_count(KILN_CPU); }
long cpu_kcache_code_objects(void) { return cache_code_count(KILN_CPU); }
long cpu_kcache_generation(void) { return cache_kernel_generation(KILN_CPU); }
void cpu_kcache_trim(void) { cache_kernel_trim(KILN_CPU); }
