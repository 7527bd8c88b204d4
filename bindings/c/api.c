/* api.c — the public C API (include/kiln.h): thin wrappers that name the
 * op for error messages, check host-side arguments, and call the vm layer.
 * No tensor semantics live here; see vm/ and docs/SEMANTICS.md. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../../autodiff/ad.h"
#include "../../front/composite.h"
#include "../../front/format.h"
#include "../../front/layers.h"
#include "../../front/op.h"
#include "../../front/safetensors.h"
#include "../../jit_cpu/jit.h"
#include "../../jit_gpu/backend.h"
#include "../../trace/record.h"
#include "../../vm/blas.h"
#include "../../vm/cpu.h"
#include "../../vm/dist.h"
#include "../../vm/ops.h"
#include "../../vm/pool.h"
#include "../../vm/rng.h"
#include "../../vm/state.h"
#include "kiln.h"

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "0.0.0"
#endif

#define API(name) vm_set_api(#name)

/* --- errors and lifetime ---------------------------------------------------- */

const char *kiln_last_error(void) { return vm_thread()->message; }
kiln_status kiln_last_status(void) { return vm_thread()->status; }
void kiln_clear_error(void) { vm_clear_error(); }

/* true, with KILN_ERR_STATE set under api's name, when t was released
   (vm_released: while its block is not lent again) */
static bool released(const kiln_tensor *t, const char *api, const char *what) {
  if (!t || !vm_released(t)) return false;
  vm_set_api(api);
  vm_error(KILN_ERR_STATE, "the tensor was %s", what);
  return true;
}

kiln_tensor *kiln_retain(kiln_tensor *t) {
  return released(t, "kiln_retain", "released before this use") ? NULL : vm_retain(t);
}

/* a second release of a handle is refused (it would free what the block
   cache has lent to another tensor) */
void kiln_release(kiln_tensor *t) {
  if (!released(t, "kiln_release", "already released")) vm_release(t);
}

/* --- creation ------------------------------------------------------------------ */

static bool check_dtype(kiln_dtype dt) {
  if (vm_dtype_valid((int)dt)) return true;
  vm_error(KILN_ERR_DTYPE, "invalid dtype %d", (int)dt);
  return false;
}

/* bool data is normalized on entry (DESIGN §11): any nonzero byte is true,
   stored as 1, so kernels, compiled or not, only ever see 0 and 1 */
static void normalize_bools(unsigned char *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) b[i] = b[i] != 0;
}

kiln_tensor *kiln_from_data(const void *data, kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_from_data);
  if (!check_dtype(dt)) return NULL;
  vm_tensor *t = vm_tensor_new(dt, ndim, shape);
  if (!t) return NULL;
  if (t->numel > 0 && !data) {
    vm_error(KILN_ERR_ARG, "data is NULL for %lld elements", (long long)t->numel);
    vm_release(t);
    return NULL;
  }
  if (t->numel) memcpy(vm_data(t), data, (size_t)t->numel * vm_dtype_size(dt));
  if (dt == KILN_BOOL) normalize_bools(vm_data(t), t->numel);
  kiln_device d;
  if (!vm_default_device(&d)) {
    vm_release(t);
    return NULL;
  }
  return fe_handle_from_host(t, d);
}

/* creation ops make tensors on the default device (KILN_DEVICE) */
static bool new_tensor_device(vm_attr *attr) {
  kiln_device d;
  if (!vm_default_device(&d)) return false;
  attr->device = (uint8_t)d;
  return true;
}

/* a fill on attr->device; host: v is the user's value (a runtime
   parameter); zeros and ones are literals of the function called */
static kiln_tensor *full_in(vm_attr *attr, double v, bool host, kiln_dtype dt, int ndim,
                            const int64_t *shape) {
  attr->dtype = dt, attr->ndim = ndim, attr->host = host, attr->scalar[0] = v;
  if (ndim) memcpy(attr->shape, shape, (size_t)ndim * sizeof *shape);
  return fe_op(VM_OP_full, 0, NULL, attr);
}

static kiln_tensor *full(double v, bool host, kiln_dtype dt, int ndim, const int64_t *shape) {
  vm_attr attr = {0};
  if (!vm_check_dims_arg(ndim, shape) || !new_tensor_device(&attr)) return NULL;
  return full_in(&attr, v, host, dt, ndim, shape);
}

