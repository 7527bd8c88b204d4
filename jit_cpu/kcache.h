/* kcache.h — internal to jit_cpu/: the CPU's side of the kernel cache
 * (cache/kernel_cache.h, DESIGN §4, the second level), typed: a kernel's
 * own description -> its compiled function, and the code objects (a
 * libgccjit result or a shared object from the disk cache) that hold
 * compiled functions.  The rule is the cache's, shared with the GPU: plans
 * hold references to kernels; a kernel no plan references stays cached,
 * least recently used first out, up to KILN_KERNEL_CACHE_MAX of them; a
 * code object none of whose kernels is cached any more is unloaded. */
#ifndef CPU_KCACHE_H
#define CPU_KCACHE_H

#include <libgccjit.h>
#include <stddef.h>
#include <stdint.h>

#include "../cache/kernel_cache.h"
#include "jit.h"

typedef cache_code cpu_code;
typedef cache_kernel cpu_kentry;

/* a new code object owning result (or dl, a dlopen handle); the caller
   holds one reference, dropped with cpu_code_release once it has put the
   object's kernels in the cache.  batch: the disk key it was loaded or
   stored under (NULL: none), so that a second lookup finds it loaded.
   NULL when out of memory (result or dl is then still the caller's) */
cpu_code *cpu_code_new(gcc_jit_result *result, void *dl, const uint64_t *batch);
/* the loaded code object with disk key batch, retained; NULL if none */
cpu_code *cpu_code_find(const uint64_t batch[2]);
void *cpu_code_symbol(cpu_code *code, const char *name);
void cpu_code_release(cpu_code *code);

/* the cached kernel with this key and description bytes, retained (one
   reference per holder); NULL when not cached */
cpu_kentry *cpu_kcache_get(const uint64_t key[2], const uint8_t *bytes, size_t len);
/* caches fn of code under key, retained for the caller; if another thread
   cached the key meanwhile, that entry is returned instead */
cpu_kentry *cpu_kcache_put(const uint64_t key[2], const uint8_t *bytes, size_t len, cpu_code *code,
                           cpu_kernel_fn fn);
cpu_kernel_fn cpu_kentry_fn(const cpu_kentry *e);
void cpu_kcache_release(cpu_kentry *e);

/* kernels cached, and code objects loaded (tests, stats) */
long cpu_kcache_kernels(void);
long cpu_kcache_code_objects(void);
/* kernels ever cached in this process: grows with every kernel compiled or loaded */
long cpu_kcache_generation(void);
/* drops every unreferenced kernel (and so unloads their code when no plan
   still uses it); tests */
void cpu_kcache_trim(void);

#endif
