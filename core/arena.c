/* arena.c - chunked bump allocator. */
#include "arena.h"
#include "xalloc.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ARENA_CHUNK = 64 * 1024, ARENA_ALIGN = 16 };

typedef struct Chunk {
  struct Chunk *next;
  size_t size, used;
  _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
  Chunk *head;
  size_t total;
};

Arena *arena_new(void) {
  Arena *arena = xalloc_malloc(sizeof *arena);
  arena->head = NULL;
  arena->total = 0;
  return arena;
}

void arena_free(Arena *arena) {
  if (!arena) return;
  Chunk *c = arena->head;
  while (c) {
    Chunk *next = c->next;
    free(c);
    c = next;
  }
  free(arena);
}

void *arena_alloc(Arena *arena, size_t size) {
  void *p = arena_alloc_raw(arena, size);
  memset(p, 0, size);
  return p;
}

void *arena_alloc_raw(Arena *arena, size_t size) {
  size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (size == 0) size = ARENA_ALIGN;
  Chunk *c = arena->head;
  if (!c || c->size - c->used < size) {
    size_t cap = size > ARENA_CHUNK / 4 ? size : ARENA_CHUNK;
    c = xalloc_malloc(sizeof(Chunk) + cap);
    c->size = cap;
    c->used = 0;
    /* A big block gets its own chunk behind the head so the head keeps its space. */
    if (cap != ARENA_CHUNK && arena->head) {
      c->next = arena->head->next;
      arena->head->next = c;
    } else {
      c->next = arena->head;
      arena->head = c;
    }
  }
  void *p = c->data + c->used;
  c->used += size;
  arena->total += size;
  return p;
}

char *arena_strndup(Arena *arena, const char *s, size_t n) {
  char *p = arena_alloc(arena, n + 1);
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *arena_strdup(Arena *arena, const char *s) {
  return arena_strndup(arena, s, strlen(s));
}

char *arena_printf(Arena *arena, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(arena, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

size_t arena_used(const Arena *arena) { return arena->total; }

void ptrvec_push(Arena *arena, PtrVec *vec, void *item) {
  if (vec->len == vec->cap) {
    int cap = vec->cap ? vec->cap * 2 : 4;
    void **items = arena_alloc(arena, sizeof(void *) * (size_t)cap);
    if (vec->len) memcpy(items, vec->items, sizeof(void *) * (size_t)vec->len);
    vec->items = items;
    vec->cap = cap;
  }
  vec->items[vec->len++] = item;
}
