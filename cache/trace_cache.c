/* trace_cache.c — key -> entry with LRU eviction and a recompile budget per
 * key family (a trace whose shapes keep changing stops being planned). */
#include "trace_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "../vm/state.h"

/* entries kept (KILN_TRACE_CACHE_MAX); an evicted entry releases its plan,
   and with it the plan's references to compiled kernels */
#define CACHE_MAX_ENTRIES 4096
/* and the bytes they hold, key bytes above all (KILN_TRACE_CACHE_MB): a
   GRU trained over lengths 5..40 makes a new key of ~60 KB most steps (a
   flush holds two steps' loops, so the keys are pairs of lengths), and
   4096 of them held ~250 MB; W10's resident set grew by 0.17 MB a step */
#define CACHE_MAX_MB 64
#define CACHE_MAX_RELEARN 3 /* plans per key: the first, and two relearned */

typedef struct entry {
  uint64_t key[2];
  uint8_t *bytes;
  size_t len;
  uint64_t sightings;
  void *plan;
  int plan_learned; /* learned outputs when the plan was built */
  int plans;        /* plans published for this key */
  int nodes;        /* canonical nodes of the trace */
  int learned;      /* outputs learned (bits set in keep) */
  uint8_t *keep;    /* per node: keep it (learned), or NULL */
  bool refused;     /* its family was over budget when it was hot: never planned */
  double interp_ms; /* total time of its runs on the interpreter */
  uint64_t interp_runs;
  bool priced;                /* the payoff rule's price of its plan is known: */
  double price_ms;            /* that price, */
  long price_gen;             /* at this kernel generation of its backend */
  uint8_t aux[CACHE_AUX_MAX]; /* cache_attach */
  size_t aux_len;
  uint64_t fam[2]; /* its family, once cache_sight_family named it */
  bool has_fam;
  double work; /* the size of its trace (cache_sight_family) */
  struct entry *lru_prev, *lru_next;
  UT_hash_handle hh;
} entry;

typedef struct family {
  uint64_t key[2];
  int planned;          /* plans that compiled kernels (the recompile budget) */
  uint64_t sightings;   /* of its keys while unplanned */
  double interp_ms;     /* their runs on the interpreter: total time, */
  uint64_t interp_runs; /* and how many, */
  double interp_work;   /* and their work (cache_sight_family) */
  bool priced;          /* the last price of one of its keys' plans: */
  double price_ms;      /* its kernels cost the same at any shape, */
  long price_gen;       /* until the backend gains kernels */
  UT_hash_handle hh;
} family;

/* families kept (oldest dropped first): a family's record is a few words,
   but a program whose structure keeps changing would add one per flush */
#define CACHE_MAX_FAMILIES 65536

