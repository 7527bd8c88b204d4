/* gpu_bench.h — what the G programs (the GPU workloads of BENCHMARKS.md)
 * share: the device they run on, a timing loop that waits for the device,
 * and the limit of the memory-bound ones, the device-to-device copy
 * bandwidth measured in the same run.
 *
 * Kiln has no public CUDA event, so a repetition is timed on the host
 * clock: `inner` evaluations launched back to back (each forced with
 * kiln_sync, which launches without waiting), then one read of one element,
 * which waits for the device's stream.  Seconds / inner is the time per
 * evaluation; the one wait costs a few µs spread over `inner`.  The peers
 * (perf/peers/gpu_peers.py) time the same back-to-back batches with CUDA
 * events. */
#ifndef KILN_PERF_GPU_BENCH_H
#define KILN_PERF_GPU_BENCH_H

#include "bench.h"

/* true when o->device can run: CUDA unless --device cpu.  Without CUDA it
   prints the @na line of `workload` (kiln_device_info says why) and
   returns false; the program then exits 0.  Also sets KILN_PAYOFF=0 unless
   it is set: a benchmark times the compiled code, which the payoff rule
   would only build after tens of runs (scripts/bench sets it too). */
bool gb_device_ready(const bench_opts *o, const char *workload);

/* a copy of host on o->device; host is released; dies on error */
kiln_tensor *gb_on_device(const bench_opts *o, kiln_tensor *host, const char *what);

/* evaluates t (kiln_sync: the pending work as one trace, as the timed loop
   flushes it) and waits for the device: a read of its last element */
void gb_wait(kiln_tensor *t);

/* one evaluation of a workload: a new tensor, which the caller releases */
typedef kiln_tensor *(*gb_eval)(void *ctx);

/* o->warmup untimed evaluations, kiln_jit_wait(), then o->reps
   repetitions of `inner` evaluations back to back and one wait:
   times[r] = seconds of repetition r / inner.  Returns the median;
   *last (if not NULL) gets the final output, else it is released. */
double gb_time(gb_eval f, void *ctx, const bench_opts *o, int inner, double *times,
               kiln_tensor **last);

/* kernels launched by one more evaluation of f (the steady state, after
   gb_time), counted by kiln_stat("kernels_launched") */
double gb_launches(gb_eval f, void *ctx);
/* times the host waited for the device while one evaluation of f was
   recorded and launched (kiln_sync), before anything was read: 0 when
   the work never stops the host (DESIGN §6) */
double gb_waits(gb_eval f, void *ctx);

/* the device's copy bandwidth in GB/s (bytes read + written): the median
   of o->reps timings of `inner` device-to-device copies of x's size, made
   with the CUDA driver itself (cuMemcpyDtoDAsync between two buffers of its
   own), so the limit is the device's and not Kiln's.  (kiln_clone is no
   measure: values are immutable, so a clone of a leaf moves no bytes.)  On
   the CPU (--smoke-on-cpu) the same timing of kiln_neg(x). */
double gb_copy_gbs(kiln_tensor *x, const bench_opts *o, int inner);

/* the fields of a memory-bound result: bytes that must move, elements,
   GB/s, the copy bandwidth and the share of it reached (of_copy) */
void gb_bandwidth_fields(char *out, size_t cap, double bytes, int64_t elems, double median_s,
                         double copy_gbs);

/* the device's description for the result line: kiln_device_info, or
   "cpu <isa>" with --device cpu */
const char *gb_device_name(const bench_opts *o);

/* prints the @result line: bench_result's fields, `extra`, traces_timed
   (new trace keys during the last gb_time's timed repetitions, -1 if none
   ran: 0 says they replayed cached traces only) and device= */
void gb_result(const char *workload, const bench_opts *o, const double *times, int n,
               const char *extra, const char *check);

#endif
