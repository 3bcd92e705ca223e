#!/usr/bin/env python3
"""lowp_flag.py - `hpdlc plan --precision fp8|mxfp8|nvfp4` (train.precision; CTest: plan.lowp_flag).

    lowp_flag.py HPDLC SOURCE_DIR

Llama 3.1 8B at 4096 tokens, FSDP (ZeRO 3) over the 8 GPUs of one rack, docs/planner.md 9.3:
  - on GB300 (FP8 5, FP4 15 PFLOP/s dense): mxfp8's GEMMs run at the FP8 rate like fp8's,
    their operands, casts and saved copies carrying the block scales (1/32 byte a value):
    a step a little longer than fp8's, never shorter; nvfp4's at the FP4 rate: the GEMMs'
    time well under fp8's, the saved GEMM-only activations 0.5625 bytes a value against
    fp8's 1 (activation memory smaller), the weights gathered in 16 bits against fp8's 8
    (data-parallel bytes larger); MFU against the peak the GEMMs run at (JSON
    cluster.peak_flops: the FP4 rate under nvfp4);
  - on H100 (no FP4, no block-scaled tensor cores) nvfp4 and mxfp8 are priced as fp8, to the
    bit, the report saying so and JSON model.gemm_format "fp8"; on A100 (no FP8) nvfp4 as
    bf16 (gemm_format "bf16");
  - the JSON names the format priced (model.gemm_format) beside the precision asked;
  - train.fp8_scaling = current (--fp8-scaling current): on H100 fp8's casts read each value once
    more for the amax first - the memory-bound time longer, the GEMMs, communication and memory
    to the bit, JSON model.fp8_scaling "current" ("delayed" by default) and the cluster line
    saying so; nvfp4 falling back to fp8 takes it too; on GB300 mxfp8 and nvfp4 (no per-tensor
    amax pass to add or already priced) to the bit, with no model.fp8_scaling;
  - tensor parallelism with sequence parallelism (tp 2 on H100): sequence parallelism's gathers
    of a GEMM operand move the FP8 copy (Transformer Engine's and torchao's FP8 all-gather), the
    reduce-scatters of the GEMMs' outputs 16 bits: per layer 4 gathers and 4 reduce-scatters
    (forward, the gradient's; the backward gathers the saved input again) and 2 gathers forward,
    so fp8's tensor-parallel bytes are 14/20 of bf16's (the embedding and head a little more).
Exit 0 pass, 1 fail."""
import sys

