// emu_grid.hpp — runs one launch of an emulated kernel (emu.hpp) on the
// CPU: each block's threads run as coroutines (ucontext), released together
// at __syncthreads and at each warp shuffle; a block whose threads can never
// meet is reported.  Included once per program or module, after the
// kernels: it defines the emulation's globals.
#include "emu.hpp"
emu_thread *emu_cur;
ucontext_t emu_sched;
emu_dim3 blockIdx, blockDim, gridDim;
unsigned char emu_slot[32][32][8];

typedef void (*emu_body)(const void *args);
static emu_body emu_cur_body;
static const void *emu_cur_args;
static void emu_trampoline() {
  emu_cur_body(emu_cur_args);
  emu_cur->state = DONE;
  swapcontext(&emu_cur->ctx, &emu_sched);
}

// runs body(args) as a grid x block launch; 0 (with a message on stderr)
// if a block cannot finish
static int emu_run_grid(const char *name, emu_body body, const void *args, unsigned grid, unsigned block) {
  if (block == 0 || block > 1024 || block % 32) {
    fprintf(stderr, "emu %s: block of %u threads (a multiple of 32 up to 1024 is emulated)\n", name, block);
    return 0;
  }
  emu_cur_body = body;
  emu_cur_args = args;
  std::vector<emu_thread> th(block);
  const size_t SS = 1 << 16;
  for (auto &t : th) t.stack = (char *)malloc(SS);
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  int ok = 1;
  for (unsigned b = 0; ok && b < grid; b++) {
    blockIdx = {b, 0, 0};
    for (unsigned i = 0; i < block; i++) {
      emu_thread &t = th[i];
      t.tid = i;
      t.state = RUN;
      getcontext(&t.ctx);
      t.ctx.uc_stack.ss_sp = t.stack;
      t.ctx.uc_stack.ss_size = SS;
      t.ctx.uc_link = nullptr;
      makecontext(&t.ctx, emu_trampoline, 0);
    }
    for (;;) {
      for (auto &t : th)
        if (t.state == RUN) {
          emu_cur = &t;
          swapcontext(&emu_sched, &t.ctx);
        }
      bool all_done = true, released = false;
      for (auto &t : th) all_done = all_done && t.state == DONE;
      if (all_done) break;
      for (unsigned w = 0; ok && w < block / 32; w++) {
        bool at = false, all = true, anydone = false;
        for (unsigned l = 0; l < 32; l++) {
          int s = th[w * 32 + l].state;
          if (s == AT_WARP) at = true;
          else if (s != DONE) all = false;
          anydone |= s == DONE;
        }
        if (at && all) {
          if (anydone) {
            fprintf(stderr, "emu %s: shfl with exited lanes\n", name);
            ok = 0;
            break;
          }
          for (unsigned l = 0; l < 32; l++) th[w * 32 + l].state = RUN;
          released = true;
        }
      }
      if (!ok) break;
      if (!released) {
        bool all = true, any = false;
        for (auto &t : th) {
          if (t.state == AT_BLOCK) any = true;
          else if (t.state != DONE) all = false;
        }
        if (any && all) {
          for (auto &t : th)
            if (t.state == AT_BLOCK) t.state = RUN;
          released = true;
        }
      }
      if (!released) {
        fprintf(stderr, "emu %s: deadlock in block %u\n", name, b);
        ok = 0;
        break;
      }
    }
  }
  for (auto &t : th) free(t.stack);
  return ok;
}