static struct {
  pthread_mutex_t lock;
  entry *table;
  family *families; /* in the order they were added (uthash keeps it) */
  int nfamilies;
  entry lru; /* sentinel: lru.lru_next is the most recent */
  int count;
  cache_plan_ops ops;
  int hot, budget, max_entries;
  size_t bytes, max_bytes;       /* held by the entries (entry_bytes), and the cap */
  double compiled_ms, interp_ms; /* cache_compiled_ratio: decayed sums over compiled runs */
  bool ready;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void init_locked(void) {
  if (cache.ready) return;
  cache.lru.lru_next = cache.lru.lru_prev = &cache.lru;
  long hot = vm_env_long("KILN_HOT", 2);
  long budget = vm_env_long("KILN_RECOMPILE_BUDGET", 8);
  cache.hot = hot < 1 ? 1 : (int)hot;
  cache.budget = budget < 0 ? 0 : (int)budget;
  long max = vm_env_long("KILN_TRACE_CACHE_MAX", CACHE_MAX_ENTRIES);
  cache.max_entries = max < 1 ? 1 : max > (1L << 24) ? 1 << 24 : (int)max;
  long mb = vm_env_long("KILN_TRACE_CACHE_MB", CACHE_MAX_MB);
  cache.max_bytes = (size_t)(mb < 1 ? 1 : mb > (1L << 30) ? 1L << 30 : mb) << 20;
  cache.ready = true;
}

int cache_hot_threshold(void) {
  pthread_mutex_lock(&cache.lock);
  init_locked();
  int h = cache.hot;
  pthread_mutex_unlock(&cache.lock);
  return h;
}

int cache_family_budget(void) {
  pthread_mutex_lock(&cache.lock);
  init_locked();
  int b = cache.budget;
  pthread_mutex_unlock(&cache.lock);
  return b;
}

void cache_set_plan_ops(const cache_plan_ops *ops) {
  pthread_mutex_lock(&cache.lock);
  cache.ops = *ops;
  pthread_mutex_unlock(&cache.lock);
}

static void lru_unlink(entry *e) {
  e->lru_prev->lru_next = e->lru_next;
  e->lru_next->lru_prev = e->lru_prev;
}

static void lru_push_front(entry *e) {
  e->lru_next = cache.lru.lru_next;
  e->lru_prev = &cache.lru;
  cache.lru.lru_next->lru_prev = e;
  cache.lru.lru_next = e;
}

/* the gauges kiln_stat reads */
static void publish_locked(void) {
  vm_counters *st = &vm_process()->stats;
  atomic_store_explicit(&st->trace_cache_entries, (uint_fast64_t)cache.count, memory_order_relaxed);
  atomic_store_explicit(&st->trace_cache_bytes, (uint_fast64_t)cache.bytes, memory_order_relaxed);
  atomic_store_explicit(&st->trace_families, (uint_fast64_t)cache.nfamilies, memory_order_relaxed);
}

/* what an entry holds: itself, its key bytes, its learned outputs */
static size_t entry_bytes(const entry *e) {
  return sizeof *e + e->len + (e->keep ? (size_t)e->nodes : 0);
}

static void entry_free(entry *e) {
  if (e->plan && cache.ops.release) cache.ops.release(e->plan);
  free(e->keep);
  free(e->bytes);
  free(e);
}

/* drops least recently sighted entries while over either cap; the most
   recent one always stays */
static void evict_locked(void) {
  while (cache.count > 1 && (cache.count > cache.max_entries || cache.bytes > cache.max_bytes)) {
    entry *old = cache.lru.lru_prev;
    lru_unlink(old);
    HASH_DELETE(hh, cache.table, old);
    cache.count--;
    cache.bytes -= entry_bytes(old);
    entry_free(old);
  }
}

/* the entry with these bytes; hash collisions chain through the bytes */
static entry *find(const uint64_t key[2], const uint8_t *bytes, size_t len) {
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  if (e && (e->len != len || memcmp(e->bytes, bytes, len) != 0)) return NULL;
  return e;
}

void cache_sight(const uint64_t key[2], const uint8_t *bytes, size_t len, int nodes, bool *outputs,
                 cache_sighting *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&cache.lock);
  init_locked();
  entry *e = find(key, bytes, len), *same_hash = NULL;
  HASH_FIND(hh, cache.table, key, sizeof(uint64_t) * 2, same_hash);
  if (!e && same_hash) { /* a collision: the newcomer runs uncached */
    out->new_key = true;
    out->sightings = 1;
    pthread_mutex_unlock(&cache.lock);
    return;
  }
  if (!e) {
    e = calloc(1, sizeof *e);
    uint8_t *copy = malloc(len ? len : 1);
    if (!e || !copy) {
      free(e);
      free(copy);
      pthread_mutex_unlock(&cache.lock);
      out->sightings = 1;
      return;
    }
    memcpy(e->key, key, sizeof e->key);
    memcpy(copy, bytes, len);
    e->nodes = nodes;
    e->bytes = copy;
    e->len = len;
    HASH_ADD(hh, cache.table, key, sizeof e->key, e);
    lru_push_front(e);
    cache.count++;
    cache.bytes += entry_bytes(e);
    out->new_key = true;
    evict_locked();
    publish_locked();
  } else {
    lru_unlink(e);
    lru_push_front(e);
  }
  out->sightings = ++e->sightings;
  out->learned = e->learned;
  for (int i = 0; e->keep && i < e->nodes && i < nodes; i++)
    if (e->keep[i]) outputs[i] = true;
  if (e->plan && e->plan_learned == e->learned) {
    out->plan = e->plan;
    if (cache.ops.retain) cache.ops.retain(e->plan);
  } else if (e->plan) { /* its outputs changed since it was planned */
    out->replan = true;
  } else if (e->sightings >= (uint64_t)cache.hot && !e->refused) {
    out->hot = true;
  }
  out->interp_ms = e->interp_runs ? e->interp_ms / (double)e->interp_runs : 0;
  out->priced = e->priced;
  out->price_ms = e->price_ms;
  out->price_gen = e->price_gen;
  memcpy(out->aux, e->aux, e->aux_len);
  out->aux_len = e->aux_len;
  pthread_mutex_unlock(&cache.lock);
}

