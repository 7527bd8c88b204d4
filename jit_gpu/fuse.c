/* fuse.c — a plan's elementwise groups as fused CUDA kernels (fuse.h):
 * which nodes a group's kernel computes, what it reads and writes, its
 * CUDA C, and its arguments for one run. */
#include "fuse.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../vm/dtype.h"
#include "../vm/state.h"
#include "src.h"

/* --- planning ---------------------------------------------------------------------- */

static const vm_meta *ref_meta(const tr_plan *plan, const tr_trace *t, int r) {
  return r >= 0 ? &plan->nodes[r].meta : &t->leaves[-1 - r]->meta;
}

static kiln_dtype ref_dtype(const tr_plan *plan, const tr_trace *t, int r) {
  return ref_meta(plan, t, r)->dtype;
}

static bool computed(const tr_plan *plan, const gpu_fused *k, int r) {
  return r >= k->first && r <= k->last && vm_op_table[plan->nodes[r].op].kind != VM_KIND_VIEW;
}

/* a value the kernel may index by the flat position: a fresh value (not
   a view, nor a uniform one: fills and folded nodes are broadcast views of
   one element) or a contiguous leaf, of the iteration's full shape */
static bool dense_full(const tr_plan *plan, const tr_trace *t, int r, const vm_meta *it) {
  const vm_meta *m = ref_meta(plan, t, r);
  if (m->ndim != it->ndim || memcmp(m->shape, it->shape, (size_t)m->ndim * sizeof(int64_t))) return false;
  if (r >= 0) {
    const tr_pnode *p = &plan->nodes[r];
    return vm_op_table[p->op].kind != VM_KIND_VIEW && p->op != VM_OP_full && !p->fold;
  }
  const vm_tensor *v = t->leaves[-1 - r]->value;
  return v && vm_is_contiguous(v);
}

static bool add_input(gpu_fused *k, int r) {
  for (int q = 0; q < k->nin; q++)
    if (k->ins[q] == r) return true;
  if (k->nin + k->nout >= GPU_FUSE_MAX_IO) return false;
  k->ins[k->nin++] = r;
  return true;
}

static bool plan_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused *k) {
  const tr_group *grp = &plan->groups[g];
  if (grp->kind != TR_GROUP_ELEMENTWISE) return false;
  memset(k, 0, sizeof *k);
  k->group = g;
  k->first = grp->first;
  k->last = grp->last;
  for (int i = grp->first; i <= grp->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) {
      /* views run on the interpreter before the kernel: only of values
         from outside the group */
      if (p->nin > 0 && p->in[0] >= grp->first && p->in[0] < i) return false;
      continue;
    }
    if (p->op == VM_OP_full) {
      if (k->nparams == GPU_FUSE_MAX_PARAMS) return false;
      k->params[k->nparams++] = i;
    } else {
      if (p->nin > 3) return false;
      kiln_dtype in[3];
      for (int j = 0; j < p->nin; j++) {
        int r = p->in[j];
        in[j] = ref_dtype(plan, t, r);
        if (!computed(plan, k, r) && !add_input(k, r)) return false;
      }
      if (!gpu_src_node_supported(p->op, p->meta.dtype, p->nin, in)) return false;
    }
    if (plan->escapes[i] || p->last_use > grp->last) {
      if (k->nin + k->nout >= GPU_FUSE_MAX_IO) return false;
      k->outs[k->nout++] = i;
    }
  }
  if (k->nout == 0) return false;
  const vm_meta *it = &plan->nodes[k->outs[0]].meta;
  for (int q = 0; q < k->nin; q++) k->contig[q] = dense_full(plan, t, k->ins[q], it);
  return true;
}

/* --- source ------------------------------------------------------------------------ */

static void emit_fargs(gpu_src *b) {
  gpu_src_printf(b,
                 "#ifndef KILN_GPU_FARGS\n"
                 "#define KILN_GPU_FARGS\n"
                 "struct gpu_fargs {\n"
                 "  void *ptr[%d];\n"
                 "  i64 stride[%d][K_MAX_DIMS];\n"
                 "  i64 shape[K_MAX_DIMS];\n"
                 "  u64 param[%d];\n"
                 "  i64 n;\n"
                 "  i32 ndim;\n"
                 "  i32 pad;\n"
                 "};\n",
                 GPU_FUSE_MAX_IO, GPU_FUSE_MAX_IO, GPU_FUSE_MAX_PARAMS);
  gpu_src_printf(b, "static_assert(sizeof(gpu_fargs) == %zu, \"gpu_fargs: host and device layouts differ\");\n",
                 sizeof(gpu_fargs));
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, ptr);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, stride);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, shape);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, param);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, n);
  GPU_SRC_ASSERT_FIELD(b, gpu_fargs, ndim);
  gpu_src_printf(b, "#endif /* KILN_GPU_FARGS */\n");
}

