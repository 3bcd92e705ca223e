#!/usr/bin/env python3
"""compile_e2e.py - end to end through `hpdlc compile` and `hpdlrun` (CTest: compile.CASE).

    compile_e2e.py --bin BUILD/bin --ref hpdl_compile_ref --source REPO --work DIR CASE

Each case compiles samples/gpt2-tiny.hpd at a small size (-D C=32 -D T=16 -D L=2 -D H=4:
34K parameters, a global batch of 32 windows of 16 bytes), trains it with hpdlrun on
generated text (hpdl-data --synthetic) and checks the numbers against hpdl_compile_ref
(tests/compile/ref_train.c: the unpartitioned model trained by the reference executor in
one process) or against each other:

  one_rank, dp2, tp2, pp2, pp2_gpipe, dp2_tp2_pp2, tp2_cp2, pp2_virtual2, pp2_virtual2_native
      the artifact of that layout (the reference executor's program, fp64): the step-1
      loss and gradient norm within 1e-6 relative of the reference, the loss after 20
      steps within 1e-4. The pipeline cases run 4 micro-batches per step through the
      schedule's instruction lists (pp2: 1F1B, two micro-batches in flight on stage 0;
      pp2_gpipe: GPipe, four; pp2_virtual2: interleaved 1F1B over two virtual stages,
      4 layers, each stage holding two chunks; pp2_virtual2_native: the same with the
      generated kernels, within 1e-5 at step 1, skipped without the back end), each micro-batch's forward
      and backward apart.
  zero1, zero2, zero3, zero2_dp2_tp2_pp2
      ZeRO stages at dp=2 (and 2 x 2 x 2): the reference's numbers, tighter (step 1
      within 1e-7, step 20 within 1e-6: ZeRO changes no arithmetic), and the
      start-up line's optimizer state per rank exactly 1/dp of zero 0's (both computed
      from the manifest's parameters, the slices padded to 16 x dp values).
  resume_zero    a checkpoint of step 10 at zero=2 dp=2 resumed on one rank (zero 0) and
      at zero=3 dp=2: the parameters and moments after step 20 within 1e-5 of 20 straight
      steps at zero 0 dp=2, the step-20 loss within 1e-6; and gradient compression with
      zero 2 refused at start-up with one message naming both settings.
  pp2_uneven     pp=2 on 3 layers (-D L=3): the cost-balanced stages run 2 and 1 layers
      (the manifest's layout.stage_layers, the parameters' stages); the same tolerances
      against the reference of the 3-layer model.
  moments_bf16   train.moments = bf16: the moments stored in 16 bits (the case's docstring).
  resume_same_layout   pp=2: 20 steps straight and 10 + resume + 10 give the same
      checkpoint, bit for bit (tied embedding mirrored across the stages included).
  resume_other_layout  a checkpoint of step 10 at pp=2 resumed at dp=2 and at tp=2:
      the parameters after step 20 within 1e-5 of the straight run.
  mixed_precision   bf16 / fp16 storage (compiler/ir/precision.h): 20 steps within 2e-2 of fp32,
      a smaller arena, the kernels against the reference executor's bf16, six layouts against one
      rank within 1e-3, an fp16 overflow skipping every step (the docstring of the case).
  vocab_pad      a vocabulary of 201 at tp=2 and tp=4 (padded to 256 / 512 rows, the padded
      logits masked): the reference's numbers; the manifest and checkpoints keep [201, 32];
      tp=2's checkpoint resumed on one rank and at tp=4 (generated kernels) within 1e-5;
      padded logits that reach a softmax (vocab_pad_softmax.hpd) refused with the line; at one
      rank a vocabulary of 1000 padded to 1024 (alignment; the reference's numbers), 201 not
      (over 1/16 more rows), nor where a softmax reads the logits.
  missing_file   a missing chunk file, program, kernels or manifest, and a damaged
      chunk file: one clear message naming the file, exit status 1.
  self_contained the artifact copied elsewhere runs from another folder; it names no
      file outside itself and its program needs no library of the build tree.
  cli            hpdlc compile's command-line and layout errors.
  native         (with the CPU back end) the generated kernels (stages the back end
      cannot compile run the reference executor: "mixed"): within 1e-5 of the reference
      at step 1 and 1e-4 at step 20, on one rank and with tp and pp; HPDL_EXECUTOR=
      interp on the same artifact gives the reference executor's numbers. The pp2
      artifact's kernels carry the step's forward and backward parts (hpd_graph_*_F /
      _B), which the 1F1B schedule runs apart, and HPDL_PIPELINE_ORDER=sequential (one
      micro-batch in flight) gives the same losses (5 steps).
  fusion_off     --fusion off (a kernel an op) against the fused program, generated kernels
      at one rank, tp 2 and bf16 storage: the same losses and gradient norms bit for bit,
      the manifest's program.fusion, the summary line; a bad value refused.
Exit 0 pass, 1 fail, 77 skip (no mpirun, or no back end for `native`).
"""
import argparse
import array
import json
import re
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import e2e as rt  # noqa: E402  (the runtime tests' checkpoint reader: safetensors, CRC-32C)
import e2e_common  # noqa: E402
from e2e_common import SKIP, Fail, check, metrics  # noqa: E402

ARGS = None
DEFS = ["-D", "C=32", "-D", "T=16", "-D", "L=2", "-D", "H=4"]
STEPS = 20


def run(args, expect=0, env=None, cwd=None):
    return e2e_common.run(args, expect, env, cwd, timeout=280)


def tool(name):
    return os.path.join(ARGS.bin, name)


def work(name):
    d = os.path.join(ARGS.work, name)
    os.makedirs(d, exist_ok=True)
    return d


SAMPLE = "gpt2-tiny.hpd"


def sample():
    return os.path.join(ARGS.source, "samples", SAMPLE)


def need_mpi(world):
    if world > 1:
        e2e_common.need_mpi(ARGS.bin)


