#!/usr/bin/env python3
"""calibrate_e2e.py - `hpdlc plan --calibrate TRACE -o FILE.hpd` end to end (CTest: plan.calibrate_CASE).

    calibrate_e2e.py --bin BUILD/bin --source REPO --work DIR CASE

  gpt2    samples/gpt2.hpd (GPT-2 124M) on one CPU rank, one sequence of 64 a step, compiled
          natively and profiled (`hpdlrun --profile`, 11 steps); the trace is dealt into its
          even steps (the fit) and its odd ones (the check), each with the warm-up step both
          leave out. The fit calibrates the cpu device (--cluster laptop: the catalog's
          figures) into a file, which must price its own fit steps within 3%, and
          `hpdlc plan --cluster FILE.hpd --compare` of the check steps must give the step
          within 15% (the uncalibrated plan is off by 38-84% on this machine, and must be
          more than 25% and twice the calibrated plan's error); the fitted classes, GEMM and
          memory-bound kernels (the native code's per-kernel spans), are printed. Runs of the
          same program drift by 15-50% on a shared 2-core VM (another tenant, a CPU-credit
          limit; case_gpt2 lists what was seen): interleaved steps share the drift, and a
          miss profiles another run, up to three; the disk is flushed before each run and
          its final checkpoint deleted after. Each file is a cluster block with
          compute_scale and memory_scale in (0, 4], and planning with it prices the device
          at the catalog's figures times them.
  errors  golden messages and exit status: no -o (2), --search with it (2), a missing trace
          (1), a cluster file with two clusters (1), a scale no machine has (1), a
          calibrated file planned again when its trace has no compute to fit, and a cluster
          that gives its device's own figures calibrated into a file that keeps them.
Exit 0 pass, 1 fail.
"""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import check  # noqa: E402

ARGS = None
# fp32 (the sample trains in bf16): the same kernels whether or not oneDNN is
# installed for bf16 GEMMs (core/numeric/gemm16.h), so the same step to calibrate
SHAPE = ["-D", "T=64", "--cluster", "laptop", "--dp", "1", "--micro-batch", "1", "--global-batch", "1",
         "--precision", "fp32"]


def run(args, expect=0):
    return e2e_common.run(args, expect, None, None, timeout=300)


def tool(name):
    return e2e_common.tool_of(ARGS, name)


def work(name):
    return e2e_common.work_of(ARGS, name)


def gpt2():
    return os.path.join(ARGS.source, "samples", "gpt2.hpd")


def profile(art, name, steps=4):
    out = os.path.join(work(name), "trace.json")
    if os.path.exists(out):
        os.remove(out)
    ckpt = os.path.join(work(name), "ckpt")
    # the disk's backlog (the last run's final checkpoint, 1.5 GB for GPT-2 124M with its
    # Adam moments, or an earlier test's files) written back while this run is timed slows
    # it on the 2-core VM: flushed before, and the checkpoint deleted after (its unwritten
    # pages are then dropped, not written)
    os.sync()
    run([tool("hpdlrun"), art, "--data", e2e_common.synthetic_data(ARGS.bin, ARGS.work, 400000), "--steps", str(steps),
         "--progress", "quiet", "--checkpoint-dir", ckpt, "--profile", out])
    shutil.rmtree(ckpt, ignore_errors=True)
    return out


def compare_json(cluster, trace):
    p = run([tool("hpdlc"), "plan", gpt2(), *SHAPE[:2], "--cluster", cluster, *SHAPE[4:], "--compare", trace, "--format", "json"])
    j = json.loads(p.stdout)
    return {r["class"]: r for r in j["compare"]["classes"]}, j