/* a full node's value from its 8-byte slot (vm_store_f64 wrote it in its
   dtype at the slot's start; the host is little-endian, as is the GPU) */
static void param_expr(gpu_src *b, kiln_dtype dt, int s) {
  switch (dt) {
    case KILN_F32: gpu_src_printf(b, "__int_as_float((i32)(u32)a.param[%d])", s); break;
    case KILN_F64: gpu_src_printf(b, "__longlong_as_double((i64)a.param[%d])", s); break;
    case KILN_I32: gpu_src_printf(b, "(i32)(u32)a.param[%d]", s); break;
    case KILN_I64: gpu_src_printf(b, "(i64)a.param[%d]", s); break;
    default: gpu_src_printf(b, "(u8)(a.param[%d] & 0xff)", s); break;
  }
}

/* the kernel's body after its signature */
static void emit_body(gpu_src *b, const tr_plan *plan, const tr_trace *t, const gpu_fused *k) {
  for (int q = 0; q < k->nout; q++) {
    const char *ct = gpu_src_ctype(plan->nodes[k->outs[q]].meta.dtype);
    gpu_src_printf(b, "  %s *o%d = (%s *)a.ptr[%d];\n", ct, q, ct, q);
  }
  for (int q = 0; q < k->nin; q++) {
    const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
    gpu_src_printf(b, "  const %s *in%d = (const %s *)a.ptr[%d];\n", ct, q, ct, k->nout + q);
  }
  gpu_src_printf(b, "  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; "
                    "i += (i64)gridDim.x * blockDim.x) {\n");
  bool strided = false;
  for (int q = 0; q < k->nin; q++)
    if (!k->contig[q]) {
      gpu_src_printf(b, "%s f%d = 0", strided ? "," : "    i64", q);
      strided = true;
    }
  if (strided) {
    gpu_src_printf(b, ";\n    {\n      i64 r = i;\n      for (int d = a.ndim - 1; d >= 0; d--) {\n"
                      "        const i64 s = a.shape[d], qd = r / s, c = r - qd * s;\n        r = qd;\n");
    for (int q = 0; q < k->nin; q++)
      if (!k->contig[q]) gpu_src_printf(b, "        f%d += c * a.stride[%d][d];\n", q, k->nout + q);
    gpu_src_printf(b, "      }\n    }\n");
  }
  for (int q = 0; q < k->nin; q++) {
    const char *ct = gpu_src_ctype(ref_dtype(plan, t, k->ins[q]));
    if (k->contig[q]) gpu_src_printf(b, "    const %s x%d = in%d[i];\n", ct, q, q);
    else gpu_src_printf(b, "    const %s x%d = in%d[f%d];\n", ct, q, q, q);
  }
  int s = 0;
  for (int i = k->first; i <= k->last; i++) {
    const tr_pnode *p = &plan->nodes[i];
    if (vm_op_table[p->op].kind == VM_KIND_VIEW) continue;
    gpu_src_printf(b, "    %s v%d;\n    ", gpu_src_ctype(p->meta.dtype), i - k->first);
    if (p->op == VM_OP_full) {
      gpu_src_printf(b, "v%d = ", i - k->first);
      param_expr(b, p->meta.dtype, s++);
      gpu_src_printf(b, ";\n");
      continue;
    }
    char names[3][16];
    const char *args[3];
    kiln_dtype in[3];
    for (int j = 0; j < p->nin; j++) {
      int r = p->in[j];
      in[j] = ref_dtype(plan, t, r);
      if (computed(plan, k, r)) {
        snprintf(names[j], sizeof names[j], "v%d", r - k->first);
      } else {
        int q = 0;
        while (k->ins[q] != r) q++;
        snprintf(names[j], sizeof names[j], "x%d", q);
      }
      args[j] = names[j];
    }
    char dst[16];
    snprintf(dst, sizeof dst, "v%d", i - k->first);
    gpu_src_node(b, p->op, p->meta.dtype, p->nin, in, args, dst);
  }
  for (int q = 0; q < k->nout; q++) gpu_src_printf(b, "    o%d[i] = v%d;\n", q, k->outs[q] - k->first);
  gpu_src_printf(b, "  }\n}\n");
}

