/* test_dist.c — data-parallel training (DESIGN §10, vm/dist.h).
 *
 * Run plainly (ctest test_dist), it checks what a process outside mpirun
 * gets: clear KILN_ERR_STATE errors, never a hang.  Run under mpirun
 * (tests/CMakeLists.txt: test_dist_np2, test_dist_np4), it checks the
 * collectives: every dtype and op against the obvious reduction, views,
 * 0-d and empty tensors, ranks that disagree on a shape, gradients through
 * all_reduce, bucketed gradient averaging (buckets, dtypes, a parameter
 * without a gradient), a training loop that must equal one process
 * training on the whole batch and stay bitwise equal across ranks, settle
 * into one trace per step, and start its first bucket before backward
 * ends; and CUDA tensors (test_dist_np2_cuda_emulated: each rank with an
 * emulated GPU): reductions and averaged gradients that stay on the GPU,
 * and a bucket of gradients on two devices refused.  `test_dist die` and `test_dist hang` are the
 * failure drills (tests/dist_expect_abort.sh runs them). */
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../trace/inspect.h"
#include "ktest.h"

static int rank_, size_;

/* a call returning a status: the status, and its message naming `needle` */
#define CHECK_ERROR_STATUS(call, status, needle)   \
  do {                                             \
    kiln_clear_error();                            \
    CHECK_EQ_INT((call), (status));                \
    CHECK_STR_CONTAINS(kiln_last_error(), needle); \
    kiln_clear_error();                            \
  } while (0)

static kiln_tensor *tensor_f64(int ndim, const int64_t *shape, double (*f)(int64_t, int), int r) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = f(i, r);
  kiln_tensor *t = kiln_from_data(v, KILN_F64, ndim, shape);
  free(v);
  return t;
}

/* --- outside mpirun ---------------------------------------------------- */

TEST(without_mpirun_every_call_says_why) {
  CHECK_EQ_INT(kiln_dist_rank(), KILN_ERR_STATE);
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_dist_init first");
  CHECK_EQ_INT(kiln_dist_size(), KILN_ERR_STATE);
  kiln_tensor *t = kiln_ones(KILN_F32, 1, (int64_t[]){3});
  CHECK_ERROR(kiln_all_reduce(t, KILN_REDUCE_SUM), KILN_ERR_STATE, "kiln_dist_init");
  CHECK_EQ_INT(kiln_dist_finalize(), KILN_ERR_STATE);
  kiln_clear_error();
  CHECK_EQ_INT(kiln_dist_init(), KILN_ERR_STATE);
  CHECK_STR_CONTAINS(kiln_last_error(), "mpirun -np N");
  CHECK_STR_CONTAINS(kiln_last_error(), "kiln_dist_init");
  /* the tensor is still usable: nothing was recorded */
  kiln_tensor *total = kiln_sum(t, 0, NULL, false);
  CHECK_CLOSE(kiln_item(total), 3, 0);
  kiln_release(total);
  kiln_set_requires_grad(t, true);
  CHECK_EQ_INT(kiln_dist_average_grads(1, &t), KILN_ERR_STATE);
  CHECK_EQ_INT(kiln_dist_average_grads(-1, &t), KILN_ERR_ARG);
  CHECK_EQ_INT(kiln_dist_average_grads(1, (kiln_tensor *[]){NULL}), KILN_ERR_ARG);
  kiln_tensor *plain = kiln_ones(KILN_F32, 1, (int64_t[]){3});
  CHECK_EQ_INT(kiln_dist_average_grads(1, &plain), KILN_ERR_ARG);
  CHECK_STR_CONTAINS(kiln_last_error(), "requires grad");
  kiln_release(plain);
  kiln_release(t);
}

