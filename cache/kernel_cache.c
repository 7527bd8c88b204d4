/* kernel_cache.c — the kernel cache of both backends (kernel_cache.h):
 * kernel key -> compiled function, with reference counts from the plans
 * that use each kernel, an LRU per device of the kernels no plan uses
 * (bounded by KILN_KERNEL_CACHE_MAX), and the code objects they live in,
 * unloaded through their backend's callback when none of their kernels is
 * cached any more.  One lock; unloads run after it is dropped. */
#include "kernel_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "../vm/state.h"

/* devices the cache keeps apart (kiln_device values) */
#define KCACHE_DEVICES 4
/* KILN_KERNEL_CACHE_MAX: unreferenced kernels kept per device (default 2048) */
#define KCACHE_DEFAULT_IDLE 2048

/* the lookup key of a code object: its device and disk key (hashed as
   bytes: no padding) */
typedef struct {
  uint64_t dev;
  uint64_t batch[2];
} code_key;

struct cache_code {
  void *handle;
  void (*unload)(void *handle);
  int dev;
  long refs; /* the creator's, until released, + one per cached kernel in it */
  bool batched;
  code_key key;
  cache_code *next_doomed; /* in the list unloaded once the lock is dropped */
  UT_hash_handle hh;       /* in kc.codes by key, when batched */
};

/* the lookup key of a kernel: its device and description hash (the full
   description is compared too: a hash collision is never a hit) */
typedef struct {
  uint64_t dev; /* (hashed as bytes: no padding) */
  uint64_t hash[2];
} kernel_key;

struct cache_kernel {
  kernel_key key;
  uint8_t *bytes;
  size_t len;
  void *fn;
  cache_code *code;
  long refs;                 /* plans (and callers) holding it */
  cache_kernel *prev, *next; /* in its device's idle list while refs == 0 */
  UT_hash_handle hh;
};

typedef struct {
  cache_kernel idle; /* sentinel: next = least recently released */
  long nidle, nkernels, ncodes;
  long generation; /* kernels ever cached */
} device_cache;

static struct {
  pthread_mutex_t lock;
  cache_kernel *table;
  cache_code *codes;  /* loaded code objects with a disk key */
  cache_code *doomed; /* unreferenced, to unload once the lock is dropped */
  device_cache dev[KCACHE_DEVICES];
  long max_idle;
  bool ready;
} kc = {.lock = PTHREAD_MUTEX_INITIALIZER};

static vm_counters *stats(void) { return &vm_process()->stats; }

/* with kc.lock held: device d's part, its idle list made on first use */
static device_cache *dev_locked(uint64_t d) {
  if (!kc.ready) {
    for (int i = 0; i < KCACHE_DEVICES; i++)
      kc.dev[i].idle.prev = kc.dev[i].idle.next = &kc.dev[i].idle;
    kc.ready = true;
  }
  return &kc.dev[d];
}

static int dev_index(kiln_device dev) { return (unsigned)dev < KCACHE_DEVICES ? (int)dev : 0; }

/* with kc.lock held: the code objects the last releases doomed, taken
   to unload once the lock is dropped (an unload may wait for the device) */
static cache_code *take_doomed_locked(void) {
  cache_code *c = kc.doomed;
  kc.doomed = NULL;
  return c;
}

static void unload(cache_code *c) {
  while (c) {
    cache_code *next = c->next_doomed;
    if (c->unload) c->unload(c->handle);
    free(c);
    c = next;
  }
}

cache_code *cache_code_new(kiln_device dev, void *handle, void (*unload)(void *handle),
                           const uint64_t *batch) {
  cache_code *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->handle = handle;
  c->unload = unload;
  c->dev = dev_index(dev);
  c->refs = 1;
  pthread_mutex_lock(&kc.lock);
  if (batch) {
    cache_code *twin = NULL;
    code_key key = {.dev = c->dev, .batch = {batch[0], batch[1]}};
    HASH_FIND(hh, kc.codes, &key, sizeof key, twin);
    if (!twin) { /* (a twin: both stay loaded until released; lookups find the first) */
      c->batched = true;
      c->key = key;
      HASH_ADD(hh, kc.codes, key, sizeof c->key, c);
    }
  }
  dev_locked(c->dev)->ncodes++;
  atomic_fetch_add_explicit(&stats()->code_objects, 1, memory_order_relaxed);
  pthread_mutex_unlock(&kc.lock);
  return c;
}

cache_code *cache_code_find(kiln_device dev, const uint64_t batch[2]) {
  cache_code *c = NULL;
  code_key key = {.dev = dev_index(dev), .batch = {batch[0], batch[1]}};
  pthread_mutex_lock(&kc.lock);
  HASH_FIND(hh, kc.codes, &key, sizeof key, c);
  if (c) c->refs++;
  pthread_mutex_unlock(&kc.lock);
  return c;
}

void *cache_code_handle(const cache_code *code) { return code ? code->handle : NULL; }

/* with kc.lock held: drops a reference; the last one dooms the code */
static void code_unref_locked(cache_code *c) {
  if (--c->refs > 0) return;
  if (c->batched) HASH_DELETE(hh, kc.codes, c);
  dev_locked(c->dev)->ncodes--;
  atomic_fetch_sub_explicit(&stats()->code_objects, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&stats()->code_unloads, 1, memory_order_relaxed);
  c->next_doomed = kc.doomed;
  kc.doomed = c;
}

