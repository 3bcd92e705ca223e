#!/usr/bin/env python3
"""random_layouts.py - a hardening sweep, not a CTest case: random combinations
of model, layout, precision and policies, each compiled for --target cuda and
run on the emulated device against the CPU target by run_device.py (the same
comparison the cuda.layout.* tests make for the combinations chosen by hand).

  tests/cuda/random_layouts.py --build build [--seed N] [--runs N] [--moe]
                               [--out FILE] [--keep-going]

Dense models (gpt2-tiny, a small Llama and Qwen3) or, with --moe, mixtures of
experts (moe-tiny, a small Qwen3-MoE and DeepSeek-V3); up to 4 ranks over
data, tensor, pipeline and context (or expert) parallelism, ZeRO 0-3, fp32 /
bf16 / fp16, every recomputation policy, and now and then sequence
parallelism, the ring, virtual stages, the fused loss, fusion off or 16-bit
moments. Each run's line (ok, FAIL and the last lines of its output, or
refused: the compiler's clear refusal of a combination it does not build)
goes to --out (default: standard output). Exit status 1 when a run failed
other than by a refusal. A line holds the whole command, so a failure is
rerun by hand with run_device.py --keep DIR.

Found with it (2026-12-07): ZeRO 3's gather of DeepSeek-V3's routing bias
overran its buffer at dp 4 (cuda.layout.*.deepseek_zero3_dp4); a rank's fatal
data error was followed by the launcher's "no rank reported an error"; and the
CPU target itself, the comparison's reference, gathered MLA's rotary key along
the wrong axis under sequence parallelism (compile.mla_sp): a FAIL may be
either side's, so check it against the reference executor (--executor interp).
Takes 10-30 s a run on 2 cores."""
import argparse
import os
import random
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (sample, sizes, variants): the sizes keep each run to seconds; the
# variants are alternatives added at random. Vocabularies stay >= 128: the
# harness's synthetic text is byte-level ASCII.
DENSE = {
    "gpt2-tiny": ("samples/gpt2-tiny.hpd", "-D T=16 -D C=32", ["-D L=4", "-D C=64", "-D V=201", ""]),
    "llama": ("samples/llama.hpd", "-D layers=2 -D hidden=64 -D heads=4 -D kv_heads=2 -D ffn=128 -D seq=32 -D vocab=256",
              ["-D layers=4", ""]),
    "qwen3": ("samples/qwen3.hpd",
              "-D layers=2 -D hidden=64 -D heads=4 -D kv_heads=2 -D head_dim=16 -D ffn=128 -D seq=32 -D vocab=256", [""]),
}
MOE = {
    "moe-tiny": ("samples/moe-tiny.hpd", "", ["-D drop=false", ""]),
    "qwen3-moe": ("samples/qwen3-moe.hpd", "-D layers=2 -D hidden=32 -D heads=4 -D kv_heads=2 -D head_dim=8 -D ffn=16 "
                  "-D experts=4 -D top_k=2 -D seq=16 -D vocab=128", [""]),
    "deepseek-v3": ("samples/deepseek-v3.hpd", "-D layers=3 -D dense=1 -D hidden=16 -D heads=4 -D q_lora=8 -D kv_lora=8 "
                    "-D qk_nope=4 -D qk_rope=4 -D v_head_dim=4 -D ffn=32 -D moe_ffn=8 -D seq=8 -D vocab=128 -D experts=8 "
                    "-D top_k=2 -D groups=4 -D group_top_k=2", [""]),
}


