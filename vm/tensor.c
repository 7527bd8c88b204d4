/* tensor.c — storage allocation, tensor headers, reference counting.
 * Handles (tensors with a trace node) are made by the front-end and trace/;
 * here they are only counted and, at their last release, handed back to
 * trace/ through the destructor it registers. */
#include "tensor.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "backend.h"
#include "ops.h"
#include "state.h"

bool vm_shape_numel(int ndim, const int64_t *shape, int64_t *numel) {
  int64_t nonzero = 1;
  bool empty = false;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0)
      empty = true;
    else if (shape[d] < 0 || __builtin_mul_overflow(nonzero, shape[d], &nonzero) ||
             nonzero > VM_MAX_NUMEL)
      return false;
  }
  *numel = empty ? 0 : nonzero;
  return true;
}

bool vm_check_shape(int ndim, const int64_t *shape, int64_t *numel_out) {
  char buf[VM_SHAPE_BUF];
  if (ndim < 0 || ndim > KILN_MAX_DIMS) {
    vm_error(KILN_ERR_SHAPE, "ndim %d is out of range [0, %d]", ndim, KILN_MAX_DIMS);
    return false;
  }
  if (ndim > 0 && !shape) {
    vm_error(KILN_ERR_ARG, "shape is NULL for ndim %d", ndim);
    return false;
  }
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0) {
      vm_error(KILN_ERR_SHAPE, "negative size %lld in shape %s", (long long)shape[d],
               vm_shape_str(buf, ndim, shape));
      return false;
    }
  if (!vm_shape_numel(ndim, shape, numel_out)) {
    vm_error(KILN_ERR_SHAPE, "shape %s is too large (its nonzero sizes multiply past 2^60)",
             vm_shape_str(buf, ndim, shape));
    return false;
  }
  return true;
}

void vm_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d] ? shape[d] : 1;
  }
}

bool vm_scan_strides(const vm_tensor *v, int axis, int nd, const int64_t *shape, int64_t *strides,
                     int64_t *gstride, int64_t *extent) {
  if (axis < 0 || axis >= v->ndim || (v->ndim != nd && v->ndim != nd + 1)) return false;
  bool kept = v->ndim == nd;
  for (int d = 0, e = 0; d < v->ndim; d++) {
    if (d == axis) {
      if (kept) strides[e++] = 0;
      continue;
    }
    if (v->shape[d] != shape[e]) return false;
    strides[e] = shape[e] == 1 ? 0 : v->strides[d];
    e++;
  }
  *gstride = v->strides[axis];
  *extent = v->shape[axis];
  return *extent >= 1;
}

int vm_coalesce(int nd, const int64_t *shape, int nops, const int64_t (*in)[KILN_MAX_DIMS],
                int64_t *shape_out, int64_t (*out)[KILN_MAX_DIMS]) {
  int n = 0;
  int64_t contig[KILN_MAX_DIMS], co[KILN_MAX_DIMS];
  vm_contiguous_strides(nd, shape, contig);
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    bool merge = n > 0 && vm_dims_merge(co[n - 1], contig[d], shape[d]);
    for (int q = 0; merge && q < nops; q++)
      merge = vm_dims_merge(out[q][n - 1], in[q][d], shape[d]);
    if (merge) {
      shape_out[n - 1] *= shape[d];
      co[n - 1] = contig[d];
      for (int q = 0; q < nops; q++) out[q][n - 1] = in[q][d];
      continue;
    }
    shape_out[n] = shape[d];
    co[n] = contig[d];
    for (int q = 0; q < nops; q++) out[q][n] = in[q][d];
    n++;
  }
  if (n == 0) {
    shape_out[0] = 1;
    for (int q = 0; q < nops; q++) out[q][0] = 0;
    n = 1;
  }
  return n;
}

static vm_tensor *header_new(kiln_dtype dt, int ndim, const int64_t *shape, int64_t numel) {
  vm_tensor *t = vm_block_alloc(VM_BLOCK_TENSOR, sizeof *t);
  if (!t) {
    vm_error(KILN_ERR_OOM, "out of memory for a tensor header");
    return NULL;
  }
  atomic_init(&t->refs, 1);
  t->dtype = dt;
  t->ndim = ndim;
  t->numel = numel;
  t->device = KILN_CPU;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  return t;
}

