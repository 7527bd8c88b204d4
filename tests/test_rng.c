/* test_rng.c — kiln_rand / kiln_randn: reproducible under kiln_manual_seed,
 * different for different seeds and for consecutive calls, in [0,1), with the
 * right moments, and independent of the thread count (this program re-runs
 * itself as `test_rng dump` under KILN_THREADS=1 and =2 and compares). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* popen, readlink */
#endif
#include <stdint.h>
#include <unistd.h>

#include "ktest.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define BIG (1 << 20)

static char self_path[4096];

/* n values of a fresh rand/randn tensor of dtype dt, as doubles (malloc'd) */
static double *draw(bool normal, kiln_dtype dt, int64_t n) {
  kiln_tensor *t = normal ? kiln_randn(dt, 1, S(n)) : kiln_rand(dt, 1, S(n));
  CHECK(t != NULL);
  double *out = calloc((size_t)n, sizeof(double));
  if (!t) return out;
  CHECK_EQ_INT(kiln_dtype_of(t), dt);
  CHECK_EQ_INT(kiln_numel(t), n);
  if (dt == KILN_F32) {
    float *f = malloc((size_t)n * sizeof(float));
    CHECK(kiln_to_buffer(t, f, (size_t)n * sizeof(float)) >= 0);
    for (int64_t i = 0; i < n; i++) out[i] = f[i];
    free(f);
  } else {
    CHECK(kiln_to_buffer(t, out, (size_t)n * sizeof(double)) >= 0);
  }
  kiln_release(t);
  return out;
}

static int64_t count_equal(const double *a, const double *b, int64_t n) {
  int64_t same = 0;
  for (int64_t i = 0; i < n; i++) same += a[i] == b[i];
  return same;
}

