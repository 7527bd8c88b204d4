/* workloads.h — the Kiln side of the workloads that more than one program
 * runs (W1's expression and W7's training step are also what W8 compiles).
 * perf/peers.py builds the same inputs with the same formulas. */
#ifndef KILN_PERF_WORKLOADS_H
#define KILN_PERF_WORKLOADS_H

#include <kiln.h>
#include <stdbool.h>

/* W1: tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25.  Inputs:
   x[i] = sin(0.001 i), y[i] = 1.5 sin(0.0007 i + 0.5) (bench_fill_sin) */
#define W1_X_FREQ 0.001
#define W1_Y_FREQ 0.0007
#define W1_Y_PHASE 0.5
#define W1_Y_AMP 1.5
kiln_tensor *wl_w1(kiln_tensor *x, kiln_tensor *y);

/* W7: an MLP B x D -> H1 -> H2 -> C, relu, mean cross-entropy, plain SGD.
   (The hand-written backward pass was written when Kiln had no autodiff; it
   stays as the W7 kiln rows the issue asked for, next to kiln-autodiff.)
   Weights are stored [in, out] so the forward pass is x @ W + b. */
typedef struct {
  int64_t batch, d_in, h1, h2, classes;
  double lr;
  kiln_tensor *x, *target, *onehot, *zero;
  kiln_tensor *w1, *b1, *w2, *b2, *w3, *b3;
} wl_mlp;

void wl_mlp_init(wl_mlp *m, bool smoke);
/* the same inputs' formulas at other sizes (perf_threads_two_models) */
void wl_mlp_init_dims(wl_mlp *m, int64_t batch, int64_t d_in, int64_t h1, int64_t h2);
/* one training step: forward, a hand-written backward pass from Kiln ops
   (Kiln has no autodiff yet), SGD update of the six parameters in place
   (kiln_sub_scaled_).  Returns the loss of the forward pass (caller releases). */
kiln_tensor *wl_mlp_step(wl_mlp *m);
/* the same step with the gradients from Kiln's autodiff (kiln_backward);
   call wl_mlp_track() once first to mark the parameters as requiring grad */
void wl_mlp_track(wl_mlp *m);
kiln_tensor *wl_mlp_step_autodiff(wl_mlp *m);
/* moves the inputs and parameters to device d (the G7 benchmark); call
   before wl_mlp_track */
void wl_mlp_to_device(wl_mlp *m, kiln_device d);
/* runs two steps and writes W7's check (the peers print the same): the
   loss of steps 1 and 2 and, per parameter, sum((after - before)^2) of
   step 1's update, from float32 values summed in double */
void wl_mlp_check(wl_mlp *m, kiln_tensor *(*step)(wl_mlp *), char *out, size_t cap);
void wl_mlp_free(wl_mlp *m);

#endif
