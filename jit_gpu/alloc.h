/* alloc.h — the caching device allocator (DESIGN §6), written against an
 * injected raw allocator so it runs (and is tested) without a GPU.  It owns
 * size classes, the cache of freed blocks, the stream-ordered reuse rule,
 * out-of-memory recovery and the counters; jit_gpu/cuda.c plugs in
 * cuMemAlloc/cuMemFree/cuCtxSynchronize and its per-thread streams.
 *
 * Size classes.  A request is rounded up to its class: 512 bytes at least,
 * above that 8 classes per power of two (2^k * (1 + j/8)), so at most 12.5%
 * is wasted.  Every block is one raw allocation of its class's size (no
 * splitting, no merging) and is reused only for requests of that class.
 *
 * Streams and reuse.  Streams are opaque nonzero ids (a CUstream; 0 means
 * "no stream": a thread that never enqueued work).  Device work is ordered
 * within a stream, not across streams, so a block remembers every stream
 * that may still have work touching it: the stream it was allocated on,
 * streams that used it (gpu_alloc_record_use) and the stream that freed it.
 * A freed block is taken again by stream S
 *   - at once when every stream it remembers is S (stream order makes the
 *     new work run after the old), and
 *   - otherwise only once every remembered stream other than S has passed
 *     a sync point after the free: the caller takes a stamp
 *     (gpu_alloc_stamp) before it waits for a stream and reports
 *     gpu_alloc_synced(stream, stamp) after the wait returns; the stamp
 *     orders the wait after the free.  A whole-device wait is reported
 *     with stream GPU_ALLOC_ALL_STREAMS.
 * A retired stream (gpu_alloc_stream_retired, after its last wait) is
 * forgotten: it has no work left, so it never holds a block back.
 *
 * Out of memory.  When the raw allocator says OOM, the allocator waits for
 * the whole device (sync_all), takes a cached block of the class if one is
 * now free, else returns every cached block to the raw allocator and tries
 * once more; then it fails with KILN_ERR_OOM "out of GPU memory allocating
 * N bytes (M in use, C cached ...)".
 *
 * Thread-safe (one mutex).  Errors go through vm_error. */
#ifndef GPU_ALLOC_H
#define GPU_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* what raw_alloc returns */
enum {
  GPU_RAW_OK = 0,
  GPU_RAW_OOM = 1,   /* no memory: the allocator frees its cache and retries */
  GPU_RAW_ERROR = 2, /* anything else: raw_alloc has set the error (vm_error) */
};

typedef struct gpu_raw_ops {
  void *ctx;
  int (*raw_alloc)(void *ctx, size_t bytes, void **addr);
  void (*raw_free)(void *ctx, void *addr);
  /* waits until the device has no work left (every stream), before cached
     blocks go back to raw_free; NULL: nothing to wait for.  false + error
     set when the wait failed. */
  bool (*sync_all)(void *ctx);
} gpu_raw_ops;

typedef struct gpu_alloc gpu_alloc;

typedef struct gpu_alloc_stats {
  size_t in_use; /* bytes of live blocks (class sizes) */
  size_t cached; /* bytes of freed blocks kept for reuse */
  size_t peak_in_use;
  size_t requested; /* bytes callers asked for, of live blocks */
  uint64_t raw_allocs, raw_frees;
  uint64_t hits;        /* allocations served from the cache */
  uint64_t oom_retries; /* times the cache was freed to retry an allocation */
} gpu_alloc_stats;

#define GPU_ALLOC_MIN_BLOCK 512
#define GPU_ALLOC_MAX_BYTES ((size_t)1 << 48) /* larger requests fail at once */
#define GPU_ALLOC_ALL_STREAMS ((uintptr_t)-1)

/* the class size a request of `bytes` gets; 0 when it exceeds GPU_ALLOC_MAX_BYTES */
size_t gpu_alloc_class_size(size_t bytes);

/* NULL + error on host OOM */
gpu_alloc *gpu_alloc_new(const gpu_raw_ops *ops);
/* returns every block, cached or live, to raw_free (after sync_all) */
void gpu_alloc_destroy(gpu_alloc *a);

/* A block of at least `bytes` (0 allowed: a minimal block) for work on
   `stream`; false + error (KILN_ERR_OOM, or raw_alloc's) otherwise. */
bool gpu_alloc_get(gpu_alloc *a, size_t bytes, uintptr_t stream, void **addr);
/* Frees a block from gpu_alloc_get; `stream` is the freeing thread's (0 if
   it has none).  An address the allocator does not know is ignored
   (asserted in debug builds). */
void gpu_alloc_put(gpu_alloc *a, void *addr, uintptr_t stream);
/* stream may touch the live block at addr (work on a stream other than the
   one it was allocated on): its free waits for that stream too */
void gpu_alloc_record_use(gpu_alloc *a, void *addr, uintptr_t stream);

/* a point in the allocator's order of events: take it before waiting */
uint64_t gpu_alloc_stamp(gpu_alloc *a);
/* all work enqueued on stream (GPU_ALLOC_ALL_STREAMS: on every stream)
   before `stamp` was taken has finished */
void gpu_alloc_synced(gpu_alloc *a, uintptr_t stream, uint64_t stamp);
/* the stream is gone (after its last wait) */
void gpu_alloc_stream_retired(gpu_alloc *a, uintptr_t stream);

/* Returns every cached block to raw_free (after sync_all); false + error
   when the wait failed (nothing is freed then). */
bool gpu_alloc_trim(gpu_alloc *a);
void gpu_alloc_get_stats(gpu_alloc *a, gpu_alloc_stats *s);

#endif
