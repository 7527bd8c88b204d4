/* kern_index.c — data movement for the interpreter: index_select, gather,
 * scatter_add (gather's adjoint) and concat.  Index values are checked here,
 * the only place they are known: an index outside [0, size) is an error. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"
#include "state.h"

static bool index_out_of_range(int64_t v, int64_t size, int axis) {
  vm_error(KILN_ERR_ARG, "index %lld is out of range for axis %d of size %lld", (long long)v, axis,
           (long long)size);
  return false;
}

/* the one dimension an index varies along when every other stride is 0
   (a 1-d index, or one expanded from it: index_select's VJP), else -1 */
static int single_varying_dim(const vm_tensor *idx) {
  int dim = -2;
  for (int d = 0; d < idx->ndim; d++)
    if (idx->shape[d] != 1 && idx->strides[d] != 0) dim = dim == -2 ? d : -1;
  return dim == -2 ? (idx->ndim ? 0 : -1) : dim;
}

/* checks every index in idx (i64, any layout) against size */
bool vm_check_indices(const vm_tensor *idx, int64_t size, int axis) {
  int vd = single_varying_dim(idx);
  if (vd >= 0 && idx->numel) { /* each distinct index once */
    const int64_t *b = vm_data(idx);
    for (int64_t k = 0; k < idx->shape[vd]; k++)
      if (b[k * idx->strides[vd]] < 0 || b[k * idx->strides[vd]] >= size)
        return index_out_of_range(b[k * idx->strides[vd]], size, axis);
    return true;
  }
  if (vm_is_contiguous(idx)) {
    const int64_t *b = vm_data(idx);
    for (int64_t k = 0; k < idx->numel; k++)
      if (b[k] < 0 || b[k] >= size) return index_out_of_range(b[k], size, axis);
    return true;
  }
  vm_iter it;
  vm_tensor *ops[1] = {(vm_tensor *)idx};
  vm_iter_init(&it, 1, ops);
  int64_t total = idx->numel, pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < total; f++) {
    int64_t off = 0;
    for (int d = 0; d < it.ndim; d++) off += pos[d] * it.strides[0][d];
    int64_t v = ((const int64_t *)it.base[0])[off];
    if (v < 0 || v >= size) {
      vm_error(KILN_ERR_ARG, "index %lld is out of range for axis %d of size %lld", (long long)v,
               axis, (long long)size);
      return false;
    }
    for (int d = it.ndim - 1; d >= 0 && ++pos[d] == it.shape[d]; d--) pos[d] = 0;
  }
  return true;
}

static void copy_elem(char *dst, const char *src, size_t es) {
  switch (es) {
    case 1:
      *dst = *src;
      break;
    case 2:
      memcpy(dst, src, 2);
      break;
    case 4:
      memcpy(dst, src, 4);
      break;
    default:
      memcpy(dst, src, 8);
      break;
  }
}

/* out[i...] = a[i... with position axis replaced by pick(i...)], over out's
   shape; pick reads idx either at i's axis coordinate (index_select) or at
   i itself (gather) */
static void gather_like(vm_tensor *out, const vm_tensor *a, const vm_tensor *idx, int axis,
                        bool elementwise_idx) {
  size_t es = vm_dtype_size(a->dtype);
  const char *ab = vm_data(a);
  const int64_t *ib = vm_data(idx);
  char *ob = vm_data(out);
  int nd = out->ndim;
  int64_t pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < out->numel; f++) {
    int64_t ioff = 0, aoff = 0;
    if (elementwise_idx)
      for (int d = 0; d < nd; d++) ioff += pos[d] * idx->strides[d];
    else
      ioff = pos[axis] * idx->strides[0];
    for (int d = 0; d < nd; d++) aoff += (d == axis ? ib[ioff] : pos[d]) * a->strides[d];
    copy_elem(ob + f * (int64_t)es, ab + aoff * (int64_t)es, es);
    for (int d = nd - 1; d >= 0 && ++pos[d] == out->shape[d]; d--) pos[d] = 0;
  }
}

