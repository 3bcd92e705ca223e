/* strmap.c - FNV-1a hashing with linear probing; the table doubles at half load. */
#include "strmap.h"

#include <stdint.h>
#include <string.h>

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

void *strmap_get(const StrMap *m, const char *key) {
  if (!m->cap) return NULL;
  size_t mask = (size_t)m->cap - 1;
  for (size_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
    if (!m->keys[i]) return NULL;
    if (!strcmp(m->keys[i], key)) return m->vals[i];
  }
}

static void insert(StrMap *m, const char *key, void *val) {
  size_t mask = (size_t)m->cap - 1;
  size_t i = hash_str(key) & mask;
  while (m->keys[i]) i = (i + 1) & mask;
  m->keys[i] = key;
  m->vals[i] = val;
  m->len++;
}

void *strmap_put(Arena *a, StrMap *m, const char *key, void *val) {
  void *old = strmap_get(m, key);
  if (old) return old;
  if ((m->len + 1) * 2 > m->cap) {
    StrMap bigger = {0, 0, m->cap ? m->cap * 2 : 16, 0};
    bigger.keys = arena_alloc(a, sizeof(char *) * (size_t)bigger.cap);
    bigger.vals = arena_alloc(a, sizeof(void *) * (size_t)bigger.cap);
    for (int i = 0; i < m->cap; i++)
      if (m->keys[i]) insert(&bigger, m->keys[i], m->vals[i]);
    *m = bigger;
  }
  insert(m, key, val);
  return val;
}
