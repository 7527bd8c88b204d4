/* test_threads.c — the API is thread-safe for distinct tensors: several user
 * threads run large ops and train small models (which use the kernel pool)
 * at once and get exactly the results a single thread gets; errors stay per
 * thread; and the kernel pool is shared: however many user threads flush at
 * once, no more than KILN_THREADS threads run kernels (kiln_stat
 * "kernel_threads_max").  KILN_THREADS is read once per process, so the
 * test runs itself again under KILN_THREADS=1, 2 and 4 (DESIGN.md §9) and
 * checks that all three train to the same bits, that a batched matmul's
 * items have the bits of the same 2-d matmuls, and (a fourth child, with
 * KILN_JIT=0) that the interpreter gives the gemms and an attention's
 * forward and backward the same bits. */
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ktest.h"

extern char **environ;
static const char *self_path; /* argv[0], for the children */

#define WORKERS 4
#define N (1 << 18)

/* a fixed pipeline over a large tensor: elementwise, reduction, matmul */
static double pipeline(int seed) {
  int64_t mshape[2] = {64, 64};
  kiln_tensor *x = kiln_arange(seed, seed + N, 1, KILN_F64);
  kiln_tensor *xs = kiln_mul_scalar(x, 1e-5);
  kiln_tensor *y = kiln_tanh(xs);
  kiln_tensor *s = kiln_sum(y, 0, NULL, false);
  kiln_tensor *head = kiln_slice(y, 0, 0, 4096, 1);
  kiln_tensor *m = kiln_reshape(head, 2, mshape);
  kiln_tensor *mm = kiln_matmul(m, m);
  kiln_tensor *ms = kiln_sum(mm, 0, NULL, false);
  double r = kiln_item(s) + kiln_item(ms);

  kiln_release(x);
  kiln_release(xs);
  kiln_release(y);
  kiln_release(s);
  kiln_release(m);
  kiln_release(head);
  kiln_release(mm);
  kiln_release(ms);
  return r;
}

/* --- a small model: 256 x 128 -> 256 (relu) -> 10, cross-entropy, SGD ---- */

enum { BATCH = 256, D_IN = 128, HIDDEN = 256, CLASSES = 10, STEPS = 6 };

enum { GEMMS = 14, BATCHED_END = 10, ATTN = 4 };

typedef struct {
  uint64_t gemms[GEMMS]; /* gemm_battery's results, hashed */
  uint64_t attn[ATTN];   /* attention_battery's */
  float w1[D_IN * HIDDEN], w2[HIDDEN * CLASSES];
  float loss;
} trained;

/* deterministic values without the process-wide RNG (whose counter other
   threads advance) */
