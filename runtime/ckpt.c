/* ckpt.c - safetensors writing and validation, checkpoint manifests,
 * retention, and shard extraction / insertion. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "half.h"

static const char *const dtype_names[] = {
#define X(id, bytes) #id,
    CKPT_DTYPES(X)
#undef X
};
static const int dtype_sizes[] = {
#define X(id, bytes) bytes,
    CKPT_DTYPES(X)
#undef X
};

const char *ckpt_dtype_name(CkptDtype t) { return (unsigned)t < CKPT_DTYPE_COUNT ? dtype_names[t] : "?"; }
int ckpt_dtype_size(CkptDtype t) { return (unsigned)t < CKPT_DTYPE_COUNT ? dtype_sizes[t] : 0; }

int ckpt_dtype_parse(const char *s) {
  for (int i = 0; i < CKPT_DTYPE_COUNT; i++)
    if (!strcmp(s, dtype_names[i])) return i;
  return -1;
}

int64_t ckpt_numel(const CkptTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

static int64_t tensor_bytes(const CkptTensor *t) { return ckpt_numel(t) * ckpt_dtype_size(t->dtype); }

/* ---- writing ---- */

/* The fault-injection hooks of the writer (rt_fault): "ckpt-fail-after=N"
 * makes the write fail as a full disk would once N bytes are out;
 * "ckpt-kill-after=N" kills the process there, as a crash would. */
typedef struct {
  int fd;
  const char *path;
  int64_t written, fail_after, kill_after;
} Out;

static int out_write(Out *o, const void *buf, size_t len, RtErr *e) {
  const unsigned char *p = buf;
  while (len) {
    size_t chunk = len < (1u << 20) ? len : (1u << 20);
    if (o->kill_after >= 0 && o->written + (int64_t)chunk > o->kill_after) {
      size_t part = (size_t)(o->kill_after - o->written);
      if (rt_write_all(o->fd, p, part, o->path, e) < 0) return -1;
      fsync(o->fd);
      raise(SIGKILL);
    }
    if (o->fail_after >= 0 && o->written + (int64_t)chunk > o->fail_after)
      return rt_fail_errno(e, ENOSPC, "%s: write failed after %" PRId64 " bytes", o->path, o->written);
    if (rt_write_all(o->fd, p, chunk, o->path, e) < 0) return -1;
    o->written += (int64_t)chunk;
    p += chunk;
    len -= chunk;
  }
  return 0;
}

static int cmp_by_width(const void *a, const void *b, const CkptTensor *t) {
  int ia = *(const int *)a, ib = *(const int *)b;
  int wa = ckpt_dtype_size(t[ia].dtype), wb = ckpt_dtype_size(t[ib].dtype);
  if (wa != wb) return wb - wa;
  return ia - ib;
}

/* An insertion sort (qsort has no context argument in C11); n is the number
 * of tensors, small. */
static void order_by_width(int *ord, int n, const CkptTensor *t) {
  for (int i = 1; i < n; i++) {
    int v = ord[i], j = i;
    while (j > 0 && cmp_by_width(&ord[j - 1], &v, t) > 0) {
      ord[j] = ord[j - 1];
      j--;
    }
    ord[j] = v;
  }
}