TEST(a_missing_mpi_library_is_named) {
  /* pretend mpirun started us, with no libmpi to be found (a child: MPI
     state is per process) */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    setenv("KILN_MPI_LIB", "/nonexistent/libmpi.so.40", 1);
    int rc = kiln_dist_init();
    int ok = rc == KILN_ERR_STATE && strstr(kiln_last_error(), "install Open MPI") &&
             strstr(kiln_last_error(), "/nonexistent/libmpi.so.40");
    if (!ok) fprintf(stderr, "child: rc %d: %s\n", rc, kiln_last_error());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* --- under mpirun ------------------------------------------------------ */

/* rank r's value at i, per dtype: small integers (sums are exact) */
static double value_at(int64_t i, int r) { return (double)((i * 7 + r * 5) % 11) - 4; }

static void check_reduce(kiln_dtype dt, kiln_reduce_op op) {
  int64_t n = 37;
  double *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = dt == KILN_BOOL ? (i + rank_) % 3 == 0 : value_at(i, rank_);
  kiln_tensor *d = kiln_from_data(v, KILN_F64, 1, &n), *t = kiln_cast(d, dt);
  kiln_tensor *r = kiln_all_reduce(t, op);
  CHECK(r != NULL);
  double *got = r ? ktest_values(r) : NULL;
  for (int64_t i = 0; got && i < n; i++) {
    double want = op == KILN_REDUCE_MAX ? -1e300 : 0;
    for (int q = 0; q < size_; q++) {
      double x = dt == KILN_BOOL ? (i + q) % 3 == 0 : value_at(i, q);
      want = op == KILN_REDUCE_MAX ? fmax(want, x) : want + x;
    }
    if (dt == KILN_BOOL) want = want > 0;
    if (op == KILN_REDUCE_MEAN) want /= size_;
    if (got[i] != want) {
      KTEST_FAIL("dtype %d %s [%lld]: %g, expected %g", (int)dt,
                 op == KILN_REDUCE_SUM   ? "sum"
                 : op == KILN_REDUCE_MAX ? "max"
                                         : "mean",
                 (long long)i, got[i], want);
      break;
    }
  }
  CHECK(kiln_dtype_of(r) == dt && kiln_numel(r) == n);
  free(got);
  free(v);
  kiln_release(r);
  kiln_release(t);
  kiln_release(d);
}

/* bf16/f16 and u8: summed over the ranks in f32 (halves) or wrapping (u8:
   sums past 255 at 4 ranks), the values exact in every dtype */
static double narrow_value(kiln_dtype dt, int64_t i, int rank) {
  return dt == KILN_U8 ? (double)((i * 9 + 60 * rank) % 256) : (double)(i % 7) - 3.0 + rank;
}

static void check_narrow(kiln_dtype dt, kiln_reduce_op op) {
  int64_t n = 29;
  double v[29];
  for (int64_t i = 0; i < n; i++) v[i] = narrow_value(dt, i, rank_);
  kiln_tensor *d = kiln_from_data(v, KILN_F64, 1, &n), *t = kiln_cast(d, dt);
  kiln_tensor *r = kiln_all_reduce(t, op);
  CHECK(r && kiln_dtype_of(r) == dt);
  double *got = r ? ktest_values(r) : NULL;
  for (int64_t i = 0; got && i < n; i++) {
    double want = op == KILN_REDUCE_MAX ? -1e300 : 0;
    for (int q = 0; q < size_; q++) {
      double x = narrow_value(dt, i, q);
      want = op == KILN_REDUCE_MAX ? fmax(want, x) : want + x;
    }
    if (dt == KILN_U8 && op == KILN_REDUCE_SUM) want = (double)((int64_t)want % 256);
    if (op == KILN_REDUCE_MEAN) want /= size_;
    if (got[i] != want) {
      KTEST_FAIL("dtype %d op %d [%lld]: %g, expected %g", (int)dt, (int)op, (long long)i, got[i],
                 want);
      break;
    }
  }
  free(got);
  kiln_release(r);
  kiln_release(t);
  kiln_release(d);
}

TEST(every_dtype_and_op) {
  const kiln_dtype narrow[] = {KILN_BF16, KILN_F16, KILN_U8};
  for (size_t i = 0; i < sizeof narrow / sizeof *narrow; i++) {
    check_narrow(narrow[i], KILN_REDUCE_SUM);
    check_narrow(narrow[i], KILN_REDUCE_MAX);
    if (narrow[i] != KILN_U8) check_narrow(narrow[i], KILN_REDUCE_MEAN);
  }
  kiln_dtype dts[] = {KILN_BOOL, KILN_I32, KILN_I64, KILN_F32, KILN_F64};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    check_reduce(dts[i], KILN_REDUCE_SUM);
    check_reduce(dts[i], KILN_REDUCE_MAX);
    if (dts[i] == KILN_F32 || dts[i] == KILN_F64) check_reduce(dts[i], KILN_REDUCE_MEAN);
  }
  kiln_tensor *i = kiln_ones(KILN_I32, 1, (int64_t[]){2});
  CHECK_ERROR(kiln_all_reduce(i, KILN_REDUCE_MEAN), KILN_ERR_DTYPE, "not exact");
  CHECK_ERROR(kiln_all_reduce(i, (kiln_reduce_op)7), KILN_ERR_ARG, "kiln_reduce_op");
  CHECK_ERROR(kiln_all_reduce(NULL, KILN_REDUCE_SUM), KILN_ERR_ARG, "NULL");
  kiln_release(i);
}