static kiln_tensor *filled(int64_t rows, int64_t cols, double phase, double amp) {
  float *buf = malloc(sizeof *buf * (size_t)(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) buf[i] = (float)(amp * sin(0.7 * (double)i + phase));
  kiln_tensor *t = kiln_from_data(buf, KILN_F32, 2, (int64_t[]){rows, cols});
  free(buf);
  return t;
}

/* FNV-1a of a result's bytes */
static uint64_t hash_of(kiln_tensor *t) {
  size_t bytes = (size_t)kiln_numel(t) * 8;
  unsigned char *buf = malloc(bytes);
  uint64_t h = 1469598103934665603ull;
  if (buf && kiln_to_buffer(t, buf, bytes) == 0)
    for (size_t i = 0; i < bytes; i++) h = (h ^ buf[i]) * 1099511628211ull;
  else
    h = 0;
  free(buf);
  return h;
}

/* ATTN_B x ATTN_H heads of ATTN_T x ATTN_D: attention's batched products */
enum { ATTN_B = 2, ATTN_H = 3, ATTN_T = 128, ATTN_D = 32 };

static kiln_tensor *heads(int64_t t, int64_t d, double phase, double amp) {
  kiln_tensor *f = filled(ATTN_B * ATTN_H * t, d, phase, amp);
  kiln_tensor *r = kiln_reshape(f, 4, (int64_t[]){ATTN_B, ATTN_H, t, d});
  kiln_release(f);
  return r;
}

/* head (b, h) of x [B, H, r, c] as a 2-d [r, c] (transposed: [c, r], a view) */
static kiln_tensor *head_of(kiln_tensor *x, int64_t b, int64_t h, bool transposed) {
  const int64_t *sh = kiln_shape(x);
  kiln_tensor *s0 = kiln_slice(x, 0, b, b + 1, 1), *s1 = kiln_slice(s0, 1, h, h + 1, 1);
  kiln_tensor *m = kiln_reshape(s1, 2, (int64_t[]){sh[2], sh[3]});
  kiln_tensor *r = transposed ? kiln_transpose(m, 0, 1) : kiln_retain(m);
  kiln_release(s0), kiln_release(s1), kiln_release(m);
  return r;
}

/* out[0], out[2]: q k^T and p v of attention's shapes, each one batched
   matmul (its items side by side on the pool); out[1], out[3]: the same
   items one 2-d matmul at a time, stacked.  A batched matmul's item must
   have the bits of the same product made alone, at every KILN_THREADS and
   on every OpenBLAS core: the parent checks out[0] == out[1] and out[2] ==
   out[3]. */
static void batched_gemms(uint64_t *out) {
  kiln_tensor *q = heads(ATTN_T, ATTN_D, 0.3, 1.0), *k = heads(ATTN_T, ATTN_D, 0.6, 1.0);
  kiln_tensor *p = heads(ATTN_T, ATTN_T, 0.8, 0.2), *v = heads(ATTN_T, ATTN_D, 0.5, 1.0);
  kiln_tensor *kt = kiln_transpose(k, 2, 3);
  kiln_tensor *pair[2][2] = {{q, k}, {p, v}};
  for (int w = 0; w < 2; w++) {
    kiln_tensor *a = pair[w][0], *b = pair[w][1];
    kiln_tensor *c = kiln_matmul(a, w == 0 ? kt : b), *c64 = kiln_cast(c, KILN_F64);
    out[2 * w] = hash_of(c64);
    kiln_tensor *items[ATTN_B * ATTN_H];
    for (int i = 0; i < ATTN_B * ATTN_H; i++) {
      kiln_tensor *ai = head_of(a, i / ATTN_H, i % ATTN_H, false),
                  *bi = head_of(b, i / ATTN_H, i % ATTN_H, w == 0);
      items[i] = kiln_matmul(ai, bi);
      kiln_release(ai), kiln_release(bi);
    }
    kiln_tensor *st = kiln_stack(ATTN_B * ATTN_H, items, 0), *st64 = kiln_cast(st, KILN_F64);
    out[2 * w + 1] = hash_of(st64);
    for (int i = 0; i < ATTN_B * ATTN_H; i++) kiln_release(items[i]);
    kiln_release(c), kiln_release(c64), kiln_release(st), kiln_release(st64);
  }
  kiln_release(q), kiln_release(k), kiln_release(p), kiln_release(v), kiln_release(kt);
}

/* softmax(q k^T / sqrt(d)) v and its gradients by q, k and v (of
   sum(out * w)), hashed: written the long way, recorded as the attention
   op (trace/attention.h; its kernel's blocks are fixed by the shape), with
   row kernels the JIT compiles around it.  Run three times (the last, with
   the JIT on, compiled); the parent checks the bits against KILN_JIT=0
   and across KILN_THREADS. */
static void attention_battery(uint64_t *out) {
  for (int rep = 0; rep < 3; rep++) {
    if (rep == 2) kiln_jit_wait();
    kiln_tensor *q = heads(ATTN_T, ATTN_D, 0.1, 0.5), *k = heads(ATTN_T, ATTN_D, 0.2, 0.5),
                *v = heads(ATTN_T, ATTN_D, 0.7, 1.0), *w = heads(ATTN_T, ATTN_D, 0.9, 1.0);
    kiln_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) kiln_set_requires_grad(in[i], true);
    kiln_tensor *kt = kiln_transpose(k, 2, 3), *s = kiln_matmul(q, kt);
    kiln_tensor *sc = kiln_div_scalar(s, sqrt((double)ATTN_D)), *pr = kiln_softmax(sc, -1);
    kiln_tensor *o = kiln_matmul(pr, v), *ow = kiln_mul(o, w), *loss = kiln_sum(ow, 0, NULL, false);
    kiln_backward(loss, NULL);
    kiln_tensor *res[ATTN] = {kiln_cast(o, KILN_F64), NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
      kiln_tensor *g = kiln_grad(in[i]);
      res[i + 1] = kiln_cast(g, KILN_F64);
      kiln_release(g);
    }
    for (int i = 0; i < ATTN; i++) {
      if (rep == 2) out[i] = hash_of(res[i]);
      kiln_release(res[i]);
    }
    kiln_tensor *ts[] = {q, k, v, w, kt, s, sc, pr, o, ow, loss};
    for (size_t t = 0; t < sizeof ts / sizeof *ts; t++) kiln_release(ts[t]);
  }
}