/* Large buffers are cached when freed and handed out again: a fresh
   mapping costs a page fault per page on first touch, which made an eager
   add over 64 MiB 30% slower than the memory bandwidth allows.  A request
   takes the smallest cached block that fits and is at most 25% larger.
   The cache holds KILN_BUFFER_CACHE_MB, by default an eighth of the
   machine's memory and at most 4 GiB, and never more than the most the
   storages have held at once, oldest out first: a training step frees
   what it allocated, and the next step should find it all again.
   A conv2d step (W14) re-touches ~230 MiB of im2col buffers (with a
   256 MiB cache a fifth of its time went to page faults); a BERT
   fine-tuning step (W18, batch 32 x 128) frees some 1.4 GB, and a 1 GiB
   cache refaulted 80 MB of it every step (5% of the step). */
#define VM_CACHE_MIN_BYTES ((size_t)1 << 20)
#define VM_CACHE_SLOTS 256
#define VM_CACHE_MAX_MB 4096L

static size_t cache_bytes;
static pthread_once_t cache_bytes_once = PTHREAD_ONCE_INIT;

static void cache_bytes_init(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  long mb = VM_CACHE_MAX_MB;
  if (pages > 0 && page > 0 && pages / 8 / (1048576 / page) < mb) mb = pages / 8 / (1048576 / page);
  mb = vm_env_long("KILN_BUFFER_CACHE_MB", mb);
  cache_bytes = mb > 0 ? (size_t)mb << 20 : 0;
}

static struct {
  pthread_mutex_t lock;
  void *data[VM_CACHE_SLOTS];
  size_t bytes[VM_CACHE_SLOTS];
  int n;
  size_t total;
} block_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t block_size(size_t nbytes) {
  if (nbytes < VM_CACHE_MIN_BYTES) return nbytes ? nbytes : 64;
  return (nbytes + 0xFFFF) & ~(size_t)0xFFFF;
}

/* the machine's RAM plus swap in bytes (0: unknown, no limit) */
static size_t memory_total;
static pthread_once_t memory_total_once = PTHREAD_ONCE_INIT;
static void memory_total_init(void) {
  struct sysinfo si;
  if (sysinfo(&si) == 0)
    memory_total = (size_t)((unsigned long long)si.totalram * si.mem_unit +
                            (unsigned long long)si.totalswap * si.mem_unit);
}

size_t vm_memory_total(void) {
  pthread_once(&memory_total_once, memory_total_init);
  return memory_total;
}

/* a block of at least bytes; *have: its size (a cached block may be up to
   a quarter larger, and is cached again at its own size when freed) */
static void *block_alloc(size_t bytes, size_t *have_out) {
  if (bytes > VM_MID_MIN && bytes <= VM_MID_MAX) {
    void *p = vm_mid_alloc(bytes, have_out);
    if (p) return p;
  }
  *have_out = bytes;
  if (bytes >= VM_CACHE_MIN_BYTES) {
    pthread_mutex_lock(&block_cache.lock);
    int best = -1; /* the smallest block that fits, at most 25% larger */
    for (int i = 0; i < block_cache.n; i++) {
      size_t have = block_cache.bytes[i];
      if (have >= bytes && have <= bytes + bytes / 4 &&
          (best < 0 || have < block_cache.bytes[best]))
        best = i;
    }
    if (best >= 0) {
      void *p = block_cache.data[best];
      *have_out = block_cache.bytes[best];
      block_cache.total -= block_cache.bytes[best];
      block_cache.n--;
      memmove(block_cache.data + best, block_cache.data + best + 1,
              (size_t)(block_cache.n - best) * sizeof(void *));
      memmove(block_cache.bytes + best, block_cache.bytes + best + 1,
              (size_t)(block_cache.n - best) * sizeof(size_t));
      pthread_mutex_unlock(&block_cache.lock);
      return p;
    }
    pthread_mutex_unlock(&block_cache.lock);
  }
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes) == 0) return p;
  /* out of memory: give the cached blocks back and try once more */
  pthread_mutex_lock(&block_cache.lock);
  bool had = block_cache.n > 0;
  for (int i = 0; i < block_cache.n; i++) free(block_cache.data[i]);
  block_cache.n = 0, block_cache.total = 0;
  pthread_mutex_unlock(&block_cache.lock);
  return had && posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

