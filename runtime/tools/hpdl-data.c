/* hpdl-data.c - text to byte-level token shards, and synthetic labelled
 * images, without downloads.
 *
 *   hpdl-data [-o PREFIX] [--val-fraction F] [--shard-tokens N] FILE...
 *   hpdl-data --synthetic BYTES [--seed N] -o PREFIX
 *   hpdl-data --synthetic-images N [--classes K] [--size CxHxW] [--seed N] -o PREFIX
 *   hpdl-data --info FILE...
 *
 * Every byte of the text is a token (a vocabulary of 256), so any file
 * becomes training data: PREFIX_train_000000.bin ... and PREFIX_val_...,
 * in llm.c's .bin layout (data.h). Images go to PREFIX_train_000000.img
 * ..., in the image layout of data.h (CIFAR-10's records behind a header). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "rt.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hpdl-data [-o PREFIX] [--val-fraction F] [--shard-tokens N] FILE...\n"
          "       hpdl-data --synthetic BYTES [--seed N] -o PREFIX\n"
          "       hpdl-data --synthetic-images N [--classes K] [--size CxHxW] [--seed N] -o PREFIX\n"
          "       hpdl-data --info FILE...\n"
          "Turns text into byte-level token shards (one token per byte, vocabulary 256) in llm.c's .bin\n"
          "layout: PREFIX_train_NNNNNN.bin and PREFIX_val_NNNNNN.bin. FILE - reads standard input.\n"
          "Or makes N labelled images for an image model: PREFIX_train_NNNNNN.img and PREFIX_val_NNNNNN.img\n"
          "(a 64-byte header, then CIFAR-10's records: a label byte and C*H*W pixel bytes).\n"
          "\n"
          "  -o PREFIX            output prefix; its folder is made if missing (default: the first FILE\n"
          "                       without its extension)\n"
          "  --val-fraction F     the last F of the text is validation data (default 0.1)\n"
          "  --shard-tokens N     at most N tokens per shard (default 100000000)\n"
          "  --synthetic BYTES    generate BYTES of simple English-like text instead (also written to PREFIX.txt)\n"
          "  --seed N             the synthetic text's or images' seed (default 1)\n"
          "  --synthetic-images N generate N labelled images (the last --val-fraction of them validation):\n"
          "                       each class a colour and stripes of its own, a blob at a random place, noise\n"
          "  --classes K          classes of the synthetic images, 2 to 256 (default 10)\n"
          "  --size CxHxW         channels, height and width of the synthetic images (default 3x32x32)\n"
          "  --shard-images N     at most N images per file (default 50000)\n"
          "  --info               print the header of each token shard or image file and check it (an image\n"
          "                       file's labels too)\n");
}

static int die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "hpdl-data: error: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(hpdl-data --help lists the options)\n");
  return 2;
}

/* Appends a whole stream to buf. */
static int slurp(FILE *f, unsigned char **buf, int64_t *len, int64_t *cap) {
  for (;;) {
    if (*len == *cap) {
      int64_t nc = *cap ? 2 * *cap : 1 << 20;
      unsigned char *nb = rt_realloc(*buf, (size_t)nc);
      if (!nb) return -1;
      *buf = nb;
      *cap = nc;
    }
    size_t got = fread(*buf + *len, 1, (size_t)(*cap - *len), f);
    *len += (int64_t)got;
    if (got == 0) return ferror(f) ? -1 : 0;
  }
}

/* The folder of an output prefix is created when missing, as a user naming
 * `-o data/tiny` expects. */
static int make_prefix_folder(const char *prefix) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", prefix);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = 0;
  RtErr e;
  if (rt_mkdirs(dir, &e) < 0) {
    fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
    return -1;
  }
  return 0;
}

/* "3x32x32" into c, h, w: 0, or -1. */
static int parse_size(const char *v, int64_t *c, int64_t *h, int64_t *w) {
  int64_t d[3];
  const char *p = v;
  for (int i = 0; i < 3; i++) {
    char *end;
    errno = 0;
    if (*p < '0' || *p > '9') return -1;
    long long x = strtoll(p, &end, 10);
    if (errno || x < 1 || x > 65536) return -1;
    d[i] = x;
    if (i < 2 && *end != 'x') return -1;
    if (i == 2 && *end) return -1;
    p = end + 1;
  }
  *c = d[0], *h = d[1], *w = d[2];
  return 0;
}

