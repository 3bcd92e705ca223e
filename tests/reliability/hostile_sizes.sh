#!/usr/bin/env bash
# hostile_sizes.sh HPDLC SAMPLES_DIR - sizes no machine holds, given with -D,
# are refused with a message naming the line (exit 1), quickly and without
# allocating what they ask for; a chain of imports deeper than the loader's
# limit is refused too. Each case: a verb, its arguments, and the text the
# diagnostic must contain. docs/reliability.md lists them.
set -u
hpdlc=$1
samples=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ran=0
# 2 GiB of address space: a compiler that tried to allocate what the shapes
# ask for fails this bound instead. Not under AddressSanitizer, whose shadow
# memory reserves terabytes of address space (its allocator still refuses
# a request of terabytes).
vmem=2097152
if ldd "$hpdlc" 2>/dev/null | grep -q libasan; then vmem=unlimited; fi

# expect_refusal NAME EXPECTED_TEXT HPDLC_ARGS...: exit 1 within the time and
# memory bounds, the expected text on stderr, no internal error.
expect_refusal() {
  local name=$1 want=$2
  shift 2
  ran=$((ran + 1))
  # and 30 s: one that walked 10^8 layers fails this bound
  (ulimit -v "$vmem"; timeout 30 "$hpdlc" "$@") >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err" || grep -q "internal error" "$tmp/err"; then
    echo "FAIL $name: hpdlc $* exited $rc; wanted exit 1 and: $want"
    sed 's/^/    /' "$tmp/err" | head -12
    fails=$((fails + 1))
  else
    echo "ok   $name: $(head -1 "$tmp/err")"
  fi
}

gpt2=$samples/gpt2.hpd
tiny=$samples/gpt2-tiny.hpd
# a hidden size whose embedding has 5e15 elements
expect_refusal hidden_check "parameter 'weight' has 5.03e+15 elements, more than a tensor may hold (2^48" \
  check "$gpt2" -D C=99999999996
expect_refusal hidden_plan "more than a tensor may hold (2^48" plan "$gpt2" -D C=99999999996
# a vocabulary of 10^14
expect_refusal vocab_plan "parameter 'weight' has 7.68e+16 elements" plan "$gpt2" -D V=99999999999999
expect_refusal vocab_compile "parameter 'weight' has 6.4e+15 elements" compile "$tiny" -D V=99999999999999 -o "$tmp/a"
# 10^8 layers (the planner used to allocate 51 GB for them)
expect_refusal layers_plan "the repeat count 100000000 is more than 65536 layers" plan "$gpt2" -D L=100000000
expect_refusal layers_compile "the repeat count 100000000 is more than 65536 layers" compile "$tiny" -D L=100000000 -o "$tmp/a"
# a sequence of 10^11: every parameter fits, the activations do not (the
# memory plan's byte counts overflowed: "internal error: ... does not check")
expect_refusal seq_plan "this value would be [64, 99999999999, 768]" plan "$gpt2" -D T=99999999999
expect_refusal seq_compile "elements a micro-batch, more than any machine holds (2^50" compile "$gpt2" -D T=99999999999 -o "$tmp/a"
expect_refusal seq_search "more than any machine holds (2^50" plan "$gpt2" -D T=99999999999 --search
# 100 layers of 2^42-element weights (4 x 2^40 each): each fits, the repeat's copies do not
cat >"$tmp/copies.hpd" <<'HPD'
import "std/nn"
layer Wide(C) {
  param w : [C, 4096] init zeros
  forward(x) { return x + mean(mean(w)) }
}
model Copies(C = 1073741824) {
  input x : f32[B, 4]
  blocks = repeat 100 Wide(C)
  forward { loss = mean(mean(blocks(x))) }
}
train { batch = 1  micro_batch = 1  steps = 1 }
HPD
expect_refusal repeat_copies "100 copies of 4398046511104 elements are more than the parameters of one repeat may hold" \
  plan "$tmp/copies.hpd"
# a chain of 300 imports
for i in $(seq 0 299); do
  { [ "$i" -lt 299 ] && echo "import \"m$((i + 1))\""
    echo "layer L$i(C) {"; echo "  param w : [C] init zeros"; echo "  forward(x) { return x * w }"; echo "}"; } >"$tmp/m$i.hpd"
done
expect_refusal import_depth "imports nested deeper than 256 files" check "$tmp/m0.hpd"

echo "$((ran - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