/* the most bytes storages have held at once (live_peak_note): the cache
   never holds more, since a step like the last finds all it needs in that
   much, and more would only be blocks of sizes no longer asked for (a
   model over ever new shapes) */
static atomic_size_t live_peak;

static void live_peak_note(size_t live) {
  size_t peak = atomic_load_explicit(&live_peak, memory_order_relaxed);
  while (live > peak && !atomic_compare_exchange_weak_explicit(
                            &live_peak, &peak, live, memory_order_relaxed, memory_order_relaxed)) {
  }
}

static void block_free(void *p, size_t bytes) {
  if (bytes > VM_MID_MIN && bytes <= VM_MID_MAX) {
    vm_mid_free(p, bytes);
    return;
  }
  pthread_once(&cache_bytes_once, cache_bytes_init);
  size_t peak = atomic_load_explicit(&live_peak, memory_order_relaxed);
  const size_t limit = cache_bytes < peak ? cache_bytes : peak;
  if (bytes >= VM_CACHE_MIN_BYTES && bytes <= limit) {
    pthread_mutex_lock(&block_cache.lock);
    while (block_cache.n > 0 &&
           (block_cache.n == VM_CACHE_SLOTS || block_cache.total + bytes > limit)) {
      block_cache.total -= block_cache.bytes[0]; /* evict the oldest */
      free(block_cache.data[0]);
      block_cache.n--;
      memmove(block_cache.data, block_cache.data + 1, (size_t)block_cache.n * sizeof(void *));
      memmove(block_cache.bytes, block_cache.bytes + 1, (size_t)block_cache.n * sizeof(size_t));
    }
    block_cache.data[block_cache.n] = p;
    block_cache.bytes[block_cache.n++] = bytes;
    block_cache.total += bytes;
    pthread_mutex_unlock(&block_cache.lock);
    return;
  }
  free(p);
}

/* small buffers live in the same allocation as their storage header */
#define VM_INLINE_BYTES 1024
#define VM_HEADER_BYTES 64

/* bytes held by live storages (headers included; not the freed-block cache):
   kiln_memory_in_use(), which lets a garbage-collected host (Ruby) see the
   memory its tensor handles keep alive */
static atomic_size_t live_bytes;

static size_t storage_bytes(const vm_storage *s) {
  return s->inline_data ? VM_HEADER_BYTES + (s->nbytes ? s->nbytes : 64) : sizeof *s + s->nbytes;
}

size_t vm_memory_in_use(void) { return atomic_load_explicit(&live_bytes, memory_order_relaxed); }

/* inline storages come in two block sizes, cached per thread (glibc's
   posix_memalign took some 2 us per small output when the heap was busy) */
#define VM_INLINE_SMALL 64
static int inline_kind(size_t nbytes) {
  return nbytes <= VM_INLINE_SMALL ? VM_BLOCK_STORAGE_S : VM_BLOCK_STORAGE_L;
}

