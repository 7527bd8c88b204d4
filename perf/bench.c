/* bench.c — the helpers of bench.h. */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(const char *prog, int code) {
  fprintf(code ? stderr : stdout,
          "usage: %s [--smoke] [--reps N] [--warmup N] [--label NAME] [--openblas] [--autodiff]\n"
          "          [--bf16] [--device cpu|cuda]\n"
          "  --smoke      tiny sizes, 1 repetition (checks that it runs, measures nothing)\n"
          "  --reps N     timed runs; the median is reported\n"
          "  --warmup N   untimed runs first\n"
          "  --label NAME contender name (default: kiln-eager if KILN_JIT=0, else kiln)\n"
          "  --openblas   perf_w6 only: also time OpenBLAS cblas_sgemm called directly\n"
          "  --autodiff   perf_w7, perf_g7: gradients from kiln_backward (label kiln-autodiff)\n"
          "  --bf16       perf_w2-w4, perf_w6: in bfloat16; perf_w7: bf16 autocast (W*h)\n"
          "  --device D   perf_g* only: cuda (default) or cpu (the same code on the CPU)\n",
          prog);
  exit(code);
}

static int positive_int(const char *prog, const char *s) {
  char *end;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end || v < 0 || v > 1000000) usage(prog, 2);
  return (int)v;
}

int bench_settle(void (*step)(void *ctx), void *ctx, int max_steps, double max_s) {
  int steps = 0;
  double t0 = bench_now();
  while (steps < max_steps && bench_now() - t0 < max_s) {
    double declined = kiln_stat("compiles_declined");
    step(ctx);
    steps++;
    if (kiln_stat("compiles_declined") == declined) break;
  }
  kiln_jit_wait();
  return steps;
}

void bench_parse(int argc, char **argv, bench_opts *o, int default_reps, int default_warmup) {
  const char *jit = getenv("KILN_JIT");
  o->smoke = false;
  o->reps = default_reps;
  o->warmup = default_warmup;
  o->label = jit && strcmp(jit, "0") == 0 ? "kiln-eager" : "kiln";
  o->openblas = false;
  o->autodiff = false;
  o->bf16 = false;
  o->device = KILN_CUDA;
  const char *label = NULL;
  int reps = -1, warmup = -1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke"))
      o->smoke = true;
    else if (!strcmp(argv[i], "--reps"))
      reps = positive_int(argv[0], i + 1 < argc ? argv[++i] : NULL);
    else if (!strcmp(argv[i], "--warmup"))
      warmup = positive_int(argv[0], i + 1 < argc ? argv[++i] : NULL);
    else if (!strcmp(argv[i], "--label") && i + 1 < argc)
      label = argv[++i];
    else if (!strcmp(argv[i], "--openblas"))
      o->openblas = true;
    else if (!strcmp(argv[i], "--autodiff"))
      o->autodiff = true;
    else if (!strcmp(argv[i], "--bf16"))
      o->bf16 = true;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cpu"))
      o->device = KILN_CPU, i++;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda"))
      o->device = KILN_CUDA, i++;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      usage(argv[0], 0);
    else
      usage(argv[0], 2);
  }
  if (o->smoke) {
    o->reps = 1;
    o->warmup = 1;
  }
  if (reps >= 0) o->reps = reps;
  if (warmup >= 0) o->warmup = warmup;
  if (o->reps < 1) o->reps = 1;
  if (o->autodiff)
    o->label = strcmp(o->label, "kiln-eager") ? "kiln-autodiff" : "kiln-eager-autodiff";
  if (label) o->label = label;
}

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(const double *v, int n) {
  if (n <= 0) return NAN;
  double *s = malloc(sizeof *s * (size_t)n);
  if (!s) abort();
  memcpy(s, v, sizeof *s * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

double bench_min(const double *v, int n) {
  double m = INFINITY;
  for (int i = 0; i < n; i++)
    if (v[i] < m) m = v[i];
  return m;
}

void *bench_ok(void *p, const char *what) {
  if (!p) {
    fprintf(stderr, "perf: %s failed: %s\n", what, kiln_last_error());
    exit(1);
  }
  return p;
}

void bench_ok_status(int status, const char *what) {
  if (status < 0) {
    fprintf(stderr, "perf: %s failed: %s\n", what, kiln_last_error());
    exit(1);
  }
}

void bench_force(kiln_tensor *t) {
  if (!t) bench_ok(NULL, "the timed computation");
  bench_ok_status(kiln_sync(), "kiln_sync");
}

void bench_sgd_step(kiln_tensor *const *params, int n, double lr) {
  kiln_no_grad_push();
  for (int i = 0; i < n; i++) {
    kiln_tensor *g = bench_ok(kiln_grad(params[i]), "kiln_grad");
    bench_ok_status(kiln_sub_scaled_(params[i], g, lr), "kiln_sub_scaled_");
    kiln_release(g);
    bench_ok_status(kiln_zero_grad(params[i]), "kiln_zero_grad");
  }
  kiln_no_grad_pop();
}

void bench_fill_sin(float *x, int64_t n, double freq, double phase, double amp) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(amp * sin((double)i * freq + phase));
}

uint32_t bench_hash_u32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

void bench_fill_hash(float *x, int64_t n, uint32_t seed, double amp) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = bench_hash_u32((uint32_t)((uint64_t)i + (uint64_t)seed * 0x9E3779B9u));
    double u = (double)(h >> 8) / 16777216.0;
    x[i] = (float)(amp * (2.0 * u - 1.0));
  }
}