TEST(views_scalars_and_empty_tensors) {
  /* a transposed view of a computed value */
  kiln_tensor *a = tensor_f64(2, (int64_t[]){3, 4}, value_at, rank_);
  kiln_tensor *at = kiln_transpose(kiln_mul_scalar(a, 2), 0, 1);
  kiln_tensor *r = kiln_all_reduce(at, KILN_REDUCE_SUM);
  double *got = ktest_values(r);
  for (int64_t i = 0; i < 4; i++)
    for (int64_t j = 0; j < 3; j++) {
      double want = 0;
      for (int q = 0; q < size_; q++) want += 2 * value_at(j * 4 + i, q);
      CHECK_CLOSE(got[i * 3 + j], want, 0);
    }
  free(got);
  kiln_tensor *s = kiln_all_reduce(kiln_scalar(rank_ + 1, KILN_F64), KILN_REDUCE_SUM);
  CHECK_CLOSE(kiln_item(s), size_ * (size_ + 1) / 2.0, 0);
  kiln_tensor *e = kiln_all_reduce(kiln_zeros(KILN_F32, 2, (int64_t[]){0, 5}), KILN_REDUCE_SUM);
  CHECK(e && kiln_numel(e) == 0 && kiln_eval(1, &e) == KILN_OK);
  kiln_release(e);
  kiln_release(s);
  kiln_release(r);
  kiln_release(at);
  kiln_release(a);
}

TEST(ranks_that_disagree_all_get_a_shape_error) {
  int64_t n = rank_ == 0 ? 3 : 4;
  kiln_tensor *t = kiln_ones(KILN_F32, 1, &n), *r = kiln_all_reduce(t, KILN_REDUCE_SUM);
  kiln_clear_error();
  CHECK(kiln_eval(1, &r) == KILN_ERR_SHAPE);
  CHECK_STR_CONTAINS(kiln_last_error(), "ranks disagree");
  CHECK_STR_CONTAINS(kiln_last_error(), "element count is 3..4");
  kiln_clear_error();
  /* and the job goes on */
  kiln_tensor *two = kiln_ones(KILN_F32, 1, (int64_t[]){2}),
              *ok = kiln_all_reduce(two, KILN_REDUCE_SUM);
  double *v = ktest_values(ok);
  CHECK(v[0] == size_ && v[1] == size_);
  free(v);
  kiln_release(ok);
  kiln_release(two);
  kiln_release(r);
  kiln_release(t);
}

