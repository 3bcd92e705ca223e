/* artifact.c - reading and checking DIR/manifest.json. */
#include "artifact.h"

#include <errno.h>
#include <stdio.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "semtypes.h"

typedef struct {
  const char *path;
  RtErr *e;
  int bad;
} Rd;

/* Each getter leaves the default when the key is absent and fails (once,
 * keeping the first message) when it is present with the wrong type. */
static int bad(Rd *r, const char *where, const char *key, const char *want) {
  if (!r->bad) rt_fail(r->e, "%s: %s%s%s: %s", r->path, where, *where && *key ? "." : "", key, want);
  r->bad = 1;
  return -1;
}

static void get_i64(Rd *r, const json_t *o, const char *where, const char *key, int64_t min, int64_t *out) {
  json_t *v = json_object_get(o, key);
  if (!v) return;
  if (!json_is_integer(v) || json_integer_value(v) < min) {
    char want[64];
    snprintf(want, sizeof want, "must be an integer >= %" PRId64, min);
    bad(r, where, key, want);
    return;
  }
  *out = json_integer_value(v);
}

static void get_int(Rd *r, const json_t *o, const char *where, const char *key, int min, int *out) {
  int64_t v = *out;
  get_i64(r, o, where, key, min, &v);
  if (v > 1 << 30) bad(r, where, key, "is too large");
  else *out = (int)v;
}

static void get_f64(Rd *r, const json_t *o, const char *where, const char *key, double *out) {
  json_t *v = json_object_get(o, key);
  if (!v) return;
  if (!json_is_number(v)) {
    bad(r, where, key, "must be a number");
    return;
  }
  *out = json_number_value(v);
}

static void get_bool(Rd *r, const json_t *o, const char *where, const char *key, int *out) {
  json_t *v = json_object_get(o, key);
  if (!v) return;
  if (!json_is_boolean(v)) {
    bad(r, where, key, "must be true or false");
    return;
  }
  *out = json_is_true(v);
}

static void get_str(Rd *r, const json_t *o, const char *where, const char *key, char **out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return;
  if (!json_is_string(v)) {
    bad(r, where, key, "must be a string");
    return;
  }
  char *s = rt_strdup(json_string_value(v));
  if (!s) {
    bad(r, where, key, "out of memory");
    return;
  }
  rt_free(*out);
  *out = s;
}

int64_t artifact_param_numel(const ArtParam *p) {
  int64_t n = 1;
  for (int i = 0; i < p->rank; i++) n *= p->shape[i];
  return n;
}

