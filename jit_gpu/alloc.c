/* alloc.c — the caching device allocator (alloc.h): size classes, one free
 * list per class, the streams each block may still be touched by, and a
 * logical clock that orders frees against stream waits.  All device work
 * happens in the injected raw allocator; nothing here knows about CUDA.
 * One mutex guards everything. */
#include "alloc.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vm/state.h"

/* uthash must not exit the process when a table cannot grow: an add that
   fails sets the caller's `hash_oom` (every HASH_ADD site declares it) */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = true)
#include <uthash.h>

/* classes: 512, then 8 per power of two up to GPU_ALLOC_MAX_BYTES */
#define CLASS_STEPS 8
#define CLASS_MIN_LOG2 9 /* 512 */
#define CLASS_MAX_LOG2 48
#define NCLASS (1 + CLASS_STEPS * (CLASS_MAX_LOG2 - CLASS_MIN_LOG2))

/* streams a block remembers individually; a block touched by more waits
   for a whole-device sync instead */
#define BLOCK_STREAMS 4

typedef struct block {
  void *addr;
  size_t size;      /* its class's size: what raw_alloc gave */
  size_t requested; /* what the caller asked for, while live */
  int cls;
  bool live;
  bool many_streams; /* touched by more than BLOCK_STREAMS streams */
  int nstreams;
  uintptr_t streams[BLOCK_STREAMS];
  uint64_t freed_at;  /* the clock when it was freed */
  struct block *next; /* in its class's free list, while cached */
  UT_hash_handle hh;  /* in gpu_alloc.blocks, by addr */
} block;

typedef struct stream_rec {
  uintptr_t id;
  uint64_t synced_at; /* work enqueued before this clock value has finished */
  UT_hash_handle hh;
} stream_rec;

struct gpu_alloc {
  gpu_raw_ops ops;
  pthread_mutex_t lock;
  uint64_t clock;         /* advanced by every free and every stamp */
  uint64_t all_synced_at; /* the last whole-device wait's stamp */
  block *blocks;          /* every block, live or cached, by address */
  block *free_list[NCLASS];
  stream_rec *streams;
  gpu_alloc_stats stats;
};

/* ---- size classes ---- */

static int class_of(size_t bytes, size_t *size) {
  if (bytes > GPU_ALLOC_MAX_BYTES) return -1;
  if (bytes <= GPU_ALLOC_MIN_BLOCK) {
    *size = GPU_ALLOC_MIN_BLOCK;
    return 0;
  }
  /* bytes in (2^k, 2^(k+1)]: steps of 2^(k-3) */
  int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1));
  size_t step = (size_t)1 << (k - 3);
  size_t steps = (bytes + step - 1) / step; /* 9..16 */
  *size = steps * step;
  return 1 + (k - CLASS_MIN_LOG2) * CLASS_STEPS + (int)(steps - CLASS_STEPS - 1);
}

size_t gpu_alloc_class_size(size_t bytes) {
  size_t size = 0;
  return class_of(bytes, &size) < 0 ? 0 : size;
}

/* "1.50 GiB" */
static const char *human(char *buf, size_t cap, size_t bytes) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
  if (u == 0)
    snprintf(buf, cap, "%zu B", bytes);
  else
    snprintf(buf, cap, "%.2f %s", v, unit[u]);
  return buf;
}

/* ---- streams ---- */

static stream_rec *stream_find(gpu_alloc *a, uintptr_t id) {
  stream_rec *r = NULL;
  HASH_FIND(hh, a->streams, &id, sizeof id, r);
  return r;
}

/* A stream seen for the first time has nothing enqueued from before now:
   a block that remembers an earlier stream of the same id (retired, so
   finished) must not wait for this one longer than since now. */
static bool stream_note(gpu_alloc *a, uintptr_t id) {
  if (!id || id == GPU_ALLOC_ALL_STREAMS || stream_find(a, id)) return true;
  stream_rec *r = calloc(1, sizeof *r);
  bool hash_oom = false;
  if (r) {
    r->id = id;
    r->synced_at = ++a->clock;
    HASH_ADD(hh, a->streams, id, sizeof r->id, r);
  }
  if (!r || hash_oom) {
    free(r);
    return false;
  }
  return true;
}

/* whether all work stream id had enqueued at clock t has finished */
static bool stream_done_after(gpu_alloc *a, uintptr_t id, uint64_t t) {
  if (a->all_synced_at > t) return true;
  stream_rec *r = stream_find(a, id);
  return !r || r->synced_at > t; /* no record: retired, so finished */
}

