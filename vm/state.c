/* state.c — process and thread state, errors, environment settings. */
#include "state.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"

static vm_process_state process;
static pthread_once_t process_once = PTHREAD_ONCE_INIT;
static _Thread_local vm_thread_state thread_state = {.status = KILN_OK, .api = "kiln"};

long vm_env_long(const char *name, long dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end;
  long v = strtol(s, &end, 10);
  return *end ? dflt : v;
}

static int cpus_available(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void process_init(void) {
  long threads = vm_env_long("KILN_THREADS", 0);
  /* N ranks of an MPI job on one machine share its cores */
  int ranks_here = vm_dist_local_size();
  if (threads <= 0) threads = cpus_available() / (ranks_here > 1 ? ranks_here : 1);
  if (threads <= 0) threads = 1;
  if (threads > 256) threads = 256;
  process.threads = (int)threads;
  process.rng_seed = 67280421310721ull; /* fixed default: reproducible runs */
  process.rng_counter = 0;
  atomic_flag_clear(&process.rng_lock);
  atomic_init(&process.tf32, vm_env_long("KILN_TF32", 0) == 1);
}

vm_process_state *vm_process(void) {
  pthread_once(&process_once, process_init);
  return &process;
}

vm_thread_state *vm_thread(void) { return &thread_state; }

void vm_post_ops(void) {
  vm_thread_state *ts = &thread_state;
  if (!ts->ops_unposted) return;
  atomic_fetch_add_explicit(&vm_process()->stats.ops_recorded, ts->ops_unposted,
                            memory_order_relaxed);
  ts->ops_unposted = 0;
}

kiln_status vm_error(kiln_status status, const char *fmt, ...) {
  vm_thread_state *ts = &thread_state;
  ts->status = status;
  int n = snprintf(ts->message, sizeof ts->message, "%s: ", ts->api ? ts->api : "kiln");
  if (n < 0 || n >= (int)sizeof ts->message) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ts->message + n, sizeof ts->message - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

kiln_status vm_error_again(kiln_status status, const char *message) {
  thread_state.status = status;
  snprintf(thread_state.message, sizeof thread_state.message, "%s", message ? message : "");
  return status;
}

void vm_null_input(int argument_index) {
  if (thread_state.status == KILN_OK)
    vm_error(KILN_ERR_ARG, "argument %d is NULL", argument_index + 1);
}

void vm_clear_error(void) {
  thread_state.status = KILN_OK;
  thread_state.message[0] = '\0';
}

/* --- block caches --------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define VM_CACHE_BLOCKS 0 /* let AddressSanitizer see every use after free */
#else
#define VM_CACHE_BLOCKS 1
#endif

static pthread_key_t blocks_key;
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;

/* frees a list of cached blocks (linked through their first word) */
static void free_list(void **head) {
  while (*head) {
    void *b = *head;
    *head = *(void **)b;
    free(b);
  }
}

static void blocks_thread_exit(void *p) {
  vm_thread_state *ts = p;
  for (int c = 0; c < VM_MID_CLASSES; c++) {
    free_list(&ts->free_mid[c]);
    ts->mid_count[c] = 0;
  }
  ts->mid_bytes = 0;
  for (int k = 0; k < VM_BLOCK_KINDS; k++) {
    free_list(&ts->free_blocks[k]);
    ts->free_count[k] = 0;
  }
}

static void blocks_key_init(void) { pthread_key_create(&blocks_key, blocks_thread_exit); }

/* a block of kind from this thread's cache, or NULL when it has none */
static void *cached_block(int kind) {
  vm_thread_state *ts = &thread_state;
  void *b = ts->free_blocks[kind];
  if (b) {
    ts->free_blocks[kind] = *(void **)b;
    ts->free_count[kind]--;
  }
  return b;
}

void *vm_block_alloc(int kind, size_t size) {
  void *b = cached_block(kind);
  if (!b) return calloc(1, size);
  memset(b, 0, size);
  return b;
}

void *vm_block_alloc_aligned(int kind, size_t size) {
  void *b = cached_block(kind);
  return b ? b : aligned_alloc(64, (size + 63) & ~(size_t)63);
}

/* frees the thread's caches when it exits */
static void register_cleanup(vm_thread_state *ts) {
  if (!ts->cleanup_registered) {
    pthread_once(&blocks_once, blocks_key_init);
    pthread_setspecific(blocks_key, ts);
    ts->cleanup_registered = true;
  }
}

void vm_block_free(int kind, void *p) {
  vm_thread_state *ts = &thread_state;
  if (!p) return;
  if (!VM_CACHE_BLOCKS || ts->free_count[kind] >= VM_BLOCK_CACHE) {
    free(p);
    return;
  }
  register_cleanup(ts);
  *(void **)p = ts->free_blocks[kind];
  ts->free_blocks[kind] = p;
  ts->free_count[kind]++;
}

/* Mid-size buffers: the outputs of an eager op or a loop step on small
   activations ([32,128] f32 is 16 KiB).  Taken from glibc's malloc, each
   was a bin search and often a block last touched long ago; here a freed
   block is taken again first by the next request of its class on the
   thread that freed it, while it is still in that core's cache (W16 8%,
   W10 3-8% faster; an eager chain of adds over 4096 floats 0.70 -> 0.62 us
   an op).  A class holds at most VM_MID_PER_CLASS blocks and a thread
   VM_MID_BYTES in all (W10's peak RSS +4 MiB); past that a block goes back
   to malloc. */
#define VM_MID_PER_CLASS 64
#define VM_MID_BYTES ((size_t)8 << 20)

/* the class of a request of bytes (1 KiB < bytes <= VM_MID_MAX): 8 per
   power of two, each 1/8 of it apart; *size: the class's block size */
static int mid_class(size_t bytes, size_t *size) {
  int e = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^e <= bytes-1 < 2^(e+1) */
  size_t g = (size_t)1 << (e - 3), m = (bytes + g - 1) / g;      /* 9..16 eighths of 2^e */
  *size = m * g;
  return (e - 10) * 8 + (int)(m - 9);
}

void *vm_mid_alloc(size_t bytes, size_t *have) {
  vm_thread_state *ts = &thread_state;
  int c = mid_class(bytes, have);
  void *b = ts->free_mid[c];
  if (b) {
    ts->free_mid[c] = *(void **)b;
    ts->mid_count[c]--;
    ts->mid_bytes -= *have;
    return b;
  }
  if (!VM_CACHE_BLOCKS) *have = bytes; /* AddressSanitizer sees the exact size */
  return posix_memalign(&b, 64, *have) == 0 ? b : NULL;
}

void vm_mid_free(void *p, size_t have) {
  vm_thread_state *ts = &thread_state;
  size_t size;
  int c = mid_class(have, &size);
  if (!VM_CACHE_BLOCKS || size != have || ts->mid_count[c] >= VM_MID_PER_CLASS ||
      ts->mid_bytes + have > VM_MID_BYTES) {
    free(p);
    return;
  }
  register_cleanup(ts);
  *(void **)p = ts->free_mid[c];
  ts->free_mid[c] = p;
  ts->mid_count[c]++;
  ts->mid_bytes += have;
}

const char *vm_shape_str(char *buf, int ndim, const int64_t *shape) {
  int n = 0;
  buf[n++] = '[';
  for (int d = 0; d < ndim; d++)
    n += snprintf(buf + n, (size_t)(VM_SHAPE_BUF - n), d ? ",%lld" : "%lld", (long long)shape[d]);
  buf[n++] = ']';
  buf[n] = '\0';
  return buf;
}
