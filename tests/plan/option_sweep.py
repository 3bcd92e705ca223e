#!/usr/bin/env python3
"""option_sweep.py - `hpdlc plan` over random models and option sets (CTest: plan.option_sweep).

    option_sweep.py HPDLC SOURCE_DIR [SEED] [N]

Draws N (default 150) plans from a fixed seed (default 37): a sample of every kind (dense,
mixture of experts, convolutional), random sizes (-D layers, hidden, heads, kv_heads, ffn,
vocab, seq), random layouts (--gpus, --dp auto mostly, --tp, --pp, --cp, --ep, --zero, --micro-batch,
--global-batch, --recompute, --precision, --sp, --schedule, --virtual-stages, --cp-comm,
--attention, --fusion, --tp-overlap, --balance, --fused-ce, --moments, --etp, --dispatcher, --engine,
--vocab-pad, --compression, --recompute-layers, --overlap, --nodes, --gpus-per-node), a
catalog cluster, and sometimes --search, --scaling, --trace, --explain, JSON or HTML. Most
combinations are refused, and that is fine; what must hold for every one: it ends within
60 s with exit 0 (a plan, or a report of why none fits), 1 (a plan that cannot be made) or 2
(a refused option), a refusal says what is wrong ("error" or "not valid"), nothing dies
of a signal or a sanitizer report (the sanitized build runs this test too), and a JSON
report is JSON whose every number is finite and none negative, with a step time above zero
where the layout is valid (since 2026-12-07). Two draws of
2026-12-05's sweep crashed `plan` and are replayed first: a search where nothing fits
explaining its ZeRO fix, and an invalid plan's header; so are two of 2026-12-06's option
fuzzing: a sequence of 2^31 tokens (a tensor's element count overflowed 64 bits: undefined
behaviour, which the sanitized build stops at) and a search over 2^32 GPUs (a minute, every
number up to it tried as a degree); since then some draws take a size or count at those
bounds. 2026-12-07's sweep (seed 4) found a trace of 2^38 micro-batches refused without a
reason (the count through an int): replayed too, with the JSON checks. Exit 0 pass, 1 fail."""
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile

CLUSTERS = ["dgx-a100-80gb", "dgx-a100-40gb", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "gb300-nvl72", "dgx-b300", "frontier", "nd-mi300x-v5", "cpu"]
SAMPLES = ["llama", "gpt", "mixtral", "qwen3-moe", "gpt2", "gpt-oss", "deepseek-v3", "nemotron", "qwen3", "resnet18", "mlp",
           "moe-tiny", "gpt2-tiny"]
REPLAY = [
    ["samples/gpt.hpd", "-D", "layers=24", "-D", "hidden=16384", "-D", "heads=8", "-D", "seq=512", "-D", "vocab=50257",
     "--gpus", "64", "--tp", "1", "--pp", "2", "--cp", "auto", "--zero", "0", "--micro-batch", "1", "--recompute", "act",
     "--precision", "bf16", "--sp", "auto", "--balance", "layers", "--fused-ce", "on", "--cluster", "dgx-a100-80gb", "--explain"],
    ["samples/gpt-oss.hpd", "--gpus", "2", "--tp", "auto", "--pp", "16", "--cp", "1", "--zero", "2", "--micro-batch", "2",
     "--recompute", "auto", "--sp", "off", "--schedule", "gpipe", "--virtual-stages", "1", "--format", "json"],
    ["samples/llama.hpd", "--precision", "bf16", "-D", "seq=2147483648"],
    ["samples/gpt2-tiny.hpd", "--gpus", "4294967296", "--cluster", "cpu", "--search", "--fusion", "off"],
    ["samples/moe-tiny.hpd", "--gpus", "1", "--global-batch", "1099511627776", "--trace", "TRACE", "--format", "json"],
]