TEST(reads_at_different_points_on_each_rank) {
  /* rank 0 reads every reduction at once; the others only at the end:
     collectives still run once each, in order, on every rank */
  kiln_tensor *acc = kiln_zeros(KILN_F64, 0, NULL);
  for (int k = 0; k < 5; k++) {
    kiln_tensor *r = kiln_all_reduce(kiln_scalar(rank_ + k, KILN_F64), KILN_REDUCE_SUM);
    if (rank_ == 0) CHECK_CLOSE(kiln_item(r), size_ * (size_ - 1) / 2.0 + size_ * k, 0);
    kiln_tensor *next = kiln_add(acc, r);
    kiln_release(acc);
    kiln_release(r);
    acc = next;
  }
  CHECK_CLOSE(kiln_item(acc), 5 * size_ * (size_ - 1) / 2.0 + size_ * 10.0, 0);
  kiln_release(acc);
}

TEST(gradients_through_all_reduce) {
  kiln_tensor *x = tensor_f64(1, (int64_t[]){5}, value_at, rank_);
  kiln_set_requires_grad(x, true);
  kiln_tensor *sq = kiln_mul(x, x);
  kiln_tensor *loss = kiln_sum(kiln_all_reduce(sq, KILN_REDUCE_SUM), 0, NULL, false);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *g = kiln_grad(x);
  double *gv = ktest_values(g);
  /* every rank's loss is the sum over ranks: d/dx_r = size * 2 x_r */
  for (int i = 0; i < 5; i++) CHECK_CLOSE(gv[i], 2.0 * size_ * value_at(i, rank_), 0);
  free(gv);
  kiln_tensor *m = kiln_sum(kiln_all_reduce(sq, KILN_REDUCE_MAX), 0, NULL, false);
  kiln_clear_error();
  CHECK(kiln_backward(m, NULL) != KILN_OK);
  CHECK_STR_CONTAINS(kiln_last_error(), "with max has no gradient");
  kiln_clear_error();
  kiln_release(m);
  kiln_release(g);
  kiln_release(loss);
  kiln_release(sq);
  kiln_release(x);
}

static double ramp(int64_t i, int r) { return (double)((i * 13 + r) % 17) * 0.125 - 1; }

TEST(average_grads_in_buckets) {
  /* 2.2 MB of gradients: buckets of at most 1 MiB, one per dtype run */
  int64_t big[2] = {300, 300};
  kiln_tensor *p[6] = {tensor_f64(2, big, ramp, 0), tensor_f64(2, big, ramp, 1),
                       kiln_cast(tensor_f64(1, (int64_t[]){10}, ramp, 2), KILN_F32),
                       tensor_f64(2, big, ramp, 3),
                       tensor_f64(1, (int64_t[]){4}, ramp, 4) /* gets no gradient this step */,
                       /* a bf16 gradient: all-reduced in f32 with p2's, rounded once */
                       kiln_cast(tensor_f64(1, (int64_t[]){6}, ramp, 5), KILN_BF16)};
  for (int i = 0; i < 6; i++) kiln_set_requires_grad(p[i], true);
  /* loss = sum_i c_i * sum(p_i), c_i = (rank + 1) * (i + 1): grad p_i = c_i */
  kiln_tensor *loss = kiln_zeros(KILN_F64, 0, NULL);
  for (int i = 0; i < 6; i++) {
    if (i == 4) continue;
    kiln_tensor *s = kiln_mul_scalar(kiln_cast(kiln_sum(p[i], 0, NULL, false), KILN_F64),
                                     (rank_ + 1.0) * (i + 1));
    kiln_tensor *next = kiln_add(loss, s);
    kiln_release(loss);
    kiln_release(s);
    loss = next;
  }
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  double before = kiln_stat("all_reduces");
  CHECK(kiln_dist_average_grads(6, p) == KILN_OK);
  double mean_rank1 = (size_ + 1) / 2.0;
  for (int i = 0; i < 6; i++) {
    kiln_tensor *g = kiln_grad(p[i]);
    CHECK(g != NULL);
    if (!g) continue;
    CHECK(kiln_dtype_of(g) == kiln_dtype_of(p[i]) && kiln_numel(g) == kiln_numel(p[i]));
    double *gv = ktest_values(g);
    double want = i == 4 ? 0 : mean_rank1 * (i + 1); /* 3.5 * 6 = 21 is a bf16 value too */
    for (int64_t k = 0; k < kiln_numel(g); k++)
      if (gv[k] != want) {
        KTEST_FAIL("grad of p[%d][%lld] = %g, expected %g", i, (long long)k, gv[k], want);
        break;
      }
    free(gv);
    kiln_release(g);
  }
  /* p5 (bf16, reduced in f32) and p4 (4 f64) join no bucket of theirs: p5 its own,
     as the first (the order is last to first); p4 p3's; p2 (f32) its own; p1; p0 */
  CHECK_EQ_INT(kiln_stat("all_reduces") - before, 5);
  kiln_tensor *mixed[2] = {p[0], p[1]};
  CHECK_EQ_INT(kiln_dist_average_grads(2, (kiln_tensor *[]){mixed[0], NULL}), KILN_ERR_ARG);
  kiln_release(loss);
  for (int i = 0; i < 6; i++) kiln_release(p[i]);
}

