/* test_gpu_codegen.c — the GPU interpreter's kernels without a GPU: NVRTC
 * compiles the source of every key gpu_op_keys lists (sm_90 cubins, plus
 * sm_80 and a PTX fallback for an unknown device), names are unique and
 * each source holds exactly its entry, and the planner picks the expected
 * keys, layout classes, coalesced extents and strides, grids and scratch
 * for calls on fake device values (host tensors: the planner only reads
 * geometry and addresses).  Skips the compiles, saying why, when NVRTC is
 * not installed. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "../jit_gpu/dump.h"
#include "../jit_gpu/nvrtc.h"
#include "../jit_gpu/opgen.h"
#include "../vm/fold.h"
#include "../vm/tensor.h"
#include "ktest.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define MAX_KEYS 4096

static gpu_op_key all_keys[MAX_KEYS];
static int nkeys;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool key_eq(const gpu_op_key *a, const gpu_op_key *b) { return !memcmp(a, b, sizeof *a); }

static bool key_listed(const gpu_op_key *k) {
  for (int i = 0; i < nkeys; i++)
    if (key_eq(&all_keys[i], k)) return true;
  return false;
}

static const char *key_name(const gpu_op_key *k) {
  static char buf[128];
  gpu_op_key_name(k, buf, sizeof buf);
  return buf;
}

/* --- keys, names, sources ---------------------------------------------------------- */

