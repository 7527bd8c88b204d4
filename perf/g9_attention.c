/* g9_attention.c — G9: scaled dot-product attention, forward and backward,
 * on the GPU at T = 1024 and T = 4096, head size 64 (BENCHMARKS.md), 16
 * heads, batch 16 and 4 (16384 tokens either way).  One evaluation is
 * kiln_scaled_dot_product_attention (the attention primitive: opgen_src.c's
 * kernels, never the T x T scores) and the gradients of sum(out * g) for
 * q, k and v (one attention_grad: ROWS, DQ and DKDV).  Reported as TFLOP/s
 * by FlashAttention's count (forward 4 B H T^2 d, backward 2.5 times
 * that) beside PyTorch's F.scaled_dot_product_attention with autograd
 * (perf/peers/gpu_peers.py: its flash kernel in bf16, G9h; its
 * memory-efficient one in f32).  Inputs: sin fills.  Rows G9:1024 and
 * G9:4096 (G9h:... with --bf16: the inputs and gradient rounded to bf16;
 * Kiln computes attention in f32, DESIGN §13). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_bench.h"

typedef struct {
  kiln_tensor *q, *k, *v, *g;
} g9_in;

/* out = attention(q, k, v); dq (a slice of the one packed gradient, so
   evaluating it evaluates dk and dv too) */
static kiln_tensor *g9_eval(void *p) {
  const g9_in *in = p;
  kiln_tensor *out = kiln_scaled_dot_product_attention(in->q, in->k, in->v, NULL, false, 0);
  kiln_tensor *ins[3] = {in->q, in->k, in->v}, *grads[3] = {NULL, NULL, NULL};
  bench_ok_status(kiln_grad_of(1, &out, &in->g, 3, ins, grads, false), "kiln_grad_of");
  kiln_release(out);
  kiln_release(grads[1]);
  kiln_release(grads[2]);
  return grads[0];
}

static void g9_run(const bench_opts *o, const char *name, int64_t t) {
  int64_t b = o->smoke ? 1 : 16384 / t, h = o->smoke ? 2 : 16, d = 64;
  if (o->smoke) t = 128;
  int64_t shape[4] = {b, h, t, d}, n = b * h * t * d;
  float *buf = bench_alloc_f32(n);
  g9_in in;
  kiln_tensor **slot[4] = {&in.q, &in.k, &in.v, &in.g};
  const char *what[4] = {"q", "k", "v", "g"};
  for (int i = 0; i < 4; i++) {
    bench_fill_sin(buf, n, 0.0013 * (i + 1), 0.3 * i, 1.0);
    *slot[i] = gb_on_device(o, bench_input(buf, 4, shape, o), what[i]);
    if (i < 3) bench_ok_status(kiln_set_requires_grad(*slot[i], true), "requires_grad");
  }
  free(buf);
  double *times = calloc((size_t)o->reps, sizeof *times);
  kiln_tensor *out = NULL;
  double med = gb_time(g9_eval, &in, o, 1, times, &out);
  double flops = 3.5 * 4.0 * (double)(b * h) * (double)t * (double)t * (double)d;
  char extra[256], check[512];
  snprintf(extra, sizeof extra, "flops=%.0f\ttflops=%.2f\tbatch=%lld\theads=%lld\tT=%lld\td=%lld",
           flops, flops / med / 1e12, (long long)b, (long long)h, (long long)t, (long long)d);
  bench_summary_tensor(check, sizeof check, out);
  gb_result(name, o, times, o->reps, extra, check);
  kiln_release(out);
  for (int i = 0; i < 4; i++) kiln_release(*slot[i]);
  free(times);
}

int main(int argc, char **argv) {
  bench_opts o;
  bench_parse(argc, argv, &o, 10, 2);
  const char *base = bench_name("G9", &o); /* G9 or G9h */
  char n1[16], n4[16];
  snprintf(n1, sizeof n1, "%s:1024", base);
  snprintf(n4, sizeof n4, "%s:4096", base);
  if (!gb_device_ready(&o, n1) || !gb_device_ready(&o, n4)) return 0;
  g9_run(&o, n1, 1024);
  g9_run(&o, n4, 4096);
  return 0;
}
