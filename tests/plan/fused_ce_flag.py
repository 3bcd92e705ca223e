#!/usr/bin/env python3
"""fused_ce_flag.py - `hpdlc plan --fused-ce on|off|auto` (CTest: plan.fused_ce_flag).

    fused_ce_flag.py HPDLC SOURCE_DIR

GPT-2 124M on 8 A100s (samples/gpt2.hpd: micro batch 64 x 1024 tokens, bf16): with the head
fused with its loss (compiler/ir/headloss.h) the activations lose the logits and their
gradient, [65536, 50257] each, stored in bf16 (2 x 6.59 GB; at least 80% of that must go),
and the step gains the head's GEMM once more (the backward makes the logits again):
2 x 65536 x 768 x 50257 = 5.06 TFLOP, between 5 and 40 ms at an A100's 312 TFLOP/s bf16
peak and the GEMM efficiencies the planner gives. The report says which.

auto (docs/planner.md sec. 9.6) fuses only where the unfused logits do not fit, since fusing
saves memory and costs time: at the sample's micro batch 64 it stays off (the same plan as
off); at micro batch 192 (1536 a step) off needs more than the A100's 80 GiB and auto takes
on, which fits (the same plan as on); --search's layouts say "fce" where they fuse. Across
two pipeline stages split by layers (6 and 6) at micro batch 256, the last one, holding the
head, is the fullest unfused (88.6 GiB) and fits fused: the search, which tries fused_ce where
the fullest rank holds the head (docs/planner.md sec. 12), finds it.
Exit 0 pass, 1 fail."""
import json
import subprocess
import sys

from plan_checks import verdict


def plan(hpdlc, src, fused, *extra):
    cmd = [hpdlc, "plan", f"{src}/samples/gpt2.hpd", "--format", "json", *extra]
    if fused is not None:
        cmd += ["--fused-ce", fused]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    hpdlc, src = sys.argv[1], sys.argv[2]
    on, off, default = plan(hpdlc, src, "on"), plan(hpdlc, src, "off"), plan(hpdlc, src, None)
    logits = 2 * 65536 * 50257 * 2  # the logits and their gradient, bf16
    saved = off["memory_per_gpu"]["total"] - on["memory_per_gpu"]["total"]
    dt = on["time"]["step_s"] - off["time"]["step_s"]
    print(f"fused_ce off: {off['memory_per_gpu']['total'] / 1e9:.2f} GB, step {off['time']['step_s'] * 1e3:.1f} ms; "
          f"on: {on['memory_per_gpu']['total'] / 1e9:.2f} GB, step {on['time']['step_s'] * 1e3:.1f} ms "
          f"({saved / 1e9:.2f} GB saved of the logits' {logits / 1e9:.2f}, {dt * 1e3:.1f} ms more)")
    checks = [
        (on["parallel"]["fused_ce"] is True and off["parallel"]["fused_ce"] is False, "the report's parallel.fused_ce"),
        (default["time"]["step_s"] == off["time"]["step_s"], "off is the default"),
        (0.8 * logits <= saved <= 1.2 * logits, "the logits and their gradient leave the activations"),
        (0.005 <= dt <= 0.040, "one more pass of the head's GEMM"),
        (on["time"]["gemm_s"] > off["time"]["gemm_s"], "priced as GEMM time"),
    ]
    auto = plan(hpdlc, src, "auto")
    big = ["--micro-batch", "192", "--global-batch", "1536"]
    boff, bon, bauto = plan(hpdlc, src, "off", *big), plan(hpdlc, src, "on", *big), plan(hpdlc, src, "auto", *big)
    print(f"auto at micro batch 64: fused_ce {auto['parallel']['fused_ce']}; at 192: off "
          f"{boff['memory_per_gpu']['total'] / 2**30:.1f} GiB (fits: {boff['memory_per_gpu']['fits']}), on "
          f"{bon['memory_per_gpu']['total'] / 2**30:.1f} GiB, auto chose fused_ce {bauto['parallel']['fused_ce']}")
    checks += [
        (auto["parallel"]["fused_ce"] is False and auto["time"]["step_s"] == off["time"]["step_s"],
         "auto stays off where the logits fit"),
        (not boff["memory_per_gpu"]["fits"] and bon["memory_per_gpu"]["fits"], "micro batch 192 fits only fused"),
        (bauto["parallel"]["fused_ce"] is True and bauto["time"]["step_s"] == bon["time"]["step_s"],
         "auto fuses where the logits do not fit"),
    ]
    search = subprocess.run([hpdlc, "plan", f"{src}/samples/gpt2.hpd", "--search", "--top", "3", "--progress", "quiet",
                             "--micro-batch", "192", "--global-batch", "1536", "--tp", "1", "--pp", "1",
                             "--recompute", "none", "--zero", "1"],
                            check=True, capture_output=True, text=True).stdout
    rows = [ln for ln in search.splitlines() if ln.strip().startswith("1 ")]
    print(rows[0] if rows else search)
    checks.append((bool(rows) and " fce" in rows[0], "--search's winner says fce"))
    search = subprocess.run([hpdlc, "plan", f"{src}/samples/gpt2.hpd", "--search", "--top", "3", "--progress", "quiet",
                             "--micro-batch", "256", "--global-batch", "4096", "--tp", "1", "--pp", "2", "--dp", "4", "--cp", "1",
                             "--balance", "layers", "--recompute", "none", "--zero", "1"],
                            check=True, capture_output=True, text=True).stdout
    rows = [ln for ln in search.splitlines() if ln.strip().startswith("1  dp=")]
    print(rows[0] if rows else search)
    checks.append((bool(rows) and "pp=2" in rows[0] and " fce" in rows[0],
                   "--search fuses where the last of two stages, holding the head, is the fullest"))
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
