/* sema_blocks.c - the train, parallel and cluster blocks: settings read against
 * their keys, command-line overrides, the optimizer and cluster specs, and the
 * parallel layout, whose degrees are checked against the devices, the model
 * (heads and sharded parameters over tensor parallelism, repeated layers over
 * pipeline stages) and the schedule. */
#include "sema_internal.h"

#include <inttypes.h>
#include <string.h>

#include "catalog.h"

/* ------------------------------------------------------------------ */
/* train, parallel and cluster blocks                                  */

static const char *const precisions[] = {"fp32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4", NULL};
static const char *const moment_types[] = {"fp32", "bf16", NULL};
static const char *const fp8_scalings[] = {"delayed", "current", NULL};
static const char *const optimizers[] = {"sgd", "adamw", NULL};
static const char *const schedules[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const recomputes[] = {"none", "selective", "full", "ops", "act", NULL};
static const char *const balances[] = {"cost", "layers", "ends", NULL};

const char *sem_balance_name(PipeBalance b) {
  return b >= BALANCE_COST && b <= BALANCE_ENDS ? balances[b] : "?";
}
static const char *const dispatchers[] = {"alltoall", "deepep", NULL};
static const char *const cp_comms[] = {"allgather", "ring", NULL};
static const char *const engines[] = {"hpdl", "deepspeed", NULL};
static const char *const loss_scales[] = {"dynamic", NULL};

static const KeySpec train_keys[] = {
    {"batch", K_INT, NULL, 0},        {"micro_batch", K_INT, NULL, 1}, {"steps", K_INT, NULL, 0},
    {"precision", K_WORD, precisions, 0}, {"loss_scale", K_WORD, loss_scales, 0}, {"moments", K_WORD, moment_types, 0},
    {"fp8_scaling", K_WORD, fp8_scalings, 0},
    {"optimizer", K_SPEC, optimizers, 0}, {"clip", K_FLOAT, NULL, 0}, {"data", K_STRING, NULL, 0},
    {"checkpoint", K_BLOCK, NULL, 0},  {"seed", K_INT, NULL, 0},      {"log_every", K_INT, NULL, 0},
};
static const KeySpec checkpoint_keys[] = {
    {"every", K_INT, NULL, 0}, {"dir", K_STRING, NULL, 0}, {"keep", K_INT, NULL, 0}, {"async", K_BOOL, NULL, 0},
};
static const KeySpec parallel_keys[] = {
    {"cluster", K_STRING, NULL, 0},     {"nodes", K_INT, NULL, 1},     {"gpus_per_node", K_INT, NULL, 0},
    {"gpus", K_INT, NULL, 0},           {"data", K_INT, NULL, 1},      {"tensor", K_INT, NULL, 1},
    {"pipeline", K_INT, NULL, 1},       {"schedule", K_WORD, schedules, 1}, {"virtual", K_INT, NULL, 1},
    {"sequence", K_ONOFF, NULL, 1},     {"context", K_INT, NULL, 1},   {"zero", K_INT, NULL, 1},
    {"recompute", K_WORD, recomputes, 1}, {"overlap", K_ONOFF, NULL, 1},
    {"compression", K_SPEC, sem_compression_names, 0}, {"balance", K_WORD, balances, 0},
    {"tp_overlap", K_ONOFF, NULL, 0},   {"vocab_pad", K_INT, NULL, 0},
    {"expert", K_INT, NULL, 1},         {"fused_ce", K_ONOFF, NULL, 1},
    {"recompute_layers", K_INT, NULL, 0}, {"expert_tensor", K_INT, NULL, 1},
    {"dispatcher", K_WORD, dispatchers, 0}, {"cp_comm", K_WORD, cp_comms, 1},
    {"engine", K_WORD, engines, 0},
};
static const KeySpec cluster_keys[] = {
    {"device", K_STRING, NULL, 0},          {"gpus_per_node", K_INT, NULL, 0},   {"nodes", K_INT, NULL, 0},
    {"nics_per_node", K_INT, NULL, 0},      {"intra_bandwidth", K_BYTES_PER_S, NULL, 0},
    {"intra_latency", K_SECONDS, NULL, 0},  {"inter_bandwidth", K_BYTES_PER_S, NULL, 0},
    {"inter_latency", K_SECONDS, NULL, 0},  {"compute_scale", K_FLOAT, NULL, 0},  {"memory_scale", K_FLOAT, NULL, 0},
    {"shared", K_BOOL, NULL, 0},
    /* the device's own figures (sem_figure_keys' order) */
    {"memory", K_BYTES, NULL, 0},           {"memory_bandwidth", K_BYTES_PER_S, NULL, 0}, {"sms", K_INT, NULL, 0},
    {"fp64", K_FLOPS, NULL, 0},             {"fp32", K_FLOPS, NULL, 0},          {"tf32", K_FLOPS, NULL, 0},
    {"bf16", K_FLOPS, NULL, 0},             {"fp16", K_FLOPS, NULL, 0},          {"fp8", K_FLOPS, NULL, 0},
    {"fp4", K_FLOPS, NULL, 0},
};

const char *const sem_figure_keys[SEM_FIG_COUNT] = {"memory", "memory_bandwidth", "sms", "fp64", "fp32",
                                                    "tf32", "bf16", "fp16", "fp8", "fp4"};

Setting *sema_setting_get(Settings *s, const char *key) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->items[i].spec->key, key)) return &s->items[i];
  return NULL;
}

static int word_index(const char *const *words, const char *w) {
  for (int i = 0; w && words[i]; i++)
    if (!strcmp(words[i], w)) return i;
  return -1;
}

static int words_count(const char *const *words) {
  int n = 0;
  while (words[n]) n++;
  return n;
}

const char *sema_words_list(Sema *S, const char *const *words) {
  char *s = NULL;
  int n = words_count(words);
  for (int i = 0; i < n; i++)
    s = s ? arena_printf(S->arena, "%s%s%s", s, i == n - 1 ? " or " : ", ", words[i]) : arena_strdup(S->arena, words[i]);
  return s ? s : "";
}

