/* dist.c — the distributed engine (vm/dist.h, DESIGN §10).
 *
 * Open MPI is loaded at run time: libmpi.so.40 (or KILN_MPI_LIB) through
 * dlopen, every entry point and predefined handle through dlsym.  No MPI
 * header is needed to build Kiln, and a Kiln built anywhere uses the MPI of
 * the machine it runs on.  The calls below speak Open MPI's ABI (since 3.0:
 * handles are pointers to predefined objects, MPI_IN_PLACE is (void *)1,
 * MPI_STATUS_IGNORE is NULL); another MPI is refused with a reason.
 *
 * One engine thread per process makes every MPI call (it initializes MPI,
 * so MPI_THREAD_FUNNELED is all it needs).  Callers queue requests and wait
 * for them; the engine runs them in order, each an 8-word signature check
 * on one duplicate of MPI_COMM_WORLD, then the payload, in place, on
 * another.  The engine's thread waits for the ranks to arrive at the check
 * without taking a core (MPI_Iallreduce polled with MPI_Test, yielding,
 * then sleeping), then moves the payload with a blocking MPI_Allreduce:
 * Open MPI's blocking call moved 4 MB between two ranks of this machine
 * 2.4x as fast as MPI_Iallreduce driven by MPI_Test (7.4 against 3.1 GB/s),
 * and spinning in it while a slower rank still computes took the core
 * that rank's own compute thread needed.  The calling thread goes on
 * computing meanwhile: that is how a gradient bucket overlaps the rest of
 * backward (autodiff/dist.c).  A waiter that waits past KILN_DIST_TIMEOUT
 * ends the job. */
#include "dist.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "tensor.h"

/* --- Open MPI's ABI ---------------------------------------------------- */

typedef void *mpi_handle; /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request, MPI_Errhandler */
#define MPI_OK 0
#define MPI_FUNNELED 1
#define MPI_INPLACE ((void *)1)
#define MPI_ERROR_LEN 256

typedef struct mpi_api {
  void *lib;
  int (*Init_thread)(int *, char ***, int, int *);
  int (*Finalize)(void);
  int (*Comm_rank)(mpi_handle, int *);
  int (*Comm_size)(mpi_handle, int *);
  int (*Comm_dup)(mpi_handle, mpi_handle *);
  int (*Comm_free)(mpi_handle *);
  int (*Comm_set_errhandler)(mpi_handle, mpi_handle);
  int (*Allreduce)(const void *, void *, int, mpi_handle, mpi_handle, mpi_handle);
  int (*Iallreduce)(const void *, void *, int, mpi_handle, mpi_handle, mpi_handle, mpi_handle *);
  int (*Test)(mpi_handle *, int *, void *);
  int (*Abort)(mpi_handle, int);
  int (*Error_string)(int, char *, int *);
  /* predefined objects: their addresses are the handles */
  mpi_handle comm_world, errors_return, t_u8, t_i32, t_i64, t_f32, t_f64, op_sum, op_max;
} mpi_api;

