// emu_rt.cpp — launches a generated kernel on the CPU: each block's threads
// run as coroutines (ucontext), released together at __syncthreads and at
// each warp shuffle; a block whose threads can never meet is reported.
#include "emu.hpp"
emu_thread *emu_cur;
ucontext_t emu_sched;
emu_dim3 blockIdx, blockDim, gridDim;
unsigned char emu_slot[32][32][8];
// The kernels' by-value argument type and files: the op kernels' unless a
// wrapper (fused_rt.cpp) names others.
#ifndef EMU_ARGS
#define EMU_ARGS gpu_args
#define EMU_KERNELS "kernels.inc"
#define EMU_REGISTRY "registry.inc"
#endif
#include EMU_KERNELS
typedef void (*kfn)(const EMU_ARGS);
struct reg { const char *name; kfn fn; };
static const reg registry[] = {
#include EMU_REGISTRY
};
static kfn cur_fn; static const EMU_ARGS *cur_args;
static void trampoline() { cur_fn(*cur_args); emu_cur->state = DONE; swapcontext(&emu_cur->ctx, &emu_sched); }
extern "C" int emu_launch(const char *name, const void *args, unsigned grid, unsigned block) {
  kfn fn = nullptr;
  for (auto &r : registry) if (!strcmp(r.name, name)) fn = r.fn;
  if (!fn) { fprintf(stderr, "emu: no kernel %s\n", name); return 0; }
  cur_fn = fn; cur_args = (const EMU_ARGS *)args;
  std::vector<emu_thread> th(block);
  const size_t SS = 1 << 16;
  for (auto &t : th) t.stack = (char *)malloc(SS);
  gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    blockIdx = {b, 0, 0};
    for (unsigned i = 0; i < block; i++) {
      emu_thread &t = th[i]; t.tid = i; t.state = RUN;
      getcontext(&t.ctx); t.ctx.uc_stack.ss_sp = t.stack; t.ctx.uc_stack.ss_size = SS; t.ctx.uc_link = nullptr;
      makecontext(&t.ctx, trampoline, 0);
    }
    for (;;) {
      for (auto &t : th) if (t.state == RUN) { emu_cur = &t; swapcontext(&emu_sched, &t.ctx); }
      bool all_done = true, released = false;
      for (auto &t : th) all_done = all_done && t.state == DONE;
      if (all_done) break;
      for (unsigned w = 0; w < block / 32; w++) {
        bool ok = false, all = true;
        for (unsigned l = 0; l < 32; l++) { int s = th[w * 32 + l].state; if (s == AT_WARP) ok = true; else if (s != DONE) all = false; }
        bool anydone = false; for (unsigned l = 0; l < 32; l++) anydone |= th[w*32+l].state == DONE;
        if (ok && all) { if (anydone) { fprintf(stderr, "emu %s: shfl with exited lanes\n", name); return 0; }
          for (unsigned l = 0; l < 32; l++) th[w * 32 + l].state = RUN; released = true; }
      }
      if (!released) {
        bool all = true, any = false;
        for (auto &t : th) { if (t.state == AT_BLOCK) any = true; else if (t.state != DONE) all = false; }
        if (any && all) { for (auto &t : th) if (t.state == AT_BLOCK) t.state = RUN; released = true; }
      }
      if (!released) { fprintf(stderr, "emu %s: deadlock in block %u\n", name, b); return 0; }
    }
  }
  for (auto &t : th) free(t.stack);
  return 1;
}