static void scatter_add(vm_tensor *out, const vm_tensor *idx, const vm_tensor *src, int axis) {
  int nd = out->ndim;
  const int64_t *ib = vm_data(idx);
  const char *sb = vm_data(src);
  char *ob = vm_data(out);
  int64_t pos[KILN_MAX_DIMS] = {0};
  for (int64_t f = 0; f < idx->numel; f++) {
    int64_t ioff = 0, soff = 0, ooff = 0;
    for (int d = 0; d < nd; d++) {
      ioff += pos[d] * idx->strides[d];
      soff += pos[d] * src->strides[d];
    }
    for (int d = 0; d < nd; d++) ooff += (d == axis ? ib[ioff] : pos[d]) * out->strides[d];
    switch (out->dtype) {
      case KILN_BOOL:
        ((bool *)ob)[ooff] |= ((const bool *)sb)[soff];
        break;
      case KILN_I32:
        ((int32_t *)ob)[ooff] =
            (int32_t)((uint32_t)((int32_t *)ob)[ooff] + (uint32_t)((const int32_t *)sb)[soff]);
        break;
      case KILN_I64:
        ((int64_t *)ob)[ooff] =
            (int64_t)((uint64_t)((int64_t *)ob)[ooff] + (uint64_t)((const int64_t *)sb)[soff]);
        break;
      case KILN_F32:
        ((float *)ob)[ooff] += ((const float *)sb)[soff];
        break;
      case KILN_F64:
        ((double *)ob)[ooff] += ((const double *)sb)[soff];
        break;
      case KILN_U8:
        ((uint8_t *)ob)[ooff] = (uint8_t)(((uint8_t *)ob)[ooff] + ((const uint8_t *)sb)[soff]);
        break;
      case KILN_I8: /* wrapping, as the other integers */
        ((int8_t *)ob)[ooff] =
            (int8_t)(uint8_t)((uint8_t)((int8_t *)ob)[ooff] + (uint8_t)((const int8_t *)sb)[soff]);
        break;
      case KILN_I16:
        ((int16_t *)ob)[ooff] = (int16_t)(uint16_t)((uint16_t)((int16_t *)ob)[ooff] +
                                                    (uint16_t)((const int16_t *)sb)[soff]);
        break;
      case KILN_BF16:
      case KILN_F16:
        break; /* computed widened (vm/interp.c) */
    }
    for (int d = nd - 1; d >= 0 && ++pos[d] == idx->shape[d]; d--) pos[d] = 0;
  }
}

/* --- fast paths for contiguous operands (conv's im2col gather and its
   col2im scatter-add, embeddings): rows of `inner` elements, run in
   parallel over rows; the same values, in the same order per output
   element, as the general loops above. */

static int64_t prod_dims(const int64_t *shape, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= shape[d];
  return p;
}

typedef struct {
  char *out;
  const char *a;
  const int64_t *idx;
  int64_t idx_stride, picks, a_axis, inner;
  size_t es;
} select_job;

/* the length (<= max) of the run of consecutive indices starting at idx[k] */
static int64_t run_length(const int64_t *idx, int64_t stride, int64_t k, int64_t max) {
  int64_t first = idx[k * stride], r = 1;
  while (r < max && idx[(k + r) * stride] == first + r) r++;
  return r;
}

/* out[o, j, :] = a[o, idx[j], :] for the rows t = o * picks + j; single
   elements (inner == 1) go by runs of consecutive indices (im2col's rows) */
static void select_rows(void *p, int64_t begin, int64_t end) {
  const select_job *j = p;
  size_t es = j->es, row = (size_t)j->inner * es;
  int64_t o = begin / j->picks, k = begin % j->picks;
  for (int64_t t = begin; t < end;) {
    int64_t max = j->picks - k < end - t ? j->picks - k : end - t;
    int64_t r = j->inner == 1 ? run_length(j->idx, j->idx_stride, k, max) : 1;
    const char *src = j->a + ((o * j->a_axis + j->idx[k * j->idx_stride]) * j->inner) * (int64_t)es;
    memcpy(j->out + t * (int64_t)row, src, (size_t)r * row);
    t += r;
    k += r;
    if (k == j->picks) k = 0, o++;
  }
}

/* The runs of consecutive values of a 1-d index (im2col's: as long as a
   window row): found once per call, not once per outer row.  runs[2r] is
   the run's first position in the index, runs[2r+1] its length; NULL
   (the caller then goes without) when memory is short. */
static int64_t *index_runs(const int64_t *idx, int64_t stride, int64_t picks, int64_t *nruns) {
  int64_t *runs = malloc(sizeof *runs * 2 * (size_t)(picks ? picks : 1)), n = 0;
  if (!runs) return NULL;
  for (int64_t k = 0; k < picks; n++) {
    int64_t r = run_length(idx, stride, k, picks - k);
    runs[2 * n] = k, runs[2 * n + 1] = r;
    k += r;
  }
  *nruns = n;
  return runs;
}