static vm_storage *storage_new(size_t nbytes) {
  if (nbytes <= VM_INLINE_BYTES) {
    int kind = inline_kind(nbytes);
    void *block = vm_block_alloc_aligned(
        kind, VM_HEADER_BYTES + (kind == VM_BLOCK_STORAGE_S ? VM_INLINE_SMALL : VM_INLINE_BYTES));
    if (!block) {
      vm_error(KILN_ERR_OOM, "out of memory allocating %zu bytes", nbytes);
      return NULL;
    }
    vm_storage *s = block;
    atomic_init(&s->refs, 1);
    s->data = (char *)block + VM_HEADER_BYTES;
    s->nbytes = nbytes;
    s->inline_data = true;
    s->device = KILN_CPU;
    atomic_fetch_add_explicit(&live_bytes, storage_bytes(s), memory_order_relaxed);
    return s;
  }
  /* more than the machine's memory and swap together can never be held:
     an error now, not minutes of paging where the kernel overcommits (a
     lent GPU machine let 4 TiB of zeros be "allocated", then read them) */
  pthread_once(&memory_total_once, memory_total_init);
  if (memory_total && nbytes > memory_total) {
    vm_error(KILN_ERR_OOM,
             "out of memory allocating %zu bytes (more than this machine's %zu of RAM and swap)",
             nbytes, memory_total);
    return NULL;
  }
  vm_storage *s = malloc(sizeof *s);
  size_t bytes;
  void *data = s ? block_alloc(block_size(nbytes), &bytes) : NULL;
  if (!data) {
    free(s);
    vm_error(KILN_ERR_OOM, "out of memory allocating %zu bytes", nbytes);
    return NULL;
  }
  atomic_init(&s->refs, 1);
  s->data = data;
  s->nbytes = bytes;
  s->inline_data = false;
  s->device = KILN_CPU;
  size_t b = storage_bytes(s);
  live_peak_note(atomic_fetch_add_explicit(&live_bytes, b, memory_order_relaxed) + b);
  return s;
}

static void storage_release(vm_storage *s) {
  if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
    atomic_fetch_sub_explicit(&live_bytes, storage_bytes(s), memory_order_relaxed);
    if (s->device != KILN_CPU)
      vm_backend_of(s->device)->free(s->data, s->nbytes);
    else if (!s->inline_data)
      block_free(s->data, s->nbytes);
    if (s->inline_data)
      vm_block_free(inline_kind(s->nbytes), s);
    else
      free(s);
  }
}

vm_tensor *vm_tensor_new(kiln_dtype dt, int ndim, const int64_t *shape) {
  int64_t numel;
  if (!vm_check_shape(ndim, shape, &numel)) return NULL;
  vm_tensor *t = header_new(dt, ndim, shape, numel);
  if (!t) return NULL;
  vm_contiguous_strides(ndim, shape, t->strides);
  t->storage = storage_new((size_t)numel * vm_dtype_size(dt));
  if (!t->storage) {
    vm_block_free(VM_BLOCK_TENSOR, t);
    return NULL;
  }
  return t;
}

/* device storage: a header here, the data the backend's */
static vm_storage *device_storage_new(const vm_backend *b, size_t nbytes) {
  vm_storage *s = malloc(sizeof *s);
  void *data = s ? b->alloc(nbytes ? nbytes : 1) : NULL;
  if (!data) {
    if (!s) vm_error(KILN_ERR_OOM, "out of memory allocating a storage header");
    free(s);
    return NULL;
  }
  atomic_init(&s->refs, 1);
  s->data = data;
  s->nbytes = nbytes ? nbytes : 1;
  s->inline_data = false;
  s->device = b->device;
  atomic_fetch_add_explicit(&live_bytes, storage_bytes(s), memory_order_relaxed);
  return s;
}

vm_tensor *vm_tensor_new_on(kiln_device d, kiln_dtype dt, int ndim, const int64_t *shape) {
  if (d == KILN_CPU) return vm_tensor_new(dt, ndim, shape);
  const vm_backend *b = vm_backend_usable(d);
  int64_t numel;
  if (!b || !vm_check_shape(ndim, shape, &numel)) return NULL;
  vm_tensor *t = header_new(dt, ndim, shape, numel);
  if (!t) return NULL;
  vm_contiguous_strides(ndim, shape, t->strides);
  t->device = (uint8_t)d;
  t->storage = device_storage_new(b, (size_t)numel * vm_dtype_size(dt));
  if (!t->storage) {
    vm_block_free(VM_BLOCK_TENSOR, t);
    return NULL;
  }
  return t;
}

/* the byte span [lo, hi) of storage a view reads, relative to element 0 */
static void view_span(const vm_tensor *v, int64_t *lo, int64_t *hi) {
  int64_t first = 0, last = 0;
  for (int d = 0; d < v->ndim; d++) {
    int64_t reach = (v->shape[d] - 1) * v->strides[d];
    if (reach < 0)
      first += reach;
    else
      last += reach;
  }
  int64_t es = (int64_t)vm_dtype_size(v->dtype);
  *lo = (v->offset + first) * es;
  *hi = (v->offset + last + 1) * es;
}

