// CPU emulation of the CUDA execution model for the generated kernels
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __grid_constant__
#define __shared__ static
struct emu_dim3 { unsigned x, y, z; };
enum { RUN, AT_BLOCK, AT_WARP, DONE };
// A thread is a coroutine.  On x86-64 it switches with emu_switch
// (emu_grid.hpp: callee-saved registers and the stack pointer, no system
// call); elsewhere with ucontext (a system call per switch: slower).
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
extern "C" void emu_switch(void **save_sp, void *to_sp);
struct emu_thread { void *sp; unsigned tid; int state; char *stack; };
extern void *emu_sched_sp;
#else
struct emu_thread { ucontext_t ctx; unsigned tid; int state; char *stack; };
extern ucontext_t emu_sched;
#endif
extern emu_thread *emu_cur;
extern emu_dim3 blockIdx, blockDim, gridDim;
extern unsigned char emu_slot[32][32][8];
static inline emu_dim3 emu_tid() { return emu_dim3{emu_cur->tid, 0, 0}; }
#define threadIdx (emu_tid())
static inline void emu_wait(int what) {
  emu_cur->state = what;
#ifdef EMU_FAST_SWITCH
  emu_switch(&emu_cur->sp, emu_sched_sp);
#else
  swapcontext(&emu_cur->ctx, &emu_sched);
#endif
}
static inline void __syncthreads() { emu_wait(AT_BLOCK); }
static inline void __threadfence() {}
template <class T> T __shfl_down_sync(unsigned, T v, int w) {
  unsigned lane = emu_cur->tid & 31, warp = emu_cur->tid >> 5;
  memcpy(emu_slot[warp][lane], &v, sizeof v);
  emu_wait(AT_WARP);
  T r = v;
  if (lane + w < 32) memcpy(&r, emu_slot[warp][lane + w], sizeof r);
  emu_wait(AT_WARP);
  return r;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int w) {
  unsigned lane = emu_cur->tid & 31, warp = emu_cur->tid >> 5;
  memcpy(emu_slot[warp][lane], &v, sizeof v);
  emu_wait(AT_WARP);
  T r;
  memcpy(&r, emu_slot[warp][lane ^ (unsigned)w], sizeof r);
  emu_wait(AT_WARP);
  return r;
}
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) { auto o = *p; if (v > o) *p = v; return o; }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { auto o = *p; *p += v; return o; }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { auto o = *p; *p += v; return o; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline long long __double_as_longlong(double x) { long long u; memcpy(&u, &x, 8); return u; }
static inline double __longlong_as_double(long long x) { double f; memcpy(&f, &x, 8); return f; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
