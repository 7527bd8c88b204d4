/* test_bitwise_training.c — whether the JIT fired never changes a result
 * (DESIGN §5): a small training run gives the same loss sequence, bit for
 * bit, on the interpreter alone (KILN_JIT=0), with every trace compiled
 * inline on first sight (KILN_ASYNC=0 KILN_HOT=1 KILN_PAYOFF=0), and with background
 * compiles finishing at random moments (KILN_COMPILE_DELAY_MS=max,seed: the
 * compiler thread sleeps a random time before each compile, so some steps
 * run interpreted and later ones compiled, at different steps in each run),
 * on 1, 2 and 4 threads.  A background run waits for its queued compiles
 * before a given step (BITWISE_WAIT_AT, a different one per run), so that
 * compiled code surely takes over mid-run even on a slow machine; before
 * it, compiles land whenever they finish.
 *
 * The model: 32 -> 64 (layer_norm, tanh, causal self-attention over
 * sequences of 8 rows) -> 48 (relu) -> 10, mean cross-entropy, SGD, on
 * deterministic synthetic data; its loss each step is read back (a flush
 * per step).  That exercises matmul, row kernels (softmax, layer_norm and
 * their gradients), column reductions (bias gradients), f32
 * exp/log/tanh, the attention primitive and its gradient, and the
 * autodiff graph.
 *
 * The parent makes no Kiln call: it re-executes itself (fork + execve) once
 * per configuration and compares the children's output. */
#include <errno.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ktest.h"

extern char **environ;

enum { N = 512, IN = 32, H1 = 64, H2 = 48, OUT = 10, BATCH = 64, STEPS = 40 };

#define CK(x) ck_ptr((x), __LINE__)
static kiln_tensor *ck_ptr(kiln_tensor *t, int line) {
  if (!t) {
    fprintf(stderr, "line %d: %s\n", line, kiln_last_error());
    exit(2);
  }
  return t;
}
#define CKI(x)                                                       \
  do {                                                               \
    if ((x) != KILN_OK) {                                            \
      fprintf(stderr, "line %d: %s\n", __LINE__, kiln_last_error()); \
      exit(2);                                                       \
    }                                                                \
  } while (0)

static kiln_tensor *param(int rows, int cols, double scale) {
  kiln_tensor *r = CK(cols ? kiln_randn(KILN_F32, 2, (int64_t[]){rows, cols})
                           : kiln_randn(KILN_F32, 1, (int64_t[]){rows}));
  kiln_tensor *p = CK(kiln_mul_scalar(r, scale));
  kiln_release(r);
  CKI(kiln_set_requires_grad(p, true));
  return p;
}

