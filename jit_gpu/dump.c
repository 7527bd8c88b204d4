/* dump.c — observability of GPU kernels (DESIGN §8): with KILN_DUMP, each
 * kernel NVRTC compiles or the disk cache loads leaves, beside the traces'
 * IR and .dot, its CUDA C (kernel-<name>.cu), PTX (.ptx: a second NVRTC
 * run for the virtual architecture when the image is a cubin), the image
 * itself (.cubin), SASS (.sass, where cuobjdump is found) and a line in
 * gpu-kernels.tsv (name, how it was obtained, architecture, NVRTC ms,
 * image bytes); with KILN_LOG=info, a line per compile, load or in-memory
 * hit of a fused kernel.  Nothing here changes what runs. */
#include "dump.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../trace/dump.h"

extern char **environ;

static void write_file(int dfd, const char *name, const char *suffix, const void *data,
                       size_t len) {
  char path[96];
  snprintf(path, sizeof path, "kernel-%s.%s", name, suffix);
  FILE *f = tr_dump_create(dfd, path);
  if (!f) return;
  fwrite(data, 1, len, f);
  fclose(f);
}

/* cuobjdump from the CUDA toolkit: $CUDA_HOME/bin, /usr/local/cuda/bin, PATH */
static bool find_cuobjdump(char *out, size_t cap) {
  const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  for (size_t i = 0; i < sizeof homes / sizeof *homes; i++) {
    if (!homes[i] || !*homes[i]) continue;
    snprintf(out, cap, "%s/bin/cuobjdump", homes[i]);
    if (access(out, X_OK) == 0) return true;
  }
  const char *path = getenv("PATH");
  while (path && *path) {
    const char *end = strchr(path, ':');
    size_t n = end ? (size_t)(end - path) : strlen(path);
    if (n > 0 && n + 12 < cap) {
      snprintf(out, cap, "%.*s/cuobjdump", (int)n, path);
      if (access(out, X_OK) == 0) return true;
    }
    path = end ? end + 1 : NULL;
  }
  return false;
}

/* cuobjdump -sass kernel-<name>.cubin > kernel-<name>.sass, run in the
   dump directory (the child changes into it through the descriptor) */
static void write_sass(int dfd, const char *name) {
  char tool[512], cubin[96], sass[96];
  if (!find_cuobjdump(tool, sizeof tool)) return;
  snprintf(cubin, sizeof cubin, "kernel-%s.cubin", name);
  snprintf(sass, sizeof sass, "kernel-%s.sass", name);
  FILE *out = tr_dump_create(dfd, sass);
  if (!out) return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addfchdir_np(&fa, dfd);
  posix_spawn_file_actions_adddup2(&fa, fileno(out), STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char *argv[] = {tool, (char *)"-sass", cubin, NULL};
  pid_t pid;
  if (posix_spawn(&pid, tool, &fa, NULL, argv, environ) == 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  posix_spawn_file_actions_destroy(&fa);
  fclose(out);
}

void gpu_dump_kernel(const char *name, const char *src, const void *image, size_t bytes, bool ptx,
                     const char *arch, int cc, const char *how, double nvrtc_ms) {
  const char *dir = getenv("KILN_DUMP");
  if (!dir || !*dir) return;
  int dfd = tr_dump_dir_open();
  if (dfd < 0) return;
  if (src) write_file(dfd, name, "cu", src, strlen(src));
  if (image && ptx) {
    write_file(dfd, name, "ptx", image, strnlen(image, bytes));
  } else if (image) {
    write_file(dfd, name, "cubin", image, bytes);
    write_sass(dfd, name);
    gpu_image p = {0};
    char *log = NULL;
    if (src && gpu_nvrtc_compile_ptx(src, name, cc, &p, &log))
      write_file(dfd, name, "ptx", p.data, strnlen(p.data, p.size));
    gpu_image_free(&p);
    free(log);
  }
  FILE *f = tr_dump_append(dfd, "gpu-kernels.tsv");
  if (f) {
    fprintf(f, "%s\t%s\t%s\t%.3f\t%zu\n", name, how, arch ? arch : "", nvrtc_ms, bytes);
    fclose(f);
  }
  close(dfd);
}

void gpu_log_kernel(const char *name, const char *how, double nvrtc_ms) {
  if (tr_log_level() < 1) return;
  if (nvrtc_ms > 0)
    fprintf(stderr, "kiln: gpu kernel %s: %s in %.1f ms\n", name, how, nvrtc_ms);
  else
    fprintf(stderr, "kiln: gpu kernel %s: %s\n", name, how);
}