int artifact_param_name(const ArtParam *p, int64_t layer, char *out, size_t n) {
  const char *at = strstr(p->name, "{i}");
  int w = at ? snprintf(out, n, "%.*s%" PRId64 "%s", (int)(at - p->name), p->name, layer, at + 3) : snprintf(out, n, "%s", p->name);
  return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

/* One split of a parameter: {"axis": a, "group": "tp" | "cp" | "ep"}. */
static void read_split(Rd *r, const Artifact *a, const ArtParam *p, json_t *js, const char *sub, int *axis_out, CommGroup *group) {
  int axis = -1;
  get_int(r, js, sub, "axis", 0, &axis);
  char *g = NULL;
  get_str(r, js, sub, "group", &g);
  if (g && !strcmp(g, "tp")) *group = COMM_TP;
  else if (g && !strcmp(g, "cp")) *group = COMM_CP;
  else if (g && !strcmp(g, "ep")) *group = COMM_EP;
  else bad(r, sub, "group", "must be \"tp\", \"cp\" or \"ep\"");
  rt_free(g);
  if (axis < 0 || axis >= p->rank) bad(r, sub, "axis", "must name a dimension of the shape");
  *axis_out = axis;
  int parts = *group == COMM_TP ? a->layout.tp : *group == COMM_EP ? a->layout.ep : a->layout.cp;
  if (!r->bad && parts > 0 && p->shape[axis] % parts) {
    char msg[160];
    snprintf(msg, sizeof msg, "dimension %" PRId64 " does not divide over %s = %d", p->shape[axis], comm_group_name(*group), parts);
    bad(r, sub, "axis", msg);
  }
}

static void read_param(Rd *r, const json_t *j, int idx, ArtParam *p, const Artifact *a) {
  char where[64];
  snprintf(where, sizeof where, "params[%d]", idx);
  if (!json_is_object(j)) {
    bad(r, where, "", "must be an object");
    return;
  }
  get_str(r, j, where, "name", &p->name);
  if (!p->name || !*p->name) {
    bad(r, where, "name", "is required");
    return;
  }
  char *dt = rt_strdup("f32");
  get_str(r, j, where, "dtype", &dt);
  if (dt && strcmp(dt, "f32") && strcmp(dt, "F32")) bad(r, where, "dtype", "must be f32 (mixed precision keeps fp32 master weights)");
  p->dtype = CKPT_F32;
  rt_free(dt);
  json_t *shape = json_object_get(j, "shape");
  if (!json_is_array(shape) || json_array_size(shape) > ART_MAX_RANK) {
    bad(r, where, "shape", "must be an array of at most 8 positive integers");
    return;
  }
  p->rank = (int)json_array_size(shape);
  int64_t numel = 1;
  for (int d = 0; d < p->rank; d++) {
    json_t *x = json_array_get(shape, (size_t)d);
    if (!json_is_integer(x) || json_integer_value(x) < 1) {
      bad(r, where, "shape", "must be an array of at most 8 positive integers");
      return;
    }
    p->shape[d] = json_integer_value(x);
    if (p->shape[d] > ART_MAX_ELEMENTS / numel) {
      bad(r, where, "shape", "is implausibly large (more than 2^48 elements)");
      return;
    }
    numel *= p->shape[d];
  }
  p->count = 1;
  get_i64(r, j, where, "count", 1, &p->count);
  if (!r->bad && p->count > ART_MAX_ELEMENTS / numel) {
    bad(r, where, "count", "is implausibly large (its copies hold more than 2^48 elements)");
    return;
  }
  if (p->count > 1 && !strstr(p->name, "{i}")) bad(r, where, "name", "of a parameter with count > 1 must contain {i}");
  p->weight_decay = p->rank >= 2;
  get_bool(r, j, where, "weight_decay", &p->weight_decay);
  get_bool(r, j, where, "state", &p->state);
  /* init */
  p->init.kind = INIT_K_ZEROS;
  json_t *ji = json_object_get(j, "init");
  if (ji) {
    char sub[96];
    snprintf(sub, sizeof sub, "%s.init", where);
    char *kind = NULL;
    get_str(r, ji, sub, "kind", &kind);
    int k = kind ? init_kind_parse(kind) : -1;
    rt_free(kind);
    if (k < 0) bad(r, sub, "kind", "must be zeros, ones, constant, normal or uniform");
    else p->init.kind = (InitKindRt)k;
    get_f64(r, ji, sub, "a", &p->init.a);
    get_f64(r, ji, sub, "b", &p->init.b);
  }
  /* a padded vocabulary: the ranks hold shards of padded_rows rows */
  json_t *jpad = json_object_get(j, "padded_rows");
  if (jpad && !r->bad) {
    if (!json_is_integer(jpad) || p->rank < 1 || json_integer_value(jpad) < p->shape[0] ||
        json_integer_value(jpad) > ART_MAX_ELEMENTS / (numel / p->shape[0]) / (p->count > 0 ? p->count : 1))
      bad(r, where, "padded_rows", "must be an integer at least the shape's rows");
    else if (json_integer_value(jpad) > p->shape[0]) {
      p->logical_rows = p->shape[0];
      p->shape[0] = json_integer_value(jpad);
    }
  }
  /* split, and an expert shard's second split ("then") */
  p->split_axis = p->split2_axis = -1;
  p->split_group = p->split2_group = COMM_TP;
  json_t *js = json_object_get(j, "split");
  if (js && !json_is_null(js)) {
    char sub[96];
    snprintf(sub, sizeof sub, "%s.split", where);
    read_split(r, a, p, js, sub, &p->split_axis, &p->split_group);
    json_t *then = json_object_get(js, "then");
    if (then && !json_is_null(then)) {
      snprintf(sub, sizeof sub, "%s.split.then", where);
      read_split(r, a, p, then, sub, &p->split2_axis, &p->split2_group);
      if (!r->bad && (p->split2_axis == p->split_axis || p->split2_group == p->split_group))
        bad(r, sub, "axis", "must split another axis over another group than the first split");
    }
  }
  if (!r->bad && p->logical_rows > 0 && p->split_axis > 0)
    bad(r, where, "padded_rows", "is set on a parameter split along another axis than its rows (axis 0)");
  if (!r->bad && p->state && (p->weight_decay || p->split_axis >= 0))
    bad(r, where, "state", "is set on a parameter that is decayed or split (a running statistic is neither)");
  /* stage: one number for every copy, or an array with one per copy */
  if (p->count > (1 << 24)) {
    bad(r, where, "count", "is implausibly large");
    return;
  }
  p->stages = rt_calloc((size_t)p->count, sizeof *p->stages);
  if (!p->stages) {
    bad(r, where, "stage", "out of memory");
    return;
  }
  json_t *st = json_object_get(j, "stage");
  if (json_is_array(st)) {
    if ((int64_t)json_array_size(st) != p->count) bad(r, where, "stage", "must have one entry per copy (count)");
    for (int64_t l = 0; l < p->count && !r->bad; l++) {
      json_t *x = json_array_get(st, (size_t)l);
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= a->layout.pp)
        bad(r, where, "stage", "entries must be pipeline stages 0 .. pp-1");
      else p->stages[l] = (int)json_integer_value(x);
    }
  } else if (st) {
    if (!json_is_integer(st) || json_integer_value(st) < 0 || json_integer_value(st) >= a->layout.pp)
      bad(r, where, "stage", "must be a pipeline stage 0 .. pp-1");
    else
      for (int64_t l = 0; l < p->count; l++) p->stages[l] = (int)json_integer_value(st);
  }
}

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

