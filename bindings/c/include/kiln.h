/* kiln.h — the public C API of Kiln, a tracing JIT tensor runtime.
 *
 * The contract is ../shared/API.md: names and meanings here never change.
 * Errors: functions returning a pointer return NULL on failure, functions
 * returning int return a negative kiln_status; the message is thread-local.
 * An op given a NULL tensor returns NULL and keeps the first error. */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

typedef struct kiln_tensor kiln_tensor; /* opaque, reference counted */

/* bf16 and f16 are storage dtypes: ops load them into f32, compute in f32
   and round to nearest even on store (docs/SEMANTICS.md "Half precision").
   u8 is an unsigned byte (images, raw bytes); i8 and i16 are signed
   integers of 8 and 16 bits.  Values keep their numbers. */
typedef enum {
  KILN_BOOL,
  KILN_I32,
  KILN_I64,
  KILN_F32,
  KILN_F64,
  KILN_BF16,
  KILN_F16,
  KILN_U8,
  KILN_I8,
  KILN_I16
} kiln_dtype;
typedef enum { KILN_CPU, KILN_CUDA } kiln_device;
#define KILN_MAX_DIMS 8

typedef enum {
  KILN_OK = 0,
  KILN_ERR_ARG = -1,
  KILN_ERR_SHAPE = -2,
  KILN_ERR_DTYPE = -3,
  KILN_ERR_OOM = -4,
  KILN_ERR_DEVICE = -5,
  KILN_ERR_STATE = -6,
  KILN_ERR_INTERNAL = -7
} kiln_status;

/* errors */
KILN_API const char *kiln_last_error(void);
KILN_API kiln_status kiln_last_status(void);
KILN_API void kiln_clear_error(void);

/* lifetime: every returned tensor is owned by the caller (refcount 1) */
KILN_API kiln_tensor *kiln_retain(kiln_tensor *t);
KILN_API void kiln_release(kiln_tensor *t); /* NULL is fine */

/* creation (data is copied) */
KILN_API kiln_tensor *kiln_from_data(const void *data, kiln_dtype dt, int ndim,
                                     const int64_t *shape);
KILN_API kiln_tensor *kiln_scalar(double v, kiln_dtype dt); /* 0-d */
KILN_API kiln_tensor *kiln_zeros(kiln_dtype dt, int ndim, const int64_t *shape);
KILN_API kiln_tensor *kiln_ones(kiln_dtype dt, int ndim, const int64_t *shape);
KILN_API kiln_tensor *kiln_full(double v, kiln_dtype dt, int ndim, const int64_t *shape);
/* kiln_full on device d (not the default device): recorded there, so a
   fill next to CUDA tensors fuses into their kernels with no copy */
KILN_API kiln_tensor *kiln_full_on(double v, kiln_dtype dt, int ndim, const int64_t *shape,
                                   kiln_device d);
KILN_API kiln_tensor *kiln_arange(double start, double stop, double step, kiln_dtype dt);
KILN_API void kiln_manual_seed(uint64_t seed);
KILN_API kiln_tensor *kiln_rand(kiln_dtype dt, int ndim, const int64_t *shape);  /* U[0,1) */
KILN_API kiln_tensor *kiln_randn(kiln_dtype dt, int ndim, const int64_t *shape); /* N(0,1) */

/* inspection (shape/dtype never force evaluation) */
KILN_API int kiln_ndim(const kiln_tensor *t);
KILN_API const int64_t *kiln_shape(const kiln_tensor *t);
KILN_API int64_t kiln_numel(const kiln_tensor *t);
KILN_API kiln_dtype kiln_dtype_of(const kiln_tensor *t);
KILN_API kiln_device kiln_device_of(const kiln_tensor *t);
/* these force evaluation */
KILN_API int kiln_to_buffer(kiln_tensor *t, void *dst, size_t dst_bytes); /* row-major */
KILN_API double kiln_item(kiln_tensor *t); /* one-element tensors; NAN + error otherwise */
KILN_API int kiln_print(kiln_tensor *t, FILE *f);

/* elementwise unary: same signature for every op below.  Float math on an
   integer or bool tensor gives float32, as in PyTorch. */