TEST(key_list_is_complete_and_bounded) {
  int n = gpu_op_keys(NULL, 0);
  CHECK(n > 0 && n <= MAX_KEYS);
  CHECK_EQ_INT(gpu_op_keys(all_keys, MAX_KEYS), n);
  nkeys = n;
  /* every primitive but views, the input leaf, collectives (the
     distributed engine runs them, through the host) and the CPU's
     convolution primitives (fe_conv2d composes GPU ones) have keys;
     attention's are 2 dtypes x 2 head sizes per pass */
  for (int op = 0; op < VM_OP_COUNT; op++) {
    int have = 0;
    for (int i = 0; i < n; i++) have += all_keys[i].op == op;
    bool none = vm_op_table[op].kind == VM_KIND_VIEW ||
                vm_op_table[op].kind == VM_KIND_COLLECTIVE ||
                vm_op_table[op].kind == VM_KIND_CONV || op == VM_OP_input;
    if (none ? have != 0 : have == 0) KTEST_FAIL("op %s has %d keys", vm_op_table[op].name, have);
    if (vm_op_table[op].kind == VM_KIND_ATTENTION)
      CHECK_EQ_INT(have, op == VM_OP_attention ? 4 : 12); /* FWD; ROWS, DQ, DKDV */
  }
  for (int i = 0; i < n; i++) CHECK(gpu_op_key_supported(&all_keys[i]));
  printf("test_gpu_codegen: %d kernel keys\n", n);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

TEST(key_names_are_unique) {
  char **names = calloc((size_t)nkeys, sizeof *names);
  for (int i = 0; i < nkeys; i++) names[i] = strdup(key_name(&all_keys[i]));
  qsort(names, (size_t)nkeys, sizeof *names, cmp_str);
  for (int i = 1; i < nkeys; i++)
    if (!strcmp(names[i - 1], names[i])) KTEST_FAIL("two keys are named %s", names[i]);
  for (int i = 0; i < nkeys; i++) free(names[i]);
  free(names);
  gpu_op_key k = {.op = VM_OP_add,
                  .nin = 2,
                  .out_dtype = KILN_F32,
                  .in_dtype = {KILN_F32, KILN_F32},
                  .contiguous = 7};
  CHECK_STR_CONTAINS(key_name(&k), "k_add_f32_f32_f32_c7");
}

static int count_occurrences(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

TEST(each_source_holds_exactly_its_entry) {
  for (int i = 0; i < nkeys; i++) {
    char *src = gpu_op_source(&all_keys[i]);
    if (!src) {
      KTEST_FAIL("no source for %s: %s", key_name(&all_keys[i]), kiln_last_error());
      continue;
    }
    char entry[256];
    snprintf(entry, sizeof entry, " %s(const __grid_constant__ gpu_args a)",
             key_name(&all_keys[i]));
    if (count_occurrences(src, "extern \"C\" __global__") != 1 ||
        count_occurrences(src, entry) != 1)
      KTEST_FAIL("the source of %s does not hold exactly its entry", key_name(&all_keys[i]));
    if (strstr(src, "#include"))
      KTEST_FAIL("the source of %s has an #include", key_name(&all_keys[i]));
    free(src);
  }
  /* a batch: the shared definitions once, every entry once */
  char *batch = gpu_op_source_batch(all_keys, 3);
  CHECK(batch && count_occurrences(batch, "extern \"C\" __global__") == 3);
  CHECK(batch && count_occurrences(batch, "struct gpu_args {") == 1);
  free(batch);
  gpu_op_key bad = {.op = VM_OP_reshape, .nin = 1};
  kiln_clear_error();
  CHECK(gpu_op_source(&bad) == NULL);
  CHECK_STR_CONTAINS(kiln_last_error(), "no GPU kernel");
  kiln_clear_error();
}

/* --- NVRTC ------------------------------------------------------------------------- */

#define BATCH 12 /* kernels per NVRTC program: NVRTC's cost is mostly per program */

typedef struct {
  atomic_int next;
  atomic_int failed;
  int cc;
} compile_job;

/* the first key of keys[0, n) that fails alone, with its source and log */
static void report_failure(const gpu_op_key *keys, int n, int cc) {
  for (int i = 0; i < n; i++) {
    char *src = gpu_op_source(&keys[i]), *log = NULL;
    gpu_image img;
    if (src && gpu_nvrtc_compile(src, key_name(&keys[i]), cc, &img, &log)) {
      gpu_image_free(&img);
      free(src);
      continue;
    }
    fprintf(stderr, "NVRTC failed on %s (sm_%d):\n%s\n--- source ---\n%s\n", key_name(&keys[i]), cc,
            log ? log : "(no log)", src ? src : "(none)");
    free(log);
    free(src);
    return;
  }
  fprintf(stderr, "a batch of %d kernels failed to compile together but each compiles alone\n", n);
}

/* KILN_CODEGEN_NVRTC_SAMPLE=n: NVRTC compiles one batch in n (the
   sanitizer build: the sources are generated, and checked, all the same) */
static int nvrtc_sample(void) {
  const char *s = getenv("KILN_CODEGEN_NVRTC_SAMPLE");
  int n = s ? atoi(s) : 1;
  return n > 1 ? n : 1;
}

static void *compile_worker(void *p) {
  compile_job *job = p;
  int sample = nvrtc_sample();
  for (;;) {
    int first = atomic_fetch_add(&job->next, BATCH);
    if (first >= nkeys) return NULL;
    int n = nkeys - first < BATCH ? nkeys - first : BATCH;
    char *src = gpu_op_source_batch(all_keys + first, n), *log = NULL;
    if (src && (first / BATCH) % sample) {
      free(src);
      continue;
    }
    gpu_image img;
    if (src && gpu_nvrtc_compile(src, "kiln_batch.cu", job->cc, &img, &log) && img.size > 0 &&
        !img.ptx) {
      gpu_image_free(&img);
    } else {
      if (atomic_fetch_add(&job->failed, 1) == 0) report_failure(all_keys + first, n, job->cc);
    }
    free(log);
    free(src);
  }
}

TEST(nvrtc_compiles_every_kernel_for_sm_90) {
  char why[512];
  if (!gpu_nvrtc_available(why, sizeof why)) {
    printf("test_gpu_codegen: NVRTC compiles skipped: %s\n", why);
    return;
  }
  int threads = 2;
  compile_job job = {.cc = 90};
  double t0 = now_s();
  pthread_t tid[2];
  for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, compile_worker, &job);
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double dt = now_s() - t0;
  CHECK_EQ_INT(atomic_load(&job.failed), 0);
  printf(
      "test_gpu_codegen: NVRTC %d.%d compiled %d kernels (one batch in %d) for sm_90 in %.1f s (%d "
      "threads, %d per program)\n",
      gpu_nvrtc_version() / 1000, gpu_nvrtc_version() % 1000 / 10, nkeys, nvrtc_sample(), dt,
      threads, BATCH);
}

TEST(nvrtc_targets_sm_80_and_falls_back_to_ptx) {
  if (!gpu_nvrtc_available(NULL, 0)) return;
  CHECK(gpu_nvrtc_version() >= 13000);
  gpu_op_key k = {.op = VM_OP_sum,
                  .variant = GPU_RED_LANE,
                  .nin = 1,
                  .out_dtype = KILN_F32,
                  .in_dtype = {KILN_F32},
                  .contiguous = 3};
  char *src = gpu_op_source(&k), *log = NULL;
  gpu_image img;
  CHECK(src && gpu_nvrtc_compile(src, "sum.cu", 80, &img, &log));
  if (!log) {
    CHECK(!img.ptx && !strcmp(img.arch, "sm_80") && img.size > 0);
    gpu_image_free(&img);
  }
  free(log);
  log = NULL;
  /* a device NVRTC does not know: PTX for the highest compute arch it has */
  CHECK(src && gpu_nvrtc_compile(src, "sum.cu", 999, &img, &log));
  if (!log) {
    CHECK(img.ptx && !strncmp(img.arch, "compute_", 8) && img.size > 0);
    CHECK(strstr((const char *)img.data, ".entry") != NULL);
    CHECK(strstr((const char *)img.data, key_name(&k)) != NULL);
    gpu_image_free(&img);
  }
  free(log);
  log = NULL;
  /* no arch at or below cc 1.0 */
  CHECK(!gpu_nvrtc_compile(src, "sum.cu", 10, &img, &log));
  CHECK_STR_CONTAINS(log, "knows no architecture");
  free(log);
  log = NULL;
  /* a compile error comes back with NVRTC's log */
  CHECK(!gpu_nvrtc_compile("extern \"C\" __global__ void k() { undeclared(); }", "bad.cu", 90, &img,
                           &log));
  CHECK_STR_CONTAINS(log, "NVRTC_ERROR_COMPILATION");
  CHECK_STR_CONTAINS(log, "undeclared");
  free(log);
  free(src);
}

static char *slurp(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 20);
  if (buf && fread(buf, 1, (1 << 20) - 1, f) == 0 && ferror(f)) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  return buf;
}

/* KILN_DUMP of a compiled kernel: its CUDA C, cubin, PTX (a second NVRTC
   run for the virtual architecture), SASS where cuobjdump is, and a line
   in gpu-kernels.tsv with NVRTC's time */