/* --info of one file, a token shard or an image file by its magic (by its
 * extension, .img, when it has none to read): 0, or 1. */
static int info_one(const char *path) {
  RtErr e;
  int32_t magic = 0;
  size_t len = strlen(path);
  int known = data_file_magic(path, &magic) == 0, img_ext = len >= 4 && !strcmp(path + len - 4, ".img");
  if (known ? magic == DATA_IMAGE_MAGIC : img_ext) {
    DataImages s;
    if (data_images_open(&s, path, &e) < 0) {
      fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
      return 1;
    }
    int64_t counts[DATA_IMAGE_MAX_CLASSES];
    int rc = data_images_check_labels(&s, counts, &e);
    if (rc < 0) {
      fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
    } else {
      printf("%s: image file version %d, %" PRId64 " images of %" PRId64 "x%" PRId64 "x%" PRId64 " (uint8, CHW), %" PRId64
             " classes; images per class:",
             path, s.version, s.count, s.channels, s.height, s.width, s.classes);
      for (int64_t k = 0; k < s.classes; k++) printf(" %" PRId64, counts[k]);
      printf("\n");
    }
    data_images_close(&s);
    return rc < 0;
  }
  DataShard s;
  if (data_shard_open(&s, path, &e) < 0) {
    fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
    return 1;
  }
  printf("%s: version %d (uint%d tokens), %" PRId64 " tokens\n", path, s.version, 8 * s.token_bytes, s.ntokens);
  data_shard_close(&s);
  return 0;
}

