/* backend.c — the CUDA entry of the backend table (vm/backend.h): device
 * storage through jit_gpu/cuda.c's caching allocator, and the GPU
 * "interpreter": each primitive as its own generated kernel (opgen.h),
 * float matmul through cuBLAS (blas.h), views as geometry; and the
 * compiled path: a hot plan's elementwise and reduce groups as fused
 * kernels (fuse.h), planned on the flush's thread and compiled by NVRTC on a
 * background thread, published to the plan when all are loaded. */
#include "backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cache/kernel_cache.h"
#include "../trace/compile_queue.h"
#include "../vm/interp.h"
#include "../vm/state.h"
#include "blas.h"
#include "cuda.h"
#include "fuse.h"
#include "opgen.h"

/* An input on the host reaches a kernel as a copy: only a trace's 0-d
   weak scalars do (vm_infer_device lets them go anywhere) */
static bool inputs_on_device(int n, vm_tensor *const *values, vm_tensor **ins) {
  for (int i = 0; i < n; i++) {
    ins[i] = values[i]->storage->device == KILN_CUDA ? vm_retain(values[i])
                                                     : vm_value_to_device(values[i], KILN_CUDA);
    if (!ins[i]) {
      while (i-- > 0) vm_release(ins[i]);
      return false;
    }
  }
  return true;
}

static bool run_matmul(vm_tensor *out, vm_tensor **ins) {
  vm_tensor *ab[2] = {NULL, NULL};
  bool ok = true;
  for (int i = 0; i < 2 && ok; i++) /* cuBLAS takes contiguous or transposed matrices */
    ok = (ab[i] = gpu_blas_operand_ok(ins[i], i == 0) ? vm_retain(ins[i])
                                                      : vm_value_copy(ins[i])) != NULL;
  ok = ok && gpu_blas_matmul(out, ab[0], ab[1]);
  vm_release(ab[0]);
  vm_release(ab[1]);
  return ok;
}

/* runs plan p (and frees it) with errors named after api, the call that
   recorded its op, as the interpreter's are; an index check keeps the name
   for when its record is read (jit_gpu/opgen.h) */
static bool run_plan_named(gpu_op_plan *p, const char *api) {
  const char *was = vm_thread()->api;
  vm_set_api(api);
  bool ok = gpu_run_op_plan(p);
  vm_set_api(was);
  gpu_op_plan_free(p);
  return ok;
}

static bool run_generated(vm_opcode op, int n, vm_tensor **ins, vm_tensor *out,
                          const vm_attr *attr) {
  gpu_op_plan p = {0};
  double p0 = gpu_prof_now();
  bool made = gpu_op_plan_make(op, n, ins, out, attr, &p);
  gpu_prof_add(GPU_PROF_PLAN, p0);
  return made && run_plan_named(&p, vm_op_api(op, attr));
}

static vm_tensor *gpu_exec(vm_opcode op, int n, vm_tensor *const *values, const vm_attr *attr,
                           const vm_meta *m) {
  /* views are geometry only; collectives go through the host (vm/dist.h) */
  if (vm_op_table[op].kind == VM_KIND_VIEW || vm_op_table[op].kind == VM_KIND_COLLECTIVE)
    return vm_exec(op, n, values, attr, m);
  atomic_fetch_add_explicit(&vm_process()->stats.eager_ops, 1, memory_order_relaxed);
  vm_tensor *few[4], **ins = n <= 4 ? few : malloc((size_t)n * sizeof *ins);
  if (!ins) {
    vm_error(KILN_ERR_OOM, "out of memory");
    return NULL;
  }
  vm_tensor *out = NULL;
  double p0 = gpu_prof_now(), p1 = p0;
  bool there = inputs_on_device(n, values, ins);
  gpu_prof_add(GPU_PROF_TO_DEVICE, p1);
  if (there) {
    p1 = gpu_prof_now();
    out = vm_tensor_new_on(KILN_CUDA, m->dtype, m->ndim, m->shape);
    gpu_prof_add(GPU_PROF_ALLOC, p1);
    bool matmul = op == VM_OP_matmul && vm_dtype_is_float(m->compute);
    bool ok = out && (out->numel == 0 ||
                      (matmul ? run_matmul(out, ins) : run_generated(op, n, ins, out, attr)));
    if (!ok) {
      vm_release(out);
      out = NULL;
    }
    for (int i = 0; i < n; i++) vm_release(ins[i]);
  }
  if (ins != few) free(ins);
  gpu_prof_add(GPU_PROF_EXEC, p0);
  return out;
}