Artifact *artifact_load(const char *dir, RtErr *e) {
  Artifact *a = rt_calloc(1, sizeof *a);
  if (!a) {
    rt_fail(e, "out of memory");
    return NULL;
  }
  char path[4096];
  if (rt_path_join(path, sizeof path, dir, "manifest.json") < 0) {
    rt_fail(e, "%s: path too long", dir);
    rt_free(a);
    return NULL;
  }
  a->dir = rt_strdup(dir);
  a->manifest_path = rt_strdup(path);
  Rd r = {path, e, 0};
  struct stat st;
  int src = stat(dir, &st), err = src < 0 ? errno : ENOTDIR;
  if (src < 0 || !S_ISDIR(st.st_mode)) {
    rt_fail_errno(e, err, "%s: not an artifact folder (hpdlc compile FILE -o DIR makes one)", dir);
    artifact_free(a);
    return NULL;
  }
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (access(path, R_OK) < 0)
      rt_fail_errno(e, errno, "%s: missing artifact file (hpdlc compile writes it)", path);
    else
      rt_fail(e, "%s:%d:%d: not valid JSON: %s", path, je.line, je.column, je.text);
    artifact_free(a);
    return NULL;
  }
  const char *fmt = json_string_value(json_object_get(root, "format"));
  json_t *ver = json_object_get(root, "version");
  if (!fmt || strcmp(fmt, "hpdl-artifact")) bad(&r, "", "format", "must be \"hpdl-artifact\"");
  else if (!json_is_integer(ver) || json_integer_value(ver) != 1)
    bad(&r, "", "version", "must be 1 (this hpdlrun reads version 1 artifacts; recompile with the matching hpdlc)");
  get_str(&r, root, "", "model", &a->model);
  a->target = rt_strdup("cpu");
  get_str(&r, root, "", "target", &a->target);
  if (!r.bad && a->target && strcmp(a->target, "cpu") && strcmp(a->target, "cuda"))
    bad(&r, "", "target", "must be \"cpu\" or \"cuda\" for this runtime");
  a->world_size = 1;
  get_int(&r, root, "", "world_size", 1, &a->world_size);

  json_t *lay = json_object_get(root, "layout");
  a->layout = (CommLayout){1, 1, 1, 1, 1, 0};
  a->micro_batch = 1;
  a->num_micro_batches = 1;
  a->topk_ratio = 0.01;
  a->error_feedback = 1;
  a->schedule = rt_strdup("1f1b");
  if (lay) {
    get_int(&r, lay, "layout", "dp", 1, &a->layout.dp);
    get_int(&r, lay, "layout", "tp", 1, &a->layout.tp);
    get_int(&r, lay, "layout", "pp", 1, &a->layout.pp);
    get_int(&r, lay, "layout", "cp", 1, &a->layout.cp);
    get_int(&r, lay, "layout", "ep", 1, &a->layout.ep);
    if (json_object_get(lay, "ep_fold")) get_bool(&r, lay, "layout", "ep_fold", &a->layout.ep_fold);
    get_int(&r, lay, "layout", "zero", 0, &a->zero);
    get_i64(&r, lay, "layout", "micro_batch", 1, &a->micro_batch);
    get_i64(&r, lay, "layout", "num_micro_batches", 1, &a->num_micro_batches);
    get_str(&r, lay, "layout", "schedule", &a->schedule);
    char *comp = NULL;
    get_str(&r, lay, "layout", "compression", &comp);
    if (comp) {
      int k = comm_compress_parse(comp);
      if (k < 0) {
        char want[128] = "must be one of";
        for (int i = 0; sem_compression_names[i]; i++)
          snprintf(want + strlen(want), sizeof want - strlen(want), " %s", sem_compression_names[i]);
        bad(&r, "layout", "compression", want);
      } else {
        a->compression = (CommCompressKind)k;
      }
      rt_free(comp);
    }
    get_f64(&r, lay, "layout", "topk_ratio", &a->topk_ratio);
    if (!(a->topk_ratio > 0 && a->topk_ratio <= 1)) bad(&r, "layout", "topk_ratio", "must be in (0, 1]");
    get_bool(&r, lay, "layout", "error_feedback", &a->error_feedback);
  }
  /* in 64 bits, one factor at a time: four degrees of up to 2^30 overflow an int */
  int64_t layout_ranks = 1;
  const int degrees[] = {a->layout.dp, a->layout.tp, a->layout.pp, a->layout.cp};
  for (int i = 0; i < 4 && layout_ranks <= INT32_MAX; i++) layout_ranks *= degrees[i];
  if (!r.bad && layout_ranks != a->world_size) {
    char msg[160];
    if (layout_ranks > INT32_MAX) snprintf(msg, sizeof msg, "is %d, but dp x tp x pp x cp is more than 2^31", a->world_size);
    else snprintf(msg, sizeof msg, "is %d, but dp x tp x pp x cp = %" PRId64, a->world_size, layout_ranks);
    bad(&r, "", "world_size", msg);
  }

  /* the cluster the layout was planned for; only hpdlrun --sbatch / --k8s
   * read it (ranks per node), so a manifest without it means one node */
  json_t *cl = json_object_get(root, "cluster");
  a->gpus_per_node = 0;
  if (cl) {
    get_str(&r, cl, "cluster", "name", &a->cluster_name);
    get_int(&r, cl, "cluster", "gpus_per_node", 1, &a->gpus_per_node);
    get_bool(&r, cl, "cluster", "shared_device", &a->cluster_shared);
  }

  json_t *in = json_object_get(root, "inputs");
  a->seq_len = 0;
  char *in_kind = NULL;
  if (in) get_str(&r, in, "inputs", "kind", &in_kind);
  int images = in_kind && !strcmp(in_kind, "images");
  if (!r.bad && in_kind && !images && strcmp(in_kind, "tokens")) bad(&r, "inputs", "kind", "must be \"tokens\" or \"images\"");
  rt_free(in_kind);
  int64_t per_sample = 0; /* tokens of a window, or values of an image */
  if (in && images) {
    /* an image model: the image input's dimensions after the batch */
    json_t *sh = json_object_get(in, "shape");
    size_t n = json_is_array(sh) ? json_array_size(sh) : 0;
    if (!r.bad && (n < 1 || n > ART_MAX_RANK - 1))
      bad(&r, "inputs", "shape", "must be an array of 1 to 7 dimensions (an image input's after the batch)");
    per_sample = 1;
    for (size_t i = 0; i < n && !r.bad; i++) {
      json_t *d = json_array_get(sh, i);
      if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > ((int64_t)1 << 40) / per_sample)
        bad(&r, "inputs", "shape", "must hold integers >= 1 whose product is at most 2^40");
      else a->image_dims[i] = json_integer_value(d), per_sample *= a->image_dims[i];
    }
    a->image_rank = (int)n;
    get_i64(&r, in, "inputs", "classes", 1, &a->classes);
    get_str(&r, in, "inputs", "image", &a->image_input);
    get_str(&r, in, "inputs", "labels", &a->label_input);
    if (!r.bad && (json_object_get(in, "seq_len") || json_object_get(in, "vocab")))
      bad(&r, "inputs", "seq_len", "belongs to token windows, not an image model (inputs.kind \"images\")");
  } else if (in) {
    get_i64(&r, in, "inputs", "seq_len", 1, &a->seq_len);
    get_i64(&r, in, "inputs", "vocab", 1, &a->vocab);
  }
  if (!r.bad && !images && a->seq_len < 1) bad(&r, "inputs", "seq_len", "is required (the sequence length of the token windows)");
  /* tokens per step: the runtime multiplies these (sequences per step, batch buffers) */
  int64_t tokens = images ? per_sample : a->seq_len;
  const int64_t factors[] = {a->layout.dp, a->micro_batch, a->num_micro_batches};
  for (int i = 0; i < 3 && tokens >= 1 && tokens <= ART_MAX_TOKENS; i++)
    tokens = factors[i] > ART_MAX_TOKENS / tokens ? ART_MAX_TOKENS + 1 : tokens * factors[i];
  if (!r.bad && tokens > ART_MAX_TOKENS)
    bad(&r, "layout", "micro_batch", images ? "is implausibly large: dp x micro_batch x num_micro_batches x an image's values passes 2^40 a step"
                                            : "is implausibly large: dp x micro_batch x num_micro_batches x inputs.seq_len passes 2^40 tokens a step");

  json_t *tr = json_object_get(root, "train");
  optim_defaults(&a->optim);
  a->steps = 1000;
  a->seed = 1234;
  a->log_every = 10;
  a->shuffle = 1;
  a->ckpt_keep = 3;
  if (tr) {
    get_i64(&r, tr, "train", "steps", 1, &a->steps);
    get_i64(&r, tr, "train", "seed", 0, &a->seed);
    get_i64(&r, tr, "train", "log_every", 1, &a->log_every);
    get_str(&r, tr, "train", "data", &a->data);
    get_bool(&r, tr, "train", "shuffle", &a->shuffle);
    get_f64(&r, tr, "train", "clip", &a->optim.clip);
    get_str(&r, tr, "train", "precision", &a->precision);
    if (a->precision && strcmp(a->precision, "fp32") && strcmp(a->precision, "bf16") && strcmp(a->precision, "fp16"))
      bad(&r, "train", "precision", "must be fp32, bf16 or fp16");
    char *moments = NULL;
    get_str(&r, tr, "train", "moments", &moments);
    if (moments && strcmp(moments, "fp32") && strcmp(moments, "bf16")) bad(&r, "train", "moments", "must be fp32 or bf16");
    a->optim.moments16 = moments && !strcmp(moments, "bf16");
    rt_free(moments);
    get_f64(&r, tr, "train", "loss_scale", &a->loss_scale);
    /* a static scale is a power of two in [1, 2^64] or any finite value
     * there: beyond it a gradient times the scale overflows fp32 */
    if (!(a->loss_scale == 0 || (a->loss_scale >= 1 && a->loss_scale <= 18446744073709551616.0)))
      bad(&r, "train", "loss_scale", "must be 0 (dynamic) or a number in [1, 2^64]");
    json_t *op = json_object_get(tr, "optimizer");
    if (op) {
      char *kind = NULL, *decay = NULL;
      get_str(&r, op, "train.optimizer", "kind", &kind);
      if (kind) {
        int k = optim_kind_parse(kind);
        if (k < 0) bad(&r, "train.optimizer", "kind", "must be sgd or adamw");
        else a->optim.kind = (OptimKind)k;
      }
      get_f64(&r, op, "train.optimizer", "lr", &a->optim.lr);
      get_f64(&r, op, "train.optimizer", "min_lr", &a->optim.min_lr);
      get_f64(&r, op, "train.optimizer", "momentum", &a->optim.momentum);
      get_f64(&r, op, "train.optimizer", "eps", &a->optim.eps);
      get_f64(&r, op, "train.optimizer", "weight_decay", &a->optim.weight_decay);
      get_i64(&r, op, "train.optimizer", "warmup", 0, &a->optim.warmup);
      json_t *betas = json_object_get(op, "betas");
      if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 || !json_is_number(json_array_get(betas, 0)) ||
            !json_is_number(json_array_get(betas, 1)))
          bad(&r, "train.optimizer", "betas", "must be a pair of numbers in [0, 1)");
        else {
          a->optim.beta1 = json_number_value(json_array_get(betas, 0));
          a->optim.beta2 = json_number_value(json_array_get(betas, 1));
        }
      }
      get_str(&r, op, "train.optimizer", "decay", &decay);
      if (decay) {
        int d = optim_decay_parse(decay);
        if (d < 0) bad(&r, "train.optimizer", "decay", "must be none, cosine or linear");
        else a->optim.decay = (OptimDecay)d;
      }
      rt_free(kind);
      rt_free(decay);
    }
    json_t *ck = json_object_get(tr, "checkpoint");
    if (ck) {
      get_i64(&r, ck, "train.checkpoint", "every", 0, &a->ckpt_every);
      get_i64(&r, ck, "train.checkpoint", "keep", 0, &a->ckpt_keep);
      get_str(&r, ck, "train.checkpoint", "dir", &a->ckpt_dir);
      get_bool(&r, ck, "train.checkpoint", "async", &a->ckpt_async);
    }
  }
  a->optim.total_steps = a->steps;

  json_t *prog = json_object_get(root, "program");
  a->program_kind = rt_strdup("native");
  if (prog) {
    get_str(&r, prog, "program", "kind", &a->program_kind);
    get_str(&r, prog, "program", "name", &a->program_name);
  }
  int builtin = a->program_kind && !strcmp(a->program_kind, "builtin");
  if (!r.bad && !builtin && strcmp(a->program_kind, "native")) bad(&r, "program", "kind", "must be \"native\" or \"builtin\"");
  if (!r.bad && builtin && !a->program_name) bad(&r, "program", "name", "is required for a builtin program");
  if (!r.bad && builtin && a->image_rank > 0) bad(&r, "program", "kind", "builtin programs take token windows, not images (inputs.kind)");

  json_t *ranks = json_object_get(root, "ranks");
  if (!r.bad) {
    if (!json_is_array(ranks) || (int)json_array_size(ranks) != a->world_size) {
      bad(&r, "", "ranks", "must be an array with one entry per rank (world_size)");
    } else {
      a->nranks = a->world_size;
      a->ranks = rt_calloc((size_t)a->nranks, sizeof *a->ranks);
      for (int i = 0; a->ranks && i < a->nranks && !r.bad; i++) {
        char where[32];
        snprintf(where, sizeof where, "ranks[%d]", i);
        json_t *jr = json_array_get(ranks, (size_t)i);
        get_i64(&r, jr, where, "arena_bytes", 0, &a->ranks[i].arena_bytes);
        char *prog_path = NULL;
        get_str(&r, jr, where, "program", &prog_path);
        if (prog_path) {
          char full[4096];
          if (prog_path[0] == '/') snprintf(full, sizeof full, "%s", prog_path);
          else rt_path_join(full, sizeof full, dir, prog_path);
          rt_free(prog_path);
          a->ranks[i].program = rt_strdup(full);
          if (!builtin && !file_exists(full) && !r.bad) {
            rt_fail(e, "%s: missing artifact file %s (named by %s.program)", path, full, where);
            r.bad = 1;
          }
        } else if (!builtin) {
          bad(&r, where, "program", "is required for a native program");
        }
      }
      if (!a->ranks) bad(&r, "", "ranks", "out of memory");
    }
  }

  json_t *params = json_object_get(root, "params");
  if (!r.bad) {
    if (!json_is_array(params)) bad(&r, "", "params", "must be an array (the parameter table)");
    else {
      a->nparams = (int)json_array_size(params);
      a->params = rt_calloc((size_t)(a->nparams ? a->nparams : 1), sizeof *a->params);
      if (!a->params) bad(&r, "", "params", "out of memory");
      for (int i = 0; a->params && i < a->nparams && !r.bad; i++) read_param(&r, json_array_get(params, (size_t)i), i, &a->params[i], a);
      for (int i = 0; !r.bad && i < a->nparams; i++)
        for (int k = 0; k < i; k++)
          if (!strcmp(a->params[i].name, a->params[k].name)) {
            char msg[64];
            snprintf(msg, sizeof msg, "repeats params[%d].name", k);
            char where[32];
            snprintf(where, sizeof where, "params[%d]", i);
            bad(&r, where, "name", msg);
          }
    }
  }
  json_decref(root);
  if (r.bad) {
    artifact_free(a);
    return NULL;
  }
  return a;
}