TEST(dump_writes_source_ptx_and_the_manifest) {
  if (!gpu_nvrtc_available(NULL, 0)) return;
  gpu_op_key k = {.op = VM_OP_sum,
                  .variant = GPU_RED_LANE,
                  .nin = 1,
                  .out_dtype = KILN_F32,
                  .in_dtype = {KILN_F32},
                  .contiguous = 3};
  char *src = gpu_op_source(&k), *log = NULL;
  gpu_image img;
  CHECK(src && gpu_nvrtc_compile(src, key_name(&k), 90, &img, &log));
  CHECK(img.ms > 0);
  char dir[] = "/tmp/kiln-gpu-dump-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  setenv("KILN_DUMP", dir, 1);
  gpu_dump_kernel(key_name(&k), src, img.data, img.size, img.ptx, img.arch, 90, "nvrtc", img.ms);
  unsetenv("KILN_DUMP");
  char name[160];
  snprintf(name, sizeof name, "kernel-%s.cu", key_name(&k));
  char *cu = slurp(dir, name);
  CHECK(cu && !strcmp(cu, src));
  snprintf(name, sizeof name, "kernel-%s.ptx", key_name(&k));
  char *ptx = slurp(dir, name);
  CHECK(ptx && strstr(ptx, ".entry") && strstr(ptx, key_name(&k)) && strstr(ptx, ".target sm_90"));
  snprintf(name, sizeof name, "kernel-%s.cubin", key_name(&k));
  char *cubin = slurp(dir, name);
  CHECK(cubin && !memcmp(cubin, "\177ELF", 4)); /* a cubin is an ELF image */
  char *tsv = slurp(dir, "gpu-kernels.tsv");
  char expect[200];
  snprintf(expect, sizeof expect, "%s\tnvrtc\tsm_90\t", key_name(&k));
  CHECK(tsv && strstr(tsv, expect));
  free(cu), free(ptx), free(cubin), free(tsv);
  /* clean up: every file, then the directory */
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(dir);
  gpu_image_free(&img);
  free(log);
  free(src);
}

TEST(a_layout_mismatch_fails_the_compile) {
  if (!gpu_nvrtc_available(NULL, 0)) return;
  gpu_op_key k = {
      .op = VM_OP_copy, .nin = 1, .out_dtype = KILN_F32, .in_dtype = {KILN_F32}, .contiguous = 3};
  char *src = gpu_op_source(&k), *log = NULL;
  char want[64];
  snprintf(want, sizeof want, "== %zu, \"gpu_args.n:", offsetof(gpu_args, n));
  char *at = src ? strstr(src, want) : NULL;
  CHECK(at != NULL);
  if (at) {
    at[3] = '1'; /* claim another offset */
    gpu_image img;
    CHECK(!gpu_nvrtc_compile(src, "bad.cu", 90, &img, &log));
    CHECK_STR_CONTAINS(log, "host and device layouts differ");
  }
  free(log);
  free(src);
}

/* --- the planner --------------------------------------------------------------------- */

static vm_tensor *host(kiln_dtype dt, int ndim, const int64_t *shape) {
  return vm_tensor_new(dt, ndim, shape);
}

/* plans op, checks every key is listed, returns the plan (caller frees) */
static gpu_op_plan plan(vm_opcode op, int n, vm_tensor *const *in, vm_tensor *out,
                        const vm_attr *attr) {
  gpu_op_plan p;
  kiln_clear_error();
  if (!gpu_op_plan_make(op, n, in, out, attr, &p)) {
    KTEST_FAIL("gpu_op_plan_make(%s) failed: %s", vm_op_table[op].name, kiln_last_error());
    memset(&p, 0, sizeof p);
    return p;
  }
  for (int i = 0; i < p.nlaunch; i++) {
    const gpu_launch *l = &p.launch[i];
    if (!key_listed(&l->key)) KTEST_FAIL("planned key %s is not in gpu_op_keys", key_name(&l->key));
    if (l->grid[0] < 1 || l->grid[0] > 8192 || l->grid[1] != 1 || l->grid[2] != 1)
      KTEST_FAIL("%s: grid %u,%u,%u", key_name(&l->key), l->grid[0], l->grid[1], l->grid[2]);
    if (l->block[0] < 32 || l->block[0] > 256 || l->block[0] % 32 || l->block[1] != 1 ||
        l->block[2] != 1)
      KTEST_FAIL("%s: block %u,%u,%u", key_name(&l->key), l->block[0], l->block[1], l->block[2]);
    if (l->args.ndim < 0 || l->args.ndim > KILN_MAX_DIMS)
      KTEST_FAIL("%s: ndim %d", key_name(&l->key), l->args.ndim);
  }
  return p;
}

#define CHECK_KEY(l, name) CHECK_STR_CONTAINS(key_name(&(l)->key), name)
#define CHECK_SHAPE(a, ...)                                                                     \
  do {                                                                                          \
    const int64_t want_[] = {__VA_ARGS__};                                                      \
    int nd_ = (int)(sizeof want_ / sizeof want_[0]);                                            \
    CHECK_EQ_INT((a)->ndim, nd_);                                                               \
    for (int d_ = 0; d_ < nd_ && d_ < (a)->ndim; d_++) CHECK_EQ_INT((a)->shape[d_], want_[d_]); \
  } while (0)
#define CHECK_STRIDES(a, k, ...)                                       \
  do {                                                                 \
    const int64_t want_[] = {__VA_ARGS__};                             \
    for (int d_ = 0; d_ < (int)(sizeof want_ / sizeof want_[0]); d_++) \
      CHECK_EQ_INT((a)->stride[k][d_], want_[d_]);                     \
  } while (0)