/* --- the compiled path ------------------------------------------------------------ */

typedef struct gpu_compiled {
  int ngroups;
  gpu_fused_group *k; /* per group; not gpu_fused_ready: group g runs op by op */
} gpu_compiled;

static bool gpu_jit_enabled(void) {
  return vm_env_long("KILN_JIT", 1) != 0 && vm_env_long("KILN_GPU_FUSE", 1) != 0;
}

/* the payoff rule's price, an estimate until it is measured on a GPU (the
   CPU's is fitted to measured compiles): NVRTC at G8's budget of 60 ms a
   kernel, about one fused group per four nodes */
static double gpu_compile_cost_ms(int nodes) { return nodes < 4 ? 60.0 : 15.0 * (double)nodes; }

static void compiled_free(void *p) {
  gpu_compiled *c = p;
  if (!c) return;
  for (int g = 0; g < c->ngroups; g++) {
    gpu_fused_group_free_src(&c->k[g]);
    for (int i = 0; i < c->k[g].nk; i++) gpu_kernel_release(c->k[g].k[i].fn); /* the plan's */
  }
  free(c->k);
  free(c);
}

/* NVRTC + load of every planned kernel of c (on the compiler thread) */
/* NVRTC compiles at once, KILN_COMPILE_JOBS (default half the cores: a
   GPU run leaves the host's cores mostly idle); NVRTC is thread-safe and
   scales with them (2 threads: 57 -> 29 ms per kernel on 2 cores) */
static int nvrtc_jobs(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long jobs = vm_env_long("KILN_COMPILE_JOBS", cpus >= 4 ? cpus / 2 : 1);
  return jobs < 1 ? 1 : jobs > 64 ? 64 : (int)jobs;
}

typedef struct {
  gpu_fused **k;
  gpu_kernel_build **b;
  int n;
  atomic_int next;
} prepare_batch;

static void *prepare_some(void *arg) {
  prepare_batch *pb = arg;
  for (int i; (i = atomic_fetch_add(&pb->next, 1)) < pb->n;)
    pb->b[i] = gpu_kernel_prepare(pb->k[i]->name, pb->k[i]->src);
  return NULL;
}

static void said_not_built(const gpu_fused *k) {
  static atomic_flag said = ATOMIC_FLAG_INIT;
  if (!atomic_flag_test_and_set(&said))
    fprintf(stderr, "kiln: fused GPU kernel %s could not be built (%s); its group runs op by op\n",
            k->name, vm_thread()->message);
  vm_clear_error();
}

/* every kernel of c with a source, one at a time on this thread */
static void load_here(gpu_compiled *c) {
  for (int g = 0; g < c->ngroups; g++)
    for (int i = 0; i < c->k[g].nk; i++) {
      gpu_fused *k = &c->k[g].k[i];
      if (k->src && !(k->fn = gpu_kernel_load(k->name, k->src))) said_not_built(k);
      free(k->src);
      k->src = NULL;
    }
}

/* every kernel of c with a source: the images of the distinct ones made
   on up to nvrtc_jobs() threads (this one among them), then loaded here;
   equal kernels of two groups share the first's */