static int tmp_path_for(char *tmp, size_t n, const char *path) {
  const char *slash = strrchr(path, '/');
  int w = slash ? snprintf(tmp, n, "%.*s/.%s.tmp.%ld", (int)(slash - path), path, slash + 1, (long)getpid())
                : snprintf(tmp, n, ".%s.tmp.%ld", path, (long)getpid());
  return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

int ckpt_st_write(const char *path, const CkptTensor *tensors, int n, const json_t *meta, uint32_t *crc_out,
                  uint32_t *header_crc_out, RtErr *e) {
  int rc = -1, fd = -1;
  char tmp[4200];
  char *hdr = NULL;
  int *ord = rt_calloc((size_t)(n > 0 ? n : 1), sizeof *ord);
  json_t *root = json_object();
  if (!ord || !root) {
    rt_fail(e, "%s: out of memory", path);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const CkptTensor *t = &tensors[i];
    if (!t->name || !*t->name || !strcmp(t->name, "__metadata__")) {
      rt_fail(e, "%s: tensor %d has an invalid name", path, i);
      goto done;
    }
    if ((unsigned)t->dtype >= CKPT_DTYPE_COUNT || t->rank < 0 || t->rank > CKPT_MAX_RANK) {
      rt_fail(e, "%s: tensor %s has a bad dtype or rank", path, t->name);
      goto done;
    }
    ord[i] = i;
  }
  order_by_width(ord, n, tensors);
  if (meta) {
    json_t *m = json_deep_copy(meta);
    if (!m || json_object_set_new(root, "__metadata__", m) < 0) {
      rt_fail(e, "%s: out of memory", path);
      goto done;
    }
  }
  int64_t off = 0;
  int64_t *begin = rt_calloc((size_t)(n > 0 ? n : 1), sizeof *begin);
  if (!begin) {
    rt_fail(e, "%s: out of memory", path);
    goto done;
  }
  for (int k = 0; k < n; k++) {
    begin[ord[k]] = off;
    off += tensor_bytes(&tensors[ord[k]]);
  }
  for (int i = 0; i < n; i++) {
    const CkptTensor *t = &tensors[i];
    if (json_object_get(root, t->name)) {
      rt_free(begin);
      rt_fail(e, "%s: two tensors are named %s", path, t->name);
      goto done;
    }
    json_t *shape = json_array();
    for (int d = 0; d < t->rank; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *o = json_pack("{s:s, s:o, s:[I, I]}", "dtype", ckpt_dtype_name(t->dtype), "shape", shape, "data_offsets",
                          (json_int_t)begin[i], (json_int_t)(begin[i] + tensor_bytes(t)));
    if (!o || json_object_set_new(root, t->name, o) < 0) {
      rt_free(begin);
      rt_fail(e, "%s: out of memory", path);
      goto done;
    }
  }
  rt_free(begin);
  char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!js) {
    rt_fail(e, "%s: out of memory", path);
    goto done;
  }
  size_t jlen = strlen(js), padded = (jlen + 7) & ~(size_t)7; /* the buffer starts 8-aligned */
  hdr = rt_alloc(8 + padded);
  if (!hdr) {
    free(js);
    rt_fail(e, "%s: out of memory", path);
    goto done;
  }
  uint64_t hlen = padded;
  memcpy(hdr, &hlen, 8);
  memcpy(hdr + 8, js, jlen);
  memset(hdr + 8 + jlen, ' ', padded - jlen);
  free(js);

  if (tmp_path_for(tmp, sizeof tmp, path) < 0) {
    rt_fail(e, "%s: path too long", path);
    goto done;
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    rt_fail_errno(e, errno, "%s: cannot create", tmp);
    goto done;
  }
  Out o = {fd, tmp, 0, rt_fault("ckpt-fail-after"), rt_fault("ckpt-kill-after")};
  if (header_crc_out) *header_crc_out = crc32c_update(0, hdr, 8 + padded);
  if (out_write(&o, hdr, 8 + padded, e) < 0) goto fail_tmp;
  for (int k = 0; k < n; k++) {
    const CkptTensor *t = &tensors[ord[k]];
    size_t nb = (size_t)tensor_bytes(t);
    if (crc_out) crc_out[ord[k]] = crc32c_update(0, t->data, nb);
    if (nb && out_write(&o, t->data, nb, e) < 0) goto fail_tmp;
  }
  if (fsync(fd) < 0) {
    rt_fail_errno(e, errno, "%s: fsync failed", tmp);
    goto fail_tmp;
  }
  int cr = close(fd);
  fd = -1;
  if (cr < 0) {
    rt_fail_errno(e, errno, "%s: close failed", tmp);
    goto fail_tmp;
  }
  if (rename(tmp, path) < 0) {
    rt_fail_errno(e, errno, "%s: cannot rename into place", path);
    goto fail_tmp;
  }
  rc = rt_fsync_dir_of(path, e);
  goto done;
fail_tmp:
  if (fd >= 0) close(fd);
  fd = -1;
  unlink(tmp); /* a failed write never leaves a file under the final name */
done:
  if (fd >= 0) close(fd);
  rt_free(hdr);
  rt_free(ord);
  json_decref(root);
  return rc;
}

/* ---- reading ---- */

struct CkptFile {
  char *path;
  void *map;
  size_t map_len;
  int64_t file_bytes;
  uint32_t header_crc;
  CkptTensor *t;
  int n;
  json_t *meta;
};

void ckpt_st_close(CkptFile *f) {
  if (!f) return;
  if (f->map) munmap(f->map, f->map_len);
  for (int i = 0; i < f->n; i++) rt_free((char *)f->t[i].name);
  rt_free(f->t);
  json_decref(f->meta);
  rt_free(f->path);
  rt_free(f);
}

int ckpt_st_count(const CkptFile *f) { return f->n; }
const CkptTensor *ckpt_st_tensor(const CkptFile *f, int i) { return (i >= 0 && i < f->n) ? &f->t[i] : NULL; }
const json_t *ckpt_st_meta(const CkptFile *f) { return f->meta; }
uint32_t ckpt_st_header_crc(const CkptFile *f) { return f->header_crc; }
int64_t ckpt_st_file_bytes(const CkptFile *f) { return f->file_bytes; }

const CkptTensor *ckpt_st_find(const CkptFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

typedef struct {
  int64_t begin, end;
  int idx;
} Span;

static int cmp_span(const void *a, const void *b) {
  const Span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Validates the safetensors bytes [base, base + size) into f (its tensors
 * point into them); messages name f->path. */
static int st_parse(CkptFile *f, const unsigned char *base, int64_t size, RtErr *e) {
  const char *path = f->path;
  Span *spans = NULL;
  json_t *root = NULL;
  f->file_bytes = size;
  if (size < 8) {
    rt_fail(e, "%s: truncated: %" PRId64 " bytes, shorter than the 8-byte header length of a safetensors file", path, size);
    goto fail;
  }
  uint64_t hlen;
  memcpy(&hlen, base, 8);
  if (hlen > 100000000u) { /* the reference implementation's limit */
    rt_fail(e, "%s: not a safetensors file: the header length at byte 0 is %" PRIu64 " bytes", path, hlen);
    goto fail;
  }
  if ((int64_t)hlen > size - 8) {
    rt_fail(e, "%s: truncated: the header length at byte 0 is %" PRIu64 " bytes, but the file ends at byte %" PRId64, path, hlen,
            size);
    goto fail;
  }
  f->header_crc = crc32c_update(0, base, 8 + (size_t)hlen);
  json_error_t je;
  root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
  if (!root || !json_is_object(root)) {
    rt_fail(e, "%s: the header (bytes 8 to %" PRIu64 ") is not a JSON object%s%s", path, 8 + hlen, root ? "" : ": ",
            root ? "" : je.text);
    goto fail;
  }
  size_t cap = json_object_size(root);
  f->t = rt_calloc(cap ? cap : 1, sizeof *f->t);
  spans = rt_calloc(cap ? cap : 1, sizeof *spans);
  if (!f->t || !spans) {
    rt_fail(e, "%s: out of memory", path);
    goto fail;
  }
  int64_t buflen = size - 8 - (int64_t)hlen;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) {
      if (!json_is_object(val)) {
        rt_fail(e, "%s: __metadata__ is not an object of strings", path);
        goto fail;
      }
      f->meta = json_incref(val);
      continue;
    }
    json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"), *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1))) {
      rt_fail(e, "%s: tensor %s: the header entry needs dtype, shape and data_offsets [begin, end]", path, key);
      goto fail;
    }
    int dt = ckpt_dtype_parse(json_string_value(jd));
    if (dt < 0) {
      rt_fail(e, "%s: tensor %s: unknown dtype %s", path, key, json_string_value(jd));
      goto fail;
    }
    CkptTensor *t = &f->t[f->n];
    t->dtype = (CkptDtype)dt;
    if (json_array_size(js) > CKPT_MAX_RANK) {
      rt_fail(e, "%s: tensor %s: rank %zu is more than %d", path, key, json_array_size(js), CKPT_MAX_RANK);
      goto fail;
    }
    t->rank = (int)json_array_size(js);
    int64_t numel = 1;
    for (int d = 0; d < t->rank; d++) {
      json_t *x = json_array_get(js, (size_t)d);
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((int64_t)1 << 40)) {
        rt_fail(e, "%s: tensor %s: bad dimension %d in the shape", path, key, d);
        goto fail;
      }
      t->shape[d] = json_integer_value(x);
      /* checked before multiplying: 2^50 x 2^40 would overflow */
      if (t->shape[d] && numel > ((int64_t)1 << 50) / t->shape[d]) {
        rt_fail(e, "%s: tensor %s: implausibly large: the shape passes 2^50 elements at dimension %d", path, key, d);
        goto fail;
      }
      numel *= t->shape[d];
    }
    int64_t b = json_integer_value(json_array_get(jo, 0)), en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < b) {
      rt_fail(e, "%s: tensor %s: bad data_offsets [%" PRId64 ", %" PRId64 "]", path, key, b, en);
      goto fail;
    }
    if (en - b != numel * ckpt_dtype_size(t->dtype)) {
      rt_fail(e, "%s: tensor %s: data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRId64 " bytes, but %s%s needs %" PRId64, path, key,
              b, en, en - b, json_string_value(jd), "", numel * ckpt_dtype_size(t->dtype));
      goto fail;
    }
    if (en > buflen) {
      rt_fail(e,
              "%s: truncated: tensor %s ends at byte %" PRId64 " of the file, but the file ends at byte %" PRId64
              " (the header says the data buffer is at least %" PRId64 " bytes)",
              path, key, 8 + (int64_t)hlen + en, size, en);
      goto fail;
    }
    t->name = rt_strdup(key);
    if (!t->name) {
      rt_fail(e, "%s: out of memory", path);
      goto fail;
    }
    t->data = base + 8 + hlen + b;
    spans[f->n] = (Span){b, en, f->n};
    f->n++;
  }
  qsort(spans, (size_t)f->n, sizeof *spans, cmp_span);
  int64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    if (spans[i].begin != at) {
      const char *what = spans[i].begin < at ? "overlaps the tensor before it" : "leaves a hole before it";
      rt_fail(e, "%s: tensor %s (data bytes %" PRId64 " to %" PRId64 ") %s", path, f->t[spans[i].idx].name, spans[i].begin,
              spans[i].end, what);
      goto fail;
    }
    at = spans[i].end;
  }
  if (at != buflen) {
    rt_fail(e, "%s: %" PRId64 " bytes after the last tensor (from byte %" PRId64 "): not a well-formed safetensors file", path,
            buflen - at, 8 + (int64_t)hlen + at);
    goto fail;
  }
  rt_free(spans);
  json_decref(root);
  return 0;
