/* pool.h — the kernel thread pool.  vm_parallel_for splits [0, n) into
 * contiguous ranges run on the pool's workers and the calling thread; all
 * user threads together run at most KILN_THREADS threads of kernel work. */
#ifndef VM_POOL_H
#define VM_POOL_H

#include <stdint.h>

typedef void (*vm_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n).  Ranges are at least `grain` long, so small work runs
   inline on the caller.  The calling thread holds a kernel token while it
   runs (vm_pool_enter); a call from inside a chunk runs inline. */
void vm_parallel_for(int64_t n, int64_t grain, vm_range_fn fn, void *ctx);

/* Like vm_parallel_for, but with exactly `chunks` ranges of [0, n) split
   independently of the thread count: fn(ctx, chunk, begin, end).  Used by
   reductions, whose results must not depend on the number of threads. */
typedef void (*vm_chunk_fn)(void *ctx, int64_t chunk, int64_t begin, int64_t end);
void vm_parallel_chunks(int64_t n, int64_t chunks, vm_chunk_fn fn, void *ctx);

int vm_pool_threads(void);

/* A thread runs kernel work only while it holds one of KILN_THREADS kernel
   tokens: vm_pool_enter waits for one (callers in arrival order, ahead of
   idle workers), vm_pool_leave gives it back.  Calls nest (only the
   outermost pair takes and returns the token).  tr_run holds one for a whole
   flush; vm_parallel_* take one when called outside.  Never wait for another
   thread between the two calls. */
void vm_pool_enter(void);
void vm_pool_leave(void);

#endif
