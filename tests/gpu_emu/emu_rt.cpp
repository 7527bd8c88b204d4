// emu_rt.cpp — launches a generated kernel, by name, on the CPU emulation
// of CUDA (emu_grid.hpp), from the kernels written at build time.
// The kernels' by-value argument type and files: the op kernels' unless a
// wrapper (fused_rt.cpp) names others.
#ifndef EMU_ARGS
#define EMU_ARGS gpu_args
#define EMU_KERNELS "kernels.inc"
#define EMU_REGISTRY "registry.inc"
#endif
#include "emu.hpp"
#include EMU_KERNELS
#include "emu_grid.hpp"
typedef void (*kfn)(const EMU_ARGS);
struct reg { const char *name; kfn fn; };
static const reg registry[] = {
#include EMU_REGISTRY
};
static kfn cur_fn;
static void call_kernel(const void *args) { cur_fn(*(const EMU_ARGS *)args); }
extern "C" int emu_launch(const char *name, const void *args, unsigned grid, unsigned block) {
  kfn fn = nullptr;
  for (auto &r : registry) if (!strcmp(r.name, name)) fn = r.fn;
  if (!fn) { fprintf(stderr, "emu: no kernel %s\n", name); return 0; }
  cur_fn = fn;
  static char *stacks[1024]; // kept from launch to launch
  for (unsigned i = 0; i < block && i < 1024; i++)
    if (!stacks[i] && !(stacks[i] = (char *)malloc(EMU_STACK))) return 0;
  return emu_run_grid(name, call_kernel, args, grid, block, stacks);
}
