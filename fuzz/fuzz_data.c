/* fuzz_data.c - libFuzzer target for the token-shard reader and the data
 * loader over it (runtime/data.c).
 *
 * The input is 8 bytes that choose the loader's configuration (sequence
 * length, batch, data-parallel rank and size, shuffling, prefetching,
 * vocabulary, start position, seed), then one or more shards separated by
 * FUZZ_SEP. Each shard is checked from memory (data_shard_open_mem) and
 * every token read; then the shards are written to a scratch folder and the
 * loader opens them by a glob, as hpdlrun does, and fetches a few
 * micro-batches, after a seek too. Any message is fine; a crash, a
 * sanitizer report, a leak or a hang is a bug. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz_util.h"

enum { CONFIG_BYTES = 8 };

static DataConfig config_of(const uint8_t *c, const char *pattern) {
  DataConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.pattern = pattern;
  cfg.seq_len = 1 + c[0] % 32;
  cfg.batch = 1 + c[1] % 4;
  cfg.nranks = 1 + c[2] % 4;
  cfg.rank = (c[2] >> 4) % cfg.nranks;
  cfg.shuffle = c[3] & 1;
  cfg.prefetch = (c[3] >> 1) & 1;
  cfg.vocab = c[4] ? (int64_t)c[4] << (c[3] >> 4) : 0; /* up to 255 x 2^15: often below the tokens */
  cfg.start = (int64_t)c[5] * 977;
  cfg.seed = (uint64_t)c[6] | (uint64_t)c[7] << 8;
  return cfg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t cfgbytes[CONFIG_BYTES] = {15, 1, 0, 0, 0, 0, 0, 0};
  size_t skip = size < CONFIG_BYTES ? size : CONFIG_BYTES;
  memcpy(cfgbytes, data, skip);
  FuzzPart part[FUZZ_MAX_PARTS];
  int np = fuzz_split(data + skip, size - skip, part);

  RtErr e;
  for (int i = 0; i < np; i++) {
    uint8_t *bytes = fuzz_copy(part[i].data, part[i].len);
    DataShard s;
    if (data_shard_open_mem(&s, "fuzz.bin", bytes, part[i].len, &e) == 0) {
      uint64_t sum = 0;
      for (int64_t k = 0; k < s.ntokens; k++) sum += data_shard_token(&s, k);
      fuzz_note("shard %d: version %d, %" PRId64 " tokens (sum %" PRIu64 ")", i, s.version, s.ntokens, sum);
      data_shard_close(&s);
    } else {
      fuzz_note("shard %d: %s", i, e.msg);
    }
    free(bytes);
  }

  char path[4096], name[64];
  for (int i = 0; i < np; i++) {
    snprintf(name, sizeof name, "shard_%06d.bin", i);
    fuzz_write(name, part[i].data, part[i].len, path);
  }
  char pattern[4200];
  snprintf(pattern, sizeof pattern, "%s/shard_*.bin", fuzz_dir());
  DataConfig cfg = config_of(cfgbytes, pattern);
  DataLoader *L = data_loader_open(&cfg, &e);
  if (!L) {
    fuzz_note("data_loader_open: %s", e.msg);
  } else {
    fuzz_note("data_loader_open: %d shards, %" PRId64 " windows", data_loader_nshards(L), data_loader_windows(L));
    for (int k = 0; k < 4; k++) {
      if (k == 2) data_loader_seek(L, 5 + cfgbytes[5]);
      const DataBatch *b = data_loader_next(L, &e);
      if (!b) {
        fuzz_note("data_loader_next: %s", e.msg);
        break;
      }
      for (int64_t j = 0; j < b->batch * b->seq_len; j++)
        if (cfg.vocab > 0 && (b->inputs[j] < 0 || b->targets[j] < 0 || b->inputs[j] >= cfg.vocab || b->targets[j] >= cfg.vocab))
          abort(); /* the loader promised tokens inside the vocabulary */
    }
    data_loader_close(L);
  }
  fuzz_clean();
  return 0;
}