/* Checks one value against its key's kind; reports with `at`. */
static int check_setting_value(Sema *S, const KeySpec *spec, Value *v, Span at) {
  const char *w = val_as_word(v);
  if (spec->allow_auto && w && !strcmp(w, "auto")) return 1;
  switch (spec->kind) {
  case K_INT:
    if (v->kind == VAL_INT) {
      if (v->i < 0) break;
      return 1;
    }
    break;
  case K_FLOAT:
    if (v->kind == VAL_INT) {
      v->kind = VAL_FLOAT;
      v->f = (double)v->i;
    }
    if (v->kind == VAL_FLOAT && v->f >= 0) return 1;
    break;
  case K_BOOL:
  case K_ONOFF:
    if (v->kind == VAL_BOOL) return 1;
    if (spec->kind == K_ONOFF && w && (!strcmp(w, "on") || !strcmp(w, "off"))) return 1;
    break;
  case K_STRING:
    if (v->kind == VAL_STRING || v->kind == VAL_ATOM) return 1;
    break;
  case K_WORD:
  case K_SPEC: {
    const char *name = w ? w : v->kind == VAL_CALL && spec->kind == K_SPEC ? v->s : NULL;
    if (!strcmp(spec->key, "loss_scale") && (v->kind == VAL_INT || v->kind == VAL_FLOAT)) return 1;
    if (name && word_index(spec->words, name) >= 0) return 1;
    if (name) {
      sema_error(S, at, "unknown %s '%s'; it is %s", spec->key, name, sema_words_list(S, spec->words));
      const char *close = diag_closest(name, spec->words, words_count(spec->words));
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return 0;
    }
    break;
  }
  case K_BYTES_PER_S:
  case K_SECONDS:
  case K_BYTES:
  case K_FLOPS: {
    AstUnit want = spec->kind == K_SECONDS ? UNIT_SECONDS
                   : spec->kind == K_BYTES ? UNIT_BYTES
                   : spec->kind == K_FLOPS ? UNIT_FLOPS_PER_S
                                           : UNIT_BYTES_PER_S;
    double f;
    /* a peak of 0: the device lacks the precision */
    if (val_as_float(v, &f) && (f > 0 || (f == 0 && spec->kind == K_FLOPS)) && (v->unit == UNIT_NONE || v->unit == want)) {
      v->kind = VAL_FLOAT;
      v->f = f;
      return 1;
    }
    if (val_as_float(v, &f) && v->unit != UNIT_NONE && v->unit != want) {
      static const char *const what[] = {"a time (ns, us, ms, s)", "a size (GB, GiB, TB)", "a rate (TFLOP/s, PFLOP/s)",
                                         "a bandwidth (GB/s, Gb/s, Gbps)"};
      sema_error(S, at, "'%s' is %s; this literal has another unit", spec->key,
                 what[want == UNIT_SECONDS ? 0 : want == UNIT_BYTES ? 1 : want == UNIT_FLOPS_PER_S ? 2 : 3]);
      return 0;
    }
    break;
  }
  case K_BLOCK:
    sema_error(S, at, "'%s' is a block: %s { ... }", spec->key, spec->key);
    return 0;
  }
  static const char *const kind_text[] = {"a non-negative integer", "a non-negative number", "true or false", "a string", "a name",
                                          "a name", "a block", "a bandwidth such as 200GB/s", "a time such as 5us", "on or off",
                                          "a size such as 96GiB", "a rate such as 989TFLOP/s (0: none)"};
  const char *kind = kind_text[spec->kind];
  if (spec->allow_auto && spec->kind == K_ONOFF) kind = "on, off";
  sema_error(S, at, "'%s' must be %s%s, not %s", spec->key, kind, spec->allow_auto ? " or auto" : "",
             val_str(S->arena, v));
  if (spec->kind == K_WORD || spec->kind == K_SPEC) diag_hint(S->diag, "choose %s", sema_words_list(S, spec->words));
  return 0;
}

void sema_read_settings(Sema *S, const AstSettings *src, const KeySpec *keys, int nkeys, Settings *out, const char *block) {
  out->n = 0;
  const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(nkeys + 1));
  for (int k = 0; k < nkeys; k++) names[k] = keys[k].key;
  for (int i = 0; i < src->n; i++) {
    const AstSetting *st = src->items[i];
    const KeySpec *spec = NULL;
    for (int k = 0; k < nkeys; k++)
      if (!strcmp(keys[k].key, st->key.name)) spec = &keys[k];
    if (!spec) {
      sema_error(S, st->key.span, "unknown setting '%s' in %s", st->key.name, block);
      const char *close = diag_closest(st->key.name, names, nkeys);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      else diag_hint(S->diag, "%s settings are %s", block, sema_words_list(S, names));
      continue;
    }
    Setting *prev = sema_setting_get(out, spec->key);
    if (prev) {
      sema_error(S, st->key.span, "'%s' is set twice", spec->key);
      diag_note(S->diag, prev->span, "first set here");
      continue;
    }
    if ((spec->kind == K_BLOCK) != st->is_block) {
      sema_error(S, st->span, spec->kind == K_BLOCK ? "'%s' is a block: %s { ... }" : "'%s' takes a value: %s = ...", spec->key,
                 spec->key);
      continue;
    }
    if (out->n == NKEYS(out->items)) break;
    Setting *s = &out->items[out->n];
    memset(s, 0, sizeof *s);
    s->spec = spec;
    s->span = st->span;
    s->setting = st;
    if (!st->is_block) {
      s->value = sema_eval_const(S, NULL, st->value);
      if (s->value.kind == VAL_NONE || !check_setting_value(S, spec, &s->value, st->value->span)) continue;
    }
    out->n++;
  }
}

/* --dp 4 and friends replace what the file says. */
static void apply_cli(Sema *S, Settings *out, const char *block, const KeySpec *keys, int nkeys) {
  size_t blen = strlen(block);
  for (int i = 0; i < S->opts->nlayout; i++) {
    const SemDefine *d = &S->opts->layout[i];
    if (strncmp(d->name, block, blen) != 0 || d->name[blen] != '.') continue;
    const char *key = d->name + blen + 1;
    const KeySpec *spec = NULL;
    for (int k = 0; k < nkeys; k++)
      if (!strcmp(keys[k].key, key)) spec = &keys[k];
    if (!spec) continue;
    Value v = val_parse_literal(S->arena, d->value);
    v.span = span_none;
    if (spec->kind == K_ONOFF && v.kind == VAL_ATOM && (!strcmp(v.s, "true") || !strcmp(v.s, "false"))) {
      v.kind = VAL_BOOL;
      v.b = v.s[0] == 't';
    }
    S->cli_prefix = d->flag ? arena_printf(S->arena, "%s %s", d->flag, d->value) : NULL;
    int ok = check_setting_value(S, spec, &v, span_none);
    S->cli_prefix = NULL;
    if (!ok) {
      if (S->opts->cli_error) *S->opts->cli_error = 1;
      continue;
    }
    Setting *s = sema_setting_get(out, key);
    if (!s) {
      if (out->n == NKEYS(out->items)) continue;
      s = &out->items[out->n++];
    }
    memset(s, 0, sizeof *s);
    s->spec = spec;
    s->value = v;
    s->span = span_none;
    s->from_cli = 1;
  }
}

static int64_t get_int(Settings *s, const char *key, int64_t dflt) {
  Setting *x = sema_setting_get(s, key);
  if (!x) return dflt;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  return x->value.kind == VAL_INT ? x->value.i : dflt;
}

static double get_float(Settings *s, const char *key, double dflt) {
  Setting *x = sema_setting_get(s, key);
  double f;
  return x && val_as_float(&x->value, &f) ? f : dflt;
}

static int get_word(Settings *s, const char *key, const char *const *words, int dflt) {
  Setting *x = sema_setting_get(s, key);
  if (!x) return dflt;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  if (!w && x->value.kind == VAL_CALL) w = x->value.s;
  int i = word_index(words, w);
  return i >= 0 ? i : dflt;
}

static int get_onoff(Settings *s, const char *key, int dflt) {
  Setting *x = sema_setting_get(s, key);
  if (!x) return dflt;
  if (x->value.kind == VAL_BOOL) return x->value.b;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  return w && !strcmp(w, "on");
}