bool gpu_fuse_group(const tr_plan *plan, int g, const tr_trace *t, gpu_fused *k) {
  if (!plan_group(plan, g, t, k)) return false;
  gpu_src body = {0};
  emit_body(&body, plan, t, k);
  if (body.oom) {
    free(body.s);
    return false;
  }
  /* the name is the body's hash: equal groups share one kernel */
  snprintf(k->name, sizeof k->name, "kf_%016llx", (unsigned long long)XXH3_64bits(body.s, body.len));
  gpu_src src = {0};
  gpu_src_prelude(&src);
  emit_fargs(&src);
  gpu_src_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(const __grid_constant__ gpu_fargs a) {\n",
                 GPU_FUSE_BLOCK, k->name);
  gpu_src_put(&src, body.s);
  free(body.s);
  if (src.oom) {
    free(src.s);
    return false;
  }
  k->src = src.s;
  return true;
}

/* --- running ----------------------------------------------------------------------- */

bool gpu_fused_run(const gpu_fused *k, const gpu_fuse_target *dev, const tr_plan *plan,
                   const tr_trace *t, vm_tensor **vals, int *rc) {
  const vm_meta *om = &plan->nodes[k->outs[0]].meta;
  int nd = om->ndim;
  gpu_fargs a;
  memset(&a, 0, sizeof a);
  int64_t strides[GPU_FUSE_MAX_IO][KILN_MAX_DIMS];
  for (int q = 0; q < k->nin; q++) {
    int r = k->ins[q];
    vm_tensor *v = r >= 0 ? vals[r] : t->leaves[-1 - r]->value;
    if (!v || v->ndim > nd || !v->storage || v->storage->device != dev->device) return false;
    if (k->contig[q] && (v->ndim != nd || !vm_is_contiguous(v) ||
                         memcmp(v->shape, om->shape, (size_t)nd * sizeof(int64_t))))
      return false; /* compiled to index it by the flat position */
    int lead = nd - v->ndim;
    for (int d = 0; d < nd; d++) {
      int src = d - lead;
      strides[q][d] = (src < 0 || v->shape[src] == 1) ? 0 : v->strides[src];
    }
    a.ptr[k->nout + q] = vm_data(v);
  }
  a.ndim = vm_coalesce(nd, om->shape, k->nin, (const int64_t(*)[KILN_MAX_DIMS])strides, a.shape,
                       a.stride + k->nout);
  a.n = 1;
  for (int d = 0; d < a.ndim; d++) a.n *= a.shape[d];
  vm_tensor *outs[GPU_FUSE_MAX_IO] = {0};
  for (int q = 0; q < k->nout; q++) {
    const vm_meta *m = &plan->nodes[k->outs[q]].meta;
    int64_t numel = 1;
    for (int d = 0; d < m->ndim; d++) numel *= m->shape[d];
    if (numel != a.n) { /* every output spans the iteration */
      for (int u = 0; u < q; u++) vm_release(outs[u]);
      return false;
    }
    if (!(outs[q] = dev->alloc(m->dtype, m->ndim, m->shape))) {
      for (int u = 0; u < q; u++) vm_release(outs[u]);
      *rc = vm_thread()->status ? vm_thread()->status : vm_error(KILN_ERR_OOM, "out of memory");
      return true;
    }
    a.ptr[q] = vm_data(outs[q]);
  }
  for (int s = 0; s < k->nparams; s++) {
    const tr_pnode *p = &plan->nodes[k->params[s]];
    vm_store_f64(&a.param[s], p->meta.dtype, 0, t->nodes[p->src]->attr.scalar[0]);
  }
  if (a.n > 0) {
    int64_t blocks = (a.n + GPU_FUSE_BLOCK - 1) / GPU_FUSE_BLOCK;
    unsigned grid = blocks > 65536 ? 65536u : (unsigned)blocks; /* a grid-stride loop covers the rest */
    if (!dev->launch(k, &a, grid, GPU_FUSE_BLOCK)) {
      for (int q = 0; q < k->nout; q++) vm_release(outs[q]);
      *rc = vm_thread()->status ? vm_thread()->status : vm_error(KILN_ERR_DEVICE, "launching %s failed", k->name);
      return true;
    }
  }
  for (int q = 0; q < k->nout; q++) vals[k->outs[q]] = outs[q];
  return true;
}
