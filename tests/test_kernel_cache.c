/* test_kernel_cache.c — the kernel-level cache (DESIGN §4, two levels):
 * traces that share kernels compile each once (a new trace built from
 * known kernels compiles nothing; an RNN unrolled over more lengths
 * compiles no more kernels); a second process loads them from the disk
 * cache and compiles nothing; with the background compiler, a new trace of
 * known kernels runs compiled once hot, with no wait; under a small
 * trace-cache bound, evicted
 * plans release their kernels and the code objects holding them are
 * unloaded (resident code stays bounded); every result is bit for bit the
 * interpreter's (KILN_JIT=0).  The work runs in child processes of this
 * binary, each with its own environment. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ktest.h"

static char self[4096];

/* --- children ---------------------------------------------------------------------- */

typedef struct {
  kiln_tensor *W, *U, *b, *h0, *xs[16];
} rnn_inputs;

static kiln_tensor *rand_leaf(int ndim, const int64_t *shape, double scale) {
  kiln_tensor *r = kiln_randn(KILN_F32, ndim, shape), *s = kiln_mul_scalar(r, scale);
  kiln_release(r);
  return s;
}

static void rnn_inputs_make(rnn_inputs *in) {
  kiln_manual_seed(7);
  int64_t w[2] = {16, 16}, u[2] = {8, 16}, b[1] = {16}, h[2] = {4, 16}, x[2] = {4, 8};
  in->W = rand_leaf(2, w, 0.3);
  in->U = rand_leaf(2, u, 0.3);
  in->b = rand_leaf(1, b, 0.1);
  in->h0 = rand_leaf(2, h, 0.5);
  for (int t = 0; t < 16; t++) in->xs[t] = rand_leaf(2, x, 1.0);
  kiln_sync(); /* leaves of the traces below, not part of them */
}

/* one unrolled GRU-like pass of `len` steps: h = tanh(h W + x_t U + b),
   z = sigmoid(h) * h, then a loss over the last state */
static double rnn(const rnn_inputs *in, int len) {
  kiln_tensor *h = kiln_retain(in->h0);
  for (int t = 0; t < len; t++) {
    kiln_tensor *a = kiln_matmul(h, in->W), *c = kiln_matmul(in->xs[t], in->U), *s = kiln_add(a, c),
                *sb = kiln_add(s, in->b), *th = kiln_tanh(sb), *g = kiln_sigmoid(th),
                *z = kiln_mul(g, th);
    kiln_tensor *all[] = {a, c, s, sb, th, g, h};
    for (int i = 0; i < 7; i++) kiln_release(all[i]);
    h = z;
  }
  kiln_tensor *sq = kiln_mul(h, h), *loss = kiln_sum(sq, 0, NULL, false);
  double v = kiln_item(loss);
  kiln_release(sq);
  kiln_release(loss);
  kiln_release(h);
  return v;
}

/* child "rnn FROM MID TO": lengths FROM..MID, then MID+1..TO, each run
   three times (hot on the second); prints the result bits per length and
   the kernels compiled after each range */
static int rnn_main(int from, int mid, int to) {
  rnn_inputs in;
  rnn_inputs_make(&in);
  for (int len = from; len <= to; len++) {
    double v = 0;
    for (int rep = 0; rep < 3; rep++) v = rnn(&in, len);
    printf("len %d %a\n", len, v);
    if (len == mid)
      printf("first %.0f %.0f %.0f\n", kiln_stat("kernels_compiled"),
             kiln_stat("kernel_cache_hits"), kiln_stat("plans_built"));
  }
  kiln_stats st;
  kiln_get_stats(&st);
  printf("then %.0f %.0f %.0f %llu %llu\n", kiln_stat("kernels_compiled"),
         kiln_stat("kernel_cache_hits"), kiln_stat("plans_built"), (unsigned long long)st.disk_hits,
         (unsigned long long)st.compiles);
  kiln_release(in.W);
  kiln_release(in.U);
  kiln_release(in.b);
  kiln_release(in.h0);
  for (int t = 0; t < 16; t++) kiln_release(in.xs[t]);
  return 0;
}

/* child "rnn-ready": with the background compiler, lengths 3..5 compile
   and are waited for; then length 6, a new trace of known kernels, runs
   compiled as soon as it is hot, with no wait and no compile; prints
   "ready <ops its third run ran on the interpreter> <compiles added>" */
static int rnn_ready_main(void) {
  rnn_inputs in;
  rnn_inputs_make(&in);
  for (int len = 3; len <= 5; len++)
    for (int rep = 0; rep < 3; rep++) rnn(&in, len);
  kiln_jit_wait();
  kiln_stats before, after;
  rnn(&in, 6);
  rnn(&in, 6); /* hot: planned, its kernels all found */
  kiln_get_stats(&before);
  rnn(&in, 6);
  kiln_get_stats(&after);
  printf("ready %llu %llu\n", (unsigned long long)(after.eager_ops - before.eager_ops),
         (unsigned long long)(after.compiles - before.compiles));
  kiln_release(in.W);
  kiln_release(in.U);
  kiln_release(in.b);
  kiln_release(in.h0);
  for (int t = 0; t < 16; t++) kiln_release(in.xs[t]);
  return 0;
}

