/* kernel_cache.h — the kernel cache (DESIGN §4, the second level), one for
 * both backends: a kernel's key (a hash and the full description bytes) ->
 * its backend's compiled function, and the code objects that hold compiled
 * functions (a libgccjit result or a shared object on the CPU, a CUmodule on
 * the GPU), opaque here: each comes with its backend's unload function.
 *
 * The one eviction rule: plans hold references to kernels, and a kernel a
 * plan references is never dropped; a kernel no plan references stays
 * cached, least recently used first out, up to KILN_KERNEL_CACHE_MAX
 * (default 2048) of them per device; a code object none of whose kernels is
 * cached any more is unloaded through its unload function. */
#ifndef CACHE_KERNEL_CACHE_H
#define CACHE_KERNEL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef struct cache_code cache_code;
typedef struct cache_kernel cache_kernel;

/* a new code object of device dev owning handle, which unload(handle)
   unloads (called without the cache's lock, on whichever thread drops the
   last reference); the caller holds one reference, dropped with
   cache_code_release once it has put the object's kernels in the cache.
   batch: the disk key it was loaded or stored under (NULL: none), so that
   a second lookup finds it loaded.  NULL when out of memory (handle is
   then still the caller's). */
cache_code *cache_code_new(kiln_device dev, void *handle, void (*unload)(void *handle),
                           const uint64_t *batch);
/* the loaded code object of dev with disk key batch, retained; NULL if none */
cache_code *cache_code_find(kiln_device dev, const uint64_t batch[2]);
void *cache_code_handle(const cache_code *code);
void cache_code_release(cache_code *code);

/* the cached kernel of dev with this key and description bytes, retained
   (one reference per holder); NULL when not cached */
cache_kernel *cache_kernel_get(kiln_device dev, const uint64_t key[2], const void *bytes,
                               size_t len);
/* caches fn of code under key, retained for the caller; if another thread
   cached the key meanwhile, that entry is returned instead.  NULL when out
   of memory (or fn or code is NULL) */
cache_kernel *cache_kernel_put(kiln_device dev, const uint64_t key[2], const void *bytes,
                               size_t len, cache_code *code, void *fn);
void *cache_kernel_fn(const cache_kernel *k);
/* another reference to k (a second plan, a launch in flight) */
void cache_kernel_retain(cache_kernel *k);
/* drops one; the last makes k the most recently used idle kernel, and the
   least recently used past KILN_KERNEL_CACHE_MAX leave the cache */
void cache_kernel_release(cache_kernel *k);

/* dev's kernels cached, and code objects loaded (tests, stats) */
long cache_kernel_count(kiln_device dev);
long cache_code_count(kiln_device dev);
/* dev's kernels ever cached in this process: grows with every kernel
   compiled or loaded (the payoff rule's prices hold for one generation) */
long cache_kernel_generation(kiln_device dev);
/* drops every unreferenced kernel of dev (and so unloads their code when
   no plan still uses it); tests */
void cache_kernel_trim(kiln_device dev);

#endif