/* one training run; prints "loss <step> <bits>" per step, then the stats */
static int child(void) {
  static float xs[N * IN];
  static int64_t ys[N];
  for (int i = 0; i < N; i++) {
    double acc = 0;
    for (int j = 0; j < IN; j++) {
      xs[i * IN + j] = (float)sin(0.37 * i * (j + 1) + 0.1 * j) * (j % 5 == 0 ? 3.0f : 1.0f);
      acc += xs[i * IN + j] * ((j * 7) % 11 - 5);
    }
    ys[i] = (int64_t)fmod(fabs(acc) * 3.0, 10.0);
  }
  kiln_manual_seed(7);
  kiln_tensor *x = CK(kiln_from_data(xs, KILN_F32, 2, (int64_t[]){N, IN}));
  kiln_tensor *y = CK(kiln_from_data(ys, KILN_I64, 1, (int64_t[]){N}));
  kiln_tensor *p[6] = {param(IN, H1, 0.25), param(H1, 0, 0.1),   param(H1, H2, 0.18),
                       param(H2, 0, 0.1),   param(H2, OUT, 0.2), param(OUT, 0, 0.1)};
  /* BITWISE_WAIT_AT=s: wait for the compiles queued so far before step s,
     so that the later steps surely run compiled, however slow the machine */
  const char *wait_at = getenv("BITWISE_WAIT_AT");
  int wait_step = wait_at ? atoi(wait_at) : -1;
  for (int step = 0; step < STEPS; step++) {
    if (step == wait_step) kiln_jit_wait();
    int64_t at = (int64_t)(step * BATCH) % N;
    kiln_tensor *t[16];
    int n = 0;
#define PUSH(e)              \
  do {                       \
    kiln_tensor *v_ = CK(e); \
    t[n++] = v_;             \
  } while (0)
#define LAST t[n - 1]
    PUSH(kiln_slice(x, 0, at, at + BATCH, 1));
    PUSH(kiln_slice(y, 0, at, at + BATCH, 1));
    PUSH(kiln_matmul(t[0], p[0]));
    PUSH(kiln_add(LAST, p[1]));
    PUSH(kiln_layer_norm(LAST, NULL, NULL, 1e-5));
    PUSH(kiln_tanh(LAST));
    PUSH(kiln_reshape(LAST, 3, (int64_t[]){8, 8, H1})); /* 8 sequences of 8 */
    PUSH(kiln_scaled_dot_product_attention(LAST, LAST, LAST, NULL, true, 0));
    PUSH(kiln_reshape(LAST, 2, (int64_t[]){BATCH, H1}));
    PUSH(kiln_matmul(LAST, p[2]));
    PUSH(kiln_add(LAST, p[3]));
    PUSH(kiln_relu(LAST));
    PUSH(kiln_matmul(LAST, p[4]));
    PUSH(kiln_add(LAST, p[5]));
    kiln_tensor *loss = CK(kiln_cross_entropy(LAST, t[1]));
    CKI(kiln_backward(loss, NULL));
    for (int i = 0; i < 6; i++) {
      kiln_tensor *g = CK(kiln_grad(p[i]));
      CKI(kiln_sub_scaled_(p[i], g, 0.3));
      kiln_release(g);
      CKI(kiln_zero_grad(p[i]));
    }
    float l = (float)kiln_item(loss);
    uint32_t bits;
    memcpy(&bits, &l, 4);
    printf("loss %d %08x %.9g\n", step, bits, l);
    kiln_release(loss);
    while (n) kiln_release(t[--n]);
  }
  kiln_stats st;
  kiln_get_stats(&st);
  printf("stats %llu %llu %.0f\n", (unsigned long long)st.eager_ops,
         (unsigned long long)st.compiles, st.compile_ms);
  for (int i = 0; i < 6; i++) kiln_release(p[i]);
  kiln_release(x);
  kiln_release(y);
  return 0;
}

/* --- the parent ------------------------------------------------------------- */

typedef struct {
  const char *name;
  const char *vars[6];
  bool jit, background;
} config;

static const config CONFIGS[] = {
    {"interpreter (KILN_JIT=0), 2 threads", {"KILN_JIT=0", "KILN_THREADS=2"}, false, false},
    {"inline compiles (KILN_ASYNC=0 KILN_HOT=1 KILN_PAYOFF=0), 1 thread",
     {"KILN_JIT=1", "KILN_ASYNC=0", "KILN_HOT=1", "KILN_PAYOFF=0", "KILN_THREADS=1"},
     true,
     false},
    {"background, delays 0-60 ms (seed 1), 2 threads",
     {"KILN_JIT=1", "KILN_HOT=1", "KILN_PAYOFF=0", "KILN_COMPILE_DELAY_MS=60,1", "KILN_THREADS=2",
      "BITWISE_WAIT_AT=12"},
     true,
     true},
    {"background, delays 0-25 ms (seed 2), 4 threads",
     {"KILN_JIT=1", "KILN_HOT=2", "KILN_PAYOFF=0", "KILN_COMPILE_DELAY_MS=25,2", "KILN_THREADS=4",
      "BITWISE_WAIT_AT=27"},
     true,
     true},
    {"background, no delay, 1 thread",
     {"KILN_JIT=1", "KILN_HOT=1", "KILN_PAYOFF=0", "KILN_THREADS=1", "BITWISE_WAIT_AT=4"},
     true,
     true},
};
#define NCONFIG ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

static char self_exe[4096];