/* a trace whose one fused kernel differs for every k */
static double chain(kiln_tensor *x, int k) {
  kiln_tensor *y = kiln_retain(x);
  for (int j = 0; j <= k; j++) {
    kiln_tensor *n;
    if (j % 2 == 0) {
      n = kiln_tanh(y);
    } else {
      kiln_tensor *h = kiln_mul_scalar(y, 0.5);
      n = kiln_add(h, x);
      kiln_release(h);
    }
    kiln_release(y);
    y = n;
  }
  kiln_tensor *s = kiln_sum(y, 0, NULL, false);
  double v = kiln_item(s);
  kiln_release(s);
  kiln_release(y);
  return v;
}

/* lines of /proc/self/maps mapping a file of the disk cache */
static int cache_mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[8192];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, "/kernel-v") != NULL;
  if (f) fclose(f);
  return n;
}

/* child "unload N": N traces with a kernel each, then the first again;
   prints the most code objects and cache mappings seen at once, the
   unloads, and every result's bits */
static int unload_main(int n) {
  int64_t shape[1] = {4096};
  kiln_manual_seed(3);
  kiln_tensor *x = kiln_randn(KILN_F32, 1, shape);
  kiln_sync();
  double most_code = 0;
  int most_maps = 0;
  char bits[64 * 40] = "";
  for (int k = 0; k <= n; k++) {
    int which = k < n ? k : 0; /* last: the first trace again, long evicted */
    double v = 0;
    for (int rep = 0; rep < 3; rep++) v = chain(x, which);
    double code = kiln_stat("code_objects");
    int maps = cache_mappings();
    most_code = code > most_code ? code : most_code;
    most_maps = maps > most_maps ? maps : most_maps;
    char one[40];
    snprintf(one, sizeof one, " %a", v);
    strncat(bits, one, sizeof bits - strlen(bits) - 1);
  }
  printf("%.0f %d %.0f %.0f%s\n", most_code, most_maps, kiln_stat("code_unloads"),
         kiln_stat("kernels_compiled"), bits);
  kiln_release(x);
  return 0;
}

/* --- the parent ---------------------------------------------------------------------- */

/* runs this binary with env and args; its stdout into out */
static bool run_child(const char *env, const char *args, char *out, size_t cap) {
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "env KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 %s '%s' %s", env, self,
           args);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  size_t got = fread(out, 1, cap - 1, p);
  out[got] = 0;
  return pclose(p) == 0 && got > 0;
}

/* the "len" lines of a child's output (the results) */
static void results_of(const char *out, char *res, size_t cap) {
  res[0] = 0;
  for (const char *p = out; (p = strstr(p, "len ")); p++) {
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p + 1) : strlen(p);
    strncat(res, p, n < cap - strlen(res) - 1 ? n : cap - strlen(res) - 1);
  }
}

/* a child's "first" or "then" line: kernels compiled, kernel cache hits,
   plans built */
static void counts_of(const char *out, const char *tag, double *a, double *b, double *plans) {
  const char *p = strstr(out, tag);
  *a = *b = *plans = -1;
  if (p) sscanf(p + strlen(tag), "%lf %lf %lf", a, b, plans);
}

static void make_dir(char *dir) { CHECK(mkdtemp(dir) != NULL); }

static void remove_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

TEST(rnn_over_more_lengths_compiles_no_more_kernels) {
  static char jit[1 << 14], interp[1 << 14], r_jit[1 << 14], r_interp[1 << 14];
  CHECK(run_child("KILN_CACHE=0", "rnn 3 6 12", jit, sizeof jit));
  CHECK(run_child("KILN_CACHE=0 KILN_JIT=0", "rnn 3 6 12", interp, sizeof interp));
  double k1, h1, p1, k2, h2, p2;
  counts_of(jit, "first ", &k1, &h1, &p1);
  counts_of(jit, "then ", &k2, &h2, &p2);
  CHECK(k1 >= 2);  /* the step's kernels and the loss */
  CHECK(k1 <= 6);  /* a handful, not one set per length */
  CHECK(k2 == k1); /* lengths 7..12: new traces, no new kernel */
  /* the loop runs rolled (trace/loop.h): every length runs the one step
     plan made for lengths 3..6, so a new length plans nothing and looks
     up no kernel */
  CHECK(p1 >= 1 && p1 <= 4);
  CHECK(p2 == p1);
  CHECK(h2 == h1);
  results_of(jit, r_jit, sizeof r_jit);
  results_of(interp, r_interp, sizeof r_interp);
  CHECK(strlen(r_jit) > 0 && !strcmp(r_jit, r_interp)); /* bit for bit */
  /* fewer lengths, same kernels */
  static char few[1 << 14];
  CHECK(run_child("KILN_CACHE=0", "rnn 3 6 6", few, sizeof few));
  double kf, hf, pf;
  counts_of(few, "then ", &kf, &hf, &pf);
  CHECK(kf == k2);
}