static const struct {
  const char *name;
  size_t offset;
  bool object; /* a predefined handle (the symbol's address), not a function */
} mpi_symbols[] = {
#define FN(n) \
  { "MPI_" #n, offsetof(mpi_api, n), false }
#define OBJ(field, sym) \
  { sym, offsetof(mpi_api, field), true }
    FN(Init_thread),
    FN(Finalize),
    FN(Comm_rank),
    FN(Comm_size),
    FN(Comm_dup),
    FN(Comm_free),
    FN(Comm_set_errhandler),
    FN(Allreduce),
    FN(Iallreduce),
    FN(Test),
    FN(Abort),
    FN(Error_string),
    OBJ(comm_world, "ompi_mpi_comm_world"),
    OBJ(errors_return, "ompi_mpi_errors_return"),
    OBJ(t_u8, "ompi_mpi_uint8_t"),
    OBJ(t_i32, "ompi_mpi_int32_t"),
    OBJ(t_i64, "ompi_mpi_int64_t"),
    OBJ(t_f32, "ompi_mpi_float"),
    OBJ(t_f64, "ompi_mpi_double"),
    OBJ(op_sum, "ompi_mpi_op_sum"),
    OBJ(op_max, "ompi_mpi_op_max"),
#undef FN
#undef OBJ
};

/* --- requests ---------------------------------------------------------- */

typedef enum { RQ_NEW, RQ_RUNNING, RQ_DONE } rq_state;

/* payloads go in pieces of at most 2^30 elements (MPI counts are int) */
#define RQ_PIECE ((int64_t)1 << 30)

typedef struct dist_req {
  struct dist_req *next; /* the engine's list, in issue order */
  uint64_t seq;
  vm_tensor *buf; /* contiguous host value, reduced in place (the request's reference) */
  kiln_dtype dtype;
  int op;
  bool bucket; /* all_reduce_start: the buffer packs several tensors */
  int64_t count;
  rq_state state;
  int status; /* KILN_OK, or why it failed (state DONE) */
  char msg[VM_ERROR_LEN];
  double t_submit, t_data; /* queued; taken by the engine */
} dist_req;

typedef struct vm_dist {
  mpi_api mpi;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;   /* the engine: new work, or stop */
  pthread_cond_t done;   /* waiters: a request finished; init finished */
  dist_req *head, *tail; /* live requests (not yet claimed by their waiter) */
  bool stop, init_done;
  int init_status;
  char init_msg[VM_ERROR_LEN];
  mpi_handle check_comm, data_comm;
  int rank, size;
  uint64_t last_seq; /* the newest sequence number issued */
  double timeout_s;
} vm_dist;

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int dist_phase; /* 0 never initialized, 1 running, 2 finalized */
static atomic_uint_fast64_t next_seq;

static vm_dist *engine(void) { return vm_process()->dist; }

const char *vm_reduce_name(int op) {
  static const char *names[] = {"sum", "mean", "max"};
  return op >= 0 && op < VM_REDUCE_COUNT ? names[op] : "?";
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void add_us(atomic_uint_fast64_t *c, double seconds) {
  atomic_fetch_add_explicit(c, (uint_fast64_t)(seconds * 1e6 + 0.5), memory_order_relaxed);
}

int vm_dist_local_size(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *s = getenv(vars[i]);
    if (s && atoi(s) > 0) return atoi(s);
  }
  return 0;
}

static bool launched_by_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

static void mpi_error_text(const mpi_api *m, int code, char *out, size_t cap) {
  char text[MPI_ERROR_LEN + 1] = "";
  int len = 0;
  if (m->Error_string && m->Error_string(code, text, &len) == MPI_OK && len > 0)
    snprintf(out, cap, "%.*s (MPI error %d)", len, text, code);
  else
    snprintf(out, cap, "MPI error %d", code);
}

/* dlopen + dlsym; false with msg saying what is missing */
static bool load_mpi(mpi_api *m, char *msg, size_t cap) {
  const char *path = getenv("KILN_MPI_LIB");
  if (!path || !*path) path = "libmpi.so.40";
  /* global: Open MPI's own plugins resolve their symbols against libmpi */
  m->lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!m->lib) {
    snprintf(msg, cap,
             "the MPI engine is not available: %s (install Open MPI, e.g. apt-get install "
             "openmpi-bin, or set KILN_MPI_LIB to its libmpi.so)",
             dlerror());
    return false;
  }
  for (size_t i = 0; i < sizeof mpi_symbols / sizeof *mpi_symbols; i++) {
    void *p = dlsym(m->lib, mpi_symbols[i].name);
    if (!p) {
      snprintf(msg, cap,
               "%s has no %s: Kiln's MPI engine speaks Open MPI's ABI (libmpi.so.40, Open MPI 3 "
               "or newer)",
               path, mpi_symbols[i].name);
      return false;
    }
    if (mpi_symbols[i].object)
      *(mpi_handle *)((char *)m + mpi_symbols[i].offset) = p;
    else
      memcpy((char *)m + mpi_symbols[i].offset, &p, sizeof p);
  }
  return true;
}