/* Copies the span of storage v views between devices, keeping v's
   geometry: a strided view moves the bytes between its first and last
   element, and the copy views them as v did. */
static vm_tensor *value_moved(vm_tensor *v, kiln_device to) {
  if (v->numel == 0) return vm_tensor_new_on(to, v->dtype, v->ndim, v->shape);
  int64_t lo, hi;
  view_span(v, &lo, &hi);
  int64_t es = (int64_t)vm_dtype_size(v->dtype), n = (hi - lo) / es;
  vm_tensor *flat = vm_tensor_new_on(to, v->dtype, 1, &n);
  if (!flat) return NULL;
  const char *src = (const char *)v->storage->data + lo;
  kiln_device from = (kiln_device)v->storage->device;
  bool ok = from == KILN_CPU
                ? vm_backend_of(to)->from_host(flat->storage->data, src, (size_t)(hi - lo))
                : vm_backend_of(from)->to_host(flat->storage->data, src, (size_t)(hi - lo));
  vm_tensor *out =
      ok ? vm_tensor_view(flat, v->ndim, v->shape, v->strides, v->offset - lo / es) : NULL;
  vm_release(flat);
  return out;
}

vm_tensor *vm_value_on_host(vm_tensor *v) { return vm_value_to_device(v, KILN_CPU); }

vm_tensor *vm_value_to_device(vm_tensor *v, kiln_device d) {
  if (v->storage->device == d) return vm_retain(v);
  if (v->storage->device != KILN_CPU && d != KILN_CPU) { /* through the host */
    vm_tensor *h = value_moved(v, KILN_CPU);
    vm_tensor *out = h ? value_moved(h, d) : NULL;
    vm_release(h);
    return out;
  }
  if (d != KILN_CPU && !vm_backend_usable(d)) return NULL;
  return value_moved(v, d);
}

vm_tensor *vm_tensor_view(const vm_tensor *base, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset) {
  int64_t numel = 0;
  bool fits = vm_shape_numel(ndim, shape, &numel);
  assert(fits); /* views have the shape of a checked op result */
  (void)fits;
  vm_tensor *t = header_new(base->dtype, ndim, shape, numel);
  if (!t) return NULL;
  if (ndim) memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
  t->offset = offset;
  t->device = base->device;
  t->storage = base->storage;
  atomic_fetch_add_explicit(&t->storage->refs, 1, memory_order_relaxed);
  return t;
}

vm_tensor *vm_retain(vm_tensor *t) {
  if (t) atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  return t;
}

/* the trace layer's handle destructor (vm_set_handle_free): vm/ is the
   floor and never calls up; a handle with a node was made by trace/,
   which registered this before it made one */
static void (*handle_free)(vm_tensor *t);

void vm_set_handle_free(void (*fn)(vm_tensor *t)) { handle_free = fn; }

void vm_release(vm_tensor *t) {
  if (t && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1) {
    if (t->node) handle_free(t); /* also drops t->slot */
    storage_release(t->storage);
    t->ndim = VM_RELEASED; /* until the block is used again: vm_released */
    vm_block_free(VM_BLOCK_TENSOR, t);
  }
}

bool vm_is_contiguous(const vm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != s) return false;
    s *= t->shape[d];
  }
  return true;
}

vm_tensor *vm_value_copy(vm_tensor *v) {
  vm_meta m = {
      .dtype = v->dtype, .compute = v->dtype, .device = v->storage->device, .ndim = v->ndim};
  memcpy(m.shape, v->shape, sizeof m.shape);
  return vm_backend_of((kiln_device)m.device)->exec(VM_OP_copy, 1, &v, NULL, &m);
}

vm_tensor *vm_value_host_contiguous(vm_tensor *v) {
  vm_tensor *h = vm_value_on_host(v);
  vm_tensor *c = h ? vm_value_contiguous(h) : NULL;
  vm_release(h);
  return c;
}

vm_tensor *vm_value_contiguous(vm_tensor *v) {
  return vm_is_contiguous(v) ? vm_retain(v) : vm_value_copy(v);
}
