#!/usr/bin/env bash
# seeds.sh - the seed corpora of the fuzz targets, made from real files:
#
#   seeds.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds hpdlc, hpdlrun and hpdl-data (a release build's bin/); OUT_DIR
# gets one folder per target (OUT_DIR/<target>/):
#   frontend   every .hpd of samples/, stdlib/, tests/ and fuzz/
#   ckpt       the checkpoint of a one-step run of a small gpt2-tiny
#              (manifest, separator, tensor file) and its tensor file alone
#   data       shards written by hpdl-data (8 configuration bytes, then the
#              shards, separated)
#   artifact   hpdlc compile of that model at 1 rank, pp=2 and dp=2 x tp=2
#              (manifest, then each chunk file)
#   cluster    the cluster files of samples/clusters/ and the tests
#   metrics    the --metrics file of a 30-step hpdlrun of a small gpt2-tiny,
#              that file resumed (steps repeated), and a few written here
#              (nulls, one record, a CRLF file, a line over 64 KiB)
#   trace      hpdlrun --profile traces of that model: 1 step through the
#              reference executor (per-op events), 3 steps of it cut to 60
#              events a rank (no step span left: an error), 2 steps of the
#              default executor, and a few written here (a
#              bare event array, events without args.step, a pp=2 layout,
#              events of unknown shape)
# Every input of fuzz/regressions/<target>/ is a seed too. A tool that
# fails costs its seeds only (with a warning); the script still exits 0 so
# that the fuzzers run on what there is. OUT_DIR is emptied first.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BIN_DIR OUT_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$(cd "$1" 2>/dev/null && pwd) || {
  echo "seeds: no folder $1: only the seeds of files in the repository" >&2
  bin=/nonexistent
}
out=$2
sep=$'\n<<<hpdl-fuzz-next-file>>>\n' # FUZZ_SEP of fuzz/fuzz_util.h
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

warn() { echo "seeds: $*; some seeds are missing" >&2; }

# cat_sep FILE...: the files with the separator between them
cat_sep() {
  local first=1 f
  for f in "$@"; do
    [ $first = 1 ] || printf '%s' "$sep"
    cat -- "$f"
    first=0
  done
}
join() { # join OUT FILE...
  local o=$1
  shift
  cat_sep "$@" >"$o"
}

case $out in "" | / | "$root") echo "seeds: refusing to empty $out" >&2; exit 2 ;; esac
rm -rf -- "$out"
for t in frontend ckpt data artifact cluster metrics trace; do
  mkdir -p "$out/$t"
  [ -d "$root/fuzz/regressions/$t" ] && cp -- "$root/fuzz/regressions/$t"/* "$out/$t/" 2>/dev/null
done
rm -f "$out"/*/*.expect