/* a collective that cannot complete leaves the ranks out of step: say why
   on stderr and end the whole job (mpirun stops every rank) */
static _Noreturn void abort_job(vm_dist *e, const char *why) {
  fprintf(stderr, "kiln: rank %d of %d: %s; aborting the job\n", e->rank, e->size, why);
  fflush(stderr);
  e->mpi.Abort(e->mpi.comm_world, 1);
  _exit(1);
}

static mpi_handle mpi_type(const mpi_api *m, kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
      return m->t_u8;
    case KILN_I32:
      return m->t_i32;
    case KILN_I64:
      return m->t_i64;
    case KILN_F32:
      return m->t_f32;
    case KILN_F64:
      return m->t_f64;
    case KILN_U8:
      return m->t_u8;
    case KILN_BF16:
    case KILN_F16:
    case KILN_I8:
    case KILN_I16:
      break; /* summed in a wider dtype (front/op.c) */
  }
  return NULL;
}

/* bool values are 0/1 bytes: their sum saturates, which is their max */
static mpi_handle mpi_op(const mpi_api *m, kiln_dtype dt, int op) {
  return op == VM_REDUCE_MAX || dt == KILN_BOOL ? m->op_max : m->op_sum;
}

/* an MPI error inside a collective leaves the ranks out of step */
static bool mpi_failed(vm_dist *e, const dist_req *r, const char *what, int rc) {
  char text[MPI_ERROR_LEN + 32], msg[VM_ERROR_LEN];
  mpi_error_text(&e->mpi, rc, text, sizeof text);
  snprintf(msg, sizeof msg, "MPI_Allreduce of collective #%llu's %s failed: %s",
           (unsigned long long)r->seq, what, text);
  abort_job(e, msg);
}

/* r ran (engine's lock held): r->status says how; wakes its waiter */
static void finish(vm_dist *e, dist_req *r) {
  r->state = RQ_DONE;
  if (r->status == KILN_OK) {
    vm_counters *st = &vm_process()->stats;
    atomic_fetch_add_explicit(&st->all_reduces, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->all_reduce_bytes,
                              (uint_fast64_t)r->count * vm_dtype_size(r->dtype),
                              memory_order_relaxed);
    add_us(&st->all_reduce_us, now_s() - r->t_data);
  }
  pthread_cond_broadcast(&e->done);
}

/* the ranks' signatures: MAX of (v, -v) gives max and -min of each word;
   false + r's error when they differ */
static bool agreed(vm_dist *e, dist_req *r) {
  int64_t sig[8] = {r->op, r->dtype, r->count, r->bucket}, got[8];
  for (int i = 0; i < 4; i++) sig[4 + i] = -sig[i];
  /* the ranks arrive at different times: wait for the last one without
     taking a core from this process's compute threads (polls, yielding,
     then sleeping up to 200 us), so the payload's blocking call below
     finds every rank there and spins only while data moves */
  mpi_handle req = NULL;
  int rc = e->mpi.Iallreduce(sig, got, 8, e->mpi.t_i64, e->mpi.op_max, e->check_comm, &req);
  for (int flag = 0; rc == MPI_OK;) {
    rc = e->mpi.Test(&req, &flag, NULL);
    if (flag) break;
    double waited_us = (now_s() - r->t_data) * 1e6;
    if (waited_us < 50)
      sched_yield();
    else
      nanosleep(&(struct timespec){0, 1000 * (long)(waited_us < 800 ? waited_us / 4 : 200)}, NULL);
  }
  if (rc != MPI_OK) return mpi_failed(e, r, "its signature", rc);
  bool same = true;
  for (int i = 0; i < 4; i++) same = same && got[i] == sig[i] && got[4 + i] == -sig[i];
  if (same) return true;
  r->status = KILN_ERR_SHAPE;
  snprintf(r->msg, sizeof r->msg,
           "the ranks disagree on collective #%llu: this rank (%d) reduces %lld %s (%s%s), but "
           "across ranks the element count is %lld..%lld, the dtype %s..%s and the op %s..%s "
           "(every rank must call the same collectives in the same order with the same shapes)",
           (unsigned long long)r->seq, e->rank, (long long)r->count, vm_dtype_name(r->dtype),
           vm_reduce_name(r->op), r->bucket ? ", a gradient bucket" : "", (long long)-got[6],
           (long long)got[2], vm_dtype_name((int)-got[5]), vm_dtype_name((int)got[1]),
           vm_reduce_name((int)-got[4]), vm_reduce_name((int)got[0]));
  return false;
}