static void load_kernels(gpu_compiled *c) {
  int n = 0;
  for (int g = 0; g < c->ngroups; g++)
    for (int i = 0; i < c->k[g].nk; i++) n += c->k[g].k[i].src != NULL;
  gpu_fused **ks = calloc((size_t)(n ? n : 1), sizeof *ks),
            **firsts = calloc((size_t)(n ? n : 1), sizeof *firsts);
  gpu_kernel_build **b = calloc((size_t)(n ? n : 1), sizeof *b);
  int *first_of = calloc((size_t)(n ? n : 1), sizeof *first_of), nfirst = 0;
  if (!ks || !firsts || !b || !first_of) {
    load_here(c);
    goto done;
  }
  n = 0;
  for (int g = 0; g < c->ngroups; g++)
    for (int i = 0; i < c->k[g].nk; i++)
      if (c->k[g].k[i].src) ks[n++] = &c->k[g].k[i];
  for (int i = 0; i < n; i++) {
    int j = 0;
    while (j < nfirst && strcmp(firsts[j]->name, ks[i]->name)) j++;
    if (j == nfirst) firsts[nfirst++] = ks[i];
    first_of[i] = j;
  }
  prepare_batch pb = {.k = firsts, .b = b, .n = nfirst};
  atomic_init(&pb.next, 0);
  int helpers = nvrtc_jobs() - 1, started = 0;
  if (helpers > nfirst - 1) helpers = nfirst - 1;
  pthread_t th[64];
  for (int t = 0; t < helpers; t++)
    started += pthread_create(&th[started], NULL, prepare_some, &pb) == 0;
  prepare_some(&pb);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  for (int j = 0; j < nfirst; j++)
    if (!(firsts[j]->fn = gpu_kernel_finish(b[j]))) said_not_built(firsts[j]);
  for (int i = 0; i < n; i++) {
    ks[i]->fn = firsts[first_of[i]]->fn;
    if (ks[i] != firsts[first_of[i]]) gpu_kernel_retain(ks[i]->fn); /* a reference of its own */
    free(ks[i]->src);
    ks[i]->src = NULL;
  }
done:
  free(ks);
  free(firsts);
  free(b);
  free(first_of);
}

typedef struct {
  tr_compile_job job; /* first: the queue's part (trace/compile_queue.h) */
  gpu_compiled *c;
} compile_job;

static void publish(tr_plan *plan, gpu_compiled *c) {
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&plan->jit, &none, c)) compiled_free(c);
}

static void compiler_run(tr_compile_job *queued) {
  compile_job *job = (compile_job *)queued;
  load_kernels(job->c);
  publish(job->job.plan, job->c);
  free(job);
}

/* at exit the queue's plans stay uncompiled: nothing is lost */
static void compiler_drop(tr_compile_job *queued) {
  compile_job *job = (compile_job *)queued;
  compiled_free(job->c);
  free(job);
}

static const tr_compile_ops compiler_ops = {compiler_run, compiler_drop, NULL, false};

/* At exit: NVRTC or the driver torn down under a compile in flight could
   crash, so the compile in flight finishes (one kernel batch) */
static void compiler_stop(void) { tr_compile_stop(KILN_CUDA); }

/* plan's fused kernels, their sources made (the trace is the flush's);
 *planned: the groups fused.  NULL when out of memory: it runs op by op */
static gpu_compiled *fused_kernels(const tr_plan *plan, const tr_trace *t, int *planned) {
  gpu_compiled *c = calloc(1, sizeof *c);
  if (!c || !(c->k = calloc((size_t)(plan->ngroups ? plan->ngroups : 1), sizeof *c->k))) {
    free(c);
    return NULL;
  }
  c->ngroups = plan->ngroups;
  *planned = 0;
  for (int g = 0; g < plan->ngroups; g++) {
    if (!gpu_fuse_group(plan, g, t, &c->k[g])) continue;
    ++*planned;
    if (c->k[g].k[0].kind == GPU_FK_ROWS) g = c->k[g].k[0].through; /* a row kernel covers them */
  }
  return c;
}

/* what the payoff rule prices a kernel at (estimates until measured on a
   GPU): NVRTC at G8's budget, a load from the disk cache */
#define GPU_NVRTC_MS 60.0
#define GPU_DISK_LOAD_MS 1.0

/* The payoff rule's price of plan (vm_backend.plan_cost_ms): its fused
   kernels that are not loaded yet, each NVRTC's or a disk load's.  Fused
   kernels take no extents, so a trace at a new shape whose kernels
   another shape loaded (a loop's segments at a new sequence length) costs
   0 and its plan is ready now (the kernels referenced here), not after
   the compiler thread's queue. */
static double gpu_plan_cost_ms(tr_plan *plan, const tr_trace *t) {
  if (atomic_load(&plan->jit)) return 0;
  int planned = 0;
  gpu_compiled *c = fused_kernels(plan, t, &planned);
  if (!c) return GPU_NVRTC_MS * (double)(plan->ngroups ? plan->ngroups : 1);
  double price = 0;
  for (int g = 0; g < c->ngroups; g++)
    for (int i = 0; i < c->k[g].nk; i++) {
      const gpu_fused *k = &c->k[g].k[i];
      if (!k->src) continue;
      gpu_kernel_source from = gpu_kernel_where(k->name, k->src);
      price += from == GPU_KERNEL_TO_COMPILE ? GPU_NVRTC_MS
               : from == GPU_KERNEL_ON_DISK  ? GPU_DISK_LOAD_MS
                                             : 0;
    }
  if (price > 0) {
    compiled_free(c);
    return price;
  }
  load_here(c); /* each from memory: a lookup, no thread */
  publish(plan, c);
  return 0;
}