fail:
  rt_free(spans);
  json_decref(root);
  return -1;
}

CkptFile *ckpt_st_open(const char *path, RtErr *e) {
  CkptFile *f = rt_calloc(1, sizeof *f);
  int fd = -1;
  if (!f || !(f->path = rt_strdup(path))) {
    rt_fail(e, "%s: out of memory", path);
    goto fail;
  }
  fd = open(path, O_RDONLY);
  if (fd < 0) {
    rt_fail_errno(e, errno, "%s: cannot open the checkpoint", path);
    goto fail;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    rt_fail_errno(e, errno, "%s: cannot stat", path);
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    rt_fail(e, "%s: not a regular file", path);
    goto fail;
  }
  int64_t size = (int64_t)st.st_size;
  if (size >= 8) { /* shorter: st_parse says truncated (mmap refuses 0 bytes) */
    f->map_len = (size_t)size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
      f->map = NULL;
      rt_fail_errno(e, errno, "%s: cannot map the file", path);
      goto fail;
    }
  }
  if (st_parse(f, f->map, size, e) < 0) goto fail;
  close(fd);
  return f;
fail:
  if (fd >= 0) close(fd);
  ckpt_st_close(f);
  return NULL;
}

CkptFile *ckpt_st_open_mem(const char *name, const void *buf, size_t len, RtErr *e) {
  CkptFile *f = rt_calloc(1, sizeof *f);
  if (!f || !(f->path = rt_strdup(name))) {
    rt_fail(e, "%s: out of memory", name);
    ckpt_st_close(f);
    return NULL;
  }
  if (st_parse(f, buf, (int64_t)len, e) < 0) {
    ckpt_st_close(f);
    return NULL;
  }
  return f;
}