TEST(plan_contiguous_add) {
  vm_tensor *a = host(KILN_F32, 2, S(40, 50)), *b = host(KILN_F32, 2, S(40, 50)),
            *o = host(KILN_F32, 2, S(40, 50));
  gpu_op_plan p = plan(VM_OP_add, 2, (vm_tensor *[]){a, b}, o, NULL);
  CHECK_EQ_INT(p.nlaunch, 1);
  if (p.nlaunch == 1) {
    const gpu_launch *l = &p.launch[0];
    CHECK(!strcmp(key_name(&l->key), "k_add_f32_f32_f32_c7"));
    CHECK_SHAPE(&l->args, 2000);
    CHECK_EQ_INT(l->args.n, 2000);
    CHECK(l->args.ptr[0] == vm_data(o) && l->args.ptr[1] == vm_data(a) &&
          l->args.ptr[2] == vm_data(b));
    CHECK_EQ_INT(l->grid[0], 8);
    CHECK_EQ_INT(l->block[0], 256);
    CHECK_EQ_INT(l->scratch_mask, 0);
  }
  CHECK_EQ_INT(p.scratch_bytes, 0);
  CHECK(!gpu_op_plan_has_index_check(&p));
  gpu_op_plan_free(&p);
  /* a huge one: the grid is capped, the loop strides over the rest */
  vm_tensor *big = host(KILN_I32, 1, S(1 << 24)), *bo = host(KILN_I32, 1, S(1 << 24));
  p = plan(VM_OP_mul, 2, (vm_tensor *[]){big, big}, bo, NULL);
  if (p.nlaunch == 1) CHECK_EQ_INT(p.launch[0].grid[0], 8192);
  gpu_op_plan_free(&p);
  vm_release(big);
  vm_release(bo);
  vm_release(a);
  vm_release(b);
  vm_release(o);
}

TEST(plan_broadcast_add) {
  vm_tensor *a = host(KILN_F64, 2, S(4, 3)), *b = host(KILN_F64, 1, S(3)),
            *o = host(KILN_F64, 2, S(4, 3));
  gpu_op_plan p = plan(VM_OP_add, 2, (vm_tensor *[]){a, b}, o, NULL);
  if (p.nlaunch == 1) {
    const gpu_args *g = &p.launch[0].args;
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_add_f64_f64_f64_c3")); /* b is strided */
    CHECK_SHAPE(g, 4, 3);
    CHECK_STRIDES(g, 0, 3, 1);
    CHECK_STRIDES(g, 1, 3, 1);
    CHECK_STRIDES(g, 2, 0, 1);
  }
  gpu_op_plan_free(&p);
  /* a 0-d operand: stride 0 everywhere, after coalescing one dim */
  vm_tensor *s = host(KILN_F64, 0, NULL);
  p = plan(VM_OP_mul, 2, (vm_tensor *[]){s, a}, o, NULL);
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_mul_f64_f64_f64_c5"));
    CHECK_SHAPE(&p.launch[0].args, 12);
    CHECK_STRIDES(&p.launch[0].args, 1, 0);
  }
  gpu_op_plan_free(&p);
  vm_release(s);
  vm_release(a);
  vm_release(b);
  vm_release(o);
}

TEST(plan_permuted_input) {
  vm_tensor *base = host(KILN_F32, 2, S(3, 4));
  vm_tensor *t = vm_tensor_view(base, 2, S(4, 3), S(1, 4), 0); /* base transposed */
  vm_tensor *o = host(KILN_F32, 2, S(4, 3));
  gpu_op_plan p = plan(VM_OP_exp, 1, (vm_tensor *[]){t}, o, NULL);
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_exp_f32_f32_c1"));
    CHECK_SHAPE(&p.launch[0].args, 4, 3);
    CHECK_STRIDES(&p.launch[0].args, 1, 1, 4);
  }
  gpu_op_plan_free(&p);
  vm_release(t);
  vm_release(base);
  vm_release(o);
}

TEST(plan_cast_where_and_leaves) {
  vm_tensor *f = host(KILN_F32, 1, S(10)), *i = host(KILN_I32, 1, S(10)),
            *f2 = host(KILN_F32, 1, S(10));
  gpu_op_plan p = plan(VM_OP_cast, 1, (vm_tensor *[]){f}, i, &(vm_attr){.dtype = KILN_I32});
  if (p.nlaunch == 1) CHECK(!strcmp(key_name(&p.launch[0].key), "k_cast_i32_f32_c3"));
  gpu_op_plan_free(&p);
  p = plan(VM_OP_cast, 1, (vm_tensor *[]){f}, f2, &(vm_attr){.dtype = KILN_F32});
  if (p.nlaunch == 1) CHECK(!strcmp(key_name(&p.launch[0].key), "k_copy_f32_f32_c3"));
  gpu_op_plan_free(&p);

  vm_tensor *c = host(KILN_BOOL, 2, S(4, 1)), *x = host(KILN_F32, 2, S(4, 3)),
            *y = host(KILN_F32, 0, NULL);
  vm_tensor *o = host(KILN_F32, 2, S(4, 3));
  p = plan(VM_OP_where, 3, (vm_tensor *[]){c, x, y}, o, NULL);
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_where_f32_b8_f32_f32_c5"));
    CHECK_SHAPE(&p.launch[0].args, 4, 3);
    CHECK_STRIDES(&p.launch[0].args, 1, 1, 0);
    CHECK_STRIDES(&p.launch[0].args, 3, 0, 0);
  }
  gpu_op_plan_free(&p);

  vm_attr fa = {.dtype = KILN_F32, .scalar = {2.5, 0}};
  p = plan(VM_OP_full, 0, NULL, f, &fa);
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_full_f32_c1"));
    CHECK_EQ_INT(p.launch[0].args.n, 10);
    CHECK(p.launch[0].args.scalar[0] == 2.5);
  }
  gpu_op_plan_free(&p);
  vm_tensor *r = host(KILN_I64, 1, S(7));
  p = plan(VM_OP_arange, 0, NULL, r, &(vm_attr){.dtype = KILN_I64, .scalar = {1, 2}});
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_arange_i64_c1"));
    CHECK(p.launch[0].args.scalar[0] == 1 && p.launch[0].args.scalar[1] == 2);
  }
  gpu_op_plan_free(&p);
  /* rand: a thread per Philox block (4 f32 or 2 f64 values) */
  p = plan(VM_OP_rand, 0, NULL, f, &(vm_attr){.dtype = KILN_F32, .seed = 7, .counter = 100});
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_rand_f32_c1"));
    CHECK_EQ_INT(p.launch[0].args.n, 3);
    CHECK_EQ_INT(p.launch[0].args.extent[0], 10);
    CHECK(p.launch[0].args.seed == 7 && p.launch[0].args.counter == 100);
  }
  gpu_op_plan_free(&p);
  vm_tensor *d = host(KILN_F64, 1, S(5));
  p = plan(VM_OP_randn, 0, NULL, d, &(vm_attr){.dtype = KILN_F64});
  if (p.nlaunch == 1) CHECK_EQ_INT(p.launch[0].args.n, 3);
  gpu_op_plan_free(&p);
  vm_tensor *all[] = {f, i, f2, c, x, y, o, r, d};
  for (int k = 0; k < 9; k++) vm_release(all[k]);
}