from plan_checks import LLAMA31_8B, bind, rel, verdict


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    run, plan = bind(hpdlc, f"{src}/samples/llama.hpd", *LLAMA31_8B, "-D", "seq=4096", "--gpus", "8", "--dp", "8",
                     "--tp", "1", "--pp", "1", "--zero", "3", "--micro-batch", "1", "--global-batch", "64",
                     "--recompute", "none")
    gb = ["--cluster", "gb300-nvl72"]
    f8, mx, f4 = (plan(gb + ["--precision", p]) for p in ("fp8", "mxfp8", "nvfp4"))
    h8, hmx, h4 = (plan(["--cluster", "dgx-h100", "--precision", p]) for p in ("fp8", "mxfp8", "nvfp4"))
    a16, a4 = (plan(["--cluster", "dgx-a100-80gb", "--precision", p]) for p in ("bf16", "nvfp4"))
    cur = ["--fp8-scaling", "current"]
    hc8, hc4 = (plan(["--cluster", "dgx-h100", "--precision", p] + cur) for p in ("fp8", "nvfp4"))
    mxc, f4c = (plan(gb + ["--precision", p] + cur) for p in ("mxfp8", "nvfp4"))
    if None in (f8, mx, f4, h8, hmx, h4, a16, a4, hc8, hc4, mxc, f4c):
        return 1
    t8, tmx, t4 = f8["time"], mx["time"], f4["time"]
    act = lambda d: d["memory_per_gpu"]["activations"]
    mfu = f4["model"]["flops_per_step"] / (t4["step_s"] * 8 * f4["cluster"]["peak_flops"])
    print(f"gb300: step fp8 {t8['step_s']:.4f} s (GEMMs {t8['gemm_s']:.4f}), mxfp8 {tmx['step_s']:.4f} "
          f"({tmx['gemm_s']:.4f}), nvfp4 {t4['step_s']:.4f} ({t4['gemm_s']:.4f}); activations "
          f"{act(f8) / 2**30:.3f} / {act(mx) / 2**30:.3f} / {act(f4) / 2**30:.3f} GiB; dp bytes "
          f"{f8['comm_per_step']['dp'] / 2**30:.2f} / {f4['comm_per_step']['dp'] / 2**30:.2f} GiB; peak "
          f"{f4['cluster']['peak_flops'] / 1e15:.1f} PFLOP/s, MFU {f4['throughput']['mfu']:.4f}")
    checks = [
        ([d["model"]["gemm_format"] for d in (f8, mx, f4)] == ["fp8", "mxfp8", "nvfp4"],
         "gb300: the JSON names each format priced"),
        (t8["step_s"] <= tmx["step_s"] < t8["step_s"] * 1.02, "mxfp8: fp8's rate, the block scales a little more"),
        (act(f8) < act(mx) < act(f8) * 1.04, "mxfp8: the saved copies carry their scales"),
        (t4["gemm_s"] < 0.6 * t8["gemm_s"], "nvfp4: the blocks' GEMMs at the FP4 rate"),
        (t4["step_s"] < t8["step_s"], "nvfp4: a shorter step"),
        (act(f4) < act(f8), "nvfp4: the GEMM-only activations saved at 4.5 bits"),
        (f4["comm_per_step"]["dp"] > f8["comm_per_step"]["dp"], "nvfp4: the weights gathered in 16 bits, not 8"),
        (rel(f4["cluster"]["peak_flops"], 15e15) < 1e-9 and rel(f8["cluster"]["peak_flops"], 5e15) < 1e-9,
         "the peak MFU is measured against: FP4 under nvfp4, FP8 under fp8"),
        (rel(f4["throughput"]["mfu"], mfu) < 1e-6, "nvfp4: MFU = model FLOPs / (step x GPUs x FP4 peak)"),
        (h4["time"]["step_s"] == h8["time"]["step_s"] and hmx["time"]["step_s"] == h8["time"]["step_s"]
         and h4["model"]["gemm_format"] == "fp8" and hmx["model"]["gemm_format"] == "fp8",
         "h100: nvfp4 and mxfp8 priced as fp8, to the bit"),
        (a4["time"]["step_s"] == a16["time"]["step_s"] and a4["model"]["gemm_format"] == "bf16",
         "a100: nvfp4 priced as bf16, to the bit"),
    ]
    same = lambda a, b: (a["time"]["gemm_s"] == b["time"]["gemm_s"] and a["comm_per_step"] == b["comm_per_step"]
                         and a["memory_per_gpu"] == b["memory_per_gpu"])
    hm, hcm = h8["time"]["memory_bound_s"], hc8["time"]["memory_bound_s"]
    print(f"h100 fp8: memory-bound {hm:.4f} s delayed, {hcm:.4f} s current; step {h8['time']['step_s']:.4f} / "
          f"{hc8['time']['step_s']:.4f} s")
    checks += [
        (h8["model"].get("fp8_scaling") == "delayed" and hc8["model"].get("fp8_scaling") == "current",
         "JSON model.fp8_scaling: delayed by default, current when asked"),
        (hm < hcm < 2 * hm and hc8["time"]["step_s"] > h8["time"]["step_s"] and same(h8, hc8),
         "current scaling: the amax's pass lengthens the memory-bound time alone"),
        (hc4["time"]["step_s"] == hc8["time"]["step_s"], "h100: nvfp4 priced as fp8 with current scaling, to the bit"),
        (mxc["time"]["step_s"] == mx["time"]["step_s"] and f4c["time"]["step_s"] == f4["time"]["step_s"]
         and "fp8_scaling" not in mxc["model"] and "fp8_scaling" not in f4c["model"],
         "gb300: mxfp8 and nvfp4 unchanged by fp8_scaling, to the bit"),
    ]
    text = run(["--cluster", "dgx-h100", "--precision", "fp8"] + cur).stdout
    checks.append(("8 x h100-sxm (1 node of 8), fp8 (current scaling)" in text, "the cluster line names current scaling"))
    text = run(["--cluster", "dgx-h100", "--precision", "nvfp4"]).stdout
    checks.append(("precision: nvfp4, but h100-sxm has no FP4 rate: its blocks' GEMMs priced as fp8" in text,
                   "h100: the report says nvfp4 fell back to fp8"))
    text = run(["--cluster", "dgx-h100", "--precision", "mxfp8"]).stdout
    checks.append(("precision: mxfp8, but h100-sxm has no block-scaled (MX) tensor cores" in text,
                   "h100: the report says mxfp8 fell back to fp8"))
    text = run(["--cluster", "dgx-a100-80gb", "--precision", "nvfp4"]).stdout
    checks.append(("precision: nvfp4, but a100-80gb has no FP4 or FP8 rate: its GEMMs and weights priced in bf16" in text,
                   "a100: the report says nvfp4 fell back to bf16"))
    tp = ["--cluster", "dgx-h100", "--tp", "2", "--dp", "4", "--sp", "on"]
    t16, t8tp = (plan(tp + ["--precision", p]) for p in ("bf16", "fp8"))
    if None in (t16, t8tp):
        return 1
    ratio = t8tp["comm_per_step"]["tp"] / t16["comm_per_step"]["tp"]
    print(f"h100 tp 2 + sp: tensor-parallel bytes a step bf16 {t16['comm_per_step']['tp'] / 2**30:.2f} GiB, "
          f"fp8 {t8tp['comm_per_step']['tp'] / 2**30:.2f} GiB (ratio {ratio:.4f}, 14/20 = 0.7)")
    checks.append((0.7 <= ratio < 0.72, "fp8: sequence parallelism's gathers of GEMM operands in FP8, its reduce-scatters in 16 bits"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