/* Gemms that run in several tiles (vm/kern_matmul.c): tall, wide,
   transposed operands, a batch, a batch folded into one gemm, f64; then
   batched_gemms' four; then two in bf16; then a GRU step's two.  Each
   element's arithmetic depends on the shape of the BLAS call it is in
   (OpenBLAS's edge and small-matrix kernels), so only tiles fixed by the
   shape give the same bits at every KILN_THREADS (issue 36). */
static void gemm_battery(uint64_t *out) {
  static const int64_t shapes[6][4] = {/* batch, M, K, N */
                                       {0, 1024, 256, 300}, {0, 200, 512, 1100},
                                       {0, 1000, 384, 520}, {4, 300, 128, 300},
                                       {8, 128, 256, 300},  {0, 600, 256, 600}};
  for (int i = 0; i < 6; i++) {
    int64_t bt = shapes[i][0], m = shapes[i][1], k = shapes[i][2], n = shapes[i][3];
    kiln_tensor *a = filled(bt ? bt * m : m, k, 0.4 + i, 1.0), *b = filled(k, n, 0.9 + i, 1.0), *x,
                *y;
    if (i == 2) { /* A as the transpose of a [K, M] matrix */
      kiln_tensor *at = filled(k, m, 0.4 + i, 1.0);
      x = kiln_transpose(at, 0, 1);
      kiln_release(at);
    } else if (bt) {
      x = kiln_reshape(a, 3, (int64_t[]){bt, m, k});
    } else {
      x = kiln_retain(a);
    }
    if (i == 3) { /* a batch of its own right operands */
      kiln_tensor *bb = filled(bt * k, n, 0.9 + i, 1.0);
      y = kiln_reshape(bb, 3, (int64_t[]){bt, k, n});
      kiln_release(bb);
    } else {
      y = kiln_retain(b);
    }
    if (i == 5) { /* f64 */
      kiln_tensor *x64 = kiln_cast(x, KILN_F64), *y64 = kiln_cast(y, KILN_F64);
      kiln_release(x), kiln_release(y);
      x = x64, y = y64;
    }
    kiln_tensor *c = kiln_matmul(x, y), *c64 = kiln_cast(c, KILN_F64);
    out[i] = hash_of(c64);
    kiln_tensor *ts[] = {a, b, x, y, c, c64};
    for (size_t t = 0; t < sizeof ts / sizeof *ts; t++) kiln_release(ts[t]);
  }
  batched_gemms(out + 6);
  /* bf16 (vm/gemm_bf16.c where the CPU has AVX512-BF16, else sgemm
     between casts): a transposed left operand over several tiles, and a
     batch */
  kiln_tensor *at = filled(384, 1000, 1.7, 1.0), *b = filled(384, 520, 2.3, 1.0);
  kiln_tensor *a = kiln_transpose(at, 0, 1), *ah = kiln_cast(a, KILN_BF16),
              *bh = kiln_cast(b, KILN_BF16), *c = kiln_matmul(ah, bh),
              *c64 = kiln_cast(c, KILN_F64);
  out[10] = hash_of(c64);
  kiln_tensor *ab = filled(4 * 300, 128, 2.9, 1.0),
              *a3 = kiln_reshape(ab, 3, (int64_t[]){4, 300, 128}), *a3h = kiln_cast(a3, KILN_BF16),
              *bb = filled(128, 300, 3.1, 1.0), *bbh = kiln_cast(bb, KILN_BF16),
              *c3 = kiln_matmul(a3h, bbh), *c364 = kiln_cast(c3, KILN_F64);
  out[11] = hash_of(c364);
  kiln_tensor *ts[] = {at, b, a, ah, bh, c, c64, ab, a3, a3h, bb, bbh, c3, c364};
  for (size_t t = 0; t < sizeof ts / sizeof *ts; t++) kiln_release(ts[t]);
  /* a GRU step's two gemms, small enough that only the first split of the
     tiling rule (into two tiles) applies: h @ Wh, and dg @ Wh^T */
  kiln_tensor *h = filled(32, 128, 3.7, 1.0), *wh = filled(128, 384, 4.1, 1.0),
              *dg = filled(32, 384, 4.3, 1.0), *wt = kiln_transpose(wh, 0, 1),
              *g = kiln_matmul(h, wh), *g64 = kiln_cast(g, KILN_F64), *dh = kiln_matmul(dg, wt),
              *dh64 = kiln_cast(dh, KILN_F64);
  out[12] = hash_of(g64);
  out[13] = hash_of(dh64);
  kiln_tensor *gs[] = {h, wh, dg, wt, g, g64, dh, dh64};
  for (size_t t = 0; t < sizeof gs / sizeof *gs; t++) kiln_release(gs[t]);
}

