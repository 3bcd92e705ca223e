/* arena.h - bump allocation for compiler memory: everything a compilation
 * allocates lives in one arena and is freed with one call. */
#ifndef HPDL_ARENA_H
#define HPDL_ARENA_H

#include <stddef.h>

typedef struct Arena Arena;

Arena *arena_new(void);
void arena_free(Arena *arena);
/* Zeroed, 16-byte aligned. Aborts with a message when memory runs out. */
void *arena_alloc(Arena *arena, size_t size);
/* The same, not zeroed: for storage the caller fills before reading it (a
 * growing array's copy: zeroing what is about to be overwritten was a tenth
 * of a planner search's instructions). */
void *arena_alloc_raw(Arena *arena, size_t size);
char *arena_strdup(Arena *arena, const char *s);
char *arena_strndup(Arena *arena, const char *s, size_t n);
char *arena_printf(Arena *arena, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Bytes handed out so far (for tests and --stats). */
size_t arena_used(const Arena *arena);

/* A growable array of pointers whose storage lives in the arena. */
typedef struct {
  void **items;
  int len, cap;
} PtrVec;

void ptrvec_push(Arena *arena, PtrVec *vec, void *item);

#endif