TEST(plan_reduce_last_axis) {
  vm_tensor *a = host(KILN_F32, 2, S(8, 1000)), *o = host(KILN_F32, 1, S(8));
  gpu_op_plan p = plan(VM_OP_sum, 1, (vm_tensor *[]){a}, o, &(vm_attr){.axes_mask = 2});
  CHECK_EQ_INT(p.nlaunch, 1);
  if (p.nlaunch == 1) {
    const gpu_launch *l = &p.launch[0];
    CHECK(!strcmp(key_name(&l->key), "k_sum_lane_f32_f32_c3"));
    CHECK_SHAPE(&l->args, 8, 1000);
    CHECK_EQ_INT(l->args.axis, 1);
    CHECK_STRIDES(&l->args, 1, 1000, 1);
    CHECK_EQ_INT(l->args.n, 8);
    CHECK_EQ_INT(l->args.extent[0], 1000);
    CHECK_EQ_INT(l->args.extent[1], 1000);
    CHECK_EQ_INT(l->args.extent[2], 1);
    CHECK_EQ_INT(l->args.extent[3], 1);
    CHECK_EQ_INT(l->grid[0], 1); /* 8 outputs, a warp each */
    CHECK(l->args.ptr[0] == vm_data(o));
  }
  CHECK_EQ_INT(p.scratch_bytes, 0);
  gpu_op_plan_free(&p);
  /* argmax along the last axis of an integer matrix */
  vm_tensor *ia = host(KILN_I32, 2, S(6, 50)), *io = host(KILN_I64, 1, S(6));
  p = plan(VM_OP_argmax, 1, (vm_tensor *[]){ia}, io, &(vm_attr){.axes_mask = 2});
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_argmax_i64_i32_c3"));
    CHECK_SHAPE(&p.launch[0].args, 6, 50);
    CHECK_EQ_INT(p.launch[0].args.axis, 1);
    CHECK_EQ_INT(p.launch[0].args.n, 6);
    CHECK_EQ_INT(p.launch[0].args.extent[3], 2); /* 50 values: two warps */
  }
  gpu_op_plan_free(&p);
  vm_release(ia);
  vm_release(io);
  vm_release(a);
  vm_release(o);
}

TEST(plan_reduce_first_axis) {
  vm_tensor *a = host(KILN_F32, 2, S(1000, 8)), *o = host(KILN_F32, 1, S(8));
  gpu_op_plan p = plan(VM_OP_sum, 1, (vm_tensor *[]){a}, o, &(vm_attr){.axes_mask = 1});
  if (p.nlaunch == 1) {
    const gpu_launch *l = &p.launch[0];
    CHECK(!strcmp(key_name(&l->key), "k_sum_col_f32_f32_c1"));
    CHECK_SHAPE(&l->args, 8, 1000);
    CHECK_STRIDES(&l->args, 1, 1, 8);
    CHECK_EQ_INT(l->args.axis, 1);
    CHECK_EQ_INT(l->args.n, 8);
  } else {
    KTEST_FAIL("%d launches", p.nlaunch);
  }
  gpu_op_plan_free(&p);
  /* few outputs, long columns: a thread per fold block, then a join in
     the accumulator type (f64 for an f32 sum) */
  vm_tensor *tall = host(KILN_F32, 2, S(10000, 8));
  p = plan(VM_OP_sum, 1, (vm_tensor *[]){tall}, o, &(vm_attr){.axes_mask = 1});
  CHECK_EQ_INT(p.nlaunch, 2);
  if (p.nlaunch == 2) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_sum_colpart_f32_f32_c1"));
    CHECK_EQ_INT(p.launch[0].args.n, 8 * 3);
    CHECK_EQ_INT(p.launch[0].args.extent[1], VM_FOLD_BLOCK);
    CHECK_EQ_INT(p.launch[0].scratch_mask, 1);
    CHECK(p.launch[0].args.ptr[0] == NULL);
    CHECK(!strcmp(key_name(&p.launch[1].key), "k_sum_coljoin_f32_f32_c3"));
    CHECK_EQ_INT(p.launch[1].scratch_mask, 2);
    CHECK_EQ_INT(p.launch[1].args.extent[2], 3);
    CHECK(p.launch[1].args.ptr[0] == vm_data(o));
  }
  CHECK_EQ_INT(p.scratch_bytes, 8 * 3 * 8);
  gpu_op_plan_free(&p);
  /* the middle axis of a 3-d tensor: kept dims on both sides */
  vm_tensor *m = host(KILN_I64, 3, S(2, 5, 3)), *mo = host(KILN_I64, 2, S(2, 3));
  p = plan(VM_OP_max, 1, (vm_tensor *[]){m}, mo, &(vm_attr){.axes_mask = 2});
  if (p.nlaunch == 1) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_max_col_i64_i64_c1"));
    CHECK_SHAPE(&p.launch[0].args, 2, 3, 5);
    CHECK_STRIDES(&p.launch[0].args, 1, 15, 1, 3);
  }
  gpu_op_plan_free(&p);
  vm_release(m);
  vm_release(mo);
  vm_release(tall);
  vm_release(a);
  vm_release(o);
}