static void train(trained *out) {
  kiln_tensor *x = filled(BATCH, D_IN, 0.1, 1.0);
  kiln_tensor *w1 = filled(D_IN, HIDDEN, 0.2, 0.15), *w2 = filled(HIDDEN, CLASSES, 0.3, 0.1);
  int64_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 7 + 3) % CLASSES;
  kiln_tensor *target = kiln_from_data(labels, KILN_I64, 1, (int64_t[]){BATCH});
  kiln_set_requires_grad(w1, true);
  kiln_set_requires_grad(w2, true);
  for (int step = 0; step < STEPS; step++) {
    kiln_tensor *z = kiln_matmul(x, w1), *h = kiln_relu(z), *logits = kiln_matmul(h, w2);
    kiln_tensor *loss = kiln_cross_entropy(logits, target);
    kiln_backward(loss, NULL);
    kiln_tensor *params[2] = {w1, w2};
    for (int p = 0; p < 2; p++) {
      kiln_tensor *g = kiln_grad(params[p]);
      kiln_sub_scaled_(params[p], g, 0.5);
      kiln_release(g);
      kiln_zero_grad(params[p]);
    }
    if (step == STEPS - 1) out->loss = (float)kiln_item(loss);
    kiln_release(z);
    kiln_release(h);
    kiln_release(logits);
    kiln_release(loss);
  }
  kiln_to_buffer(w1, out->w1, sizeof out->w1);
  kiln_to_buffer(w2, out->w2, sizeof out->w2);
  gemm_battery(out->gemms);
  attention_battery(out->attn);
  kiln_release(x);
  kiln_release(w1);
  kiln_release(w2);
  kiln_release(target);
}

/* --- user threads ------------------------------------------------------------ */

typedef struct {
  int seed;
  double result;
  int error_kept;
  trained *model;
} work;

static void *pipeline_worker(void *p) {
  work *w = p;
  kiln_clear_error();
  for (int rep = 0; rep < 5; rep++) w->result = pipeline(w->seed);
  /* an error on this thread is seen by this thread only */
  kiln_tensor *bad = kiln_add(NULL, NULL);
  w->error_kept = bad == NULL && kiln_last_status() == KILN_ERR_ARG;
  return NULL;
}

static void *train_worker(void *p) {
  work *w = p;
  train(w->model);
  w->error_kept = kiln_last_status() == KILN_OK;
  return NULL;
}