# ---- frontend and cluster: files of the repository ----
while IFS= read -r -d '' f; do
  rel=${f#"$root"/}
  cp -- "$f" "$out/frontend/seed-$(printf '%s' "$rel" | tr '/' '_')"
done < <(find "$root/samples" "$root/stdlib" "$root/tests" "$root/fuzz" -name '*.hpd' -size -1024k -print0 2>/dev/null)
for f in "$root"/samples/clusters/*.hpd; do cp -- "$f" "$out/cluster/"; done
grep -l '^cluster ' "$root"/tests/errors/*.hpd 2>/dev/null | while read -r f; do cp -- "$f" "$out/cluster/"; done
# a cluster described by hand with its device's scales (compute_scale, memory_scale)
grep -l '^cluster ' "$root"/tests/plan/*.hpd 2>/dev/null | while read -r f; do cp -- "$f" "$out/cluster/"; done

# ---- data: shards from hpdl-data ----
small=(-D V=256 -D T=16 -D C=8 -D L=2 -D H=2)
if "$bin/hpdl-data" --synthetic 3000 --shard-tokens 1000 -o "$work/d/tiny" >/dev/null; then
  # the configuration bytes (fuzz_data.c): T=16, B=3, rank 0 of 2, shuffled, prefetched
  { printf '\x0f\x02\x21\x03\x00\x05\x01\x00'; cat_sep "$work"/d/tiny_train_*.bin; } >"$out/data/train_shards"
  { printf '\x07\x00\x00\x00\xff\x00\x00\x00'; cat "$work"/d/tiny_val_000000.bin; } >"$out/data/val_shard_vocab255"
else
  warn "hpdl-data failed"
fi

# ---- artifact and ckpt: hpdlc compile, then one step of hpdlrun ----
compile() { # compile NAME FLAGS...
  local name=$1
  shift
  "$bin/hpdlc" compile "$root/samples/gpt2-tiny.hpd" "${small[@]}" --target cpu "$@" -o "$work/$name" >/dev/null
}
if compile one; then
  join "$out/artifact/one_rank" "$work/one/manifest.json" "$work/one/stage0.hir"
else
  warn "hpdlc compile failed"
fi
# the checkpoint of a smaller model still: fewer and shorter tensors, faster runs
if compile ckmodel -D L=1 -D C=4 -D H=1 -D T=8 &&
  "$bin/hpdlrun" "$work/ckmodel" --steps 1 --data "$work/d/tiny_train_*.bin" --checkpoint-dir "$work/ck" \
    --progress quiet >/dev/null 2>&1; then
  man=$(ls "$work"/ck/step-*.json | head -n 1)
  join "$out/ckpt/checkpoint" "$man" "${man%.json}.safetensors"
  cp -- "${man%.json}.safetensors" "$out/ckpt/tensors_only"
else
  warn "hpdlc compile or hpdlrun failed"
fi
# ---- metrics: hpdlrun --metrics of that model, and a resumed run ----
if [ -d "$work/ckmodel" ] &&
  "$bin/hpdlrun" "$work/ckmodel" --steps 30 --data "$work/d/tiny_train_*.bin" \
    --checkpoint-dir "$work/ckm" --metrics "$work/m.jsonl" --progress quiet >/dev/null 2>&1; then
  cp -- "$work/m.jsonl" "$out/metrics/run_30_steps.jsonl"
  # a run killed after step 30 and resumed from step 20's checkpoint: 21..30 again
  { cat "$work/m.jsonl"; sed -n '21,30p' "$work/m.jsonl"; } >"$out/metrics/resumed.jsonl"
else
  warn "hpdlrun --metrics failed"
fi
rec='{"step": %d, "loss": %s, "lr": 0.0006, "grad_norm": %s, "tokens_per_s": 331200, "step_s": 0.0015, "elapsed_s": 0.2}\n'
printf "$rec" 1 5.5 0.9 2 null null 3 5.1 0.8 4 null 0.7 >"$out/metrics/nulls.jsonl"
printf "$rec" 7 3.25 1.5 >"$out/metrics/one_record.jsonl"
printf "$rec" 1 5.5 0.9 2 5.4 0.8 | sed 's/$/\r/' >"$out/metrics/crlf.jsonl"
# a line just over the reader's 64 KiB, so that the fuzzer's inputs may be that long
{ printf "$rec" 1 5.5 0.9; printf '{"step": 2, "note": "%065536d"}\n' 0; } >"$out/metrics/long_line.jsonl"

# ---- trace: hpdlrun --profile of that model ----
if [ -d "$work/ckmodel" ] &&
  HPDL_EXECUTOR=interp "$bin/hpdlrun" "$work/ckmodel" --steps 3 --data "$work/d/tiny_train_*.bin" \
    --checkpoint-dir "$work/ckt" --profile "$work/t1.json" --profile-events 60 --progress quiet >/dev/null 2>&1 &&
  "$bin/hpdlrun" "$work/ckmodel" --steps 2 --data "$work/d/tiny_train_*.bin" \
    --checkpoint-dir "$work/ckt2" --profile "$work/t2.json" --progress quiet >/dev/null 2>&1 &&
  HPDL_EXECUTOR=interp "$bin/hpdlrun" "$work/ckmodel" --steps 1 --data "$work/d/tiny_train_*.bin" \
    --checkpoint-dir "$work/ckt3" --profile "$work/t3.json" --progress quiet >/dev/null 2>&1; then
  cp -- "$work/t1.json" "$out/trace/interp_3_steps_60_events.json"
  cp -- "$work/t3.json" "$out/trace/interp_1_step.json"
  cp -- "$work/t2.json" "$out/trace/default_2_steps.json"
else
  warn "hpdlrun --profile failed"
fi
ev='{"name": "%s", "cat": "%s", "ph": "X", "pid": %d, "tid": %d, "ts": %s, "dur": %s, "args": {%s}}'
{
  printf '['
  printf "$ev," step step 0 1 0 100 '"step": 1'
  printf "$ev," matmul op 0 2 10 20 ''
  printf "$ev," all_reduce collective 0 3 40 5 '"group": "dp", "bytes": 64'
  printf "$ev" 'optimizer update' phase 0 1 60 30 '"step": 1'
  printf ']\n'
} >"$out/trace/bare_array_no_step_args.json"
{
  printf '{"traceEvents": [\n'
  for r in 0 1; do
    printf '{"name": "process_name", "ph": "M", "pid": %d, "tid": 0, "args": {"name": "rank %d (dp 0, tp 0, pp %d, cp 0)"}},\n' $r $r $r
    for s in 1 2; do
      b=$((s * 1000))
      printf "$ev,\n" step step $r 1 $b 900 "\"step\": $s"
      printf "$ev,\n" 'program step' phase $r 1 $((b + 10)) 700 "\"step\": $s"
      printf "$ev,\n" forward forward $r 2 $((b + 20 + 100 * r)) 200 "\"step\": $s"
      printf "$ev,\n" recv p2p $r 3 $((b + 30)) 50 "\"step\": $s, \"group\": \"pp\", \"peer\": $((1 - r))"
      printf "$ev,\n" softmax op $r 2 $((b + 40)) 10.5 "\"step\": $s"
    done
  done
  printf '{"name": "x", "ph": "B", "pid": 0, "tid": 2, "ts": 1}, {"ph": "X"}, 7, null\n'
  printf '], "otherData": {"dropped_events": 0}}\n'
} >"$out/trace/pp2_unknown_shapes.json"

if compile pp2 --pp 2 --gpus 2; then
  join "$out/artifact/pp2" "$work/pp2/manifest.json" "$work"/pp2/stage*.hir
else
  warn "hpdlc compile --pp 2 failed"
fi
if compile dp2tp2 --dp 2 --tp 2 --gpus 4; then
  join "$out/artifact/dp2_tp2" "$work/dp2tp2/manifest.json" "$work/dp2tp2/stage0.hir"
else
  warn "hpdlc compile --dp 2 --tp 2 failed"
fi

for t in frontend ckpt data artifact cluster metrics trace; do
  printf 'seeds: %-9s %3d inputs\n' "$t" "$(find "$out/$t" -type f | wc -l)"
done
exit 0