/* Reads the keyword or positional arguments of a spec such as adamw(...). */
static int spec_float(Sema *S, const Value *spec, const char *key, int pos, double dflt, double *out) {
  int p = 0;
  for (int i = 0; i < spec->n; i++) {
    int hit = spec->keys[i] ? !strcmp(spec->keys[i], key) : p++ == pos;
    if (!hit) continue;
    if (!val_as_float(&spec->items[i], out)) {
      sema_error(S, spec->items[i].span, "%s's '%s' must be a number, not %s", spec->s, key, val_str(S->arena, &spec->items[i]));
      return 0;
    }
    return 1;
  }
  *out = dflt;
  return 1;
}

static int spec_check_keys(Sema *S, const Value *spec, const char *const *keys, int npos_max) {
  int npos = 0;
  for (int i = 0; i < spec->n; i++) {
    if (!spec->keys[i]) {
      if (++npos > npos_max) {
        sema_error(S, spec->items[i].span, "%s takes at most %d positional argument%s", spec->s, npos_max, npos_max == 1 ? "" : "s");
        return 0;
      }
      continue;
    }
    if (word_index(keys, spec->keys[i]) < 0) {
      sema_error(S, spec->items[i].span, "%s has no argument '%s'", spec->s, spec->keys[i]);
      const char *close = diag_closest(spec->keys[i], keys, words_count(keys));
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      else diag_hint(S->diag, "its arguments are %s", sema_words_list(S, keys));
      return 0;
    }
  }
  return 1;
}

static void read_optimizer(Sema *S, Setting *opt, SemTrain *t) {
  t->optimizer = OPT_ADAMW;
  t->lr = 3e-4;
  t->beta1 = 0.9;
  t->beta2 = 0.999;
  t->eps = 1e-8;
  if (!opt) return;
  const Value *v = &opt->value;
  const char *name = v->kind == VAL_CALL ? v->s : val_as_word(v);
  t->optimizer = !strcmp(name, "sgd") ? OPT_SGD : OPT_ADAMW;
  if (v->kind != VAL_CALL) return;
  if (t->optimizer == OPT_SGD) {
    static const char *const keys[] = {"lr", "momentum", "weight_decay", "warmup", "decay", "min_lr", NULL};
    if (!spec_check_keys(S, v, keys, 1)) return;
  } else {
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay", "warmup", "decay", "min_lr", NULL};
    if (!spec_check_keys(S, v, keys, 1)) return;
  }
  double warmup = 0;
  spec_float(S, v, "lr", 0, t->lr, &t->lr);
  spec_float(S, v, "momentum", -1, 0, &t->momentum);
  spec_float(S, v, "eps", -1, t->eps, &t->eps);
  spec_float(S, v, "weight_decay", -1, 0, &t->weight_decay);
  spec_float(S, v, "min_lr", -1, 0, &t->min_lr);
  spec_float(S, v, "warmup", -1, 0, &warmup);
  t->warmup = (int64_t)warmup;
  if (!(t->lr > 0)) sema_error(S, v->span, "the learning rate must be positive");
  for (int i = 0; i < v->n; i++) {
    if (!v->keys[i]) continue;
    const Value *a = &v->items[i];
    if (!strcmp(v->keys[i], "betas")) {
      double b1, b2;
      if (a->kind != VAL_TUPLE || a->n != 2 || !val_as_float(&a->items[0], &b1) || !val_as_float(&a->items[1], &b2) ||
          b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
        sema_error(S, a->span, "betas is a pair of numbers in [0, 1): betas = (0.9, 0.95)");
        continue;
      }
      t->beta1 = b1;
      t->beta2 = b2;
    } else if (!strcmp(v->keys[i], "decay")) {
      static const char *const decays[] = {"none", "cosine", "linear", NULL};
      int d = word_index(decays, val_as_word(a));
      if (d < 0) {
        sema_error(S, a->span, "decay is none, cosine or linear, not %s", val_str(S->arena, a));
        continue;
      }
      t->decay = (DecayKind)d;
    }
  }
}

