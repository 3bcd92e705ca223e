#!/usr/bin/env python3
"""compare_e2e.py - `hpdlc plan --compare TRACE` end to end (CTest: plan.compare_CASE).

    compare_e2e.py --bin BUILD/bin --source REPO --work DIR CASE

gpt2-tiny, small (-D C=32 -D T=16 -D L=2 -D H=4), compiled with the reference executor
(per-op events) and profiled for 3 steps with `hpdlrun --profile`; then
`hpdlc plan ... --cluster laptop --compare trace.json` (the cpu device), text and JSON.

  one_rank  one rank: the measured column of every class equals the sums this script
            computes from the trace itself (steps 2 and 3: the first is the warm-up),
            within the text's rounding (and 1e-6 relative in the JSON); the predicted
            column equals the plan's own JSON (time.gemm_s, memory_bound_s, optimizer_s,
            step_s); GEMM, memory-bound, optimizer and step have both columns, and the
            error % is (predicted - measured) / measured; the device line names the cpu; the
            same trace against a DGX A100 plan warns that the comparison is meaningless.
  dp2       2 ranks under mpirun (dp=2): the same checks, the dp all-reduce's row beside
            the plan's data-parallel time (--dp 2 --gpus 2 --gpus-per-node 2); planned at
            dp=1 instead, the layout mismatch warning (text and JSON) naming --dp 2.
  pp2       2 ranks under mpirun (pp=2, the default schedule): the pipeline bubble (the program step's time
            outside the program's spans, plus the pipeline's receives, which leave the pp row) against
            the same sums and the plan's time.bubble_s, the pp row against comm_time_per_step.total_s.pp.
  errors    golden messages and exit status 1: a missing file, a file that is not JSON,
            JSON with no step spans; --format html refused (exit 2).
Exit 0 pass, 1 fail, 77 skip (no mpirun for dp2 and pp2).
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
DEFS = ["-D", "C=32", "-D", "T=16", "-D", "L=2", "-D", "H=4"]
COMM_OPS = {"all_reduce", "all_gather", "reduce_scatter", "send", "recv", "isend", "broadcast", "barrier", "wait_sends",
            "shard_slice", "copy_to_group"}


def run(args, expect=0):
    return e2e_common.run(args, expect, None, None, timeout=180)


def tool(name):
    return os.path.join(ARGS.bin, name)


def work(name):
    d = os.path.join(ARGS.work, name)
    os.makedirs(d, exist_ok=True)
    return d


def sample():
    return os.path.join(ARGS.source, "samples", "gpt2-tiny.hpd")


def profile(name, flags):
    prefix = os.path.join(work("data"), "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        run([tool("hpdl-data"), "--synthetic", "200000", "--seed", "3", "-o", prefix])
    art = os.path.join(ARGS.work, "art-" + name)
    shutil.rmtree(art, ignore_errors=True)
    run([tool("hpdlc"), "compile", sample(), "--target", "cpu", *DEFS, *flags, "--executor", "interp", "-o", art])
    out = os.path.join(work(name), "trace.json")
    if os.path.exists(out):
        os.remove(out)
    run([tool("hpdlrun"), art, "--data", prefix + "_train_*.bin", "--steps", "3", "--progress", "quiet", "--checkpoint-dir",
         os.path.join(work(name), "ckpt"), "--profile", out])
    return out


def measure(path):
    """The classes per rank per step (seconds), computed here from the trace alone."""
    tr = json.load(open(path))
    ev = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    names = [e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    pp = 1 + max(int(re.search(r"pp (\d+)", n).group(1)) for n in names)
    steps = sorted({e["args"]["step"] for e in ev if e["cat"] == "step"})
    used = steps[1:] if len(steps) >= 2 else steps
    # steps that wrote a checkpoint (the final state, at the last step) are left out while others remain
    ckpt = {e["args"]["step"] for e in ev if e["tid"] == 1 and e["cat"] == "phase" and e["name"] == "checkpoint"}
    if any(s not in ckpt for s in used):
        used = [s for s in used if s not in ckpt]
    ranks = sorted({e["pid"] for e in ev})
    acc, n = {}, 0

    def add(k, v):
        acc[k] = acc.get(k, 0.0) + v

    for r in ranks:
        for s in used:
            mine = [e for e in ev if e["pid"] == r and e["args"].get("step") == s]
            st = [e for e in mine if e["cat"] == "step"]
            if not st:
                continue
            n += 1
            add("step", sum(e["dur"] for e in st))
            comm = [e for e in mine if e["tid"] == 3]
            for e in comm:
                g = e["args"].get("group", "-")
                if pp > 1 and g == "pp" and e["name"] == "recv":  # waiting for the other stage: the bubble's
                    add("bubble", e["dur"])
                    LABEL["comm_pp"] = "pp communication"
                    LABEL["comm_pp_recv"] = "pp communication/recv (in the bubble)"
                    add("comm_pp_recv", e["dur"])
                    add("comm_pp", 0.0)
                    continue
                gk = "nogroup" if g == "-" else g
                glabel = ("ungrouped" if g == "-" else g) + " communication"
                LABEL["comm_" + gk] = glabel
                LABEL["comm_" + gk + "_" + e["name"]] = glabel + "/" + e["name"]
                add("comm_" + gk + "_" + e["name"], e["dur"])
                add("comm_" + gk, e["dur"])
            for e in mine:
                if e["tid"] == 2 and e["cat"] in ("op", "kernel", "gemm") and e["name"] not in COMM_OPS:
                    gemm = e["cat"] == "gemm" or "matmul" in e["name"] or "gemm" in e["name"]
                    add("gemm" if gemm else "memory_bound", e["dur"])
                if pp > 1 and e["tid"] == 1 and e["cat"] == "phase" and e["name"] == "program step":
                    spans = [x for x in mine if x["tid"] == 2 and x["cat"] not in ("op", "kernel", "gemm")]
                    add("bubble", e["dur"] - sum(x["dur"] for x in spans if e["ts"] <= x["ts"] <= e["ts"] + e["dur"]))
                if e["tid"] == 1 and e["cat"] == "phase" and e["name"] in ("optimizer update", "norm", "data"):
                    inside = sum(c["dur"] for c in comm if e["ts"] <= c["ts"] <= e["ts"] + e["dur"])
                    add("data" if e["name"] == "data" else "optimizer", e["dur"] - inside)
    m = {k: v / n * 1e-6 for k, v in acc.items()}
    m["_ckpt_skipped"] = len([s for s in steps[1:] if s not in used]) if len(steps) >= 2 else 0
    m["other"] = m["step"] - sum(v for k, v in m.items() if k in ("gemm", "memory_bound", "optimizer", "data", "bubble")
                                 or (k.startswith("comm_") and k.count("_") == 1))
    return m, len(ranks), len(steps)


def header(trace, nranks, nsteps, m):
    ck = f"; {m['_ckpt_skipped']} writing a checkpoint left out" if m["_ckpt_skipped"] else ""
    return f"compare: {trace}: {nranks} rank{'s' if nranks > 1 else ''}, {nsteps} steps (the first left out as warm-up{ck})"


def plan(trace, flags, fmt="text", expect=0):
    return run([tool("hpdlc"), "plan", sample(), *DEFS, "--cluster", "laptop", *flags, "--compare", trace, "--format", fmt], expect)


def text_rows(out):
    """{label: (measured_ms, predicted_ms or None, error or None)} of the compare table, kinds under their group."""
    lines = out.split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith("  class (per rank per step)"))
    rows, group = {}, None
    for line in lines[i + 1:]:
        if not line.startswith("  ") or line.startswith("  error %"):
            break
        m = re.match(r"^  (  )?(\S.*?)\s+(-?[\d.]+|-)\s+(-?[\d.]+|-)\s+(-?[\d.]+%|-)(\s+[\d.]+)?$", line)
        check(m, f"a row of the compare table that does not parse: {line!r}")
        label = m.group(2)
        if m.group(1):
            label = group + "/" + label
        else:
            group = label
        num = lambda x: None if x == "-" else float(x.rstrip("%"))  # noqa: E731
        rows[label] = (num(m.group(3)), num(m.group(4)), num(m.group(5)))
    return rows


LABEL = {"gemm": "GEMM (matmul)", "memory_bound": "memory-bound ops", "optimizer": "optimizer update", "data": "data",
         "other": "other", "step": "step", "bubble": "pipeline bubble"}


def label_of(key):
    return LABEL[key]


def close(a, b, rel, absol):
    return abs(a - b) <= absol + rel * abs(b)


def check_compare(trace, flags, plan_dp, plan_pp=1):
    want, nranks, nsteps = measure(trace)
    out = plan(trace, flags).stdout
    check(header(trace, nranks, nsteps, want) in out, f"the compare header:\n{out}")
    check("device: the plan prices" in out and "x cpu (cluster" in out, f"no device line naming the cpu:\n{out}")
    rows = text_rows(out)
    pj = json.loads(plan(trace, flags, "json").stdout)
    cj = pj["compare"]
    jrows = {r["class"]: r for r in cj["classes"]}
    skipped = want.pop("_ckpt_skipped")
    check(cj["ranks"] == nranks and cj["steps"] == nsteps and cj["first_step_skipped"] and
          cj["steps_used"] == nsteps - 1 - skipped and cj["checkpoint_steps_skipped"] == skipped, f"compare's header fields {cj}")
    check(cj["device"]["name"] == "cpu" and cj["device"]["cpu"] is True, f"device {cj['device']}")
    for key, v in want.items():
        jkey = key
        lab = label_of(key)
        check(lab in rows, f"no row {lab!r} for {key} in the text: {sorted(rows)}")
        check(close(rows[lab][0], v * 1e3, 0, 6e-5), f"{key}: text measured {rows[lab][0]} ms, the trace says {v * 1e3:.6f} ms")
        check(jkey in jrows, f"no class {jkey} in the JSON: {sorted(jrows)}")
        check(close(jrows[jkey]["measured_s"], v, 1e-6, 1e-12), f"{key}: JSON measured {jrows[jkey]['measured_s']}, the trace says {v}")
    t = pj["time"]
    predicted = {"gemm": t["gemm_s"], "memory_bound": t["memory_bound_s"], "optimizer": t["optimizer_s"], "step": t["step_s"]}
    if plan_dp > 1:
        predicted["comm_dp"] = pj["comm_time_per_step"]["total_s"]["dp"]
    if plan_pp > 1:
        predicted["comm_pp"] = pj["comm_time_per_step"]["total_s"]["pp"]
        predicted["bubble"] = t["bubble_s"]
    for key, p in predicted.items():
        r = jrows[key]
        check(r["measured_s"] is not None and r["measured_s"] > 0 and r["predicted_s"] is not None and p > 0,
              f"{key}: not in both columns: {r}")
        check(close(r["predicted_s"], p, 1e-9, 1e-15), f"{key}: predicted {r['predicted_s']}, the plan's JSON says {p}")
        err = (p - r["measured_s"]) / r["measured_s"] * 100
        check(close(r["error_pct"], err, 1e-6, 1e-9), f"{key}: error {r['error_pct']}%, expected {err}%")
        tr = rows[label_of(key)]
        check(close(tr[1], p * 1e3, 0, 6e-5) and close(tr[2], err, 0, 0.051), f"{key}: text row {tr}, JSON {r}")
    for key in ("data", "other"):
        check(jrows[key]["predicted_s"] is None and jrows[key]["error_pct"] is None, f"{key} should not be priced: {jrows[key]}")
    return out, cj


def case_one_rank():
    trace = profile("one", [])
    out, cj = check_compare(trace, [], 1)
    check(not cj["warnings"], f"warnings on a matching layout: {cj['warnings']}")
    # the same CPU trace against a GPU plan: said to be meaningless
    gpu = run([tool("hpdlc"), "plan", sample(), *DEFS, "--cluster", "dgx-a100-80gb", "--gpus", "1", "--compare", trace]).stdout
    check("warning: the plan prices a100-80gb GPUs: a trace measured on a CPU" in gpu and "is meaningless" in gpu
          and "--cluster laptop" in gpu, f"no device warning against a GPU plan:\n{gpu}")
    print(out[out.index("compare:"):])


def case_dp2():
    e2e_common.need_mpi(ARGS.bin)
    trace = profile("dp2", ["--dp", "2"])
    out, cj = check_compare(trace, ["--dp", "2", "--gpus", "2", "--gpus-per-node", "2"], 2)
    check(cj["trace_layout"] == {"dp": 2, "tp": 1, "pp": 1, "cp": 1}, f"trace layout {cj['trace_layout']}")
    check(not cj["warnings"], f"warnings on a matching layout: {cj['warnings']}")
    # the plan at dp=1 against the dp=2 trace: the mismatch, named, with the flags to use
    mis = plan(trace, []).stdout
    want = ("warning: the trace ran dp=2 tp=1 pp=1 cp=1 (its process names), the plan prices dp=1 tp=1 pp=1 cp=1: the columns "
            "are different programs; plan the trace's layout with --dp 2 --tp 1 --pp 1 --cp 1 (and its --cluster)")
    check(want in mis, f"no layout mismatch warning:\n{mis}")
    jw = json.loads(plan(trace, [], "json").stdout)["compare"]["warnings"]
    check(any("the trace ran dp=2" in w and "--dp 2" in w for w in jw), f"JSON warnings {jw}")
    print(out[out.index("compare:"):])


def case_pp2():
    e2e_common.need_mpi(ARGS.bin)
    trace = profile("pp2", ["--pp", "2"])
    out, cj = check_compare(trace, ["--pp", "2", "--gpus", "2", "--gpus-per-node", "2"], 1, 2)
    check(cj["trace_layout"] == {"dp": 1, "tp": 1, "pp": 2, "cp": 1}, f"trace layout {cj['trace_layout']}")
    check(not cj["warnings"], f"warnings on a matching layout: {cj['warnings']}")
    check("recv (in the bubble)" in out, f"the pipeline's receives are not marked as the bubble's:\n{out}")
    print(out[out.index("compare:"):])


def case_errors():
    d = work("errors")
    missing = os.path.join(d, "no-such-trace.json")
    notjson = os.path.join(d, "not-json.json")
    nosteps = os.path.join(d, "no-steps.json")
    with open(notjson, "w") as f:
        f.write('{"traceEvents": [\n')
    with open(nosteps, "w") as f:
        json.dump({"traceEvents": [{"name": "matmul", "cat": "op", "ph": "X", "pid": 0, "tid": 2, "ts": 1, "dur": 2},
                                   {"name": "x", "ph": "i", "pid": 0, "tid": 2, "ts": 1}]}, f)
    golden = {
        missing: f"hpdlc: plan --compare: {missing}: error: cannot open: No such file or directory\n",
        notjson: f"hpdlc: plan --compare: {notjson}: error: not JSON (line 2, column 0): ']' expected near end of file: "
                 "not a Chrome trace of hpdlrun --profile\n",
        nosteps: f"hpdlc: plan --compare: {nosteps}: error: no step spans (complete events of cat \"step\" on tid 1 with "
                 "args.step) in its 2 events: not a profile of hpdlrun --profile?\n",
    }
    for path, msg in golden.items():
        p = plan(path, [], expect=1)
        check(p.stderr == msg, f"{os.path.basename(path)}: stderr\n{p.stderr!r}\nexpected\n{msg!r}")
        check(p.stdout == "", f"{os.path.basename(path)}: a report printed despite the error:\n{p.stdout}")
    p = plan(missing, [], "html", expect=2)
    check("--compare prints with --format text or json, not html" in p.stderr, f"html: {p.stderr}")
    print("errors: golden messages ok")


def main():
    global ARGS
    cases = {"one_rank": case_one_rank, "dp2": case_dp2, "pp2": case_pp2, "errors": case_errors}
    ARGS = e2e_common.case_args(cases)
    return e2e_common.run_case(cases, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
