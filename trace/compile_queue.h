/* compile_queue.h — the background compile queue both backends use: one
 * worker thread per device compiling queued plans in order, waiting for
 * them, and stopping at exit (a compile in flight finishes, the rest are
 * dropped: their plans stay uncompiled and run on the interpreter).  What a
 * job compiles is the backend's (tr_compile_ops); the queue holds the plan. */
#ifndef TR_COMPILE_QUEUE_H
#define TR_COMPILE_QUEUE_H

#include <stdbool.h>

#include "plan.h"

/* A queued compile: the first member of the backend's own job struct */
typedef struct tr_compile_job {
  tr_plan *plan; /* retained while queued (tr_compile_push) */
  struct tr_compile_job *next;
} tr_compile_job;

typedef struct tr_compile_ops {
  /* on the worker thread: compiles job, publishes in job->plan->jit and
     frees job (the queue releases the plan after) */
  void (*run)(tr_compile_job *job);
  /* at stop: frees a job that never ran */
  void (*drop)(tr_compile_job *job);
  /* NULL, or called first thing on the worker thread with start's arg */
  void (*thread_begin)(void *arg);
  /* testing: KILN_COMPILE_DELAY_MS=max[,seed] sleeps a random 0..max ms
     before each compile, so compiles finish at random moments
     (tests/test_bitwise_training.c: results must not change) */
  bool delays;
} tr_compile_ops;

/* neither started nor stopped: a tr_compile_start would start it */
bool tr_compile_unstarted(kiln_device dev);
/* starts dev's worker thread (ops must outlive it); true if this call
   started it (the caller then registers its exit stop), false if it was
   started already, is stopping, or the thread could not be made */
bool tr_compile_start(kiln_device dev, const tr_compile_ops *ops, void *thread_arg);
/* queues job for job->plan (retained here); false, with nothing queued,
   when dev's worker is not running (never started, or stopping): the
   caller compiles on its own thread */
bool tr_compile_push(kiln_device dev, tr_compile_job *job);
/* until dev's queue is empty and no compile is in flight */
void tr_compile_wait(kiln_device dev);
/* At exit (from the backend's atexit handler): the compile in flight
   finishes, queued jobs are dropped, the thread ends.  Repeatable. */
void tr_compile_stop(kiln_device dev);

#endif