void cache_code_release(cache_code *code) {
  if (!code) return;
  pthread_mutex_lock(&kc.lock);
  code_unref_locked(code);
  cache_code *doomed = take_doomed_locked();
  pthread_mutex_unlock(&kc.lock);
  unload(doomed);
}

static void idle_unlink(device_cache *d, cache_kernel *k) {
  k->prev->next = k->next;
  k->next->prev = k->prev;
  k->prev = k->next = NULL;
  d->nidle--;
}

static void kernel_drop_locked(device_cache *d, cache_kernel *k) {
  HASH_DELETE(hh, kc.table, k);
  d->nkernels--;
  code_unref_locked(k->code);
  free(k->bytes);
  free(k);
}

/* with kc.lock held: evicts d's least recently released kernels past max */
static void trim_locked(device_cache *d, long max) {
  while (d->nidle > max) {
    cache_kernel *old = d->idle.next;
    idle_unlink(d, old);
    kernel_drop_locked(d, old);
  }
}

static cache_kernel *find_locked(const kernel_key *key, const void *bytes, size_t len) {
  cache_kernel *k = NULL;
  HASH_FIND(hh, kc.table, key, sizeof *key, k);
  if (!k || k->len != len || memcmp(k->bytes, bytes, len)) return NULL;
  if (k->refs++ == 0) idle_unlink(dev_locked(k->key.dev), k);
  return k;
}

cache_kernel *cache_kernel_get(kiln_device dev, const uint64_t key[2], const void *bytes,
                               size_t len) {
  kernel_key kk = {.dev = dev_index(dev), .hash = {key[0], key[1]}};
  pthread_mutex_lock(&kc.lock);
  cache_kernel *k = find_locked(&kk, bytes, len);
  pthread_mutex_unlock(&kc.lock);
  return k;
}

cache_kernel *cache_kernel_put(kiln_device dev, const uint64_t key[2], const void *bytes,
                               size_t len, cache_code *code, void *fn) {
  if (!fn || !code) return NULL;
  cache_kernel *k = calloc(1, sizeof *k);
  uint8_t *copy = malloc(len ? len : 1);
  if (!k || !copy) {
    free(k);
    free(copy);
    return NULL;
  }
  memcpy(copy, bytes, len);
  kernel_key kk = {.dev = dev_index(dev), .hash = {key[0], key[1]}};
  pthread_mutex_lock(&kc.lock);
  cache_kernel *have = NULL;
  HASH_FIND(hh, kc.table, &kk, sizeof kk, have);
  if (have) { /* cached meanwhile (or a colliding key, which stays) */
    cache_kernel *hit = find_locked(&kk, bytes, len);
    pthread_mutex_unlock(&kc.lock);
    free(k);
    free(copy);
    return hit;
  }
  k->key = kk;
  k->bytes = copy;
  k->len = len;
  k->fn = fn;
  k->code = code;
  code->refs++;
  k->refs = 1;
  HASH_ADD(hh, kc.table, key, sizeof k->key, k);
  device_cache *d = dev_locked(kk.dev);
  d->nkernels++;
  d->generation++;
  pthread_mutex_unlock(&kc.lock);
  return k;
}

void *cache_kernel_fn(const cache_kernel *k) { return k ? k->fn : NULL; }

void cache_kernel_retain(cache_kernel *k) {
  if (!k) return;
  pthread_mutex_lock(&kc.lock);
  k->refs++; /* held already, so never idle here */
  pthread_mutex_unlock(&kc.lock);
}

void cache_kernel_release(cache_kernel *k) {
  if (!k) return;
  pthread_mutex_lock(&kc.lock);
  if (--k->refs == 0) {
    if (!kc.max_idle) kc.max_idle = vm_env_long("KILN_KERNEL_CACHE_MAX", KCACHE_DEFAULT_IDLE);
    if (kc.max_idle < 0) kc.max_idle = 0;
    device_cache *d = dev_locked(k->key.dev);
    k->prev = d->idle.prev;
    k->next = &d->idle;
    d->idle.prev->next = k;
    d->idle.prev = k;
    d->nidle++;
    trim_locked(d, kc.max_idle);
  }
  cache_code *doomed = take_doomed_locked();
  pthread_mutex_unlock(&kc.lock);
  unload(doomed);
}

/* one of device dev's numbers, read under the lock */
static long dev_number(kiln_device dev, size_t offset) {
  pthread_mutex_lock(&kc.lock);
  long n = *(const long *)((const char *)dev_locked(dev_index(dev)) + offset);
  pthread_mutex_unlock(&kc.lock);
  return n;
}

long cache_kernel_count(kiln_device dev) {
  return dev_number(dev, offsetof(device_cache, nkernels));
}
long cache_code_count(kiln_device dev) { return dev_number(dev, offsetof(device_cache, ncodes)); }
long cache_kernel_generation(kiln_device dev) {
  return dev_number(dev, offsetof(device_cache, generation));
}

void cache_kernel_trim(kiln_device dev) {
  pthread_mutex_lock(&kc.lock);
  trim_locked(dev_locked(dev_index(dev)), 0);
  cache_code *doomed = take_doomed_locked();
  pthread_mutex_unlock(&kc.lock);
  unload(doomed);
}