typedef struct {
  const select_job *j;
  const int64_t *runs;
  int64_t nruns;
} runs_job;

/* select_rows for single elements by precomputed runs, over outer rows */
static void select_runs(void *p, int64_t begin, int64_t end) {
  const runs_job *rj = p;
  const select_job *j = rj->j;
  size_t es = j->es;
  for (int64_t o = begin; o < end; o++) {
    const char *a = j->a + o * j->a_axis * (int64_t)es;
    char *out = j->out + o * j->picks * (int64_t)es;
    for (int64_t r = 0; r < rj->nruns; r++) {
      int64_t k = rj->runs[2 * r], len = rj->runs[2 * r + 1];
      const char *src = a + j->idx[k * j->idx_stride] * (int64_t)es;
      if (es == 4)
        for (int64_t i = 0; i < len; i++) memcpy(out + 4 * (k + i), src + 4 * i, 4);
      else
        memcpy(out + k * (int64_t)es, src, (size_t)len * es);
    }
  }
}

static bool index_select_fast(vm_tensor *out, const vm_tensor *a, const vm_tensor *idx, int axis) {
  if (!vm_is_contiguous(out) || !vm_is_contiguous(a) || idx->ndim != 1) return false;
  select_job j = {vm_data(out),
                  vm_data(a),
                  vm_data(idx),
                  idx->strides[0],
                  idx->shape[0],
                  a->shape[axis],
                  prod_dims(a->shape, axis + 1, a->ndim),
                  vm_dtype_size(a->dtype)};
  int64_t outer = prod_dims(a->shape, 0, axis), rows = outer * j.picks;
  if (!rows) return true;
  runs_job rj = {&j, NULL, 0};
  if (j.inner == 1 && outer > 1) rj.runs = index_runs(j.idx, j.idx_stride, j.picks, &rj.nruns);
  if (rj.runs) {
    vm_parallel_for(outer, (1 << 14) / j.picks + 1, select_runs, &rj);
    free((void *)rj.runs);
  } else {
    vm_parallel_for(rows, j.inner >= 256 ? 16 : 1 << 14, select_rows, &j);
  }
  return true;
}

typedef struct {
  char *out;
  const char *src;
  const int64_t *idx;
  int64_t idx_stride, picks, out_axis, inner;
  kiln_dtype dt;
} scatter_job;

/* runs of consecutive indices add as one vector loop: the positions of a
   run are distinct, and each output element still sums in k order */
#define SCATTER_ROWS(T)                                                                         \
  for (int64_t o = begin; o < end; o++)                                                         \
    for (int64_t k = 0; k < j->picks;) {                                                        \
      int64_t r = j->inner == 1 ? run_length(j->idx, j->idx_stride, k, j->picks - k) : 1;       \
      T *restrict dst = (T *)j->out + (o * j->out_axis + j->idx[k * j->idx_stride]) * j->inner; \
      const T *restrict src = (const T *)j->src + (o * j->picks + k) * j->inner;                \
      for (int64_t i = 0; i < r * j->inner; i++) dst[i] += src[i];                              \
      k += r;                                                                                   \
    }

/* out[o, idx[k], :] += src[o, k, :]: each outer row o owns its output row */
static void scatter_rows(void *p, int64_t begin, int64_t end) {
  const scatter_job *j = p;
  if (j->dt == KILN_F32) {
    SCATTER_ROWS(float)
  } else {
    SCATTER_ROWS(double)
  }
}

typedef struct {
  const scatter_job *j;
  const int64_t *runs;
  int64_t nruns;
} scatter_runs_job;

#define SCATTER_RUNS(T)                                                            \
  for (int64_t o = begin; o < end; o++)                                            \
    for (int64_t r = 0; r < rj->nruns; r++) {                                      \
      int64_t k = rj->runs[2 * r], len = rj->runs[2 * r + 1];                      \
      T *restrict dst = (T *)j->out + o * j->out_axis + j->idx[k * j->idx_stride]; \
      const T *restrict src = (const T *)j->src + o * j->picks + k;                \
      for (int64_t i = 0; i < len; i++) dst[i] += src[i];                          \
    }

/* scatter_rows for single elements by precomputed runs (the same order) */
static void scatter_runs(void *p, int64_t begin, int64_t end) {
  const scatter_runs_job *rj = p;
  const scatter_job *j = rj->j;
  if (j->dt == KILN_F32) {
    SCATTER_RUNS(float)
  } else {
    SCATTER_RUNS(double)
  }
}

/* scatter_add whose index is one 1-d index along axis, expanded (stride 0)
   over the other dimensions: index_select's VJP */
