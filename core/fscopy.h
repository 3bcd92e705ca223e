/* fscopy.h - a file copied whole, as cp does, and put in place atomically:
 * written to DST.tmp.PID (mode 0755) and renamed, so a reader of DST never
 * sees half of it (an artifact's program and extern libraries, the
 * emulation libraries' cache entries). */
#ifndef HPDL_FSCOPY_H
#define HPDL_FSCOPY_H

#include <stddef.h>

/* 0, or -1 with why (n bytes) naming the file and the system's reason;
 * nothing is left at DST.tmp.PID either way. */
int fs_copy_file(const char *src, const char *dst, char *why, size_t n);

#endif