void sema_read_train(Sema *S, SemModel *m, const AstDecl *decl, Settings *out) {
  Settings s;
  sema_read_settings(S, decl ? &decl->settings : &(AstSettings){0, 0}, train_keys, NKEYS(train_keys), &s, "train");
  apply_cli(S, &s, "train", train_keys, NKEYS(train_keys));
  SemTrain *t = &m->train;
  t->micro_batch = get_int(&s, "micro_batch", 1);
  t->global_batch = get_int(&s, "batch", 0); /* 0: one micro-batch per data rank, set by the layout */
  t->steps = get_int(&s, "steps", 1000);
  t->seed = get_int(&s, "seed", 1234);
  t->log_every = get_int(&s, "log_every", 10);
  t->precision = (Precision)get_word(&s, "precision", precisions, PREC_FP32);
  t->clip = get_float(&s, "clip", 0);
  Setting *ls = sema_setting_get(&s, "loss_scale");
  t->loss_scale = ls && ls->value.kind != VAL_ATOM && ls->value.kind != VAL_STRING ? get_float(&s, "loss_scale", 0) : 0;
  Setting *data = sema_setting_get(&s, "data");
  t->data = data ? val_as_word(&data->value) : NULL;
  read_optimizer(S, sema_setting_get(&s, "optimizer"), t);
  t->moments_bf16 = get_word(&s, "moments", moment_types, 0) == 1;
  t->fp8_current = get_word(&s, "fp8_scaling", fp8_scalings, 0) == 1;
  Setting *ck = sema_setting_get(&s, "checkpoint");
  t->ckpt_every = 0;
  t->ckpt_keep = 3;
  if (ck && ck->setting) {
    Settings c;
    sema_read_settings(S, &ck->setting->nested, checkpoint_keys, NKEYS(checkpoint_keys), &c, "checkpoint");
    t->ckpt_every = get_int(&c, "every", 0);
    t->ckpt_keep = get_int(&c, "keep", 3);
    Setting *dir = sema_setting_get(&c, "dir");
    t->ckpt_dir = dir ? val_as_word(&dir->value) : "checkpoints";
    Setting *as = sema_setting_get(&c, "async");
    t->ckpt_async = as && as->value.kind == VAL_BOOL && as->value.b;
  }
  Setting *bad = NULL;
  if (t->global_batch == 0 && sema_setting_get(&s, "batch")) bad = sema_setting_get(&s, "batch");
  else if (t->micro_batch == 0) bad = sema_setting_get(&s, "micro_batch");
  else if (t->steps == 0) bad = sema_setting_get(&s, "steps");
  if (bad) {
    sema_error(S, bad->span, "'%s' must be at least 1", bad->spec->key);
    if (bad->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
  }
  *out = s;
}

static const char *normalize_name(Sema *S, const char *name) {
  char *s = arena_strdup(S->arena, name);
  for (char *p = s; *p; p++)
    if (*p == '-') *p = '_';
  return s;
}

/* An error at a setting whose value no real machine has. */
static void implausible(Sema *S, Settings *s, const char *key, const char *unit, const char *why) {
  Setting *x = sema_setting_get(s, key);
  sema_error(S, x && x->setting ? x->setting->value->span : span_none, "'%s' = %s%s is implausible: %s", key,
             x ? val_str(S->arena, &x->value) : "?", unit, why);
}

int sema_read_cluster_decl(Sema *S, const AstDecl *decl, SemCluster *c) {
  Settings s;
  int before = diag_error_count(S->diag);
  sema_read_settings(S, &decl->settings, cluster_keys, NKEYS(cluster_keys), &s, "cluster");
  c->name = decl->name.name;
  Setting *dev = sema_setting_get(&s, "device");
  if (!dev) {
    sema_error(S, decl->name.span, "cluster %s names no device", decl->name.name);
    diag_hint(S->diag, "add device = a100_80gb (or another device of docs/catalog.md)");
    return 0;
  }
  const char *dn = val_as_word(&dev->value);
  const CatDevice *d = cat_device(dn);
  if (!d) {
    sema_error(S, dev->setting->value->span, "unknown device '%s'", dn);
    const char *close = cat_closest_device(dn);
    if (close) diag_hint(S->diag, "did you mean %s?", normalize_name(S, close));
    else diag_hint(S->diag, "the devices are listed in docs/catalog.md");
    return 0;
  }
  c->device = d->name;
  c->gpus_per_node = get_int(&s, "gpus_per_node", 1);
  c->nodes = get_int(&s, "nodes", 1);
  c->nics_per_node = get_int(&s, "nics_per_node", 1);
  c->intra_bytes_per_s = get_float(&s, "intra_bandwidth", d->link_bytes_per_s);
  c->intra_latency_s = get_float(&s, "intra_latency", d->link_latency_s);
  c->inter_bytes_per_s = get_float(&s, "inter_bandwidth", 12.5e9);
  c->inter_latency_s = get_float(&s, "inter_latency", 5e-6);
  /* a calibrated device (hpdlc plan --calibrate): its catalog figures scaled */
  c->compute_scale = get_float(&s, "compute_scale", 1);
  c->memory_scale = get_float(&s, "memory_scale", 1);
  Setting *sh = sema_setting_get(&s, "shared");
  c->shared_device = sh && sh->value.kind == VAL_BOOL && sh->value.b;
  if (c->gpus_per_node < 1 || c->nodes < 1) {
    sema_error(S, decl->span, "a cluster has at least one node and one device per node");
    return 0;
  }
  /* Figures beyond any machine: counts that would overflow when the layout
   * multiplies them, times the planner would print as inf or 1e300 s. */
  if (c->gpus_per_node > SEM_MAX_GPUS_PER_NODE)
    implausible(S, &s, "gpus_per_node", "", "a node holds at most 4096 devices");
  if (c->nodes > SEM_MAX_NODES) implausible(S, &s, "nodes", "", "a cluster has at most 2^20 nodes");
  if (c->nics_per_node > SEM_MAX_GPUS_PER_NODE) implausible(S, &s, "nics_per_node", "", "a node holds at most 4096 network adapters");
  static const char *const bandwidths[] = {"intra_bandwidth", "inter_bandwidth"}, *const latencies[] = {"intra_latency", "inter_latency"};
  for (int k = 0; k < 2; k++) {
    double bw = get_float(&s, bandwidths[k], 1), lat = get_float(&s, latencies[k], 0);
    if (!(bw >= 1 && bw <= 1e18)) implausible(S, &s, bandwidths[k], " B/s", "a bandwidth is between 1 B/s and 1 EB/s (1e18 B/s)");
    if (!(lat <= 3600)) implausible(S, &s, latencies[k], " s", "a latency is at most an hour");
  }
  static const char *const scales[] = {"compute_scale", "memory_scale"};
  for (int k = 0; k < 2; k++) {
    double v = get_float(&s, scales[k], 1);
    if (!(v >= 1e-6 && v <= 1e6)) implausible(S, &s, scales[k], "", "a scale of the device's figures is between 1e-6 and 1e6");
  }
  /* the device's own figures: a GPU the catalog lacks, as the device it is most like */
  c->described = 0;
  for (int k = 0; k < SEM_FIG_COUNT; k++) {
    Setting *x = sema_setting_get(&s, sem_figure_keys[k]);
    if (!x) continue;
    double v = k == SEM_FIG_SMS ? (double)get_int(&s, sem_figure_keys[k], 0) : get_float(&s, sem_figure_keys[k], 0);
    c->figures[k] = v;
    c->described |= 1u << k;
    if (k == SEM_FIG_MEMORY && !(v >= 1048576.0 && v <= 1125899906842624.0))
      implausible(S, &s, "memory", " B", "a device's memory is between 1 MiB and 1 PiB");
    else if (k == SEM_FIG_MEMORY_BANDWIDTH && !(v >= 1e6 && v <= 1e15))
      implausible(S, &s, "memory_bandwidth", " B/s", "a device's memory bandwidth is between 1 MB/s and 1 PB/s");
    else if (k == SEM_FIG_SMS && !(v >= 1 && v <= 100000))
      implausible(S, &s, "sms", "", "a device has between 1 and 100000 streaming multiprocessors (compute units)");
    else if (k >= SEM_FIG_FP64 && !(v == 0 || (v >= 1e6 && v <= 1e18)))
      implausible(S, &s, sem_figure_keys[k], " FLOP/s", "a peak is 0 (no such precision) or between 1 MFLOP/s and 1 EFLOP/s");
  }
  if (c->described && c->shared_device) {
    sema_error(S, decl->span, "cluster %s gives its device's figures and shared = true", decl->name.name);
    diag_hint(S->diag, "a shared device is this machine's CPU, measured by hpdlc plan --measure-cpu; describe a GPU without shared");
  }
  return diag_error_count(S->diag) == before;
}

static int resolve_cluster(Sema *S, const char *name, Span at, SemCluster *out) {
  const AstDecl *d = sema_find_decl(S, name, 1 << DECL_CLUSTER);
  if (!d) d = sema_find_decl(S, normalize_name(S, name), 1 << DECL_CLUSTER);
  if (d) return sema_read_cluster_decl(S, d, out);
  const CatCluster *c = cat_cluster(name);
  if (!c) {
    sema_error(S, at, "unknown cluster '%s'", name);
    const CatDevice *dev = cat_device(name);
    const char *close = cat_closest_cluster(name);
    if (dev) {
      /* a device named where a cluster goes: the built-in clusters of it */
      const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(cat_cluster_count() + 1));
      int n = 0;
      for (int i = 0; i < cat_cluster_count(); i++) {
        const CatCluster *k = cat_cluster_at(i);
        if (k && !strcmp(k->device, dev->name)) names[n++] = k->name;
      }
      names[n] = NULL;
      if (n)
        diag_hint(S->diag, "'%s' is a device; the built-in cluster%s of it: %s (or declare `cluster name { device = \"%s\" ... }`)",
                  dev->name, n > 1 ? "s" : "", sema_words_list(S, names), dev->name);
      else
        diag_hint(S->diag, "'%s' is a device and no built-in cluster has it: declare `cluster name { device = \"%s\" ... }`",
                  dev->name, dev->name);
    } else if (close)
      diag_hint(S->diag, "did you mean '%s'?", close);
    else diag_hint(S->diag, "built-in clusters are listed in docs/catalog.md; a file can declare its own with `cluster name { ... }`");
    if (at.file < 0 && S->opts->cli_error) *S->opts->cli_error = 1;
    return 0;
  }
  out->name = c->name;
  out->device = c->device;
  out->gpus_per_node = c->gpus_per_node;
  out->nodes = 1;
  out->nics_per_node = c->nics_per_node;
  out->intra_bytes_per_s = c->intra_bytes_per_s;
  out->intra_latency_s = c->intra_latency_s;
  out->inter_bytes_per_s = c->nic_bytes_per_s;
  out->inter_latency_s = c->inter_latency_s;
  out->shared_device = c->shared_device;
  out->compute_scale = out->memory_scale = 1;
  out->described = 0;
  return 1;
}