kiln_tensor *kiln_scalar(double v, kiln_dtype dt) {
  API(kiln_scalar);
  return full(v, true, dt, 0, NULL);
}
kiln_tensor *kiln_zeros(kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_zeros);
  return full(0, false, dt, ndim, shape);
}
kiln_tensor *kiln_ones(kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_ones);
  return full(1, false, dt, ndim, shape);
}
kiln_tensor *kiln_full(double v, kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_full);
  return full(v, true, dt, ndim, shape);
}
kiln_tensor *kiln_full_on(double v, kiln_dtype dt, int ndim, const int64_t *shape, kiln_device d) {
  API(kiln_full_on);
  if (!vm_backend_of(d)) {
    vm_error(KILN_ERR_ARG, "invalid device %d", (int)d);
    return NULL;
  }
  vm_attr attr = {.device = (uint8_t)d};
  return vm_check_dims_arg(ndim, shape) ? full_in(&attr, v, true, dt, ndim, shape) : NULL;
}

kiln_tensor *kiln_arange(double start, double stop, double step, kiln_dtype dt) {
  API(kiln_arange);
  if (!isfinite(start) || !isfinite(stop) || !isfinite(step) || step == 0) {
    vm_error(KILN_ERR_ARG, "bad range start %g, stop %g, step %g", start, stop, step);
    return NULL;
  }
  double count = ceil((stop - start) / step);
  if (count < 0) count = 0;
  if (count > (double)(INT64_MAX / 8)) {
    vm_error(KILN_ERR_SHAPE, "range of %g elements is too large", count);
    return NULL;
  }
  vm_attr attr = {.dtype = dt, .ndim = 1, .shape = {(int64_t)count}, .scalar = {start, step}};
  if (!new_tensor_device(&attr)) return NULL;
  return fe_op(VM_OP_arange, 0, NULL, &attr);
}

void kiln_manual_seed(uint64_t seed) { vm_rng_seed(seed); }

static kiln_tensor *random_tensor(vm_opcode op, kiln_dtype dt, int ndim, const int64_t *shape) {
  int64_t numel;
  if (!check_dtype(dt) || !vm_check_dims_arg(ndim, shape) || !vm_check_shape(ndim, shape, &numel))
    return NULL;
  if (!vm_dtype_is_float(dt)) {
    vm_error(KILN_ERR_DTYPE, "dtype %s is not a float dtype", vm_dtype_name(dt));
    return NULL;
  }
  vm_attr attr = {.dtype = dt, .ndim = ndim};
  if (!new_tensor_device(&attr)) return NULL;
  if (ndim) memcpy(attr.shape, shape, (size_t)ndim * sizeof *shape);
  vm_rng_reserve(vm_rng_blocks(numel, dt), &attr.seed, &attr.counter);
  return fe_op(op, 0, NULL, &attr);
}

kiln_tensor *kiln_rand(kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_rand);
  return random_tensor(VM_OP_rand, dt, ndim, shape);
}
kiln_tensor *kiln_randn(kiln_dtype dt, int ndim, const int64_t *shape) {
  API(kiln_randn);
  return random_tensor(VM_OP_randn, dt, ndim, shape);
}

/* --- inspection ------------------------------------------------------------------- */

static bool have(const kiln_tensor *t, const char *api) {
  vm_set_api(api);
  if (released(t, api, "released before this use")) return false;
  if (t) return true;
  vm_null_input(0);
  return false;
}

/* the status when have(t) failed: a released tensor, or NULL */
static int have_not(const kiln_tensor *t) { return t ? KILN_ERR_STATE : KILN_ERR_ARG; }

int kiln_ndim(const kiln_tensor *t) { return have(t, "kiln_ndim") ? t->ndim : have_not(t); }
const int64_t *kiln_shape(const kiln_tensor *t) { return have(t, "kiln_shape") ? t->shape : NULL; }
int64_t kiln_numel(const kiln_tensor *t) { return have(t, "kiln_numel") ? t->numel : have_not(t); }
kiln_dtype kiln_dtype_of(const kiln_tensor *t) {
  return have(t, "kiln_dtype_of") ? t->dtype : (kiln_dtype)KILN_ERR_ARG;
}
kiln_device kiln_device_of(const kiln_tensor *t) {
  return have(t, "kiln_device_of") ? (kiln_device)t->device : KILN_CPU;
}