def draw(rng, trace):
    s = rng.choice(SAMPLES)
    args = [f"samples/{s}.hpd"]
    if s in ("llama", "gpt", "mixtral"):
        h = rng.choice([256, 512, 768, 1000, 1024, 2048, 4096, 6144, 8192, 16384])
        heads = rng.choice([d for d in (4, 6, 8, 12, 16, 24, 32, 48, 64, 128) if h % d == 0])
        d = {"layers": rng.choice([1, 2, 3, 7, 24, 32, 61, 126]), "hidden": h, "heads": heads,
             "seq": rng.choice([128, 1000, 2048, 8192, 32768, 131072]), "vocab": rng.choice([1000, 32000, 50257, 128256])}
        if s != "gpt":
            d["kv_heads"] = rng.choice([k for k in (1, 2, 4, 8, heads) if heads % k == 0])
            d["ffn"] = rng.choice([h * 4, max(64, int(h * 8 / 3) // 64 * 64), 14336])
        for k, v in d.items():
            args += ["-D", f"{k}={v}"]
    args += ["--gpus", str(rng.choice([1, 2, 8, 24, 64, 256, 1024, 16384]))]
    if rng.random() < 0.7:
        args += ["--dp", "auto"]  # else the sample's own data size, mostly refused for the GPU count
    for flag, values, p in [("--tp", [1, 2, 4, 8, 16, "auto"], .6), ("--pp", [1, 2, 4, 8, 16, "auto"], .6),
                            ("--cp", [1, 2, 4, 8, "auto"], .5), ("--ep", [1, 2, 4, 8, "auto"], .3),
                            ("--zero", [0, 1, 2, 3, "auto"], .5), ("--micro-batch", [1, 2, 3, 8], .5),
                            ("--global-batch", [1, 8, 64, 512, 4096], .5),
                            ("--recompute", ["none", "selective", "full", "ops", "act", "auto"], .5),
                            ("--precision", ["fp32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4"], .5), ("--sp", ["on", "off", "auto"], .3),
                            ("--fp8-scaling", ["delayed", "current"], .1),
                            ("--schedule", ["gpipe", "1f1b", "interleaved", "auto"], .3), ("--virtual-stages", [1, 2, 3, "auto"], .2),
                            ("--cp-comm", ["allgather", "ring", "auto"], .3),
                            ("--attention", ["flash", "flash1", "flash2", "flash3", "materialized"], .3),
                            ("--fusion", ["on", "off"], .2), ("--tp-overlap", ["on", "off"], .2),
                            ("--balance", ["cost", "layers", "ends"], .2), ("--fused-ce", ["on", "off", "auto"], .2),
                            ("--moments", ["fp32", "bf16"], .15), ("--etp", [1, "auto"], .1), ("--dispatcher", ["alltoall", "deepep"], .1),
                            ("--engine", ["hpdl", "deepspeed"], .1),
                            ("--vocab-pad", [1, 64, 128, 1000], .1), ("--compression", ["none", "fp16", "bf16", "int8", "topk"], .1),
                            ("--recompute-layers", [1, 3, 100], .1), ("--overlap", ["on", "off"], .1),
                            ("--nodes", [1, 3, "auto"], .1), ("--gpus-per-node", [1, 4, 6], .05)]:
        if rng.random() < p:
            args += [flag, str(rng.choice(values))]
    args += ["--cluster", rng.choice(CLUSTERS)]
    if rng.random() < 0.08:  # the bounds: sizes and counts near 2^31 and 2^32, a prime count of GPUs
        args += rng.choice([["-D", f"seq={rng.choice([2**31 - 1, 2**31, 2**40])}"], ["-D", f"hidden={2**31}"],
                            ["--gpus", str(rng.choice([2**32, 4294967291, 2**31 - 1]))], ["--micro-batch", str(2**31)],
                            ["--global-batch", str(2**40)], ["-D", f"vocab={2**31 + 1}"]])
    if rng.random() < 0.15:
        args.append("--search")
    if rng.random() < 0.1:
        args += ["--scaling", rng.choice(["8,16,32", "1,2", "64,4096"])]
    if rng.random() < 0.1:
        args += ["--trace", trace]
    args += rng.choice([[], ["--format", "json"], ["--explain"], ["--format", "html"]])
    return args


def numbers(x, path=""):
    """Every number of a JSON value, with its path."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return
    if isinstance(x, (int, float)):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}[{i}]")


def json_wrong(out):
    """What is wrong with a JSON report, or None."""
    try:
        d = json.loads(out)
    except ValueError as e:
        return f"not JSON ({e})"
    # the planner's errors on published runs (accuracy: error, error_p10, error_p90) are signed
    signed = re.compile(r"\.accuracy\.(closest\[\d+\]\.error|error_p10|error_p90)$")
    bad = [f"{k} = {v}" for k, v in numbers(d) if not math.isfinite(v) or (v < 0 and not signed.search(k))]
    if bad:
        return "numbers not finite or negative: " + ", ".join(bad[:4])
    if d.get("valid", True) and not d.get("time", {}).get("step_s", 0) > 0:
        return "a valid layout without a step time"
    return None


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 37
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 150
    rng = random.Random(seed)
    bad, counts = [], {0: 0, 1: 0, 2: 0}
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        replay = [[trace if a == "TRACE" else a for a in r] for r in REPLAY]
        for i, args in enumerate(replay + [draw(rng, trace) for _ in range(n)]):
            try:
                p = subprocess.run([hpdlc, "plan", *args], cwd=src, capture_output=True, text=True, timeout=60)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired:
                rc, out, err = "timeout", "", ""
            line = "hpdlc plan " + " ".join(args)
            if rc in counts:
                counts[rc] += 1
            if rc not in (0, 1, 2):
                bad.append(f"exit {rc}: {line}\n  {err.strip()[-500:]}")
            elif "runtime error" in err or "Sanitizer" in err:
                bad.append(f"a sanitizer report: {line}\n  {err.strip()[-800:]}")
            elif rc != 0 and "error" not in err and "not valid" not in out + err and '"valid": false' not in out:
                bad.append(f"exit {rc} without a reason: {line}")
            elif rc == 0 and "--format json" in line and (wrong := json_wrong(out)):
                bad.append(f"a JSON report {wrong}: {line}")
    print(f"seed {seed}: {n} drawn plans and {len(REPLAY)} replayed: {counts[0]} exit 0, {counts[1]} exit 1, {counts[2]} exit 2")
    for b in bad:
        print(f"FAIL: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