int ckpt_st_read_f32(const CkptTensor *t, float *out, RtErr *e) {
  int64_t n = ckpt_numel(t);
  const unsigned char *p = t->data;
  switch (t->dtype) {
  case CKPT_F32: memcpy(out, p, (size_t)n * 4); return 0;
  case CKPT_F64:
    for (int64_t i = 0; i < n; i++) {
      double d;
      memcpy(&d, p + 8 * i, 8);
      out[i] = (float)d;
    }
    return 0;
  case CKPT_F16:
  case CKPT_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      out[i] = t->dtype == CKPT_F16 ? half_to_f32(h) : half_bf16_to_f32(h);
    }
    return 0;
  default: return rt_fail(e, "tensor %s is %s, not a floating-point type", t->name, ckpt_dtype_name(t->dtype));
  }
}

/* ---- checkpoints ---- */

static int step_name(char *out, size_t n, const char *dir, int64_t step, const char *ext) {
  char name[64];
  snprintf(name, sizeof name, "step-%08" PRId64 ".%s", step, ext);
  return rt_path_join(out, n, dir, name);
}

/* "step-NNNNNNNN.<ext>" -> NNNNNNNN, or -1. */
static int64_t parse_step_name(const char *name, const char *ext) {
  if (strncmp(name, "step-", 5)) return -1;
  const char *p = name + 5, *q = p;
  while (*q >= '0' && *q <= '9') q++;
  if (q == p || q - p > 18 || *q != '.' || strcmp(q + 1, ext)) return -1;
  return strtoll(p, NULL, 10);
}

