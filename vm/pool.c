/* pool.c — the kernel thread pool, shared fairly by every user thread.
 * Owns: the workers, the list of open jobs, and the budget of KILN_THREADS
 * "kernel tokens".  A thread runs kernel work only while it holds a token,
 * so however many user threads flush at once, at most KILN_THREADS threads
 * (callers and workers together) run kernels.
 *
 * Why tokens, and why several open jobs:
 * - Before, one job ran at a time and a second caller ran its job inline
 *   beside the workers: KILN_THREADS workers + N callers on KILN_THREADS
 *   cores, so workers were preempted mid-chunk and their callers waited for
 *   them (a convoy); OpenBLAS's own threads came on top (kern_matmul.c now
 *   runs gemms in blocks here instead).  Measured (perf_threads_two_models,
 *   2 cores): two models on two threads took 4-10x as long as one after the
 *   other; with tokens, 1.0-1.1x.
 * - A user thread takes one token for the whole of a flush (tr_run calls
 *   vm_pool_enter/leave) and for any parallel call outside one.  Holding it
 *   across the serial parts of a flush too keeps those from oversubscribing;
 *   nested enters only count depth, so they cannot deadlock.  A thread never
 *   waits for another thread while it holds a token (kernels take only leaf
 *   locks), so the budget cannot deadlock either.
 * - Workers join a job only when a token is free and no caller is waiting
 *   for one: callers (FIFO, by ticket) come first, so a busy pool shrinks
 *   each flush's helpers rather than delaying a flush.  A worker gives its
 *   token back after each job.
 * - Tokens bound whole flushes, not single parallel calls: a token per call
 *   would leave the serial kernels between calls outside the budget.  The
 *   cost is one uncontended lock per flush (W5 unchanged).
 * - Any number of jobs may be open, one per caller: with KILN_THREADS=4 and
 *   two user threads, the two free tokens help whichever job has chunks
 *   left, instead of idling because "the" job slot is taken.
 * - Chunk boundaries depend only on (n, chunks), never on who runs a chunk,
 *   so results do not depend on the thread count or on contention.
 * - A call made from inside a chunk (a worker's or a caller's) runs inline:
 *   that thread already holds a token and must not wait on the pool.
 * - Waking a sleeping thread is the expensive part of a small job: on these
 *   VMs a futex wake (an IPI to an idle vCPU) and the sleeper's wake-up cost
 *   tens of µs, more than the chunks of a [64, 2304] im2col (the digits CNN
 *   step spent 17% of its time there).  So a worker that finds no job spins
 *   for up to KILN_POOL_SPIN_US (200 µs; 0: never) watching the pool's epoch
 *   before it sleeps (a few windows at most when the epoch moves without
 *   bringing it a job), and open_job wakes only the sleepers it needs beyond
 *   the spinners; a caller whose job has helpers spins as long for them to
 *   leave before it sleeps.  Flushes run kernels back to back, so the next
 *   job usually comes within the window; a spinner holds no token, and
 *   yields its core while it spins, so a busy machine loses little.  The
   window was 50 µs; a recurrent step's serial work between its products
   is longer (an LSTM backward step of W16: ~120 µs), so the worker slept
   and was woken in every step: at 200 µs W16 ran 10% faster (medians of
   5 alternating runs, 56.0 against 61.9 ms), W10 the same. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "state.h"

/* one vm_parallel_chunks call; lives on its caller's stack */
typedef struct pool_job {
  vm_chunk_fn fn;
  void *ctx;
  int64_t n, chunks;
  atomic_int_fast64_t next;      /* next chunk to claim */
  int64_t completed;             /* chunks finished (under pool.lock) */
  atomic_int helpers;            /* workers inside this job (changed under pool.lock) */
  struct pool_job *prev, *after; /* the open list (under pool.lock) */
} pool_job;

typedef struct vm_pool {
  pthread_mutex_t lock;
  pthread_cond_t work;   /* workers: a job opened or a token came back */
  pthread_cond_t tokens; /* callers: a token came back */
  pthread_cond_t done;   /* callers: a worker left a job */
  int nworkers;
  int free_tokens;      /* of vm_process()->threads */
  uint64_t next_ticket; /* callers take tickets ... */
  uint64_t serving;     /* ... and get tokens in ticket order */
  pool_job *open;       /* jobs that may still have chunks to claim */
  int sleepers;         /* workers waiting on work (under pool.lock) */
  atomic_int spinners;  /* workers spinning for work */
  atomic_uint epoch;    /* bumped when work may have appeared */
  int64_t spin_ns;      /* KILN_POOL_SPIN_US */
  atomic_int running;   /* threads inside kernel work now (kernel_threads_max) */
} vm_pool;

