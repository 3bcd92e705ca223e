#!/usr/bin/env python3
"""evidence_report.py - a plan's "how far to trust it" (CTest: plan.evidence_report; docs/planner.md
sec. 16.1).

    evidence_report.py HPDLC SOURCE_DIR

The planner compiles in every published run of tests/plan with its traits and the planner's
error on it (compiler/plan/plan_evidence_rows.inc; plan.evidence checks that it is current).
Here, for plans of several kinds (Ampere dense, Hopper FP8 with tensor and pipeline
parallelism, Blackwell experts, Hopper long context under FSDP), the report's `accuracy` is
recomputed from that file by a second implementation of the rule: keep the runs that share
each trait in turn (GPU generation, experts, context parallelism, GEMM format, sequences
of 32K and more, eager, ZeRO-3, pipeline, tensor), a trait dropped where fewer than 5 would remain; the median |error|, the
10th and 90th percentiles (linear between neighbours), the step those errors put it at, and
the three runs closest in GPUs, parameters and sequence (with --evidence every run kept, closest
first). Each number must agree, and the text report must print them. A published run planned as published finds itself the closest, with its own
error; a CPU plan and a model of images say there is nothing to judge them by.
Exit 0 pass, 1 fail."""
import json
import math
import os
import re
import subprocess
import sys

from plan_checks import LLAMA31_8B, plan_json, plan_run, verdict

TRAITS = ["generation", "moe", "context", "gemm_format", "long_sequence", "eager", "sharded", "pipeline", "tensor"]
GEN = ["other", "ampere", "hopper", "blackwell"]
FMT = ["16-bit", "fp8", "fp4"]


def read_rows(src):
    rows = []
    pat = re.compile(r'^\{"([^"]+)", "([^"]+)", \{\{([^}]*)\}\}, (\d+), ([^,]+), (\d+), ([^,]+), (\d)\},$')
    with open(os.path.join(src, "compiler/plan/plan_evidence_rows.inc")) as f:
        for line in f:
            m = pat.match(line.strip())
            if m:
                rows.append({"id": m.group(1), "set": m.group(2), "traits": [int(v) for v in m.group(3).split(",")],
                             "gpus": int(m.group(4)), "params": float(m.group(5)), "seq": int(m.group(6)),
                             "error": float(m.group(7)), "fitted": int(m.group(8))})
    return rows


def traits_of(acc):
    t = acc["traits"]
    return [GEN.index(t["generation"]), int(t["moe"]), int(t["context"]), FMT.index(t["gemm_format"])] + \
        [int(t[k]) for k in TRAITS[4:]]


def quantile(v, q):
    pos = q * (len(v) - 1)
    i = int(math.floor(pos))
    return v[-1] if i >= len(v) - 1 else v[i] + (pos - i) * (v[i + 1] - v[i])