static char *hex32(char *buf, uint32_t v) {
  snprintf(buf, 9, "%08" PRIx32, v);
  return buf;
}

int ckpt_save(const char *dir, int64_t step, const CkptTensor *tensors, int n, const json_t *info, int keep,
              char *manifest_out, RtErr *e) {
  char tpath[4096], mpath[4096];
  if (step < 0) return rt_fail(e, "checkpoint step %" PRId64 " is negative", step);
  if (rt_mkdirs(dir, e) < 0) return -1;
  if (step_name(tpath, sizeof tpath, dir, step, "safetensors") < 0 || step_name(mpath, sizeof mpath, dir, step, "json") < 0)
    return rt_fail(e, "%s: path too long", dir);
  uint32_t *crc = rt_calloc((size_t)(n > 0 ? n : 1), sizeof *crc);
  if (!crc) return rt_fail(e, "out of memory");
  uint32_t hcrc = 0;
  json_t *meta = json_pack("{s:s, s:s, s:s}", "format", "pt", "producer", "hpdl", "step", "");
  char stepbuf[32];
  snprintf(stepbuf, sizeof stepbuf, "%" PRId64, step);
  json_object_set_new(meta, "step", json_string(stepbuf));
  /* Saving over an existing checkpoint of the same step: drop its manifest
   * first, so that no moment shows the old manifest beside the new tensors. */
  if (unlink(mpath) == 0 && rt_fsync_dir_of(mpath, e) < 0) {
    json_decref(meta);
    rt_free(crc);
    return -1;
  }
  int rc = ckpt_st_write(tpath, tensors, n, meta, crc, &hcrc, e);
  json_decref(meta);
  if (rc < 0) {
    rt_free(crc);
    return -1;
  }
  if (rt_fault("ckpt-kill-before-manifest") >= 0) raise(SIGKILL);
  struct stat st;
  if (stat(tpath, &st) < 0) {
    rt_free(crc);
    return rt_fail_errno(e, errno, "%s: cannot stat", tpath);
  }
  char hx[16];
  json_t *tens = json_object();
  for (int i = 0; i < n; i++) {
    json_t *shape = json_array();
    for (int d = 0; d < tensors[i].rank; d++) json_array_append_new(shape, json_integer(tensors[i].shape[d]));
    json_object_set_new(tens, tensors[i].name,
                        json_pack("{s:s, s:o, s:s}", "dtype", ckpt_dtype_name(tensors[i].dtype), "shape", shape, "crc32c",
                                  hex32(hx, crc[i])));
  }
  rt_free(crc);
  const char *base = strrchr(tpath, '/');
  json_t *man = json_pack("{s:s, s:i, s:I, s:s, s:I, s:s, s:s, s:o}", "format", "hpdl-checkpoint", "version", 1, "step",
                          (json_int_t)step, "tensors_file", base ? base + 1 : tpath, "file_bytes", (json_int_t)st.st_size,
                          "checksum", "crc32c", "header_crc32c", hex32(hx, hcrc), "tensors", tens);
  if (!man) return rt_fail(e, "out of memory");
  if (info) json_object_set_new(man, "info", json_deep_copy(info));
  char *text = json_dumps(man, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  json_decref(man);
  if (!text) return rt_fail(e, "out of memory");
  size_t tl = strlen(text);
  text[tl] = '\n'; /* json_dumps' NUL becomes the final newline */
  rc = rt_write_file_atomic(mpath, text, tl + 1, e);
  free(text);
  if (rc < 0) return -1;
  if (manifest_out) snprintf(manifest_out, 4096, "%s", mpath);
  /* Always prune: with keep 0 nothing complete goes, but what killed
   * writers left does. */
  return ckpt_prune(dir, keep, e);
}

typedef struct {
  int64_t *steps;
  int n, cap;
} StepList;

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static int list_steps(const char *dir, const char *ext, StepList *l, RtErr *e) {
  memset(l, 0, sizeof *l);
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return rt_fail_errno(e, errno, "%s: cannot read the checkpoint folder", dir);
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    int64_t s = parse_step_name(de->d_name, ext);
    if (s < 0) continue;
    if (l->n == l->cap) {
      int nc = l->cap ? 2 * l->cap : 16;
      int64_t *ns = rt_realloc(l->steps, sizeof *ns * (size_t)nc);
      if (!ns) {
        closedir(d);
        return rt_fail(e, "out of memory");
      }
      l->steps = ns;
      l->cap = nc;
    }
    l->steps[l->n++] = s;
  }
  closedir(d);
  /* an empty folder (made before the first step) has no list: qsort may not see NULL */
  if (l->n > 1) qsort(l->steps, (size_t)l->n, sizeof *l->steps, cmp_i64);
  return 0;
}