static vm_pool pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
                       .work = PTHREAD_COND_INITIALIZER,
                       .tokens = PTHREAD_COND_INITIALIZER,
                       .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void chunk_bounds(int64_t n, int64_t chunks, int64_t c, int64_t *b, int64_t *e) {
  int64_t q = n / chunks, r = n % chunks;
  *b = c * q + (c < r ? c : r);
  *e = *b + q + (c < r ? 1 : 0);
}

/* the stats' high-water mark of threads running kernels at once: the test
   of the budget (tests/test_threads.c) reads it as kiln_stat */
static void running_enter(void) {
  uint_fast64_t now = (uint_fast64_t)atomic_fetch_add(&pool.running, 1) + 1;
  atomic_uint_fast64_t *max = &vm_process()->stats.kernel_threads_max;
  uint_fast64_t seen = atomic_load_explicit(max, memory_order_relaxed);
  while (now > seen && !atomic_compare_exchange_weak(max, &seen, now)) {
  }
}

static void running_leave(void) { atomic_fetch_sub(&pool.running, 1); }

/* takes chunks of job until none are left; returns how many it ran.  While
   in here the thread is "in a chunk": its nested parallel calls run inline */
static int64_t run_chunks(pool_job *job) {
  vm_thread_state *ts = vm_thread();
  int64_t mine = 0, c;
  ts->pool_in_chunk = true;
  running_enter();
  while ((c = atomic_fetch_add(&job->next, 1)) < job->chunks) {
    int64_t b, e;
    chunk_bounds(job->n, job->chunks, c, &b, &e);
    job->fn(job->ctx, c, b, e);
    mine++;
  }
  running_leave();
  ts->pool_in_chunk = false;
  return mine;
}

static bool callers_waiting(void) { return pool.next_ticket != pool.serving; }

/* an open job with a chunk left to claim, or NULL (under pool.lock) */
static pool_job *claimable_job(void) {
  for (pool_job *j = pool.open; j; j = j->after)
    if (atomic_load(&j->next) < j->chunks) return j;
  return NULL;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* spins (yielding the core now and then) until *word differs from seen or
   the spin time is over; true when it changed */
static bool spin_while_equal(atomic_uint *word, unsigned seen) {
  int64_t until = now_ns() + pool.spin_ns;
  for (int i = 1;; i++) {
    if (atomic_load_explicit(word, memory_order_acquire) != seen) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (now_ns() > until) return false;
      sched_yield();
    }
  }
}

static void bump_epoch(void) { atomic_fetch_add_explicit(&pool.epoch, 1, memory_order_release); }

static void *worker_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    pool_job *job;
    /* spin windows left: one per change of the epoch that brought no job,
       at most 4 (800 µs) since the last job or wake-up, then sleep */
    int windows = pool.spin_ns > 0 ? 4 : 0;
    while (pool.free_tokens == 0 || callers_waiting() || !(job = claimable_job())) {
      if (windows > 0) {
        unsigned seen = atomic_load(&pool.epoch);
        atomic_fetch_add(&pool.spinners, 1);
        pthread_mutex_unlock(&pool.lock);
        bool changed = spin_while_equal(&pool.epoch, seen);
        pthread_mutex_lock(&pool.lock);
        atomic_fetch_sub(&pool.spinners, 1);
        windows = changed ? windows - 1 : 0;
        continue;
      }
      pool.sleepers++;
      pthread_cond_wait(&pool.work, &pool.lock);
      pool.sleepers--;
      windows = pool.spin_ns > 0 ? 4 : 0;
    }
    pool.free_tokens--;
    job->helpers++;
    pthread_mutex_unlock(&pool.lock);
    int64_t mine = run_chunks(job);
    pthread_mutex_lock(&pool.lock);
    job->completed += mine;
    job->helpers--;
    pool.free_tokens++;
    bump_epoch();
    pthread_cond_broadcast(&pool.done);
    if (callers_waiting()) pthread_cond_broadcast(&pool.tokens);
  }
  return NULL;
}

