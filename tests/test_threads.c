/* test_threads.c — the API is thread-safe for distinct tensors: several user
 * threads run large ops (which use the kernel pool) at once and get exactly
 * the results a single thread gets; errors stay per thread. */
#include <pthread.h>

#include "ktest.h"

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

typedef struct {
  int seed;
  double result;
  int error_kept;
} work;

static void *worker(void *p) {
  work *w = p;
  kiln_clear_error();
  for (int rep = 0; rep < 5; rep++) w->result = pipeline(w->seed);
  /* an error on this thread is seen by this thread only */
  kiln_tensor *bad = kiln_add(NULL, NULL);
  w->error_kept = bad == NULL && kiln_last_status() == KILN_ERR_ARG;
  return NULL;
}

TEST(concurrent_pipelines_match_single_thread_results) {
  double expected[WORKERS];
  for (int i = 0; i < WORKERS; i++) expected[i] = pipeline(i * 1000);
  pthread_t th[WORKERS];
  work w[WORKERS];
  for (int i = 0; i < WORKERS; i++) {
    w[i] = (work){i * 1000, 0, 0};
    pthread_create(&th[i], NULL, worker, &w[i]);
  }
  for (int i = 0; i < WORKERS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < WORKERS; i++) {
    CHECK(w[i].result == expected[i]);
    CHECK(w[i].error_kept);
  }
  CHECK_EQ_INT(kiln_last_status(), KILN_OK); /* the main thread saw no error */
}

int main(void) {
  RUN(concurrent_pipelines_match_single_thread_results);
  return ktest_done();
}