static void run_threads(int n, void *(*fn)(void *), work *w) {
  pthread_t th[WORKERS];
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, &w[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void check_budget(const char *what, int users) {
  double seen = kiln_stat("kernel_threads_max");
  if (seen > kiln_num_threads() || seen < 1)
    KTEST_FAIL("%s on %d threads: %g threads ran kernels at once, KILN_THREADS is %d", what, users,
               seen, kiln_num_threads());
}

TEST(concurrent_pipelines_match_single_thread_results) {
  double expected[WORKERS];
  for (int i = 0; i < WORKERS; i++) expected[i] = pipeline(i * 1000);
  work w[WORKERS];
  for (int i = 0; i < WORKERS; i++) w[i] = (work){.seed = i * 1000};
  run_threads(WORKERS, pipeline_worker, w);
  for (int i = 0; i < WORKERS; i++) {
    CHECK(w[i].result == expected[i]);
    CHECK(w[i].error_kept);
  }
  CHECK_EQ_INT(kiln_last_status(), KILN_OK); /* the main thread saw no error */
}

TEST(large_ops_on_2_and_4_threads_never_exceed_kiln_threads) {
  for (int users = 2; users <= WORKERS; users += 2) {
    kiln_reset_stats();
    work w[WORKERS];
    for (int i = 0; i < users; i++) w[i] = (work){.seed = i * 1000};
    run_threads(users, pipeline_worker, w);
    check_budget("large elementwise/reduction ops", users);
  }
}

/* the pool is still used: one thread's large ops get help from the workers
   (each op has a chunk per thread; over 40 ops a worker joins at least once) */
/* a worker joining a job is a matter of scheduling (a loaded machine may
   run every chunk on the caller before a worker wakes), so this repeats
   the work until one did, within a generous bound; the upper bound is the
   guarantee and holds on every repetition */
TEST(one_thread_alone_uses_the_workers) {
  kiln_reset_stats();
  int want = kiln_num_threads() > 1 ? 2 : 1;
  double seen = 0;
  for (int rep = 0; rep < 200 && seen < want; rep++) {
    pipeline(rep);
    seen = kiln_stat("kernel_threads_max");
    CHECK(seen <= kiln_num_threads());
  }
  CHECK(seen >= want);
}

static trained reference; /* the model trained by the main thread alone */

TEST(models_trained_on_2_and_4_threads_match_one_thread_bit_for_bit) {
  /* compiled kernels may round differently from the interpreter: warm up
     until the steps run compiled, then every run below runs the same code */
  for (int warm = 0; warm < 2; warm++) train(&reference);
  kiln_jit_wait();
  train(&reference);
  CHECK(isfinite(reference.loss) && reference.loss > 0);
  static trained models[WORKERS];
  for (int users = 2; users <= WORKERS; users += 2) {
    kiln_reset_stats();
    work w[WORKERS];
    for (int i = 0; i < users; i++) w[i] = (work){.model = &models[i]};
    run_threads(users, train_worker, w);
    check_budget("training", users);
    for (int i = 0; i < users; i++) {
      CHECK(w[i].error_kept);
      CHECK(memcmp(&models[i], &reference, sizeof reference) == 0);
    }
  }
}

/* --- KILN_THREADS = 1, 2, 4: one child process each -------------------------- */

static int child(const char *result_path) {
  RUN(concurrent_pipelines_match_single_thread_results);
  RUN(large_ops_on_2_and_4_threads_never_exceed_kiln_threads);
  RUN(one_thread_alone_uses_the_workers);
  RUN(models_trained_on_2_and_4_threads_match_one_thread_bit_for_bit);
  FILE *f = fopen(result_path, "wb");
  if (!f || fwrite(&reference, sizeof reference, 1, f) != 1)
    KTEST_FAIL("cannot write %s", result_path);
  if (f) fclose(f);
  return ktest_done();
}

/* the batteries alone, for the KILN_JIT=0 child */
static int battery_child(const char *result_path) {
  static trained out;
  gemm_battery(out.gemms);
  attention_battery(out.attn);
  CHECK_EQ_INT(kiln_last_status(), KILN_OK);
  FILE *f = fopen(result_path, "wb");
  if (!f || fwrite(&out, sizeof out, 1, f) != 1) KTEST_FAIL("cannot write %s", result_path);
  if (f) fclose(f);
  return ktest_done();
}

/* mode: "--child" (everything) or "--battery" (the batteries); jit_off:
   the child runs with KILN_JIT=0 (set in its environment only: the
   parent's own Kiln threads may be reading this one) */
static void spawn_child(const char *self, int threads, const char *mode, bool jit_off,
                        const char *path, trained *out) {
  char env_threads[32];
  snprintf(env_threads, sizeof env_threads, "%d", threads);
  setenv("KILN_THREADS", env_threads, 1); /* this parent never starts Kiln: no threads yet */
  char *argv[] = {(char *)self, (char *)mode, (char *)path, NULL};
  size_t n = 0;
  while (environ[n]) n++;
  char **envp = malloc((n + 2) * sizeof *envp), jit0[] = "KILN_JIT=0";
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (!jit_off || strncmp(environ[i], "KILN_JIT=", 9)) envp[m++] = environ[i];
  if (jit_off) envp[m++] = jit0;
  envp[m] = NULL;
  pid_t pid;
  int status = -1;
  int spawned = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp);
  free(envp);
  if (spawned != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    KTEST_FAIL("KILN_THREADS=%d: the child failed (status %d)", threads, status);
    return;
  }
  FILE *f = fopen(path, "rb");
  if (!f || fread(out, sizeof *out, 1, f) != 1) KTEST_FAIL("KILN_THREADS=%d: no result", threads);
  if (f) fclose(f);
}

TEST(kiln_threads_1_2_4_each_keep_the_budget_and_train_to_the_same_bits) {
  static const int counts[] = {1, 2, 4};
  static trained models[3];
  char path[] = "/tmp/kiln_test_threads_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    KTEST_FAIL("mkstemp");
    return;
  }
  close(fd);
  for (int i = 0; i < 3; i++) {
    printf("--- KILN_THREADS=%d\n", counts[i]);
    fflush(stdout);
    spawn_child(self_path, counts[i], "--child", false, path, &models[i]);
  }
  /* the interpreter alone (KILN_JIT=0) gives the batteries the same bits */
  static trained interpreted;
  printf("--- KILN_JIT=0 KILN_THREADS=2, the batteries\n");
  fflush(stdout);
  spawn_child(self_path, 2, "--battery", true, path, &interpreted);
  unlink(path);
  for (int i = 0; i < 3; i++)
    for (int g = 6; g < BATCHED_END; g += 2)
      if (models[i].gemms[g] != models[i].gemms[g + 1])
        KTEST_FAIL(
            "KILN_THREADS=%d: batched gemm %d of gemm_battery differs from its items "
            "made one at a time",
            counts[i], g);
  for (int a = 0; a < ATTN; a++) CHECK(models[0].attn[a] != 0); /* 0: not computed */
  for (int g = 0; g < GEMMS; g++)
    if (interpreted.gemms[g] != models[0].gemms[g])
      KTEST_FAIL("KILN_JIT=0: gemm %d of gemm_battery differs from the JIT's", g);
  for (int a = 0; a < ATTN; a++)
    if (interpreted.attn[a] != models[0].attn[a])
      KTEST_FAIL("KILN_JIT=0: result %d of attention_battery differs from the JIT's", a);
  for (int i = 1; i < 3; i++) {
    for (int g = 0; g < GEMMS; g++)
      if (models[i].gemms[g] != models[0].gemms[g])
        KTEST_FAIL("KILN_THREADS=%d: gemm %d of gemm_battery differs from KILN_THREADS=1",
                   counts[i], g);
    CHECK(memcmp(&models[i], &models[0], sizeof models[0]) == 0);
  }
}

