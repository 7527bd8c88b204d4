/* mlp_digits.c — trains a small neural network on handwritten digits with
 * Kiln's autodiff, then runs the same training on the interpreter alone
 * (KILN_JIT=0) to show what tracing and compiling buy.  Run by scripts/demo.
 *
 *   mlp_digits [--no-compare] [--timestamp] [DIGITS.csv.gz]
 *
 * Model: 64 -> 128 (relu) -> 10, mean cross-entropy, minibatch SGD.
 * Data: data/digits.csv.gz — Optical Recognition of Handwritten Digits,
 * E. Alpaydin and C. Kaynak, UCI Machine Learning Repository, 1998,
 * CC BY 4.0 (the copy scikit-learn ships; see data/README.md).
 *
 * Options: --no-compare skips the KILN_JIT=0 comparison run (the ctest uses
 * it); --no-report is what the comparison run itself is started with: no
 * per-epoch lines, one "result" line for the parent instead.  --timestamp
 * prints "main returns at <CLOCK_MONOTONIC seconds>" (flushed) as the last
 * line before main returns: perf/w13_demo.c measures how long exit takes.
 * Exits 1 if the final test accuracy is below 95%, 2 on any Kiln error. */
#define _GNU_SOURCE
#include <errno.h>
#include <kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#ifndef KILN_DATA_DIR
#define KILN_DATA_DIR "data"
#endif

#define DIGITS_PROG "mlp_digits"
#include "digits.h"

enum { HIDDEN = 128, BATCH = 64, EPOCHS = 25 };
static const double LR = 0.2;
static const double MIN_ACCURACY = 0.95;

/* ---- the model ------------------------------------------------------------------ */

typedef struct {
  kiln_tensor *p[4]; /* w1 [64,H], b1 [H], w2 [H,10], b2 [10] */
} mlp;

static kiln_tensor *init_weight(int64_t fan_in, int64_t fan_out) {
  return he(2, (int64_t[]){fan_in, fan_out}, fan_in);
}

static mlp mlp_init(void) {
  kiln_manual_seed(0);
  mlp m;
  m.p[0] = init_weight(PIXELS, HIDDEN);
  m.p[1] = CK(kiln_zeros(KILN_F32, 1, (int64_t[]){HIDDEN}));
  m.p[2] = init_weight(HIDDEN, CLASSES);
  m.p[3] = CK(kiln_zeros(KILN_F32, 1, (int64_t[]){CLASSES}));
  for (int i = 0; i < 4; i++) CKI(kiln_set_requires_grad(m.p[i], true));
  return m;
}

/* logits = relu(x @ w1 + b1) @ w2 + b2; temporaries go to s */
static kiln_tensor *mlp_forward(const mlp *m, kiln_tensor *x, scope *s) {
  kiln_tensor *h = KEEP(s, kiln_matmul(x, m->p[0]));
  h = KEEP(s, kiln_add(h, m->p[1]));
  h = KEEP(s, kiln_relu(h));
  kiln_tensor *o = KEEP(s, kiln_matmul(h, m->p[2]));
  return KEEP(s, kiln_add(o, m->p[3]));
}

/* fraction of rows whose largest logit is the label, computed by Kiln */
static double accuracy(const mlp *m, kiln_tensor *x, kiln_tensor *y) {
  scope s = {.n = 0};
  kiln_no_grad_push();
  kiln_tensor *logits = mlp_forward(m, x, &s);
  kiln_tensor *pred = KEEP(&s, kiln_argmax(logits, 1, false));
  kiln_tensor *hit = KEEP(&s, kiln_eq(pred, y));
  kiln_tensor *hitf = KEEP(&s, kiln_cast(hit, KILN_F32));
  kiln_tensor *acc = KEEP(&s, kiln_mean(hitf, 0, NULL, false));
  double a = CKD(kiln_item(acc));
  kiln_no_grad_pop();
  scope_release(&s);
  return a;
}