void cache_attach(const uint64_t key[2], const void *aux, size_t len) {
  if (len > CACHE_AUX_MAX) return;
  pthread_mutex_lock(&cache.lock);
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  if (e) {
    memcpy(e->aux, aux, len);
    e->aux_len = len;
  }
  pthread_mutex_unlock(&cache.lock);
}

void cache_note_price(const uint64_t key[2], double ms, long gen) {
  pthread_mutex_lock(&cache.lock);
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof(uint64_t) * 2, e);
  if (e) {
    e->priced = true;
    e->price_ms = ms;
    e->price_gen = gen;
  }
  family *f = NULL;
  if (e && e->has_fam) HASH_FIND(hh, cache.families, e->fam, sizeof f->key, f);
  if (f) {
    f->priced = true;
    f->price_ms = ms;
    f->price_gen = gen;
  }
  pthread_mutex_unlock(&cache.lock);
}

void cache_refuse(const uint64_t key[2]) {
  pthread_mutex_lock(&cache.lock);
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  if (e) e->refused = true;
  pthread_mutex_unlock(&cache.lock);
}

/* the family record of fam, added if new (NULL: out of memory) */
static family *family_locked(const uint64_t fam[2]) {
  family *f = NULL;
  HASH_FIND(hh, cache.families, fam, sizeof f->key, f);
  if (f || !(f = calloc(1, sizeof *f))) return f;
  memcpy(f->key, fam, sizeof f->key);
  HASH_ADD(hh, cache.families, key, sizeof f->key, f);
  if (++cache.nfamilies > CACHE_MAX_FAMILIES) { /* drop the oldest */
    family *old = cache.families;
    HASH_DELETE(hh, cache.families, old);
    free(old);
    cache.nfamilies--;
  }
  publish_locked();
  return f;
}

void cache_sight_family(const uint64_t key[2], const uint64_t fam[2], double work,
                        cache_sighting *io) {
  pthread_mutex_lock(&cache.lock);
  init_locked();
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  family *f = family_locked(fam);
  if (f) {
    if (e) {
      memcpy(e->fam, fam, sizeof e->fam);
      e->has_fam = true;
      e->work = work;
    }
    f->sightings++;
    io->family = true;
    io->family_sightings = f->sightings;
    io->family_interp_total = f->interp_ms;
    io->family_interp_ms = f->interp_work > 0 ? f->interp_ms / f->interp_work * work
                           : f->interp_runs   ? f->interp_ms / (double)f->interp_runs
                                              : 0;
    if (!io->priced && f->priced) { /* a new shape: priced as its family was */
      io->priced = true;
      io->price_ms = f->price_ms;
      io->price_gen = f->price_gen;
    }
    if (e && !e->plan && !e->refused && f->sightings >= (uint64_t)cache.hot) io->hot = true;
  }
  pthread_mutex_unlock(&cache.lock);
}