static void moments(const double *x, int64_t n, double *mean, double *var) {
  double s = 0, ss = 0;
  for (int64_t i = 0; i < n; i++) s += x[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
  *var = ss / (double)n;
}

/* ------------------------------------------------------------ reproducible */

TEST(same_seed_gives_same_numbers) {
  const kiln_dtype dts[2] = {KILN_F32, KILN_F64};
  for (int k = 0; k < 2; k++) {
    for (int normal = 0; normal < 2; normal++) {
      kiln_manual_seed(42);
      double *a = draw(normal, dts[k], 1000);
      kiln_manual_seed(42);
      double *b = draw(normal, dts[k], 1000);
      CHECK_EQ_INT(count_equal(a, b, 1000), 1000);
      free(b);
      free(a);
    }
  }
}

TEST(same_seed_replays_a_sequence_of_calls) {
  kiln_manual_seed(3);
  double *a1 = draw(false, KILN_F32, 100);
  double *b1 = draw(true, KILN_F64, 100);
  double *c1 = draw(false, KILN_F64, 100);
  kiln_manual_seed(3);
  double *a2 = draw(false, KILN_F32, 100);
  double *b2 = draw(true, KILN_F64, 100);
  double *c2 = draw(false, KILN_F64, 100);
  CHECK_EQ_INT(count_equal(a1, a2, 100), 100);
  CHECK_EQ_INT(count_equal(b1, b2, 100), 100);
  CHECK_EQ_INT(count_equal(c1, c2, 100), 100);
  free(a1), free(b1), free(c1), free(a2), free(b2), free(c2);
}

TEST(different_seeds_give_different_numbers) {
  kiln_manual_seed(1);
  double *a = draw(false, KILN_F32, 1000);
  kiln_manual_seed(2);
  double *b = draw(false, KILN_F32, 1000);
  CHECK(count_equal(a, b, 1000) < 10);
  kiln_manual_seed(1);
  double *c = draw(true, KILN_F64, 1000);
  kiln_manual_seed(1ULL << 40); /* high seed bits matter too */
  double *d = draw(true, KILN_F64, 1000);
  CHECK(count_equal(c, d, 1000) < 10);
  free(d), free(c), free(b), free(a);
}

TEST(consecutive_calls_give_different_numbers) {
  kiln_manual_seed(9);
  double *a = draw(false, KILN_F32, 1000);
  double *b = draw(false, KILN_F32, 1000);
  double *c = draw(true, KILN_F32, 1000);
  double *d = draw(true, KILN_F32, 1000);
  CHECK(count_equal(a, b, 1000) < 10);
  CHECK(count_equal(c, d, 1000) < 10);
  free(d), free(c), free(b), free(a);
}

TEST(element_i_depends_on_seed_counter_and_i_only) {
  /* counter-based: the first call after a seed gives the same leading values
     whatever its length or shape */
  kiln_manual_seed(5);
  double *short_ = draw(false, KILN_F32, 4);
  kiln_manual_seed(5);
  double *long_ = draw(false, KILN_F32, 8);
  CHECK_EQ_INT(count_equal(short_, long_, 4), 4);
  kiln_manual_seed(5);
  kiln_tensor *m = kiln_rand(KILN_F32, 2, S(2, 4));
  float mv[8] = {0};
  CHECK(m && kiln_to_buffer(m, mv, sizeof mv) >= 0);
  for (int i = 0; i < 8; i++) CHECK(mv[i] == (float)long_[i]);
  kiln_release(m);
  free(long_);
  free(short_);
}

TEST(rand_and_randn_have_requested_shape_and_dtype) {
  kiln_tensor *r = kiln_rand(KILN_F64, 3, S(2, 3, 4));
  kiln_tensor *n = kiln_randn(KILN_F32, 0, NULL);
  CHECK(r && n);
  if (r) {
    CHECK_EQ_INT(kiln_dtype_of(r), KILN_F64);
    CHECK_EQ_INT(kiln_ndim(r), 3);
    CHECK_EQ_INT(kiln_shape(r)[2], 4);
    CHECK_EQ_INT(kiln_numel(r), 24);
  }
  if (n) {
    CHECK_EQ_INT(kiln_dtype_of(n), KILN_F32);
    CHECK_EQ_INT(kiln_ndim(n), 0);
    CHECK(isfinite(kiln_item(n)));
  }
  kiln_release(n);
  kiln_release(r);
}

/* ----------------------------------------------------------- distribution */

static void check_uniform(kiln_dtype dt) {
  kiln_manual_seed(1234);
  double *x = draw(false, dt, BIG);
  double lo = 1, hi = 0;
  for (int64_t i = 0; i < BIG; i++) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(lo < 1e-4); /* and the whole interval is covered */
  CHECK(hi > 1 - 1e-4);
  double mean, var;
  moments(x, BIG, &mean, &var);
  CHECK_CLOSE(mean, 0.5, 0.005);
  CHECK_CLOSE(var, 1.0 / 12.0, 0.005);
  int64_t below_quarter = 0;
  for (int64_t i = 0; i < BIG; i++) below_quarter += x[i] < 0.25;
  CHECK_CLOSE((double)below_quarter / BIG, 0.25, 0.005);
  free(x);
}

TEST(rand_f32_in_unit_interval_with_uniform_moments) { check_uniform(KILN_F32); }
TEST(rand_f64_in_unit_interval_with_uniform_moments) { check_uniform(KILN_F64); }

static void check_normal(kiln_dtype dt) {
  kiln_manual_seed(4321);
  double *x = draw(true, dt, BIG);
  int64_t finite = 0, within_one = 0, beyond_three = 0;
  for (int64_t i = 0; i < BIG; i++) {
    finite += isfinite(x[i]) != 0;
    within_one += fabs(x[i]) < 1.0;
    beyond_three += fabs(x[i]) > 3.0;
  }
  CHECK_EQ_INT(finite, BIG);
  double mean, var;
  moments(x, BIG, &mean, &var);
  CHECK_CLOSE(mean, 0.0, 0.01);
  CHECK_CLOSE(var, 1.0, 0.01);
  CHECK_CLOSE((double)within_one / BIG, 0.682689, 0.005);     /* P(|z| < 1) */
  CHECK_CLOSE((double)beyond_three / BIG, 0.0026998, 0.0005); /* P(|z| > 3) */
  free(x);
}

TEST(randn_f32_has_standard_normal_moments) { check_normal(KILN_F32); }
TEST(randn_f64_has_standard_normal_moments) { check_normal(KILN_F64); }

/* ------------------------------------------------------ thread independence */

/* `test_rng dump`: what the thread-count test compares between two runs */
static int dump(void) {
  printf("threads %d\n", kiln_num_threads());
  double *d = draw(false, KILN_F32, 4); /* default seed, no kiln_manual_seed */
  printf("default %.9g %.9g %.9g %.9g\n", d[0], d[1], d[2], d[3]);
  free(d);
  kiln_manual_seed(7);
  kiln_tensor *t = kiln_randn(KILN_F32, 1, S(BIG));
  float *f = malloc(BIG * sizeof(float));
  if (!t || kiln_to_buffer(t, f, BIG * sizeof(float)) < 0) {
    printf("error %s\n", kiln_last_error());
    free(f);
    kiln_release(t);
    return 1;
  }
  for (int i = 0; i < 16; i++) printf("%.9g\n", f[i]);
  uint64_t h = 1469598103934665603ULL; /* FNV-1a over the bytes */
  const unsigned char *p = (const unsigned char *)f;
  for (size_t i = 0; i < BIG * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ULL;
  double sum = 0;
  for (int i = 0; i < BIG; i++) sum += f[i];
  printf("checksum %016llx sum %.17g\n", (unsigned long long)h, sum);
  double *u = draw(false, KILN_F64, 1000); /* the counter moved on */
  printf("after %.17g %.17g\n", u[0], u[999]);
  free(u);
  free(f);
  kiln_release(t);
  return 0;
}

/* runs `KILN_THREADS=n self dump`; returns its output (malloc'd) */
static char *run_dump(int threads) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "KILN_THREADS=%d '%s' dump", threads, self_path);
  FILE *p = popen(cmd, "r");
  if (!p) {
    KTEST_FAIL("popen(%s) failed", cmd);
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *out = malloc(cap);
  size_t got;
  while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 64) out = realloc(out, cap *= 2);
  }
  out[len] = '\0';
  int rc = pclose(p);
  if (rc != 0) KTEST_FAIL("%s exited with %d:\n%s", cmd, rc, out);
  return out;
}