TEST(plan_reduce_everything_two_passes) {
  vm_tensor *a = host(KILN_F32, 2, S(1000, 1000)), *o = host(KILN_F32, 0, NULL);
  gpu_op_plan p = plan(VM_OP_sum, 1, (vm_tensor *[]){a}, o, &(vm_attr){.axes_mask = 3});
  CHECK_EQ_INT(p.nlaunch, 2);
  if (p.nlaunch == 2) {
    const gpu_launch *l = &p.launch[0], *j = &p.launch[1];
    int64_t chunks = (1000000 + VM_FOLD_CHUNK - 1) / VM_FOLD_CHUNK;
    CHECK(!strcmp(key_name(&l->key), "k_sum_lane_f32_f32_c3"));
    CHECK_SHAPE(&l->args, 1000000);
    CHECK_EQ_INT(l->args.axis, 0);
    CHECK_EQ_INT(l->args.n, chunks);
    CHECK_EQ_INT(l->args.extent[1], VM_FOLD_CHUNK);
    CHECK_EQ_INT(l->args.extent[2], chunks);
    CHECK_EQ_INT(l->args.extent[3], 8);
    CHECK_EQ_INT(l->grid[0], chunks); /* 8 warps per chunk */
    CHECK_EQ_INT(l->scratch_mask, 1);
    CHECK(!strcmp(key_name(&j->key), "k_sum_lanejoin_f32_f32_c3"));
    CHECK_EQ_INT(j->scratch_mask, 2);
    CHECK_EQ_INT(j->args.n, 1);
    CHECK_EQ_INT(j->args.extent[2], chunks);
    CHECK(j->args.ptr[0] == vm_data(o));
    CHECK_EQ_INT(p.scratch_bytes, chunks * 4);
  }
  gpu_op_plan_free(&p);
  /* an empty reduction: the identity */
  vm_tensor *e = host(KILN_F64, 2, S(3, 0)), *eo = host(KILN_F64, 1, S(3));
  p = plan(VM_OP_prod, 1, (vm_tensor *[]){e}, eo, &(vm_attr){.axes_mask = 2});
  if (p.nlaunch == 1) {
    CHECK_EQ_INT(p.launch[0].args.extent[0], 0);
    CHECK_EQ_INT(p.launch[0].args.extent[1], 1);
  }
  gpu_op_plan_free(&p);
  vm_release(e);
  vm_release(eo);
  vm_release(a);
  vm_release(o);
}

TEST(plan_index_ops) {
  vm_tensor *a = host(KILN_F32, 2, S(5, 3)), *idx = host(KILN_I64, 1, S(4)),
            *o = host(KILN_F32, 2, S(4, 3));
  gpu_op_plan p = plan(VM_OP_index_select, 2, (vm_tensor *[]){a, idx}, o, &(vm_attr){.axis = 0});
  CHECK_EQ_INT(p.nlaunch, 2);
  CHECK_EQ_INT(p.scratch_bytes, 0); /* the check writes the thread's record */
  CHECK(gpu_op_checks_indices(VM_OP_index_select) && !gpu_op_checks_indices(VM_OP_add));
  CHECK(gpu_op_plan_has_index_check(&p));
  if (p.nlaunch == 2) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_index_select_check_i64_i64_c3"));
    CHECK_EQ_INT(p.launch[0].check_mask, 1);
    CHECK_EQ_INT(p.launch[0].scratch_mask, 0);
    CHECK_EQ_INT(p.launch[0].args.n, 4);
    CHECK_EQ_INT(p.launch[0].args.extent[0], 5);
    const gpu_launch *l = &p.launch[1];
    CHECK(!strcmp(key_name(&l->key), "k_index_select_f32_f32_i64_c1"));
    CHECK_SHAPE(&l->args, 4, 3);
    CHECK_EQ_INT(l->args.axis, 0);
    CHECK_STRIDES(&l->args, 1, 3, 1);
    CHECK_STRIDES(&l->args, 2, 1, 0);
    CHECK_EQ_INT(l->args.extent[0], 5);
    CHECK_EQ_INT(l->scratch_mask, 0);
    CHECK_EQ_INT(l->check_mask, 0);
  }
  gpu_op_plan_free(&p);

  vm_tensor *g = host(KILN_F64, 2, S(3, 4)), *gi = host(KILN_I64, 2, S(3, 2)),
            *go = host(KILN_F64, 2, S(3, 2));
  p = plan(VM_OP_gather, 2, (vm_tensor *[]){g, gi}, go, &(vm_attr){.axis = 1});
  CHECK_EQ_INT(p.nlaunch, 2);
  if (p.nlaunch == 2) {
    const gpu_launch *l = &p.launch[1];
    CHECK(!strcmp(key_name(&l->key), "k_gather_f64_f64_i64_c1"));
    CHECK_SHAPE(&l->args, 3, 2);
    CHECK_EQ_INT(l->args.axis, 1);
    CHECK_STRIDES(&l->args, 1, 4, 1);
    CHECK_STRIDES(&l->args, 2, 2, 1);
    CHECK_EQ_INT(l->args.extent[0], 4);
  }
  gpu_op_plan_free(&p);

  /* scatter_add: the index covers 2 of the 3 rows along axis 0 */
  vm_tensor *s = host(KILN_I32, 2, S(3, 4)), *si = host(KILN_I64, 2, S(2, 4)),
            *ss = host(KILN_I32, 2, S(2, 4));
  vm_tensor *so = host(KILN_I32, 2, S(3, 4));
  p = plan(VM_OP_scatter_add, 3, (vm_tensor *[]){s, si, ss}, so, &(vm_attr){.axis = 0});
  CHECK_EQ_INT(p.nlaunch, 2);
  if (p.nlaunch == 2) {
    const gpu_launch *l = &p.launch[1];
    CHECK(!strcmp(key_name(&l->key), "k_scatter_add_i32_i32_i64_i32_c1"));
    CHECK_SHAPE(&l->args, 3, 4);
    CHECK_EQ_INT(l->args.axis, 0);
    CHECK_STRIDES(&l->args, 0, 2, 4); /* the index's extents */
    CHECK_STRIDES(&l->args, 1, 4, 1);
    CHECK_STRIDES(&l->args, 2, 4, 1);
    CHECK_STRIDES(&l->args, 3, 4, 1);
    CHECK(l->args.ptr[3] == vm_data(ss));
  }
  gpu_op_plan_free(&p);
  /* the index expanded along the other dim (index_select's VJP): stride 0,
     and dims that match merge around the axis */
  vm_tensor *e3 = host(KILN_F32, 3, S(6, 5, 4)), *ebase = host(KILN_I64, 1, S(3));
  vm_tensor *ei = vm_tensor_view(ebase, 3, S(6, 3, 4), S(0, 1, 0), 0),
            *es = host(KILN_F32, 3, S(6, 3, 4));
  vm_tensor *eo = host(KILN_F32, 3, S(6, 5, 4));
  p = plan(VM_OP_scatter_add, 3, (vm_tensor *[]){e3, ei, es}, eo, &(vm_attr){.axis = 1});
  CHECK_EQ_INT(p.nlaunch, 2);
  if (p.nlaunch == 2) {
    CHECK(
        !strcmp(key_name(&p.launch[0].key), "k_index_select_check_i64_i64_c1")); /* strided index */
    const gpu_args *l = &p.launch[1].args;
    CHECK_SHAPE(l, 6, 5, 4);
    CHECK_STRIDES(l, 0, 6, 3, 4);
    CHECK_STRIDES(l, 2, 0, 1, 0);
  }
  gpu_op_plan_free(&p);
  vm_tensor *all[] = {a, idx, o, g, gi, go, s, si, ss, so, e3, ebase, ei, es, eo};
  for (int k = 0; k < 15; k++) vm_release(all[k]);
}