int kiln_to_buffer(kiln_tensor *t, void *dst, size_t dst_bytes) {
  if (!have(t, "kiln_to_buffer")) return have_not(t);
  size_t need = (size_t)t->numel * vm_dtype_size(t->dtype);
  if (need > 0 && !dst) return vm_error(KILN_ERR_ARG, "destination is NULL");
  if (dst_bytes < need)
    return vm_error(KILN_ERR_ARG,
                    "buffer of %zu bytes is smaller than the %zu bytes of a %s tensor", dst_bytes,
                    need, vm_dtype_name(t->dtype));
  vm_tensor *v = tr_value(t);
  vm_tensor *c = v ? vm_value_host_contiguous(v) : NULL;
  if (!c) return vm_thread()->status;
  if (need) memcpy(dst, vm_data(c), need);
  vm_release(c);
  return KILN_OK;
}

double kiln_item(kiln_tensor *t) {
  if (!have(t, "kiln_item")) return NAN;
  if (t->numel != 1) {
    char buf[VM_SHAPE_BUF];
    vm_error(KILN_ERR_SHAPE, "a tensor of shape %s has %lld elements, not 1",
             vm_shape_str(buf, t->ndim, t->shape), (long long)t->numel);
    return NAN;
  }
  vm_tensor *v = tr_value(t);
  vm_tensor *h = v ? vm_value_on_host(v) : NULL;
  double x = h ? vm_load_f64(vm_data(h), h->dtype, 0) : NAN;
  vm_release(h);
  return x;
}

int kiln_print(kiln_tensor *t, FILE *f) {
  if (!have(t, "kiln_print")) return have_not(t);
  return fe_format(t, f) ? KILN_OK : vm_thread()->status;
}

/* --- elementwise ------------------------------------------------------------------ */

