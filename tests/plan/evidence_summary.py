#!/usr/bin/env python3
"""evidence_summary.py - the planner's errors on the published runs, by kind of run: a
markdown table of compiler/plan/plan_evidence_rows.inc grouped by GPU generation, experts,
context parallelism, GEMM format, sequences of 32K and more and an eager program (the first
six traits of docs/planner.md sec. 16.1), for tests/plan/fidelity_table.sh.

    evidence_summary.py SOURCE_DIR"""
import collections
import os
import re
import statistics
import sys

GEN = ["other", "Ampere", "Hopper", "Blackwell"]
FMT = ["16-bit", "FP8", "FP4"]


def main():
    pat = re.compile(r'^\{"([^"]+)", "([^"]+)", \{\{([^}]*)\}\}, (\d+), ([^,]+), (\d+), ([^,]+), (\d)\},$')
    groups = collections.defaultdict(list)
    with open(os.path.join(sys.argv[1], "compiler/plan/plan_evidence_rows.inc")) as f:
        for line in f:
            m = pat.match(line.strip())
            if m:
                t = tuple(int(v) for v in m.group(3).split(","))
                groups[t[:6]].append((m.group(2), float(m.group(7))))
    print("| GPUs | experts | cp > 1 | GEMMs | 32K+ tokens | eager | runs | median error | median abs. error | sets |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(groups):
        v = groups[k]
        e = [x for _, x in v]
        sets = ", ".join(f"`{s}`" for s in sorted(set(s for s, _ in v)))
        print(f"| {GEN[k[0]]} | {'yes' if k[1] else 'no'} | {'yes' if k[2] else 'no'} | {FMT[k[3]]} | "
              f"{'yes' if k[4] else 'no'} | {'yes' if k[5] else 'no'} | {len(v)} | {statistics.median(e) * 100:+.1f}% | "
              f"{statistics.median(abs(x) for x in e) * 100:.1f}% | {sets} |")


if __name__ == "__main__":
    main()