typedef struct {
  double accuracy, loss, seconds;
  double steady_ms; /* median epoch time over the second half of training */
} result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* the whole training run; prints one line per epoch when verbose */
static result train(const dataset *d, bool verbose) {
  /* a fixed 80/20 split: a fixed permutation, then first 80% train, rest test */
  int64_t n = d->n, ntrain = n * 4 / 5, ntest = n - ntrain;
  int64_t *perm = malloc(sizeof *perm * (size_t)n);
  int64_t *order = malloc(sizeof *order * (size_t)ntrain);
  if (!perm || !order) {
    fprintf(stderr, "mlp_digits: out of memory\n");
    exit(2);
  }
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  rng_state = 20240601;
  shuffle(perm, n);
  kiln_tensor *xtr, *ytr, *xte, *yte;
  to_tensors(d, perm, ntrain, &xtr, &ytr);
  to_tensors(d, perm + ntrain, ntest, &xte, &yte);
  if (verbose)
    printf("data: %lld images, %lld train / %lld test; model 64-%d-10, batch %d, lr %g\n\n",
           (long long)n, (long long)ntrain, (long long)ntest, HIDDEN, BATCH, LR);

  mlp m = mlp_init();
  result r = {0};
  double epoch_ms[EPOCHS];
  double t_start = now_s();
  if (verbose) printf("epoch  train loss  test acc    time\n");
  for (int epoch = 1; epoch <= EPOCHS; epoch++) {
    double t0 = now_s();
    for (int64_t i = 0; i < ntrain; i++) order[i] = i;
    shuffle(order, ntrain);
    /* the epoch's loss stays a pending Kiln value: read once per epoch */
    kiln_tensor *loss_sum = CK(kiln_zeros(KILN_F32, 0, NULL));
    for (int64_t start = 0; start < ntrain; start += BATCH) {
      int64_t nb = ntrain - start < BATCH ? ntrain - start : BATCH;
      scope s = {.n = 0};
      kiln_tensor *idx = KEEP(&s, kiln_from_data(order + start, KILN_I64, 1, (int64_t[]){nb}));
      kiln_tensor *xb = KEEP(&s, kiln_index_select(xtr, 0, idx));
      kiln_tensor *yb = KEEP(&s, kiln_index_select(ytr, 0, idx));
      kiln_tensor *logits = mlp_forward(&m, xb, &s);
      kiln_tensor *loss = KEEP(&s, kiln_cross_entropy(logits, yb));
      CKI(kiln_backward(loss, NULL));
      kiln_no_grad_push();
      for (int i = 0; i < 4; i++) {
        kiln_tensor *g = CK(kiln_grad(m.p[i]));
        CKI(kiln_sub_scaled_(m.p[i], g, LR));
        kiln_release(g);
        CKI(kiln_zero_grad(m.p[i]));
      }
      kiln_tensor *lossd = KEEP(&s, kiln_detach(loss));
      kiln_tensor *weighted = KEEP(&s, kiln_mul_scalar(lossd, (double)nb));
      kiln_tensor *sum = CK(kiln_add(loss_sum, weighted));
      kiln_no_grad_pop();
      kiln_release(loss_sum);
      loss_sum = sum;
      scope_release(&s);
      /* end of step: evaluate it as one trace, the same trace every step */
      CKI(kiln_sync());
    }
    r.loss = CKD(kiln_item(loss_sum)) / (double)ntrain;
    kiln_release(loss_sum);
    r.accuracy = accuracy(&m, xte, yte);
    epoch_ms[epoch - 1] = 1e3 * (now_s() - t0);
    if (verbose)
      printf("%5d  %10.4f  %7.2f%%  %5.0f ms\n", epoch, r.loss, 100.0 * r.accuracy,
             epoch_ms[epoch - 1]);
  }
  r.seconds = now_s() - t_start;
  qsort(epoch_ms + EPOCHS / 2, EPOCHS - EPOCHS / 2, sizeof *epoch_ms, cmp_double);
  r.steady_ms = epoch_ms[EPOCHS / 2 + (EPOCHS - EPOCHS / 2) / 2];
  for (int i = 0; i < 4; i++) kiln_release(m.p[i]);
  kiln_release(xtr);
  kiln_release(ytr);
  kiln_release(xte);
  kiln_release(yte);
  free(perm);
  free(order);
  return r;
}

/* ---- the KILN_JIT=0 comparison: this program again, in a child process ------- */

