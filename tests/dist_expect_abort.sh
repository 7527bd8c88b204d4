#!/bin/sh
# dist_expect_abort.sh MPIRUN NP PROGRAM MODE PATTERN — a failure drill of
# test_dist: one rank dies (MODE die) or hangs (MODE hang) mid-training.
# Passes when the whole job ends, non-zero, within 120 s (no rank hangs)
# and its output contains PATTERN (the clear error).
mpirun="$1" np="$2" program="$3" mode="$4" pattern="$5"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np "$np" "$program" "$mode" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung (killed after 120 s)"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0 although a rank failed"; exit 1; fi
if ! grep -q "$pattern" "$out"; then echo "FAIL: no \"$pattern\" in the output"; exit 1; fi
echo "ok: the job ended with status $rc after ${took} s, saying \"$pattern\""