int main(int argc, char **argv) {
  const char *prefix = NULL;
  DataConvertOptions opt = {0.1, 0};
  int64_t synthetic = -1, seed = 1, images = -1, classes = 10, shard_images = 0, ic = 3, ih = 32, iw = 32;
  int info = 0;
  /* The file names are collected into argv's own front (never past i). */
  char **files = argv + 1;
  int nfiles = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char *end;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--val-fraction") || !strcmp(a, "--shard-tokens") || !strcmp(a, "--synthetic") ||
               !strcmp(a, "--seed") || !strcmp(a, "--synthetic-images") || !strcmp(a, "--classes") || !strcmp(a, "--size") ||
               !strcmp(a, "--shard-images")) {
      if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) return die_usage("%s needs a value", a);
      const char *v = argv[++i];
      errno = 0;
      if (!strcmp(a, "-o")) prefix = v;
      else if (!strcmp(a, "--val-fraction")) {
        opt.val_fraction = strtod(v, &end);
        if (*end || !(opt.val_fraction >= 0 && opt.val_fraction < 1)) return die_usage("--val-fraction is in [0, 1), not %s", v);
      } else if (!strcmp(a, "--size")) {
        if (parse_size(v, &ic, &ih, &iw) < 0) return die_usage("--size wants CxHxW, each from 1 to 65536 (3x32x32), not %s", v);
      } else {
        long long x = strtoll(v, &end, 10);
        if (errno || *end || x < 0) return die_usage("%s wants a number >= 0", a);
        if (!strcmp(a, "--shard-tokens")) opt.shard_tokens = x;
        else if (!strcmp(a, "--synthetic")) synthetic = x;
        else if (!strcmp(a, "--synthetic-images")) images = x;
        else if (!strcmp(a, "--shard-images")) shard_images = x;
        else if (!strcmp(a, "--classes")) {
          if (x < 2 || x > DATA_IMAGE_MAX_CLASSES) return die_usage("--classes is from 2 to %d (a label is one byte), not %s", DATA_IMAGE_MAX_CLASSES, v);
          classes = x;
        } else seed = x;
      }
    } else if (!strcmp(a, "--info")) {
      info = 1;
    } else if (a[0] == '-' && a[1]) {
      return die_usage("unknown option %s", a);
    } else {
      files[nfiles++] = argv[i];
    }
  }
  RtErr e;
  if (info) {
    if (!nfiles) return die_usage("--info needs a FILE");
    int bad = 0;
    for (int i = 0; i < nfiles; i++) bad |= info_one(files[i]);
    return bad;
  }
  if (images >= 0) {
    if (synthetic >= 0) return die_usage("--synthetic and --synthetic-images make different data; give one");
    if (nfiles) return die_usage("--synthetic-images makes its own images; no FILE (%s)", files[0]);
    if (!prefix) return die_usage("%s needs -o PREFIX", "--synthetic-images");
    if (make_prefix_folder(prefix) < 0) return 1;
    DataSyntheticImages so = {images, ic, ih, iw, classes, (uint64_t)seed, opt.val_fraction, shard_images};
    DataImagesReport rep;
    if (data_write_synthetic_images(&so, prefix, &rep, stdout, &e) < 0) {
      fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
      return 1;
    }
    printf("%" PRId64 " train images in %d file%s, %" PRId64 " validation images in %d file%s (%" PRId64 "x%" PRId64 "x%" PRId64
           ", %" PRId64 " classes)\n",
           rep.train_images, rep.train_files, rep.train_files == 1 ? "" : "s", rep.val_images, rep.val_files,
           rep.val_files == 1 ? "" : "s", ic, ih, iw, classes);
    return 0;
  }
  unsigned char *text = NULL;
  int64_t len = 0, cap = 0;
  char derived[4096];
  if (synthetic >= 0) {
    if (nfiles) return die_usage("--synthetic makes its own text; no FILE (%s)", files[0]);
    if (!prefix) return die_usage("%s needs -o PREFIX", "--synthetic");
    if (make_prefix_folder(prefix) < 0) return 1;
    text = rt_alloc((size_t)(synthetic ? synthetic : 1));
    if (!text) {
      fprintf(stderr, "hpdl-data: error: out of memory\n");
      return 1;
    }
    data_synthetic_text((char *)text, synthetic, (uint64_t)seed);
    len = synthetic;
    char txt[4200];
    snprintf(txt, sizeof txt, "%s.txt", prefix);
    if (rt_write_file_atomic(txt, text, (size_t)len, &e) < 0) {
      fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
      rt_free(text);
      return 1;
    }
    printf("wrote %s (%" PRId64 " bytes of synthetic text)\n", txt, len);
  } else {
    if (!nfiles) {
      usage(stderr);
      return 2;
    }
    for (int i = 0; i < nfiles; i++) {
      FILE *f = strcmp(files[i], "-") ? fopen(files[i], "rb") : stdin;
      if (!f) {
        fprintf(stderr, "hpdl-data: error: %s: cannot open: %s\n", files[i], strerror(errno));
        rt_free(text);
        return 1;
      }
      int rc = slurp(f, &text, &len, &cap);
      if (f != stdin) fclose(f);
      if (rc < 0) {
        fprintf(stderr, "hpdl-data: error: %s: read failed or out of memory\n", files[i]);
        rt_free(text);
        return 1;
      }
    }
    if (!prefix) {
      snprintf(derived, sizeof derived, "%s", strcmp(files[0], "-") ? files[0] : "stdin");
      char *dot = strrchr(derived, '.'), *slash = strrchr(derived, '/');
      if (dot && (!slash || dot > slash)) *dot = 0;
      prefix = derived;
    }
  }
  if (make_prefix_folder(prefix) < 0) {
    rt_free(text);
    return 1;
  }
  DataConvertReport rep;
  int rc = data_convert_bytes(text, len, prefix, &opt, &rep, stdout, &e);
  rt_free(text);
  if (rc < 0) {
    fprintf(stderr, "hpdl-data: error: %s\n", e.msg);
    return 1;
  }
  printf("%" PRId64 " train tokens in %d shard%s, %" PRId64 " validation tokens in %d shard%s (vocabulary 256)\n",
         rep.train_tokens, rep.train_shards, rep.train_shards == 1 ? "" : "s", rep.val_tokens, rep.val_shards,
         rep.val_shards == 1 ? "" : "s");
  return 0;
}
