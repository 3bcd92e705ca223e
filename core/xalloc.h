/* xalloc.h - the compiler's one heap allocation hook.
 *
 * Compiler memory lives in arenas (arena.h); what must outlive or grow
 * outside one goes through these, which report running out of memory and
 * stop, so no caller has a NULL to check. */
#ifndef HPDL_XALLOC_H
#define HPDL_XALLOC_H

#include <stddef.h>

void *xalloc_malloc(size_t size);
void *xalloc_calloc(size_t n, size_t size);
void *xalloc_realloc(void *p, size_t size);

#endif