#define UNARY_API(name)                      \
  kiln_tensor *kiln_##name(kiln_tensor *a) { \
    API(kiln_##name);                        \
    return fe_unary(VM_OP_##name, a);        \
  }
UNARY_API(neg)
UNARY_API(abs)
UNARY_API(exp)
UNARY_API(log)
UNARY_API(sqrt)
UNARY_API(rsqrt)
UNARY_API(sin)
UNARY_API(cos)
UNARY_API(tanh)
UNARY_API(sigmoid)
UNARY_API(erf)
UNARY_API(log1p)
UNARY_API(expm1)
UNARY_API(floor)
UNARY_API(ceil)
UNARY_API(round)
UNARY_API(sign)
UNARY_API(logical_not)

kiln_tensor *kiln_relu(kiln_tensor *a) {
  API(kiln_relu);
  return fe_relu(a);
}
kiln_tensor *kiln_gelu(kiln_tensor *a) {
  API(kiln_gelu);
  return fe_gelu(a);
}

#define BINARY_API(name)                                     \
  kiln_tensor *kiln_##name(kiln_tensor *a, kiln_tensor *b) { \
    API(kiln_##name);                                        \
    return fe_binary(VM_OP_##name, a, b);                    \
  }
BINARY_API(add)
BINARY_API(sub)
BINARY_API(mul)
BINARY_API(div)
BINARY_API(pow)
BINARY_API(maximum)
BINARY_API(minimum)
BINARY_API(eq)
BINARY_API(ne)
BINARY_API(lt)
BINARY_API(le)
BINARY_API(gt)
BINARY_API(ge)
BINARY_API(logical_and)
BINARY_API(logical_or)

#define SCALAR_API(name)                                        \
  kiln_tensor *kiln_##name##_scalar(kiln_tensor *a, double s) { \
    API(kiln_##name##_scalar);                                  \
    return fe_binary_host_scalar(VM_OP_##name, a, s, false);    \
  }
SCALAR_API(add)
SCALAR_API(sub)
SCALAR_API(mul)
SCALAR_API(div)
SCALAR_API(pow)

kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b) {
  API(kiln_where);
  vm_tensor *in[3] = {cond, a, b};
  return fe_op(VM_OP_where, 3, in, NULL);
}

kiln_tensor *kiln_clamp(kiln_tensor *a, double lo, double hi) {
  API(kiln_clamp);
  return fe_clamp(a, lo, hi);
}

kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dt) {
  API(kiln_cast);
  return fe_cast(a, dt);
}

/* --- reductions ------------------------------------------------------------------ */

#define REDUCE_API(name)                                                               \
  kiln_tensor *kiln_##name(kiln_tensor *a, int naxes, const int *axes, bool keepdim) { \
    API(kiln_##name);                                                                  \
    return fe_reduce(VM_OP_##name, a, naxes, axes, keepdim);                           \
  }
REDUCE_API(sum)
REDUCE_API(max)
REDUCE_API(min)
REDUCE_API(prod)

kiln_tensor *kiln_mean(kiln_tensor *a, int naxes, const int *axes, bool keepdim) {
  API(kiln_mean);
  return fe_mean(a, naxes, axes, keepdim);
}

kiln_tensor *kiln_argmax(kiln_tensor *a, int axis, bool keepdim) {
  API(kiln_argmax);
  return fe_reduce(VM_OP_argmax, a, 1, &axis, keepdim);
}
kiln_tensor *kiln_argmin(kiln_tensor *a, int axis, bool keepdim) {
  API(kiln_argmin);
  return fe_reduce(VM_OP_argmin, a, 1, &axis, keepdim);
}

kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b) {
  API(kiln_matmul);
  return fe_binary(VM_OP_matmul, a, b);
}

/* --- shape ops ------------------------------------------------------------------ */

kiln_tensor *kiln_reshape(kiln_tensor *a, int ndim, const int64_t *shape) {
  API(kiln_reshape);
  return fe_reshape(a, ndim, shape);
}
kiln_tensor *kiln_permute(kiln_tensor *a, const int *perm) {
  API(kiln_permute);
  return fe_permute(a, perm);
}
kiln_tensor *kiln_transpose(kiln_tensor *a, int d0, int d1) {
  API(kiln_transpose);
  return fe_transpose(a, d0, d1);
}
kiln_tensor *kiln_expand(kiln_tensor *a, int ndim, const int64_t *shape) {
  API(kiln_expand);
  return fe_expand(a, ndim, shape);
}
kiln_tensor *kiln_squeeze(kiln_tensor *a, int axis) {
  API(kiln_squeeze);
  return fe_squeeze(a, axis);
}
kiln_tensor *kiln_unsqueeze(kiln_tensor *a, int axis) {
  API(kiln_unsqueeze);
  return fe_unsqueeze(a, axis);
}
kiln_tensor *kiln_slice(kiln_tensor *a, int axis, int64_t start, int64_t stop, int64_t step) {
  API(kiln_slice);
  return fe_slice(a, axis, start, stop, step);
}
kiln_tensor *kiln_concat(int n, kiln_tensor *const *ts, int axis) {
  API(kiln_concat);
  return fe_concat(n, ts, axis);
}
kiln_tensor *kiln_stack(int n, kiln_tensor *const *ts, int axis) {
  API(kiln_stack);
  return fe_stack(n, ts, axis);
}
kiln_tensor *kiln_index_select(kiln_tensor *a, int axis, kiln_tensor *idx) {
  API(kiln_index_select);
  return fe_index_op(VM_OP_index_select, a, axis, idx, NULL);
}
kiln_tensor *kiln_gather(kiln_tensor *a, int axis, kiln_tensor *idx) {
  API(kiln_gather);
  return fe_index_op(VM_OP_gather, a, axis, idx, NULL);
}
kiln_tensor *kiln_scatter_add(kiln_tensor *a, int axis, kiln_tensor *idx, kiln_tensor *src) {
  API(kiln_scatter_add);
  return fe_index_op(VM_OP_scatter_add, a, axis, idx, src);
}

/* --- composites ------------------------------------------------------------------ */

kiln_tensor *kiln_softmax(kiln_tensor *a, int axis) {
  API(kiln_softmax);
  return fe_softmax(a, axis);
}
kiln_tensor *kiln_log_softmax(kiln_tensor *a, int axis) {
  API(kiln_log_softmax);
  return fe_log_softmax(a, axis);
}
kiln_tensor *kiln_logsumexp(kiln_tensor *a, int axis, bool keepdim) {
  API(kiln_logsumexp);
  return fe_logsumexp(a, axis, keepdim);
}
kiln_tensor *kiln_layer_norm(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, double eps) {
  API(kiln_layer_norm);
  return fe_layer_norm(x, w, b, eps);
}
kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *target) {
  API(kiln_cross_entropy);
  return fe_cross_entropy(logits, target);
}

