#!/usr/bin/env python3
"""cuda_traffic.py - the least memory traffic of a CUDA artifact's training step,
without a GPU: every launch's `bytes` in stageS.kernels.json (its inputs read and
outputs written once, the figure HPDL_PROFILE divides by a launch's time for its
bandwidth; `kernel_bytes` on the first step of a kernel of several launches), summed over one micro-batch's training graphs (the layer graphs once a
layer, stage_layers from manifest.json), by kernel family, with the largest launches.
What a change to the compiler saves in memory-bound work shows here before a GPU
times it (docs/backend.md quotes it).

  python3 bench/cuda_traffic.py ARTIFACT_DIR [--stage N] [--top K] [--json] [--max-gb GB]

The GEMMs and attention are compute-bound (not counted); the padded logits' mask,
which the host program runs in place where its input dies (the training step),
counts the padded columns it writes.
"""
import argparse
import json
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", help="a directory written by hpdlc compile --target cuda")
    ap.add_argument("--stage", type=int, default=0, help="pipeline stage (default 0)")
    ap.add_argument("--top", type=int, default=15, help="largest launches listed (default 15)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--max-gb", type=float, help="exit 1 when the step's traffic exceeds this many GB (a test's bound)")
    a = ap.parse_args()
    try:
        man = json.load(open(os.path.join(a.artifact, "manifest.json")))
    except (OSError, ValueError) as e:
        sys.exit(f"cuda_traffic: {a.artifact}: no readable manifest.json ({e})")
    if man.get("target") != "cuda":
        sys.exit(f"cuda_traffic: {a.artifact}: target {man.get('target')!r}, not cuda")
    # a forward cut into pieces (no repeat graph: every kernel in the step's graphs) counts once
    lay = man.get("layout", {})
    layers = lay.get("stage_layers") or [1] * len(lay.get("stage_pieces", []))
    if a.stage < 0 or a.stage >= len(layers):
        sys.exit(f"cuda_traffic: stage {a.stage}: the artifact has {len(layers)} stage(s)")
    base = os.path.join(a.artifact, f"stage{a.stage}")
    try:
        k = json.load(open(base + ".kernels.json"))
    except (OSError, ValueError) as e:
        sys.exit(f"cuda_traffic: {base}.kernels.json: {e}")
    src = open(base + ".cu").read() if os.path.exists(base + ".cu") else ""
    families, rows = {}, []
    for l in k["launches"]:
        g = l["graph"]
        # the training step's graphs: the outer step (forward.grad) once, a layer
        # graph's forward / backward (B.fwd, B.grad) once a layer of the stage
        if not (g.endswith(".grad") or g.endswith(".fwd")) or l["kind"] in ("gemm", "grouped", "attention"):
            continue
        times = 1 if g.startswith("forward") else layers[a.stage]
        # a kernel of several launches (steps) counts once, on its first step
        b = (l.get("bytes", 0) + l.get("kernel_bytes", 0)) * times
        families[l["kind"]] = families.get(l["kind"], 0) + b
        m = re.search(r"/\* %s: ([^\n]*?)\s*\*/" % re.escape(re.sub(r"_s\d+$", "", l["name"])), src)
        rows.append((b, l["name"], l["kind"], times, m.group(1) if m else ""))
    total = sum(families.values())
    rows.sort(key=lambda r: -r[0])
    over = a.max_gb is not None and total > a.max_gb * 1e9
    if over:
        print(f"cuda_traffic: {total / 1e9:.2f} GB a micro-batch, over the bound of {a.max_gb} GB", file=sys.stderr)
    if a.json:
        print(json.dumps({"bytes": total, "families": families,
                          "top": [{"bytes": r[0], "name": r[1], "kind": r[2], "times": r[3], "ops": r[4]}
                                  for r in rows[:a.top]]}))
        sys.exit(1 if over else 0)
    print(f"{a.artifact}: stage {a.stage}, {layers[a.stage]} layers, one micro-batch "
          f"({man['layout'].get('micro_batch')} sequences): {total / 1e9:.2f} GB of memory-bound traffic at least")
    for f, b in sorted(families.items(), key=lambda x: -x[1]):
        print(f"  {f:<10} {b / 1e9:8.2f} GB  {100 * b / total if total else 0:5.1f}%")
    print(f"the {min(a.top, len(rows))} largest launches (x times a micro-batch):")
    for b, name, kind, times, ops in rows[:a.top]:
        print(f"  {b / 1e9:8.3f} GB  {name:<28} {kind:<8} x{times:<3} {ops[:100]}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
