#!/usr/bin/env python3
"""trace_flag.py - `hpdlc plan --trace FILE`, the predicted step as a Chrome trace (CTest: plan.trace_flag).

    trace_flag.py HPDLC SOURCE_DIR

GPT-2 at pp 4 x dp 2 (8 micro-batches): the trace is written, a compute and a communication
track a stage, 8 forwards and 8 backwards on each stage's compute track, its last event
ending at the plan's step. And the two ways a trace is not written, each an error line
naming the file and why, exit status 1, the report still printed and no file left behind:
a step of more micro-batch x pipeline chunk pairs than a timeline holds (plan.h
PLAN_TIMELINE_MAX_UNITS: before 2026-12-07 such a step's count went through an int and the
trace failed with "the schedule of the layout does not run"), and a path that cannot be
written. Exit 0 pass, 1 fail."""
import os
import sys
import tempfile

from plan_checks import bind, rel, trace_end_s, trace_events, verdict


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/gpt2.hpd", "--dp", "2", "--pp", "4", "--gpus", "8", "--micro-batch", "1",
                     "--global-batch", "16")
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "step.json")
        d = plan(["--trace", trace])
        if d is None:
            return 1
        events = trace_events(trace)
        spans = [e for e in events if e.get("ph") == "X"]
        tracks = {e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
        end = trace_end_s(events)
        per_stage = [sum(1 for e in spans if e["tid"] == 2 * s) for s in range(4)]
        print(f"trace: {len(spans)} spans on {len(tracks)} tracks, ends at {end:.6f} s (step {d['time']['step_s']:.6f} s); "
              f"compute spans a stage {per_stage}")
        checks += [
            (len(tracks) == 8, "a compute and a communication track for each of the 4 stages"),
            (all(n >= 16 for n in per_stage), "8 forwards and 8 backwards on each stage's compute track"),
            (rel(end, d["time"]["step_s"]) < 1e-6, "the trace ends at the plan's step"),
        ]
        big = os.path.join(tmp, "big.json")
        p = run(["--global-batch", "4194304", "--trace", big])
        want = (f"hpdlc: error: --trace {big}: no trace written: 2097152 micro-batches x 4 pipeline chunks a step are "
                "more than the 1000000 a timeline holds (a forward and a backward event each); a smaller global batch "
                "shows the same schedule\n")
        print(p.stderr.strip())
        checks += [
            (p.returncode == 1 and want in p.stderr, "too many micro-batches: the error says so, exit status 1"),
            ("step " in p.stdout and not os.path.exists(big), "too many micro-batches: the report printed, no file left"),
        ]
        bad = os.path.join(tmp, "no-such-folder", "step.json")
        p = run(["--trace", bad])
        print(p.stderr.strip())
        checks.append((p.returncode == 1 and f"hpdlc: error: --trace {bad}: cannot write it: No such file or directory"
                       in p.stderr, "an unwritable path: the error names it, exit status 1"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