bool cache_admit(const uint64_t fam[2], bool compiles) {
  pthread_mutex_lock(&cache.lock);
  init_locked();
  family *f = family_locked(fam);
  bool ok = !f || !compiles || f->planned < cache.budget;
  if (ok && f && compiles) f->planned++;
  pthread_mutex_unlock(&cache.lock);
  return ok;
}

void cache_publish(const uint64_t key[2], const uint8_t *bytes, size_t len, int learned,
                   void *plan) {
  pthread_mutex_lock(&cache.lock);
  entry *e = find(key, bytes, len);
  if (e && (!e->plan || e->plan_learned < learned)) {
    if (e->plan && cache.ops.release) cache.ops.release(e->plan);
    e->plan = plan;
    e->plan_learned = learned;
    e->plans++;
    if (cache.ops.retain) cache.ops.retain(plan);
  }
  pthread_mutex_unlock(&cache.lock);
}

void cache_learn(const uint64_t key[2], int index) {
  pthread_mutex_lock(&cache.lock);
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  /* a key planned CACHE_MAX_RELEARN times keeps the outputs it has: its
     plan (and compiled code) stays; learning is only ever a hint */
  if (e && index >= 0 && index < e->nodes && e->plans < CACHE_MAX_RELEARN) {
    if (!e->keep && (e->keep = calloc((size_t)e->nodes, 1))) {
      cache.bytes += (size_t)e->nodes;
      publish_locked();
    }
    if (e->keep && !e->keep[index]) {
      e->keep[index] = 1;
      e->learned++;
    }
  }
  pthread_mutex_unlock(&cache.lock);
}

void cache_note_run(const uint64_t key[2], double ms, bool compiled) {
  pthread_mutex_lock(&cache.lock);
  entry *e = NULL;
  HASH_FIND(hh, cache.table, key, sizeof e->key, e);
  if (e && !compiled) {
    e->interp_ms += ms;
    e->interp_runs++;
    family *f = NULL;
    if (e->has_fam) HASH_FIND(hh, cache.families, e->fam, sizeof f->key, f);
    if (f) {
      f->interp_ms += ms;
      f->interp_runs++;
      f->interp_work += e->work;
    }
  } else if (e && e->interp_runs && e->interp_ms > 0) {
    /* time-weighted: a long trace's runs say more than a 20 us one's noise */
    double interp = e->interp_ms / (double)e->interp_runs;
    cache.compiled_ms = 0.95 * cache.compiled_ms + ms;
    cache.interp_ms = 0.95 * cache.interp_ms + interp;
  }
  pthread_mutex_unlock(&cache.lock);
}

double cache_compiled_ratio(void) {
  pthread_mutex_lock(&cache.lock);
  /* seeded with 10 ms of made-up evidence at one half */
  double r = (cache.compiled_ms + 5) / (cache.interp_ms + 10);
  pthread_mutex_unlock(&cache.lock);
  return r;
}

int cache_entries(void) {
  pthread_mutex_lock(&cache.lock);
  int n = cache.count;
  pthread_mutex_unlock(&cache.lock);
  return n;
}

void cache_clear(void) {
  pthread_mutex_lock(&cache.lock);
  init_locked();
  entry *e, *tmp;
  HASH_ITER(hh, cache.table, e, tmp) {
    HASH_DELETE(hh, cache.table, e);
    entry_free(e);
  }
  family *f, *ftmp;
  HASH_ITER(hh, cache.families, f, ftmp) {
    HASH_DELETE(hh, cache.families, f);
    free(f);
  }
  cache.nfamilies = 0;
  cache.lru.lru_next = cache.lru.lru_prev = &cache.lru;
  cache.count = 0;
  cache.bytes = 0;
  publish_locked();
  cache.compiled_ms = cache.interp_ms = 0;
  pthread_mutex_unlock(&cache.lock);
}