TEST(new_trace_of_known_kernels_runs_compiled_without_waiting) {
  char out[256], ref[256];
  CHECK(run_child("KILN_CACHE=0 KILN_ASYNC=1", "rnn-ready", out, sizeof out));
  CHECK(run_child("KILN_CACHE=0 KILN_JIT=0", "rnn-ready", ref, sizeof ref));
  unsigned long long eager = 0, compiles = 1, eager_ref = 0, unused;
  CHECK(sscanf(out, "ready %llu %llu", &eager, &compiles) == 2);
  CHECK(sscanf(ref, "ready %llu %llu", &eager_ref, &unused) == 2);
  /* the elementwise and reduce ops ran compiled: only the matmuls (12) and
     views stay on the interpreter */
  CHECK(eager_ref >= 40);
  CHECK(eager + 20 <= eager_ref);
  CHECK_EQ_INT((long)compiles, 0);
}

TEST(warm_process_loads_kernels_and_compiles_none) {
  char dir[] = "/tmp/kiln-kcache-test-XXXXXX", env[512];
  make_dir(dir);
  static char cold[1 << 14], warm[1 << 14], r_cold[1 << 14], r_warm[1 << 14];
  for (int by_source = 0; by_source <= 1; by_source++) {
    snprintf(env, sizeof env, "KILN_CACHE_DIR=%s KILN_CACHE_BY_SOURCE=%d", dir, by_source);
    CHECK(run_child(env, "rnn 3 5 8", cold, sizeof cold));
    CHECK(run_child(env, "rnn 3 5 8", warm, sizeof warm));
    double kc, hc, pc, kw, hw, pw;
    counts_of(cold, "then ", &kc, &hc, &pc);
    counts_of(warm, "then ", &kw, &hw, &pw);
    CHECK(kc >= 2);
    CHECK_EQ_INT((long)kw, 0); /* everything from disk */
    unsigned long long disk = 0, compiles = 1;
    const char *p = strstr(warm, "then ");
    CHECK(p && sscanf(p, "then %*f %*f %*f %llu %llu", &disk, &compiles) == 2);
    CHECK(disk >= 2);
    CHECK_EQ_INT((long)compiles, 0);
    results_of(cold, r_cold, sizeof r_cold);
    results_of(warm, r_warm, sizeof r_warm);
    CHECK(strlen(r_cold) > 0 && !strcmp(r_cold, r_warm));
  }
  remove_dir(dir);
}

TEST(evicted_plans_unload_their_code) {
  char dir[] = "/tmp/kiln-kcache-test-XXXXXX", env[512];
  make_dir(dir);
  static char jit[1 << 14], interp[1 << 14];
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s KILN_TRACE_CACHE_MAX=2 KILN_KERNEL_CACHE_MAX=0",
           dir);
  CHECK(run_child(env, "unload 24", jit, sizeof jit));
  CHECK(run_child("KILN_CACHE=0 KILN_JIT=0", "unload 24", interp, sizeof interp));
  double code = -1, unloads = -1, compiled = -1;
  int maps = -1;
  CHECK(sscanf(jit, "%lf %d %lf %lf", &code, &maps, &unloads, &compiled) == 4);
  CHECK(compiled >= 24);             /* one kernel per trace */
  CHECK(code >= 1 && code <= 3);     /* the live plans' objects, not 24 */
  CHECK(maps >= 1 && maps <= 3 * 8); /* a few mappings per object */
  CHECK(unloads >= 20);
  const char *bj = strchr(jit, ' '), *bi = strchr(interp, ' ');
  for (int i = 0; i < 3 && bj && bi; i++) { /* skip the counts */
    bj = strchr(bj + 1, ' ');
    bi = strchr(bi + 1, ' ');
  }
  CHECK(bj && bi && !strcmp(bj, bi)); /* every result, the first trace again too */
  remove_dir(dir);
}

int main(int argc, char **argv) {
  if (argc > 4 && !strcmp(argv[1], "rnn"))
    return rnn_main(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  if (argc > 2 && !strcmp(argv[1], "unload")) return unload_main(atoi(argv[2]));
  if (argc > 1 && !strcmp(argv[1], "rnn-ready")) return rnn_ready_main();
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return 1;
  self[len] = 0;
  RUN(rnn_over_more_lengths_compiles_no_more_kernels);
  RUN(new_trace_of_known_kernels_runs_compiled_without_waiting);
  RUN(warm_process_loads_kernels_and_compiles_none);
  RUN(evicted_plans_unload_their_code);
  return ktest_done();
}
