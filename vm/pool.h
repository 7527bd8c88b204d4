/* pool.h — the kernel thread pool.  vm_parallel_for splits [0, n) into
 * contiguous ranges run on the pool's workers and the calling thread. */
#ifndef VM_POOL_H
#define VM_POOL_H

#include <stdint.h>

typedef void (*vm_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n).  Ranges are at least `grain` long, so small work runs
   inline on the caller.  Nested or concurrent calls from other threads run
   inline instead of waiting for the pool. */
void vm_parallel_for(int64_t n, int64_t grain, vm_range_fn fn, void *ctx);

/* Like vm_parallel_for, but with exactly `chunks` ranges of [0, n) split
   independently of the thread count: fn(ctx, chunk, begin, end).  Used by
   reductions, whose results must not depend on the number of threads. */
typedef void (*vm_chunk_fn)(void *ctx, int64_t chunk, int64_t begin, int64_t end);
void vm_parallel_chunks(int64_t n, int64_t chunks, vm_chunk_fn fn, void *ctx);

int vm_pool_threads(void);

#endif