kiln_tensor *kiln_triu(kiln_tensor *a, int64_t diagonal) {
  API(kiln_triu);
  return fe_triangle(a, diagonal, true);
}

kiln_tensor *kiln_tril(kiln_tensor *a, int64_t diagonal) {
  API(kiln_tril);
  return fe_triangle(a, diagonal, false);
}

kiln_tensor *kiln_isnan(kiln_tensor *a) {
  API(kiln_isnan);
  return fe_isnan(a);
}

kiln_tensor *kiln_isinf(kiln_tensor *a) {
  API(kiln_isinf);
  return fe_isinf(a);
}

kiln_tensor *kiln_isfinite(kiln_tensor *a) {
  API(kiln_isfinite);
  return fe_isfinite(a);
}

kiln_tensor *kiln_mse_loss(kiln_tensor *a, kiln_tensor *b) {
  API(kiln_mse_loss);
  return fe_mse_loss(a, b);
}

/* --- issue 18: creation, statistics, layers, losses, saving ----------------- */

kiln_tensor *kiln_linspace(double start, double stop, int64_t n, kiln_dtype dt) {
  API(kiln_linspace);
  return fe_linspace(start, stop, n, dt);
}
kiln_tensor *kiln_eye(int64_t n, kiln_dtype dt) {
  API(kiln_eye);
  return fe_eye(n, dt);
}
kiln_tensor *kiln_randint(int64_t low, int64_t high, kiln_dtype dt, int ndim,
                          const int64_t *shape) {
  API(kiln_randint);
  return fe_randint(low, high, dt, ndim, shape);
}
kiln_tensor *kiln_randperm(int64_t n) {
  API(kiln_randperm);
  return fe_randperm(n);
}
kiln_tensor *kiln_clone(kiln_tensor *a) {
  API(kiln_clone);
  return fe_clone(a);
}
kiln_tensor *kiln_var(kiln_tensor *a, int naxes, const int *axes, int correction, bool keepdim) {
  API(kiln_var);
  return fe_var(a, naxes, axes, correction, keepdim);
}
kiln_tensor *kiln_std(kiln_tensor *a, int naxes, const int *axes, int correction, bool keepdim) {
  API(kiln_std);
  return fe_std(a, naxes, axes, correction, keepdim);
}
kiln_tensor *kiln_cumsum(kiln_tensor *a, int axis) {
  API(kiln_cumsum);
  return fe_cumsum(a, axis);
}
kiln_tensor *kiln_sort(kiln_tensor *a, int axis, bool descending, kiln_tensor **indices) {
  API(kiln_sort);
  return fe_sort(a, axis, descending, indices);
}
kiln_tensor *kiln_topk(kiln_tensor *a, int64_t k, int axis, bool largest, kiln_tensor **indices) {
  API(kiln_topk);
  return fe_topk(a, k, axis, largest, indices);
}
kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, const int stride[2],
                         const int padding[2], const int dilation[2], int groups) {
  API(kiln_conv2d);
  return fe_conv2d(x, w, b, stride, padding, dilation, groups);
}
kiln_tensor *kiln_scaled_dot_product_attention(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                               kiln_tensor *mask, bool causal, double scale) {
  API(kiln_scaled_dot_product_attention);
  return fe_attention(q, k, v, mask, causal, scale);
}
kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const int kernel[2], const int stride[2],
                             const int padding[2]) {
  API(kiln_max_pool2d);
  return fe_pool2d(x, true, kernel, stride, padding);
}
kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const int kernel[2], const int stride[2],
                             const int padding[2]) {
  API(kiln_avg_pool2d);
  return fe_pool2d(x, false, kernel, stride, padding);
}
kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *running_mean, kiln_tensor *running_var,
                             kiln_tensor *w, kiln_tensor *b, bool training, double momentum,
                             double eps) {
  API(kiln_batch_norm);
  return fe_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps);
}
kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training) {
  API(kiln_dropout);
  return fe_dropout(x, p, training);
}
kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *idx) {
  API(kiln_embedding);
  return fe_embedding(weight, idx);
}
kiln_tensor *kiln_one_hot(kiln_tensor *idx, int64_t num_classes, kiln_dtype dt) {
  API(kiln_one_hot);
  return fe_one_hot(idx, num_classes, dt);
}
kiln_tensor *kiln_nll_loss(kiln_tensor *log_probs, kiln_tensor *target) {
  API(kiln_nll_loss);
  return fe_nll_loss(log_probs, target);
}
kiln_tensor *kiln_bce_with_logits(kiln_tensor *logits, kiln_tensor *target) {
  API(kiln_bce_with_logits);
  return fe_bce_with_logits(logits, target);
}
int kiln_save(const char *path, int n, const char *const *names, kiln_tensor *const *ts) {
  API(kiln_save);
  return fe_save(path, n, names, ts);
}
int kiln_load(const char *path, int cap, char **names, kiln_tensor **ts) {
  API(kiln_load);
  return fe_load(path, cap, names, ts);
}

