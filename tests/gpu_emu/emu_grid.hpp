// emu_grid.hpp — runs one launch of an emulated kernel (emu.hpp) on the
// CPU: each block's threads run as coroutines, released together at
// __syncthreads and at each warp shuffle; a block whose threads can never
// meet is reported.  Included once per program or module, after the
// kernels: it defines the emulation's globals.
#include "emu.hpp"
emu_thread *emu_cur;
emu_dim3 blockIdx, blockDim, gridDim;
unsigned char emu_slot[32][32][8];

typedef void (*emu_body)(const void *args);
static emu_body emu_cur_body;
static const void *emu_cur_args;
static const size_t EMU_STACK = 1 << 16;

#ifdef EMU_FAST_SWITCH
void *emu_sched_sp;
// emu_switch(save, to): pushes the callee-saved registers, stores the stack
// pointer in *save, takes `to` as the stack pointer, pops them and returns
// into whatever was suspended there
__asm__(".text\n"
        ".globl emu_switch\n"
        ".hidden emu_switch\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n");
static void emu_trampoline() {
  emu_cur_body(emu_cur_args);
  emu_cur->state = DONE;
  void *gone;
  emu_switch(&gone, emu_sched_sp); // never resumed
  __builtin_trap();
}
// a fresh coroutine on t's stack: six zero registers, then emu_trampoline
// as the return address (entered with the stack as after a call)
static void emu_start(emu_thread &t) {
  uintptr_t top = ((uintptr_t)t.stack + EMU_STACK) & ~(uintptr_t)15;
  void **sp = (void **)(top - 64);
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp[6] = (void *)emu_trampoline;
  sp[7] = nullptr;
  t.sp = sp;
}
static void emu_resume(emu_thread &t) { emu_switch(&emu_sched_sp, t.sp); }
#else
ucontext_t emu_sched;
static void emu_trampoline() {
  emu_cur_body(emu_cur_args);
  emu_cur->state = DONE;
  swapcontext(&emu_cur->ctx, &emu_sched);
}
static void emu_start(emu_thread &t) {
  getcontext(&t.ctx);
  t.ctx.uc_stack.ss_sp = t.stack;
  t.ctx.uc_stack.ss_size = EMU_STACK;
  t.ctx.uc_link = nullptr;
  makecontext(&t.ctx, emu_trampoline, 0);
}
static void emu_resume(emu_thread &t) { swapcontext(&emu_sched, &t.ctx); }
#endif

// runs body(args) as a grid x block launch on the caller's stacks (block
// of them, EMU_STACK bytes each, kept from launch to launch); 0 (with a
// message on stderr) if a block cannot finish
static int emu_run_grid(const char *name, emu_body body, const void *args, unsigned grid, unsigned block,
                        char **stacks) {
  if (block == 0 || block > 1024 || block % 32) {
    fprintf(stderr, "emu %s: block of %u threads (a multiple of 32 up to 1024 is emulated)\n", name, block);
    return 0;
  }
  emu_cur_body = body;
  emu_cur_args = args;
  // no std::vector: a kernel's object then needs nothing of libstdc++, and
  // the emulated NVRTC links it without (cuda_emu.cpp: the link was half
  // of each compile)
  emu_thread *th = (emu_thread *)calloc(block, sizeof *th);
  if (!th) {
    fprintf(stderr, "emu %s: out of memory for %u threads\n", name, block);
    return 0;
  }
  for (unsigned i = 0; i < block; i++) th[i].stack = stacks[i];
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  int ok = 1;
  for (unsigned b = 0; ok && b < grid; b++) {
    blockIdx = {b, 0, 0};
    for (unsigned i = 0; i < block; i++) {
      th[i].tid = i;
      th[i].state = RUN;
      emu_start(th[i]);
    }
    for (;;) {
      for (unsigned i = 0; i < block; i++)
        if (th[i].state == RUN) {
          emu_cur = &th[i];
          emu_resume(th[i]);
        }
      bool all_done = true, released = false;
      for (unsigned i = 0; i < block; i++) all_done = all_done && th[i].state == DONE;
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
        for (unsigned i = 0; i < block; i++) {
          if (th[i].state == AT_BLOCK) any = true;
          else if (th[i].state != DONE) all = false;
        }
        if (any && all) {
          for (unsigned i = 0; i < block; i++)
            if (th[i].state == AT_BLOCK) th[i].state = RUN;
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
  free(th);
  return ok;
}