static int run_interpreted(const char *path, result *out, double *wall) {
  int fds[2];
  if (pipe(fds) < 0) {
    perror("mlp_digits: pipe");
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  double t0 = now_s();
  pid_t pid = fork();
  if (pid < 0) {
    perror("mlp_digits: fork");
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(127);
    close(fds[1]);
    setenv("KILN_JIT", "0", 1);
    unsetenv("KILN_STATS");
    execl("/proc/self/exe", "mlp_digits", "--no-report", path, (char *)NULL);
    perror("mlp_digits: exec /proc/self/exe");
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  size_t len = 0;
  ssize_t k;
  while ((k = read(fds[0], buf + len, sizeof buf - 1 - len)) > 0 || (k < 0 && errno == EINTR))
    if (k > 0) len += (size_t)k;
  buf[len] = '\0';
  close(fds[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      perror("mlp_digits: waitpid");
      return -1;
    }
  *wall = now_s() - t0;
  /* exit 0, or 1 with a result line (accuracy too low), count as a finished run */
  const char *line = strstr(buf, "result ");
  if (!WIFEXITED(status) || WEXITSTATUS(status) > 1 || !line ||
      sscanf(line, "result %lf %lf %lf %lf", &out->accuracy, &out->loss, &out->seconds,
             &out->steady_ms) != 4) {
    fprintf(stderr, "mlp_digits: the KILN_JIT=0 run failed (wait status %d)\n%s", status, buf);
    return -1;
  }
  return 0;
}

static int main_returns(int rc, bool timestamp) {
  if (timestamp) {
    printf("main returns at %.6f\n", now_s());
    fflush(stdout);
  }
  return rc;
}

int main(int argc, char **argv) {
  bool compare = true, report = true, timestamp = false;
  const char *path = KILN_DATA_DIR "/digits.csv.gz";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--no-compare"))
      compare = false;
    else if (!strcmp(argv[i], "--no-report"))
      report = compare = false;
    else if (!strcmp(argv[i], "--timestamp"))
      timestamp = true;
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: %s [--no-compare] [--timestamp] [DIGITS.csv.gz]\n", argv[0]);
      return 2;
    } else
      path = argv[i];
  }

  dataset d = load_digits(path);
  if (report) {
    printf("Kiln %s on %s, %d threads\n", kiln_version(), kiln_cpu_isa(), kiln_num_threads());
    printf(
        "Handwritten digits: Optical Recognition of Handwritten Digits, E. Alpaydin and\n"
        "C. Kaynak, UCI Machine Learning Repository (1998), CC BY 4.0\n");
  }
  result r = train(&d, report);
  free(d.x);
  free(d.y);

  if (!report) { /* the comparison run: one line for the parent */
    printf("result %.6f %.6f %.6f %.6f\n", r.accuracy, r.loss, r.seconds, r.steady_ms);
    return main_returns(r.accuracy >= MIN_ACCURACY ? 0 : 1, timestamp);
  }

  kiln_stats st;
  kiln_get_stats(&st);
  uint64_t lookups = st.cache_hits + st.cache_misses;
  printf("\nfinal test accuracy %.2f%%, training %.2f s\n", 100.0 * r.accuracy, r.seconds);
  printf(
      "\nKiln stats: %llu ops recorded, %llu flushes (%.0f ms)\n"
      "  traces seen %llu, cache hits %llu of %llu (hit rate %.1f%%)\n"
      "  compiles %llu (%.0f ms, %llu failed), kernels launched %llu\n",
      (unsigned long long)st.ops_recorded, (unsigned long long)st.flushes, st.flush_ms,
      (unsigned long long)st.traces_seen, (unsigned long long)st.cache_hits,
      (unsigned long long)lookups, lookups ? 100.0 * (double)st.cache_hits / (double)lookups : 0.0,
      (unsigned long long)st.compiles, st.compile_ms, (unsigned long long)st.compile_failures,
      (unsigned long long)st.kernels_launched);

  int rc = 0;
  if (compare) {
    printf("\nthe same training with KILN_JIT=0 (interpreter only), in a child process ...\n");
    result ri;
    double wall;
    if (run_interpreted(path, &ri, &wall) < 0) {
      rc = 2;
    } else {
      printf(
          "  KILN_JIT=0: training %5.2f s (process %.2f s), an epoch %5.1f ms once warm, test "
          "accuracy %.2f%%\n",
          ri.seconds, wall, ri.steady_ms, 100.0 * ri.accuracy);
      printf(
          "  JIT on:     training %5.2f s,                an epoch %5.1f ms once warm, test "
          "accuracy %.2f%%\n",
          r.seconds, r.steady_ms, 100.0 * r.accuracy);
      printf(
          "  -> %.1fx overall, %.1fx per epoch once warm; the JIT run compiled %llu plans (%.0f ms "
          "on the\n"
          "     compiler thread, beside the training) and loaded %llu from the disk cache\n",
          ri.seconds / r.seconds, ri.steady_ms / r.steady_ms, (unsigned long long)st.compiles,
          st.compile_ms, (unsigned long long)st.disk_hits);
      if (st.compiles + st.disk_hits == 0)
        printf("  (no trace was compiled in the JIT run: both ran on the interpreter)\n");
      if (ri.accuracy < MIN_ACCURACY) {
        fprintf(stderr, "mlp_digits: FAIL: the KILN_JIT=0 run reached only %.2f%%\n",
                100.0 * ri.accuracy);
        rc = 1;
      }
    }
  }
  if (r.accuracy < MIN_ACCURACY) {
    fprintf(stderr, "mlp_digits: FAIL: test accuracy %.2f%% is below %.0f%%\n", 100.0 * r.accuracy,
            100.0 * MIN_ACCURACY);
    return main_returns(1, timestamp);
  }
  return main_returns(rc, timestamp);
}
