/* compile_queue.c — the background compile queue (compile_queue.h), one
 * implementation with an instance per device so that a slow NVRTC compile
 * never holds up a CPU one.  It lives in trace/ because its jobs carry plans
 * (retained while queued); the compiling itself is the backend's.  All of
 * its state is the one static struct below. */
#include "compile_queue.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t wake, idle;
  tr_compile_job *head, *tail;
  bool started, busy, stopping;
  const tr_compile_ops *ops;
  void *thread_arg;
  int delay_max_ms; /* ops->delays: KILN_COMPILE_DELAY_MS */
  uint64_t delay_state;
} compile_queue;

#define QUEUE_INIT                                                       \
  {                                                                      \
    .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, \
    .idle = PTHREAD_COND_INITIALIZER                                     \
  }

/* one per kiln_device, as vm_process()->backends */
static struct { compile_queue dev[4]; } queues = {{QUEUE_INIT, QUEUE_INIT, QUEUE_INIT, QUEUE_INIT}};

static compile_queue *queue_of(kiln_device dev) { return &queues.dev[dev]; }

static void compile_delay(compile_queue *q) {
  if (q->delay_max_ms <= 0) return;
  uint64_t z = (q->delay_state += 0x9E3779B97F4A7C15ull); /* splitmix64 */
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  long us = (long)(z % ((uint64_t)q->delay_max_ms * 1000 + 1));
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void *worker_main(void *arg) {
  compile_queue *q = arg;
  if (q->ops->thread_begin) q->ops->thread_begin(q->thread_arg);
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (!q->head && !q->stopping) pthread_cond_wait(&q->wake, &q->lock);
    if (q->stopping) break;
    tr_compile_job *job = q->head;
    q->head = job->next;
    if (!q->head) q->tail = NULL;
    q->busy = true;
    pthread_mutex_unlock(&q->lock);
    compile_delay(q);
    tr_plan *plan = job->plan;
    q->ops->run(job);
    tr_plan_release(plan);
    pthread_mutex_lock(&q->lock);
    q->busy = false;
    pthread_cond_broadcast(&q->idle);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

bool tr_compile_unstarted(kiln_device dev) {
  compile_queue *q = queue_of(dev);
  pthread_mutex_lock(&q->lock);
  bool unstarted = !q->started && !q->stopping;
  pthread_mutex_unlock(&q->lock);
  return unstarted;
}

bool tr_compile_start(kiln_device dev, const tr_compile_ops *ops, void *thread_arg) {
  compile_queue *q = queue_of(dev);
  pthread_mutex_lock(&q->lock);
  bool started = false;
  if (!q->started && !q->stopping) {
    q->ops = ops;
    q->thread_arg = thread_arg;
    const char *delay =
        ops->delays ? getenv("KILN_COMPILE_DELAY_MS") : NULL; /* on the caller's thread */
    if (delay && *delay) {
      char *end;
      q->delay_max_ms = (int)strtol(delay, &end, 10);
      q->delay_state = *end == ',' ? strtoull(end + 1, NULL, 10) : 1;
    }
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = q->started = pthread_create(&th, &attr, worker_main, q) == 0;
    pthread_attr_destroy(&attr);
  }
  pthread_mutex_unlock(&q->lock);
  return started;
}

bool tr_compile_push(kiln_device dev, tr_compile_job *job) {
  compile_queue *q = queue_of(dev);
  pthread_mutex_lock(&q->lock);
  bool queued = q->started && !q->stopping;
  if (queued) {
    tr_plan_retain(job->plan);
    job->next = NULL;
    if (q->tail)
      q->tail->next = job;
    else
      q->head = job;
    q->tail = job;
    pthread_cond_signal(&q->wake);
  }
  pthread_mutex_unlock(&q->lock);
  return queued;
}

/* a waiter during the exit stop returns: the queue is being dropped */
void tr_compile_wait(kiln_device dev) {
  compile_queue *q = queue_of(dev);
  pthread_mutex_lock(&q->lock);
  while (q->started && !q->stopping && (q->head || q->busy)) pthread_cond_wait(&q->idle, &q->lock);
  pthread_mutex_unlock(&q->lock);
}

/* At exit, a compile still running would find its compiler torn down under
   it (seen: crashes inside libgccjit during _dl_fini; NVRTC or the driver
   likewise): let it finish, drop the queue, and stop the thread. */
void tr_compile_stop(kiln_device dev) {
  compile_queue *q = queue_of(dev);
  pthread_mutex_lock(&q->lock);
  q->stopping = true;
  pthread_cond_broadcast(&q->wake);
  while (q->busy) pthread_cond_wait(&q->idle, &q->lock);
  tr_compile_job *job = q->head;
  q->head = q->tail = NULL;
  pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->lock);
  while (job) {
    tr_compile_job *next = job->next;
    tr_plan *plan = job->plan;
    q->ops->drop(job);
    tr_plan_release(plan);
    job = next;
  }
}