/* ---- blocks ---- */

/* known: stream_note succeeded (an unknown stream would count as finished,
   so a block touched by one waits for a whole-device sync instead) */
static void block_remember(block *b, uintptr_t stream, bool known) {
  if (!stream || b->many_streams) return;
  if (!known) {
    b->many_streams = true;
    return;
  }
  for (int i = 0; i < b->nstreams; i++)
    if (b->streams[i] == stream) return;
  if (b->nstreams == BLOCK_STREAMS)
    b->many_streams = true;
  else
    b->streams[b->nstreams++] = stream;
}

/* whether stream s may take cached block b now (alloc.h: the reuse rule) */
static bool block_usable(gpu_alloc *a, const block *b, uintptr_t s) {
  if (b->many_streams) return a->all_synced_at > b->freed_at;
  for (int i = 0; i < b->nstreams; i++)
    if (b->streams[i] != s && !stream_done_after(a, b->streams[i], b->freed_at)) return false;
  return true;
}

static block *block_find(gpu_alloc *a, void *addr) {
  block *b = NULL;
  HASH_FIND(hh, a->blocks, &addr, sizeof addr, b);
  return b;
}

/* takes the first block of class cls that stream s may use (newest first) */
static block *take_cached(gpu_alloc *a, int cls, uintptr_t s) {
  for (block **link = &a->free_list[cls]; *link; link = &(*link)->next) {
    block *b = *link;
    if (!block_usable(a, b, s)) continue;
    *link = b->next;
    b->next = NULL;
    a->stats.cached -= b->size;
    a->stats.hits++;
    return b;
  }
  return NULL;
}

static void release_block(gpu_alloc *a, block *b) {
  HASH_DELETE(hh, a->blocks, b);
  a->ops.raw_free(a->ops.ctx, b->addr);
  a->stats.raw_frees++;
  free(b);
}

/* every cached block back to raw_free; the caller has waited for the device */
static size_t release_cached(gpu_alloc *a) {
  size_t freed = 0;
  for (int c = 0; c < NCLASS; c++) {
    while (a->free_list[c]) {
      block *b = a->free_list[c];
      a->free_list[c] = b->next;
      freed += b->size;
      release_block(a, b);
    }
  }
  a->stats.cached = 0;
  return freed;
}

/* waits for the whole device; afterwards every cached block is usable */
static bool sync_device(gpu_alloc *a) {
  uint64_t stamp = ++a->clock;
  if (a->ops.sync_all && !a->ops.sync_all(a->ops.ctx)) return false;
  if (stamp > a->all_synced_at) a->all_synced_at = stamp;
  return true;
}

/* a new block from raw_alloc (retrying after freeing the cache on OOM) */
static block *fresh_block(gpu_alloc *a, int cls, size_t size, size_t bytes, uintptr_t s) {
  void *addr = NULL;
  int rc = a->ops.raw_alloc(a->ops.ctx, size, &addr);
  if (rc == GPU_RAW_OOM) {
    if (!sync_device(a)) return NULL;
    block *b = take_cached(a, cls, s);
    if (b) return b;
    size_t freed = release_cached(a);
    a->stats.oom_retries++;
    rc = a->ops.raw_alloc(a->ops.ctx, size, &addr);
    if (rc == GPU_RAW_OOM) {
      char want[32], used[32], gone[32];
      vm_error(
          KILN_ERR_OOM,
          "out of GPU memory allocating %zu bytes (%s; %s in use, 0 B cached after freeing %s of "
          "cache and retrying)",
          bytes, human(want, sizeof want, size), human(used, sizeof used, a->stats.in_use),
          human(gone, sizeof gone, freed));
      return NULL;
    }
  }
  if (rc != GPU_RAW_OK) return NULL; /* raw_alloc said why */
  a->stats.raw_allocs++;
  block *b = calloc(1, sizeof *b);
  bool hash_oom = false;
  if (b) {
    b->addr = addr;
    b->size = size;
    b->cls = cls;
    HASH_ADD(hh, a->blocks, addr, sizeof b->addr, b);
  }
  if (!b || hash_oom) {
    free(b);
    a->ops.raw_free(a->ops.ctx, addr);
    a->stats.raw_frees++;
    vm_error(KILN_ERR_OOM, "out of host memory tracking a GPU allocation of %zu bytes", bytes);
    return NULL;
  }
  return b;
}

/* ---- the API ---- */