/* --- a training loop ----------------------------------------------------- */

enum { BATCH = 16, IN = 8, HID = 12, OUT = 3, STEPS = 6 };

static double feature(int64_t i, int r) {
  (void)r;
  return sin((double)(i * 7 % 23) + 0.3 * (double)(i % 5));
}
static double init_w(int64_t i, int r) { return 0.3 * cos((double)(i * 3 + r * 11)); }

typedef struct {
  kiln_tensor *w1, *w2;
} mlp;

static mlp mlp_new(void) {
  mlp m = {tensor_f64(2, (int64_t[]){IN, HID}, init_w, 1),
           tensor_f64(2, (int64_t[]){HID, OUT}, init_w, 2)};
  kiln_set_requires_grad(m.w1, true);
  kiln_set_requires_grad(m.w2, true);
  return m;
}

/* one SGD step on rows [lo, hi) of the batch; returns the loss handle */
static kiln_tensor *mlp_step(mlp *m, kiln_tensor *x, kiln_tensor *y, int64_t lo, int64_t hi,
                             bool dist) {
  kiln_tensor *xs = kiln_slice(x, 0, lo, hi, 1), *ys = kiln_slice(y, 0, lo, hi, 1);
  kiln_tensor *h = kiln_tanh(kiln_matmul(xs, m->w1));
  kiln_tensor *logits = kiln_matmul(h, m->w2);
  kiln_tensor *loss = kiln_cross_entropy(logits, ys);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *params[2] = {m->w1, m->w2};
  if (dist) CHECK(kiln_dist_average_grads(2, params) == KILN_OK);
  for (int i = 0; i < 2; i++) {
    kiln_tensor *g = kiln_grad(params[i]);
    kiln_sub_scaled_(params[i], g, 0.5);
    kiln_release(g);
    kiln_zero_grad(params[i]);
  }
  kiln_release(logits);
  kiln_release(h);
  kiln_release(xs);
  kiln_release(ys);
  return loss;
}

static bool same_on_every_rank(kiln_tensor *t) {
  kiln_tensor *hi = kiln_all_reduce(t, KILN_REDUCE_MAX), *neg = kiln_neg(t);
  kiln_tensor *lo = kiln_all_reduce(neg, KILN_REDUCE_MAX);
  double *a = ktest_values(t), *b = ktest_values(hi), *c = ktest_values(lo);
  bool same = true;
  for (int64_t i = 0; i < kiln_numel(t); i++) same = same && a[i] == b[i] && -a[i] == c[i];
  free(a);
  free(b);
  free(c);
  kiln_release(hi);
  kiln_release(lo);
  kiln_release(neg);
  return same;
}

