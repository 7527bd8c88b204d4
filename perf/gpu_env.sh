# shellcheck shell=bash
# perf/gpu_env.sh — sourced by scripts/gpu-check and `scripts/bench --device
# cuda`: how a lent GPU machine (no package registry, no network) builds and
# runs Kiln.  Functions only.

# LD_LIBRARY_PATH gains the CUDA toolkit's library folders and those of the
# nvidia-* Python packages of $1 (default python3): NVRTC and cuBLAS may live
# only there.  Kiln loads them at run time.
kiln_gpu_library_path() {
  local py="${1:-python3}" d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $("$py" -c 'import nvidia, os; p = list(nvidia.__path__)[0]; print(" ".join(os.path.join(p, s, "lib") for s in os.listdir(p)))' 2>/dev/null); do
    if [ -d "$d" ]; then LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; fi
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
}

# KILN_GPU_CMAKE_ARGS: Release with the perf programs; headers a machine
# without a registry lacks from .deps/root (scripts/gpu-deps); without
# libgccjit the CPU runs on the interpreter; without zlib no examples.
kiln_gpu_cmake_args() { # ROOT
  KILN_GPU_CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PERF=ON)
  if [ -d "$1/.deps/root/usr/include" ]; then KILN_GPU_CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$1/.deps/root/usr"); fi
  if ! ls /usr/lib/gcc/x86_64-linux-gnu/*/include/libgccjit.h >/dev/null 2>&1; then
    KILN_GPU_CMAKE_ARGS+=(-DKILN_CPU_JIT=OFF)
  fi
  if ! echo '#include <zlib.h>' | cc -E - >/dev/null 2>&1; then KILN_GPU_CMAKE_ARGS+=(-DKILN_BUILD_EXAMPLES=OFF); fi
  return 0
}
