/* jitc.h — internal to jit_cpu/: the compiler process (DESIGN §4, §6).
 *
 * Kernels are compiled outside the user's process, by `kiln-jitc`, a small
 * program installed with the library (found by one rule, jitc.c) and spawned on
 * demand with posix_spawn.  It receives kernel descriptions (their key
 * bytes: nothing else is needed to generate a kernel, jit_cpu/kdesc.c),
 * compiles them with libgccjit at low priority (KILN_COMPILE_NICE, default
 * 5) into one object per batch in the disk cache, with an index record per
 * kernel, and says which kernels it stored; the user's process then loads
 * them from the disk cache as it loads any cached kernel.  So the user's
 * process holds no libgccjit state, leaks nothing per compile, registers no
 * exit handler and never waits for a compile at exit (a compile in flight
 * finishes into the cache on its own); several compile at once
 * (KILN_COMPILE_JOBS); a crash of the compiler costs that compile only.
 *
 * The library and the program must be built from the same sources (the
 * kernel keys do not see the program's code generator): the request carries
 * the library's source stamp, and a program of other sources refuses.
 *
 * In-process compiling (the background thread of compile.c) remains the
 * fallback, used when the disk cache is off or unusable (the object has
 * nowhere to go), when no kiln-jitc is found or it refuses, and with
 * KILN_COMPILER=thread. */
#ifndef CPU_JITC_H
#define CPU_JITC_H

#include <libgccjit.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel.h"

/* whether compiles go to the compiler process (the helper found, the disk
   cache usable, not KILN_COMPILER=thread, and no refusal so far) */
bool jitc_available(void);

/* Compiles d[0..n) (their bytes start with salt_len bytes of salt) in
   compiler processes, up to KILN_COMPILE_JOBS at once, each storing its
   batch in the disk cache: ok[i] says kernel i is there now, under
   disk_keys[i].  *batches: processes that ran; why: the first problem a
   compiler reported (a kernel it could not compile), else "".  false when
   no compiler process could run (the caller compiles in-process). */
bool jitc_compile(kernel_desc **d, int n, const uint64_t (*disk_keys)[2], size_t salt_len, bool *ok,
                  int *batches, char *why, size_t why_len);

/* the compiler process: reads one request on stdin, answers on stdout */
int jitc_main(int argc, char **argv);
/* whether this process is the compiler process (jitc_main ran) */
bool jitc_is_helper(void);

/* compile.c: emits and compiles one batch (both processes use it) */
bool cpu_build_batch(kernel_desc **d, int n, const uint64_t (*disk_keys)[2], bool in_memory,
                     bool *emitted, gcc_jit_result **result, char *why, size_t why_len);

#endif