TEST(training_equals_one_process_on_the_whole_batch) {
  kiln_tensor *x = tensor_f64(2, (int64_t[]){BATCH, IN}, feature, 0);
  int64_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 5) % OUT;
  kiln_tensor *y = kiln_from_data(labels, KILN_I64, 1, (int64_t[]){BATCH});
  mlp dist = mlp_new(), ref = mlp_new();
  int64_t shard = BATCH / size_;
  double traces_after_warmup = 0, reduces_after_warmup = 0;
  for (int s = 0; s < STEPS; s++) {
    if (s == 3) {
      traces_after_warmup = kiln_stat("traces_seen");
      reduces_after_warmup = kiln_stat("all_reduces");
    }
    kiln_tensor *l = mlp_step(&dist, x, y, rank_ * shard, (rank_ + 1) * shard, true);
    /* the whole-batch loss, as every rank sees it */
    kiln_tensor *lm = kiln_all_reduce(l, KILN_REDUCE_MEAN);
    kiln_tensor *lr = mlp_step(&ref, x, y, 0, BATCH, false);
    CHECK_CLOSE(kiln_item(lm), kiln_item(lr), 1e-12);
    kiln_release(l);
    kiln_release(lm);
    kiln_release(lr);
  }
  /* steady state: no new trace after the third step, one bucket + the loss per step */
  CHECK_EQ_INT(kiln_stat("traces_seen") - traces_after_warmup, 0);
  CHECK_EQ_INT(kiln_stat("all_reduces") - reduces_after_warmup, 2 * (STEPS - 3));
  kiln_tensor *pd[2] = {dist.w1, dist.w2}, *pr[2] = {ref.w1, ref.w2};
  for (int i = 0; i < 2; i++) {
    double *a = ktest_values(pd[i]), *b = ktest_values(pr[i]);
    for (int64_t k = 0; k < kiln_numel(pd[i]); k++) CHECK_CLOSE(a[k], b[k], 1e-12);
    free(a);
    free(b);
    CHECK(same_on_every_rank(pd[i]));
  }
  kiln_release(dist.w1);
  kiln_release(dist.w2);
  kiln_release(ref.w1);
  kiln_release(ref.w2);
  kiln_release(x);
  kiln_release(y);
}

static double small(int64_t i, int r) { return 0.01 * cos((double)(i % 97) + r); }

TEST(the_first_bucket_starts_before_backward_ends) {
  /* two 1 MiB weights: two buckets; in the step's plan the last layer's
     bucket starts before the first layer's gradient matmul (plans exist
     only with the JIT on) */
  const char *jit = getenv("KILN_JIT");
  if (jit && !strcmp(jit, "0")) {
    printf("skipped the plan-order check: KILN_JIT=0 builds no plans\n");
    return;
  }
  setenv("KILN_INSPECT_IR", "1", 1);
  setenv("KILN_PAYOFF", "0", 1); /* plan the step as soon as it is hot */
  kiln_tensor *w1 = kiln_cast(tensor_f64(2, (int64_t[]){256, 1024}, small, 0), KILN_F32);
  kiln_tensor *w2 = kiln_cast(tensor_f64(2, (int64_t[]){1024, 256}, small, 1), KILN_F32);
  kiln_tensor *x = kiln_cast(tensor_f64(2, (int64_t[]){8, 256}, small, rank_), KILN_F32);
  kiln_set_requires_grad(w1, true);
  kiln_set_requires_grad(w2, true);
  kiln_tensor *p[2] = {w1, w2};
  bool checked = false;
  for (int s = 0; s < 4; s++) {
    kiln_tensor *h = kiln_tanh(kiln_matmul(x, w1));
    kiln_tensor *o = kiln_matmul(h, w2);
    kiln_tensor *loss = kiln_mean(kiln_mul(o, o), 0, NULL, false);
    CHECK(kiln_backward(loss, NULL) == KILN_OK);
    CHECK(kiln_dist_average_grads(2, p) == KILN_OK);
    for (int i = 0; i < 2; i++) {
      kiln_tensor *g = kiln_grad(p[i]);
      kiln_sub_scaled_(p[i], g, 0.1);
      kiln_release(g);
      kiln_zero_grad(p[i]);
    }
    CHECK(kiln_sync() == KILN_OK);
    const char *ir = tr_last_plan_ir();
    if (*ir) {
      const char *start = strstr(ir, "all_reduce_start"), *last_matmul = NULL;
      for (const char *m = strstr(ir, "matmul"); m; m = strstr(m + 1, "matmul")) last_matmul = m;
      CHECK(start && last_matmul && start < last_matmul);
      if (!(start && last_matmul && start < last_matmul)) fprintf(stderr, "%s\n", ir);
      checked = true;
    }
    kiln_release(loss);
    kiln_release(o);
    kiln_release(h);
  }
  CHECK(checked);
  unsetenv("KILN_INSPECT_IR");
  kiln_release(w1);
  kiln_release(w2);
  kiln_release(x);
}