def choose(rng, moe):
    """One combination: (name, sample path, compile arguments, precision)."""
    table = MOE if moe else DENSE
    while True:
        name = rng.choice(sorted(table))
        path, sizes, variants = table[name]
        dp, tp, pp = rng.choice([1, 1, 2, 2, 4]), rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
        cp = 1 if moe else rng.choice([1, 1, 2])
        if dp * tp * pp * cp <= 4:
            break
    a = [sizes, rng.choice(variants), f"--dp {dp} --tp {tp} --pp {pp} --cp {cp}"]
    if name not in ("gpt2-tiny", "moe-tiny"):  # their own cluster files hold enough devices
        a.append(f"--cluster laptop --nodes {dp * tp * pp * cp}")
    if moe:
        ep = rng.choice([d for d in (1, 2, 4) if dp % d == 0])
        a.append(f"--ep {ep}")
        if tp > 1 and ep > 1 and rng.random() < 0.5:
            a.append("--etp 1 --sp on")
        elif tp > 1:
            a.append("--sp " + rng.choice(["on", "off"]))
    elif tp > 1:
        a.append("--sp " + rng.choice(["on", "off"]))
    precision = rng.choice(["fp32", "fp32", "bf16"] if moe else ["fp32", "bf16", "bf16", "fp16"])
    a.append(f"--precision {precision}")
    a.append("--recompute " + rng.choice(["none", "selective", "full", "ops", "act"]))
    if dp > 1:
        a.append("--zero " + rng.choice(["0", "1", "2", "3"]))
    if cp > 1:
        a.append("--cp-comm " + rng.choice(["ring", "allgather"]))
    if pp > 1 and rng.random() < 0.3 and name in ("gpt2-tiny", "llama", "qwen3-moe"):
        layers = {"gpt2-tiny": "-D L=4", "llama": "-D layers=4", "qwen3-moe": "-D layers=4"}[name]
        a.append(f"{layers} --virtual-stages 2 --schedule interleaved")
    if not moe and rng.random() < 0.3:
        a.append("--fused-ce on")
    if not moe and rng.random() < 0.15:
        a.append("--fusion off")
    if rng.random() < 0.15:
        a.append("--moments bf16")
    mb = 1 if pp > 1 or dp == 4 else rng.choice([1, 2])
    a.append(f"--global-batch {max(4, dp * mb)} --micro-batch {mb}")
    return name, path, " ".join(x for x in a if x), precision


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (its bin/ holds hpdlc, hpdlrun, hpdl-data)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--moe", action="store_true", help="mixtures of experts instead of dense models")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", help="append the results here (default: standard output)")
    ap.add_argument("--keep-going", action="store_true", help="exit 0 even when a run failed")
    a = ap.parse_args()
    tools = [os.path.join(a.build, "bin", t) for t in ("hpdlc", "hpdlrun", "hpdl-data")]
    for t in tools:
        if not os.access(t, os.X_OK):
            sys.exit(f"random_layouts.py: {t} is missing: build first (cmake --build {a.build})")
    out = open(a.out, "a") if a.out else sys.stdout
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    rng = random.Random(a.seed)
    failed = 0
    for i in range(a.runs):
        name, path, args, precision = choose(rng, a.moe)
        first, tol = ("1e-6", "1e-5") if precision == "fp32" else ("1e-4", "3e-3")
        cmd = [sys.executable, os.path.join(HERE, "run_device.py"), "--hpdlc", tools[0], "--hpdlrun", tools[1],
               "--hpdl-data", tools[2], "--sample", os.path.join(ROOT, path), "--device", "emulate",
               "--steps", str(a.steps), "--first-tol", first, "--tol", tol, "--args", args]
        if a.moe:  # top-k routing is discontinuous: a near-tie may flip after a few steps
            cmd += ["--flip-tol", "2e-2", "--flip-after", "3"]
        t0 = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = [l for l in p.stdout.strip().splitlines() if "note:" not in l]
        # the compiler's refusal (its message, and no run started) is not a failure
        refused = p.returncode == 1 and any(l.startswith("hpdlc: ") or re.search(r"\.hpd:\d+:\d+: error:", l) for l in lines) and \
            not any(l.startswith(("hpdlrun", "step ")) for l in lines)
        status = "ok" if p.returncode == 0 else "skipped" if p.returncode == 77 else "refused" if refused else "FAIL"
        failed += status == "FAIL"
        print(f"{status}\t{time.time() - t0:.0f} s\t{i + 1}/{a.runs}\t{name}\t{shlex.join(cmd[1:])}", file=out, flush=True)
        if status in ("FAIL", "refused"):
            for l in lines[-4:]:
                print(f"    | {l}", file=out, flush=True)
    print(f"random_layouts.py: {a.runs} runs (seed {a.seed}{', mixtures of experts' if a.moe else ''}), {failed} failed",
          file=out, flush=True)
    return 1 if failed and not a.keep_going else 0


if __name__ == "__main__":
    sys.exit(main())