/* ------------------------------------------------------------------ */
/* the parallel layout                                                 */

/* Where a layout number came from, for the other end of a mismatch. */
static void setting_note(Sema *S, Settings *s, const char *key, const char *flag);

/* "WHAT cannot be split equally into pipeline x virtual = P x V stages", the
 * hint, and where balance, pipeline and virtual were set. */
static void unequal_split_error(Sema *S, Settings *s, Span at, const SemLayout *L, const char *what, const char *hint) {
  sema_error(S, at, "%s cannot be split equally into pipeline x virtual = %" PRId64 " x %" PRId64 " stages", what,
             L->pp > 0 ? L->pp : 1, L->virtual_stages > 0 ? L->virtual_stages : 1);
  diag_hint(S->diag, "%s", hint);
  setting_note(S, s, "balance", "--balance");
  setting_note(S, s, "pipeline", "--pp");
  if (L->virtual_stages > 1) setting_note(S, s, "virtual", "--virtual-stages");
}

static void setting_note(Sema *S, Settings *s, const char *key, const char *flag) {
  Setting *x = sema_setting_get(s, key);
  if (x && x->from_cli) diag_note(S->diag, span_none, "%s = %s comes from the command line (%s)", key, val_str(S->arena, &x->value), flag);
  else if (x) diag_note(S->diag, x->span, "%s set here", key);
}

static Span at_or_none(const Setting *x) { return x ? x->span : span_none; }

static void check_divisible(Sema *S, int64_t value, int64_t by, Span at, const char *what, const char *by_what,
                            const char *why, Settings *s, const char *key, const char *flag) {
  if (by <= 1 || value % by == 0) return;
  sema_error(S, at, "%s (%" PRId64 ") is not divisible by %s = %" PRId64, what, value, by_what, by);
  if (why) diag_hint(S->diag, "%s", why);
  setting_note(S, s, key, flag);
}

static void find_layers(const SemLayer *l, int64_t *layers, const SemChild **where, int64_t *repeats) {
  for (int i = 0; i < l->nchildren; i++) {
    if (l->children[i].repeat > *layers && !l->children[i].copies) {
      *layers = l->children[i].repeat;
      *where = &l->children[i];
    }
    if (l->children[i].copies) /* an indexed repeat: its copies, one by one */
      for (int64_t k = 0; k < l->children[i].repeat; k++) find_layers(l->children[i].copies[k], layers, where, repeats);
    else if (l->children[i].repeat > 1) ++*repeats;
    else find_layers(l->children[i].layer, layers, where, repeats);
  }
}

