#!/usr/bin/env python3
"""grad_reduce_bytes.py - the bytes a gradient moves in the data-parallel reduction
(CTest: plan.grad_reduce_bytes; docs/planner.md sec. 11.3).

    grad_reduce_bytes.py HPDLC SOURCE_DIR

Gradients are reduced in fp32 unless the layout rounds them to 16 bits (compression = bf16
or fp16): GPT-2 under bf16 storage at ZeRO 0 (fp32: one ring all-reduce, 2 (n - 1) / n x 4
bytes a value; 16-bit as hpdl's compressed all-reduce runs, at dp 8 an all-to-all of 16-bit
slices and an all-gather of fp32 sums, (n - 1) / n x (2 + 4), at dp 2 an all-gather of the
16-bit payloads, (n - 1) x 2) and ZeRO 3 at dp 8 (per micro-batch two all-gathers of the bf16
weights and one reduce-scatter of the gradients: (2 + 2 + 4) / (2 + 2 + 2) of the bytes),
int8 planned as fp32, and the JSON report's parallel.compression and
parallel.grad_reduce_bytes. Under fp8 the blocks' weights are gathered as FP8 (sec. 9.3):
on dgx-h100 at dp 8 ZeRO 3 moves 2 x 7/8 x P_b bytes a micro-batch fewer than bf16 (two gathers), ZeRO 1
7/8 x P_b a step fewer (one), P_b = GPT-2's 12 blocks of 12 h^2 + 13 h weights (h = 768),
the embeddings' gathers and the gradients unchanged; on a device without FP8 (A100) as
bf16, and the text report says so.
Exit 0 pass, 1 fail."""
import json
import subprocess
import sys

from plan_checks import verdict


def plan(hpdlc, src, dp, zero, compression, precision="bf16", cluster=None, fmt="json"):
    cmd = [hpdlc, "plan", f"{src}/samples/gpt2.hpd", "--gpus", str(dp), "--dp", str(dp), "--zero", str(zero),
           "--precision", precision, "--format", fmt]
    if cluster:
        cmd += ["--cluster", cluster]
    if compression:
        cmd += ["--compression", compression]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return out if fmt == "text" else json.loads(out)


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    checks = []
    for dp, zero, ratio in ((8, 0, 8.0 / 6.0), (2, 0, 2.0), (8, 3, 8.0 / 6.0)):
        default, none, bf16, fp16, int8 = (plan(hpdlc, src, dp, zero, c) for c in (None, "none", "bf16", "fp16", "int8"))
        b = {k: v["comm_per_step"]["dp"] for k, v in
             (("default", default), ("none", none), ("bf16", bf16), ("fp16", fp16), ("int8", int8))}
        print(f"dp {dp} zero {zero}: dp bytes a step " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in b.items()))
        checks += [
            (b["default"] == b["none"], f"dp {dp} zero {zero}: fp32 (none) is the default"),
            (abs(b["none"] / b["bf16"] - ratio) < 1e-6, f"dp {dp} zero {zero}: fp32 / bf16 bytes = {ratio:.4f}"),
            (b["bf16"] == b["fp16"], f"dp {dp} zero {zero}: fp16 moves what bf16 does"),
            (b["int8"] == b["none"], f"dp {dp} zero {zero}: int8 is not priced (planned as fp32)"),
            (default["time"]["comm_exposed_s"] >= bf16["time"]["comm_exposed_s"], f"dp {dp} zero {zero}: fp32 exposes no less"),
            (none["parallel"]["grad_reduce_bytes"] == 4 and bf16["parallel"]["grad_reduce_bytes"] == 2 and
             none["parallel"]["compression"] == "none" and bf16["parallel"]["compression"] == "bf16",
             f"dp {dp} zero {zero}: the JSON's parallel.grad_reduce_bytes and parallel.compression"),
        ]
    h = 768
    block_params = 12 * (12 * h * h + 13 * h)
    for zero, gathers in ((3, 2), (1, 1)):
        bf16, fp8 = (plan(hpdlc, src, 8, zero, None, p, "dgx-h100") for p in ("bf16", "fp8"))
        mmb = bf16["parallel"]["num_micro_batches"] if zero == 3 else 1
        saved = bf16["comm_per_step"]["dp"] - fp8["comm_per_step"]["dp"]
        want = mmb * gathers * 7 / 8 * block_params
        print(f"dp 8 zero {zero}: fp8 moves {saved / 2**20:.2f} MiB a step fewer than bf16 (expected {want / 2**20:.2f})")
        checks.append((abs(saved - want) < 1e-6 * want, f"dp 8 zero {zero}: fp8 gathers the blocks' weights at 1 byte"))
    a100 = [plan(hpdlc, src, 8, 3, None, p, "dgx-a100-80gb") for p in ("bf16", "fp8")]
    checks.append((a100[0]["comm_per_step"]["dp"] == a100[1]["comm_per_step"]["dp"],
                   "dgx-a100-80gb (no FP8): fp8 moves what bf16 does"))
    text = plan(hpdlc, src, 8, 3, None, "fp8", "dgx-a100-80gb", "text")
    checks.append(("precision: fp8, but a100-80gb has no FP8 rate: its GEMMs and weights priced in bf16" in text,
                   "the A100's fp8 report says it priced bf16"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