/* --- CUDA tensors ------------------------------------------------------------ */

/* CUDA values reduce through the host (README: NCCL is designed, not
   built): the result is on the GPU, with the CPU's values; gradients on
   the GPU are averaged in buckets and stay there; a bucket of CPU and
   CUDA gradients is refused.  Under test_dist_np2_cuda_emulated every rank
   has an emulated GPU; elsewhere without a GPU it says so and skips. */
TEST(cuda_tensors) {
  if (!kiln_device_available(KILN_CUDA)) {
    if (rank_ == 0) printf("SKIP cuda_tensors: %s\n", kiln_device_info(KILN_CUDA));
    return;
  }
  int64_t n = 37;
  kiln_tensor *c = tensor_f64(1, &n, value_at, rank_);
  kiln_tensor *g = kiln_to_device(c, KILN_CUDA);
  kiln_tensor *rs = kiln_all_reduce(g, KILN_REDUCE_SUM), *rm = kiln_all_reduce(g, KILN_REDUCE_MEAN);
  CHECK(rs && kiln_device_of(rs) == KILN_CUDA && kiln_device_of(rm) == KILN_CUDA);
  double *vs = rs ? ktest_values(rs) : NULL, *vm = rm ? ktest_values(rm) : NULL;
  for (int64_t i = 0; vs && vm && i < n; i++) {
    double want = 0;
    for (int q = 0; q < size_; q++) want += value_at(i, q);
    CHECK_CLOSE(vs[i], want, 0);
    CHECK_CLOSE(vm[i], want / size_, 0);
  }
  free(vs);
  free(vm);
  /* gradients of parameters on the GPU: loss = (rank + 1) * sum(w * x) */
  int64_t s2[2] = {6, 5};
  kiln_tensor *wc = tensor_f64(2, s2, ramp, 0), *w = kiln_to_device(wc, KILN_CUDA);
  kiln_tensor *bc = kiln_zeros(KILN_F32, 1, (int64_t[]){5}), *b = kiln_to_device(bc, KILN_CUDA);
  kiln_set_requires_grad(w, true);
  kiln_set_requires_grad(b, true);
  kiln_tensor *x = kiln_to_device(tensor_f64(2, s2, ramp, rank_ + 1), KILN_CUDA);
  kiln_tensor *wx = kiln_sum(kiln_mul(w, x), 0, NULL, false);
  kiln_tensor *bsum = kiln_cast(kiln_sum(b, 0, NULL, false), KILN_F64);
  kiln_tensor *loss = kiln_mul_scalar(kiln_add(wx, bsum), rank_ + 1.0);
  CHECK(kiln_backward(loss, NULL) == KILN_OK);
  kiln_tensor *params[2] = {w, b};
  CHECK_EQ_INT(kiln_dist_average_grads(2, params), KILN_OK);
  kiln_tensor *gw = kiln_grad(w), *gb = kiln_grad(b);
  CHECK(gw && gb && kiln_device_of(gw) == KILN_CUDA && kiln_device_of(gb) == KILN_CUDA);
  double *gwv = gw ? ktest_values(gw) : NULL, *gbv = gb ? ktest_values(gb) : NULL;
  for (int64_t i = 0; gwv && i < 30; i++) { /* mean over ranks q of (q + 1) * x_q */
    double want = 0;
    for (int q = 0; q < size_; q++) want += (q + 1.0) * ramp(i, q + 1);
    CHECK_CLOSE(gwv[i], want / size_, 1e-15);
  }
  for (int64_t i = 0; gbv && i < 5; i++) CHECK_CLOSE(gbv[i], (size_ + 1) / 2.0, 0);
  free(gwv);
  free(gbv);
  /* one bucket may not hold gradients on two devices */
  kiln_tensor *p_cpu = tensor_f64(1, (int64_t[]){4}, ramp, 3);
  kiln_set_requires_grad(p_cpu, true);
  kiln_tensor *l2 = kiln_sum(p_cpu, 0, NULL, false);
  CHECK(kiln_backward(l2, NULL) == KILN_OK);
  kiln_tensor *mixed[2] = {w, p_cpu};
  CHECK_ERROR_STATUS(kiln_dist_average_grads(2, mixed), KILN_ERR_DEVICE,
                     "params[0] is on cuda and params[1] on cpu");
  kiln_tensor *all[] = {c, g, rs, rm, wc, w, bc, b, x, wx, bsum, loss, gw, gb, p_cpu, l2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) kiln_release(all[i]);
}