static bool scatter_add_fast(vm_tensor *out, const vm_tensor *idx, const vm_tensor *src, int axis) {
  if ((out->dtype != KILN_F32 && out->dtype != KILN_F64) || !vm_is_contiguous(out) ||
      !vm_is_contiguous(src))
    return false;
  for (int d = 0; d < idx->ndim; d++)
    if (d != axis && idx->strides[d] != 0 && idx->shape[d] != 1) return false;
  for (int d = 0; d < idx->ndim; d++)
    if (d != axis && idx->shape[d] != out->shape[d]) return false;
  scatter_job j = {vm_data(out),
                   vm_data(src),
                   vm_data(idx),
                   idx->strides[axis],
                   idx->shape[axis],
                   out->shape[axis],
                   prod_dims(out->shape, axis + 1, out->ndim),
                   out->dtype};
  int64_t outer = prod_dims(out->shape, 0, axis);
  int64_t per_row = j.picks * j.inner; /* elements an outer row adds */
  if (!outer || !j.picks || !j.inner) return true;
  int64_t grain = per_row >= (1 << 14) ? 1 : (1 << 14) / per_row;
  scatter_runs_job rj = {&j, NULL, 0};
  if (j.inner == 1 && outer > 1) rj.runs = index_runs(j.idx, j.idx_stride, j.picks, &rj.nruns);
  if (rj.runs) {
    vm_parallel_for(outer, grain, scatter_runs, &rj);
    free((void *)rj.runs);
  } else {
    vm_parallel_for(outer, grain, scatter_rows, &j);
  }
  return true;
}

/* gather and its adjoint with every operand contiguous (pooling's argmax
   pick, cross-entropy's, topk's): out[o, k, i] = a[o, idx[o, k, i], i] over
   outer o, the axis k and inner i — and scatter_add's out[o, idx[o,k,i], i]
   += src[o, k, i], in the general loop's order (each output element sums
   in k order) */
typedef struct {
  char *out;
  const char *a;
  const int64_t *idx;
  int64_t picks, a_axis, inner; /* idx's (and out's / src's) axis size; a's / out's */
  kiln_dtype dt;
} elem_job;

static void gather_elems(void *p, int64_t begin, int64_t end) {
  const elem_job *j = p;
  size_t es = vm_dtype_size(j->dt);
  int64_t per = j->picks * j->inner;
  for (int64_t o = begin; o < end; o++) {
    const int64_t *ix = j->idx + o * per;
    const char *a = j->a + o * j->a_axis * j->inner * (int64_t)es;
    char *out = j->out + o * per * (int64_t)es;
    for (int64_t k = 0, f = 0; k < j->picks; k++)
      for (int64_t i = 0; i < j->inner; i++, f++) {
        if (es == 4)
          memcpy(out + 4 * f, a + 4 * (ix[f] * j->inner + i), 4);
        else
          copy_elem(out + f * (int64_t)es, a + (ix[f] * j->inner + i) * (int64_t)es, es);
      }
  }
}

#define SCATTER_ELEMS(T)                                                               \
  for (int64_t o = begin; o < end; o++) {                                              \
    const int64_t *ix = j->idx + o * per;                                              \
    T *restrict out = (T *)j->out + o * j->a_axis * j->inner;                          \
    const T *restrict src = (const T *)j->a + o * per;                                 \
    for (int64_t k = 0, f = 0; k < j->picks; k++)                                      \
      for (int64_t i = 0; i < j->inner; i++, f++) out[ix[f] * j->inner + i] += src[f]; \
  }

static void scatter_elems(void *p, int64_t begin, int64_t end) {
  const elem_job *j = p;
  int64_t per = j->picks * j->inner;
  if (j->dt == KILN_F32) {
    SCATTER_ELEMS(float)
  } else {
    SCATTER_ELEMS(double)
  }
}

/* a: gather's source (scatter_add's output), idx and o: the other two */
static bool elems_fast(bool scatter, vm_tensor *out, const vm_tensor *a, const vm_tensor *idx,
                       const vm_tensor *src, int axis) {
  const vm_tensor *big = scatter ? out : a, *small = scatter ? src : out;
  if (!vm_is_contiguous(big) || !vm_is_contiguous(small) || !vm_is_contiguous(idx)) return false;
  if (scatter && big->dtype != KILN_F32 && big->dtype != KILN_F64) return false;
  for (int d = 0; d < idx->ndim; d++)
    if (idx->shape[d] != small->shape[d] || (d != axis && idx->shape[d] != big->shape[d]))
      return false;
  elem_job j = {
      vm_data(out),     scatter ? vm_data(src) : vm_data(a),        vm_data(idx), idx->shape[axis],
      big->shape[axis], prod_dims(idx->shape, axis + 1, idx->ndim), big->dtype};
  int64_t outer = prod_dims(idx->shape, 0, axis), per = j.picks * j.inner;
  if (outer && per)
    vm_parallel_for(outer, per >= (1 << 15) ? 1 : (1 << 15) / per + 1,
                    scatter ? scatter_elems : gather_elems, &j);
  return true;
}