static void pool_start(void) {
  int threads = vm_process()->threads;
  const char *spin = getenv("KILN_POOL_SPIN_US");
  pool.spin_ns = spin && *spin ? (int64_t)(atof(spin) * 1000) : 200000;
  if (pool.spin_ns < 0) pool.spin_ns = 0;
  pool.free_tokens = threads;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < threads - 1; i++) {
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

void vm_pool_enter(void) {
  vm_thread_state *ts = vm_thread();
  if (ts->pool_depth++ > 0 || ts->pool_in_chunk) return; /* holds one already */
  pthread_once(&pool_once, pool_start);
  pthread_mutex_lock(&pool.lock);
  uint64_t ticket = pool.next_ticket++;
  while (ticket != pool.serving || pool.free_tokens == 0)
    pthread_cond_wait(&pool.tokens, &pool.lock);
  pool.serving++;
  pool.free_tokens--;
  if (callers_waiting() && pool.free_tokens > 0)
    pthread_cond_broadcast(&pool.tokens); /* the next ticket */
  pthread_mutex_unlock(&pool.lock);
}

void vm_pool_leave(void) {
  vm_thread_state *ts = vm_thread();
  if (--ts->pool_depth > 0 || ts->pool_in_chunk) return;
  pthread_mutex_lock(&pool.lock);
  pool.free_tokens++;
  bump_epoch();
  if (callers_waiting())
    pthread_cond_broadcast(&pool.tokens);
  else if (claimable_job() && atomic_load(&pool.spinners) == 0)
    pthread_cond_signal(&pool.work);
  pthread_mutex_unlock(&pool.lock);
}

static void open_job(pool_job *job) {
  pthread_mutex_lock(&pool.lock);
  job->after = pool.open;
  if (pool.open) pool.open->prev = job;
  pool.open = job;
  /* wake as many workers as could help now, less those spinning (they see
     the epoch); others join as tokens return */
  int helpers = callers_waiting() ? 0 : pool.free_tokens;
  if (helpers > job->chunks - 1) helpers = (int)(job->chunks - 1);
  bump_epoch();
  helpers -= atomic_load(&pool.spinners);
  if (helpers > pool.sleepers) helpers = pool.sleepers;
  for (int i = 0; i < helpers; i++) pthread_cond_signal(&pool.work);
  pthread_mutex_unlock(&pool.lock);
}

/* every chunk is claimed once the caller's run_chunks returns: unlink the
   job, then wait for the workers still running its chunks */
static void close_job(pool_job *job, int64_t mine) {
  if (pool.spin_ns > 0 && atomic_load(&job->helpers) > 0) { /* they are finishing chunks */
    int64_t until = now_ns() + pool.spin_ns;
    for (int i = 1; atomic_load_explicit(&job->helpers, memory_order_acquire) > 0; i++) {
      cpu_relax();
      if (i % 64 == 0 && now_ns() > until) break;
    }
  }
  pthread_mutex_lock(&pool.lock);
  if (job->prev)
    job->prev->after = job->after;
  else
    pool.open = job->after;
  if (job->after) job->after->prev = job->prev;
  job->completed += mine;
  while (job->completed < job->chunks || job->helpers > 0)
    pthread_cond_wait(&pool.done, &pool.lock);
  pthread_mutex_unlock(&pool.lock);
}

void vm_parallel_chunks(int64_t n, int64_t chunks, vm_chunk_fn fn, void *ctx) {
  if (n <= 0 || chunks <= 0) return;
  if (chunks > n) chunks = n;
  if (vm_thread()->pool_in_chunk) { /* nested: this thread holds a token already */
    for (int64_t c = 0; c < chunks; c++) {
      int64_t b, e;
      chunk_bounds(n, chunks, c, &b, &e);
      fn(ctx, c, b, e);
    }
    return;
  }
  vm_pool_enter();
  pool_job job = {.fn = fn, .ctx = ctx, .n = n, .chunks = chunks};
  atomic_init(&job.next, 0);
  atomic_init(&job.helpers, 0);
  if (chunks == 1 || vm_pool_threads() == 1) {
    run_chunks(&job);
  } else {
    open_job(&job);
    close_job(&job, run_chunks(&job));
  }
  vm_pool_leave();
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
  if (chunks < 1) chunks = 1;
  range_job job = {fn, ctx};
  vm_parallel_chunks(n, chunks, range_adapter, &job);
}