/* the payload, in place, in pieces of at most 2^30 elements */
static bool reduce(vm_dist *e, dist_req *r) {
  char *base = vm_data(r->buf);
  size_t esize = vm_dtype_size(r->dtype);
  for (int64_t at = 0; at < r->count; at += RQ_PIECE) {
    int64_t n = r->count - at < RQ_PIECE ? r->count - at : RQ_PIECE;
    int rc = e->mpi.Allreduce(MPI_INPLACE, base + at * (int64_t)esize, (int)n,
                              mpi_type(&e->mpi, r->dtype), mpi_op(&e->mpi, r->dtype, r->op),
                              e->data_comm);
    if (rc != MPI_OK) return mpi_failed(e, r, "its payload", rc);
  }
  return true;
}

/* the oldest request not yet taken, or NULL */
static dist_req *next_new(vm_dist *e) {
  for (dist_req *r = e->head; r; r = r->next)
    if (r->state == RQ_NEW) return r;
  return NULL;
}

static void *engine_main(void *arg) {
  vm_dist *e = arg;
  mpi_api *m = &e->mpi;
  int provided = 0, rc = m->Init_thread(NULL, NULL, MPI_FUNNELED, &provided);
  if (rc == MPI_OK) rc = m->Comm_dup(m->comm_world, &e->check_comm);
  if (rc == MPI_OK) rc = m->Comm_dup(m->comm_world, &e->data_comm);
  if (rc == MPI_OK) rc = m->Comm_set_errhandler(e->check_comm, m->errors_return);
  if (rc == MPI_OK) rc = m->Comm_set_errhandler(e->data_comm, m->errors_return);
  if (rc == MPI_OK) rc = m->Comm_rank(m->comm_world, &e->rank);
  if (rc == MPI_OK) rc = m->Comm_size(m->comm_world, &e->size);
  pthread_mutex_lock(&e->lock);
  e->init_done = true;
  if (rc != MPI_OK) {
    char text[MPI_ERROR_LEN + 32];
    mpi_error_text(m, rc, text, sizeof text);
    e->init_status = KILN_ERR_STATE;
    snprintf(e->init_msg, sizeof e->init_msg, "MPI_Init_thread failed: %s", text);
  } else if (provided < MPI_FUNNELED) {
    e->init_status = KILN_ERR_STATE;
    snprintf(e->init_msg, sizeof e->init_msg,
             "MPI provides thread level %d, Kiln needs FUNNELED (1)", provided);
  }
  pthread_cond_broadcast(&e->done);
  if (e->init_status != KILN_OK) {
    pthread_mutex_unlock(&e->lock);
    return NULL;
  }
  for (;;) {
    dist_req *r;
    while (!(r = next_new(e)) && !e->stop) pthread_cond_wait(&e->wake, &e->lock);
    if (!r) break;
    r->state = RQ_RUNNING;
    pthread_mutex_unlock(&e->lock);
    r->t_data = now_s();
    bool ok = agreed(e, r) && reduce(e, r);
    pthread_mutex_lock(&e->lock);
    if (ok) r->status = KILN_OK;
    finish(e, r);
  }
  pthread_mutex_unlock(&e->lock);
  m->Comm_free(&e->check_comm);
  m->Comm_free(&e->data_comm);
  m->Finalize();
  return NULL;
}