def make_data():
    d = work("data")
    prefix = os.path.join(d, "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        run([tool("hpdl-data"), "--synthetic", "300000", "--seed", "3", "-o", prefix])
    return prefix + "_train_*.bin"


def compile_art(name, flags, executor="interp", expect=0, defs=None):
    d = os.path.join(ARGS.work, name)
    shutil.rmtree(d, ignore_errors=True)
    p = run([tool("hpdlc"), "compile", sample(), *(defs or DEFS), *flags, "--executor", executor, "-o", d], expect=expect)
    return d, p


def world_of(art):
    try:
        return json.load(open(os.path.join(art, "manifest.json")))["world_size"]
    except FileNotFoundError:
        return 1


def train(art, tag, steps=STEPS, extra=(), env=None, expect=0):
    need_mpi(world_of(art))
    m = os.path.join(ARGS.work, tag + ".jsonl")
    if os.path.exists(m) and "--resume" not in extra:
        os.remove(m)
    p = run([tool("hpdlrun"), art, "--data", make_data(), "--steps", str(steps), "--metrics", m, "--progress", "plain",
             *extra], env=env, expect=expect)
    return (metrics(m) if os.path.exists(m) else []), p


_REF = {}


def reference(art, defs=None):
    """The reference executor's run for this artifact's training settings (one per global batch)."""
    if art not in _REF:
        p = run([ARGS.ref, sample(), art, make_data(), str(STEPS), *(defs or DEFS)])
        _REF[art] = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return _REF[art]


def rel(a, b):
    return abs(a - b) / abs(b)


def compare(name, got, ref, tol1=1e-6, tol20=1e-4, falls=True):
    """got against ref: step 1's loss and gradient norm within tol1, the last step's loss within
    tol20, and (falls) the loss lower at the end than at step 1."""
    check(len(got) == STEPS and len(ref) == STEPS, f"{name}: {len(got)} steps run, {len(ref)} in the reference")
    l1, n1 = rel(got[0]["loss"], ref[0]["loss"]), rel(got[0]["grad_norm"], ref[0]["grad_norm"])
    l20 = rel(got[-1]["loss"], ref[-1]["loss"])
    print(f"{name}: step 1 loss {got[0]['loss']:.9f} (reference {ref[0]['loss']:.9f}, rel {l1:.1e}), "
          f"norm {got[0]['grad_norm']:.9f} (reference {ref[0]['grad_norm']:.9f}, rel {n1:.1e}); "
          f"step {STEPS} loss {got[-1]['loss']:.9f} (reference {ref[-1]['loss']:.9f}, rel {l20:.1e})")
    check(l1 <= tol1, f"{name}: step-1 loss off by {l1:.2e} relative")
    check(n1 <= tol1, f"{name}: step-1 gradient norm off by {n1:.2e} relative")
    check(l20 <= tol20, f"{name}: step-{STEPS} loss off by {l20:.2e} relative")
    if falls:
        check(got[-1]["loss"] < got[0]["loss"], f"{name}: the loss did not fall")


def layout_case(name, flags, tol1=1e-6, tol20=1e-4):
    art, _ = compile_art("art-" + name, flags)
    got, p = train(art, name)
    compare(name, got, reference(art), tol1, tol20)
    return art, p


def state_line(out):
    """hpdlrun's start-up line on the optimizer state: (bytes per rank, zero, dp, whole bytes or None)."""
    units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
    for line in out.splitlines():
        w = line.split()
        if line.startswith("hpdlrun: optimizer state "):
            per = float(w[3]) * units[w[4]]
            if "(zero 0" in line:
                return per, 0, 1, None
            # "... per rank (zero 2, 1/2 of 273.408 kB)..."
            i = w.index("(zero")
            return per, int(w[i + 1].rstrip(",")), int(w[i + 2].split("/")[1]), float(w[i + 4]) * units[w[i + 5].rstrip(");")]
    raise Fail(f"no optimizer-state line in:\n{out}")


def expected_state(art, bytes_per_value=8):
    """The optimizer state of the largest rank, from the manifest: (bytes per rank, bytes of
    the whole) for m and v of AdamW at bytes_per_value (8: both fp32) a value."""
    man = json.load(open(os.path.join(art, "manifest.json")))
    lay = man["layout"]
    # The largest rank's pool (the runtime prints the largest): its parameter copies,
    # each rounded up to 16 values, each split tensor's shard 1/tp.
    pools = {}
    for q in man["params"]:
        n = 1
        for d in q["shape"]:
            n *= d
        if (q.get("split") or {}).get("group") == "tp" and lay["tp"] > 1:
            n //= lay["tp"]
        for st in q["stage"] if isinstance(q["stage"], list) else [q["stage"]] * q["count"]:
            pools[st] = pools.get(st, 0) + (n + 15) // 16 * 16
    values = max(pools.values())
    unit = 16 * lay["dp"]
    return bytes_per_value * ((values + unit - 1) // unit * unit // lay["dp"]), bytes_per_value * values


def zero_case(name, zero, flags):
    art, p = layout_case(name, ["--zero", str(zero), *flags], tol1=1e-7, tol20=1e-6)
    lay = json.load(open(os.path.join(art, "manifest.json")))["layout"]
    check(lay["zero"] == zero, f"the manifest's layout.zero is {lay['zero']}")
    dp, unit = lay["dp"], 16 * lay["dp"]
    own, whole = expected_state(art)  # AdamW: m and v, fp32
    per, z, d, of = state_line(p.stdout)
    print(f"{name}: optimizer state {per:.0f} bytes per rank, 1/{d} of {of:.0f} (zero 0 would hold {whole} per rank)")
    check((z, d) == (zero, dp), f"the line says zero {z}, 1/{d}")
    check(abs(of - whole) < 0.5 and abs(per - own) < 0.5, f"expected {own} of {whole} bytes per rank")
    check(0 <= per * dp - whole < 8 * unit, "a rank's slice is 1/dp of the whole, up to padding")


def case_zero1():
    zero_case("zero1", 1, ["--dp", "2"])


def case_zero2():
    zero_case("zero2", 2, ["--dp", "2"])


def case_zero3():
    zero_case("zero3", 3, ["--dp", "2"])


def case_zero2_dp2_tp2_pp2():
    zero_case("zero2_dp2_tp2_pp2", 2, ["--dp", "2", "--tp", "2", "--pp", "2", "--schedule", "1f1b"])


def case_resume_zero():
    straight, _ = compile_art("art-zero0", ["--dp", "2"])
    z2, _ = compile_art("art-zero2", ["--dp", "2", "--zero", "2"])
    a, b = os.path.join(ARGS.work, "straight"), os.path.join(ARGS.work, "split")
    for x in (a, b):
        shutil.rmtree(x, ignore_errors=True)
    ma, _ = train(straight, "straight", extra=["--checkpoint-dir", a])
    train(z2, "split", extra=["--checkpoint-dir", b, "--stop-at", "10"])
    check(rt.latest(b) == 10, "stopped at step 10 with a checkpoint")
    ref = rt.ckpt(a, 20)
    check(sum(k.startswith("opt.") for k in ref) == 2 * sum(not k.startswith("opt.") for k in ref), "m and v saved whole")
    for name, flags in (("one rank, zero 0", []), ("dp=2, zero 3", ["--dp", "2", "--zero", "3"])):
        art, _ = compile_art("art-resumed", flags)
        c = os.path.join(ARGS.work, "resumed")
        shutil.rmtree(c, ignore_errors=True)
        shutil.copytree(b, c)
        mc, p = train(art, "resumed", extra=["--checkpoint-dir", c, "--resume"])
        check("steps 11..20" in p.stdout, p.stdout)
        diff, dl = rt.max_diff(ref, rt.ckpt(c, 20)), rel(mc[-1]["loss"], ma[-1]["loss"])
        print(f"resume_zero: saved at zero 2 dp=2 after 10 steps, resumed at {name}: max difference {diff:.2e} over "
              f"{len(ref)} tensors (parameters, m, v) and step-20 loss {mc[-1]['loss']:.9f} (rel {dl:.1e}) against 20 "
              f"steps at zero 0 dp=2")
        check(diff < 1e-5, f"resumed at {name}: max difference {diff}")
        check(dl < 1e-6, f"resumed at {name}: step-20 loss off by {dl:.2e}")
    # compressed gradients under ZeRO 2 and 3: each member's slice of the reduce-scatter
    # rounded to bf16 and summed in fp32 in rank order, as zero 1's compressed all-reduce
    # gives that slice, so the three stages agree bit for bit; and they differ from the
    # uncompressed run (the compression took effect) by bf16's rounding only
    runs = {}
    for z in (1, 2, 3):
        art, _ = compile_art(f"art-bf16-zero{z}", ["--dp", "2", "--zero", str(z), "--compression", "bf16"])
        d = os.path.join(ARGS.work, f"bf16-zero{z}")
        shutil.rmtree(d, ignore_errors=True)
        m, _ = train(art, f"bf16-zero{z}", extra=["--checkpoint-dir", d])
        runs[z] = (rt.ckpt(d, 20), m[-1]["loss"])
    for z in (2, 3):
        diff = rt.max_diff(runs[1][0], runs[z][0])
        print(f"resume_zero: compression = bf16 at zero {z} against zero 1: max difference {diff:.2e}, "
              f"step-20 loss {runs[z][1]:.9f} against {runs[1][1]:.9f}")
        check(diff == 0 and runs[z][1] == runs[1][1], f"bf16 compression at zero {z}: differs from zero 1's by {diff}")
    diff = rt.max_diff(ref, runs[2][0])
    print(f"resume_zero: compression = bf16 at zero 2 against zero 0 uncompressed: max difference {diff:.2e}")
    check(0 < diff < 5e-3, f"bf16-compressed zero 2 against the uncompressed run: {diff} (expected in (0, 5e-3))")


def not_bf16(values):
    """How many of the floats are not bf16 values (any of their low 16 bits set)."""
    bits = array.array("I")
    bits.frombytes(values.tobytes())
    return sum(1 for b in bits if b & 0xFFFF)


def case_moments_bf16():
    """train.moments = bf16 (--moments bf16): AdamW's moments stored in 16 bits, the
    master weights fp32. On one rank against the fp32 moments: the step-1 loss the same
    bit for bit (no update yet), the step-20 loss apart (the rounding took effect) but
    within 1e-2; the checkpoint's moments are bf16 values (fp32 tensors, logical as
    always) and its parameters are not. At dp=2 zero 2 the start-up line's state per
    rank is half the fp32 moments' (2 + 2 bytes a value); stopped there at step 10 and
    resumed on one rank, the step-20 loss within 1e-5 of the straight one-rank run. A
    checkpoint with fp32 moments resumes into bf16 ones (rounded once). `hpdlc emit cuda`
    asks for the 16-bit moments' optimizer kernels (HPDL_OPTIM_MOMENTS16) for such a run
    only."""
    dirs = {}
    for tag in ("m32", "m16", "m16-split", "m16-from32"):
        dirs[tag] = os.path.join(ARGS.work, "ck-" + tag)
        shutil.rmtree(dirs[tag], ignore_errors=True)
    a32, _ = compile_art("art-m32", [])
    a16, _ = compile_art("art-m16", ["--moments", "bf16"])
    man = json.load(open(os.path.join(a16, "manifest.json")))
    check(man["train"].get("moments") == "bf16", f"the manifest's train.moments: {man['train'].get('moments')}")
    m32, _ = train(a32, "m32", extra=["--checkpoint-dir", dirs["m32"]])
    m16, p = train(a16, "m16", extra=["--checkpoint-dir", dirs["m16"]])
    check("adamw (bf16 moments)" in p.stdout, f"the start-up line: {p.stdout}")
    d20 = rel(m16[-1]["loss"], m32[-1]["loss"])
    print(f"moments_bf16: step 1 loss {m16[0]['loss']:.9f} (fp32 moments {m32[0]['loss']:.9f}); step 20 loss "
          f"{m16[-1]['loss']:.9f} (fp32 moments {m32[-1]['loss']:.9f}, rel {d20:.1e})")
    check(m16[0]["loss"] == m32[0]["loss"], "step 1 differs before any update")
    check(0 < d20 < 1e-2, f"step 20: bf16 moments against fp32 ones {d20:.2e} (expected in (0, 1e-2))")
    check(m16[-1]["loss"] < m16[0]["loss"], "the loss did not fall")
    ck = rt.ckpt(dirs["m16"], 20)
    moments = [k for k in ck if k.startswith("opt.")]
    params = [k for k in ck if not k.startswith("opt.")]
    odd = sum(not_bf16(ck[k]) for k in moments)
    nonzero = sum(1 for k in moments for x in ck[k] if x != 0)
    wide = sum(not_bf16(ck[k]) for k in params)
    print(f"moments_bf16: the checkpoint's {len(moments)} moment tensors: {nonzero} values non-zero, {odd} not bf16; "
          f"its {len(params)} parameters: {wide} not bf16 (fp32 masters)")
    check(len(moments) == 2 * len(params) and odd == 0 and nonzero > 0 and wide > 0, "bf16 moments, fp32 parameters")
    # dp=2 zero 2: half the state, and a resume on one rank
    z2, _ = compile_art("art-m16-zero2", ["--moments", "bf16", "--dp", "2", "--zero", "2"])
    ms, p = train(z2, "m16-split", extra=["--checkpoint-dir", dirs["m16-split"], "--stop-at", "10"])
    per, _, _, of = state_line(p.stdout)
    own, whole = expected_state(z2, bytes_per_value=4)
    print(f"moments_bf16: zero 2 dp=2: optimizer state {per:.0f} bytes per rank of {of:.0f} (expected {own} of {whole})")
    check(abs(per - own) < 0.5 and abs(of - whole) < 0.5 and "; moments in bf16" in p.stdout, "the state line")
    check(rt.latest(dirs["m16-split"]) == 10, "stopped at step 10 with a checkpoint")
    mr, p = train(a16, "m16-resumed", extra=["--checkpoint-dir", dirs["m16-split"], "--resume"])
    check("steps 11..20" in p.stdout, p.stdout)
    dr = rel(mr[-1]["loss"], m16[-1]["loss"])
    diff = rt.max_diff(ck, rt.ckpt(dirs["m16-split"], 20), params)
    print(f"moments_bf16: 10 steps at zero 2 dp=2, 10 more on one rank: step-20 loss {mr[-1]['loss']:.9f} (rel {dr:.1e}), "
          f"parameters within {diff:.1e} of 20 steps on one rank")
    check(dr < 1e-5 and diff < 1e-4, "resumed on one rank")
    # fp32 moments resumed as bf16 ones
    train(a32, "m16-from32-first", steps=20, extra=["--checkpoint-dir", dirs["m16-from32"], "--stop-at", "10"])
    mf, p = train(a16, "m16-from32", extra=["--checkpoint-dir", dirs["m16-from32"], "--resume"])
    odd = sum(not_bf16(v) for k, v in rt.ckpt(dirs["m16-from32"], 20).items() if k.startswith("opt."))
    df = rel(mf[-1]["loss"], m16[-1]["loss"])
    print(f"moments_bf16: fp32 moments for 10 steps, bf16 for 10: step-20 loss {mf[-1]['loss']:.9f} (rel {df:.1e} to bf16 "
          f"throughout), {odd} moments not bf16")
    check(odd == 0 and df < 1e-2, "fp32 moments resumed as bf16")
    # the CUDA target's modules hold the 16-bit moments' optimizer kernels only for such a run
    for flags, want in (([], False), (["--moments", "bf16"], True)):
        p = run([tool("hpdlc"), "emit", "cuda", sample(), *DEFS, *flags])
        has = "#define HPDL_OPTIM_MOMENTS16 1" in p.stdout
        print(f"moments_bf16: hpdlc emit cuda {' '.join(flags) or '(fp32 moments)'}: "
              f"{'defines' if has else 'does not define'} HPDL_OPTIM_MOMENTS16")
        check(has == want, "the 16-bit moments' kernels where the run uses them, only there")


# ---- cases --------------------------------------------------------------------

def case_one_rank():
    layout_case("one_rank", [])


def case_dp2():
    layout_case("dp2", ["--dp", "2"])


def case_tp2():
    layout_case("tp2", ["--tp", "2"])


def case_pp2():
    layout_case("pp2", ["--pp", "2", "--schedule", "1f1b"])


def case_pp2_uneven():
    defs = [d if d != "L=2" else "L=3" for d in DEFS]
    art, p = compile_art("art-pp2-uneven", ["--pp", "2", "--schedule", "1f1b"], defs=defs)
    man = json.load(open(os.path.join(art, "manifest.json")))
    layers = man["layout"].get("stage_layers")
    print(f"pp2_uneven: stages of {layers} layers (balance = {man['layout'].get('balance')})")
    check(layers == [2, 1], f"3 layers on 2 stages split as {layers}, not [2, 1]")
    for q in man["params"]:
        if q["count"] == 3:
            check(q["stage"] == [0, 0, 1], f"{q['name']}: copies on stages {q['stage']}, not [0, 0, 1]")
    check("stage 1: layers 2-2" in p.stdout, p.stdout)
    got, _ = train(art, "pp2_uneven")
    compare("pp2_uneven", got, reference(art, defs))


def case_pp2_gpipe():
    layout_case("pp2_gpipe", ["--pp", "2", "--schedule", "gpipe"])


def case_dp2_tp2_pp2():
    layout_case("dp2_tp2_pp2", ["--dp", "2", "--tp", "2", "--pp", "2", "--schedule", "1f1b"])


# four layers, so that two stages hold two chunks of one layer each
DEFS_L4 = ["-D", "C=32", "-D", "T=16", "-D", "L=4", "-D", "H=4"]


def virtual2(executor):
    # interleaved 1F1B: stage 0 runs chunks 0 and 2, stage 1 chunks 1 and 3
    art, p = compile_art("art-pp2v2-" + executor, ["--pp", "2", "--virtual-stages", "2"], executor=executor, defs=DEFS_L4)
    man = json.load(open(os.path.join(art, "manifest.json")))
    check([[c["chunk"] for c in r["chunks"]] for r in man["ranks"]] == [[0, 2], [1, 3]], f"chunks per stage: {man['ranks']}")
    ex = man["program"]["executor"]
    if executor == "native" and ex != "native":
        print("skipped: the CPU back end is not built into this hpdlc: " + p.stderr.strip())
        sys.exit(SKIP)
    got, _ = train(art, "pp2v2-" + executor)
    compare(f"pp2 x virtual 2 interleaved ({ex})", got, reference(art, DEFS_L4), tol1=1e-6 if ex == "interp" else 1e-5)


def case_pp2_virtual2():
    virtual2("interp")


def case_pp2_ends():
    # balance = ends: the embeddings and the head count as a layer each, so two layers
    # over pp 2 x virtual 2 = 4 chunks leave chunk 0 the embeddings alone and chunk 3
    # the head and loss alone (Llama 3's pipeline); stage 0 runs chunks 0 and 2
    for executor in ("interp", "native"):
        art, p = compile_art("art-pp2-ends-" + executor, ["--pp", "2", "--virtual-stages", "2", "--balance", "ends"],
                             executor=executor)
        man = json.load(open(os.path.join(art, "manifest.json")))
        if executor == "native" and man["program"]["executor"] != "native":
            print("native: skipped, the CPU back end is not built into this hpdlc")
            continue
        check(man["layout"].get("balance") == "ends", f"balance {man['layout'].get('balance')}")
        check([[c["chunk"] for c in r["chunks"]] for r in man["ranks"]] == [[0, 2], [1, 3]], f"chunks per stage: {man['ranks']}")
        check(man["layout"].get("stage_layers") == [0, 1, 1, 0], f"chunk layers {man['layout'].get('stage_layers')}")
        got, _ = train(art, "pp2-ends-" + executor)
        compare(f"pp2 x virtual 2, balance = ends ({executor})", got, reference(art, DEFS),
                tol1=1e-6 if executor == "interp" else 1e-5)


def case_pp2_virtual2_native():
    virtual2("native")


def case_tp2_cp2():
    # context parallelism is ring attention: sends and receives around the context group
    arenas = {}
    for name, sp in (("tp2_cp2", "off"), ("tp2_cp2_sp", "on")):
        art, p = compile_art("art-" + name, ["--tp", "2", "--cp", "2", "--sp", sp])
        arenas[sp] = arena_of(p)
        got, _ = train(art, name)
        compare(name, got, reference(art), 1e-6, 1e-4)
    # sequence parallelism under it: the tensor group splits each rank's sequence chunk
    # again (spmd.c, convert_nested), so a rank keeps less between its blocks
    print(f"arena of stage 0: sp off {arenas['off']}, sp on {arenas['on']} bytes")
    check(arenas["on"] < arenas["off"], f"sequence parallelism under cp 2 saves no memory: {arenas}")


def ring_overlap(trace, exposed_share=0.0):
    """Each ring exchange starts at its send and is waited for at its receive (comm_ring.c over
    MPI's Isend / Irecv), with an attention kernel between the two on every rank: the block
    travels while the attention works on the one before it, forward and backward - but for
    `exposed_share` of them (a backward that receives the blocks again waits for its first)."""
    d = json.load(open(trace))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    for rank in sorted({e.get("pid") for e in ev if e.get("ph") == "X"}):
        names = [e["name"] for e in sorted((e for e in ev if e.get("pid") == rank and e.get("ph") == "X"), key=lambda e: e["ts"])
                 if e["name"].startswith("exchange_") or e["name"].endswith(".attention")]
        # a wait is for the oldest exchange started and not yet waited for (comm_ring.c)
        starts = hidden = 0
        pending = []
        for i, n in enumerate(names):
            if n == "exchange_start":
                starts += 1
                pending.append(i)
            elif n == "exchange_wait" and pending:
                j = pending.pop(0)
                hidden += any(m.endswith(".attention") for m in names[j + 1:i])
        check(starts > 0 and hidden == starts - round(exposed_share * starts),
              f"rank {rank}: {hidden} of {starts} ring exchanges have an attention under them")
        print(f"rank {rank}: {hidden} of {starts} ring exchanges run under an attention kernel (forward and backward)")


def case_cp_ring():
    # cp_comm = ring: attention over each block of keys and values as it comes around the
    # context group, the blocks' outputs merged by their log-sum-exp (spmd.c, ring_attention;
    # ATTN_MERGE) - the reference executor's numbers, in the reference executor and the
    # generated kernels, at cp 2, tp 2 x cp 2 x sp and under recomputation (ops keeps the
    # merge), and at cp 4 the allgather program's within fp32 rounding (the softmax summed in
    # another order) in the same arena (no block's output kept for the backward)
    for name, flags, executor in (("cp2", ["--cp", "2", "--dp", "1"], "interp"), ("cp2_native", ["--cp", "2", "--dp", "1"], "native"),
                                  ("tp2_cp2_sp", ["--tp", "2", "--cp", "2", "--sp", "on"], "native"),
                                  ("cp2_recompute_ops", ["--cp", "2", "--dp", "1", "--recompute", "ops"], "native"),
                                  ("cp2_recompute_full", ["--cp", "2", "--dp", "1", "--recompute", "full"], "native")):
        art, p = compile_art("art-ring-" + name, flags + ["--cp-comm", "ring"], executor=executor)
        trace = os.path.join(ARGS.work, f"ring-{name}.trace.json")
        got, _ = train(art, "ring-" + name, extra=["--profile", trace] if name == "cp2_native" else [])
        compare(f"cp_comm ring, {name} ({executor})", got, reference(art), 1e-6, 1e-4)
        if name == "cp2_native":
            ring_overlap(trace)
    runs, arenas = {}, {}
    for comm in ("allgather", "ring"):
        art, p = compile_art("art-cp4-" + comm, ["--cp", "4", "--dp", "1", "--cp-comm", comm], executor="native")
        arenas[comm] = arena_of(p)
        runs[comm], _ = train(art, "cp4-" + comm)
    print(f"cp 4 arena of stage 0: allgather {arenas['allgather']}, ring {arenas['ring']} bytes")
    check(arenas["ring"] <= arenas["allgather"], f"the ring keeps more than the gathered keys: {arenas}")
    worst = max(rel(a["loss"], b["loss"]) for a, b in zip(runs["ring"], runs["allgather"]))
    # the gathered ring at cp 4 too: the backward's transfers pair in order (fuse.c, rule 7)
    compare("cp 4, allgather (native)", runs["allgather"], reference(os.path.join(ARGS.work, "art-cp4-allgather")), 1e-6, 1e-4)
    print(f"cp 4: ring against allgather over {STEPS} steps, losses within {worst:.1e} (rel)")
    check(len(runs["ring"]) == STEPS and worst < 1e-5, f"cp 4: ring and allgather differ by {worst:.1e}")
    # under a recompute policy the blocks other ranks sent are received again in the backward
    # (autodiff.c, cp_rereceive), not kept per layer: a smaller arena, the same losses; the
    # ring's backward receives them the other way round, each under the attention before it
    # but the first: of a layer's 9 exchanges (3 forward, 3 again, 3 gradients) 1 waits; under
    # full recomputation the forward made again gets them the forward's way, 1 of 9 waiting too
    for comm, rc in (("allgather", "selective"), ("ring", "selective"), ("ring", "full")):
        art, p = compile_art(f"art-cp4-{rc}-{comm}", ["--cp", "4", "--dp", "1", "--cp-comm", comm, "--recompute", rc],
                             executor="native")
        trace = os.path.join(ARGS.work, f"cp4-{rc}-{comm}.trace.json")
        got, _ = train(art, f"cp4-{rc}-{comm}", extra=["--profile", trace] if comm == "ring" else [])
        if comm == "ring":
            ring_overlap(trace, exposed_share=1 / 9)
        arena = arena_of(p)
        worst = max(rel(a["loss"], b["loss"]) for a, b in zip(got, runs[comm]))
        print(f"cp 4, {comm}, recompute {rc}: arena {arena} bytes (none: {arenas[comm]}), losses within {worst:.1e} "
              f"of none's over {STEPS} steps")
        check(arena < arenas[comm], f"cp 4 {comm}: received blocks still kept under {rc} ({arena} >= {arenas[comm]})")
        check(len(got) == STEPS and worst < 1e-5, f"cp 4 {comm}: {rc} differs from none by {worst:.1e}")


def case_resume_same_layout():
    art, _ = compile_art("art", ["--pp", "2"])
    a, b = os.path.join(ARGS.work, "straight"), os.path.join(ARGS.work, "split")
    for x in (a, b):
        shutil.rmtree(x, ignore_errors=True)
    ma, _ = train(art, "a", extra=["--checkpoint-dir", a])
    train(art, "b", extra=["--checkpoint-dir", b, "--stop-at", "10"])
    check(rt.latest(b) == 10, "stopped at step 10 with a checkpoint")
    mb, p = train(art, "b", extra=["--checkpoint-dir", b, "--resume"])
    check("steps 11..20" in p.stdout, p.stdout)
    fa = open(os.path.join(a, "step-00000020.safetensors"), "rb").read()
    fb = open(os.path.join(b, "step-00000020.safetensors"), "rb").read()
    check(fa == fb, "20 steps and 10 + resume + 10 differ")
    check([(r["step"], r["loss"]) for r in ma] == [(r["step"], r["loss"]) for r in mb], "the same losses, step by step")
    print(f"resume_same_layout: {len(rt.ckpt(a, 20))} tensors identical after 10 + 10 steps at pp=2, "
          f"loss {ma[-1]['loss']:.9f}")


def case_resume_other_layout():
    pp2, _ = compile_art("art-pp2", ["--pp", "2"])
    a, b = os.path.join(ARGS.work, "straight"), os.path.join(ARGS.work, "split")
    for x in (a, b):
        shutil.rmtree(x, ignore_errors=True)
    train(pp2, "straight", extra=["--checkpoint-dir", a])
    train(pp2, "split", extra=["--checkpoint-dir", b, "--stop-at", "10"])
    ref = rt.ckpt(a, 20)
    for name, flags in (("dp2", ["--dp", "2"]), ("tp2", ["--tp", "2"])):
        art, _ = compile_art("art-" + name, flags)
        c = os.path.join(ARGS.work, "resumed-" + name)
        shutil.rmtree(c, ignore_errors=True)
        shutil.copytree(b, c)
        _, p = train(art, "resumed-" + name, extra=["--checkpoint-dir", c, "--resume"])
        check("steps 11..20" in p.stdout, p.stdout)
        diff = rt.max_diff(ref, rt.ckpt(c, 20))
        print(f"resume_other_layout: saved at pp=2 after 10 steps, resumed at {name}: max difference {diff:.2e} "
              f"after step 20 over {len(ref)} tensors")
        check(diff < 1e-5, f"resumed at {name}: max difference {diff}")


def case_vocab_pad():
    """A vocabulary of 201 tokens over tp=2 and tp=4 (parallel.vocab_pad's default 128): the
    table padded to 256 and 512 rows (two ranks of tp=4 hold padding only), its padded logits
    masked before the cross-entropy, so the runs give the unpadded reference's numbers; the
    manifest and the checkpoints keep the model's [201, 32]; a checkpoint of tp=2 resumes on
    one rank and at tp=4 with the generated kernels (VOCAB_MASK in the CPU back end)."""
    defs = [*DEFS, "-D", "V=201"]
    tp2, _ = compile_art("art-vpad-tp2", ["--tp", "2"], defs=defs)
    wte = next(q for q in json.load(open(os.path.join(tp2, "manifest.json")))["params"] if q["name"] == "wte.weight")
    check(wte["shape"] == [201, 32] and wte.get("padded_rows") == 256, f"the manifest's wte.weight: {wte}")
    a, b = os.path.join(ARGS.work, "vpad-straight"), os.path.join(ARGS.work, "vpad-split")
    for x in (a, b):
        shutil.rmtree(x, ignore_errors=True)
    got, _ = train(tp2, "vpad-tp2", extra=["--checkpoint-dir", a])
    compare("vocab_pad tp2 (256 rows)", got, reference(tp2, defs))
    ref = rt.ckpt(a, 20)
    check(len(ref["wte.weight"]) == 201 * 32, f"the checkpoint's wte.weight holds {len(ref['wte.weight'])} values")
    train(tp2, "vpad-split", extra=["--checkpoint-dir", b, "--stop-at", "10"])
    for name, flags, ex in (("one rank", [], "interp"), ("tp4 native", ["--tp", "4"], "auto")):
        art, _ = compile_art("art-vpad-" + name.replace(" ", "-"), flags, executor=ex, defs=defs)
        if name == "one rank":  # tensor 1: 256 rows would add over 1/16 of 201, so none
            w1 = next(q for q in json.load(open(os.path.join(art, "manifest.json")))["params"] if q["name"] == "wte.weight")
            check(w1["shape"] == [201, 32] and "padded_rows" not in w1, f"one rank's wte.weight: {w1}")
        c = os.path.join(ARGS.work, "vpad-resumed-" + name.replace(" ", "-"))
        shutil.rmtree(c, ignore_errors=True)
        shutil.copytree(b, c)
        _, p = train(art, "vpad-resumed", extra=["--checkpoint-dir", c, "--resume"])
        check("steps 11..20" in p.stdout, p.stdout)
        diff = rt.max_diff(ref, rt.ckpt(c, 20))
        print(f"vocab_pad: saved at tp=2 after 10 steps, resumed at {name}: max difference {diff:.2e} after step 20")
        check(diff < 1e-5, f"resumed at {name}: max difference {diff}")
    art, _ = compile_art("art-vpad-tp4", ["--tp", "4"], executor="auto", defs=defs)
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    got, _ = train(art, "vpad-tp4")
    compare(f"vocab_pad tp4 (512 rows, {ex})", got, reference(art, defs), tol1=1e-5 if ex != "interp" else 1e-6)
    # logits that reach anything but the cross-entropy would see the padding: refused, naming it
    d = os.path.join(ARGS.work, "art-vpad-softmax")
    p = run([tool("hpdlc"), "compile", os.path.join(HERE, "vocab_pad_softmax.hpd"), "-o", d], expect=1)
    one_error(p, "vocab_pad_softmax.hpd:12:9: error: the vocabulary is padded from 250 to 512 rows for tensor = 4",
              "this softmax reads the padded logits, which only cross_entropy masks")
    # tensor 1: 1000 rows padded to 1024 (at most 1/16 more: aligned rows for a GPU's GEMMs),
    # the same numbers as unpadded
    d1k = [*DEFS, "-D", "V=1000"]
    art, _ = compile_art("art-vpad-1000", [], executor="auto", defs=d1k)
    w1 = next(q for q in json.load(open(os.path.join(art, "manifest.json")))["params"] if q["name"] == "wte.weight")
    check(w1["shape"] == [1000, 32] and w1.get("padded_rows") == 1024 and w1["split"] is None, f"one rank's wte.weight: {w1}")
    got, _ = train(art, "vpad-1000")
    compare("vocab_pad one rank (1000 -> 1024 rows)", got, reference(art, d1k))
    # at tensor 1 the padding is an optimisation: the same model keeps its 250 rows, no error
    d1 = os.path.join(ARGS.work, "art-vpad-softmax-tp1")
    run([tool("hpdlc"), "compile", os.path.join(HERE, "vocab_pad_softmax.hpd"), "--tp", "1", "-o", d1])
    w1 = next(q for q in json.load(open(os.path.join(d1, "manifest.json")))["params"] if q["name"] == "wte.weight")
    check("padded_rows" not in w1, f"tensor 1, padded logits read by a softmax: {w1}")
    # the planner gives the same reason for the layout it cannot price
    p = run([tool("hpdlc"), "plan", os.path.join(HERE, "vocab_pad_softmax.hpd")], expect=1)
    check("not valid: the model does not partition over tp=4 cp=1: the vocabulary is padded from 250 to 512 rows" in p.stdout
          and "only cross_entropy masks" in p.stdout, p.stdout)


def one_error(p, *needles):
    err = p.stderr + p.stdout
    for n in needles:
        check(n in err, f"the message lacks {n!r}: {err!r}")
    check("Traceback" not in err and "Segmentation" not in err, err)


def case_missing_file():
    art, _ = compile_art("art", [])
    d = os.path.join(ARGS.work, "broken")
    # the manifest's file list is checked first (artifact_check_files)
    for f, needles in (("stage0.hir", ["missing artifact file", "stage0.hir", "the manifest lists it"]),
                       ("program.so", ["missing artifact file", "program.so", "ranks[0].program"]),
                       ("manifest.json", ["missing artifact file", "manifest.json"])):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(art, d)
        os.remove(os.path.join(d, f))
        _, p = train(d, "broken", expect=1)
        one_error(p, *needles)
        print(f"missing {f}: {(p.stderr.strip() or p.stdout.strip()).splitlines()[-1]}")
    # a damaged chunk file: the checksum
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(art, d)
    path = os.path.join(d, "stage0.hir")
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0x40
    open(path, "wb").write(raw)
    _, p = train(d, "broken", expect=1)
    one_error(p, "stage0.hir", "corrupted")
    open(path, "wb").write(raw[:100])
    _, p = train(d, "broken", expect=1)
    one_error(p, "stage0.hir", "truncated")
    print(f"damaged stage0.hir: {p.stderr.strip().splitlines()[-1]}")
    # kernels named by the manifest but missing (native artifacts)
    man = json.load(open(os.path.join(d, "manifest.json")))
    man["program"]["executor"] = "native"
    man["ranks"][0]["kernels"] = "stage0.so"
    shutil.copy(os.path.join(art, "stage0.hir"), path)
    json.dump(man, open(os.path.join(d, "manifest.json"), "w"))
    _, p = train(d, "broken", expect=1)
    one_error(p, "missing artifact file", "stage0.so", "ranks[0].kernels")


def case_self_contained():
    art, _ = compile_art("art", ["--pp", "2"])
    man = json.load(open(os.path.join(art, "manifest.json")))
    for r in man["ranks"]:
        for k in ("program", "module", "kernels"):
            if k in r:
                check(not os.path.isabs(r[k]) and os.path.exists(os.path.join(art, r[k])), f"ranks: {r[k]}")
    ldd = run(["ldd", os.path.join(art, "program.so")]).stdout
    for tree in (ARGS.source, os.path.dirname(ARGS.bin)):
        check(tree not in ldd, f"program.so needs a library of {tree}:\n{ldd}")
    moved = os.path.join(ARGS.work, "elsewhere", "job")
    shutil.rmtree(os.path.dirname(moved), ignore_errors=True)
    os.makedirs(os.path.dirname(moved))
    shutil.move(art, moved)
    got, _ = train(moved, "moved", env={"HPDL_PROGRAM_LIB": "/nonexistent"})
    check(len(got) == STEPS, "trained from the moved artifact")
    print(f"self_contained: moved artifact trained, loss {got[0]['loss']:.6f} -> {got[-1]['loss']:.6f}; "
          f"program.so needs only: {', '.join(sorted(l.split()[0] for l in ldd.splitlines() if '=>' in l))}")


def case_anomaly():
    """tests/compile/anomaly.hpd takes sqrt of values that can be negative: its
    first step's loss is NaN. hpdlrun stops with "the run diverged", naming the
    first bad gradient; with --detect-anomaly (the reference executor, every
    op's values checked) it names the sqrt, its graph and the .hpd line, on one
    rank and on two (dp 2); a --target cuda artifact is refused."""
    src = os.path.join(ARGS.source, "tests", "compile", "anomaly.hpd")
    for name, flags in (("one", []), ("dp2", ["--dp", "2", "--gpus-per-node", "2", "--global-batch", "4"])):
        art = os.path.join(ARGS.work, "anomaly-" + name)
        shutil.rmtree(art, ignore_errors=True)
        run([tool("hpdlc"), "compile", src, *flags, "-o", art, "-q"])
        _, p = train(art, "anomaly-" + name, steps=3, expect=1)
        one_error(p, "step 1: the loss is", "the run diverged", "the first gradient in the model's order with values that are "
                  "not finite: wte.weight")
        _, p = train(art, "anomaly-" + name, steps=3, extra=["--detect-anomaly"], expect=1)
        one_error(p, "anomaly: sqrt %", "(graph forward.grad, from " + src + ":14:9) made NaN at element")
        check("diverged" not in p.stderr, "--detect-anomaly stopped at the op, before the step's end")
        print(f"anomaly ({name}): {p.stderr.strip().splitlines()[0]}")
    cuda = os.path.join(ARGS.work, "anomaly-cuda")
    os.makedirs(cuda, exist_ok=True)
    man = json.load(open(os.path.join(ARGS.work, "anomaly-one", "manifest.json")))
    man["target"] = "cuda"
    man.pop("files", None)
    json.dump(man, open(os.path.join(cuda, "manifest.json"), "w"))
    for f in ("program.so", "stage0.hir"):
        shutil.copy(os.path.join(ARGS.work, "anomaly-one", f), cuda)
    p = run([tool("hpdlrun"), cuda, "--detect-anomaly"], expect=1)
    one_error(p, "--detect-anomaly runs the reference executor on the CPU")


def case_cli():
    hpdlc = tool("hpdlc")
    out = os.path.join(ARGS.work, "x")
    shutil.rmtree(out, ignore_errors=True)
    p = run([hpdlc, "--help"])
    check("compile FILE -o DIR" in p.stdout, "the main help lists compile")
    p = run([hpdlc, "compile", "--help"])
    check("--executor" in p.stdout and "-o DIR" in p.stdout, p.stdout)
    p = run([hpdlc, "compile", sample()], expect=2)
    one_error(p, "missing the artifact folder (-o DIR)")
    p = run([hpdlc, "compile", sample(), "--target", "rocm", "-o", out], expect=2)
    one_error(p, "unknown target 'rocm' (there are: cpu, cuda)")
    p = run([hpdlc, "compile", sample(), "--arch", "sm_90", "-o", out], expect=2)
    one_error(p, "--arch sm_90 applies to --target cuda only")
    p = run([hpdlc, "compile", sample(), "--target", "cuda", "--arch", "gfx90a", "-o", out], expect=2)
    one_error(p, "--arch takes a GPU architecture such as sm_80")
    p = run([hpdlc, "compile", sample(), "--target", "cuda", "--executor", "interp", "-o", out], expect=1)
    one_error(p, "--executor interp runs the reference executor on the CPU")
    p = run([hpdlc, "compile", sample(), "--executor", "fast", "-o", out], expect=2)
    one_error(p, "--executor takes auto, native or interp")
    p = run([hpdlc, "compile", sample(), sample(), "-o", out], expect=2)
    one_error(p, "exactly one file")
    # --color: the diagnostics' escapes always or never; emit --stage: another stage's program, one past the last refused
    bad_src = os.path.join(ARGS.source, "tests", "errors", "sema_unknown_name.hpd")
    p = run([hpdlc, "check", bad_src, "--color", "always"], expect=1)
    check("\x1b[1;31merror:\x1b[0m unknown name 'hiden'" in p.stderr, repr(p.stderr))
    p = run([hpdlc, "check", bad_src, "--color", "never"], expect=1)
    check("error: unknown name 'hiden'" in p.stderr and "\x1b" not in p.stderr, repr(p.stderr))
    emits = [run([hpdlc, "emit", "cuda", sample(), *DEFS, "--pp", "2", "--stage", k]) for k in ("0", "1")]
    check(all(e.stdout.startswith("/* generated by hpdlc") for e in emits) and emits[0].stdout != emits[1].stdout,
          "emit cuda --stage 0 and 1: two stages' sources")
    p = run([hpdlc, "emit", "cuda", sample(), *DEFS, "--pp", "2", "--stage", "2"], expect=1)
    one_error(p, "--stage 2: the layout has 2 pipeline stages (0..1)")
    # an option where a value belongs is not taken for the value (nor what follows it for a file)
    p = run([hpdlc, "compile", sample(), "--tp", "--pp", "2", "-o", out], expect=2)
    one_error(p, "--tp needs a value (N|auto)")
    p = run([hpdlc, "compile", sample(), "-o", "--tp", "2"], expect=2)
    one_error(p, "-o needs a value")
    p = run([hpdlc, "plan", sample(), "--scaling", "--tp", "2"], expect=2)
    one_error(p, "--scaling needs a value")
    p = run([hpdlc, "compile", sample(), "--tp", "auto", "-o", out], expect=1)
    one_error(p, "concrete layout", "parallel.tensor is auto", "--tp N")
    moe = os.path.join(ARGS.source, "samples", "moe-tiny.hpd")
    p = run([hpdlc, "compile", moe, "--tp", "2", "--dp", "2", "--gpus", "4", "--ep", "2", "--etp", "auto", "-o", out], expect=1)
    one_error(p, "concrete layout", "parallel.expert_tensor is auto", "--etp 1 or --etp 2")
    p = run([hpdlc, "compile", sample(), *DEFS, "--moments", "fp16", "-o", out], expect=2)
    one_error(p, "--moments fp16: unknown moments 'fp16'; it is fp32 or bf16")
    p = run([hpdlc, "compile", moe, "--dp", "2", "--gpus", "2", "--ep", "2", "--dispatcher", "deepep", "-o", out], expect=1)
    one_error(p, "dispatcher = deepep is priced by hpdlc plan, but the runtime exchanges the experts' tokens with NCCL's or MPI's "
                 "all-to-all")
    p = run([hpdlc, "compile", sample(), *DEFS, "--dispatcher", "nccl", "-o", out], expect=2)
    one_error(p, "--dispatcher nccl")
    # cp_comm = ring compiles (attention a block at a time, case_cp_ring runs it); the manifest says so
    ring2 = work("ring-cp2")
    p = run([hpdlc, "compile", sample(), *DEFS, "--cp", "2", "--gpus", "2", "--cp-comm", "ring", "--executor", "interp", "-q",
             "-o", ring2])
    said = json.load(open(os.path.join(ring2, "manifest.json")))["layout"].get("cp_comm")
    check(said == "ring", f"the manifest says cp_comm {said}, not ring")
    p = run([hpdlc, "compile", sample(), *DEFS, "--cp", "2", "--gpus", "2", "--cp-comm", "ring", "--attention", "materialized",
             "-o", out], expect=1)
    one_error(p, "cp_comm = ring runs the attention op a block of keys at a time", "compile with cp_comm = allgather")
    ring1 = work("ring-cp1")
    p = run([hpdlc, "compile", sample(), *DEFS, "--cp-comm", "ring", "--executor", "interp", "-q", "-o", ring1])
    check(os.path.exists(os.path.join(ring1, "manifest.json")), "cp_comm = ring without context parallelism compiles")
    # cp_comm = auto is the planner's to choose: compile asks for one where there is context parallelism
    p = run([hpdlc, "compile", sample(), *DEFS, "--cp", "2", "--gpus", "2", "--cp-comm", "auto", "-o", out], expect=1)
    one_error(p, "compile needs a concrete layout, but parallel.cp_comm is auto (choose it with --cp-comm allgather or "
                 "--cp-comm ring, or let `hpdlc plan --search` suggest one)")
    auto1 = work("auto-cp1")
    p = run([hpdlc, "compile", sample(), *DEFS, "--cp-comm", "auto", "--executor", "interp", "-q", "-o", auto1])
    check(os.path.exists(os.path.join(auto1, "manifest.json")), "cp_comm = auto without context parallelism compiles")
    p = run([hpdlc, "compile", sample(), *DEFS, "--pp", "2", "--virtual-stages", "2", "--schedule", "1f1b", "-D", "L=4", "-o", out],
            expect=1)
    one_error(p, "virtual stages need schedule = interleaved")
    p = run([hpdlc, "compile", sample(), *DEFS, "--tp", "3", "-o", out], expect=1)
    check("error" in p.stderr and not os.path.exists(os.path.join(out, "manifest.json")), p.stderr)
    p = run([hpdlc, "compile", sample(), *DEFS, "-o", "/proc/forbidden/x"], expect=1)
    one_error(p, "cannot make the output folder /proc/forbidden/x")
    p = run([hpdlc, "compile", sample(), *DEFS, "-o", out], env={"HPDL_PROGRAM_LIB": "/nonexistent/p.so"}, expect=1)
    one_error(p, "the CPU program /nonexistent/p.so is missing")
    p = run([hpdlc, "compile", "-q", sample(), *DEFS, "--executor", "interp", "-o", out])
    check(p.stdout == "" and os.path.exists(os.path.join(out, "manifest.json")), "-q prints nothing")
    print("cli: every error above exits 2 (command line) or 1 (the model or layout), with its message")


def case_native():
    first = True
    for name, flags in (("one_rank", []), ("tp2", ["--tp", "2"]), ("pp2", ["--pp", "2"])):
        # auto: a stage the back end cannot compile runs the reference executor ("mixed")
        art, p = compile_art("art-native-" + name, flags, executor="auto")
        ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
        if first and ex == "interp":
            print("skipped: the CPU back end is not built into this hpdlc (or cannot compile the model): " + p.stderr.strip())
            sys.exit(SKIP)
        first = False
        check(ex in ("native", "mixed"), f"{name}: executor {ex}")
        got, _ = train(art, "native-" + name)
        compare(f"{ex} {name}", got, reference(art), tol1=1e-5, tol20=1e-4)
    # the pp2 stages' steps come in two parts, so the schedule runs them apart
    import ctypes
    for st in (0, 1):
        lib = ctypes.CDLL(os.path.join(art, f"stage{st}.so"))
        for part in ("F", "B"):
            check(hasattr(lib, f"hpd_graph_chunk{st}_grad_{part}"), f"stage {st}: no {part} part in the kernels")
    seq, _ = train(art, "native-sequential", steps=5, env={"HPDL_PIPELINE_ORDER": "sequential"})
    check([r["loss"] for r in seq] == [r["loss"] for r in got[:5]], "1F1B and one micro-batch in flight give other losses")
    # the same artifact through the reference executor: the oracle at run time
    got, _ = train(art, "native-as-interp", env={"HPDL_EXECUTOR": "interp"})
    compare("pp2 kernels' artifact with HPDL_EXECUTOR=interp", got, reference(art))


def case_native_threads():
    # the generated kernels' rows on the rank's threads (hpd_ctx.parallel, runtime/pool.c):
    # every loss, gradient norm and checkpoint byte the same at 1, 2 and 3 threads, with
    # HPDL_PARALLEL_MIN=0 splitting every splittable loop however small (ranges of one row)
    # and at the default threshold; odd sizes so that ranges are uneven; "wide" so
    # that GEMMs are cut into blocks (hpd_ctx.gemm_f32, runtime/program_exec.c: the
    # MLP's [512, 256] x [256, 1024] into 4 column blocks, the head's rows in 2), whose
    # bits must not depend on which thread runs a block
    for name, defs in (("even", DEFS), ("odd", ["-D", "C=48", "-D", "T=13", "-D", "L=2", "-D", "H=3"]),
                       ("wide", ["-D", "C=256", "-D", "T=64", "-D", "L=1", "-D", "H=4"])):
        art, p = compile_art("art-threads-" + name, [], executor="auto", defs=defs)
        ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
        if ex == "interp":
            print("skipped: the CPU back end is not built into this hpdlc: " + p.stderr.strip())
            sys.exit(SKIP)
        nm = shutil.which("nm")
        if nm and name != "wide":  # the splittable kernels are there: a body and a range each
            syms = run([nm, os.path.join(art, "stage0.so")]).stdout
            ranges = [ln.split()[-1] for ln in syms.splitlines() if ln.endswith(".range")]
            kinds = {r.split(".")[-2] for r in ranges}
            check({"row", "loop", "copy", "special"} <= kinds, f"{name}: split kernels of kinds {sorted(kinds)}")
        runs = {}
        for threads, least in ((1, "0"), (2, "0"), (3, "0"), (2, None)):
            tag = f"threads-{name}-{threads}-{least or 'default'}"
            ck = work(tag + "-ckpt")
            shutil.rmtree(ck, ignore_errors=True)
            env = {"HPDL_PARALLEL_MIN": least} if least else None
            got, _ = train(art, tag, steps=3 if name == "wide" else 10, extra=["--threads", str(threads), "--checkpoint-dir", ck],
                           env=env)
            files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
            check(files, f"{tag}: no checkpoint")
            with open(os.path.join(ck, files[-1]), "rb") as f:
                runs[tag] = ([(r["loss"], r["grad_norm"]) for r in got], f.read())
        first = next(iter(runs))
        for tag, (steps, blob) in runs.items():
            check(steps == runs[first][0], f"{tag}: losses / gradient norms differ from {first}: {steps} {runs[first][0]}")
            check(blob == runs[first][1], f"{tag}: the checkpoint's bytes differ from {first}'s")
        print(f"{name}: {len(runs)} runs, {len(runs[first][0])} steps each, identical (loss {runs[first][0][-1][0]})")


# the reference executor's layout for a sample whose parallel block spreads it over ranks
ONE_RANK = ["-L", "parallel.cluster=cpu", "-L", "parallel.nodes=1", "-L", "parallel.gpus=1", "-L", "parallel.data=1",
            "-L", "parallel.tensor=1", "-L", "parallel.sequence=off"]


def case_qwen3_window():
    # Qwen3's attention (a head width of 16 over C / H = 8, RMSNorm of queries and keys,
    # grouped queries) with a sliding window of 5 keys over 16, at tp 2 x cp 2 (the window
    # across the ring's blocks): the native host op against the reference executor
    global SAMPLE
    SAMPLE = "qwen3.hpd"
    defs = ["-D", "layers=2", "-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "head_dim=16", "-D", "ffn=64",
            "-D", "seq=16", "-D", "vocab=256", "-D", "window=5"]
    flags = ["--cluster", "cpu", "--nodes", "1", "--gpus", "4", "--dp", "1", "--tp", "2", "--cp", "2", "--sp", "off",
             "--zero", "0", "--recompute", "none", "--micro-batch", "2", "--global-batch", "4", "--precision", "fp32"]
    art, p = compile_art("art-qwen3", flags, executor="auto", defs=defs)
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    got, _ = train(art, "qwen3-" + ex)
    compare(f"qwen3 window=5 tp2 cp2 ({ex})", got, reference(art, defs + ONE_RANK), tol1=1e-5, tol20=1e-4)
    # materialised attention has no window: refused at compile time, saying so
    _, p = compile_art("art-qwen3-mat", flags + ["--attention", "materialized"], defs=defs, expect=1)
    check("has no materialised form" in p.stderr, p.stderr)


def case_gptoss_cp4():
    # GPT-OSS's layers (a window of 4 keys on every other layer, attention sinks, 4 experts
    # of which 2 a token) at cp 4 over the ring, tp 2 with sp, nothing recomputed: each layer
    # saves its own and the received key / value blocks of every ring step, more than the 64
    # stash slots the CPU back end held a SAVE call to until 2026-12-07 ("call %7 has no stash
    # in the memory plan", found by compile.layout_sweep at seed 4901); the native program
    # against the reference executor at one rank
    global SAMPLE
    SAMPLE = "gpt-oss.hpd"
    defs = ["-D", "layers=4", "-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "head_dim=8", "-D", "ffn=16",
            "-D", "vocab=256", "-D", "seq=16", "-D", "experts=4", "-D", "top_k=2", "-D", "window=4"]
    flags = ["--cluster", "cpu", "--nodes", "1", "--gpus", "8", "--dp", "1", "--tp", "2", "--pp", "1", "--cp", "4", "--sp", "on",
             "--ep", "1", "--cp-comm", "ring", "--zero", "0", "--recompute", "none", "--micro-batch", "2",
             "--global-batch", "4", "--precision", "fp32"]
    art, p = compile_art("art-gptoss-cp4", flags, executor="native", defs=defs)
    got, _ = train(art, "gptoss-cp4")
    one = ONE_RANK + ["-L", "parallel.pipeline=1", "-L", "parallel.expert=1"]  # the file's own layout: pp 4, ep 8
    # the sample warms its learning rate up over 2000 steps: over these few the loss need not fall
    compare("gpt-oss tp2 cp4 ring, recompute none (native)", got, reference(art, defs + one), tol1=1e-5, tol20=1e-4,
            falls=False)


def case_mla_sp():
    # DeepSeek-V3's multi-latent attention (its rotary key one head: [B, T, r] sliced from
    # the latent, reshaped to [B, 1, T, r] and all-gathered along T under sequence
    # parallelism; YaRN's frequencies) beside sigmoid-scored experts (mla.hpd), at tp 2 with
    # sp: the native program against the reference executor at one rank. Until 2026-12-07
    # the CPU back end placed a gather's chunks along the axis of the memory behind the
    # reshape (another rank), scrambling the key's positions: DeepSeek-V3's step 1 off by
    # 6e-6 (loss) and 2e-5 (gradient norm), found by an emulated-device sweep
    # (tests/cuda/random_layouts.py), whose device program was right
    global SAMPLE
    SAMPLE = os.path.join(HERE, "mla.hpd")
    flags = ["--cluster", "cpu", "--nodes", "1", "--gpus", "2", "--dp", "1", "--tp", "2", "--sp", "on", "--zero", "0",
             "--recompute", "none", "--precision", "fp32"]
    defs = ["-D", "seq=16"]  # the file's own sizes (an empty list would mean the default sample's)
    art, p = compile_art("art-mla-sp", flags, executor="native", defs=defs)
    got, _ = train(art, "mla-sp")
    compare("MLA and experts, tp2 sp (native)", got, reference(art, defs + ONE_RANK), tol1=1e-6, tol20=1e-4)


# a two-layer Llama on one CPU rank (recompute_ops, recompute_act)
TINY_LLAMA_DEFS = ["-D", "layers=2", "-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=64", "-D", "seq=16",
                   "-D", "vocab=256"]
TINY_LLAMA_FLAGS = ["--cluster", "cpu", "--nodes", "1", "--gpus", "1", "--dp", "1", "--tp", "1", "--sp", "off", "--zero", "0",
                    "--micro-batch", "2", "--global-batch", "4", "--precision", "fp32"]


def case_recompute_ops():
    """recompute = ops (torchtitan's op-level selective checkpointing, compiler/ir/autodiff.c
    ops_policy): a block keeps its attention outputs and every other weight GEMM's output and
    recomputes the rest. The losses and gradient norms are those of no recomputation (the
    reference executor's) in the reference executor and the generated kernels, at 1 rank and at
    tp 2 x pp 2 (collectives kept, not repeated); the arena lies between none's and full's; a
    Llama block (RMSNorm, rotary, SwiGLU) gives the same as without recomputation too."""
    arenas, arts = {}, {}
    for rc in ("none", "ops", "full"):
        arts[rc], p = compile_art("art-rc-" + rc, ["--recompute", rc])
        arenas[rc] = arena_of(p)
        said = json.load(open(os.path.join(arts[rc], "manifest.json")))["compiler"]["recompute"]
        check(said == rc, f"the manifest says recompute {said}, not {rc}")
    print(f"arena of stage 0: none {arenas['none']}, ops {arenas['ops']}, full {arenas['full']} bytes")
    check(arenas["full"] < arenas["ops"] < arenas["none"], f"arenas not ordered full < ops < none: {arenas}")
    art = arts["ops"]
    base, _ = train(arts["none"], "rc-none")
    got, _ = train(art, "rc-ops")
    compare("recompute ops, 1 rank (interp)", got, reference(art))
    check([(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in base],
          "recompute ops: the losses are not bit for bit those of recompute none")
    art, p = compile_art("art-rc-ops-native", ["--recompute", "ops"], executor="auto")
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    if ex != "interp":
        got, _ = train(art, "rc-ops-native")
        compare(f"recompute ops, 1 rank ({ex})", got, reference(art), tol1=1e-5, tol20=1e-4)
    layout_case("recompute_ops_tp2_pp2", ["--recompute", "ops", "--tp", "2", "--pp", "2", "--schedule", "1f1b"])
    global SAMPLE
    SAMPLE = "llama.hpd"
    defs, flags = TINY_LLAMA_DEFS, TINY_LLAMA_FLAGS
    art, _ = compile_art("art-rc-llama", flags + ["--recompute", "ops"], executor="auto", defs=defs)
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    got, _ = train(art, "rc-llama")
    compare(f"llama, recompute ops ({ex})", got, reference(art, defs + ONE_RANK), tol1=1e-5, tol20=1e-4)


def case_recompute_act():
    """recompute = act (compiler/ir/autodiff.c, gated_product; Megatron-Core's recompute module
    moe_act): a Llama block's SwiGLU product silu(gate) x up, the down projection's input, is made
    again in the backward from the kept gate and up instead of kept. The losses and gradient
    norms are bit for bit those of recompute none in the reference executor; the generated
    kernels and tp 2 (the product of each rank's half of the hidden units) within the usual
    tolerances of the reference's; the arena is smaller; the manifest says act."""
    global SAMPLE
    SAMPLE = "llama.hpd"
    defs, flags = TINY_LLAMA_DEFS, TINY_LLAMA_FLAGS
    arenas, arts = {}, {}
    for rc in ("none", "act"):
        arts[rc], p = compile_art("art-act-" + rc, flags + ["--recompute", rc], defs=defs)
        arenas[rc] = arena_of(p)
    said = json.load(open(os.path.join(arts["act"], "manifest.json")))["compiler"]["recompute"]
    check(said == "act", f"the manifest says recompute {said}, not act")
    print(f"arena of stage 0: none {arenas['none']}, act {arenas['act']} bytes")
    check(arenas["act"] < arenas["none"], f"the arena under act is not smaller than under none: {arenas}")
    base, _ = train(arts["none"], "act-none")
    got, _ = train(arts["act"], "act-interp")
    compare("llama, recompute act, 1 rank (interp)", got, reference(arts["act"], defs + ONE_RANK))
    check([(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in base],
          "recompute act: the losses are not bit for bit those of recompute none")
    art, _ = compile_art("art-act-native", flags + ["--recompute", "act"], executor="auto", defs=defs)
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    got, _ = train(art, "act-native")
    compare(f"llama, recompute act, 1 rank ({ex})", got, reference(art, defs + ONE_RANK), tol1=1e-5, tol20=1e-4)
    tp2 = flags + ["--gpus", "2", "--tp", "2", "--recompute", "act"]  # the later flag wins
    art, _ = compile_art("art-act-tp2", tp2, executor="auto", defs=defs)
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    got, _ = train(art, "act-tp2")
    compare(f"llama, recompute act, tp 2 ({ex})", got, reference(art, defs + ONE_RANK), tol1=1e-5, tol20=1e-4)


def case_recompute_layers():
    """parallel.recompute_layers (autodiff.h, ad_build_layers; Megatron-LM's --recompute-method block
    --recompute-num-layers): the policy takes the first N layers of each pipeline chunk and the rest
    keep their activations, a repeat's call split in two (B.fwd then B.keep.fwd, their backward
    calls in reverse). gpt2-tiny's 2 layers, full recomputation of the first: the losses and
    gradient norms bit for bit those of no recomputation and the reference's, in the reference
    executor and the generated kernels; the arena between full's and none's; the manifest says so;
    tp 2 (the collectives of both halves) against the reference."""
    arenas, arts = {}, {}
    for name, flags in (("none", ["--recompute", "none"]), ("full", ["--recompute", "full"]),
                        ("full1", ["--recompute", "full", "--recompute-layers", "1"])):
        arts[name], p = compile_art("art-rl-" + name, flags)
        arenas[name] = arena_of(p)
    said = json.load(open(os.path.join(arts["full1"], "manifest.json")))["compiler"]
    check(said.get("recompute") == "full" and said.get("recompute_layers") == 1, f"the manifest says {said}")
    print(f"arena of stage 0: none {arenas['none']}, full on 1 of 2 layers {arenas['full1']}, full {arenas['full']} bytes")
    check(arenas["full"] < arenas["full1"] < arenas["none"], f"arenas not ordered full < full1 < none: {arenas}")
    base, _ = train(arts["none"], "rl-none")
    got, _ = train(arts["full1"], "rl-full1")
    compare("recompute full on the first layer, 1 rank (interp)", got, reference(arts["full1"]))
    check([(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in base],
          "recompute_layers: the losses are not bit for bit those of recompute none")
    art, _ = compile_art("art-rl-native", ["--recompute", "full", "--recompute-layers", "1"], executor="auto")
    ex = json.load(open(os.path.join(art, "manifest.json")))["program"]["executor"]
    if ex != "interp":
        got, _ = train(art, "rl-native")
        compare(f"recompute full on the first layer, 1 rank ({ex})", got, reference(art), tol1=1e-5, tol20=1e-4)
    layout_case("recompute_layers_tp2", ["--recompute", "full", "--recompute-layers", "1", "--tp", "2"])


def arena_of(p):
    """The arena of stage 0 from hpdlc compile's summary."""
    for line in p.stdout.splitlines():
        if line.strip().startswith("stage 0:") and "arena" in line:
            return int(line.split("arena ")[1].split()[0])
    raise Fail(f"no arena in:\n{p.stdout}")


def case_mixed_precision():
    """bf16 and fp16 storage on the CPU target (compiler/ir/precision.h): activations and their
    gradients stored in 16 bits, computed in fp32. 20 steps within 2e-2 of fp32's losses (and not
    fp32's: the storage is there); the arena smaller; the generated kernels give the reference
    executor's bf16 run (which rounds every 16-bit value) within 1e-5 at step 1; dp 2, tp 2, pp 2,
    cp 2, ZeRO-3 and tp 2 x pp 2 x dp 2 give one rank's bf16 losses within 1e-3; a static fp16
    loss scale of 1e12 overflows the gradients stored in fp16 (1e12 times a gradient of 1e-4 is
    past 65504, far inside fp32) and every step is skipped. The bf16 run's start-up line names
    its GEMMs' path (hpdlrun: "bf16 GEMMs by oneDNN ..." or "... by fp32 sgemm: why"), fp16's not."""
    base, p32 = compile_art("art-mp-fp32", [], executor="auto")
    f32, _ = train(base, "mp-fp32")
    arena32 = arena_of(p32)
    ref16 = {}
    for prec in ("bf16", "fp16"):
        art, p = compile_art("art-mp-" + prec, ["--precision", prec], executor="auto")
        check(f"{prec} storage" in p.stdout or "interp" in p.stdout, p.stdout)
        # bf16's GEMMs read the weights' bf16 copies, which the runtime rounds once per step (the
        # reference executor rounds them as it reads them: a copy left stale fails the comparison below)
        once = re.search(r"(\d+) weights multiplied from bf16 copies rounded once per step", p.stdout)
        check(bool(once and int(once.group(1)) > 0) == (prec == "bf16"), f"{prec}: the weights' 16-bit copies: {p.stdout}")
        got, tp = train(art, "mp-" + prec)
        # the start-up line names the bf16 GEMMs' path (oneDNN's, or why they widen to fp32)
        says = "bf16 GEMMs by " in tp.stdout + tp.stderr
        check(says == (prec == "bf16"), f"{prec}: the start-up line: {(tp.stdout + tp.stderr).splitlines()[:1]}")
        worst = max(rel(a["loss"], b["loss"]) for a, b in zip(got, f32))
        print(f"{prec}: 20 losses within {worst:.1e} of fp32's (step 20: {got[-1]['loss']:.6f} against "
              f"{f32[-1]['loss']:.6f}); arena {arena_of(p)} bytes against fp32's {arena32}")
        check(len(got) == STEPS and worst < 2e-2, f"{prec}: off fp32 by {worst:.2e}")
        check(worst > 1e-7, f"{prec}: the losses are fp32's ({worst:.1e}): nothing is stored in 16 bits")
        check(arena_of(p) < 0.85 * arena32, f"{prec}: arena {arena_of(p)} against fp32's {arena32}")
        ref16[prec] = got
        if prec == "bf16":
            # the weights' bf16 copies after a resume: rounded from the loaded values (the
            # optimizer writes them with its update, the program rounds the rest): bit for bit
            ck = os.path.join(ARGS.work, "mp-bf16-ck")
            shutil.rmtree(ck, ignore_errors=True)
            train(art, "mp-bf16-half", steps=10, extra=("--checkpoint-dir", ck, "--checkpoint-every", "10"))
            resumed, _ = train(art, "mp-bf16-half", extra=("--checkpoint-dir", ck, "--resume"))
            after = [r["loss"] for r in resumed if r["step"] > 10]
            check(after == [r["loss"] for r in got[10:]], f"bf16 resumed at step 10: {after} against {[r['loss'] for r in got[10:]]}")
    # a parameter's gradient is made in fp32 (the tied table's sum of the head's and the lookup's
    # gradients was rounded to bf16 and widened at the graph's output), and the tied table's two
    # are gradient outputs of their own, not added in the graph first
    mem = run([tool("hpdlc"), "emit", "memory", sample(), *DEFS, "--precision", "bf16"]).stdout
    outs = [l.split(":")[0].split()[1:] for l in mem.splitlines() if l.rstrip().endswith("ret]")]
    tied = sorted(o[0] for o in outs if o[-2:] == ["f32[256,", "32]"] or o[-2:] == ["bf16[256,", "32]"])
    check(tied == ["embedding_bwd", "matmul"], f"the tied table's gradient outputs: {tied}")
    interp, p = compile_art("art-mp-bf16-interp", ["--precision", "bf16"], executor="interp")
    check("rounding to bf16 storage" in p.stdout, p.stdout)
    got, _ = train(interp, "mp-bf16-interp")
    compare("bf16 generated kernels against the reference executor's bf16", ref16["bf16"], got, tol1=1e-5, tol20=1e-4)
    for name, flags in (("dp2", ["--dp", "2"]), ("tp2", ["--tp", "2"]), ("pp2", ["--pp", "2"]), ("cp2", ["--cp", "2"]),
                        ("zero3", ["--dp", "2", "--zero", "3"]), ("dp2_tp2_pp2", ["--dp", "2", "--tp", "2", "--pp", "2"])):
        art, _ = compile_art("art-mp-" + name, ["--precision", "bf16", *flags], executor="auto")
        got, _ = train(art, "mp-" + name)
        worst = max(rel(a["loss"], b["loss"]) for a, b in zip(got, ref16["bf16"]))
        print(f"bf16 {name}: 20 losses within {worst:.1e} of one rank's bf16")
        check(len(got) == STEPS and worst < 1e-3, f"bf16 {name}: off one rank by {worst:.2e}")
    # a static scale that overflows fp16 (65504) but not fp32: every step skipped, the loss unchanged
    src = open(sample()).read().replace("precision = fp32", "precision = fp16\n  loss_scale = 1e12")
    check("loss_scale = 1e12" in src, "the sample's train block changed its form")
    hpd = os.path.join(work("mp-overflow"), "gpt2-tiny-fp16.hpd")
    open(hpd, "w").write(src)
    d = os.path.join(ARGS.work, "art-mp-overflow")
    shutil.rmtree(d, ignore_errors=True)
    run([tool("hpdlc"), "compile", hpd, *DEFS, "--executor", "auto", "-o", d])
    got, _ = train(d, "mp-overflow", steps=4)
    check([r["skipped"] for r in got] == [True] * 4 and [r["loss_scale"] for r in got] == [1e12] * 4,
          f"skipped: {[(r['skipped'], r['loss_scale']) for r in got]}")
    check(got[0]["loss"] == ref16["fp16"][0]["loss"], f"step 1: {got[0]['loss']} against fp16's {ref16['fp16'][0]['loss']}")
    print(f"fp16 with a static scale of 1e12: 4 of 4 steps skipped (step 1's loss {got[0]['loss']:.8f}, fp16's)")


def fused_ce_runs(cases):
    """The fused head at each (name, layout flags, executor) against the unfused reference."""
    for name, flags, executor in cases:
        art, p = compile_art("art-fce-" + name, ["--fused-ce", "on", *flags], executor=executor)
        # the rank's rows: 8 x 16 tokens, half of them under cp 2 (the sequence split)
        rows = 64 if name == "cp2" else 128
        check(f"fused_ce: the head's GEMM and the cross-entropy in blocks ({rows} rows x 256 vocabulary)" in p.stdout, p.stdout)
        got, _ = train(art, "fce-" + name)
        compare(f"fused_ce {name} ({executor})", got, reference(art), tol1=1e-5, tol20=1e-4)


def fused_ce_shards(cases):
    """The fused head over tensor-parallel vocabulary shards, each (name, flags, defines, executor)."""
    for name, flags, defs, executor in cases:
        tp = flags[flags.index("--tp") + 1]
        art, p = compile_art(f"art-fce-{name}-{executor}", ["--fused-ce", "on", *flags], executor=executor, defs=defs)
        shard = f"128 rows x 128 vocabulary of a shard, reduced over tensor = {tp}"
        check(f"fused_ce: the head's GEMM and the cross-entropy in blocks ({shard})" in p.stdout, p.stdout)
        got, _ = train(art, f"fce-{name}-{executor}")
        compare(f"fused_ce {name} ({executor})", got, reference(art, defs), tol1=1e-5, tol20=1e-4)


def case_fused_ce_layouts():
    """The fused head (case_fused_ce) at dp 2, pp 2, cp 2, ZeRO-3, and tp 2 (with sequence
    parallelism too) against the unfused reference: the other layouts of case_fused_ce, a case of
    their own so the sanitized build can leave them to the layouts' own cases."""
    fused_ce_runs((("dp2", ["--dp", "2"], "auto"), ("pp2", ["--pp", "2"], "auto"), ("cp2", ["--cp", "2"], "auto"),
                   ("zero3", ["--dp", "2", "--zero", "3"], "auto")))
    fused_ce_shards((("tp2", ["--tp", "2"], DEFS, "auto"), ("tp2", ["--tp", "2"], DEFS, "interp"),
                     ("tp2_sp", ["--tp", "2", "--sp", "on"], DEFS, "auto")))


def case_fused_ce():
    """parallel.fused_ce (compiler/ir/headloss.h): the head's GEMM and the cross-entropy as one op in
    blocks, the logits never stored. The generated kernels and the reference executor give the
    independent reference's losses (ref_train.c: the unfused model) within 1e-5 at step 1 and 1e-4 at
    step 20, at one rank (case_fused_ce_layouts: dp 2, pp 2, cp 2, ZeRO-3, tp 2); the compile line says what it fused and
    the arena shrinks; under tp 2 the vocabulary is split and each rank's shard is fused (the
    log-sum-exp and the target's logit reduced over the tensor group), and under tp 4 with 201 tokens
    padded to 512 rows (two ranks hold padding only) the padding takes no part; bf16 within 1e-3 of
    bf16 unfused; --target cuda compiles it into kernels/hpdl_lmce.cuh's kernels."""
    plain, p0 = compile_art("art-fce-off", [], executor="auto")
    fused_ce_runs((("one_rank", [], "auto"), ("interp", [], "interp")))
    # GPT-2 124M at 4 x 64 tokens: the step's arena loses the logits (256 x 50257 fp32, 51 MB) and
    # their gradient, and the tied table's weight gradient goes into its slot as before
    arena = {}
    for f in ("off", "on"):
        mem = run([tool("hpdlc"), "emit", "memory", os.path.join(ARGS.source, "samples", "gpt2.hpd"), "-D", "T=64", "--dp", "1",
                   "--global-batch", "4", "--micro-batch", "4", "--cluster", "cpu", "--precision", "fp32", "--fused-ce", f]).stdout
        line = [l for l in mem.splitlines() if l.startswith("fused forward.grad:")]
        check(len(line) == 1, mem[:2000])
        arena[f] = int(line[0].split("arena ")[1].split(",")[0])
    print(f"GPT-2 124M, 4 x 64 tokens, fp32: the step's arena {arena['on']} bytes fused against {arena['off']}")
    check(arena["on"] < arena["off"] - 51_000_000, f"arena {arena}")
    fused_ce_shards((("tp4_padded", ["--tp", "4"], [*DEFS, "-D", "V=201"], "auto"),
                     ("tp4_padded", ["--tp", "4"], [*DEFS, "-D", "V=201"], "interp")))
    b16 = {}
    for f in ("off", "on"):
        art, _ = compile_art("art-fce-bf16-" + f, ["--fused-ce", f, "--precision", "bf16"], executor="auto")
        b16[f], _ = train(art, "fce-bf16-" + f)
    worst = max(rel(a["loss"], b["loss"]) for a, b in zip(b16["on"], b16["off"]))
    print(f"bf16 fused: 20 losses within {worst:.1e} of bf16 unfused")
    check(len(b16["on"]) == STEPS and worst < 1e-3, f"bf16 fused off unfused by {worst:.2e}")
    d = os.path.join(ARGS.work, "art-fce-cuda")
    # the CUDA target runs it in kernels/hpdl_lmce.cuh (cuda.layout.*fused_ce train it)
    p = run([tool("hpdlc"), "compile", sample(), *DEFS, "--fused-ce", "on", "--target", "cuda", "-o", d], expect=None)
    if "NVRTC not found" in p.stderr:
        print("  (the CUDA compile skipped: " + p.stderr.strip().splitlines()[-1] + ")")
    else:
        check(p.returncode == 0 and "fused_ce: the head's GEMM and the cross-entropy in blocks" in p.stdout, p.stdout + p.stderr)
    p = run([tool("hpdlc"), "emit", "cuda", sample(), *DEFS, "--fused-ce", "on"])
    for want in ("hpdl_lmce_fwd<", "hpdl_lmce_rows<", "hpdl_lmce_lse<", "hpdl_lmce_dx<", "hpdl_lmce_dw<"):
        check(want in p.stdout, f"emit cuda --fused-ce on: no {want}")


def case_fusion_off():
    # --fusion off: a kernel an op (fuse.h's eager options). Fusing elementwise ops keeps
    # each op's rounding (a value stored at its IR type either way), so the generated
    # kernels give the fused program's numbers bit for bit, at one rank and at tp 2, in
    # fp32 and bf16 storage
    for name, flags in (("one_rank", []), ("tp2", ["--tp", "2"]), ("bf16", ["--precision", "bf16"])):
        runs = {}
        for fusion in ("on", "off"):
            art, p = compile_art(f"art-fusion-{fusion}-{name}", flags + ["--fusion", fusion], executor="native")
            man = json.load(open(os.path.join(art, "manifest.json")))
            if man["program"]["executor"] != "native":
                print("skipped: the CPU back end is not built into this hpdlc")
                sys.exit(SKIP)
            check(man["program"].get("fusion") == fusion, f"manifest program.fusion {man['program'].get('fusion')}")
            said = "fusion off: a kernel an op" in p.stdout
            check(said == (fusion == "off"), f"the summary says fusion off: {said}\n{p.stdout}")
            runs[fusion], _ = train(art, f"fusion-{fusion}-{name}")
        same = [(m["loss"], m["grad_norm"]) for m in runs["on"]] == [(m["loss"], m["grad_norm"]) for m in runs["off"]]
        check(len(runs["off"]) == STEPS and same, f"{name}: fusion off gives other numbers than fusion on")
        print(f"fusion off, {name}: {STEPS} steps, the same losses and gradient norms bit for bit "
              f"(loss {runs['off'][-1]['loss']:.9f})")
        if name == "one_rank":
            compare("fusion off against the reference", runs["off"], reference(art), tol1=1e-5, tol20=1e-4)
    p = run([tool("hpdlc"), "compile", sample(), *DEFS, "--fusion", "partly", "-o", work("bad")], expect=2)
    check("--fusion takes on or off, not 'partly'" in p.stderr, p.stderr)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    global ARGS
    ARGS = e2e_common.case_args(CASES, "--ref")
    rt.ARGS = argparse.Namespace(bin=ARGS.bin, work=ARGS.work, plugin="")
    return e2e_common.run_case(CASES, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
