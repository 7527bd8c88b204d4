/* pool.c — a small pthread pool for kernels.  One job at a time: the caller
 * publishes (fn, ctx, chunk count), workers and the caller take chunks from
 * an atomic counter, the caller waits until every chunk is done and every
 * worker has let go of the job.  A caller that finds the pool busy (another
 * thread's job, or a nested call from a worker) runs its job inline. */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "state.h"

typedef struct vm_pool {
  pthread_mutex_t submit; /* held by the thread whose job is running */
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  int nworkers;
  uint64_t generation;    /* bumped per job */
  int active;             /* workers holding the current job */
  int64_t completed;      /* chunks finished */
  /* the current job */
  vm_chunk_fn fn;
  void *ctx;
  int64_t n, chunks;
  atomic_int_fast64_t next;
} vm_pool;

static vm_pool pool = {.submit = PTHREAD_MUTEX_INITIALIZER,
                       .lock = PTHREAD_MUTEX_INITIALIZER,
                       .wake = PTHREAD_COND_INITIALIZER,
                       .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void chunk_bounds(int64_t n, int64_t chunks, int64_t c, int64_t *b, int64_t *e) {
  int64_t q = n / chunks, r = n % chunks;
  *b = c * q + (c < r ? c : r);
  *e = *b + q + (c < r ? 1 : 0);
}

/* takes chunks of the current job until none are left; returns how many */
static int64_t run_chunks(vm_chunk_fn fn, void *ctx, int64_t n, int64_t chunks) {
  int64_t mine = 0, c;
  while ((c = atomic_fetch_add(&pool.next, 1)) < chunks) {
    int64_t b, e;
    chunk_bounds(n, chunks, c, &b, &e);
    fn(ctx, c, b, e);
    mine++;
  }
  return mine;
}

static void *worker_main(void *arg) {
  (void)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.lock);
    seen = pool.generation;
    /* a job that already finished is closed: joining it late would take
       chunks from the counter of the next job with this one's function */
    if (!pool.fn) continue;
    vm_chunk_fn fn = pool.fn;
    void *ctx = pool.ctx;
    int64_t n = pool.n, chunks = pool.chunks;
    pool.active++;
    pthread_mutex_unlock(&pool.lock);
    int64_t mine = run_chunks(fn, ctx, n, chunks);
    pthread_mutex_lock(&pool.lock);
    pool.active--;
    pool.completed += mine;
    pthread_cond_signal(&pool.done);
  }
  return NULL;
}

static void pool_start(void) {
  int want = vm_process()->threads - 1;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < want; i++) {
    pthread_t th;
    if (pthread_create(&th, &attr, worker_main, NULL) != 0) break;
    pool.nworkers++;
  }
  pthread_attr_destroy(&attr);
}

int vm_pool_threads(void) {
  pthread_once(&pool_once, pool_start);
  return pool.nworkers + 1;
}

void vm_parallel_chunks(int64_t n, int64_t chunks, vm_chunk_fn fn, void *ctx) {
  if (n <= 0 || chunks <= 0) return;
  if (chunks > n) chunks = n;
  bool pooled = chunks > 1 && vm_pool_threads() > 1 && pthread_mutex_trylock(&pool.submit) == 0;
  if (!pooled) {
    for (int64_t c = 0; c < chunks; c++) {
      int64_t b, e;
      chunk_bounds(n, chunks, c, &b, &e);
      fn(ctx, c, b, e);
    }
    return;
  }
  pthread_mutex_lock(&pool.lock);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.n = n;
  pool.chunks = chunks;
  pool.completed = 0;
  atomic_store(&pool.next, 0);
  pool.generation++;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);

  int64_t mine = run_chunks(fn, ctx, n, chunks);

  pthread_mutex_lock(&pool.lock);
  pool.completed += mine;
  while (pool.completed < chunks || pool.active > 0) pthread_cond_wait(&pool.done, &pool.lock);
  pool.fn = NULL;
  pool.ctx = NULL;
  pthread_mutex_unlock(&pool.lock);
  pthread_mutex_unlock(&pool.submit);
}

typedef struct {
  vm_range_fn fn;
  void *ctx;
} range_job;

static void range_adapter(void *ctx, int64_t chunk, int64_t b, int64_t e) {
  (void)chunk;
  range_job *job = ctx;
  job->fn(job->ctx, b, e);
}

void vm_parallel_for(int64_t n, int64_t grain, vm_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = n / grain;
  int threads = vm_pool_threads();
  if (chunks > threads) chunks = threads;
  if (chunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
  range_job job = {fn, ctx};
  vm_parallel_chunks(n, chunks, range_adapter, &job);
}