gpu_alloc *gpu_alloc_new(const gpu_raw_ops *ops) {
  gpu_alloc *a = calloc(1, sizeof *a);
  if (!a) {
    vm_error(KILN_ERR_OOM, "out of host memory creating the GPU allocator");
    return NULL;
  }
  a->ops = *ops;
  pthread_mutex_init(&a->lock, NULL);
  return a;
}

void gpu_alloc_destroy(gpu_alloc *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  (void)sync_device(a);
  for (int c = 0; c < NCLASS; c++) a->free_list[c] = NULL;
  block *b, *tmp;
  HASH_ITER(hh, a->blocks, b, tmp) release_block(a, b);
  stream_rec *r, *rtmp;
  HASH_ITER(hh, a->streams, r, rtmp) {
    HASH_DELETE(hh, a->streams, r);
    free(r);
  }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

bool gpu_alloc_get(gpu_alloc *a, size_t bytes, uintptr_t stream, void **addr) {
  *addr = NULL;
  size_t size;
  int cls = class_of(bytes, &size);
  if (cls < 0) {
    vm_error(KILN_ERR_OOM, "out of GPU memory allocating %zu bytes (more than any device has)",
             bytes);
    return false;
  }
  pthread_mutex_lock(&a->lock);
  bool known = stream_note(a, stream);
  block *b = take_cached(a, cls, stream);
  if (!b) b = fresh_block(a, cls, size, bytes, stream);
  if (b) {
    b->live = true;
    b->requested = bytes;
    b->many_streams = false;
    b->nstreams = 0;
    block_remember(b, stream, known);
    a->stats.in_use += b->size;
    a->stats.requested += bytes;
    if (a->stats.in_use > a->stats.peak_in_use) a->stats.peak_in_use = a->stats.in_use;
    *addr = b->addr;
  }
  pthread_mutex_unlock(&a->lock);
  return b != NULL;
}

void gpu_alloc_put(gpu_alloc *a, void *addr, uintptr_t stream) {
  if (!addr) return;
  pthread_mutex_lock(&a->lock);
  block *b = block_find(a, addr);
  assert(b && b->live && "gpu_alloc_put: not a live block");
  if (b && b->live) {
    block_remember(b, stream, stream_note(a, stream));
    b->live = false;
    b->freed_at = ++a->clock;
    b->next = a->free_list[b->cls];
    a->free_list[b->cls] = b;
    a->stats.in_use -= b->size;
    a->stats.requested -= b->requested;
    a->stats.cached += b->size;
  }
  pthread_mutex_unlock(&a->lock);
}

void gpu_alloc_record_use(gpu_alloc *a, void *addr, uintptr_t stream) {
  if (!addr || !stream) return;
  pthread_mutex_lock(&a->lock);
  block *b = block_find(a, addr);
  if (b && b->live) block_remember(b, stream, stream_note(a, stream));
  pthread_mutex_unlock(&a->lock);
}

uint64_t gpu_alloc_stamp(gpu_alloc *a) {
  pthread_mutex_lock(&a->lock);
  uint64_t t = ++a->clock;
  pthread_mutex_unlock(&a->lock);
  return t;
}

void gpu_alloc_synced(gpu_alloc *a, uintptr_t stream, uint64_t stamp) {
  pthread_mutex_lock(&a->lock);
  if (stream == GPU_ALLOC_ALL_STREAMS) {
    if (stamp > a->all_synced_at) a->all_synced_at = stamp;
  } else {
    stream_rec *r = stream_find(a, stream);
    if (r && stamp > r->synced_at) r->synced_at = stamp;
  }
  pthread_mutex_unlock(&a->lock);
}

void gpu_alloc_stream_retired(gpu_alloc *a, uintptr_t stream) {
  pthread_mutex_lock(&a->lock);
  stream_rec *r = stream_find(a, stream);
  if (r) {
    HASH_DELETE(hh, a->streams, r);
    free(r);
  }
  pthread_mutex_unlock(&a->lock);
}

bool gpu_alloc_trim(gpu_alloc *a) {
  pthread_mutex_lock(&a->lock);
  bool ok = sync_device(a);
  if (ok) release_cached(a);
  pthread_mutex_unlock(&a->lock);
  return ok;
}

void gpu_alloc_get_stats(gpu_alloc *a, gpu_alloc_stats *s) {
  pthread_mutex_lock(&a->lock);
  *s = a->stats;
  pthread_mutex_unlock(&a->lock);
}