def calibrate(fit_trace, i):
    """The cpu device fitted to fit_trace, written as cluster mycpu[i + 1] and checked; its file."""
    name = "mycpu" if i == 0 else f"mycpu{i + 1}"
    out = os.path.join(work("fit"), name + ".hpd")
    p = run([tool("hpdlc"), "plan", gpt2(), *SHAPE, "--calibrate", fit_trace, "-o", out])
    print(p.stdout.rstrip())
    check(re.search(r"calibrated cpu from .* in \d+ rounds?: compute x[\d.e-]+, memory x[\d.e-]+", p.stdout), p.stdout)
    text = open(out).read()
    print(text.rstrip())
    m = re.search(r"^cluster (\w+) \{$", text, re.M)
    check(m and m.group(1) == name, f"no cluster block named {name} in {out}")
    scales = {k: float(v) for k, v in re.findall(r"^  (compute_scale|memory_scale) = ([\d.e+-]+)$", text, re.M)}
    check(set(scales) == {"compute_scale", "memory_scale"}, f"scales {scales}")
    # near the catalog's 768 GFLOP/s, 50 GB/s laptop: the 2-core Xeon VMs fit below 1, an
    # AMD EPYC VM's optimizer update (memory bound) 1.08-1.09 (2026-12-03); a server's memory
    # may exceed the laptop's, a scale past 4 would be a fit gone wrong
    for k, v in scales.items():
        check(0 < v <= 4, f"{k} = {v}")
    check("device = cpu" in text and "shared = true" in text, "the file keeps the cpu cluster's device and sharing")
    # the file planned again reproduces the fit run it came from (the fit's own error is
    # printed above: the step within a few per cent), and prices the device at the scales
    rows, j = compare_json(out, fit_trace)
    own = rows["step"]["predicted_s"] / rows["step"]["measured_s"] - 1
    check(abs(own) <= 0.03, f"{name} prices its own fit run {own * 100:+.1f}% off (limit 3%)")
    dev = j["compare"]["device"]["note"]
    want_gflops = 768.0 * scales["compute_scale"]
    got = re.search(rf"cluster {name}: ([\d.]+) GFLOP/s fp32, ([\d.]+) GB/s memory", dev)
    check(got and abs(float(got.group(1)) - want_gflops) <= 0.06, f"device {dev}: want {want_gflops:.1f} GFLOP/s")
    check(abs(float(got.group(2)) - 50.0 * scales["memory_scale"]) <= 0.06, f"device {dev}")
    check("gemm" in rows and "memory_bound" in rows, f"the native trace has no per-kernel classes: {sorted(rows)}")
    return out


def split_trace(trace, name):
    """The profile's steps dealt into two traces of their own: the first step (the
    warm-up both leave out) with the even steps, and with the odd ones; each keeps the
    events inside its steps' spans. Their paths."""
    t = json.load(open(trace))
    ev = t["traceEvents"]
    spans = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "step"}
    first = min(spans)
    outs = []
    for half, parity in (("even", 0), ("odd", 1)):
        keep = [(lo, hi) for s, (lo, hi) in spans.items() if s == first or (s != first and s % 2 == parity)]
        mine = [e for e in ev if e.get("ph") != "X" or any(lo <= e["ts"] <= hi for lo, hi in keep)]
        check(sum(e.get("cat") == "step" for e in mine) == len(keep), f"{trace}: the {half} steps' spans")
        out = os.path.join(work(f"{name}-{half}"), "trace.json")
        with open(out, "w") as f:
            json.dump(dict(t, traceEvents=mine), f)
        outs.append(out)
    return outs


def case_gpt2():
    art = e2e_common.fresh_dir(ARGS.work, "art-gpt2")
    run([tool("hpdlc"), "compile", gpt2(), *SHAPE, "-o", art])
    # Runs of this program drift by 15-50% on the shared 2-core VM (another tenant, a
    # CPU-credit limit): on 2026-12-01 a fit run of 613 ms a step against checks of 455-496;
    # on 2026-12-02 fits of 1106 and 1280 ms against checks of 1352-1593, and in the CI of
    # that evening fits of 1637 and 1272 ms against three checks of 1072-1099, after 30
    # minutes of load; on 2026-12-03 fits of 522 and 451 ms against a check of 595 (-12% and
    # -24%), and a CI run whose pairs all missed. So the fit and the check come from one run,
    # its even and its odd steps (split_trace): the drift falls on both alike, and the check
    # is still steps the fit never saw. While the calibrated plan misses the check by more
    # than 15%, another run is profiled, up to three.
    best = None
    for attempt in range(3):
        fit, chk = split_trace(profile(art, f"run{attempt + 1}", 11), f"run{attempt + 1}")
        out = calibrate(fit, attempt)
        base, _ = compare_json("laptop", chk)
        rows, _ = compare_json(out, chk)
        print(f"run {attempt + 1}: fit steps {compare_json('laptop', fit)[0]['step']['measured_s'] * 1e3:.1f} ms, "
              f"check steps {rows['step']['measured_s'] * 1e3:.1f} ms a step")
        for cls in ("gemm", "memory_bound", "optimizer", "step"):
            r, b = rows[cls], base[cls]
            e = r["predicted_s"] / r["measured_s"] - 1
            e0 = b["predicted_s"] / b["measured_s"] - 1
            print(f"check of run {attempt + 1}, {os.path.basename(out)} {cls}: measured {r['measured_s'] * 1e3:.1f} ms; "
                  f"calibrated {r['predicted_s'] * 1e3:.1f} ms ({e * 100:+.1f}%), catalog laptop "
                  f"{b['predicted_s'] * 1e3:.1f} ms ({e0 * 100:+.1f}%)")
        if best is None or abs(e) < abs(best[0]):
            best = (e, e0)
        if abs(best[0]) <= 0.15:
            break
        print(f"the calibrated plan misses the check steps by {e * 100:+.1f}% (limit 15%): profiling another run")
    step_e, e0 = best
    check(abs(step_e) <= 0.15, f"step: the calibrated plan is off by {step_e * 100:+.1f}% (limit 15%)")
    # the calibration must matter: the catalog laptop's plan was 52.6% off this step on the
    # 2-core VM before the kernels' rows ran on the rank's threads (issue 16), 49.2% after, and
    # 38-46% once the tied table's gradients went into its slot directly (2026-11-29), 57% on
    # an AMD EPYC VM (2026-12-03); the calibrated plan at most half as far off, and the
    # uncalibrated one more than 25%
    check(abs(e0) > 0.25 and abs(e0) > 2 * abs(step_e),
          f"the uncalibrated plan is {e0 * 100:+.1f}% off, the calibrated {step_e * 100:+.1f}%: the test shows nothing on this machine")


