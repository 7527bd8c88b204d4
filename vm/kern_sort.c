/* kern_sort.c — argsort for the interpreter (compiled plans run it here
 * too: an ordering is a data group, like gather): the stable sorting
 * permutation of every row along an axis.  NaN sorts as the largest value
 * (last ascending, first descending, as PyTorch); -0 and +0 are equal.
 * Rows run in parallel; each is a bottom-up merge sort (stable). */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "pool.h"
#include "state.h"

typedef struct {
  const char *a;    /* contiguous input */
  int64_t *out;     /* contiguous i64 output */
  int64_t n, inner; /* axis length, product of the dims after it */
  kiln_dtype dt;
  bool descending;
  atomic_bool oom;
} sort_job;

/* "x goes strictly before y" for ascending / descending order */
#define FLOAT_BEFORE(x, y, desc) \
  ((desc) ? ((x) > (y) || (isnan(x) && !isnan(y))) : ((x) < (y) || (!isnan(x) && isnan(y))))
#define PLAIN_BEFORE(x, y, desc) ((desc) ? (x) > (y) : (x) < (y))

/* sorts idx[0, n) by v[idx[k] * stride]; tmp has room for n */
#define DEFINE_SORT(name, T, BEFORE)                                                               \
  static void name(const T *v, int64_t stride, int64_t n, int64_t *idx, int64_t *tmp, bool desc) { \
    for (int64_t lo = 0; lo < n; lo += 16) { /* insertion-sorted runs of 16 */                     \
      int64_t hi = lo + 16 < n ? lo + 16 : n;                                                      \
      for (int64_t k = lo + 1; k < hi; k++) {                                                      \
        int64_t x = idx[k], j = k;                                                                 \
        while (j > lo && BEFORE(v[x * stride], v[idx[j - 1] * stride], desc)) {                    \
          idx[j] = idx[j - 1];                                                                     \
          j--;                                                                                     \
        }                                                                                          \
        idx[j] = x;                                                                                \
      }                                                                                            \
    }                                                                                              \
    for (int64_t w = 16; w < n; w *= 2) {                                                          \
      for (int64_t lo = 0; lo < n; lo += 2 * w) {                                                  \
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;               \
        int64_t i = lo, j = mid, k = lo;                                                           \
        while (i < mid && j < hi) /* the right one only when strictly before */                    \
          tmp[k++] = BEFORE(v[idx[j] * stride], v[idx[i] * stride], desc) ? idx[j++] : idx[i++];   \
        while (i < mid) tmp[k++] = idx[i++];                                                       \
        while (j < hi) tmp[k++] = idx[j++];                                                        \
      }                                                                                            \
      for (int64_t k = 0; k < n; k++) idx[k] = tmp[k];                                             \
    }                                                                                              \
  }

DEFINE_SORT(sort_f32, float, FLOAT_BEFORE)
DEFINE_SORT(sort_f64, double, FLOAT_BEFORE)
DEFINE_SORT(sort_i32, int32_t, PLAIN_BEFORE)
DEFINE_SORT(sort_i64, int64_t, PLAIN_BEFORE)
DEFINE_SORT(sort_u8, unsigned char, PLAIN_BEFORE)
DEFINE_SORT(sort_i8, int8_t, PLAIN_BEFORE)
DEFINE_SORT(sort_i16, int16_t, PLAIN_BEFORE)

static void sort_rows(void *p, int64_t begin, int64_t end) {
  sort_job *j = p;
  int64_t *idx = malloc((size_t)j->n * 2 * sizeof *idx);
  if (!idx) {
    atomic_store(&j->oom, true);
    return;
  }
  int64_t *tmp = idx + j->n;
  size_t es = vm_dtype_size(j->dt);
  for (int64_t r = begin; r < end; r++) {
    int64_t o = r / j->inner, i = r % j->inner, base = o * j->n * j->inner + i;
    const char *v = j->a + base * (int64_t)es;
    for (int64_t k = 0; k < j->n; k++) idx[k] = k;
    switch (j->dt) {
      case KILN_F32:
        sort_f32((const float *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_F64:
        sort_f64((const double *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_I32:
        sort_i32((const int32_t *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_I64:
        sort_i64((const int64_t *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_BOOL:
      case KILN_U8:
        sort_u8((const unsigned char *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_I8:
        sort_i8((const int8_t *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_I16:
        sort_i16((const int16_t *)v, j->inner, j->n, idx, tmp, j->descending);
        break;
      case KILN_BF16:
      case KILN_F16:
        break; /* computed widened (vm/interp.c) */
    }
    for (int64_t k = 0; k < j->n; k++) j->out[base + k * j->inner] = idx[k];
  }
  free(idx);
}

bool vm_k_argsort(vm_tensor *out, const vm_tensor *a, int axis, bool descending) {
  if (out->numel == 0) return true;
  vm_tensor *c = vm_value_contiguous((vm_tensor *)a);
  if (!c) return false;
  int64_t inner = 1, n = a->shape[axis];
  for (int d = axis + 1; d < a->ndim; d++) inner *= a->shape[d];
  sort_job j = {vm_data(c), vm_data(out), n, inner, a->dtype, descending, false};
  int64_t rows = out->numel / n;
  vm_parallel_for(rows, n >= 4096 ? 1 : (4096 + n - 1) / n, sort_rows, &j);
  vm_release(c);
  if (atomic_load(&j.oom)) {
    vm_error(KILN_ERR_OOM, "out of memory sorting rows of %lld", (long long)n);
    return false;
  }
  return true;
}
