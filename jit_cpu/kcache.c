/* kcache.c — the kernel cache: kernel key -> compiled function, with
 * reference counts from the plans that use each kernel, an LRU of the
 * kernels no plan uses (bounded), and the code objects they live in,
 * unloaded when none of their kernels is cached any more.  One lock. */
#include "kcache.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "../vm/state.h"

struct cpu_code {
  gcc_jit_result *result;
  void *dl;
  long refs; /* the creator's, until released, + one per cached kernel in it */
  bool batched;
  uint64_t batch[2];
  UT_hash_handle hh; /* in kc.codes by batch, when batched */
};

struct cpu_kentry {
  uint64_t key[2];
  uint8_t *bytes; /* the full description: a hash collision is never a hit */
  size_t len;
  cpu_kernel_fn fn;
  cpu_code *code;
  long refs;                /* plans (and callers) holding it */
  cpu_kentry *prev, *next;  /* in the idle list while refs == 0 */
  UT_hash_handle hh;
};

/* KILN_KERNEL_CACHE_MAX: unreferenced kernels kept (default 2048) */
#define KCACHE_DEFAULT_IDLE 2048

static struct {
  pthread_mutex_t lock;
  cpu_kentry *table;
  cpu_code *codes;  /* loaded code objects with a disk key */
  cpu_kentry idle;  /* sentinel: next = least recently released */
  long nidle, nkernels, ncodes, max_idle;
  long generation; /* kernels ever cached */
} kc = {.lock = PTHREAD_MUTEX_INITIALIZER, .idle = {.prev = &kc.idle, .next = &kc.idle}};

static vm_counters *stats(void) { return &vm_process()->stats; }

cpu_code *cpu_code_new(gcc_jit_result *result, void *dl, const uint64_t *batch) {
  cpu_code *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->result = result;
  c->dl = dl;
  c->refs = 1;
  pthread_mutex_lock(&kc.lock);
  if (batch) {
    cpu_code *twin = NULL;
    HASH_FIND(hh, kc.codes, batch, 2 * sizeof *batch, twin);
    if (!twin) { /* (a twin: both stay loaded until released; lookups find the first) */
      c->batched = true;
      memcpy(c->batch, batch, sizeof c->batch);
      HASH_ADD(hh, kc.codes, batch, sizeof c->batch, c);
    }
  }
  kc.ncodes++;
  atomic_fetch_add_explicit(&stats()->code_objects, 1, memory_order_relaxed);
  pthread_mutex_unlock(&kc.lock);
  return c;
}

cpu_code *cpu_code_find(const uint64_t batch[2]) {
  cpu_code *c = NULL;
  pthread_mutex_lock(&kc.lock);
  HASH_FIND(hh, kc.codes, batch, 2 * sizeof *batch, c);
  if (c) c->refs++;
  pthread_mutex_unlock(&kc.lock);
  return c;
}

void *cpu_code_symbol(cpu_code *code, const char *name) {
  return code->dl ? dlsym(code->dl, name) : gcc_jit_result_get_code(code->result, name);
}

/* with kc.lock held: drops a reference; the last one unloads the code */
static void code_unref_locked(cpu_code *c) {
  if (--c->refs > 0) return;
  if (c->batched) HASH_DELETE(hh, kc.codes, c);
  kc.ncodes--;
  atomic_fetch_sub_explicit(&stats()->code_objects, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&stats()->code_unloads, 1, memory_order_relaxed);
  if (c->dl) dlclose(c->dl);
  if (c->result) gcc_jit_result_release(c->result);
  free(c);
}

void cpu_code_release(cpu_code *code) {
  if (!code) return;
  pthread_mutex_lock(&kc.lock);
  code_unref_locked(code);
  pthread_mutex_unlock(&kc.lock);
}

static void idle_unlink(cpu_kentry *e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
  e->prev = e->next = NULL;
  kc.nidle--;
}