def expect(rows, traits, gpus, params, seq, step):
    """The evidence by the rule, independently of the C code."""
    keep, matched = list(rows), []
    for k in range(len(TRAITS)):
        share = [r for r in keep if r["traits"][k] == traits[k]]
        if len(share) < 5:
            if k == 0:
                return None
            continue
        keep, matched = share, matched + [TRAITS[k]]
    errs = sorted(r["error"] for r in keep)
    lo, hi = quantile(errs, 0.1), quantile(errs, 0.9)
    dist = lambda r: (abs(math.log(r["gpus"] / gpus)) + abs(math.log(r["params"] / params)) +
                      abs(math.log(r["seq"] / seq)))
    ranked = [r["id"] for _, r in sorted(enumerate(keep), key=lambda ir: (dist(ir[1]), ir[0]))]
    return {"runs": len(keep), "fitted": sum(r["fitted"] for r in keep), "matched": matched,
            "median_abs_error": quantile(sorted(abs(e) for e in errs), 0.5), "error_p10": lo, "error_p90": hi,
            "step_s_low": step / (1 + hi), "step_s_high": step / (1 + lo), "closest": ranked[:3], "all": ranked}


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def check_case(hpdlc, src, rows, name, sample, args, checks):
    j = plan_json(hpdlc, os.path.join(src, sample), args)
    if j is None:
        checks.append((False, f"{name}: no plan"))
        return None
    acc = j.get("accuracy", {})
    want = expect(rows, traits_of(acc), j["cluster"]["gpus"], j["model"]["params"], j["model"]["seq_len"],
                  j["time"]["step_s"])
    if want is None:
        checks.append((acc.get("runs") == 0, f"{name}: no published run of its generation, and the report says runs 0"))
        return j
    print(f"{name}: {acc['runs']} runs ({', '.join(acc['matched'])}), median {acc['median_abs_error']:.4f}, "
          f"p10 {acc['error_p10']:+.4f}, p90 {acc['error_p90']:+.4f}, closest {[c['id'] for c in acc['closest']]}")
    for k in ("runs", "fitted", "matched"):
        checks.append((acc.get(k) == want[k], f"{name}: {k} {acc.get(k)} where the rule gives {want[k]}"))
    for k in ("median_abs_error", "error_p10", "error_p90", "step_s_low", "step_s_high"):
        checks.append((close(acc.get(k, math.nan), want[k]), f"{name}: {k} {acc.get(k)} where the rule gives {want[k]}"))
    got = [c["id"] for c in acc.get("closest", [])]
    checks.append((got == want["closest"], f"{name}: closest {got} where the rule gives {want['closest']}"))
    byid = {r["id"]: r for r in rows}
    checks.append((all(close(c["error"], byid[c["id"]]["error"]) for c in acc.get("closest", [])),
                   f"{name}: the closest runs' errors are the table's"))
    # the text report prints the same figures
    text = plan_run(hpdlc, os.path.join(src, sample), args).stdout
    line = (f"off by {acc['median_abs_error'] * 100:.1f}% in the median, the middle 80% by "
            f"{acc['error_p10'] * 100:+.1f}% to {acc['error_p90'] * 100:+.1f}%")
    checks.append((f"{acc['runs']} published runs like this one" in text and line in text,
                   f"{name}: the text report prints {acc['runs']} runs and '{line}'"))
    checks.append((all(c in text for c in got), f"{name}: the text report names the closest runs"))
    # --evidence: every run the figures come from, closest first
    je = plan_json(hpdlc, os.path.join(src, sample), [*args, "--evidence"])
    every = [c["id"] for c in (je or {}).get("accuracy", {}).get("all", [])]
    checks.append((every == want["all"], f"{name}: --evidence lists {len(every)} runs where the rule keeps {len(want['all'])}"
                                          " (closest first)"))
    te = plan_run(hpdlc, os.path.join(src, sample), [*args, "--evidence"]).stdout
    checks.append((all(f"  {i} (" in te for i in want["all"]), f"{name}: --evidence's text names every run"))
    return j