TEST(index_check_reports_the_interpreters_error) {
  gpu_index_check ok = {0},
                  bad = {.first = ~(uint64_t)3, .value = 7, .size = 5, .axis = 1, .sealed = 1};
  kiln_clear_error();
  CHECK(gpu_index_check_report(&ok));
  CHECK(!gpu_index_check_report(&bad));
  CHECK_STR_CONTAINS(kiln_last_error(), "index 7 is out of range for axis 1 of size 5");
  kiln_clear_error();
}

TEST(plan_concat_of_three) {
  vm_tensor *a = host(KILN_F32, 2, S(2, 3)), *b = host(KILN_F32, 2, S(2, 1)),
            *e = host(KILN_F32, 2, S(2, 0));
  vm_tensor *c = host(KILN_F32, 2, S(2, 2)), *o = host(KILN_F32, 2, S(2, 6));
  gpu_op_plan p = plan(VM_OP_concat, 4, (vm_tensor *[]){a, b, e, c}, o, &(vm_attr){.axis = 1});
  CHECK_EQ_INT(p.nlaunch, 3); /* the empty one is skipped */
  if (p.nlaunch == 3) {
    const int64_t at[3] = {0, 3, 4};
    for (int i = 0; i < 3; i++) {
      CHECK(!strcmp(key_name(&p.launch[i].key), "k_concat_f32_f32_c2"));
      CHECK(p.launch[i].args.ptr[0] == (char *)vm_data(o) + at[i] * 4);
    }
    CHECK_SHAPE(&p.launch[0].args, 2, 3);
    CHECK_STRIDES(&p.launch[0].args, 0, 6, 1);
    CHECK_SHAPE(&p.launch[1].args, 2); /* the size-1 dim dropped */
    CHECK_STRIDES(&p.launch[1].args, 0, 6);
    CHECK_STRIDES(&p.launch[1].args, 1, 1);
    CHECK_EQ_INT(p.launch[2].args.n, 4);
  }
  gpu_op_plan_free(&p);
  /* along axis 0 every slice is contiguous */
  vm_tensor *r = host(KILN_F32, 2, S(6, 3));
  vm_tensor *bt = vm_tensor_view(a, 2, S(3, 2), S(1, 3), 0); /* a transposed */
  vm_tensor *r2 = host(KILN_F32, 2, S(3, 3)), *col = host(KILN_F32, 2, S(3, 1));
  p = plan(VM_OP_concat, 2, (vm_tensor *[]){a, a}, r, &(vm_attr){.axis = 0});
  if (p.nlaunch == 2) {
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_concat_f32_f32_c3"));
    CHECK_SHAPE(&p.launch[1].args, 6);
    CHECK(p.launch[1].args.ptr[0] == (char *)vm_data(r) + 6 * 4);
  }
  gpu_op_plan_free(&p);
  p = plan(VM_OP_concat, 2, (vm_tensor *[]){bt, col}, r2, &(vm_attr){.axis = 1});
  if (p.nlaunch == 2) CHECK(!strcmp(key_name(&p.launch[0].key), "k_concat_f32_f32_c0"));
  gpu_op_plan_free(&p);
  vm_tensor *all[] = {a, b, e, c, o, r, bt, r2, col};
  for (int k = 0; k < 9; k++) vm_release(all[k]);
}