float *bench_alloc_f32(int64_t n) {
  float *p = malloc(sizeof *p * (size_t)(n > 0 ? n : 1));
  if (!p) {
    fprintf(stderr, "perf: out of memory (%lld floats)\n", (long long)n);
    exit(1);
  }
  return p;
}

kiln_tensor *bench_tensor_hash(int ndim, const int64_t *shape, uint32_t seed, double amp,
                               float offset) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *buf = bench_alloc_f32(n);
  bench_fill_hash(buf, n, seed, amp);
  if (offset != 0.0f)
    for (int64_t i = 0; i < n; i++) buf[i] = offset + buf[i];
  kiln_tensor *t = kiln_from_data(buf, KILN_F32, ndim, shape);
  free(buf);
  return bench_ok(t, "kiln_from_data");
}

kiln_tensor *bench_keep(bench_scope *s, kiln_tensor *t, const char *what) {
  bench_ok(t, what);
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    kiln_tensor **nt = realloc(s->t, sizeof *nt * (size_t)cap);
    if (!nt) {
      fprintf(stderr, "perf: out of memory\n");
      exit(1);
    }
    s->t = nt;
    s->cap = cap;
  }
  return s->t[s->n++] = t;
}

void bench_scope_release(bench_scope *s) {
  while (s->n > 0) kiln_release(s->t[--s->n]);
}

void bench_scope_free(bench_scope *s) {
  bench_scope_release(s);
  free(s->t);
  s->t = NULL;
  s->cap = 0;
}

void bench_summary_f32(char *out, size_t cap, const float *v, int64_t n) {
  double sum = 0, abs_sum = 0, wsum = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = v[i];
    sum += x;
    abs_sum += fabs(x);
    wsum += x * (double)(i % 17 - 8);
  }
  int64_t mid = n / 2 + 5 < n ? n / 2 + 5 : n - 1, idx[4] = {0, n / 7, mid, n - 1};
  snprintf(out, cap, "n=%lld,sum=%.9g,abs=%.9g,wsum=%.9g,s0=%.9g,s1=%.9g,s2=%.9g,s3=%.9g",
           (long long)n, sum, abs_sum, wsum, (double)v[idx[0]], (double)v[idx[1]],
           (double)v[idx[2]], (double)v[idx[3]]);
}

void bench_summary_tensor(char *out, size_t cap, kiln_tensor *t) {
  bench_ok(t, "result");
  int64_t n = kiln_numel(t);
  float *buf = bench_alloc_f32(n);
  kiln_tensor *f = bench_ok(kiln_cast(t, KILN_F32), "result as f32"); /* bf16 widens exactly */
  bench_ok_status(kiln_to_buffer(f, buf, sizeof *buf * (size_t)n), "kiln_to_buffer");
  kiln_release(f);
  bench_summary_f32(out, cap, buf, n);
  free(buf);
}

/* The process's peak resident set (Linux VmHWM) in MiB, -1 where unknown;
   bench_peak_reset starts a new peak at the present resident set.  Each
   @result line reports the peak since the row before it (or since the
   process started), so the memory column is the peak of that row's runs
   with what the process still holds from earlier rows (the model, say)
   counted, the same way for every contender (perf/peers.py reads the same
   counters). */