def published_command(src, run):
    """hpdlc plan's arguments for a run of a set file (fidelity.c's set_command)."""
    m, l = run["model"], run["layout"]
    args = []
    for k, v in m.get("defines", {}).items():
        args += ["-D", f"{k}={v}"]
    flags = {"gpus": "--gpus", "tp": "--tp", "pp": "--pp", "cp": "--cp", "dp": "--dp", "zero": "--zero",
             "micro_batch": "--micro-batch", "global_batch": "--global-batch", "recompute": "--recompute", "sp": "--sp",
             "precision": "--precision", "cluster": "--cluster", "tp_overlap": "--tp-overlap", "ep": "--ep",
             "etp": "--etp", "attention": "--attention", "recompute_layers": "--recompute-layers",
             "compression": "--compression", "moments": "--moments", "dispatcher": "--dispatcher", "fusion": "--fusion",
             "cp_comm": "--cp-comm", "engine": "--engine", "overlap": "--overlap", "fp8_scaling": "--fp8-scaling"}
    for k, flag in flags.items():
        if k in l:
            v = l[k]
            if k == "cluster" and str(v).endswith(".hpd"):
                v = os.path.join(src, v)
            args += [flag, str(v)]
    v = l.get("virtual_stages", 1)
    bal = l.get("balance", "layers")
    args += ["--schedule", "interleaved", "--virtual-stages", str(v)] if v > 1 else ["--schedule", "1f1b"]
    return m["sample"], args + ["--balance", bal]


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    rows = read_rows(src)
    checks = [(len(rows) >= 200, f"the compiled-in table has {len(rows)} runs (every published run of tests/plan)")]
    check_case(hpdlc, src, rows, "gpt2 on dgx-a100-80gb", "samples/gpt2.hpd", [], checks)
    check_case(hpdlc, src, rows, "llama fp8 tp4 pp2 on dgx-h100", "samples/llama.hpd",
               ["--cluster", "dgx-h100", "--gpus", "64", "--dp", "8", "--tp", "4", "--pp", "2", "--precision", "fp8"],
               checks)
    check_case(hpdlc, src, rows, "gpt-oss ep64 on gb200-nvl72", "samples/gpt-oss.hpd",
               ["-D", "seq=4096", "--gpus", "64", "--dp", "64", "--pp", "1", "--ep", "64", "--zero", "1", "--micro-batch",
                "4", "--global-batch", "1280", "--cluster", "gb200-nvl72"], checks)
    check_case(hpdlc, src, rows, "llama 8B cp4 fsdp on dgx-h100", "samples/llama.hpd",
               [*LLAMA31_8B, "-D", "seq=131072", "--cluster", "dgx-h100", "--gpus", "8", "--dp", "2", "--tp", "1", "--cp", "4",
                "--zero", "3", "--micro-batch", "1", "--global-batch", "2", "--recompute", "full"], checks)
    # a published run planned as published is its own closest run, with its error
    with open(os.path.join(src, "tests/plan/published_h100.json")) as f:
        run = next(r for r in json.load(f)["runs"] if r["id"] == "nemo2407_llama2_70b_64gpu")
    sample, args = published_command(src, run)
    j = check_case(hpdlc, src, rows, run["id"], sample, args, checks)
    if j:
        first = j["accuracy"]["closest"][0]
        err = j["time"]["step_s"] / run["published"]["step_s"] - 1
        checks.append((first["id"] == run["id"] and abs(first["error"] - err) <= 5e-4,
                       f"{run['id']} planned as published: closest {first['id']} {first['error']:+.4f}, its own error {err:+.4f}"))
    # nothing to judge by: a CPU, a model of images
    cpu = plan_run(hpdlc, os.path.join(src, "samples/gpt2.hpd"), ["--cluster", "cpu", "--gpus", "1", "--dp", "1"])
    checks.append(("how far to trust it: no published run on cpu or its generation to compare with" in cpu.stdout,
                   "a CPU plan says no published run is like it"))
    cj = plan_json(hpdlc, os.path.join(src, "samples/gpt2.hpd"), ["--cluster", "cpu", "--gpus", "1", "--dp", "1"])
    checks.append((cj is not None and cj["accuracy"]["runs"] == 0 and cj["accuracy"]["traits"]["generation"] == "other",
                   "a CPU plan's JSON: accuracy.runs 0, generation other"))
    img = plan_run(hpdlc, os.path.join(src, "samples/resnet18.hpd"), ["--cluster", "dgx-a100-80gb", "--gpus", "4", "--pp", "4", "--micro-batch", "32"])
    checks.append(("the published runs the planner was checked on are all language models" in img.stdout,
                   "a model of images says the published runs are language models"))
    bad = plan_run(hpdlc, os.path.join(src, "samples/gpt2.hpd"), ["--evidence=all"])
    checks.append((bad.returncode == 2 and "--evidence takes no value" in bad.stderr,
                   f"--evidence=all exits 2 saying --evidence takes no value (exit {bad.returncode})"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
