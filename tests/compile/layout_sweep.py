#!/usr/bin/env python3
"""layout_sweep.py - random layouts, compiled and trained, against one rank (CTest: compile.layout_sweep).

    layout_sweep.py --bin BIN --source SRC --work DIR [--seed S] [--draws N] [--emulate P]

The layout cases of compile_e2e.py each fix one combination; this test draws N (default 16)
from a fixed seed (default 37) over what they combine: a model (gpt2-tiny, samples/llama.hpd,
qwen3.hpd - also with a window of 5 keys and a vocabulary of 250 - and gpt-oss.hpd at tiny
sizes, moe-tiny), 2 or 4 layers, fp32 or bf16, data x tensor x pipeline
x context of 1-2 each (context up to 4) on at most 8 ranks, a micro batch, ZeRO 0-3, a recompute
policy, sequence parallelism, cp_comm, a pipeline schedule (interleaved with 2 virtual stages
at 4 layers), the fused head, fusion off, expert parallelism for the experts, the native or
the reference executor; with --emulate P, that share of the draws compiled for CUDA with
--emulate and run on the emulated device. Each trains 4 steps of 8 sequences; the losses and
the first gradient norm must be the one-rank native program's of the same model and batch:
step 1 within 1e-5 relative (3e-2 in bf16), step 4 and the norm within 10 times that. Then
--resumes R (default 4) pairs of CPU layouts of one fp32 model: the first trained to step 2
(--stop-at, its checkpoint), the second resumed from that checkpoint to step 4, whose
steps 3 and 4 must be the one-rank run's within 1e-5 (the checkpoint resharded). A
layout the compiler refuses must say why (exit 1 or 2 with a message); none must crash.
Exit 0 pass, 1 fail, 77 skip (no mpirun)."""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import SKIP, metrics  # noqa: E402

MODELS = {
    "gpt2": ("gpt2-tiny.hpd", ["-D", "C=32", "-D", "T=16", "-D", "H=4"], "L"),
    "llama": ("llama.hpd", ["-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=64", "-D", "vocab=256",
                            "-D", "seq=16"], "layers"),
    "qwen3": ("qwen3.hpd", ["-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "head_dim=8", "-D", "ffn=64",
                            "-D", "vocab=256", "-D", "seq=16"], "layers"),
    "moe": ("moe-tiny.hpd", ["-D", "T=16"], "L"),
    # a window of 5 keys across the context ring, a vocabulary of 250 padded for tensor parallelism
    "qwen3w": ("qwen3.hpd", ["-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "head_dim=8", "-D", "ffn=64",
                             "-D", "vocab=250", "-D", "seq=16", "-D", "window=5"], "layers"),
    # sinks, a sliding window every second block, dropless experts with biases
    "gptoss": ("gpt-oss.hpd", ["-D", "hidden=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "head_dim=8", "-D", "ffn=16",
                               "-D", "vocab=256", "-D", "seq=16", "-D", "experts=4", "-D", "top_k=2", "-D", "window=4"], "layers"),
}
EXPERTS = ("moe", "gptoss")
STEPS = 4