void artifact_free(Artifact *a) {
  if (!a) return;
  for (int i = 0; i < a->nparams; i++) {
    rt_free(a->params[i].name);
    rt_free(a->params[i].stages);
  }
  rt_free(a->params);
  for (int i = 0; i < a->nranks; i++) rt_free(a->ranks[i].program);
  rt_free(a->ranks);
  rt_free(a->dir);
  rt_free(a->manifest_path);
  rt_free(a->model);
  rt_free(a->target);
  rt_free(a->cluster_name);
  rt_free(a->schedule);
  rt_free(a->data);
  rt_free(a->ckpt_dir);
  rt_free(a->precision);
  rt_free(a->program_kind);
  rt_free(a->program_name);
  rt_free(a->image_input);
  rt_free(a->label_input);
  rt_free(a);
}

/* ---- the files, checked before anything is loaded ---- */

int artifact_check_files(const Artifact *a, int allow_native, RtErr *e) {
  json_error_t je;
  json_t *root = json_load_file(a->manifest_path, JSON_REJECT_DUPLICATES, &je);
  if (!root) return rt_fail(e, "%s:%d:%d: not valid JSON: %s", a->manifest_path, je.line, je.column, je.text);
  int rc = 0;
  json_t *ext = json_object_get(root, "externs");
  if (!allow_native && json_is_array(ext) && json_array_size(ext) > 0) {
    json_t *x = json_array_get(ext, 0);
    const char *name = json_string_value(json_object_get(x, "name"));
    const char *file = json_string_value(json_object_get(x, "file"));
    const char *lib = json_string_value(json_object_get(x, "library"));
    rc = rt_fail(e,
                 "%s: the artifact calls native code of its own (extern %s in %s%s): hpdlrun loads an extern's library, "
                 "running its code with your rights, only with --allow-native",
                 a->dir, name ? name : "?", file ? file : lib ? lib : "?", json_array_size(ext) > 1 ? ", and others" : "");
  }
  json_t *files = json_object_get(root, "files");
  size_t i;
  json_t *f;
  if (!rc && files && !json_is_array(files)) rc = rt_fail(e, "%s: \"files\" must be an array", a->manifest_path);
  if (!rc && json_is_array(files)) json_array_foreach(files, i, f) {
      const char *rel = json_string_value(json_object_get(f, "path"));
      json_t *jb = json_object_get(f, "bytes");
      const char *want = json_string_value(json_object_get(f, "crc32c"));
      if (!rel || !*rel || rel[0] == '/' || strstr(rel, "..") || !json_is_integer(jb) || !want) {
        rc = rt_fail(e, "%s: files[%zu] needs a relative \"path\" inside the folder, \"bytes\" and \"crc32c\"", a->manifest_path, i);
        break;
      }
      char path[4096];
      if (rt_path_join(path, sizeof path, a->dir, rel) < 0) {
        rc = rt_fail(e, "%s/%s: path too long", a->dir, rel);
        break;
      }
      int64_t bytes;
      uint32_t crc;
      if (crc32c_file(path, &bytes, &crc) < 0) {
        rc = rt_fail_errno(e, errno, "%s: missing artifact file: the manifest lists it (copy the whole folder, or compile again)", path);
        break;
      }
      char got[16];
      snprintf(got, sizeof got, "%08x", crc);
      if (bytes != json_integer_value(jb)) {
        rc = rt_fail(e, "%s: %s: %" PRId64 " bytes, the manifest recorded %" PRId64 " (the file changed after hpdlc compile wrote it: "
                        "compile again)",
                     path, bytes < json_integer_value(jb) ? "truncated" : "grown", bytes, (int64_t)json_integer_value(jb));
        break;
      }
      if (strcmp(got, want)) {
        rc = rt_fail(e, "%s: corrupted: CRC-32C %s, the manifest recorded %s (the file changed after hpdlc compile wrote it, or came "
                        "from another compile: compile again)",
                     path, got, want);
        break;
      }
    }
  json_decref(root);
  return rc;
}