int ckpt_latest(const char *dir, int64_t *step, char *manifest_path, RtErr *e) {
  StepList l;
  if (list_steps(dir, "json", &l, e) < 0) return -1;
  int found = l.n > 0;
  if (found) {
    *step = l.steps[l.n - 1];
    if (step_name(manifest_path, 4096, dir, *step, "json") < 0) found = rt_fail(e, "%s: path too long", dir);
  }
  rt_free(l.steps);
  return found;
}

static int in_list(const StepList *l, int64_t s) {
  for (int i = 0; i < l->n; i++)
    if (l->steps[i] == s) return 1;
  return 0;
}

int ckpt_prune(const char *dir, int keep, RtErr *e) {
  StepList man, ten;
  if (list_steps(dir, "json", &man, e) < 0) return -1;
  if (list_steps(dir, "safetensors", &ten, e) < 0) {
    rt_free(man.steps);
    return -1;
  }
  char p[4096];
  int rc = 0;
  for (int i = 0; keep > 0 && i < man.n - keep; i++) {
    step_name(p, sizeof p, dir, man.steps[i], "json");
    if (unlink(p) < 0 && errno != ENOENT) {
      rc = rt_fail_errno(e, errno, "%s: cannot delete", p);
      break;
    }
    if (rt_fsync_dir_of(p, e) < 0) {
      rc = -1;
      break;
    }
    step_name(p, sizeof p, dir, man.steps[i], "safetensors");
    unlink(p);
  }
  /* Tensor files without a manifest are what a writer killed between its two
   * renames leaves; older than the newest checkpoint, they are garbage. */
  int64_t newest = man.n ? man.steps[man.n - 1] : -1;
  for (int i = 0; rc == 0 && i < ten.n; i++)
    if (ten.steps[i] < newest && !in_list(&man, ten.steps[i])) {
      step_name(p, sizeof p, dir, ten.steps[i], "safetensors");
      unlink(p);
    }
  rt_free(man.steps);
  rt_free(ten.steps);
  if (rc < 0) return rc;
  /* Temporaries of dead writers: ".step-*.tmp.PID" whose process is gone. */
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    const char *t = strstr(de->d_name, ".tmp.");
    if (strncmp(de->d_name, ".step-", 6) || !t) continue;
    long pid = strtol(t + 5, NULL, 10);
    if (pid > 0 && (pid == (long)getpid() || kill((pid_t)pid, 0) == 0)) continue;
    if (rt_path_join(p, sizeof p, dir, de->d_name) == 0) unlink(p);
  }
  closedir(d);
  return 0;
}