def draw(rng, emulate, fixed=None):
    """A model, its layers and precision (or `fixed`'s) and a layout: (name, layers, prec, flags, hpdlrun's flags)."""
    name = rng.choice(sorted(MODELS))
    layers = rng.choice([2, 4])
    prec = rng.choice(["fp32", "fp32", "bf16"])
    if fixed:
        name, layers, prec = fixed
    tp, pp, dp = (rng.choice([1, 2]) for _ in range(3))
    cp = rng.choice([1, 1, 2, 4])
    if tp * pp * dp * cp > 8:
        cp = 1
    mb = rng.choice([1, 2, 4])
    if 8 % (dp * mb):
        mb = 1
    fl = ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--cp", str(cp), "--gpus", str(tp * pp * dp * cp),
          "--micro-batch", str(mb)]
    if rng.random() < .5:
        fl += ["--zero", str(rng.choice([0, 1, 2, 3]))]
    if rng.random() < .5:
        fl += ["--recompute", rng.choice(["none", "selective", "full", "ops", "act"])]
    if tp > 1 and rng.random() < .5:
        fl += ["--sp", rng.choice(["on", "off"])]
    if cp > 1 and rng.random() < .6:
        fl += ["--cp-comm", rng.choice(["allgather", "ring"])]
    if pp > 1 and rng.random() < .5:
        sched = rng.choice(["gpipe", "1f1b", "interleaved"])
        if sched == "interleaved" and layers < 4:
            sched = "1f1b"
        fl += ["--schedule", sched] + (["--virtual-stages", "2"] if sched == "interleaved" else [])
    if rng.random() < .3:
        fl += ["--fused-ce", rng.choice(["on", "off"])]
    if rng.random() < .2:
        fl += ["--fusion", "off"]
    if name in EXPERTS:  # (the samples' own parallel blocks set one)
        fl += ["--ep", str(dp if dp > 1 and rng.random() < .6 else 1)]
    if rng.random() < emulate:
        fl += ["--target", "cuda", "--emulate"]
        run = ["--device", "emulate"]
    else:
        fl += ["--executor", rng.choice(["native", "interp"])]
        run = []
    return name, layers, prec, fl, run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--emulate", type=float, default=0)
    ap.add_argument("--resumes", type=int, default=4)
    a = ap.parse_args()
    e2e_common.need_mpi(a.bin)
    os.makedirs(a.work, exist_ok=True)
    data = e2e_common.synthetic_data(a.bin, a.work, 300000)
    hpdlc, hpdlrun = os.path.join(a.bin, "hpdlc"), os.path.join(a.bin, "hpdlrun")

    def train(art, tag, extra):
        m = os.path.join(a.work, tag + ".jsonl")
        if os.path.exists(m):
            os.remove(m)
        p = e2e_common.run([hpdlrun, art, "--data", data, "--steps", str(STEPS), "--metrics", m, "--progress", "quiet", *extra],
                           expect=None, timeout=280)
        return p, (metrics(m) if p.returncode == 0 and os.path.exists(m) else None)

    rng = random.Random(a.seed)
    refs, fails, ran = {}, [], 0

    def reference(name, layers, prec, base):
        """The one-rank native program's 4 steps of this model (None: it did not train, a failure)."""
        if (name, layers, prec) not in refs:
            art = e2e_common.fresh_dir(a.work, f"ref-{name}-{layers}-{prec}")
            e2e_common.run([hpdlc, "compile", *base, "--tp", "1", "--pp", "1", "--dp", "1", "--cp", "1", "--gpus", "1",
                            "--micro-batch", "1", "--executor", "native", *(["--ep", "1"] if name in EXPERTS else []), "-q",
                            "-o", art])
            p, ref = train(art, "ref", [])
            if ref is None or len(ref) != STEPS:
                fails.append(f"the one-rank reference of {name} ({layers} layers, {prec}) did not train: {p.stderr[-400:]}")
                ref = None
            refs[(name, layers, prec)] = ref
        return refs[(name, layers, prec)]

    for i in range(a.draws):
        name, layers, prec, fl, run = draw(rng, a.emulate)
        f, defs, lkey = MODELS[name]
        base = [os.path.join(a.source, "samples", f), *defs, "-D", f"{lkey}={layers}", "--precision", prec, "--global-batch", "8"]
        line = " ".join([f, *defs[1::2], f"{lkey}={layers}", prec, *fl])
        ref = reference(name, layers, prec, base)
        if ref is None:
            continue
        art = e2e_common.fresh_dir(a.work, f"art{i}")
        p = e2e_common.run([hpdlc, "compile", *base, *fl, "-q", "-o", art], expect=None, timeout=280)
        if p.returncode != 0:
            # the error itself, not the notes and warnings printed after it
            lines = p.stderr.strip().splitlines()
            said = next((l for l in lines if "error:" in l), lines[-1] if lines else "")
            print(f"refused: {line}: {said}")
            if p.returncode not in (1, 2) or not said:
                fails.append(f"compile exit {p.returncode} without a reason: {line}")
            continue
        p, got = train(art, f"run{i}", run)
        if got is None or len(got) != STEPS:
            fails.append(f"did not train: {line}\n  {(p.stderr or '')[-600:]}")
            continue
        ran += 1
        tol = 1e-5 if prec == "fp32" else 3e-2
        e1 = abs(got[0]["loss"] - ref[0]["loss"]) / ref[0]["loss"]
        n1 = abs(got[0]["grad_norm"] - ref[0]["grad_norm"]) / ref[0]["grad_norm"]
        e4 = abs(got[-1]["loss"] - ref[-1]["loss"]) / ref[-1]["loss"]
        ok = e1 <= tol and n1 <= 10 * tol and e4 <= 10 * tol
        print(f"{'ok  ' if ok else 'FAIL'} step 1 {e1:.1e}, norm {n1:.1e}, step {STEPS} {e4:.1e}: {line}")
        if not ok:
            fails.append(f"off the one-rank run: {line}")
    # resumed at another layout: two draws of one fp32 model, the first stopped at step 2
    # (its checkpoint), the second resumed from it to step 4; steps 3 and 4 the one-rank run's
    resumed = 0
    for i in range(a.resumes):
        name, layers = rng.choice(sorted(MODELS)), rng.choice([2, 4])
        arts, lines = [], []
        for side in (0, 1):
            _, _, _, fl, _ = draw(rng, 0, (name, layers, "fp32"))
            f, defs, lkey = MODELS[name]
            base = [os.path.join(a.source, "samples", f), *defs, "-D", f"{lkey}={layers}", "--precision", "fp32",
                    "--global-batch", "8"]
            art = e2e_common.fresh_dir(a.work, f"resume{i}-{side}")
            p = e2e_common.run([hpdlc, "compile", *base, *fl, "-q", "-o", art], expect=None, timeout=280)
            lines.append(" ".join(fl))
            if p.returncode == 0:
                arts.append(art)
        if len(arts) < 2:
            print(f"refused: a resume of {name} ({layers} layers): {' -> '.join(lines)}")
            continue
        ref = reference(name, layers, "fp32", base)
        if ref is None:
            continue
        ck = e2e_common.fresh_dir(a.work, f"resume{i}-ckpt")
        p1, _ = train(arts[0], f"resume{i}-a", ["--stop-at", "2", "--checkpoint-dir", ck])
        p2, got = train(arts[1], f"resume{i}-b", ["--checkpoint-dir", ck, "--resume"])
        line = f"{name} ({layers} layers) [{lines[0]}] -> [{lines[1]}]"
        steps = {r["step"]: r for r in got or []}
        if p1.returncode != 0 or not got or 3 not in steps or 4 not in steps:
            fails.append(f"did not resume: {line}\n  {(p1.stderr + p2.stderr)[-600:]}")
            continue
        resumed += 1
        e = max(abs(steps[s]["loss"] - ref[s - 1]["loss"]) / ref[s - 1]["loss"] for s in (3, 4))
        print(f"{'ok  ' if e <= 1e-5 else 'FAIL'} resumed, steps 3-4 {e:.1e}: {line}")
        if e > 1e-5:
            fails.append(f"resumed off the one-rank run: {line}")
    print(f"seed {a.seed}: {a.draws} layouts drawn, {ran} trained against one rank; {resumed} of {a.resumes} resumed at another")
    for f in fails:
        print(f"FAIL: {f}")
    return 1 if fails or ran == 0 else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except e2e_common.Fail as e:
        print(f"FAIL: {e}")
        sys.exit(1)