/* --- the API ----------------------------------------------------------- */

int vm_dist_init(void) {
  pthread_mutex_lock(&init_lock);
  int phase = atomic_load(&dist_phase), rc = KILN_OK;
  if (phase == 1) goto out; /* joined already */
  if (phase == 2) {
    rc = vm_error(KILN_ERR_STATE, "MPI was finalized in this process and cannot start again");
    goto out;
  }
  if (!launched_by_mpirun()) {
    rc = vm_error(KILN_ERR_STATE,
                  "this process was not started by mpirun (no OMPI_COMM_WORLD_SIZE, PMIX_RANK or "
                  "PMI_RANK in its environment): run it as `mpirun -np N program`");
    goto out;
  }
  vm_dist *e = calloc(1, sizeof *e);
  if (!e) {
    rc = vm_error(KILN_ERR_OOM, "out of memory");
    goto out;
  }
  char msg[VM_ERROR_LEN];
  if (!load_mpi(&e->mpi, msg, sizeof msg)) {
    if (e->mpi.lib) dlclose(e->mpi.lib);
    free(e);
    rc = vm_error(KILN_ERR_STATE, "%s", msg);
    goto out;
  }
  /* ranks that fill this machine's cores leave none for the engine's
     thread: Open MPI then yields instead of spinning while it waits
     (measured on W15, 2 ranks on 2 cores: the overlapped step went from
     24.0 to 18.8 ms, the serial one 19.1); the user's setting wins */
  int ranks_here = vm_dist_local_size();
  if (ranks_here > 0 && ranks_here * vm_process()->threads >= (int)sysconf(_SC_NPROCESSORS_ONLN))
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  long timeout = vm_env_long("KILN_DIST_TIMEOUT", 300);
  e->timeout_s = timeout > 0 ? (double)timeout : 300;
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->wake, NULL);
  pthread_condattr_t monotonic; /* waiters' deadlines are on CLOCK_MONOTONIC */
  pthread_condattr_init(&monotonic);
  pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
  pthread_cond_init(&e->done, &monotonic);
  pthread_condattr_destroy(&monotonic);
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    free(e);
    rc = vm_error(KILN_ERR_STATE, "cannot start the MPI engine thread");
    goto out;
  }
  pthread_mutex_lock(&e->lock);
  while (!e->init_done) pthread_cond_wait(&e->done, &e->lock);
  pthread_mutex_unlock(&e->lock);
  if (e->init_status != KILN_OK) {
    pthread_join(e->thread, NULL);
    rc = vm_error(e->init_status, "%s", e->init_msg);
    atomic_store(&dist_phase, 2); /* MPI cannot be initialized twice */
    free(e);
    goto out;
  }
  vm_process()->dist = e;
  atomic_store(&dist_phase, 1);
out:
  pthread_mutex_unlock(&init_lock);
  return rc;
}

bool vm_dist_ready(void) {
  int phase = atomic_load(&dist_phase);
  if (phase == 1) return true;
  vm_error(KILN_ERR_STATE, phase == 2
                               ? "kiln_dist_finalize was called: no more collectives"
                               : "call kiln_dist_init first (and start the program with mpirun)");
  return false;
}

int vm_dist_rank(void) { return vm_dist_ready() ? engine()->rank : KILN_ERR_STATE; }
int vm_dist_size(void) { return vm_dist_ready() ? engine()->size : KILN_ERR_STATE; }

uint64_t vm_dist_next_seq(void) { return atomic_fetch_add(&next_seq, 1) + 1; }