/* --- failure drills (tests/dist_expect_abort.sh) -------------------------- */

static int drill(const char *mode) {
  kiln_tensor *t = kiln_ones(KILN_F32, 1, (int64_t[]){4});
  for (int step = 0; step < 4; step++) {
    if (step == 2 && rank_ == 1) {
      if (!strcmp(mode, "die")) {
        fprintf(stderr, "rank 1: failing mid-step\n");
        exit(3); /* without kiln_dist_finalize */
      }
      sleep(600); /* hangs: the others must time out */
    }
    kiln_tensor *r = kiln_all_reduce(t, KILN_REDUCE_SUM);
    kiln_item(kiln_sum(r, 0, NULL, false));
    kiln_release(r);
  }
  kiln_release(t);
  kiln_dist_finalize();
  return 0; /* not reached on a healthy drill */
}

int main(int argc, char **argv) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) {
    RUN(without_mpirun_every_call_says_why);
    RUN(a_missing_mpi_library_is_named);
    return ktest_done();
  }
  if (kiln_dist_init() != KILN_OK) {
    fprintf(stderr, "kiln_dist_init: %s\n", kiln_last_error());
    return 1;
  }
  rank_ = kiln_dist_rank();
  size_ = kiln_dist_size();
  if (argc > 1) return drill(argv[1]);
  CHECK_EQ_INT(size_, atoi(getenv("OMPI_COMM_WORLD_SIZE")));
  CHECK_EQ_INT(kiln_dist_init(), KILN_OK); /* joining twice is fine */
  RUN(every_dtype_and_op);
  RUN(views_scalars_and_empty_tensors);
  RUN(ranks_that_disagree_all_get_a_shape_error);
  RUN(reads_at_different_points_on_each_rank);
  RUN(gradients_through_all_reduce);
  RUN(average_grads_in_buckets);
  RUN(training_equals_one_process_on_the_whole_batch);
  RUN(the_first_bucket_starts_before_backward_ends);
  RUN(cuda_tensors);
  CHECK_EQ_INT(kiln_dist_finalize(), KILN_OK);
  CHECK_EQ_INT(kiln_dist_rank(), KILN_ERR_STATE);
  CHECK_EQ_INT(kiln_dist_init(), KILN_ERR_STATE); /* MPI cannot start twice */
  return ktest_done();
}
