/* strmap.h - a string-keyed hash map in an arena (open addressing). */
#ifndef HPDL_STRMAP_H
#define HPDL_STRMAP_H

#include "arena.h"

typedef struct {
  const char **keys;
  void **vals;
  int cap, len;
} StrMap;

/* The value stored under key, or NULL. */
void *strmap_get(const StrMap *m, const char *key);
/* Stores key -> val unless key is present; returns the value now stored. */
void *strmap_put(Arena *a, StrMap *m, const char *key, void *val);

#endif