int vm_dist_finalize(void) {
  pthread_mutex_lock(&init_lock);
  if (!vm_dist_ready()) {
    pthread_mutex_unlock(&init_lock);
    return vm_thread()->status;
  }
  vm_dist *e = engine();
  pthread_mutex_lock(&e->lock);
  e->stop = true;
  pthread_cond_signal(&e->wake);
  pthread_mutex_unlock(&e->lock);
  pthread_join(e->thread, NULL);
  for (dist_req *r = e->head, *next; r; r = next) { /* finished, never claimed */
    next = r->next;
    vm_release(r->buf);
    free(r);
  }
  atomic_store(&dist_phase, 2);
  vm_process()->dist = NULL;
  pthread_mutex_destroy(&e->lock);
  pthread_cond_destroy(&e->wake);
  pthread_cond_destroy(&e->done);
  free(e);
  pthread_mutex_unlock(&init_lock);
  return KILN_OK;
}

/* queues buf (a fresh contiguous host value: the request takes a reference)
   for reduction; NULL + error when the sequence is broken */
static dist_req *submit(vm_tensor *buf, int op, bool bucket, uint64_t seq) {
  vm_dist *e = engine();
  dist_req *r = calloc(1, sizeof *r);
  if (!r) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  pthread_mutex_lock(&e->lock);
  if (seq <= e->last_seq) {
    pthread_mutex_unlock(&e->lock);
    free(r);
    vm_error(KILN_ERR_STATE,
             "collective #%llu runs after #%llu: collectives must run once each, in the order they "
             "were recorded (record them on one thread; an evaluation that failed or was "
             "interrupted after a collective ran leaves the ranks out of step: end the job)",
             (unsigned long long)seq, (unsigned long long)e->last_seq);
    return NULL;
  }
  e->last_seq = seq;
  r->seq = seq;
  r->buf = vm_retain(buf);
  r->dtype = buf->dtype;
  r->count = buf->numel;
  r->op = op;
  r->bucket = bucket;
  r->t_submit = now_s();
  if (e->tail)
    e->tail->next = r;
  else
    e->head = r;
  e->tail = r;
  pthread_cond_signal(&e->wake);
  pthread_mutex_unlock(&e->lock);
  return r;
}

/* waits for the request reducing buf's storage, unlinks and frees it;
   false + its error when it failed.  No answer within the timeout means a
   rank died or diverged: the job ends, with the reason, instead of hanging */
static bool wait_for(vm_tensor *buf) {
  vm_dist *e = engine();
  double t0 = now_s();
  pthread_mutex_lock(&e->lock);
  dist_req *r = e->head, *prev = NULL;
  while (r && r->buf->storage != buf->storage) {
    prev = r;
    r = r->next;
  }
  if (!r) {
    pthread_mutex_unlock(&e->lock);
    vm_error(KILN_ERR_STATE,
             "no all_reduce in flight for this buffer (its start ran in another "
             "evaluation that failed)");
    return false;
  }
  double deadline = r->t_submit + e->timeout_s;
  struct timespec until = {(time_t)deadline, (long)((deadline - (double)(time_t)deadline) * 1e9)};
  while (r->state != RQ_DONE)
    if (pthread_cond_timedwait(&e->done, &e->lock, &until) == ETIMEDOUT && r->state != RQ_DONE) {
      char msg[VM_ERROR_LEN];
      snprintf(msg, sizeof msg,
               "%s #%llu (%lld %s, %s) got no answer from the other ranks in %.0f s "
               "(KILN_DIST_TIMEOUT): a rank failed, hangs, or called a different collective",
               r->bucket ? "gradient bucket" : "all_reduce", (unsigned long long)r->seq,
               (long long)r->count, vm_dtype_name(r->dtype), vm_reduce_name(r->op), e->timeout_s);
      abort_job(e, msg);
    }
  if (prev)
    prev->next = r->next;
  else
    e->head = r->next;
  if (e->tail == r) e->tail = prev;
  pthread_mutex_unlock(&e->lock);
  add_us(&vm_process()->stats.all_reduce_wait_us, now_s() - t0);
  bool ok = r->status == KILN_OK;
  if (!ok) vm_error(r->status, "%s", r->msg);
  vm_release(r->buf);
  free(r);
  return ok;
}