/* h = w scaled 1100 times, recorded on the calling thread */
static kiln_tensor *long_chain(kiln_tensor *w) {
  kiln_tensor *h = kiln_retain(w);
  for (int k = 0; k < 1100; k++) {
    kiln_tensor *next = kiln_mul_scalar(h, k % 2 ? 1.0001 : 0.9999);
    kiln_release(h);
    h = next;
  }
  return h;
}

static void *long_chain_thread(void *arg) {
  kiln_tensor **io = arg;
  io[1] = long_chain(io[0]);
  return NULL;
}

/* d/dw of sum(h*h + early), h = long_chain(w), early = 2w recorded first;
   with `across`, h is recorded on a second thread */
static void chain_grad(bool across, float *grad) {
  float w0[4] = {0.5f, -1.25f, 2.0f, 0.75f};
  int64_t n = 4;
  kiln_tensor *w = kiln_from_data(w0, KILN_F32, 1, &n);
  kiln_set_requires_grad(w, true);
  kiln_tensor *early = kiln_mul_scalar(w, 2.0), *io[2] = {w, NULL};
  pthread_t th;
  if (across) {
    CHECK(pthread_create(&th, NULL, long_chain_thread, io) == 0);
    pthread_join(th, NULL);
  } else {
    io[1] = long_chain(w);
  }
  kiln_tensor *sq = kiln_mul(io[1], io[1]), *both = kiln_add(sq, early),
              *loss = kiln_sum(both, 0, NULL, false);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *g = kiln_grad(w);
  CHECK(g && kiln_to_buffer(g, grad, 4 * sizeof *grad) == KILN_OK);
  kiln_tensor *all[] = {w, early, io[1], sq, both, loss, g};
  for (int i = 0; i < 7; i++) kiln_release(all[i]);
}

/* Autodiff walks nodes in reverse creation order (sequence numbers, taken
   by each thread in blocks): a node recorded on this thread after reading
   a value recorded on another, whose numbers came from a newer block, is
   still numbered after it, so backward visits it first and the gradient
   through that value is complete — the same bits as on one thread */
TEST(backward_through_values_recorded_on_another_thread) {
  float one[4], two[4];
  chain_grad(false, one);
  chain_grad(true, two);
  for (int i = 0; i < 4; i++) {
    if (one[i] != two[i])
      fprintf(stderr, "grad[%d]: %.9g on one thread, %.9g across two\n", i, one[i], two[i]);
    CHECK(one[i] == two[i]);
  }
  CHECK(one[0] > 2.0f); /* 2 h dh/dw + 2, h ~ w */
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "--battery")) return battery_child(argv[2]);
  self_path = argv[0];
  RUN(backward_through_values_recorded_on_another_thread);
  RUN(kiln_threads_1_2_4_each_keep_the_budget_and_train_to_the_same_bits);
  return ktest_done();
}