bool vm_k_index(vm_opcode op, vm_tensor *out, int n, vm_tensor *const *in, const vm_attr *attr) {
  (void)n;
  const vm_tensor *a = in[0], *idx = in[1];
  int axis = attr->axis;
  if (!vm_check_indices(idx, a->shape[axis], axis)) return false;
  switch (op) {
    case VM_OP_index_select:
      if (!index_select_fast(out, a, idx, axis)) gather_like(out, a, idx, axis, false);
      return true;
    case VM_OP_gather:
      if (!elems_fast(false, out, a, idx, NULL, axis)) gather_like(out, a, idx, axis, true);
      return true;
    case VM_OP_scatter_add:
      if (!vm_k_elementwise(VM_OP_copy, out, 1, (vm_tensor *const *)in)) return false;
      if (!scatter_add_fast(out, idx, in[2], axis) &&
          !elems_fast(true, out, NULL, idx, in[2], axis))
        scatter_add(out, idx, in[2], axis);
      return true;
    default:
      return false;
  }
}

/* concat of contiguous parts into a contiguous output: each (outer row,
   part) piece is one memcpy, all of them in one pass over the pool.  The
   general path below dispatches a copy per part, which for a loop's k
   stacked steps (or a GRU's three gate gradients) cost more than the
   bytes it moved. */
typedef struct {
  char *out;
  const char *const *src;
  const int64_t *bytes, *at; /* per part: a row's bytes, where it goes in a row */
  int n;
  int64_t row; /* an output row's bytes */
} concat_job;

static void concat_pieces(void *p, int64_t begin, int64_t end) {
  const concat_job *j = p;
  for (int64_t f = begin; f < end; f++) {
    int64_t o = f / j->n;
    int i = (int)(f - o * j->n);
    memcpy(j->out + o * j->row + j->at[i], j->src[i] + o * j->bytes[i], (size_t)j->bytes[i]);
  }
}

static bool concat_fast(vm_tensor *out, int n, vm_tensor *const *in, int axis) {
  if (!vm_is_contiguous(out)) return false;
  for (int i = 0; i < n; i++)
    if (in[i]->dtype != out->dtype || !vm_is_contiguous(in[i])) return false;
  size_t es = vm_dtype_size(out->dtype);
  int64_t inner = prod_dims(out->shape, axis + 1, out->ndim) * (int64_t)es;
  int64_t outer = prod_dims(out->shape, 0, axis);
  if (!outer || !inner) return true;
  void *mem = malloc((size_t)n * (2 * sizeof(int64_t) + sizeof(char *)));
  if (!mem) return false;
  int64_t *bytes = mem, *at = bytes + n;
  const char **src = (const char **)(at + n);
  int64_t row = 0;
  for (int i = 0; i < n; i++) {
    bytes[i] = in[i]->shape[axis] * inner;
    at[i] = row;
    src[i] = vm_data(in[i]);
    row += bytes[i];
  }
  concat_job j = {vm_data(out), src, bytes, at, n, row};
  int64_t pieces = outer * n, per = row / n + 1;
  vm_parallel_for(pieces, per >= (1 << 16) ? 1 : (1 << 16) / per + 1, concat_pieces, &j);
  free(mem);
  return true;
}

bool vm_k_concat(vm_tensor *out, int n, vm_tensor *const *in, int axis) {
  if (concat_fast(out, n, in, axis)) return true;
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, out->shape, sizeof shape);
    shape[axis] = in[i]->shape[axis];
    if (shape[axis] == 0) continue;
    vm_tensor *part = vm_tensor_view(out, out->ndim, shape, out->strides, at * out->strides[axis]);
    if (!part) return false;
    vm_tensor *pair[1] = {in[i]};
    bool ok = vm_k_elementwise(VM_OP_copy, part, 1, pair);
    vm_release(part);
    if (!ok) return false;
    at += in[i]->shape[axis];
  }
  return true;
}