/* plans the kernels here (the trace is the flush's), compiles them on the
   compiler thread (KILN_ASYNC=0: here) */
static void gpu_compile(tr_plan *plan, const tr_trace *t) {
  if (atomic_load(&plan->jit)) return; /* ready already (gpu_plan_cost_ms found every kernel) */
  int planned = 0;
  gpu_compiled *c = fused_kernels(plan, t, &planned);
  if (!c) return; /* runs op by op */
  compile_job *job = planned && vm_env_long("KILN_ASYNC", 1) ? malloc(sizeof *job) : NULL;
  if (job) {
    if (tr_compile_start(KILN_CUDA, &compiler_ops, NULL)) atexit(compiler_stop);
    *job = (compile_job){{plan, NULL}, c};
    if (tr_compile_push(KILN_CUDA, &job->job)) return;
    free(job);
  }
  load_kernels(c);
  publish(plan, c);
}

/* kernels ever loaded into the kernel cache: prices hold for one generation */
static long gpu_kernel_generation(void) { return cache_kernel_generation(KILN_CUDA); }

static void gpu_compile_wait(void) { tr_compile_wait(KILN_CUDA); }

static bool gpu_has_kernel(const void *compiled, int g) {
  const gpu_compiled *c = compiled;
  return g < c->ngroups && gpu_fused_ready(&c->k[g]);
}

static vm_tensor *cuda_alloc(kiln_dtype dt, int ndim, const int64_t *shape) {
  return vm_tensor_new_on(KILN_CUDA, dt, ndim, shape);
}

static bool cuda_launch(const gpu_fused *k, const gpu_fargs *args, unsigned grid, unsigned block) {
  gpu_fargs a = *args;
  return gpu_kernel_launch(k->fn, k->name, &a, grid, block);
}

/* a fused kernel's gather: its indices checked by the op path's check
   kernel into the thread's record, named after the op (opgen.h) */
static bool cuda_check_indices(vm_tensor *idx, int64_t size, int axis, const char *api) {
  gpu_op_plan p;
  return gpu_op_plan_index_check(idx, size, axis, &p) && run_plan_named(&p, api);
}

static const gpu_fuse_target cuda_target = {KILN_CUDA, cuda_alloc, cuda_launch, cuda_check_indices};

static bool gpu_group(const void *compiled, const tr_plan *plan, const tr_trace *t, int g,
                      vm_tensor **vals, int *rc, int *resume, int *last_group) {
  const gpu_compiled *c = compiled;
  if (!gpu_has_kernel(c, g)) return false;
  double p0 = gpu_prof_now();
  bool ran = gpu_fused_run(&c->k[g], &cuda_target, plan, t, vals, rc, resume, last_group);
  gpu_prof_add(GPU_PROF_FUSED, p0);
  return ran;
}

const vm_backend gpu_backend = {
    .device = KILN_CUDA,
    .name = "cuda",
    .unavailable = gpu_unavailable,
    .info = gpu_info,
    .alloc = gpu_mem_alloc,
    .free = gpu_mem_free,
    .to_host = gpu_copy_to_host,
    .from_host = gpu_copy_from_host,
    .copy = gpu_copy_on_device,
    .total_memory = gpu_total_memory,
    .exec = gpu_exec,
    .attention_max_head = GPU_ATT_MAX_HEAD, /* opgen.c plan_attention */
    .jit_enabled = gpu_jit_enabled,
    .compile_cost_ms = gpu_compile_cost_ms,
    .plan_cost_ms = gpu_plan_cost_ms,
    .kernel_generation = gpu_kernel_generation,
    .compile = gpu_compile,
    .compile_wait = gpu_compile_wait,
    .plan_free = compiled_free,
    .has_kernel = gpu_has_kernel,
    .run_group = gpu_group,
    .fuses_gathers =
        true, /* fuse.c: indirect loads; scatters, concats and arg-scans per output element */
};