struct Ckpt {
  char *manifest_path, *tensors_path;
  json_t *manifest;
  CkptFile *file;
  int64_t step;
};

void ckpt_close(Ckpt *c) {
  if (!c) return;
  ckpt_st_close(c->file);
  json_decref(c->manifest);
  rt_free(c->manifest_path);
  rt_free(c->tensors_path);
  rt_free(c);
}

int64_t ckpt_step(const Ckpt *c) { return c->step; }
const json_t *ckpt_info(const Ckpt *c) { return json_object_get(c->manifest, "info"); }
const CkptFile *ckpt_file(const Ckpt *c) { return c->file; }
const char *ckpt_path(const Ckpt *c) { return c->tensors_path; }

static int parse_hex32(const json_t *j, uint32_t *out) {
  if (!json_is_string(j)) return -1;
  const char *s = json_string_value(j);
  char *end;
  if (strlen(s) != 8) return -1;
  unsigned long v = strtoul(s, &end, 16);
  if (*end) return -1;
  *out = (uint32_t)v;
  return 0;
}

Ckpt *ckpt_load(const char *path, RtErr *e) {
  char mpath[4096];
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    int64_t s;
    int r = ckpt_latest(path, &s, mpath, e);
    if (r < 0) return NULL;
    if (r == 0) {
      rt_fail(e, "%s: no checkpoint in this folder (no step-*.json manifest)", path);
      return NULL;
    }
  } else if (snprintf(mpath, sizeof mpath, "%s", path) >= (int)sizeof mpath) {
    rt_fail(e, "%s: path too long", path);
    return NULL;
  }
  Ckpt *c = rt_calloc(1, sizeof *c);
  if (!c || !(c->manifest_path = rt_strdup(mpath))) {
    rt_fail(e, "out of memory");
    rt_free(c);
    return NULL;
  }
  json_error_t je;
  c->manifest = json_load_file(mpath, JSON_REJECT_DUPLICATES, &je);
  if (!c->manifest) {
    if (access(mpath, R_OK) < 0) rt_fail_errno(e, errno, "%s: cannot read the checkpoint manifest", mpath);
    else rt_fail(e, "%s:%d:%d: the checkpoint manifest is not valid JSON: %s", mpath, je.line, je.column, je.text);
    goto fail;
  }
  const json_t *m = c->manifest;
  const char *fmt = json_string_value(json_object_get(m, "format"));
  const char *tf = json_string_value(json_object_get(m, "tensors_file"));
  json_t *jbytes = json_object_get(m, "file_bytes"), *jtens = json_object_get(m, "tensors"), *jstep = json_object_get(m, "step");
  uint32_t want_hcrc;
  if (!fmt || strcmp(fmt, "hpdl-checkpoint") || !tf || strchr(tf, '/') || !json_is_integer(jbytes) || !json_is_object(jtens) ||
      !json_is_integer(jstep) || json_integer_value(jstep) < 0 || parse_hex32(json_object_get(m, "header_crc32c"), &want_hcrc) < 0) {
    rt_fail(e, "%s: not an hpdl checkpoint manifest (format, step >= 0, tensors_file, file_bytes, header_crc32c, tensors)", mpath);
    goto fail;
  }
  c->step = json_integer_value(jstep);
  char tpath[4096];
  const char *slash = strrchr(mpath, '/');
  int w = slash ? snprintf(tpath, sizeof tpath, "%.*s/%s", (int)(slash - mpath), mpath, tf) : snprintf(tpath, sizeof tpath, "%s", tf);
  if (w < 0 || (size_t)w >= sizeof tpath || !(c->tensors_path = rt_strdup(tpath))) {
    rt_fail(e, "%s: path too long", mpath);
    goto fail;
  }
  if (stat(tpath, &st) < 0) {
    rt_fail_errno(e, errno, "%s: the checkpoint's tensor file (named by %s) cannot be read", tpath, mpath);
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    rt_fail(e, "%s: the checkpoint's tensor file (named by %s) is not a regular file", tpath, mpath);
    goto fail;
  }
  int64_t want_bytes = json_integer_value(jbytes);
  if ((int64_t)st.st_size != want_bytes) {
    rt_fail(e, "%s: %s: the file has %" PRId64 " bytes, the manifest %s recorded %" PRId64, tpath,
            (int64_t)st.st_size < want_bytes ? "truncated" : "changed since it was written", (int64_t)st.st_size, mpath, want_bytes);
    goto fail;
  }
  c->file = ckpt_st_open(tpath, e);
  if (!c->file) goto fail;
  if (ckpt_st_header_crc(c->file) != want_hcrc) {
    rt_fail(e, "%s: corrupted: the header's CRC-32C is %08" PRIx32 ", the manifest recorded %08" PRIx32, tpath,
            ckpt_st_header_crc(c->file), want_hcrc);
    goto fail;
  }
  if ((size_t)ckpt_st_count(c->file) != json_object_size(jtens)) {
    rt_fail(e, "%s: holds %d tensors, the manifest lists %zu", tpath, ckpt_st_count(c->file), json_object_size(jtens));
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach(jtens, key, val) {
    const CkptTensor *t = ckpt_st_find(c->file, key);
    if (!t) {
      rt_fail(e, "%s: tensor %s listed in the manifest is missing", tpath, key);
      goto fail;
    }
    const char *dt = json_string_value(json_object_get(val, "dtype"));
    json_t *shape = json_object_get(val, "shape");
    uint32_t want;
    if (!dt || !json_is_array(shape) || parse_hex32(json_object_get(val, "crc32c"), &want) < 0) {
      rt_fail(e, "%s: the manifest's entry for %s needs dtype, shape and crc32c", mpath, key);
      goto fail;
    }
    int same = !strcmp(dt, ckpt_dtype_name(t->dtype)) && json_array_size(shape) == (size_t)t->rank;
    for (int d = 0; same && d < t->rank; d++) same = json_integer_value(json_array_get(shape, (size_t)d)) == t->shape[d];
    if (!same) {
      rt_fail(e, "%s: tensor %s's dtype or shape differs from the manifest's", tpath, key);
      goto fail;
    }
    uint32_t got = crc32c_update(0, t->data, (size_t)tensor_bytes(t));
    if (got != want) {
      rt_fail(e, "%s: corrupted: tensor %s's CRC-32C is %08" PRIx32 ", the manifest recorded %08" PRIx32, tpath, key, got, want);
      goto fail;
    }
  }
  return c;
fail:
  ckpt_close(c);
  return NULL;
}