/* runs one configuration; its stdout in out (malloc'd), false if it failed */
static bool run_child(const config *c, char **out) {
  static const char *const drop[] = {"KILN_JIT=",       "KILN_HOT=",   "KILN_ASYNC=",
                                     "KILN_THREADS=",   "KILN_CACHE=", "KILN_COMPILE_DELAY_MS=",
                                     "BITWISE_WAIT_AT="};
  int n = 0;
  while (environ[n]) n++;
  char **env = calloc((size_t)n + 8, sizeof *env);
  int k = 0;
  for (int i = 0; i < n; i++) {
    bool keep = true;
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++)
      if (!strncmp(environ[i], drop[d], strlen(drop[d]))) keep = false;
    if (keep) env[k++] = environ[i];
  }
  env[k++] = "KILN_CACHE=0"; /* every kernel compiled in the run, never loaded */
  for (int v = 0; v < 6 && c->vars[v]; v++) env[k++] = (char *)c->vars[v];
  env[k] = NULL;
  int fd[2];
  if (pipe(fd)) return false;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    char *argv[] = {self_exe, "--child", NULL};
    execve(self_exe, argv, env);
    _exit(127);
  }
  free(env);
  close(fd[1]);
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd[0], buf + len, cap - len - 1)) > 0 || (got < 0 && errno == EINTR)) {
    if (got < 0) continue;
    len += (size_t)got;
    if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
  }
  close(fd[0]);
  buf[len] = 0;
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *out = buf;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(same_losses_bit_for_bit) {
  char *outs[NCONFIG] = {0};
  unsigned long long eager0 = 0;
  for (int c = 0; c < NCONFIG; c++) {
    if (!run_child(&CONFIGS[c], &outs[c])) {
      KTEST_FAIL("%s: the run failed", CONFIGS[c].name);
      continue;
    }
    unsigned long long eager = 0, compiles = 0;
    double ms = 0;
    const char *st = strstr(outs[c], "stats ");
    if (!st || sscanf(st, "stats %llu %llu %lg", &eager, &compiles, &ms) != 3) {
      KTEST_FAIL("%s: no stats line", CONFIGS[c].name);
      continue;
    }
    printf("  %-58s interpreted ops %5llu, plans compiled %3llu (%.0f ms)\n", CONFIGS[c].name,
           eager, compiles, ms);
    if (c == 0) eager0 = eager;
    /* compiled code must have done part of the work */
    if (CONFIGS[c].jit && !(compiles > 0 && eager < eager0))
      KTEST_FAIL("%s: compiled kernels did no work", CONFIGS[c].name);
    if (!CONFIGS[c].jit && compiles != 0) KTEST_FAIL("%s: compiled", CONFIGS[c].name);
    if (c == 0) continue;
    /* the loss lines, in order, against the interpreter's */
    const char *a = outs[0], *b = outs[c];
    for (int step = 0; step < STEPS; step++) {
      a = strstr(a, "loss ");
      b = strstr(b, "loss ");
      if (!a || !b) {
        KTEST_FAIL("%s: missing loss at step %d", CONFIGS[c].name, step);
        break;
      }
      int sa, sb;
      unsigned ba, bb;
      float la, lb;
      sscanf(a, "loss %d %x %g", &sa, &ba, &la);
      sscanf(b, "loss %d %x %g", &sb, &bb, &lb);
      if (ba != bb) {
        KTEST_FAIL("%s: step %d loss %.9g (%08x), the interpreter's %.9g (%08x)", CONFIGS[c].name,
                   step, lb, bb, la, ba);
        break;
      }
      a += 5;
      b += 5;
    }
  }
  if (outs[0]) {
    const char *last = outs[0], *p;
    while ((p = strstr(last + 1, "loss "))) last = p;
    printf("  %d steps; first loss line \"%.*s\", last \"%.*s\"\n", STEPS,
           (int)strcspn(outs[0], "\n"), outs[0], (int)strcspn(last, "\n"), last);
  }
  for (int c = 0; c < NCONFIG; c++) free(outs[c]);
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--child")) return child();
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0) return 1;
  self_exe[n] = 0;
  RUN(same_losses_bit_for_bit);
  return ktest_done();
}