double bench_peak_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
  fclose(f);
  return kb < 0 ? -1 : kb / 1024.0;
}

void bench_peak_reset(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  fputs("5", f);
  fclose(f);
}

void bench_result_with(const char *workload, const char *contender, const double *times, int n,
                       const char *extra, const char *check, int threads, const char *isa,
                       const char *blas) {
  char peak[48] = "";
  double mib = bench_peak_mib();
  if (mib >= 0) snprintf(peak, sizeof peak, "\tpeak_mib=%.1f", mib);
  printf(
      "@result\tworkload=%s\tcontender=%s\ttime_s=%.9g\tmin_s=%.9g\treps=%d\tthreads=%d\t"
      "isa=%s\tblas=%s%s%s%s\tcheck=%s\n",
      workload, contender, bench_median(times, n), bench_min(times, n), n, threads,
      isa && *isa ? isa : "unknown", blas && *blas ? blas : "none", peak,
      extra && *extra ? "\t" : "", extra ? extra : "", check ? check : "");
  fflush(stdout);
  bench_peak_reset();
}

kiln_tensor *bench_input(const float *buf, int ndim, const int64_t *shape, const bench_opts *o) {
  kiln_tensor *t = bench_ok(kiln_from_data(buf, KILN_F32, ndim, shape), "input");
  if (!o->bf16) return t;
  kiln_tensor *h = bench_ok(kiln_cast(t, KILN_BF16), "bf16 input");
  kiln_release(t);
  bench_force(h);
  return h;
}

const char *bench_name(const char *w, const bench_opts *o) {
  static char name[16];
  snprintf(name, sizeof name, "%s%s", w, o->bf16 ? "h" : "");
  return name;
}

void bench_result(const char *workload, const char *contender, const double *times, int n,
                  const char *extra, const char *check) {
  bench_result_with(workload, contender, times, n, extra, check, kiln_num_threads(), kiln_cpu_isa(),
                    kiln_blas_core());
}

void bench_na(const char *workload, const char *contender, const char *note) {
  printf("@na\tworkload=%s\tcontender=%s\tthreads=%d\tisa=%s\tblas=%s\tnote=%s\n", workload,
         contender, kiln_num_threads(), kiln_cpu_isa(),
         *kiln_blas_core() ? kiln_blas_core() : "none", note);
  fflush(stdout);
}

void bench_adam_step(bench_adam *a, int n, kiln_tensor *const *p, kiln_tensor **m, kiln_tensor **v,
                     bench_scope *s) {
  kiln_no_grad_push();
  a->t++;
  double bc1 = 1.0 - pow(a->b1, a->t), bc2 = 1.0 - pow(a->b2, a->t);
  for (int i = 0; i < n; i++) {
    kiln_tensor *g = bench_keep(s, kiln_grad(p[i]), "kiln_grad");
    /* m = b1*m + (1-b1)*g: a new handle; the old state is released */
    kiln_tensor *mi = bench_ok(kiln_add(bench_keep(s, kiln_mul_scalar(m[i], a->b1), "mul"),
                                        bench_keep(s, kiln_mul_scalar(g, 1.0 - a->b1), "mul")),
                               "add");
    kiln_release(m[i]);
    m[i] = mi;
    kiln_tensor *g2 = bench_keep(s, kiln_mul(g, g), "mul");
    kiln_tensor *vi = bench_ok(kiln_add(bench_keep(s, kiln_mul_scalar(v[i], a->b2), "mul"),
                                        bench_keep(s, kiln_mul_scalar(g2, 1.0 - a->b2), "mul")),
                               "add");
    kiln_release(v[i]);
    v[i] = vi;
    kiln_tensor *mhat = bench_keep(s, kiln_div_scalar(mi, bc1), "div");
    kiln_tensor *vhat = bench_keep(s, kiln_div_scalar(vi, bc2), "div");
    kiln_tensor *den =
        bench_keep(s, kiln_add_scalar(bench_keep(s, kiln_sqrt(vhat), "sqrt"), a->eps), "add");
    kiln_tensor *upd = bench_keep(s, kiln_div(mhat, den), "div");
    bench_ok_status(kiln_sub_scaled_(p[i], upd, a->lr), "kiln_sub_scaled_");
    bench_ok_status(kiln_zero_grad(p[i]), "kiln_zero_grad");
  }
  kiln_no_grad_pop();
}
