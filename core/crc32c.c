/* crc32c.c - table-driven CRC-32C, eight bytes a step ("slicing-by-8",
 * Kounavis and Berry, Intel 2005), a few GB/s without special instructions. */
#include "crc32c.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int s = 1; s < 8; s++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
}

uint32_t crc32c_update(uint32_t crc, const void *data, size_t len) {
  pthread_once(&table_once, table_init);
  const unsigned char *p = data;
  uint32_t c = ~crc;
  while (len && ((uintptr_t)p & 7)) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8); /* little-endian host (rt.h) */
    w ^= c;
    c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^ table[4][(w >> 24) & 0xff] ^
        table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
  return ~c;
}

int crc32c_file(const char *path, int64_t *bytes, uint32_t *crc) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  unsigned char buf[1 << 16];
  size_t n;
  *bytes = 0;
  *crc = 0;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    *crc = crc32c_update(*crc, buf, n);
    *bytes += (int64_t)n;
  }
  int bad = ferror(f);
  fclose(f);
  return bad ? -1 : 0;
}
