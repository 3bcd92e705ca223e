#!/usr/bin/env python3
"""profile_e2e.py - hpdlrun --profile end to end (CTest: runtime.profile_CASE).

    profile_e2e.py --bin BUILD/bin --source REPO --work DIR CASE

Each case compiles samples/gpt2-tiny.hpd small (-D C=32 -D T=16 -D L=2 -D H=4, hpdlc
compile --target cpu), trains a few steps with `hpdlrun --profile FILE` and reads the
Chrome trace with json:

  dp2_pp2     4 ranks under mpirun (dp=2 x pp=2, 1F1B, the reference executor), 3 steps:
      one process per rank (pids 0-3) named "rank R (dp d, tp 0, pp p, cp 0)", the
      tracks step / program / comm named on each; 3 step spans a rank (args.step 1..3);
      the program's forward and backward spans (micro-batches x steps each, with the
      micro-batch and chunk), the reference executor's ops (a matmul with FLOPs);
      the dp all-reduce with bytes > 0 and the pp send / recv with bytes > 0 and the
      peer's world rank (stage 0 <-> stage 1: rank r <-> r + 2); every event inside
      its step's span, durations >= 0, each step's phases adding up to at most the
      step; no events dropped; no temporary file left beside the trace; rank 0's table
      (its header, a row of the program's step with its share, the matmul row's
      achieved GFLOP/s equal to the trace's FLOPs over its time, the dp all-reduce's
      GB/s, a peak-memory row per rank).
  one_rank    one rank (the generated kernels when the CPU back end is built, else
      the reference executor), 2 steps: one process, 2 step spans, the program's
      spans (native: every fused kernel a span named by its symbol inside a forward or
      backward, with bytes, the GEMMs with FLOPs); --profile-events 10 keeps 10 events
      and says in otherData, the process's labels and the table how many were dropped.
  device_emulate  a --target cuda --emulate artifact run with --device emulate (one
      rank, 2 steps): each kernel launch and GEMM a span (a GEMM with FLOPs) inside its
      micro-batch's forward+backward span (skipped without NVRTC or a C++ compiler);
      with HPDL_PROFILE=5 the launches of steps 2..3 timed alone, the 5 slowest listed.
  unwritable  --profile into a folder that does not exist, and --profile naming a
      folder: exit status 1 before step 1, one message naming the path.
Exit 0 pass, 1 fail, 77 skip (no mpirun for dp2_pp2).
"""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import e2e_common  # noqa: E402
from e2e_common import Fail, check  # noqa: E402

ARGS = None
DEFS = ["-D", "C=32", "-D", "T=16", "-D", "L=2", "-D", "H=4"]
EPS = 2.0  # microseconds: the trace's ts and dur are printed to 1 ns, rounded independently


def run(args, expect=0, env=None):
    return e2e_common.run(args, expect, env, None, timeout=120)


def tool(name):
    return os.path.join(ARGS.bin, name)


def work(name):
    d = os.path.join(ARGS.work, name)
    os.makedirs(d, exist_ok=True)
    return d


def data():
    prefix = os.path.join(work("data"), "tiny")
    if not os.path.exists(prefix + "_train_000000.bin"):
        run([tool("hpdl-data"), "--synthetic", "200000", "--seed", "3", "-o", prefix])
    return prefix + "_train_*.bin"


def compile_art(name, flags, executor):
    d = os.path.join(ARGS.work, name)
    shutil.rmtree(d, ignore_errors=True)
    p = run([tool("hpdlc"), "compile", os.path.join(ARGS.source, "samples", "gpt2-tiny.hpd"), "--target", "cpu", *DEFS, *flags,
             "--executor", executor, "-o", d])
    return d, json.load(open(os.path.join(d, "manifest.json"))), p


def profile(art, name, steps, extra=()):
    out = os.path.join(work(name), "trace.json")
    if os.path.exists(out):
        os.remove(out)
    p = run([tool("hpdlrun"), art, "--data", data(), "--steps", str(steps), "--progress", "plain", "--checkpoint-dir",
             os.path.join(work(name), "ckpt"), "--profile", out, *extra])
    check(os.path.exists(out), f"no trace at {out}:\n{p.stdout}")
    left = [f for f in os.listdir(os.path.dirname(out)) if f != "trace.json" and f != "ckpt"]
    check(not left, f"files left beside the trace: {left}")
    with open(out) as f:
        return json.load(f), p.stdout


def spans(trace, pid=None, tid=None, cat=None, name=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid) and (tid is None or e["tid"] == tid)
            and (cat is None or e["cat"] == cat) and (name is None or e["name"] == name)]