TEST(plan_argsort) {
  vm_tensor *a = host(KILN_F32, 2, S(4, 10)), *o = host(KILN_I64, 2, S(4, 10));
  gpu_op_plan p =
      plan(VM_OP_argsort, 1, (vm_tensor *[]){a}, o, &(vm_attr){.axis = 1, .keepdim = true});
  if (p.nlaunch == 1) {
    const gpu_launch *l = &p.launch[0];
    CHECK(!strcmp(key_name(&l->key), "k_argsort_i64_f32_c3"));
    CHECK_SHAPE(&l->args, 4, 10);
    CHECK_EQ_INT(l->args.axis, 1);
    CHECK_EQ_INT(l->args.n, 4);
    CHECK_EQ_INT(l->args.flag, 1);
    CHECK_EQ_INT(l->grid[0], 4);
    CHECK_EQ_INT(l->block[0], 32);
  }
  gpu_op_plan_free(&p);
  /* along the first axis: the sorted dim moves last, rows step by 1 */
  vm_tensor *b = host(KILN_I32, 2, S(300, 4)), *bo = host(KILN_I64, 2, S(300, 4));
  p = plan(VM_OP_argsort, 1, (vm_tensor *[]){b}, bo, &(vm_attr){.axis = 0});
  if (p.nlaunch == 1) {
    const gpu_launch *l = &p.launch[0];
    CHECK(!strcmp(key_name(&l->key), "k_argsort_i64_i32_c3"));
    CHECK_SHAPE(&l->args, 4, 300);
    CHECK_STRIDES(&l->args, 0, 1, 4);
    CHECK_STRIDES(&l->args, 1, 1, 4);
    CHECK_EQ_INT(l->args.flag, 0);
    CHECK_EQ_INT(l->block[0], 256);
  }
  gpu_op_plan_free(&p);
  vm_release(a);
  vm_release(o);
  vm_release(b);
  vm_release(bo);
}

TEST(plan_integer_matmul) {
  vm_tensor *a = host(KILN_I32, 3, S(5, 2, 3)), *b = host(KILN_I32, 2, S(3, 4)),
            *o = host(KILN_I32, 3, S(5, 2, 4));
  gpu_op_plan p = plan(VM_OP_matmul, 2, (vm_tensor *[]){a, b}, o, NULL);
  if (p.nlaunch == 1) {
    const gpu_args *g = &p.launch[0].args;
    CHECK(!strcmp(key_name(&p.launch[0].key), "k_matmul_i32_i32_i32_c1"));
    CHECK_SHAPE(g, 5);
    CHECK_EQ_INT(g->stride[1][0], 6);
    CHECK_EQ_INT(g->stride[2][0], 0);
    CHECK(g->stride[1][6] == 3 && g->stride[1][7] == 1 && g->stride[2][6] == 4 &&
          g->stride[2][7] == 1);
    CHECK(g->extent[0] == 2 && g->extent[1] == 4 && g->extent[2] == 3);
    CHECK_EQ_INT(g->n, 40);
  }
  gpu_op_plan_free(&p);
  vm_release(a);
  vm_release(b);
  vm_release(o);
}

TEST(plan_refuses_views_and_float_matmul) {
  vm_tensor *a = host(KILN_F32, 2, S(2, 3)), *b = host(KILN_F32, 2, S(3, 2)),
            *o = host(KILN_F32, 2, S(2, 2));
  gpu_op_plan p;
  kiln_clear_error();
  CHECK(!gpu_op_plan_make(VM_OP_reshape, 1, (vm_tensor *[]){a}, b,
                          &(vm_attr){.ndim = 2, .shape = {3, 2}}, &p));
  CHECK_STR_CONTAINS(kiln_last_error(), "view");
  CHECK(p.nlaunch == 0 && p.launch == NULL);
  kiln_clear_error();
  CHECK(!gpu_op_plan_make(VM_OP_matmul, 2, (vm_tensor *[]){a, b}, o, NULL, &p));
  CHECK_STR_CONTAINS(kiln_last_error(), "cuBLAS");
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_INTERNAL);
  kiln_clear_error();
  CHECK(!gpu_op_plan_make(VM_OP_input, 0, NULL, o, NULL, &p));
  CHECK_STR_CONTAINS(kiln_last_error(), "never runs as a kernel");
  kiln_clear_error();
  /* a dtype the op has no kernel for (sqrt computes in floats) */
  vm_tensor *i = host(KILN_I32, 1, S(4)), *io = host(KILN_I32, 1, S(4));
  CHECK(!gpu_op_plan_make(VM_OP_sqrt, 1, (vm_tensor *[]){i}, io, NULL, &p));
  CHECK_STR_CONTAINS(kiln_last_error(), "no GPU kernel for sqrt");
  kiln_clear_error();
  vm_release(i);
  vm_release(io);
  vm_release(a);
  vm_release(b);
  vm_release(o);
}

int main(void) {
  RUN(key_list_is_complete_and_bounded);
  RUN(key_names_are_unique);
  RUN(each_source_holds_exactly_its_entry);
  RUN(plan_contiguous_add);
  RUN(plan_broadcast_add);
  RUN(plan_permuted_input);
  RUN(plan_cast_where_and_leaves);
  RUN(plan_reduce_last_axis);
  RUN(plan_reduce_first_axis);
  RUN(plan_reduce_everything_two_passes);
  RUN(plan_index_ops);
  RUN(index_check_reports_the_interpreters_error);
  RUN(plan_concat_of_three);
  RUN(plan_argsort);
  RUN(plan_integer_matmul);
  RUN(plan_refuses_views_and_float_matmul);
  RUN(nvrtc_targets_sm_80_and_falls_back_to_ptx);
  RUN(a_layout_mismatch_fails_the_compile);
  RUN(dump_writes_source_ptx_and_the_manifest);
  RUN(nvrtc_compiles_every_kernel_for_sm_90);
  return ktest_done();
}