KILN_API kiln_tensor *kiln_neg(kiln_tensor *a);
KILN_API kiln_tensor *kiln_abs(kiln_tensor *a);
KILN_API kiln_tensor *kiln_exp(kiln_tensor *a);
KILN_API kiln_tensor *kiln_log(kiln_tensor *a);
KILN_API kiln_tensor *kiln_sqrt(kiln_tensor *a);
KILN_API kiln_tensor *kiln_rsqrt(kiln_tensor *a);
KILN_API kiln_tensor *kiln_sin(kiln_tensor *a);
KILN_API kiln_tensor *kiln_cos(kiln_tensor *a);
KILN_API kiln_tensor *kiln_tanh(kiln_tensor *a);
KILN_API kiln_tensor *kiln_sigmoid(kiln_tensor *a);
KILN_API kiln_tensor *kiln_relu(kiln_tensor *a);
KILN_API kiln_tensor *kiln_gelu(kiln_tensor *a); /* exact (erf) form */
KILN_API kiln_tensor *kiln_erf(kiln_tensor *a);
KILN_API kiln_tensor *kiln_log1p(kiln_tensor *a);
KILN_API kiln_tensor *kiln_expm1(kiln_tensor *a);
KILN_API kiln_tensor *kiln_floor(kiln_tensor *a);
KILN_API kiln_tensor *kiln_ceil(kiln_tensor *a);
KILN_API kiln_tensor *kiln_round(kiln_tensor *a); /* half to even */
KILN_API kiln_tensor *kiln_sign(kiln_tensor *a);
KILN_API kiln_tensor *kiln_logical_not(kiln_tensor *a);

/* elementwise binary: numpy broadcasting; promotion bool < u8 < i32 < i64 < (bf16 | f16)
   < f32 < f64, and bf16 with f16 gives f32 (PyTorch's).
   div is true division (integers give float32). */