int kiln_assign(kiln_tensor *dst, kiln_tensor *src) {
  API(kiln_assign);
  return fe_assign(dst, src);
}
int kiln_sub_scaled_(kiln_tensor *dst, kiln_tensor *src, double alpha) {
  API(kiln_sub_scaled_);
  return fe_sub_scaled(dst, src, alpha);
}

/* --- autodiff ------------------------------------------------------------------ */

int kiln_set_requires_grad(kiln_tensor *t, bool on) {
  API(kiln_set_requires_grad);
  return ad_set_requires_grad(t, on);
}
bool kiln_requires_grad(const kiln_tensor *t) { return ad_requires_grad(t); }
int kiln_backward(kiln_tensor *loss, kiln_tensor *grad) {
  API(kiln_backward);
  return ad_backward(loss, grad);
}
kiln_tensor *kiln_grad(kiln_tensor *leaf) {
  API(kiln_grad);
  return ad_grad(leaf);
}
int kiln_zero_grad(kiln_tensor *leaf) {
  API(kiln_zero_grad);
  return ad_zero_grad(leaf);
}
int kiln_set_grad(kiln_tensor *leaf, kiln_tensor *grad) {
  API(kiln_set_grad);
  return ad_set_grad(leaf, grad);
}
int kiln_grad_of(int nout, kiln_tensor *const *outs, kiln_tensor *const *gouts, int nin,
                 kiln_tensor *const *ins, kiln_tensor **grads, bool create_graph) {
  API(kiln_grad_of);
  return ad_grad_of(nout, outs, gouts, nin, ins, grads, create_graph);
}
/* --- data-parallel training (vm/dist.h, autodiff/dist.c) ------------------------- */

int kiln_dist_init(void) {
  API(kiln_dist_init);
  return vm_dist_init();
}
int kiln_dist_rank(void) {
  API(kiln_dist_rank);
  return vm_dist_rank();
}
int kiln_dist_size(void) {
  API(kiln_dist_size);
  return vm_dist_size();
}
kiln_tensor *kiln_all_reduce(kiln_tensor *t, kiln_reduce_op op) {
  API(kiln_all_reduce);
  vm_attr attr = {.axis = (int)op, .counter = vm_dist_next_seq()};
  return fe_op(VM_OP_all_reduce, 1, &t, &attr);
}
int kiln_dist_average_grads(int n, kiln_tensor *const *params) {
  API(kiln_dist_average_grads);
  return ad_average_grads(n, params);
}
int kiln_dist_finalize(void) {
  API(kiln_dist_finalize);
  if (!vm_dist_ready()) return vm_thread()->status;
  int rc = tr_sync(); /* what this thread recorded runs first: nothing is lost */
  API(kiln_dist_finalize);
  int done = vm_dist_finalize();
  return rc != KILN_OK ? rc : done;
}

