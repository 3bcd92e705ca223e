/* xalloc.c - allocation that stops the program when memory runs out. */
#include "xalloc.h"

#include <stdio.h>
#include <stdlib.h>

static void *checked(void *p, size_t size) {
  if (!p) {
    fprintf(stderr, "hpdlc: out of memory (%zu bytes)\n", size);
    exit(3);
  }
  return p;
}

void *xalloc_malloc(size_t size) { return checked(malloc(size ? size : 1), size); }
void *xalloc_calloc(size_t n, size_t size) { return checked(calloc(n ? n : 1, size ? size : 1), n * size); }
void *xalloc_realloc(void *p, size_t size) { return checked(realloc(p, size ? size : 1), size); }