void sema_read_layout(Sema *S, SemModel *m, const AstDecl *decl, Settings *ts) {
  Settings s;
  sema_read_settings(S, decl ? &decl->settings : &(AstSettings){0, 0}, parallel_keys, NKEYS(parallel_keys), &s, "parallel");
  apply_cli(S, &s, "parallel", parallel_keys, NKEYS(parallel_keys));
  SemLayout *L = &m->layout;
  Setting *cl = sema_setting_get(&s, "cluster");
  const char *cluster_name = cl ? val_as_word(&cl->value) : "cpu";
  if (resolve_cluster(S, cluster_name, cl ? (cl->from_cli ? span_none : cl->setting->value->span) : span_none, &m->cluster))
    m->has_cluster = 1;
  L->cluster_name = m->has_cluster ? m->cluster.name : cluster_name;
  L->gpus_per_node = get_int(&s, "gpus_per_node", m->has_cluster ? m->cluster.gpus_per_node : 1);
  L->nodes = get_int(&s, "nodes", m->has_cluster ? m->cluster.nodes : 1);
  /* bounded before they multiply (a cluster's own figures are, when read) */
  const int64_t limits[] = {SEM_MAX_NODES, SEM_MAX_GPUS_PER_NODE, (int64_t)SEM_MAX_NODES * SEM_MAX_GPUS_PER_NODE};
  const int64_t values[] = {L->nodes, L->gpus_per_node, get_int(&s, "gpus", 0)};
  static const char *const counted[] = {"nodes", "gpus_per_node", "gpus"};
  static const char *const limit_text[] = {"a layout spans at most 2^20 nodes", "a node holds at most 4096 devices",
                                           "a layout has at most 2^32 devices"};
  for (int k = 0; k < 3; k++)
    if (values[k] > limits[k]) {
      Setting *x = sema_setting_get(&s, counted[k]);
      sema_error(S, x && !x->from_cli ? x->setting->value->span : span_none, "'%s' = %" PRId64 " is implausible: %s", counted[k],
                 values[k], limit_text[k]);
      if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
  L->gpus = get_int(&s, "gpus", L->nodes > 0 ? L->nodes * L->gpus_per_node : -1);
  if (sema_setting_get(&s, "gpus") && !sema_setting_get(&s, "nodes") && L->gpus > 0 && L->gpus_per_node > 0)
    L->nodes = (L->gpus + L->gpus_per_node - 1) / L->gpus_per_node;
  /* (CPU ranks time-share one machine: their "nodes" are a rank count) */
  if (m->has_cluster && !m->cluster.shared_device && m->cluster.nics_per_node == 0 && L->nodes > 1) {
    Setting *x = sema_setting_get(&s, sema_setting_get(&s, "nodes") ? "nodes" : "gpus");
    sema_error(S, x && !x->from_cli ? x->setting->value->span : span_none,
               "cluster %s has no network adapters (nics_per_node = 0): it cannot span %" PRId64 " nodes", L->cluster_name, L->nodes);
    if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
    return;
  }
  /* Degrees beyond any machine are refused before they multiply (four
   * degrees of 2^20 overflow 64 bits): each, and their product, at most 2^32. */
  {
    static const char *const keys[] = {"data", "tensor", "pipeline", "context", "virtual"};
    double prod = 1;
    for (int k = 0; k < 5; k++) {
      Setting *x = sema_setting_get(&s, keys[k]);
      int64_t v = get_int(&s, keys[k], 1);
      if (v > ((int64_t)1 << 32)) {
        sema_error(S, x ? x->span : (decl ? decl->span : span_none), "'%s' = %" PRId64 " is more than any machine has (at most 2^32)", keys[k], v);
        if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
        return;
      }
      if (k < 4) prod *= (double)(v > 0 ? v : 1);
    }
    if (prod > 4294967296.0) {
      sema_error(S, decl ? decl->span : span_none,
                 "data x tensor x pipeline x context = %.4g devices, more than any machine has (at most 2^32)", prod);
      return;
    }
  }
  /* On a shared machine (CPU ranks) the layout decides the rank count. */
  if (m->has_cluster && m->cluster.shared_device && !sema_setting_get(&s, "gpus") && !sema_setting_get(&s, "nodes") &&
      !sema_setting_get(&s, "gpus_per_node")) {
    int64_t prod = 1;
    const char *keys[] = {"data", "tensor", "pipeline", "context"};
    for (int k = 0; k < 4; k++) {
      int64_t v = get_int(&s, keys[k], 1);
      prod *= v > 0 ? v : 1;
    }
    L->gpus = L->gpus_per_node = prod;
  }
  L->tp = get_int(&s, "tensor", 1);
  L->pp = get_int(&s, "pipeline", 1);
  L->cp = get_int(&s, "context", 1);
  L->ep = get_int(&s, "expert", 0); /* 0: not written (1 to the compiler, the planner's choice in --search) */
  L->dp = get_int(&s, "data", -2); /* -2: not written, derive it */
  L->virtual_stages = get_int(&s, "virtual", 1);
  L->zero = get_int(&s, "zero", 0);
  L->sp = get_onoff(&s, "sequence", 0);
  L->overlap = get_onoff(&s, "overlap", 1);
  L->tp_overlap = get_onoff(&s, "tp_overlap", 0);
  L->fused_ce = get_onoff(&s, "fused_ce", 0);
  L->vocab_pad = get_int(&s, "vocab_pad", 128);
  L->schedule = get_word(&s, "schedule", schedules, L->virtual_stages > 1 ? SCHED_INTERLEAVED : SCHED_1F1B);
  L->recompute = get_word(&s, "recompute", recomputes, RECOMPUTE_NONE);
  L->recompute_layers = get_int(&s, "recompute_layers", 0); /* 0: every layer */
  L->expert_tensor = get_int(&s, "expert_tensor", 0);          /* 0: = tensor; -1: auto (plan --search tries both) */
  L->balance = (PipeBalance)get_word(&s, "balance", balances, BALANCE_COST);
  L->dispatcher = get_word(&s, "dispatcher", dispatchers, 0);
  L->cp_comm = get_word(&s, "cp_comm", cp_comms, 0);
  L->engine = get_word(&s, "engine", engines, 0);
  Setting *comp = sema_setting_get(&s, "compression");
  L->compression = (Compression)get_word(&s, "compression", sem_compression_names, COMPRESS_NONE);
  L->topk_ratio = 0.01;
  if (comp && comp->value.kind == VAL_CALL && L->compression == COMPRESS_TOPK) {
    static const char *const keys[] = {"ratio", NULL};
    if (spec_check_keys(S, &comp->value, keys, 1)) spec_float(S, &comp->value, "ratio", 0, 0.01, &L->topk_ratio);
    if (!(L->topk_ratio > 0 && L->topk_ratio <= 1)) sema_error(S, comp->span, "topk's ratio must be in (0, 1]");
  }
  for (int i = 0; i < s.n; i++) {
    Setting *x = &s.items[i];
    if (x->value.kind == VAL_INT && x->value.i == 0 && x->spec->kind == K_INT && strcmp(x->spec->key, "zero") != 0 &&
        strcmp(x->spec->key, "vocab_pad") != 0) {
      sema_error(S, x->span, "'%s' must be at least 1", x->spec->key);
      if (x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
  }
  if (L->zero > 3) {
    Setting *z = sema_setting_get(&s, "zero");
    sema_error(S, z->span, "ZeRO stage %" PRId64 " does not exist; stages are 0, 1, 2 and 3", L->zero);
    if (z->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
    return;
  }
  if (L->dp == -1 && L->gpus > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 && L->gpus % (L->tp * L->pp * L->cp) == 0)
    L->dp = L->gpus / (L->tp * L->pp * L->cp); /* data = auto: whatever the other degrees leave */
  if (L->dp == -2) {
    int64_t model_par = (L->tp > 0 ? L->tp : 1) * (L->pp > 0 ? L->pp : 1) * (L->cp > 0 ? L->cp : 1);
    L->dp = L->gpus > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 ? L->gpus / model_par : -1;
    if (L->dp == 0) {
      sema_error(S, decl ? decl->span : span_none,
                 "tensor x pipeline x context = %" PRId64 " needs more than the %" PRId64 " devices of the layout", model_par, L->gpus);
      return;
    }
  }
  /* The product of the degrees must use every device. */
  if (L->dp > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 && L->gpus > 0) {
    int64_t prod = L->dp * L->tp * L->pp * L->cp;
    if (prod != L->gpus) {
      static const char *const keys[] = {"data", "tensor", "pipeline", "context"};
      static const char *const flags[] = {"--dp", "--tp", "--pp", "--cp"};
      Span at = decl ? decl->span : span_none;
      for (int k = 3; k >= 0; k--) {
        Setting *x = sema_setting_get(&s, keys[k]);
        if (x && !x->from_cli) at = x->span;
      }
      sema_error(S, at,
                 "data x tensor x pipeline x context = %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64 " = %" PRId64
                 " devices, but the layout has %" PRId64,
                 L->dp, L->tp, L->pp, L->cp, prod, L->gpus);
      diag_hint(S->diag, "leave data out (or write data = auto) to use every device");
      for (int k = 0; k < 4; k++) setting_note(S, &s, keys[k], flags[k]);
      if (sema_setting_get(&s, "gpus")) setting_note(S, &s, "gpus", "--gpus");
      else
        diag_note(S->diag, span_none, "%" PRId64 " node%s x %" PRId64 " device%s per node on %s", L->nodes, L->nodes == 1 ? "" : "s",
                  L->gpus_per_node, L->gpus_per_node == 1 ? "" : "s", L->cluster_name);
    }
  }
  /* heads and kv_heads by tensor */
  if (L->tp > 1) {
    for (int i = 0; i < S->head_splits.len; i++) {
      HeadSplit *h = S->head_splits.items[i];
      int seen = 0;
      for (int k = 0; k < i; k++) seen |= ((HeadSplit *)S->head_splits.items[k])->heads == h->heads;
      if (seen || h->heads % L->tp == 0) continue;
      sema_error(S, h->span, "split_heads(..., %s): %" PRId64 " heads cannot be split over tensor parallelism %" PRId64, h->what,
                 h->heads, L->tp);
      diag_hint(S->diag, "tensor parallelism gives each rank whole heads; choose a tensor degree that divides %" PRId64, h->heads);
      setting_note(S, &s, "tensor", "--tp");
      for (int k = 0; k < h->nframes; k++)
        diag_note(S->diag, h->frames[k].call_site, "in %s, %s here", h->frames[k].display,
                  h->frames[k].is_call ? "called" : "instantiated");
    }
    /* One error per layer instance, in the order they were created. */
    PtrVec order = {0, 0, 0};
    for (SemLayer *l = S->instances; l; l = l->next_instance) ptrvec_push(S->arena, &order, l);
    for (int k = order.len - 1; k >= 0; k--) {
      SemLayer *l = order.items[k];
      for (int i = 0; i < l->nparams; i++) {
        SemParam *p = &l->params[i];
        if (p->shard == SHARD_REPLICATED || p->type.rank == 0) continue;
        int expert = p->shard == SHARD_EXPERT_COLUMN || p->shard == SHARD_EXPERT_ROW;
        if (expert && L->ep > 1) continue; /* split over the experts instead */
        int axis = p->shard == SHARD_COLUMN || p->shard == SHARD_EXPERT_COLUMN ? p->type.rank - 1
                   : (p->shard == SHARD_ROW || p->shard == SHARD_EXPERT_ROW) && p->type.rank >= 2 ? p->type.rank - 2
                                                                                                     : 0;
        int64_t d = 0;
        sym_is_const(p->type.dims[axis], &d);
        if (d % L->tp == 0) continue;
        /* a vocab-split table is padded to a multiple of vocab_pad x tensor
         * (Megatron-LM's make-vocab-size-divisible-by) when vocab_pad > 0 */
        if (p->shard == SHARD_VOCAB && L->vocab_pad > 0) continue;
        LayerBox *box = (LayerBox *)l;
        sema_error(S, box->site.file >= 0 ? box->site : p->span,
                   "%s is split by %s over tensor parallelism %" PRId64 ", but its '%s' has %" PRId64 " %s, not a multiple of %" PRId64,
                   l->display, sem_shard_name(p->shard), L->tp, p->name, d,
                   p->shard == SHARD_VOCAB                                  ? "rows (the vocabulary)"
                   : p->shard == SHARD_ROW || p->shard == SHARD_EXPERT_ROW ? "rows"
                                                                           : "columns",
                   L->tp);
        if (p->shard == SHARD_VOCAB) {
          int64_t pad = ((d + 128 * L->tp - 1) / (128 * L->tp)) * 128 * L->tp;
          diag_hint(S->diag, "let hpdl pad it to a multiple of 128 x tensor, %" PRId64 " rows (`vocab_pad = 128` in the parallel "
                    "block, the default, or --vocab-pad 128; the padded logits are masked), as Megatron-LM does",
                    pad);
        }
        diag_note(S->diag, p->span, "'%s' declared here", p->name);
        setting_note(S, &s, "tensor", "--tp");
        for (int f = 1; f < box->nchain; f++)
          diag_note(S->diag, box->chain[f].call_site, "in %s, %s here", box->chain[f].display,
                    box->chain[f].is_call ? "called" : "instantiated");
        break;
      }
    }
  }
  /* expert parallelism: ep members of each data-parallel group, each holding
   * experts / ep of every layer's experts */
  if (L->expert_tensor > 0) {
    Setting *et = sema_setting_get(&s, "expert_tensor");
    Span at = et && !et->from_cli ? et->span : (decl ? decl->span : span_none);
    if (L->expert_tensor != 1 && (L->tp < 1 || L->expert_tensor != L->tp)) {
      sema_error(S, at,
                 "expert_tensor = %" PRId64 ": each expert is split over the whole tensor group (expert_tensor = tensor, "
                 "the default) or kept whole (expert_tensor = 1, the expert group folded over tensor x data ranks)",
                 L->expert_tensor);
      setting_note(S, &s, "expert_tensor", "--etp");
      if (et && et->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
    L->ep_fold = L->expert_tensor == 1 && L->tp > 1 && L->ep > 1;
    if (L->ep_fold && (L->ep % L->tp || (L->dp > 0 && L->dp % (L->ep / L->tp)))) {
      sema_error(S, at,
                 "expert_tensor = 1 folds the expert group over tensor x data ranks: expert = %" PRId64
                 " must be a multiple of tensor = %" PRId64 " whose quotient divides data = %" PRId64,
                 L->ep, L->tp, L->dp);
      diag_hint(S->diag, "with tensor = %" PRId64 ", choose expert = %" PRId64 " x a divisor of data", L->tp, L->tp);
      setting_note(S, &s, "expert", "--ep");
      if (et && et->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
  }
  if (L->ep > 1) {
    Setting *x = sema_setting_get(&s, "expert");
    if (L->dp > 0 && !L->ep_fold && L->dp % L->ep) {
      sema_error(S, x && !x->from_cli ? x->span : (decl ? decl->span : span_none),
                 "expert = %" PRId64 " does not divide data = %" PRId64 ": the expert-parallel groups are carved from the "
                 "data-parallel ranks",
                 L->ep, L->dp);
      diag_hint(S->diag, "choose an expert degree that divides %" PRId64 ", or more data-parallel ranks", L->dp);
      setting_note(S, &s, "expert", "--ep");
      setting_note(S, &s, "data", "--dp");
      if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
    int any = 0;
    for (SemLayer *l = S->instances; l; l = l->next_instance)
      for (int i = 0; i < l->nparams; i++) {
        SemParam *p = &l->params[i];
        if (p->shard != SHARD_EXPERT_COLUMN && p->shard != SHARD_EXPERT_ROW) continue;
        any = 1;
        int64_t E = 0;
        sym_is_const(p->type.dims[0], &E);
        if (E % L->ep == 0) continue;
        LayerBox *box = (LayerBox *)l;
        sema_error(S, box->site.file >= 0 ? box->site : p->span,
                   "%s has %" PRId64 " experts, which expert = %" PRId64 " does not divide (each expert-parallel rank holds "
                   "experts / expert of them)",
                   l->display, E, L->ep);
        diag_note(S->diag, p->span, "'%s' declared here", p->name);
        setting_note(S, &s, "expert", "--ep");
        for (int f = 1; f < box->nchain; f++)
          diag_note(S->diag, box->chain[f].call_site, "in %s, %s here", box->chain[f].display,
                    box->chain[f].is_call ? "called" : "instantiated");
        if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
        return;
      }
    if (!any) {
      sema_error(S, x && !x->from_cli ? x->span : (decl ? decl->span : span_none),
                 "expert = %" PRId64 " asks for expert parallelism, but %s has no experts (parameters sharded expert_column "
                 "or expert_row, as std/moe's MoE has)",
                 L->ep, m->model->decl->name.name);
      if (x && x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
  }
  /* layers by pipeline x virtual stages */
  const SemChild *rep = NULL;
  int64_t layers = 0, repeats = 0;
  find_layers(m->model, &layers, &rep, &repeats);
  m->layers = layers;
  m->repeats = repeats;
  int64_t stages = (L->pp > 0 ? L->pp : 1) * (L->virtual_stages > 0 ? L->virtual_stages : 1);
  if (stages > 1 && repeats != 1 && L->balance != BALANCE_COST) {
    sema_error(S, m->model->decl->name.span,
               "balance = %s gives the pipeline stages equal shares of one repeated block, and %s has %s",
               sem_balance_name(L->balance), m->model->decl->name.name, repeats ? "several" : "no `repeat`");
    diag_hint(S->diag, "balance = cost (the default) cuts the forward where one activation crosses");
    setting_note(S, &s, "balance", "--balance");
  } else if (stages > 1 && repeats == 1 && L->balance == BALANCE_ENDS) {
    /* the embeddings and the head count as a layer each: chunk 0 and chunk
     * K-1 run (layers + 2) / K - 1 layers, the others (layers + 2) / K */
    if ((layers + 2) % stages != 0)
      unequal_split_error(S, &s, rep->span, L,
                          arena_printf(S->arena, "%" PRId64 " layers and the two ends (embeddings, head)", layers),
                          "balance = ends needs pipeline x virtual to divide layers + 2; balance = cost (the default) gives "
                          "the stages unequal layer counts");
  } else if (stages > 1 && repeats == 1) {
    if (layers < stages) {
      sema_error(S, rep->span, "%" PRId64 " layers cannot be split into pipeline x virtual = %" PRId64 " x %" PRId64
                 " stages of at least one layer each", layers, L->pp > 0 ? L->pp : 1, L->virtual_stages > 0 ? L->virtual_stages : 1);
      setting_note(S, &s, "pipeline", "--pp");
      if (L->virtual_stages > 1) setting_note(S, &s, "virtual", "--virtual-stages");
    } else if (L->balance == BALANCE_LAYERS && layers % stages != 0) {
      unequal_split_error(S, &s, rep->span, L, arena_printf(S->arena, "%" PRId64 " layers", layers),
                          "balance = cost (the default) gives the stages unequal layer counts");
    }
  }
  if (L->virtual_stages > 1 && L->schedule >= 0 && L->schedule != SCHED_INTERLEAVED) {
    sema_error(S, sema_setting_get(&s, "virtual")->span, "virtual stages need schedule = interleaved, not %s",
               sem_schedule_name((Schedule)L->schedule));
  }
  if (L->schedule == SCHED_INTERLEAVED && L->virtual_stages == 1) {
    Setting *x = sema_setting_get(&s, "schedule");
    sema_error(S, x ? x->span : span_none, "the interleaved schedule needs virtual stages: add virtual = 2 (or more)");
  }
  /* engine = deepspeed prices DeepSpeed's PipelineEngine, which under pipeline parallelism
   * runs ZeRO stages 0-1 only (its constructor asserts it) and one schedule, TrainSchedule's
   * 1F1B (deepspeed/runtime/pipe/engine.py, schedule.py): a layout it cannot run is refused */
  if (L->engine == 1 && L->pp > 1) {
    if (L->zero >= 2) {
      sema_error(S, at_or_none(sema_setting_get(&s, "zero")),
                 "engine = deepspeed runs ZeRO stage 0 or 1 under pipeline parallelism, not %" PRId64
                 ": DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3",
                 L->zero);
      diag_hint(S->diag, "use zero = 1 (its optimizer state sharded over the data ranks), or pipeline = 1");
      setting_note(S, &s, "engine", "--engine");
      setting_note(S, &s, "pipeline", "--pp");
    }
    if (L->schedule == SCHED_GPIPE || L->schedule == SCHED_INTERLEAVED) {
      sema_error(S, at_or_none(sema_setting_get(&s, "schedule")),
                 "engine = deepspeed runs one pipeline schedule, DeepSpeed's TrainSchedule (1F1B), not %s",
                 sem_schedule_name((Schedule)L->schedule));
      diag_hint(S->diag, "use schedule = 1f1b%s", L->virtual_stages > 1 ? " and virtual = 1" : "");
      setting_note(S, &s, "engine", "--engine");
    }
  }
  /* global batch by data x micro batch */
  SemTrain *t = &m->train;
  if (t->global_batch == 0) t->global_batch = (L->dp > 0 ? L->dp : 1) * t->micro_batch;
  if (L->dp > 0 && t->micro_batch > 0 && t->global_batch > 0) {
    int64_t per_step = L->dp * t->micro_batch;
    if (t->global_batch % per_step != 0) {
      Setting *b = sema_setting_get(ts, "batch");
      sema_error(S, b ? b->span : span_none,
                 "the global batch (%" PRId64 ") is not divisible by data x micro_batch = %" PRId64 " x %" PRId64 " = %" PRId64,
                 t->global_batch, L->dp, t->micro_batch, per_step);
      int64_t lo = t->global_batch / per_step * per_step, hi = lo + per_step;
      if (lo > 0) diag_hint(S->diag, "a step runs whole micro-batches on every data rank: try batch = %" PRId64 " or %" PRId64, lo, hi);
      else diag_hint(S->diag, "a step runs whole micro-batches on every data rank: try batch = %" PRId64, hi);
      setting_note(S, ts, "micro_batch", "--micro-batch");
      setting_note(S, &s, "data", "--dp");
    } else {
      L->num_micro_batches = t->global_batch / per_step;
      if (L->schedule == SCHED_INTERLEAVED && L->pp > 1 && L->num_micro_batches % L->pp != 0) {
        sema_error(S, at_or_none(sema_setting_get(&s, "schedule")),
                   "the interleaved schedule needs the micro-batches per step (%" PRId64 ") divisible by pipeline = %" PRId64,
                   L->num_micro_batches, L->pp);
      }
      if (L->pp > 1 && L->num_micro_batches < L->pp)
        diag_warning(S->diag, at_or_none(sema_setting_get(&s, "pipeline")),
                     "%" PRId64 " micro-batch%s per step for %" PRId64 " pipeline stages: most of each step is bubble",
                     L->num_micro_batches, L->num_micro_batches == 1 ? "" : "es", L->pp);
    }
  }
  /* images have no sequence to split */
  if (m->images && (L->cp > 1 || (L->sp == 1 && L->tp > 1))) {
    const char *key = L->cp > 1 ? "context" : "sequence";
    sema_error(S, at_or_none(sema_setting_get(&s, key)),
               "%s parallelism splits a sequence, but model %s takes images (%s is [B, C, H, W]): use data, tensor or "
               "pipeline parallelism",
               key, m->model->decl->name.name, m->model->inputs[0].name);
  }
  /* sequence by context and sequence parallelism */
  if (m->seq_len > 0) {
    Span at = m->model->ninputs ? m->model->inputs[0].span : span_none;
    if (L->cp > 1)
      check_divisible(S, m->seq_len, 2 * L->cp, at, "the sequence length", "2 x context",
                      "ring attention gives each context rank two chunks, one early and one late, to balance causal work", &s,
                      "context", "--cp");
    if (L->sp == 1 && L->tp > 1) {
      int64_t before = diag_error_count(S->diag);
      check_divisible(S, m->seq_len, L->tp, at, "the sequence length", "tensor",
                      "sequence parallelism splits the sequence over the tensor ranks", &s, "tensor", "--tp");
      if (diag_error_count(S->diag) != before) setting_note(S, &s, "sequence", "--sp");
    }
  }
  if (!m->cluster.shared_device && L->tp > 0 && L->gpus_per_node > 0 && L->tp > L->gpus_per_node)
    diag_warning(S->diag, at_or_none(sema_setting_get(&s, "tensor")),
                 "tensor parallelism %" PRId64 " spans nodes (%" PRId64 " devices per node): its all-reduces cross the network",
                 L->tp, L->gpus_per_node);
}

/* The train and parallel blocks are read even when the model has errors, so
 * one run reports the mistakes of every block. */
void sema_check_blocks_only(Sema *S, SemModel *m, const AstDecl *train, const AstDecl *parallel) {
  Settings ts, ps;
  sema_read_train(S, m, train, &ts);
  sema_read_settings(S, parallel ? &parallel->settings : &(AstSettings){0, 0}, parallel_keys, NKEYS(parallel_keys), &ps, "parallel");
  apply_cli(S, &ps, "parallel", parallel_keys, NKEYS(parallel_keys));
}