kiln_tensor *kiln_detach(kiln_tensor *t) {
  API(kiln_detach);
  return ad_detach(t);
}
int kiln_set_autocast(kiln_dtype dt) {
  API(kiln_set_autocast);
  vm_clear_error();
  if (dt != KILN_F32 && !vm_dtype_is_half(dt))
    return vm_error(KILN_ERR_DTYPE, "autocast is to bfloat16 or float16 (float32: off), not %s",
                    vm_dtype_name((int)dt));
  vm_thread()->autocast = dt == KILN_F32 ? 0 : (int)dt;
  return KILN_OK;
}
int kiln_set_matmul_precision(const char *mode) {
  API(kiln_set_matmul_precision);
  vm_clear_error();
  if (!mode) return vm_error(KILN_ERR_ARG, "mode is NULL (\"highest\" or \"tf32\")");
  bool tf32 = !strcmp(mode, "tf32") || !strcmp(mode, "high");
  if (!tf32 && strcmp(mode, "highest"))
    return vm_error(KILN_ERR_ARG, "unknown matmul precision \"%s\" (\"highest\" or \"tf32\")",
                    mode);
  atomic_store(&vm_process()->tf32, tf32);
  return KILN_OK;
}
const char *kiln_matmul_precision(void) {
  return atomic_load(&vm_process()->tf32) ? "tf32" : "highest";
}
kiln_dtype kiln_autocast_dtype(void) {
  int ac = vm_thread()->autocast;
  return ac ? (kiln_dtype)ac : KILN_F32;
}
int kiln_unscale_grads(int n, kiln_tensor *const *params, double inv_scale, bool *found_inf) {
  API(kiln_unscale_grads);
  return ad_unscale_grads(n, params, inv_scale, found_inf);
}
void kiln_no_grad_push(void) { vm_thread()->no_grad++; }
void kiln_no_grad_pop(void) {
  if (vm_thread()->no_grad > 0) vm_thread()->no_grad--;
}
/* the no_grad depth is the grad mode: the push hands it to its caller and
   clears it, the pop puts it back */
int kiln_enable_grad_push(void) {
  int saved = vm_thread()->no_grad;
  vm_thread()->no_grad = 0;
  return saved;
}
void kiln_enable_grad_pop(int saved) { vm_thread()->no_grad = saved > 0 ? saved : 0; }
bool kiln_is_grad_enabled(void) { return vm_thread()->no_grad == 0; }

/* --- devices ------------------------------------------------------------------ */

/* the backends, registered before main (vm/backend.h): the binding is the
   one layer that knows them all */
__attribute__((constructor)) static void register_backends(void) {
  vm_backend_register(&cpu_backend);
  vm_backend_register(&gpu_backend);
}

bool kiln_device_available(kiln_device d) {
  const vm_backend *b = vm_backend_of(d);
  return b && (!b->unavailable || !b->unavailable());
}

const char *kiln_device_info(kiln_device d) {
  const vm_backend *b = vm_backend_of(d);
  if (!b) return "no such device";
  const char *why = b->unavailable ? b->unavailable() : NULL;
  return why ? why : b->info();
}

kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device d) {
  API(kiln_to_device);
  if (!t) {
    vm_null_input(0);
    return NULL;
  }
  if (!vm_backend_of(d)) {
    vm_error(KILN_ERR_ARG, "invalid device %d", (int)d);
    return NULL;
  }
  if (d == (kiln_device)t->device) return tr_handle_of_node(t->node);
  if (!vm_backend_usable(d)) return NULL;
  vm_tensor *v = tr_value(t); /* an explicit transfer: evaluated here */
  vm_tensor *moved = v ? vm_value_to_device(v, d) : NULL;
  return moved ? tr_handle_from_value(moved) : NULL;
}

/* --- runtime ------------------------------------------------------------------ */

int kiln_sync(void) {
  API(kiln_sync);
  return tr_sync();
}

int kiln_eval(int n, kiln_tensor *const *ts) {
  API(kiln_eval);
  return tr_eval(n, ts);
}

void kiln_jit_wait(void) {
  for (int d = KILN_CPU; d <= KILN_CUDA; d++) {
    const vm_backend *b = vm_backend_of((kiln_device)d);
    if (b && b->compile_wait) b->compile_wait();
  }
}
void kiln_set_cancel_flag(volatile int *flag) { vm_thread()->cancel = flag; }

const char *kiln_version(void) { return KILN_VERSION_STRING; }
size_t kiln_memory_in_use(void) { return vm_memory_in_use(); }
size_t kiln_pending_bytes(const kiln_tensor *t) { return tr_pending_bytes((vm_tensor *)t); }
int kiln_num_threads(void) { return vm_pool_threads(); }
const char *kiln_blas_core(void) { return vm_blas_get()->core; }
const char *kiln_cpu_isa(void) { return vm_cpu_isa(); }
