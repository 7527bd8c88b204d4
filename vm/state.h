/* state.h — the one process-wide struct and the one per-thread struct
 * (STYLE: nothing else is global), plus the error helper every layer uses.
 * Owns: settings read from the environment, stats counters, the current
 * error.  Does not own the thread pool's or BLAS's internals. */
#ifndef VM_STATE_H
#define VM_STATE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "kiln.h"

#define VM_ERROR_LEN 512

/* per-thread caches of freed fixed-size blocks (tensor headers, trace
   nodes, small storages with their data inline): recording an op
   allocates a few of each, and a run of a cached plan a storage per
   output */
enum { VM_BLOCK_TENSOR, VM_BLOCK_NODE, VM_BLOCK_STORAGE_S, VM_BLOCK_STORAGE_L, VM_BLOCK_KINDS };
#define VM_BLOCK_CACHE 256
/* mid-size buffers (vm_mid_alloc): 8 size classes per power of two from
   1 KiB to VM_MID_MAX */
#define VM_MID_MIN ((size_t)1 << 10) /* exclusive */
#define VM_MID_MAX ((size_t)512 << 10)
#define VM_MID_CLASSES 72

typedef struct vm_thread_state {
  kiln_status status;                /* of the first error since the last clear */
  char message[VM_ERROR_LEN];        /* "" when status is KILN_OK */
  const char *api;                   /* public name of the op being called ("kiln_add") */
  int no_grad;                       /* depth of kiln_no_grad_push scopes */
  int autocast;                      /* kiln_set_autocast: a half dtype, or 0 (off) */
  void *free_blocks[VM_BLOCK_KINDS]; /* singly linked through the first word */
  int free_count[VM_BLOCK_KINDS];
  void *free_mid[VM_MID_CLASSES]; /* vm_mid_alloc's blocks, by size class */
  uint8_t mid_count[VM_MID_CLASSES];
  size_t mid_bytes; /* held in free_mid */
  bool cleanup_registered;
  int pool_depth;       /* nested vm_pool_enter calls: >0 holds a kernel token */
  bool pool_in_chunk;   /* running a chunk of a parallel job (vm/pool.c) */
  volatile int *cancel; /* kiln_set_cancel_flag: nonzero stops evaluations */
  /* ops recorded here and not yet added to stats.ops_recorded: one atomic
     add per VM_OPS_POST ops, not per op (an atomic was ~4% of a W5 op);
     posted by vm_post_ops at flushes, stats reads and thread exit */
  unsigned ops_unposted;
} vm_thread_state;

#define VM_OPS_POST 256

/* the process's counters, one field per line of stats.def: what each
   counts is said there */
typedef struct vm_counters {
#define X(field, name, scale, kind) atomic_uint_fast64_t field;
#include "stats.def"
#undef X
} vm_counters;

typedef struct vm_process_state {
  int threads; /* KILN_THREADS or the CPUs we may run on */
  vm_counters stats;
  /* the backend of each kiln_device (vm/backend.h): set before main, read-only after */
  const struct vm_backend *backends[4];
  struct vm_dist *dist; /* the distributed engine once kiln_dist_init ran (vm/dist.c) */
  /* RNG: Philox key and the next unused counter block */
  uint64_t rng_seed, rng_counter;
  atomic_flag rng_lock;
  /* f32 matmuls on CUDA may use TF32 tensor cores (kiln_set_matmul_precision,
     KILN_TF32=1); read by every GEMM */
  atomic_bool tf32;
} vm_process_state;

vm_process_state *vm_process(void); /* initialized on first use, thread-safe */
vm_thread_state *vm_thread(void);
/* adds this thread's unposted recorded ops to stats.ops_recorded */
void vm_post_ops(void);

/* Records an error as status + "api: message" and returns status.  A NULL
   input is not a new error: vm_null_input keeps the error that produced the
   NULL, so a chain of ops reports its first failure. */
kiln_status vm_error(kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void vm_null_input(int argument_index);
/* Records an error whose message already names its op (a stored failure
   raised again by a later read): no second "api: " prefix. */
kiln_status vm_error_again(kiln_status status, const char *message);
void vm_clear_error(void);

/* the public name errors are reported under; set by bindings/c on entry */
static inline void vm_set_api(const char *name) { vm_thread()->api = name; }

/* formats a shape as "[2,3]" into buf (at least 8*21+3 bytes) */
const char *vm_shape_str(char *buf, int ndim, const int64_t *shape);
#define VM_SHAPE_BUF 192

/* milliseconds on the monotonic clock */
static inline double vm_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline void vm_add_ms(atomic_uint_fast64_t *us, double ms) {
  atomic_fetch_add_explicit(us, (uint_fast64_t)(ms * 1000.0), memory_order_relaxed);
}

/* a zeroed block of `size` bytes of kind (always the same size per kind),
   from this thread's cache when it has one; NULL on OOM */
void *vm_block_alloc(int kind, size_t size);
/* an uninitialized block of `size` bytes aligned to 64 (kinds whose blocks
   all come from here); NULL when out of memory */
void *vm_block_alloc_aligned(int kind, size_t size);
void vm_block_free(int kind, void *p);
/* a buffer of more than 1 KiB and at most VM_MID_MAX bytes, aligned to 64,
   from this thread's cache of freed ones of its size class (the last freed
   first: still in this core's cache); *have: its size, the class's, which
   vm_mid_free takes back.  NULL when out of memory. */
void *vm_mid_alloc(size_t bytes, size_t *have);
void vm_mid_free(void *p, size_t have);

/* integer environment variable, or dflt when unset or malformed */
long vm_env_long(const char *name, long dflt);

#endif