def case_errors():
    tiny = os.path.join(ARGS.source, "samples", "gpt2-tiny.hpd")
    defs = ["-D", "C=32", "-D", "T=16", "-D", "L=2", "-D", "H=4"]
    art = e2e_common.fresh_dir(ARGS.work, "art-tiny")
    run([tool("hpdlc"), "compile", tiny, *defs, "-o", art])
    trace = profile(art, "tiny", 3)
    plan = [tool("hpdlc"), "plan", tiny, *defs, "--cluster", "laptop"]
    p = run(plan + ["--calibrate", trace], expect=2)
    check("hpdlc: plan --calibrate: name the cluster file to write with -o FILE.hpd" in p.stderr, p.stderr)
    p = run(plan + ["--calibrate", trace, "--search", "-o", os.path.join(work("e"), "x.hpd")], expect=2)
    check("hpdlc: plan --calibrate fits one layout: drop --search, --scaling and --compare" in p.stderr, p.stderr)
    missing = os.path.join(work("e"), "none.json")
    p = run(plan + ["--calibrate", missing, "-o", os.path.join(work("e"), "x.hpd")], expect=1)
    check(f"hpdlc: plan --calibrate: {missing}: error: cannot open" in p.stderr, p.stderr)
    # the tiny model calibrated and planned with its own file
    out = os.path.join(work("e"), "tiny-cpu.hpd")
    run(plan + ["--calibrate", trace, "-o", out])
    p = run([tool("hpdlc"), "plan", tiny, *defs, "--cluster", out])
    check("cluster: tiny_cpu, 1 x cpu" in p.stdout, p.stdout)
    # a cluster that gives its device's own figures: calibrated, the file keeps them, the
    # fitted scales on top (docs/catalog.md, "A device the catalog lacks")
    desc = os.path.join(work("e"), "desc.hpd")
    with open(desc, "w") as f:
        f.write("cluster desc {\n  device = cpu\n  memory = 8GiB\n  memory_bandwidth = 20GB/s\n  fp32 = 100GFLOP/s\n}\n")
    out2 = os.path.join(work("e"), "desc-cal.hpd")
    run([tool("hpdlc"), "plan", tiny, *defs, "--cluster", desc, "--calibrate", trace, "-o", out2])
    with open(out2) as f:
        text = f.read()
    check("memory = 8589934592B" in text and "memory_bandwidth = 20.0000GB/s" in text and "fp32 = 0.1TFLOP/s" in text, text)
    p = run([tool("hpdlc"), "plan", tiny, *defs, "--cluster", out2, "--format", "json"])
    figs = json.loads(p.stdout)["cluster"].get("device_figures", {})
    check(figs == {"memory": 8589934592.0, "memory_bandwidth": 20e9, "fp32": 100e9}, str(figs))
    # a file with two clusters, and a scale no machine has
    two = os.path.join(work("e"), "two.hpd")
    with open(two, "w") as f:
        f.write("cluster a {\n  device = cpu\n}\ncluster b {\n  device = cpu\n}\n")
    p = run([tool("hpdlc"), "plan", tiny, *defs, "--cluster", two], expect=1)
    check(f"hpdlc: --cluster {two}: the file declares 2 clusters; --cluster FILE.hpd takes a file with exactly one" in p.stderr,
          p.stderr)
    bad = os.path.join(work("e"), "bad.hpd")
    with open(bad, "w") as f:
        f.write("cluster bad {\n  device = cpu\n  compute_scale = 0\n}\n")
    p = run([tool("hpdlc"), "plan", tiny, *defs, "--cluster", bad], expect=1)
    check("'compute_scale' = 0.0 is implausible: a scale of the device's figures is between 1e-6 and 1e6" in p.stderr, p.stderr)


CASES = {"gpt2": case_gpt2, "errors": case_errors}

if __name__ == "__main__":
    ARGS = e2e_common.case_args(CASES)
    sys.exit(e2e_common.run_case(CASES, ARGS.case))