/* a fresh contiguous host copy of v (the payload is reduced in place) */
static vm_tensor *host_copy(vm_tensor *v) {
  vm_tensor *h = vm_value_host_contiguous(v);
  if (!h) return NULL;
  vm_tensor *c = vm_tensor_new(h->dtype, h->ndim, h->shape);
  if (c && c->numel) memcpy(vm_data(c), vm_data(h), (size_t)c->numel * vm_dtype_size(c->dtype));
  vm_release(h);
  return c;
}

static void divide(vm_tensor *t, int by) {
  if (t->dtype == KILN_F32) {
    float *p = vm_data(t), d = (float)by;
    for (int64_t i = 0; i < t->numel; i++) p[i] /= d;
  } else if (t->dtype == KILN_F64) {
    double *p = vm_data(t), d = by;
    for (int64_t i = 0; i < t->numel; i++) p[i] /= d;
  }
}

/* the value on the node's device */
static vm_tensor *placed(vm_tensor *host, const vm_meta *m) {
  if (!host || m->device == KILN_CPU) return host;
  vm_tensor *d = vm_value_to_device(host, (kiln_device)m->device);
  vm_release(host);
  return d;
}

static vm_tensor *exec_all_reduce(vm_tensor *in, const vm_attr *attr, const vm_meta *m) {
  vm_tensor *buf = host_copy(in);
  if (!buf) return NULL;
  bool ok = submit(buf, attr->axis, false, attr->counter) && wait_for(buf);
  if (ok && attr->axis == VM_REDUCE_MEAN) divide(buf, engine()->size);
  if (!ok) {
    vm_release(buf);
    return NULL;
  }
  return placed(buf, m);
}

/* packs the inputs, flattened, into one buffer and starts its reduction;
   the buffer is the value (read only by all_reduce_wait) */
static vm_tensor *exec_start(int n, vm_tensor *const *in, const vm_attr *attr, const vm_meta *m) {
  vm_tensor *buf = vm_tensor_new(m->dtype, 1, m->shape);
  if (!buf) return NULL;
  char *at = vm_data(buf);
  for (int i = 0; i < n; i++) {
    vm_tensor *h = vm_value_host_contiguous(in[i]);
    if (!h) {
      vm_release(buf);
      return NULL;
    }
    size_t bytes = (size_t)h->numel * vm_dtype_size(h->dtype);
    if (bytes) memcpy(at, vm_data(h), bytes);
    at += bytes;
    vm_release(h);
  }
  if (!submit(buf, attr->axis, true, attr->counter)) {
    vm_release(buf);
    return NULL;
  }
  return buf;
}

static vm_tensor *exec_wait(vm_tensor *buf, const vm_attr *attr, const vm_meta *m) {
  if (!wait_for(buf)) return NULL;
  vm_tensor *out = vm_retain(buf);
  if (attr->axis == VM_REDUCE_MEAN) divide(out, engine()->size);
  return placed(out, m);
}

vm_tensor *vm_dist_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                        const vm_meta *m) {
  if (!vm_dist_ready()) return NULL;
  switch (op) {
    case VM_OP_all_reduce:
      return exec_all_reduce(values[0], attr, m);
    case VM_OP_all_reduce_start:
      return exec_start(n, values, attr, m);
    case VM_OP_all_reduce_wait:
      return exec_wait(values[0], attr, m);
    default:
      break;
  }
  vm_error(KILN_ERR_INTERNAL, "%s is not a collective", vm_op_table[op].name);
  return NULL;
}