TEST(numbers_do_not_depend_on_thread_count) {
  char *one = run_dump(1);
  char *two = run_dump(2);
  if (one && two) {
    CHECK(strncmp(one, "threads 1\n", 10) == 0);
    CHECK(strncmp(two, "threads 2\n", 10) == 0);
    const char *r1 = strchr(one, '\n'), *r2 = strchr(two, '\n');
    CHECK(r1 && r2);
    if (r1 && r2) {
      CHECK_STR_CONTAINS(r1, "checksum ");
      if (strcmp(r1, r2) != 0) KTEST_FAIL("outputs differ:\n%s\n--- vs ---\n%s", one, two);
    }
  }
  free(two);
  free(one);
}

TEST(default_seed_is_fixed_across_runs) {
  char *a = run_dump(1);
  char *b = run_dump(1);
  if (a && b) {
    const char *da = strstr(a, "default "), *db = strstr(b, "default ");
    CHECK(da && db);
    if (da && db) CHECK(strncmp(da, db, strcspn(da, "\n")) == 0);
    if (strcmp(a, b) != 0) KTEST_FAIL("two runs differ:\n%s\n--- vs ---\n%s", a, b);
  }
  free(b);
  free(a);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "dump") == 0) return dump();
  ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (n > 0) {
    self_path[n] = '\0';
  } else {
    snprintf(self_path, sizeof self_path, "%s", argv[0]);
  }
  RUN(same_seed_gives_same_numbers);
  RUN(same_seed_replays_a_sequence_of_calls);
  RUN(different_seeds_give_different_numbers);
  RUN(consecutive_calls_give_different_numbers);
  RUN(element_i_depends_on_seed_counter_and_i_only);
  RUN(rand_and_randn_have_requested_shape_and_dtype);
  RUN(rand_f32_in_unit_interval_with_uniform_moments);
  RUN(rand_f64_in_unit_interval_with_uniform_moments);
  RUN(randn_f32_has_standard_normal_moments);
  RUN(randn_f64_has_standard_normal_moments);
  RUN(numbers_do_not_depend_on_thread_count);
  RUN(default_seed_is_fixed_across_runs);
  return ktest_done();
}
