/* private_dir.c — opening and checking private directories and creating
 * files in them without following anything planted there (DESIGN §11).
 * Stateless: every call works on the descriptors and paths it is given. */
#include "private_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

vm_dir_status vm_private_dir_check(const struct stat *st, const char **why) {
  if (!S_ISDIR(st->st_mode)) return *why = "not a directory", VM_DIR_NOT_DIR;
  if (st->st_uid != geteuid()) return *why = "owned by another user", VM_DIR_UNTRUSTED;
  if (st->st_mode & (S_IWGRP | S_IWOTH))
    return *why = "writable by group or others", VM_DIR_UNTRUSTED;
  *why = NULL;
  return VM_DIR_OK;
}

bool vm_private_file_check(const struct stat *st, const char **why) {
  if (!S_ISREG(st->st_mode)) return *why = "not a regular file", false;
  if (st->st_uid != geteuid()) return *why = "owned by another user", false;
  if (st->st_nlink != 1) return *why = "hard-linked", false;
  if (st->st_mode & (S_IWGRP | S_IWOTH)) return *why = "writable by group or others", false;
  *why = NULL;
  return true;
}

/* mkdir -p with mode 0700 for every component it creates */
static void make_parents(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return;
  memcpy(buf, path, n + 1);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(buf, 0700); /* EEXIST and the like: the open below decides */
    *p = '/';
  }
  (void)mkdir(buf, 0700);
}

int vm_private_dir_open(const char *path, bool create, vm_dir_status *status, const char **why) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    make_parents(path);
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) {
    int err = errno;
    struct stat st;
    bool link = err == ELOOP || (err == ENOTDIR && lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
    if (link)
      *status = VM_DIR_UNTRUSTED, *why = "a symbolic link";
    else if (err == ENOTDIR)
      *status = VM_DIR_NOT_DIR, *why = "not a directory";
    else
      *status = VM_DIR_MISSING, *why = strerror(err);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *status = VM_DIR_MISSING, *why = strerror(errno);
    close(fd);
    return -1;
  }
  *status = vm_private_dir_check(&st, why);
  if (*status != VM_DIR_OK) {
    close(fd);
    return -1;
  }
  return fd;
}

int vm_private_file_create(int dir_fd, const char *name) {
  for (int attempt = 0; attempt < 4; attempt++) {
    int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
    if (unlinkat(dir_fd, name, 0) != 0 && errno != ENOENT) return -1; /* e.g. a directory */
  }
  errno = EEXIST;
  return -1;
}

bool vm_fd_path(int dir_fd, const char *name, char *out, size_t out_len) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", dir_fd);
  struct stat via, direct;
  if (stat(link, &via) != 0 || fstat(dir_fd, &direct) != 0 || via.st_dev != direct.st_dev ||
      via.st_ino != direct.st_ino)
    return false;
  int n = snprintf(out, out_len, "%s/%s", link, name);
  return n > 0 && (size_t)n < out_len;
}

bool vm_write_full(int fd, const void *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, (const char *)buf + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += (size_t)w;
  }
  return true;
}

bool vm_trusted_mode(const struct stat *st) {
  return (st->st_uid == 0 || st->st_uid == geteuid()) && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

bool vm_trusted_dirs(const char *real_path, char *why, size_t why_len) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", real_path);
  for (char *slash; (slash = strrchr(dir, '/'));) {
    if (slash == dir)
      slash[1] = 0; /* "/" itself */
    else
      *slash = 0;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        !(st.st_uid == 0 || st.st_uid == geteuid()) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      snprintf(why, why_len,
               "directory %s is not owned by root or you, or others can write to it (and it is "
               "not sticky)",
               dir);
      return false;
    }
    if (slash == dir) break;
  }
  return true;
}
