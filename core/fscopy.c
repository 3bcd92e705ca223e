/* fscopy.c - a file copied whole, as cp does, and put in place atomically. */
#include "fscopy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fs_copy_file(const char *src, const char *dst, char *why, size_t n) {
  int in = open(src, O_RDONLY);
  if (in < 0) {
    snprintf(why, n, "%.900s: %s", src, strerror(errno));
    return -1;
  }
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dst, (long)getpid());
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0755);
  if (out < 0) {
    snprintf(why, n, "%.900s: %s", tmp, strerror(errno));
    close(in);
    return -1;
  }
  char buf[1 << 16];
  int rc = 0;
  for (;;) {
    ssize_t k = read(in, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      snprintf(why, n, "%.900s: %s", src, strerror(errno));
      rc = -1;
      break;
    }
    if (k == 0) break;
    for (ssize_t at = 0; at < k;) {
      ssize_t w = write(out, buf + at, (size_t)(k - at));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        snprintf(why, n, "%.900s: %s", tmp, strerror(errno));
        rc = -1;
        break;
      }
      at += w;
    }
    if (rc) break;
  }
  close(in);
  if (close(out) != 0 && rc == 0) {
    snprintf(why, n, "%.900s: %s", tmp, strerror(errno));
    rc = -1;
  }
  if (rc == 0 && rename(tmp, dst) != 0) {
    snprintf(why, n, "%.900s: %s", dst, strerror(errno));
    rc = -1;
  }
  if (rc) unlink(tmp);
  return rc;
}
