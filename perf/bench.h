/* bench.h — what every perf/ program shares: options, timing, the
 * deterministic inputs that the peers (perf/peers.py) reproduce exactly, the
 * result summary both sides compare, and the line format scripts/bench reads.
 *
 * Every program prints lines of tab-separated key=value fields:
 *   @result  workload=W1  contender=kiln  time_s=<median seconds per unit>  ...
 *   @na      workload=W8  contender=kiln  note=<why there is no number>
 *   @limit   (perf_stream only) the STREAM-triad bandwidth
 * and anything else it prints is for people. */
#ifndef KILN_PERF_BENCH_H
#define KILN_PERF_BENCH_H

#include <kiln.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  bool smoke;        /* tiny sizes, one repetition */
  int reps, warmup;  /* timed runs, untimed runs before them */
  const char *label; /* contender name: "kiln-eager" when KILN_JIT=0, else "kiln" */
  bool openblas;     /* perf_w6: also time OpenBLAS sgemm called directly */
  bool autodiff;     /* perf_w7, perf_g7: gradients from kiln_backward, not written by hand */
  bool bf16;         /* perf_w2-w4, w6: in bfloat16; w7: bf16 autocast (W2h-W4h, W6h, W7h) */
  /* perf_g*: where the tensors live, KILN_CUDA unless --device cpu (which runs the
     same code on the CPU: a check that it runs, not a GPU measurement) */
  kiln_device device;
} bench_opts;

/* parses --smoke --reps N --warmup N --label NAME --openblas --autodiff --device cpu|cuda;
   exits on --help or a bad argument */
void bench_parse(int argc, char **argv, bench_opts *o, int default_reps, int default_warmup);

double bench_now(void); /* seconds, monotonic */

/* The `kiln` rows measure the steady state of a long run (BENCHMARKS.md:
   after warm-up, trace compiled and cached): a training step's hot traces
   are compiled once the payoff rule finds that they pay, which takes a
   number of steps (their saving so far against the compile's price).
   Runs step(ctx) until a step in which the rule declined no hot trace
   (each is planned, or will never be hot), at most max_steps steps or
   max_s seconds, then waits for the compiler; returns the steps run (0
   with KILN_JIT=0 or KILN_PAYOFF=0, where there is nothing to wait for). */
int bench_settle(void (*step)(void *ctx), void *ctx, int max_steps, double max_s);
double bench_median(const double *v, int n);
double bench_min(const double *v, int n);

/* dies with Kiln's error message when p is NULL (or an int status is < 0) */
void *bench_ok(void *p, const char *what);
void bench_ok_status(int status, const char *what);

/* makes sure t's value is computed (Kiln records ops lazily): kiln_sync() */
void bench_force(kiln_tensor *t);
/* after kiln_backward: params[i] -= lr * grad, then zero_grad, for each of
   the n parameters (SGD as a user writes it) */
void bench_sgd_step(kiln_tensor *const *params, int n, double lr);

/* x[i] = (float)(amp * sin(i * freq + phase)), i in double: numpy computes
   (amp * np.sin(np.arange(n) * freq + phase)).astype(np.float32) */
void bench_fill_sin(float *x, int64_t n, double freq, double phase, double amp);
/* x[i] = (float)(amp * (2 u - 1)), u = (h(k) >> 8) / 2^24, k = (uint32)(i + seed * 0x9E3779B9),
   h = the "lowbias32" integer hash (x ^= x>>16; x *= 0x7feb352d; x ^= x>>15;
   x *= 0x846ca68b; x ^= x>>16): exact in any language with uint32 arithmetic.
   Sinusoids are too regular for weight matrices (their dot products cancel). */
void bench_fill_hash(float *x, int64_t n, uint32_t seed, double amp);
float *bench_alloc_f32(int64_t n);
/* the lowbias32 hash of bench_fill_hash, on its own: token streams and
   sequence lengths (W10) that the peers reproduce with uint32 arithmetic */
uint32_t bench_hash_u32(uint32_t k);
/* an f32 tensor of the given shape filled by bench_fill_hash(seed, amp), plus
   `offset` added in float (offset 0: none); dies on error */
kiln_tensor *bench_tensor_hash(int ndim, const int64_t *shape, uint32_t seed, double amp,
                               float offset);

/* temporaries of one step, released together (grows as needed) */
typedef struct {
  kiln_tensor **t;
  int n, cap;
} bench_scope;
/* remembers t (dies with Kiln's error when t is NULL) and returns it */
kiln_tensor *bench_keep(bench_scope *s, kiln_tensor *t, const char *what);
void bench_scope_release(bench_scope *s); /* releases all, keeps the storage */
void bench_scope_free(bench_scope *s);

/* Adam as users write it (W12, W14's CNN), under kiln_no_grad_push: per
   parameter m = b1*m + (1-b1)*g and v = b2*v + (1-b2)*g*g rebound (new
   handles, the old released), p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
   through kiln_sub_scaled_, then zero_grad; temporaries go to s */
typedef struct {
  double lr, b1, b2, eps;
  int t; /* steps taken */
} bench_adam;
void bench_adam_step(bench_adam *a, int n, kiln_tensor *const *p, kiln_tensor **m, kiln_tensor **v,
                     bench_scope *s);

/* the summary of a float32 result that both sides compute in double:
   n, sum, abs (sum of |v|), wsum (sum of v * ((i % 17) - 8)) and four
   sampled values s0..s3 at i = 0, n/7, min(n/2+5, n-1), n-1 */
void bench_summary_f32(char *out, size_t cap, const float *v, int64_t n);

/* copies t out and summarizes it */
void bench_summary_tensor(char *out, size_t cap, kiln_tensor *t);

/* prints an @result line.  time_s: the median of times[] (seconds per unit of
   work: one evaluation, one op for W5, one step for W7); extra: further
   key=value fields separated by tabs (may be ""); check: the summary. */
/* a tensor of the f32 values buf in the workload's dtype (--bf16: rounded
   to bfloat16, materialized before any timing); dies on error */
kiln_tensor *bench_input(const float *buf, int ndim, const int64_t *shape, const bench_opts *o);
/* the workload's name: w, or w + "h" with --bf16 (W2 -> W2h) */
const char *bench_name(const char *w, const bench_opts *o);
void bench_result(const char *workload, const char *contender, const double *times, int n,
                  const char *extra, const char *check);
/* the same with the machine fields given (for contenders that are not Kiln) */
void bench_result_with(const char *workload, const char *contender, const double *times, int n,
                       const char *extra, const char *check, int threads, const char *isa,
                       const char *blas);
void bench_na(const char *workload, const char *contender, const char *note);
/* the process's peak resident set in MiB since the last reset (-1:
   unknown), and the reset; every @result line reports it as peak_mib and
   then resets it */
double bench_peak_mib(void);
void bench_peak_reset(void);

#endif
