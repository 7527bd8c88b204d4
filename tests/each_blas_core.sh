#!/bin/sh
# each_blas_core.sh PROGRAM [ARGS...] — runs a determinism test once under
# each OpenBLAS core type this CPU can execute (OPENBLAS_CORETYPE), so the
# kernels a developer's machine does not pick by default are covered too:
# OpenBLAS computes an element of C differently in different calls on some
# cores (vm/kern_matmul.c), and a guarantee that holds on one core type only
# held by luck.  The program must report that OpenBLAS ran the core it was
# given (ktest_done checks KILN_EXPECT_BLAS_CORE).  Where the environment
# already sets OPENBLAS_CORETYPE (a machine where OpenBLAS must not pick its
# own kernels), only that core runs.
set -u
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { for f in "$@"; do case " $flags " in *" $f "*) ;; *) return 1 ;; esac; done; }
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  cores=$OPENBLAS_CORETYPE
else
  # the x86-64 cores whose sgemm/dgemm kernels differ, each where the CPU
  # has the instructions it needs (Bulldozer's FMA4 family left out)
  cores=""
  has sse3 && cores="$cores Prescott"
  has avx && cores="$cores Sandybridge"
  has avx2 fma && cores="$cores Haswell Zen"
  has avx512f avx512cd avx512bw avx512dq avx512vl && cores="$cores SkylakeX"
  has avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16 && cores="$cores Cooperlake"
fi
if [ -z "$cores" ]; then
  echo "each_blas_core: no x86-64 OpenBLAS core types on this CPU; running once as it is"
  exec "$@"
fi
passed=0 failed=0
for core in $cores; do
  echo "=== OPENBLAS_CORETYPE=$core"
  if OPENBLAS_CORETYPE=$core KILN_EXPECT_BLAS_CORE=$core "$@"; then
    passed=$((passed + 1))
  else
    echo "each_blas_core: $* failed under OPENBLAS_CORETYPE=$core" >&2
    failed=$((failed + 1))
  fi
done
echo "core types: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