static void entry_drop_locked(cpu_kentry *e) {
  HASH_DELETE(hh, kc.table, e);
  kc.nkernels--;
  code_unref_locked(e->code);
  free(e->bytes);
  free(e);
}

/* with kc.lock held: evicts least recently released kernels past max */
static void trim_locked(long max) {
  while (kc.nidle > max) {
    cpu_kentry *old = kc.idle.next;
    idle_unlink(old);
    entry_drop_locked(old);
  }
}

static cpu_kentry *find_locked(const uint64_t key[2], const uint8_t *bytes, size_t len) {
  cpu_kentry *e = NULL;
  HASH_FIND(hh, kc.table, key, 2 * sizeof *key, e);
  if (!e || e->len != len || memcmp(e->bytes, bytes, len)) return NULL;
  if (e->refs++ == 0) idle_unlink(e);
  return e;
}

cpu_kentry *cpu_kcache_get(const uint64_t key[2], const uint8_t *bytes, size_t len) {
  pthread_mutex_lock(&kc.lock);
  cpu_kentry *e = find_locked(key, bytes, len);
  pthread_mutex_unlock(&kc.lock);
  return e;
}

cpu_kentry *cpu_kcache_put(const uint64_t key[2], const uint8_t *bytes, size_t len, cpu_code *code,
                           cpu_kernel_fn fn) {
  if (!fn || !code) return NULL;
  cpu_kentry *e = calloc(1, sizeof *e);
  uint8_t *copy = malloc(len ? len : 1);
  if (!e || !copy) {
    free(e);
    free(copy);
    return NULL;
  }
  memcpy(copy, bytes, len);
  pthread_mutex_lock(&kc.lock);
  cpu_kentry *have = NULL;
  HASH_FIND(hh, kc.table, key, 2 * sizeof *key, have);
  if (have) { /* cached meanwhile (or a colliding key, which stays) */
    cpu_kentry *hit = find_locked(key, bytes, len);
    pthread_mutex_unlock(&kc.lock);
    free(e);
    free(copy);
    return hit;
  }
  memcpy(e->key, key, sizeof e->key);
  e->bytes = copy;
  e->len = len;
  e->fn = fn;
  e->code = code;
  code->refs++;
  e->refs = 1;
  HASH_ADD(hh, kc.table, key, sizeof e->key, e);
  kc.nkernels++;
  kc.generation++;
  pthread_mutex_unlock(&kc.lock);
  return e;
}

cpu_kernel_fn cpu_kentry_fn(const cpu_kentry *e) { return e ? e->fn : NULL; }

void cpu_kcache_release(cpu_kentry *e) {
  if (!e) return;
  pthread_mutex_lock(&kc.lock);
  if (--e->refs == 0) {
    if (!kc.max_idle) kc.max_idle = vm_env_long("KILN_KERNEL_CACHE_MAX", KCACHE_DEFAULT_IDLE);
    if (kc.max_idle < 0) kc.max_idle = 0;
    e->prev = kc.idle.prev;
    e->next = &kc.idle;
    kc.idle.prev->next = e;
    kc.idle.prev = e;
    kc.nidle++;
    trim_locked(kc.max_idle);
  }
  pthread_mutex_unlock(&kc.lock);
}

long cpu_kcache_kernels(void) {
  pthread_mutex_lock(&kc.lock);
  long n = kc.nkernels;
  pthread_mutex_unlock(&kc.lock);
  return n;
}

long cpu_kcache_generation(void) {
  pthread_mutex_lock(&kc.lock);
  long n = kc.generation;
  pthread_mutex_unlock(&kc.lock);
  return n;
}

long cpu_kcache_code_objects(void) {
  pthread_mutex_lock(&kc.lock);
  long n = kc.ncodes;
  pthread_mutex_unlock(&kc.lock);
  return n;
}

void cpu_kcache_trim(void) {
  pthread_mutex_lock(&kc.lock);
  trim_locked(0);
  pthread_mutex_unlock(&kc.lock);
}