def meta(trace, name):
    return {(e["pid"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == name}


def check_common(trace, pids, steps, coords):
    """The processes, tracks, step spans, nesting and phases of every rank."""
    names = meta(trace, "process_name")
    check(sorted(p for p, _ in names) == pids, f"processes {sorted(names)}, expected pids {pids}")
    for p in pids:
        d, pp = coords(p)
        want = f"rank {p} (dp {d}, tp 0, pp {pp}, cp 0)"
        check(names[(p, 0)]["name"] == want, f"pid {p}: process name {names[(p, 0)]['name']!r}, expected {want!r}")
    threads = meta(trace, "thread_name")
    for p in pids:
        got = {t: a["name"] for (q, t), a in threads.items() if q == p}
        check(got == {1: "step", 2: "program", 3: "comm"}, f"pid {p}: tracks {got}")
    for e in spans(trace):
        check(e["dur"] >= 0, f"negative duration: {e}")
        check(e["ts"] >= -EPS, f"an event before the trace's start: {e}")
    for p in pids:
        st = spans(trace, p, 1, "step")
        check(len(st) == steps, f"pid {p}: {len(st)} step spans, expected {steps}")
        check(sorted(e["args"]["step"] for e in st) == list(range(1, steps + 1)), f"pid {p}: step numbers {[e['args'] for e in st]}")
        by = {e["args"]["step"]: e for e in st}
        for e in spans(trace, p):
            if e["cat"] == "step":
                continue
            s = e["args"].get("step")
            check(s in by, f"pid {p}: an event outside every step: {e}")
            b = by[s]
            check(e["ts"] >= b["ts"] - EPS and e["ts"] + e["dur"] <= b["ts"] + b["dur"] + EPS,
                  f"pid {p}: {e['name']} [{e['ts']}, +{e['dur']}] outside step {s} [{b['ts']}, +{b['dur']}]")
        for s, b in by.items():
            ph = [e for e in spans(trace, p, 1, "phase") if e["args"]["step"] == s]
            names_ = {e["name"] for e in ph}
            for need in ("data", "program step", "norm", "optimizer update"):
                check(need in names_, f"pid {p} step {s}: no {need!r} phase (got {sorted(names_)})")
            total = sum(e["dur"] for e in ph)
            check(total <= b["dur"] + EPS * len(ph), f"pid {p} step {s}: phases {total} us > the step's {b['dur']} us")
        # the program's spans lie inside its step phase
        prog = {e["args"]["step"]: e for e in spans(trace, p, 1, "phase", "program step")}
        for e in spans(trace, p, 2):
            q = prog[e["args"]["step"]]
            check(e["ts"] >= q["ts"] - EPS and e["ts"] + e["dur"] <= q["ts"] + q["dur"] + EPS,
                  f"pid {p}: program span {e['name']} outside the program's step")


def table_rows(stdout):
    lines = stdout.splitlines()
    check(any(line.startswith("hpdlrun: profile: ") and "step spans over" in line for line in lines), f"no table:\n{stdout}")
    i = next(k for k, line in enumerate(lines)
             if line.split() == ["track", "phase", "/", "op", "calls", "total", "ms", "mean", "ms", "share", "achieved"])
    rows = []
    for line in lines[i + 1:]:
        m = re.match(r"^  (step|program|comm)\s+(.+?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%  (-|[\d.]+ GFLOP/s|[\d.]+ GB/s)$", line)
        if not m:
            break
        rows.append((m.group(1), m.group(2), int(m.group(3)), float(m.group(4)), float(m.group(6)), m.group(7)))
    check(rows, f"no rows under the table's header:\n{stdout}")
    check([r[3] for r in rows] == sorted((r[3] for r in rows), reverse=True), f"rows not by total time: {rows}")
    return lines, rows


def case_dp2_pp2():
    e2e_common.need_mpi(ARGS.bin)
    art, man, _ = compile_art("art-dp2-pp2", ["--dp", "2", "--pp", "2", "--schedule", "1f1b"], "interp")
    steps, nmicro = 3, man["layout"]["num_micro_batches"]
    check(man["world_size"] == 4, f"world size {man['world_size']}")
    trace, out = profile(art, "dp2_pp2", steps)
    check_common(trace, [0, 1, 2, 3], steps, lambda r: (r % 2, r // 2))
    other = trace["otherData"]
    check(other["ranks"] == 4 and other["dropped_events"] == 0, f"otherData {other}")
    check(len(other["peak_rss_bytes"]) == 4 and min(other["peak_rss_bytes"]) > 1 << 20, f"peak RSS {other['peak_rss_bytes']}")
    for p in range(4):
        stage = p // 2
        for kind in ("forward", "backward"):
            ev = spans(trace, p, 2, kind)
            check(len(ev) == nmicro * steps, f"pid {p}: {len(ev)} {kind} spans, expected {nmicro * steps}")
            check(sorted({e["args"]["micro_batch"] for e in ev}) == list(range(nmicro)), f"pid {p}: micro-batches of {kind}")
            check({e["args"]["chunk"] for e in ev} == {stage}, f"pid {p}: chunks of {kind}: {[e['args'] for e in ev][:3]}")
        ops = spans(trace, p, 2, "op")
        check(len(ops) > 100, f"pid {p}: {len(ops)} op spans")
        mm = [e for e in ops if e["name"] == "matmul"]
        check(mm and all(e["args"].get("flops", 0) > 0 for e in mm), f"pid {p}: matmuls without FLOPs")
        comm = spans(trace, p, 3)
        ar = [e for e in comm if e["name"] == "all_reduce" and e["args"].get("group") == "dp"]
        check(len(ar) == steps and all(e["args"]["bytes"] > 0 for e in ar), f"pid {p}: dp all-reduces {ar[:2]}")
        peer = p + 2 if stage == 0 else p - 2
        pp = [e for e in comm if e["args"].get("group") == "pp"]
        sends = [e for e in pp if e["name"] in ("send", "isend")]
        recvs = [e for e in pp if e["name"] == "recv"]
        check(sends and recvs, f"pid {p}: pp sends {len(sends)}, receives {len(recvs)}")
        for e in sends + recvs:
            check(e["args"]["bytes"] > 0 and e["args"]["peer"] == peer, f"pid {p}: {e}")
    lines, rows = table_rows(out)
    named = {r[1]: r for r in rows}
    check("program step" in named and 50 <= named["program step"][4] <= 100.0, f"the program's step row: {named.get('program step')}")
    check(named["program step"][2] == 4 * steps, f"the program's step: {named['program step'][2]} calls, expected {4 * steps}")
    # achieved: the matmuls' FLOP/s as the trace's own FLOPs over their time (all ranks); a phase has none
    check(named["program step"][5] == "-", f"a phase with an achieved rate: {named['program step']}")
    mm = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == "matmul"]
    want = sum(e["args"]["flops"] for e in mm) / (sum(e["dur"] for e in mm) * 1e-6) / 1e9
    got = named["matmul"][5] if "matmul" in named else "-"
    check(got.endswith(" GFLOP/s") and abs(float(got.split()[0]) - want) <= 0.05 + 1e-3 * want,
          f"the matmul row's achieved {got}, the trace says {want:.2f} GFLOP/s")
    coll = [line for line in lines if re.match(r"^  all_reduce\s+dp\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+$", line)]
    check(coll and float(coll[0].split()[-1]) > 0, f"no dp all-reduce with its GB/s in the table:\n{out}")
    mem = [line for line in lines if re.match(r"^  \d\s+dp \d, tp 0, pp \d, cp 0\s+[\d.]+\s+\d+\s+0$", line)]
    check(len(mem) == 4, f"peak memory rows: {mem}")
    print(f"dp2_pp2: {other['events']} events; top rows {rows[:4]}")


def case_one_rank():
    art, man, _ = compile_art("art-one", [], "auto")
    ex = man["program"]["executor"]
    trace, out = profile(art, "one_rank", 2)
    check_common(trace, [0], 2, lambda r: (0, 0))
    prog = spans(trace, 0, 2)
    kinds = {e["name"] for e in prog}
    check({"forward", "backward"} <= kinds or "forward+backward" in kinds, f"{ex}: the program's spans {sorted(kinds)[:10]}")
    check(trace["otherData"]["dropped_events"] == 0, "events dropped under the default cap")
    if ex == "native":
        # every fused kernel of the generated code a span inside its forward or backward, named by
        # its symbol, with the kernel table's bytes; the GEMMs as "gemm" with their FLOPs
        kern = [e for e in prog if e["cat"] in ("kernel", "gemm")]
        gemm = [e for e in kern if e["cat"] == "gemm"]
        check(kern and gemm, f"native: no kernel spans in {sorted(kinds)[:12]}")
        check(all(re.match(r"^[\w.]+\.k\d+\.\w+$", e["name"]) for e in kern), f"kernel names {sorted({e['name'] for e in kern})[:8]}")
        # (attention kernels are compute-bound work too: "gemm" spans, named .attention)
        check(all(e["args"].get("flops", 0) > 0 and e["name"].endswith((".gemm", ".attention")) for e in gemm),
              "GEMM spans without FLOPs")
        check(all(e["args"].get("bytes", 0) > 0 for e in kern), "kernel spans without bytes")
        outer = [e for e in prog if e["name"] in ("forward", "backward", "forward+backward")]
        for e in kern:
            check(any(o["args"]["step"] == e["args"]["step"] and o["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + EPS
                      for o in outer), f"kernel {e['name']} outside every forward / backward span")
        print(f"one_rank native: {len(kern)} kernel spans, {len(gemm)} GEMMs")
    table_rows(out)
    # a cap of 10 events: the rest counted, said in the file and the table
    trace, out = profile(art, "one_rank_cap", 2, ["--profile-events", "10"])
    other = trace["otherData"]
    check(other["events"] == 10 and other["dropped_events"] > 0 and other["event_cap_per_rank"] == 10, f"capped: {other}")
    labels = meta(trace, "process_labels")
    check(labels and "dropped" in labels[(0, 0)]["labels"], f"process labels {labels}")
    check("events were dropped" in out, f"the table does not say events were dropped:\n{out}")
    print(f"one_rank ({ex}): {len(prog)} program spans; capped at 10: {other['dropped_events']} dropped")


def case_device_emulate():
    d = os.path.join(ARGS.work, "art-emulate")
    shutil.rmtree(d, ignore_errors=True)
    p = run([tool("hpdlc"), "compile", os.path.join(ARGS.source, "samples", "gpt2-tiny.hpd"), *DEFS, "--target", "cuda", "--emulate",
             "-o", d], expect=None)
    if p.returncode:
        if "NVRTC not found" in p.stdout + p.stderr or "did not compile as C++" in p.stdout + p.stderr:
            print("skipped: no NVRTC or no C++ compiler for the emulated kernels")
            sys.exit(e2e_common.SKIP)
        raise Fail(f"hpdlc compile --target cuda --emulate failed:\n{p.stdout}{p.stderr}")
    trace, out = profile(d, "device_emulate", 2, ["--device", "emulate"])
    check_common(trace, [0], 2, lambda r: (0, 0))
    prog = spans(trace, 0, 2)
    whole = [e for e in prog if e["name"] == "forward+backward"]
    kern = [e for e in prog if e["cat"] == "kernel"]
    gemm = [e for e in prog if e["cat"] == "gemm"]
    check(whole and kern, f"device spans: {sorted({e['name'] for e in prog})[:10]}")
    check(all(e["args"].get("flops", 0) > 0 for e in gemm), "GEMMs without FLOPs")
    for e in kern + gemm:
        s_ = e["args"]["step"]
        w = [b for b in whole if b["args"]["step"] == s_ and b["args"]["micro_batch"] == e["args"]["micro_batch"]]
        check(len(w) == 1 and w[0]["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= w[0]["ts"] + w[0]["dur"] + EPS,
              f"launch {e['name']} outside its micro-batch's step: {e}")
    table_rows(out)
    print(f"device_emulate: {len(kern)} kernel and {len(gemm)} GEMM spans in 2 steps")
    # HPDL_PROFILE=N: every launch of steps 2.. timed alone, the N slowest listed at the end
    p = run([tool("hpdlrun"), d, "--data", data(), "--steps", "3", "--progress", "plain", "--device", "emulate",
             "--checkpoint-dir", os.path.join(work("device_emulate_launches"), "ckpt")], env=dict(os.environ, HPDL_PROFILE="5"))
    both = p.stdout + p.stderr
    lines = both.splitlines()
    head = [i for i, l in enumerate(lines) if "rank 0's launches (HPDL_PROFILE=5, steps 2..3, each launch timed alone)" in l]
    check(len(head) == 1, f"no launch profile in:\n{both}")
    top = [i for i, l in enumerate(lines) if l.strip().startswith("top launches")]
    check(len(top) == 1 and top[0] > head[0], f"no 'top launches' after the profile's head:\n{both}")
    rows = [l for l in lines[top[0] + 1:top[0] + 6] if l.startswith("  hpd_")]
    check(len(rows) == 5, f"expected the 5 slowest launches:\n{both}")
    print(f"device_emulate: HPDL_PROFILE=5 lists {len(rows)} launches of steps 2..3")


def case_unwritable():
    art, _, _ = compile_art("art-one-interp", [], "interp")
    for bad, why in ((os.path.join(ARGS.work, "no-such-folder", "trace.json"), "cannot be written"), (work("a-folder"), "a folder")):
        p = run([tool("hpdlrun"), art, "--data", data(), "--steps", "2", "--progress", "plain", "--profile", bad], expect=1)
        both = p.stdout + p.stderr
        check(bad in p.stderr and why in p.stderr and "--profile" in p.stderr, f"the message does not name {bad}:\n{both}")
        check("step 1" not in p.stdout, f"it started training:\n{both}")
    p = run([tool("hpdlrun"), "--help"])
    check("--profile FILE" in p.stdout, "--help does not list --profile")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    global ARGS
    ARGS = e2e_common.case_args(CASES)
    return e2e_common.run_case(CASES, ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