KILN_API kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_sub(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_div(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_pow(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_maximum(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_minimum(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_eq(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_ne(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_lt(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_le(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_gt(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_ge(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_logical_and(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_logical_or(kiln_tensor *a, kiln_tensor *b);

/* tensor op host scalar.  The scalar is a runtime value, never part of a trace
   key, and does not widen a float tensor; with an integer or bool tensor a
   (double) scalar gives float32, as `int_tensor * 2.0` does in PyTorch. */
KILN_API kiln_tensor *kiln_add_scalar(kiln_tensor *a, double s);
KILN_API kiln_tensor *kiln_sub_scalar(kiln_tensor *a, double s);
KILN_API kiln_tensor *kiln_mul_scalar(kiln_tensor *a, double s);
KILN_API kiln_tensor *kiln_div_scalar(kiln_tensor *a, double s);
KILN_API kiln_tensor *kiln_pow_scalar(kiln_tensor *a, double s);

KILN_API kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_clamp(kiln_tensor *a, double lo, double hi);
KILN_API kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dt);

/* reductions: naxes == 0 means all axes; negative axes count from the end */
KILN_API kiln_tensor *kiln_sum(kiln_tensor *a, int naxes, const int *axes, bool keepdim);
KILN_API kiln_tensor *kiln_mean(kiln_tensor *a, int naxes, const int *axes, bool keepdim);
KILN_API kiln_tensor *kiln_max(kiln_tensor *a, int naxes, const int *axes, bool keepdim);
KILN_API kiln_tensor *kiln_min(kiln_tensor *a, int naxes, const int *axes, bool keepdim);
KILN_API kiln_tensor *kiln_prod(kiln_tensor *a, int naxes, const int *axes, bool keepdim);
KILN_API kiln_tensor *kiln_argmax(kiln_tensor *a, int axis, bool keepdim); /* i64 */
KILN_API kiln_tensor *kiln_argmin(kiln_tensor *a, int axis, bool keepdim); /* i64 */

/* linear algebra: numpy matmul semantics incl. batch broadcasting */
KILN_API kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b);

/* shape ops are views where possible (no copy) */
KILN_API kiln_tensor *kiln_reshape(kiln_tensor *a, int ndim, const int64_t *shape); /* one -1 ok */
KILN_API kiln_tensor *kiln_permute(kiln_tensor *a, const int *perm);
KILN_API kiln_tensor *kiln_transpose(kiln_tensor *a, int d0, int d1);
KILN_API kiln_tensor *kiln_expand(kiln_tensor *a, int ndim, const int64_t *shape);
KILN_API kiln_tensor *kiln_squeeze(kiln_tensor *a, int axis);
KILN_API kiln_tensor *kiln_unsqueeze(kiln_tensor *a, int axis);
KILN_API kiln_tensor *kiln_slice(kiln_tensor *a, int axis, int64_t start, int64_t stop,
                                 int64_t step);
KILN_API kiln_tensor *kiln_concat(int n, kiln_tensor *const *ts, int axis);
KILN_API kiln_tensor *kiln_stack(int n, kiln_tensor *const *ts, int axis);
KILN_API kiln_tensor *kiln_index_select(kiln_tensor *a, int axis,
                                        kiln_tensor *idx); /* idx i64 1-d */
KILN_API kiln_tensor *kiln_gather(kiln_tensor *a, int axis, kiln_tensor *idx);
/* out = a, with src[i...] added at out[..., idx[i...], ...] along axis (the adjoint of gather) */
KILN_API kiln_tensor *kiln_scatter_add(kiln_tensor *a, int axis, kiln_tensor *idx,
                                       kiln_tensor *src);

/* neural-network composites (built from primitives) */
KILN_API kiln_tensor *kiln_softmax(kiln_tensor *a, int axis);
KILN_API kiln_tensor *kiln_log_softmax(kiln_tensor *a, int axis);
KILN_API kiln_tensor *kiln_logsumexp(kiln_tensor *a, int axis, bool keepdim);
KILN_API kiln_tensor *kiln_layer_norm(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, double eps);
/* over the last axis; w and b may be NULL (no affine part) */
KILN_API kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *target_i64); /* mean */
KILN_API kiln_tensor *kiln_mse_loss(kiln_tensor *a, kiln_tensor *b);                    /* mean */

/* the upper (triu: j - i >= diagonal) or lower (tril: j - i <= diagonal)
   triangle of the last two dims, the rest 0; torch.triu / torch.tril.
   triu(ones, 1) as a bool mask is the causal one (attention written the
   long way with it runs as the causal op) */
KILN_API kiln_tensor *kiln_triu(kiln_tensor *a, int64_t diagonal);
KILN_API kiln_tensor *kiln_tril(kiln_tensor *a, int64_t diagonal);
/* bool tensors: NaN; +-Inf; neither (integers: false, false, true) */
KILN_API kiln_tensor *kiln_isnan(kiln_tensor *a);
KILN_API kiln_tensor *kiln_isinf(kiln_tensor *a);
KILN_API kiln_tensor *kiln_isfinite(kiln_tensor *a);

/* more creation */
KILN_API kiln_tensor *kiln_linspace(double start, double stop, int64_t n, kiln_dtype dt);
KILN_API kiln_tensor *kiln_eye(int64_t n, kiln_dtype dt);
KILN_API kiln_tensor *kiln_randint(int64_t low, int64_t high, kiln_dtype dt, int ndim,
                                   const int64_t *shape);
KILN_API kiln_tensor *kiln_randperm(int64_t n);   /* i64; a host shuffle on the Philox stream */
KILN_API kiln_tensor *kiln_clone(kiln_tensor *a); /* a materialized copy */

/* more reductions and scans */
KILN_API kiln_tensor *kiln_var(kiln_tensor *a, int naxes, const int *axes, int correction,
                               bool keepdim);
KILN_API kiln_tensor *kiln_std(kiln_tensor *a, int naxes, const int *axes, int correction,
                               bool keepdim);
KILN_API kiln_tensor *kiln_cumsum(kiln_tensor *a, int axis); /* integers and bool -> i64 */
/* stable; NaN counts as the largest value; values differentiable, indices i64 */
KILN_API kiln_tensor *kiln_sort(kiln_tensor *a, int axis, bool descending,
                                kiln_tensor **indices /* may be NULL */);
KILN_API kiln_tensor *kiln_topk(kiln_tensor *a, int64_t k, int axis, bool largest,
                                kiln_tensor **indices /* may be NULL */);

/* layers for real models (NCHW; differentiable).  conv2d: stride NULL = 1,
   padding NULL = 0, dilation NULL = 1; pooling: stride NULL = the kernel,
   padding NULL = 0 (at most half the kernel); avg_pool2d counts the padding */
KILN_API kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *w /* [Cout, Cin/groups, kh, kw] */,
                                  kiln_tensor *b /* NULL ok */, const int stride[2],
                                  const int padding[2], const int dilation[2], int groups);
/* softmax(q kᵀ scale + mask) v as one fused op, differentiable in q, k, v
   (and in a float mask).  q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv],
   their leading dims broadcast; mask NULL, bool (true: attend) or float
   (added to the scores), broadcastable to [..., Tq, Tk]; causal: query i
   attends keys j <= i (it combines with a mask); scale <= 0 means
   1/sqrt(d).  A query whose keys are all masked out gets 0. */
KILN_API kiln_tensor *kiln_scaled_dot_product_attention(kiln_tensor *q, kiln_tensor *k,
                                                        kiln_tensor *v, kiln_tensor *mask,
                                                        bool causal, double scale);
KILN_API kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const int kernel[2], const int stride[2],
                                      const int padding[2]);
KILN_API kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const int kernel[2], const int stride[2],
                                      const int padding[2]);
KILN_API kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *running_mean,
                                      kiln_tensor *running_var, kiln_tensor *w, kiln_tensor *b,
                                      bool training, double momentum, double eps);
/* over axis 1; in training the running stats are updated in place (stores) */
KILN_API kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training);
KILN_API kiln_tensor *kiln_embedding(kiln_tensor *weight,
                                     kiln_tensor *idx_i64); /* idx of any shape */
KILN_API kiln_tensor *kiln_one_hot(kiln_tensor *idx_i64, int64_t num_classes, kiln_dtype dt);
KILN_API kiln_tensor *kiln_nll_loss(kiln_tensor *log_probs, kiln_tensor *target_i64); /* mean */
KILN_API kiln_tensor *kiln_bce_with_logits(kiln_tensor *logits, kiln_tensor *target); /* mean */
/* losses require equal shapes (or the class-index form): no silent broadcast */

/* saving: the safetensors format (readable by PyTorch, numpy, JAX tools) */
KILN_API int kiln_save(const char *path, int n, const char *const *names, kiln_tensor *const *ts);
KILN_API int kiln_load(const char *path, int cap, char **names /* malloc'd, caller frees */,
                       kiln_tensor **ts);
/* returns the count (or a negative status); a malformed file is an error;
   cap 0 with names and ts NULL asks for the count alone; a path that is not
   a regular file (a FIFO, a directory) is an error at once.
   kiln_save is durable: it writes "<path>.tmp-<pid>-<n>" beside path, fsyncs
   it and renames it over path (then fsyncs the directory), so a crash leaves
   the old file or the new one, whole; a symlink at path is replaced by the
   file, not written through; the temp files killed saves leave are removed
   by the next save of that path. */

/* in-place (functionalized: the handle now names the new value; other handles
   and views taken before keep the old value) */
KILN_API int kiln_assign(kiln_tensor *dst, kiln_tensor *src); /* shapes must match */
KILN_API int kiln_sub_scaled_(kiln_tensor *dst, kiln_tensor *src,
                              double alpha); /* dst -= alpha*src */

/* autodiff (reverse mode on the recorded graph; gradients are ordinary
   pending ops, so they are fused and cached like the forward pass) */
KILN_API int kiln_set_requires_grad(kiln_tensor *t, bool on); /* leaves, float dtypes */
KILN_API bool kiln_requires_grad(const kiln_tensor *t);
KILN_API int kiln_backward(kiln_tensor *loss, kiln_tensor *grad /* NULL: ones, scalar loss */);
KILN_API kiln_tensor *kiln_grad(kiln_tensor *leaf); /* new reference; NULL, no error, if none */
KILN_API int kiln_zero_grad(kiln_tensor *leaf);
/* grad's values become leaf's gradient (what the next optimizer step
   reads); same dtype, device and shape; NULL drops it (kiln_zero_grad) */
KILN_API int kiln_set_grad(kiln_tensor *leaf, kiln_tensor *grad);
KILN_API int kiln_grad_of(int nout, kiln_tensor *const *outs, kiln_tensor *const *gouts, int nin,
                          kiln_tensor *const *ins, kiln_tensor **grads,
                          bool create_graph); /* functional; grads[i] new references */
KILN_API kiln_tensor *kiln_detach(kiln_tensor *t);
KILN_API void kiln_no_grad_push(void); /* nestable */
KILN_API void kiln_no_grad_pop(void);
/* torch.enable_grad: ops record for autodiff again inside no_grad scopes,
   until kiln_enable_grad_pop(what the push returned); nests with
   kiln_no_grad_push.  kiln_is_grad_enabled: whether ops on this thread
   record for autodiff now (torch.is_grad_enabled). */
KILN_API int kiln_enable_grad_push(void);
KILN_API void kiln_enable_grad_pop(int saved);
KILN_API bool kiln_is_grad_enabled(void);

/* mixed precision (docs/SEMANTICS.md "Half precision").  Autocast, per
   thread: KILN_BF16 or KILN_F16 makes matmuls, convolutions and attention
   take their float32 operands in that dtype (f32 accumulation, the result
   in the half dtype), as PyTorch's autocast does; KILN_F32 turns it off.
   Parameters stay float32 and get float32 gradients. */
KILN_API int kiln_set_autocast(kiln_dtype dt);
KILN_API kiln_dtype kiln_autocast_dtype(void); /* KILN_F32 when off */
/* float32 matmuls on CUDA: "highest" (the default: no TF32) or "tf32" (also
   "high", PyTorch's name: TF32 tensor cores, a 10-bit significand in the
   products); KILN_TF32=1 starts at "tf32".  Process-wide; the CPU's GEMMs
   are always full f32.  kiln_matmul_precision() says which is set. */
KILN_API int kiln_set_matmul_precision(const char *mode);
KILN_API const char *kiln_matmul_precision(void);
/* A dynamic loss scaler's step (f16 training): every parameter's gradient
   times inv_scale, in place, and *found_inf = whether any gradient holds
   an Inf or a NaN (then the caller skips the step and lowers the scale).
   Parameters without a gradient are skipped. */
KILN_API int kiln_unscale_grads(int n, kiln_tensor *const *params, double inv_scale,
                                bool *found_inf);

/* devices: explicit transfers; an op over tensors on two devices is a
   KILN_ERR_DEVICE naming both.  kiln_device_available(KILN_CUDA) tells
   whether a CUDA driver and device are present; KILN_DEVICE=cuda makes new
   tensors there; asking for a device that is not there is KILN_ERR_DEVICE
   with the reason */
KILN_API bool kiln_device_available(kiln_device d);
/* "NVIDIA H100 80GB HBM3, sm_90, ..." / "CPU, x86-64-v3, 2 threads", or
   why the device is not available */
KILN_API const char *kiln_device_info(kiln_device d);
KILN_API kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device d); /* a copy, or t's value */

/* data-parallel training (DESIGN §10).  Start the program with mpirun
   (`mpirun -np 4 ./train`); Open MPI's libmpi.so.40 is loaded at run time
   (KILN_MPI_LIB overrides the path), so a Kiln built without MPI has these
   calls too: without mpirun or libmpi they return KILN_ERR_STATE saying how
   to enable them.  kiln_all_reduce is a recorded op (the reduction over the
   ranks, each rank getting the result): it sits in traces and their keys
   like any other, and runs in the next evaluation of the thread that
   recorded it, whatever that evaluation's targets — collectives must run
   once each, in the same order on every rank, so record them on one thread
   per process.  Ranks that disagree on a collective's shape, dtype or op get
   a KILN_ERR_SHAPE naming both; a collective with no answer within
   KILN_DIST_TIMEOUT seconds (300) aborts the whole job with a message
   instead of hanging.  sum and mean are differentiable (the gradient is
   reduced the same way); mean needs a float dtype; bool sums saturate.
   kiln_dist_average_grads replaces every param's gradient (after
   kiln_backward) by its mean over the ranks, in buckets (at most
   KILN_DIST_BUCKET_MB MiB, 25) whose reductions start as soon as backward
   has produced them, overlapping the rest of backward; a param without a
   gradient contributes zeros.  An evaluation interrupted or failing after
   a collective ran cannot be replayed (its rerun is KILN_ERR_STATE): end
   the job.  kiln_dist_finalize evaluates what is pending, then leaves the
   job; call it before exit on every rank. */
typedef enum { KILN_REDUCE_SUM, KILN_REDUCE_MEAN, KILN_REDUCE_MAX } kiln_reduce_op;
KILN_API int kiln_dist_init(void); /* joins the job started by mpirun; KILN_ERR_STATE if none */
KILN_API int kiln_dist_rank(void); /* KILN_ERR_STATE (negative) before kiln_dist_init */
KILN_API int kiln_dist_size(void);
KILN_API kiln_tensor *kiln_all_reduce(kiln_tensor *t, kiln_reduce_op op); /* a recorded op */
KILN_API int kiln_dist_average_grads(int n, kiln_tensor *const *params);  /* after backward */
KILN_API int kiln_dist_finalize(void);

/* runtime */
KILN_API int kiln_sync(void); /* evaluate everything pending on this thread */
/* evaluate these and keep their values (the explicit "compute and keep";
   the automatic rules of README "How it runs" make it rarely needed) */
KILN_API int kiln_eval(int n, kiln_tensor *const *ts);
/* wait until the background compiler has finished every compile queued so
   far (hot traces then run compiled); benchmarks call it after warm-up */
KILN_API void kiln_jit_wait(void);
/* Interrupts: while *flag is nonzero, evaluations on the calling thread stop
   at the next kernel boundary with KILN_ERR_STATE ("interrupted"); nothing
   is lost (pending values and in-place updates stay pending).  Another
   thread or a signal handler may set *flag; NULL clears it.  Bindings use it
   for Ctrl-C (Ruby's unblocking function). */
KILN_API void kiln_set_cancel_flag(volatile int *flag);
typedef struct {
  uint64_t ops_recorded, flushes, traces_seen, cache_hits, cache_misses, compiles, compile_failures,
      disk_hits, eager_ops, kernels_launched;
  double compile_ms, flush_ms;
} kiln_stats;
/* process-wide; ops_recorded counts another thread's ops from its next
   flush, stats read or exit on (at most 255 of them wait) */
KILN_API void kiln_get_stats(kiln_stats *out);
KILN_API void kiln_reset_stats(void);
/* one counter by name: any field of kiln_stats, or "kernels_compiled"
   (kernels compiled, not loaded from disk; a kernel is compiled once per
   process, whichever traces share it), "kernel_cache_hits" (kernels of
   newly compiled plans that were already compiled), "code_objects" (compiled
   code objects loaded now, CPU code and CUDA modules alike; unloaded once
   no cached kernel is in them),
   "code_unloads", "plans_built" or
   "blas_calls" (gemm calls into BLAS: one per matmul, or per batch),
   "recomputed" (values a flush evaluated although an earlier flush had
   computed them: the execution model keeps that to once per value) or
   "all_reduces", "all_reduce_bytes", "all_reduce_ms" (payloads reduced
   over the ranks, their bytes, the time from issuing each to its end) or
   "all_reduce_wait_ms" (the time evaluations waited for them: what
   overlap did not hide), or
   "nvrtc_ms" and "gpu_disk_loads" (GPU kernels: NVRTC's time compiling
   them, and how many were loaded from the disk cache instead), or
   "device_waits" (times the host waited for a device stream: reads of
   values and full staging buffers; evaluating a cached plan waits 0 times), or
   "kernel_threads_max" (the most threads, user threads and workers together,
   seen running Kiln's kernels at once: at most kiln_num_threads()), or
   "view_ops" (views made: reshape, permute, expand, slice.  They move no
   data, so eager_ops, the ops the interpreter computed, leaves them out), or
   "loops_found" (new traces in which a body recorded once per step of a
   loop was found, KILN_LOG=info says where), or
   "loops_rolled" (evaluations that ran such a loop rolled: the steps one
   trace, keyed, planned and compiled once for every trip count), or
   "loop_steps" (the steps those evaluations ran), or
   "trace_cache_entries" and "trace_cache_bytes" (the keys the trace cache
   holds now and their bytes, at most KILN_TRACE_CACHE_MAX keys and
   KILN_TRACE_CACHE_MB MiB);
   NAN and an error for an unknown name.  New counters appear here without
   changing kiln_stats. */
KILN_API double kiln_stat(const char *name);
/* bytes held by live tensor storages, process-wide (freed-block caches not
   included): what a garbage-collected host reports to its collector */
KILN_API size_t kiln_memory_in_use(void);
/* bytes of results that reading t would compute now (t NULL: what kiln_sync
   would): 0 when t's value is at hand, SIZE_MAX when it is not known.  How
   long a read will take, cheaply: bindings run small evaluations without
   giving up their interpreter's lock, which costs more than they do */
KILN_API size_t kiln_pending_bytes(const kiln_tensor *t);
KILN_API const char *kiln_version(void);

/* machine: what this process runs with */
KILN_API int kiln_num_threads(void);       /* kernel worker threads (KILN_THREADS) */
KILN_API const char *kiln_blas_core(void); /* OpenBLAS kernel in use, "" if none */
KILN_API const char *kiln_cpu_isa(void);   /* "x86-64-v4", "x86-64-v3", ... */

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
