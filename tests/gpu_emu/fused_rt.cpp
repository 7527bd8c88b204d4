// fused_rt.cpp — the CPU emulation of CUDA (emu_rt.cpp) for the fused plan
// kernels (jit_gpu/fuse.h) that gpu_emu_gen_fused wrote.
#define EMU_ARGS gpu_fargs
#define EMU_KERNELS "fused_kernels.inc"
#define EMU_REGISTRY "fused_registry.inc"
#include "emu_rt.cpp"
